//! The invariants of a chaos run, checked over what the lab recorded: a pure function of the
//! faults as they were executed ([`World`]), the client's observations and the speakers'
//! `/status` polls ([`Observations`]), and the election rule the lab computes on its own
//! ([`Rule`]).
//!
//! - **dual**: two MACs answered one ARP request for a VIP, request after request (gaps of at
//!   most [`DUAL_GAP`]), for longer than [`LIMIT`];
//! - **dark**: a VIP's probes went unanswered for longer than [`LIMIT`] while a node able to
//!   serve it was available the whole time (powered, linked, its daemon running and not
//!   stopped, its check passing, started at least [`STARTUP_GRACE`] ago);
//! - **disagreement**: [`SETTLE`] after the last fault event, the live speakers that answered
//!   `/status` name different owners for a VIP;
//! - **misplaced**: [`SETTLE`] plus the preemption delay after the last fault event, the owner
//!   the speakers agree on, or a MAC answering ARP, is not the node [`Rule::expected`] names.
//!
//! A mesh cut in two (the live nodes' gossip graph, with every pair whose membership traffic
//! is dropped either way removed, is disconnected) is a partition no protocol can agree
//! across: dual, disagreement and misplaced seen around one are counted as excused, not as
//! violations. Crash and leak are the runner's (they read logs and `/proc`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use serde::Serialize;

use super::schedule::{Fault, FaultKind, Step, Traffic};
use crate::lab::rule;
use swimlb_speaker::run::hold::JOIN_GRACE;

/// How long a dual or dark answer may last.
pub const LIMIT: Duration = Duration::from_secs(1);
/// Gaps between two-MAC answers that still make one dual episode (two ARP intervals lost).
pub const DUAL_GAP: Duration = Duration::from_millis(300);
/// After the last fault event, how long the speakers have to agree.
pub const SETTLE: Duration = Duration::from_secs(2);
/// A daemon started (or a node powered on) counts as available this long after.
pub const STARTUP_GRACE: Duration = Duration::from_secs(2);
/// A daemon that waited for the API server (started during an outage) may name no owner this
/// long after the server is back: it abstains (answers nothing) until its first lists, which a
/// restarted API server can make wait seconds (403s while its RBAC caches fill). It is not
/// counted as disagreeing meanwhile; what the client sees (dual, dark) still counts.
pub const API_LIST_GRACE: Duration = Duration::from_secs(10);
/// The client's ARP interval.
pub const ARP_INTERVAL: Duration = Duration::from_millis(100);

/// The invariants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Invariant {
    /// Two MACs answer one VIP.
    Dual,
    /// A VIP with an available node unanswered.
    Dark,
    /// Live speakers name different owners.
    Disagreement,
    /// The owner is not the rule's.
    Misplaced,
    /// A panic or an unexpected exit.
    Crash,
    /// Resident memory grew.
    Leak,
    /// A `ServiceL2Status` names another node than the answering one (Kubernetes).
    StaleRecord,
    /// One IP on two Services that do not share it (Kubernetes).
    DoubleAllocation,
}

impl Invariant {
    /// Every invariant, in report order.
    pub const ALL: [Invariant; 8] = [
        Invariant::Dual,
        Invariant::Dark,
        Invariant::Disagreement,
        Invariant::Misplaced,
        Invariant::Crash,
        Invariant::Leak,
        Invariant::StaleRecord,
        Invariant::DoubleAllocation,
    ];

    /// A fixed name.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Invariant::Dual => "dual",
            Invariant::Dark => "dark",
            Invariant::Disagreement => "disagreement",
            Invariant::Misplaced => "misplaced",
            Invariant::Crash => "crash",
            Invariant::Leak => "leak",
            Invariant::StaleRecord => "stale_record",
            Invariant::DoubleAllocation => "double_allocation",
        }
    }
}

/// One violation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// Which invariant.
    pub invariant: Invariant,
    /// When it became a violation, since the start of the run.
    #[serde(rename = "at_ms", serialize_with = "as_ms")]
    pub at: Duration,
    /// The VIP (0-based), when it is about one.
    pub vip: Option<usize>,
    /// What was seen.
    pub detail: String,
    /// Seen around a partition of the mesh: reported, not counted.
    pub excused: bool,
}

/// `dual at 12.34 s (excused): ...`: one line of a report.
impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} at {:.2} s{}: {}",
            self.invariant.as_str(),
            self.at.as_secs_f64(),
            if self.excused { " (excused)" } else { "" },
            self.detail
        )
    }
}

fn as_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

/// A fault step as the runner executed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Executed {
    /// When it took effect as far as the checker knows, since the start of the run: when it
    /// began, or for a step that ends a fault or starts a daemon, when it was done.
    pub at: Duration,
    /// When it began and when it was done. The world may have changed at any moment in
    /// between (a kube-apiserver serves lists before its `/readyz` says ok, which is when an
    /// outage's end is recorded).
    pub began: Duration,
    /// See `began`.
    pub done: Duration,
    /// Index of the fault.
    pub fault: usize,
    /// What was done.
    pub step: Step,
}

/// One node's state as the faults left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeState {
    /// Not powered off.
    pub powered: bool,
    /// Link up.
    pub link: bool,
    /// Daemon running (not killed).
    pub running: bool,
    /// Daemon stopped (SIGSTOP).
    pub paused: bool,
    /// Health check passing.
    pub check: bool,
    /// Labelled `exclude-from-external-load-balancers` (Kubernetes).
    pub excluded: bool,
    /// Its endpoint of the `Local` Service ready (Kubernetes).
    pub endpoint: bool,
    /// Its daemon started while the API server was down: a Kubernetes speaker serves nothing
    /// before its first list, so it counts from the API server's return.
    pub needs_api: bool,
    /// When the API server came back for a daemon that waited for it (see
    /// [`API_LIST_GRACE`]); cleared when the daemon starts again.
    pub api_back: Option<Duration>,
    /// When its daemon last started (or the node powered on, or the API server came back for
    /// a daemon that waited for it).
    pub started: Duration,
}

impl NodeState {
    /// Up and able to speak: powered, linked, running, not stopped.
    pub fn live(&self) -> bool {
        self.powered && self.link && self.running && !self.paused
    }
}

/// Every node's state and the dropped membership pairs, after some change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// Index 0 is node 1.
    pub nodes: Vec<NodeState>,
    /// The API server up (Kubernetes).
    pub api: bool,
    /// Directed (from, to) pairs whose membership traffic is dropped, with how many faults
    /// drop it.
    pub dropped: BTreeMap<(usize, usize), u32>,
}

impl State {
    /// Fault `kind` put on (`on`) or taken off at `at`; false when it changes nothing the
    /// checker models.
    fn apply(&mut self, kind: FaultKind, on: bool, at: Duration) -> bool {
        let nodes = self.nodes.len();
        let node = |n: usize| n.checked_sub(1).filter(|i| *i < nodes);
        match kind {
            FaultKind::PowerOff { node: n } => {
                if let Some(i) = node(n) {
                    self.nodes[i].powered = !on;
                    self.nodes[i].link = !on;
                    self.set_running(i, !on, at);
                }
            }
            FaultKind::Kill { node: n } => {
                if let Some(i) = node(n) {
                    self.set_running(i, !on, at);
                }
            }
            FaultKind::ApiDown => {
                self.api = !on;
                for s in self.nodes.iter_mut().filter(|s| !on && s.needs_api) {
                    s.needs_api = false;
                    s.api_back = Some(at);
                    s.started = at;
                }
            }
            FaultKind::Exclude { node: n } => {
                if let Some(i) = node(n) {
                    self.nodes[i].excluded = on;
                }
            }
            FaultKind::EndpointNotReady { node: n } => {
                if let Some(i) = node(n) {
                    self.nodes[i].endpoint = !on;
                }
            }
            FaultKind::Pause { node: n } => {
                if let Some(i) = node(n) {
                    self.nodes[i].paused = on;
                }
            }
            FaultKind::LinkFlap { node: n } => {
                if let Some(i) = node(n) {
                    self.nodes[i].link = !on;
                }
            }
            FaultKind::CheckFail { node: n } => {
                if let Some(i) = node(n) {
                    self.nodes[i].check = !on;
                }
            }
            FaultKind::Drop {
                traffic: Traffic::Membership,
                from,
                to,
                both,
            } => {
                let mut pairs = vec![(from, to)];
                if both {
                    pairs.push((to, from));
                }
                for p in pairs {
                    let count = self.dropped.entry(p).or_insert(0);
                    *count = if on {
                        *count + 1
                    } else {
                        count.saturating_sub(1)
                    };
                }
            }
            _ => return false,
        }
        true
    }

    /// Node index `i`'s daemon stopped, or started at `at` (counting from the API server's
    /// return when it is down).
    fn set_running(&mut self, i: usize, running: bool, at: Duration) {
        let api = self.api;
        let s = &mut self.nodes[i];
        s.running = running;
        if running {
            s.started = at;
            s.needs_api = !api;
            s.api_back = None;
        }
    }

    /// Whether the live nodes' gossip graph is disconnected (a pair with traffic dropped either
    /// way is no edge). A node whose daemon waits for the API server is not in the graph: a
    /// Kubernetes speaker learns its gossip peers from the API, so it joins nobody before then.
    pub fn partitioned(&self) -> bool {
        let live: Vec<usize> = (1..=self.nodes.len())
            .filter(|n| self.nodes[n - 1].live() && !self.nodes[n - 1].needs_api)
            .collect();
        let Some(&first) = live.first() else {
            return false;
        };
        let cut = |a: usize, b: usize| {
            self.dropped.get(&(a, b)).is_some_and(|c| *c > 0)
                || self.dropped.get(&(b, a)).is_some_and(|c| *c > 0)
        };
        let mut reached = BTreeSet::from([first]);
        let mut frontier = vec![first];
        while let Some(a) = frontier.pop() {
            for &b in &live {
                if !reached.contains(&b) && !cut(a, b) {
                    reached.insert(b);
                    frontier.push(b);
                }
            }
        }
        reached.len() < live.len()
    }
}

/// The faults as executed: the state after every change, and every fault event's time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct World {
    snapshots: Vec<(Duration, State)>,
    /// Every step's span: from when it began to when it was done ([`Executed`]).
    events: Vec<(Duration, Duration)>,
}

impl World {
    /// Replays `executed` (in time order) steps of `faults` over `nodes` nodes that all started
    /// at time 0.
    pub fn new(faults: &[Fault], executed: &[Executed], nodes: usize) -> World {
        let mut state = State {
            nodes: vec![
                NodeState {
                    powered: true,
                    link: true,
                    running: true,
                    paused: false,
                    check: true,
                    excluded: false,
                    endpoint: true,
                    needs_api: false,
                    api_back: None,
                    started: Duration::ZERO,
                };
                nodes
            ],
            api: true,
            dropped: BTreeMap::new(),
        };
        let mut snapshots = vec![(Duration::ZERO, state.clone())];
        let mut events = Vec::new();
        for e in executed {
            events.push((e.began.min(e.at), e.done.max(e.at)));
            let Some(fault) = faults.get(e.fault) else {
                continue;
            };
            let node = |n: usize| n.checked_sub(1).filter(|i| *i < nodes);
            let on = match e.step {
                Step::Apply => true,
                Step::Undo => false,
                Step::Rotate { .. } => continue,
                Step::Roll { node: n, up } => {
                    if let Some(i) = node(n) {
                        state.set_running(i, up, e.at);
                        snapshots.push((e.at, state.clone()));
                    }
                    continue;
                }
            };
            if !state.apply(fault.kind, on, e.at) {
                continue;
            }
            snapshots.push((e.at, state.clone()));
        }
        World { snapshots, events }
    }

    /// The state at `t`.
    pub fn at(&self, t: Duration) -> &State {
        let i = self.snapshots.partition_point(|(at, _)| *at <= t);
        &self.snapshots[i.saturating_sub(1)].1
    }

    /// Whether the mesh was partitioned at any time in `from..=to`.
    pub fn partitioned_within(&self, from: Duration, to: Duration) -> bool {
        self.at(from).partitioned()
            || self
                .snapshots
                .iter()
                .filter(|(at, _)| *at > from && *at <= to)
                .any(|(_, s)| s.partitioned())
    }

    /// The last moment at or before `t` the faults may have changed the world: `t` itself
    /// while a step is under way.
    pub fn last_event(&self, t: Duration) -> Option<Duration> {
        self.events
            .iter()
            .filter(|(began, _)| *began <= t)
            .map(|(_, at)| (*at).min(t))
            .max()
    }
}

/// One VIP under the lab's own election rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VipRule {
    /// The address.
    pub ip: Ipv4Addr,
    /// Whether its group has the health check (a failing one makes a node ineligible).
    pub checked: bool,
    /// A `Local` Service's: only nodes with a ready endpoint are eligible.
    pub local: bool,
    /// Base priority per node (index 0 is node 1).
    pub priorities: Vec<u8>,
}

/// The lab's election rule: for each VIP, the live eligible nodes by priority (descending),
/// then MetalLB's order ([`rule::metallb_order`]); every node settled (the rule is only
/// asked after the preemption delay).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The VIPs, in order.
    pub vips: Vec<VipRule>,
    /// The node names, in order.
    pub names: Vec<String>,
    /// The groups' preemption delay.
    pub preempt_delay: Duration,
}

impl Rule {
    /// Whether node `n` (1-based) can serve VIP `vip` in `state` at `t` (with the start-up
    /// grace).
    fn available(&self, state: &State, n: usize, vip: usize, t: Duration) -> bool {
        self.eligible(state, n, vip) && t >= state.nodes[n - 1].started + STARTUP_GRACE
    }

    /// Whether node `n` (1-based) is a candidate for VIP `vip` in `state`: live, its check
    /// passing where the group has one, not excluded, with a ready endpoint for a `Local`
    /// Service, its daemon not waiting for the API server.
    fn eligible(&self, state: &State, n: usize, vip: usize) -> bool {
        let (s, rule) = (&state.nodes[n - 1], &self.vips[vip]);
        s.live()
            && (s.check || !rule.checked)
            && !s.excluded
            && (s.endpoint || !rule.local)
            && !s.needs_api
    }

    /// The node (1-based) the rule names for VIP `vip` in `state`; `None` when no node is a
    /// candidate.
    pub fn expected(&self, state: &State, vip: usize) -> Option<usize> {
        let rule = &self.vips[vip];
        let candidates: Vec<usize> = (1..=self.names.len())
            .filter(|n| self.eligible(state, *n, vip))
            .collect();
        let names: Vec<&str> = candidates
            .iter()
            .map(|n| self.names[n - 1].as_str())
            .collect();
        let order = rule::metallb_order(&names, IpAddr::V4(rule.ip));
        candidates.into_iter().min_by_key(|n| {
            let rank = order
                .iter()
                .position(|o| *o == self.names[n - 1])
                .unwrap_or(usize::MAX);
            (std::cmp::Reverse(rule.priorities[n - 1]), rank)
        })
    }
}

/// One probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// Sent, since the start of the run.
    pub sent: Duration,
    /// Whether anyone answered.
    pub answered: bool,
}

/// One ARP request and who answered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArpSample {
    /// Sent, since the start of the run.
    pub at: Duration,
    /// The nodes (1-based; 0 for a MAC of no node) that answered.
    pub nodes: BTreeSet<usize>,
}

/// What the client saw of one VIP.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VipObservations {
    /// Probes, in order.
    pub probes: Vec<Probe>,
    /// ARP requests, in order.
    pub arp: Vec<ArpSample>,
}

/// One round of `/status` reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Poll {
    /// When the round started, since the start of the run.
    pub at: Duration,
    /// When its last read returned.
    pub done: Duration,
    /// Per node (index 0 is node 1): the owner it names for each VIP, or `None` when it did
    /// not answer.
    pub owners: Vec<Option<Vec<Option<String>>>>,
}

/// Everything observed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observations {
    /// Per VIP.
    pub vips: Vec<VipObservations>,
    /// `/status` rounds, in order.
    pub polls: Vec<Poll>,
    /// Reads of the API server's records and Services, in order (Kubernetes).
    pub records: Vec<super::records::RecordPoll>,
    /// Observations are complete up to here.
    pub horizon: Duration,
}

/// Checks dual, dark, disagreement and misplaced over `obs`; `status`: whether the target has
/// `/status` (and so a rule to check).
pub fn evaluate(rule: &Rule, world: &World, obs: &Observations, status: bool) -> Vec<Violation> {
    let mut found = Vec::new();
    dual(world, obs, &mut found);
    for (vip, o) in obs.vips.iter().enumerate() {
        dark(rule, world, vip, o, obs.horizon, &mut found);
    }
    if status {
        settled(rule, world, obs, &mut found);
    }
    found.sort_by_key(|v| (v.at, v.invariant));
    found
}

fn node_list(nodes: &BTreeSet<usize>) -> String {
    nodes
        .iter()
        .map(|n| match n {
            0 => "an unknown MAC".to_string(),
            n => format!("node{n}"),
        })
        .collect::<Vec<_>>()
        .join(" and ")
}

/// One stretch of ARP requests for a VIP answered by two MACs or more (gaps of at most
/// [`DUAL_GAP`]), however short: the runs report them all, the invariant only those longer
/// than [`LIMIT`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DualEpisode {
    /// The VIP (0-based).
    pub vip: usize,
    /// The first request answered twice, since the start of the run.
    #[serde(rename = "at_ms", serialize_with = "as_ms")]
    pub at: Duration,
    /// From the first such request to one ARP interval after the last.
    #[serde(rename = "span_ms", serialize_with = "as_ms")]
    pub span: Duration,
    /// The nodes that answered (0: a MAC of no node).
    pub nodes: BTreeSet<usize>,
}

/// Every dual episode in `obs`, in time order per VIP.
pub fn dual_episodes(obs: &Observations) -> Vec<DualEpisode> {
    let mut episodes = Vec::new();
    for (vip, o) in obs.vips.iter().enumerate() {
        let mut open: Option<(Duration, Duration, BTreeSet<usize>)> = None;
        let mut close = |(first, last, nodes): (Duration, Duration, BTreeSet<usize>)| {
            episodes.push(DualEpisode {
                vip,
                at: first,
                span: last - first + ARP_INTERVAL,
                nodes,
            })
        };
        for s in o
            .arp
            .iter()
            .filter(|s| s.at <= obs.horizon && s.nodes.len() >= 2)
        {
            open = match open.take() {
                Some((first, last, mut nodes)) if s.at <= last + DUAL_GAP => {
                    nodes.extend(&s.nodes);
                    Some((first, s.at, nodes))
                }
                Some(done) => {
                    close(done);
                    Some((s.at, s.at, s.nodes.clone()))
                }
                None => Some((s.at, s.at, s.nodes.clone())),
            };
        }
        if let Some(e) = open {
            close(e);
        }
    }
    episodes
}

fn dual(world: &World, obs: &Observations, found: &mut Vec<Violation>) {
    for e in dual_episodes(obs).into_iter().filter(|e| e.span > LIMIT) {
        found.push(Violation {
            invariant: Invariant::Dual,
            at: e.at + LIMIT,
            vip: Some(e.vip),
            detail: format!(
                "{} answered ARP for the VIP for {:.1} s",
                node_list(&e.nodes),
                e.span.as_secs_f64()
            ),
            excused: world
                .partitioned_within(e.at.saturating_sub(SETTLE), e.at + e.span - ARP_INTERVAL),
        });
    }
}

fn dark(
    rule: &Rule,
    world: &World,
    vip: usize,
    o: &VipObservations,
    horizon: Duration,
    found: &mut Vec<Violation>,
) {
    // Within a run of unanswered probes: since when some node could serve the VIP throughout.
    let mut dark_since: Option<Duration> = None;
    let mut served_since: Option<Duration> = None;
    let mut reported = false;
    for p in o.probes.iter().filter(|p| p.sent <= horizon) {
        if p.answered {
            dark_since = None;
            served_since = None;
            reported = false;
            continue;
        }
        dark_since.get_or_insert(p.sent);
        let state = world.at(p.sent);
        let available: Vec<usize> = (1..=rule.names.len())
            .filter(|n| rule.available(state, *n, vip, p.sent))
            .collect();
        if available.is_empty() {
            served_since = None;
            continue;
        }
        let since = *served_since.get_or_insert(p.sent);
        if !reported && p.sent > since + LIMIT {
            reported = true;
            found.push(Violation {
                invariant: Invariant::Dark,
                at: since + LIMIT,
                vip: Some(vip),
                detail: format!(
                    "no answer since {:.2} s, though {} could serve it",
                    dark_since.unwrap_or(since).as_secs_f64(),
                    node_list(&available.into_iter().collect())
                ),
                excused: false,
            });
        }
    }
}

fn settled(rule: &Rule, world: &World, obs: &Observations, found: &mut Vec<Violation>) {
    // One violation per run of failing polls (per VIP and invariant).
    let mut open: BTreeSet<(usize, Invariant)> = BTreeSet::new();
    for poll in obs.polls.iter().filter(|p| p.at <= obs.horizon) {
        // Quiet from the last fault event before the round's end to its start: a read that
        // returned after a fault began (slowed by loss) is no view of the quiet before it.
        let quiet = match world.last_event(poll.done) {
            Some(e) => poll.at.saturating_sub(e),
            None => poll.at,
        };
        let state = world.at(poll.at);
        let partitioned = state.partitioned();
        let mut failing: BTreeSet<(usize, Invariant)> = BTreeSet::new();
        for vip in 0..rule.vips.len() {
            if quiet < SETTLE {
                continue;
            }
            // The live speakers that answered, and the owners they name (a Kubernetes speaker
            // started while the API server was down knows no Service yet: it names nobody, and
            // abstains for API_LIST_GRACE after the server is back).
            let named: BTreeMap<usize, Option<String>> = poll
                .owners
                .iter()
                .enumerate()
                .filter(|(i, _)| {
                    state
                        .nodes
                        .get(*i)
                        .is_some_and(|s| s.live() && !s.needs_api)
                })
                .filter_map(|(i, v)| Some((i + 1, v.as_ref()?.get(vip)?.clone())))
                .filter(|(n, owner)| {
                    let listing = state.nodes[n - 1]
                        .api_back
                        .is_some_and(|back| poll.at < back + API_LIST_GRACE);
                    owner.is_some() || !listing
                })
                .collect();
            let distinct: BTreeSet<&Option<String>> = named.values().collect();
            let mut push = |invariant: Invariant, detail: String| {
                failing.insert((vip, invariant));
                if !open.contains(&(vip, invariant)) {
                    found.push(Violation {
                        invariant,
                        at: poll.at,
                        vip: Some(vip),
                        detail,
                        excused: partitioned,
                    });
                }
            };
            if distinct.len() > 1 {
                let said: Vec<String> = named
                    .iter()
                    .map(|(n, o)| format!("node{n} names {}", o.as_deref().unwrap_or("nobody")))
                    .collect();
                push(Invariant::Disagreement, said.join(", "));
            }
            if quiet < SETTLE + rule.preempt_delay {
                continue;
            }
            let Some(expected) = rule.expected(state, vip) else {
                continue;
            };
            // A speaker answers at the latest JOIN_GRACE after it starts (its start-up hold
            // waits for every member's record, seconds under loss): not the owner before.
            if poll.at < state.nodes[expected - 1].started + JOIN_GRACE {
                continue;
            }
            let expected_name = &rule.names[expected - 1];
            if let [Some(agreed)] = distinct.into_iter().collect::<Vec<_>>()[..]
                && agreed != expected_name
            {
                push(
                    Invariant::Misplaced,
                    format!("the speakers name {agreed}; the rule names {expected_name}"),
                );
                continue;
            }
            let answering: BTreeSet<usize> = obs
                .vips
                .get(vip)
                .map(|o| {
                    o.arp
                        .iter()
                        .filter(|s| s.at + Duration::from_millis(500) >= poll.at && s.at <= poll.at)
                        .flat_map(|s| s.nodes.iter().copied())
                        .collect()
                })
                .unwrap_or_default();
            if !answering.is_empty() && answering != BTreeSet::from([expected]) {
                push(
                    Invariant::Misplaced,
                    format!(
                        "{} answered ARP; the rule names {expected_name}",
                        node_list(&answering)
                    ),
                );
            }
        }
        open = failing;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chaos::schedule::FaultKind;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn rule(nodes: usize) -> Rule {
        Rule {
            vips: vec![VipRule {
                ip: Ipv4Addr::new(198, 51, 100, 100),
                checked: true,
                local: false,
                priorities: vec![100; nodes],
            }],
            names: (1..=nodes).map(|i| format!("node{i}")).collect(),
            preempt_delay: ms(1000),
        }
    }

    fn fault(at: u64, duration: u64, kind: FaultKind) -> Fault {
        Fault {
            at: ms(at),
            duration: ms(duration),
            kind,
        }
    }

    fn executed(faults: &[Fault]) -> Vec<Executed> {
        let mut all: Vec<Executed> = faults
            .iter()
            .enumerate()
            .flat_map(|(i, f)| {
                [
                    Executed {
                        at: f.at,
                        began: f.at,
                        done: f.at,
                        fault: i,
                        step: Step::Apply,
                    },
                    Executed {
                        at: f.end(),
                        began: f.end(),
                        done: f.end(),
                        fault: i,
                        step: Step::Undo,
                    },
                ]
            })
            .collect();
        all.sort_by_key(|e| e.at);
        all
    }

    fn arp(from_ms: u64, to_ms: u64, nodes: &[usize]) -> Vec<ArpSample> {
        (from_ms / 100..to_ms / 100)
            .map(|i| ArpSample {
                at: ms(i * 100),
                nodes: nodes.iter().copied().collect(),
            })
            .collect()
    }

    fn probes(from_ms: u64, to_ms: u64, answered: bool) -> Vec<Probe> {
        (from_ms / 10..to_ms / 10)
            .map(|i| Probe {
                sent: ms(i * 10),
                answered,
            })
            .collect()
    }

    fn kinds(v: &[Violation]) -> Vec<(&'static str, bool)> {
        v.iter()
            .map(|v| (v.invariant.as_str(), v.excused))
            .collect()
    }

    #[test]
    fn the_lab_rule_is_metallbs_order_after_priority_and_checks() {
        let mut r = rule(3);
        let world = World::new(&[], &[], 3);
        // The lab's first VIP belongs to node3, then node2 (converge's pinned order).
        assert_eq!(r.expected(world.at(ms(0)), 0), Some(3));
        r.vips[0].priorities[0] = 110;
        assert_eq!(r.expected(world.at(ms(0)), 0), Some(1));
        let faults = [fault(1000, 5000, FaultKind::CheckFail { node: 1 })];
        let world = World::new(&faults, &executed(&faults), 3);
        assert_eq!(r.expected(world.at(ms(2000)), 0), Some(3));
        r.vips[0].checked = false;
        assert_eq!(r.expected(world.at(ms(2000)), 0), Some(1));
        let faults = [
            fault(0, 9000, FaultKind::PowerOff { node: 1 }),
            fault(0, 9000, FaultKind::Kill { node: 3 }),
        ];
        let world = World::new(&faults, &executed(&faults), 3);
        assert_eq!(r.expected(world.at(ms(5000)), 0), Some(2));
    }

    #[test]
    fn two_macs_for_over_a_second_are_dual_and_a_shorter_overlap_is_not() {
        let world = World::new(&[], &[], 3);
        let mut o = VipObservations {
            arp: arp(0, 5000, &[3]),
            ..Default::default()
        };
        o.arp.extend(arp(5000, 5800, &[2, 3]));
        o.arp.extend(arp(5800, 7000, &[3]));
        o.arp.extend(arp(7000, 8500, &[2, 3]));
        let obs = Observations {
            vips: vec![o],
            polls: vec![],
            records: Vec::new(),
            horizon: ms(10_000),
        };
        let found = evaluate(&rule(3), &world, &obs, false);
        assert_eq!(kinds(&found), [("dual", false)]);
        assert_eq!(found[0].at, ms(8000));
        assert!(found[0].detail.contains("node2 and node3"), "{found:?}");
    }

    #[test]
    fn dual_answers_across_a_partition_are_excused() {
        let faults = [fault(
            1000,
            6000,
            FaultKind::Drop {
                traffic: Traffic::Membership,
                from: 1,
                to: 2,
                both: true,
            },
        )];
        // Two nodes: cutting their only pair partitions the mesh.
        let world = World::new(&faults, &executed(&faults), 2);
        let obs = Observations {
            vips: vec![VipObservations {
                arp: arp(2000, 5000, &[1, 2]),
                ..Default::default()
            }],
            polls: vec![],
            records: Vec::new(),
            horizon: ms(10_000),
        };
        assert_eq!(
            kinds(&evaluate(&rule(2), &world, &obs, false)),
            [("dual", true)]
        );
        // With a third node relaying, the same drop is no partition.
        let world = World::new(&faults, &executed(&faults), 3);
        assert_eq!(
            kinds(&evaluate(&rule(3), &world, &obs, false)),
            [("dual", false)]
        );
    }

    #[test]
    fn a_node_waiting_for_the_api_server_does_not_join_a_cut_mesh() {
        // node1 <-> node2 dropped from 1 s to 9 s; the API server down from 1 s to 7 s; node3
        // powered off at 2 s and on at 4 s, in the outage: its speaker waits for the API server
        // (it learns its gossip peers from it), so the mesh stays cut until 7 s.
        let faults = [
            fault(
                1000,
                8000,
                FaultKind::Drop {
                    traffic: Traffic::Membership,
                    from: 1,
                    to: 2,
                    both: true,
                },
            ),
            fault(1000, 6000, FaultKind::ApiDown),
            fault(2000, 2000, FaultKind::PowerOff { node: 3 }),
        ];
        let world = World::new(&faults, &executed(&faults), 3);
        assert!(world.at(ms(3000)).partitioned(), "node3 powered off");
        assert!(world.at(ms(5000)).partitioned(), "node3 waits for the API");
        assert!(
            !world.at(ms(8000)).partitioned(),
            "node3 relays once listed"
        );
    }

    #[test]
    fn a_dark_vip_counts_only_while_a_node_could_serve_it() {
        // Every node killed from 1 s to 6 s: dark, but nobody could serve it; node1 back at
        // 6 s, available at 8 s (start-up grace); unanswered until 8.5 s is fine, until 9.5 s
        // is not.
        let faults: Vec<Fault> = (1..=3)
            .map(|n| {
                fault(
                    1000,
                    if n == 1 { 5000 } else { 20_000 },
                    FaultKind::Kill { node: n },
                )
            })
            .collect();
        let world = World::new(&faults, &executed(&faults), 3);
        let mut p = probes(0, 1000, true);
        p.extend(probes(1000, 8500, false));
        p.extend(probes(8500, 12_000, true));
        let obs = |p: Vec<Probe>| Observations {
            vips: vec![VipObservations {
                probes: p,
                ..Default::default()
            }],
            polls: vec![],
            records: Vec::new(),
            horizon: ms(12_000),
        };
        assert_eq!(evaluate(&rule(3), &world, &obs(p), false), []);
        let mut p = probes(0, 1000, true);
        p.extend(probes(1000, 9500, false));
        p.extend(probes(9500, 12_000, true));
        let found = evaluate(&rule(3), &world, &obs(p), false);
        assert_eq!(kinds(&found), [("dark", false)]);
        assert_eq!(found[0].at, ms(9000));
    }

    fn poll(at: u64, owners: &[Option<&str>]) -> Poll {
        Poll {
            at: ms(at),
            done: ms(at),
            owners: owners
                .iter()
                .map(|o| Some(vec![o.map(str::to_string)]))
                .collect(),
        }
    }

    #[test]
    fn speakers_that_disagree_after_the_settle_time_are_a_violation_counted_once() {
        let faults = [fault(1000, 1000, FaultKind::Pause { node: 1 })];
        let world = World::new(&faults, &executed(&faults), 3);
        let split = [Some("node3"), Some("node2"), Some("node3")];
        let obs = Observations {
            vips: vec![VipObservations::default()],
            // 3 s: only 1 s after the resume; 4.5 s and 5 s: one violation.
            polls: vec![poll(3000, &split), poll(4500, &split), poll(5000, &split)],
            records: Vec::new(),
            horizon: ms(6000),
        };
        let found = evaluate(&rule(3), &world, &obs, true);
        assert_eq!(kinds(&found), [("disagreement", false)]);
        assert_eq!(found[0].at, ms(4500));
    }

    #[test]
    fn a_round_whose_reads_return_after_a_fault_began_is_not_judged() {
        // Quiet from 2 s; node3 stopped at 4.3 s. A round started at 4.2 s whose slowest read
        // (a lossy link) returned at 4.45 s mixes views from before and after the stop.
        let faults = [
            fault(1000, 1000, FaultKind::Pause { node: 1 }),
            fault(4300, 1000, FaultKind::Pause { node: 3 }),
        ];
        let world = World::new(&faults, &executed(&faults), 3);
        let split = [Some("node3"), Some("node2"), Some("node3")];
        let check = |done: u64| {
            let obs = Observations {
                vips: vec![VipObservations::default()],
                polls: vec![Poll {
                    done: ms(done),
                    ..poll(4200, &split)
                }],
                records: Vec::new(),
                horizon: ms(6000),
            };
            kinds(&evaluate(&rule(3), &world, &obs, true))
        };
        assert_eq!(check(4450), []);
        assert_eq!(
            check(4250),
            [("disagreement", false)],
            "all read before the stop"
        );
    }

    #[test]
    fn the_rules_owner_is_not_judged_in_its_start_up_hold() {
        // node3, the rule's owner, killed at 1 s and started again at 2 s; node2 keeps its VIP
        // while node3 holds (Kubernetes seed 1 at 719.5 s on 9bd8cfa: 2.56 s under 20 % loss).
        // No preemption delay (Kubernetes): the quiet alone would judge from 4 s.
        let kubernetes = Rule {
            preempt_delay: Duration::ZERO,
            ..rule(3)
        };
        let faults = [fault(1000, 1000, FaultKind::Kill { node: 3 })];
        let world = World::new(&faults, &executed(&faults), 3);
        let check = |at: u64| {
            let obs = Observations {
                vips: vec![VipObservations::default()],
                polls: vec![poll(at, &[Some("node2"); 3])],
                records: Vec::new(),
                horizon: ms(9000),
            };
            kinds(&evaluate(&kubernetes, &world, &obs, true))
        };
        assert_eq!(check(4500), [], "2.5 s after its start");
        assert_eq!(check(5100), [("misplaced", false)], "3.1 s after its start");
    }

    #[test]
    fn a_speaker_started_in_an_api_outage_abstains_until_it_lists_within_the_grace() {
        // node1 killed at 1 s and started at 2 s while the API server is down (1 s to 3 s):
        // from 3 s it may name nobody for API_LIST_GRACE; naming another owner still counts,
        // and so does naming nobody after the grace.
        let faults = [
            fault(1000, 2000, FaultKind::ApiDown),
            fault(1000, 1000, FaultKind::Kill { node: 1 }),
        ];
        let world = World::new(&faults, &executed(&faults), 3);
        let abstains = [None, Some("node3"), Some("node3")];
        let split = [Some("node2"), Some("node3"), Some("node3")];
        let grace_end = 3000 + API_LIST_GRACE.as_millis() as u64;
        let check = |polls: Vec<Poll>| {
            let obs = Observations {
                vips: vec![VipObservations::default()],
                polls,
                records: Vec::new(),
                horizon: ms(grace_end + 5000),
            };
            kinds(&evaluate(&rule(3), &world, &obs, true))
        };
        assert_eq!(check(vec![poll(5500, &abstains)]), []);
        assert_eq!(check(vec![poll(5500, &split)]), [("disagreement", false)]);
        assert_eq!(
            check(vec![poll(grace_end + 100, &abstains)]),
            [("disagreement", false)]
        );
        // A daemon started with the API server up never had the grace.
        let world = World::new(&faults[1..], &executed(&faults[1..]), 3);
        let obs = Observations {
            vips: vec![VipObservations::default()],
            polls: vec![poll(5500, &abstains)],
            records: Vec::new(),
            horizon: ms(8000),
        };
        assert_eq!(
            kinds(&evaluate(&rule(3), &world, &obs, true)),
            [("disagreement", false)]
        );
    }

    #[test]
    fn an_agreed_owner_other_than_the_rules_is_misplaced_once_settled() {
        let world = World::new(&[], &[], 3);
        let wrong = [Some("node2"); 3];
        let right = [Some("node3"); 3];
        let obs = Observations {
            vips: vec![VipObservations {
                arp: arp(0, 10_000, &[3]),
                ..Default::default()
            }],
            polls: vec![poll(1000, &wrong), poll(4000, &right), poll(5000, &wrong)],
            records: Vec::new(),
            horizon: ms(10_000),
        };
        let found = evaluate(&rule(3), &world, &obs, true);
        assert_eq!(kinds(&found), [("misplaced", false)]);
        assert_eq!(found[0].at, ms(5000));
        // A stopped node's stale view is not a live speaker's.
        let faults = [fault(3000, 20_000, FaultKind::Pause { node: 2 })];
        let world = World::new(&faults, &executed(&faults), 3);
        let obs = Observations {
            vips: vec![VipObservations {
                arp: arp(0, 10_000, &[3]),
                ..Default::default()
            }],
            polls: vec![poll(8000, &[Some("node3"), Some("node2"), Some("node3")])],
            records: Vec::new(),
            horizon: ms(10_000),
        };
        assert_eq!(evaluate(&rule(3), &world, &obs, true), []);
    }

    #[test]
    fn the_speakers_are_not_held_to_the_rule_while_a_step_is_under_way() {
        // The API server down from 1 s; node3's daemon killed at 2 s and started at 3 s, during
        // the outage (it waits for the API server); the API server asked to start at 8 s and
        // ready at 10 s. node3 listed at 9 s, before `/readyz` said ok: the speakers name it
        // while the rule, which counts the outage until 10 s, does not.
        let faults = [
            fault(1000, 7000, FaultKind::ApiDown),
            fault(2000, 1000, FaultKind::Kill { node: 3 }),
        ];
        let mut steps = executed(&faults);
        let undo = steps
            .iter_mut()
            .find(|e| e.fault == 0 && e.step == Step::Undo)
            .expect("the API server's return");
        (undo.at, undo.done) = (ms(10_000), ms(10_000));
        let world = World::new(&faults, &steps, 3);
        let node3 = [Some("node3"); 3];
        let obs = |polls| Observations {
            vips: vec![VipObservations {
                arp: arp(0, 20_000, &[3]),
                ..Default::default()
            }],
            polls,
            records: Vec::new(),
            horizon: ms(20_000),
        };
        let early = obs(vec![poll(7000, &node3), poll(9500, &node3)]);
        let found = evaluate(&rule(3), &world, &early, true);
        assert_eq!(
            kinds(&found),
            [("misplaced", false)],
            "7 s: node3 serves nothing"
        );
        assert_eq!(found[0].at, ms(7000));
        let world = World::new(&faults, &executed(&faults), 3);
        let found = evaluate(&rule(3), &world, &obs(vec![poll(11_500, &node3)]), true);
        assert_eq!(kinds(&found), [], "the API server back at 8 s");
        let world = World::new(&faults, &steps, 3);
        let found = evaluate(&rule(3), &world, &obs(vec![poll(9500, &node3)]), true);
        assert_eq!(kinds(&found), [], "9.5 s: the API server is starting");
    }

    #[test]
    fn a_foreign_mac_answering_once_settled_is_misplaced() {
        let world = World::new(&[], &[], 3);
        let obs = Observations {
            vips: vec![VipObservations {
                arp: arp(0, 10_000, &[1]),
                ..Default::default()
            }],
            polls: vec![poll(5000, &[Some("node3"); 3])],
            records: Vec::new(),
            horizon: ms(10_000),
        };
        let found = evaluate(&rule(3), &world, &obs, true);
        assert_eq!(kinds(&found), [("misplaced", false)]);
        assert!(found[0].detail.contains("node1 answered"), "{found:?}");
    }
}
