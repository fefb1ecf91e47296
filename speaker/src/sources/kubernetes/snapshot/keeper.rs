//! The snapshot kept up to date one object at a time: what a watch event costs is what the
//! changed object touches, not the whole cluster.
//!
//! A [`Keeper`] holds the configuration resolved against the Nodes, each Service's claim on its
//! IPs (its entries, or what was left out of it), which Services hold each IP, and the
//! resulting [`Snapshot`]. [`Keeper::set_service`] replaces one Service's claim and settles only
//! its IPs; [`Keeper::index_slice`] follows an EndpointSlice to the Service it belongs to;
//! [`Keeper::set_config`] re-resolves the pools, advertisements and Nodes and says whether any
//! Service must be claimed again (a Node's heartbeat or image list changes nothing: only its
//! labels and its `NetworkUnavailable` condition count). What changed since the last
//! [`Keeper::take_changes`] is collected as [`Changes`]: the IPs whose entry differs, and the
//! drops that appeared and went, so that each is logged once, not on every event.
//!
//! Pure, as [`build`](super::build) is: no I/O, no clock, no logging. The same objects given in
//! any order, by any sequence of calls, leave the same snapshot and the same drops as
//! [`build`](super::build) over them (a property test checks it).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use smol_str::SmolStr;
use swimlb_config::crd::{IPAddressPool, L2Advertisement};
use swimlb_config::pools::{ObjectKind, validate};
use swimlb_config::service::ServiceKey;

use super::super::views::{ServiceView, SliceView};
use super::{
    Built, Caches, Dropped, NO_LABELS, NodeFacts, Options, Placement, Resolved, allows_shared_ip,
    can_announce, is_ours, key_of, merge_ready, slices_by_service,
};
use crate::model::snapshot::{ServedIp, Snapshot};

/// One Service's claim: its IPs and their entry (none when it is left out: every IP of a
/// Service has the same entry) and what was left out of it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Claim {
    shares: bool,
    ips: Vec<IpAddr>,
    entry: Option<Arc<ServedIp>>,
    dropped: Vec<Dropped>,
}

/// What changed since the last [`Keeper::take_changes`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// The IPs whose snapshot entry was added, removed or changed.
    pub ips: BTreeSet<IpAddr>,
    /// Drops that appeared.
    pub dropped: Vec<Dropped>,
    /// Drops that went (the object was fixed, deleted or is served again).
    pub restored: Vec<Dropped>,
}

impl Changes {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.ips.is_empty() && self.dropped.is_empty() && self.restored.is_empty()
    }

    /// Notes what went from `before` to `after`, netted against what is noted already: a drop
    /// that appears and goes between two [`Keeper::take_changes`] is not reported at all.
    fn drops(&mut self, before: &[Dropped], after: &[Dropped]) {
        for gone in before.iter().filter(|d| !after.contains(d)) {
            match self.dropped.iter().position(|d| d == gone) {
                Some(at) => {
                    self.dropped.swap_remove(at);
                }
                None => self.restored.push(gone.clone()),
            }
        }
        for new in after.iter().filter(|d| !before.contains(d)) {
            match self.restored.iter().position(|d| d == new) {
                Some(at) => {
                    self.restored.swap_remove(at);
                }
                None => self.dropped.push(new.clone()),
            }
        }
    }
}

/// Which EndpointSlices belong to which Service (by the `kubernetes.io/service-name` label).
#[derive(Debug, Default)]
struct SliceIndex {
    /// (namespace, slice name) -> Service name (`SmolStr`s: most are inline).
    service_of: HashMap<(SmolStr, SmolStr), SmolStr>,
    /// Service -> slice names, in name order (mostly one: a small vector).
    slices_of: HashMap<ServiceKey, Vec<SmolStr>>,
}

impl SliceIndex {
    /// The slice `namespace/name` now belongs to `service` (`None`: deleted or unlabelled).
    /// Returns the Services whose slices changed (the former and the new one).
    fn set(&mut self, namespace: &str, name: &str, service: Option<&str>) -> Vec<ServiceKey> {
        let slice = (SmolStr::new(namespace), SmolStr::new(name));
        let before = match service {
            Some(service) => self.service_of.insert(slice, SmolStr::new(service)),
            None => self.service_of.remove(&slice),
        };
        let mut touched = Vec::new();
        if let Some(before) = before {
            let key = ServiceKey::new(namespace, before);
            if let Some(names) = self.slices_of.get_mut(&key) {
                if let Ok(at) = names.binary_search_by(|n| n.as_str().cmp(name)) {
                    names.remove(at);
                }
                if names.is_empty() {
                    self.slices_of.remove(&key);
                }
            }
            touched.push(key);
        }
        if let Some(service) = service {
            let key = ServiceKey::new(namespace, service);
            let names = self
                .slices_of
                .entry(key.clone())
                .or_insert_with(|| Vec::with_capacity(1));
            if let Err(at) = names.binary_search_by(|n| n.as_str().cmp(name)) {
                names.insert(at, SmolStr::new(name));
            }
            if !touched.contains(&key) {
                touched.push(key);
            }
        }
        touched
    }
}

/// The snapshot, kept up to date object by object (module docs).
#[derive(Debug)]
pub struct Keeper {
    options: Options,
    config: Resolved,
    config_dropped: Vec<Dropped>,
    /// Placements by set of applicable advertisements, shared by the Services with that set
    /// until the configuration changes.
    placements: HashMap<Vec<usize>, Placement>,
    services: BTreeMap<ServiceKey, Claim>,
    /// The Services holding each IP, in (namespace, name) order (mostly one: a small vector).
    holders: BTreeMap<IpAddr, Vec<ServiceKey>>,
    conflicts: BTreeMap<IpAddr, Vec<Dropped>>,
    slices: SliceIndex,
    snapshot: Snapshot,
    changes: Changes,
}

impl Keeper {
    /// An empty keeper: no configuration, nothing served.
    pub fn new(options: Options) -> Keeper {
        Keeper {
            options,
            config: Resolved::default(),
            config_dropped: Vec::new(),
            placements: HashMap::new(),
            services: BTreeMap::new(),
            holders: BTreeMap::new(),
            conflicts: BTreeMap::new(),
            slices: SliceIndex::default(),
            snapshot: Snapshot::new(),
            changes: Changes::default(),
        }
    }

    /// What should be served now.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// Everything left out now, in [`Built::dropped`]'s order.
    pub fn dropped(&self) -> impl Iterator<Item = &Dropped> {
        self.config_dropped
            .iter()
            .chain(self.services.values().flat_map(|c| c.dropped.iter()))
            .chain(self.conflicts.values().flatten())
    }

    /// The snapshot and the drops, as [`build`](super::build) returns them.
    pub fn built(&self) -> Built {
        Built {
            snapshot: self.snapshot.clone(),
            dropped: self.dropped().cloned().collect(),
        }
    }

    /// The Services claimed now (ours, with or without entries).
    pub fn services(&self) -> impl Iterator<Item = &ServiceKey> {
        self.services.keys()
    }

    /// The names of the EndpointSlices of `service`, in name order.
    pub fn slices_of(&self, service: &ServiceKey) -> impl Iterator<Item = &str> {
        self.slices
            .slices_of
            .get(service)
            .into_iter()
            .flatten()
            .map(SmolStr::as_str)
    }

    /// The interfaces named by the valid advertisements that cover `node` (its candidates
    /// include it), as (advertisement `namespace/name`, interface).
    pub fn named_interfaces(&self, node: &str) -> BTreeSet<(String, String)> {
        let mut named = BTreeSet::new();
        for (ad, resolved) in self
            .config
            .model
            .advertisements
            .iter()
            .zip(&self.config.ads)
        {
            if !resolved.nodes.contains(node) {
                continue;
            }
            for interface in &ad.interfaces {
                named.insert((format!("{}/{}", ad.namespace, ad.name), interface.clone()));
            }
        }
        named
    }

    /// What changed since the last call.
    pub fn take_changes(&mut self) -> Changes {
        std::mem::take(&mut self.changes)
    }

    /// Every object at once (the start, a watch's re-list): the configuration, the slice
    /// index and every Service's claim are set again; only what differs is in the changes.
    pub fn resync(&mut self, caches: Caches<'_>) {
        self.set_config(caches.pools, caches.advertisements, caches.nodes);
        self.reindex_slices(caches.endpoint_slices.iter().map(|slice| {
            (
                slice.metadata.namespace.as_deref().unwrap_or_default(),
                slice.metadata.name.as_deref().unwrap_or_default(),
                slice.service(),
            )
        }));
        let slices = slices_by_service(caches.endpoint_slices);
        let mut services: Vec<(ServiceKey, &ServiceView)> =
            caches.services.iter().map(|s| (key_of(s), *s)).collect();
        services.sort_by(|a, b| a.0.cmp(&b.0));
        let present: BTreeSet<&ServiceKey> = services.iter().map(|(k, _)| k).collect();
        self.forget_services_but(&present);
        for (key, svc) in &services {
            let slices = slices
                .get(&(key.namespace.as_str(), key.name.as_str()))
                .map_or(&[][..], Vec::as_slice);
            self.set_service(key, Some(svc), slices);
        }
    }

    /// Replaces the slice index with `slices`, as (namespace, name, Service) (a re-list's
    /// first step; the Services are set again after it).
    pub fn reindex_slices<'a>(
        &mut self,
        slices: impl IntoIterator<Item = (&'a str, &'a str, Option<&'a str>)>,
    ) {
        self.slices = SliceIndex::default();
        for (namespace, name, service) in slices {
            self.slices.set(namespace, name, service);
        }
    }

    /// Sets every claimed Service that is not in `present` as deleted (a re-list's step
    /// before the present ones are set again).
    pub fn forget_services_but(&mut self, present: &BTreeSet<&ServiceKey>) {
        let gone: Vec<ServiceKey> = self
            .services
            .keys()
            .filter(|k| !present.contains(k))
            .cloned()
            .collect();
        for key in gone {
            self.set_service(&key, None, &[]);
        }
    }

    /// Resolves the pools and advertisements against the Nodes. Returns whether the result
    /// differs from the one in force: then every Service must be set again (with
    /// [`Keeper::set_service`]) before the snapshot is right.
    pub fn set_config(
        &mut self,
        pools: &[&IPAddressPool],
        advertisements: &[&L2Advertisement],
        nodes: &[&Node],
    ) -> bool {
        let pools: Vec<IPAddressPool> = pools.iter().map(|p| (*p).clone()).collect();
        let ads: Vec<L2Advertisement> = advertisements.iter().map(|a| (*a).clone()).collect();
        let validated = validate(&pools, &ads);
        let dropped: Vec<Dropped> = validated
            .errors
            .into_iter()
            .map(|e| match e.kind {
                ObjectKind::IPAddressPool => Dropped::InvalidPool(e),
                ObjectKind::L2Advertisement => Dropped::InvalidAdvertisement(e),
            })
            .collect();
        self.changes.drops(&self.config_dropped, &dropped);
        self.config_dropped = dropped;
        let facts: Vec<NodeFacts<'_>> = nodes
            .iter()
            .filter_map(|node| {
                let name = node.metadata.name.as_deref()?;
                let labels = node.metadata.labels.as_ref().unwrap_or(&NO_LABELS);
                Some((name, labels, can_announce(node, &self.options)))
            })
            .collect();
        let resolved = Resolved::new(validated.model, &facts);
        if resolved.same_as(&self.config) {
            return false;
        }
        self.config = resolved;
        self.placements.clear();
        true
    }

    /// The EndpointSlice `namespace/name` now belongs to `service` (its
    /// `kubernetes.io/service-name` label; `None`: deleted or unlabelled). Returns the
    /// Services to set again.
    pub fn index_slice(
        &mut self,
        namespace: &str,
        name: &str,
        service: Option<&str>,
    ) -> Vec<ServiceKey> {
        self.slices.set(namespace, name, service)
    }

    /// Replaces the claim of the Service `key` (`None`: deleted) with what `svc` and its
    /// EndpointSlices `slices` (in name order) say, and settles its IPs.
    pub fn set_service(
        &mut self,
        key: &ServiceKey,
        svc: Option<&ServiceView>,
        slices: &[&SliceView],
    ) {
        let claim = svc.filter(|s| is_ours(s, &self.options)).map(|svc| {
            let mut dropped = Vec::new();
            let served = self
                .config
                .serve(key, svc, slices, &mut self.placements, &mut dropped);
            let (ips, entry) = match served {
                Some((ips, entry)) => (ips, Some(Arc::new(entry))),
                None => (Vec::new(), None),
            };
            Claim {
                shares: allows_shared_ip(svc),
                ips,
                entry,
                dropped,
            }
        });
        if self.services.get(key) == claim.as_ref() {
            return;
        }
        let before = match claim {
            Some(claim) => self.services.insert(key.clone(), claim),
            None => self.services.remove(key),
        };
        let no_drops = Vec::new();
        let after_drops = self.services.get(key).map_or(&no_drops, |c| &c.dropped);
        let before_drops = before.as_ref().map_or(&no_drops, |c| &c.dropped);
        self.changes.drops(before_drops, after_drops);
        let before_ips: BTreeSet<IpAddr> =
            before.iter().flat_map(|c| c.ips.iter().copied()).collect();
        let after_ips: BTreeSet<IpAddr> = self
            .services
            .get(key)
            .into_iter()
            .flat_map(|c| c.ips.iter().copied())
            .collect();
        for ip in before_ips.difference(&after_ips) {
            if let Some(holders) = self.holders.get_mut(ip) {
                if let Ok(at) = holders.binary_search(key) {
                    holders.remove(at);
                }
                if holders.is_empty() {
                    self.holders.remove(ip);
                }
            }
        }
        for ip in &after_ips {
            // Mostly one holder: no room for more until needed.
            let holders = self
                .holders
                .entry(*ip)
                .or_insert_with(|| Vec::with_capacity(1));
            if let Err(at) = holders.binary_search(key) {
                holders.insert(at, key.clone());
            }
        }
        for ip in before_ips.union(&after_ips) {
            self.settle(*ip);
        }
    }

    /// Brings `ip`'s snapshot entry and conflicts to what its holders say: the first holder's
    /// entry, with the endpoints of the others merged and their names in
    /// [`ServedIp::shared_with`] when every one allows sharing.
    fn settle(&mut self, ip: IpAddr) {
        let mut conflicts = Vec::new();
        let mut shared_with = Vec::new();
        let entry = self.holders.get(&ip).and_then(|holders| {
            let mut holders = holders.iter();
            let first_key = holders.next()?;
            let first = self.services.get(first_key)?;
            let mut entry = entry_of(first, ip)?.clone();
            for other_key in holders {
                let Some(other) = self.services.get(other_key) else {
                    continue;
                };
                if first.shares && other.shares {
                    let theirs = entry_of(other, ip).and_then(|e| e.ready_endpoints.clone());
                    let entry = Arc::make_mut(&mut entry);
                    entry.ready_endpoints = merge_ready(entry.ready_endpoints.take(), theirs);
                    shared_with.push(other_key.to_string());
                } else {
                    conflicts.push(Dropped::IpConflict {
                        ip,
                        kept: first_key.to_string(),
                        dropped: other_key.to_string(),
                    });
                }
            }
            if !shared_with.is_empty() {
                Arc::make_mut(&mut entry).shared_with =
                    Some(std::mem::take(&mut shared_with).into_boxed_slice());
            }
            Some(entry)
        });
        if self.snapshot.get_shared(&ip) != entry.as_ref() {
            self.snapshot.remove(&ip);
            if let Some(entry) = entry {
                // Removed just before: the IP is free.
                let _ = self.snapshot.insert(ip, entry);
            }
            self.changes.ips.insert(ip);
        }
        let before = self.conflicts.remove(&ip).unwrap_or_default();
        self.changes.drops(&before, &conflicts);
        if !conflicts.is_empty() {
            self.conflicts.insert(ip, conflicts);
        }
    }
}

/// The entry `claim` has for `ip`.
fn entry_of(claim: &Claim, ip: IpAddr) -> Option<&Arc<ServedIp>> {
    claim.entry.as_ref().filter(|_| claim.ips.contains(&ip))
}
