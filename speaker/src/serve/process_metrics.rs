//! Metrics about the speaker process itself: `swimlb_build_info` and `swimlb_ready`.
//!
//! Each mode registers them with [`register`] into the registry it builds, next to the gossip's,
//! the responders' and the status board's. `swimlb_ready` is read from the `/status` channel at
//! scrape time, so it says exactly what `/readyz` says and needs no update of its own.

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::serve::http::Status;

/// The labels of `swimlb_build_info`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    /// The crate version (`swimlb-speaker --version`).
    version: &'static str,
    /// `speaker` (the controller exports `controller`).
    component: &'static str,
}

/// `swimlb_ready`: 1 while `/readyz` answers 200 (joined the mesh, or alone by configuration,
/// and not draining).
#[derive(Debug)]
struct Ready(watch::Receiver<Status>);

impl TypedMetric for Ready {
    const TYPE: MetricType = MetricType::Gauge;
}

impl EncodeMetric for Ready {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let status = self.0.borrow();
        encoder.encode_gauge(&i64::from(status.ready && !status.draining))
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// Registers `swimlb_build_info` and `swimlb_ready` (from `status`, the channel `/status` and
/// `/readyz` are served from) into `registry`.
pub fn register(registry: &mut Registry, status: watch::Receiver<Status>) {
    let build: Family<BuildLabels, Gauge> = Family::default();
    build
        .get_or_create(&BuildLabels {
            version: env!("CARGO_PKG_VERSION"),
            component: "speaker",
        })
        .set(1);
    registry.register(
        "swimlb_build_info",
        "Always 1; the labels say which swimlb build this is",
        build,
    );
    registry.register(
        "swimlb_ready",
        "1 while the speaker is ready (/readyz): joined the mesh and not draining",
        Ready(status),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::serve::http::metrics_text as encode;

    #[test]
    fn ready_follows_the_status_channel_at_every_scrape() {
        let (tx, rx) = watch::channel(Status::default());
        let mut registry = Registry::default();
        register(&mut registry, rx);
        let text = encode(&registry);
        assert!(text.contains("swimlb_ready 0\n"), "{text}");
        assert!(
            text.contains(&format!(
                "swimlb_build_info{{version=\"{}\",component=\"speaker\"}} 1\n",
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
        tx.send_modify(|s| s.ready = true);
        assert!(encode(&registry).contains("swimlb_ready 1\n"));
        tx.send_modify(|s| s.draining = true);
        assert!(encode(&registry).contains("swimlb_ready 0\n"));
    }
}
