//! `swimlb-lab soak`: the lab with no fault at all, for what must NOT happen and what the speaker
//! costs at rest.
//!
//! N nodes run swimlb (or keepalived, for comparison), optionally with random loss on every link and with a flood of non-ARP
//! frames at one node; the client probes the VIP the whole time. The report counts owner changes
//! (each one a false failover), lost probes, and each speaker's resident memory and CPU use,
//! read from `/proc` over the run.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;
use tokio::time::Instant;

use crate::failover::{Daemons, Implementation};
use crate::flood::{Flood, FloodKind};
use crate::netns::{self, Lab};
use crate::probe::{self, PROBE_PORT, Prober};

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Which load balancer.
    pub implementation: Implementation,
    /// Nodes.
    pub nodes: usize,
    /// Random loss on every node link, percent.
    pub loss: u8,
    /// How long to watch.
    pub duration: Duration,
    /// Non-ARP frames per second sent at node 1 (0: none).
    pub flood_pps: u64,
}

/// One speaker's cost.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SpeakerCost {
    /// Node name.
    pub node: String,
    /// Resident memory at the end, MiB.
    pub rss_mib: f64,
    /// CPU over the run, percent of one core.
    pub cpu_percent: f64,
}

/// The report.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    /// Which load balancer (`swimlb`, `keepalived`, `keepalived-fast`, `swimlb-kubernetes`).
    #[serde(rename = "impl")]
    pub implementation: &'static str,
    /// Nodes.
    pub nodes: usize,
    /// Loss, percent.
    pub loss: u8,
    /// Seconds watched.
    pub duration_s: f64,
    /// Flood rate at node 1 (frames per second asked for).
    pub flood_pps: u64,
    /// Flood frames actually sent.
    pub flood_sent: u64,
    /// Probes sent.
    pub probes: usize,
    /// Probes without an answer.
    pub lost_probes: usize,
    /// Owner changes (false failovers: there was no fault).
    pub owner_changes: usize,
    /// Per speaker.
    pub speakers: Vec<SpeakerCost>,
}

impl Report {
    /// A few lines for the terminal.
    pub fn table(&self) -> String {
        let mut s = format!(
            "soak ({}): {} nodes, {}% loss, {:.0} s, flood {} fps at node1 ({} sent): {} probes, {} lost, {} owner changes (false failovers)\n",
            self.implementation,
            self.nodes,
            self.loss,
            self.duration_s,
            self.flood_pps,
            self.flood_sent,
            self.probes,
            self.lost_probes,
            self.owner_changes
        );
        for c in &self.speakers {
            s.push_str(&format!(
                "  {:<8} rss {:>6.1} MiB  cpu {:>5.2} % of a core\n",
                c.node, c.rss_mib, c.cpu_percent
            ));
        }
        s
    }
}

/// The (utime + stime) of `pid`, in clock ticks, and its resident memory in KiB.
pub(crate) fn proc_usage(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some((utime + stime, rss_kib))
}

/// Runs the soak with the daemons `make_daemons` starts in the lab.
pub fn run(
    options: &Options,
    make_daemons: &dyn Fn(&mut Lab) -> Result<Box<dyn Daemons>>,
    progress: &mut dyn FnMut(&str),
) -> Result<Report> {
    let (mut lab, workers, mut daemons) =
        crate::failover::start_lab(options.nodes, options.loss, make_daemons)?;
    let prober = Prober::start(
        &lab.client_netns,
        SocketAddr::from((netns::vip_v4(0), PROBE_PORT)),
        Duration::from_millis(10),
    )?;
    let owner = match crate::failover::settle(&lab, daemons.as_mut(), &prober, progress)? {
        Ok(settled) => settled.owner,
        Err(reason) => anyhow::bail!(
            "the lab did not converge within {:?} ({reason}); nothing watched",
            crate::failover::CONVERGE_LIMIT
        ),
    };
    progress(&format!(
        "{owner} owns the VIP; watching for {:?}",
        options.duration
    ));
    let pids: Vec<(String, u32)> = (1..=options.nodes)
        .filter_map(|i| {
            daemons
                .pid(&mut lab, i)
                .map(|p| (lab.node(i).name.clone(), p))
        })
        .collect();
    let before: Vec<Option<(u64, u64)>> = pids.iter().map(|(_, p)| proc_usage(*p)).collect();
    let flooder = if options.flood_pps > 0 {
        Some(Flood::start(
            &lab,
            FloodKind::Frames,
            options.flood_pps,
            None,
        )?)
    } else {
        None
    };
    let skip = prober.snapshot().len();
    let started = Instant::now();
    std::thread::sleep(options.duration);
    let elapsed = started.elapsed();
    let after: Vec<Option<(u64, u64)>> = pids.iter().map(|(_, p)| proc_usage(*p)).collect();
    let flood_sent = flooder.map_or(0, Flood::stop);
    let records = prober.stop();
    // The newest probes may still be in flight.
    let watched = &records[skip.min(records.len())..records.len().saturating_sub(5)];
    // /proc reports CPU time in USER_HZ ticks, 100 per second on Linux on every architecture.
    let ticks_per_s = 100.0;
    let speakers = pids
        .iter()
        .zip(before.iter().zip(after.iter()))
        .filter_map(|((node, _), (b, a))| {
            let (b, a) = (b.as_ref()?, a.as_ref()?);
            Some(SpeakerCost {
                node: node.clone(),
                rss_mib: a.1 as f64 / 1024.0,
                cpu_percent: (a.0.saturating_sub(b.0)) as f64 / ticks_per_s / elapsed.as_secs_f64()
                    * 100.0,
            })
        })
        .collect();
    drop(workers);
    lab.teardown();
    Ok(Report {
        implementation: options.implementation.as_str(),
        nodes: options.nodes,
        loss: options.loss,
        duration_s: elapsed.as_secs_f64(),
        flood_pps: options.flood_pps,
        flood_sent,
        probes: watched.len(),
        lost_probes: watched.iter().filter(|r| r.answer.is_none()).count(),
        owner_changes: probe::owner_changes(watched),
        speakers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_cpu_and_memory() {
        let (_, rss_kib) = proc_usage(std::process::id()).unwrap();
        assert!(rss_kib > 0);
        assert_eq!(proc_usage(u32::MAX), None);
    }
}
