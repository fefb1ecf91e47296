//! swimlb speaker: membership, election and announcements for virtual IPs.
//!
//! - [`addresses`]: standalone mode: VIPs on a dummy interface, ARP sysctls on announcing ones.
//! - [`announcer`]: when to start, stop and announce ([`announcer::Announcer`]), sans-IO.
//! - [`answering`]: the responder threads of the links this node answers on.
//! - [`checks`]: health checks (http, https, tcp, exec) with rise/fall hysteresis.
//! - [`cli`]: the command line (`check-config`, `keygen`, `standalone`, `status`).
//! - [`config_report`]: what `check-config` prints.
//! - [`daemon`]: the drivers around the engine, shared by every mode.
//! - [`election`]: who owns each IP ([`election::Election`]), pure.
//! - [`engine`]: the speaker's decisions, sans-IO: inputs with `now` in, actions out.
//! - [`fuzzing`]: the fuzz targets' entry points (a configuration file's bytes, Kubernetes objects
//!   as JSON), pure; a stable test replays their seeds.
//! - [`gossip`]: SWIM membership over sealed UDP ([`gossip::Core`], [`gossip::spawn`]).
//! - [`http`]: `/metrics`, `/healthz`, `/readyz`, `/status`.
//! - [`interfaces`]: which interface announces an IP; link and route change notifications.
//! - [`kubernetes`]: the Kubernetes source: the reflector caches to a [`snapshot::Snapshot`],
//!   records written back.
//! - [`local`]: the metadata this node gossips about itself.
//! - [`membership`]: the gossiped facts every speaker decides from ([`membership::LiveSet`]).
//! - [`memory`]: fewer malloc arenas and free pages handed back (`unsafe`: libc calls).
//! - [`notify`]: notify hooks run on group state changes.
//! - [`owner_watch`]: the owner watch, sans-IO: heartbeat [`owner_watch::Schedule`], silence
//!   [`owner_watch::Detector`], the protocol [`owner_watch::WatchCore`] and the accusations
//!   ([`owner_watch::accusations`]); its socket thread is [`owner_watch::service`].
//! - [`packet_socket`]: the filtered AF_PACKET channel (`unsafe`, as [`memory`]).
//! - [`process_metrics`]: `swimlb_build_info` and `swimlb_ready`.
//! - [`responder`]: `decide` and the per-interface thread that answers ARP and NS.
//! - [`snapshot`]: what should be served ([`snapshot::Snapshot`]).
//! - [`standalone`]: the standalone source: the file, checks, notify hooks, reload, the VIPs on
//!   a dummy link.
//! - [`status`]: `/status` and the owner gauges, from the engine's deltas.
//! - [`status_table`]: `swimlb-speaker status`: a running speaker's `/status` as tables.

pub mod addresses;
pub mod announcer;
pub mod answering;
pub mod checks;
pub mod cli;
pub mod config_report;
pub mod daemon;
mod driver;
pub mod election;
pub mod engine;
pub mod fuzzing;
pub mod gossip;
pub mod http;
pub mod interfaces;
pub mod kubernetes;
pub mod local;
pub mod membership;
pub mod memory;
pub mod notify;
pub mod owner_watch;
pub mod packet_socket;
pub mod process_metrics;
pub mod responder;
pub mod snapshot;
pub mod standalone;
pub mod status;
pub mod status_table;
