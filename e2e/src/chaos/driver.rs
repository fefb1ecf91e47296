//! What each fault does to the lab, and how it is undone: the only part of the chaos run that
//! touches namespaces, links, nftables, signals, files and cgroups.
//!
//! [`Driver::step`] performs one [`Step`] of one fault; [`Driver::undo_all`] undoes whatever is
//! still applied (the end of a run, an early stop, an error). Drops are nftables tables of their
//! own in the receiving node's namespace (one per fault, so overlapping drops never undo each
//! other); loss is the lab's nftables loss table ([`Lab::set_loss`]: this lab's kernels may
//! lack `sch_netem`); starvation is a CPU-limited cgroup holding the daemon and busy loops, made
//! under the cgroup v1 `cpu` hierarchy or cgroup v2, named after the run so a later run removes
//! what an interrupted one left ([`cleanup_stale_cgroups`]).

mod kubernetes;
mod real;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

pub use self::kubernetes::{LOCAL_SERVICE, local_service};
pub use self::real::RESTART_WAIT;
use super::schedule::{Broken, Fault, FaultKind, Step, Traffic};
use crate::daemons::{Daemons, KeepalivedDaemons, SwimlbDaemons};
use crate::lab::GOSSIP_PORT;
use crate::netns::{self, Lab};
use crate::realnode::daemons::RealDaemons;

/// The daemons a chaos run drives: one arm per target.
#[derive(Debug)]
pub enum ChaosDaemons {
    /// swimlb standalone speakers.
    Swimlb(SwimlbDaemons),
    /// keepalived instances.
    Keepalived(KeepalivedDaemons),
    /// swimlb in Kubernetes mode or MetalLB on real nodes: a real kubelet, containerd and
    /// kube-proxy per node, the implementation installed from its manifest.
    Real(Box<RealDaemons>),
}

impl ChaosDaemons {
    /// As the lab's common daemon interface.
    pub fn as_dyn(&mut self) -> &mut dyn Daemons {
        match self {
            ChaosDaemons::Swimlb(d) => d,
            ChaosDaemons::Keepalived(d) => d,
            ChaosDaemons::Real(d) => d.as_mut(),
        }
    }

    /// The nftables match of the target's membership traffic.
    fn membership_match(&self) -> String {
        match self {
            ChaosDaemons::Swimlb(_) => format!("udp dport {GOSSIP_PORT}"),
            // VRRP adverts (IP protocol 112).
            ChaosDaemons::Keepalived(_) => "ip protocol 112".to_string(),
            // memberlist: gossip over UDP, state syncs over TCP (swimlb's gossip is UDP only,
            // on the same port).
            ChaosDaemons::Real(_) => {
                format!("meta l4proto {{ tcp, udp }} th dport {GOSSIP_PORT}")
            }
        }
    }
}

/// A starved daemon's cgroup and the busy loops beside it.
#[derive(Debug)]
pub struct Starved {
    cgroup: Option<Cgroup>,
    busy: Vec<usize>,
    /// On a real node: the speaker container's own cgroup and its CFS quota before the fault.
    container: Option<(PathBuf, String)>,
}

impl Starved {
    /// Stops the loops and removes the cgroup.
    pub fn stop(self, lab: &mut Lab) {
        for busy in self.busy {
            let child = lab.child(busy);
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(cg) = self.cgroup {
            cg.remove();
        }
        if let Some((dir, quota)) = self.container {
            let _ = std::fs::write(dir.join("cpu.cfs_quota_us"), quota);
        }
    }
}

/// The cgroup flavour of this machine.
#[derive(Debug, Clone)]
struct Cgroup {
    dir: PathBuf,
    root_procs: PathBuf,
}

/// The parent directory of the lab's cgroups and whether it is cgroup v2.
fn cgroup_root() -> Option<(PathBuf, bool)> {
    let v1 = Path::new("/sys/fs/cgroup/cpu");
    if v1.join("cpu.cfs_quota_us").exists() {
        return Some((v1.to_path_buf(), false));
    }
    let v2 = Path::new("/sys/fs/cgroup");
    let controllers = std::fs::read_to_string(v2.join("cgroup.controllers")).ok()?;
    controllers
        .split_whitespace()
        .any(|c| c == "cpu")
        .then(|| (v2.to_path_buf(), true))
}

/// Removes the lab's cgroups of runs whose process is gone (their processes died with the
/// namespaces).
pub fn cleanup_stale_cgroups() {
    let Some((root, _)) = cgroup_root() else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(&root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(netns::PREFIX) else {
            continue;
        };
        let pid = rest.split(['-', 'x']).next().unwrap_or("");
        if !pid.is_empty() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}

impl Cgroup {
    fn make(run_id: &str, fault: usize, quota_percent: u8) -> Result<Option<Cgroup>> {
        let Some((root, v2)) = cgroup_root() else {
            return Ok(None);
        };
        let dir = root.join(format!("{}{run_id}-starve{fault}", netns::PREFIX));
        std::fs::create_dir_all(&dir).with_context(|| format!("making {}", dir.display()))?;
        let quota = u64::from(quota_percent) * 1000;
        if v2 {
            let _ = std::fs::write(root.join("cgroup.subtree_control"), "+cpu");
            std::fs::write(dir.join("cpu.max"), format!("{quota} 100000"))?;
        } else {
            std::fs::write(dir.join("cpu.cfs_period_us"), "100000")?;
            std::fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string())?;
        }
        Ok(Some(Cgroup {
            dir,
            root_procs: root.join("cgroup.procs"),
        }))
    }

    fn add(&self, pid: u32) {
        let _ = std::fs::write(self.dir.join("cgroup.procs"), pid.to_string());
    }

    /// Moves every process left back to the root and removes the cgroup (bounded retries: a
    /// check's short-lived child may be exiting).
    fn remove(&self) {
        for _ in 0..50 {
            let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.split_whitespace() {
                let _ = std::fs::write(&self.root_procs, pid);
            }
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The pids of every process in `netns` (the node's daemon, and whatever it started).
pub fn netns_pids(netns: &str) -> Vec<u32> {
    std::process::Command::new("ip")
        .args(["netns", "pids", netns])
        .output()
        .map(|out| {
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn signal(pids: &[u32], signal: &str) {
    if pids.is_empty() {
        return;
    }
    let _ = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .args(pids.iter().map(u32::to_string))
        .stderr(std::process::Stdio::null())
        .status();
}

/// What a step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stepped {
    /// Done.
    Done,
    /// Not done, and why: the fault acts on a speaker that does not run (a real node's
    /// kubelet has not started it again yet). Its end is skipped too.
    Skipped(String),
    /// The end of a skipped fault or roll step: nothing to do.
    SkippedEnd,
    /// A kill's end whose restart the node's kubelet holds longer than
    /// [`real::RESTART_WAIT`]: the run goes on, and the speaker counts as started when
    /// [`Driver::poll_late`] sees it running.
    Late(usize),
}

/// Applies and undoes faults in one lab.
#[derive(Debug)]
pub struct Driver {
    paused: BTreeMap<usize, Vec<u32>>,
    starved: BTreeMap<usize, Starved>,
    applied: BTreeMap<usize, Fault>,
    /// The key file's text before the running rotation.
    old_key: Option<String>,
    /// Nodes whose endpoint of the `Local` Service is not ready (Kubernetes).
    not_ready: BTreeSet<usize>,
    /// Real nodes whose kubelet is held (SIGSTOP) while their speaker is down: the kubelet's
    /// pid and the speaker's pid it had.
    held: BTreeMap<usize, real::Held>,
    /// Real nodes whose kubelet was continued at a kill's end and has not started the speaker
    /// again within [`real::RESTART_WAIT`] (its restart back-off): the speaker's old pid.
    late: BTreeMap<usize, Option<u32>>,
    /// Faults whose start was skipped (their end is skipped too).
    skipped: BTreeSet<usize>,
    /// A rolling update's (fault, node) whose stop was skipped (its start is skipped too).
    skipped_rolls: BTreeSet<(usize, usize)>,
    /// Nodes whose daemon runs, as the faults left them (index 0 is node 1).
    pub running: Vec<bool>,
}

impl Driver {
    /// A driver for a lab of `nodes` nodes, every daemon running.
    pub fn new(nodes: usize) -> Driver {
        Driver {
            paused: BTreeMap::new(),
            starved: BTreeMap::new(),
            applied: BTreeMap::new(),
            old_key: None,
            not_ready: BTreeSet::new(),
            held: BTreeMap::new(),
            late: BTreeMap::new(),
            skipped: BTreeSet::new(),
            skipped_rolls: BTreeSet::new(),
            running: vec![true; nodes],
        }
    }

    /// Faults applied and not yet undone.
    pub fn applied(&self) -> impl Iterator<Item = (&usize, &Fault)> {
        self.applied.iter()
    }

    /// Whether node `node`'s speaker waits for its kubelet's restart (see [`Driver::poll_late`]).
    pub fn is_late(&self, node: usize) -> bool {
        self.late.contains_key(&node)
    }

    /// Performs `step` of fault number `index`.
    pub fn step(
        &mut self,
        lab: &mut Lab,
        daemons: &mut ChaosDaemons,
        index: usize,
        fault: &Fault,
        step: Step,
    ) -> Result<Stepped> {
        match step {
            Step::Apply => {
                if let Some(why) = self.cannot_apply(daemons, fault.kind) {
                    self.skipped.insert(index);
                    return Ok(Stepped::Skipped(why));
                }
                self.applied.insert(index, *fault);
                self.set(lab, daemons, index, fault.kind, true)?;
                Ok(Stepped::Done)
            }
            Step::Undo => {
                if self.skipped.remove(&index) {
                    return Ok(Stepped::SkippedEnd);
                }
                if self.applied.remove(&index).is_none() {
                    return Ok(Stepped::Done);
                }
                self.set(lab, daemons, index, fault.kind, false)?;
                Ok(match fault.kind {
                    FaultKind::Kill { node } | FaultKind::PowerOff { node }
                        if self.is_late(node) =>
                    {
                        Stepped::Late(node)
                    }
                    _ => Stepped::Done,
                })
            }
            Step::Rotate { phase, node } => {
                self.rotate(lab, daemons, fault.kind, phase, node)?;
                Ok(Stepped::Done)
            }
            Step::Roll { node, up: false } => {
                if let Some(why) = self.no_speaker(daemons, node) {
                    self.skipped_rolls.insert((index, node));
                    return Ok(Stepped::Skipped(why));
                }
                self.roll(lab, daemons, node, false)?;
                Ok(Stepped::Done)
            }
            Step::Roll { node, up: true } => {
                if self.skipped_rolls.remove(&(index, node)) {
                    return Ok(Stepped::SkippedEnd);
                }
                self.roll(lab, daemons, node, true)?;
                Ok(match self.is_late(node) {
                    true => Stepped::Late(node),
                    false => Stepped::Done,
                })
            }
        }
    }

    /// Why fault `kind` cannot be put on now: it acts on a speaker container that does not
    /// run (on real nodes).
    fn cannot_apply(&self, daemons: &ChaosDaemons, kind: FaultKind) -> Option<String> {
        match kind {
            FaultKind::Kill { node }
            | FaultKind::PowerOff { node }
            | FaultKind::Pause { node }
            | FaultKind::Starve { node, .. } => self.no_speaker(daemons, node),
            _ => None,
        }
    }

    /// Undoes every fault still applied, the latest first; returns the indices undone and the
    /// errors met (every undo is tried).
    pub fn undo_all(
        &mut self,
        lab: &mut Lab,
        daemons: &mut ChaosDaemons,
    ) -> (Vec<usize>, Vec<String>) {
        let mut undone = Vec::new();
        let mut errors = Vec::new();
        let all: Vec<(usize, Fault)> = self.applied.iter().rev().map(|(i, f)| (*i, *f)).collect();
        for (i, f) in all {
            undone.push(i);
            if let Err(e) = self.step(lab, daemons, i, &f, Step::Undo) {
                errors.push(format!("undoing {}: {e:#}", f.kind.describe()));
            }
        }
        // A kubelet held by a fault whose end failed runs again.
        self.release_held();
        (undone, errors)
    }

    /// Puts fault `kind` on (`on`) or takes it off, each fault's two directions side by side.
    fn set(
        &mut self,
        lab: &mut Lab,
        daemons: &mut ChaosDaemons,
        index: usize,
        kind: FaultKind,
        on: bool,
    ) -> Result<()> {
        match kind {
            FaultKind::PowerOff { node } if on => {
                lab.set_link(node, false)?;
                self.running[node - 1] = false;
                self.stop_daemon(lab, daemons, node, "KILL")
            }
            FaultKind::PowerOff { node } => {
                // What a killed keepalived left goes before the link is up.
                daemons.as_dyn().clean_after_kill(lab, node)?;
                lab.set_link(node, true)?;
                self.start_daemon(lab, daemons, node)
            }
            FaultKind::Kill { node } if on => {
                self.running[node - 1] = false;
                self.stop_daemon(lab, daemons, node, "KILL")
            }
            FaultKind::Kill { node } => self.start_daemon(lab, daemons, node),
            FaultKind::Pause { node } if on => {
                let pids = match daemons {
                    ChaosDaemons::Real(d) => real::speaker_pids(d, node)?,
                    _ => netns_pids(&lab.node(node).netns),
                };
                signal(&pids, "STOP");
                self.paused.insert(index, pids);
                Ok(())
            }
            FaultKind::Pause { .. } => {
                if let Some(pids) = self.paused.remove(&index) {
                    signal(&pids, "CONT");
                }
                Ok(())
            }
            FaultKind::LinkFlap { node } => lab.set_link(node, !on),
            FaultKind::Drop {
                traffic,
                from,
                to,
                both,
            } if on => {
                let what = match traffic {
                    Traffic::Membership => daemons.membership_match(),
                    Traffic::Watch => format!("udp dport {}", GOSSIP_PORT + 1),
                };
                drop_traffic(lab, index, &what, (from, to), both)
            }
            FaultKind::Drop { from, to, both, .. } => undrop_traffic(lab, index, (from, to), both),
            FaultKind::Loss { node, percent } => lab.set_loss(node, if on { percent } else { 0 }),
            FaultKind::Starve {
                node,
                busy_loops,
                quota_percent,
            } if on => {
                let starved = match daemons {
                    ChaosDaemons::Real(d) => real::starve(lab, d, node, busy_loops, quota_percent)?,
                    _ => starve(lab, index, node, busy_loops, quota_percent)?,
                };
                self.starved.insert(index, starved);
                Ok(())
            }
            FaultKind::Starve { .. } => {
                if let Some(starved) = self.starved.remove(&index) {
                    starved.stop(lab);
                }
                Ok(())
            }
            FaultKind::BrokenReload { .. }
            | FaultKind::KeyRotation { .. }
            | FaultKind::CheckFail { .. } => self.set_config(lab, daemons, kind, on),
            FaultKind::ForeignAnswer { node, vip } => {
                foreign_address(lab, node, vip, if on { "add" } else { "del" })
            }
            FaultKind::ApiDown
            | FaultKind::EtcdCompaction
            | FaultKind::ControllerRestart
            | FaultKind::ServiceChurn { .. }
            | FaultKind::EndpointNotReady { .. }
            | FaultKind::Exclude { .. }
            | FaultKind::RollingUpdate => self.set_kubernetes(lab, daemons, kind, on),
        }
    }

    /// The faults of swimlb's own configuration: a broken reload, a key rotation's end, a
    /// failing health check.
    fn set_config(
        &mut self,
        lab: &mut Lab,
        daemons: &mut ChaosDaemons,
        kind: FaultKind,
        on: bool,
    ) -> Result<()> {
        match kind {
            FaultKind::BrokenReload { node, broken } if on => {
                let ChaosDaemons::Swimlb(d) = daemons else {
                    bail!("a reload needs swimlb's speakers");
                };
                broken_reload(d, lab, node, broken)
            }
            FaultKind::BrokenReload { node, .. } => {
                let ChaosDaemons::Swimlb(d) = daemons else {
                    return Ok(());
                };
                std::fs::write(config_path(d, lab, node), d.config(lab, node))?;
                hup(d, lab, node);
                Ok(())
            }
            FaultKind::KeyRotation { .. } => {
                if !on {
                    self.old_key = None;
                }
                Ok(())
            }
            FaultKind::CheckFail { node } if on => {
                let ChaosDaemons::Swimlb(d) = daemons else {
                    bail!("a health check needs swimlb's speakers");
                };
                let _ = std::fs::remove_file(flag_path(d.dir(), &lab.node(node).name));
                Ok(())
            }
            FaultKind::CheckFail { node } => {
                let ChaosDaemons::Swimlb(d) = daemons else {
                    return Ok(());
                };
                std::fs::write(flag_path(d.dir(), &lab.node(node).name), "")?;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn rotate(
        &mut self,
        lab: &mut Lab,
        daemons: &mut ChaosDaemons,
        kind: FaultKind,
        phase: u8,
        node: usize,
    ) -> Result<()> {
        let (ChaosDaemons::Swimlb(d), FaultKind::KeyRotation { number }) = (daemons, kind) else {
            bail!("a key rotation needs swimlb's speakers");
        };
        let keys = d.dir().join("keys");
        if node > 0 {
            hup(d, lab, node);
            return Ok(());
        }
        let new = swimlb_config::keyfile::encode_key(&[number.wrapping_mul(37) as u8 ^ 0x5a; 32]);
        if phase == 1 {
            let old = std::fs::read_to_string(&keys).context("reading the key file")?;
            let old = old.lines().next().unwrap_or("").to_string();
            swimlb_config::keyfile::write_key_file(&keys, &format!("{new}\n{old}\n"))?;
            self.old_key = Some(old);
        } else {
            swimlb_config::keyfile::write_key_file(&keys, &format!("{new}\n"))?;
        }
        Ok(())
    }
}

fn drop_table(fault: usize) -> String {
    format!("swimlb_chaos_drop{fault}")
}

/// nftables in `to` drops `what` from `from` (and the other way with `both`), in fault
/// `index`'s own table so the undo removes exactly it.
fn drop_traffic(
    lab: &Lab,
    index: usize,
    what: &str,
    (from, to): (usize, usize),
    both: bool,
) -> Result<()> {
    let mut pairs = vec![(from, to)];
    if both {
        pairs.push((to, from));
    }
    for (from, to) in pairs {
        let rules = format!(
            "table inet {table} {{\n  chain in {{ type filter hook input priority -200; ip saddr {src} {what} drop; }}\n}}\n",
            table = drop_table(index),
            src = lab.node(from).v4,
        );
        netns::nft_apply(&lab.node(to).netns, &rules)?;
    }
    Ok(())
}

/// Removes what [`drop_traffic`] added for fault `index` on the receivers of `(from, to)`.
fn undrop_traffic(
    lab: &mut Lab,
    index: usize,
    (from, to): (usize, usize),
    both: bool,
) -> Result<()> {
    let mut receivers = vec![to];
    if both {
        receivers.push(from);
    }
    for n in receivers {
        let netns = lab.node(n).netns.clone();
        lab.run_in(
            &netns,
            "nft",
            &["delete", "table", "inet", &drop_table(index)],
        )?;
    }
    Ok(())
}

/// `busy_loops` shell loops in node `node`'s namespace, sharing a cgroup capped at
/// `quota_percent` of a core with every process of that namespace (when cgroups can be made);
/// `index` names the cgroup among the run's.
pub fn starve(
    lab: &mut Lab,
    index: usize,
    node: usize,
    busy_loops: u8,
    quota_percent: u8,
) -> Result<Starved> {
    let netns = lab.node(node).netns.clone();
    let daemon_pids = netns_pids(&netns);
    let cgroup = Cgroup::make(lab.run_id(), index, quota_percent)?;
    let mut busy = Vec::new();
    for _ in 0..busy_loops {
        let mut cmd = Lab::command_in(&netns, "sh");
        cmd.args(["-c", "while :; do :; done"]);
        let child = lab.spawn(cmd)?;
        if let Some(cg) = &cgroup {
            cg.add(lab.child(child).id());
        }
        busy.push(child);
    }
    if let Some(cg) = &cgroup {
        for pid in daemon_pids {
            cg.add(pid);
        }
    }
    Ok(Starved {
        cgroup,
        busy,
        container: None,
    })
}

/// On a real node: a chaos starvation of one speaker container (`handover --starve`).
pub use real::starve as starve_speaker;

/// Writes a `broken` configuration for node `node`'s speaker and reloads it (SIGHUP).
fn broken_reload(d: &SwimlbDaemons, lab: &mut Lab, node: usize, broken: Broken) -> Result<()> {
    let good = d.config(lab, node);
    let text = match broken {
        Broken::Syntax => "cluster: [unclosed\n  groups: {{\n".to_string(),
        Broken::Invalid => format!("{good}colour: blue\n"),
        Broken::GarbageKeys => {
            let garbage = d.dir().join(format!("keys-garbage-node{node}"));
            swimlb_config::keyfile::write_key_file(&garbage, "this is no base64 key!\n")?;
            good.lines()
                .map(|l| match l.starts_with("keyFile:") {
                    true => format!("keyFile: {}\n", garbage.display()),
                    false => format!("{l}\n"),
                })
                .collect()
        }
    };
    std::fs::write(config_path(d, lab, node), text)?;
    hup(d, lab, node);
    Ok(())
}

/// `ip addr add` or `del` (`op`) of VIP `vip` on node `node`'s eth0: a foreign host answering
/// for it.
fn foreign_address(lab: &mut Lab, node: usize, vip: usize, op: &str) -> Result<()> {
    let netns = lab.node(node).netns.clone();
    let addr = format!("{}/32", netns::vip_v4(vip as u8));
    lab.run_in(&netns, "ip", &["addr", op, &addr, "dev", "eth0"])?;
    Ok(())
}

/// The flag file node `name`'s health check tests.
pub fn flag_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("healthy-{name}"))
}

fn config_path(d: &SwimlbDaemons, lab: &Lab, node: usize) -> PathBuf {
    d.dir().join(format!("{}.yaml", lab.node(node).name))
}

/// SIGHUP to node `node`'s speaker, if it runs.
fn hup(d: &SwimlbDaemons, lab: &mut Lab, node: usize) {
    if let Some(pid) = d.pid(lab, node) {
        signal(&[pid], "HUP");
    }
}
