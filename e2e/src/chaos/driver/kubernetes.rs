//! The Kubernetes faults of a chaos run (`--impl swimlb-kubernetes` and `metallb`): the API
//! server stopped, etcd compacted, the controller restarted, Services churned, the `Local`
//! Service's endpoints turning not ready, the exclude label, and a rolling update of the
//! speakers, on real nodes ([`RealDaemons`]: the implementation installed from its manifest,
//! run by a real kubelet and containerd per node). The controller's restart scales its
//! Deployment to none and back; a rolling update stops each speaker as a deleted Pod's is
//! (SIGTERM, its kubelet held: `real.rs`) and lets the kubelet start it again, node by node.

use std::collections::BTreeSet;
use tokio::time::Instant;

use serde_json::{Value, json};

use super::*;
use crate::kube_client::Kube;
use crate::kubelab::{self, APPS};
use crate::service_failover::Implementation;
use crate::service_failover::cluster::{NodeCluster, UP_LIMIT};

/// The `Local` Service of the lab, on the second VIP; its EndpointSlice is the lab's.
pub const LOCAL_SERVICE: &str = "web-local";
/// The label that takes a node out of every announcement.
const EXCLUDE_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
/// The field manager of the lab's writes.
const MANAGER: &str = "swimlb-lab";

impl Driver {
    /// Puts the Kubernetes fault `kind` on (`on`) or takes it off.
    pub(super) fn set_kubernetes(
        &mut self,
        lab: &mut Lab,
        daemons: &mut ChaosDaemons,
        kind: FaultKind,
        on: bool,
    ) -> Result<()> {
        if kind == FaultKind::RollingUpdate {
            // At its end every speaker the roll stopped runs again (a step missed by an early
            // stop); its start does nothing (the steps do). A late one is the kubelet's.
            let stopped =
                (1..=lab.nodes.len()).filter(|n| !on && !self.running[n - 1] && !self.is_late(*n));
            for node in stopped.collect::<Vec<_>>() {
                self.roll(lab, daemons, node, true)?;
            }
            return Ok(());
        }
        let mut plane = Plane::of(daemons, kind)?;
        match kind {
            FaultKind::ApiDown => plane.set_reachable(!on),
            FaultKind::EtcdCompaction if on => {
                plane.compact_etcd()?;
                Ok(())
            }
            FaultKind::ControllerRestart => plane.run_controller(lab, !on),
            FaultKind::ServiceChurn { number } => churn(plane.api(), number, on),
            FaultKind::EndpointNotReady { node } => {
                if on {
                    self.not_ready.insert(node);
                } else {
                    self.not_ready.remove(&node);
                }
                write_local_slice(plane.api(), lab, &self.not_ready)
            }
            FaultKind::Exclude { node } => {
                let value = if on { json!("") } else { Value::Null };
                plane.api().merge_patch(
                    "v1",
                    "Node",
                    None,
                    &lab.node(node).name,
                    json!({"metadata": {"labels": {EXCLUDE_LABEL: value}}}),
                    false,
                )?;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// A rolling update's step: node `node`'s speaker stopped as a deleted Pod's is (SIGTERM),
    /// or started again (`up`).
    pub(super) fn roll(
        &mut self,
        lab: &mut Lab,
        daemons: &mut ChaosDaemons,
        node: usize,
        up: bool,
    ) -> Result<()> {
        if up {
            self.start_daemon(lab, daemons, node)
        } else {
            self.running[node - 1] = false;
            self.stop_daemon(lab, daemons, node, "TERM")
        }
    }
}

/// What the Kubernetes faults act on: the real-node cluster of swimlb or MetalLB.
struct Plane<'a>(&'a mut NodeCluster);

impl Plane<'_> {
    fn of(daemons: &mut ChaosDaemons, kind: FaultKind) -> Result<Plane<'_>> {
        match daemons {
            ChaosDaemons::Real(d) => Ok(Plane(d.cluster_mut())),
            _ => bail!("{} needs the Kubernetes lab", kind.as_str()),
        }
    }

    /// The administrator's client.
    fn api(&self) -> &Kube {
        self.0.plane.admin()
    }

    /// Kills the API server (`false`: a crash, not a graceful stop) or starts it again and
    /// waits until it is ready.
    fn set_reachable(&mut self, reachable: bool) -> Result<()> {
        if reachable {
            self.0.plane.start_apiserver()
        } else {
            self.0.plane.kill_apiserver()
        }
    }

    fn compact_etcd(&self) -> Result<u64> {
        self.0.plane.compact_etcd()
    }

    /// Scales the load balancer's controller Deployment to none, or back to its manifest's
    /// replicas (`run`) and waits (at most [`UP_LIMIT`]) until they are ready. The stop does
    /// not wait for the Pods' graceful end (about 13 s here, under load), as `kubectl scale`
    /// does not.
    fn run_controller(&mut self, _lab: &mut Lab, run: bool) -> Result<()> {
        let (name, namespace, replicas) = match self.0.implementation {
            Implementation::Swimlb => ("swimlb-controller", kubelab::NAMESPACE, 2),
            Implementation::Metallb => ("controller", crate::realnode::metallb::NAMESPACE, 1),
        };
        let wanted = if run { replicas } else { 0 };
        let api = self.0.plane.admin();
        api.merge_patch(
            "apps/v1",
            "Deployment",
            Some(namespace),
            name,
            json!({"spec": {"replicas": wanted}}),
            false,
        )?;
        if !run {
            return Ok(());
        }
        let deadline = Instant::now() + UP_LIMIT;
        loop {
            let status = api
                .get("apps/v1", "Deployment", Some(namespace), name)?
                .map(|d| d["status"].clone())
                .unwrap_or_default();
            let count = |field: &str| status[field].as_u64().unwrap_or(0);
            if count("replicas") == wanted && count("readyReplicas") == wanted {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{namespace}/{name} not at {wanted} ready replicas within {UP_LIMIT:?}: {status}"
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Creates (`on`) or deletes the churn's two Services: `churn-N`, which takes an IP from the
/// pool, and `clash-N`, which asks for the first VIP without sharing it.
fn churn(api: &Kube, number: u32, on: bool) -> Result<()> {
    let names = [format!("churn-{number}"), format!("clash-{number}")];
    if !on {
        for name in &names {
            api.delete("v1", "Service", Some(APPS), name)?;
        }
        return Ok(());
    }
    let mut taking = kubelab::service(&names[0], "", kubelab::Policy::Cluster, None);
    taking["metadata"]
        .as_object_mut()
        .context("a Service's metadata")?
        .remove("annotations");
    api.create(taking)?;
    api.create(kubelab::service(
        &names[1],
        &netns::vip_v4(0).to_string(),
        kubelab::Policy::Cluster,
        None,
    ))?;
    Ok(())
}

/// The `Local` Service's EndpointSlice, written by the lab: one endpoint on every node, ready
/// unless its node is in `not_ready`.
fn write_local_slice(api: &Kube, lab: &Lab, not_ready: &BTreeSet<usize>) -> Result<()> {
    api.apply(local_slice(lab, not_ready), MANAGER)?;
    Ok(())
}

/// The `Local` Service and its EndpointSlice (every endpoint ready), for the lab's start.
pub fn local_service(api: &Kube, lab: &Lab) -> Result<()> {
    api.create(kubelab::service(
        LOCAL_SERVICE,
        &netns::vip_v4(1).to_string(),
        kubelab::Policy::Local,
        None,
    ))?;
    write_local_slice(api, lab, &BTreeSet::new())
}

/// The `Local` Service's EndpointSlice: each node's own address (where the lab's probe
/// responder listens; the real kube-proxy carries a probe to the node that received it), ready
/// unless the node is in `not_ready`.
fn local_slice(lab: &Lab, not_ready: &BTreeSet<usize>) -> Value {
    let mut slice = kubelab::endpoint_slice(
        LOCAL_SERVICE,
        0,
        &lab.nodes
            .iter()
            .map(|n| n.name.as_str())
            .collect::<Vec<_>>(),
    );
    if let Some(endpoints) = slice["endpoints"].as_array_mut() {
        for (i, e) in endpoints.iter_mut().enumerate() {
            let ready = !not_ready.contains(&(i + 1));
            e["addresses"] = json!([lab.nodes[i].v4.to_string()]);
            e["conditions"] = json!({"ready": ready, "serving": ready, "terminating": false});
        }
    }
    slice
}
