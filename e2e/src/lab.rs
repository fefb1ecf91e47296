//! What every scenario of the lab shares, below all of them: the speakers' ports and HTTP
//! endpoints, the daemons' views of the VIP, MetalLB's election rule, the client's announcement watcher, and what a
//! daemon spends. Imports no scenario.

pub mod announcements;
pub mod http;
pub mod rule;
pub mod usage;
pub mod views;

pub use announcements::{Announcement, AnnouncementWatcher};
pub use http::{GOSSIP_PORT, HTTP_PORT, http_addrs, http_get, read_each};
pub use usage::{proc_running, proc_usage};
pub use views::{MetallbView, SpeakerView, Views, VrrpState};
