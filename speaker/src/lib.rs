//! swimlb speaker: membership, election and announcements for virtual IPs.
//!
//! The folders are the layers, each using only those above it:
//!
//! - [`model`]: the decisions, pure (no sockets, no netlink, no clock of its own): what is
//!   served, who owns each IP, when to announce, the engine that ties them together.
//! - [`gossip`]: SWIM membership; the sans-IO [`gossip::Core`] and its UDP driver.
//! - [`owner_watch`]: the owner watch; the sans-IO [`owner_watch::WatchCore`], the
//!   accusations, and its socket thread.
//! - [`net`]: the network I/O: links and routes from netlink, the VIPs' holder link, the
//!   AF_PACKET responders.
//! - [`serve`]: what serves humans: HTTP (`/metrics`, `/status`), the status board, the status
//!   table, `check-config`'s report, process metrics, memory settings.
//! - [`run`]: the daemon around the engine and the one driver loop both sources run.
//! - [`sources`]: the standalone file (with health checks and notify hooks) and the
//!   Kubernetes API.
//! - [`cli`]: the command line; [`fuzzing`]: the fuzz targets' entry points.

pub mod cli;
pub mod fuzzing;
pub mod gossip;
pub mod model;
pub mod net;
pub mod owner_watch;
pub mod run;
pub mod serve;
pub mod sources;
pub mod vrrp;
