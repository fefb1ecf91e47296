//! The Kubernetes custom resources users write: `IPAddressPool`, `L2Advertisement` and
//! `ServiceL2Status` in group `swimlb.io`, version `v1beta1`.
//!
//! The fields follow MetalLB's `metallb.io/v1beta1` ones (same names, same defaults), so a MetalLB
//! manifest converts by changing the group. These types are what users write, not what the
//! controller uses: [`crate::pools::validate`] turns them into a checked model and reports every
//! error at once. [`all_crds_yaml`] renders the CRD manifests that `deploy/crds.yaml` holds.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of every swimlb custom resource.
pub const GROUP: &str = "swimlb.io";
/// The API version of every swimlb custom resource.
pub const VERSION: &str = "v1beta1";

fn default_true() -> bool {
    true
}

/// A set of addresses the controller assigns to LoadBalancer Services. The controller checks
/// every pool as a whole: one that does not validate (a bad entry, an overlap with itself or
/// another pool) gets the condition `Valid` False with every error, and the last valid pools
/// stay in force.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "swimlb.io",
    version = "v1beta1",
    kind = "IPAddressPool",
    namespaced,
    status = "IPAddressPoolStatus",
    shortname = "ippool",
    printcolumn = r#"{"name":"Auto Assign","type":"boolean","jsonPath":".spec.autoAssign"}"#,
    printcolumn = r#"{"name":"Avoid Buggy IPs","type":"boolean","jsonPath":".spec.avoidBuggyIPs"}"#,
    printcolumn = r#"{"name":"Addresses","type":"string","jsonPath":".spec.addresses"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressPoolSpec {
    /// The addresses of the pool: CIDRs (`192.0.2.0/24`, `2001:db8::/64`) and inclusive ranges
    /// (`192.0.2.10-192.0.2.20`), IPv4 and IPv6, at least one. A CIDR with host bits set, a
    /// reversed range, a range whose ends are of two families, and an entry that overlaps
    /// another entry or another pool are errors.
    pub addresses: Vec<String>,
    /// Whether Services that name neither a pool (annotation `swimlb.io/address-pool`) nor an
    /// address may get addresses from this pool. Off, the pool serves only Services that ask
    /// for it or for one of its addresses.
    #[serde(default = "default_true")]
    pub auto_assign: bool,
    /// Never assign IPv4 addresses ending in `.0` or `.255`, which some old equipment takes for
    /// network or broadcast addresses and drops.
    #[serde(default, rename = "avoidBuggyIPs")]
    pub avoid_buggy_ips: bool,
    /// Restrict this pool to some Services, and order it before other pools for them. Without
    /// it, the pool serves any Service (with `autoAssign`) after the pools that have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_allocation: Option<ServiceAllocation>,
}

impl IPAddressPool {
    /// The pool `namespace/name` with these addresses and nothing else set, read as such a
    /// manifest reads (`autoAssign` true, which the derived `Default` of the spec is not); for
    /// tests and benchmarks.
    pub fn with_addresses(namespace: &str, name: &str, addresses: &[&str]) -> Self {
        let mut pool = IPAddressPool::new(
            name,
            IPAddressPoolSpec {
                addresses: addresses.iter().map(|a| a.to_string()).collect(),
                auto_assign: default_true(),
                ..Default::default()
            },
        );
        pool.metadata.namespace = Some(namespace.into());
        pool
    }
}

/// Which Services a pool serves, and in which order pools are tried.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAllocation {
    /// Pools whose `serviceAllocation` admits a Service are tried first: those with a priority
    /// above 0 by ascending priority (1 first), then those without one (0), then the pools
    /// without a `serviceAllocation`.
    #[serde(default)]
    pub priority: i32,
    /// The namespaces whose Services may use the pool, by name (empty: any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Selectors over namespace labels; a Service's namespace must match one (empty: any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespace_selectors: Vec<LabelSelector>,
    /// Selectors over Service labels; a Service must match one (empty: any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_selectors: Vec<LabelSelector>,
}

/// What the controller reports about a pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressPoolStatus {
    /// IPv4 addresses assigned to Services.
    #[serde(default, rename = "assignedIPv4")]
    pub assigned_ipv4: i64,
    /// IPv6 addresses assigned to Services.
    #[serde(default, rename = "assignedIPv6")]
    pub assigned_ipv6: i64,
    /// IPv4 addresses still free (at most 9223372036854775807, the largest the field holds).
    #[serde(default, rename = "availableIPv4")]
    pub available_ipv4: i64,
    /// IPv6 addresses still free (at most 9223372036854775807, the largest the field holds: a
    /// /64 has more).
    #[serde(default, rename = "availableIPv6")]
    pub available_ipv6: i64,
    /// `Valid`: True while the pool is accepted; False, with every validation error in the
    /// message, when the controller rejected it (the last valid configuration stays in force).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Announces the addresses of some pools with ARP (IPv4) and NDP (IPv6) from some nodes, on
/// some interfaces. An address is announced only when an advertisement selects its pool; one
/// node at a time answers for it, chosen by the speakers among the nodes the advertisements
/// allow.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "swimlb.io",
    version = "v1beta1",
    kind = "L2Advertisement",
    namespaced,
    shortname = "l2adv",
    printcolumn = r#"{"name":"IPAddressPools","type":"string","jsonPath":".spec.ipAddressPools"}"#,
    printcolumn = r#"{"name":"Node Selectors","type":"string","jsonPath":".spec.nodeSelectors","priority":10}"#
)]
#[serde(rename_all = "camelCase")]
// MetalLB's simplest L2Advertisement has no `spec` (every pool, every node): the API server fills
// in `{}` so it applies, and the derived type, which requires `spec`, reads it.
#[schemars(extend("default" = {}))]
pub struct L2AdvertisementSpec {
    /// Pools announced, by name. With no names and no `ipAddressPoolSelectors`, every pool of
    /// the namespace is announced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_address_pools: Vec<String>,
    /// Pools announced, by their labels: a pool matching any selector is (besides those named
    /// in `ipAddressPools`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_address_pool_selectors: Vec<LabelSelector>,
    /// Nodes that may announce, by their labels: a node matching any selector may (empty: every
    /// Node). Nodes with the condition `NetworkUnavailable` and nodes labelled
    /// `node.kubernetes.io/exclude-from-external-load-balancers` never announce (the label is
    /// ignored with the speaker's `--ignore-exclude-lb`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_selectors: Vec<LabelSelector>,
    /// The interfaces the announcing node answers and announces on, by name (empty: the
    /// interface with the connected route to the address). Of several advertisements for one
    /// address, the interfaces of all are used; one without `interfaces` means the routed one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<String>,
    /// Services announced, by their labels: a Service matching any selector is (empty: every
    /// Service with an address from the selected pools).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_selectors: Vec<LabelSelector>,
    /// Soft preferences among the nodes this advertisement lets announce: a node's score is the
    /// sum of the weights of the preferences it matches, summed over every advertisement that
    /// applies to a Service, and the highest score announces (MetalLB main). Nodes outside
    /// `nodeSelectors` score nothing from this advertisement.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preferred_node_selectors: Vec<PreferredNodeSelector>,
}

/// A weighted soft preference for some nodes (the shape of Kubernetes'
/// `PreferredSchedulingTerm`, with a label selector as MetalLB has it).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct PreferredNodeSelector {
    /// Added to the score of every node the preference matches, 1 to 100.
    #[schemars(range(min = 1, max = 100))]
    pub weight: i32,
    /// The nodes the weight is given to (an empty selector: every node of the advertisement).
    pub preference: LabelSelector,
}

/// Which node announces a Service's addresses, and on which interfaces: one object per
/// announced Service, in the speakers' namespace, written by the announcing speaker (a new
/// owner takes it over) and deleted when the Service is no longer served. For reading
/// (`kubectl get servicel2statuses`); the spec is empty.
#[derive(
    CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema,
)]
#[kube(
    group = "swimlb.io",
    version = "v1beta1",
    kind = "ServiceL2Status",
    namespaced,
    status = "ServiceL2StatusStatus",
    printcolumn = r#"{"name":"Allocated Node","type":"string","jsonPath":".status.node"}"#,
    printcolumn = r#"{"name":"Service Name","type":"string","jsonPath":".status.serviceName"}"#,
    printcolumn = r#"{"name":"Service Namespace","type":"string","jsonPath":".status.serviceNamespace"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ServiceL2StatusSpec {}

/// The node announcing a Service and the interfaces it announces on, as its speaker last wrote
/// them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceL2StatusStatus {
    /// The name of the announcing node.
    #[serde(default)]
    pub node: String,
    /// The Service's name.
    #[serde(default)]
    pub service_name: String,
    /// The Service's namespace.
    #[serde(default)]
    pub service_namespace: String,
    /// The interfaces the node announces on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<InterfaceInfo>,
}

/// One announcing interface.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct InterfaceInfo {
    /// The interface name, e.g. `eth0`.
    pub name: String,
}

/// Errors rendering the CRD manifests.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// The YAML serializer rejected a generated CRD.
    #[error("CustomResourceDefinition {name}: cannot render as YAML: {source}")]
    Render {
        /// The CRD's name.
        name: String,
        /// The serializer's error.
        #[source]
        source: serde_saphyr::SerializeError,
    },
}

/// The three CRD manifests as one multi-document YAML text, in a fixed order. This is exactly
/// what `deploy/crds.yaml` holds (the `crdgen` binary of swimlb-controller writes it).
pub fn all_crds_yaml() -> Result<String, CrdError> {
    let crds = [
        IPAddressPool::crd(),
        L2Advertisement::crd(),
        ServiceL2Status::crd(),
    ];
    let mut out = String::from(
        "# Generated by `cargo run -p swimlb-controller --bin crdgen`. Do not edit.\n",
    );
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let text =
            serde_saphyr::to_string(crd).map_err(|source| CrdError::Render { name, source })?;
        out.push_str("---\n");
        out.push_str(&text);
        if !text.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metallb_pool_manifest_parses_after_changing_the_group() {
        let json = r#"{"apiVersion":"swimlb.io/v1beta1","kind":"IPAddressPool",
            "metadata":{"name":"first","namespace":"swimlb-system"},
            "spec":{"addresses":["192.0.2.0/24","2001:db8::1-2001:db8::5"],"avoidBuggyIPs":true,
              "serviceAllocation":{"priority":50,"namespaces":["a"],
                "serviceSelectors":[{"matchLabels":{"app":"x"}}]}}}"#;
        let pool: IPAddressPool = serde_json::from_str(json).expect("valid manifest");
        assert!(pool.spec.auto_assign, "autoAssign defaults to true");
        assert!(pool.spec.avoid_buggy_ips);
        let alloc = pool
            .spec
            .service_allocation
            .expect("serviceAllocation present");
        assert_eq!(alloc.priority, 50);
        assert_eq!(alloc.namespaces, vec!["a".to_string()]);
        assert_eq!(alloc.service_selectors.len(), 1);
    }

    #[test]
    fn the_pool_status_uses_metallb_field_names() {
        let status = IPAddressPoolStatus {
            assigned_ipv4: 1,
            assigned_ipv6: 2,
            available_ipv4: 3,
            available_ipv6: 4,
            conditions: Vec::new(),
        };
        let json = serde_json::to_value(&status).expect("serializable");
        assert_eq!(
            json,
            serde_json::json!({"assignedIPv4":1,"assignedIPv6":2,"availableIPv4":3,"availableIPv6":4})
        );
    }

    #[test]
    fn the_crds_are_in_group_swimlb_io_version_v1beta1() {
        for crd in [
            IPAddressPool::crd(),
            L2Advertisement::crd(),
            ServiceL2Status::crd(),
        ] {
            assert_eq!(crd.spec.group, GROUP);
            assert_eq!(crd.spec.versions.len(), 1);
            assert_eq!(crd.spec.versions[0].name, VERSION);
            assert_eq!(crd.spec.scope, "Namespaced");
        }
    }

    #[test]
    fn the_committed_crds_yaml_matches_the_types() {
        let generated = all_crds_yaml().expect("renders");
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds.yaml");
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            generated == committed,
            "deploy/crds.yaml is out of date with the CRD types in config/src/crd.rs; regenerate it with \
             `cargo run -p swimlb-controller --bin crdgen > deploy/crds.yaml`"
        );
    }
}
