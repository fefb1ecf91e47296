//! The speaker's decisions, shared by every mode: membership and snapshot in, what to answer,
//! where, and what to announce out.
//!
//! The [`Engine`] owns the [`Election`], the [`Announcer`], conflict damping
//! ([`conflict::ConflictDamper`]), the drain and the placement of each IP on this node's links
//! ([`placement::Placement`]). It is sans-IO, as foca is: every input comes with `now`, and
//! [`Engine::handle`] returns the [`Action`]s the drivers carry out, in order. It never awaits,
//! logs or reads a clock; [`Engine::next_deadline`] says when to send the next
//! [`Input::Tick`]. A mode (the standalone file, the Kubernetes reflectors) is only a source of
//! inputs.
//!
//! Guarantees:
//!
//! - **Incremental.** A membership change re-elects through [`Election::member_changed`] and
//!   touches only the IPs whose owner moved (and, for a change of this node's own record, every
//!   IP's verdict); a snapshot change touches only the IPs that differ; a link change only the
//!   IPs whose placement changed. Status is reported as deltas ([`Action::Status`]), never
//!   rebuilt.
//! - **Stopping first.** Within one call's actions every [`Action::Silence`] comes before any
//!   [`Action::Answer`] or [`Action::Announce`], and an IP's `Answer` before its announcements.
//! - **Answer only where it can.** An IP is answered when this node owns it, holds it not back
//!   (see [`Input::Hold`]) and has at least one link for it. What the node can announce on is
//!   reported as [`Action::Facts`] for the source to gossip, so the others elect without it
//!   where it cannot ([`crate::model::election::Exclusion::CannotAnnounce`]).
//! - **Hand-over.** An IP that moves from this node to another live member (the API moved its
//!   endpoints, a check failed, a preferred member settled) stays answered here until that
//!   member announces it (a conflict from another MAC) or [`HANDOVER_DEADLINE`] passes: each
//!   speaker sees such a move on its own (in Kubernetes, through its own API watch), and an old
//!   owner that went silent first would leave the IP dark until the new one saw it too. A claim
//!   seen in the [`HANDOVER_DEADLINE`] before the move counts: the new owner announced first.
//!   A move to no owner, a hold and a drain stop at once as before.
//! - **Moves told.** A move the API decided ([`Input::Snapshot`], [`Input::Served`]) between two
//!   live members, one of them this node, is reported ([`Action::Moved`]) for the drivers to
//!   tell the other one; told of such a move ([`Input::Moved`]) while its own view still names
//!   the old owner, this node follows it at once (the new owner answers, the old one hands
//!   over) until its own view names someone else or [`MOVE_DEADLINE`] passes.
//! - **Drain.** After [`Input::Drain`] nothing new is taken; each IP answered at that moment
//!   keeps being answered until its successor announces it (a conflict from another MAC) or
//!   [`DRAIN_DEADLINE`] passes; then [`Action::Drained`], once.
//! - **Same facts, same state.** The answered set after any sequence of inputs equals what a
//!   fresh engine computes from the final facts (a property test checks it).
//! - **Failovers are told.** An IP this node comes to own because its owner went down or left
//!   gets one [`Notice::TookOver`], right after its first announcement, for the drivers to time
//!   the failover. Owning at start-up, taking over from a live member (preemption, a check or a
//!   link lost, a draining owner's handover) and an IP that moves on before it is announced get
//!   none.

pub mod conflict;
pub mod placement;

#[cfg(test)]
pub(crate) mod tests;

use crate::model::election::VerdictKind;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use smol_str::SmolStr;
use swimlb_proto::ethernet::MacAddr;
use tokio::time::Instant;

use self::conflict::ConflictDamper;
use self::placement::{LinkSet, Placement};
use crate::model::announcer::{Announcer, Effect, Schedule};
use crate::model::election::{Election, OwnerChange};
use crate::model::links::{Link, NoInterface, Route};
use crate::model::membership::{AnnounceFacts, LiveSet, MemberMeta, NodeName};
use crate::model::snapshot::{Owner, ServedIp, Snapshot, SnapshotChange};

/// How long an IP that moved to another live member stays answered here at most, waiting for
/// that member's announcement.
pub const HANDOVER_DEADLINE: Duration = Duration::from_secs(2);

/// How long a move another member told of is followed before this node's own view agrees.
pub const MOVE_DEADLINE: Duration = Duration::from_secs(3);

/// How long a draining speaker keeps answering at most, waiting for its successors.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(3);

/// Something that happened to the engine's facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// One member changed: its record now (`None`: down or left). `joined`: it just came up,
    /// perhaps from the other side of a healed partition, so what this node owns is announced
    /// once more.
    Member {
        /// The member.
        node: NodeName,
        /// Its current record.
        record: Option<MemberMeta>,
        /// It came up.
        joined: bool,
    },
    /// The whole live set (a resynchronisation, when changes were missed).
    Live(LiveSet),
    /// What should be served changed.
    Snapshot(Snapshot),
    /// What should be served changed for these IPs only: their entries now (`None`: no longer
    /// served). The same as [`Input::Snapshot`] with those entries replaced, at the cost of the
    /// IPs named (a source that knows what changed, as the Kubernetes watches do, need not
    /// build and diff the whole snapshot on every event).
    Served(Vec<(IpAddr, Option<Arc<ServedIp>>)>),
    /// The node's links or routes changed.
    Net {
        /// Every link.
        links: Vec<Link>,
        /// Every route.
        routes: Vec<Route>,
    },
    /// Another MAC claimed `ip` (a gratuitous announcement or an answer seen on the wire).
    Conflict {
        /// The IP.
        ip: IpAddr,
        /// The other MAC.
        mac: MacAddr,
    },
    /// Time passed: send what is due (see [`Engine::next_deadline`]).
    Tick,
    /// Member `from` or `to` says the API moved `ip` from `from` to `to`.
    Moved {
        /// The IP.
        ip: IpAddr,
        /// The owner before.
        from: NodeName,
        /// The owner now.
        to: NodeName,
    },
    /// Hand everything over: shutting down.
    Drain,
    /// `true`: answer nothing yet, although the election may name this node (the mesh is still
    /// forming: a node alone elects itself for everything). `false`: answer what it owns.
    Hold(bool),
    /// The IPs a router outside the mesh holds now (a VRRP master that wins by VRRP's rule, see
    /// [`crate::vrrp`]): none of them is answered, whoever the election names, until it is no
    /// longer listed; then its owner answers and announces it at once. Replaces the last set.
    Yield(BTreeSet<IpAddr>),
}

/// What the drivers must do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Stop answering for `ip` on these links, now.
    Silence {
        /// The IP.
        ip: IpAddr,
        /// The links.
        links: Vec<String>,
    },
    /// Start answering ARP requests / neighbor solicitations for `ip` on these links.
    Answer {
        /// The IP.
        ip: IpAddr,
        /// The links.
        links: Vec<String>,
    },
    /// Send one gratuitous ARP / unsolicited neighbor advertisement for `ip` on `link`.
    Announce {
        /// The IP.
        ip: IpAddr,
        /// The link.
        link: String,
    },
    /// What this node can announce on changed: gossip it in the node's record.
    Facts(AnnounceFacts),
    /// `ip`'s entry in this node's status changed (`None`: no longer served).
    Status {
        /// The IP.
        ip: IpAddr,
        /// Its new entry.
        view: Option<AddressView>,
    },
    /// Something worth a log line or a counter.
    Notice(Notice),
    /// The API moved `ip` from `from` to `to`, both alive, one of them this node: tell the
    /// other one.
    Moved {
        /// The IP.
        ip: IpAddr,
        /// The owner before.
        from: NodeName,
        /// The owner now.
        to: NodeName,
    },
    /// The drain is over: leave and exit.
    Drained,
}

/// Events the drivers log or count; the engine itself never logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// Another MAC claims an IP this node owns (rate-limited: at most one per IP per
    /// [`conflict::CONFLICT_LOG_INTERVAL`]).
    Conflict {
        /// The IP.
        ip: IpAddr,
        /// The other MAC.
        mac: MacAddr,
    },
    /// `ip` moved to another live member, which announced it: this node stopped answering it.
    HandedOver {
        /// The IP.
        ip: IpAddr,
        /// The new owner's MAC.
        mac: MacAddr,
    },
    /// `ip` moved to another live member, whose announcement did not come within
    /// [`HANDOVER_DEADLINE`]: this node stopped answering it anyway.
    HandoverDeadline {
        /// The IP.
        ip: IpAddr,
    },
    /// While draining, the successor announced `ip`: this node stopped answering it.
    SuccessorAnnounced {
        /// The IP.
        ip: IpAddr,
        /// The successor's MAC.
        mac: MacAddr,
    },
    /// The drain deadline passed before every successor announced.
    DrainDeadline {
        /// IPs whose successor was not seen.
        left: usize,
    },
    /// This node owns `ip` by the election but has no link to answer it on (the next election
    /// round, once the facts are gossiped, moves it).
    Unplaced {
        /// The IP.
        ip: IpAddr,
        /// Why.
        reason: NoInterface,
    },
    /// The first announcement of `ip` just went out (it is among this call's actions, before this
    /// notice) since this node took it over from `from`, which went down or left while it owned
    /// it. Once per takeover; never at start-up, nor from a member still alive.
    TookOver {
        /// The IP.
        ip: IpAddr,
        /// The previous owner.
        from: NodeName,
    },
}

/// One IP as this node sees it, for `/status` and the metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressView {
    /// The group or Service.
    pub belongs_to: Owner,
    /// The elected owner (inline up to 23 bytes: no allocation per IP for most node names).
    pub owner: Option<SmolStr>,
    /// This node's verdict.
    pub verdict: VerdictKind,
    /// The links this node answers on (`None`: it does not answer); shared between the IPs
    /// answered on the same links.
    pub links: Option<LinkSet>,
}

/// A move another member told of.
#[derive(Debug, Clone)]
struct Told {
    from: NodeName,
    to: NodeName,
    until: Instant,
}

/// The drain under way.
#[derive(Debug, Clone)]
struct Drain {
    deadline: Instant,
    /// IPs still answered until their successor announces.
    left: BTreeSet<IpAddr>,
    done: bool,
}

/// The decision core of one speaker.
#[derive(Debug, Clone)]
pub struct Engine {
    live: LiveSet,
    election: Election,
    announcer: Announcer,
    placement: Placement,
    conflicts: ConflictDamper,
    /// The links each answered IP is answered on, as told to the drivers.
    answering: BTreeMap<IpAddr, LinkSet>,
    views: BTreeMap<IpAddr, AddressView>,
    facts: AnnounceFacts,
    drain: Option<Drain>,
    hold: bool,
    /// IPs held by a router outside the mesh (see [`Input::Yield`]).
    yielded: BTreeSet<IpAddr>,
    /// IPs that moved to another live member and are still answered here until the deadline
    /// (`Some`), or whose hand-over just ended (`None`), until they are silenced.
    handing: BTreeMap<IpAddr, Option<Instant>>,
    /// Moves another member told of, followed until this node's view leaves `from` or the
    /// deadline.
    told: BTreeMap<IpAddr, Told>,
    /// IPs this node took over from a member that went down or left, until their first
    /// announcement ([`Notice::TookOver`]) or until this node no longer owns them.
    taken_over: BTreeMap<IpAddr, NodeName>,
}

/// Everything an engine starts from.
#[derive(Debug, Clone)]
pub struct Start {
    /// This node.
    pub node: NodeName,
    /// The announcement schedule.
    pub schedule: Schedule,
    /// What to serve.
    pub snapshot: Snapshot,
    /// Who is alive.
    pub live: LiveSet,
    /// The node's links.
    pub links: Vec<Link>,
    /// The node's routes.
    pub routes: Vec<Route>,
    /// Start held back (see [`Input::Hold`]).
    pub hold: bool,
}

impl Engine {
    /// An engine at `now`, with the actions that bring the drivers to its state (the facts to
    /// gossip, the status, and what it answers unless held back).
    pub fn new(now: Instant, start: Start) -> (Engine, Vec<Action>) {
        let placement = Placement::new(&start.snapshot, start.links, start.routes);
        let election = Election::new(start.node, start.snapshot, &start.live);
        let mut engine = Engine {
            live: start.live,
            election,
            announcer: Announcer::new(start.schedule),
            placement,
            conflicts: ConflictDamper::default(),
            answering: BTreeMap::new(),
            views: BTreeMap::new(),
            facts: AnnounceFacts::default(),
            drain: None,
            handing: BTreeMap::new(),
            told: BTreeMap::new(),
            hold: start.hold,
            yielded: BTreeSet::new(),
            taken_over: BTreeMap::new(),
        };
        let mut actions = Vec::new();
        engine.update_facts(&mut actions);
        let all: Vec<IpAddr> = engine.election.outcomes().keys().copied().collect();
        engine.settle(now, &all, &mut actions);
        (engine, actions)
    }

    /// Feeds one input at `now`; returns the actions to carry out, in order.
    pub fn handle(&mut self, now: Instant, input: Input) -> Vec<Action> {
        let mut actions = Vec::new();
        let mut touched = match input {
            Input::Member {
                node,
                record,
                joined,
            } => self.member(now, node, record, joined),
            Input::Live(live) => {
                // Owners gone from the new live set, with their IPs: the ones this node takes
                // are takeovers.
                let gone: Vec<(IpAddr, NodeName)> = self
                    .election
                    .outcomes()
                    .iter()
                    .filter_map(|(ip, outcome)| {
                        let owner = outcome.owner()?;
                        (owner != self.election.local() && !live.contains(owner))
                            .then(|| (*ip, owner.to_string()))
                    })
                    .collect();
                self.live = live;
                let node = self.election.local().to_string();
                self.election = Election::new(node, self.election.snapshot().clone(), &self.live);
                for (ip, from) in gone {
                    if self.election.owns(&ip) {
                        self.taken_over.insert(ip, from);
                    }
                }
                self.all_ips()
            }
            Input::Snapshot(snapshot) => {
                let touched = self.snapshot(snapshot, &mut actions);
                self.tell_moves(&touched, &mut actions);
                touched
            }
            Input::Served(entries) => {
                let touched = self.served(entries, &mut actions);
                self.tell_moves(&touched, &mut actions);
                touched
            }
            Input::Moved { ip, from, to } => self.moved(now, ip, from, to),
            Input::Net { links, routes } => {
                let changed = self
                    .placement
                    .set_net(self.election.snapshot(), links, routes);
                self.update_facts(&mut actions);
                changed
            }
            Input::Conflict { ip, mac } => self.conflict(now, ip, mac, &mut actions),
            Input::Tick => self.tick(now, &mut actions),
            Input::Drain => {
                self.start_drain(now, &mut actions);
                Vec::new()
            }
            Input::Yield(ips) => {
                let old = std::mem::replace(&mut self.yielded, ips);
                old.symmetric_difference(&self.yielded).copied().collect()
            }
            Input::Hold(hold) => {
                self.hold = hold;
                self.election
                    .owned()
                    .chain(self.answering.keys())
                    .copied()
                    .collect()
            }
        };
        if !self.told.is_empty() {
            // A member gone, or this node's view moved on: the moves told are looked at again.
            touched.extend(self.told.keys().copied());
        }
        self.settle(now, &touched, &mut actions);
        actions
    }

    /// When to send the next [`Input::Tick`]; `None`: nothing is scheduled.
    pub fn next_deadline(&self) -> Option<Instant> {
        let drain = self.drain.as_ref().filter(|d| !d.done).map(|d| d.deadline);
        [
            self.announcer.next_deadline(),
            self.conflicts.next_deadline(),
            drain,
            self.handing.values().flatten().min().copied(),
            self.told.values().map(|t| t.until).min(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The election (owners and verdicts of every IP).
    pub fn election(&self) -> &Election {
        &self.election
    }

    /// The live set the election was computed from.
    pub fn live(&self) -> &LiveSet {
        &self.live
    }

    /// Whether this node answers for `ip` now.
    pub fn answers(&self, ip: &IpAddr) -> bool {
        self.answering.contains_key(ip)
    }

    /// Whether this node answers for `ip` only until its new owner announces it (see the
    /// module docs): it no longer owns it.
    pub fn handing_over(&self, ip: &IpAddr) -> bool {
        self.handing.contains_key(ip)
    }

    /// The IPs this node answers for, with their links.
    pub fn answering(&self) -> &BTreeMap<IpAddr, LinkSet> {
        &self.answering
    }

    /// Every link some served IP is placed on, whoever owns it.
    pub fn placed_links(&self) -> BTreeSet<String> {
        self.placement.used_links()
    }

    /// What this node can announce on, as last reported.
    pub fn facts(&self) -> &AnnounceFacts {
        &self.facts
    }

    /// Whether a drain has started.
    pub fn draining(&self) -> bool {
        self.drain.is_some()
    }

    fn all_ips(&self) -> Vec<IpAddr> {
        self.election.outcomes().keys().copied().collect()
    }

    fn member(
        &mut self,
        now: Instant,
        node: NodeName,
        record: Option<MemberMeta>,
        joined: bool,
    ) -> Vec<IpAddr> {
        let gone = record.is_none();
        match record {
            Some(record) => {
                // The gossip's record is authoritative (a restarted member starts its versions
                // again): replace, never compare.
                self.live.remove(&node);
                self.live.upsert(record);
            }
            None => {
                self.live.remove(&node);
            }
        }
        let changes = self.election.member_changed(&self.live, &node);
        if gone {
            for change in &changes {
                if change.from.as_deref() == Some(node.as_str())
                    && change.to.as_deref() == Some(self.election.local())
                {
                    self.taken_over.insert(change.ip, node.clone());
                }
            }
        }
        if joined && self.drain.is_none() {
            // A member (re)appeared, perhaps a healed partition: make sure it has our MAC.
            let ips: Vec<IpAddr> = self.answering.keys().copied().collect();
            for ip in ips {
                self.announcer.burst(now, ip);
            }
        }
        if node == self.election.local() {
            // This node's own standing changed: every verdict may have.
            return self.all_ips();
        }
        changes.into_iter().map(|c: OwnerChange| c.ip).collect()
    }

    fn snapshot(&mut self, snapshot: Snapshot, actions: &mut Vec<Action>) -> Vec<IpAddr> {
        let diff = self.election.snapshot().diff(&snapshot);
        self.election.apply_snapshot(snapshot, &self.live);
        let mut touched = Vec::with_capacity(diff.len());
        for change in diff {
            let ip = match change {
                SnapshotChange::Added(ip)
                | SnapshotChange::Removed(ip)
                | SnapshotChange::Changed(ip) => ip,
            };
            let wanted = self.election.snapshot().get(&ip).map(|s| &s.interfaces);
            self.placement.replace(ip, wanted);
            touched.push(ip);
        }
        if !touched.is_empty() {
            self.update_facts(actions);
        }
        touched
    }

    fn served(
        &mut self,
        entries: Vec<(IpAddr, Option<Arc<ServedIp>>)>,
        actions: &mut Vec<Action>,
    ) -> Vec<IpAddr> {
        let mut touched = Vec::with_capacity(entries.len());
        let mut facts_may_change = false;
        for (ip, entry) in entries {
            let before = self.election.snapshot().get(&ip);
            if before == entry.as_deref() {
                continue;
            }
            // The facts depend only on each IP's interfaces and where it is placed.
            facts_may_change |=
                before.map(|b| &b.interfaces) != entry.as_ref().map(|e| &e.interfaces);
            self.election.set_entry(ip, entry, &self.live);
            let wanted = self.election.snapshot().get(&ip).map(|s| &s.interfaces);
            facts_may_change |= self.placement.replace(ip, wanted);
            touched.push(ip);
        }
        if facts_may_change {
            self.update_facts(actions);
        }
        touched
    }

    fn conflict(
        &mut self,
        now: Instant,
        ip: IpAddr,
        mac: MacAddr,
        actions: &mut Vec<Action>,
    ) -> Vec<IpAddr> {
        if let Some(drain) = &mut self.drain {
            if drain.left.remove(&ip) {
                actions.push(Action::Notice(Notice::SuccessorAnnounced { ip, mac }));
                if drain.left.is_empty() && !drain.done {
                    drain.done = true;
                    actions.push(Action::Drained);
                }
                return vec![ip];
            }
            return Vec::new();
        }
        if !self.answering.contains_key(&ip) {
            return Vec::new();
        }
        if let Some(handing) = self.handing.get_mut(&ip) {
            if handing.take().is_some() {
                actions.push(Action::Notice(Notice::HandedOver { ip, mac }));
            }
            return vec![ip];
        }
        let response = self.conflicts.claim(now, ip);
        if response.log {
            actions.push(Action::Notice(Notice::Conflict { ip, mac }));
        }
        if response.reannounce {
            self.announcer.burst(now, ip);
        }
        Vec::new()
    }

    fn tick(&mut self, now: Instant, actions: &mut Vec<Action>) -> Vec<IpAddr> {
        if let Some(drain) = &mut self.drain {
            if !drain.done && now >= drain.deadline {
                drain.done = true;
                actions.push(Action::Notice(Notice::DrainDeadline {
                    left: drain.left.len(),
                }));
                actions.push(Action::Drained);
            }
            return Vec::new();
        }
        for ip in self.conflicts.due(now) {
            self.announcer.burst(now, ip);
        }
        let mut expired: Vec<IpAddr> = self
            .told
            .iter()
            .filter(|(_, t)| now >= t.until)
            .map(|(ip, _)| *ip)
            .collect();
        for ip in &expired {
            self.told.remove(ip);
        }
        for (ip, handing) in &mut self.handing {
            if handing.is_some_and(|deadline| now >= deadline) {
                *handing = None;
                expired.push(*ip);
                actions.push(Action::Notice(Notice::HandoverDeadline { ip: *ip }));
            }
        }
        expired
    }

    fn start_drain(&mut self, now: Instant, actions: &mut Vec<Action>) {
        if self.drain.is_some() {
            return;
        }
        let left: BTreeSet<IpAddr> = self.answering.keys().copied().collect();
        let done = left.is_empty();
        self.drain = Some(Drain {
            deadline: now + DRAIN_DEADLINE,
            left,
            done,
        });
        if done {
            actions.push(Action::Drained);
        }
    }

    /// Reports the facts when they changed.
    fn update_facts(&mut self, actions: &mut Vec<Action>) {
        let facts = self.placement.facts(self.election.snapshot());
        if facts != self.facts {
            self.facts = facts.clone();
            actions.push(Action::Facts(facts));
        }
    }

    /// Where `ip` should be answered now, if anywhere.
    fn wanted_links(&self, ip: &IpAddr) -> Option<LinkSet> {
        if let Some(drain) = &self.drain {
            return match drain.left.contains(ip) && !drain.done {
                true => self.answering.get(ip).cloned(),
                false => None,
            };
        }
        if self.hold || self.yielded.contains(ip) {
            return None;
        }
        if self.owns_now(ip) {
            return self.placement.links_of(ip).cloned();
        }
        // Handed over: the links it is answered on while they are still where it belongs.
        let held = self.answering.get(ip)?;
        let handing = self.handing.get(ip).is_some_and(Option::is_some);
        (handing && self.placement.links_of(ip) == Some(held)).then(|| held.clone())
    }

    /// The owner of `ip` this node follows: its election's, or the one a move it was told of
    /// names while its election still names the old one.
    fn owner_now(&self, ip: &IpAddr) -> Option<&str> {
        let elected = self.election.owner(ip);
        match self.told.get(ip) {
            Some(t) if elected == Some(t.from.as_str()) => Some(t.to.as_str()),
            _ => elected,
        }
    }

    fn owns_now(&self, ip: &IpAddr) -> bool {
        self.owner_now(ip) == Some(self.election.local())
    }

    /// For the IPs an API input touched: the moves between two live members, one of them this
    /// node, to tell the other one ([`Action::Moved`]). `views` still holds the owners before.
    fn tell_moves(&self, ips: &[IpAddr], actions: &mut Vec<Action>) {
        let local = self.election.local();
        for ip in ips {
            let before = self.views.get(ip).and_then(|v| v.owner.as_deref());
            let after = self.election.owner(ip);
            if let (Some(from), Some(to)) = (before, after)
                && from != to
                && (from == local || to == local)
                && self.live.contains(from)
                && self.live.contains(to)
            {
                actions.push(Action::Moved {
                    ip: *ip,
                    from: from.into(),
                    to: to.into(),
                });
            }
        }
    }

    /// Told that `ip` moved from `from` to `to`: followed while this node's election still
    /// names `from` (see the module docs).
    fn moved(&mut self, now: Instant, ip: IpAddr, from: NodeName, to: NodeName) -> Vec<IpAddr> {
        let local = self.election.local();
        if (from != local && to != local)
            || !self.live.contains(&from)
            || !self.live.contains(&to)
            || self.election.owner(&ip) != Some(from.as_str())
        {
            return Vec::new();
        }
        self.told.insert(
            ip,
            Told {
                from,
                to,
                until: now + MOVE_DEADLINE,
            },
        );
        vec![ip]
    }

    /// Starts or ends `ip`'s hand-over (see the module docs) before its links are settled.
    fn hand_over(&mut self, now: Instant, ip: &IpAddr) {
        if let Some(t) = self.told.get(ip)
            && (self.election.owner(ip) != Some(t.from.as_str())
                || !self.live.contains(&t.to)
                || !self.live.contains(&t.from))
        {
            // This node's own view moved on, or one of the two is gone.
            self.told.remove(ip);
        }
        let successor = self
            .owner_now(ip)
            .filter(|o| *o != self.election.local() && self.live.contains(o));
        if successor.is_none() || self.hold || self.yielded.contains(ip) || self.drain.is_some() {
            if self.handing.remove(ip).is_some()
                && self.owns_now(ip)
                && !self.announcer.own(now, *ip)
            {
                // Back before the hand-over ended: the neighbours may have the successor's MAC.
                self.announcer.burst(now, *ip);
            }
            return;
        }
        if !self.answering.contains_key(ip) || self.handing.contains_key(ip) {
            return;
        }
        let since = now.checked_sub(HANDOVER_DEADLINE).unwrap_or(now);
        if !self.conflicts.claimed_since(ip, since) {
            // Answered, no longer announced: the successor's announcement ends it.
            self.handing.insert(*ip, Some(now + HANDOVER_DEADLINE));
            self.announcer.disown(ip);
        }
    }

    /// Brings the answered set, the announcements and the status of `ips` to what the facts
    /// say, and sends what the announcer has due.
    fn settle(&mut self, now: Instant, ips: &[IpAddr], actions: &mut Vec<Action>) {
        let mut starts = Vec::new();
        for ip in ips {
            if !self.election.owns(ip) {
                self.taken_over.remove(ip);
            }
            self.hand_over(now, ip);
            let wanted = self.wanted_links(ip);
            let held = self.answering.get(ip);
            if wanted.as_ref() == held {
                continue;
            }
            if let Some(held) = held {
                let gone: Vec<String> = match &wanted {
                    Some(w) => held.difference(w).cloned().collect(),
                    None => held.iter().cloned().collect(),
                };
                if !gone.is_empty() {
                    actions.push(Action::Silence {
                        ip: *ip,
                        links: gone,
                    });
                }
            }
            match wanted {
                None => {
                    self.answering.remove(ip);
                    self.handing.remove(ip);
                    self.announcer.disown(ip);
                    self.conflicts.forget(ip);
                    if self.election.owns(ip)
                        && !self.hold
                        && self.drain.is_none()
                        && let Some(reason) = self.placement.failure(ip)
                    {
                        starts.push(Action::Notice(Notice::Unplaced { ip: *ip, reason }));
                    }
                }
                Some(links) => {
                    let new: Vec<String> = match held {
                        Some(h) => links.difference(h).cloned().collect(),
                        None => links.iter().cloned().collect(),
                    };
                    if !self.announcer.own(now, *ip) {
                        // Answered already, on other links: announce there too.
                        self.announcer.burst(now, *ip);
                    }
                    starts.push(Action::Answer {
                        ip: *ip,
                        links: new,
                    });
                    self.answering.insert(*ip, links);
                }
            }
        }
        actions.extend(starts);
        for effect in self.announcer.tick(now) {
            if let Effect::Announce(ip) = effect
                && let Some(links) = self.answering.get(&ip)
                && !links.is_empty()
            {
                actions.extend(links.iter().map(|link| Action::Announce {
                    ip,
                    link: link.clone(),
                }));
                if let Some(from) = self.taken_over.remove(&ip) {
                    actions.push(Action::Notice(Notice::TookOver { ip, from }));
                }
            }
        }
        for ip in ips {
            self.report(ip, actions);
        }
    }

    /// Reports `ip`'s status entry when it changed.
    fn report(&mut self, ip: &IpAddr, actions: &mut Vec<Action>) {
        let view = self.election.snapshot().get(ip).map(|served| AddressView {
            belongs_to: served.belongs_to.clone(),
            owner: self.election.owner(ip).map(SmolStr::from),
            verdict: self
                .election
                .verdict(ip, &self.live)
                .map_or(VerdictKind::Unknown, |v| v.kind()),
            links: self.answering.get(ip).cloned(),
        });
        if self.views.get(ip) == view.as_ref() {
            return;
        }
        match &view {
            Some(v) => self.views.insert(*ip, v.clone()),
            None => self.views.remove(ip),
        };
        actions.push(Action::Status { ip: *ip, view });
    }
}
