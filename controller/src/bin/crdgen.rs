//! `crdgen`: prints the swimlb CRD manifests (what `deploy/crds.yaml` holds) on stdout.
//!
//! Regenerate with `cargo run -p swimlb-controller --bin crdgen > deploy/crds.yaml`; a test in
//! swimlb-config fails while the committed file differs from the types.

use std::io::Write;

fn main() -> std::process::ExitCode {
    if let Err(status) =
        swimlb_config::cli::parse_args::<swimlb_controller::cli::Crdgen>(std::env::args_os())
    {
        return status;
    }
    match swimlb_config::crd::all_crds_yaml() {
        Ok(yaml) => {
            let mut out = std::io::stdout().lock();
            if let Err(e) = out.write_all(yaml.as_bytes()).and_then(|()| out.flush()) {
                eprintln!("crdgen: cannot write to stdout: {e}");
                return std::process::ExitCode::FAILURE;
            }
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("crdgen: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
