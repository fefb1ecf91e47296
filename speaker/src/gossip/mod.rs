//! SWIM gossip membership on foca 2: who is alive, and what each member says about itself.
//!
//! - [`core`]: the sans-IO state machine ([`Core`]): foca, timers, join, renewal, metadata,
//!   envelope, metrics.
//! - [`driver`]: the tokio task around a core and a UDP socket ([`spawn`], [`GossipHandle`]).
//! - `simnet`: a deterministic simulated network of cores (tests, `swimlb-lab sim`); compiled
//!   only for tests and with the crate feature `simnet`, never into the daemon.
//! - [`replay`]: replay protection: the sender id a speaker seals under and the receiver's
//!   per-sender window ([`replay::ReplayGuard`]).
//! - [`lifeguard`]: local health and the suspicion that shrinks with confirmations.
//! - [`sync`]: the membership digest peers compare to find members the gossip never brought.
//! - [`timing`]: the `fast` and `lan` profiles and their validation.
//! - [`wire_rule`]: which envelope version each datagram is sealed in (the wire-compatibility
//!   rule across releases) and the receiver it is bound to.
//! - [`identity`], [`metadata`], [`metrics`]: the identity, the metadata records, the metrics.
//!
//! The module's output is a [`LiveSet`](crate::model::membership::LiveSet) (alive members with their
//! metadata) and a stream of [`LiveChange`](crate::model::membership::LiveChange)s.

pub mod core;
pub mod driver;
pub mod identity;
pub mod lifeguard;
pub mod metadata;
pub mod metrics;
pub mod replay;
#[cfg(any(test, feature = "simnet"))]
pub mod simnet;
pub mod sync;
pub mod timing;
pub mod wire_rule;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod udp_tests;
#[cfg(test)]
mod wire_udp_tests;
#[cfg(test)]
mod wire_watch_tests;

pub use self::core::{Core, GossipError, GossipSettings, Outgoing, Phase, WatchRelayed};
pub use driver::{Directory, GossipHandle, WatchLink, spawn};
pub use identity::NodeIdentity;
pub use metrics::{Direction, GossipMetrics, RejectReason, SuspicionOutcome};
pub use timing::{Profile, Timing, TimingError};
pub use wire_rule::WireRule;
