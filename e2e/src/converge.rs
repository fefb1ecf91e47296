//! Whether the lab has converged, so that a fault may be measured.
//!
//! A fault taken while two nodes answer for the VIP measures nothing: the client may already be
//! talking to the "new" owner, and the figure reads 0 ms (or a few ms). So before every trial,
//! the demo and a soak, the lab observes for at least a second and measures only when all of
//! these hold:
//!
//! - the daemons name one owner, at the start and at the end of the window: every swimlb
//!   speaker answers `/status`, is ready, sees every node as a member and names the same owner;
//!   or exactly one keepalived is MASTER and every other is BACKUP; or every MetalLB speaker
//!   answers `/metrics`, its memberlist holds every node, and exactly one announces the VIP;
//! - exactly one MAC claimed the VIP in ARP over the window (replies to the client's requests,
//!   sent every 100 ms, and gratuitous ARP), that MAC is the named owner's, and it answered in
//!   the first and in the last quarter of the window;
//! - every probe answered in the window was answered by that owner, and at least half were.
//!
//! Otherwise the lab waits (bounded) and then reports the trial as failed with the last reason.
//! Right before the fault, [`confirm`] re-reads the daemons and the probes, so the node faulted
//! is the node that owns the VIP at fault time.
//!
//! [`decide`] and [`confirm`] are pure: observations in, verdict out. [`wait`] is the loop around
//! them that reads the daemons, sends the ARP requests and reads the prober.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use anyhow::Result;
use tokio::time::Instant;

use crate::daemons::Daemons;
pub use crate::lab::rule::{metallb_order, metallb_owner};
pub use crate::lab::views::{MetallbView, SpeakerView, Views, VrrpState};
use crate::netns::{self, Lab, Node};
use crate::probe::{self, ArpClaim, Prober};

/// The shortest window that can show one MAC answering "for at least a second".
pub const WINDOW: Duration = Duration::from_secs(1);
/// How often the client asks for the VIP's MAC during a window.
pub const ARP_INTERVAL: Duration = Duration::from_millis(100);

/// One observation window.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// The daemons' views read just before the window.
    pub before: Views,
    /// The daemons' views read just after it.
    pub after: Views,
    /// How long the client asked for the VIP's MAC.
    pub window: Duration,
    /// Every ARP claim for the VIP the client saw in the window.
    pub arp: Vec<ArpClaim>,
    /// Who answered each probe sent in the window, in order (`None`: lost).
    pub probes: Vec<Option<String>>,
}

/// Why the lab is not converged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotConverged {
    /// A node's daemon gave no view.
    Silent {
        /// The node.
        node: String,
    },
    /// A swimlb speaker says it has not joined the mesh.
    NotReady {
        /// The node.
        node: String,
    },
    /// A swimlb speaker does not see every node.
    PartialView {
        /// The node.
        node: String,
        /// Members it sees.
        members: usize,
        /// Nodes in the lab.
        nodes: usize,
    },
    /// A swimlb speaker names no owner for the VIP.
    NoOwner {
        /// The node.
        node: String,
    },
    /// No MetalLB speaker announces the VIP.
    NoAnnouncer,
    /// Two speakers name different owners.
    Disputed {
        /// One owner named.
        one: String,
        /// Another owner named.
        other: String,
    },
    /// No keepalived is MASTER.
    NoMaster,
    /// Several keepalived are MASTER.
    SeveralMasters {
        /// The masters.
        masters: Vec<String>,
    },
    /// A keepalived is neither MASTER nor BACKUP.
    NotBackup {
        /// The node.
        node: String,
        /// Its state.
        state: VrrpState,
    },
    /// The daemons named another owner at the end of the window than at its start.
    OwnerMoved {
        /// Named before.
        before: String,
        /// Named after.
        after: String,
    },
    /// The window was shorter than [`WINDOW`].
    ShortWindow,
    /// Nobody claimed the VIP in ARP.
    NoArpAnswer,
    /// Several MACs claimed the VIP in ARP.
    SeveralArpAnswerers {
        /// The MACs, as text.
        macs: Vec<String>,
    },
    /// The one MAC that claimed the VIP is not the named owner's.
    ArpFromNonOwner {
        /// The MAC, as text.
        mac: String,
        /// The named owner.
        owner: String,
    },
    /// The owner's MAC did not answer across the whole window.
    ArpGap,
    /// A probe was answered by a node other than the named owner.
    ProbeFromOther {
        /// The node that answered.
        node: String,
        /// The named owner.
        owner: String,
    },
    /// Fewer than half the probes were answered.
    FewProbesAnswered {
        /// Answered.
        answered: usize,
        /// Sent.
        sent: usize,
    },
    /// One owner holds the VIP alone, but the election rule names another for a settled cluster
    /// with every node alive.
    Misplaced {
        /// The node the rule names.
        expected: String,
        /// The node found owning the VIP.
        found: String,
    },
}

impl NotConverged {
    /// A fixed name, for logs and reports.
    pub const fn as_str(&self) -> &'static str {
        match self {
            NotConverged::Silent { .. } => "silent",
            NotConverged::NotReady { .. } => "not_ready",
            NotConverged::PartialView { .. } => "partial_view",
            NotConverged::NoOwner { .. } => "no_owner",
            NotConverged::NoAnnouncer => "no_announcer",
            NotConverged::Disputed { .. } => "disputed",
            NotConverged::NoMaster => "no_master",
            NotConverged::SeveralMasters { .. } => "several_masters",
            NotConverged::NotBackup { .. } => "not_backup",
            NotConverged::OwnerMoved { .. } => "owner_moved",
            NotConverged::ShortWindow => "short_window",
            NotConverged::NoArpAnswer => "no_arp_answer",
            NotConverged::SeveralArpAnswerers { .. } => "several_arp_answerers",
            NotConverged::ArpFromNonOwner { .. } => "arp_from_non_owner",
            NotConverged::ArpGap => "arp_gap",
            NotConverged::ProbeFromOther { .. } => "probe_from_other",
            NotConverged::FewProbesAnswered { .. } => "few_probes_answered",
            NotConverged::Misplaced { .. } => "misplaced",
        }
    }
}

impl fmt::Display for NotConverged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotConverged::Silent { node } => write!(f, "{node}'s daemon reports no state"),
            NotConverged::NotReady { node } => write!(f, "{node} has not joined the mesh"),
            NotConverged::PartialView {
                node,
                members,
                nodes,
            } => write!(f, "{node} sees {members} of {nodes} members"),
            NotConverged::NoOwner { node } => write!(f, "{node} names no owner"),
            NotConverged::NoAnnouncer => write!(f, "no MetalLB speaker announces the VIP"),
            NotConverged::Disputed { one, other } => {
                write!(f, "the speakers name both {one} and {other} as owner")
            }
            NotConverged::NoMaster => write!(f, "no keepalived is MASTER"),
            NotConverged::SeveralMasters { masters } => {
                write!(f, "several keepalived are MASTER: {}", masters.join(", "))
            }
            NotConverged::NotBackup { node, state } => {
                write!(f, "{node}'s keepalived is {state:?}, not BACKUP")
            }
            NotConverged::OwnerMoved { before, after } => {
                write!(
                    f,
                    "the owner moved from {before} to {after} during the window"
                )
            }
            NotConverged::ShortWindow => write!(f, "the window was shorter than {WINDOW:?}"),
            NotConverged::NoArpAnswer => write!(f, "nobody answered ARP for the VIP"),
            NotConverged::SeveralArpAnswerers { macs } => {
                write!(
                    f,
                    "several MACs answered ARP for the VIP: {}",
                    macs.join(", ")
                )
            }
            NotConverged::ArpFromNonOwner { mac, owner } => {
                write!(f, "{mac} answered ARP for the VIP, not the owner {owner}")
            }
            NotConverged::ArpGap => {
                write!(f, "the owner did not answer ARP across the whole window")
            }
            NotConverged::ProbeFromOther { node, owner } => {
                write!(f, "{node} answered a probe, not the owner {owner}")
            }
            NotConverged::FewProbesAnswered { answered, sent } => {
                write!(f, "only {answered} of {sent} probes were answered")
            }
            NotConverged::Misplaced { expected, found } => write!(
                f,
                "{found} owns the VIP, but the election rule names {expected} for a settled cluster"
            ),
        }
    }
}

/// The verdict on one observation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Measure: `owner` owns the VIP and alone answers for it.
    Converged {
        /// The owner (a node name).
        owner: String,
    },
    /// Not yet; observe again.
    Wait(NotConverged),
    /// Not within the time allowed: report the trial as failed, never measure it.
    Failed(NotConverged),
}

/// Decides on `observation` of the lab of `nodes`, after `waited` of the `limit` allowed.
pub fn decide(
    nodes: &[Node],
    observation: &Observation,
    waited: Duration,
    limit: Duration,
) -> Verdict {
    match converged_owner(nodes, observation) {
        Ok(owner) => Verdict::Converged { owner },
        Err(reason) if waited >= limit => Verdict::Failed(reason),
        Err(reason) => Verdict::Wait(reason),
    }
}

/// The re-check right before a fault: the daemons still name `owner` in `views`, and every probe
/// answered since the converged window began (`probes`) was answered by `owner`.
pub fn confirm(
    nodes: &[Node],
    owner: &str,
    views: &Views,
    probes: &[Option<String>],
) -> Result<(), NotConverged> {
    let named = named_owner(nodes, views)?;
    if named != owner {
        return Err(NotConverged::OwnerMoved {
            before: owner.to_string(),
            after: named,
        });
    }
    only_owner_answers(owner, probes)
}

fn converged_owner(nodes: &[Node], o: &Observation) -> Result<String, NotConverged> {
    let before = named_owner(nodes, &o.before)?;
    let after = named_owner(nodes, &o.after)?;
    if before != after {
        return Err(NotConverged::OwnerMoved { before, after });
    }
    if o.window < WINDOW {
        return Err(NotConverged::ShortWindow);
    }
    let macs: BTreeSet<[u8; 6]> = o.arp.iter().map(|c| c.mac).collect();
    let mac = match macs.len() {
        0 => return Err(NotConverged::NoArpAnswer),
        1 => *macs.first().expect("one MAC"),
        _ => {
            return Err(NotConverged::SeveralArpAnswerers {
                macs: macs.iter().map(|m| netns::mac_text(*m)).collect(),
            });
        }
    };
    if nodes.iter().find(|n| n.mac == mac).map(|n| &n.name) != Some(&after) {
        return Err(NotConverged::ArpFromNonOwner {
            mac: netns::mac_text(mac),
            owner: after,
        });
    }
    let early = o.arp.iter().any(|c| c.at < o.window / 4);
    let late = o.arp.iter().any(|c| c.at >= o.window * 3 / 4);
    if !(early && late) {
        return Err(NotConverged::ArpGap);
    }
    only_owner_answers(&after, &o.probes)?;
    Ok(after)
}

fn only_owner_answers(owner: &str, probes: &[Option<String>]) -> Result<(), NotConverged> {
    if let Some(other) = probes.iter().flatten().find(|n| *n != owner) {
        return Err(NotConverged::ProbeFromOther {
            node: other.clone(),
            owner: owner.to_string(),
        });
    }
    let answered = probes.iter().flatten().count();
    if answered * 2 < probes.len() {
        return Err(NotConverged::FewProbesAnswered {
            answered,
            sent: probes.len(),
        });
    }
    Ok(())
}

/// The owner the daemons name, when they name exactly one.
fn named_owner(nodes: &[Node], views: &Views) -> Result<String, NotConverged> {
    let name = |i: usize| {
        nodes
            .get(i)
            .map_or_else(|| format!("node{}", i + 1), |n| n.name.clone())
    };
    match views {
        Views::Swimlb(views) => {
            let mut named: Option<String> = None;
            for (i, view) in views.iter().enumerate() {
                let node = name(i);
                let Some(view) = view else {
                    return Err(NotConverged::Silent { node });
                };
                if !view.ready {
                    return Err(NotConverged::NotReady { node });
                }
                if view.members != nodes.len() {
                    return Err(NotConverged::PartialView {
                        node,
                        members: view.members,
                        nodes: nodes.len(),
                    });
                }
                let Some(owner) = &view.owner else {
                    return Err(NotConverged::NoOwner { node });
                };
                match &named {
                    Some(first) if first != owner => {
                        return Err(NotConverged::Disputed {
                            one: first.clone(),
                            other: owner.clone(),
                        });
                    }
                    _ => named = Some(owner.clone()),
                }
            }
            named.ok_or(NotConverged::Silent { node: name(0) })
        }
        Views::Metallb(views) => {
            let mut announcers = Vec::new();
            for (i, view) in views.iter().enumerate() {
                let node = name(i);
                let Some(view) = view else {
                    return Err(NotConverged::Silent { node });
                };
                if view.members != nodes.len() {
                    return Err(NotConverged::PartialView {
                        node,
                        members: view.members,
                        nodes: nodes.len(),
                    });
                }
                if view.announces {
                    announcers.push(node);
                }
            }
            match announcers.as_slice() {
                [] => Err(NotConverged::NoAnnouncer),
                [one] => Ok(one.clone()),
                [one, other, ..] => Err(NotConverged::Disputed {
                    one: one.clone(),
                    other: other.clone(),
                }),
            }
        }
        Views::Keepalived(states) => {
            let mut masters = Vec::new();
            for (i, state) in states.iter().enumerate() {
                match state {
                    None => return Err(NotConverged::Silent { node: name(i) }),
                    Some(VrrpState::Master) => masters.push(name(i)),
                    Some(VrrpState::Backup) => {}
                    Some(other) => {
                        return Err(NotConverged::NotBackup {
                            node: name(i),
                            state: other.clone(),
                        });
                    }
                }
            }
            match masters.len() {
                0 => Err(NotConverged::NoMaster),
                1 => Ok(masters.remove(0)),
                _ => Err(NotConverged::SeveralMasters { masters }),
            }
        }
    }
}

/// Whether `converged` is where the election rule puts the VIP (`expected`, when the daemons
/// have such a rule for a settled cluster).
pub fn placed(converged: &str, expected: Option<&str>) -> Result<(), NotConverged> {
    match expected {
        Some(expected) if expected != converged => Err(NotConverged::Misplaced {
            expected: expected.to_string(),
            found: converged.to_string(),
        }),
        _ => Ok(()),
    }
}

/// A converged lab, as [`wait`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Converged {
    /// The owner.
    pub owner: String,
    /// Its 1-based node index.
    pub index: usize,
    /// The first probe (an index into the prober's records) of the converged window.
    pub since: usize,
}

/// Observes the lab until it converges, at most `limit`: returns the owner, or the trial's
/// failure with the last reason. `progress` hears about every change of reason.
pub fn wait(
    lab: &Lab,
    daemons: &mut dyn Daemons,
    prober: &Prober,
    limit: Duration,
    progress: &mut dyn FnMut(&str),
) -> Result<Result<Converged, NotConverged>> {
    let started = Instant::now();
    let mut last: Option<&'static str> = None;
    loop {
        let before = daemons.views(lab);
        let since = prober.snapshot().len();
        let arp = probe::arp_claims(
            &lab.client_netns,
            netns::vip_v4(0),
            None,
            WINDOW.div_duration_f64(ARP_INTERVAL) as usize,
            ARP_INTERVAL,
        )?;
        let after = daemons.views(lab);
        let records = prober.snapshot();
        let observation = Observation {
            before,
            after,
            window: WINDOW,
            arp,
            // The newest probes' answers may still be in flight.
            probes: answers(&records[since.min(records.len())..records.len().saturating_sub(3)]),
        };
        match decide(&lab.nodes, &observation, started.elapsed(), limit) {
            Verdict::Converged { owner } => {
                let index = lab
                    .nodes
                    .iter()
                    .find(|n| n.name == owner)
                    .map(|n| n.index)
                    .expect("the owner is a lab node");
                return Ok(Ok(Converged {
                    owner,
                    index,
                    since,
                }));
            }
            Verdict::Wait(reason) => {
                if last != Some(reason.as_str()) {
                    progress(&format!("  waiting for the lab to converge: {reason}"));
                    last = Some(reason.as_str());
                }
            }
            Verdict::Failed(reason) => return Ok(Err(reason)),
        }
    }
}

/// Who answered each of `records`.
pub fn answers(records: &[probe::ProbeRecord]) -> Vec<Option<String>> {
    records
        .iter()
        .map(|r| r.answer.as_ref().map(|(n, _)| n.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn lab_nodes(n: usize) -> Vec<Node> {
        (1..=n)
            .map(|i| Node {
                index: i,
                name: format!("node{i}"),
                netns: format!("swl-test-n{i}"),
                v4: Ipv4Addr::new(198, 51, 100, 10 + i as u8),
                v6: Ipv6Addr::LOCALHOST,
                mac: [2, 0, 0, 0, 0, i as u8],
            })
            .collect()
    }

    fn agreed(owner: &str, nodes: usize) -> Views {
        Views::Swimlb(vec![
            Some(SpeakerView {
                owner: Some(owner.into()),
                members: nodes,
                ready: true,
            });
            nodes
        ])
    }

    /// `mac_of` answers every ARP request of a 1 s window.
    fn arp_from(mac_of: &[usize]) -> Vec<ArpClaim> {
        (0..10u64)
            .flat_map(|i| {
                mac_of.iter().map(move |&n| ArpClaim {
                    at: Duration::from_millis(i * 100 + 1),
                    mac: [2, 0, 0, 0, 0, n as u8],
                    reply: true,
                })
            })
            .collect()
    }

    fn probes_from(node: &str, n: usize) -> Vec<Option<String>> {
        vec![Some(node.to_string()); n]
    }

    fn steady(owner: usize) -> Observation {
        let name = format!("node{owner}");
        Observation {
            before: agreed(&name, 3),
            after: agreed(&name, 3),
            window: WINDOW,
            arp: arp_from(&[owner]),
            probes: probes_from(&name, 100),
        }
    }

    const LIMIT: Duration = Duration::from_secs(60);

    fn reason(verdict: Verdict) -> NotConverged {
        match verdict {
            Verdict::Wait(r) => r,
            other => panic!("expected a wait, got {other:?}"),
        }
    }

    #[test]
    fn one_mac_the_named_owners_answering_the_whole_window_is_converged() {
        let v = decide(&lab_nodes(3), &steady(3), Duration::ZERO, LIMIT);
        assert_eq!(
            v,
            Verdict::Converged {
                owner: "node3".into()
            }
        );
    }

    #[test]
    fn two_macs_answering_arp_is_not_converged_even_when_the_speakers_agree() {
        // The demo's 0 ms failover: node2 still answered while node3 was the owner.
        let mut o = steady(3);
        o.arp = arp_from(&[2, 3]);
        let r = reason(decide(&lab_nodes(3), &o, Duration::ZERO, LIMIT));
        assert_eq!(r.as_str(), "several_arp_answerers");
        assert!(r.to_string().contains("02:00:00:00:00:02"), "{r}");
    }

    #[test]
    fn two_keepalived_masters_are_not_converged_whoever_answers_arp() {
        // keepalived_lab's 2.1 ms failover: both nodes were MASTER after start-up.
        let mut o = steady(1);
        let two = Views::Keepalived(vec![Some(VrrpState::Master), Some(VrrpState::Master)]);
        o.before = two.clone();
        o.after = two;
        let r = reason(decide(&lab_nodes(2), &o, Duration::ZERO, LIMIT));
        assert_eq!(
            r,
            NotConverged::SeveralMasters {
                masters: vec!["node1".into(), "node2".into()]
            }
        );
    }

    #[test]
    fn one_keepalived_master_with_its_mac_alone_answering_is_converged() {
        let mut o = steady(2);
        let one = Views::Keepalived(vec![Some(VrrpState::Backup), Some(VrrpState::Master)]);
        o.before = one.clone();
        o.after = one;
        assert_eq!(
            decide(&lab_nodes(2), &o, Duration::ZERO, LIMIT),
            Verdict::Converged {
                owner: "node2".into()
            }
        );
    }

    #[test]
    fn a_keepalived_with_no_master_or_a_node_in_fault_or_unheard_waits() {
        let nodes = lab_nodes(2);
        for (states, expected) in [
            (
                vec![Some(VrrpState::Backup), Some(VrrpState::Backup)],
                "no_master",
            ),
            (
                vec![Some(VrrpState::Master), Some(VrrpState::Fault)],
                "not_backup",
            ),
            (vec![Some(VrrpState::Master), None], "silent"),
        ] {
            let mut o = steady(1);
            o.before = Views::Keepalived(states.clone());
            o.after = Views::Keepalived(states);
            assert_eq!(
                reason(decide(&nodes, &o, Duration::ZERO, LIMIT)).as_str(),
                expected
            );
        }
    }

    #[test]
    fn the_one_answering_mac_must_be_the_named_owners() {
        let mut o = steady(3);
        o.arp = arp_from(&[2]);
        assert_eq!(
            reason(decide(&lab_nodes(3), &o, Duration::ZERO, LIMIT)),
            NotConverged::ArpFromNonOwner {
                mac: "02:00:00:00:00:02".into(),
                owner: "node3".into()
            }
        );
    }

    #[test]
    fn speakers_that_disagree_are_silent_unready_or_see_part_of_the_mesh_wait() {
        let nodes = lab_nodes(3);
        let view = |owner: &str, members, ready| {
            Some(SpeakerView {
                owner: Some(owner.into()),
                members,
                ready,
            })
        };
        for (views, expected) in [
            (
                vec![
                    view("node3", 3, true),
                    view("node2", 3, true),
                    view("node3", 3, true),
                ],
                "disputed",
            ),
            (
                vec![view("node3", 3, true), None, view("node3", 3, true)],
                "silent",
            ),
            (
                vec![
                    view("node3", 3, true),
                    view("node2", 1, true),
                    view("node3", 3, true),
                ],
                "partial_view",
            ),
            (
                vec![
                    view("node3", 3, true),
                    view("node3", 3, true),
                    view("node3", 3, false),
                ],
                "not_ready",
            ),
        ] {
            let mut o = steady(3);
            o.after = Views::Swimlb(views);
            assert_eq!(
                reason(decide(&nodes, &o, Duration::ZERO, LIMIT)).as_str(),
                expected
            );
        }
    }

    #[test]
    fn an_owner_named_differently_before_and_after_the_window_waits() {
        let mut o = steady(3);
        o.before = agreed("node2", 3);
        assert_eq!(
            reason(decide(&lab_nodes(3), &o, Duration::ZERO, LIMIT)),
            NotConverged::OwnerMoved {
                before: "node2".into(),
                after: "node3".into()
            }
        );
    }

    #[test]
    fn an_owner_that_answered_arp_only_part_of_the_window_waits() {
        let mut o = steady(3);
        o.arp.retain(|c| c.at < Duration::from_millis(500));
        assert_eq!(
            reason(decide(&lab_nodes(3), &o, Duration::ZERO, LIMIT)),
            NotConverged::ArpGap
        );
        o.arp.clear();
        assert_eq!(
            reason(decide(&lab_nodes(3), &o, Duration::ZERO, LIMIT)),
            NotConverged::NoArpAnswer
        );
        let mut short = steady(3);
        short.window = Duration::from_millis(500);
        assert_eq!(
            reason(decide(&lab_nodes(3), &short, Duration::ZERO, LIMIT)),
            NotConverged::ShortWindow
        );
    }

    #[test]
    fn a_probe_answered_by_another_node_or_mostly_lost_probes_wait() {
        let mut o = steady(3);
        o.probes[40] = Some("node2".into());
        assert_eq!(
            reason(decide(&lab_nodes(3), &o, Duration::ZERO, LIMIT)).as_str(),
            "probe_from_other"
        );
        let mut lossy = steady(3);
        for p in lossy.probes.iter_mut().take(60) {
            *p = None;
        }
        assert_eq!(
            reason(decide(&lab_nodes(3), &lossy, Duration::ZERO, LIMIT)),
            NotConverged::FewProbesAnswered {
                answered: 40,
                sent: 100
            }
        );
        // Some loss (with `--loss`) is fine.
        let mut some = steady(3);
        for p in some.probes.iter_mut().step_by(10) {
            *p = None;
        }
        assert!(matches!(
            decide(&lab_nodes(3), &some, Duration::ZERO, LIMIT),
            Verdict::Converged { .. }
        ));
    }

    #[test]
    fn past_the_limit_a_wait_becomes_a_failure_with_its_reason() {
        let mut o = steady(3);
        o.arp = arp_from(&[2, 3]);
        let v = decide(&lab_nodes(3), &o, LIMIT, LIMIT);
        assert!(
            matches!(&v, Verdict::Failed(r) if r.as_str() == "several_arp_answerers"),
            "{v:?}"
        );
        // A converged lab is converged however long it took.
        assert!(matches!(
            decide(&lab_nodes(3), &steady(3), LIMIT * 2, LIMIT),
            Verdict::Converged { .. }
        ));
    }

    #[test]
    fn confirm_catches_an_owner_that_moved_after_the_window() {
        let nodes = lab_nodes(3);
        let probes = probes_from("node3", 50);
        assert_eq!(
            confirm(&nodes, "node3", &agreed("node3", 3), &probes),
            Ok(())
        );
        assert_eq!(
            confirm(&nodes, "node3", &agreed("node2", 3), &probes),
            Err(NotConverged::OwnerMoved {
                before: "node3".into(),
                after: "node2".into()
            })
        );
        let mut moved = probes.clone();
        moved.push(Some("node2".into()));
        assert_eq!(
            confirm(&nodes, "node3", &agreed("node3", 3), &moved)
                .unwrap_err()
                .as_str(),
            "probe_from_other"
        );
    }

    #[test]
    fn one_metallb_speaker_announcing_with_full_memberlists_is_the_owner() {
        let nodes = lab_nodes(3);
        let view = |announces, members| Some(MetallbView { announces, members });
        let named = |views: Vec<Option<MetallbView>>| named_owner(&nodes, &Views::Metallb(views));
        assert_eq!(
            named(vec![view(false, 3), view(false, 3), view(true, 3)]),
            Ok("node3".to_string())
        );
        assert_eq!(
            named(vec![view(false, 3), view(false, 3), view(false, 3)]),
            Err(NotConverged::NoAnnouncer)
        );
        assert_eq!(
            named(vec![view(false, 3), view(true, 3), view(true, 3)])
                .unwrap_err()
                .as_str(),
            "disputed"
        );
        assert_eq!(
            named(vec![view(false, 2), view(false, 3), view(true, 3)])
                .unwrap_err()
                .as_str(),
            "partial_view"
        );
        assert_eq!(
            named(vec![view(false, 3), None, view(true, 3)])
                .unwrap_err()
                .as_str(),
            "silent"
        );
    }

    #[test]
    fn vrrp_states_parse_and_unknown_words_are_kept() {
        assert_eq!(VrrpState::parse("MASTER"), VrrpState::Master);
        assert_eq!(VrrpState::parse("BACKUP"), VrrpState::Backup);
        assert_eq!(VrrpState::parse("FAULT"), VrrpState::Fault);
        assert_eq!(VrrpState::parse("STOP"), VrrpState::Stop);
        assert_eq!(
            VrrpState::parse("DELETED"),
            VrrpState::Unknown("DELETED".into())
        );
    }

    #[test]
    fn an_owner_other_than_the_rules_is_misplaced_and_no_rule_accepts_any() {
        assert_eq!(placed("node3", Some("node3")), Ok(()));
        assert_eq!(placed("node2", None), Ok(()));
        let err = placed("node2", Some("node3")).unwrap_err();
        assert_eq!(err.as_str(), "misplaced");
        assert_eq!(
            err.to_string(),
            "node2 owns the VIP, but the election rule names node3 for a settled cluster"
        );
    }
}
