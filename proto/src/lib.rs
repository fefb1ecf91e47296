//! swimlb's wire formats, with no I/O.
//!
//! Each module owns one format: a typed `Repr` with `parse`, `buffer_len` and `emit`, in the
//! manner of smoltcp's `wire` module. Parsing never panics and never allocates; every rejection
//! is an [`Error`] with a stable label for counting.
//!
//! - [`frame`]: [`Frame::parse`], the one entry point for received frames; dispatches by
//!   EtherType and protocol to the modules below.
//! - [`ethernet`]: the Ethernet II header, EtherTypes, MAC addresses.
//! - [`arp`]: ARP requests, replies and gratuitous ARP (RFC 826, RFC 5227).
//! - [`ip`]: the IPv4 and IPv6 headers that carry neighbor discovery and VRRP.
//! - [`ndp`]: IPv6 neighbor solicitations and advertisements (RFC 4861), solicited-node
//!   multicast.
//! - [`vrrp`]: VRRPv3 advertisements over IPv4 and IPv6 (RFC 9568), virtual router MACs.
//! - [`checksum`]: the internet checksum and the IPv4 / IPv6 pseudo-headers.
//! - [`envelope`]: the AES-256-GCM gossip envelope and its [`KeyRing`].
//! - `golden` (hidden): byte vectors from independent implementations, for tests, benchmarks and
//!   fuzz seeds.

pub mod arp;
pub mod checksum;
pub mod envelope;
mod error;
pub mod ethernet;
pub mod frame;
#[doc(hidden)]
pub mod golden;
pub mod ip;
pub mod ndp;
pub mod vrrp;

pub use envelope::{KeyId, KeyRing};
pub use error::{Error, Result};
pub use frame::Frame;
