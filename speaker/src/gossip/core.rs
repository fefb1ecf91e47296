//! The sans-IO gossip core: one [`Core`] owns the `Foca` instance, one ordered timer heap, the
//! [`LiveSet`], the join and identity-renewal logic, the metadata records and the envelope.
//!
//! The core never reads a clock, opens a socket or spawns a task. Time is a [`Duration`] since an
//! origin the caller picks, passed into every call. Each call may queue datagrams
//! ([`Core::drain_outgoing`]) and [`LiveChange`]s ([`Core::drain_changes`]) and move the next
//! wake-up ([`Core::next_deadline`]). The tokio driver and the lab's simulator run this same code.
//!
//! Guarantees:
//! - Nothing a peer sends can panic the core: a datagram that does not open, does not decode, or
//!   comes from ourselves is dropped and counted by [`RejectReason`].
//! - No datagram takes effect twice, or after its sender restarted: every envelope is sealed in
//!   this node's stream (sender id from its gossip address, epoch = its start-up bump, one
//!   counter for all datagrams), and a received one that opens is admitted by the
//!   [`ReplayGuard`] before anything reads it (see [`super::replay`]).
//! - A member is in the [`LiveSet`] from foca's `MemberUp` until its `MemberDown`: suspicion is
//!   not death. The local node is always in its own `LiveSet`.
//! - Timers fire in deadline order (ties in the order they were set).
//! - The node keeps announcing to its seeds until foca reports `Active`, and again after `Idle`.
//!   A member that announces to us while we hold it as down is told so (foca's `TurnUndead`), so
//!   it renews its identity and both sides of a healed partition merge without operator help.
//!   Only a node that holds at least as many members alive as down does so, and a renewed node
//!   starts a fresh foca that has forgotten its downs, so after a heal the smaller side rejoins
//!   and the larger side sees no member go down.
//! - A renewed node gossips itself unsettled (`settled: false`) until its owner sets it again.
//!
//! Datagram payload (inside the envelope): a [`GossipMessage`] (see [`swimlb_proto::gossip`]):
//! a foca packet; a metadata record sent straight to one member, or a request for it (sent for
//! alive members whose record has not arrived); a membership digest ([`super::sync`]), answered
//! with foca updates for the members the sender seems to miss; an inquiry about a suspect, the
//! pings to the suspect on the inquirer's behalf and their pongs, and the [`Verdict`].
//!
//! Lifeguard on foca (see [`super::lifeguard`]). foca 2 has neither local health nor suspicion
//! that shrinks with confirmations, and exposes no suspicion events, but it schedules every
//! timer through our runtime, so both are built around it without changing it:
//! - Local health: the probe timers foca asks for (`ProbeRandomMember`, `SendIndirectProbe`) are
//!   stretched by `score + 1` before they enter the heap. The score rises on a failed probe of
//!   ours (foca's `ProbeFailed`), on a refutation of our own suspicion (our incarnation went up
//!   in a header foca sent) and on a timer run later than a probe period; it falls on every
//!   probe that did not fail. foca sends no nacks, so a failed probe always counts.
//! - Suspicion: foca's `ChangeSuspectToDown` timer is not scheduled as foca asks; the core keeps
//!   the suspicion and ends it itself at [`suspicion_timeout`] (stretched by local health) from
//!   its start, with foca's own timer event (foca still checks the incarnation). foca's
//!   suspicion updates name no accuser, so confirmations cannot be counted from the gossip as
//!   memberlist does. Instead a member that suspects asks a few other members to probe the
//!   suspect for it (an inquiry): each answers with what it holds when that is news (the
//!   member's down, or its refutation), else pings the suspect up to three times and sends a
//!   verdict. Every "unreachable" verdict from a distinct member is one independent
//!   confirmation; a "reachable" one restarts the suspicion at its longest and tells the suspect
//!   (so it refutes). A member that only heard of a suspicion through the gossip inquires too
//!   once it has held it for a while, and declares the member down itself only when at least one
//!   confirmation came back.

use std::collections::{BTreeSet, BinaryHeap};
use std::net::SocketAddr;
use std::time::Duration;

use foca::{Codec, Header, Message, OwnedNotification, PostcardCodec, State, Timer};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use swimlb_proto::envelope::KeyId;
use swimlb_proto::gossip::{GossipMessage, Verdict};
use swimlb_proto::{KeyRing, SealStream};

use super::identity::NodeIdentity;
use super::lifeguard::{LocalHealth, suspicion_timeout, wanted_confirmations};
use super::metadata::FastMap;
use super::metadata::{MetaBroadcasts, MetaError, MetaRecord, SharedBook};
use super::metrics::{Direction, GossipMetrics, RejectReason, SuspicionOutcome};
use super::replay::{ReplayGuard, sender_id};
use super::sync::{Digest, RunningDigest};
use super::timing::{Timing, TimingError};
use crate::model::membership::{LiveChange, LiveSet, MemberMeta, NodeName};

/// Pings a member sends to a suspect for one inquiry before it answers "unreachable".
const RELAY_ATTEMPTS: u32 = 3;
/// The most inquiries a member serves at once (a bound against floods; authentic peers send a
/// few per suspicion).
const MAX_RELAYS: usize = 64;

/// The most datagrams of updates one digest is answered with (about 40 members each): a view
/// that differs more is repaired over several periods.
const SYNC_MAX_DATAGRAMS: usize = 8;

/// A suspect heard of only through gossip is asked directly after at least this long.
const SUSPECT_PATIENCE_MIN: Duration = Duration::from_millis(250);
/// ... once per sweep, and declared down after this many unanswered asks ...
const SUSPECT_MAX_ASKS: u32 = 6;
/// ... and no sooner than this after the suspicion was first seen. Measured with `swimlb-lab
/// sim` at 100 members: expiring after 6 asks alone (about 1 s) destabilised the cluster at 10 %
/// loss (tens of thousands of false downs in 300 s); with this floor it stays at the level of
/// no expiry at all, and a crash seen by every member still ends in a down within 2.5 s.
const SUSPECT_EXPIRE_AFTER: Duration = Duration::from_secs(2);

/// How often member gauges are refreshed and missing metadata records are asked for.
const HOUSEKEEPING_PERIOD: Duration = Duration::from_secs(1);

type FocaInstance = foca::Foca<NodeIdentity, PostcardCodec, StdRng, MetaBroadcasts>;

/// What a core needs to start.
#[derive(Debug, Clone)]
pub struct GossipSettings {
    /// This node's name (its metadata's `node`).
    pub node: NodeName,
    /// The gossip address peers reach this node at (part of its identity).
    pub addr: SocketAddr,
    /// Addresses to announce to until the node has joined. Its own address is skipped.
    pub seeds: Vec<SocketAddr>,
    /// Protocol timings.
    pub timing: Timing,
    /// The identity's starting bump: larger than any previous life of this node (for example
    /// milliseconds since the Unix epoch at start-up). Also the epoch of the node's envelopes:
    /// peers refuse datagrams from an epoch older than the newest they have seen from this
    /// address (see [`super::replay`]).
    pub bump: u64,
    /// Seed of the protocol's random choices.
    pub rng_seed: u64,
}

/// Why the core refused to start or to take new metadata.
#[derive(Debug, thiserror::Error)]
pub enum GossipError {
    /// The timings are invalid.
    #[error(transparent)]
    Timing(#[from] TimingError),
    /// The metadata is for another node.
    #[error("metadata is for node {got:?}, but this speaker is node {expected:?}")]
    WrongNode {
        /// This speaker's node name.
        expected: NodeName,
        /// The node named in the metadata.
        got: NodeName,
    },
    /// The metadata record is invalid (too large).
    #[error(transparent)]
    Metadata(#[from] MetaError),
    /// The envelope stream could not be set up (no system randomness for its nonces).
    #[error("gossip envelope: {0}")]
    Envelope(swimlb_proto::Error),
    /// foca refused the metadata record.
    #[error("foca refused the metadata record of node {node:?}: {reason}")]
    Broadcast {
        /// This speaker's node name.
        node: NodeName,
        /// foca's error.
        reason: String,
    },
    /// The gossip socket failed (driver only).
    #[error("gossip socket {addr}: {source}")]
    Socket {
        /// The address bound or used.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The gossip task has stopped (driver only).
    #[error("the gossip task has stopped")]
    Stopped,
}

/// A sealed datagram to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// Destination.
    pub to: SocketAddr,
    /// The sealed envelope.
    pub bytes: Vec<u8>,
}

/// Where the node is in its life in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Announcing to the seeds; no member has acknowledged us yet (or all left).
    Joining,
    /// At least one member knows our current identity.
    Active,
    /// We left the cluster; the core does nothing more.
    Left,
    /// The process was not scheduled for longer than the suspicion timeout and has not heard
    /// the cluster since (published by the driver, never the core's own phase): what this node
    /// believes may be stale, so it must not answer for anything.
    Paused,
}

impl Phase {
    /// The phase's name for logs.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Phase::Joining => "joining",
            Phase::Active => "active",
            Phase::Left => "left",
            Phase::Paused => "paused",
        }
    }
}

#[derive(Debug)]
enum Task {
    Foca(Timer<NodeIdentity>),
    JoinRetry,
    MetaRefresh,
    Housekeeping,
    SuspectSweep,
    Sync,
    /// A suspicion this node holds may be due (see [`Core::suspicion_due`]).
    Suspicion(SocketAddr),
    /// The next ping of an inquiry this node serves (by nonce).
    Relay(u64),
}

#[derive(Debug)]
struct Scheduled {
    at: Duration,
    seq: u64,
    task: Task,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at && self.seq == other.seq
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    // Reversed: BinaryHeap is a max-heap, the earliest deadline (then the first set) must pop.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.at.cmp(&self.at).then(other.seq.cmp(&self.seq))
    }
}

#[derive(Debug, Default)]
struct TimerHeap {
    heap: BinaryHeap<Scheduled>,
    seq: u64,
}

impl TimerHeap {
    fn push(&mut self, at: Duration, task: Task) {
        self.seq += 1;
        self.heap.push(Scheduled {
            at,
            seq: self.seq,
            task,
        });
    }

    fn pop_due(&mut self, now: Duration) -> Option<(Duration, Task)> {
        if self.heap.peek().is_some_and(|s| s.at <= now) {
            self.heap.pop().map(|s| (s.at, s.task))
        } else {
            None
        }
    }
}

/// One datagram in this many to a peer that seals with another key than our sealing key also
/// goes out sealed with ours (see [`Wire::seal`]).
const OFFER_EVERY: u8 = 4;

/// Everything a foca call writes to besides foca itself: the envelope, the outgoing queue, the
/// timers and the notifications. Kept apart from [`Core::foca`] so a call can borrow both.
struct Wire {
    ring: KeyRing,
    /// This node's stream of envelopes: sender id, epoch and counter (see [`super::replay`]).
    stream: SealStream,
    /// What this node remembers of each sender's stream.
    replay: ReplayGuard,
    /// The key each peer last sealed with. Datagrams to a peer are sealed with it while our ring
    /// holds it, else with our sealing key: a node whose ring already seals with a new key keeps
    /// talking to peers whose ring does not have that key yet (rings `[k2, k1]` and `[k1]`
    /// interoperate). Every key in the ring is trusted, so a peer choosing one gains nothing.
    peer_keys: FastMap<SocketAddr, KeyId>,
    /// Datagrams sent to each peer that seals with another key than our sealing key, since it
    /// last sealed with ours: every [`OFFER_EVERY`]th carries an offer (see [`Wire::seal`]).
    offered: FastMap<SocketAddr, u8>,
    metrics: GossipMetrics,
    timers: TimerHeap,
    outbox: Vec<Outgoing>,
    notes: Vec<OwnedNotification<NodeIdentity>>,
    scratch: Vec<u8>,
    /// Lifeguard's local health (see [`super::lifeguard`]).
    health: LocalHealth,
    /// foca started a probe (sent a `Ping`) since the last probe timer.
    probe_started: bool,
    /// foca reported the last probe failed.
    probe_failed: bool,
    /// Our incarnation as last seen in a header foca sent.
    incarnation: u16,
    /// foca's `ChangeSuspectToDown` timers, taken over by the core: (member, incarnation, event).
    accusations: Vec<(NodeIdentity, u16, Timer<NodeIdentity>)>,
}

impl Wire {
    fn health(&mut self, delta: i32) {
        if self.health.apply(delta) {
            self.metrics.set_health(self.health.score());
        }
    }
}

impl Wire {
    /// foca's runtime for one call at `now`.
    fn at(&mut self, now: Duration) -> CallIo<'_> {
        CallIo { now, wire: self }
    }

    /// Seals `message` into a datagram for `to`, queues it and counts it.
    ///
    /// A peer we have heard from gets the key it last sealed with (while our ring holds it),
    /// else our sealing key. A peer we have never heard from (a seed, a member we only know
    /// from the gossip) gets one copy sealed with each key of our ring: a node restarted with
    /// `[k2, k1]` in the middle of a rotation still reaches seeds that hold only `[k1]`, and the
    /// first answer tells us which key that peer uses. Rings hold one or two keys, and only
    /// datagrams to silent peers are copied.
    ///
    /// A peer that seals with another key than our sealing key also gets, on one datagram in
    /// [`OFFER_EVERY`], a second copy sealed with our sealing key (after the copy it can open):
    /// a peer that holds that key opens both, remembers the last one and answers with it, and
    /// the pair moves to our sealing key. Without the offer, two peers whose rings both seal
    /// with a new key would go on with the old one (each answering the other with the key it
    /// last used) until one of them drops it, and the other's next datagrams would be refused
    /// (`unknown_key`) at the last step of a rotation. A peer whose ring lacks our sealing key
    /// (a rotation whose new key is not yet in every ring) refuses the offers, and counts them.
    fn seal(&mut self, to: SocketAddr, message: &GossipMessage<'_>) {
        self.scratch.clear();
        message.emit_vec(&mut self.scratch);
        match self.peer_keys.get(&to) {
            Some(&key) if self.ring.has_key(key) => {
                self.seal_one(to, Some(key));
                if key == self.ring.sealing_key_id() {
                    self.offered.remove(&to);
                } else {
                    let sent = self.offered.entry(to).or_insert(0);
                    let offer = sent.is_multiple_of(OFFER_EVERY);
                    *sent = sent.wrapping_add(1);
                    if offer {
                        self.seal_one(to, None);
                    }
                }
            }
            Some(_) => self.seal_one(to, None),
            None => {
                self.seal_one(to, None);
                let sealing = self.ring.sealing_key_id();
                let others: Vec<KeyId> = self.ring.key_ids().filter(|k| *k != sealing).collect();
                for key in others {
                    self.seal_one(to, Some(key));
                }
            }
        }
    }

    /// Seals `scratch` with `key` (`None`: the ring's sealing key) and queues it.
    fn seal_one(&mut self, to: SocketAddr, key: Option<KeyId>) {
        let mut bytes = Vec::with_capacity(self.scratch.len() + swimlb_proto::envelope::OVERHEAD);
        let sealed = self
            .ring
            .seal_in(&mut self.stream, key, &self.scratch, &mut bytes);
        match sealed {
            Ok(()) => {
                self.metrics.packet(Direction::Out, bytes.len());
                self.outbox.push(Outgoing { to, bytes });
            }
            // Unreachable with validated timings (foca packets are bounded below the envelope's
            // payload bound); never send a partial envelope.
            Err(err) => tracing::warn!(%to, error = %err, "gossip datagram not sealed"),
        }
    }
}

/// foca's window to the world during one call: queues sends, timers and notifications.
struct CallIo<'a> {
    now: Duration,
    wire: &'a mut Wire,
}

impl foca::Runtime<NodeIdentity> for CallIo<'_> {
    fn notify(&mut self, notification: foca::Notification<'_, NodeIdentity>) {
        match notification {
            // Per-packet notifications are read in place (copying them would allocate per
            // packet): a ping starts a probe, and a raised incarnation is a refutation of ours.
            foca::Notification::DataSent(header) => {
                if matches!(header.message, Message::Ping(_)) {
                    self.wire.probe_started = true;
                }
                if header.src_incarnation > self.wire.incarnation {
                    self.wire.health(1);
                }
                self.wire.incarnation = header.src_incarnation;
            }
            foca::Notification::DataReceived(_) => {}
            other => {
                if matches!(other, foca::Notification::ProbeFailed(..)) {
                    self.wire.probe_failed = true;
                }
                self.wire.notes.push(other.to_owned());
            }
        }
    }

    fn send_to(&mut self, to: NodeIdentity, data: &[u8]) {
        self.wire.seal(to.addr, &GossipMessage::Foca(data));
    }

    fn submit_after(&mut self, event: Timer<NodeIdentity>, after: Duration) {
        let after = match &event {
            Timer::ProbeRandomMember(_) | Timer::SendIndirectProbe { .. } => {
                self.wire.health.scale(after)
            }
            Timer::ChangeSuspectToDown {
                member_id,
                incarnation,
                ..
            } => {
                let (id, incarnation) = (member_id.clone(), *incarnation);
                self.wire.accusations.push((id, incarnation, event));
                return;
            }
            _ => after,
        };
        self.wire.timers.push(self.now + after, Task::Foca(event));
    }
}

/// The gossip state machine. See the module docs.
pub struct Core {
    foca: FocaInstance,
    codec: PostcardCodec,
    wire: Wire,
    timing: Timing,
    seeds: Vec<SocketAddr>,
    changes: Vec<LiveChange>,
    book: SharedBook,
    own: MemberMeta,
    own_record: Vec<u8>,
    live: LiveSet,
    /// Alive members (foca's MemberUp until MemberDown), by address. Changed only through
    /// [`Core::hold_member`] and [`Core::drop_member`], which keep `digest` in step.
    members: FastMap<SocketAddr, NodeIdentity>,
    /// Grows with every change to `members` (see [`Core::members_version`]).
    members_version: u64,
    /// The digest of `members` (see [`super::sync`]).
    digest: RunningDigest,
    by_node: FastMap<NodeName, SocketAddr>,
    /// Alive members whose metadata record has not arrived yet.
    missing_meta: BTreeSet<NodeName>,
    last_heard: FastMap<SocketAddr, Duration>,
    /// Members down or gone, by name: when their last datagram was heard (see
    /// [`Core::last_heard_before_down`]). Kept until the name comes up again.
    heard_before_down: FastMap<NodeName, Duration>,
    /// Authentic, fresh datagrams received.
    heard: u64,
    /// Times this node learnt it was declared down and renewed its identity.
    rejoins: u64,
    phase: Phase,
    join_retry_pending: bool,
    /// The (suspicion, transmissions) foca currently runs with.
    scaled: (Duration, u8),
    /// Seed of foca's random choices (mixed with the bump when foca is recreated).
    rng_seed: u64,
    /// Members foca holds as suspect: (identity, incarnation) and since when (see
    /// [`Core::sweep_suspects`]).
    suspects: FastMap<SocketAddr, (NodeIdentity, u16, Duration, u32)>,
    /// Picks the member each digest goes to (and the members asked about a suspect).
    sync_rng: StdRng,
    /// The suspicions this node times itself (Lifeguard), by the suspect's address.
    suspicions: FastMap<SocketAddr, Suspicion>,
    /// Token of the next suspicion (matches verdicts to suspicions).
    next_token: u32,
    /// Inquiries this node serves: pings to a suspect on another member's behalf.
    relays: Vec<Relay>,
}

/// A suspicion this node times (see the module docs).
#[derive(Debug)]
struct Suspicion {
    id: NodeIdentity,
    incarnation: u16,
    /// Start; moved to the latest "reachable" verdict.
    since: Duration,
    /// Members whose probe on our behalf went unanswered (independent confirmations).
    confirmers: Vec<SocketAddr>,
    /// foca's own timer event when this node's probe failed (this node accused the member).
    accused: Option<Timer<NodeIdentity>>,
    token: u32,
    /// `Task::Suspicion` entries in the heap for it.
    pending: u32,
    /// Local health's stretch (score + 1) when the suspicion started: a member that recovers
    /// its health does not shorten the suspicions it started while unhealthy.
    stretch: u32,
}

/// An inquiry this node serves.
#[derive(Debug)]
struct Relay {
    requester: SocketAddr,
    token: u32,
    target: SocketAddr,
    bump: u64,
    nonce: u64,
    attempts: u32,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("identity", self.foca.identity())
            .field("phase", &self.phase)
            .field("live", &self.live.len())
            .finish_non_exhaustive()
    }
}

impl Core {
    /// A core for `settings`, sealing with `ring`, gossiping `meta` (its `node` must be
    /// `settings.node`; its version is managed by the core from here on).
    pub fn new(
        settings: GossipSettings,
        ring: KeyRing,
        meta: MemberMeta,
        metrics: GossipMetrics,
        now: Duration,
    ) -> Result<Core, GossipError> {
        let config = settings.timing.foca_config(1)?;
        if meta.node != settings.node {
            return Err(GossipError::WrongNode {
                expected: settings.node,
                got: meta.node,
            });
        }
        let identity = NodeIdentity {
            node: settings.node.as_str().into(),
            addr: settings.addr,
            bump: settings.bump,
        };
        let stream = SealStream::new(sender_id(settings.addr), settings.bump)
            .map_err(GossipError::Envelope)?;
        let book = SharedBook::default();
        let foca = foca::Foca::with_custom_broadcast(
            identity,
            config,
            StdRng::seed_from_u64(settings.rng_seed),
            PostcardCodec,
            MetaBroadcasts::new(book.clone()),
        );
        let mut own = meta;
        own.version = own.version.max(1);
        let mut core = Core {
            foca,
            codec: PostcardCodec,
            wire: Wire {
                ring,
                stream,
                replay: ReplayGuard::default(),
                peer_keys: FastMap::default(),
                offered: FastMap::default(),
                metrics,
                timers: TimerHeap::default(),
                outbox: Vec::new(),
                notes: Vec::new(),
                scratch: Vec::with_capacity(2048),
                health: LocalHealth::new(settings.timing.health_max),
                probe_started: false,
                probe_failed: false,
                incarnation: 0,
                accusations: Vec::new(),
            },
            seeds: settings
                .seeds
                .into_iter()
                .filter(|s| *s != settings.addr)
                .collect(),
            timing: settings.timing,
            changes: Vec::new(),
            book,
            own: own.clone(),
            own_record: Vec::new(),
            live: LiveSet::new(),
            members: FastMap::default(),
            members_version: 0,
            digest: RunningDigest::default(),
            by_node: FastMap::default(),
            missing_meta: BTreeSet::new(),
            last_heard: FastMap::default(),
            heard_before_down: FastMap::default(),
            heard: 0,
            rejoins: 0,
            phase: Phase::Joining,
            join_retry_pending: false,
            scaled: (Duration::ZERO, 0),
            suspects: FastMap::default(),
            sync_rng: StdRng::seed_from_u64(settings.rng_seed ^ 0x5359_4e43),
            rng_seed: settings.rng_seed,
            suspicions: FastMap::default(),
            next_token: 0,
            relays: Vec::new(),
        };
        core.scaled = core.timing.scaled(1);
        core.publish_own_record()?;
        core.wire.metrics.set_members(0, 0, 0);
        core.wire.metrics.set_health(0);
        core.live.upsert(own.clone());
        core.changes.push(LiveChange::Up(own.node));
        core.schedule_join_retry(now);
        core.wire
            .timers
            .push(now + core.timing.meta_refresh, Task::MetaRefresh);
        core.wire
            .timers
            .push(now + HOUSEKEEPING_PERIOD, Task::Housekeeping);
        core.wire
            .timers
            .push(now + core.timing.suspect_to_down_after, Task::SuspectSweep);
        if !core.timing.sync_period.is_zero() {
            core.wire
                .timers
                .push(now + core.timing.sync_period, Task::Sync);
        }
        core.handle_due_timers(now);
        Ok(core)
    }

    /// The current identity (changes when the node renews itself).
    pub fn identity(&self) -> &NodeIdentity {
        self.foca.identity()
    }

    /// The identities of the alive members (this node excluded): who is who on the wire, for
    /// the owner watch, which addresses members directly.
    pub fn member_identities(&self) -> impl Iterator<Item = &NodeIdentity> {
        self.members.values()
    }

    /// Grows with every change to [`Core::member_identities`] (a member up, down or renewed).
    pub fn members_version(&self) -> u64 {
        self.members_version
    }

    /// The alive members and their metadata, this node included.
    pub fn live(&self) -> &LiveSet {
        &self.live
    }

    /// Where the node is in its life in the cluster.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// How many authentic, fresh datagrams this node has received (the driver's sign that it
    /// hears the cluster again after a pause).
    pub fn heard(&self) -> u64 {
        self.heard
    }

    /// How many times this node learnt it was declared down and renewed its identity (the
    /// driver's sign that the cluster moved its addresses while it was paused).
    pub fn rejoins(&self) -> u64 {
        self.rejoins
    }

    /// The timings this core runs with.
    pub fn timing(&self) -> &Timing {
        &self.timing
    }

    /// The metrics this core counts into.
    pub fn metrics(&self) -> &GossipMetrics {
        &self.wire.metrics
    }

    /// When `node`, declared down or gone (it left), was last heard from: the last datagram from
    /// its address that opened here, on the core's clock. `None` while it is alive, and when no
    /// datagram of it ever reached this node directly (it was known through the gossip only).
    /// The new owner of its IPs times the failover from here.
    pub fn last_heard_before_down(&self, node: &str) -> Option<Duration> {
        self.heard_before_down.get(node).copied()
    }

    /// This node's own metadata, as last published.
    pub fn own_meta(&self) -> &MemberMeta {
        &self.own
    }

    /// Replaces the seeds (the Kubernetes mode learns its peers from the speaker Pods as they
    /// come and go). Each new seed that is not a member yet is announced to at once, so a peer
    /// that appears is joined without waiting for a retry; seeds that went away are simply no
    /// longer announced to (members are left to the protocol). Our own address is ignored.
    pub fn set_seeds(&mut self, now: Duration, seeds: Vec<SocketAddr>) {
        let own = self.foca.identity().addr;
        let mut next: Vec<SocketAddr> = seeds.into_iter().filter(|s| *s != own).collect();
        next.sort();
        next.dedup();
        let fresh: Vec<SocketAddr> = next
            .iter()
            .filter(|s| !self.seeds.contains(s) && !self.members.contains_key(*s))
            .copied()
            .collect();
        self.seeds = next;
        for seed in fresh {
            let mut io = self.wire.at(now);
            if let Err(err) = self.foca.announce(NodeIdentity::seed(seed), &mut io) {
                tracing::debug!(error = %err, "announce to a new seed");
            }
        }
        if self.phase == Phase::Joining && !self.seeds.is_empty() {
            self.schedule_join_retry(now + self.timing.join_retry);
        }
        self.settle(now);
    }

    /// Replaces the key ring (key rotation): the new ring's first key seals from now on.
    pub fn set_key_ring(&mut self, ring: KeyRing) {
        self.wire.ring = ring;
    }

    /// foca's view of the members named `node` (identity, incarnation, state), for debugging.
    pub fn debug_member(&self, node: &str) -> Vec<String> {
        self.foca
            .iter_membership_state()
            .filter(|m| m.id().node == node)
            .map(|m| format!("{:?} inc {} {:?}", m.id(), m.incarnation(), m.state()))
            .collect()
    }

    /// When [`Core::handle_due_timers`] should be called next.
    pub fn next_deadline(&self) -> Option<Duration> {
        self.wire.timers.heap.peek().map(|s| s.at)
    }

    /// Takes the datagrams queued for sending, in order.
    pub fn drain_outgoing(&mut self) -> std::vec::Drain<'_, Outgoing> {
        self.wire.outbox.drain(..)
    }

    /// Takes the changes to the [`LiveSet`] since the last call, in order.
    pub fn drain_changes(&mut self) -> std::vec::Drain<'_, LiveChange> {
        self.changes.drain(..)
    }

    /// Handles one received datagram (opened in place, hence `&mut`).
    pub fn handle_datagram(&mut self, now: Duration, from: SocketAddr, datagram: &mut [u8]) {
        self.wire.metrics.packet(Direction::In, datagram.len());
        if self.phase == Phase::Left {
            return;
        }
        if from == self.foca.identity().addr {
            self.wire.metrics.rejected(RejectReason::FromSelf);
            return;
        }
        let opened = match self.wire.ring.open_envelope(datagram) {
            Ok(opened) => opened,
            Err(err) => {
                self.wire.metrics.rejected(RejectReason::envelope(&err));
                return;
            }
        };
        // Authentic from here on; the sequence decides whether it is new.
        if opened.sequence.sender == self.wire.stream.sender() {
            self.wire.metrics.rejected(RejectReason::FromSelf);
            return;
        }
        if let Err(replay) = self.wire.replay.admit(opened.sequence, now) {
            tracing::trace!(%from, verdict = replay.as_str(), "gossip replay dropped");
            self.wire.metrics.rejected(RejectReason::Replay);
            return;
        }
        let payload = opened.payload;
        self.heard += 1;
        self.last_heard.insert(from, now);
        self.wire.peer_keys.insert(from, opened.key_id);
        match GossipMessage::parse(payload) {
            Ok(message) => self.handle_message(now, from, message),
            Err(err) => {
                tracing::trace!(%from, error = %err, "gossip payload dropped");
                self.wire.metrics.rejected(RejectReason::Decode);
            }
        }
        self.settle(now);
    }

    /// Acts on one authentic, fresh payload.
    fn handle_message(&mut self, now: Duration, from: SocketAddr, message: GossipMessage<'_>) {
        match message {
            GossipMessage::Foca(body) => self.handle_foca_packet(now, body),
            GossipMessage::Meta(body) => match MetaRecord::decode(body) {
                Ok(record) => {
                    self.book.lock().offer(record);
                }
                Err(_) => self.wire.metrics.rejected(RejectReason::Metadata),
            },
            GossipMessage::MetaPull => self.send_own_record(from),
            GossipMessage::Sync { echo, digest } => self.answer_digest(from, &digest.into(), echo),
            GossipMessage::Inquire { token, suspect } => {
                self.answer_inquiry(now, from, token, suspect)
            }
            GossipMessage::Ping { nonce, bump } => {
                if bump == self.foca.identity().bump {
                    self.seal(from, &GossipMessage::Pong { nonce });
                }
            }
            GossipMessage::Pong { nonce } => self.relay_answered(from, nonce),
            GossipMessage::Verdict { token, verdict } => self.verdict(now, from, token, verdict),
        }
    }

    fn handle_foca_packet(&mut self, now: Duration, body: &[u8]) {
        let mut peek = body;
        if let Ok(header) = self.codec.decode_header(&mut peek)
            && header.message == Message::Announce
            && self.holds_as_down(&header.src)
            && {
                let (alive, down) = self.alive_and_down();
                alive >= down
            }
        {
            self.send_turn_undead(header.src);
        }
        let mut io = self.wire.at(now);
        match self.foca.handle_data(body, &mut io) {
            Ok(()) => {}
            Err(foca::Error::DataFromOurselves) => {
                self.wire.metrics.rejected(RejectReason::FromSelf)
            }
            Err(foca::Error::Decode(_) | foca::Error::MalformedPacket) => {
                self.wire.metrics.rejected(RejectReason::Decode)
            }
            Err(foca::Error::CustomBroadcast(_)) => {
                self.wire.metrics.rejected(RejectReason::Metadata)
            }
            Err(_) => self.wire.metrics.rejected(RejectReason::Protocol),
        }
    }

    fn holds_as_down(&self, id: &NodeIdentity) -> bool {
        self.foca
            .iter_membership_state()
            .any(|m| m.state() == State::Down && m.id() == id)
    }

    /// How many members this node holds alive (itself included) and down (not counting an old
    /// identity of a member alive under a newer one).
    ///
    /// After a partition heals, each side holds the other as down. A node whose alive count is
    /// at least its down count answers the other side's announces with "you are down" (so that
    /// side renews); a node whose down count is at least its alive count, when it learns it was
    /// declared down, was the one cut off and starts afresh ([`Core::restart_foca`]). In a
    /// two-node cluster both hold when each side is one node; anywhere else the larger side
    /// stays as it is and the smaller side rejoins it.
    fn alive_and_down(&self) -> (usize, usize) {
        let down = self
            .foca
            .iter_membership_state()
            .filter(|m| m.state() == State::Down && !self.members.contains_key(&m.id().addr))
            .count();
        (self.members.len() + 1, down)
    }

    /// Tells `to` that we hold it as down, as foca's `notify_down_members` would, but only in
    /// answer to an announce: it then renews its identity and rejoins.
    fn send_turn_undead(&mut self, to: NodeIdentity) {
        let header = Header {
            src: self.foca.identity().clone(),
            src_incarnation: 0,
            dst: to.clone(),
            message: Message::TurnUndead,
        };
        let mut body = Vec::with_capacity(128);
        if self.codec.encode_header(&header, &mut body).is_ok() {
            self.seal(to.addr, &GossipMessage::Foca(&body));
        }
    }

    /// Tells a member our probe of it just failed, with a foca gossip message carrying the one
    /// update "you are suspect". SWIM lets the suspect learn this from the gossip, which in a
    /// large cluster takes several rounds; told at once, it refutes (raises its incarnation)
    /// while the suspicion is still spreading, so short suspicion timeouts stay safe under loss.
    /// (Lifeguard's "buddy system" does the same by piggybacking the suspicion on the
    /// next ping to the suspect; foca has no such extension.)
    fn send_suspicion_notice(&mut self, member: NodeIdentity) {
        let Some(incarnation) = self
            .foca
            .iter_membership_state()
            .find(|m| m.id() == &member)
            .filter(|m| m.state() != State::Down)
            .map(|m| m.incarnation())
        else {
            return;
        };
        let update = foca::Member::new(member.clone(), incarnation, State::Suspect);
        self.send_updates(member, &[update], 1);
    }

    /// Sends `updates` to `to` as foca gossip messages (foca applies them as it applies the
    /// updates any message piggybacks), packed into at most `max_datagrams` datagrams of at
    /// most the configured packet size; what does not fit is not sent. Returns how many updates
    /// went out.
    fn send_updates(
        &mut self,
        to: NodeIdentity,
        updates: &[foca::Member<NodeIdentity>],
        max_datagrams: usize,
    ) -> usize {
        let header = Header {
            src: self.foca.identity().clone(),
            src_incarnation: 0,
            dst: to.clone(),
            message: Message::Gossip,
        };
        let mut head = Vec::with_capacity(128);
        if self.codec.encode_header(&header, &mut head).is_err() {
            return 0;
        }
        let limit = self.timing.max_packet_size;
        let (mut sent, mut datagrams) = (0, 0);
        let mut packed = Vec::with_capacity(limit);
        let mut count: u16 = 0;
        let mut one = Vec::with_capacity(128);
        for update in updates {
            one.clear();
            // An update that does not encode, or is larger than a packet on its own, is skipped.
            if self.codec.encode_member(update, &mut one).is_err()
                || head.len() + 2 + one.len() > limit
            {
                continue;
            }
            if head.len() + 2 + packed.len() + one.len() > limit || count == u16::MAX {
                self.seal_updates(to.addr, &head, count, &packed);
                sent += usize::from(count);
                datagrams += 1;
                packed.clear();
                count = 0;
                if datagrams == max_datagrams {
                    return sent;
                }
            }
            packed.extend_from_slice(&one);
            count += 1;
        }
        if count > 0 && datagrams < max_datagrams {
            self.seal_updates(to.addr, &head, count, &packed);
            sent += usize::from(count);
        }
        sent
    }

    /// Seals one foca message: `head`, then `count` and the `packed` updates.
    fn seal_updates(&mut self, to: SocketAddr, head: &[u8], count: u16, packed: &[u8]) {
        let mut body = Vec::with_capacity(head.len() + 2 + packed.len());
        body.extend_from_slice(head);
        body.extend_from_slice(&count.to_be_bytes());
        body.extend_from_slice(packed);
        self.seal(to, &GossipMessage::Foca(&body));
    }

    /// The digest of the members this node holds alive, itself included.
    fn digest(&self, bits: u8) -> Digest {
        self.digest.digest(bits, self.foca.identity())
    }

    /// Holds `id` alive at its address (replacing whoever was held there).
    fn hold_member(&mut self, id: NodeIdentity) {
        self.members_version += 1;
        self.digest.toggle(&id);
        if let Some(previous) = self.members.insert(id.addr, id) {
            self.digest.toggle(&previous);
        }
    }

    /// Stops holding the member at `addr`.
    fn drop_member(&mut self, addr: &SocketAddr) {
        if let Some(previous) = self.members.remove(addr) {
            self.members_version += 1;
            self.digest.toggle(&previous);
        }
    }

    /// Sends our digest to one random alive member (see [`super::sync`]).
    fn start_sync(&mut self) {
        if self.members.is_empty() || self.phase != Phase::Active {
            return;
        }
        // Picked in foca's member order, not the hash map's, so a seeded run repeats itself.
        let pick = self.sync_rng.random_range(0..self.members.len());
        let members = &self.members;
        let Some(to) = self
            .foca
            .iter_membership_state()
            .map(|m| m.id())
            .filter(|id| members.get(&id.addr) == Some(*id))
            .nth(pick)
            .map(|id| id.addr)
        else {
            return;
        };
        let digest = self.digest(Digest::bits_for(self.members.len() + 1)).wire();
        self.seal(to, &GossipMessage::Sync { echo: true, digest });
    }

    /// Answers a member's digest: the members we hold alive in every bucket that differs, and
    /// our own digest when asked for and different.
    fn answer_digest(&mut self, from: SocketAddr, theirs: &Digest, echo: bool) {
        // Only a member we hold alive can be addressed (foca takes gossip only for its current
        // identity); an unknown sender is learned from the gossip and syncs later.
        let Some(peer) = self.members.get(&from).cloned() else {
            return;
        };
        let ours = self.digest(theirs.bits());
        let mask = ours.differing(theirs);
        if mask == 0 {
            return;
        }
        let members = &self.members;
        let updates: Vec<foca::Member<NodeIdentity>> = self
            .foca
            .iter_membership_state()
            .filter(|m| {
                // Alive members only: a suspicion travels with the gossip and its refutation;
                // repeated here it reached members that had already settled it (measured: 326
                // false downs in 600 s at 5 % loss with 100 members, none without).
                m.state() == State::Alive
                    && m.id() != &peer
                    && members.get(&m.id().addr) == Some(m.id())
                    && ours.in_mask(mask, m.id())
            })
            .map(|m| foca::Member::new(m.id().clone(), m.incarnation(), m.state()))
            .collect();
        let sent = self.send_updates(peer, &updates, SYNC_MAX_DATAGRAMS);
        self.wire.metrics.sync_updates(sent);
        if echo {
            let digest = ours.wire();
            self.seal(
                from,
                &GossipMessage::Sync {
                    echo: false,
                    digest,
                },
            );
        }
    }

    fn seal(&mut self, to: SocketAddr, message: &GossipMessage<'_>) {
        self.wire.seal(to, message);
    }

    /// Sends our metadata record to `to`.
    fn send_own_record(&mut self, to: SocketAddr) {
        let record = std::mem::take(&mut self.own_record);
        self.seal(to, &GossipMessage::Meta(&record));
        self.own_record = record;
    }

    /// Runs every timer due at `now`, in deadline order.
    pub fn handle_due_timers(&mut self, now: Duration) {
        let mut late = false;
        while let Some((at, task)) = self.wire.timers.pop_due(now) {
            if self.phase == Phase::Left {
                continue;
            }
            // Scheduled late (a starved or paused process): count it against ourselves once.
            if !late && now.saturating_sub(at) > self.timing.probe_period {
                late = true;
                self.wire.health(1);
            }
            match task {
                Task::Foca(timer) => {
                    let probe = matches!(timer, Timer::ProbeRandomMember(_));
                    let started = std::mem::take(&mut self.wire.probe_started);
                    self.wire.probe_failed = false;
                    let mut io = self.wire.at(now);
                    if let Err(err) = self.foca.handle_timer(timer, &mut io) {
                        tracing::debug!(error = %err, "foca timer");
                    }
                    // The suspicion a failed probe starts is timed with the health from before
                    // that failure counts.
                    if !self.wire.accusations.is_empty() {
                        self.take_accusations(now);
                    }
                    if probe && self.wire.probe_failed {
                        self.wire.health(1);
                    } else if probe && started {
                        self.wire.health(-1);
                    }
                    self.wire.probe_started |= started && !probe;
                }
                Task::Suspicion(addr) => self.suspicion_due(now, addr),
                Task::Relay(nonce) => self.relay_ping(now, nonce),
                Task::JoinRetry => {
                    self.join_retry_pending = false;
                    if self.phase == Phase::Joining {
                        self.announce_to_seeds(now);
                        self.schedule_join_retry(now + self.timing.join_retry);
                    }
                }
                Task::MetaRefresh => {
                    self.offer_own_record();
                    self.wire
                        .timers
                        .push(now + self.timing.meta_refresh, Task::MetaRefresh);
                }
                Task::Housekeeping => {
                    self.housekeeping(now);
                    self.wire
                        .timers
                        .push(now + HOUSEKEEPING_PERIOD, Task::Housekeeping);
                }
                Task::SuspectSweep => {
                    self.sweep_suspects(now);
                    self.wire
                        .timers
                        .push(now + self.timing.suspect_to_down_after, Task::SuspectSweep);
                }
                Task::Sync => {
                    self.start_sync();
                    self.wire
                        .timers
                        .push(now + self.timing.sync_period, Task::Sync);
                }
            }
            self.settle(now);
        }
    }

    fn schedule_join_retry(&mut self, at: Duration) {
        if !self.join_retry_pending {
            self.join_retry_pending = true;
            self.wire.timers.push(at, Task::JoinRetry);
        }
    }

    fn announce_to_seeds(&mut self, now: Duration) {
        for i in 0..self.seeds.len() {
            let seed = NodeIdentity::seed(self.seeds[i]);
            let mut io = self.wire.at(now);
            if let Err(err) = self.foca.announce(seed, &mut io) {
                tracing::debug!(error = %err, "announce");
            }
        }
    }

    /// Settles suspicions this node only heard about, which foca would otherwise hold forever.
    ///
    /// foca starts the suspicion timer only on the member whose probe failed; the others learn
    /// the suspicion, and then the refutation or the death, from the gossip. A member that
    /// missed every copy (heavy loss) would hold the suspect until its own probe reached it, up
    /// to n probe periods later. So a suspect held (same identity, same incarnation) for longer
    /// than `T = 2 x suspicion + probe period` is asked directly: it is told it is suspected
    /// (so it refutes) and announced to (its reply carries its current incarnation, which clears
    /// the suspicion here), once per sweep. One that has not answered `SUSPECT_MAX_ASKS` asks
    /// and `SUSPECT_EXPIRE_AFTER` is declared down.
    fn sweep_suspects(&mut self, now: Duration) {
        let patience = (self.scaled.0 * 2 + self.timing.probe_period).max(SUSPECT_PATIENCE_MIN);
        let inquire_after = self.scaled.0 + self.timing.probe_period;
        let mut held = FastMap::with_capacity_and_hasher(self.suspects.len(), Default::default());
        let mut ask = Vec::new();
        let mut expired = Vec::new();
        let mut inquire = Vec::new();
        for member in self.foca.iter_membership_state() {
            if member.state() != State::Suspect {
                continue;
            }
            let id = member.id();
            let (since, mut asks) = match self.suspects.get(&id.addr) {
                Some((known, incarnation, since, asks))
                    if known == id && *incarnation == member.incarnation() =>
                {
                    (*since, *asks)
                }
                _ => (now, 0),
            };
            let timed = self
                .suspicions
                .get(&id.addr)
                .is_some_and(|s| s.id == *id && s.incarnation == member.incarnation());
            if !timed && now.saturating_sub(since) >= inquire_after {
                inquire.push((id.clone(), member.incarnation(), since));
            }
            if now.saturating_sub(since) >= patience {
                if asks >= SUSPECT_MAX_ASKS && now.saturating_sub(since) >= SUSPECT_EXPIRE_AFTER {
                    expired.push(foca::Member::new(
                        id.clone(),
                        member.incarnation(),
                        State::Down,
                    ));
                    continue;
                }
                asks += 1;
                ask.push(id.clone());
            }
            held.insert(id.addr, (id.clone(), member.incarnation(), since, asks));
        }
        self.suspects = held;
        // Suspicions that ended while no timer of theirs was pending: count how they ended.
        let ended: Vec<SocketAddr> = self
            .suspicions
            .iter()
            .filter(|(addr, s)| {
                s.pending == 0
                    && !self
                        .suspects
                        .get(*addr)
                        .is_some_and(|(id, inc, ..)| *id == s.id && *inc == s.incarnation)
            })
            .map(|(addr, _)| *addr)
            .collect();
        for addr in ended {
            if let Some(s) = self.suspicions.remove(&addr) {
                self.count_outcome(&s);
            }
        }
        for (id, incarnation, since) in inquire {
            self.start_suspicion(since, id, incarnation, None);
        }
        for id in ask {
            self.send_suspicion_notice(id.clone());
            let mut io = self.wire.at(now);
            if let Err(err) = self.foca.announce(id, &mut io) {
                tracing::debug!(error = %err, "announce to a lingering suspect");
            }
        }
        if expired.is_empty() {
            return;
        }
        let mut io = self.wire.at(now);
        if let Err(err) = self.foca.apply_many(expired.into_iter(), true, &mut io) {
            tracing::debug!(error = %err, "suspicion timeout");
        }
    }

    /// Starts timing the suspicions foca asked a timer for (our own probe failed).
    fn take_accusations(&mut self, now: Duration) {
        for (id, incarnation, timer) in std::mem::take(&mut self.wire.accusations) {
            if let Some(s) = self.suspicions.get_mut(&id.addr)
                && s.id == id
                && s.incarnation == incarnation
            {
                s.accused.get_or_insert(timer);
                continue;
            }
            self.start_suspicion(now, id, incarnation, Some(timer));
        }
    }

    /// Times a suspicion of `id` at `incarnation` from `since` and asks members to probe it.
    fn start_suspicion(
        &mut self,
        since: Duration,
        id: NodeIdentity,
        incarnation: u16,
        accused: Option<Timer<NodeIdentity>>,
    ) {
        if let Some(previous) = self.suspicions.remove(&id.addr) {
            self.count_outcome(&previous);
        }
        self.next_token = self.next_token.wrapping_add(1);
        let token = self.next_token;
        let addr = id.addr;
        self.suspicions.insert(
            addr,
            Suspicion {
                id: id.clone(),
                incarnation,
                since,
                confirmers: Vec::new(),
                accused,
                token,
                pending: 0,
                stretch: self.wire.health.score() + 1,
            },
        );
        self.schedule_suspicion(addr);
        self.send_inquiries(&id, incarnation, token);
    }

    /// When the suspicion of the member at `addr` ends, as things stand.
    fn suspicion_deadline(&self, s: &Suspicion) -> Duration {
        let min = self.scaled.0;
        let max = min.saturating_mul(self.timing.suspicion_max_mult);
        let confirmations = u32::try_from(s.confirmers.len()).unwrap_or(u32::MAX);
        let timeout = suspicion_timeout(confirmations, self.wanted_confirmations(), min, max);
        // Where no confirmations are wanted (a small cluster), nothing else tells a lone
        // observer's lossy link from a crash either: the suspicion keeps its shortest, unstretched,
        // as in plain SWIM.
        let stretch = if self.wanted_confirmations() == 0 {
            1
        } else {
            s.stretch.max(self.wire.health.score() + 1)
        };
        s.since + timeout.saturating_mul(stretch)
    }

    /// How many independent confirmations shrink a suspicion to its shortest, with the members
    /// this node knows (see [`wanted_confirmations`]).
    fn wanted_confirmations(&self) -> u32 {
        wanted_confirmations(self.timing.suspicion_confirmations, self.members.len())
    }

    fn schedule_suspicion(&mut self, addr: SocketAddr) {
        let Some(at) = self
            .suspicions
            .get(&addr)
            .map(|s| self.suspicion_deadline(s))
        else {
            return;
        };
        if let Some(s) = self.suspicions.get_mut(&addr) {
            s.pending += 1;
        }
        self.wire.timers.push(at, Task::Suspicion(addr));
    }

    /// A suspicion's timer fired: end it if it is due and still stands.
    fn suspicion_due(&mut self, now: Duration, addr: SocketAddr) {
        let Some(s) = self.suspicions.get_mut(&addr) else {
            return;
        };
        s.pending = s.pending.saturating_sub(1);
        let s = &self.suspicions[&addr];
        let stands = self.foca.iter_membership_state().any(|m| {
            m.id() == &s.id && m.state() == State::Suspect && m.incarnation() == s.incarnation
        });
        if !stands {
            if s.pending == 0
                && let Some(s) = self.suspicions.remove(&addr)
            {
                self.count_outcome(&s);
            }
            return;
        }
        let deadline = self.suspicion_deadline(s);
        let s = self.suspicions.get_mut(&addr).expect("looked up above");
        if now < deadline {
            if s.pending == 0 {
                self.schedule_suspicion(addr);
            }
            return;
        }
        if s.accused.is_none() && s.confirmers.is_empty() && self.wanted_confirmations() > 0 {
            // Heard of through the gossip and confirmed by nobody: not ours to end; the sweep
            // keeps asking the suspect.
            return;
        }
        let Some(s) = self.suspicions.remove(&addr) else {
            return;
        };
        let outcome = if s.confirmers.is_empty() {
            SuspicionOutcome::Expired
        } else {
            SuspicionOutcome::Confirmed
        };
        self.wire.metrics.suspicion(outcome);
        let mut io = self.wire.at(now);
        let result = match s.accused {
            Some(timer) => self.foca.handle_timer(timer, &mut io),
            None => self.foca.apply_many(
                std::iter::once(foca::Member::new(s.id, s.incarnation, State::Down)),
                true,
                &mut io,
            ),
        };
        if let Err(err) = result {
            tracing::debug!(error = %err, "suspicion timeout");
        }
    }

    /// Counts how a suspicion this node timed ended without this node ending it.
    fn count_outcome(&self, s: &Suspicion) {
        let refuted = self.foca.iter_membership_state().any(|m| {
            m.id().addr == s.id.addr
                && m.state() != State::Down
                && (m.id() != &s.id || m.incarnation() > s.incarnation)
        });

        self.wire.metrics.suspicion(if refuted {
            SuspicionOutcome::Refuted
        } else {
            SuspicionOutcome::Confirmed
        });
    }

    /// Asks a few random alive members (not the suspect) to probe the suspect for us.
    fn send_inquiries(&mut self, id: &NodeIdentity, incarnation: u16, token: u32) {
        let want = self.timing.suspicion_inquiries;
        if want == 0 {
            return;
        }
        let members = &self.members;
        let mut candidates: Vec<SocketAddr> = self
            .foca
            .iter_membership_state()
            .filter(|m| {
                m.state() == State::Alive
                    && m.id().addr != id.addr
                    && members.get(&m.id().addr) == Some(m.id())
            })
            .map(|m| m.id().addr)
            .collect();
        let mut suspect = Vec::with_capacity(96);
        let update = foca::Member::new(id.clone(), incarnation, State::Suspect);
        if self.codec.encode_member(&update, &mut suspect).is_err() {
            return;
        }
        let inquiry = GossipMessage::Inquire {
            token,
            suspect: &suspect,
        };
        for _ in 0..want.min(candidates.len()) {
            let pick = self.sync_rng.random_range(0..candidates.len());
            let to = candidates.swap_remove(pick);
            self.seal(to, &inquiry);
        }
    }

    /// Serves a member's inquiry about a suspect: what we hold when it is news to the
    /// inquirer, else pings to the suspect and a verdict.
    fn answer_inquiry(&mut self, now: Duration, from: SocketAddr, token: u32, mut suspect: &[u8]) {
        let Some(requester) = self.members.get(&from).cloned() else {
            return;
        };
        let Ok(accused) = Codec::<NodeIdentity>::decode_member(&mut self.codec, &mut suspect)
        else {
            self.wire.metrics.rejected(RejectReason::Decode);
            return;
        };
        let id = accused.id();
        if id.addr == self.foca.identity().addr {
            // About ourselves: we are alive; refute at once.
            if id == self.foca.identity() {
                let mut io = self.wire.at(now);
                let suspect = std::iter::once(accused.clone());
                if let Err(err) = self.foca.apply_many(suspect, true, &mut io) {
                    tracing::debug!(error = %err, "refuting an inquiry about ourselves");
                }
            }
            self.send_verdict(from, token, Verdict::Reachable);
            return;
        }
        let news = self
            .foca
            .iter_membership_state()
            .find(|m| m.id().addr == id.addr)
            .filter(|m| {
                if m.id() == id {
                    m.state() == State::Down || m.incarnation() > accused.incarnation()
                } else {
                    m.id().bump > id.bump
                }
            })
            .map(|m| foca::Member::new(m.id().clone(), m.incarnation(), m.state()));
        if let Some(news) = news {
            self.send_updates(requester, &[news], 1);
            return;
        }
        if self.relays.len() >= MAX_RELAYS {
            return;
        }
        let nonce = self.sync_rng.random::<u64>();
        self.relays.push(Relay {
            requester: from,
            token,
            target: id.addr,
            bump: id.bump,
            nonce,
            attempts: 0,
        });
        self.relay_ping(now, nonce);
    }

    /// Pings the suspect of an inquiry again, or answers "unreachable" after the last ping.
    fn relay_ping(&mut self, now: Duration, nonce: u64) {
        let Some(at) = self.relays.iter().position(|r| r.nonce == nonce) else {
            return;
        };
        let relay = &mut self.relays[at];
        if relay.attempts >= RELAY_ATTEMPTS {
            let relay = self.relays.swap_remove(at);
            // An unhealthy member's silence is no evidence: it confirms nothing.
            if self.wire.health.score() == 0 {
                self.send_verdict(relay.requester, relay.token, Verdict::Unreachable);
            }
            return;
        }
        relay.attempts += 1;
        let ping = GossipMessage::Ping {
            nonce,
            bump: relay.bump,
        };
        let target = relay.target;
        self.seal(target, &ping);
        let wait = self.wire.health.scale(self.timing.probe_rtt);
        self.wire.timers.push(now + wait, Task::Relay(nonce));
    }

    /// The suspect of an inquiry answered our ping.
    fn relay_answered(&mut self, from: SocketAddr, nonce: u64) {
        let Some(at) = self
            .relays
            .iter()
            .position(|r| r.nonce == nonce && r.target == from)
        else {
            return;
        };
        let relay = self.relays.swap_remove(at);
        self.send_verdict(relay.requester, relay.token, Verdict::Reachable);
    }

    fn send_verdict(&mut self, to: SocketAddr, token: u32, verdict: Verdict) {
        self.seal(to, &GossipMessage::Verdict { token, verdict });
    }

    /// A member's verdict on one of our inquiries.
    fn verdict(&mut self, now: Duration, from: SocketAddr, token: u32, verdict: Verdict) {
        if !self.members.contains_key(&from) {
            return;
        }
        let Some((&addr, s)) = self.suspicions.iter_mut().find(|(_, s)| s.token == token) else {
            return;
        };
        match verdict {
            Verdict::Unreachable => {
                if from == addr || s.confirmers.contains(&from) {
                    return;
                }
                s.confirmers.push(from);
            }
            Verdict::Reachable => {
                // Someone reached it: start over at the longest, and tell it so it refutes.
                s.since = now;
                s.confirmers.clear();
                let id = s.id.clone();
                self.send_suspicion_notice(id);
            }
        }
        self.schedule_suspicion(addr);
    }

    fn housekeeping(&mut self, now: Duration) {
        let (mut alive, mut suspect, mut down) = (0, 0, 0);
        for member in self.foca.iter_membership_state() {
            match member.state() {
                State::Alive => alive += 1,
                State::Suspect => suspect += 1,
                State::Down => down += 1,
            }
        }
        self.wire.metrics.set_members(alive, suspect, down);
        // Keys are remembered for members and seeds only, so the map stays as small as the
        // cluster (pruned once it holds more entries than that; at 1,000 members a sweep every
        // second on every member was a measurable share of the simulation).
        let (members, seeds) = (&self.members, &self.seeds);
        if self.wire.peer_keys.len() > members.len() + seeds.len() {
            self.wire
                .peer_keys
                .retain(|addr, _| members.contains_key(addr) || seeds.contains(addr));
        }
        if self.wire.offered.len() > members.len() + seeds.len() {
            self.wire
                .offered
                .retain(|addr, _| members.contains_key(addr) || seeds.contains(addr));
        }
        self.wire.replay.prune(now, self.members.len() + 1);
        // Ask alive members for records that neither their push nor the gossip brought.
        let missing: Vec<SocketAddr> = self
            .missing_meta
            .iter()
            .filter_map(|node| self.by_node.get(node).copied())
            .collect();
        for addr in missing {
            self.seal(addr, &GossipMessage::MetaPull);
        }
    }

    /// Replaces this node's metadata (everything but `version`, which the core bumps) and
    /// gossips it. Unchanged metadata is a no-op.
    pub fn set_meta(&mut self, now: Duration, meta: MemberMeta) -> Result<(), GossipError> {
        if meta.node != self.own.node {
            return Err(GossipError::WrongNode {
                expected: self.own.node.clone(),
                got: meta.node,
            });
        }
        let mut next = meta;
        next.version = self.own.version;
        if next == self.own {
            return Ok(());
        }
        next.version = self.own.version + 1;
        let previous = std::mem::replace(&mut self.own, next);
        if let Err(err) = self.publish_own_record() {
            self.own = previous;
            return Err(err);
        }
        self.live.remove(&self.own.node);
        self.live.upsert(self.own.clone());
        self.changes.push(LiveChange::Meta(self.own.node.clone()));
        self.settle(now);
        Ok(())
    }

    /// Leaves the cluster: a few members are told at once (their datagrams are queued now; send
    /// them before exiting). The core is inert afterwards.
    pub fn leave(&mut self, now: Duration) {
        if self.phase == Phase::Left {
            return;
        }
        let mut io = self.wire.at(now);
        if let Err(err) = self.foca.leave_cluster(&mut io) {
            tracing::debug!(error = %err, "leave");
        }
        self.phase = Phase::Left;
        self.wire.notes.clear();
        self.wire.timers.heap.clear();
    }

    /// Encodes our record under the current identity and hands it to foca's dissemination.
    fn publish_own_record(&mut self) -> Result<(), GossipError> {
        let record = MetaRecord {
            bump: self.foca.identity().bump,
            meta: self.own.clone(),
        };
        self.own_record = record.encode()?;
        self.foca
            .add_broadcast(&self.own_record)
            .map_err(|err| GossipError::Broadcast {
                node: self.own.node.clone(),
                reason: err.to_string(),
            })?;
        Ok(())
    }

    fn offer_own_record(&mut self) {
        if let Err(err) = self.publish_own_record() {
            tracing::warn!(error = %err, "own metadata record");
        }
    }

    /// Reacts to foca's notifications until there are none, then applies new metadata.
    fn settle(&mut self, now: Duration) {
        if !self.wire.accusations.is_empty() {
            self.take_accusations(now);
        }
        while !self.wire.notes.is_empty() {
            let notes = std::mem::take(&mut self.wire.notes);
            for note in notes {
                self.react(now, note);
            }
        }
        let changed = self.book.lock().take_changed();
        for node in changed {
            self.apply_record(&node);
        }
        self.rescale();
    }

    /// Re-applies the size-dependent timings when the member count moved them.
    fn rescale(&mut self) {
        let scaled = self.timing.scaled(self.members.len() + 1);
        if scaled == self.scaled {
            return;
        }
        match self.timing.foca_config(self.members.len() + 1) {
            Ok(config) => match self.foca.set_config(config) {
                Ok(()) => self.scaled = scaled,
                Err(err) => tracing::warn!(error = %err, "foca refused the rescaled timings"),
            },
            Err(err) => tracing::warn!(error = %err, "rescaled timings"),
        }
    }

    fn react(&mut self, now: Duration, note: OwnedNotification<NodeIdentity>) {
        match note {
            OwnedNotification::MemberUp(id) => {
                let node = id.node.to_string();
                self.heard_before_down.remove(&node);
                self.by_node.insert(node.clone(), id.addr);
                let addr = id.addr;
                self.hold_member(id);
                self.live.remove(&node);
                let mut placeholder = MemberMeta::new(node.clone());
                placeholder.version = 0;
                self.live.upsert(placeholder);
                self.missing_meta.insert(node.clone());
                self.changes.push(LiveChange::Up(node.clone()));
                self.apply_record(&node);
                // Push our record to the newcomer: the gossip only carries records that are
                // new to the whole cluster.
                self.send_own_record(addr);
            }
            OwnedNotification::MemberDown(id) => {
                // Only the identity we hold at that address goes down: a late down of an older
                // identity (the member has renewed since) must not remove the living member.
                if self.members.get(&id.addr) != Some(&id) {
                    return;
                }
                self.drop_member(&id.addr);
                if self.by_node.get(id.node.as_str()) == Some(&id.addr) {
                    self.by_node.remove(id.node.as_str());
                }
                self.missing_meta.remove(id.node.as_str());
                self.live.remove(&id.node);
                // Detection time as seen from here: since the first sign of the failure this
                // node has, the suspicion it held or the last datagram it heard from the member,
                // whichever is later (in a large cluster a member may not have written to us for
                // seconds before it failed, so the last datagram alone overstates).
                let heard = self.last_heard.remove(&id.addr);
                let suspected = self
                    .suspects
                    .get(&id.addr)
                    .filter(|(held, ..)| *held == id)
                    .map(|(_, _, since, _)| *since);
                match heard {
                    Some(at) => self.heard_before_down.insert(id.node.to_string(), at),
                    None => self.heard_before_down.remove(id.node.as_str()),
                };
                let since = heard.max(suspected);
                self.wire
                    .metrics
                    .member_down(since.map(|t| now.saturating_sub(t).as_secs_f64()));
                self.changes.push(LiveChange::Down(id.node.to_string()));
            }
            OwnedNotification::Rename(_, new) => {
                if self.members.contains_key(&new.addr) {
                    self.hold_member(new.clone());
                    // The renewed member re-gossips its record; until it arrives the old one
                    // stays, and housekeeping asks for it if the gossip does not bring it.
                    let fresh = self
                        .book
                        .lock()
                        .get(&new.node)
                        .is_some_and(|record| record.written_by(&new));
                    if !fresh {
                        self.missing_meta.insert(new.node.to_string());
                    }
                    self.apply_record(&new.node);
                }
            }
            OwnedNotification::Active => self.phase = Phase::Active,
            OwnedNotification::Idle => {
                if self.phase != Phase::Left {
                    self.phase = Phase::Joining;
                    self.schedule_join_retry(now);
                }
            }
            OwnedNotification::Rejoin(id) => {
                self.rejoins += 1;
                tracing::info!(
                    bump = id.bump,
                    "declared down; rejoining under a renewed identity"
                );
                let (alive, down) = self.alive_and_down();
                if down >= alive {
                    self.restart_foca(now, id);
                }
                self.unsettle_own();
                self.offer_own_record();
            }
            OwnedNotification::ProbeFailed(_, member) => {
                if self.timing.notify_suspects {
                    self.send_suspicion_notice(member);
                }
            }
            OwnedNotification::DataReceived(_) | OwnedNotification::DataSent(_) => {}
            OwnedNotification::Defunct => {
                if self.phase != Phase::Left {
                    tracing::warn!("identity declared down and not renewed");
                }
            }
        }
    }

    /// Replaces foca, after our identity was declared down and renewed while we hold at least
    /// as many members down as alive (we were the ones cut off), with a fresh instance under
    /// `identity` that knows only the members we hold alive.
    ///
    /// What a node concluded while cut off is stale: it holds the members on the other side as
    /// down (foca never revives a down identity) and its update backlog still carries those
    /// downs. Kept, they make the node answer the other side's announces with "you are down"
    /// and gossip the downs once it is back, so healthy members renew in turn and the membership
    /// flaps for seconds after every heal. foca keeps its members and backlog across a renewal
    /// (its `reset` says so and suggests recreating the instance, which is what this does).
    /// A node that holds more members alive (a false down under loss) keeps its instance: its
    /// backlog carries the cluster's refutations and its own old identity's down.
    fn restart_foca(&mut self, now: Duration, identity: NodeIdentity) {
        let config = match self.timing.foca_config(self.members.len() + 1) {
            Ok(config) => config,
            Err(err) => {
                tracing::warn!(error = %err, "gossip timings; keeping the renewed instance");
                return;
            }
        };
        let alive: Vec<foca::Member<NodeIdentity>> = self
            .foca
            .iter_membership_state()
            .filter(|m| m.state() != State::Down && self.members.get(&m.id().addr) == Some(m.id()))
            .map(|m| foca::Member::new(m.id().clone(), m.incarnation(), State::Alive))
            .collect();
        let rng = StdRng::seed_from_u64(self.rng_seed ^ identity.bump);
        let broadcasts = MetaBroadcasts::new(self.book.clone());
        self.foca =
            foca::Foca::with_custom_broadcast(identity, config, rng, PostcardCodec, broadcasts);
        // The old instance's timers mean nothing to the new one.
        self.wire
            .timers
            .heap
            .retain(|s| !matches!(s.task, Task::Foca(_)));
        self.suspects.clear();
        self.suspicions.clear();
        self.wire.accusations.clear();
        self.wire.incarnation = 0;
        let held = std::mem::take(&mut self.wire.notes);
        if let Err(err) = self
            .foca
            .apply_many(alive.into_iter(), false, &mut self.wire.at(now))
        {
            tracing::debug!(error = %err, "restoring the alive members");
        }
        // Our previous identity is down: say so, as a renewal in place does, so members that
        // still hold it learn the news with the gossip instead of by probing it to death.
        let previous = NodeIdentity {
            bump: self.foca.identity().bump.wrapping_sub(1),
            ..self.foca.identity().clone()
        };
        let down = foca::Member::new(previous, 0, State::Down);
        if let Err(err) = self
            .foca
            .apply_many(std::iter::once(down), true, &mut self.wire.at(now))
        {
            tracing::debug!(error = %err, "declaring the previous identity down");
        }
        let restored = std::mem::replace(&mut self.wire.notes, held);
        // The members we hold come up again in the new instance: that is not news.
        let members = &self.members;
        self.wire.notes.extend(restored.into_iter().filter(|note| {
            !matches!(note, OwnedNotification::MemberUp(id) if members.get(&id.addr) == Some(id))
        }));
        // Until a member acknowledges the new identity, keep announcing to the seeds.
        self.phase = Phase::Joining;
        self.schedule_join_retry(now);
    }

    /// Clears `settled` in our own record: a renewed identity is a new membership, and a node
    /// that comes back from a cut must not take addresses back before its preemption delay.
    /// Whoever owns the settle policy sets it again through [`Core::set_meta`].
    fn unsettle_own(&mut self) {
        if !self.own.settled {
            return;
        }
        self.own.settled = false;
        self.own.version += 1;
        self.live.remove(&self.own.node);
        self.live.upsert(self.own.clone());
        self.changes.push(LiveChange::Meta(self.own.node.clone()));
    }

    /// Puts the newest record of `node` into the LiveSet if it was written by the identity we
    /// hold alive for that node.
    fn apply_record(&mut self, node: &str) {
        let Some(id) = self.by_node.get(node).and_then(|a| self.members.get(a)) else {
            return;
        };
        let book = self.book.lock();
        let Some(record) = book.get(node) else {
            return;
        };
        if !record.written_by(id) || self.live.get(node) == Some(&record.meta) {
            return;
        }
        let meta = record.meta.clone();
        drop(book);
        self.live.remove(node);
        self.live.upsert(meta);
        self.missing_meta.remove(node);
        self.changes.push(LiveChange::Meta(node.to_string()));
    }
}

#[cfg(test)]
mod wire_tests;
