use super::*;
use crate::crd::{L2AdvertisementSpec, ServiceAllocation};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

fn pool(name: &str, addresses: &[&str]) -> IPAddressPool {
    IPAddressPool::with_addresses("default", name, addresses)
}

fn adv(name: &str, pools: &[&str]) -> L2Advertisement {
    let mut a = L2Advertisement::new(
        name,
        L2AdvertisementSpec {
            ip_address_pools: pools.iter().map(|p| p.to_string()).collect(),
            ..Default::default()
        },
    );
    a.metadata.namespace = Some("default".into());
    a
}

fn messages(v: &Validated) -> Vec<String> {
    v.errors.iter().map(|e| e.to_string()).collect()
}

#[test]
fn address_entries_parse_to_inclusive_intervals() {
    type Case = (
        &'static str,
        Result<(Family, &'static str, &'static str), &'static str>,
    );
    let cases: &[Case] = &[
        ("192.0.2.0/24", Ok((Family::V4, "192.0.2.0", "192.0.2.255"))),
        ("192.0.2.7/32", Ok((Family::V4, "192.0.2.7", "192.0.2.7"))),
        ("0.0.0.0/0", Ok((Family::V4, "0.0.0.0", "255.255.255.255"))),
        (
            "192.0.2.10-192.0.2.20",
            Ok((Family::V4, "192.0.2.10", "192.0.2.20")),
        ),
        (
            " 192.0.2.10 - 192.0.2.10 ",
            Ok((Family::V4, "192.0.2.10", "192.0.2.10")),
        ),
        (
            "2001:db8::/126",
            Ok((Family::V6, "2001:db8::", "2001:db8::3")),
        ),
        (
            "2001:db8::1-2001:db8::9",
            Ok((Family::V6, "2001:db8::1", "2001:db8::9")),
        ),
        (
            "::/0",
            Ok((Family::V6, "::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")),
        ),
        (
            "192.0.2.10-192.0.2.1",
            Err("range 192.0.2.10-192.0.2.1 is reversed"),
        ),
        (
            "192.0.2.1-2001:db8::1",
            Err("range 192.0.2.1-2001:db8::1 has ends of different families"),
        ),
        (
            "192.0.2.1/24",
            Err("CIDR \"192.0.2.1/24\" has host bits set (did you mean 192.0.2.0/24?)"),
        ),
        (
            "192.0.2.0/33",
            Err("CIDR \"192.0.2.0/33\" has a prefix length longer than the address"),
        ),
        (
            "192.0.2.0",
            Err("\"192.0.2.0\" is neither a CIDR (192.0.2.0/24) nor a range (192.0.2.1-192.0.2.9)"),
        ),
        (
            "pool",
            Err("\"pool\" is neither a CIDR (192.0.2.0/24) nor a range (192.0.2.1-192.0.2.9)"),
        ),
        (
            "192.0.2.1-x",
            Err(
                "\"192.0.2.1-x\" is neither a CIDR (192.0.2.0/24) nor a range (192.0.2.1-192.0.2.9)",
            ),
        ),
    ];
    for (entry, want) in cases {
        let got = parse_addresses(entry).map_err(|e| e.to_string());
        let want = (*want)
            .map(|(f, a, b)| AddressRange {
                family: f,
                start: ip_to_u128(a.parse().expect("test address")),
                end: ip_to_u128(b.parse().expect("test address")),
            })
            .map_err(|e| e.to_string());
        assert_eq!(got, want, "entry {entry:?}");
    }
}

#[test]
fn buggy_addresses_are_counted_exactly() {
    let r = parse_addresses("192.0.2.0/24").expect("valid");
    assert_eq!(r.buggy_count(), 2);
    let r = parse_addresses("192.0.2.255-192.0.3.0").expect("valid");
    assert_eq!(r.buggy_count(), 2);
    let r = parse_addresses("192.0.2.1-192.0.2.254").expect("valid");
    assert_eq!(r.buggy_count(), 0);
    let r = parse_addresses("10.0.0.0/16").expect("valid");
    assert_eq!(r.buggy_count(), 512);
    let r = parse_addresses("0.0.0.0/32").expect("valid");
    assert_eq!(r.buggy_count(), 1);
    let brute =
        |r: &AddressRange| (r.start..=r.end).filter(|n| is_buggy(r.family, *n)).count() as u128;
    for entry in [
        "198.51.100.3-198.51.101.17",
        "203.0.113.255/32",
        "203.0.113.0/25",
    ] {
        let r = parse_addresses(entry).expect("valid");
        assert_eq!(r.buggy_count(), brute(&r), "{entry}");
    }
}

#[test]
fn a_valid_configuration_converts_with_sizes_per_family() {
    let mut p = pool("a", &["192.0.2.0/24", "2001:db8::/120"]);
    p.spec.avoid_buggy_ips = true;
    let v = validate(
        &[p, pool("b", &["198.51.100.1-198.51.100.10"])],
        &[adv("all", &[])],
    );
    assert_eq!(messages(&v), Vec::<String>::new());
    let a = &v.model.pools["a"];
    assert_eq!(a.size(Family::V4), 254);
    assert_eq!(a.size(Family::V6), 256);
    assert!(a.may_assign("192.0.2.1".parse().expect("ip")));
    assert!(!a.may_assign("192.0.2.255".parse().expect("ip")));
    assert!(a.contains("192.0.2.255".parse().expect("ip")));
    assert_eq!(v.model.pools["b"].size(Family::V4), 10);
    assert_eq!(v.model.pools["b"].size(Family::V6), 0);
    let all: BTreeSet<String> = ["a".to_string(), "b".to_string()].into();
    assert_eq!(
        v.model.advertisements[0].pools, all,
        "no names and no selectors means every pool"
    );
}

#[test]
fn every_error_is_reported_with_object_and_field() {
    let bad = pool(
        "pool-a",
        &[
            "192.0.2.0/28",
            "192.0.2.300/32",
            "192.0.2.10-192.0.2.1",
            "192.0.2.8/29",
        ],
    );
    let overlapping = pool("pool-z", &["198.51.100.0/24", "192.0.2.5-192.0.2.6"]);
    let fine = pool("pool-b", &["192.0.2.0/28"]);
    let mut selector_bad = pool("pool-c", &["203.0.113.0/24"]);
    selector_bad.spec.service_allocation = Some(ServiceAllocation {
        service_selectors: vec![LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "app".into(),
                operator: "Like".into(),
                values: Some(vec!["x".into()]),
            }]),
            match_labels: None,
        }],
        ..Default::default()
    });
    let empty = pool("pool-d", &[]);
    let v = validate(
        &[bad, overlapping, fine, selector_bad, empty],
        &[
            adv("l2", &["pool-b", "nope"]),
            adv("l2-ok", &["pool-a", "pool-b"]),
        ],
    );
    assert_eq!(
        messages(&v),
        vec![
            "IPAddressPool default/pool-a: spec.addresses[1]: \"192.0.2.300/32\" is neither a CIDR (192.0.2.0/24) nor a range (192.0.2.1-192.0.2.9)",
            "IPAddressPool default/pool-a: spec.addresses[2]: range 192.0.2.10-192.0.2.1 is reversed",
            "IPAddressPool default/pool-a: spec.addresses[3]: 192.0.2.8-192.0.2.15 overlaps spec.addresses[0]",
            "IPAddressPool default/pool-c: spec.serviceAllocation.serviceSelectors[0]: matchExpressions[0].operator: unknown operator \"Like\" (want In, NotIn, Exists or DoesNotExist)",
            "IPAddressPool default/pool-d: spec.addresses: the pool has no addresses",
            "IPAddressPool default/pool-z: spec.addresses[1]: 192.0.2.5-192.0.2.6 overlaps pool default/pool-b (192.0.2.0-192.0.2.15)",
            "L2Advertisement default/l2: spec.ipAddressPools[1]: unknown IPAddressPool \"nope\"",
        ]
    );
    assert_eq!(v.model.pools.keys().collect::<Vec<_>>(), vec!["pool-b"]);
    assert_eq!(
        v.model.advertisements.len(),
        1,
        "an advertisement naming an invalid but existing pool is kept"
    );
    assert!(v.into_result().is_err());
}

#[test]
fn a_pool_name_used_in_two_namespaces_is_rejected_once() {
    let first = pool("shared", &["192.0.2.0/28"]);
    let mut second = pool("shared", &["198.51.100.0/28"]);
    second.metadata.namespace = Some("other".into());
    let v = validate(&[second, first], &[]);
    assert_eq!(
        messages(&v),
        vec![
            "IPAddressPool other/shared: metadata.name: the pool name is also used by default/shared; pool names must be unique"
        ]
    );
    assert_eq!(v.model.pools["shared"].namespace, "default");
}

#[test]
fn an_overlap_is_found_even_behind_a_long_range() {
    // a covers everything; b sits inside a; c overlaps only a. Both b and c are rejected.
    let v = validate(
        &[
            pool("a", &["192.0.2.0/24"]),
            pool("b", &["192.0.2.10/32"]),
            pool("c", &["192.0.2.200-192.0.2.210"]),
            pool("d", &["2001:db8::/64"]),
        ],
        &[],
    );
    let rejected: Vec<&str> = v.errors.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(rejected, vec!["b", "c"]);
    assert_eq!(v.model.pools.keys().collect::<Vec<_>>(), vec!["a", "d"]);
}

#[test]
fn a_rejected_pool_does_not_cause_another_rejection() {
    // a overlaps b, b overlaps c, a and c are disjoint: only b is rejected.
    let v = validate(
        &[
            pool("a", &["192.0.2.0-192.0.2.10"]),
            pool("b", &["192.0.2.5-192.0.2.20"]),
            pool("c", &["192.0.2.15-192.0.2.30", "2001:db8::/64"]),
        ],
        &[],
    );
    assert_eq!(
        messages(&v),
        vec![
            "IPAddressPool default/b: spec.addresses[0]: 192.0.2.5-192.0.2.20 overlaps pool default/a (192.0.2.0-192.0.2.10)"
        ]
    );
    assert_eq!(v.model.pools.keys().collect::<Vec<_>>(), vec!["a", "c"]);
}

#[test]
fn accepted_pools_never_overlap_and_a_rejected_pool_overlaps_an_accepted_one() {
    // Deterministic pseudo-random pools of small ranges in 192.0.2.0/24.
    let mut seed: u64 = 6;
    let mut next = |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    for _ in 0..200 {
        let pools: Vec<IPAddressPool> = (0..5)
            .map(|i| {
                let a = next(250);
                let b = a + next(6);
                pool(&format!("p{i}"), &[&format!("192.0.2.{a}-192.0.2.{b}")])
            })
            .collect();
        let v = validate(&pools, &[]);
        let ranges: Vec<&AddressRange> = v.model.pools.values().flat_map(|p| &p.ranges).collect();
        for (i, x) in ranges.iter().enumerate() {
            for y in &ranges[i + 1..] {
                assert!(
                    x.end < y.start || y.end < x.start,
                    "accepted {x} and {y} overlap"
                );
            }
        }
        for e in &v.errors {
            let rejected = parse_addresses(
                &pools
                    .iter()
                    .find(|p| p.metadata.name.as_deref() == Some(&e.name))
                    .expect("named")
                    .spec
                    .addresses[0],
            )
            .expect("valid");
            assert!(
                ranges
                    .iter()
                    .any(|r| !(rejected.end < r.start || r.end < rejected.start)),
                "{} was rejected without overlapping an accepted pool",
                e.name
            );
        }
    }
}

#[test]
fn pool_selectors_of_an_advertisement_resolve_to_pool_names() {
    let mut a = pool("a", &["192.0.2.0/28"]);
    a.metadata.labels = Some([("zone".to_string(), "east".to_string())].into());
    let b = pool("b", &["198.51.100.0/28"]);
    let mut l2 = adv("east", &[]);
    l2.spec.ip_address_pool_selectors = vec![LabelSelector {
        match_labels: Some([("zone".to_string(), "east".to_string())].into()),
        match_expressions: None,
    }];
    let model = validate(&[a, b], &[l2]).into_result().expect("valid");
    assert_eq!(
        model.advertisements[0].pools,
        BTreeSet::from(["a".to_string()])
    );
}

#[test]
fn preferred_node_selectors_are_checked_and_kept_in_order() {
    use crate::crd::PreferredNodeSelector;
    let prefer = |weight: i32, operator: &str| PreferredNodeSelector {
        weight,
        preference: LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "zone".into(),
                operator: operator.into(),
                values: Some(vec!["a".into()]),
            }]),
            match_labels: None,
        },
    };
    let mut good = adv("good", &[]);
    good.spec.preferred_node_selectors = vec![prefer(60, "In"), prefer(100, "NotIn")];
    let mut bad = adv("bad", &[]);
    bad.spec.preferred_node_selectors = vec![prefer(0, "In"), prefer(101, "Near")];
    let v = validate(&[pool("a", &["192.0.2.0/28"])], &[good, bad]);
    assert_eq!(
        messages(&v),
        vec![
            "L2Advertisement default/bad: spec.preferredNodeSelectors[0].weight: weight 0 is outside 1..=100",
            "L2Advertisement default/bad: spec.preferredNodeSelectors[1].weight: weight 101 is outside 1..=100",
            "L2Advertisement default/bad: spec.preferredNodeSelectors[1].preference: matchExpressions[0].operator: unknown operator \"Near\" (want In, NotIn, Exists or DoesNotExist)",
        ]
    );
    let kept = &v.model.advertisements;
    assert_eq!(kept.len(), 1);
    let weights: Vec<u8> = kept[0].preferred_nodes.iter().map(|p| p.weight).collect();
    assert_eq!(weights, vec![60, 100]);
    let east: BTreeMap<String, String> = [("zone".to_string(), "a".to_string())].into();
    assert!(kept[0].preferred_nodes[0].selector.matches(&east));
    assert!(!kept[0].preferred_nodes[1].selector.matches(&east));
}

#[test]
fn service_allocation_admits_by_namespace_and_labels() {
    let mut p = pool("a", &["192.0.2.0/28"]);
    p.spec.service_allocation = Some(ServiceAllocation {
        priority: 10,
        namespaces: vec!["prod".into()],
        namespace_selectors: vec![],
        service_selectors: vec![LabelSelector {
            match_labels: Some([("app".to_string(), "web".to_string())].into()),
            match_expressions: None,
        }],
    });
    let model = validate(&[p], &[]).into_result().expect("valid");
    let pool = &model.pools["a"];
    let web: BTreeMap<String, String> = [("app".to_string(), "web".to_string())].into();
    let none = BTreeMap::new();
    assert!(pool.admits(&applicant("prod", &none, &web)));
    assert!(!pool.admits(&applicant("dev", &none, &web)));
    assert!(!pool.admits(&applicant("prod", &none, &none)));
}

fn applicant<'a>(
    namespace: &'a str,
    namespace_labels: &'a BTreeMap<String, String>,
    service_labels: &'a BTreeMap<String, String>,
) -> Applicant<'a> {
    Applicant {
        namespace,
        namespace_labels,
        service_labels,
    }
}
