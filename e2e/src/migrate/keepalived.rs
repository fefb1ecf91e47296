//! `swimlb-lab migrate --from keepalived-fast`: keepalived and swimlb's speakers side by side
//! in the namespace lab, the node-by-node switch of the book's "Switching from keepalived"
//! (docs/src/switching/keepalived.md).
//!
//! - Three keepalived-fast routers ([`Tuning::Fast`]: VRRPv3, `advert_int 0.1`), node1 MASTER
//!   with priority 101, the others 100; the client probes the VIP every 10 ms and asks for it
//!   by ARP every 10 ms.
//! - Node by node, the backups first and the master last: keepalived stops (SIGTERM), the
//!   speaker starts with what `convert-keepalived` makes of that node's keepalived.conf (its
//!   `vrrp:` included; the key file and the HTTP listener set, as a person does).
//! - At each mixed state (one, then two speakers beside keepalived) the MASTER crashes (its
//!   link goes down) `trials` times; the failover is timed from the crash to the first probe
//!   another node answers, and node1 then comes back as a restarted keepalived.
//! - The switch's figures (the crashes left out): probes lost, the longest time two MACs
//!   answered ARP, the longest run of unanswered probes, and whether node1, the highest
//!   priority, answers at the end and every speaker names it.
//! - Over the whole run, the crashes included, the chaos checker's invariants
//!   ([`super::checked`]): no two answerers and no dark VIP for longer than its limit, and the
//!   rule's owner (by the converted files' priorities) once each step has settled.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use tokio::time::Instant;

use super::checked::Timeline;
use crate::chaos::invariants::Violation;
use crate::chaos::schedule::FaultKind;
use crate::keepalived::{self, Instance, StateReader, Tuning, VRID};
use crate::lab::VrrpState;
use crate::netns::{self, Lab};

/// keepalived-fast's advertisement interval.
pub const ADVERT_INTERVAL: Duration = Duration::from_millis(100);

/// The `vrrp:` line of the lab's group for keepalived-fast's router (what `convert-keepalived`
/// writes for it), indented for [`crate::failover::SwimlbDaemons::group_extra`].
pub fn group_vrrp() -> String {
    format!(
        "    vrrp: {{vrid: {VRID}, advertInterval: {}ms}}\n",
        ADVERT_INTERVAL.as_millis()
    )
}

/// keepalived-fast on some of the lab's nodes, each with its own priority: the lab's IPv4 VIP,
/// or with [`Routers::ipv6`] its IPv6 VIP ([`config_v6`]).
#[derive(Debug, Default)]
pub struct Routers {
    children: BTreeMap<usize, usize>,
    states: BTreeMap<usize, StateReader>,
    ipv6: bool,
    unicast: bool,
}

/// keepalived-fast's configuration for the lab's IPv6 VIP (2001:db8:100::100/64 on `eth0`):
/// an instance with an IPv6 `virtual_ipaddress` is an IPv6 VRRPv3 router, advertising from the
/// interface's link-local address to ff02::12, the rest as [`keepalived::config`].
pub fn config_v6(node_name: &str, priority: u8, notify_fifo: &std::path::Path) -> String {
    format!(
        "global_defs {{\n    router_id {node_name}\n    enable_script_security\n    notify_fifo {} root\n}}\n\
         vrrp_instance lab {{\n    state BACKUP\n    interface eth0\n    version 3\n    \
         virtual_router_id {VRID}\n    priority {priority}\n    advert_int 0.1\n    \
         virtual_ipaddress {{\n        {}/{} dev eth0\n    }}\n}}\n",
        notify_fifo.display(),
        netns::vip_v6(0),
        netns::PREFIX_V6,
    )
}

impl Routers {
    /// Routers of the lab's IPv6 VIP instead of its IPv4 one.
    pub fn ipv6() -> Routers {
        Routers {
            ipv6: true,
            ..Routers::default()
        }
    }

    /// IPv4 routers in unicast mode: `unicast_src_ip` the node's address, `unicast_peer` the
    /// other nodes' (keepalived then joins no multicast group).
    pub fn unicast() -> Routers {
        Routers {
            unicast: true,
            ..Routers::default()
        }
    }

    /// The VIP these routers hold, as `ip addr` writes it.
    fn vip(&self) -> String {
        if self.ipv6 {
            format!("{}/{}", netns::vip_v6(0), netns::PREFIX_V6)
        } else {
            format!("{}/{}", netns::vip_v4(0), netns::PREFIX_V4)
        }
    }

    /// Starts keepalived-fast on node `index` with `priority` (its notify FIFO read from then on).
    pub fn start(&mut self, lab: &mut Lab, index: usize, priority: u8) -> Result<()> {
        let node = lab.node(index).clone();
        let dir = lab.work_dir();
        std::fs::create_dir_all(&dir)?;
        let instance = Instance::paths(&dir, &node.name);
        let mut text = if self.ipv6 {
            config_v6(&node.name, priority, &instance.fifo)
        } else {
            keepalived::config(
                &node.name,
                netns::vip_v4(0),
                netns::PREFIX_V4,
                priority,
                Tuning::Fast,
                &instance.fifo,
            )
        };
        if self.unicast {
            let peers: String = lab
                .nodes
                .iter()
                .filter(|n| n.name != node.name)
                .map(|n| format!("        {}\n", n.v4))
                .collect();
            let unicast = format!(
                "    interface eth0\n    unicast_src_ip {}\n    unicast_peer {{\n{peers}    }}\n",
                node.v4
            );
            text = text.replacen("    interface eth0\n", &unicast, 1);
        }
        std::fs::write(&instance.config, text)
            .with_context(|| format!("writing {}", instance.config.display()))?;
        match self.states.get(&index) {
            Some(reader) => reader.forget(),
            None => {
                self.states
                    .insert(index, StateReader::start(&instance.fifo)?);
            }
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("keepalived-{}.log", node.name)))?;
        let mut cmd = Lab::command_in(&node.netns, "keepalived");
        cmd.args(instance.args())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = lab.spawn(cmd)?;
        self.children.insert(index, child);
        Ok(())
    }

    /// Stops node `index`'s keepalived with SIGTERM (it sends priority 0 and takes the VIP off
    /// `eth0`, as `systemctl stop keepalived` does) and waits for it to exit.
    pub fn stop(&mut self, lab: &mut Lab, index: usize) -> Result<()> {
        self.signal(lab, index, "TERM")
    }

    /// Crashes node `index`'s keepalived with SIGKILL (no priority 0: its backups wait for
    /// Master_Down_Interval) and takes the VIP it leaves on `eth0` away, as the crashed node's
    /// kernel would not answer for it. The parent is stopped first, so that it neither restarts
    /// its VRRP process nor lets it go with a SIGTERM (a clean stop), then both are killed.
    pub fn kill(&mut self, lab: &mut Lab, index: usize) -> Result<()> {
        let Some(child) = self.children.get(&index) else {
            bail!("no keepalived runs on node {index}");
        };
        let parent = lab.child(*child).id().to_string();
        let instance = Instance::paths(&lab.work_dir(), &lab.node(index).name);
        let vrrp = std::fs::read_to_string(&instance.vrrp_pid)
            .with_context(|| format!("reading {}", instance.vrrp_pid.display()))?;
        let kill = |args: &[&str]| std::process::Command::new("kill").args(args).status();
        kill(&["-STOP", &parent])?;
        kill(&["-KILL", vrrp.trim()])?;
        self.signal(lab, index, "KILL")?;
        // The killed VRRP process may stay a zombie nobody reaps in the lab, which a restarted
        // keepalived takes for a running one ("daemon is already running"): its pid files go,
        // as a crashed host's /run does.
        for pid in [&instance.pid, &instance.vrrp_pid] {
            let _ = std::fs::remove_file(pid);
        }
        Ok(())
    }

    fn signal(&mut self, lab: &mut Lab, index: usize, signal: &str) -> Result<()> {
        let Some(child) = self.children.remove(&index) else {
            bail!("no keepalived runs on node {index}");
        };
        let pid = lab.child(child).id().to_string();
        std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()?;
        lab.wait_or_kill(child, Duration::from_secs(10))?;
        let vip = self.vip();
        let netns = lab.node(index).netns.clone();
        // Gone already when keepalived stopped cleanly; a leftover would answer ARP.
        let _ = lab.run_in(&netns, "ip", &["addr", "del", &vip, "dev", "eth0"]);
        Ok(())
    }

    /// The last state node `index`'s keepalived reported.
    pub fn state(&self, index: usize) -> Option<VrrpState> {
        self.states.get(&index).and_then(StateReader::state)
    }

    /// Whether keepalived runs on node `index`.
    pub fn running(&self, index: usize) -> bool {
        self.children.contains_key(&index)
    }

    /// Waits (at most `limit`) until node `index`'s keepalived reports `state`.
    pub fn wait_state(&self, index: usize, state: &VrrpState, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        while self.state(index).as_ref() != Some(state) {
            if Instant::now() > deadline {
                bail!(
                    "keepalived on node {index} is {:?}, not {state:?}, after {limit:?}",
                    self.state(index)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }
}

/// The lab's priorities: node1 is keepalived's MASTER (101), the others 100, as in the book's
/// worked example; the converted files carry them over, so node1 owns at the end too.
pub fn priority_of(index: usize) -> u8 {
    if index == 1 { 101 } else { 100 }
}

/// How long each stage may take (a functional bound, not a measurement).
const STAGE: Duration = Duration::from_secs(30);
/// The client's probe interval, and its ARP requests'.
const PROBE_INTERVAL: Duration = Duration::from_millis(10);
/// How long the lab lets each switched node settle before the next step.
const SETTLE: Duration = Duration::from_secs(3);

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Crashes of the owner at each mixed state (one and two speakers beside keepalived).
    pub trials: usize,
}

/// One node switched from keepalived to a speaker.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Switched {
    /// The node.
    pub node: String,
    /// Probes sent from keepalived's stop there until the next step, and those lost.
    pub probes: usize,
    pub lost_probes: usize,
    /// The longest time two MACs answered ARP for the VIP, and nobody answered a probe.
    pub dual_ms: f64,
    pub dark_ms: f64,
    /// Who answered the probes at the end of the step.
    pub answering: Option<String>,
}

/// The owner crashed (its link down) at one mixed state.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MixedFailover {
    /// Speakers beside keepalived.
    pub speakers: usize,
    /// From the crash to the first probe another node answered, per trial.
    pub failover_ms: Vec<f64>,
    /// Probes lost per trial.
    pub lost_probes: Vec<u64>,
    /// Who took over, per trial.
    pub taken_by: Vec<String>,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// The report of `swimlb-lab migrate --from keepalived-fast`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// `keepalived-fast`.
    pub from: &'static str,
    /// Probes lost during the switch (the crashes excluded).
    pub lost_probes: usize,
    /// The longest time two MACs answered ARP for the VIP during the switch.
    pub max_dual_ms: f64,
    /// The longest run of unanswered probes during the switch.
    pub max_dark_ms: f64,
    /// The rule's owner (node1, priority 101) answers and every speaker names it.
    pub final_owner_ok: bool,
    pub final_owner: Option<String>,
    pub steps: Vec<Switched>,
    pub failovers: Vec<MixedFailover>,
    /// The chaos checker's violations over the whole run, crashes included (see
    /// [`super::checked`]); those seen around a partition are marked excused.
    pub violations: Vec<Violation>,
}

impl Report {
    /// The violations not excused.
    pub fn violated(&self) -> impl Iterator<Item = &Violation> {
        self.violations.iter().filter(|v| !v.excused)
    }
}

impl Report {
    /// The report as the terminal shows it.
    pub fn table(&self) -> String {
        let mut out = format!(
            "switch from {}: lost probes {}, max dual {:.0} ms, max dark {:.0} ms, final owner {:?} ({})\n",
            self.from,
            self.lost_probes,
            self.max_dual_ms,
            self.max_dark_ms,
            self.final_owner,
            if self.final_owner_ok {
                "the rule's"
            } else {
                "NOT the rule's"
            }
        );
        for s in &self.steps {
            out.push_str(&format!(
                "  {}: {} probes, {} lost, dual {:.0} ms, dark {:.0} ms, answered by {:?}\n",
                s.node, s.probes, s.lost_probes, s.dual_ms, s.dark_ms, s.answering
            ));
        }
        for f in &self.failovers {
            out.push_str(&format!(
                "  owner crashed beside {} speaker(s): failover p50 {:.0} ms, p99 {:.0} ms, lost {:?}, taken by {:?}\n",
                f.speakers, f.p50_ms, f.p99_ms, f.lost_probes, f.taken_by
            ));
        }
        out.push_str(&format!(
            "  the chaos checker's invariants: {} violation(s)\n",
            self.violated().count()
        ));
        for v in &self.violations {
            out.push_str(&format!("    {v}\n"));
        }
        out
    }
}

/// Waits (at most [`STAGE`]) until `owner` answers the probes steadily; the last steady
/// answerer otherwise.
fn wait_for_owner(prober: &crate::probe::Prober, owner: &str) -> Result<String> {
    let deadline = Instant::now() + STAGE;
    loop {
        let steady = crate::trial::wait_for_steady_owner(prober, 100, STAGE)?;
        if steady == owner || Instant::now() > deadline {
            return Ok(steady);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The longest run of lost probes among `records`, from the first lost probe's sending to the
/// next answered one's (ms).
fn longest_dark(records: &[crate::probe::ProbeRecord]) -> f64 {
    let mut longest = Duration::ZERO;
    let mut since: Option<Instant> = None;
    for r in records {
        match (&r.answer, since) {
            (None, None) => since = Some(r.sent),
            (Some(_), Some(start)) => {
                longest = longest.max(r.sent - start);
                since = None;
            }
            _ => {}
        }
    }
    longest.as_secs_f64() * 1000.0
}

/// The longest run of ARP requests two or more MACs replied to (ms, one interval per request).
fn longest_dual(answers: &[crate::probe::ArpAnswers]) -> f64 {
    let (mut longest, mut run) = (0usize, 0usize);
    for a in answers {
        run = if a.macs.len() >= 2 { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    (PROBE_INTERVAL * longest as u32).as_secs_f64() * 1000.0
}

/// The lab during the switch: keepalived where it still runs, speakers where it was switched.
struct Switch {
    lab: Lab,
    routers: Routers,
    program: std::path::PathBuf,
    keys: std::path::PathBuf,
    speakers: BTreeMap<usize, usize>,
    prober: crate::probe::Prober,
    asker: crate::probe::ArpAsker,
    asker_start: Instant,
    _responders: Vec<crate::probe::Worker>,
    /// The faults and `/status` reads, for the checker.
    timeline: Timeline,
    /// Per node (index 0 is node1), the priority of its router or of its converted file.
    priorities: Vec<u8>,
    /// The converted files' `preemptDelay`.
    preempt_delay: Duration,
}

impl Switch {
    /// node `index`'s speaker with the file `convert-keepalived` makes of its keepalived.conf
    /// (the key file and the HTTP listener set, as step 1 of the book has a person do).
    fn start_speaker(&mut self, index: usize) -> Result<()> {
        let node = self.lab.node(index).clone();
        let dir = self.lab.work_dir();
        let conf = Instance::paths(&dir, &node.name).config;
        let mut cmd = std::process::Command::new(&self.program);
        cmd.args([
            "speaker",
            "convert-keepalived",
            "--bind",
            &node.v4.to_string(),
        ]);
        for other in self.lab.nodes.iter().filter(|n| n.index != index) {
            cmd.args(["--peer", &other.v4.to_string()]);
        }
        let out = cmd
            .arg(&conf)
            .output()
            .context("running convert-keepalived")?;
        if !out.status.success() {
            bail!(
                "convert-keepalived refused {}: {}",
                conf.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let yaml = String::from_utf8(out.stdout)?.replace(
            "keyFile: /etc/swimlb/keys",
            &format!("keyFile: {}", self.keys.display()),
        ) + &format!("listen: {}:{}\n", node.v4, crate::lab::HTTP_PORT);
        let path = dir.join(format!("{}-converted.yaml", node.name));
        std::fs::write(&path, &yaml)?;
        let converted = swimlb_config::standalone::Standalone::parse(&yaml)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        if let Some(group) = converted.groups.first() {
            self.priorities[index - 1] = group.priority.of(&node.name);
            self.preempt_delay = group.preempt_delay;
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{}.log", node.name)))?;
        let program = self.program.to_string_lossy().into_owned();
        let mut cmd = Lab::command_in(&node.netns, &program);
        cmd.args(["speaker", "standalone", "--config"])
            .arg(&path)
            .stdout(std::process::Stdio::null())
            .stderr(log);
        let child = self.lab.spawn(cmd)?;
        self.speakers.insert(index, child);
        Ok(())
    }

    /// Stops keepalived on node `index` and starts its speaker; the step's figures once it
    /// has settled.
    fn switch_node(&mut self, index: usize) -> Result<(Instant, Instant)> {
        let start = Instant::now();
        self.routers.stop(&mut self.lab, index)?;
        let kill = FaultKind::Kill { node: index };
        let stopped = self.timeline.apply(kill, start, Instant::now());
        let starting = Instant::now();
        self.start_speaker(index)?;
        self.timeline.undo(stopped, starting, Instant::now());
        std::thread::sleep(SETTLE);
        Ok((start, Instant::now()))
    }

    /// One round of `/status` reads for the checker: the speakers' views once every node runs
    /// one (see [`super::checked`]), none before.
    fn poll(&mut self) {
        let at = Instant::now();
        let every = self.speakers.len() == self.lab.nodes.len();
        let addrs = crate::lab::http_addrs(&self.lab);
        let vip = [netns::vip_v4(0)];
        let owners = crate::probe::in_netns(&self.lab.client_netns, move || {
            addrs
                .iter()
                .map(|a| {
                    let body = crate::lab::http_get(*a, "/status")?;
                    crate::chaos::owners_named(&body, &vip)?.into_iter().next()
                })
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
        let owners = owners
            .into_iter()
            .map(|o| if every { o } else { None })
            .collect();
        self.timeline.poll(at, Instant::now(), owners);
    }

    fn step(&self, index: usize, (from, to): (Instant, Instant)) -> Switched {
        let records: Vec<_> = self
            .prober
            .snapshot()
            .into_iter()
            .filter(|r| r.sent >= from && r.sent < to)
            .collect();
        let arp: Vec<_> = self
            .asker
            .snapshot()
            .into_iter()
            .filter(|a| {
                let at = self.asker_start + a.at;
                at >= from && at < to
            })
            .collect();
        Switched {
            node: self.lab.node(index).name.clone(),
            probes: records.len(),
            lost_probes: records.iter().filter(|r| r.answer.is_none()).count(),
            dual_ms: longest_dual(&arp),
            dark_ms: longest_dark(&records),
            answering: records
                .iter()
                .rev()
                .find_map(|r| r.answer.as_ref().map(|(n, _)| n.clone())),
        }
    }

    /// Crashes node1 (keepalived's MASTER: its link goes down) `trials` times beside
    /// `speakers` speakers; after each, node1 comes back as a restarted keepalived.
    fn crash_owner(&mut self, speakers: usize, trials: usize) -> Result<MixedFailover> {
        let mut f = MixedFailover {
            speakers,
            failover_ms: Vec::new(),
            lost_probes: Vec::new(),
            taken_by: Vec::new(),
            p50_ms: 0.0,
            p99_ms: 0.0,
        };
        for _ in 0..trials {
            let before = wait_for_owner(&self.prober, "node1");
            if before.as_ref().ok().map(String::as_str) != Some("node1") {
                bail!(
                    "node1's keepalived does not answer before the crash ({before:?}, keepalived {:?})\n{}",
                    self.routers.state(1),
                    self.logs()
                );
            }
            let fault = Instant::now();
            self.lab.set_link(1, false)?;
            let link = FaultKind::LinkFlap { node: 1 };
            let down = self.timeline.apply(link, fault, Instant::now());
            let sample =
                crate::trial::wait_failover(&self.prober, fault, "node1", Duration::from_secs(5))
                    .context("nobody took the VIP over from the crashed keepalived")?;
            std::thread::sleep(Duration::from_millis(500));
            f.failover_ms.push(sample.failover_ms);
            f.lost_probes.push(sample.lost_probes);
            f.taken_by
                .push(self.prober.current_owner().unwrap_or_default());
            // node1 restarts: keepalived stops in its isolated namespace, the link comes back,
            // keepalived starts and preempts with 101.
            let stopping = Instant::now();
            self.routers.stop(&mut self.lab, 1)?;
            let kill = FaultKind::Kill { node: 1 };
            let stopped = self.timeline.apply(kill, stopping, Instant::now());
            let up = Instant::now();
            self.lab.set_link(1, true)?;
            self.timeline.undo(down, up, Instant::now());
            let starting = Instant::now();
            self.routers.start(&mut self.lab, 1, priority_of(1))?;
            self.timeline.undo(stopped, starting, Instant::now());
            self.routers.wait_state(1, &VrrpState::Master, STAGE)?;
        }
        let p = crate::trial::percentiles(&f.failover_ms);
        (f.p50_ms, f.p99_ms) = (p.p50, p.p99);
        Ok(f)
    }

    /// The speakers' logs, for errors.
    fn logs(&self) -> String {
        let dir = self.lab.work_dir();
        let keepalived: String = (1..=3)
            .map(|i| {
                let name = &self.lab.node(i).name;
                let log = std::fs::read_to_string(dir.join(format!("keepalived-{name}.log")))
                    .unwrap_or_default();
                format!("--- keepalived {name} ---\n{log}")
            })
            .collect();
        keepalived
            + &self
                .speakers
                .keys()
                .map(|i| {
                    let name = &self.lab.node(*i).name;
                    let log = std::fs::read_to_string(dir.join(format!("{name}.log")))
                        .unwrap_or_default();
                    format!("--- {name} ---\n{log}")
                })
                .collect::<String>()
    }

    /// Whether every speaker names `owner` for the VIP in its `/status`.
    fn speakers_agree_on(&self, owner: &str) -> bool {
        let vip = netns::vip_v4(0).to_string();
        let addrs = crate::lab::http_addrs(&self.lab);
        let owner = owner.to_string();
        crate::probe::in_netns(&self.lab.client_netns, move || {
            addrs.iter().all(|a| {
                crate::lab::http_get(*a, "/status")
                    .and_then(|b| serde_json::from_str::<serde_json::Value>(&b).ok())
                    .and_then(|v| {
                        v["addresses"]
                            .as_array()?
                            .iter()
                            .find(|x| x["ip"] == vip.as_str())
                            .map(|x| x["owner"] == owner.as_str())
                    })
                    .unwrap_or(false)
            })
        })
        .unwrap_or(false)
    }
}

/// Runs the switch (see the module docs); `program` is the lab binary (its `speaker` command).
pub fn run(
    program: std::path::PathBuf,
    options: &Options,
    progress: &mut dyn FnMut(&str),
) -> Result<Report> {
    let mut lab = Lab::create(3)?;
    let mut responders = Vec::new();
    for node in lab.nodes.clone() {
        responders.extend(crate::probe::spawn_responder(&node.netns, &node.name)?);
    }
    let keys = crate::failover::SwimlbDaemons::new(&lab, program.clone())?
        .dir()
        .join("keys");
    let mut routers = Routers::default();
    for i in 1..=3 {
        routers.start(&mut lab, i, priority_of(i))?;
    }
    routers.wait_state(1, &VrrpState::Master, STAGE)?;
    progress("keepalived-fast on 3 nodes, node1 MASTER (101)");
    let vip = netns::vip_v4(0);
    let target = std::net::SocketAddr::new(vip.into(), crate::probe::PROBE_PORT);
    let prober = crate::probe::Prober::start(&lab.client_netns, target, PROBE_INTERVAL)?;
    let asker_start = Instant::now();
    let asker = crate::probe::ArpAsker::start(&lab.client_netns, vip, PROBE_INTERVAL, 1_000_000)?;
    let mut s = Switch {
        lab,
        routers,
        program,
        keys,
        speakers: BTreeMap::new(),
        prober,
        asker,
        asker_start,
        _responders: responders,
        timeline: Timeline::new(asker_start),
        priorities: (1..=3).map(priority_of).collect(),
        preempt_delay: Duration::ZERO,
    };
    let owner = wait_for_owner(&s.prober, "node1")?;
    if owner != "node1" {
        bail!("keepalived's MASTER is node1, but {owner} answers");
    }
    let mut windows = Vec::new();
    let mut failovers = Vec::new();
    for (index, speakers) in [(3, 1), (2, 2), (1, 3)] {
        windows.push((index, s.switch_node(index)?));
        s.poll();
        progress(&format!("node{index} switched: {speakers} speaker(s)"));
        if speakers < 3 && options.trials > 0 {
            let f = s.crash_owner(speakers, options.trials)?;
            progress(&format!(
                "owner crashed beside {speakers} speaker(s): p99 {:.0} ms",
                f.p99_ms
            ));
            failovers.push(f);
        }
    }
    let final_owner = wait_for_owner(&s.prober, "node1").ok();
    let final_owner_ok = final_owner.as_deref() == Some("node1") && s.speakers_agree_on("node1");
    std::thread::sleep(Duration::from_millis(500));
    s.poll();
    let violations = s.timeline.evaluate(
        &s.lab,
        vip,
        s.priorities.clone(),
        s.preempt_delay,
        (&s.prober.snapshot(), &s.asker.snapshot(), s.asker_start),
    );
    let steps: Vec<Switched> = windows.iter().map(|(i, w)| s.step(*i, *w)).collect();
    Ok(Report {
        from: "keepalived-fast",
        lost_probes: steps.iter().map(|s| s.lost_probes).sum(),
        max_dual_ms: steps.iter().map(|s| s.dual_ms).fold(0.0, f64::max),
        max_dark_ms: steps.iter().map(|s| s.dark_ms).fold(0.0, f64::max),
        final_owner_ok,
        final_owner,
        steps,
        failovers,
        violations,
    })
}
