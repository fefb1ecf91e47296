//! `swimlb-lab`: not runnable yet; the lab commands arrive with the
//! gossip, election and standalone issues. It says so instead of pretending to work.

fn main() -> std::process::ExitCode {
    eprintln!(
        "swimlb-lab {}: no run mode is built yet (the lab arrives with the standalone speaker)",
        env!("CARGO_PKG_VERSION")
    );
    // EX_UNAVAILABLE
    std::process::ExitCode::from(69)
}
