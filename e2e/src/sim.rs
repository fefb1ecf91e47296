//! `swimlb-lab sim`: the membership simulation. N real gossip cores
//! ([`swimlb_speaker::gossip::Core`]) on the deterministic simulated network
//! ([`swimlb_speaker::gossip::simnet::SimNet`]): virtual clock, seeded RNG, uniform loss, random
//! delay. No sockets, no tokio, no wall clock in the protocol.
//!
//! A run: all nodes start and join through three seeds (warm-up, until every node sees every
//! node or 30 s pass). Then members crash one after another: crash, wait until every survivor
//! that knew the member has marked it down (or a cap), restart it under a new identity, let it
//! rejoin, next. Detection time runs from the crash to the last survivor's `MemberDown`. A false
//! down is a `MemberDown` of any member that was not crashed. Traffic counts datagrams and
//! sealed bytes sent per member per second after the warm-up.
//!
//! After the crashes (and after the traffic was counted), `--slow MS` and `--pause MS` stall one
//! member ([`STALLS`] times): slow, it handles its datagrams and timers MS late for 10 s; paused,
//! it handles nothing for MS. Each stall is followed by up to 10 s of recovery. The report counts
//! the downs of the *other* members (a stalled member must not accuse healthy ones) and how long
//! after each stall every member held the stalled one alive and it held every member.
//!
//! Beside the gossip runs the owner watch ([`OwnerWatches`], unless `--watch false`): every
//! member runs the speaker's own `WatchCore` (the code the watch thread drives, sealed datagrams
//! included), owns `--ips-per-member` IPs (10 by default) and heartbeats the successors of its
//! IPs, on the same clock, loss, delay, partitions, lag and pauses as the gossip. A watcher's takeover of a
//! member that runs in the accused incarnation and is not stalled is a refuted (false)
//! takeover; of a crashed one, confirmed; of the `--slow` / `--pause` member during its stalls,
//! counted apart (`stalled_takeovers`). The watch's datagrams count in the traffic.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use swimlb_proto::KeyRing;
use swimlb_speaker::gossip::simnet::{Links, SimNet, Traffic};
use swimlb_speaker::gossip::{
    Core, Directory, GossipMetrics, GossipSettings, NodeIdentity, Outgoing, Profile,
    SuspicionOutcome, Timing,
};
use swimlb_speaker::model::membership::{LiveChange, LiveSet, MemberMeta};
use swimlb_speaker::model::watch_knobs::Knobs;
use swimlb_speaker::owner_watch::core::{MAX_WATCHERS, watch_addr};
use swimlb_speaker::owner_watch::{Command, Event, Plan, WatchCore, WatchMetrics};

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// Cluster size (at least 3).
    pub nodes: usize,
    /// Uniform datagram loss in percent.
    pub loss_pct: f64,
    /// Simulated seconds, warm-up included.
    pub duration: Duration,
    /// Timing profile.
    pub profile: Profile,
    /// Timings (the profile's, possibly overridden).
    pub timing: Timing,
    /// RNG seed.
    pub seed: u64,
    /// After the crashes: cut a third of the members off for this long, then heal.
    pub partition: Option<Duration>,
    /// After the crashes: one member handles everything this much late, 10 s at a time.
    pub slow: Option<Duration>,
    /// After the crashes: one member stops entirely for this long, then resumes.
    pub pause: Option<Duration>,
    /// The owner watch beside the gossip (`None`: the gossip alone).
    pub watch: Option<WatchOptions>,
}

/// The owner watch in the simulation (see [`OwnerWatches`]).
#[derive(Debug, Clone, Copy)]
pub struct WatchOptions {
    /// IPs each member owns (at least 1).
    pub ips_per_member: usize,
    /// Interval and misses.
    pub knobs: Knobs,
}

impl Default for WatchOptions {
    fn default() -> WatchOptions {
        WatchOptions {
            ips_per_member: 10,
            knobs: Knobs::default(),
        }
    }
}

/// Percentiles of the detection time, in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Quantiles {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest sample.
    pub max: f64,
}

/// The result of one run (the JSON `sim --json` writes).
#[derive(Debug, Clone, Serialize)]
pub struct SimReport {
    /// Cluster size.
    pub nodes: usize,
    /// Loss in percent.
    pub loss: f64,
    /// Profile name.
    pub profile: &'static str,
    /// Crash-to-last-survivor detection time.
    pub detection_ms: Quantiles,
    /// MemberDown of members that were not crashed, summed over all observers.
    pub false_downs: u64,
    /// Datagrams sent per member per second after warm-up, the gossip's and the owner watch's.
    pub packets_per_member_per_s: f64,
    /// Sealed bytes of the gossip sent per member per second after warm-up (the watch's are
    /// not modelled as bytes).
    pub bytes_per_member_per_s: f64,
    /// Crashes measured.
    pub crashes: usize,
    /// Crashes not seen by every survivor within the cap (counted at the cap in the quantiles).
    pub undetected: usize,
    /// Simulated seconds until every node saw every node (or the warm-up's 30 s cap).
    pub warmup_s: f64,
    /// Whether every node saw every node by the end of the warm-up.
    pub converged: bool,
    /// Simulated seconds.
    pub duration_s: f64,
    /// RNG seed.
    pub seed: u64,
    /// How the suspicions the members timed ended (Lifeguard), summed over the members running
    /// at the end (a crashed member's counts go with it).
    pub suspicions: SuspicionCounts,
    /// Whether the owner watch ran beside the gossip.
    pub watch: bool,
    /// IPs each member owned (0 without the watch).
    pub ips_per_member: usize,
    /// Watch takeovers of a member that was running in the accused incarnation and not
    /// stalled, outside the partition phase: false takeovers, each refuted by the accused.
    pub refuted_takeovers: u64,
    /// Watch takeovers of a crashed member (of an incarnation that no longer runs).
    pub confirmed_takeovers: u64,
    /// From a crash to the first watcher's takeover of the crashed member.
    pub watch_detect_ms: Quantiles,
    /// Crashes no watcher took over before every survivor's gossip had (not in
    /// `watch_detect_ms`).
    pub watch_undetected: usize,
    /// Owner watch datagrams (heartbeats, acknowledgements, polls, relays, replies) sent per
    /// member per second after warm-up; `packets_per_member_per_s` includes them.
    pub watch_packets_per_member_per_s: f64,
    /// The partition phase, when one was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<PartitionReport>,
    /// The slow-member phase, when one was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slow: Option<StallReport>,
    /// The paused-member phase, when one was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pause: Option<StallReport>,
}

/// Suspicions by how they ended (`swimlb_gossip_suspicions_total{outcome}`).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct SuspicionCounts {
    /// The suspect refuted.
    pub refuted: u64,
    /// Declared down with at least one independent confirmation.
    pub confirmed: u64,
    /// Declared down by a lone observer's timeout.
    pub expired: u64,
}

/// What stalling one member did (`sim --slow MS`, `sim --pause MS`).
#[derive(Debug, Clone, Serialize)]
pub struct StallReport {
    /// The stalled member's index.
    pub member: usize,
    /// The lag (slow) or the pause, in milliseconds.
    pub stall_ms: f64,
    /// How long each stall lasted, in milliseconds (10 s when slow, the pause when paused).
    pub window_ms: f64,
    /// Stalls run.
    pub stalls: usize,
    /// `MemberDown` of any member other than the stalled one, summed over observers (the
    /// stalled one's own observations included): the false downs a stall must not cause.
    pub false_downs_of_others: u64,
    /// `MemberDown` of the stalled member, summed over observers.
    pub downs_of_stalled: u64,
    /// Per stall, from its end until every member held the stalled one alive and it held every
    /// member (a stall not recovered within 10 s counts 10 s).
    pub recover_ms: Quantiles,
    /// Stalls not recovered within 10 s.
    pub unrecovered: usize,
    /// The stalled member's highest local health score seen (sampled every 100 ms).
    pub max_health: i64,
    /// Watch takeovers of the stalled member during the stalls and their recoveries, summed
    /// over watchers (not counted as refuted: a stalled owner is silent).
    pub stalled_takeovers: u64,
}

/// Stalls per `--slow` / `--pause` phase.
pub const STALLS: usize = 3;
/// How long a slow member stays slow each time.
const SLOW_WINDOW: Duration = Duration::from_secs(10);
/// The longest wait for a recovery after a stall.
const RECOVERY_CAP: Duration = Duration::from_secs(10);

/// What a partition and its heal did (`sim --partition SECONDS`).
#[derive(Debug, Clone, Serialize)]
pub struct PartitionReport {
    /// Members cut off (every third member, seed 2 among them, so each side keeps a seed).
    pub cut_off: usize,
    /// Simulated seconds the cut lasted.
    pub cut_s: f64,
    /// Whether every member saw every member again within 60 s of the heal.
    pub healed: bool,
    /// From the heal until every member saw every member.
    pub heal_ms: f64,
    /// `MemberDown` events after the heal seen by members of the larger side, summed over
    /// observers: the flapping a heal must not cause (a down there moves that member's IPs).
    pub downs_after_heal: u64,
    /// `MemberDown` events after the heal seen by the members that were cut off. A cut-off
    /// member rejoins under a renewed identity and then learns that the old identities of its
    /// side are down, so some are expected; they move nothing, because a renewed member is
    /// unsettled.
    pub cut_off_downs_after_heal: u64,
    /// Watch takeovers of running members from the cut until 5 s after everyone saw everyone
    /// (across the cut, mostly; not counted as refuted).
    pub takeovers: u64,
}

const KEY: [u8; 32] = [7; 32];
const SEEDS: usize = 3;
const STEP: Duration = Duration::from_millis(5);

fn node_name(i: usize) -> String {
    format!("node-{i:04}")
}

fn new_core(opts: &SimOptions, i: usize, bump: u64, now: Duration) -> anyhow::Result<Core> {
    let settings = GossipSettings {
        node: node_name(i),
        addr: SimNet::addr(i),
        seeds: (0..SEEDS).map(SimNet::addr).collect(),
        timing: opts.timing.clone(),
        bump,
        rng_seed: opts
            .seed
            .wrapping_mul(1_000_003)
            .wrapping_add((i as u64) << 20)
            .wrapping_add(bump),
    };
    let ring = KeyRing::new("swimlb-sim", &[KEY])?;
    Ok(Core::new(
        settings,
        ring,
        MemberMeta::new(node_name(i)),
        GossipMetrics::default(),
        now,
    )?)
}

impl Quantiles {
    /// The median, 99th percentile and largest of `sorted` (zeros when it is empty).
    fn of(sorted: &[f64]) -> Quantiles {
        Quantiles {
            p50: quantile(sorted, 0.5),
            p99: quantile(sorted, 0.99),
            max: sorted.last().copied().unwrap_or(0.0),
        }
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

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
const PLAN_PERIOD: Duration = Duration::from_millis(50);
/// Successor candidates kept per IP, best first.
const RANKED: usize = 8;

/// The election's stand-in for the owner watch: each member owns `ips` IPs; the successor of an
/// IP is the member with the lowest hash of (member, IP) among the others the deciding member
/// holds alive (a splitmix64 hash stands in for the election's sha256: the same uniform
/// ranking, much cheaper).
#[derive(Debug)]
struct Ranking {
    ips: usize,
    names: Vec<String>,
    /// Per IP (`owner * ips + k`): the other members by hash, the first [`RANKED`].
    ranked: Vec<[u32; RANKED]>,
}

/// splitmix64's finaliser.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The order key of `member` for IP `ip` (lowest succeeds first).
fn rank_key(ip: usize, member: usize) -> u64 {
    mix(mix(ip as u64) ^ member as u64)
}

impl Ranking {
    /// The ranking of `n` members owning `ips` IPs each (at least 1).
    fn new(n: usize, ips: usize) -> Ranking {
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
    fn successor(&self, owner: usize, k: usize, live: &LiveSet) -> Option<usize> {
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
    fn watchers(&self, owner: usize, live: &LiveSet) -> Vec<usize> {
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
    fn succeeds(&self, watcher: usize, owner: usize, live: &LiveSet) -> bool {
        (0..self.ips).any(|k| self.successor(owner, k, live) == Some(watcher))
    }
}

/// The index of the member named `name`.
fn member_index(name: &str) -> Option<usize> {
    name.strip_prefix("node-")?.parse().ok()
}

/// The watch address of member `i` (its gossip address's port + 1).
fn watch_addr_of(i: usize) -> SocketAddr {
    watch_addr(SimNet::addr(i)).unwrap_or_else(|| SimNet::addr(i))
}

/// The member of `n` whose watch listens on `addr`.
fn watch_member(addr: SocketAddr, n: usize) -> Option<usize> {
    let first = usize::from(watch_addr_of(0).port());
    let i = usize::from(addr.port()).checked_sub(first)?;
    (i < n && watch_addr_of(i) == addr).then_some(i)
}

#[derive(Debug)]
enum WatchEventKind {
    Deliver {
        to: usize,
        from: SocketAddr,
        bytes: Vec<u8>,
    },
    Wake {
        node: usize,
    },
}

#[derive(Debug)]
struct WatchEvent {
    at: Duration,
    seq: u64,
    kind: WatchEventKind,
}

impl PartialEq for WatchEvent {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at && self.seq == other.seq
    }
}
impl Eq for WatchEvent {}
impl PartialOrd for WatchEvent {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for WatchEvent {
    fn cmp(&self, other: &Self) -> Ordering {
        other.at.cmp(&self.at).then(other.seq.cmp(&self.seq))
    }
}

/// Where the simulated daemon's hold after a pause stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// Answering as usual.
    Off,
    /// The watch paused: the next plan answers nothing.
    Paused,
    /// The plan that answered nothing went out: the next one answers again.
    Resuming,
}

/// One member's owner watch: the speaker's [`WatchCore`], and the daemon's part of it.
#[derive(Debug)]
struct Member {
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

/// The owner watch of every member on the simulation's clock, beside a [`SimNet`]: each member
/// runs the speaker's own [`WatchCore`] (the code the watch thread drives), its datagrams
/// sealed and opened as on the wire, through an event queue of its own with loss and delay
/// drawn as the [`SimNet`]'s are (the same [`Links`], an RNG of its own from the seed), the same
/// partition groups, lag and pauses. The simulation plays the daemon around each core: its plan
/// (the [`MAX_WATCHERS`] most frequent successors of its IPs in its gossip view, by
/// [`Ranking`]), its directory (its gossip core's members), a takeover with a claim to every
/// member when the watch reports an owner silent that its gossip still holds in that
/// incarnation and that it succeeds for at least one IP, a refutation when claimed itself, and
/// after a pause a plan that answers nothing, then one that answers again (the daemon waits
/// until it heard the cluster again; this is a simplification).
#[derive(Debug)]
pub struct OwnerWatches {
    knobs: Knobs,
    ranking: Ranking,
    nodes: Vec<Option<Member>>,
    sent: Vec<u64>,
    events: BinaryHeap<WatchEvent>,
    seq: u64,
    rng: StdRng,
    seed: u64,
    takeovers: Vec<Takeover>,
    /// The member stalled now, whose takeovers are [`TakeoverKind::Stalled`].
    stalled: Option<usize>,
    /// During the partition phase: takeovers of running members are
    /// [`TakeoverKind::Partitioned`].
    partitioned: bool,
}

/// The identities of `core`'s members, for its watch.
fn directory_of(core: &Core) -> Directory {
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
            events: BinaryHeap::new(),
            seq: 0,
            rng: StdRng::seed_from_u64(seed ^ 0x77a7_c4e5),
            seed,
            takeovers: Vec::new(),
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
    fn next_at(&self) -> Option<Duration> {
        self.events.peek().map(|e| e.at)
    }

    /// Starts member `i`'s watch (its core runs in `net`), its first wake-up now.
    fn start(&mut self, net: &SimNet, i: usize) -> anyhow::Result<()> {
        let Some(gossip) = net.core(i) else {
            return Ok(());
        };
        let me = gossip.identity().clone();
        let seed = mix(self.seed ^ ((i as u64) << 32) ^ me.bump);
        let plan = Plan {
            me,
            watchers: Vec::new(),
            answering: true,
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
    fn crash(&mut self, i: usize) {
        self.nodes[i] = None;
    }

    fn push(&mut self, at: Duration, kind: WatchEventKind) {
        self.seq += 1;
        self.events.push(WatchEvent {
            at,
            seq: self.seq,
            kind,
        });
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
        self.push(at, WatchEventKind::Deliver { to, from, bytes });
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
            self.push(fire, WatchEventKind::Wake { node: i });
        }
    }

    /// Handles the next event (due at [`SimNet::now`]).
    fn step(&mut self, net: &SimNet) {
        let Some(event) = self.events.pop() else {
            return;
        };
        let i = match event.kind {
            WatchEventKind::Deliver { to, .. } => to,
            WatchEventKind::Wake { node } => node,
        };
        let Some(member) = self.nodes[i].as_mut() else {
            return;
        };
        let wake = matches!(event.kind, WatchEventKind::Wake { .. });
        if wake && member.wake != Some(event.at) {
            return;
        }
        if let Some(until) = net.paused_until(i) {
            if wake {
                member.wake = Some(until);
            }
            self.push(until, event.kind);
            return;
        }
        let Some(gossip) = net.core(i) else {
            return;
        };
        let now = net.now();
        if gossip.members_version() != member.directory_from {
            member.directory_from = gossip.members_version();
            member.core.set_directory(directory_of(gossip));
        }
        match event.kind {
            WatchEventKind::Deliver {
                from, mut bytes, ..
            } => {
                member.core.handle_datagram(now, from, &mut bytes);
            }
            WatchEventKind::Wake { .. } => {
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
        let answering = member.hold != Hold::Paused;
        member.hold = match member.hold {
            Hold::Paused => Hold::Resuming,
            Hold::Resuming | Hold::Off => Hold::Off,
        };
        member.planned_from = Some(from);
        let plan = Plan {
            me: gossip.identity().clone(),
            watchers: watchers.into_iter().map(node_name).collect(),
            answering,
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
            // The simulation does not elect, so it accuses no one and has nothing to refute.
            Event::Alive { .. } => {}
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

/// The gossip's [`SimNet`] and, unless switched off, the [`OwnerWatches`] beside it, run on one
/// clock: every watch event runs after the gossip events due at the same time or earlier.
#[derive(Debug)]
pub struct Cluster {
    net: SimNet,
    watch: Option<OwnerWatches>,
}

impl Cluster {
    /// `net`, with `watch` beside it.
    pub fn new(net: SimNet, watch: Option<OwnerWatches>) -> Cluster {
        Cluster { net, watch }
    }

    /// The virtual time.
    pub fn now(&self) -> Duration {
        self.net.now()
    }

    /// Node `i`'s core, if it runs.
    pub fn core(&self, i: usize) -> Option<&Core> {
        self.net.core(i)
    }

    /// The gossip datagrams node `i` sent so far.
    pub fn traffic(&self, i: usize) -> Traffic {
        self.net.traffic(i)
    }

    /// The watch, when it runs.
    pub fn watch(&self) -> Option<&OwnerWatches> {
        self.watch.as_ref()
    }

    /// Starts (or restarts) node `i` with `core`, and its watch.
    pub fn start(&mut self, i: usize, core: Core) -> anyhow::Result<()> {
        self.net.start(i, core);
        if let Some(watch) = &mut self.watch {
            watch.start(&self.net, i)?;
        }
        Ok(())
    }

    /// Crashes node `i` and its watch.
    pub fn crash(&mut self, i: usize) {
        self.net.crash(i);
        if let Some(watch) = &mut self.watch {
            watch.crash(i);
        }
    }

    /// [`SimNet::set_lag`]: the watch lags too.
    pub fn set_lag(&mut self, i: usize, lag: Duration) {
        self.net.set_lag(i, lag);
    }

    /// [`SimNet::pause`]: the watch pauses too.
    pub fn pause(&mut self, i: usize, until: Duration) {
        self.net.pause(i, until);
    }

    /// [`SimNet::set_group`]: the watch's datagrams cross only within a group too.
    pub fn set_group(&mut self, i: usize, group: u32) {
        self.net.set_group(i, group);
    }

    /// [`SimNet::heal`].
    pub fn heal(&mut self) {
        self.net.heal();
    }

    /// [`SimNet::drain_changes`].
    pub fn drain_changes(&mut self) -> std::vec::Drain<'_, (Duration, usize, LiveChange)> {
        self.net.drain_changes()
    }

    /// Marks `member` as the stalled one (its takeovers are [`TakeoverKind::Stalled`]).
    fn set_stalled(&mut self, member: Option<usize>) {
        if let Some(watch) = &mut self.watch {
            watch.stalled = member;
        }
    }

    /// Marks the partition phase (takeovers of running members are
    /// [`TakeoverKind::Partitioned`]).
    fn set_partitioned(&mut self, on: bool) {
        if let Some(watch) = &mut self.watch {
            watch.partitioned = on;
        }
    }

    /// Takeovers so far (none without the watch).
    pub fn takeovers(&self) -> &[Takeover] {
        self.watch.as_ref().map_or(&[], OwnerWatches::takeovers)
    }

    /// Runs both up to `until`.
    pub fn run_until(&mut self, until: Duration) {
        let Some(watch) = &mut self.watch else {
            self.net.run_until(until);
            return;
        };
        while let Some(at) = watch.next_at().filter(|at| *at <= until) {
            self.net.run_until(at);
            watch.step(&self.net);
        }
        self.net.run_until(until);
    }

    /// Runs both for `span`.
    pub fn run_for(&mut self, span: Duration) {
        let until = self.now() + span;
        self.run_until(until);
    }
}

/// Runs one simulation.
pub fn run(opts: &SimOptions) -> anyhow::Result<SimReport> {
    validate(opts)?;
    let n = opts.nodes;
    let end = opts.duration;
    let links = Links {
        loss: opts.loss_pct / 100.0,
        ..Links::default()
    };
    let watch = opts.watch.map(|w| OwnerWatches::new(n, &w, opts.seed));
    let mut net = Cluster::new(SimNet::new(opts.seed, links), watch);
    let mut bumps = vec![1u64; n];
    for (i, bump) in bumps.iter().enumerate() {
        let core = new_core(opts, i, *bump, net.now())?;
        net.start(i, core)?;
    }
    let (converged, warmup_downs) = warm_up(&mut net, n, end);
    let warmup = net.now();
    let traffic_start: Vec<_> = (0..n).map(|i| net.traffic(i)).collect();
    let watch_start: u64 = (0..n).map(|i| net.watch().map_or(0, |w| w.sent(i))).sum();
    let mut crashes = crash_each_in_turn(&mut net, opts, &mut bumps)?;
    // Whatever time is left: steady state.
    while net.now() < end {
        net.run_for(Duration::from_millis(100));
        crashes.false_downs += count_downs(&mut net);
    }

    let measured = (net.now() - warmup).as_secs_f64().max(1e-9);
    // Traffic of the crash phase only: the partition and stall phases come after.
    let (mut packets, mut bytes) = (0u64, 0u64);
    for (i, start) in traffic_start.iter().enumerate() {
        let t = net.traffic(i);
        packets += t.packets - start.packets;
        bytes += t.bytes - start.bytes;
    }
    let watch_packets = (0..n)
        .map(|i| net.watch().map_or(0, |w| w.sent(i)))
        .sum::<u64>()
        - watch_start;
    let partition = opts
        .partition
        .map(|cut| partition_and_heal(&mut net, n, cut));
    let stalled = n / 2;
    let slow = opts
        .slow
        .map(|lag| stall(&mut net, n, stalled, Stall::Slow(lag)));
    let pause = opts
        .pause
        .map(|pause| stall(&mut net, n, stalled, Stall::Pause(pause)));
    let CrashPhase {
        mut samples_ms,
        undetected,
        mut watch_samples_ms,
        watch_undetected,
        false_downs,
    } = crashes;
    samples_ms.sort_by(f64::total_cmp);
    watch_samples_ms.sort_by(f64::total_cmp);
    let takeovers_of = |kind| net.takeovers().iter().filter(|t| t.kind == kind).count() as u64;
    let (refuted_takeovers, confirmed_takeovers) = (
        takeovers_of(TakeoverKind::Refuted),
        takeovers_of(TakeoverKind::Confirmed),
    );
    let mut suspicions = SuspicionCounts::default();
    for core in (0..n).filter_map(|i| net.core(i)) {
        let m = core.metrics();
        suspicions.refuted += m.suspicions_ended(SuspicionOutcome::Refuted);
        suspicions.confirmed += m.suspicions_ended(SuspicionOutcome::Confirmed);
        suspicions.expired += m.suspicions_ended(SuspicionOutcome::Expired);
    }
    Ok(SimReport {
        nodes: n,
        loss: opts.loss_pct,
        profile: opts.profile.as_str(),
        detection_ms: Quantiles::of(&samples_ms),
        false_downs: warmup_downs + false_downs,
        packets_per_member_per_s: (packets + watch_packets) as f64 / n as f64 / measured,
        bytes_per_member_per_s: bytes as f64 / n as f64 / measured,
        crashes: samples_ms.len(),
        undetected,
        warmup_s: warmup.as_secs_f64(),
        converged,
        duration_s: measured + warmup.as_secs_f64(),
        seed: opts.seed,
        suspicions,
        watch: opts.watch.is_some(),
        ips_per_member: opts.watch.map_or(0, |w| w.ips_per_member),
        refuted_takeovers,
        confirmed_takeovers,
        watch_detect_ms: Quantiles::of(&watch_samples_ms),
        watch_undetected,
        watch_packets_per_member_per_s: watch_packets as f64 / n as f64 / measured,
        partition,
        slow,
        pause,
    })
}

/// Refuses options the simulation cannot run.
fn validate(opts: &SimOptions) -> anyhow::Result<()> {
    anyhow::ensure!(opts.nodes >= 3, "--nodes must be at least 3");
    anyhow::ensure!(
        (0.0..100.0).contains(&opts.loss_pct),
        "--loss must be in [0, 100)"
    );
    opts.timing.validate()?;
    if let Some(watch) = &opts.watch {
        anyhow::ensure!(
            watch.ips_per_member >= 1,
            "--ips-per-member must be at least 1"
        );
        if let Err(problems) = watch.knobs.validate() {
            anyhow::bail!("owner watch knobs: {problems:?}");
        }
    }
    Ok(())
}

/// The downs reported since the last call (on the warm-up and steady phases every down is
/// false: nobody crashed).
fn count_downs(net: &mut Cluster) -> u64 {
    net.drain_changes()
        .filter(|(_, _, c)| matches!(c, LiveChange::Down(_)))
        .count() as u64
}

/// Runs until every node sees every node (or 30 s, or the end); returns whether they did, and
/// the downs seen meanwhile.
fn warm_up(net: &mut Cluster, n: usize, end: Duration) -> (bool, u64) {
    let cap = Duration::from_secs(30).min(end);
    let mut false_downs = 0u64;
    while net.now() < cap {
        net.run_for(Duration::from_millis(100));
        false_downs += count_downs(net);
        if (0..n).all(|i| net.core(i).is_some_and(|c| c.live().len() == n)) {
            return (true, false_downs);
        }
        if std::env::var_os("SIM_DEBUG").is_some() && net.now().as_millis().is_multiple_of(1000) {
            debug_warm_up(net, n);
        }
    }
    (false, false_downs)
}

/// `SIM_DEBUG`: who does not see whom yet.
fn debug_warm_up(net: &Cluster, n: usize) {
    let sizes: Vec<usize> = (0..n)
        .map(|i| net.core(i).map_or(0, |c| c.live().len()))
        .collect();
    let full = sizes.iter().filter(|l| **l == n).count();
    let mut short: Vec<_> = sizes.iter().filter(|l| **l != n).collect();
    short.sort();
    short.truncate(20);
    eprintln!(
        "warm-up {:?}: {full} of {n} see everyone; smallest views: {short:?}",
        net.now()
    );
    for i in (0..n).filter(|i| sizes[*i] != n).take(3) {
        let Some(c) = net.core(i) else { continue };
        for m in (0..n).map(node_name).filter(|m| !c.live().contains(m)) {
            eprintln!(
                "  node {i} ({:?}) misses {m}: {:?}",
                c.phase(),
                c.debug_member(&m)
            );
        }
    }
}

/// What the crash phase measured.
#[derive(Debug, Default)]
struct CrashPhase {
    /// Crash to the last survivor's down, per crash (the cap when some never did).
    samples_ms: Vec<f64>,
    /// Crashes some survivor never reported within the cap.
    undetected: usize,
    /// Crash to the owner watch's first confirmed takeover, per crash.
    watch_samples_ms: Vec<f64>,
    /// Crashes the owner watch never took over from.
    watch_undetected: usize,
    /// Downs of members that did not crash.
    false_downs: u64,
}

/// Crashes every member but node 0 in turn (seeds included: a restarted seed rejoins through
/// the other seeds), each restarted under a new identity, while time is left.
fn crash_each_in_turn(
    net: &mut Cluster,
    opts: &SimOptions,
    bumps: &mut [u64],
) -> anyhow::Result<CrashPhase> {
    let (n, end) = (opts.nodes, opts.duration);
    let (cap, settle) = match opts.profile {
        Profile::Fast => (Duration::from_secs(5), Duration::from_secs(2)),
        Profile::Lan => (Duration::from_secs(60), Duration::from_secs(10)),
    };
    let mut phase = CrashPhase::default();
    let mut victim = 1;
    while net.now() + cap.min(Duration::from_secs(2)) + settle <= end {
        crash_one(net, n, victim, (cap, end), &mut phase);
        bumps[victim] += 1;
        let core = new_core(opts, victim, bumps[victim], net.now())?;
        net.start(victim, core)?;
        let settle_end = (net.now() + settle).min(end);
        while net.now() < settle_end {
            net.run_for(Duration::from_millis(50));
            phase.false_downs += count_downs(net);
        }
        victim = if victim + 1 >= n { 1 } else { victim + 1 };
    }
    Ok(phase)
}

/// Crashes `victim` and waits (up to `cap`) until every survivor that knew it reports it down.
fn crash_one(
    net: &mut Cluster,
    n: usize,
    victim: usize,
    (cap, end): (Duration, Duration),
    phase: &mut CrashPhase,
) {
    let victim_name = node_name(victim);
    // Only survivors that know the victim can report it down.
    let mut waiting: Vec<bool> = (0..n)
        .map(|i| i != victim && net.core(i).is_some_and(|c| c.live().contains(&victim_name)))
        .collect();
    let mut left = waiting.iter().filter(|w| **w).count();
    let crashed_at = net.now();
    net.crash(victim);
    let seen = net.takeovers().len();
    let mut last = crashed_at;
    while left > 0 && net.now() < crashed_at + cap && net.now() < end {
        net.run_for(STEP);
        for (at, observer, change) in net.drain_changes() {
            let LiveChange::Down(node) = change else {
                continue;
            };
            if node != victim_name {
                phase.false_downs += 1;
            } else if waiting[observer] {
                waiting[observer] = false;
                left -= 1;
                last = last.max(at);
            }
        }
    }
    if left > 0 {
        if std::env::var_os("SIM_DEBUG").is_some() {
            for i in (0..n).filter(|i| waiting[*i]) {
                let c = net.core(i);
                eprintln!(
                    "t={:?} victim {victim_name} still alive at node {i}: {:?} {:?}",
                    net.now(),
                    c.map(|c| c.phase()),
                    c.map(|c| c.debug_member(&victim_name))
                );
            }
        }
        phase.undetected += 1;
        phase.samples_ms.push(cap.as_secs_f64() * 1e3);
    } else {
        phase
            .samples_ms
            .push((last - crashed_at).as_secs_f64() * 1e3);
    }
    if net.watch().is_some() {
        let first = net.takeovers()[seen..]
            .iter()
            .find(|t| t.owner == victim && t.kind == TakeoverKind::Confirmed);
        match first {
            Some(t) => phase
                .watch_samples_ms
                .push((t.at - crashed_at).as_secs_f64() * 1e3),
            None => phase.watch_undetected += 1,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Stall {
    Slow(Duration),
    Pause(Duration),
}

/// Stalls member `stalled` [`STALLS`] times (see the module docs) and reports what it did.
fn stall(net: &mut Cluster, n: usize, stalled: usize, kind: Stall) -> StallReport {
    let name = node_name(stalled);
    let (mut false_downs_of_others, mut downs_of_stalled) = (0u64, 0u64);
    let mut max_health = 0i64;
    let mut recover = Vec::new();
    let mut unrecovered = 0usize;
    net.drain_changes().for_each(drop);
    net.set_stalled(Some(stalled));
    let seen = net.takeovers().len();
    let mut count = |net: &mut Cluster| {
        for (_, _, change) in net.drain_changes() {
            if let LiveChange::Down(node) = change {
                if node == name {
                    downs_of_stalled += 1;
                } else {
                    false_downs_of_others += 1;
                }
            }
        }
    };
    let health = |net: &Cluster| net.core(stalled).map_or(0, |c| c.metrics().health_score());
    let window = match kind {
        Stall::Slow(_) => SLOW_WINDOW,
        Stall::Pause(pause) => pause,
    };
    for _ in 0..STALLS {
        let end = net.now() + window;
        match kind {
            Stall::Slow(lag) => net.set_lag(stalled, lag),
            Stall::Pause(pause) => net.pause(stalled, net.now() + pause),
        }
        while net.now() < end {
            net.run_for(Duration::from_millis(100).min(end - net.now()));
            count(net);
            max_health = max_health.max(health(net));
        }
        net.set_lag(stalled, Duration::ZERO);
        let recovered = |net: &Cluster| {
            net.core(stalled).is_some_and(|c| c.live().len() == n)
                && (0..n).all(|i| net.core(i).is_some_and(|c| c.live().contains(&name)))
        };
        let mut done = false;
        while net.now() < end + RECOVERY_CAP {
            net.run_for(Duration::from_millis(20));
            count(net);
            max_health = max_health.max(health(net));
            if recovered(net) {
                done = true;
                break;
            }
        }
        let took = net.now() - end;
        if !done {
            unrecovered += 1;
        }
        recover.push(took.as_secs_f64() * 1e3);
        // The rest of the recovery window: downs a late flap causes are still counted.
        while net.now() < end + RECOVERY_CAP {
            net.run_for(Duration::from_millis(100));
            count(net);
            max_health = max_health.max(health(net));
        }
    }
    net.set_stalled(None);
    let stalled_takeovers = net.takeovers()[seen..]
        .iter()
        .filter(|t| t.kind == TakeoverKind::Stalled)
        .count() as u64;
    recover.sort_by(f64::total_cmp);
    StallReport {
        member: stalled,
        stall_ms: match kind {
            Stall::Slow(d) | Stall::Pause(d) => d.as_secs_f64() * 1e3,
        },
        window_ms: window.as_secs_f64() * 1e3,
        stalls: STALLS,
        false_downs_of_others,
        downs_of_stalled,
        recover_ms: Quantiles::of(&recover),
        unrecovered,
        max_health,
        stalled_takeovers,
    }
}

/// The members a partition cuts off: every third, seed 2 among them.
fn is_cut_off(i: usize) -> bool {
    i % 3 == 2
}

/// Cuts every third member off for `cut`, heals, and waits (up to 60 s) until every member sees
/// every member again. Runs after the traffic was measured, so it does not change those figures.
fn partition_and_heal(net: &mut Cluster, n: usize, cut: Duration) -> PartitionReport {
    let cut_off: Vec<usize> = (0..n).filter(|i| is_cut_off(*i)).collect();
    net.set_partitioned(true);
    let seen = net.takeovers().len();
    for &i in &cut_off {
        net.set_group(i, 1);
    }
    let cut_start = net.now();
    net.run_for(cut);
    net.drain_changes().for_each(drop);
    net.heal();
    let healed_at = net.now();
    let cap = Duration::from_secs(60);
    let (mut downs_after_heal, mut cut_off_downs_after_heal) = (0u64, 0u64);
    let mut count_downs = |net: &mut Cluster| {
        for (_, observer, change) in net.drain_changes() {
            if matches!(change, LiveChange::Down(_)) {
                if is_cut_off(observer) {
                    cut_off_downs_after_heal += 1;
                } else {
                    downs_after_heal += 1;
                }
            }
        }
    };
    let mut healed = false;
    while net.now() < healed_at + cap {
        net.run_for(Duration::from_millis(20));
        count_downs(net);
        if (0..n).all(|i| net.core(i).is_some_and(|c| c.live().len() == n)) {
            healed = true;
            break;
        }
        if std::env::var_os("SIM_DEBUG").is_some()
            && (net.now() - healed_at).as_millis().is_multiple_of(500)
        {
            let sizes: Vec<usize> = (0..n)
                .map(|i| net.core(i).map_or(0, |c| c.live().len()))
                .collect();
            let full = sizes.iter().filter(|l| **l == n).count();
            eprintln!(
                "heal +{:?}: {full} of {n} see everyone; sizes of the others: {:?}",
                net.now() - healed_at,
                sizes.iter().filter(|l| **l != n).collect::<Vec<_>>()
            );
        }
    }
    let heal_ms = (net.now() - healed_at).as_secs_f64() * 1e3;
    // A little longer: a heal that flaps shows downs after everyone saw everyone once.
    let tail_end = net.now() + Duration::from_secs(5);
    while net.now() < tail_end {
        net.run_for(Duration::from_millis(100));
        count_downs(net);
    }
    net.set_partitioned(false);
    let takeovers = net.takeovers()[seen..]
        .iter()
        .filter(|t| t.kind == TakeoverKind::Partitioned)
        .count() as u64;
    PartitionReport {
        takeovers,
        cut_off: cut_off.len(),
        cut_s: (healed_at - cut_start).as_secs_f64(),
        healed,
        heal_ms,
        downs_after_heal,
        cut_off_downs_after_heal,
    }
}

/// The table header matching [`table_row`].
pub fn table_header() -> String {
    format!(
        "{:>6} {:>5} {:>7} {:>7} {:>8} {:>8} {:>8} {:>6} {:>6} {:>9} {:>11} {:>7} {:>7} {:>7} {:>9} {:>7}",
        "nodes",
        "loss%",
        "profile",
        "crashes",
        "p50_ms",
        "p99_ms",
        "max_ms",
        "undet",
        "false",
        "pkts/m/s",
        "bytes/m/s",
        "refuted",
        "w_p50",
        "w_p99",
        "w_pkts/m/s",
        "wall_s"
    )
}

/// One table row.
pub fn table_row(r: &SimReport, wall: Duration) -> String {
    format!(
        "{:>6} {:>5} {:>7} {:>7} {:>8.0} {:>8.0} {:>8.0} {:>6} {:>6} {:>9.1} {:>11.0} {:>7} {:>7.0} {:>7.0} {:>9.1} {:>7.1}",
        r.nodes,
        r.loss,
        r.profile,
        r.crashes,
        r.detection_ms.p50,
        r.detection_ms.p99,
        r.detection_ms.max,
        r.undetected,
        r.false_downs,
        r.packets_per_member_per_s,
        r.bytes_per_member_per_s,
        r.refuted_takeovers,
        r.watch_detect_ms.p50,
        r.watch_detect_ms.p99,
        r.watch_packets_per_member_per_s,
        wall.as_secs_f64()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_lossless_run_detects_every_crash_without_false_downs() {
        let opts = SimOptions {
            nodes: 5,
            loss_pct: 0.0,
            duration: Duration::from_secs(20),
            profile: Profile::Fast,
            timing: Timing::fast(),
            seed: 1,
            partition: None,
            slow: None,
            pause: None,
            watch: Some(WatchOptions::default()),
        };
        let report = run(&opts).unwrap();
        assert!(report.crashes >= 3, "{report:?}");
        assert_eq!(report.undetected, 0);
        assert_eq!(report.false_downs, 0);
        assert!(report.detection_ms.max <= 1000.0, "{report:?}");
    }

    #[test]
    fn same_seed_gives_the_same_run() {
        let opts = SimOptions {
            nodes: 6,
            loss_pct: 5.0,
            duration: Duration::from_secs(15),
            profile: Profile::Fast,
            timing: Timing::fast(),
            seed: 42,
            partition: Some(Duration::from_secs(3)),
            slow: None,
            pause: None,
            watch: Some(WatchOptions::default()),
        };
        let first = serde_json::to_string(&run(&opts).unwrap()).unwrap();
        let second = serde_json::to_string(&run(&opts).unwrap()).unwrap();
        assert_eq!(first, second);
    }

    #[test]
    fn a_partition_heals_into_one_membership_without_downs_after_the_heal() {
        let opts = SimOptions {
            nodes: 9,
            loss_pct: 0.0,
            duration: Duration::from_secs(10),
            profile: Profile::Fast,
            timing: Timing::fast(),
            seed: 7,
            partition: Some(Duration::from_secs(5)),
            slow: None,
            pause: None,
            watch: Some(WatchOptions::default()),
        };
        let report = run(&opts).unwrap();
        let p = report.partition.expect("a partition phase ran");
        assert_eq!(p.cut_off, 3);
        assert!(p.healed, "{p:?}");
        assert_eq!(p.downs_after_heal, 0, "{p:?}");
    }

    #[test]
    fn a_slow_and_a_paused_member_take_no_other_member_down_and_recover() {
        let opts = SimOptions {
            nodes: 8,
            loss_pct: 0.0,
            duration: Duration::from_secs(10),
            profile: Profile::Fast,
            timing: Timing::fast(),
            seed: 3,
            partition: None,
            slow: Some(Duration::from_millis(500)),
            pause: Some(Duration::from_millis(2000)),
            watch: Some(WatchOptions::default()),
        };
        let report = run(&opts).unwrap();
        for stall in [report.slow.unwrap(), report.pause.unwrap()] {
            assert_eq!(stall.stalls, STALLS);
            assert_eq!(stall.false_downs_of_others, 0, "{stall:?}");
            assert_eq!(stall.unrecovered, 0, "{stall:?}");
        }
    }

    fn live_of(members: impl IntoIterator<Item = usize>) -> LiveSet {
        let mut live = LiveSet::new();
        for m in members {
            live.upsert(MemberMeta::new(node_name(m)));
        }
        live
    }

    #[test]
    fn the_successor_is_the_best_ranked_other_member_held_alive_whoever_decides() {
        let opts = WatchOptions::default();
        let (a, b) = (
            Ranking::new(40, opts.ips_per_member),
            Ranking::new(41, opts.ips_per_member),
        );
        let all = live_of(0..40);
        for owner in 0..40 {
            for k in 0..opts.ips_per_member {
                let s = a.successor(owner, k, &all).unwrap();
                assert_ne!(s, owner);
                // A member the view does not hold changes nothing.
                assert_eq!(b.successor(owner, k, &all), Some(s));
                let ip = owner * opts.ips_per_member + k;
                let best = (0..40)
                    .filter(|m| *m != owner)
                    .min_by_key(|m| rank_key(ip, *m));
                assert_eq!(Some(s), best);
                // Without it in the view, the next in line (past the kept candidates too).
                let without = live_of((0..40).filter(|m| *m != s));
                let next = (0..40)
                    .filter(|m| *m != owner && *m != s)
                    .min_by_key(|m| rank_key(ip, *m));
                assert_eq!(a.successor(owner, k, &without), next);
            }
            let watchers = a.watchers(owner, &all);
            assert!(!watchers.is_empty() && watchers.len() <= MAX_WATCHERS);
            assert!(watchers.iter().all(|w| a.succeeds(*w, owner, &all)));
        }
        let few = live_of([3, 17]);
        let beyond = (0..opts.ips_per_member)
            .filter_map(|k| a.successor(3, k, &few))
            .collect::<Vec<_>>();
        assert_eq!(beyond, vec![17; opts.ips_per_member]);
    }

    #[test]
    fn every_crash_is_taken_over_by_the_watch_and_no_live_member_is_without_loss() {
        let opts = SimOptions {
            nodes: 6,
            loss_pct: 0.0,
            duration: Duration::from_secs(15),
            profile: Profile::Fast,
            timing: Timing::fast(),
            seed: 11,
            partition: None,
            slow: None,
            pause: None,
            watch: Some(WatchOptions::default()),
        };
        let report = run(&opts).unwrap();
        assert!(report.crashes >= 3, "{report:?}");
        assert_eq!(report.watch_undetected, 0, "{report:?}");
        assert!(report.confirmed_takeovers >= report.crashes as u64);
        assert_eq!(report.refuted_takeovers, 0, "{report:?}");
        // A window (110 ms) after the last heartbeat, the second check within it.
        assert!(report.watch_detect_ms.max <= 140.0, "{report:?}");
        assert!(report.watch_detect_ms.p50 >= 80.0, "{report:?}");
        // Three watchers at 50 heartbeats a second, give or take the changes after crashes.
        assert!(
            (100.0..200.0).contains(&report.watch_packets_per_member_per_s),
            "{report:?}"
        );
    }

    #[test]
    fn without_the_watch_nothing_is_taken_over_and_no_watch_datagram_is_counted() {
        let opts = SimOptions {
            nodes: 5,
            loss_pct: 0.0,
            duration: Duration::from_secs(8),
            profile: Profile::Fast,
            timing: Timing::fast(),
            seed: 1,
            partition: None,
            slow: None,
            pause: None,
            watch: None,
        };
        let report = run(&opts).unwrap();
        assert!(!report.watch);
        assert_eq!(report.confirmed_takeovers + report.refuted_takeovers, 0);
        assert_eq!(report.watch_packets_per_member_per_s, 0.0);
    }

    #[test]
    fn quantiles_pick_the_ranked_sample() {
        let s: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&s, 0.5), 50.0);
        assert_eq!(quantile(&s, 0.99), 99.0);
        assert_eq!(quantile(&[3.0], 0.99), 3.0);
    }
}
