//! The cluster `service-failover` measures: a lab of real nodes ([`RealCluster`]) running
//! `deploy/swimlb.yaml` (only the image changed) or MetalLB's `metallb-native.yaml` (its images
//! replaced, its webhook left out: [`realnode::metallb::node_manifest`]), the implementation's
//! `IPAddressPool` and `L2Advertisement` on the lab's segment, the backend `swimlb-echo` as a Deployment of two replicas per node (spread
//! by a topology constraint on the hostname) and a LoadBalancer Service for each
//! `externalTrafficPolicy`.

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
use crate::kubelab::{APPS, POOL, Policy};
use crate::netns::{self, Lab};
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

/// The running cluster. Fields drop in order: nodes, control plane, lab.
#[derive(Debug)]
pub struct ServiceCluster {
    /// The real nodes.
    pub real: RealCluster,
    /// The control plane (in the client's namespace).
    pub plane: ControlPlane,
    /// The lab's namespaces.
    pub lab: Lab,
    /// What announces the Services' IPs.
    pub implementation: Implementation,
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
        let started = Instant::now();
        let programs = NodePrograms::locate()?;
        realnode::cleanup_stale();
        let lab = Lab::create(nodes)?;
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
        let mut images = NodeImages::build(&programs, &dir, &profile, &tag)?
            .with_echo(&dir, &format!("localhost/swimlb/echo:{VERSION}"))?;
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
        let real = RealCluster::start(&lab, &plane, &programs, &NodeOptions::default(), &images)?;
        route_pods_between(&lab, &real)?;
        log(&format!(
            "nodes Ready at {:.0} s",
            started.elapsed().as_secs_f64()
        ));
        let mut cluster = ServiceCluster {
            real,
            plane,
            lab,
            implementation,
        };
        let manifest = match &images.metallb {
            Some(m) => m.manifest()?,
            None => manifest_with_image(speakers)?,
        };
        cluster.plane.kubectl().apply(Source::Text(&manifest))?;
        cluster.apply_objects(&images)?;
        cluster.wait_up(UP_LIMIT)?;
        log(&format!(
            "cluster up at {:.0} s",
            started.elapsed().as_secs_f64()
        ));
        Ok(cluster)
    }

    /// The pool, the advertisement, the backend and its Services (retried while the CRDs the
    /// manifest made are not served yet).
    fn apply_objects(&self, images: &NodeImages) -> Result<()> {
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
        let echo = images.echo.as_ref().context("the backend's image")?;
        admin.apply(
            backend(&echo.1, PER_NODE * self.lab.nodes.len()),
            "swimlb-lab",
        )?;
        for policy in [Policy::Local, Policy::Cluster] {
            admin.apply(service(policy), "swimlb-lab")?;
        }
        Ok(())
    }

    /// Why the cluster is not fully up, or `None` when it is: every Node Ready, a speaker Ready
    /// on each, every backend Pod's endpoint ready in both Services, both IPs assigned.
    pub fn not_up(&self) -> Result<Option<String>> {
        let admin = self.plane.admin();
        let nodes = admin.list("v1", "Node", None)?;
        let n = self.lab.nodes.len();
        let ready = nodes.iter().filter(|x| realnode::node_ready(x)).count();
        if ready < n {
            return Ok(Some(format!("{ready} of {n} Nodes Ready")));
        }
        let (_, namespace) = self.implementation.config_api();
        let label = match self.implementation {
            Implementation::Swimlb => "app.kubernetes.io/component",
            Implementation::Metallb => "component",
        };
        let pods = admin.list("v1", "Pod", Some(namespace))?;
        let speakers = pods
            .iter()
            .filter(|p| p["metadata"]["labels"][label] == "speaker")
            .filter(|p| pod_ready(p))
            .count();
        if speakers < n {
            return Ok(Some(format!("{speakers} of {n} speakers Ready")));
        }
        for policy in [Policy::Local, Policy::Cluster] {
            let (name, ip) = service_of(policy);
            let svc = admin.get("v1", "Service", Some(APPS), name)?;
            let assigned = svc
                .as_ref()
                .map(|s| s["status"]["loadBalancer"]["ingress"][0]["ip"] == ip.to_string())
                .unwrap_or(false);
            if !assigned {
                return Ok(Some(format!("{name} has no ingress IP {ip} yet")));
            }
            let endpoints = ready_endpoints(admin, name)?;
            if endpoints < PER_NODE * n {
                return Ok(Some(format!("{name}: {endpoints} ready endpoints")));
            }
        }
        Ok(None)
    }

    /// Waits until the cluster is fully up, at most `limit`; fails saying what is not.
    pub fn wait_up(&mut self, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            self.real.check_running()?;
            let why = match self.not_up() {
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

impl ServiceCluster {
    /// Each node's speaker container as its kubelet reports it, once the kubelet has a CPU rate
    /// for it (two samples), at most [`AT_REST_LIMIT`] per node.
    pub fn speakers_at_rest(&self) -> Result<Vec<AtRest>> {
        let (_, namespace) = self.implementation.config_api();
        let mut out = Vec::new();
        for node in &self.real.nodes {
            let kubelet = node.kubelet_api(&self.plane, &self.lab.client_netns)?;
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

fn pod_ready(pod: &Value) -> bool {
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
fn manifest_with_image(image: &str) -> Result<String> {
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
