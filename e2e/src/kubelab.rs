//! The Kubernetes lab: the lab's network (see [`crate::netns`]) turned into a small cluster.
//!
//! - The fake API server (`swimlb-fake-api`, the e2e stand-in for kube-apiserver) runs on a
//!   thread of this process inside the client's namespace and listens on
//!   [`API_ADDR`] (198.51.100.2:6443), so every node reaches it over the lab bridge; an API
//!   server outage is [`Cluster::set_reachable`]`(false)` (connections cut and refused, the
//!   store kept, as a restarted kube-apiserver behind the same address).
//! - The real controller (`swimlb-lab controller`) runs in the client's namespace against it
//!   and assigns the Services' IPs from the pool `lab` (198.51.100.100/30).
//! - A speaker in Kubernetes mode (`swimlb-lab speaker kubernetes`) runs in each node
//!   namespace, as the DaemonSet's Pod would: `NODE_NAME`, `POD_IP` (the node's address: host
//!   network), the namespace, a key file as the mounted Secret would hold it, and the API
//!   server through a kubeconfig.
//! - The lab plays the kubelet (the speaker Pods' `status.podIP`) and the endpoint controller
//!   (the EndpointSlices, [`endpoint_slice`]); nothing else writes to the store.
//! - VIP traffic reaches each node's probe responder the way kube-proxy delivers it: an
//!   nftables DNAT of the pool's addresses to the node's own address in `prerouting`. The VIP is
//!   never a local address, so the kernel never answers ARP for it: only the speakers do.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use serde_json::{Value, json};
use swimlb_config::service::ServiceKey;
use swimlb_fake_api::{FakeApi, FakeApiConfig};
use swimlb_speaker::kubernetes::records::record_name;
use tokio::time::Instant;

use crate::netns::{self, Lab, Node};
use crate::probe;

/// Where the fake API server listens: the client's address, port 6443.
pub const API_ADDR: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(netns::CLIENT_V4), 6443);
/// The speakers' and the controller's namespace.
pub const NAMESPACE: &str = "swimlb-system";
/// The namespace of the lab's Services.
pub const APPS: &str = "default";
/// The Service the trials and the demo fault: it holds [`netns::vip_v4`]`(0)`.
pub const SERVICE: &str = "web";
/// The controller's `/metrics` port (in the client's namespace).
pub const CONTROLLER_PORT: u16 = 7473;
/// The pool's addresses: 198.51.100.100 to .103.
pub const POOL: &str = "198.51.100.100/30";
/// The speaker Pods' labels (the speakers' default `--speaker-selector`).
const SPEAKER_LABELS: [(&str, &str); 2] = [
    ("app.kubernetes.io/name", "swimlb"),
    ("app.kubernetes.io/component", "speaker"),
];

/// The fake API server on a thread of its own, inside a network namespace.
#[derive(Debug)]
struct ApiThread {
    api: Arc<FakeApi>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ApiThread {
    fn start(netns: &str, bind: SocketAddr) -> Result<ApiThread> {
        let (started, ready) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let netns = netns.to_string();
        let thread = std::thread::Builder::new()
            .name("fake-api".into())
            .spawn(move || {
                let serve = || -> Result<tokio::runtime::Runtime> {
                    probe::enter_netns(&netns)?;
                    Ok(tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?)
                };
                let runtime = match serve() {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = started.send(Err(e));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let config = FakeApiConfig {
                        bind,
                        // Every write of a long run stays resumable; a watch that falls out
                        // of it re-lists (410), which the outage exercises on purpose.
                        history_capacity: 100_000,
                        ..FakeApiConfig::default()
                    };
                    match FakeApi::start_with(config).await {
                        Ok(api) => {
                            let api = Arc::new(api);
                            let _ = started.send(Ok(api.clone()));
                            let _ = stopped.await;
                            drop(api);
                        }
                        Err(e) => {
                            let _ = started.send(Err(e));
                        }
                    }
                });
            })
            .context("starting the fake API server's thread")?;
        let api = ready
            .recv()
            .context("the fake API server's thread ended")?
            .context("starting the fake API server")?;
        Ok(ApiThread {
            api,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for ApiThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The cluster of a Kubernetes lab: API server, controller, the objects the lab plays.
#[derive(Debug)]
pub struct Cluster {
    api: ApiThread,
    program: PathBuf,
    dir: PathBuf,
    controller: Option<usize>,
    /// Extra flags for every speaker started after they are set (`--preempt-delay 30s`).
    pub speaker_args: Vec<String>,
}

impl Cluster {
    /// Starts the API server, seeds the cluster (nodes, speaker Pods, the pool, one
    /// L2Advertisement for every node, the Service [`SERVICE`] on 198.51.100.100 with a ready
    /// endpoint on every node), installs kube-proxy's DNAT on every node and starts the
    /// controller. `program` is the lab binary; `dir` holds the controller's log.
    pub fn start(lab: &mut Lab, program: PathBuf, dir: PathBuf) -> Result<Cluster> {
        let api = ApiThread::start(&lab.client_netns, API_ADDR)?;
        let mut cluster = Cluster {
            api,
            program,
            dir,
            controller: None,
            speaker_args: Vec::new(),
        };
        cluster.seed(&lab.nodes)?;
        for node in &lab.nodes {
            install_dnat(node)?;
        }
        cluster.start_controller(lab)?;
        Ok(cluster)
    }

    /// Starts only the API server (nothing in it but its default namespaces) and installs
    /// kube-proxy's DNAT on every node: a cluster before anything of swimlb is applied to it,
    /// for [`crate::kubelet`] to play its kubelets and workload controllers. No controller is
    /// started ([`Cluster::start_controller`] is not for this cluster: the Deployment's Pod
    /// runs the controller there).
    pub fn start_empty(lab: &Lab, program: PathBuf, dir: PathBuf) -> Result<Cluster> {
        let api = ApiThread::start(&lab.client_netns, API_ADDR)?;
        for node in &lab.nodes {
            install_dnat(node)?;
        }
        Ok(Cluster {
            api,
            program,
            dir,
            controller: None,
            speaker_args: Vec::new(),
        })
    }

    fn seed(&self, nodes: &[Node]) -> Result<()> {
        let api = self.api();
        api.create(json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": NAMESPACE}}))?;
        for node in nodes {
            api.create(json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": node.name,
                    "labels": {"kubernetes.io/hostname": node.name}}}))?;
            let labels: serde_json::Map<String, Value> = SPEAKER_LABELS
                .iter()
                .map(|(k, v)| (k.to_string(), json!(v)))
                .collect();
            let pod = format!("speaker-{}", node.name);
            api.create(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "namespace": NAMESPACE, "labels": labels},
                "spec": {"nodeName": node.name, "hostNetwork": true,
                    "containers": [{"name": "speaker", "image": "swimlb"}]}}))?;
            // The kubelet's part: host network, so the Pod's IP is the node's.
            api.merge_patch(
                "pods",
                Some(NAMESPACE),
                &pod,
                &json!({"status": {"podIP": node.v4.to_string(), "phase": "Running"}}),
                true,
            )?;
        }
        api.create(
            json!({"apiVersion": "swimlb.io/v1beta1", "kind": "IPAddressPool",
            "metadata": {"name": "lab", "namespace": NAMESPACE},
            "spec": {"addresses": [POOL]}}),
        )?;
        api.create(
            json!({"apiVersion": "swimlb.io/v1beta1", "kind": "L2Advertisement",
            "metadata": {"name": "lab", "namespace": NAMESPACE}, "spec": {}}),
        )?;
        let everywhere: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        api.create(service(
            SERVICE,
            &netns::vip_v4(0).to_string(),
            Policy::Cluster,
            None,
        ))?;
        api.create(endpoint_slice(SERVICE, 0, &everywhere))?;
        Ok(())
    }

    /// The fake API server.
    pub fn api(&self) -> &FakeApi {
        &self.api.api
    }

    /// The fake API server, for another thread.
    pub fn api_handle(&self) -> Arc<FakeApi> {
        self.api.api.clone()
    }

    /// The kubeconfig of the API server (reachable from every namespace of the lab).
    pub fn kubeconfig(&self) -> &Path {
        self.api().kubeconfig_path()
    }

    /// Plays an API server outage (`false`) or ends it (`true`).
    pub fn set_reachable(&self, reachable: bool) {
        self.api().set_reachable(reachable);
    }

    /// Starts the controller in the client's namespace (its log: `controller.log`).
    pub fn start_controller(&mut self, lab: &mut Lab) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("controller.log"))?;
        let program = self.program.to_string_lossy().into_owned();
        let mut cmd = Lab::command_in(&lab.client_netns, &program);
        cmd.arg("controller")
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args([
                "--lease-namespace",
                NAMESPACE,
                "--identity",
                "lab-controller",
            ])
            .arg("--listen")
            .arg(SocketAddr::from((netns::CLIENT_V4, CONTROLLER_PORT)).to_string())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log);
        self.controller = Some(lab.spawn(cmd)?);
        Ok(())
    }

    /// Stops the controller (SIGTERM, then its exit), if it runs.
    pub fn stop_controller(&mut self, lab: &mut Lab) -> Result<()> {
        if let Some(child) = self.controller.take() {
            let pid = lab.child(child).id().to_string();
            std::process::Command::new("kill")
                .args(["-TERM", &pid])
                .status()?;
            lab.wait_or_kill(child, Duration::from_secs(10))?;
        }
        Ok(())
    }

    /// The command line of node `node`'s speaker (`keys`: the gossip key file).
    pub fn speaker_command(&self, lab: &Lab, node: &Node, keys: &Path) -> std::process::Command {
        let program = self.program.to_string_lossy().into_owned();
        let mut cmd = Lab::command_in(&node.netns, &program);
        cmd.args(["speaker", "kubernetes", "--cluster"])
            .arg(format!("lab-{}", lab.run_id()))
            .arg("--listen")
            .arg(SocketAddr::from((node.v4, crate::failover::HTTP_PORT)).to_string())
            .args(&self.speaker_args)
            .env("NODE_NAME", &node.name)
            .env("POD_NAMESPACE", NAMESPACE)
            .env("POD_IP", node.v4.to_string())
            .env("SWIMLB_KEY_FILE", keys)
            .env("KUBECONFIG", self.kubeconfig());
        cmd
    }

    /// The status records, for another thread.
    pub fn records(&self) -> Records {
        Records {
            api: self.api.api.clone(),
        }
    }

    /// The node the `ServiceL2Status` record of `namespace/service` names, if there is one.
    pub fn record_node(&self, namespace: &str, service: &str) -> Option<String> {
        self.records().node(namespace, service)
    }

    /// Polls (every 2 ms, at most `limit`) until the record of `namespace/service` names a node
    /// that `wanted` accepts; returns that node and when it was first seen.
    pub fn wait_record(
        &self,
        namespace: &str,
        service: &str,
        limit: Duration,
        wanted: impl Fn(&str) -> bool,
    ) -> Option<(String, Instant)> {
        self.records().wait(namespace, service, limit, wanted)
    }

    /// The IPs the controller wrote into `namespace/service`'s status.
    pub fn ingress(&self, namespace: &str, service: &str) -> Vec<String> {
        self.api()
            .get("services", Some(namespace), service)
            .and_then(|s| {
                s.pointer("/status/loadBalancer/ingress")?
                    .as_array()
                    .map(|list| {
                        list.iter()
                            .filter_map(|i| i["ip"].as_str().map(str::to_string))
                            .collect()
                    })
            })
            .unwrap_or_default()
    }
}

/// A thread waiting for a status record to name another node (see [`Records::watch_change`]).
#[derive(Debug)]
pub struct RecordChange(std::thread::JoinHandle<Option<(String, Instant)>>);

impl RecordChange {
    /// The node the record named instead, and when that was first seen; `None` if it did not
    /// within the limit.
    pub fn join(self) -> Option<(String, Instant)> {
        self.0.join().ok().flatten()
    }
}

/// The `ServiceL2Status` records in the API server's store.
#[derive(Debug, Clone)]
pub struct Records {
    api: Arc<FakeApi>,
}

impl Records {
    /// The node the record of `namespace/service` names, if there is one.
    pub fn node(&self, namespace: &str, service: &str) -> Option<String> {
        let name = record_name(&ServiceKey::new(namespace, service));
        self.api
            .get("servicel2statuses.swimlb.io", Some(NAMESPACE), &name)?
            .pointer("/status/node")?
            .as_str()
            .map(str::to_string)
    }

    /// Every record as (`namespace/service`, node), sorted.
    pub fn all(&self) -> Vec<(String, String)> {
        let mut all: Vec<(String, String)> = self
            .api
            .objects("servicel2statuses.swimlb.io")
            .unwrap_or_default()
            .iter()
            .map(|r| {
                let text = |p: &str| r.pointer(p).and_then(Value::as_str).unwrap_or("");
                (
                    format!(
                        "{}/{}",
                        text("/status/serviceNamespace"),
                        text("/status/serviceName")
                    ),
                    text("/status/node").to_string(),
                )
            })
            .collect();
        all.sort();
        all
    }

    /// Starts polling, on a thread of its own, until the record of [`APPS`]/[`SERVICE`] names a
    /// node other than `from` (at most `limit`): started before a fault, it times the record's
    /// change to within the polling interval.
    pub fn watch_change(&self, from: &str, limit: Duration) -> RecordChange {
        let (records, from) = (self.clone(), from.to_string());
        RecordChange(std::thread::spawn(move || {
            records.wait(APPS, SERVICE, limit, |n| n != from)
        }))
    }

    /// Polls (every 2 ms, at most `limit`) until the record of `namespace/service` names a node
    /// that `wanted` accepts; returns that node and when it was first seen.
    pub fn wait(
        &self,
        namespace: &str,
        service: &str,
        limit: Duration,
        wanted: impl Fn(&str) -> bool,
    ) -> Option<(String, Instant)> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(node) = self.node(namespace, service)
                && wanted(&node)
            {
                return Some((node, Instant::now()));
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// `spec.externalTrafficPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Every node may announce while some endpoint is ready.
    Cluster,
    /// Only nodes with a ready endpoint announce.
    Local,
}

/// A Service of type LoadBalancer in [`APPS`] asking for `ip` (the `loadBalancerIPs`
/// annotation), sharing it under `shared` (`allow-shared-ip`) when given.
pub fn service(name: &str, ip: &str, policy: Policy, shared: Option<&str>) -> Value {
    let mut annotations = json!({"metallb.universe.tf/loadBalancerIPs": ip});
    if let Some(key) = shared {
        annotations["metallb.universe.tf/allow-shared-ip"] = json!(key);
    }
    let mut spec = json!({"type": "LoadBalancer",
        "ports": [{"name": "probe", "port": probe::PROBE_PORT, "protocol": "UDP"}],
        "selector": {"app": name}});
    if policy == Policy::Local {
        spec["externalTrafficPolicy"] = json!("Local");
    }
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": APPS, "annotations": annotations},
        "spec": spec})
}

/// The EndpointSlice `<service>-<n>` of `service`: one ready endpoint on each of `nodes`
/// (addresses from 203.0.113.0/24, as Pod IPs would be).
pub fn endpoint_slice(service: &str, n: usize, nodes: &[&str]) -> Value {
    let endpoints: Vec<Value> = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            json!({"addresses": [format!("203.0.113.{}", 10 + i)], "nodeName": node,
                "conditions": {"ready": true, "serving": true, "terminating": false}})
        })
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{service}-{n}"), "namespace": APPS,
            "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "probe", "port": probe::PROBE_PORT, "protocol": "UDP"}]})
}

/// kube-proxy's part on `node`: traffic to the pool's addresses goes to the node's own address,
/// where the probe responder listens.
fn install_dnat(node: &Node) -> Result<()> {
    let rules = format!(
        "table ip swimlb_lab_proxy {{\n  chain prerouting {{ type nat hook prerouting priority dstnat; ip daddr {POOL} dnat to {}; }}\n}}\n",
        node.v4
    );
    netns::nft_apply(&node.netns, &rules)
}

/// One speaker's `/status` entry for one address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressSeen {
    /// The owner it elected.
    pub owner: Option<String>,
    /// Its verdict (`owner`, `not_owner`, `no_ready_endpoints`, ...).
    pub verdict: String,
    /// The members it sees.
    pub members: usize,
}

/// What every node's speaker says of `ip`, in node order (`None`: no answer, or the address is
/// not in its `/status`).
pub fn address_views(lab: &Lab, ip: &str) -> Vec<Option<AddressSeen>> {
    let nodes: Vec<SocketAddr> = crate::failover::http_addrs(lab);
    let count = nodes.len();
    let ip = ip.to_string();
    probe::in_netns(&lab.client_netns, move || {
        nodes
            .iter()
            .map(|addr| {
                let body = crate::demo::http_get(*addr, "/status")?;
                let v: Value = serde_json::from_str(&body).ok()?;
                let entry = v["addresses"]
                    .as_array()?
                    .iter()
                    .find(|a| a["ip"] == ip.as_str())?;
                Some(AddressSeen {
                    owner: entry["owner"].as_str().map(str::to_string),
                    verdict: entry["verdict"].as_str()?.to_string(),
                    members: v["members"].as_array()?.len(),
                })
            })
            .collect()
    })
    .unwrap_or_else(|_| vec![None; count])
}

/// Waits (at most `limit`, every 100 ms) until every speaker sees every member and they all name
/// one owner for `ip` that `wanted` accepts (`None`: no owner); returns it, or the last views.
pub fn wait_for_owner(
    lab: &Lab,
    ip: &str,
    limit: Duration,
    wanted: impl Fn(Option<&str>) -> bool,
) -> Result<Option<String>, Vec<Option<AddressSeen>>> {
    let deadline = Instant::now() + limit;
    loop {
        let views = address_views(lab, ip);
        let first = views.first().cloned().flatten();
        if let Some(first) = first
            && views.iter().all(|v| {
                v.as_ref()
                    .is_some_and(|v| v.owner == first.owner && v.members == lab.nodes.len())
            })
            && wanted(first.owner.as_deref())
        {
            return Ok(first.owner);
        }
        if Instant::now() > deadline {
            return Err(views);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
