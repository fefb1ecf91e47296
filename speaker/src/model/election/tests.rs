use std::collections::BTreeSet;
use std::sync::Arc;

use super::*;
use crate::model::membership::CheckResult;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn member(node: &str, settled: bool) -> MemberMeta {
    let mut meta = MemberMeta::new(node);
    meta.settled = settled;
    meta
}

fn live(members: impl IntoIterator<Item = MemberMeta>) -> LiveSet {
    let mut set = LiveSet::new();
    for meta in members {
        set.upsert(meta);
    }
    set
}

fn health(priority: u8, checks: &[(bool, i32)]) -> GroupHealth {
    GroupHealth {
        priority,
        checks: checks
            .iter()
            .enumerate()
            .map(|(i, (passing, weight))| CheckResult {
                name: format!("c{i}"),
                passing: *passing,
                weight: *weight,
            })
            .collect(),
    }
}

fn single(ip_text: &str, served: ServedIp) -> Snapshot {
    let mut snapshot = Snapshot::new();
    snapshot.insert(ip(ip_text), served).unwrap();
    snapshot
}

#[test]
fn order_hash_is_sha256_of_node_hash_sign_ip() {
    // Reference value: printf 'node-a#192.0.2.1' | sha256sum
    let hash = order_hash("node-a", "192.0.2.1");
    let hex: String = hash.to_bytes().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, REFERENCE_NODE_A_192_0_2_1);
}

#[test]
fn the_one_block_hash_equals_the_streaming_hash_at_every_length() {
    for node_len in 0..70 {
        let node: String = (0..node_len)
            .map(|i| (b'a' + (i % 26) as u8) as char)
            .collect();
        for ip_text in [
            "192.0.2.1",
            "2001:db8::1",
            "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff",
        ] {
            assert_eq!(
                order_hash(&node, ip_text),
                order_hash_streaming(&node, ip_text),
                "node of {node_len} bytes, {ip_text}"
            );
        }
    }
}

const REFERENCE_NODE_A_192_0_2_1: &str =
    "9028b03eebd9c50f45e3cb24b507db170990cd5f206b44ba22be4e1dc2acad0a";

#[test]
fn ipv6_text_is_the_canonical_form_go_prints() {
    let cases = [
        ("2001:db8:0:0:0:0:0:1", "2001:db8::1"),
        ("2001:db8:0:1:0:0:0:1", "2001:db8:0:1::1"),
        ("2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"),
        ("2001:db8:1:1:1:1:0:1", "2001:db8:1:1:1:1:0:1"),
        ("2001:DB8::A", "2001:db8::a"),
        ("0:0:0:0:0:0:0:0", "::"),
    ];
    let mut text = String::new();
    for (input, go) in cases {
        ip_text(&ip(input), &mut text);
        assert_eq!(text, go, "{input}");
    }
}

#[test]
fn the_election_does_not_depend_on_how_many_threads_compute_it() {
    let set = live((0..20).map(|i| member(&format!("n{i}"), i % 3 != 0)));
    let mut snapshot = Snapshot::new();
    for i in 0..50u8 {
        snapshot
            .insert(ip(&format!("192.0.2.{i}")), ServedIp::service("ns", "s"))
            .unwrap();
    }
    let one = elect_with_threads(&snapshot, &set, 1);
    for threads in [0, 2, 3, 7, 64] {
        assert_eq!(
            elect_with_threads(&snapshot, &set, threads),
            one,
            "{threads} threads"
        );
    }
    assert_eq!(one.len(), 50);
}

#[test]
fn a_dual_stack_service_ordered_by_its_first_ip_lands_on_one_node_as_in_metallb() {
    let nodes: Vec<String> = (0..16).map(|i| format!("worker-{i}")).collect();
    let set = live(nodes.iter().map(|n| member(n, true)));
    let v4 = ip("192.0.2.7");
    let mut snapshot = Snapshot::new();
    for address in ["192.0.2.7", "2001:db8::7"] {
        let mut served = ServedIp::service("ns", "dual");
        served.order_ip = Some(v4);
        snapshot.insert(ip(address), served).unwrap();
    }
    let metallb = nodes
        .iter()
        .min_by_key(|n| order_hash(n, "192.0.2.7"))
        .unwrap();
    let election = Election::new("worker-0", snapshot, &set);
    assert_eq!(election.owner(&v4), Some(metallb.as_str()));
    assert_eq!(election.owner(&ip("2001:db8::7")), Some(metallb.as_str()));
}

#[test]
fn the_lowest_hash_owns_an_ip_among_equals() {
    let set = live(["a", "b", "c"].map(|n| member(n, true)));
    let snapshot = single("192.0.2.1", ServedIp::service("ns", "s"));
    let expected = ["a", "b", "c"]
        .into_iter()
        .min_by_key(|n| order_hash(n, "192.0.2.1"))
        .unwrap();
    let election = Election::new("a", snapshot, &set);
    assert_eq!(election.owner(&ip("192.0.2.1")), Some(expected));
}

#[test]
fn effective_priority_follows_keepalived_weights() {
    // (base, checks, expected)
    type Case = (u8, &'static [(bool, i32)], Result<u8, Exclusion>);
    let cases: &[Case] = &[
        (100, &[], Ok(100)),
        (100, &[(true, 20)], Ok(120)),
        (100, &[(false, 20)], Ok(100)),
        (100, &[(true, -30)], Ok(100)),
        (100, &[(false, -30)], Ok(70)),
        (100, &[(true, 20), (false, -30), (true, 5)], Ok(95)),
        (250, &[(true, 20)], Ok(254)),
        (10, &[(false, -50)], Ok(1)),
        (0, &[], Ok(1)),
        (100, &[(true, 0)], Ok(100)),
        (100, &[(true, 20), (false, 0)], Err(Exclusion::Fault)),
    ];
    for (base, checks, expected) in cases {
        assert_eq!(
            effective_priority(&health(*base, checks)),
            *expected,
            "base {base}, checks {checks:?}"
        );
    }
}

#[test]
fn a_passing_weighted_check_lifts_a_lower_base_priority_above_another() {
    let mut a = member("a", true);
    a.groups.insert("api".into(), health(50, &[(false, 20)]));
    let mut b = member("b", true);
    b.groups.insert("api".into(), health(40, &[(true, 20)]));
    let set = live([a, b]);
    let snapshot = single("192.0.2.1", ServedIp::group("api", Interfaces::Default));
    assert_eq!(
        Election::new("a", snapshot, &set).owner(&ip("192.0.2.1")),
        Some("b")
    );
}

#[test]
fn a_failing_weight_zero_check_makes_the_member_ineligible() {
    let mut a = member("a", true);
    a.groups.insert("api".into(), health(200, &[(false, 0)]));
    let mut b = member("b", true);
    b.groups.insert("api".into(), health(10, &[]));
    let set = live([a, b]);
    let snapshot = single("192.0.2.1", ServedIp::group("api", Interfaces::Default));
    let election = Election::new("a", snapshot, &set);
    assert_eq!(election.owner(&ip("192.0.2.1")), Some("b"));
    assert_eq!(
        election.verdict(&ip("192.0.2.1"), &set),
        Some(Verdict::NotSelected {
            owner: "b".into(),
            reason: Exclusion::Fault
        })
    );
}

#[test]
fn verdicts_name_why_this_node_does_not_serve() {
    let mut draining = member("d", true);
    draining.draining = true;
    let set = live([member("a", true), member("b", true), draining]);
    let only_b = NodeFilter::Only(Arc::new(BTreeSet::from(["b".to_string()])));
    let mut snapshot = Snapshot::new();
    let mut filtered = ServedIp::service("ns", "filtered");
    filtered.nodes = only_b;
    snapshot.insert(ip("192.0.2.1"), filtered).unwrap();
    let mut local_none = ServedIp::service("ns", "local-none");
    local_none.ready_endpoints = Some(Arc::new(BTreeSet::from(["zz".to_string()])));
    snapshot.insert(ip("192.0.2.2"), local_none).unwrap();
    let mut local_b = ServedIp::service("ns", "local-b");
    local_b.ready_endpoints = Some(Arc::new(BTreeSet::from(["b".to_string()])));
    snapshot.insert(ip("192.0.2.3"), local_b).unwrap();
    let mut nobody = ServedIp::service("ns", "nobody");
    nobody.nodes = NodeFilter::Only(Arc::new(BTreeSet::from(["d".to_string()])));
    snapshot.insert(ip("192.0.2.4"), nobody).unwrap();
    snapshot
        .insert(ip("192.0.2.5"), ServedIp::group("api", Interfaces::Default))
        .unwrap();

    let election = Election::new("a", snapshot.clone(), &set);
    let verdicts = election.verdicts(&set);
    let b = || "b".to_string();
    assert_eq!(
        verdicts[&ip("192.0.2.1")],
        Verdict::NotSelected {
            owner: b(),
            reason: Exclusion::NodeFilter
        }
    );
    assert_eq!(verdicts[&ip("192.0.2.2")], Verdict::NoReadyEndpoints);
    assert_eq!(
        verdicts[&ip("192.0.2.3")],
        Verdict::NotSelected {
            owner: b(),
            reason: Exclusion::NoReadyEndpoint
        }
    );
    assert_eq!(verdicts[&ip("192.0.2.4")], Verdict::NoCandidates);
    assert_eq!(verdicts[&ip("192.0.2.5")], Verdict::NoCandidates);
    assert_eq!(verdicts[&ip("192.0.2.4")].as_str(), "no_candidates");

    let from_d = Election::new("d", snapshot, &set);
    assert_eq!(
        from_d.verdict(&ip("192.0.2.1"), &set),
        Some(Verdict::NotSelected {
            owner: b(),
            reason: Exclusion::Draining
        })
    );
    let unknown = Election::new("x", Snapshot::new(), &set);
    assert_eq!(unknown.verdict(&ip("192.0.2.1"), &set), None);
}

#[test]
fn an_unsettled_member_with_higher_priority_waits_until_it_is_settled() {
    let mut a = member("a", true);
    a.groups.insert("api".into(), health(40, &[]));
    let mut b = member("b", false);
    b.groups.insert("api".into(), health(50, &[]));
    let mut set = live([a, b.clone()]);
    let snapshot = single("192.0.2.1", ServedIp::group("api", Interfaces::Default));
    let mut election = Election::new("b", snapshot, &set);
    assert_eq!(election.owner(&ip("192.0.2.1")), Some("a"));
    assert_eq!(
        election.verdict(&ip("192.0.2.1"), &set),
        Some(Verdict::NotOwner { owner: "a".into() })
    );

    b.version += 1;
    b.settled = true;
    set.upsert(b);
    let changes = election.apply_live(&set, &LiveChange::Meta("b".into()));
    assert_eq!(
        changes,
        vec![OwnerChange {
            ip: ip("192.0.2.1"),
            from: Some("a".into()),
            to: Some("b".into())
        }]
    );
    assert_eq!(
        election.verdict(&ip("192.0.2.1"), &set),
        Some(Verdict::Owner)
    );
    assert_eq!(
        election.owned().copied().collect::<Vec<_>>(),
        [ip("192.0.2.1")]
    );
}

#[test]
fn at_a_cold_start_priority_decides_among_unsettled_members() {
    let mut a = member("a", false);
    a.groups.insert("api".into(), health(40, &[]));
    let mut b = member("b", false);
    b.groups.insert("api".into(), health(50, &[]));
    let set = live([a, b]);
    let snapshot = single("2001:db8::1", ServedIp::group("api", Interfaces::Default));
    assert_eq!(
        Election::new("a", snapshot, &set).owner(&ip("2001:db8::1")),
        Some("b")
    );
}

#[test]
fn removing_an_ip_from_the_snapshot_reports_its_owner_leaving() {
    let set = live([member("a", true)]);
    let snapshot = single("192.0.2.1", ServedIp::service("ns", "s"));
    let mut election = Election::new("a", snapshot, &set);
    let changes = election.apply_snapshot(Snapshot::new(), &set);
    assert_eq!(
        changes,
        vec![OwnerChange {
            ip: ip("192.0.2.1"),
            from: Some("a".into()),
            to: None
        }]
    );
    assert!(election.outcomes().is_empty());
    assert_eq!(election.owned().count(), 0);
}

#[test]
fn the_successors_are_who_own_the_ip_once_the_owner_and_those_before_are_gone() {
    let names = ["a", "b", "c", "d"];
    let set = live(names.map(|n| member(n, true)));
    let mut snapshot = Snapshot::new();
    for i in 1..=20 {
        let _ = snapshot.insert(ip(&format!("192.0.2.{i}")), ServedIp::service("ns", "s"));
    }
    let election = Election::new("a", snapshot.clone(), &set);
    for (addr, outcome) in election.outcomes() {
        let owner = outcome.owner().expect("owned");
        let successor = election.successor(addr, &set).expect("a successor");
        assert_ne!(successor, owner);
        let mut without = set.clone();
        without.remove(owner);
        let after = Election::new("a", snapshot.clone(), &without);
        assert_eq!(after.owner(addr), Some(successor.as_str()), "{addr}");
        let line = election.successors(addr, &set, 5);
        assert_eq!(line.len(), 3, "every other member, once: {line:?}");
        assert_eq!(line[0], successor);
        without.remove(&successor);
        let after = Election::new("a", snapshot.clone(), &without);
        assert_eq!(after.owner(addr), Some(line[1].as_str()), "{addr}");
    }
    let alone = live([member("a", true)]);
    let election = Election::new("a", snapshot, &alone);
    assert_eq!(election.successor(&ip("192.0.2.1"), &alone), None);
    assert!(election.successors(&ip("192.0.2.1"), &alone, 2).is_empty());
}

#[test]
fn a_member_that_cannot_announce_an_ip_is_not_its_candidate() {
    let named = ServedIp::group("api", Interfaces::named(["eth1"]));
    let mut snapshot = single("192.0.2.1", named);
    snapshot
        .insert(ip("192.0.2.2"), ServedIp::service("ns", "s"))
        .unwrap();
    let mut a = member("a", true);
    a.groups.insert("api".into(), health(50, &[]));
    let mut b = member("b", true);
    b.groups.insert("api".into(), health(40, &[]));
    b.announce.links.insert("eth1".into());
    // a lacks eth1 and cannot place 192.0.2.2: b owns both although a ranks first.
    a.announce.unplaced.insert(ip("192.0.2.2"));
    let set = live([a.clone(), b]);
    let mut election = Election::new("a", snapshot, &set);
    assert_eq!(election.owner(&ip("192.0.2.1")), Some("b"));
    assert_eq!(election.owner(&ip("192.0.2.2")), Some("b"));
    assert_eq!(
        election.verdict(&ip("192.0.2.1"), &set),
        Some(Verdict::NotSelected {
            owner: "b".into(),
            reason: Exclusion::CannotAnnounce
        })
    );
    // a's link comes back: it is a candidate again and wins on priority.
    a.announce.links.insert("eth1".into());
    a.version += 1;
    let mut set = set;
    set.upsert(a);
    let changes = election.member_changed(&set, "a");
    assert_eq!(changes.len(), 1);
    assert_eq!(election.owner(&ip("192.0.2.1")), Some("a"));
    assert_eq!(election.owner(&ip("192.0.2.2")), Some("b"));
}

#[test]
fn a_services_node_priority_ranks_before_the_hash() {
    let mut served = ServedIp::service("ns", "s");
    let set = live([member("a", true), member("b", true), member("c", true)]);
    let plain = Election::new("a", single("10.0.0.1", served.clone()), &set);
    // MetalLB's golden order for 10.0.0.1: node-b, node-a, node-c; here without "node-".
    let first = plain.owner(&ip("10.0.0.1")).unwrap().to_string();
    let other = if first == "c" { "a" } else { "c" };
    served.node_priority = Some(Arc::new(BTreeMap::from([(other.to_string(), 10)])));
    let preferred = Election::new("a", single("10.0.0.1", served), &set);
    assert_eq!(preferred.owner(&ip("10.0.0.1")), Some(other));
}
