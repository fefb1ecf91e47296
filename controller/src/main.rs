//! `swimlb-controller`: not runnable yet; the allocator and reconciler arrive with the controller issue.

fn main() -> std::process::ExitCode {
    eprintln!(
        "swimlb-controller {}: no run mode is built yet (the allocator and reconciler are in progress)",
        env!("CARGO_PKG_VERSION")
    );
    // EX_UNAVAILABLE
    std::process::ExitCode::from(69)
}
