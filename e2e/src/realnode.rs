//! Real Kubernetes nodes in the lab: containerd (with runc from the machine), the kubelet and
//! kube-proxy, built from pinned modules by `e2e/k8s/node/build.sh` ([`NodePrograms`]), each
//! node in its own network namespace with its own folder, sockets and cgroup subtree
//! ([`RealNode`]), registered to the lab's real API server.
//!
//! Each process enters the node's network namespace with `nsenter --net` and nothing else: the
//! kubelet's volume mounts and containerd's root filesystems must be in one mount namespace
//! (`ip netns exec` would give each program a private one, and a Secret the kubelet mounts would
//! be an empty folder in the container). hostNetwork Pods (the speakers) therefore live in the
//! node's namespace; other Pods get a namespace of their own on the node's `cni0` bridge, with
//! an address from the node's slice of 203.0.113.0/24 ([`pod_cidr`]).
//!
//! [`RealNode::teardown`] (also on drop) leaves the machine as it found it: the kubelet and
//! kube-proxy stopped, every Pod removed through the CRI, containerd stopped, whatever survives
//! in the node's cgroup subtree or names its folder killed, every mount under the folder
//! unmounted, the cgroup subtree removed, the folder deleted, and the kernel settings the kubelet
//! changes (`vm.overcommit_memory`, `kernel.panic`, `kernel.panic_on_oops`) put back. The
//! network namespace belongs to the [`crate::netns::Lab`] that made it. [`cleanup_stale`] does
//! the same for the nodes of a run that died. [`RealCluster`] starts every node of a lab.

pub mod cleanup;
pub mod cluster;
pub mod config;
pub mod daemons;
pub mod image;
pub mod metallb;

pub use cluster::{NodeImages, NodeInfo, RealCluster};

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::control_plane::{self, ControlPlane};
use crate::kube_client::Kube;
use crate::netns::Node;
use config::NodeFiles;

/// The Pods' addresses on all nodes; node `i` (1-based) gets the `i`-th /27 of it.
pub const POD_RANGE: &str = "203.0.113.0/24";
/// The most nodes [`pod_cidr`] has a slice for.
pub const MAX_NODES: usize = 8;
/// How long a node may take to register and turn Ready.
pub const READY_LIMIT: Duration = Duration::from_secs(120);
/// The prefix of every node's folder (in the temporary folder) and cgroup subtree.
const NODE_PREFIX: &str = "swimlb-node-";
/// The kernel settings the kubelet sets at start (`protectKernelDefaults: false`), which
/// [`RealNode::teardown`] puts back.
const KUBELET_SYSCTLS: [&str; 4] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
];

/// The Pod subnet of node `index` (1-based): `203.0.113.32*(index-1)/27`.
pub fn pod_cidr(index: usize) -> Result<String> {
    if !(1..=MAX_NODES).contains(&index) {
        bail!("real nodes are 1 to {MAX_NODES}, not {index}");
    }
    Ok(format!("203.0.113.{}/27", 32 * (index - 1)))
}

/// The folder of the node programs: `$SWIMLB_K8S_NODE_BIN` when set (`test.sh` sets it), else
/// what `e2e/k8s/node/build.sh` prints (it builds once, then finds its cache).
/// The folder a build script of the lab prints: `$var` when set (`test.sh` sets it), else what
/// `e2e/<script>` prints (it builds once, then finds its cache).
pub(crate) fn built_dir(var: &str, script: &str) -> Result<PathBuf> {
    swimlb_control_plane::control_plane::built_dir(
        var,
        &Path::new(env!("CARGO_MANIFEST_DIR")).join(script),
    )
}

#[derive(Debug, Clone)]
pub struct NodePrograms {
    dir: PathBuf,
}

impl NodePrograms {
    /// Finds (or builds) the programs; fails naming what is missing.
    pub fn locate() -> Result<NodePrograms> {
        let dir = built_dir("SWIMLB_K8S_NODE_BIN", "k8s/node/build.sh")?;
        let programs = NodePrograms { dir };
        for p in [
            "kubelet",
            "kube-proxy",
            "containerd",
            "containerd-shim-runc-v2",
            "ctr",
            "crictl",
            "pause",
            "cni/bridge",
            "cni/host-local",
            "cni/loopback",
        ] {
            if !programs.path(p).is_file() {
                bail!(
                    "{} is missing: run e2e/k8s/node/build.sh",
                    programs.path(p).display()
                );
            }
        }
        Ok(programs)
    }

    /// The path of `program` (`kubelet`, `cni/bridge`, ...).
    pub fn path(&self, program: &str) -> PathBuf {
        self.dir.join(program)
    }

    /// The pause image's tag, with the version the build read from Kubernetes' Makefile.
    pub fn pause_tag(&self) -> String {
        let version = std::fs::read_to_string(self.path("pause.version")).unwrap_or_default();
        format!("localhost/swimlb/pause:{}", version.trim())
    }
}

/// Makes what the real nodes of a cluster share, once per control plane: kube-proxy's
/// ServiceAccount with the ClusterRole Kubernetes ships for it (`system:node-proxier`), as
/// kubeadm does.
pub fn prepare_cluster(plane: &ControlPlane) -> Result<()> {
    let admin = plane.admin();
    admin.apply(
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "kube-proxy", "namespace": "kube-system"}}),
        "swimlb-lab",
    )?;
    admin.apply(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "swimlb-lab:kube-proxy"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "system:node-proxier"},
            "subjects": [{"kind": "ServiceAccount", "name": "kube-proxy",
                          "namespace": "kube-system"}]}),
        "swimlb-lab",
    )?;
    Ok(())
}

/// One of a node's long-running programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// containerd (its shims are its children).
    Containerd,
    /// The kubelet.
    Kubelet,
    /// kube-proxy.
    KubeProxy,
}

impl Part {
    /// The program's name, also its log's.
    pub const fn as_str(self) -> &'static str {
        match self {
            Part::Containerd => "containerd",
            Part::Kubelet => "kubelet",
            Part::KubeProxy => "kube-proxy",
        }
    }
}

/// Options of a node.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// kube-proxy's mode: `nftables` or `iptables`.
    pub proxy_mode: String,
    /// The runc the node's containerd runs (Debian's).
    pub runc: PathBuf,
}

impl Default for NodeOptions {
    fn default() -> NodeOptions {
        NodeOptions {
            proxy_mode: "nftables".into(),
            runc: PathBuf::from("/usr/sbin/runc"),
        }
    }
}

/// A running real node; dropping it tears it down.
#[derive(Debug)]
pub struct RealNode {
    /// The node's name (its Node object's).
    pub name: String,
    /// Its network namespace (the lab's node namespace).
    pub netns: String,
    /// Its address.
    pub ip: Ipv4Addr,
    /// Its Pods' subnet.
    pub pod_cidr: String,
    dir: PathBuf,
    cgroup_root: String,
    programs: NodePrograms,
    args: Vec<(Part, Vec<String>)>,
    children: Vec<(Part, Child)>,
    sysctls: Vec<(&'static str, String)>,
    torn_down: bool,
}

impl RealNode {
    /// Starts node `node` of the lab (its namespace made by [`crate::netns::Lab`]) against
    /// `plane` (which issued a kubelet certificate for it, and on which [`prepare_cluster`]
    /// ran): containerd; the OCI archives `images` imported into it (the first, the pause image,
    /// pinned); then the kubelet and kube-proxy. The Node's registration is
    /// [`RealNode::wait_ready`]'s.
    pub fn start(
        plane: &ControlPlane,
        node: &Node,
        programs: &NodePrograms,
        options: &NodeOptions,
        images: &[&Path],
    ) -> Result<RealNode> {
        ensure_inotify_instances();
        let id = format!("{NODE_PREFIX}{}-{}", std::process::id(), node.netns);
        let mut real = RealNode {
            name: node.name.clone(),
            netns: node.netns.clone(),
            ip: node.v4,
            pod_cidr: pod_cidr(node.index)?,
            dir: std::env::temp_dir().join(&id),
            cgroup_root: format!("/{id}"),
            programs: programs.clone(),
            args: Vec::new(),
            children: Vec::new(),
            sysctls: read_sysctls(),
            torn_down: false,
        };
        // From here on a failure drops `real`, which removes whatever was made.
        let _ = std::fs::remove_dir_all(&real.dir);
        real.write_files(plane, options)?;
        real.route_services(plane)?;
        cleanup::make_cgroup_root(&real.cgroup_root)?;
        real.spawn(Part::Containerd)?;
        real.wait_containerd()?;
        for (i, archive) in images.iter().enumerate() {
            real.import(archive, i == 0)
                .with_context(|| format!("importing {} into {}", archive.display(), real.name))?;
        }
        real.spawn(Part::Kubelet)?;
        real.spawn(Part::KubeProxy)?;
        Ok(real)
    }

    /// Writes the node's configuration files and each program's command line.
    fn write_files(&mut self, plane: &ControlPlane, options: &NodeOptions) -> Result<()> {
        let ca = plane.ca_path();
        let cni_bin = self.programs.path("cni");
        let files = NodeFiles {
            dir: &self.dir,
            name: &self.name,
            ip: self.ip,
            pod_cidr: &self.pod_cidr,
            cgroup_root: &self.cgroup_root,
            cni_bin: &cni_bin,
            ca: &ca,
        };
        for sub in ["cni/net.d", "pod-logs", "volume-plugins", "kubelet"] {
            std::fs::create_dir_all(self.dir.join(sub))?;
        }
        let d = |f: &str| self.dir.join(f);
        let pause = self.programs.pause_tag();
        std::fs::write(
            d("containerd.toml"),
            files.containerd_toml(&options.runc, &pause),
        )?;
        std::fs::write(d("cni/net.d/10-swimlb-lab.conflist"), files.cni_conflist())?;
        std::fs::write(d("kubelet.yaml"), files.kubelet_yaml())?;
        // The lab has no DNS server: Pods get no name server rather than the machine's.
        std::fs::write(d("resolv.conf"), "# the swimlb lab has no DNS\n")?;
        let proxy_kubeconfig = d("kube-proxy.kubeconfig");
        plane.service_account_kubeconfig("kube-system", "kube-proxy", &proxy_kubeconfig)?;
        std::fs::write(
            d("kube-proxy.yaml"),
            files.kube_proxy_yaml(&options.proxy_mode, &proxy_kubeconfig, POD_RANGE),
        )?;
        let s = |p: PathBuf| p.display().to_string();
        self.args = vec![
            (
                Part::Containerd,
                vec![format!("--config={}", s(d("containerd.toml")))],
            ),
            (
                Part::Kubelet,
                vec![
                    format!("--config={}", s(d("kubelet.yaml"))),
                    format!("--kubeconfig={}", s(plane.kubelet_kubeconfig(&self.name))),
                    format!("--root-dir={}", s(d("kubelet"))),
                    format!("--cert-dir={}", s(d("kubelet-pki"))),
                    format!("--hostname-override={}", self.name),
                    format!("--node-ip={}", self.ip),
                    "--v=1".into(),
                ],
            ),
            (
                Part::KubeProxy,
                vec![
                    format!("--config={}", s(d("kube-proxy.yaml"))),
                    "--v=1".into(),
                ],
            ),
        ];
        Ok(())
    }

    /// Starts `part` in the node's namespace, its output appended to its log (containerd finds
    /// its runc shim beside its own program).
    pub fn spawn(&mut self, part: Part) -> Result<()> {
        let program = self.programs.path(part.as_str());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(part))?;
        let args = self
            .args
            .iter()
            .find(|(p, _)| *p == part)
            .map(|(_, a)| a.clone())
            .unwrap_or_default();
        let child = Command::new("nsenter")
            .arg(format!("--net=/var/run/netns/{}", self.netns))
            .arg("--")
            .arg(&program)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {} in {}", program.display(), self.netns))?;
        self.children.push((part, child));
        Ok(())
    }

    /// Stops `part` (SIGTERM, SIGKILL after `grace`).
    pub fn stop(&mut self, part: Part, grace: Duration) {
        let mut kept = Vec::new();
        for (p, mut child) in std::mem::take(&mut self.children) {
            if p == part {
                terminate(&mut child, grace);
            } else {
                kept.push((p, child));
            }
        }
        self.children = kept;
    }

    /// The log of `part`.
    pub fn log_path(&self, part: Part) -> PathBuf {
        self.dir.join(format!("{}.log", part.as_str()))
    }

    /// The last `n` lines of `part`'s log.
    pub fn log_tail(&self, part: Part, n: usize) -> String {
        let text = std::fs::read_to_string(self.log_path(part)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// The node's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The node's cgroup subtree (`/swimlb-node-...`).
    pub fn cgroup_root(&self) -> &str {
        &self.cgroup_root
    }

    /// `crictl` talking to the node's containerd.
    pub fn crictl(&self) -> Command {
        let mut c = Command::new(self.programs.path("crictl"));
        let endpoint = format!("unix://{}", self.dir.join("containerd.sock").display());
        c.args([
            "--runtime-endpoint",
            &endpoint,
            "--image-endpoint",
            &endpoint,
        ]);
        c.args(["--config", "/dev/null"]);
        c
    }

    /// `ctr -n k8s.io` talking to the node's containerd.
    pub fn ctr(&self) -> Command {
        let mut c = Command::new(self.programs.path("ctr"));
        c.arg("--address")
            .arg(self.dir.join("containerd.sock"))
            .args(["-n", "k8s.io"]);
        c
    }

    /// Imports the OCI archive `archive` into the node's containerd (`ctr -n k8s.io images
    /// import`), as the CRI sees images; `pinned`: never garbage-collected (the pause image).
    pub fn import(&self, archive: &Path, pinned: bool) -> Result<()> {
        let mut ctr = self.ctr();
        ctr.args(["images", "import"]);
        if pinned {
            ctr.arg("--label=io.cri-containerd.pinned=pinned");
        }
        image::run(ctr.arg(archive)).map(|_| ())
    }

    /// Waits until containerd answers the CRI (after a start or a restart), at most 60 s.
    pub fn wait_containerd(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = self.crictl().arg("info").output();
            if let Ok(out) = &out
                && out.status.success()
            {
                return Ok(());
            }
            self.check_running()?;
            if Instant::now() > deadline {
                bail!(
                    "containerd of {} does not answer after 60 s; its log:\n{}",
                    self.name,
                    self.log_tail(Part::Containerd, 20)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Fails with the end of its log when a part has exited.
    pub fn check_running(&mut self) -> Result<()> {
        for (part, child) in &mut self.children {
            if let Ok(Some(status)) = child.try_wait() {
                let part = *part;
                bail!(
                    "{} of {} exited ({status}); the end of {}:\n{}",
                    part.as_str(),
                    self.name,
                    self.log_path(part).display(),
                    self.log_tail(part, 30)
                );
            }
        }
        Ok(())
    }

    /// Waits until the Node is Ready (the kubelet's own status) and returns it.
    pub fn wait_ready(&mut self, plane: &ControlPlane) -> Result<Value> {
        let deadline = Instant::now() + READY_LIMIT;
        loop {
            if let Ok(Some(node)) = plane.admin().get("v1", "Node", None, &self.name)
                && node_ready(&node)
            {
                return Ok(node);
            }
            self.check_running()?;
            if Instant::now() > deadline {
                bail!(
                    "Node {} not Ready within {READY_LIMIT:?}; the end of the kubelet's log:\n{}",
                    self.name,
                    self.log_tail(Part::Kubelet, 30)
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Routes the Services' cluster IPs from the node through the API server's host (the lab's
    /// client, the node's gateway), as a real node's default route would: a packet the node's
    /// own processes send (a host-network speaker's to the `kubernetes` Service) needs a route
    /// before kube-proxy's `output` hook can rewrite its destination. Pods route through the
    /// node, where kube-proxy's `prerouting` hook rewrites theirs first.
    fn route_services(&self, plane: &ControlPlane) -> Result<()> {
        let gateway = plane.api_addr.ip().to_string();
        for range in control_plane::SERVICE_CIDR
            .split(',')
            .filter(|r| !r.contains(':'))
        {
            image::run(
                crate::netns::Lab::command_in(&self.netns, "ip")
                    .args(["route", "replace", range, "via", &gateway]),
            )?;
        }
        Ok(())
    }

    /// A client of the kubelet's own API (`https://IP:10250`: `/stats/summary`, `/pods`) from
    /// `netns` (the lab's client), as the administrator: the kubelet trusts the lab's CA for
    /// clients. Its serving certificate is self-signed (no serving certificate was issued), so
    /// the client does not verify it.
    pub fn kubelet_api(&self, plane: &ControlPlane, netns: &str) -> Result<Kube> {
        let cp = |f: &str| plane.dir().join(f).display().to_string();
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n  - name: kubelet\n    cluster:\n      server: https://{ip}:10250\n      insecure-skip-tls-verify: true\nusers:\n  - name: admin\n    user:\n      client-certificate: {crt}\n      client-key: {key}\ncontexts:\n  - name: kubelet\n    context: {{cluster: kubelet, user: admin}}\ncurrent-context: kubelet\n",
            ip = self.ip,
            crt = cp("admin.crt"),
            key = cp("admin.key"),
        );
        let path = self.dir.join("kubelet-api.kubeconfig");
        std::fs::write(&path, text)?;
        Kube::from_kubeconfig_in(&path, Some(netns))
    }

    /// Adds a route from `netns` (the lab's client, where the API server runs) to this node's
    /// Pods, through the node: the Pods' answers come back without NAT.
    pub fn route_pods_from(&self, netns: &str) -> Result<()> {
        image::run(crate::netns::Lab::command_in(netns, "ip").args([
            "route",
            "replace",
            &self.pod_cidr,
            "via",
            &self.ip.to_string(),
        ]))
        .map(|_| ())
    }

    /// Stops everything and removes what the node made (see the module's documentation).
    /// Idempotent; also run on drop. Returns what it could not remove.
    pub fn teardown(&mut self) -> Result<()> {
        if self.torn_down {
            return Ok(());
        }
        self.torn_down = true;
        self.stop(Part::KubeProxy, Duration::from_secs(5));
        self.stop(Part::Kubelet, Duration::from_secs(5));
        if self.children.iter().any(|(p, _)| *p == Part::Containerd) {
            // Through the CRI: containerd unmounts and deletes what each Pod had.
            let _ = self.crictl().args(["rmp", "--all", "--force"]).output();
        }
        self.stop(Part::Containerd, Duration::from_secs(5));
        let folder = self.dir.display().to_string();
        let mut problems = Vec::new();
        for _ in 0..3 {
            cleanup::kill_pids(&cleanup::pids_with_argument(&folder));
            if let Err(e) = cleanup::kill_cgroup_tree(&self.cgroup_root) {
                problems.push(format!("{e:#}"));
            }
        }
        if let Err(e) = cleanup::unmount_under(&self.dir) {
            problems.push(format!("{e:#}"));
        }
        if let Err(e) = cleanup::remove_cgroup_tree(&self.cgroup_root) {
            problems.push(format!("{e:#}"));
        }
        restore_sysctls(&self.sysctls);
        if std::env::var_os("SWIMLB_LAB_KEEP").is_some() {
            // The marker keeps it from a later run's sweep ([`cleanup_stale`]), as the lab's.
            let _ = std::fs::write(self.dir.join("KEPT"), "");
            eprintln!("SWIMLB_LAB_KEEP: kept {}", self.dir.display());
        } else if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            problems.push(format!("removing {}: {e}", self.dir.display()));
        }
        if !problems.is_empty() {
            bail!("tearing down {}: {}", self.name, problems.join("; "));
        }
        Ok(())
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("{e:#}");
        }
    }
}

/// Whether a Node's condition `Ready` is `True`.
pub fn node_ready(node: &Value) -> bool {
    node["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// The inotify instances a user may hold, at least: a 3-node cluster's kubelets, containerds
/// and the controller manager hold about 30, and several clusters at once (other runs, other
/// tests) passed the kernel's default of 128 (`inotify_init: too many open files` from a
/// kubelet). kind's known issues ask for 512 too.
const INOTIFY_INSTANCES: u64 = 512;

/// Raises `fs.inotify.max_user_instances` to [`INOTIFY_INSTANCES`] when it is lower, once per
/// process, and says so. Not put back: a limit is no state of the lab's, and another run's
/// clusters may need it still.
fn ensure_inotify_instances() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let path = "/proc/sys/fs/inotify/max_user_instances";
        let Some(now) = std::fs::read_to_string(path)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
        else {
            return;
        };
        if now >= INOTIFY_INSTANCES {
            return;
        }
        match std::fs::write(path, INOTIFY_INSTANCES.to_string()) {
            Ok(()) => eprintln!(
                "real nodes: fs.inotify.max_user_instances raised from {now} to {INOTIFY_INSTANCES} (each node's kubelet and containerd hold several)"
            ),
            Err(e) => eprintln!(
                "real nodes: fs.inotify.max_user_instances is {now} and could not be raised to {INOTIFY_INSTANCES} ({e}): several clusters at once may fail with `too many open files`"
            ),
        }
    });
}

/// The kernel settings the kubelet changes, as they were before this process started its
/// first node (read once: a second node starts after the first one's kubelet changed them).
fn read_sysctls() -> Vec<(&'static str, String)> {
    static BEFORE: std::sync::OnceLock<Vec<(&'static str, String)>> = std::sync::OnceLock::new();
    BEFORE
        .get_or_init(|| {
            KUBELET_SYSCTLS
                .iter()
                .filter_map(|k| {
                    let v = std::fs::read_to_string(format!("/proc/sys/{k}")).ok()?;
                    Some((*k, v.trim().to_string()))
                })
                .collect()
        })
        .clone()
}

fn restore_sysctls(saved: &[(&'static str, String)]) {
    for (key, value) in saved {
        let _ = std::fs::write(format!("/proc/sys/{key}"), value);
    }
}

/// SIGTERM, then SIGKILL after `grace`; reaped either way.
fn terminate(child: &mut Child, grace: Duration) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Tears down what the real nodes of dead runs left (their folders `swimlb-node-PID-...` in
/// the temporary folder, whose process `PID` is gone): processes, mounts, cgroups, folders.
pub fn cleanup_stale() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(NODE_PREFIX) else {
            continue;
        };
        let pid = rest.split(['-', 'x']).next().unwrap_or("");
        let dir = entry.path();
        if pid.is_empty()
            || Path::new(&format!("/proc/{pid}")).exists()
            || dir.join("KEPT").exists()
        {
            continue;
        }
        let root = format!("/{name}");
        cleanup::kill_pids(&cleanup::pids_with_argument(&dir.display().to_string()));
        let _ = cleanup::kill_cgroup_tree(&root);
        let _ = cleanup::unmount_under(&dir);
        let _ = cleanup::remove_cgroup_tree(&root);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
