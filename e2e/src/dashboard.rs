//! The Grafana dashboard `deploy/grafana/swimlb.json` as the tests read it: its panels, their
//! PromQL queries, the metrics and labels each query names, and the queries with Grafana's
//! variables substituted so that a plain Prometheus can evaluate them.

use std::collections::BTreeSet;

use serde_json::Value;

/// Labels a query may use on any swimlb metric although the binaries do not expose them:
/// Prometheus adds `job` and `instance` to every scraped series, the Prometheus Operator and
/// Kubernetes service discovery `namespace`, `pod`, `container`, `service` and `endpoint`.
pub const TARGET_LABELS: &[&str] = &[
    "job",
    "instance",
    "namespace",
    "pod",
    "container",
    "service",
    "endpoint",
];

/// The dashboard's file, from the repository root.
pub const PATH: &str = "deploy/grafana/swimlb.json";

/// One query of one panel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// The panel's `id`.
    pub panel_id: u64,
    /// The panel's `title`.
    pub panel_title: String,
    /// The panel's `type` (`table`, `timeseries`, ...).
    pub panel_type: String,
    /// The target's `refId`.
    pub ref_id: String,
    /// The PromQL, with Grafana's variables as written.
    pub expr: String,
}

/// Every panel, rows' nested `panels` included (the rows themselves too).
pub fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().into_iter().flatten() {
        out.push(p);
        out.extend(p["panels"].as_array().into_iter().flatten());
    }
    out
}

/// Every query of every panel that has targets.
pub fn queries(dashboard: &Value) -> Vec<Query> {
    let mut out = Vec::new();
    for p in panels(dashboard) {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push(Query {
                panel_id: p["id"].as_u64().unwrap_or(0),
                panel_title: p["title"].as_str().unwrap_or("").to_string(),
                panel_type: p["type"].as_str().unwrap_or("").to_string(),
                ref_id: t["refId"].as_str().unwrap_or("").to_string(),
                expr: t["expr"].as_str().unwrap_or("").to_string(),
            });
        }
    }
    out
}

/// The `namespace` variable's All value: it also matches series without the label.
pub const ALL_NAMESPACES: &str = ".*";

/// `expr` with Grafana's variables replaced: every `$namespace` (or `${namespace}`, with or
/// without a format) by `namespace` ([`ALL_NAMESPACES`] for All), `$__rate_interval` and
/// `$__interval` by `rate_interval`, `$__range` by `range`.
pub fn substitute(expr: &str, namespace: &str, rate_interval: &str, range: &str) -> String {
    let mut s = expr.to_string();
    for (from, to) in [
        ("${namespace:regex}", namespace),
        ("${namespace:pipe}", namespace),
        ("${namespace}", namespace),
        ("$namespace", namespace),
        ("${__rate_interval}", rate_interval),
        ("$__rate_interval", rate_interval),
        ("${__interval}", rate_interval),
        ("$__interval", rate_interval),
        ("${__range}", range),
        ("$__range", range),
    ] {
        s = s.replace(from, to);
    }
    s
}

/// Skips a double-quoted string starting at byte `i` (on the opening quote); the index after
/// the closing quote.
fn skip_string(bytes: &[u8], mut i: usize) -> usize {
    i += 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b':'
}

/// Every `swimlb_*` metric a query names, each with the label names of the selector that
/// follows it (`{...}`, empty when it has none). String literals are skipped.
pub fn selectors(expr: &str) -> Vec<(String, BTreeSet<String>)> {
    let bytes = expr.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'"' {
            i = skip_string(bytes, i);
            continue;
        }
        if !is_word(c) || (i > 0 && is_word(bytes[i - 1])) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && is_word(bytes[i]) {
            i += 1;
        }
        let word = &expr[start..i];
        if !word.starts_with("swimlb_") {
            continue;
        }
        let mut labels = BTreeSet::new();
        let mut j = i;
        while j < bytes.len() && bytes[j] == b' ' {
            j += 1;
        }
        if j < bytes.len() && bytes[j] == b'{' {
            j += 1;
            let mut name = String::new();
            while j < bytes.len() && bytes[j] != b'}' {
                match bytes[j] {
                    b'"' => {
                        j = skip_string(bytes, j);
                        continue;
                    }
                    b'=' | b'!' | b'~' => {
                        if !name.is_empty() {
                            labels.insert(std::mem::take(&mut name));
                        }
                    }
                    b',' | b' ' => {}
                    c => name.push(c as char),
                }
                j += 1;
            }
            i = j;
        }
        out.push((word.to_string(), labels));
    }
    out
}

/// The label names of every `by (...)` and `without (...)` clause of a query (and `on`,
/// `ignoring`, `group_left`, `group_right`).
pub fn grouping_labels(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = expr.as_bytes();
    for keyword in [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ] {
        let mut from = 0;
        while let Some(pos) = expr[from..].find(keyword) {
            let at = from + pos;
            from = at + keyword.len();
            if at > 0 && is_word(bytes[at - 1]) {
                continue;
            }
            let rest = expr[from..].trim_start();
            if !rest.starts_with('(') || from < bytes.len() && is_word(bytes[from]) {
                continue;
            }
            if let Some(end) = rest.find(')') {
                out.extend(
                    rest[1..end]
                        .split(',')
                        .map(str::trim)
                        .filter(|l| !l.is_empty())
                        .map(str::to_string),
                );
            }
        }
    }
    out
}

/// The metrics reference row name a series name belongs to: a histogram's `_bucket`, `_sum` and `_count`
/// series belong to the histogram (when `is_histogram` says the base is one).
pub fn family_of(series: &str, is_histogram: impl Fn(&str) -> bool) -> String {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = series.strip_suffix(suffix)
            && is_histogram(base)
        {
            return base.to_string();
        }
    }
    series.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_and_grouping_labels_are_found() {
        let expr = r#"sum by (ip, owner) (rate(swimlb_x_total{namespace=~"$namespace", a!="}"}[5s])) / on() swimlb_y"#;
        let s = selectors(expr);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].0, "swimlb_x_total");
        assert_eq!(
            s[0].1,
            ["a", "namespace"].map(String::from).into_iter().collect()
        );
        assert_eq!(s[1], ("swimlb_y".to_string(), BTreeSet::new()));
        assert_eq!(
            grouping_labels(expr),
            ["ip", "owner"].map(String::from).into_iter().collect()
        );
        assert_eq!(
            substitute(
                "x{namespace=~\"$namespace\"}[$__rate_interval]",
                ALL_NAMESPACES,
                "5s",
                "1m"
            ),
            "x{namespace=~\".*\"}[5s]"
        );
        assert_eq!(
            family_of("swimlb_h_bucket", |b| b == "swimlb_h"),
            "swimlb_h"
        );
        assert_eq!(
            family_of("swimlb_c_count", |_| false),
            "swimlb_c_count".to_string()
        );
    }
}
