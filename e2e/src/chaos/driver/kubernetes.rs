//! The Kubernetes faults of a chaos run (`--impl swimlb-kubernetes` and `metallb`): the API
//! server stopped, etcd compacted, the controller restarted, Services churned, the `Local`
//! Service's endpoints turning not ready, the exclude label, and a rolling update of the
//! speakers. swimlb's lab ([`kubelab::Cluster`]) runs the control plane and the controller,
//! and its speakers as processes; MetalLB's ([`MetallbDaemons`]) runs its controller and
//! speakers as the lab's kubelets do. Either way a rolling update stops each speaker as a
//! deleted Pod's is (SIGTERM) and starts it again, node by node.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::*;
use crate::kube_client::Kube;
use crate::kubelab::{self, APPS, Cluster};
use crate::metallb::MetallbDaemons;

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
            // stop); its start does nothing (the steps do).
            let stopped = (1..=lab.nodes.len()).filter(|n| !on && !self.running[n - 1]);
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
        self.running[node - 1] = up;
        if up {
            daemons.as_dyn().start(lab, node)
        } else {
            daemons.as_dyn().signal(lab, node, "TERM")
        }
    }
}

/// What the Kubernetes faults act on: swimlb's cluster or MetalLB's.
enum Plane<'a> {
    Swimlb(&'a mut Cluster),
    Metallb(&'a mut MetallbDaemons),
}

impl Plane<'_> {
    fn of(daemons: &mut ChaosDaemons, kind: FaultKind) -> Result<Plane<'_>> {
        match daemons {
            ChaosDaemons::Kubernetes(d) => Ok(Plane::Swimlb(
                d.cluster_mut()
                    .context("the Kubernetes lab has no cluster")?,
            )),
            ChaosDaemons::Metallb(d) => Ok(Plane::Metallb(d)),
            _ => bail!("{} needs the Kubernetes lab", kind.as_str()),
        }
    }

    /// The administrator's client.
    fn api(&self) -> &Kube {
        match self {
            Plane::Swimlb(c) => c.api(),
            Plane::Metallb(d) => d.cluster().api(),
        }
    }

    /// Kills the API server (`false`: a crash, not a graceful stop) or starts it again and
    /// waits until it is ready.
    fn set_reachable(&mut self, reachable: bool) -> Result<()> {
        let plane = match self {
            Plane::Swimlb(c) => c.control_plane_mut(),
            Plane::Metallb(d) => d.cluster_mut().control_plane_mut(),
        };
        if reachable {
            plane.start_apiserver()
        } else {
            plane.kill_apiserver()
        }
    }

    fn compact_etcd(&self) -> Result<u64> {
        match self {
            Plane::Swimlb(c) => c.control_plane().compact_etcd(),
            Plane::Metallb(d) => d.cluster().control_plane().compact_etcd(),
        }
    }

    /// Starts (`run`) or stops the load balancer's controller.
    fn run_controller(&mut self, lab: &mut Lab, run: bool) -> Result<()> {
        match (self, run) {
            (Plane::Swimlb(c), true) => c.start_controller(lab),
            (Plane::Swimlb(c), false) => c.stop_controller(lab),
            (Plane::Metallb(d), true) => d.start_controller(),
            (Plane::Metallb(d), false) => d.stop_controller(),
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
            e["conditions"] = json!({"ready": ready, "serving": ready, "terminating": false});
        }
    }
    slice
}
