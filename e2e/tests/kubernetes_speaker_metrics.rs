//! Issue 14: the Kubernetes speaker's `/metrics` (the code `swimlb-speaker kubernetes` runs,
//! in-process, against the real control plane on the loopback), read as curl reads it, passes `promtool check
//! metrics` and exposes exactly the metrics of the book's metrics reference
//! (`docs/src/reference/metrics.md`) for the Kubernetes speaker (`speaker`, `kubernetes` and
//! `all` rows), with their types and labels.
//!
//! Every labelled family is made to hold a series (an empty family is not exposed at all): a
//! Service announced on a veth (`swimlb_announced`, `swimlb_owner`), another outside every pool
//! and an invalid `L2Advertisement` (`swimlb_snapshot_dropped`), an EndpointSlice created after
//! the start (`swimlb_kubernetes_event_handling_seconds`), a datagram that is no envelope
//! (`swimlb_gossip_rejected_total`), an ARP request for an address nobody owns
//! (`swimlb_responder_dropped_frames_total`), and the API server away before the first record
//! is written (`swimlb_kubernetes_watch_errors_total`, `swimlb_kubernetes_write_errors_total`:
//! their series exist at 0 from the start; these make them count).
//! Root only: network namespaces and packet sockets.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use serde_json::json;
use swimlb_control_plane::test_plane::TestPlane;
use swimlb_e2e::metrics_doc;
use swimlb_speaker::gossip::Timing;
use swimlb_speaker::sources::kubernetes::run::{Settings, run};
use swimlb_speaker::sources::kubernetes::snapshot::Options;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

const NS: &str = "swimlb-system";
const VIP: &str = "198.51.100.100";

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Namespace A (the speaker) and B (a client) joined by a veth; deleted on drop.
struct Pair {
    a: String,
    b: String,
    veth_b: String,
}

impl Pair {
    fn new() -> Pair {
        let pid = std::process::id();
        let pair = Pair {
            a: format!("swlb-kma-{pid}"),
            b: format!("swlb-kmb-{pid}"),
            veth_b: format!("vkmb{pid}"),
        };
        let veth_a = format!("vkma{pid}");
        ip(&["netns", "add", &pair.a]);
        ip(&["netns", "add", &pair.b]);
        ip(&[
            "-n",
            &pair.a,
            "link",
            "add",
            &veth_a,
            "type",
            "veth",
            "peer",
            "name",
            &pair.veth_b,
            "netns",
            &pair.b,
        ]);
        for (ns, dev, addr) in [
            (&pair.a, &veth_a, "198.51.100.1/24"),
            (&pair.b, &pair.veth_b, "198.51.100.2/24"),
        ] {
            ip(&["-n", ns, "link", "set", "lo", "up"]);
            ip(&["-n", ns, "addr", "add", addr, "dev", dev]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
        }
        pair
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.a]).output();
        let _ = Command::new("ip").args(["netns", "del", &self.b]).output();
    }
}

async fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await.ok()?;
        let (head, body) = text.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.1 200").then(|| body.to_string())
    };
    tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .ok()?
}

/// Whether a sample line starting with `needle` holds a value other than 0.
fn holds(body: &str, needle: &str) -> bool {
    body.lines()
        .any(|l| l.starts_with(needle) && !l.ends_with(" 0") && !l.ends_with(" 0.0"))
}

/// Polls `/metrics` until a sample line starting with every needle holds a value other than 0
/// (at most 30 s).
async fn metrics_with(listen: SocketAddr, needles: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let body = get(listen, "/metrics").await.unwrap_or_default();
        let missing: Vec<&&str> = needles.iter().filter(|n| !holds(&body, n)).collect();
        if missing.is_empty() {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{missing:?} never in /metrics:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[test]
#[ignore = "needs root: network namespaces and packet sockets"]
fn kubernetes_speaker_metrics_pass_promtool_and_are_the_metrics_reference() {
    swimlb_e2e::netns::require_root("kubernetes_speaker_metrics");
    let pair = Pair::new();
    let (b, veth_b) = (pair.b.clone(), pair.veth_b.clone());
    let body = swimlb_e2e::probe::in_netns(&pair.a, move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(scenario(b, veth_b))
    })
    .expect("namespace A");
    if let Err(e) = swimlb_e2e::promtool::check_metrics(&body) {
        panic!("{e}\n{body}");
    }
    let rows = metrics_doc::documented_rows().unwrap_or_else(|e| panic!("{e:#}"));
    if let Err(e) = metrics_doc::compare(&rows, "kubernetes", &metrics_doc::families(&body)) {
        panic!(
            "the metrics reference ({}) and the Kubernetes speaker's /metrics differ:\n{e}\n{body}",
            metrics_doc::PAGE
        );
    }
}

/// An EndpointSlice of `web` with a ready endpoint on node-a.
fn endpoint_slice(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "default",
            "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["203.0.113.10"], "nodeName": "node-a",
            "conditions": {"ready": true}}]
    })
}

async fn scenario(b: String, veth_b: String) -> String {
    let mut plane = TestPlane::start_async("metrics").await;
    let objects = vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}),
        json!({"apiVersion": "swimlb.io/v1beta1", "kind": "IPAddressPool",
            "metadata": {"name": "lab", "namespace": NS},
            "spec": {"addresses": ["198.51.100.100/30"]}}),
        json!({"apiVersion": "swimlb.io/v1beta1", "kind": "L2Advertisement",
            "metadata": {"name": "all", "namespace": NS}, "spec": {}}),
        json!({"apiVersion": "swimlb.io/v1beta1", "kind": "L2Advertisement",
            "metadata": {"name": "bad", "namespace": NS},
            "spec": {"nodeSelectors": [{"matchExpressions": [{"key": "zone", "operator": "Bogus"}]}]}}),
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]}}),
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "stray", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]}}),
        endpoint_slice("web-1"),
    ];
    for object in objects {
        plane.admin().create(object).expect("seeding");
    }
    let client = plane.client().await;
    let services: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(client.clone(), "default");
    for (name, address) in [("web", VIP), ("stray", "192.0.2.50")] {
        let status = json!({"status": {"loadBalancer": {"ingress": [{"ip": address}]}}});
        services
            .patch_status(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&status),
            )
            .await
            .expect("the Service's ingress");
    }
    let listen: SocketAddr = "127.0.0.1:7572".parse().unwrap();
    let bind: SocketAddr = "127.0.0.1:7946".parse().unwrap();
    let settings = Settings {
        node: "node-a".into(),
        namespace: NS.into(),
        bind,
        cluster: "metrics".into(),
        key_file: None,
        listen,
        timing: Timing::fast(),
        preempt_delay: Duration::ZERO,
        speaker_selector: "app.kubernetes.io/component=speaker".into(),
        options: Options::default(),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let speaker = tokio::spawn(run(
        settings,
        client.clone(),
        Box::pin(async move {
            let _ = stopped.await;
        }),
    ));
    // The engine runs once the watches listed: the VIP is in /status. It is answered only
    // after the start-up hold (3 s alone), so its record is not written yet: the API server
    // goes away now, and the record's write fails.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !get(listen, "/status")
        .await
        .is_some_and(|s| s.contains(VIP))
    {
        assert!(Instant::now() < deadline, "the engine never served the VIP");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    plane.stop_apiserver().expect("stopping the API server");
    metrics_with(
        listen,
        &[
            "swimlb_kubernetes_watch_errors_total{",
            "swimlb_kubernetes_write_errors_total{resource=\"servicel2statuses\"}",
            "swimlb_announced{",
        ],
    )
    .await;
    plane.start_apiserver().expect("starting the API server");
    // A datagram that is no envelope, and an ARP request for an address nobody owns.
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket.send_to(b"not an envelope", bind).await.unwrap();
    let arping = tokio::task::spawn_blocking(move || {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &b,
                "arping",
                "-c",
                "2",
                "-w",
                "2",
                "-I",
                &veth_b,
                "198.51.100.101",
            ])
            .output()
    });
    let _ = arping.await;
    // An EndpointSlice after the start: an event handled.
    let slices: kube::Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
        kube::Api::namespaced(client, "default");
    let slice = serde_json::from_value(endpoint_slice("web-2")).unwrap();
    // The watches resume with backoff: retried until the API server takes it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while slices
        .create(&kube::api::PostParams::default(), &slice)
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "the EndpointSlice was never created"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let body = metrics_with(
        listen,
        &[
            "swimlb_kubernetes_event_handling_seconds_count{resource=\"endpointslices\"}",
            "swimlb_gossip_rejected_total{",
            "swimlb_responder_dropped_frames_total{",
            "swimlb_snapshot_dropped{reason=\"outside_pools\"}",
            "swimlb_snapshot_dropped{reason=\"invalid_advertisement\"}",
            "swimlb_owner{",
        ],
    )
    .await;
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), speaker).await;
    drop(plane);
    body
}
