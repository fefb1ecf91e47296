//! The swimlb speakers' starvation during a switch: each node's speaker container process (its
//! host pid from `crictl`), its threads' time waiting for a CPU read every [`ROUND`]; a thread
//! that waited [`STARVED`] or more over two rounds puts a [`Starvation`] down, as the real-node
//! upgrade's observer does (`crate::upgrade::watch`). A starved owner is silent on the owner
//! watch and its next node takes its IPs over until it refutes (docs: open problems); a move
//! the report shows beside a measured starvation is that, not the switch.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::realnode::RealNode;
use crate::realnode::daemons::container_pid;
use crate::upgrade::watch::{STARVED, Waits, thread_waits};

/// How often the waits are read.
pub const ROUND: Duration = Duration::from_millis(100);

/// A stretch in which a node's speaker was starved.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Starvation {
    /// The node.
    pub node: String,
    /// From the read two rounds before the first starved read, to the last, ms since the
    /// switch started (negative: before it).
    pub from_ms: i64,
    pub to_ms: i64,
    /// The longest wait of one thread over two rounds, ms.
    pub longest_wait_ms: u64,
}

/// Reads the waits of the speakers on `nodes` every [`ROUND`] until `stop` is set (run it on a
/// scoped thread beside the switch); the starvations it saw, in order, times relative to `t0`.
pub fn watch(nodes: &[RealNode], t0: Instant, stop: &AtomicBool) -> Vec<Starvation> {
    let mut pids: Vec<Option<u32>> = vec![None; nodes.len()];
    let mut history: Vec<Vec<(Instant, Waits)>> = vec![Vec::new(); nodes.len()];
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let at = Instant::now();
        for (i, node) in nodes.iter().enumerate() {
            let alive = pids[i].is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
            if !alive {
                // The speaker's container starts during the switch (or was replaced).
                pids[i] = container_pid(node).ok().flatten();
                history[i].clear();
            }
            let Some(pid) = pids[i] else { continue };
            let now = thread_waits(pid);
            if let Some((before, then)) = history[i].first()
                && let Some(longest) = longest_wait(then, &now)
                && longest >= STARVED
            {
                note(&mut out, &node.name, *before, at, longest, t0);
            }
            history[i].push((at, now));
            if history[i].len() > 2 {
                history[i].remove(0);
            }
        }
        std::thread::sleep(ROUND);
    }
    out
}

/// The longest growth of one thread's wait from `then` to `now` (`None`: no thread in both).
fn longest_wait(then: &Waits, now: &Waits) -> Option<Duration> {
    now.iter()
        .filter_map(|(thread, w)| Some(w.saturating_sub(*then.get(thread)?)))
        .max()
        .map(Duration::from_nanos)
}

/// Puts node `node`'s starvation from `before` to `at` down: the stretch of that node that
/// reaches `before` grows, else a new one begins.
fn note(
    out: &mut Vec<Starvation>,
    node: &str,
    before: Instant,
    at: Instant,
    longest: Duration,
    t0: Instant,
) {
    let ms = |t: Instant| {
        if t >= t0 {
            t.duration_since(t0).as_millis() as i64
        } else {
            -(t0.duration_since(t).as_millis() as i64)
        }
    };
    let (from_ms, to_ms, wait) = (ms(before), ms(at), longest.as_millis() as u64);
    match out
        .iter_mut()
        .rev()
        .find(|s| s.node == node && s.to_ms >= from_ms)
    {
        Some(s) => {
            s.to_ms = to_ms;
            s.longest_wait_ms = s.longest_wait_ms.max(wait);
        }
        None => out.push(Starvation {
            node: node.to_string(),
            from_ms,
            to_ms,
            longest_wait_ms: wait,
        }),
    }
}

/// Whether answers by another node that began at `first_ms` follow a starvation: one that
/// reaches from at most `before` ahead of `first_ms` to it (a take-over comes [`STARVED`] after
/// the owner went silent, and the client follows its gratuitous ARP).
pub fn explains(starvations: &[Starvation], first_ms: u64, before: Duration) -> bool {
    let (from, first) = (first_ms as i64 - before.as_millis() as i64, first_ms as i64);
    starvations
        .iter()
        .any(|s| s.to_ms >= from && s.from_ms <= first)
}

/// The starts of the episodes in `sent` (sorted send times, ms, of the probes one node
/// answered): a new one after a gap longer than `gap`.
pub fn episodes(sent: &[u64], gap: Duration) -> Vec<u64> {
    let gap = gap.as_millis() as u64;
    let mut starts = Vec::new();
    let mut last: Option<u64> = None;
    for &t in sent {
        if last.is_none_or(|l| t.saturating_sub(l) > gap) {
            starts.push(t);
        }
        last = Some(t);
    }
    starts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_over_two_rounds_is_one_stretch_per_node_and_explains_the_answers_after_it() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut out = Vec::new();
        note(
            &mut out,
            "node3",
            at(1000),
            at(1200),
            Duration::from_millis(150),
            t0,
        );
        note(
            &mut out,
            "node3",
            at(1100),
            at(1300),
            Duration::from_millis(180),
            t0,
        );
        note(
            &mut out,
            "node2",
            at(1100),
            at(1300),
            Duration::from_millis(120),
            t0,
        );
        note(
            &mut out,
            "node3",
            at(5000),
            at(5200),
            Duration::from_millis(100),
            t0,
        );
        assert_eq!(out.len(), 3, "{out:?}");
        assert_eq!(
            (out[0].from_ms, out[0].to_ms, out[0].longest_wait_ms),
            (1000, 1300, 180)
        );
        let before = Duration::from_secs(1);
        assert!(explains(&out, 1500, before));
        assert!(explains(&out, 1100, before));
        assert!(!explains(&out, 900, before));
        assert!(!explains(&out, 2400, before));
        assert!(!explains(&[], 1500, before));
        let gap = Duration::from_secs(1);
        assert_eq!(
            episodes(&[100, 110, 900, 2000, 2010, 4000], gap),
            [100, 2000, 4000]
        );
        assert!(episodes(&[], gap).is_empty());
        let mut then = Waits::new();
        then.insert((1, 1), 5_000_000);
        let mut now = then.clone();
        now.insert((1, 1), 125_000_000);
        now.insert((1, 2), 900_000_000);
        assert_eq!(longest_wait(&then, &now), Some(Duration::from_millis(120)));
        assert_eq!(longest_wait(&Waits::new(), &now), None);
    }
}
