//! The command line of `swimlb-speaker`, callable as a function so the lab can run the very same
//! entry point in its namespaces (`swimlb-lab speaker ...`).
//!
//! `main` stays short (STYLE.md, linkerd2-proxy): parse, set up tracing, read and validate the
//! configuration (every error, exit 64), run until a signal, drain, exit.

use std::ffi::OsString;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{CommandFactory as _, Parser, Subcommand, ValueEnum};
use swimlb_config::keyfile::new_key_file;
use swimlb_config::standalone::Standalone;

use swimlb_config::cli::parse_args;
pub use swimlb_config::cli::{EX_UNAVAILABLE, EX_USAGE};

#[derive(Parser, Debug)]
#[command(
    name = "swimlb-speaker",
    version,
    about = "swimlb speaker: virtual IPs that fail over in under a second"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Validate a standalone configuration file: print every error with its path, or the
    /// worst-case detection time of each check.
    CheckConfig {
        /// The file to check.
        file: PathBuf,
    },
    /// Print a new random gossip key (one line of a key file).
    Keygen,
    /// Convert this node's keepalived.conf into the standalone file: the file on standard
    /// output, keywords that have no effect in swimlb as warnings on standard error; keywords
    /// swimlb would read differently are refused, each with its file and line (exit 65).
    ConvertKeepalived {
        /// The keepalived.conf (default: standard input, which cannot `include`).
        file: Option<PathBuf>,
        /// The gossip cluster's name, the same on every node (default: `keepalived-` and the
        /// instances' virtual_router_ids).
        #[arg(long)]
        cluster: Option<String>,
        /// This node's name (default: global_defs' router_id, else the hostname, read when the
        /// speaker starts).
        #[arg(long)]
        node: Option<String>,
        /// This node's gossip address, port 7946 (default: the instances' unicast_src_ip or
        /// mcast_src_ip).
        #[arg(long)]
        bind: Option<std::net::IpAddr>,
        /// Another node's gossip address, port 7946; once per node (default: the instances'
        /// unicast_peer addresses).
        #[arg(long = "peer", value_name = "PEER")]
        peers: Vec<std::net::IpAddr>,
    },
    /// Run the standalone speaker from a file until SIGTERM or SIGINT (then drain); SIGHUP
    /// reloads the file.
    Standalone {
        /// The configuration file.
        #[arg(long, short)]
        config: PathBuf,
        /// Log format.
        #[arg(long, value_enum, default_value = "text")]
        log_format: LogFormat,
        /// Log filter (tracing's EnvFilter syntax), also from RUST_LOG.
        #[arg(long, default_value = "info")]
        log: String,
    },
    /// Run the speaker of a Kubernetes node (a DaemonSet on the host network) until SIGTERM or
    /// SIGINT (then drain).
    Kubernetes {
        #[command(flatten)]
        args: Box<crate::sources::kubernetes::cli::Args>,
        /// Log format.
        #[arg(long, value_enum, default_value = "text")]
        log_format: LogFormat,
        /// Log filter (tracing's EnvFilter syntax), also from RUST_LOG.
        #[arg(long, default_value = "info")]
        log: String,
    },
    /// Print a running speaker's /status as tables: every VIP with its owner, interface and
    /// verdict, the members, this node's checks.
    Status {
        /// The speaker's HTTP listener: host:port, or a host (port 7572). In a speaker's Pod,
        /// SWIMLB_LISTEN (the node's address) is the default.
        #[arg(env = "SWIMLB_LISTEN", default_value = crate::serve::status_table::DEFAULT_ADDR)]
        addr: String,
        /// Redraw every second until Ctrl-C.
        #[arg(long, short)]
        watch: bool,
    },
}

/// The command line's definition, for `--help` and the reference page.
pub fn command() -> clap::Command {
    Cli::command()
}

/// Runs the command line `args` (the program name first) and returns the exit status.
pub fn main_with_args(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let cli: Cli = match parse_args(args) {
        Ok(cli) => cli,
        Err(status) => return status,
    };
    match cli.command {
        Command::CheckConfig { file } => check_config(&file),
        Command::Keygen => keygen(),
        Command::ConvertKeepalived {
            file,
            cluster,
            node,
            bind,
            peers,
        } => convert_keepalived(
            file.as_deref(),
            &swimlb_config::keepalived::Options {
                cluster,
                node,
                bind,
                peers,
            },
        ),
        Command::Standalone {
            config,
            log_format,
            log,
        } => standalone(&config, log_format, &log),
        Command::Kubernetes {
            args,
            log_format,
            log,
        } => kubernetes(&args, log_format, &log),
        Command::Status { addr, watch } => status(&addr, watch),
    }
}

fn status(addr: &str, watch: bool) -> ExitCode {
    let socket = match crate::serve::status_table::resolve(addr) {
        Ok(socket) => socket,
        Err(e) => {
            eprintln!("swimlb-speaker status: {e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("swimlb-speaker status: {e}");
            return ExitCode::from(EX_UNAVAILABLE);
        }
    };
    let terminal = std::io::stdout().is_terminal();
    match runtime.block_on(crate::serve::status_table::run(socket, watch, terminal)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("swimlb-speaker status: {e}");
            ExitCode::from(EX_UNAVAILABLE)
        }
    }
}

fn read_config(file: &Path) -> Result<Standalone, ExitCode> {
    let text = std::fs::read_to_string(file).map_err(|e| {
        eprintln!("{}: {e}", file.display());
        ExitCode::from(EX_USAGE)
    })?;
    Standalone::parse(&text).map_err(|errors| {
        for e in &errors.0 {
            eprintln!("{}: {e}", file.display());
        }
        eprintln!("{}: {} error(s)", file.display(), errors.0.len());
        ExitCode::from(EX_USAGE)
    })
}

fn check_config(file: &Path) -> ExitCode {
    let config = match read_config(file) {
        Ok(c) => c,
        Err(code) => return code,
    };
    // What the daemon would refuse at start-up is an error of the check too.
    match crate::sources::config_report::refusals(&config) {
        (problems, Some(timing)) if problems.is_empty() => {
            print!(
                "{}",
                crate::sources::config_report::report(&config, &timing)
            );
            ExitCode::SUCCESS
        }
        (problems, _) => {
            for p in &problems {
                eprintln!("{}: {p}", file.display());
            }
            eprintln!("{}: {} error(s)", file.display(), problems.len());
            ExitCode::from(EX_USAGE)
        }
    }
}

/// sysexits.h: the input data was incorrect (`convert-keepalived` refused it).
pub const EX_DATAERR: u8 = 65;

/// `convert-keepalived`: the file on standard output; warnings, or every refusal, on standard
/// error.
fn convert_keepalived(
    file: Option<&Path>,
    options: &swimlb_config::keepalived::Options,
) -> ExitCode {
    const NAME: &str = "swimlb-speaker convert-keepalived";
    let text = match file {
        Some(path) => std::fs::read_to_string(path),
        None => std::io::read_to_string(std::io::stdin()),
    };
    let text = match text {
        Ok(t) => t,
        Err(e) => {
            let what = file.map_or_else(|| "standard input".into(), |p| p.display().to_string());
            eprintln!("{NAME}: {what}: {e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let disk = swimlb_config::keepalived::Disk;
    match swimlb_config::keepalived::convert(file, &text, &disk, options) {
        Ok(converted) => {
            for w in &converted.warnings {
                eprintln!("warning: {w}");
            }
            print!("{}", converted.yaml);
            ExitCode::SUCCESS
        }
        Err(refusals) => {
            for r in &refusals {
                eprintln!("{r}");
            }
            eprintln!(
                "{NAME}: {} keyword(s) refused, nothing converted",
                refusals.len()
            );
            ExitCode::from(EX_DATAERR)
        }
    }
}

fn keygen() -> ExitCode {
    match new_key_file() {
        Ok(line) => {
            print!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("swimlb-speaker: no system randomness: {e}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing(format: LogFormat, filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colours only on a terminal: escape codes in a log file or journal are noise.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

fn kubernetes(
    args: &crate::sources::kubernetes::cli::Args,
    format: LogFormat,
    filter: &str,
) -> ExitCode {
    init_tracing(format, filter);
    let settings = match args.settings() {
        Ok(s) => s,
        Err(errors) => {
            for e in &errors {
                eprintln!("swimlb-speaker kubernetes: {e}");
            }
            return ExitCode::from(EX_USAGE);
        }
    };
    run_daemon(async {
        let config = kube::Config::infer()
            .await
            .map_err(|e| format!("Kubernetes client: {e}"))?;
        let client =
            swimlb_config::client::client(config).map_err(|e| format!("Kubernetes client: {e}"))?;
        let shutdown = shutdown_signal().map_err(|e| e.to_string())?;
        crate::sources::kubernetes::run::run(settings, client, shutdown)
            .await
            .map_err(|e| e.to_string())
    })
}

/// Resolves on the first SIGTERM or SIGINT.
fn shutdown_signal()
-> std::io::Result<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(Box::pin(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }))
}

/// Runs a daemon on a two-thread runtime until it returns; its error is logged, printed and
/// exits 69 (as does a runtime that cannot be built).
fn run_daemon(daemon: impl std::future::Future<Output = Result<(), String>>) -> ExitCode {
    crate::serve::memory::limit_arenas();
    // One worker: the owner watch and the responders have threads of their own, and a second
    // worker mostly woke to find the first had the work already (a wake-up per datagram).
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("swimlb-speaker: {e}");
            return ExitCode::from(EX_UNAVAILABLE);
        }
    };
    runtime.spawn(crate::serve::memory::trim_every(
        crate::serve::memory::TRIM_PERIOD,
    ));
    match runtime.block_on(daemon) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "speaker stopped");
            eprintln!("swimlb-speaker: {e}");
            ExitCode::from(EX_UNAVAILABLE)
        }
    }
}

fn standalone(file: &Path, format: LogFormat, filter: &str) -> ExitCode {
    init_tracing(format, filter);
    let config = match read_config(file) {
        Ok(c) => c,
        Err(code) => return code,
    };
    run_daemon(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hup = signal(SignalKind::hangup()).map_err(|e| e.to_string())?;
        let (reload_tx, reload_rx) = tokio::sync::mpsc::channel(1);
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                let _ = reload_tx.try_send(());
            }
        });
        let shutdown = shutdown_signal().map_err(|e| e.to_string())?;
        crate::sources::standalone::run(config, file.to_path_buf(), shutdown, reload_rx)
            .await
            .map_err(|e| e.to_string())
    })
}
