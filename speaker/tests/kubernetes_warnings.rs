//! Bad input in the Kubernetes mode gets a Warning Event on the offending object, once: an
//! `L2Advertisement` with an invalid selector (from the first live member, once the mesh has
//! formed) and one naming an interface this node does not have (from this node). Both are
//! counted in `swimlb_snapshot_dropped`; a change elsewhere in the configuration (a Node
//! added, which resolves every advertisement again) writes no second Event.
//!
//! The speaker (`kubernetes::run::run`, what `swimlb-speaker kubernetes` runs) serves nothing
//! here, so it needs no root: its gossip binds a free port of 127.0.0.1.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use swimlb_control_plane::test_plane::TestPlane;
use swimlb_speaker::gossip::Timing;
use swimlb_speaker::sources::kubernetes::run::{Settings, run};
use swimlb_speaker::sources::kubernetes::snapshot::Options;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

const NS: &str = "swimlb-system";

fn free_port() -> u16 {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("a free port");
    socket.local_addr().expect("its address").port()
}

/// A TCP port free now (the HTTP listener's: a free UDP port may be a TCP port in use).
fn free_tcp_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
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

/// The speaker's Warning Events: (reason, regarding kind/name, note).
fn warnings(api: &TestPlane) -> Vec<(String, String, String)> {
    let mut all: Vec<(String, String, String)> = api
        .admin()
        .list("events.k8s.io/v1", "Event", None)
        .unwrap_or_default()
        .iter()
        .filter(|e| e["type"] == "Warning" && e["reportingController"] == "swimlb-speaker")
        .map(|e: &Value| {
            let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (
                text(&e["reason"]),
                format!(
                    "{}/{}",
                    text(&e["regarding"]["kind"]),
                    text(&e["regarding"]["name"])
                ),
                text(&e["note"]),
            )
        })
        .collect();
    all.sort();
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_advertisement_and_an_unknown_interface_get_one_warning_event_each() {
    let api = TestPlane::start_async("warnings").await;
    for object in [
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}),
        json!({"apiVersion": "swimlb.io/v1beta1", "kind": "IPAddressPool",
            "metadata": {"name": "lab", "namespace": NS},
            "spec": {"addresses": ["198.51.100.100/30"]}}),
        json!({"apiVersion": "swimlb.io/v1beta1", "kind": "L2Advertisement",
            "metadata": {"name": "bad", "namespace": NS},
            "spec": {"nodeSelectors": [{"matchExpressions": [{"key": "zone", "operator": "Bogus"}]}]}}),
        json!({"apiVersion": "swimlb.io/v1beta1", "kind": "L2Advertisement",
            "metadata": {"name": "elsewhere", "namespace": NS},
            "spec": {"interfaces": ["swimlb-absent0"]}}),
    ] {
        api.admin().create(object).expect("seeding");
    }
    let listen = SocketAddr::from(([127, 0, 0, 1], free_tcp_port()));
    let settings = Settings {
        node: "node-a".into(),
        namespace: NS.into(),
        bind: SocketAddr::from(([127, 0, 0, 1], free_port())),
        cluster: "warnings".into(),
        key_file: None,
        listen,
        timing: Timing::fast(),
        preempt_delay: Duration::ZERO,
        speaker_selector: "app.kubernetes.io/component=speaker".into(),
        options: Options::default(),
    };
    let client = api.client().await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let speaker = tokio::spawn(run(
        settings,
        client,
        Box::pin(async move {
            let _ = stopped.await;
        }),
    ));
    // The first live member warns once the start-up hold is over (3 s alone).
    let deadline = Instant::now() + Duration::from_secs(20);
    while warnings(&api).len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let first = warnings(&api);
    // A speaker that stopped on its own (it could not listen, say) says why in the failure.
    let ended_early = speaker.is_finished();
    let metrics = get(listen, "/metrics").await.unwrap_or_default();
    // Another Node: every advertisement is resolved again; nothing new to say.
    api.admin()
        .create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-b"}}))
        .expect("another Node");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let later = warnings(&api);
    let _ = stop.send(());
    let result = tokio::time::timeout(Duration::from_secs(10), speaker).await;

    assert_eq!(
        first.len(),
        2,
        "{first:?} (the speaker ended before the warnings were read: {ended_early}, with {result:?})"
    );
    let (reason, object, note) = &first[0];
    assert_eq!(
        (reason.as_str(), object.as_str()),
        ("InvalidConfiguration", "L2Advertisement/bad")
    );
    assert!(note.contains("the advertisement is ignored"), "{note}");
    let (reason, object, note) = &first[1];
    assert_eq!(
        (reason.as_str(), object.as_str()),
        ("UnknownInterface", "L2Advertisement/elsewhere")
    );
    assert!(
        note.contains("\"swimlb-absent0\"") && note.contains("\"node-a\""),
        "{note}"
    );
    for line in [
        "swimlb_snapshot_dropped{reason=\"invalid_advertisement\"} 1",
        "swimlb_snapshot_dropped{reason=\"unknown_interface\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
    assert_eq!(later, first, "no second Event for the same problem");
}
