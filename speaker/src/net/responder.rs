//! Answering ARP and neighbor solicitations for the IPs this node owns, per interface.
//!
//! [`decide`] is the pure heart: one received frame, the interface's MAC and the set of owned
//! addresses in; a reply to send, or a typed reason not to ([`Drop`]), out. It allocates nothing
//! and never panics. It answers:
//!
//! - ARP requests for an owned IPv4 address, broadcast or unicast to our MAC, including RFC 5227
//!   probes (sender IP `0.0.0.0`), with a reply from our MAC;
//! - neighbor solicitations for an owned IPv6 address, sent to its solicited-node group or
//!   unicast to our MAC, including duplicate address detection from `::` (answered to
//!   all-nodes), with a solicited advertisement, Override set.
//!
//! A reply, a gratuitous ARP or a neighbor advertisement from another MAC that claims an owned
//! address is a [`Drop::Conflict`]: the caller counts it and re-announces.
//!
//! [`Responder`] runs `decide` on its own thread per interface over a `pnet_datalink` channel
//! (the filtered socket of [`crate::net::packet_socket`] in production, `pnet_datalink::dummy` in
//! tests). The daemon controls it through a channel: the owned set, announcements, stop; each
//! command also writes an eventfd the thread polls beside its socket, so an idle responder
//! sleeps until a frame, a command or its [`IDLE_TURN`] (`responder/thread.rs`).

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use swimlb_proto::arp::{ArpOperation, ArpRepr};
use swimlb_proto::ethernet::{BROADCAST, MacAddr};
use swimlb_proto::ndp::{self, NdpFrame, NdpMessage};
use swimlb_proto::{Error as WireError, Frame};

/// The addresses one interface answers for. Sorted vectors: lookups are a binary search with no
/// hashing and no allocation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owned {
    v4: Vec<Ipv4Addr>,
    v6: Vec<Ipv6Addr>,
}

impl Owned {
    /// The set of `ips`.
    pub fn new(ips: impl IntoIterator<Item = IpAddr>) -> Owned {
        let mut owned = Owned::default();
        for ip in ips {
            match ip {
                IpAddr::V4(a) => owned.v4.push(a),
                IpAddr::V6(a) => owned.v6.push(a),
            }
        }
        owned.v4.sort_unstable();
        owned.v4.dedup();
        owned.v6.sort_unstable();
        owned.v6.dedup();
        owned
    }

    /// Whether `ip` is owned.
    pub fn contains_v4(&self, ip: Ipv4Addr) -> bool {
        self.v4.binary_search(&ip).is_ok()
    }

    /// Whether `ip` is owned.
    pub fn contains_v6(&self, ip: Ipv6Addr) -> bool {
        self.v6.binary_search(&ip).is_ok()
    }

    /// The owned IPv6 addresses.
    pub fn v6(&self) -> &[Ipv6Addr] {
        &self.v6
    }

    /// Whether nothing is owned.
    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }
}

/// What to send in answer to a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// An ARP reply.
    Arp(ArpRepr),
    /// A neighbor advertisement.
    Ndp(NdpFrame),
}

impl Reply {
    /// Writes the frame into `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        match self {
            Reply::Arp(arp) => {
                arp.emit_frame(buf)?;
                Ok(arp.frame_len())
            }
            Reply::Ndp(frame) => {
                frame.emit(buf)?;
                Ok(frame.frame_len())
            }
        }
    }
}

/// Why a frame got no reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drop {
    /// The frame breaks a rule of its protocol.
    Malformed(WireError),
    /// Neither ARP nor neighbor discovery (VRRP, or traffic the kernel filter let through).
    NotNeighborDiscovery,
    /// Sent by this interface.
    FromUs,
    /// Asks for an address this interface does not own.
    NotOwned,
    /// Unicast to a MAC that is not ours, or multicast to a group not the target's.
    NotForUs,
    /// A reply or advertisement that does not concern an owned address.
    NotARequest,
    /// Another MAC claims an owned address.
    Conflict {
        /// The address.
        ip: IpAddr,
        /// The other MAC.
        mac: MacAddr,
    },
}

impl Drop {
    /// A stable label for metrics and logs.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Drop::Malformed(_) => "malformed",
            Drop::NotNeighborDiscovery => "not_neighbor_discovery",
            Drop::FromUs => "from_us",
            Drop::NotOwned => "not_owned",
            Drop::NotForUs => "not_for_us",
            Drop::NotARequest => "not_a_request",
            Drop::Conflict { .. } => "conflict",
        }
    }
}

/// Decides what to answer to `frame`, received on the interface whose MAC is `our_mac`.
pub fn decide(frame: &[u8], our_mac: MacAddr, owned: &Owned) -> Result<Reply, Drop> {
    match Frame::parse(frame).map_err(Drop::Malformed)? {
        Frame::Arp { ethernet, arp } => {
            if ethernet.src == our_mac || arp.sender_mac == our_mac {
                return Err(Drop::FromUs);
            }
            match arp.operation {
                ArpOperation::Request
                    if arp.is_gratuitous() && owned.contains_v4(arp.target_ip) =>
                {
                    // Someone else announces our address.
                    Err(Drop::Conflict {
                        ip: IpAddr::V4(arp.target_ip),
                        mac: arp.sender_mac,
                    })
                }
                ArpOperation::Request => {
                    if !owned.contains_v4(arp.target_ip) {
                        return Err(Drop::NotOwned);
                    }
                    if ethernet.dst != BROADCAST && ethernet.dst != our_mac {
                        return Err(Drop::NotForUs);
                    }
                    arp.reply_to(our_mac)
                        .map(Reply::Arp)
                        .ok_or(Drop::NotARequest)
                }
                ArpOperation::Reply if owned.contains_v4(arp.sender_ip) => Err(Drop::Conflict {
                    ip: IpAddr::V4(arp.sender_ip),
                    mac: arp.sender_mac,
                }),
                ArpOperation::Reply => Err(Drop::NotARequest),
            }
        }
        Frame::Ndp(ndp_frame) => {
            if ndp_frame.ethernet.src == our_mac {
                return Err(Drop::FromUs);
            }
            match ndp_frame.ndp.message {
                NdpMessage::NeighborSolicit { target, .. } => {
                    if !owned.contains_v6(target) {
                        return Err(Drop::NotOwned);
                    }
                    let group = ndp::multicast_mac(ndp::solicited_node_multicast(target));
                    if ndp_frame.ethernet.dst != group && ndp_frame.ethernet.dst != our_mac {
                        return Err(Drop::NotForUs);
                    }
                    ndp_frame
                        .reply_to(our_mac)
                        .map(Reply::Ndp)
                        .ok_or(Drop::NotARequest)
                }
                NdpMessage::NeighborAdvert {
                    target,
                    target_link_addr,
                    ..
                } if owned.contains_v6(target) => {
                    let mac = target_link_addr.unwrap_or(ndp_frame.ethernet.src);
                    if mac == our_mac {
                        Err(Drop::FromUs)
                    } else {
                        Err(Drop::Conflict {
                            ip: IpAddr::V6(target),
                            mac,
                        })
                    }
                }
                NdpMessage::NeighborAdvert { .. } => Err(Drop::NotARequest),
            }
        }
        Frame::Vrrp(_) | Frame::Other { .. } => Err(Drop::NotNeighborDiscovery),
    }
}

/// The frames that announce `ip` from `mac`: one gratuitous ARP (request form) or one
/// unsolicited neighbor advertisement (Override set, to all-nodes). Returns the length written.
pub fn announcement(mac: MacAddr, ip: IpAddr, buf: &mut [u8]) -> Result<usize, WireError> {
    match ip {
        IpAddr::V4(v4) => Reply::Arp(ArpRepr::gratuitous_request(mac, v4)).emit(buf),
        IpAddr::V6(v6) => Reply::Ndp(NdpFrame::unsolicited_advert(mac, v6)).emit(buf),
    }
}

/// The frame that asks for `target`'s MAC from `mac`, sent from the first of `sources` of
/// `target`'s family: an ARP request (an ARP probe, from `0.0.0.0`, when there is no IPv4
/// source), or a neighbor solicitation (`None` without an IPv6 source: a solicitation from `::`
/// is duplicate address detection). Returns the length written.
pub fn solicitation(
    mac: MacAddr,
    sources: &[IpAddr],
    target: IpAddr,
    buf: &mut [u8],
) -> Option<Result<usize, WireError>> {
    let frame = match target {
        IpAddr::V4(target) => {
            let source = sources
                .iter()
                .find_map(|ip| match ip {
                    IpAddr::V4(v4) => Some(*v4),
                    IpAddr::V6(_) => None,
                })
                .unwrap_or(Ipv4Addr::UNSPECIFIED);
            Reply::Arp(ArpRepr::request(mac, source, target))
        }
        IpAddr::V6(target) => {
            let source = sources.iter().find_map(|ip| match ip {
                IpAddr::V6(v6) => Some(*v6),
                IpAddr::V4(_) => None,
            })?;
            Reply::Ndp(NdpFrame::solicit(mac, source, target))
        }
    };
    Some(frame.emit(buf))
}

/// Label of the drop counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabels {
    /// [`Drop::as_str`].
    pub reason: DropReasonLabel,
}

/// [`Drop`] without its data, as a label value.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum DropReasonLabel {
    /// See [`Drop::Malformed`].
    malformed,
    /// See [`Drop::NotNeighborDiscovery`].
    not_neighbor_discovery,
    /// See [`Drop::FromUs`].
    from_us,
    /// See [`Drop::NotOwned`].
    not_owned,
    /// See [`Drop::NotForUs`].
    not_for_us,
    /// See [`Drop::NotARequest`].
    not_a_request,
    /// See [`Drop::Conflict`].
    conflict,
    /// Received while the thread was quarantined after a pause (see [`PauseFuse`]).
    paused,
}

impl From<&Drop> for DropReasonLabel {
    fn from(d: &Drop) -> Self {
        match d {
            Drop::Malformed(_) => DropReasonLabel::malformed,
            Drop::NotNeighborDiscovery => DropReasonLabel::not_neighbor_discovery,
            Drop::FromUs => DropReasonLabel::from_us,
            Drop::NotOwned => DropReasonLabel::not_owned,
            Drop::NotForUs => DropReasonLabel::not_for_us,
            Drop::NotARequest => DropReasonLabel::not_a_request,
            Drop::Conflict { .. } => DropReasonLabel::conflict,
        }
    }
}

/// Label of the counter of claims not handed to the daemon.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConflictDropLabels {
    /// Why.
    pub reason: ConflictDropReason,
}

/// Why a claim was not handed to the daemon.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ConflictDropReason {
    /// The same claim (address and MAC) already waits for the daemon.
    already_queued,
    /// [`CONFLICT_QUEUE`] claims were already waiting for the daemon.
    queue_full,
}

/// How many claims wait for the daemon at most; more are dropped and counted. A claim that
/// already waits is not queued twice, so a flood for one address takes one place, and the
/// daemon's answer to a claim (a re-announcement) is rate-limited per address anyway.
pub const CONFLICT_QUEUE: usize = 1024;

/// The claims waiting for the daemon, shared by the two ends of the queue.
type Waiting = Arc<Mutex<HashSet<Conflict>>>;

/// Where the responders put the claims they see, for the daemon: [`conflict_queue`].
#[derive(Debug, Clone)]
pub struct ConflictSender {
    tx: tokio::sync::mpsc::Sender<Conflict>,
    waiting: Waiting,
}

/// The daemon's end of [`conflict_queue`].
#[derive(Debug)]
pub struct ConflictReceiver {
    rx: tokio::sync::mpsc::Receiver<Conflict>,
    waiting: Waiting,
}

/// A queue of claims of at most [`CONFLICT_QUEUE`], each claim (address and MAC) in it once.
pub fn conflict_queue() -> (ConflictSender, ConflictReceiver) {
    let (tx, rx) = tokio::sync::mpsc::channel(CONFLICT_QUEUE);
    let waiting = Arc::new(Mutex::new(HashSet::with_capacity(CONFLICT_QUEUE)));
    (
        ConflictSender {
            tx,
            waiting: Arc::clone(&waiting),
        },
        ConflictReceiver { rx, waiting },
    )
}

impl ConflictReceiver {
    /// The next claim; `None` once every sender is gone.
    pub async fn recv(&mut self) -> Option<Conflict> {
        let conflict = self.rx.recv().await?;
        Some(self.taken(conflict))
    }

    /// The next claim if one waits.
    pub fn try_recv(&mut self) -> Result<Conflict, tokio::sync::mpsc::error::TryRecvError> {
        self.rx.try_recv().map(|c| self.taken(c))
    }

    /// The next claim, blocking the thread (not on a runtime).
    pub fn blocking_recv(&mut self) -> Option<Conflict> {
        let conflict = self.rx.blocking_recv()?;
        Some(self.taken(conflict))
    }

    fn taken(&self, conflict: Conflict) -> Conflict {
        lock(&self.waiting).remove(&conflict);
        conflict
    }
}

fn lock(waiting: &Waiting) -> std::sync::MutexGuard<'_, HashSet<Conflict>> {
    waiting
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Hands `conflict` to the daemon, or counts it dropped when the same claim already waits or
/// [`CONFLICT_QUEUE`] claims do. Never blocks: the responder thread answers on.
pub fn report_conflict(conflicts: &ConflictSender, metrics: &Metrics, conflict: Conflict) {
    use tokio::sync::mpsc::error::TrySendError;
    let mut waiting = lock(&conflicts.waiting);
    let dropped = if waiting.contains(&conflict) {
        ConflictDropReason::already_queued
    } else {
        match conflicts.tx.try_send(conflict) {
            Ok(()) => {
                // Under the lock, so the receiver removes it only after this.
                waiting.insert(conflict);
                return;
            }
            Err(TrySendError::Closed(_)) => return,
            Err(TrySendError::Full(_)) => ConflictDropReason::queue_full,
        }
    };
    drop(waiting);
    metrics
        .conflicts_dropped
        .get_or_create(&ConflictDropLabels { reason: dropped })
        .inc();
}

/// The responder's counters (DESIGN.md's metric names).
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    /// ARP requests for owned addresses (answered).
    pub arp_requests: Counter,
    /// ARP replies sent.
    pub arp_replies: Counter,
    /// Gratuitous ARP and unsolicited NA sent.
    pub gratuitous_sent: Counter,
    /// Neighbor solicitations for owned addresses (answered).
    pub ndp_solicitations: Counter,
    /// Neighbor advertisements sent in reply.
    pub ndp_adverts: Counter,
    /// Other MACs claiming owned addresses.
    pub conflicts: Counter,
    /// Claims not handed to the daemon, by reason.
    pub conflicts_dropped: Family<ConflictDropLabels, Counter>,
    /// Frames not answered, by reason.
    pub dropped: Family<DropLabels, Counter>,
    /// Frames that could not be sent.
    pub send_errors: Counter,
    /// ARP requests and neighbor solicitations for peers, sent when the link's carrier came
    /// back.
    pub peer_solicitations: Counter,
}

impl Metrics {
    /// Registers every counter into `registry` under its `swimlb_` name.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "swimlb_arp_requests",
            "ARP requests received for owned addresses",
            self.arp_requests.clone(),
        );
        registry.register(
            "swimlb_arp_replies",
            "ARP replies sent",
            self.arp_replies.clone(),
        );
        registry.register(
            "swimlb_gratuitous_sent",
            "Gratuitous ARP and unsolicited neighbor advertisements sent",
            self.gratuitous_sent.clone(),
        );
        registry.register(
            "swimlb_ndp_solicitations",
            "Neighbor solicitations received for owned addresses",
            self.ndp_solicitations.clone(),
        );
        registry.register(
            "swimlb_ndp_adverts",
            "Neighbor advertisements sent in reply",
            self.ndp_adverts.clone(),
        );
        registry.register(
            "swimlb_conflicts",
            "Other MACs seen claiming an owned address",
            self.conflicts.clone(),
        );
        registry.register(
            "swimlb_conflicts_dropped",
            "Claims of an owned address not handed to the daemon, by reason",
            self.conflicts_dropped.clone(),
        );
        // Every reason from the start, at 0.
        for reason in [
            ConflictDropReason::already_queued,
            ConflictDropReason::queue_full,
        ] {
            let _ = self
                .conflicts_dropped
                .get_or_create(&ConflictDropLabels { reason });
        }
        registry.register(
            "swimlb_responder_dropped_frames",
            "Received frames not answered, by reason",
            self.dropped.clone(),
        );
        registry.register(
            "swimlb_responder_send_errors",
            "Frames the responder could not send",
            self.send_errors.clone(),
        );
        registry.register(
            "swimlb_peer_solicitations_sent",
            "ARP requests and neighbor solicitations sent for the peers' addresses when a link's carrier came back",
            self.peer_solicitations.clone(),
        );
    }
}

/// A command to a responder thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// Answer for exactly these addresses from now on.
    SetOwned(Owned),
    /// Send one announcement of `ip` now.
    Announce(IpAddr),
    /// Ask for the MACs of `targets` now, from `sources` (see [`solicitation`]).
    Solicit {
        /// This node's addresses, one per family at most used.
        sources: Vec<IpAddr>,
        /// The peers' addresses.
        targets: Vec<IpAddr>,
    },
    /// Stop the thread.
    Stop,
}

/// A conflict the responder saw, for the daemon to log and answer with a re-announcement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Conflict {
    /// The address.
    pub ip: IpAddr,
    /// The other MAC.
    pub mac: MacAddr,
}

mod thread;
pub use thread::{Deferred, IDLE_TURN, PAUSE_FUSE, PauseFuse, QUARANTINE, Responder};

#[cfg(test)]
mod tests;
