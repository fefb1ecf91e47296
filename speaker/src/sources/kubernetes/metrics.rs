//! The Kubernetes mode's own metrics: watch and write errors, how long a watch event takes to
//! reach the announcements, and what the snapshot leaves out.
//!
//! [`KubeMetrics::register`] registers them into the registry it is handed (no globals). Every
//! label value comes from a closed list: the plural name of a watched or written resource
//! ([`Resource::as_str`]) or a [`Dropped`](super::snapshot::Dropped) reason.

use std::fmt::Write as _;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;

use super::snapshot::DropReason;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use swimlb_config::api_errors::ApiErrors;

/// A resource the speaker watches or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    /// `services` (watched).
    Services,
    /// `endpointslices` (watched).
    EndpointSlices,
    /// `nodes` (watched).
    Nodes,
    /// `ipaddresspools` (watched, in the speaker's namespace).
    IpAddressPools,
    /// `l2advertisements` (watched, in the speaker's namespace).
    L2Advertisements,
    /// `pods` (the speaker Pods, watched: the gossip peers).
    Pods,
    /// `servicel2statuses` (written: the records; watched, to rewrite one made stale).
    ServiceL2Statuses,
    /// `events` (written: `nodeAssigned` and the warnings).
    Events,
}

impl Resource {
    /// Every resource the speaker watches.
    pub const WATCHED: [Resource; 7] = [
        Resource::Services,
        Resource::EndpointSlices,
        Resource::Nodes,
        Resource::IpAddressPools,
        Resource::L2Advertisements,
        Resource::Pods,
        Resource::ServiceL2Statuses,
    ];
    /// Every resource the speaker writes.
    pub const WRITTEN: [Resource; 2] = [Resource::ServiceL2Statuses, Resource::Events];

    /// The resource's plural name, as in an API path: the metrics' `resource` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Resource::Services => "services",
            Resource::EndpointSlices => "endpointslices",
            Resource::Nodes => "nodes",
            Resource::IpAddressPools => "ipaddresspools",
            Resource::L2Advertisements => "l2advertisements",
            Resource::Pods => "pods",
            Resource::ServiceL2Statuses => "servicel2statuses",
            Resource::Events => "events",
        }
    }
}

/// The label set `{resource}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    resource: Resource,
}

impl From<Resource> for ResourceLabels {
    fn from(resource: Resource) -> ResourceLabels {
        ResourceLabels { resource }
    }
}

impl EncodeLabelValue for Resource {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> std::fmt::Result {
        encoder.write_str(self.as_str())
    }
}

/// The label set `{reason}` of `swimlb_snapshot_dropped`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DroppedLabels {
    /// Why.
    pub reason: DropReason,
}

impl EncodeLabelValue for DropReason {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> std::fmt::Result {
        encoder.write_str(self.as_str())
    }
}

/// The buckets of `swimlb_kubernetes_event_handling_seconds`, in seconds: fine around the
/// 10 ms target, coarse up to a full rebuild of a large cluster.
pub const EVENT_HANDLING_BUCKETS: [f64; 15] = [
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

type HistogramFamily = Family<ResourceLabels, Histogram, fn() -> Histogram>;

fn event_handling_histogram() -> Histogram {
    Histogram::new(EVENT_HANDLING_BUCKETS)
}

/// The Kubernetes mode's metrics. Clones share the same values.
#[derive(Debug, Clone)]
pub struct KubeMetrics {
    /// `swimlb_kubernetes_watch_errors_total{resource}` and `..._write_errors_total{resource}`.
    api_errors: ApiErrors<Resource>,
    /// `swimlb_kubernetes_event_handling_seconds{resource}`.
    event_handling: HistogramFamily,
    /// `swimlb_kubernetes_records_swept_total`.
    records_swept: Counter,
    /// `swimlb_snapshot_dropped{reason}`.
    pub dropped: Family<DroppedLabels, Gauge>,
}

impl Default for KubeMetrics {
    fn default() -> KubeMetrics {
        KubeMetrics {
            api_errors: ApiErrors::default(),
            event_handling: Family::new_with_constructor(event_handling_histogram),
            records_swept: Counter::default(),
            dropped: Family::default(),
        }
    }
}

impl KubeMetrics {
    /// New metrics, registered into `registry`, every series of a known resource at 0 (so
    /// that `rate()` and alerts see them from the start).
    pub fn register(registry: &mut Registry) -> KubeMetrics {
        let mut m = KubeMetrics::default();
        for resource in Resource::WATCHED {
            let _ = m.event_handling.get_or_create(&resource.into());
        }
        m.api_errors = ApiErrors::register(
            registry,
            &Resource::WATCHED,
            &Resource::WRITTEN,
            "records are retried until they are true",
        );
        registry.register(
            "swimlb_kubernetes_event_handling_seconds",
            "From a watch event's arrival to the engine's actions for it carried out (announcements started or stopped)",
            m.event_handling.clone(),
        );
        registry.register(
            "swimlb_kubernetes_records_swept",
            "ServiceL2Status records of Services no longer served deleted by this node's sweep (left by a speaker that no longer takes care of them)",
            m.records_swept.clone(),
        );
        registry.register(
            "swimlb_snapshot_dropped",
            "Objects, Services, IPs and endpoints left out of what is served, and interfaces named but missing on this node, by reason",
            m.dropped.clone(),
        );
        m
    }

    /// Counts one failed watch or list of `resource`.
    pub fn watch_error(&self, resource: Resource) {
        self.api_errors.watch_error(resource);
    }

    /// Counts one failed write of `resource`.
    pub fn write_error(&self, resource: Resource) {
        self.api_errors.write_error(resource);
    }

    /// Counts `n` records swept.
    pub fn records_swept(&self, n: u64) {
        if n > 0 {
            self.records_swept.inc_by(n);
        }
    }

    /// Observes one watch event of `resource` handled `seconds` after it arrived.
    pub fn event_handled(&self, resource: Resource, seconds: f64) {
        self.event_handling
            .get_or_create(&resource.into())
            .observe(seconds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::serve::http::metrics_text as encode;

    #[test]
    fn errors_and_handling_times_are_labelled_by_resource() {
        let mut registry = Registry::default();
        let m = KubeMetrics::register(&mut registry);
        m.watch_error(Resource::EndpointSlices);
        m.watch_error(Resource::EndpointSlices);
        m.write_error(Resource::ServiceL2Statuses);
        m.event_handled(Resource::EndpointSlices, 0.004);
        m.records_swept(2);
        let text = encode(&registry);
        for line in [
            "swimlb_kubernetes_watch_errors_total{resource=\"endpointslices\"} 2\n",
            "swimlb_kubernetes_write_errors_total{resource=\"servicel2statuses\"} 1\n",
            "swimlb_kubernetes_write_errors_total{resource=\"events\"} 0\n",
            "swimlb_kubernetes_watch_errors_total{resource=\"pods\"} 0\n",
            "swimlb_kubernetes_records_swept_total 2\n",
            "swimlb_kubernetes_event_handling_seconds_bucket{le=\"0.003\",resource=\"endpointslices\"} 0\n",
            "swimlb_kubernetes_event_handling_seconds_bucket{le=\"0.005\",resource=\"endpointslices\"} 1\n",
            "swimlb_kubernetes_event_handling_seconds_count{resource=\"endpointslices\"} 1\n",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }
}
