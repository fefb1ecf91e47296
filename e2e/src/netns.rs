//! The lab's network: real kernel networking in network namespaces that the lab makes itself.
//!
//! Topology for a run with id `R` and `N` nodes:
//!
//! ```text
//!   swl-R-cl (client, 198.51.100.2, 2001:db8:100::2)        swl-R-n1 ... swl-R-nN
//!        eth0                                               eth0 (198.51.100.11 ...)
//!          \_____ c0 ___ br0 (namespace swl-R-sw) ___ n1 ... nN ______/
//! ```
//!
//! Every name carries the run id (the lab's process id), so parallel runs never collide, and a
//! later run deletes what a dead run left behind ([`cleanup_stale`]). Addresses come from the
//! documentation ranges only. [`Lab`] tears everything down when dropped: processes started in
//! its namespaces are killed, the namespaces deleted (which deletes their interfaces).
//!
//! Everything here shells out to iproute2 (`ip`) and nftables (`nft`): the lab exercises the
//! same kernel paths an operator's hosts have, and needs root (CAP_NET_ADMIN).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use anyhow::{Context as _, Result, bail};

/// Prefix of every namespace the lab makes.
pub const PREFIX: &str = "swl-";
/// The most nodes a lab holds (their addresses are 198.51.100.11 to .90; VIPs start at .100).
pub const MAX_NODES: usize = 80;
const _: () = assert!(
    10 + MAX_NODES < 100,
    "node addresses must stay below the VIPs"
);
/// Client address.
pub const CLIENT_V4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 2);
/// Client IPv6 address.
pub const CLIENT_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 2);
/// The lab's IPv4 prefix length (198.51.100.0/24).
pub const PREFIX_V4: u8 = 24;
/// The lab's IPv6 prefix length (2001:db8:100::/64).
pub const PREFIX_V6: u8 = 64;

/// The `i`-th VIP of the lab (0-based): 198.51.100.100 + i.
pub fn vip_v4(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 51, 100, 100 + i)
}

/// The `i`-th IPv6 VIP of the lab (0-based): 2001:db8:100::100 + i.
pub fn vip_v6(i: u16) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 0x100 + i)
}

/// One node of the lab.
#[derive(Debug, Clone)]
pub struct Node {
    /// 1-based index.
    pub index: usize,
    /// Node name, as speakers see it: `node1`, `node2`, ...
    pub name: String,
    /// Network namespace.
    pub netns: String,
    /// IPv4 address on `eth0`.
    pub v4: Ipv4Addr,
    /// IPv6 address on `eth0`.
    pub v6: Ipv6Addr,
    /// MAC of `eth0`: `02:00:00:00:00:NN`, locally administered, readable in captures.
    pub mac: [u8; 6],
}

/// A running lab; dropping it tears it down.
#[derive(Debug)]
pub struct Lab {
    run_id: String,
    /// The nodes.
    pub nodes: Vec<Node>,
    /// The client's namespace.
    pub client_netns: String,
    /// The switch's namespace (holds `br0` and the node-side ends of the links).
    pub switch_netns: String,
    children: Vec<Child>,
    torn_down: bool,
}

impl Lab {
    /// Builds a lab of `nodes` nodes for this process. Deletes what dead runs left first.
    pub fn create(nodes: usize) -> Result<Lab> {
        Lab::create_with_id(nodes, &std::process::id().to_string())
    }

    /// Builds a lab with an explicit run id (tests running in one process use distinct ids:
    /// `<pid>x<n>`; the part before `x` must be the process id for [`cleanup_stale`]).
    pub fn create_with_id(nodes: usize, run_id: &str) -> Result<Lab> {
        if !(1..=MAX_NODES).contains(&nodes) {
            bail!("a lab has 1 to {MAX_NODES} nodes, not {nodes}");
        }
        if !is_root() {
            bail!("the lab needs root (CAP_NET_ADMIN) to make network namespaces");
        }
        cleanup_stale()?;
        let mut lab = Lab {
            run_id: run_id.to_string(),
            nodes: Vec::new(),
            client_netns: format!("{PREFIX}{run_id}-cl"),
            switch_netns: format!("{PREFIX}{run_id}-sw"),
            children: Vec::new(),
            torn_down: false,
        };
        // From here on a failure drops `lab`, which deletes whatever was made.
        lab.build(nodes)?;
        lab.wait_ready()?;
        Ok(lab)
    }

    fn build(&mut self, nodes: usize) -> Result<()> {
        let sw = self.switch_netns.clone();
        ip(&["netns", "add", &sw])?;
        self.nodes = (1..=nodes)
            .map(|i| Node {
                index: i,
                name: format!("node{i}"),
                netns: format!("{PREFIX}{}-n{i}", self.run_id),
                v4: Ipv4Addr::new(198, 51, 100, 10 + i as u8),
                v6: Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 0x10 + i as u16),
                mac: [0x02, 0, 0, 0, 0, i as u8],
            })
            .collect();
        ip_in(
            &sw,
            &[
                "link",
                "add",
                "br0",
                "type",
                "bridge",
                "forward_delay",
                "0",
                "mcast_snooping",
                "0",
            ],
        )?;
        ip_in(&sw, &["link", "set", "br0", "up"])?;
        ip_in(&sw, &["link", "set", "lo", "up"])?;
        let client = self.client_netns.clone();
        self.attach(
            &client,
            "c0",
            [0x02, 0, 0, 0, 0, 0xfe],
            CLIENT_V4,
            CLIENT_V6,
        )?;
        for node in self.nodes.clone() {
            self.attach(
                &node.netns,
                &format!("n{}", node.index),
                node.mac,
                node.v4,
                node.v6,
            )?;
        }
        Ok(())
    }

    /// Returns once every link of the lab carries frames: each `eth0` and switch port is up
    /// with its queue attached (the kernel attaches it after `ip link set up` returns, and
    /// drops what is sent before), and the client's ARP request for each node is answered by
    /// that node. A lab handed out earlier loses its first probes, which a test would count
    /// against whatever it measures.
    fn wait_ready(&self) -> Result<()> {
        let mut links = vec![(self.client_netns.clone(), "eth0".to_string())];
        links.push((self.switch_netns.clone(), "c0".to_string()));
        for node in &self.nodes {
            links.push((node.netns.clone(), "eth0".to_string()));
            links.push((self.switch_netns.clone(), format!("n{}", node.index)));
        }
        let deadline = tokio::time::Instant::now() + READY_LIMIT;
        for (netns, link) in &links {
            while !link_carries(netns, link)? {
                if tokio::time::Instant::now() > deadline {
                    bail!("{link} in {netns} is not up after {READY_LIMIT:?}");
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        for node in &self.nodes {
            let asker = crate::probe::ArpAsker::start(
                &self.client_netns,
                node.v4,
                std::time::Duration::from_millis(20),
                500,
            )?;
            let answered = || asker.snapshot().iter().any(|a| a.macs.contains(&node.mac));
            while !answered() {
                if tokio::time::Instant::now() > deadline {
                    bail!(
                        "{} does not answer the client's ARP after {READY_LIMIT:?}",
                        node.name
                    );
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            asker.stop();
        }
        Ok(())
    }

    /// Makes namespace `netns` with an `eth0` whose peer `port` is a port of the bridge.
    fn attach(
        &mut self,
        netns: &str,
        port: &str,
        mac: [u8; 6],
        v4: Ipv4Addr,
        v6: Ipv6Addr,
    ) -> Result<()> {
        ip(&["netns", "add", netns])?;
        // Neither end ever exists in the host's namespace.
        ip(&[
            "link",
            "add",
            "eth0",
            "netns",
            netns,
            "address",
            &mac_text(mac),
            "type",
            "veth",
            "peer",
            "name",
            port,
            "netns",
            &self.switch_netns,
        ])?;
        let sw = self.switch_netns.clone();
        ip_in(&sw, &["link", "set", port, "master", "br0"])?;
        ip_in(&sw, &["link", "set", port, "up"])?;
        sysctl_in(netns, "net.ipv6.conf.all.accept_dad", "0")?;
        sysctl_in(netns, "net.ipv6.conf.default.accept_dad", "0")?;
        sysctl_in(netns, "net.ipv6.conf.eth0.accept_dad", "0")?;
        ip_in(netns, &["link", "set", "lo", "up"])?;
        ip_in(
            netns,
            &["addr", "add", &format!("{v4}/{PREFIX_V4}"), "dev", "eth0"],
        )?;
        ip_in(
            netns,
            &[
                "-6",
                "addr",
                "add",
                &format!("{v6}/{PREFIX_V6}"),
                "dev",
                "eth0",
                "nodad",
            ],
        )?;
        ip_in(netns, &["link", "set", "eth0", "up"])?;
        Ok(())
    }

    /// The run id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The node with 1-based `index`.
    pub fn node(&self, index: usize) -> &Node {
        &self.nodes[index - 1]
    }

    /// A command that runs `program` inside `netns`.
    pub fn command_in(netns: &str, program: &str) -> Command {
        swimlb_control_plane::netns::command_in(netns, program)
    }

    /// Runs `program args` in `netns` to completion; fails on a non-zero exit, with its stderr.
    pub fn run_in(&self, netns: &str, program: &str, args: &[&str]) -> Result<String> {
        let out = Lab::command_in(netns, program)
            .args(args)
            .output()
            .with_context(|| format!("running {program}"))?;
        if !out.status.success() {
            bail!(
                "{program} {} in {netns}: {}: {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Starts `cmd` (built with [`Lab::command_in`]) and keeps it: it is killed at teardown.
    /// Returns its index for [`Lab::child`].
    pub fn spawn(&mut self, mut cmd: Command) -> Result<usize> {
        let child = cmd
            .stdin(Stdio::null())
            .spawn()
            .context("starting a lab process")?;
        self.children.push(child);
        Ok(self.children.len() - 1)
    }

    /// A process started with [`Lab::spawn`].
    pub fn child(&mut self, index: usize) -> &mut Child {
        &mut self.children[index]
    }

    /// Waits up to `limit` for the process started with [`Lab::spawn`] as `index` to exit, then
    /// kills it.
    pub fn wait_or_kill(&mut self, index: usize, limit: std::time::Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + limit;
        while self.children[index].try_wait()?.is_none() {
            if tokio::time::Instant::now() > deadline {
                let _ = self.children[index].kill();
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Ok(())
    }

    /// Takes the node's link down or up (a power-off as the network sees it).
    pub fn set_link(&self, index: usize, up: bool) -> Result<()> {
        let port = format!("n{index}");
        ip_in(
            &self.switch_netns,
            &["link", "set", &port, if up { "up" } else { "down" }],
        )
    }

    /// Drops `percent` % of the frames in and out of the node, at random (nftables `numgen`).
    /// `0` removes the rule.
    pub fn set_loss(&self, index: usize, percent: u8) -> Result<()> {
        let netns = &self.node(index).netns;
        let _ = self.run_in(
            netns,
            "nft",
            &["delete", "table", "inet", "swimlb_lab_loss"],
        );
        if percent == 0 {
            return Ok(());
        }
        if percent > 100 {
            bail!("loss is a percentage, not {percent}");
        }
        let verdict = if percent == 100 {
            "drop".to_string()
        } else {
            format!("numgen random mod 100 < {percent} drop")
        };
        let rules = format!(
            "table inet swimlb_lab_loss {{\n  chain in {{ type filter hook input priority -300; {verdict}; }}\n  chain out {{ type filter hook output priority -300; {verdict}; }}\n}}\n"
        );
        nft_apply(netns, &rules)
    }

    /// Every namespace of this lab.
    pub fn namespaces(&self) -> Vec<String> {
        let mut all = vec![self.switch_netns.clone(), self.client_netns.clone()];
        all.extend(self.nodes.iter().map(|n| n.netns.clone()));
        all
    }

    /// Kills the lab's processes and deletes its namespaces. Idempotent; also run on drop.
    pub fn teardown(&mut self) {
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for ns in self.namespaces() {
            delete_namespace(&ns);
        }
        if std::env::var_os("SWIMLB_LAB_KEEP").is_some() {
            // The marker keeps it from the next run's sweep of dead runs' leftovers too.
            let _ = std::fs::write(self.work_dir().join(KEPT_MARKER), "");
            eprintln!("SWIMLB_LAB_KEEP: kept {}", self.work_dir().display());
        } else {
            let _ = std::fs::remove_dir_all(self.work_dir());
        }
    }

    /// The directory for this run's files (daemon configurations, the gossip key, the daemons'
    /// logs); removed with the lab unless the environment sets `SWIMLB_LAB_KEEP`.
    pub fn work_dir(&self) -> PathBuf {
        work_dir_of(&self.run_id)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// Loads `rules` into `netns`'s nftables (`nft -f -`); fails with nft's message.
pub fn nft_apply(netns: &str, rules: &str) -> Result<()> {
    let mut child = Lab::command_in(netns, "nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running nft")?;
    use std::io::Write as _;
    child
        .stdin
        .take()
        .context("nft stdin")?
        .write_all(rules.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "nft in {netns}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Deletes the namespaces and work directories of lab runs whose process is gone (a crash or a
/// kill -9 of a run).
pub fn cleanup_stale() -> Result<()> {
    cleanup_runs(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
}

/// Deletes the namespaces and work directories of every lab run of process `pid` (used when the
/// process is interrupted: its labs are not dropped).
pub fn cleanup_runs_of(pid: u32) -> Result<()> {
    let pid = pid.to_string();
    cleanup_runs(|p| p == pid)
}

/// The process id a run id starts with (`<pid>` or `<pid>x<n>`), from a namespace name without
/// its prefix (`<run id>-<role>`) or a run id.
fn run_pid(rest: &str) -> &str {
    rest.split(['-', 'x']).next().unwrap_or("")
}

fn cleanup_runs(doomed: impl Fn(&str) -> bool) -> Result<()> {
    for ns in list_namespaces()? {
        let Some(rest) = ns.strip_prefix(PREFIX) else {
            continue;
        };
        let pid = run_pid(rest);
        if pid.is_empty() || doomed(pid) {
            delete_namespace(&ns);
        }
    }
    if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(run_id) = name.to_str().and_then(|n| n.strip_prefix(WORK_DIR_PREFIX)) else {
                continue;
            };
            let pid = run_pid(run_id);
            let kept = entry.path().join(KEPT_MARKER).exists();
            if !pid.is_empty() && doomed(pid) && !kept {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    Ok(())
}

const WORK_DIR_PREFIX: &str = "swimlb-lab-";
/// A file in a work directory kept by `SWIMLB_LAB_KEEP`: the sweep of dead runs leaves it.
const KEPT_MARKER: &str = "KEPT";

fn work_dir_of(run_id: &str) -> PathBuf {
    std::env::temp_dir().join(format!("{WORK_DIR_PREFIX}{run_id}"))
}

/// The names of all network namespaces.
pub fn list_namespaces() -> Result<Vec<String>> {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .context("running ip netns list")?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

fn delete_namespace(ns: &str) {
    // Processes keep a namespace alive after its name is gone: kill them first.
    if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = Command::new("kill").args(["-9", pid]).status();
        }
    }
    let _ = Command::new("ip")
        .args(["netns", "del", ns])
        .stderr(Stdio::null())
        .status();
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|uid| uid == "0"))
        })
        .unwrap_or(false)
}

/// Panics, naming `test`, unless this process runs as root. For tests marked
/// `#[ignore = "needs root: ..."]`: run with `--include-ignored` without root they fail with
/// this message instead of passing without checking anything.
#[track_caller]
pub fn require_root(test: &str) {
    assert!(
        is_root(),
        "{test}: needs root (CAP_NET_ADMIN) to make network namespaces; run it as root \
         (sudo ./test.sh runs every root test with --include-ignored)"
    );
}

/// How long a new lab's links may take to carry frames.
const READY_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether `link` in `netns` is operationally up with a queue attached (`qdisc noop` drops
/// every frame).
fn link_carries(netns: &str, link: &str) -> Result<bool> {
    let out = Command::new("ip")
        .args(["-n", netns, "-o", "link", "show", "dev", link])
        .output()
        .context("running ip (is iproute2 installed?)")?;
    if !out.status.success() {
        bail!(
            "ip link show {link} in {netns}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.contains("state UP") && !text.contains("qdisc noop"))
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (is iproute2 installed?)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn ip_in(netns: &str, args: &[&str]) -> Result<()> {
    let mut all = vec!["-n", netns];
    all.extend_from_slice(args);
    ip(&all)
}

fn sysctl_in(netns: &str, key: &str, value: &str) -> Result<()> {
    // /proc/sys/net is per network namespace; no sysctl binary needed.
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    let out = Lab::command_in(netns, "sh")
        .args(["-c", &format!("echo {value} > {path}")])
        .output()?;
    if !out.status.success() {
        bail!(
            "{key}={value} in {netns}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// `02:00:00:00:00:01`.
pub fn mac_text(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_of_dead_runs_leaves_a_kept_folder() {
        // A run id no process has (pids stay below 2^22 on Linux).
        let (kept, swept) = ("9999991x1", "9999991x2");
        for id in [kept, swept] {
            std::fs::create_dir_all(work_dir_of(id)).expect("a work folder");
        }
        std::fs::write(work_dir_of(kept).join(KEPT_MARKER), "").expect("the marker");
        cleanup_runs(|pid| pid == "9999991").expect("the sweep");
        assert!(work_dir_of(kept).exists());
        assert!(!work_dir_of(swept).exists());
        std::fs::remove_dir_all(work_dir_of(kept)).expect("removed");
    }

    #[test]
    fn addresses_stay_in_the_documentation_range() {
        assert_eq!(vip_v4(0), Ipv4Addr::new(198, 51, 100, 100));
        assert_eq!(vip_v6(1).to_string(), "2001:db8:100::101");
        assert_eq!(mac_text([2, 0, 0, 0, 0, 0x1f]), "02:00:00:00:00:1f");
    }
}
