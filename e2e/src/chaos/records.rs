//! The Kubernetes invariants of a chaos run, over what the lab read from the API server: pure,
//! like [`super::invariants`].
//!
//! - **stale record**: a VIP's `ServiceL2Status` is missing or names another node than the one
//!   answering ARP for it, for longer than [`RECORD_LIMIT`] while the API server is up (an
//!   outage, a VIP unanswered or answered twice, or an unread API server starts the count
//!   again: dark and dual are their own invariants);
//! - **double allocation**: one IP in the status of two Services that do not share it (the
//!   same `allow-shared-ip` key on both).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::invariants::{ARP_INTERVAL, DUAL_GAP, Invariant, Observations, Violation, World};

/// How long a record may name another node than the answering one while the API server is up.
pub const RECORD_LIMIT: Duration = Duration::from_secs(2);

/// One Service of type LoadBalancer as the API server has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceIps {
    /// `namespace/name`.
    pub name: String,
    /// The IPs of its `status.loadBalancer.ingress`.
    pub ips: Vec<String>,
    /// Its `allow-shared-ip` key.
    pub shared: Option<String>,
}

/// What one read of the API server found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApiRead {
    /// Every `ServiceL2Status` as (`namespace/service`, node).
    pub records: Vec<(String, String)>,
    /// Every Service of type LoadBalancer.
    pub services: Vec<ServiceIps>,
}

/// One read of the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordPoll {
    /// When it started, since the start of the run.
    pub at: Duration,
    /// `None`: the API server did not answer.
    pub read: Option<ApiRead>,
}

/// Checks stale records (`services[i]`: the `namespace/name` of VIP `i`'s Service; `names`:
/// the node names, index 0 is node 1) and double allocations over `obs.records`.
pub fn evaluate(
    world: &World,
    obs: &Observations,
    services: &[String],
    names: &[String],
) -> Vec<Violation> {
    let mut found = Vec::new();
    for (vip, service) in services.iter().enumerate() {
        stale(world, obs, vip, service, names, &mut found);
    }
    double(obs, &mut found);
    found
}

/// The one node (1-based) that answered the last ARP request for `vip` sent in the
/// [`DUAL_GAP`] before `at`; `None` when nobody, several MACs or a MAC of no node did.
fn answering(obs: &Observations, vip: usize, at: Duration) -> Option<usize> {
    let arp = &obs.vips.get(vip)?.arp;
    let i = arp.partition_point(|s| s.at <= at);
    let last = arp.get(i.checked_sub(1)?)?;
    if at.saturating_sub(last.at) > DUAL_GAP || last.nodes.len() != 1 {
        return None;
    }
    last.nodes.first().copied().filter(|n| *n > 0)
}

fn stale(
    world: &World,
    obs: &Observations,
    vip: usize,
    service: &str,
    names: &[String],
    found: &mut Vec<Violation>,
) {
    // The first poll of the current run of mismatches, and whether it was reported.
    let mut since: Option<Duration> = None;
    let mut reported = false;
    for poll in obs.records.iter().filter(|p| p.at <= obs.horizon) {
        let answer = answering(obs, vip, poll.at.saturating_sub(ARP_INTERVAL / 2));
        let (Some(read), Some(node), true) = (&poll.read, answer, world.at(poll.at).api) else {
            since = None;
            reported = false;
            continue;
        };
        let Some(owner) = names.get(node - 1) else {
            continue;
        };
        let recorded = read
            .records
            .iter()
            .find(|(s, _)| s == service)
            .map(|(_, n)| n.as_str());
        if recorded == Some(owner.as_str()) {
            since = None;
            reported = false;
            continue;
        }
        let start = *since.get_or_insert(poll.at);
        if !reported && poll.at > start + RECORD_LIMIT {
            reported = true;
            found.push(Violation {
                invariant: Invariant::StaleRecord,
                at: start + RECORD_LIMIT,
                vip: Some(vip),
                detail: format!(
                    "{owner} answers since {:.2} s at the latest, the record of {service} names {}",
                    start.as_secs_f64(),
                    recorded.unwrap_or("no node (no record)")
                ),
                excused: world.partitioned_within(start.saturating_sub(RECORD_LIMIT), poll.at),
            });
        }
    }
}

/// The Services holding each IP, with their sharing keys.
fn holders(read: &ApiRead) -> BTreeMap<&str, Vec<&ServiceIps>> {
    let mut by_ip: BTreeMap<&str, Vec<&ServiceIps>> = BTreeMap::new();
    for s in &read.services {
        for ip in &s.ips {
            by_ip.entry(ip.as_str()).or_default().push(s);
        }
    }
    by_ip
}

fn double(obs: &Observations, found: &mut Vec<Violation>) {
    // One violation per run of reads where one IP is held by the same unshared Services.
    let mut open: BTreeSet<(String, Vec<String>)> = BTreeSet::new();
    for poll in obs.records.iter().filter(|p| p.at <= obs.horizon) {
        let Some(read) = &poll.read else {
            continue;
        };
        let mut now = BTreeSet::new();
        for (ip, services) in holders(read) {
            let key = services[0].shared.as_deref();
            let shared = key.is_some() && services.iter().all(|s| s.shared.as_deref() == key);
            if services.len() < 2 || shared {
                continue;
            }
            let mut names: Vec<String> = services.iter().map(|s| s.name.clone()).collect();
            names.sort();
            let episode = (ip.to_string(), names);
            if !open.contains(&episode) {
                found.push(Violation {
                    invariant: Invariant::DoubleAllocation,
                    at: poll.at,
                    vip: None,
                    detail: format!(
                        "{ip} is in the status of {}, which do not share it",
                        episode.1.join(" and ")
                    ),
                    excused: false,
                });
            }
            now.insert(episode);
        }
        open = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chaos::invariants::{ArpSample, Executed, VipObservations};
    use crate::chaos::schedule::{Fault, FaultKind, Step};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// node `n` answers every ARP request (every 100 ms) for VIP 0 from `from` to `to`.
    fn answered(spans: &[(u64, u64, usize)]) -> VipObservations {
        let mut arp = Vec::new();
        for &(from, to, n) in spans {
            let mut t = from;
            while t < to {
                arp.push(ArpSample {
                    at: ms(t),
                    nodes: BTreeSet::from([n]),
                });
                t += 100;
            }
        }
        VipObservations {
            probes: Vec::new(),
            arp,
        }
    }

    /// Reads every 500 ms from `from` to `to` where the record of default/web names `node`.
    fn reads(from: u64, to: u64, node: Option<&str>) -> Vec<RecordPoll> {
        (from..to)
            .step_by(500)
            .map(|t| RecordPoll {
                at: ms(t),
                read: Some(ApiRead {
                    records: node
                        .map(|n| vec![("default/web".to_string(), n.to_string())])
                        .unwrap_or_default(),
                    services: Vec::new(),
                }),
            })
            .collect()
    }

    fn names() -> Vec<String> {
        (1..=3).map(|n| format!("node{n}")).collect()
    }

    fn check(world: &World, vip: VipObservations, records: Vec<RecordPoll>) -> Vec<Violation> {
        let obs = Observations {
            vips: vec![vip],
            polls: Vec::new(),
            records,
            horizon: ms(60_000),
        };
        evaluate(world, &obs, &["default/web".to_string()], &names())
    }

    fn calm() -> World {
        World::new(&[], &[], 3)
    }

    #[test]
    fn a_record_that_follows_the_owner_within_the_limit_is_no_violation() {
        let vip = answered(&[(0, 10_000, 1), (10_000, 20_000, 2)]);
        let mut records = reads(0, 11_500, Some("node1"));
        records.extend(reads(11_500, 20_000, Some("node2")));
        assert!(check(&calm(), vip, records).is_empty());
    }

    #[test]
    fn a_record_naming_the_old_owner_for_longer_than_the_limit_is_stale() {
        let vip = answered(&[(0, 10_000, 1), (10_000, 20_000, 2)]);
        let found = check(&calm(), vip, reads(0, 20_000, Some("node1")));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].invariant, Invariant::StaleRecord);
        // The first read after the move (10.5 s) starts the count.
        assert_eq!(found[0].at, ms(10_500) + RECORD_LIMIT);
        assert!(
            found[0].detail.contains("node2 answers"),
            "{}",
            found[0].detail
        );
    }

    #[test]
    fn a_missing_record_while_a_node_answers_is_stale() {
        let found = check(&calm(), answered(&[(0, 5000, 3)]), reads(0, 5000, None));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].detail.contains("no record"), "{}", found[0].detail);
    }

    #[test]
    fn the_count_starts_again_when_the_api_server_comes_back() {
        // Down from 5 s to 9 s: the old record stands for 1.5 s after it is back, then follows.
        let faults = [Fault {
            at: ms(5000),
            duration: ms(4000),
            kind: FaultKind::ApiDown,
        }];
        let executed = [
            Executed {
                at: ms(5000),
                began: ms(5000),
                done: ms(5000),
                fault: 0,
                step: Step::Apply,
            },
            Executed {
                at: ms(9000),
                began: ms(9000),
                done: ms(9000),
                fault: 0,
                step: Step::Undo,
            },
        ];
        let world = World::new(&faults, &executed, 3);
        let vip = answered(&[(0, 6000, 1), (6000, 20_000, 2)]);
        let mut records = reads(0, 10_500, Some("node1"));
        records.extend(reads(10_500, 20_000, Some("node2")));
        assert!(check(&world, vip, records).is_empty());
    }

    #[test]
    fn a_dark_or_dual_vip_is_not_a_stale_record() {
        let mut vip = answered(&[(0, 2000, 1)]);
        vip.arp.extend((20..100).map(|t| ArpSample {
            at: ms(t * 100),
            nodes: BTreeSet::from([1, 2]),
        }));
        let found = check(&calm(), vip, reads(0, 10_000, Some("node3")));
        assert!(found.is_empty(), "{found:?}");
        let found = check(&calm(), VipObservations::default(), reads(0, 10_000, None));
        assert!(found.is_empty(), "{found:?}");
    }

    fn service(name: &str, ip: &str, shared: Option<&str>) -> ServiceIps {
        ServiceIps {
            name: name.to_string(),
            ips: vec![ip.to_string()],
            shared: shared.map(str::to_string),
        }
    }

    fn with_services(services: Vec<ServiceIps>, at: &[u64]) -> Vec<RecordPoll> {
        at.iter()
            .map(|t| RecordPoll {
                at: ms(*t),
                read: Some(ApiRead {
                    records: Vec::new(),
                    services: services.clone(),
                }),
            })
            .collect()
    }

    #[test]
    fn one_ip_on_two_services_that_do_not_share_is_a_double_allocation_once() {
        let services = vec![
            service("default/web", "198.51.100.100", None),
            service("default/clash-1", "198.51.100.100", None),
        ];
        let found = check(
            &calm(),
            VipObservations::default(),
            with_services(services, &[1000, 1500, 2000]),
        );
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].invariant, Invariant::DoubleAllocation);
        assert!(found[0].detail.contains("default/clash-1 and default/web"));
    }

    #[test]
    fn services_sharing_one_key_may_hold_one_ip() {
        let shared = vec![
            service("default/a", "198.51.100.101", Some("k")),
            service("default/b", "198.51.100.101", Some("k")),
        ];
        assert!(
            check(
                &calm(),
                VipObservations::default(),
                with_services(shared, &[1000])
            )
            .is_empty()
        );
        let other_keys = vec![
            service("default/a", "198.51.100.101", Some("k")),
            service("default/b", "198.51.100.101", Some("j")),
        ];
        let found = check(
            &calm(),
            VipObservations::default(),
            with_services(other_keys, &[1000]),
        );
        assert_eq!(found.len(), 1, "{found:?}");
    }
}
