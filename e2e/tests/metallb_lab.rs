//! MetalLB in the lab.
//!
//! - `the_readmes_switch_from_metallb_keeps_every_ip_and_every_owner`: `swimlb-lab migrate`'s
//!   run with two Services on three real nodes (a real kubelet, containerd and kube-proxy in
//!   each node namespace): MetalLB installed from its `metallb-native.yaml` and its own images,
//!   serving; replaced by swimlb (`deploy/swimlb.yaml`, only the image changed) by the book's
//!   commands; every Service keeps its IP and every probe during the switch is answered by the
//!   node MetalLB's order names (no owner moved), except right after a starvation of a swimlb
//!   speaker measured during the switch (a thread waiting 100 ms or more for a CPU: the owner
//!   taken over and refuted for a moment, seen when the machine's load is above about 14). MetalLB's own failover on real nodes (the
//!   owner its order names, another node answering after a poweroff) is
//!   `service_failover.rs`'s `metallb_from_its_own_images_...` and `failover --impl metallb`.
//! - `measure_speaker_memory_beside_swimlb` (`#[ignore]`d measurement, run on demand): one real
//!   node, MetalLB installed from its images and manifest as above (its speaker's process found
//!   through `crictl`), and swimlb's speaker beside it (`swimlb-lab speaker
//!   kubernetes`, other ports), both watching the same real API server seeded as
//!   `speaker/tests/kubernetes_scale.rs` seeds it: `SWIMLB_MEASURE_SERVICES` (10,000) IPv6
//!   LoadBalancer Services in 20 namespaces (their IPs asked for with `metallb.io/loadBalancerIPs`
//!   and assigned by MetalLB's controller), as many EndpointSlices of 3 endpoints, 100 Nodes.
//!   Once each speaker announces every IP and wrote its status records, it prints both speakers'
//!   VmRSS and VmHWM, and their CPU over 30 s at rest. It fails only when a speaker does not
//!   announce what it should.
//!
//! Root only (network namespaces), `#[ignore = "needs root: ..."]`, one lab at a time as the
//! other lab tests. Every wait is bounded; no time is asserted.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{Value, json};
use swimlb_e2e::migrate;
use swimlb_e2e::netns::{self, Lab};
use swimlb_e2e::probe;
use swimlb_e2e::realnode::metallb;
use swimlb_e2e::realnode::{self, daemons::container_pid};
use swimlb_e2e::service_failover::Implementation;
use swimlb_e2e::service_failover::cluster::{NodeCluster, Workload};
use tokio::time::Instant;

static LAB: Mutex<()> = Mutex::new(());

fn one_lab(test: &str) -> MutexGuard<'static, ()> {
    netns::require_root(test);
    LAB.lock().unwrap_or_else(|e| e.into_inner())
}

fn program() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_swimlb-lab"))
}

#[test]
#[ignore = "needs root: network namespaces, the real control plane and MetalLB's programs (e2e/k8s/build.sh)"]
fn the_readmes_switch_from_metallb_keeps_every_ip_and_every_owner() {
    let _lab = one_lab("the_readmes_switch_from_metallb_keeps_every_ip_and_every_owner");
    let options = migrate::Options {
        nodes: 3,
        services: 2,
    };
    let report = migrate::run(program(), &options, &mut |line| eprintln!("{line}"))
        .unwrap_or_else(|e| panic!("{e:#}"));
    eprint!("{}", report.table());
    assert_eq!(report.services.len(), 2);
    for s in &report.services {
        assert_eq!(s.ip_after, s.ip_before, "{s:?}");
        assert_eq!(s.owner_before, s.rule_owner, "{s:?}");
        assert_eq!(
            s.owner_after.as_deref(),
            Some(s.rule_owner.as_str()),
            "{s:?}"
        );
        assert!(s.answered_by.contains(&s.rule_owner), "{s:?}");
        // Another node answers only right after a speaker's measured starvation (a starved
        // owner taken over and refuted for a moment, as on any loaded machine), never because
        // of the switch.
        for other in &s.others {
            assert!(
                other.after_starvation,
                "{} answered by {} with no starvation measured near it: {s:?}\n{:?}",
                s.service, other.node, report.starvations
            );
        }
    }
    assert_eq!(report.ips_changed, 0);
    assert_eq!(report.owners_moved_unexplained, 0);
    // Probes lost depend on the clients' neighbour timers against the switch's few seconds
    // without a speaker: printed above, measured by `swimlb-lab migrate`, not asserted.
}

// ---------------------------------------------------------------------------------------------
// The memory measurement.

/// The namespaces the Services are spread over (as kubernetes_scale.rs).
const NAMESPACES: usize = 20;
/// swimlb's speaker's ports beside MetalLB's on the same node (7946 and 7472 are MetalLB's).
const SWIMLB_GOSSIP_PORT: u16 = 17946;
const SWIMLB_HTTP_PORT: u16 = 17572;
/// At rest before the figures are read (kubernetes_scale.rs's `REST`).
const REST: Duration = Duration::from_secs(6);
/// The CPU window at rest.
const CPU_WINDOW: Duration = Duration::from_secs(30);

fn namespace_of(i: usize) -> String {
    format!("apps-{:02}", i % NAMESPACES)
}

/// `address` as the API server wants it: in canonical form (RFC 5952; `2001:db8::0` is refused).
fn canonical(address: &str) -> String {
    let ip: std::net::Ipv6Addr = address.parse().expect("an IPv6 address");
    ip.to_string()
}

/// The `i`th Service's IP: 2001:db8:100::1:0/112 (on the lab's 2001:db8:100::/64).
fn service_ip(i: usize) -> String {
    canonical(&format!("2001:db8:100::1:{i:x}"))
}

/// A Node as a kubelet reports it (kubernetes_scale.rs's, labels, conditions and image list).
fn node(i: usize) -> Value {
    let images: Vec<Value> = (0..30)
        .map(|k| {
            json!({"names": [format!("registry.example/team-{k}/image-{k}@sha256:{:064x}", i * 100 + k),
                format!("registry.example/team-{k}/image-{k}:v1.{k}.0")], "sizeBytes": 100_000_000 + k})
        })
        .collect();
    let condition = |kind: &str, status: &str| {
        json!({"type": kind, "status": status, "reason": format!("Kubelet{kind}"),
            "message": format!("kubelet says {kind} is {status}"),
            "lastHeartbeatTime": "2025-01-01T00:00:00Z", "lastTransitionTime": "2025-01-01T00:00:00Z"})
    };
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": format!("node-{i}"),
            "labels": {"kubernetes.io/hostname": format!("node-{i}"), "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", "topology.kubernetes.io/zone": format!("zone-{}", i % 3),
                "node.kubernetes.io/instance-type": "metal"}},
        "spec": {"providerID": format!("metal://node-{i}")},
        "status": {
            "conditions": [condition("NetworkUnavailable", "False"), condition("MemoryPressure", "False"),
                condition("DiskPressure", "False"), condition("PIDPressure", "False"), condition("Ready", "True")],
            "addresses": [{"type": "InternalIP", "address": canonical(&format!("2001:db8:400::{i:x}"))},
                {"type": "Hostname", "address": format!("node-{i}")}],
            "capacity": {"cpu": "64", "memory": "263835220Ki", "pods": "110"},
            "allocatable": {"cpu": "63", "memory": "262835220Ki", "pods": "110"},
            "images": images}})
}

/// The `i`th Service, asking for its IP as MetalLB's users do (both speakers read the status
/// MetalLB's controller writes).
fn service(i: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("svc-{i:05}"), "namespace": namespace_of(i),
            "labels": {"app": format!("app-{i:05}"), "tier": "web"},
            "annotations": {"metallb.io/loadBalancerIPs": service_ip(i)}},
        "spec": {"type": "LoadBalancer", "ipFamilies": ["IPv6"], "allocateLoadBalancerNodePorts": false,
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]}})
}

fn endpoint_slice(i: usize, nodes: usize) -> Value {
    let endpoints: Vec<Value> = (0..3)
        .map(|k| {
            json!({"addresses": [canonical(&format!("2001:db8:200::{:x}", i * 3 + k))],
                "nodeName": format!("node-{}", (i + k) % nodes),
                "zone": format!("zone-{}", (i + k) % 3),
                "targetRef": {"kind": "Pod", "namespace": namespace_of(i),
                    "name": format!("app-{i:05}-{k}"), "uid": format!("{:08x}-0000-4000-8000-{:012x}", i, k)},
                "conditions": {"ready": true, "serving": true, "terminating": false}})
        })
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("svc-{i:05}-x7k2p"), "namespace": namespace_of(i),
            "labels": {"kubernetes.io/service-name": format!("svc-{i:05}"),
                "endpointslice.kubernetes.io/managed-by": "swimlb-lab"}},
        "addressType": "IPv6",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]})
}

/// `field` of `/proc/PID/status`, in KiB.
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// utime + stime of `pid`, in clock ticks (100 a second).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// IPs announced in a `/metrics` answer: MetalLB's gauge at 1 for `node`, or swimlb's series.
fn announced(metrics: &str, node: &str) -> usize {
    metrics
        .lines()
        .filter(|l| {
            (l.starts_with("metallb_speaker_announced{")
                && l.contains(&format!("node=\"{node}\""))
                && l.ends_with(" 1"))
                || l.starts_with("swimlb_announced{")
        })
        .count()
}

/// `GET path` on `addr` in HTTP/1.0, so that a large answer comes whole, not in chunks; the
/// body.
fn http10_get(addr: SocketAddr, path: &str) -> Option<String> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nhost: lab\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (_, body) = text.split_once("\r\n\r\n")?;
    Some(body.to_string())
}

/// swimlb's speaker in Kubernetes mode on `node`, as kubernetes_scale.rs runs it (the admin's
/// kubeconfig, no gossip key, no peers), on ports beside MetalLB's.
fn start_swimlb_speaker(lab: &Lab, kubeconfig: &std::path::Path, log: &std::path::Path) -> Child {
    let node = lab.node(1);
    let program = program().to_string_lossy().into_owned();
    let mut cmd = Lab::command_in(&node.netns, &program);
    cmd.args(["speaker", "kubernetes", "--node-name", &node.name])
        .args(["--namespace", "swimlb-system", "--bind"])
        .arg(SocketAddr::from((node.v4, SWIMLB_GOSSIP_PORT)).to_string())
        .arg("--listen")
        .arg(SocketAddr::from((node.v4, SWIMLB_HTTP_PORT)).to_string())
        .args(["--insecure", "--log", "warn"])
        .env("KUBECONFIG", kubeconfig)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("swimlb's log"));
    cmd.spawn().expect("swimlb's speaker")
}

#[test]
#[ignore = "measurement (needs root: network namespaces, the real control plane and MetalLB's programs): prints both speakers' RSS and CPU at rest with 10,000 Services"]
fn measure_speaker_memory_beside_swimlb() {
    let _lab = one_lab("measure_speaker_memory_beside_swimlb");
    let count: usize = std::env::var("SWIMLB_MEASURE_SERVICES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    assert!(count <= 0x1_0000, "the pool is a /112");
    let nodes = 100;
    realnode::cleanup_stale();
    let lab = Lab::create(1).expect("building the lab");
    // Dropped before the lab (declared after it).
    let cluster = NodeCluster::start(
        &lab,
        Implementation::Metallb,
        Workload::Probe,
        None,
        &mut |line| eprintln!("{line}"),
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    let real = &cluster.real.nodes[0];
    let metallb_pid = container_pid(real)
        .unwrap_or_else(|e| panic!("{e:#}"))
        .expect("MetalLB's speaker runs");
    let plane = &cluster.plane;
    let api = plane.admin();
    plane.install_crds().expect("swimlb's CRDs");

    let seeding = Instant::now();
    let mut namespaces = vec![json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "swimlb-system"}})];
    namespaces.extend((0..NAMESPACES).map(
        |n| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace_of(n)}}),
    ));
    let mut objects = vec![
        json!({"apiVersion": "swimlb.io/v1beta1", "kind": "IPAddressPool",
            "metadata": {"name": "pool", "namespace": "swimlb-system"},
            "spec": {"addresses": ["2001:db8:100::1:0/112"]}}),
        json!({"apiVersion": "swimlb.io/v1beta1", "kind": "L2Advertisement",
            "metadata": {"name": "all", "namespace": "swimlb-system"}, "spec": {}}),
        json!({"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
            "metadata": {"name": "scale", "namespace": metallb::NAMESPACE},
            "spec": {"addresses": ["2001:db8:100::1:0/112"]}}),
    ];
    objects.extend((0..nodes).map(node));
    objects.extend((0..count).map(service));
    objects.extend((0..count).map(|i| endpoint_slice(i, nodes)));
    for batch in [namespaces, objects] {
        api.create_all(batch, 64).expect("seeding");
    }
    let seeded = seeding.elapsed();

    let dir = lab.work_dir().to_path_buf();
    let mut swimlb = start_swimlb_speaker(
        &lab,
        &plane.admin_kubeconfig(),
        &dir.join("swimlb-speaker.log"),
    );
    let swimlb_pid = swimlb.id();
    let node = lab.node(1).clone();
    let metrics_of = |port: u16| {
        let addr = SocketAddr::from((node.v4, port));
        probe::in_netns(&lab.client_netns, move || http10_get(addr, "/metrics"))
            .ok()
            .flatten()
            .unwrap_or_default()
    };
    // Every IP announced by both (MetalLB's controller assigns them first).
    let started = Instant::now();
    let deadline = started + Duration::from_secs(900);
    let (mut metallb_n, mut swimlb_n) = (0, 0);
    while Instant::now() < deadline {
        metallb_n = announced(&metrics_of(metallb::METRICS_PORT), &node.name);
        swimlb_n = announced(&metrics_of(SWIMLB_HTTP_PORT), &node.name);
        if metallb_n >= count && swimlb_n >= count {
            break;
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    let synced = started.elapsed();
    // Their status records written (a cold start's writes end before the figures).
    let records = |group: &str, namespace: &str| {
        api.list(
            &format!("{group}/v1beta1"),
            "ServiceL2Status",
            Some(namespace),
        )
        .map(|r| r.len())
        .unwrap_or(0)
    };
    let until = Instant::now() + Duration::from_secs(300);
    let (mut metallb_records, mut swimlb_records) = (0, 0);
    while Instant::now() < until {
        metallb_records = records("metallb.io", metallb::NAMESPACE);
        swimlb_records = records("swimlb.io", "swimlb-system");
        if metallb_records >= count && swimlb_records >= count {
            break;
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    std::thread::sleep(REST);
    let rss = |pid: u32| (status_kib(pid, "VmRSS:"), status_kib(pid, "VmHWM:"));
    let (metallb_rss, swimlb_rss) = (rss(metallb_pid), rss(swimlb_pid));
    let before = (cpu_ticks(metallb_pid), cpu_ticks(swimlb_pid));
    std::thread::sleep(CPU_WINDOW);
    let after = (cpu_ticks(metallb_pid), cpu_ticks(swimlb_pid));
    let cpu = |b: Option<u64>, a: Option<u64>| match (b, a) {
        (Some(b), Some(a)) => format!(
            "{:.2} %",
            a.saturating_sub(b) as f64 / 100.0 / CPU_WINDOW.as_secs_f64() * 100.0
        ),
        _ => "-".into(),
    };
    let mib =
        |kib: Option<u64>| kib.map_or("-".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0));
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "{count} Services (IPv6), {count} EndpointSlices of 3 endpoints, {nodes} Nodes, seeded in {:.1} s; \
         both speakers announced every IP {:.1} s after swimlb's start ({metallb_n} and {swimlb_n} announced), \
         records {metallb_records} (MetalLB) and {swimlb_records} (swimlb); at rest {REST:?} later:\n  \
         MetalLB v0.15.2 speaker: VmRSS {} (VmHWM {}), CPU over {CPU_WINDOW:?} {}\n  \
         swimlb speaker:          VmRSS {} (VmHWM {}), CPU over {CPU_WINDOW:?} {}\n  \
         load average at the end: {}",
        seeded.as_secs_f64(),
        synced.as_secs_f64(),
        mib(metallb_rss.0),
        mib(metallb_rss.1),
        cpu(before.0, after.0),
        mib(swimlb_rss.0),
        mib(swimlb_rss.1),
        cpu(before.1, after.1),
        load.trim()
    );
    let _ = swimlb.kill();
    let _ = swimlb.wait();
    assert!(
        metallb_n >= count && swimlb_n >= count,
        "not every IP announced: MetalLB {metallb_n}, swimlb {swimlb_n} of {count}\n{}",
        realnode::metallb::container_log(real, metallb::NAMESPACE, "speaker-", "speaker")
            .lines()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .join("\n")
    );
    drop(cluster);
    drop(lab);
}
