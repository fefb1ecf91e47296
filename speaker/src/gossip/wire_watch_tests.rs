//! The wire rule on the owner watch's datagrams: [`WatchCore`]s on a virtual clock, datagrams
//! passed by hand. An owner's heartbeats go out in version 3, bound to its watcher's watch
//! address, once the mesh speaks 3, in version 2 before; either opens at the watcher; a
//! version-3 heartbeat replayed to a third node is dropped as `wrong_receiver`.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use smol_str::SmolStr;
use swimlb_proto::KeyRing;
use swimlb_proto::envelope::Versions;
use swimlb_proto::heartbeat::MessageType;

use super::replay::sender_id;
use super::wire_rule::WireRule;
use super::{Directory, NodeIdentity, Outgoing};
use crate::model::watch_knobs::Knobs;
use crate::owner_watch::core::{Command, Plan, WatchCore, watch_addr};
use crate::owner_watch::{DropReason, WatchMetrics};

fn ring() -> KeyRing {
    KeyRing::new("wire-watch", &[[5; 32]]).unwrap()
}

fn id(i: usize) -> NodeIdentity {
    NodeIdentity {
        node: SmolStr::new(format!("w{i}")),
        addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 21_000 + 2 * i as u16)),
        bump: 10,
    }
}

/// The watch of node `i` of three, sealing and opening through `rule`.
fn watch(i: usize, rule: &WireRule) -> WatchCore {
    let directory: Directory = Arc::new(
        (0..3)
            .filter(|j| *j != i)
            .map(|j| (id(j).node.to_string(), id(j)))
            .collect(),
    );
    let plan = Plan {
        me: id(i),
        watchers: if i == 0 { vec!["w1".into()] } else { vec![] },
        held: false,
        accused: BTreeMap::new(),
    };
    let mut core = WatchCore::new(
        Knobs::default(),
        ring(),
        watch_addr(id(i).addr).unwrap(),
        plan.clone(),
        directory,
        WatchMetrics::default(),
        i as u64,
        Duration::from_secs(1),
    )
    .unwrap();
    core.set_wire_rule(rule.clone());
    core.command(Duration::from_secs(1), Command::Plan(plan));
    core
}

/// Runs the owner's timers for a second and returns the heartbeats it sent to node 1.
fn heartbeats_to_one(owner: &mut WatchCore) -> Vec<Outgoing> {
    let mut now = Duration::from_secs(1);
    let mut out = Vec::new();
    while now < Duration::from_secs(2) {
        now += Duration::from_millis(1);
        if owner.next_deadline().is_some_and(|at| at <= now) {
            owner.tick(now);
        }
        out.extend(owner.drain_outgoing());
    }
    let to = watch_addr(id(1).addr).unwrap();
    out.retain(|o| o.to == to);
    assert!(out.len() >= 5, "heartbeats to node 1: {}", out.len());
    out
}

/// Every member announces `announced` in node 0's view.
fn rule_of_node_zero(announced: Versions) -> WireRule {
    let rule = WireRule::default();
    rule.update([1, 2].map(|j| (id(j).addr, id(j).bump, announced)));
    rule
}

#[test]
fn an_owner_seals_its_heartbeats_version_three_once_the_mesh_speaks_it_and_two_before() {
    for (announced, version) in [(Versions::NONE, 2), (Versions::THIS_BUILD, 3)] {
        let mut owner = watch(0, &rule_of_node_zero(announced));
        let mut watcher = watch(1, &WireRule::default());
        let from = watch_addr(id(0).addr).unwrap();
        for mut beat in heartbeats_to_one(&mut owner) {
            assert_eq!(beat.bytes[4], version, "announced {announced:?}");
            watcher.handle_datagram(Duration::from_secs(2), from, &mut beat.bytes);
        }
        let metrics = watcher.metrics();
        assert!(metrics.received_of(MessageType::Heartbeat) >= 5);
        for reason in DropReason::ALL {
            assert_eq!(metrics.drops(reason), 0, "{reason:?}, version {version}");
        }
    }
}

#[test]
fn a_heartbeat_captured_on_its_way_to_its_watcher_is_dropped_at_another_node() {
    let mut owner = watch(0, &rule_of_node_zero(Versions::THIS_BUILD));
    let mut third = watch(2, &WireRule::default());
    let from = watch_addr(id(0).addr).unwrap();
    let beats = heartbeats_to_one(&mut owner);
    let receiver = sender_id(watch_addr(id(1).addr).unwrap());
    for mut beat in beats.clone() {
        assert_eq!(
            beat.bytes[37..45],
            receiver.to_be_bytes(),
            "bound to node 1"
        );
        third.handle_datagram(Duration::from_secs(2), from, &mut beat.bytes);
    }
    let metrics = third.metrics();
    assert_eq!(metrics.drops(DropReason::WrongReceiver), beats.len() as u64);
    assert_eq!(metrics.drops(DropReason::Unauthentic), 0);
    assert_eq!(metrics.received_of(MessageType::Heartbeat), 0);
}

#[test]
fn a_watch_with_the_previous_behaviour_refuses_version_three_as_unauthentic() {
    let mut owner = watch(0, &rule_of_node_zero(Versions::THIS_BUILD));
    let mut old = watch(1, &WireRule::new(Versions::PREVIOUS));
    let from = watch_addr(id(0).addr).unwrap();
    let beats = heartbeats_to_one(&mut owner);
    for mut beat in beats.clone() {
        old.handle_datagram(Duration::from_secs(2), from, &mut beat.bytes);
    }
    // What the previous release counts: it cannot open version 3 at all. The rule never seals
    // version 3 to it (it announces nothing): this is what would happen without the rule.
    assert_eq!(
        old.metrics().drops(DropReason::Unauthentic),
        beats.len() as u64
    );
}
