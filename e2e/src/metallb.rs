//! MetalLB beside swimlb, in the same lab: the peer swimlb's figures are compared with, run
//! from its own manifest on the real control plane.
//!
//! - The cluster is the apply lab's ([`BareCluster`]: the real control plane on the lab bridge,
//!   the Nodes registered, kube-proxy's DNAT of the pool on every node) with its kubelets
//!   ([`Kubelet`]), which run MetalLB's Pods from their stored specs: the images
//!   `quay.io/metallb/speaker` and `quay.io/metallb/controller` stand for the programs built
//!   from the pinned module (`$SWIMLB_K8S_BIN/metallb-speaker`, `metallb-controller`).
//! - MetalLB's `metallb-native.yaml` is applied with the pinned `kubectl apply --server-side`,
//!   changed in two places only ([`lab_manifest`]): without its
//!   `ValidatingWebhookConfiguration` (the API server would call a webhook Service that needs a
//!   certificate and a Service proxy to the controller's Pod, which the lab does not play) and
//!   with the controller's own `--webhook-mode=disabled`. Everything else is MetalLB's: the
//!   `memberlist` Secret its controller creates, memberlist's LAN defaults, the speakers on the
//!   host network with `NET_RAW`, their ServiceAccounts and RBAC.
//! - The operator's `IPAddressPool` `lab` (the pool of the swimlb lab, 198.51.100.100/30) and an
//!   `L2Advertisement` for every node (`metallb.io/v1beta1`); the user's Service `default/web`
//!   asking for 198.51.100.100 (the annotation both read), its backends a DaemonSet of
//!   host-network Pods standing for the lab's probe responders, ready on every node, so the real
//!   EndpointSlice controller gives the Service a ready endpoint on every node.
//! - MetalLB has no status endpoint: a speaker's view ([`MetallbView`]) is what it exposes, its
//!   `/metrics` (`metallb_speaker_announced` for the VIP, which only the announcing node sets)
//!   and its log (memberlist's node events, [`members`]).
//!
//! [`lab_manifest`], [`members`] and [`announces`] are pure; [`MetallbDaemons`] is the I/O.
//!
//! The pure part serves MetalLB on real nodes too ([`crate::realnode::metallb`]: `failover`,
//! `soak`, `chaos`, `service-failover`, `migrate`, `metallb_lab.rs`). [`MetallbDaemons`] (the
//! played kubelets) is left to `demo --kubernetes` alone.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::daemons::Daemons;
use crate::kubectl::Source;
use crate::kubelab::{self, APPS, BareCluster, SERVICE};
use crate::kubelet::{self, Kubelet, PodState};
use crate::lab::{MetallbView, Views, rule};
use crate::netns::{self, Lab};
use crate::probe::PROBE_PORT;
use crate::scrape;

/// MetalLB's namespace (its manifest's).
pub const NAMESPACE: &str = "metallb-system";
/// MetalLB's manifest, in the control plane's build folder (`e2e/k8s/build.sh` copies it from
/// the pinned module).
pub const MANIFEST: &str = "metallb-native.yaml";
/// The speakers' `/metrics` port (`--port=7472` in the manifest), on the node's address.
pub const METRICS_PORT: u16 = 7472;
/// How long the lab waits for MetalLB's Pods and objects at start (a functional bound).
const START_LIMIT: Duration = Duration::from_secs(180);

/// MetalLB's manifest as the lab applies it: without the `ValidatingWebhookConfiguration`, the
/// controller with `--webhook-mode=disabled`; every other document as it is.
pub fn lab_manifest(text: &str) -> Result<String> {
    let mut docs = Vec::new();
    let mut controller = false;
    for doc in text.split("\n---\n") {
        let kind = |k: &str| doc.lines().any(|l| l == format!("kind: {k}"));
        if kind("ValidatingWebhookConfiguration") {
            continue;
        }
        if kind("Deployment") && doc.lines().any(|l| l == "  name: controller") {
            let args = "      - args:\n";
            if doc.matches(args).count() != 1 {
                bail!("{MANIFEST}: the controller's Deployment has not one container with args");
            }
            docs.push(doc.replace(args, &format!("{args}        - --webhook-mode=disabled\n")));
            controller = true;
            continue;
        }
        docs.push(doc.to_string());
    }
    if !controller {
        bail!("{MANIFEST}: no Deployment `controller`");
    }
    Ok(docs.join("\n---\n"))
}

/// The members of a speaker's memberlist, from its log: the node events MetalLB logs ("node
/// event - forcing sync", `NodeJoin`, `NodeLeave`, `NodeUpdate`) since the speaker's last start
/// ("MetalLB speaker starting"). Lines that are not MetalLB's JSON are skipped.
pub fn members(log: &str) -> BTreeSet<String> {
    let mut members = BTreeSet::new();
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let msg = v["msg"].as_str().unwrap_or("");
        if msg.starts_with("MetalLB speaker starting") {
            members.clear();
        }
        if msg != "node event - forcing sync" {
            continue;
        }
        let Some(node) = v["node name"].as_str() else {
            continue;
        };
        match v["node event"].as_str() {
            Some("NodeJoin" | "NodeUpdate") => {
                members.insert(node.to_string());
            }
            Some("NodeLeave") => {
                members.remove(node);
            }
            _ => {}
        }
    }
    members
}

/// Whether `metrics` (a speaker's `/metrics`) says that `node` announces `ip`.
pub fn announces(metrics: &str, node: &str, ip: IpAddr) -> bool {
    let ip = ip.to_string();
    scrape::samples(metrics).iter().any(|s| {
        let label = |k: &str| {
            s.labels
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
        };
        s.name == "metallb_speaker_announced"
            && label("ip") == Some(ip.as_str())
            && label("node") == Some(node)
            && s.value == 1.0
    })
}

/// What the operator applies after the install: the pool and an advertisement for every node.
fn configuration() -> String {
    format!(
        "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata:\n  name: lab\n  namespace: {NAMESPACE}\nspec:\n  addresses:\n    - {}\n---\napiVersion: metallb.io/v1beta1\nkind: L2Advertisement\nmetadata:\n  name: lab\n  namespace: {NAMESPACE}\n",
        kubelab::POOL
    )
}

/// The Service's backends: a host-network Pod on every node standing for its probe responder.
fn backends() -> Value {
    json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": SERVICE, "namespace": APPS},
        "spec": {"selector": {"matchLabels": {"app": SERVICE}},
            "template": {"metadata": {"labels": {"app": SERVICE}},
                "spec": {"hostNetwork": true, "containers": [{"name": "responder",
                    "image": kubelet::LAB_RESPONDER_IMAGE,
                    "ports": [{"name": "probe", "containerPort": PROBE_PORT, "protocol": "UDP"}]}]}}}})
}

/// MetalLB on every node of the lab: its controller and speakers as the kubelets run them.
/// Fields drop in order: the kubelets first (every container stopped with its grace period),
/// then the control plane.
#[derive(Debug)]
pub struct MetallbDaemons {
    kubelet: Kubelet,
    cluster: BareCluster,
    dir: PathBuf,
}

impl MetallbDaemons {
    /// Starts the cluster and its kubelets in `lab`, installs MetalLB from its manifest, applies
    /// the pool, the advertisement, the Service and its backends. `program` is the lab binary;
    /// the files and logs go to the lab's directory.
    pub fn start(lab: &mut Lab, program: PathBuf) -> Result<MetallbDaemons> {
        let dir = lab.work_dir();
        std::fs::create_dir_all(&dir)?;
        let cluster = BareCluster::start(lab, &dir)?;
        let kubelet = Kubelet::start(lab, cluster.control_plane(), &program, &dir)
            .context("starting the kubelets")?;
        let daemons = MetallbDaemons {
            kubelet,
            cluster,
            dir,
        };
        daemons.install()?;
        Ok(daemons)
    }

    fn install(&self) -> Result<()> {
        let plane = self.cluster.control_plane();
        let path = plane.program(MANIFEST);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("{}: run e2e/k8s/build.sh", path.display()))?;
        let kubectl = plane.kubectl();
        kubectl
            .apply(Source::Text(&lab_manifest(&text)?))
            .with_context(|| format!("kubectl apply --server-side -f {MANIFEST}"))?;
        // The CRDs are established a moment after they are created.
        let deadline = Instant::now() + START_LIMIT;
        loop {
            match kubectl.apply(Source::Text(&configuration())) {
                Ok(_) => break,
                Err(e) if Instant::now() > deadline => {
                    return Err(e.context("the IPAddressPool and the L2Advertisement"));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        }
        let api = self.cluster.api();
        api.create(backends())?;
        api.create(kubelab::lab_service())?;
        Ok(())
    }

    /// The speaker Pod of `node` and what its worker has seen, once the DaemonSet made it.
    fn speaker(&self, node: &str) -> Option<(String, PodState)> {
        self.pod("speaker-", Some(node))
    }

    /// The first Pod whose name starts with `prefix` (on `node`, when given) and what its
    /// worker has seen.
    fn pod(&self, prefix: &str, node: Option<&str>) -> Option<(String, PodState)> {
        self.kubelet
            .pods()
            .into_iter()
            .find(|(name, n, _)| node.is_none_or(|node| n == node) && name.starts_with(prefix))
            .map(|(name, _, state)| (name, state))
    }

    /// Holds the kubelet's restarts of Pod `pod`, sends its container `signal` and waits (at
    /// most 10 s) for the exit.
    fn stop_pod(&self, prefix: &str, node: Option<&str>, signal: &str) -> Result<()> {
        let (pod, state) = self
            .pod(prefix, node)
            .with_context(|| format!("no MetalLB Pod {prefix}* on {node:?}"))?;
        self.kubelet.hold_restarts(&pod, true);
        let Some(pid) = state.pid else {
            return Ok(());
        };
        std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        // Gone once its worker saw the exit, or once the process is: a worker whose node's link
        // is down may hang on the API server, and sees it later.
        while self.pod(prefix, node).is_some_and(|(_, s)| s.pid.is_some())
            && crate::lab::proc_running(pid)
        {
            if Instant::now() > deadline {
                bail!("MetalLB's {pod} did not exit within 10 s of SIG{signal}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// Releases the restarts of Pod `prefix`* (on `node`) and waits until its container runs.
    fn run_pod(&self, prefix: &str, node: Option<&str>) -> Result<()> {
        let deadline = Instant::now() + START_LIMIT;
        loop {
            if let Some((pod, state)) = self.pod(prefix, node) {
                // A worker that has not seen the last exit yet still shows the dead pid.
                if state.pid.is_some_and(crate::lab::proc_running) {
                    return Ok(());
                }
                self.kubelet.hold_restarts(&pod, false);
            }
            if Instant::now() > deadline {
                bail!(
                    "MetalLB's {prefix}* on {node:?} did not run within {START_LIMIT:?}: {:#?}\n{}",
                    self.kubelet.pods(),
                    self.kubelet.logs()
                );
            }
            std::thread::sleep(kubelet::TICK);
        }
    }

    /// Stops MetalLB's controller (SIGTERM, its restarts held) and waits for its exit.
    pub fn stop_controller(&mut self) -> Result<()> {
        self.stop_pod("controller-", None, "TERM")
    }

    /// Lets the kubelet start MetalLB's controller again and waits until it runs.
    pub fn start_controller(&mut self) -> Result<()> {
        self.run_pod("controller-", None)
    }

    /// The kubelets (their Pods, their logs).
    pub fn kubelet(&self) -> &Kubelet {
        &self.kubelet
    }

    /// The cluster.
    pub fn cluster(&self) -> &BareCluster {
        &self.cluster
    }

    /// The cluster, to stop and start its API server.
    pub fn cluster_mut(&mut self) -> &mut BareCluster {
        &mut self.cluster
    }

    /// MetalLB's `ServiceL2Status` records, for another thread.
    pub fn records(&self) -> kubelab::Records {
        self.cluster.records_of("metallb.io/v1beta1", NAMESPACE)
    }

    /// The directory of the run's files (the Pods' logs under `pods/`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the kubelet writes the log of the speaker on `node`, once its Pod runs there.
    pub fn speaker_log_path(&self, node: &str) -> Option<PathBuf> {
        let (pod, _) = self.speaker(node)?;
        Some(self.dir.join("pods").join(pod).join("container.log"))
    }

    /// The speaker's log on `node` (empty when there is none yet).
    pub fn speaker_log(&self, node: &str) -> String {
        self.speaker(node)
            .and_then(|(pod, _)| self.kubelet.log_of(&pod))
            .unwrap_or_default()
    }
}

impl Daemons for MetallbDaemons {
    /// Waits until the kubelet runs node `index`'s speaker; after [`Daemons::signal`], releases
    /// its restart first.
    fn start(&mut self, lab: &mut Lab, index: usize) -> Result<()> {
        self.run_pod("speaker-", Some(&lab.node(index).name))
    }

    /// Holds the kubelet's restart of node `index`'s speaker, signals it and waits for its exit
    /// (the kubelet's worker sees it).
    fn signal(&mut self, lab: &mut Lab, index: usize, signal: &str) -> Result<()> {
        self.stop_pod("speaker-", Some(&lab.node(index).name), signal)
    }

    fn views(&mut self, lab: &Lab) -> Views {
        let addrs: Vec<SocketAddr> = lab
            .nodes
            .iter()
            .map(|n| SocketAddr::from((n.v4, METRICS_PORT)))
            .collect();
        let metrics =
            crate::lab::read_each(lab, addrs, "/metrics", 3, |text| Some(text.to_string()));
        let vip = IpAddr::V4(netns::vip_v4(0));
        let views = lab
            .nodes
            .iter()
            .zip(metrics)
            .map(|(node, metrics)| {
                let metrics = metrics?;
                // A speaker that is not running has no view, whatever its old log says.
                self.speaker(&node.name)?.1.pid?;
                Some(MetallbView {
                    announces: announces(&metrics, &node.name, vip),
                    members: members(&self.speaker_log(&node.name)).len(),
                })
            })
            .collect();
        Views::Metallb(views)
    }

    fn pid(&mut self, lab: &mut Lab, index: usize) -> Option<u32> {
        self.speaker(&lab.node(index).name)?.1.pid
    }

    fn server_version(&self) -> Option<String> {
        self.cluster.control_plane().server_version().ok()
    }

    /// MetalLB's order over every node: every node a candidate (no selectors, an endpoint on
    /// every node).
    fn expected_owner(&self, lab: &Lab) -> Option<String> {
        let names: Vec<&str> = lab.nodes.iter().map(|n| n.name.as_str()).collect();
        rule::metallb_owner(&names, IpAddr::V4(netns::vip_v4(0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFEST_SAMPLE: &str = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: metallb-system\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: controller\n  namespace: metallb-system\nspec:\n  template:\n    spec:\n      containers:\n      - args:\n        - --port=7472\n        image: quay.io/metallb/controller:v0.15.2\n---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata:\n  name: metallb-webhook-configuration\n---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: speaker\nspec:\n  template:\n    spec:\n      containers:\n      - args:\n        - --port=7472\n";

    #[test]
    fn the_lab_drops_the_webhook_configuration_and_disables_the_controllers_webhooks() {
        let out = lab_manifest(MANIFEST_SAMPLE).unwrap();
        assert!(!out.contains("ValidatingWebhookConfiguration"), "{out}");
        assert_eq!(out.matches("--webhook-mode=disabled").count(), 1, "{out}");
        let controller = out
            .split("\n---\n")
            .find(|d| d.contains("kind: Deployment"))
            .unwrap();
        assert!(
            controller.contains(
                "      - args:\n        - --webhook-mode=disabled\n        - --port=7472\n"
            ),
            "{controller}"
        );
        // The speaker's DaemonSet is MetalLB's.
        assert!(out.ends_with("kind: DaemonSet\nmetadata:\n  name: speaker\nspec:\n  template:\n    spec:\n      containers:\n      - args:\n        - --port=7472\n"));
        assert!(lab_manifest("kind: Namespace\n").is_err());
    }

    #[test]
    fn the_memberlist_is_what_the_node_events_since_the_last_start_leave() {
        let event = |node: &str, e: &str| {
            format!(
                r#"{{"caller":"speakerlist.go:331","level":"info","msg":"node event - forcing sync","node addr":"198.51.100.1","node event":"{e}","node name":"{node}","ts":"2026-11-26T15:00:00Z"}}"#
            )
        };
        let start = r#"{"level":"info","msg":"MetalLB speaker starting version 0.15.2"}"#;
        let log = [
            start.to_string(),
            event("node1", "NodeJoin"),
            event("node2", "NodeJoin"),
            "not json".to_string(),
            event("node3", "NodeJoin"),
            event("node2", "NodeLeave"),
            event("node3", "NodeUpdate"),
        ]
        .join("\n");
        assert_eq!(
            members(&log).into_iter().collect::<Vec<_>>(),
            ["node1", "node3"]
        );
        let restarted = format!("{log}\n{start}\n{}", event("node1", "NodeJoin"));
        assert_eq!(members(&restarted).len(), 1);
        assert!(members("").is_empty());
    }

    #[test]
    fn only_the_announced_gauge_of_this_node_and_ip_at_one_counts() {
        let vip: IpAddr = "198.51.100.100".parse().unwrap();
        let metrics = "# TYPE metallb_speaker_announced gauge\nmetallb_speaker_announced{ip=\"198.51.100.100\",node=\"node3\",protocol=\"layer2\",service=\"default/web\"} 1\n";
        assert!(announces(metrics, "node3", vip));
        assert!(!announces(metrics, "node2", vip));
        assert!(!announces(
            metrics,
            "node3",
            "198.51.100.101".parse().unwrap()
        ));
        assert!(!announces(&metrics.replace("} 1", "} 0"), "node3", vip));
        assert!(!announces("", "node3", vip));
    }
}
