//! The accusations, sans-IO: which members the engine elects without because the owner watch
//! found them silent, here ([`Accusations::silent`]) or on another member's claim
//! ([`Accusations::claimed`]), and when that ends. The daemon feeds it the watch's events, the
//! gossip's changes and its ticks, and carries out what it answers.
//!
//! Time is a [`Duration`] since an origin the caller picks, passed into every call; what the
//! gossip holds is passed in as `held(node, incarnation)`: whether the gossip holds `node`
//! alive in that incarnation (its identity's bump).
//!
//! An accusation ends:
//! - `refuted`: the member is heard alive in the accused incarnation ([`Accusations::alive`]);
//! - `confirmed`: the gossip declares it down, or it comes back renewed
//!   ([`Accusations::member_changed`]);
//! - `lapsed`: after [`ACCUSATION_TTL`] ([`Accusations::lapse`]): by then the gossip has
//!   declared a dead member down many times over, so one still held in the accused incarnation
//!   was alive (every refutation lost), and one renewed meanwhile confirms it.
//!
//! A claim against a member heard alive in that incarnation within [`REFUTED_RECENTLY`] is not
//! applied: the refutation overtook the claim.

use std::collections::BTreeMap;
use std::time::Duration;

use super::metrics::TakeoverResult;
use crate::gossip::NodeIdentity;
use crate::model::membership::NodeName;

/// An accusation lapses after this long unless the gossip has confirmed it.
pub const ACCUSATION_TTL: Duration = Duration::from_secs(5);
/// A claim against a member heard alive this recently is not applied.
pub const REFUTED_RECENTLY: Duration = Duration::from_secs(1);

/// A member the engine elects without.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accusation {
    /// The incarnation accused.
    pub incarnation: u64,
    /// On this node's own watch (it took over and claimed), not on a claim.
    pub own: bool,
    /// When it was made.
    pub since: Duration,
    /// When the member was last heard (its last heartbeat), on this node's own watch.
    pub last_heard: Option<Duration>,
}

/// How an accusation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Heard alive in the accused incarnation.
    Refuted,
    /// [`ACCUSATION_TTL`] passed and the gossip still holds the accused incarnation.
    Lapsed,
    /// The gossip declared the member down, or holds it renewed.
    Confirmed,
}

impl Ending {
    /// A short, stable, lowercase name for logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Ending::Refuted => "refuted",
            Ending::Lapsed => "lapsed",
            Ending::Confirmed => "confirmed",
        }
    }

    /// What it makes of a takeover: a lapsed one was a false takeover too.
    pub const fn result(self) -> TakeoverResult {
        match self {
            Ending::Refuted | Ending::Lapsed => TakeoverResult::Refuted,
            Ending::Confirmed => TakeoverResult::Confirmed,
        }
    }
}

/// An accusation that ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    /// The member.
    pub node: NodeName,
    /// The accusation.
    pub accusation: Accusation,
    /// How.
    pub how: Ending,
}

impl Ended {
    /// The takeover result to count: only for a takeover on this node's own watch.
    pub fn takeover(&self) -> Option<TakeoverResult> {
        self.accusation.own.then(|| self.how.result())
    }
}

/// What to do about an owner the watch found silent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Silent {
    /// Accused: take its IPs over and claim them.
    TakeOver,
    /// Already accused (here or on a claim): nothing more.
    AlreadyAccused,
    /// This node may not act on it (draining, not held alive, or not its successor).
    NotEligible,
    /// The gossip no longer holds the owner in the incarnation found silent: it came back
    /// renewed (a restart: the silence is its former life's, and its accusation ended confirmed
    /// already) or is gone. The watch reports a silence for a while after the fact, so without
    /// this a speaker killed and started again within a fraction of a second was accused anew
    /// right after its renewal, and both it and its takers answered until the lapse (5 s).
    NotCurrent,
    /// Heard alive in that incarnation (a refutation) since its last heartbeat here: the silence
    /// is older news. The watch reports a silent owner again with each plan for a while; without
    /// this a refuted takeover was taken again at once, in a loop, while the watch port was cut.
    HeardAlive,
}

/// What to do about another member's claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimed {
    /// It accuses this node in its current incarnation: refute it.
    Refute,
    /// It accuses an older incarnation of this node: nothing.
    OldSelf,
    /// Accused here too: elect without it.
    Accuse,
    /// Already accused.
    AlreadyAccused,
    /// Heard alive in that incarnation within [`REFUTED_RECENTLY`].
    RefutedRecently,
    /// The gossip does not hold it in that incarnation (gone, or renewed).
    NotCurrent,
}

impl Claimed {
    /// A short, stable, lowercase name for logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Claimed::Refute => "refute",
            Claimed::OldSelf => "old_self",
            Claimed::Accuse => "accuse",
            Claimed::AlreadyAccused => "already_accused",
            Claimed::RefutedRecently => "refuted_recently",
            Claimed::NotCurrent => "not_current",
        }
    }
}

/// A change the gossip reported about a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// It joined (or rejoined).
    Up,
    /// It went down or left.
    Down,
    /// Its record changed.
    Meta,
}

/// What a gossip change did to an accusation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberChange {
    /// The member was not accused: the change goes to the engine as it is.
    NotAccused,
    /// The accusation ended confirmed: the change goes to the engine.
    Confirmed(Ended),
    /// Still accused (a record change in the accused incarnation): the engine keeps electing
    /// without it, so the change goes nowhere.
    StillAccused,
}

/// The accusations of one node (see the module docs).
#[derive(Debug, Default)]
pub struct Accusations {
    accused: BTreeMap<NodeName, Accusation>,
    /// When each member was last heard alive refuting (incarnation, when).
    refuted: BTreeMap<NodeName, (u64, Duration)>,
}

impl Accusations {
    /// The accusation of `node`, if any.
    pub fn get(&self, node: &str) -> Option<&Accusation> {
        self.accused.get(node)
    }

    /// The members accused.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeName> {
        self.accused.keys()
    }

    /// The members accused, with the incarnation accused (the watch's plan).
    pub fn incarnations(&self) -> BTreeMap<NodeName, u64> {
        self.accused
            .iter()
            .map(|(node, a)| (node.clone(), a.incarnation))
            .collect()
    }

    /// When the next accusation lapses.
    pub fn next_lapse(&self) -> Option<Duration> {
        self.accused
            .values()
            .map(|a| a.since + ACCUSATION_TTL)
            .min()
    }

    /// The watch found `owner` silent `silent_for` after its last heartbeat, at `now`.
    /// `eligible`: this node may act on it (not draining, the gossip holds the owner, and this
    /// node succeeds it for at least one IP); `held`: what the gossip holds (module docs).
    pub fn silent(
        &mut self,
        now: Duration,
        owner: &NodeIdentity,
        silent_for: Duration,
        eligible: bool,
        held: impl Fn(&str, u64) -> bool,
    ) -> Silent {
        if self.accused.contains_key(owner.node.as_str()) {
            return Silent::AlreadyAccused;
        }
        let last_heard = now.saturating_sub(silent_for);
        if self
            .refuted
            .get(owner.node.as_str())
            .is_some_and(|(incarnation, at)| *incarnation == owner.bump && *at >= last_heard)
        {
            return Silent::HeardAlive;
        }
        if !held(owner.node.as_str(), owner.bump) {
            return Silent::NotCurrent;
        }
        if !eligible {
            return Silent::NotEligible;
        }
        self.accused.insert(
            owner.node.to_string(),
            Accusation {
                incarnation: owner.bump,
                own: true,
                since: now,
                last_heard: Some(now.saturating_sub(silent_for)),
            },
        );
        Silent::TakeOver
    }

    /// A member claims it took over from `accused` in `incarnation`; this node is `me`.
    pub fn claimed(
        &mut self,
        now: Duration,
        me: &NodeIdentity,
        accused: &str,
        incarnation: u64,
        held: impl Fn(&str, u64) -> bool,
    ) -> Claimed {
        if accused == me.node.as_str() {
            return if incarnation == me.bump {
                Claimed::Refute
            } else {
                Claimed::OldSelf
            };
        }
        if self.accused.contains_key(accused) {
            return Claimed::AlreadyAccused;
        }
        let heard_alive = self.refuted.get(accused).is_some_and(|(inc, at)| {
            *inc == incarnation && now.saturating_sub(*at) < REFUTED_RECENTLY
        });
        if heard_alive {
            return Claimed::RefutedRecently;
        }
        if !held(accused, incarnation) {
            return Claimed::NotCurrent;
        }
        self.accused.insert(
            accused.to_string(),
            Accusation {
                incarnation,
                own: false,
                since: now,
                last_heard: None,
            },
        );
        Claimed::Accuse
    }

    /// `node` was heard alive in `incarnation` at `now` (a refutation or a heartbeat): its
    /// accusation in that incarnation ends refuted.
    pub fn alive(&mut self, now: Duration, node: &str, incarnation: u64) -> Option<Ended> {
        self.refuted.insert(node.to_string(), (incarnation, now));
        if self.accused.get(node)?.incarnation != incarnation {
            return None;
        }
        let accusation = self.accused.remove(node)?;
        Some(Ended {
            node: node.to_string(),
            accusation,
            how: Ending::Refuted,
        })
    }

    /// Ends the accusations older than [`ACCUSATION_TTL`] at `now`: lapsed when the gossip still
    /// holds the accused incarnation, confirmed when it holds the member renewed or not at all.
    pub fn lapse(&mut self, now: Duration, held: impl Fn(&str, u64) -> bool) -> Vec<Ended> {
        self.refuted
            .retain(|_, (_, at)| now.saturating_sub(*at) < REFUTED_RECENTLY);
        let due: Vec<NodeName> = self
            .accused
            .iter()
            .filter(|(_, a)| now >= a.since + ACCUSATION_TTL)
            .map(|(node, _)| node.clone())
            .collect();
        due.into_iter()
            .filter_map(|node| {
                let accusation = self.accused.remove(&node)?;
                let how = if held(&node, accusation.incarnation) {
                    Ending::Lapsed
                } else {
                    Ending::Confirmed
                };
                Some(Ended {
                    node,
                    accusation,
                    how,
                })
            })
            .collect()
    }

    /// The gossip reported `change` about `node`. A down or a join ends its accusation
    /// confirmed, and so does a record change once the gossip holds it renewed (foca may rename
    /// a member without a down seen here).
    pub fn member_changed(
        &mut self,
        node: &str,
        change: Change,
        held: impl Fn(&str, u64) -> bool,
    ) -> MemberChange {
        let Some(incarnation) = self.accused.get(node).map(|a| a.incarnation) else {
            return MemberChange::NotAccused;
        };
        if change == Change::Meta && held(node, incarnation) {
            return MemberChange::StillAccused;
        }
        match self.accused.remove(node) {
            Some(accusation) => MemberChange::Confirmed(Ended {
                node: node.to_string(),
                accusation,
                how: Ending::Confirmed,
            }),
            None => MemberChange::NotAccused,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, SocketAddr};

    use smol_str::SmolStr;

    use super::*;

    const S: Duration = Duration::from_secs(1);
    const MS: Duration = Duration::from_millis(1);

    fn id(name: &str, bump: u64) -> NodeIdentity {
        NodeIdentity {
            node: SmolStr::new(name),
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 7946)),
            bump,
        }
    }

    /// The gossip holds `owner` in incarnation 10 and `other` in 20.
    fn held(node: &str, incarnation: u64) -> bool {
        matches!((node, incarnation), ("owner", 10) | ("other", 20))
    }

    /// The gossip holds every member in every incarnation (tests not about renewals).
    fn any(_: &str, _: u64) -> bool {
        true
    }

    #[test]
    fn a_silence_of_an_incarnation_the_gossip_no_longer_holds_takes_nothing_over() {
        let mut a = Accusations::default();
        // The owner, incarnation 9, killed: its silence is accused on the watch.
        assert_eq!(
            a.silent(S, &id("owner", 9), 110 * MS, true, |_, _| true),
            Silent::TakeOver
        );
        // Started again at once: the gossip renames it in place (incarnation 10) and the
        // accusation ends confirmed.
        let changed = a.member_changed("owner", Change::Meta, held);
        assert!(matches!(changed, MemberChange::Confirmed(_)), "{changed:?}");
        // The watch still reports its former life silent: nothing is taken over again.
        assert_eq!(
            a.silent(S + MS, &id("owner", 9), 227 * MS, true, held),
            Silent::NotCurrent
        );
        assert_eq!(a.get("owner"), None);
        // The new life falling silent is a silence like any other.
        assert_eq!(
            a.silent(2 * S, &id("owner", 10), 110 * MS, true, held),
            Silent::TakeOver
        );
        // A member the gossip holds no more at all.
        assert_eq!(
            a.silent(2 * S, &id("gone", 1), 110 * MS, true, held),
            Silent::NotCurrent
        );
    }

    #[test]
    fn an_eligible_silent_owner_is_accused_once_with_its_last_heard() {
        let mut a = Accusations::default();
        let owner = id("owner", 10);
        assert_eq!(
            a.silent(10 * S, &owner, 100 * MS, false, any),
            Silent::NotEligible
        );
        assert_eq!(a.get("owner"), None);
        assert_eq!(
            a.silent(10 * S, &owner, 100 * MS, true, any),
            Silent::TakeOver
        );
        assert_eq!(
            a.get("owner"),
            Some(&Accusation {
                incarnation: 10,
                own: true,
                since: 10 * S,
                last_heard: Some(10 * S - 100 * MS),
            })
        );
        assert_eq!(
            a.silent(11 * S, &owner, MS, true, any),
            Silent::AlreadyAccused
        );
        assert_eq!(
            a.incarnations(),
            BTreeMap::from([("owner".to_string(), 10)])
        );
        assert_eq!(a.next_lapse(), Some(10 * S + ACCUSATION_TTL));
    }

    #[test]
    fn a_heartbeat_in_the_accused_incarnation_refutes_and_counts_a_refuted_takeover() {
        let mut a = Accusations::default();
        a.silent(10 * S, &id("owner", 10), MS, true, any);
        // An older incarnation heard says nothing about the accused one.
        assert_eq!(a.alive(10 * S + MS, "owner", 9), None);
        let ended = a.alive(10 * S + 2 * MS, "owner", 10).unwrap();
        assert_eq!((ended.node.as_str(), ended.how), ("owner", Ending::Refuted));
        assert_eq!(ended.takeover(), Some(TakeoverResult::Refuted));
        assert_eq!(a.get("owner"), None);
        assert_eq!(a.next_lapse(), None);
    }

    #[test]
    fn a_silence_older_than_a_refutation_takes_nothing_over_a_newer_one_does() {
        let mut a = Accusations::default();
        let owner = id("owner", 10);
        // Last heartbeat at 9.9 s, silent at 10 s, refuted (through the gossip) at 10.01 s.
        assert_eq!(
            a.silent(10 * S, &owner, 100 * MS, true, any),
            Silent::TakeOver
        );
        assert!(a.alive(10 * S + 10 * MS, "owner", 10).is_some());
        // Reported again 5 ms later, same last heartbeat: older than the refutation.
        let again = a.silent(10 * S + 15 * MS, &owner, 115 * MS, true, any);
        assert_eq!(again, Silent::HeardAlive);
        // Another incarnation's refutation says nothing about this one.
        let renewed = id("owner", 11);
        assert_eq!(
            a.silent(10 * S + 20 * MS, &renewed, 120 * MS, true, any),
            Silent::TakeOver
        );
        // Heartbeats came after the refutation, then stopped: a new silence.
        assert!(a.alive(10 * S + 30 * MS, "owner", 11).is_some());
        assert_eq!(
            a.silent(11 * S, &renewed, 110 * MS, true, any),
            Silent::TakeOver
        );
    }

    #[test]
    fn a_claim_against_this_node_is_refuted_only_in_its_current_incarnation() {
        let mut a = Accusations::default();
        let me = id("me", 7);
        assert_eq!(a.claimed(S, &me, "me", 7, held), Claimed::Refute);
        assert_eq!(a.claimed(S, &me, "me", 6, held), Claimed::OldSelf);
        assert_eq!(a.nodes().count(), 0);
    }

    #[test]
    fn claims_from_several_watchers_accuse_once_and_a_refutation_ends_it() {
        let mut a = Accusations::default();
        let me = id("me", 7);
        assert_eq!(a.claimed(S, &me, "owner", 10, held), Claimed::Accuse);
        assert_eq!(
            a.claimed(S + MS, &me, "owner", 10, held),
            Claimed::AlreadyAccused
        );
        // This node's own watch finds it silent too: it is accused already.
        assert_eq!(
            a.silent(S + 2 * MS, &id("owner", 10), MS, true, any),
            Silent::AlreadyAccused
        );
        let ended = a.alive(S + 3 * MS, "owner", 10).unwrap();
        // Not a takeover of this node's own: nothing to count.
        assert_eq!(ended.takeover(), None);
        // A claim the refutation overtook is not applied; a later one is.
        assert_eq!(
            a.claimed(S + 500 * MS, &me, "owner", 10, held),
            Claimed::RefutedRecently
        );
        assert_eq!(
            a.claimed(S + 3 * MS + REFUTED_RECENTLY, &me, "owner", 10, held),
            Claimed::Accuse
        );
    }

    #[test]
    fn a_claim_against_an_incarnation_the_gossip_does_not_hold_is_ignored() {
        let mut a = Accusations::default();
        let me = id("me", 7);
        assert_eq!(a.claimed(S, &me, "owner", 9, held), Claimed::NotCurrent);
        assert_eq!(a.claimed(S, &me, "gone", 1, held), Claimed::NotCurrent);
        assert_eq!(a.nodes().count(), 0);
    }

    #[test]
    fn an_accusation_lapses_refuted_when_the_gossip_still_holds_the_incarnation() {
        let mut a = Accusations::default();
        a.silent(S, &id("owner", 10), MS, true, any);
        a.claimed(2 * S, &id("me", 7), "other", 20, held);
        assert_eq!(a.lapse(S + ACCUSATION_TTL - MS, held), vec![]);
        let ended = a.lapse(S + ACCUSATION_TTL, held);
        assert_eq!(ended.len(), 1);
        assert_eq!(
            (ended[0].node.as_str(), ended[0].how),
            ("owner", Ending::Lapsed)
        );
        assert_eq!(ended[0].takeover(), Some(TakeoverResult::Refuted));
        // The claim's accusation lapses on its own schedule.
        assert_eq!(a.next_lapse(), Some(2 * S + ACCUSATION_TTL));
    }

    #[test]
    fn a_restarted_owner_confirms_the_accusation_of_its_old_incarnation() {
        let mut a = Accusations::default();
        a.silent(S, &id("owner", 9), MS, true, any);
        // It restarted as incarnation 10: its new heartbeats do not refute incarnation 9.
        assert_eq!(a.alive(S + MS, "owner", 10), None);
        // Its new record arrives (a Meta): the gossip holds it renewed, so confirmed.
        match a.member_changed("owner", Change::Meta, held) {
            MemberChange::Confirmed(ended) => {
                assert_eq!(ended.takeover(), Some(TakeoverResult::Confirmed));
            }
            other => panic!("{other:?}"),
        }
        // Had no record come, the lapse confirms it as well.
        a.silent(2 * S, &id("owner", 9), MS, true, any);
        let ended = a.lapse(2 * S + ACCUSATION_TTL, held);
        assert_eq!(ended[0].how, Ending::Confirmed);
    }

    #[test]
    fn a_down_or_a_join_confirms_and_a_record_change_in_the_accused_incarnation_does_not() {
        let mut a = Accusations::default();
        assert_eq!(
            a.member_changed("owner", Change::Down, held),
            MemberChange::NotAccused
        );
        a.silent(S, &id("owner", 10), MS, true, any);
        assert_eq!(
            a.member_changed("owner", Change::Meta, held),
            MemberChange::StillAccused
        );
        assert!(matches!(
            a.member_changed("owner", Change::Down, held),
            MemberChange::Confirmed(Ended {
                how: Ending::Confirmed,
                ..
            })
        ));
        a.silent(2 * S, &id("owner", 10), MS, true, any);
        assert!(matches!(
            a.member_changed("owner", Change::Up, held),
            MemberChange::Confirmed(_)
        ));
        assert_eq!(a.nodes().count(), 0);
    }
}
