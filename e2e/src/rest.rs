//! What a daemon's threads do at rest: CPU, wake-ups and syscalls per thread and per process,
//! from `/proc` alone, sampled at the start and at the end of a run (`soak --threads`).
//!
//! Per thread: the time on a CPU from `/proc/PID/task/TID/schedstat` (nanoseconds, so a thread
//! at a hundredth of a percent still shows), its wake-ups, the voluntary context switches of
//! `/proc/PID/task/TID/status` (a thread blocked in a wait that wakes and blocks again switches
//! out once per wake-up), and apart from them its involuntary switches (preempted while it ran:
//! they grow with the machine's load, not with the thread's work; the book's earliest figures
//! counted the two together as wake-ups). Per process: `syscr` + `syscw` of
//! `/proc/PID/io`, the read and write calls only, a floor of its syscalls (no `perf` here).
//! Threads are matched by id between the two samples; one that started or ended in between is
//! counted from zero or left out.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

/// One thread's counters at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadCounters {
    /// Its name (`comm`).
    pub name: String,
    /// Nanoseconds on a CPU.
    pub cpu_ns: u64,
    /// Voluntary context switches: the thread blocked (each a wake-up once it runs again).
    pub switches: u64,
    /// Involuntary context switches: the thread was preempted.
    pub preempted: u64,
}

/// One process's counters at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProcessCounters {
    /// Per thread id.
    pub threads: BTreeMap<u32, ThreadCounters>,
    /// `syscr + syscw` (`None`: `/proc/PID/io` unreadable).
    pub rw_syscalls: Option<u64>,
}

/// One thread's (or one name's) figures over a run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ThreadRest {
    /// Thread name; threads of one name (a runtime's workers) are summed, `xN` says how many.
    pub name: String,
    /// Threads of that name.
    pub threads: usize,
    /// CPU, percent of one core.
    pub cpu_percent: f64,
    /// Voluntary context switches (wake-ups) per second.
    pub wakeups_per_s: f64,
    /// Involuntary context switches (preemptions) per second.
    pub preempted_per_s: f64,
}

/// One daemon's figures over a run: its processes' threads, summed by name.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct ProcessRest {
    /// By thread name, the dearest in CPU first.
    pub threads: Vec<ThreadRest>,
    /// Wake-ups per second, all threads.
    pub wakeups_per_s: f64,
    /// Preemptions per second, all threads.
    pub preempted_per_s: f64,
    /// CPU, percent of one core, all threads (schedstat: finer than the ticks of `stat`).
    pub cpu_percent: f64,
    /// Read and write syscalls per second (a floor of all syscalls); `None` when unreadable.
    pub rw_syscalls_per_s: Option<f64>,
}

/// The number after `key` on its line of a `/proc/.../status` text.
fn status_field(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .trim()
        .trim_start_matches(':')
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A thread's counters from the texts of its `comm`, `schedstat` and `status`.
pub fn parse_thread(comm: &str, schedstat: &str, status: &str) -> Option<ThreadCounters> {
    let cpu_ns = schedstat.split_whitespace().next()?.parse().ok()?;
    let voluntary = status_field(status, "voluntary_ctxt_switches")?;
    let involuntary = status_field(status, "nonvoluntary_ctxt_switches")?;
    Some(ThreadCounters {
        name: comm.trim().to_string(),
        cpu_ns,
        switches: voluntary,
        preempted: involuntary,
    })
}

/// `syscr + syscw` from the text of `/proc/PID/io`.
pub fn parse_io(io: &str) -> Option<u64> {
    Some(status_field(io, "syscr")? + status_field(io, "syscw")?)
}

/// Reads process `pid`'s counters now; `None` when it is gone.
pub fn sample(pid: u32) -> Option<ProcessCounters> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut threads = BTreeMap::new();
    for entry in dir.flatten() {
        let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let path = entry.path();
        let read = |file: &str| std::fs::read_to_string(path.join(file)).ok();
        if let (Some(comm), Some(schedstat), Some(status)) =
            (read("comm"), read("schedstat"), read("status"))
            && let Some(t) = parse_thread(&comm, &schedstat, &status)
        {
            threads.insert(tid, t);
        }
    }
    let rw_syscalls = std::fs::read_to_string(format!("/proc/{pid}/io"))
        .ok()
        .and_then(|io| parse_io(&io));
    Some(ProcessCounters {
        threads,
        rw_syscalls,
    })
}

/// Samples every process of `pids`; `None` when any is gone.
pub fn sample_all(pids: &[u32]) -> Option<Vec<ProcessCounters>> {
    pids.iter().map(|&p| sample(p)).collect()
}

/// What one daemon's processes did between `before` and `after` (the same processes, in the
/// same order), over `elapsed`.
pub fn over_run(
    before: &[ProcessCounters],
    after: &[ProcessCounters],
    elapsed: Duration,
) -> ProcessRest {
    let secs = elapsed.as_secs_f64().max(1e-9);
    let mut by_name: BTreeMap<String, (usize, u64, u64, u64)> = BTreeMap::new();
    let mut syscalls = Some(0u64);
    for (b, a) in before.iter().zip(after) {
        for (tid, t) in &a.threads {
            let (cpu0, sw0, pre0) = b
                .threads
                .get(tid)
                .map_or((0, 0, 0), |o| (o.cpu_ns, o.switches, o.preempted));
            let e = by_name.entry(t.name.clone()).or_default();
            e.0 += 1;
            e.1 += t.cpu_ns.saturating_sub(cpu0);
            e.2 += t.switches.saturating_sub(sw0);
            e.3 += t.preempted.saturating_sub(pre0);
        }
        syscalls = match (syscalls, b.rw_syscalls, a.rw_syscalls) {
            (Some(s), Some(b), Some(a)) => Some(s + a.saturating_sub(b)),
            _ => None,
        };
    }
    let mut threads: Vec<ThreadRest> = by_name
        .into_iter()
        .map(|(name, (n, cpu_ns, switches, preempted))| ThreadRest {
            name,
            threads: n,
            cpu_percent: cpu_ns as f64 / 1e9 / secs * 100.0,
            wakeups_per_s: switches as f64 / secs,
            preempted_per_s: preempted as f64 / secs,
        })
        .collect();
    threads.sort_by(|x, y| y.cpu_percent.total_cmp(&x.cpu_percent));
    ProcessRest {
        wakeups_per_s: threads.iter().map(|t| t.wakeups_per_s).sum(),
        preempted_per_s: threads.iter().map(|t| t.preempted_per_s).sum(),
        cpu_percent: threads.iter().map(|t| t.cpu_percent).sum(),
        threads,
        rw_syscalls_per_s: syscalls.map(|s| s as f64 / secs),
    }
}

/// The lines of one daemon's table, indented.
pub fn table(node: &str, rest: &ProcessRest, datagrams: Option<Datagrams>) -> String {
    let mut s = format!(
        "  {node:<8} threads: cpu {:>5.2} %  wake-ups {:>6.0}/s (+{:.0} preempted)  read+write syscalls {}",
        rest.cpu_percent,
        rest.wakeups_per_s,
        rest.preempted_per_s,
        rest.rw_syscalls_per_s
            .map_or_else(|| "-".to_string(), |v| format!("{v:.0}/s")),
    );
    if let Some(d) = datagrams {
        s.push_str(&format!(
            "  datagrams/s gossip {:.1} out {:.1} in, owner watch {:.1} out {:.1} in",
            d.gossip_out, d.gossip_in, d.watch_out, d.watch_in
        ));
    }
    s.push('\n');
    for t in &rest.threads {
        let name = if t.threads > 1 {
            format!("{} x{}", t.name, t.threads)
        } else {
            t.name.clone()
        };
        s.push_str(&format!(
            "    {name:<24} cpu {:>5.2} %  wake-ups {:>6.0}/s (+{:.0} preempted)\n",
            t.cpu_percent, t.wakeups_per_s, t.preempted_per_s
        ));
    }
    s
}

/// A speaker's datagrams per second over a run, from its own counters.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Default)]
pub struct Datagrams {
    /// Gossip sent.
    pub gossip_out: f64,
    /// Gossip received.
    pub gossip_in: f64,
    /// Owner watch sent.
    pub watch_out: f64,
    /// Owner watch received (admitted).
    pub watch_in: f64,
}

impl Datagrams {
    /// From one speaker's counters gained over the run (`scrape::since`), over `elapsed`.
    pub fn from_gained(gained: &[crate::scrape::Sample], elapsed: Duration) -> Datagrams {
        use crate::scrape::sum;
        let secs = elapsed.as_secs_f64().max(1e-9);
        let gossip = |d| {
            sum(
                gained,
                "swimlb_gossip_packets_total",
                Some(("direction", d)),
            ) / secs
        };
        Datagrams {
            gossip_out: gossip("out"),
            gossip_in: gossip("in"),
            watch_out: sum(gained, "swimlb_owner_watch_sent_total", None) / secs,
            watch_in: sum(gained, "swimlb_owner_watch_received_total", None) / secs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tresponder-eth0\nState:\tS (sleeping)\nvoluntary_ctxt_switches:\t1200\nnonvoluntary_ctxt_switches:\t34\n";

    #[test]
    fn parses_a_threads_files() {
        let t = parse_thread("responder-eth0\n", "123456789 2000 1234\n", STATUS).unwrap();
        assert_eq!(t.name, "responder-eth0");
        assert_eq!(t.cpu_ns, 123_456_789);
        assert_eq!((t.switches, t.preempted), (1200, 34));
        assert_eq!(parse_thread("x", "", STATUS), None);
        assert_eq!(parse_thread("x", "1 2 3", "Name: x\n"), None);
        let io = "rchar: 10\nwchar: 20\nsyscr: 7\nsyscw: 5\nread_bytes: 0\n";
        assert_eq!(parse_io(io), Some(12));
        assert_eq!(parse_io("rchar: 1\n"), None);
    }

    fn counters(threads: &[(u32, &str, u64, u64)], rw: Option<u64>) -> ProcessCounters {
        // Every tenth switch a preemption.
        ProcessCounters {
            threads: threads
                .iter()
                .map(|&(tid, name, cpu_ns, switches)| {
                    let name = name.to_string();
                    let preempted = switches / 10;
                    (
                        tid,
                        ThreadCounters {
                            name,
                            cpu_ns,
                            switches,
                            preempted,
                        },
                    )
                })
                .collect(),
            rw_syscalls: rw,
        }
    }

    #[test]
    fn sums_threads_by_name_and_counts_a_new_thread_from_zero() {
        let before = [counters(
            &[(1, "main", 0, 10), (2, "worker", 1_000_000, 100)],
            Some(100),
        )];
        let after = [counters(
            &[
                (1, "main", 0, 10),
                (2, "worker", 11_000_000, 300),
                (3, "worker", 10_000_000, 200),
            ],
            Some(1100),
        )];
        let rest = over_run(&before, &after, Duration::from_secs(10));
        assert_eq!(rest.threads[0].name, "worker");
        assert_eq!(rest.threads[0].threads, 2);
        // 20 ms of CPU over 10 s: 0.2 % of a core; 400 switches: 40/s.
        assert!((rest.threads[0].cpu_percent - 0.2).abs() < 1e-9);
        assert!((rest.threads[0].wakeups_per_s - 40.0).abs() < 1e-9);
        assert!((rest.threads[0].preempted_per_s - 4.0).abs() < 1e-9);
        assert_eq!(rest.threads[1].wakeups_per_s, 0.0);
        assert_eq!(rest.rw_syscalls_per_s, Some(100.0));
        let unreadable = [counters(&[], None)];
        assert_eq!(
            over_run(&unreadable, &unreadable, Duration::from_secs(1)).rw_syscalls_per_s,
            None
        );
    }

    #[test]
    fn samples_this_process_and_not_a_missing_one() {
        let own = sample(std::process::id()).unwrap();
        assert!(!own.threads.is_empty());
        assert!(own.threads.values().any(|t| t.cpu_ns > 0));
        assert_eq!(sample(u32::MAX), None);
    }
}
