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
//! counted apart (`stalled_takeovers`). The watch's datagrams count in the traffic. Claims and
//! refutations also travel through the gossip cores, as in the daemon (gossip kind 8).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use swimlb_proto::KeyRing;
use swimlb_speaker::gossip::simnet::{Links, SimEvent, SimNet, Timeline, Traffic};
use swimlb_speaker::gossip::{
    Core, Directory, GossipMetrics, GossipSettings, NodeIdentity, Outgoing, Profile,
    SuspicionOutcome, Timing,
};
use swimlb_speaker::model::membership::{LiveChange, LiveSet, MemberMeta};
use swimlb_speaker::model::watch_knobs::Knobs;
use swimlb_speaker::owner_watch::core::{MAX_WATCHERS, watch_addr};
use swimlb_speaker::owner_watch::{Command, Event, Plan, WatchCore, WatchMetrics};

mod cluster;
mod kinds;
mod phases;
mod report;
mod watch;

pub use cluster::Cluster;
use kinds::Kinds;
pub use phases::STALLS;
use phases::*;
pub use report::{
    PartitionReport, Quantiles, SimReport, StallReport, SuspicionCounts, table_header, table_row,
};
pub use watch::{OwnerWatches, Takeover, TakeoverKind};

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
    /// Count the gossip's datagrams by kind after the warm-up (opens each one again: slower).
    pub kinds: bool,
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
    if opts.kinds {
        net.count_kinds()?;
    }
    let mut crashes = crash_each_in_turn(&mut net, opts, &mut bumps)?;
    // Whatever time is left: steady state.
    while net.now() < end {
        net.run_for(Duration::from_millis(100));
        crashes.false_downs += count_downs(&mut net);
    }

    let measured = (net.now() - warmup).as_secs_f64().max(1e-9);
    let gossip_kinds = net
        .take_kinds()
        .into_iter()
        .map(|(kind, count)| (kind.to_string(), count as f64 / n as f64 / measured))
        .collect();
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
        gossip_kinds,
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

#[cfg(test)]
mod tests {
    use super::report::quantile;
    use super::watch::{Ranking, rank_key};
    use super::*;

    /// `nodes` members on the fast profile for `seconds`, no loss, no stall or partition, the
    /// watch on.
    fn lossless(nodes: usize, seconds: u64, seed: u64) -> SimOptions {
        SimOptions {
            nodes,
            loss_pct: 0.0,
            duration: Duration::from_secs(seconds),
            profile: Profile::Fast,
            timing: Timing::fast(),
            seed,
            partition: None,
            slow: None,
            pause: None,
            watch: Some(WatchOptions::default()),
            kinds: false,
        }
    }

    #[test]
    fn small_lossless_run_detects_every_crash_without_false_downs() {
        let opts = lossless(5, 20, 1);
        let report = run(&opts).unwrap();
        assert!(report.crashes >= 3, "{report:?}");
        assert_eq!(report.undetected, 0);
        assert_eq!(report.false_downs, 0);
        assert!(report.detection_ms.max <= 1000.0, "{report:?}");
    }

    #[test]
    fn same_seed_gives_the_same_run() {
        let opts = SimOptions {
            loss_pct: 5.0,
            partition: Some(Duration::from_secs(3)),
            ..lossless(6, 15, 42)
        };
        let first = serde_json::to_string(&run(&opts).unwrap()).unwrap();
        let second = serde_json::to_string(&run(&opts).unwrap()).unwrap();
        assert_eq!(first, second);
    }

    #[test]
    fn a_partition_heals_into_one_membership_without_downs_after_the_heal() {
        let opts = SimOptions {
            partition: Some(Duration::from_secs(5)),
            ..lossless(9, 10, 7)
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
            slow: Some(Duration::from_millis(500)),
            pause: Some(Duration::from_millis(2000)),
            ..lossless(8, 10, 3)
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
        let opts = lossless(6, 15, 11);
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
            watch: None,
            ..lossless(5, 8, 1)
        };
        let report = run(&opts).unwrap();
        assert!(!report.watch);
        assert_eq!(report.confirmed_takeovers + report.refuted_takeovers, 0);
        assert_eq!(report.watch_packets_per_member_per_s, 0.0);
    }

    #[test]
    fn the_kinds_add_up_to_the_gossip_traffic_and_every_datagram_opens() {
        let opts = SimOptions {
            loss_pct: 5.0,
            kinds: true,
            ..lossless(8, 12, 5)
        };
        let report = run(&opts).unwrap();
        let kinds = &report.gossip_kinds;
        for kind in ["ping", "ack", "gossip", "sync"] {
            assert!(
                kinds.get(kind).is_some_and(|r| *r > 0.0),
                "{kind}: {kinds:?}"
            );
        }
        for bad in ["unopened", "undecoded", "foca_undecoded"] {
            assert!(!kinds.contains_key(bad), "{kinds:?}");
        }
        let gossip = report.packets_per_member_per_s - report.watch_packets_per_member_per_s;
        let sum: f64 = kinds.values().sum();
        assert!((sum - gossip).abs() < 1e-6 * gossip, "{sum} vs {gossip}");
        // Counting opens copies of the datagrams: the run itself is the same.
        let plain = run(&SimOptions {
            kinds: false,
            ..opts
        })
        .unwrap();
        assert!(plain.gossip_kinds.is_empty());
        assert_eq!(plain.detection_ms.p99, report.detection_ms.p99);
        assert_eq!(
            plain.packets_per_member_per_s,
            report.packets_per_member_per_s
        );
    }

    #[test]
    fn quantiles_pick_the_ranked_sample() {
        let s: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&s, 0.5), 50.0);
        assert_eq!(quantile(&s, 0.99), 99.0);
        assert_eq!(quantile(&[3.0], 0.99), 3.0);
    }
}
