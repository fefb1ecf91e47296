//! The watches of the Kubernetes mode: one reflector store per resource, each object trimmed to
//! what the speaker reads, and a [`Change`] for every event, stamped with the moment it arrived.
//!
//! Watched: Services, EndpointSlices and Nodes of the cluster; `IPAddressPool`s,
//! `L2Advertisement`s and the speaker Pods (by label selector) in the speaker's namespace. A
//! watch that fails is counted (`swimlb_kubernetes_watch_errors_total{resource}`), logged and
//! retried with kube's backoff; the store keeps its objects meanwhile. Each [`Change`] names
//! the object it is about, so the loop settles only what that object touches; a re-list
//! ([`What::Resync`]) replaces a whole store and asks for everything to be looked at again.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource as _};
use swimlb_config::crd::{IPAddressPool, L2Advertisement};
use swimlb_config::reflect::{Seen, spawn_store_observed};
use swimlb_config::service::ServiceKey;
use tokio::time::Instant;

use super::metrics::{KubeMetrics, Resource};
use super::snapshot::{Caches, Keeper, trim_node};
use super::views::{ServiceView, SliceView, trim_service, trim_slice};

/// One watch event as the loop hears of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// When the event came out of the watch (already in the store).
    pub at: Instant,
    /// The resource watched.
    pub resource: Resource,
    /// What it is about.
    pub what: What,
}

/// What a [`Change`] is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum What {
    /// One object was added, changed or deleted: `namespace/name` (no namespace for a Node).
    Object {
        /// Its namespace (empty for cluster-scoped objects).
        namespace: String,
        /// Its name.
        name: String,
    },
    /// The watch listed again (the start, or after an outage): the store was replaced.
    Resync,
}

/// The reflector stores the snapshot is built from.
#[derive(Debug)]
pub struct Stores {
    services: Store<ServiceView>,
    slices: Store<SliceView>,
    nodes: Store<Node>,
    pools: Store<IPAddressPool>,
    advertisements: Store<L2Advertisement>,
    pods: Store<Pod>,
}

/// The watch's error, for [`Stores::ready`].
#[derive(Debug, thiserror::Error)]
#[error("the {0} watch stopped before its first list")]
pub struct NeverListed(pub &'static str);

impl Stores {
    /// Starts every watch. Returns the stores and the stream of their changes.
    pub fn spawn(
        client: &Client,
        namespace: &str,
        speaker_selector: &str,
        metrics: &KubeMetrics,
    ) -> (Stores, UnboundedReceiver<Change>) {
        let (tx, rx) = unbounded();
        let all = watcher::Config::default;
        let stores = Stores {
            services: spawn(
                Api::all(client.clone()),
                all(),
                trim_service,
                Resource::Services,
                &tx,
                metrics,
            ),
            slices: spawn(
                Api::all(client.clone()),
                all(),
                trim_slice,
                Resource::EndpointSlices,
                &tx,
                metrics,
            ),
            nodes: spawn(
                Api::all(client.clone()),
                all(),
                trim_node,
                Resource::Nodes,
                &tx,
                metrics,
            ),
            pools: spawn(
                Api::namespaced(client.clone(), namespace),
                all(),
                |_| {},
                Resource::IpAddressPools,
                &tx,
                metrics,
            ),
            advertisements: spawn(
                Api::namespaced(client.clone(), namespace),
                all(),
                |_| {},
                Resource::L2Advertisements,
                &tx,
                metrics,
            ),
            pods: spawn(
                Api::namespaced(client.clone(), namespace),
                all().labels(speaker_selector),
                trim_pod,
                Resource::Pods,
                &tx,
                metrics,
            ),
        };
        (stores, rx)
    }

    /// Waits for every store's first list.
    pub async fn ready(&self) -> Result<(), NeverListed> {
        let fail = |what| move |_| NeverListed(what);
        self.services
            .wait_until_ready()
            .await
            .map_err(fail("Service"))?;
        self.slices
            .wait_until_ready()
            .await
            .map_err(fail("EndpointSlice"))?;
        self.nodes.wait_until_ready().await.map_err(fail("Node"))?;
        self.pools
            .wait_until_ready()
            .await
            .map_err(fail("IPAddressPool"))?;
        self.advertisements
            .wait_until_ready()
            .await
            .map_err(fail("L2Advertisement"))?;
        self.pods.wait_until_ready().await.map_err(fail("Pod"))?;
        Ok(())
    }

    /// Sets every object of the stores into `keeper` ([`Keeper::resync`]).
    pub fn resync(&self, keeper: &mut Keeper) {
        let services = self.services.state();
        let slices = self.slices.state();
        let nodes = self.nodes.state();
        let pools = self.pools.state();
        let advertisements = self.advertisements.state();
        let services: Vec<&ServiceView> = services.iter().map(Arc::as_ref).collect();
        let slices: Vec<&SliceView> = slices.iter().map(Arc::as_ref).collect();
        let nodes: Vec<&Node> = nodes.iter().map(Arc::as_ref).collect();
        let pools: Vec<&IPAddressPool> = pools.iter().map(Arc::as_ref).collect();
        let advertisements: Vec<&L2Advertisement> =
            advertisements.iter().map(Arc::as_ref).collect();
        keeper.resync(Caches {
            services: &services,
            endpoint_slices: &slices,
            nodes: &nodes,
            pools: &pools,
            advertisements: &advertisements,
        });
    }

    /// Sets the pools, advertisements and Nodes into `keeper`; when that changes what the
    /// Services are checked against, sets every Service again.
    pub fn set_config(&self, keeper: &mut Keeper) {
        let nodes = self.nodes.state();
        let pools = self.pools.state();
        let advertisements = self.advertisements.state();
        let nodes: Vec<&Node> = nodes.iter().map(Arc::as_ref).collect();
        let pools: Vec<&IPAddressPool> = pools.iter().map(Arc::as_ref).collect();
        let advertisements: Vec<&L2Advertisement> =
            advertisements.iter().map(Arc::as_ref).collect();
        if keeper.set_config(&pools, &advertisements, &nodes) {
            let mut keys: Vec<ServiceKey> = self
                .services
                .state()
                .iter()
                .map(|s| {
                    ServiceKey::new(
                        s.meta().namespace.clone().unwrap_or_default(),
                        s.meta().name.clone().unwrap_or_default(),
                    )
                })
                .collect();
            keys.extend(keeper.services().cloned());
            keys.sort();
            keys.dedup();
            for key in &keys {
                self.set_service(keeper, key);
            }
        }
    }

    /// Follows the EndpointSlice `namespace/name` to its Service (as the store holds it now):
    /// returns the Services to set again (the one it left, the one it belongs to).
    pub fn slice_moved(&self, keeper: &mut Keeper, namespace: &str, name: &str) -> Vec<ServiceKey> {
        let slice = self.slices.get(&ObjectRef::new(name).within(namespace));
        let service = slice.as_deref().and_then(SliceView::service);
        keeper.index_slice(namespace, name, service)
    }

    /// Sets the Service `key` into `keeper` as the stores hold it and its slices now.
    pub fn set_service(&self, keeper: &mut Keeper, key: &ServiceKey) {
        let service = self
            .services
            .get(&ObjectRef::new(&key.name).within(&key.namespace));
        let slices: Vec<Arc<SliceView>> = keeper
            .slices_of(key)
            .filter_map(|name| {
                self.slices
                    .get(&ObjectRef::new(name).within(&key.namespace))
            })
            .collect();
        let slices: Vec<&SliceView> = slices.iter().map(Arc::as_ref).collect();
        keeper.set_service(key, service.as_deref(), &slices);
    }

    /// The gossip addresses of the speaker Pods that have an IP (a Pod without one yet is
    /// skipped; MetalLB #1533).
    pub fn peers(&self, port: u16) -> Vec<SocketAddr> {
        let mut peers: Vec<SocketAddr> = self
            .pods
            .state()
            .iter()
            .filter_map(|pod| {
                pod.status
                    .as_ref()?
                    .pod_ip
                    .as_deref()?
                    .parse::<IpAddr>()
                    .ok()
            })
            .map(|ip| SocketAddr::new(ip, port))
            .collect();
        peers.sort();
        peers.dedup();
        peers
    }

    /// The `L2Advertisement`s of the speaker's namespace.
    pub fn advertisements(&self) -> Vec<Arc<L2Advertisement>> {
        self.advertisements.state()
    }
}

/// Starts the store of one resource, its changes sent on `tx` and its errors counted.
fn spawn<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: fn(&mut K),
    resource: Resource,
    tx: &UnboundedSender<Change>,
    metrics: &KubeMetrics,
) -> Store<K>
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + Send
        + Sync
        + serde::de::DeserializeOwned
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let tx = tx.clone();
    let metrics = metrics.clone();
    spawn_store_observed(
        api,
        config,
        trim,
        move |seen: Seen<'_, K>| {
            let what = match seen {
                Seen::Error(_) => {
                    metrics.watch_error(resource);
                    return;
                }
                Seen::Event(watcher::Event::Apply(o) | watcher::Event::Delete(o)) => What::Object {
                    namespace: o.meta().namespace.clone().unwrap_or_default(),
                    name: o.meta().name.clone().unwrap_or_default(),
                },
                // The store is replaced only at the end of a list.
                Seen::Event(watcher::Event::Init | watcher::Event::InitApply(_)) => return,
                Seen::Event(watcher::Event::InitDone) => What::Resync,
            };
            let _ = tx.unbounded_send(Change {
                at: Instant::now(),
                resource,
                what,
            });
        },
        std::future::pending::<()>(),
    )
}

/// Trims a cached speaker Pod to its IP (the only field read: [`Stores::peers`]).
pub fn trim_pod(pod: &mut Pod) {
    let meta = &mut pod.metadata;
    meta.annotations = None;
    meta.labels = None;
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.resource_version = None;
    meta.uid = None;
    pod.spec = None;
    pod.status =
        pod.status
            .take()
            .and_then(|s| s.pod_ip)
            .map(|ip| k8s_openapi::api::core::v1::PodStatus {
                pod_ip: Some(ip),
                ..Default::default()
            });
}
