//! `swimlb-lab handover`: moves decided by the Kubernetes API, measured from the client, on real
//! nodes.
//!
//! The cluster is `failover --impl swimlb-kubernetes`'s ([`RealDaemons`]): a real kubelet,
//! containerd and kube-proxy in each node namespace, swimlb from `deploy/swimlb.yaml` (only the
//! image changed). Beside its Service `web`, the lab adds the Service `handover` on
//! `vip_v4(1)`: `externalTrafficPolicy: Local`, without a selector (so the endpoint slice
//! controller leaves it alone), its one EndpointSlice written by the lab with one ready endpoint,
//! the address of the node it is on. That node owns the IP. Each trial moves the endpoint to the
//! next node (one merge patch of the EndpointSlice's endpoints: the address and `nodeName`
//! change, as when a Pod moves) while the client asks "who has" the IP by ARP every 10 ms. Each
//! speaker sees the change through its own API watch; what the client saw in between is the
//! trial's sample: how long two MACs answered (dual), how long none did (dark), and when the new
//! owner alone answered.
//!
//! `--busy N` runs N busy loops on the machine throughout; `--starve NODE:PERCENT` caps that
//! node's speaker container's own cgroup at PERCENT of a core with a busy loop in it (as a chaos
//! starvation on real nodes), so that it sees every change late; `--api-lag NODE:MS` drops that
//! node namespace's TCP traffic with the API server from just before each patch to MS after it:
//! the speaker's watch delivers the move late, and so do the node's kubelet and kube-proxy,
//! which share the namespace (the Node stays Ready: its Lease lasts 40 s; kube-proxy programs the
//! moved endpoint late, which ARP does not see). A trial is measured only when, before the patch,
//! the cluster was fully up, every speaker named the old owner and it alone answered (and a
//! starved speaker is still the container starved); after it every speaker must name the new
//! owner within 10 s.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::chaos::driver::{Starved, starve_speaker};
use crate::daemons::{Daemons as _, Implementation};
use crate::kubelab::{self, APPS, Policy};
use crate::netns::{self, Lab, Node};
use crate::probe::{ArpAnswers, ArpAsker};
use crate::realnode::{self, cluster::NodeInfo, daemons::RealDaemons, daemons::container_pid};
use crate::trial::Percentiles;

/// The client's ARP interval.
pub const ARP_INTERVAL: Duration = Duration::from_millis(10);
/// Asked before the patch (the old owner alone must answer).
const BEFORE: Duration = Duration::from_millis(500);
/// Asked after the patch.
const AFTER: Duration = Duration::from_secs(3);
/// How long every speaker has to name the new owner (and, before a move, the old one).
const SETTLE_LIMIT: Duration = Duration::from_secs(10);
/// How long the first owner may take to be named once the Service exists.
const FIRST_OWNER_LIMIT: Duration = Duration::from_secs(60);
/// The Service moved.
const SERVICE: &str = "handover";
/// Its EndpointSlice (the lab's).
const SLICE: &str = "handover-endpoint";
/// The API server of the real nodes' control plane: in the client's namespace, on the client's
/// address, port 6443.
const API_SERVER: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(netns::CLIENT_V4), 6443);

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Nodes in the lab.
    pub nodes: usize,
    /// Moves.
    pub trials: usize,
    /// Busy loops on the machine throughout.
    pub busy: usize,
    /// One node's speaker starved throughout: the node, and the share of a core (percent) its
    /// container's cgroup gets, with one busy loop in it.
    pub starve: Option<(usize, u8)>,
    /// One node's traffic with the API server dropped around every move: the node, and for
    /// how long after the patch, so its watch delivers the move late.
    pub api_lag: Option<(usize, Duration)>,
}

/// One move as the client saw it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// The node the endpoint left.
    pub from: String,
    /// The node it moved to.
    pub to: String,
    /// From the patch to the first request answered by the new owner alone, after which the
    /// old owner never answered again.
    pub handover_ms: f64,
    /// From the first request after the patch answered by two MACs to one interval after the
    /// last (0: none).
    pub dual_ms: f64,
    /// The longest run of unanswered requests after the patch, times the interval.
    pub dark_ms: f64,
}

/// The run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Always `swimlb-kubernetes` (on real nodes).
    #[serde(rename = "impl")]
    pub implementation: &'static str,
    /// Nodes.
    pub nodes: usize,
    /// The API server's version.
    pub server_version: Option<String>,
    /// Each Node's kubelet and container runtime, as its `status.nodeInfo` reports them.
    pub node_info: Vec<NodeInfo>,
    /// Busy loops.
    pub busy: usize,
    /// The node starved, with its share of a core in percent.
    pub starved: Option<(usize, u8)>,
    /// The node whose API traffic was dropped around each move, and for how long after the
    /// patch (ms).
    pub api_lag: Option<(usize, u64)>,
    /// The client's ARP interval, ms.
    pub arp_interval_ms: f64,
    /// Trials asked for.
    pub trials: usize,
    /// Trials not measured (the lab had not settled before, or did not after), with why.
    pub not_measured: Vec<String>,
    /// Every measured move.
    pub samples: Vec<Sample>,
    /// Of `dual_ms`.
    pub dual: Option<Percentiles>,
    /// Of `dark_ms`.
    pub dark: Option<Percentiles>,
    /// Of `handover_ms`.
    pub handover: Option<Percentiles>,
}

impl Report {
    /// The table the command prints.
    pub fn table(&self) -> String {
        let starved = self
            .starved
            .map(|(node, percent)| {
                format!(", node{node}'s speaker starved to {percent}% of a core")
            })
            .unwrap_or_default()
            + &self
                .api_lag
                .map(|(node, ms)| {
                    format!(", node{node} cut from the API server for {ms} ms at each move")
                })
                .unwrap_or_default();
        let kubelet = self
            .node_info
            .first()
            .map(|n| format!(" (kubelet {}, {})", n.kubelet_version, n.container_runtime))
            .unwrap_or_default();
        let mut s = format!(
            "handover ({}): {} real nodes{kubelet}, {} busy loops{starved}, ARP every {} ms: {} of {} moves measured\n",
            self.implementation,
            self.nodes,
            self.busy,
            self.arp_interval_ms,
            self.samples.len(),
            self.trials
        );
        let row = |name: &str, p: &Option<Percentiles>, nonzero: usize| match p {
            Some(p) => format!(
                "  {name:<9} p50 {:>7.1} ms  p90 {:>7.1} ms  p99 {:>7.1} ms  max {:>7.1} ms  ({nonzero} moves with any)\n",
                p.p50, p.p90, p.p99, p.max
            ),
            None => format!("  {name:<9} -\n"),
        };
        let count = |f: fn(&Sample) -> f64| self.samples.iter().filter(|s| f(s) > 0.0).count();
        s += &row("dual", &self.dual, count(|s| s.dual_ms));
        s += &row("dark", &self.dark, count(|s| s.dark_ms));
        s += &row("handover", &self.handover, self.samples.len());
        for why in &self.not_measured {
            s += &format!("  not measured: {why}\n");
        }
        s
    }
}

/// Reads one move from the client's requests: `patch` is when the EndpointSlice was patched,
/// on the asker's clock. `Err` when the old owner did not answer alone before it, or the new
/// owner never answered alone for good after it.
pub fn sample(
    answers: &[ArpAnswers],
    patch: Duration,
    from: [u8; 6],
    to: [u8; 6],
    interval: Duration,
) -> Result<(f64, f64, f64), String> {
    let (before, after): (Vec<&ArpAnswers>, Vec<&ArpAnswers>) =
        answers.iter().partition(|a| a.at < patch);
    if before.iter().any(|a| a.macs.iter().any(|m| *m != from))
        || !before.iter().any(|a| a.macs.contains(&from))
    {
        return Err("before the move, the old owner did not answer alone".into());
    }
    let last_from = after.iter().rposition(|a| a.macs.contains(&from));
    let settled = after
        .iter()
        .enumerate()
        .skip(last_from.map_or(0, |i| i + 1))
        .find(|(_, a)| a.macs.len() == 1 && a.macs.contains(&to))
        .map(|(i, _)| i);
    let Some(settled) = settled else {
        return Err("after the move, the new owner did not answer alone for good".into());
    };
    if after[settled..]
        .iter()
        .any(|a| a.macs.iter().any(|m| *m != to))
    {
        return Err("after the move, another MAC answered after the new owner".into());
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let handover = ms(after[settled].at.saturating_sub(patch));
    let dual = ms(crate::probe::dual_span(after.iter().copied(), interval).1);
    let mut longest = 0;
    let mut run = 0;
    for a in &after[..settled] {
        run = if a.macs.is_empty() { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    Ok((handover, dual, ms(interval * longest)))
}

/// Busy loops, killed on drop.
struct Busy(Vec<Child>);

impl Busy {
    fn start(n: usize) -> Result<Busy> {
        let mut loops = Vec::new();
        for _ in 0..n {
            loops.push(
                Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .spawn()
                    .context("starting a busy loop")?,
            );
        }
        Ok(Busy(loops))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Drops (`true`) or passes again the TCP traffic of node `node`'s namespace with the API
/// server, both ways: the speaker's (through the `kubernetes` Service, its destination already
/// the API server's when the filter hook sees it), the kubelet's and kube-proxy's.
fn cut_api(lab: &Lab, node: usize, cut: bool) -> Result<()> {
    let netns = &lab.node(node).netns;
    let _ = lab.run_in(
        netns,
        "nft",
        &["delete", "table", "inet", "swimlb_lab_api_lag"],
    );
    if !cut {
        return Ok(());
    }
    let (ip, port) = (API_SERVER.ip(), API_SERVER.port());
    let rules = format!(
        "table inet swimlb_lab_api_lag {{\n  chain output {{ type filter hook output priority 0; ip daddr {ip} tcp dport {port} drop; }}\n  chain input {{ type filter hook input priority 0; ip saddr {ip} tcp sport {port} drop; }}\n}}\n"
    );
    netns::nft_apply(netns, &rules)
}

/// The Service moved: `Local`, on `ip`, without a selector (the lab writes its endpoints).
fn service(ip: Ipv4Addr) -> Value {
    let mut svc = kubelab::service(SERVICE, &ip.to_string(), Policy::Local, None);
    if let Some(spec) = svc["spec"].as_object_mut() {
        spec.remove("selector");
    }
    svc
}

/// The Service's endpoints: one, ready, on `node` at its own address.
fn endpoints(node: &Node) -> Value {
    json!([{"addresses": [node.v4.to_string()], "nodeName": node.name,
        "conditions": {"ready": true, "serving": true, "terminating": false}}])
}

/// The Service's EndpointSlice with its one endpoint on `node`.
fn slice(node: &Node) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": SLICE, "namespace": APPS,
            "labels": {"kubernetes.io/service-name": SERVICE,
                "endpointslice.kubernetes.io/managed-by": "swimlb-lab"}},
        "addressType": "IPv4",
        "endpoints": endpoints(node),
        "ports": [{"name": "probe", "port": crate::probe::PROBE_PORT, "protocol": "UDP"}]})
}

/// The real-node cluster with the Service's one endpoint on node1, node1 owning its IP.
/// Fields drop in order: the cluster before the lab.
struct MoveLab {
    daemons: RealDaemons,
    lab: Lab,
    ip: Ipv4Addr,
    /// With `--starve`: the node, and its speaker container's pid when it was starved.
    starved_pid: Option<(usize, Option<u32>)>,
}

impl MoveLab {
    fn start(nodes: usize, progress: &mut dyn FnMut(&str)) -> Result<MoveLab> {
        realnode::cleanup_stale();
        let mut lab = Lab::create(nodes)?;
        progress("starting the control plane, the real nodes and swimlb from its manifest");
        let daemons = RealDaemons::start(&mut lab, Implementation::SwimlbKubernetes, progress)?;
        let ip: Ipv4Addr = netns::vip_v4(1);
        let admin = daemons.cluster().plane.admin();
        admin.apply(service(ip), "swimlb-lab")?;
        admin.apply(slice(lab.node(1)), "swimlb-lab")?;
        kubelab::wait_for_owner(&lab, &ip.to_string(), FIRST_OWNER_LIMIT, |o| {
            o == Some("node1")
        })
        .map_err(|views| anyhow::anyhow!("node1 never owned {ip}: {views:?}"))?;
        Ok(MoveLab {
            daemons,
            lab,
            ip,
            starved_pid: None,
        })
    }

    fn name(&self, index: usize) -> &str {
        &self.lab.nodes[index].name
    }

    /// Patches the EndpointSlice: its one endpoint now on node `to` (0-based).
    fn move_endpoint(&self, to: usize) -> Result<()> {
        self.daemons.cluster().plane.admin().merge_patch(
            "discovery.k8s.io/v1",
            "EndpointSlice",
            Some(APPS),
            SLICE,
            json!({ "endpoints": endpoints(&self.lab.nodes[to]) }),
            false,
        )?;
        Ok(())
    }

    /// Why a move from node `from` (0-based) cannot be measured now, if it cannot: the cluster
    /// not fully up, a speaker not naming `from`, the starved speaker replaced.
    fn not_settled(&self, from: usize) -> Result<Option<String>> {
        if let Some(why) = self.daemons.cluster().not_up(self.lab.nodes.len())? {
            return Ok(Some(format!("the cluster is not fully up: {why}")));
        }
        let name = self.name(from);
        if let Err(views) =
            kubelab::wait_for_owner(&self.lab, &self.ip.to_string(), SETTLE_LIMIT, |o| {
                o == Some(name)
            })
        {
            return Ok(Some(format!(
                "before the move, the speakers did not all name {name}: {views:?}"
            )));
        }
        if let Some((node, pid)) = self.starved_pid {
            let now = container_pid(&self.daemons.cluster().real.nodes[node - 1])?;
            if now != pid {
                return Ok(Some(format!(
                    "node{node}'s starved speaker (pid {pid:?}) was replaced (pid {now:?})"
                )));
            }
        }
        Ok(None)
    }

    /// Moves the endpoint from node `from` to node `to` (0-based) as the client watches;
    /// `Ok(Err(why))`: not measured.
    fn one_move(
        &self,
        api_lag: Option<(usize, Duration)>,
        from: usize,
        to: usize,
    ) -> Result<Result<Sample, String>> {
        if let Some(why) = self.not_settled(from)? {
            return Ok(Err(why));
        }
        let (lab, ip) = (&self.lab, self.ip);
        let requests = ((BEFORE + AFTER).as_millis() / ARP_INTERVAL.as_millis()) as usize;
        let started = Instant::now();
        let asker = ArpAsker::start(&lab.client_netns, ip, ARP_INTERVAL, requests)?;
        std::thread::sleep(BEFORE);
        if let Some((node, _)) = api_lag {
            cut_api(lab, node, true)?;
        }
        let patch = started.elapsed();
        let moved = self.move_endpoint(to);
        let lag = api_lag.map_or(Duration::ZERO, |(_, lag)| lag.min(AFTER));
        std::thread::sleep(lag);
        if let Some((node, _)) = api_lag {
            cut_api(lab, node, false)?;
        }
        moved?;
        std::thread::sleep(AFTER - lag);
        let answers = asker.stop();
        let name = self.name(to);
        if let Err(views) =
            kubelab::wait_for_owner(lab, &ip.to_string(), SETTLE_LIMIT, |o| o == Some(name))
        {
            return Ok(Err(format!(
                "the speakers did not name {name} within {SETTLE_LIMIT:?}: {views:?}"
            )));
        }
        let (from_mac, to_mac) = (lab.nodes[from].mac, lab.nodes[to].mac);
        Ok(sample(&answers, patch, from_mac, to_mac, ARP_INTERVAL).map(
            |(handover_ms, dual_ms, dark_ms)| Sample {
                from: self.name(from).to_string(),
                to: name.to_string(),
                handover_ms,
                dual_ms,
                dark_ms,
            },
        ))
    }
}

/// Checks the options against the lab's size.
fn check(options: &Options) -> Result<()> {
    if options.nodes < 2 {
        bail!("--nodes {}: a move needs two nodes", options.nodes);
    }
    let nodes = 1..=options.nodes;
    for (flag, node) in [
        ("--starve", options.starve.map(|s| s.0)),
        ("--api-lag", options.api_lag.map(|l| l.0)),
    ] {
        if let Some(node) = node.filter(|n| !nodes.contains(n)) {
            bail!("{flag} node{node}: the lab has {} nodes", options.nodes);
        }
    }
    Ok(())
}

/// Runs the trials on a fresh lab of real nodes.
pub fn run(options: &Options, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    check(options)?;
    let mut moves = MoveLab::start(options.nodes, progress)?;
    progress(&format!(
        "{} owned by node1; {} busy loops; {} moves",
        moves.ip, options.busy, options.trials
    ));
    let busy = Busy::start(options.busy)?;
    let starved: Option<Starved> = match options.starve {
        Some((node, percent)) => {
            let pid = container_pid(&moves.daemons.cluster().real.nodes[node - 1])?;
            moves.starved_pid = Some((node, pid));
            Some(starve_speaker(
                &mut moves.lab,
                &moves.daemons,
                node,
                1,
                percent,
            )?)
        }
        None => None,
    };
    let mut samples = Vec::new();
    let mut not_measured = Vec::new();
    for trial in 1..=options.trials {
        let (from, to) = ((trial - 1) % options.nodes, trial % options.nodes);
        match moves.one_move(options.api_lag, from, to)? {
            Ok(s) => {
                progress(&format!(
                    "move {trial}: {} -> {}: new owner alone after {:.0} ms, dual {:.0} ms, dark {:.0} ms",
                    s.from, s.to, s.handover_ms, s.dual_ms, s.dark_ms
                ));
                samples.push(s);
            }
            Err(why) => {
                progress(&format!("move {trial}: not measured: {why}"));
                not_measured.push(format!("move {trial} to {}: {why}", moves.name(to)));
            }
        }
    }
    drop(busy);
    if let Some(starved) = starved {
        starved.stop(&mut moves.lab);
    }
    let server_version = moves.daemons.server_version();
    let node_info = moves.daemons.node_info();
    let MoveLab {
        daemons, mut lab, ..
    } = moves;
    // The real nodes stop before their namespaces go.
    drop(daemons);
    lab.teardown();
    let of = |f: fn(&Sample) -> f64| {
        let values: Vec<f64> = samples.iter().map(f).collect();
        (!values.is_empty()).then(|| crate::trial::percentiles(&values))
    };
    Ok(Report {
        implementation: "swimlb-kubernetes",
        nodes: options.nodes,
        server_version,
        node_info,
        busy: options.busy,
        starved: options.starve,
        api_lag: options
            .api_lag
            .map(|(node, lag)| (node, lag.as_millis() as u64)),
        arp_interval_ms: ARP_INTERVAL.as_secs_f64() * 1e3,
        trials: options.trials,
        not_measured,
        dual: of(|s| s.dual_ms),
        dark: of(|s| s.dark_ms),
        handover: of(|s| s.handover_ms),
        samples,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    const A: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 2];
    const MS: Duration = Duration::from_millis(10);

    fn answers(seq: &[&[[u8; 6]]]) -> Vec<ArpAnswers> {
        seq.iter()
            .enumerate()
            .map(|(i, macs)| ArpAnswers {
                at: MS * i as u32,
                macs: macs.iter().copied().collect::<BTreeSet<_>>(),
            })
            .collect()
    }

    #[test]
    fn a_move_with_two_dual_requests_and_no_dark_one() {
        let seq = answers(&[&[A], &[A], &[A], &[A, B], &[A, B], &[B], &[B]]);
        let (handover, dual, dark) = sample(&seq, MS * 2, A, B, MS).unwrap();
        assert_eq!((handover, dual, dark), (30.0, 20.0, 0.0));
    }

    #[test]
    fn a_move_with_a_dark_gap_counts_its_longest_run() {
        let seq = answers(&[&[A], &[A], &[], &[A], &[], &[], &[], &[B], &[B]]);
        let (handover, dual, dark) = sample(&seq, MS * 2, A, B, MS).unwrap();
        assert_eq!((handover, dual, dark), (50.0, 0.0, 30.0));
    }

    fn node(index: usize) -> Node {
        Node {
            index,
            name: format!("node{index}"),
            netns: format!("swl-test-n{index}"),
            v4: Ipv4Addr::new(198, 51, 100, 10 + index as u8),
            v6: "2001:db8::1".parse().unwrap(),
            mac: [2, 0, 0, 0, 0, index as u8],
        }
    }

    #[test]
    fn the_service_is_local_without_a_selector_and_the_patch_moves_only_its_one_endpoint() {
        let svc = service(netns::vip_v4(1));
        assert_eq!(svc["spec"]["externalTrafficPolicy"], "Local");
        assert!(svc["spec"].get("selector").is_none(), "{svc}");
        let before = slice(&node(1));
        assert_eq!(
            before["metadata"]["labels"]["kubernetes.io/service-name"],
            SERVICE
        );
        let after = endpoints(&node(2));
        assert_eq!(after.as_array().map(Vec::len), Some(1));
        assert_eq!(after[0]["nodeName"], "node2");
        assert_eq!(after[0]["addresses"], json!(["198.51.100.12"]));
        assert_eq!(after[0]["conditions"], before["endpoints"][0]["conditions"]);
        assert_ne!(after, before["endpoints"]);
    }

    #[test]
    fn options_that_name_a_node_outside_the_lab_or_one_node_are_refused() {
        let options = Options {
            nodes: 3,
            trials: 1,
            busy: 0,
            starve: None,
            api_lag: None,
        };
        assert!(check(&options).is_ok());
        let err = check(&Options {
            starve: Some((4, 10)),
            ..options.clone()
        })
        .unwrap_err();
        assert!(err.to_string().contains("--starve node4"), "{err}");
        let err = check(&Options {
            api_lag: Some((0, Duration::from_millis(100))),
            ..options.clone()
        })
        .unwrap_err();
        assert!(err.to_string().contains("--api-lag node0"), "{err}");
        assert!(
            check(&Options {
                nodes: 1,
                ..options
            })
            .is_err()
        );
    }

    #[test]
    fn a_move_is_not_measured_when_the_lab_was_not_settled_or_flapped_after() {
        let unsettled = answers(&[&[A, B], &[A], &[B]]);
        assert!(sample(&unsettled, MS * 2, A, B, MS).is_err());
        let flapped = answers(&[&[A], &[B], &[A], &[B], &[B]]);
        // The old owner answered after the new one: measured from the last time it did.
        let (handover, _, _) = sample(&flapped, MS, A, B, MS).unwrap();
        assert_eq!(handover, 20.0);
        let stray = answers(&[&[A], &[B], &[B], &[[2, 0, 0, 0, 0, 9]]]);
        assert!(sample(&stray, MS, A, B, MS).is_err());
        let never = answers(&[&[A], &[A], &[]]);
        assert!(sample(&never, MS, A, B, MS).is_err());
    }
}
