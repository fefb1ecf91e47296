//! swimlb speaker: membership, election and announcements for virtual IPs.
//!
//! - [`addresses`]: standalone mode: VIPs on a dummy interface, ARP sysctls on announcing ones.
//! - [`announcer`]: when to start, stop and announce ([`announcer::Announcer`]), sans-IO.
//! - [`checks`]: health checks (http, https, tcp, exec) with rise/fall hysteresis.
//! - [`cli`]: the command line (`check-config`, `keygen`, `standalone`).
//! - [`config_report`]: what `check-config` prints.
//! - [`election`]: who owns each IP ([`election::Election`]), pure.
//! - [`gossip`]: SWIM membership over sealed UDP ([`gossip::Core`], [`gossip::spawn`]).
//! - [`http`]: `/metrics`, `/healthz`, `/readyz`, `/status`.
//! - [`interfaces`]: which interface announces an IP; link and route change notifications.
//! - [`local`]: the metadata this node gossips about itself.
//! - [`membership`]: the gossiped facts every speaker decides from ([`membership::LiveSet`]).
//! - [`notify`]: notify hooks run on group state changes.
//! - [`packet_socket`]: the filtered AF_PACKET channel (the only `unsafe` code).
//! - [`responder`]: `decide` and the per-interface thread that answers ARP and NS.
//! - [`snapshot`]: what should be served ([`snapshot::Snapshot`]).
//! - [`standalone`]: the standalone daemon: one task wiring every part together.

pub mod addresses;
pub mod announcer;
pub mod checks;
pub mod cli;
pub mod config_report;
pub mod election;
pub mod gossip;
pub mod http;
pub mod interfaces;
pub mod local;
pub mod membership;
pub mod notify;
pub mod packet_socket;
pub mod responder;
pub mod snapshot;
pub mod standalone;
