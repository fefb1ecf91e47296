//! Network namespaces made by the lab (`ip netns add`, under `/var/run/netns`).

use std::process::Command;

use anyhow::{Context as _, Result};

/// Moves the calling thread into network namespace `netns`.
#[allow(unsafe_code)]
pub fn enter_netns(netns: &str) -> Result<()> {
    use std::os::fd::AsRawFd as _;
    let file = std::fs::File::open(format!("/var/run/netns/{netns}"))
        .with_context(|| format!("opening namespace {netns}"))?;
    // SAFETY: setns only reads the descriptor, which `file` keeps open for the call; it changes
    // the network namespace of the calling thread alone (CLONE_NEWNET), which is what we want.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("entering namespace {netns}"));
    }
    Ok(())
}

/// A command that runs `program` inside `netns` (`ip netns exec`).
pub fn command_in(netns: &str, program: &str) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", netns, program]);
    cmd
}
