//! The kubelets of the apply lab: for each lab node, what its kubelet does for the Pods the real
//! control plane binds to it (the DaemonSet controller's, and the Deployment's once the
//! scheduler placed them), with the node's own credential (`system:node:NODE`, so the Node
//! authorizer and NodeRestriction confine it to its Pods as they confine a kubelet). Nothing of
//! swimlb is written here by hand: every command line, variable, user, capability, volume and
//! probe comes from the stored Pods.
//!
//! - **Pods** ([`Kubelet`]): each node lists the Pods bound to it (`spec.nodeName`, every
//!   [`TICK`]) and starts one worker thread per new Pod, as the kubelet's pod workers.
//! - **The sandbox**: a Pod on the host network runs in its node's network namespace
//!   (`podIP` = the node's address). Any other Pod gets a network namespace of its own with a
//!   veth on the lab bridge and an address of its own ([`POD_IPS`]): the controller's two
//!   replicas run side by side, each with its own `podIP`, as on a real cluster.
//! - **Volumes** ([`volumes`]): Secret, ConfigMap and projected volumes, the ServiceAccount's
//!   `kube-api-access-*` included (a TokenRequest bound to the Pod, made with the node's
//!   credential, `ca.crt` from the `kube-root-ca.crt` ConfigMap, the namespace), written by the
//!   kubelet's atomic writer and synced every [`VOLUME_SYNC`] (a real kubelet takes up to its
//!   sync period, a minute, plus its cache's time to live). With the API server unreachable the
//!   files written before stay and a container restarts with them, as a kubelet's mounts do.
//! - **The container** ([`spec`]): `command` + `args` with `$(VAR)` expanded, its environment
//!   resolved (downward API, Secret and ConfigMap keys) after the kubelet's variables of the
//!   `kubernetes` Service (`KUBERNETES_SERVICE_HOST`, `KUBERNETES_SERVICE_PORT`, `KUBERNETES_PORT*`),
//!   the image's binary mapped to the lab binary's subcommand (MetalLB's images, whose Pods name
//!   no `command`, to their entrypoint's program built from the pinned module,
//!   `$SWIMLB_K8S_BIN/metallb-speaker` and `metallb-controller`), started as `ip netns exec
//!   <sandbox> unshare --mount` (a mount namespace per container, where each volume is bind
//!   mounted at its `mountPath`, read-only when the mount says so; niceness 0, as a container
//!   runtime's containers, even when the lab runs under `nice`) then `setpriv` with the user,
//!   group, capabilities and `no_new_privs` of its `securityContext`. So the speaker and the
//!   controller find their in-cluster configuration (`/var/run/secrets/kubernetes.io/
//!   serviceaccount`) where a Pod finds it; no `KUBECONFIG` is set.
//! - **kube-proxy for the `kubernetes` Service** ([`install_service_proxy`]): in every node's
//!   and every Pod's namespace an nftables DNAT of the Service's cluster IP and port to the API
//!   server, with a route to the cluster IP.
//! - **Probes and status**: startup, liveness and readiness probes (`httpGet`) from the node's
//!   namespace, restarts with the kubelet's back-off, and the Pod's status (`podIP`, `hostIP`,
//!   phase, conditions, `containerStatuses`) patched on `pods/status` when it changes. A trial
//!   may hold a container's restart ([`Kubelet::hold_restarts`]) and release it later.
//! - **Deletion**: a Pod the API server deletes gracefully (`deletionTimestamp`) has its
//!   container stopped with its grace period and its sandbox removed, then the kubelet deletes it
//!   for good (grace period 0, on its uid), so `kubectl delete --cascade=foreground` of a
//!   workload returns once its Pods are gone, as on a cluster.
//!
//! The application's Pods of the image [`LAB_RESPONDER_IMAGE`] on the host network stand for
//! the lab's probe responder, which already runs in every node's namespace: they are running
//! and ready at once, without a process of their own.
//!
//! Not played: images and pulling (the lab binary stands for the image), the read-only root
//! file system (the mount points are made as empty directories of the host), seccomp, resource
//! limits, init containers and Pods of several containers (refused, with the reason), volumes
//! other than Secret, ConfigMap and projected ones (refused), the link variables of Services other than
//! `kubernetes`, the token's renewal (rollouts, which are Pod deletions and creations, are
//! untested). Containers start with a clean
//! environment: `PATH` (the lab's, where `ip` and `setpriv` are), `HOME` (`/`), `HOSTNAME` (the
//! node's name on the host network, else the Pod's name) and the container's variables.

mod sandbox;
pub mod spec;
pub mod volumes;

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::control_plane::ControlPlane;
use crate::kube_client::Kube;
use crate::netns::{self, Lab, Node};
use crate::probe;
use sandbox::Sandbox;
use spec::{HttpProbe, Privileges, ProbeRun, Program, container_process, http_probe, text};
use volumes::{File, Volume};

/// How often a node lists its Pods and a pod worker looks at its container and probes.
pub const TICK: Duration = Duration::from_millis(100);
/// How often a pod worker syncs its volumes with the API server.
pub const VOLUME_SYNC: Duration = Duration::from_secs(1);
/// The kubelet's first restart back-off; it doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_secs(10);
/// The kubelet's longest restart back-off.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// The addresses of Pods off the host network: 198.51.100.201 to .254, on the lab bridge
/// (above the nodes and the VIPs).
pub const POD_IPS: (u8, u8) = (201, 254);
/// The image whose Pods stand for the lab's probe responders (host network only).
pub const LAB_RESPONDER_IMAGE: &str = "swimlb-lab/probe-responder";
/// The `PATH` of a container in the lab: the lab's tools (`ip`, `setpriv`) must be found.
const CONTAINER_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Makes each volume's mount point, bind mounts it (read-only when asked), then runs the rest
/// at niceness 0, as a container runtime runs containers whatever the niceness of the lab.
const MOUNT_SCRIPT: &str = r#"set -e
renice -n 0 -p $$ >/dev/null
while [ "$1" != "--" ]; do
  mkdir -p "$2"
  mount --bind "$1" "$2"
  if [ "$3" = ro ]; then mount -o remount,bind,ro "$2"; fi
  shift 3
done
shift
exec "$@""#;

/// kube-proxy's rules for one Service in `netns`: connections to `service` go to `endpoint`
/// (an nftables DNAT in `output`, for the namespace's own processes), with a route to the
/// cluster IP through `eth0` so that a connection gets as far as the DNAT.
pub fn install_service_proxy(
    netns: &str,
    service: SocketAddrV4,
    endpoint: SocketAddr,
) -> Result<()> {
    let rules = format!(
        "table ip swimlb_lab_services {{\n  chain output {{ type nat hook output priority -100; ip daddr {} tcp dport {} dnat to {endpoint}; }}\n}}\n",
        service.ip(),
        service.port()
    );
    netns::nft_apply(netns, &rules)?;
    run(
        "ip",
        &[
            "-n",
            netns,
            "route",
            "replace",
            &format!("{}/32", service.ip()),
            "dev",
            "eth0",
        ],
    )
}

fn run(program: &str, args: &[&str]) -> Result<()> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// What every node's kubelet shares.
#[derive(Debug)]
struct Shared {
    program: PathBuf,
    /// The control plane's build folder's programs that stand for images (MetalLB's), by name.
    built: Vec<(&'static str, PathBuf)>,
    dir: PathBuf,
    run_id: String,
    switch_netns: String,
    /// The `kubernetes` Service's address.
    service: SocketAddrV4,
    /// Where its DNAT goes: the API server.
    api: SocketAddr,
    next_pod_ip: AtomicU8,
    stop: AtomicBool,
}

/// What a pod worker has seen of its Pod, for the test and its report.
#[derive(Debug, Clone, Default)]
pub struct PodState {
    /// The Pod's IP.
    pub ip: Option<IpAddr>,
    /// When the container first started.
    pub started: Option<Instant>,
    /// The process id of the running container (`None` for a stand-in).
    pub pid: Option<u32>,
    /// When every volume first held its data (an optional Secret's included).
    pub volumes_filled: Option<Instant>,
    /// Whether the readiness probe (if any) passes now.
    pub ready: bool,
    /// When it first became ready.
    pub first_ready: Option<Instant>,
    /// Restarts of the container (exits and failed liveness or startup probes).
    pub restarts: u32,
    /// Why the container last stopped (exit status or probe).
    pub last_stop: Option<String>,
    /// Why the container cannot start right now (the lab's or the kubelet's refusal).
    pub waiting: Option<String>,
}

/// One Pod's worker thread.
#[derive(Debug)]
struct PodWorker {
    uid: String,
    name: String,
    node: String,
    log: PathBuf,
    state: Arc<Mutex<PodState>>,
    stop: Arc<AtomicBool>,
    /// The Pod is being deleted: once stopped, the worker ends its deletion.
    deleting: Arc<AtomicBool>,
    restarts: Arc<AtomicU8>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A pod worker restarts its container as the kubelet does (after the back-off).
const RESTARTS_NORMAL: u8 = 0;
/// A pod worker does not restart its container until released.
const RESTARTS_HELD: u8 = 1;
/// Released: the next start comes at once, and the back-off starts over.
const RESTARTS_RELEASED: u8 = 2;

type Workers = Arc<Mutex<Vec<PodWorker>>>;

/// The lab nodes' kubelets. Dropping it stops every container with its grace period, as a
/// drained node would, and deletes the Pods' own namespaces.
#[derive(Debug)]
pub struct Kubelet {
    shared: Arc<Shared>,
    nodes: Vec<std::thread::JoinHandle<()>>,
    workers: Workers,
}

impl Kubelet {
    /// Starts the kubelet of every node of `lab` on `plane` (whose kubelet credentials it
    /// uses): kube-proxy's DNAT of the `kubernetes` Service on every node, then one thread per
    /// node running the Pods bound to it. `program` is the lab binary; each Pod's files and
    /// its container's log go under `dir`.
    pub fn start(lab: &Lab, plane: &ControlPlane, program: &Path, dir: &Path) -> Result<Kubelet> {
        let kubernetes = plane
            .admin()
            .get("v1", "Service", Some("default"), "kubernetes")?
            .context("the `kubernetes` Service does not exist")?;
        let ip: Ipv4Addr = text(&kubernetes, "/spec/clusterIP")
            .context("the `kubernetes` Service has no cluster IP")?
            .parse()
            .context("the `kubernetes` Service's cluster IP")?;
        let port = kubernetes["spec"]["ports"][0]["port"]
            .as_u64()
            .unwrap_or(443) as u16;
        let shared = Arc::new(Shared {
            program: program.to_path_buf(),
            built: spec::BUILT_PROGRAMS
                .iter()
                .map(|name| (*name, plane.program(name)))
                .collect(),
            dir: dir.to_path_buf(),
            run_id: lab.run_id().to_string(),
            switch_netns: lab.switch_netns.clone(),
            service: SocketAddrV4::new(ip, port),
            api: plane.api_addr,
            next_pod_ip: AtomicU8::new(POD_IPS.0),
            stop: AtomicBool::new(false),
        });
        let workers: Workers = Arc::default();
        let mut kubelet = Kubelet {
            shared: shared.clone(),
            nodes: Vec::new(),
            workers: workers.clone(),
        };
        for node in &lab.nodes {
            install_service_proxy(&node.netns, shared.service, shared.api)?;
            let kube =
                Kube::from_kubeconfig_in(&plane.kubelet_kubeconfig(&node.name), Some(&node.netns))
                    .with_context(|| format!("the kubelet client of {}", node.name))?;
            let (shared, workers, node) = (shared.clone(), workers.clone(), node.clone());
            let thread = std::thread::Builder::new()
                .name(format!("kubelet-{}", node.name))
                .spawn(move || sync_node(&shared, Arc::new(kube), &node, &workers))
                .context("starting a node's kubelet")?;
            kubelet.nodes.push(thread);
        }
        Ok(kubelet)
    }

    /// Every Pod as (name, node, what its worker has seen), in start order.
    pub fn pods(&self) -> Vec<(String, String, PodState)> {
        let workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        workers
            .iter()
            .map(|w| {
                let state = w.state.lock().unwrap_or_else(|e| e.into_inner()).clone();
                (w.name.clone(), w.node.clone(), state)
            })
            .collect()
    }

    /// Waits (at most `limit`) until at least `count` Pods run here and every one is ready;
    /// the Pods that are not, otherwise.
    pub fn wait_ready(&self, count: usize, limit: Duration) -> Result<(), Vec<(String, PodState)>> {
        let deadline = Instant::now() + limit;
        loop {
            let pods = self.pods();
            let pending: Vec<(String, PodState)> = pods
                .iter()
                .filter(|(_, _, s)| !s.ready)
                .map(|(n, _, s)| (n.clone(), s.clone()))
                .collect();
            if pending.is_empty() && pods.len() >= count {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(pending);
            }
            std::thread::sleep(TICK);
        }
    }

    /// Holds (`true`) the restarts of Pod `pod`'s container, or releases them (`false`): the
    /// container then starts at the next tick and its back-off starts over, as for a fresh Pod.
    /// The lab's trials restart a killed daemon themselves, once the failover was measured (a
    /// kubelet would restart it after its back-off, which doubles with every kill). Whether
    /// the Pod runs here.
    pub fn hold_restarts(&self, pod: &str, hold: bool) -> bool {
        let workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        let Some(worker) = workers.iter().find(|w| w.name == pod) else {
            return false;
        };
        worker.restarts.store(
            if hold {
                RESTARTS_HELD
            } else {
                RESTARTS_RELEASED
            },
            Ordering::Relaxed,
        );
        true
    }

    /// Every container's log, for failure messages.
    pub fn logs(&self) -> String {
        let workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        let mut all = String::new();
        for w in workers.iter() {
            let text = std::fs::read_to_string(&w.log).unwrap_or_default();
            all.push_str(&format!("--- {} on {} ---\n{text}", w.name, w.node));
        }
        all
    }

    /// The log of the Pod named `pod`.
    pub fn log_of(&self, pod: &str) -> Option<String> {
        let workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        let worker = workers.iter().find(|w| w.name == pod)?;
        std::fs::read_to_string(&worker.log).ok()
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for node in self.nodes.drain(..) {
            let _ = node.join();
        }
        let mut workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        // Every worker stops its container at once, then each is joined.
        for w in workers.iter() {
            w.stop.store(true, Ordering::Relaxed);
        }
        for w in workers.iter_mut() {
            if let Some(thread) = w.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

/// A node's kubelet: lists the Pods bound to `node` every [`TICK`], starts a worker for each
/// new one and stops the worker of each that is gone, until the kubelet stops.
fn sync_node(shared: &Arc<Shared>, kube: Arc<Kube>, node: &Node, workers: &Workers) {
    let path = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{}", node.name);
    while !shared.stop.load(Ordering::Relaxed) {
        // An outage of the API server fails a listing; the next one catches up.
        if let Ok(list) = kube.raw_get(&path) {
            let pods = list["items"].as_array().cloned().unwrap_or_default();
            let mut workers = workers.lock().unwrap_or_else(|e| e.into_inner());
            for w in workers.iter().filter(|w| w.node == node.name) {
                match pods
                    .iter()
                    .find(|p| text(p, "/metadata/uid") == Some(&w.uid))
                {
                    None => w.stop.store(true, Ordering::Relaxed),
                    Some(pod) if deleting(pod) => {
                        w.deleting.store(true, Ordering::Relaxed);
                        w.stop.store(true, Ordering::Relaxed);
                    }
                    Some(_) => {}
                }
            }
            for pod in pods {
                let uid = text(&pod, "/metadata/uid").unwrap_or_default();
                if workers.iter().any(|w| w.uid == uid) {
                    continue;
                }
                if deleting(&pod) {
                    // Deleted before its worker started: nothing runs, the deletion ends now.
                    let namespace = text(&pod, "/metadata/namespace").unwrap_or("default");
                    let name = text(&pod, "/metadata/name").unwrap_or_default();
                    let _ = kube.delete_pod_now(namespace, name, uid);
                    continue;
                }
                match PodWorker::start(shared.clone(), kube.clone(), node.clone(), pod) {
                    Ok(w) => workers.push(w),
                    Err(e) => eprintln!("kubelet of {}: {e:#}", node.name),
                }
            }
        }
        std::thread::sleep(TICK);
    }
}

/// Whether the API server is deleting `pod` gracefully (its containers are to stop).
fn deleting(pod: &Value) -> bool {
    pod.pointer("/metadata/deletionTimestamp").is_some()
}

impl PodWorker {
    fn start(shared: Arc<Shared>, kube: Arc<Kube>, node: Node, pod: Value) -> Result<PodWorker> {
        let name = text(&pod, "/metadata/name").unwrap_or_default().to_string();
        let uid = text(&pod, "/metadata/uid").unwrap_or_default().to_string();
        let pod_dir = shared.dir.join("pods").join(&name);
        std::fs::create_dir_all(&pod_dir)?;
        let log = pod_dir.join("container.log");
        let state: Arc<Mutex<PodState>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let deleting = Arc::new(AtomicBool::new(false));
        let restarts = Arc::new(AtomicU8::new(RESTARTS_NORMAL));
        let mut run = PodRun {
            shared,
            kube,
            node: node.clone(),
            pod,
            sandbox: None,
            pod_dir,
            log: log.clone(),
            state: state.clone(),
            stop: stop.clone(),
            deleting: deleting.clone(),
            restarts: restarts.clone(),
            child: None,
            stand_in: false,
            written: BTreeMap::new(),
            serial: 0,
            next_sync: Instant::now(),
            token: Mutex::new(None),
            probes: Probes::default(),
            next_start: Instant::now(),
            backoff: FIRST_BACKOFF,
            published: None,
        };
        let thread = std::thread::Builder::new()
            .name(format!("pod-{name}"))
            .spawn(move || run.work())
            .context("starting a pod worker")?;
        Ok(PodWorker {
            uid,
            name,
            node: node.name,
            log,
            state,
            stop,
            deleting,
            restarts,
            thread: Some(thread),
        })
    }
}

/// The running container's probes.
#[derive(Debug, Default)]
struct Probes {
    startup: Option<ProbeRun>,
    liveness: Option<ProbeRun>,
    readiness: Option<ProbeRun>,
}

/// A pod worker's state (owned by its thread).
#[derive(Debug)]
struct PodRun {
    shared: Arc<Shared>,
    /// The node's kubelet client.
    kube: Arc<Kube>,
    node: Node,
    pod: Value,
    sandbox: Option<Sandbox>,
    pod_dir: PathBuf,
    log: PathBuf,
    state: Arc<Mutex<PodState>>,
    stop: Arc<AtomicBool>,
    deleting: Arc<AtomicBool>,
    /// [`RESTARTS_NORMAL`], [`RESTARTS_HELD`] or [`RESTARTS_RELEASED`].
    restarts: Arc<AtomicU8>,
    child: Option<Child>,
    /// The container stands for the lab's probe responder: no process.
    stand_in: bool,
    /// The files of each volume last written, by volume name.
    written: BTreeMap<String, Vec<File>>,
    serial: u64,
    next_sync: Instant,
    /// The ServiceAccount token, once requested.
    token: Mutex<Option<String>>,
    probes: Probes,
    next_start: Instant,
    backoff: Duration,
    /// The Pod status last written.
    published: Option<Value>,
}

impl PodRun {
    fn namespace(&self) -> String {
        text(&self.pod, "/metadata/namespace")
            .unwrap_or("default")
            .to_string()
    }

    fn name(&self) -> String {
        text(&self.pod, "/metadata/name")
            .unwrap_or_default()
            .to_string()
    }

    fn update(&self, f: impl FnOnce(&mut PodState)) {
        f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()));
    }

    fn state(&self) -> PodState {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The worker's loop: until told to stop, then the container is stopped and the sandbox
    /// removed.
    fn work(&mut self) {
        // Probes go out from the node's namespace, as a kubelet's.
        if let Err(e) = probe::enter_netns(&self.node.netns) {
            self.update(|s| s.waiting = Some(format!("entering {}: {e:#}", self.node.netns)));
            return;
        }
        if let Err(e) = self.make_sandbox() {
            self.update(|s| s.waiting = Some(format!("{e:#}")));
        }
        while !self.stop.load(Ordering::Relaxed) && !self.shared.stop.load(Ordering::Relaxed) {
            if self.sandbox.is_some()
                && let Err(e) = self.step(Instant::now())
            {
                self.update(|s| s.waiting = Some(format!("{e:#}")));
            }
            self.publish_status();
            std::thread::sleep(TICK);
        }
        let deleting = self.deleting.load(Ordering::Relaxed);
        self.stop_container(if deleting {
            "the Pod is deleted"
        } else {
            "the lab stops"
        });
        self.publish_status();
        if let Some(sandbox) = &self.sandbox {
            sandbox.remove();
        }
        if deleting {
            let uid = text(&self.pod, "/metadata/uid")
                .unwrap_or_default()
                .to_string();
            if let Err(e) = self
                .kube
                .delete_pod_now(&self.namespace(), &self.name(), &uid)
            {
                self.update(|s| s.waiting = Some(format!("ending the deletion: {e:#}")));
            }
        }
    }

    /// The kubelet's part before any container: the sandbox, and the Pod's IPs in its status.
    fn make_sandbox(&mut self) -> Result<()> {
        let sandbox = Sandbox::make(&self.shared, &self.node, &self.pod)?;
        let status = json!({"status": {
            "phase": "Pending",
            "hostIP": sandbox.host_ip.to_string(),
            "hostIPs": [{"ip": sandbox.host_ip.to_string()}],
            "podIP": sandbox.pod_ip.to_string(),
            "podIPs": [{"ip": sandbox.pod_ip.to_string()}],
            "startTime": now_rfc3339()}});
        let ip = sandbox.pod_ip;
        self.sandbox = Some(sandbox);
        self.update(|s| s.ip = Some(ip));
        self.pod = self.kube.merge_patch(
            "v1",
            "Pod",
            Some(&self.namespace()),
            &self.name(),
            status,
            true,
        )?;
        Ok(())
    }

    fn container(&self) -> Result<Value> {
        let spec = &self.pod["spec"];
        if spec["initContainers"]
            .as_array()
            .is_some_and(|l| !l.is_empty())
        {
            bail!("initContainers are not played by the lab");
        }
        match spec["containers"].as_array().map(Vec::as_slice) {
            Some([one]) => Ok(one.clone()),
            _ => bail!("the lab plays Pods of exactly one container"),
        }
    }

    fn step(&mut self, now: Instant) -> Result<()> {
        let container = self.container()?;
        if container["image"] == LAB_RESPONDER_IMAGE {
            return self.stand_in(now);
        }
        let volumes = volumes::volumes(&self.pod["spec"], &container, &self.pod_dir)?;
        let filled = if now >= self.next_sync || self.child.is_none() {
            self.next_sync = now + VOLUME_SYNC;
            match self.sync_volumes(&volumes) {
                Ok(filled) => filled,
                // The API server unreachable: the files written before stay, as a kubelet's
                // mounts do, and a container restarts with them.
                Err(_) if volumes.iter().all(|v| self.written.contains_key(&v.name)) => true,
                Err(e) => return Err(e),
            }
        } else {
            true
        };
        if let Some(child) = self.child.as_mut() {
            if let Some(status) = child.try_wait()? {
                self.child = None;
                self.crashed(format!("exited: {status}"), now);
                return Ok(());
            }
            self.run_probes(now);
            return Ok(());
        }
        match self.restarts.load(Ordering::Relaxed) {
            RESTARTS_HELD => return Ok(()),
            RESTARTS_RELEASED => {
                self.restarts.store(RESTARTS_NORMAL, Ordering::Relaxed);
                self.next_start = now;
                self.backoff = FIRST_BACKOFF;
            }
            _ => {}
        }
        if now < self.next_start {
            return Ok(());
        }
        if !filled {
            bail!("ContainerCreating: a volume's Secret or ConfigMap is not there yet");
        }
        self.start_container(&container, &volumes, now)
    }

    /// A Pod of [`LAB_RESPONDER_IMAGE`]: running and ready once its sandbox is.
    fn stand_in(&mut self, now: Instant) -> Result<()> {
        if self.pod["spec"]["hostNetwork"] != true {
            bail!("{LAB_RESPONDER_IMAGE}: the lab's responders run on the host network only");
        }
        self.stand_in = true;
        self.update(|s| {
            s.started.get_or_insert(now);
            s.first_ready.get_or_insert(now);
            s.ready = true;
        });
        Ok(())
    }

    /// The Pod's ServiceAccount token bound to the Pod, requested once with the node's
    /// credential (the Node authorizer grants it for a Pod bound to the node).
    fn token(&self, audience: Option<&str>, expiration: u64) -> Result<String> {
        let mut cached = self.token.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(token) = cached.as_ref() {
            return Ok(token.clone());
        }
        let account = text(&self.pod, "/spec/serviceAccountName").unwrap_or("default");
        let mut spec = json!({"expirationSeconds": expiration,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                "name": self.name(), "uid": self.pod["metadata"]["uid"]}});
        if let Some(audience) = audience {
            spec["audiences"] = json!([audience]);
        }
        let answer = self.kube.raw_post(
            &format!(
                "/api/v1/namespaces/{}/serviceaccounts/{account}/token",
                self.namespace()
            ),
            &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}),
        )?;
        let token = text(&answer, "/status/token")
            .context("a TokenRequest answered without a token")?
            .to_string();
        *cached = Some(token.clone());
        Ok(token)
    }

    /// A Secret or ConfigMap as the node's kubelet reads it (`None`: missing, or not readable
    /// by the node yet).
    fn object(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        let kind = if resource == "secrets" {
            "Secret"
        } else {
            "ConfigMap"
        };
        self.kube
            .get("v1", kind, Some(namespace), name)
            .ok()
            .flatten()
    }

    /// Writes every volume whose files changed; whether each holds what it must (an optional
    /// source that is missing leaves it empty, and it counts as filled only once it is there).
    fn sync_volumes(&mut self, volumes: &[Volume]) -> Result<bool> {
        let (mut all, mut complete) = (true, true);
        for volume in volumes {
            std::fs::create_dir_all(&volume.dir)?;
            let lookup = |r: &str, ns: &str, n: &str| self.object(r, ns, n);
            let token = |audience: Option<&str>, seconds: u64| self.token(audience, seconds);
            let Some(files) = volume.files(&self.pod, &lookup, &token)? else {
                all &= self.written.contains_key(&volume.name);
                complete = false;
                continue;
            };
            complete &= !files.is_empty();
            if self.written.get(&volume.name) != Some(&files) {
                self.serial += 1;
                volume.write(&files, &self.serial.to_string())?;
                self.written.insert(volume.name.clone(), files);
            }
        }
        if complete && !volumes.is_empty() && self.state().volumes_filled.is_none() {
            self.update(|s| s.volumes_filled = Some(Instant::now()));
        }
        Ok(all)
    }

    /// The variables the kubelet gives every container for the `kubernetes` Service.
    fn service_variables(&self) -> Vec<(String, String)> {
        let (ip, port) = (self.shared.service.ip(), self.shared.service.port());
        let url = format!("tcp://{ip}:{port}");
        let prefix = format!("KUBERNETES_PORT_{port}_TCP");
        [
            ("KUBERNETES_SERVICE_HOST".to_string(), ip.to_string()),
            ("KUBERNETES_SERVICE_PORT".to_string(), port.to_string()),
            (
                "KUBERNETES_SERVICE_PORT_HTTPS".to_string(),
                port.to_string(),
            ),
            ("KUBERNETES_PORT".to_string(), url.clone()),
            (prefix.clone(), url),
            (format!("{prefix}_PROTO"), "tcp".to_string()),
            (format!("{prefix}_PORT"), port.to_string()),
            (format!("{prefix}_ADDR"), ip.to_string()),
        ]
        .into()
    }

    fn start_container(
        &mut self,
        container: &Value,
        volumes: &[Volume],
        now: Instant,
    ) -> Result<()> {
        let sandbox = self.sandbox.clone().context("no sandbox")?;
        let lookup = |r: &str, ns: &str, n: &str| self.object(r, ns, n);
        let process = container_process(&self.pod, container, &lookup, &self.service_variables())?;
        let privileges = Privileges::of(&self.pod["spec"], container)?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &sandbox.netns])
            .args(["unshare", "--mount", "--propagation", "private", "--"])
            .args(["sh", "-c", MOUNT_SCRIPT, "sh"]);
        for v in volumes {
            cmd.arg(&v.dir)
                .arg(&v.mount_path)
                .arg(if v.read_only { "ro" } else { "rw" });
        }
        cmd.arg("--")
            .arg("setpriv")
            .args(privileges.setpriv_args())
            .arg("--");
        match process.program {
            Program::Lab(subcommand) => cmd.arg(&self.shared.program).arg(subcommand),
            Program::Built(name) => {
                let path = self
                    .shared
                    .built
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, p)| p.clone())
                    .with_context(|| format!("{name}: not a program of the build folder"))?;
                if !path.is_file() {
                    bail!("{} is missing: run e2e/k8s/build.sh", path.display());
                }
                cmd.arg(path)
            }
        };
        cmd.args(&process.args)
            .env_clear()
            .env("PATH", CONTAINER_PATH)
            .env("HOME", "/")
            .env("HOSTNAME", &sandbox.hostname)
            .envs(process.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = cmd.spawn().context("starting the container")?;
        let pid = child.id();
        self.child = Some(child);
        let probe = |field: &str| -> Result<Option<ProbeRun>> {
            Ok(http_probe(container, field)?.map(|p: HttpProbe| ProbeRun::new(p, now)))
        };
        self.probes = Probes {
            startup: probe("startupProbe")?,
            liveness: probe("livenessProbe")?,
            readiness: probe("readinessProbe")?,
        };
        let restart = self.state().started.is_some();
        self.update(|s| {
            s.waiting = None;
            s.pid = Some(pid);
            s.started.get_or_insert(now);
            if restart {
                s.restarts += 1;
            }
            s.ready = false;
        });
        Ok(())
    }

    fn run_probes(&mut self, now: Instant) {
        let Some(ip) = self.sandbox.as_ref().map(|s| s.pod_ip) else {
            return;
        };
        if let Some(startup) = self.probes.startup.as_mut() {
            match startup.run(ip, now) {
                Some(true) => {}
                Some(false) => return self.probe_failed("startup probe failed", now),
                None => return,
            }
        }
        if let Some(liveness) = self.probes.liveness.as_mut()
            && liveness.run(ip, now) == Some(false)
        {
            return self.probe_failed("liveness probe failed", now);
        }
        // Without a readiness probe a running container is ready.
        let ready = match self.probes.readiness.as_mut() {
            Some(readiness) => readiness.run(ip, now) == Some(true),
            None => true,
        };
        self.update(|s| {
            s.ready = ready;
            if ready {
                s.first_ready.get_or_insert(now);
            }
        });
    }

    fn probe_failed(&mut self, why: &str, now: Instant) {
        self.stop_container(why);
        self.crashed(why.to_string(), now);
    }

    /// Records a stop and schedules the restart with the back-off.
    fn crashed(&mut self, why: String, now: Instant) {
        self.update(|s| {
            s.ready = false;
            s.pid = None;
            s.last_stop = Some(why);
        });
        self.next_start = now + self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }

    /// SIGTERM, then SIGKILL after the Pod's grace period.
    fn stop_container(&mut self, why: &str) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let grace = Duration::from_secs(
            self.pod["spec"]["terminationGracePeriodSeconds"]
                .as_u64()
                .unwrap_or(30),
        );
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + grace;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status.to_string(),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(TICK / 4),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break "killed after the grace period".to_string();
                }
            }
        };
        self.update(|s| {
            s.ready = false;
            s.pid = None;
            s.last_stop = Some(format!("{why}: {status}"));
        });
    }

    /// Writes the Pod's status when it changed.
    fn publish_status(&mut self) {
        if self.sandbox.is_none() {
            return;
        }
        let state = self.state();
        let running = self.child.is_some() || self.stand_in;
        let ready = running && state.ready;
        let condition = |kind: &str, on: bool| json!({"type": kind, "status": if on { "True" } else { "False" }});
        let name = text(&self.pod, "/spec/containers/0/name").unwrap_or("");
        let container_state = if running {
            json!({"running": {}})
        } else if state.last_stop.is_some() {
            json!({"waiting": {"reason": "CrashLoopBackOff", "message": state.last_stop}})
        } else {
            json!({"waiting": {"reason": "ContainerCreating", "message": state.waiting}})
        };
        let status = json!({
            "phase": if state.started.is_some() { "Running" } else { "Pending" },
            "conditions": [condition("PodScheduled", true), condition("Initialized", true),
                condition("ContainersReady", ready), condition("Ready", ready)],
            "containerStatuses": [{"name": name, "ready": ready, "started": running,
                "restartCount": state.restarts, "image": self.pod["spec"]["containers"][0]["image"],
                "imageID": "", "state": container_state}]});
        if self.published.as_ref() == Some(&status) {
            return;
        }
        let patched = self.kube.merge_patch(
            "v1",
            "Pod",
            Some(&self.namespace()),
            &self.name(),
            json!({"status": status}),
            true,
        );
        if patched.is_ok() {
            self.published = Some(status);
        }
    }
}

/// Now, as Kubernetes writes times (`2026-11-26T08:00:00Z`).
fn now_rfc3339() -> String {
    format!("{:.0}", k8s_openapi::jiff::Timestamp::now())
}
