//! `swimlb-docgen [--check]`: writes the book's reference pages generated from the code
//! (`docs/src/reference/{cli,standalone,crds}.md`, see `swimlb_e2e::reference`); with `--check`,
//! writes nothing and exits 1 while a committed page differs.

use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let check = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--check") => true,
        Some(other) => {
            eprintln!("swimlb-docgen: unknown argument `{other}`; usage: swimlb-docgen [--check]");
            return ExitCode::from(swimlb_config::cli::EX_USAGE);
        }
    };
    // The repository: the parent of this crate's directory.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let result = if check {
        swimlb_e2e::reference::stale(&root)
    } else {
        swimlb_e2e::reference::write(&root)
    };
    match result {
        Ok(paths) if check && !paths.is_empty() => {
            for path in paths {
                eprintln!(
                    "{path} is out of date; rewrite it with `{}`",
                    swimlb_e2e::reference::REGENERATE
                );
            }
            ExitCode::FAILURE
        }
        Ok(paths) => {
            for path in paths {
                println!("wrote {path}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("swimlb-docgen: {e:#}");
            ExitCode::FAILURE
        }
    }
}
