//! Start-up of client-id subscriptions (DECISIONS 13): their `ClientSub` records and
//! `ClientEnd` tombstones read back in log order, the latest record of each (topic, client)
//! restored unless a tombstone after it ended it or its mailbox expired meanwhile.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Cancels, Journal};
use crate::engine::clients::{ClientRef, ClientSub};
use crate::engine::memory::home::HomeTopics;
use crate::message::Position;
use crate::store::entry::Entry;
use crate::store::Loc;

/// A client subscription change read back, in log order.
pub(super) enum ClientFound {
    /// Its state (`expires` in wall-clock ms).
    Sub(Arc<str>, ClientSub, Loc),
    /// Its end.
    End(Arc<str>, Arc<str>, Loc),
}

/// The change `entry` records, if it is one of a client subscription.
pub(super) fn found(entry: &Entry<'_>, loc: Loc) -> Option<ClientFound> {
    match *entry {
        Entry::ClientSub {
            topic,
            client,
            project,
            epoch,
            seq,
            expires_unix_ms,
            received,
        } => {
            let mut sub = ClientSub::new(ClientRef {
                id: Arc::from(client),
                project: Arc::from(project),
            });
            sub.delivered = Position { epoch, seq };
            sub.expires = expires_unix_ms;
            sub.received = received
                .chunks_exact(8)
                .filter_map(|b| Some(u64::from_le_bytes(b.try_into().ok()?)))
                .collect();
            Some(ClientFound::Sub(Arc::from(topic), sub, loc))
        }
        Entry::ClientEnd { topic, client } => {
            Some(ClientFound::End(Arc::from(topic), Arc::from(client), loc))
        }
        _ => None,
    }
}

/// Replays one worker's client subscription changes; `keep`: their records stay where
/// they are. Returns how many subscriptions were restored.
pub(super) fn restore_clients(
    home: &mut HomeTopics,
    journal: &mut Journal,
    ops: Vec<ClientFound>,
    keep: bool,
) -> usize {
    let unix_now = crate::clock::unix_ms();
    let now = crate::clock::now_ms();
    let mut live: HashMap<(Arc<str>, Arc<str>), (ClientSub, Loc)> = HashMap::new();
    for op in ops {
        match op {
            ClientFound::Sub(topic, sub, loc) => {
                live.insert((topic, sub.client.id.clone()), (sub, loc));
            }
            ClientFound::End(topic, client, loc) => {
                let cancels = live.remove(&(topic.clone(), client.clone()));
                // The tombstone stays live while the record it cancels is on disk.
                if let (true, Some((_, c))) = (keep, cancels) {
                    journal.restore_tombstone(Cancels::Client { topic, client }, loc, c.segment);
                }
            }
        }
    }
    let mut n = 0;
    for ((topic, _), (mut sub, loc)) in live {
        if sub.expires <= unix_now {
            continue;
        }
        sub.expires = now + (sub.expires - unix_now);
        sub.record = keep.then_some(loc);
        if keep {
            journal.log_mut().keep(loc);
        }
        home.restore_client(&topic, sub, now);
        n += 1;
    }
    n
}
