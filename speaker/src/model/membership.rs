//! The facts the speakers agree on: who is alive and what each member says about itself.
//!
//! The gossip module fills a [`LiveSet`]; the election reads it. Everything in here travels in
//! gossip, so every speaker that has seen the same versions holds the same values, and decisions
//! made from a `LiveSet` come out the same on every node.
//!
//! A member is in the `LiveSet` from the moment foca reports it up until foca declares it down:
//! suspicion is not death.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// The name of a node: the Kubernetes node name, or the `node` of a standalone file.
pub type NodeName = String;

/// What a member gossips about itself. A record with a higher `version` replaces a lower one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberMeta {
    /// Bumped by the member each time anything below changes.
    pub version: u64,
    /// The member's node name.
    pub node: NodeName,
    /// Up for at least its preemption delay, by its own clock.
    pub settled: bool,
    /// Shutting down: hand its IPs to others.
    pub draining: bool,
    /// Per VIP group (standalone) or advertisement: the member's priority and check results.
    pub groups: BTreeMap<String, GroupHealth>,
    /// Where the member can announce: a member that cannot answer for an IP on its node is
    /// not a candidate for it (`Exclusion::CannotAnnounce`).
    pub announce: AnnounceFacts,
    /// The envelope versions the member announced it speaks (empty: it announced nothing, as
    /// the previous release does). Not in the record's serde encoding: it travels after it, where
    /// the previous release does not look (see `gossip::wire_rule`).
    #[serde(skip)]
    pub wire: swimlb_proto::envelope::Versions,
    /// The addresses the member sends its VRRP advertisements from (standalone groups with
    /// `vrrp:`; an IPv6 router's is a link-local address no member gossips from), so a fellow
    /// speaker's advertisement is told from a foreign router's (see `crate::vrrp`). Not in the
    /// record's serde encoding: an extension after it, as `wire` (see `gossip::metadata`).
    #[serde(skip)]
    pub vrrp_sources: BTreeSet<IpAddr>,
}

/// What a member can announce on, as far as the others need to know to elect without it.
///
/// Only what the served IPs ask about is gossiped, so the record stays small: the links named
/// by some IP's interface set that can announce on this node, and the IPs with the default
/// interface that have no usable link here (no connected route to a link that is up, ARP
/// capable and not a bond port).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AnnounceFacts {
    /// Named links that are present, up, ARP capable, Ethernet and not a bond port.
    pub links: BTreeSet<String>,
    /// IPs answered on the default interface that this member cannot place.
    pub unplaced: BTreeSet<IpAddr>,
}

impl MemberMeta {
    /// A first record for `node`: version 1, not settled, not draining, no groups.
    pub fn new(node: impl Into<NodeName>) -> MemberMeta {
        MemberMeta {
            version: 1,
            node: node.into(),
            settled: false,
            draining: false,
            groups: BTreeMap::new(),
            announce: AnnounceFacts::default(),
            wire: swimlb_proto::envelope::Versions::NONE,
            vrrp_sources: BTreeSet::new(),
        }
    }
}

/// A member's standing for one group.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct GroupHealth {
    /// Base priority (keepalived's `priority`), before check weights.
    pub priority: u8,
    /// The results of the group's checks on this member, in configuration order.
    pub checks: Vec<CheckResult>,
}

/// One health check's current result on one member, with the weight it carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckResult {
    /// The check's name in the configuration.
    pub name: String,
    /// Passing after rise/fall hysteresis.
    pub passing: bool,
    /// keepalived's weight: `> 0` adds while passing, `< 0` subtracts while failing, `0` makes a
    /// failure put the member in fault (not eligible).
    pub weight: i32,
}

/// The alive members and their latest metadata, keyed by node name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveSet {
    members: BTreeMap<NodeName, MemberMeta>,
}

impl LiveSet {
    /// An empty set.
    pub fn new() -> LiveSet {
        LiveSet::default()
    }

    /// Inserts or replaces a member's record. A record older than the one held is ignored.
    /// Returns whether the set changed.
    pub fn upsert(&mut self, meta: MemberMeta) -> bool {
        match self.members.get(&meta.node) {
            Some(held) if held.version > meta.version => false,
            Some(held) if *held == meta => false,
            _ => {
                self.members.insert(meta.node.clone(), meta);
                true
            }
        }
    }

    /// Removes a member; returns its last record.
    pub fn remove(&mut self, node: &str) -> Option<MemberMeta> {
        self.members.remove(node)
    }

    /// The record of an alive member.
    pub fn get(&self, node: &str) -> Option<&MemberMeta> {
        self.members.get(node)
    }

    /// Whether `node` is alive.
    pub fn contains(&self, node: &str) -> bool {
        self.members.contains_key(node)
    }

    /// Alive members in node-name order.
    pub fn iter(&self) -> impl Iterator<Item = &MemberMeta> {
        self.members.values()
    }

    /// Number of alive members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether no member is alive.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}

/// A change to the [`LiveSet`], as the gossip module reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LiveChange {
    /// A member became alive, with its first known record.
    Up(NodeName),
    /// A member was declared down (or left).
    Down(NodeName),
    /// A member's metadata changed.
    Meta(NodeName),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn older_record_does_not_replace_newer_one() {
        let mut set = LiveSet::new();
        let mut meta = MemberMeta::new("a");
        meta.version = 5;
        meta.settled = true;
        assert!(set.upsert(meta.clone()));
        let mut old = meta.clone();
        old.version = 4;
        old.settled = false;
        assert!(!set.upsert(old));
        assert!(set.get("a").unwrap().settled);
    }

    #[test]
    fn same_record_twice_is_no_change() {
        let mut set = LiveSet::new();
        assert!(set.upsert(MemberMeta::new("a")));
        assert!(!set.upsert(MemberMeta::new("a")));
        assert_eq!(set.len(), 1);
    }

    #[test]
    fn removed_member_is_gone() {
        let mut set = LiveSet::new();
        set.upsert(MemberMeta::new("a"));
        assert_eq!(set.remove("a").map(|m| m.node), Some("a".to_string()));
        assert!(!set.contains("a"));
        assert!(set.is_empty());
    }
}
