//! `swimlb-lab handover`: moves decided by the Kubernetes API, measured from the client.
//!
//! A Service of `externalTrafficPolicy: Local` has its one ready endpoint on one node, so that
//! node owns its IP. Each trial moves the endpoint to the next node (a merge patch of the
//! EndpointSlice, as the endpoint slice controller writes when a Pod moves) while the client asks
//! "who has" the IP by ARP every 10 ms. Each speaker sees the change through its own API watch;
//! what the client saw in between is the trial's sample: how long two MACs answered (dual), how
//! long none did (dark), and when the new owner alone answered. `--busy N` runs N busy loops on
//! the machine throughout (the load under which the lab tests saw dual and dark answers);
//! `--starve NODE:PERCENT` puts one node's speaker in a cgroup limited to PERCENT of a core,
//! with a busy loop beside it, so that it sees every change late. A
//! trial is measured only when, before the patch, the old owner alone answered and every
//! speaker named it; after it every speaker must name the new owner within 10 s.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use serde_json::json;
use tokio::time::Instant;

use crate::chaos::driver::starve;
use crate::daemons::{Daemons, SwimlbDaemons};
use crate::kubelab::{self, APPS, Policy};
use crate::netns::{self, Lab};
use crate::probe::{self, ArpAnswers, ArpAsker, Worker};
use crate::trial::Percentiles;

/// The client's ARP interval.
pub const ARP_INTERVAL: Duration = Duration::from_millis(10);
/// Asked before the patch (the old owner alone must answer).
const BEFORE: Duration = Duration::from_millis(500);
/// Asked after the patch.
const AFTER: Duration = Duration::from_secs(3);
/// How long every speaker has to name the new owner.
const SETTLE_LIMIT: Duration = Duration::from_secs(10);
/// The Service moved.
const SERVICE: &str = "handover";

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Nodes in the lab.
    pub nodes: usize,
    /// Moves.
    pub trials: usize,
    /// Busy loops on the machine throughout.
    pub busy: usize,
    /// One node's speaker starved throughout: the node, and the share of a core (percent) its
    /// namespace's processes get, with one busy loop among them.
    pub starve: Option<(usize, u8)>,
    /// One node's traffic with the API server dropped around every move: the node, and for
    /// how long after the patch, so its watch delivers the move late.
    pub api_lag: Option<(usize, Duration)>,
}

/// One move as the client saw it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// The node the endpoint left.
    pub from: String,
    /// The node it moved to.
    pub to: String,
    /// From the patch to the first request answered by the new owner alone, after which the
    /// old owner never answered again.
    pub handover_ms: f64,
    /// From the first request after the patch answered by two MACs to one interval after the
    /// last (0: none).
    pub dual_ms: f64,
    /// The longest run of unanswered requests after the patch, times the interval.
    pub dark_ms: f64,
}

/// The run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Always `swimlb-kubernetes`.
    #[serde(rename = "impl")]
    pub implementation: &'static str,
    /// Nodes.
    pub nodes: usize,
    /// Busy loops.
    pub busy: usize,
    /// The node starved, with its share of a core in percent.
    pub starved: Option<(usize, u8)>,
    /// The node whose API traffic was dropped around each move, and for how long after the
    /// patch (ms).
    pub api_lag: Option<(usize, u64)>,
    /// The client's ARP interval, ms.
    pub arp_interval_ms: f64,
    /// Trials asked for.
    pub trials: usize,
    /// Trials not measured (the lab had not settled before, or did not after), with why.
    pub not_measured: Vec<String>,
    /// Every measured move.
    pub samples: Vec<Sample>,
    /// Of `dual_ms`.
    pub dual: Option<Percentiles>,
    /// Of `dark_ms`.
    pub dark: Option<Percentiles>,
    /// Of `handover_ms`.
    pub handover: Option<Percentiles>,
}

impl Report {
    /// The table the command prints.
    pub fn table(&self) -> String {
        let starved = self
            .starved
            .map(|(node, percent)| format!(", node{node} starved to {percent}% of a core"))
            .unwrap_or_default()
            + &self
                .api_lag
                .map(|(node, ms)| {
                    format!(", node{node} cut from the API server for {ms} ms at each move")
                })
                .unwrap_or_default();
        let mut s = format!(
            "handover ({}): {} nodes, {} busy loops{starved}, ARP every {} ms: {} of {} moves measured\n",
            self.implementation,
            self.nodes,
            self.busy,
            self.arp_interval_ms,
            self.samples.len(),
            self.trials
        );
        let row = |name: &str, p: &Option<Percentiles>, nonzero: usize| match p {
            Some(p) => format!(
                "  {name:<9} p50 {:>7.1} ms  p90 {:>7.1} ms  p99 {:>7.1} ms  max {:>7.1} ms  ({nonzero} moves with any)\n",
                p.p50, p.p90, p.p99, p.max
            ),
            None => format!("  {name:<9} -\n"),
        };
        let count = |f: fn(&Sample) -> f64| self.samples.iter().filter(|s| f(s) > 0.0).count();
        s += &row("dual", &self.dual, count(|s| s.dual_ms));
        s += &row("dark", &self.dark, count(|s| s.dark_ms));
        s += &row("handover", &self.handover, self.samples.len());
        for why in &self.not_measured {
            s += &format!("  not measured: {why}\n");
        }
        s
    }
}

/// Reads one move from the client's requests: `patch` is when the EndpointSlice was patched,
/// on the asker's clock. `Err` when the old owner did not answer alone before it, or the new
/// owner never answered alone for good after it.
pub fn sample(
    answers: &[ArpAnswers],
    patch: Duration,
    from: [u8; 6],
    to: [u8; 6],
    interval: Duration,
) -> Result<(f64, f64, f64), String> {
    let (before, after): (Vec<&ArpAnswers>, Vec<&ArpAnswers>) =
        answers.iter().partition(|a| a.at < patch);
    if before.iter().any(|a| a.macs.iter().any(|m| *m != from))
        || !before.iter().any(|a| a.macs.contains(&from))
    {
        return Err("before the move, the old owner did not answer alone".into());
    }
    let last_from = after.iter().rposition(|a| a.macs.contains(&from));
    let settled = after
        .iter()
        .enumerate()
        .skip(last_from.map_or(0, |i| i + 1))
        .find(|(_, a)| a.macs.len() == 1 && a.macs.contains(&to))
        .map(|(i, _)| i);
    let Some(settled) = settled else {
        return Err("after the move, the new owner did not answer alone for good".into());
    };
    if after[settled..]
        .iter()
        .any(|a| a.macs.iter().any(|m| *m != to))
    {
        return Err("after the move, another MAC answered after the new owner".into());
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let handover = ms(after[settled].at.saturating_sub(patch));
    let dual = ms(crate::probe::dual_span(after.iter().copied(), interval).1);
    let mut longest = 0;
    let mut run = 0;
    for a in &after[..settled] {
        run = if a.macs.is_empty() { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    Ok((handover, dual, ms(interval * longest)))
}

/// Busy loops, killed on drop.
struct Busy(Vec<Child>);

impl Busy {
    fn start(n: usize) -> Result<Busy> {
        let mut loops = Vec::new();
        for _ in 0..n {
            loops.push(
                Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .spawn()
                    .context("starting a busy loop")?,
            );
        }
        Ok(Busy(loops))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Drops (`true`) or passes again node `node`'s TCP traffic with the API server, both ways.
fn cut_api(lab: &Lab, node: usize, cut: bool) -> Result<()> {
    let netns = &lab.node(node).netns;
    let _ = lab.run_in(
        netns,
        "nft",
        &["delete", "table", "inet", "swimlb_lab_api_lag"],
    );
    if !cut {
        return Ok(());
    }
    let (ip, port) = (kubelab::API_ADDR.ip(), kubelab::API_ADDR.port());
    let rules = format!(
        "table inet swimlb_lab_api_lag {{\n  chain output {{ type filter hook output priority 0; ip daddr {ip} tcp dport {port} drop; }}\n  chain input {{ type filter hook input priority 0; ip saddr {ip} tcp sport {port} drop; }}\n}}\n"
    );
    netns::nft_apply(netns, &rules)
}

fn move_endpoint(daemons: &SwimlbDaemons, node: &str) -> Result<()> {
    let cluster = daemons.cluster().context("Kubernetes mode")?;
    let slice = json!({"endpoints": [{"addresses": ["203.0.113.30"], "nodeName": node,
        "conditions": {"ready": true, "serving": true, "terminating": false}}]});
    cluster.api().merge_patch(
        "discovery.k8s.io/v1",
        "EndpointSlice",
        Some(APPS),
        &format!("{SERVICE}-0"),
        slice,
        false,
    )?;
    Ok(())
}

/// The Kubernetes lab with the Service's one endpoint on node1, node1 owning its IP.
struct MoveLab {
    lab: Lab,
    _responders: Vec<Worker>,
    daemons: SwimlbDaemons,
    ip: Ipv4Addr,
    names: Vec<String>,
}

impl MoveLab {
    fn start(program: PathBuf, nodes: usize, progress: &mut dyn FnMut(&str)) -> Result<MoveLab> {
        let mut lab = Lab::create(nodes)?;
        let mut responders: Vec<Worker> = Vec::new();
        for node in &lab.nodes {
            responders.extend(probe::spawn_responder(&node.netns, &node.name)?);
        }
        progress("starting the control plane, the controller and the speakers");
        let mut daemons = SwimlbDaemons::kubernetes(&mut lab, program)?;
        for i in 1..=lab.nodes.len() {
            daemons.start(&mut lab, i)?;
        }
        let ip: Ipv4Addr = netns::vip_v4(1);
        let api = daemons.cluster().context("Kubernetes mode")?.api();
        api.create(kubelab::service(
            SERVICE,
            &ip.to_string(),
            Policy::Local,
            None,
        ))?;
        api.create(kubelab::endpoint_slice(SERVICE, 0, &["node1"]))?;
        kubelab::wait_for_owner(&lab, &ip.to_string(), Duration::from_secs(60), |o| {
            o == Some("node1")
        })
        .map_err(|views| anyhow::anyhow!("node1 never owned {ip}: {views:?}"))?;
        let names = lab.nodes.iter().map(|n| n.name.clone()).collect();
        Ok(MoveLab {
            lab,
            _responders: responders,
            daemons,
            ip,
            names,
        })
    }

    /// Moves the endpoint from node `from` to node `to` (0-based) as the client watches;
    /// `Ok(Err(why))`: not measured.
    fn one_move(
        &self,
        api_lag: Option<(usize, Duration)>,
        from: usize,
        to: usize,
    ) -> Result<Result<Sample, String>> {
        let (lab, ip) = (&self.lab, self.ip);
        let requests = ((BEFORE + AFTER).as_millis() / ARP_INTERVAL.as_millis()) as usize;
        let started = Instant::now();
        let asker = ArpAsker::start(&lab.client_netns, ip, ARP_INTERVAL, requests)?;
        std::thread::sleep(BEFORE);
        if let Some((node, _)) = api_lag {
            cut_api(lab, node, true)?;
        }
        let patch = started.elapsed();
        move_endpoint(&self.daemons, &self.names[to])?;
        let lag = api_lag.map_or(Duration::ZERO, |(_, lag)| lag.min(AFTER));
        std::thread::sleep(lag);
        if let Some((node, _)) = api_lag {
            cut_api(lab, node, false)?;
        }
        std::thread::sleep(AFTER - lag);
        let answers = asker.stop();
        let name = &self.names[to];
        if let Err(views) = kubelab::wait_for_owner(lab, &ip.to_string(), SETTLE_LIMIT, |o| {
            o == Some(name.as_str())
        }) {
            return Ok(Err(format!(
                "the speakers did not name {name} within {SETTLE_LIMIT:?}: {views:?}"
            )));
        }
        let (from_mac, to_mac) = (lab.nodes[from].mac, lab.nodes[to].mac);
        Ok(sample(&answers, patch, from_mac, to_mac, ARP_INTERVAL).map(
            |(handover_ms, dual_ms, dark_ms)| Sample {
                from: self.names[from].clone(),
                to: name.clone(),
                handover_ms,
                dual_ms,
                dark_ms,
            },
        ))
    }
}

/// Runs the trials on a fresh Kubernetes lab.
pub fn run(program: PathBuf, options: &Options, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    if options.nodes < 2 {
        bail!("--nodes {}: a move needs two nodes", options.nodes);
    }
    let nodes = 1..=options.nodes;
    for (flag, node) in [
        ("--starve", options.starve.map(|s| s.0)),
        ("--api-lag", options.api_lag.map(|l| l.0)),
    ] {
        if let Some(node) = node.filter(|n| !nodes.contains(n)) {
            bail!("{flag} node{node}: the lab has {} nodes", options.nodes);
        }
    }
    let mut moves = MoveLab::start(program, options.nodes, progress)?;
    progress(&format!(
        "{} owned by node1; {} busy loops; {} moves",
        moves.ip, options.busy, options.trials
    ));
    let busy = Busy::start(options.busy)?;
    let starved = match options.starve {
        Some((node, percent)) => Some(starve(&mut moves.lab, 0, node, 1, percent)?),
        None => None,
    };
    let mut samples = Vec::new();
    let mut not_measured = Vec::new();
    for trial in 1..=options.trials {
        let (from, to) = ((trial - 1) % options.nodes, trial % options.nodes);
        match moves.one_move(options.api_lag, from, to)? {
            Ok(s) => {
                progress(&format!(
                    "move {trial}: {} -> {}: new owner alone after {:.0} ms, dual {:.0} ms, dark {:.0} ms",
                    s.from, s.to, s.handover_ms, s.dual_ms, s.dark_ms
                ));
                samples.push(s);
            }
            Err(why) => not_measured.push(format!("move {trial} to {}: {why}", moves.names[to])),
        }
    }
    drop(busy);
    if let Some(starved) = starved {
        starved.stop(&mut moves.lab);
    }
    let MoveLab {
        mut lab,
        _responders,
        daemons,
        ..
    } = moves;
    // The daemons stop before their namespaces go.
    drop(daemons);
    drop(_responders);
    lab.teardown();
    let of = |f: fn(&Sample) -> f64| {
        let values: Vec<f64> = samples.iter().map(f).collect();
        (!values.is_empty()).then(|| crate::trial::percentiles(&values))
    };
    Ok(Report {
        implementation: "swimlb-kubernetes",
        nodes: options.nodes,
        busy: options.busy,
        starved: options.starve,
        api_lag: options
            .api_lag
            .map(|(node, lag)| (node, lag.as_millis() as u64)),
        arp_interval_ms: ARP_INTERVAL.as_secs_f64() * 1e3,
        trials: options.trials,
        not_measured,
        dual: of(|s| s.dual_ms),
        dark: of(|s| s.dark_ms),
        handover: of(|s| s.handover_ms),
        samples,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    const A: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 2];
    const MS: Duration = Duration::from_millis(10);

    fn answers(seq: &[&[[u8; 6]]]) -> Vec<ArpAnswers> {
        seq.iter()
            .enumerate()
            .map(|(i, macs)| ArpAnswers {
                at: MS * i as u32,
                macs: macs.iter().copied().collect::<BTreeSet<_>>(),
            })
            .collect()
    }

    #[test]
    fn a_move_with_two_dual_requests_and_no_dark_one() {
        let seq = answers(&[&[A], &[A], &[A], &[A, B], &[A, B], &[B], &[B]]);
        let (handover, dual, dark) = sample(&seq, MS * 2, A, B, MS).unwrap();
        assert_eq!((handover, dual, dark), (30.0, 20.0, 0.0));
    }

    #[test]
    fn a_move_with_a_dark_gap_counts_its_longest_run() {
        let seq = answers(&[&[A], &[A], &[], &[A], &[], &[], &[], &[B], &[B]]);
        let (handover, dual, dark) = sample(&seq, MS * 2, A, B, MS).unwrap();
        assert_eq!((handover, dual, dark), (50.0, 0.0, 30.0));
    }

    #[test]
    fn a_move_is_not_measured_when_the_lab_was_not_settled_or_flapped_after() {
        let unsettled = answers(&[&[A, B], &[A], &[B]]);
        assert!(sample(&unsettled, MS * 2, A, B, MS).is_err());
        let flapped = answers(&[&[A], &[B], &[A], &[B], &[B]]);
        // The old owner answered after the new one: measured from the last time it did.
        let (handover, _, _) = sample(&flapped, MS, A, B, MS).unwrap();
        assert_eq!(handover, 20.0);
        let stray = answers(&[&[A], &[B], &[B], &[[2, 0, 0, 0, 0, 9]]]);
        assert!(sample(&stray, MS, A, B, MS).is_err());
        let never = answers(&[&[A], &[A], &[]]);
        assert!(sample(&never, MS, A, B, MS).is_err());
    }
}
