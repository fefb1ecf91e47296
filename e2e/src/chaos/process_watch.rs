//! The daemons' processes over a chaos run: crashes found in their logs and exits, and their
//! resident memory for the leak check.

use std::collections::VecDeque;

use super::*;
use crate::upgrade::watch;

/// A daemon's memory is compared with its level this long after it started.
pub(super) const LEAK_BASELINE_AFTER: Duration = Duration::from_secs(60);
/// How much above that level is a leak.
pub(super) const LEAK_FACTOR: f64 = 1.10;

/// Crash and leak watch over the daemons' processes and logs.
#[derive(Debug, Default)]
pub(super) struct ProcessWatch {
    /// Log read offsets, by path.
    offsets: BTreeMap<PathBuf, u64>,
    /// Pids already reported gone.
    gone: BTreeSet<u32>,
    /// Nodes whose keepalived or MetalLB speaker was reported gone (until restarted).
    gone_nodes: BTreeSet<usize>,
    /// Real nodes: per node, the speaker container's pid last seen and the node's start time
    /// then (a new pid with no new start is a restart nobody asked for).
    real_pids: BTreeMap<usize, (u32, Duration)>,
    /// Real nodes: checks in a row that found no running speaker container.
    missed: BTreeMap<usize, u32>,
    /// Per pid: node, when it started, its baseline and last resident memory (KiB).
    memory: BTreeMap<u32, (usize, Duration, Option<u64>, u64)>,
    pub(super) found: Vec<Violation>,
}

impl ProcessWatch {
    pub(super) fn crash(&mut self, at: Duration, detail: String) {
        self.found.push(Violation {
            invariant: Invariant::Crash,
            at,
            vip: None,
            detail,
            excused: false,
        });
    }

    /// Reads the logs and `/proc`; `started[i]`: when node i+1's daemon last started.
    pub(super) fn check(
        &mut self,
        lab: &mut Lab,
        daemons: &mut ChaosDaemons,
        driver: &Driver,
        started: &[Duration],
        at: Duration,
        memory: bool,
    ) {
        for n in 1..=lab.nodes.len() {
            let name = lab.node(n).name.clone();
            match daemons {
                ChaosDaemons::Real(d) => {
                    if !driver.running[n - 1] {
                        self.gone_nodes.remove(&n);
                        continue;
                    }
                    let Some(pid) = d.pid(lab, n).filter(|p| *p > 0) else {
                        // Missed twice in a row: one `crictl` call may fail on a loaded machine.
                        let missed = self.missed.entry(n).or_insert(0);
                        *missed += 1;
                        if *missed >= 2
                            && at >= started[n - 1] + Duration::from_secs(2)
                            && self.gone_nodes.insert(n)
                        {
                            self.crash(at, format!("{name}'s speaker container is not running"));
                        }
                        continue;
                    };
                    self.gone_nodes.remove(&n);
                    self.missed.remove(&n);
                    if let Some((last, since)) = self.real_pids.insert(n, (pid, started[n - 1]))
                        && last != pid
                        && since == started[n - 1]
                    {
                        self.crash(
                            at,
                            format!("{name}'s speaker container restarted (pid {last}, now {pid})"),
                        );
                    }
                    self.remember(pid, n, started[n - 1], at, memory);
                }
                ChaosDaemons::Swimlb(d) => {
                    let log = d.log_path(lab, n);
                    for line in self.new_lines(&log) {
                        if line.contains("panicked") {
                            self.crash(at, format!("{name}'s speaker log: {}", line.trim()));
                        }
                    }
                    if !driver.running[n - 1] {
                        continue;
                    }
                    let Some(pid) = d.pid(lab, n) else { continue };
                    if !lab::proc_running(pid) {
                        if self.gone.insert(pid) {
                            self.crash(
                                at,
                                format!("{name}'s speaker (pid {pid}) exited unexpectedly"),
                            );
                        }
                        continue;
                    }
                    self.remember(pid, n, started[n - 1], at, memory);
                }
                ChaosDaemons::Keepalived(_) => {
                    if !driver.running[n - 1] {
                        self.gone_nodes.remove(&n);
                        continue;
                    }
                    // `ip netns exec` enters the namespace after the spawn: a daemon just
                    // started is not listed there yet.
                    if at < started[n - 1] + Duration::from_secs(2) {
                        continue;
                    }
                    let netns = lab.node(n).netns.clone();
                    if driver::netns_pids(&netns).is_empty() && self.gone_nodes.insert(n) {
                        self.crash(at, format!("{name}'s keepalived exited unexpectedly"));
                    }
                }
            }
        }
    }

    /// With `memory`: reads process `pid`'s (node `n`'s daemon, started at `started`)
    /// resident memory, its baseline once it has run [`LEAK_BASELINE_AFTER`].
    fn remember(&mut self, pid: u32, n: usize, started: Duration, at: Duration, memory: bool) {
        if memory && let Some((_, rss)) = lab::proc_usage(pid) {
            let entry = self.memory.entry(pid).or_insert((n, started, None, rss));
            entry.3 = rss;
            if entry.2.is_none() && at >= entry.1 + LEAK_BASELINE_AFTER {
                entry.2 = Some(rss);
            }
        }
    }

    fn new_lines(&mut self, path: &std::path::Path) -> Vec<String> {
        use std::io::{Read as _, Seek as _};
        let offset = self.offsets.entry(path.to_path_buf()).or_insert(0);
        let Ok(mut file) = std::fs::File::open(path) else {
            return Vec::new();
        };
        if file.seek(std::io::SeekFrom::Start(*offset)).is_err() {
            return Vec::new();
        }
        let mut text = String::new();
        // Bounded: at most 16 MiB per read.
        let _ = file.by_ref().take(16 << 20).read_to_string(&mut text);
        // Only whole lines.
        let whole = text.rfind('\n').map_or(0, |i| i + 1);
        *offset += whole as u64;
        text[..whole].lines().map(str::to_string).collect()
    }

    pub(super) fn leaks(&self, names: &[String], end: Duration) -> (Vec<Violation>, Vec<Memory>) {
        let mut found = Vec::new();
        let mut memory = Vec::new();
        for (pid, (node, _, baseline, last)) in &self.memory {
            let Some(baseline) = baseline else { continue };
            memory.push(Memory {
                node: names[node - 1].clone(),
                pid: *pid,
                baseline_kib: *baseline,
                last_kib: *last,
            });
            if *last as f64 > *baseline as f64 * LEAK_FACTOR {
                found.push(Violation {
                    invariant: Invariant::Leak,
                    at: end,
                    vip: None,
                    detail: format!(
                        "{}'s speaker (pid {pid}) grew from {baseline} KiB to {last} KiB",
                        names[node - 1]
                    ),
                    excused: false,
                });
            }
        }
        (found, memory)
    }
}

/// The machine's starvation of the speakers on real nodes, measured as the real-node upgrade's
/// observer measures it ([`crate::upgrade::watch`]): every [`STARVE_ROUND`] each speaker
/// thread's time waiting for a CPU (`schedstat`); a thread that waited
/// [`watch::STARVED`] (`M x I`, what a watcher waits) or more over the last two rounds puts a
/// `Starve` fault (no busy loops, no quota: the machine's own load) on its node between the two
/// reads, so the checker judges nothing settled until its settle time after it.
#[derive(Debug, Default)]
pub(super) struct StarveWatch {
    /// Per node (index 0 is node 1): the last two reads, when and what.
    waits: BTreeMap<usize, VecDeque<(Duration, watch::Waits)>>,
    /// The stretches found: node, from, to, the longest wait (ms).
    pub(super) found: Vec<(usize, Duration, Duration, f64)>,
}

/// How often [`StarveWatch`] reads the waits (a stall of `M x I` falls whole within two).
pub(super) const STARVE_ROUND: Duration = Duration::from_millis(100);
/// Two reads further apart than this are not judged.
const STARVE_SPAN: Duration = Duration::from_secs(1);

impl StarveWatch {
    /// Node `node`'s speaker threads' waits read at `at` ([`watch::thread_waits`]; none: the
    /// speaker does not run).
    pub(super) fn read(&mut self, node: usize, waits: Option<watch::Waits>, at: Duration) {
        let rounds = self.waits.entry(node).or_default();
        let Some(now) = waits else {
            rounds.clear();
            return;
        };
        // Reads further apart (the run was busy with a long step) sum a thread's waits over too
        // long a time to tell a stall: not judged.
        if let Some((before, then)) = rounds
            .front()
            .filter(|(b, _)| at.saturating_sub(*b) <= STARVE_SPAN)
        {
            let longest = now
                .iter()
                .filter_map(|(thread, w)| Some(w.saturating_sub(*then.get(thread)?)))
                .max()
                .map_or(Duration::ZERO, Duration::from_nanos);
            if longest >= watch::STARVED {
                let before = *before;
                let ms = longest.as_secs_f64() * 1e3;
                match self
                    .found
                    .iter_mut()
                    .rev()
                    .find(|s| s.0 == node && s.2 >= before)
                {
                    Some(open) => {
                        open.2 = at;
                        open.3 = open.3.max(ms);
                    }
                    None => self.found.push((node, before, at, ms)),
                }
            }
        }
        rounds.push_back((at, now));
        if rounds.len() > 2 {
            rounds.pop_front();
        }
    }

    /// The stretches as `Starve` faults numbered from `first` and their steps, for the checker.
    pub(super) fn faults(&self, first: usize) -> (Vec<Fault>, Vec<Executed>) {
        let mut faults = Vec::new();
        let mut executed = Vec::new();
        for (i, (node, from, to, _)) in self.found.iter().enumerate() {
            faults.push(Fault {
                at: *from,
                duration: to.saturating_sub(*from),
                kind: FaultKind::Starve {
                    node: *node,
                    busy_loops: 0,
                    quota_percent: 0,
                },
            });
            for (at, step) in [(*from, Step::Apply), (*to, Step::Undo)] {
                executed.push(Executed {
                    at,
                    began: at,
                    done: at,
                    fault: first + i,
                    step,
                });
            }
        }
        (faults, executed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waits(ms: u64) -> Option<watch::Waits> {
        Some(
            [((7, 7), ms * 1_000_000), ((7, 8), 0)]
                .into_iter()
                .collect(),
        )
    }

    #[test]
    fn a_thread_waiting_a_watchers_wait_over_two_rounds_is_a_starvation_between_the_reads() {
        let mut w = StarveWatch::default();
        let s = Duration::from_millis;
        w.read(1, waits(0), s(0));
        w.read(1, waits(40), s(100));
        w.read(1, waits(80), s(200));
        assert!(w.found.is_empty(), "80 ms over two rounds: {:?}", w.found);
        w.read(1, waits(190), s(300));
        w.read(1, waits(300), s(400));
        // From the read two rounds before the first starved one, to the last starved read.
        assert_eq!(w.found.len(), 1, "{:?}", w.found);
        assert_eq!((w.found[0].1, w.found[0].2), (s(100), s(400)));
        w.read(1, None, s(500));
        w.read(1, waits(0), s(600));
        w.read(1, waits(0), s(700));
        // Reads 5 s apart (a long step between them): 400 ms of waits in them is no stall.
        w.read(1, waits(0), s(5700));
        w.read(1, waits(400), s(10_700));
        assert_eq!(w.found.len(), 1, "{:?}", w.found);
        let (faults, steps) = w.faults(5);
        assert_eq!(faults.len(), 1);
        assert!(matches!(faults[0].kind, FaultKind::Starve { node: 1, .. }));
        let at: Vec<(Duration, usize)> = steps.iter().map(|e| (e.at, e.fault)).collect();
        assert_eq!(at, vec![(s(100), 5), (s(400), 5)]);
    }
}
