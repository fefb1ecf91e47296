//! What should be served: every virtual IP, what it belongs to, and who may serve it.
//!
//! A [`Snapshot`] is built by a source (the standalone file or the Kubernetes reflectors) and
//! handed to the election as a plain value. It owns no I/O and no clock. It guarantees:
//!
//! - each IP appears at most once ([`Snapshot::insert`] refuses a second claim on an IP by a
//!   different owner key, naming both);
//! - two snapshots can be diffed cheaply ([`Snapshot::diff`]): node sets are shared behind
//!   [`Arc`], so the IPs of one Service or group compare by pointer first.
//!
//! The snapshot says nothing about who is alive: that is the [`LiveSet`](crate::model::membership::LiveSet).

use smol_str::SmolStr;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use crate::model::membership::NodeName;

/// A set of node names, shared between the IPs of one Service or group.
pub type NodeSet = Arc<BTreeSet<NodeName>>;

/// A set of interface names, shared between the IPs of one Service, group or advertisement.
pub type InterfaceSet = Arc<BTreeSet<String>>;

/// Where the IP is answered for: a set of interfaces (MetalLB's `L2Advertisement.interfaces`
/// and `ServiceL2Status.interfaces` are lists), or the default.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Interfaces {
    /// No interface named: the interface with a connected route to the IP.
    Default,
    /// These interfaces (`eth0`, `bond0`); the IP is answered on every one of them that can
    /// announce on the node. Never empty (an empty list is [`Interfaces::Default`]).
    Named(InterfaceSet),
}

impl Interfaces {
    /// The set of `names`, or [`Interfaces::Default`] when there is none.
    pub fn named<S: Into<String>>(names: impl IntoIterator<Item = S>) -> Interfaces {
        let set: BTreeSet<String> = names.into_iter().map(Into::into).collect();
        if set.is_empty() {
            Interfaces::Default
        } else {
            Interfaces::Named(Arc::new(set))
        }
    }

    /// The named interfaces (none for the default).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        let set = match self {
            Interfaces::Default => None,
            Interfaces::Named(set) => Some(set.iter().map(String::as_str)),
        };
        set.into_iter().flatten()
    }

    fn same_as(&self, other: &Interfaces) -> bool {
        match (self, other) {
            (Interfaces::Named(a), Interfaces::Named(b)) => Arc::ptr_eq(a, b) || a == b,
            (a, b) => a == b,
        }
    }
}

impl fmt::Display for Interfaces {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Interfaces::Default => f.write_str("(default)"),
            Interfaces::Named(names) => {
                let mut first = true;
                for name in names.iter() {
                    if !first {
                        f.write_str(",")?;
                    }
                    first = false;
                    f.write_str(name)?;
                }
                Ok(())
            }
        }
    }
}

/// Which nodes may serve an IP, before liveness, health and endpoints are considered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeFilter {
    /// Every member of the cluster.
    All,
    /// Only these nodes (node selectors applied, exclusions removed).
    Only(NodeSet),
}

impl NodeFilter {
    /// Whether `node` passes the filter.
    pub fn admits(&self, node: &str) -> bool {
        match self {
            NodeFilter::All => true,
            NodeFilter::Only(set) => set.contains(node),
        }
    }
}

/// What a served IP belongs to: a standalone group or a Kubernetes Service. [`fmt::Display`]
/// gives the group name or `namespace/name`, as `/status` and the metrics show it.
///
/// One [`SmolStr`] holds the text (inline up to 23 bytes), so an owner is no larger than a
/// string key, and the kind is read from it: a Kubernetes namespace never holds a `/`, and
/// neither does a group name (the configuration refuses one).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Owner(SmolStr);

/// An [`Owner`], read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerKind<'a> {
    /// A standalone group.
    Group(&'a str),
    /// A Kubernetes Service.
    Service {
        /// Its namespace.
        namespace: &'a str,
        /// Its name.
        name: &'a str,
    },
}

impl Owner {
    /// The standalone group `name` (which holds no `/`).
    pub fn group(name: &str) -> Owner {
        Owner(SmolStr::from(name))
    }

    /// The Kubernetes Service `namespace/name`.
    pub fn service(namespace: &str, name: &str) -> Owner {
        Owner(smol_str::format_smolstr!("{namespace}/{name}"))
    }

    /// Which kind of owner this is, with its names.
    pub fn kind(&self) -> OwnerKind<'_> {
        match self.0.split_once('/') {
            Some((namespace, name)) => OwnerKind::Service { namespace, name },
            None => OwnerKind::Group(&self.0),
        }
    }

    /// The Service's namespace and name; `None` for a group.
    pub fn service_names(&self) -> Option<(&str, &str)> {
        match self.kind() {
            OwnerKind::Service { namespace, name } => Some((namespace, name)),
            OwnerKind::Group(_) => None,
        }
    }

    /// The displayed text (cheap: inline, or a shared pointer).
    pub fn to_smol_str(&self) -> SmolStr {
        self.0.clone()
    }

    /// Heap bytes held (0 when the text is inline).
    pub fn heap_bytes(&self) -> usize {
        self.0.len() * usize::from(self.0.is_heap_allocated())
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One IP to serve and the rules for who may serve it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedIp {
    /// What the IP belongs to: a standalone group, or a Kubernetes Service.
    pub belongs_to: Owner,
    /// The group whose [`GroupHealth`](crate::model::membership::GroupHealth) applies (standalone). `None`
    /// for Kubernetes Services: every member has priority 0 and no checks for them.
    pub group: Option<String>,
    /// Where to answer for it.
    pub interfaces: Interfaces,
    /// Which nodes may serve it.
    pub nodes: NodeFilter,
    /// `externalTrafficPolicy: Local`: the nodes with a ready endpoint. `None` for `Cluster`
    /// policy and for standalone groups, except the empty set for a `Cluster` Service with no
    /// endpoint that can serve anywhere (nobody serves it, as in MetalLB).
    pub ready_endpoints: Option<NodeSet>,
    /// Per-node priority for an IP without a group (MetalLB's `preferredNodeSelectors`: the
    /// summed weights of the selectors a node matches, without a limit, as MetalLB sums them); a
    /// node not listed has 0. `None`: every node has 0. Ignored for standalone groups, whose
    /// members gossip their priority.
    pub node_priority: Option<Arc<BTreeMap<NodeName, u32>>>,
    /// The IP whose text goes into the election's order hash; `None`: this IP. MetalLB hashes
    /// a Service's first ingress IP for all of its IPs; set this to that IP to place a
    /// dual-stack Service exactly as MetalLB does.
    pub order_ip: Option<IpAddr>,
    /// The other owners sharing the IP (Kubernetes Services with `allow-shared-ip`, as
    /// `namespace/service`, in order), each with a record of its own; `None` when the IP is not
    /// shared, the common case, which allocates nothing.
    pub shared_with: Option<Box<[String]>>,
}

impl ServedIp {
    /// A Kubernetes-style entry: no group, default interface, every node, `Cluster` policy.
    pub fn service(namespace: &str, name: &str) -> ServedIp {
        ServedIp {
            belongs_to: Owner::service(namespace, name),
            group: None,
            interfaces: Interfaces::Default,
            nodes: NodeFilter::All,
            ready_endpoints: None,
            node_priority: None,
            order_ip: None,
            shared_with: None,
        }
    }

    /// A standalone-style entry for `group` on `interfaces`, every node.
    pub fn group(group: impl Into<String>, interfaces: Interfaces) -> ServedIp {
        let group = group.into();
        ServedIp {
            belongs_to: Owner::group(&group),
            group: Some(group),
            interfaces,
            nodes: NodeFilter::All,
            ready_endpoints: None,
            node_priority: None,
            order_ip: None,
            shared_with: None,
        }
    }

    /// Whether two entries are the same, comparing shared sets by pointer first.
    fn same_as(&self, other: &ServedIp) -> bool {
        fn same_set(a: &NodeSet, b: &NodeSet) -> bool {
            Arc::ptr_eq(a, b) || a == b
        }
        let nodes_same = match (&self.nodes, &other.nodes) {
            (NodeFilter::All, NodeFilter::All) => true,
            (NodeFilter::Only(a), NodeFilter::Only(b)) => same_set(a, b),
            _ => false,
        };
        let endpoints_same = match (&self.ready_endpoints, &other.ready_endpoints) {
            (None, None) => true,
            (Some(a), Some(b)) => same_set(a, b),
            _ => false,
        };
        let priority_same = match (&self.node_priority, &other.node_priority) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
            _ => false,
        };
        nodes_same
            && endpoints_same
            && priority_same
            && self.belongs_to == other.belongs_to
            && self.group == other.group
            && self.interfaces.same_as(&other.interfaces)
            && self.order_ip == other.order_ip
            && self.shared_with == other.shared_with
    }
}

/// Why a snapshot could not be built. The snapshot is unchanged when an error is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// Two owners claim the same IP.
    #[error("IP {ip} is claimed by both {first:?} and {second:?}")]
    DuplicateIp {
        /// The contested IP.
        ip: IpAddr,
        /// The owner key that claimed it first (kept).
        first: String,
        /// The owner key that claimed it second (refused).
        second: String,
    },
}

/// Everything that should be served, keyed by IP. Entries are shared ([`Arc`]): a Service's
/// IPs, the Kubernetes keeper's snapshot and the engine's hold one entry, not a copy each, and
/// a clone of the snapshot copies no entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    ips: BTreeMap<IpAddr, Arc<ServedIp>>,
}

/// How one IP differs between two snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SnapshotChange {
    /// New in the second snapshot.
    Added(IpAddr),
    /// Gone from the second snapshot.
    Removed(IpAddr),
    /// In both, with a different entry.
    Changed(IpAddr),
}

impl Snapshot {
    /// An empty snapshot.
    pub fn new() -> Snapshot {
        Snapshot::default()
    }

    /// Adds `ip`. Re-inserting an IP for the same `belongs_to` replaces its entry; an IP already
    /// held by a different `belongs_to` is refused and the snapshot is unchanged.
    pub fn insert(
        &mut self,
        ip: IpAddr,
        served: impl Into<Arc<ServedIp>>,
    ) -> Result<(), SnapshotError> {
        let served = served.into();
        if let Some(held) = self.ips.get(&ip)
            && held.belongs_to != served.belongs_to
        {
            return Err(SnapshotError::DuplicateIp {
                ip,
                first: held.belongs_to.to_string(),
                second: served.belongs_to.to_string(),
            });
        }
        self.ips.insert(ip, served);
        Ok(())
    }

    /// Builds a snapshot from entries, stopping at the first IP claimed twice.
    pub fn from_entries<S: Into<Arc<ServedIp>>>(
        entries: impl IntoIterator<Item = (IpAddr, S)>,
    ) -> Result<Snapshot, SnapshotError> {
        let mut snapshot = Snapshot::new();
        for (ip, served) in entries {
            snapshot.insert(ip, served)?;
        }
        Ok(snapshot)
    }

    /// Removes `ip`; returns its entry.
    pub fn remove(&mut self, ip: &IpAddr) -> Option<Arc<ServedIp>> {
        self.ips.remove(ip)
    }

    /// The entry for `ip`.
    pub fn get(&self, ip: &IpAddr) -> Option<&ServedIp> {
        self.ips.get(ip).map(Arc::as_ref)
    }

    /// The entry for `ip`, to share.
    pub fn get_shared(&self, ip: &IpAddr) -> Option<&Arc<ServedIp>> {
        self.ips.get(ip)
    }

    /// All entries in IP order.
    pub fn iter(&self) -> impl Iterator<Item = (&IpAddr, &ServedIp)> {
        self.ips.iter().map(|(ip, served)| (ip, served.as_ref()))
    }

    /// Number of IPs.
    pub fn len(&self) -> usize {
        self.ips.len()
    }

    /// Whether there is nothing to serve.
    pub fn is_empty(&self) -> bool {
        self.ips.is_empty()
    }

    /// The IPs that differ from `self` to `next`, in IP order (one merge pass).
    pub fn diff(&self, next: &Snapshot) -> Vec<SnapshotChange> {
        let mut changes = Vec::new();
        let mut old = self.ips.iter().peekable();
        let mut new = next.ips.iter().peekable();
        loop {
            match (old.peek(), new.peek()) {
                (None, None) => break,
                (Some((ip, _)), None) => {
                    changes.push(SnapshotChange::Removed(**ip));
                    old.next();
                }
                (None, Some((ip, _))) => {
                    changes.push(SnapshotChange::Added(**ip));
                    new.next();
                }
                (Some((old_ip, old_entry)), Some((new_ip, new_entry))) => {
                    match old_ip.cmp(new_ip) {
                        std::cmp::Ordering::Less => {
                            changes.push(SnapshotChange::Removed(**old_ip));
                            old.next();
                        }
                        std::cmp::Ordering::Greater => {
                            changes.push(SnapshotChange::Added(**new_ip));
                            new.next();
                        }
                        std::cmp::Ordering::Equal => {
                            if !old_entry.same_as(new_entry) {
                                changes.push(SnapshotChange::Changed(**old_ip));
                            }
                            old.next();
                            new.next();
                        }
                    }
                }
            }
        }
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_reads_back_its_kind_and_displays_as_the_status_shows_it() {
        let service = Owner::service("shop", "web");
        assert_eq!(
            service.kind(),
            OwnerKind::Service {
                namespace: "shop",
                name: "web"
            }
        );
        assert_eq!(service.to_string(), "shop/web");
        assert_eq!(service.service_names(), Some(("shop", "web")));
        let group = Owner::group("api");
        assert_eq!(group.kind(), OwnerKind::Group("api"));
        assert_eq!(group.to_string(), "api");
        assert_eq!(group.service_names(), None);
        assert_eq!(std::mem::size_of::<Owner>(), std::mem::size_of::<SmolStr>());
        assert_eq!(service.heap_bytes(), 0);
        let long = Owner::service("a-namespace-of-some-length", "a-service");
        assert_eq!(
            long.heap_bytes(),
            "a-namespace-of-some-length/a-service".len()
        );
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_ip_claimed_by_two_services_is_refused_naming_both() {
        let mut snapshot = Snapshot::new();
        snapshot
            .insert(ip("192.0.2.1"), ServedIp::service("ns", "a"))
            .unwrap();
        let err = snapshot
            .insert(ip("192.0.2.1"), ServedIp::service("ns", "b"))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "IP 192.0.2.1 is claimed by both \"ns/a\" and \"ns/b\""
        );
        assert_eq!(
            snapshot
                .get(&ip("192.0.2.1"))
                .unwrap()
                .belongs_to
                .to_string(),
            "ns/a"
        );
    }

    #[test]
    fn diff_lists_added_removed_and_changed_ips_in_order() {
        let mut old = Snapshot::new();
        old.insert(ip("192.0.2.1"), ServedIp::service("ns", "a"))
            .unwrap();
        old.insert(ip("192.0.2.2"), ServedIp::service("ns", "b"))
            .unwrap();
        old.insert(ip("192.0.2.3"), ServedIp::service("ns", "c"))
            .unwrap();
        let mut new = old.clone();
        new.remove(&ip("192.0.2.1"));
        let mut local = ServedIp::service("ns", "b");
        local.ready_endpoints = Some(Arc::new(BTreeSet::from(["n1".to_string()])));
        new.insert(ip("192.0.2.2"), local).unwrap();
        new.insert(ip("2001:db8::1"), ServedIp::service("ns", "d"))
            .unwrap();
        assert_eq!(
            old.diff(&new),
            vec![
                SnapshotChange::Removed(ip("192.0.2.1")),
                SnapshotChange::Changed(ip("192.0.2.2")),
                SnapshotChange::Added(ip("2001:db8::1")),
            ]
        );
        assert!(new.diff(&new.clone()).is_empty());
    }

    #[test]
    fn node_filter_admits_only_listed_nodes() {
        let only = NodeFilter::Only(Arc::new(BTreeSet::from(["a".to_string()])));
        assert!(only.admits("a"));
        assert!(!only.admits("b"));
        assert!(NodeFilter::All.admits("b"));
    }
}
