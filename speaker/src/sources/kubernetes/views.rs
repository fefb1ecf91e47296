//! What the speaker caches of Services and EndpointSlices: views with only the fields the
//! snapshot reads, deserialized straight from the API server's JSON (serde skips the rest, so it
//! is never allocated) and watched like the full types.
//!
//! A full `k8s_openapi` Service is 824 bytes before its strings and an EndpointSlice endpoint
//! 352; at 10,000 Services with 10,000 EndpointSlices of 3 endpoints that is most of a
//! speaker's memory. [`ServiceView`] keeps the Service's name, namespace, uid, labels (for
//! `serviceSelectors`), the `allow-shared-ip` annotations, type, class, traffic policy and
//! ingress IPs; [`SliceView`] the slice's name, namespace, Service (its
//! `kubernetes.io/service-name` label, moved into [`SliceView::service`] by [`trim_slice`]) and
//! each endpoint's node and `ready`/`serving` conditions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::{Metadata, NamespaceResourceScope, Resource};
use serde::Deserialize;

use super::snapshot::{ALLOW_SHARED_IP, SERVICE_NAME_LABEL};

/// A Service as the speaker caches it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct ServiceView {
    /// Name, namespace, uid, labels and the `allow-shared-ip` annotations.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What the snapshot reads of `spec`.
    #[serde(default)]
    pub spec: Option<ServiceSpecView>,
    /// What the snapshot reads of `status`.
    #[serde(default)]
    pub status: Option<ServiceStatusView>,
}

/// `Service.spec`: type, class and external traffic policy.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpecView {
    /// `type`.
    #[serde(rename = "type", default)]
    pub type_: Option<String>,
    /// `loadBalancerClass`.
    #[serde(default)]
    pub load_balancer_class: Option<String>,
    /// `externalTrafficPolicy`.
    #[serde(default)]
    pub external_traffic_policy: Option<String>,
}

/// `Service.status`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceStatusView {
    /// `loadBalancer`.
    #[serde(default)]
    pub load_balancer: Option<LoadBalancerView>,
}

/// `Service.status.loadBalancer`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct LoadBalancerView {
    /// `ingress`.
    #[serde(default)]
    pub ingress: Option<Vec<IngressView>>,
}

/// One `Service.status.loadBalancer.ingress` entry.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct IngressView {
    /// `ip`.
    #[serde(default)]
    pub ip: Option<String>,
}

impl Resource for ServiceView {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Service";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "services";
    type Scope = NamespaceResourceScope;
}

impl Metadata for ServiceView {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// An EndpointSlice as the speaker caches it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct SliceView {
    /// Name and namespace (and, before [`trim_slice`], the labels).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `endpoints` (the EndpointSlice controller writes `null` for a Service with no Pods).
    #[serde(default, deserialize_with = "null_as_empty")]
    pub endpoints: Vec<EndpointView>,
    /// The Service it belongs to (its `kubernetes.io/service-name` label), set by
    /// [`trim_slice`].
    #[serde(skip)]
    pub service: Option<String>,
}

/// A list the API server may send as `null`, read as an empty one.
fn null_as_empty<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(deserializer)?.unwrap_or_default())
}

/// One endpoint of a slice: its node and conditions.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointView {
    /// `nodeName`.
    #[serde(default)]
    pub node_name: Option<String>,
    /// `conditions`.
    #[serde(default)]
    pub conditions: Option<ConditionsView>,
}

/// `conditions` of an endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct ConditionsView {
    /// `ready`.
    #[serde(default)]
    pub ready: Option<bool>,
    /// `serving`.
    #[serde(default)]
    pub serving: Option<bool>,
}

impl Resource for SliceView {
    const API_VERSION: &'static str = "discovery.k8s.io/v1";
    const GROUP: &'static str = "discovery.k8s.io";
    const KIND: &'static str = "EndpointSlice";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "endpointslices";
    type Scope = NamespaceResourceScope;
}

impl Metadata for SliceView {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl SliceView {
    /// The Service the slice belongs to: [`SliceView::service`], or the label before a trim.
    pub fn service(&self) -> Option<&str> {
        self.service.as_deref().or_else(|| {
            self.metadata
                .labels
                .as_ref()?
                .get(SERVICE_NAME_LABEL)
                .map(String::as_str)
        })
    }
}

/// Drops what a cached object's metadata holds that nothing here reads: all but name,
/// namespace, labels and annotations (the reflector keys its store by namespace and name; the
/// watch keeps its own resourceVersion).
pub fn trim_cached_meta(meta: &mut ObjectMeta) {
    meta.creation_timestamp = None;
    meta.deletion_grace_period_seconds = None;
    meta.deletion_timestamp = None;
    meta.finalizers = None;
    meta.generate_name = None;
    meta.generation = None;
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.resource_version = None;
    meta.uid = None;
}

/// Trims a cached Service: only the `allow-shared-ip` annotations stay (labels stay for
/// `serviceSelectors`; the uid for the Events about the Service, which `kubectl describe`
/// selects by it). Idempotent; the snapshot reads the same before and after.
pub fn trim_service(svc: &mut ServiceView) {
    let uid = svc.metadata.uid.take();
    trim_cached_meta(&mut svc.metadata);
    svc.metadata.uid = uid;
    if let Some(annotations) = svc.metadata.annotations.as_mut() {
        annotations.retain(|k, _| ALLOW_SHARED_IP.contains(&k.as_str()));
        if annotations.is_empty() {
            svc.metadata.annotations = None;
        }
    }
}

/// Trims a cached EndpointSlice: its Service moves from the labels into
/// [`SliceView::service`], and the labels and annotations go. Idempotent; the snapshot reads
/// the same before and after.
pub fn trim_slice(slice: &mut SliceView) {
    trim_cached_meta(&mut slice.metadata);
    if let Some(mut labels) = slice.metadata.labels.take()
        && let Some(service) = labels.remove(SERVICE_NAME_LABEL)
    {
        slice.service = Some(service);
    }
    slice.metadata.annotations = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_slice_the_endpointslice_controller_writes_for_a_service_without_pods_reads_as_empty() {
        // As kube-controller-manager v1.37 writes it: `endpoints` and `ports` are null.
        let slice: SliceView = serde_json::from_value(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "local-lh6ls", "namespace": "default",
                "labels": {"kubernetes.io/service-name": "local"}},
            "addressType": "IPv4", "endpoints": null, "ports": null
        }))
        .expect("a slice with null endpoints");
        assert!(slice.endpoints.is_empty());
        let absent: SliceView = serde_json::from_value(json!({
            "metadata": {"name": "s", "namespace": "default"}, "addressType": "IPv4"
        }))
        .expect("a slice without endpoints");
        assert!(absent.endpoints.is_empty());
    }

    #[test]
    fn views_read_only_what_the_snapshot_needs_from_the_api_servers_json() {
        let mut svc: ServiceView = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u", "resourceVersion": "7",
                "labels": {"app": "web"},
                "annotations": {"metallb.io/allow-shared-ip": "k", "team": "a",
                    "kubectl.kubernetes.io/last-applied-configuration": "{}"},
                "managedFields": [{"manager": "kubectl"}]},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80}], "selector": {"app": "web"},
                "externalTrafficPolicy": "Local", "clusterIP": "192.0.2.1"},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.1", "ipMode": "VIP"}]}}
        }))
        .unwrap();
        trim_service(&mut svc);
        assert_eq!(svc.metadata.uid.as_deref(), Some("u"), "for the Events");
        assert_eq!(svc.metadata.resource_version, None);
        assert_eq!(svc.metadata.managed_fields, None);
        assert_eq!(
            svc.metadata
                .annotations
                .as_ref()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            ["metallb.io/allow-shared-ip"]
        );
        let spec = svc.spec.as_ref().unwrap();
        assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
        assert_eq!(spec.external_traffic_policy.as_deref(), Some("Local"));
        let ingress = svc.status.as_ref().unwrap().load_balancer.as_ref().unwrap();
        assert_eq!(
            ingress.ingress.as_ref().unwrap()[0].ip.as_deref(),
            Some("198.51.100.1")
        );

        let mut slice: SliceView = serde_json::from_value(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-x", "namespace": "shop",
                "labels": {"kubernetes.io/service-name": "web", "endpointslice.kubernetes.io/managed-by": "x"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.1"], "nodeName": "a", "zone": "z",
                "targetRef": {"kind": "Pod", "name": "p"},
                "conditions": {"ready": false, "serving": true, "terminating": true}}],
            "ports": [{"port": 8080}]
        }))
        .unwrap();
        assert_eq!(slice.service(), Some("web"), "from the label");
        trim_slice(&mut slice);
        assert_eq!(slice.service(), Some("web"), "moved out of the labels");
        assert_eq!(slice.metadata.labels, None);
        let trimmed = slice.clone();
        trim_slice(&mut slice);
        assert_eq!(slice, trimmed, "idempotent");
        assert_eq!(slice.endpoints[0].node_name.as_deref(), Some("a"));
        assert_eq!(
            slice.endpoints[0].conditions,
            Some(ConditionsView {
                ready: Some(false),
                serving: Some(true)
            })
        );
    }
}
