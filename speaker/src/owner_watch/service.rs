//! The owner watch's thread: its own UDP socket, its own timers, the heartbeats, the second
//! check, claims and refutations on the wire. The decisions are the parent module's
//! ([`Schedule`], [`Detector`]); what to do about a silent owner is the daemon's.
//!
//! **Its own thread.** The watch runs on a dedicated OS thread with a single-threaded tokio
//! runtime, so the heartbeats and the watch timers never wait behind reconciliation, a netlink
//! dump or the HTTP server on the speaker's main runtime. Every wake-up measures how late its
//! timer fired (`swimlb_owner_watch_timer_lateness_seconds`); more than half an interval late
//! is logged (at most once every ten seconds), as FRR does for BFD.
//!
//! **The socket.** The watch listens on the gossip address's port + 1 ([`watch_addr`]: 7947
//! beside the default 7946); a member's watch address follows from its gossip address, which
//! the gossip's [`Directory`] gives. Every datagram is an envelope sealed with the gossip key
//! ring under this node's watch stream (sender id: a hash of the watch address; epoch: the
//! identity bump at start), and every received one must open with the ring, come from a member
//! of the directory (by sender id) and pass a replay guard of its own; anything else is
//! dropped and counted (`swimlb_owner_watch_dropped_total{reason}`).
//!
//! **The owner's side.** The daemon's [`Plan`] names the watchers: the successors of the IPs
//! this node answers for, at most [`MAX_WATCHERS`]. Each gets a [`Schedule`]: slow until it
//! acknowledges, then fast. Polls are answered `alive` only for this node's current incarnation,
//! and not after a pause.
//!
//! **The watcher's side.** A heartbeat from a member of the directory arms a [`Detector`] for
//! it (the owner chose this node as a watcher). One interval before the silence deadline with
//! nothing heard, the second check starts: a poll to the owner and a relay request to a third
//! member, which polls the owner and answers for it, and again half an interval later
//! ([`CHECK_ROUNDS`]). An answer vouches for the owner (the window restarts). At the deadline with no answer, [`Event::Silent`] goes to the daemon,
//! which takes over and asks for a claim ([`Command::Claim`]). An owner that answers polls but
//! has stopped sending heartbeats (it chose other watchers, and its last word was lost) is
//! dropped after the second such vouch.
//!
//! **Pauses.** A wake-up later than `M x I` means this thread was not scheduled for longer than
//! a watcher waits: the watchers may already have taken this node's IPs. It sends no heartbeat
//! and denies every poll from then on, and tells the daemon ([`Event::Paused`]), which holds
//! every answer until the node has heard the cluster again (keepalived's
//! `timer_expired_backup`); the first plan that answers nothing, then one that answers again,
//! ends it.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use swimlb_proto::envelope::MAX_DATAGRAM_LEN;
use swimlb_proto::heartbeat::{self, MessageType, NodeRef};
use swimlb_proto::{KeyRing, SealStream, WatchMessage};
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::{Detector, Heard, Knobs, Schedule, Verdict};
use crate::gossip::NodeIdentity;
use crate::gossip::driver::Directory;
use crate::gossip::replay::{ReplayGuard, sender_id};
use crate::membership::NodeName;

/// At most this many watchers per owner (the issue's `K`).
pub const MAX_WATCHERS: usize = 3;
/// How long a relay waits for the target's answer, and a poll's nonce is remembered.
const POLL_WAIT: Duration = Duration::from_millis(100);
/// Refutations are sent this many times, one interval apart.
const REFUTE_REPEAT: u32 = 3;
/// The lateness warning is logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Rounds of the second check: a poll and a relay request one interval before the silence
/// deadline, again half an interval before it. At 10 % loss per path one round misses a live
/// owner 6 % of the time (the poll or its answer lost, and one of the relay's four datagrams
/// lost), two rounds 0.4 %.
pub const CHECK_ROUNDS: u32 = 2;

/// When round `sent + 1` of the second check is due before `deadline` (`None`: all sent).
pub fn check_round_at(deadline: Duration, interval: Duration, sent: u32) -> Option<Duration> {
    (sent < CHECK_ROUNDS)
        .then(|| deadline.saturating_sub(interval * (CHECK_ROUNDS - sent) / CHECK_ROUNDS))
}

/// The promise of an owner's last heartbeat to a watcher it drops (it no longer answers for
/// that watcher's IPs, or others succeed it more often): "the next one within 65 s", which puts
/// the watcher's silence window minutes away instead of leaving it to find the owner silent
/// and poll it.
pub const FAREWELL_INTERVAL_MS: u16 = u16::MAX;

/// A member's watch address: its gossip address with the port one higher (`None` for port
/// 65,535).
pub fn watch_addr(gossip: SocketAddr) -> Option<SocketAddr> {
    let port = gossip.port().checked_add(1)?;
    let mut addr = gossip;
    addr.set_port(port);
    Some(addr)
}

/// What the daemon wants the watch to do, sent whenever it changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// This node's current identity (its bump is the heartbeats' incarnation).
    pub me: NodeIdentity,
    /// Whom to send heartbeats to: the successors of the IPs this node answers for, at most
    /// [`MAX_WATCHERS`].
    pub watchers: Vec<NodeName>,
    /// Whether this node answers for any IP (a poll is answered `alive` only then).
    pub answering: bool,
    /// The members accused here, with the incarnation accused: a heartbeat from one of them in
    /// that incarnation is reported ([`Event::Alive`]).
    pub accused: BTreeMap<NodeName, u64>,
}

/// A request to the watch thread.
#[derive(Debug)]
pub enum Command {
    /// The daemon's plan changed.
    Plan(Plan),
    /// The gossip keys were replaced.
    KeyRing(Box<KeyRing>),
    /// This node took `ip` over from `accused`: tell every member.
    Claim {
        /// The first IP taken over (for the others' logs).
        ip: IpAddr,
        /// The member found silent, as the gossip knows it.
        accused: NodeIdentity,
    },
    /// A claim accused this node while it answers: tell every member it is alive.
    Refute,
}

/// What the watch thread tells the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A watched owner sent nothing for a whole window and failed the second check.
    Silent {
        /// The owner, as the directory knows it.
        owner: NodeIdentity,
        /// When its last heartbeat arrived.
        last_heard: Instant,
    },
    /// Another member claims it took `ip` over from `accused`.
    Claimed {
        /// Who claims.
        claimant: NodeName,
        /// Whom it accuses.
        accused: NodeName,
        /// The accused incarnation.
        incarnation: u64,
        /// The IP it names.
        ip: IpAddr,
    },
    /// An accused member was heard in the accused incarnation: it is alive.
    Alive {
        /// The member.
        node: NodeName,
        /// The incarnation heard.
        incarnation: u64,
    },
    /// This thread was not scheduled for longer than a watcher waits.
    Paused {
        /// How late its timer fired.
        late: Duration,
    },
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeLabel {
    r#type: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// Why a received watch datagram was dropped (`swimlb_owner_watch_dropped_total{reason}`).
const DROP_REASONS: [&str; 5] = [
    "unauthentic",
    "unknown_sender",
    "replay",
    "malformed",
    "stale",
];

/// The watch's metrics (cloning shares the series).
#[derive(Debug, Clone)]
pub struct WatchMetrics {
    sent: Family<TypeLabel, Counter>,
    received: Family<TypeLabel, Counter>,
    dropped: Family<ReasonLabel, Counter>,
    lateness: Histogram,
    checks: Family<ResultLabel, Counter>,
    takeovers: Family<ResultLabel, Counter>,
    watchers: Gauge,
    watched: Gauge,
}

impl Default for WatchMetrics {
    fn default() -> WatchMetrics {
        WatchMetrics {
            sent: Family::default(),
            received: Family::default(),
            dropped: Family::default(),
            // 50 us to about 0.8 s.
            lateness: Histogram::new(exponential_buckets(0.000_05, 2.0, 15)),
            checks: Family::default(),
            takeovers: Family::default(),
            watchers: Gauge::default(),
            watched: Gauge::default(),
        }
    }
}

impl WatchMetrics {
    /// Registers the series in `registry`, every label value at 0 (a family without series
    /// would not be exposed at all).
    pub fn register(registry: &mut Registry) -> WatchMetrics {
        let m = WatchMetrics::default();
        for r#type in [
            MessageType::Heartbeat,
            MessageType::Ack,
            MessageType::Poll,
            MessageType::PollReply,
            MessageType::Relay,
            MessageType::Claim,
        ] {
            let label = TypeLabel {
                r#type: r#type.as_str(),
            };
            let _ = m.sent.get_or_create(&label);
            let _ = m.received.get_or_create(&label);
        }
        for reason in DROP_REASONS {
            let _ = m.dropped.get_or_create(&ReasonLabel { reason });
        }
        for result in ["vouched", "silent"] {
            let _ = m.checks.get_or_create(&ResultLabel { result });
        }
        for result in ["confirmed", "refuted"] {
            let _ = m.takeovers.get_or_create(&ResultLabel { result });
        }
        registry.register(
            "swimlb_owner_watch_sent",
            "Owner watch datagrams sent, by type",
            m.sent.clone(),
        );
        registry.register(
            "swimlb_owner_watch_received",
            "Owner watch datagrams received and admitted, by type",
            m.received.clone(),
        );
        registry.register(
            "swimlb_owner_watch_dropped",
            "Owner watch datagrams dropped, by reason (malformed, unauthentic, unknown_sender, replay, stale)",
            m.dropped.clone(),
        );
        registry.register(
            "swimlb_owner_watch_timer_lateness_seconds",
            "How late the owner watch thread's timers fired",
            m.lateness.clone(),
        );
        registry.register(
            "swimlb_owner_watch_checks",
            "Second checks of a silent owner, by result (vouched: it answered; silent: it did not)",
            m.checks.clone(),
        );
        registry.register(
            "swimlb_owner_watch_takeovers",
            "Takeovers on this node's own watch, by result (confirmed: the gossip declared the owner down; refuted: it was alive)",
            m.takeovers.clone(),
        );
        registry.register(
            "swimlb_owner_watch_watchers",
            "Members this node sends heartbeats to",
            m.watchers.clone(),
        );
        registry.register(
            "swimlb_owner_watch_watched",
            "Owners this node watches",
            m.watched.clone(),
        );
        m
    }

    /// Counts a takeover's end (`confirmed` or `refuted`).
    pub fn takeover(&self, result: &'static str) {
        self.takeovers.get_or_create(&ResultLabel { result }).inc();
    }

    fn drop_one(&self, reason: &'static str) {
        self.dropped.get_or_create(&ReasonLabel { reason }).inc();
    }
}

/// The daemon's side of a running watch.
#[derive(Debug)]
pub struct WatchHandle {
    commands: mpsc::UnboundedSender<Command>,
    local_addr: SocketAddr,
    metrics: WatchMetrics,
}

/// The events of a running watch, for the mode's loop.
#[derive(Debug)]
pub struct WatchEvents(mpsc::UnboundedReceiver<Event>);

impl WatchEvents {
    /// Events from a watch that never runs (switched off): none, ever.
    pub fn none() -> WatchEvents {
        let (_, rx) = mpsc::unbounded_channel();
        WatchEvents(rx)
    }

    /// The next event; `None` once the watch is gone (or never ran).
    pub async fn recv(&mut self) -> Option<Event> {
        self.0.recv().await
    }
}

impl WatchHandle {
    /// Binds `bind` and starts the watch thread. `directory` is the gossip's; `plan` the first.
    pub fn start(
        knobs: Knobs,
        bind: SocketAddr,
        ring: KeyRing,
        directory: watch::Receiver<Directory>,
        plan: Plan,
        metrics: WatchMetrics,
    ) -> std::io::Result<(WatchHandle, WatchEvents)> {
        let socket = std::net::UdpSocket::bind(bind)?;
        socket.set_nonblocking(true)?;
        let local_addr = socket.local_addr()?;
        let stream = SealStream::new(sender_id(local_addr), plan.me.bump)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let (commands_tx, commands_rx) = mpsc::unbounded_channel();
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let thread_metrics = metrics.clone();
        std::thread::Builder::new()
            .name("owner-watch".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        tracing::error!(error = %e, "owner watch: no runtime; gossip alone detects");
                        return;
                    }
                };
                runtime.block_on(async move {
                    let socket = match UdpSocket::from_std(socket) {
                        Ok(socket) => socket,
                        Err(e) => {
                            tracing::error!(error = %e, "owner watch socket; gossip alone detects");
                            return;
                        }
                    };
                    let mut watch = Watch::new(
                        knobs,
                        ring,
                        stream,
                        directory,
                        plan,
                        events_tx,
                        thread_metrics,
                    );
                    watch.run(socket, commands_rx).await;
                });
            })?;
        Ok((
            WatchHandle {
                commands: commands_tx,
                local_addr,
                metrics,
            },
            WatchEvents(events_rx),
        ))
    }

    /// The address the watch listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The watch's metrics.
    pub fn metrics(&self) -> &WatchMetrics {
        &self.metrics
    }

    /// Sends `command` (a stopped thread ignores it).
    pub fn send(&self, command: Command) {
        let _ = self.commands.send(command);
    }
}

/// A poll this node sent (directly or for a requester), by nonce.
#[derive(Debug)]
struct PendingPoll {
    /// The owner polled.
    target: NodeName,
    /// For a relay: whom to answer, with which nonce.
    answer_to: Option<(SocketAddr, u64)>,
    expires: Duration,
}

/// A watched owner.
#[derive(Debug)]
struct Watched {
    detector: Detector,
    /// Rounds of the second check sent in the current window (0 to [`CHECK_ROUNDS`]).
    checks_sent: u32,
    /// Polls answered with no heartbeat in between.
    vouches_without_beat: u32,
    last_heard: Instant,
}

/// The watch thread's state.
struct Watch {
    knobs: Knobs,
    ring: KeyRing,
    stream: SealStream,
    guard: ReplayGuard,
    directory: watch::Receiver<Directory>,
    /// Sender id of each member's watch address.
    senders: HashMap<u64, NodeName>,
    plan: Plan,
    schedules: BTreeMap<NodeName, Schedule>,
    watched: BTreeMap<NodeName, Watched>,
    polls: HashMap<u64, PendingPoll>,
    refutes_left: u32,
    next_refute: Duration,
    claim_epoch: u64,
    /// The last heartbeat sequence number sent, to any watcher: one counter for all, so a
    /// watcher dropped and taken back (a new schedule) or a restart of the streams after a
    /// pause never sends a number the watcher has seen.
    seq: u64,
    /// `Some(false)`: paused, waiting for a plan that answers nothing; `Some(true)`: waiting
    /// for one that answers again.
    paused: Option<bool>,
    last_warn: Option<Duration>,
    events: mpsc::UnboundedSender<Event>,
    metrics: WatchMetrics,
    rng: StdRng,
    origin: Instant,
    socket: Option<UdpSocket>,
    out: Vec<u8>,
}

impl Watch {
    fn new(
        knobs: Knobs,
        ring: KeyRing,
        stream: SealStream,
        directory: watch::Receiver<Directory>,
        plan: Plan,
        events: mpsc::UnboundedSender<Event>,
        metrics: WatchMetrics,
    ) -> Watch {
        let seed = plan.me.bump ^ rand::rng().random::<u64>();
        let mut watch = Watch {
            knobs,
            ring,
            stream,
            guard: ReplayGuard::default(),
            directory,
            senders: HashMap::new(),
            plan: plan.clone(),
            schedules: BTreeMap::new(),
            watched: BTreeMap::new(),
            polls: HashMap::new(),
            refutes_left: 0,
            next_refute: Duration::ZERO,
            claim_epoch: 0,
            seq: 0,
            paused: None,
            last_warn: None,
            events,
            metrics,
            rng: StdRng::seed_from_u64(seed),
            origin: Instant::now(),
            socket: None,
            out: Vec::with_capacity(MAX_DATAGRAM_LEN),
        };
        watch.refresh_senders();
        watch.set_plan(Duration::ZERO, plan);
        watch
    }

    async fn run(&mut self, socket: UdpSocket, mut commands: mpsc::UnboundedReceiver<Command>) {
        self.socket = Some(socket);
        let mut buf = vec![0u8; MAX_DATAGRAM_LEN + 1];
        loop {
            let planned = self.next_deadline();
            let wake = planned.map_or_else(
                || Instant::now() + Duration::from_secs(3600),
                |at| self.origin + at,
            );
            let Some(socket) = self.socket.take() else {
                return;
            };
            tokio::select! {
                received = socket.recv_from(&mut buf) => {
                    self.socket = Some(socket);
                    if let Ok((len, from)) = received {
                        let now = self.now();
                        self.datagram(now, from, &mut buf[..len]);
                    }
                }
                command = commands.recv() => {
                    self.socket = Some(socket);
                    match command {
                        Some(command) => {
                            let now = self.now();
                            self.command(now, command);
                        }
                        None => return,
                    }
                }
                changed = self.directory.changed() => {
                    self.socket = Some(socket);
                    if changed.is_err() {
                        return;
                    }
                    self.refresh_senders();
                }
                () = tokio::time::sleep_until(wake) => {
                    self.socket = Some(socket);
                    let now = self.now();
                    self.tick(now, planned.unwrap_or(now));
                }
            }
            self.metrics.watchers.set(self.schedules.len() as i64);
            self.metrics.watched.set(self.watched.len() as i64);
        }
    }

    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn at(&self, at: Duration) -> Instant {
        self.origin + at
    }

    fn refresh_senders(&mut self) {
        let directory = self.directory.borrow_and_update().clone();
        self.senders = directory
            .values()
            .filter_map(|id| Some((sender_id(watch_addr(id.addr)?), id.node.to_string())))
            .collect();
        // Owners gone from the directory are the gossip's business now.
        self.watched.retain(|node, _| directory.contains_key(node));
    }

    fn member(&self, node: &str) -> Option<NodeIdentity> {
        self.directory.borrow().get(node).cloned()
    }

    /// When the next timer is due.
    fn next_deadline(&self) -> Option<Duration> {
        let beats = self.schedules.values().map(Schedule::next_at);
        let watched = self.watched.values().filter_map(|w| {
            let deadline = w.detector.deadline()?;
            Some(check_round_at(deadline, w.detector.promised(), w.checks_sent).unwrap_or(deadline))
        });
        let refute = (self.refutes_left > 0).then_some(self.next_refute);
        beats.chain(watched).chain(refute).min()
    }

    fn set_plan(&mut self, now: Duration, plan: Plan) {
        self.paused = match self.paused {
            Some(false) if !plan.answering => Some(true),
            Some(true) if plan.answering => None,
            other => other,
        };
        let sending = self.paused.is_none();
        let dropped: Vec<NodeName> = self
            .schedules
            .keys()
            .filter(|node| sending && !plan.watchers.contains(node))
            .cloned()
            .collect();
        for node in dropped {
            if let Some(to) = self.member(&node).and_then(|id| watch_addr(id.addr)) {
                self.seq += 1;
                let farewell = WatchMessage::Heartbeat {
                    incarnation: self.plan.me.bump,
                    seq: self.seq,
                    interval_ms: FAREWELL_INTERVAL_MS,
                };
                self.send(to, &farewell);
            }
        }
        self.schedules
            .retain(|node, _| sending && plan.watchers.contains(node));
        if sending {
            for node in &plan.watchers {
                if !self.schedules.contains_key(node) {
                    let seed = self.rng.random::<u64>();
                    self.schedules
                        .insert(node.clone(), Schedule::new(now, &self.knobs, seed));
                }
            }
        }
        if plan.me.bump != self.plan.me.bump {
            // A new incarnation: the watchers learn it from the next heartbeat.
            for schedule in self.schedules.values_mut() {
                *schedule = Schedule::new(now, &self.knobs, self.rng.random::<u64>());
            }
        }
        self.plan = plan;
    }

    fn command(&mut self, now: Duration, command: Command) {
        match command {
            Command::Plan(plan) => self.set_plan(now, plan),
            Command::KeyRing(ring) => self.ring = *ring,
            Command::Claim { ip, accused } => {
                self.claim_epoch += 1;
                let me = self.plan.me.clone();
                let message = WatchMessage::Claim {
                    ip,
                    epoch: self.claim_epoch,
                    claimant: node_ref(&me),
                    accused: node_ref(&accused),
                };
                let directory = self.directory.borrow().clone();
                for id in directory.values() {
                    if let Some(to) = watch_addr(id.addr) {
                        self.send(to, &message);
                    }
                }
            }
            Command::Refute => {
                self.refutes_left = REFUTE_REPEAT;
                self.next_refute = now;
                self.tick_refute(now);
            }
        }
    }

    /// Sends the refutations due: a heartbeat to every member.
    fn tick_refute(&mut self, now: Duration) {
        if self.refutes_left == 0 || now < self.next_refute || self.paused.is_some() {
            return;
        }
        self.refutes_left -= 1;
        self.next_refute = now + self.knobs.interval;
        let message = WatchMessage::Heartbeat {
            incarnation: self.plan.me.bump,
            // Refutations carry seq 0: a watcher's detector ignores them (not above its last),
            // an accuser only looks at the incarnation.
            seq: 0,
            interval_ms: interval_ms(self.knobs.interval),
        };
        let directory = self.directory.borrow().clone();
        for id in directory.values() {
            if let Some(to) = watch_addr(id.addr) {
                self.send(to, &message);
            }
        }
    }

    fn tick(&mut self, now: Duration, planned: Duration) {
        let late = now.saturating_sub(planned);
        self.metrics.lateness.observe(late.as_secs_f64());
        if late > self.knobs.interval / 2
            && self
                .last_warn
                .is_none_or(|at| now.saturating_sub(at) >= WARN_EVERY)
        {
            self.last_warn = Some(now);
            tracing::warn!(
                late_ms = late.as_secs_f64() * 1000.0,
                interval_ms = self.knobs.interval.as_secs_f64() * 1000.0,
                "owner watch timer fired more than half an interval late"
            );
        }
        if late > self.knobs.interval * self.knobs.misses && self.paused.is_none() {
            // Not scheduled for longer than a watcher waits: the IPs may have moved.
            self.paused = Some(false);
            self.schedules.clear();
            self.refutes_left = 0;
            tracing::warn!(
                late_ms = late.as_secs_f64() * 1000.0,
                "owner watch thread was not scheduled for longer than a watcher waits: holding answers until the cluster is heard again"
            );
            let _ = self.events.send(Event::Paused { late });
        }
        // Heartbeats.
        let mut beats = Vec::new();
        for (node, schedule) in &mut self.schedules {
            if let Some(beat) = schedule.poll(now) {
                beats.push((node.clone(), beat));
            }
        }
        for (node, beat) in beats {
            let Some(to) = self.member(&node).and_then(|id| watch_addr(id.addr)) else {
                continue;
            };
            self.seq += 1;
            let message = WatchMessage::Heartbeat {
                incarnation: self.plan.me.bump,
                seq: self.seq,
                interval_ms: beat.interval_ms(),
            };
            self.send(to, &message);
        }
        self.tick_refute(now);
        // Watched owners: the second check, then the verdict.
        let mut check = Vec::new();
        let mut silent = Vec::new();
        for (node, w) in &mut self.watched {
            let Some(deadline) = w.detector.deadline() else {
                continue;
            };
            if check_round_at(deadline, w.detector.promised(), w.checks_sent)
                .is_some_and(|at| now >= at)
            {
                w.checks_sent += 1;
                check.push(node.clone());
            }
            match w.detector.tick(now, planned) {
                Verdict::Silent { incarnation, .. } => silent.push((node.clone(), incarnation)),
                Verdict::Late { .. } => w.checks_sent = 0,
                Verdict::Fine | Verdict::NotArmed => {}
            }
        }
        for node in check {
            self.second_check(now, &node);
        }
        for (node, incarnation) in silent {
            self.metrics
                .checks
                .get_or_create(&ResultLabel { result: "silent" })
                .inc();
            let Some(owner) = self.member(&node).filter(|id| id.bump == incarnation) else {
                // Gone from the gossip, or renewed: nothing to take over on the watch's word.
                self.watched.remove(&node);
                continue;
            };
            let last_heard = self
                .watched
                .get(&node)
                .map_or_else(Instant::now, |w| w.last_heard);
            let _ = self.events.send(Event::Silent { owner, last_heard });
        }
        self.polls.retain(|_, p| p.expires > now);
    }

    /// Remembers a poll of `target` sent at `now` (for a relay: whom to answer, with which
    /// nonce) until [`POLL_WAIT`] passes; its nonce.
    fn new_poll(
        &mut self,
        now: Duration,
        target: &str,
        answer_to: Option<(SocketAddr, u64)>,
    ) -> u64 {
        let nonce = self.rng.random::<u64>();
        self.polls.insert(
            nonce,
            PendingPoll {
                target: target.to_string(),
                answer_to,
                expires: now + POLL_WAIT,
            },
        );
        nonce
    }

    /// Polls `owner` directly and through one other member.
    fn second_check(&mut self, now: Duration, owner: &str) {
        let Some(target) = self.member(owner) else {
            return;
        };
        let Some(to) = watch_addr(target.addr) else {
            return;
        };
        let nonce = self.new_poll(now, owner, None);
        self.send(
            to,
            &WatchMessage::Poll {
                nonce,
                incarnation: target.bump,
            },
        );
        let relays: Vec<NodeIdentity> = self
            .directory
            .borrow()
            .values()
            .filter(|id| id.node != target.node)
            .cloned()
            .collect();
        if relays.is_empty() {
            return;
        }
        let relay = &relays[self.rng.random_range(0..relays.len())];
        let Some(relay_to) = watch_addr(relay.addr) else {
            return;
        };
        let nonce = self.new_poll(now, owner, None);
        self.send(
            relay_to,
            &WatchMessage::Relay {
                nonce,
                target: node_ref(&target),
            },
        );
    }

    fn datagram(&mut self, now: Duration, from: SocketAddr, datagram: &mut [u8]) {
        let opened = match self.ring.open_envelope(datagram) {
            Ok(opened) => opened,
            Err(_) => {
                self.metrics.drop_one("unauthentic");
                return;
            }
        };
        let Some(sender) = self.senders.get(&opened.sequence.sender).cloned() else {
            self.metrics.drop_one("unknown_sender");
            return;
        };
        if self.guard.admit(opened.sequence, now).is_err() {
            self.metrics.drop_one("replay");
            return;
        }
        let message = match WatchMessage::parse(opened.payload) {
            Ok(message) => message,
            Err(_) => {
                self.metrics.drop_one("malformed");
                return;
            }
        };
        self.metrics
            .received
            .get_or_create(&TypeLabel {
                r#type: message.message_type().as_str(),
            })
            .inc();
        match message {
            WatchMessage::Heartbeat {
                incarnation,
                seq,
                interval_ms,
            } => self.heartbeat(now, from, &sender, incarnation, seq, interval_ms),
            WatchMessage::Ack { incarnation, .. } => {
                if incarnation == self.plan.me.bump
                    && let Some(schedule) = self.schedules.get_mut(&sender)
                {
                    schedule.acknowledged(now);
                }
            }
            WatchMessage::Poll { nonce, incarnation } => {
                // Alive in that incarnation, and not paused: whether it answers for anything is
                // the election's business (a watcher it stopped heartbeating learns it here).
                let alive = incarnation == self.plan.me.bump && self.paused.is_none();
                self.send(from, &WatchMessage::PollReply { nonce, alive });
            }
            WatchMessage::PollReply { nonce, alive } => {
                let Some(poll) = self.polls.remove(&nonce) else {
                    self.metrics.drop_one("stale");
                    return;
                };
                if let Some((requester, their_nonce)) = poll.answer_to {
                    if sender == poll.target {
                        self.send(
                            requester,
                            &WatchMessage::PollReply {
                                nonce: their_nonce,
                                alive,
                            },
                        );
                    }
                    return;
                }
                if alive && let Some(w) = self.watched.get_mut(&poll.target) {
                    self.metrics
                        .checks
                        .get_or_create(&ResultLabel { result: "vouched" })
                        .inc();
                    w.vouches_without_beat += 1;
                    if w.vouches_without_beat >= 2 {
                        // Alive but no longer heartbeating here: not its watcher any more.
                        self.watched.remove(&poll.target);
                    } else {
                        w.detector.vouched(now);
                        w.checks_sent = 0;
                    }
                }
            }
            WatchMessage::Relay { nonce, target } => {
                let Some(to) = watch_addr(target.addr) else {
                    return;
                };
                let ours = self.new_poll(now, target.name, Some((from, nonce)));
                self.send(
                    to,
                    &WatchMessage::Poll {
                        nonce: ours,
                        incarnation: target.bump,
                    },
                );
            }
            WatchMessage::Claim {
                ip,
                claimant,
                accused,
                ..
            } => {
                if claimant.name != sender {
                    self.metrics.drop_one("malformed");
                    return;
                }
                let _ = self.events.send(Event::Claimed {
                    claimant: sender,
                    accused: accused.name.to_string(),
                    incarnation: accused.bump,
                    ip,
                });
            }
        }
    }

    fn heartbeat(
        &mut self,
        now: Duration,
        from: SocketAddr,
        sender: &str,
        incarnation: u64,
        seq: u64,
        interval_ms: u16,
    ) {
        if self.plan.accused.get(sender) == Some(&incarnation) {
            let _ = self.events.send(Event::Alive {
                node: sender.to_string(),
                incarnation,
            });
        }
        if seq == 0 {
            // A refutation, not a watch heartbeat.
            return;
        }
        let Some(known) = self.member(sender) else {
            self.metrics.drop_one("unknown_sender");
            return;
        };
        if incarnation < known.bump {
            self.metrics.drop_one("stale");
            return;
        }
        let knobs = self.knobs;
        let at = self.at(now);
        let w = self
            .watched
            .entry(sender.to_string())
            .or_insert_with(|| Watched {
                detector: Detector::new(&knobs, incarnation),
                checks_sent: 0,
                vouches_without_beat: 0,
                last_heard: at,
            });
        let interval = Duration::from_millis(u64::from(interval_ms));
        match w.detector.heard(now, incarnation, seq, interval) {
            Heard::Fresh { ack } => {
                w.checks_sent = 0;
                w.vouches_without_beat = 0;
                w.last_heard = at;
                if ack {
                    self.send(from, &WatchMessage::Ack { incarnation, seq });
                }
            }
            Heard::StaleIncarnation | Heard::OldSeq => self.metrics.drop_one("stale"),
        }
    }

    /// Seals `message` and sends it to `to` at once (a full socket buffer drops it: the next
    /// heartbeat follows within an interval).
    fn send(&mut self, to: SocketAddr, message: &WatchMessage<'_>) {
        let mut payload = [0u8; heartbeat::MAX_LEN];
        let Ok(len) = message.emit(&mut payload) else {
            return;
        };
        self.out.clear();
        if self
            .ring
            .seal_in(&mut self.stream, None, &payload[..len], &mut self.out)
            .is_err()
        {
            return;
        }
        let Some(socket) = &self.socket else {
            return;
        };
        if socket.try_send_to(&self.out, to).is_ok() {
            self.metrics
                .sent
                .get_or_create(&TypeLabel {
                    r#type: message.message_type().as_str(),
                })
                .inc();
        }
    }
}

fn node_ref(id: &NodeIdentity) -> NodeRef<'_> {
    NodeRef {
        name: id.node.as_str(),
        addr: id.addr,
        bump: id.bump,
    }
}

fn interval_ms(interval: Duration) -> u16 {
    u16::try_from(interval.as_millis())
        .unwrap_or(u16::MAX)
        .max(1)
}

#[cfg(test)]
mod tests {
    //! Two watch threads on loopback sockets, real sealing: the watcher hears the owner, stays
    //! quiet while it lives, reports it silent once its thread is gone, and drops what is
    //! forged, replayed or from a stranger. Waits are bounded; nothing asserts a duration.

    use std::net::{Ipv4Addr, UdpSocket as StdUdpSocket};
    use std::sync::Arc;

    use prometheus_client::registry::Registry;
    use smol_str::SmolStr;

    use super::*;

    const KEY: [u8; 32] = [7; 32];

    fn ring() -> KeyRing {
        KeyRing::new("watch-test", &[KEY]).unwrap()
    }

    struct Node {
        handle: WatchHandle,
        events: WatchEvents,
        identity: NodeIdentity,
        registry: Registry,
    }

    /// A watch on a free loopback port; its gossip address (the directory's) is one below.
    fn start(name: &str, directory: watch::Receiver<Directory>, watchers: &[&str]) -> Node {
        let mut registry = Registry::default();
        let metrics = WatchMetrics::register(&mut registry);
        // A free port whose predecessor is not 0.
        let probe = StdUdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = probe.local_addr().unwrap().port().max(2);
        drop(probe);
        let bind = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let identity = NodeIdentity {
            node: SmolStr::new(name),
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port - 1)),
            bump: 100,
        };
        let plan = Plan {
            me: identity.clone(),
            watchers: watchers.iter().map(|w| w.to_string()).collect(),
            answering: true,
            accused: BTreeMap::new(),
        };
        let knobs = Knobs::default();
        let (handle, events) =
            WatchHandle::start(knobs, bind, ring(), directory, plan, metrics).unwrap();
        Node {
            handle,
            events,
            identity,
            registry,
        }
    }

    fn metric(registry: &Registry, line_start: &str) -> f64 {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text.lines()
            .filter(|l| l.starts_with(line_start))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    fn directory_of(nodes: &[&NodeIdentity]) -> Directory {
        Arc::new(
            nodes
                .iter()
                .map(|id| (id.node.to_string(), (*id).clone()))
                .collect(),
        )
    }

    /// Waits (bounded) for the first event `pick` accepts.
    async fn first(events: &mut WatchEvents, pick: impl Fn(&Event) -> bool) -> Option<Event> {
        tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(event) = events.recv().await {
                if pick(&event) {
                    return Some(event);
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_watcher_hears_its_owner_and_reports_it_silent_once_it_is_gone() {
        let (dir_tx, dir_rx) = watch::channel(Directory::default());
        let owner = start("owner", dir_rx.clone(), &["watcher"]);
        let mut watcher = start("watcher", dir_rx, &[]);
        dir_tx.send_replace(directory_of(&[&owner.identity, &watcher.identity]));
        // The owner's plan is re-sent so that it looks its watcher up in the new directory.
        owner.handle.send(Command::Plan(Plan {
            me: owner.identity.clone(),
            watchers: vec!["watcher".into()],
            answering: true,
            accused: BTreeMap::new(),
        }));

        // Established: the watcher acknowledged and the owner went fast.
        let deadline = Instant::now() + Duration::from_secs(10);
        while metric(
            &owner.registry,
            "swimlb_owner_watch_received_total{type=\"ack\"}",
        ) < 1.0
        {
            assert!(Instant::now() < deadline, "no acknowledgement");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Alive: half a second of fast heartbeats and no silence.
        let quiet = tokio::time::timeout(Duration::from_millis(500), watcher.events.recv()).await;
        assert!(quiet.is_err(), "an event while the owner lives: {quiet:?}");
        let beats = metric(
            &watcher.registry,
            "swimlb_owner_watch_received_total{type=\"heartbeat\"}",
        );
        assert!(beats >= 5.0, "{beats} heartbeats in over half a second");
        assert_eq!(
            metric(&watcher.registry, "swimlb_owner_watch_dropped_total"),
            0.0
        );

        // The owner's thread stops with its handle: the watcher reports it silent.
        let owner_identity = owner.identity.clone();
        drop(owner.handle);
        let silent = first(&mut watcher.events, |e| matches!(e, Event::Silent { .. })).await;
        match silent {
            Some(Event::Silent { owner, .. }) => assert_eq!(owner, owner_identity),
            other => panic!("no silence reported: {other:?}"),
        }
        // The second check ran and found nothing.
        assert!(
            metric(
                &watcher.registry,
                "swimlb_owner_watch_checks_total{result=\"silent\"}"
            ) >= 1.0
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn forged_replayed_and_stranger_datagrams_are_dropped_and_counted() {
        let (dir_tx, dir_rx) = watch::channel(Directory::default());
        let node = start("watcher", dir_rx, &[]);
        let to = node.handle.local_addr();
        let sender = StdUdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let sender_port = sender.local_addr().unwrap().port();
        let stranger = NodeIdentity {
            node: SmolStr::new("stranger"),
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, sender_port - 1)),
            bump: 5,
        };
        let mut payload = [0u8; heartbeat::MAX_LEN];
        let beat = WatchMessage::Heartbeat {
            incarnation: 5,
            seq: 1,
            interval_ms: 20,
        };
        let len = beat.emit(&mut payload).unwrap();
        let seal = |ring: &KeyRing, stream: &mut SealStream| {
            let mut out = Vec::new();
            ring.seal_in(stream, None, &payload[..len], &mut out)
                .unwrap();
            out
        };
        let mut stream = SealStream::new(sender_id(sender.local_addr().unwrap()), 1).unwrap();
        let wait_for = |what: &str, want: f64| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while metric(&node.registry, what) < want {
                assert!(Instant::now() < deadline, "{what} never reached {want}");
                std::thread::sleep(Duration::from_millis(10));
            }
        };

        // Not in the directory yet: a stranger.
        let first = seal(&ring(), &mut stream);
        sender.send_to(&first, to).unwrap();
        wait_for(
            "swimlb_owner_watch_dropped_total{reason=\"unknown_sender\"}",
            1.0,
        );
        // Sealed with another key.
        let other = KeyRing::new("watch-test", &[[9; 32]]).unwrap();
        sender.send_to(&seal(&other, &mut stream), to).unwrap();
        wait_for(
            "swimlb_owner_watch_dropped_total{reason=\"unauthentic\"}",
            1.0,
        );
        // Garbage.
        sender.send_to(b"not an envelope", to).unwrap();
        wait_for(
            "swimlb_owner_watch_dropped_total{reason=\"unauthentic\"}",
            2.0,
        );
        // A member now: its heartbeat is heard (and armed a detector); the same envelope again
        // is a replay.
        dir_tx.send_replace(directory_of(&[&stranger]));
        let fresh = seal(&ring(), &mut stream);
        // The directory reaches the thread asynchronously: resend fresh envelopes until one is
        // admitted.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut last = fresh;
        loop {
            sender.send_to(&last, to).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            if metric(
                &node.registry,
                "swimlb_owner_watch_received_total{type=\"heartbeat\"}",
            ) >= 1.0
            {
                break;
            }
            assert!(Instant::now() < deadline, "never admitted");
            last = seal(&ring(), &mut stream);
        }
        sender.send_to(&last, to).unwrap();
        wait_for("swimlb_owner_watch_dropped_total{reason=\"replay\"}", 1.0);
        assert_eq!(
            metric(
                &node.registry,
                "swimlb_owner_watch_received_total{type=\"heartbeat\"}"
            ),
            1.0,
            "the replay was not heard"
        );
    }
}
