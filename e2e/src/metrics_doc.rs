//! The book's metrics reference, [`PAGE`]: its table of metrics (under `## Metrics`) against
//! the metric families a `/metrics` answer holds, so that tests keep the two equal (every
//! family a binary exposes is documented, with its type and labels, and every documented family
//! is exposed), and its table of alerts (under `## Alerts`), which a test keeps equal to
//! `deploy/prometheus/rules.yaml`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context as _, Result, bail};

/// The metrics reference, from the repository's root.
pub const PAGE: &str = "docs/src/reference/metrics.md";

/// One row of the page's metrics table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocRow {
    /// The name as PromQL sees it (`swimlb_member_down_total`).
    pub name: String,
    /// `counter`, `gauge` or `histogram`.
    pub kind: String,
    /// Label names (not `le`).
    pub labels: BTreeSet<String>,
    /// Who exposes it: `speaker` (both modes), `standalone`, `kubernetes`, `controller` or
    /// `all`.
    pub from: String,
}

impl DocRow {
    /// Whether `component` (`standalone`, `kubernetes` or `controller`) exposes this row.
    pub fn exposed_by(&self, component: &str) -> bool {
        self.from == component
            || self.from == "all"
            || (self.from == "speaker" && matches!(component, "standalone" | "kubernetes"))
    }
}

/// One row of the page's alerts table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertRow {
    /// The alert's name (`SwimlbMemberDown`).
    pub name: String,
    /// Its `severity` label (`critical`, `warning`).
    pub severity: String,
    /// The anchor of the row's link into the troubleshooting page (`swimlbmemberdown` for
    /// `../troubleshooting.md#swimlbmemberdown`), if it has one.
    pub troubleshooting: Option<String>,
}

/// The text of [`PAGE`] in the repository this crate was built from.
pub fn page() -> Result<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(PAGE);
    std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
}

/// The rows of [`PAGE`]'s metrics table.
pub fn documented_rows() -> Result<Vec<DocRow>> {
    rows(&page()?)
}

/// The rows of [`PAGE`]'s alerts table.
pub fn documented_alerts() -> Result<Vec<AlertRow>> {
    alert_rows(&page()?)
}

/// The lines of the section under the heading `## {heading}`, up to the next `## ` heading.
fn section<'a>(page: &'a str, heading: &str) -> Result<&'a str> {
    page.split("\n## ")
        .skip(1)
        .find(|s| s.lines().next().map(str::trim) == Some(heading))
        .ok_or_else(|| anyhow::anyhow!("{PAGE} has no `## {heading}` section"))
}

/// The cells of a markdown table row, trimmed (none for a line that is not a row).
fn cells(line: &str) -> Vec<&str> {
    let line = line.trim();
    if !line.starts_with('|') {
        return Vec::new();
    }
    line.trim_matches('|').split('|').map(str::trim).collect()
}

/// The rows of the metrics table: the lines under `## Metrics` whose first cell is a
/// backticked `swimlb_` name.
pub fn rows(page: &str) -> Result<Vec<DocRow>> {
    let mut rows = Vec::new();
    for line in section(page, "Metrics")?.lines() {
        let cells = cells(line);
        let Some(name) = cells
            .first()
            .and_then(|c| c.strip_prefix("`swimlb_"))
            .and_then(|c| c.strip_suffix('`'))
        else {
            continue;
        };
        let [_, kind, labels, from, ..] = cells[..] else {
            bail!("{PAGE}: a metrics row with fewer than 4 cells: {line}");
        };
        rows.push(DocRow {
            name: format!("swimlb_{name}"),
            kind: kind.to_string(),
            labels: labels
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect(),
            from: from.to_string(),
        });
    }
    if rows.is_empty() {
        bail!("{PAGE}: the `## Metrics` section has no table rows");
    }
    Ok(rows)
}

/// The rows of the alerts table: the lines under `## Alerts` whose first cell is a backticked
/// name, the second its severity.
pub fn alert_rows(page: &str) -> Result<Vec<AlertRow>> {
    const LINK: &str = "](../troubleshooting.md#";
    let mut rows = Vec::new();
    for line in section(page, "Alerts")?.lines() {
        let cells = cells(line);
        let Some(name) = cells
            .first()
            .and_then(|c| c.strip_prefix('`'))
            .and_then(|c| c.strip_suffix('`'))
        else {
            continue;
        };
        let [_, severity, ..] = cells[..] else {
            bail!("{PAGE}: an alerts row without a severity: {line}");
        };
        let troubleshooting = line
            .split_once(LINK)
            .map(|(_, rest)| rest.split(')').next().unwrap_or_default().to_string());
        rows.push(AlertRow {
            name: name.to_string(),
            severity: severity.to_string(),
            troubleshooting,
        });
    }
    if rows.is_empty() {
        bail!("{PAGE}: the `## Alerts` section has no table rows");
    }
    Ok(rows)
}

/// One family of an exposition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exposed {
    /// The `# TYPE`.
    pub kind: String,
    /// Label names seen on its samples (not `le`).
    pub labels: BTreeSet<String>,
    /// How many samples it has.
    pub samples: usize,
}

/// The families of a classic text exposition, by name, from its `# TYPE` lines and the samples
/// after each.
pub fn families(text: &str) -> BTreeMap<String, Exposed> {
    let mut out: BTreeMap<String, Exposed> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            out.entry(name.to_string()).or_default().kind = kind.to_string();
            current = Some(name.to_string());
        } else if line.starts_with('#') || line.trim().is_empty() {
            continue;
        } else if let Some(family) = current.as_ref().and_then(|c| out.get_mut(c)) {
            family.samples += 1;
            family
                .labels
                .extend(label_names(line).into_iter().filter(|l| l != "le"));
        }
    }
    out
}

/// The label names of one sample line (none when its labels do not parse).
fn label_names(line: &str) -> Vec<String> {
    let Some(start) = line.find('{') else {
        return Vec::new();
    };
    crate::scrape::labels(&line[start + 1..])
        .map(|(labels, _)| labels.into_iter().map(|(name, _)| name).collect())
        .unwrap_or_default()
}

/// Whether the families `component` (`standalone`, `kubernetes` or `controller`) exposes are
/// exactly the page's rows for it ([`DocRow::exposed_by`]), with the same types and, for
/// families that have samples, the same labels. `Err` lists every difference.
pub fn compare(
    rows: &[DocRow],
    component: &str,
    exposed: &BTreeMap<String, Exposed>,
) -> Result<()> {
    let documented: BTreeMap<&str, &DocRow> = rows
        .iter()
        .filter(|r| r.exposed_by(component))
        .map(|r| (r.name.as_str(), r))
        .collect();
    let mut problems = Vec::new();
    for (name, family) in exposed {
        match documented.get(name.as_str()) {
            None => problems.push(format!(
                "{name} ({}) is exposed by the {component} but not in the table of {PAGE}",
                family.kind
            )),
            Some(row) if row.kind != family.kind => problems.push(format!(
                "{name}: {PAGE} says {}, the {component} exposes a {}",
                row.kind, family.kind
            )),
            Some(row) if family.samples > 0 && row.labels != family.labels => {
                problems.push(format!(
                    "{name}: {PAGE} lists labels {:?}, the {component} exposes {:?}",
                    row.labels, family.labels
                ))
            }
            Some(_) => {}
        }
    }
    for name in documented.keys() {
        if !exposed.contains_key(*name) {
            problems.push(format!(
                "{name} is in the table of {PAGE} for the {component} but not exposed"
            ));
        }
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("\n"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE_TEXT: &str = "# x\n\n## Metrics\n\n| Metric | Type | Labels | From | Meaning |\n| --- | --- | --- | --- | --- |\n\
        | `swimlb_a_total` | counter | `reason` | speaker | A. |\n\
        | `swimlb_b` | gauge | - | all | B. |\n\
        | `swimlb_c_seconds` | histogram | - | controller | C. |\n\
        | `swimlb_d` | gauge | - | kubernetes | D. |\n\n## Metrics of a kind\n| `swimlb_y` | gauge | - | all | no |\n\
        \n## Alerts\n\n| Alert | Severity | What it means | What to do |\n| --- | --- | --- | --- |\n\
        | `SwimlbA` | critical | `swimlb_a_total` rose. | [Why](../troubleshooting.md#swimlba) |\n\
        | `SwimlbB` | warning | B. | Nothing. |\n\n## Next\n| `swimlb_z` | gauge | - | all | no |\n";

    const TEXT: &str = "# HELP swimlb_a_total A.\n# TYPE swimlb_a_total counter\nswimlb_a_total{reason=\"x,=\\\"}\"} 1\n\
        # HELP swimlb_b B.\n# TYPE swimlb_b gauge\nswimlb_b 1\n";

    #[test]
    fn the_table_rows_and_the_exposed_families_are_read_with_types_and_labels() {
        let rows = rows(PAGE_TEXT).unwrap();
        assert_eq!(rows.len(), 4);
        assert_eq!(rows[0].labels, BTreeSet::from(["reason".to_string()]));
        assert!(rows[1].labels.is_empty());
        let exposed = families(TEXT);
        assert_eq!(exposed["swimlb_a_total"].labels, rows[0].labels);
        assert_eq!(exposed["swimlb_b"].kind, "gauge");
        compare(&rows, "standalone", &exposed).unwrap();
        assert!(rows[3].exposed_by("kubernetes") && !rows[3].exposed_by("standalone"));
        assert!(rows[0].exposed_by("kubernetes") && !rows[0].exposed_by("controller"));
    }

    #[test]
    fn an_undocumented_a_missing_or_a_mistyped_family_is_named() {
        let rows = rows(PAGE_TEXT).unwrap();
        let mut exposed = families(TEXT);
        exposed.insert("swimlb_new".into(), Exposed::default());
        exposed.get_mut("swimlb_b").unwrap().kind = "counter".into();
        let err = compare(&rows, "controller", &exposed)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!(
                "swimlb_new () is exposed by the controller but not in the table of {PAGE}"
            )),
            "{err}"
        );
        assert!(err.contains("swimlb_a_total (counter) is exposed"), "{err}");
        assert!(
            err.contains(&format!("swimlb_b: {PAGE} says gauge")),
            "{err}"
        );
        assert!(
            err.contains(&format!(
                "swimlb_c_seconds is in the table of {PAGE} for the controller but not exposed"
            )),
            "{err}"
        );
    }

    #[test]
    fn the_alert_rows_are_read_with_their_severity_and_troubleshooting_anchor() {
        let alerts = alert_rows(PAGE_TEXT).unwrap();
        assert_eq!(
            alerts,
            [
                AlertRow {
                    name: "SwimlbA".into(),
                    severity: "critical".into(),
                    troubleshooting: Some("swimlba".into()),
                },
                AlertRow {
                    name: "SwimlbB".into(),
                    severity: "warning".into(),
                    troubleshooting: None,
                },
            ]
        );
    }

    #[test]
    fn a_page_without_a_section_or_its_rows_is_an_error_that_names_the_page() {
        let err = rows("# x\n\n## Metrics of a kind\n| `swimlb_y` | gauge | - | all | no |\n")
            .unwrap_err()
            .to_string();
        assert_eq!(err, format!("{PAGE} has no `## Metrics` section"));
        let err = alert_rows("# x\n\n## Alerts\n\nNone yet.\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            format!("{PAGE}: the `## Alerts` section has no table rows")
        );
    }

    #[test]
    fn the_book_page_holds_both_tables() {
        let page = page().unwrap();
        let metrics = rows(&page).unwrap();
        assert!(
            metrics.iter().any(|r| r.name == "swimlb_build_info"),
            "{metrics:?}"
        );
        let alerts = alert_rows(&page).unwrap();
        assert!(
            alerts.iter().all(|a| a.name.starts_with("Swimlb")),
            "{alerts:?}"
        );
    }
}
