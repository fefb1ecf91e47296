//! swimlb speaker: membership, election and announcements for virtual IPs.
//!
//! - [`config_report`]: what `check-config` prints.
//! - [`membership`]: the gossiped facts every speaker decides from ([`membership::LiveSet`]).

pub mod config_report;
pub mod membership;
