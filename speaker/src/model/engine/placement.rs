//! Where this node answers for each IP: the links of the IP's interface set that can announce
//! here, and the facts the node gossips so that the others elect without it where it cannot.
//!
//! Pure: links and routes in (as [`crate::model::links`] reads them), link names out. A named
//! interface that is missing, down, NOARP, a bond port, loopback or not Ethernet does not
//! answer; the default interface is the link with the best connected route to the IP
//! ([`links::choose`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use crate::model::links::{self, Link, NoInterface, Route};
use crate::model::membership::AnnounceFacts;
use crate::model::snapshot::{Interfaces, Snapshot};

/// The links answering for one IP (never empty), or why there is none.
pub type Placed = Result<BTreeSet<String>, NoInterface>;

/// A set of link names, shared by every IP placed on the same links.
pub type LinkSet = Arc<BTreeSet<String>>;

/// Places `ip` with interface set `wanted` on `links` and `routes`.
pub fn place(ip: IpAddr, wanted: &Interfaces, links: &[Link], routes: &[Route]) -> Placed {
    match wanted {
        Interfaces::Default => {
            links::choose(ip, None, links, routes).map(|link| BTreeSet::from([link.name.clone()]))
        }
        Interfaces::Named(names) => {
            let mut placed = BTreeSet::new();
            let mut first_error = None;
            for name in names.iter() {
                match links::choose(ip, Some(name), links, routes) {
                    Ok(link) => {
                        placed.insert(link.name.clone());
                    }
                    Err(reason) => {
                        first_error.get_or_insert(reason);
                    }
                }
            }
            match first_error {
                Some(reason) if placed.is_empty() => Err(reason),
                _ => Ok(placed),
            }
        }
    }
}

/// The placement of every served IP on this node, kept up to date with the snapshot and the
/// links.
#[derive(Debug, Clone, Default)]
pub struct Placement {
    links: Vec<Link>,
    routes: Vec<Route>,
    /// Each IP's links, the few distinct sets shared ([`Placement::share`]): 10,000 IPs on one
    /// link hold one set, not 10,000.
    placed: BTreeMap<IpAddr, Result<LinkSet, NoInterface>>,
    sets: Vec<LinkSet>,
}

impl Placement {
    /// Places every IP of `snapshot`.
    pub fn new(snapshot: &Snapshot, links: Vec<Link>, routes: Vec<Route>) -> Placement {
        let mut placement = Placement {
            links,
            routes,
            placed: BTreeMap::new(),
            sets: Vec::new(),
        };
        for (ip, served) in snapshot.iter() {
            let placed = place(*ip, &served.interfaces, &placement.links, &placement.routes);
            let placed = placement.share(placed);
            placement.placed.insert(*ip, placed);
        }
        placement
    }

    /// `placed` with its set of links shared with the IPs placed on the same links.
    fn share(&mut self, placed: Placed) -> Result<LinkSet, NoInterface> {
        let links = placed?;
        if let Some(set) = self.sets.iter().find(|s| ***s == links) {
            return Ok(set.clone());
        }
        // Sets no IP uses any more go first (links renamed or gone).
        self.sets.retain(|s| Arc::strong_count(s) > 1);
        let set = Arc::new(links);
        self.sets.push(set.clone());
        Ok(set)
    }

    /// The links `ip` is answered on here, if it can be.
    pub fn links_of(&self, ip: &IpAddr) -> Option<&LinkSet> {
        self.placed.get(ip).and_then(|p| p.as_ref().ok())
    }

    /// Every link some IP is placed on (the links that may announce: the standalone mode sets
    /// their ARP sysctls).
    pub fn used_links(&self) -> BTreeSet<String> {
        self.placed
            .values()
            .filter_map(|p| p.as_deref().ok())
            .flatten()
            .cloned()
            .collect()
    }

    /// Why `ip` cannot be answered here, if it cannot.
    pub fn failure(&self, ip: &IpAddr) -> Option<NoInterface> {
        self.placed.get(ip).and_then(|p| p.as_ref().err().copied())
    }

    /// New links and routes: places every IP again. Returns the IPs whose placement changed.
    pub fn set_net(
        &mut self,
        snapshot: &Snapshot,
        links: Vec<Link>,
        routes: Vec<Route>,
    ) -> Vec<IpAddr> {
        self.links = links;
        self.routes = routes;
        let mut changed = Vec::new();
        for (ip, served) in snapshot.iter() {
            if self.replace(*ip, Some(&served.interfaces)) {
                changed.push(*ip);
            }
        }
        changed
    }

    /// Places `ip` again (`None`: no longer served). Returns whether its placement changed.
    pub fn replace(&mut self, ip: IpAddr, wanted: Option<&Interfaces>) -> bool {
        match wanted {
            Some(wanted) => {
                let next = place(ip, wanted, &self.links, &self.routes);
                let next = self.share(next);
                self.placed.insert(ip, next.clone()) != Some(next)
            }
            None => self.placed.remove(&ip).is_some(),
        }
    }

    /// What this node gossips about where it can announce (see [`AnnounceFacts`]).
    pub fn facts(&self, snapshot: &Snapshot) -> AnnounceFacts {
        let mut named: BTreeSet<&str> = BTreeSet::new();
        let mut unplaced = BTreeSet::new();
        for (ip, served) in snapshot.iter() {
            match &served.interfaces {
                Interfaces::Default => {
                    if self.links_of(ip).is_none() {
                        unplaced.insert(*ip);
                    }
                }
                Interfaces::Named(names) => named.extend(names.iter().map(String::as_str)),
            }
        }
        let links = named
            .into_iter()
            .filter(|name| {
                // Any address will do: a named interface does not depend on the IP.
                links::choose(IpAddr::from([0, 0, 0, 0]), Some(name), &self.links, &[]).is_ok()
            })
            .map(str::to_string)
            .collect();
        AnnounceFacts { links, unplaced }
    }
}
