//! The Grafana dashboard `deploy/grafana/swimlb.json` (issue 14), checked without Grafana (no
//! Grafana server runs on these machines): current schema, the datasource and namespace
//! variables, every panel on the datasource variable with a unique id and a position, every
//! query naming only metrics of the book's metrics reference (`docs/src/reference/metrics.md`)
//! and only labels that metric has (or that Prometheus adds to every target), and the panels
//! the issue asks for. Prometheus evaluates
//! the queries against a live lab in `standalone_lab.rs`. No root.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;
use swimlb_e2e::dashboard::{self, TARGET_LABELS};
use swimlb_e2e::metrics_doc::{self, DocRow};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn load() -> Value {
    let path = repo().join(dashboard::PATH);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

fn table() -> BTreeMap<String, DocRow> {
    metrics_doc::documented_rows()
        .unwrap_or_else(|e| panic!("{e:#}"))
        .into_iter()
        .map(|r| (r.name.clone(), r))
        .collect()
}

const DS: &str = "${DS_PROMETHEUS}";

fn is_ds_variable(ds: &Value) -> bool {
    ds["type"] == "prometheus" && ds["uid"] == DS
}

#[test]
fn the_schema_is_current_and_the_variables_are_defined() {
    let d = load();
    let schema = d["schemaVersion"].as_u64().expect("schemaVersion");
    assert!(schema >= 39, "schemaVersion {schema} < 39");
    assert!(d["uid"].as_str().is_some_and(|u| !u.is_empty()), "a uid");
    assert!(
        d["title"].as_str().is_some_and(|u| !u.is_empty()),
        "a title"
    );
    assert!(d["id"].is_null(), "no instance id in a shared dashboard");

    let inputs = d["__inputs"].as_array().expect("__inputs");
    assert!(
        inputs.iter().any(|i| i["name"] == "DS_PROMETHEUS"
            && i["type"] == "datasource"
            && i["pluginId"] == "prometheus"),
        "__inputs declares DS_PROMETHEUS, a prometheus datasource: {inputs:?}"
    );

    let vars: BTreeMap<&str, &Value> = d["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .map(|v| (v["name"].as_str().expect("a variable name"), v))
        .collect();
    let ds = vars.get("DS_PROMETHEUS").expect("a DS_PROMETHEUS variable");
    assert_eq!(ds["type"], "datasource");
    assert_eq!(ds["query"], "prometheus");

    let ns = vars.get("namespace").expect("a namespace variable");
    assert_eq!(ns["type"], "query");
    assert!(is_ds_variable(&ns["datasource"]), "{ns}");
    let definition = ns["definition"].as_str().expect("definition");
    let query = ns["query"]["query"].as_str().unwrap_or(definition);
    assert_eq!(query, definition);
    let inner = query
        .strip_prefix("label_values(")
        .and_then(|q| q.strip_suffix(')'))
        .unwrap_or_else(|| panic!("label_values(METRIC, namespace): {query}"));
    let (metric, label) = inner.split_once(',').expect("METRIC, LABEL");
    assert_eq!(label.trim(), "namespace");
    assert!(
        table().contains_key(metric.trim()),
        "{metric} is in the table of {}",
        metrics_doc::PAGE
    );
    // All must also match series without the label (standalone speakers): `.*` matches "".
    assert_eq!(ns["includeAll"], true, "{ns}");
    assert_eq!(ns["allValue"], ".*", "{ns}");

    // Every variable the queries use is defined (or one of Grafana's own).
    let used: BTreeSet<String> = dashboard::queries(&d)
        .iter()
        .flat_map(|q| {
            q.expr
                .split('$')
                .skip(1)
                .map(|rest| {
                    rest.trim_start_matches('{')
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect::<String>()
                })
                .collect::<Vec<_>>()
        })
        .collect();
    for v in used {
        assert!(
            v.starts_with("__") || vars.contains_key(v.as_str()),
            "${v} is used but not defined"
        );
    }
}

#[test]
fn every_panel_has_a_unique_id_a_position_and_the_datasource_variable() {
    let d = load();
    let panels = dashboard::panels(&d);
    assert!(!panels.is_empty());
    let mut ids = BTreeSet::new();
    for p in &panels {
        let title = p["title"].as_str().unwrap_or("?");
        let id = p["id"].as_u64().unwrap_or_else(|| panic!("{title}: an id"));
        assert!(ids.insert(id), "{title}: id {id} is used twice");
        let pos = &p["gridPos"];
        for k in ["h", "w", "x", "y"] {
            assert!(pos[k].is_u64(), "{title}: gridPos.{k}: {pos}");
        }
        assert!(
            pos["x"].as_u64().unwrap() + pos["w"].as_u64().unwrap() <= 24,
            "{title}: wider than the grid: {pos}"
        );
        if p["type"] == "row" {
            continue;
        }
        assert!(
            is_ds_variable(&p["datasource"]),
            "{title}: datasource {}",
            p["datasource"]
        );
        let targets = p["targets"]
            .as_array()
            .unwrap_or_else(|| panic!("{title}: targets"));
        assert!(!targets.is_empty(), "{title}: no query");
        let mut refs = BTreeSet::new();
        for t in targets {
            assert!(
                t["datasource"].is_null() || is_ds_variable(&t["datasource"]),
                "{title}: a target's datasource {}",
                t["datasource"]
            );
            assert!(
                t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()),
                "{title}: an empty query"
            );
            assert!(
                refs.insert(t["refId"].as_str().unwrap_or("")),
                "{title}: refId repeated"
            );
        }
    }
}

#[test]
fn every_query_names_only_metrics_and_labels_of_the_metrics_reference() {
    let d = load();
    let rows = table();
    let is_histogram = |n: &str| rows.get(n).is_some_and(|r| r.kind == "histogram");
    let queries = dashboard::queries(&d);
    assert!(!queries.is_empty());
    let mut used = BTreeSet::new();
    for q in &queries {
        let where_ = format!("panel {} {:?} {}", q.panel_id, q.panel_title, q.ref_id);
        let selectors = dashboard::selectors(&q.expr);
        assert!(
            !selectors.is_empty(),
            "{where_}: queries no swimlb metric: {}",
            q.expr
        );
        // Labels this query may name: those of its metrics, plus the target's.
        let mut allowed: BTreeSet<String> = TARGET_LABELS.iter().map(|l| l.to_string()).collect();
        for (series, labels) in &selectors {
            let family = dashboard::family_of(series, is_histogram);
            let row = rows.get(&family).unwrap_or_else(|| {
                panic!(
                    "{where_}: {series} is not in the table of {} (so no binary exposes it): {}",
                    metrics_doc::PAGE,
                    q.expr
                )
            });
            used.insert(family.clone());
            let mut own: BTreeSet<String> = row.labels.clone();
            if series.ends_with("_bucket") && family != *series {
                own.insert("le".into());
            }
            for l in labels {
                assert!(
                    own.contains(l) || TARGET_LABELS.contains(&l.as_str()),
                    "{where_}: {series} has no label {l:?} (the table lists {:?}): {}",
                    row.labels,
                    q.expr
                );
            }
            allowed.extend(own);
        }
        for l in dashboard::grouping_labels(&q.expr) {
            assert!(
                allowed.contains(&l),
                "{where_}: groups by {l:?}, which none of its metrics has: {}",
                q.expr
            );
        }
        // Legends may only name labels the result can have.
        let legend = d_legend(&d, q.panel_id, &q.ref_id);
        for l in legend
            .split("{{")
            .skip(1)
            .filter_map(|s| s.split_once("}}"))
        {
            let l = l.0.trim();
            assert!(
                allowed.contains(l),
                "{where_}: the legend names {l:?}, which none of its metrics has"
            );
        }
    }
    // The panels the issue asks for.
    for metric in [
        "swimlb_owner",
        "swimlb_members",
        "swimlb_member_down_total",
        "swimlb_failover_detect_seconds",
        "swimlb_failover_seconds",
        "swimlb_gossip_packets_total",
        "swimlb_gossip_bytes_total",
        "swimlb_gossip_rejected_total",
        "swimlb_arp_requests_total",
        "swimlb_arp_replies_total",
        "swimlb_ndp_solicitations_total",
        "swimlb_ndp_adverts_total",
        "swimlb_gratuitous_sent_total",
        "swimlb_pool_addresses",
        "swimlb_pool_addresses_in_use",
        "swimlb_check_up",
        "swimlb_owner_watch_takeovers_total",
        "swimlb_owner_watch_checks_total",
        "swimlb_owner_watch_timer_lateness_seconds",
    ] {
        assert!(used.contains(metric), "no panel shows {metric}");
    }
    let kinds: BTreeSet<(&str, bool)> = queries
        .iter()
        .map(|q| {
            (
                q.panel_type.as_str(),
                q.expr.contains("swimlb_owner{") || q.expr.contains("swimlb_owner "),
            )
        })
        .collect();
    assert!(
        kinds.contains(&("table", true)),
        "a table of each IP's owner"
    );
    assert!(
        kinds.contains(&("state-timeline", true)),
        "a state timeline of each IP's owner"
    );
}

/// The `legendFormat` of panel `id`'s target `ref_id`.
fn d_legend(d: &Value, id: u64, ref_id: &str) -> String {
    dashboard::panels(d)
        .into_iter()
        .filter(|p| p["id"].as_u64() == Some(id))
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .find(|t| t["refId"] == ref_id)
        .and_then(|t| t["legendFormat"].as_str())
        .unwrap_or("")
        .to_string()
}

#[test]
fn the_checks_catch_a_metric_or_label_outside_the_table() {
    let rows = table();
    let is_histogram = |n: &str| rows.get(n).is_some_and(|r| r.kind == "histogram");
    let s = dashboard::selectors(r#"rate(swimlb_failover_detect_seconds_bucket{le="1"}[5s])"#);
    assert_eq!(
        dashboard::family_of(&s[0].0, is_histogram),
        "swimlb_failover_detect_seconds"
    );
    let s = dashboard::selectors(r#"swimlb_no_such_metric{owner="x"}"#);
    assert!(!rows.contains_key(&dashboard::family_of(&s[0].0, is_histogram)));
    let s = dashboard::selectors(r#"swimlb_members{reason="x"}"#);
    assert!(!rows["swimlb_members"].labels.contains("reason"));
    assert!(s[0].1.contains("reason"));
}
