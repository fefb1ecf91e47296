//! The lab on real nodes ([`RealDaemons`]): a real kubelet, containerd and kube-proxy in each
//! node namespace, the project's image, `deploy/swimlb.yaml` applied as a user does, the
//! selector-less Service `default/web` (UDP probe port, `Local`) on `vip_v4(0)` with an
//! EndpointSlice naming every node (where the lab's responders answer).

use std::path::Path;

use serde_json::Value;
use swimlb_e2e::kube_client::Kube;
use swimlb_e2e::realnode::daemons::RealDaemons;

use super::*;

/// The speakers' DaemonSet in `deploy/swimlb.yaml`.
const SPEAKERS: &str = "swimlb-speaker";

/// A lab of three real nodes with a responder on each. Fields drop in order: responders,
/// daemons (the nodes, then the control plane), then the lab (namespaces).
pub(crate) struct Running {
    /// When the last speaker started (the cluster up, or the DaemonSet's roll done).
    pub(crate) started: Instant,
    _responders: Vec<Worker>,
    pub(crate) daemons: RealDaemons,
    pub(crate) lab: Lab,
}

impl Running {
    pub(crate) fn start(n: u32) -> Running {
        Running::start_with(n, &[])
    }

    /// A lab whose speakers get `speaker_args` after the manifest's: the DaemonSet's container
    /// args patched and its roll waited for before the test starts.
    pub(crate) fn start_with(n: u32, speaker_args: &[&str]) -> Running {
        swimlb_e2e::realnode::cleanup_stale();
        let id = format!("{}x{}", std::process::id(), 20 + n);
        let mut lab = Lab::create_with_id(3, &id).expect("building the lab");
        let mut responders = Vec::new();
        for node in lab.nodes.clone() {
            responders.extend(probe::spawn_responder(&node.netns, &node.name).expect("responder"));
        }
        let since = Instant::now();
        let daemons = RealDaemons::start(
            &mut lab,
            failover::Implementation::SwimlbKubernetes,
            &mut |line| eprintln!("{line}"),
        )
        .expect("the real nodes' cluster");
        eprintln!(
            "real-node cluster up in {:.1} s",
            since.elapsed().as_secs_f64()
        );
        let mut run = Running {
            started: Instant::now(),
            _responders: responders,
            daemons,
            lab,
        };
        if !speaker_args.is_empty() {
            run.add_speaker_args(speaker_args);
            run.started = Instant::now();
        }
        run
    }

    /// Appends `args` to the speaker container's args in the DaemonSet and waits until every
    /// node runs a Ready speaker of the new template and no old one is left.
    fn add_speaker_args(&self, args: &[&str]) {
        let api = self.api();
        let ds = api
            .get("apps/v1", "DaemonSet", Some(NAMESPACE), SPEAKERS)
            .expect("reading the DaemonSet")
            .expect("the speakers' DaemonSet");
        let mut containers = ds["spec"]["template"]["spec"]["containers"].clone();
        let speaker = containers
            .as_array_mut()
            .and_then(|c| c.iter_mut().find(|c| c["name"] == "speaker"))
            .expect("the speaker container");
        let list = speaker["args"].as_array_mut().expect("the speaker's args");
        list.extend(args.iter().map(|a| Value::from(*a)));
        api.merge_patch(
            "apps/v1",
            "DaemonSet",
            Some(NAMESPACE),
            SPEAKERS,
            json!({"spec": {"template": {"spec": {"containers": containers}}}}),
            false,
        )
        .expect("patching the speakers' args");
        let wanted = list_of(args);
        self.wait_rolled(&format!("{args:?}"), |p| {
            p["spec"]["containers"][0]["args"]
                .as_array()
                .is_some_and(|a| a.ends_with(&wanted))
        });
    }

    /// `kubectl rollout restart` of the speakers' DaemonSet (its template's `restartedAt`
    /// annotation), waited for until done.
    pub(crate) fn rollout_restart(&self) {
        let old: Vec<Value> = self
            .daemons
            .cluster()
            .speaker_pods()
            .expect("listing the speakers")
            .iter()
            .map(|p| p["metadata"]["uid"].clone())
            .collect();
        let at = format!("{:?}", std::time::SystemTime::now());
        self.api()
            .merge_patch(
                "apps/v1",
                "DaemonSet",
                Some(NAMESPACE),
                SPEAKERS,
                json!({"spec": {"template": {"metadata": {"annotations": {
                    "kubectl.kubernetes.io/restartedAt": at}}}}}),
                false,
            )
            .expect("restarting the speakers' DaemonSet");
        self.wait_rolled("a restart", |p| !old.contains(&p["metadata"]["uid"]));
    }

    /// Waits until the speakers' DaemonSet has rolled to its template (`what`): every node
    /// runs a Ready speaker Pod that `fresh` accepts, and no other speaker Pod is left.
    fn wait_rolled(&self, what: &str, fresh: impl Fn(&Value) -> bool) {
        let api = self.api();
        let n = self.lab.nodes.len();
        let deadline = Instant::now() + Duration::from_secs(240);
        loop {
            let ds = api
                .get("apps/v1", "DaemonSet", Some(NAMESPACE), SPEAKERS)
                .ok()
                .flatten()
                .unwrap_or_default();
            let status = &ds["status"];
            let rolled = status["observedGeneration"] == ds["metadata"]["generation"]
                && status["updatedNumberScheduled"] == n
                && status["numberReady"] == n;
            let pods = self.daemons.cluster().speaker_pods().unwrap_or_default();
            let current = pods.len() == n
                && pods.iter().all(|p| {
                    p["metadata"]["deletionTimestamp"].is_null()
                        && swimlb_e2e::service_failover::cluster::pod_ready(p)
                        && fresh(p)
                });
            if rolled && current {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the speakers' DaemonSet did not roll to {what}: {status}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Probes the VIP and waits for the lab to converge (the trials' own check); the owner.
    pub(crate) fn settle(&mut self) -> (Prober, String) {
        let prober = Prober::start(
            &self.lab.client_netns,
            SocketAddr::from((netns::vip_v4(0), PROBE_PORT)),
            Duration::from_millis(10),
        )
        .expect("prober");
        let settled = failover::settle(&self.lab, &mut self.daemons, &prober, &mut |line| {
            eprintln!("{line}")
        })
        .expect("observing the lab")
        .unwrap_or_else(|reason| panic!("the lab did not converge: {reason}\n{}", self.logs()));
        (prober, settled.owner)
    }

    /// The IPs the controller wrote into `namespace/service`'s status.
    pub(crate) fn ingress(&self, namespace: &str, service: &str) -> Vec<String> {
        kubelab::ingress(self.api(), namespace, service)
    }

    /// The cluster as the played lab's tests read it: records, ingress, the API server.
    pub(crate) fn cluster(&self) -> RealView<'_> {
        RealView(self)
    }

    /// Deletes every controller Pod and waits until the Deployment's new ones are Ready (a
    /// restart of the controller, both replicas at once).
    pub(crate) fn restart_controller(&self) {
        let pods = |api: &Kube| -> Vec<Value> {
            api.list("v1", "Pod", Some(NAMESPACE))
                .unwrap_or_default()
                .into_iter()
                .filter(|p| p["metadata"]["labels"]["app.kubernetes.io/component"] == "controller")
                .collect()
        };
        let api = self.api();
        let old: Vec<Value> = pods(api);
        assert!(!old.is_empty(), "no controller Pod");
        let uids: Vec<Value> = old.iter().map(|p| p["metadata"]["uid"].clone()).collect();
        for pod in &old {
            let name = pod["metadata"]["name"].as_str().expect("a Pod name");
            api.delete("v1", "Pod", Some(NAMESPACE), name)
                .expect("deleting a controller Pod");
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let now = pods(api);
            if now.len() == old.len()
                && now.iter().all(|p| {
                    !uids.contains(&p["metadata"]["uid"])
                        && p["metadata"]["deletionTimestamp"].is_null()
                        && swimlb_e2e::service_failover::cluster::pod_ready(p)
                })
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the controller's Pods were not replaced: {now:?}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The controller replicas' metrics addresses: each Pod's IP (routed from the client) and
    /// port.
    pub(crate) fn controller_metrics(&self) -> Vec<SocketAddr> {
        let pods = self
            .api()
            .list("v1", "Pod", Some(NAMESPACE))
            .unwrap_or_default();
        let addrs: Vec<SocketAddr> = pods
            .iter()
            .filter(|p| p["metadata"]["labels"]["app.kubernetes.io/component"] == "controller")
            .filter_map(|p| p["status"]["podIP"].as_str()?.parse::<IpAddr>().ok())
            .map(|ip| SocketAddr::new(ip, kubelab::CONTROLLER_PORT))
            .collect();
        assert!(!addrs.is_empty(), "no controller Pod has an IP: {pods:?}");
        addrs
    }

    /// Stops the API server (`false`) or starts it again (`true`).
    pub(crate) fn set_api_server(&mut self, running: bool) {
        let plane = &mut self.daemons.cluster_mut().plane;
        if running {
            plane.start_apiserver().expect("starting the API server");
        } else {
            plane.stop_apiserver().expect("stopping the API server");
        }
    }

    /// Node `index`'s speaker logs (every container the kubelet ran there, oldest first).
    pub(crate) fn speaker_log(&self, index: usize) -> String {
        container_logs(self.node_dir(index), "speaker")
    }

    fn node_dir(&self, index: usize) -> &Path {
        self.daemons.cluster().real.nodes[index - 1].dir()
    }
}

/// What the played lab's `kubelab::Cluster` offered the tests, read from the real cluster.
pub(crate) struct RealView<'a>(&'a Running);

impl<'a> RealView<'a> {
    /// The API server, as its admin.
    pub(crate) fn api(&self) -> &'a Kube {
        self.0.api()
    }

    /// The control plane.
    pub(crate) fn control_plane(&self) -> &'a swimlb_e2e::control_plane::ControlPlane {
        &self.0.daemons.cluster().plane
    }

    /// The status records, for another thread.
    pub(crate) fn records(&self) -> kubelab::Records {
        kubelab::Records::new(self.control_plane(), "swimlb.io/v1beta1", NAMESPACE)
    }

    /// The node the record of `namespace/service` names.
    pub(crate) fn record_node(&self, namespace: &str, service: &str) -> Option<String> {
        kubelab::record_node_of(self.api(), namespace, service)
    }

    /// The IPs the controller wrote into `namespace/service`'s status.
    pub(crate) fn ingress(&self, namespace: &str, service: &str) -> Vec<String> {
        self.0.ingress(namespace, service)
    }

    /// Polls (every 10 ms, at most `limit`) until the record of `namespace/service` names a
    /// node that `wanted` accepts; that node and when it was first seen.
    pub(crate) fn wait_record(
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
}

fn list_of(args: &[&str]) -> Vec<Value> {
    args.iter().map(|a| Value::from(*a)).collect()
}

/// Every log of container `container` in the node folder `dir`'s Pod logs
/// (`pod-logs/<namespace>_<pod>_<uid>/<container>/<restart>.log`), in the order the kubelet
/// wrote them.
fn container_logs(dir: &Path, container: &str) -> String {
    let mut files: Vec<(std::time::SystemTime, std::path::PathBuf)> = Vec::new();
    for pod in std::fs::read_dir(dir.join("pod-logs"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let folder = pod.path().join(container);
        for log in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
            let modified = log
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            files.push((modified, log.path()));
        }
    }
    files.sort();
    let mut all = String::new();
    for (_, path) in files {
        all.push_str(&format!("--- {} ---\n", path.display()));
        all.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
    }
    all
}

impl Running {
    /// The lab's namespaces.
    pub(crate) fn lab(&self) -> &Lab {
        &self.lab
    }

    /// The API server, as its admin.
    pub(crate) fn api(&self) -> &Kube {
        self.daemons.cluster().plane.admin()
    }

    /// The node the `ServiceL2Status` record of the lab's Service names.
    pub(crate) fn record(&self) -> Option<String> {
        kubelab::record_node_of(self.api(), APPS, SERVICE)
    }

    /// Every speaker container's log and the controller's (from the nodes' Pod log folders).
    pub(crate) fn logs(&self) -> String {
        let mut all = String::new();
        for i in 1..=self.lab.nodes.len() {
            all.push_str(&format!(
                "=== speaker on node{i} ===\n{}",
                self.speaker_log(i)
            ));
        }
        for i in 1..=self.lab.nodes.len() {
            let controller = container_logs(self.node_dir(i), "controller");
            if !controller.is_empty() {
                all.push_str(&format!("=== controller on node{i} ===\n{controller}"));
            }
        }
        all
    }
}
