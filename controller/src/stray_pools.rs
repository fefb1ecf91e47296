//! Pools outside the configuration namespace: ignored, and said so on the pool.
//!
//! The speakers read their pools only in their namespace, and so does the controller
//! (`--namespace`, [`crate::run`]): a pool elsewhere hands out no address (nobody would announce
//! it), conflicts with no pool and cannot freeze the configuration when it is invalid. Left at
//! that it would be silent, so the leader also watches the metadata of every pool of the cluster
//! (names and uids, never a spec: a pool elsewhere costs the controller no more than its
//! metadata) and writes one Warning Event `IgnoredOutsideNamespace` on each pool outside the
//! namespace: once per object (a pool deleted and created again is a new object), again after a
//! failed write, and again from a new leader.
//!
//! [`StrayPools`] is the decision (watch events in, the pools to report out: pure); [`report`]
//! is the loop around it that publishes the Events.

use std::collections::BTreeSet;
use std::future::Future;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use swimlb_config::crd::IPAddressPool;
use swimlb_config::events::Reason;
use swimlb_config::reflect::{RetryBackoff, watch_config};

use crate::metrics::{ApiResource, ControllerMetrics};

/// What the metadata watch yields: a pool's metadata, without its spec.
pub type PoolMeta = PartialObjectMeta<IPAddressPool>;

/// One pool object: its namespace, name and uid (a pool created again under the same name is
/// another object).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PoolId {
    /// The pool's namespace.
    pub namespace: String,
    /// The pool's name.
    pub name: String,
    /// The pool's uid (absent only from objects the API server did not store).
    pub uid: Option<String>,
}

impl PoolId {
    fn of(pool: &PoolMeta) -> Self {
        PoolId {
            namespace: pool.namespace().unwrap_or_default(),
            name: pool.name_any(),
            uid: pool.uid(),
        }
    }
}

impl std::fmt::Display for PoolId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A pool outside the configuration namespace, to report.
#[derive(Debug, Clone, PartialEq)]
pub struct Stray {
    /// The pool.
    pub id: PoolId,
    /// What the Event is about.
    pub reference: ObjectReference,
}

impl Stray {
    /// The Event's note: what happens to the pool and what to do.
    pub fn note(&self, namespace: &str) -> String {
        format!(
            "IPAddressPool {} is ignored: swimlb reads pools only in namespace {namespace} (where \
             the speakers read theirs); no address is handed out from it. Create it in \
             {namespace}, or delete it.",
            self.id
        )
    }
}

/// Which pools outside the configuration namespace were reported (pure: no I/O, no clock).
#[derive(Debug, Default)]
pub struct StrayPools {
    namespace: String,
    /// The pools outside the namespace reported (or being reported) and not deleted since.
    reported: BTreeSet<PoolId>,
    /// During a relist (between `Init` and `InitDone`): the strays listed so far; what is not
    /// listed again was deleted meanwhile.
    relisted: Option<BTreeSet<PoolId>>,
}

impl StrayPools {
    /// Nothing reported yet; pools in `namespace` are the ones in use.
    pub fn new(namespace: impl Into<String>) -> Self {
        StrayPools {
            namespace: namespace.into(),
            ..StrayPools::default()
        }
    }

    /// Takes one event of the cluster-wide watch; returns the pools outside the namespace that
    /// were not reported yet (each object once, until [`StrayPools::unreport`]), and forgets the
    /// deleted ones.
    pub fn observe(&mut self, event: &watcher::Event<PoolMeta>) -> Vec<Stray> {
        match event {
            watcher::Event::Init => {
                self.relisted = Some(BTreeSet::new());
                Vec::new()
            }
            watcher::Event::InitApply(pool) => {
                let stray = self.sighted(pool);
                let outside = !self.inside(pool);
                if let (Some(relisted), true) = (self.relisted.as_mut(), outside) {
                    relisted.insert(PoolId::of(pool));
                }
                stray.into_iter().collect()
            }
            watcher::Event::InitDone => {
                if let Some(relisted) = self.relisted.take() {
                    self.reported = relisted;
                }
                Vec::new()
            }
            watcher::Event::Apply(pool) => self.sighted(pool).into_iter().collect(),
            watcher::Event::Delete(pool) => {
                let id = PoolId::of(pool);
                self.reported.remove(&id);
                if let Some(relisted) = self.relisted.as_mut() {
                    relisted.remove(&id);
                }
                Vec::new()
            }
        }
    }

    /// Forgets that `stray` was reported (its Event could not be written): its next sight
    /// reports it again.
    pub fn unreport(&mut self, stray: &Stray) {
        self.reported.remove(&stray.id);
        if let Some(relisted) = self.relisted.as_mut() {
            relisted.remove(&stray.id);
        }
    }

    /// How many pools outside the namespace are known (reported and not deleted).
    pub fn len(&self) -> usize {
        self.reported.len()
    }

    /// Whether no pool outside the namespace is known.
    pub fn is_empty(&self) -> bool {
        self.reported.is_empty()
    }

    fn inside(&self, pool: &PoolMeta) -> bool {
        pool.namespace().as_deref() == Some(self.namespace.as_str())
    }

    /// `pool`, to report when it is outside the namespace and not reported yet.
    fn sighted(&mut self, pool: &PoolMeta) -> Option<Stray> {
        if self.inside(pool) {
            return None;
        }
        let id = PoolId::of(pool);
        if !self.reported.insert(id.clone()) {
            return None;
        }
        Some(Stray {
            id,
            reference: pool.object_ref(&()),
        })
    }
}

/// Watches the metadata of every pool of the cluster and writes a Warning Event
/// `IgnoredOutsideNamespace` on each pool outside `namespace` ([`StrayPools`]), until `stop`.
/// Watch errors are retried with backoff and counted; a failed Event write is counted and
/// retried at the pool's next sight.
pub async fn report(
    api: Api<PoolMeta>,
    namespace: String,
    recorder: Recorder,
    metrics: ControllerMetrics,
    stop: impl Future<Output = ()> + Send + 'static,
) {
    let mut strays = StrayPools::new(namespace.clone());
    let stream = watcher(api, watch_config()).backoff(RetryBackoff::new());
    let mut stream = std::pin::pin!(stream);
    let mut stop = std::pin::pin!(stop);
    loop {
        let event = tokio::select! {
            _ = &mut stop => return,
            event = stream.next() => event,
        };
        let event = match event {
            None => return,
            Some(Err(e)) => {
                metrics.watch_error(ApiResource::IpAddressPools);
                tracing::warn!(error = %e, "watch of the pools of every namespace failed; retrying");
                continue;
            }
            Some(Ok(event)) => event,
        };
        for stray in strays.observe(&event) {
            tracing::warn!(pool = %stray.id, %namespace, "pool outside the configuration namespace: ignored");
            let event = Event {
                type_: EventType::Warning,
                reason: Reason::IgnoredOutsideNamespace.as_str().into(),
                note: Some(stray.note(&namespace)),
                action: "Validate".into(),
                secondary: None,
            };
            if let Err(e) = recorder.publish(&event, &stray.reference).await {
                metrics.write_error(ApiResource::Events);
                tracing::warn!(pool = %stray.id, error = %e, "cannot publish event");
                strays.unreport(&stray);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use kube::api::ObjectMeta;
    use kube::core::PartialObjectMetaExt;

    /// A pool's metadata as the API server answers a metadata-only watch (its kind erased).
    fn pool(namespace: &str, name: &str, uid: &str) -> PoolMeta {
        ObjectMeta {
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            uid: Some(uid.into()),
            ..ObjectMeta::default()
        }
        .into_response_partial()
    }

    fn names(strays: &[Stray]) -> Vec<String> {
        strays.iter().map(|s| s.id.to_string()).collect()
    }

    #[test]
    fn a_pool_outside_the_namespace_is_reported_once_and_a_pool_inside_never() {
        let mut strays = StrayPools::new("swimlb-system");
        let inside = pool("swimlb-system", "lab", "u-1");
        let outside = pool("team-a", "cheap", "u-2");
        assert!(
            strays
                .observe(&watcher::Event::Apply(inside.clone()))
                .is_empty()
        );
        let reported = strays.observe(&watcher::Event::Apply(outside.clone()));
        assert_eq!(names(&reported), ["team-a/cheap"]);
        assert_eq!(reported[0].reference.kind.as_deref(), Some("IPAddressPool"));
        assert_eq!(
            reported[0].reference.api_version.as_deref(),
            Some("swimlb.io/v1beta1")
        );
        assert_eq!(reported[0].reference.uid.as_deref(), Some("u-2"));
        assert!(reported[0].note("swimlb-system").contains("swimlb-system"));
        // Its next change is not reported again.
        assert!(strays.observe(&watcher::Event::Apply(outside)).is_empty());
        assert_eq!(strays.len(), 1);
    }

    #[test]
    fn a_stray_deleted_and_created_again_is_reported_again() {
        let mut strays = StrayPools::new("swimlb-system");
        let first = pool("team-a", "cheap", "u-1");
        assert_eq!(
            strays.observe(&watcher::Event::Apply(first.clone())).len(),
            1
        );
        assert!(strays.observe(&watcher::Event::Delete(first)).is_empty());
        assert!(strays.is_empty());
        let again = pool("team-a", "cheap", "u-2");
        assert_eq!(strays.observe(&watcher::Event::Apply(again)).len(), 1);
    }

    #[test]
    fn a_stray_whose_event_failed_is_reported_at_its_next_sight() {
        let mut strays = StrayPools::new("swimlb-system");
        let outside = pool("team-a", "cheap", "u-1");
        let reported = strays.observe(&watcher::Event::Apply(outside.clone()));
        strays.unreport(&reported[0]);
        assert_eq!(strays.observe(&watcher::Event::Apply(outside)).len(), 1);
    }

    #[test]
    fn a_relist_reports_only_new_strays_and_forgets_those_gone_meanwhile() {
        let mut strays = StrayPools::new("swimlb-system");
        let kept = pool("team-a", "kept", "u-1");
        let gone = pool("team-b", "gone", "u-2");
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(kept.clone()),
            watcher::Event::InitApply(gone.clone()),
            watcher::Event::InitApply(pool("swimlb-system", "lab", "u-0")),
        ] {
            strays.observe(&event);
        }
        assert!(strays.observe(&watcher::Event::InitDone).is_empty());
        assert_eq!(strays.len(), 2);
        // The watch starts over: `gone` was deleted while it was down, `new` created.
        let mut reported = Vec::new();
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(kept),
            watcher::Event::InitApply(pool("team-c", "new", "u-3")),
            watcher::Event::InitDone,
        ] {
            reported.extend(strays.observe(&event));
        }
        assert_eq!(names(&reported), ["team-c/new"]);
        assert_eq!(strays.len(), 2);
        // Created again under its old name: a new object, reported.
        assert_eq!(
            names(&strays.observe(&watcher::Event::Apply(pool("team-b", "gone", "u-4")))),
            ["team-b/gone"]
        );
    }
}
