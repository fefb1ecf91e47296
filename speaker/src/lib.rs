//! swimlb speaker: membership, election and announcements for virtual IPs.
//!
//! - [`gossip`]: SWIM membership over sealed UDP ([`gossip::Core`], [`gossip::spawn`]).
//! - [`membership`]: the gossiped facts every speaker decides from ([`membership::LiveSet`]).

pub mod gossip;
pub mod membership;
