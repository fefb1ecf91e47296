//! Three real gossip drivers over UDP on 127.0.0.1: they join, share metadata, and see a
//! graceful leave. Waits are bounded; nothing asserts on wall-clock speed.

use std::time::Duration;

use prometheus_client::registry::Registry;
use swimlb_proto::KeyRing;
use swimlb_speaker::gossip::{GossipHandle, GossipMetrics, GossipSettings, Timing, spawn};
use swimlb_speaker::model::membership::{LiveChange, LiveSet, MemberMeta};

const KEY: [u8; 32] = [42; 32];

async fn start(
    name: &str,
    seeds: Vec<std::net::SocketAddr>,
    registry: &mut Registry,
) -> GossipHandle {
    let bind = "127.0.0.1:0".parse().unwrap();
    let settings = GossipSettings {
        node: name.to_string(),
        addr: bind,
        seeds,
        timing: Timing::fast(),
        bump: 1,
        rng_seed: 7,
    };
    spawn(
        settings,
        bind,
        KeyRing::new("udp-test", &[KEY]).unwrap(),
        MemberMeta::new(name),
        GossipMetrics::register(registry),
    )
    .await
    .unwrap()
}

async fn wait_for(handle: &GossipHandle, what: &str, check: impl Fn(&LiveSet) -> bool) {
    let mut live = handle.live();
    let waited = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if check(&live.borrow_and_update()) {
                return true;
            }
            if live.changed().await.is_err() {
                return false;
            }
        }
    })
    .await;
    assert!(waited.is_ok(), "timed out waiting for {what}");
    assert_eq!(
        waited,
        Ok(true),
        "the gossip task stopped while waiting for {what}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_drivers_over_udp_join_share_metadata_and_see_a_leave() {
    let mut registry = Registry::default();
    let a = start("a", vec![], &mut registry).await;
    let seed = a.local_addr();
    let b = start("b", vec![seed], &mut Registry::default()).await;
    let c = start("c", vec![seed], &mut Registry::default()).await;
    for handle in [&a, &b, &c] {
        wait_for(handle, "three members", |live| live.len() == 3).await;
    }

    let mut meta = MemberMeta::new("c");
    meta.settled = true;
    c.set_meta(meta).await.unwrap();
    wait_for(&a, "c's new metadata", |live| {
        live.get("c").is_some_and(|m| m.settled && m.version == 2)
    })
    .await;

    // Rotate to a new key on every node, one node and one step at a time, with time between
    // them so nodes holding different rings exchange datagrams; nobody goes down.
    let next = [43u8; 32];
    let mut during_rotation = a.subscribe();
    for keys in [&[KEY, next][..], &[next, KEY][..], &[next][..]] {
        for handle in [&a, &b, &c] {
            let ring = KeyRing::new("udp-test", keys).unwrap();
            handle.set_key_ring(ring).await.unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    while let Ok(change) = during_rotation.try_recv() {
        assert!(
            !matches!(change, LiveChange::Down(_)),
            "a saw {change:?} during the rotation"
        );
    }
    for handle in [&a, &b, &c] {
        assert_eq!(
            handle.live().borrow().len(),
            3,
            "nobody went down during the rotation"
        );
    }

    let mut changes = a.subscribe();
    b.leave().await.unwrap();
    wait_for(&a, "b gone at a", |live| !live.contains("b")).await;
    wait_for(&c, "b gone at c", |live| !live.contains("b")).await;
    // The live set is published before the change that goes with it: wait for the change.
    let saw_down = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match changes.recv().await {
                Ok(LiveChange::Down(node)) if node == "b" => return true,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return false,
            }
        }
    })
    .await;
    assert_eq!(saw_down, Ok(true), "a reported b down on its change stream");

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(text.contains("swimlb_member_down_total 1"), "{text}");
    assert!(
        text.contains("swimlb_gossip_packets_total{direction=\"in\"}"),
        "{text}"
    );
    assert!(text.contains("swimlb_members{state=\"alive\"}"), "{text}");
    a.leave().await.unwrap();
    c.leave().await.unwrap();
}
