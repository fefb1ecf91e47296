//! `swimlb-lab migrate`: MetalLB serving Services on the lab's real nodes is replaced by swimlb
//! by the book's "Switching from MetalLB" (docs/src/switching/metallb.md), command for command,
//! while the client probes every Service IP; the report counts the IPs that changed, the owners
//! that moved and the probes lost.
//!
//! - The cluster is `failover`'s on real nodes ([`NodeCluster`] with [`Workload::Probe`]): a
//!   real kubelet, containerd and kube-proxy in each node namespace, MetalLB installed from
//!   its `metallb-native.yaml` (its images built from its own programs and imported into every
//!   node, its webhook left out: [`crate::realnode::metallb`]), its pool and advertisement. The
//!   Service `default/web` asks for the pool's first address, `web-1`... ask for none (MetalLB's
//!   controller picks them); each is `externalTrafficPolicy: Local` without a selector, its
//!   EndpointSlice naming each node's own address, where the lab's probe responder answers
//!   through kube-proxy. The switch starts only once every Service has its IP, every MetalLB
//!   speaker sees every member, exactly the node MetalLB's order names announces each IP, and
//!   the client's probes are answered by it.
//! - The switch is the operator's commands, run with the pinned kubectl from the client as the
//!   administrator, and the lab binary's `controller convert-metallb` for the configuration:
//!   nothing is converted by hand. MetalLB's speakers stop announcing (its `L2Advertisement`s
//!   deleted, its `ServiceL2Status` records gone) before their Pods are deleted.
//! - swimlb's Pods come from `deploy/swimlb.yaml` with only the image replaced (the project's
//!   image, on every node before the switch, as the book asks), run by the same kubelets; the
//!   switch ends when every swimlb speaker names, for every IP, the node MetalLB's order names,
//!   and each Service's `ServiceL2Status` record names it.

pub mod checked;
pub mod keepalived;
pub mod starve;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::kubelab::{self, APPS, Records, SERVICE};
use crate::lab::rule;
use crate::netns::Lab;
use crate::probe::{self, PROBE_PORT, ProbeRecord, Prober, Worker};
use crate::realnode;
use crate::realnode::metallb;
use crate::service_failover::Implementation;
use crate::service_failover::cluster::{self as nodes, NodeCluster, Workload};
use starve::Starvation;

/// How long the lab waits for each stage (a functional bound, not a measurement).
const STAGE: Duration = Duration::from_secs(180);
/// The client's probe interval for each Service IP.
const PROBE_INTERVAL: Duration = Duration::from_millis(10);
/// Probes sent this close to the end are not judged (their answers may be on the way).
const IN_FLIGHT: Duration = Duration::from_millis(500);
/// How long before another node's answers began a measured starvation explains them.
const STARVED_BEFORE: Duration = Duration::from_secs(1);
/// Answers by one other node this far apart are two episodes, each to be explained.
const EPISODE_GAP: Duration = Duration::from_secs(1);
/// How long the probes go on after the switch ended.
const TAIL: Duration = Duration::from_secs(3);
/// The pool's addresses (`kubelab::POOL`, a /30): at most this many Services.
pub const MAX_SERVICES: usize = 4;

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Nodes in the lab.
    pub nodes: usize,
    /// Services of type LoadBalancer (1 to [`MAX_SERVICES`]).
    pub services: usize,
}

/// One Service across the switch.
#[derive(Debug, Clone, Serialize)]
pub struct ServiceMove {
    /// `namespace/name`.
    pub service: String,
    /// The IP in its status under MetalLB, and after the switch.
    pub ip_before: String,
    pub ip_after: String,
    /// The node MetalLB's order names for the IP among the lab's nodes.
    pub rule_owner: String,
    /// The node that answered the client's probes before and after the switch.
    pub owner_before: String,
    pub owner_after: Option<String>,
    /// Every node that answered a probe during the switch (one when nothing moved).
    pub answered_by: Vec<String>,
    /// Each node other than the rule's owner that answered during the switch: when (the probes'
    /// send times since the switch started) and how often.
    pub others: Vec<OtherAnswers>,
    /// Probes sent from the start of the switch to its end, and those never answered.
    pub probes_sent: usize,
    pub probes_lost: usize,
}

/// The probes of one IP answered by a node other than the rule's owner.
#[derive(Debug, Clone, Serialize)]
pub struct OtherAnswers {
    /// The node that answered.
    pub node: String,
    /// The first and last such probe's send time, ms since the switch started.
    pub first_ms: u64,
    pub last_ms: u64,
    /// How many probes it answered.
    pub probes: usize,
    /// Whether each episode of those answers (a new one after [`EPISODE_GAP`] without) began
    /// within [`STARVED_BEFORE`] after a speaker's measured starvation or during it
    /// ([`starve::explains`]): a starved owner taken over for a moment, not the switch.
    pub after_starvation: bool,
}

/// One of the operator's commands.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// The command as the book gives it.
    pub command: String,
    /// When it started, since the switch started, and how long it took, ms.
    pub started_ms: u64,
    pub took_ms: u64,
}

/// The switch's report (`--json`).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Nodes in the lab.
    pub nodes: usize,
    /// Each Service.
    pub services: Vec<ServiceMove>,
    /// Services whose IP changed.
    pub ips_changed: usize,
    /// Service IPs answered, during or after the switch, by a node other than the one before.
    pub owners_moved: usize,
    /// Of those, the ones whose other answers no measured starvation explains, or whose last
    /// answer came from another node.
    pub owners_moved_unexplained: usize,
    /// The swimlb speakers' starvations measured during the switch ([`starve`]).
    pub starvations: Vec<Starvation>,
    /// Probes over every IP, sent during the switch, and those lost.
    pub probes_sent: usize,
    pub probes_lost: usize,
    /// From the deletion of MetalLB's `L2Advertisement`s (its speakers withdraw) to swimlb's
    /// speakers and records all naming the owners, ms: how long no speaker answered ARP for
    /// the IPs.
    pub speakerless_ms: u64,
    /// The operator's commands, in order.
    pub steps: Vec<Step>,
    /// What `convert-metallb` left out, with why.
    pub skipped: Vec<String>,
}

impl Report {
    /// The report as a table.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:<14} {:<16} {:<16} {:<7} {:<7} {:<7} {:>6} {:>5}\n",
            "service", "ip before", "ip after", "rule", "before", "after", "probes", "lost"
        );
        for s in &self.services {
            out += &format!(
                "{:<14} {:<16} {:<16} {:<7} {:<7} {:<7} {:>6} {:>5}\n",
                s.service,
                s.ip_before,
                s.ip_after,
                s.rule_owner,
                s.owner_before,
                s.owner_after.as_deref().unwrap_or("-"),
                s.probes_sent,
                s.probes_lost
            );
        }
        for s in &self.services {
            for o in &s.others {
                out += &format!(
                    "  {} answered by {} {} times, +{} to +{} ms{}\n",
                    s.service,
                    o.node,
                    o.probes,
                    o.first_ms,
                    o.last_ms,
                    if o.after_starvation {
                        " (after a measured starvation)"
                    } else {
                        ""
                    }
                );
            }
        }
        for s in &self.starvations {
            out += &format!(
                "  {}'s speaker starved: a thread waited {} ms for a CPU, +{} to +{} ms\n",
                s.node, s.longest_wait_ms, s.from_ms, s.to_ms
            );
        }
        for step in &self.steps {
            out += &format!(
                "  +{:>6} ms ({:>5} ms)  {}\n",
                step.started_ms, step.took_ms, step.command
            );
        }
        out += &format!(
            "Service IPs changed: {}, owners moved: {} ({} unexplained by a starvation), probes lost: {} of {}; no speaker for {} ms\n",
            self.ips_changed,
            self.owners_moved,
            self.owners_moved_unexplained,
            self.probes_lost,
            self.probes_sent,
            self.speakerless_ms
        );
        out
    }
}

/// A Service of the lab that asks for no IP (MetalLB's controller picks it): UDP
/// [`PROBE_PORT`], `externalTrafficPolicy: Local`, without a selector ([`nodes::probe_slice`] is its
/// EndpointSlice).
fn unrequested_service(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": APPS},
        "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
            "ports": [{"name": "probe", "port": PROBE_PORT, "protocol": "UDP"}]}})
}

/// Runs the switch on a fresh lab of `options.nodes` real nodes; `program` is the lab binary
/// (its `controller convert-metallb`).
pub fn run(program: PathBuf, options: &Options, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    if !(1..=MAX_SERVICES).contains(&options.services) {
        bail!("--services {}: 1 to {MAX_SERVICES}", options.services);
    }
    realnode::cleanup_stale();
    let lab = Lab::create(options.nodes)?;
    let mut responders: Vec<Worker> = Vec::new();
    for node in &lab.nodes {
        responders.extend(probe::spawn_responder(&node.netns, &node.name)?);
    }
    progress("starting the control plane, the real nodes and MetalLB from its images");
    // Dropped before the responders and the lab (declared after them).
    let cluster = NodeCluster::start(
        &lab,
        Implementation::Metallb,
        Workload::Probe,
        None,
        &mut *progress,
    )?;
    let admin = cluster.plane.admin();
    let mut names = vec![SERVICE.to_string()];
    for i in 1..options.services {
        // One at a time, so MetalLB's controller gives `web` the address it asks for first.
        wait_ingress(
            &cluster,
            names.last().map(String::as_str).unwrap_or(SERVICE),
        )?;
        let name = format!("{SERVICE}-{i}");
        admin.apply(unrequested_service(&name), "swimlb-lab")?;
        admin.apply(nodes::probe_slice(&lab, &name), "swimlb-lab")?;
        names.push(name);
    }
    let before = wait_metallb_serving(&lab, &cluster, &names)?;
    progress("MetalLB serves every Service; probing every IP from the client");
    let probers = start_probers(&lab, &before)?;
    wait_answered(&probers, &before)?;
    let t0 = Instant::now();
    let stop = AtomicBool::new(false);
    let (switch, starvations) = std::thread::scope(|s| {
        let watch = s.spawn(|| starve::watch(&cluster.real.nodes, t0, &stop));
        let switch = switch(&lab, &cluster, &program, &before, t0, progress);
        if switch.is_ok() {
            std::thread::sleep(TAIL);
        }
        stop.store(true, Ordering::Relaxed);
        (switch, watch.join().unwrap_or_default())
    });
    let switch = switch?;
    let end = Instant::now();
    let records: Vec<Vec<ProbeRecord>> = probers.into_iter().map(Prober::stop).collect();
    let services = before
        .iter()
        .zip(&records)
        .map(|(b, r)| b.judge(&cluster, r, t0, end, &starvations))
        .collect();
    drop(cluster);
    drop(responders);
    Ok(report(options.nodes, services, switch, starvations))
}

/// The IPs in Service `name`'s status.
fn ingress(cluster: &NodeCluster, name: &str) -> Vec<String> {
    cluster
        .plane
        .admin()
        .get("v1", "Service", Some(APPS), name)
        .ok()
        .flatten()
        .map(|s| kubelab::ingress_ips(&s))
        .unwrap_or_default()
}

/// A Service as MetalLB served it.
#[derive(Debug, Clone)]
struct Before {
    name: String,
    ip: IpAddr,
    /// The node MetalLB's order names, which answered the probes before the switch.
    rule_owner: String,
}

impl Before {
    /// The Service's fate in `records` (its IP's probes), from `t0` to `end`.
    fn judge(
        &self,
        cluster: &NodeCluster,
        records: &[ProbeRecord],
        t0: Instant,
        end: Instant,
        starvations: &[Starvation],
    ) -> ServiceMove {
        let during: Vec<&ProbeRecord> = records
            .iter()
            .filter(|r| r.sent >= t0 && r.sent + IN_FLIGHT < end)
            .collect();
        let mut answered_by: Vec<String> = during
            .iter()
            .filter_map(|r| r.answer.as_ref().map(|(n, _)| n.clone()))
            .collect();
        answered_by.sort();
        answered_by.dedup();
        let others = answered_by
            .iter()
            .filter(|n| **n != self.rule_owner)
            .map(|node| {
                let sent: Vec<u64> = during
                    .iter()
                    .filter(|r| r.answer.as_ref().is_some_and(|(n, _)| n == node))
                    .map(|r| r.sent.duration_since(t0).as_millis() as u64)
                    .collect();
                let (first_ms, last_ms) = (
                    sent.first().copied().unwrap_or_default(),
                    sent.last().copied().unwrap_or_default(),
                );
                OtherAnswers {
                    node: node.clone(),
                    first_ms,
                    last_ms,
                    probes: sent.len(),
                    after_starvation: starve::episodes(&sent, EPISODE_GAP)
                        .into_iter()
                        .all(|start| starve::explains(starvations, start, STARVED_BEFORE)),
                }
            })
            .collect();
        let owner_after = records
            .iter()
            .rev()
            .find_map(|r| r.answer.as_ref().map(|(n, _)| n.clone()));
        ServiceMove {
            service: format!("{APPS}/{}", self.name),
            ip_before: self.ip.to_string(),
            ip_after: ingress(cluster, &self.name).join(","),
            rule_owner: self.rule_owner.clone(),
            owner_before: self.rule_owner.clone(),
            owner_after,
            answered_by,
            others,
            probes_sent: during.len(),
            probes_lost: during.iter().filter(|r| r.answer.is_none()).count(),
        }
    }
}

/// The report's totals over `services`.
fn report(
    nodes: usize,
    services: Vec<ServiceMove>,
    switch: Switch,
    starvations: Vec<Starvation>,
) -> Report {
    Report {
        nodes,
        owners_moved_unexplained: services
            .iter()
            .filter(|s| {
                s.owner_after.as_deref() != Some(s.owner_before.as_str())
                    || s.answered_by.iter().any(|n| {
                        *n != s.owner_before
                            && !s.others.iter().any(|o| o.node == *n && o.after_starvation)
                    })
            })
            .count(),
        starvations,
        ips_changed: services
            .iter()
            .filter(|s| s.ip_after != s.ip_before)
            .count(),
        owners_moved: services
            .iter()
            .filter(|s| {
                s.owner_after.as_deref() != Some(s.owner_before.as_str())
                    || s.answered_by.iter().any(|n| *n != s.owner_before)
            })
            .count(),
        probes_sent: services.iter().map(|s| s.probes_sent).sum(),
        probes_lost: services.iter().map(|s| s.probes_lost).sum(),
        services,
        speakerless_ms: switch.speakerless_ms,
        steps: switch.steps,
        skipped: switch.skipped,
    }
}

/// Waits until `name` has an IP in its status.
fn wait_ingress(cluster: &NodeCluster, name: &str) -> Result<()> {
    let deadline = Instant::now() + STAGE;
    while ingress(cluster, name).is_empty() {
        if Instant::now() > deadline {
            bail!("MetalLB's controller gave {APPS}/{name} no IP within {STAGE:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// Waits until MetalLB serves every one of `names`: an IP in its status, every speaker seeing
/// every member, and exactly the node MetalLB's order names announcing the IP.
fn wait_metallb_serving(lab: &Lab, cluster: &NodeCluster, names: &[String]) -> Result<Vec<Before>> {
    let nodes: Vec<&str> = lab.nodes.iter().map(|n| n.name.as_str()).collect();
    let deadline = Instant::now() + STAGE;
    loop {
        match metallb_serving(lab, cluster, names, &nodes) {
            Ok(before) => return Ok(before),
            Err(why) if Instant::now() > deadline => {
                bail!("MetalLB did not serve every Service within {STAGE:?}: {why}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// The Services as MetalLB serves them now, or why not yet.
fn metallb_serving(
    lab: &Lab,
    cluster: &NodeCluster,
    names: &[String],
    nodes: &[&str],
) -> Result<Vec<Before>, String> {
    let mut before = Vec::new();
    for name in names {
        let ips = ingress(cluster, name);
        let [ip] = ips.as_slice() else {
            return Err(format!("{name} has the IPs {ips:?}"));
        };
        let ip: IpAddr = ip.parse().map_err(|e| format!("{name}: {ip}: {e}"))?;
        let views = realnode::metallb::speaker_view(lab, &cluster.real.nodes, ip);
        let rule_owner = rule::metallb_owner(nodes, ip).unwrap_or_default();
        if realnode::metallb::settled_owner(nodes, &views).as_deref() != Some(&rule_owner) {
            return Err(format!(
                "{name} ({ip}): not {rule_owner} alone announcing with every member seen; \
                 the speakers show {views:?}"
            ));
        }
        before.push(Before {
            name: name.clone(),
            ip,
            rule_owner,
        });
    }
    Ok(before)
}

/// A prober from the client for each Service IP.
fn start_probers(lab: &Lab, before: &[Before]) -> Result<Vec<Prober>> {
    before
        .iter()
        .map(|b| {
            Prober::start(
                &lab.client_netns,
                SocketAddr::new(b.ip, PROBE_PORT),
                PROBE_INTERVAL,
            )
        })
        .collect()
}

/// Waits until each IP's latest 100 probes were all answered by its rule owner.
fn wait_answered(probers: &[Prober], before: &[Before]) -> Result<()> {
    let deadline = Instant::now() + STAGE;
    loop {
        let steady = probers.iter().zip(before).all(|(p, b)| {
            let records = p.snapshot();
            let settled: Vec<&ProbeRecord> = records
                .iter()
                .rev()
                .filter(|r| r.sent + IN_FLIGHT < Instant::now())
                .take(100)
                .collect();
            settled.len() == 100
                && settled
                    .iter()
                    .all(|r| r.answer.as_ref().is_some_and(|(n, _)| *n == b.rule_owner))
        });
        if steady {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the client's probes were not all answered by the rule's owners within {STAGE:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The switch as it went.
#[derive(Debug)]
struct Switch {
    steps: Vec<Step>,
    speakerless_ms: u64,
    skipped: Vec<String>,
}

/// The operator's commands, timed from `t0`.
struct Steps {
    t0: Instant,
    list: Vec<Step>,
}

impl Steps {
    /// Runs `f` as `command` and records when it started and how long it took.
    fn run<T>(
        &mut self,
        command: &str,
        progress: &mut dyn FnMut(&str),
        f: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        progress(&format!("$ {command}"));
        let start = Instant::now();
        let out = f().with_context(|| command.to_string())?;
        self.list.push(Step {
            command: command.to_string(),
            started_ms: start.duration_since(self.t0).as_millis() as u64,
            took_ms: start.elapsed().as_millis() as u64,
        });
        Ok(out)
    }
}

/// The book's "Switching from MetalLB", command for command.
fn switch(
    lab: &Lab,
    cluster: &NodeCluster,
    program: &Path,
    before: &[Before],
    t0: Instant,
    progress: &mut dyn FnMut(&str),
) -> Result<Switch> {
    let plane = &cluster.plane;
    let kubectl = plane.kubectl();
    let ns = metallb::NAMESPACE;
    let mut steps = Steps {
        t0,
        list: Vec::new(),
    };
    let exported = steps.run(
        &format!("kubectl get -n {ns} ipaddresspools.metallb.io,l2advertisements.metallb.io -o json > metallb.json"),
        progress,
        || kubectl.run(&["get", "-n", ns, "ipaddresspools.metallb.io,l2advertisements.metallb.io", "-o", "json"], None),
    )?;
    let (converted, skipped) = steps.run(
        "swimlb-controller convert-metallb < metallb.json > swimlb-config.json",
        progress,
        || convert(program, &exported),
    )?;
    let silent_from = Instant::now();
    remove_metallb_speakers(&mut steps, &kubectl, progress)?;
    // `deploy/swimlb.yaml` with only the image replaced by the project's, which every node
    // holds (the install page's way of naming another image).
    let install = nodes::manifest_with_image(&nodes::project_tag())?;
    steps.run(
        "kubectl apply --server-side -f deploy/swimlb.yaml",
        progress,
        || kubectl.apply(crate::kubectl::Source::Text(&install)),
    )?;
    steps.run(
        "kubectl wait --for condition=established crd/ipaddresspools.swimlb.io crd/l2advertisements.swimlb.io",
        progress,
        || kubectl.run(&["wait", "--for", "condition=established", "--timeout=60s", "crd/ipaddresspools.swimlb.io", "crd/l2advertisements.swimlb.io"], None),
    )?;
    steps.run(
        "kubectl apply --server-side -f swimlb-config.json",
        progress,
        || kubectl.apply(crate::kubectl::Source::Text(&converted)),
    )?;
    steps.run(
        "(swimlb's speakers all name every IP's owner, its records written)",
        progress,
        || wait_swimlb_serving(lab, plane, before),
    )?;
    let speakerless_ms = silent_from.elapsed().as_millis() as u64;
    // The manifest MetalLB was installed from (its images do not matter to a deletion).
    let manifest = metallb::lab_manifest(&std::fs::read_to_string(
        realnode::metallb::locate()?.join(metallb::MANIFEST),
    )?)?;
    steps.run(
        &format!("kubectl delete -f {} --ignore-not-found", metallb::MANIFEST),
        progress,
        || {
            kubectl.run(
                &["delete", "--ignore-not-found", "--timeout=180s", "-f", "-"],
                Some(&manifest),
            )
        },
    )?;
    Ok(Switch {
        steps: steps.list,
        speakerless_ms,
        skipped,
    })
}

/// Step 2 of the book's switch: MetalLB's advertisements, then (once its speakers deleted their
/// records) its controller and speakers, their Pods too.
fn remove_metallb_speakers(
    steps: &mut Steps,
    kubectl: &crate::kubectl::Kubectl,
    progress: &mut dyn FnMut(&str),
) -> Result<()> {
    let ns = metallb::NAMESPACE;
    // MetalLB's speakers stop announcing first: a speaker that stops while the others still
    // announce hands its IPs to them for the moment they take to stop too (memberlist tells
    // them it left), and the clients' neighbour entries follow.
    steps.run(
        &format!("kubectl delete -n {ns} l2advertisements.metallb.io --all"),
        progress,
        || {
            kubectl.run(
                &["delete", "-n", ns, "l2advertisements.metallb.io", "--all"],
                None,
            )
        },
    )?;
    steps.run(
        &format!("kubectl wait --for=delete -n {ns} servicel2statuses.metallb.io --all"),
        progress,
        || {
            let waited = kubectl.run(
                &[
                    "wait",
                    "--for=delete",
                    "-n",
                    ns,
                    "servicel2statuses.metallb.io",
                    "--all",
                    "--timeout=60s",
                ],
                None,
            );
            match waited {
                // kubectl's way of saying they were all gone before it looked.
                Err(e) if format!("{e:#}").contains("no matching resources found") => {
                    Ok(String::new())
                }
                other => other,
            }
        },
    )?;
    steps.run(
        &format!(
            "kubectl delete -n {ns} deployment/controller daemonset/speaker --cascade=foreground"
        ),
        progress,
        || {
            kubectl.run(
                &[
                    "delete",
                    "-n",
                    ns,
                    "deployment/controller",
                    "daemonset/speaker",
                    "--cascade=foreground",
                    "--timeout=120s",
                ],
                None,
            )
        },
    )?;
    Ok(())
}

/// `swimlb-controller convert-metallb` (the lab binary's `controller` command) on `exported`:
/// the List to apply, and what it skipped.
fn convert(program: &Path, exported: &str) -> Result<(String, Vec<String>)> {
    let mut child = Command::new(program)
        .args(["controller", "convert-metallb"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    std::io::Write::write_all(
        &mut child.stdin.take().context("stdin")?,
        exported.as_bytes(),
    )?;
    let out = child.wait_with_output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("convert-metallb ({}):\n{stderr}", out.status);
    }
    let skipped = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("skipped: "))
        .map(str::to_string)
        .collect();
    Ok((String::from_utf8(out.stdout)?, skipped))
}

/// Waits until every swimlb speaker sees every member and names each IP's rule owner, and each
/// Service's record names it.
fn wait_swimlb_serving(
    lab: &Lab,
    plane: &crate::control_plane::ControlPlane,
    before: &[Before],
) -> Result<()> {
    let records = Records::new(plane, "swimlb.io/v1beta1", kubelab::NAMESPACE);
    let deadline = Instant::now() + STAGE;
    loop {
        let written = records.all();
        let pending: Vec<String> = before
            .iter()
            .filter(|b| {
                let views = kubelab::address_views(lab, &b.ip.to_string());
                let named = views.iter().all(|v| {
                    v.as_ref().is_some_and(|v| {
                        v.owner.as_deref() == Some(b.rule_owner.as_str())
                            && v.members == lab.nodes.len()
                    })
                });
                let key = format!("{APPS}/{}", b.name);
                !named || !written.iter().any(|(k, n)| *k == key && *n == b.rule_owner)
            })
            .map(|b| b.name.clone())
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("swimlb did not serve {pending:?} within {STAGE:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moved(owner_after: Option<&str>, answered_by: &[&str], ip_after: &str) -> ServiceMove {
        ServiceMove {
            service: "default/web".into(),
            ip_before: "198.51.100.100".into(),
            ip_after: ip_after.into(),
            rule_owner: "node2".into(),
            owner_before: "node2".into(),
            owner_after: owner_after.map(str::to_string),
            answered_by: answered_by.iter().map(|n| n.to_string()).collect(),
            others: Vec::new(),
            probes_sent: 100,
            probes_lost: 3,
        }
    }

    #[test]
    fn an_owner_moved_when_another_node_answered_during_the_switch_or_after_it() {
        let switch = || Switch {
            steps: Vec::new(),
            speakerless_ms: 10,
            skipped: Vec::new(),
        };
        let still = moved(Some("node2"), &["node2"], "198.51.100.100");
        let r = report(3, vec![still.clone()], switch(), Vec::new());
        assert_eq!((r.ips_changed, r.owners_moved, r.probes_lost), (0, 0, 3));
        let services = vec![
            still,
            moved(Some("node2"), &["node1", "node2"], "198.51.100.100"),
            moved(Some("node3"), &["node3"], "198.51.100.100"),
            moved(None, &[], "198.51.100.101"),
        ];
        let r = report(3, services.clone(), switch(), Vec::new());
        assert_eq!(r.ips_changed, 1);
        assert_eq!((r.owners_moved, r.owners_moved_unexplained), (3, 3));
        // node1's answers beside a measured starvation: moved, but explained.
        let mut starved = services[1].clone();
        starved.others = vec![OtherAnswers {
            node: "node1".into(),
            first_ms: 100,
            last_ms: 200,
            probes: 10,
            after_starvation: true,
        }];
        let explained = report(3, vec![services[0].clone(), starved], switch(), Vec::new());
        assert_eq!(
            (explained.owners_moved, explained.owners_moved_unexplained),
            (1, 0)
        );
        assert_eq!((r.probes_sent, r.probes_lost), (400, 12));
        assert!(r.table().contains("owners moved: 3"), "{}", r.table());
    }
}
