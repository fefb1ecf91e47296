//! The real controller binary (`swimlb-lab controller ...`, the same entry point as
//! `swimlb-controller`) run as a process against the real control plane
//! (`swimlb_e2e::control_plane`, on the loopback: no root needed) through a kubeconfig, with
//! swimlb's CRDs installed by the pinned `kubectl apply --server-side`.
//!
//! Real time and real sockets; every wait is bounded ([`WAIT`]) so a broken controller fails a
//! test instead of hanging it, and no test asserts on speed. The `#[ignore]`d `measure_*` tests print figures (time to assign,
//! controller RSS) and never fail on them; they fail only when a Service is left without an
//! address or two share one.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use swimlb_config::crd::IPAddressPool;
use swimlb_control_plane::test_plane::TestPlane;
use swimlb_e2e::control_plane::AuditRecord;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

const WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);

async fn bounded<F: std::future::Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(WAIT, f).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// Polls `check` until it returns `Some`, within [`WAIT`].
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    bounded(what, async {
        loop {
            if let Some(v) = check().await {
                return v;
            }
            tokio::time::sleep(POLL).await;
        }
    })
    .await
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

/// One controller process.
struct Controller {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Controller {
    fn start(api: &TestPlane, identity: &str) -> Self {
        Self::start_with_kubeconfig(&api.admin_kubeconfig(), identity)
    }

    /// Started as user `identity` (a client certificate), so the API server's audit log
    /// ([`TestPlane::requests`]) tells this replica's requests apart.
    fn start_as_user(api: &TestPlane, identity: &str) -> Self {
        let kubeconfig = api
            .user_kubeconfig(identity)
            .expect("a kubeconfig for the replica");
        Self::start_with_kubeconfig(&kubeconfig, identity)
    }

    fn start_with_kubeconfig(kubeconfig: &std::path::Path, identity: &str) -> Self {
        let port = free_port();
        let log = std::env::temp_dir().join(format!(
            "swimlb-controller-test-{}-{identity}-{port}.log",
            std::process::id()
        ));
        let file = std::fs::File::create(&log).expect("log file");
        // SWIMLB_TEST_CONTROLLER_WRAPPER runs the controller under a profiler (e.g.
        // "heaptrack -o /tmp/ctl"); its figures are then the wrapper's.
        let wrapper = std::env::var("SWIMLB_TEST_CONTROLLER_WRAPPER").unwrap_or_default();
        let mut words = wrapper.split_whitespace();
        let mut command = match words.next() {
            Some(program) => {
                let mut c = Command::new(program);
                c.args(words).arg(env!("CARGO_BIN_EXE_swimlb-lab"));
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_swimlb-lab")),
        };
        let child = command
            .arg("controller")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--lease-namespace", "default", "--lease-duration", "3"])
            .args(["--identity", identity])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .env(
                "RUST_LOG",
                std::env::var("SWIMLB_TEST_CONTROLLER_LOG")
                    .unwrap_or_else(|_| "info,swimlb_controller=debug".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .expect("swimlb-lab controller starts");
        Self { child, port, log }
    }

    fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// SIGTERM, then the exit code.
    async fn terminate(mut self) -> Option<i32> {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .await
            .expect("kill runs");
        assert!(status.success());
        let exit = bounded("the controller to exit", self.child.wait())
            .await
            .expect("wait");
        exit.code()
    }

    /// `GET path` on the controller's HTTP port: (status line, body).
    async fn get(&self, path: &str) -> Option<(String, String)> {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .ok()?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(req.as_bytes()).await.ok()?;
        let mut out = String::new();
        stream.read_to_string(&mut out).await.ok()?;
        let (head, body) = out.split_once("\r\n\r\n")?;
        Some((head.lines().next()?.to_string(), body.to_string()))
    }

    fn rss_kib(&self) -> Option<u64> {
        self.status_kib("VmRSS:")
    }

    /// The peak resident memory so far.
    fn peak_rss_kib(&self) -> Option<u64> {
        self.status_kib("VmHWM:")
    }

    /// A `/proc/PID/status` field in KiB.
    fn status_kib(&self, field: &str) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    /// User plus system CPU seconds, from `/proc/PID/stat` (clock ticks of 100 Hz).
    fn cpu_seconds(&self) -> Option<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).ok()?;
        let after = stat.rsplit_once(')')?.1;
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks: u64 =
            fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        Some(ticks as f64 / 100.0)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Controller {
    /// Keeps the log only when the test fails.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("controller log: {}", self.log.display());
        } else {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

/// One test's control plane, with swimlb's CRDs and namespace `swimlb-system`; the admin's
/// client.
async fn lab() -> (TestPlane, Client) {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let api = TestPlane::start_async(&format!("ctl-{n}")).await;
    api.create_namespace("swimlb-system")
        .expect("namespace swimlb-system");
    let client = api.client().await;
    (api, client)
}

async fn create_pool(client: &Client, name: &str, spec: Value) {
    create_pool_in(client, "swimlb-system", name, spec).await;
}

/// A pool in `namespace` (the controller reads only swimlb-system's).
async fn create_pool_in(client: &Client, namespace: &str, name: &str, spec: Value) {
    let pools: Api<IPAddressPool> = Api::namespaced(client.clone(), namespace);
    let pool: IPAddressPool = serde_json::from_value(json!({
        "apiVersion": "swimlb.io/v1beta1", "kind": "IPAddressPool",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }))
    .expect("valid pool");
    pools
        .create(&PostParams::default(), &pool)
        .await
        .expect("pool created");
}

fn service(name: &str, annotations: Value, spec: Value) -> Service {
    let mut full =
        json!({"type": "LoadBalancer", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]});
    if let (Some(full), Some(extra)) = (full.as_object_mut(), spec.as_object()) {
        full.extend(extra.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": full,
    }))
    .expect("valid service")
}

async fn create_service(client: &Client, svc: &Service) {
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    services
        .create(&PostParams::default(), svc)
        .await
        .expect("service created");
}

fn ingress(svc: &Service) -> Vec<String> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.clone())
        .collect()
}

async fn ips_of(client: &Client, name: &str) -> Vec<String> {
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    services
        .get(name)
        .await
        .map(|s| ingress(&s))
        .unwrap_or_default()
}

async fn wait_assigned(client: &Client, name: &str) -> Vec<String> {
    eventually(&format!("{name} to get an address"), || async {
        let ips = ips_of(client, name).await;
        (!ips.is_empty()).then_some(ips)
    })
    .await
}

async fn events(client: &Client, namespace: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

/// Waits for an Event of `reason` about the object `name`; returns its note.
async fn wait_event(client: &Client, namespace: &str, name: &str, reason: &str) -> String {
    eventually(&format!("a {reason} Event on {name}"), || async {
        events(client, namespace).await.into_iter().find_map(|e| {
            let about = e.regarding.as_ref()?.name.as_deref()? == name;
            (about && e.reason.as_deref() == Some(reason)).then(|| e.note.unwrap_or_default())
        })
    })
    .await
}

async fn lease_holder(client: &Client) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    leases
        .get("swimlb-controller")
        .await
        .ok()?
        .spec?
        .holder_identity
}

mod assignment;
mod cli;
mod leadership;
mod namespaces;
mod scale;
