//! The sync thread: makes what logs wrote durable (`fdatasync`) according to `--fsync`,
//! reports the highest synced log sequence number, and deletes retired segments once the
//! copies made before retiring them are synced.
//!
//! Group commit: a sync round takes the highest LSN written so far, syncs every file the log
//! wrote since its last round, then reports that LSN; whatever is written meanwhile is
//! covered by the next round, so one `fdatasync` serves every record that arrived while the
//! previous one ran. One [`Syncer`] (one thread) may serve any number of logs.
//!
//! Owns the thread and the per-log shared slot; must not write records or decide what is
//! live. The callbacks run on this thread: they must only hand the news on.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::files::sync_dir;
use super::metrics::StoreMetrics;
use super::types::{SegmentId, StoreError};
use crate::metrics::StoreWrites;

/// When records reach stable storage (DECISIONS §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FsyncMode {
    /// After every write round (group commit); publishes wait for it.
    Always,
    /// At least once a second.
    #[default]
    Everysec,
    /// When the kernel decides (syncs only to make deletes after compaction safe).
    Off,
}

impl FromStr for FsyncMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "always" => Ok(FsyncMode::Always),
            "everysec" => Ok(FsyncMode::Everysec),
            "off" => Ok(FsyncMode::Off),
            _ => Err(format!("--fsync {s}: expected always, everysec or off")),
        }
    }
}

/// What the sync thread tells a log's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncEvent {
    /// Every record up to this LSN is on stable storage, except those reported in a
    /// `Failed` and those a failed `Log::flush` said were lost (never written).
    Synced(u64),
    /// A sync failed: records up to this LSN may not be on stable storage (with `always`,
    /// answer their publishes `storage unavailable`). `Log::health` says why.
    Failed(u64),
    /// This segment's file was deleted (its retirement is final).
    Retired(SegmentId),
}

/// The callback a log's owner gives: called on the sync thread, for that log only.
pub type OnSync = Box<dyn Fn(SyncEvent) + Send>;

/// What a log and the sync thread share.
pub(crate) struct Slot {
    dir: PathBuf,
    pub(crate) metrics: Arc<StoreMetrics>,
    state: Mutex<SlotState>,
    on_sync: Mutex<OnSync>,
}

#[derive(Default)]
struct SlotState {
    /// Highest LSN handed to the kernel.
    written: u64,
    /// Highest LSN covered by a sync round (synced or reported failed).
    synced: u64,
    /// Files written since their last sync.
    files: Vec<(SegmentId, Arc<File>)>,
    /// A segment was created since the last directory sync.
    dir_dirty: bool,
    /// Segments to delete once `synced` reaches the LSN: (lsn, id, path).
    retire: Vec<(u64, SegmentId, PathBuf)>,
    /// The last sync failure, until a sync succeeds.
    error: Option<String>,
    /// A full sync round is asked for whatever the mode (a probe after a failure).
    forced: bool,
    /// The segment whose synced pages were last dropped, and up to where: the next drop
    /// of the same file starts there (with `always`, many a second).
    dropped: (SegmentId, u64),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Inner {
    mode: FsyncMode,
    /// Every sync round that made records durable is timed here (`store_write_seconds`).
    writes: Arc<StoreWrites>,
    wake: Mutex<Wake>,
    cv: Condvar,
    slots: Mutex<Vec<Arc<Slot>>>,
}

#[derive(Default)]
struct Wake {
    pending: bool,
    shutdown: bool,
    /// The thread is waiting on the condvar (otherwise it sees `pending` before it waits,
    /// and a notify would be a wasted `futex` call on the worker's loop).
    sleeping: bool,
}

impl Inner {
    fn wake(&self) {
        let mut w = lock(&self.wake);
        w.pending = true;
        if w.sleeping {
            self.cv.notify_one();
        }
    }
}

/// A sync thread serving one or more logs. Dropping it (or [`Syncer::shutdown`]) runs a
/// last full sync of every log, whatever the mode, then joins the thread.
pub struct Syncer {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

/// A log's link to its sync thread.
pub(crate) struct SyncHandle {
    inner: Arc<Inner>,
    pub(crate) slot: Arc<Slot>,
}

impl Syncer {
    /// Starts the thread.
    pub fn start(mode: FsyncMode) -> Result<Syncer, StoreError> {
        Syncer::start_timed(mode, Arc::default())
    }

    /// Starts the thread, timing into `writes` each sync round that made records durable.
    pub fn start_timed(mode: FsyncMode, writes: Arc<StoreWrites>) -> Result<Syncer, StoreError> {
        let inner = Arc::new(Inner {
            mode,
            writes,
            wake: Mutex::new(Wake::default()),
            cv: Condvar::new(),
            slots: Mutex::new(Vec::new()),
        });
        let i = inner.clone();
        let thread = std::thread::Builder::new()
            .name("store-sync".into())
            .spawn(move || run(&i))
            .map_err(|e| StoreError::io("spawn the sync thread for", "", e))?;
        Ok(Syncer {
            inner,
            thread: Some(thread),
        })
    }

    /// The mode it was started with.
    pub fn mode(&self) -> FsyncMode {
        self.inner.mode
    }

    pub(crate) fn register(
        &self,
        dir: &Path,
        metrics: Arc<StoreMetrics>,
        on_sync: OnSync,
    ) -> SyncHandle {
        let slot = Arc::new(Slot {
            dir: dir.to_path_buf(),
            metrics,
            state: Mutex::new(SlotState::default()),
            on_sync: Mutex::new(on_sync),
        });
        lock(&self.inner.slots).push(slot.clone());
        SyncHandle {
            inner: self.inner.clone(),
            slot,
        }
    }

    /// Runs a last full sync of every log and stops the thread (SIGTERM).
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        lock(&self.inner.wake).shutdown = true;
        self.inner.cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl SyncHandle {
    /// The log handed records up to `lsn` to the kernel, the last of them in `file`
    /// (`created`: that file is new, so the directory needs a sync too).
    pub(crate) fn written(&self, lsn: u64, seg: SegmentId, file: &Arc<File>, created: bool) {
        let wake = {
            let mut st = lock(&self.slot.state);
            st.written = lsn;
            if !st.files.iter().any(|(id, _)| *id == seg) {
                st.files.push((seg, file.clone()));
            }
            st.dir_dirty |= created;
            self.inner.mode == FsyncMode::Always || !st.retire.is_empty()
        };
        if wake {
            self.inner.wake();
        }
    }

    /// Delete `path` (segment `seg`) once records up to `lsn` are synced.
    pub(crate) fn retire(&self, lsn: u64, seg: SegmentId, path: PathBuf) {
        lock(&self.slot.state).retire.push((lsn, seg, path));
        self.inner.wake();
    }

    /// Asks for a full sync round now, whatever the mode (it clears a sync failure once
    /// it succeeds).
    pub(crate) fn request(&self) {
        lock(&self.slot.state).forced = true;
        self.inner.wake();
    }

    /// Takes back the retirements waiting for LSN `from` or later (records a failed write
    /// lost: the copies they waited for are gone). None of them was deleted: a deletion
    /// waits until its LSN is synced, and nothing at or after `from` was written.
    pub(crate) fn cancel_retire(&self, from: u64) -> Vec<(SegmentId, PathBuf)> {
        let mut st = lock(&self.slot.state);
        let (cancel, keep) = std::mem::take(&mut st.retire)
            .into_iter()
            .partition(|r| r.0 >= from);
        st.retire = keep;
        cancel.into_iter().map(|(_, id, path)| (id, path)).collect()
    }

    /// The last sync failure, until a later sync succeeds.
    pub(crate) fn error(&self) -> Option<String> {
        lock(&self.slot.state).error.clone()
    }

    /// A full sync round on the caller's thread (start-up, tests); callbacks run here.
    pub(crate) fn sync_now(&self) -> Result<(), StoreError> {
        sync_slot(&self.slot, true, &self.inner.writes);
        match self.error() {
            None => Ok(()),
            Some(e) => Err(StoreError::io(
                "sync",
                &self.slot.dir,
                std::io::Error::other(e),
            )),
        }
    }
}

fn run(inner: &Inner) {
    batch_policy();
    let tick = Duration::from_secs(1);
    let mut next_tick = Instant::now() + tick;
    loop {
        let shutdown = {
            let mut w = lock(&inner.wake);
            while !w.pending && !w.shutdown {
                w.sleeping = true;
                if inner.mode != FsyncMode::Everysec {
                    w = inner.cv.wait(w).unwrap_or_else(PoisonError::into_inner);
                    w.sleeping = false;
                    continue;
                }
                let now = Instant::now();
                if now >= next_tick {
                    w.sleeping = false;
                    break;
                }
                w = inner
                    .cv
                    .wait_timeout(w, next_tick - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
                w.sleeping = false;
            }
            w.pending = false;
            w.shutdown
        };
        let now = Instant::now();
        let periodic = inner.mode == FsyncMode::Everysec && now >= next_tick;
        if periodic {
            next_tick = now + tick;
        }
        let full = inner.mode == FsyncMode::Always || periodic || shutdown;
        let slots = lock(&inner.slots).clone();
        for slot in &slots {
            sync_slot(slot, full, &inner.writes);
        }
        if shutdown {
            return;
        }
    }
}

/// Puts the calling thread under `SCHED_BATCH`: it never preempts a running thread when it
/// wakes (the scheduler's tick decides), so a sync thread sharing a core with an event
/// loop waits for the loop's time slice instead of cutting into it at every wake-up.
fn batch_policy() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `sched_setscheduler` reads `param`, a valid `sched_param` on the stack that
    // outlives the call; pid 0 is the calling thread. It changes no memory of ours.
    let _ = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
}

/// One sync round of one log. `full`: sync whatever was written; otherwise only what a
/// pending delete waits for.
fn sync_slot(slot: &Slot, full: bool, writes: &StoreWrites) {
    let (target, files, dir_dirty) = {
        let mut st = lock(&slot.state);
        let forced = std::mem::take(&mut st.forced);
        let unsynced = st.written > st.synced || st.dir_dirty;
        let retire_waits = st.retire.iter().any(|r| r.0 > st.synced);
        if !forced && !(unsynced && (full || retire_waits)) {
            drop(st);
            delete_retired(slot);
            return;
        }
        (
            st.written,
            std::mem::take(&mut st.files),
            std::mem::take(&mut st.dir_dirty) || forced,
        )
    };
    // What each file holds before its sync: all of it is on disk once the sync returns.
    let sizes: Vec<u64> = files
        .iter()
        .map(|(_, f)| f.metadata().map_or(0, |m| m.len()))
        .collect();
    let t0 = Instant::now();
    let mut result = files
        .iter()
        .try_for_each(|(_, f)| f.sync_data())
        .map_err(|e| format!("fdatasync in {}: {e}", slot.dir.display()));
    if result.is_ok() && dir_dirty {
        result = sync_dir(&slot.dir);
    }
    let took = t0.elapsed();
    slot.metrics
        .sync_latency
        .observe_us(took.as_micros() as u64);
    if !files.is_empty() {
        writes.observe(took);
    }
    slot.metrics.syncs.add(1);
    let advanced = {
        let mut st = lock(&slot.state);
        let advanced = target > st.synced;
        st.synced = st.synced.max(target);
        if let Err(e) = &result {
            log::error!(
                error:% = e, upto = target;
                "store: {e}; records up to {target} may not be durable"
            );
            st.error = Some(e.clone());
        } else {
            st.error = None;
        }
        advanced
    };
    let cb = lock(&slot.on_sync);
    match result {
        Ok(()) if advanced => cb(SyncEvent::Synced(target)),
        Ok(()) => {}
        Err(_) => {
            slot.metrics.sync_errors.add(1);
            cb(SyncEvent::Failed(target));
            return;
        }
    }
    drop(cb);
    let mut dropped = lock(&slot.state).dropped;
    for ((id, f), &size) in files.iter().zip(&sizes) {
        let from = if dropped.0 == *id { dropped.1 } else { 0 };
        dropped = (*id, drop_synced_pages(f, from, size));
    }
    lock(&slot.state).dropped = dropped;
    delete_retired(slot);
}

/// Takes the whole pages between `from` (a page boundary, where the last drop of this file
/// ended) and `size` of a synced file out of the page cache; returns where this drop ended.
/// A log is read only at recovery, so the pages it wrote are never wanted again once they
/// are on disk; left cached, they would grow the page cache by everything the log
/// writes until the kernel reclaims them, and each new page the log writes would be a fresh
/// page the kernel must find. Dropped after each sync, the pages come back to the free
/// lists warm and the log's next writes reuse them (docs/PERFORMANCE.md, "Dropping synced
/// pages"). The page `size` falls in is kept: the log still appends to it, and a write into
/// a partial page that is not cached would first read it from disk, on the event loop. The
/// kernel drops only clean pages. Advice only: a failure changes nothing but the cache.
fn drop_synced_pages(f: &File, from: u64, size: u64) -> u64 {
    use std::os::fd::AsRawFd;
    // SAFETY: sysconf takes an integer and reads no memory of ours.
    let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        p if p > 0 => p as u64,
        _ => return from,
    };
    let end = size / page * page;
    let (Ok(off), Ok(len)) = (
        libc::off_t::try_from(from),
        libc::off_t::try_from(end.saturating_sub(from)),
    ) else {
        return from;
    };
    if len == 0 {
        return from;
    }
    // SAFETY: posix_fadvise takes a descriptor and integers (no pointers); `f` keeps the
    // descriptor open for the duration of the call.
    let _ = unsafe { libc::posix_fadvise(f.as_raw_fd(), off, len, libc::POSIX_FADV_DONTNEED) };
    end
}

/// Deletes the retired segments whose copies are synced, then syncs the directory.
fn delete_retired(slot: &Slot) {
    let ready: Vec<(u64, SegmentId, PathBuf)> = {
        let mut st = lock(&slot.state);
        if st.error.is_some() {
            return;
        }
        let synced = st.synced;
        let (ready, wait) = std::mem::take(&mut st.retire)
            .into_iter()
            .partition(|r| r.0 <= synced);
        st.retire = wait;
        ready
    };
    if ready.is_empty() {
        return;
    }
    let mut done = Vec::with_capacity(ready.len());
    for (_, id, path) in ready {
        match std::fs::remove_file(&path) {
            Ok(()) => done.push(id),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => done.push(id),
            Err(e) => {
                log::error!(
                    path:% = path.display(), error:% = e;
                    "store: delete {}: {e}", path.display()
                );
                slot.metrics.sync_errors.add(1);
            }
        }
    }
    if let Err(e) = sync_dir(&slot.dir) {
        log::error!(error:% = e; "store: {e}");
        slot.metrics.sync_errors.add(1);
    }
    slot.metrics.segments_retired.add(done.len() as u64);
    let cb = lock(&slot.on_sync);
    for id in done {
        cb(SyncEvent::Retired(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    /// Which of the file's pages are in the page cache (`mincore` over a read-only mapping).
    fn resident(f: &File, len: usize) -> Vec<bool> {
        let page = 4096;
        let pages = len.div_ceil(page);
        // SAFETY: a fresh shared read-only mapping of `len` bytes of an open file; it is only
        // passed to mincore (never read through) and unmapped before returning.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED);
        let mut vec = vec![0u8; pages];
        // SAFETY: `map` is a live mapping of `len` bytes and `vec` has one byte per page.
        let rc = unsafe { libc::mincore(map, len, vec.as_mut_ptr()) };
        // SAFETY: unmaps exactly the mapping made above.
        unsafe { libc::munmap(map, len) };
        assert_eq!(rc, 0);
        vec.iter().map(|b| b & 1 == 1).collect()
    }

    #[test]
    fn a_synced_file_leaves_the_page_cache_but_its_tail_page_stays() {
        let dir = super::super::log_tests::TempDir::new("dropped-pages");
        let path = dir.0.join("segment");
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        let len = 64 * 4096 + 100;
        f.write_all(&vec![7u8; len]).unwrap();
        // tmpfs keeps its pages whatever the advice: nothing to test there.
        let fs = std::process::Command::new("stat")
            .args(["-f", "-c", "%T"])
            .arg(&dir.0)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        if fs == "tmpfs" {
            return;
        }
        let before = resident(&f, len);
        assert!(before.iter().all(|&r| r), "written pages are cached");
        f.sync_data().unwrap();
        let end = drop_synced_pages(&f, 0, len as u64);
        assert_eq!(end, 64 * 4096);
        let after = resident(&f, len);
        assert!(
            !after[..64].iter().any(|&r| r),
            "synced whole pages dropped"
        );
        assert!(after[64], "the tail page, still being appended to, stays");
        // The data is all there (read back from disk).
        assert_eq!(std::fs::read(&path).unwrap(), vec![7u8; len]);
    }

    /// The scheduling policy of each of this process's threads named `name` (field 41 of
    /// `/proc/self/task/TID/stat`, after the parenthesised name).
    fn policies(name: &str) -> Vec<u32> {
        let mut out = Vec::new();
        for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.trim() != name {
                continue;
            }
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
            // Fields from 3 on; the policy is field 41.
            if let Some(p) = after.split_whitespace().nth(41 - 3) {
                out.push(p.parse().unwrap());
            }
        }
        out
    }

    #[test]
    fn the_sync_thread_never_preempts_an_event_loop_when_it_wakes() {
        let syncer = Syncer::start(FsyncMode::Always).unwrap();
        // The thread sets its own policy first thing; wait until every sync thread has.
        let batch = libc::SCHED_BATCH as u32;
        let mut seen = Vec::new();
        for _ in 0..200 {
            seen = policies("store-sync");
            if !seen.is_empty() && seen.iter().all(|&p| p == batch) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!seen.is_empty(), "a store-sync thread runs");
        assert!(
            seen.iter().all(|&p| p == batch),
            "every sync thread is SCHED_BATCH (3): {seen:?}"
        );
        syncer.shutdown();
    }
}
