//! The failover latency histogram, `swimlb_failover_seconds`, and the timing of each takeover
//! into it.

use std::net::IpAddr;
use std::time::Duration;

use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use crate::model::engine::{Action, Notice};
use crate::model::membership::NodeName;

/// `swimlb_failover_seconds`: how long the IPs this node took over were unanswered, as far as
/// this node can tell. One sample per IP taken over from a member that went down or left (see
/// [`Notice::TookOver`] for what is not a takeover), from the last datagram this node heard
/// from that member to the moment it handed its first gratuitous announcement of the IP to the
/// responder (which sends it at once). Not timed: a previous owner this node never heard from
/// directly. Cloning shares the series.
#[derive(Debug, Clone)]
pub struct FailoverMetrics {
    seconds: Histogram,
}

impl Default for FailoverMetrics {
    fn default() -> FailoverMetrics {
        FailoverMetrics {
            // 10 ms .. 10.24 s, doubling.
            seconds: Histogram::new(exponential_buckets(0.01, 2.0, 11)),
        }
    }
}

impl FailoverMetrics {
    /// The histogram, registered into `registry`.
    pub fn register(registry: &mut Registry) -> FailoverMetrics {
        let metrics = FailoverMetrics::default();
        registry.register(
            "swimlb_failover_seconds",
            "From the last datagram heard from an IP's owner that went down or left to this node's first gratuitous announcement of the IP, one sample per IP taken over",
            metrics.seconds.clone(),
        );
        metrics
    }
}

/// Times every [`Notice::TookOver`] among `actions` into `failovers`: from when its previous
/// owner was last heard from (`last_heard`; `None`: never directly, not timed) to `announced`,
/// when the actions' announcements were handed to the responders. Returns each takeover with
/// its duration, for the log.
pub(crate) fn observe_takeovers<'a>(
    actions: &'a [Action],
    announced: Instant,
    last_heard: impl Fn(&str) -> Option<Instant>,
    failovers: &FailoverMetrics,
) -> Vec<(IpAddr, &'a NodeName, Option<Duration>)> {
    actions
        .iter()
        .filter_map(|action| match action {
            Action::Notice(Notice::TookOver { ip, from }) => {
                let took = last_heard(from).map(|heard| announced.saturating_duration_since(heard));
                if let Some(took) = took {
                    failovers.seconds.observe(took.as_secs_f64());
                }
                Some((*ip, from, took))
            }
            _ => None,
        })
        .collect()
}
