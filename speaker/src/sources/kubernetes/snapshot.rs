//! From the Kubernetes caches to the speaker's [`Snapshot`], with MetalLB's layer-2 semantics.
//!
//! [`build`] is pure: it reads the cached objects ([`Caches`]) and the speaker's flags
//! ([`Options`]) and returns the snapshot with every object it left out, each as a typed
//! [`Dropped`] naming the object (for a log line and a counter labelled by
//! [`Dropped::as_str`]). It never panics, logs, or reads a clock. The same caches give the same
//! snapshot and the same list, in the same order.
//!
//! # Rules (MetalLB's `speaker/layer2_controller.go` and `internal/config`)
//!
//! - **Ours**: a Service of type LoadBalancer whose `spec.loadBalancerClass` equals
//!   [`Options::load_balancer_class`] (both absent by default) and with `status.loadBalancer
//!   .ingress`. Other Services, and ours without an IP yet, are not ours to report.
//! - **Pools**: the pools and advertisements are checked by [`validate`](swimlb_config::pools::validate); an invalid one is
//!   ignored and reported ([`Dropped::InvalidPool`], [`Dropped::InvalidAdvertisement`]), the
//!   others apply. All IPs of a Service must parse and lie in one valid pool, else the whole
//!   Service is left out, as MetalLB withdraws it (`invalidIP`, `ipNotAllowed`).
//! - **Advertisements**: an advertisement applies to a Service when it selects the Service's
//!   pool (`ipAddressPools` names or `ipAddressPoolSelectors`; neither = every pool) and the
//!   Service (`serviceSelectors`, OR'ed; none = every Service). No applicable advertisement:
//!   [`Dropped::NoMatchingAdvertisement`]. A Service carrying `allow-shared-ip` (under
//!   `swimlb.io/`, `metallb.io/` or `metallb.universe.tf/`, any value) with an applicable
//!   advertisement that has `serviceSelectors` is left out
//!   ([`Dropped::SharedIpWithServiceSelector`], MetalLB #3025): siblings sharing an IP could
//!   match different advertisements and elect two announcers.
//! - **Candidates** ([`ServedIp::nodes`]): the Nodes matched by the `nodeSelectors` of any
//!   applicable advertisement (none = every Node), minus Nodes with the condition
//!   `NetworkUnavailable=True` and Nodes labelled
//!   `node.kubernetes.io/exclude-from-external-load-balancers` (any value) unless
//!   [`Options::ignore_exclude_lb`]. Always a [`NodeFilter::Only`] set of Node names: see
//!   "Members without a Node object" below.
//! - **Interfaces**: the union of the applicable advertisements' `interfaces`; one
//!   advertisement without `interfaces` (MetalLB's "all interfaces") makes it
//!   [`Interfaces::Default`].
//! - **Endpoints**: an endpoint can serve when `conditions.ready` is unset or true, or else
//!   `conditions.serving` is true; the Service's EndpointSlices are those of its namespace
//!   labelled `kubernetes.io/service-name` with its name. `externalTrafficPolicy: Local`:
//!   [`ServedIp::ready_endpoints`] is the set of nodes with an endpoint that can serve (an
//!   endpoint without `nodeName` is ignored and reported, [`Dropped::EndpointWithoutNode`]).
//!   `Cluster`: no set (every candidate) while some endpoint anywhere can serve.
//! - **Order**: [`ServedIp::order_ip`] is the Service's first ingress IP for all its IPs, so the
//!   election hashes what MetalLB hashes. [`ServedIp::node_priority`] is MetalLB's
//!   `preferredNodeSelectors` score: per advertisement, the weights of the preferences a node
//!   matches, given only to the nodes of that advertisement's `nodeSelectors`; summed over the
//!   applicable advertisements.
//! - **Shared IPs**: an IP held by several Services is one entry, with one owner. The entry is
//!   the first holder's by (namespace, name) ([`ServedIp::belongs_to`] names it). When every
//!   holder allows a shared IP, their endpoints are merged (the IP is served where any of them
//!   can be), and the others are named in [`ServedIp::shared_with`] (each Service gets its own
//!   record); a holder that does not allow sharing is left out for that IP
//!   ([`Dropped::IpConflict`]).
//!
//! # Choices where MetalLB leaves room
//!
//! - **No serving endpoint** (`Cluster`, or `Local` with none on any node): the IP stays in the
//!   snapshot with an empty [`ServedIp::ready_endpoints`] set, so nobody is a candidate and the
//!   election reports [`Outcome::NoReadyEndpoints`](crate::model::election::Outcome::NoReadyEndpoints)
//!   for it: `/status` shows the IP and why nobody answers. It is not a [`Dropped`]: nothing in
//!   the input is wrong.
//! - **Members without a Node object** are not candidates. MetalLB builds each advertisement's
//!   node set from the Node list (all listed Nodes when it has no `nodeSelectors`), and a speaker
//!   is a candidate only inside such a set; its `NetworkUnavailable` and exclusion checks pass
//!   a missing Node, but the advertisement check does not. So no "all nodes but these" filter
//!   is needed, and the candidate set of every IP is a plain set of Node names.
//! - **Interfaces per IP, not per node.** MetalLB unions the interfaces of the applicable
//!   advertisements that cover the announcing node; a [`ServedIp`] has one interface set for
//!   every node. The two differ only when advertisements with different node sets name
//!   different interfaces: here every candidate answers on each named interface it has.
//!   "All interfaces" becomes [`Interfaces::Default`] (the interface with a connected route to
//!   the IP), which is where an ARP request for the IP arrives.
//! - **Endpoints without `nodeName`** matter only for `Local` (they are where MetalLB skips
//!   them); for `Cluster` such an endpoint still counts as one that can serve, as in MetalLB.
//! - **Scores are summed without a limit**, as MetalLB sums them (a Service's priorities are
//!   not the groups' 1..=254): 300 against 260 orders the nodes as MetalLB does.
//! - **Invalid objects** are ignored one by one, where MetalLB rejects the whole configuration
//!   and keeps the previous one. [`validate`](swimlb_config::pools::validate) also rejects an advertisement that names an
//!   unknown pool, where MetalLB skips only the unknown name.
//!
//! # Cost
//!
//! One pass over Nodes per advertisement, one over EndpointSlices to index them by Service, and
//! for each Service a scan of the pools and of its pool's advertisements. Node sets, interface
//! sets and priority tables are built once per distinct set of applicable advertisements and
//! shared between Services behind [`Arc`], so thousands of Services in one pool hold one set
//! (and compare by pointer in [`Snapshot::diff`]). [`build`] does all of it; the [`Keeper`]
//! the running speaker holds does it once, then per watch event only for the Service concerned
//! (and for every Service only when the resolved configuration changed).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use swimlb_config::crd::{IPAddressPool, L2Advertisement};
use swimlb_config::pools::{Advertisement, ConfigError, Model};
use swimlb_config::service::{ServiceKey, TrafficPolicy};

use super::views::{ConditionsView, ServiceView, SliceView, trim_cached_meta};
use crate::model::membership::NodeName;
use crate::model::snapshot::{Interfaces, NodeFilter, NodeSet, Owner, ServedIp, Snapshot};

/// The annotations that let a Service share its IP, in every spelling the controller accepts.
pub const ALLOW_SHARED_IP: [&str; 3] = [
    "swimlb.io/allow-shared-ip",
    "metallb.io/allow-shared-ip",
    "metallb.universe.tf/allow-shared-ip",
];

/// The Node label that keeps a node from announcing (unless `--ignore-exclude-lb`).
pub const EXCLUDE_FROM_LOAD_BALANCERS: &str =
    "node.kubernetes.io/exclude-from-external-load-balancers";

/// The Node condition whose status `True` keeps a node from announcing.
pub const NETWORK_UNAVAILABLE: &str = "NetworkUnavailable";

/// The EndpointSlice label naming its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The cached objects a snapshot is built from, as the reflector stores hold them (trimmed or
/// not: only the fields named in the module docs are read).
#[derive(Debug, Clone, Copy, Default)]
pub struct Caches<'a> {
    /// Services (any type and class: those that are not ours are skipped).
    pub services: &'a [&'a ServiceView],
    /// EndpointSlices of every namespace.
    pub endpoint_slices: &'a [&'a SliceView],
    /// Nodes.
    pub nodes: &'a [&'a Node],
    /// `IPAddressPool`s of the speaker's namespace.
    pub pools: &'a [&'a IPAddressPool],
    /// `L2Advertisement`s of the speaker's namespace.
    pub advertisements: &'a [&'a L2Advertisement],
}

/// The speaker's flags that change what is served.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// `--load-balancer-class`: the class served; `None` serves the Services without one.
    pub load_balancer_class: Option<String>,
    /// `--ignore-exclude-lb`: nodes labelled `exclude-from-external-load-balancers` announce.
    pub ignore_exclude_lb: bool,
}

/// What [`build`] returns: the snapshot, and everything left out of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Built {
    /// What should be served.
    pub snapshot: Snapshot,
    /// Every object, Service, IP or endpoint left out, in a stable order: invalid pools and
    /// advertisements first, then Services by (namespace, name), then shared-IP conflicts by IP.
    pub dropped: Vec<Dropped>,
}

/// Something in the caches that was left out of the snapshot, and the object it concerns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Dropped {
    /// An `IPAddressPool` that does not validate: ignored, so its IPs are in no pool.
    #[error("{0}; the pool is ignored")]
    InvalidPool(ConfigError),
    /// An `L2Advertisement` that does not validate (a bad selector, an unknown pool, a weight
    /// out of range): ignored, the others apply.
    #[error("{0}; the advertisement is ignored")]
    InvalidAdvertisement(ConfigError),
    /// An ingress entry without a parsable IP: the Service is not announced.
    #[error(
        "Service {service}: status.loadBalancer.ingress[{index}].ip: {text:?} is not an IP address; the Service is not announced"
    )]
    InvalidIngressIp {
        /// The Service.
        service: ServiceKey,
        /// The entry's position.
        index: usize,
        /// The entry's `ip` as written (empty when it has none).
        text: String,
    },
    /// An IP in no valid pool: the Service is not announced.
    #[error("Service {service}: IP {ip} is in no IPAddressPool; the Service is not announced")]
    OutsidePools {
        /// The Service.
        service: ServiceKey,
        /// Its first IP outside every pool.
        ip: IpAddr,
    },
    /// IPs of one Service in two pools: the Service is not announced.
    #[error(
        "Service {service}: IP {first} is in pool {first_pool:?} but IP {second} in pool {second_pool:?}; the Service is not announced"
    )]
    SplitAcrossPools {
        /// The Service.
        service: ServiceKey,
        /// Its first IP.
        first: IpAddr,
        /// The pool of `first`.
        first_pool: String,
        /// The first IP in another pool.
        second: IpAddr,
        /// The pool of `second`.
        second_pool: String,
    },
    /// No `L2Advertisement` selects both the Service's pool and the Service.
    #[error(
        "Service {service}: no L2Advertisement selects pool {pool:?} and this Service; the Service is not announced"
    )]
    NoMatchingAdvertisement {
        /// The Service.
        service: ServiceKey,
        /// Its pool.
        pool: String,
    },
    /// A Service that allows a shared IP, selected by an advertisement with `serviceSelectors`.
    #[error(
        "Service {service}: it allows a shared IP and L2Advertisement {advertisement} selects it with serviceSelectors; the Service is not announced"
    )]
    SharedIpWithServiceSelector {
        /// The Service.
        service: ServiceKey,
        /// The first such advertisement, `namespace/name`.
        advertisement: String,
    },
    /// An IP also held by a Service that was not kept for it: the holders do not all allow a
    /// shared IP.
    #[error(
        "IP {ip} is held by Service {kept} and by Service {dropped}, which do not both allow a shared IP; it is announced for {kept} only"
    )]
    IpConflict {
        /// The IP.
        ip: IpAddr,
        /// The Service the IP is served for (first by namespace/name).
        kept: String,
        /// The Service left out for this IP.
        dropped: String,
    },
    /// An endpoint without `nodeName` of an `externalTrafficPolicy: Local` Service: ignored.
    #[error(
        "Service {service}: EndpointSlice {slice}: endpoints[{index}] has no nodeName; the endpoint is ignored"
    )]
    EndpointWithoutNode {
        /// The Service.
        service: ServiceKey,
        /// The EndpointSlice's name.
        slice: String,
        /// The endpoint's position in the slice.
        index: usize,
    },
}

impl Dropped {
    /// Its reason, for logs and metrics.
    pub fn reason(&self) -> DropReason {
        match self {
            Dropped::InvalidPool(_) => DropReason::InvalidPool,
            Dropped::InvalidAdvertisement(_) => DropReason::InvalidAdvertisement,
            Dropped::InvalidIngressIp { .. } => DropReason::InvalidIngressIp,
            Dropped::OutsidePools { .. } => DropReason::OutsidePools,
            Dropped::SplitAcrossPools { .. } => DropReason::SplitAcrossPools,
            Dropped::NoMatchingAdvertisement { .. } => DropReason::NoMatchingAdvertisement,
            Dropped::SharedIpWithServiceSelector { .. } => DropReason::SharedIpWithServiceSelector,
            Dropped::IpConflict { .. } => DropReason::IpConflict,
            Dropped::EndpointWithoutNode { .. } => DropReason::EndpointWithoutNode,
        }
    }

    /// A fixed label for logs and metrics.
    pub fn as_str(&self) -> &'static str {
        self.reason().as_str()
    }
}

/// Why something was left out of what is served: the `reason` label of
/// `swimlb_snapshot_dropped`. One per [`Dropped`] variant, and the interfaces named but missing
/// on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DropReason {
    /// `invalid_pool`.
    InvalidPool,
    /// `invalid_advertisement`.
    InvalidAdvertisement,
    /// `invalid_ingress_ip`.
    InvalidIngressIp,
    /// `outside_pools`.
    OutsidePools,
    /// `split_across_pools`.
    SplitAcrossPools,
    /// `no_matching_advertisement`.
    NoMatchingAdvertisement,
    /// `shared_ip_with_service_selector`.
    SharedIpWithServiceSelector,
    /// `ip_conflict`.
    IpConflict,
    /// `endpoint_without_node`.
    EndpointWithoutNode,
    /// `unknown_interface`: an interface named but missing on this node.
    UnknownInterface,
}

impl DropReason {
    /// The label.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::InvalidPool => "invalid_pool",
            DropReason::InvalidAdvertisement => "invalid_advertisement",
            DropReason::InvalidIngressIp => "invalid_ingress_ip",
            DropReason::OutsidePools => "outside_pools",
            DropReason::SplitAcrossPools => "split_across_pools",
            DropReason::NoMatchingAdvertisement => "no_matching_advertisement",
            DropReason::SharedIpWithServiceSelector => "shared_ip_with_service_selector",
            DropReason::IpConflict => "ip_conflict",
            DropReason::EndpointWithoutNode => "endpoint_without_node",
            DropReason::UnknownInterface => "unknown_interface",
        }
    }
}

/// The snapshot the caches describe, and everything left out of it (module docs). The same as
/// a [`Keeper`] given the same caches ([`Keeper::resync`]).
pub fn build(caches: Caches<'_>, options: &Options) -> Built {
    let mut keeper = Keeper::new(options.clone());
    keeper.resync(caches);
    keeper.built()
}

/// Where an IP may be served from, shared by every Service with the same applicable
/// advertisements.
#[derive(Clone, Debug)]
struct Placement {
    nodes: NodeFilter,
    interfaces: Interfaces,
    node_priority: Option<Arc<BTreeMap<NodeName, u32>>>,
}

/// Why a Service's IPs are not in one valid pool.
enum PoolMiss<'m> {
    /// This IP is in none.
    Outside(IpAddr),
    /// Two IPs are in different pools.
    Split {
        first: IpAddr,
        first_pool: &'m str,
        second: IpAddr,
        second_pool: &'m str,
    },
}

impl PoolMiss<'_> {
    fn dropped(self, service: &ServiceKey) -> Dropped {
        let service = service.clone();
        match self {
            PoolMiss::Outside(ip) => Dropped::OutsidePools { service, ip },
            PoolMiss::Split {
                first,
                first_pool,
                second,
                second_pool,
            } => Dropped::SplitAcrossPools {
                service,
                first,
                first_pool: first_pool.to_string(),
                second,
                second_pool: second_pool.to_string(),
            },
        }
    }
}

/// An advertisement's nodes, resolved against the Node cache.
#[derive(Debug, PartialEq, Eq)]
struct ResolvedAd {
    /// The candidate nodes it covers (its `nodeSelectors`, minus excluded nodes).
    nodes: BTreeSet<NodeName>,
    /// The preference score it gives each of its nodes (nodes scoring 0 are absent).
    scores: BTreeMap<NodeName, u64>,
}

/// The configuration resolved against the Nodes: what every Service is checked against.
#[derive(Debug, Default)]
struct Resolved {
    model: Model,
    /// One per advertisement of the model, in the same order.
    ads: Vec<ResolvedAd>,
    /// The advertisements of each pool, by index, in (namespace, name) order.
    by_pool: HashMap<String, Vec<usize>>,
}

/// What a Node contributes to the resolved configuration: its name, labels and whether it may
/// announce at all.
type NodeFacts<'a> = (&'a str, &'a BTreeMap<String, String>, bool);

impl Resolved {
    fn new(model: Model, nodes: &[NodeFacts<'_>]) -> Resolved {
        let ads: Vec<ResolvedAd> = model
            .advertisements
            .iter()
            .map(|ad| {
                let mut covered = BTreeSet::new();
                let mut scores = BTreeMap::new();
                for (name, labels, eligible) in nodes {
                    let selected = ad.node_selectors.is_empty()
                        || ad.node_selectors.iter().any(|s| s.matches(labels));
                    if !selected || !eligible {
                        continue;
                    }
                    covered.insert(name.to_string());
                    let score: u64 = ad
                        .preferred_nodes
                        .iter()
                        .filter(|p| p.selector.matches(labels))
                        .map(|p| u64::from(p.weight))
                        .sum();
                    if score > 0 {
                        scores.insert(name.to_string(), score);
                    }
                }
                ResolvedAd {
                    nodes: covered,
                    scores,
                }
            })
            .collect();
        let mut by_pool: HashMap<String, Vec<usize>> = HashMap::new();
        for (index, ad) in model.advertisements.iter().enumerate() {
            for pool in &ad.pools {
                by_pool.entry(pool.clone()).or_default().push(index);
            }
        }
        Resolved {
            model,
            ads,
            by_pool,
        }
    }

    fn ad(&self, index: usize) -> &Advertisement {
        &self.model.advertisements[index]
    }

    /// Whether every Service would be checked the same against `other`.
    fn same_as(&self, other: &Resolved) -> bool {
        self.model == other.model && self.ads == other.ads
    }

    /// The entries of one Service, or `None` (reported in `dropped`) when it is left out.
    fn serve(
        &self,
        key: &ServiceKey,
        svc: &ServiceView,
        slices: &[&SliceView],
        placements: &mut HashMap<Vec<usize>, Placement>,
        dropped: &mut Vec<Dropped>,
    ) -> Option<(Vec<IpAddr>, ServedIp)> {
        let ips = match ingress_ips(svc) {
            Ok(ips) => ips,
            Err((index, text)) => {
                dropped.push(Dropped::InvalidIngressIp {
                    service: key.clone(),
                    index,
                    text,
                });
                return None;
            }
        };
        // No ingress IP yet: not allocated, nothing to serve or report.
        let (&first, rest) = ips.split_first()?;
        let pool = match self.pool_of(first, rest) {
            Ok(pool) => pool,
            Err(miss) => {
                dropped.push(miss.dropped(key));
                return None;
            }
        };
        let labels = svc.metadata.labels.as_ref().unwrap_or(&NO_LABELS);
        let applicable: Vec<usize> = self
            .by_pool
            .get(pool)
            .into_iter()
            .flatten()
            .copied()
            .filter(|&i| {
                let selectors = &self.ad(i).service_selectors;
                selectors.is_empty() || selectors.iter().any(|s| s.matches(labels))
            })
            .collect();
        if applicable.is_empty() {
            dropped.push(Dropped::NoMatchingAdvertisement {
                service: key.clone(),
                pool: pool.to_string(),
            });
            return None;
        }
        if allows_shared_ip(svc)
            && let Some(&i) = applicable
                .iter()
                .find(|&&i| !self.ad(i).service_selectors.is_empty())
        {
            let ad = self.ad(i);
            dropped.push(Dropped::SharedIpWithServiceSelector {
                service: key.clone(),
                advertisement: format!("{}/{}", ad.namespace, ad.name),
            });
            return None;
        }
        let placement = placements
            .entry(applicable)
            .or_insert_with_key(|applicable| self.placement(applicable))
            .clone();
        let ready_endpoints = ready_endpoints(key, svc, slices, dropped);
        // Every IP of the Service has the same entry.
        let served = ServedIp {
            belongs_to: Owner::service(&key.namespace, &key.name),
            group: None,
            interfaces: placement.interfaces,
            nodes: placement.nodes,
            ready_endpoints,
            node_priority: placement.node_priority,
            order_ip: Some(first),
            shared_with: None,
        };
        Some((ips, served))
    }

    /// The one valid pool holding every IP of a Service.
    fn pool_of(&self, first: IpAddr, rest: &[IpAddr]) -> Result<&str, PoolMiss<'_>> {
        let find = |ip: IpAddr| {
            let pool = self.model.pools.values().find(|p| p.contains(ip));
            pool.map(|p| p.name.as_str()).ok_or(PoolMiss::Outside(ip))
        };
        let pool = find(first)?;
        for &ip in rest {
            let other = find(ip)?;
            if other != pool {
                return Err(PoolMiss::Split {
                    first,
                    first_pool: pool,
                    second: ip,
                    second_pool: other,
                });
            }
        }
        Ok(pool)
    }

    /// The nodes, interfaces and priorities of a set of applicable advertisements.
    fn placement(&self, applicable: &[usize]) -> Placement {
        let ads = applicable.iter().map(|&i| (self.ad(i), &self.ads[i]));
        let nodes: BTreeSet<NodeName> = ads
            .clone()
            .flat_map(|(_, r)| r.nodes.iter().cloned())
            .collect();
        let interfaces = if ads.clone().any(|(ad, _)| ad.interfaces.is_empty()) {
            Interfaces::Default
        } else {
            Interfaces::named(
                ads.clone()
                    .flat_map(|(ad, _)| ad.interfaces.iter().cloned()),
            )
        };
        let mut scores: BTreeMap<NodeName, u64> = BTreeMap::new();
        for (_, resolved) in ads {
            for (node, score) in &resolved.scores {
                *scores.entry(node.clone()).or_default() += score;
            }
        }
        let node_priority = (!scores.is_empty()).then(|| {
            let sum = |score: u64| u32::try_from(score).unwrap_or(u32::MAX);
            Arc::new(
                scores
                    .into_iter()
                    .map(|(node, score)| (node, sum(score)))
                    .collect(),
            )
        });
        Placement {
            nodes: NodeFilter::Only(Arc::new(nodes)),
            interfaces,
            node_priority,
        }
    }
}

/// The labels of an object without any.
static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// Whether the Service is of type LoadBalancer and of the class this speaker serves.
fn is_ours(svc: &ServiceView, options: &Options) -> bool {
    let Some(spec) = svc.spec.as_ref() else {
        return false;
    };
    spec.type_.as_deref() == Some("LoadBalancer")
        && spec.load_balancer_class.as_deref() == options.load_balancer_class.as_deref()
}

/// The Service's namespace and name.
fn key_of(svc: &ServiceView) -> ServiceKey {
    ServiceKey::new(
        svc.metadata.namespace.clone().unwrap_or_default(),
        svc.metadata.name.clone().unwrap_or_default(),
    )
}

/// Whether the Service carries `allow-shared-ip` under any spelling (any value).
fn allows_shared_ip(svc: &ServiceView) -> bool {
    svc.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| ALLOW_SHARED_IP.iter().any(|key| a.contains_key(*key)))
}

/// `spec.externalTrafficPolicy`, `Cluster` unless it says `Local`.
fn traffic_policy(svc: &ServiceView) -> TrafficPolicy {
    match svc
        .spec
        .as_ref()
        .and_then(|s| s.external_traffic_policy.as_deref())
    {
        Some("Local") => TrafficPolicy::Local,
        _ => TrafficPolicy::Cluster,
    }
}

/// The Service's ingress IPs in order, without repeats, IPv4-mapped IPv6 read as IPv4 (as Go
/// reads them); or the position and text of the first entry without a parsable IP.
fn ingress_ips(svc: &ServiceView) -> Result<Vec<IpAddr>, (usize, String)> {
    let entries = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref());
    let mut ips: Vec<IpAddr> = Vec::new();
    for (index, entry) in entries.into_iter().flatten().enumerate() {
        let text = entry.ip.as_deref().unwrap_or_default();
        let ip = text
            .parse::<IpAddr>()
            .map_err(|_| (index, text.to_string()))?
            .to_canonical();
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    Ok(ips)
}

/// Whether a node may announce at all: its network is available and it is not excluded.
fn can_announce(node: &Node, options: &Options) -> bool {
    let network_unavailable = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == NETWORK_UNAVAILABLE && c.status == "True");
    let excluded = node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(EXCLUDE_FROM_LOAD_BALANCERS));
    !network_unavailable && (options.ignore_exclude_lb || !excluded)
}

/// The EndpointSlices of each Service, by (namespace, service name), each list by slice name.
fn slices_by_service<'a>(
    slices: &[&'a SliceView],
) -> HashMap<(&'a str, &'a str), Vec<&'a SliceView>> {
    let mut by_service: HashMap<(&str, &str), Vec<&SliceView>> = HashMap::new();
    for slice in slices {
        let namespace = slice.metadata.namespace.as_deref().unwrap_or_default();
        let Some(service) = slice.service() else {
            continue;
        };
        by_service
            .entry((namespace, service))
            .or_default()
            .push(slice);
    }
    for list in by_service.values_mut() {
        list.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    }
    by_service
}

/// Trims a cached Node to what [`build`] reads: its name, labels and `NetworkUnavailable`
/// condition (a Node's status, with its image list, is most of its size). Idempotent;
/// [`build`] gives the same result before and after.
pub fn trim_node(node: &mut Node) {
    trim_cached_meta(&mut node.metadata);
    node.metadata.annotations = None;
    node.spec = None;
    if let Some(status) = node.status.take() {
        let conditions: Vec<_> = status
            .conditions
            .into_iter()
            .flatten()
            .filter(|c| c.type_ == NETWORK_UNAVAILABLE)
            .map(|c| k8s_openapi::api::core::v1::NodeCondition {
                type_: c.type_,
                status: c.status,
                ..Default::default()
            })
            .collect();
        if !conditions.is_empty() {
            node.status = Some(k8s_openapi::api::core::v1::NodeStatus {
                conditions: Some(conditions),
                ..Default::default()
            });
        }
    }
}

/// MetalLB's "can serve": `ready` unset or true, or else `serving` true.
fn can_serve(conditions: Option<&ConditionsView>) -> bool {
    conditions.is_none_or(|c| c.ready.is_none_or(|ready| ready) || c.serving == Some(true))
}

/// [`ServedIp::ready_endpoints`] for a Service: for `Local`, the nodes with an endpoint that can
/// serve; for `Cluster`, none (every candidate) while any endpoint can serve, else the empty
/// set.
fn ready_endpoints(
    key: &ServiceKey,
    svc: &ServiceView,
    slices: &[&SliceView],
    dropped: &mut Vec<Dropped>,
) -> Option<NodeSet> {
    match traffic_policy(svc) {
        TrafficPolicy::Cluster => {
            let serving = slices
                .iter()
                .flat_map(|s| s.endpoints.iter())
                .any(|e| can_serve(e.conditions.as_ref()));
            (!serving).then(|| Arc::new(BTreeSet::new()))
        }
        TrafficPolicy::Local => {
            let mut nodes = BTreeSet::new();
            for slice in slices {
                for (index, endpoint) in slice.endpoints.iter().enumerate() {
                    match endpoint.node_name.as_deref().filter(|n| !n.is_empty()) {
                        None => dropped.push(Dropped::EndpointWithoutNode {
                            service: key.clone(),
                            slice: slice.metadata.name.clone().unwrap_or_default(),
                            index,
                        }),
                        Some(node) if can_serve(endpoint.conditions.as_ref()) => {
                            nodes.insert(node.to_string());
                        }
                        Some(_) => {}
                    }
                }
            }
            Some(Arc::new(nodes))
        }
    }
}

/// The ready endpoints of an IP shared by two Services: every candidate if either serves
/// from every candidate, else the nodes where either can serve.
fn merge_ready(a: Option<NodeSet>, b: Option<NodeSet>) -> Option<NodeSet> {
    let (a, b) = (a?, b?);
    if b.is_subset(&a) {
        return Some(a);
    }
    Some(Arc::new(a.union(&b).cloned().collect()))
}

mod keeper;
#[cfg(test)]
mod tests;

pub use keeper::{Changes, Keeper};
