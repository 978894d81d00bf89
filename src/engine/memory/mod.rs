//! The in-memory engine and its durable log: a topic's state lives on one worker, its *home*
//! (the topic's hash picks it: [`placement`], [`slots`]), in memory ([`cache`], [`home`]);
//! every other worker reaches it through its own [`local::LocalEngine`] and the home's
//! queue. With a data directory (the default) every stored message is also written to the
//! [`journal`] before it is acknowledged, and recovered from it at start.

pub mod cache;
pub mod home;
pub mod journal;
pub mod local;
pub mod placement;
pub mod slots;
