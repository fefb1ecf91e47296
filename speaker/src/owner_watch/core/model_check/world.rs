//! The checked world: `n` members, each a real gossip [`Core`] on the [`SimNet`] and a
//! [`Node`] (the daemon's other cores and its glue), the owner-watch datagrams on a queue of
//! their own, the segment on which announcements are seen, and the faults.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::time::Instant;

use super::node::{Node, owners};
use crate::gossip::simnet::{Links, SimNet, Timeline};
use crate::gossip::{Core, GossipMetrics, GossipSettings, Timing};
use crate::model::election::elect;
use crate::model::membership::{LiveSet, MemberMeta, NodeName};
use crate::model::snapshot::{ServedIp, Snapshot};
use crate::owner_watch::core::watch_addr;

/// One-way delay of every datagram (the SimNet's and the watch queue's).
pub const DELAY: Duration = Duration::from_millis(1);
/// The longest the world runs between two looks at every node (the gossip's events in
/// between are run at their own times; the daemon reacts to its changes at most this late).
pub const STEP: Duration = Duration::from_millis(2);

/// Which traffic a cut or a delay acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Port {
    /// The gossip port.
    Gossip,
    /// The owner watch's port.
    Watch,
}

/// A watch datagram on its way.
#[derive(Debug)]
struct Datagram {
    to: usize,
    from: SocketAddr,
    bytes: Vec<u8>,
}

/// A running member.
#[derive(Debug)]
struct Member {
    node: Node,
    bump: u64,
}

/// The world.
#[derive(Debug)]
pub struct World {
    /// The gossip cores.
    pub net: SimNet,
    members: Vec<Option<Member>>,
    /// Until when each member is stopped (SIGSTOP).
    paused: Vec<Option<Duration>>,
    bumps: Vec<u64>,
    snapshot: Snapshot,
    origin: Instant,
    watch: Timeline<Datagram>,
    /// Cut (from, to, port).
    cuts: BTreeSet<(usize, usize, Port)>,
    /// Extra one-way delay of watch datagrams (from, to).
    delays: BTreeMap<(usize, usize), Duration>,
    /// Announcements seen on the segment: (at, sender, ip).
    segment: Vec<(Duration, usize, IpAddr)>,
}

/// Node `i`'s name.
pub fn name(i: usize) -> NodeName {
    format!("node{}", i + 1)
}

/// The served IPs: one Kubernetes Service each (priority 0, MetalLB's order).
pub fn snapshot(vips: &[IpAddr]) -> Snapshot {
    let mut snapshot = Snapshot::new();
    for (k, vip) in vips.iter().enumerate() {
        snapshot
            .insert(*vip, ServedIp::service("default", &format!("svc-{k}")))
            .expect("one entry per IP");
    }
    snapshot
}

fn record(i: usize) -> MemberMeta {
    let mut meta = MemberMeta::new(name(i));
    meta.settled = true;
    meta
}

impl World {
    /// `n` members started together at time zero, serving `vips`.
    pub fn new(n: usize, vips: &[IpAddr], seed: u64) -> World {
        let links = Links {
            loss: 0.0,
            delay_min: DELAY,
            delay_max: DELAY,
        };
        let mut world = World {
            net: SimNet::new(seed, links),
            members: (0..n).map(|_| None).collect(),
            paused: vec![None; n],
            bumps: vec![1; n],
            snapshot: snapshot(vips),
            origin: Instant::now(),
            watch: Timeline::default(),
            cuts: BTreeSet::new(),
            delays: BTreeMap::new(),
            segment: Vec::new(),
        };
        for i in 0..n {
            world.start(i);
        }
        world
    }

    /// The members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// The virtual time.
    pub fn now(&self) -> Duration {
        self.net.now()
    }

    /// Member `i`'s daemon, if it runs.
    pub fn node(&self, i: usize) -> Option<&Node> {
        self.members.get(i)?.as_ref().map(|m| &m.node)
    }

    /// Whether member `i` runs and is not stopped.
    pub fn active(&self, i: usize) -> bool {
        self.members[i].is_some() && self.paused[i].is_none_or(|until| until <= self.now())
    }

    /// Starts member `i` under its next identity.
    fn start(&mut self, i: usize) {
        let now = self.now();
        let settings = GossipSettings {
            node: name(i),
            addr: SimNet::addr(i),
            seeds: (0..self.len()).map(SimNet::addr).collect(),
            timing: Timing::fast(),
            bump: self.bumps[i],
            rng_seed: (i as u64) << 16 ^ self.bumps[i],
        };
        let ring = swimlb_proto::KeyRing::new("swimlb-model-check", &[[9; 32]]).expect("keys");
        let core = Core::new(settings, ring, record(i), GossipMetrics::default(), now)
            .expect("a gossip core");
        let node = Node::start(i, &core, self.snapshot.clone(), self.origin, now);
        self.net.start(i, core);
        self.members[i] = Some(Member {
            node,
            bump: self.bumps[i],
        });
        self.flush(i);
    }

    /// Kills member `i` (SIGKILL): it stops at once, without a word.
    pub fn kill(&mut self, i: usize) {
        self.net.crash(i);
        self.members[i] = None;
        self.paused[i] = None;
    }

    /// Starts member `i` again under a renewed identity.
    pub fn restart(&mut self, i: usize) {
        if self.members[i].is_none() {
            self.bumps[i] += 1;
            self.start(i);
        }
    }

    /// Stops member `i` (SIGSTOP) until `until`, or longer if it is stopped longer already
    /// (the first SIGCONT resumes it).
    pub fn pause(&mut self, i: usize, until: Duration) {
        let until = self.paused[i].map_or(until, |held| held.max(until));
        if self.members[i].is_some() {
            self.paused[i] = Some(until);
            self.net.pause(i, until);
        }
    }

    /// Cuts `port` from `from` to `to` (`on`) or heals it.
    pub fn cut(&mut self, from: usize, to: usize, port: Port, on: bool) {
        if on {
            self.cuts.insert((from, to, port));
        } else {
            self.cuts.remove(&(from, to, port));
        }
        self.net.heal();
        for (a, b, p) in &self.cuts {
            if *p == Port::Gossip {
                self.net.cut_one_way(*a, *b);
            }
        }
    }

    /// Delays the watch datagrams from `from` to `to` by `extra` (zero: no longer).
    pub fn delay(&mut self, from: usize, to: usize, extra: Duration) {
        if extra.is_zero() {
            self.delays.remove(&(from, to));
        } else {
            self.delays.insert((from, to), extra);
        }
    }

    /// Whether the live members' gossip graph (running and not stopped, as the chaos runs
    /// count them; an edge where the gossip passes both ways) is disconnected.
    pub fn mesh_cut(&self) -> bool {
        let live: Vec<usize> = (0..self.len()).filter(|i| self.active(*i)).collect();
        let Some(&first) = live.first() else {
            return false;
        };
        let edge = |a: usize, b: usize| {
            !self.cuts.contains(&(a, b, Port::Gossip)) && !self.cuts.contains(&(b, a, Port::Gossip))
        };
        let mut reached = BTreeSet::from([first]);
        let mut todo = vec![first];
        while let Some(a) = todo.pop() {
            for &b in &live {
                if !reached.contains(&b) && edge(a, b) {
                    reached.insert(b);
                    todo.push(b);
                }
            }
        }
        reached.len() < live.len()
    }

    /// The owners the rule names: the election over every member that runs, as each would
    /// record itself.
    pub fn rule(&self) -> BTreeMap<IpAddr, Option<NodeName>> {
        let mut live = LiveSet::new();
        for i in (0..self.len()).filter(|i| self.members[*i].is_some()) {
            live.upsert(record(i));
        }
        elect(&self.snapshot, &live)
            .into_iter()
            .map(|(ip, o)| (ip, o.owner().map(str::to_string)))
            .collect()
    }

    /// The owners member `i` names.
    pub fn named(&self, i: usize) -> Option<BTreeMap<IpAddr, Option<NodeName>>> {
        self.node(i).map(|n| owners(&n.engine))
    }

    /// Who answers `ip` now: the active members whose responder answers it.
    pub fn answering(&self, ip: &IpAddr) -> Vec<usize> {
        (0..self.len())
            .filter(|i| self.active(*i))
            .filter(|i| self.node(*i).is_some_and(|n| n.answering.contains(ip)))
            .collect()
    }

    /// Runs to `until`, in steps of at most [`STEP`].
    pub fn run_until(&mut self, until: Duration) {
        while self.now() < until {
            let next = self.next_at().min(self.now() + STEP).min(until);
            self.step(next.max(self.now() + Duration::from_micros(1)).min(until));
        }
    }

    fn next_at(&self) -> Duration {
        let nodes = (0..self.len())
            .filter_map(|i| self.node(i)?.next_deadline())
            .filter(|at| *at > self.now());
        nodes
            .chain(self.watch.next_at())
            .min()
            .unwrap_or(Duration::MAX)
    }

    /// Everything due up to `at`.
    fn step(&mut self, at: Duration) {
        self.net.run_until(at);
        self.gossip_to_daemons();
        while let Some((_, d)) = self.watch.pop_due(at) {
            if self.members[d.to].is_none() {
                continue;
            }
            if let Some(until) = self.paused[d.to].filter(|u| *u > at) {
                self.watch.push(until, d);
                continue;
            }
            let mut bytes = d.bytes;
            self.with_node(d.to, |node, core, now| {
                node.datagram(core, now, d.from, &mut bytes);
            });
        }
        for i in 0..self.len() {
            self.with_node(i, |node, core, now| node.tick(core, now));
        }
        self.segment_to_daemons();
    }

    /// Calls `f` on active member `i`'s daemon with its gossip core, then carries what it
    /// queued.
    fn with_node(&mut self, i: usize, f: impl FnOnce(&mut Node, &crate::gossip::Core, Duration)) {
        if !self.active(i) {
            return;
        }
        let now = self.now();
        let (Some(member), Some(core)) = (self.members[i].as_mut(), self.net.core(i)) else {
            return;
        };
        if core.identity().bump != member.bump {
            member.bump = core.identity().bump;
            let mut meta = core.own_meta().clone();
            meta.settled = true;
            member.node.renewed(core, now);
            let _ = self.net.with_core(i, |c, now| c.set_meta(now, meta));
        }
        let (Some(member), Some(core)) = (self.members[i].as_mut(), self.net.core(i)) else {
            return;
        };
        f(&mut member.node, core, now);
        self.flush(i);
    }

    /// Carries what member `i`'s daemon queued: watch datagrams, relays, heard, announcements.
    fn flush(&mut self, i: usize) {
        let now = self.now();
        let Some(member) = self.members[i].as_mut() else {
            return;
        };
        let out = member.node.take_out();
        for d in out.datagrams {
            let Some(to) = (0..self.len()).find(|j| watch_addr(SimNet::addr(*j)) == Some(d.to))
            else {
                continue;
            };
            if self.cuts.contains(&(i, to, Port::Watch)) {
                continue;
            }
            let extra = self.delays.get(&(i, to)).copied().unwrap_or_default();
            let from = watch_addr(SimNet::addr(i)).expect("a watch port");
            let datagram = Datagram {
                to,
                from,
                bytes: d.bytes,
            };
            self.watch.push(now + DELAY + extra, datagram);
        }
        for payload in out.relays {
            self.net.with_core(i, |core, _| core.relay_watch(&payload));
        }
        for (addr, bump) in out.heard {
            self.net
                .with_core(i, |core, now| core.heard_on_watch(now, addr, bump));
        }
        for ip in out.announced {
            self.segment.push((now, i, ip));
        }
    }

    /// The gossip's changes and relayed watch payloads, to the daemons.
    fn gossip_to_daemons(&mut self) {
        let changes: Vec<_> = self.net.drain_changes().collect();
        for (_, i, change) in changes {
            self.with_node(i, |node, core, now| node.membership(core, now, change));
        }
        let relayed: Vec<_> = self.net.drain_watch_relayed().collect();
        for (_, i, r) in relayed {
            self.with_node(i, |node, core, now| {
                node.relayed(core, now, r.from, &r.payload);
            });
        }
    }

    /// Announcements on the segment reach every other active member (a stopped one's
    /// responder sees nothing: its quarantine drops what waited).
    fn segment_to_daemons(&mut self) {
        for _ in 0..8 {
            let seen = std::mem::take(&mut self.segment);
            if seen.is_empty() {
                return;
            }
            for (_, from, ip) in seen {
                for i in (0..self.len()).filter(|i| *i != from) {
                    self.with_node(i, |node, core, now| node.conflict(core, now, ip, from));
                }
            }
        }
    }
}
