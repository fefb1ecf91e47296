//! A real Prometheus scraping the lab through a failover.

use super::*;

/// Dashboard queries that hold no series in the Kubernetes lab, by panel title, with why. The
/// test fails if one of them does hold data (the list would be stale).
const NO_DATA_IN_THE_KUBERNETES_LAB: &[(&str, &str)] = &[(
    "Health checks",
    "health checks are the standalone mode's; Kubernetes uses endpoint readiness",
)];

#[test]
#[ignore = "needs root: network namespaces, real nodes and a Prometheus server"]
fn a_real_prometheus_scraping_the_kubernetes_lab_answers_every_dashboard_query_through_a_failover()
{
    use swimlb_e2e::dashboard;
    use swimlb_e2e::prometheus_lab::{LAB_NAMESPACE, LabPrometheus};
    let _one = one_lab("kubernetes prometheus");
    let dashboard_json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/grafana/swimlb.json"
        ))
        .expect("the dashboard"),
    )
    .expect("the dashboard is JSON");
    let queries = dashboard::queries(&dashboard_json);
    let exempt = |title: &str| {
        NO_DATA_IN_THE_KUBERNETES_LAB
            .iter()
            .any(|(t, _)| *t == title)
    };
    let mut run = Running::start(6);
    let (prober, owner) = run.settle();
    // Every labelled counter gets a series: a datagram that is no envelope at every gossip
    // port (a rejection), an ARP request for an address nobody owns (a dropped frame).
    let gossip: Vec<SocketAddr> = run
        .lab
        .nodes
        .iter()
        .map(|n| SocketAddr::from((n.v4, failover::GOSSIP_PORT)))
        .collect();
    probe::in_netns(&run.lab.client_netns, move || {
        let socket = std::net::UdpSocket::bind("0.0.0.0:0").expect("a UDP socket");
        for addr in gossip {
            let _ = socket.send_to(b"not a gossip envelope", addr);
        }
    })
    .unwrap();
    let _ = run.arp_answerers(Ipv4Addr::new(198, 51, 100, 250));
    // And a Service asking for an address no pool holds (an allocation error).
    run.cluster()
        .api()
        .create(kubelab::service(
            "impossible",
            "203.0.113.50",
            Policy::Cluster,
            None,
        ))
        .unwrap();
    let controllers = run.controller_metrics();
    let prometheus = LabPrometheus::start(&run.lab, &controllers);
    let targets = 2 * (run.lab.nodes.len() + controllers.len());
    let deadline = Instant::now() + Duration::from_secs(30);
    while prometheus.targets_up() < targets {
        assert!(
            Instant::now() < deadline,
            "Prometheus never saw the speakers and the controller up\n{}",
            prometheus.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let (rate, range) = ("10s", "1m");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (mut empty, mut unexpected) = (Vec::new(), Vec::new());
        for (q, namespace) in queries
            .iter()
            .flat_map(|q| [(q, dashboard::ALL_NAMESPACES), (q, LAB_NAMESPACE)])
        {
            let promql = dashboard::substitute(&q.expr, namespace, rate, range);
            let result = prometheus
                .query(&promql)
                .unwrap_or_else(|e| panic!("panel {:?}: {e}", q.panel_title));
            match (result.is_empty(), exempt(&q.panel_title)) {
                (true, false) => empty.push(format!("{} {}: {promql}", q.panel_title, q.ref_id)),
                (false, true) => unexpected.push(format!("{} {}", q.panel_title, q.ref_id)),
                _ => {}
            }
        }
        assert!(
            unexpected.is_empty(),
            "listed as holding no data here, but they do: {unexpected:?}"
        );
        if empty.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "queries without data: {empty:#?}\n{}",
            prometheus.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // The owner table names the owner, then after a power-off the new one, and only it; the
    // failover latency panel holds that failover.
    let owner_query = queries
        .iter()
        .find(|q| q.panel_type == "table" && q.expr.contains("swimlb_owner"))
        .expect("the owner table");
    let owner_promql =
        dashboard::substitute(&owner_query.expr, dashboard::ALL_NAMESPACES, rate, range);
    let vip = netns::vip_v4(0).to_string();
    let owners = |result: &[serde_json::Value]| -> Vec<String> {
        let mut all: Vec<String> = result
            .iter()
            .filter(|s| s["metric"]["ip"] == vip.as_str())
            .filter_map(|s| s["metric"]["owner"].as_str().map(str::to_string))
            .collect();
        all.sort();
        all.dedup();
        all
    };
    assert_eq!(
        owners(&prometheus.query(&owner_promql).unwrap()),
        vec![owner.clone()]
    );
    let fault = Instant::now();
    run.lab.set_link(run.index_of(&owner), false).unwrap();
    let new_owner = wait_for_failover(&run, &prober, fault, &owner);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen = owners(&prometheus.query(&owner_promql).unwrap_or_default());
        if seen == vec![new_owner.clone()] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the owner panel shows {seen:?}, not {new_owner}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let latency: Vec<_> = queries
        .iter()
        .filter(|q| {
            q.expr
                .contains("histogram_quantile(0.99, sum by (le) (rate(swimlb_failover_seconds")
        })
        .collect();
    assert_eq!(latency.len(), 1, "the failover latency panel's p99");
    let promql = dashboard::substitute(&latency[0].expr, dashboard::ALL_NAMESPACES, rate, range);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let value: Option<f64> = prometheus
            .query(&promql)
            .ok()
            .and_then(|r| r.first()?["value"][1].as_str()?.parse().ok());
        if value.is_some_and(|v| v.is_finite() && v > 0.0) {
            eprintln!("prometheus: failover latency p99 after the power-off: {value:?} s");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the failover latency panel never held the failover: {value:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    drop(prober);
}
