//! `swimlb-controller`: assigns LoadBalancer Service IPs. Everything is in
//! [`swimlb_controller::cli`].

fn main() -> std::process::ExitCode {
    swimlb_controller::cli::main_with_args(std::env::args_os())
}
