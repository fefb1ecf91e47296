//! The controller's metrics: pool sizes and use per family, allocation errors by reason,
//! failed Kubernetes watches and writes by resource, and `swimlb_build_info`.
//!
//! [`ControllerMetrics::register`] registers into a registry it is handed (no globals). Labels are
//! bounded: pool names come from validated pools, families and reasons from `as_str()`.

use std::fmt::{self, Write as _};

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use swimlb_config::api_errors::ApiErrors;
use swimlb_config::pools::Family as IpFamily;

use crate::allocator::{AllocationError, ErrorReason, PoolUsage};

/// Labels of the pool gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    /// The pool name.
    pub pool: String,
    /// `ipv4` or `ipv6`.
    pub family: FamilyLabel,
}

/// Labels of the error counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// [`AllocationError::reason`].
    pub reason: ErrorReason,
}

impl EncodeLabelValue for ErrorReason {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> fmt::Result {
        encoder.write_str(self.as_str())
    }
}

/// The resources the controller watches and writes; the `resource` label spells each as in an
/// API path ([`ApiResource::as_str`]).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum ApiResource {
    /// `services`: watched; their `status.loadBalancer` written.
    Services,
    /// `namespaces`: watched.
    Namespaces,
    /// `ipaddresspools`: watched; their status written.
    IpAddressPools,
    /// `l2advertisements`: watched.
    L2Advertisements,
    /// `events`: written.
    Events,
    /// `secrets`: the speakers' gossip key, created.
    Secrets,
}

impl ApiResource {
    /// The plural name, as in an API path.
    pub fn as_str(self) -> &'static str {
        match self {
            ApiResource::Services => "services",
            ApiResource::Namespaces => "namespaces",
            ApiResource::IpAddressPools => "ipaddresspools",
            ApiResource::L2Advertisements => "l2advertisements",
            ApiResource::Events => "events",
            ApiResource::Secrets => "secrets",
        }
    }
}

impl EncodeLabelValue for ApiResource {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> fmt::Result {
        encoder.write_str(self.as_str())
    }
}

/// An address family as a label value: `ipv4` or `ipv6` ([`IpFamily::as_str`]).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct FamilyLabel(pub IpFamily);

impl EncodeLabelValue for FamilyLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> fmt::Result {
        encoder.write_str(self.0.as_str())
    }
}

/// Labels of `swimlb_build_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// The crate version (`swimlb-controller --version`).
    pub version: &'static str,
    /// `controller` (the speaker exports `speaker`).
    pub component: &'static str,
}

/// The controller's metrics. Clones share the same values.
#[derive(Clone, Debug, Default)]
pub struct ControllerMetrics {
    /// `swimlb_pool_addresses{pool,family}`: addresses a pool can hand out (saturated at i64::MAX).
    pub pool_addresses: Family<PoolLabels, Gauge>,
    /// `swimlb_pool_addresses_in_use{pool,family}`: addresses held by Services.
    pub pool_addresses_in_use: Family<PoolLabels, Gauge>,
    /// `swimlb_allocation_errors_total{reason}`: allocations refused, by reason.
    pub allocation_errors: Family<ReasonLabels, Counter>,
    /// `swimlb_addresses_outside_pools`: addresses Services keep although no pool in force has
    /// them (their pool is invalid or gone).
    pub addresses_outside_pools: Gauge,
    /// `swimlb_build_info{version,component}`: always 1.
    pub build_info: Family<BuildLabels, Gauge>,
    /// `swimlb_kubernetes_watch_errors_total{resource}` and `..._write_errors_total{resource}`.
    pub api_errors: ApiErrors<ApiResource>,
    /// `swimlb_http_connections_dropped_total{reason}`: connections the HTTP listener closed.
    pub listener: swimlb_proto::listener::ListenerMetrics,
}

fn saturate(n: u128) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl ControllerMetrics {
    /// New metrics, registered into `registry` under their `swimlb_` names.
    pub fn register(registry: &mut Registry) -> Self {
        let mut m = Self::default();
        m.build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
                component: "controller",
            })
            .set(1);
        registry.register(
            "swimlb_build_info",
            "Always 1; the labels say which swimlb build this is",
            m.build_info.clone(),
        );
        registry.register(
            "swimlb_pool_addresses",
            "Addresses an IPAddressPool can hand out, per family",
            m.pool_addresses.clone(),
        );
        registry.register(
            "swimlb_pool_addresses_in_use",
            "Addresses of an IPAddressPool held by Services, per family",
            m.pool_addresses_in_use.clone(),
        );
        registry.register(
            "swimlb_allocation_errors",
            "Services refused an address, by reason",
            m.allocation_errors.clone(),
        );
        registry.register(
            "swimlb_addresses_outside_pools",
            "Addresses Services keep although no IPAddressPool in force has them",
            m.addresses_outside_pools.clone(),
        );
        m.api_errors = ApiErrors::register(
            registry,
            &[
                ApiResource::Services,
                ApiResource::Namespaces,
                ApiResource::IpAddressPools,
                ApiResource::L2Advertisements,
            ],
            &[
                ApiResource::Services,
                ApiResource::IpAddressPools,
                ApiResource::Events,
                ApiResource::Secrets,
            ],
            "statuses are retried",
        );
        m.listener = swimlb_proto::listener::ListenerMetrics::register(registry);
        m
    }

    /// Counts one failed watch or list of `resource`.
    pub fn watch_error(&self, resource: ApiResource) {
        self.api_errors.watch_error(resource);
    }

    /// Counts one failed write of `resource`.
    pub fn write_error(&self, resource: ApiResource) {
        self.api_errors.write_error(resource);
    }

    /// Sets the pool gauges from [`crate::allocator::Allocator::usage`]; pools no longer present
    /// are removed.
    pub fn observe_usage(&self, usage: &[PoolUsage]) {
        self.pool_addresses.clear();
        self.pool_addresses_in_use.clear();
        for u in usage {
            let labels = PoolLabels {
                pool: u.pool.clone(),
                family: FamilyLabel(u.family),
            };
            self.pool_addresses
                .get_or_create(&labels)
                .set(saturate(u.size));
            self.pool_addresses_in_use
                .get_or_create(&labels)
                .set(saturate(u.in_use));
        }
    }

    /// Counts one refused allocation.
    pub fn count_error(&self, error: &AllocationError) {
        self.allocation_errors
            .get_or_create(&ReasonLabels {
                reason: error.reason(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use swimlb_config::pools::Family as IpFamily;

    #[test]
    fn usage_and_errors_appear_in_the_openmetrics_text() {
        let mut registry = Registry::default();
        let m = ControllerMetrics::register(&mut registry);
        m.observe_usage(&[
            PoolUsage {
                pool: "a".into(),
                family: IpFamily::V4,
                size: 254,
                in_use: 3,
            },
            PoolUsage {
                pool: "a".into(),
                family: IpFamily::V6,
                size: u128::MAX,
                in_use: 0,
            },
        ]);
        m.count_error(&AllocationError::NoAvailablePool);
        m.count_error(&AllocationError::NoAvailablePool);
        m.watch_error(ApiResource::Namespaces);
        m.write_error(ApiResource::Events);
        m.write_error(ApiResource::Events);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        assert!(
            text.contains("swimlb_pool_addresses{pool=\"a\",family=\"ipv4\"} 254"),
            "{text}"
        );
        assert!(
            text.contains("swimlb_pool_addresses{pool=\"a\",family=\"ipv6\"} 9223372036854775807"),
            "{text}"
        );
        assert!(
            text.contains("swimlb_pool_addresses_in_use{pool=\"a\",family=\"ipv4\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("swimlb_allocation_errors_total{reason=\"no_available_pool\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("swimlb_kubernetes_watch_errors_total{resource=\"namespaces\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("swimlb_kubernetes_write_errors_total{resource=\"events\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("swimlb_kubernetes_write_errors_total{resource=\"secrets\"} 0"),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "swimlb_build_info{{version=\"{}\",component=\"controller\"}} 1",
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
    }

    #[test]
    fn a_pool_that_disappears_leaves_no_gauge_behind() {
        let mut registry = Registry::default();
        let m = ControllerMetrics::register(&mut registry);
        m.observe_usage(&[PoolUsage {
            pool: "old".into(),
            family: IpFamily::V4,
            size: 4,
            in_use: 1,
        }]);
        m.observe_usage(&[PoolUsage {
            pool: "new".into(),
            family: IpFamily::V4,
            size: 8,
            in_use: 0,
        }]);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        assert!(!text.contains("pool=\"old\""), "{text}");
        assert!(text.contains("pool=\"new\""), "{text}");
    }
}
