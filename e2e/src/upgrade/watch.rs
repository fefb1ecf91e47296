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

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use serde_json::Value;
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
