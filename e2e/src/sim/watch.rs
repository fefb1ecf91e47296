//! The owner watch beside the gossip: every member's own `WatchCore` on the simulated network,
//! the IPs it owns, and how each takeover ended.

use super::*;

/// How a watch takeover ended, judged when it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakeoverKind {
    /// The accused incarnation no longer runs (crashed, or restarted as a newer one).
    Confirmed,
    /// The accused runs in that incarnation and was not stalled: a false takeover.
    Refuted,
    /// The accused is the member `--slow` / `--pause` stalls, during its stall phase.
    Stalled,
    /// The accused runs, during the partition phase.
    Partitioned,
}

impl TakeoverKind {
    /// A short, stable, lowercase name.
    pub const fn as_str(self) -> &'static str {
        match self {
            TakeoverKind::Confirmed => "confirmed",
            TakeoverKind::Refuted => "refuted",
            TakeoverKind::Stalled => "stalled",
            TakeoverKind::Partitioned => "partitioned",
        }
    }
}

/// One watcher's takeover of an owner it found silent after a failed second check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Takeover {
    /// When.
    pub at: Duration,
    /// Who took over.
    pub watcher: usize,
    /// Whom it accused.
    pub owner: usize,
    /// The accused incarnation.
    pub incarnation: u64,
    /// How it ended.
    pub kind: TakeoverKind,
}

/// How often the simulated daemon looks whether its view changed (to send a new plan).
pub(super) const PLAN_PERIOD: Duration = Duration::from_millis(50);
/// Successor candidates kept per IP, best first.
pub(super) const RANKED: usize = 8;

/// The election's stand-in for the owner watch: each member owns `ips` IPs; the successor of an
/// IP is the member with the lowest hash of (member, IP) among the others the deciding member
/// holds alive (a splitmix64 hash stands in for the election's sha256: the same uniform
/// ranking, much cheaper).
#[derive(Debug)]
pub(super) struct Ranking {
    ips: usize,
    names: Vec<String>,
    /// Per IP (`owner * ips + k`): the other members by hash, the first [`RANKED`].
    ranked: Vec<[u32; RANKED]>,
}

/// splitmix64's finaliser.
pub(super) fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The order key of `member` for IP `ip` (lowest succeeds first).
pub(super) fn rank_key(ip: usize, member: usize) -> u64 {
    mix(mix(ip as u64) ^ member as u64)
}

impl Ranking {
    /// The ranking of `n` members owning `ips` IPs each (at least 1).
    pub(super) fn new(n: usize, ips: usize) -> Ranking {
        let ips = ips.max(1);
        let mut ranked = Vec::with_capacity(n * ips);
        for owner in 0..n {
            for k in 0..ips {
                let ip = owner * ips + k;
                let mut best = [(u64::MAX, u32::MAX); RANKED];
                for member in (0..n).filter(|m| *m != owner) {
                    let key = (rank_key(ip, member), member as u32);
                    if key < best[RANKED - 1] {
                        let at = best.partition_point(|b| *b < key);
                        best.copy_within(at..RANKED - 1, at + 1);
                        best[at] = key;
                    }
                }
                ranked.push(best.map(|(_, m)| m));
            }
        }
        Ranking {
            ips,
            names: (0..n).map(node_name).collect(),
            ranked,
        }
    }

    /// The successor of `owner`'s `k`-th IP in the view `live`: the best-ranked other member
    /// `live` holds.
    pub(super) fn successor(&self, owner: usize, k: usize, live: &LiveSet) -> Option<usize> {
        let ip = owner * self.ips + k;
        let held = |m: usize| m != owner && live.contains(&self.names[m]);
        if let Some(m) = self.ranked[ip]
            .iter()
            .map(|m| *m as usize)
            .find(|m| *m < self.names.len() && held(*m))
        {
            return Some(m);
        }
        (0..self.names.len())
            .filter(|m| held(*m))
            .min_by_key(|m| rank_key(ip, *m))
    }

    /// Whom `owner` heartbeats in the view `live`: the most frequent successors of its IPs
    /// (ties to the lower index), at most [`MAX_WATCHERS`].
    pub(super) fn watchers(&self, owner: usize, live: &LiveSet) -> Vec<usize> {
        let mut counts: BTreeMap<usize, usize> = BTreeMap::new();
        for k in 0..self.ips {
            if let Some(s) = self.successor(owner, k, live) {
                *counts.entry(s).or_default() += 1;
            }
        }
        let mut ranked: Vec<(usize, usize)> = counts.into_iter().collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        ranked
            .into_iter()
            .take(MAX_WATCHERS)
            .map(|(m, _)| m)
            .collect()
    }

    /// Whether `watcher` succeeds `owner` for at least one IP in the view `live`.
    pub(super) fn succeeds(&self, watcher: usize, owner: usize, live: &LiveSet) -> bool {
        (0..self.ips).any(|k| self.successor(owner, k, live) == Some(watcher))
    }
}

/// The index of the member named `name`.
pub(super) fn member_index(name: &str) -> Option<usize> {
    name.strip_prefix("node-")?.parse().ok()
}

/// The watch address of member `i` (its gossip address's port + 1).
pub(super) fn watch_addr_of(i: usize) -> SocketAddr {
    watch_addr(SimNet::addr(i)).unwrap_or_else(|| SimNet::addr(i))
}

/// The member of `n` whose watch listens on `addr`.
pub(super) fn watch_member(addr: SocketAddr, n: usize) -> Option<usize> {
    let first = usize::from(watch_addr_of(0).port());
    let i = usize::from(addr.port()).checked_sub(first)?;
    (i < n && watch_addr_of(i) == addr).then_some(i)
}

/// Where the simulated daemon's hold after a pause stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Hold {
    /// Answering as usual.
    Off,
    /// The watch paused: the next plan holds the answers.
    Paused,
    /// The plan that held them went out: the next one no longer does.
    Resuming,
}

/// One member's owner watch: the speaker's [`WatchCore`], and the daemon's part of it.
#[derive(Debug)]
pub(super) struct Member {
    core: WatchCore,
    /// When its pending wake-up fires.
    wake: Option<Duration>,
    /// The gossip view its directory was taken from ([`Core::members_version`]).
    directory_from: u64,
    /// The view and the incarnation its plan was made from.
    planned_from: Option<(u64, u64)>,
    next_plan: Duration,
    hold: Hold,
}

impl Member {
    /// Give the core the gossip's directory again if the view changed since it last had it.
    fn refresh_directory(&mut self, gossip: &Core) {
        if gossip.members_version() != self.directory_from {
            self.directory_from = gossip.members_version();
            self.core.set_directory(directory_of(gossip));
        }
    }
}

/// The owner watch of every member on the simulation's clock, beside a [`SimNet`]: each member
/// runs the speaker's own [`WatchCore`] (the code the watch thread drives), its datagrams
/// sealed and opened as on the wire, through an event queue of its own with loss and delay
/// drawn as the [`SimNet`]'s are (the same [`Links`], an RNG of its own from the seed), the same
/// partition groups, lag and pauses. The simulation plays the daemon around each core: its plan
/// (the [`MAX_WATCHERS`] most frequent successors of its IPs in its gossip view, by
/// [`Ranking`]), its directory (its gossip core's members), a takeover with a claim to every
/// member when the watch reports an owner silent that its gossip still holds in that
/// incarnation and that it succeeds for at least one IP, a refutation when claimed itself, and
/// after a pause a plan that holds the answers, then one that no longer does (the daemon waits
/// until it heard the cluster again; this is a simplification).
#[derive(Debug)]
pub struct OwnerWatches {
    knobs: Knobs,
    ranking: Ranking,
    nodes: Vec<Option<Member>>,
    sent: Vec<u64>,
    events: Timeline<SimEvent>,
    rng: StdRng,
    seed: u64,
    takeovers: Vec<Takeover>,
    /// Claims and refutations the cores queued for the gossip: (member, payload).
    relays: Vec<(usize, Vec<u8>)>,
    /// Members the cores heard alive, for their gossip: (member, gossip address, bump).
    heard: Vec<(usize, SocketAddr, u64)>,
    /// The member stalled now, whose takeovers are [`TakeoverKind::Stalled`].
    pub(super) stalled: Option<usize>,
    /// During the partition phase: takeovers of running members are
    /// [`TakeoverKind::Partitioned`].
    pub(super) partitioned: bool,
}

/// The identities of `core`'s members, for its watch.
pub(super) fn directory_of(core: &Core) -> Directory {
    Arc::new(
        core.member_identities()
            .map(|id| (id.node.to_string(), id.clone()))
            .collect(),
    )
}

impl OwnerWatches {
    /// The watch of `n` members (none running yet), each owning `opts.ips_per_member` IPs.
    pub fn new(n: usize, opts: &WatchOptions, seed: u64) -> OwnerWatches {
        OwnerWatches {
            knobs: opts.knobs,
            ranking: Ranking::new(n, opts.ips_per_member),
            nodes: (0..n).map(|_| None).collect(),
            sent: vec![0; n],
            events: Timeline::default(),
            rng: StdRng::seed_from_u64(seed ^ 0x77a7_c4e5),
            seed,
            takeovers: Vec::new(),
            relays: Vec::new(),
            heard: Vec::new(),
            stalled: None,
            partitioned: false,
        }
    }

    /// Every takeover so far, in order.
    pub fn takeovers(&self) -> &[Takeover] {
        &self.takeovers
    }

    /// Watch datagrams member `i` sent so far.
    pub fn sent(&self, i: usize) -> u64 {
        self.sent.get(i).copied().unwrap_or(0)
    }

    /// When the next event is due.
    pub(super) fn next_at(&self) -> Option<Duration> {
        self.events.next_at()
    }

    /// Starts member `i`'s watch (its core runs in `net`), its first wake-up now.
    pub(super) fn start(&mut self, net: &SimNet, i: usize) -> anyhow::Result<()> {
        let Some(gossip) = net.core(i) else {
            return Ok(());
        };
        let me = gossip.identity().clone();
        let seed = mix(self.seed ^ ((i as u64) << 32) ^ me.bump);
        let plan = Plan {
            me,
            watchers: Vec::new(),
            held: false,
            accused: BTreeMap::new(),
        };
        let core = WatchCore::new(
            self.knobs,
            KeyRing::new("swimlb-sim-watch", &[KEY])?,
            watch_addr_of(i),
            plan,
            directory_of(gossip),
            WatchMetrics::default(),
            seed,
            net.now(),
        )?;
        self.nodes[i] = Some(Member {
            core,
            wake: None,
            directory_from: gossip.members_version(),
            planned_from: None,
            next_plan: net.now(),
            hold: Hold::Off,
        });
        self.reschedule(net, i);
        Ok(())
    }

    /// Stops member `i`'s watch at once.
    pub(super) fn crash(&mut self, i: usize) {
        self.nodes[i] = None;
    }

    fn push(&mut self, at: Duration, kind: SimEvent) {
        self.events.push(at, kind);
    }

    /// Sends `bytes` from member `from` to the watch at `to` through the lossy links.
    fn send(&mut self, net: &SimNet, from: usize, to: SocketAddr, bytes: Vec<u8>) {
        self.sent[from] += 1;
        let Some(to) = watch_member(to, self.nodes.len()) else {
            return;
        };
        let links = net.links();
        if links.loss > 0.0 && self.rng.random_bool(links.loss.clamp(0.0, 1.0)) {
            return;
        }
        if net.group(from) != net.group(to) {
            return;
        }
        let span = links.delay_max.saturating_sub(links.delay_min);
        let jitter = if span.is_zero() {
            Duration::ZERO
        } else {
            span.mul_f64(self.rng.random::<f64>())
        };
        let at = net.now() + links.delay_min + jitter + net.lag(to);
        let from = watch_addr_of(from);
        self.push(at, SimEvent::Deliver { to, from, bytes });
    }

    /// Sets member `i`'s next wake-up: its core's next deadline, or the next look at the plan.
    fn reschedule(&mut self, net: &SimNet, i: usize) {
        let now = net.now();
        let Some(member) = self.nodes[i].as_mut() else {
            return;
        };
        let planned = member
            .core
            .next_deadline()
            .map_or(member.next_plan, |at| at.min(member.next_plan))
            .max(now);
        let fire = planned + net.lag(i);
        if member.wake != Some(fire) {
            member.wake = Some(fire);
            self.push(fire, SimEvent::Wake { node: i });
        }
    }

    /// Handles the next event (due at [`SimNet::now`]).
    pub(super) fn step(&mut self, net: &SimNet) {
        let Some((at, event)) = self.events.pop_due(Duration::MAX) else {
            return;
        };
        let i = event.node();
        let Some(member) = self.nodes[i].as_mut() else {
            return;
        };
        let wake = matches!(event, SimEvent::Wake { .. });
        if wake && member.wake != Some(at) {
            return;
        }
        if let Some(until) = net.paused_until(i) {
            if wake {
                member.wake = Some(until);
            }
            self.push(until, event);
            return;
        }
        let Some(gossip) = net.core(i) else {
            return;
        };
        let now = net.now();
        member.refresh_directory(gossip);
        match event {
            SimEvent::Deliver {
                from, mut bytes, ..
            } => {
                member.core.handle_datagram(now, from, &mut bytes);
            }
            SimEvent::Wake { .. } => {
                member.wake = None;
                let plan_due = now >= member.next_plan;
                if plan_due {
                    member.next_plan = now + PLAN_PERIOD;
                    self.replan(now, gossip, i);
                }
                if let Some(member) = self.nodes[i].as_mut() {
                    member.core.tick(now);
                }
            }
        }
        self.flush(net, i);
        self.reschedule(net, i);
    }

    /// Takes the claims and refutations to send through the gossip: (member, payload).
    pub(super) fn take_relays(&mut self) -> Vec<(usize, Vec<u8>)> {
        std::mem::take(&mut self.relays)
    }

    /// Takes the members the cores heard alive: (member, gossip address, bump).
    pub(super) fn take_heard(&mut self) -> Vec<(usize, SocketAddr, u64)> {
        std::mem::take(&mut self.heard)
    }

    /// A claim or a refutation that reached member `i` through the gossip, from the member at
    /// gossip address `from`, at `at`.
    pub(super) fn relayed(
        &mut self,
        net: &SimNet,
        i: usize,
        at: Duration,
        from: SocketAddr,
        payload: &[u8],
    ) {
        let Some(member) = self.nodes[i].as_mut() else {
            return;
        };
        if let Some(gossip) = net.core(i) {
            member.refresh_directory(gossip);
        }
        member.core.handle_relayed(at, from, payload);
        self.flush(net, i);
        self.reschedule(net, i);
    }

    /// The simulated daemon's plan for member `i`, sent when its view, its incarnation or its
    /// hold changed.
    fn replan(&mut self, now: Duration, gossip: &Core, i: usize) {
        let from = (gossip.members_version(), gossip.identity().bump);
        let watchers = {
            let Some(member) = self.nodes[i].as_ref() else {
                return;
            };
            if member.planned_from == Some(from) && member.hold == Hold::Off {
                return;
            }
            self.ranking.watchers(i, gossip.live())
        };
        let Some(member) = self.nodes[i].as_mut() else {
            return;
        };
        let held = member.hold == Hold::Paused;
        member.hold = match member.hold {
            Hold::Paused => Hold::Resuming,
            Hold::Resuming | Hold::Off => Hold::Off,
        };
        member.planned_from = Some(from);
        let plan = Plan {
            me: gossip.identity().clone(),
            watchers: watchers.into_iter().map(node_name).collect(),
            held,
            accused: BTreeMap::new(),
        };
        member.core.command(now, Command::Plan(plan));
    }

    /// Sends what member `i`'s core queued and plays the daemon on its events (which may queue
    /// more: a claim, a refutation).
    fn flush(&mut self, net: &SimNet, i: usize) {
        loop {
            let Some(member) = self.nodes[i].as_mut() else {
                return;
            };
            let out: Vec<Outgoing> = member.core.drain_outgoing().collect();
            let events: Vec<Event> = member.core.drain_events().collect();
            let relays = member.core.drain_relays().map(|payload| (i, payload));
            self.relays.extend(relays);
            let heard = member
                .core
                .drain_heard()
                .map(|(addr, bump)| (i, addr, bump));
            self.heard.extend(heard);
            if out.is_empty() && events.is_empty() {
                return;
            }
            for datagram in out {
                self.send(net, i, datagram.to, datagram.bytes);
            }
            for event in events {
                self.event(net, i, event);
            }
        }
    }

    /// The simulated daemon's part on `event` of member `i`'s watch.
    fn event(&mut self, net: &SimNet, i: usize, event: Event) {
        let Some(gossip) = net.core(i) else {
            return;
        };
        let Some(member) = self.nodes[i].as_mut() else {
            return;
        };
        match event {
            Event::Silent { owner, silent_for } => self.silent(net, i, owner, silent_for),
            Event::Claimed {
                accused,
                incarnation,
                ..
            } => {
                let me = gossip.identity();
                if accused == me.node.as_str() && incarnation == me.bump {
                    member.core.command(net.now(), Command::Refute);
                }
            }
            // The simulation does not elect, so it accuses no one, has nothing to refute and
            // serves no API moves.
            Event::Alive { .. } | Event::Moved { .. } => {}
            Event::Paused { .. } => member.hold = Hold::Paused,
        }
    }

    /// Member `i`'s watch found `owner` silent: the daemon's conditions for a takeover, the
    /// takeover judged, and its claim.
    fn silent(&mut self, net: &SimNet, i: usize, owner: NodeIdentity, silent_for: Duration) {
        let now = net.now();
        let (Some(gossip), Some(o)) = (net.core(i), member_index(&owner.node)) else {
            return;
        };
        let held = gossip
            .member_identities()
            .any(|id| id.node == owner.node && id.bump == owner.bump);
        if !held || !self.ranking.succeeds(i, o, gossip.live()) {
            return;
        }
        let incarnation = owner.bump;
        let kind = match net.core(o) {
            None => TakeoverKind::Confirmed,
            Some(c) if c.identity().bump != incarnation => TakeoverKind::Confirmed,
            Some(_) if self.stalled == Some(o) => TakeoverKind::Stalled,
            Some(_) if self.partitioned => TakeoverKind::Partitioned,
            Some(_) => TakeoverKind::Refuted,
        };
        if kind == TakeoverKind::Refuted && std::env::var_os("SIM_DEBUG").is_some() {
            let owner_side = self.nodes[o].as_ref().map(|m| {
                let watchers: Vec<&String> = m.core.watchers().collect();
                (m.core.paused(), watchers)
            });
            eprintln!(
                "t={now:?} refuted takeover: node {i} of node {o} (incarnation {incarnation}), \
                 last heartbeat {silent_for:?} before; owner (paused, watchers): {owner_side:?}"
            );
        }
        self.takeovers.push(Takeover {
            at: now,
            watcher: i,
            owner: o,
            incarnation,
            kind,
        });
        let ip = IpAddr::V4(Ipv4Addr::from(
            0x0a00_0000 | u32::try_from(o * self.ranking.ips).unwrap_or(0),
        ));
        if let Some(member) = self.nodes[i].as_mut() {
            member
                .core
                .command(now, Command::Claim { ip, accused: owner });
        }
    }
}
