//! The drivers around the [`Engine`], shared by every mode: they read inputs, call the engine
//! and carry out its actions. Nothing here decides.
//!
//! - [`Daemon`] holds the engine, the gossip handle, this node's record ([`LocalState`]), the
//!   responders ([`AnsweringLinks`]) and `/status` with the owner gauges ([`StatusBoard`]).
//!   [`Daemon::handle`] feeds one input and performs the actions: link actions go to the
//!   responders, status deltas to the board, new announce facts into the node's record and out
//!   through the gossip, notices to the log.
//! - [`NetWatch`] dumps links and routes in its own task whenever the kernel reports a change,
//!   so a netlink dump never delays a conflict or an announcement tick.
//! - [`JoinHold`] (in `hold`) decides when a starting node may answer: not while the mesh forms (a node
//!   alone elects itself for everything, and two nodes would answer for one IP). The same hold
//!   comes back after a pause: when the gossip reports [`Phase::Paused`] (the process was not
//!   scheduled for longer than the suspicion timeout, see `gossip::driver`), the node answers
//!   nothing until it has heard the cluster again, so it never answers for an IP the cluster
//!   moved while it slept. When that hold ends, the owners of the IPs this node is in line for
//!   are checked on the watch (it forgot them in the pause, and a dead one sends nothing).
//! - The owner watch ([`crate::owner_watch`]): the daemon tells the watch thread its
//!   [`Plan`] (whom to send heartbeats to: the first [`WATCH_DEPTH`] successors of the IPs it
//!   answers for) and acts on its events. A silent owner is *accused*: the engine elects
//!   without it (as if it were down, without touching the gossip: in foca a down member must
//!   rejoin under a new identity), this node announces what it takes over and claims it to
//!   every member, which accuse it too. A second successor acts on its own watch once the first
//!   is accused or down (the watch core reports an owner still silent again when the plan
//!   changes); a first successor that owns nothing sends it no heartbeats, so when the owner
//!   falls silent it checks it on the watch ([`Command::Check`]) and accuses it if it does not
//!   answer. An accusation ends when the gossip declares the member down or it comes back renewed
//!   (`confirmed`), or when the member is heard alive in the accused incarnation (`refuted`: it
//!   refutes every claim against it and re-announces, and it keeps its IPs: the election
//!   without accusations is the rule every node computes the same way). An accusation also ends
//!   after [`ACCUSATION_TTL`](crate::owner_watch::accusations::ACCUSATION_TTL). When an accusation
//!   ends and this node still answers IPs it now hands back to the member, it repeats its claim
//!   to that member alone ([`Command::Remind`]): an owner that never heard the claim (its link
//!   was down) does not know it lost its IPs and would not announce them. Which accusations
//!   stand is [`Accusations`]' decision; the daemon feeds it and carries out its answers.
//! - [`FailoverMetrics`] is the failover latency histogram: for every
//!   [`Notice::TookOver`], from the last datagram heard from the previous owner to the moment
//!   this node handed its first announcement of the IP to the responder.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

use crate::gossip::{GossipHandle, Phase};
use crate::model::engine::{Action, Engine, Input, Notice};
use crate::model::links::{Link, Route};
use crate::model::local::LocalState;
use crate::model::membership::{AnnounceFacts, LiveChange, LiveSet, NodeName};
use crate::model::watch_knobs::Knobs;
use crate::net::answering::AnsweringLinks;
use crate::owner_watch::accusations::{
    Accusations, Change, Claimed, Ended, Ending, MemberChange, Silent,
};
use crate::owner_watch::service::{MAX_WATCHERS, watch_addr};
use crate::owner_watch::{Command, Event, Plan, WatchEvents, WatchHandle, WatchMetrics};
use crate::run::hold::JoinHold;
pub use crate::run::net_watch::NetWatch;
use crate::run::successors::Successors;
pub use crate::run::takeovers::FailoverMetrics;
pub(crate) use crate::run::takeovers::observe_takeovers;
use crate::serve::status::StatusBoard;
use swimlb_proto::KeyRing;

/// The engine and the drivers of one speaker.
#[derive(Debug)]
pub struct Daemon {
    /// The decision core.
    pub engine: Engine,
    /// This node's gossiped record.
    pub local: LocalState,
    /// `/status` and the owner gauges.
    pub board: StatusBoard,
    answering: AnsweringLinks,
    gossip: GossipHandle,
    failovers: FailoverMetrics,
    live: watch::Receiver<LiveSet>,
    drained: bool,
    watch: Option<WatchHandle>,
    /// Members the owner watch found silent, here or by a claim.
    accusations: Accusations,
    /// The origin of the accusations' clock.
    origin: Instant,
    plan: Option<Plan>,
    /// The successors of what this node answers for, kept per IP for the plan.
    successors: Successors,
    /// Members ahead of this node in line for a silent owner's IPs, checked on the watch
    /// ([`Command::Check`]), with when they were asked for.
    ahead_checks: HashMap<NodeName, Instant>,
    /// When this node may answer (start-up, and after a pause).
    hold: JoinHold,
    /// The IPs the last actions took over, with their previous owner.
    took_over: Vec<(IpAddr, NodeName)>,
}

/// Starts the owner watch beside `gossip` when `knobs` switch it on: its socket on the gossip
/// port + 1, its own copy of the key ring (`ring`: [`KeyRing::duplicate`] of the gossip's). A watch that cannot start is logged and left off:
/// the gossip alone detects then.
pub fn start_watch(
    knobs: Knobs,
    gossip: &GossipHandle,
    ring: swimlb_proto::Result<KeyRing>,
    metrics: WatchMetrics,
) -> (Option<WatchHandle>, WatchEvents) {
    if !knobs.enabled {
        tracing::info!("owner watch off: the gossip alone detects a dead owner");
        return (None, WatchEvents::none());
    }
    let Some(bind) = watch_addr(gossip.local_addr()) else {
        tracing::error!(gossip = %gossip.local_addr(), "owner watch off: no port above the gossip port");
        return (None, WatchEvents::none());
    };
    let ring = match ring {
        Ok(ring) => ring,
        Err(e) => {
            tracing::error!(error = %e, "owner watch off: its key ring");
            return (None, WatchEvents::none());
        }
    };
    let plan = Plan {
        me: gossip.identity(),
        watchers: Vec::new(),
        held: true,
        accused: BTreeMap::new(),
    };
    let link = gossip.watch_link();
    match WatchHandle::start(knobs, bind, ring, gossip.directory(), link, plan, metrics) {
        Ok((handle, events)) => {
            tracing::info!(
                listen = %handle.local_addr(),
                interval_ms = knobs.interval.as_secs_f64() * 1000.0,
                misses = knobs.misses,
                "owner watch on"
            );
            (Some(handle), events)
        }
        Err(e) => {
            tracing::error!(%bind, error = %e, "owner watch off: cannot listen");
            (None, WatchEvents::none())
        }
    }
}

impl Daemon {
    /// Wires the parts; `initial` are the engine's first actions, performed at once.
    pub async fn new(
        engine: Engine,
        initial: Vec<Action>,
        local: LocalState,
        board: StatusBoard,
        answering: AnsweringLinks,
        gossip: GossipHandle,
        failovers: FailoverMetrics,
    ) -> Daemon {
        let live = gossip.live();
        board.members(live.borrow().iter());
        let mut answering = answering;
        open_placed(&mut answering, &engine);
        let mut daemon = Daemon {
            engine,
            local,
            board,
            answering,
            gossip,
            failovers,
            live,
            drained: false,
            watch: None,
            accusations: Accusations::default(),
            origin: Instant::now(),
            plan: None,
            successors: Successors::default(),
            ahead_checks: HashMap::new(),
            hold: JoinHold::new(Instant::now(), false),
            took_over: Vec::new(),
        };
        daemon.perform(initial).await;
        daemon
    }

    /// Hands the daemon the owner watch (see [`start_watch`]; `None`: off), and tells it the
    /// first plan.
    pub fn with_watch(mut self, watch: Option<WatchHandle>) -> Daemon {
        self.watch = watch;
        self.successors.invalidate_all();
        self.refresh_plan();
        self
    }

    /// Feeds `input` at the current time and performs the actions. A tick also ends the
    /// accusations made on claims that have lapsed ([`ACCUSATION_TTL`](crate::owner_watch::accusations::ACCUSATION_TTL)).
    pub async fn handle(&mut self, input: Input) {
        if input == Input::Tick {
            let now = self.clock(Instant::now());
            let held = self.holds();
            for ended in self.accusations.lapse(now, held) {
                // Alive all along (lapsed), or renewed (confirmed): elect with its record.
                let node = self.ended(ended);
                self.reinstate(&node).await;
            }
        }
        self.successors.input(&input);
        if matches!(input, Input::Member { .. } | Input::Live(_)) {
            // Who succeeds an owner the watch found silent may have changed (an accusation, a
            // member down): the plan goes again, and with it the watch reports such owners again.
            self.plan = None;
        }
        let actions = self.engine.handle(Instant::now(), input);
        self.perform(actions).await;
    }

    /// Replaces the start-up hold (the default holds: a node with peers to join).
    pub fn with_hold(mut self, hold: JoinHold) -> Daemon {
        self.hold = hold;
        self
    }

    /// How many members the start-up hold waits for (see [`JoinHold::expect`]).
    pub fn expect_members(&mut self, members: usize) {
        self.hold.expect(members);
    }

    /// Whether the start-up (or pause) hold is on.
    pub fn holding(&self) -> bool {
        self.hold.holding()
    }

    /// When the hold wants to be looked at again.
    pub fn hold_deadline(&self) -> Option<Instant> {
        self.hold.next_deadline()
    }

    /// Puts the hold back on after a pause (the gossip's, or one the owner watch saw), and ends
    /// it when the mesh has formed (or the grace passed).
    pub async fn check_hold(&mut self) {
        let now = Instant::now();
        let phase = *self.gossip.phase().borrow();
        if self.hold.rearm(now, phase) {
            self.handle(Input::Hold(true)).await;
        }
        if self.hold.release(now, phase, self.engine.live()) {
            let members = self.engine.live().len();
            tracing::info!(members, "mesh formed: answering what this node owns");
            self.handle(Input::Hold(false)).await;
            if self.hold.after_pause() {
                self.check_owners_after_pause();
            }
        }
    }

    /// The preemption delay ran out: the record says `settled` from now on.
    pub async fn settle(&mut self) {
        if self.local.tick(Instant::now()) {
            tracing::info!("settled: may now take over from lower-priority owners");
            self.publish_meta().await;
        }
    }

    /// SIGTERM: marks this node draining in its record (peers elect successors at once) and
    /// starts the hand-over; [`Daemon::drained`] tells when it is over.
    pub async fn drain(&mut self) {
        if self.local.drain() {
            self.publish_meta().await;
        }
        self.board.update(|s| s.draining = true);
        self.handle(Input::Drain).await;
    }

    /// Replaces the key ring of the gossip and of the owner watch.
    pub async fn set_key_ring(&mut self, ring: KeyRing) -> Result<(), crate::gossip::GossipError> {
        if let Some(watch) = &self.watch {
            match ring.duplicate() {
                Ok(copy) => watch.send(Command::KeyRing(Box::new(copy))),
                Err(e) => tracing::error!(error = %e, "owner watch keys not replaced"),
            }
        }
        self.gossip.set_key_ring(ring).await
    }

    /// Acts on what the owner watch reports (see the module docs).
    pub async fn watch_event(&mut self, event: Event) {
        let now = self.clock(Instant::now());
        match event {
            Event::Silent { owner, silent_for } => {
                let node = owner.node.to_string();
                let alive = !self.engine.draining() && self.live.borrow().contains(&node);
                let asked = self
                    .ahead_checks
                    .remove(&node)
                    .is_some_and(|at| at.elapsed() <= AHEAD_CHECK_FOR);
                let succeeds = alive && self.succeeds(&node);
                let eligible = alive && (asked || succeeds);
                let held = self.holds();
                let verdict = self
                    .accusations
                    .silent(now, &owner, silent_for, eligible, held);
                if alive && matches!(verdict, Silent::TakeOver | Silent::NotEligible) {
                    // Before the accusation moves the owner's IPs: where this node is not next
                    // in line, those before it may have failed with the owner.
                    self.check_ahead(&node);
                }
                if verdict != Silent::TakeOver {
                    return;
                }
                if succeeds {
                    tracing::warn!(
                        member = %node,
                        silent_ms = silent_for.as_secs_f64() * 1000.0,
                        "owner silent on the watch and in the second check: taking over"
                    );
                } else {
                    tracing::warn!(
                        member = %node,
                        "silent in a check this node asked for: electing without it"
                    );
                }
                self.elect_without(&node).await;
                let ip = self
                    .took_over
                    .iter()
                    .find(|(_, from)| *from == node)
                    .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |(ip, _)| *ip);
                if let Some(watch) = &self.watch {
                    watch.send(Command::Claim { ip, accused: owner });
                }
            }
            Event::Claimed {
                claimant,
                accused,
                incarnation,
                ip,
            } => self.claimed(now, claimant, accused, incarnation, ip).await,
            Event::Moved {
                sender,
                ip,
                from,
                to,
            } => {
                tracing::info!(%ip, %from, %to, %sender, "told of a move by the API");
                self.handle(Input::Moved { ip, from, to }).await;
            }
            Event::Alive { node, incarnation } => {
                if let Some(ended) = self.accusations.alive(now, &node, incarnation) {
                    let node = self.ended(ended);
                    self.reinstate(&node).await;
                }
            }
            Event::Paused { late } => {
                tracing::warn!(
                    late_ms = late.as_secs_f64() * 1000.0,
                    "paused longer than a watcher waits: holding answers"
                );
                if self.hold.rearm_now(Instant::now()) {
                    self.handle(Input::Hold(true)).await;
                }
                // The watch's pause ends with a plan that holds, then one that does not: send
                // it again even when the hold was on already (the plan did not change).
                self.plan = None;
                self.refresh_plan();
            }
        }
    }

    /// Another member's claim that `accused` is silent: refuted when it is this node, applied
    /// or not as the accusations decide.
    async fn claimed(
        &mut self,
        now: Duration,
        claimant: NodeName,
        accused: NodeName,
        incarnation: u64,
        ip: IpAddr,
    ) {
        let me = self.gossip.identity();
        let held = self.holds();
        match self
            .accusations
            .claimed(now, &me, &accused, incarnation, held)
        {
            Claimed::Refute => self.refute(claimant, ip).await,
            Claimed::Accuse => {
                tracing::info!(member = %accused, %claimant, %ip, "a member claims another silent: electing without it");
                self.elect_without(&accused).await;
            }
            verdict @ (Claimed::OldSelf
            | Claimed::AlreadyAccused
            | Claimed::RefutedRecently
            | Claimed::NotCurrent) => {
                tracing::debug!(member = %accused, %claimant, verdict = verdict.as_str(), "claim not applied");
            }
        }
    }

    /// A member claims this node is silent while it runs in the claimed incarnation: every
    /// member must elect with it again (the watch sends nothing after a pause of its own).
    async fn refute(&mut self, claimant: NodeName, ip: IpAddr) {
        tracing::warn!(%claimant, %ip, "a member claims this node is silent: refuting");
        if let Some(watch) = &self.watch {
            watch.send(Command::Refute);
        }
        if !self.engine.answering().is_empty() {
            // The keeper announces last: once more, now that the claimant has.
            let record = self.live.borrow().get(&claimant).cloned();
            self.handle(Input::Member {
                node: claimant,
                record,
                joined: true,
            })
            .await;
        }
    }

    /// The accusations' clock at `at`.
    fn clock(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.origin)
    }

    /// Whether the gossip holds a member alive in an incarnation (its identity's bump), as the
    /// directory stands now.
    fn holds(&self) -> impl Fn(&str, u64) -> bool + use<> {
        let directory = self.gossip.directory().borrow().clone();
        move |node, incarnation| directory.get(node).is_some_and(|id| id.bump == incarnation)
    }

    /// Whether this node would own one of `owner`'s IPs if `owner` were gone: only then does it
    /// act on its own watch (the others wait for its claim, or for the gossip).
    fn succeeds(&self, owner: &str) -> bool {
        let election = self.engine.election();
        let live = self.engine.live();
        let me = election.local();
        election
            .outcomes()
            .iter()
            .filter(|(_, outcome)| outcome.owner() == Some(owner))
            .any(|(ip, _)| election.successor(ip, live).as_deref() == Some(me))
    }

    /// `owner` was found silent: for its IPs this node is not next in line for, the members
    /// before it may have failed with the owner, and those that own nothing send it no
    /// heartbeats. Each is checked on the watch; one that does not answer is accused in turn,
    /// and this node then succeeds the owner there (at once if the owner is accused, else when
    /// the owner's silence is reported again with the plan that follows).
    fn check_ahead(&mut self, owner: &str) {
        let election = self.engine.election();
        let live = self.engine.live();
        let me = election.local();
        let mut ahead = BTreeSet::new();
        let owned = election.outcomes().iter();
        for (ip, _) in owned.filter(|(_, outcome)| outcome.owner() == Some(owner)) {
            let line = election.successors(ip, live, WATCH_DEPTH);
            if let Some(at) = line.iter().position(|node| node.as_str() == me) {
                ahead.extend(line[..at].iter().cloned());
            }
        }
        for member in ahead {
            if self.ask_check(&member) {
                tracing::info!(
                    %owner,
                    %member,
                    "owner silent and this node not next in line: checking the member ahead"
                );
            }
        }
    }

    /// After a pause: the watch forgot the owners it watched (a detector arms again on the next
    /// heartbeat), and an owner that failed during the pause sends none, so nothing would find
    /// it silent but the gossip, which waits out its suspicions (up to the longest while this
    /// node hears nobody). Each owner of an IP this node is in line for is checked on the watch
    /// instead; one that does not answer is reported silent, and acted on, as if its heartbeats
    /// had stopped.
    fn check_owners_after_pause(&mut self) {
        let election = self.engine.election();
        let live = self.engine.live();
        let me = election.local();
        let mut owners = BTreeSet::new();
        for (ip, outcome) in election.outcomes().iter() {
            let Some(owner) = outcome.owner().filter(|owner| *owner != me) else {
                continue;
            };
            let line = election.successors(ip, live, WATCH_DEPTH);
            if line.iter().any(|node| node.as_str() == me) {
                owners.insert(owner.to_string());
            }
        }
        for owner in owners {
            if self.ask_check(&owner) {
                tracing::info!(%owner, "back from a pause: checking an owner this node is in line for");
            }
        }
    }

    /// Asks the watch to check `member` unless it did within [`AHEAD_CHECK_FOR`]; the silence
    /// it reports is then this node's to act on. False when not asked.
    fn ask_check(&mut self, member: &str) -> bool {
        let Some(watch) = &self.watch else {
            return false;
        };
        self.ahead_checks
            .retain(|_, at| at.elapsed() <= AHEAD_CHECK_FOR);
        if self.ahead_checks.contains_key(member) {
            return false;
        }
        let Some(id) = self.gossip.directory().borrow().get(member).cloned() else {
            return false;
        };
        self.ahead_checks.insert(member.to_string(), Instant::now());
        watch.send(Command::Check { member: id });
        true
    }

    /// The engine elects without `node`, now accused.
    async fn elect_without(&mut self, node: &str) {
        self.successors.invalidate_all();
        self.handle(Input::Member {
            node: node.to_string(),
            record: None,
            joined: false,
        })
        .await;
    }

    /// Logs and counts an accusation that ended; returns the member.
    fn ended(&mut self, ended: Ended) -> NodeName {
        self.successors.invalidate_all();
        let own = ended.accusation.own;
        match ended.how {
            Ending::Refuted | Ending::Lapsed => {
                tracing::warn!(member = %ended.node, result = ended.how.as_str(), own, "accusation ended: the member is alive");
            }
            Ending::Confirmed => {
                tracing::info!(member = %ended.node, own, "accusation confirmed by the gossip");
            }
        }
        if let (Some(result), Some(watch)) = (ended.takeover(), &self.watch) {
            watch.metrics().takeover(result);
        }
        ended.node
    }

    /// The engine elects with `node` again, from its current record (none: it is gone).
    async fn reinstate(&mut self, node: &str) {
        let record = self.live.borrow().get(node).cloned();
        let actions = self.engine.handle(
            Instant::now(),
            Input::Member {
                node: node.to_string(),
                record,
                joined: true,
            },
        );
        self.perform(actions).await;
        self.remind(node);
    }

    /// After `node` is elected again: if this node still answers IPs it now hands back to it,
    /// tell it ([`Command::Remind`]). The takeover's claim may never have reached it (its link
    /// was down), and an owner that does not know it lost its IPs does not announce them: both
    /// would answer until the hand-over deadline.
    fn remind(&self, node: &str) {
        let Some(watch) = &self.watch else {
            return;
        };
        let Some(owner) = self.gossip.directory().borrow().get(node).cloned() else {
            return;
        };
        let election = self.engine.election();
        let handed = self
            .engine
            .answering()
            .keys()
            .find(|ip| self.engine.handing_over(ip) && election.owner(ip) == Some(node));
        if let Some(ip) = handed {
            tracing::info!(member = %node, %ip, "handing IPs back to a member alive after all: telling it to announce them");
            watch.send(Command::Remind { ip: *ip, owner });
        }
    }

    /// Tells the watch thread the plan, when it changed: the first [`WATCH_DEPTH`] successors of
    /// the IPs this node answers for (the most often first successor first, at most
    /// [`MAX_WATCHERS`]).
    fn refresh_plan(&mut self) {
        let Some(watch) = &self.watch else {
            return;
        };
        let me = self.gossip.identity();
        let held = self.hold.holding();
        let same = |p: &Plan| p.me == me && p.held == held;
        if self.successors.is_clean() && self.plan.as_ref().is_some_and(same) {
            return;
        }
        self.successors.refresh(&self.engine);
        let plan = Plan {
            me,
            watchers: self.successors.ranked(MAX_WATCHERS),
            held,
            accused: self.accusations.incarnations(),
        };
        if self.plan.as_ref() != Some(&plan) {
            watch.send(Command::Plan(plan.clone()));
            self.plan = Some(plan);
        }
    }

    /// A change from the gossip's stream (`Err`: some were missed: resynchronise). Returns
    /// false when the gossip has stopped.
    pub async fn membership(
        &mut self,
        change: Result<LiveChange, broadcast::error::RecvError>,
    ) -> bool {
        let input = match change {
            Ok(change) => {
                let (node, joined) = match change {
                    LiveChange::Up(node) => {
                        tracing::info!(member = %node, "member up");
                        (node, true)
                    }
                    LiveChange::Down(node) => {
                        tracing::info!(member = %node, "member down");
                        (node, false)
                    }
                    LiveChange::Meta(node) => (node, false),
                };
                let record = self.live.borrow().get(&node).cloned();
                if let Some(meta) = &record {
                    // What the election reads of the member, to explain a view that differs.
                    tracing::debug!(
                        member = %node,
                        version = meta.version,
                        settled = meta.settled,
                        draining = meta.draining,
                        links = ?meta.announce.links,
                        unplaced = ?meta.announce.unplaced,
                        "member record"
                    );
                }
                self.board.member(&node, record.as_ref());
                self.successors.invalidate_all();
                let held = self.holds();
                match self.accusations.member_changed(
                    &node,
                    change_kind(joined, record.is_some()),
                    held,
                ) {
                    MemberChange::NotAccused => {}
                    MemberChange::Confirmed(ended) => {
                        self.ended(ended);
                    }
                    // The engine keeps electing without it.
                    MemberChange::StillAccused => return true,
                }
                Input::Member {
                    node,
                    record,
                    joined,
                }
            }
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::warn!(missed, "gossip changes lagged: full re-election");
                let mut live = self.live.borrow().clone();
                self.board.members(live.iter());
                for node in self.accusations.nodes() {
                    live.remove(node);
                }
                self.successors.invalidate_all();
                Input::Live(live)
            }
            Err(broadcast::error::RecvError::Closed) => return false,
        };
        self.handle(input).await;
        true
    }

    /// This node is back in the cluster under a renewed gossip identity (it was declared down,
    /// by a cut or a pause). The gossip core has cleared `settled` in the node's record, so it
    /// ranks behind every settled member; the preemption delay starts again and the record is
    /// gossiped anew, with `settled` set back at once when there is no delay. Both sources call
    /// this, so a returning node takes back what the election gives it in either mode.
    pub async fn rejoined(&mut self, bump: u64) {
        tracing::info!(
            bump,
            "back in the cluster under a renewed identity: preempt delay starts again"
        );
        self.local.rejoined(Instant::now());
        self.publish_meta().await;
    }

    /// Gossips this node's record after a change to it.
    pub async fn publish_meta(&mut self) {
        if let Err(e) = self.gossip.set_meta(self.local.meta().clone()).await {
            tracing::error!(error = %e, "this node's record could not be gossiped");
        }
    }

    /// When the engine wants the next tick, or an accusation lapses.
    pub fn next_deadline(&self) -> Option<Instant> {
        let lapse = self.accusations.next_lapse().map(|at| self.origin + at);
        match (self.engine.next_deadline(), lapse) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether the drain is over.
    pub fn drained(&self) -> bool {
        self.drained
    }

    /// The gossip's phase, watched.
    pub fn phase(&self) -> watch::Receiver<Phase> {
        self.gossip.phase()
    }

    /// The gossip handle.
    pub fn gossip(&self) -> &GossipHandle {
        &self.gossip
    }

    /// New links and routes: the responders on dead links stop, the engine places again.
    /// Returns whether a link this node answers on has its carrier back.
    pub async fn net(&mut self, links: Vec<Link>, routes: Vec<Route>) -> bool {
        let changes = self.answering.set_links(links.clone());
        for name in changes.closed {
            tracing::warn!(interface = %name, "interface gone or down: no longer answering on it");
        }
        let carrier_back = !changes.carrier_back.is_empty();
        if carrier_back {
            self.solicit_peers(&changes.carrier_back, &routes).await;
        }
        self.handle(Input::Net { links, routes }).await;
        open_placed(&mut self.answering, &self.engine);
        carrier_back
    }

    /// A link this node answers on has its carrier back (a cable, a switch port): asks at once
    /// for the MACs of the peers on it. While the carrier was gone the kernel's neighbour
    /// entries for them failed, and it would send the next ARP request or solicitation only on
    /// its retransmit timer (1 s by default), holding the gossip datagrams queued until then:
    /// a node cut off that long has taken the VIPs alone, and would answer for them beside
    /// their owners for that second. The answers fill the kernel's entries and the queued
    /// datagrams leave at once.
    async fn solicit_peers(&mut self, links: &[(String, u32)], routes: &[Route]) {
        let peers = self.gossip.peer_addresses().await;
        let own = [self.gossip.local_addr().ip()];
        for (name, index) in links {
            let targets = crate::model::links::on_link(&peers, routes, *index);
            // Asked from the gossip's address when it is on that link (the peers learn it
            // too), else as an ARP probe (from 0.0.0.0; no IPv6 solicitation then).
            let sources = crate::model::links::on_link(&own, routes, *index);
            tracing::info!(interface = %name, peers = targets.len(), "carrier back: asking for the peers' MACs");
            if !targets.is_empty() {
                self.answering.solicit(name, sources, targets);
            }
        }
    }

    /// Carries out `actions`, in order.
    pub async fn perform(&mut self, actions: Vec<Action>) {
        self.answering.perform(&actions);
        // The announcements are with the responders: the failovers among them end now.
        let gossip = &self.gossip;
        let (accusations, origin) = (&self.accusations, self.origin);
        self.took_over.clear();
        for (ip, from, took) in observe_takeovers(
            &actions,
            Instant::now(),
            |node| match accusations.get(node) {
                Some(a) => a.last_heard.map(|at| origin + at),
                None => gossip.last_heard_before_down(node),
            },
            &self.failovers,
        ) {
            self.took_over.push((ip, from.clone()));
            tracing::info!(
                %ip,
                previous_owner = %from,
                failover_ms = took.map(|t| t.as_secs_f64() * 1000.0),
                "took over from a member that went down or left"
            );
        }
        let mut facts_changed = false;
        self.successors.actions(&actions);
        for action in actions {
            match action {
                Action::Silence { .. } | Action::Answer { .. } | Action::Announce { .. } => {}
                Action::Facts(facts) => {
                    tracing::info!(links = ?facts.links, unplaced = facts.unplaced.len(), "can announce on");
                    if regained(&self.local.meta().announce, &facts)
                        && self.local.restart_preempt_delay(Instant::now())
                    {
                        tracing::info!("a link can announce again: preempt delay starts again");
                    }
                    facts_changed |= self.local.set_announce(facts);
                }
                Action::Status { ip, view } => {
                    match &view {
                        Some(v) => tracing::debug!(
                            %ip,
                            owner = v.owner.as_deref().unwrap_or("-"),
                            verdict = v.verdict.as_str(),
                            answering = v.links.is_some(),
                            "address view"
                        ),
                        None => tracing::debug!(%ip, "address no longer served"),
                    }
                    self.board.address(ip, view.as_ref());
                }
                Action::Notice(notice) => log(&notice),
                Action::Drained => self.drained = true,
                Action::Moved { ip, from, to } => self.tell_move(ip, &from, &to),
            }
        }
        if facts_changed {
            self.publish_meta().await;
        }
        self.refresh_plan();
    }

    /// Tells the other one of `from` and `to` that the API moved `ip` (see the engine's docs),
    /// through the owner watch; without a watch the other one follows its own view alone.
    fn tell_move(&self, ip: IpAddr, from: &str, to: &str) {
        let Some(watch) = &self.watch else {
            return;
        };
        let directory = self.gossip.directory().borrow().clone();
        let me = self.gossip.identity();
        let identity = |node: &str| match me.node.as_str() == node {
            true => Some(me.clone()),
            false => directory.get(node).cloned(),
        };
        if let (Some(from), Some(to)) = (identity(from), identity(to)) {
            tracing::debug!(%ip, from = %from.node, to = %to.node, "telling a move by the API");
            watch.send(Command::Move { ip, from, to });
        }
    }

    /// Leaves the mesh and stops the responders.
    pub async fn stop(self) {
        if let Err(e) = self.gossip.leave().await {
            tracing::warn!(error = %e, "leaving the mesh");
        }
        self.answering.stop();
    }
}

/// How far down the line of each answered IP the owner watch sends heartbeats: the first
/// successor takes over when this node goes silent; the second when the first is gone as well
/// (accused on its own watch, or down). Without the second, a node killed while its first
/// successor's link was down stayed dark for the gossip's longest suspicion, though the next
/// member in line had already taken the first successor's IPs over on the watch.
pub const WATCH_DEPTH: usize = 2;

/// How long a member ahead in line, checked on the watch, may still be accused on that check's
/// word (the verdict comes within about a poll's wait).
const AHEAD_CHECK_FOR: Duration = Duration::from_secs(1);

/// What a gossip change is, for the accusations.
fn change_kind(joined: bool, alive: bool) -> Change {
    match (joined, alive) {
        (true, _) => Change::Up,
        (false, false) => Change::Down,
        (false, true) => Change::Meta,
    }
}

/// Opens a responder on every link some IP is placed on, before any of them is needed: a new
/// owner then answers at once instead of opening its packet socket first (tens of
/// milliseconds), and conflicts on those links are seen all along.
fn open_placed(answering: &mut AnsweringLinks, engine: &Engine) {
    for link in engine.placed_links() {
        if let Err(e) = answering.open(&link) {
            tracing::warn!(error = %e, "cannot answer on a placed link yet");
        }
    }
}

/// Whether `next` can announce something `before` could not: a link back, or an IP placed
/// again.
fn regained(before: &AnnounceFacts, next: &AnnounceFacts) -> bool {
    !next.links.is_subset(&before.links) || !before.unplaced.is_subset(&next.unplaced)
}

fn log(notice: &Notice) {
    match notice {
        Notice::Conflict { ip, mac } => {
            tracing::warn!(%ip, other = %mac, "another MAC claims an address we own: re-announcing")
        }
        Notice::SuccessorAnnounced { ip, mac } => {
            tracing::info!(%ip, successor = %mac, "successor announced")
        }
        Notice::HandedOver { ip, mac } => {
            tracing::info!(%ip, successor = %mac, "moved to another member, which announced it: no longer answering")
        }
        Notice::HandoverDeadline { ip } => {
            tracing::warn!(%ip, "moved to another member, which did not announce it in time: no longer answering")
        }
        Notice::DrainDeadline { left } => {
            tracing::warn!(
                left,
                "drain deadline passed before every successor announced"
            )
        }
        Notice::Unplaced { ip, reason } => {
            tracing::warn!(%ip, reason = reason.as_str(), "owner, but no interface to announce on")
        }
        // Logged with its duration where it is timed (`Daemon::perform`).
        Notice::TookOver { .. } => {}
    }
}

/// Sleeps until `at`, or forever.
pub async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_back_or_an_ip_placed_again_is_a_regain() {
        let ip: std::net::IpAddr = "192.0.2.1".parse().unwrap();
        let none = AnnounceFacts::default();
        let eth1 = AnnounceFacts {
            links: ["eth1".to_string()].into(),
            ..AnnounceFacts::default()
        };
        let unplaced = AnnounceFacts {
            unplaced: [ip].into(),
            ..AnnounceFacts::default()
        };
        assert!(regained(&none, &eth1));
        assert!(!regained(&eth1, &none), "a loss is not a regain");
        assert!(regained(&unplaced, &none));
        assert!(!regained(&none, &unplaced));
        assert!(!regained(&eth1, &eth1));
    }
}
