//! swimlb speaker: membership, election and announcements for virtual IPs.
//!
//! - [`addresses`]: standalone mode: VIPs on a dummy interface, ARP sysctls on announcing ones.
//! - [`config_report`]: what `check-config` prints.
//! - [`interfaces`]: which interface announces an IP; link and route change notifications.
//! - [`membership`]: the gossiped facts every speaker decides from ([`membership::LiveSet`]).

pub mod addresses;
pub mod config_report;
pub mod interfaces;
pub mod membership;
