//! Deterministic tests of the gossip core over the simulated network: seeded RNG, virtual clock.

use std::time::Duration;

use swimlb_proto::KeyRing;

use super::core::{Core, GossipSettings, Phase, WATCH_EVIDENCE_MAX};
use super::identity::NodeIdentity;
use super::metrics::{GossipMetrics, RejectReason, SuspicionOutcome};
use super::simnet::{Links, SimNet, Tapped};
use super::timing::Timing;
use crate::model::membership::{LiveChange, MemberMeta};

const K1: [u8; 32] = [1; 32];
const K2: [u8; 32] = [2; 32];
const K9: [u8; 32] = [9; 32];

fn name(i: usize) -> String {
    format!("node-{i}")
}

fn ring(keys: &[[u8; 32]]) -> KeyRing {
    KeyRing::new("test-cluster", keys).unwrap()
}

fn core_with(net: &SimNet, i: usize, bump: u64, keys: &[[u8; 32]], timing: Timing) -> Core {
    let settings = GossipSettings {
        node: name(i),
        addr: SimNet::addr(i),
        seeds: vec![SimNet::addr(0)],
        timing,
        bump,
        rng_seed: 1000 + i as u64 + bump,
    };
    Core::new(
        settings,
        ring(keys),
        MemberMeta::new(name(i)),
        GossipMetrics::default(),
        net.now(),
    )
    .unwrap()
}

fn cluster(n: usize, seed: u64, links: Links) -> SimNet {
    let mut net = SimNet::new(seed, links);
    for i in 0..n {
        let core = core_with(&net, i, 1, &[K1], Timing::fast());
        net.start(i, core);
    }
    net.run_for(Duration::from_secs(3));
    for i in 0..n {
        assert_eq!(live_len(&net, i), n, "node {i} sees everyone after joining");
    }
    net.drain_changes().for_each(drop);
    net
}

fn live_len(net: &SimNet, i: usize) -> usize {
    net.core(i).map_or(0, |c| c.live().len())
}

/// Runs in 10 ms steps until `done` holds or `limit` passes; returns the time it took.
fn run_until(
    net: &mut SimNet,
    limit: Duration,
    mut done: impl FnMut(&SimNet) -> bool,
) -> Option<Duration> {
    let start = net.now();
    while net.now() - start <= limit {
        if done(net) {
            return Some(net.now() - start);
        }
        net.run_for(Duration::from_millis(10));
    }
    None
}

fn downs_of(net: &mut SimNet, node: &str) -> Vec<usize> {
    net.drain_changes()
        .filter(|(_, _, c)| *c == LiveChange::Down(node.to_string()))
        .map(|(_, i, _)| i)
        .collect()
}

#[test]
fn crashed_member_is_marked_down_by_every_survivor_within_a_second() {
    let mut net = cluster(5, 7, Links::default());
    net.crash(3);
    let took = run_until(&mut net, Duration::from_secs(5), |net| {
        [0, 1, 2, 4]
            .iter()
            .all(|&i| !net.core(i).unwrap().live().contains(&name(3)))
    });
    let took = took.expect("every survivor marks the crashed member down");
    assert!(took <= Duration::from_secs(1), "detection took {took:?}");
    let mut seen = downs_of(&mut net, &name(3));
    seen.sort_unstable();
    assert_eq!(seen, vec![0, 1, 2, 4]);
}

#[test]
fn an_unconfirmed_suspicion_lasts_its_shortest_up_to_four_members_and_its_longest_from_five() {
    // A paused node waits this long (plus a probe period) for a "you are down" before it
    // answers again: it must be what the members' suspicions of it last.
    let timing = Timing::fast();
    let shortest = timing.suspect_to_down_after;
    let longest = shortest * timing.suspicion_max_mult;
    for (n, want) in [(3, shortest), (4, shortest), (5, longest)] {
        let net = cluster(n, 11, Links::default());
        for i in 0..n {
            let got = net.core(i).unwrap().unconfirmed_suspicion();
            assert_eq!(got, want, "node {i} of {n}");
        }
    }
}

#[test]
fn suspicion_alone_does_not_remove_a_member_under_loss() {
    let links = Links {
        loss: 0.05,
        ..Links::default()
    };
    let mut net = cluster(5, 11, links);
    net.run_for(Duration::from_secs(60));
    let false_downs = net
        .drain_changes()
        .filter(|(_, _, c)| matches!(c, LiveChange::Down(_)))
        .count();
    assert_eq!(false_downs, 0);
    for i in 0..5 {
        assert_eq!(live_len(&net, i), 5);
    }
}

#[test]
fn graceful_leave_is_seen_by_every_member_at_once() {
    let mut net = cluster(5, 3, Links::default());
    net.with_core(2, |core, now| core.leave(now));
    assert_eq!(net.core(2).unwrap().phase(), Phase::Left);
    let took = run_until(&mut net, Duration::from_secs(2), |net| {
        [0, 1, 3, 4]
            .iter()
            .all(|&i| !net.core(i).unwrap().live().contains(&name(2)))
    })
    .expect("every member sees the leave");
    // Far below a probe period plus suspicion: the leave is gossiped, not detected.
    assert!(took <= Duration::from_millis(100), "leave took {took:?}");
}

#[test]
fn partition_heals_into_one_membership() {
    let mut net = cluster(6, 5, Links::default());
    for i in 3..6 {
        net.set_group(i, 1);
    }
    net.run_for(Duration::from_secs(5));
    for i in 0..6 {
        assert_eq!(live_len(&net, i), 3, "node {i} sees only its side");
    }
    net.heal();
    // Merged when every node sees all six with their real records (no placeholder left).
    let healed = run_until(&mut net, Duration::from_secs(30), |net| {
        (0..6).all(|i| {
            let live = net.core(i).unwrap().live();
            live.len() == 6 && live.iter().all(|m| m.version >= 1)
        })
    });
    assert!(healed.is_some(), "both sides merge again without help");
    // Everyone agrees on the same members and metadata.
    let first: Vec<_> = net.core(0).unwrap().live().iter().cloned().collect();
    for i in 1..6 {
        let other: Vec<_> = net.core(i).unwrap().live().iter().cloned().collect();
        assert_eq!(first, other, "node {i} holds the same live set");
    }
}

#[test]
fn keys_rotate_without_a_member_going_down() {
    let mut net = cluster(3, 13, Links::default());
    // One node at a time: k2 seals (rings [k2, k1] and [k1] interoperate, because a node answers
    // a peer with the key the peer used), then k1 is dropped.
    for keys in [&[K2, K1][..], &[K2][..]] {
        for i in 0..3 {
            net.with_core(i, |core, _| core.set_key_ring(ring(keys)));
            net.run_for(Duration::from_secs(2));
        }
    }
    let downs = net
        .drain_changes()
        .filter(|(_, _, c)| matches!(c, LiveChange::Down(_)))
        .count();
    assert_eq!(downs, 0);
    for i in 0..3 {
        assert_eq!(live_len(&net, i), 3);
    }
    // A node still on the retired key alone cannot join, and is counted.
    let stale = core_with(&net, 3, 1, &[K1], Timing::fast());
    net.start(3, stale);
    net.run_for(Duration::from_secs(3));
    assert_eq!(live_len(&net, 3), 1);
    assert!(!net.core(0).unwrap().live().contains(&name(3)));
    let unknown = net
        .core(0)
        .unwrap()
        .metrics()
        .rejected_count(RejectReason::Envelope("unknown_key"));
    assert!(unknown > 0);
}

#[test]
fn the_readmes_three_step_rotation_refuses_no_datagram() {
    // docs/src/install/upgrade.md, "Rotating the gossip key": the new key second everywhere, then first everywhere, then the old
    // one dropped; each step reaches the nodes one after another (a kubelet updates a mounted
    // Secret on each node at its own time). No datagram may be refused (a refusal fires the
    // SwimlbGossipRejected alert), with loss and reordering, whatever the cluster's size.
    let links = Links {
        loss: 0.05,
        delay_min: Duration::from_micros(200),
        delay_max: Duration::from_millis(3),
    };
    for seed in 1..9u64 {
        let n = 3 + (seed as usize % 4);
        let mut net = cluster(n, seed, links);
        for keys in [&[K1, K2][..], &[K2, K1][..], &[K2][..]] {
            for i in 0..n {
                net.with_core(i, |core, _| core.set_key_ring(ring(keys)));
                net.run_for(Duration::from_secs(2));
            }
        }
        let downs = net
            .drain_changes()
            .filter(|(_, _, c)| matches!(c, LiveChange::Down(_)))
            .count();
        assert_eq!(downs, 0, "seed {seed}, {n} nodes");
        for i in 0..n {
            let metrics = net.core(i).unwrap().metrics();
            for reason in ["unknown_key", "authentication_failed"] {
                assert_eq!(
                    metrics.rejected_count(RejectReason::Envelope(reason)),
                    0,
                    "seed {seed}, {n} nodes, node {i}: {reason}"
                );
            }
        }
    }
}

#[test]
fn a_node_that_starts_with_the_new_key_first_joins_seeds_that_hold_only_the_old_key() {
    // A rotation in progress: the cluster still holds [k1], a node (re)starts with [k2, k1].
    // Its announces to the seed go out once per key, so the seed opens the k1 copy and both
    // sides go on with the key they share.
    let mut net = cluster(3, 19, Links::default());
    let newcomer = core_with(&net, 3, 1, &[K2, K1], Timing::fast());
    net.start(3, newcomer);
    let joined = run_until(&mut net, Duration::from_secs(5), |net| {
        (0..4).all(|i| live_len(net, i) == 4)
    });
    assert!(
        joined.is_some(),
        "every node sees the newcomer and it sees every node"
    );
    assert_eq!(net.core(3).unwrap().phase(), Phase::Active);
    net.run_for(Duration::from_secs(3));
    let downs = net
        .drain_changes()
        .filter(|(_, _, c)| matches!(c, LiveChange::Down(_)))
        .count();
    assert_eq!(
        downs, 0,
        "the k2 copies the seeds cannot open cost no member"
    );
}

#[test]
fn node_with_a_wrong_key_never_joins_and_is_counted() {
    let mut net = cluster(3, 17, Links::default());
    let intruder = core_with(&net, 3, 1, &[K9], Timing::fast());
    net.start(3, intruder);
    net.run_for(Duration::from_secs(10));
    assert_eq!(live_len(&net, 3), 1, "the intruder only sees itself");
    assert_eq!(net.core(3).unwrap().phase(), Phase::Joining);
    for i in 0..3 {
        assert!(!net.core(i).unwrap().live().contains(&name(3)));
    }
    let rejected = net
        .core(0)
        .unwrap()
        .metrics()
        .rejected_count(RejectReason::Envelope("unknown_key"));
    // It keeps retrying its join (every 250 ms) and each attempt is counted.
    assert!(rejected >= 30, "rejected {rejected}");
}

#[test]
fn metadata_change_reaches_every_member_and_late_joiners_get_everyones_record() {
    let mut net = cluster(4, 19, Links::default());
    let mut meta = MemberMeta::new(name(1));
    meta.settled = true;
    net.with_core(1, |core, now| core.set_meta(now, meta))
        .unwrap()
        .unwrap();
    net.run_for(Duration::from_secs(1));
    for i in 0..4 {
        let seen = net.core(i).unwrap().live().get(&name(1)).cloned().unwrap();
        assert!(seen.settled, "node {i} sees the new record");
        assert_eq!(seen.version, 2);
    }
    let late = core_with(&net, 4, 1, &[K1], Timing::fast());
    net.start(4, late);
    net.run_for(Duration::from_secs(3));
    let view = net.core(4).unwrap().live();
    assert_eq!(view.len(), 5);
    assert!(view.iter().all(|m| m.version >= 1), "no placeholder left");
    assert!(view.get(&name(1)).unwrap().settled);
}

#[test]
fn restarted_member_comes_back_under_a_new_identity_with_fresh_metadata() {
    let mut net = cluster(4, 23, Links::default());
    let mut meta = MemberMeta::new(name(2));
    meta.settled = true;
    net.with_core(2, |core, now| core.set_meta(now, meta))
        .unwrap()
        .unwrap();
    net.run_for(Duration::from_secs(1));
    net.crash(2);
    net.run_for(Duration::from_secs(2));
    let restarted = core_with(&net, 2, 2, &[K1], Timing::fast());
    net.start(2, restarted);
    net.run_for(Duration::from_secs(3));
    for i in 0..4 {
        let seen = net.core(i).unwrap().live().get(&name(2)).cloned().unwrap();
        assert!(
            !seen.settled,
            "node {i} holds the restarted node's own record"
        );
        assert_eq!(seen.version, 1);
    }
}

#[test]
fn a_member_restarted_at_once_with_the_same_record_is_reported_renewed() {
    // A speaker killed and started again at once rejoins under a new identity at its address
    // before anyone declares it down: foca renames it. Its record equals its previous life's
    // (version 1, nothing set since), so no record change shows; the renewal is reported all
    // the same, or an accusation of the previous identity outlives it (Kubernetes chaos seed 1
    // at 1,535 s: the takers answered beside the restarted owner until it lapsed, 3.9 s).
    let mut net = cluster(3, 53, Links::default());
    net.crash(2);
    net.run_for(Duration::from_millis(50));
    let restarted = core_with(&net, 2, 2, &[K1], Timing::fast());
    net.start(2, restarted);
    net.run_for(Duration::from_secs(2));
    let changes: Vec<(usize, LiveChange)> = net.drain_changes().map(|(_, i, c)| (i, c)).collect();
    for i in 0..2 {
        let held = net
            .core(i)
            .unwrap()
            .member_identities()
            .find(|id| id.node == name(2));
        assert_eq!(
            held.map(|id| id.bump),
            Some(2),
            "node {i} holds the new identity"
        );
        let about: Vec<&LiveChange> = changes
            .iter()
            .filter(|(at, c)| {
                let (LiveChange::Up(n) | LiveChange::Down(n) | LiveChange::Meta(n)) = c;
                *at == i && *n == name(2)
            })
            .map(|(_, c)| c)
            .collect();
        assert_eq!(
            about,
            vec![&LiveChange::Meta(name(2))],
            "node {i}: renamed in place, reported once as a record change"
        );
    }
}

#[test]
fn a_restarted_members_record_reaches_a_member_cut_off_from_it_through_another() {
    // node1 and node2 cannot reach each other (a firewall rule); node0 reaches both. node2
    // restarts with a settled record: node1 learns the new identity through node0 and must
    // get its record the same way.
    let mut net = cluster(3, 41, Links::default());
    net.cut(1, 2);
    net.crash(2);
    net.run_for(Duration::from_secs(2));
    let mut restarted = core_with(&net, 2, 2, &[K1], Timing::fast());
    let mut meta = MemberMeta::new(name(2));
    meta.settled = true;
    restarted.set_meta(net.now(), meta).unwrap();
    net.start(2, restarted);
    net.run_for(Duration::from_secs(4));
    for i in 0..3 {
        let seen = net.core(i).unwrap().live().get(&name(2)).cloned();
        assert!(
            seen.as_ref().is_some_and(|m| m.settled),
            "node {i} holds node2's new record: {seen:?}"
        );
    }
}

#[test]
fn a_crashed_member_is_remembered_as_last_heard_before_its_crash_until_it_comes_back() {
    let mut net = cluster(3, 31, Links::default());
    assert_eq!(
        net.core(0).unwrap().last_heard_before_down(&name(2)),
        None,
        "alive"
    );
    let crashed_at = net.now();
    net.crash(2);
    run_until(&mut net, Duration::from_secs(5), |net| {
        !net.core(0).unwrap().live().contains(&name(2))
    })
    .expect("node 0 marks the crashed member down");
    let heard = net
        .core(0)
        .unwrap()
        .last_heard_before_down(&name(2))
        .expect("a member of a 3-node cluster was heard directly");
    assert!(
        heard <= crashed_at && crashed_at - heard < Duration::from_millis(500),
        "last heard {heard:?}, crashed at {crashed_at:?}: its last datagram came just before"
    );
    let restarted = core_with(&net, 2, 2, &[K1], Timing::fast());
    net.start(2, restarted);
    run_until(&mut net, Duration::from_secs(5), |net| {
        net.core(0).unwrap().live().contains(&name(2))
    })
    .expect("the restarted member is back");
    assert_eq!(
        net.core(0).unwrap().last_heard_before_down(&name(2)),
        None,
        "forgotten once it is up again"
    );
}

#[test]
fn garbage_and_own_datagrams_are_dropped_and_counted() {
    let mut net = cluster(2, 29, Links::default());
    let own = SimNet::addr(0);
    let peer = SimNet::addr(1);
    net.with_core(0, |core, now| {
        core.handle_datagram(now, own, &mut [0u8; 64]);
        core.handle_datagram(now, peer, &mut [1u8; 10]);
        core.handle_datagram(now, peer, &mut vec![0u8; 9000]);
        let mut wrong_magic = vec![0u8; 64];
        core.handle_datagram(now, peer, &mut wrong_magic);
        let mut sealed = Vec::new();
        ring(&[K1]).seal(&[7, 1, 2, 3], &mut sealed).unwrap();
        core.handle_datagram(now, peer, &mut sealed);
        let mut sealed = Vec::new();
        ring(&[K1])
            .seal(&[0, 0xff, 0xff, 0xff], &mut sealed)
            .unwrap();
        core.handle_datagram(now, peer, &mut sealed);
        let mut sealed = Vec::new();
        ring(&[K1]).seal(&[1, 0xff], &mut sealed).unwrap();
        core.handle_datagram(now, peer, &mut sealed);
        let mut flipped = Vec::new();
        ring(&[K1]).seal(&[0, 1, 2], &mut flipped).unwrap();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        core.handle_datagram(now, peer, &mut flipped);
        let mut future = Vec::new();
        ring(&[K1]).seal(&[0, 1, 2], &mut future).unwrap();
        future[4] = 4;
        core.handle_datagram(now, peer, &mut future);
    });
    let metrics = net.core(0).unwrap().metrics().clone();
    assert_eq!(metrics.rejected_count(RejectReason::FromSelf), 1);
    assert_eq!(
        metrics.rejected_count(RejectReason::Envelope("truncated")),
        1
    );
    assert_eq!(
        metrics.rejected_count(RejectReason::Envelope("too_large")),
        1
    );
    assert_eq!(
        metrics.rejected_count(RejectReason::Envelope("wrong_magic")),
        1
    );
    assert_eq!(metrics.rejected_count(RejectReason::Decode), 2);
    assert_eq!(metrics.rejected_count(RejectReason::Metadata), 1);
    assert_eq!(
        metrics.rejected_count(RejectReason::Envelope("authentication_failed")),
        1
    );
    assert_eq!(
        metrics.rejected_count(RejectReason::Envelope("unsupported_version")),
        1
    );
    net.run_for(Duration::from_secs(1));
    assert_eq!(live_len(&net, 0), 2, "the node keeps working");
}

#[test]
fn random_bytes_under_the_right_key_never_panic() {
    use rand::{RngExt, SeedableRng};
    let mut net = cluster(2, 31, Links::default());
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    let peer = SimNet::addr(1);
    let key = ring(&[K1]);
    for _ in 0..2000 {
        let len = rng.random_range(0..300);
        let mut payload: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        if let Some(first) = payload.first_mut() {
            *first %= 3;
        }
        let mut sealed = Vec::new();
        key.seal(&payload, &mut sealed).unwrap();
        net.with_core(0, |core, now| core.handle_datagram(now, peer, &mut sealed));
    }
    net.run_for(Duration::from_secs(1));
    assert_eq!(live_len(&net, 0), 2);
}

/// Cuts `minority` off for 5 s, heals, and returns every change seen in the 20 s after.
fn heal_after_cut(
    seed: u64,
    n: usize,
    minority: &[usize],
) -> (SimNet, Vec<(Duration, usize, LiveChange)>) {
    let mut net = cluster(
        n,
        seed,
        Links {
            loss: 0.05,
            delay_min: Duration::from_micros(200),
            delay_max: Duration::from_millis(3),
        },
    );
    for i in 0..n {
        net.with_core(i, |core, now| {
            let mut meta = core.own_meta().clone();
            meta.settled = true;
            core.set_meta(now, meta).unwrap();
        });
    }
    for &i in minority {
        net.set_group(i, 1);
    }
    net.run_for(Duration::from_secs(5));
    for i in 0..n {
        let side = if minority.contains(&i) {
            minority.len()
        } else {
            n - minority.len()
        };
        assert_eq!(
            live_len(&net, i),
            side,
            "seed {seed}: node {i} sees only its side"
        );
    }
    net.drain_changes().for_each(drop);
    net.heal();
    net.run_for(Duration::from_secs(20));
    for i in 0..n {
        assert_eq!(
            live_len(&net, i),
            n,
            "seed {seed}: node {i} sees everyone again"
        );
    }
    let changes = net.drain_changes().collect();
    (net, changes)
}

fn assert_no_down(seed: u64, changes: &[(Duration, usize, LiveChange)]) {
    let downs: Vec<_> = changes
        .iter()
        .filter(|(_, _, c)| matches!(c, LiveChange::Down(_)))
        .collect();
    assert!(
        downs.is_empty(),
        "seed {seed}: downs after the heal: {downs:?}"
    );
}

#[test]
fn isolated_member_rejoins_without_taking_the_others_down() {
    for seed in 0..20 {
        let (_, changes) = heal_after_cut(seed, 3, &[2]);
        assert_no_down(seed, &changes);
        // The isolated member comes back once on each of the others.
        for i in 0..2 {
            let ups = changes
                .iter()
                .filter(|(_, at, c)| *at == i && *c == LiveChange::Up(name(2)))
                .count();
            assert_eq!(
                ups, 1,
                "seed {seed}: node {i} saw node-2 come up {ups} times"
            );
        }
    }
}

#[test]
fn a_two_node_cluster_heals_without_either_going_down_again() {
    for seed in 0..20 {
        let (_, changes) = heal_after_cut(seed, 2, &[1]);
        assert_no_down(seed, &changes);
        let ups = changes
            .iter()
            .filter(|(_, _, c)| matches!(c, LiveChange::Up(_)))
            .count();
        assert!(
            ups <= 2,
            "seed {seed}: {ups} ups after the heal: {changes:?}"
        );
    }
}

/// A member cut off for a moment (a link down for 250 ms: longer than the shortest suspicion)
/// hears nobody while its own probes fail. With three members no confirmation is wanted, so its
/// suspicions of the healthy two would end at their shortest while it is deaf; it must not
/// declare them down. The others may declare it down (they did not hear it); that is its own
/// renewal, not theirs.
#[test]
fn a_member_cut_off_for_a_moment_takes_no_healthy_member_down() {
    for seed in 0..20 {
        let mut net = cluster(3, seed, Links::default());
        net.set_group(2, 1);
        net.run_for(Duration::from_millis(250));
        net.set_group(2, 0);
        net.run_for(Duration::from_secs(3));
        let healthy_downs: Vec<_> = net
            .drain_changes()
            .filter(|(_, _, c)| {
                matches!(c, LiveChange::Down(node) if *node == name(0) || *node == name(1))
            })
            .collect();
        assert!(
            healthy_downs.is_empty(),
            "seed {seed}: the cut-off member took healthy ones down: {healthy_downs:?}"
        );
        for i in 0..2 {
            assert_eq!(
                net.core(i).unwrap().rejoins(),
                0,
                "seed {seed}: node {i} was declared down and renewed"
            );
        }
        for i in 0..3 {
            assert_eq!(live_len(&net, i), 3, "seed {seed}: node {i} sees everyone");
        }
    }
}

/// Runs `net` for `span` while each `(at, of)` pair's owner watch hears `of` alive every
/// 20 ms: node `at`'s core is told so ([`Core::heard_on_watch`]), as the daemon's watch tells it.
fn run_hearing(net: &mut SimNet, span: Duration, heard: &[(usize, usize)]) {
    let end = net.now() + span;
    while net.now() < end {
        for &(at, of) in heard {
            if let Some(bump) = net.core(of).map(|c| c.identity().bump) {
                net.with_core(at, |core, now| {
                    core.heard_on_watch(now, SimNet::addr(of), bump)
                });
            }
        }
        net.run_for(Duration::from_millis(20));
    }
}

fn downs_among(net: &mut SimNet, nodes: &[usize]) -> Vec<(Duration, usize, LiveChange)> {
    let names: Vec<String> = nodes.iter().map(|i| name(*i)).collect();
    net.drain_changes()
        .filter(|(_, _, c)| matches!(c, LiveChange::Down(node) if names.contains(node)))
        .collect()
}

#[test]
fn members_the_owner_watch_hears_are_not_declared_down_through_a_starved_relay() {
    // Chaos seed 3 at 1,253 s: the gossip between nodes 0 and 1 cut both ways, node 2, their
    // only other path, starved (everything it does 400 ms late); their owner watch still
    // passes. Without the watch's word they declare each other down (the control run).
    let mut control_downs = 0;
    for seed in 0..10 {
        for hearing in [false, true] {
            let mut net = cluster(3, seed, Links::default());
            net.cut(0, 1);
            net.set_lag(2, Duration::from_millis(400));
            let heard: &[(usize, usize)] = if hearing { &[(0, 1), (1, 0)] } else { &[] };
            run_hearing(&mut net, Duration::from_secs(6), heard);
            let downs = downs_among(&mut net, &[0, 1]);
            if hearing {
                assert!(downs.is_empty(), "seed {seed}: {downs:?}");
                for i in 0..2 {
                    assert_eq!(net.core(i).unwrap().rejoins(), 0, "seed {seed}: node {i}");
                }
            } else {
                control_downs += downs.len();
            }
        }
    }
    assert!(control_downs > 0, "the control run declared nobody down");
}

#[test]
fn the_owner_watchs_word_delays_no_crash_and_holds_a_member_at_most_its_bound() {
    // A crash: the watch falls silent with it, and the crashed member is declared down within
    // a second (simulated time), the watch's word holding nothing.
    let mut net = cluster(3, 4, Links::default());
    run_hearing(&mut net, Duration::from_secs(1), &[(0, 1), (2, 1)]);
    net.crash(1);
    let took = run_until(&mut net, Duration::from_secs(5), |net| {
        [0, 2]
            .iter()
            .all(|&i| !net.core(i).unwrap().live().contains(&name(1)))
    });
    assert!(took.expect("declared down") <= Duration::from_secs(1));
    // A member whose gossip is cut from everyone while its watch still beats (its gossip
    // wedged): declared down once the watch's word has held it for its bound.
    let mut net = cluster(3, 5, Links::default());
    net.set_group(1, 1);
    let start = net.now();
    let mut down_at = None;
    while down_at.is_none() && net.now() - start < Duration::from_secs(20) {
        run_hearing(&mut net, Duration::from_millis(100), &[(0, 1), (2, 1)]);
        if !downs_among(&mut net, &[1]).is_empty() {
            down_at = Some(net.now() - start);
        }
    }
    let down_at = down_at.expect("declared down within 20 s");
    assert!(
        down_at >= WATCH_EVIDENCE_MAX,
        "declared down after {down_at:?}, before the bound"
    );
}

#[test]
fn a_member_back_from_a_cut_is_unsettled_and_the_others_are_not() {
    let (net, _) = heal_after_cut(4, 3, &[2]);
    for i in 0..3 {
        let live = net.core(i).unwrap().live();
        assert!(
            !live.get(&name(2)).unwrap().settled,
            "node {i}'s view of node-2"
        );
        assert!(
            live.get(&name(0)).unwrap().settled,
            "node {i}'s view of node-0"
        );
        assert!(
            live.get(&name(1)).unwrap().settled,
            "node {i}'s view of node-1"
        );
    }
}

#[test]
fn after_a_split_heals_the_larger_side_stays_up() {
    for seed in 0..20 {
        let (_, changes) = heal_after_cut(seed, 5, &[3, 4]);
        let majority_downs: Vec<_> = changes
            .iter()
            .filter(|(_, _, c)| {
                matches!(c, LiveChange::Down(node) if [name(0), name(1), name(2)].contains(node))
            })
            .collect();
        assert!(
            majority_downs.is_empty(),
            "seed {seed}: members of the larger side went down: {majority_downs:?}"
        );
    }
}

/// Joins `n` members through lossy links with a single transmission per update and no probing to
/// speak of, so some updates never reach some members; returns how many members miss someone
/// after `settle` of clean links.
fn holes_after_a_lossy_join(n: usize, sync_period: Duration, settle: Duration) -> (usize, u64) {
    let timing = Timing {
        max_transmissions: 1,
        scale_transmissions: false,
        gossip_fanout: 1,
        // Probes would find the missing members one by one; make them too slow to matter here.
        probe_period: Duration::from_secs(30),
        probe_rtt: Duration::from_secs(1),
        announce_period: Duration::from_secs(600),
        sync_period,
        ..Timing::fast()
    };
    let mut net = SimNet::new(
        7,
        Links {
            loss: 0.3,
            ..Links::default()
        },
    );
    for i in 0..n {
        let core = core_with(&net, i, 1, &[K1], timing.clone());
        net.start(i, core);
    }
    net.run_for(Duration::from_secs(3));
    net.set_links(Links::default());
    net.run_for(settle);
    let short = (0..n).filter(|i| live_len(&net, *i) != n).count();
    let repaired = (0..n)
        .filter_map(|i| net.core(i))
        .map(|c| c.metrics().sync_updates_sent())
        .sum();
    (short, repaired)
}

#[test]
fn members_the_gossip_never_brought_are_found_by_the_digest_exchange() {
    let n = 40;
    let settle = Duration::from_secs(5);
    // Without the exchange the holes stay (this is what the test guards against) ...
    let (short, _) = holes_after_a_lossy_join(n, Duration::ZERO, settle);
    assert!(short > 0, "the lossy join left no member short of a view");
    // ... with it every member sees every member, and the repairs were counted.
    let (short, repaired) = holes_after_a_lossy_join(n, Duration::from_secs(1), settle);
    assert_eq!(
        short, 0,
        "members still missing someone after the digest exchange"
    );
    assert!(repaired > 0);
}

fn replays(net: &SimNet, i: usize) -> u64 {
    net.core(i)
        .map_or(0, |c| c.metrics().rejected_count(RejectReason::Replay))
}

/// Each node's identity and live set (members with their metadata).
fn views(net: &SimNet, n: usize) -> Vec<(NodeIdentity, Vec<MemberMeta>)> {
    (0..n)
        .map(|i| {
            let core = net.core(i).unwrap();
            (
                core.identity().clone(),
                core.live().iter().cloned().collect(),
            )
        })
        .collect()
}

/// Injects every tapped datagram again, to its destination and from its source, and lets the
/// cluster run for a second.
fn replay_all(net: &mut SimNet, tapped: &[Tapped]) {
    for datagram in tapped {
        net.inject(datagram.from, datagram.to, datagram.bytes.clone());
    }
    net.run_for(Duration::from_secs(1));
}

#[test]
fn captured_datagrams_replayed_later_and_after_a_restart_change_nothing_and_are_each_counted() {
    let n = 3;
    let mut net = cluster(n, 37, Links::default());
    for i in 0..n {
        net.with_core(i, |core, now| {
            let mut meta = core.own_meta().clone();
            meta.settled = true;
            core.set_meta(now, meta).unwrap();
        });
    }
    // Record two seconds of a running mesh: probes, acks, gossip, metadata, digests.
    net.tap(true);
    net.run_for(Duration::from_secs(2));
    let tapped = net.take_tapped();
    net.tap(false);
    assert!(tapped.len() > 100, "only {} datagrams tapped", tapped.len());
    let sent_to = |i: usize| tapped.iter().filter(|d| d.to == SimNet::addr(i)).count() as u64;
    for i in 0..n {
        assert_eq!(
            replays(&net, i),
            0,
            "node {i} refused a datagram of a clean run"
        );
    }

    // Ten seconds later, every datagram is sent again to its destination.
    net.run_for(Duration::from_secs(10));
    net.drain_changes().for_each(drop);
    let before = views(&net, n);
    replay_all(&mut net, &tapped);
    assert_eq!(net.drain_changes().collect::<Vec<_>>(), vec![]);
    assert_eq!(views(&net, n), before, "the replays changed a view");
    for i in 0..n {
        assert_eq!(
            replays(&net, i),
            sent_to(i),
            "node {i}: every replay counted"
        );
    }

    // Node 2, the sender of a third of them, restarts under a new epoch; the others restart
    // nothing and still hold what they knew of node 2's previous life.
    net.crash(2);
    net.run_for(Duration::from_secs(2));
    let restarted = core_with(&net, 2, 2, &[K1], Timing::fast());
    net.start(2, restarted);
    let rejoined = run_until(&mut net, Duration::from_secs(5), |net| {
        (0..n).all(|i| {
            let live = net.core(i).unwrap().live();
            live.len() == n && live.iter().all(|m| m.version >= 1)
        })
    });
    assert!(rejoined.is_some(), "node 2 rejoins after its restart");
    net.run_for(Duration::from_secs(5));
    net.drain_changes().for_each(drop);
    let counted = [replays(&net, 0), replays(&net, 1), replays(&net, 2)];
    assert_eq!(
        counted,
        [sent_to(0), sent_to(1), 0],
        "no refusal around the restart"
    );
    let before = views(&net, n);
    replay_all(&mut net, &tapped);
    assert_eq!(net.drain_changes().collect::<Vec<_>>(), vec![]);
    assert_eq!(
        views(&net, n),
        before,
        "the replays after the restart changed a view"
    );
    for (i, counted) in counted.into_iter().enumerate() {
        assert_eq!(
            replays(&net, i),
            counted + sent_to(i),
            "node {i}: every replay after the restart counted"
        );
    }
}

#[test]
fn a_datagram_sealed_by_this_node_and_sent_back_is_its_own() {
    let mut net = cluster(2, 41, Links::default());
    net.tap(true);
    net.run_for(Duration::from_millis(500));
    let from_0: Vec<Tapped> = net
        .take_tapped()
        .into_iter()
        .filter(|d| d.from == SimNet::addr(0))
        .collect();
    assert!(!from_0.is_empty());
    // Reflected to node 0 from node 1's address: authentic, but node 0's own stream.
    for datagram in &from_0 {
        net.inject(SimNet::addr(1), SimNet::addr(0), datagram.bytes.clone());
    }
    net.run_for(Duration::from_millis(10));
    let metrics = net.core(0).unwrap().metrics();
    assert_eq!(
        metrics.rejected_count(RejectReason::FromSelf),
        from_0.len() as u64
    );
    assert_eq!(metrics.rejected_count(RejectReason::Replay), 0);
}

#[test]
fn a_node_started_without_seeds_joins_the_peers_it_is_given_later() {
    let mut net = cluster(2, 7, Links::default());
    let settings = GossipSettings {
        node: name(2),
        addr: SimNet::addr(2),
        seeds: vec![],
        timing: Timing::fast(),
        bump: 1,
        rng_seed: 99,
    };
    let core = Core::new(
        settings,
        ring(&[K1]),
        MemberMeta::new(name(2)),
        GossipMetrics::default(),
        net.now(),
    )
    .unwrap();
    net.start(2, core);
    net.run_for(Duration::from_secs(2));
    assert_eq!(live_len(&net, 2), 1, "alone without seeds");
    assert_eq!(net.core(2).map(|c| c.phase()), Some(Phase::Joining));
    // The Kubernetes source learns the peers from the speaker Pods (itself included).
    net.with_core(2, |core, now| {
        core.set_seeds(now, vec![SimNet::addr(1), SimNet::addr(2)])
    });
    let joined = run_until(&mut net, Duration::from_secs(2), |net| {
        (0..3).all(|i| live_len(net, i) == 3)
    });
    assert!(joined.is_some(), "everyone sees the newcomer");
}

fn suspicions(net: &SimNet, i: usize, outcome: SuspicionOutcome) -> u64 {
    net.core(i)
        .map_or(0, |c| c.metrics().suspicions_ended(outcome))
}

#[test]
fn a_crash_confirmed_by_the_members_asked_is_declared_after_the_shortest_suspicion() {
    let mut net = cluster(8, 21, Links::default());
    net.crash(5);
    let took = run_until(&mut net, Duration::from_secs(5), |net| {
        (0..8)
            .filter(|i| *i != 5)
            .all(|i| !net.core(i).unwrap().live().contains(&name(5)))
    })
    .expect("every survivor marks the crashed member down");
    // Unconfirmed, the suspicion would last 6 x 150 ms.
    assert!(took < Duration::from_millis(800), "detection took {took:?}");
    let confirmed: u64 = (0..8)
        .map(|i| suspicions(&net, i, SuspicionOutcome::Confirmed))
        .sum();
    let expired: u64 = (0..8)
        .map(|i| suspicions(&net, i, SuspicionOutcome::Expired))
        .sum();
    assert!(confirmed >= 1, "confirmed {confirmed}");
    assert_eq!(expired, 0);
}

#[test]
fn a_slow_member_stretches_its_timeouts_and_accuses_nobody() {
    // Seeds 1-10: before a renewed identity forgot its previous life's suspicions, 7 of 10
    // ended with a healthy member declared down by the slow one once it recovered.
    for seed in 1..=10 {
        let mut net = cluster(6, seed, Links::default());
        net.set_lag(2, Duration::from_millis(500));
        net.run_for(Duration::from_secs(10));
        let health = net.core(2).unwrap().metrics().health_score();
        assert!(
            health >= 1,
            "seed {seed}: local health of the slow member: {health}"
        );
        net.set_lag(2, Duration::ZERO);
        net.run_for(Duration::from_secs(10));
        let downs_of_others: Vec<_> = net
            .drain_changes()
            .filter(|(_, _, c)| matches!(c, LiveChange::Down(n) if *n != name(2)))
            .collect();
        assert!(
            downs_of_others.is_empty(),
            "seed {seed}: {downs_of_others:?}"
        );
        for i in 0..6 {
            assert_eq!(
                live_len(&net, i),
                6,
                "seed {seed}: node {i} sees everyone again"
            );
        }
        assert_eq!(
            net.core(2).unwrap().metrics().health_score(),
            0,
            "seed {seed}: recovered as its probes succeed"
        );
    }
}

#[test]
fn a_paused_member_takes_nobody_down_when_it_resumes() {
    let mut net = cluster(6, 29, Links::default());
    let resume = net.now() + Duration::from_secs(2);
    net.pause(4, resume);
    net.run_for(Duration::from_secs(12));
    let downs_of_others: Vec<_> = net
        .drain_changes()
        .filter(|(_, _, c)| matches!(c, LiveChange::Down(n) if *n != name(4)))
        .collect();
    assert!(downs_of_others.is_empty(), "{downs_of_others:?}");
    for i in 0..6 {
        assert_eq!(live_len(&net, i), 6, "node {i} sees everyone again");
    }
}

#[test]
fn the_two_survivors_of_a_crash_merge_again_after_they_declared_each_other_down() {
    // Seen in the Kubernetes lab under CPU starvation: with the third member dead, each
    // survivor held one member alive (itself) and two down, so neither told the other it was
    // down, neither renewed, and both stayed alone, both answering.
    for seed in 0..10 {
        let mut net = cluster(3, seed, Links::default());
        net.run_for(Duration::from_secs(2));
        net.crash(2);
        net.run_for(Duration::from_secs(3));
        net.set_group(1, 1);
        let apart = run_until(&mut net, Duration::from_secs(10), |net| {
            live_len(net, 0) == 1 && live_len(net, 1) == 1
        });
        assert!(apart.is_some(), "seed {seed}: the survivors never split");
        net.heal();
        let merged = run_until(&mut net, Duration::from_secs(20), |net| {
            live_len(net, 0) == 2 && live_len(net, 1) == 2
        });
        assert!(
            merged.is_some(),
            "seed {seed}: the survivors stayed apart: {} and {} members",
            live_len(&net, 0),
            live_len(&net, 1)
        );
    }
}

/// One node alone holds a member down (it declared the member down and was itself declared
/// down before its news spread, so nobody took it: seen in the Kubernetes chaos lab, where that
/// node then answered ARP for the member's IP beside it for 35 s). The member keeps probing and
/// gossiping to that node, is told it is down, and renews: every node holds it alive again, and
/// no other node ever took it down.
/// The same while that node's datagrams to the member are dropped (a one-way firewall rule): its
/// "you are down" never arrives, and without more the member would stay out of its election for
/// as long as the rule lasts while the others elect it. The others are told of the down, and
/// one of them tells the member.
#[test]
fn a_member_held_down_behind_a_one_way_cut_is_told_through_the_others() {
    for seed in 1..=5 {
        let mut net = cluster(3, seed, Links::default());
        net.cut_one_way(1, 2);
        net.with_core(1, |core, now| core.hold_down_unheard(SimNet::addr(2), now));
        let took = run_until(&mut net, Duration::from_secs(2), |net| {
            net.core(2).unwrap().rejoins() >= 1 && (0..3).all(|i| live_len(net, i) == 3)
        });
        assert!(
            took.is_some(),
            "seed {seed}: node 2 renewed {} times; node 1 holds {:?}",
            net.core(2).unwrap().rejoins(),
            net.core(1).unwrap().live()
        );
    }
}

#[test]
fn a_member_only_one_node_holds_down_is_told_so_and_every_node_holds_it_alive_again() {
    for seed in 1..=5 {
        let mut net = cluster(3, seed, Links::default());
        net.with_core(1, |core, now| core.hold_down_unheard(SimNet::addr(2), now));
        assert_eq!(
            live_len(&net, 1),
            2,
            "seed {seed}: node 1 holds node 2 down"
        );
        let took = run_until(&mut net, Duration::from_secs(5), |net| {
            (0..3).all(|i| live_len(net, i) == 3)
        });
        assert!(
            took.is_some(),
            "seed {seed}: node 1 still holds node 2 down: {:?}",
            net.core(1).unwrap().live()
        );
        assert!(
            net.core(2).unwrap().rejoins() >= 1,
            "seed {seed}: node 2 renewed"
        );
        assert_eq!(downs_of(&mut net, &name(2)), vec![1], "seed {seed}");
    }
}
