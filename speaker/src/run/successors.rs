//! The successors the owner watch's plan sends heartbeats to, kept per answered IP (see
//! [`Successors`]).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use crate::model::engine::{Action, Engine, Input};
use crate::model::membership::NodeName;
use crate::run::daemon::WATCH_DEPTH;

/// The first [`WATCH_DEPTH`] successors of every IP this node answers for, and how many IPs each
/// would take over at each depth: the owner watch's plan sends heartbeats to the ranked first
/// ones. Kept per IP, so that an event that changes a few IPs (an EndpointSlice) costs a few
/// elections, not one per answered IP; a change of the live set or of the whole snapshot
/// recomputes everything.
#[derive(Debug)]
pub(crate) struct Successors {
    of: HashMap<IpAddr, Vec<NodeName>>,
    /// Per member, the IPs it is the first, second, ... successor of.
    counts: HashMap<NodeName, [usize; WATCH_DEPTH]>,
    /// Everything must be recomputed.
    all: bool,
    /// These IPs must be recomputed.
    dirty: HashSet<IpAddr>,
}

impl Default for Successors {
    fn default() -> Self {
        Successors {
            of: HashMap::new(),
            counts: HashMap::new(),
            all: true,
            dirty: HashSet::new(),
        }
    }
}

impl Successors {
    pub(crate) fn invalidate_all(&mut self) {
        self.all = true;
        self.dirty.clear();
    }

    pub(crate) fn invalidate(&mut self, ip: IpAddr) {
        if !self.all {
            self.dirty.insert(ip);
        }
    }

    /// Invalidates what `input` may change: the IPs it names, or everything.
    pub(crate) fn input(&mut self, input: &Input) {
        match input {
            Input::Served(entries) => {
                for (ip, _) in entries {
                    self.invalidate(*ip);
                }
            }
            Input::Snapshot(_) | Input::Live(_) | Input::Member { .. } | Input::Net { .. } => {
                self.invalidate_all()
            }
            Input::Moved { ip, .. } => self.invalidate(*ip),
            Input::Hold(_)
            | Input::Yield(_)
            | Input::Conflict { .. }
            | Input::Tick
            | Input::Drain => {}
        }
    }

    /// Invalidates the IPs whose answering or view `actions` changed.
    pub(crate) fn actions(&mut self, actions: &[Action]) {
        for action in actions {
            if let Action::Answer { ip, .. }
            | Action::Silence { ip, .. }
            | Action::Status { ip, .. } = action
            {
                self.invalidate(*ip);
            }
        }
    }

    pub(crate) fn is_clean(&self) -> bool {
        !self.all && self.dirty.is_empty()
    }

    /// Recomputes what was invalidated, from the engine's election and live set.
    pub(crate) fn refresh(&mut self, engine: &Engine) {
        let election = engine.election();
        let live = engine.live();
        let line = |ip: &IpAddr| election.successors(ip, live, WATCH_DEPTH);
        if std::mem::take(&mut self.all) {
            self.dirty.clear();
            self.of.clear();
            self.counts.clear();
            for ip in engine.answering().keys() {
                self.set(*ip, line(ip));
            }
        } else {
            for ip in std::mem::take(&mut self.dirty) {
                let next = if engine.answering().contains_key(&ip) {
                    line(&ip)
                } else {
                    Vec::new()
                };
                self.set(ip, next);
            }
        }
    }

    pub(crate) fn set(&mut self, ip: IpAddr, next: Vec<NodeName>) {
        for (depth, old) in self.of.remove(&ip).into_iter().flatten().enumerate() {
            if let Some(counts) = self.counts.get_mut(&old) {
                counts[depth] -= 1;
                if counts.iter().all(|n| *n == 0) {
                    self.counts.remove(&old);
                }
            }
        }
        for (depth, node) in next.iter().enumerate() {
            self.counts.entry(node.clone()).or_default()[depth] += 1;
        }
        if !next.is_empty() {
            self.of.insert(ip, next);
        }
    }

    /// At most `max` successors: first those that are the first successor of the most IPs, then
    /// by the IPs they are the second successor of, and so on (ties by name).
    pub(crate) fn ranked(&self, max: usize) -> Vec<NodeName> {
        let mut ranked: Vec<(&NodeName, &[usize; WATCH_DEPTH])> = self.counts.iter().collect();
        ranked.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
        ranked
            .into_iter()
            .take(max)
            .map(|(node, _)| node.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;
    use crate::model::membership::MemberMeta;
    use crate::owner_watch::service::MAX_WATCHERS;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// The plan's successors kept per IP equal a full recomputation after every input, as the
    /// daemon invalidates them (Served entries that move IPs between nodes, members down and
    /// up).
    #[test]
    fn successors_kept_per_ip_equal_a_full_recomputation() {
        use crate::model::engine::tests::{engine, ip, member};
        use crate::model::snapshot::{Interfaces, NodeFilter, ServedIp, Snapshot};
        use std::sync::Arc;

        let nodes = ["a", "b", "c", "d", "e"];
        let members: Vec<MemberMeta> = nodes.iter().map(|n| member(n, 50)).collect();
        let addr = |i: u32| ip(&format!("192.0.2.{}", i + 1));
        let entry = |mask: u32| {
            let mut served = ServedIp::group("api", Interfaces::Default);
            let only: std::collections::BTreeSet<NodeName> = nodes
                .iter()
                .enumerate()
                .filter(|(k, _)| mask & (1 << k) != 0)
                .map(|(_, n)| n.to_string())
                .collect();
            served.nodes = NodeFilter::Only(Arc::new(only));
            Arc::new(served)
        };
        let mut snapshot = Snapshot::new();
        for i in 0..40 {
            snapshot.insert(addr(i), (*entry(0b11111)).clone()).unwrap();
        }
        let t0 = Instant::now();
        let mut engine = engine(t0, "a", snapshot, &members);
        let mut kept = Successors::default();
        kept.refresh(&engine);
        // A small linear congruential generator: the same steps on every run.
        let mut seed: u32 = 7;
        let mut next = move || {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            seed >> 8
        };
        let mut moved = 0;
        for step in 0..300 {
            let input = match next() % 10 {
                0 => {
                    let node = nodes[1 + (next() % 4) as usize];
                    let down = next() % 2 == 0;
                    Input::Member {
                        node: node.to_string(),
                        record: (!down).then(|| member(node, 50)),
                        joined: !down,
                    }
                }
                _ => Input::Served(
                    (0..1 + next() % 3)
                        .map(|_| {
                            let i = next() % 40;
                            let mask = next() % 32;
                            (addr(i), (mask != 0).then(|| entry(mask)))
                        })
                        .collect(),
                ),
            };
            kept.input(&input);
            let actions = engine.handle(t0 + ms(step), input);
            kept.actions(&actions);
            let before = kept.counts.clone();
            kept.refresh(&engine);
            moved += usize::from(before != kept.counts);
            let mut fresh = Successors::default();
            fresh.refresh(&engine);
            assert_eq!(kept.counts, fresh.counts, "step {step}");
            assert_eq!(kept.of, fresh.of, "step {step}");
            assert_eq!(kept.ranked(MAX_WATCHERS), fresh.ranked(MAX_WATCHERS));
            assert!(kept.is_clean());
        }
        assert!(moved > 50, "the steps moved successors {moved} times");
    }

    /// The plan's watchers: every first successor before any second one, then by count.
    #[test]
    fn first_successors_rank_before_second_ones() {
        let ip = |i: u8| IpAddr::from([192, 0, 2, i]);
        let name = |n: &str| n.to_string();
        let mut line = Successors::default();
        line.set(ip(1), vec![name("b"), name("c")]);
        line.set(ip(2), vec![name("d"), name("c")]);
        line.set(ip(3), vec![name("d"), name("e")]);
        line.set(ip(4), vec![name("e"), name("c")]);
        // d first of 2; e first of 1 and second of 1; b first of 1; c second of 3.
        assert_eq!(line.ranked(3), ["d", "e", "b"]);
        assert_eq!(line.ranked(5), ["d", "e", "b", "c"]);
        line.set(ip(2), vec![name("c")]);
        line.set(ip(3), Vec::new());
        assert_eq!(line.counts.get("d"), None, "gone once it succeeds nothing");
        assert_eq!(line.ranked(5), ["c", "b", "e"]);
    }
}
