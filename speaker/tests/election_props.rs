//! Property tests of the election (STYLE.md practice 7), with a fixed seed so every run checks
//! the same cases.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, RngSeed};
use swimlb_speaker::model::election::{Election, Outcome, effective_priority, elect, standing};
use swimlb_speaker::model::membership::{
    CheckResult, GroupHealth, LiveChange, LiveSet, MemberMeta,
};
use swimlb_speaker::model::snapshot::{Interfaces, NodeFilter, ServedIp, Snapshot};

const NODES: usize = 8;
const GROUPS: [&str; 3] = ["g0", "g1", "g2"];

fn node_name(i: usize) -> String {
    format!("node-{i}")
}

fn config() -> Config {
    Config {
        cases: 256,
        rng_seed: RngSeed::Fixed(0x0053_171b),
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        ..Config::default()
    }
}

fn check() -> impl Strategy<Value = CheckResult> {
    (any::<bool>(), prop_oneof![Just(0), -60..60i32], 0..3usize).prop_map(|(passing, weight, n)| {
        CheckResult {
            name: format!("check-{n}"),
            passing,
            weight,
        }
    })
}

fn health() -> impl Strategy<Value = GroupHealth> {
    (
        prop_oneof![Just(100u8), any::<u8>()],
        prop::collection::vec(check(), 0..3),
    )
        .prop_map(|(priority, checks)| GroupHealth { priority, checks })
}

/// A member record for node `i`. `g2` is never reported, so its IPs have no candidates.
fn member(i: usize) -> impl Strategy<Value = MemberMeta> {
    (
        prop::bool::weighted(0.8),
        prop::bool::weighted(0.1),
        prop::option::weighted(0.8, health()),
        prop::option::weighted(0.8, health()),
        1..1000u64,
        (
            prop::bool::weighted(0.8),
            prop::collection::btree_set((0..200u16).prop_map(ip), 0..3),
        ),
    )
        .prop_map(
            move |(settled, draining, g0, g1, version, (eth0, unplaced))| {
                let mut meta = MemberMeta::new(node_name(i));
                // Most members can announce on eth0; a few cannot place some default-interface IPs.
                if eth0 {
                    meta.announce.links.insert("eth0".into());
                }
                meta.announce.unplaced = unplaced;
                meta.version = version;
                meta.settled = settled;
                meta.draining = draining;
                if let Some(h) = g0 {
                    meta.groups.insert("g0".into(), h);
                }
                if let Some(h) = g1 {
                    meta.groups.insert("g1".into(), h);
                }
                meta
            },
        )
}

/// Records for every node (some of which will be alive).
fn members() -> impl Strategy<Value = Vec<MemberMeta>> {
    (0..NODES).map(member).collect::<Vec<_>>()
}

fn node_set() -> impl Strategy<Value = Arc<BTreeSet<String>>> {
    prop::collection::btree_set((0..NODES + 2).prop_map(node_name), 0..NODES).prop_map(Arc::new)
}

fn served() -> impl Strategy<Value = ServedIp> {
    (
        prop::option::weighted(0.5, prop::sample::select(GROUPS.to_vec())),
        prop::option::weighted(0.3, node_set()),
        prop::option::weighted(0.3, node_set()),
        prop::bool::ANY,
        prop::option::weighted(0.2, (0..200u16).prop_map(ip)),
    )
        .prop_map(|(group, only, ready, named, order_ip)| {
            let interface = if named {
                Interfaces::named(["eth0"])
            } else {
                Interfaces::Default
            };
            let mut served = match group {
                Some(group) => ServedIp::group(group, interface),
                None => ServedIp::service("ns", "svc"),
            };
            if let Some(set) = only {
                served.nodes = NodeFilter::Only(set);
            }
            served.ready_endpoints = ready;
            served.order_ip = order_ip;
            served
        })
}

fn ip(n: u16) -> IpAddr {
    if n.is_multiple_of(2) {
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, (n / 2) as u8))
    } else {
        IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, n))
    }
}

fn entries() -> impl Strategy<Value = Vec<(IpAddr, ServedIp)>> {
    prop::collection::btree_map(0..200u16, served(), 1..24)
        .prop_map(|m| m.into_iter().map(|(n, s)| (ip(n), s)).collect())
}

fn live_of(members: &[MemberMeta], alive: &[bool]) -> LiveSet {
    let mut set = LiveSet::new();
    for (meta, up) in members.iter().zip(alive) {
        if *up {
            set.upsert(meta.clone());
        }
    }
    set
}

fn snapshot_of(entries: &[(IpAddr, ServedIp)]) -> Snapshot {
    Snapshot::from_entries(entries.iter().cloned()).expect("one entry per IP")
}

fn owners(outcomes: &BTreeMap<IpAddr, Outcome>) -> BTreeMap<IpAddr, Option<String>> {
    outcomes
        .iter()
        .map(|(ip, o)| (*ip, o.owner().map(str::to_string)))
        .collect()
}

/// A change in a random sequence.
#[derive(Debug, Clone)]
enum Step {
    Down(usize),
    Up(MemberMeta),
    Meta(MemberMeta),
    Settle(usize),
    Snapshot(Vec<(IpAddr, ServedIp)>),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..NODES).prop_map(Step::Down),
        3 => (0..NODES).prop_flat_map(member).prop_map(Step::Up),
        3 => (0..NODES).prop_flat_map(member).prop_map(Step::Meta),
        2 => (0..NODES).prop_map(Step::Settle),
        1 => entries().prop_map(Step::Snapshot),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn every_node_computes_the_same_owners_whatever_the_input_order(
        members in members(),
        alive in prop::collection::vec(prop::bool::weighted(0.8), NODES),
        entries in entries(),
        shuffle_members in any::<u64>(),
    ) {
        let reference = Election::new(node_name(0), snapshot_of(&entries), &live_of(&members, &alive));

        // Same facts, presented in another order, computed by another node.
        let mut order: Vec<usize> = (0..NODES).collect();
        let mut seed = shuffle_members;
        for i in (1..order.len()).rev() {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            order.swap(i, (seed >> 33) as usize % (i + 1));
        }
        let mut live = LiveSet::new();
        for &i in &order {
            if alive[i] {
                live.upsert(members[i].clone());
            }
        }
        let mut reversed = entries.clone();
        reversed.reverse();
        let other = Election::new(node_name(order[0]), snapshot_of(&reversed), &live);
        prop_assert_eq!(reference.outcomes(), other.outcomes());

        // Same facts, arriving one member at a time through the incremental path.
        let mut incremental = Election::new(node_name(1), snapshot_of(&entries), &LiveSet::new());
        let mut growing = LiveSet::new();
        for &i in &order {
            if alive[i] {
                growing.upsert(members[i].clone());
                incremental.apply_live(&growing, &LiveChange::Up(node_name(i)));
            }
        }
        prop_assert_eq!(reference.outcomes(), incremental.outcomes());
    }

    #[test]
    fn when_one_member_dies_only_its_ips_move(
        members in members(),
        alive in prop::collection::vec(prop::bool::weighted(0.8), NODES),
        entries in entries(),
        victim in 0..NODES,
    ) {
        let mut live = live_of(&members, &alive);
        let mut election = Election::new(node_name(0), snapshot_of(&entries), &live);
        let before = owners(election.outcomes());
        live.remove(&node_name(victim));
        let changes = election.apply_live(&live, &LiveChange::Down(node_name(victim)));
        let after = owners(election.outcomes());
        for (ip, owner) in &before {
            if owner.as_deref() != Some(node_name(victim).as_str()) {
                prop_assert_eq!(owner, &after[ip], "{} moved", ip);
            } else {
                prop_assert_ne!(&after[ip], owner);
            }
        }
        let moved: Vec<IpAddr> = changes.iter().map(|c| c.ip).collect();
        let expected: Vec<IpAddr> = before
            .iter()
            .filter(|(_, o)| o.as_deref() == Some(node_name(victim).as_str()))
            .map(|(ip, _)| *ip)
            .collect();
        prop_assert_eq!(moved, expected);
        prop_assert_eq!(election.outcomes(), &elect(election.snapshot(), &live));
    }

    #[test]
    fn a_member_that_rejoins_unsettled_takes_nothing_back_until_it_is_settled(
        members in members(),
        entries in entries(),
        returning in 0..NODES,
        boost in any::<u8>(),
    ) {
        // Everyone alive and settled; one member dies, then comes back unsettled with a
        // priority as high as it likes.
        let mut settled_members = members.clone();
        for meta in &mut settled_members {
            meta.settled = true;
        }
        let mut live = live_of(&settled_members, &[true; NODES]);
        let name = node_name(returning);
        let mut election = Election::new(node_name(0), snapshot_of(&entries), &live);
        live.remove(&name);
        election.apply_live(&live, &LiveChange::Down(name.clone()));
        let without = owners(election.outcomes());

        let mut back = settled_members[returning].clone();
        back.version += 1;
        back.settled = false;
        for health in back.groups.values_mut() {
            health.priority = health.priority.max(boost);
        }
        live.upsert(back.clone());
        election.apply_live(&live, &LiveChange::Up(name.clone()));
        for (ip, owner) in owners(election.outcomes()) {
            if without[&ip].is_some() {
                prop_assert_eq!(&owner, &without[&ip], "{} taken back while unsettled", ip);
            }
        }

        back.version += 1;
        back.settled = true;
        live.upsert(back);
        election.apply_live(&live, &LiveChange::Meta(name));
        prop_assert_eq!(election.outcomes(), &elect(election.snapshot(), &live));
    }

    #[test]
    fn the_owner_of_a_group_ip_has_the_highest_effective_priority_among_settled_candidates(
        members in members(),
        entries in entries(),
    ) {
        let mut settled_members = members.clone();
        for meta in &mut settled_members {
            meta.settled = true;
        }
        let live = live_of(&settled_members, &[true; NODES]);
        let snapshot = snapshot_of(&entries);
        let outcomes = elect(&snapshot, &live);
        for (ip, served) in snapshot.iter() {
            let best = live.iter().filter_map(|m| standing(m, ip, served).ok()).max();
            match &outcomes[ip] {
                Outcome::Owned(rank) => {
                    prop_assert_eq!(Some(rank.priority), best);
                    let meta = live.get(&rank.node).expect("owner is alive");
                    prop_assert_eq!(standing(meta, ip, served), Ok(rank.priority));
                    if let Some(group) = &served.group {
                        prop_assert_eq!(
                            effective_priority(&meta.groups[group]).map(u32::from),
                            Ok(rank.priority)
                        );
                    }
                }
                Outcome::NoCandidates | Outcome::NoReadyEndpoints => {
                    prop_assert_eq!(best, None);
                }
            }
        }
    }

    #[test]
    fn effective_priority_is_keepalived_arithmetic(health in health()) {
        let fault = health.checks.iter().any(|c| c.weight == 0 && !c.passing);
        let sum: i64 = i64::from(health.priority)
            + health
                .checks
                .iter()
                .filter(|c| (c.passing && c.weight > 0) || (!c.passing && c.weight < 0))
                .map(|c| i64::from(c.weight))
                .sum::<i64>();
        match effective_priority(&health) {
            Ok(p) => {
                prop_assert!(!fault);
                prop_assert_eq!(i64::from(p), sum.clamp(1, 254));
            }
            Err(_) => prop_assert!(fault),
        }
    }

    #[test]
    fn incremental_recomputation_equals_full_recomputation_after_any_changes(
        members in members(),
        alive in prop::collection::vec(prop::bool::weighted(0.7), NODES),
        entries in entries(),
        steps in prop::collection::vec(step(), 1..20),
    ) {
        let mut live = live_of(&members, &alive);
        let mut election = Election::new(node_name(0), snapshot_of(&entries), &live);
        for step in steps {
            let before = owners(election.outcomes());
            let changes = match step {
                Step::Down(i) => {
                    live.remove(&node_name(i));
                    election.apply_live(&live, &LiveChange::Down(node_name(i)))
                }
                Step::Up(mut meta) | Step::Meta(mut meta) => {
                    // Newer than anything held, so the record is taken.
                    meta.version = live.get(&meta.node).map_or(1, |m| m.version + 1);
                    let node = meta.node.clone();
                    live.upsert(meta);
                    election.apply_live(&live, &LiveChange::Meta(node))
                }
                Step::Settle(i) => {
                    let Some(mut meta) = live.get(&node_name(i)).cloned() else { continue };
                    meta.version += 1;
                    meta.settled = true;
                    live.upsert(meta);
                    election.apply_live(&live, &LiveChange::Meta(node_name(i)))
                }
                Step::Snapshot(entries) => election.apply_snapshot(snapshot_of(&entries), &live),
            };
            let full = elect(election.snapshot(), &live);
            prop_assert_eq!(election.outcomes(), &full);
            // The reported changes are exactly the IPs whose owner differs.
            let after = owners(&full);
            let mut differing: Vec<IpAddr> = before
                .keys()
                .chain(after.keys())
                .filter(|ip| before.get(ip).cloned().flatten() != after.get(ip).cloned().flatten())
                .copied()
                .collect();
            differing.sort();
            differing.dedup();
            let reported: Vec<IpAddr> = changes.iter().map(|c| c.ip).collect();
            prop_assert_eq!(reported, differing);
        }
    }
}
