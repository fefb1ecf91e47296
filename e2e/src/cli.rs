//! `swimlb-lab`'s command line: its definition ([`command`], for the reference page) and what
//! each command runs ([`main_with_args`]; the binary's `main` only calls it).
//!
//! - `demo`: three nodes in network namespaces, the VIP's owner powered off, the timeline.
//! - `failover`: repeated failover trials, swimlb or keepalived (defaults or tuned for speed),
//!   with a JSON report.
//! - `sim`: the deterministic membership simulation (see [`crate::sim`]).
//! - `speaker ...`: the speaker's own command line (`swimlb-speaker ...`), so the lab runs the
//!   real speaker in its namespaces without a second binary.
//! - `controller ...`: the controller's own command line (`swimlb-controller ...`), so tests run
//!   the real controller against the real control plane.
//!
//! The network commands need root (CAP_NET_ADMIN); without it they say so and exit
//! [`EXIT_NEEDS_ROOT`].

use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use crate::sim::{self, SimOptions};
use anyhow::Context;
use clap::{CommandFactory as _, Parser, Subcommand};
use swimlb_config::standalone::GossipSettings;
use swimlb_speaker::gossip::Profile;
use tokio::signal::unix::SignalKind;

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
    /// Three nodes, one VIP: power the owner off and show the failover's timeline.
    Demo(DemoArgs),
    /// Repeated failover trials in network namespaces.
    Failover(FailoverArgs),
    /// Deterministic in-process membership simulation (virtual clock, seeded RNG).
    Sim(Box<SimArgs>),
    /// No fault: count false failovers and measure the speakers at rest (or under a flood).
    Soak(SoakArgs),
    /// Seeded random faults, several at a time, with the invariants checked the whole time.
    Chaos(ChaosArgs),
    /// MetalLB serving Services, replaced by swimlb by the book's "Switching from MetalLB":
    /// Service IPs changed, owners moved, probes lost.
    Migrate(MigrateArgs),
    /// Moves decided by the Kubernetes API (an endpoint moved to another node), on real nodes
    /// (kubelet, containerd, kube-proxy), each measured from the client: dual and dark answers,
    /// and when the new owner alone answered.
    Handover(HandoverArgs),
    /// Failover as a client of a LoadBalancer Service sees it, on real nodes (kubelet,
    /// containerd, kube-proxy): new connections and long-lived ones, Local and Cluster.
    ServiceFailover(crate::service_failover::Args),
    /// Run the speaker (same arguments as `swimlb-speaker`).
    Speaker,
    /// Run the controller (same arguments as `swimlb-controller`).
    Controller,
}

#[derive(Debug, clap::Args)]
struct DemoArgs {
    /// On real nodes: the real control plane, a real kubelet, containerd and kube-proxy in each
    /// node's namespace, swimlb from deploy/swimlb.yaml; the timeline adds the moment the
    /// ServiceL2Status record named the new owner.
    #[arg(long)]
    kubernetes: bool,
    /// With --kubernetes: swimlb, or metallb (MetalLB from its own images and manifest, on the
    /// same real nodes).
    #[arg(long = "impl", default_value = "swimlb")]
    implementation: String,
}

#[derive(Debug, clap::Args)]
struct SoakArgs {
    /// Which load balancer: swimlb, keepalived, keepalived-fast, swimlb-kubernetes or metallb
    /// (both on real nodes: a real kubelet, containerd and kube-proxy per node, MetalLB from its
    /// own images and manifest); a comma list runs each in turn, each in a fresh lab.
    #[arg(long = "impl", value_delimiter = ',', default_value = "swimlb")]
    implementation: Vec<String>,
    /// Nodes in the lab.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Random loss on every node link, percent.
    #[arg(long, default_value_t = 0)]
    loss: u8,
    /// Seconds to watch.
    #[arg(long, default_value_t = 120)]
    duration: u64,
    /// Non-ARP frames per second sent at node1.
    #[arg(long, default_value_t = 0)]
    flood_pps: u64,
    /// Also report each daemon's threads: CPU, wake-ups per second, read and write syscalls per
    /// second and (swimlb) datagrams per second.
    #[arg(long)]
    threads: bool,
    /// Write the report as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct MigrateArgs {
    /// What swimlb replaces: `metallb` (on real nodes) or `keepalived-fast` (three
    /// keepalived routers, VRRPv3 and `advert_int 0.1`, switched node by node).
    #[arg(long, default_value = "metallb", value_parser = ["metallb", "keepalived-fast"])]
    from: String,
    /// With `--from keepalived-fast`: crashes of the owner at each mixed state.
    #[arg(long, default_value_t = 5)]
    trials: usize,
    /// Nodes in the lab.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Services of type LoadBalancer (1 to 4: the lab's pool is a /30).
    #[arg(long, default_value_t = 4)]
    services: usize,
    /// Write the report as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct HandoverArgs {
    /// Nodes in the lab.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Moves to measure.
    #[arg(long, default_value_t = 20)]
    trials: usize,
    /// Busy loops (`while :; do :; done`) on the machine throughout.
    #[arg(long, default_value_t = 0)]
    busy: usize,
    /// Starve one node's speaker throughout: `NODE:PERCENT` (`2:10`: node2's speaker container's
    /// cgroup gets 10 % of a core, with a busy loop in it).
    #[arg(long, value_parser = parse_starve)]
    starve: Option<(usize, u8)>,
    /// Cut one node from the API server at every move: `NODE:MS` (`2:1000`: node2's traffic
    /// with the API server, its kubelet's and kube-proxy's too, is dropped from just before the
    /// patch to 1,000 ms after it), so its watch sees the move late.
    #[arg(long, value_parser = parse_api_lag)]
    api_lag: Option<(usize, std::time::Duration)>,
    /// Write the report as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

fn parse_api_lag(s: &str) -> Result<(usize, std::time::Duration), String> {
    let (node, ms) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: expected NODE:MS"))?;
    let node = node.parse().map_err(|e| format!("node {node:?}: {e}"))?;
    let ms: u64 = ms.parse().map_err(|e| format!("ms {ms:?}: {e}"))?;
    if !(1..=2500).contains(&ms) {
        return Err(format!("{ms} ms: 1 to 2,500"));
    }
    Ok((node, std::time::Duration::from_millis(ms)))
}

fn parse_starve(s: &str) -> Result<(usize, u8), String> {
    let (node, percent) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: expected NODE:PERCENT"))?;
    let node = node.parse().map_err(|e| format!("node {node:?}: {e}"))?;
    let percent: u8 = percent
        .parse()
        .map_err(|e| format!("percent {percent:?}: {e}"))?;
    if !(1..=100).contains(&percent) {
        return Err(format!("percent {percent}: 1 to 100"));
    }
    Ok((node, percent))
}

#[derive(Debug, clap::Args)]
struct ChaosArgs {
    /// Seconds of faults (the run ends with a calm tail inside them).
    #[arg(long, default_value_t = 300)]
    duration: u64,
    /// Seed of the fault schedule: the same seed, duration, nodes and implementation give the
    /// same schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Nodes in the lab (3 to 5).
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Which load balancer: swimlb, swimlb-kubernetes or metallb (on the real control plane,
    /// with its faults) or keepalived-fast.
    #[arg(long = "impl", default_value = "swimlb")]
    implementation: String,
    /// Write the report as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Stop at the first violation and print the seed and the faults that led to it.
    #[arg(long)]
    until_violation: bool,
}

#[derive(Debug, clap::Args)]
struct FailoverArgs {
    /// Which load balancer: swimlb, keepalived (Debian's defaults), keepalived-fast (VRRPv3,
    /// advert_int 0.1), swimlb-kubernetes (`deploy/swimlb.yaml` on real nodes: the real control
    /// plane, a real kubelet, containerd and kube-proxy per node) or metallb (MetalLB's own images
    /// and manifest on the same kind of real nodes); a comma list (`swimlb,keepalived,keepalived-fast`) runs each in turn,
    /// each in a fresh lab, and prints them side by side.
    #[arg(long = "impl", value_delimiter = ',', default_value = "swimlb")]
    implementation: Vec<String>,
    /// The fault: poweroff (the owner's link goes down), kill (SIGKILL to the owner's daemon),
    /// sigterm (a graceful stop), pause (SIGSTOP to the owner's daemon for 2 s, then SIGCONT)
    /// or pause-backup (the same to a node that does not own the VIP: nothing may move).
    #[arg(long, default_value = "poweroff")]
    scenario: String,
    /// Nodes in the lab.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Failovers to measure.
    #[arg(long, default_value_t = 20)]
    trials: usize,
    /// Random loss on every node link, percent.
    #[arg(long, default_value_t = 0)]
    loss: u8,
    /// swimlb-kubernetes: the API server is unreachable from right before every fault until
    /// the failover was measured.
    #[arg(long)]
    api_down: bool,
    /// A flood from the client during every trial: `arp PPS` (broadcast ARP requests for the
    /// VIP), `gossip PPS` (forged datagrams at every gossip port), `claims PPS` (forged ARP and
    /// NDP claims for the VIP from another MAC) or `slow-http N` (N slow HTTP connections held at
    /// each node, a /status scraper beside them; per-node figures printed at the end); the
    /// report adds each daemon's CPU.
    #[arg(long, num_args = 2, value_names = ["KIND", "PPS"])]
    flood: Option<Vec<String>>,
    /// Write the report as JSON (an object for one implementation, an array for several).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
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
    #[arg(long, default_value_t = 60.0, value_name = "SECONDS")]
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
    /// Override: period of the announces to members held down (heals partitions), in
    /// milliseconds.
    #[arg(long)]
    announce_down_ms: Option<u64>,
    /// Override: members held down announced to per period.
    #[arg(long)]
    announce_down_fanout: Option<usize>,
    /// Override: period of the membership digest exchange in milliseconds (0 turns it off).
    #[arg(long)]
    sync_ms: Option<u64>,
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
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// After the crashes, cut every third member off for this many seconds, heal, and report how
    /// long the heal took and whether any member went down after it.
    #[arg(long)]
    partition: Option<f64>,
    /// After the crashes, make one member handle its datagrams and timers this many
    /// milliseconds late, 10 s at a time (three times); report the other members' false downs
    /// and how long the slow member took to recover.
    #[arg(long)]
    slow: Option<u64>,
    /// After the crashes, stop one member entirely for this many milliseconds, then resume it
    /// (three times); report as for --slow.
    #[arg(long)]
    pause: Option<u64>,
    /// Lifeguard (local health and suspicion that shrinks with confirmations): true (default)
    /// or false, to compare with plain SWIM.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    lifeguard: bool,
    /// The owner watch beside the gossip: true (default) or false, for the gossip
    /// alone.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    watch: bool,
    /// IPs each member owns, for the owner watch's successors.
    #[arg(long, default_value_t = 10)]
    ips_per_member: usize,
    /// Count the gossip's datagrams by kind after the warm-up (probes, acknowledgements,
    /// indirect probes, periodic gossip, announces, metadata, digests...) and print them under
    /// the row: each datagram is opened again, so the run is slower.
    #[arg(long)]
    kinds: bool,
    /// Exit 1 unless in every run every member saw every member after the warm-up, crashes were
    /// measured, every crash was seen by every survivor within the cap, and no member was
    /// falsely declared down (correctness only, never a time).
    #[arg(long)]
    check: bool,
}

/// sysexits-style "skipped": the lab needs root.
pub const EXIT_NEEDS_ROOT: u8 = 77;
/// The exit status of a run interrupted by Ctrl-C or SIGTERM (after the lab is torn down), as a
/// shell reports a SIGINT.
pub const EXIT_INTERRUPTED: i32 = 130;

/// The command line's definition, for `--help` and the reference page. `speaker` and
/// `controller` take the other programs' command lines ([`swimlb_speaker::cli::command`],
/// [`swimlb_controller::cli::command`]).
pub fn command() -> clap::Command {
    Cli::command()
}

/// Runs the command line `args` (the program name first) and returns the exit status.
pub fn main_with_args(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> std::process::ExitCode {
    let args: Vec<std::ffi::OsString> = args.into_iter().collect();
    if args.get(1).is_some_and(|a| a == "speaker") {
        let mut speaker_args = vec![std::ffi::OsString::from("swimlb-speaker")];
        speaker_args.extend(args.into_iter().skip(2));
        return swimlb_speaker::cli::main_with_args(speaker_args);
    }
    if args.get(1).is_some_and(|a| a == "controller") {
        let mut controller_args = vec![std::ffi::OsString::from("swimlb-controller")];
        controller_args.extend(args.into_iter().skip(2));
        return swimlb_controller::cli::main_with_args(controller_args);
    }
    let cli = Cli::parse_from(args);
    let needs_root = matches!(
        cli.command,
        Command::Demo(_)
            | Command::Failover(_)
            | Command::Soak(_)
            | Command::Chaos(_)
            | Command::Migrate(_)
            | Command::Handover(_)
            | Command::ServiceFailover(_)
    );
    if needs_root && !crate::netns::is_root() {
        eprintln!(
            "swimlb-lab: this command builds network namespaces and needs root (CAP_NET_ADMIN); run it with sudo"
        );
        return std::process::ExitCode::from(EXIT_NEEDS_ROOT);
    }
    let result = match cli.command {
        Command::Demo(args) => run_demo(args),
        Command::Failover(args) => run_failover(args),
        Command::Sim(args) => run_sim(*args),
        Command::Soak(args) => run_soak(args),
        Command::Chaos(args) => run_chaos(args),
        Command::Migrate(args) => run_migrate(args),
        Command::Handover(args) => run_handover(args),
        Command::ServiceFailover(args) => args.run(),
        Command::Speaker | Command::Controller => unreachable!("handled before parsing"),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("swimlb-lab: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Tears the lab down on Ctrl-C or SIGTERM: the namespaces are deleted by the next run's cleanup
/// too, but a user who interrupts a run expects a clean machine at once.
fn cleanup_on_interrupt() {
    std::thread::spawn(|| {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        let Ok(mut term) =
            rt.block_on(async { tokio::signal::unix::signal(SignalKind::terminate()) })
        else {
            return;
        };
        rt.block_on(async {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        });
        eprintln!("swimlb-lab: interrupted, tearing the lab down");
        let _ = crate::netns::cleanup_runs_of(std::process::id());
        std::process::exit(EXIT_INTERRUPTED);
    });
}

fn run_demo(args: DemoArgs) -> anyhow::Result<()> {
    cleanup_on_interrupt();
    if args.kubernetes {
        ensure_packages(&[("ip", "iproute2"), ("nft", "nftables")])?;
    } else {
        ensure_packages(&[("ip", "iproute2")])?;
    }
    let program = speaker_program()?;
    use crate::demo::DemoLab;
    let which = match (args.implementation.as_str(), args.kubernetes) {
        ("swimlb", false) => DemoLab::Standalone,
        ("swimlb", true) => DemoLab::Kubernetes,
        ("metallb", true) => DemoLab::Metallb,
        (other, _) => {
            anyhow::bail!("--impl {other}: expected swimlb, or metallb with --kubernetes")
        }
    };
    match crate::demo::run(program, which, &mut |line| println!("{line}"))? {
        Some(_) => Ok(()),
        None => anyhow::bail!("the VIP did not fail over"),
    }
}

fn run_migrate(args: MigrateArgs) -> anyhow::Result<()> {
    cleanup_on_interrupt();
    ensure_packages(&[("ip", "iproute2"), ("nft", "nftables")])?;
    if args.from == "keepalived-fast" {
        ensure_packages(&[("keepalived", "keepalived")])?;
        let options = crate::migrate::keepalived::Options {
            trials: args.trials,
        };
        let report = crate::migrate::keepalived::run(speaker_program()?, &options, &mut |line| {
            println!("{line}")
        })?;
        print!("{}", report.table());
        if let Some(path) = &args.json {
            std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")?;
        }
        return Ok(());
    }
    let options = crate::migrate::Options {
        nodes: args.nodes,
        services: args.services,
    };
    let report = crate::migrate::run(speaker_program()?, &options, &mut |line| println!("{line}"))?;
    print!("{}", report.table());
    if let Some(path) = &args.json {
        write_reports(path, std::slice::from_ref(&report))?;
    }
    Ok(())
}

fn run_handover(args: HandoverArgs) -> anyhow::Result<()> {
    cleanup_on_interrupt();
    ensure_packages(&[("ip", "iproute2"), ("nft", "nftables")])?;
    let options = crate::handover::Options {
        nodes: args.nodes,
        trials: args.trials,
        busy: args.busy,
        starve: args.starve,
        api_lag: args.api_lag,
    };
    let report = crate::handover::run(&options, &mut |line| println!("{line}"))?;
    print!("{}", report.table());
    if let Some(path) = &args.json {
        write_reports(path, std::slice::from_ref(&report))?;
    }
    Ok(())
}

fn run_soak(args: SoakArgs) -> anyhow::Result<()> {
    cleanup_on_interrupt();
    let implementations = parse_implementations(&args.implementation)?;
    ensure_packages(&[("ip", "iproute2"), ("nft", "nftables")])?;
    ensure_keepalived(&implementations)?;
    let program = speaker_program()?;
    let mut reports = Vec::new();
    for &implementation in &implementations {
        let options = crate::soak::Options {
            implementation,
            nodes: args.nodes,
            loss: args.loss,
            duration: Duration::from_secs(args.duration),
            flood_pps: args.flood_pps,
            threads: args.threads,
        };
        let make = |lab: &mut crate::netns::Lab| make_daemons(implementation, &program, lab);
        let report = crate::soak::run(&options, &make, &mut |line| println!("{line}"))?;
        print!("{}", report.table());
        reports.push(report);
    }
    if let Some(path) = &args.json {
        write_reports(path, &reports)?;
    }
    Ok(())
}

fn run_chaos(args: ChaosArgs) -> anyhow::Result<()> {
    use crate::chaos::{self, schedule::Target};
    use crate::failover::Implementation;
    cleanup_on_interrupt();
    let implementation = parse_implementations(std::slice::from_ref(&args.implementation))?[0];
    let target = match implementation {
        Implementation::Swimlb => Target::Swimlb,
        Implementation::KeepalivedFast => Target::KeepalivedFast,
        Implementation::SwimlbKubernetes => Target::SwimlbKubernetes,
        Implementation::Metallb => Target::Metallb,
        other => anyhow::bail!(
            "--impl {}: chaos runs swimlb, swimlb-kubernetes, metallb or keepalived-fast",
            other.as_str()
        ),
    };
    anyhow::ensure!(
        (3..=5).contains(&args.nodes),
        "--nodes must be 3 to 5, not {}",
        args.nodes
    );
    ensure_packages(&[("ip", "iproute2"), ("nft", "nftables")])?;
    ensure_keepalived(&[implementation])?;
    let options = chaos::Options {
        target,
        duration: Duration::from_secs(args.duration),
        seed: args.seed,
        nodes: args.nodes,
        until_violation: args.until_violation,
        scheduled: true,
        injected: Vec::new(),
        program: speaker_program()?,
    };
    let report = chaos::run(&options, &mut |line| println!("{line}"))?;
    print!("{}", report.text());
    if let Some(path) = &args.json {
        write_reports(path, std::slice::from_ref(&report))?;
    }
    if args.until_violation
        && let Some(first) = report.first_violation()
    {
        println!("{first}");
    }
    anyhow::ensure!(
        report.counted() == 0,
        "{} violations (seed {})",
        report.counted(),
        args.seed
    );
    Ok(())
}

/// The implementations named by `--impl` (a comma list).
fn parse_implementations(names: &[String]) -> anyhow::Result<Vec<crate::failover::Implementation>> {
    names
        .iter()
        .map(|name| {
            crate::failover::Implementation::parse(name).with_context(|| {
                format!(
                    "--impl {name}: expected swimlb, keepalived, keepalived-fast, swimlb-kubernetes or metallb"
                )
            })
        })
        .collect()
}

/// Installs keepalived when one of `implementations` is keepalived.
fn ensure_keepalived(implementations: &[crate::failover::Implementation]) -> anyhow::Result<()> {
    use crate::failover::Implementation;
    if implementations.iter().any(|i| {
        matches!(
            i,
            Implementation::Keepalived | Implementation::KeepalivedFast
        )
    }) {
        ensure_packages(&[("keepalived", "keepalived")])?;
    }
    Ok(())
}

/// The daemons of `implementation` in `lab` (`program`: the lab binary, for the speakers).
fn make_daemons(
    implementation: crate::failover::Implementation,
    program: &std::path::Path,
    lab: &mut crate::netns::Lab,
) -> anyhow::Result<Box<dyn crate::failover::Daemons>> {
    use crate::failover::{Implementation, KeepalivedDaemons, SwimlbDaemons};
    use crate::keepalived::Tuning;
    Ok(match implementation {
        Implementation::Swimlb => Box::new(SwimlbDaemons::new(lab, program.to_path_buf())?),
        Implementation::Keepalived => Box::new(KeepalivedDaemons::new(lab, Tuning::Defaults)),
        Implementation::KeepalivedFast => Box::new(KeepalivedDaemons::new(lab, Tuning::Fast)),
        // On real nodes: kubelet, containerd and kube-proxy in each node namespace.
        Implementation::SwimlbKubernetes | Implementation::Metallb => Box::new(
            crate::realnode::daemons::RealDaemons::start(lab, implementation, &mut |line| {
                println!("{line}")
            })?,
        ),
    })
}

/// Installs the Debian packages whose programs are missing (the lab runs as root).
fn ensure_packages(needed: &[(&str, &str)]) -> anyhow::Result<()> {
    let missing: Vec<&str> = needed
        .iter()
        .filter(|(program, _)| which(program).is_none())
        .map(|(_, p)| *p)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    println!("installing {} (apt-get)", missing.join(" "));
    let update = std::process::Command::new("apt-get")
        .args(["update", "-qq"])
        .status()?;
    anyhow::ensure!(update.success(), "apt-get update failed");
    let install = std::process::Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()?;
    anyhow::ensure!(
        install.success(),
        "apt-get install {} failed",
        missing.join(" ")
    );
    Ok(())
}

fn run_failover(args: FailoverArgs) -> anyhow::Result<()> {
    use crate::failover::{self, Implementation, Options, Scenario};
    cleanup_on_interrupt();
    let implementations = parse_implementations(&args.implementation)?;
    let scenario = parse_scenario(&args.scenario)?;
    let flood = parse_flood(args.flood.as_deref())?;
    let pause = matches!(scenario, Scenario::Pause | Scenario::PauseBackup);
    anyhow::ensure!(
        !pause
            || implementations
                .iter()
                .all(|i| matches!(i, Implementation::Swimlb | Implementation::SwimlbKubernetes)),
        "--scenario {}: swimlb and swimlb-kubernetes only (keepalived runs as several processes)",
        args.scenario
    );
    anyhow::ensure!(args.trials > 0, "--trials must be at least 1");
    ensure_packages(&[("ip", "iproute2"), ("nft", "nftables")])?;
    anyhow::ensure!(
        !args.api_down
            || implementations
                .iter()
                .all(|i| *i == Implementation::SwimlbKubernetes),
        "--api-down applies to --impl swimlb-kubernetes only"
    );
    ensure_keepalived(&implementations)?;
    let program = speaker_program()?;
    let mut reports = Vec::new();
    let mut pause_reports = Vec::new();
    for &implementation in &implementations {
        let options = Options {
            implementation,
            scenario,
            nodes: args.nodes,
            trials: args.trials,
            loss: args.loss,
            probe_interval: Duration::from_millis(10),
            api_down: args.api_down,
            flood,
        };
        let make = |lab: &mut crate::netns::Lab| make_daemons(implementation, &program, lab);
        if pause {
            let report = crate::pause::run(&options, &make, &mut |line| println!("{line}"))?;
            pause_reports.push(report);
            continue;
        }
        reports.push(failover::run(&options, &make, &mut |line| {
            println!("{line}")
        })?);
    }
    if pause {
        for report in &pause_reports {
            println!("{}", report.table());
        }
        if let Some(path) = &args.json {
            write_reports(path, &pause_reports)?;
        }
        return Ok(());
    }
    for report in &reports {
        println!("{}", report.table());
    }
    print_ratios(&reports);
    if let Some(path) = &args.json {
        write_reports(path, &reports)?;
    }
    Ok(())
}

/// `--scenario NAME`.
fn parse_scenario(name: &str) -> anyhow::Result<crate::failover::Scenario> {
    use crate::failover::Scenario;
    Ok(match name {
        "poweroff" => Scenario::Poweroff,
        "kill" => Scenario::Kill,
        "sigterm" => Scenario::Sigterm,
        "pause" => Scenario::Pause,
        "pause-backup" => Scenario::PauseBackup,
        other => anyhow::bail!(
            "--scenario {other}: expected poweroff, kill, sigterm, pause or pause-backup"
        ),
    })
}

/// `--flood KIND PPS`, if given.
fn parse_flood(flood: Option<&[String]>) -> anyhow::Result<Option<(crate::flood::FloodKind, u64)>> {
    Ok(match flood {
        None => None,
        Some([kind, pps]) => Some((
            crate::flood::FloodKind::parse(kind).with_context(|| {
                let names: Vec<&str> = crate::flood::FloodKind::CHOICES
                    .iter()
                    .map(|k| k.as_str())
                    .collect();
                format!("--flood {kind}: expected one of {}", names.join(", "))
            })?,
            pps.parse::<u64>()
                .ok()
                .filter(|p| *p > 0)
                .with_context(|| format!("--flood {kind} {pps}: a rate above 0"))?,
        )),
        Some(other) => anyhow::bail!("--flood takes KIND PPS, not {other:?}"),
    })
}

/// How many times swimlb's p50 each keepalived's is, when both ran.
fn print_ratios(reports: &[crate::failover::Report]) {
    let p50 = |name: &str| {
        reports
            .iter()
            .find(|r| r.run.implementation == name && !r.samples.is_empty())
            .map(|r| r.failover_ms.p50)
    };
    for peer in ["keepalived", "keepalived-fast"] {
        if let (Some(swimlb), Some(theirs)) = (p50("swimlb"), p50(peer))
            && swimlb > 0.0
        {
            println!(
                "{peer}'s p50 is {:.1}x swimlb's in this run",
                theirs / swimlb
            );
        }
    }
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_string_lossy()
        .split(':')
        .map(|d| PathBuf::from(d).join(program))
        .find(|p| p.exists())
}

/// The sim's flags as the standalone file's `gossip` section, so both go through one
/// conversion (the speaker's).
fn sim_gossip(args: &SimArgs, profile: Profile) -> anyhow::Result<GossipSettings> {
    let ms = |v: Option<u64>| v.map(Duration::from_millis);
    let count = |flag: &str, v: Option<usize>| -> anyhow::Result<Option<NonZeroU32>> {
        v.map(|n| {
            u32::try_from(n)
                .ok()
                .and_then(NonZeroU32::new)
                .with_context(|| format!("--{flag} must be at least 1, not {n}"))
        })
        .transpose()
    };
    Ok(GossipSettings {
        profile,
        probe_period: ms(args.probe_ms),
        probe_rtt: ms(args.rtt_ms),
        suspect_to_down: ms(args.suspect_ms),
        periodic_gossip: ms(args.gossip_ms),
        gossip_fanout: count("gossip-fanout", args.gossip_fanout)?,
        indirect_probes: count("indirect", args.indirect)?,
        max_transmissions: count("max-tx", args.max_tx.map(usize::from))?,
        scale_suspicion: args.scale_suspicion,
        scale_transmissions: args.scale_transmissions,
        notify_suspects: args.no_notify_suspects.then_some(false),
        notify_down_members: args.notify_down,
        announce_down_period: ms(args.announce_down_ms),
        announce_down_fanout: count("announce-down-fanout", args.announce_down_fanout)?,
        sync_period: ms(args.sync_ms),
        ..GossipSettings::default()
    })
}

/// Writes `reports` as JSON: an object for one, an array for several.
fn write_reports<T: serde::Serialize>(path: &std::path::Path, reports: &[T]) -> anyhow::Result<()> {
    let text = match reports {
        [one] => serde_json::to_string_pretty(one)?,
        all => serde_json::to_string_pretty(all)?,
    };
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

/// The partition's and the stalls' lines under a run's table row.
fn print_phases(report: &sim::SimReport) {
    if !report.gossip_kinds.is_empty() {
        let kinds: Vec<String> = report
            .gossip_kinds
            .iter()
            .map(|(kind, rate)| format!("{kind} {rate:.1}"))
            .collect();
        println!(
            "        gossip datagrams/s per member by kind: {}",
            kinds.join(", ")
        );
    }
    if let Some(p) = &report.partition {
        println!(
            "        partition: {} of {} members cut off for {:.1} s; healed {} in {:.0} ms; downs after the heal: {} on the larger side, {} on the cut-off side; watch takeovers of running members {}",
            p.cut_off,
            report.nodes,
            p.cut_s,
            p.healed,
            p.heal_ms,
            p.downs_after_heal,
            p.cut_off_downs_after_heal,
            p.takeovers
        );
    }
    for (what, stall) in [("slow", &report.slow), ("pause", &report.pause)] {
        if let Some(st) = stall {
            println!(
                "        {what} {:.0} ms: member {} stalled {} times for {:.0} ms; false downs of others {}, downs of it {}; recovered p50 {:.0} ms, max {:.0} ms ({} not within 10 s); its highest local health {}; watch takeovers of it {}",
                st.stall_ms,
                st.member,
                st.stalls,
                st.window_ms,
                st.false_downs_of_others,
                st.downs_of_stalled,
                st.recover_ms.p50,
                st.recover_ms.max,
                st.unrecovered,
                st.max_health,
                st.stalled_takeovers
            );
        }
    }
}

fn run_sim(args: SimArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.duration.is_finite() && args.duration > 0.0,
        "--duration must be a positive number of seconds"
    );
    let mut reports = Vec::new();
    println!("{}", sim::table_header());
    for profile in &args.profile {
        let profile = swimlb_speaker::gossip::timing::parse_profile(profile)?;
        for &nodes in &args.nodes {
            for &loss in &args.loss {
                let mut timing =
                    swimlb_speaker::gossip::Timing::from_settings(&sim_gossip(&args, profile)?)?;
                if !args.lifeguard {
                    timing.health_max = 1;
                    timing.suspicion_max_mult = 1;
                    timing.suspicion_inquiries = 0;
                }
                let opts = SimOptions {
                    nodes,
                    loss_pct: loss,
                    duration: Duration::from_secs_f64(args.duration),
                    profile,
                    timing,
                    seed: args.seed,
                    partition: args.partition.map(Duration::from_secs_f64),
                    slow: args.slow.map(Duration::from_millis),
                    pause: args.pause.map(Duration::from_millis),
                    watch: args.watch.then(|| sim::WatchOptions {
                        ips_per_member: args.ips_per_member,
                        ..sim::WatchOptions::default()
                    }),
                    kinds: args.kinds,
                };
                let started = tokio::time::Instant::now();
                let report = sim::run(&opts)?;
                println!("{}", sim::table_row(&report, started.elapsed()));
                print_phases(&report);
                reports.push(report);
            }
        }
    }
    if let Some(path) = &args.json {
        write_reports(path, &reports)?;
    }
    if args.check {
        let bad: Vec<String> = reports
            .iter()
            .filter(|r| {
                !r.converged
                    || r.crashes == 0
                    || r.undetected > 0
                    || r.false_downs > 0
                    || r.refuted_takeovers > 0
                    || r.watch_undetected > 0
                    || r
                        .partition
                        .as_ref()
                        .is_some_and(|p| !p.healed || p.downs_after_heal > 0)
                    || [&r.slow, &r.pause]
                        .into_iter()
                        .flatten()
                        .any(|st| st.false_downs_of_others > 0)
            })
            .map(|r| {
                format!(
                    "{} nodes, {}% loss, {}: views converged {}, {} crashes, {} undetected, {} false downs, watch: {} refuted takeovers, {} crashes it missed, partition {:?}, slow {:?}, pause {:?}",
                    r.nodes,
                    r.loss,
                    r.profile,
                    r.converged,
                    r.crashes,
                    r.undetected,
                    r.false_downs,
                    r.refuted_takeovers,
                    r.watch_undetected,
                    r.partition,
                    r.slow,
                    r.pause
                )
            })
            .collect();
        anyhow::ensure!(bad.is_empty(), "sim --check failed: {}", bad.join("; "));
    }
    Ok(())
}

/// The program the lab runs its speakers with (`PROGRAM speaker standalone ...`): this binary,
/// or the one named by `SWIMLB_LAB_SPEAKER_PROGRAM`, so one lab can measure two builds of the
/// speaker side by side.
fn speaker_program() -> std::io::Result<std::path::PathBuf> {
    match std::env::var_os("SWIMLB_LAB_SPEAKER_PROGRAM") {
        Some(path) => Ok(path.into()),
        None => std::env::current_exe(),
    }
}
