//! `swimlb-speaker`: the per-node daemon.
//!
//! Today it validates standalone files (`check-config`) and makes gossip keys (`keygen`); the run
//! modes arrive with the gossip, election and standalone issues, and `run` says so.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use swimlb_config::keyfile::{encode_key, parse_key_file};
use swimlb_config::standalone::Standalone;

/// sysexits.h: the configuration is invalid.
const EX_CONFIG: u8 = 64;
/// sysexits.h: the service is unavailable.
const EX_UNAVAILABLE: u8 = 69;

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
    /// Run the speaker (not built yet).
    Run,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { file } => check_config(&file),
        Command::Keygen => keygen(),
        Command::Run => {
            eprintln!(
                "swimlb-speaker: the run modes are not built yet (gossip, election and standalone mode are in progress)"
            );
            ExitCode::from(EX_UNAVAILABLE)
        }
    }
}

fn check_config(file: &std::path::Path) -> ExitCode {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            return ExitCode::from(EX_CONFIG);
        }
    };
    let config = match Standalone::parse(&text) {
        Ok(c) => c,
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("{}: {e}", file.display());
            }
            eprintln!("{}: {} error(s)", file.display(), errors.0.len());
            return ExitCode::from(EX_CONFIG);
        }
    };
    if let Some(key_file) = &config.key_file {
        let problems: Vec<String> = match std::fs::read_to_string(key_file) {
            Ok(text) => parse_key_file(&text)
                .err()
                .unwrap_or_default()
                .iter()
                .map(ToString::to_string)
                .collect(),
            Err(e) => vec![e.to_string()],
        };
        if !problems.is_empty() {
            for p in &problems {
                eprintln!("{}: keyFile {}: {p}", file.display(), key_file.display());
            }
            return ExitCode::from(EX_CONFIG);
        }
    }
    print!("{}", swimlb_speaker::config_report::report(&config));
    ExitCode::SUCCESS
}

fn keygen() -> ExitCode {
    let mut key = [0u8; 32];
    if random_fill(&mut key).is_err() {
        eprintln!("swimlb-speaker: no system randomness");
        return ExitCode::FAILURE;
    }
    println!("{}", encode_key(&key));
    ExitCode::SUCCESS
}

fn random_fill(buf: &mut [u8]) -> Result<(), ()> {
    use std::io::Read as _;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .map_err(|_| ())
}
