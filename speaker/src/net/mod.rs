//! The network I/O of a speaker.
//!
//! - [`netlink`]: links and routes read from the kernel, and their change notifications.
//! - [`addresses`]: standalone mode: the VIPs on a holder link, ARP sysctls on announcing ones.
//! - [`packet_socket`]: the filtered AF_PACKET channel (`unsafe`: libc calls).
//! - [`responder`]: `decide` (pure) and the per-interface thread that answers ARP and NS.
//! - [`answering`]: the responder threads of the links this node answers on.

pub mod addresses;
pub mod answering;
pub mod netlink;
pub mod packet_socket;
pub mod responder;
