//! The Kubernetes mode end to end on a real kernel: two speakers (`kubernetes::run::run`, the
//! code `swimlb-speaker kubernetes` runs) against a real control plane (`swimlb_control_plane`), in a network namespace.
//!
//! Namespace A holds etcd and the API server (on its own 127.0.0.1), two speakers gossiping on
//! 127.0.0.2 and 127.0.0.3 (their Pods' IPs, which is how they find each other) and the veth
//! that both announce on (198.51.100.1/24); namespace B is the client. One Service of type
//! LoadBalancer holds 198.51.100.100. Checked: the owner is the node MetalLB's order names and
//! its `ServiceL2Status` record and `nodeAssigned` Event say so; the client's ARP for the IP is
//! answered; when the owner drains while the API server is unreachable, the other speaker takes
//! the IP from gossip alone, and once the API server is back the record names it. Root only.
//!
//! Both speakers answer on the same link, so with the same MAC: the drain cannot see its
//! successor's announcement as a claim by another MAC and ends at its deadline instead.

mod netns;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use netns::{Lab, arp_answered, require_root};
use serde_json::{Value, json};
use swimlb_config::service::ServiceKey;
use swimlb_control_plane::test_plane::TestPlane;
use swimlb_speaker::gossip::Timing;
use swimlb_speaker::model::election::Election;
use swimlb_speaker::model::membership::{LiveSet, MemberMeta};
use swimlb_speaker::model::snapshot::{ServedIp, Snapshot};
use swimlb_speaker::sources::kubernetes::records::record_name;
use swimlb_speaker::sources::kubernetes::run::{Settings, run};
use swimlb_speaker::sources::kubernetes::snapshot::Options;
use tokio::sync::oneshot;
use tokio::time::Instant;

const NS: &str = "swimlb-system";
const VIP: &str = "198.51.100.100";

fn seed(api: &TestPlane) {
    let objects = vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}),
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-b"}}),
        json!({"apiVersion": "swimlb.io/v1beta1", "kind": "IPAddressPool",
            "metadata": {"name": "lab", "namespace": NS},
            "spec": {"addresses": ["198.51.100.100/30"]}}),
        json!({"apiVersion": "swimlb.io/v1beta1", "kind": "L2Advertisement",
            "metadata": {"name": "all", "namespace": NS}, "spec": {}}),
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}],
                "selector": {"app": "web"}}}),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-1", "namespace": "default",
                "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["203.0.113.10"], "nodeName": "node-a",
                "conditions": {"ready": true}}],
            "ports": [{"port": 8080, "protocol": "TCP"}]}),
        pod("node-a"),
        pod("node-b"),
    ];
    for object in objects {
        api.admin().create(object).expect("seeding the API server");
    }
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
        speaker_selector: "app.kubernetes.io/name=swimlb,app.kubernetes.io/component=speaker"
            .into(),
        options: Options::default(),
    }
}

/// The owner MetalLB's order names among `nodes` for the VIP.
fn metallb_owner(nodes: &[&str]) -> String {
    let mut live = LiveSet::new();
    for n in nodes {
        let mut m = MemberMeta::new(*n);
        m.settled = true;
        live.upsert(m);
    }
    let ip: IpAddr = VIP.parse().unwrap();
    let snapshot = Snapshot::from_entries([(ip, ServedIp::service("default", "web"))]).unwrap();
    Election::new(nodes[0], snapshot, &live)
        .owner(&ip)
        .unwrap()
        .to_string()
}

/// The node the record of default/web names, if there is one.
fn record_node(api: &TestPlane) -> Option<String> {
    let name = record_name(&ServiceKey::new("default", "web"));
    api.admin()
        .get("swimlb.io/v1beta1", "ServiceL2Status", Some(NS), &name)
        .ok()??["status"]["node"]
        .as_str()
        .map(str::to_string)
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

#[test]
#[ignore = "needs root: network namespaces and packet sockets"]
fn two_kubernetes_speakers_elect_metallbs_owner_record_it_and_fail_over_without_the_api_server() {
    require_root();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
    let lab = Lab::new('k');
    let (b, veth_b) = (lab.b.clone(), lab.veth_b.clone());
    let expected = metallb_owner(&["node-a", "node-b"]);
    let other = if expected == "node-a" {
        "node-b"
    } else {
        "node-a"
    };
    let ips: BTreeMap<&str, &str> = [("node-a", "127.0.0.2"), ("node-b", "127.0.0.3")].into();
    let (owner_ip, other_ip) = (ips[expected.as_str()].to_string(), ips[other].to_string());
    let other = other.to_string();
    let owner = expected.clone();
    let report = lab.run_in_a(move || async move {
        let mut api = TestPlane::start_async("kubernetes-netns").await;
        seed(&api);
        // The controller's part: the Service holds the VIP.
        let client = api.client().await;
        let services: kube::Api<k8s_openapi::api::core::v1::Service> =
            kube::Api::namespaced(client, "default");
        let status = json!({"status": {"loadBalancer": {"ingress": [{"ip": VIP}]}}});
        services
            .patch_status(
                "web",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&status),
            )
            .await
            .expect("the Service's ingress");
        // The kubelet's part: the speaker Pods' IPs (a create keeps no status).
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(api.client().await, NS);
        for (node, ip) in [("node-a", "127.0.0.2"), ("node-b", "127.0.0.3")] {
            let status = json!({"status": {"podIP": ip}});
            pods.patch_status(
                &format!("speaker-{node}"),
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&status),
            )
            .await
            .expect("the Pod's IP");
        }
        let mut stops = BTreeMap::new();
        let mut tasks = BTreeMap::new();
        for (node, ip) in [
            (expected.clone(), owner_ip.clone()),
            (other.clone(), other_ip.clone()),
        ] {
            let (stop, stopped) = oneshot::channel::<()>();
            let client = api.client().await;
            let settings = settings(&node, &ip);
            tasks.insert(
                node.clone(),
                tokio::spawn(async move {
                    run(
                        settings,
                        client,
                        Box::pin(async move {
                            let _ = stopped.await;
                        }),
                    )
                    .await
                }),
            );
            stops.insert(node, stop);
        }
        let named = until(Duration::from_secs(15), || {
            record_node(&api).as_deref() == Some(&expected)
        })
        .await;
        let first = record_node(&api);
        let views = format!(
            "{:?}\n{:?}",
            http_status(&format!("{owner_ip}:7572")).await,
            http_status(&format!("{other_ip}:7572")).await
        );
        // kube's recorder writes events.k8s.io/v1 Events (`note`); core/v1 ones have `message`.
        let events: Vec<String> = [("events.k8s.io/v1", "Event"), ("v1", "Event")]
            .iter()
            .flat_map(|(version, kind)| api.admin().list(version, kind, None).unwrap_or_default())
            .filter(|e| e["reason"] == "nodeAssigned")
            .filter_map(|e| {
                // The Service's uid: `kubectl describe service` selects its Events by it.
                let about = if e["regarding"].is_null() {
                    &e["involvedObject"]
                } else {
                    &e["regarding"]
                };
                let note = e["note"].as_str().or(e["message"].as_str())?;
                Some(format!(
                    "{note} (uid {})",
                    about["uid"].as_str().unwrap_or("none")
                ))
            })
            .collect();
        let web_uid = api
            .admin()
            .list("v1", "Service", Some("default"))
            .unwrap_or_default()
            .into_iter()
            .find(|s| s["metadata"]["name"] == "web")
            .and_then(|s| s["metadata"]["uid"].as_str().map(str::to_string))
            .expect("the Service web has a uid");
        // The owner drains while the API server is away: the other takes over from gossip.
        api.stop_apiserver().expect("stopping the API server");
        let _ = stops.remove(&expected).unwrap().send(());
        let drained =
            tokio::time::timeout(Duration::from_secs(10), tasks.remove(&expected).unwrap()).await;
        let status_url = format!("{other_ip}:7572");
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut took_over = false;
        while !took_over && Instant::now() < deadline {
            took_over = http_status(&status_url).await.is_some_and(|s| {
                s["addresses"][0]["verdict"] == "owner"
                    && s["addresses"][0]["interfaces"]
                        .as_array()
                        .is_some_and(|l| !l.is_empty())
            });
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // On the wire: the client's ARP for the VIP is answered (arping blocks: off the runtime).
        let (b, veth_b) = (b.clone(), veth_b.clone());
        let answered = tokio::task::spawn_blocking(move || arp_answered(&b, &veth_b, VIP))
            .await
            .unwrap_or(false);
        api.start_apiserver()
            .expect("starting the API server again");
        let corrected = until(Duration::from_secs(15), || {
            record_node(&api).as_deref() == Some(&other)
        })
        .await;
        for (_, stop) in stops {
            let _ = stop.send(());
        }
        for (_, task) in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
        (
            named,
            (first, views),
            (events, web_uid),
            drained.is_ok(),
            took_over,
            answered,
            corrected,
        )
    });
    let (named, first, (events, web_uid), drained, took_over, answered, corrected) = report;
    assert!(
        named,
        "the record never named {owner} (MetalLB's owner): {first:?}"
    );
    assert!(
        events.iter().any(|n| n.contains("announcing from node")),
        "no nodeAssigned event: {events:?}"
    );
    assert!(
        events
            .iter()
            .all(|n| n.ends_with(&format!("(uid {web_uid})"))),
        "a nodeAssigned Event without the Service's uid {web_uid}: {events:?}"
    );
    assert!(drained, "the draining speaker did not stop");
    assert!(
        took_over,
        "the other speaker did not take the IP over while the API server was away"
    );
    assert!(answered, "nobody answers ARP for {VIP} after the takeover");
    assert!(
        corrected,
        "the record was not corrected once the API server was back"
    );
}

/// `/status` of a speaker (plain HTTP/1.1; the speakers serve on the same runtime).
async fn http_status(addr: &str) -> Option<Value> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        stream
            .write_all(b"GET /status HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await.ok()?;
        let body = text.split("\r\n\r\n").nth(1)?;
        serde_json::from_str(body).ok()
    };
    tokio::time::timeout(Duration::from_secs(1), fetch)
        .await
        .ok()?
}
