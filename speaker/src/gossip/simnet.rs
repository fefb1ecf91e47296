//! A deterministic in-process network for gossip [`Core`]s: a virtual clock, one ordered event
//! queue, seeded loss and delay, crashes and partitions, slow and paused nodes
//! ([`SimNet::set_lag`], [`SimNet::pause`]), and a tap that records datagrams for
//! replaying them later ([`SimNet::tap`], [`SimNet::inject`]). No sockets, no tokio, no wall
//! clock.
//!
//! It runs the real core: the tests of this module and `swimlb-lab sim` drive the same code the
//! speaker runs. Given the same seed and the same calls it produces the same run (the envelope's
//! random nonces change the bytes, never their length or the protocol's behaviour).

use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::core::{Core, WatchRelayed};
use crate::model::membership::LiveChange;

/// Link behaviour for every datagram.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Links {
    /// Probability in [0, 1] that a datagram is lost.
    pub loss: f64,
    /// Shortest one-way delay.
    pub delay_min: Duration,
    /// Longest one-way delay (uniform between the two).
    pub delay_max: Duration,
}

impl Default for Links {
    fn default() -> Links {
        Links {
            loss: 0.0,
            delay_min: Duration::from_micros(200),
            delay_max: Duration::from_millis(2),
        }
    }
}

/// Traffic one node sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Datagrams sent.
    pub packets: u64,
    /// Sealed bytes sent.
    pub bytes: u64,
}

/// A datagram as a node sent it, recorded by [`SimNet::tap`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tapped {
    /// When it was sent.
    pub at: Duration,
    /// The sender's address.
    pub from: SocketAddr,
    /// The destination.
    pub to: SocketAddr,
    /// The sealed bytes.
    pub bytes: Vec<u8>,
}

/// What a simulated network does at a given time: deliver a datagram or wake a node's timers.
/// Shared with the lab's simulation of the owner watch, which runs beside this network.
#[derive(Debug)]
pub enum SimEvent {
    /// `bytes` from `from` arrive at node `to`.
    Deliver {
        /// The receiving node's index.
        to: usize,
        /// The sender's address.
        from: SocketAddr,
        /// The datagram.
        bytes: Vec<u8>,
    },
    /// Node `node`'s timer is due.
    Wake {
        /// The node's index.
        node: usize,
    },
}

impl SimEvent {
    /// The node the event happens at.
    pub fn node(&self) -> usize {
        match self {
            SimEvent::Deliver { to, .. } => *to,
            SimEvent::Wake { node } => *node,
        }
    }
}

/// Events at virtual times, taken in time order and, at the same time, in the order they were
/// put in: the same calls give the same run.
#[derive(Debug)]
pub struct Timeline<K> {
    heap: BinaryHeap<Due<K>>,
    seq: u64,
}

impl<K> Default for Timeline<K> {
    fn default() -> Self {
        Timeline {
            heap: BinaryHeap::new(),
            seq: 0,
        }
    }
}

impl<K> Timeline<K> {
    /// Puts `kind` in at `at`.
    pub fn push(&mut self, at: Duration, kind: K) {
        self.seq += 1;
        self.heap.push(Due {
            at,
            seq: self.seq,
            kind,
        });
    }

    /// When the next event is due.
    pub fn next_at(&self) -> Option<Duration> {
        self.heap.peek().map(|e| e.at)
    }

    /// Takes the next event if it is due at `until` or earlier.
    pub fn pop_due(&mut self, until: Duration) -> Option<(Duration, K)> {
        if self.next_at()? > until {
            return None;
        }
        self.heap.pop().map(|e| (e.at, e.kind))
    }
}

#[derive(Debug)]
struct Due<K> {
    at: Duration,
    seq: u64,
    kind: K,
}

impl<K> PartialEq for Due<K> {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at && self.seq == other.seq
    }
}
impl<K> Eq for Due<K> {}
impl<K> PartialOrd for Due<K> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<K> Ord for Due<K> {
    /// Reversed: the heap's greatest is the earliest.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.at.cmp(&self.at).then(other.seq.cmp(&self.seq))
    }
}

#[derive(Debug, Default)]
struct Slot {
    core: Option<Core>,
    wake: Option<Duration>,
    group: u32,
    traffic: Traffic,
    /// Everything this node handles (datagrams and timers) is handled this much late.
    lag: Duration,
    /// The node handles nothing before this time (paused).
    paused_until: Option<Duration>,
}

/// The simulated network. Node `i` lives at [`SimNet::addr`]`(i)`.
#[derive(Debug)]
pub struct SimNet {
    now: Duration,
    slots: Vec<Slot>,
    by_addr: HashMap<SocketAddr, usize>,
    events: Timeline<SimEvent>,
    rng: StdRng,
    links: Links,
    changes: Vec<(Duration, usize, LiveChange)>,
    /// Owner-watch payloads the cores received through the gossip: (time, node index, payload).
    watch_relayed: Vec<(Duration, usize, WatchRelayed)>,
    record_changes: bool,
    tapped: Option<Vec<Tapped>>,
    /// Datagrams from the first node to the second are dropped ([`SimNet::cut`]).
    cuts: BTreeSet<(usize, usize)>,
}

impl SimNet {
    /// An empty network with `links`, its loss and delays drawn from `seed`.
    pub fn new(seed: u64, links: Links) -> SimNet {
        SimNet {
            now: Duration::ZERO,
            slots: Vec::new(),
            by_addr: HashMap::new(),
            events: Timeline::default(),
            rng: StdRng::seed_from_u64(seed),
            links,
            changes: Vec::new(),
            watch_relayed: Vec::new(),
            record_changes: true,
            tapped: None,
            cuts: BTreeSet::new(),
        }
    }

    /// The gossip address of node `i` (127.0.0.1, port 10000 + i; never bound).
    pub fn addr(i: usize) -> SocketAddr {
        let port = u16::try_from(10_000 + i).unwrap_or(u16::MAX);
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
    }

    /// The virtual time.
    pub fn now(&self) -> Duration {
        self.now
    }

    /// Changes the link behaviour from now on.
    pub fn set_links(&mut self, links: Links) {
        self.links = links;
    }

    /// Whether [`LiveChange`]s are recorded for [`SimNet::drain_changes`] (on by default).
    pub fn record_changes(&mut self, on: bool) {
        self.record_changes = on;
    }

    /// Starts (or restarts) node `i` with `core`, which must have been built with
    /// `SimNet::addr(i)` and the current [`SimNet::now`].
    pub fn start(&mut self, i: usize, core: Core) {
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, Slot::default);
        }
        self.by_addr.insert(Self::addr(i), i);
        self.slots[i].core = Some(core);
        self.slots[i].wake = None;
        self.slots[i].lag = Duration::ZERO;
        self.slots[i].paused_until = None;
        self.flush(i);
    }

    /// Crashes node `i`: it stops at once, without a word to anyone.
    pub fn crash(&mut self, i: usize) -> Option<Core> {
        let slot = self.slots.get_mut(i)?;
        slot.wake = None;
        slot.core.take()
    }

    /// Whether node `i` is running.
    pub fn is_running(&self, i: usize) -> bool {
        self.slots.get(i).is_some_and(|s| s.core.is_some())
    }

    /// Node `i`'s core, if it runs.
    pub fn core(&self, i: usize) -> Option<&Core> {
        self.slots.get(i)?.core.as_ref()
    }

    /// Calls `f` on node `i`'s core at the current time, then sends what it queued.
    pub fn with_core<R>(
        &mut self,
        i: usize,
        f: impl FnOnce(&mut Core, Duration) -> R,
    ) -> Option<R> {
        let now = self.now;
        let result = f(self.slots.get_mut(i)?.core.as_mut()?, now);
        self.flush(i);
        Some(result)
    }

    /// Puts node `i` in partition group `group`; datagrams cross only within a group (all
    /// nodes start in group 0).
    pub fn set_group(&mut self, i: usize, group: u32) {
        if let Some(slot) = self.slots.get_mut(i) {
            slot.group = group;
        }
    }

    /// From now on node `i` handles its datagrams and its timers `lag` late (zero: on time), as
    /// a starved process would. Datagrams already on their way keep their time.
    pub fn set_lag(&mut self, i: usize, lag: Duration) {
        if let Some(slot) = self.slots.get_mut(i) {
            slot.lag = lag;
        }
    }

    /// Stops node `i` entirely until `until` (SIGSTOP): what arrives meanwhile waits for it,
    /// and its timers run when it resumes.
    pub fn pause(&mut self, i: usize, until: Duration) {
        if let Some(slot) = self.slots.get_mut(i) {
            slot.paused_until = Some(until);
        }
    }

    /// How late node `i` handles what it receives and its timers ([`SimNet::set_lag`]).
    pub fn lag(&self, i: usize) -> Duration {
        self.slots.get(i).map_or(Duration::ZERO, |s| s.lag)
    }

    /// Until when node `i` is paused ([`SimNet::pause`]), if it is at [`SimNet::now`].
    pub fn paused_until(&self, i: usize) -> Option<Duration> {
        self.slots
            .get(i)?
            .paused_until
            .filter(|until| *until > self.now)
    }

    /// Node `i`'s partition group ([`SimNet::set_group`]).
    pub fn group(&self, i: usize) -> u32 {
        self.slots.get(i).map_or(0, |s| s.group)
    }

    /// The link behaviour.
    pub fn links(&self) -> Links {
        self.links
    }

    /// Heals every partition and every cut.
    pub fn heal(&mut self) {
        for slot in &mut self.slots {
            slot.group = 0;
        }
        self.cuts.clear();
    }

    /// Drops every datagram between nodes `a` and `b`, both ways, until [`SimNet::heal`]
    /// (a firewall rule between two nodes: each still reaches every other node).
    pub fn cut(&mut self, a: usize, b: usize) {
        self.cuts.insert((a, b));
        self.cuts.insert((b, a));
    }

    /// Drops every datagram from node `from` to node `to` (not the other way) until
    /// [`SimNet::heal`]: a one-way firewall rule.
    pub fn cut_one_way(&mut self, from: usize, to: usize) {
        self.cuts.insert((from, to));
    }

    /// What node `i` has sent so far.
    pub fn traffic(&self, i: usize) -> Traffic {
        self.slots.get(i).map(|s| s.traffic).unwrap_or_default()
    }

    /// Starts (`true`) or stops recording every datagram any node sends, as a tap on the
    /// senders' links would: before loss and partitions. Starting clears the recording.
    pub fn tap(&mut self, on: bool) {
        self.tapped = on.then(Vec::new);
    }

    /// Takes what the tap recorded so far, in the order it was sent.
    pub fn take_tapped(&mut self) -> Vec<Tapped> {
        self.tapped.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Delivers `bytes` to the node at `to` now, as if `from` had sent it, whatever the loss and
    /// partitions (a datagram an attacker on the link injects). Unknown destinations drop it.
    pub fn inject(&mut self, from: SocketAddr, to: SocketAddr, bytes: Vec<u8>) {
        if let Some(&to) = self.by_addr.get(&to) {
            self.push(self.now, SimEvent::Deliver { to, from, bytes });
        }
    }

    /// Takes the owner-watch payloads the cores received through the gossip ([`Core::drain_watch`]):
    /// (time, node index that received it, payload), in order.
    pub fn drain_watch_relayed(&mut self) -> std::vec::Drain<'_, (Duration, usize, WatchRelayed)> {
        self.watch_relayed.drain(..)
    }

    /// Takes the recorded changes: (time, node index that saw it, change).
    pub fn drain_changes(&mut self) -> std::vec::Drain<'_, (Duration, usize, LiveChange)> {
        self.changes.drain(..)
    }

    /// Runs every event up to and including `until`, then sets the clock to `until`.
    pub fn run_until(&mut self, until: Duration) {
        while let Some((at, kind)) = self.events.pop_due(until) {
            self.now = at;
            let node = kind.node();
            if let Some(until) = self.slots[node].paused_until {
                if self.now < until {
                    if matches!(kind, SimEvent::Wake { .. }) {
                        if self.slots[node].wake != Some(at) {
                            continue;
                        }
                        self.slots[node].wake = Some(until);
                    }
                    self.push(until, kind);
                    continue;
                }
                self.slots[node].paused_until = None;
            }
            match kind {
                SimEvent::Deliver {
                    to,
                    from,
                    mut bytes,
                } => {
                    let now = self.now;
                    if let Some(core) = self.slots[to].core.as_mut() {
                        core.handle_datagram(now, from, &mut bytes);
                        let relayed = core.drain_watch().map(|r| (now, to, r));
                        self.watch_relayed.extend(relayed);
                        self.flush(to);
                    }
                }
                SimEvent::Wake { node } => {
                    let now = self.now;
                    let slot = &mut self.slots[node];
                    if slot.wake != Some(now) {
                        continue;
                    }
                    slot.wake = None;
                    if let Some(core) = slot.core.as_mut() {
                        core.handle_due_timers(now);
                        self.flush(node);
                    }
                }
            }
        }
        self.now = self.now.max(until);
    }

    /// Runs for `span` of virtual time.
    pub fn run_for(&mut self, span: Duration) {
        let until = self.now + span;
        self.run_until(until);
    }

    fn push(&mut self, at: Duration, kind: SimEvent) {
        self.events.push(at, kind);
    }

    /// Sends what node `i` queued, records its changes and schedules its next wake-up.
    fn flush(&mut self, i: usize) {
        let Some(core) = self.slots[i].core.as_mut() else {
            return;
        };
        let from = core.identity().addr;
        let outgoing: Vec<_> = core.drain_outgoing().collect();
        if self.record_changes {
            for change in core.drain_changes() {
                self.changes.push((self.now, i, change));
            }
        } else {
            core.drain_changes().for_each(drop);
        }
        let deadline = core.next_deadline();
        let group = self.slots[i].group;
        let lag = self.slots[i].lag;
        for out in outgoing {
            self.slots[i].traffic.packets += 1;
            self.slots[i].traffic.bytes += out.bytes.len() as u64;
            if let Some(tapped) = self.tapped.as_mut() {
                tapped.push(Tapped {
                    at: self.now,
                    from,
                    to: out.to,
                    bytes: out.bytes.clone(),
                });
            }
            if self.links.loss > 0.0 && self.rng.random_bool(self.links.loss.clamp(0.0, 1.0)) {
                continue;
            }
            let Some(&to) = self.by_addr.get(&out.to) else {
                continue;
            };
            if self.slots[to].group != group || self.cuts.contains(&(i, to)) {
                continue;
            }
            let span = self.links.delay_max.saturating_sub(self.links.delay_min);
            let jitter = if span.is_zero() {
                Duration::ZERO
            } else {
                span.mul_f64(self.rng.random::<f64>())
            };
            let at = self.now + self.links.delay_min + jitter + self.slots[to].lag;
            self.push(
                at,
                SimEvent::Deliver {
                    to,
                    from,
                    bytes: out.bytes,
                },
            );
        }
        if let Some(at) = deadline {
            let at = at.max(self.now) + lag;
            if self.slots[i].wake != Some(at) {
                self.slots[i].wake = Some(at);
                self.push(at, SimEvent::Wake { node: i });
            }
        }
    }
}
