//! keepalived as the lab's comparison peer: Debian's keepalived with its defaults (VRRPv2,
//! `advert_int 1`, equal priorities, preemption on), one instance per node namespace.
//!
//! Every node is configured as a BACKUP with priority 100 for one VIP on `eth0`, the way the
//! seeds' operators run it; the first to time out becomes MASTER. Nothing is tuned: the figure
//! is what a default install gives.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

/// The VRRP router id the lab uses.
pub const VRID: u8 = 51;

/// The keepalived configuration of one lab node.
pub fn config(node_name: &str, vip: Ipv4Addr, prefix_len: u8, priority: u8) -> String {
    let mut c = String::new();
    let _ = writeln!(
        c,
        "global_defs {{\n    router_id {node_name}\n    enable_script_security\n}}"
    );
    let _ = writeln!(
        c,
        "vrrp_instance lab {{\n    state BACKUP\n    interface eth0\n    virtual_router_id {VRID}\n    priority {priority}\n    advert_int 1\n    virtual_ipaddress {{\n        {vip}/{prefix_len} dev eth0\n    }}\n}}"
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
}

impl Instance {
    /// The files of `node_name`'s instance under `dir`.
    pub fn paths(dir: &Path, node_name: &str) -> Instance {
        Instance {
            config: dir.join(format!("keepalived-{node_name}.conf")),
            pid: dir.join(format!("keepalived-{node_name}.pid")),
            vrrp_pid: dir.join(format!("keepalived-{node_name}-vrrp.pid")),
        }
    }

    /// Writes the configuration of `node_name` under `dir`.
    pub fn write(dir: &Path, node_name: &str, vip: Ipv4Addr, prefix_len: u8) -> Result<Instance> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let instance = Instance::paths(dir, node_name);
        std::fs::write(
            &instance.config,
            self::config(node_name, vip, prefix_len, 100),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_uses_keepalived_defaults() {
        let c = config("node1", Ipv4Addr::new(198, 51, 100, 100), 24, 100);
        assert!(c.contains("advert_int 1"));
        assert!(c.contains("virtual_router_id 51"));
        assert!(c.contains("198.51.100.100/24 dev eth0"));
        assert!(c.contains("state BACKUP"));
        assert!(!c.contains("nopreempt"));
    }
}
