//! The command line of `swimlb-controller`, callable as a function so the lab runs the very same
//! entry point (`swimlb-lab controller ...`).
//!
//! `main` stays short (STYLE.md, linkerd2-proxy): parse (exit 64 on a bad flag), set up tracing,
//! build the client, run until SIGTERM or SIGINT (drain, release the lease), exit. Exit 69 when
//! the controller cannot run or loses its lease.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory as _, Parser, Subcommand, ValueEnum};
use prometheus_client::registry::Registry;

use crate::metrics::ControllerMetrics;
use crate::run::{Settings, run, signals};

use swimlb_config::cli::parse_args;
pub use swimlb_config::cli::{EX_UNAVAILABLE, EX_USAGE};

/// sysexits.h: the input data was incorrect (`convert-metallb` refused it).
pub const EX_DATAERR: u8 = 65;

/// The HTTP port when `--listen` names an address alone.
pub const HTTP_PORT: u16 = 7473;

fn listen_address(text: &str) -> Result<SocketAddr, String> {
    swimlb_proto::listener::parse_listen(text, HTTP_PORT)
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Parser, Debug)]
#[command(
    name = "swimlb-controller",
    version,
    about = "swimlb controller: assigns LoadBalancer Service IPs from address pools",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// A kubeconfig file (default: the in-cluster configuration, else $KUBECONFIG or
    /// ~/.kube/config).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Serve only Services with this `spec.loadBalancerClass` (default: Services without one).
    #[arg(long)]
    load_balancer_class: Option<String>,
    /// The configuration namespace: the controller reads IPAddressPools and L2Advertisements
    /// only here, as the speakers do (their `--namespace`); a pool in another namespace gets a
    /// Warning Event (`IgnoredOutsideNamespace`) and is ignored.
    #[arg(long, env = "POD_NAMESPACE", default_value = "swimlb-system")]
    namespace: String,
    /// The namespace of the leader-election Lease.
    #[arg(long, default_value = "swimlb-system")]
    lease_namespace: String,
    /// The name of the leader-election Lease.
    #[arg(long, default_value = "swimlb-controller")]
    lease_name: String,
    /// The Lease duration in seconds.
    #[arg(long, default_value_t = 15)]
    lease_duration: u64,
    /// This replica's identity in the Lease and in Events (default: the hostname).
    #[arg(long)]
    identity: Option<String>,
    /// Where to serve /metrics, /healthz and /readyz: address:port, or an address alone (port
    /// 7473). The manifest gives the Pod's own address (status.podIP).
    #[arg(long, default_value = "0.0.0.0:7473", value_parser = listen_address)]
    listen: SocketAddr,
    /// The speakers' gossip key Secret (in the lease namespace) the leader creates when it is
    /// missing; an empty name turns this off.
    #[arg(long, default_value = "swimlb-gossip-key")]
    gossip_key_secret: String,
    /// Log format.
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Log filter (tracing's EnvFilter syntax), also from RUST_LOG.
    #[arg(long, default_value = "info")]
    log: String,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Reads MetalLB's layer-2 configuration on standard input (`kubectl get -n metallb-system
    /// ipaddresspools.metallb.io,l2advertisements.metallb.io -o json`) and prints swimlb's as a
    /// List for `kubectl apply -f -`; refuses what swimlb would read differently.
    ConvertMetallb {
        /// The namespace of the swimlb objects.
        #[arg(long, default_value = "swimlb-system")]
        namespace: String,
    },
}

/// `convert-metallb`: the List on standard output, what was skipped and every error on standard
/// error.
fn convert_metallb(namespace: &str) -> ExitCode {
    let mut text = String::new();
    if let Err(e) = std::io::Read::read_to_string(&mut std::io::stdin(), &mut text) {
        eprintln!("swimlb-controller convert-metallb: reading standard input: {e}");
        return ExitCode::from(EX_DATAERR);
    }
    let input: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("swimlb-controller convert-metallb: standard input is not JSON: {e}");
            return ExitCode::from(EX_DATAERR);
        }
    };
    match swimlb_config::metallb::convert(&input, namespace) {
        Ok(converted) => {
            for why in &converted.skipped {
                eprintln!("skipped: {why}");
            }
            let out = serde_json::to_string_pretty(&converted.list).unwrap_or_default();
            println!("{out}");
            ExitCode::SUCCESS
        }
        Err(errors) => {
            for e in &errors {
                eprintln!("swimlb-controller convert-metallb: {e}");
            }
            ExitCode::from(EX_DATAERR)
        }
    }
}

fn init_tracing(format: LogFormat, filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "swimlb-controller".into())
}

/// Why the controller could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error("cannot install the signal handlers: {0}")]
    Signals(#[source] std::io::Error),
    #[error("--kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("no in-cluster or default kube configuration: {0}")]
    Infer(#[source] kube::config::InferConfigError),
    #[error("building the API client: {0}")]
    Client(#[source] kube::Error),
    #[error(transparent)]
    Run(#[from] crate::run::RunError),
}

async fn client(kubeconfig: Option<&PathBuf>) -> Result<kube::Client, CliError> {
    let config = match kubeconfig {
        Some(path) => {
            let error = |source| CliError::Kubeconfig {
                path: path.display().to_string(),
                source,
            };
            let file = kube::config::Kubeconfig::read_from(path).map_err(error)?;
            kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .map_err(error)?
        }
        None => kube::Config::infer().await.map_err(CliError::Infer)?,
    };
    swimlb_config::client::client(config).map_err(CliError::Client)
}

/// The command line's definition, for `--help` and the reference page.
pub fn command() -> clap::Command {
    Cli::command()
}

/// The command line of `crdgen`: no argument but `--help` and `--version`.
#[derive(Parser, Debug)]
#[command(
    name = "crdgen",
    version,
    about = "Print the swimlb CustomResourceDefinitions (what deploy/crds.yaml holds) on standard \
             output"
)]
pub struct Crdgen {}

/// `crdgen`'s command line's definition, for the reference page.
pub fn crdgen_command() -> clap::Command {
    Crdgen::command()
}

/// Runs the command line `args` (the program name first) and returns the exit status.
pub fn main_with_args(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let cli: Cli = match parse_args(args) {
        Ok(cli) => cli,
        Err(status) => return status,
    };
    if let Some(Command::ConvertMetallb { namespace }) = &cli.command {
        return convert_metallb(namespace);
    }
    init_tracing(cli.log_format, &cli.log);
    let runtime = match swimlb_config::cli::runtime("swimlb-controller") {
        Ok(rt) => rt,
        Err(status) => return status,
    };
    let settings = Settings {
        load_balancer_class: cli.load_balancer_class.clone(),
        namespace: cli.namespace.clone(),
        lease_namespace: cli.lease_namespace.clone(),
        lease_name: cli.lease_name.clone(),
        identity: cli.identity.clone().unwrap_or_else(hostname),
        lease_duration_seconds: cli.lease_duration,
        listen: cli.listen,
        gossip_key_secret: Some(cli.gossip_key_secret.clone()).filter(|n| !n.is_empty()),
    };
    let result = runtime.block_on(async {
        let shutdown = signals().map_err(CliError::Signals)?;
        let client = client(cli.kubeconfig.as_ref()).await?;
        let mut registry = Registry::default();
        let metrics = ControllerMetrics::register(&mut registry);
        run(client, settings, registry, metrics, shutdown).await?;
        Ok::<(), CliError>(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "controller stopped");
            eprintln!("swimlb-controller: {e}");
            ExitCode::from(EX_UNAVAILABLE)
        }
    }
}
