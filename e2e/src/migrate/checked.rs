//! The chaos checker's invariants ([`crate::chaos::invariants`]) over `migrate --from
//! keepalived-fast`: the switch and the crashes as the checker's faults, the client's probes and
//! ARP answers and the speakers' `/status` as its observations, and the lab's election rule
//! with the priorities the converted files carry.
//!
//! - A node switched is a daemon killed (keepalived stopped) and started again (the speaker);
//!   a crash of the owner is its link down, with its keepalived stopped and started again
//!   before the link comes back up.
//! - `/status` is read at the end of each step: while keepalived runs beside them the speakers
//!   name the owner among themselves, not the VRRP master they yield to, so in the mixed states
//!   only the client's ARP answers say who owns (every view is left empty); once every node
//!   runs a speaker their views count too.

use std::net::Ipv4Addr;
use std::time::Duration;

use tokio::time::Instant;

use crate::chaos::invariants::{
    self, ArpSample, Executed, Observations, Poll, Probe, Rule, Violation, VipObservations,
    VipRule, World,
};
use crate::chaos::schedule::{Fault, FaultKind, Step};
use crate::netns::Lab;
use crate::probe::{ArpAnswers, ProbeRecord};

/// The faults of a run as the checker replays them, timed from `t0`.
#[derive(Debug)]
pub struct Timeline {
    t0: Instant,
    faults: Vec<Fault>,
    executed: Vec<Executed>,
    polls: Vec<Poll>,
}

impl Timeline {
    /// A run that starts at `t0` (every node up, its daemon running).
    pub fn new(t0: Instant) -> Timeline {
        Timeline {
            t0,
            faults: Vec::new(),
            executed: Vec::new(),
            polls: Vec::new(),
        }
    }

    fn since(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.t0)
    }

    /// `kind` put on between `began` and `done`; returns the fault to [`Timeline::undo`].
    pub fn apply(&mut self, kind: FaultKind, began: Instant, done: Instant) -> usize {
        let fault = self.faults.len();
        let at = self.since(began);
        self.faults.push(Fault {
            at,
            duration: Duration::ZERO,
            kind,
        });
        self.executed.push(Executed {
            at,
            began: at,
            done: self.since(done),
            fault,
            step: Step::Apply,
        });
        fault
    }

    /// `fault` taken off between `began` and `done` (in effect once done).
    pub fn undo(&mut self, fault: usize, began: Instant, done: Instant) {
        let at = self.since(done);
        if let Some(f) = self.faults.get_mut(fault) {
            f.duration = at.saturating_sub(f.at);
        }
        self.executed.push(Executed {
            at,
            began: self.since(began),
            done: at,
            fault,
            step: Step::Undo,
        });
    }

    /// A round of `/status` reads that started at `at` and ended at `done`: per node, the
    /// owner it names for the VIP (`None`: no view).
    pub fn poll(&mut self, at: Instant, done: Instant, owners: Vec<Option<Option<String>>>) {
        let poll = Poll {
            at: self.since(at),
            done: self.since(done),
            owners: owners
                .into_iter()
                .map(|o| o.map(|owner| vec![owner]))
                .collect(),
        };
        self.polls.push(poll);
    }

    /// The faults as executed so far, replayed over `nodes` nodes, and the `/status` rounds:
    /// what [`Timeline::evaluate`] judges, for a caller that builds its own rule.
    pub fn replay(&self, nodes: usize) -> (World, Vec<Poll>) {
        (
            World::new(&self.faults, &self.executed, nodes),
            self.polls.clone(),
        )
    }

    /// The checker's verdict over what the client saw: `probes` and `arp` (sent from
    /// `arp_from` on) for the VIP `vip`, with `priorities` per node and the groups'
    /// `preempt_delay`.
    pub fn evaluate(
        &self,
        lab: &Lab,
        vip: Ipv4Addr,
        priorities: Vec<u8>,
        preempt_delay: Duration,
        (probes, arp, arp_from): (&[ProbeRecord], &[ArpAnswers], Instant),
    ) -> Vec<Violation> {
        let names: Vec<String> = lab.nodes.iter().map(|n| n.name.clone()).collect();
        let rule = Rule {
            vips: vec![VipRule {
                ip: vip,
                checked: false,
                local: false,
                priorities,
            }],
            names,
            preempt_delay,
        };
        let world = World::new(&self.faults, &self.executed, lab.nodes.len());
        let node_of = |mac: &[u8; 6]| {
            lab.nodes
                .iter()
                .find(|n| n.mac == *mac)
                .map_or(0, |n| n.index)
        };
        let observed = VipObservations {
            probes: probes
                .iter()
                .filter(|r| r.sent >= self.t0)
                .map(|r| Probe {
                    sent: self.since(r.sent),
                    answered: r.answer.is_some(),
                })
                .collect(),
            arp: arp
                .iter()
                .map(|a| ArpSample {
                    at: self.since(arp_from + a.at),
                    nodes: a.macs.iter().map(node_of).collect(),
                })
                .collect(),
        };
        let horizon = observed
            .probes
            .last()
            .map_or(Duration::ZERO, |p| p.sent)
            .min(observed.arp.last().map_or(Duration::ZERO, |a| a.at));
        let obs = Observations {
            vips: vec![observed],
            polls: self.polls.clone(),
            records: Vec::new(),
            horizon,
        };
        invariants::evaluate(&rule, &world, &obs, true)
    }
}
