//! The watches of the Kubernetes mode: one store per resource, each object trimmed to what the
//! speaker reads (Services and EndpointSlices, the bulk, in [`compact`](super::compact) stores;
//! the others in kube's reflector stores), and a [`Change`] for every event, stamped with the
//! moment it arrived.
//!
//! Watched: Services, EndpointSlices and Nodes of the cluster; `IPAddressPool`s,
//! `L2Advertisement`s and the speaker Pods (by label selector) in the speaker's namespace. A
//! watch that fails is counted (`swimlb_kubernetes_watch_errors_total{resource}`), logged and
//! retried with [`RetryBackoff`](swimlb_config::reflect::RetryBackoff) (at most 5 s apart); the
//! store keeps its objects meanwhile. Each [`Change`] names the object it is about, so the loop
//! settles only what that object touches; a re-list ([`What::Resync`]) replaces a whole store
//! and asks for everything to be looked at again. Every watch starts over when the loop asks
//! (a link's carrier came back, see [`Relister`](swimlb_config::reflect::Relister)).

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::Api;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use swimlb_config::crd::{IPAddressPool, L2Advertisement};
use swimlb_config::reflect::{Relists, Seen, spawn_store_observed};
use swimlb_config::service::ServiceKey;
use tokio::time::Instant;

use super::compact::{self, Compact, CompactService, CompactSlice, CompactStore, Observed};
use super::metrics::{KubeMetrics, Resource};
use super::snapshot::{Keeper, trim_node};
use super::views::{SliceView, trim_service, trim_slice};

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

pub use swimlb_config::reflect::{READ_TIMEOUT, WATCH_TIMEOUT_S, watch_config};

/// The reflector stores the snapshot is built from.
#[derive(Debug)]
pub struct Stores {
    services: CompactStore<CompactService>,
    slices: CompactStore<CompactSlice>,
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
    /// Starts every watch, each starting over when `relists` asks. Returns the stores and the
    /// stream of their changes.
    pub fn spawn(
        client: &Client,
        namespace: &str,
        speaker_selector: &str,
        metrics: &KubeMetrics,
        relists: &Relists,
    ) -> (Stores, UnboundedReceiver<Change>) {
        let (tx, rx) = unbounded();
        let all = watch_config;
        let stores = Stores {
            services: spawn_compact(
                Api::all(client.clone()),
                trim_service,
                Resource::Services,
                &tx,
                metrics,
                relists,
            ),
            slices: spawn_compact(
                Api::all(client.clone()),
                trim_slice,
                Resource::EndpointSlices,
                &tx,
                metrics,
                relists,
            ),
            nodes: spawn(
                Api::all(client.clone()),
                all(),
                trim_node,
                Resource::Nodes,
                &tx,
                metrics,
                relists,
            ),
            pools: spawn(
                Api::namespaced(client.clone(), namespace),
                all(),
                |_| {},
                Resource::IpAddressPools,
                &tx,
                metrics,
                relists,
            ),
            advertisements: spawn(
                Api::namespaced(client.clone(), namespace),
                all(),
                |_| {},
                Resource::L2Advertisements,
                &tx,
                metrics,
                relists,
            ),
            pods: spawn(
                Api::namespaced(client.clone(), namespace),
                all().labels(speaker_selector),
                trim_pod,
                Resource::Pods,
                &tx,
                metrics,
                relists,
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
            .map_err(|()| NeverListed("Service"))?;
        self.slices
            .wait_until_ready()
            .await
            .map_err(|()| NeverListed("EndpointSlice"))?;
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

    /// Sets every object of the stores into `keeper`, as [`Keeper::resync`] does, one Service
    /// at a time (its view made again from the compact store only while it is set).
    pub fn resync(&self, keeper: &mut Keeper) {
        self.set_config_only(keeper);
        {
            let slices = self.slices.lock();
            keeper.reindex_slices(
                slices.iter().map(|(key, slice)| {
                    (key.namespace.as_str(), key.name.as_str(), slice.service())
                }),
            );
        }
        let keys = self.service_keys();
        keeper.forget_services_but(&keys.iter().collect::<BTreeSet<_>>());
        for key in &keys {
            self.set_service(keeper, key);
        }
    }

    /// The Services in the store, in key order.
    fn service_keys(&self) -> Vec<ServiceKey> {
        let mut keys: Vec<ServiceKey> = self
            .services
            .lock()
            .iter()
            .map(|(key, _)| key.clone())
            .collect();
        keys.sort();
        keys
    }

    /// Sets the pools, advertisements and Nodes into `keeper`; whether that changed what the
    /// Services are checked against.
    fn set_config_only(&self, keeper: &mut Keeper) -> bool {
        let nodes = self.nodes.state();
        let pools = self.pools.state();
        let advertisements = self.advertisements.state();
        let nodes: Vec<&Node> = nodes.iter().map(Arc::as_ref).collect();
        let pools: Vec<&IPAddressPool> = pools.iter().map(Arc::as_ref).collect();
        let advertisements: Vec<&L2Advertisement> =
            advertisements.iter().map(Arc::as_ref).collect();
        keeper.set_config(&pools, &advertisements, &nodes)
    }

    /// Sets the pools, advertisements and Nodes into `keeper`; when that changes what the
    /// Services are checked against, sets every Service again.
    pub fn set_config(&self, keeper: &mut Keeper) {
        if self.set_config_only(keeper) {
            let mut keys = self.service_keys();
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
        let key = ServiceKey::new(namespace, name);
        let slices = self.slices.lock();
        let service = slices.get(&key).and_then(CompactSlice::service);
        keeper.index_slice(namespace, name, service)
    }

    /// Sets the Service `key` into `keeper` as the stores hold it and its slices now.
    pub fn set_service(&self, keeper: &mut Keeper, key: &ServiceKey) {
        let service = self.services.get(key);
        let slices: Vec<SliceView> = {
            let store = self.slices.lock();
            keeper
                .slices_of(key)
                .filter_map(|name| {
                    let slice = ServiceKey::new(key.namespace.clone(), name);
                    store.get(&slice).map(|s| s.view(&slice))
                })
                .collect()
        };
        let slices: Vec<&SliceView> = slices.iter().collect();
        keeper.set_service(key, service.as_ref(), &slices);
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

    /// How many speakers the start-up hold waits for: the nodes the speaker Pods are bound to
    /// (see [`speaker_nodes`]).
    pub fn speaker_nodes(&self) -> usize {
        speaker_nodes(&self.pods.state())
    }

    /// The Services' store (the records task reads their uids from it).
    pub fn services(&self) -> CompactStore<CompactService> {
        self.services.clone()
    }

    /// The `L2Advertisement`s of the speaker's namespace.
    pub fn advertisements(&self) -> Vec<Arc<L2Advertisement>> {
        self.advertisements.state()
    }
}

/// Starts the compact store of one resource, its changes sent on `tx` and its errors counted.
fn spawn_compact<C: Compact>(
    api: Api<C::View>,
    trim: fn(&mut C::View),
    resource: Resource,
    tx: &UnboundedSender<Change>,
    metrics: &KubeMetrics,
    relists: &Relists,
) -> CompactStore<C> {
    let tx = tx.clone();
    let metrics = metrics.clone();
    let observe = move |seen: Observed<'_>| {
        let what = match seen {
            Observed::Error(_) => {
                metrics.watch_error(resource);
                return;
            }
            Observed::Object(key) => What::Object {
                namespace: key.namespace.to_string(),
                name: key.name.to_string(),
            },
            Observed::Listed => What::Resync,
        };
        let _ = tx.unbounded_send(Change {
            at: Instant::now(),
            resource,
            what,
        });
    };
    compact::spawn(api, watch_config(), trim, observe, relists.clone())
}

/// Starts the store of one resource, its changes sent on `tx` and its errors counted.
fn spawn<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: fn(&mut K),
    resource: Resource,
    tx: &UnboundedSender<Change>,
    metrics: &KubeMetrics,
    relists: &Relists,
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
        relists.clone(),
        std::future::pending::<()>(),
    )
}

/// The speakers that exist: the distinct nodes the speaker Pods are bound to, a Pod with an IP
/// but no node counted on its own. A Pod bound to its node but not started yet (no IP: a slow
/// image pull, a kubelet that has not synced) counts, so that a speaker that starts first
/// waits for it (within the hold's grace) instead of answering for its IPs alone; a
/// terminating Pod and its replacement on one node count once.
pub fn speaker_nodes(pods: &[Arc<Pod>]) -> usize {
    let mut nodes: BTreeSet<&str> = BTreeSet::new();
    let mut unbound = 0;
    for pod in pods {
        match pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            Some(node) => {
                nodes.insert(node);
            }
            None if pod
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.as_ref())
                .is_some() =>
            {
                unbound += 1
            }
            None => {}
        }
    }
    nodes.len() + unbound
}

/// Trims a cached speaker Pod to its IP and its node (the only fields read: [`Stores::peers`],
/// [`speaker_nodes`]).
pub fn trim_pod(pod: &mut Pod) {
    let meta = &mut pod.metadata;
    meta.annotations = None;
    meta.labels = None;
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.resource_version = None;
    meta.uid = None;
    pod.spec =
        pod.spec
            .take()
            .and_then(|s| s.node_name)
            .map(|node| k8s_openapi::api::core::v1::PodSpec {
                node_name: Some(node),
                ..Default::default()
            });
    pod.status =
        pod.status
            .take()
            .and_then(|s| s.pod_ip)
            .map(|ip| k8s_openapi::api::core::v1::PodStatus {
                pod_ip: Some(ip),
                ..Default::default()
            });
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt as _;
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use std::time::Duration;

    fn pod(node: Option<&str>, ip: Option<&str>) -> Arc<Pod> {
        let mut pod = Pod {
            spec: Some(PodSpec {
                node_name: node.map(str::to_string),
                ..Default::default()
            }),
            status: Some(PodStatus {
                pod_ip: ip.map(str::to_string),
                host_ip: Some("198.51.100.11".to_string()),
                ..Default::default()
            }),
            ..Default::default()
        };
        trim_pod(&mut pod);
        Arc::new(pod)
    }

    /// The resources of [`Stores`], in order: every watched one but the records (their own
    /// task's).
    fn stored() -> Vec<Resource> {
        let records = Resource::ServiceL2Statuses;
        Resource::WATCHED
            .into_iter()
            .filter(|r| *r != records)
            .collect()
    }

    /// The resources whose watch lists in full (a [`What::Resync`]) before `limit` passes.
    async fn resynced(changed: &mut UnboundedReceiver<Change>, limit: Duration) -> Vec<Resource> {
        let mut listed = BTreeSet::new();
        let _ = tokio::time::timeout(limit, async {
            while listed.len() < stored().len() {
                match changed.next().await {
                    Some(Change {
                        resource,
                        what: What::Resync,
                        ..
                    }) => {
                        listed.insert(resource);
                    }
                    Some(_) => {}
                    None => return,
                }
            }
        })
        .await;
        listed.into_iter().collect()
    }

    #[tokio::test]
    async fn every_watch_lists_again_when_asked_and_keeps_its_objects_meanwhile() {
        let plane = swimlb_control_plane::test_plane::TestPlane::start_async("relist").await;
        plane
            .admin()
            .create(serde_json::json!({
                "apiVersion": "v1", "kind": "Node", "metadata": {"name": "node1"}
            }))
            .unwrap();
        let client = plane.client().await;
        let metrics = KubeMetrics::register(&mut prometheus_client::registry::Registry::default());
        let (relister, relists) = swimlb_config::reflect::relists();
        let (stores, mut changed) =
            Stores::spawn(&client, "swimlb-system", "app=speaker", &metrics, &relists);
        let every = stored();
        let limit = Duration::from_secs(15);
        assert_eq!(
            resynced(&mut changed, limit).await,
            every,
            "the first lists"
        );
        relister.relist();
        // The node is still there while the lists run again.
        assert_eq!(stores.nodes.state().len(), 1);
        // A watch resumed after its timeout (20 s) does not list again: only a relist does,
        // within the limit.
        assert_eq!(
            resynced(&mut changed, limit).await,
            every,
            "the lists asked for"
        );
        assert_eq!(stores.nodes.state().len(), 1, "the node after the relist");
    }

    /// A speaker started during an API outage lists everything once the server is back, through
    /// the daemons' client (`swimlb_config::client`); prints how long after the server said it
    /// was ready. `SWIMLB_TEST_KUBE_DEFAULT_CLIENT=1` uses kube's default client instead, whose
    /// retry honours the starting server's `Retry-After: 5` on the custom resources' lists.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stores_started_during_an_api_outage_list_once_the_server_is_back() {
        let plane = swimlb_control_plane::test_plane::TestPlane::start_async("outage").await;
        let path = plane.admin_kubeconfig();
        let kubeconfig = kube::config::Kubeconfig::read_from(path).expect("the kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("a client configuration");
        let client = if std::env::var_os("SWIMLB_TEST_KUBE_DEFAULT_CLIENT").is_some() {
            kube::Client::try_from(config).expect("kube's client")
        } else {
            swimlb_config::client::client(config).expect("the daemons' client")
        };
        let mut plane = tokio::task::spawn_blocking(move || {
            let mut plane = plane;
            plane.kill_apiserver().expect("killing the API server");
            plane
        })
        .await
        .expect("killed");
        let metrics = KubeMetrics::register(&mut prometheus_client::registry::Registry::default());
        let (_relister, relists) = swimlb_config::reflect::relists();
        let (stores, _changed) =
            Stores::spawn(&client, "swimlb-system", "app=speaker", &metrics, &relists);
        // Every watch fails its first lists a few times (connection refused).
        tokio::time::sleep(Duration::from_secs(4)).await;
        let plane = tokio::task::spawn_blocking(move || {
            plane.start_apiserver().expect("starting the API server");
            plane
        })
        .await
        .expect("started");
        let ready = tokio::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(60), stores.ready())
            .await
            .expect("every store listed within a minute of the server's return")
            .expect("listed");
        eprintln!(
            "the stores listed {:.0} ms after the API server was ready",
            ready.elapsed().as_secs_f64() * 1e3
        );
        drop(plane);
    }

    #[test]
    fn a_pod_bound_to_its_node_counts_before_it_has_an_ip() {
        let pods = [
            pod(Some("node1"), Some("198.51.100.11")),
            pod(Some("node3"), None),
        ];
        assert_eq!(speaker_nodes(&pods), 2);
    }

    #[test]
    fn a_terminating_pod_and_its_replacement_on_one_node_count_once() {
        let pods = [
            pod(Some("node1"), Some("198.51.100.11")),
            pod(Some("node1"), None),
            pod(Some("node2"), Some("198.51.100.12")),
        ];
        assert_eq!(speaker_nodes(&pods), 2);
    }

    #[test]
    fn an_unbound_pod_counts_only_with_an_ip() {
        let pods = [
            pod(None, Some("198.51.100.13")),
            pod(None, None),
            pod(Some("node1"), Some("198.51.100.11")),
        ];
        assert_eq!(speaker_nodes(&pods), 2);
    }

    #[test]
    fn trimming_keeps_the_node_and_the_ip_only() {
        let p = pod(Some("node1"), Some("198.51.100.11"));
        let spec = p.spec.as_ref().expect("the spec");
        assert_eq!(spec.node_name.as_deref(), Some("node1"));
        let status = p.status.as_ref().expect("the status");
        assert_eq!(status.pod_ip.as_deref(), Some("198.51.100.11"));
        assert_eq!(status.host_ip, None);
    }
}
