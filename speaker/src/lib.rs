//! swimlb speaker: membership, election and announcements for virtual IPs.
//!
//! - [`membership`]: the gossiped facts every speaker decides from ([`membership::LiveSet`]).
//! - [`snapshot`]: what should be served ([`snapshot::Snapshot`]).
//! - [`election`]: who owns each IP ([`election::Election`]), pure.
//! - [`announcer`]: when to start, stop and announce ([`announcer::Announcer`]), sans-IO.

pub mod announcer;
pub mod election;
pub mod membership;
pub mod snapshot;
