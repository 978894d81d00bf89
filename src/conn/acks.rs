//! Pushes to a watched client id that wait for their acknowledgement (DECISIONS 13: a
//! socket's `delivered` event is sent when the SDK's `{"id":<push id>,"result":true}`
//! arrives). Kept per connection only for clients some watch may follow, at most
//! [`MAX_UNACKED`]: past it the oldest is forgotten (its `delivered` event is not sent).

use std::collections::VecDeque;
use std::sync::Arc;

use crate::message::Body;

/// Most pushes a connection remembers until acknowledged.
pub const MAX_UNACKED: usize = 64;

/// The pushes of one connection waiting for an acknowledgement, oldest first.
#[derive(Debug, Default)]
pub struct Unacked(VecDeque<(u64, Arc<str>, Body)>);

impl Unacked {
    /// Remembers push `id` of `body` on `topic`.
    pub fn note(&mut self, id: u64, topic: &Arc<str>, body: &Body) {
        if self.0.len() >= MAX_UNACKED {
            self.0.pop_front();
        }
        self.0.push_back((id, topic.clone(), body.clone()));
    }

    /// The push `id` was acknowledged: its topic and body, if it was remembered.
    pub fn take(&mut self, id: u64) -> Option<(Arc<str>, Body)> {
        let i = self.0.iter().position(|(p, ..)| *p == id)?;
        self.0.remove(i).map(|(_, t, b)| (t, b))
    }

    /// How many wait.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// None waits.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acknowledged_pushes_are_taken_once_and_the_list_is_bounded() {
        let mut u = Unacked::default();
        let t: Arc<str> = Arc::from("t");
        let b = Body::encode("t", "m", crate::message::Meta::default());
        for id in 0..(MAX_UNACKED as u64 + 3) {
            u.note(id, &t, &b);
        }
        assert_eq!(u.len(), MAX_UNACKED);
        assert!(u.take(0).is_none(), "forgotten for room");
        assert!(u.take(5).is_some());
        assert!(u.take(5).is_none(), "once");
    }
}
