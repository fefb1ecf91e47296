//! The Kubernetes mode at scale, against a real control plane, in a network namespace (the
//! speakers need a link with a connected route to their IPs to announce them, and packet
//! sockets to answer on it). Root only.
//!
//! - `measure_ten_thousand_services` (`#[ignore]`d: a measurement, run on demand) runs the real
//!   binary, `swimlb-speaker kubernetes`, as one speaker with 10,000 LoadBalancer Services
//!   (IPv6, from 2001:db8:100::1:0/112), 10,000 EndpointSlices of 3 endpoints and 100 Nodes in
//!   its caches, and prints its resident memory once it announces every IP, and how long
//!   EndpointSlice changes take from their watch event to the announcement started or stopped
//!   (`swimlb_kubernetes_event_handling_seconds`, read from `/metrics`). It prints figures and
//!   fails only when the speaker does not announce what it should.
//! - `a_membership_change_writes_only_the_records_of_the_services_that_moved`: three speakers
//!   in-process; one leaves, then comes back; the `ServiceL2Status` writes in the API server's
//!   audit log are exactly two (object, status) per Service that moved, each time.
//!
//! `cargo test --release -p swimlb-speaker --test kubernetes_scale -- --ignored --nocapture
//! --test-threads=1` runs both (`SWIMLB_MEASURE_SERVICES=N` changes the count,
//! `SWIMLB_MEASURE_CHANGES=N` the number of EndpointSlice changes).

mod netns;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams};
use netns::{Lab, require_root};
use serde_json::{Value, json};
use swimlb_config::service::ServiceKey;
use swimlb_control_plane::test_plane::TestPlane;
use swimlb_speaker::gossip::Timing;
use swimlb_speaker::sources::kubernetes::records::record_name;
use swimlb_speaker::sources::kubernetes::run::{Settings, run};
use swimlb_speaker::sources::kubernetes::snapshot::Options;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::oneshot;
use tokio::time::Instant;

const NS: &str = "swimlb-system";
const SPEAKER_LABELS: &str = "app.kubernetes.io/name=swimlb,app.kubernetes.io/component=speaker";

/// The namespaces the Services are spread over.
const NAMESPACES: usize = 20;

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

fn namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
}

/// A Node as a kubelet reports it: labels, conditions, addresses, capacity and an image list
/// (most of its size, none of it read by the speaker).
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
                "node.kubernetes.io/instance-type": "metal"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
        "spec": {"podCIDR": format!("{}/64", canonical(&format!("2001:db8:300:{i:x}::"))), "providerID": format!("metal://node-{i}")},
        "status": {
            "conditions": [condition("NetworkUnavailable", "False"), condition("MemoryPressure", "False"),
                condition("DiskPressure", "False"), condition("PIDPressure", "False"), condition("Ready", "True")],
            "addresses": [{"type": "InternalIP", "address": canonical(&format!("2001:db8:400::{i:x}"))},
                {"type": "Hostname", "address": format!("node-{i}")}],
            "capacity": {"cpu": "64", "memory": "263835220Ki", "pods": "110"},
            "allocatable": {"cpu": "63", "memory": "262835220Ki", "pods": "110"},
            "nodeInfo": {"machineID": format!("{i:032x}"), "systemUUID": format!("{i:032x}"), "bootID": format!("{i:032x}"),
                "kernelVersion": "6.1.0", "osImage": "Debian GNU/Linux 12", "containerRuntimeVersion": "containerd://1.7.0",
                "kubeletVersion": "v1.33.0", "kubeProxyVersion": "v1.33.0", "operatingSystem": "linux", "architecture": "amd64"},
            "images": images}})
}

fn service(i: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("svc-{i:05}"), "namespace": namespace_of(i),
            "labels": {"app": format!("app-{i:05}"), "tier": "web"}},
        "spec": {"type": "LoadBalancer", "ipFamilies": ["IPv6"], "allocateLoadBalancerNodePorts": false,
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]}})
}

/// The endpoints of the `i`th Service: 3, on 3 Nodes, ready or not.
fn endpoints(i: usize, nodes: usize, ready: bool) -> Value {
    let endpoints: Vec<Value> = (0..3)
        .map(|k| {
            json!({"addresses": [canonical(&format!("2001:db8:200::{:x}", i * 3 + k))],
                "nodeName": format!("node-{}", (i + k) % nodes),
                "zone": format!("zone-{}", (i + k) % 3),
                "targetRef": {"kind": "Pod", "namespace": namespace_of(i),
                    "name": format!("app-{i:05}-{k}"), "uid": format!("{:08x}-0000-4000-8000-{:012x}", i, k)},
                "conditions": {"ready": ready, "serving": ready, "terminating": false}})
        })
        .collect();
    Value::Array(endpoints)
}

fn endpoint_slice(i: usize, nodes: usize) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("svc-{i:05}-x7k2p"), "namespace": namespace_of(i),
            "labels": {"kubernetes.io/service-name": format!("svc-{i:05}"),
                "endpointslice.kubernetes.io/managed-by": "swimlb-lab"}},
        "addressType": "IPv6",
        "endpoints": endpoints(i, nodes, true),
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]})
}

fn pool(addresses: &[&str]) -> Value {
    json!({"apiVersion": "swimlb.io/v1beta1", "kind": "IPAddressPool",
        "metadata": {"name": "pool", "namespace": NS}, "spec": {"addresses": addresses}})
}

fn advertisement() -> Value {
    json!({"apiVersion": "swimlb.io/v1beta1", "kind": "L2Advertisement",
        "metadata": {"name": "all", "namespace": NS}, "spec": {}})
}

/// Sets `status.loadBalancer.ingress` of Services as the controller would, `parallel` at a
/// time.
async fn assign(client: &kube::Client, services: Vec<(ServiceKey, String)>, parallel: usize) {
    for chunk in services.chunks(parallel) {
        let mut tasks = Vec::new();
        for (key, ip) in chunk.iter().cloned() {
            let api: Api<Service> = Api::namespaced(client.clone(), &key.namespace);
            tasks.push(tokio::spawn(async move {
                let status = json!({"status": {"loadBalancer": {"ingress": [{"ip": ip}]}}});
                api.patch_status(&key.name, &PatchParams::default(), &Patch::Merge(&status))
                    .await
                    .expect("the Service's ingress");
            }));
        }
        for task in tasks {
            task.await.expect("assign task");
        }
    }
}

/// A plain HTTP/1.1 GET; the body.
async fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await.ok()?;
        let (head, body) = text.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.1 200").then(|| body.to_string())
    };
    tokio::time::timeout(Duration::from_secs(10), fetch)
        .await
        .ok()?
}

/// How many IPs `/metrics` says this node announces.
fn announced(metrics: &str) -> usize {
    metrics
        .lines()
        .filter(|l| l.starts_with("swimlb_announced{"))
        .count()
}

/// The cumulative bucket counts of `swimlb_kubernetes_event_handling_seconds` for `resource`,
/// by upper bound, with the sum.
fn handling(metrics: &str, resource: &str) -> (Vec<(f64, u64)>, f64) {
    let label = format!("resource=\"{resource}\"");
    let mut buckets = Vec::new();
    let mut sum = 0.0;
    for line in metrics.lines().filter(|l| l.contains(&label)) {
        let value = line.rsplit(' ').next().unwrap_or("0");
        if let Some(rest) =
            line.strip_prefix("swimlb_kubernetes_event_handling_seconds_bucket{le=\"")
        {
            let le = rest.split('"').next().unwrap_or("+Inf");
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap_or(f64::INFINITY)
            };
            buckets.push((le, value.parse().unwrap_or(0)));
        } else if line.starts_with("swimlb_kubernetes_event_handling_seconds_sum{") {
            sum = value.parse().unwrap_or(0.0);
        }
    }
    (buckets, sum)
}

/// The upper bound of the bucket holding the `q` quantile of the observations between two
/// readings, and how many there were.
fn quantile(before: &[(f64, u64)], after: &[(f64, u64)], q: f64) -> (f64, u64) {
    let count_of =
        |b: &[(f64, u64)], le: f64| b.iter().find(|(l, _)| *l == le).map_or(0, |(_, n)| *n);
    let total = after.last().map_or(0, |(le, n)| n - count_of(before, *le));
    for (le, n) in after {
        let n = n - count_of(before, *le);
        if total > 0 && n as f64 >= q * total as f64 {
            return (*le, total);
        }
    }
    (f64::INFINITY, total)
}

/// A `/proc/PID/status` field in KiB.
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// How long the speaker is left alone before its memory is read: longer than its
/// `malloc_trim` period ([`swimlb_speaker::serve::memory::TRIM_PERIOD`]).
const REST: Duration = Duration::from_secs(6);

/// SIGKILLs every process running `program` (found through `/proc/PID/exe`).
fn kill_running(program: &str) {
    let program = std::fs::canonicalize(program).unwrap_or_else(|_| program.into());
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        if std::fs::read_link(entry.path().join("exe")).ok().as_ref() == Some(&program) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

#[test]
#[ignore = "measurement (needs root: network namespace, packet sockets): prints the speaker's RSS and EndpointSlice change latency with 10,000 Services"]
fn measure_ten_thousand_services() {
    require_root();
    let count: usize = std::env::var("SWIMLB_MEASURE_SERVICES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    let nodes = 100;
    let changes: usize = std::env::var("SWIMLB_MEASURE_CHANGES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    assert!(count <= 0x1_0000, "the pool is a /112");
    let lab = Lab::new('m');
    let report = lab.run_in_a(move || async move {
        let api = TestPlane::start_async("scale").await;
        let seeding = Instant::now();
        let mut namespaces = vec![namespace(NS)];
        namespaces.extend((0..NAMESPACES).map(|n| namespace(&namespace_of(n))));
        let mut objects = vec![pool(&["2001:db8:100::1:0/112"]), advertisement()];
        objects.extend((0..nodes).map(node));
        objects.extend((0..count).map(service));
        objects.extend((0..count).map(|i| endpoint_slice(i, nodes)));
        for batch in [namespaces, objects] {
            api.admin().create_all(batch, 64).expect("seeding");
        }
        let client = api.client().await;
        let assignments = (0..count)
            .map(|i| {
                (
                    ServiceKey::new(namespace_of(i), format!("svc-{i:05}")),
                    service_ip(i),
                )
            })
            .collect();
        assign(&client, assignments, 64).await;
        let seeded = seeding.elapsed();

        let listen: SocketAddr = "127.0.0.1:17572".parse().unwrap();
        let log = std::env::temp_dir().join(format!("swimlb-scale-{}.log", std::process::id()));
        let log_file = std::fs::File::create(&log).expect("speaker log");
        let started = Instant::now();
        // SWIMLB_MEASURE_WRAPPER runs the speaker under a profiler ("heaptrack -o FILE"); the
        // memory figures are then the profiler's.
        let wrapper: Vec<String> = std::env::var("SWIMLB_MEASURE_WRAPPER")
            .map(|w| w.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default();
        let program = wrapper
            .first()
            .cloned()
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_swimlb-speaker").to_string());
        let mut command = tokio::process::Command::new(program);
        if !wrapper.is_empty() {
            command
                .args(&wrapper[1..])
                .arg(env!("CARGO_BIN_EXE_swimlb-speaker"));
        }
        let mut speaker = command
            .args([
                "kubernetes",
                "--node-name",
                "node-0",
                "--namespace",
                NS,
                "--bind",
                "127.0.0.1:17946",
                "--listen",
                "127.0.0.1:17572",
                "--insecure",
                "--log",
                "warn",
            ])
            .env("KUBECONFIG", api.admin_kubeconfig())
            .stdout(Stdio::null())
            .stderr(log_file)
            .kill_on_drop(true)
            .spawn()
            .expect("swimlb-speaker");
        let pid = speaker.id().expect("pid");
        // Every IP announced.
        let deadline = Instant::now() + Duration::from_secs(300);
        let mut all = false;
        while Instant::now() < deadline {
            if let Some(text) = http_get(listen, "/metrics").await
                && announced(&text) == count
            {
                all = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let synced = started.elapsed();
        // The writes of a cold start (a record and an Event per Service) end before the
        // changes, so that the changes are timed in a steady state.
        let mut written = None;
        let until = Instant::now() + Duration::from_secs(300);
        while Instant::now() < until {
            let records = api
                .admin()
                .list("swimlb.io/v1beta1", "ServiceL2Status", Some(NS))
                .map(|r| r.len())
                .unwrap_or(0);
            let events = api
                .admin()
                .list("events.k8s.io/v1", "Event", None)
                .map(|e| {
                    e.iter()
                        .filter(|e| e["reportingController"] == "swimlb-speaker")
                        .count()
                })
                .unwrap_or(0);
            if records >= count && events >= count {
                written = Some(started.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        // At rest: longer than the speaker's malloc_trim period, so that the figure does not
        // depend on where in that period it is read.
        tokio::time::sleep(REST).await;
        let rss = (status_kib(pid, "VmRSS:"), status_kib(pid, "VmHWM:"));
        let rss_parts = (status_kib(pid, "RssAnon:"), status_kib(pid, "RssFile:"));
        let cpu_synced = cpu_seconds(pid);

        // EndpointSlice changes, one at a time: every endpoint of a Service not ready (nobody
        // can serve it: the announcement stops), then ready again (it starts).
        let before = http_get(listen, "/metrics").await.unwrap_or_default();
        let slices_of =
            |i: usize| -> Api<EndpointSlice> { Api::namespaced(client.clone(), &namespace_of(i)) };
        let mut first_stop_seen = None;
        for k in 0..changes {
            let i = (k / 2 * 7919) % count;
            let ready = k % 2 == 1;
            let patch = json!({"endpoints": endpoints(i, nodes, ready)});
            slices_of(i)
                .patch(
                    &format!("svc-{i:05}-x7k2p"),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .expect("slice patch");
            if k == 0 {
                // The first change is seen in /metrics: one IP fewer announced.
                let until = Instant::now() + Duration::from_secs(10);
                while Instant::now() < until {
                    let text = http_get(listen, "/metrics").await.unwrap_or_default();
                    if announced(&text) == count - 1 {
                        first_stop_seen = Some(true);
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(REST).await;
        let rss_after = status_kib(pid, "VmRSS:");
        // A scrape renders every IP's gauges (1.9 MB of text at 10,000 IPs): its buffers stay
        // resident until the next trim.
        let after = http_get(listen, "/metrics").await.unwrap_or_default();
        let rss_scraped = status_kib(pid, "VmRSS:");
        let cpu_end = cpu_seconds(pid);
        let metrics_bytes = after.len();
        if !wrapper.is_empty() {
            // The speaker itself is killed, not the profiler, which then writes out what was
            // allocated at this moment (heaptrack's "leaked" is the steady state).
            kill_running(env!("CARGO_BIN_EXE_swimlb-speaker"));
            let _ = tokio::time::timeout(Duration::from_secs(120), speaker.wait()).await;
        }
        let _ = speaker.start_kill();
        let _ = speaker.wait().await;
        let log_text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Ok(keep) = std::env::var("SWIMLB_MEASURE_LOG") {
            let _ = std::fs::copy(&log, keep);
        }
        let _ = std::fs::remove_file(&log);
        (
            (
                seeded,
                synced,
                written,
                all,
                rss,
                rss_parts,
                rss_after,
                rss_scraped,
                cpu_synced,
                cpu_end,
            ),
            (before, after, first_stop_seen, metrics_bytes),
            log_text,
        )
    });
    let (
        (
            seeded,
            synced,
            written,
            all,
            (rss, hwm),
            (anon, file),
            rss_after,
            rss_scraped,
            cpu_synced,
            cpu_end,
        ),
        timing,
        log,
    ) = report;
    let (before, after, first_stop_seen, metrics_bytes) = timing;
    let (b, sum_b) = handling(&before, "endpointslices");
    let (a, sum_a) = handling(&after, "endpointslices");
    let (p50, n) = quantile(&b, &a, 0.50);
    let (p99, _) = quantile(&b, &a, 0.99);
    let mean_ms = if n > 0 {
        (sum_a - sum_b) / n as f64 * 1000.0
    } else {
        f64::NAN
    };
    println!(
        "{count} Services, {count} EndpointSlices of 3 endpoints, 100 Nodes: seeded in {:.1} s; \
         every IP announced {:.1} s after the speaker started, every record and nodeAssigned \
         Event written after {:.1} s (CPU {:.2} s); then VmRSS {} KiB \
         ({:.1} MiB: anonymous {} KiB, file {} KiB), peak VmHWM {} KiB, after {changes} changes {} KiB, \
         right after a /metrics scrape {} KiB; /metrics {} bytes",
        seeded.as_secs_f64(),
        synced.as_secs_f64(),
        written.map_or(f64::NAN, |w| w.as_secs_f64()),
        cpu_synced.unwrap_or(0.0),
        rss.unwrap_or(0),
        rss.unwrap_or(0) as f64 / 1024.0,
        anon.unwrap_or(0),
        file.unwrap_or(0),
        hwm.unwrap_or(0),
        rss_after.unwrap_or(0),
        rss_scraped.unwrap_or(0),
        metrics_bytes,
    );
    println!(
        "EndpointSlice change -> announcement started/stopped (swimlb_kubernetes_event_handling_seconds): \
         {n} events, p50 <= {:.1} ms, p99 <= {:.1} ms (bucket bounds), mean {mean_ms:.2} ms; CPU during the changes {:.2} s",
        p50 * 1000.0,
        p99 * 1000.0,
        cpu_end.unwrap_or(0.0) - cpu_synced.unwrap_or(0.0),
    );
    assert!(all, "the speaker never announced all {count} IPs:\n{log}");
    assert_eq!(
        first_stop_seen,
        Some(true),
        "a Service without ready endpoints was still announced:\n{log}"
    );
    assert_eq!(
        announced(&after),
        count,
        "every Service is ready again, so every IP is announced:\n{log}"
    );
    assert!(n >= changes as u64, "{n} EndpointSlice events observed");
}

fn pod(node: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("speaker-{node}"), "namespace": NS,
            "labels": {"app.kubernetes.io/name": "swimlb", "app.kubernetes.io/component": "speaker"}},
        "spec": {"nodeName": node, "containers": [{"name": "speaker", "image": "swimlb"}]}})
}

fn settings(node: &str, ip: &str) -> Settings {
    let addr = |port| SocketAddr::new(ip.parse().unwrap(), port);
    Settings {
        node: node.into(),
        namespace: NS.into(),
        bind: addr(7946),
        cluster: "lab".into(),
        key_file: None,
        listen: addr(7572),
        timing: Timing::fast(),
        preempt_delay: Duration::ZERO,
        speaker_selector: SPEAKER_LABELS.into(),
        options: Options::default(),
    }
}

/// The Services of `services` (in `default`) by the name of their record.
fn by_record_name(services: &[String]) -> BTreeMap<String, &String> {
    services
        .iter()
        .map(|s| (record_name(&ServiceKey::new("default", s)), s))
        .collect()
}

/// The node each record names, by Service name.
fn record_nodes(api: &TestPlane, services: &[String]) -> BTreeMap<String, String> {
    let by_name = by_record_name(services);
    api.admin()
        .list("swimlb.io/v1beta1", "ServiceL2Status", Some(NS))
        .unwrap_or_default()
        .iter()
        .filter_map(|o| {
            let service = by_name.get(o["metadata"]["name"].as_str()?)?;
            Some((
                (*service).clone(),
                o["status"]["node"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// The writes to the records of `services` (`status` and the object, each named by its
/// resource) among the requests after `from`, by Service; a record of no Service of
/// `services` is under its own name.
fn record_writes(api: &TestPlane, services: &[String], from: usize) -> Writes {
    let by_name = by_record_name(services);
    let mut writes = Writes::new();
    for r in api.requests().into_iter().skip(from) {
        let write = matches!(r.verb.as_str(), "create" | "update" | "patch" | "delete");
        if write && r.resource.starts_with("servicel2statuses") {
            let service = by_name
                .get(&r.name)
                .map_or(r.name.clone(), |s| (*s).clone());
            writes.entry(service).or_default().push(r.resource);
        }
    }
    writes
}

/// Checks that the Services written are `moved` and that each got its status and its object
/// written (a copy of a slow write, [`swimlb_speaker::sources::kubernetes::hedge`], may add
/// more of the same).
fn assert_written(writes: &Writes, moved: &BTreeSet<String>, what: &str) {
    let written: BTreeSet<String> = writes.keys().cloned().collect();
    assert_eq!(&written, moved, "{what}: the records written");
    for (service, resources) in writes {
        for needed in ["servicel2statuses/status", "servicel2statuses"] {
            assert!(
                resources.iter().any(|r| r == needed),
                "{what}: {service}'s writes lack {needed}: {resources:?}"
            );
        }
    }
}

/// Writes to `resource` (and its subresources) among the requests after `from`.
fn writes_to(api: &TestPlane, from: usize, resource: &str) -> usize {
    api.requests()
        .iter()
        .skip(from)
        .filter(|r| r.resource.starts_with(resource))
        .filter(|r| matches!(r.verb.as_str(), "create" | "update" | "patch" | "delete"))
        .count()
}

/// Waits (at most `limit`) until `check` holds.
async fn until(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check()
}

type Speakers = BTreeMap<String, (oneshot::Sender<()>, tokio::task::JoinHandle<()>)>;

async fn start_speaker(api: &TestPlane, speakers: &mut Speakers, node: &str, ip: &str) {
    let (stop, stopped) = oneshot::channel::<()>();
    let client = api.client().await;
    let settings = settings(node, ip);
    let task = tokio::spawn(async move {
        let shutdown = Box::pin(async move {
            let _ = stopped.await;
        });
        if let Err(e) = run(settings, client, shutdown).await {
            panic!("speaker: {e}");
        }
    });
    speakers.insert(node.to_string(), (stop, task));
}

async fn stop_speaker(speakers: &mut Speakers, node: &str) {
    let (stop, task) = speakers.remove(node).expect("running");
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
}

/// What the membership-change test saw after one phase: whether the records reached the state
/// the phase waits for, the records (Service -> node) then, and the `ServiceL2Status` writes the
/// phase made.
struct Phase {
    settled: bool,
    records: BTreeMap<String, String>,
    writes: Writes,
}

/// The resources of the writes to the records, by Service.
type Writes = BTreeMap<String, Vec<String>>;

/// The three nodes of the membership-change test and their speakers' addresses.
const NODES: [(&str, &str); 3] = [
    ("node-a", "127.0.0.2"),
    ("node-b", "127.0.0.3"),
    ("node-c", "127.0.0.4"),
];

/// Seeds the API server of the membership-change test: the pool, the nodes and their speaker
/// Pods (with their IPs), and one Service per name with a ready endpoint on a node in turn, each
/// assigned an IP.
async fn seed_membership_cluster(api: &TestPlane, names: &[String]) {
    api.create_namespace(NS).expect("the speaker's namespace");
    let mut objects = vec![pool(&["198.51.100.128/26"]), advertisement()];
    for (node, _) in NODES {
        objects.push(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}));
        objects.push(pod(node));
    }
    for (i, name) in names.iter().enumerate() {
        objects.push(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]}}));
        objects.push(
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-1"), "namespace": "default",
                "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["203.0.113.10"], "nodeName": NODES[i % 3].0,
                "conditions": {"ready": true}}]}),
        );
    }
    api.admin().create_all(objects, 16).expect("seeding");
    let client = api.client().await;
    let assignments = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            (
                ServiceKey::new("default", n),
                format!("198.51.100.{}", 130 + i),
            )
        })
        .collect();
    assign(&client, assignments, 10).await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NS);
    for (node, ip) in NODES {
        let status = json!({"status": {"podIP": ip}});
        pods.patch_status(
            &format!("speaker-{node}"),
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
        .expect("the Pod's IP");
    }
}

/// Waits up to 20 s for `settled`, then 2 s more (nothing more to write once every record is
/// there), and reads the records and the `ServiceL2Status` writes since `mark`.
async fn phase(
    api: &TestPlane,
    names: &[String],
    mark: usize,
    settled: impl FnMut() -> bool,
) -> Phase {
    let settled = until(Duration::from_secs(20), settled).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    Phase {
        settled,
        records: record_nodes(api, names),
        writes: record_writes(api, names, mark),
    }
}

#[test]
#[ignore = "needs root: network namespaces and packet sockets"]
fn a_membership_change_writes_only_the_records_of_the_services_that_moved() {
    require_root();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
    let lab = Lab::new('w');
    let count = 30;
    let (with_c, without_c, back, (after_pause, pause_events)) = lab.run_in_a(move || async move {
        let api = TestPlane::start_async("membership-change").await;
        let names: Vec<String> = (0..count).map(|i| format!("web-{i:02}")).collect();
        seed_membership_cluster(&api, &names).await;
        let mut speakers = Speakers::new();
        for (node, ip) in NODES {
            start_speaker(&api, &mut speakers, node, ip).await;
        }
        let on = |nodes: &[&str]| {
            let (api, names) = (&api, names.clone());
            let nodes: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
            move || {
                let records = record_nodes(api, &names);
                records.len() == names.len() && records.values().all(|n| nodes.contains(n))
            }
        };
        let all = ["node-a", "node-b", "node-c"];
        let mut with_c = phase(&api, &names, api.requests().len(), on(&all)).await;
        // Nothing is written while nothing changes.
        let mark = api.requests().len();
        tokio::time::sleep(Duration::from_secs(1)).await;
        with_c.writes = record_writes(&api, &names, mark);

        // node-c leaves (SIGTERM: drains, leaves the mesh).
        let mark = api.requests().len();
        stop_speaker(&mut speakers, "node-c").await;
        let without_c = phase(&api, &names, mark, on(&["node-a", "node-b"])).await;

        // node-c comes back and takes its Services back (no preempt delay).
        let mark = api.requests().len();
        start_speaker(&api, &mut speakers, "node-c", "127.0.0.4").await;
        let before = with_c.records.clone();
        let back = phase(&api, &names, mark, || record_nodes(&api, &names) == before).await;

        // Every speaker stops for longer than the suspicion timeout (the whole process, as a
        // loaded machine stops it): each answers nothing until it hears the cluster again, and
        // nobody took anything over meanwhile, so no record changes.
        let mark = api.requests().len();
        stop_this_process_for(Duration::from_millis(300));
        tokio::time::sleep(Duration::from_secs(4)).await;
        let after_pause = Phase {
            settled: true,
            records: record_nodes(&api, &names),
            writes: record_writes(&api, &names, mark),
        };
        let pause_events = writes_to(&api, mark, "events");
        for node in all {
            stop_speaker(&mut speakers, node).await;
        }
        (with_c, without_c, back, (after_pause, pause_events))
    });
    assert!(
        with_c.settled,
        "not every Service got a record: {:?}",
        with_c.records
    );
    let on_c = with_c.records.values().filter(|n| *n == "node-c").count();
    assert!(
        on_c > 0 && on_c < with_c.records.len(),
        "node-c owns some Services but not all: {:?}",
        with_c.records
    );
    assert_eq!(
        with_c.writes,
        Writes::new(),
        "nothing is written while nothing changes"
    );
    assert!(
        without_c.settled,
        "node-c's Services did not move: {:?}",
        without_c.records
    );
    let moved: BTreeSet<String> = with_c
        .records
        .iter()
        .filter(|(s, n)| without_c.records.get(*s) != Some(*n))
        .map(|(s, _)| s.clone())
        .collect();
    assert_eq!(moved.len(), on_c, "only node-c's Services moved");
    println!(
        "node-c left: {} of {} Services moved, {} ServiceL2Status writes",
        moved.len(),
        with_c.records.len(),
        without_c.writes.values().map(Vec::len).sum::<usize>()
    );
    assert_written(&without_c.writes, &moved, "node-c left");
    assert!(
        back.settled,
        "node-c did not take its Services back: {:?}",
        back.records
    );
    println!(
        "node-c came back: {on_c} Services moved back, {} ServiceL2Status writes",
        back.writes.values().map(Vec::len).sum::<usize>()
    );
    assert_written(&back.writes, &moved, "node-c came back");
    println!(
        "every speaker stopped for 300 ms: {} ServiceL2Status writes, {pause_events} Event writes",
        after_pause.writes.values().map(Vec::len).sum::<usize>()
    );
    assert_eq!(
        after_pause.records, with_c.records,
        "a pause of every speaker moves nothing"
    );
    assert_eq!(
        after_pause.writes,
        Writes::new(),
        "nothing is written after a pause that moved nothing"
    );
    assert_eq!(
        pause_events, 0,
        "no nodeAssigned Event: nothing changed hands"
    );
}

/// Stops this process (every speaker of the test, not the API server) for `pause`: a helper
/// process sends SIGSTOP, then SIGCONT.
fn stop_this_process_for(pause: Duration) {
    let pid = std::process::id();
    let script = format!(
        "kill -STOP {pid}; sleep {}; kill -CONT {pid}",
        pause.as_secs_f64()
    );
    let status = std::process::Command::new("sh")
        .args(["-c", &script])
        .status()
        .expect("sh");
    assert!(status.success(), "stopping the test process: {status}");
}
