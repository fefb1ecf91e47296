//! `swimlb-lab soak`: the lab with no fault at all, for what must NOT happen and what the speaker
//! costs at rest.
//!
//! N nodes run swimlb (or keepalived, for comparison), optionally with random loss on every link and with a flood of non-ARP
//! frames at one node; the client probes the VIP the whole time and asks who has it by ARP every
//! 100 ms. The report counts owner changes (each one a false failover), lost probes, the seconds
//! in which two MACs answered ARP for the VIP, and each speaker's resident memory and CPU use,
//! read from `/proc` over the run. For swimlb it adds what the owner watch did over the run,
//! from the speakers' `/metrics`: its takeovers, confirmed or refuted, and how late its timers
//! fired (the p99).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;
use tokio::time::Instant;

use crate::daemons::Daemons;
use crate::daemons::Implementation;
use crate::flood::{Flood, FloodKind};
use crate::lab::{self, proc_usage};
use crate::netns::{self, Lab};
use crate::probe::{self, ArpAsker, PROBE_PORT, Prober};
use crate::rest;
use crate::scrape::{self, Sample};
use crate::trial;

/// How often the client asks who has the VIP by ARP.
pub const ARP_INTERVAL: Duration = Duration::from_millis(100);

/// The owner watch's takeovers counter, as scraped.
const TAKEOVERS: &str = "swimlb_owner_watch_takeovers_total";

/// The owner watch's timer lateness histogram (seconds).
const LATENESS: &str = "swimlb_owner_watch_timer_lateness_seconds";

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
    /// Also measure each daemon's threads: CPU, wake-ups, syscalls, datagrams ([`rest`]).
    pub threads: bool,
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

/// The owner watch's takeovers over the run, summed over the speakers, by how they ended.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Takeovers {
    /// The gossip confirmed the owner down.
    pub confirmed: u64,
    /// The owner was alive: it refuted the takeover.
    pub refuted: u64,
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
    /// Owner changes (false failovers: there was no fault). Kept for older readers of the
    /// JSON: always equal to `false_failovers`.
    pub owner_changes: usize,
    /// Owner changes, each one a false failover (there was no fault).
    pub false_failovers: usize,
    /// ARP requests for the VIP the client sent.
    pub arp_requests: usize,
    /// Distinct whole seconds of the run in which one ARP request for the VIP got replies from
    /// two different MACs.
    pub dual_answer_s: usize,
    /// The owner watch's takeovers over the run, summed over the speakers (zeros for
    /// keepalived, which has none).
    pub takeovers: Takeovers,
    /// The p99 of how late the owner watch's timers fired over the run, all speakers' buckets
    /// summed, ms: the upper bound of the bucket that holds it (the largest finite bound when
    /// only `+Inf` does). `None` for keepalived, or with no observation.
    pub timer_lateness_ms: Option<f64>,
    /// Speakers whose `/metrics` could not be read at the start or at the end of the run (their
    /// takeovers and lateness are missing from the figures above).
    pub metrics_unread: Vec<String>,
    /// Per speaker.
    pub speakers: Vec<SpeakerCost>,
    /// Speakers with no cost figure: no process at the start, or its process gone by the end
    /// (it exited or was restarted during the run).
    pub speakers_unsampled: Vec<String>,
    /// With `--threads`: each daemon's threads over the run (empty otherwise).
    pub rest: Vec<NodeRest>,
}

/// One daemon's threads over the run (`soak --threads`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NodeRest {
    /// Node name.
    pub node: String,
    /// Its processes' threads.
    #[serde(flatten)]
    pub rest: rest::ProcessRest,
    /// A swimlb speaker's datagrams per second, from its `/metrics` (`None` for the others,
    /// or unread).
    pub datagrams: Option<rest::Datagrams>,
}

impl Report {
    /// A few lines for the terminal.
    pub fn table(&self) -> String {
        let mut s = format!(
            "soak ({}): {} nodes, {}% loss, {:.0} s, flood {} fps at node1 ({} sent): {} probes, {} lost, {} owner changes (false failovers), {} s with two MACs answering ARP ({} requests), takeovers {} confirmed {} refuted, timer lateness p99 {}\n",
            self.implementation,
            self.nodes,
            self.loss,
            self.duration_s,
            self.flood_pps,
            self.flood_sent,
            self.probes,
            self.lost_probes,
            self.false_failovers,
            self.dual_answer_s,
            self.arp_requests,
            self.takeovers.confirmed,
            self.takeovers.refuted,
            self.timer_lateness_ms
                .map_or_else(|| "-".to_string(), |ms| format!("<= {ms:.2} ms")),
        );
        if !self.metrics_unread.is_empty() {
            s.push_str(&format!(
                "  /metrics unread (not in the owner watch figures): {}\n",
                self.metrics_unread.join(", ")
            ));
        }
        for c in &self.speakers {
            s.push_str(&format!(
                "  {:<8} rss {:>6.1} MiB  cpu {:>5.2} % of a core\n",
                c.node, c.rss_mib, c.cpu_percent
            ));
        }
        for r in &self.rest {
            s.push_str(&rest::table(&r.node, &r.rest, r.datagrams));
        }
        for node in &self.speakers_unsampled {
            s.push_str(&format!(
                "  {node:<8} not sampled: no speaker process at the start, or it exited or restarted during the run\n"
            ));
        }
        s
    }
}

/// Every node's `/metrics` answer read from the client, as samples, in node order (`None`: no
/// answer in 3 tries; with `--loss` a lost SYN fails one attempt).
fn scrape_nodes(lab: &Lab) -> Vec<Option<Vec<Sample>>> {
    lab::read_each(lab, lab::http_addrs(lab), "/metrics", 3, |text| {
        Some(scrape::samples(text))
    })
}

/// One speaker's `/metrics` samples at the start and at the end of the run (`None`: no answer).
#[derive(Debug, Clone, PartialEq)]
pub struct SpeakerMetrics {
    /// Node name.
    pub node: String,
    /// At the start of the run.
    pub before: Option<Vec<Sample>>,
    /// At the end of the run.
    pub after: Option<Vec<Sample>>,
}

/// What the owner watch did over the run, from each speaker's `/metrics`: the takeovers and the
/// p99 of the timer lateness (ms), both summed over the speakers read at both ends, and the
/// names of the others.
pub fn watch_figures(speakers: &[SpeakerMetrics]) -> (Takeovers, Option<f64>, Vec<String>) {
    let mut over_run: Vec<Sample> = Vec::new();
    let mut unread = Vec::new();
    for s in speakers {
        match (&s.before, &s.after) {
            (Some(before), Some(after)) => over_run.extend(scrape::since(before, after)),
            _ => unread.push(s.node.clone()),
        }
    }
    let count = |result: &str| scrape::sum(&over_run, TAKEOVERS, Some(("result", result))) as u64;
    let takeovers = Takeovers {
        confirmed: count("confirmed"),
        refuted: count("refuted"),
    };
    let buckets = scrape::buckets(&over_run, LATENESS);
    let p99 = scrape::quantile_bound(&buckets, 0.99).map(|bound| {
        if bound.is_finite() {
            bound
        } else {
            // Only `+Inf` holds it: say the largest finite bound, which it is at least.
            buckets
                .iter()
                .map(|(b, _)| *b)
                .filter(|b| b.is_finite())
                .fold(0.0, f64::max)
        }
    });
    // Whole microseconds: the bounds are 50 us x 2^k, and the product's last bits are noise.
    (takeovers, p99.map(|s| (s * 1e6).round() / 1e3), unread)
}

/// Every node's `/metrics` samples from `before` the run and now, in node order.
fn speaker_metrics(lab: &Lab, before: Vec<Option<Vec<Sample>>>) -> Vec<SpeakerMetrics> {
    let names = lab.nodes.iter().map(|n| n.name.clone());
    names
        .zip(before)
        .zip(scrape_nodes(lab))
        .map(|((node, before), after)| SpeakerMetrics {
            node,
            before,
            after,
        })
        .collect()
}

/// The `/proc` usage (CPU ticks, resident KiB) of all of `pids` summed; `None` when there is
/// none or one is gone.
fn usage_of(pids: &[u32]) -> Option<(u64, u64)> {
    if pids.is_empty() {
        return None;
    }
    pids.iter().try_fold((0, 0), |(cpu, rss), &p| {
        let (c, r) = proc_usage(p)?;
        Some((cpu + c, rss + r))
    })
}

/// The processes of node `index`'s daemon: swimlb's or MetalLB's speaker, or keepalived's
/// parent and its VRRP child (from their pid files: the lab spawned only the parent).
fn daemon_pids(
    implementation: Implementation,
    lab: &mut Lab,
    daemons: &mut dyn Daemons,
    index: usize,
) -> Vec<u32> {
    match implementation {
        Implementation::Keepalived | Implementation::KeepalivedFast => {
            let paths = crate::keepalived::Instance::paths(&lab.work_dir(), &lab.node(index).name);
            [paths.pid, paths.vrrp_pid]
                .iter()
                .filter_map(|p| std::fs::read_to_string(p).ok()?.trim().parse().ok())
                .collect()
        }
        _ => daemons.pid(lab, index).into_iter().collect(),
    }
}

/// Each daemon's memory at the end and CPU over `elapsed`, from its `/proc` usage `before` and
/// `after`; the nodes whose daemon is missing either come back apart.
fn speaker_costs(
    nodes: &[String],
    before: &[Option<(u64, u64)>],
    after: &[Option<(u64, u64)>],
    elapsed: Duration,
) -> (Vec<SpeakerCost>, Vec<String>) {
    // /proc reports CPU time in USER_HZ ticks, 100 per second on Linux on every architecture.
    let ticks_per_s = 100.0;
    let mut costs = Vec::new();
    let mut unsampled = Vec::new();
    for (node, (b, a)) in nodes.iter().zip(before.iter().zip(after.iter())) {
        match (b, a) {
            (Some(b), Some(a)) => costs.push(SpeakerCost {
                node: node.clone(),
                rss_mib: a.1 as f64 / 1024.0,
                cpu_percent: (a.0.saturating_sub(b.0)) as f64 / ticks_per_s / elapsed.as_secs_f64()
                    * 100.0,
            }),
            _ => unsampled.push(node.clone()),
        }
    }
    (costs, unsampled)
}

/// Whether the daemons are swimlb speakers (with `/metrics` to read).
fn is_swimlb(implementation: Implementation) -> bool {
    matches!(
        implementation,
        Implementation::Swimlb | Implementation::SwimlbKubernetes
    )
}

/// Runs the soak with the daemons `make_daemons` starts in the lab.
pub fn run(
    options: &Options,
    make_daemons: &dyn Fn(&mut Lab) -> Result<Box<dyn Daemons>>,
    progress: &mut dyn FnMut(&str),
) -> Result<Report> {
    let (mut lab, workers, mut daemons) =
        trial::start_lab(options.nodes, options.loss, make_daemons)?;
    daemons.wait_up(&lab)?;
    let prober = Prober::start(
        &lab.client_netns,
        SocketAddr::from((netns::vip_v4(0), PROBE_PORT)),
        Duration::from_millis(10),
    )?;
    let owner = match trial::settle(&lab, daemons.as_mut(), &prober, progress)? {
        Ok(settled) => settled.owner,
        Err(reason) => anyhow::bail!(
            "the lab did not converge within {:?} ({reason}); nothing watched",
            trial::CONVERGE_LIMIT
        ),
    };
    progress(&format!(
        "{owner} owns the VIP; watching for {:?}",
        options.duration
    ));
    let nodes: Vec<String> = (1..=options.nodes)
        .map(|i| lab.node(i).name.clone())
        .collect();
    let pids: Vec<Vec<u32>> = (1..=options.nodes)
        .map(|i| daemon_pids(options.implementation, &mut lab, daemons.as_mut(), i))
        .collect();
    let swimlb = is_swimlb(options.implementation);
    // Read before the CPU use is, so that the speakers' answers are not counted in it.
    let metrics_before = if swimlb {
        scrape_nodes(&lab)
    } else {
        Vec::new()
    };
    let before: Vec<Option<(u64, u64)>> = pids.iter().map(|p| usage_of(p)).collect();
    let threads_before = sample_threads(options.threads, &pids);
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
    let requests = usize::try_from(options.duration.as_millis() / ARP_INTERVAL.as_millis())
        .unwrap_or(usize::MAX)
        .saturating_add(1);
    let asker = ArpAsker::start(&lab.client_netns, netns::vip_v4(0), ARP_INTERVAL, requests)?;
    let skip = prober.snapshot().len();
    let started = Instant::now();
    std::thread::sleep(options.duration);
    let elapsed = started.elapsed();
    let arp_answers = asker.stop();
    let after: Vec<Option<(u64, u64)>> = pids.iter().map(|p| usage_of(p)).collect();
    let threads_after = sample_threads(options.threads, &pids);
    // The others' lists are empty: no takeovers, no lateness, nothing unread.
    let metrics = if swimlb {
        speaker_metrics(&lab, metrics_before)
    } else {
        Vec::new()
    };
    let (takeovers, timer_lateness_ms, metrics_unread) = watch_figures(&metrics);
    let rest = node_rest(&nodes, &threads_before, &threads_after, &metrics, elapsed);
    let flood_sent = flooder.map_or(0, Flood::stop);
    let records = prober.stop();
    // The newest probes may still be in flight.
    let watched = &records[skip.min(records.len())..records.len().saturating_sub(5)];
    let (speakers, speakers_unsampled) = speaker_costs(&nodes, &before, &after, elapsed);
    // The daemons stop before their namespaces go (the Kubernetes labs' kubelets and clients
    // live in them).
    drop(daemons);
    drop(workers);
    lab.teardown();
    let owner_changes = probe::owner_changes(watched);
    Ok(Report {
        implementation: options.implementation.as_str(),
        nodes: options.nodes,
        loss: options.loss,
        duration_s: elapsed.as_secs_f64(),
        flood_pps: options.flood_pps,
        flood_sent,
        probes: watched.len(),
        lost_probes: watched.iter().filter(|r| r.answer.is_none()).count(),
        owner_changes,
        false_failovers: owner_changes,
        arp_requests: arp_answers.len(),
        dual_answer_s: probe::dual_answer_seconds(&arp_answers),
        takeovers,
        timer_lateness_ms,
        metrics_unread,
        speakers,
        speakers_unsampled,
        rest,
    })
}

/// Each daemon's thread counters now, when `wanted` (`soak --threads`).
fn sample_threads(wanted: bool, pids: &[Vec<u32>]) -> Vec<Option<Vec<rest::ProcessCounters>>> {
    pids.iter()
        .map(|p| wanted.then(|| rest::sample_all(p)).flatten())
        .collect()
}

/// Each daemon's threads over the run, with a swimlb speaker's datagrams from `metrics` (empty
/// for the others); nodes sampled at only one end are left out (they are named unsampled).
fn node_rest(
    nodes: &[String],
    before: &[Option<Vec<rest::ProcessCounters>>],
    after: &[Option<Vec<rest::ProcessCounters>>],
    metrics: &[SpeakerMetrics],
    elapsed: Duration,
) -> Vec<NodeRest> {
    let mut out = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let (Some(Some(b)), Some(Some(a))) = (before.get(i), after.get(i)) else {
            continue;
        };
        let datagrams = metrics.get(i).and_then(|m| match (&m.before, &m.after) {
            (Some(b), Some(a)) => Some(rest::Datagrams::from_gained(&scrape::since(b, a), elapsed)),
            _ => None,
        });
        out.push(NodeRest {
            node: node.clone(),
            rest: rest::over_run(b, a, elapsed),
            datagrams,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_speaker_gone_by_the_end_is_named_not_dropped() {
        let nodes = ["node1", "node2", "node3"].map(String::from);
        let before = [Some((100, 1024)), Some((100, 1024)), None];
        let after = [None, Some((400, 2048)), Some((400, 2048))];
        let (costs, unsampled) = speaker_costs(&nodes, &before, &after, Duration::from_secs(10));
        assert_eq!(unsampled, ["node1", "node3"]);
        assert_eq!(costs.len(), 1);
        assert_eq!(costs[0].node, "node2");
        assert_eq!(costs[0].rss_mib, 2.0);
        assert!((costs[0].cpu_percent - 30.0).abs() < 1e-9);
    }

    #[test]
    fn reads_its_own_cpu_and_memory() {
        let (_, rss_kib) = proc_usage(std::process::id()).unwrap();
        assert!(rss_kib > 0);
        assert_eq!(proc_usage(u32::MAX), None);
    }

    /// A speaker's owner watch series: its takeovers and its lateness buckets (0.1, 0.2, 0.4 ms).
    fn watch(confirmed: u64, refuted: u64, buckets: [u64; 3]) -> Option<Vec<Sample>> {
        let [a, b, c] = buckets;
        Some(scrape::samples(&format!(
            "swimlb_owner_watch_takeovers_total{{result=\"confirmed\"}} {confirmed}\n\
             swimlb_owner_watch_takeovers_total{{result=\"refuted\"}} {refuted}\n\
             swimlb_owner_watch_timer_lateness_seconds_bucket{{le=\"0.0001\"}} {a}\n\
             swimlb_owner_watch_timer_lateness_seconds_bucket{{le=\"0.0002\"}} {b}\n\
             swimlb_owner_watch_timer_lateness_seconds_bucket{{le=\"0.0004\"}} {c}\n\
             swimlb_owner_watch_timer_lateness_seconds_bucket{{le=\"+Inf\"}} {c}\n"
        )))
    }

    fn speaker(
        node: &str,
        before: Option<Vec<Sample>>,
        after: Option<Vec<Sample>>,
    ) -> SpeakerMetrics {
        SpeakerMetrics {
            node: node.to_string(),
            before,
            after,
        }
    }

    #[test]
    fn the_watch_figures_count_the_run_only_summed_over_the_speakers_read_twice() {
        let speakers = vec![
            // Before the run: one takeover at start-up and 1000 timers, none counted.
            speaker(
                "node1",
                watch(1, 0, [1000, 1000, 1000]),
                watch(1, 2, [1090, 1098, 1100]),
            ),
            speaker("node2", watch(0, 0, [0; 3]), watch(1, 0, [50, 60, 100])),
            speaker("node3", watch(0, 0, [0; 3]), None),
        ];
        let (takeovers, p99, unread) = watch_figures(&speakers);
        assert_eq!(
            takeovers,
            Takeovers {
                confirmed: 1,
                refuted: 2
            }
        );
        // 200 timers over the run, 158 within 0.2 ms: the 198th is in the 0.4 ms bucket.
        assert_eq!(p99, Some(0.4));
        assert_eq!(unread, ["node3"]);
    }

    #[test]
    fn no_timer_no_lateness_and_the_inf_bucket_says_the_largest_finite_bound() {
        let idle = vec![speaker("node1", watch(0, 0, [0; 3]), watch(0, 0, [0; 3]))];
        assert_eq!(watch_figures(&idle).1, None);
        let late = scrape::samples(
            "swimlb_owner_watch_timer_lateness_seconds_bucket{le=\"0.8192\"} 1\n\
             swimlb_owner_watch_timer_lateness_seconds_bucket{le=\"+Inf\"} 100\n",
        );
        let late = vec![speaker("node1", Some(Vec::new()), Some(late))];
        assert_eq!(watch_figures(&late).1, Some(819.2));
    }
}
