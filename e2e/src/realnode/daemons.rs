//! `failover`'s and `soak`'s daemons on real nodes: swimlb from `deploy/swimlb.yaml` or MetalLB
//! from its manifest, run by a real kubelet and containerd in each node namespace of the lab
//! the command made ([`NodeCluster`] with [`Workload::Probe`]). The probes reach the lab's
//! responders through the real kube-proxy: the Service `default/web` (UDP 5599, `Local`) on
//! `vip_v4(0)`, its EndpointSlice naming each node's own address.
//!
//! A signal goes to the speaker container's process (its host pid from `crictl inspect`), and
//! the lab waits for it to end. The kubelet restarts a killed container in place with a
//! growing back-off (CrashLoopBackOff: 10 s, 20 s, 40 s ... on the same node, and the rule names
//! the same owner every trial), so [`Daemons::start`] after a signal deletes the speaker's Pod
//! instead and waits until the DaemonSet's new Pod on that node is Ready: a new Pod starts
//! without back-off, every trial alike.

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde_json::Value;
use tokio::time::Instant;

use super::cluster::NodeInfo;
use super::{RealNode, image, metallb};
use crate::daemons::{self, Daemons, RECORD_LIMIT};
use crate::kubelab::{self, APPS, Records, SERVICE};
use crate::lab::{MetallbView, Views, http_addrs, read_each, rule};
use crate::netns::{self, Lab};
use crate::service_failover::Implementation;
use crate::service_failover::cluster::{NodeCluster, UP_LIMIT, Workload, pod_ready};

/// How long a signalled speaker's process may take to end.
const EXIT_LIMIT: Duration = Duration::from_secs(30);

/// The speakers of one implementation on the lab's real nodes.
#[derive(Debug)]
pub struct RealDaemons {
    cluster: NodeCluster,
    /// The lab's node names, in order.
    names: Vec<String>,
    /// Per node (1-based): the speaker Pod's uid when a signal stopped its container (the Pod
    /// [`Daemons::start`] replaces).
    signalled: Vec<Option<String>>,
    /// Per node (1-based): the speaker container's host pid, last read.
    pids: Vec<Option<u32>>,
    /// Whether [`Daemons::before_fault`] stopped the API server.
    api_stopped: bool,
}

impl RealDaemons {
    /// Starts the real-node cluster of `implementation` (`swimlb-kubernetes` or `metallb`) on
    /// `lab`, fully up.
    pub fn start(
        lab: &mut Lab,
        implementation: daemons::Implementation,
        log: &mut dyn FnMut(&str),
    ) -> Result<RealDaemons> {
        let implementation = match implementation {
            daemons::Implementation::SwimlbKubernetes => Implementation::Swimlb,
            daemons::Implementation::Metallb => Implementation::Metallb,
            other => bail!("{} does not run on real nodes", other.as_str()),
        };
        let cluster = NodeCluster::start(lab, implementation, Workload::Probe, None, log)?;
        let n = lab.nodes.len();
        Ok(RealDaemons {
            cluster,
            names: lab.nodes.iter().map(|n| n.name.clone()).collect(),
            signalled: vec![None; n + 1],
            pids: vec![None; n + 1],
            api_stopped: false,
        })
    }

    /// The cluster.
    pub fn cluster(&self) -> &NodeCluster {
        &self.cluster
    }

    /// The cluster, to stop and start its parts (chaos's faults).
    pub fn cluster_mut(&mut self) -> &mut NodeCluster {
        &mut self.cluster
    }

    fn node(&self, index: usize) -> &RealNode {
        &self.cluster.real.nodes[index - 1]
    }

    /// The speaker Pod on node `index`, if the API server lists one that is not being deleted.
    fn speaker_pod(&self, index: usize) -> Result<Option<Value>> {
        let name = &self.names[index - 1];
        Ok(self.cluster.speaker_pods()?.into_iter().find(|p| {
            p["spec"]["nodeName"] == name.as_str() && p["metadata"]["deletionTimestamp"].is_null()
        }))
    }

    /// Deletes node `index`'s speaker Pod of `uid` (if it is still there) and waits until
    /// another speaker Pod on that node is Ready.
    fn replace_pod(&mut self, index: usize, uid: &str) -> Result<()> {
        let (_, namespace) = self.cluster.implementation.config_api();
        let old = self
            .cluster
            .speaker_pods()?
            .into_iter()
            .find(|p| p["metadata"]["uid"] == uid);
        if let Some(name) = old.as_ref().and_then(|p| p["metadata"]["name"].as_str()) {
            self.cluster
                .plane
                .admin()
                .delete("v1", "Pod", Some(namespace), name)?;
        }
        let deadline = Instant::now() + UP_LIMIT;
        loop {
            let pod = self.speaker_pod(index)?;
            if let Some(pod) = &pod
                && pod["metadata"]["uid"] != uid
                && pod_ready(pod)
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "no new speaker Pod Ready on {} within {UP_LIMIT:?} after its Pod {uid} was \
                     deleted; the API server shows {pod:?}",
                    self.names[index - 1]
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// The host pid of the running container `speaker` on `node` (`crictl ps`, `crictl inspect`).
pub fn container_pid(node: &RealNode) -> Result<Option<u32>> {
    let ids =
        image::run(
            node.crictl()
                .args(["ps", "--name", "^speaker$", "--state", "running", "-q"]),
        )?;
    let Some(id) = ids.lines().next().map(str::trim) else {
        return Ok(None);
    };
    let inspect: Value = serde_json::from_str(&image::run(node.crictl().args(["inspect", id]))?)
        .context("crictl inspect's JSON")?;
    Ok(inspect["info"]["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok()))
}

/// Whether process `pid` is gone (or a zombie, its exit seen by nobody yet).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

impl Daemons for RealDaemons {
    /// After a signal: a new Pod in place of the signalled one ([`RealDaemons::replace_pod`]);
    /// otherwise (the command's start) the DaemonSet's speaker runs already.
    fn start(&mut self, _lab: &mut Lab, index: usize) -> Result<()> {
        self.pids[index] = None;
        match self.signalled[index].take() {
            Some(uid) => self.replace_pod(index, &uid),
            None => Ok(()),
        }
    }

    fn signal(&mut self, _lab: &mut Lab, index: usize, signal: &str) -> Result<()> {
        let node = self.node(index);
        let pid = container_pid(node)?
            .with_context(|| format!("no running speaker container on {}", node.name))?;
        let uid = self
            .speaker_pod(index)?
            .and_then(|p| p["metadata"]["uid"].as_str().map(str::to_string))
            .with_context(|| format!("no speaker Pod on {}", self.names[index - 1]))?;
        let status = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()?;
        if !status.success() {
            bail!("kill -{signal} {pid} failed: {status}");
        }
        self.signalled[index] = Some(uid);
        self.pids[index] = None;
        let deadline = Instant::now() + EXIT_LIMIT;
        while !gone(pid) {
            if Instant::now() > deadline {
                bail!("the speaker (pid {pid}) did not end within {EXIT_LIMIT:?} of SIG{signal}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    fn views(&mut self, lab: &Lab) -> Views {
        match self.cluster.implementation {
            Implementation::Swimlb => Views::Swimlb(read_each(
                lab,
                http_addrs(lab),
                "/status",
                3,
                daemons::speaker_view,
            )),
            Implementation::Metallb => Views::Metallb(
                metallb::speaker_view(lab, &self.cluster.real.nodes, vip())
                    .into_iter()
                    .map(|v| {
                        v.map(|v| MetallbView {
                            announces: v.announces,
                            members: v.members.len(),
                        })
                    })
                    .collect(),
            ),
        }
    }

    /// The record names `owner` (else the trial is not measured), then its change is watched;
    /// with `api_down` the API server stops (for swimlb: the CLI refuses it for MetalLB).
    fn before_fault(
        &mut self,
        owner: &str,
        api_down: bool,
    ) -> Result<Result<Option<kubelab::RecordChange>, String>> {
        if let Some(why) = self.cluster.not_up(self.names.len())? {
            return Ok(Err(format!("the cluster is not fully up: {why}")));
        }
        if self.cluster.implementation != Implementation::Swimlb {
            return Ok(Ok(None));
        }
        let records = Records::new(&self.cluster.plane, "swimlb.io/v1beta1", kubelab::NAMESPACE);
        let key = format!("{APPS}/{SERVICE}");
        let named = |records: &Records| {
            records
                .all()
                .into_iter()
                .find(|(k, _)| *k == key)
                .map(|(_, node)| node)
        };
        let deadline = Instant::now() + RECORD_LIMIT;
        while named(&records).as_deref() != Some(owner) {
            if Instant::now() > deadline {
                return Ok(Err(format!(
                    "the ServiceL2Status record does not name {owner} (it names {:?})",
                    named(&records)
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let change = records.watch_change(owner, RECORD_LIMIT)?;
        if api_down {
            self.cluster.plane.stop_apiserver()?;
            self.api_stopped = true;
        }
        Ok(Ok(Some(change)))
    }

    fn after_fault(&mut self) -> Result<()> {
        if std::mem::take(&mut self.api_stopped) {
            self.cluster.plane.start_apiserver()?;
        }
        Ok(())
    }

    fn pid(&mut self, _lab: &mut Lab, index: usize) -> Option<u32> {
        if let Some(pid) = self.pids[index].filter(|p| !gone(*p)) {
            return Some(pid);
        }
        let pid = container_pid(self.node(index)).ok().flatten();
        self.pids[index] = pid;
        pid
    }

    fn server_version(&self) -> Option<String> {
        self.cluster.plane.server_version().ok()
    }

    /// MetalLB's order over every node (each has an endpoint, its own address).
    fn expected_owner(&self, _lab: &Lab) -> Option<String> {
        let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
        rule::metallb_owner(&names, vip())
    }

    fn wait_up(&mut self, lab: &Lab) -> Result<()> {
        self.cluster.wait_up(lab.nodes.len(), UP_LIMIT)
    }

    fn node_info(&self) -> Vec<NodeInfo> {
        self.cluster.real.node_infos()
    }
}

fn vip() -> IpAddr {
    IpAddr::V4(netns::vip_v4(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_gone_when_proc_has_no_entry_or_a_zombie() {
        assert!(!gone(std::process::id()));
        assert!(gone(u32::MAX));
    }
}
