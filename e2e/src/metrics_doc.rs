//! The README's metrics reference (the table under `## Metrics`) and the metric families a
//! `/metrics` answer holds, so that tests keep the two equal: every family a binary exposes is
//! documented, with its type and labels, and every documented family is exposed.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Result, bail};

/// One row of the README's table.
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

/// The rows of the metrics table: the lines under `## Metrics` whose first cell is a
/// backticked `swimlb_` name, up to the next `## ` heading.
pub fn readme_rows(readme: &str) -> Result<Vec<DocRow>> {
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("Metrics"))
        .ok_or_else(|| anyhow::anyhow!("the README has no `## Metrics` section"))?;
    let mut rows = Vec::new();
    for line in section.lines() {
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        let Some(name) = cells
            .first()
            .and_then(|c| c.strip_prefix("`swimlb_"))
            .and_then(|c| c.strip_suffix('`'))
        else {
            continue;
        };
        let [_, kind, labels, from, ..] = cells[..] else {
            bail!("README metrics row with fewer than 4 cells: {line}");
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
        bail!("the README's `## Metrics` section has no table rows");
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
/// exactly the README's rows for it ([`DocRow::exposed_by`]), with the same types and, for
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
                "{name} ({}) is exposed by the {component} but not in the README's table",
                family.kind
            )),
            Some(row) if row.kind != family.kind => problems.push(format!(
                "{name}: the README says {}, the {component} exposes a {}",
                row.kind, family.kind
            )),
            Some(row) if family.samples > 0 && row.labels != family.labels => {
                problems.push(format!(
                    "{name}: the README lists labels {:?}, the {component} exposes {:?}",
                    row.labels, family.labels
                ))
            }
            Some(_) => {}
        }
    }
    for name in documented.keys() {
        if !exposed.contains_key(*name) {
            problems.push(format!(
                "{name} is in the README's table for the {component} but not exposed"
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

    const README: &str = "# x\n\n## Metrics\n\n| Metric | Type | Labels | From | Meaning |\n| --- | --- | --- | --- | --- |\n\
        | `swimlb_a_total` | counter | `reason` | speaker | A. |\n\
        | `swimlb_b` | gauge | - | all | B. |\n\
        | `swimlb_c_seconds` | histogram | - | controller | C. |\n\
        | `swimlb_d` | gauge | - | kubernetes | D. |\n\n## Next\n| `swimlb_z` | gauge | - | all | no |\n";

    const TEXT: &str = "# HELP swimlb_a_total A.\n# TYPE swimlb_a_total counter\nswimlb_a_total{reason=\"x,=\\\"}\"} 1\n\
        # HELP swimlb_b B.\n# TYPE swimlb_b gauge\nswimlb_b 1\n";

    #[test]
    fn the_table_rows_and_the_exposed_families_are_read_with_types_and_labels() {
        let rows = readme_rows(README).unwrap();
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
        let rows = readme_rows(README).unwrap();
        let mut exposed = families(TEXT);
        exposed.insert("swimlb_new".into(), Exposed::default());
        exposed.get_mut("swimlb_b").unwrap().kind = "counter".into();
        let err = compare(&rows, "controller", &exposed)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("swimlb_new () is exposed by the controller but not in"),
            "{err}"
        );
        assert!(err.contains("swimlb_a_total (counter) is exposed"), "{err}");
        assert!(err.contains("swimlb_b: the README says gauge"), "{err}");
        assert!(
            err.contains(
                "swimlb_c_seconds is in the README's table for the controller but not exposed"
            ),
            "{err}"
        );
    }
}
