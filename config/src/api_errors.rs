//! The counters of failed Kubernetes API calls that both daemons export:
//! `swimlb_kubernetes_watch_errors_total{resource}` and
//! `swimlb_kubernetes_write_errors_total{resource}`.
//!
//! [`ApiErrors::register`] registers them into the registry it is handed (no globals). Each
//! daemon labels them with its own closed list of resources, an enum whose label value is the
//! plural name as in an API path.

use std::fmt::Debug;
use std::hash::Hash;

use prometheus_client::encoding::{
    EncodeLabelKey, EncodeLabelSet, EncodeLabelValue, LabelSetEncoder,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// The label set `{resource}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq)]
struct ResourceLabels<R> {
    resource: R,
}

// By hand: the derive does not take a generic struct.
impl<R: EncodeLabelValue> EncodeLabelSet for ResourceLabels<R> {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> std::fmt::Result {
        let mut label = encoder.encode_label();
        let mut key = label.encode_label_key()?;
        EncodeLabelKey::encode(&"resource", &mut key)?;
        let mut value = key.encode_label_value()?;
        self.resource.encode(&mut value)?;
        value.finish()
    }
}

/// Failed watches and writes, by resource `R`. Clones share the same values.
#[derive(Debug, Clone)]
pub struct ApiErrors<R> {
    /// `swimlb_kubernetes_watch_errors_total{resource}`.
    watch: Family<ResourceLabels<R>, Counter>,
    /// `swimlb_kubernetes_write_errors_total{resource}`.
    write: Family<ResourceLabels<R>, Counter>,
}

impl<R: Clone + Hash + Eq> Default for ApiErrors<R> {
    fn default() -> ApiErrors<R> {
        ApiErrors {
            watch: Family::default(),
            write: Family::default(),
        }
    }
}

impl<R> ApiErrors<R>
where
    R: EncodeLabelValue + Copy + Debug + Hash + Eq + Send + Sync + 'static,
{
    /// New counters, registered into `registry`, the series of every resource in `watched` and
    /// `written` at 0 (so that `rate()` and alerts see them from the start). `write_retries`
    /// ends the write counter's help: what the daemon retries.
    pub fn register(
        registry: &mut Registry,
        watched: &[R],
        written: &[R],
        write_retries: &str,
    ) -> ApiErrors<R> {
        let m = ApiErrors::default();
        for &resource in watched {
            let _ = m.watch.get_or_create(&ResourceLabels { resource });
        }
        for &resource in written {
            let _ = m.write.get_or_create(&ResourceLabels { resource });
        }
        registry.register(
            "swimlb_kubernetes_watch_errors",
            "Failed watches and lists of a resource (each is retried with backoff)",
            m.watch.clone(),
        );
        registry.register(
            "swimlb_kubernetes_write_errors",
            format!("Writes to the API server that failed, by resource ({write_retries})"),
            m.write.clone(),
        );
        m
    }

    /// Counts one failed watch or list of `resource`.
    pub fn watch_error(&self, resource: R) {
        self.watch.get_or_create(&ResourceLabels { resource }).inc();
    }

    /// Counts one failed write of `resource`.
    pub fn write_error(&self, resource: R) {
        self.write.get_or_create(&ResourceLabels { resource }).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use prometheus_client::encoding::LabelValueEncoder;

    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    enum Resource {
        Services,
        Events,
    }

    impl EncodeLabelValue for Resource {
        fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> std::fmt::Result {
            use std::fmt::Write as _;
            encoder.write_str(match self {
                Resource::Services => "services",
                Resource::Events => "events",
            })
        }
    }

    #[test]
    fn errors_are_counted_by_resource_from_zero() {
        let mut registry = Registry::default();
        let m = ApiErrors::register(
            &mut registry,
            &[Resource::Services],
            &[Resource::Services, Resource::Events],
            "retried",
        );
        m.write_error(Resource::Events);
        m.write_error(Resource::Events);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        for line in [
            "# HELP swimlb_kubernetes_write_errors Writes to the API server that failed, by resource (retried).\n",
            "swimlb_kubernetes_watch_errors_total{resource=\"services\"} 0\n",
            "swimlb_kubernetes_write_errors_total{resource=\"services\"} 0\n",
            "swimlb_kubernetes_write_errors_total{resource=\"events\"} 2\n",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        assert!(
            !text.contains("watch_errors_total{resource=\"events\"}"),
            "{text}"
        );
    }
}
