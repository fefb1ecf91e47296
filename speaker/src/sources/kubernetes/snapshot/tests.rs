//! Table tests of [`build`]: one rule per test, each named as the rule it checks.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};
use swimlb_config::crd::{IPAddressPool, L2Advertisement};
use swimlb_config::service::ServiceKey;

use super::*;
use crate::model::election::{Election, Outcome};
use crate::model::membership::{LiveSet, MemberMeta};
use crate::sources::kubernetes::views::{
    ServiceView as Service, SliceView as EndpointSlice, trim_slice,
};

const NS: &str = "swimlb-system";

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test IP")
}

fn from_json<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).expect("test object is valid")
}

/// A LoadBalancer Service `ns/name` with these ingress IPs and `extra` merged into it.
fn service(key: &str, ips: &[&str], extra: Value) -> Service {
    let (namespace, name) = key.split_once('/').expect("ns/name");
    let ingress: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
    let mut value = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"type": "LoadBalancer"},
        "status": {"loadBalancer": {"ingress": ingress}},
    });
    merge(&mut value, extra);
    from_json(value)
}

fn merge(into: &mut Value, extra: Value) {
    match (into, extra) {
        (Value::Object(into), Value::Object(extra)) => {
            for (k, v) in extra {
                merge(into.entry(k).or_insert(Value::Null), v);
            }
        }
        (into, extra) => *into = extra,
    }
}

/// An endpoint: node, `ready`, `serving` (None: unset).
type Ep = (Option<&'static str>, Option<bool>, Option<bool>);

/// The EndpointSlice `name` of Service `key` with these endpoints.
fn slice(key: &str, name: &str, endpoints: &[Ep]) -> EndpointSlice {
    let (namespace, service) = key.split_once('/').expect("ns/name");
    let endpoints: Vec<Value> = endpoints
        .iter()
        .enumerate()
        .map(|(i, (node, ready, serving))| {
            let mut conditions = json!({});
            if let Some(ready) = ready {
                conditions["ready"] = json!(ready);
            }
            if let Some(serving) = serving {
                conditions["serving"] = json!(serving);
            }
            let mut endpoint =
                json!({"addresses": [format!("10.244.0.{i}")], "conditions": conditions});
            if let Some(node) = node {
                endpoint["nodeName"] = json!(node);
            }
            endpoint
        })
        .collect();
    from_json(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": namespace, "name": name,
            "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": endpoints,
    }))
}

/// One endpoint on `node` that is ready.
fn ready_on(key: &str, node: &'static str) -> EndpointSlice {
    slice(
        key,
        &format!("{}-{node}", key.replace('/', "-")),
        &[(Some(node), Some(true), None)],
    )
}

fn node(name: &str, labels: Value) -> Node {
    from_json(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels}}))
}

fn node_with_condition(name: &str, condition: &str, status: &str) -> Node {
    from_json(
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
        "status": {"conditions": [{"type": condition, "status": status}]}}),
    )
}

fn pool(name: &str, addresses: &[&str]) -> IPAddressPool {
    IPAddressPool::with_addresses(NS, name, addresses)
}

fn labelled_pool(name: &str, addresses: &[&str], labels: Value) -> IPAddressPool {
    let mut p = pool(name, addresses);
    p.metadata.labels = Some(from_json(labels));
    p
}

fn adv(name: &str, spec: Value) -> L2Advertisement {
    from_json(
        json!({"apiVersion": "swimlb.io/v1beta1", "kind": "L2Advertisement",
        "metadata": {"namespace": NS, "name": name}, "spec": spec}),
    )
}

/// The caches of a test, owned.
#[derive(Default)]
struct World {
    services: Vec<Service>,
    slices: Vec<EndpointSlice>,
    nodes: Vec<Node>,
    pools: Vec<IPAddressPool>,
    ads: Vec<L2Advertisement>,
}

impl World {
    /// Nodes `a`, `b`, `c`, pool `web` on 192.0.2.0/24 and 2001:db8::/64, one advertisement of
    /// every pool, no Service.
    fn three_nodes() -> World {
        World {
            nodes: ["a", "b", "c"].map(|n| node(n, json!({}))).to_vec(),
            pools: vec![pool("web", &["192.0.2.0/24", "2001:db8::/64"])],
            ads: vec![adv("all", json!({}))],
            ..World::default()
        }
    }

    /// A Cluster Service with a ready endpoint on `a`.
    fn with_service(mut self, key: &str, ips: &[&str], extra: Value) -> World {
        self.services.push(service(key, ips, extra));
        self.slices.push(ready_on(key, "a"));
        self
    }

    fn build(&self, options: &Options) -> Built {
        let services: Vec<&Service> = self.services.iter().collect();
        let slices: Vec<&EndpointSlice> = self.slices.iter().collect();
        let nodes: Vec<&Node> = self.nodes.iter().collect();
        let pools: Vec<&IPAddressPool> = self.pools.iter().collect();
        let ads: Vec<&L2Advertisement> = self.ads.iter().collect();
        build(
            Caches {
                services: &services,
                endpoint_slices: &slices,
                nodes: &nodes,
                pools: &pools,
                advertisements: &ads,
            },
            options,
        )
    }

    fn built(&self) -> Built {
        self.build(&Options::default())
    }
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

fn only(names: &[&str]) -> NodeFilter {
    NodeFilter::Only(Arc::new(set(names)))
}

fn labels(built: &Built) -> Vec<&'static str> {
    built.dropped.iter().map(Dropped::as_str).collect()
}

fn key(s: &str) -> ServiceKey {
    let (namespace, name) = s.split_once('/').expect("ns/name");
    ServiceKey::new(namespace, name)
}

/// The served IPs of a snapshot and who they belong to.
fn served(built: &Built) -> Vec<(IpAddr, String)> {
    built
        .snapshot
        .iter()
        .map(|(ip, s)| (*ip, s.belongs_to.to_string()))
        .collect()
}

fn live(nodes: &[&str]) -> LiveSet {
    let mut set = LiveSet::new();
    for node in nodes {
        let mut meta = MemberMeta::new(*node);
        meta.settled = true;
        set.upsert(meta);
    }
    set
}

#[test]
fn an_ip_in_an_advertised_pool_is_served_by_every_node_with_the_services_key() {
    let world = World::three_nodes().with_service("shop/web", &["192.0.2.10"], json!({}));
    let built = world.built();
    assert_eq!(built.dropped, vec![]);
    let entry = entry(&built, "192.0.2.10");
    assert_eq!(
        *entry,
        ServedIp {
            belongs_to: Owner::service("shop", "web"),
            group: None,
            interfaces: Interfaces::Default,
            nodes: only(&["a", "b", "c"]),
            ready_endpoints: None,
            node_priority: None,
            order_ip: Some(ip("192.0.2.10")),
            shared_with: None,
        }
    );
}

#[test]
fn services_that_are_not_ours_are_skipped_without_a_report() {
    type Case = (&'static str, Value, Options, bool);
    let class = || Options {
        load_balancer_class: Some("swimlb.io/l2".into()),
        ..Options::default()
    };
    let cases: Vec<Case> = vec![
        ("no class, default", json!({}), Options::default(), true),
        (
            "ClusterIP",
            json!({"spec": {"type": "ClusterIP"}}),
            Options::default(),
            false,
        ),
        (
            "another class",
            json!({"spec": {"loadBalancerClass": "other"}}),
            Options::default(),
            false,
        ),
        (
            "our class",
            json!({"spec": {"loadBalancerClass": "swimlb.io/l2"}}),
            class(),
            true,
        ),
        ("no class while serving one", json!({}), class(), false),
    ];
    for (name, extra, options, want) in cases {
        let world = World::three_nodes().with_service("shop/web", &["192.0.2.10"], extra);
        let built = world.build(&options);
        assert_eq!(built.snapshot.len(), usize::from(want), "{name}");
        assert_eq!(built.dropped, vec![], "{name}");
    }
    // Not allocated yet: nothing to serve, nothing wrong.
    let pending = World::three_nodes().with_service("shop/web", &[], json!({}));
    assert_eq!(pending.built(), Built::default());
}

#[test]
fn an_ip_outside_every_pool_leaves_the_service_out_and_is_counted() {
    let world =
        World::three_nodes().with_service("shop/web", &["192.0.2.10", "198.51.100.1"], json!({}));
    let built = world.built();
    assert!(
        built.snapshot.is_empty(),
        "MetalLB withdraws the whole Service"
    );
    assert_eq!(
        built.dropped,
        vec![Dropped::OutsidePools {
            service: key("shop/web"),
            ip: ip("198.51.100.1")
        }]
    );
    assert_eq!(
        built.dropped[0].to_string(),
        "Service shop/web: IP 198.51.100.1 is in no IPAddressPool; the Service is not announced"
    );
}

#[test]
fn ips_of_one_service_in_two_pools_leave_it_out() {
    let mut world =
        World::three_nodes().with_service("shop/web", &["192.0.2.10", "203.0.113.1"], json!({}));
    world.pools.push(pool("other", &["203.0.113.0/24"]));
    let built = world.built();
    assert!(built.snapshot.is_empty());
    assert_eq!(labels(&built), vec!["split_across_pools"]);
}

#[test]
fn an_unparsable_or_missing_ingress_ip_leaves_the_service_out() {
    for ingress in [
        json!([{"ip": "192.0.2.300"}]),
        json!([{"hostname": "lb.example"}]),
    ] {
        let mut world = World::three_nodes().with_service("shop/web", &[], json!({}));
        world.services[0]
            .status
            .as_mut()
            .expect("status")
            .load_balancer = Some(from_json(json!({"ingress": ingress})));
        let built = world.built();
        assert!(built.snapshot.is_empty(), "{ingress}");
        assert_eq!(labels(&built), vec!["invalid_ingress_ip"], "{ingress}");
    }
}

#[test]
fn an_ipv4_mapped_ingress_ip_is_read_as_ipv4() {
    let world = World::three_nodes().with_service("shop/web", &["::ffff:192.0.2.10"], json!({}));
    let built = world.built();
    assert_eq!(served(&built), vec![(ip("192.0.2.10"), "shop/web".into())]);
    assert_eq!(entry(&built, "192.0.2.10").order_ip, Some(ip("192.0.2.10")));
}

#[test]
fn advertisements_select_pools_by_name_by_label_or_all() {
    type Case = (&'static str, Value, bool);
    let cases: Vec<Case> = vec![
        ("neither names nor selectors: every pool", json!({}), true),
        ("by name", json!({"ipAddressPools": ["web"]}), true),
        ("another name", json!({"ipAddressPools": ["db"]}), false),
        (
            "by label",
            json!({"ipAddressPoolSelectors": [{"matchLabels": {"tier": "front"}}]}),
            true,
        ),
        (
            "another label",
            json!({"ipAddressPoolSelectors": [{"matchLabels": {"tier": "back"}}]}),
            false,
        ),
    ];
    for (name, spec, want) in cases {
        let mut world = World::three_nodes().with_service("shop/web", &["192.0.2.10"], json!({}));
        world.pools = vec![
            labelled_pool("web", &["192.0.2.0/24"], json!({"tier": "front"})),
            labelled_pool("db", &["203.0.113.0/24"], json!({"tier": "back"})),
        ];
        world.ads = vec![adv("l2", spec)];
        let built = world.built();
        assert_eq!(built.snapshot.len(), usize::from(want), "{name}");
        let want_dropped = if want {
            vec![]
        } else {
            vec![Dropped::NoMatchingAdvertisement {
                service: key("shop/web"),
                pool: "web".into(),
            }]
        };
        assert_eq!(built.dropped, want_dropped, "{name}");
    }
}

#[test]
fn service_selectors_are_ored_and_none_selects_every_service() {
    type Case = (&'static str, Value, bool);
    let cases: Vec<Case> = vec![
        ("no selectors", json!({}), true),
        (
            "one selector matches",
            json!({"serviceSelectors": [{"matchLabels": {"app": "db"}}, {"matchLabels": {"app": "web"}}]}),
            true,
        ),
        (
            "no selector matches",
            json!({"serviceSelectors": [{"matchLabels": {"app": "db"}}]}),
            false,
        ),
        (
            "an expression",
            json!({"serviceSelectors": [{"matchExpressions": [{"key": "app", "operator": "In", "values": ["web", "api"]}]}]}),
            true,
        ),
    ];
    for (name, spec, want) in cases {
        let mut world = World::three_nodes().with_service(
            "shop/web",
            &["192.0.2.10"],
            json!({"metadata": {"labels": {"app": "web"}}}),
        );
        world.ads = vec![adv("l2", spec)];
        let built = world.built();
        assert_eq!(built.snapshot.len(), usize::from(want), "{name}");
        let want_labels = if want {
            vec![]
        } else {
            vec!["no_matching_advertisement"]
        };
        assert_eq!(labels(&built), want_labels, "{name}");
    }
}

#[test]
fn candidates_are_the_union_of_the_applicable_advertisements_node_selectors() {
    let mut world = World::three_nodes().with_service(
        "shop/web",
        &["192.0.2.10"],
        json!({"metadata": {"labels": {"app": "web"}}}),
    );
    world.nodes = vec![
        node("a", json!({"zone": "east"})),
        node("b", json!({"zone": "west"})),
        node("c", json!({"zone": "north"})),
    ];
    world.ads = vec![
        adv(
            "east",
            json!({"nodeSelectors": [{"matchLabels": {"zone": "east"}}]}),
        ),
        adv(
            "west-or-north",
            json!({"nodeSelectors": [{"matchLabels": {"zone": "west"}}, {"matchLabels": {"zone": "north"}}],
                "serviceSelectors": [{"matchLabels": {"app": "db"}}]}),
        ),
        adv(
            "west",
            json!({"nodeSelectors": [{"matchLabels": {"zone": "west"}}]}),
        ),
    ];
    let built = world.built();
    assert_eq!(built.dropped, vec![]);
    assert_eq!(
        entry(&built, "192.0.2.10").nodes,
        only(&["a", "b"]),
        "west-or-north does not select the Service, so c is not a candidate"
    );
}

#[test]
fn unavailable_and_excluded_nodes_are_not_candidates_unless_exclusion_is_ignored() {
    let mut world = World::three_nodes().with_service("shop/web", &["192.0.2.10"], json!({}));
    world.nodes = vec![
        node_with_condition("a", "NetworkUnavailable", "True"),
        node_with_condition("b", "NetworkUnavailable", "False"),
        node(
            "c",
            json!({"node.kubernetes.io/exclude-from-external-load-balancers": ""}),
        ),
        node_with_condition("d", "Ready", "False"),
    ];
    let nodes = |options: &Options| {
        world
            .build(options)
            .snapshot
            .get(&ip("192.0.2.10"))
            .expect("served")
            .nodes
            .clone()
    };
    assert_eq!(nodes(&Options::default()), only(&["b", "d"]));
    let ignore = Options {
        ignore_exclude_lb: true,
        ..Options::default()
    };
    assert_eq!(nodes(&ignore), only(&["b", "c", "d"]));
}

#[test]
fn a_live_member_without_a_node_object_is_not_a_candidate() {
    // MetalLB builds every advertisement's node set from the Node list.
    let world = World::three_nodes().with_service("shop/web", &["192.0.2.10"], json!({}));
    let built = world.built();
    let members = live(&["a", "b", "c", "ghost"]);
    let election = Election::new("ghost", built.snapshot, &members);
    let owner = election.owner(&ip("192.0.2.10")).expect("an owner");
    assert_ne!(owner, "ghost");
    let alone = Election::new("ghost", world.built().snapshot, &live(&["ghost"]));
    assert_eq!(
        alone.outcomes().get(&ip("192.0.2.10")),
        Some(&Outcome::NoCandidates)
    );
}

#[test]
fn interfaces_are_the_union_of_the_applicable_advertisements_and_none_named_is_the_default() {
    type Case = (&'static str, Vec<Value>, Interfaces);
    let cases: Vec<Case> = vec![
        ("no interfaces", vec![json!({})], Interfaces::Default),
        (
            "one list",
            vec![json!({"interfaces": ["eth0"]})],
            Interfaces::named(["eth0"]),
        ),
        (
            "two lists",
            vec![
                json!({"interfaces": ["eth0", "bond0"]}),
                json!({"interfaces": ["eth1", "eth0"]}),
            ],
            Interfaces::named(["bond0", "eth0", "eth1"]),
        ),
        (
            "one advertisement on all interfaces",
            vec![json!({"interfaces": ["eth0"]}), json!({})],
            Interfaces::Default,
        ),
        (
            "an advertisement that does not apply",
            vec![
                json!({"interfaces": ["eth0"]}),
                json!({"ipAddressPools": ["other"]}),
            ],
            Interfaces::named(["eth0"]),
        ),
    ];
    for (name, specs, want) in cases {
        let mut world = World::three_nodes().with_service("shop/web", &["192.0.2.10"], json!({}));
        world.pools.push(pool("other", &["203.0.113.0/24"]));
        world.ads = specs
            .into_iter()
            .enumerate()
            .map(|(i, spec)| adv(&format!("l2-{i}"), spec))
            .collect();
        let built = world.built();
        assert_eq!(built.dropped, vec![], "{name}");
        assert_eq!(entry(&built, "192.0.2.10").interfaces, want, "{name}");
    }
}

#[test]
fn local_policy_serves_from_nodes_with_an_endpoint_that_can_serve() {
    let local = json!({"spec": {"externalTrafficPolicy": "Local"}});
    let mut world = World::three_nodes();
    world.services = vec![service("shop/web", &["192.0.2.10"], local)];
    world.nodes = ["a", "b", "c", "d", "e", "f"]
        .map(|n| node(n, json!({})))
        .to_vec();
    world.slices = vec![
        slice(
            "shop/web",
            "web-1",
            &[
                (Some("a"), None, None),               // ready unset: serves
                (Some("b"), Some(true), Some(false)),  // ready: serves
                (Some("c"), Some(false), Some(true)),  // not ready but serving (terminating)
                (Some("d"), Some(false), Some(false)), // neither
                (Some("e"), Some(false), None),        // not ready, serving unset
            ],
        ),
        slice("shop/web", "web-2", &[(None, Some(true), None)]),
        slice("other/web", "web-3", &[(Some("f"), Some(true), None)]),
    ];
    let built = world.built();
    assert_eq!(
        entry(&built, "192.0.2.10").ready_endpoints,
        Some(Arc::new(set(&["a", "b", "c"])))
    );
    assert_eq!(
        built.dropped,
        vec![Dropped::EndpointWithoutNode {
            service: key("shop/web"),
            slice: "web-2".into(),
            index: 0
        }]
    );
}

#[test]
fn local_policy_without_endpoints_keeps_the_ip_with_nobody_ready() {
    let mut world = World::three_nodes();
    world.services = vec![service(
        "shop/web",
        &["192.0.2.10"],
        json!({"spec": {"externalTrafficPolicy": "Local"}}),
    )];
    let built = world.built();
    assert_eq!(built.dropped, vec![]);
    let election = Election::new("a", built.snapshot, &live(&["a", "b", "c"]));
    assert_eq!(
        election.outcomes().get(&ip("192.0.2.10")),
        Some(&Outcome::NoReadyEndpoints)
    );
}

#[test]
fn cluster_policy_serves_from_every_candidate_only_while_some_endpoint_can_serve() {
    type Case = (&'static str, Vec<Ep>, Option<BTreeSet<String>>);
    let cases: Vec<Case> = vec![
        ("no endpoint", vec![], Some(set(&[]))),
        (
            "none can serve",
            vec![(Some("a"), Some(false), Some(false))],
            Some(set(&[])),
        ),
        (
            "one serving elsewhere",
            vec![
                (Some("a"), Some(false), None),
                (Some("z"), Some(false), Some(true)),
            ],
            None,
        ),
        (
            "one without a node counts, as in MetalLB",
            vec![(None, Some(true), None)],
            None,
        ),
    ];
    for (name, endpoints, want) in cases {
        let mut world = World::three_nodes();
        world.services = vec![service("shop/web", &["192.0.2.10"], json!({}))];
        world.slices = vec![slice("shop/web", "web-1", &endpoints)];
        let built = world.built();
        assert_eq!(built.dropped, vec![], "{name}");
        let entry = built.snapshot.get(&ip("192.0.2.10")).expect("kept");
        assert_eq!(entry.ready_endpoints, want.map(Arc::new), "{name}");
    }
    let mut world = World::three_nodes();
    world.services = vec![service("shop/web", &["192.0.2.10"], json!({}))];
    let election = Election::new("a", world.built().snapshot, &live(&["a", "b", "c"]));
    assert_eq!(
        election.outcomes().get(&ip("192.0.2.10")),
        Some(&Outcome::NoReadyEndpoints),
        "nobody answers, and the election says why"
    );
}

#[test]
fn every_ip_of_a_service_is_ordered_by_its_first_ingress_ip() {
    let world =
        World::three_nodes().with_service("shop/web", &["2001:db8::10", "192.0.2.10"], json!({}));
    let built = world.built();
    for ip_text in ["2001:db8::10", "192.0.2.10"] {
        assert_eq!(
            built.snapshot.get(&ip(ip_text)).expect("served").order_ip,
            Some(ip("2001:db8::10")),
            "{ip_text}"
        );
    }
    let election = Election::new("a", built.snapshot, &live(&["a", "b", "c"]));
    assert_eq!(
        election.owner(&ip("2001:db8::10")),
        election.owner(&ip("192.0.2.10")),
        "both IPs of a dual-stack Service land on one node"
    );
}

#[test]
fn metallbs_golden_order_holds_through_the_whole_path() {
    // TestSortL2Candidates: 10.0.0.1 -> node-b, node-a, node-c; 10.0.0.2 -> node-b, node-c, node-a.
    let mut world = World {
        nodes: ["node-a", "node-b", "node-c"]
            .map(|n| node(n, json!({})))
            .to_vec(),
        pools: vec![pool("lab", &["10.0.0.0/24"])],
        ads: vec![adv("l2", json!({}))],
        ..World::default()
    };
    world.services = vec![
        service("lab/one", &["10.0.0.1"], json!({})),
        service("lab/two", &["10.0.0.2"], json!({})),
    ];
    world.slices = vec![ready_on("lab/one", "node-a"), ready_on("lab/two", "node-a")];
    type Case = (&'static str, &'static [&'static str], &'static str);
    let cases: &[Case] = &[
        ("10.0.0.1", &["node-a", "node-b", "node-c"], "node-b"),
        ("10.0.0.1", &["node-a", "node-c"], "node-a"),
        ("10.0.0.1", &["node-c"], "node-c"),
        ("10.0.0.2", &["node-a", "node-b", "node-c"], "node-b"),
        ("10.0.0.2", &["node-a", "node-c"], "node-c"),
        ("10.0.0.2", &["node-a"], "node-a"),
    ];
    for (ip_text, members, want) in cases {
        let election = Election::new("node-a", world.built().snapshot, &live(members));
        assert_eq!(
            election.owner(&ip(ip_text)),
            Some(*want),
            "{ip_text} with {members:?}"
        );
    }
}

#[test]
fn preference_weights_are_summed_per_node_over_the_applicable_advertisements() {
    let mut world = World::three_nodes().with_service(
        "shop/web",
        &["192.0.2.10"],
        json!({"metadata": {"labels": {"app": "web"}}}),
    );
    world.nodes = vec![
        node("a", json!({"zone": "primary", "gpu": "true", "role": "lb"})),
        node("b", json!({"zone": "primary", "role": "lb"})),
        node("c", json!({"zone": "primary"})),
    ];
    let prefer = |weight: i32, key: &str, value: &str| json!({"weight": weight, "preference": {"matchLabels": {key: value}}});
    world.ads = vec![
        // Only nodes of its own nodeSelectors score: c is not one.
        adv(
            "lb-zone",
            json!({"nodeSelectors": [{"matchLabels": {"role": "lb"}}],
                "preferredNodeSelectors": [prefer(70, "zone", "primary")]}),
        ),
        adv(
            "lb-gpu",
            json!({"nodeSelectors": [{"matchLabels": {"role": "lb"}}],
                "preferredNodeSelectors": [prefer(30, "gpu", "true"), prefer(5, "role", "lb")]}),
        ),
        // Does not select the Service: contributes nothing.
        adv(
            "db",
            json!({"serviceSelectors": [{"matchLabels": {"app": "db"}}],
                "preferredNodeSelectors": [prefer(100, "zone", "primary")]}),
        ),
        // Every node is eligible through it, with no preference.
        adv("all", json!({})),
    ];
    let built = world.built();
    assert_eq!(built.dropped, vec![]);
    let entry = entry(&built, "192.0.2.10");
    assert_eq!(entry.nodes, only(&["a", "b", "c"]));
    let want: BTreeMap<String, u32> = [("a".to_string(), 105), ("b".to_string(), 75)].into();
    assert_eq!(entry.node_priority, Some(Arc::new(want)));
}

/// MetalLB sums the weights without a limit: 300 against 260 puts the 300 first, where a
/// clamp at the groups' 254 would tie them and leave the order to the hash.
#[test]
fn scores_above_the_groups_priority_range_are_summed_and_ordered_as_metallb_does() {
    let mut world = World::three_nodes().with_service("shop/web", &["192.0.2.10"], json!({}));
    let natural = Election::new("a", world.built().snapshot, &live(&["a", "b", "c"]))
        .owner(&ip("192.0.2.10"))
        .expect("owner")
        .to_string();
    // The node the hash puts first gets 260, another 300.
    let heavier = if natural == "a" { "b" } else { "a" };
    world.nodes = ["a", "b", "c"]
        .map(|n| {
            node(
                n,
                json!({"tier": if n == heavier { "gold" } else { "silver" }}),
            )
        })
        .to_vec();
    let prefer = |weight: i32, labels: Value| json!({"weight": weight, "preference": {"matchLabels": labels}});
    world.ads = vec![adv(
        "heavy",
        json!({"preferredNodeSelectors": [
            prefer(100, json!({})),
            prefer(100, json!({})),
            prefer(60, json!({"tier": "silver"})),
            prefer(100, json!({"tier": "gold"})),
        ]}),
    )];
    let built = world.built();
    let table = entry(&built, "192.0.2.10")
        .node_priority
        .clone()
        .expect("scores");
    assert_eq!(table[heavier], 300);
    assert_eq!(table[natural.as_str()], 260);
    let election = Election::new("a", built.snapshot, &live(&["a", "b", "c"]));
    assert_eq!(election.owner(&ip("192.0.2.10")), Some(heavier));
}

#[test]
fn a_preferred_node_wins_the_election() {
    let mut world = World::three_nodes().with_service("shop/web", &["192.0.2.10"], json!({}));
    let plain = Election::new("a", world.built().snapshot, &live(&["a", "b", "c"]));
    let natural = plain.owner(&ip("192.0.2.10")).expect("owner").to_string();
    let other = if natural == "c" { "a" } else { "c" };
    world.nodes = ["a", "b", "c"]
        .map(|n| node(n, json!({"preferred": (n == other).to_string()})))
        .to_vec();
    world.ads = vec![adv(
        "prefer",
        json!({"preferredNodeSelectors": [{"weight": 10, "preference": {"matchLabels": {"preferred": "true"}}}]}),
    )];
    let preferred = Election::new("a", world.built().snapshot, &live(&["a", "b", "c"]));
    assert_eq!(preferred.owner(&ip("192.0.2.10")), Some(other));
}

/// The snapshot entry of `address` in `built` (it must be served).
fn entry<'a>(built: &'a Built, address: &str) -> &'a ServedIp {
    built.snapshot.get(&ip(address)).expect("served")
}

#[test]
fn an_ip_shared_by_several_services_is_one_entry_of_the_first_service() {
    let shared = |policy: &str| {
        json!({"metadata": {"annotations": {"metallb.io/allow-shared-ip": "k"}},
            "spec": {"externalTrafficPolicy": policy}})
    };
    let mut world = World::three_nodes();
    world.services = vec![
        service("shop/web-udp", &["192.0.2.10"], shared("Local")),
        service("shop/web-tcp", &["192.0.2.10"], shared("Local")),
    ];
    world.slices = vec![ready_on("shop/web-udp", "a"), ready_on("shop/web-tcp", "b")];
    let built = world.built();
    assert_eq!(built.dropped, vec![]);
    assert_eq!(
        served(&built),
        vec![(ip("192.0.2.10"), "shop/web-tcp".into())]
    );
    assert_eq!(
        entry(&built, "192.0.2.10").ready_endpoints,
        Some(Arc::new(set(&["a", "b"]))),
        "the IP is served where either Service can be"
    );
    assert_eq!(
        entry(&built, "192.0.2.10").shared_with,
        Some(vec!["shop/web-udp".to_string()].into_boxed_slice()),
        "the sibling is named: it gets a record of its own"
    );
    // A Cluster sibling that can serve makes every candidate ready.
    world.services[0] = service("shop/web-udp", &["192.0.2.10"], shared("Cluster"));
    let built = world.built();
    assert_eq!(entry(&built, "192.0.2.10").ready_endpoints, None);
    // The sibling goes: the IP is no longer shared.
    world.services.remove(0);
    let built = world.built();
    let entry = entry(&built, "192.0.2.10");
    assert_eq!(entry.belongs_to.to_string(), "shop/web-tcp");
    assert_eq!(entry.shared_with, None);
}

#[test]
fn an_ip_held_by_services_that_do_not_all_allow_sharing_is_kept_for_the_first() {
    let mut world = World::three_nodes()
        .with_service("shop/b", &["192.0.2.10"], json!({}))
        .with_service(
            "shop/a",
            &["192.0.2.10"],
            json!({"metadata": {"annotations": {"metallb.io/allow-shared-ip": "k"}}}),
        );
    world.ads = vec![adv("all", json!({}))];
    let built = world.built();
    assert_eq!(served(&built), vec![(ip("192.0.2.10"), "shop/a".into())]);
    assert_eq!(
        entry(&built, "192.0.2.10").shared_with,
        None,
        "a Service left out is no sibling"
    );
    assert_eq!(
        built.dropped,
        vec![Dropped::IpConflict {
            ip: ip("192.0.2.10"),
            kept: "shop/a".into(),
            dropped: "shop/b".into()
        }]
    );
}

#[test]
fn a_shared_ip_service_selected_through_service_selectors_is_not_announced() {
    type Case = (&'static str, &'static str, Vec<Value>, Vec<&'static str>);
    let cases: Vec<Case> = vec![
        (
            "metallb.io, selected by serviceSelectors",
            "metallb.io/allow-shared-ip",
            vec![json!({"serviceSelectors": [{"matchLabels": {"app": "web"}}]})],
            vec!["shared_ip_with_service_selector"],
        ),
        (
            "deprecated spelling, one of two advertisements",
            "metallb.universe.tf/allow-shared-ip",
            vec![
                json!({}),
                json!({"serviceSelectors": [{"matchLabels": {"app": "web"}}]}),
            ],
            vec!["shared_ip_with_service_selector"],
        ),
        (
            "swimlb.io, the selecting advertisement does not select it",
            "swimlb.io/allow-shared-ip",
            vec![
                json!({}),
                json!({"serviceSelectors": [{"matchLabels": {"app": "db"}}]}),
            ],
            vec![],
        ),
        (
            "no sharing annotation",
            "example.com/other",
            vec![json!({"serviceSelectors": [{"matchLabels": {"app": "web"}}]})],
            vec![],
        ),
    ];
    for (name, annotation, specs, want) in cases {
        let mut world = World::three_nodes().with_service(
            "shop/web",
            &["192.0.2.10"],
            json!({"metadata": {"labels": {"app": "web"}, "annotations": {annotation: ""}}}),
        );
        world.ads = specs
            .into_iter()
            .enumerate()
            .map(|(i, spec)| adv(&format!("l2-{i}"), spec))
            .collect();
        let built = world.built();
        assert_eq!(labels(&built), want, "{name}");
        assert_eq!(built.snapshot.len(), usize::from(want.is_empty()), "{name}");
    }
}

#[test]
fn an_advertisement_with_an_invalid_selector_is_ignored_and_named_and_the_others_apply() {
    let mut world = World::three_nodes().with_service("shop/web", &["192.0.2.10"], json!({}));
    world.nodes = vec![
        node("a", json!({"zone": "east"})),
        node("b", json!({"zone": "west"})),
    ];
    world.ads = vec![
        adv(
            "broken",
            json!({"nodeSelectors": [{"matchExpressions": [{"key": "zone", "operator": "Near", "values": ["x"]}]}]}),
        ),
        adv(
            "east",
            json!({"nodeSelectors": [{"matchLabels": {"zone": "east"}}]}),
        ),
    ];
    let built = world.built();
    assert_eq!(labels(&built), vec!["invalid_advertisement"]);
    assert_eq!(
        built.dropped[0].to_string(),
        "L2Advertisement swimlb-system/broken: spec.nodeSelectors[0]: matchExpressions[0].operator: \
         unknown operator \"Near\" (want In, NotIn, Exists or DoesNotExist); the advertisement is ignored"
    );
    assert_eq!(entry(&built, "192.0.2.10").nodes, only(&["a"]));
}

#[test]
fn an_invalid_pool_is_named_and_its_ips_are_outside_every_pool() {
    let mut world = World::three_nodes().with_service("shop/web", &["203.0.113.5"], json!({}));
    world
        .pools
        .push(pool("bad", &["203.0.113.0/24", "203.0.113.9/32"]));
    let built = world.built();
    assert_eq!(labels(&built), vec!["invalid_pool", "outside_pools"]);
    assert!(built.snapshot.is_empty());
}

#[test]
fn services_with_the_same_advertisements_share_their_node_sets() {
    let world = World::three_nodes()
        .with_service("shop/a", &["192.0.2.10"], json!({}))
        .with_service("shop/b", &["192.0.2.11"], json!({}));
    let built = world.built();
    let nodes = |s: &str| match &built.snapshot.get(&ip(s)).expect("served").nodes {
        NodeFilter::Only(set) => Arc::clone(set),
        NodeFilter::All => panic!("always a set"),
    };
    assert!(Arc::ptr_eq(&nodes("192.0.2.10"), &nodes("192.0.2.11")));
}

#[test]
fn every_drop_has_a_fixed_distinct_label() {
    let k = key("ns/s");
    let err = swimlb_config::pools::validate(
        &[pool("p", &[])],
        &[adv("x", json!({"ipAddressPools": ["none"]}))],
    )
    .errors;
    let all = [
        Dropped::InvalidPool(err[0].clone()),
        Dropped::InvalidAdvertisement(err[1].clone()),
        Dropped::InvalidIngressIp {
            service: k.clone(),
            index: 0,
            text: String::new(),
        },
        Dropped::OutsidePools {
            service: k.clone(),
            ip: ip("192.0.2.1"),
        },
        Dropped::SplitAcrossPools {
            service: k.clone(),
            first: ip("192.0.2.1"),
            first_pool: "a".into(),
            second: ip("203.0.113.1"),
            second_pool: "b".into(),
        },
        Dropped::NoMatchingAdvertisement {
            service: k.clone(),
            pool: "p".into(),
        },
        Dropped::SharedIpWithServiceSelector {
            service: k.clone(),
            advertisement: "ns/l2".into(),
        },
        Dropped::IpConflict {
            ip: ip("192.0.2.1"),
            kept: "ns/a".into(),
            dropped: "ns/b".into(),
        },
        Dropped::EndpointWithoutNode {
            service: k,
            slice: "s-1".into(),
            index: 0,
        },
    ];
    let labels: Vec<&str> = all.iter().map(Dropped::as_str).collect();
    assert_eq!(
        labels,
        vec![
            "invalid_pool",
            "invalid_advertisement",
            "invalid_ingress_ip",
            "outside_pools",
            "split_across_pools",
            "no_matching_advertisement",
            "shared_ip_with_service_selector",
            "ip_conflict",
            "endpoint_without_node",
        ]
    );
    assert_eq!(labels.iter().collect::<BTreeSet<_>>().len(), labels.len());
}

#[test]
fn the_same_caches_in_another_order_give_the_same_result() {
    let mut world = World::three_nodes()
        .with_service("shop/a", &["192.0.2.10"], json!({}))
        .with_service("shop/b", &["192.0.2.10"], json!({}))
        .with_service("shop/c", &["198.51.100.1"], json!({}));
    world.ads.push(adv("east", json!({"interfaces": ["eth0"]})));
    let first = world.built();
    world.services.reverse();
    world.slices.reverse();
    world.nodes.reverse();
    world.ads.reverse();
    assert_eq!(world.built(), first);
    assert_eq!(labels(&first), vec!["outside_pools", "ip_conflict"]);
}

/// The keeper, driven object by object as the watches drive it: after any sequence of changes
/// its snapshot and drops are what [`build`] makes of the final caches, and the changes it
/// reported account for every difference.
mod keeper_tests {
    use super::*;
    use crate::model::snapshot::SnapshotChange;
    use proptest::prelude::*;

    const SERVICES: usize = 5;
    const SLICES: usize = 6;
    const IPS: [&str; 5] = [
        "192.0.2.1",
        "192.0.2.2",
        "192.0.2.17",
        "2001:db8::1",
        "198.51.100.1",
    ];

    /// A Service's version: IP indexes, shared, Local, label, class.
    type ServiceVersion = (Vec<usize>, bool, bool, bool, bool);
    /// A slice's version: the Service it names (index) and endpoints (node index or none,
    /// ready).
    type SliceVersion = (usize, Vec<(Option<usize>, bool)>);

    #[derive(Debug, Clone)]
    enum Op {
        Service(usize, Option<ServiceVersion>),
        Slice(usize, Option<SliceVersion>),
        /// Node labels (zone x or y per node), one node unavailable or not.
        Nodes([bool; 4], Option<usize>),
        /// Which advertisements exist.
        Ads([bool; 5]),
    }

    const NODES: [&str; 4] = ["a", "b", "c", "d"];

    fn service_name(i: usize) -> String {
        format!("shop/s{i}")
    }

    fn make_service(i: usize, (ips, shared, local, label, class): &ServiceVersion) -> Service {
        let ips: Vec<&str> = ips.iter().map(|&n| IPS[n % IPS.len()]).collect();
        let mut extra = json!({"metadata": {"labels": {"app": if *label { "x" } else { "y" }}}});
        if *shared {
            extra["metadata"]["annotations"] = json!({"metallb.io/allow-shared-ip": "k"});
        }
        if *local {
            extra["spec"] = json!({"externalTrafficPolicy": "Local"});
        }
        if *class {
            extra["spec"]["loadBalancerClass"] = json!("other");
        }
        service(&service_name(i), &ips, extra)
    }

    fn make_slice(j: usize, (owner, endpoints): &SliceVersion) -> EndpointSlice {
        let endpoints: Vec<Ep> = endpoints
            .iter()
            .map(|(node, ready)| (node.map(|n| NODES[n % 4]), Some(*ready), None))
            .collect();
        slice(
            &service_name(owner % SERVICES),
            &format!("slice-{j}"),
            &endpoints,
        )
    }

    fn make_nodes(zones: [bool; 4], unavailable: Option<usize>) -> Vec<Node> {
        NODES
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let mut node = node(n, json!({"zone": if zones[i] { "x" } else { "y" }}));
                if unavailable == Some(i) {
                    node.status = node_with_condition(n, NETWORK_UNAVAILABLE, "True").status;
                }
                node
            })
            .collect()
    }

    fn make_ads(which: [bool; 5]) -> Vec<L2Advertisement> {
        let all = [
            adv("all", json!({})),
            adv(
                "web-x",
                json!({"ipAddressPools": ["web"], "nodeSelectors": [{"matchLabels": {"zone": "x"}}]}),
            ),
            adv(
                "eth0",
                json!({"interfaces": ["eth0"], "serviceSelectors": [{"matchLabels": {"app": "x"}}]}),
            ),
            adv(
                "bad",
                json!({"nodeSelectors": [{"matchExpressions": [{"key": "zone", "operator": "Bogus"}]}]}),
            ),
            adv(
                "pref",
                json!({"preferredNodeSelectors": [{"weight": 10, "preference": {"matchLabels": {"zone": "y"}}}]}),
            ),
        ];
        all.into_iter()
            .zip(which)
            .filter_map(|(ad, keep)| keep.then_some(ad))
            .collect()
    }

    fn op() -> impl Strategy<Value = Op> {
        let service_version = (
            prop::collection::vec(0..IPS.len(), 0..3),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            prop::bool::weighted(0.1),
        );
        let slice_version = (
            0..SERVICES,
            prop::collection::vec(
                (prop::option::weighted(0.9, 0..4usize), any::<bool>()),
                0..3,
            ),
        );
        prop_oneof![
            4 => (0..SERVICES, prop::option::weighted(0.8, service_version)).prop_map(|(i, v)| Op::Service(i, v)),
            4 => (0..SLICES, prop::option::weighted(0.8, slice_version)).prop_map(|(j, v)| Op::Slice(j, v)),
            1 => (any::<[bool; 4]>(), prop::option::of(0..4usize)).prop_map(|(z, u)| Op::Nodes(z, u)),
            1 => any::<[bool; 5]>().prop_map(Op::Ads),
        ]
    }

    /// The world and the keeper side by side; `apply` changes both as the loop does.
    struct Driven {
        world: World,
        keeper: Keeper,
    }

    impl Driven {
        fn new() -> Driven {
            let mut world = World {
                nodes: make_nodes([true, false, true, false], None),
                pools: vec![
                    pool("web", &["192.0.2.0/28", "2001:db8::/64"]),
                    pool("db", &["192.0.2.16/28"]),
                ],
                ads: make_ads([true, false, false, false, false]),
                ..World::default()
            };
            world.services.clear();
            let mut keeper = Keeper::new(Options::default());
            let (nodes, pools, ads) = world.config();
            keeper.set_config(&pools, &ads, &nodes);
            Driven { world, keeper }
        }

        fn set_service(&mut self, key: &ServiceKey) {
            let service = self
                .world
                .services
                .iter()
                .find(|s| key_of(s) == *key)
                .cloned();
            let names: Vec<String> = self.keeper.slices_of(key).map(str::to_string).collect();
            let slices: Vec<&EndpointSlice> = names
                .iter()
                .filter_map(|n| {
                    self.world.slices.iter().find(|s| {
                        s.metadata.name.as_deref() == Some(n.as_str())
                            && s.metadata.namespace.as_deref() == Some(key.namespace.as_str())
                    })
                })
                .collect();
            self.keeper.set_service(key, service.as_ref(), &slices);
        }

        fn apply(&mut self, op: &Op) {
            match op {
                Op::Service(i, version) => {
                    let name = service_name(*i);
                    self.world.services.retain(|s| key_of(s) != key(&name));
                    if let Some(v) = version {
                        self.world.services.push(make_service(*i, v));
                    }
                    self.set_service(&key(&name));
                }
                Op::Slice(j, version) => {
                    let name = format!("slice-{j}");
                    self.world
                        .slices
                        .retain(|s| s.metadata.name.as_deref() != Some(name.as_str()));
                    if let Some(v) = version {
                        self.world.slices.push(make_slice(*j, v));
                    }
                    let label = self
                        .world
                        .slices
                        .iter()
                        .find(|s| s.metadata.name.as_deref() == Some(name.as_str()))
                        .and_then(|s| s.service().map(str::to_string));
                    for key in self.keeper.index_slice("shop", &name, label.as_deref()) {
                        self.set_service(&key);
                    }
                }
                Op::Nodes(zones, unavailable) => {
                    self.world.nodes = make_nodes(*zones, *unavailable);
                    self.config_changed();
                }
                Op::Ads(which) => {
                    self.world.ads = make_ads(*which);
                    self.config_changed();
                }
            }
        }

        fn config_changed(&mut self) {
            let (nodes, pools, ads) = self.world.config();
            if self.keeper.set_config(&pools, &ads, &nodes) {
                let mut keys: BTreeSet<ServiceKey> =
                    self.world.services.iter().map(key_of).collect();
                keys.extend(self.keeper.services().cloned());
                for key in keys {
                    self.set_service(&key);
                }
            }
        }
    }

    impl World {
        fn config(&self) -> (Vec<&Node>, Vec<&IPAddressPool>, Vec<&L2Advertisement>) {
            (
                self.nodes.iter().collect(),
                self.pools.iter().collect(),
                self.ads.iter().collect(),
            )
        }
    }

    fn sorted(dropped: &[Dropped]) -> Vec<String> {
        let mut all: Vec<String> = dropped.iter().map(ToString::to_string).collect();
        all.sort();
        all
    }

    proptest! {
        #[test]
        fn the_keeper_equals_a_fresh_build_after_any_changes(ops in prop::collection::vec(op(), 1..40)) {
            let mut driven = Driven::new();
            let _ = driven.keeper.take_changes();
            for op in &ops {
                let before = driven.keeper.built();
                driven.apply(op);
                let changes = driven.keeper.take_changes();
                let after = driven.keeper.built();
                prop_assert_eq!(&after, &driven.world.built(), "after {:?}", op);
                // Every IP whose entry differs is reported. Not "only those": an EndpointSlice
                // endpoint without a node name can report an IP whose entry ends up the same
                // (found by this test; the engine skips an unchanged entry, so it costs one
                // comparison; an open problem in the closing note).
                let differ: BTreeSet<IpAddr> = before
                    .snapshot
                    .diff(&after.snapshot)
                    .into_iter()
                    .map(|c| match c {
                        SnapshotChange::Added(ip) | SnapshotChange::Removed(ip) | SnapshotChange::Changed(ip) => ip,
                    })
                    .collect();
                prop_assert!(differ.is_subset(&changes.ips), "after {:?}: {:?} not within {:?}", op, differ, changes.ips);
                // before - restored + dropped = after, as multisets.
                let mut accounted = sorted(&before.dropped);
                for gone in sorted(&changes.restored) {
                    let at = accounted.iter().position(|d| *d == gone);
                    prop_assert!(at.is_some(), "restored {} was not dropped", gone);
                    accounted.remove(at.unwrap_or_default());
                }
                accounted.extend(sorted(&changes.dropped));
                accounted.sort();
                prop_assert_eq!(accounted, sorted(&after.dropped), "after {:?}", op);
            }
        }
    }

    #[test]
    fn a_node_change_that_no_selector_reads_changes_nothing() {
        let mut driven = Driven::new();
        driven.apply(&Op::Service(0, Some((vec![0], false, false, true, false))));
        let _ = driven.keeper.take_changes();
        let mut nodes = driven.world.nodes.clone();
        nodes[0].metadata.annotations = Some(BTreeMap::from([("x".into(), "y".into())]));
        nodes[0].status = Some(Default::default());
        let nodes: Vec<&Node> = nodes.iter().collect();
        let pools: Vec<&IPAddressPool> = driven.world.pools.iter().collect();
        let ads: Vec<&L2Advertisement> = driven.world.ads.iter().collect();
        assert!(!driven.keeper.set_config(&pools, &ads, &nodes));
        assert!(driven.keeper.take_changes().is_empty());
    }

    #[test]
    fn an_endpoint_slice_moved_to_another_service_touches_both() {
        let mut driven = Driven::new();
        let local = (vec![0], false, true, true, false);
        driven.apply(&Op::Service(0, Some(local.clone())));
        driven.apply(&Op::Service(1, Some((vec![1], false, true, true, false))));
        driven.apply(&Op::Slice(0, Some((0, vec![(Some(1), true)]))));
        let _ = driven.keeper.take_changes();
        driven.apply(&Op::Slice(0, Some((1, vec![(Some(1), true)]))));
        let changes = driven.keeper.take_changes();
        assert_eq!(
            changes.ips,
            BTreeSet::from([ip("192.0.2.1"), ip("192.0.2.2")])
        );
        assert_eq!(driven.keeper.built(), driven.world.built());
    }
}

#[test]
fn trimmed_slices_and_nodes_build_the_same_snapshot() {
    let mut world = World::three_nodes()
        .with_service(
            "shop/a",
            &["192.0.2.10"],
            json!({"spec": {"externalTrafficPolicy": "Local"}}),
        )
        .with_service("shop/b", &["192.0.2.11"], json!({}));
    world
        .nodes
        .push(node_with_condition("d", NETWORK_UNAVAILABLE, "True"));
    world.nodes[0].metadata.labels = Some(from_json(json!({"zone": "x"})));
    world.ads.push(adv(
        "x",
        json!({"nodeSelectors": [{"matchLabels": {"zone": "x"}}], "interfaces": ["eth1"]}),
    ));
    world.slices.push(slice(
        "shop/a",
        "a-2",
        &[
            (Some("b"), Some(false), Some(true)),
            (None, Some(true), None),
        ],
    ));
    let untrimmed = world.built();
    for slice in &mut world.slices {
        trim_slice(slice);
        assert!(
            slice.metadata.labels.is_none(),
            "the Service moved out of the labels"
        );
    }
    for node in &mut world.nodes {
        trim_node(node);
    }
    assert_eq!(world.built(), untrimmed);
    assert_eq!(labels(&untrimmed), vec!["endpoint_without_node"]);
}
