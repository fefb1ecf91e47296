//! `swimlb-speaker`: the per-node daemon. Everything is in [`swimlb_speaker::cli`].

fn main() -> std::process::ExitCode {
    swimlb_speaker::cli::main_with_args(std::env::args_os())
}
