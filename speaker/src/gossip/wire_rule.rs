//! The wire-compatibility rule: which envelope version each datagram is sealed in, so that
//! speakers of two consecutive releases form one mesh during a rolling upgrade.
//!
//! - Each speaker announces the envelope versions it speaks, in its metadata record
//!   ([`MemberMeta::wire`](crate::model::membership::MemberMeta::wire), carried as an extension
//!   the previous release ignores: see [`super::metadata`]).
//! - A mesh speaks the highest version every live member speaks: this node's view of it is
//!   [`WireRule::update`]d from the members it holds alive and their records after every change.
//!   A member whose record has not arrived, or whose record announces nothing (a speaker of the
//!   previous release), counts as speaking the previous version only.
//! - A release keeps opening and sealing the previous version ([`PREVIOUS_VERSION`]). A datagram
//!   to an address that is not a live member of a mesh at version 3 (a seed, a member whose
//!   announcement has not arrived, a stranger's poll) is sealed in version 2.
//! - An authentic version-2 datagram from an address this node seals version 3 to, sent by a
//!   later life of the member than the one whose record announced version 3 (its envelope's
//!   epoch is above that identity's bump), takes the address out of version 3 at once: its
//!   speaker restarted, perhaps as the previous release (a rollback), and a version-3 answer
//!   might not open there. The address comes back once this node holds a record of that life or
//!   a later one. A version-2 datagram of the same life is only late news (the member had not
//!   heard this node's announcement when it sealed it) and changes nothing: otherwise two
//!   members that each received the other's late version-2 datagrams would keep sealing version
//!   2 to each other.
//!
//! So a mesh with one previous-release speaker seals version 2 everywhere; once the last one has
//! gone (or announced version 3 after its upgrade) every node moves to version 3 on its own, and
//! back to version 2 as soon as a previous-release speaker joins. Both the gossip and the owner
//! watch seal through the same rule (the watch address of a member follows from its gossip
//! address).
//!
//! Version 3 binds the receiver: its id is the sender id the receiving socket seals under
//! ([`sender_id`] of the member's gossip or watch address), so a datagram captured on its way to
//! one node does not open at another ([`swimlb_proto::Error::WrongReceiver`], counted as
//! `wrong_receiver`).
//!
//! **The previous release's behaviour.** `SWIMLB_ENVELOPE_VERSION=2` in a speaker's environment
//! makes it behave on the wire as the previous release: it seals version 2 only, opens version 2
//! only (a version-3 datagram is `unsupported_version`) and announces nothing. The upgrade test
//! runs it beside the current behaviour; an operator never needs it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, PoisonError, RwLock};

use swimlb_proto::envelope::{Addressing, Opened, PREVIOUS_VERSION, SealStream, VERSION, Versions};
use swimlb_proto::{KeyId, KeyRing};

use super::replay::sender_id;
use crate::owner_watch::core::watch_addr;

/// The environment variable that makes a speaker behave on the wire as the previous release
/// (see the module docs): `2`, or `3` (the default).
pub const ENV: &str = "SWIMLB_ENVELOPE_VERSION";

/// The rule, shared by the gossip task, its core and the owner watch (clones share one view).
#[derive(Debug, Clone)]
pub struct WireRule {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    speaks: Versions,
    view: RwLock<View>,
}

/// This node's view of the mesh.
#[derive(Debug)]
struct View {
    /// The version the mesh speaks.
    version: u8,
    /// The addresses sealed to in version 3 (the live members' gossip and watch addresses, when
    /// the mesh speaks 3), with the receiver id of each (computed once) and the bump of the
    /// member identity whose record announced version 3.
    bound: HashMap<SocketAddr, Bound, foldhash::fast::RandomState>,
    /// Addresses a later life spoke version 2 from, with that life's epoch (see the module
    /// docs): sealed in version 2 until a record of that life or a later one is held.
    demoted: HashMap<SocketAddr, u64, foldhash::fast::RandomState>,
}

#[derive(Debug, Clone, Copy)]
struct Bound {
    receiver: u64,
    bump: u64,
}

impl Default for WireRule {
    /// This build's behaviour, with no member known yet (everything sealed in version 2).
    fn default() -> WireRule {
        WireRule::new(Versions::THIS_BUILD)
    }
}

impl WireRule {
    /// A rule for a speaker that speaks `speaks` (this build: [`Versions::THIS_BUILD`]; the
    /// previous release's behaviour: [`Versions::PREVIOUS`]).
    pub fn new(speaks: Versions) -> WireRule {
        WireRule {
            inner: Arc::new(Inner {
                speaks,
                view: RwLock::new(View {
                    version: PREVIOUS_VERSION,
                    bound: HashMap::default(),
                    demoted: HashMap::default(),
                }),
            }),
        }
    }

    /// The rule `SWIMLB_ENVELOPE_VERSION` asks for (unset: this build's); an unknown value is an
    /// error naming the variable and what it accepts.
    pub fn from_env() -> Result<WireRule, String> {
        match std::env::var(ENV) {
            Err(std::env::VarError::NotPresent) => Ok(WireRule::default()),
            Ok(value) => WireRule::parse(&value),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(format!("{ENV} is not UTF-8; accepted: 2 or 3"))
            }
        }
    }

    fn parse(value: &str) -> Result<WireRule, String> {
        match value.trim() {
            "2" => Ok(WireRule::new(Versions::PREVIOUS)),
            "3" => Ok(WireRule::default()),
            other => Err(format!("{ENV}={other:?}: accepted: 2 or 3")),
        }
    }

    /// The versions this node speaks.
    pub fn speaks(&self) -> Versions {
        self.inner.speaks
    }

    /// What this node announces: the versions it speaks, or nothing when it behaves as the
    /// previous release (which announces nothing).
    pub fn announcement(&self) -> Versions {
        if self.inner.speaks.contains(VERSION) {
            self.inner.speaks
        } else {
            Versions::NONE
        }
    }

    /// The version the mesh speaks, as this node sees it.
    pub fn mesh_version(&self) -> u8 {
        self.read().version
    }

    /// Recomputes the view from the members this node holds alive: each one's gossip address,
    /// identity bump, and the versions its record announces (empty when it announced nothing or
    /// its record has not arrived). Returns the mesh's version.
    pub fn update(&self, members: impl IntoIterator<Item = (SocketAddr, u64, Versions)>) -> u8 {
        let mut common = self.inner.speaks;
        let mut addrs = Vec::new();
        for (addr, bump, announced) in members {
            let announced = if announced.is_empty() {
                Versions::PREVIOUS
            } else {
                announced
            };
            common = common.intersection(announced);
            addrs.push((addr, bump));
        }
        let mut view = self
            .inner
            .view
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        // Alone, the node seals to nobody: the version stays what it was (no log line at every
        // start, before its first members are known).
        let version = if addrs.is_empty() {
            view.version
        } else {
            common.highest().unwrap_or(PREVIOUS_VERSION)
        };
        if version != view.version {
            tracing::info!(
                from = view.version,
                to = version,
                members = addrs.len(),
                "the mesh's envelope version changed"
            );
        }
        view.version = version;
        view.bound.clear();
        let View { bound, demoted, .. } = &mut *view;
        let before = std::mem::take(demoted);
        for (addr, bump) in addrs {
            for addr in [Some(addr), watch_addr(addr)].into_iter().flatten() {
                // Still demoted while the record held is of an earlier life than the one that
                // spoke version 2 from there.
                if let Some(&epoch) = before.get(&addr).filter(|&&epoch| bump < epoch) {
                    demoted.insert(addr, epoch);
                } else if version >= VERSION {
                    let receiver = sender_id(addr);
                    bound.insert(addr, Bound { receiver, bump });
                }
            }
        }
        version
    }

    /// How a datagram to `to` is sealed now.
    pub fn addressing(&self, to: SocketAddr) -> Addressing {
        match self.read().bound.get(&to) {
            Some(bound) => Addressing::V3 {
                receiver: bound.receiver,
            },
            None => Addressing::V2,
        }
    }

    /// Seals `payload` for `to` as the next envelope of `stream` ([`KeyRing::seal_to`] with
    /// [`WireRule::addressing`]).
    pub fn seal(
        &self,
        ring: &KeyRing,
        stream: &mut SealStream,
        key: Option<KeyId>,
        to: SocketAddr,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> swimlb_proto::Result<()> {
        ring.seal_to(stream, key, self.addressing(to), payload, out)
    }

    /// Opens `datagram` from `from` at the socket whose receiver id is `me` (the sender id it
    /// seals under), accepting the versions this node speaks ([`KeyRing::open_for`]). An
    /// authentic version-2 datagram from an address sealed to in version 3, sealed by a later
    /// life of its member, takes the address out of version 3 (see the module docs).
    pub fn open<'a>(
        &self,
        ring: &KeyRing,
        datagram: &'a mut [u8],
        me: u64,
        from: SocketAddr,
    ) -> swimlb_proto::Result<Opened<'a>> {
        let opened = ring.open_for(datagram, me, self.inner.speaks)?;
        let epoch = opened.sequence.epoch;
        let later_life = |view: &View| view.bound.get(&from).is_some_and(|b| epoch > b.bump);
        if opened.version < VERSION && later_life(&self.read()) {
            tracing::info!(%from, "version 2 from a restarted member: sealing it version 2");
            let mut view = self
                .inner
                .view
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            view.bound.remove(&from);
            view.demoted.insert(from, epoch);
        }
        Ok(opened)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, View> {
        self.inner
            .view
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: [u8; 32] = [7; 32];

    fn addr(i: u8) -> SocketAddr {
        SocketAddr::from(([192, 0, 2, i], 7946))
    }

    /// Members `(i, versions)` at 192.0.2.i, identity bump 10.
    fn members(list: &[(u8, Versions)]) -> Vec<(SocketAddr, u64, Versions)> {
        list.iter().map(|&(i, v)| (addr(i), 10, v)).collect()
    }

    const NEW: Versions = Versions::THIS_BUILD;
    const OLD: Versions = Versions::NONE;

    #[test]
    fn a_mixed_mesh_speaks_version_two_until_the_last_previous_release_member_is_gone() {
        let rule = WireRule::default();
        assert_eq!(rule.mesh_version(), 2, "nobody known yet");
        assert_eq!(rule.addressing(addr(2)), Addressing::V2);
        // Rolling upgrade of three nodes, node 1 (this one) first.
        assert_eq!(rule.update(members(&[(2, OLD), (3, OLD)])), 2);
        assert_eq!(rule.addressing(addr(2)), Addressing::V2);
        assert_eq!(rule.update(members(&[(2, NEW), (3, OLD)])), 2);
        assert_eq!(
            rule.addressing(addr(2)),
            Addressing::V2,
            "mesh-wide, not per pair"
        );
        assert_eq!(rule.update(members(&[(2, NEW), (3, NEW)])), 3);
        assert_eq!(
            rule.addressing(addr(3)),
            Addressing::V3 {
                receiver: sender_id(addr(3))
            }
        );
        let watch = watch_addr(addr(3)).unwrap();
        assert_eq!(
            rule.addressing(watch),
            Addressing::V3 {
                receiver: sender_id(watch)
            },
            "the owner watch's address too"
        );
        assert_eq!(
            rule.addressing(addr(9)),
            Addressing::V2,
            "no member: a seed"
        );
        // A previous-release speaker joins (a rollback of node 3, or a new node): back to 2.
        assert_eq!(rule.update(members(&[(2, NEW), (3, NEW), (4, OLD)])), 2);
        assert_eq!(rule.addressing(addr(3)), Addressing::V2);
        assert_eq!(rule.update(members(&[(2, NEW), (3, NEW)])), 3);
        // A member whose record has not arrived counts as the previous release.
        assert_eq!(rule.update(members(&[(2, NEW), (5, Versions::NONE)])), 2);
        // Alone: unchanged (it seals to nobody).
        assert_eq!(rule.update([]), 2);
        rule.update(members(&[(2, NEW)]));
        assert_eq!(rule.update([]), 3);
    }

    #[test]
    fn a_speaker_with_the_previous_behaviour_seals_two_announces_nothing_and_refuses_three() {
        let old = WireRule::parse("2").unwrap();
        assert_eq!(old.announcement(), Versions::NONE);
        assert_eq!(old.update(members(&[(2, NEW)])), 2);
        assert_eq!(old.addressing(addr(2)), Addressing::V2);
        assert_eq!(WireRule::parse(" 3 ").unwrap().announcement(), NEW);
        let err = WireRule::parse("4").unwrap_err();
        assert!(err.contains(ENV) && err.contains("2 or 3"), "{err}");

        let ring = KeyRing::new("c", &[K]).unwrap();
        let new = WireRule::default();
        new.update(members(&[(2, NEW)]));
        let mut stream = SealStream::new(sender_id(addr(1)), 1).unwrap();
        let mut d = Vec::new();
        new.seal(&ring, &mut stream, None, addr(2), b"x", &mut d)
            .unwrap();
        assert_eq!(
            old.open(&ring, &mut d, sender_id(addr(2)), addr(1))
                .unwrap_err(),
            swimlb_proto::Error::UnsupportedVersion(3)
        );
    }

    #[test]
    fn version_three_to_the_wrong_receiver_fails_and_version_two_opens() {
        let ring = KeyRing::new("c", &[K]).unwrap();
        let rule = WireRule::default();
        rule.update(members(&[(2, NEW), (3, NEW)]));
        let mut stream = SealStream::new(sender_id(addr(1)), 1).unwrap();
        let mut to_two = Vec::new();
        rule.seal(&ring, &mut stream, None, addr(2), b"two", &mut to_two)
            .unwrap();
        let at = |me: u8, d: &[u8]| {
            let mut d = d.to_vec();
            WireRule::default()
                .open(&ring, &mut d, sender_id(addr(me)), addr(1))
                .map(|o| (o.version, o.payload.to_vec()))
        };
        assert_eq!(at(2, &to_two), Ok((3, b"two".to_vec())));
        assert_eq!(at(3, &to_two), Err(swimlb_proto::Error::WrongReceiver));
        let mut to_seed = Vec::new();
        rule.seal(&ring, &mut stream, None, addr(9), b"seed", &mut to_seed)
            .unwrap();
        assert_eq!(at(3, &to_seed), Ok((2, b"seed".to_vec())));
    }

    #[test]
    fn version_two_from_a_later_life_moves_an_address_back_to_two_and_late_news_does_not() {
        let ring = KeyRing::new("c", &[K]).unwrap();
        let rule = WireRule::default();
        rule.update(members(&[(2, NEW), (3, NEW)]));
        let me = sender_id(addr(1));
        let v2_from = |epoch: u64, from: SocketAddr| {
            let mut stream = SealStream::new(sender_id(from), epoch).unwrap();
            let mut d = Vec::new();
            ring.seal_in(&mut stream, None, b"x", &mut d).unwrap();
            rule.open(&ring, &mut d, me, from).unwrap();
        };
        // Sealed by the life whose record we hold (bump 10), before it heard ours: late news.
        v2_from(10, addr(2));
        assert!(matches!(rule.addressing(addr(2)), Addressing::V3 { .. }));
        // Sealed by a later life (restarted, perhaps as the previous release).
        v2_from(11, addr(2));
        assert_eq!(rule.addressing(addr(2)), Addressing::V2);
        let watch = watch_addr(addr(3)).unwrap();
        v2_from(11, watch);
        assert_eq!(
            rule.addressing(watch),
            Addressing::V2,
            "the watch's address alike"
        );
        assert!(matches!(rule.addressing(addr(3)), Addressing::V3 { .. }));
        // An update that still holds the earlier life's record keeps them at version 2 ...
        rule.update(members(&[(2, NEW), (3, NEW)]));
        assert_eq!(rule.addressing(addr(2)), Addressing::V2);
        assert_eq!(rule.addressing(watch), Addressing::V2);
        // ... until a record of the later life announces version 3.
        rule.update([(addr(2), 11, NEW), (addr(3), 11, NEW)]);
        assert!(matches!(rule.addressing(addr(2)), Addressing::V3 { .. }));
        assert!(matches!(rule.addressing(watch), Addressing::V3 { .. }));
    }
}
