//! The phases of a run after the warm-up: crashes one after another, stalls of one member, a
//! partition and its heal; each measured on the virtual clock.

use super::*;

/// Stalls per `--slow` / `--pause` phase.
pub const STALLS: usize = 3;
/// How long a slow member stays slow each time.
pub(super) const SLOW_WINDOW: Duration = Duration::from_secs(10);
/// The longest wait for a recovery after a stall.
pub(super) const RECOVERY_CAP: Duration = Duration::from_secs(10);

/// The downs reported since the last call (on the warm-up and steady phases every down is
/// false: nobody crashed).
pub(super) fn count_downs(net: &mut Cluster) -> u64 {
    net.drain_changes()
        .filter(|(_, _, c)| matches!(c, LiveChange::Down(_)))
        .count() as u64
}

/// Runs until every node sees every node (or 30 s, or the end); returns whether they did, and
/// the downs seen meanwhile.
pub(super) fn warm_up(net: &mut Cluster, n: usize, end: Duration) -> (bool, u64) {
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
pub(super) fn debug_warm_up(net: &Cluster, n: usize) {
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
pub(super) struct CrashPhase {
    /// Crash to the last survivor's down, per crash (the cap when some never did).
    pub(super) samples_ms: Vec<f64>,
    /// Crashes some survivor never reported within the cap.
    pub(super) undetected: usize,
    /// Crash to the owner watch's first confirmed takeover, per crash.
    pub(super) watch_samples_ms: Vec<f64>,
    /// Crashes the owner watch never took over from.
    pub(super) watch_undetected: usize,
    /// Downs of members that did not crash.
    pub(super) false_downs: u64,
}

/// Crashes every member but node 0 in turn (seeds included: a restarted seed rejoins through
/// the other seeds), each restarted under a new identity, while time is left.
pub(super) fn crash_each_in_turn(
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
pub(super) fn crash_one(
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
pub(super) enum Stall {
    Slow(Duration),
    Pause(Duration),
}

/// Stalls member `stalled` [`STALLS`] times (see the module docs) and reports what it did.
pub(super) fn stall(net: &mut Cluster, n: usize, stalled: usize, kind: Stall) -> StallReport {
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
pub(super) fn is_cut_off(i: usize) -> bool {
    i % 3 == 2
}

/// Cuts every third member off for `cut`, heals, and waits (up to 60 s) until every member sees
/// every member again. Runs after the traffic was measured, so it does not change those figures.
pub(super) fn partition_and_heal(net: &mut Cluster, n: usize, cut: Duration) -> PartitionReport {
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
