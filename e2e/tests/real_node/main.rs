//! A real node (issue 48): containerd, the kubelet and kube-proxy built from pinned modules by
//! `e2e/k8s/node/build.sh`, started in a lab node's network namespace against the lab's real
//! control plane; the project's image built by buildah and imported into the node's
//! containerd; `deploy/swimlb.yaml` applied with `kubectl apply --server-side`, only the image
//! reference changed. Root only: `#[ignore = "needs root: ..."]`, run with
//! `--include-ignored` (as `sudo ./test.sh` does).
//!
//! It asserts what only a real node shows: the Node registered and Ready with the kubelet's
//! version and the runtime's in its `nodeInfo`; the speaker Pod started by containerd and
//! Ready by the manifest's own readiness probe, run by the kubelet; the gossip key Secret
//! mounted in the container with the manifest's mode; the controller's Pod, on the Pod network,
//! reached the API server through kube-proxy's rules for the `kubernetes` Service's ClusterIP
//! (it made that Secret); and the node's teardown leaves no mount, cgroup, process or folder
//! behind, and the kernel settings the kubelet changed as they were. Before the teardown the
//! same cluster runs the install page as a user runs it ([`install`]: its commands and the
//! columns they print, `kubectl exec` into the owner's speaker, the containers' users and
//! tokens, the audit log of every request of the speakers and controllers) and the upgrade
//! page's key rotation through the Secret, the real kubelet rewriting the mounted file
//! ([`rotation`]). A second test, on one node
//! (its speaker alone in the cluster, Ready all the same), restarts containerd and the kubelet
//! under a running speaker (the same process goes on, no restart counted) and stops its
//! container through the CRI, then kills its process (the kubelet restarts it each time).

mod install;
mod rotation;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use swimlb_e2e::control_plane::{ControlPlane, KUBERNETES_SERVICE_IP};
use swimlb_e2e::kubectl::Source;
use swimlb_e2e::netns::{self, Lab};
use swimlb_e2e::realnode::{
    self, NodeImages, NodeInfo, NodeOptions, NodePrograms, RealCluster, RealNode, cleanup, image,
};
use tokio::time::Instant;

/// The version every binary of the workspace carries, and the manifest's image tag.
const VERSION: &str = env!("CARGO_PKG_VERSION");
/// One lab at a time: two labs of real nodes competing for two cores would be faults of their own.
static LAB: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// How long the Pods may take to turn Ready once the manifest is applied.
const PODS_LIMIT: Duration = Duration::from_secs(180);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The version `module` is pinned to in `e2e/k8s/node/<dir>/go.mod`.
fn pinned(dir: &str, module: &str) -> String {
    let path = repo().join(format!("e2e/k8s/node/{dir}/go.mod"));
    let text = std::fs::read_to_string(&path).expect("the node's go.mod");
    text.lines()
        .map(str::split_whitespace)
        .find_map(|mut words| {
            (words.next() == Some(module))
                .then(|| words.next())
                .flatten()
        })
        .unwrap_or_else(|| panic!("{module} is not pinned in {}", path.display()))
        .to_string()
}

/// `deploy/swimlb.yaml` with the image reference `image` in place of the published one, as the
/// install page tells a user to change it; panics unless exactly the two workloads changed.
fn manifest_with_image(image: &str) -> String {
    let text = std::fs::read_to_string(repo().join("deploy/swimlb.yaml")).expect("the manifest");
    let published = format!("image: localhost/swimlb/swimlb:{VERSION}");
    assert_eq!(
        text.matches(&published).count(),
        2,
        "the manifest names the image in the speaker's DaemonSet and the controller's Deployment"
    );
    text.replace(&published, &format!("image: {image}"))
}

/// The Pods of `component` (`speaker`, `controller`) in swimlb-system.
fn pods_of(plane: &ControlPlane, component: &str) -> Vec<Value> {
    let pods = plane
        .admin()
        .list("v1", "Pod", Some("swimlb-system"))
        .unwrap_or_default();
    pods.into_iter()
        .filter(|p| p["metadata"]["labels"]["app.kubernetes.io/component"] == component)
        .collect()
}

fn pod_ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// Waits until a speaker Pod is Ready on each of `nodes`; panics with every Pod's status and
/// the end of the first node's kubelet and speaker logs when they are not within
/// [`PODS_LIMIT`].
fn wait_speakers_ready(plane: &ControlPlane, nodes: &mut [RealNode]) -> Vec<Value> {
    let deadline = Instant::now() + PODS_LIMIT;
    loop {
        let ready: Vec<Value> = pods_of(plane, "speaker")
            .into_iter()
            .filter(pod_ready)
            .collect();
        if nodes.iter().all(|n| {
            ready
                .iter()
                .any(|p| p["spec"]["nodeName"] == n.name.as_str())
        }) {
            return ready;
        }
        for node in nodes.iter_mut() {
            node.check_running().unwrap_or_else(|e| panic!("{e:#}"));
        }
        if Instant::now() > deadline {
            let pods = plane.admin().list("v1", "Pod", Some("swimlb-system"));
            panic!(
                "the speakers' Pods are not Ready within {PODS_LIMIT:?}; the Pods: {pods:#?}\n\
                 the end of the kubelet's log:\n{}\nthe end of the speaker's log:\n{}",
                nodes[0].log_tail(realnode::Part::Kubelet, 20),
                container_log_tail(&nodes[0], "speaker", 30)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The last `n` lines of the logs the kubelet keeps for container `name` on the node.
fn container_log_tail(node: &RealNode, name: &str, n: usize) -> String {
    let mut text = String::new();
    let logs = node.dir().join("pod-logs");
    for pod in std::fs::read_dir(&logs).into_iter().flatten().flatten() {
        for file in std::fs::read_dir(pod.path().join(name))
            .into_iter()
            .flatten()
            .flatten()
        {
            text.push_str(&std::fs::read_to_string(file.path()).unwrap_or_default());
        }
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The process id of the running container `name` on the node (`crictl inspect`).
fn container_pid(node: &RealNode, name: &str) -> u32 {
    let id = image::run(
        node.crictl()
            .args(["ps", "--name", name, "--state", "running", "-q"]),
    )
    .expect("crictl ps");
    let id = id.lines().next().expect("a running container").trim();
    let inspect = image::run(node.crictl().args(["inspect", id])).expect("crictl inspect");
    let inspect: Value = serde_json::from_str(&inspect).expect("crictl inspect's JSON");
    inspect["info"]["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .unwrap_or_else(|| panic!("no pid in {inspect}"))
}

/// Asserts the Node's `nodeInfo` names the pinned kubelet and containerd.
fn assert_versions(info: &NodeInfo) {
    assert_eq!(
        info.kubelet_version,
        pinned("kube", "k8s.io/kubernetes"),
        "{info:?}"
    );
    // containerd reports its version without the module's `v`.
    let containerd = pinned("runtime", "github.com/containerd/containerd/v2");
    assert_eq!(
        info.container_runtime,
        format!("containerd://{}", containerd.trim_start_matches('v')),
        "{info:?}"
    );
}

/// Asserts the gossip key Secret (made by the controller's Pod, which reached the API server
/// through the `kubernetes` Service's ClusterIP) is mounted in the node's speaker container with
/// the manifest's mode (0400) and holds keys.
fn assert_key_mounted(plane: &ControlPlane, node: &RealNode) {
    let secret = plane
        .admin()
        .get("v1", "Secret", Some("swimlb-system"), "swimlb-gossip-key")
        .expect("reading the Secret")
        .expect("the controller made the gossip key Secret");
    let pid = container_pid(node, "speaker");
    let keys = PathBuf::from(format!("/proc/{pid}/root/etc/swimlb/gossip/keys"));
    let meta = std::fs::metadata(&keys).unwrap_or_else(|e| panic!("{}: {e}", keys.display()));
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o400,
        "{}",
        keys.display()
    );
    let mounted = std::fs::read_to_string(&keys).expect("the mounted key file");
    assert!(
        secret["data"]["keys"].is_string() && !mounted.trim().is_empty(),
        "the mounted key file holds the Secret's keys"
    );
}

/// Tears `node` down and asserts it left no mount, process, cgroup or folder.
fn assert_torn_down(mut node: RealNode) {
    let (dir, root) = (node.dir().to_path_buf(), node.cgroup_root().to_string());
    node.teardown()
        .unwrap_or_else(|e| panic!("the node's teardown: {e:#}"));
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mountinfo.contains(&dir.display().to_string()),
        "mounts left under {}",
        dir.display()
    );
    assert!(cleanup::cgroup_pids(&root).is_empty());
    assert!(cleanup::pids_with_argument(&dir.display().to_string()).is_empty());
    for mount in cleanup::cgroup_mounts() {
        let left = mount.join(root.trim_start_matches('/'));
        assert!(!left.exists(), "{} left behind", left.display());
    }
    assert!(!dir.exists(), "{} left behind", dir.display());
}

/// Real nodes running `deploy/swimlb.yaml`, their speakers Ready. Fields drop in order:
/// the nodes first, then the control plane, then the lab's namespaces.
struct Cluster {
    nodes: Vec<RealNode>,
    plane: ControlPlane,
    lab: Lab,
    tag: String,
    /// The speakers' Pods once Ready.
    speakers: Vec<Value>,
    /// The Nodes once Ready.
    ready: Vec<Value>,
    /// The backend's image reference, when it was built.
    echo: Option<String>,
}

/// `nodes` real nodes; with one, its speaker is alone in the cluster (no peer to acknowledge
/// its gossip) and must turn Ready all the same. `run` tells the tests of this binary apart
/// (their labs run side by side). `echo`: also build the backend's image (`swimlb-echo`) into
/// every node, for a Service's Pods.
fn start_cluster(started: Instant, run: u32, nodes: usize, echo: bool) -> Cluster {
    netns::require_root("real_node");
    for tool in ["buildah", "runc", "nsenter", "nft", "umount"] {
        assert!(
            std::process::Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .output()
                .is_ok_and(|o| o.status.success()),
            "{tool} is missing: install Debian's buildah, runc, util-linux and nftables \
             (sudo ./test.sh does)"
        );
    }
    let programs = NodePrograms::locate().unwrap_or_else(|e| panic!("the node programs: {e:#}"));
    realnode::cleanup_stale();
    let lab =
        Lab::create_with_id(nodes, &format!("{}x{run}", std::process::id())).expect("the lab");
    let plane =
        swimlb_e2e::kubelab::start_plane(&lab, &lab.work_dir()).unwrap_or_else(|e| panic!("{e:#}"));
    let tag = format!("localhost/swimlb/swimlb:{VERSION}-real-node");
    let profile = image::profile_of_current_exe().expect("the profile");
    let dir = lab.work_dir().join("images");
    let mut images = NodeImages::build(&programs, &dir, &profile, &tag)
        .unwrap_or_else(|e| panic!("the images: {e:#}"));
    if echo {
        images = images
            .with_echo(&dir, &format!("localhost/swimlb/echo:{VERSION}"))
            .unwrap_or_else(|e| panic!("the backend's image: {e:#}"));
    }
    eprintln!("images built at {:.1} s", started.elapsed().as_secs_f64());
    let real = RealCluster::start(&lab, &plane, &programs, &NodeOptions::default(), &images)
        .unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!("nodes Ready at {:.1} s", started.elapsed().as_secs_f64());
    // The manifest, as a user applies it.
    plane
        .kubectl()
        .apply(Source::Text(&manifest_with_image(&tag)))
        .unwrap_or_else(|e| panic!("kubectl apply --server-side: {e:#}"));
    let RealCluster { mut nodes, ready } = real;
    let speakers = wait_speakers_ready(&plane, &mut nodes);
    eprintln!("speakers Ready at {:.1} s", started.elapsed().as_secs_f64());
    Cluster {
        nodes,
        plane,
        lab,
        tag,
        speakers,
        ready,
        echo: images.echo.map(|(_, tag)| tag),
    }
}

/// The speaker container's memory and CPU on `node` as its kubelet reports them
/// (`/stats/summary`), once it has a CPU rate (two samples), at most 60 s.
fn speaker_usage(cluster: &Cluster, node: &RealNode) -> String {
    let kubelet = node
        .kubelet_api(&cluster.plane, &cluster.lab.client_netns)
        .expect("a client of the kubelet");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let summary = kubelet.raw_get("/stats/summary").expect("/stats/summary");
        let speaker = summary["pods"].as_array().and_then(|pods| {
            pods.iter()
                .flat_map(|p| p["containers"].as_array().into_iter().flatten())
                .find(|c| c["name"] == "speaker")
        });
        if let Some(c) = speaker
            && let Some(cpu) = c["cpu"]["usageNanoCores"].as_u64()
        {
            let mib = |v: &Value| v.as_u64().unwrap_or_default() as f64 / 1_048_576.0;
            return format!(
                "working set {:.1} MiB, RSS {:.1} MiB, CPU {:.2} % of a core",
                mib(&c["memory"]["workingSetBytes"]),
                mib(&c["memory"]["rssBytes"]),
                cpu as f64 / 1e7
            );
        }
        assert!(
            Instant::now() < deadline,
            "no CPU figure for the speaker in {}'s /stats/summary: {summary}",
            node.name
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The kernel settings the kubelet writes, now.
fn kernel_settings() -> Vec<String> {
    [
        "vm/overcommit_memory",
        "kernel/panic",
        "kernel/panic_on_oops",
    ]
    .iter()
    .map(|k| std::fs::read_to_string(format!("/proc/sys/{k}")).unwrap_or_default())
    .collect()
}

#[test]
#[ignore = "needs root: real kubelets, containerd and kube-proxy in network namespaces"]
fn real_nodes_run_the_manifest_with_its_probes_secret_and_service_rules() {
    let _one = LAB.lock().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    let before = kernel_settings();
    let cluster = start_cluster(started, 1, 2, true);
    for info in cluster.ready.iter().map(NodeInfo::of) {
        assert_versions(&info);
    }
    for speaker in &cluster.speakers {
        let status = &speaker["status"]["containerStatuses"][0];
        assert_eq!(status["image"], cluster.tag.as_str(), "{status}");
        assert!(
            status["containerID"]
                .as_str()
                .is_some_and(|id| id.starts_with("containerd://")),
            "{status}"
        );
    }
    for node in &cluster.nodes {
        assert_key_mounted(&cluster.plane, node);
        // kube-proxy's rules for a ClusterIP in the node's namespace.
        let rules = cluster
            .lab
            .run_in(&node.netns, "nft", &["list", "ruleset"])
            .expect("nft list ruleset");
        assert!(
            rules.contains("table ip kube-proxy")
                && rules.contains(&KUBERNETES_SERVICE_IP.to_string()),
            "kube-proxy's nftables rules on {} name the kubernetes Service's \
             {KUBERNETES_SERVICE_IP}:\n{rules}",
            node.name
        );
    }
    for node in &cluster.nodes {
        let usage = speaker_usage(&cluster, node);
        eprintln!(
            "{}: the speaker as its kubelet reports it: {usage}",
            node.name
        );
    }
    eprintln!(
        "manifest checks done at {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let served = install::run_the_install_page(&cluster);
    eprintln!(
        "install page done at {:.1} s",
        started.elapsed().as_secs_f64()
    );
    rotation::rotate_the_gossip_key(&cluster, &served);
    eprintln!("key rotated at {:.1} s", started.elapsed().as_secs_f64());
    drop(served);
    let Cluster { nodes, .. } = cluster;
    for node in nodes {
        assert_torn_down(node);
    }
    assert_eq!(
        kernel_settings(),
        before,
        "the kernel settings the kubelet changed are back"
    );
    eprintln!(
        "real node test done in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// The speaker's Pod on `node`, once it is Ready with at least `restarts` restarts (at most
/// [`PODS_LIMIT`]).
fn wait_speaker_restarted(plane: &ControlPlane, node: &mut RealNode, restarts: u64) -> Value {
    let deadline = Instant::now() + PODS_LIMIT;
    loop {
        let pod = pods_of(plane, "speaker")
            .into_iter()
            .find(|p| p["spec"]["nodeName"] == node.name.as_str());
        if let Some(pod) = pod
            && pod_ready(&pod)
            && pod["status"]["containerStatuses"][0]["restartCount"]
                .as_u64()
                .is_some_and(|n| n >= restarts)
        {
            return pod;
        }
        node.check_running().unwrap_or_else(|e| panic!("{e:#}"));
        assert!(
            Instant::now() < deadline,
            "the speaker on {} is not Ready after {restarts} restarts within {PODS_LIMIT:?}; \
             the end of the kubelet's log:\n{}",
            node.name,
            node.log_tail(realnode::Part::Kubelet, 20)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The `renewTime` of node `name`'s heartbeat Lease.
fn lease_renewed(plane: &ControlPlane, name: &str) -> String {
    plane
        .admin()
        .get(
            "coordination.k8s.io/v1",
            "Lease",
            Some("kube-node-lease"),
            name,
        )
        .ok()
        .flatten()
        .map(|l| l["spec"]["renewTime"].to_string())
        .unwrap_or_default()
}

fn restart_count(pod: &Value) -> u64 {
    pod["status"]["containerStatuses"][0]["restartCount"]
        .as_u64()
        .unwrap_or_default()
}

#[test]
#[ignore = "needs root: real kubelets, containerd and kube-proxy in network namespaces"]
fn a_real_nodes_speaker_outlives_runtime_and_kubelet_restarts_and_is_restarted_when_killed() {
    let _one = LAB.lock().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    // One node: its speaker, alone in the cluster, turns Ready by the manifest's probe, first
    // and after every restart (a lone Kubernetes speaker used to stay `joining` for good).
    let mut cluster = start_cluster(started, 2, 1, false);
    let Cluster { plane, nodes, .. } = &mut cluster;
    let node = &mut nodes[0];
    let first = container_pid(node, "speaker");
    let grace = Duration::from_secs(10);

    // containerd restarted: the shim keeps the container; the kubelet finds it again.
    node.stop(realnode::Part::Containerd, grace);
    node.spawn(realnode::Part::Containerd)
        .expect("containerd again");
    node.wait_containerd().unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(
        container_pid(node, "speaker"),
        first,
        "the same speaker process"
    );
    // The kubelet restarted: it adopts the running container.
    let ready_since = |pod: &Value| {
        pod["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
            .map(|c| c["lastTransitionTime"].to_string())
            .unwrap_or_default()
    };
    let before = ready_since(&wait_speaker_restarted(plane, node, 0));
    node.stop(realnode::Part::Kubelet, grace);
    let renewed = lease_renewed(plane, &node.name);
    node.spawn(realnode::Part::Kubelet)
        .expect("the kubelet again");
    node.wait_ready(plane).unwrap_or_else(|e| panic!("{e:#}"));
    // The new kubelet has renewed its Lease: it runs and has synced its Pods since.
    while lease_renewed(plane, &node.name) == renewed {
        node.check_running().unwrap_or_else(|e| panic!("{e:#}"));
        std::thread::sleep(Duration::from_millis(200));
    }
    let pod = wait_speaker_restarted(plane, node, 0);
    eprintln!(
        "the speaker's Pod through the kubelet's restart: Ready since {before}, now since {}",
        ready_since(&pod)
    );
    assert_eq!(restart_count(&pod), 0, "no restart: {pod}");
    assert_eq!(
        container_pid(node, "speaker"),
        first,
        "the same speaker process"
    );
    eprintln!(
        "restarts outlived at {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // The container stopped by the runtime, then its process killed: the kubelet restarts it.
    let id = image::run(node.crictl().args(["ps", "--name", "speaker", "-q"])).expect("crictl ps");
    image::run(node.crictl().args(["stop", id.trim()])).expect("crictl stop");
    let pod = wait_speaker_restarted(plane, node, 1);
    let second = container_pid(node, "speaker");
    assert_ne!(second, first, "a new speaker process: {pod}");
    cleanup::kill_pids(&[second]);
    let pod = wait_speaker_restarted(plane, node, 2);
    assert_ne!(container_pid(node, "speaker"), second, "{pod}");
    eprintln!(
        "speaker restarted twice, fault test done in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
