//! swimlb speaker: membership, election and announcements for virtual IPs.
//!
//! - [`membership`]: the gossiped facts every speaker decides from ([`membership::LiveSet`]).

pub mod membership;
