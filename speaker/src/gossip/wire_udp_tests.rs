//! The wire rule over real UDP on 127.0.0.1: a three-node mesh rolled node by node from the
//! previous release's behaviour (`WireRule::new(Versions::PREVIOUS)`: seals and opens version 2
//! only, announces nothing) to this build's and back, and datagrams captured on their way to one
//! node replayed to another. Waits are bounded and wait for states; nothing asserts on
//! wall-clock speed.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use swimlb_proto::KeyRing;
use swimlb_proto::envelope::{Addressing, Versions};
use tokio::net::UdpSocket;
use tokio::time::Instant;

use super::core::{Core, GossipSettings};
use super::driver::{GossipHandle, spawn_with_rule};
use super::metrics::{GossipMetrics, RejectReason};
use super::timing::Timing;
use super::wire_rule::WireRule;
use crate::model::membership::MemberMeta;

const KEY: [u8; 32] = [78; 32];
const CLUSTER: &str = "wire-udp";

fn ring() -> KeyRing {
    KeyRing::new(CLUSTER, &[KEY]).unwrap()
}

fn settings(node: &str, addr: SocketAddr, seeds: Vec<SocketAddr>, bump: u64) -> GossipSettings {
    GossipSettings {
        node: node.to_string(),
        addr,
        seeds,
        timing: Timing::fast(),
        bump,
        rng_seed: bump ^ u64::from(addr.port()),
    }
}

/// A free port on 127.0.0.1, for a node that restarts on its address.
fn free_addr() -> SocketAddr {
    let probe = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    probe.local_addr().unwrap()
}

/// One speaker of the test: its handle, metrics and whether it runs the previous release's
/// behaviour.
struct Node {
    handle: GossipHandle,
    metrics: GossipMetrics,
    previous: bool,
}

async fn start(
    node: &str,
    addr: SocketAddr,
    seeds: &[SocketAddr],
    bump: u64,
    previous: bool,
) -> Node {
    let rule = if previous {
        WireRule::new(Versions::PREVIOUS)
    } else {
        WireRule::default()
    };
    let metrics = GossipMetrics::default();
    // A restarted node binds the address its previous life just released: retry briefly.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match spawn_with_rule(
            settings(node, addr, seeds.to_vec(), bump),
            addr,
            ring(),
            MemberMeta::new(node),
            metrics.clone(),
            rule.clone(),
        )
        .await
        {
            Ok(handle) => {
                return Node {
                    handle,
                    metrics,
                    previous,
                };
            }
            Err(err) if Instant::now() < deadline => {
                tracing::debug!(error = %err, "rebinding");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(err) => panic!("{node} cannot bind {addr}: {err}"),
        }
    }
}

/// Waits (bounded) until `check` holds, polling; fails with `what` and what `seen` says.
async fn wait_until(what: &str, check: impl Fn() -> bool, seen: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !check() {
        assert!(
            Instant::now() < deadline,
            "waiting for {what}; saw {}",
            seen()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether every node holds all three alive with their records, and each node running this
/// build's rule sees the mesh at `version` and shows it in its metrics.
fn converged(nodes: &[Node], version: u8) -> bool {
    nodes.iter().all(|n| {
        let live = n.handle.live();
        let live = live.borrow();
        let full = live.len() == 3 && live.iter().all(|m| m.version >= 1);
        let shown = n.metrics.envelope_version() == i64::from(version);
        full && (n.previous || (n.handle.wire_rule().mesh_version() == version && shown))
    })
}

fn describe(nodes: &[Node]) -> String {
    nodes
        .iter()
        .map(|n| {
            let live = n.handle.live();
            let live = live.borrow();
            let members: Vec<String> = live
                .iter()
                .map(|m| format!("{}@v{}{:?}", m.node, m.version, m.wire))
                .collect();
            format!(
                "[previous {} mesh {} (metric {}) members {members:?}]",
                n.previous,
                n.handle.wire_rule().mesh_version(),
                n.metrics.envelope_version()
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Datagrams one node could not open because of the version or the binding: none may appear in
/// a mesh that follows the rule.
fn refusals(metrics: &GossipMetrics) -> u64 {
    [
        "unsupported_version",
        "wrong_receiver",
        "authentication_failed",
    ]
    .into_iter()
    .map(|r| metrics.rejected_count(RejectReason::Envelope(r)))
    .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mesh_rolled_node_by_node_across_the_envelope_version_stays_one_mesh() {
    let addrs = [free_addr(), free_addr(), free_addr()];
    let names = ["roll-1", "roll-2", "roll-3"];
    let mut bump = 1_000;
    let mut nodes = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        nodes.push(start(names[i], *addr, &addrs[..i.max(1)], bump, true).await);
    }
    wait_until(
        "the previous release's mesh",
        || converged(&nodes, 2),
        || describe(&nodes),
    )
    .await;
    // (step, node restarted, restarted with the previous behaviour, the mesh's version after)
    let steps = [
        ("upgrade node 1", 0, false, 2),
        ("upgrade node 2", 1, false, 2),
        ("upgrade node 3", 2, false, 3),
        ("roll node 2 back", 1, true, 2),
        ("upgrade node 2 again", 1, false, 3),
    ];
    let mut previous_lives = Vec::new();
    for (step, i, previous, version) in steps {
        let old = nodes.remove(i);
        old.handle.leave().await.unwrap();
        previous_lives.push(old.metrics);
        // The others have let the leaver go (so none still holds its address bound).
        wait_until(
            &format!("{step}: the others without it"),
            || nodes.iter().all(|n| n.handle.live().borrow().len() == 2),
            || describe(&nodes),
        )
        .await;
        bump += 1;
        let seeds: Vec<SocketAddr> = addrs.iter().copied().filter(|a| *a != addrs[i]).collect();
        nodes.insert(i, start(names[i], addrs[i], &seeds, bump, previous).await);
        wait_until(
            &format!("{step}: one mesh at version {version}"),
            || converged(&nodes, version),
            || describe(&nodes),
        )
        .await;
    }
    // At version 3 the datagrams between members are bound to their receivers.
    let rule = nodes[0].handle.wire_rule();
    assert_eq!(
        rule.addressing(addrs[2]),
        Addressing::V3 {
            receiver: super::replay::sender_id(addrs[2])
        }
    );
    for (i, n) in nodes.iter().enumerate() {
        assert_eq!(
            refusals(&n.metrics),
            0,
            "node {}: {}",
            i + 1,
            describe(&nodes)
        );
    }
    for (life, metrics) in previous_lives.iter().enumerate() {
        assert_eq!(refusals(metrics), 0, "stopped life {life}");
    }
    for n in nodes {
        n.handle.leave().await.unwrap();
    }
}

/// What the test-driven member received: (source, bytes as received).
type Recorded = Arc<Mutex<Vec<(SocketAddr, Vec<u8>)>>>;

/// Runs a member of this build named `node` on `socket`, recording every datagram it receives.
async fn recording_member(socket: UdpSocket, seeds: Vec<SocketAddr>, recorded: Recorded) {
    let origin = Instant::now();
    let addr = socket.local_addr().unwrap();
    let rule = WireRule::default();
    let mut meta = MemberMeta::new("tapped");
    meta.wire = rule.announcement();
    let mut core = Core::new(
        settings("tapped", addr, seeds, 1),
        ring(),
        meta,
        GossipMetrics::default(),
        Duration::ZERO,
    )
    .unwrap();
    core.set_wire_rule(rule.clone());
    let mut buf = vec![0u8; 9000];
    loop {
        for out in core.drain_outgoing().collect::<Vec<_>>() {
            let _ = socket.send_to(&out.bytes, out.to).await;
        }
        if core.drain_changes().count() > 0 {
            let live = core.live();
            rule.update(core.member_identities().map(|id| {
                (
                    id.addr,
                    id.bump,
                    live.get(&id.node).map(|m| m.wire).unwrap_or_default(),
                )
            }));
        }
        let deadline = core
            .next_deadline()
            .map_or(Instant::now() + Duration::from_secs(1), |at| origin + at);
        tokio::select! {
            received = socket.recv_from(&mut buf) => {
                let Ok((len, from)) = received else { continue };
                recorded.lock().unwrap().push((from, buf[..len].to_vec()));
                core.handle_datagram(origin.elapsed(), from, &mut buf[..len]);
            }
            () = tokio::time::sleep_until(deadline) => core.handle_due_timers(origin.elapsed()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datagrams_captured_on_their_way_to_one_node_do_not_open_at_another() {
    let (a_addr, b_addr) = (free_addr(), free_addr());
    let a = start("a", a_addr, &[], 1, false).await;
    let b = start("b", b_addr, &[a_addr], 2, false).await;
    let tap = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let tap_addr = tap.local_addr().unwrap();
    let recorded = Recorded::default();
    let member = tokio::spawn(recording_member(tap, vec![a_addr], recorded.clone()));
    let nodes = [a, b];
    let sees_three = |n: &Node| {
        let live = n.handle.live();
        let live = live.borrow();
        live.len() == 3 && live.iter().all(|m| m.version >= 1)
    };
    wait_until(
        "a mesh of three at version 3",
        || {
            nodes
                .iter()
                .all(|n| sees_three(n) && n.handle.wire_rule().mesh_version() == 3)
        },
        || describe(&nodes),
    )
    .await;
    // What a sends the tapped member from now on is version 3, bound to the tapped member.
    recorded.lock().unwrap().clear();
    wait_until(
        "version-3 datagrams from a to the tapped member",
        || {
            recorded
                .lock()
                .unwrap()
                .iter()
                .filter(|(from, d)| *from == a_addr && d[4] == 3)
                .count()
                >= 10
        },
        || format!("{} recorded", recorded.lock().unwrap().len()),
    )
    .await;
    let captured: Vec<Vec<u8>> = recorded
        .lock()
        .unwrap()
        .iter()
        .filter(|(from, d)| *from == a_addr && d[4] == 3)
        .map(|(_, d)| d.clone())
        .collect();
    // Replayed to b, from an address nobody knows: every one refused as sealed for another
    // receiver, none as a replay (b never saw them), none opened.
    let [_, b] = &nodes;
    let before = b
        .metrics
        .rejected_count(RejectReason::Envelope("wrong_receiver"));
    assert_eq!(before, 0);
    let attacker = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    for d in &captured {
        attacker.send_to(d, b_addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let expected = captured.len() as u64;
    wait_until(
        "every captured datagram refused at b",
        || {
            b.metrics
                .rejected_count(RejectReason::Envelope("wrong_receiver"))
                >= expected
        },
        || {
            format!(
                "{} of {expected}",
                b.metrics
                    .rejected_count(RejectReason::Envelope("wrong_receiver"))
            )
        },
    )
    .await;
    assert_eq!(
        b.metrics
            .rejected_count(RejectReason::Envelope("wrong_receiver")),
        expected
    );
    assert_eq!(b.metrics.rejected_count(RejectReason::Replay), 0);
    assert_ne!(tap_addr, b_addr);
    member.abort();
    for n in nodes {
        n.handle.leave().await.unwrap();
    }
}
