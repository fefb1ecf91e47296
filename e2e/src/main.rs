//! `swimlb-lab`: the swimlb lab. For now one command, `sim`: the deterministic membership
//! simulation (see `swimlb_e2e::sim`). The network-namespace commands (`demo`, `failover`) arrive
//! with the standalone speaker.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use swimlb_e2e::sim::{self, SimOptions};
use swimlb_speaker::gossip::Profile;

#[derive(Debug, Parser)]
#[command(
    name = "swimlb-lab",
    version,
    about = "swimlb lab: simulations and benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Deterministic in-process membership simulation (virtual clock, seeded RNG).
    Sim(SimArgs),
}

#[derive(Debug, clap::Args)]
struct SimArgs {
    /// Cluster sizes (comma-separated runs several).
    #[arg(long, value_delimiter = ',', default_value = "10")]
    nodes: Vec<usize>,
    /// Uniform datagram loss in percent (comma-separated runs several).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    loss: Vec<f64>,
    /// Simulated seconds per run, warm-up included.
    #[arg(long, default_value_t = 60.0)]
    duration: f64,
    /// Timing profile: fast or lan (comma-separated runs several).
    #[arg(long, value_delimiter = ',', default_value = "fast")]
    profile: Vec<String>,
    /// RNG seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Override: probe period in milliseconds.
    #[arg(long)]
    probe_ms: Option<u64>,
    /// Override: probe rtt in milliseconds.
    #[arg(long)]
    rtt_ms: Option<u64>,
    /// Override: suspicion timeout in milliseconds.
    #[arg(long)]
    suspect_ms: Option<u64>,
    /// Override: periodic gossip period in milliseconds.
    #[arg(long)]
    gossip_ms: Option<u64>,
    /// Override: periodic gossip fan-out.
    #[arg(long)]
    gossip_fanout: Option<usize>,
    /// Override: indirect probes.
    #[arg(long)]
    indirect: Option<usize>,
    /// Override: max transmissions per update.
    #[arg(long)]
    max_tx: Option<u8>,
    /// Override: do not tell a suspect at once after a failed probe.
    #[arg(long)]
    no_notify_suspects: bool,
    /// Override: scale the suspicion timeout with the member count (true or false).
    #[arg(long)]
    scale_suspicion: Option<bool>,
    /// Override: raise transmissions with the member count (true or false).
    #[arg(long)]
    scale_transmissions: Option<bool>,
    /// Override: foca's notify_down_members (true or false).
    #[arg(long)]
    notify_down: Option<bool>,
    /// Write the report as JSON (an object for one run, an array for several).
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Sim(args) => run_sim(args),
    }
}

fn run_sim(args: SimArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.duration.is_finite() && args.duration > 0.0,
        "--duration must be a positive number of seconds"
    );
    let ms = Duration::from_millis;
    let mut reports = Vec::new();
    println!("{}", sim::table_header());
    for profile in &args.profile {
        let profile = Profile::parse(profile)?;
        for &nodes in &args.nodes {
            for &loss in &args.loss {
                let mut timing = profile.timing();
                if let Some(v) = args.probe_ms {
                    timing.probe_period = ms(v);
                }
                if let Some(v) = args.rtt_ms {
                    timing.probe_rtt = ms(v);
                }
                if let Some(v) = args.suspect_ms {
                    timing.suspect_to_down_after = ms(v);
                }
                if let Some(v) = args.gossip_ms {
                    timing.gossip_period = ms(v);
                }
                if let Some(v) = args.gossip_fanout {
                    timing.gossip_fanout = v;
                }
                if let Some(v) = args.indirect {
                    timing.indirect_probes = v;
                }
                if let Some(v) = args.max_tx {
                    timing.max_transmissions = v;
                }
                if args.no_notify_suspects {
                    timing.notify_suspects = false;
                }
                if let Some(v) = args.notify_down {
                    timing.notify_down_members = v;
                }
                if let Some(v) = args.scale_suspicion {
                    timing.scale_suspicion = v;
                }
                if let Some(v) = args.scale_transmissions {
                    timing.scale_transmissions = v;
                }
                let opts = SimOptions {
                    nodes,
                    loss_pct: loss,
                    duration: Duration::from_secs_f64(args.duration),
                    profile,
                    timing,
                    seed: args.seed,
                };
                let started = tokio::time::Instant::now();
                let report = sim::run(&opts)?;
                println!("{}", sim::table_row(&report, started.elapsed()));
                reports.push(report);
            }
        }
    }
    if let Some(path) = args.json {
        let text = if reports.len() == 1 {
            serde_json::to_string_pretty(&reports[0])?
        } else {
            serde_json::to_string_pretty(&reports)?
        };
        std::fs::write(&path, text + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
