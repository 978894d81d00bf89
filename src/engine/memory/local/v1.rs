//! The home side of WalletConnect 1.0 frames (DECISIONS §8): a `pub` goes live to the
//! workers with other v1 subscribers or is kept pending (and recorded); a `sub` takes the
//! pending frames (their records cancelled).

use std::sync::Arc;

use super::LocalEngine;
use crate::engine::{Event, Events, V1Publish};
use crate::webhook::Delivery as WebhookCall;

impl LocalEngine {
    /// Home side of a v1 `pub`: live to the workers with other v1 subscribers, else kept
    /// pending (and recorded); webhooks unless silent.
    pub(super) fn v1_publish_here(&mut self, req: V1Publish, out: &mut Events) {
        match self.home.v1_route(&req.topic, req.self_subscribed) {
            Some(cores) => {
                for c in cores {
                    let ev = Event::V1Live {
                        topic: req.topic.clone(),
                        frame: req.frame.clone(),
                        origin: req.origin,
                    };
                    self.report(c, ev, out);
                }
            }
            None => {
                let now = crate::clock::now_ms();
                let expires = now + u64::from(self.shared.limits.v1_pending_ttl) * 1000;
                let kept = self
                    .home
                    .v1_keep(&req.topic, req.frame.clone(), expires, req.origin);
                if let (Some((key, pos)), Some(j)) = (kept, self.journal.as_mut()) {
                    if let Some(a) =
                        j.message(true, &req.topic, pos, expires, !req.silent, &req.frame)
                    {
                        self.home.set_record(key, a.loc);
                    }
                }
            }
        }
        if !req.silent {
            if let Some(t) = self.home.find(&req.topic).and_then(|s| self.home.get(s)) {
                for w in &t.webhooks {
                    self.shared.webhooks.submit(WebhookCall {
                        topic: t.name.clone(),
                        url: w.url.clone(),
                    });
                }
            }
        }
    }

    /// Home side of a v1 `sub`: the pending frames, removed (their records cancelled).
    pub(super) fn v1_take_here(&mut self, topic: &Arc<str>) -> Vec<bytes::Bytes> {
        let taken = self.home.v1_take(topic);
        let mut frames = Vec::with_capacity(taken.len());
        for (frame, pos, record) in taken {
            if let (Some(r), Some(j)) = (record, self.journal.as_mut()) {
                j.frame_taken(topic, pos, r);
            }
            frames.push(frame);
        }
        frames
    }
}
