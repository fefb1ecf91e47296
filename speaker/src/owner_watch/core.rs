//! The owner watch's protocol, sans-IO: heartbeats to the watchers, the watcher's [`Detector`]s,
//! the second check (polls and relays), claims, refutations and pauses. One [`WatchCore`] per
//! node; the socket thread ([`super::service`]) and the lab's simulator drive this same code.
//! The timers are in `ticks`, what is received in `receive`.
//!
//! The core never reads a clock, opens a socket, logs or draws system randomness. Time is a
//! [`Duration`] since an origin the caller picks, passed into every call, as in
//! [`crate::gossip::Core`]. Each call may queue sealed datagrams ([`WatchCore::drain_outgoing`])
//! and [`Event`]s for the daemon ([`WatchCore::drain_events`]) and move the next wake-up
//! ([`WatchCore::next_deadline`]), at which the caller calls [`WatchCore::tick`].
//!
//! Guarantees:
//! - Nothing a peer sends can panic the core: a datagram that does not open, comes from no
//!   member's watch address (but a poll), is replayed, does not parse or is stale is dropped
//!   and counted by [`DropReason`].
//! - Every datagram is sealed with the gossip key ring under this node's watch stream (sender
//!   id: a hash of its watch address; epoch: its identity bump at start).
//! - One heartbeat sequence counter for all watchers, so a watcher dropped and taken back, or
//!   the streams restarted after a pause, never sees a number it has seen.
//! - **The owner's side.** The daemon's [`Plan`] names the watchers (at most [`MAX_WATCHERS`]).
//!   Each gets a [`Schedule`]; a watcher dropped gets a last heartbeat promising
//!   [`FAREWELL_INTERVAL_MS`]. A poll is answered `alive` only for this node's current
//!   incarnation, and not after a pause; it is answered whoever sends it with the key, member
//!   here or not (a watcher this node declared down still polls it).
//! - **The watcher's side.** A heartbeat from a member of the directory arms a [`Detector`].
//!   One interval before the silence deadline with nothing heard, the second check starts: a
//!   poll to the owner and a relay request to a third member, again half an interval later
//!   ([`CHECK_ROUNDS`]). An answer vouches for the owner; an owner that answers polls but has
//!   stopped sending heartbeats is dropped after the second such vouch. At the deadline with no
//!   answer, [`Event::Silent`], unless the gossip no longer holds that incarnation; again with
//!   each plan for [`SILENT_AGAIN_WITHIN`] while nothing is heard from the owner, not after a
//!   refutation or a poll's answer (the daemon's answer may differ: the one before this node in
//!   line may have been accused meanwhile).
//! - **Those ahead in line.** An owner sends heartbeats to the members that succeed it, not
//!   to those that succeed them: a watcher that finds an owner silent, but is not the next in
//!   line, cannot tell whether the members before it are alive when they own nothing (they send
//!   it nothing). The daemon asks ([`Command::Check`]); the core polls such a member directly
//!   and through another member, [`CHECK_ROUNDS`] times half an interval apart, and reports it
//!   [`Event::Silent`] when nothing answered within [`POLL_WAIT`] of the last round (an answer
//!   ends the check quietly). Without it, an owner and the next in line failing together (a
//!   rack's power) left the owner's IPs to the gossip's verdict on the second, about a second.
//! - **The accuser's side.** A member the plan accuses (this node claimed IPs from it, or took
//!   another's claim) is checked again the same way (a poll and a relay request) every
//!   [`POLL_WAIT`] while the plan accuses it in that incarnation; the first answer that it is
//!   alive is reported as a refutation would be ([`Event::Alive`]), for an owner the claim
//!   never reached or whose refutation does not reach this node. Each round is asked of the
//!   gossip too (a relay request in [`WatchCore::drain_relays`]): its pings and inquiries reach
//!   the member in the accused identity on the gossip's port, whose paths may live where every
//!   watch path is cut; an answer comes back as a refutation through the gossip.
//! - **Pauses.** A tick later than `M x I` past its deadline means the caller was not scheduled
//!   for longer than a watcher waits: the core sends no heartbeat, denies every poll, forgets
//!   the owners it watched and reports none silent from then on, and says [`Event::Paused`]
//!   (the gossip may have declared it down meanwhile); a plan that holds its answers
//!   ([`Plan::held`]), then one that does not, ends it.
//!   A refutation asked for during a pause (or cut short by one) goes out when the pause ends
//!   in the same incarnation: the node answers again, and the members that took a claim
//!   against it would otherwise elect without it until the accusation lapses.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use swimlb_proto::heartbeat::{self, NodeRef};
use swimlb_proto::{KeyRing, SealStream, WatchMessage};

use super::metrics::WatchMetrics;
use super::{Detector, Grid, Schedule};
use crate::gossip::replay::{ReplayGuard, sender_id};
use crate::gossip::{Directory, NodeIdentity, Outgoing};
use crate::model::membership::NodeName;
use crate::model::watch_knobs::Knobs;

#[cfg(test)]
mod model_check;
mod receive;
mod ticks;

/// At most this many watchers per owner (the issue's `K`).
pub const MAX_WATCHERS: usize = 3;
/// A member heard alive on the watch is reported to the gossip at most this often
/// ([`WatchCore::drain_heard`]).
pub const HEARD_REPORT_EVERY: Duration = Duration::from_millis(50);
/// How long a relay waits for the target's answer, and a poll's nonce is remembered.
pub const POLL_WAIT: Duration = Duration::from_millis(100);
/// Refutations are sent this many times, one interval apart.
const REFUTE_REPEAT: u32 = 3;

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

/// An owner found silent this recently (and not heard since) is reported silent again when the
/// plan changes: a member that was not its successor then may be now (the one before it in line
/// accused meanwhile). An older silence is not: its second check is too old to act on.
pub const SILENT_AGAIN_WITHIN: Duration = Duration::from_secs(1);

/// A member's watch address: its gossip address with the port one higher (`None` for port
/// 65,535).
pub fn watch_addr(gossip: SocketAddr) -> Option<SocketAddr> {
    let port = gossip.port().checked_add(1)?;
    let mut addr = gossip;
    addr.set_port(port);
    Some(addr)
}

/// What the daemon wants the watch to do, sent whenever it changes (and on every membership
/// change: each plan reports the owners still silent again, see [`SILENT_AGAIN_WITHIN`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// This node's current identity (its bump is the heartbeats' incarnation).
    pub me: NodeIdentity,
    /// Whom to send heartbeats to: the first successors of the IPs this node answers for (the
    /// daemon's `WATCH_DEPTH`), at most [`MAX_WATCHERS`].
    pub watchers: Vec<NodeName>,
    /// Whether the daemon holds this node's answers (at start, after a pause): ends a pause.
    pub held: bool,
    /// The members accused here, with the incarnation accused: a heartbeat from one of them in
    /// that incarnation is reported ([`Event::Alive`]).
    pub accused: BTreeMap<NodeName, u64>,
}

/// A request to the watch.
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
    /// `member`, which sends this node no heartbeats, stands before it in line for a silent
    /// owner's IPs: poll it, and report it [`Event::Silent`] if it does not answer.
    Check {
        /// The member, as the gossip knows it.
        member: NodeIdentity,
    },
    /// This node's accusation of `owner` ended (refuted or lapsed) while it answers IPs taken
    /// from it, which it now hands back: repeat the claim to `owner` alone (not to the others,
    /// which would accuse it again), so that an owner that never heard it (its link was down)
    /// refutes it and announces its IPs instead of leaving two nodes answering until the
    /// hand-over deadline.
    Remind {
        /// An IP taken over from `owner` (for its log).
        ip: IpAddr,
        /// The owner, alive, as the gossip knows it.
        owner: NodeIdentity,
    },
    /// What this node was told moved `ip` from `from` to `to`, both alive, one of them this
    /// node: tell the other one, so it follows before its own view does.
    Move {
        /// The IP.
        ip: IpAddr,
        /// The owner before.
        from: NodeIdentity,
        /// The owner now.
        to: NodeIdentity,
    },
}

/// What the watch tells the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A watched owner sent nothing for a whole window and failed the second check, or a
    /// member checked on request ([`Command::Check`]) did not answer.
    Silent {
        /// The owner, as the directory knows it.
        owner: NodeIdentity,
        /// How long ago its last fresh heartbeat arrived.
        silent_for: Duration,
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
    /// Member `sender`, one of the two, says `ip` moved from `from` to `to`.
    Moved {
        /// Who says so (`from` or `to`).
        sender: NodeName,
        /// The IP.
        ip: IpAddr,
        /// The owner before.
        from: NodeName,
        /// The owner now.
        to: NodeName,
    },
    /// An accused member was heard in the accused incarnation: it is alive.
    Alive {
        /// The member.
        node: NodeName,
        /// The incarnation heard.
        incarnation: u64,
    },
    /// The caller was not scheduled for longer than a watcher waits.
    Paused {
        /// How late its timer fired.
        late: Duration,
    },
}

/// A poll this node sent (directly or for a requester), by nonce.
#[derive(Debug)]
struct PendingPoll {
    /// The owner polled.
    target: NodeName,
    /// What the answer is for.
    purpose: Purpose,
    expires: Duration,
}

/// What a poll's answer is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// The second check of a watched owner.
    SecondCheck,
    /// A relay: answer `requester` with its `nonce`.
    Relay { requester: SocketAddr, nonce: u64 },
    /// The recheck of this node's own accusation of that incarnation (see [`Recheck`]).
    Accusation { incarnation: u64 },
    /// The check of a member ahead in line, in that incarnation (see [`AheadCheck`]).
    Ahead { incarnation: u64 },
}

/// A member checked on the daemon's request ([`Command::Check`]): rounds of a poll and a
/// relay request half an interval apart, then a verdict [`POLL_WAIT`] after the last.
#[derive(Debug)]
struct AheadCheck {
    /// The incarnation checked.
    incarnation: u64,
    /// When the check started.
    started: Duration,
    /// Rounds sent (0 to [`CHECK_ROUNDS`]).
    rounds_sent: u32,
}

impl AheadCheck {
    /// When the next round goes out (the second check's rounds, as if its deadline were one
    /// interval away), or the verdict is due: a poll's wait after the last round.
    fn next_at(&self, interval: Duration) -> Duration {
        let deadline = self.started + interval;
        check_round_at(deadline, interval, self.rounds_sent).unwrap_or_else(|| {
            check_round_at(deadline, interval, CHECK_ROUNDS - 1).unwrap_or(deadline) + POLL_WAIT
        })
    }
}

/// A member this node accuses (it claimed IPs from it, or took another's claim), checked
/// again while the plan accuses it: every
/// [`POLL_WAIT`] a poll and a relay request, as in the second check. The claim may never reach
/// a live owner (both its ports cut from this node, while a third member, too slow to relay
/// in time, still reaches both), and then both answer until the accusation lapses; an answer
/// through any path ends it as a refutation would ([`Event::Alive`]).
#[derive(Debug)]
struct Recheck {
    /// The incarnation accused.
    incarnation: u64,
    /// When the next round goes out.
    next: Duration,
}

/// A watched owner.
#[derive(Debug)]
struct Watched {
    detector: Detector,
    /// Rounds of the second check sent in the current window (0 to [`CHECK_ROUNDS`]).
    checks_sent: u32,
    /// Polls answered with no heartbeat in between.
    vouches_without_beat: u32,
    last_heard: Duration,
    /// When the detector last found the owner silent.
    silent_at: Option<Duration>,
}

/// Where a pause stands (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pause {
    /// Waiting for a plan that holds the answers.
    Held,
    /// Waiting for a plan that no longer holds them.
    Releasing,
}

/// One node's owner watch (see the module docs).
#[derive(Debug)]
pub struct WatchCore {
    knobs: Knobs,
    ring: KeyRing,
    stream: SealStream,
    /// Which envelope version each datagram is sealed in (the gossip's, see
    /// [`crate::gossip::wire_rule`]).
    wire: crate::gossip::WireRule,
    guard: ReplayGuard,
    directory: Directory,
    /// Sender id of each member's watch address.
    senders: HashMap<u64, NodeName>,
    plan: Plan,
    /// The heartbeats' one grid: every watcher's beats are due on its ticks.
    grid: Grid,
    schedules: BTreeMap<NodeName, Schedule>,
    watched: BTreeMap<NodeName, Watched>,
    polls: HashMap<u64, PendingPoll>,
    /// This node's own accusations, checked again (see [`Recheck`]).
    rechecks: BTreeMap<NodeName, Recheck>,
    /// Members ahead in line, checked on the daemon's request (see [`AheadCheck`]).
    ahead: BTreeMap<NodeName, AheadCheck>,
    /// Members heard alive on the watch, for the gossip: gossip address and identity bump.
    heard: Vec<(SocketAddr, u64)>,
    /// When each member was last put in `heard`.
    heard_reported: HashMap<SocketAddr, Duration>,
    refutes_left: u32,
    next_refute: Duration,
    /// A refutation is due when the pause ends (asked for during it, or cut short by it).
    refute_after_pause: bool,
    claim_epoch: u64,
    /// The last heartbeat sequence number sent, to any watcher.
    seq: u64,
    paused: Option<Pause>,
    rng: StdRng,
    metrics: WatchMetrics,
    outbox: Vec<Outgoing>,
    /// Claims and refutations to send through the gossip as well, and the rechecks' requests
    /// to the gossip (see [`WatchCore::drain_relays`]).
    relays: Vec<Vec<u8>>,
    events: Vec<Event>,
}

impl WatchCore {
    /// The watch of the node whose watch socket is `local` (its sender id), with its first
    /// `plan` and the gossip's `directory`, at `now`. `seed` seeds the jitter and the nonces.
    /// Fails only when the system gives no randomness for the seal stream.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        knobs: Knobs,
        ring: KeyRing,
        local: SocketAddr,
        plan: Plan,
        directory: Directory,
        metrics: WatchMetrics,
        seed: u64,
        now: Duration,
    ) -> swimlb_proto::Result<WatchCore> {
        let stream = SealStream::new(sender_id(local), plan.me.bump)?;
        let grid = Grid::new(now, &knobs, seed.rotate_left(32));
        let mut core = WatchCore {
            knobs,
            ring,
            stream,
            wire: crate::gossip::WireRule::default(),
            guard: ReplayGuard::default(),
            directory: Directory::default(),
            senders: HashMap::new(),
            plan: plan.clone(),
            grid,
            schedules: BTreeMap::new(),
            watched: BTreeMap::new(),
            polls: HashMap::new(),
            rechecks: BTreeMap::new(),
            ahead: BTreeMap::new(),
            heard: Vec::new(),
            heard_reported: HashMap::new(),
            refutes_left: 0,
            next_refute: Duration::ZERO,
            claim_epoch: 0,
            seq: 0,
            paused: None,
            refute_after_pause: false,
            rng: StdRng::seed_from_u64(seed),
            metrics,
            outbox: Vec::new(),
            relays: Vec::new(),
            events: Vec::new(),
        };
        core.set_directory(directory);
        core.set_plan(now, plan);
        Ok(core)
    }

    /// The watch's metrics.
    pub fn metrics(&self) -> &WatchMetrics {
        &self.metrics
    }

    /// The current plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Whether a pause holds the heartbeats and the polls' answers.
    pub fn paused(&self) -> bool {
        self.paused.is_some()
    }

    /// The members this node sends heartbeats to now.
    pub fn watchers(&self) -> impl Iterator<Item = &NodeName> {
        self.schedules.keys()
    }

    /// The owners this node watches now.
    pub fn watched(&self) -> impl Iterator<Item = &NodeName> {
        self.watched.keys()
    }

    /// Takes the datagrams queued for sending, in order.
    pub fn drain_outgoing(&mut self) -> std::vec::Drain<'_, Outgoing> {
        self.outbox.drain(..)
    }

    /// Seals and opens through `rule` from now on: the gossip's ([`WatchLink::wire_rule`]), so
    /// both sockets of a node follow one view of the mesh's envelope version.
    ///
    /// [`WatchLink::wire_rule`]: crate::gossip::WatchLink::wire_rule
    pub fn set_wire_rule(&mut self, rule: crate::gossip::WireRule) {
        self.wire = rule;
    }

    /// Takes the payloads queued for the gossip since the last call: every claim and refutation
    /// goes through the gossip to every member as well as on the watch port, so that the watch
    /// port dropped one way keeps neither from its member. The receiving watch reads them with
    /// [`WatchCore::handle_relayed`]. A relay request among them is for the gossip itself: the
    /// recheck of a member this node accuses, which the gossip carries out with its own pings
    /// ([`crate::gossip::Core::relay_watch`]).
    pub fn drain_relays(&mut self) -> std::vec::Drain<'_, Vec<u8>> {
        self.relays.drain(..)
    }

    /// Takes the members heard alive on the watch since the last call (gossip address and
    /// identity bump; each at most once per [`HEARD_REPORT_EVERY`]): a fresh heartbeat of the
    /// identity the directory holds is evidence for the gossip that the member lives, whatever
    /// its own probes of that member say.
    pub fn drain_heard(&mut self) -> std::vec::Drain<'_, (SocketAddr, u64)> {
        self.heard.drain(..)
    }

    /// Takes the events for the daemon, in order.
    pub fn drain_events(&mut self) -> std::vec::Drain<'_, Event> {
        self.events.drain(..)
    }

    /// When [`WatchCore::tick`] should be called next: the next heartbeat, round of a second
    /// check, silence verdict, refutation or recheck of an accusation.
    pub fn next_deadline(&self) -> Option<Duration> {
        let beats = self.schedules.values().map(Schedule::next_at);
        let watched = self.watched.values().filter_map(|w| {
            let deadline = w.detector.deadline()?;
            // Silence is said just past the deadline, not at it.
            Some(
                check_round_at(deadline, w.detector.promised(), w.checks_sent)
                    .unwrap_or(deadline + Duration::from_nanos(1)),
            )
        });
        let refute = (self.refutes_left > 0).then_some(self.next_refute);
        let rechecks = self.rechecks.values().map(|r| r.next);
        let ahead = self.ahead.values().map(|c| c.next_at(self.knobs.interval));
        beats
            .chain(watched)
            .chain(refute)
            .chain(rechecks)
            .chain(ahead)
            .min()
    }

    /// The gossip's members changed: senders are looked up in `directory` from now on, and an
    /// owner gone from it is no longer watched (it is the gossip's business now).
    pub fn set_directory(&mut self, directory: Directory) {
        self.senders = directory
            .values()
            .filter_map(|id| Some((sender_id(watch_addr(id.addr)?), id.node.to_string())))
            .collect();
        self.watched.retain(|node, _| directory.contains_key(node));
        self.ahead.retain(|node, _| directory.contains_key(node));
        self.heard_reported
            .retain(|addr, _| directory.values().any(|id| id.addr == *addr));
        self.directory = directory;
        self.update_sizes();
    }

    /// Carries out the daemon's `command` at `now`.
    pub fn command(&mut self, now: Duration, command: Command) {
        match command {
            Command::Plan(plan) => self.set_plan(now, plan),
            Command::KeyRing(ring) => self.ring = *ring,
            Command::Claim { ip, accused } => {
                self.claim(ip, &accused, true);
                self.rechecks.insert(
                    accused.node.to_string(),
                    Recheck {
                        incarnation: accused.bump,
                        next: now + POLL_WAIT,
                    },
                );
            }
            // Nothing is sent during a pause of its own (an armed refutation would be a timer
            // due for ever): it goes out when the pause ends.
            Command::Refute if self.paused.is_some() => self.refute_after_pause = true,
            Command::Refute => {
                self.arm_refute(now);
                self.tick_refute(now);
            }
            Command::Remind { ip, owner } => self.claim(ip, &owner, false),
            // A pause forgets the checks (its own standing is unknown until it hears the
            // cluster again).
            Command::Check { .. } if self.paused.is_some() => {}
            Command::Check { member } => {
                self.ahead
                    .entry(member.node.to_string())
                    .or_insert(AheadCheck {
                        incarnation: member.bump,
                        started: now,
                        rounds_sent: 0,
                    });
                self.tick_ahead(now);
            }
            Command::Move { ip, from, to } => {
                self.claim_epoch += 1;
                let message = WatchMessage::Move {
                    ip,
                    epoch: self.claim_epoch,
                    from: node_ref(&from),
                    to: node_ref(&to),
                };
                let me = self.plan.me.node.as_str();
                let other = if from.node.as_str() == me { &to } else { &from };
                if let Some(addr) = watch_addr(other.addr) {
                    self.send(addr, &message);
                }
                self.relay(&message);
            }
        }
        self.update_sizes();
    }

    /// Claims `ip` from `accused`: to every member, on the watch port and through the gossip
    /// (`everyone`), or on the watch port to `accused` alone (a reminder).
    fn claim(&mut self, ip: IpAddr, accused: &NodeIdentity, everyone: bool) {
        self.claim_epoch += 1;
        let me = self.plan.me.clone();
        let message = WatchMessage::Claim {
            ip,
            epoch: self.claim_epoch,
            claimant: node_ref(&me),
            accused: node_ref(accused),
        };
        if everyone {
            self.send_to_all(&message);
            self.relay(&message);
        } else if let Some(addr) = watch_addr(accused.addr) {
            self.send(addr, &message);
        }
    }

    fn set_plan(&mut self, now: Duration, plan: Plan) {
        self.paused = match self.paused {
            Some(Pause::Held) if plan.held => Some(Pause::Releasing),
            Some(Pause::Releasing) if !plan.held => None,
            other => other,
        };
        if self.paused.is_none() && std::mem::take(&mut self.refute_after_pause) {
            // Renewed meanwhile: the claims were against the old incarnation, which is gone.
            if plan.me.bump == self.plan.me.bump {
                self.arm_refute(now);
            }
        }
        let sending = self.paused.is_none();
        let dropped: Vec<NodeName> = self
            .schedules
            .keys()
            .filter(|node| sending && !plan.watchers.contains(node))
            .cloned()
            .collect();
        for node in dropped {
            if let Some(to) = self.watch_addr_of(&node) {
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
                    self.schedules
                        .insert(node.clone(), Schedule::on(self.grid, now));
                }
            }
        }
        if plan.me.bump != self.plan.me.bump {
            // A new incarnation: the watchers learn it from the next heartbeat.
            for schedule in self.schedules.values_mut() {
                *schedule = Schedule::on(self.grid, now);
            }
        }
        self.plan = plan;
        self.recheck_accused(now);
        self.report_silent_again(now);
    }

    /// Every member the plan accuses is checked again ([`Recheck`]), not only those this node
    /// claimed from: a member that accused on another's claim elects without the owner and may
    /// answer an IP of its own for it, and when the owner's traffic to it is cut its
    /// refutation never arrives (the model checker: the owner stopped 150 ms while all it
    /// sends the next in line for one IP was dropped; that member answered beside it until the
    /// cut ended, 4.1 s, or the accusation lapsed).
    fn recheck_accused(&mut self, now: Duration) {
        for (node, incarnation) in &self.plan.accused {
            if self
                .rechecks
                .get(node)
                .is_none_or(|r| r.incarnation != *incarnation)
            {
                let recheck = Recheck {
                    incarnation: *incarnation,
                    next: now + POLL_WAIT,
                };
                self.rechecks.insert(node.clone(), recheck);
            }
        }
    }

    /// `node`, accused, was heard alive (a refutation, a poll's answer): a silence found before
    /// is not reported again.
    fn heard_alive(&mut self, node: &str) {
        if let Some(w) = self.watched.get_mut(node) {
            w.silent_at = None;
        }
    }

    /// Reports again every watched owner found silent within [`SILENT_AGAIN_WITHIN`] and not
    /// heard since, in the incarnation the directory holds: with the plan, the daemon's live
    /// set may have changed, and with it who succeeds the owner (not during a pause).
    fn report_silent_again(&mut self, now: Duration) {
        if self.paused.is_some() {
            return;
        }
        for (node, w) in &self.watched {
            let recent = w
                .silent_at
                .is_some_and(|at| now.saturating_sub(at) <= SILENT_AGAIN_WITHIN);
            if !recent || !w.detector.is_silent() {
                continue;
            }
            let Some(owner) = self
                .directory
                .get(node)
                .filter(|id| id.bump == w.detector.incarnation())
            else {
                continue;
            };
            self.events.push(Event::Silent {
                owner: owner.clone(),
                silent_for: now.saturating_sub(w.last_heard),
            });
        }
    }

    /// Notes that the member at gossip address `addr`, identity `bump`, was heard alive.
    fn note_alive(&mut self, now: Duration, addr: SocketAddr, bump: u64) {
        let due = self
            .heard_reported
            .get(&addr)
            .is_none_or(|at| now >= *at + HEARD_REPORT_EVERY);
        if due {
            self.heard_reported.insert(addr, now);
            self.heard.push((addr, bump));
        }
    }

    fn watch_addr_of(&self, node: &str) -> Option<SocketAddr> {
        self.directory.get(node).and_then(|id| watch_addr(id.addr))
    }

    fn send_to_all(&mut self, message: &WatchMessage<'_>) {
        let directory = self.directory.clone();
        for id in directory.values() {
            if let Some(to) = watch_addr(id.addr) {
                self.send(to, message);
            }
        }
    }

    /// Seals `message` for `to` and queues it.
    fn send(&mut self, to: SocketAddr, message: &WatchMessage<'_>) {
        let mut payload = [0u8; heartbeat::MAX_LEN];
        let Ok(len) = message.emit(&mut payload) else {
            return;
        };
        let mut bytes = Vec::new();
        let (ring, stream) = (&self.ring, &mut self.stream);
        if self
            .wire
            .seal(ring, stream, None, to, &payload[..len], &mut bytes)
            .is_err()
        {
            return;
        }
        self.metrics.sent(message.message_type());
        self.outbox.push(Outgoing { to, bytes });
        if let WatchMessage::Poll { nonce, incarnation } = *message {
            self.check_through_gossip(nonce, incarnation);
        }
    }

    /// A recheck's poll of a member this node accuses (nonce `nonce`, `incarnation`) is asked
    /// of the gossip too, as a relay request it carries out with its own pings and inquiries
    /// ([`crate::gossip::Core::relay_watch`]); an answer comes back as the member's refutation
    /// ([`WatchCore::handle_relayed`]). The watch's own paths may all be cut while the gossip's
    /// are not: the model checker found an owner whose datagrams to its accuser were dropped,
    /// and its watch datagrams to the third member too, answered beside its accuser until the
    /// cut ended, while the gossip's probes through that member held it alive.
    fn check_through_gossip(&mut self, nonce: u64, incarnation: u64) {
        let Some(poll) = self.polls.get(&nonce) else {
            return;
        };
        if poll.purpose != (Purpose::Accusation { incarnation }) {
            return;
        }
        let Some(id) = self.directory.get(&poll.target) else {
            return;
        };
        let target = NodeIdentity {
            bump: incarnation,
            ..id.clone()
        };
        let request = WatchMessage::Relay {
            nonce,
            target: node_ref(&target),
        };
        self.relay(&request);
    }

    /// Queues `message` for the gossip ([`WatchCore::drain_relays`]).
    fn relay(&mut self, message: &WatchMessage<'_>) {
        let mut payload = vec![0u8; heartbeat::MAX_LEN];
        if let Ok(len) = message.emit(&mut payload) {
            payload.truncate(len);
            self.relays.push(payload);
        }
    }

    fn update_sizes(&self) {
        self.metrics.sizes(self.schedules.len(), self.watched.len());
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
