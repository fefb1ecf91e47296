//! The command line's share of configuration, for both daemons: the exit status of a refused
//! one (sysexits' `EX_CONFIG`, as for an invalid configuration file) and the parse they start
//! with.

use std::ffi::OsString;
use std::process::ExitCode;

/// Exit status for an invalid command line or configuration (sysexits `EX_CONFIG`).
pub const EX_CONFIG: u8 = 64;
/// sysexits.h: the service is unavailable (a fatal runtime error).
pub const EX_UNAVAILABLE: u8 = 69;

/// The two-thread runtime a daemon runs on; when it cannot be built, why is printed under
/// `program` and the exit status is [`EX_UNAVAILABLE`].
pub fn runtime(program: &str) -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("{program}: {e}");
            ExitCode::from(EX_UNAVAILABLE)
        })
}

/// Parses the command line `args` (the program name first). On failure clap's message is
/// printed and the exit status returned: [`EX_CONFIG`] for an error, success for `--help` and
/// `--version`.
pub fn parse_args<C: clap::Parser>(
    args: impl IntoIterator<Item = OsString>,
) -> Result<C, ExitCode> {
    C::try_parse_from(args).map_err(|e| {
        let _ = e.print();
        if e.use_stderr() {
            ExitCode::from(EX_CONFIG)
        } else {
            ExitCode::SUCCESS
        }
    })
}
