//! `docs/src/reference/cli.md`: every flag of every program, walked from the clap definitions,
//! and the exit statuses, from the constants the programs exit with.

use std::fmt::Write as _;

use anyhow::{Context as _, bail, ensure};
use swimlb_config::cli::{EX_UNAVAILABLE, EX_USAGE};
use swimlb_controller::cli::EX_DATAERR;

use super::{code, generated_comment, table};
use crate::cli::{EXIT_INTERRUPTED, EXIT_NEEDS_ROOT};

/// The page's text.
pub fn page() -> anyhow::Result<String> {
    let mut out = generated_comment();
    out.push_str(
        "# Command line\n\n\
         swimlb has four programs. `swimlb-speaker` runs on every node, from a file \
         (`standalone`) or in Kubernetes (`kubernetes`), and checks files and prints keys and \
         status. `swimlb-controller` assigns LoadBalancer Service IPs in Kubernetes. `crdgen` \
         prints the custom resource definitions. `swimlb-lab` is the lab that measures them: \
         simulations, failover trials, the demo. Below is every command with every argument: \
         its value, its default, the values it accepts, the environment variable it is also \
         read from, and what it does. Every command also takes `--help` (`-h`), and every \
         program `--version` (`-V`). The exit statuses are at the end of the page.\n\n",
    );
    let lab = crate::cli::command();
    for program in [
        swimlb_speaker::cli::command(),
        swimlb_controller::cli::command(),
        swimlb_controller::cli::crdgen_command(),
        lab.clone(),
    ] {
        command_section(&mut out, program, &[], 2)?;
    }
    for (name, _) in SEE_ALSO {
        ensure!(
            out.contains(&format!("# `{name}`\n")),
            "SEE_ALSO names `{name}`, which is no command"
        );
    }
    out.push_str(&exit_statuses(&lab)?);
    Ok(out)
}

/// The pages that say more about a command.
const SEE_ALSO: &[(&str, &str)] = &[
    (
        "swimlb-speaker check-config",
        "The file's keys are in [the standalone file](standalone.md).",
    ),
    (
        "swimlb-speaker standalone",
        "The file's keys are in [the standalone file](standalone.md).",
    ),
    (
        "crdgen",
        "The resources' fields are in [custom resources](crds.md).",
    ),
];

/// The section of `command` (under `parents`, at heading `level`), then its subcommands'.
fn command_section(
    out: &mut String,
    mut command: clap::Command,
    parents: &[String],
    level: usize,
) -> anyhow::Result<()> {
    command.build();
    let mut names: Vec<String> = parents.to_vec();
    names.push(command.get_name().to_string());
    let full = names.join(" ");
    let _ = writeln!(out, "{} `{full}`\n", "#".repeat(level.min(4)));
    if let Some(about) = command.get_long_about().or(command.get_about()) {
        let _ = writeln!(out, "{}\n", paragraph(&about.to_string()));
    }
    if let Some((_, see)) = SEE_ALSO.iter().find(|(name, _)| *name == full) {
        let _ = writeln!(out, "{see}\n");
    }
    let subcommands: Vec<&clap::Command> = command
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .collect();
    let usage = usage(&command, &full, !subcommands.is_empty());
    let _ = writeln!(out, "```text\n{usage}\n```\n");
    let rows = arguments(&command, &full)?;
    if !rows.is_empty() {
        out.push_str(&table(
            &[
                "Argument",
                "Value",
                "Default",
                "Values",
                "Environment",
                "Meaning",
            ],
            &rows,
        ));
        out.push('\n');
    }
    if !subcommands.is_empty() {
        let list: Vec<String> = subcommands.iter().map(|s| code(s.get_name())).collect();
        let _ = writeln!(out, "Commands: {}.\n", list.join(", "));
    }
    for sub in subcommands {
        command_section(out, sub.clone(), &names, level + 1)?;
    }
    Ok(())
}

/// `PROGRAM [OPTIONS] <ARG>...` for `command`, as written by the user.
fn usage(command: &clap::Command, full: &str, has_subcommands: bool) -> String {
    let mut parts = vec![full.to_string()];
    if command
        .get_arguments()
        .any(|a| !a.is_positional() && !is_builtin(a))
    {
        parts.push("[OPTIONS]".into());
    }
    for arg in command.get_positionals() {
        let name = value_name(arg);
        if arg.is_required_set() {
            parts.push(name);
        } else {
            parts.push(format!("[{name}]"));
        }
    }
    if has_subcommands && command.is_subcommand_required_set() {
        parts.push("<COMMAND>".into());
    } else if has_subcommands {
        parts.push("[COMMAND]".into());
    }
    parts.join(" ")
}

fn is_builtin(arg: &clap::Arg) -> bool {
    matches!(arg.get_id().as_str(), "help" | "version")
}

/// `<NAME>` for the value(s) of `arg`.
fn value_name(arg: &clap::Arg) -> String {
    match arg.get_value_names() {
        Some(names) => names
            .iter()
            .map(|n| format!("<{n}>"))
            .collect::<Vec<_>>()
            .join(" "),
        None => format!("<{}>", arg.get_id().as_str().to_uppercase()),
    }
}

/// One row per argument of `command`; an argument without a help text is an error.
fn arguments(command: &clap::Command, full: &str) -> anyhow::Result<Vec<Vec<String>>> {
    let mut rows = Vec::new();
    for arg in command.get_arguments() {
        if arg.is_hide_set() || is_builtin(arg) {
            continue;
        }
        let help = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|h| paragraph(&h.to_string()))
            .filter(|h| !h.is_empty())
            .with_context(|| format!("`{full}`: argument `{}` has no help text", arg.get_id()))?;
        let takes_value = arg.get_num_args().is_some_and(|n| n.takes_values());
        let name = if arg.is_positional() {
            value_name(arg)
        } else {
            let mut names = Vec::new();
            if let Some(short) = arg.get_short() {
                names.push(format!("-{short}"));
            }
            if let Some(long) = arg.get_long() {
                names.push(format!("--{long}"));
            }
            if names.is_empty() {
                bail!("`{full}`: argument `{}` has no name", arg.get_id());
            }
            names.join(", ")
        };
        let value = if arg.is_positional() || !takes_value {
            "-".to_string()
        } else {
            let mut value = value_name(arg);
            if let Some(delimiter) = arg.get_value_delimiter() {
                value.push_str(&format!("{delimiter}..."));
            }
            value
        };
        let default: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| code(&v.to_string_lossy()))
            .collect();
        let default = if !takes_value && !arg.is_positional() {
            // A flag: absent is off, its one default.
            "-".to_string()
        } else if default.is_empty() {
            if arg.is_required_set() {
                "required".to_string()
            } else {
                "-".to_string()
            }
        } else {
            default.join(", ")
        };
        let values: Vec<String> = if takes_value {
            arg.get_possible_values()
                .iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| code(v.get_name()))
                .collect()
        } else {
            Vec::new()
        };
        let env = arg
            .get_env()
            .map(|e| code(&e.to_string_lossy()))
            .unwrap_or_else(|| "-".into());
        rows.push(vec![
            code(&name),
            if value == "-" { value } else { code(&value) },
            default,
            if values.is_empty() {
                "-".into()
            } else {
                values.join(", ")
            },
            env,
            help,
        ]);
    }
    Ok(rows)
}

/// A help text on one line, ending as a sentence (clap drops the period of a one-line text).
fn paragraph(text: &str) -> String {
    let mut line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.ends_with(|c: char| c.is_alphanumeric() || matches!(c, ')' | '`' | '"')) {
        line.push('.');
    }
    line
}

/// The exit statuses section, from the constants the programs exit with.
fn exit_statuses(lab: &clap::Command) -> anyhow::Result<String> {
    // clap's own status for a command line it refuses, as `swimlb-lab` exits with it.
    let lab_usage = match lab
        .clone()
        .try_get_matches_from(["swimlb-lab", "--no-such-flag"])
    {
        Err(e) => e.exit_code(),
        Ok(_) => bail!("swimlb-lab accepts --no-such-flag"),
    };
    let rows = vec![
        vec![
            "0".into(),
            "all".into(),
            "Success, and `--help` and `--version`. A daemon stopped by SIGTERM or SIGINT \
             exits 0 after draining."
                .into(),
        ],
        vec![
            "1".into(),
            "`swimlb-speaker keygen`, `crdgen`, `swimlb-lab`".into(),
            "`keygen`: the system has no randomness. `crdgen`: standard output cannot be \
             written. `swimlb-lab`: the run failed; its error is printed."
                .into(),
        ],
        vec![
            lab_usage.to_string(),
            "`swimlb-lab`".into(),
            "The command line is refused (unknown argument, bad value).".into(),
        ],
        vec![
            EX_USAGE.to_string(),
            "`swimlb-speaker`, `swimlb-controller`, `crdgen`".into(),
            "sysexits' `EX_USAGE`: the command line is refused, or the configuration is: a \
             standalone file that does not validate (every error is printed with its path), \
             `kubernetes` flags that do not validate, a `status` address that does not resolve."
                .into(),
        ],
        vec![
            EX_DATAERR.to_string(),
            "`swimlb-controller convert-metallb`".into(),
            "sysexits' `EX_DATAERR`: the input is not JSON, or holds what swimlb would read \
             differently from MetalLB (every error is printed)."
                .into(),
        ],
        vec![
            EX_UNAVAILABLE.to_string(),
            "`swimlb-speaker`, `swimlb-controller`".into(),
            "sysexits' `EX_UNAVAILABLE`: the daemon cannot run or stopped on a fatal error (no \
             API client, a socket it cannot open, the controller's lost Lease); the error is \
             logged and printed. `status`: the speaker does not answer."
                .into(),
        ],
        vec![
            EXIT_NEEDS_ROOT.to_string(),
            "`swimlb-lab`".into(),
            "The command builds network namespaces and needs root (CAP_NET_ADMIN).".into(),
        ],
        vec![
            EXIT_INTERRUPTED.to_string(),
            "`swimlb-lab`".into(),
            "Interrupted by Ctrl-C or SIGTERM; the lab was torn down first.".into(),
        ],
    ];
    Ok(format!(
        "## Exit statuses\n\n\
         The daemons follow sysexits.h, so a supervisor can tell a mistake to fix (64) from a \
         failure to retry (69).\n\n{}",
        table(&["Status", "Programs", "Meaning"], &rows)
    ))
}
