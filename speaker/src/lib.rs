//! swimlb speaker: membership, election and announcements for virtual IPs.
//!
//! - [`checks`]: health checks (http, https, tcp, exec) with rise/fall hysteresis.
//! - [`config_report`]: what `check-config` prints.
//! - [`membership`]: the gossiped facts every speaker decides from ([`membership::LiveSet`]).
//! - [`packet_socket`]: the filtered AF_PACKET channel (the only `unsafe` code).

pub mod checks;
pub mod config_report;
pub mod membership;
pub mod packet_socket;
