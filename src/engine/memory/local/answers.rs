//! Answers of the home side that may wait for the disk (`--fsync always`): a publish or a
//! webhook registration is answered at once, or once the journal reports its record synced.

use std::sync::Arc;

use super::{HomeStored, LocalEngine};
use crate::engine::memory::home::{WebhookAdded, WebhookRemoved};
use crate::engine::memory::journal::{Held, Journal};
use crate::engine::RelayError;
use crate::engine::{Event, Events, Ticket};

impl LocalEngine {
    /// Answers a publish of worker `core` (this one included), now or once its record is
    /// synced.
    pub(super) fn answer_publish(
        &mut self,
        core: u16,
        ticket: Ticket,
        done: HomeStored,
        out: &mut Events,
    ) {
        match (done, self.journal.as_mut()) {
            (HomeStored::AfterSync(stored, lsn), Some(j)) => {
                j.hold(lsn, core, ticket, Held::Published(stored))
            }
            (HomeStored::AfterSync(stored, _), None) => {
                let result = Ok(stored);
                self.report(core, Event::Published { ticket, result }, out)
            }
            (HomeStored::Now(result), _) => {
                self.report(core, Event::Published { ticket, result }, out)
            }
        }
    }

    /// Home side of a webhook registration: answered now, or once its record is synced.
    pub(super) fn register_here(
        &mut self,
        topic: &Arc<str>,
        url: Arc<str>,
        core: u16,
        ticket: Ticket,
        out: &mut Events,
    ) {
        if self.journal.as_ref().is_some_and(Journal::refuses) {
            let result = Err(RelayError::StorageUnavailable);
            return self.report(core, Event::WebhookAdded { ticket, result }, out);
        }
        let added = self.home.add_webhook(topic, url.clone());
        if let (Ok(WebhookAdded::New), Some(j)) = (&added, self.journal.as_mut()) {
            if let Some(a) = j.webhook_add(topic, &url) {
                self.home.set_webhook_record(topic, &url, a.loc);
                if j.answers_after_sync() {
                    return j.hold(a.lsn, core, ticket, Held::WebhookAdded);
                }
            }
        }
        let result = added.map(|_| ());
        self.report(core, Event::WebhookAdded { ticket, result }, out);
    }

    /// Home side of forgetting a webhook (and its record).
    pub(super) fn unregister_here(&mut self, topic: &Arc<str>, url: &Arc<str>) {
        if let (WebhookRemoved::Recorded(record), Some(j)) =
            (self.home.remove_webhook(topic, url), self.journal.as_mut())
        {
            j.webhook_remove(topic, url, record);
        }
    }

    /// Sends the answers the journal settled.
    pub(super) fn send_settled(&mut self, out: &mut Events) {
        for st in std::mem::take(&mut self.settled) {
            let ticket = st.ticket;
            let failed = RelayError::StorageUnavailable;
            let ev = match (st.what, st.ok) {
                (Held::Published(stored), true) => Event::Published {
                    ticket,
                    result: Ok(stored),
                },
                (Held::Published(_), false) => Event::Published {
                    ticket,
                    result: Err(failed),
                },
                (Held::WebhookAdded, ok) => Event::WebhookAdded {
                    ticket,
                    result: if ok { Ok(()) } else { Err(failed) },
                },
            };
            self.report(st.core, ev, out);
        }
    }
}
