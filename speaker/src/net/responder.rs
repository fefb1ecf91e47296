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
//! tests). The daemon controls it through a channel: the owned set, announcements, stop.

use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::time::Instant;

use pnet_datalink::{DataLinkReceiver, DataLinkSender};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use swimlb_proto::arp::{ArpOperation, ArpRepr};
use swimlb_proto::ethernet::{BROADCAST, MacAddr};
use swimlb_proto::ndp::{self, NdpFrame, NdpMessage};
use swimlb_proto::{Error as WireError, Frame};

use crate::net::packet_socket::Membership;

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

/// A running responder thread for one interface.
#[derive(Debug)]
pub struct Responder {
    control: mpsc::Sender<Control>,
    thread: Option<JoinHandle<()>>,
}

impl Responder {
    /// Starts the thread. `rx.next()` must time out now and then (the filtered socket is opened
    /// with a read timeout) so that control messages are seen without a frame arriving.
    pub fn spawn(
        name: &str,
        mac: MacAddr,
        tx: Box<dyn DataLinkSender>,
        rx: Box<dyn DataLinkReceiver>,
        membership: Option<Membership>,
        metrics: Metrics,
        conflicts: ConflictSender,
    ) -> io::Result<Responder> {
        let (control, commands) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("responder-{name}"))
            .spawn(move || {
                run(mac, tx, rx, membership, &metrics, &commands, &conflicts);
            })?;
        Ok(Responder {
            control,
            thread: Some(thread),
        })
    }

    /// Sends a command; false when the thread is gone.
    pub fn send(&self, command: Control) -> bool {
        self.control.send(command).is_ok()
    }

    /// Stops the thread and waits for it.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        let _ = self.control.send(Control::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl std::ops::Drop for Responder {
    fn drop(&mut self) {
        self.halt();
    }
}

/// A turn of the responder's loop this much later than the last one means the thread (the
/// process) was not scheduled: stopped, or starved. The loop turns at least every
/// `answering::COMMAND_LATENCY` (5 ms) otherwise. The gossip's own pause watch uses the suspicion
/// timeout (150 ms in the `fast` profile): this fires no later.
pub const PAUSE_FUSE: Duration = Duration::from_millis(100);
/// How long a responder that woke from a pause answers nothing and sends no announcement unless
/// its owner set is renewed first (the daemon holds after a pause, then re-answers).
pub const QUARANTINE: Duration = Duration::from_millis(500);

/// What a responder thread does after a pause: the ARP requests queued while it slept, and the
/// announcements its daemon may still send from a stale view before the gossip reports the
/// pause, would claim IPs the cluster moved meanwhile. So it answers nothing for
/// [`QUARANTINE`], or until its owned set is renewed (the daemon's hold, then its release).
#[derive(Debug, Clone, Copy)]
pub struct PauseFuse {
    last_turn: Instant,
    quarantine_until: Option<Instant>,
}

impl PauseFuse {
    /// A fuse whose last turn is `now`.
    pub fn new(now: Instant) -> PauseFuse {
        PauseFuse {
            last_turn: now,
            quarantine_until: None,
        }
    }

    /// A loop turn at `now`; true when it found a pause (and started the quarantine).
    pub fn turn(&mut self, now: Instant) -> bool {
        let paused = now.saturating_duration_since(self.last_turn) > PAUSE_FUSE;
        self.last_turn = now;
        if paused {
            self.quarantine_until = Some(now + QUARANTINE);
        }
        paused
    }

    /// The owned set was renewed: the daemon has acted since the pause.
    pub fn renewed(&mut self) {
        self.quarantine_until = None;
    }

    /// Whether the thread must stay silent at `now`.
    pub fn quarantined(&mut self, now: Instant) -> bool {
        match self.quarantine_until {
            Some(until) if now < until => true,
            Some(_) => {
                self.quarantine_until = None;
                false
            }
            None => false,
        }
    }
}

fn run(
    mac: MacAddr,
    mut tx: Box<dyn DataLinkSender>,
    mut rx: Box<dyn DataLinkReceiver>,
    membership: Option<Membership>,
    metrics: &Metrics,
    commands: &mpsc::Receiver<Control>,
    conflicts: &ConflictSender,
) {
    let mut owned = Owned::default();
    let mut out = [0u8; 128];
    let mut fuse = PauseFuse::new(Instant::now());
    loop {
        notice_pause(&mut fuse, Instant::now());
        // Commands first: a stop or a new owned set takes effect before the next frame.
        loop {
            match commands.try_recv() {
                Ok(Control::SetOwned(next)) => {
                    if let Some(m) = &membership {
                        update_groups(m, &owned, &next);
                    }
                    owned = next;
                    fuse.renewed();
                }
                Ok(Control::Announce(ip)) => {
                    if fuse.quarantined(Instant::now()) {
                        continue;
                    }
                    if let Ok(len) = announcement(mac, ip, &mut out) {
                        send(&mut *tx, &out[..len], metrics, &metrics.gratuitous_sent);
                    }
                }
                Ok(Control::Solicit { sources, targets }) => {
                    for target in targets {
                        if let Some(Ok(len)) = solicitation(mac, &sources, target, &mut out) {
                            send(&mut *tx, &out[..len], metrics, &metrics.peer_solicitations);
                        }
                    }
                }
                Ok(Control::Stop) | Err(mpsc::TryRecvError::Disconnected) => return,
                Err(mpsc::TryRecvError::Empty) => break,
            }
        }
        let frame = match rx.next() {
            Ok(frame) => frame,
            Err(e)
                if e.kind() == io::ErrorKind::TimedOut || e.kind() == io::ErrorKind::WouldBlock =>
            {
                continue;
            }
            Err(_) => {
                // A transient socket error (interface going down): back off briefly.
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
        };
        // The thread spends its time in the receive, so a stop most often ends there: the
        // frames that waited in the socket meanwhile are the cluster's past (a node held down
        // while stopped answered a queued ARP request for an IP its successor had taken).
        let now = Instant::now();
        notice_pause(&mut fuse, now);
        let decided = decide(frame, mac, &owned);
        if fuse.quarantined(now) && !passes_quarantine(&decided) {
            metrics
                .dropped
                .get_or_create(&DropLabels {
                    reason: DropReasonLabel::paused,
                })
                .inc();
            continue;
        }
        match decided {
            Ok(reply) => {
                let counter = match reply {
                    Reply::Arp(_) => {
                        metrics.arp_requests.inc();
                        &metrics.arp_replies
                    }
                    Reply::Ndp(_) => {
                        metrics.ndp_solicitations.inc();
                        &metrics.ndp_adverts
                    }
                };
                if let Ok(len) = reply.emit(&mut out) {
                    send(&mut *tx, &out[..len], metrics, counter);
                }
            }
            Err(drop) => {
                metrics
                    .dropped
                    .get_or_create(&DropLabels {
                        reason: (&drop).into(),
                    })
                    .inc();
                if let Drop::Conflict { ip, mac } = drop {
                    metrics.conflicts.inc();
                    report_conflict(conflicts, metrics, Conflict { ip, mac });
                }
            }
        }
    }
}

/// Whether a decision goes through the quarantine after a pause: no reply does (the request
/// may be the cluster's past), but another MAC's claim does. It is how an old owner learns the
/// new one announced an IP it hands over; missed, both answer until the hand-over's deadline
/// (Kubernetes chaos seed 1 at 1,379 s on 9bd8cfa: 1.8 s, the old owner just starved).
fn passes_quarantine(decided: &Result<Reply, Drop>) -> bool {
    matches!(decided, Err(Drop::Conflict { .. }))
}

/// A turn of the fuse at `now`, said in the log when it found a pause.
fn notice_pause(fuse: &mut PauseFuse, now: Instant) {
    if fuse.turn(now) {
        tracing::warn!(
            "the responder was not scheduled for over {PAUSE_FUSE:?}: answering nothing until the speaker renews what it owns (at most {QUARANTINE:?})"
        );
    }
}

fn send(tx: &mut dyn DataLinkSender, frame: &[u8], metrics: &Metrics, sent: &Counter) {
    match tx.send_to(frame, None) {
        Some(Ok(())) => {
            sent.inc();
        }
        _ => {
            metrics.send_errors.inc();
        }
    }
}

/// Joins the solicited-node groups of new IPv6 addresses and leaves those of removed ones.
fn update_groups(membership: &Membership, old: &Owned, new: &Owned) {
    let group = |ip: &Ipv6Addr| {
        let m = ndp::multicast_mac(ndp::solicited_node_multicast(*ip));
        [m.0, m.1, m.2, m.3, m.4, m.5]
    };
    for ip in new.v6().iter().filter(|ip| !old.contains_v6(**ip)) {
        let _ = membership.join(group(ip));
    }
    for ip in old.v6().iter().filter(|ip| !new.contains_v6(**ip)) {
        let _ = membership.leave(group(ip));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_quarantines_until_the_owned_set_is_renewed_or_the_quarantine_ends() {
        let t0 = Instant::now();
        let mut fuse = PauseFuse::new(t0);
        // Ordinary turns, a few milliseconds apart, never trip it.
        for ms in (5..100).step_by(5) {
            assert!(!fuse.turn(t0 + Duration::from_millis(ms)));
            assert!(!fuse.quarantined(t0 + Duration::from_millis(ms)));
        }
        // A 2 s gap: quarantined from the first turn after it.
        let resumed = t0 + Duration::from_millis(2095);
        assert!(fuse.turn(resumed));
        assert!(fuse.quarantined(resumed));
        assert!(fuse.quarantined(resumed + QUARANTINE - Duration::from_millis(1)));
        // Renewed by the daemon: answering again at once.
        fuse.renewed();
        assert!(!fuse.quarantined(resumed + Duration::from_millis(10)));
        // Another pause, never renewed: the quarantine ends by itself.
        let again = resumed + Duration::from_secs(5);
        assert!(fuse.turn(again));
        assert!(fuse.quarantined(again + Duration::from_millis(1)));
        assert!(!fuse.quarantined(again + QUARANTINE));
        assert!(!fuse.quarantined(again + QUARANTINE + Duration::from_millis(1)));
    }
    use swimlb_proto::ethernet::{EtherType, EthernetRepr, ZERO};
    use swimlb_proto::ndp::{NdpRepr, NeighborFlags};

    const OURS: MacAddr = MacAddr(2, 0, 0, 0, 0, 1);
    const THEIRS: MacAddr = MacAddr(2, 0, 0, 0, 0, 2);
    const VIP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 100);
    const OTHER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 101);
    const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 2);
    const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 0x100);
    const CLIENT6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 2);

    fn owned() -> Owned {
        Owned::new([IpAddr::V4(VIP), IpAddr::V6(VIP6)])
    }

    fn arp(
        op: ArpOperation,
        dst: MacAddr,
        sender: (MacAddr, Ipv4Addr),
        target: Ipv4Addr,
    ) -> Vec<u8> {
        let repr = ArpRepr {
            operation: op,
            sender_mac: sender.0,
            sender_ip: sender.1,
            target_mac: ZERO,
            target_ip: target,
        };
        let mut buf = vec![0u8; repr.frame_len()];
        repr.emit_frame(&mut buf).unwrap();
        buf[..6].copy_from_slice(&[dst.0, dst.1, dst.2, dst.3, dst.4, dst.5]);
        buf
    }

    fn ns(src: Ipv6Addr, dst_mac: MacAddr, target: Ipv6Addr) -> Vec<u8> {
        let dst_addr = if dst_mac == OURS {
            target
        } else {
            ndp::solicited_node_multicast(target)
        };
        let f = NdpFrame {
            ethernet: EthernetRepr {
                dst: dst_mac,
                src: THEIRS,
                ethertype: EtherType::Ipv6,
            },
            ndp: NdpRepr {
                src_addr: src,
                dst_addr,
                message: NdpMessage::NeighborSolicit {
                    target,
                    source_link_addr: if src.is_unspecified() {
                        None
                    } else {
                        Some(THEIRS)
                    },
                },
            },
        };
        let mut buf = vec![0u8; f.frame_len()];
        f.emit(&mut buf).unwrap();
        buf
    }

    fn na(target: Ipv6Addr, mac: MacAddr) -> Vec<u8> {
        let mut f = NdpFrame::unsolicited_advert(mac, target);
        f.ndp.message = NdpMessage::NeighborAdvert {
            flags: NeighborFlags {
                router: false,
                solicited: false,
                override_: true,
            },
            target,
            target_link_addr: Some(mac),
        };
        let mut buf = vec![0u8; f.frame_len()];
        f.emit(&mut buf).unwrap();
        buf
    }

    #[test]
    fn the_quarantine_after_a_pause_holds_back_replies_not_another_macs_claims() {
        use ArpOperation::Request as Req;
        let request = decide(&arp(Req, BROADCAST, (THEIRS, CLIENT), VIP), OURS, &owned());
        assert!(request.is_ok());
        assert!(
            !passes_quarantine(&request),
            "a request waits out the quarantine"
        );
        let claim = decide(&arp(Req, BROADCAST, (THEIRS, VIP), VIP), OURS, &owned());
        assert!(matches!(claim, Err(Drop::Conflict { .. })));
        assert!(passes_quarantine(&claim), "a claim reaches the daemon");
        let other = decide(
            &arp(Req, BROADCAST, (THEIRS, CLIENT), OTHER),
            OURS,
            &owned(),
        );
        assert!(!passes_quarantine(&other));
    }

    #[test]
    fn arp_table() {
        use ArpOperation::{Reply as Rep, Request as Req};
        let snm = ndp::multicast_mac(ndp::solicited_node_multicast(VIP6));
        let table: Vec<(&str, Vec<u8>, Result<(), Drop>)> = vec![
            (
                "broadcast request for the VIP",
                arp(Req, BROADCAST, (THEIRS, CLIENT), VIP),
                Ok(()),
            ),
            (
                "unicast refresh to our MAC",
                arp(Req, OURS, (THEIRS, CLIENT), VIP),
                Ok(()),
            ),
            (
                "RFC 5227 probe from 0.0.0.0",
                arp(Req, BROADCAST, (THEIRS, Ipv4Addr::UNSPECIFIED), VIP),
                Ok(()),
            ),
            (
                "request for another address",
                arp(Req, BROADCAST, (THEIRS, CLIENT), OTHER),
                Err(Drop::NotOwned),
            ),
            (
                "unicast to another MAC",
                arp(Req, THEIRS, (THEIRS, CLIENT), VIP),
                Err(Drop::NotForUs),
            ),
            (
                "our own request",
                arp(Req, BROADCAST, (OURS, VIP), CLIENT),
                Err(Drop::FromUs),
            ),
            (
                "gratuitous ARP from another MAC",
                arp(Req, BROADCAST, (THEIRS, VIP), VIP),
                Err(Drop::Conflict {
                    ip: IpAddr::V4(VIP),
                    mac: THEIRS,
                }),
            ),
            (
                "reply from another MAC for the VIP",
                arp(Rep, OURS, (THEIRS, VIP), CLIENT),
                Err(Drop::Conflict {
                    ip: IpAddr::V4(VIP),
                    mac: THEIRS,
                }),
            ),
            (
                "reply about another address",
                arp(Rep, OURS, (THEIRS, CLIENT), OTHER),
                Err(Drop::NotARequest),
            ),
            (
                "multicast frame not ours",
                arp(Req, snm, (THEIRS, CLIENT), VIP),
                Err(Drop::NotForUs),
            ),
        ];
        for (name, frame, expected) in table {
            let got = decide(&frame, OURS, &owned());
            match (got, expected) {
                (Ok(Reply::Arp(r)), Ok(())) => {
                    assert_eq!(r.operation, ArpOperation::Reply, "{name}");
                    assert_eq!((r.sender_mac, r.sender_ip), (OURS, VIP), "{name}");
                    assert_eq!(r.target_mac, THEIRS, "{name}");
                }
                (got, expected) => assert_eq!(got.map(|_| ()), expected, "{name}"),
            }
        }
    }

    #[test]
    fn ndp_table() {
        let snm = ndp::multicast_mac(ndp::solicited_node_multicast(VIP6));
        let other6 = Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 0x101);
        let other_snm = ndp::multicast_mac(ndp::solicited_node_multicast(other6));
        // (case, frame, expected: Ok((reply's Ethernet destination, IPv6 destination, Solicited)))
        type Case<'a> = (&'a str, Vec<u8>, Result<(MacAddr, Ipv6Addr, bool), Drop>);
        let cases: Vec<Case<'_>> = vec![
            (
                "multicast solicitation",
                ns(CLIENT6, snm, VIP6),
                Ok((THEIRS, CLIENT6, true)),
            ),
            (
                "unicast solicitation to our MAC",
                ns(CLIENT6, OURS, VIP6),
                Ok((THEIRS, CLIENT6, true)),
            ),
            (
                "duplicate address detection from ::",
                ns(Ipv6Addr::UNSPECIFIED, snm, VIP6),
                Ok((MacAddr(0x33, 0x33, 0, 0, 0, 1), ndp::ALL_NODES, false)),
            ),
            (
                "solicitation for another address",
                ns(CLIENT6, other_snm, other6),
                Err(Drop::NotOwned),
            ),
            (
                "solicitation to another group",
                ns(CLIENT6, other_snm, VIP6),
                Err(Drop::NotForUs),
            ),
            (
                "advertisement from another MAC",
                na(VIP6, THEIRS),
                Err(Drop::Conflict {
                    ip: IpAddr::V6(VIP6),
                    mac: THEIRS,
                }),
            ),
            (
                "advertisement about another address",
                na(other6, THEIRS),
                Err(Drop::NotARequest),
            ),
        ];
        for (name, frame, expected) in cases {
            match (decide(&frame, OURS, &owned()), expected) {
                (Ok(Reply::Ndp(f)), Ok((dst_mac, dst_ip, solicited))) => {
                    assert_eq!(f.ethernet.dst, dst_mac, "{name}");
                    assert_eq!(f.ethernet.src, OURS, "{name}");
                    assert_eq!(f.ndp.dst_addr, dst_ip, "{name}");
                    let NdpMessage::NeighborAdvert {
                        flags,
                        target,
                        target_link_addr,
                    } = f.ndp.message
                    else {
                        panic!("{name}: not an advertisement");
                    };
                    assert_eq!((target, target_link_addr), (VIP6, Some(OURS)), "{name}");
                    assert!(flags.override_, "{name}");
                    assert_eq!(flags.solicited, solicited, "{name}");
                }
                (got, expected) => assert_eq!(got.map(|_| ()), expected.map(|_| ()), "{name}"),
            }
        }
    }

    #[test]
    fn garbage_is_a_counted_drop() {
        assert_eq!(
            decide(&[], OURS, &owned()),
            Err(Drop::Malformed(WireError::Truncated))
        );
        let mut bad = arp(ArpOperation::Request, BROADCAST, (THEIRS, CLIENT), VIP);
        bad[14] = 9; // hardware type
        assert!(matches!(
            decide(&bad, OURS, &owned()),
            Err(Drop::Malformed(_))
        ));
        let mut ipv4 = vec![0u8; 60];
        ipv4[12..14].copy_from_slice(&[0x08, 0x00]);
        assert_eq!(
            decide(&ipv4, OURS, &owned()),
            Err(Drop::NotNeighborDiscovery)
        );
    }

    #[test]
    fn nothing_is_answered_without_ownership() {
        let frame = arp(ArpOperation::Request, BROADCAST, (THEIRS, CLIENT), VIP);
        assert_eq!(decide(&frame, OURS, &Owned::default()), Err(Drop::NotOwned));
    }

    #[test]
    fn announcements_are_gratuitous_arp_and_unsolicited_na() {
        let mut buf = [0u8; 128];
        let n = announcement(OURS, IpAddr::V4(VIP), &mut buf).unwrap();
        let Ok(Frame::Arp { ethernet, arp }) = Frame::parse(&buf[..n]) else {
            panic!("not ARP")
        };
        assert_eq!(ethernet.dst, BROADCAST);
        assert!(arp.is_gratuitous());
        assert_eq!(
            (arp.operation, arp.sender_mac, arp.target_ip),
            (ArpOperation::Request, OURS, VIP)
        );
        let n = announcement(OURS, IpAddr::V6(VIP6), &mut buf).unwrap();
        let Ok(Frame::Ndp(f)) = Frame::parse(&buf[..n]) else {
            panic!("not NDP")
        };
        assert_eq!(f.ndp.dst_addr, ndp::ALL_NODES);
    }

    /// The I/O loop over `pnet_datalink::dummy`: frames in, replies out, commands obeyed.
    type Injected = mpsc::Sender<io::Result<Box<[u8]>>>;
    type Conflicts = ConflictReceiver;

    /// A responder on pnet's dummy channel: frames go in through the first handle, what it
    /// sends comes out of the second. Its reads block until something is injected.
    fn dummy_responder() -> (
        Responder,
        Injected,
        mpsc::Receiver<Box<[u8]>>,
        Conflicts,
        Metrics,
    ) {
        let iface = pnet_datalink::dummy::dummy_interface(0);
        let mut config = pnet_datalink::dummy::Config::default();
        let inject = config.inject_handle().unwrap();
        let wire = config.read_handle().unwrap();
        let Ok(pnet_datalink::Channel::Ethernet(tx, rx)) =
            pnet_datalink::dummy::channel(&iface, config)
        else {
            panic!("dummy channel");
        };
        let (conflict_tx, conflict_rx) = conflict_queue();
        let metrics = Metrics::default();
        let responder =
            Responder::spawn("test", OURS, tx, rx, None, metrics.clone(), conflict_tx).unwrap();
        (responder, inject, wire, conflict_rx, metrics)
    }

    fn dropped(metrics: &Metrics, reason: ConflictDropReason) -> u64 {
        metrics
            .conflicts_dropped
            .get_or_create(&ConflictDropLabels { reason })
            .get()
    }

    fn claim(i: usize) -> Conflict {
        Conflict {
            ip: IpAddr::V4(Ipv4Addr::from(0xc633_6400_u32 + i as u32)),
            mac: THEIRS,
        }
    }

    #[test]
    fn a_flood_of_one_claim_takes_one_place_in_the_queue_until_the_daemon_takes_it() {
        let (tx, mut rx) = conflict_queue();
        let metrics = Metrics::default();
        for _ in 0..10_000 {
            report_conflict(&tx, &metrics, claim(0));
        }
        assert_eq!(dropped(&metrics, ConflictDropReason::already_queued), 9_999);
        assert_eq!(dropped(&metrics, ConflictDropReason::queue_full), 0);
        assert_eq!(rx.try_recv(), Ok(claim(0)));
        assert!(rx.try_recv().is_err());
        // Taken, the same claim is queued again; another MAC's claim of the address too.
        report_conflict(&tx, &metrics, claim(0));
        let other = Conflict {
            mac: MacAddr(2, 0, 0, 0, 0, 7),
            ..claim(0)
        };
        report_conflict(&tx, &metrics, other);
        assert_eq!(rx.try_recv(), Ok(claim(0)));
        assert_eq!(rx.try_recv(), Ok(other));
    }

    #[test]
    fn a_flood_of_distinct_claims_fills_the_queue_to_its_bound_and_counts_the_rest_dropped() {
        let (tx, mut rx) = conflict_queue();
        let metrics = Metrics::default();
        let flood = 10 * CONFLICT_QUEUE;
        for i in 0..flood {
            report_conflict(&tx, &metrics, claim(i));
        }
        assert_eq!(
            dropped(&metrics, ConflictDropReason::queue_full),
            (flood - CONFLICT_QUEUE) as u64
        );
        let mut queued = 0;
        while rx.try_recv().is_ok() {
            queued += 1;
        }
        assert_eq!(queued, CONFLICT_QUEUE);
        assert!(
            lock(&rx.waiting).is_empty(),
            "every taken claim is forgotten"
        );
        // Drained, it takes claims again.
        report_conflict(&tx, &metrics, claim(flood));
        assert_eq!(rx.try_recv(), Ok(claim(flood)));
    }

    #[test]
    fn io_loop_passes_a_claim_through_the_quarantine_and_holds_back_the_reply() {
        let (responder, inject, wire, mut conflict_rx, metrics) = dummy_responder();
        let frame = |f: Vec<u8>| inject.send(Ok(f.into_boxed_slice())).unwrap();
        responder.send(Control::SetOwned(owned()));
        responder.send(Control::Announce(IpAddr::V4(VIP)));
        let _ = inject.send(Err(io::Error::from(io::ErrorKind::TimedOut)));
        assert!(
            wire.recv_timeout(Duration::from_secs(5)).is_ok(),
            "announced"
        );
        // The loop blocks in its read with nothing injected: its next turn comes after a gap
        // longer than the fuse, as after a stop or a starved stretch.
        std::thread::sleep(PAUSE_FUSE * 3);
        frame(arp(ArpOperation::Request, BROADCAST, (THEIRS, CLIENT), VIP));
        frame(arp(ArpOperation::Request, BROADCAST, (THEIRS, VIP), VIP));
        let mut conflict = None;
        for _ in 0..200 {
            if let Ok(c) = conflict_rx.try_recv() {
                conflict = Some(c);
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let paused = metrics
            .dropped
            .get_or_create(&DropLabels {
                reason: DropReasonLabel::paused,
            })
            .get();
        let replied = wire.try_recv().is_ok();
        // Stopped before the assertions: a failing one would otherwise wait forever for the
        // loop, blocked in its read, to end.
        responder.send(Control::Stop);
        let _ = inject.send(Err(io::Error::from(io::ErrorKind::TimedOut)));
        responder.stop();
        assert_eq!(
            conflict,
            Some(Conflict {
                ip: IpAddr::V4(VIP),
                mac: THEIRS
            }),
            "the claim reaches the daemon"
        );
        assert_eq!(paused, 1, "the request waited out the quarantine");
        assert!(!replied, "no reply in the quarantine");
    }

    #[test]
    fn io_loop_answers_only_while_owning() {
        let (responder, inject, wire, mut conflict_rx, metrics) = dummy_responder();
        // The dummy receiver blocks until something is injected: a timeout wakes the loop so it
        // reads the commands sent before it, as the real socket's read timeout does.
        // Once the thread has stopped, nobody is left to wake: a tick then goes nowhere.
        let tick = || {
            let _ = inject.send(Err(io::Error::from(io::ErrorKind::TimedOut)));
        };
        let frame = |f: Vec<u8>| inject.send(Ok(f.into_boxed_slice())).unwrap();
        let request = arp(ArpOperation::Request, BROADCAST, (THEIRS, CLIENT), VIP);
        let next_sent = || {
            Frame::parse(&wire.recv_timeout(Duration::from_secs(5)).unwrap())
                .map(|f| format!("{f:?}"))
                .unwrap()
        };
        // Commands and frames come on two channels, so the test never assumes their order:
        // commands are followed by an announcement, which the loop sends after every command
        // before it (a barrier), and a dropped frame is awaited on its counter.
        let barrier = || {
            responder.send(Control::Announce(IpAddr::V4(OTHER)));
            tick();
            let sent = next_sent();
            assert!(sent.contains("sender_ip: 198.51.100.101"), "{sent}");
        };
        let not_owned = || {
            metrics
                .dropped
                .get_or_create(&DropLabels {
                    reason: DropReasonLabel::not_owned,
                })
                .get()
        };
        let await_dropped = |count: u64| {
            for _ in 0..500 {
                if not_owned() >= count {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            assert_eq!(not_owned(), count);
        };

        // Not owning yet: the request is dropped.
        frame(request.clone());
        await_dropped(1);

        responder.send(Control::SetOwned(owned()));
        barrier();
        frame(request.clone());
        let reply = next_sent();
        assert!(
            reply.contains("operation: Reply") && reply.contains("sender_ip: 198.51.100.100"),
            "{reply}"
        );

        frame(arp(ArpOperation::Request, BROADCAST, (THEIRS, VIP), VIP));
        let conflict = conflict_rx.blocking_recv().unwrap();
        assert_eq!(
            conflict,
            Conflict {
                ip: IpAddr::V4(VIP),
                mac: THEIRS
            }
        );

        // Stopping is immediate: the next request is dropped, and nothing is sent for it.
        responder.send(Control::SetOwned(Owned::default()));
        barrier();
        frame(request);
        await_dropped(2);
        assert!(wire.try_recv().is_err(), "no reply once not owning");

        responder.send(Control::Stop);
        tick();
        responder.stop();
        assert_eq!(metrics.arp_replies.get(), 1);
        assert_eq!(metrics.gratuitous_sent.get(), 2);
        assert_eq!(metrics.conflicts.get(), 1);
    }
}
