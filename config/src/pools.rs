//! The validated pool model: what the allocator and the speakers use instead of the CRDs.
//!
//! [`validate`] converts `IPAddressPool` and `L2Advertisement` objects into a [`Model`] of parsed
//! address ranges (inclusive `u128` intervals per family), resolved selectors and advertisements
//! resolved to pool names. It is pure and collects every error, per object: a bad object is left
//! out of the model (the reconciler keeps its last valid version) and never hides the errors of
//! the others. Every error names the object and field, e.g.
//! `IPAddressPool default/pool-a: spec.addresses[2]: range 192.0.2.10-192.0.2.1 is reversed`.
//!
//! Rules: an address is a CIDR (host bits must be zero) or an inclusive `a-b` range of one
//! family; pool names are unique across namespaces (Services name pools without a namespace);
//! no address belongs to two pools or twice to one pool; when two pools overlap, the one that
//! sorts later by (namespace, name) is rejected. An advertisement with no pool names and no pool
//! selectors covers every pool; one naming a pool that does not exist is rejected.
//! Overlaps are checked against accepted pools only, so a rejected pool never causes another
//! rejection.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::crd::{IPAddressPool, L2Advertisement};
use crate::selector::{Selector, SelectorError};

/// An address family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    /// The metric label and log word: `ipv4` or `ipv6`.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        }
    }

    /// The family of an address.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// Both families, IPv4 first.
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];
}

/// An address as a number within its family.
pub fn ip_to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The address with this number in this family (IPv4 uses the low 32 bits).
pub fn u128_to_ip(family: Family, n: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(n as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(n)),
    }
}

/// Whether the address ends in `.0` or `.255` (IPv4 only; never true for IPv6).
pub fn is_buggy(family: Family, n: u128) -> bool {
    family == Family::V4 && matches!(n & 0xff, 0 | 0xff)
}

/// An inclusive interval of addresses of one family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AddressRange {
    /// The family of both ends.
    pub family: Family,
    /// The first address, as a number.
    pub start: u128,
    /// The last address, as a number (`start <= end`).
    pub end: u128,
}

impl AddressRange {
    /// Whether the address is in the range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        Family::of(ip) == self.family && (self.start..=self.end).contains(&ip_to_u128(ip))
    }

    /// The number of addresses, saturated at `u128::MAX` (only `::/0` saturates).
    pub fn len(&self) -> u128 {
        (self.end - self.start).saturating_add(1)
    }

    /// Always false: a range holds at least one address.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The number of addresses ending in `.0` or `.255` (0 for IPv6).
    pub fn buggy_count(&self) -> u128 {
        if self.family != Family::V4 {
            return 0;
        }
        // Addresses in [0, n] whose low byte is 0 or 255.
        let upto = |n: u128| (n / 256) * 2 + 1 + u128::from(n % 256 == 255);
        upto(self.end)
            - if self.start == 0 {
                0
            } else {
                upto(self.start - 1)
            }
    }
}

impl fmt::Display for AddressRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}-{}",
            u128_to_ip(self.family, self.start),
            u128_to_ip(self.family, self.end)
        )
    }
}

/// Why an address entry does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// Neither a CIDR nor a range.
    #[error("{0:?} is neither a CIDR (192.0.2.0/24) nor a range (192.0.2.1-192.0.2.9)")]
    Unparsable(String),
    /// A prefix length beyond the family's width.
    #[error("CIDR {0:?} has a prefix length longer than the address")]
    PrefixTooLong(String),
    /// A CIDR with host bits set.
    #[error("CIDR {entry:?} has host bits set (did you mean {network}?)")]
    HostBits {
        /// The entry as written.
        entry: String,
        /// The network it would mean.
        network: String,
    },
    /// Ends of different families.
    #[error("range {0} has ends of different families")]
    MixedFamilies(String),
    /// End before start.
    #[error("range {0} is reversed")]
    Reversed(String),
}

/// Parses a CIDR or an inclusive `a-b` range.
pub fn parse_addresses(entry: &str) -> Result<AddressRange, AddressError> {
    let text = entry.trim();
    let unparsable = || AddressError::Unparsable(entry.to_string());
    if let Some((a, b)) = text.split_once('-') {
        let a: IpAddr = a.trim().parse().map_err(|_| unparsable())?;
        let b: IpAddr = b.trim().parse().map_err(|_| unparsable())?;
        let shown = format!("{a}-{b}");
        if Family::of(a) != Family::of(b) {
            return Err(AddressError::MixedFamilies(shown));
        }
        let (start, end) = (ip_to_u128(a), ip_to_u128(b));
        if start > end {
            return Err(AddressError::Reversed(shown));
        }
        return Ok(AddressRange {
            family: Family::of(a),
            start,
            end,
        });
    }
    let (addr, len) = text.split_once('/').ok_or_else(unparsable)?;
    let ip: IpAddr = addr.parse().map_err(|_| unparsable())?;
    let len: u32 = len.parse().map_err(|_| unparsable())?;
    let family = Family::of(ip);
    let width = match family {
        Family::V4 => 32,
        Family::V6 => 128,
    };
    if len > width {
        return Err(AddressError::PrefixTooLong(entry.to_string()));
    }
    let host_bits = width - len;
    let host_mask: u128 = if host_bits == 128 {
        u128::MAX
    } else {
        (1u128 << host_bits) - 1
    };
    let start = ip_to_u128(ip);
    if start & host_mask != 0 {
        let network = format!("{}/{len}", u128_to_ip(family, start & !host_mask));
        return Err(AddressError::HostBits {
            entry: entry.to_string(),
            network,
        });
    }
    Ok(AddressRange {
        family,
        start,
        end: start | host_mask,
    })
}

/// A Service asking for a pool: what a pool's `serviceAllocation` is checked against.
#[derive(Clone, Copy, Debug)]
pub struct Applicant<'a> {
    /// The Service's namespace.
    pub namespace: &'a str,
    /// The labels of that namespace.
    pub namespace_labels: &'a BTreeMap<String, String>,
    /// The Service's own labels.
    pub service_labels: &'a BTreeMap<String, String>,
}

/// Which Services a pool is restricted to, and its priority.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// Lower is tried first.
    pub priority: i32,
    /// Allowed namespaces (empty: any).
    pub namespaces: BTreeSet<String>,
    /// A Service's namespace labels must match one (empty: any).
    pub namespace_selectors: Vec<Selector>,
    /// A Service's labels must match one (empty: any).
    pub service_selectors: Vec<Selector>,
}

impl Allocation {
    /// Whether a Service with these labels in this namespace may use the pool.
    pub fn admits(&self, service: &Applicant<'_>) -> bool {
        (self.namespaces.is_empty() || self.namespaces.contains(service.namespace))
            && (self.namespace_selectors.is_empty()
                || self
                    .namespace_selectors
                    .iter()
                    .any(|s| s.matches(service.namespace_labels)))
            && (self.service_selectors.is_empty()
                || self
                    .service_selectors
                    .iter()
                    .any(|s| s.matches(service.service_labels)))
    }
}

/// A checked address pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    /// The pool's name (unique across namespaces).
    pub name: String,
    /// The pool object's namespace.
    pub namespace: String,
    /// The pool object's labels (for advertisement pool selectors).
    pub labels: BTreeMap<String, String>,
    /// Disjoint ranges, sorted by family then start.
    pub ranges: Vec<AddressRange>,
    /// Whether Services that name no pool may use it.
    pub auto_assign: bool,
    /// Skip `.0` and `.255`.
    pub avoid_buggy_ips: bool,
    /// The restriction and priority, if any.
    pub allocation: Option<Allocation>,
}

impl Pool {
    /// Whether the address belongs to the pool (ignoring `avoidBuggyIPs`).
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.ranges.iter().any(|r| r.contains(ip))
    }

    /// Whether the pool may hand out this address (in a range, and not a buggy one if avoided).
    pub fn may_assign(&self, ip: IpAddr) -> bool {
        self.contains(ip) && !(self.avoid_buggy_ips && is_buggy(Family::of(ip), ip_to_u128(ip)))
    }

    /// How many addresses of the family the pool can hand out (saturating).
    pub fn size(&self, family: Family) -> u128 {
        self.ranges
            .iter()
            .filter(|r| r.family == family)
            .map(|r| {
                r.len()
                    - if self.avoid_buggy_ips {
                        r.buggy_count()
                    } else {
                        0
                    }
            })
            .fold(0u128, u128::saturating_add)
    }

    /// Whether the pool has any address of the family.
    pub fn has_family(&self, family: Family) -> bool {
        self.ranges.iter().any(|r| r.family == family)
    }

    /// Whether a Service may use the pool according to `serviceAllocation` (true when absent).
    pub fn admits(&self, service: &Applicant<'_>) -> bool {
        self.allocation.as_ref().is_none_or(|a| a.admits(service))
    }
}

/// A checked L2 advertisement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Advertisement {
    /// The object's name.
    pub name: String,
    /// The object's namespace.
    pub namespace: String,
    /// The pools it announces, by name.
    pub pools: BTreeSet<String>,
    /// Nodes that may announce: one must match (empty: all).
    pub node_selectors: Vec<Selector>,
    /// Interfaces to announce on (empty: all).
    pub interfaces: Vec<String>,
    /// Services announced: one must match (empty: all).
    pub service_selectors: Vec<Selector>,
    /// Weighted node preferences (`preferredNodeSelectors`), in the order written.
    pub preferred_nodes: Vec<Preference>,
}

/// One weighted node preference of an advertisement: nodes the selector matches score
/// `weight`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preference {
    /// The weight, 1 to 100.
    pub weight: u8,
    /// The nodes it is given to.
    pub selector: Selector,
}

/// The range of a preference weight, as MetalLB's CRD declares it.
pub const PREFERENCE_WEIGHTS: std::ops::RangeInclusive<i32> = 1..=100;

/// The checked configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Model {
    /// Valid pools by name.
    pub pools: BTreeMap<String, Pool>,
    /// Valid advertisements, sorted by (namespace, name).
    pub advertisements: Vec<Advertisement>,
}

/// The kind of object an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectKind {
    /// An `IPAddressPool`.
    IPAddressPool,
    /// An `L2Advertisement`.
    L2Advertisement,
}

impl ObjectKind {
    /// The Kubernetes kind.
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::IPAddressPool => "IPAddressPool",
            ObjectKind::L2Advertisement => "L2Advertisement",
        }
    }
}

/// What is wrong with one field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// A bad address entry.
    #[error(transparent)]
    Address(#[from] AddressError),
    /// A bad label selector.
    #[error(transparent)]
    Selector(#[from] SelectorError),
    /// The pool has no addresses.
    #[error("the pool has no addresses")]
    NoAddresses,
    /// Another pool of the same name exists in another namespace.
    #[error("the pool name is also used by {0}; pool names must be unique")]
    DuplicateName(String),
    /// Addresses shared with another entry of the same pool.
    #[error("{range} overlaps {other}")]
    SelfOverlap {
        /// The overlapping range.
        range: String,
        /// The field it overlaps.
        other: String,
    },
    /// Addresses shared with another pool.
    #[error("{range} overlaps pool {pool} ({other})")]
    PoolOverlap {
        /// The overlapping range.
        range: String,
        /// The other pool.
        pool: String,
        /// The other pool's range.
        other: String,
    },
    /// A preference weight outside [`PREFERENCE_WEIGHTS`].
    #[error("weight {0} is outside 1..=100")]
    WeightOutOfRange(i32),
    /// An advertisement names a pool that does not exist.
    #[error("unknown IPAddressPool {0:?}")]
    UnknownPool(String),
    /// Metadata without a name.
    #[error("the object has no name")]
    NoName,
}

/// One configuration error, naming the object and field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{} {namespace}/{name}: {field}: {problem}", kind.as_str())]
pub struct ConfigError {
    /// The object's kind.
    pub kind: ObjectKind,
    /// The object's namespace.
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// The field, e.g. `spec.addresses[2]`.
    pub field: String,
    /// What is wrong.
    pub problem: Problem,
}

/// The result of [`validate`]: the valid objects, and every error of the others.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Validated {
    /// The valid objects.
    pub model: Model,
    /// Every error: pools (by namespace and name) before advertisements. An object with an
    /// error is not in the model.
    pub errors: Vec<ConfigError>,
}

impl Validated {
    /// The model when there is no error, else every error.
    pub fn into_result(self) -> Result<Model, Vec<ConfigError>> {
        if self.errors.is_empty() {
            Ok(self.model)
        } else {
            Err(self.errors)
        }
    }
}

fn parse_selectors(
    selectors: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector],
    field: &str,
    mut report: impl FnMut(String, Problem),
) -> Vec<Selector> {
    let mut out = Vec::new();
    for (i, s) in selectors.iter().enumerate() {
        match Selector::parse(s) {
            Ok(s) => out.push(s),
            Err(errors) => {
                for e in errors {
                    report(format!("{field}[{i}]"), Problem::Selector(e));
                }
            }
        }
    }
    out
}

/// The errors of one object, as they are found.
struct Report {
    kind: ObjectKind,
    namespace: String,
    name: String,
    errors: Vec<ConfigError>,
}

impl Report {
    /// An empty report on `metadata`'s object of `kind`.
    fn new(kind: ObjectKind, metadata: &ObjectMeta) -> Report {
        Report {
            kind,
            namespace: metadata.namespace.clone().unwrap_or_default(),
            name: metadata.name.clone().unwrap_or_default(),
            errors: Vec::new(),
        }
    }

    fn add(&mut self, field: impl Into<String>, problem: Problem) {
        self.errors.push(ConfigError {
            kind: self.kind,
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            field: field.into(),
            problem,
        });
    }
}

/// `objects` in (namespace, name) order, so "the later one" of a conflict is well defined.
fn in_name_order<T: kube::Resource>(objects: &[T]) -> Vec<&T> {
    let mut ordered: Vec<&T> = objects.iter().collect();
    ordered.sort_by(|a, b| {
        let key = |o: &T| {
            let meta = o.meta();
            (meta.namespace.clone(), meta.name.clone())
        };
        key(a).cmp(&key(b))
    });
    ordered
}

/// Converts pools and advertisements into the checked model, collecting every error.
pub fn validate(pools: &[IPAddressPool], advertisements: &[L2Advertisement]) -> Validated {
    let mut errors = Vec::new();
    let mut candidates: Vec<(Pool, Vec<String>)> = Vec::new();
    let mut seen_names: BTreeMap<String, String> = BTreeMap::new();
    for obj in in_name_order(pools) {
        match check_pool(obj, &mut seen_names) {
            Ok(candidate) => candidates.push(candidate),
            Err(own) => errors.extend(own),
        }
    }
    let mut model = Model::default();
    for pool in accept_pools(&candidates, &mut errors) {
        model.pools.insert(pool.name.clone(), pool);
    }
    let pool_labels: Vec<(String, BTreeMap<String, String>)> = pools
        .iter()
        .filter_map(|p| {
            Some((
                p.metadata.name.clone()?,
                p.metadata.labels.clone().unwrap_or_default(),
            ))
        })
        .collect();
    for obj in in_name_order(advertisements) {
        match check_advertisement(obj, &pool_labels) {
            Ok(advertisement) => model.advertisements.push(advertisement),
            Err(own) => errors.extend(own),
        }
    }
    Validated { model, errors }
}

/// One pool on its own: its name (unique across namespaces: `seen_names`, name to
/// namespace), its ranges (none overlapping another of the pool), its allocation. `Ok`: the
/// pool and the field of each of its ranges, in range order.
fn check_pool(
    obj: &IPAddressPool,
    seen_names: &mut BTreeMap<String, String>,
) -> Result<(Pool, Vec<String>), Vec<ConfigError>> {
    let mut report = Report::new(ObjectKind::IPAddressPool, &obj.metadata);
    let (namespace, name) = (report.namespace.clone(), report.name.clone());
    if name.is_empty() {
        report.add("metadata.name", Problem::NoName);
    } else if let Some(first) = seen_names.get(&name) {
        report.add(
            "metadata.name",
            Problem::DuplicateName(format!("{first}/{name}")),
        );
    } else {
        seen_names.insert(name.clone(), namespace.clone());
    }
    let mut ranges = Vec::new();
    for (i, entry) in obj.spec.addresses.iter().enumerate() {
        match parse_addresses(entry) {
            Ok(r) => ranges.push((r, format!("spec.addresses[{i}]"))),
            Err(e) => report.add(format!("spec.addresses[{i}]"), e.into()),
        }
    }
    if obj.spec.addresses.is_empty() {
        report.add("spec.addresses", Problem::NoAddresses);
    }
    ranges.sort();
    for pair in ranges.windows(2) {
        let ((a, fa), (b, fb)) = (&pair[0], &pair[1]);
        if a.family == b.family && b.start <= a.end {
            let (later, earlier) = if fa > fb { (fa, fb) } else { (fb, fa) };
            let range = if fa > fb { a } else { b };
            report.add(
                later.clone(),
                Problem::SelfOverlap {
                    range: range.to_string(),
                    other: earlier.clone(),
                },
            );
        }
    }
    let allocation = obj.spec.service_allocation.as_ref().map(|sa| Allocation {
        priority: sa.priority,
        namespaces: sa.namespaces.iter().cloned().collect(),
        namespace_selectors: parse_selectors(
            &sa.namespace_selectors,
            "spec.serviceAllocation.namespaceSelectors",
            |f, p| report.add(f, p),
        ),
        service_selectors: parse_selectors(
            &sa.service_selectors,
            "spec.serviceAllocation.serviceSelectors",
            |f, p| report.add(f, p),
        ),
    });
    if !report.errors.is_empty() {
        return Err(report.errors);
    }
    let (ranges, fields): (Vec<_>, Vec<_>) = ranges.into_iter().unzip();
    let pool = Pool {
        name,
        namespace,
        labels: obj.metadata.labels.clone().unwrap_or_default(),
        ranges,
        auto_assign: obj.spec.auto_assign,
        avoid_buggy_ips: obj.spec.avoid_buggy_ips,
        allocation,
    };
    Ok((pool, fields))
}

/// Overlaps between pools: pools are taken in (namespace, name) order, and one that overlaps
/// an already accepted pool is rejected (so a rejected pool never causes another rejection).
/// Accepted ranges are kept by (family, start); two accepted ranges never overlap, so the one
/// starting at or before a range's end, nearest to it, is the only candidate to check.
fn accept_pools(candidates: &[(Pool, Vec<String>)], errors: &mut Vec<ConfigError>) -> Vec<Pool> {
    let mut accepted: BTreeMap<(Family, u128), (u128, usize)> = BTreeMap::new();
    let mut pools = Vec::new();
    for (i, (pool, fields)) in candidates.iter().enumerate() {
        let overlap = pool.ranges.iter().zip(fields).find_map(|(range, field)| {
            let (&(family, start), &(end, owner)) = accepted
                .range((range.family, 0)..=(range.family, range.end))
                .next_back()
                .filter(|(_, (end, _))| *end >= range.start)?;
            Some((field, range, owner, AddressRange { family, start, end }))
        });
        let Some((field, range, owner, other)) = overlap else {
            for range in &pool.ranges {
                accepted.insert((range.family, range.start), (range.end, i));
            }
            pools.push(pool.clone());
            continue;
        };
        let owner = &candidates[owner].0;
        errors.push(ConfigError {
            kind: ObjectKind::IPAddressPool,
            namespace: pool.namespace.clone(),
            name: pool.name.clone(),
            field: field.clone(),
            problem: Problem::PoolOverlap {
                range: range.to_string(),
                pool: format!("{}/{}", owner.namespace, owner.name),
                other: other.to_string(),
            },
        });
    }
    pools
}

/// One advertisement: the pools it selects (by name among every pool, valid or not, or by
/// label; every pool when it names none), its selectors and preferences.
fn check_advertisement(
    obj: &L2Advertisement,
    pool_labels: &[(String, BTreeMap<String, String>)],
) -> Result<Advertisement, Vec<ConfigError>> {
    let mut report = Report::new(ObjectKind::L2Advertisement, &obj.metadata);
    if report.name.is_empty() {
        report.add("metadata.name", Problem::NoName);
    }
    let mut selected = BTreeSet::new();
    for (i, pool) in obj.spec.ip_address_pools.iter().enumerate() {
        if pool_labels.iter().any(|(name, _)| name == pool) {
            selected.insert(pool.clone());
        } else {
            report.add(
                format!("spec.ipAddressPools[{i}]"),
                Problem::UnknownPool(pool.clone()),
            );
        }
    }
    let pool_selectors = parse_selectors(
        &obj.spec.ip_address_pool_selectors,
        "spec.ipAddressPoolSelectors",
        |f, p| report.add(f, p),
    );
    for (pool, labels) in pool_labels {
        if pool_selectors.iter().any(|s| s.matches(labels)) {
            selected.insert(pool.clone());
        }
    }
    if obj.spec.ip_address_pools.is_empty() && obj.spec.ip_address_pool_selectors.is_empty() {
        selected = pool_labels.iter().map(|(name, _)| name.clone()).collect();
    }
    let node_selectors = parse_selectors(&obj.spec.node_selectors, "spec.nodeSelectors", |f, p| {
        report.add(f, p)
    });
    let service_selectors = parse_selectors(
        &obj.spec.service_selectors,
        "spec.serviceSelectors",
        |f, p| report.add(f, p),
    );
    let preferred_nodes = preferences(obj, &mut report);
    if !report.errors.is_empty() {
        return Err(report.errors);
    }
    Ok(Advertisement {
        name: report.name,
        namespace: report.namespace,
        pools: selected,
        node_selectors,
        interfaces: obj.spec.interfaces.clone(),
        service_selectors,
        preferred_nodes,
    })
}

/// An advertisement's `preferredNodeSelectors`, each with a weight MetalLB accepts.
fn preferences(obj: &L2Advertisement, report: &mut Report) -> Vec<Preference> {
    let mut preferred_nodes = Vec::new();
    for (i, preferred) in obj.spec.preferred_node_selectors.iter().enumerate() {
        let weight = u8::try_from(preferred.weight)
            .ok()
            .filter(|_| PREFERENCE_WEIGHTS.contains(&preferred.weight));
        if weight.is_none() {
            report.add(
                format!("spec.preferredNodeSelectors[{i}].weight"),
                Problem::WeightOutOfRange(preferred.weight),
            );
        }
        let selector = match Selector::parse(&preferred.preference) {
            Ok(selector) => Some(selector),
            Err(errors) => {
                for e in errors {
                    report.add(
                        format!("spec.preferredNodeSelectors[{i}].preference"),
                        Problem::Selector(e),
                    );
                }
                None
            }
        };
        if let (Some(weight), Some(selector)) = (weight, selector) {
            preferred_nodes.push(Preference { weight, selector });
        }
    }
    preferred_nodes
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, rng_seed: proptest::test_runner::RngSeed::Fixed(6), ..ProptestConfig::default() })]

        #[test]
        fn parsing_any_text_never_panics(text in "\\PC{0,40}") {
            let _ = parse_addresses(&text);
        }

        #[test]
        fn parsing_address_like_text_never_panics(text in "[0-9a-f:./ -]{0,45}") {
            let _ = parse_addresses(&text);
        }

        #[test]
        fn a_cidr_covers_exactly_its_network(addr in any::<u32>(), len in 0u32..=32) {
            let mask: u32 = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            let network = Ipv4Addr::from(addr & mask);
            let r = parse_addresses(&format!("{network}/{len}")).expect("a network parses");
            prop_assert_eq!(r.family, Family::V4);
            prop_assert_eq!(r.start, u128::from(addr & mask));
            prop_assert_eq!(r.len(), 1u128 << (32 - len));
            prop_assert!(r.contains(IpAddr::V4(Ipv4Addr::from(addr))));
        }

        #[test]
        fn a_range_round_trips_through_its_display(a in any::<u128>(), b in any::<u128>()) {
            let (start, end) = (a.min(b), a.max(b));
            let r = AddressRange { family: Family::V6, start, end };
            prop_assert_eq!(parse_addresses(&r.to_string()), Ok(r));
        }
    }
}
