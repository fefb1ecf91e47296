//! The standalone source's own metrics: the checks, the notify hooks and the reloads.

use std::fmt::Write as _;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::ReloadFailure;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CheckLabels {
    pub(super) group: String,
    pub(super) check: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReloadLabels {
    reason: ReloadFailure,
}

impl EncodeLabelValue for ReloadFailure {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> std::fmt::Result {
        encoder.write_str(self.as_str())
    }
}

/// The standalone source's own metrics (the engine's drivers, the gossip and the responders
/// register theirs).
#[derive(Debug, Clone, Default)]
pub(super) struct Metrics {
    pub(super) check_up: Family<CheckLabels, Gauge>,
    pub(super) notify_failures: Counter,
    reload_failures: Family<ReloadLabels, Counter>,
    last_reload_ok: Gauge,
}

impl Metrics {
    /// Registers every metric into `registry`; the last reload counts as successful until one
    /// fails.
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "swimlb_check_up",
            "1 while a health check passes on this node",
            self.check_up.clone(),
        );
        registry.register(
            "swimlb_notify_failures",
            "Notify hook calls that failed",
            self.notify_failures.clone(),
        );
        registry.register(
            "swimlb_config_reload_failures",
            "Reloads refused (the speaker keeps what it runs), by reason",
            self.reload_failures.clone(),
        );
        registry.register(
            "swimlb_config_last_reload_successful",
            "0 while the last reload was refused, 1 after start-up or an applied reload",
            self.last_reload_ok.clone(),
        );
        self.last_reload_ok.set(1);
        // Every reason's series exists at 0 from the start: a family without a series is not
        // exposed at all, and a rate over a series that appears with its first failure is 0.
        for reason in ReloadFailure::ALL {
            let _ = self.reload_failures.get_or_create(&ReloadLabels { reason });
        }
    }

    /// Counts a reload refused for `reason` (or keys that could not be handed to the gossip).
    pub(super) fn reload_failed(&self, reason: ReloadFailure) {
        self.reload_failures
            .get_or_create(&ReloadLabels { reason })
            .inc();
        self.last_reload_ok.set(0);
    }

    /// Marks the last reload applied.
    pub(super) fn reload_applied(&self) {
        self.last_reload_ok.set(1);
    }
}
