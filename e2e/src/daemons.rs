//! The daemons a lab runs on its nodes, behind one trait: swimlb's standalone speakers and
//! keepalived as the lab's processes, swimlb in Kubernetes mode and MetalLB on real nodes
//! ([`crate::realnode::daemons`]). Each starts, signals and restarts its node's daemon and
//! reports what the daemons say about the VIP.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::keepalived;
use crate::kubelab;
use crate::lab::{GOSSIP_PORT, HTTP_PORT, SpeakerView, Views, http_addrs, read_each, rule};
use crate::netns::{self, Lab};

/// Which load balancer a lab runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Implementation {
    /// swimlb's standalone speaker.
    Swimlb,
    /// Debian's keepalived with its defaults.
    Keepalived,
    /// keepalived tuned for speed: VRRPv3, `advert_int 0.1`, everything else default.
    KeepalivedFast,
    /// swimlb's speaker in Kubernetes mode, on real nodes ([`crate::realnode::daemons`]).
    SwimlbKubernetes,
    /// MetalLB's controller and speakers from its own images and manifest, on real nodes
    /// ([`crate::realnode::metallb`]).
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
    /// Waits until the cluster under the daemons is fully up (real nodes: every Node Ready,
    /// every speaker Ready, the Service's endpoints and IP), before a trial converges; fails
    /// saying what is not.
    fn wait_up(&mut self, _lab: &Lab) -> Result<()> {
        Ok(())
    }
    /// Each Node's kubelet and runtime versions, on real nodes.
    fn node_info(&self) -> Vec<crate::realnode::cluster::NodeInfo> {
        Vec::new()
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
        swimlb_config::keyfile::write_key_file(
            &dir.join("keys"),
            &format!("{}\n", swimlb_config::keyfile::encode_key(&key)),
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
        })
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
        let path = self.dir.join(format!("{}.yaml", lab.node(index).name));
        std::fs::write(&path, self.config(lab, index))?;
        let program = self.program.to_string_lossy().into_owned();
        let mut cmd = Lab::command_in(&lab.node(index).netns, &program);
        cmd.args(["speaker", "standalone", "--config"]).arg(&path);
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
        Views::Swimlb(read_each(lab, http_addrs(lab), "/status", 3, speaker_view))
    }

    fn pid(&mut self, lab: &mut Lab, index: usize) -> Option<u32> {
        SwimlbDaemons::pid(self, lab, index)
    }

    /// MetalLB's order over every node: equal priorities, no checks, every node eligible. A test that gives nodes their own group settings checks its own placement.
    fn expected_owner(&self, lab: &Lab) -> Option<String> {
        if !self.group_extra.is_empty() {
            return None;
        }
        let names: Vec<&str> = lab.nodes.iter().map(|n| n.name.as_str()).collect();
        rule::metallb_owner(&names, std::net::IpAddr::V4(netns::vip_v4(0)))
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
