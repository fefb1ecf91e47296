//! The Kubernetes lab: the lab's network (see [`crate::netns`]) turned into a small cluster on
//! the real control plane ([`crate::control_plane`]).
//!
//! - etcd, kube-apiserver, kube-controller-manager and kube-scheduler run in the client's
//!   namespace; the API server listens on [`API_ADDR`] (198.51.100.2:6443), so every node
//!   reaches it over the lab bridge. An API server outage ([`Cluster::set_reachable`]) stops the
//!   kube-apiserver process and starts it again.
//! - `deploy/swimlb.yaml` is applied with the pinned `kubectl apply --server-side`, without its
//!   workloads (the DaemonSet and the Deployment): the Namespace, the CRDs, the
//!   ServiceAccounts and their RBAC are the manifest's own.
//! - The real controller (`swimlb-lab controller`) runs in the client's namespace as the
//!   `swimlb-controller` ServiceAccount (a token the API server issued) and assigns the
//!   Services' IPs from the pool `lab` (198.51.100.100/30).
//! - A speaker in Kubernetes mode (`swimlb-lab speaker kubernetes`) runs in each node
//!   namespace as the DaemonSet's Pod would, as the `swimlb-speaker` ServiceAccount:
//!   `NODE_NAME`, `POD_IP` (the node's address: host network), the namespace, a key file as the
//!   mounted Secret would hold it. Its Pod object `speaker-NODE` exists, bound to its node.
//! - The lab plays each node's kubelet with the node's own credential (`system:node:NODE`):
//!   it registers the Node, renews its heartbeat Lease, and writes the status of the Pods bound
//!   to it (the speaker's, and the Service `web`'s backend `web-NODE`, ready, with an address
//!   from 203.0.113.0/24). The real EndpointSlice controller makes `web`'s EndpointSlice from
//!   those Pods. Other tests' Services get EndpointSlices written by the lab
//!   ([`endpoint_slice`], managed by `swimlb-lab`).
//! - VIP traffic reaches each node's probe responder the way kube-proxy delivers it: an
//!   nftables DNAT of the pool's addresses to the node's own address in `prerouting`. The VIP is
//!   never a local address, so the kernel never answers ARP for it: only the speakers do.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context as _, Result};
use serde_json::{Value, json};
use swimlb_config::service::ServiceKey;
use swimlb_speaker::sources::kubernetes::records::record_name;
use tokio::time::Instant;

use crate::control_plane::{self, ControlPlane, Network};
use crate::kube_client::Kube;
use crate::kubectl::Source;
use crate::netns::{self, Lab, Node};
use crate::probe;

/// Where the API server listens: the client's address, port 6443.
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
/// The annotation that lets Services share an IP (the same key on each).
pub const SHARED_ANNOTATION: &str = "metallb.universe.tf/allow-shared-ip";
/// The API version of swimlb's `ServiceL2Status` records.
const RECORDS_API: &str = "swimlb.io/v1beta1";
/// The speaker Pods' labels (the speakers' default `--speaker-selector`).
const SPEAKER_LABELS: [(&str, &str); 2] = [
    ("app.kubernetes.io/name", "swimlb"),
    ("app.kubernetes.io/component", "speaker"),
];

/// The cluster of a Kubernetes lab: the control plane, the controller, the kubelets the lab
/// plays.
#[derive(Debug)]
pub struct Cluster {
    /// Renews the nodes' Leases while the cluster lives; first, so it stops (on drop) before
    /// the control plane it talks to.
    _heartbeats: Heartbeats,
    plane: ControlPlane,
    program: PathBuf,
    dir: PathBuf,
    controller: Option<usize>,
    /// Each node's kubelet client, by node name.
    kubelets: Arc<Vec<(String, Kube)>>,
    /// Extra flags for every speaker started after they are set (`--preempt-delay 30s`).
    pub speaker_args: Vec<String>,
}

/// The kubelets' heartbeat: every node's Lease renewed every 10 s on a thread of its own.
#[derive(Debug)]
struct Heartbeats {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Heartbeats {
    fn start(kubelets: Arc<Vec<(String, Kube)>>) -> Heartbeats {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut next = Instant::now();
            while !stopped.load(Ordering::Relaxed) {
                if Instant::now() >= next {
                    // An outage of the API server fails a renewal; the next one catches up.
                    for (node, kubelet) in kubelets.iter() {
                        let _ = control_plane::heartbeat(kubelet, node);
                    }
                    next = Instant::now() + Duration::from_secs(10);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Heartbeats {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Heartbeats {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Cluster {
    /// Starts the control plane in the client's namespace, applies `deploy/swimlb.yaml`
    /// without its workloads, registers the nodes, seeds the cluster (the speaker Pods, the pool,
    /// one L2Advertisement for every node, the Service [`SERVICE`] on 198.51.100.100 with a
    /// ready backend Pod on every node), installs kube-proxy's DNAT on every node and starts the
    /// controller. `program` is the lab binary; `dir` holds the logs and the control plane's
    /// files.
    pub fn start(lab: &mut Lab, program: PathBuf, dir: PathBuf) -> Result<Cluster> {
        let plane = start_plane(lab, &dir)?;
        apply_manifest(&plane)?;
        let kubelets = Arc::new(register_nodes(&plane, &lab.nodes)?);
        for (name, account) in [
            ("speaker", "swimlb-speaker"),
            ("controller", "swimlb-controller"),
        ] {
            plane.service_account_kubeconfig(
                NAMESPACE,
                account,
                &dir.join(format!("{name}.kubeconfig")),
            )?;
        }
        let mut cluster = Cluster {
            _heartbeats: Heartbeats::start(kubelets.clone()),
            plane,
            program,
            dir,
            controller: None,
            kubelets,
            // For A/B runs: `SWIMLB_LAB_SPEAKER_ARGS='--owner-watch off'` is added to every
            // speaker's command line.
            speaker_args: std::env::var("SWIMLB_LAB_SPEAKER_ARGS")
                .map(|args| args.split_whitespace().map(str::to_string).collect())
                .unwrap_or_default(),
        };
        cluster.seed(&lab.nodes)?;
        for node in &lab.nodes {
            install_dnat(node)?;
        }
        cluster.start_controller(lab)?;
        Ok(cluster)
    }

    fn seed(&self, nodes: &[Node]) -> Result<()> {
        let api = self.api();
        for (i, node) in nodes.iter().enumerate() {
            let labels: serde_json::Map<String, Value> = SPEAKER_LABELS
                .iter()
                .map(|(k, v)| (k.to_string(), json!(v)))
                .collect();
            let speaker = format!("speaker-{}", node.name);
            api.create(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": speaker, "namespace": NAMESPACE, "labels": labels},
                "spec": {"nodeName": node.name, "hostNetwork": true,
                    "serviceAccountName": "swimlb-speaker",
                    "containers": [{"name": "speaker", "image": "swimlb"}]}}))?;
            // Host network: the Pod's IP is the node's.
            self.pod_running(&node.name, NAMESPACE, &speaker, &node.v4.to_string())?;
            let backend = format!("{SERVICE}-{}", node.name);
            api.create(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": backend, "namespace": APPS, "labels": {"app": SERVICE}},
                "spec": {"nodeName": node.name,
                    "containers": [{"name": "web", "image": "lab",
                        "ports": [{"name": "probe", "containerPort": probe::PROBE_PORT,
                            "protocol": "UDP"}]}]}}))?;
            self.pod_running(&node.name, APPS, &backend, &format!("203.0.113.{}", 10 + i))?;
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
        api.create(lab_service())?;
        Ok(())
    }

    /// The kubelet of `node` reports Pod `namespace/name` running and ready at `ip`.
    pub fn pod_running(&self, node: &str, namespace: &str, name: &str, ip: &str) -> Result<()> {
        let kubelet = self
            .kubelets
            .iter()
            .find(|(n, _)| n == node)
            .map(|(_, k)| k)
            .with_context(|| format!("no kubelet for {node}"))?;
        kubelet.merge_patch(
            "v1",
            "Pod",
            Some(namespace),
            name,
            json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                "hostIP": ip,
                "conditions": [{"type": "Ready", "status": "True"},
                    {"type": "ContainersReady", "status": "True"}]}}),
            true,
        )?;
        Ok(())
    }

    /// The administrator's client of the API server.
    pub fn api(&self) -> &Kube {
        self.plane.admin()
    }

    /// The control plane.
    pub fn control_plane(&self) -> &ControlPlane {
        &self.plane
    }

    /// The control plane, to stop and start its parts.
    pub fn control_plane_mut(&mut self) -> &mut ControlPlane {
        &mut self.plane
    }

    /// The kubeconfig of the speakers (their ServiceAccount's token).
    pub fn speaker_kubeconfig(&self) -> PathBuf {
        self.dir.join("speaker.kubeconfig")
    }

    /// Plays an API server outage (`false`: the kube-apiserver process stops) or ends it
    /// (`true`: it starts again and is ready).
    pub fn set_reachable(&mut self, reachable: bool) -> Result<()> {
        if reachable {
            self.plane.start_apiserver()
        } else {
            self.plane.stop_apiserver()
        }
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
            .arg(self.dir.join("controller.kubeconfig"))
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
            .arg(SocketAddr::from((node.v4, crate::lab::HTTP_PORT)).to_string())
            .args(&self.speaker_args)
            .env("NODE_NAME", &node.name)
            .env("POD_NAMESPACE", NAMESPACE)
            .env("POD_IP", node.v4.to_string())
            .env("SWIMLB_KEY_FILE", keys)
            .env("KUBECONFIG", self.speaker_kubeconfig());
        cmd
    }

    /// The status records, for another thread (its own client of the API server).
    pub fn records(&self) -> Records {
        Records::new(&self.plane, RECORDS_API, NAMESPACE)
    }

    /// The node the `ServiceL2Status` record of `namespace/service` names, if there is one.
    pub fn record_node(&self, namespace: &str, service: &str) -> Option<String> {
        record_node_of(self.api(), namespace, service)
    }

    /// Polls (every 10 ms, at most `limit`) until the record of `namespace/service` names a
    /// node that `wanted` accepts; returns that node and when it was first seen.
    pub fn wait_record(
        &self,
        namespace: &str,
        service: &str,
        limit: Duration,
        wanted: impl Fn(&str) -> bool,
    ) -> Option<(String, Instant)> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(node) = self.record_node(namespace, service)
                && wanted(&node)
            {
                return Some((node, Instant::now()));
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The IPs the controller wrote into `namespace/service`'s status.
    pub fn ingress(&self, namespace: &str, service: &str) -> Vec<String> {
        ingress(self.api(), namespace, service)
    }
}

/// `kubectl apply --server-side` of `deploy/swimlb.yaml` (from the control plane's namespace), without the workloads
/// the lab runs itself (the speakers' DaemonSet, the controller's Deployment).
fn apply_manifest(plane: &ControlPlane) -> Result<()> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/swimlb.yaml");
    let text = std::fs::read_to_string(&path)?;
    let kept: Vec<&str> = text
        .split("\n---\n")
        .filter(|doc| {
            !doc.lines()
                .any(|l| l == "kind: DaemonSet" || l == "kind: Deployment")
        })
        .collect();
    plane
        .kubectl()
        .apply(Source::Text(&kept.join("\n---\n")))
        .context("kubectl apply --server-side -f deploy/swimlb.yaml")?;
    Ok(())
}

/// The node the record of `namespace/service` names, as `kube` reads it.
fn record_node_of(kube: &Kube, namespace: &str, service: &str) -> Option<String> {
    let name = record_name(&ServiceKey::new(namespace, service));
    kube.get(
        "swimlb.io/v1beta1",
        "ServiceL2Status",
        Some(NAMESPACE),
        &name,
    )
    .ok()??
    .pointer("/status/node")?
    .as_str()
    .map(str::to_string)
}

/// The control plane in the client's namespace (on [`API_ADDR`]), for [`Cluster`] and the
/// real nodes' tests.
pub fn start_plane(lab: &Lab, dir: &Path) -> Result<ControlPlane> {
    let options = control_plane::Options {
        nodes: lab.nodes.iter().map(|n| n.name.clone()).collect(),
        ..control_plane::Options::default()
    };
    let network = Network::Netns {
        netns: lab.client_netns.clone(),
        ip: netns::CLIENT_V4,
    };
    ControlPlane::start(&dir.join("k8s"), network, &options).context("starting the control plane")
}

/// Every node's Node registered by its kubelet; each node's kubelet client, by node name.
fn register_nodes(plane: &ControlPlane, nodes: &[Node]) -> Result<Vec<(String, Kube)>> {
    let mut kubelets = Vec::new();
    for node in nodes {
        let kubelet = plane
            .register_node(&node.name, node.v4.into())
            .with_context(|| format!("registering {}", node.name))?;
        kubelets.push((node.name.clone(), kubelet));
    }
    Ok(kubelets)
}

/// The IPs the controller wrote into `namespace/service`'s status, as `api` reads them now.
fn ingress(api: &Kube, namespace: &str, service: &str) -> Vec<String> {
    api.get("v1", "Service", Some(namespace), service)
        .ok()
        .flatten()
        .map(|s| ingress_ips(&s))
        .unwrap_or_default()
}

/// The IPs of a Service's `status.loadBalancer.ingress`.
pub fn ingress_ips(service: &Value) -> Vec<String> {
    service
        .pointer("/status/loadBalancer/ingress")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(|i| i["ip"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Records as (`namespace/service`, node), sorted.
fn record_pairs(records: &[Value]) -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = records
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

/// What [`Records::read`] found.
#[derive(Debug, Clone)]
pub struct RecordsRead {
    /// Every record as (`namespace/service`, node), sorted.
    pub records: Vec<(String, String)>,
    /// Every Service of [`APPS`].
    pub services: Vec<Value>,
}

/// The `ServiceL2Status` records in the API server, read by a client of their own (another
/// thread may watch them while the lab goes on).
#[derive(Debug, Clone)]
pub struct Records {
    kubeconfig: PathBuf,
    netns: Option<String>,
    /// The records' API version (swimlb's or MetalLB's `ServiceL2Status`) and namespace.
    api_version: &'static str,
    namespace: &'static str,
}

impl Records {
    /// The records of `api_version` in `namespace`, read with `plane`'s admin credentials.
    pub fn new(
        plane: &ControlPlane,
        api_version: &'static str,
        namespace: &'static str,
    ) -> Records {
        Records {
            kubeconfig: plane.admin_kubeconfig(),
            netns: plane.netns().map(str::to_string),
            api_version,
            namespace,
        }
    }

    /// A client of its own.
    pub fn client(&self) -> Result<Kube> {
        Kube::from_kubeconfig_in(&self.kubeconfig, self.netns.as_deref())
    }

    /// With `kube` (from [`Records::client`]): every record and every Service of [`APPS`];
    /// `None` when the API server did not answer.
    pub fn read(&self, kube: &Kube) -> Option<RecordsRead> {
        let records = kube
            .list(self.api_version, "ServiceL2Status", Some(self.namespace))
            .ok()?;
        let services = kube.list("v1", "Service", Some(APPS)).ok()?;
        Some(RecordsRead {
            records: record_pairs(&records),
            services,
        })
    }

    /// Every record as (`namespace/service`, node), sorted.
    pub fn all(&self) -> Vec<(String, String)> {
        let records = self
            .client()
            .and_then(|k| k.list(self.api_version, "ServiceL2Status", Some(self.namespace)))
            .unwrap_or_default();
        record_pairs(&records)
    }

    /// Starts watching, on a thread of its own, until the record of [`APPS`]/[`SERVICE`] names
    /// a node other than `from` (at most `limit`): started before a fault, it times the
    /// record's change to when the watch event arrives. The watch resumes after an outage of
    /// the API server, as a client's would.
    pub fn watch_change(&self, from: &str, limit: Duration) -> Result<RecordChange> {
        let (records, from) = (self.clone(), from.to_string());
        let (listed_tx, listed) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let kube = records.client().ok()?;
            let name = record_name(&ServiceKey::new(APPS, SERVICE));
            let api = kube
                .api("swimlb.io/v1beta1", "ServiceL2Status", Some(NAMESPACE))
                .ok()?;
            let config =
                kube::runtime::watcher::Config::default().fields(&format!("metadata.name={name}"));
            kube.block_on(async move {
                use futures::StreamExt as _;
                use kube::runtime::watcher::Event;
                let events = kube::runtime::WatchStreamExt::default_backoff(
                    kube::runtime::watcher(api, config),
                );
                futures::pin_mut!(events);
                let watch = async {
                    while let Some(event) = events.next().await {
                        let node = match event {
                            Ok(Event::Apply(r) | Event::InitApply(r)) => {
                                r.data["status"]["node"].as_str().map(str::to_string)
                            }
                            Ok(Event::InitDone) => {
                                let _ = listed_tx.send(());
                                None
                            }
                            _ => None,
                        };
                        if let Some(node) = node.filter(|n| *n != from) {
                            return Some((node, Instant::now()));
                        }
                    }
                    None
                };
                tokio::time::timeout(limit, watch).await.ok().flatten()
            })
        });
        // The watch must stand before the fault (and before an outage of the API server).
        listed
            .recv_timeout(Duration::from_secs(10))
            .context("the status record's watch did not list within 10 s")?;
        Ok(RecordChange(thread))
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

/// The lab's Service, [`SERVICE`], asking for the first VIP for every node (`Cluster`).
pub fn lab_service() -> Value {
    service(
        SERVICE,
        &netns::vip_v4(0).to_string(),
        Policy::Cluster,
        None,
    )
}

/// A Service of type LoadBalancer in [`APPS`] asking for `ip` (the `loadBalancerIPs`
/// annotation), sharing it under `shared` (`allow-shared-ip`) when given.
pub fn service(name: &str, ip: &str, policy: Policy, shared: Option<&str>) -> Value {
    let mut annotations = json!({"metallb.universe.tf/loadBalancerIPs": ip});
    if let Some(key) = shared {
        annotations[SHARED_ANNOTATION] = json!(key);
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
            "labels": {"kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": "swimlb-lab"}},
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
    let ip = ip.to_string();
    crate::lab::read_each(
        lab,
        crate::lab::http_addrs(lab),
        "/status",
        1,
        move |body| {
            let v: Value = serde_json::from_str(body).ok()?;
            let entry = v["addresses"]
                .as_array()?
                .iter()
                .find(|a| a["ip"] == ip.as_str())?;
            Some(AddressSeen {
                owner: entry["owner"].as_str().map(str::to_string),
                verdict: entry["verdict"].as_str()?.to_string(),
                members: v["members"].as_array()?.len(),
            })
        },
    )
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
