//! The caches of Services and EndpointSlices, kept compact: the objects a speaker holds most
//! of (10,000 of each in a large cluster) as boxed strings and interned node names, not as
//! `ObjectMeta`-carrying views in a reflector store.
//!
//! A trimmed [`ServiceView`] still carries an `ObjectMeta` (15 optional fields) and its labels
//! in a `BTreeMap` (a 500-byte node for two labels), and kube's store adds an `Arc` and an
//! `ObjectRef` key per object: about 21 MB for 10,000 Services and their slices. A
//! [`CompactService`] or [`CompactSlice`] keeps the same facts in a fraction of that and gives
//! the view back on demand ([`Compact::view`]), so the snapshot code reads exactly what it
//! read from the reflector (a unit test checks the round trip).
//!
//! [`spawn`] keeps a [`CompactStore`] from a watch as kube's reflector does: a re-list is
//! collected aside and replaces the store at its end, so a reader never sees half a list;
//! every event is shown to an observer once the store has it; a failed watch is retried with
//! [`RetryBackoff`] and the store keeps its objects meanwhile.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::StreamExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::{WatchStreamExt as _, watcher};
use smol_str::SmolStr;
use swimlb_config::reflect::{Relists, RetryBackoff};
use swimlb_config::service::ServiceKey;
use tokio::sync::watch as signal;

use super::views::{
    ConditionsView, EndpointView, IngressView, LoadBalancerView, ServiceSpecView,
    ServiceStatusView, ServiceView, SliceView,
};

/// An object kept compact, and the view the snapshot reads given back.
pub trait Compact: Sized + Send + 'static {
    /// The watched type (deserialized from the API server's JSON, then compacted).
    type View: kube::Resource<DynamicType = ()>
        + serde::de::DeserializeOwned
        + Clone
        + std::fmt::Debug
        + Send
        + 'static;

    /// Keeps what the snapshot reads of `view` (already trimmed); node names are interned in
    /// `names`.
    fn compact(view: Self::View, names: &mut Interner) -> Self;

    /// The view again, as it was given to [`Compact::compact`] (name and namespace from the
    /// store's key).
    fn view(&self, key: &ServiceKey) -> Self::View;
}

/// Node names shared between the endpoints that name the same node (a cluster has hundreds of
/// nodes and tens of thousands of endpoints).
#[derive(Debug, Default)]
pub struct Interner {
    names: HashSet<Arc<str>>,
}

impl Interner {
    /// `name`, shared.
    pub fn get(&mut self, name: &str) -> Arc<str> {
        if let Some(shared) = self.names.get(name) {
            return shared.clone();
        }
        let shared: Arc<str> = Arc::from(name);
        self.names.insert(shared.clone());
        shared
    }

    /// `text` as a `SmolStr`: inline when short, else shared with every other holder of the
    /// same text (label keys such as `kubernetes.io/service-name` are on every slice).
    pub fn text(&mut self, text: &str) -> SmolStr {
        if text.len() <= INLINE {
            SmolStr::new(text)
        } else {
            SmolStr::from(self.get(text))
        }
    }

    /// Forgets the names no endpoint holds any more (a node renamed or gone).
    fn sweep(&mut self) {
        self.names.retain(|name| Arc::strong_count(name) > 1);
    }
}

/// The longest text a `SmolStr` holds without allocating.
const INLINE: usize = 23;

/// String pairs (labels, annotations) as one boxed slice; `None` and an empty map differ, as
/// they do in the view.
type Pairs = Option<Box<[(SmolStr, SmolStr)]>>;

fn pairs(map: Option<BTreeMap<String, String>>, names: &mut Interner) -> Pairs {
    map.map(|m| {
        m.iter()
            .map(|(k, v)| (names.text(k), names.text(v)))
            .collect()
    })
}

fn map(pairs: &Pairs) -> Option<BTreeMap<String, String>> {
    pairs.as_ref().map(|p| {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    })
}

fn meta(key: &ServiceKey, labels: &Pairs, annotations: &Pairs) -> ObjectMeta {
    ObjectMeta {
        name: Some(key.name.to_string()),
        namespace: Some(key.namespace.to_string()),
        labels: map(labels),
        annotations: map(annotations),
        ..ObjectMeta::default()
    }
}

/// A Service's uid: the 16 bytes of the UUID the API server gives every object, or (a uid in
/// another form, which the API allows) its text. 24 bytes in a [`CompactService`] (120 to 144),
/// nothing on the heap for a UUID; a `SmolStr` would add a 64-byte allocation (36 characters do
/// not fit inline).
#[derive(Debug, Clone, PartialEq)]
enum Uid {
    Uuid([u8; 16]),
    Other(Box<str>),
}

/// Where a UUID's text has its hyphens.
const UUID_HYPHENS: [usize; 4] = [8, 13, 18, 23];

impl Uid {
    /// `text` kept so that [`Uid::text`] gives it back exactly (only a lowercase UUID is packed).
    fn new(text: &str) -> Uid {
        Uid::parse(text).map_or_else(|| Uid::Other(text.into()), Uid::Uuid)
    }

    fn parse(text: &str) -> Option<[u8; 16]> {
        let text = text.as_bytes();
        if text.len() != 36 || UUID_HYPHENS.iter().any(|&i| text[i] != b'-') {
            return None;
        }
        let nibble = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let mut digits = text.iter().filter(|&&c| c != b'-');
        let mut bytes = [0u8; 16];
        for byte in &mut bytes {
            let (hi, lo) = (*digits.next()?, *digits.next()?);
            *byte = nibble(hi)? << 4 | nibble(lo)?;
        }
        Some(bytes)
    }

    fn text(&self) -> String {
        match self {
            Uid::Uuid(bytes) => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let mut text = String::with_capacity(36);
                for byte in bytes {
                    if UUID_HYPHENS.contains(&text.len()) {
                        text.push('-');
                    }
                    text.push(char::from(HEX[usize::from(byte >> 4)]));
                    text.push(char::from(HEX[usize::from(byte & 0xf)]));
                }
                text
            }
            Uid::Other(text) => text.to_string(),
        }
    }
}

/// A Service as the speaker keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct CompactService {
    /// `metadata.uid`, for the Events about the Service.
    uid: Option<Uid>,
    labels: Pairs,
    annotations: Pairs,
    spec: Option<CompactSpec>,
    /// `status.loadBalancer.ingress[].ip`, entry by entry (an entry without an IP is kept: the
    /// snapshot counts it as invalid).
    ingress: Option<Box<[Option<SmolStr>]>>,
}

/// [`ServiceSpecView`] in `SmolStr`s (`LoadBalancer`, `Cluster` and `Local` are inline).
#[derive(Debug, Clone, PartialEq)]
struct CompactSpec {
    type_: Option<SmolStr>,
    load_balancer_class: Option<SmolStr>,
    external_traffic_policy: Option<SmolStr>,
}

impl Compact for CompactService {
    type View = ServiceView;

    fn compact(view: ServiceView, names: &mut Interner) -> CompactService {
        let ingress = view
            .status
            .and_then(|s| s.load_balancer)
            .and_then(|lb| lb.ingress)
            .map(|entries| {
                entries
                    .into_iter()
                    .map(|e| e.ip.as_deref().map(SmolStr::new))
                    .collect()
            });
        let mut text = |t: Option<String>| t.as_deref().map(|t| names.text(t));
        let spec = view.spec.map(|spec| CompactSpec {
            type_: text(spec.type_),
            load_balancer_class: text(spec.load_balancer_class),
            external_traffic_policy: text(spec.external_traffic_policy),
        });
        CompactService {
            uid: view.metadata.uid.as_deref().map(Uid::new),
            labels: pairs(view.metadata.labels, names),
            annotations: pairs(view.metadata.annotations, names),
            spec,
            ingress,
        }
    }

    fn view(&self, key: &ServiceKey) -> ServiceView {
        ServiceView {
            metadata: ObjectMeta {
                uid: self.uid(),
                ..meta(key, &self.labels, &self.annotations)
            },
            spec: self.spec.as_ref().map(|spec| ServiceSpecView {
                type_: spec.type_.as_ref().map(SmolStr::to_string),
                load_balancer_class: spec.load_balancer_class.as_ref().map(SmolStr::to_string),
                external_traffic_policy: spec
                    .external_traffic_policy
                    .as_ref()
                    .map(SmolStr::to_string),
            }),
            status: self.ingress.as_ref().map(|entries| ServiceStatusView {
                load_balancer: Some(LoadBalancerView {
                    ingress: Some(
                        entries
                            .iter()
                            .map(|ip| IngressView {
                                ip: ip.as_ref().map(SmolStr::to_string),
                            })
                            .collect(),
                    ),
                }),
            }),
        }
    }
}

impl CompactService {
    /// The Service's `metadata.uid`.
    pub fn uid(&self) -> Option<String> {
        self.uid.as_ref().map(Uid::text)
    }
}

/// One endpoint of a [`CompactSlice`].
#[derive(Debug, Clone, PartialEq)]
struct CompactEndpoint {
    node: Option<Arc<str>>,
    conditions: Option<ConditionsView>,
}

/// An EndpointSlice as the speaker keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct CompactSlice {
    service: Option<SmolStr>,
    labels: Pairs,
    annotations: Pairs,
    endpoints: Box<[CompactEndpoint]>,
}

impl CompactSlice {
    /// The Service the slice belongs to ([`SliceView::service`]).
    pub fn service(&self) -> Option<&str> {
        self.service.as_deref()
    }
}

impl Compact for CompactSlice {
    type View = SliceView;

    fn compact(view: SliceView, names: &mut Interner) -> CompactSlice {
        let service = view.service().map(|s| names.text(s));
        CompactSlice {
            service,
            labels: pairs(view.metadata.labels, names),
            annotations: pairs(view.metadata.annotations, names),
            endpoints: view
                .endpoints
                .into_iter()
                .map(|e| CompactEndpoint {
                    node: e.node_name.as_deref().map(|n| names.get(n)),
                    conditions: e.conditions,
                })
                .collect(),
        }
    }

    fn view(&self, key: &ServiceKey) -> SliceView {
        SliceView {
            metadata: meta(key, &self.labels, &self.annotations),
            endpoints: self
                .endpoints
                .iter()
                .map(|e| EndpointView {
                    node_name: e.node.as_deref().map(str::to_string),
                    conditions: e.conditions,
                })
                .collect(),
            service: self.service.as_ref().map(SmolStr::to_string),
        }
    }
}

/// The objects of one resource by `namespace/name`, and a re-list being collected.
#[derive(Debug)]
pub struct Objects<C> {
    objects: HashMap<ServiceKey, C>,
    relist: Option<HashMap<ServiceKey, C>>,
    names: Interner,
}

impl<C: Compact> Objects<C> {
    fn new() -> Objects<C> {
        Objects {
            objects: HashMap::new(),
            relist: None,
            names: Interner::default(),
        }
    }

    /// The object `key`.
    pub fn get(&self, key: &ServiceKey) -> Option<&C> {
        self.objects.get(key)
    }

    /// Every object.
    pub fn iter(&self) -> impl Iterator<Item = (&ServiceKey, &C)> {
        self.objects.iter()
    }

    /// How many objects.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Applies one watch event (the object already trimmed).
    fn apply(&mut self, event: watcher::Event<C::View>) {
        match event {
            watcher::Event::Apply(o) => {
                let key = key(&o);
                let compact = C::compact(o, &mut self.names);
                self.objects.insert(key, compact);
            }
            watcher::Event::Delete(o) => {
                self.objects.remove(&key(&o));
            }
            watcher::Event::Init => self.relist = Some(HashMap::new()),
            watcher::Event::InitApply(o) => {
                let key = key(&o);
                let compact = C::compact(o, &mut self.names);
                self.relist
                    .get_or_insert_with(HashMap::new)
                    .insert(key, compact);
            }
            watcher::Event::InitDone => {
                let mut listed = self.relist.take().unwrap_or_default();
                listed.shrink_to_fit();
                self.objects = listed;
                self.names.sweep();
            }
        }
    }
}

fn key<K: kube::Resource>(o: &K) -> ServiceKey {
    let meta = o.meta();
    ServiceKey::new(
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// A compact store kept by a background task ([`spawn`]).
#[derive(Debug)]
pub struct CompactStore<C> {
    objects: Arc<Mutex<Objects<C>>>,
    listed: signal::Receiver<bool>,
}

impl<C> Clone for CompactStore<C> {
    fn clone(&self) -> Self {
        CompactStore {
            objects: self.objects.clone(),
            listed: self.listed.clone(),
        }
    }
}

impl<C: Compact> CompactStore<C> {
    /// The objects, locked (briefly: the watch task waits meanwhile).
    pub fn lock(&self) -> MutexGuard<'_, Objects<C>> {
        // A panic while the lock was held leaves the map as it was between two events.
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The view of `key`, if the store has it.
    pub fn get(&self, key: &ServiceKey) -> Option<C::View> {
        self.lock().get(key).map(|c| c.view(key))
    }

    /// Waits for the first complete list; `Err` if the task ended before it.
    pub async fn wait_until_ready(&self) -> Result<(), ()> {
        let mut listed = self.listed.clone();
        listed.wait_for(|l| *l).await.map(|_| ()).map_err(|_| ())
    }
}

/// What a compact store's task shows its observer, once the store has it.
#[derive(Debug)]
pub enum Observed<'a> {
    /// The object `namespace/name` was added, changed or deleted.
    Object(&'a ServiceKey),
    /// A list ended: the store was replaced.
    Listed,
    /// The watch failed (logged, retried with backoff).
    Error(&'a watcher::Error),
}

/// Keeps a compact store of `api`'s objects, each trimmed by `trim` (after
/// [`trim_meta`](swimlb_config::reflect::trim_meta)), until the watch stream ends; `observe`
/// hears of every event once it is in the store, and of every error. `observe` runs on the
/// store's task: it must not block. When `relists` asks, the watch starts over: the store keeps
/// its objects until the new list ends.
pub fn spawn<C, F>(
    api: Api<C::View>,
    config: watcher::Config,
    trim: fn(&mut C::View),
    mut observe: F,
    mut relists: Relists,
) -> CompactStore<C>
where
    C: Compact,
    F: FnMut(Observed<'_>) + Send + 'static,
{
    let objects = Arc::new(Mutex::new(Objects::new()));
    let (listed_tx, listed) = signal::channel(false);
    let store = CompactStore { objects, listed };
    let task = store.clone();
    let watch = move || Box::pin(watcher(api.clone(), config.clone()).backoff(RetryBackoff::new()));
    tokio::spawn(async move {
        let mut stream = watch();
        loop {
            let event = tokio::select! {
                () = relists.asked() => {
                    tracing::debug!("the watch starts over");
                    stream = watch();
                    continue;
                }
                event = stream.next() => event,
            };
            let mut event = match event {
                None => return,
                Some(Ok(event)) => event,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "watch failed; retrying");
                    observe(Observed::Error(&e));
                    continue;
                }
            };
            let object = match &mut event {
                watcher::Event::Apply(o)
                | watcher::Event::Delete(o)
                | watcher::Event::InitApply(o) => {
                    swimlb_config::reflect::trim_meta(kube::Resource::meta_mut(o));
                    trim(o);
                    Some(key(o))
                }
                watcher::Event::Init | watcher::Event::InitDone => None,
            };
            let done = matches!(event, watcher::Event::InitDone);
            let relisting = matches!(event, watcher::Event::InitApply(_));
            task.lock().apply(event);
            if done {
                listed_tx.send_replace(true);
                observe(Observed::Listed);
            } else if let (Some(object), false) = (&object, relisting) {
                observe(Observed::Object(object));
            }
        }
    });
    store
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::sources::kubernetes::views::{trim_service, trim_slice};
    use serde_json::json;

    #[test]
    fn a_compact_service_gives_back_the_view_it_was_made_from() {
        let mut names = Interner::default();
        for value in [
            json!({"metadata": {"name": "web", "namespace": "shop",
                    "uid": "0f9c2b7e-4d1a-4e8b-9a3c-5b6d7e8f9a0b",
                    "labels": {"app": "web", "tier": "front"},
                    "annotations": {"metallb.io/allow-shared-ip": "k"}},
                "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                    "loadBalancerClass": "swimlb.io/l2"},
                "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}, {"hostname": "h"}]}}}),
            json!({"metadata": {"name": "bare", "namespace": "shop"}}),
            // A uid that is not a lowercase UUID is kept as it came.
            json!({"metadata": {"name": "upper", "namespace": "shop",
                "uid": "0F9C2B7E-4D1A-4E8B-9A3C-5B6D7E8F9A0B"}}),
            json!({"metadata": {"name": "other", "namespace": "shop", "uid": "u-1"}}),
            json!({"metadata": {"name": "empty", "namespace": "shop", "labels": {}},
                "spec": {"type": "ClusterIP"}, "status": {"loadBalancer": {"ingress": []}}}),
        ] {
            let mut view: ServiceView = serde_json::from_value(value).unwrap();
            trim_service(&mut view);
            let key = ServiceKey::new("shop", view.metadata.name.clone().unwrap());
            let compact = CompactService::compact(view.clone(), &mut names);
            let back = compact.view(&key);
            assert_eq!(back.metadata, view.metadata);
            assert_eq!(compact.uid(), view.metadata.uid, "{key}");
            if key.name == "web" {
                assert!(matches!(compact.uid, Some(Uid::Uuid(_))), "packed");
            }
            assert_eq!(back.spec, view.spec);
            // A status without ingress entries reads as none at all, as the snapshot reads it.
            let ingress = |v: &ServiceView| {
                v.status
                    .as_ref()
                    .and_then(|s| s.load_balancer.as_ref())
                    .and_then(|lb| lb.ingress.clone())
            };
            assert_eq!(ingress(&back), ingress(&view), "{key}");
        }
    }

    #[test]
    fn a_services_uid_costs_24_bytes_at_most_and_nothing_on_the_heap_for_a_uuid() {
        assert!(
            size_of::<Option<Uid>>() <= 24,
            "{}",
            size_of::<Option<Uid>>()
        );
        let uuid = "0f9c2b7e-4d1a-4e8b-9a3c-5b6d7e8f9a0b";
        assert_eq!(Uid::new(uuid), Uid::Uuid(Uid::parse(uuid).expect("a UUID")));
        assert_eq!(Uid::new(uuid).text(), uuid);
        for other in [
            "",
            "0f9c2b7e4d1a4e8b9a3c5b6d7e8f9a0b",
            "0f9c2b7e-4d1a-4e8b-9a3c-5b6d7e8f9a0g",
        ] {
            assert_eq!(Uid::new(other), Uid::Other(other.into()), "{other:?}");
        }
    }

    #[test]
    fn a_compact_slice_gives_back_its_view_and_shares_node_names() {
        let mut names = Interner::default();
        let slice = |name: &str, ready: bool| {
            let mut view: SliceView = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "shop",
                    "labels": {"kubernetes.io/service-name": "web"}},
                "endpoints": [
                    {"nodeName": "node-a", "conditions": {"ready": ready, "serving": true}},
                    {"nodeName": "node-b"},
                    {"conditions": {"ready": true}}]
            }))
            .unwrap();
            trim_slice(&mut view);
            view
        };
        let a = slice("web-1", false);
        let b = slice("web-2", true);
        let ca = CompactSlice::compact(a.clone(), &mut names);
        let cb = CompactSlice::compact(b.clone(), &mut names);
        assert_eq!(ca.view(&ServiceKey::new("shop", "web-1")), a);
        assert_eq!(cb.view(&ServiceKey::new("shop", "web-2")), b);
        assert_eq!(ca.service(), Some("web"));
        let (na, nb) = (
            ca.endpoints[0].node.as_ref().unwrap(),
            cb.endpoints[0].node.as_ref().unwrap(),
        );
        assert!(Arc::ptr_eq(na, nb), "one node-a for both slices");
        assert_eq!(names.names.len(), 2);
        drop((ca, cb));
        names.sweep();
        assert!(names.names.is_empty(), "names nobody holds are forgotten");
    }

    #[test]
    fn a_relist_replaces_the_store_only_at_its_end() {
        let svc = |name: &str| -> ServiceView {
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "shop"}}))
                .unwrap()
        };
        let mut objects: Objects<CompactService> = Objects::new();
        objects.apply(watcher::Event::Apply(svc("old")));
        objects.apply(watcher::Event::Init);
        objects.apply(watcher::Event::InitApply(svc("new")));
        assert!(objects.get(&ServiceKey::new("shop", "old")).is_some());
        assert!(objects.get(&ServiceKey::new("shop", "new")).is_none());
        objects.apply(watcher::Event::InitDone);
        assert!(objects.get(&ServiceKey::new("shop", "old")).is_none());
        assert!(objects.get(&ServiceKey::new("shop", "new")).is_some());
        objects.apply(watcher::Event::Delete(svc("new")));
        assert!(objects.is_empty());
    }
}
