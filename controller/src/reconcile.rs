//! The Service reconciler, in kube-rs's controller shape: a [`Context`], [`reconcile`] and
//! [`error_policy`].
//!
//! It only reads, calls, writes and counts: it turns a Service into a [`ServiceView`]
//! ([`view_of`], pure), asks the [`Allocator`] for a [`Verdict`], and then writes
//! `status.loadBalancer.ingress` by server-side apply with the field manager
//! [`FIELD_MANAGER`], records an Event, and updates the metrics. It never holds the allocator
//! lock across an await. Services of another class are never written to.
//!
//! Pool status (assigned and available counts per family) is computed by [`pool_statuses`]
//! (pure) and written by [`apply_pool_status`].
//!
//! What is cached of a Service is trimmed first ([`trim_service`]): the controller keeps
//! thousands of them. Normal Events (one per assignment) bypass the shared [`Recorder`], whose
//! cache would otherwise keep one Event per Service; Warning Events go through it, so a
//! repeated failure becomes a series. The watch loop, leader election and releases are in
//! [`crate::run`].

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use swimlb_config::crd::{IPAddressPool, IPAddressPoolStatus};
use swimlb_config::pools::Family;

use crate::allocator::{
    Allocator, IpFamilyPolicy, LoadConflict, NotOurs, PoolUsage, Protocol, ServiceKey, ServicePort,
    ServiceView, TrafficPolicy, Verdict,
};
use crate::metrics::ControllerMetrics;

/// The server-side apply field manager of every status write.
pub const FIELD_MANAGER: &str = "swimlb-controller";

/// The reason of the Warning Event on a Service that keeps addresses no pool in force has.
pub const KEPT_OUTSIDE_POOLS: &str = "AddressOutsidePools";

/// How long to wait before retrying a Service that got no address (a pool may have grown).
pub const RETRY_UNASSIGNED: Duration = Duration::from_secs(60);
/// How long to wait after a failed API call.
pub const RETRY_AFTER_ERROR: Duration = Duration::from_secs(5);

/// Errors of one reconcile.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The status patch failed.
    #[error("Service {service}: status.loadBalancer.ingress: apply failed: {source}")]
    ApplyStatus {
        /// The Service.
        service: ServiceKey,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The pool status patch failed.
    #[error("IPAddressPool {namespace}/{name}: status: apply failed: {source}")]
    ApplyPoolStatus {
        /// The pool's namespace.
        namespace: String,
        /// The pool's name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// A previous holder of the allocator lock panicked.
    #[error("Service {0}: the allocator lock is poisoned")]
    Poisoned(ServiceKey),
}

impl ReconcileError {
    /// The log word and metric label.
    pub fn as_str(&self) -> &'static str {
        match self {
            ReconcileError::ApplyStatus { .. } => "apply_status",
            ReconcileError::ApplyPoolStatus { .. } => "apply_pool_status",
            ReconcileError::Poisoned(_) => "poisoned",
        }
    }
}

/// What the reconciler shares.
#[derive(Clone)]
pub struct Context {
    /// The API client.
    pub client: Client,
    /// The allocator (locked only around pure calls).
    pub allocator: Arc<Mutex<Allocator>>,
    /// Namespaces, for `serviceAllocation.namespaceSelectors`.
    pub namespaces: Store<Namespace>,
    /// Publishes Warning Events on Services (its cache turns a repeated failure into a series).
    pub recorder: Recorder,
    /// Who publishes: the one-off Normal Events go through a fresh [`Recorder`] of this reporter,
    /// so that the shared recorder's cache does not keep one Event per assigned Service.
    pub reporter: Reporter,
    /// The controller's metrics.
    pub metrics: ControllerMetrics,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").finish_non_exhaustive()
    }
}

impl Context {
    /// Rebuilds the allocator's holdings from existing Service statuses (call before the first
    /// reconcile). Returns the Services whose status could not be honoured.
    pub fn load_existing<'a>(
        &self,
        services: impl IntoIterator<Item = &'a Service>,
    ) -> Result<Vec<LoadConflict>, ReconcileError> {
        let views: Vec<ServiceView> = services
            .into_iter()
            .map(|s| view_of(s, &namespace_labels(&self.namespaces, s)))
            .collect();
        let mut allocator = self.lock(&ServiceKey::default())?;
        let conflicts = allocator.load_existing(&views);
        self.metrics.observe_usage(&allocator.usage());
        Ok(conflicts)
    }

    /// Releases a deleted Service's addresses. Returns whether it held any.
    pub fn forget(&self, key: &ServiceKey) -> Result<bool, ReconcileError> {
        let mut allocator = self.lock(key)?;
        let released = allocator.release(key);
        self.metrics.observe_usage(&allocator.usage());
        Ok(released)
    }

    /// Releases every Service not in `services` (after a resync). Returns those released.
    pub fn forget_missing(
        &self,
        services: &Store<Service>,
    ) -> Result<Vec<ServiceKey>, ReconcileError> {
        let mut allocator = self.lock(&ServiceKey::default())?;
        let gone = allocator.release_missing(|key| {
            services
                .get(&ObjectRef::new(&key.name).within(&key.namespace))
                .is_some()
        });
        self.metrics.observe_usage(&allocator.usage());
        Ok(gone)
    }

    fn lock(
        &self,
        key: &ServiceKey,
    ) -> Result<std::sync::MutexGuard<'_, Allocator>, ReconcileError> {
        self.allocator
            .lock()
            .map_err(|_| ReconcileError::Poisoned(key.clone()))
    }
}

fn namespace_labels(namespaces: &Store<Namespace>, svc: &Service) -> BTreeMap<String, String> {
    let ns = svc.namespace().unwrap_or_default();
    namespaces
        .get(&ObjectRef::new(&ns))
        .map(|n| n.labels().clone())
        .unwrap_or_default()
}

/// The allocator's view of a Service (pure). Unknown family, policy and protocol strings are
/// read as Kubernetes' defaults; ingress entries without an IP (hostnames) are skipped.
pub fn view_of(svc: &Service, namespace_labels: &BTreeMap<String, String>) -> ServiceView {
    let spec = svc.spec.clone().unwrap_or_default();
    let family = |s: &String| match s.as_str() {
        "IPv4" => Some(Family::V4),
        "IPv6" => Some(Family::V6),
        _ => None,
    };
    ServiceView {
        key: ServiceKey::new(svc.namespace().unwrap_or_default(), svc.name_any()),
        labels: svc.labels().clone(),
        namespace_labels: namespace_labels.clone(),
        is_load_balancer: spec.type_.as_deref() == Some("LoadBalancer"),
        load_balancer_class: spec.load_balancer_class.clone(),
        load_balancer_ip: spec.load_balancer_ip.clone(),
        annotations: svc.annotations().clone(),
        ip_families: spec
            .ip_families
            .iter()
            .flatten()
            .filter_map(family)
            .collect(),
        ip_family_policy: match spec.ip_family_policy.as_deref() {
            Some("PreferDualStack") => IpFamilyPolicy::PreferDualStack,
            Some("RequireDualStack") => IpFamilyPolicy::RequireDualStack,
            _ => IpFamilyPolicy::SingleStack,
        },
        ports: spec
            .ports
            .iter()
            .flatten()
            .map(|p| ServicePort {
                port: p.port,
                protocol: match p.protocol.as_deref() {
                    Some("UDP") => Protocol::Udp,
                    Some("SCTP") => Protocol::Sctp,
                    _ => Protocol::Tcp,
                },
            })
            .collect(),
        external_traffic_policy: match spec.external_traffic_policy.as_deref() {
            Some("Local") => TrafficPolicy::Local,
            _ => TrafficPolicy::Cluster,
        },
        selector: spec.selector.clone().unwrap_or_default(),
        status_ips: svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|i| i.ip.as_deref()?.parse::<IpAddr>().ok())
            .collect(),
    }
}

/// The annotation `kubectl apply` writes: a copy of the whole object, never read here.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops from a Service what the controller never reads, before it is cached (pure): managed
/// fields, the last-applied annotation, the resourceVersion, the spec fields [`view_of`]
/// ignores, port names and node ports, status conditions and ingress ports and modes, and
/// values equal to the defaults `view_of` assumes (`SingleStack`, `Cluster`, `TCP`). What stays:
/// name, namespace, uid, deletionTimestamp, finalizers, labels, other annotations and every
/// field `view_of` reads, so `view_of` of the trimmed Service equals `view_of` of the full one but for the
/// last-applied annotation (which the allocator never looks up).
pub fn trim_service(svc: &mut Service) {
    trim_meta(svc.meta_mut());
    // Watches resume from the watcher's own record of it; Events need no resourceVersion.
    svc.metadata.resource_version = None;
    if let Some(spec) = svc.spec.as_mut() {
        // The defaults `view_of` assumes are dropped: one allocation less each, same view.
        let is_default = |value: &Option<String>, default: &str| value.as_deref() == Some(default);
        if is_default(&spec.ip_family_policy, "SingleStack") {
            spec.ip_family_policy = None;
        }
        if is_default(&spec.external_traffic_policy, "Cluster") {
            spec.external_traffic_policy = None;
        }
        spec.cluster_ip = None;
        spec.cluster_ips = None;
        spec.external_ips = None;
        spec.external_name = None;
        spec.health_check_node_port = None;
        spec.internal_traffic_policy = None;
        spec.load_balancer_source_ranges = None;
        spec.publish_not_ready_addresses = None;
        spec.session_affinity = None;
        spec.session_affinity_config = None;
        spec.traffic_distribution = None;
        spec.allocate_load_balancer_node_ports = None;
        for port in spec.ports.iter_mut().flatten() {
            if is_default(&port.protocol, "TCP") {
                port.protocol = None;
            }
            port.name = None;
            port.app_protocol = None;
            port.node_port = None;
            port.target_port = None;
        }
    }
    if let Some(status) = svc.status.as_mut() {
        status.conditions = None;
        for ingress in status
            .load_balancer
            .iter_mut()
            .flat_map(|lb| lb.ingress.iter_mut().flatten())
        {
            ingress.ports = None;
            ingress.ip_mode = None;
        }
    }
}

/// Drops managed fields and the last-applied annotation (pure); for every cached object.
pub fn trim_meta(meta: &mut kube::api::ObjectMeta) {
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

/// The server-side apply body that sets `status.loadBalancer.ingress` to these addresses
/// (an empty list clears it).
pub fn ingress_apply_body(ips: &[IpAddr]) -> serde_json::Value {
    let ingress: Vec<serde_json::Value> = ips
        .iter()
        .map(|ip| json!({"ip": ip.to_string(), "ipMode": "VIP"}))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "status": {"loadBalancer": {"ingress": ingress}},
    })
}

async fn apply_ingress(
    ctx: &Context,
    key: &ServiceKey,
    ips: &[IpAddr],
) -> Result<(), ReconcileError> {
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &key.namespace);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch_status(&key.name, &params, &Patch::Apply(ingress_apply_body(ips)))
        .await
        .map(|_| ())
        .map_err(|source| ReconcileError::ApplyStatus {
            service: key.clone(),
            source,
        })
}

async fn publish(ctx: &Context, svc: &Service, type_: EventType, reason: &str, note: String) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Allocate".into(),
        secondary: None,
    };
    let published = match type_ {
        EventType::Warning => ctx.recorder.publish(&event, &svc.object_ref(&())).await,
        EventType::Normal => {
            Recorder::new(ctx.client.clone(), ctx.reporter.clone())
                .publish(&event, &svc.object_ref(&()))
                .await
        }
    };
    if let Err(e) = published {
        tracing::warn!(service = %svc.name_any(), error = %e, "cannot publish event");
    }
}

fn saturate(n: u128) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The status of every pool from the allocator's usage (pure): assigned and available
/// addresses per family, saturated at `i64::MAX`.
pub fn pool_statuses(usage: &[PoolUsage]) -> BTreeMap<String, IPAddressPoolStatus> {
    let mut out: BTreeMap<String, IPAddressPoolStatus> = BTreeMap::new();
    for u in usage {
        let status = out.entry(u.pool.clone()).or_default();
        let (assigned, available) = (
            saturate(u.in_use),
            saturate(u.size.saturating_sub(u.in_use)),
        );
        match u.family {
            Family::V4 => (status.assigned_ipv4, status.available_ipv4) = (assigned, available),
            Family::V6 => (status.assigned_ipv6, status.available_ipv6) = (assigned, available),
        }
    }
    out
}

/// Writes a pool's status by server-side apply with [`FIELD_MANAGER`].
pub async fn apply_pool_status(
    client: &Client,
    namespace: &str,
    name: &str,
    status: &IPAddressPoolStatus,
) -> Result<(), ReconcileError> {
    let api: Api<IPAddressPool> = Api::namespaced(client.clone(), namespace);
    let body = json!({
        "apiVersion": "swimlb.io/v1beta1",
        "kind": "IPAddressPool",
        "status": status,
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch_status(name, &params, &Patch::Apply(body))
        .await
        .map(|_| ())
        .map_err(|source| ReconcileError::ApplyPoolStatus {
            namespace: namespace.into(),
            name: name.into(),
            source,
        })
}

/// Decides and writes one Service's addresses.
pub async fn reconcile(svc: Arc<Service>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let view = view_of(&svc, &namespace_labels(&ctx.namespaces, &svc));
    if svc.meta().deletion_timestamp.is_some() {
        ctx.forget(&view.key)?;
        return Ok(Action::await_change());
    }
    let verdict = {
        let mut allocator = ctx.lock(&view.key)?;
        let verdict = allocator.assign(&view);
        ctx.metrics.observe_usage(&allocator.usage());
        verdict
    };
    match verdict {
        Verdict::Assigned { ips, pool } => {
            apply_ingress(&ctx, &view.key, &ips).await?;
            let list: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
            let note = format!("Assigned {} from pool {pool}", list.join(", "));
            publish(&ctx, &svc, EventType::Normal, "IPAllocated", note).await;
            Ok(Action::await_change())
        }
        Verdict::Unchanged => Ok(Action::await_change()),
        Verdict::NotOurs(NotOurs::NotLoadBalancer) if !view.status_ips.is_empty() => {
            apply_ingress(&ctx, &view.key, &[]).await?;
            Ok(Action::await_change())
        }
        Verdict::NotOurs(_) => Ok(Action::await_change()),
        Verdict::NotLoaded => Ok(Action::requeue(RETRY_AFTER_ERROR)),
        Verdict::Kept { ips } => {
            let same = ips.len() == view.status_ips.len()
                && ips.iter().all(|ip| view.status_ips.contains(ip));
            if !same {
                apply_ingress(&ctx, &view.key, &ips).await?;
            }
            let list: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
            let note = format!(
                "Kept {}: no address pool in force has it (its pool is invalid or gone); \
                 it changes only when the Service asks for other addresses or another pool",
                list.join(", ")
            );
            publish(&ctx, &svc, EventType::Warning, KEPT_OUTSIDE_POOLS, note).await;
            Ok(Action::await_change())
        }
        Verdict::Error(error) => {
            ctx.metrics.count_error(&error);
            if !view.status_ips.is_empty() {
                apply_ingress(&ctx, &view.key, &[]).await?;
            }
            publish(
                &ctx,
                &svc,
                EventType::Warning,
                "AllocationFailed",
                error.to_string(),
            )
            .await;
            Ok(Action::requeue(RETRY_UNASSIGNED))
        }
    }
}

/// Retries a failed reconcile after [`RETRY_AFTER_ERROR`].
pub fn error_policy(_svc: Arc<Service>, error: &ReconcileError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(reason = error.as_str(), %error, "reconcile failed");
    Action::requeue(RETRY_AFTER_ERROR)
}

#[cfg(test)]
mod tests;
