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

#[tokio::test]
async fn pools_and_services_go_in_and_addresses_events_pool_status_and_metrics_come_out() {
    let (api, client) = lab().await;
    create_pool(&client, "lab", json!({"addresses": ["192.0.2.8/29"]})).await;
    let ctl = Controller::start(&api, "c-0");
    for name in ["web", "api", "db"] {
        create_service(&client, &service(name, json!({}), json!({}))).await;
    }
    let mut seen = BTreeSet::new();
    for name in ["web", "api", "db"] {
        let ips = wait_assigned(&client, name).await;
        assert_eq!(ips.len(), 1, "{name}: {ips:?}");
        assert!(ips[0].starts_with("192.0.2."), "{ips:?}");
        let last: u8 = ips[0].rsplit('.').next().unwrap().parse().unwrap();
        assert!((8..16).contains(&last), "{ips:?} outside the pool");
        assert!(seen.insert(ips[0].clone()), "{} handed out twice", ips[0]);
        let note = wait_event(&client, "default", name, "IPAllocated").await;
        assert!(note.contains(&ips[0]) && note.contains("lab"), "{note}");
    }
    let pools: Api<IPAddressPool> = Api::namespaced(client.clone(), "swimlb-system");
    eventually("the pool status to count 3 assigned", || async {
        let status = pools.get("lab").await.ok()?.status?;
        (status.assigned_ipv4 == 3 && status.available_ipv4 == 5).then_some(())
    })
    .await;
    let (line, body) = eventually("/metrics", || ctl.get("/metrics")).await;
    assert!(line.contains("200"), "{line}");
    assert!(
        body.contains("swimlb_pool_addresses_in_use{pool=\"lab\",family=\"ipv4\"} 3"),
        "{body}"
    );
    let (line, _) = eventually("/readyz", || ctl.get("/readyz")).await;
    assert!(line.contains("200"), "{line}");

    // A deleted Service releases its address; the pool status follows.
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    services
        .delete("web", &DeleteParams::default())
        .await
        .expect("deleted");
    eventually("the pool status to count 2 assigned", || async {
        let status = pools.get("lab").await.ok()?.status?;
        (status.assigned_ipv4 == 2).then_some(())
    })
    .await;
    assert_eq!(ctl.terminate().await, Some(0), "a clean exit on SIGTERM");
}

#[tokio::test]
async fn the_leader_creates_the_gossip_key_secret_once_and_never_changes_it() {
    let (api, client) = lab().await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), "default");
    let first = Controller::start(&api, "c-0");
    let secret = eventually("the gossip key Secret", || async {
        secrets.get_opt("swimlb-gossip-key").await.ok().flatten()
    })
    .await;
    let keys = secret
        .data
        .as_ref()
        .and_then(|d| d.get("keys"))
        .map(|b| String::from_utf8(b.0.clone()).unwrap())
        .expect("the key file");
    assert_eq!(
        swimlb_config::keyfile::parse_key_file(&keys).map(|k| k.len()),
        Ok(1),
        "one key in the speakers' key file format: {keys:?}"
    );
    let version = secret.metadata.resource_version.clone();
    assert_eq!(first.terminate().await, Some(0));
    // A new leader finds it and leaves it alone (rotation is the operator's).
    let second = Controller::start(&api, "c-1");
    eventually("the second leader", || async {
        (lease_holder(&client).await.as_deref() == Some("c-1")).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let again = secrets.get("swimlb-gossip-key").await.unwrap();
    assert_eq!(
        again.metadata.resource_version,
        version,
        "{}",
        second.log_text()
    );
    assert_eq!(second.terminate().await, Some(0));
}

#[tokio::test]
async fn a_restart_keeps_every_address_and_a_service_created_meanwhile_gets_a_free_one() {
    let (api, client) = lab().await;
    create_pool(&client, "lab", json!({"addresses": ["192.0.2.16/29"]})).await;
    let first = Controller::start(&api, "c-0");
    let names = ["m1", "m2", "m3", "m4"];
    for name in names {
        create_service(&client, &service(name, json!({}), json!({}))).await;
    }
    let mut before = Vec::new();
    for name in names {
        before.push(wait_assigned(&client, name).await);
    }
    assert_eq!(first.terminate().await, Some(0));
    // Created while no controller runs; sorts before the others, so a controller that assigned
    // before loading the existing statuses would hand it the lowest address, already in use.
    create_service(&client, &service("a-late", json!({}), json!({}))).await;
    let second = Controller::start(&api, "c-1");
    let late = wait_assigned(&client, "a-late").await;
    let mut after = Vec::new();
    for name in names {
        after.push(ips_of(&client, name).await);
    }
    assert_eq!(before, after, "every address survives the restart");
    assert!(
        !after.iter().flatten().any(|ip| late.contains(ip)),
        "{late:?} is already held: {after:?}\n{}",
        second.log_text()
    );
    assert_eq!(second.terminate().await, Some(0));
}

#[tokio::test]
async fn a_restart_while_a_pool_is_invalid_keeps_the_addresses_of_its_services() {
    let (api, client) = lab().await;
    create_pool(&client, "a", json!({"addresses": ["192.0.2.112/31"]})).await;
    create_pool(&client, "b", json!({"addresses": ["192.0.2.120/30"]})).await;
    let first = Controller::start(&api, "c-0");
    // n1 and n2 fill pool a, n3 gets b's first address, pinned names pool b.
    let names = ["n1", "n2", "n3", "pinned"];
    for name in names {
        let annotations = if name == "pinned" {
            json!({"swimlb.io/address-pool": "b"})
        } else {
            json!({})
        };
        create_service(&client, &service(name, annotations, json!({}))).await;
        wait_assigned(&client, name).await;
    }
    let mut before = Vec::new();
    for name in names {
        before.push(ips_of(&client, name).await);
    }
    assert_eq!(before[2], vec!["192.0.2.120"], "{before:?}");
    assert_eq!(first.terminate().await, Some(0));

    // While no controller runs, pool b is made to overlap a: rejected at the next start.
    let pools: Api<IPAddressPool> = Api::namespaced(client.clone(), "swimlb-system");
    pools
        .patch(
            "b",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"addresses": ["192.0.2.112/30"]}})),
        )
        .await
        .expect("pool b patched");
    let second = Controller::start(&api, "c-1");
    let note = wait_event(&client, "swimlb-system", "b", "InvalidConfiguration").await;
    assert!(note.contains("overlaps"), "{note}");
    for (name, ips) in names.iter().zip(&before).skip(2) {
        let note = wait_event(&client, "default", name, "AddressOutsidePools").await;
        assert!(note.contains(&ips[0]), "{name}: {note}");
    }
    eventually("a Valid=False condition on pool b", || async {
        let status = pools.get("b").await.ok()?.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Valid" && c.status == "False")
    })
    .await;
    // A Service created now cannot get an address: a is full and b is not in force.
    create_service(&client, &service("late", json!({}), json!({}))).await;
    let note = wait_event(&client, "default", "late", "AllocationFailed").await;
    assert!(note.contains("no free"), "{note}");
    let (_, body) = eventually("/metrics", || second.get("/metrics")).await;
    assert!(body.contains("swimlb_addresses_outside_pools 2"), "{body}");
    let mut after = Vec::new();
    for name in names {
        after.push(ips_of(&client, name).await);
    }
    assert_eq!(
        before,
        after,
        "a restart never changes an address\n{}",
        second.log_text()
    );

    // Pool b is repaired: its Services stay, and the new one gets b's next free address.
    pools
        .patch(
            "b",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"addresses": ["192.0.2.120/30"]}})),
        )
        .await
        .expect("pool b repaired");
    let late = wait_assigned(&client, "late").await;
    assert!(
        late[0].starts_with("192.0.2.12") && !before.iter().flatten().any(|ip| late.contains(ip)),
        "{late:?} vs {before:?}"
    );
    let mut repaired = Vec::new();
    for name in names {
        repaired.push(ips_of(&client, name).await);
    }
    assert_eq!(before, repaired);
    assert_eq!(second.terminate().await, Some(0));
}

#[tokio::test]
async fn exhaustion_and_bad_requests_produce_warning_events_and_no_address() {
    let (api, client) = lab().await;
    create_pool(&client, "one", json!({"addresses": ["192.0.2.40/32"]})).await;
    let ctl = Controller::start(&api, "c-0");
    create_service(&client, &service("first", json!({}), json!({}))).await;
    assert_eq!(wait_assigned(&client, "first").await, vec!["192.0.2.40"]);
    let bad = [
        service("second", json!({}), json!({})),
        service(
            "outside",
            json!({"swimlb.io/loadBalancerIPs": "203.0.113.5"}),
            json!({}),
        ),
        service(
            "taken",
            json!({"swimlb.io/loadBalancerIPs": "192.0.2.40"}),
            json!({}),
        ),
        service(
            "conflicting",
            json!({"swimlb.io/address-pool": "one", "metallb.io/address-pool": "other"}),
            json!({}),
        ),
        service(
            "unparsable",
            json!({"metallb.universe.tf/loadBalancerIPs": "192.0.2.x"}),
            json!({}),
        ),
    ];
    for svc in &bad {
        create_service(&client, svc).await;
    }
    // Each note names its cause.
    let causes: [&[&str]; 5] = [
        &["no free ipv4 address", "\"one\""],
        &["203.0.113.5", "not in any usable address pool"],
        &["192.0.2.40", "in use by default/first"],
        &[
            "swimlb.io/address-pool",
            "metallb.io/address-pool",
            "disagree",
        ],
        &["loadBalancerIPs", "192.0.2.x"],
    ];
    for (svc, cause) in bad.iter().zip(causes) {
        let name = svc.name_any();
        let note = wait_event(&client, "default", &name, "AllocationFailed").await;
        assert!(
            cause.iter().all(|c| note.contains(c)),
            "{name}: the Event names its cause {cause:?}: {note}"
        );
        assert!(
            ips_of(&client, &name).await.is_empty(),
            "{name} got an address\n{}",
            ctl.log_text()
        );
    }
    let (_, body) = eventually("/metrics", || ctl.get("/metrics")).await;
    for reason in [
        "pool_exhausted",
        "ip_not_in_pool",
        "ip_in_use",
        "conflicting_annotations",
    ] {
        assert!(
            body.contains(&format!(
                "swimlb_allocation_errors_total{{reason=\"{reason}\"}}"
            )),
            "{reason}: {body}"
        );
    }
    drop(ctl);
}

/// Issue 14: `/metrics`, read as curl reads it, passes `promtool check metrics` and exposes
/// exactly the controller metrics of the book's metrics reference (an exhausted pool gives the
/// error counter a series).
#[tokio::test]
async fn metrics_pass_promtool_and_are_the_metrics_reference() {
    use swimlb_e2e::metrics_doc;
    let (api, client) = lab().await;
    create_pool(&client, "one", json!({"addresses": ["192.0.2.40/32"]})).await;
    let ctl = Controller::start(&api, "c-0");
    create_service(&client, &service("first", json!({}), json!({}))).await;
    assert_eq!(wait_assigned(&client, "first").await, vec!["192.0.2.40"]);
    create_service(&client, &service("second", json!({}), json!({}))).await;
    wait_event(&client, "default", "second", "AllocationFailed").await;
    let (line, body) = eventually("/metrics with the allocation error", || async {
        let (line, body) = ctl.get("/metrics").await?;
        body.contains("swimlb_allocation_errors_total{")
            .then_some((line, body))
    })
    .await;
    assert!(line.contains("200"), "{line}");
    if let Err(e) = swimlb_e2e::promtool::check_metrics(&body) {
        panic!("{e}\n{body}");
    }
    let rows = metrics_doc::documented_rows().unwrap_or_else(|e| panic!("{e:#}"));
    if let Err(e) = metrics_doc::compare(&rows, "controller", &metrics_doc::families(&body)) {
        panic!(
            "the metrics reference ({}) and the controller's /metrics differ:\n{e}\n{body}",
            metrics_doc::PAGE
        );
    }
    drop(ctl);
}

#[tokio::test]
async fn services_with_the_same_sharing_key_share_an_address_and_others_may_not() {
    let (api, client) = lab().await;
    create_pool(&client, "lab", json!({"addresses": ["192.0.2.48/29"]})).await;
    let ctl = Controller::start(&api, "c-0");
    let shared = |name: &str, key: &str, port: i32| {
        service(
            name,
            json!({"swimlb.io/allow-shared-ip": key, "swimlb.io/loadBalancerIPs": "192.0.2.50"}),
            json!({"ports": [{"name": "p", "port": port, "protocol": "TCP"}]}),
        )
    };
    create_service(&client, &shared("dns-tcp", "k", 53)).await;
    create_service(&client, &shared("dns-web", "k", 80)).await;
    assert_eq!(wait_assigned(&client, "dns-tcp").await, vec!["192.0.2.50"]);
    assert_eq!(wait_assigned(&client, "dns-web").await, vec!["192.0.2.50"]);
    create_service(&client, &shared("intruder", "other", 443)).await;
    wait_event(&client, "default", "intruder", "AllocationFailed").await;
    assert!(ips_of(&client, "intruder").await.is_empty());
    drop(ctl);
}

#[tokio::test]
async fn a_dual_stack_service_gets_one_address_per_family() {
    let (api, client) = lab().await;
    create_pool(
        &client,
        "dual",
        json!({"addresses": ["192.0.2.64/30", "2001:db8::10-2001:db8::1f"]}),
    )
    .await;
    let ctl = Controller::start(&api, "c-0");
    create_service(
        &client,
        &service(
            "both",
            json!({}),
            json!({"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv4", "IPv6"]}),
        ),
    )
    .await;
    let ips = wait_assigned(&client, "both").await;
    assert_eq!(ips.len(), 2, "{ips:?}");
    assert!(ips.iter().any(|ip| ip.starts_with("192.0.2.")), "{ips:?}");
    assert!(ips.iter().any(|ip| ip.starts_with("2001:db8::")), "{ips:?}");
    create_service(
        &client,
        &service("v6", json!({}), json!({"ipFamilies": ["IPv6"]})),
    )
    .await;
    let v6 = wait_assigned(&client, "v6").await;
    assert_eq!(v6.len(), 1);
    assert!(v6[0].starts_with("2001:db8::"), "{v6:?}");
    drop(ctl);
}

#[tokio::test]
async fn an_invalid_pool_gets_a_warning_event_and_the_valid_configuration_stays_in_force() {
    let (api, client) = lab().await;
    create_pool(&client, "good", json!({"addresses": ["192.0.2.80/30"]})).await;
    let ctl = Controller::start(&api, "c-0");
    create_service(&client, &service("one", json!({}), json!({}))).await;
    wait_assigned(&client, "one").await;
    // Overlaps "good": rejected, and "good" keeps serving.
    create_pool(&client, "overlap", json!({"addresses": ["192.0.2.82/31"]})).await;
    let note = wait_event(&client, "swimlb-system", "overlap", "InvalidConfiguration").await;
    assert!(note.contains("overlaps"), "{note}");
    let pools: Api<IPAddressPool> = Api::namespaced(client.clone(), "swimlb-system");
    let condition = eventually("a Valid=False condition on the rejected pool", || async {
        let status = pools.get("overlap").await.ok()?.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Valid" && c.status == "False")
    })
    .await;
    assert_eq!(condition.reason, "InvalidConfiguration");
    assert!(
        condition.message.contains("overlaps"),
        "{}",
        condition.message
    );
    create_service(&client, &service("two", json!({}), json!({}))).await;
    let ips = wait_assigned(&client, "two").await;
    assert!(ips[0].starts_with("192.0.2.8"), "{ips:?}");
    drop(ctl);
}

/// The reasons of the Events written in `namespace`.
async fn reasons_in(client: &Client, namespace: &str) -> Vec<String> {
    events(client, namespace)
        .await
        .into_iter()
        .filter_map(|e| e.reason)
        .collect()
}

#[tokio::test]
async fn a_pool_in_another_namespace_hands_out_nothing_and_gets_a_warning_event() {
    let (api, client) = lab().await;
    api.create_namespace("a-team").expect("namespace a-team");
    create_pool_in(
        &client,
        "a-team",
        "cheap",
        json!({"addresses": ["198.51.100.0/30"]}),
    )
    .await;
    let ctl = Controller::start(&api, "c-0");
    create_service(&client, &service("web", json!({}), json!({}))).await;
    let note = wait_event(&client, "a-team", "cheap", "IgnoredOutsideNamespace").await;
    assert!(
        note.contains("cheap") && note.contains("swimlb-system"),
        "{note}"
    );
    // No pool in force: the Service waits with a Warning, and the pool elsewhere gets no status.
    let note = wait_event(&client, "default", "web", "AllocationFailed").await;
    assert!(!note.contains("198.51.100"), "{note}");
    assert_eq!(ips_of(&client, "web").await, Vec::<String>::new());
    let strays: Api<IPAddressPool> = Api::namespaced(client.clone(), "a-team");
    let stray = strays.get("cheap").await.expect("the pool elsewhere");
    assert!(stray.status.is_none(), "{:?}", stray.status);
    // A pool where the speakers read theirs serves it.
    create_pool(&client, "lab", json!({"addresses": ["192.0.2.48/30"]})).await;
    let ips = wait_assigned(&client, "web").await;
    assert!(ips[0].starts_with("192.0.2.4"), "{ips:?}");
    // The pool elsewhere is reported once, not at every change of it.
    strays
        .patch(
            "cheap",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await
        .expect("labelled");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let reported = reasons_in(&client, "a-team")
        .await
        .iter()
        .filter(|r| *r == "IgnoredOutsideNamespace")
        .count();
    assert_eq!(reported, 1, "{}", ctl.log_text());
    assert_eq!(ctl.terminate().await, Some(0));
}

#[tokio::test]
async fn an_overlapping_pool_in_a_namespace_that_sorts_first_does_not_reject_the_real_one() {
    let (api, client) = lab().await;
    api.create_namespace("a-team").expect("namespace a-team");
    create_pool_in(
        &client,
        "a-team",
        "a-lab",
        json!({"addresses": ["192.0.2.56/29"]}),
    )
    .await;
    create_pool(&client, "lab", json!({"addresses": ["192.0.2.60/30"]})).await;
    let ctl = Controller::start(&api, "c-0");
    create_service(&client, &service("web", json!({}), json!({}))).await;
    let ips = wait_assigned(&client, "web").await;
    let last: u8 = ips[0].rsplit('.').next().unwrap().parse().unwrap();
    assert!((60..64).contains(&last), "{ips:?} is not lab's");
    let pools: Api<IPAddressPool> = Api::namespaced(client.clone(), "swimlb-system");
    eventually("a Valid=True condition on the real pool", || async {
        let status = pools.get("lab").await.ok()?.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Valid" && c.status == "True")
    })
    .await;
    wait_event(&client, "a-team", "a-lab", "IgnoredOutsideNamespace").await;
    let reasons = reasons_in(&client, "swimlb-system").await;
    assert!(
        !reasons.iter().any(|r| r == "InvalidConfiguration"),
        "{reasons:?}\n{}",
        ctl.log_text()
    );
    assert_eq!(ctl.terminate().await, Some(0));
}

#[tokio::test]
async fn an_invalid_pool_in_another_namespace_does_not_freeze_pool_changes() {
    let (api, client) = lab().await;
    api.create_namespace("a-team").expect("namespace a-team");
    create_pool(&client, "first", json!({"addresses": ["192.0.2.64/32"]})).await;
    let ctl = Controller::start(&api, "c-0");
    create_service(&client, &service("one", json!({}), json!({}))).await;
    assert_eq!(wait_assigned(&client, "one").await, vec!["192.0.2.64"]);
    // The API server accepts a backwards range; swimlb would refuse it, were it read.
    create_pool_in(
        &client,
        "a-team",
        "broken",
        json!({"addresses": ["192.0.2.9-192.0.2.8"]}),
    )
    .await;
    wait_event(&client, "a-team", "broken", "IgnoredOutsideNamespace").await;
    // A pool change in swimlb-system after it still comes into force.
    create_pool(&client, "second", json!({"addresses": ["192.0.2.72/32"]})).await;
    create_service(&client, &service("two", json!({}), json!({}))).await;
    assert_eq!(
        wait_assigned(&client, "two").await,
        vec!["192.0.2.72"],
        "{}",
        ctl.log_text()
    );
    let reasons = reasons_in(&client, "a-team").await;
    assert!(
        !reasons.iter().any(|r| r == "InvalidConfiguration"),
        "{reasons:?}"
    );
    assert_eq!(ctl.terminate().await, Some(0));
}

#[tokio::test]
async fn of_two_replicas_only_the_leader_writes_and_the_standby_takes_over_on_sigterm() {
    let (api, client) = lab().await;
    create_pool(&client, "lab", json!({"addresses": ["192.0.2.96/29"]})).await;
    let a = Controller::start_as_user(&api, "replica-a");
    eventually("replica-a to hold the lease", || async {
        (lease_holder(&client).await.as_deref() == Some("replica-a")).then_some(())
    })
    .await;
    let b = Controller::start_as_user(&api, "replica-b");
    let (line, body) = eventually("the standby's /readyz", || b.get("/readyz")).await;
    assert!(
        line.contains("200") && body.contains("standby"),
        "{line} {body}"
    );
    for name in ["s1", "s2"] {
        create_service(&client, &service(name, json!({}), json!({}))).await;
        wait_assigned(&client, name).await;
    }
    let instances = |events: Vec<Event>| -> BTreeSet<String> {
        events
            .into_iter()
            .filter_map(|e| e.reporting_instance)
            .collect()
    };
    assert_eq!(
        instances(events(&client, "default").await),
        BTreeSet::from(["replica-a".to_string()]),
        "only the leader publishes"
    );
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let managers: BTreeSet<String> = services
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .iter()
        .flat_map(|s| s.managed_fields().iter().filter_map(|m| m.manager.clone()))
        .collect();
    assert!(managers.contains("swimlb-controller"), "{managers:?}");
    // Both replicas write with the same field manager: the audit log tells them apart.
    let by = |user: &str| -> Vec<AuditRecord> {
        api.requests()
            .into_iter()
            .filter(|r| r.user == user)
            .collect()
    };
    let is_write =
        |r: &AuditRecord| matches!(r.verb.as_str(), "create" | "update" | "patch" | "delete");
    let standby = by("replica-b");
    assert!(
        standby.iter().any(|r| r.resource == "leases"),
        "the standby tries the Lease: {standby:?}"
    );
    let beyond_lease: Vec<&AuditRecord> =
        standby.iter().filter(|r| r.resource != "leases").collect();
    assert!(
        beyond_lease.is_empty(),
        "the standby touched nothing but its Lease: {beyond_lease:?}"
    );
    assert!(
        by("replica-a")
            .iter()
            .any(|r| is_write(r) && r.resource == "services/status" && r.name == "s1"),
        "the leader's writes are seen"
    );

    assert_eq!(a.terminate().await, Some(0));
    eventually("replica-b to take the lease", || async {
        (lease_holder(&client).await.as_deref() == Some("replica-b")).then_some(())
    })
    .await;
    create_service(&client, &service("s3", json!({}), json!({}))).await;
    let s3 = wait_assigned(&client, "s3").await;
    let held: Vec<String> = [ips_of(&client, "s1").await, ips_of(&client, "s2").await].concat();
    assert!(!held.iter().any(|ip| s3.contains(ip)), "{s3:?} vs {held:?}");
    let note = wait_event(&client, "default", "s3", "IPAllocated").await;
    assert!(note.contains(&s3[0]), "{note}");
    assert!(
        instances(events(&client, "default").await).contains("replica-b"),
        "the new leader publishes\n{}",
        b.log_text()
    );
    assert!(
        by("replica-b")
            .iter()
            .any(|r| is_write(r) && r.resource == "services/status" && r.name == "s3"),
        "the new leader writes under its own name"
    );
    drop(b);
}

#[tokio::test]
async fn an_ingress_written_by_another_field_manager_is_taken_back_by_the_controller() {
    let (api, client) = lab().await;
    create_pool(&client, "lab", json!({"addresses": ["192.0.2.24/30"]})).await;
    let ctl = Controller::start(&api, "ssa");
    create_service(&client, &service("web", json!({}), json!({}))).await;
    let ips = wait_assigned(&client, "web").await;
    // Another load balancer implementation server-side applies its own address, forcing the
    // field away from the controller (a conflict the real API server arbitrates).
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let foreign = if ips[0] == "192.0.2.27" {
        "192.0.2.26"
    } else {
        "192.0.2.27"
    };
    let status = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "status": {"loadBalancer": {"ingress": [{"ip": foreign}]}}});
    services
        .patch_status(
            "web",
            &PatchParams::apply("other-lb").force(),
            &Patch::Apply(&status),
        )
        .await
        .expect("the other manager's apply");
    eventually("the controller to write its address back", || async {
        (ips_of(&client, "web").await == ips).then_some(())
    })
    .await;
    let web = services.get("web").await.expect("web");
    let owners: Vec<String> = web
        .managed_fields()
        .iter()
        .filter(|m| m.subresource.as_deref() == Some("status"))
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.pointer("/f:status/f:loadBalancer/f:ingress").is_some())
        })
        .filter_map(|m| m.manager.clone())
        .collect();
    assert_eq!(
        owners,
        vec!["swimlb-controller".to_string()],
        "the controller owns the ingress again\n{}",
        ctl.log_text()
    );
    drop(ctl);
}

#[tokio::test]
async fn a_service_gets_an_address_once_its_namespace_gets_the_label_a_pool_selects() {
    let (api, client) = lab().await;
    api.admin()
        .create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}))
        .expect("namespace team-a");
    create_pool(
        &client,
        "team",
        json!({
            "addresses": ["192.0.2.112/29"],
            "serviceAllocation": {"namespaceSelectors": [{"matchLabels": {"team": "a"}}]},
        }),
    )
    .await;
    let ctl = Controller::start(&api, "c-0");
    let mut svc = service("web", json!({}), json!({}));
    svc.metadata.namespace = Some("team-a".into());
    let services: Api<Service> = Api::namespaced(client.clone(), "team-a");
    services
        .create(&PostParams::default(), &svc)
        .await
        .expect("service created");
    // Not served yet: the pool only serves namespaces labelled team=a.
    wait_event(&client, "team-a", "web", "AllocationFailed").await;
    let ips = |svc: Option<Service>| svc.map(|s| ingress(&s)).unwrap_or_default();
    assert!(
        ips(services.get("web").await.ok()).is_empty(),
        "an address before the label"
    );
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .patch(
            "team-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}})),
        )
        .await
        .expect("namespace labelled");
    // The retry of an unassigned Service comes only after a minute, longer than WAIT: the
    // address must come from the label change itself.
    let got = eventually("web to get an address after the label", || async {
        let got = ips(services.get("web").await.ok());
        (!got.is_empty()).then_some(got)
    })
    .await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].starts_with("192.0.2.11"), "{got:?} outside the pool");
    assert_eq!(ctl.terminate().await, Some(0));
}

/// How the measured Services come in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arrival {
    /// Seeded into the store before the controller starts: measures the controller's throughput
    /// (start, list, load, assign and write every status).
    BeforeStart,
    /// POSTed through the API, 50 at a time, while the controller runs.
    Posted,
}

/// An IPv6 LoadBalancer Service without nodePorts (a cluster's 2,768 nodePorts would not reach
/// 10,000 Services).
fn bench_service(i: usize) -> Service {
    service(
        &format!("svc-{i:05}"),
        json!({}),
        json!({"ipFamilies": ["IPv6"], "allocateLoadBalancerNodePorts": false}),
    )
}

/// Every Service of the `default` namespace, as JSON.
/// The LoadBalancer Services of `default` (the API server's own `kubernetes` Service is not one).
async fn all_services(client: &Client) -> Vec<Value> {
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    services
        .list(&ListParams::default())
        .await
        .expect("list Services")
        .items
        .into_iter()
        .filter(|s| s.spec.as_ref().and_then(|spec| spec.type_.as_deref()) == Some("LoadBalancer"))
        .map(|s| serde_json::to_value(s).expect("json"))
        .collect()
}

fn own_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|x| x.1).unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let tick = |n: usize| {
        fields
            .get(n)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (tick(11) + tick(12)) as f64 / 100.0
}

/// Creates `count` IPv6 Services, runs one controller and prints how long until every one has
/// an address, the controller's RSS and CPU time, and the CPU time of this process. Prints;
/// never fails on a figure.
async fn measure(count: usize, arrival: Arrival) {
    let (api, client) = lab().await;
    create_pool(&client, "big", json!({"addresses": ["2001:db8:1::/112"]})).await;
    let seed_start = tokio::time::Instant::now();
    if arrival == Arrival::BeforeStart {
        for i in 0..count {
            create_service(&client, &bench_service(i)).await;
        }
    }
    let seeded = seed_start.elapsed();
    let cpu_before = own_cpu_seconds();
    let start = tokio::time::Instant::now();
    let ctl = Controller::start(&api, "bench");
    if arrival == Arrival::Posted {
        eventually("the controller to be ready", || async {
            let (line, _) = ctl.get("/readyz").await?;
            line.contains("200").then_some(())
        })
        .await;
    }
    let rss_before = ctl.rss_kib();
    let posting = tokio::time::Instant::now();
    if arrival == Arrival::Posted {
        let indexes: Vec<usize> = (0..count).collect();
        for chunk in indexes.chunks(50) {
            let mut tasks = Vec::new();
            for &i in chunk {
                let client = client.clone();
                tasks.push(tokio::spawn(async move {
                    create_service(&client, &bench_service(i)).await;
                }));
            }
            for t in tasks {
                t.await.expect("create task");
            }
        }
    }
    let posted = posting.elapsed();
    let done = tokio::time::timeout(Duration::from_secs(900), async {
        loop {
            let assigned = all_services(&client)
                .await
                .iter()
                .filter(|s| s.pointer("/status/loadBalancer/ingress/0/ip").is_some())
                .count();
            if assigned == count {
                break;
            }
            // Each poll lists every Service: not too often.
            let pause = if count > 1_000 { 1_000 } else { 250 };
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    })
    .await;
    let elapsed = start.elapsed();
    let cpu_api = own_cpu_seconds() - cpu_before;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let services: Vec<Value> = all_services(&client).await;
    let distinct: BTreeSet<&str> = services
        .iter()
        .filter_map(|s| s.pointer("/status/loadBalancer/ingress/0/ip")?.as_str())
        .collect();
    println!(
        "{count} Services, {arrival:?} (seeding {:.2} s, posting {:.2} s): all assigned: {} ({} distinct addresses) {:.2} s after the controller started; controller RSS {} KiB before, {} KiB after (peak {} KiB), CPU {:.2} s; test process CPU {:.2} s",
        seeded.as_secs_f64(),
        posted.as_secs_f64(),
        done.is_ok(),
        distinct.len(),
        elapsed.as_secs_f64(),
        rss_before.unwrap_or(0),
        ctl.rss_kib().unwrap_or(0),
        ctl.peak_rss_kib().unwrap_or(0),
        ctl.cpu_seconds().unwrap_or(0.0),
        cpu_api,
    );
    // Counts only, never a time: every Service has an address, and no two share one.
    let assigned = services
        .iter()
        .filter(|s| s.pointer("/status/loadBalancer/ingress/0/ip").is_some())
        .count();
    assert_eq!(
        (services.len(), assigned, distinct.len()),
        (count, count, count),
        "(Services, assigned, distinct addresses)\n{}",
        ctl.log_text()
    );
    drop(ctl);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: prints time to assign 1,000 existing Services and the controller's RSS"]
async fn measure_one_thousand_services() {
    measure(1_000, Arrival::BeforeStart).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: prints time to assign 1,000 POSTed Services and the controller's RSS"]
async fn measure_one_thousand_services_posted_through_the_api() {
    measure(1_000, Arrival::Posted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: prints time to assign 10,000 existing Services and the controller's RSS"]
async fn measure_ten_thousand_services() {
    // SWIMLB_MEASURE_SERVICES overrides the count.
    let count = std::env::var("SWIMLB_MEASURE_SERVICES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    measure(count, Arrival::BeforeStart).await;
}

#[tokio::test]
async fn a_bad_flag_exits_64_and_an_unreadable_kubeconfig_exits_69() {
    let run = |args: &'static [&'static str]| async move {
        Command::new(env!("CARGO_BIN_EXE_swimlb-lab"))
            .arg("controller")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await
            .expect("runs")
            .code()
    };
    assert_eq!(
        bounded("a bad flag", run(&["--no-such-flag"])).await,
        Some(64)
    );
    assert_eq!(
        bounded(
            "a missing kubeconfig",
            run(&[
                "--kubeconfig",
                "/nonexistent/swimlb.kubeconfig",
                "--listen",
                "127.0.0.1:0"
            ])
        )
        .await,
        Some(69)
    );
}
