//! `swimlb-lab failover`: repeated failover trials on real kernel networking.
//!
//! One lab (see [`crate::netns`]) serves every trial. Each trial waits until the lab has
//! converged (see [`crate::converge`]: the daemons name one owner, and that owner alone answers
//! ARP and the probes for a second), re-checks right before the fault, faults that owner (link
//! down, SIGKILL or SIGTERM of its daemon), waits for another node to answer, records the sample,
//! then restores the old owner. A trial whose lab does not converge within a minute is reported
//! as failed, never measured. Every wait is bounded.
//!
//! The figures follow DESIGN.md: `failover_ms` runs from the fault to the first answer from a
//! node other than the old owner; `lost_probes` counts the unanswered probes in between; a
//! change of the answering node after the lab converged and before the fault is a false
//! failover.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use tokio::time::Instant;

pub use crate::daemons::{
    Daemons, Implementation, KeepalivedDaemons, RECORD_LIMIT, SwimlbDaemons, speaker_view,
};
use crate::flood::{Flood, FloodKind};
use crate::lab::proc_usage;
pub use crate::lab::{GOSSIP_PORT, HTTP_PORT, http_addrs};
use crate::netns::{self, Lab};
use crate::probe::{PROBE_PORT, Prober};
use crate::trial;
pub use crate::trial::{
    CONVERGE_LIMIT, Percentiles, Settled, first_other_answer, percentiles, settle, start_lab,
    wait_for_steady_owner,
};

/// How the owner is faulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// The owner's link goes down: as the network sees a power-off.
    Poweroff,
    /// SIGKILL to the owner's daemon.
    Kill,
    /// SIGTERM to the owner's daemon: a graceful stop.
    Sigterm,
    /// SIGSTOP to the owner's daemon for 2 s, then SIGCONT (see [`crate::pause`]).
    Pause,
    /// SIGSTOP to a non-owner's daemon for 2 s, then SIGCONT: nothing may move.
    PauseBackup,
}

impl Scenario {
    /// Name in the CLI and the JSON.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Scenario::Poweroff => "poweroff",
            Scenario::Kill => "kill",
            Scenario::Sigterm => "sigterm",
            Scenario::Pause => "pause",
            Scenario::PauseBackup => "pause-backup",
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The implementation.
    pub implementation: Implementation,
    /// The fault.
    pub scenario: Scenario,
    /// Nodes in the lab.
    pub nodes: usize,
    /// Trials.
    pub trials: usize,
    /// Random loss on every node link, percent.
    pub loss: u8,
    /// Probe interval.
    pub probe_interval: Duration,
    /// Kubernetes lab only: the API server is unreachable from right before each fault until
    /// the trial's failover was measured.
    pub api_down: bool,
    /// A flood from the client during every trial (see [`crate::flood`]), and its rate.
    pub flood: Option<(FloodKind, u64)>,
}

/// The flood a run ran under, and what the speakers spent meanwhile.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FloodReport {
    /// `arp` or `gossip`.
    pub kind: &'static str,
    /// Packets per second asked for.
    pub pps: u64,
    /// Packets the client's kernel accepted.
    pub sent: u64,
    /// Each node's daemon's CPU over the run, percent of one core (node order; a daemon that
    /// was restarted counts from its restart).
    pub cpu_percent: Vec<(String, f64)>,
}

/// Lost-probe summary.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct LostProbes {
    /// Median.
    pub p50: u64,
    /// Largest.
    pub max: u64,
}

/// One trial's result.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Sample {
    /// Fault to first answer from another node.
    pub failover_ms: f64,
    /// Probes lost in between.
    pub lost_probes: u64,
    /// Kubernetes lab: fault to the `ServiceL2Status` record naming the new owner.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_ms: Option<f64>,
}

/// Whom a measured trial faulted and who answered first after it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Handover {
    /// The owner faulted.
    pub faulted: String,
    /// The node that answered the first probe after the fault.
    pub answered: String,
}

/// The fields a failover report and a pause report begin with.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunHeader {
    /// `swimlb`, `swimlb-kubernetes`, `keepalived`, `keepalived-fast` or `metallb`.
    #[serde(rename = "impl")]
    pub implementation: &'static str,
    /// The scenario, as on the command line.
    pub scenario: &'static str,
    /// Nodes.
    pub nodes: usize,
    /// Trials run (the requested count).
    pub trials: usize,
    /// Trials that gave no sample (for a failover: no other node answered within the 30 s
    /// cap), so the percentiles cover `trials - failed_trials` samples. Not in DESIGN.md's
    /// contract; added so a run that lost trials cannot read as a clean one.
    pub failed_trials: usize,
    /// Loss on every link, percent.
    pub loss: u8,
}

impl RunHeader {
    /// The header of a run of `options` that gave `samples` samples and `failed_trials` none.
    pub fn new(options: &Options, samples: usize, failed_trials: usize) -> RunHeader {
        RunHeader {
            implementation: options.implementation.as_str(),
            scenario: options.scenario.as_str(),
            nodes: options.nodes,
            trials: samples + failed_trials,
            failed_trials,
            loss: options.loss,
        }
    }

    /// The start of a table line, the scenario padded to `scenario_width`.
    pub fn table(&self, scenario_width: usize) -> String {
        format!(
            "{:<15} {:<scenario_width$} nodes {:>2} trials {:>2} (failed {}) loss {:>2}%",
            self.implementation,
            self.scenario,
            self.nodes,
            self.trials,
            self.failed_trials,
            self.loss,
        )
    }
}

/// The JSON report (DESIGN.md's contract).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    /// What ran, and how many trials gave no sample.
    #[serde(flatten)]
    pub run: RunHeader,
    /// Failover time summary.
    pub failover_ms: Percentiles,
    /// Lost probes summary.
    pub lost_probes: LostProbes,
    /// Owner changes while no fault was in progress.
    pub false_failovers: usize,
    /// Kubernetes lab: fault to the status record naming the new owner, over the samples that
    /// have it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_ms: Option<Percentiles>,
    /// Kubernetes lab: whether the API server was unreachable during each fault.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub api_down: bool,
    /// The flood during the trials, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flood: Option<FloodReport>,
    /// Kubernetes lab: the API server's version, as its `/version` reported it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_version: Option<String>,
    /// Real nodes: each Node's kubelet and runtime versions, as its `status.nodeInfo`
    /// reported them when it turned Ready.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub node_info: Vec<crate::realnode::cluster::NodeInfo>,
    /// Each measured trial's faulted owner and first answerer, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub handovers: Vec<Handover>,
    /// Every sample.
    pub samples: Vec<Sample>,
}

impl Report {
    /// Summarizes `samples`; `failed_trials` are the trials that produced none.
    pub fn new(
        options: &Options,
        samples: Vec<Sample>,
        failed_trials: usize,
        false_failovers: usize,
    ) -> Report {
        let ms: Vec<f64> = samples.iter().map(|s| s.failover_ms).collect();
        let status: Vec<f64> = samples.iter().filter_map(|s| s.status_ms).collect();
        let mut lost: Vec<u64> = samples.iter().map(|s| s.lost_probes).collect();
        lost.sort_unstable();
        Report {
            run: RunHeader::new(options, samples.len(), failed_trials),
            failover_ms: percentiles(&ms),
            lost_probes: LostProbes {
                p50: lost
                    .get(lost.len().saturating_sub(1) / 2)
                    .copied()
                    .unwrap_or(0),
                max: lost.last().copied().unwrap_or(0),
            },
            false_failovers,
            status_ms: (!status.is_empty()).then(|| percentiles(&status)),
            api_down: options.api_down,
            flood: None,
            server_version: None,
            node_info: Vec::new(),
            handovers: Vec::new(),
            samples,
        }
    }

    /// A table for the terminal.
    pub fn table(&self) -> String {
        self.run.table(8)
            + &format!(
                " | failover ms p50 {:>7.1} p90 {:>7.1} p99 {:>7.1} max {:>7.1} | lost probes p50 {:>3} max {:>3} | false failovers {}",
                self.failover_ms.p50,
                self.failover_ms.p90,
                self.failover_ms.p99,
                self.failover_ms.max,
                self.lost_probes.p50,
                self.lost_probes.max,
                self.false_failovers
            )
            + &match &self.status_ms {
                Some(st) => format!(
                    " | status ms p50 {:.1} p99 {:.1}{}",
                    st.p50,
                    st.p99,
                    if self.api_down {
                        " (API server down)"
                    } else {
                        ""
                    }
                ),
                None => String::new(),
            }
            + &match &self.server_version {
                Some(version) => format!(" | kube-apiserver {version}"),
                None => String::new(),
            }
            + &match self.node_info.first() {
                Some(info) => format!(
                    " | kubelet {}, {}",
                    info.kubelet_version, info.container_runtime
                ),
                None => String::new(),
            }
            + &match &self.flood {
                Some(f) => format!(
                    " | {} flood {} pps ({} sent), CPU % {}",
                    f.kind,
                    f.pps,
                    f.sent,
                    f.cpu_percent
                        .iter()
                        .map(|(n, c)| format!("{n} {c:.1}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                None => String::new(),
            }
    }
}

/// A flood running under the trials, with every daemon's CPU ticks when it started.
struct RunningFlood {
    kind: FloodKind,
    pps: u64,
    flood: Flood,
    before: Vec<Option<(u32, u64)>>,
    started: Instant,
}

/// Every node's daemon's pid and CPU ticks now, in node order (`None`: not running).
fn cpu_ticks(lab: &mut Lab, daemons: &mut dyn Daemons, nodes: usize) -> Vec<Option<(u32, u64)>> {
    (1..=nodes)
        .map(|i| {
            let pid = daemons.pid(lab, i)?;
            Some((pid, proc_usage(pid)?.0))
        })
        .collect()
}

impl RunningFlood {
    /// Starts `pps` packets per second of `kind` from the client, forged with the lab's key.
    fn start(
        lab: &mut Lab,
        daemons: &mut dyn Daemons,
        nodes: usize,
        (kind, pps): (FloodKind, u64),
    ) -> Result<RunningFlood> {
        let key = std::fs::read_to_string(lab.work_dir().join("keys"))
            .ok()
            .and_then(|text| swimlb_config::keyfile::parse_key_file(&text).ok())
            .and_then(|keys| keys.first().copied());
        let before = cpu_ticks(lab, daemons, nodes);
        Ok(RunningFlood {
            kind,
            pps,
            flood: Flood::start(lab, kind, pps, key)?,
            before,
            started: Instant::now(),
        })
    }

    /// Stops the flood; what it sent, and each daemon's CPU meanwhile.
    fn finish(self, lab: &mut Lab, daemons: &mut dyn Daemons, nodes: usize) -> FloodReport {
        let elapsed = self.started.elapsed().as_secs_f64();
        let now = cpu_ticks(lab, daemons, nodes);
        let cpu_percent = (1..=nodes)
            .map(|i| {
                let spent = match (self.before[i - 1], now[i - 1]) {
                    (Some((p0, t0)), Some((p1, t1))) if p0 == p1 => t1.saturating_sub(t0),
                    (_, Some((_, t1))) => t1,
                    _ => 0,
                };
                // /proc counts USER_HZ ticks: 100 a second on Linux.
                (
                    lab.node(i).name.clone(),
                    spent as f64 / 100.0 / elapsed * 100.0,
                )
            })
            .collect();
        FloodReport {
            kind: self.kind.as_str(),
            pps: self.pps,
            sent: self.flood.stop(),
            cpu_percent,
        }
    }
}

/// How one trial ended.
enum TrialEnd {
    /// Not measured: the lab did not converge, or was not ready for the fault.
    NotMeasured,
    /// The owner was faulted; `sample` is `None` when no other node answered within 30 s.
    Faulted {
        sample: Option<(Sample, Option<Handover>)>,
        false_failovers: usize,
    },
}

/// Takes the scenario's fault to node `index`.
fn fault(scenario: Scenario, lab: &mut Lab, daemons: &mut dyn Daemons, index: usize) -> Result<()> {
    match scenario {
        Scenario::Poweroff => lab.set_link(index, false),
        Scenario::Kill => daemons.signal(lab, index, "KILL"),
        Scenario::Sigterm => daemons.signal(lab, index, "TERM"),
        Scenario::Pause | Scenario::PauseBackup => {
            bail!("the pause scenarios run in crate::pause::run")
        }
    }
}

/// Brings faulted node `index` back as a backup; the next trial waits for the lab to converge.
fn restore(
    scenario: Scenario,
    lab: &mut Lab,
    daemons: &mut dyn Daemons,
    index: usize,
) -> Result<()> {
    match scenario {
        Scenario::Poweroff => lab.set_link(index, true),
        Scenario::Kill => {
            daemons.clean_after_kill(lab, index)?;
            daemons.start(lab, index)
        }
        Scenario::Sigterm => daemons.start(lab, index),
        Scenario::Pause | Scenario::PauseBackup => Ok(()),
    }
}

/// Trial number `trial`: waits for the lab to converge, faults the owner, measures the
/// failover (and the status record's, in the Kubernetes lab) and restores the old owner.
fn run_trial(
    trial: usize,
    options: &Options,
    lab: &mut Lab,
    daemons: &mut dyn Daemons,
    progress: &mut dyn FnMut(&str),
) -> Result<TrialEnd> {
    // On real nodes: every Node and speaker Ready, the Service's endpoints and IP there.
    daemons.wait_up(lab)?;
    let target = SocketAddr::from((netns::vip_v4(0), PROBE_PORT));
    let prober = Prober::start(&lab.client_netns, target, options.probe_interval)?;
    let settled = match settle(lab, daemons, &prober, progress)? {
        Ok(settled) => settled,
        Err(reason) => {
            prober.stop();
            progress(&format!(
                "trial {trial}/{}: not measured: the lab did not converge within {CONVERGE_LIMIT:?} ({reason})",
                options.trials
            ));
            return Ok(TrialEnd::NotMeasured);
        }
    };
    let (owner, index) = (settled.owner.clone(), settled.index);
    let record = match daemons.before_fault(&owner, options.api_down)? {
        Ok(record) => record,
        Err(reason) => {
            prober.stop();
            progress(&format!(
                "trial {trial}/{}: not measured: {reason}",
                options.trials
            ));
            return Ok(TrialEnd::NotMeasured);
        }
    };
    let fault_at = Instant::now();
    fault(options.scenario, lab, daemons, index)?;
    let measured = trial::wait_failover(&prober, fault_at, &owner, Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(200));
    let records = prober.stop();
    let new_owner = measured
        .as_ref()
        .and_then(|_| first_other_answer(&records, fault_at, &owner));
    daemons
        .after_fault()
        .context("bringing the API server back")?;
    // The record must name the node that took over (not merely another one).
    let status_ms = record
        .and_then(|r| r.join())
        .filter(|(node, _)| Some(node) == new_owner.as_ref())
        .map(|(_, at)| at.duration_since(fault_at).as_secs_f64() * 1e3);
    let sample = match measured {
        Some(s) => {
            let status = status_ms
                .map(|ms| {
                    format!(
                        ", status record names {} after {ms:.1} ms",
                        new_owner.as_deref().unwrap_or("?")
                    )
                })
                .unwrap_or_default();
            progress(&format!(
                "trial {trial}/{}: {owner} faulted, failover {:.1} ms, {} probes lost{status}",
                options.trials, s.failover_ms, s.lost_probes
            ));
            let handover = new_owner.clone().map(|answered| Handover {
                faulted: owner.clone(),
                answered,
            });
            Some((
                Sample {
                    failover_ms: s.failover_ms,
                    lost_probes: s.lost_probes,
                    status_ms,
                },
                handover,
            ))
        }
        None => {
            progress(&format!(
                "trial {trial}/{}: {owner} faulted, no other node answered within 30 s",
                options.trials
            ));
            None
        }
    };
    restore(options.scenario, lab, daemons, index)?;
    Ok(TrialEnd::Faulted {
        sample,
        false_failovers: settled.false_failovers,
    })
}

/// Runs the trials in a fresh lab and returns the report. `progress` gets one line per trial.
pub fn run(
    options: &Options,
    make_daemons: &dyn Fn(&mut Lab) -> Result<Box<dyn Daemons>>,
    progress: &mut dyn FnMut(&str),
) -> Result<Report> {
    run_scenarios(options, &[options.scenario], make_daemons, progress)?
        .pop()
        .context("no report")
}

/// What the trials of one scenario gave.
#[derive(Default)]
struct Trials {
    samples: Vec<Sample>,
    handovers: Vec<Handover>,
    failed: usize,
    false_failovers: usize,
}

/// The trials of `options` for each of `scenarios` in turn (not the pause scenarios), on one
/// fresh lab (a cluster of real nodes starts once); a report per scenario, in order. A flood
/// runs under all of them.
pub fn run_scenarios(
    options: &Options,
    scenarios: &[Scenario],
    make_daemons: &dyn Fn(&mut Lab) -> Result<Box<dyn Daemons>>,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<Report>> {
    let (mut lab, responders, mut daemons) = start_lab(options.nodes, options.loss, make_daemons)?;
    let flood = match options.flood {
        Some(flood) => Some(RunningFlood::start(
            &mut lab,
            daemons.as_mut(),
            options.nodes,
            flood,
        )?),
        None => None,
    };
    let mut runs = Vec::new();
    for &scenario in scenarios {
        let options = Options {
            scenario,
            ..options.clone()
        };
        let mut trials = Trials::default();
        for trial in 1..=options.trials {
            match run_trial(trial, &options, &mut lab, daemons.as_mut(), progress)? {
                TrialEnd::NotMeasured => trials.failed += 1,
                TrialEnd::Faulted {
                    sample,
                    false_failovers: seen,
                } => {
                    trials.false_failovers += seen;
                    match sample {
                        Some((sample, handover)) => {
                            trials.samples.push(sample);
                            trials.handovers.extend(handover);
                        }
                        None => trials.failed += 1,
                    }
                }
            }
        }
        runs.push((options, trials));
    }
    let flood = flood.map(|flood| flood.finish(&mut lab, daemons.as_mut(), options.nodes));
    let server_version = daemons.server_version();
    let node_info = daemons.node_info();
    // The daemons stop before their namespaces go (the Kubernetes labs' kubelets and clients
    // live in them).
    drop(daemons);
    drop(responders);
    lab.teardown();
    Ok(runs
        .into_iter()
        .map(|(options, trials)| {
            let mut report = Report::new(
                &options,
                trials.samples,
                trials.failed,
                trials.false_failovers,
            );
            report.flood = flood.clone();
            report.server_version = server_version.clone();
            report.node_info = node_info.clone();
            report.handovers = trials.handovers;
            report
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_implementation_parses_from_its_cli_name() {
        for i in Implementation::ALL {
            assert_eq!(Implementation::parse(i.as_str()), Some(i));
        }
        assert_eq!(
            Implementation::parse("keepalived-fast"),
            Some(Implementation::KeepalivedFast)
        );
        assert_eq!(Implementation::parse("vrrp"), None);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let values: Vec<f64> = (1..=20).map(f64::from).collect();
        let p = percentiles(&values);
        assert_eq!((p.p50, p.p90, p.p99, p.max), (10.0, 18.0, 20.0, 20.0));
        assert_eq!(percentiles(&[]), Percentiles::default());
        assert_eq!(percentiles(&[7.0]).p99, 7.0);
    }

    #[test]
    fn report_json_has_the_contract_fields() {
        let options = Options {
            implementation: Implementation::Keepalived,
            scenario: Scenario::Poweroff,
            nodes: 3,
            trials: 2,
            loss: 0,
            probe_interval: Duration::from_millis(10),
            api_down: false,
            flood: None,
        };
        let report = Report::new(
            &options,
            vec![
                Sample {
                    failover_ms: 3000.0,
                    lost_probes: 300,
                    status_ms: None,
                },
                Sample {
                    failover_ms: 3400.0,
                    lost_probes: 340,
                    status_ms: None,
                },
            ],
            1,
            0,
        );
        let json: serde_json::Value = serde_json::to_value(&report).unwrap();
        for key in [
            "impl",
            "scenario",
            "nodes",
            "trials",
            "failover_ms",
            "lost_probes",
            "false_failovers",
            "samples",
        ] {
            assert!(json.get(key).is_some(), "{key} missing: {json}");
        }
        assert_eq!(json["impl"], "keepalived");
        assert_eq!(
            json["trials"], 3,
            "a failed trial still counts as run: {json}"
        );
        assert_eq!(json["failed_trials"], 1);
        assert_eq!(json["failover_ms"]["p50"], 3000.0);
        assert_eq!(json["lost_probes"]["max"], 340);
    }
}
