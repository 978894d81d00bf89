//! Start-up of the durable engine (`--data-dir`, DECISIONS §6): lock the directory, read
//! every record every worker wrote, rebuild each worker's home state from them (their
//! topics' homes may have moved: the records go where their topics live now), and open each
//! worker's own log to write from here on. The in-memory engine's builder (`local::build`)
//! calls this with each worker's home state and journal.
//!
//! When every record is already in its topic's home's log (same `--threads`, same
//! placement), the workers adopt their old segments. Otherwise each worker writes its whole
//! state to a fresh log, syncs it, and every older segment is deleted: a full rewrite,
//! needed only when the layout changed.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::arcbuf::ArcBuf;
use crate::metrics::StoreWrites;

use super::{Cancels, Journal};
use crate::config::{Config, Fsync};
use crate::engine::memory::home::{HomeTopics, WebhookAdded, WebhookRemoved};
use crate::engine::memory::placement::Placement;
use crate::engine::{BuildError, Message, Origin, Position};
use crate::health::Health;
use crate::message::{Body, Meta};
use crate::store::entry::{Entry, Ns};
use crate::store::{
    self, DirLock, FsyncMode, Loc, Log, LogConfig, RecoveryStats, StoreMetrics, SyncEvent, Syncer,
};

/// A message read back.
struct Found {
    topic: Arc<str>,
    pos: Position,
    expires_unix: u64,
    /// A v2 message's `Body` (its parts), or a v1 frame.
    data: ArcBuf,
    /// A v2 message's `Body::beta_len`; 0 for a v1 frame.
    beta_len: u32,
    loc: Loc,
}

/// A webhook change read back, in log order.
enum WebhookOp {
    Add(Arc<str>, Arc<str>, Loc),
    Remove(Arc<str>, Arc<str>, Loc),
}

/// What one worker gets back.
#[derive(Default)]
struct Share {
    messages: Vec<Found>,
    webhooks: Vec<WebhookOp>,
    /// Pending WalletConnect 1.0 frames.
    frames: Vec<Found>,
    /// Frames delivered (their `Forget` records): (topic, position, the Forget's record).
    forgotten: Vec<(Arc<str>, Position, Loc)>,
    /// Client-id subscription changes, in log order.
    clients: Vec<super::recover_clients::ClientFound>,
}

/// Everything read back, by the worker that is home of each topic now.
struct Recovered {
    shares: Vec<Share>,
    /// Records found in another log than their topic's home's (the layout changed).
    misplaced: u64,
    /// Messages already expired (left to compaction).
    expired: u64,
    /// Records whose entry did not decode (their checksum was right: a bug or a newer
    /// format); skipped and counted.
    undecodable: u64,
}

/// A v2 message's content as a record holds it: this build's `Body`, or (`body` false) the
/// `{"topic":..,"message":..}` of a build before `irn`, given `publishedAt` = the time it is
/// read back (`now`, ms) and tag 0 (docs/DECISIONS.md, "Stored messages before irn").
fn stored_body(body: bool, data: &[u8], now: u64) -> Option<Body> {
    if body {
        Body::from_stored(ArcBuf::copy_from_slice(data))
    } else {
        let meta = Meta {
            published_at: now,
            ..Meta::default()
        };
        Body::from_beta(data, meta)
    }
}

/// The owner name of worker `i`'s log.
pub fn owner(i: usize) -> String {
    format!("w{i}")
}

impl Recovered {
    fn take(&mut self, placement: &Placement, owner: &str, loc: Loc, payload: &[u8], now: u64) {
        let entry = match Entry::decode(payload) {
            Ok(e) => e.expanded(),
            Err(e) => {
                self.undecodable += 1;
                log::warn!("data directory: record of {owner} at {loc:?} not understood: {e}");
                return;
            }
        };
        let home = placement.of(entry.topic());
        if self::owner(home) != owner {
            self.misplaced += 1;
        }
        let Some(share) = self.shares.get_mut(home) else {
            return;
        };
        match entry {
            Entry::Message {
                ns,
                topic,
                epoch,
                seq,
                expires_unix_ms,
                body,
                data,
                ..
            } => {
                if expires_unix_ms <= now {
                    self.expired += 1;
                    return;
                }
                let (list, data, beta_len) = match ns {
                    Ns::V2 => match stored_body(body, data, now) {
                        Some(b) => (&mut share.messages, b.irn().clone(), b.beta_len()),
                        None => {
                            self.undecodable += 1;
                            log::warn!("data directory: message of {owner} at {loc:?} is not a stored message body");
                            return;
                        }
                    },
                    Ns::V1 => (&mut share.frames, ArcBuf::copy_from_slice(data), 0),
                };
                list.push(Found {
                    topic: Arc::from(topic),
                    pos: Position { epoch, seq },
                    expires_unix: expires_unix_ms,
                    data,
                    beta_len,
                    loc,
                });
            }
            Entry::WebhookAdd { topic, url } => {
                share
                    .webhooks
                    .push(WebhookOp::Add(Arc::from(topic), Arc::from(url), loc));
            }
            Entry::WebhookRemove { topic, url } => {
                share
                    .webhooks
                    .push(WebhookOp::Remove(Arc::from(topic), Arc::from(url), loc));
            }
            Entry::Forget {
                topic, epoch, seq, ..
            } => share
                .forgotten
                .push((Arc::from(topic), Position { epoch, seq }, loc)),
            // Read as the `Message` it stands for (`expanded` above).
            Entry::Body { .. } => {}
            Entry::ClientSub { .. } | Entry::ClientEnd { .. } => {
                share
                    .clients
                    .extend(super::recover_clients::found(&entry, loc));
            }
        }
    }
}

/// The placement seeds kept in the directory, so that topics keep their homes across
/// restarts (written on first use).
fn placement_seeds(dir: &Path, fresh: [u64; 4]) -> Result<[u64; 4], BuildError> {
    let path = dir.join(store::PLACEMENT_FILE);
    let io = |what: &'static str| move |source| BuildError::Io { what, source };
    if let Ok(text) = std::fs::read_to_string(&path) {
        let seeds: Vec<u64> = text
            .split_whitespace()
            .filter_map(|w| u64::from_str_radix(w, 16).ok())
            .collect();
        if let [a, b, c, d] = seeds[..] {
            return Ok([a, b, c, d]);
        }
        log::warn!(
            "{}: not understood; a new placement is written",
            path.display()
        );
    }
    let text: Vec<String> = fresh.iter().map(|s| format!("{s:016x}")).collect();
    let tmp = dir.join(format!("{}.tmp", store::PLACEMENT_FILE));
    std::fs::write(&tmp, text.join(" ") + "\n").map_err(io("writing the placement seeds"))?;
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io("syncing the placement seeds"))?;
    std::fs::rename(&tmp, &path).map_err(io("writing the placement seeds"))?;
    Ok(fresh)
}

/// The flags the durable engine follows.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `--fsync`.
    pub mode: FsyncMode,
    /// Each worker's log (`--segment-bytes`).
    pub log: LogConfig,
    /// Where the sync threads time their rounds (`Metrics::store_writes`).
    pub writes: Arc<StoreWrites>,
}

impl Settings {
    /// From the command line.
    pub fn of(config: &Config) -> Settings {
        Settings {
            mode: match config.fsync {
                Fsync::Always => FsyncMode::Always,
                Fsync::Everysec => FsyncMode::Everysec,
                Fsync::Off => FsyncMode::Off,
            },
            log: LogConfig {
                segment_bytes: config.segment_bytes,
                ..LogConfig::default()
            },
            writes: Arc::default(),
        }
    }
}

/// What the durable start-up leaves for the rest of the server.
pub struct Durable {
    /// The directory lock, held for the process lifetime.
    pub lock: DirLock,
    /// What recovery found, for `/metrics`.
    pub stats: RecoveryStats,
}

/// What a worker's sync thread calls with what became of its records (it sends them to
/// the worker's engine).
pub type OnSync = Box<dyn Fn(SyncEvent) + Send>;

/// Locks `dir` (created if missing) and returns the lock with the placement seeds kept
/// there (`fresh` on first use).
pub fn open(dir: &Path, fresh: [u64; 4]) -> Result<(DirLock, [u64; 4]), BuildError> {
    let lock = DirLock::acquire(dir)?;
    let seeds = placement_seeds(dir, fresh)?;
    Ok((lock, seeds))
}

/// Every record of `dir`, read back before any worker opens its log, by the worker that is
/// home of its topic now.
pub struct ReadBack {
    found: Recovered,
    stats: RecoveryStats,
    started: Instant,
}

/// Reads every record of `dir` for `n` workers placed by `placement`.
pub fn read_back(dir: &Path, n: usize, placement: &Placement) -> Result<ReadBack, BuildError> {
    let started = Instant::now();
    let now = crate::clock::unix_ms();
    let mut found = Recovered {
        shares: (0..n).map(|_| Share::default()).collect(),
        misplaced: 0,
        expired: 0,
        undecodable: 0,
    };
    let stats = store::recover(dir, |owner, loc, payload| {
        found.take(placement, owner, loc, payload, now);
        Ok(())
    })?;
    Ok(ReadBack {
        found,
        stats,
        started,
    })
}

/// Restores what was read back into each worker's fresh home state and its journal, just
/// opened (`workers`, in worker order, placed by `placement`).
pub fn recover(
    dir: &Path,
    lock: DirLock,
    back: ReadBack,
    workers: Vec<(&mut HomeTopics, &mut Journal)>,
    placement: &Placement,
) -> Result<Durable, BuildError> {
    let ReadBack {
        found,
        mut stats,
        started,
    } = back;
    stats.undecodable_records = found.undecodable;
    let n = workers.len();
    let rewrite = found.misplaced > 0;
    let (mut messages, mut webhooks) = (0usize, 0usize);
    for ((home, journal), share) in workers.into_iter().zip(found.shares) {
        let (m, w) = restore(home, journal, placement, share, !rewrite);
        messages += m;
        webhooks += w;
        if rewrite {
            journal.rewrite(home)?;
        }
    }
    if rewrite {
        let owners: Vec<String> = (0..n).map(owner).collect();
        let keep: Vec<&str> = owners.iter().map(String::as_str).collect();
        store::remove_owners_except(dir, &keep)?;
    }
    let ms = started.elapsed().as_millis() as u64;
    log::info!(
        engine = "durable",
        dir:% = dir.display(),
        messages,
        webhooks,
        ms,
        records = stats.records,
        bytes = stats.bytes,
        segments = stats.segments,
        expired = found.expired,
        damaged = stats.skipped_regions,
        torn = stats.torn_tails,
        undecodable = found.undecodable,
        relaid = rewrite;
        "data directory {}: recovered {messages} messages and {webhooks} webhook registrations \
         in {} ms ({} records, {} bytes read from {} segments; {} expired, {} damaged \
         regions skipped, {} torn tails cut, {} undecodable){}",
        dir.display(),
        ms,
        stats.records,
        stats.bytes,
        stats.segments,
        found.expired,
        stats.skipped_regions,
        stats.torn_tails,
        found.undecodable,
        if rewrite {
            "; the worker layout changed: state rewritten to the new layout"
        } else {
            ""
        }
    );
    Ok(Durable { lock, stats })
}

/// Opens worker `i`'s log, with its own sync thread reporting through `on_sync`; returns it
/// with the log's figures for `/metrics`.
pub fn open_journal(
    dir: &Path,
    i: usize,
    settings: &Settings,
    on_sync: OnSync,
    health: &Arc<Health>,
) -> Result<(Journal, (String, Arc<StoreMetrics>)), BuildError> {
    let syncer = Syncer::start_timed(settings.mode, settings.writes.clone())?;
    let log = Log::open(dir, &owner(i), settings.log.clone(), &syncer, on_sync)?;
    let journal = Journal::new(log, syncer, health.clone());
    let figures = (owner(i), journal.metrics());
    Ok((journal, figures))
}

/// Restores one worker's share into its home state; `keep`: its records stay where they
/// are (counted live in the worker's log). Returns the messages and webhooks restored.
fn restore(
    home: &mut HomeTopics,
    journal: &mut Journal,
    placement: &Placement,
    mut share: Share,
    keep: bool,
) -> (usize, usize) {
    let unix_now = crate::clock::unix_ms();
    let now = crate::clock::now_ms();
    // Per topic, in position order (compaction copies a record after newer ones).
    share
        .messages
        .sort_by(|a, b| (&a.topic, a.pos).cmp(&(&b.topic, b.pos)));
    let hashes: Vec<u64> = share
        .messages
        .iter()
        .map(|f| placement.content_hash(f.data.get(..f.beta_len as usize).unwrap_or(&[])))
        .collect();
    let mut kept = 0;
    for (f, hash) in share.messages.into_iter().zip(hashes) {
        if keep {
            journal.log_mut().keep(f.loc);
        }
        let Some(body) = Body::from_parts(f.data, f.beta_len) else {
            continue;
        };
        let msg = Message {
            pos: f.pos,
            body,
            origin: Origin::NONE,
        };
        let expires = now + f.expires_unix.saturating_sub(unix_now);
        if home.restore(&f.topic, msg, hash, expires, f.loc) {
            kept += 1;
        }
    }
    restore_frames(home, journal, share.frames, share.forgotten, keep);
    let webhooks = restore_webhooks(home, journal, share.webhooks, keep);
    let clients = super::recover_clients::restore_clients(home, journal, share.clients, keep);
    if clients > 0 {
        log::info!("data directory: {clients} client subscriptions restored");
    }
    (kept, webhooks)
}

/// Restores the pending v1 frames that were not delivered (no `Forget` for them).
fn restore_frames(
    home: &mut HomeTopics,
    journal: &mut Journal,
    mut frames: Vec<Found>,
    forgotten: Vec<(Arc<str>, Position, Loc)>,
    keep: bool,
) {
    let unix_now = crate::clock::unix_ms();
    let now = crate::clock::now_ms();
    let gone: HashMap<(Arc<str>, Position), Loc> =
        forgotten.into_iter().map(|(t, p, l)| ((t, p), l)).collect();
    frames.sort_by(|a, b| (&a.topic, a.pos).cmp(&(&b.topic, b.pos)));
    for f in frames {
        if let Some(&tomb) = gone.get(&(f.topic.clone(), f.pos)) {
            // Delivered before the restart: the Forget stays live while this record is on
            // disk.
            if keep {
                let what = Cancels::Frame {
                    topic: f.topic.clone(),
                    pos: f.pos,
                };
                journal.restore_tombstone(what, tomb, f.loc.segment);
            }
            continue;
        }
        if keep {
            journal.log_mut().keep(f.loc);
        }
        let expires = now + f.expires_unix.saturating_sub(unix_now);
        home.v1_restore(&f.topic, f.pos, f.data, expires, f.loc);
    }
    for (topic, pos) in gone.keys() {
        home.v1_forgotten(topic, *pos);
    }
}

/// Replays the webhook changes of one worker in log order.
fn restore_webhooks(
    home: &mut HomeTopics,
    journal: &mut Journal,
    ops: Vec<WebhookOp>,
    keep: bool,
) -> usize {
    let mut live: HashMap<(Arc<str>, Arc<str>), Loc> = HashMap::new();
    for op in ops {
        match op {
            WebhookOp::Add(topic, url, loc) => {
                if home.add_webhook(&topic, url.clone()) == Ok(WebhookAdded::New) {
                    live.insert((topic, url), loc);
                }
            }
            WebhookOp::Remove(topic, url, loc) => {
                if home.remove_webhook(&topic, &url) != WebhookRemoved::NotThere {
                    let cancels = live.remove(&(topic.clone(), url.clone()));
                    // The tombstone stays live while the record it cancels is on disk.
                    if let (true, Some(c)) = (keep, cancels) {
                        journal.restore_tombstone(Cancels::Webhook { topic, url }, loc, c.segment);
                    }
                }
            }
        }
    }
    let n = live.len();
    for ((topic, url), loc) in live {
        if keep {
            journal.log_mut().keep(loc);
            home.set_webhook_record(&topic, &url, loc);
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_of_a_build_before_irn_is_read_with_the_documented_fields() {
        let old = br#"{"topic":"t","message":"m"}"#;
        let b = stored_body(false, old, 1_700_000_000_000).unwrap();
        assert_eq!(
            &b.irn()[..],
            br#"{"topic":"t","message":"m","publishedAt":1700000000000,"tag":0}"#
        );
        let meta = Meta {
            published_at: 5,
            tag: 1108,
            attestation: Some("a"),
            plain: false,
        };
        let new = Body::encode("t", "m", meta);
        assert_eq!(stored_body(true, new.irn(), 0), Some(new.clone()));
        // Bytes of the wrong kind are refused, never misread.
        assert_eq!(stored_body(true, old, 0), None);
        assert_eq!(stored_body(false, b"not json", 0), None);
    }

    /// A message as recovery keeps it: topic, position, expiry, body, beta length.
    type Kept = (String, Position, u64, ArcBuf, u32);

    /// What recovery keeps of one record, and whether it was undecodable.
    fn read_back(payload: &[u8]) -> (u64, Vec<Kept>) {
        let mut r = Recovered {
            shares: vec![Share::default()],
            misplaced: 0,
            expired: 0,
            undecodable: 0,
        };
        let loc = Loc {
            segment: 1,
            offset: 16,
            len: 0,
        };
        r.take(&Placement::new(1, [1, 2, 3, 4]), "w0", loc, payload, 1_000);
        let kept = r.shares[0].messages.iter();
        let kept = kept.map(|f| {
            (
                f.topic.to_string(),
                f.pos,
                f.expires_unix,
                f.data.clone(),
                f.beta_len,
            )
        });
        (r.undecodable, kept.collect())
    }

    #[test]
    fn a_message_of_every_kind_is_read_back_to_the_same_state() {
        let meta = Meta {
            published_at: 5,
            tag: 1108,
            attestation: None,
            plain: false,
        };
        let topic = "ab".repeat(32);
        let body = Body::encode(&topic, "m", meta);
        let (epoch, seq, expires_unix_ms) = (1_764_000_000_000_000, 7, 90_000);
        let compact = Entry::Body {
            topic: &topic,
            epoch,
            seq,
            expires_unix_ms,
            prompt: true,
            data: body.irn(),
        };
        let before = Entry::Message {
            ns: Ns::V2,
            topic: &topic,
            epoch,
            seq,
            expires_unix_ms,
            prompt: true,
            body: true,
            data: body.irn(),
        };
        let (mut a, mut b) = (Vec::new(), Vec::new());
        compact.encode(&mut a).unwrap();
        before.encode(&mut b).unwrap();
        assert_eq!((a[0], b[0]), (6, 5));
        // Kind 6: kind, flags, then varints: epoch 8 bytes, seq 1, expires 3, topic length
        // 1. Kind 5: 97.
        assert_eq!(a.len() - body.len(), 15);
        assert_eq!(b.len() - body.len(), 97);
        let want = (
            0,
            vec![(
                topic.clone(),
                Position { epoch, seq },
                expires_unix_ms,
                body.irn().clone(),
                body.beta_len(),
            )],
        );
        assert_eq!(read_back(&a), want);
        assert_eq!(read_back(&b), want);
        // A kind 1 record (a build before irn) gets its documented members.
        let beta = format!(r#"{{"topic":"{topic}","message":"m"}}"#);
        let old = Entry::Message {
            ns: Ns::V2,
            topic: &topic,
            epoch,
            seq,
            expires_unix_ms,
            prompt: false,
            body: false,
            data: beta.as_bytes(),
        };
        let mut c = Vec::new();
        old.encode(&mut c).unwrap();
        assert_eq!(c[0], 1);
        let upgraded = Body::encode(
            &topic,
            "m",
            Meta {
                published_at: 1_000,
                ..Meta::default()
            },
        );
        let (undecodable, kept) = read_back(&c);
        assert_eq!(undecodable, 0);
        assert_eq!(&kept[0].3, upgraded.irn());
        assert_eq!(kept[0].4, upgraded.beta_len());
    }
}
