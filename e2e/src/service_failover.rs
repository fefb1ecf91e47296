//! `swimlb-lab service-failover`: failover as a client of a LoadBalancer Service sees it, on
//! real nodes (a real kubelet, containerd and kube-proxy each, see [`crate::realnode`]).
//!
//! The cluster ([`cluster::ServiceCluster`]): three nodes running `deploy/swimlb.yaml`, the
//! backend `swimlb-echo` two replicas per node, a Service with `externalTrafficPolicy: Local`
//! and one with `Cluster`. Each trial, for one policy: the cluster fully up (every Node Ready,
//! every speaker Ready, every endpoint ready); the client ([`client::Client`], in the lab's
//! client namespace, outside the nodes) running against the Service's IP; the owner checked, by
//! the client's ARP entry, to be the node the election rule names (MetalLB's order, which
//! swimlb's speakers follow; a figure from another owner would be a bug, so the trial fails
//! instead); then the owner powered off as the network sees it (its link cut, as `failover
//! --scenario poweroff` does) for the window, while the API server is asked every 250 ms
//! whether the old owner's Node is still Ready and its endpoints still ready; what the client
//! saw ([`report`]); the link back. Each implementation (swimlb, MetalLB from its own images:
//! [`crate::realnode::metallb`]) runs on a cluster of its own, one after the other.

pub mod arp;
pub mod client;
pub mod cluster;
pub mod report;

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use tokio::time::Instant;

use crate::kubelab::{self, Policy};
use crate::lab::rule;
use crate::netns;
use crate::realnode::{NodeInfo, metallb};
use client::Client;
use cluster::{AtRest, ServiceCluster, UP_LIMIT, service_of};
use report::{PolicyReport, TrialReport};

/// How long the speakers may take to see every member again and agree on the owner before a
/// trial (a node powered off by the previous trial rejoins the gossip).
const SETTLE_LIMIT: Duration = Duration::from_secs(60);
/// Fresh ARP entries the client may learn before one names the owner the rule names.
const ARP_TRIES: usize = 5;

/// How often the API server is asked about the old owner's Node and endpoints in the window.
const WATCH_EVERY: Duration = Duration::from_millis(250);

/// What announces the Services' IPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Implementation {
    /// swimlb from `deploy/swimlb.yaml`.
    Swimlb,
    /// MetalLB from its `metallb-native.yaml`.
    Metallb,
}

impl Implementation {
    /// The name in the CLI and the JSON.
    pub const fn name(self) -> &'static str {
        match self {
            Implementation::Swimlb => "swimlb-kubernetes",
            Implementation::Metallb => "metallb",
        }
    }

    /// Parses `swimlb-kubernetes` or `metallb`.
    pub fn parse(name: &str) -> Result<Implementation> {
        [Implementation::Swimlb, Implementation::Metallb]
            .into_iter()
            .find(|i| i.name() == name)
            .with_context(|| {
                format!("unknown implementation {name:?}: swimlb-kubernetes or metallb")
            })
    }

    /// The API version and namespace of its `IPAddressPool` and `L2Advertisement`.
    pub const fn config_api(self) -> (&'static str, &'static str) {
        match self {
            Implementation::Swimlb => ("swimlb.io/v1beta1", kubelab::NAMESPACE),
            Implementation::Metallb => ("metallb.io/v1beta1", metallb::NAMESPACE),
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The implementations, one after the other, each on a cluster of its own.
    pub implementations: Vec<Implementation>,
    /// The policies, each measured `trials` times.
    pub policies: Vec<Policy>,
    /// Trials per policy.
    pub trials: usize,
    /// How long after the fault the client runs (60 s by default).
    pub window: Duration,
    /// Nodes (at least 2: a lone speaker never turns Ready).
    pub nodes: usize,
    /// Where the JSON goes.
    pub json: Option<PathBuf>,
}

/// The whole run.
#[derive(Debug, Serialize)]
pub struct Report {
    /// `service-failover`.
    pub command: &'static str,
    /// Nodes.
    pub nodes: usize,
    /// Seconds after each fault the client ran.
    pub window_s: f64,
    /// Each Node's kubelet and runtime versions, as its `status.nodeInfo` reports them.
    pub node_info: Vec<NodeInfoJson>,
    /// Per implementation and policy.
    pub results: Vec<PolicyReport>,
    /// Each implementation's speakers at rest, before its first trial.
    pub at_rest: Vec<AtRest>,
}

/// A Node's versions in the JSON.
#[derive(Debug, Serialize)]
pub struct NodeInfoJson {
    /// The Node.
    pub node: String,
    /// `kubeletVersion`.
    pub kubelet_version: String,
    /// `containerRuntimeVersion`.
    pub container_runtime: String,
}

impl From<NodeInfo> for NodeInfoJson {
    fn from(i: NodeInfo) -> NodeInfoJson {
        NodeInfoJson {
            node: i.node,
            kubelet_version: i.kubelet_version,
            container_runtime: i.container_runtime,
        }
    }
}

/// The policy's name in the CLI and the JSON.
pub fn policy_name(policy: Policy) -> &'static str {
    match policy {
        Policy::Local => "local",
        Policy::Cluster => "cluster",
    }
}

/// Parses `local` or `cluster`.
pub fn parse_policy(name: &str) -> Result<Policy> {
    match name {
        "local" => Ok(Policy::Local),
        "cluster" => Ok(Policy::Cluster),
        other => bail!("unknown policy {other:?}: local or cluster"),
    }
}

/// Runs every trial; `log` gets a line per step and trial.
pub fn run(options: &Options, log: &mut dyn FnMut(&str)) -> Result<Report> {
    if options.nodes < 2 {
        bail!("service-failover needs at least 2 nodes (a lone speaker never turns Ready)");
    }
    netns::require_root("service-failover");
    let mut results = Vec::new();
    let mut node_info = Vec::new();
    let mut at_rest = Vec::new();
    for &implementation in &options.implementations {
        log(&format!("{}: starting its cluster", implementation.name()));
        let mut cluster = ServiceCluster::start(options.nodes, implementation, log)?;
        // At rest: the mesh settled, no trial yet.
        let (_, ip) = service_of(Policy::Local);
        let names: Vec<&str> = cluster.lab.nodes.iter().map(|n| n.name.as_str()).collect();
        let expected = rule::metallb_owner(&names, IpAddr::V4(ip)).context("no node")?;
        wait_settled(&cluster, ip, &expected)?;
        at_rest.extend(cluster.speakers_at_rest()?);
        results.extend(run_policies(&mut cluster, options, log));
        if node_info.is_empty() {
            node_info = cluster.real.node_infos();
        }
    }
    let report = Report {
        command: "service-failover",
        nodes: options.nodes,
        window_s: options.window.as_secs_f64(),
        node_info: node_info.into_iter().map(NodeInfoJson::from).collect(),
        results,
        at_rest,
    };
    if let Some(path) = &options.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(report)
}

/// Every trial of every policy on one cluster.
fn run_policies(
    cluster: &mut ServiceCluster,
    options: &Options,
    log: &mut dyn FnMut(&str),
) -> Vec<PolicyReport> {
    let implementation = cluster.implementation.name();
    let mut results = Vec::new();
    for &policy in &options.policies {
        let (name, ip) = service_of(policy);
        let (mut trials, mut failed) = (Vec::new(), Vec::new());
        for trial in 1..=options.trials {
            match run_trial(cluster, policy, trial, options.window) {
                Ok(t) => {
                    log(&format!(
                        "{implementation} {name} trial {trial}/{}: {} powered off, first new request answered \
                         after {}, long-lived connections survived: {}/{}",
                        options.trials,
                        t.owner,
                        t.first_success_ms
                            .map_or("none".into(), |v| format!("{v:.0} ms")),
                        t.long_lived.iter().filter(|l| l.survived).count(),
                        t.long_lived.len()
                    ));
                    trials.push(t);
                }
                Err(e) => {
                    log(&format!(
                        "{implementation} {name} trial {trial}: failed: {e:#}"
                    ));
                    failed.push(format!("trial {trial}: {e:#}"));
                }
            }
        }
        results.push(report::summarize(
            implementation,
            policy_name(policy),
            &ip.to_string(),
            trials,
            failed,
        ));
    }
    results
}

/// One trial of `policy`: see the module's documentation.
fn run_trial(
    cluster: &mut ServiceCluster,
    policy: Policy,
    trial: usize,
    window: Duration,
) -> Result<TrialReport> {
    cluster.wait_up(UP_LIMIT)?;
    let (_, ip) = service_of(policy);
    let names: Vec<&str> = cluster.lab.nodes.iter().map(|n| n.name.as_str()).collect();
    let expected = rule::metallb_owner(&names, IpAddr::V4(ip)).context("no node")?;
    wait_settled(cluster, ip, &expected)?;
    let client = Client::start(&cluster.lab.client_netns, ip)?;
    // The client's ARP entry learnt afresh while the client runs; the answerers may follow the
    // speakers' common view a moment late, so a few fresh entries are allowed.
    let mut owner = None;
    for _ in 0..ARP_TRIES {
        let _ = cluster.lab.run_in(
            &cluster.lab.client_netns,
            "ip",
            &["neigh", "flush", "to", &ip.to_string()],
        );
        std::thread::sleep(Duration::from_secs(1));
        owner = arp_owner(cluster, ip);
        if owner.as_deref() == Some(expected.as_str()) {
            break;
        }
    }
    if owner.as_deref() != Some(expected.as_str()) {
        drop(client.stop());
        bail!("{ip} is answered by {owner:?}, but the election rule names {expected}");
    }
    let (index, old_mac) = cluster
        .lab
        .nodes
        .iter()
        .find(|n| n.name == expected)
        .map(|n| (n.index, n.mac))
        .context("the owner's index")?;
    let watch = arp::ArpWatch::start(&cluster.lab.client_netns, ip)?;
    // The fault's time is before the link is cut; only requests sent after `ip link` returned
    // (the link surely down) count as new ones (one sent while the command ran could still
    // reach the old owner and look like a failover of a few ms).
    let fault = Instant::now();
    cluster.lab.set_link(index, false)?;
    let down = Instant::now();
    let seen = watch_old_owner(cluster, policy, &expected, fault, window);
    let new_owner = arp_owner(cluster, ip);
    let record = client.stop();
    let claims = watch.stop();
    cluster.lab.set_link(index, true)?;
    if !report::ok_before(&record, fault) {
        bail!("no request through {ip} succeeded in the second before the fault");
    }
    let seconds = window.as_secs().max(1) as usize;
    Ok(TrialReport {
        trial,
        owner: expected,
        new_owner,
        first_success_ms: report::first_success_ms(&record.new, fault, down),
        arp_takeover_ms: arp::takeover_ms(&claims, fault, old_mac),
        arp_new_claimants: arp::new_claimants(&claims, fault, old_mac),
        last_failure_ms: report::last_failure_ms(&record.new, fault),
        node_not_ready_ms: seen.node_not_ready_ms,
        endpoints_not_ready_ms: seen.endpoints_not_ready_ms,
        new_requests: record.new.iter().filter(|r| r.sent >= fault).count(),
        failed_share_per_s: report::failed_share_per_s(&record.new, fault, seconds),
        seconds: report::seconds(&record, fault, seconds),
        long_lived: record
            .long
            .iter()
            .map(|l| report::long_lived(l, fault))
            .collect(),
    })
}

/// Waits until the mesh is whole and names `expected` for `ip`, at most [`SETTLE_LIMIT`]. The
/// Kubernetes view ([`ServiceCluster::wait_up`]) does not see a node whose link was just
/// restored rejoin the gossip: swimlb's speakers must each see every member and name the owner
/// the rule names (their `/status`); MetalLB's must each see every member in memberlist (their
/// log) and exactly one announce the IP (their `/metrics`), the one MetalLB's order names.
fn wait_settled(cluster: &ServiceCluster, ip: Ipv4Addr, expected: &str) -> Result<()> {
    match cluster.implementation {
        Implementation::Swimlb => {
            kubelab::wait_for_owner(&cluster.lab, &ip.to_string(), SETTLE_LIMIT, |o| {
                o == Some(expected)
            })
            .map_err(|views| {
                anyhow::anyhow!(
                    "the speakers do not all see every member and name {expected} for {ip} \
                     within {SETTLE_LIMIT:?}; they say {views:?}"
                )
            })?;
        }
        Implementation::Metallb => {
            let names: Vec<&str> = cluster.lab.nodes.iter().map(|n| n.name.as_str()).collect();
            let deadline = Instant::now() + SETTLE_LIMIT;
            loop {
                let views = metallb::speaker_view(&cluster.lab, &cluster.real.nodes, ip.into());
                if metallb::settled_owner(&names, &views).as_deref() == Some(expected) {
                    break;
                }
                if Instant::now() > deadline {
                    bail!(
                        "MetalLB's speakers do not all see every member with {expected} alone \
                         announcing {ip} within {SETTLE_LIMIT:?}; they show {views:?}"
                    );
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        }
    }
    Ok(())
}

/// When the API server first showed the old owner down, within a trial's window.
#[derive(Debug, Default)]
struct OldOwnerSeen {
    node_not_ready_ms: Option<f64>,
    endpoints_not_ready_ms: Option<f64>,
}

/// Asks the API server every [`WATCH_EVERY`] until `window` after `fault` whether `owner`'s Node
/// is still Ready and whether any of its endpoints in `policy`'s Service is still ready.
fn watch_old_owner(
    cluster: &ServiceCluster,
    policy: Policy,
    owner: &str,
    fault: Instant,
    window: Duration,
) -> OldOwnerSeen {
    let (name, _) = service_of(policy);
    let admin = cluster.plane.admin();
    let mut seen = OldOwnerSeen::default();
    let end = fault + window;
    while Instant::now() < end {
        let ms = || fault.elapsed().as_secs_f64() * 1000.0;
        if seen.node_not_ready_ms.is_none()
            && let Ok(Some(node)) = admin.get("v1", "Node", None, owner)
            && !crate::realnode::node_ready(&node)
        {
            seen.node_not_ready_ms = Some(ms());
        }
        if seen.endpoints_not_ready_ms.is_none()
            && cluster::ready_endpoints_on(admin, name, Some(owner)).is_ok_and(|n| n == 0)
        {
            seen.endpoints_not_ready_ms = Some(ms());
        }
        std::thread::sleep(WATCH_EVERY.min(end.saturating_duration_since(Instant::now())));
    }
    seen
}

/// The node whose MAC the client's neighbour entry for `ip` holds.
fn arp_owner(cluster: &ServiceCluster, ip: Ipv4Addr) -> Option<String> {
    let out = cluster
        .lab
        .run_in(
            &cluster.lab.client_netns,
            "ip",
            &["neigh", "show", "to", &ip.to_string()],
        )
        .ok()?;
    let mac = out
        .split_whitespace()
        .skip_while(|w| *w != "lladdr")
        .nth(1)?
        .to_string();
    cluster
        .lab
        .nodes
        .iter()
        .find(|n| netns::mac_text(n.mac).eq_ignore_ascii_case(&mac))
        .map(|n| n.name.clone())
}

/// `swimlb-lab service-failover`'s arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The load balancers, one after the other, each on a cluster of its own:
    /// swimlb-kubernetes, metallb, or both (`swimlb-kubernetes,metallb`).
    #[arg(
        long = "impl",
        value_delimiter = ',',
        default_value = "swimlb-kubernetes"
    )]
    implementation: Vec<String>,
    /// The Services' externalTrafficPolicy: local, cluster, or both (`local,cluster`).
    #[arg(long, value_delimiter = ',', default_value = "local,cluster")]
    policy: Vec<String>,
    /// Trials per policy.
    #[arg(long, default_value_t = 10)]
    trials: usize,
    /// Seconds the client runs after each fault.
    #[arg(long, default_value_t = 60)]
    window: u64,
    /// Real nodes in the lab (at least 2).
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Write the report as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

impl Args {
    /// Runs the trials and prints a table per policy.
    pub fn run(self) -> Result<()> {
        let options = Options {
            implementations: self
                .implementation
                .iter()
                .map(|i| Implementation::parse(i))
                .collect::<Result<_>>()?,
            policies: self
                .policy
                .iter()
                .map(|p| parse_policy(p))
                .collect::<Result<_>>()?,
            trials: self.trials,
            window: Duration::from_secs(self.window),
            nodes: self.nodes,
            json: self.json,
        };
        let report = run(&options, &mut |line| eprintln!("{line}"))?;
        print_report(&report);
        Ok(())
    }
}

/// The report as tables: the first answered request and the ARP takeover per implementation
/// and policy, then each speaker at rest.
fn print_report(report: &Report) {
    println!(
        "{:<18} {:<8} {:>6} {:>22} {:>14} {:>12}  failed share, s 0..5",
        "impl", "policy", "trials", "first ok p50/p90/p99/max", "ARP p50/p99", "last fail p50"
    );
    for r in &report.results {
        let shares: Vec<String> = r
            .failed_share_per_s
            .iter()
            .take(5)
            .map(|s| format!("{:.0}%", s * 100.0))
            .collect();
        let f = &r.first_success_ms;
        println!(
            "{:<18} {:<8} {:>6} {:>22} {:>14} {:>11.1}s  {}",
            r.implementation,
            r.policy,
            r.trials.len(),
            format!("{:.0}/{:.0}/{:.0}/{:.0}", f.p50, f.p90, f.p99, f.max),
            format!("{:.0}/{:.0}", r.arp_takeover_ms.p50, r.arp_takeover_ms.p99),
            r.last_failure_ms.p50 / 1000.0,
            shares.join(" ")
        );
    }
    println!("speakers at rest, as each node's kubelet reports them (/stats/summary):");
    for a in &report.at_rest {
        println!(
            "{:<18} {:<6} working set {:>6.1} MiB, RSS {:>6.1} MiB, CPU {:>5.2} % of a core",
            a.implementation, a.node, a.working_set_mib, a.rss_mib, a.cpu_percent
        );
    }
}
