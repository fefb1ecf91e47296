//! The tokio task around a gossip [`Core`]: it owns the UDP socket, sleeps until the core's next
//! deadline, and publishes the [`LiveSet`] (a `watch`), every [`LiveChange`] (a `broadcast`),
//! the node's [`Phase`] (a `watch`) and when each member that went down was last heard from
//! ([`GossipHandle::last_heard_before_down`], on the tokio clock).
//!
//! One task owns the core; callers talk to it through [`GossipHandle`]. Sends go through a
//! separate sender task (a fresh tokio socket's first immediate `try_send_to` was observed to be
//! lost; awaiting `send_to` from a dedicated task avoids both that and blocking the core).
//! [`GossipHandle::leave`] sends the leave datagrams itself and returns only once they are out.
//!
//! Pauses: the task wakes at least every gossip period while the node is in the mesh, so a turn
//! that starts more than the suspicion timeout after the deadline it slept for means the process
//! was not scheduled (SIGSTOP, a starved VM, a frozen cgroup). The peers may have declared the
//! node down and moved its addresses meanwhile, so the task publishes [`Phase::Paused`] until
//! it has heard an authentic datagram again and then, unless it learnt it was declared down and
//! rejoined, the longest an unconfirmed suspicion lasts in a cluster of its size plus a probe
//! period has passed (the cluster's news, its own down included, has arrived by then: 230 ms up
//! to 4 members in the `fast` timing, where no confirmation is wanted, 980 ms from 5); the daemon
//! holds every answer meanwhile (see `run::hold::JoinHold`).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use swimlb_proto::KeyRing;
use swimlb_proto::envelope::MAX_DATAGRAM_LEN;
use tokio::net::UdpSocket;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::core::{Core, GossipError, GossipSettings, Outgoing, Phase, WatchRelayed};
use super::identity::NodeIdentity;
use super::metadata::FastMap;
use super::metrics::GossipMetrics;
use super::wire_rule::WireRule;
use crate::model::membership::{LiveChange, LiveSet, MemberMeta, NodeName};

/// How many changes a slow subscriber may fall behind before it sees `Lagged`.
const CHANGE_BACKLOG: usize = 4096;
/// Datagrams queued for the sender task before new ones are dropped.
const SEND_QUEUE: usize = 4096;
/// Owner-watch payloads received through the gossip and queued for the watch before new ones
/// are dropped (a claim or refutation per member and failover: a few at a time).
const WATCH_QUEUE: usize = 256;

#[derive(Debug)]
enum Command {
    SetMeta(MemberMeta, oneshot::Sender<Result<(), GossipError>>),
    SetKeyRing(Box<KeyRing>, oneshot::Sender<()>),
    SetSeeds(Vec<SocketAddr>),
    RelayWatch(Vec<u8>),
    PeerAddresses(oneshot::Sender<Vec<std::net::IpAddr>>),
    Leave(oneshot::Sender<()>),
}

/// The owner watch's second path, through the gossip (see [`Core::relay_watch`]): what it
/// sends this way and what arrives. Taken once, by the watch ([`GossipHandle::watch_link`]).
#[derive(Debug)]
pub struct WatchLink {
    commands: mpsc::Sender<Command>,
    received: mpsc::Receiver<WatchRelayed>,
    heard: WatchHeard,
    rule: WireRule,
}

impl WatchLink {
    /// Queues `payload` for every alive member; a full queue drops it (the watch port carries
    /// its own copy, and refutations repeat).
    pub fn relay(&self, payload: Vec<u8>) {
        if self
            .commands
            .try_send(Command::RelayWatch(payload))
            .is_err()
        {
            tracing::debug!("gossip command queue full; watch relay dropped");
        }
    }

    /// Tells the gossip that the watch heard the member at gossip address `addr`, identity
    /// `bump`, alive ([`Core::heard_on_watch`]); the gossip task reads it on its next turn.
    pub fn heard(&self, addr: SocketAddr, bump: u64) {
        self.heard
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(addr, (bump, Instant::now()));
    }

    /// The next watch payload received through the gossip; `None` once the gossip stopped.
    pub async fn recv(&mut self) -> Option<WatchRelayed> {
        self.received.recv().await
    }

    /// The gossip's wire rule, for the watch to seal and open by (see [`super::wire_rule`]).
    pub fn wire_rule(&self) -> WireRule {
        self.rule.clone()
    }
}

/// When each member that went down or left was last heard from (see
/// [`GossipHandle::last_heard_before_down`]): written by the task before it publishes the
/// `Down`, so a subscriber that reads it on the change finds the entry.
type HeardBeforeDown = Arc<Mutex<FastMap<NodeName, Instant>>>;

/// The members the owner watch heard alive since the gossip task last looked, by gossip
/// address: identity bump and when (see [`WatchLink::heard`]).
type WatchHeard = Arc<Mutex<FastMap<SocketAddr, (u64, Instant)>>>;

/// What the gossip task is told: the handle's commands, and what the owner watch heard.
struct Inputs {
    commands: mpsc::Receiver<Command>,
    watch_heard: WatchHeard,
}

impl Inputs {
    /// Hands `core` what the owner watch heard since the last call.
    fn hand_watch_heard(&self, core: &mut Core, origin: Instant) {
        let heard: Vec<_> = self
            .watch_heard
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .collect();
        for (addr, (bump, at)) in heard {
            core.heard_on_watch(at.saturating_duration_since(origin), addr, bump);
        }
    }
}

/// The identities of the alive members, this node excluded, by node name (see
/// [`GossipHandle::directory`]).
pub type Directory = Arc<std::collections::BTreeMap<NodeName, NodeIdentity>>;

/// The caller's side of a running gossip task.
#[derive(Debug)]
pub struct GossipHandle {
    live: watch::Receiver<LiveSet>,
    changes: broadcast::Sender<LiveChange>,
    heard_before_down: HeardBeforeDown,
    identity: watch::Receiver<NodeIdentity>,
    directory: watch::Receiver<Directory>,
    phase: watch::Receiver<Phase>,
    commands: mpsc::Sender<Command>,
    watch_inbox: Mutex<Option<mpsc::Receiver<WatchRelayed>>>,
    watch_heard: WatchHeard,
    local_addr: SocketAddr,
    rule: WireRule,
    task: JoinHandle<()>,
}

impl GossipHandle {
    /// The alive members and their metadata, updated after every event.
    pub fn live(&self) -> watch::Receiver<LiveSet> {
        self.live.clone()
    }

    /// Every change to the live set from now on, in order.
    pub fn subscribe(&self) -> broadcast::Receiver<LiveChange> {
        self.changes.subscribe()
    }

    /// When `node`, which went down or left, was last heard from (its last datagram that opened
    /// here); `None` while it is alive, and when none of its datagrams ever reached this node
    /// directly ([`Core::last_heard_before_down`]). Set before its `Down` is published.
    pub fn last_heard_before_down(&self, node: &str) -> Option<Instant> {
        self.heard_before_down
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(node)
            .copied()
    }

    /// The node's current identity (renewed when it learns it was declared down).
    pub fn identity(&self) -> NodeIdentity {
        self.identity.borrow().clone()
    }

    /// The identity, watched: it changes when the node renews itself after being declared down.
    pub fn identity_changes(&self) -> watch::Receiver<NodeIdentity> {
        self.identity.clone()
    }

    /// Who the alive members are on the wire (name, gossip address, bump), updated when a
    /// member comes up, goes down or renews its identity.
    pub fn directory(&self) -> watch::Receiver<Directory> {
        self.directory.clone()
    }

    /// The node's phase, watched: `Active` once it has joined the mesh, `Joining` before and
    /// whenever it has lost every member.
    pub fn phase(&self) -> watch::Receiver<Phase> {
        self.phase.clone()
    }

    /// The owner watch's path through the gossip; `None` after the first call.
    pub fn watch_link(&self) -> Option<WatchLink> {
        let received = self
            .watch_inbox
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()?;
        Some(WatchLink {
            commands: self.commands.clone(),
            received,
            heard: self.watch_heard.clone(),
            rule: self.rule.clone(),
        })
    }

    /// The wire rule this node seals and opens by ([`super::wire_rule`]): the mesh's envelope
    /// version as this node sees it.
    pub fn wire_rule(&self) -> &WireRule {
        &self.rule
    }

    /// The address the socket is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Replaces this node's metadata and gossips it, with the envelope versions this node
    /// announces ([`WireRule::announcement`]) whatever `meta` says.
    pub async fn set_meta(&self, mut meta: MemberMeta) -> Result<(), GossipError> {
        meta.wire = self.rule.announcement();
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::SetMeta(meta, reply))
            .await
            .map_err(|_| GossipError::Stopped)?;
        answer.await.map_err(|_| GossipError::Stopped)?
    }

    /// Replaces the key ring. Rotation (docs/src/install/upgrade.md): add the new key second
    /// everywhere, then put it first everywhere, then drop the old one. A node answers each peer
    /// with the key that peer seals with, so rings `[new, old]` and `[old]` interoperate, and
    /// offers its sealing key to peers on another one (see `Wire::seal`), so once every ring
    /// seals with the new key every pair uses it and dropping the old key refuses nothing.
    pub async fn set_key_ring(&self, ring: KeyRing) -> Result<(), GossipError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::SetKeyRing(Box::new(ring), reply))
            .await
            .map_err(|_| GossipError::Stopped)?;
        answer.await.map_err(|_| GossipError::Stopped)
    }

    /// Replaces the seeds; new ones are announced to at once (see [`Core::set_seeds`]).
    pub async fn set_seeds(&self, seeds: Vec<SocketAddr>) -> Result<(), GossipError> {
        self.commands
            .send(Command::SetSeeds(seeds))
            .await
            .map_err(|_| GossipError::Stopped)
    }

    /// Every address this node gossips with or would ([`Core::peer_addresses`]); empty once
    /// the task has stopped.
    pub async fn peer_addresses(&self) -> Vec<std::net::IpAddr> {
        let (reply, answer) = oneshot::channel();
        if self
            .commands
            .send(Command::PeerAddresses(reply))
            .await
            .is_err()
        {
            return Vec::new();
        }
        answer.await.unwrap_or_default()
    }

    /// Leaves the cluster: returns once the leave datagrams are sent and the task has stopped.
    pub async fn leave(self) -> Result<(), GossipError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Leave(reply))
            .await
            .map_err(|_| GossipError::Stopped)?;
        answer.await.map_err(|_| GossipError::Stopped)?;
        let _ = self.task.await;
        Ok(())
    }

    /// Stops the task without leaving (peers will detect a crash).
    pub fn abort(self) {
        self.task.abort();
    }
}

/// Binds `bind`, starts a core for `settings` and runs it in a new task. `settings.addr` is
/// the address peers know this node by (usually `bind`; when `bind` has port 0, the bound
/// address is used instead). The wire rule is this build's, unless `SWIMLB_ENVELOPE_VERSION`
/// asks for the previous release's behaviour ([`WireRule::from_env`]; an unknown value is an
/// error).
pub async fn spawn(
    settings: GossipSettings,
    bind: SocketAddr,
    ring: KeyRing,
    meta: MemberMeta,
    metrics: GossipMetrics,
) -> Result<GossipHandle, GossipError> {
    let rule = WireRule::from_env().map_err(|err| {
        tracing::error!(error = %err, "envelope version");
        GossipError::Envelope(swimlb_proto::Error::OutOfRange(
            "SWIMLB_ENVELOPE_VERSION accepts 2 or 3",
        ))
    })?;
    spawn_with_rule(settings, bind, ring, meta, metrics, rule).await
}

/// [`spawn`] with the wire rule `rule` (tests run speakers of both behaviours in one process).
pub async fn spawn_with_rule(
    mut settings: GossipSettings,
    bind: SocketAddr,
    ring: KeyRing,
    mut meta: MemberMeta,
    metrics: GossipMetrics,
    rule: WireRule,
) -> Result<GossipHandle, GossipError> {
    let socket = UdpSocket::bind(bind)
        .await
        .map_err(|source| GossipError::Socket { addr: bind, source })?;
    let local_addr = socket
        .local_addr()
        .map_err(|source| GossipError::Socket { addr: bind, source })?;
    if bind.port() == 0 {
        settings.addr = local_addr;
    }
    let origin = Instant::now();
    let pause = PauseWatch::new(&settings.timing);
    meta.wire = rule.announcement();
    let mut core = Core::new(settings, ring, meta, metrics.clone(), Duration::ZERO)?;
    core.set_wire_rule(rule.clone());
    let socket = Arc::new(socket);
    let (live_tx, live_rx) = watch::channel(core.live().clone());
    let (identity_tx, identity_rx) = watch::channel(core.identity().clone());
    let (phase_tx, phase_rx) = watch::channel(core.phase());
    let (directory_tx, directory_rx) = watch::channel(directory(&core));
    let members_version = core.members_version();
    let (changes_tx, _) = broadcast::channel(CHANGE_BACKLOG);
    let heard_before_down = HeardBeforeDown::default();
    let watch_heard = WatchHeard::default();
    let (commands_tx, commands_rx) = mpsc::channel(16);
    let (watch_tx, watch_rx) = mpsc::channel(WATCH_QUEUE);
    let (send_tx, send_rx) = mpsc::channel(SEND_QUEUE);
    tokio::spawn(send_loop(socket.clone(), send_rx));
    let task = tokio::spawn(run(
        core,
        pause,
        origin,
        socket,
        send_tx,
        Inputs {
            commands: commands_rx,
            watch_heard: watch_heard.clone(),
        },
        Published {
            origin,
            live: live_tx,
            identity: identity_tx,
            directory: (directory_tx, members_version),
            phase: phase_tx,
            changes: changes_tx.clone(),
            heard_before_down: heard_before_down.clone(),
            watch: watch_tx,
            rule: (rule.clone(), metrics),
        },
    ));
    Ok(GossipHandle {
        live: live_rx,
        changes: changes_tx,
        heard_before_down,
        identity: identity_rx,
        directory: directory_rx,
        phase: phase_rx,
        commands: commands_tx,
        watch_inbox: Mutex::new(Some(watch_rx)),
        watch_heard,
        local_addr,
        rule,
        task,
    })
}

async fn send_loop(socket: Arc<UdpSocket>, mut queue: mpsc::Receiver<Outgoing>) {
    while let Some(out) = queue.recv().await {
        if let Err(err) = socket.send_to(&out.bytes, out.to).await {
            tracing::debug!(to = %out.to, error = %err, "gossip send");
        }
    }
}

/// What the task publishes after every event.
struct Published {
    /// The instant the core's clock counts from.
    origin: Instant,
    live: watch::Sender<LiveSet>,
    identity: watch::Sender<NodeIdentity>,
    /// The directory and the members version it was built at.
    directory: (watch::Sender<Directory>, u64),
    phase: watch::Sender<Phase>,
    changes: broadcast::Sender<LiveChange>,
    heard_before_down: HeardBeforeDown,
    /// Owner-watch payloads received through the gossip. Bounded: without a watch to read
    /// them they are dropped once the queue is full.
    watch: mpsc::Sender<WatchRelayed>,
    /// The wire rule, updated when the members or their records change, and the metrics its
    /// version is shown in.
    rule: (WireRule, GossipMetrics),
}

/// The directory of `core`'s members now.
fn directory(core: &Core) -> Directory {
    Arc::new(
        core.member_identities()
            .map(|id| (id.node.to_string(), id.clone()))
            .collect(),
    )
}

/// Notices that the task was not scheduled for a while, and when the node hears the cluster
/// again (see the module docs). Pure: `now` is an argument.
#[derive(Debug)]
struct PauseWatch {
    /// How late a turn may start before it counts as a pause.
    limit: Duration,
    /// How long after the first datagram heard again the pause ends, once the node knows where
    /// it stands: it was declared down and has rejoined under a renewed identity.
    settle: Duration,
    /// How long after the first datagram heard again the pause ends when no "you are down"
    /// came: the longest suspicion the members run (`Core::unconfirmed_suspicion`, as of the
    /// last turn) plus a probe period, by when the cluster would have said so.
    long_settle: Duration,
    probe_period: Duration,
    paused: bool,
    /// `Core::heard` when the pause was noticed.
    heard_before: u64,
    /// `Core::rejoins` when the pause was noticed.
    rejoins_before: u64,
    heard_again: Option<Instant>,
    rejoined: bool,
}

impl PauseWatch {
    fn new(timing: &super::Timing) -> PauseWatch {
        PauseWatch {
            limit: timing.suspect_to_down_after,
            settle: timing.suspect_to_down_after + timing.probe_period,
            long_settle: timing
                .suspect_to_down_after
                .saturating_mul(timing.suspicion_max_mult.max(1))
                + timing.probe_period,
            probe_period: timing.probe_period,
            paused: false,
            heard_before: 0,
            rejoins_before: 0,
            heard_again: None,
            rejoined: false,
        }
    }

    /// One turn of the task that had planned to wake at `planned`, with `heard` datagrams
    /// received and `rejoins` renewals of its identity so far, while an unconfirmed suspicion
    /// lasts `suspicion` (`Core::unconfirmed_suspicion`); returns whether the node counts as
    /// paused.
    ///
    /// A paused node must not answer before it knows whether the cluster declared it down (and
    /// moved its addresses): it waits to hear the cluster, then either for its own renewal (it
    /// was declared down: its record is unsettled now, so it ranks last until it settles) and
    /// `settle`, or, without one, for `long_settle`, by when a "you are down" would have come.
    fn turn(
        &mut self,
        now: Instant,
        planned: Instant,
        (heard, rejoins): (u64, u64),
        suspicion: Duration,
    ) -> bool {
        self.long_settle = suspicion + self.probe_period;
        let late = now.saturating_duration_since(planned);
        if late > self.limit {
            if !self.paused {
                tracing::warn!(
                    late_ms = late.as_millis() as u64,
                    "gossip was not scheduled for longer than the suspicion timeout: answering nothing until the cluster is heard again"
                );
            }
            self.paused = true;
            self.heard_before = heard;
            self.rejoins_before = rejoins;
            self.heard_again = None;
            self.rejoined = false;
        }
        if self.paused {
            if self.heard_again.is_none() && heard > self.heard_before {
                self.heard_again = Some(now);
            }
            self.rejoined |= rejoins > self.rejoins_before;
            if self.next_deadline().is_some_and(|end| now >= end) {
                tracing::info!("the cluster is heard again after a pause");
                self.paused = false;
            }
        }
        self.paused
    }

    /// When the pause may end (a wake-up the task must not sleep past).
    fn next_deadline(&self) -> Option<Instant> {
        let wait = if self.rejoined {
            self.settle
        } else {
            self.long_settle
        };
        self.heard_again.filter(|_| self.paused).map(|t| t + wait)
    }
}

async fn run(
    mut core: Core,
    mut pause: PauseWatch,
    origin: Instant,
    socket: Arc<UdpSocket>,
    send: mpsc::Sender<Outgoing>,
    mut inputs: Inputs,
    mut published: Published,
) {
    // One byte more than the envelope allows, so oversized datagrams are seen (and counted) as
    // such instead of silently truncated.
    let mut buf = vec![0u8; MAX_DATAGRAM_LEN + 1];
    publish(&mut core, &socket, &send, &mut published, false);
    loop {
        // A deadline already past (a parked gossip timer that has something to send now) is
        // planned for now: the pause watch must not read the wait for it as a pause.
        let planned = core
            .next_deadline()
            .map(|at| (origin + at).max(Instant::now()))
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        let deadline = pause.next_deadline().map_or(planned, |at| at.min(planned));
        tokio::select! {
            received = socket.recv_from(&mut buf) => match received {
                Ok((len, from)) => {
                    let now = origin.elapsed();
                    core.handle_datagram(now, from, &mut buf[..len]);
                }
                Err(err) => tracing::debug!(error = %err, "gossip receive"),
            },
            () = tokio::time::sleep_until(deadline) => {
                // Suspicions end on timers: they see what the watch heard until now.
                inputs.hand_watch_heard(&mut core, origin);
                core.handle_due_timers(origin.elapsed());
            }
            command = inputs.commands.recv() => match command {
                Some(Command::SetMeta(meta, reply)) => {
                    let _ = reply.send(core.set_meta(origin.elapsed(), meta));
                }
                Some(Command::SetKeyRing(ring, reply)) => {
                    core.set_key_ring(*ring);
                    let _ = reply.send(());
                }
                Some(Command::SetSeeds(seeds)) => core.set_seeds(origin.elapsed(), seeds),
                Some(Command::RelayWatch(payload)) => core.relay_watch(&payload),
                Some(Command::PeerAddresses(reply)) => {
                    let _ = reply.send(core.peer_addresses());
                }
                Some(Command::Leave(reply)) => {
                    core.leave(origin.elapsed());
                    for out in core.drain_outgoing() {
                        if let Err(err) = socket.send_to(&out.bytes, out.to).await {
                            tracing::debug!(to = %out.to, error = %err, "gossip leave send");
                        }
                    }
                    let _ = reply.send(());
                    return;
                }
                None => {
                    // Every handle is gone: leave, as on shutdown.
                    core.leave(origin.elapsed());
                    for out in core.drain_outgoing() {
                        let _ = socket.send_to(&out.bytes, out.to).await;
                    }
                    return;
                }
            },
        }
        // Only a node in the mesh wakes often enough for a late turn to mean a pause.
        let in_mesh = core.phase() == Phase::Active;
        let paused = in_mesh
            && pause.turn(
                Instant::now(),
                planned,
                (core.heard(), core.rejoins()),
                core.unconfirmed_suspicion(),
            );
        publish(&mut core, &socket, &send, &mut published, paused);
    }
}

fn publish(
    core: &mut Core,
    socket: &UdpSocket,
    send: &mpsc::Sender<Outgoing>,
    published: &mut Published,
    paused: bool,
) {
    let Published {
        origin,
        live,
        identity,
        directory: (directory_tx, directory_version),
        phase,
        changes,
        heard_before_down,
        watch,
        rule,
    } = published;
    for relayed in core.drain_watch() {
        let _ = watch.try_send(relayed);
    }
    // Straight to the socket: handing each datagram to the send task cost a wake-up of another
    // task (often of another thread). The task only takes what the socket cannot take at once.
    for out in core.drain_outgoing() {
        match socket.try_send_to(&out.bytes, out.to) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if send.try_send(out).is_err() {
                    tracing::debug!("gossip send queue full; datagram dropped");
                }
            }
            Err(err) => tracing::debug!(to = %out.to, error = %err, "gossip send"),
            Ok(_) => {}
        }
    }
    // The live set is published before the changes: a subscriber that reads it on a change must
    // see the state that includes that change.
    let pending: Vec<LiveChange> = core.drain_changes().collect();
    if !pending.is_empty() {
        live.send_replace(core.live().clone());
    }
    // Likewise when a member that went down was last heard from, before its `Down`.
    if pending
        .iter()
        .any(|c| matches!(c, LiveChange::Up(_) | LiveChange::Down(_)))
    {
        let mut heard = heard_before_down
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for change in &pending {
            match change {
                LiveChange::Up(node) => {
                    heard.remove(node);
                }
                LiveChange::Down(node) => match core.last_heard_before_down(node) {
                    Some(at) => {
                        heard.insert(node.clone(), *origin + at);
                    }
                    None => {
                        heard.remove(node);
                    }
                },
                LiveChange::Meta(_) => {}
            }
        }
    }
    // The mesh's envelope version, before anything else is sent: from the members held alive
    // and the records that name them.
    let members_changed = *directory_version != core.members_version();
    if members_changed || !pending.is_empty() {
        update_wire_rule(core, rule);
    }
    // The directory before the changes too: a subscriber that looks a member up on its `Up`
    // finds it.
    if members_changed {
        *directory_version = core.members_version();
        directory_tx.send_replace(directory(core));
    }
    for change in pending {
        let _ = changes.send(change);
    }
    if *identity.borrow() != *core.identity() {
        identity.send_replace(core.identity().clone());
    }
    let now = if paused { Phase::Paused } else { core.phase() };
    phase.send_if_modified(|p| std::mem::replace(p, now) != now);
}

/// Recomputes `rule` from `core`'s members and their records ([`WireRule::update`]) and
/// shows the mesh's version in the metrics.
fn update_wire_rule(core: &Core, (rule, metrics): &(WireRule, GossipMetrics)) {
    let live = core.live();
    let version = rule.update(core.member_identities().map(|id| {
        let announced = live.get(&id.node).map(|meta| meta.wire).unwrap_or_default();
        (id.addr, id.bump, announced)
    }));
    metrics.set_envelope_version(version);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A turn that starts when it was planned, at `at`, with `seen` datagrams and renewals.
    fn on_time(watch: &mut PauseWatch, at: Instant, seen: (u64, u64), suspicion: Duration) -> bool {
        watch.turn(at, at, seen, suspicion)
    }

    #[test]
    fn a_late_turn_is_a_pause_until_the_cluster_is_heard_again_and_settles() {
        let timing = super::super::Timing::fast();
        let limit = timing.suspect_to_down_after;
        let settle = timing.suspect_to_down_after + timing.probe_period;
        // A cluster large enough to want confirmations: an unconfirmed suspicion runs longest.
        let unconfirmed = timing.suspect_to_down_after * timing.suspicion_max_mult;
        let long = unconfirmed + timing.probe_period;
        assert!(long > settle);
        let mut watch = PauseWatch::new(&timing);
        let t0 = Instant::now();
        assert!(
            !watch.turn(t0 + limit, t0, (5, 0), unconfirmed),
            "late by exactly the limit: not a pause"
        );
        // Declared down meanwhile: free once heard, renewed, and settled.
        let resumed = t0 + ms(2000);
        assert!(
            watch.turn(resumed, t0 + ms(20), (5, 0), unconfirmed),
            "two seconds late"
        );
        assert!(
            watch.turn(resumed + ms(50), resumed + ms(60), (5, 0), unconfirmed),
            "nothing heard yet"
        );
        assert_eq!(watch.next_deadline(), None);
        assert!(
            watch.turn(resumed + ms(60), resumed + ms(70), (6, 0), unconfirmed),
            "heard: settling"
        );
        assert_eq!(watch.next_deadline(), Some(resumed + ms(60) + long));
        assert!(
            on_time(&mut watch, resumed + ms(60) + settle, (9, 0), unconfirmed),
            "heard and settled, but the cluster has not said whether it declared us down"
        );
        assert!(
            !on_time(&mut watch, resumed + ms(70) + settle, (9, 1), unconfirmed),
            "renewed: we know where we stand"
        );
        assert_eq!(watch.next_deadline(), None);
        // Not declared down (a shorter pause): free after the long settle.
        let again = resumed + ms(10_000);
        assert!(watch.turn(again, resumed + ms(8_000), (9, 1), unconfirmed));
        assert!(on_time(&mut watch, again + ms(10), (10, 1), unconfirmed));
        assert!(on_time(
            &mut watch,
            again + ms(10) + settle,
            (12, 1),
            unconfirmed
        ));
        assert!(!on_time(
            &mut watch,
            again + ms(10) + long,
            (14, 1),
            unconfirmed
        ));
    }

    #[test]
    fn in_a_small_cluster_a_pause_nobody_declared_ends_after_the_short_settle() {
        let timing = super::super::Timing::fast();
        // Up to 4 members no confirmation is wanted: a suspicion lasts its shortest.
        let unconfirmed = timing.suspect_to_down_after;
        let settle = unconfirmed + timing.probe_period;
        let mut watch = PauseWatch::new(&timing);
        let t0 = Instant::now();
        let resumed = t0 + ms(2000);
        assert!(watch.turn(resumed, t0 + ms(20), (5, 0), unconfirmed));
        assert!(on_time(&mut watch, resumed + ms(10), (6, 0), unconfirmed));
        assert_eq!(watch.next_deadline(), Some(resumed + ms(10) + settle));
        assert!(on_time(
            &mut watch,
            resumed + ms(9) + settle,
            (8, 0),
            unconfirmed
        ));
        assert!(
            !on_time(&mut watch, resumed + ms(10) + settle, (9, 0), unconfirmed),
            "no renewal, but a \"you are down\" would have come by now"
        );
    }
}
