//! Turning Redis replies into the events a worker gets, one per command.
//!
//! Owns: the mapping from a command and its reply (or its failure) to an [`Event`] (the
//! relay's own, or a [`Followup`] for the engine) and the unavailable counters. Must not
//! touch connections: the shard thread reads, this answers.

use redis::Value;

use super::command::{Command, ShardCtx};
use super::script;
use super::types::{Followup, PublishOutcome, Unavailable, WebhookAdd};
use crate::event::{Event, RelayError};

/// One script call of a round: how many commands it answers, and whether it is a publish
/// group (its reply then holds one reply per message).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slot {
    /// Commands answered by this call's reply.
    pub n: usize,
    /// A publish group.
    pub group: bool,
}

/// Answers the commands of one script call with its reply.
pub(crate) fn answer_slot(
    ctx: &ShardCtx,
    cmds: impl Iterator<Item = Command>,
    slot: Slot,
    v: Value,
) {
    if !slot.group {
        cmds.for_each(|c| answer(ctx, c, v.clone()));
        return;
    }
    match v {
        Value::Array(_) => match script::decode_publish_group(v, slot.n) {
            Ok(outcomes) => cmds.zip(outcomes).for_each(|(c, o)| {
                ctx.stats.commands.inc();
                published(ctx, c, Ok(o));
            }),
            Err(e) => {
                log::error!(shard = ctx.idx, addr:% = ctx.addr; "redis shard {}: {e}", ctx.addr);
                cmds.for_each(|c| unavailable(ctx, c));
            }
        },
        Value::ServerError(e) => {
            log::warn!(shard = ctx.idx, addr:% = ctx.addr;
                "redis shard {}: {} {}",
                ctx.addr,
                e.code(),
                e.details().unwrap_or("")
            );
            cmds.for_each(|c| unavailable(ctx, c));
        }
        _ => {
            log::error!(shard = ctx.idx, addr:% = ctx.addr;
                "redis shard {}: a publish group reply of the wrong shape",
                ctx.addr
            );
            cmds.for_each(|c| unavailable(ctx, c));
        }
    }
}

/// Answers a command with its reply (a server error or a reply of the wrong shape answers
/// `Unavailable`).
fn answer(ctx: &ShardCtx, c: Command, v: Value) {
    if let (Command::Alive, Value::ServerError(e)) = (&c, &v) {
        log::warn!(
            shard = ctx.idx, addr:% = ctx.addr;
            "redis shard {}: liveness refresh: {e:?}", ctx.addr
        );
    }
    if let Command::Ring = c {
        return ring_seen(ctx, v);
    }
    if let Command::Alive | Command::Role | Command::AliveIn(_) = c {
        return;
    }
    ctx.stats.commands.inc();
    if let Value::ServerError(e) = &v {
        log::warn!(shard = ctx.idx, addr:% = ctx.addr;
            "redis shard {}: {} {}",
            ctx.addr,
            e.code(),
            e.details().unwrap_or("")
        );
        return unavailable(ctx, c);
    }
    let ev = match c {
        Command::Publish { .. } => {
            // (Publishes go in groups: a lone one is a group of one.)
            let result = script::decode_publish_group(v, 1)
                .map_err(|e| bad(ctx, e))
                .and_then(|mut o| o.pop().ok_or(Unavailable));
            return published(ctx, c, result);
        }
        Command::Read {
            worker,
            ticket,
            client,
            ..
        } => {
            let result = script::decode_read(v, client.is_some()).map_err(|e| bad(ctx, e));
            (worker, Event::Engine(Followup::Page { ticket, result }))
        }
        Command::WebhookAdd { worker, ticket, .. } => {
            let result = match script::decode_webhook_add(&v) {
                Ok(WebhookAdd::Added | WebhookAdd::Exists) => Ok(()),
                Ok(WebhookAdd::TopicFull) => Err(RelayError::TooManyWebhooksForTopic),
                Ok(WebhookAdd::GlobalFull) => Err(RelayError::TooManyWebhooks),
                Err(e) => {
                    bad(ctx, e);
                    ctx.stats.unavailable.inc();
                    return webhook_unavailable(ctx, worker, ticket);
                }
            };
            (worker, Event::WebhookAdded { ticket, result })
        }
        Command::V1Publish { worker, req } => {
            let result = super::v1::decode_pub(v).map_err(|e| bad(ctx, e));
            let topic = req.topic;
            (
                worker,
                Event::Engine(Followup::V1Published { topic, result }),
            )
        }
        Command::V1Sub {
            worker,
            ticket: Some(ticket),
            ..
        } => {
            let result = super::v1::decode_sub(v).map_err(|e| bad(ctx, e));
            (worker, Event::Engine(Followup::V1Taken { ticket, result }))
        }
        Command::Mailbox {
            worker,
            client,
            topic,
            op: super::clients::MailboxCmd::Add,
        } => match super::clients::decode_mailbox(&v) {
            Ok(Some(kept)) => (
                worker,
                Event::Engine(Followup::MailboxFull {
                    topic,
                    client,
                    kept,
                }),
            ),
            Ok(None) => return,
            Err(e) => {
                bad(ctx, e);
                return;
            }
        },
        Command::Client { .. } | Command::Mailbox { .. } => return,
        Command::WebhookRemove { .. }
        | Command::V1Sub { .. }
        | Command::Alive
        | Command::Role
        | Command::AliveIn(_)
        | Command::Ring => return,
    };
    if let Event::Engine(
        Followup::Page { result: Err(_), .. }
        | Followup::V1Published { result: Err(_), .. }
        | Followup::V1Taken { result: Err(_), .. },
    ) = ev.1
    {
        ctx.stats.unavailable.inc();
    }
    (ctx.events)(ev.0, ev.1);
}

/// The shard's fingerprint as the heartbeat read it: the layout its cluster writes (moved
/// by `walletrelay layout switch`), or why it keeps this node out (`/health` fails).
fn ring_seen(ctx: &ShardCtx, v: Value) {
    let Value::BulkString(b) = v else {
        // Nil: the shard lost its data (the next connect offers the fingerprint again);
        // an error: the connection's own failure path reports it.
        return;
    };
    let theirs = String::from_utf8_lossy(&b).into_owned();
    let before = ctx.cfg.layouts.redis_writes();
    let problem = match super::setup::check_ring(ctx, theirs) {
        Ok(v) => {
            let now = ctx.cfg.layouts.redis_writes();
            if now != before {
                log::info!(shard = ctx.idx, addr:% = ctx.addr, layout = v;
                    "redis shard {}: the cluster writes data layout {v} now", ctx.addr);
            }
            None
        }
        Err(e) => Some(e.to_string()),
    };
    let slot = &ctx.health.ring;
    let mut cur = slot.lock().unwrap_or_else(|e| e.into_inner());
    if *cur != problem {
        if let Some(p) = &problem {
            log::error!(shard = ctx.idx, addr:% = ctx.addr; "redis shard {}: {p}", ctx.addr);
        }
        *cur = problem;
    }
}

/// Answers a publish with its outcome.
fn published(ctx: &ShardCtx, c: Command, result: Result<PublishOutcome, Unavailable>) {
    let Command::Publish { worker, ticket, .. } = c else {
        return unavailable(ctx, c);
    };
    if result.is_err() {
        ctx.stats.unavailable.inc();
    }
    (ctx.events)(
        worker,
        Event::Engine(Followup::Published { ticket, result }),
    );
}

/// Answers a webhook registration `StorageUnavailable`, counted as the worker's answer too
/// (the engine passes `WebhookAdded` on as it is).
fn webhook_unavailable(ctx: &ShardCtx, worker: usize, ticket: u64) {
    ctx.stats.unavailable_answers.inc();
    let result = Err(RelayError::StorageUnavailable);
    (ctx.events)(worker, Event::WebhookAdded { ticket, result });
}

fn bad(ctx: &ShardCtx, e: script::BadReply) -> Unavailable {
    log::error!(shard = ctx.idx, addr:% = ctx.addr; "redis shard {}: {e}", ctx.addr);
    Unavailable
}

/// Answers a command `Unavailable`.
pub(crate) fn unavailable(ctx: &ShardCtx, c: Command) {
    if let Command::Alive | Command::Role | Command::AliveIn(_) | Command::Ring = c {
        return;
    }
    ctx.stats.unavailable.inc();
    let (worker, ev) = match c {
        Command::Publish { worker, ticket, .. } => (
            worker,
            Followup::Published {
                ticket,
                result: Err(Unavailable),
            },
        ),
        Command::Read { worker, ticket, .. } => (
            worker,
            Followup::Page {
                ticket,
                result: Err(Unavailable),
            },
        ),
        Command::WebhookAdd { worker, ticket, .. } => {
            return webhook_unavailable(ctx, worker, ticket)
        }
        Command::V1Publish { worker, req } => (
            worker,
            Followup::V1Published {
                topic: req.topic,
                result: Err(Unavailable),
            },
        ),
        Command::V1Sub {
            worker,
            ticket: Some(ticket),
            ..
        } => (
            worker,
            Followup::V1Taken {
                ticket,
                result: Err(Unavailable),
            },
        ),
        Command::Client {
            worker,
            topic,
            client,
            op,
            ..
        } if op.sockets().is_some() => (worker, Followup::ClientUnsent { topic, client }),
        Command::Client { .. } | Command::Mailbox { .. } => return,
        Command::WebhookRemove { .. }
        | Command::V1Sub { .. }
        | Command::Alive
        | Command::Role
        | Command::AliveIn(_)
        | Command::Ring => return,
    };
    (ctx.events)(worker, Event::Engine(ev));
}
