//! keepalived as the lab's comparison peer, one instance per node namespace, in two tunings:
//!
//! - [`Tuning::Defaults`]: Debian's keepalived with its defaults (VRRPv2, `advert_int 1`), the
//!   way the seeds' operators run it;
//! - [`Tuning::Fast`]: the fastest keepalived an operator could configure: VRRPv3 and
//!   `advert_int 0.1`, everything else default.
//!
//! Every node is a BACKUP with priority 100 for one VIP on `eth0`, preemption on; the first to
//! time out becomes MASTER. The only line the lab adds is `notify_fifo`: each instance reports
//! its state changes, in order, into a FIFO that [`StateReader`] reads, so the lab knows which
//! node keepalived itself made MASTER (see [`crate::converge`]).

use std::fmt::Write as _;
use std::io::Read as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use crate::lab::VrrpState;

/// The VRRP router id the lab uses.
pub const VRID: u8 = 51;

/// How keepalived is configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tuning {
    /// Debian's defaults: VRRPv2, `advert_int 1`.
    Defaults,
    /// Tuned for speed: VRRPv3, `advert_int 0.1`, everything else default.
    Fast,
}

/// The keepalived configuration of one lab node; state changes go to the FIFO `notify_fifo`.
pub fn config(
    node_name: &str,
    vip: Ipv4Addr,
    prefix_len: u8,
    priority: u8,
    tuning: Tuning,
    notify_fifo: &Path,
) -> String {
    let (version, advert_int) = match tuning {
        Tuning::Defaults => ("", "1"),
        Tuning::Fast => ("    version 3\n", "0.1"),
    };
    let mut c = String::new();
    let _ = writeln!(
        c,
        "global_defs {{\n    router_id {node_name}\n    enable_script_security\n    notify_fifo {} root\n}}",
        notify_fifo.display()
    );
    let _ = writeln!(
        c,
        "vrrp_instance lab {{\n    state BACKUP\n    interface eth0\n{version}    virtual_router_id {VRID}\n    priority {priority}\n    advert_int {advert_int}\n    virtual_ipaddress {{\n        {vip}/{prefix_len} dev eth0\n    }}\n}}"
    );
    c
}

/// Files of one keepalived instance.
#[derive(Debug, Clone)]
pub struct Instance {
    /// The configuration file.
    pub config: PathBuf,
    /// Parent pid file.
    pub pid: PathBuf,
    /// VRRP child pid file.
    pub vrrp_pid: PathBuf,
    /// The FIFO its state changes go to.
    pub fifo: PathBuf,
}

impl Instance {
    /// The files of `node_name`'s instance under `dir`.
    pub fn paths(dir: &Path, node_name: &str) -> Instance {
        Instance {
            config: dir.join(format!("keepalived-{node_name}.conf")),
            pid: dir.join(format!("keepalived-{node_name}.pid")),
            vrrp_pid: dir.join(format!("keepalived-{node_name}-vrrp.pid")),
            fifo: dir.join(format!("keepalived-{node_name}.fifo")),
        }
    }

    /// Writes the configuration of `node_name` under `dir`.
    pub fn write(
        dir: &Path,
        node_name: &str,
        vip: Ipv4Addr,
        prefix_len: u8,
        tuning: Tuning,
    ) -> Result<Instance> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let instance = Instance::paths(dir, node_name);
        std::fs::write(
            &instance.config,
            self::config(node_name, vip, prefix_len, 100, tuning, &instance.fifo),
        )
        .with_context(|| format!("writing {}", instance.config.display()))?;
        Ok(instance)
    }

    /// The command line, to run inside the node's namespace.
    pub fn args(&self) -> Vec<String> {
        vec![
            "--dont-fork".into(),
            "--log-console".into(),
            "--vrrp".into(),
            format!("--use-file={}", self.config.display()),
            format!("--pid={}", self.pid.display()),
            format!("--vrrp_pid={}", self.vrrp_pid.display()),
        ]
    }
}

/// The state an instance's notify FIFO line reports (`INSTANCE "lab" MASTER 100`), if it
/// reports one: `MASTER_RX_LOWER_PRI` is an event a MASTER reports (an advert of lower priority
/// arrived), not a change of state.
pub fn fifo_state(line: &str) -> Option<VrrpState> {
    let mut words = line.split_whitespace();
    if words.next()? != "INSTANCE" {
        return None;
    }
    words.next()?;
    match words.next()? {
        "MASTER_RX_LOWER_PRI" => None,
        word => Some(VrrpState::parse(word)),
    }
}

/// Reads one instance's notify FIFO in a thread and keeps the last state reported.
///
/// The FIFO is made here and opened read-write, so it outlives restarts of keepalived (which
/// leaves a FIFO it did not create in place) and the reader never sees end-of-file.
#[derive(Debug)]
pub struct StateReader {
    state: Arc<Mutex<Option<VrrpState>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StateReader {
    /// Makes the FIFO at `path` and starts reading it.
    pub fn start(path: &Path) -> Result<StateReader> {
        if !path.exists() {
            let made = std::process::Command::new("mkfifo")
                .arg(path)
                .status()
                .context("running mkfifo")?;
            if !made.success() {
                bail!("mkfifo {}: {made}", path.display());
            }
        }
        use std::os::unix::fs::OpenOptionsExt as _;
        let mut fifo = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        let state: Arc<Mutex<Option<VrrpState>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (seen, flag) = (state.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("keepalived-state".into())
            .spawn(move || {
                let mut pending = String::new();
                let mut buf = [0u8; 512];
                while !flag.load(Ordering::Relaxed) {
                    match fifo.read(&mut buf) {
                        Ok(n) if n > 0 => {
                            pending.push_str(&String::from_utf8_lossy(&buf[..n]));
                            while let Some(end) = pending.find('\n') {
                                let line: String = pending.drain(..=end).collect();
                                if let Some(s) = fifo_state(&line) {
                                    *seen.lock().expect("keepalived state") = Some(s);
                                }
                            }
                        }
                        _ => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })?;
        Ok(StateReader {
            state,
            stop,
            thread: Some(thread),
        })
    }

    /// The last state reported since the last [`StateReader::forget`].
    pub fn state(&self) -> Option<VrrpState> {
        self.state.lock().expect("keepalived state").clone()
    }

    /// Forgets the state (a new instance is starting, or the old one was killed).
    pub fn forget(&self) {
        *self.state.lock().expect("keepalived state") = None;
    }
}

impl Drop for StateReader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_uses_keepalived_defaults() {
        let c = config(
            "node1",
            Ipv4Addr::new(198, 51, 100, 100),
            24,
            100,
            Tuning::Defaults,
            Path::new("/run/k.fifo"),
        );
        assert!(c.contains("advert_int 1\n"));
        assert!(!c.contains("version"));
        assert!(c.contains("virtual_router_id 51"));
        assert!(c.contains("198.51.100.100/24 dev eth0"));
        assert!(c.contains("state BACKUP"));
        assert!(c.contains("notify_fifo /run/k.fifo root"));
        assert!(!c.contains("nopreempt"));
    }

    #[test]
    fn fast_config_is_vrrp3_with_a_tenth_of_a_second_advert_and_nothing_else() {
        let vip = Ipv4Addr::new(198, 51, 100, 100);
        let fifo = Path::new("/run/k.fifo");
        let fast = config("node1", vip, 24, 100, Tuning::Fast, fifo);
        assert!(fast.contains("    version 3\n"));
        assert!(fast.contains("advert_int 0.1\n"));
        let defaults = config("node1", vip, 24, 100, Tuning::Defaults, fifo);
        let changed: Vec<&str> = fast
            .lines()
            .filter(|l| !defaults.lines().any(|d| d == *l))
            .collect();
        assert_eq!(changed, ["    version 3", "    advert_int 0.1"]);
    }

    #[test]
    fn fifo_lines_give_the_state() {
        assert_eq!(
            fifo_state("INSTANCE \"lab\" MASTER 100\n"),
            Some(VrrpState::Master)
        );
        assert_eq!(
            fifo_state("INSTANCE \"lab\" BACKUP 100"),
            Some(VrrpState::Backup)
        );
        assert_eq!(fifo_state("INSTANCE \"lab\" MASTER_RX_LOWER_PRI 100"), None);
        assert_eq!(fifo_state("GROUP \"g\" MASTER 100"), None);
        assert_eq!(fifo_state(""), None);
    }
}
