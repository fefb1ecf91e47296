//! The Kubernetes lab's vocabulary, shared by everything that runs on the real control plane
//! ([`crate::control_plane`]) and the real nodes ([`crate::realnode`]): the control plane in
//! the lab's client namespace ([`start_plane`]: the API server on [`API_ADDR`], 198.51.100.2:6443,
//! reached by every node over the lab bridge), the names the lab uses ([`NAMESPACE`], [`APPS`],
//! [`SERVICE`], [`POOL`]), the Service and EndpointSlice builders ([`service`],
//! [`endpoint_slice`]), the `ServiceL2Status` records ([`Records`], [`record_node_of`]), and
//! what every speaker's `/status` says of an address ([`address_views`], [`wait_for_owner`]).
//!
//! The lab once played each node's kubelet here (the Node registered, its heartbeat Lease, the
//! Pods' status) and ran the speakers and the controller as its own processes; the real nodes
//! replaced both (docs/src/development/lab.md, "What the lab plays itself, and why").

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result};
use serde_json::{Value, json};
use swimlb_config::service::ServiceKey;
use swimlb_speaker::sources::kubernetes::records::record_name;
use tokio::time::Instant;

use crate::control_plane::{self, ControlPlane, Network};
use crate::kube_client::Kube;
use crate::netns::{self, Lab};
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
/// The node the record of `namespace/service` names, as `kube` reads it.
pub fn record_node_of(kube: &Kube, namespace: &str, service: &str) -> Option<String> {
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

/// The IPs the controller wrote into `namespace/service`'s status, as `api` reads them now.
pub fn ingress(api: &Kube, namespace: &str, service: &str) -> Vec<String> {
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
