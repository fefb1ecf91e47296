//! keepalived and swimlb's speakers side by side in the namespace lab, for the node-by-node
//! switch of the book's "Switching from keepalived" (docs/src/switching/keepalived.md):
//! keepalived-fast routers ([`Tuning::Fast`]: VRRPv3, `advert_int 0.1`) on some nodes, standalone
//! speakers with the converted group's `vrrp:` on the others.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use tokio::time::Instant;

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

/// keepalived-fast on some of the lab's nodes, each with its own priority.
#[derive(Debug, Default)]
pub struct Routers {
    children: BTreeMap<usize, usize>,
    states: BTreeMap<usize, StateReader>,
}

impl Routers {
    /// Starts keepalived-fast on node `index` with `priority` (its notify FIFO read from then on).
    pub fn start(&mut self, lab: &mut Lab, index: usize, priority: u8) -> Result<()> {
        let node = lab.node(index).clone();
        let dir = lab.work_dir();
        std::fs::create_dir_all(&dir)?;
        let instance = Instance::paths(&dir, &node.name);
        let text = keepalived::config(
            &node.name,
            netns::vip_v4(0),
            netns::PREFIX_V4,
            priority,
            Tuning::Fast,
            &instance.fifo,
        );
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
        let Some(child) = self.children.remove(&index) else {
            bail!("no keepalived runs on node {index}");
        };
        let pid = lab.child(child).id().to_string();
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()?;
        lab.wait_or_kill(child, Duration::from_secs(10))?;
        let vip = format!("{}/{}", netns::vip_v4(0), netns::PREFIX_V4);
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
