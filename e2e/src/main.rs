//! `swimlb-lab`: the swimlb lab. Everything is in [`swimlb_e2e::cli`].

fn main() -> std::process::ExitCode {
    swimlb_e2e::cli::main_with_args(std::env::args_os())
}
