//! What a rolling update of the speakers' DaemonSet does on real nodes, as the chaos checker
//! needs it: when each speaker stopped and started, read from the API server and the nodes'
//! processes, and what the speakers said meanwhile (`/status`, `/metrics`).
//!
//! One round ([`RollWatch::round`]) lists the speakers' Pods, then scans `/proc` for the
//! `swimlb-speaker` processes in each node's cgroup subtree, then reads every speaker's
//! `/status` (and, every [`METRICS_EVERY`] rounds, its `/metrics`). A speaker's stop is put
//! down ([`crate::migrate::checked::Timeline::apply`], a `Kill` of its node) from the last
//! round that listed its Pod not being deleted, its process running, which is before the
//! kubelet's SIGTERM (the kubelet stops a container only once its Pod is marked deleted), to
//! the first scan that found the process gone; its start, from the last scan without a process
//! to the first with one (the checker counts a daemon as started when that step is done, so
//! the new speaker gets its start-up grace from a moment after it really started). A process
//! that ends while its Pod is not being deleted is a crash.
//!
//! **Starvation.** A machine that runs other work beside the lab can leave a speaker without a
//! CPU for longer than a watcher waits (`M x I`, 100 ms by default): the others take it for
//! dead, take its addresses over and hand them back once it refutes, and for a moment the
//! speakers name different owners. That is the lab's fault, not the speakers'; the observer
//! measures it from outside. Each round reads every speaker thread's time spent runnable but
//! waiting for a CPU (`/proc/PID/task/TID/schedstat`, its second field) and, when one thread
//! waited [`STARVED`] or more over the last two rounds, puts a `Starve` fault on its node
//! between the reads, which the checker then knows as it knows the chaos lab's own
//! starvation: nothing is judged settled until [`crate::chaos::invariants::SETTLE`] after it,
//! while dark and dual are judged as before.

use std::collections::{BTreeMap, VecDeque};
use std::net::Ipv4Addr;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use swimlb_speaker::model::watch_knobs::{DEFAULT_INTERVAL, DEFAULT_MISSES};
use tokio::time::Instant;

use crate::chaos::schedule::FaultKind;
use crate::kube_client::Kube;
use crate::lab::{http_addrs, read_each};
use crate::migrate::checked::Timeline;
use crate::netns::Lab;

/// The speakers' namespace.
pub const NAMESPACE: &str = "swimlb-system";
/// The speakers' program, as `/proc/PID/comm` names it.
const PROGRAM: &str = "swimlb-speaker";
/// The variable the previous release's stand-in sets.
const ENV: &str = "SWIMLB_ENVELOPE_VERSION";
/// `/metrics` is read every this many rounds.
pub const METRICS_EVERY: usize = 5;
/// A speaker thread that waited this long for a CPU over the last two rounds was starved:
/// what a watcher waits by default (`M x I`), after which the others take the speaker for
/// dead. A round takes at least 100 ms (`M x I`), so a stall that long falls whole within two.
pub const STARVED: Duration =
    Duration::from_millis(DEFAULT_INTERVAL.as_millis() as u64 * DEFAULT_MISSES as u64);

/// Per thread (process id, thread id), its time waiting for a CPU, in nanoseconds.
pub type Waits = BTreeMap<(u32, u32), u64>;

/// A stretch of rounds in which a node's speaker was starved (see the module's documentation).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Starved {
    /// 1-based node.
    pub node: usize,
    /// From the read before the first starved round, since the observer started.
    pub from_s: f64,
    /// To the read that ended the last.
    pub to_s: f64,
    /// The longest wait one thread had over two rounds, in milliseconds.
    pub longest_wait_ms: f64,
}

/// A speaker process as `/proc` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Process {
    /// Its process id (as the machine sees it).
    pub pid: u32,
    /// The envelope version it was started with: `SWIMLB_ENVELOPE_VERSION` from its
    /// environment, else this build's.
    pub version: u8,
    /// Its Pod's uid, from its cgroup's path (`.../pod<uid>/<container>`).
    pub pod: Option<u128>,
}

/// One node's speaker between rounds.
#[derive(Debug, Clone, Copy)]
enum Speaker {
    /// Running; `clean`: the last round's start that listed its Pod not being deleted.
    Up { process: Process, clean: Instant },
    /// Its Pod is being deleted since at most `began`; the process still runs.
    Stopping { process: Process, began: Instant },
    /// No process since the fault `fault`; `empty`: the last scan that found none; `gone`:
    /// the process that ended (an exiting process can linger in `/proc` a moment, its
    /// environment already unreadable: it is not a new one).
    Down {
        fault: usize,
        empty: Instant,
        gone: u32,
    },
}

/// A speaker's Pod as one round listed it.
#[derive(Debug, Clone, Default)]
pub struct PodSeen {
    /// Its uid.
    pub uid: String,
    /// The uid as a number (as [`Process::pod`] has it).
    pub uid_number: Option<u128>,
    /// Its container's image.
    pub image: String,
    /// Being deleted.
    pub deleting: bool,
    /// Its Ready condition true.
    pub ready: bool,
    /// Its container's restarts.
    pub restarts: u64,
    /// Its `creationTimestamp`.
    pub created: String,
}

/// What each speaker said in one round: the owner it names for the VIP and the members it
/// sees (`None`: no answer).
pub type Views = Vec<Option<(Option<String>, usize)>>;

/// The observer of a roll; see the module's documentation.
#[derive(Debug)]
pub struct RollWatch {
    /// The faults and `/status` polls, for the checker.
    pub timeline: Timeline,
    speakers: Vec<Speaker>,
    roots: Vec<String>,
    vip: Ipv4Addr,
    rounds: usize,
    /// Per node, the envelope version of each speaker process it ran, in order.
    pub started: Vec<Vec<u8>>,
    /// Per node, the `swimlb_gossip_envelope_version` values its speakers reported, each
    /// change once, in order.
    pub mesh_versions: Vec<Vec<u8>>,
    /// Speakers that ended while their Pod was not being deleted.
    pub crashes: Vec<String>,
    /// The nodes in the order their speakers were stopped.
    pub stopped: Vec<usize>,
    /// The last round's Pod per node: the newest not being deleted, else the one being
    /// deleted.
    pub pods: Vec<Option<PodSeen>>,
    /// The last round's Pods per node, all of them.
    all_pods: Vec<Vec<PodSeen>>,
    /// See [`Views`].
    pub views: Views,
    /// Per node, the last `/metrics` read's envelope version.
    pub versions: Vec<Option<u8>>,
    /// What changed since the caller last took them (a line each), with `t0`.
    pub events: Vec<String>,
    /// The starvations measured, in order (a stretch of starved rounds each).
    pub starvations: Vec<Starved>,
    /// Per node, the last two rounds' waits and when they were read, the older first.
    waits: Vec<VecDeque<(Instant, Waits)>>,
    t0: Instant,
}

impl RollWatch {
    /// Starts watching at `t0` (every speaker running, as [`RollWatch::round`] must find
    /// them): `roots` are the nodes' cgroup subtrees, in the lab's order.
    pub fn start(t0: Instant, roots: Vec<String>, vip: Ipv4Addr) -> anyhow::Result<RollWatch> {
        let found = processes(&roots);
        RollWatch::with(t0, roots, &found, vip)
    }

    /// [`RollWatch::start`] with the processes `found` (one per node).
    fn with(
        t0: Instant,
        roots: Vec<String>,
        found: &[Vec<Process>],
        vip: Ipv4Addr,
    ) -> anyhow::Result<RollWatch> {
        let mut speakers = Vec::new();
        let mut started = Vec::new();
        for (i, p) in found.iter().enumerate() {
            let [process] = p.as_slice() else {
                anyhow::bail!("node{} runs {} speaker processes, not one", i + 1, p.len());
            };
            speakers.push(Speaker::Up {
                process: *process,
                clean: t0,
            });
            started.push(vec![process.version]);
        }
        let n = roots.len();
        Ok(RollWatch {
            timeline: Timeline::new(t0),
            speakers,
            roots,
            vip,
            rounds: 0,
            started,
            mesh_versions: vec![Vec::new(); n],
            crashes: Vec::new(),
            stopped: Vec::new(),
            pods: vec![None; n],
            all_pods: vec![Vec::new(); n],
            views: vec![None; n],
            versions: vec![None; n],
            events: Vec::new(),
            starvations: Vec::new(),
            waits: vec![VecDeque::new(); n],
            t0,
        })
    }

    /// One round (see the module's documentation).
    pub fn round(&mut self, lab: &Lab, admin: &Kube) {
        let listed = Instant::now();
        if let Ok(pods) = speaker_pods(admin, lab) {
            self.pods = pods.iter().map(|p| current(p).cloned()).collect();
            self.all_pods = pods;
        }
        let scanned = Instant::now();
        let found = processes(&self.roots);
        let waits = found
            .iter()
            .map(|procs| procs.iter().flat_map(|p| thread_waits(p.pid)).collect())
            .collect();
        self.starved(waits, Instant::now());
        self.scan(&found, listed, scanned);
        let at = Instant::now();
        let vip = self.vip.to_string();
        self.views = read_each(lab, http_addrs(lab), "/status", 1, move |body| {
            view(body, &vip)
        });
        let owners = self
            .views
            .iter()
            .map(|v| v.as_ref().map(|(owner, _)| owner.clone()))
            .collect();
        self.timeline.poll(at, Instant::now(), owners);
        if self.rounds.is_multiple_of(METRICS_EVERY) {
            self.versions = read_each(lab, http_addrs(lab), "/metrics", 1, envelope_version);
            for (seen, v) in self.mesh_versions.iter_mut().zip(&self.versions) {
                if let Some(v) = *v
                    && seen.last() != Some(&v)
                {
                    seen.push(v);
                }
            }
        }
        self.rounds += 1;
    }

    /// What a scan at `scanned` found (the processes per node), the Pods listed at `listed`.
    fn scan(&mut self, found: &[Vec<Process>], listed: Instant, scanned: Instant) {
        for (i, procs) in found.iter().enumerate() {
            // A process is known by its id: its environment may be unreadable as it exits.
            let pids: Vec<u32> = procs.iter().map(|p| p.pid).collect();
            let gone = match self.speakers[i] {
                Speaker::Down { gone, .. } => Some(gone),
                _ => None,
            };
            let new = procs.iter().find(|p| Some(p.pid) != gone).copied();
            self.step(i, &pids, new, listed, scanned);
        }
    }

    /// Node index `i`'s speaker, given the process ids a scan at `scanned` found there and
    /// the one among them that is not the process that last ended (`new`), its Pod listed at
    /// `listed`.
    fn step(
        &mut self,
        i: usize,
        pids: &[u32],
        new: Option<Process>,
        listed: Instant,
        scanned: Instant,
    ) {
        let node = i + 1;
        // Its own Pod being deleted (one not listed any more is gone: the API server removes
        // a Pod only once its containers stopped, so it is not this process's).
        let deleting = |process: &Process| match process.pod {
            Some(uid) => self.all_pods[i]
                .iter()
                .any(|p| p.uid_number == Some(uid) && p.deleting),
            None => self.pods[i].as_ref().is_none_or(|p| p.deleting),
        };
        self.speakers[i] = match self.speakers[i] {
            Speaker::Up { process, clean } if pids.contains(&process.pid) => {
                if deleting(&process) {
                    Speaker::Stopping {
                        process,
                        began: clean,
                    }
                } else {
                    Speaker::Up {
                        process,
                        clean: listed,
                    }
                }
            }
            Speaker::Up { process, clean } => {
                if !deleting(&process) {
                    self.crashes.push(format!(
                        "node{node}'s speaker (pid {}) ended while its Pod was not being deleted",
                        process.pid
                    ));
                }
                self.stop(node, process.pid, clean, scanned)
            }
            Speaker::Stopping { process, began } if !pids.contains(&process.pid) => {
                self.stop(node, process.pid, began, scanned)
            }
            stopping @ Speaker::Stopping { .. } => stopping,
            Speaker::Down { fault, empty, gone } => match new {
                None => Speaker::Down {
                    fault,
                    empty: scanned,
                    gone,
                },
                Some(process) => self.started_again(i, fault, empty, process, (listed, scanned)),
            },
        };
        // A new process found by the scan that saw the old one end: started at once.
        if let Speaker::Down { fault, gone, .. } = self.speakers[i]
            && let Some(process) = new.filter(|p| p.pid != gone)
        {
            self.speakers[i] = self.started_again(i, fault, scanned, process, (listed, scanned));
        }
    }

    /// The speaker threads' waits for a CPU per node, read at `at`: a node one of whose
    /// threads waited [`STARVED`] or more since the read two rounds ago (or the one before
    /// this, the first time) gets a `Starve` fault between the two reads (no busy loops, no
    /// quota: the machine's own load).
    fn starved(&mut self, waits: Vec<Waits>, at: Instant) {
        for (i, now) in waits.into_iter().enumerate() {
            let node = i + 1;
            if let Some((before, then)) = self.waits[i].front().cloned() {
                let longest = now
                    .iter()
                    .filter_map(|(thread, w)| Some(w.saturating_sub(*then.get(thread)?)))
                    .max()
                    .map_or(Duration::ZERO, Duration::from_nanos);
                if longest >= STARVED {
                    let kind = FaultKind::Starve {
                        node,
                        busy_loops: 0,
                        quota_percent: 0,
                    };
                    let fault = self.timeline.apply(kind, before, at);
                    self.timeline.undo(fault, at, at);
                    self.starved_between(node, before, at, longest);
                }
            }
            self.waits[i].push_back((at, now));
            if self.waits[i].len() > 2 {
                self.waits[i].pop_front();
            }
        }
    }

    /// Puts down node `node`'s starvation from `before` to `at` (a thread waited `longest`):
    /// the stretch that ended at or after `before` grows, else a new one begins (and is told).
    fn starved_between(&mut self, node: usize, before: Instant, at: Instant, longest: Duration) {
        let since = |t: Instant| t.saturating_duration_since(self.t0).as_secs_f64();
        let (from_s, to_s, wait_ms) = (since(before), since(at), longest.as_secs_f64() * 1e3);
        let open = self
            .starvations
            .iter_mut()
            .rev()
            .find(|s| s.node == node)
            .filter(|s| s.to_s >= from_s);
        match open {
            Some(s) => {
                s.to_s = to_s;
                s.longest_wait_ms = s.longest_wait_ms.max(wait_ms);
            }
            None => {
                self.events.push(format!(
                    "node{node}'s speaker starved: a thread waited {wait_ms:.0} ms for a CPU \
                     between {from_s:.2} s and {to_s:.2} s"
                ));
                self.starvations.push(Starved {
                    node,
                    from_s,
                    to_s,
                    longest_wait_ms: wait_ms,
                });
            }
        }
    }

    fn stop(&mut self, node: usize, gone: u32, began: Instant, done: Instant) -> Speaker {
        self.stopped.push(node);
        let fault = self.timeline.apply(FaultKind::Kill { node }, began, done);
        self.events.push(format!(
            "node{node}'s speaker stopped between {:.2} s and {:.2} s",
            began.saturating_duration_since(self.t0).as_secs_f64(),
            done.saturating_duration_since(self.t0).as_secs_f64()
        ));
        Speaker::Down {
            fault,
            empty: done,
            gone,
        }
    }

    /// Node index `i`'s new speaker `process`, found by the scan at `scanned` (the last scan
    /// without one at `empty`), the fault `fault` over.
    fn started_again(
        &mut self,
        i: usize,
        fault: usize,
        empty: Instant,
        process: Process,
        (listed, scanned): (Instant, Instant),
    ) -> Speaker {
        self.timeline.undo(fault, empty, scanned);
        self.started[i].push(process.version);
        self.events.push(format!(
            "node{}'s speaker started (pid {}, envelope version {}) between {:.2} s and {:.2} s",
            i + 1,
            process.pid,
            process.version,
            empty.saturating_duration_since(self.t0).as_secs_f64(),
            scanned.saturating_duration_since(self.t0).as_secs_f64()
        ));
        Speaker::Up {
            process,
            clean: listed,
        }
    }

    /// When the observer started (the checker's time 0).
    pub fn timeline_start(&self) -> Instant {
        self.t0
    }

    /// Each node's speaker as the observer has it.
    pub fn states(&self) -> String {
        format!("{:?}", self.speakers)
    }

    /// Whether every node's speaker runs, started with envelope version `version`.
    pub fn all_running(&self, version: u8) -> bool {
        self.speakers
            .iter()
            .all(|s| matches!(s, Speaker::Up { process, .. } if process.version == version))
    }
}

/// The owner a `/status` body names for `vip`, and the members it sees.
fn view(body: &str, vip: &str) -> Option<(Option<String>, usize)> {
    let v: Value = serde_json::from_str(body).ok()?;
    let owner = crate::chaos::owners_named(body, &[vip.parse().ok()?])?;
    Some((
        owner.into_iter().next().flatten(),
        v["members"].as_array()?.len(),
    ))
}

/// `swimlb_gossip_envelope_version` in a `/metrics` body.
pub fn envelope_version(body: &str) -> Option<u8> {
    body.lines()
        .find_map(|l| l.strip_prefix("swimlb_gossip_envelope_version "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|v| (0.0..=255.0).contains(v))
        .map(|v| v as u8)
}

/// The speakers' Pods per node, in the lab's order.
fn speaker_pods(admin: &Kube, lab: &Lab) -> anyhow::Result<Vec<Vec<PodSeen>>> {
    let pods = admin.list("v1", "Pod", Some(NAMESPACE))?;
    let mut by_node: BTreeMap<String, Vec<PodSeen>> = BTreeMap::new();
    for p in pods
        .iter()
        .filter(|p| p["metadata"]["labels"]["app.kubernetes.io/component"] == "speaker")
    {
        let uid = p["metadata"]["uid"].as_str().unwrap_or_default();
        let seen = PodSeen {
            uid: uid.into(),
            uid_number: uid_number(uid),
            created: p["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap_or_default()
                .into(),
            image: p["spec"]["containers"][0]["image"]
                .as_str()
                .unwrap_or_default()
                .into(),
            deleting: !p["metadata"]["deletionTimestamp"].is_null(),
            ready: p["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            }),
            restarts: p["status"]["containerStatuses"][0]["restartCount"]
                .as_u64()
                .unwrap_or_default(),
        };
        let node = p["spec"]["nodeName"].as_str().unwrap_or_default();
        by_node.entry(node.to_string()).or_default().push(seen);
    }
    Ok(lab
        .nodes
        .iter()
        .map(|n| by_node.remove(&n.name).unwrap_or_default())
        .collect())
}

/// A node's Pod that counts: the newest not being deleted, else one being deleted.
fn current(pods: &[PodSeen]) -> Option<&PodSeen> {
    pods.iter()
        .filter(|p| !p.deleting)
        .max_by(|a, b| a.created.cmp(&b.created))
        .or_else(|| pods.first())
}

/// A Pod's uid (`8-4-4-4-12` hexadecimal digits, or with `_` as a systemd cgroup names it) as
/// a number.
fn uid_number(uid: &str) -> Option<u128> {
    let digits: String = uid.chars().filter(|c| *c != '-' && *c != '_').collect();
    (digits.len() == 32)
        .then(|| u128::from_str_radix(&digits, 16).ok())
        .flatten()
}

/// The Pod uid in a `/proc/PID/cgroup` text (a path segment `pod<uid>`, or
/// `kubepods-...-pod<uid>.slice` with the systemd driver).
fn pod_in_cgroup(cgroup: &str) -> Option<u128> {
    cgroup
        .split(['/', '\n'])
        .filter_map(|seg| seg.rsplit_once("pod").map(|(_, rest)| rest))
        .find_map(|rest| uid_number(rest.trim_end_matches(".slice")))
}

/// Per cgroup subtree in `roots`, the speaker processes in it.
pub fn processes(roots: &[String]) -> Vec<Vec<Process>> {
    let mut found = vec![Vec::new(); roots.len()];
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim_end() != PROGRAM {
            continue;
        }
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let Some(node) = roots.iter().position(|r| cgroup.contains(&format!("{r}/"))) else {
            continue;
        };
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        found[node].push(Process {
            pid,
            version: version_in(&environ),
            pod: pod_in_cgroup(&cgroup),
        });
    }
    found
}

/// Each thread of process `pid` and its time spent waiting for a CPU
/// (`/proc/PID/task/TID/schedstat`: time on the CPU, time waiting, timeslices; nanoseconds).
pub fn thread_waits(pid: u32) -> Waits {
    let mut waits = Waits::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return waits;
    };
    for task in tasks.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        let text = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        if let Some(wait) = schedstat_wait(&text) {
            waits.insert((pid, tid), wait);
        }
    }
    waits
}

/// The time waiting for a CPU in a `schedstat` text (its second field).
fn schedstat_wait(text: &str) -> Option<u64> {
    text.split_whitespace().nth(1)?.parse().ok()
}

/// The envelope version a process environment (`KEY=VALUE\0...`) asks for: 3 (this build's)
/// unless `SWIMLB_ENVELOPE_VERSION` says otherwise.
fn version_in(environ: &[u8]) -> u8 {
    environ
        .split(|b| *b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok())
        .find_map(|kv| kv.strip_prefix(ENV)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const UID_OLD: &str = "00000000-0000-0000-0000-000000000001";
    const UID_NEW: &str = "00000000-0000-0000-0000-000000000002";

    fn process(pid: u32, version: u8, uid: &str) -> Process {
        Process {
            pid,
            version,
            pod: uid_number(uid),
        }
    }

    fn pod(uid: &str, deleting: bool) -> PodSeen {
        PodSeen {
            uid: uid.into(),
            uid_number: uid_number(uid),
            deleting,
            ..PodSeen::default()
        }
    }

    /// One node's rounds: the Pods listed, then the processes found, 100 ms apart.
    fn rounds(watch: &mut RollWatch, t0: Instant, steps: &[(Vec<PodSeen>, Vec<Process>)]) {
        for (n, (pods, found)) in steps.iter().enumerate() {
            let at = t0 + Duration::from_millis(100 * (n as u64 + 1));
            watch.pods = vec![current(pods).cloned()];
            watch.all_pods = vec![pods.clone()];
            watch.scan(
                std::slice::from_ref(found),
                at,
                at + Duration::from_millis(10),
            );
        }
    }

    #[test]
    fn a_rolled_speaker_is_stopped_once_and_started_once_whatever_lingers() {
        let t0 = Instant::now();
        let old = process(10, 2, UID_OLD);
        let vip = "198.51.100.100".parse().unwrap();
        let mut watch = RollWatch::with(t0, vec!["/r".into()], &[vec![old]], vip).unwrap();
        let new = process(20, 3, UID_NEW);
        // The exiting process's environment is unreadable: it reads as version 3.
        let exiting = process(10, 3, UID_OLD);
        rounds(
            &mut watch,
            t0,
            &[
                (vec![pod(UID_OLD, false)], vec![old]),
                (vec![pod(UID_OLD, true)], vec![old]),
                (vec![pod(UID_OLD, true)], vec![exiting]),
                (vec![pod(UID_OLD, true)], vec![]),
                (vec![pod(UID_OLD, true)], vec![exiting]),
                // The old Pod still listed, being deleted, beside its successor.
                (vec![pod(UID_OLD, true), pod(UID_NEW, false)], vec![new]),
                (vec![pod(UID_NEW, false)], vec![new]),
            ],
        );
        assert_eq!(watch.stopped, [1]);
        assert_eq!(watch.started, [vec![2, 3]]);
        assert!(watch.crashes.is_empty(), "{:?}", watch.crashes);
        assert!(watch.all_running(3), "{}", watch.states());
    }

    #[test]
    fn a_speaker_that_ends_while_its_pod_is_not_being_deleted_is_a_crash() {
        let t0 = Instant::now();
        let old = process(10, 3, UID_OLD);
        let vip = "198.51.100.100".parse().unwrap();
        let mut watch = RollWatch::with(t0, vec!["/r".into()], &[vec![old]], vip).unwrap();
        let again = process(11, 3, UID_OLD);
        rounds(
            &mut watch,
            t0,
            &[
                (vec![pod(UID_OLD, false)], vec![old]),
                (vec![pod(UID_OLD, false)], vec![]),
                (vec![pod(UID_OLD, false)], vec![again]),
            ],
        );
        assert_eq!(watch.stopped, [1]);
        assert_eq!(watch.crashes.len(), 1, "{:?}", watch.crashes);
        assert!(watch.all_running(3));
        // Two processes on a node at the start is no state to watch from.
        assert!(RollWatch::with(t0, vec!["/r".into()], &[vec![old, again]], vip).is_err());
    }

    /// One thread per node (pid 10 + node index, tid the same) that has waited `ms` for a CPU.
    fn waited(ms: [u64; 3]) -> Vec<Waits> {
        (0..3)
            .map(|i| Waits::from([((10 + i, 10 + i), ms[i as usize] * 1_000_000)]))
            .collect()
    }

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn a_thread_that_waited_for_a_cpu_a_watchers_wait_over_two_rounds_is_a_starvation() {
        let t0 = Instant::now();
        let vip = "198.51.100.100".parse().unwrap();
        let roots = vec!["/a".into(), "/b".into(), "/c".into()];
        let found: Vec<Vec<Process>> = (0..3).map(|i| vec![process(10 + i, 3, UID_OLD)]).collect();
        let mut watch = RollWatch::with(t0, roots, &found, vip).unwrap();
        // Node 1's thread waits 99 ms over two rounds at most: not starved. Node 2's waits
        // 110 ms over the rounds to 0.4 s and 130 ms over those to 0.5 s: one stretch.
        let rounds = [
            (100, [0, 0, 0]),
            (200, [50, 40, 0]),
            (300, [99, 90, 0]),
            (400, [99, 150, 0]),
            (500, [99, 220, 0]),
            (600, [99, 225, 0]),
            (700, [99, 230, 0]),
        ];
        for (ms, waits) in rounds {
            watch.starved(waited(waits), at(t0, ms));
        }
        let [s] = watch.starvations.as_slice() else {
            panic!("{:?}", watch.starvations);
        };
        assert_eq!((s.node, s.from_s, s.to_s), (2, 0.2, 0.5), "{s:?}");
        assert!((s.longest_wait_ms - 130.0).abs() < 1e-6, "{s:?}");
        assert_eq!(watch.events.len(), 1, "{:?}", watch.events);
        // A thread that was not there two reads ago (a new speaker) waited nothing yet.
        let mut fresh = waited([99, 230, 0]);
        fresh[0].insert((99, 99), 500_000_000);
        watch.starved(fresh, at(t0, 800));
        assert_eq!(watch.starvations.len(), 1);
    }

    /// Speakers that disagree for a moment right after a starvation the observer measured
    /// are not judged (the checker's settle time runs from it); the same later are.
    #[test]
    fn speakers_that_disagree_after_a_measured_starvation_are_judged_only_once_settled() {
        use crate::chaos::invariants::{
            self, Invariant, Observations, Probe, Rule, VipObservations, VipRule,
        };
        let t0 = Instant::now();
        let vip: Ipv4Addr = "198.51.100.100".parse().unwrap();
        let roots = vec!["/a".into(), "/b".into(), "/c".into()];
        let found: Vec<Vec<Process>> = (0..3).map(|i| vec![process(10 + i, 3, UID_OLD)]).collect();
        let disagreeing = |watch: &mut RollWatch, ms: u64| {
            let owners = ["node2", "node2", "node3"]
                .map(|o| Some(Some(o.to_string())))
                .to_vec();
            watch.timeline.poll(at(t0, ms), at(t0, ms + 50), owners);
        };
        let judged = |starved: bool| {
            let mut watch = RollWatch::with(t0, roots.clone(), &found, vip).unwrap();
            watch.starved(waited([0, 0, 0]), at(t0, 2_900));
            watch.starved(
                waited([0, 0, if starved { 120 } else { 20 }]),
                at(t0, 3_000),
            );
            disagreeing(&mut watch, 3_200);
            disagreeing(&mut watch, 5_500);
            let (world, polls) = watch.timeline.replay(3);
            let rule = Rule {
                vips: vec![VipRule {
                    ip: vip,
                    checked: false,
                    local: false,
                    priorities: vec![100; 3],
                }],
                names: (1..=3).map(|n| format!("node{n}")).collect(),
                preempt_delay: Duration::ZERO,
            };
            let probes = (0..60)
                .map(|n| Probe {
                    sent: Duration::from_millis(100 * n),
                    answered: true,
                })
                .collect();
            let obs = Observations {
                vips: vec![VipObservations {
                    probes,
                    arp: Vec::new(),
                }],
                polls,
                records: Vec::new(),
                horizon: Duration::from_secs(6),
            };
            invariants::evaluate(&rule, &world, &obs, true)
                .into_iter()
                .filter(|v| v.invariant == Invariant::Disagreement && !v.excused)
                .map(|v| v.at)
                .collect::<Vec<_>>()
        };
        let at_s = |ms: u64| Duration::from_millis(ms);
        // One violation per run of disagreeing rounds: from the first one judged.
        assert_eq!(judged(false), [at_s(3_200)]);
        assert_eq!(judged(true), [at_s(5_500)]);
    }

    #[test]
    fn the_wait_is_the_second_field_of_schedstat() {
        assert_eq!(schedstat_wait("36094541 80730667 207\n"), Some(80_730_667));
        assert_eq!(schedstat_wait("1\n"), None);
        assert_eq!(schedstat_wait(""), None);
        // This process's own threads are read.
        assert!(!thread_waits(std::process::id()).is_empty());
    }

    #[test]
    fn the_version_comes_from_the_environment_else_this_builds() {
        assert_eq!(version_in(b"PATH=/bin\0SWIMLB_ENVELOPE_VERSION=2\0"), 2);
        assert_eq!(version_in(b"PATH=/bin\0SWIMLB_ENVELOPE_VERSION_X=2\0"), 3);
        assert_eq!(version_in(b""), 3);
    }

    #[test]
    fn the_pod_uid_is_read_from_the_cgroup_path() {
        let uid = "db95498a-8b4d-46ff-ba6e-fc601042c828";
        let cgroup = format!(
            "12:memory:/swimlb-node-1-n1/kubepods/besteffort/pod{uid}/0123abcd\n\
             0::/\n"
        );
        assert_eq!(pod_in_cgroup(&cgroup), uid_number(uid));
        assert!(uid_number(uid).is_some());
        let systemd = "1:name=systemd:/kubepods.slice/kubepods-besteffort.slice/\
                       kubepods-besteffort-poddb95498a_8b4d_46ff_ba6e_fc601042c828.slice/x\n";
        assert_eq!(pod_in_cgroup(systemd), uid_number(uid));
        assert_eq!(pod_in_cgroup("0::/user.slice\n"), None);
        assert_eq!(uid_number("not-a-uid"), None);
    }

    #[test]
    fn the_metric_is_read_from_its_line() {
        let body = "# HELP swimlb_gossip_envelope_version x\n\
                    swimlb_gossip_envelope_version_other 9\nswimlb_gossip_envelope_version 3\n";
        assert_eq!(envelope_version(body), Some(3));
        assert_eq!(envelope_version("nothing\n"), None);
        assert_eq!(
            envelope_version("swimlb_gossip_envelope_version -1\n"),
            None
        );
    }

    #[test]
    fn a_status_body_gives_the_owner_and_the_members() {
        let body = r#"{"members": [{}, {}, {}], "addresses": [{"ip": "198.51.100.10", "owner": "node2"}]}"#;
        assert_eq!(view(body, "198.51.100.10"), Some((Some("node2".into()), 3)));
        assert_eq!(view(body, "198.51.100.11"), Some((None, 3)));
        assert_eq!(view("not json", "198.51.100.10"), None);
    }
}
