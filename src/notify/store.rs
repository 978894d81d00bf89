//! Watch registrations on disk (`--data-dir`): `watches.jsonl`, one registration a line,
//! rewritten whole (write, fsync, rename) by the persister thread after a change, never on
//! a worker's loop; a registration's answer waits for the save that holds it
//! ([`Persister::after`]), so a registration answered is on disk. The same thread drops
//! expired registrations once a minute. Read once at start; a line that does not parse is
//! skipped and logged, expired ones are dropped.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use serde::{Deserialize, Serialize};

use super::claims::WatchError;
use super::table::{Registration, WatchHub};
use crate::notice::Typ;

/// The file name in the data directory.
pub const FILE: &str = "watches.jsonl";

/// How often expired registrations are dropped.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// One registration as stored (a line of the file, a field's value in Redis).
#[derive(Serialize, Deserialize)]
pub(super) struct Line {
    client: String,
    sub: String,
    whu: String,
    typ: String,
    sts: u8,
    tag: Vec<u32>,
    exp: u64,
}

impl Line {
    /// The stored form of a registration of `client`.
    pub(super) fn of(client: &str, r: &Registration) -> Line {
        Line {
            client: client.to_string(),
            sub: r.sub.to_string(),
            whu: r.whu.to_string(),
            typ: r.typ.as_str().to_string(),
            sts: r.sts,
            tag: r.tag.to_vec(),
            exp: r.exp,
        }
    }

    /// The watched client and its registration (`None`: an unknown `typ`).
    pub(super) fn into_registration(self) -> Option<(String, Registration)> {
        let typ = match self.typ.as_str() {
            "publisher" => Typ::Publisher,
            "subscriber" => Typ::Subscriber,
            _ => return None,
        };
        let mut tag = self.tag;
        tag.sort_unstable();
        tag.dedup();
        let r = Registration {
            sub: self.sub.into(),
            whu: self.whu.into(),
            typ,
            sts: self.sts,
            tag: tag.into(),
            exp: self.exp,
        };
        Some((self.client, r))
    }
}

/// Reads the registrations saved in `dir` into `hub`; returns how many were loaded.
pub fn load(dir: &Path, hub: &WatchHub, now: u64) -> usize {
    let path = dir.join(FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return 0,
        Err(e) => {
            log::warn!("watches: cannot read {}: {e}", path.display());
            return 0;
        }
    };
    let mut loaded = 0;
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let parsed = serde_json::from_str::<Line>(line)
            .ok()
            .and_then(Line::into_registration);
        let Some((client, r)) = parsed else {
            log::warn!(
                "watches: {} line {} does not parse; skipped",
                path.display(),
                i + 1
            );
            continue;
        };
        if r.exp >= now && hub.register(&client, r, now).is_ok() {
            loaded += 1;
        }
    }
    loaded
}

/// Writes every registration of `hub` to `dir` (through a temporary file, synced, renamed).
pub fn save(dir: &Path, hub: &WatchHub) -> std::io::Result<()> {
    let snap = hub.snapshot();
    let mut out = Vec::with_capacity(snap.len() * 200);
    for (client, regs) in &snap.by_client {
        for r in regs.iter() {
            serde_json::to_writer(&mut out, &Line::of(client, r)).map_err(std::io::Error::other)?;
            out.push(b'\n');
        }
    }
    let tmp = dir.join(format!("{FILE}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&out)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(FILE))?;
    std::fs::File::open(dir)?.sync_all()
}

/// Told once a change is durable, or why it could not be made so (called on a helper
/// thread; it must not block for long).
pub type Done = Box<dyn FnOnce(Result<(), WatchError>) + Send>;

/// Changes whose answers wait for the next save, at most; past it a change is answered
/// `StorageError` at once.
pub const MAX_WAITING: usize = 10_000;

/// The persister: rung after each change (a bounded channel of one: a ring while a save is
/// due is already covered by it), saves to `dir` when given, then tells the changes that
/// waited for the save ([`Persister::after`]); sweeps expired registrations.
pub struct Persister {
    ring: Sender<()>,
    waiting: Arc<Mutex<Vec<Done>>>,
    thread: Option<JoinHandle<()>>,
}

impl Persister {
    /// The ring the hub's `changed` hook sends (never blocks).
    pub fn bell(&self) -> Sender<()> {
        self.ring.clone()
    }

    /// A persister whose thread starts with [`Persister::start`].
    pub fn channel() -> (Persister, Receiver<()>) {
        let (ring, rx) = bounded(1);
        let waiting = Arc::default();
        let p = Persister {
            ring,
            waiting,
            thread: None,
        };
        (p, rx)
    }

    /// `done` is told after the next save, which holds every change made to the table
    /// before this call. `Err(Storage)`: too many wait already, or the thread is not
    /// running (`done` is dropped).
    pub fn after(&self, done: Done) -> Result<(), WatchError> {
        if self.thread.is_none() {
            // No thread to save (it could not start): nothing would ever answer.
            return Err(WatchError::Storage);
        }
        {
            let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            if w.len() >= MAX_WAITING {
                return Err(WatchError::Storage);
            }
            w.push(done);
        }
        // A ring already pending is received after this push: its save answers `done`.
        let _ = self.ring.try_send(());
        Ok(())
    }

    /// Starts the thread for `hub` (held weakly: the thread ends with the hub or the ring).
    pub fn start(&mut self, rx: Receiver<()>, hub: Weak<WatchHub>, dir: Option<PathBuf>) {
        let waiting = Arc::clone(&self.waiting);
        let spawned = std::thread::Builder::new()
            .name("watch-store".into())
            .spawn(move || run(&rx, &hub, dir.as_deref(), &waiting));
        match spawned {
            Ok(t) => self.thread = Some(t),
            Err(e) => log::error!("watches: cannot start the persister thread: {e}"),
        }
    }
}

impl Drop for Persister {
    fn drop(&mut self) {
        // The thread ends once its hub is gone; it is not joined here (it may be saving).
        drop(self.thread.take());
    }
}

fn run(rx: &Receiver<()>, hub: &Weak<WatchHub>, dir: Option<&Path>, waiting: &Mutex<Vec<Done>>) {
    loop {
        let rung = match rx.recv_timeout(SWEEP_EVERY) {
            Ok(()) => true,
            Err(RecvTimeoutError::Timeout) => false,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let Some(hub) = hub.upgrade() else { return };
        if !rung {
            // A sweep that drops something rings again, and the next turn saves.
            hub.sweep(super::unix_now());
            continue;
        }
        // Taken before the table is read: every change they wait for is in this save.
        let told = std::mem::take(&mut *waiting.lock().unwrap_or_else(|e| e.into_inner()));
        let result = match dir {
            Some(dir) => save(dir, &hub).map_err(|e| {
                log::warn!("watches: cannot save to {}: {e}", dir.display());
                WatchError::Storage
            }),
            None => Ok(()),
        };
        drop::<Arc<WatchHub>>(hub);
        for done in told {
            done(result);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_directory_knows_these_files_as_its_own() {
        // Otherwise every start warns about them and counts them as foreign files.
        for name in [
            FILE.to_string(),
            format!("{FILE}.tmp"),
            crate::identity::KEY_FILE.to_string(),
            format!("{}.tmp", crate::identity::KEY_FILE),
        ] {
            assert!(crate::store::files::known_file(&name), "{name}");
        }
    }

    #[test]
    fn saved_registrations_load_again_and_expired_ones_do_not() {
        let dir = std::env::temp_dir().join(format!("wr-watch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let hub = WatchHub::new(100, Box::new(|_| {}));
        let r = |whu: &str, exp| Registration {
            sub: "https://s.example/".into(),
            whu: whu.into(),
            typ: Typ::Publisher,
            sts: 1,
            tag: Arc::from([7u32]),
            exp,
        };
        hub.register("did:key:zA", r("https://s.example/1", 500), 10)
            .unwrap();
        hub.register("did:key:zB", r("https://s.example/2", 50), 10)
            .unwrap();
        save(&dir, &hub).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join(FILE))
            .unwrap()
            .write_all(b"{damaged\n")
            .unwrap();
        let again = WatchHub::new(100, Box::new(|_| {}));
        assert_eq!(load(&dir, &again, 100), 1);
        assert_eq!(
            again.of("did:key:zA").unwrap()[0],
            r("https://s.example/1", 500)
        );
        assert!(!again.watched("did:key:zB"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_change_is_told_after_the_save_that_holds_it() {
        let dir = std::env::temp_dir().join(format!("wr-watch-after-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (mut p, rx) = Persister::channel();
        let bell = p.bell();
        let hub = Arc::new(WatchHub::new(
            100,
            Box::new(move |_| {
                let _ = bell.try_send(());
            }),
        ));
        p.start(rx, Arc::downgrade(&hub), Some(dir.clone()));
        let r = Registration {
            sub: "https://s.example/".into(),
            whu: "https://s.example/1".into(),
            typ: Typ::Subscriber,
            sts: 1,
            tag: Arc::from([]),
            exp: u64::MAX / 2,
        };
        let (tx, told) = crossbeam_channel::bounded(4);
        for i in 0..3 {
            hub.register(&format!("did:key:z{i}"), r.clone(), 10)
                .unwrap();
            let (tx, file) = (tx.clone(), dir.join(FILE));
            p.after(Box::new(move |res| {
                // Read when told: the file already holds this change.
                let lines = std::fs::read_to_string(file).map_or(0, |t| t.lines().count());
                tx.send((res, lines)).unwrap();
            }))
            .unwrap();
            let (res, lines) = told.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(res, Ok(()));
            assert_eq!(lines, i + 1);
        }
        // A save that fails tells `StorageError`.
        std::fs::remove_file(dir.join(FILE)).unwrap();
        std::fs::create_dir_all(dir.join(FILE).join("x")).unwrap();
        hub.register("did:key:zX", r, 10).unwrap();
        p.after(Box::new(move |res| tx.send((res, 0)).unwrap()))
            .unwrap();
        let (res, _) = told.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(res, Err(WatchError::Storage));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
