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
//! - Timers fire in deadline order (ties in the order they were set). Two wait outside the
//!   order while they have nothing to do (see [`timers`]): foca's indirect-probe timer of a
//!   probe already answered, handed to foca just before its next probe timer, and the suspect
//!   sweep while no member is suspect.
//! - The node keeps announcing to its seeds until foca reports `Active`, and again after `Idle`.
//!   A member that announces to us, or probes or gossips to us, while we hold it as down is told
//!   so (foca's `TurnUndead`), so it renews its identity: both sides of a healed partition merge
//!   without operator help, and a member only this node declared down (its news lost) does not
//!   stay down here forever while everyone else holds it alive. One that goes on talking to us
//!   without renewing never hears it (our path to it is cut one way): the other members are
//!   sent its down as well, and the first it talks to tells it.
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
//!   once it has held it for a while (and tells the suspect), and declares the member down
//!   itself only when at least one confirmation came back.
//! - A deaf node ends no suspicion: one that heard no datagram at all for two probe periods
//!   during a suspicion (its link down, its own cut, a pause) starts the suspicion over when it
//!   falls due, tells the suspect and asks the members again, for up to the longest suspicion
//!   from its first start. Without it, in a cluster too small for confirmations (up to four
//!   members) a node cut off for longer than the shortest suspicion declared the healthy
//!   members down, and they renewed once it was back.

use std::collections::{BTreeSet, BinaryHeap};
use std::net::{IpAddr, SocketAddr};
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
    /// Which envelope version each datagram is sealed in (see [`super::wire_rule`]).
    rule: super::wire_rule::WireRule,
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
    /// foca's probe under way, as its notifications show it (see [`timers::ProbeSeen`]).
    probe: timers::ProbeSeen,
    /// `SendIndirectProbe` timers whose probe was answered: held out of the heap and handed to
    /// foca just before its next `ProbeRandomMember` (see [`Core::hold_answered_probe`]).
    held: Vec<Timer<NodeIdentity>>,
}

impl Wire {
    /// The wire of a node sealing in `stream`, with nothing sent or heard yet.
    fn new(ring: KeyRing, stream: SealStream, metrics: GossipMetrics, health_max: u32) -> Wire {
        Wire {
            ring,
            stream,
            replay: ReplayGuard::default(),
            rule: super::wire_rule::WireRule::default(),
            peer_keys: FastMap::default(),
            offered: FastMap::default(),
            metrics,
            timers: TimerHeap::default(),
            outbox: Vec::new(),
            notes: Vec::new(),
            scratch: Vec::with_capacity(2048),
            health: LocalHealth::new(health_max),
            probe_started: false,
            probe_failed: false,
            incarnation: 0,
            accusations: Vec::new(),
            probe: timers::ProbeSeen::default(),
            held: Vec::new(),
        }
    }

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
        let sealed = self.rule.seal(
            &self.ring,
            &mut self.stream,
            key,
            to,
            &self.scratch,
            &mut bytes,
        );
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
                if let Message::Ping(number) = header.message {
                    self.wire.probe_started = true;
                    self.wire.probe.pinged(&header.dst, number);
                }
                if header.src_incarnation > self.wire.incarnation {
                    self.wire.health(1);
                }
                self.wire.incarnation = header.src_incarnation;
            }
            foca::Notification::DataReceived(header) => {
                if let Message::Ack(number) = header.message {
                    self.wire.probe.ack_received(&header.src, number);
                }
            }
            other => {
                self.wire.probe.note(&other);
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
    /// Turns through the alive members asked for another member's missing record.
    pull_turn: usize,
    last_heard: FastMap<SocketAddr, Duration>,
    /// Members down or gone, by name: when their last datagram was heard (see
    /// [`Core::last_heard_before_down`]). Kept until the name comes up again.
    heard_before_down: FastMap<NodeName, Duration>,
    /// Authentic, fresh datagrams received.
    heard: u64,
    /// When the last of them arrived, and the first after a silence of this node's (see
    /// [`Core::deaf_during`]).
    last_datagram: Duration,
    heard_again: Duration,
    /// Times this node learnt it was declared down and renewed its identity.
    rejoins: u64,
    phase: Phase,
    join_retry_pending: bool,
    /// foca's periodic gossip timer, held back while foca has nothing to gossip (it would fire
    /// every `gossip_period` to send nothing): when it was due, and the timer. It is handed
    /// to foca as soon as there is something to gossip ([`Core::next_deadline`] says it is due).
    gossip_parked: Option<(Duration, Timer<NodeIdentity>)>,
    /// The suspect sweep, held back while no member is suspect (it would find nothing every
    /// `suspect_to_down_after`): when it would be due next on its grid (see
    /// [`Core::wake_sweep`]).
    sweep_parked: Option<Duration>,
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
    /// Owner-watch payloads received through the gossip, for the watch (see
    /// [`Core::drain_watch`]).
    watch_inbox: Vec<WatchRelayed>,
    /// The owner watch's checks of members it accuses, asked of the gossip (see
    /// [`Core::relay_watch`]), oldest first.
    watch_checks: std::collections::VecDeque<watch::WatchCheck>,
    /// Members held down that talk to us: how often told so since when (see
    /// [`Core::tell_down`]).
    told_down: FastMap<SocketAddr, notifications::ToldDown>,
}

/// A suspicion this node times (see the module docs).
#[derive(Debug)]
struct Suspicion {
    id: NodeIdentity,
    incarnation: u16,
    /// Start; moved to the latest "reachable" verdict, and on by a deaf spell of this node's.
    since: Duration,
    /// The first start (a deaf node starts a suspicion over until this plus the longest).
    began: Duration,
    /// Whether a deaf spell started it over (logged the first time only).
    started_over: bool,
    /// When the owner watch last heard the suspect alive (see [`Core::heard_on_watch`]).
    heard_on_watch: Option<Duration>,
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
            wire: Wire::new(ring, stream, metrics, settings.timing.health_max),
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
            pull_turn: 0,
            last_heard: FastMap::default(),
            heard_before_down: FastMap::default(),
            heard: 0,
            last_datagram: now,
            heard_again: now,
            rejoins: 0,
            phase: Phase::Joining,
            join_retry_pending: false,
            gossip_parked: None,
            sweep_parked: None,
            scaled: (Duration::ZERO, 0),
            suspects: FastMap::default(),
            sync_rng: StdRng::seed_from_u64(settings.rng_seed ^ 0x5359_4e43),
            rng_seed: settings.rng_seed,
            suspicions: FastMap::default(),
            next_token: 0,
            relays: Vec::new(),
            watch_inbox: Vec::new(),
            watch_checks: std::collections::VecDeque::new(),
            told_down: FastMap::default(),
        };
        core.scaled = core.timing.scaled(1);
        core.publish_own_record()?;
        core.wire.metrics.set_members(0, 0, 0);
        core.wire.metrics.set_health(0);
        core.live.upsert(own.clone());
        core.changes.push(LiveChange::Up(own.node));
        core.start_timers(now);
        core.handle_due_timers(now);
        Ok(core)
    }

    /// The first join attempt and the periodic timers, from `now`.
    fn start_timers(&mut self, now: Duration) {
        self.schedule_join_retry(now);
        let timers = &mut self.wire.timers;
        timers.push(now + self.timing.meta_refresh, Task::MetaRefresh);
        timers.push(now + HOUSEKEEPING_PERIOD, Task::Housekeeping);
        timers.push(now + self.timing.suspect_to_down_after, Task::SuspectSweep);
        if !self.timing.sync_period.is_zero() {
            timers.push(now + self.timing.sync_period, Task::Sync);
        }
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

    /// Every peer address this node gossips with or would: its seeds, its members, and the
    /// members it holds down (a cut-off node's way back), without its own, deduplicated.
    pub fn peer_addresses(&self) -> Vec<IpAddr> {
        let own = self.foca.identity().addr.ip();
        let known = self.foca.iter_membership_state().map(|m| m.id().addr);
        let all: BTreeSet<IpAddr> = self
            .seeds
            .iter()
            .copied()
            .chain(self.members.keys().copied())
            .chain(known)
            .map(|addr| addr.ip())
            .filter(|ip| *ip != own)
            .collect();
        all.into_iter().collect()
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

    /// Seals and opens through `rule` from now on (the driver's, shared with the owner watch;
    /// a core made by [`Core::new`] has its own, which seals everything in version 2).
    pub fn set_wire_rule(&mut self, rule: super::wire_rule::WireRule) {
        self.wire.rule = rule;
    }

    /// foca's view of the members named `node` (identity, incarnation, state), for debugging.
    pub fn debug_member(&self, node: &str) -> Vec<String> {
        self.foca
            .iter_membership_state()
            .filter(|m| m.id().node == node)
            .map(|m| format!("{:?} inc {} {:?}", m.id(), m.incarnation(), m.state()))
            .collect()
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
        let me = self.wire.stream.sender();
        let opened = match self.wire.rule.open(&self.wire.ring, datagram, me, from) {
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
        self.note_heard(now);
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
            GossipMessage::MetaPull { node } => self.answer_pull(from, node),
            GossipMessage::Sync { echo, digest } => {
                self.answer_digest(now, from, &digest.into(), echo)
            }
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
            GossipMessage::Watch(payload) => self.watch_inbox.push(WatchRelayed {
                from,
                payload: payload.to_vec(),
            }),
        }
    }

    fn handle_foca_packet(&mut self, now: Duration, body: &[u8]) {
        let mut peek = body;
        if let Ok(header) = self.codec.decode_header(&mut peek)
            && self.holds_as_down(&header.src)
        {
            let announce = header.message == Message::Announce;
            match self.alive_and_down() {
                // An announce, or anything else a member we hold down sends us (foca drops it
                // unanswered): a member that still probes and gossips to us holds itself
                // alive, and if nobody else declared it down (we did, and were declared down
                // ourselves before our news spread) no gossip will ever tell it. Told, it
                // renews, and we take it back under its new identity. A "you are down" is not
                // answered in kind: both ends would renew.
                (alive, down)
                    if alive >= down
                        && (announce
                            || header.message != Message::TurnUndead
                                && !self.timing.notify_down_members) =>
                {
                    self.tell_down(now, header.src)
                }
                // Alone, with more members down than alive (a dead member counts down on both
                // sides): this node has no side to keep, so it is the one to start afresh, and
                // the fresh instance takes the announce. Otherwise two survivors that declared
                // each other down would wait for each other forever.
                (1, _) if announce => self.renew_alone(now),
                _ => {}
            }
        }
        let mut io = self.wire.at(now);
        let handled = self.foca.handle_data(body, &mut io);
        if self.wire.probe.take_answered(handled.is_ok()) {
            self.hold_answered_probe();
        }
        match handled {
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

    /// Declares the member at `addr` down here alone (foca broadcasts nothing), as a node does
    /// whose news of a down was lost: for the simulation's tests.
    #[cfg(test)]
    pub(super) fn hold_down_unheard(&mut self, addr: SocketAddr, now: Duration) {
        let held: Vec<foca::Member<NodeIdentity>> = self
            .foca
            .iter_membership_state()
            .filter(|m| m.id().addr == addr)
            .map(|m| foca::Member::new(m.id().clone(), m.incarnation(), State::Down))
            .collect();
        let mut io = self.wire.at(now);
        self.foca
            .apply_many(held.into_iter(), false, &mut io)
            .unwrap();
        self.settle(now);
    }

    fn holds_as_down(&self, id: &NodeIdentity) -> bool {
        // `members` mirrors foca's alive members: no scan of every member per datagram.
        if self.members.get(&id.addr) == Some(id) {
            return false;
        }
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
    /// declared down, was the one cut off and starts afresh ([`Core::restart_foca`]). A node
    /// alone that holds more down than alive starts afresh as soon as a member it holds down
    /// announces ([`Core::renew_alone`]). The larger side stays as it is and the smaller side
    /// rejoins it.
    fn alive_and_down(&self) -> (usize, usize) {
        let down = self
            .foca
            .iter_membership_state()
            .filter(|m| m.state() == State::Down && !self.members.contains_key(&m.id().addr))
            .count();
        (self.members.len() + 1, down)
    }

    /// This node is alone and a member it holds down announced: it renews its identity and
    /// starts a fresh instance that has forgotten its downs, as a node told it was declared
    /// down does.
    fn renew_alone(&mut self, now: Duration) {
        let Some(identity) = foca::Identity::renew(self.foca.identity()) else {
            return;
        };
        self.rejoins += 1;
        tracing::info!(
            bump = identity.bump,
            "alone, and a member held down announces: rejoining under a renewed identity"
        );
        self.restart_foca(now, identity);
        self.unsettle_own();
        self.offer_own_record();
    }
}

mod notifications;
mod suspicion;
#[cfg(test)]
pub(crate) use suspicion::WATCH_EVIDENCE_MAX;
mod timers;
use timers::{Task, TimerHeap};
#[cfg(test)]
mod timer_tests;
mod updates;
mod watch;
pub use watch::WatchRelayed;
#[cfg(test)]
mod wire_tests;
