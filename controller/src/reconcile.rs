//! The Service reconciler, in kube-rs's controller shape: a [`Context`], [`reconcile`] and
//! [`error_policy`].
//!
//! It only reads, calls, writes and counts: it turns a Service into a [`ServiceView`]
//! ([`view_of`], pure; both in [`swimlb_config::service`]), asks the [`Allocator`] for a [`Verdict`], and then writes
//! `status.loadBalancer.ingress` by server-side apply with the field manager
//! [`FIELD_MANAGER`], records an Event, and updates the metrics. It never holds the allocator
//! lock across an await. Services of another class are never written to.
//!
//! Pool status (assigned and available counts per family) is computed by [`pool_statuses`]
//! (pure) and written by [`apply_pool_status`].
//!
//! What is cached of a Service is trimmed first
//! ([`trim_service`](swimlb_config::service::trim_service)): the controller keeps
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
use swimlb_config::events::Reason;
use swimlb_config::pools::Family;

use swimlb_config::service::{ServiceKey, ServiceView, view_of};

use crate::allocator::{Allocator, LoadConflict, NotOurs, PoolUsage, Verdict};
use crate::metrics::{ApiResource, ControllerMetrics};

/// The server-side apply field manager of every status write.
pub const FIELD_MANAGER: &str = "swimlb-controller";

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

async fn publish(ctx: &Context, svc: &Service, type_: EventType, reason: Reason, note: String) {
    let event = Event {
        type_,
        reason: reason.as_str().into(),
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
        ctx.metrics.write_error(ApiResource::Events);
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
            publish(&ctx, &svc, EventType::Normal, Reason::IpAllocated, note).await;
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
            publish(
                &ctx,
                &svc,
                EventType::Warning,
                Reason::AddressOutsidePools,
                note,
            )
            .await;
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
                Reason::AllocationFailed,
                error.to_string(),
            )
            .await;
            Ok(Action::requeue(RETRY_UNASSIGNED))
        }
    }
}

/// Retries a failed reconcile after [`RETRY_AFTER_ERROR`].
pub fn error_policy(_svc: Arc<Service>, error: &ReconcileError, ctx: Arc<Context>) -> Action {
    match error {
        ReconcileError::ApplyStatus { .. } => ctx.metrics.write_error(ApiResource::Services),
        ReconcileError::ApplyPoolStatus { .. } => {
            ctx.metrics.write_error(ApiResource::IpAddressPools)
        }
        ReconcileError::Poisoned(_) => {}
    }
    tracing::warn!(reason = error.as_str(), %error, "reconcile failed");
    Action::requeue(RETRY_AFTER_ERROR)
}

#[cfg(test)]
mod tests;
