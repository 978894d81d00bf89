//! Redis Cluster placement (DECISIONS §12): which hash slot a topic's keys live in, and
//! which node serves a slot ([`SlotMap`], read from `CLUSTER SLOTS`).
//!
//! Owns: the CRC16 of the Redis Cluster specification, the hash-tag rule that puts every key
//! of one topic in one slot ([`tag_parts`]), and the map's parsing. Pure: no I/O.

use redis::Value;

use super::addr::Endpoint;
use super::resp::{int, text};

/// Slots of a Redis Cluster.
pub const SLOTS: usize = 16384;

/// CRC16/XMODEM (polynomial 0x1021, initial 0), as Redis Cluster hashes keys.
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The slot of a key: the CRC16 of its hash tag (the bytes between the first `{` and the
/// next `}`, when not empty) or of the whole key.
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        rest.iter()
            .position(|&b| b == b'}')
            .filter(|&close| close > 0)
            .map(|close| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % SLOTS as u16
}

/// The three parts that stand for a topic in its key names on a Redis Cluster shard:
/// `{T}`, so every key of the topic hashes to T's slot. A topic that is empty or starts with
/// `}` cannot be a hash tag; its keys carry `!{~}T` instead (one slot for all such topics;
/// the `!` keeps those names apart from every `{T}` form). On other shards: `T` as it is.
pub fn tag_parts(topic: &[u8], tagged: bool) -> [&[u8]; 3] {
    match (tagged, topic.first()) {
        (false, _) => [b"", topic, b""],
        (true, None | Some(b'}')) => [b"!{~}", topic, b""],
        (true, Some(_)) => [b"{", topic, b"}"],
    }
}

/// The slot of a topic's keys on a Redis Cluster shard.
pub fn topic_slot(topic: &[u8]) -> u16 {
    match topic.first() {
        None | Some(b'}') => key_slot(b"{~}"),
        Some(_) => key_slot(&[b"{", topic, b"}"].concat()),
    }
}

/// Which node serves each slot, and how many replicas it has.
#[derive(Debug, Clone, Default)]
pub struct SlotMap {
    /// Index into `nodes` per slot; `u16::MAX`: nobody serves it.
    owner: Vec<u16>,
    /// The primaries named by the map.
    pub nodes: Vec<Endpoint>,
    /// Replicas per node (same order), as the map lists them.
    pub replicas: Vec<u32>,
}

/// Nobody serves the slot.
const NONE: u16 = u16::MAX;

impl SlotMap {
    /// Parses a `CLUSTER SLOTS` reply: `[[start, end, [host, port, id, ...], replica...]...]`.
    /// An empty host (a node that does not know its own address) is `seed`'s.
    pub fn parse(v: &Value, seed: &Endpoint) -> Option<SlotMap> {
        let Value::Array(ranges) = v else {
            return None;
        };
        let mut m = SlotMap {
            owner: vec![NONE; SLOTS],
            ..SlotMap::default()
        };
        for r in ranges {
            let Value::Array(r) = r else { return None };
            let start = usize::try_from(int(r.first()?)?).ok()?;
            let end = usize::try_from(int(r.get(1)?)?).ok()?;
            let Value::Array(primary) = r.get(2)? else {
                return None;
            };
            let host = text(primary.first()?)?;
            let port = u16::try_from(int(primary.get(1)?)?).ok()?;
            let at = Endpoint {
                host: if host.is_empty() {
                    seed.host.clone()
                } else {
                    host.to_ascii_lowercase()
                },
                port,
            };
            let i = m.index_of(at);
            let replicas = u32::try_from(r.len().saturating_sub(3)).unwrap_or(u32::MAX);
            m.replicas[i] = m.replicas[i].max(replicas);
            if start > end || end >= SLOTS {
                return None;
            }
            let i = u16::try_from(i).ok()?;
            m.owner[start..=end].iter_mut().for_each(|o| *o = i);
        }
        Some(m)
    }

    /// The node serving `slot`, if any.
    pub fn owner(&self, slot: u16) -> Option<usize> {
        match self.owner.get(usize::from(slot)) {
            Some(&o) if o != NONE => Some(usize::from(o)),
            _ => None,
        }
    }

    /// Whether every slot is served.
    pub fn complete(&self) -> bool {
        !self.owner.is_empty() && self.owner.iter().all(|&o| o != NONE)
    }

    /// The index of node `at`, added (with no replica known) when new.
    fn index_of(&mut self, at: Endpoint) -> usize {
        match self.nodes.iter().position(|n| *n == at) {
            Some(i) => i,
            None => {
                self.nodes.push(at);
                self.replicas.push(0);
                self.nodes.len() - 1
            }
        }
    }

    /// Sets the owner of one slot (after a `MOVED`), adding the node when new; returns its
    /// index.
    pub fn moved(&mut self, slot: u16, to: Endpoint) -> usize {
        if self.owner.is_empty() {
            self.owner = vec![NONE; SLOTS];
        }
        let i = self.index_of(to);
        if let (Some(o), Ok(i16)) = (self.owner.get_mut(usize::from(slot)), u16::try_from(i)) {
            *o = i16;
        }
        i
    }
}

/// The slot map as the command thread last knew it, for the subscriber (`sharded`): a
/// snapshot and its generation, bumped on every change.
#[derive(Debug, Default)]
pub struct MapCell {
    map: std::sync::Mutex<std::sync::Arc<SlotMap>>,
    gen: std::sync::atomic::AtomicU64,
}

impl MapCell {
    /// The generation (cheap: read on every wake of the subscriber).
    pub fn gen(&self) -> u64 {
        self.gen.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The current map.
    pub fn get(&self) -> std::sync::Arc<SlotMap> {
        std::sync::Arc::clone(&self.map.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Publishes a new map.
    pub fn set(&self, m: SlotMap) {
        *self.map.lock().unwrap_or_else(|e| e.into_inner()) = std::sync::Arc::new(m);
        self.gen.fetch_add(1, std::sync::atomic::Ordering::Release);
    }
}

/// A `MOVED slot host:port` or `ASK slot host:port` error's target.
pub fn redirect(details: &str) -> Option<(u16, Endpoint)> {
    let mut it = details.split_whitespace();
    let slot = it
        .next()?
        .parse::<u16>()
        .ok()
        .filter(|s| usize::from(*s) < SLOTS)?;
    let addr = it.next()?;
    let (host, port) = addr.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some((
        slot,
        Endpoint {
            host: host.to_ascii_lowercase(),
            port: port.parse().ok()?,
        },
    ))
}

/// A short hash tag per slot (the first decimal number whose CRC16 lands there), so a
/// per-slot key can sit in the slot of any topic (the webhook counter on a cluster).
pub(crate) fn slot_tag(slot: u16) -> &'static str {
    static TAGS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let mut tags = vec![String::new(); SLOTS];
        let mut left = SLOTS;
        let mut n: u64 = 0;
        while left > 0 {
            let s = n.to_string();
            let t = &mut tags[usize::from(crc16(s.as_bytes()) % SLOTS as u16)];
            if t.is_empty() {
                *t = s;
                left -= 1;
            }
            n += 1;
        }
        tags
    });
    tags.get(usize::from(slot)).map_or("", String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_cluster_specification() {
        // The reference values of the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        // Every key of a topic lands in its slot, odd topics included.
        for t in [&b"abc"[..], b"", b"}x", b"a}b", b"{x}", b"a{b"] {
            let want = topic_slot(t);
            for prefix in [&b"wr:2:m:"[..], b"wr:0:2:", b"wr:w:"] {
                let p = tag_parts(t, true);
                let key = [prefix, p[0], p[1], p[2]].concat();
                assert_eq!(key_slot(&key), want, "{:?}", String::from_utf8_lossy(&key));
            }
        }
    }

    #[test]
    fn a_slot_map_parses_and_follows_moves() {
        let node = |h: &str, p: i64| {
            Value::Array(vec![
                Value::BulkString(h.as_bytes().to_vec()),
                Value::Int(p),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let v = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(8191),
                node("10.0.0.1", 7000),
                node("10.0.0.2", 7001),
            ]),
            Value::Array(vec![Value::Int(8192), Value::Int(16383), node("", 7002)]),
        ]);
        let seed = Endpoint {
            host: "seed".into(),
            port: 1,
        };
        let mut m = SlotMap::parse(&v, &seed).unwrap();
        assert!(m.complete());
        assert_eq!(m.nodes[m.owner(0).unwrap()].to_string(), "10.0.0.1:7000");
        assert_eq!(m.nodes[m.owner(16383).unwrap()].to_string(), "seed:7002");
        assert_eq!(m.replicas, [1, 0]);
        let (slot, to) = redirect("3999 127.0.0.1:6381").unwrap();
        let i = m.moved(slot, to);
        assert_eq!(m.owner(3999), Some(i));
        assert_eq!(m.nodes[i].to_string(), "127.0.0.1:6381");
        assert!(redirect("x 1:2").is_none());
        assert!(SlotMap::parse(&Value::Int(1), &seed).is_none());
    }
}
