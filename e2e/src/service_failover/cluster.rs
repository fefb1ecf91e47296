//! The cluster `service-failover` measures: a lab of real nodes ([`RealCluster`]) running
//! `deploy/swimlb.yaml` (only the image changed) or MetalLB's `metallb-native.yaml` (its images
//! replaced, its webhook left out: [`realnode::metallb::node_manifest`]), the implementation's
//! `IPAddressPool` and `L2Advertisement` on the lab's segment, the backend `swimlb-echo` as a Deployment of two replicas per node (spread
//! by a topology constraint on the hostname) and a LoadBalancer Service for each
//! `externalTrafficPolicy`.
//!
//! The part on the lab ([`NodeCluster`]) starts on a lab it does not own too: `failover` and
//! `soak` make their lab and its probe responders, then start it there with the workload
//! [`Workload::Probe`] ([`crate::realnode::daemons`]).

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::Implementation;
use crate::control_plane::{self, ControlPlane, Network};
use crate::kubectl::Source;
use crate::kubelab::{self, APPS, POOL, Policy, SERVICE};
use crate::netns::{self, Lab};
use crate::probe::PROBE_PORT;
use crate::realnode::{self, NodeImages, NodeOptions, NodePrograms, RealCluster, image};

/// The backend's name (Deployment, label, container).
pub const BACKEND: &str = "echo";
/// Backend replicas per node.
pub const PER_NODE: usize = 2;
/// How long the cluster may take to be fully up (at start and after a trial).
pub const UP_LIMIT: Duration = Duration::from_secs(240);
/// How long a kubelet may take to report a speaker's CPU rate.
pub const AT_REST_LIMIT: Duration = Duration::from_secs(60);
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The Service of `policy` and its LoadBalancer IP (asked with MetalLB's annotation).
pub fn service_of(policy: Policy) -> (&'static str, Ipv4Addr) {
    match policy {
        Policy::Local => ("echo-local", netns::vip_v4(0)),
        Policy::Cluster => ("echo-cluster", netns::vip_v4(1)),
    }
}

/// What the cluster serves besides the implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// `service-failover`'s: the backend [`BACKEND`] and a Service for each policy
    /// ([`service_of`]).
    Echo,
    /// `failover`'s: the selector-less Service [`SERVICE`] (UDP [`PROBE_PORT`],
    /// `externalTrafficPolicy: Local`) on `vip_v4(0)`, with an EndpointSlice the lab writes
    /// naming each node's own address (where the lab's probe responders answer) with its
    /// `nodeName`: kube-proxy carries a probe to the node that receives it.
    Probe,
}

/// The part of the cluster that lives on a lab it does not own: the control plane (in the
/// lab's client namespace), the real nodes (in its node namespaces) with the images imported,
/// the implementation and the workload. Fields drop in order: nodes, control plane; drop it
/// before the lab.
#[derive(Debug)]
pub struct NodeCluster {
    /// The real nodes.
    pub real: RealCluster,
    /// The control plane (in the client's namespace).
    pub plane: ControlPlane,
    /// What announces the Services' IPs.
    pub implementation: Implementation,
    /// What it serves.
    pub workload: Workload,
}

/// The running cluster with its lab. Fields drop in order: nodes, control plane, lab. It
/// dereferences to its [`NodeCluster`] (`cluster.real`, `cluster.plane`).
#[derive(Debug)]
pub struct ServiceCluster {
    /// The cluster on the lab.
    pub on: NodeCluster,
    /// The lab's namespaces.
    pub lab: Lab,
}

impl std::ops::Deref for ServiceCluster {
    type Target = NodeCluster;
    fn deref(&self) -> &NodeCluster {
        &self.on
    }
}

impl std::ops::DerefMut for ServiceCluster {
    fn deref_mut(&mut self) -> &mut NodeCluster {
        &mut self.on
    }
}

impl ServiceCluster {
    /// Builds the images, starts `nodes` real nodes and everything above, and waits until it
    /// is fully up ([`ServiceCluster::wait_up`]).
    pub fn start(
        nodes: usize,
        implementation: Implementation,
        log: &mut dyn FnMut(&str),
    ) -> Result<ServiceCluster> {
        ServiceCluster::start_with(nodes, implementation, None, log)
    }

    /// [`ServiceCluster::start`], the swimlb manifest naming, when `first` is given, an image
    /// built on the project's with `first.1` set in its environment, tagged `first.0`
    /// ([`NodeImages::with_env_layer`]; every node holds both), in place of the project's
    /// ([`project_tag`]): an upgrade rolls from it to the project's.
    pub fn start_with(
        nodes: usize,
        implementation: Implementation,
        first: Option<(&str, &[(&str, &str)])>,
        log: &mut dyn FnMut(&str),
    ) -> Result<ServiceCluster> {
        realnode::cleanup_stale();
        let lab = Lab::create(nodes)?;
        let on = NodeCluster::start(&lab, implementation, Workload::Echo, first, log)?;
        Ok(ServiceCluster { on, lab })
    }

    /// [`NodeCluster::not_up`] on its lab.
    pub fn not_up(&self) -> Result<Option<String>> {
        self.on.not_up(self.lab.nodes.len())
    }

    /// [`NodeCluster::wait_up`] on its lab.
    pub fn wait_up(&mut self, limit: Duration) -> Result<()> {
        self.on.wait_up(self.lab.nodes.len(), limit)
    }

    /// [`NodeCluster::speakers_at_rest`] on its lab.
    pub fn speakers_at_rest(&self) -> Result<Vec<AtRest>> {
        self.on.speakers_at_rest(&self.lab)
    }
}

impl NodeCluster {
    /// Builds the images, starts a real node in each of `lab`'s node namespaces with a control
    /// plane in its client namespace, applies the implementation's manifest (swimlb's naming
    /// `first`'s image: [`ServiceCluster::start_with`]), its pool and advertisement and the
    /// `workload`, and waits until it is fully up ([`NodeCluster::wait_up`]).
    pub fn start(
        lab: &Lab,
        implementation: Implementation,
        workload: Workload,
        first: Option<(&str, &[(&str, &str)])>,
        log: &mut dyn FnMut(&str),
    ) -> Result<NodeCluster> {
        let started = Instant::now();
        let programs = NodePrograms::locate()?;
        let plane = ControlPlane::start(
            &lab.work_dir().join("k8s"),
            Network::Netns {
                netns: lab.client_netns.clone(),
                ip: netns::CLIENT_V4,
            },
            &control_plane::Options {
                nodes: lab.nodes.iter().map(|n| n.name.clone()).collect(),
                ..control_plane::Options::default()
            },
        )?;
        let tag = project_tag();
        let dir = lab.work_dir().join("images");
        let profile = image::profile_of_current_exe()?;
        let mut images = NodeImages::build(&programs, &dir, &profile, &tag)?;
        if workload == Workload::Echo {
            images = images.with_echo(&dir, &format!("localhost/swimlb/echo:{VERSION}"))?;
        }
        if implementation == Implementation::Metallb {
            images = images.with_metallb(&dir)?;
        }
        if let Some((first, env)) = first {
            images = images.with_env_layer(&dir, first, env)?;
        }
        let speakers = first.map_or(tag.as_str(), |(first, _)| first);
        log(&format!(
            "images built at {:.0} s",
            started.elapsed().as_secs_f64()
        ));
        let real = RealCluster::start(lab, &plane, &programs, &NodeOptions::default(), &images)?;
        route_pods_between(lab, &real)?;
        log(&format!(
            "nodes Ready at {:.0} s",
            started.elapsed().as_secs_f64()
        ));
        let mut cluster = NodeCluster {
            real,
            plane,
            implementation,
            workload,
        };
        let manifest = match &images.metallb {
            Some(m) => m.manifest()?,
            None => manifest_with_image(speakers)?,
        };
        cluster.plane.kubectl().apply(Source::Text(&manifest))?;
        cluster.apply_objects(lab, &images)?;
        cluster.wait_up(lab.nodes.len(), UP_LIMIT)?;
        log(&format!(
            "cluster up at {:.0} s",
            started.elapsed().as_secs_f64()
        ));
        Ok(cluster)
    }

    /// The pool, the advertisement and the workload (retried while the CRDs the manifest made
    /// are not served yet).
    fn apply_objects(&self, lab: &Lab, images: &NodeImages) -> Result<()> {
        let admin = self.plane.admin();
        let deadline = Instant::now() + Duration::from_secs(60);
        let (api, namespace) = self.implementation.config_api();
        let pool = json!({"apiVersion": api, "kind": "IPAddressPool",
            "metadata": {"name": "lab", "namespace": namespace}, "spec": {"addresses": [POOL]}});
        while let Err(e) = admin.apply(pool.clone(), "swimlb-lab") {
            if Instant::now() > deadline {
                return Err(e.context("the IPAddressPool"));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        admin.apply(
            json!({"apiVersion": api, "kind": "L2Advertisement",
                "metadata": {"name": "lab", "namespace": namespace}, "spec": {}}),
            "swimlb-lab",
        )?;
        match self.workload {
            Workload::Echo => {
                let echo = images.echo.as_ref().context("the backend's image")?;
                admin.apply(backend(&echo.1, PER_NODE * lab.nodes.len()), "swimlb-lab")?;
                for policy in [Policy::Local, Policy::Cluster] {
                    admin.apply(service(policy), "swimlb-lab")?;
                }
            }
            Workload::Probe => {
                admin.apply(probe_service(), "swimlb-lab")?;
                admin.apply(probe_slice(lab, SERVICE), "swimlb-lab")?;
            }
        }
        Ok(())
    }

    /// The workload's Services: name, IP, ready endpoints wanted.
    fn services(&self, nodes: usize) -> Vec<(&'static str, Ipv4Addr, usize)> {
        match self.workload {
            Workload::Echo => [Policy::Local, Policy::Cluster]
                .into_iter()
                .map(|policy| {
                    let (name, ip) = service_of(policy);
                    (name, ip, PER_NODE * nodes)
                })
                .collect(),
            Workload::Probe => vec![(SERVICE, netns::vip_v4(0), nodes)],
        }
    }

    /// The label of the implementation's speaker Pods (`key`, `speaker`).
    pub fn speaker_label(&self) -> &'static str {
        match self.implementation {
            Implementation::Swimlb => "app.kubernetes.io/component",
            Implementation::Metallb => "component",
        }
    }

    /// The speaker Pods as the API server lists them.
    pub fn speaker_pods(&self) -> Result<Vec<Value>> {
        let (_, namespace) = self.implementation.config_api();
        let label = self.speaker_label();
        Ok(self
            .plane
            .admin()
            .list("v1", "Pod", Some(namespace))?
            .into_iter()
            .filter(|p| p["metadata"]["labels"][label] == "speaker")
            .collect())
    }

    /// Why the cluster of `n` nodes is not fully up, or `None` when it is: every Node Ready, a
    /// speaker Ready on each, every endpoint of the workload's Services ready, their IPs
    /// assigned.
    pub fn not_up(&self, n: usize) -> Result<Option<String>> {
        let admin = self.plane.admin();
        let nodes = admin.list("v1", "Node", None)?;
        let ready = nodes.iter().filter(|x| realnode::node_ready(x)).count();
        if ready < n {
            return Ok(Some(format!("{ready} of {n} Nodes Ready")));
        }
        let speakers = self.speaker_pods()?.iter().filter(|p| pod_ready(p)).count();
        if speakers < n {
            return Ok(Some(format!("{speakers} of {n} speakers Ready")));
        }
        for (name, ip, wanted) in self.services(n) {
            let svc = admin.get("v1", "Service", Some(APPS), name)?;
            let assigned = svc
                .as_ref()
                .map(|s| s["status"]["loadBalancer"]["ingress"][0]["ip"] == ip.to_string())
                .unwrap_or(false);
            if !assigned {
                return Ok(Some(format!("{name} has no ingress IP {ip} yet")));
            }
            let endpoints = ready_endpoints(admin, name)?;
            if endpoints < wanted {
                return Ok(Some(format!("{name}: {endpoints} ready endpoints")));
            }
        }
        Ok(None)
    }

    /// Waits until the cluster of `n` nodes is fully up, at most `limit`; fails saying what
    /// is not.
    pub fn wait_up(&mut self, n: usize, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            self.real.check_running()?;
            let why = match self.not_up(n) {
                Ok(None) => return Ok(()),
                Ok(Some(why)) => why,
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() > deadline {
                bail!("the cluster is not up within {limit:?}: {why}");
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// A speaker container's memory and CPU as its node's kubelet reports them (`/stats/summary`).
#[derive(Debug, Clone, Serialize)]
pub struct AtRest {
    /// `swimlb-kubernetes` or `metallb`.
    #[serde(rename = "impl")]
    pub implementation: &'static str,
    /// The node.
    pub node: String,
    /// The container's working set.
    pub working_set_mib: f64,
    /// The container cgroup's RSS (anonymous memory, not the mapped binary).
    pub rss_mib: f64,
    /// `usageNanoCores` as a percentage of one core.
    pub cpu_percent: f64,
}

impl NodeCluster {
    /// Each node's speaker container as its kubelet reports it, once the kubelet has a CPU rate
    /// for it (two samples), at most [`AT_REST_LIMIT`] per node.
    pub fn speakers_at_rest(&self, lab: &Lab) -> Result<Vec<AtRest>> {
        let (_, namespace) = self.implementation.config_api();
        let mut out = Vec::new();
        for node in &self.real.nodes {
            let kubelet = node.kubelet_api(&self.plane, &lab.client_netns)?;
            let deadline = Instant::now() + AT_REST_LIMIT;
            loop {
                // The kubelet answers 500 while a container's file system is being mounted.
                let summary = kubelet.raw_get("/stats/summary");
                if let Some(a) = summary
                    .as_ref()
                    .ok()
                    .and_then(|s| speaker_usage(s, namespace))
                {
                    out.push(AtRest {
                        implementation: self.implementation.name(),
                        node: node.name.clone(),
                        ..a
                    });
                    break;
                }
                if Instant::now() > deadline {
                    bail!(
                        "no CPU figure for {}'s speaker in its /stats/summary within \
                         {AT_REST_LIMIT:?}; the last answer: {}",
                        node.name,
                        match &summary {
                            Ok(s) => s.to_string(),
                            Err(e) => format!("{e:#}"),
                        }
                    );
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        Ok(out)
    }
}

/// The container `speaker` of a Pod in `namespace` in a kubelet's `/stats/summary`, once it has
/// a CPU rate (the implementation's and node's names left empty).
fn speaker_usage(summary: &Value, namespace: &str) -> Option<AtRest> {
    let c = summary["pods"]
        .as_array()?
        .iter()
        .filter(|p| p["podRef"]["namespace"] == namespace)
        .flat_map(|p| p["containers"].as_array().into_iter().flatten())
        .find(|c| c["name"] == "speaker")?;
    let cpu = c["cpu"]["usageNanoCores"].as_u64()?;
    let mib = |v: &Value| v.as_u64().unwrap_or_default() as f64 / 1_048_576.0;
    Some(AtRest {
        implementation: "",
        node: String::new(),
        working_set_mib: mib(&c["memory"]["workingSetBytes"]),
        rss_mib: mib(&c["memory"]["rssBytes"]),
        cpu_percent: cpu as f64 / 1e7,
    })
}

/// Whether a Pod's `Ready` condition is true.
pub fn pod_ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// The ready endpoints of Service `name`'s EndpointSlices.
fn ready_endpoints(admin: &crate::kube_client::Kube, name: &str) -> Result<usize> {
    ready_endpoints_on(admin, name, None)
}

/// The ready endpoints of Service `name`'s EndpointSlices (on `node` only, when given).
pub fn ready_endpoints_on(
    admin: &crate::kube_client::Kube,
    name: &str,
    node: Option<&str>,
) -> Result<usize> {
    let slices = admin.list("discovery.k8s.io/v1", "EndpointSlice", Some(APPS))?;
    Ok(slices
        .iter()
        .filter(|s| s["metadata"]["labels"]["kubernetes.io/service-name"] == name)
        .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
        .filter(|e| node.is_none_or(|n| e["nodeName"] == n))
        .filter(|e| e["conditions"]["ready"] == true)
        .count())
}

/// Each node routes the other nodes' Pod subnets through them (the bridge plugin connects only
/// a node's own Pods), so kube-proxy with `Cluster` reaches a Pod on another node.
fn route_pods_between(lab: &Lab, real: &RealCluster) -> Result<()> {
    for node in &real.nodes {
        for other in real.nodes.iter().filter(|o| o.name != node.name) {
            lab.run_in(
                &node.netns,
                "ip",
                &[
                    "route",
                    "replace",
                    &other.pod_cidr,
                    "via",
                    &other.ip.to_string(),
                ],
            )
            .with_context(|| format!("{}'s route to {}'s Pods", node.name, other.name))?;
        }
    }
    Ok(())
}

/// The reference of the project's image as the cluster's nodes hold it.
pub fn project_tag() -> String {
    format!("localhost/swimlb/swimlb:{VERSION}-service-failover")
}

/// `deploy/swimlb.yaml` with `image` in place of the published image reference.
pub fn manifest_with_image(image: &str) -> Result<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/swimlb.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    let published = format!("image: localhost/swimlb/swimlb:{VERSION}");
    if !text.contains(&published) {
        bail!("{} names no `{published}`", path.display());
    }
    Ok(text.replace(&published, &format!("image: {image}")))
}

/// The backend's Deployment: `replicas` Pods of `image`, at most one more on a node than on
/// another (so two per node), ready when their port answers.
fn backend(image: &str, replicas: usize) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": BACKEND, "namespace": APPS},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": BACKEND}},
            "template": {"metadata": {"labels": {"app": BACKEND}},
                "spec": {
                    "topologySpreadConstraints": [{"maxSkew": 1,
                        "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "DoNotSchedule",
                        "labelSelector": {"matchLabels": {"app": BACKEND}}}],
                    "containers": [{"name": BACKEND, "image": image,
                        "imagePullPolicy": "Never",
                        "ports": [{"name": "http", "containerPort": 8080}],
                        "readinessProbe": {"tcpSocket": {"port": 8080},
                            "periodSeconds": 1}}]}}}})
}

/// `failover`'s Service ([`Workload::Probe`]): [`kubelab::service`]'s for [`SERVICE`] on
/// `vip_v4(0)` with `Local`, without a selector (the lab writes its endpoints).
fn probe_service() -> Value {
    let mut svc = kubelab::service(SERVICE, &netns::vip_v4(0).to_string(), Policy::Local, None);
    if let Some(spec) = svc["spec"].as_object_mut() {
        spec.remove("selector");
    }
    svc
}

/// The EndpointSlice `<name>-nodes` of the selector-less Service `name` (`failover`'s, and
/// `migrate`'s): each node's own address (where the lab's probe responder listens on
/// [`PROBE_PORT`]), ready, with its `nodeName`, so kube-proxy carries a probe to the responder of
/// the node that received it.
pub fn probe_slice(lab: &Lab, name: &str) -> Value {
    let endpoints: Vec<Value> = lab
        .nodes
        .iter()
        .map(|n| {
            json!({"addresses": [n.v4.to_string()], "nodeName": n.name,
                "conditions": {"ready": true, "serving": true, "terminating": false}})
        })
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{name}-nodes"), "namespace": APPS,
            "labels": {"kubernetes.io/service-name": name,
                "endpointslice.kubernetes.io/managed-by": "swimlb-lab"}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "probe", "port": PROBE_PORT, "protocol": "UDP"}]})
}

/// The LoadBalancer Service of `policy` in front of the backend, port 80.
fn service(policy: Policy) -> Value {
    let (name, ip) = service_of(policy);
    let policy = match policy {
        Policy::Local => "Local",
        Policy::Cluster => "Cluster",
    };
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": APPS,
            "annotations": {"metallb.universe.tf/loadBalancerIPs": ip.to_string()}},
        "spec": {"type": "LoadBalancer", "externalTrafficPolicy": policy,
            "selector": {"app": BACKEND},
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_speaker_at_rest_is_the_container_of_the_implementations_namespace_with_a_cpu_rate() {
        let pod = |ns: &str, cpu: Option<u64>| {
            json!({"podRef": {"namespace": ns}, "containers": [{"name": "speaker",
                "cpu": {"usageNanoCores": cpu},
                "memory": {"workingSetBytes": 8_388_608u64, "rssBytes": 4_194_304u64}}]})
        };
        let summary =
            json!({"pods": [pod("other", Some(1)), pod("metallb-system", Some(25_000_000))]});
        let a = speaker_usage(&summary, "metallb-system").unwrap();
        assert_eq!(
            (a.working_set_mib, a.rss_mib, a.cpu_percent),
            (8.0, 4.0, 2.5)
        );
        assert!(
            speaker_usage(
                &json!({"pods": [pod("metallb-system", None)]}),
                "metallb-system"
            )
            .is_none()
        );
        assert!(speaker_usage(&summary, "swimlb-system").is_none());
        assert!(speaker_usage(&Value::Null, "swimlb-system").is_none());
    }
}
