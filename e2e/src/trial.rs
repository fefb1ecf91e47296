//! The plumbing every fault scenario shares (`failover`, `pause`, `soak`, `chaos`, the demo):
//! a lab with responders and daemons, the wait until it has converged on the rule's owner, and
//! the figures read from the prober's records.

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use tokio::time::Instant;

use crate::converge;
use crate::daemons::Daemons;
use crate::netns::Lab;
use crate::probe::{self, Prober, Worker};

/// Waits until every answered probe among the last `steady` came from one node, and at least
/// half of them were answered; returns that node.
pub fn wait_for_steady_owner(prober: &Prober, steady: usize, limit: Duration) -> Result<String> {
    let deadline = Instant::now() + limit;
    loop {
        let records = prober.snapshot();
        // Ignore the newest few: their answers may still be in flight.
        let settled = records.len().saturating_sub(3);
        if settled >= steady {
            // Lost probes (with `--loss`) do not break steadiness; another node answering does.
            let window = &records[settled - steady..settled];
            let mut answers = window
                .iter()
                .filter_map(|r| r.answer.as_ref().map(|(n, _)| n));
            if let Some(first) = answers.next() {
                let answered = window.iter().filter(|r| r.answer.is_some()).count();
                if answered * 2 >= steady && answers.all(|n| n == first) {
                    return Ok(first.clone());
                }
            }
        }
        if Instant::now() > deadline {
            bail!("no node answered the VIP steadily within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `prober` (every 10 ms, at most `limit` after `fault`) until a node other than `owner`
/// answers; the failover it measured, or `None` when nobody took over in time.
pub fn wait_failover(
    prober: &Prober,
    fault: Instant,
    owner: &str,
    limit: Duration,
) -> Option<probe::FailoverSample> {
    let deadline = fault + limit;
    loop {
        if let Some(s) = probe::failover(&prober.snapshot(), fault, owner) {
            return Some(s);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How long a trial (or the demo) waits for the lab to converge before it is reported as failed.
pub const CONVERGE_LIMIT: Duration = Duration::from_secs(60);

/// A lab ready for its fault, as [`settle`] leaves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// The owner to fault: the node that owns the VIP right now.
    pub owner: String,
    /// Its 1-based index.
    pub index: usize,
    /// Owner changes seen after the lab first converged (a fault was not in progress).
    pub false_failovers: usize,
}

/// A lab of `nodes` nodes with a probe responder on each, `loss` percent random loss on
/// every node link, and the daemons of `make_daemons` started on every node (the common start
/// of `failover`, `pause` and `soak`). The responders answer while their workers live.
pub fn start_lab(
    nodes: usize,
    loss: u8,
    make_daemons: &dyn Fn(&mut Lab) -> Result<Box<dyn Daemons>>,
) -> Result<(Lab, Vec<Worker>, Box<dyn Daemons>)> {
    let mut lab = Lab::create(nodes).context("building the lab")?;
    let mut responders: Vec<Worker> = Vec::new();
    for node in lab.nodes.clone() {
        responders.extend(probe::spawn_responder(&node.netns, &node.name)?);
    }
    if loss > 0 {
        for i in 1..=nodes {
            lab.set_loss(i, loss)?;
        }
    }
    let mut daemons = make_daemons(&mut lab)?;
    for i in 1..=nodes {
        daemons.start(&mut lab, i)?;
    }
    Ok((lab, responders, daemons))
}

/// Waits (at most [`CONVERGE_LIMIT`]) for the lab to converge on the owner the election rule
/// names ([`Daemons::expected_owner`]), holds a quiet second, and re-checks right before
/// returning, so the caller faults the node that owns the VIP at fault time. An owner that moved
/// in between counts as false failovers, and the wait starts over.
/// `Ok(Err(reason))`: the lab did not converge in time; the trial must not be measured.
pub fn settle(
    lab: &Lab,
    daemons: &mut dyn Daemons,
    prober: &Prober,
    progress: &mut dyn FnMut(&str),
) -> Result<Result<Settled, converge::NotConverged>> {
    let deadline = Instant::now() + CONVERGE_LIMIT;
    let mut first_converged: Option<usize> = None;
    let mut told_misplaced = false;
    loop {
        let limit = deadline.saturating_duration_since(Instant::now());
        let converged = match converge::wait(lab, daemons, prober, limit, progress)? {
            Ok(c) => c,
            Err(reason) => return Ok(Err(reason)),
        };
        // A lab that converged on another node than the rule's is not the lab a user would
        // have: wait for the rule's owner (preemption), and fail the trial if it never comes.
        let expected = daemons.expected_owner(lab);
        if let Err(misplaced) = converge::placed(&converged.owner, expected.as_deref()) {
            if Instant::now() >= deadline {
                return Ok(Err(misplaced));
            }
            if !told_misplaced {
                progress(&format!("  {misplaced}; waiting for it to move"));
                told_misplaced = true;
            }
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        let since = *first_converged.get_or_insert(converged.since);
        // A quiet second with the converged owner, then the re-check right before the fault.
        std::thread::sleep(Duration::from_secs(1));
        let views = daemons.views(lab);
        let records = prober.snapshot();
        let answers = converge::answers(&records[converged.since.min(records.len())..]);
        let changes = probe::owner_changes(&records[since.min(records.len())..]);
        match converge::confirm(&lab.nodes, &converged.owner, &views, &answers) {
            Ok(()) => {
                return Ok(Ok(Settled {
                    owner: converged.owner,
                    index: converged.index,
                    false_failovers: changes,
                }));
            }
            Err(reason) => progress(&format!(
                "  {} no longer holds the VIP alone before the fault ({reason}); waiting again",
                converged.owner
            )),
        }
    }
}

/// The node that answered the first probe after `fault`, other than `owner`.
pub fn first_other_answer(
    records: &[probe::ProbeRecord],
    fault: Instant,
    owner: &str,
) -> Option<String> {
    records
        .iter()
        .filter_map(|r| r.answer.as_ref())
        .filter(|(n, at)| *at >= fault && n != owner)
        .min_by_key(|(_, at)| *at)
        .map(|(n, _)| n.clone())
}

/// Percentiles of a sample set.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

/// Nearest-rank percentiles of `values`.
pub fn percentiles(values: &[f64]) -> Percentiles {
    if values.is_empty() {
        return Percentiles::default();
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = |p: f64| {
        let i = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
        sorted[i.clamp(1, sorted.len()) - 1]
    };
    Percentiles {
        p50: rank(50.0),
        p90: rank(90.0),
        p99: rank(99.0),
        max: sorted[sorted.len() - 1],
    }
}
