//! `/metrics` against the metrics reference, `status`, a real Prometheus and the dashboard.

use super::*;

/// Issue 14: every node's `/metrics`, read as curl reads it, passes `promtool check metrics`;
/// together the three expose exactly the speaker metrics of the book's metrics reference (every
/// labelled family made to hold a series: a health check, a datagram that is no envelope, an ARP
/// request for an address nobody owns); and `swimlb-speaker status`, run from the client, prints the owner
/// every node agrees on.
#[test]
#[ignore = "needs root: network namespaces"]
fn metrics_pass_promtool_and_are_the_metrics_reference_and_status_prints_the_agreed_owner() {
    use swimlb_e2e::metrics_doc::{self, Exposed};
    let _one = one_lab("metrics");
    let (mut run, owner) = Running::start_with_every_series(31);
    let vip = IpAddr::V4(netns::vip_v4(0));

    let rows = metrics_doc::documented_rows().unwrap_or_else(|e| panic!("{e:#}"));
    let nodes: Vec<SocketAddr> = failover::http_addrs(&run.lab);
    // The counters above reach /metrics at once; the check's first result within its interval.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (bodies, union) = loop {
        let addrs = nodes.clone();
        let bodies: Vec<Option<String>> = in_netns(&run.lab.client_netns, move || {
            addrs.iter().map(|a| http_get(*a, "/metrics")).collect()
        });
        let mut union: std::collections::BTreeMap<String, Exposed> = Default::default();
        for body in bodies.iter().flatten() {
            for (name, family) in metrics_doc::families(body) {
                let merged = union.entry(name).or_default();
                merged.kind = family.kind;
                merged.samples += family.samples;
                merged.labels.extend(family.labels);
            }
        }
        match metrics_doc::compare(&rows, "standalone", &union) {
            Ok(()) => break (bodies, union),
            Err(e) if Instant::now() > deadline => {
                panic!(
                    "the metrics reference ({}) and the speakers' /metrics differ:\n{e}",
                    metrics_doc::PAGE
                )
            }
            Err(_) => {}
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    for (i, body) in bodies.iter().enumerate() {
        let body = body
            .as_ref()
            .unwrap_or_else(|| panic!("node{} answers /metrics", i + 1));
        if let Err(e) = swimlb_e2e::promtool::check_metrics(body) {
            panic!("node{}: {e}\n{body}", i + 1);
        }
    }
    eprintln!(
        "metrics: {} families across the three speakers, promtool reports nothing",
        union.len()
    );

    let node1 = nodes[0].to_string();
    let program = program();
    let table = run
        .lab
        .run_in(
            &run.lab.client_netns,
            &program.to_string_lossy(),
            &["speaker", "status", &node1],
        )
        .expect("swimlb-speaker status exits 0");
    eprintln!("$ swimlb-speaker status {node1}\n{table}");
    let row = table
        .lines()
        .find(|l| l.starts_with(&vip.to_string()))
        .unwrap_or_else(|| panic!("a row for {vip}:\n{table}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells.get(2), Some(&owner.as_str()), "{table}");
    for node in &run.lab.nodes {
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(&node.name) && l.contains("alive")),
            "{} listed alive:\n{table}",
            node.name
        );
    }
    assert!(table.contains("flag"), "the check is listed:\n{table}");
    run.lab.teardown();
}

/// Dashboard queries that legitimately hold no series in this lab, by panel title, with why.
/// The test fails if one of them does hold data (the list would be stale).
const NO_DATA_IN_THE_STANDALONE_LAB: &[(&str, &str)] = &[
    (
        "Pool usage",
        "pools are the controller's; the standalone lab runs none",
    ),
    (
        "Pool addresses",
        "pools are the controller's; the standalone lab runs none",
    ),
    (
        "Allocation errors and addresses outside pools",
        "the controller's; the standalone lab runs none",
    ),
];

/// The owners an owner-panel result names for `ip`.
fn owners_of(result: &[serde_json::Value], ip: &str) -> BTreeSet<String> {
    result
        .iter()
        .filter(|s| s["metric"]["ip"] == ip)
        .filter_map(|s| s["metric"]["owner"].as_str().map(str::to_string))
        .collect()
}

/// The dashboard against a real Prometheus (issue 14): a Prometheus server in the client's
/// namespace scrapes the three speakers every second; every query of
/// `deploy/grafana/swimlb.json`, its variables substituted as Grafana would with All selected
/// (matching the job without a `namespace` label too) and with the labelled job's namespace,
/// returns data (but the controller's, listed in [`NO_DATA_IN_THE_STANDALONE_LAB`]); the owner
/// table's query names exactly the owner the speakers' `/status` agree on, and after the owner
/// is powered off, exactly the new owner the survivors report; the detection histogram then
/// holds that member's declaration.
#[test]
#[ignore = "needs root: network namespaces"]
fn a_real_prometheus_evaluates_every_dashboard_query_and_the_owner_panel_follows_a_failover() {
    use swimlb_e2e::dashboard;
    let _one = one_lab("prometheus");
    let dashboard_json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/grafana/swimlb.json"
        ))
        .expect("the dashboard"),
    )
    .expect("the dashboard is JSON");
    let queries = dashboard::queries(&dashboard_json);
    for (title, _) in NO_DATA_IN_THE_STANDALONE_LAB {
        assert!(
            queries.iter().any(|q| q.panel_title == *title),
            "no panel {title:?}: NO_DATA_IN_THE_STANDALONE_LAB is stale"
        );
    }
    let (mut run, owner) = Running::start_with_every_series(41);
    let vip = IpAddr::V4(netns::vip_v4(0));

    let prometheus = LabPrometheus::start(&run.lab, &[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while prometheus.targets_up() < 2 * run.lab.nodes.len() {
        assert!(
            Instant::now() < deadline,
            "Prometheus never saw the three speakers up, in both jobs\n{}",
            prometheus.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }

    // Every query returns data once a rate window holds two scrapes (a 10 s window at a 1 s
    // scrape, as Grafana's $__rate_interval would be at least 4 scrapes).
    let (rate, range) = ("10s", "1m");
    let exempt_queries = queries
        .iter()
        .filter(|q| {
            NO_DATA_IN_THE_STANDALONE_LAB
                .iter()
                .any(|(t, _)| *t == q.panel_title)
        })
        .count();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut empty = Vec::new();
        let mut unexpected = Vec::new();
        let mut nan = Vec::new();
        for (q, namespace) in queries
            .iter()
            .flat_map(|q| [(q, dashboard::ALL_NAMESPACES), (q, LAB_NAMESPACE)])
        {
            let promql = dashboard::substitute(&q.expr, namespace, rate, range);
            let result = prometheus
                .query(&promql)
                .unwrap_or_else(|e| panic!("panel {:?}: {e}", q.panel_title));
            let exempt = NO_DATA_IN_THE_STANDALONE_LAB
                .iter()
                .any(|(t, _)| *t == q.panel_title);
            if result.is_empty() && !exempt {
                empty.push(format!(
                    "{} {} ({namespace}): {promql}",
                    q.panel_title, q.ref_id
                ));
            } else if !result.is_empty() && exempt {
                unexpected.push(format!(
                    "{} {} ({namespace}): {result:?}",
                    q.panel_title, q.ref_id
                ));
            } else if result.iter().any(|s| s["value"][1] == "NaN") {
                nan.push(format!("{} {} ({namespace})", q.panel_title, q.ref_id));
            }
        }
        assert!(
            unexpected.is_empty(),
            "listed as holding no data here, but they do: {unexpected:?}"
        );
        if empty.is_empty() {
            eprintln!(
                "prometheus: {} queries of {} panels return data with namespace {} and {LAB_NAMESPACE} ({} queries listed without: the controller's); NaN at rest (no member declared down yet): {nan:?}",
                queries.len() - exempt_queries,
                dashboard::panels(&dashboard_json)
                    .iter()
                    .filter(|p| p["type"] != "row")
                    .count(),
                dashboard::ALL_NAMESPACES,
                exempt_queries
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "queries without data: {empty:#?}\n{}",
            prometheus.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    // The namespace variable's query (label_values(METRIC, namespace)) offers the labelled job's
    // namespace.
    let variable = dashboard_json["templating"]["list"]
        .as_array()
        .and_then(|l| l.iter().find(|v| v["name"] == "namespace"))
        .and_then(|v| v["definition"].as_str())
        .expect("the namespace variable");
    let metric = variable
        .trim_start_matches("label_values(")
        .split(',')
        .next()
        .expect("label_values(METRIC, namespace)");
    let values = prometheus
        .get(&format!(
            "/api/v1/label/namespace/values?match%5B%5D={metric}"
        ))
        .expect("label values");
    assert_eq!(
        values["data"],
        serde_json::json!([LAB_NAMESPACE]),
        "{variable}: {values}"
    );

    // The owner table's query names exactly the owner the speakers agree on.
    let owner_query = queries
        .iter()
        .find(|q| q.panel_type == "table" && q.expr.contains("swimlb_owner"))
        .expect("the owner table");
    let owner_promql =
        dashboard::substitute(&owner_query.expr, dashboard::ALL_NAMESPACES, rate, range);
    let vip_text = vip.to_string();
    let agreed = run.agreed_owner().expect("the speakers agree");
    assert_eq!(agreed, owner);
    let result = prometheus.query(&owner_promql).expect("the owner query");
    assert_eq!(
        owners_of(&result, &vip_text),
        BTreeSet::from([owner.clone()]),
        "{owner_promql}: {result:?}"
    );

    // Power the owner off: the panel names the survivors' new owner, and only it.
    let old = run.lab.node(run.index_of(&owner)).clone();
    let fault = Instant::now();
    run.lab.set_link(old.index, false).unwrap();
    let deadline = fault + Duration::from_secs(20);
    let (new_owner, seen) = loop {
        let survivors: Vec<Option<String>> = run
            .statuses()
            .into_iter()
            .enumerate()
            .filter(|(i, _)| i + 1 != old.index)
            .map(|(_, s)| {
                s?["addresses"]
                    .as_array()?
                    .iter()
                    .find(|a| a["ip"] == vip_text.as_str())?["owner"]
                    .as_str()
                    .map(str::to_string)
            })
            .collect();
        let result = prometheus.query(&owner_promql).unwrap_or_default();
        let seen = owners_of(&result, &vip_text);
        if let Some(Some(new)) = survivors.first()
            && *new != owner
            && survivors.iter().all(|s| s.as_ref() == Some(new))
            && seen == BTreeSet::from([new.clone()])
        {
            break (new.clone(), seen);
        }
        assert!(
            Instant::now() < deadline,
            "after powering {owner} off, the survivors report {survivors:?} and the owner panel {seen:?}\n{}",
            run.logs()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    eprintln!(
        "prometheus: owner panel {owner} -> {seen:?} ({new_owner} by /status) {:.1} s after the power-off",
        fault.elapsed().as_secs_f64()
    );

    // The failover histogram holds the new owner's takeover, and the detection histogram the
    // declaration of the powered-off member.
    let latency: Vec<_> = queries
        .iter()
        .filter(|q| {
            q.expr.contains("swimlb_failover_seconds")
                || q.expr.contains("swimlb_failover_detect_seconds")
        })
        .collect();
    assert!(!latency.is_empty(), "a failover latency panel");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let values: Vec<Option<f64>> = latency
            .iter()
            .map(|q| {
                let promql =
                    dashboard::substitute(&q.expr, dashboard::ALL_NAMESPACES, range, range);
                let result = prometheus.query(&promql).ok()?;
                result.first()?["value"][1].as_str()?.parse().ok()
            })
            .collect();
        if values
            .iter()
            .all(|v| v.is_some_and(|v| v.is_finite() && v > 0.0))
        {
            eprintln!(
                "prometheus: failover latency panel after the failover (over {range}): {values:?}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the failover latency panel never held the failover: {values:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    drop(prometheus);
    run.lab.teardown();
}
