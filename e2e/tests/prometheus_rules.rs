//! The alerting rules of `deploy/prometheus/` (issue 14): `promtool check rules` accepts them,
//! `promtool test rules` passes their unit tests, every alert is tested both firing and
//! silent, every swimlb metric they query is one the book's metrics reference
//! (`docs/src/reference/metrics.md`) documents (so a rename breaks this test, not an alert in
//! production), and that page's table of alerts lists every alert with its severity and a link
//! to its entry in the troubleshooting page. Also: the promtool helpers fail when promtool
//! reports a problem. Needs promtool (test.sh installs Debian's `prometheus`), not root.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;
use swimlb_e2e::{metrics_doc, promtool};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn yaml(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

/// Every `alert:` of the rules file, with its expression.
fn alerts(rules: &Value) -> BTreeMap<String, String> {
    rules["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .filter_map(|r| {
            Some((
                r["alert"].as_str()?.to_string(),
                r["expr"].as_str()?.to_string(),
            ))
        })
        .collect()
}

#[test]
fn promtool_checks_the_rules_and_their_unit_tests_pass() {
    let dir = repo().join("deploy/prometheus");
    let report = promtool::check_rules(&dir.join("rules.yaml")).unwrap_or_else(|e| panic!("{e}"));
    assert!(report.contains("SUCCESS"), "{report}");
    let report =
        promtool::test_rules(&dir.join("rules_test.yaml")).unwrap_or_else(|e| panic!("{e}"));
    assert!(report.contains("SUCCESS"), "{report}");
}

#[test]
fn every_alert_is_tested_firing_and_silent() {
    let dir = repo().join("deploy/prometheus");
    let names = alerts(&yaml(&dir.join("rules.yaml")));
    assert!(!names.is_empty());
    let tests = yaml(&dir.join("rules_test.yaml"));
    let (mut fires, mut silent) = (BTreeSet::new(), BTreeSet::new());
    for case in tests["tests"].as_array().expect("tests") {
        for check in case["alert_rule_test"].as_array().into_iter().flatten() {
            let name = check["alertname"].as_str().expect("alertname").to_string();
            match check["exp_alerts"].as_array() {
                Some(expected) if !expected.is_empty() => fires.insert(name),
                _ => silent.insert(name),
            };
        }
    }
    for name in names.keys() {
        assert!(fires.contains(name), "{name}: no test where it fires");
        assert!(
            silent.contains(name),
            "{name}: no test where it stays silent"
        );
    }
    let unknown: Vec<_> = fires
        .union(&silent)
        .filter(|n| !names.contains_key(*n))
        .collect();
    assert!(
        unknown.is_empty(),
        "tests of alerts that do not exist: {unknown:?}"
    );
}

#[test]
fn the_rules_query_only_metrics_the_binaries_expose() {
    let documented: BTreeSet<String> = metrics_doc::documented_rows()
        .unwrap_or_else(|e| panic!("{e:#}"))
        .into_iter()
        .map(|r| r.name)
        .collect();
    let rules = alerts(&yaml(&repo().join("deploy/prometheus/rules.yaml")));
    for (alert, expr) in &rules {
        let used: Vec<&str> = expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("swimlb_"))
            .collect();
        assert!(
            !used.is_empty() || expr.contains("up{"),
            "{alert} queries no swimlb metric: {expr}"
        );
        for metric in used {
            assert!(
                documented.contains(metric),
                "{alert} queries {metric}, which the table of {} (and so no binary) lacks",
                metrics_doc::PAGE
            );
        }
    }
}

/// The metrics reference's alerts table names exactly the alerts of `rules.yaml`, each with the
/// severity the rule gives it and a link to the troubleshooting entry named after it (mdBook's
/// anchor of a heading `### SwimlbName` is `swimlbname`).
#[test]
fn the_metrics_reference_lists_every_alert_with_its_severity_and_troubleshooting_entry() {
    let rules = yaml(&repo().join("deploy/prometheus/rules.yaml"));
    let severities: BTreeMap<String, String> = rules["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .filter_map(|r| {
            Some((
                r["alert"].as_str()?.to_string(),
                r["labels"]["severity"].as_str()?.to_string(),
            ))
        })
        .collect();
    assert_eq!(
        severities.keys().collect::<Vec<_>>(),
        alerts(&rules).keys().collect::<Vec<_>>(),
        "every alert has a severity label"
    );
    let documented = metrics_doc::documented_alerts().unwrap_or_else(|e| panic!("{e:#}"));
    let listed: BTreeMap<String, String> = documented
        .iter()
        .map(|a| (a.name.clone(), a.severity.clone()))
        .collect();
    assert_eq!(
        listed.len(),
        documented.len(),
        "an alert listed twice in {}",
        metrics_doc::PAGE
    );
    assert_eq!(
        listed,
        severities,
        "the alerts of {} (left) and of rules.yaml (right) differ",
        metrics_doc::PAGE
    );
    for alert in &documented {
        assert_eq!(
            alert.troubleshooting.as_deref(),
            Some(alert.name.to_lowercase().as_str()),
            "{}: its row in {} links to ../troubleshooting.md#{}",
            alert.name,
            metrics_doc::PAGE,
            alert.name.to_lowercase()
        );
    }
}

#[test]
fn the_promtool_helpers_fail_when_promtool_reports_a_problem() {
    // A counter without `_total` and a metric without help: promtool lints both.
    let bad = "# TYPE swimlb_things counter\nswimlb_things 1\n";
    let err = promtool::check_metrics(bad).expect_err("a lint problem is an error");
    assert!(err.to_string().contains("_total"), "{err}");
    // Unparsable text.
    assert!(promtool::check_metrics("swimlb_x{ 1\n").is_err());
    // Well-formed text passes.
    promtool::check_metrics("# HELP swimlb_things_total Things.\n# TYPE swimlb_things_total counter\nswimlb_things_total 1\n")
        .unwrap_or_else(|e| panic!("{e}"));

    // A rules file with a syntax error, and a unit test whose expectation is wrong.
    let dir = std::env::temp_dir().join(format!("swimlb-rules-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rules = dir.join("rules.yaml");
    std::fs::write(
        &rules,
        "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: sum(up) >\n",
    )
    .unwrap();
    assert!(promtool::check_rules(&rules).is_err());
    std::fs::write(
        &rules,
        "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up == 0\n",
    )
    .unwrap();
    promtool::check_rules(&rules).unwrap_or_else(|e| panic!("{e}"));
    let tests = dir.join("rules_test.yaml");
    std::fs::write(
        &tests,
        "rule_files: [rules.yaml]\ntests:\n  - interval: 1m\n    input_series:\n      - series: 'up{job=\"j\"}'\n        values: '0x5'\n    alert_rule_test:\n      - eval_time: 2m\n        alertname: A\n        exp_alerts: []\n",
    )
    .unwrap();
    let err = promtool::test_rules(&tests).expect_err("the alert fires, the test says silent");
    assert!(err.to_string().contains("FAILED"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
