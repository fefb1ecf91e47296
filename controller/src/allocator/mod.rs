//! The pure allocator: which addresses a LoadBalancer Service gets from the pools.
//!
//! [`Allocator::assign`] takes a plain [`ServiceView`] and returns a typed [`Verdict`]; it never
//! logs, awaits or reads a clock. It follows MetalLB's semantics:
//!
//! - Only Services of type LoadBalancer whose `loadBalancerClass` equals the class the
//!   allocator serves (both absent by default) are ours; a Service that stops being ours loses
//!   its addresses.
//! - A request names addresses with `spec.loadBalancerIP` or the `loadBalancerIPs` annotation
//!   (comma separated, one per family), a pool with `address-pool`, and a sharing key with
//!   `allow-shared-ip`; each annotation is read under `swimlb.io/`, `metallb.io/` and
//!   `metallb.universe.tf/`, and spellings that disagree are an error.
//! - `ipFamilies` and `ipFamilyPolicy` decide the families: one address per family for dual
//!   stack, all from one pool. RequireDualStack needs a pool with both families.
//! - Without a named pool or address, pools with `serviceAllocation` that admit the Service are
//!   tried first: those with a priority > 0 by ascending priority, then those without one, each
//!   by name; then the other auto-assign pools by name (MetalLB's order); the first
//!   pool that can serve every family wins and gives its lowest free address (skipping `.0` and
//!   `.255` with `avoidBuggyIPs`).
//! - A Service whose current addresses still satisfy its request keeps them ([`Verdict::Unchanged`]
//!   when its status already shows them). Otherwise, it gets its status addresses back when they
//!   are valid and free, else new ones.
//! - Two Services share an address only with the same sharing key, no common (port, protocol)
//!   pair, and the same backend: the same external traffic policy and, for `Local`, the same
//!   selector.
//! - An error leaves the Service without addresses (it released what it held).
//! - Addresses outside every pool in force are never taken away because of the pools: a
//!   Service keeps them ([`Verdict::Kept`]) while its pool is invalid or gone (also across a
//!   restart, where they are loaded as they are), until the Service asks for other addresses
//!   or another pool. A pool that is in force and shrinks under a held address moves the
//!   Service, as MetalLB does.
//!
//! Guarantees: nothing is assigned before [`Allocator::load_existing`] has run (a restart never
//! hands out an address an existing Service shows); an address is held by at most one Service unless all its holders may share it;
//! [`Allocator::load_existing`] rebuilds state from Service statuses without handing any address
//! twice; the same inputs in the same order give the same outputs. Finding the lowest free
//! address costs O(log n) amortised: each range keeps the set of used offsets and a cursor below
//! which every address is used.
//!
//! Parts: `request` reads what a Service asks for (pure parsing), `ranges` keeps each pool's used
//! addresses, `verdict` holds the answers; this module decides.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use swimlb_config::pools::{Family, Model, Pool, ip_to_u128};
use swimlb_config::service::{ServiceKey, ServiceView};

mod ranges;
mod request;
mod verdict;

pub use request::ANNOTATION_PREFIXES;
pub use verdict::{AllocationError, ErrorReason, NotOurs, Verdict};

use ranges::PoolState;
use request::{Request, Sharing, families_for, families_match, parse_request};

/// Where a pool stands in automatic allocation, MetalLB's order (smaller first): pools with a
/// `serviceAllocation` of priority > 0 by ascending priority (1 is the highest), then those
/// with a `serviceAllocation` without priority (0), then the pools without one. Ties by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum PoolRank {
    Prioritised(i32),
    AllocatedWithoutPriority,
    Plain,
}

impl PoolRank {
    fn of(pool: &Pool) -> Self {
        match &pool.allocation {
            Some(a) if a.priority > 0 => PoolRank::Prioritised(a.priority),
            Some(_) => PoolRank::AllocatedWithoutPriority,
            None => PoolRank::Plain,
        }
    }
}

/// How [`Allocator::decide`] satisfied a Service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decision {
    /// It holds addresses of a pool in force.
    Held,
    /// It keeps addresses that no pool in force has.
    Kept,
}

/// A problem found while loading existing assignments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadConflict {
    /// The Service whose status could not be honoured.
    pub service: ServiceKey,
    /// Why.
    pub error: AllocationError,
}

#[derive(Clone, Debug)]
struct Holding {
    /// The pool the addresses come from; `None` when loaded from a status outside every pool.
    pool: Option<String>,
    ips: Vec<IpAddr>,
    sharing: Sharing,
    /// What the Service asked for when it got them (named addresses, named pool): a Service
    /// kept outside the pools moves only when this changes.
    asked: (Vec<IpAddr>, Option<String>),
}

/// The addresses a pool has and hands out, per family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolUsage {
    /// The pool.
    pub pool: String,
    /// The family.
    pub family: Family,
    /// How many addresses it can hand out.
    pub size: u128,
    /// How many are held.
    pub in_use: u128,
}

/// The allocator's state: pools, who holds what.
#[derive(Clone, Debug, Default)]
pub struct Allocator {
    class: Option<String>,
    pools: BTreeMap<String, PoolState>,
    holdings: HashMap<ServiceKey, Holding>,
    holders: HashMap<IpAddr, Vec<ServiceKey>>,
    /// Sharing key -> addresses held under it.
    shared: HashMap<String, BTreeSet<IpAddr>>,
    /// Whether [`Allocator::load_existing`] has run; until then nothing is assigned.
    loaded: bool,
}

impl Allocator {
    /// An allocator serving Services whose `loadBalancerClass` equals `class` (`None`: Services
    /// without a class), with the pools of `model`. It assigns nothing until
    /// [`Allocator::load_existing`] has run.
    pub fn new(class: Option<String>, model: &Model) -> Self {
        let mut a = Self {
            class,
            ..Self::default()
        };
        a.set_pools(model);
        a
    }

    /// Replaces the pools. Holdings stay; the used sets are rebuilt. A holding outside every
    /// new pool keeps its address until [`Allocator::assign`] looks at its Service again.
    pub fn set_pools(&mut self, model: &Model) {
        self.pools = model
            .pools
            .values()
            .map(|p| (p.name.clone(), PoolState::new(p.clone())))
            .collect();
        let mut moved = Vec::new();
        for (key, holding) in &self.holdings {
            let pool = self
                .pools
                .values()
                .find(|p| holding.ips.iter().all(|ip| p.pool.contains(*ip)));
            if let Some(p) = pool {
                moved.push((key.clone(), p.pool.name.clone()));
            }
        }
        for (key, pool) in moved {
            if let Some(h) = self.holdings.get_mut(&key) {
                h.pool = Some(pool);
            }
        }
        for ip in self.holders.keys() {
            for state in self.pools.values_mut() {
                if let Some(r) = state.range_of(*ip) {
                    r.used.insert(ip_to_u128(*ip));
                }
            }
        }
    }

    /// Rebuilds holdings from the statuses of existing Services, before anything new is
    /// allocated. Services are taken in (namespace, name) order; a Service whose status cannot
    /// be honoured (its addresses are invalid, held by a Service that may not share them, or
    /// refused by the pool that has them) holds nothing and is reported. Addresses that no
    /// pool in force has (their pool is invalid or was deleted) are kept as they are, unless
    /// the Service names other addresses. Never allocates a new address.
    pub fn load_existing(&mut self, services: &[ServiceView]) -> Vec<LoadConflict> {
        let mut ordered: Vec<&ServiceView> = services
            .iter()
            .filter(|s| !s.status_ips.is_empty())
            .collect();
        ordered.sort_by(|a, b| a.key.cmp(&b.key));
        let mut conflicts = Vec::new();
        self.loaded = true;
        for svc in ordered {
            if self.not_ours(svc).is_some() {
                continue;
            }
            let result = parse_request(svc).and_then(|req| {
                let claimed = self.claim_ips(svc, &req, &svc.status_ips);
                if claimed.is_err() && self.keepable(svc, &req, &svc.status_ips) {
                    self.hold(svc.key.clone(), None, svc.status_ips.clone(), &req);
                    return Ok(());
                }
                claimed
            });
            if let Err(error) = result {
                conflicts.push(LoadConflict {
                    service: svc.key.clone(),
                    error,
                });
            }
        }
        conflicts
    }

    /// Decides the addresses of a Service, updating what it holds.
    pub fn assign(&mut self, svc: &ServiceView) -> Verdict {
        if !self.loaded {
            return Verdict::NotLoaded;
        }
        if let Some(reason) = self.not_ours(svc) {
            self.release(&svc.key);
            return Verdict::NotOurs(reason);
        }
        match self.decide(svc) {
            Ok(Decision::Kept) => match self.holdings.get(&svc.key) {
                Some(h) => Verdict::Kept { ips: h.ips.clone() },
                None => Verdict::Error(AllocationError::NoAvailablePool),
            },
            Ok(Decision::Held) => {
                let Some(h) = self.holdings.get(&svc.key) else {
                    return Verdict::Error(AllocationError::NoAvailablePool);
                };
                let same = h.ips.len() == svc.status_ips.len()
                    && h.ips.iter().all(|ip| svc.status_ips.contains(ip));
                if same {
                    Verdict::Unchanged
                } else {
                    Verdict::Assigned {
                        ips: h.ips.clone(),
                        pool: h.pool.clone().unwrap_or_default(),
                    }
                }
            }
            Err(e) => {
                self.release(&svc.key);
                Verdict::Error(e)
            }
        }
    }

    fn not_ours(&self, svc: &ServiceView) -> Option<NotOurs> {
        if !svc.is_load_balancer {
            Some(NotOurs::NotLoadBalancer)
        } else if svc.load_balancer_class != self.class {
            Some(NotOurs::OtherClass)
        } else {
            None
        }
    }

    /// Whether the pool the Service names is not in force (invalid or gone).
    fn names_a_pool_out_of_force(&self, req: &Request) -> bool {
        req.pool
            .as_ref()
            .is_some_and(|name| !self.pools.contains_key(name))
    }

    /// Whether these addresses, which no pool in force has as a whole (or whose Service names a
    /// pool not in force), may stay with the Service: it names no other addresses, and no other
    /// holder refuses to share them.
    fn keepable(&self, svc: &ServiceView, req: &Request, ips: &[IpAddr]) -> bool {
        let outside = !ips.is_empty()
            && (self.names_a_pool_out_of_force(req)
                || !self
                    .pools
                    .values()
                    .any(|p| ips.iter().all(|ip| p.pool.contains(*ip))));
        let same_ips = req.ips.is_empty()
            || req.ips.iter().collect::<BTreeSet<_>>() == ips.iter().collect::<BTreeSet<_>>();
        outside
            && same_ips
            && families_match(svc, ips).is_ok()
            && ips
                .iter()
                .all(|ip| self.check_shareable(&svc.key, &req.sharing, *ip).is_ok())
    }

    /// Whether the Service keeps what it holds outside the pools in force: its pool is
    /// invalid or gone, and it asks for what it asked for when it got them.
    fn keeps_outside_pools(&self, svc: &ServiceView, req: &Request) -> bool {
        let Some(h) = self.holdings.get(&svc.key) else {
            return false;
        };
        let pool_gone = h.pool.as_ref().is_none_or(|p| !self.pools.contains_key(p))
            || self.names_a_pool_out_of_force(req);
        let asked_same = h.asked.0.iter().collect::<BTreeSet<_>>()
            == req.ips.iter().collect::<BTreeSet<_>>()
            && h.asked.1 == req.pool;
        pool_gone && asked_same && self.keepable(svc, req, &h.ips)
    }

    fn decide(&mut self, svc: &ServiceView) -> Result<Decision, AllocationError> {
        let req = parse_request(svc)?;
        if self.keeps_outside_pools(svc, &req) {
            if let Some(h) = self.holdings.get_mut(&svc.key) {
                h.sharing = req.sharing.clone();
            }
            return Ok(Decision::Kept);
        }
        if let Some(name) = &req.pool
            && !self.pools.contains_key(name)
        {
            return Err(AllocationError::UnknownPool(name.clone()));
        }
        // Keep what it holds when that still satisfies the request.
        if let Some(h) = self.holdings.get(&svc.key) {
            let ips = h.ips.clone();
            if self.check_ips(svc, &req, &ips).is_ok() {
                if let Some(h) = self.holdings.get_mut(&svc.key) {
                    h.sharing = req.sharing.clone();
                }
                return Ok(Decision::Held);
            }
            self.release(&svc.key);
        }
        if !req.ips.is_empty() {
            return self.claim_ips(svc, &req, &req.ips).map(|()| Decision::Held);
        }
        // Its status addresses, when still valid and free.
        if !svc.status_ips.is_empty() && self.claim_ips(svc, &req, &svc.status_ips).is_ok() {
            return Ok(Decision::Held);
        }
        match &req.pool {
            Some(name) => {
                let admitted = self
                    .pools
                    .get(name)
                    .is_some_and(|p| p.pool.admits(&svc.applicant()));
                if !admitted {
                    return Err(AllocationError::PoolNotAllowed(name.clone()));
                }
                self.allocate_from(svc, &req, name.clone())
                    .map(|()| Decision::Held)
            }
            None => {
                let mut candidates: Vec<(PoolRank, &String)> = self
                    .pools
                    .values()
                    .filter(|p| p.pool.auto_assign)
                    .filter(|p| p.pool.admits(&svc.applicant()))
                    .map(|p| (PoolRank::of(&p.pool), &p.pool.name))
                    .collect();
                candidates.sort();
                let names: Vec<String> = candidates.into_iter().map(|(_, n)| n.clone()).collect();
                let mut last = AllocationError::NoAvailablePool;
                for name in names {
                    match self.allocate_from(svc, &req, name) {
                        Ok(()) => return Ok(Decision::Held),
                        Err(e) => {
                            // A full pool says more than a pool without the family.
                            if !matches!(last, AllocationError::PoolExhausted { .. }) {
                                last = e;
                            }
                        }
                    }
                }
                Err(last)
            }
        }
    }

    /// Checks that these addresses satisfy the request and may be held by the Service.
    fn check_ips(
        &self,
        svc: &ServiceView,
        req: &Request,
        ips: &[IpAddr],
    ) -> Result<String, AllocationError> {
        let Some(first) = ips.first() else {
            return Err(AllocationError::NoAvailablePool);
        };
        if !req.ips.is_empty()
            && req.ips.iter().collect::<BTreeSet<_>>() != ips.iter().collect::<BTreeSet<_>>()
        {
            return Err(AllocationError::IpNotInPool(*first));
        }
        let state = self
            .pools
            .values()
            .find(|p| p.pool.may_assign(*first))
            .ok_or(AllocationError::IpNotInPool(*first))?;
        let pool = &state.pool;
        if let Some(ip) = ips.iter().find(|ip| !pool.may_assign(**ip)) {
            return Err(AllocationError::IpNotInPool(*ip));
        }
        if let Some(name) = &req.pool
            && *name != pool.name
        {
            return Err(AllocationError::IpNotInPool(*first));
        }
        if !pool.admits(&svc.applicant()) {
            return Err(AllocationError::PoolNotAllowed(pool.name.clone()));
        }
        families_match(svc, ips)?;
        if req.ips.is_empty() {
            // Without named addresses the family set must be exactly what the pool would give.
            let wanted: BTreeSet<Family> = families_for(svc, pool)?.into_iter().collect();
            let have: BTreeSet<Family> = ips.iter().map(|ip| Family::of(*ip)).collect();
            if wanted != have {
                return Err(AllocationError::FamilyUnavailable(
                    wanted
                        .difference(&have)
                        .next()
                        .copied()
                        .unwrap_or(Family::of(*first)),
                ));
            }
        }
        for ip in ips {
            self.check_shareable(&svc.key, &req.sharing, *ip)?;
        }
        Ok(pool.name.clone())
    }

    fn check_shareable(
        &self,
        me: &ServiceKey,
        sharing: &Sharing,
        ip: IpAddr,
    ) -> Result<(), AllocationError> {
        for holder in self.holders.get(&ip).into_iter().flatten() {
            if holder == me {
                continue;
            }
            let compatible = self
                .holdings
                .get(holder)
                .is_some_and(|h| h.sharing.compatible(sharing));
            if !compatible {
                return Err(AllocationError::IpInUse {
                    ip,
                    holder: holder.clone(),
                });
            }
        }
        Ok(())
    }

    fn claim_ips(
        &mut self,
        svc: &ServiceView,
        req: &Request,
        ips: &[IpAddr],
    ) -> Result<(), AllocationError> {
        let pool = self.check_ips(svc, req, ips)?;
        self.hold(svc.key.clone(), Some(pool), ips.to_vec(), req);
        Ok(())
    }

    fn allocate_from(
        &mut self,
        svc: &ServiceView,
        req: &Request,
        name: String,
    ) -> Result<(), AllocationError> {
        let Some(state) = self.pools.get(&name) else {
            return Err(AllocationError::UnknownPool(name));
        };
        let families = families_for(svc, &state.pool)?;
        let mut ips = Vec::with_capacity(families.len());
        for family in families {
            // An address already shared under the same key, when compatible.
            let reuse = req.sharing.key.as_ref().and_then(|key| {
                let state = self.pools.get(&name)?;
                self.shared.get(key)?.iter().copied().find(|ip| {
                    Family::of(*ip) == family
                        && state.pool.may_assign(*ip)
                        && self.check_shareable(&svc.key, &req.sharing, *ip).is_ok()
                })
            });
            let ip = match reuse {
                Some(ip) => ip,
                None => self
                    .pools
                    .get_mut(&name)
                    .and_then(|s| s.lowest_free(family))
                    .ok_or_else(|| AllocationError::PoolExhausted {
                        pool: name.clone(),
                        family,
                    })?,
            };
            ips.push(ip);
        }
        self.hold(svc.key.clone(), Some(name), ips, req);
        Ok(())
    }

    fn hold(&mut self, key: ServiceKey, pool: Option<String>, ips: Vec<IpAddr>, req: &Request) {
        self.release(&key);
        let sharing = req.sharing.clone();
        for ip in &ips {
            let holders = self.holders.entry(*ip).or_default();
            if holders.is_empty() {
                for state in self.pools.values_mut() {
                    if let Some(r) = state.range_of(*ip) {
                        r.used.insert(ip_to_u128(*ip));
                    }
                }
            }
            // Most addresses have one holder: room for exactly one (a Vec would start at four).
            holders.reserve_exact(1);
            holders.push(key.clone());
            if let Some(k) = &sharing.key {
                self.shared.entry(k.clone()).or_default().insert(*ip);
            }
        }
        let asked = (req.ips.clone(), req.pool.clone());
        self.holdings.insert(
            key,
            Holding {
                pool,
                ips,
                sharing,
                asked,
            },
        );
    }

    /// Releases whatever the Service holds (on deletion). Returns whether it held anything.
    pub fn release(&mut self, key: &ServiceKey) -> bool {
        let Some(h) = self.holdings.remove(key) else {
            return false;
        };
        for ip in &h.ips {
            let now_free = match self.holders.get_mut(ip) {
                Some(holders) => {
                    holders.retain(|k| k != key);
                    holders.is_empty()
                }
                None => true,
            };
            if now_free {
                self.holders.remove(ip);
                for state in self.pools.values_mut() {
                    if let Some(r) = state.range_of(*ip) {
                        let n = ip_to_u128(*ip);
                        r.used.remove(&n);
                        r.cursor = r.cursor.min(n);
                    }
                }
            }
            if let Some(k) = &h.sharing.key {
                let still = self.holders.get(ip).into_iter().flatten().any(|other| {
                    self.holdings
                        .get(other)
                        .is_some_and(|o| o.sharing.key.as_ref() == Some(k))
                });
                if !still && let Some(set) = self.shared.get_mut(k) {
                    set.remove(ip);
                    if set.is_empty() {
                        self.shared.remove(k);
                    }
                }
            }
        }
        true
    }

    /// Releases every Service for which `present` is false (deleted while not watched).
    /// Returns the released Services, sorted.
    pub fn release_missing(&mut self, present: impl Fn(&ServiceKey) -> bool) -> Vec<ServiceKey> {
        let mut gone: Vec<ServiceKey> = self
            .holdings
            .keys()
            .filter(|k| !present(k))
            .cloned()
            .collect();
        gone.sort();
        for key in &gone {
            self.release(key);
        }
        gone
    }

    /// The addresses a Service holds and their pool (`None`: kept outside every pool).
    pub fn holding(&self, key: &ServiceKey) -> Option<(Option<&str>, &[IpAddr])> {
        self.holdings
            .get(key)
            .map(|h| (h.pool.as_deref(), h.ips.as_slice()))
    }

    /// The Services holding an address.
    pub fn holders(&self, ip: IpAddr) -> &[ServiceKey] {
        self.holders.get(&ip).map(Vec::as_slice).unwrap_or(&[])
    }

    /// How many addresses Services keep outside every pool in force ([`Verdict::Kept`]).
    pub fn kept_outside_pools(&self) -> usize {
        self.holdings
            .values()
            .filter(|h| h.pool.as_ref().is_none_or(|p| !self.pools.contains_key(p)))
            .map(|h| h.ips.len())
            .sum()
    }

    /// Size and use per pool and family (for pool status and metrics), by pool name.
    pub fn usage(&self) -> Vec<PoolUsage> {
        let mut out = Vec::new();
        for state in self.pools.values() {
            for family in Family::ALL {
                let in_use = state
                    .ranges
                    .iter()
                    .filter(|r| r.range.family == family)
                    .map(|r| r.used.len() as u128)
                    .sum();
                out.push(PoolUsage {
                    pool: state.pool.name.clone(),
                    family,
                    size: state.pool.size(family),
                    in_use,
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
