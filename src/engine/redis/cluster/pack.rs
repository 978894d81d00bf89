//! Packing a round of commands for one Redis connection: runs of publishes go as groups
//! (one script call for up to `publish_group` messages; on a Redis Cluster shard a group
//! never spans two hash slots, as one script call may touch one slot only), everything else
//! one call each, and one [`Slot`] per call says which commands its reply answers.
//!
//! Owns: the mapping from [`Command`]s to script calls. Pure: no I/O; both command threads
//! (`shard` for standalone and Sentinel shards, `multi` for Redis Cluster shards) send what
//! it packs.

use super::command::{Command, ShardCtx};
use super::reply::Slot;
use super::script::{self, Keys, PublishArgs, Shas};
use super::slots::topic_slot;
use super::{clients, v1};

/// What the client scripts need from the shard's settings.
fn client_limits(ctx: &ShardCtx, keys: Keys) -> clients::ClientLimits {
    clients::ClientLimits {
        node: ctx.node,
        mailbox_ttl_ms: u64::try_from(ctx.cfg.mailbox_ttl.as_millis()).unwrap_or(u64::MAX),
        alive_ms: u64::try_from(ctx.cfg.node_alive.as_millis()).unwrap_or(u64::MAX),
        keys,
    }
}

/// A command's hash slot on a Redis Cluster shard (`None`: it has no topic; the liveness
/// refresh goes to whichever node serves its key, `ROLE` to none).
pub(crate) fn command_slot(c: &Command, node: u64) -> Option<u16> {
    let topic = match c {
        Command::Publish { req, .. } => &req.topic,
        Command::Read { topic, .. }
        | Command::WebhookAdd { topic, .. }
        | Command::WebhookRemove { topic, .. }
        | Command::V1Sub { topic, .. } => topic,
        Command::V1Publish { req, .. } => &req.topic,
        Command::Client { topic, .. } => topic,
        Command::Mailbox { client, .. } => client,
        Command::Alive => return Some(super::slots::key_slot(&v1::node_key(node))),
        Command::AliveIn(slot) => return Some(*slot),
        Command::Ring => return Some(super::slots::key_slot(script::RING_KEY)),
        Command::Role => return None,
    };
    Some(topic_slot(topic.as_bytes()))
}

/// Packs `batch` into `buf` (appended) and one [`Slot`] per script call into `slots`.
/// `replid`: the primary's replication id, for the publish script.
pub(crate) fn pack_batch<'c>(
    ctx: &ShardCtx,
    shas: &Shas,
    replid: &[u8],
    batch: impl IntoIterator<Item = &'c Command>,
    buf: &mut Vec<u8>,
    slots: &mut Vec<Slot>,
) {
    let cfg = &ctx.cfg;
    let keys = ctx.keys();
    let group_max = cfg.publish_group.max(1);
    let cap = cfg.max_cached_per_topic.max(1) as u64;
    let client_args = script::ClientArgs {
        mailbox_ttl_ms: u64::try_from(cfg.mailbox_ttl.as_millis()).unwrap_or(u64::MAX),
        alive_ms: u64::try_from(cfg.node_alive.as_millis()).unwrap_or(u64::MAX),
        mixed: cfg.layouts.redis_mixed(),
    };
    let mut group: Vec<PublishArgs<'c>> = Vec::with_capacity(group_max);
    let mut group_slot = None;
    let flush = |group: &mut Vec<PublishArgs<'_>>, buf: &mut Vec<u8>, slots: &mut Vec<Slot>| {
        if !group.is_empty() {
            script::pack_publish_group(buf, shas, cap, keys, replid, client_args, group);
            slots.push(Slot {
                n: group.len(),
                group: true,
            });
            group.clear();
        }
    };
    for c in batch {
        if let Command::Publish { req, .. } = c {
            let body = &req.body;
            ctx.arrivals.note(req.origin, body.irn(), body.arrived());
            if keys.tagged {
                let slot = topic_slot(req.topic.as_bytes());
                if group_slot != Some(slot) {
                    flush(&mut group, buf, slots);
                    group_slot = Some(slot);
                }
            }
            group.push(PublishArgs {
                ns: req.ns,
                topic: req.topic.as_bytes(),
                body: &req.body,
                // 1 ms to 2^40 ms (35 years): exact in Lua's doubles.
                ttl_ms: u64::try_from(req.ttl.as_millis())
                    .unwrap_or(u64::MAX)
                    .clamp(1, 1 << 40),
                origin: req.origin,
                prompt: req.prompt,
                publisher: req.publisher.as_deref().map_or(&b""[..], str::as_bytes),
            });
            if group.len() >= group_max {
                flush(&mut group, buf, slots);
            }
            continue;
        }
        flush(&mut group, buf, slots);
        group_slot = None;
        pack_one(ctx, shas, keys, c, buf);
        slots.push(Slot { n: 1, group: false });
    }
    flush(&mut group, buf, slots);
}

/// Packs one command that is not a publish.
fn pack_one(ctx: &ShardCtx, shas: &Shas, keys: Keys, c: &Command, buf: &mut Vec<u8>) {
    let cfg = &ctx.cfg;
    match c {
        Command::Publish { .. } => {}
        Command::Read {
            ns,
            topic,
            epoch,
            after,
            client,
            ..
        } => script::pack_read(
            buf,
            shas,
            keys,
            *ns,
            topic.as_bytes(),
            script::ReadArgs {
                epoch: *epoch,
                after: *after,
                max_bytes: cfg.read_max_bytes as u64,
                max_count: cfg.read_max_count.max(1) as u64,
            },
            client.as_deref(),
        ),
        Command::WebhookAdd { topic, url, .. } => {
            let per_counter = match keys.tagged {
                true => script::webhooks_per_slot(ctx.webhooks_per_shard),
                false => ctx.webhooks_per_shard,
            };
            script::pack_webhook_add(
                buf,
                shas,
                keys,
                topic.as_bytes(),
                url.as_bytes(),
                cfg.max_webhooks_per_topic as u64,
                per_counter,
            )
        }
        Command::WebhookRemove { topic, url } => {
            script::pack_webhook_remove(buf, shas, keys, topic.as_bytes(), url.as_bytes())
        }
        Command::V1Publish { req, .. } => {
            let lim = v1::PubLimits {
                pending_ttl: cfg.v1_pending_ttl,
                cap: cfg.max_cached_per_topic as u64,
                alive: cfg.node_alive,
                keys,
            };
            v1::pack_pub(buf, &shas.0[script::V1_PUB_IDX], req, &lim)
        }
        Command::V1Sub {
            worker,
            ticket,
            topic,
            count,
        } => v1::pack_sub(
            buf,
            &shas.0[script::V1_SUB_IDX],
            keys.tagged,
            topic.as_bytes(),
            &v1::field(ctx.node, *worker),
            *count,
            ticket.is_some(),
        ),
        Command::Client {
            worker,
            topic,
            client,
            project,
            op,
        } => clients::pack_client(
            buf,
            &shas.0[script::CLIENTS_IDX],
            &client_limits(ctx, keys),
            clients::ClientCall {
                worker: *worker,
                topic: topic.as_bytes(),
                client,
                project,
                op,
            },
        ),
        Command::Mailbox {
            client, topic, op, ..
        } => clients::pack_mailbox(
            buf,
            &shas.0[script::MAILBOX_IDX],
            &client_limits(ctx, keys),
            client,
            topic,
            *op,
            cfg.max_mailbox_topics,
        ),
        Command::Alive => v1::pack_alive(buf, ctx.node),
        Command::AliveIn(slot) => v1::pack_alive_in(buf, ctx.node, *slot),
        Command::Role => {
            script::Packer::new(buf).cmd(1).arg(b"ROLE");
        }
        Command::Ring => {
            script::Packer::new(buf)
                .cmd(2)
                .arg(b"GET")
                .arg(script::RING_KEY);
        }
    }
}
