//! `promtool` (Debian's `prometheus` package; `test.sh` installs it) as the tests run it: lint
//! a `/metrics` exposition, check and unit-test rule files.
//!
//! Every function fails with promtool's own output when promtool reports any problem, and says
//! how to install it when it is missing: a missing tool is a failure, never a skip.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use anyhow::{Context as _, Result, bail};

/// The program (`SWIMLB_PROMTOOL` overrides `promtool` from `PATH`).
fn program() -> String {
    std::env::var("SWIMLB_PROMTOOL").unwrap_or_else(|_| "promtool".into())
}

fn run(args: &[&str], stdin: Option<&str>) -> Result<Output> {
    let missing = || {
        format!(
            "running {} (apt-get install prometheus; test.sh installs it)",
            program()
        )
    };
    let mut cmd = Command::new(program());
    cmd.args(args);
    // Without input, `output` runs it with a null stdin and both outputs captured.
    let Some(text) = stdin else {
        return cmd.output().with_context(missing);
    };
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(missing)?;
    if let Some(mut pipe) = child.stdin.take() {
        pipe.write_all(text.as_bytes())
            .context("writing promtool's input")?;
    }
    child.wait_with_output().context("waiting for promtool")
}

fn both(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `promtool check metrics` on `exposition` (classic text format): `Err` with promtool's report
/// when it exits non-zero or reports anything at all.
pub fn check_metrics(exposition: &str) -> Result<()> {
    let out = run(&["check", "metrics"], Some(exposition))?;
    let report = both(&out);
    if !out.status.success() || !report.trim().is_empty() {
        bail!("promtool check metrics ({}):\n{report}", out.status);
    }
    Ok(())
}

/// `promtool check rules FILE`: promtool's output, or `Err` with it.
pub fn check_rules(file: &Path) -> Result<String> {
    let out = run(&["check", "rules", &file.to_string_lossy()], None)?;
    let report = both(&out);
    if !out.status.success() {
        bail!(
            "promtool check rules {} ({}):\n{report}",
            file.display(),
            out.status
        );
    }
    Ok(report)
}

/// `promtool test rules FILE`: promtool's output, or `Err` with it.
pub fn test_rules(file: &Path) -> Result<String> {
    let out = run(&["test", "rules", &file.to_string_lossy()], None)?;
    let report = both(&out);
    if !out.status.success() {
        bail!(
            "promtool test rules {} ({}):\n{report}",
            file.display(),
            out.status
        );
    }
    Ok(report)
}
