//! A rolling upgrade of the speakers' DaemonSet across the envelope version on real nodes (a
//! real kubelet, containerd and kube-proxy each: [`crate::realnode`]), as a user runs it, under
//! the chaos checker's invariants.
//!
//! **The two images.** The project's image is built from this tree
//! ([`crate::service_failover::cluster::project_tag`]); the previous release's stand-in is the
//! same image with `SWIMLB_ENVELOPE_VERSION=2` set in its configuration (one empty layer on top:
//! [`crate::realnode::NodeImages::with_env_layer`]), the real old code path that speaks version 2
//! only and announces nothing ([`super`] says why this and not a build from the history). Every
//! node imports both.
//!
//! **The run.** The cluster of `service-failover` ([`ServiceCluster`]: three real nodes,
//! `deploy/swimlb.yaml` naming the previous image, the backend two replicas per node behind a
//! `Local` and a `Cluster` Service) is started and waited for until whole: every Node and
//! speaker Ready, every endpoint ready, and every speaker's `/status` seeing every member and
//! naming the owner the election rule names for the `Local` Service's IP. Then, with a client
//! opening a TCP connection to that IP every 10 ms (and three long-lived ones), an ARP request
//! for it every 100 ms, and the roll's observer ([`RollWatch`]) reading the Pods, the speakers'
//! processes and every `/status` every 100 ms:
//!
//! 1. `kubectl set image daemonset/swimlb-speaker speaker=<current>`: the DaemonSet's
//!    RollingUpdate (`maxUnavailable: 1`) replaces the speakers one node at a time;
//! 2. `kubectl rollout undo daemonset/swimlb-speaker` (optional): back to the previous image.
//!
//! Each phase ends once every speaker runs the phase's image and version, Ready, every
//! `/status` sees every member and names the rule's owner, and every `/metrics` reports the
//! phase's envelope version (`swimlb_gossip_envelope_version`: 3 after the upgrade, 2 after
//! the rollback), plus [`QUIET`] more, so that the checker sees the end settled.
//!
//! The checker ([`crate::migrate::checked::Timeline::evaluate`]) counts dual, dark,
//! disagreement and misplaced over the whole run, each speaker's stop and start as its faults
//! (see [`super::watch`]), and dark a second time with the ARP requests as its probes (a client
//! with a neighbour entry is still served by the old node's kube-proxy while nobody answers ARP;
//! one without waits); a speaker process that ended while its Pod was not being deleted,
//! a container restart, or a panic in a speaker's log is a crash. A speaker one of whose threads
//! waited for a CPU as long as a watcher waits is a starvation the checker knows of (see
//! [`super::watch`]); the report lists them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use tokio::time::Instant;

use super::watch::{NAMESPACE, RollWatch, Starved};
use crate::chaos::invariants::{
    self, ARP_INTERVAL, ArpSample, Invariant, Observations, Violation, VipObservations,
};
use crate::kubelab::{self, Policy};
use crate::lab::rule;
use crate::netns::{self, Lab};
use crate::probe::{ArpAnswers, ArpAsker, ProbeRecord};
use crate::service_failover::Implementation;
use crate::service_failover::client::{self, Client, Request};
use crate::service_failover::cluster::{ServiceCluster, project_tag, service_of};

/// The speakers' nodes.
pub const NODES: usize = 3;
/// What the previous release's stand-in sets in its image's configuration.
pub const PREVIOUS_ENV: [(&str, &str); 1] = [("SWIMLB_ENVELOPE_VERSION", "2")];
/// The envelope version the previous release speaks.
pub const PREVIOUS_VERSION: u8 = 2;
/// The envelope version this build speaks in a mesh of its own.
pub const CURRENT_VERSION: u8 = 3;
/// How long a phase may take, from the command to the mesh settled on its version.
pub const ROLL_LIMIT: Duration = Duration::from_secs(150);
/// How long the speakers may take to settle before the roll.
pub const SETTLE_LIMIT: Duration = Duration::from_secs(60);
/// How long a phase is observed after it settled: longer than the checker's settle time.
pub const QUIET: Duration = Duration::from_secs(4);
/// The observer's period.
const ROUND: Duration = Duration::from_millis(100);
/// ARP requests the client may send (one every [`ARP_INTERVAL`]).
const ARP_REQUESTS: usize = 100_000;
/// The speakers' DaemonSet.
const DAEMONSET: &str = "daemonset/swimlb-speaker";
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The previous release's stand-in's image reference.
pub fn previous_tag() -> String {
    format!("localhost/swimlb/swimlb:{VERSION}-previous")
}

/// What to run.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Also roll back (`kubectl rollout undo`) after the upgrade.
    pub rollback: bool,
    /// Where the JSON goes.
    pub json: Option<PathBuf>,
}

/// One phase of the run (the upgrade, the rollback).
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    /// `upgrade` or `rollback`.
    pub name: &'static str,
    /// The command, as a user types it (without the namespace flag).
    pub command: String,
    /// The image the speakers run after it.
    pub image: String,
    /// The envelope version the mesh speaks after it.
    pub version: u8,
    /// From the command to the mesh settled on `version`.
    pub settled_s: f64,
    /// The nodes in the order their speakers were stopped.
    pub stopped: Vec<String>,
    /// New connections' requests sent in the phase.
    pub requests: usize,
    /// Of those, the ones that failed.
    pub lost: usize,
    /// The longest run of failed requests: from the first one's sending to the next
    /// successful one's (0: none failed).
    pub longest_dark_ms: f64,
    /// When it began, since the observers started.
    pub longest_dark_at_s: Option<f64>,
    /// The longest run of ARP requests nobody answered (0: none).
    pub longest_arp_silence_ms: f64,
    /// When it began, since the observers started.
    pub longest_arp_silence_at_s: Option<f64>,
    /// Stretches of ARP requests answered by two MACs ([`invariants::dual_episodes`]).
    pub dual_episodes: usize,
    /// The longest of them (0: none).
    pub longest_dual_ms: f64,
    /// Long-lived connections opened again after a failure.
    pub long_lived_reopened: usize,
    /// `kubectl rollout status`'s last line at the end.
    pub rollout_status: String,
}

/// The whole run.
#[derive(Debug, Serialize)]
pub struct Outcome {
    /// Nodes.
    pub nodes: usize,
    /// The `Local` Service's IP the client probed.
    pub vip: String,
    /// The previous release's stand-in's image.
    pub previous_image: String,
    /// The current image.
    pub current_image: String,
    /// The phases, in order.
    pub phases: Vec<Phase>,
    /// Per node, the envelope version each speaker process it ran was started with.
    pub started: BTreeMap<String, Vec<u8>>,
    /// Per node, the mesh's envelope version as its speakers reported it, each change once.
    pub mesh_versions: BTreeMap<String, Vec<u8>>,
    /// What the checker found (excused ones included).
    pub violations: Vec<Violation>,
    /// Crashes: speakers that ended unasked, container restarts, panics in the logs.
    pub crashes: Vec<String>,
    /// The speakers' starvations the observer measured (faults the checker knows of).
    pub starvations: Vec<Starved>,
}

impl Outcome {
    /// Counted violations and crashes.
    pub fn counted(&self) -> usize {
        self.violations.iter().filter(|v| !v.excused).count() + self.crashes.len()
    }

    /// A table of the phases, then the checker's findings.
    pub fn text(&self) -> String {
        let mut out = format!(
            "{:<9} {:>9} {:<18} {:>8} {:>5} {:>15} {:>15} {:>8} {:>8}\n",
            "phase",
            "settled",
            "stopped",
            "requests",
            "lost",
            "dark ms (at s)",
            "ARP sil (at s)",
            "dual ms",
            "reopened"
        );
        let at = |ms: f64, at: Option<f64>| match at {
            Some(at) => format!("{ms:.0} ({at:.1})"),
            None => format!("{ms:.0}"),
        };
        for p in &self.phases {
            out.push_str(&format!(
                "{:<9} {:>8.1}s {:<18} {:>8} {:>5} {:>15} {:>15} {:>8.0} {:>8}\n",
                p.name,
                p.settled_s,
                p.stopped.join(","),
                p.requests,
                p.lost,
                at(p.longest_dark_ms, p.longest_dark_at_s),
                at(p.longest_arp_silence_ms, p.longest_arp_silence_at_s),
                p.longest_dual_ms,
                p.long_lived_reopened
            ));
        }
        out.push_str(&format!(
            "started: {:?}\nmesh versions: {:?}\n",
            self.started, self.mesh_versions
        ));
        let starved: f64 = self.starvations.iter().map(|s| s.to_s - s.from_s).sum();
        out.push_str(&format!(
            "starvations (a speaker thread waiting for a CPU {} ms or more over two rounds): \
             {}, {starved:.1} s summed over the speakers\n",
            super::watch::STARVED.as_millis(),
            self.starvations.len()
        ));
        for s in &self.starvations {
            out.push_str(&format!(
                "  node{} {:.2}-{:.2} s, {:.0} ms\n",
                s.node, s.from_s, s.to_s, s.longest_wait_ms
            ));
        }
        out.push_str(&format!("counted violations: {}\n", self.counted()));
        for v in &self.violations {
            out.push_str(&format!("  {v}\n"));
        }
        for c in &self.crashes {
            out.push_str(&format!("  crash: {c}\n"));
        }
        out
    }
}

/// Runs the upgrade (and the rollback); `log` gets a line per step.
pub fn run(options: &Options, log: &mut dyn FnMut(&str)) -> Result<Outcome> {
    netns::require_root("upgrade on real nodes");
    let previous = previous_tag();
    let mut cluster = ServiceCluster::start_with(
        NODES,
        Implementation::Swimlb,
        Some((&previous, &PREVIOUS_ENV)),
        log,
    )?;
    let current = project_tag();
    let (_, ip) = service_of(Policy::Local);
    let names: Vec<&str> = cluster.lab.nodes.iter().map(|n| n.name.as_str()).collect();
    let expected = rule::metallb_owner(&names, IpAddr::V4(ip)).context("no node")?;
    kubelab::wait_for_owner(&cluster.lab, &ip.to_string(), SETTLE_LIMIT, |o| {
        o == Some(expected.as_str())
    })
    .map_err(|views| {
        anyhow::anyhow!(
            "the speakers do not all see every member and name {expected} for {ip} within \
             {SETTLE_LIMIT:?}: {views:?}"
        )
    })?;
    log(&format!("the mesh is whole, {expected} owns {ip}"));
    let roots = cluster
        .real
        .nodes
        .iter()
        .map(|n| n.cgroup_root().to_string())
        .collect();
    let t0 = Instant::now();
    let client = Client::start(&cluster.lab.client_netns, ip)?;
    let asker = ArpAsker::start(&cluster.lab.client_netns, ip, ARP_INTERVAL, ARP_REQUESTS)?;
    let arp_from = Instant::now();
    let mut watch = RollWatch::start(t0, roots, ip)?;
    let mut steps = vec![(
        "upgrade",
        format!("set image {DAEMONSET} speaker={current}"),
        current.clone(),
        CURRENT_VERSION,
    )];
    if options.rollback {
        steps.push((
            "rollback",
            format!("rollout undo {DAEMONSET}"),
            previous.clone(),
            PREVIOUS_VERSION,
        ));
    }
    let mut spans = Vec::new();
    // The observers' first seconds: the checker's start-up grace over, a calm before.
    observe_for(&mut watch, &mut cluster, QUIET, log)?;
    for (name, command, image, version) in steps {
        let mut args: Vec<&str> = command.split(' ').collect();
        args.extend(["--namespace", NAMESPACE]);
        let began = Instant::now();
        let stopped_before = watch.stopped.len();
        cluster.plane.kubectl().run(&args, None)?;
        log(&format!("{name}: kubectl {command}"));
        let settled = roll(&mut watch, &mut cluster, &image, version, &expected, log)
            .with_context(|| format!("the {name}"))?;
        log(&format!(
            "{name}: settled on version {version} after {:.1} s",
            settled.as_secs_f64()
        ));
        observe_for(&mut watch, &mut cluster, QUIET, log)?;
        let status = cluster.plane.kubectl().run(
            &[
                "rollout",
                "status",
                DAEMONSET,
                "--namespace",
                NAMESPACE,
                "--timeout=30s",
            ],
            None,
        )?;
        spans.push(Span {
            name,
            command: format!("kubectl {command}"),
            image,
            version,
            began,
            ended: Instant::now(),
            settled,
            stopped: watch.stopped[stopped_before..].to_vec(),
            status: status.lines().last().unwrap_or_default().to_string(),
        });
    }
    let record = client.stop();
    let arp = asker.stop();
    finish(&cluster, watch, spans, (record, arp, arp_from), options)
}

/// One phase's times, before its figures.
struct Span {
    name: &'static str,
    command: String,
    image: String,
    version: u8,
    began: Instant,
    ended: Instant,
    settled: Duration,
    stopped: Vec<usize>,
    status: String,
}

/// The checker's verdict, the crashes and each phase's figures; the JSON written.
fn finish(
    cluster: &ServiceCluster,
    watch: RollWatch,
    spans: Vec<Span>,
    (record, arp, arp_from): (client::Record, Vec<ArpAnswers>, Instant),
    options: &Options,
) -> Result<Outcome> {
    let lab = &cluster.lab;
    let (_, ip) = service_of(Policy::Local);
    let mut new = record.new.clone();
    new.sort_by_key(|r| r.sent);
    let violations = checked(&watch, lab, &new, (&arp, arp_from));
    let t0 = watch.timeline_start();
    let crashes = crashes(cluster, &watch);
    let name = |n: usize| lab.nodes[n - 1].name.clone();
    let phases = spans
        .iter()
        .map(|s| Phase {
            name: s.name,
            command: s.command.clone(),
            image: s.image.clone(),
            version: s.version,
            settled_s: s.settled.as_secs_f64(),
            stopped: s.stopped.iter().map(|n| name(*n)).collect(),
            requests: new.iter().filter(|r| within(r.sent, s)).count(),
            lost: new.iter().filter(|r| within(r.sent, s) && !r.ok).count(),
            longest_dark_ms: longest_failure(&new, s).0.as_secs_f64() * 1e3,
            longest_dark_at_s: longest_failure(&new, s)
                .1
                .map(|at| at.saturating_duration_since(t0).as_secs_f64()),
            longest_arp_silence_ms: longest_silence(&arp, arp_from, s).0.as_secs_f64() * 1e3,
            longest_arp_silence_at_s: longest_silence(&arp, arp_from, s)
                .1
                .map(|at| (arp_from + at).saturating_duration_since(t0).as_secs_f64()),
            dual_episodes: duals(lab, &arp, arp_from, s).len(),
            longest_dual_ms: duals(lab, &arp, arp_from, s)
                .into_iter()
                .max()
                .unwrap_or_default()
                .as_secs_f64()
                * 1e3,
            long_lived_reopened: record
                .long
                .iter()
                .flatten()
                .filter(|r| r.reopened && within(r.sent, s))
                .count(),
            rollout_status: s.status.clone(),
        })
        .collect();
    let by_name = |v: &[Vec<u8>]| -> BTreeMap<String, Vec<u8>> {
        lab.nodes
            .iter()
            .zip(v)
            .map(|(n, v)| (n.name.clone(), v.clone()))
            .collect()
    };
    let outcome = Outcome {
        nodes: lab.nodes.len(),
        vip: ip.to_string(),
        previous_image: previous_tag(),
        current_image: project_tag(),
        phases,
        started: by_name(&watch.started),
        mesh_versions: by_name(&watch.mesh_versions),
        violations,
        crashes,
        starvations: watch.starvations.clone(),
    };
    if let Some(path) = &options.json {
        std::fs::write(path, serde_json::to_string_pretty(&outcome)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(outcome)
}

/// The checker's violations over the run: dual, dark, disagreement and misplaced with the
/// client's requests on new connections (`new`, in the order sent) as probes, then dark again
/// with each ARP request as a probe, answered when any MAC replied (the requests go on through
/// the old node's kube-proxy while nobody answers ARP; a client resolving the address waits).
fn checked(
    watch: &RollWatch,
    lab: &Lab,
    new: &[Request],
    (arp, arp_from): (&[ArpAnswers], Instant),
) -> Vec<Violation> {
    let (_, ip) = service_of(Policy::Local);
    let probes: Vec<ProbeRecord> = new
        .iter()
        .enumerate()
        .map(|(seq, r)| ProbeRecord {
            seq: seq as u64,
            sent: r.sent,
            answer: r.ok.then(|| (String::new(), r.done)),
        })
        .collect();
    let rule = || (vec![100; lab.nodes.len()], Duration::ZERO);
    let (priorities, delay) = rule();
    let mut violations =
        watch
            .timeline
            .evaluate(lab, ip, priorities, delay, (&probes, arp, arp_from));
    let asked: Vec<ProbeRecord> = arp
        .iter()
        .enumerate()
        .map(|(seq, a)| ProbeRecord {
            seq: seq as u64,
            sent: arp_from + a.at,
            answer: (!a.macs.is_empty()).then(|| (String::new(), arp_from + a.at)),
        })
        .collect();
    let (priorities, delay) = rule();
    let by_arp = watch
        .timeline
        .evaluate(lab, ip, priorities, delay, (&asked, arp, arp_from));
    violations.extend(
        by_arp
            .into_iter()
            .filter(|v| v.invariant == Invariant::Dark)
            .map(|v| Violation {
                detail: format!("by ARP: {}", v.detail),
                ..v
            }),
    );
    violations.sort_by_key(|v| (v.at, v.invariant));
    violations
}

/// The crashes: the observer's (a speaker that ended unasked), the container restarts of the
/// last Pods, and panics in the speakers' logs (copied once more first).
fn crashes(cluster: &ServiceCluster, watch: &RollWatch) -> Vec<String> {
    let lab = &cluster.lab;
    let mut crashes = watch.crashes.clone();
    for (node, pod) in lab.nodes.iter().zip(&watch.pods) {
        if let Some(pod) = pod
            && pod.restarts > 0
        {
            crashes.push(format!(
                "{}'s speaker container restarted {} times",
                node.name, pod.restarts
            ));
        }
    }
    keep_logs(cluster);
    crashes.extend(panics_in(&logs_dir(lab)));
    crashes
}

fn within(t: Instant, s: &Span) -> bool {
    t >= s.began && t <= s.ended
}

/// One round of the observer: its events logged (and the speakers' logs kept when there are
/// any), the nodes checked still running.
fn observe_once(
    watch: &mut RollWatch,
    cluster: &mut ServiceCluster,
    log: &mut dyn FnMut(&str),
) -> Result<()> {
    watch.round(&cluster.lab, cluster.plane.admin());
    if !watch.events.is_empty() {
        keep_logs(cluster);
    }
    watch.events.drain(..).for_each(|e| log(&e));
    cluster.real.check_running()
}

/// Rounds of the observer for `time`.
fn observe_for(
    watch: &mut RollWatch,
    cluster: &mut ServiceCluster,
    time: Duration,
    log: &mut dyn FnMut(&str),
) -> Result<()> {
    let end = Instant::now() + time;
    while Instant::now() < end {
        let round = Instant::now();
        observe_once(watch, cluster, log)?;
        std::thread::sleep(ROUND.saturating_sub(round.elapsed()));
    }
    Ok(())
}

/// Observes until the phase is done (see the module's documentation), at most
/// [`ROLL_LIMIT`]; returns how long it took.
fn roll(
    watch: &mut RollWatch,
    cluster: &mut ServiceCluster,
    image: &str,
    version: u8,
    owner: &str,
    log: &mut dyn FnMut(&str),
) -> Result<Duration> {
    let began = Instant::now();
    let n = cluster.lab.nodes.len();
    loop {
        let round = Instant::now();
        observe_once(watch, cluster, log)?;
        let pods_done = watch.pods.iter().all(|p| {
            p.as_ref()
                .is_some_and(|p| p.image == image && p.ready && !p.deleting)
        });
        let views_done = watch.views.iter().all(|v| {
            v.as_ref()
                .is_some_and(|(o, m)| o.as_deref() == Some(owner) && *m == n)
        });
        let versions_done = watch.versions.iter().all(|v| *v == Some(version));
        if pods_done && views_done && versions_done && watch.all_running(version) {
            return Ok(began.elapsed());
        }
        if began.elapsed() > ROLL_LIMIT {
            bail!(
                "not settled on {image} (version {version}, {owner} owning) within \
                 {ROLL_LIMIT:?}: Pods {:?}; views {:?}; versions {:?}; speakers {}",
                watch.pods,
                watch.views,
                watch.versions,
                watch.states()
            );
        }
        std::thread::sleep(ROUND.saturating_sub(round.elapsed()));
    }
}

/// The longest run of failed requests sent in `s` (sorted by sending): from the first failed
/// one's sending to the next successful one's, or one period past the last; and when it began.
fn longest_failure(requests: &[Request], s: &Span) -> (Duration, Option<Instant>) {
    let mut longest = (Duration::ZERO, None);
    let mut run: Option<Instant> = None;
    let mut last = s.began;
    for r in requests.iter().filter(|r| within(r.sent, s)) {
        match (r.ok, run) {
            (false, None) => run = Some(r.sent),
            (true, Some(from)) => {
                longest = longest.max((r.sent - from, Some(from)));
                run = None;
            }
            _ => {}
        }
        last = r.sent;
    }
    if let Some(from) = run {
        longest = longest.max((last + client::PERIOD - from, Some(from)));
    }
    longest
}

/// The longest run of unanswered ARP requests sent in `s` (from the first to the next answered
/// one), and when it began (since the asker started).
fn longest_silence(arp: &[ArpAnswers], from: Instant, s: &Span) -> (Duration, Option<Duration>) {
    let mut longest = (Duration::ZERO, None);
    let mut run: Option<Duration> = None;
    for a in arp.iter().filter(|a| within(from + a.at, s)) {
        match (a.macs.is_empty(), run) {
            (true, None) => run = Some(a.at),
            (false, Some(first)) => {
                longest = longest.max((a.at - first, Some(first)));
                run = None;
            }
            _ => {}
        }
    }
    longest
}

/// The spans of the dual episodes whose first double answer was in `s`.
fn duals(lab: &Lab, arp: &[ArpAnswers], from: Instant, s: &Span) -> Vec<Duration> {
    let node_of = |mac: &[u8; 6]| {
        lab.nodes
            .iter()
            .find(|n| n.mac == *mac)
            .map_or(0, |n| n.index)
    };
    let samples: Vec<ArpSample> = arp
        .iter()
        .filter(|a| within(from + a.at, s))
        .map(|a| ArpSample {
            at: a.at,
            nodes: a.macs.iter().map(node_of).collect::<BTreeSet<usize>>(),
        })
        .collect();
    let horizon = samples.last().map_or(Duration::ZERO, |a| a.at);
    let obs = Observations {
        vips: vec![VipObservations {
            probes: Vec::new(),
            arp: samples,
        }],
        horizon,
        ..Observations::default()
    };
    invariants::dual_episodes(&obs)
        .into_iter()
        .map(|e| e.span)
        .collect()
}

/// Where the speakers' container logs are kept (in the lab's folder, which `SWIMLB_LAB_KEEP`
/// keeps).
pub fn logs_dir(lab: &Lab) -> PathBuf {
    lab.work_dir().join("speaker-logs")
}

/// Copies every speaker container's log from each node's Pod log folder to [`logs_dir`] (the
/// kubelet removes a Pod's logs with the Pod; a copy made when a speaker stopped outlives it).
fn keep_logs(cluster: &ServiceCluster) {
    for node in &cluster.real.nodes {
        let to = logs_dir(&cluster.lab).join(&node.name);
        let pods = std::fs::read_dir(node.dir().join("pod-logs"));
        for pod in pods.into_iter().flatten().flatten() {
            if pod.file_name().to_string_lossy().contains("swimlb-speaker") {
                copy_tree(&pod.path(), &to.join(pod.file_name()));
            }
        }
    }
}

/// Copies the files under `from` to `to` (a best effort: logs for a post-mortem).
fn copy_tree(from: &Path, to: &Path) {
    let _ = std::fs::create_dir_all(to);
    for entry in std::fs::read_dir(from).into_iter().flatten().flatten() {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            let _ = std::fs::copy(entry.path(), target);
        }
    }
}

/// Lines of the speakers' container logs under `logs` that tell of a panic.
fn panics_in(logs: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![logs.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.to_string_lossy().contains("swimlb-speaker") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                found.extend(
                    text.lines()
                        .filter(|l| l.contains("panicked"))
                        .map(|l| format!("{}: {l}", path.display())),
                );
            }
        }
    }
    found
}
