//! The command line's share of configuration, for both daemons: the exit statuses they end
//! with (sysexits' numbers) and the parse they start with.

use std::ffi::OsString;
use std::process::ExitCode;

/// Exit status for an invalid command line or configuration (sysexits' `EX_USAGE`, 64: a
/// refused configuration file exits with it too, so 64 means "fix what you wrote").
pub const EX_USAGE: u8 = 64;
/// Exit status for a daemon that cannot run or stopped on a fatal runtime error (sysexits'
/// `EX_UNAVAILABLE`).
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
/// printed and the exit status returned: [`EX_USAGE`] for an error, success for `--help` and
/// `--version`.
pub fn parse_args<C: clap::Parser>(
    args: impl IntoIterator<Item = OsString>,
) -> Result<C, ExitCode> {
    C::try_parse_from(args).map_err(|e| {
        let _ = e.print();
        if e.use_stderr() {
            ExitCode::from(EX_USAGE)
        } else {
            ExitCode::SUCCESS
        }
    })
}
