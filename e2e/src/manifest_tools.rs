//! The checkers the deploy tests run on `deploy/`, as an operator or a CI pipeline would:
//! `kubernetes-validate --strict` (the upstream JSON schemas, offline) and `checkov` (static
//! security checks), both from PyPI, installed by `test.sh` into the virtual environment
//! [`TOOLS_VENV`].
//!
//! A missing tool is an `Err` that says how to install it, never a skip. Every function fails
//! with the tool's own output when the tool reports a problem.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

/// Where `test.sh` installs the Python tools (`SWIMLB_TOOLS_VENV` overrides it).
pub const TOOLS_VENV: &str = "/opt/swimlb-tools";

fn venv() -> PathBuf {
    std::env::var_os("SWIMLB_TOOLS_VENV").map_or_else(|| PathBuf::from(TOOLS_VENV), PathBuf::from)
}

/// `name` from the tools' virtual environment, else from `PATH`.
pub fn program(name: &str) -> Result<PathBuf> {
    let in_venv = venv().join("bin").join(name);
    if in_venv.is_file() {
        return Ok(in_venv);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join(name))
        .find(|p| p.is_file());
    on_path.with_context(|| {
        format!(
            "{name} is neither in {}/bin nor on PATH: run ./test.sh as root (it runs `python3 -m \
             venv {TOOLS_VENV} && {TOOLS_VENV}/bin/pip install kubernetes-validate checkov`), or \
             set SWIMLB_TOOLS_VENV to a virtual environment that has it",
            venv().display()
        )
    })
}

fn both(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `kubernetes-validate --strict -k VERSION FILES`: the number of resources that passed, or
/// `Err` with the tool's report when it exits non-zero or says anything but "passed" (a kind
/// it has no schema for is only a warning to the tool, and an error here).
pub fn kubernetes_validate(version: &str, files: &[PathBuf]) -> Result<usize> {
    let program = program("kubernetes-validate")?;
    let out = Command::new(&program)
        .args(["--strict", "--kubernetes-version", version])
        .args(files)
        .output()
        .with_context(|| format!("running {}", program.display()))?;
    let report = both(&out);
    let passed = report
        .lines()
        .filter(|l| l.starts_with("INFO") && l.contains(" passed for resource "))
        .count();
    let other = report.lines().filter(|l| !l.trim().is_empty()).count() - passed;
    if !out.status.success() || other > 0 {
        bail!(
            "kubernetes-validate --strict -k {version} ({}):\n{report}",
            out.status
        );
    }
    Ok(passed)
}

/// One check result of checkov.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Finding {
    /// `CKV_K8S_11`, ...
    pub check_id: String,
    /// `DaemonSet.swimlb-system.swimlb-speaker`, ...
    pub resource: String,
    /// The file, relative to the scanned directory.
    pub file: String,
    /// The reason written next to a skip (empty for a failure).
    pub reason: String,
}

/// What checkov found in a directory.
#[derive(Clone, Debug, Default)]
pub struct CheckovReport {
    /// Checks that passed.
    pub passed: usize,
    /// Checks that failed.
    pub failed: Vec<Finding>,
    /// Checks skipped by a `checkov.io/skipN` annotation.
    pub skipped: Vec<Finding>,
}

fn findings(results: &Value, key: &str) -> Vec<Finding> {
    results[key]
        .as_array()
        .map(|checks| {
            checks
                .iter()
                .map(|c| Finding {
                    check_id: c["check_id"].as_str().unwrap_or_default().to_string(),
                    resource: c["resource"].as_str().unwrap_or_default().to_string(),
                    file: c["file_path"].as_str().unwrap_or_default().to_string(),
                    reason: c["check_result"]["suppress_comment"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `checkov -d DIR --framework kubernetes` (offline: `--skip-download`), read from its JSON
/// report. Failed checks are in the report, not an `Err`; `Err` when checkov cannot run or
/// scanned nothing.
pub fn checkov(dir: &Path) -> Result<CheckovReport> {
    let program = program("checkov")?;
    let out = Command::new(&program)
        .args(["--directory"])
        .arg(dir)
        .args([
            "--framework",
            "kubernetes",
            "--skip-download",
            "--output",
            "json",
        ])
        .output()
        .with_context(|| format!("running {}", program.display()))?;
    let json: Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "checkov -d {} ({}) printed no JSON report:\n{}",
            dir.display(),
            out.status,
            both(&out)
        )
    })?;
    // One framework: one report object (several frameworks give a list of them).
    let report = match &json {
        Value::Array(reports) => reports
            .iter()
            .find(|r| r["check_type"] == "kubernetes")
            .cloned()
            .unwrap_or(Value::Null),
        other => other.clone(),
    };
    let Some(passed) = report["summary"]["passed"].as_u64() else {
        bail!(
            "checkov -d {} scanned no Kubernetes manifest:\n{}",
            dir.display(),
            both(&out)
        );
    };
    let results = &report["results"];
    Ok(CheckovReport {
        passed: usize::try_from(passed).unwrap_or(usize::MAX),
        failed: findings(results, "failed_checks"),
        skipped: findings(results, "skipped_checks"),
    })
}

/// `text` without its `checkov.io/skipN` annotations (an `annotations:` key left empty goes
/// too), to see what checkov reports without the skips.
pub fn without_skips(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("checkov.io/skip"))
        .collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        let empty_map = line.trim_end().ends_with("annotations:")
            && lines
                .get(i + 1)
                .is_none_or(|next| indent(next) <= indent(line));
        if !empty_map {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_skips_drops_the_skip_annotations_and_an_emptied_map() {
        let text = "metadata:\n  name: a\n  annotations:\n    checkov.io/skip1: CKV_K8S_11=why\n\
                    spec:\n  x: 1\n---\nmetadata:\n  annotations:\n    checkov.io/skip1: A=b\n    \
                    keep: me\n";
        assert_eq!(
            without_skips(text),
            "metadata:\n  name: a\nspec:\n  x: 1\n---\nmetadata:\n  annotations:\n    keep: me\n"
        );
    }
}
