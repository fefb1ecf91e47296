//! `swimlb-speaker`: not runnable yet; the standalone and Kubernetes modes arrive with the
//! gossip, election and standalone issues. It says so instead of pretending to work.

fn main() -> std::process::ExitCode {
    eprintln!(
        "swimlb-speaker {}: no run mode is built yet (gossip, election and standalone mode are in progress)",
        env!("CARGO_PKG_VERSION")
    );
    // EX_UNAVAILABLE
    std::process::ExitCode::from(69)
}
