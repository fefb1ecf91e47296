//! The process faults of a chaos run on real nodes (`--impl swimlb-kubernetes` and `metallb`):
//! each acts on the speaker container's process, its host pid read from the node's containerd
//! ([`container_pid`]).
//!
//! - A kill, a power-off and a rolling update's stop signal the speaker while the node's
//!   kubelet is held (SIGSTOP): a real kubelet restarts a dead container by itself within a
//!   second, and the checker's world has the speaker down until the fault's end. The end
//!   continues the kubelet and waits until it has started the container again (its restart in
//!   place, with the kubelet's back-off: 10 s, 20 s ... for a node killed again within minutes),
//!   so the speaker counts as started from when it runs. The restart in place needs no API
//!   server: a kill during an outage ends like any other. The end waits [`RESTART_WAIT`]: a
//!   restart the kubelet's back-off holds longer is *late*, the run goes on, and the speaker
//!   counts as started when the run sees it running ([`Driver::poll_late`]); a fault on a node
//!   whose speaker does not run meanwhile is skipped, with a line saying why.
//! - A pause stops the speaker's process only (not the kubelet, containerd or kube-proxy of its
//!   node).
//! - A starvation caps the speaker container's own cgroup (cgroup v1 `cpu`: its CFS quota) and
//!   runs the busy loops in it; its end stops them and puts the quota back.

use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::lab;
use crate::realnode::RealNode;
use crate::realnode::daemons::container_pid;

/// A held kubelet: its pid, and the pid of the speaker it ran.
#[derive(Debug, Clone, Copy)]
pub(super) struct Held {
    kubelet: u32,
    speaker: Option<u32>,
}

/// How long a signalled speaker may take to end.
const EXIT_LIMIT: Duration = Duration::from_secs(30);

/// How long the end of a kill waits for the kubelet to start the speaker again before the run
/// goes on without it: a restart in place takes 0.2-3 s here (load up to 15); longer is the
/// kubelet's back-off (10 s, doubled after each exit within 10 minutes of the last), which
/// the run does not wait for: MetalLB's speaker exits while the API server is away, and a run
/// that waited held the API server's return behind it (each exit doubling the back-off).
pub const RESTART_WAIT: Duration = Duration::from_secs(5);

/// Whether node `node`'s speaker container runs with another pid than `old`.
fn restarted(d: &RealDaemons, node: usize, old: Option<u32>) -> bool {
    // containerd may list a container that just ended as running, with pid 0.
    let now = container_pid(real_node(d, node))
        .ok()
        .flatten()
        .filter(|p| *p > 0 && lab::proc_running(*p));
    now.is_some() && now != old
}

fn real_node(d: &RealDaemons, node: usize) -> &RealNode {
    &d.cluster().real.nodes[node - 1]
}

/// The pid of the kubelet running in node `node`'s namespace.
fn kubelet_pid(lab: &Lab, node: usize) -> Result<u32> {
    netns_pids(&lab.node(node).netns)
        .into_iter()
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "kubelet")
        })
        .with_context(|| format!("no kubelet runs in {}", lab.node(node).netns))
}

/// The speaker container's processes on node `node` (its cgroup's, else its main process).
pub(super) fn speaker_pids(d: &RealDaemons, node: usize) -> Result<Vec<u32>> {
    let pid = container_pid(real_node(d, node))?
        .with_context(|| format!("no running speaker container on node{node}"))?;
    let procs = container_cgroup(pid)
        .and_then(|dir| std::fs::read_to_string(dir.join("cgroup.procs")).ok())
        .map(|text| {
            text.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .unwrap_or_default();
    Ok(if procs.is_empty() { vec![pid] } else { procs })
}

/// The cgroup v1 `cpu` folder of process `pid` (`/proc/PID/cgroup`'s line naming `cpu`).
fn container_cgroup(pid: u32) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "cpu")
            .then(|| path.to_string())
    })?;
    let dir = PathBuf::from(format!("/sys/fs/cgroup/cpu{path}"));
    dir.join("cpu.cfs_quota_us").exists().then_some(dir)
}

/// Caps the speaker container of node `node` at `quota_percent` of a core and runs
/// `busy_loops` loops in its cgroup.
pub fn starve(
    lab: &mut Lab,
    d: &RealDaemons,
    node: usize,
    busy_loops: u8,
    quota_percent: u8,
) -> Result<Starved> {
    let pid = container_pid(real_node(d, node))?
        .with_context(|| format!("no running speaker container on node{node}"))?;
    let dir = container_cgroup(pid)
        .with_context(|| format!("the speaker's (pid {pid}) cgroup v1 cpu folder"))?;
    let quota = std::fs::read_to_string(dir.join("cpu.cfs_quota_us"))?
        .trim()
        .to_string();
    let period: u64 = std::fs::read_to_string(dir.join("cpu.cfs_period_us"))?
        .trim()
        .parse()
        .context("the speaker cgroup's CFS period")?;
    std::fs::write(
        dir.join("cpu.cfs_quota_us"),
        (period * u64::from(quota_percent) / 100).to_string(),
    )?;
    let mut busy = Vec::new();
    let netns = lab.node(node).netns.clone();
    for _ in 0..busy_loops {
        let mut cmd = Lab::command_in(&netns, "sh");
        cmd.args(["-c", "while :; do :; done"]);
        let child = lab.spawn(cmd)?;
        let _ = std::fs::write(dir.join("cgroup.procs"), lab.child(child).id().to_string());
        busy.push(child);
    }
    Ok(Starved {
        cgroup: None,
        busy,
        container: Some((dir, quota)),
    })
}

impl Driver {
    /// Stops node `node`'s daemon with `signal`: on a real node, its kubelet held first.
    pub(super) fn stop_daemon(
        &mut self,
        lab: &mut Lab,
        daemons: &mut ChaosDaemons,
        node: usize,
        sig: &str,
    ) -> Result<()> {
        let ChaosDaemons::Real(d) = daemons else {
            return daemons.as_dyn().signal(lab, node, sig);
        };
        let kubelet = kubelet_pid(lab, node)?;
        signal(&[kubelet], "STOP");
        let speaker = container_pid(real_node(d, node))?;
        self.held.insert(node, Held { kubelet, speaker });
        let pid = speaker.with_context(|| format!("no running speaker container on node{node}"))?;
        signal(&[pid], sig);
        let deadline = Instant::now() + EXIT_LIMIT;
        while lab::proc_running(pid) {
            if Instant::now() > deadline {
                bail!("the speaker (pid {pid}) did not end within {EXIT_LIMIT:?} of SIG{sig}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// Starts node `node`'s daemon again: on a real node, its kubelet continued and the
    /// container restarted by it (a new pid running). The driver waits at most
    /// [`RESTART_WAIT`]: a restart the kubelet's back-off holds longer goes on without the run
    /// (the node is [late](Driver::late) until [`Driver::poll_late`] sees it running).
    pub(super) fn start_daemon(
        &mut self,
        lab: &mut Lab,
        daemons: &mut ChaosDaemons,
        node: usize,
    ) -> Result<()> {
        let ChaosDaemons::Real(d) = daemons else {
            daemons.as_dyn().clean_after_kill(lab, node)?;
            daemons.as_dyn().start(lab, node)?;
            self.running[node - 1] = true;
            return Ok(());
        };
        let Some(held) = self.held.remove(&node) else {
            self.running[node - 1] = true;
            return Ok(());
        };
        signal(&[held.kubelet], "CONT");
        let deadline = Instant::now() + RESTART_WAIT;
        loop {
            if restarted(d, node, held.speaker) {
                self.running[node - 1] = true;
                return Ok(());
            }
            if Instant::now() > deadline {
                self.late.insert(node, held.speaker);
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The late nodes whose kubelet has started the speaker again since the last call: each
    /// counts as running from now.
    pub fn poll_late(&mut self, daemons: &ChaosDaemons) -> Vec<usize> {
        let ChaosDaemons::Real(d) = daemons else {
            return Vec::new();
        };
        let back: Vec<usize> = self
            .late
            .iter()
            .filter(|(node, old)| restarted(d, **node, **old))
            .map(|(node, _)| *node)
            .collect();
        for node in &back {
            self.late.remove(node);
            self.running[node - 1] = true;
        }
        back
    }

    /// Why a fault that acts on node `node`'s speaker container cannot be put on now: the
    /// kubelet has not started it again yet ([late](Driver::late)), or it has no running
    /// container (a crash the process watch counts, the kubelet's back-off after it).
    pub(super) fn no_speaker(&self, daemons: &ChaosDaemons, node: usize) -> Option<String> {
        let ChaosDaemons::Real(d) = daemons else {
            return None;
        };
        if self.late.contains_key(&node) {
            return Some(format!(
                "node{node}'s speaker is not running again yet (its kubelet's restart back-off)"
            ));
        }
        let running = container_pid(real_node(d, node))
            .ok()
            .flatten()
            .is_some_and(|p| p > 0 && lab::proc_running(p));
        (!running).then(|| format!("node{node} has no running speaker container"))
    }

    /// Continues every held kubelet (an early end, an error).
    pub(super) fn release_held(&mut self) {
        for (_, held) in std::mem::take(&mut self.held) {
            signal(&[held.kubelet], "CONT");
        }
    }
}
