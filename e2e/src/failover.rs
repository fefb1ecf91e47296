//! `swimlb-lab failover`: repeated failover trials on real kernel networking.
//!
//! One lab (see [`crate::netns`]) serves every trial. Each trial waits until the lab has
//! converged (see [`crate::converge`]: the daemons name one owner, and that owner alone answers
//! ARP and the probes for a second), re-checks right before the fault, faults that owner (link
//! down, SIGKILL or SIGTERM of its daemon), waits for another node to answer, records the sample,
//! then restores the old owner. A trial whose lab does not converge within a minute is reported
//! as failed, never measured. Every wait is bounded.
//!
//! The figures follow DESIGN.md: `failover_ms` runs from the fault to the first answer from a
//! node other than the old owner; `lost_probes` counts the unanswered probes in between; a
//! change of the answering node after the lab converged and before the fault is a false
//! failover.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use tokio::time::Instant;

use crate::converge::{self, SpeakerView, Views};
use crate::flood::{Flood, FloodKind};
use crate::keepalived;
use crate::kubelab;
use crate::netns::{self, Lab};
use crate::probe::{self, PROBE_PORT, Prober, Worker};

/// Which load balancer the trials run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Implementation {
    /// swimlb's standalone speaker.
    Swimlb,
    /// Debian's keepalived with its defaults.
    Keepalived,
    /// keepalived tuned for speed: VRRPv3, `advert_int 0.1`, everything else default.
    KeepalivedFast,
    /// swimlb's speaker in Kubernetes mode, in the Kubernetes lab ([`crate::kubelab`]).
    SwimlbKubernetes,
    /// MetalLB's controller and speakers from MetalLB's manifest, in the Kubernetes lab
    /// ([`crate::metallb`]).
    Metallb,
}

impl Implementation {
    /// Name in the CLI and the JSON.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Implementation::Swimlb => "swimlb",
            Implementation::Keepalived => "keepalived",
            Implementation::KeepalivedFast => "keepalived-fast",
            Implementation::SwimlbKubernetes => "swimlb-kubernetes",
            Implementation::Metallb => "metallb",
        }
    }

    /// Every implementation, in the CLI's order.
    pub const ALL: [Implementation; 5] = [
        Implementation::Swimlb,
        Implementation::Keepalived,
        Implementation::KeepalivedFast,
        Implementation::SwimlbKubernetes,
        Implementation::Metallb,
    ];

    /// The implementation named `name` in the CLI.
    pub fn parse(name: &str) -> Option<Implementation> {
        Implementation::ALL.into_iter().find(|i| i.as_str() == name)
    }
}

/// How the owner is faulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// The owner's link goes down: as the network sees a power-off.
    Poweroff,
    /// SIGKILL to the owner's daemon.
    Kill,
    /// SIGTERM to the owner's daemon: a graceful stop.
    Sigterm,
    /// SIGSTOP to the owner's daemon for 2 s, then SIGCONT (see [`crate::pause`]).
    Pause,
    /// SIGSTOP to a non-owner's daemon for 2 s, then SIGCONT: nothing may move.
    PauseBackup,
}

impl Scenario {
    /// Name in the CLI and the JSON.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Scenario::Poweroff => "poweroff",
            Scenario::Kill => "kill",
            Scenario::Sigterm => "sigterm",
            Scenario::Pause => "pause",
            Scenario::PauseBackup => "pause-backup",
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The implementation.
    pub implementation: Implementation,
    /// The fault.
    pub scenario: Scenario,
    /// Nodes in the lab.
    pub nodes: usize,
    /// Trials.
    pub trials: usize,
    /// Random loss on every node link, percent.
    pub loss: u8,
    /// Probe interval.
    pub probe_interval: Duration,
    /// Kubernetes lab only: the API server is unreachable from right before each fault until
    /// the trial's failover was measured.
    pub api_down: bool,
    /// A flood from the client during every trial (see [`crate::flood`]), and its rate.
    pub flood: Option<(FloodKind, u64)>,
}

/// The flood a run ran under, and what the speakers spent meanwhile.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FloodReport {
    /// `arp` or `gossip`.
    pub kind: &'static str,
    /// Packets per second asked for.
    pub pps: u64,
    /// Packets the client's kernel accepted.
    pub sent: u64,
    /// Each node's daemon's CPU over the run, percent of one core (node order; a daemon that
    /// was restarted counts from its restart).
    pub cpu_percent: Vec<(String, f64)>,
}

/// Starts, signals and restarts the daemon of each node.
pub trait Daemons {
    /// Starts the daemon of node `index` (1-based).
    fn start(&mut self, lab: &mut Lab, index: usize) -> Result<()>;
    /// Sends `signal` (`KILL` or `TERM`) to the daemon of node `index` and waits for it to exit.
    fn signal(&mut self, lab: &mut Lab, index: usize, signal: &str) -> Result<()>;
    /// Undoes what a killed daemon left on its node before a restart.
    fn clean_after_kill(&mut self, _lab: &mut Lab, _index: usize) -> Result<()> {
        Ok(())
    }
    /// What every node's daemon says about the VIP now, in node order.
    fn views(&mut self, lab: &Lab) -> Views;
    /// Right before the fault on `owner` (the lab has converged): `Ok(Err(reason))` if the trial
    /// must not be measured. The Kubernetes lab waits for the status record to name `owner`,
    /// starts watching it for the change (returned), and with `api_down` takes the API server
    /// away.
    fn before_fault(
        &mut self,
        _owner: &str,
        _api_down: bool,
    ) -> Result<Result<Option<kubelab::RecordChange>, String>> {
        Ok(Ok(None))
    }
    /// After the failover was measured: brings the API server back (Kubernetes lab).
    fn after_fault(&mut self) -> Result<()> {
        Ok(())
    }
    /// The process id of node `index`'s daemon (the one a pause stops), while it runs.
    fn pid(&mut self, _lab: &mut Lab, _index: usize) -> Option<u32> {
        None
    }
    /// The Kubernetes API server's version (`/version`), in the Kubernetes lab.
    fn server_version(&self) -> Option<String> {
        None
    }
    /// The node the daemons' election rule names for the VIP once every node is alive and
    /// settled, computed by the lab on its own; `None` when the rule names no single node.
    fn expected_owner(&self, _lab: &Lab) -> Option<String> {
        None
    }
}

/// keepalived on every node.
#[derive(Debug)]
pub struct KeepalivedDaemons {
    tuning: keepalived::Tuning,
    dir: PathBuf,
    children: Vec<Option<usize>>,
    states: Vec<Option<keepalived::StateReader>>,
}

impl KeepalivedDaemons {
    /// Files go to a directory named after the lab's run.
    pub fn new(lab: &Lab, tuning: keepalived::Tuning) -> KeepalivedDaemons {
        KeepalivedDaemons {
            tuning,
            dir: lab.work_dir(),
            children: vec![None; lab.nodes.len() + 1],
            states: (0..=lab.nodes.len()).map(|_| None).collect(),
        }
    }
}

impl Daemons for KeepalivedDaemons {
    fn start(&mut self, lab: &mut Lab, index: usize) -> Result<()> {
        let node = lab.node(index).clone();
        let instance = keepalived::Instance::write(
            &self.dir,
            &node.name,
            netns::vip_v4(0),
            netns::PREFIX_V4,
            self.tuning,
        )?;
        match &self.states[index] {
            Some(reader) => reader.forget(),
            None => self.states[index] = Some(keepalived::StateReader::start(&instance.fifo)?),
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("keepalived-{}.log", node.name)))?;
        let mut cmd = Lab::command_in(&node.netns, "keepalived");
        cmd.args(instance.args())
            .stdout(log.try_clone()?)
            .stderr(log);
        self.children[index] = Some(lab.spawn(cmd)?);
        Ok(())
    }

    fn signal(&mut self, lab: &mut Lab, index: usize, signal: &str) -> Result<()> {
        let netns = lab.node(index).netns.clone();
        if signal == "KILL" {
            // A crash: the VRRP child first, so it cannot see its parent die and stop gracefully
            // (keepalived's children leave with a priority-0 advert when the parent goes), then
            // everything else in the namespace, in one kill(1) call.
            let vrrp_pid = keepalived::Instance::paths(&self.dir, &lab.node(index).name).vrrp_pid;
            if let Ok(pid) = std::fs::read_to_string(&vrrp_pid) {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", pid.trim()])
                    .status();
            }
            let out = std::process::Command::new("ip")
                .args(["netns", "pids", &netns])
                .output()?;
            let pids: Vec<String> = String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .map(str::to_string)
                .collect();
            if !pids.is_empty() {
                let _ = std::process::Command::new("kill")
                    .arg("-KILL")
                    .args(&pids)
                    .status();
            }
        } else if let Some(child) = self.children[index] {
            let pid = lab.child(child).id().to_string();
            std::process::Command::new("kill")
                .args([&format!("-{signal}"), &pid])
                .status()?;
        }
        if let Some(child) = self.children[index].take() {
            lab.wait_or_kill(child, Duration::from_secs(10))?;
        }
        Ok(())
    }

    fn clean_after_kill(&mut self, lab: &mut Lab, index: usize) -> Result<()> {
        // A killed keepalived leaves the VIP on eth0 (and the kernel keeps answering ARP for it:
        // the split brain the seeds describe). Remove it before the restart.
        let netns = lab.node(index).netns.clone();
        let vip = format!("{}/{}", netns::vip_v4(0), netns::PREFIX_V4);
        let _ = lab.run_in(&netns, "ip", &["addr", "del", &vip, "dev", "eth0"]);
        // And its pid files, which would make the new instance think it is already running.
        let paths = keepalived::Instance::paths(&self.dir, &lab.node(index).name);
        let _ = std::fs::remove_file(paths.pid);
        let _ = std::fs::remove_file(paths.vrrp_pid);
        Ok(())
    }

    fn views(&mut self, lab: &Lab) -> Views {
        Views::Keepalived(
            (1..=lab.nodes.len())
                .map(|i| self.states[i].as_ref().and_then(|r| r.state()))
                .collect(),
        )
    }
}

/// swimlb's standalone speaker on every node, run through the lab binary's `speaker`
/// command (the same entry point as `swimlb-speaker`).
#[derive(Debug)]
pub struct SwimlbDaemons {
    program: PathBuf,
    dir: PathBuf,
    children: Vec<Option<usize>>,
    exits: Vec<Option<std::process::ExitStatus>>,
    /// Extra YAML lines for every node's file (for example a gossip profile).
    pub extra: String,
    /// Extra YAML lines for node `index`'s group, each indented by 4 spaces (checks, priority,
    /// `preemptDelay`, `notify`): lets tests give nodes different group settings.
    pub group_extra: std::collections::BTreeMap<usize, String>,
    /// The Kubernetes lab's cluster: speakers run in Kubernetes mode against it.
    cluster: Option<Box<kubelab::Cluster>>,
}

/// The gossip port of the lab's speakers.
pub const GOSSIP_PORT: u16 = 7946;
/// The HTTP port of the lab's speakers.
pub const HTTP_PORT: u16 = 7572;

/// Every node's speaker HTTP address (`/status`, `/metrics`), in node order.
pub fn http_addrs(lab: &Lab) -> Vec<SocketAddr> {
    lab.nodes
        .iter()
        .map(|n| SocketAddr::from((n.v4, HTTP_PORT)))
        .collect()
}

impl SwimlbDaemons {
    /// Speakers run as `program speaker standalone --config FILE`; files go to a directory named
    /// after the lab's run, with one fresh key shared by all nodes.
    pub fn new(lab: &Lab, program: PathBuf) -> Result<SwimlbDaemons> {
        let dir = lab.work_dir();
        std::fs::create_dir_all(&dir)?;
        let mut key = [0u8; 32];
        use std::io::Read as _;
        std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
        std::fs::write(
            dir.join("keys"),
            format!("{}\n", swimlb_config::keyfile::encode_key(&key)),
        )?;
        Ok(SwimlbDaemons {
            program,
            dir,
            children: vec![None; lab.nodes.len() + 1],
            exits: vec![None; lab.nodes.len() + 1],
            // For A/B runs: `SWIMLB_LAB_GOSSIP='{ownerWatch: false}'` is every node's gossip
            // section.
            extra: std::env::var("SWIMLB_LAB_GOSSIP")
                .map(|gossip| format!("gossip: {gossip}\n"))
                .unwrap_or_default(),
            group_extra: std::collections::BTreeMap::new(),
            cluster: None,
        })
    }

    /// Speakers in Kubernetes mode (`program speaker kubernetes`), with the cluster of the
    /// Kubernetes lab (API server, controller, objects) started in `lab` first.
    pub fn kubernetes(lab: &mut Lab, program: PathBuf) -> Result<SwimlbDaemons> {
        let mut daemons = SwimlbDaemons::new(lab, program.clone())?;
        daemons.cluster = Some(Box::new(kubelab::Cluster::start(
            lab,
            program,
            daemons.dir.clone(),
        )?));
        Ok(daemons)
    }

    /// The Kubernetes lab's cluster, in Kubernetes mode.
    pub fn cluster(&self) -> Option<&kubelab::Cluster> {
        self.cluster.as_deref()
    }

    /// The Kubernetes lab's cluster, in Kubernetes mode.
    pub fn cluster_mut(&mut self) -> Option<&mut kubelab::Cluster> {
        self.cluster.as_deref_mut()
    }

    /// The configuration file of node `index`.
    pub fn config(&self, lab: &Lab, index: usize) -> String {
        let node = lab.node(index);
        let peers: Vec<String> = lab
            .nodes
            .iter()
            .filter(|n| n.index != index)
            .map(|n| format!("{}:{GOSSIP_PORT}", n.v4))
            .collect();
        format!(
            "cluster: lab-{run}\nnode: {name}\nbind: {ip}:{GOSSIP_PORT}\npeers: [{peers}]\nkeyFile: {keys}\nlisten: {ip}:{HTTP_PORT}\n{extra}groups:\n  - name: vip\n    addresses: [{v4}, {v6}]\n    interface: eth0\n",
            run = lab.run_id(),
            name = node.name,
            ip = node.v4,
            peers = peers.join(", "),
            keys = self.dir.join("keys").display(),
            extra = self.extra,
            v4 = netns::vip_v4(0),
            v6 = netns::vip_v6(0),
        ) + self
            .group_extra
            .get(&index)
            .map(String::as_str)
            .unwrap_or("")
    }

    /// The directory of the run's files (configurations, keys, logs).
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// How node `index`'s speaker exited, once [`Daemons::signal`] stopped it.
    pub fn exit_status(&self, index: usize) -> Option<std::process::ExitStatus> {
        self.exits.get(index).copied().flatten()
    }

    /// The process id of node `index`'s speaker, while it runs.
    pub fn pid(&self, lab: &mut Lab, index: usize) -> Option<u32> {
        self.children
            .get(index)
            .copied()
            .flatten()
            .map(|c| lab.child(c).id())
    }

    /// Where node `index`'s log goes.
    pub fn log_path(&self, lab: &Lab, index: usize) -> PathBuf {
        self.dir.join(format!("{}.log", lab.node(index).name))
    }
}

impl Daemons for SwimlbDaemons {
    fn start(&mut self, lab: &mut Lab, index: usize) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(lab, index))?;
        let mut cmd = match &self.cluster {
            Some(cluster) => cluster.speaker_command(lab, lab.node(index), &self.dir.join("keys")),
            None => {
                let path = self.dir.join(format!("{}.yaml", lab.node(index).name));
                std::fs::write(&path, self.config(lab, index))?;
                let program = self.program.to_string_lossy().into_owned();
                let mut cmd = Lab::command_in(&lab.node(index).netns, &program);
                cmd.args(["speaker", "standalone", "--config"]).arg(&path);
                cmd
            }
        };
        cmd.stdout(std::process::Stdio::null()).stderr(log);
        self.children[index] = Some(lab.spawn(cmd)?);
        Ok(())
    }

    fn signal(&mut self, lab: &mut Lab, index: usize, signal: &str) -> Result<()> {
        let Some(child) = self.children[index].take() else {
            return Ok(());
        };
        // `ip netns exec` execs the program: the child's pid is the speaker's.
        let pid = lab.child(child).id().to_string();
        std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()?;
        lab.wait_or_kill(child, Duration::from_secs(10))?;
        self.exits[index] = lab.child(child).wait().ok();
        Ok(())
    }

    fn views(&mut self, lab: &Lab) -> Views {
        let nodes: Vec<SocketAddr> = http_addrs(lab);
        let count = nodes.len();
        // Three tries each: with `--loss` a lost SYN fails one connection attempt.
        let views = probe::in_netns(&lab.client_netns, move || {
            nodes
                .iter()
                .map(|addr| {
                    (0..3).find_map(|_| speaker_view(&crate::demo::http_get(*addr, "/status")?))
                })
                .collect()
        });
        Views::Swimlb(views.unwrap_or_else(|_| vec![None; count]))
    }

    fn pid(&mut self, lab: &mut Lab, index: usize) -> Option<u32> {
        SwimlbDaemons::pid(self, lab, index)
    }

    fn server_version(&self) -> Option<String> {
        self.cluster
            .as_ref()
            .and_then(|c| c.control_plane().server_version().ok())
    }

    /// MetalLB's order over every node, in both modes: equal priorities, no checks, every node
    /// eligible. A test that gives nodes their own group settings checks its own placement.
    fn expected_owner(&self, lab: &Lab) -> Option<String> {
        if !self.group_extra.is_empty() {
            return None;
        }
        let names: Vec<&str> = lab.nodes.iter().map(|n| n.name.as_str()).collect();
        converge::metallb_owner(&names, std::net::IpAddr::V4(netns::vip_v4(0)))
    }

    fn before_fault(
        &mut self,
        owner: &str,
        api_down: bool,
    ) -> Result<Result<Option<kubelab::RecordChange>, String>> {
        let Some(cluster) = &mut self.cluster else {
            return Ok(Ok(None));
        };
        // The record must name the owner before the fault, or status_ms measures nothing.
        if cluster
            .wait_record(kubelab::APPS, kubelab::SERVICE, RECORD_LIMIT, |n| {
                n == owner
            })
            .is_none()
        {
            return Ok(Err(format!(
                "the ServiceL2Status record does not name {owner} (it names {:?})",
                cluster.record_node(kubelab::APPS, kubelab::SERVICE)
            )));
        }
        let change = cluster.records().watch_change(owner, RECORD_LIMIT)?;
        if api_down {
            cluster.set_reachable(false)?;
        }
        Ok(Ok(Some(change)))
    }

    fn after_fault(&mut self) -> Result<()> {
        match &mut self.cluster {
            Some(cluster) => cluster.set_reachable(true),
            None => Ok(()),
        }
    }
}

/// How long the Kubernetes lab waits for a status record to name a node.
pub const RECORD_LIMIT: Duration = Duration::from_secs(30);

/// The VIP's part of a speaker's `/status` body (`None`: not the JSON expected).
pub fn speaker_view(status: &str) -> Option<SpeakerView> {
    let v: serde_json::Value = serde_json::from_str(status).ok()?;
    let vip = netns::vip_v4(0).to_string();
    let owner = v["addresses"]
        .as_array()?
        .iter()
        .find(|a| a["ip"] == vip.as_str())
        .and_then(|a| a["owner"].as_str())
        .map(str::to_string);
    Some(SpeakerView {
        owner,
        members: v["members"].as_array()?.len(),
        ready: v["ready"].as_bool()?,
    })
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

/// Lost-probe summary.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct LostProbes {
    /// Median.
    pub p50: u64,
    /// Largest.
    pub max: u64,
}

/// One trial's result.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Sample {
    /// Fault to first answer from another node.
    pub failover_ms: f64,
    /// Probes lost in between.
    pub lost_probes: u64,
    /// Kubernetes lab: fault to the `ServiceL2Status` record naming the new owner.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_ms: Option<f64>,
}

/// The JSON report (DESIGN.md's contract).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    /// `swimlb`, `keepalived` or `keepalived-fast`.
    #[serde(rename = "impl")]
    pub implementation: &'static str,
    /// `poweroff`, `kill` or `sigterm`.
    pub scenario: &'static str,
    /// Nodes.
    pub nodes: usize,
    /// Trials run (the requested count).
    pub trials: usize,
    /// Trials in which no other node answered within the 30 s cap: they have no sample, so the
    /// percentiles cover `trials - failed_trials` samples. Not in DESIGN.md's contract; added so
    /// a run that lost trials cannot read as a clean one.
    pub failed_trials: usize,
    /// Loss on every link, percent.
    pub loss: u8,
    /// Failover time summary.
    pub failover_ms: Percentiles,
    /// Lost probes summary.
    pub lost_probes: LostProbes,
    /// Owner changes while no fault was in progress.
    pub false_failovers: usize,
    /// Kubernetes lab: fault to the status record naming the new owner, over the samples that
    /// have it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_ms: Option<Percentiles>,
    /// Kubernetes lab: whether the API server was unreachable during each fault.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub api_down: bool,
    /// The flood during the trials, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flood: Option<FloodReport>,
    /// Kubernetes lab: the API server's version, as its `/version` reported it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_version: Option<String>,
    /// Every sample.
    pub samples: Vec<Sample>,
}

impl Report {
    /// Summarizes `samples`; `failed_trials` are the trials that produced none.
    pub fn new(
        options: &Options,
        samples: Vec<Sample>,
        failed_trials: usize,
        false_failovers: usize,
    ) -> Report {
        let ms: Vec<f64> = samples.iter().map(|s| s.failover_ms).collect();
        let status: Vec<f64> = samples.iter().filter_map(|s| s.status_ms).collect();
        let mut lost: Vec<u64> = samples.iter().map(|s| s.lost_probes).collect();
        lost.sort_unstable();
        Report {
            implementation: options.implementation.as_str(),
            scenario: options.scenario.as_str(),
            nodes: options.nodes,
            trials: samples.len() + failed_trials,
            failed_trials,
            loss: options.loss,
            failover_ms: percentiles(&ms),
            lost_probes: LostProbes {
                p50: lost
                    .get(lost.len().saturating_sub(1) / 2)
                    .copied()
                    .unwrap_or(0),
                max: lost.last().copied().unwrap_or(0),
            },
            false_failovers,
            status_ms: (!status.is_empty()).then(|| percentiles(&status)),
            api_down: options.api_down,
            flood: None,
            server_version: None,
            samples,
        }
    }

    /// A table for the terminal.
    pub fn table(&self) -> String {
        format!(
            "{:<15} {:<8} nodes {:>2} trials {:>2} (failed {}) loss {:>2}% | failover ms p50 {:>7.1} p90 {:>7.1} p99 {:>7.1} max {:>7.1} | lost probes p50 {:>3} max {:>3} | false failovers {}",
            self.implementation,
            self.scenario,
            self.nodes,
            self.trials,
            self.failed_trials,
            self.loss,
            self.failover_ms.p50,
            self.failover_ms.p90,
            self.failover_ms.p99,
            self.failover_ms.max,
            self.lost_probes.p50,
            self.lost_probes.max,
            self.false_failovers
        ) + &match &self.status_ms {
            Some(st) => format!(
                " | status ms p50 {:.1} p99 {:.1}{}",
                st.p50,
                st.p99,
                if self.api_down {
                    " (API server down)"
                } else {
                    ""
                }
            ),
            None => String::new(),
        } + &match &self.server_version {
            Some(version) => format!(" | kube-apiserver {version}"),
            None => String::new(),
        } + &match &self.flood {
            Some(f) => format!(
                " | {} flood {} pps ({} sent), CPU % {}",
                f.kind,
                f.pps,
                f.sent,
                f.cpu_percent
                    .iter()
                    .map(|(n, c)| format!("{n} {c:.1}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None => String::new(),
        }
    }
}

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

/// Runs the trials in a fresh lab and returns the report. `progress` gets one line per trial.
pub fn run(
    options: &Options,
    make_daemons: &dyn Fn(&mut Lab) -> Result<Box<dyn Daemons>>,
    progress: &mut dyn FnMut(&str),
) -> Result<Report> {
    let (mut lab, responders, mut daemons) = start_lab(options.nodes, options.loss, make_daemons)?;
    let target = SocketAddr::from((netns::vip_v4(0), PROBE_PORT));
    let flood = match options.flood {
        Some((kind, pps)) => {
            let key = std::fs::read_to_string(lab.work_dir().join("keys"))
                .ok()
                .and_then(|text| swimlb_config::keyfile::parse_key_file(&text).ok())
                .and_then(|keys| keys.first().copied());
            let usage: Vec<Option<(u32, u64)>> = (1..=options.nodes)
                .map(|i| {
                    let pid = daemons.pid(&mut lab, i)?;
                    Some((pid, crate::soak::proc_usage(pid)?.0))
                })
                .collect();
            Some((
                kind,
                pps,
                Flood::start(&lab, kind, pps, key)?,
                usage,
                Instant::now(),
            ))
        }
        None => None,
    };
    let mut samples = Vec::new();
    let mut failed_trials = 0;
    let mut false_failovers = 0;
    for trial in 1..=options.trials {
        let prober = Prober::start(&lab.client_netns, target, options.probe_interval)?;
        let settled = match settle(&lab, daemons.as_mut(), &prober, progress)? {
            Ok(settled) => settled,
            Err(reason) => {
                prober.stop();
                failed_trials += 1;
                progress(&format!(
                    "trial {trial}/{}: not measured: the lab did not converge within {CONVERGE_LIMIT:?} ({reason})",
                    options.trials
                ));
                continue;
            }
        };
        let (owner, index) = (settled.owner.clone(), settled.index);
        let record = match daemons.before_fault(&owner, options.api_down)? {
            Ok(record) => record,
            Err(reason) => {
                prober.stop();
                failed_trials += 1;
                progress(&format!(
                    "trial {trial}/{}: not measured: {reason}",
                    options.trials
                ));
                continue;
            }
        };
        let fault = Instant::now();
        match options.scenario {
            Scenario::Poweroff => lab.set_link(index, false)?,
            Scenario::Kill => daemons.signal(&mut lab, index, "KILL")?,
            Scenario::Sigterm => daemons.signal(&mut lab, index, "TERM")?,
            Scenario::Pause | Scenario::PauseBackup => {
                bail!("the pause scenarios run in crate::pause::run")
            }
        }
        false_failovers += settled.false_failovers;
        let deadline = fault + Duration::from_secs(30);
        let sample = loop {
            let records = prober.snapshot();
            if let Some(s) = probe::failover(&records, fault, &owner) {
                break Some(s);
            }
            if Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        std::thread::sleep(Duration::from_millis(200));
        let records = prober.stop();
        let new_owner = sample
            .as_ref()
            .and_then(|_| first_other_answer(&records, fault, &owner));
        daemons
            .after_fault()
            .context("bringing the API server back")?;
        // The record must name the node that took over (not merely another one).
        let status_ms = record
            .and_then(|r| r.join())
            .filter(|(node, _)| Some(node) == new_owner.as_ref())
            .map(|(_, at)| at.duration_since(fault).as_secs_f64() * 1e3);
        match sample {
            Some(s) => {
                let status = status_ms
                    .map(|ms| {
                        format!(
                            ", status record names {} after {ms:.1} ms",
                            new_owner.as_deref().unwrap_or("?")
                        )
                    })
                    .unwrap_or_default();
                progress(&format!(
                    "trial {trial}/{}: {owner} faulted, failover {:.1} ms, {} probes lost{status}",
                    options.trials, s.failover_ms, s.lost_probes
                ));
                samples.push(Sample {
                    failover_ms: s.failover_ms,
                    lost_probes: s.lost_probes,
                    status_ms,
                });
            }
            None => {
                failed_trials += 1;
                progress(&format!(
                    "trial {trial}/{}: {owner} faulted, no other node answered within 30 s",
                    options.trials
                ));
            }
        }
        // Restore the old owner as a backup; the next trial waits for the lab to converge.
        match options.scenario {
            Scenario::Poweroff => lab.set_link(index, true)?,
            Scenario::Kill => {
                daemons.clean_after_kill(&mut lab, index)?;
                daemons.start(&mut lab, index)?;
            }
            Scenario::Sigterm => daemons.start(&mut lab, index)?,
            Scenario::Pause | Scenario::PauseBackup => {}
        }
    }
    let flood = flood.map(|(kind, pps, flood, before, started)| {
        let elapsed = started.elapsed().as_secs_f64();
        let cpu_percent = (1..=options.nodes)
            .map(|i| {
                let now = daemons
                    .pid(&mut lab, i)
                    .and_then(|pid| Some((pid, crate::soak::proc_usage(pid)?.0)));
                let spent = match (before[i - 1], now) {
                    (Some((p0, t0)), Some((p1, t1))) if p0 == p1 => t1.saturating_sub(t0),
                    (_, Some((_, t1))) => t1,
                    _ => 0,
                };
                // /proc counts USER_HZ ticks: 100 a second on Linux.
                (
                    lab.node(i).name.clone(),
                    spent as f64 / 100.0 / elapsed * 100.0,
                )
            })
            .collect();
        FloodReport {
            kind: kind.as_str(),
            pps,
            sent: flood.stop(),
            cpu_percent,
        }
    });
    let server_version = daemons.server_version();
    // The daemons stop before their namespaces go (the Kubernetes labs' kubelets and clients
    // live in them).
    drop(daemons);
    drop(responders);
    lab.teardown();
    let mut report = Report::new(options, samples, failed_trials, false_failovers);
    report.flood = flood;
    report.server_version = server_version;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_implementation_parses_from_its_cli_name() {
        for i in Implementation::ALL {
            assert_eq!(Implementation::parse(i.as_str()), Some(i));
        }
        assert_eq!(
            Implementation::parse("keepalived-fast"),
            Some(Implementation::KeepalivedFast)
        );
        assert_eq!(Implementation::parse("vrrp"), None);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let values: Vec<f64> = (1..=20).map(f64::from).collect();
        let p = percentiles(&values);
        assert_eq!((p.p50, p.p90, p.p99, p.max), (10.0, 18.0, 20.0, 20.0));
        assert_eq!(percentiles(&[]), Percentiles::default());
        assert_eq!(percentiles(&[7.0]).p99, 7.0);
    }

    #[test]
    fn report_json_has_the_contract_fields() {
        let options = Options {
            implementation: Implementation::Keepalived,
            scenario: Scenario::Poweroff,
            nodes: 3,
            trials: 2,
            loss: 0,
            probe_interval: Duration::from_millis(10),
            api_down: false,
            flood: None,
        };
        let report = Report::new(
            &options,
            vec![
                Sample {
                    failover_ms: 3000.0,
                    lost_probes: 300,
                    status_ms: None,
                },
                Sample {
                    failover_ms: 3400.0,
                    lost_probes: 340,
                    status_ms: None,
                },
            ],
            1,
            0,
        );
        let json: serde_json::Value = serde_json::to_value(&report).unwrap();
        for key in [
            "impl",
            "scenario",
            "nodes",
            "trials",
            "failover_ms",
            "lost_probes",
            "false_failovers",
            "samples",
        ] {
            assert!(json.get(key).is_some(), "{key} missing: {json}");
        }
        assert_eq!(json["impl"], "keepalived");
        assert_eq!(
            json["trials"], 3,
            "a failed trial still counts as run: {json}"
        );
        assert_eq!(json["failed_trials"], 1);
        assert_eq!(json["failover_ms"]["p50"], 3000.0);
        assert_eq!(json["lost_probes"]["max"], 340);
    }
}
