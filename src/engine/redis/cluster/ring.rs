//! Which Redis shard holds a topic, and the check that every node lists the same shards.
//!
//! Owns: the stable topic hash, jump consistent hashing over the shard list, and the
//! fingerprint every node writes into every shard (the URLs themselves are `addr`'s). Must
//! not touch sockets: the shard thread does the `SET NX` / `GET`.
//!
//! The hash and the fingerprint are part of the cluster's wire contract: two builds that
//! place a topic differently, or lay its data out differently in Redis, must never share a
//! cluster, so both carry a version ([`RING_VERSION`]) that is part of the fingerprint.

use super::addr::ShardAddr;

/// Version of the placement rule (hash + jump) and of the data layout in Redis (key names,
/// the scripts' arguments and replies, the channel payload). Changing any of them bumps it,
/// so nodes of old and new builds refuse to share shards instead of disagreeing about where
/// a topic lives or how it is stored. 2: the stream's key became its channel's name and the
/// dedup digest binary (`cluster::script`). 3: a stored message is a `message::Body` (the
/// `irn` object with `publishedAt`, `tag`, `attestation`), deduplicated on its beta part
/// (docs/SCALING.md, "Upgrading across a layout"). 4: the publish script takes the primary's
/// replication id and a topic's seq may jump after a failover (DECISIONS §12). 5: client ids
/// (`cluster::clients`): the publish script takes the clients hash and returns client ids.
/// The number itself is `layout::REDIS` (what `--version` and `walletrelay_build_info` show).
pub const RING_VERSION: u32 = crate::layout::REDIS;

/// FNV-1a over the bytes, finished with the splitmix64 mixer: a fixed function (same on
/// every node, build and run; never the process-random `std` hasher).
pub fn topic_hash(topic: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in topic {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Jump consistent hash (Lamping and Veach, 2014): a bucket in `0..buckets` for `key`; going
/// from `n` to `n + 1` buckets moves only the keys that land in the new bucket. `buckets` 0
/// is treated as 1.
pub fn jump(mut key: u64, buckets: u32) -> u32 {
    let n = i64::from(buckets.max(1));
    let mut b: i64 = -1;
    let mut j: i64 = 0;
    while j < n {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        let r = ((key >> 33) + 1) as f64;
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / r)) as i64;
    }
    // b is in 0..n, n <= u32::MAX.
    b as u32
}

/// The shard of `topic` among `shards` shards. The namespace is deliberately not hashed: a
/// v1 and a v2 topic with the same name share a shard, so one script sees the topic's
/// webhook registrations (which are per topic name, not per namespace).
pub fn shard_of(topic: &[u8], shards: usize) -> usize {
    let n = u32::try_from(shards).unwrap_or(u32::MAX);
    jump(topic_hash(topic), n) as usize
}

/// The fingerprint of a shard list: the placement version and each shard's `host:port/db`
/// in order (no password). Readable on purpose: a refusal quotes both lists.
pub fn fingerprint(shards: &[ShardAddr]) -> String {
    let mut s = format!("{PREFIX}{RING_VERSION}:");
    for (i, a) in shards.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&a.to_string());
    }
    s
}

/// What every fingerprint starts with, before its layout version.
const PREFIX: &str = "walletrelay-ring v";

/// The layout version a fingerprint names and its shard list (`None`: not a fingerprint).
pub fn parse(fp: &str) -> Option<(u32, &str)> {
    let rest = fp.strip_prefix(PREFIX)?;
    let (v, list) = rest.split_once(':')?;
    Some((v.parse().ok()?, list))
}

/// `fp` (a fingerprint) with layout version `version` instead of its own.
pub fn at_version(fp: &str, version: u32) -> String {
    let list = parse(fp).map_or("", |(_, l)| l);
    format!("{PREFIX}{version}:{list}")
}

/// Why a shard's fingerprint keeps this node out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Another shard list (or not a fingerprint at all).
    OtherList,
    /// The same list, in a layout this build does not read.
    Unreadable(u32),
}

/// The layout a shard's cluster writes, from the fingerprint found there (`theirs`) and this
/// node's own (`ours`): the same shard list in a version this build reads
/// (`layout::REDIS_OLDEST..=layout::REDIS`).
pub fn accept(ours: &str, theirs: &str) -> Result<u32, Refusal> {
    let (Some((_, mine)), Some((v, list))) = (parse(ours), parse(theirs)) else {
        return Err(Refusal::OtherList);
    };
    if list != mine {
        return Err(Refusal::OtherList);
    }
    match (crate::layout::REDIS_OLDEST..=RING_VERSION).contains(&v) {
        true => Ok(v),
        false => Err(Refusal::Unreadable(v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_and_placement_are_pinned() {
        // These values are the cluster's contract: a change here splits a mixed-version
        // cluster's topics, so it must come with a RING_VERSION bump.
        assert_eq!(topic_hash(b""), 0xf52a_15e9_a9b5_e89b);
        assert_eq!(topic_hash(b"topic-1"), 0x375c_f55a_740a_46f9);
        let pinned: Vec<usize> = ["a", "b", "topic-1", "topic-2", "0123456789abcdef"]
            .iter()
            .map(|t| shard_of(t.as_bytes(), 7))
            .collect();
        assert_eq!(pinned, [1, 3, 3, 4, 3]);
        assert_eq!(jump(0, 1), 0);
        assert_eq!(jump(u64::MAX, 0), 0);
    }

    #[test]
    fn jump_is_balanced_and_moves_only_to_the_new_shard() {
        let n = 20_000u64;
        let mut counts = [0u32; 5];
        for k in 0..n {
            let t = format!("topic-{k}");
            let a = shard_of(t.as_bytes(), 5);
            counts[a] += 1;
            let b = shard_of(t.as_bytes(), 6);
            assert!(b == a || b == 5, "key moved between old shards");
        }
        for c in counts {
            assert!((3_600..4_400).contains(&c), "unbalanced: {counts:?}");
        }
    }

    #[test]
    fn fingerprint_names_each_shard_without_password() {
        let l = ShardAddr::parse_list(
            &["redis://:secret@LocalHost:7000/3, redis://h2, redis+sentinel://s:1/m?addr=s:2"],
            None,
        )
        .unwrap();
        let f = fingerprint(&l);
        assert_eq!(
            f,
            "walletrelay-ring v5:localhost:7000/3,h2:6379/0,sentinel:m/0"
        );
    }

    #[test]
    fn a_shard_of_the_previous_layout_is_joined_and_others_refused() {
        let ours = "walletrelay-ring v5:a:6379/0,b:6379/0";
        assert_eq!(accept(ours, ours), Ok(5));
        assert_eq!(accept(ours, "walletrelay-ring v4:a:6379/0,b:6379/0"), Ok(4));
        assert_eq!(
            accept(ours, "walletrelay-ring v3:a:6379/0,b:6379/0"),
            Err(Refusal::Unreadable(3))
        );
        assert_eq!(
            accept(ours, "walletrelay-ring v6:a:6379/0,b:6379/0"),
            Err(Refusal::Unreadable(6))
        );
        assert_eq!(
            accept(ours, "walletrelay-ring v4:a:6379/0"),
            Err(Refusal::OtherList)
        );
        assert_eq!(accept(ours, "garbage"), Err(Refusal::OtherList));
        assert_eq!(at_version(ours, 4), "walletrelay-ring v4:a:6379/0,b:6379/0");
    }
}
