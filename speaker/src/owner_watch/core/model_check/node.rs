//! One member of the checked world: the daemon's real cores (the gossip [`Core`] lives in the
//! world's [`SimNet`]; here the [`WatchCore`], the [`Accusations`], the [`Engine`] and the
//! [`JoinHold`]) and the daemon's glue around them, written after `run::daemon` call for call:
//! what it does on a watch event, a gossip change, a tick and a hold. The glue decides nothing
//! the daemon does not; where it differs (no tokio, no sockets) the module docs of
//! [`super`] say so.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use swimlb_proto::KeyRing;
use swimlb_proto::ethernet::MacAddr;
use tokio::time::Instant;

use crate::gossip::{Core, Directory, NodeIdentity, Outgoing};
use crate::model::announcer::Schedule;
use crate::model::engine::{Action, Engine, Input, Start};
use crate::model::links::{Link, MAIN_TABLE, Route};
use crate::model::membership::{LiveChange, LiveSet, NodeName};
use crate::model::snapshot::Snapshot;
use crate::model::watch_knobs::Knobs;
use crate::owner_watch::accusations::{Accusations, Change, Claimed, MemberChange, Silent};
use crate::owner_watch::core::{Command, Event, MAX_WATCHERS, Plan, WatchCore, watch_addr};
use crate::owner_watch::metrics::WatchMetrics;
use crate::run::daemon::WATCH_DEPTH;
use crate::run::hold::JoinHold;

/// The daemon's `AHEAD_CHECK_FOR`.
const AHEAD_CHECK_FOR: Duration = Duration::from_secs(1);

/// Node `i`'s MAC on the segment.
pub fn mac(i: usize) -> MacAddr {
    MacAddr(2, 0, 0, 0, 1, u8::try_from(i).unwrap_or(u8::MAX))
}

/// eth0 with the connected route of 192.0.2.0/24, where the VIPs are.
fn net(i: usize) -> (Vec<Link>, Vec<Route>) {
    let route = Route {
        dst: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 0)),
        prefix_len: 24,
        ifindex: 2,
        gateway: None,
        table: MAIN_TABLE,
        metric: 0,
    };
    let m = mac(i);
    (
        vec![Link::ethernet(2, "eth0", [m.0, m.1, m.2, m.3, m.4, m.5])],
        vec![route],
    )
}

/// What a node's cores asked the world to carry, after one call.
#[derive(Debug, Default)]
pub struct Out {
    /// Watch datagrams.
    pub datagrams: Vec<Outgoing>,
    /// Claims and refutations for the gossip.
    pub relays: Vec<Vec<u8>>,
    /// Members heard alive on the watch, for the gossip.
    pub heard: Vec<(SocketAddr, u64)>,
    /// Gratuitous announcements sent on the segment.
    pub announced: Vec<IpAddr>,
}

/// The daemon of one running member.
#[derive(Debug)]
pub struct Node {
    /// Its identity when the watch was last told.
    pub me: NodeIdentity,
    /// The real watch core.
    pub watch: WatchCore,
    /// The real accusations.
    pub accusations: Accusations,
    /// The real engine.
    pub engine: Engine,
    /// The real start-up and pause hold.
    pub hold: JoinHold,
    /// The IPs it answers now (from the engine's actions).
    pub answering: BTreeSet<IpAddr>,
    directory_from: u64,
    plan: Option<Plan>,
    ahead_checks: BTreeMap<NodeName, Duration>,
    took_over: Vec<(IpAddr, NodeName)>,
    origin: Instant,
    out: Out,
    now: Duration,
}

impl Node {
    /// The daemon of member `index` just started beside its gossip `core`, at `now`.
    pub fn start(
        index: usize,
        core: &Core,
        snapshot: Snapshot,
        origin: Instant,
        now: Duration,
    ) -> Node {
        let me = core.identity().clone();
        let (links, routes) = net(index);
        let start = Start {
            node: me.node.to_string(),
            schedule: Schedule::default(),
            snapshot,
            live: core.live().clone(),
            links,
            routes,
            hold: true,
        };
        let (engine, _) = Engine::new(origin + now, start);
        let plan = Plan {
            me: me.clone(),
            watchers: Vec::new(),
            held: true,
            accused: BTreeMap::new(),
        };
        let ring = KeyRing::new("swimlb-model-check", &[[7; 32]]).expect("a key ring");
        let local = watch_addr(me.addr).expect("a watch port");
        let seed = (index as u64) << 32 ^ me.bump;
        let watch = WatchCore::new(
            Knobs::default(),
            ring,
            local,
            plan,
            directory_of(core),
            WatchMetrics::default(),
            seed,
            now,
        )
        .expect("a watch core");
        let mut node = Node {
            me,
            watch,
            accusations: Accusations::default(),
            engine,
            hold: JoinHold::new(origin + now, false),
            answering: BTreeSet::new(),
            directory_from: core.members_version(),
            plan: None,
            ahead_checks: BTreeMap::new(),
            took_over: Vec::new(),
            origin,
            out: Out::default(),
            now,
        };
        node.refresh_plan(core, now);
        node
    }

    /// Takes what the cores asked the world to carry.
    pub fn take_out(&mut self) -> Out {
        self.collect_watch();
        std::mem::take(&mut self.out)
    }

    /// When this node wants to be called next (its watch, engine, accusations, hold).
    pub fn next_deadline(&self) -> Option<Duration> {
        let instant = |at: Instant| at.saturating_duration_since(self.origin);
        [
            self.watch.next_deadline(),
            self.engine.next_deadline().map(instant),
            self.accusations.next_lapse(),
            self.hold.next_deadline().map(instant),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Gives the watch the gossip's directory if it changed.
    pub fn refresh_directory(&mut self, core: &Core) {
        if core.members_version() != self.directory_from {
            self.directory_from = core.members_version();
            self.watch.set_directory(directory_of(core));
        }
    }

    /// Time passed to `now`: the watch's timers, the engine's tick (with the lapses), the hold.
    pub fn tick(&mut self, core: &Core, now: Duration) {
        self.refresh_directory(core);
        if self.watch.next_deadline().is_some_and(|at| at <= now) {
            self.watch.tick(now);
            self.watch_events(core, now);
        }
        let engine_due = self
            .engine
            .next_deadline()
            .is_some_and(|at| at <= self.origin + now);
        let lapse_due = self.accusations.next_lapse().is_some_and(|at| at <= now);
        if engine_due || lapse_due {
            let held = holds(core);
            for ended in self.accusations.lapse(now, held) {
                trace(now, &self.me, format_args!("ended {ended:?}"));
                self.reinstate(core, now, &ended.node);
            }
            self.handle(core, now, Input::Tick);
        }
        self.check_hold(core, now);
    }

    /// The gossip core renewed this node's identity (it was declared down): the plan goes
    /// again with the new incarnation.
    pub fn renewed(&mut self, core: &Core, now: Duration) {
        self.me = core.identity().clone();
        self.plan = None;
        self.refresh_plan(core, now);
    }

    /// A watch datagram arrived.
    pub fn datagram(&mut self, core: &Core, now: Duration, from: SocketAddr, bytes: &mut [u8]) {
        self.refresh_directory(core);
        self.watch.handle_datagram(now, from, bytes);
        self.watch_events(core, now);
    }

    /// A claim or refutation arrived through the gossip.
    pub fn relayed(&mut self, core: &Core, now: Duration, from: SocketAddr, payload: &[u8]) {
        self.refresh_directory(core);
        self.watch.handle_relayed(now, from, payload);
        self.watch_events(core, now);
    }

    /// Another node's announcement of `ip` was seen on the segment.
    pub fn conflict(&mut self, core: &Core, now: Duration, ip: IpAddr, from: usize) {
        self.handle(core, now, Input::Conflict { ip, mac: mac(from) });
    }

    /// A change from the gossip's stream (`Daemon::membership`).
    pub fn membership(&mut self, core: &Core, now: Duration, change: LiveChange) {
        trace(now, &self.me, format_args!("gossip {change:?}"));
        self.refresh_directory(core);
        let (node, joined) = match change {
            LiveChange::Up(node) => (node, true),
            LiveChange::Down(node) => (node, false),
            LiveChange::Meta(node) => (node, false),
        };
        let record = core.live().get(&node).cloned();
        let kind = match (joined, record.is_some()) {
            (true, _) => Change::Up,
            (false, false) => Change::Down,
            (false, true) => Change::Meta,
        };
        match self.accusations.member_changed(&node, kind, holds(core)) {
            MemberChange::NotAccused => {}
            MemberChange::Confirmed(ended) => {
                trace(now, &self.me, format_args!("ended {ended:?}"));
            }
            MemberChange::StillAccused => return,
        }
        self.plan = None;
        self.handle(
            core,
            now,
            Input::Member {
                node,
                record,
                joined,
            },
        );
        self.refresh_plan(core, now);
    }

    fn collect_watch(&mut self) {
        self.out.datagrams.extend(self.watch.drain_outgoing());
        self.out.relays.extend(self.watch.drain_relays());
        self.out.heard.extend(self.watch.drain_heard());
    }

    /// Feeds the engine and carries out its actions (`Daemon::handle` and `perform`).
    fn handle(&mut self, core: &Core, now: Duration, input: Input) {
        if matches!(input, Input::Member { .. } | Input::Live(_)) {
            self.plan = None;
        }
        self.now = now;
        let actions = self.engine.handle(self.origin + now, input);
        self.perform(actions);
        self.refresh_plan(core, now);
    }

    fn perform(&mut self, actions: Vec<Action>) {
        use crate::model::engine::Notice;
        for action in actions {
            match action {
                Action::Answer { ip, .. } => {
                    trace(self.now, &self.me, format_args!("answers {ip}"));
                    self.answering.insert(ip);
                }
                Action::Silence { ip, .. } => {
                    trace(self.now, &self.me, format_args!("silent {ip}"));
                    self.answering.remove(&ip);
                }
                Action::Announce { ip, .. } => self.out.announced.push(ip),
                Action::Notice(Notice::TookOver { ip, from }) => self.took_over.push((ip, from)),
                _ => {}
            }
        }
    }

    /// `Daemon::check_hold`, with the watch's pause as the only pause (the gossip driver's
    /// own pause watch is not in the world).
    fn check_hold(&mut self, core: &Core, now: Duration) {
        let at = self.origin + now;
        if self.hold.release(at, core.phase(), self.engine.live()) {
            trace(now, &self.me, format_args!("hold released"));
            self.handle(core, now, Input::Hold(false));
            if self.hold.after_pause() {
                self.check_owners_after_pause(core, now);
            }
        }
    }

    /// `Daemon::refresh_plan`: the successors of what this node answers, the hold, the
    /// accusations.
    fn refresh_plan(&mut self, core: &Core, now: Duration) {
        let me = core.identity().clone();
        let plan = Plan {
            me,
            watchers: self.watchers(),
            held: self.hold.holding(),
            accused: self.accusations.incarnations(),
        };
        if self.plan.as_ref() != Some(&plan) {
            self.watch.command(now, Command::Plan(plan.clone()));
            self.plan = Some(plan);
            self.watch_events(core, now);
        }
    }

    /// The first [`WATCH_DEPTH`] successors of the IPs this node answers for, the most often
    /// first successor first (`Successors::ranked`).
    fn watchers(&self) -> Vec<NodeName> {
        let election = self.engine.election();
        let live = self.engine.live();
        let mut counts: BTreeMap<NodeName, [usize; WATCH_DEPTH]> = BTreeMap::new();
        for ip in self.engine.answering().keys() {
            for (k, node) in election
                .successors(ip, live, WATCH_DEPTH)
                .into_iter()
                .enumerate()
            {
                counts.entry(node).or_default()[k] += 1;
            }
        }
        let mut ranked: Vec<_> = counts.into_iter().collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        ranked
            .into_iter()
            .take(MAX_WATCHERS)
            .map(|(n, _)| n)
            .collect()
    }

    /// The watch's events, until it has none (`Daemon::watch_event`).
    fn watch_events(&mut self, core: &Core, now: Duration) {
        for _ in 0..64 {
            let events: Vec<Event> = self.watch.drain_events().collect();
            if events.is_empty() {
                break;
            }
            for event in events {
                self.watch_event(core, now, event);
            }
        }
        self.collect_watch();
    }

    fn watch_event(&mut self, core: &Core, now: Duration, event: Event) {
        trace(now, &self.me, format_args!("watch {event:?}"));
        match event {
            Event::Silent { owner, silent_for } => self.silent(core, now, owner, silent_for),
            Event::Claimed {
                claimant,
                accused,
                incarnation,
                ..
            } => {
                let me = core.identity().clone();
                match self
                    .accusations
                    .claimed(now, &me, &accused, incarnation, holds(core))
                {
                    verdict
                        if {
                            trace(
                                now,
                                &self.me,
                                format_args!("claim against {accused}#{incarnation}: {verdict:?}"),
                            );
                            false
                        } => {}
                    Claimed::Refute => {
                        self.watch.command(now, Command::Refute);
                        if !self.engine.answering().is_empty() {
                            let record = core.live().get(&claimant).cloned();
                            let joined = true;
                            let input = Input::Member {
                                node: claimant,
                                record,
                                joined,
                            };
                            self.handle(core, now, input);
                        }
                    }
                    Claimed::Accuse => self.elect_without(core, now, &accused),
                    _ => {}
                }
            }
            Event::Moved { .. } => {}
            Event::Alive { node, incarnation } => {
                if let Some(ended) = self.accusations.alive(now, &node, incarnation) {
                    trace(now, &self.me, format_args!("ended {ended:?}"));
                    self.reinstate(core, now, &ended.node);
                }
            }
            Event::Paused { .. } => {
                if self.hold.rearm_now(self.origin + now) {
                    self.handle(core, now, Input::Hold(true));
                }
                self.plan = None;
                self.refresh_plan(core, now);
            }
        }
    }

    /// `Event::Silent` in `Daemon::watch_event`.
    fn silent(&mut self, core: &Core, now: Duration, owner: NodeIdentity, silent_for: Duration) {
        let node = owner.node.to_string();
        let alive = core.live().contains(&node);
        let asked = self
            .ahead_checks
            .remove(&node)
            .is_some_and(|at| now.saturating_sub(at) <= AHEAD_CHECK_FOR);
        let succeeds = alive && self.succeeds(&node);
        let eligible = alive && (asked || succeeds);
        let verdict = self
            .accusations
            .silent(now, &owner, silent_for, eligible, holds(core));
        if alive && matches!(verdict, Silent::TakeOver | Silent::NotEligible) {
            self.check_ahead(core, now, &node);
        }
        trace(now, &self.me, format_args!("silent {owner:?}: {verdict:?}"));
        if verdict != Silent::TakeOver {
            return;
        }
        self.elect_without(core, now, &node);
        let ip = self
            .took_over
            .iter()
            .find(|(_, from)| *from == node)
            .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |(ip, _)| *ip);
        self.watch
            .command(now, Command::Claim { ip, accused: owner });
    }

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

    fn check_ahead(&mut self, core: &Core, now: Duration, owner: &str) {
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
            self.ask_check(core, now, &member);
        }
    }

    fn check_owners_after_pause(&mut self, core: &Core, now: Duration) {
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
            self.ask_check(core, now, &owner);
        }
    }

    fn ask_check(&mut self, core: &Core, now: Duration, member: &str) {
        self.ahead_checks
            .retain(|_, at| now.saturating_sub(*at) <= AHEAD_CHECK_FOR);
        if self.ahead_checks.contains_key(member) {
            return;
        }
        let Some(id) = core
            .member_identities()
            .find(|id| id.node == member)
            .cloned()
        else {
            return;
        };
        self.ahead_checks.insert(member.to_string(), now);
        self.watch.command(now, Command::Check { member: id });
    }

    fn elect_without(&mut self, core: &Core, now: Duration, node: &str) {
        let input = Input::Member {
            node: node.to_string(),
            record: None,
            joined: false,
        };
        self.handle(core, now, input);
    }

    /// `Daemon::reinstate` and `remind`.
    fn reinstate(&mut self, core: &Core, now: Duration, node: &str) {
        let record = core.live().get(node).cloned();
        let input = Input::Member {
            node: node.to_string(),
            record,
            joined: true,
        };
        self.handle(core, now, input);
        let Some(owner) = core.member_identities().find(|id| id.node == node).cloned() else {
            return;
        };
        let election = self.engine.election();
        let handed = self
            .engine
            .answering()
            .keys()
            .find(|ip| self.engine.handing_over(ip) && election.owner(ip) == Some(node))
            .copied();
        if let Some(ip) = handed {
            trace(now, &self.me, format_args!("remind {owner:?} of {ip}"));
            self.watch.command(now, Command::Remind { ip, owner });
        }
    }
}

/// With `SWIMLB_MODEL_TRACE` set, what each daemon does, on stderr.
fn trace(now: Duration, me: &NodeIdentity, what: std::fmt::Arguments<'_>) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("SWIMLB_MODEL_TRACE").is_some()) {
        eprintln!("{:>9.3} {}#{} {what}", now.as_secs_f64(), me.node, me.bump);
    }
}

/// Whether the gossip holds a member alive in an incarnation (`Daemon::holds`).
fn holds(core: &Core) -> impl Fn(&str, u64) -> bool + use<> {
    let directory = directory_of(core);
    move |node, incarnation| directory.get(node).is_some_and(|id| id.bump == incarnation)
}

/// The gossip's directory of `core` (the driver's `directory`).
pub fn directory_of(core: &Core) -> Directory {
    std::sync::Arc::new(
        core.member_identities()
            .map(|id| (id.node.to_string(), id.clone()))
            .collect(),
    )
}

/// The owners `engine` names, per IP.
pub fn owners(engine: &Engine) -> BTreeMap<IpAddr, Option<NodeName>> {
    engine
        .election()
        .outcomes()
        .iter()
        .map(|(ip, o)| (*ip, o.owner().map(str::to_string)))
        .collect()
}

/// Unused here; keeps [`LiveSet`] in scope for the docs.
#[allow(dead_code)]
type Live = LiveSet;
