//! `swimlb-lab chaos`: seeded random faults, several at a time, on the namespace lab, with the
//! invariants checked the whole time.
//!
//! - [`schedule`] (pure): the faults of a run, a function of (seed, duration, nodes, target).
//! - [`invariants`] (pure): dual, dark, disagreement and misplaced over what was recorded.
//! - [`records`] (pure): in Kubernetes, stale records and double allocations.
//! - [`driver`] (I/O): what each fault does to the lab and how it is undone (the Kubernetes
//!   faults in `driver/kubernetes.rs`).
//!
//! The targets: swimlb standalone and keepalived-fast on the namespace lab; swimlb in
//! Kubernetes mode and MetalLB on real nodes (the real control plane, a real kubelet,
//! containerd and kube-proxy per node: [`RealDaemons`]), which also serve a `Local` Service on
//! the second VIP and are read every 500 ms for their records and Services.
//!
//! [`run`] builds the lab (the daemons of the target on every node, a responder beside each),
//! waits for it to converge ([`trial::settle`]), then starts the observers: a prober per VIP
//! (every 10 ms), an ARP asker per VIP (every 100 ms), and for swimlb a `/status` reader (every
//! 500 ms, all nodes at once). It executes the schedule's steps at their times, recording when
//! each really happened; meanwhile it reads the daemons' logs for panics and `/proc` for
//! unexpected exits (crash) and for resident memory (leak: more than 10 % above the level
//! read a minute after the daemon started). At the end (or at the first violation with
//! `until_violation`) it undoes every fault still applied, tears the lab down and checks the
//! invariants over the whole record. Every loop is bounded by the run's duration.

pub mod driver;
pub mod invariants;
mod observe;
mod process_watch;
pub mod records;
pub mod schedule;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use tokio::time::Instant;

use self::driver::{ChaosDaemons, Driver, Stepped};
use self::invariants::{
    ArpSample, DualEpisode, Executed, Invariant, Observations, Poll, Probe, Rule, Violation,
    VipObservations, VipRule, World,
};
pub use self::observe::owners_named;
use self::observe::*;
use self::process_watch::*;
use self::records::{ApiRead, RecordPoll, ServiceIps};
use self::schedule::{Fault, FaultKind, Setup, Step, Target};
use crate::daemons::{self, Daemons as _, KeepalivedDaemons, SwimlbDaemons};
use crate::keepalived::Tuning;
use crate::kubelab;
use crate::lab;
use crate::netns::{self, Lab};
use crate::probe::{self, ArpAsker, PROBE_PORT, Prober, Worker};
use crate::realnode::{self, daemons::RealDaemons};
use crate::trial;

/// The groups' preemption delay in the swimlb lab.
pub const PREEMPT_DELAY: Duration = Duration::from_secs(1);
/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The target.
    pub target: Target,
    /// Faults are drawn over this long; the run lasts this long after the lab converged.
    pub duration: Duration,
    /// Seed of the schedule.
    pub seed: u64,
    /// Nodes (3 to 5).
    pub nodes: usize,
    /// Stop at the first violation.
    pub until_violation: bool,
    /// Draw the seed's faults (tests that run only injected faults turn this off).
    pub scheduled: bool,
    /// Faults added to the schedule's (tests inject a violation this way).
    pub injected: Vec<Fault>,
    /// The program the speakers run as (`PROGRAM speaker standalone ...`).
    pub program: PathBuf,
}

/// One line of the timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TimelineEntry {
    /// Since the start of the run.
    pub at_ms: u64,
    /// `start`, `step`, `end`, `violation`, `excused` or `error`.
    pub what: &'static str,
    /// The text.
    pub text: String,
}

/// One daemon's memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Memory {
    /// Node.
    pub node: String,
    /// Process id.
    pub pid: u32,
    /// Resident memory a minute after it started, KiB.
    pub baseline_kib: u64,
    /// Resident memory last read, KiB.
    pub last_kib: u64,
}

/// The report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The target.
    #[serde(rename = "impl")]
    pub implementation: &'static str,
    /// The seed.
    pub seed: u64,
    /// The requested duration, seconds.
    pub duration_s: u64,
    /// Seconds actually run.
    pub ran_s: f64,
    /// Nodes.
    pub nodes: usize,
    /// What the seed drew beside the faults.
    pub setup: Setup,
    /// Stopped at the first violation.
    pub stopped_early: bool,
    /// Violations per invariant (excused ones not counted).
    pub violations_per_invariant: BTreeMap<&'static str, usize>,
    /// Excused violations (around a partition of the mesh) per invariant.
    pub excused_per_invariant: BTreeMap<&'static str, usize>,
    /// Faults applied per kind.
    pub faults_per_kind: BTreeMap<&'static str, usize>,
    /// Every violation, excused ones included.
    pub violations: Vec<Violation>,
    /// Every stretch of two MACs answering one VIP, the short ones included.
    pub dual_episodes: Vec<DualEpisode>,
    /// Faults and violations on one timeline.
    pub timeline: Vec<TimelineEntry>,
    /// The faults of the schedule (and any injected), in start order.
    pub faults: Vec<Fault>,
    /// Probes sent, over every VIP.
    pub probes: usize,
    /// Of which unanswered.
    pub lost_probes: usize,
    /// Memory of the daemons that ran at least a minute.
    pub memory: Vec<Memory>,
    /// Steps that failed (a fault that could not be applied or undone).
    pub errors: Vec<String>,
    /// Faults (and a rolling update's steps) skipped: they act on a speaker that did not run
    /// then (a real node's kubelet had not started it again yet).
    pub skipped: Vec<String>,
    /// On real nodes: the speakers' starts whose restart the kubelet held longer than the driver
    /// waits (its restart back-off); the run went on without them.
    pub late_restarts: Vec<LateRestart>,
    /// On real nodes: the moments the machine starved a speaker (a thread waited for a CPU
    /// as long as a watcher waits), given to the checker as `Starve` faults.
    pub measured_starvations: Vec<MeasuredStarvation>,
    /// The command that replays the run.
    pub replay: String,
}

/// A speaker started again on a real node (a kill's end, a roll's step) whose restart the
/// kubelet held (its restart back-off).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LateRestart {
    /// Node.
    pub node: String,
    /// When the kubelet was continued (a kill's or power-off's end, a roll's start again), since
    /// the start of the run.
    pub asked_s: f64,
    /// When the run saw the speaker running again; `None`: not within the run.
    pub running_s: Option<f64>,
}

/// A stretch in which the machine starved a speaker on a real node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MeasuredStarvation {
    /// Node.
    pub node: String,
    /// From the read before the first starved round, since the start of the run.
    pub from_s: f64,
    /// To the read that ended the last.
    pub to_s: f64,
    /// The longest wait of one thread over two rounds.
    pub longest_wait_ms: f64,
}

impl Report {
    /// Violations that count.
    pub fn counted(&self) -> usize {
        self.violations_per_invariant.values().sum()
    }

    /// The printed report: the timeline, then the counts.
    pub fn text(&self) -> String {
        let mut s = String::new();
        for e in &self.timeline {
            let _ = writeln!(
                s,
                "{:>9.3} s  {:<9} {}",
                e.at_ms as f64 / 1e3,
                e.what,
                e.text
            );
        }
        let _ = writeln!(
            s,
            "chaos ({}): seed {}, {} nodes, {:.0} s{}: {} faults, {} probes ({} lost)",
            self.implementation,
            self.seed,
            self.nodes,
            self.ran_s,
            if self.stopped_early {
                " (stopped at the first violation)"
            } else {
                ""
            },
            self.faults_per_kind.values().sum::<usize>(),
            self.probes,
            self.lost_probes
        );
        let counts: Vec<String> = self
            .violations_per_invariant
            .iter()
            .map(|(k, v)| {
                let excused = self.excused_per_invariant.get(k).copied().unwrap_or(0);
                if excused > 0 {
                    format!("{k} {v} (+{excused} excused)")
                } else {
                    format!("{k} {v}")
                }
            })
            .collect();
        let _ = writeln!(s, "  violations: {}", counts.join(", "));
        if let Some(longest) = self.dual_episodes.iter().map(|e| e.span).max() {
            let _ = writeln!(
                s,
                "  two MACs answered a VIP {} times, the longest for {} ms",
                self.dual_episodes.len(),
                longest.as_millis()
            );
        }
        for m in &self.measured_starvations {
            let _ = writeln!(
                s,
                "  {}'s speaker starved by the machine from {:.2} s to {:.2} s (a thread waited {:.0} ms for a CPU)",
                m.node, m.from_s, m.to_s, m.longest_wait_ms
            );
        }
        for l in &self.late_restarts {
            let _ = match l.running_s {
                Some(t) => writeln!(
                    s,
                    "  {}'s kubelet started the speaker again {:.1} s after it was continued at {:.2} s (its restart back-off)",
                    l.node,
                    t - l.asked_s,
                    l.asked_s
                ),
                None => writeln!(
                    s,
                    "  {}'s kubelet had not started the speaker again at the run's end (asked at {:.2} s)",
                    l.node, l.asked_s
                ),
            };
        }
        for k in &self.skipped {
            let _ = writeln!(s, "  skipped: {k}");
        }
        for m in &self.memory {
            let _ = writeln!(
                s,
                "  {} (pid {}) rss {} KiB after its first minute, {} KiB at the end",
                m.node, m.pid, m.baseline_kib, m.last_kib
            );
        }
        for e in &self.errors {
            let _ = writeln!(s, "  error: {e}");
        }
        let _ = writeln!(s, "  replay: {}", self.replay);
        s
    }

    /// With `until_violation`: the first violation, the seed and the faults that led to it
    /// (those applied in the 15 s before it, or still applied then).
    pub fn first_violation(&self) -> Option<String> {
        let v = self.violations.iter().find(|v| !v.excused)?;
        let mut s = format!(
            "first violation at {:.3} s: {} {}{}\nseed {}; faults leading to it:\n",
            v.at.as_secs_f64(),
            v.invariant.as_str(),
            v.vip.map(|i| format!("(VIP {i}) ")).unwrap_or_default(),
            v.detail,
            self.seed
        );
        for f in self
            .faults
            .iter()
            .filter(|f| f.at <= v.at && f.end() + Duration::from_secs(15) >= v.at)
        {
            let _ = writeln!(
                s,
                "  {:>8.3} s - {:>8.3} s  {}",
                f.at.as_secs_f64(),
                f.end().as_secs_f64(),
                f.kind.describe()
            );
        }
        let _ = write!(s, "replay: {}", self.replay);
        Some(s)
    }
}

/// The VIPs of a target's lab.
fn vips(target: Target) -> Vec<Ipv4Addr> {
    (0..target.capabilities().vips)
        .map(|i| netns::vip_v4(i as u8))
        .collect()
}

/// The lab's own election rule for a target with `setup` (the VIPs, their checks and
/// priorities), over `nodes` nodes.
pub fn rule(target: Target, setup: Setup, nodes: usize) -> Rule {
    let caps = target.capabilities();
    Rule {
        vips: vips(target)
            .into_iter()
            .enumerate()
            .map(|(i, ip)| VipRule {
                ip,
                // The first group has the check and the preferred node.
                checked: caps.standalone && i == 0,
                // In Kubernetes the second VIP is the `Local` Service's.
                local: caps.kubernetes && i == 1,
                priorities: (1..=nodes)
                    .map(|n| match setup.preferred {
                        Some(p) if p == n && i == 0 && caps.standalone => 110,
                        _ => 100,
                    })
                    .collect(),
            })
            .collect(),
        names: (1..=nodes).map(|n| format!("node{n}")).collect(),
        preempt_delay: if caps.standalone {
            PREEMPT_DELAY
        } else {
            Duration::ZERO
        },
    }
}

/// The swimlb speakers' group settings for node `n`: the first group gets a preemption delay,
/// the priorities of `setup` and a health check on a flag file; a second group serves the
/// second VIP with neither.
fn swimlb_groups(setup: Setup, dir: &std::path::Path, name: &str) -> String {
    let priority = match setup.preferred {
        Some(p) => format!("    priority: {{node{p}: 110, default: 100}}\n"),
        None => String::new(),
    };
    format!(
        "    preemptDelay: {}ms\n{priority}    checks:\n      - {{name: flag, exec: [test, -e, \"{}\"], interval: 300ms, timeout: 300ms, rise: 1, fall: 1, weight: 0}}\n  - name: vip2\n    addresses: [{}]\n    interface: eth0\n    preemptDelay: {}ms\n",
        PREEMPT_DELAY.as_millis(),
        driver::flag_path(dir, name).display(),
        netns::vip_v4(1),
        PREEMPT_DELAY.as_millis(),
    )
}

fn make_daemons(
    lab: &mut Lab,
    options: &Options,
    setup: Setup,
    progress: &mut dyn FnMut(&str),
) -> Result<ChaosDaemons> {
    Ok(match options.target {
        Target::Swimlb => {
            let mut d = SwimlbDaemons::new(lab, options.program.clone())?;
            for node in &lab.nodes {
                std::fs::write(driver::flag_path(d.dir(), &node.name), "")?;
                d.group_extra
                    .insert(node.index, swimlb_groups(setup, d.dir(), &node.name));
            }
            ChaosDaemons::Swimlb(d)
        }
        Target::KeepalivedFast => {
            ChaosDaemons::Keepalived(KeepalivedDaemons::new(lab, Tuning::Fast))
        }
        // On real nodes: kubelet, containerd and kube-proxy in each node namespace.
        Target::SwimlbKubernetes | Target::Metallb => {
            let implementation = match options.target {
                Target::Metallb => daemons::Implementation::Metallb,
                _ => daemons::Implementation::SwimlbKubernetes,
            };
            let d = RealDaemons::start(lab, implementation, progress)?;
            driver::local_service(d.cluster().plane.admin(), lab)?;
            ChaosDaemons::Real(Box::new(d))
        }
    })
}

/// The `namespace/name` of each VIP's Service (Kubernetes; empty elsewhere).
fn vip_services(target: Target) -> Vec<String> {
    if !target.capabilities().kubernetes {
        return Vec::new();
    }
    [kubelab::SERVICE, driver::LOCAL_SERVICE]
        .iter()
        .map(|name| format!("{}/{name}", kubelab::APPS))
        .collect()
}

/// What a run will do, fixed before the lab starts: the faults in the order they are due, their
/// steps, and the rule the checker holds the daemons to.
struct Plan {
    setup: Setup,
    faults: Vec<Fault>,
    steps: Vec<schedule::Action>,
    rule: Rule,
    replay: String,
}

impl Plan {
    /// The seed's setup and schedule, plus the injected faults.
    fn new(options: &Options) -> Plan {
        let target = options.target;
        let setup = schedule::setup(options.seed, options.nodes);
        let mut faults = if options.scheduled {
            schedule::schedule(options.seed, options.duration, options.nodes, target)
        } else {
            Vec::new()
        };
        faults.extend(options.injected.iter().copied());
        faults.sort_by_key(|f| (f.at, f.end()));
        let steps = schedule::actions(&faults, options.nodes);
        let replay = format!(
            "swimlb-lab chaos --impl {} --seed {} --duration {} --nodes {}",
            target.as_str(),
            options.seed,
            options.duration.as_secs(),
            options.nodes
        );
        Plan {
            setup,
            faults,
            steps,
            rule: rule(target, setup, options.nodes),
            replay,
        }
    }
}

/// The lab with a responder and the daemons on every node, converged on the first VIP `vip`:
/// no fault is taken in a lab that never converged.
fn start_converged(
    options: &Options,
    setup: Setup,
    vip: Ipv4Addr,
    progress: &mut dyn FnMut(&str),
) -> Result<(Lab, Vec<Worker>, ChaosDaemons)> {
    if options.target.capabilities().kubernetes {
        realnode::cleanup_stale();
    }
    let mut lab = Lab::create(options.nodes).context("building the lab")?;
    let mut responders: Vec<Worker> = Vec::new();
    for node in lab.nodes.clone() {
        responders.extend(probe::spawn_responder(&node.netns, &node.name)?);
    }
    let mut daemons = make_daemons(&mut lab, options, setup, progress)?;
    for i in 1..=options.nodes {
        daemons.as_dyn().start(&mut lab, i)?;
    }
    let prober = Prober::start(
        &lab.client_netns,
        SocketAddr::from((vip, PROBE_PORT)),
        Duration::from_millis(10),
    )?;
    let settled = trial::settle(&lab, daemons.as_dyn(), &prober, progress)?;
    prober.stop();
    if let Err(reason) = settled {
        bail!(
            "the lab did not converge within {:?} ({reason}); no fault taken",
            trial::CONVERGE_LIMIT
        );
    }
    // Every other VIP answered too, or its first second counts as dark.
    for vip in vips(options.target).iter().skip(1) {
        wait_answered(&lab, *vip)?;
    }
    Ok((lab, responders, daemons))
}

/// Waits (at most [`trial::CONVERGE_LIMIT`]) until some node answers ARP for `vip`.
fn wait_answered(lab: &Lab, vip: Ipv4Addr) -> Result<()> {
    let deadline = Instant::now() + trial::CONVERGE_LIMIT;
    loop {
        let claims =
            probe::arp_claims(&lab.client_netns, vip, None, 2, Duration::from_millis(200))?;
        if !claims.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "nobody answered ARP for {vip} within {:?}; no fault taken",
                trial::CONVERGE_LIMIT
            );
        }
    }
}

/// The fault loop: the plan's steps on time, the daemons' processes checked every second, and
/// with `--until-violation` the invariants every 2 s.
struct Drive {
    driver: Driver,
    executed: Vec<Executed>,
    errors: Vec<String>,
    /// Faults and roll steps skipped, with why.
    skipped: Vec<String>,
    /// Late restarts: the node, the kill's end step (recorded once the speaker runs) and when
    /// it was asked.
    late: BTreeMap<usize, (Executed, Duration)>,
    late_restarts: Vec<(usize, Duration, Option<Duration>)>,
    watch: ProcessWatch,
    /// On real nodes: the machine's starvation of the speakers.
    starve: StarveWatch,
    /// When each node's daemon last (re)started, since the start of the run.
    started: Vec<Duration>,
    stopped_early: bool,
}

impl Drive {
    fn new(nodes: usize) -> Drive {
        Drive {
            driver: Driver::new(nodes),
            executed: Vec::new(),
            errors: Vec::new(),
            skipped: Vec::new(),
            late: BTreeMap::new(),
            late_restarts: Vec::new(),
            watch: ProcessWatch::default(),
            starve: StarveWatch::default(),
            started: vec![Duration::ZERO; nodes],
            stopped_early: false,
        }
    }

    /// Runs the plan until its end (every step is due before it) or the first violation;
    /// returns how long it ran.
    fn run(
        &mut self,
        lab: &mut Lab,
        daemons: &mut ChaosDaemons,
        plan: &Plan,
        observers: &Observers,
        options: &Options,
        progress: &mut dyn FnMut(&str),
    ) -> Duration {
        let t0 = observers.t0;
        let status = options.target.capabilities().status;
        let (mut last_check, mut last_memory, mut last_eval, mut last_starve) = (
            Duration::ZERO,
            Duration::ZERO,
            Duration::ZERO,
            Duration::ZERO,
        );
        let end = options.duration;
        let mut next = plan.steps.iter().peekable();
        loop {
            let now = t0.elapsed();
            if now >= end && next.peek().is_none() {
                break;
            }
            if let Some(action) = next.peek()
                && action.at <= now
            {
                let action = **action;
                next.next();
                self.step(lab, daemons, &plan.faults, action, t0, progress);
                continue;
            }
            if now >= last_check + Duration::from_secs(1) {
                last_check = now;
                self.poll_late(daemons, t0, progress);
                let memory = now >= last_memory + Duration::from_secs(5);
                if memory {
                    last_memory = now;
                }
                let started = &self.started;
                self.watch
                    .check(lab, daemons, &self.driver, started, now, memory);
            }
            if matches!(daemons, ChaosDaemons::Real(_)) && now >= last_starve + STARVE_ROUND {
                last_starve = now;
                for n in 1..=options.nodes {
                    let waits = self.driver.running[n - 1]
                        .then(|| daemons.as_dyn().pid(lab, n))
                        .flatten()
                        .map(crate::upgrade::watch::thread_waits);
                    self.starve.read(n, waits, now);
                }
            }
            if options.until_violation && now >= last_eval + Duration::from_secs(2) {
                last_eval = now;
                let obs = observers.snapshot(lab, now.saturating_sub(Duration::from_secs(2)));
                let (faults, executed) = self.world_faults(&plan.faults);
                let world = World::new(&faults, &executed, options.nodes);
                let violated = invariants::evaluate(&plan.rule, &world, &obs, status)
                    .iter()
                    .chain(&self.watch.found)
                    .any(|v| !v.excused);
                if violated {
                    self.stopped_early = true;
                    break;
                }
            }
            let wait = next
                .peek()
                .map_or(end.saturating_sub(now), |a| a.at.saturating_sub(now))
                .min(Duration::from_millis(50));
            std::thread::sleep(wait);
        }
        t0.elapsed()
    }

    /// Executes one step and tells `progress`. A step is recorded when it began, except one
    /// that ends a fault or starts a daemon: that one counts from when it was done (an API
    /// server is back once it is ready, not when it was asked to start). Both times are kept:
    /// the settled checks wait for the world to be still, and it may change at any moment of
    /// a step.
    fn step(
        &mut self,
        lab: &mut Lab,
        daemons: &mut ChaosDaemons,
        faults: &[Fault],
        action: schedule::Action,
        t0: Instant,
        progress: &mut dyn FnMut(&str),
    ) {
        let fault = faults[action.fault];
        let began = t0.elapsed();
        let outcome = self
            .driver
            .step(lab, daemons, action.fault, &fault, action.step);
        let done = t0.elapsed();
        let at = match action.step {
            Step::Undo | Step::Roll { up: true, .. } => done,
            Step::Apply | Step::Rotate { .. } | Step::Roll { up: false, .. } => began,
        };
        let executed = Executed {
            at,
            began,
            done,
            fault: action.fault,
            step: action.step,
        };
        let text = format!("{} ({:?})", fault.kind.describe(), action.step);
        let line =
            |word: &str, what: &str| format!("{:>9.3} s  {word:<6} {what}", at.as_secs_f64());
        match outcome {
            Ok(Stepped::Done) => {
                self.executed.push(executed);
                if let Some(node) = started_node(fault.kind, action.step) {
                    self.started[node - 1] = at;
                }
                progress(&line(
                    step_word(action.step),
                    &step_text(&fault, action.step),
                ));
            }
            Ok(Stepped::Skipped(why)) => {
                progress(&line("skip", &format!("{text}: {why}")));
                self.skipped
                    .push(format!("{:.3} s: {text}: {why}", at.as_secs_f64()));
            }
            Ok(Stepped::SkippedEnd) => {
                progress(&line("skip", &format!("{text}: its start was skipped")))
            }
            Ok(Stepped::Late(node)) => {
                progress(&line(
                    "late",
                    &format!(
                        "{text}: node{node}'s kubelet has not started the speaker again within {:?} (its restart back-off); the run goes on",
                        driver::RESTART_WAIT
                    ),
                ));
                self.late.insert(node, (executed, done));
            }
            Err(e) => {
                // A failed step counts as done in the checker's world (its error is reported).
                self.executed.push(executed);
                if let Some(node) = started_node(fault.kind, action.step) {
                    self.started[node - 1] = at;
                }
                let text = format!("{text}: {e:#}");
                progress(&line("error", &text));
                self.errors.push(text);
            }
        }
    }

    /// The late restarts the kubelets have done since the last round: each kill's end is
    /// recorded now, when the speaker runs.
    fn poll_late(&mut self, daemons: &ChaosDaemons, t0: Instant, progress: &mut dyn FnMut(&str)) {
        if self.late.is_empty() {
            return;
        }
        for node in self.driver.poll_late(daemons) {
            let now = t0.elapsed();
            let Some((mut executed, asked)) = self.late.remove(&node) else {
                continue;
            };
            executed.at = now;
            executed.done = now;
            self.executed.push(executed);
            self.started[node - 1] = now;
            self.late_restarts.push((node, asked, Some(now)));
            progress(&format!(
                "{:>9.3} s  late   node{node}'s speaker started again by its kubelet, {:.1} s after it was continued",
                now.as_secs_f64(),
                (now - asked).as_secs_f64()
            ));
        }
    }

    /// The plan's faults and steps with the measured starvations after them: what the checker
    /// judges by.
    fn world_faults(&self, planned: &[Fault]) -> (Vec<Fault>, Vec<Executed>) {
        let (measured, steps) = self.starve.faults(planned.len());
        let mut faults = planned.to_vec();
        faults.extend(measured);
        let mut executed = self.executed.clone();
        executed.extend(steps);
        executed.sort_by_key(|e| e.at);
        (faults, executed)
    }

    /// Undoes every fault still applied, recorded at `ran`, and checks the processes once more.
    fn finish(&mut self, lab: &mut Lab, daemons: &mut ChaosDaemons, ran: Duration) {
        let (undone, undo_errors) = self.driver.undo_all(lab, daemons);
        for index in undone {
            self.executed.push(Executed {
                at: ran,
                began: ran,
                done: ran,
                fault: index,
                step: Step::Undo,
            });
        }
        self.errors.extend(undo_errors);
        for (node, (_, asked)) in std::mem::take(&mut self.late) {
            self.late_restarts.push((node, asked, None));
        }
        self.watch
            .check(lab, daemons, &self.driver, &self.started, ran, true);
    }
}

/// Runs a chaos run; `progress` hears the lab's start and every fault step as it happens.
pub fn run(options: &Options, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    if !(3..=5).contains(&options.nodes) {
        bail!("chaos runs 3 to 5 nodes, not {}", options.nodes);
    }
    driver::cleanup_stale_cgroups();
    let target = options.target;
    let caps = target.capabilities();
    let plan = Plan::new(options);
    let vip_list = vips(target);
    let (mut lab, responders, mut daemons) =
        start_converged(options, plan.setup, vip_list[0], progress)?;
    progress(&format!(
        "chaos ({}): lab converged; {} faults over {} s (seed {}, {} nodes{})",
        target.as_str(),
        plan.faults.len(),
        options.duration.as_secs(),
        options.seed,
        options.nodes,
        plan.setup
            .preferred
            .map(|p| format!(", node{p} preferred by priority"))
            .unwrap_or_default()
    ));

    let records = match &daemons {
        ChaosDaemons::Real(d) => {
            let (api, namespace) = d.cluster().implementation.config_api();
            Some(kubelab::Records::new(&d.cluster().plane, api, namespace))
        }
        _ => None,
    };
    let observers = Observers::start(&lab, &vip_list, options.duration, caps.status, records)?;
    let mut drive = Drive::new(options.nodes);
    let ran = drive.run(&mut lab, &mut daemons, &plan, &observers, options, progress);
    drive.finish(&mut lab, &mut daemons, ran);
    let obs = observers.finish(&lab, ran);
    drop(responders);
    // The daemons first: MetalLB's kubelets stop their containers inside the namespaces.
    drop(daemons);
    lab.teardown();

    let (world_faults, world_executed) = drive.world_faults(&plan.faults);
    let world = World::new(&world_faults, &world_executed, options.nodes);
    let mut violations = invariants::evaluate(&plan.rule, &world, &obs, caps.status);
    violations.extend(records::evaluate(
        &world,
        &obs,
        &vip_services(target),
        &plan.rule.names,
    ));
    violations.extend(drive.watch.found.iter().cloned());
    let (leaks, memory) = drive.watch.leaks(&plan.rule.names, ran);
    if caps.status {
        violations.extend(leaks);
    }
    violations.sort_by_key(|v| (v.at, v.invariant));

    let timeline = timeline(&plan.faults, &drive.executed, &violations, &vip_list);
    let (per_invariant, excused) = per_invariant(caps, &violations);
    let probes = obs.vips.iter().map(|v| v.probes.len()).sum();
    let lost_probes = obs
        .vips
        .iter()
        .map(|v| v.probes.iter().filter(|p| !p.answered).count())
        .sum();
    Ok(Report {
        implementation: target.as_str(),
        seed: options.seed,
        duration_s: options.duration.as_secs(),
        ran_s: ran.as_secs_f64(),
        nodes: options.nodes,
        setup: plan.setup,
        stopped_early: drive.stopped_early,
        violations_per_invariant: per_invariant,
        excused_per_invariant: excused,
        faults_per_kind: per_kind(&plan.faults, &drive.executed),
        violations,
        dual_episodes: invariants::dual_episodes(&obs),
        timeline,
        faults: plan.faults,
        probes,
        lost_probes,
        memory,
        errors: drive.errors,
        skipped: drive.skipped,
        late_restarts: drive
            .late_restarts
            .iter()
            .map(|(node, asked, running)| LateRestart {
                node: plan.rule.names[node - 1].clone(),
                asked_s: asked.as_secs_f64(),
                running_s: running.map(|t| t.as_secs_f64()),
            })
            .collect(),
        measured_starvations: drive
            .starve
            .found
            .iter()
            .map(|(node, from, to, ms)| MeasuredStarvation {
                node: plan.rule.names[node - 1].clone(),
                from_s: from.as_secs_f64(),
                to_s: to.as_secs_f64(),
                longest_wait_ms: *ms,
            })
            .collect(),
        replay: plan.replay,
    })
}

/// Every executed step and every violation, in time order.
fn timeline(
    faults: &[Fault],
    executed: &[Executed],
    violations: &[Violation],
    vip_list: &[Ipv4Addr],
) -> Vec<TimelineEntry> {
    let mut timeline: Vec<TimelineEntry> = executed
        .iter()
        .map(|e| {
            let f = &faults[e.fault];
            TimelineEntry {
                at_ms: e.at.as_millis() as u64,
                what: step_word(e.step),
                text: step_text(f, e.step),
            }
        })
        .collect();
    timeline.extend(violations.iter().map(|v| TimelineEntry {
        at_ms: v.at.as_millis() as u64,
        what: if v.excused { "excused" } else { "VIOLATION" },
        text: format!(
            "{}{}: {}",
            v.invariant.as_str(),
            v.vip
                .map(|i| format!(" {}", vip_list.get(i).map_or(String::new(), |ip| ip.to_string())))
                .unwrap_or_default(),
            v.detail
        ),
    }));
    timeline.sort_by_key(|e| e.at_ms);
    timeline
}

/// Violations and excused ones per invariant; every invariant that applies is listed, at 0 when
/// it held (without `/status`, only dual, dark and crash apply; the record invariants only in
/// Kubernetes).
fn per_invariant(
    caps: schedule::Capabilities,
    violations: &[Violation],
) -> (BTreeMap<&'static str, usize>, BTreeMap<&'static str, usize>) {
    let mut per_invariant: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut excused: BTreeMap<&'static str, usize> = BTreeMap::new();
    for inv in Invariant::ALL {
        let applies = match inv {
            Invariant::Dual | Invariant::Dark | Invariant::Crash => true,
            Invariant::StaleRecord | Invariant::DoubleAllocation => caps.kubernetes,
            _ => caps.status,
        };
        if applies {
            per_invariant.insert(inv.as_str(), 0);
        }
    }
    for v in violations {
        let map = if v.excused {
            &mut excused
        } else {
            &mut per_invariant
        };
        *map.entry(v.invariant.as_str()).or_insert(0) += 1;
    }
    (per_invariant, excused)
}

/// Faults applied, per kind.
fn per_kind(faults: &[Fault], executed: &[Executed]) -> BTreeMap<&'static str, usize> {
    let applied: BTreeSet<usize> = executed
        .iter()
        .filter(|e| e.step == Step::Apply)
        .map(|e| e.fault)
        .collect();
    let mut per_kind: BTreeMap<&'static str, usize> = BTreeMap::new();
    for i in &applied {
        *per_kind.entry(faults[*i].kind.as_str()).or_insert(0) += 1;
    }
    per_kind
}

/// The node whose daemon a step started: a kill's or power-off's end, a roll's start.
fn started_node(kind: FaultKind, step: Step) -> Option<usize> {
    match (kind, step) {
        (FaultKind::Kill { node } | FaultKind::PowerOff { node }, Step::Undo) => Some(node),
        (_, Step::Roll { node, up: true }) => Some(node),
        _ => None,
    }
}

fn step_word(step: Step) -> &'static str {
    match step {
        Step::Apply => "start",
        Step::Rotate { .. } | Step::Roll { .. } => "step",
        Step::Undo => "end",
    }
}

fn step_text(fault: &Fault, step: Step) -> String {
    match step {
        Step::Rotate { phase, node: 0 } => format!(
            "{}: key file {}",
            fault.kind.describe(),
            if phase == 1 {
                "holds the new key first, the old one second"
            } else {
                "holds the new key only"
            }
        ),
        Step::Rotate { node, .. } => format!("{}: node{node} reloads", fault.kind.describe()),
        Step::Roll { node, up } => format!(
            "{}: node{node}'s speaker {}",
            fault.kind.describe(),
            if up {
                "started again by its kubelet"
            } else {
                "stopped (SIGTERM, its kubelet held)"
            }
        ),
        _ => fault.kind.describe(),
    }
}
