//! `swimlb-lab failover --scenario pause|pause-backup`: a speaker that is not scheduled.
//!
//! - `pause`: the owner's speaker is stopped (SIGSTOP) for the pause (2 s), then continued
//!   (SIGCONT). Another node must take the VIP over (the failover is measured as for the other
//!   faults), and from the resume until every other speaker counts the old owner as a member
//!   again, the old owner must not answer for the VIP: it was asleep while the cluster moved
//!   the IP, so anything it says in that window is stale. The client keeps asking (an ARP
//!   request every 20 ms) and counts the old owner's ARP replies, gratuitous ARPs and probe
//!   answers in the window (`old_owner_answers`). After it has rejoined, taking the VIP back is
//!   the ordinary revertive behaviour, not counted.
//! - `pause-backup`: a non-owner's speaker is stopped for the pause, then continued; the
//!   answering node must not change (`owner_changes`, counted from the pause to 2 s after the
//!   paused node rejoined).
//!
//! Every trial starts from a converged lab ([`trial::settle`]), as the other faults do.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use swimlb_proto::ethernet::MacAddr;
use tokio::time::Instant;

use crate::daemons::Daemons;
use crate::failover::{Options, RunHeader, Scenario};
use crate::lab::Views;
use crate::lab::{Announcement, AnnouncementWatcher};
use crate::netns::{self, Lab, Node};
use crate::probe::{self, PROBE_PORT, ProbeRecord, Prober};
use crate::trial::{self, Percentiles};

/// How long the speaker is stopped.
pub const PAUSE: Duration = Duration::from_secs(2);
/// How long to wait for the paused node to rejoin after the resume.
const REJOIN_LIMIT: Duration = Duration::from_secs(20);

/// One pause trial.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct PauseSample {
    /// `pause`: fault to the first answer from another node (`None` for `pause-backup`, or
    /// when nobody took over).
    pub failover_ms: Option<f64>,
    /// `pause`: the old owner's answers for the VIP between its resume and its rejoin.
    pub old_owner_answers: u64,
    /// Changes of the answering node from the pause to the end of the trial.
    pub owner_changes: usize,
    /// From the resume until every other speaker counted the paused node as a member again.
    pub rejoin_ms: Option<f64>,
}

/// The JSON report of a pause run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PauseReport {
    /// What ran, and how many trials did not converge or whose paused node never rejoined.
    #[serde(flatten)]
    pub run: RunHeader,
    /// The pause, in milliseconds.
    pub pause_ms: u64,
    /// `pause`: failover time summary.
    pub failover_ms: Percentiles,
    /// `pause`: the old owner's stale answers, over all trials (the target is 0).
    pub old_owner_answers: u64,
    /// `pause-backup`: trials in which the answering node changed (the target is 0).
    pub moved_trials: usize,
    /// Every sample.
    pub samples: Vec<PauseSample>,
}

impl PauseReport {
    /// A table line for the terminal.
    pub fn table(&self) -> String {
        self.run.table(12)
            + &format!(
                " pause {} ms | failover ms p50 {:.1} p99 {:.1} | old owner's answers after resume {} | trials that moved the VIP {}",
                self.pause_ms,
                self.failover_ms.p50,
                self.failover_ms.p99,
                self.old_owner_answers,
                self.moved_trials
            )
    }
}

/// Runs the pause trials of `options` (scenario `Pause` or `PauseBackup`) in a fresh lab.
pub fn run(
    options: &Options,
    make_daemons: &dyn Fn(&mut Lab) -> Result<Box<dyn Daemons>>,
    progress: &mut dyn FnMut(&str),
) -> Result<PauseReport> {
    if !matches!(options.scenario, Scenario::Pause | Scenario::PauseBackup) {
        bail!("pause::run runs the pause scenarios only");
    }
    let (mut lab, responders, mut daemons) =
        trial::start_lab(options.nodes, options.loss, make_daemons)?;
    let mut samples = Vec::new();
    let mut failed_trials = 0;
    for trial in 1..=options.trials {
        match pause_trial(trial, options, &mut lab, daemons.as_mut(), progress)? {
            Some(sample) => samples.push(sample),
            None => failed_trials += 1,
        }
    }
    // The daemons stop before their namespaces go (the real nodes live in them).
    drop(daemons);
    drop(responders);
    lab.teardown();
    let ms: Vec<f64> = samples.iter().filter_map(|s| s.failover_ms).collect();
    Ok(PauseReport {
        run: RunHeader::new(options, samples.len(), failed_trials),
        pause_ms: PAUSE.as_millis() as u64,
        failover_ms: trial::percentiles(&ms),
        old_owner_answers: samples.iter().map(|s| s.old_owner_answers).sum(),
        moved_trials: samples.iter().filter(|s| s.owner_changes > 0).count(),
        samples,
    })
}

/// Trial number `trial`: waits for the lab to converge, pauses the owner (or, for
/// `pause-backup`, another node) for [`PAUSE`], and measures until it rejoined; `None` when the
/// trial could not be measured.
fn pause_trial(
    trial: usize,
    options: &Options,
    lab: &mut Lab,
    daemons: &mut dyn Daemons,
    progress: &mut dyn FnMut(&str),
) -> Result<Option<PauseSample>> {
    daemons.wait_up(lab)?;
    let vip = netns::vip_v4(0);
    let prober = Prober::start(
        &lab.client_netns,
        SocketAddr::from((vip, PROBE_PORT)),
        options.probe_interval,
    )?;
    let settled = match trial::settle(lab, daemons, &prober, progress)? {
        Ok(s) => s,
        Err(reason) => {
            progress(&format!(
                "trial {trial}/{}: not measured: {reason}",
                options.trials
            ));
            return Ok(None);
        }
    };
    let target = match options.scenario {
        Scenario::Pause => settled.index,
        _ => (1..=options.nodes)
            .find(|i| *i != settled.index)
            .context("pause-backup needs two nodes")?,
    };
    let paused = lab.node(target).clone();
    let pid = daemons
        .pid(lab, target)
        .with_context(|| format!("{}'s daemon is not running", paused.name))?;
    let watcher = AnnouncementWatcher::start(&lab.client_netns, vec![IpAddr::V4(vip)])?;
    let fault = Instant::now();
    signal(pid, "STOP")?;
    std::thread::sleep(PAUSE);
    signal(pid, "CONT")?;
    let resume = Instant::now();
    // The client keeps asking for the VIP while the paused node comes back.
    let client = lab.client_netns.clone();
    let asker = std::thread::spawn(move || {
        probe::arp_claims(&client, vip, None, 100, Duration::from_millis(20))
    });
    let rejoined = wait_rejoined(lab, daemons, target, REJOIN_LIMIT);
    let _ = asker.join();
    std::thread::sleep(Duration::from_secs(2));
    let records = prober.stop();
    let Some(rejoined) = rejoined else {
        progress(&format!(
            "trial {trial}/{}: {} paused, not measured: it did not rejoin within {REJOIN_LIMIT:?}",
            options.trials, paused.name
        ));
        return Ok(None);
    };
    let (claims, probe_answers) = match options.scenario {
        Scenario::Pause => stale_answers(&paused, &watcher.seen(), &records, (resume, rejoined)),
        _ => (0, 0),
    };
    let stale = claims + probe_answers;
    let changes = probe::owner_changes(
        &records
            .iter()
            .filter(|r| r.sent >= fault)
            .cloned()
            .collect::<Vec<_>>(),
    );
    let failover_ms = match options.scenario {
        Scenario::Pause => probe::failover(&records, fault, &settled.owner).map(|s| s.failover_ms),
        _ => None,
    };
    let rejoin_ms = rejoined.duration_since(resume).as_secs_f64() * 1e3;
    progress(&format!(
        "trial {trial}/{}: {} paused {} ms: failover {}, old owner's answers after resume {stale} ({claims} ARP, {probe_answers} probes), answering node changed {changes} times, rejoined {:.0} ms after resume",
        options.trials,
        paused.name,
        PAUSE.as_millis(),
        failover_ms.map_or("none".to_string(), |ms| format!("{ms:.1} ms")),
        rejoin_ms
    ));
    Ok(Some(PauseSample {
        failover_ms,
        old_owner_answers: stale,
        owner_changes: changes,
        rejoin_ms: Some(rejoin_ms),
    }))
}

/// The paused node's claims of the VIP in `window` (its resume to its rejoin): its ARP
/// announcements and replies the client saw, and the probes it answered.
fn stale_answers(
    paused: &Node,
    seen: &[Announcement],
    records: &[ProbeRecord],
    (resume, rejoined): (Instant, Instant),
) -> (u64, u64) {
    let in_window = |at: Instant| at >= resume && at <= rejoined;
    let m = paused.mac;
    let mac = MacAddr(m[0], m[1], m[2], m[3], m[4], m[5]);
    let claims = seen
        .iter()
        .filter(|a| in_window(a.at) && a.mac == mac)
        .count();
    let answers = records
        .iter()
        .filter_map(|r| r.answer.as_ref())
        .filter(|(n, at)| *n == paused.name && in_window(*at))
        .count();
    (claims as u64, answers as u64)
}

/// Sends `signal` to the process `pid` with kill(1) (a stop or continue: it does not wait).
pub fn signal(pid: u32, signal: &str) -> Result<()> {
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()?;
    if !status.success() {
        bail!("kill -{signal} {pid}: {status}");
    }
    Ok(())
}

/// Polls (every 10 ms) until every other node's daemon counts node `index` as a member again
/// (its views show all members, ready); when that was first seen.
fn wait_rejoined(
    lab: &Lab,
    daemons: &mut dyn Daemons,
    index: usize,
    limit: Duration,
) -> Option<Instant> {
    let deadline = Instant::now() + limit;
    let n = lab.nodes.len();
    while Instant::now() < deadline {
        let all = match daemons.views(lab) {
            Views::Swimlb(views) => views
                .iter()
                .enumerate()
                .filter(|(i, _)| i + 1 != index)
                .all(|(_, v)| v.as_ref().is_some_and(|v| v.members == n)),
            Views::Metallb(views) => views
                .iter()
                .enumerate()
                .filter(|(i, _)| i + 1 != index)
                .all(|(_, v)| v.as_ref().is_some_and(|v| v.members == n)),
            // keepalived has no membership: the resumed daemon is back at once.
            Views::Keepalived(_) => true,
        };
        if all {
            return Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}
