//! The decisions, pure: inputs with `now` in, actions out. Nothing here opens a socket, reads
//! a link or the clock.
//!
//! - [`snapshot`]: what should be served ([`snapshot::Snapshot`]).
//! - [`membership`]: the gossiped facts every speaker decides from ([`membership::LiveSet`]).
//! - [`local`]: the record this node gossips about itself.
//! - [`links`]: links and routes as facts, and which link announces an IP.
//! - [`election`]: who owns each IP ([`election::Election`]).
//! - [`announcer`]: when to start, stop and announce ([`announcer::Announcer`]).
//! - [`engine`]: the speaker's decisions tied together.
//! - [`watch_knobs`]: the owner watch's interval and misses.

pub mod announcer;
pub mod election;
pub mod engine;
pub mod links;
pub mod local;
pub mod membership;
pub mod snapshot;
pub mod watch_knobs;
