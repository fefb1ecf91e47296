//! The standalone source's side of VRRP ([`crate::vrrp`]): the plan handed to the VRRP task
//! after every input, from the file, the election and this node's record.

use std::collections::BTreeSet;
use std::net::IpAddr;

use swimlb_config::standalone::Standalone;
use tokio::sync::watch;

use crate::model::election::effective_priority;
use crate::model::engine::placement::Placement;
use crate::model::links::{Link, Route};
use crate::run::daemon::Daemon;
use crate::vrrp::socket::Family;
use crate::vrrp::task::{Plan, RouterPlan};

/// One [`RouterPlan`] per VRRP group and family of `config`. `net` is read only for a group
/// without `interface` (its addresses' connected route names the link).
pub(crate) fn plan(
    config: &Standalone,
    daemon: &Daemon,
    net: &watch::Receiver<(Vec<Link>, Vec<Route>)>,
) -> Plan {
    let mut plan = Vec::new();
    let mut placement: Option<Placement> = None;
    let speakers = speakers(daemon);
    for group in &config.groups {
        let Some(vrrp) = group.vrrp else { continue };
        let health = daemon.local.meta().groups.get(&group.name);
        let base = health.map_or(group.priority.default, |h| h.priority);
        let effective = health.map_or(Ok(base), effective_priority).unwrap_or(base);
        for family in [Family::V4, Family::V6] {
            let addresses: Vec<IpAddr> = group
                .addresses
                .iter()
                .filter(|a| Family::of(a) == family)
                .copied()
                .collect();
            let Some(first) = addresses.first() else {
                continue;
            };
            let ifname = match &group.interface {
                Some(name) => Some(name.clone()),
                None => {
                    let placed = placement.get_or_insert_with(|| {
                        let (links, routes) = net.borrow().clone();
                        Placement::new(daemon.engine.election().snapshot(), links, routes)
                    });
                    placed
                        .links_of(first)
                        .and_then(|set| set.iter().next().cloned())
                }
            };
            let election = daemon.engine.election();
            let elected = addresses.iter().any(|ip| election.owns(ip));
            let advertise = addresses
                .iter()
                .any(|ip| election.owns(ip) && daemon.engine.answers(ip));
            plan.push(RouterPlan {
                group: group.name.clone(),
                family,
                vrid: vrrp.vrid,
                interval_centis: vrrp.interval_centis(),
                ifname,
                addresses,
                priority: vrrp.priority.unwrap_or(effective),
                advertise,
                elected,
                speakers: speakers.clone(),
            });
        }
    }
    plan
}

/// The addresses the members the election counts alive send VRRP advertisements from (an
/// accused member is not counted: the engine elects without it): each one's gossip address,
/// from the gossip's directory, and the VRRP sources its record announces (an IPv6 router's
/// link-local address, an IPv4 router's address when the gossip binds elsewhere).
fn speakers(daemon: &Daemon) -> BTreeSet<IpAddr> {
    let directory = daemon.gossip().directory();
    let directory = directory.borrow();
    let mut speakers = BTreeSet::new();
    for m in daemon.engine.live().iter() {
        speakers.extend(directory.get(&m.node).map(|id| id.addr.ip()));
        speakers.extend(m.vrrp_sources.iter().copied());
    }
    speakers
}
