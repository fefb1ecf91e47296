//! What swimlb reads of a Kubernetes Service, for the controller and the speaker alike.
//!
//! [`view_of`] turns a `Service` into a plain [`ServiceView`] (pure; unknown strings read as
//! Kubernetes' defaults), and [`trim_service`] drops everything `view_of` does not read before a
//! Service is cached, so a cache of thousands of Services stays small and `view_of` of the
//! trimmed Service equals `view_of` of the full one.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use kube::{Resource, ResourceExt};

use smol_str::SmolStr;

use crate::pools::{Applicant, Family};
use crate::reflect::trim_meta;

/// Identifies a Service. The names are `SmolStr`s: inline up to 23 bytes, as most namespaces
/// and Service names are, so the maps keyed by Services (10,000 of them in a speaker's caches,
/// its snapshot keeper and its records) allocate no strings for most keys.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    /// The namespace.
    pub namespace: SmolStr,
    /// The name.
    pub name: SmolStr,
}

impl ServiceKey {
    /// A key from namespace and name.
    pub fn new(namespace: impl Into<SmolStr>, name: impl Into<SmolStr>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// `spec.ipFamilyPolicy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum IpFamilyPolicy {
    /// One address (the default).
    #[default]
    SingleStack,
    /// One address per family the pool has.
    PreferDualStack,
    /// One address of each family.
    RequireDualStack,
}

/// `spec.externalTrafficPolicy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TrafficPolicy {
    /// Any node forwards (the default).
    #[default]
    Cluster,
    /// Only nodes with an endpoint serve.
    Local,
}

/// A port's protocol.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// TCP (the default).
    #[default]
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

/// One Service port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePort {
    /// The port number.
    pub port: i32,
    /// The protocol.
    pub protocol: Protocol,
}

/// What swimlb reads of a Service: everything the controller's allocator decides on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceView {
    /// Namespace and name.
    pub key: ServiceKey,
    /// The Service's labels.
    pub labels: BTreeMap<String, String>,
    /// The labels of the Service's namespace.
    pub namespace_labels: BTreeMap<String, String>,
    /// Whether `spec.type` is LoadBalancer.
    pub is_load_balancer: bool,
    /// `spec.loadBalancerClass`.
    pub load_balancer_class: Option<String>,
    /// `spec.loadBalancerIP` (deprecated in Kubernetes, still honoured).
    pub load_balancer_ip: Option<String>,
    /// The annotations.
    pub annotations: BTreeMap<String, String>,
    /// `spec.ipFamilies`, in order.
    pub ip_families: Vec<Family>,
    /// `spec.ipFamilyPolicy`.
    pub ip_family_policy: IpFamilyPolicy,
    /// `spec.ports`.
    pub ports: Vec<ServicePort>,
    /// `spec.externalTrafficPolicy`.
    pub external_traffic_policy: TrafficPolicy,
    /// `spec.selector`.
    pub selector: BTreeMap<String, String>,
    /// The IPs in `status.loadBalancer.ingress`.
    pub status_ips: Vec<IpAddr>,
}

impl ServiceView {
    /// The Service as a pool's `serviceAllocation` sees it.
    pub fn applicant(&self) -> Applicant<'_> {
        Applicant {
            namespace: &self.key.namespace,
            namespace_labels: &self.namespace_labels,
            service_labels: &self.labels,
        }
    }
}

/// The [`ServiceView`] of a Service (pure). Unknown family, policy and protocol strings are
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

/// Drops from a Service what [`view_of`] never reads, before it is cached (pure): managed
/// fields, the last-applied annotation, the resourceVersion, the spec fields `view_of`
/// ignores, port names and node ports, status conditions and ingress ports and modes, and
/// values equal to the defaults `view_of` assumes (`SingleStack`, `Cluster`, `TCP`). What stays:
/// name, namespace, uid, deletionTimestamp, finalizers, labels, other annotations and every
/// field `view_of` reads, so `view_of` of the trimmed Service equals `view_of` of the full one
/// but for the last-applied annotation (which no reader looks up).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reflect::LAST_APPLIED;
    use serde_json::json;

    fn service(value: serde_json::Value) -> Service {
        serde_json::from_value(value).expect("test service is valid")
    }

    #[test]
    fn a_service_converts_to_the_allocator_view() {
        let svc = service(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"},
                "annotations": {"metallb.io/address-pool": "p"}},
            "spec": {"type": "LoadBalancer", "loadBalancerClass": "swimlb.io/l2", "loadBalancerIP": "192.0.2.9",
                "ipFamilies": ["IPv6", "IPv4"], "ipFamilyPolicy": "RequireDualStack",
                "ports": [{"port": 53, "protocol": "UDP"}, {"port": 443}],
                "externalTrafficPolicy": "Local", "selector": {"app": "web"}},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.9"}, {"hostname": "lb.example"}, {"ip": "2001:db8::9"}]}},
        }));
        let ns: BTreeMap<String, String> = [("env".to_string(), "prod".to_string())].into();
        let view = view_of(&svc, &ns);
        let labels: BTreeMap<String, String> = [("app".to_string(), "web".to_string())].into();
        assert_eq!(
            view,
            ServiceView {
                key: ServiceKey::new("shop", "web"),
                labels: labels.clone(),
                namespace_labels: ns,
                is_load_balancer: true,
                load_balancer_class: Some("swimlb.io/l2".into()),
                load_balancer_ip: Some("192.0.2.9".into()),
                annotations: [("metallb.io/address-pool".to_string(), "p".to_string())].into(),
                ip_families: vec![Family::V6, Family::V4],
                ip_family_policy: IpFamilyPolicy::RequireDualStack,
                ports: vec![
                    ServicePort {
                        port: 53,
                        protocol: Protocol::Udp
                    },
                    ServicePort {
                        port: 443,
                        protocol: Protocol::Tcp
                    },
                ],
                external_traffic_policy: TrafficPolicy::Local,
                selector: labels,
                status_ips: vec![
                    "192.0.2.9".parse().expect("ip"),
                    "2001:db8::9".parse().expect("ip")
                ],
            }
        );
        let cluster_ip = service(json!({"metadata": {"name": "x"}, "spec": {"type": "ClusterIP"}}));
        assert!(!view_of(&cluster_ip, &BTreeMap::new()).is_load_balancer);
    }

    #[test]
    fn a_trimmed_service_keeps_its_view_identity_and_deletion_and_drops_the_rest() {
        let full = service(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-7", "resourceVersion": "42",
                "deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["x/y"],
                "labels": {"app": "web"},
                "annotations": {"metallb.io/address-pool": "p", LAST_APPLIED: "{\"big\": true}"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"type": "LoadBalancer", "loadBalancerClass": "swimlb.io/l2", "loadBalancerIP": "192.0.2.9",
                "clusterIP": "10.0.0.1", "clusterIPs": ["10.0.0.1"], "sessionAffinity": "None",
                "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353, "nodePort": 30053},
                    {"port": 80, "protocol": "TCP"}],
                "externalTrafficPolicy": "Local", "selector": {"app": "web"}},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.9", "ipMode": "VIP",
                "ports": [{"port": 53, "protocol": "UDP"}]}]},
                "conditions": [{"type": "x", "status": "True", "reason": "r", "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
        }));
        let mut trimmed = full.clone();
        trim_service(&mut trimmed);
        let ns = BTreeMap::new();
        let mut expected = view_of(&full, &ns);
        expected.annotations.remove(LAST_APPLIED);
        assert_eq!(view_of(&trimmed, &ns), expected);
        let mut without_version = full.object_ref(&());
        without_version.resource_version = None;
        assert_eq!(trimmed.object_ref(&()), without_version);
        assert!(trimmed.meta().deletion_timestamp.is_some());
        assert_eq!(trimmed.finalizers(), full.finalizers());
        assert!(trimmed.meta().managed_fields.is_none());
        assert!(!trimmed.annotations().contains_key(LAST_APPLIED));
        let spec = trimmed.spec.as_ref().expect("spec");
        assert_eq!(
            (spec.cluster_ip.as_ref(), spec.session_affinity.as_ref()),
            (None, None)
        );
        let port = &spec.ports.as_ref().expect("ports")[0];
        assert_eq!((port.name.as_ref(), port.node_port), (None, None));
        assert!(
            trimmed
                .status
                .as_ref()
                .expect("status")
                .conditions
                .is_none()
        );
    }
}
