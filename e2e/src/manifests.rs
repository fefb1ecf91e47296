//! The generated files of `deploy/`: `deploy/swimlb.yaml`, the one file an operator applies,
//! `deploy/prometheus/prometheusrule.yaml`, the alerting rules of `rules.yaml` as a Prometheus
//! Operator `PrometheusRule`, and the Helm chart's copy of the CRDs,
//! `deploy/helm/swimlb/crds/crds.yaml`.
//!
//! All are pure renderings of their sources (the text in, the text out), so a test compares
//! them with the committed files and rewrites them on request (`e2e/tests/deploy.rs`). What the
//! sources say is edited in the sources only. The chart's templates are written by hand; that
//! they render `deploy/swimlb.yaml` is checked by `e2e/tests/helm.rs`.

use std::path::Path;

use anyhow::{Context as _, Result, bail};

/// The environment variable that makes the tests rewrite the generated files instead of
/// comparing them.
pub const REGENERATE: &str = "SWIMLB_REGENERATE";

/// The sources of `deploy/swimlb.yaml`, relative to the repository, in the order they are
/// applied: the namespace, the CRDs (written by the controller's `crdgen`), the controller, the
/// speaker.
pub const INSTALL_SOURCES: &[&str] = &[
    "deploy/src/namespace.yaml",
    "deploy/crds.yaml",
    "deploy/src/controller.yaml",
    "deploy/src/speaker.yaml",
];

/// Where the generated install manifest lives, relative to the repository.
pub const INSTALL: &str = "deploy/swimlb.yaml";
/// The plain Prometheus rules file, relative to the repository.
pub const RULES: &str = "deploy/prometheus/rules.yaml";
/// Where the generated `PrometheusRule` lives, relative to the repository.
pub const PROMETHEUS_RULE: &str = "deploy/prometheus/prometheusrule.yaml";

/// The CRDs, written by the controller's `crdgen`, relative to the repository.
pub const CRDS: &str = "deploy/crds.yaml";
/// The Helm chart, relative to the repository.
pub const CHART: &str = "deploy/helm/swimlb";
/// The chart's copy of [`CRDS`] (helm installs the files of a chart's `crds/` before its
/// templates, and never templates them), relative to the repository.
pub const CHART_CRDS: &str = "deploy/helm/swimlb/crds/crds.yaml";
/// The kustomization of `deploy/` (`kubectl apply -k deploy/`), relative to the repository.
pub const KUSTOMIZATION: &str = "deploy/kustomization.yaml";

const HOW_TO_REGENERATE: &str = "SWIMLB_REGENERATE=1 cargo test -p swimlb-e2e --test deploy";

/// Whether the first line of `text` that is neither blank nor a comment is a document start.
fn starts_with_document_marker(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .is_some_and(|l| l == "---")
}

/// `deploy/swimlb.yaml` from its sources, given as (path, text) in [`INSTALL_SOURCES`] order
/// (pure). Each source is copied whole, after a `---` unless it starts with one.
pub fn render_install(sources: &[(&str, String)]) -> String {
    let mut out = format!(
        "# swimlb: everything `kubectl apply --server-side -f deploy/swimlb.yaml` installs.\n\
         # Generated from {} by e2e/tests/deploy.rs\n\
         # ({HOW_TO_REGENERATE}). Do not edit: edit the sources.\n",
        sources
            .iter()
            .map(|(path, _)| *path)
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (_, text) in sources {
        if !starts_with_document_marker(text) {
            out.push_str("---\n");
        }
        out.push_str(text);
        if !text.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// `deploy/prometheus/prometheusrule.yaml` from the text of `rules.yaml` (pure): its `groups:`
/// and everything after it, comments included, become the `spec` of a `PrometheusRule`.
pub fn render_prometheus_rule(rules: &str) -> Result<String> {
    let Some(start) = rules.lines().position(|l| l.starts_with("groups:")) else {
        bail!("{RULES}: no top-level `groups:` line");
    };
    let mut out = format!(
        "# Generated from {RULES} by e2e/tests/deploy.rs\n\
         # ({HOW_TO_REGENERATE}). Do not edit: edit rules.yaml.\n\
         #\n\
         # The alerts of rules.yaml for the Prometheus Operator. It loads them when its\n\
         # ruleSelector matches these labels: add the label your Prometheus selects (often\n\
         # `release: <name>`).\n\
         apiVersion: monitoring.coreos.com/v1\n\
         kind: PrometheusRule\n\
         metadata:\n  \
           name: swimlb\n  \
           namespace: swimlb-system\n  \
           labels:\n    \
             app.kubernetes.io/name: swimlb\n\
         spec:\n"
    );
    for line in rules.lines().skip(start) {
        if !line.is_empty() {
            out.push_str("  ");
            out.push_str(line);
        }
        out.push('\n');
    }
    Ok(out)
}

/// The chart's `crds/crds.yaml` from the text of `deploy/crds.yaml` (pure): the same documents
/// after a header that says where they come from.
pub fn render_chart_crds(crds: &str) -> String {
    let mut out = format!(
        "# The CRDs of {CRDS}, which helm installs before the chart's templates (and, as for\n\
         # every chart, never upgrades or deletes: docs/src/install/helm.md).\n\
         # Generated from {CRDS} by e2e/tests/deploy.rs\n\
         # ({HOW_TO_REGENERATE}). Do not edit.\n"
    );
    out.push_str(crds);
    if !crds.ends_with('\n') {
        out.push('\n');
    }
    out
}

/// Reads `relative` under `repo`.
pub fn read(repo: &Path, relative: &str) -> Result<String> {
    let path = repo.join(relative);
    std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
}

/// `deploy/swimlb.yaml` as the sources under `repo` render it now.
pub fn install_from(repo: &Path) -> Result<String> {
    let sources = INSTALL_SOURCES
        .iter()
        .map(|path| Ok((*path, read(repo, path)?)))
        .collect::<Result<Vec<_>>>()?;
    Ok(render_install(&sources))
}

/// `deploy/prometheus/prometheusrule.yaml` as `rules.yaml` under `repo` renders it now.
pub fn prometheus_rule_from(repo: &Path) -> Result<String> {
    render_prometheus_rule(&read(repo, RULES)?)
}

/// The chart's `crds/crds.yaml` as `deploy/crds.yaml` under `repo` renders it now.
pub fn chart_crds_from(repo: &Path) -> Result<String> {
    Ok(render_chart_crds(&read(repo, CRDS)?))
}

/// Compares the committed `relative` under `repo` with `expected`; with [`REGENERATE`] set,
/// writes `expected` instead. `Err` names the first line that differs and how to regenerate.
pub fn check_generated(repo: &Path, relative: &str, expected: &str) -> Result<()> {
    let path = repo.join(relative);
    if std::env::var_os(REGENERATE).is_some() {
        return std::fs::write(&path, expected)
            .with_context(|| format!("writing {}", path.display()));
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed == expected {
        return Ok(());
    }
    let line = committed
        .lines()
        .zip(expected.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| committed.lines().count().min(expected.lines().count()))
        + 1;
    bail!(
        "{relative} is out of date with its sources (first difference at line {line}); \
         regenerate it with `{HOW_TO_REGENERATE}`"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_source_is_one_or_more_documents_of_the_install_file() {
        let sources = [
            ("a.yaml", "# about a\nkind: A\n".to_string()),
            (
                "b.yaml",
                "# generated\n---\nkind: B\n---\nkind: C".to_string(),
            ),
            ("d.yaml", "kind: D\n".to_string()),
        ];
        let out = render_install(&sources);
        assert!(out.starts_with("# swimlb: "));
        assert!(out.contains("a.yaml, b.yaml, d.yaml"));
        let body = out
            .split_once("Do not edit: edit the sources.\n")
            .unwrap()
            .1;
        assert_eq!(
            body,
            "---\n# about a\nkind: A\n# generated\n---\nkind: B\n---\nkind: C\n---\nkind: D\n"
        );
    }

    #[test]
    fn the_charts_crds_are_the_crds_after_a_header() {
        let crds = "# Generated by crdgen\n---\nkind: CustomResourceDefinition\n";
        let out = render_chart_crds(crds);
        assert!(out.starts_with("# The CRDs of deploy/crds.yaml"));
        let header = out.strip_suffix(crds).expect("the CRDs whole, at the end");
        assert!(header.lines().all(|l| l.starts_with("# ")), "{header}");
        assert!(render_chart_crds("kind: A").ends_with("kind: A\n"));
    }

    #[test]
    fn the_prometheus_rule_holds_the_groups_indented_under_spec() {
        let rules = "# header\ngroups:\n  - name: g\n\n    rules: []\n";
        let out = render_prometheus_rule(rules).unwrap();
        assert!(!out.contains("# header"));
        assert!(out.ends_with("spec:\n  groups:\n    - name: g\n\n      rules: []\n"));
        assert!(render_prometheus_rule("rules: []\n").is_err());
    }
}
