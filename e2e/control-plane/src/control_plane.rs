//! The real Kubernetes control plane under the lab's Kubernetes tests: etcd, kube-apiserver,
//! kube-controller-manager and kube-scheduler, built from the Go modules pinned in `e2e/k8s/`
//! ([`Programs`]) and run as processes, on the loopback interface or inside one of the lab's
//! network namespaces ([`Network`]).
//!
//! [`ControlPlane::start`] makes what a cluster's installer makes: a CA and the serving
//! certificate of the API server (with the addresses it is reached on, the `kubernetes`
//! Service's cluster IP included), client certificates for the administrator, the controller
//! manager, the scheduler and each node's kubelet, and the ServiceAccount signing key. The API
//! server runs with RBAC and Node authorization, the NodeRestriction admission plugin and an
//! audit log of every request ([`ControlPlane::audit`]: who did what, the real counterpart of
//! a request log). The controller manager runs every default controller (EndpointSlice,
//! DaemonSet, Deployment and ReplicaSet, ServiceAccount and token, garbage collector, node
//! lifecycle, ...) with a credential per controller.
//!
//! Every address is in the documentation ranges: the Services' cluster IPs come from
//! [`SERVICE_CIDR`]. Dropping a [`ControlPlane`] stops its processes; its folder (certificates,
//! etcd's data, logs) is left under the lab's work directory for a failure's post-mortem and is
//! removed with it.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::kube_client::Kube;
use crate::kubectl::{Kubectl, Source};

/// The Services' cluster IP ranges, dual stack (the upper half of 192.0.2.0/24: the tests'
/// address pools take the lower half).
pub const SERVICE_CIDR: &str = "192.0.2.128/25,2001:db8:ffff::/108";
/// The `kubernetes` Service's cluster IP: the first of [`SERVICE_CIDR`].
pub const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 129);
/// How long the API server may take to answer `/readyz` after it starts.
pub const READY_LIMIT: Duration = Duration::from_secs(90);
/// What etcd says when asked to compact to a revision its history is compacted to already.
const ALREADY_COMPACTED: &str = "required revision has been compacted";

/// The folder of the built programs (`etcd`, `kube-apiserver`, `kube-controller-manager`,
/// `kube-scheduler`, `kubectl`) and MetalLB's `metallb-native.yaml`.
#[derive(Debug, Clone)]
pub struct Programs {
    dir: PathBuf,
}

impl Programs {
    /// `$SWIMLB_K8S_BIN` when set (`test.sh` sets it), else what `e2e/k8s/build.sh` prints (it
    /// builds once, then finds its cache).
    pub fn locate() -> Result<Programs> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../k8s/build.sh");
        let dir = built_dir("SWIMLB_K8S_BIN", &script)
            .context("the Kubernetes lab needs its control plane")?;
        let programs = Programs { dir };
        for p in [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
        ] {
            if !programs.path(p).is_file() {
                bail!(
                    "{} is missing: run e2e/k8s/build.sh",
                    programs.path(p).display()
                );
            }
        }
        Ok(programs)
    }

    /// The path of `program`.
    pub fn path(&self, program: &str) -> PathBuf {
        self.dir.join(program)
    }
}

/// Where the control plane runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Network {
    /// On 127.0.0.1 of the current network namespace, on free ports (tests without root).
    Loopback,
    /// Inside network namespace `netns`, the API server on `ip`:6443 (the lab's client
    /// namespace: every node reaches it over the lab bridge).
    Netns {
        /// The namespace.
        netns: String,
        /// The API server's address there.
        ip: Ipv4Addr,
    },
}

/// Knobs of a control plane.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The nodes whose kubelets get a client certificate (`system:node:NAME`).
    pub nodes: Vec<String>,
    /// kube-apiserver's `--etcd-compaction-interval` (its default, 5 minutes, when `None`):
    /// short values make watches meet 410 Gone.
    pub compaction_interval: Option<Duration>,
}

/// One of the control plane's processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Component {
    /// etcd.
    Etcd,
    /// kube-apiserver.
    ApiServer,
    /// kube-controller-manager.
    ControllerManager,
    /// kube-scheduler.
    Scheduler,
}

impl Component {
    /// The program's name, also its log's.
    pub const fn as_str(self) -> &'static str {
        match self {
            Component::Etcd => "etcd",
            Component::ApiServer => "kube-apiserver",
            Component::ControllerManager => "kube-controller-manager",
            Component::Scheduler => "kube-scheduler",
        }
    }
}

/// A running control plane.
#[derive(Debug)]
pub struct ControlPlane {
    programs: Programs,
    dir: PathBuf,
    network: Network,
    /// The API server's address.
    pub api_addr: SocketAddr,
    /// etcd's client port on 127.0.0.1 (of the control plane's namespace).
    etcd_port: u16,
    args: BTreeMap<Component, Vec<String>>,
    children: BTreeMap<Component, Child>,
    admin: Kube,
}

impl ControlPlane {
    /// Makes the certificates in `dir`, starts etcd, the API server, the controller manager and
    /// the scheduler, and returns once the API server is ready and the `default` ServiceAccount
    /// exists (the controllers work).
    pub fn start(dir: &Path, network: Network, options: &Options) -> Result<ControlPlane> {
        let programs = Programs::locate()?;
        std::fs::create_dir_all(dir)?;
        let (api_addr, etcd_port, etcd_peer_port) = match &network {
            Network::Loopback => {
                let [api, etcd, peer] = free_ports()?;
                (SocketAddr::from((Ipv4Addr::LOCALHOST, api)), etcd, peer)
            }
            Network::Netns { ip, .. } => (SocketAddr::from((*ip, 6443)), 2379, 2380),
        };
        write_files(dir, api_addr, &options.nodes)?;
        let args = component_args(
            dir,
            &network,
            api_addr,
            (etcd_port, etcd_peer_port),
            options,
        );
        let netns = match &network {
            Network::Loopback => None,
            Network::Netns { netns, .. } => Some(netns.as_str()),
        };
        let admin = Kube::from_kubeconfig_in(&dir.join("admin.kubeconfig"), netns)?;
        let mut plane = ControlPlane {
            programs,
            dir: dir.to_path_buf(),
            network,
            api_addr,
            etcd_port,
            args,
            children: BTreeMap::new(),
            admin,
        };
        plane.spawn(Component::Etcd)?;
        plane.spawn(Component::ApiServer)?;
        plane.wait_ready(READY_LIMIT)?;
        plane.spawn(Component::ControllerManager)?;
        plane.spawn(Component::Scheduler)?;
        plane.wait_for(READY_LIMIT, "the default ServiceAccount", |kube| {
            Ok(kube
                .get("v1", "ServiceAccount", Some("default"), "default")?
                .is_some())
        })?;
        Ok(plane)
    }

    /// The administrator's client (`system:masters`).
    pub fn admin(&self) -> &Kube {
        &self.admin
    }

    /// A kubeconfig for user `user` in group `system:masters` (a client certificate of the
    /// cluster's CA): the audit log tells its requests apart.
    pub fn user_kubeconfig(&self, user: &str) -> Result<PathBuf> {
        let pki = Pki {
            dir: self.dir.clone(),
        };
        let file = format!("user-{user}");
        pki.leaf(
            &file,
            &format!("/O=system:masters/CN={user}"),
            "extendedKeyUsage=clientAuth\n",
        )?;
        let path = self.dir.join(format!("{file}.kubeconfig"));
        pki.write_kubeconfig(&path, &format!("https://{}", self.api_addr), &file)?;
        Ok(path)
    }

    /// The pinned `kubectl` as the administrator, from the control plane's namespace.
    pub fn kubectl(&self) -> Kubectl {
        Kubectl::new(
            self.netns(),
            &self.admin_kubeconfig(),
            &self.dir.join("kubectl-cache"),
        )
        .with_program(self.program("kubectl"))
    }

    /// Installs swimlb's CRDs (`deploy/crds.yaml`, with the pinned `kubectl apply
    /// --server-side`) and waits until the API server serves them.
    pub fn install_crds(&self) -> Result<()> {
        let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds.yaml");
        self.kubectl().apply(Source::File(&crds))?;
        self.wait_for(READY_LIMIT, "swimlb's CRDs established", |kube| {
            for name in [
                "ipaddresspools.swimlb.io",
                "l2advertisements.swimlb.io",
                "servicel2statuses.swimlb.io",
            ] {
                let crd = kube.get(
                    "apiextensions.k8s.io/v1",
                    "CustomResourceDefinition",
                    None,
                    name,
                )?;
                let established = crd.as_ref().is_some_and(|c| {
                    c["status"]["conditions"].as_array().is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == "Established" && c["status"] == "True")
                    })
                });
                if !established {
                    return Ok(false);
                }
            }
            Ok(true)
        })
    }

    /// The network namespace the control plane runs in (`None`: this one).
    pub fn netns(&self) -> Option<&str> {
        match &self.network {
            Network::Loopback => None,
            Network::Netns { netns, .. } => Some(netns),
        }
    }

    /// A kubeconfig at `path` for ServiceAccount `namespace/name`, with a token the API server
    /// issues for it (TokenRequest, valid a day), as a Pod of that account would get.
    pub fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
        path: &Path,
    ) -> Result<()> {
        let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": 86_400}});
        let answer = self.admin.raw_post(
            &format!("/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"),
            &request,
        )?;
        let token = answer["status"]["token"]
            .as_str()
            .context("a TokenRequest without a token")?;
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n  - name: lab\n    cluster:\n      server: https://{addr}\n      certificate-authority: {ca}\nusers:\n  - name: {name}\n    user:\n      token: {token}\ncontexts:\n  - name: lab\n    context: {{cluster: lab, user: {name}, namespace: {namespace}}}\ncurrent-context: lab\n",
            addr = self.api_addr,
            ca = self.ca_path().display(),
        );
        std::fs::write(path, text)?;
        Ok(())
    }

    /// The folder of certificates, kubeconfigs, etcd's data and the logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The kubeconfig of the administrator.
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// The kubeconfig of node `node`'s kubelet (`system:node:NODE` in `system:nodes`).
    pub fn kubelet_kubeconfig(&self, node: &str) -> PathBuf {
        self.dir.join(format!("kubelet-{node}.kubeconfig"))
    }

    /// The cluster's CA certificate (what a Pod finds as `ca.crt`).
    pub fn ca_path(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The path of a built program (`kubectl`, `kube-apiserver`, ...) or `metallb-native.yaml`.
    pub fn program(&self, name: &str) -> PathBuf {
        self.programs.path(name)
    }

    /// The log of `component`.
    pub fn log_path(&self, component: Component) -> PathBuf {
        self.dir.join(format!("{}.log", component.as_str()))
    }

    /// The API server's version, as `/version` reports it (`v1.37.2`).
    pub fn server_version(&self) -> Result<String> {
        let version = self.admin.raw_get("/version")?;
        version["gitVersion"]
            .as_str()
            .map(str::to_string)
            .context("/version has no gitVersion")
    }

    /// Registers Node `name` at `ip` as its kubelet does, with the kubelet's own credential
    /// (`system:node:NAME`, which NodeRestriction confines to its own Node): the Node with its
    /// well-known labels, its status (addresses, capacity, condition Ready) and its heartbeat
    /// Lease in `kube-node-lease`. Returns the kubelet's client, to renew the heartbeat with
    /// [`heartbeat`].
    pub fn register_node(&self, name: &str, ip: IpAddr) -> Result<Kube> {
        let kubelet = Kube::from_kubeconfig_in(&self.kubelet_kubeconfig(name), self.netns())?;
        kubelet.create(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": std::env::consts::ARCH}}}))?;
        let resources = json!({"cpu": "2", "memory": "8Gi", "pods": "110"});
        kubelet.merge_patch(
            "v1",
            "Node",
            None,
            name,
            json!({"status": {
                "addresses": [{"type": "InternalIP", "address": ip.to_string()},
                              {"type": "Hostname", "address": name}],
                "capacity": resources, "allocatable": resources,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                    "message": "the lab plays this node's kubelet",
                    "lastHeartbeatTime": now_rfc3339(), "lastTransitionTime": now_rfc3339()}],
                "nodeInfo": {"kubeletVersion": "v1.37.2", "operatingSystem": "linux",
                    "architecture": std::env::consts::ARCH, "machineID": "", "systemUUID": "",
                    "bootID": "", "kernelVersion": "", "osImage": "swimlb lab",
                    "containerRuntimeVersion": "", "kubeProxyVersion": ""}}}),
            true,
        )?;
        heartbeat(&kubelet, name)?;
        Ok(kubelet)
    }

    /// Stops the API server (SIGTERM, then SIGKILL after 10 s): a real outage.
    pub fn stop_apiserver(&mut self) -> Result<()> {
        self.stop(Component::ApiServer)
    }

    /// Kills the API server (SIGKILL, reaped): a crash, without the graceful stop's wait for
    /// its watches (up to 10 s).
    pub fn kill_apiserver(&mut self) -> Result<()> {
        if let Some(mut child) = self.children.remove(&Component::ApiServer) {
            let _ = child.kill();
            let _ = child.wait();
        }
        Ok(())
    }

    /// Starts the API server again and waits until it is ready.
    pub fn start_apiserver(&mut self) -> Result<()> {
        self.spawn(Component::ApiServer)?;
        self.wait_ready(READY_LIMIT)
    }

    /// Stops `component` (SIGTERM, then SIGKILL after 10 s).
    pub fn stop(&mut self, component: Component) -> Result<()> {
        if let Some(mut child) = self.children.remove(&component) {
            terminate(&mut child, Duration::from_secs(10));
        }
        Ok(())
    }

    /// Starts `component` again with the arguments it first had.
    pub fn restart(&mut self, component: Component) -> Result<()> {
        self.stop(component)?;
        self.spawn(component)?;
        if component == Component::ApiServer {
            self.wait_ready(READY_LIMIT)?;
        }
        Ok(())
    }

    /// Compacts etcd's history up to its current revision, as kube-apiserver's periodic
    /// compaction does (through etcd's JSON gateway, as `etcdctl compaction --physical`): a
    /// watch that resumes from an older resourceVersion then meets 410 Gone. The revision.
    /// A history already compacted to the current revision (nothing written since the last
    /// compaction, as while kube-apiserver is down) is no error: there is nothing to compact.
    pub fn compact_etcd(&self) -> Result<u64> {
        // The range of key "\0" is empty; its header carries the store's revision.
        let range = self.etcd_post("/v3/kv/range", &json!({"key": "AA=="}))?;
        let revision: u64 = range["header"]["revision"]
            .as_str()
            .context("etcd's answer has no revision")?
            .parse()?;
        let compacted = self.etcd_post(
            "/v3/kv/compaction",
            &json!({"revision": revision.to_string(), "physical": true}),
        );
        match compacted {
            Err(err) if err.to_string().contains(ALREADY_COMPACTED) => Ok(revision),
            Err(err) => Err(err),
            Ok(_) => Ok(revision),
        }
    }

    /// POSTs `body` to etcd's `path`, from the control plane's namespace; the JSON answer.
    fn etcd_post(&self, path: &str, body: &Value) -> Result<Value> {
        use std::io::{Read as _, Write as _};
        let (port, netns) = (self.etcd_port, self.netns().map(str::to_string));
        let (path, body) = (path.to_string(), body.to_string());
        std::thread::spawn(move || -> Result<Value> {
            if let Some(netns) = &netns {
                crate::netns::enter_netns(netns)?;
            }
            let mut stream = std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port))
                .context("connecting to etcd")?;
            stream.set_read_timeout(Some(Duration::from_secs(10)))?;
            // HTTP/1.0: the answer is not chunked, and ends with the connection.
            write!(
                stream,
                "POST {path} HTTP/1.0\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )?;
            let mut text = String::new();
            stream.read_to_string(&mut text)?;
            let (head, answer) = text.split_once("\r\n\r\n").context("no HTTP answer")?;
            if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
                bail!("etcd {path}: {head}\n{answer}");
            }
            Ok(serde_json::from_str(answer)?)
        })
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }

    /// Every request of the audit log so far, in order.
    pub fn audit(&self) -> Result<Vec<AuditRecord>> {
        let text = std::fs::read_to_string(self.dir.join("audit.log")).unwrap_or_default();
        Ok(text
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .map(|event| AuditRecord::from_event(&event))
            .collect())
    }

    /// Polls `ready` every 100 ms until it holds (at most `limit`); the error names `what`
    /// and the last error `ready` returned.
    pub fn wait_for(
        &self,
        limit: Duration,
        what: &str,
        ready: impl Fn(&Kube) -> Result<bool>,
    ) -> Result<()> {
        let deadline = Instant::now() + limit;
        let mut last = String::new();
        loop {
            match ready(&self.admin) {
                Ok(true) => return Ok(()),
                Ok(false) => last.clear(),
                Err(e) => last = format!(": {e:#}"),
            }
            self.check_running()?;
            if Instant::now() > deadline {
                bail!(
                    "{what} not there within {limit:?}{last}; the end of kube-apiserver's log:\n{}",
                    self.log_tail(Component::ApiServer)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn wait_ready(&self, limit: Duration) -> Result<()> {
        self.wait_for(limit, "kube-apiserver's /readyz", |kube| {
            kube.raw_text("/readyz").map(|body| body.trim() == "ok")
        })
    }

    /// Fails with the end of its log when a component has exited.
    fn check_running(&self) -> Result<()> {
        for component in self.children.keys() {
            let log = self.log_path(*component);
            let exited = {
                // `try_wait` needs `&mut`; a component's exit is visible in /proc as a zombie.
                let pid = self.children[component].id();
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .map(|stat| stat.split(") ").nth(1).is_some_and(|s| s.starts_with('Z')))
                    .unwrap_or(true)
            };
            if exited {
                bail!(
                    "{} exited; the end of {}:\n{}",
                    component.as_str(),
                    log.display(),
                    self.log_tail(*component)
                );
            }
        }
        Ok(())
    }

    /// The last 20 lines of `component`'s log.
    fn log_tail(&self, component: Component) -> String {
        let text = std::fs::read_to_string(self.log_path(component)).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(20).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    fn spawn(&mut self, component: Component) -> Result<()> {
        let program = self.programs.path(component.as_str());
        let mut cmd = match &self.network {
            Network::Loopback => Command::new(&program),
            Network::Netns { netns, .. } => {
                let mut cmd = Command::new("ip");
                cmd.args(["netns", "exec", netns]).arg(&program);
                cmd
            }
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(component))?;
        cmd.args(&self.args[&component])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        self.children.insert(component, child);
        Ok(())
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // The reverse of the start: clients first, etcd last.
        for component in [
            Component::Scheduler,
            Component::ControllerManager,
            Component::ApiServer,
            Component::Etcd,
        ] {
            if let Some(mut child) = self.children.remove(&component) {
                terminate(&mut child, Duration::from_secs(5));
            }
        }
    }
}

/// Renews node `name`'s heartbeat Lease in `kube-node-lease` (made on the first call), as its
/// kubelet does every 10 s; without it the node lifecycle controller takes the node for gone
/// after its grace period (50 s) and taints it.
pub fn heartbeat(kubelet: &Kube, name: &str) -> Result<()> {
    kubelet.apply(
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                "renewTime": now_rfc3339_micros()}}),
        "kubelet",
    )?;
    Ok(())
}

/// Now, as Kubernetes writes times (`2026-11-26T08:00:00Z`).
fn now_rfc3339() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    format!("{:.0}", now)
}

/// Now with microseconds, as a Lease's `renewTime` (`2026-11-26T08:00:00.123456Z`).
fn now_rfc3339_micros() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    format!("{:.6}", now)
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

/// Where [`free_ports`] looks: below Linux's ephemeral range (32768-60999 by default), so a
/// client's outgoing connection cannot take a port between its pick and the server's bind.
const FREE_PORTS: std::ops::Range<u16> = 20_000..32_000;

/// `N` distinct ports that were free a moment ago on 127.0.0.1, drawn from [`FREE_PORTS`]
/// (tests start control planes in parallel: a port the kernel hands out for `:0` is one an
/// outgoing connection of another test may take before etcd binds it).
fn free_ports<const N: usize>() -> Result<[u16; N]> {
    use std::hash::{BuildHasher as _, RandomState};
    let seed = RandomState::new().hash_one(std::process::id());
    let span = u64::from(FREE_PORTS.end - FREE_PORTS.start);
    let mut held = Vec::with_capacity(N);
    for attempt in 0..(100 * N as u64) {
        let mixed = seed.wrapping_add(attempt.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let port = FREE_PORTS.start + u16::try_from(mixed % span).unwrap_or(0);
        if let Ok(listener) = TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
            held.push(listener);
            if held.len() == N {
                break;
            }
        }
    }
    let ports: Vec<u16> = held
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<std::io::Result<_>>()?;
    ports
        .try_into()
        .map_err(|_| anyhow::anyhow!("no {N} free ports in {FREE_PORTS:?} on 127.0.0.1"))
}

/// One request of the API server's audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRecord {
    /// The user (`system:serviceaccount:swimlb-system:swimlb-speaker`, `system:node:node1`).
    pub user: String,
    /// The verb (`get`, `list`, `watch`, `create`, `patch`, `update`, `delete`).
    pub verb: String,
    /// The resource's API group (empty for the core group).
    pub group: String,
    /// The resource (`pods`, `servicel2statuses`), with `/subresource` when there is one.
    pub resource: String,
    /// The object's namespace, empty for cluster-scoped objects and collections.
    pub namespace: String,
    /// The object's name, empty for collections.
    pub name: String,
    /// The HTTP status of the answer (0 when the log has none).
    pub code: u16,
}

impl AuditRecord {
    fn from_event(event: &Value) -> AuditRecord {
        let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let object = &event["objectRef"];
        let mut resource = s(&object["resource"]);
        if let Some(sub) = object["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        AuditRecord {
            user: s(&event["user"]["username"]),
            verb: s(&event["verb"]),
            group: s(&object["apiGroup"]),
            resource,
            namespace: s(&object["namespace"]),
            name: s(&object["name"]),
            code: event["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
        }
    }
}

/// `openssl req` arguments for a new P-256 key, unencrypted.
const NEW_EC_KEY: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

/// The cluster's certificates and keys, made with `openssl` in a folder.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    /// A CA; the API server's serving certificate for `api_ip`, the `kubernetes` Service's
    /// cluster IP and names, and 127.0.0.1; client certificates for the administrator, the
    /// controller manager, the scheduler and the kubelets of `nodes`; the ServiceAccount key.
    fn create(dir: &Path, api_ip: IpAddr, nodes: &[String]) -> Result<Pki> {
        let pki = Pki {
            dir: dir.to_path_buf(),
        };
        pki.openssl(
            &[
                &["req", "-x509", "-new"][..],
                &NEW_EC_KEY,
                &["-keyout", "ca.key", "-out", "ca.crt", "-days", "3650"],
                &["-subj", "/CN=swimlb-lab-ca"],
            ]
            .concat(),
        )?;
        let sans = format!(
            "subjectAltName=IP:{api_ip},IP:{KUBERNETES_SERVICE_IP},IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\n"
        );
        pki.leaf("apiserver", "/CN=kube-apiserver", &sans)?;
        let client = "extendedKeyUsage=clientAuth\n";
        pki.leaf("admin", "/O=system:masters/CN=admin", client)?;
        pki.leaf(
            "controller-manager",
            "/CN=system:kube-controller-manager",
            client,
        )?;
        pki.leaf("scheduler", "/CN=system:kube-scheduler", client)?;
        for node in nodes {
            pki.leaf(
                &format!("kubelet-{node}"),
                &format!("/O=system:nodes/CN=system:node:{node}"),
                client,
            )?;
        }
        pki.openssl(&[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            "sa.key",
        ])?;
        pki.openssl(&["pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub"])?;
        Ok(pki)
    }

    /// A key and a certificate signed by the CA, `name.key` and `name.crt`.
    fn leaf(&self, name: &str, subject: &str, extensions: &str) -> Result<()> {
        let ext = format!("{name}.ext");
        std::fs::write(self.dir.join(&ext), extensions)?;
        let (key, csr, crt) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
        );
        self.openssl(
            &[
                &["req", "-new"][..],
                &NEW_EC_KEY,
                &["-keyout", &key, "-out", &csr, "-subj", subject],
            ]
            .concat(),
        )?;
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "365",
            "-extfile",
            &ext,
        ])
    }

    fn openssl(&self, args: &[&str]) -> Result<()> {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .output()
            .context("running openssl (Debian package openssl)")?;
        if !out.status.success() {
            bail!(
                "openssl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// A kubeconfig for `server` with the client certificate `user.crt`.
    fn write_kubeconfig(&self, path: &Path, server: &str, user: &str) -> Result<()> {
        let d = |f: &str| self.dir.join(f).display().to_string();
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n  - name: lab\n    cluster:\n      server: {server}\n      certificate-authority: {ca}\nusers:\n  - name: {user}\n    user:\n      client-certificate: {crt}\n      client-key: {key}\ncontexts:\n  - name: lab\n    context: {{cluster: lab, user: {user}}}\ncurrent-context: lab\n",
            ca = d("ca.crt"),
            crt = d(&format!("{user}.crt")),
            key = d(&format!("{user}.key")),
        );
        std::fs::write(path, text)?;
        Ok(())
    }
}

/// The cluster's PKI in `dir`, a kubeconfig for each component and node (the API server at
/// `api_addr`), and the audit policy.
fn write_files(dir: &Path, api_addr: SocketAddr, nodes: &[String]) -> Result<()> {
    let pki = Pki::create(dir, api_addr.ip(), nodes)?;
    let server = format!("https://{api_addr}");
    for (name, user) in [
        ("admin", "admin"),
        ("controller-manager", "controller-manager"),
        ("scheduler", "scheduler"),
    ] {
        pki.write_kubeconfig(&dir.join(format!("{name}.kubeconfig")), &server, user)?;
    }
    for node in nodes {
        pki.write_kubeconfig(
            &dir.join(format!("kubelet-{node}.kubeconfig")),
            &server,
            &format!("kubelet-{node}"),
        )?;
    }
    std::fs::write(
        dir.join("audit-policy.yaml"),
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n  - level: Metadata\n",
    )?;
    Ok(())
}

/// Every component's command line, by component.
fn component_args(
    dir: &Path,
    network: &Network,
    api_addr: SocketAddr,
    (etcd_port, etcd_peer_port): (u16, u16),
    options: &Options,
) -> BTreeMap<Component, Vec<String>> {
    let d = |f: &str| dir.join(f).display().to_string();
    let etcd_url = format!("http://127.0.0.1:{etcd_port}");
    let mut args = BTreeMap::new();
    args.insert(
        Component::Etcd,
        vec![
            "--name=lab".into(),
            format!("--data-dir={}", d("etcd")),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer_port}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer_port}"),
            format!("--initial-cluster=lab=http://127.0.0.1:{etcd_peer_port}"),
            "--log-level=warn".into(),
        ],
    );
    args.insert(
        Component::ApiServer,
        apiserver_args(dir, network, api_addr, &etcd_url, options),
    );
    args.insert(
        Component::ControllerManager,
        vec![
            format!("--kubeconfig={}", d("controller-manager.kubeconfig")),
            format!(
                "--authentication-kubeconfig={}",
                d("controller-manager.kubeconfig")
            ),
            format!(
                "--authorization-kubeconfig={}",
                d("controller-manager.kubeconfig")
            ),
            format!("--service-account-private-key-file={}", d("sa.key")),
            format!("--root-ca-file={}", d("ca.crt")),
            format!("--cluster-signing-cert-file={}", d("ca.crt")),
            format!("--cluster-signing-key-file={}", d("ca.key")),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            "--use-service-account-credentials=true".into(),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
            "--profiling=false".into(),
        ],
    );
    args.insert(
        Component::Scheduler,
        vec![
            format!("--kubeconfig={}", d("scheduler.kubeconfig")),
            format!("--authentication-kubeconfig={}", d("scheduler.kubeconfig")),
            format!("--authorization-kubeconfig={}", d("scheduler.kubeconfig")),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
            "--profiling=false".into(),
        ],
    );
    args
}

/// The API server's command line: etcd at `etcd_url`, serving on `api_addr`, with RBAC, the
/// node authorizer and an audit log.
fn apiserver_args(
    dir: &Path,
    network: &Network,
    api_addr: SocketAddr,
    etcd_url: &str,
    options: &Options,
) -> Vec<String> {
    let d = |f: &str| dir.join(f).display().to_string();
    let mut api = vec![
        format!("--etcd-servers={etcd_url}"),
        format!("--bind-address={}", api_addr.ip()),
        format!("--advertise-address={}", api_addr.ip()),
        format!("--secure-port={}", api_addr.port()),
        format!("--cert-dir={}", d("apiserver-certs")),
        format!("--tls-cert-file={}", d("apiserver.crt")),
        format!("--tls-private-key-file={}", d("apiserver.key")),
        format!("--client-ca-file={}", d("ca.crt")),
        format!("--service-account-key-file={}", d("sa.pub")),
        format!("--service-account-signing-key-file={}", d("sa.key")),
        "--service-account-issuer=https://kubernetes.default.svc".into(),
        "--api-audiences=https://kubernetes.default.svc".into(),
        "--authorization-mode=Node,RBAC".into(),
        "--enable-admission-plugins=NodeRestriction".into(),
        format!("--service-cluster-ip-range={SERVICE_CIDR}"),
        "--allow-privileged=true".into(),
        format!("--audit-policy-file={}", d("audit-policy.yaml")),
        format!("--audit-log-path={}", d("audit.log")),
        "--audit-log-format=json".into(),
        "--profiling=false".into(),
        // To a kubelet (`kubectl logs`, `exec`), as kubeadm sets it up: at the Node's InternalIP
        // (the lab has no DNS for node names), with a client certificate of the cluster's CA in
        // `system:masters` (kubeadm's `apiserver-kubelet-client` is one too).
        "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
        format!("--kubelet-client-certificate={}", d("admin.crt")),
        format!("--kubelet-client-key={}", d("admin.key")),
    ];
    if *network == Network::Loopback {
        // The `kubernetes` Service's endpoint may not be a loopback address; on the
        // loopback no Pod would reach it anyway.
        api.push("--endpoint-reconciler-type=none".into());
    }
    if let Some(every) = options.compaction_interval {
        api.push(format!(
            "--etcd-compaction-interval={}s",
            every.as_secs().max(1)
        ));
    }
    api
}

/// The folder a build script of the lab prints: `$var` when set (`test.sh` sets it), else what
/// `script` prints (it builds once, then finds its cache).
pub fn built_dir(var: &str, script: &Path) -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(var) {
        return Ok(PathBuf::from(dir));
    }
    let out = Command::new("bash")
        .arg(script)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({})", script.display(), out.status);
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_below_the_ephemeral_range_and_bindable() {
        let ports = free_ports::<3>().unwrap();
        let distinct: std::collections::BTreeSet<u16> = ports.into_iter().collect();
        assert_eq!(distinct.len(), 3, "{ports:?}");
        for port in ports {
            assert!(FREE_PORTS.contains(&port), "{port}");
            TcpListener::bind((Ipv4Addr::LOCALHOST, port)).unwrap();
        }
    }
}
