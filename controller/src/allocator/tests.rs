//! Allocator tables (after MetalLB's allocator tests) and properties.

use super::*;
use proptest::prelude::*;
use swimlb_config::crd::{IPAddressPool, ServiceAllocation};
use swimlb_config::pools::u128_to_ip;
use swimlb_config::pools::validate;
use swimlb_config::service::{IpFamilyPolicy, Protocol, ServicePort, TrafficPolicy};

fn pool(name: &str, addresses: &[&str]) -> IPAddressPool {
    IPAddressPool::with_addresses("swimlb-system", name, addresses)
}

fn no_auto(mut p: IPAddressPool) -> IPAddressPool {
    p.spec.auto_assign = false;
    p
}

fn buggy(mut p: IPAddressPool) -> IPAddressPool {
    p.spec.avoid_buggy_ips = true;
    p
}

fn restricted(mut p: IPAddressPool, priority: i32, namespaces: &[&str]) -> IPAddressPool {
    p.spec.service_allocation = Some(ServiceAllocation {
        priority,
        namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
        ..Default::default()
    });
    p
}

fn allocator(pools: Vec<IPAddressPool>) -> Allocator {
    let model = validate(&pools, &[])
        .into_result()
        .expect("test pools are valid");
    let mut a = Allocator::new(None, &model);
    assert!(a.load_existing(&[]).is_empty());
    a
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

fn ips(list: &[&str]) -> Vec<IpAddr> {
    list.iter().map(|s| ip(s)).collect()
}

fn svc(key: &str) -> ServiceView {
    let (namespace, name) = key.split_once('/').unwrap_or(("default", key));
    ServiceView {
        key: ServiceKey::new(namespace, name),
        is_load_balancer: true,
        ports: vec![ServicePort {
            port: 80,
            protocol: Protocol::Tcp,
        }],
        ..Default::default()
    }
}

trait Build {
    fn with(self, f: impl FnOnce(&mut ServiceView)) -> Self;
    fn annotate(self, key: &str, value: &str) -> Self;
    fn spec_ip(self, value: &str) -> Self;
    fn ports(self, ports: &[(i32, Protocol)]) -> Self;
    fn families(self, policy: IpFamilyPolicy, families: &[Family]) -> Self;
    fn local(self, selector: &[(&str, &str)]) -> Self;
    fn status(self, list: &[&str]) -> Self;
}

impl Build for ServiceView {
    fn with(mut self, f: impl FnOnce(&mut ServiceView)) -> Self {
        f(&mut self);
        self
    }
    fn annotate(self, key: &str, value: &str) -> Self {
        self.with(|s| {
            s.annotations.insert(key.to_string(), value.to_string());
        })
    }
    fn spec_ip(self, value: &str) -> Self {
        self.with(|s| s.load_balancer_ip = Some(value.to_string()))
    }
    fn ports(self, ports: &[(i32, Protocol)]) -> Self {
        self.with(|s| {
            s.ports = ports
                .iter()
                .map(|(port, protocol)| ServicePort {
                    port: *port,
                    protocol: *protocol,
                })
                .collect()
        })
    }
    fn families(self, policy: IpFamilyPolicy, families: &[Family]) -> Self {
        self.with(|s| {
            s.ip_family_policy = policy;
            s.ip_families = families.to_vec();
        })
    }
    fn local(self, selector: &[(&str, &str)]) -> Self {
        self.with(|s| {
            s.external_traffic_policy = TrafficPolicy::Local;
            s.selector = selector
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        })
    }
    fn status(self, list: &[&str]) -> Self {
        self.with(|s| s.status_ips = ips(list))
    }
}

/// What a step expects.
#[derive(Debug)]
enum Want {
    Ips(&'static [&'static str]),
    Error(&'static str),
    NotOurs(&'static str),
    Unchanged,
}

fn check(a: &mut Allocator, step: usize, service: &ServiceView, want: &Want) {
    let got = a.assign(service);
    let ok = match (want, &got) {
        (Want::Ips(list), Verdict::Assigned { ips: got, .. }) => *got == ips(list),
        (Want::Error(reason), Verdict::Error(e)) => e.as_str() == *reason,
        (Want::NotOurs(reason), Verdict::NotOurs(r)) => r.as_str() == *reason,
        (Want::Unchanged, Verdict::Unchanged) => true,
        _ => false,
    };
    assert!(
        ok,
        "step {step} ({}): want {want:?}, got {got:?}",
        service.key
    );
}

fn run(a: &mut Allocator, steps: &[(ServiceView, Want)]) {
    for (i, (service, want)) in steps.iter().enumerate() {
        check(a, i, service, want);
    }
}

const SHARE: &str = "swimlb.io/allow-shared-ip";
const IPS: &str = "swimlb.io/loadBalancerIPs";
const POOL: &str = "swimlb.io/address-pool";

#[test]
fn requested_addresses_are_honoured_or_refused_with_a_reason() {
    let mut a = allocator(vec![
        pool("v4", &["192.0.2.0/28"]),
        pool("v6", &["2001:db8::/124"]),
        pool("dual", &["198.51.100.0/28", "2001:db8:1::/124"]),
        no_auto(pool("manual", &["203.0.113.0/28"])),
    ]);
    use Want::*;
    run(
        &mut a,
        &[
            (svc("s1").spec_ip("192.0.2.1"), Ips(&["192.0.2.1"])),
            // The same request again: nothing changes, and the status already shows it.
            (
                svc("s1").spec_ip("192.0.2.1").status(&["192.0.2.1"]),
                Unchanged,
            ),
            // Asking for another address moves the Service.
            (svc("s1").spec_ip("192.0.2.2"), Ips(&["192.0.2.2"])),
            // 192.0.2.1 is free again.
            (svc("s2").annotate(IPS, "192.0.2.1"), Ips(&["192.0.2.1"])),
            (svc("s3").spec_ip("192.0.2.1"), Error("ip_in_use")),
            (svc("s3").spec_ip("192.0.3.1"), Error("ip_not_in_pool")),
            (svc("s3").spec_ip("not-an-ip"), Error("invalid_ip")),
            (
                svc("s3").annotate(IPS, "192.0.2.3,192.0.2.4"),
                Error("invalid_ip"),
            ),
            (
                svc("s3").spec_ip("192.0.2.3").annotate(IPS, "192.0.2.4"),
                Error("conflicting_annotations"),
            ),
            (
                svc("s3").spec_ip("192.0.2.3").annotate(IPS, "192.0.2.3"),
                Ips(&["192.0.2.3"]),
            ),
            // autoAssign false does not stop a named address.
            (svc("s4").spec_ip("203.0.113.5"), Ips(&["203.0.113.5"])),
            // A named address must be in the named pool.
            (
                svc("s5").spec_ip("192.0.2.9").annotate(POOL, "manual"),
                Error("ip_not_in_pool"),
            ),
            (
                svc("s5").spec_ip("192.0.2.9").annotate(POOL, "v4"),
                Ips(&["192.0.2.9"]),
            ),
            // Dual stack from one pool.
            (
                svc("s6")
                    .annotate(IPS, "198.51.100.4, 2001:db8:1::4")
                    .families(IpFamilyPolicy::RequireDualStack, &[Family::V4, Family::V6]),
                Ips(&["198.51.100.4", "2001:db8:1::4"]),
            ),
            // Addresses from two pools do not make one dual-stack Service.
            (
                svc("s7")
                    .annotate(IPS, "192.0.2.10,2001:db8::10")
                    .families(IpFamilyPolicy::RequireDualStack, &[Family::V4, Family::V6]),
                Error("ip_not_in_pool"),
            ),
            // The address must be of a family the Service has.
            (
                svc("s8")
                    .spec_ip("2001:db8::5")
                    .families(IpFamilyPolicy::SingleStack, &[Family::V4]),
                Error("ip_family_mismatch"),
            ),
            (
                svc("s8")
                    .spec_ip("2001:db8::5")
                    .families(IpFamilyPolicy::SingleStack, &[Family::V6]),
                Ips(&["2001:db8::5"]),
            ),
            (
                svc("s9")
                    .annotate(IPS, "198.51.100.9")
                    .families(IpFamilyPolicy::RequireDualStack, &[Family::V4, Family::V6]),
                Error("family_unavailable"),
            ),
        ],
    );
}

#[test]
fn every_annotation_spelling_is_read_and_disagreeing_spellings_are_refused() {
    let mut a = allocator(vec![
        pool("a", &["192.0.2.0/28"]),
        pool("b", &["198.51.100.0/28"]),
    ]);
    use Want::*;
    run(
        &mut a,
        &[
            (
                svc("s1").annotate("metallb.io/address-pool", "b"),
                Ips(&["198.51.100.0"]),
            ),
            (
                svc("s2").annotate("metallb.universe.tf/address-pool", "b"),
                Ips(&["198.51.100.1"]),
            ),
            (
                svc("s3").annotate("metallb.universe.tf/loadBalancerIPs", "192.0.2.7"),
                Ips(&["192.0.2.7"]),
            ),
            (
                svc("s4")
                    .annotate("swimlb.io/address-pool", "a")
                    .annotate("metallb.io/address-pool", "b"),
                Error("conflicting_annotations"),
            ),
            (
                svc("s4")
                    .annotate("swimlb.io/address-pool", "a")
                    .annotate("metallb.io/address-pool", "a"),
                Ips(&["192.0.2.0"]),
            ),
            (svc("s5").annotate(POOL, "nope"), Error("unknown_pool")),
            (
                svc("s6").annotate("metallb.io/loadBalancerIPs", "192.0.2.9"),
                Ips(&["192.0.2.9"]),
            ),
            (
                svc("s7")
                    .annotate("metallb.io/loadBalancerIPs", "192.0.2.10")
                    .annotate("metallb.universe.tf/loadBalancerIPs", "192.0.2.11"),
                Error("conflicting_annotations"),
            ),
            // Every spelling of allow-shared-ip is one key: these three share 198.51.100.5.
            (
                svc("s8")
                    .annotate("metallb.io/allow-shared-ip", "k")
                    .annotate(IPS, "198.51.100.5")
                    .ports(&[(53, Protocol::Udp)]),
                Ips(&["198.51.100.5"]),
            ),
            (
                svc("s9")
                    .annotate("metallb.universe.tf/allow-shared-ip", "k")
                    .annotate(IPS, "198.51.100.5")
                    .ports(&[(53, Protocol::Tcp)]),
                Ips(&["198.51.100.5"]),
            ),
            (
                svc("s10")
                    .annotate(SHARE, "k")
                    .annotate(IPS, "198.51.100.5")
                    .ports(&[(443, Protocol::Tcp)]),
                Ips(&["198.51.100.5"]),
            ),
            (
                svc("s11")
                    .annotate("metallb.io/allow-shared-ip", "other")
                    .annotate(IPS, "198.51.100.5")
                    .ports(&[(8080, Protocol::Tcp)]),
                Error("ip_in_use"),
            ),
            (
                svc("s12")
                    .annotate("metallb.io/allow-shared-ip", "k")
                    .annotate("swimlb.io/allow-shared-ip", "j"),
                Error("conflicting_annotations"),
            ),
        ],
    );
}

#[test]
fn automatic_allocation_gives_the_lowest_free_address_until_the_pool_is_full() {
    let mut a = allocator(vec![pool("tiny", &["192.0.2.0/31", "192.0.2.8-192.0.2.8"])]);
    use Want::*;
    run(
        &mut a,
        &[
            (svc("s1"), Ips(&["192.0.2.0"])),
            (svc("s2"), Ips(&["192.0.2.1"])),
            (svc("s3"), Ips(&["192.0.2.8"])),
            (svc("s4"), Error("pool_exhausted")),
        ],
    );
    assert!(a.release(&ServiceKey::new("default", "s2")));
    assert!(
        !a.release(&ServiceKey::new("default", "s2")),
        "releasing twice holds nothing"
    );
    check(&mut a, 4, &svc("s4"), &Ips(&["192.0.2.1"]));
    check(&mut a, 5, &svc("s5"), &Error("pool_exhausted"));
}

#[test]
fn avoid_buggy_ips_skips_dot_zero_and_dot_255() {
    let mut a = allocator(vec![buggy(pool("b", &["192.0.2.254-192.0.3.1"]))]);
    use Want::*;
    run(
        &mut a,
        &[
            (svc("s1"), Ips(&["192.0.2.254"])),
            (svc("s2"), Ips(&["192.0.3.1"])),
            (svc("s3"), Error("pool_exhausted")),
            (svc("s4").spec_ip("192.0.2.255"), Error("ip_not_in_pool")),
        ],
    );
    let mut plain = allocator(vec![pool("p", &["192.0.2.255-192.0.3.0"])]);
    check(&mut plain, 0, &svc("s1"), &Ips(&["192.0.2.255"]));
}

#[test]
fn pools_are_tried_by_service_allocation_priority_then_auto_assign() {
    let mut a = allocator(vec![
        pool("a-open", &["192.0.2.0/30"]),
        restricted(pool("b-prio20", &["198.51.100.0/30"]), 20, &[]),
        restricted(pool("c-prio10-team", &["203.0.113.0/31"]), 10, &["team"]),
        no_auto(pool("d-manual", &["203.0.113.128/30"])),
    ]);
    use Want::*;
    run(
        &mut a,
        &[
            // Only namespace "team" is admitted by the priority-10 pool.
            (svc("team/s1"), Ips(&["203.0.113.0"])),
            (svc("team/s2"), Ips(&["203.0.113.1"])),
            // Full: the next pool by priority.
            (svc("team/s3"), Ips(&["198.51.100.0"])),
            (svc("other/s1"), Ips(&["198.51.100.1"])),
            (svc("other/s2"), Ips(&["198.51.100.2"])),
            (svc("other/s3"), Ips(&["198.51.100.3"])),
            // Then the pools without serviceAllocation; never the manual one.
            (svc("other/s4"), Ips(&["192.0.2.0"])),
            // A restricted pool refuses a Service it does not admit even when named.
            (
                svc("other/s5").annotate(POOL, "c-prio10-team"),
                Error("pool_not_allowed"),
            ),
            (
                svc("other/s5").annotate(POOL, "d-manual"),
                Ips(&["203.0.113.128"]),
            ),
        ],
    );
}

#[test]
fn a_pool_without_priority_comes_after_every_prioritised_one_and_before_plain_pools() {
    // MetalLB's order: priority > 0 ascending, then serviceAllocation without priority (0),
    // then pools without serviceAllocation. Names would order them the other way round.
    let mut a = allocator(vec![
        pool("a-plain", &["192.0.2.0/31"]),
        restricted(pool("b-prio0", &["198.51.100.0/31"]), 0, &[]),
        restricted(pool("c-prio7", &["203.0.113.0/32"]), 7, &[]),
        restricted(pool("d-prio3", &["203.0.113.8/32"]), 3, &[]),
    ]);
    use Want::*;
    run(
        &mut a,
        &[
            (svc("s1"), Ips(&["203.0.113.8"])),
            (svc("s2"), Ips(&["203.0.113.0"])),
            (svc("s3"), Ips(&["198.51.100.0"])),
            (svc("s4"), Ips(&["198.51.100.1"])),
            (svc("s5"), Ips(&["192.0.2.0"])),
        ],
    );
}

#[test]
fn service_selectors_of_a_pool_choose_services_by_label() {
    let mut p = pool("web-only", &["192.0.2.0/30"]);
    p.spec.service_allocation = Some(ServiceAllocation {
        priority: 1,
        service_selectors: vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                match_labels: Some([("app".to_string(), "web".to_string())].into()),
                match_expressions: None,
            },
        ],
        namespace_selectors: vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                match_labels: Some([("env".to_string(), "prod".to_string())].into()),
                match_expressions: None,
            },
        ],
        ..Default::default()
    });
    let mut a = allocator(vec![p, pool("rest", &["198.51.100.0/30"])]);
    let web = |s: ServiceView| {
        s.with(|s| {
            s.labels.insert("app".into(), "web".into());
        })
    };
    let prod = |s: ServiceView| {
        s.with(|s| {
            s.namespace_labels.insert("env".into(), "prod".into());
        })
    };
    use Want::*;
    run(
        &mut a,
        &[
            (prod(web(svc("s1"))), Ips(&["192.0.2.0"])),
            (web(svc("s2")), Ips(&["198.51.100.0"])),
            (prod(svc("s3")), Ips(&["198.51.100.1"])),
        ],
    );
}

#[test]
fn families_follow_ip_families_and_policy() {
    let mut a = allocator(vec![
        pool("v4", &["192.0.2.0/30"]),
        pool("dual", &["198.51.100.0/30", "2001:db8::/126"]),
        pool("v6", &["2001:db8:1::/126"]),
    ]);
    use IpFamilyPolicy::*;
    use Want::*;
    run(
        &mut a,
        &[
            (
                svc("s1").families(RequireDualStack, &[Family::V6, Family::V4]),
                Ips(&["2001:db8::", "198.51.100.0"]),
            ),
            (
                svc("s2").families(PreferDualStack, &[Family::V4, Family::V6]),
                Ips(&["198.51.100.1", "2001:db8::1"]),
            ),
            // Pools by name: dual, v4, v6. SingleStack IPv6 takes the first pool with IPv6.
            (
                svc("s3").families(SingleStack, &[Family::V6]),
                Ips(&["2001:db8::2"]),
            ),
            (
                svc("s4").families(SingleStack, &[Family::V4]),
                Ips(&["198.51.100.2"]),
            ),
            (
                svc("s5").families(PreferDualStack, &[Family::V4, Family::V6]),
                Ips(&["198.51.100.3", "2001:db8::3"]),
            ),
            // dual is full: PreferDualStack settles for one family elsewhere.
            (
                svc("s6").families(PreferDualStack, &[Family::V4, Family::V6]),
                Ips(&["192.0.2.0"]),
            ),
            (
                svc("s7").families(RequireDualStack, &[Family::V4, Family::V6]),
                Error("pool_exhausted"),
            ),
            (
                svc("s8")
                    .annotate(POOL, "v4")
                    .families(RequireDualStack, &[Family::V4, Family::V6]),
                Error("family_unavailable"),
            ),
            (
                svc("s9")
                    .annotate(POOL, "v6")
                    .families(SingleStack, &[Family::V6]),
                Ips(&["2001:db8:1::"]),
            ),
        ],
    );
    let mut only_v4 = allocator(vec![pool("v4", &["192.0.2.0/30"])]);
    check(
        &mut only_v4,
        0,
        &svc("x").families(SingleStack, &[Family::V6]),
        &Error("family_unavailable"),
    );
}

#[test]
fn sharing_needs_the_same_key_disjoint_ports_and_the_same_backend() {
    let mut a = allocator(vec![pool("p", &["192.0.2.0/29"])]);
    use Protocol::*;
    use Want::*;
    run(
        &mut a,
        &[
            (
                svc("s1")
                    .spec_ip("192.0.2.1")
                    .annotate(SHARE, "k")
                    .ports(&[(80, Tcp)]),
                Ips(&["192.0.2.1"]),
            ),
            // Same key, other port: shares.
            (
                svc("s2")
                    .spec_ip("192.0.2.1")
                    .annotate(SHARE, "k")
                    .ports(&[(443, Tcp)]),
                Ips(&["192.0.2.1"]),
            ),
            // Same port number, other protocol: shares.
            (
                svc("s3")
                    .annotate("metallb.universe.tf/allow-shared-ip", "k")
                    .ports(&[(80, Udp)]),
                Ips(&["192.0.2.1"]),
            ),
            // Same port and protocol: refused when asked, a new address when automatic.
            (
                svc("s4")
                    .spec_ip("192.0.2.1")
                    .annotate(SHARE, "k")
                    .ports(&[(443, Tcp)]),
                Error("ip_in_use"),
            ),
            (
                svc("s4").annotate(SHARE, "k").ports(&[(443, Tcp)]),
                Ips(&["192.0.2.0"]),
            ),
            // Other key, or no key: refused.
            (
                svc("s5")
                    .spec_ip("192.0.2.1")
                    .annotate(SHARE, "other")
                    .ports(&[(8080, Tcp)]),
                Error("ip_in_use"),
            ),
            (
                svc("s5").spec_ip("192.0.2.1").ports(&[(8080, Tcp)]),
                Error("ip_in_use"),
            ),
            // Other traffic policy: refused.
            (
                svc("s6")
                    .spec_ip("192.0.2.1")
                    .annotate(SHARE, "k")
                    .ports(&[(9000, Tcp)])
                    .local(&[]),
                Error("ip_in_use"),
            ),
            // Local with the same selector shares, with another selector does not.
            (
                svc("l1")
                    .spec_ip("192.0.2.5")
                    .annotate(SHARE, "l")
                    .local(&[("app", "a")]),
                Ips(&["192.0.2.5"]),
            ),
            (
                svc("l2")
                    .spec_ip("192.0.2.5")
                    .annotate(SHARE, "l")
                    .ports(&[(81, Tcp)])
                    .local(&[("app", "a")]),
                Ips(&["192.0.2.5"]),
            ),
            (
                svc("l3")
                    .spec_ip("192.0.2.5")
                    .annotate(SHARE, "l")
                    .ports(&[(82, Tcp)])
                    .local(&[("app", "b")]),
                Error("ip_in_use"),
            ),
        ],
    );
    assert_eq!(a.holders(ip("192.0.2.1")).len(), 3);
    // The address stays held until its last sharer goes.
    a.release(&ServiceKey::new("default", "s1"));
    a.release(&ServiceKey::new("default", "s2"));
    check(
        &mut a,
        100,
        &svc("x").spec_ip("192.0.2.1").ports(&[(80, Udp)]),
        &Error("ip_in_use"),
    );
    a.release(&ServiceKey::new("default", "s3"));
    check(
        &mut a,
        101,
        &svc("x").spec_ip("192.0.2.1").ports(&[(80, Udp)]),
        &Ips(&["192.0.2.1"]),
    );
}

#[test]
fn a_service_that_stops_being_ours_releases_its_address() {
    let mut a = allocator(vec![pool("p", &["192.0.2.0/31"])]);
    use Want::*;
    run(
        &mut a,
        &[
            (svc("s1"), Ips(&["192.0.2.0"])),
            (
                svc("s1").with(|s| s.is_load_balancer = false),
                NotOurs("not_load_balancer"),
            ),
            (svc("s2"), Ips(&["192.0.2.0"])),
            (
                svc("s2").with(|s| s.load_balancer_class = Some("other".into())),
                NotOurs("other_class"),
            ),
            (svc("s3"), Ips(&["192.0.2.0"])),
        ],
    );
    let model = validate(&[pool("p", &["192.0.2.0/31"])], &[])
        .into_result()
        .expect("valid");
    let mut classy = Allocator::new(Some("swimlb.io/l2".into()), &model);
    classy.load_existing(&[]);
    check(&mut classy, 0, &svc("s1"), &NotOurs("other_class"));
    check(
        &mut classy,
        1,
        &svc("s1").with(|s| s.load_balancer_class = Some("swimlb.io/l2".into())),
        &Ips(&["192.0.2.0"]),
    );
}

#[test]
fn a_service_keeps_a_valid_address_and_moves_off_an_invalid_one() {
    let mut a = allocator(vec![
        pool("a", &["192.0.2.0/30"]),
        pool("b", &["198.51.100.0/30"]),
    ]);
    use Want::*;
    run(
        &mut a,
        &[
            // A status address that is valid and free is taken back as it is.
            (svc("s1").status(&["192.0.2.3"]), Unchanged),
            (svc("s1").status(&["192.0.2.3"]), Unchanged),
            // Status lost: the held address is written again.
            (svc("s1"), Ips(&["192.0.2.3"])),
            // Naming another pool moves it.
            (
                svc("s1").annotate(POOL, "b").status(&["192.0.2.3"]),
                Ips(&["198.51.100.0"]),
            ),
            // The status address is held by someone else: a fresh one.
            (svc("s2").status(&["198.51.100.0"]), Ips(&["192.0.2.0"])),
        ],
    );
    // The pool shrinks under a held address: the next look moves the Service.
    let model = validate(
        &[
            pool("a", &["192.0.2.0/31"]),
            pool("b", &["198.51.100.0/30"]),
        ],
        &[],
    )
    .into_result()
    .expect("valid");
    a.set_pools(&model);
    check(&mut a, 10, &svc("s2").status(&["192.0.2.0"]), &Unchanged);
    check(
        &mut a,
        11,
        &svc("s9").status(&["192.0.2.3"]),
        &Ips(&["192.0.2.1"]),
    );
    assert_eq!(
        a.holding(&ServiceKey::new("default", "s9")),
        Some((Some("a"), &ips(&["192.0.2.1"])[..]))
    );
}

fn model(pools: &[IPAddressPool]) -> swimlb_config::pools::Model {
    validate(pools, &[])
        .into_result()
        .expect("test pools are valid")
}

#[test]
fn a_restart_with_a_pool_out_of_force_keeps_the_addresses_of_its_services() {
    // Pool b is invalid at the start: only a is in force.
    let mut a = Allocator::new(None, &model(&[pool("a", &["192.0.2.0/30"])]));
    let conflicts = a.load_existing(&[
        svc("s1").status(&["198.51.100.1"]),
        svc("s2").status(&["198.51.100.2"]).annotate(POOL, "b"),
        svc("s3").status(&["192.0.2.0"]),
        // Names another address than its status shows: not kept.
        svc("s4").status(&["198.51.100.3"]).spec_ip("192.0.2.1"),
    ]);
    assert_eq!(conflicts.len(), 1, "{conflicts:?}");
    assert_eq!(conflicts[0].service, ServiceKey::new("default", "s4"));
    assert_eq!(
        a.holding(&ServiceKey::new("default", "s1")),
        Some((None, &ips(&["198.51.100.1"])[..]))
    );
    assert_eq!(a.kept_outside_pools(), 2);
    let kept = |list: &[&str]| Verdict::Kept { ips: ips(list) };
    assert_eq!(
        a.assign(&svc("s1").status(&["198.51.100.1"])),
        kept(&["198.51.100.1"])
    );
    // Naming the pool that is not in force does not clear it either.
    assert_eq!(
        a.assign(&svc("s2").status(&["198.51.100.2"]).annotate(POOL, "b")),
        kept(&["198.51.100.2"])
    );
    use Want::*;
    run(
        &mut a,
        &[
            (svc("s3").status(&["192.0.2.0"]), Unchanged),
            (
                svc("s4").status(&["198.51.100.3"]).spec_ip("192.0.2.1"),
                Ips(&["192.0.2.1"]),
            ),
            (svc("new"), Ips(&["192.0.2.2"])),
            // A kept address is nobody else's.
            (
                svc("other").spec_ip("198.51.100.1"),
                Error("ip_not_in_pool"),
            ),
            // Asking for something else moves the Service.
            (
                svc("s1").status(&["198.51.100.1"]).annotate(POOL, "a"),
                Ips(&["192.0.2.3"]),
            ),
        ],
    );
    assert_eq!(a.kept_outside_pools(), 1);
    // Pool b is valid again: s2's address is its again, and in use.
    a.set_pools(&model(&[
        pool("a", &["192.0.2.0/30"]),
        pool("b", &["198.51.100.0/30"]),
    ]));
    assert_eq!(a.kept_outside_pools(), 0);
    check(
        &mut a,
        10,
        &svc("s2").status(&["198.51.100.2"]).annotate(POOL, "b"),
        &Unchanged,
    );
    check(
        &mut a,
        11,
        &svc("s5").annotate(POOL, "b"),
        &Ips(&["198.51.100.0"]),
    );
    check(
        &mut a,
        12,
        &svc("s6").annotate(POOL, "b"),
        &Ips(&["198.51.100.1"]),
    );
    check(
        &mut a,
        13,
        &svc("s7").annotate(POOL, "b"),
        &Ips(&["198.51.100.3"]),
    );
}

#[test]
fn a_deleted_pool_leaves_its_addresses_and_a_shrunk_one_moves_them() {
    let mut a = allocator(vec![
        pool("a", &["192.0.2.0/30"]),
        pool("b", &["198.51.100.0/30"]),
    ]);
    use Want::*;
    run(
        &mut a,
        &[
            (svc("s1").annotate(POOL, "b"), Ips(&["198.51.100.0"])),
            (svc("s2"), Ips(&["192.0.2.0"])),
            (svc("s3"), Ips(&["192.0.2.1"])),
        ],
    );
    // b is deleted: s1 keeps its address until it asks for another.
    a.set_pools(&model(&[pool("a", &["192.0.2.0/30"])]));
    assert_eq!(
        a.assign(&svc("s1").annotate(POOL, "b").status(&["198.51.100.0"])),
        Verdict::Kept {
            ips: ips(&["198.51.100.0"])
        }
    );
    check(
        &mut a,
        3,
        &svc("s1").status(&["198.51.100.0"]),
        &Ips(&["192.0.2.2"]),
    );
    // Pinned to pool c, whose addresses another pool covers once c is gone: kept as well.
    a.set_pools(&model(&[
        pool("a", &["192.0.2.0/30"]),
        pool("c", &["203.0.113.0/30"]),
    ]));
    check(
        &mut a,
        5,
        &svc("pin").annotate(POOL, "c"),
        &Ips(&["203.0.113.0"]),
    );
    a.set_pools(&model(&[
        pool("a", &["192.0.2.0/30"]),
        pool("wide", &["203.0.113.0/24"]),
    ]));
    assert_eq!(
        a.assign(&svc("pin").annotate(POOL, "c").status(&["203.0.113.0"])),
        Verdict::Kept {
            ips: ips(&["203.0.113.0"])
        }
    );
    check(
        &mut a,
        6,
        &svc("next").annotate(POOL, "wide"),
        &Ips(&["203.0.113.1"]),
    );
    // a shrinks under s3 (a pool in force): s3 moves.
    a.set_pools(&model(&[pool(
        "a",
        &["192.0.2.0-192.0.2.0", "192.0.2.2-192.0.2.3"],
    )]));
    check(
        &mut a,
        4,
        &svc("s3").status(&["192.0.2.1"]),
        &Ips(&["192.0.2.3"]),
    );
}

#[test]
fn nothing_is_assigned_before_existing_assignments_are_loaded() {
    let model = validate(&[pool("p", &["192.0.2.0/30"])], &[])
        .into_result()
        .expect("valid");
    let mut a = Allocator::new(None, &model);
    assert_eq!(a.assign(&svc("early")), Verdict::NotLoaded);
    assert!(a.holding(&ServiceKey::new("default", "early")).is_none());
    // The load restores the existing holder first, so the early Service cannot take its address.
    a.load_existing(&[svc("old").status(&["192.0.2.0"])]);
    check(&mut a, 0, &svc("early"), &Want::Ips(&["192.0.2.1"]));
}

#[test]
fn loading_existing_statuses_restores_holdings_and_reports_duplicates() {
    let mut a = allocator(vec![pool("p", &["192.0.2.0/29"])]);
    let existing = vec![
        svc("b/second").status(&["192.0.2.1"]),
        svc("a/first").status(&["192.0.2.1"]),
        svc("c/third").status(&["192.0.2.0"]),
        svc("d/outside").status(&["203.0.113.1"]),
        svc("e/notlb")
            .status(&["192.0.2.2"])
            .with(|s| s.is_load_balancer = false),
        svc("f/none"),
    ];
    let conflicts = a.load_existing(&existing);
    let reported: Vec<(String, &str)> = conflicts
        .iter()
        .map(|c| (c.service.to_string(), c.error.as_str()))
        .collect();
    assert_eq!(reported, vec![("b/second".to_string(), "ip_in_use")]);
    assert_eq!(
        a.holding(&ServiceKey::new("d", "outside")),
        Some((None, &ips(&["203.0.113.1"])[..])),
        "an address outside every pool in force is kept"
    );
    assert_eq!(a.holders(ip("192.0.2.1")), &[ServiceKey::new("a", "first")]);
    assert!(
        a.holding(&ServiceKey::new("f", "none")).is_none(),
        "loading never allocates"
    );
    // Afterwards, new Services never get a loaded address.
    use Want::*;
    run(
        &mut a,
        &[
            (svc("a/first").status(&["192.0.2.1"]), Unchanged),
            (svc("f/none"), Ips(&["192.0.2.2"])),
            (svc("b/second").status(&["192.0.2.1"]), Ips(&["192.0.2.3"])),
        ],
    );
}

#[test]
fn pool_usage_counts_sizes_and_held_addresses_per_family() {
    let mut a = allocator(vec![buggy(pool("p", &["192.0.2.0/24", "2001:db8::/120"]))]);
    a.assign(&svc("s1").families(IpFamilyPolicy::RequireDualStack, &[Family::V4, Family::V6]));
    a.assign(&svc("s2").spec_ip("192.0.2.9").annotate(SHARE, "k"));
    a.assign(
        &svc("s3")
            .spec_ip("192.0.2.9")
            .annotate(SHARE, "k")
            .ports(&[(1, Protocol::Udp)]),
    );
    let usage = a.usage();
    assert_eq!(
        usage,
        vec![
            PoolUsage {
                pool: "p".into(),
                family: Family::V4,
                size: 254,
                in_use: 2
            },
            PoolUsage {
                pool: "p".into(),
                family: Family::V6,
                size: 256,
                in_use: 1
            },
        ]
    );
}

#[test]
fn a_tiny_ipv6_range_at_the_top_of_the_space_does_not_overflow() {
    let mut a = allocator(vec![pool(
        "top",
        &["ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe/127"],
    )]);
    use Want::*;
    let v6 = |s: ServiceView| s.families(IpFamilyPolicy::SingleStack, &[Family::V6]);
    run(
        &mut a,
        &[
            (
                v6(svc("s1")),
                Ips(&["ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe"]),
            ),
            (
                v6(svc("s2")),
                Ips(&["ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"]),
            ),
            (v6(svc("s3")), Error("pool_exhausted")),
        ],
    );
}

/// An operation of the property tests.
#[derive(Clone, Debug)]
enum Op {
    Assign {
        service: u8,
        requested: Option<u8>,
        key: Option<u8>,
        port: u8,
    },
    Release {
        service: u8,
    },
    /// Switch between the wide and the narrow pool set.
    Reconfigure {
        narrow: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..24, proptest::option::of(0u8..20), proptest::option::of(0u8..2), 0u8..3)
            .prop_map(|(service, requested, key, port)| Op::Assign { service, requested, key, port }),
        2 => (0u8..24).prop_map(|service| Op::Release { service }),
        1 => any::<bool>().prop_map(|narrow| Op::Reconfigure { narrow }),
    ]
}

fn pools_for(narrow: bool) -> swimlb_config::pools::Model {
    let pools = if narrow {
        vec![
            pool("p", &["192.0.2.0/29"]),
            buggy(pool("q", &["192.0.2.8/30"])),
        ]
    } else {
        vec![pool("p", &["192.0.2.0/28"])]
    };
    validate(&pools, &[]).into_result().expect("valid pools")
}

/// The internal indexes agree: every held address is indexed under its holders, the used sets
/// hold exactly the addresses with holders inside the pools, and the cursors are below every
/// free address.
fn assert_consistent(a: &Allocator) {
    for (key, h) in &a.holdings {
        for ip in &h.ips {
            assert!(
                a.holders(*ip).contains(key),
                "{key} holds {ip} but is not indexed"
            );
        }
    }
    for (ip, holders) in &a.holders {
        assert!(!holders.is_empty(), "{ip} indexed without holders");
        for k in holders {
            assert!(
                a.holdings.get(k).is_some_and(|h| h.ips.contains(ip)),
                "{ip} indexed under {k}"
            );
        }
    }
    for state in a.pools.values() {
        for r in &state.ranges {
            for n in &r.used {
                assert!(
                    a.holders.contains_key(&u128_to_ip(r.range.family, *n)),
                    "used {n} without holder"
                );
            }
            let held = a.holders.keys().filter(|ip| r.range.contains(**ip)).count();
            assert_eq!(
                r.used.len(),
                held,
                "used set of {} disagrees with holders",
                r.range
            );
            let lowest_unused = (r.range.start..=r.range.end).find(|n| !r.used.contains(n));
            if let Some(n) = lowest_unused {
                assert!(
                    r.cursor <= n,
                    "cursor {} above the free {n} in {}",
                    r.cursor,
                    r.range
                );
            }
        }
    }
}

fn view(service: u8, requested: Option<u8>, key: Option<u8>, port: u8) -> ServiceView {
    let mut s = svc(&format!("default/s{service}")).ports(&[(i32::from(port), Protocol::Tcp)]);
    if let Some(r) = requested {
        s = s.spec_ip(&format!("192.0.2.{r}"));
    }
    if let Some(k) = key {
        s = s.annotate(SHARE, &format!("key{k}"));
    }
    s
}

fn apply(a: &mut Allocator, ops: &[Op]) -> Vec<String> {
    let mut log = Vec::new();
    for op in ops {
        match op {
            Op::Assign {
                service,
                requested,
                key,
                port,
            } => {
                log.push(format!(
                    "{:?}",
                    a.assign(&view(*service, *requested, *key, *port))
                ));
            }
            Op::Release { service } => {
                log.push(format!(
                    "{}",
                    a.release(&ServiceKey::new("default", format!("s{service}")))
                ));
            }
            Op::Reconfigure { narrow } => a.set_pools(&pools_for(*narrow)),
        }
    }
    log
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, rng_seed: proptest::test_runner::RngSeed::Fixed(6), ..ProptestConfig::default() })]

    #[test]
    fn no_address_is_held_by_two_services_that_may_not_share(ops in proptest::collection::vec(op(), 1..80)) {
        let mut a = allocator(vec![pool("p", &["192.0.2.0/28"])]);
        let mut views: BTreeMap<u8, ServiceView> = BTreeMap::new();
        for op in &ops {
            match op {
                Op::Assign { service, requested, key, port } => {
                    let v = view(*service, *requested, *key, *port);
                    a.assign(&v);
                    views.insert(*service, v);
                }
                Op::Release { service } => {
                    a.release(&ServiceKey::new("default", format!("s{service}")));
                    views.remove(service);
                }
                Op::Reconfigure { narrow } => a.set_pools(&pools_for(*narrow)),
            }
            assert_consistent(&a);
            for n in 0..16u8 {
                let holders = a.holders(ip(&format!("192.0.2.{n}")));
                for (i, x) in holders.iter().enumerate() {
                    for y in &holders[i + 1..] {
                        let vx = views.values().find(|v| &v.key == x).expect("holder was assigned");
                        let vy = views.values().find(|v| &v.key == y).expect("holder was assigned");
                        let sx = Sharing::of(vx, parse_request(vx).expect("valid").sharing.key);
                        let sy = Sharing::of(vy, parse_request(vy).expect("valid").sharing.key);
                        prop_assert!(sx.compatible(&sy), "{x} and {y} hold 192.0.2.{n} without being able to share");
                    }
                }
            }
        }
    }

    #[test]
    fn release_then_allocate_yields_a_free_address(
        fill in 1u8..16,
        freed in proptest::collection::btree_set(0u8..16, 1..4),
    ) {
        let mut a = allocator(vec![pool("p", &["192.0.2.0/28"])]);
        for s in 0..fill {
            a.assign(&svc(&format!("default/s{s}")));
        }
        let mut released = BTreeSet::new();
        for s in freed.iter().filter(|s| **s < fill) {
            let (_, held) = a.holding(&ServiceKey::new("default", format!("s{s}"))).expect("assigned");
            released.insert(held[0]);
            a.release(&ServiceKey::new("default", format!("s{s}")));
        }
        match a.assign(&svc("default/new")) {
            Verdict::Assigned { ips, .. } => {
                prop_assert_eq!(ips.len(), 1);
                prop_assert_eq!(a.holders(ips[0]).len(), 1, "the new address was free");
                // The lowest free address: a released one if any, else the next never used.
                let lowest = released.iter().next().copied().unwrap_or(ip(&format!("192.0.2.{fill}")));
                prop_assert_eq!(ips[0], lowest);
            }
            other => prop_assert!(false, "a pool with free addresses refused: {other:?}"),
        }
    }

    #[test]
    fn the_same_inputs_give_the_same_outputs(ops in proptest::collection::vec(op(), 1..60)) {
        let mut first = allocator(vec![pool("p", &["192.0.2.0/28"])]);
        let mut second = allocator(vec![pool("p", &["192.0.2.0/28"])]);
        prop_assert_eq!(apply(&mut first, &ops), apply(&mut second, &ops));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, rng_seed: proptest::test_runner::RngSeed::Fixed(7), ..ProptestConfig::default() })]

    #[test]
    fn any_annotation_or_field_text_gets_a_verdict_without_panicking(
        ip_text in "[0-9a-f:., ]{0,40}",
        pool_name in "[a-z]{0,3}",
        key in "[a-z]{0,2}",
        families in proptest::collection::vec(prop_oneof![Just(Family::V4), Just(Family::V6)], 0..3),
        policy in prop_oneof![
            Just(IpFamilyPolicy::SingleStack),
            Just(IpFamilyPolicy::PreferDualStack),
            Just(IpFamilyPolicy::RequireDualStack)
        ],
    ) {
        let mut a = allocator(vec![pool("p", &["192.0.2.0/30", "2001:db8::/126"]), buggy(pool("q", &["198.51.100.0/31"]))]);
        let s = svc("x")
            .annotate(IPS, &ip_text)
            .annotate("metallb.io/address-pool", &pool_name)
            .annotate(SHARE, &key)
            .families(policy, &families);
        let verdict = a.assign(&s);
        let again = a.assign(&s);
        match verdict {
            Verdict::Assigned { ips, .. } => {
                prop_assert!(!ips.is_empty());
                prop_assert!(matches!(again, Verdict::Assigned { .. }), "a repeated request keeps its addresses");
            }
            Verdict::Error(_) => prop_assert!(a.holding(&s.key).is_none()),
            other => prop_assert!(false, "unexpected {other:?}"),
        }
    }
}
