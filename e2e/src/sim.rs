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

use std::time::Duration;

use serde::Serialize;
use swimlb_proto::KeyRing;
use swimlb_speaker::gossip::simnet::{Links, SimNet};
use swimlb_speaker::gossip::{
    Core, GossipMetrics, GossipSettings, Profile, SuspicionOutcome, Timing,
};
use swimlb_speaker::membership::{LiveChange, MemberMeta};

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
    /// Datagrams sent per member per second after warm-up.
    pub packets_per_member_per_s: f64,
    /// Sealed bytes sent per member per second after warm-up.
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

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Runs one simulation.
pub fn run(opts: &SimOptions) -> anyhow::Result<SimReport> {
    anyhow::ensure!(opts.nodes >= 3, "--nodes must be at least 3");
    anyhow::ensure!(
        (0.0..100.0).contains(&opts.loss_pct),
        "--loss must be in [0, 100)"
    );
    opts.timing.validate()?;
    let n = opts.nodes;
    let end = opts.duration;
    let links = Links {
        loss: opts.loss_pct / 100.0,
        ..Links::default()
    };
    let mut net = SimNet::new(opts.seed, links);
    let mut bumps = vec![1u64; n];
    for (i, bump) in bumps.iter().enumerate() {
        let core = new_core(opts, i, *bump, net.now())?;
        net.start(i, core);
    }

    // Warm-up: until every node sees every node (or 30 s, or the end).
    let warmup_cap = Duration::from_secs(30).min(end);
    let mut false_downs = 0u64;
    let mut converged = false;
    while net.now() < warmup_cap {
        net.run_for(Duration::from_millis(100));
        false_downs += net
            .drain_changes()
            .filter(|(_, _, c)| matches!(c, LiveChange::Down(_)))
            .count() as u64;
        if (0..n).all(|i| net.core(i).is_some_and(|c| c.live().len() == n)) {
            converged = true;
            break;
        }
        if std::env::var_os("SIM_DEBUG").is_some() && net.now().as_millis().is_multiple_of(1000) {
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
    }
    let warmup = net.now();
    let traffic_start: Vec<_> = (0..n).map(|i| net.traffic(i)).collect();

    let (cap, settle) = match opts.profile {
        Profile::Fast => (Duration::from_secs(5), Duration::from_secs(2)),
        Profile::Lan => (Duration::from_secs(60), Duration::from_secs(10)),
    };
    let mut samples_ms = Vec::new();
    let mut undetected = 0usize;
    // Every member but node 0 takes its turn (seeds included: a restarted seed rejoins through
    // the other seeds).
    let mut next_victim = 1;
    while net.now() + cap.min(Duration::from_secs(2)) + settle <= end {
        let victim = next_victim;
        next_victim = if next_victim + 1 >= n {
            1
        } else {
            next_victim + 1
        };
        let victim_name = node_name(victim);
        // Only survivors that know the victim can report it down.
        let mut waiting: Vec<bool> = (0..n)
            .map(|i| i != victim && net.core(i).is_some_and(|c| c.live().contains(&victim_name)))
            .collect();
        let mut left = waiting.iter().filter(|w| **w).count();
        let crashed_at = net.now();
        net.crash(victim);
        let mut last = crashed_at;
        while left > 0 && net.now() < crashed_at + cap && net.now() < end {
            net.run_for(STEP);
            for (at, observer, change) in net.drain_changes() {
                if let LiveChange::Down(node) = change {
                    if node == victim_name {
                        if waiting[observer] {
                            waiting[observer] = false;
                            left -= 1;
                            last = last.max(at);
                        }
                    } else {
                        false_downs += 1;
                    }
                }
            }
        }
        if left > 0 {
            if std::env::var_os("SIM_DEBUG").is_some() {
                for (i, w) in waiting.iter().enumerate() {
                    if *w {
                        let c = net.core(i);
                        eprintln!(
                            "t={:?} victim {victim_name} still alive at node {i}: {:?} {:?}",
                            net.now(),
                            c.map(|c| c.phase()),
                            c.map(|c| c.debug_member(&victim_name))
                        );
                    }
                }
            }
            undetected += 1;
            samples_ms.push(cap.as_secs_f64() * 1e3);
        } else {
            samples_ms.push((last - crashed_at).as_secs_f64() * 1e3);
        }
        bumps[victim] += 1;
        let core = new_core(opts, victim, bumps[victim], net.now())?;
        net.start(victim, core);
        let settle_end = (net.now() + settle).min(end);
        while net.now() < settle_end {
            net.run_for(Duration::from_millis(50));
            false_downs += net
                .drain_changes()
                .filter(|(_, _, c)| matches!(c, LiveChange::Down(_)))
                .count() as u64;
        }
    }
    // Whatever time is left: steady state.
    while net.now() < end {
        net.run_for(Duration::from_millis(100));
        false_downs += net
            .drain_changes()
            .filter(|(_, _, c)| matches!(c, LiveChange::Down(_)))
            .count() as u64;
    }

    let measured = (net.now() - warmup).as_secs_f64().max(1e-9);
    // Traffic of the crash phase only: the partition and stall phases come after.
    let (mut packets, mut bytes) = (0u64, 0u64);
    for (i, start) in traffic_start.iter().enumerate() {
        let t = net.traffic(i);
        packets += t.packets - start.packets;
        bytes += t.bytes - start.bytes;
    }
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
    samples_ms.sort_by(f64::total_cmp);
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
        detection_ms: Quantiles {
            p50: quantile(&samples_ms, 0.5),
            p99: quantile(&samples_ms, 0.99),
            max: samples_ms.last().copied().unwrap_or(0.0),
        },
        false_downs,
        packets_per_member_per_s: packets as f64 / n as f64 / measured,
        bytes_per_member_per_s: bytes as f64 / n as f64 / measured,
        crashes: samples_ms.len(),
        undetected,
        warmup_s: warmup.as_secs_f64(),
        converged,
        duration_s: measured + warmup.as_secs_f64(),
        seed: opts.seed,
        suspicions,
        partition,
        slow,
        pause,
    })
}

#[derive(Debug, Clone, Copy)]
enum Stall {
    Slow(Duration),
    Pause(Duration),
}

/// Stalls member `stalled` [`STALLS`] times (see the module docs) and reports what it did.
fn stall(net: &mut SimNet, n: usize, stalled: usize, kind: Stall) -> StallReport {
    let name = node_name(stalled);
    let (mut false_downs_of_others, mut downs_of_stalled) = (0u64, 0u64);
    let mut max_health = 0i64;
    let mut recover = Vec::new();
    let mut unrecovered = 0usize;
    net.drain_changes().for_each(drop);
    let mut count = |net: &mut SimNet| {
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
    let health = |net: &SimNet| net.core(stalled).map_or(0, |c| c.metrics().health_score());
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
        let recovered = |net: &SimNet| {
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
        recover_ms: Quantiles {
            p50: quantile(&recover, 0.5),
            p99: quantile(&recover, 0.99),
            max: recover.last().copied().unwrap_or(0.0),
        },
        unrecovered,
        max_health,
    }
}

/// The members a partition cuts off: every third, seed 2 among them.
fn is_cut_off(i: usize) -> bool {
    i % 3 == 2
}

/// Cuts every third member off for `cut`, heals, and waits (up to 60 s) until every member sees
/// every member again. Runs after the traffic was measured, so it does not change those figures.
fn partition_and_heal(net: &mut SimNet, n: usize, cut: Duration) -> PartitionReport {
    let cut_off: Vec<usize> = (0..n).filter(|i| is_cut_off(*i)).collect();
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
    let mut count_downs = |net: &mut SimNet| {
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
    PartitionReport {
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
        "{:>6} {:>5} {:>7} {:>7} {:>8} {:>8} {:>8} {:>6} {:>6} {:>9} {:>11} {:>7}",
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
        "wall_s"
    )
}

/// One table row.
pub fn table_row(r: &SimReport, wall: Duration) -> String {
    format!(
        "{:>6} {:>5} {:>7} {:>7} {:>8.0} {:>8.0} {:>8.0} {:>6} {:>6} {:>9.1} {:>11.0} {:>7.1}",
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
        };
        let report = run(&opts).unwrap();
        for stall in [report.slow.unwrap(), report.pause.unwrap()] {
            assert_eq!(stall.stalls, STALLS);
            assert_eq!(stall.false_downs_of_others, 0, "{stall:?}");
            assert_eq!(stall.unrecovered, 0, "{stall:?}");
        }
    }

    #[test]
    fn quantiles_pick_the_ranked_sample() {
        let s: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&s, 0.5), 50.0);
        assert_eq!(quantile(&s, 0.99), 99.0);
        assert_eq!(quantile(&[3.0], 0.99), 3.0);
    }
}
