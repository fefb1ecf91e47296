//! When a starting (or paused) node may answer: [`JoinHold`], pure, `now` an argument.

use std::time::Duration;

use tokio::time::Instant;

use crate::gossip::Phase;
use crate::model::membership::LiveSet;

/// A starting node answers at the latest this long after start, joined or not (its peers may
/// all be down: then it serves alone).
pub const JOIN_GRACE: Duration = Duration::from_secs(3);
/// After joining, a node waits this long (and for every member's record) before it answers, so
/// that the members the join brought are known.
pub const JOIN_SETTLE: Duration = Duration::from_millis(200);

/// When a starting node may answer (pure; `now` is an argument).
#[derive(Debug, Clone)]
pub struct JoinHold {
    started: Instant,
    active_since: Option<Instant>,
    released: bool,
    /// Members the node expects at start (itself included; 0: none): the speakers that exist
    /// but have not joined yet would otherwise lose their IPs to it for a moment.
    expected: usize,
    /// Active for [`JOIN_SETTLE`] when last looked at.
    settle_passed: bool,
    /// Put back on after a pause ([`JoinHold::rearm`], [`JoinHold::rearm_now`]), not at start.
    after_pause: bool,
}

impl JoinHold {
    /// A hold from `now`; a node with no peers to join (`alone`) is never held.
    pub fn new(now: Instant, alone: bool) -> JoinHold {
        JoinHold {
            started: now,
            active_since: None,
            released: alone,
            expected: 0,
            settle_passed: false,
            after_pause: false,
        }
    }

    /// Whether this hold was put back on after a pause (see [`JoinHold::rearm`]).
    pub fn after_pause(&self) -> bool {
        self.after_pause
    }

    /// At start, the hold also waits (within [`JOIN_GRACE`]) until `members` are live: the
    /// speakers the node knows to exist (Kubernetes mode: its DaemonSet's Pods with an IP). A
    /// hold after a pause does not (see [`JoinHold::release`]).
    pub fn expect(&mut self, members: usize) {
        self.expected = members;
    }

    /// Whether the hold is still on.
    pub fn holding(&self) -> bool {
        !self.released
    }

    /// Looks at the facts at `now`; returns true once, when the hold ends. The hold ends when
    /// the node has been `Active` for [`JOIN_SETTLE`], holds every member's record (no
    /// placeholder of version 0) and, at start, sees the members it expects, or [`JOIN_GRACE`]
    /// after start.
    /// After a pause, `Joining` counts as `Active`: the gossip's pause is over, and it has no
    /// member left because it declared them all down itself (their suspicions ran out
    /// unrefuted), so this node serves alone after the settle, as one that was never paused
    /// keeps serving when its peers die.
    pub fn release(&mut self, now: Instant, phase: Phase, live: &LiveSet) -> bool {
        if self.released {
            return false;
        }
        match phase {
            Phase::Active => {
                self.active_since.get_or_insert(now);
            }
            Phase::Joining if self.after_pause => {
                self.active_since.get_or_insert(now);
            }
            Phase::Joining | Phase::Left | Phase::Paused => self.active_since = None,
        }
        let settle_passed = self.active_since.is_some_and(|t| now >= t + JOIN_SETTLE);
        // The members expected count at start only: after a pause the node knows the mesh from
        // its gossip, and a speaker that exists but is not in it (one starting, in its own start
        // hold, or one that left) can have taken nothing from it, as a node never paused does
        // not wait for it either.
        let expected = if self.after_pause { 0 } else { self.expected };
        let settled = settle_passed && live.iter().all(|m| m.version > 0) && live.len() >= expected;
        // Past the settle time only members are awaited: a membership change looks again.
        self.settle_passed = settle_passed;
        self.released = settled || now >= self.started + JOIN_GRACE;
        self.released
    }

    /// Puts the hold back on when the gossip reports a pause (the hold then ends as at start-up,
    /// [`JOIN_GRACE`] after `now` at the latest); returns true once per pause, when it does.
    pub fn rearm(&mut self, now: Instant, phase: Phase) -> bool {
        if phase != Phase::Paused || !self.released {
            return false;
        }
        *self = JoinHold {
            after_pause: true,
            ..JoinHold::new(now, false)
        };
        true
    }

    /// Puts the hold back on for a pause the owner watch saw (its thread was not scheduled for
    /// longer than a watcher waits); returns false when it was on already.
    pub fn rearm_now(&mut self, now: Instant) -> bool {
        if !self.released {
            return false;
        }
        *self = JoinHold {
            after_pause: true,
            ..JoinHold::new(now, false)
        };
        true
    }

    /// When to look again.
    pub fn next_deadline(&self) -> Option<Instant> {
        if self.released {
            return None;
        }
        let grace = self.started + JOIN_GRACE;
        Some(match self.active_since {
            Some(t) if !self.settle_passed => grace.min(t + JOIN_SETTLE),
            _ => grace,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::membership::MemberMeta;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_joining_node_waits_for_every_record_and_the_settle_time() {
        let t0 = Instant::now();
        let mut hold = JoinHold::new(t0, false);
        let mut live = LiveSet::new();
        live.upsert(MemberMeta::new("a"));
        let mut placeholder = MemberMeta::new("b");
        placeholder.version = 0;
        live.upsert(placeholder);
        assert!(!hold.release(t0 + ms(10), Phase::Joining, &live));
        assert_eq!(hold.next_deadline(), Some(t0 + JOIN_GRACE));
        assert!(!hold.release(t0 + ms(20), Phase::Active, &live));
        assert_eq!(hold.next_deadline(), Some(t0 + ms(20) + JOIN_SETTLE));
        assert!(
            !hold.release(t0 + ms(500), Phase::Active, &live),
            "b's record is missing"
        );
        live.upsert(MemberMeta::new("b"));
        assert!(hold.release(t0 + ms(501), Phase::Active, &live));
        assert!(!hold.holding());
        assert!(!hold.release(t0 + ms(502), Phase::Active, &live), "once");
    }

    #[test]
    fn a_starting_node_waits_for_the_members_it_expects_within_the_grace() {
        let t0 = Instant::now();
        let mut hold = JoinHold::new(t0, false);
        hold.expect(3);
        let mut live = LiveSet::new();
        live.upsert(MemberMeta::new("a"));
        live.upsert(MemberMeta::new("b"));
        assert!(!hold.release(t0 + ms(10), Phase::Active, &live));
        assert!(
            !hold.release(t0 + ms(300), Phase::Active, &live),
            "c is expected"
        );
        assert_eq!(hold.next_deadline(), Some(t0 + JOIN_GRACE), "no busy loop");
        live.upsert(MemberMeta::new("c"));
        assert!(hold.release(t0 + ms(301), Phase::Active, &live));
        let mut alone = JoinHold::new(t0, false);
        alone.expect(3);
        let mut two = LiveSet::new();
        two.upsert(MemberMeta::new("a"));
        assert!(!alone.release(t0 + ms(10), Phase::Active, &two));
        assert!(
            alone.release(t0 + JOIN_GRACE, Phase::Active, &two),
            "the grace ends it"
        );
    }

    #[test]
    fn a_node_that_reaches_nobody_serves_after_the_grace_and_one_alone_at_once() {
        let t0 = Instant::now();
        let live = LiveSet::new();
        let mut hold = JoinHold::new(t0, false);
        assert!(!hold.release(t0 + JOIN_GRACE - ms(1), Phase::Joining, &live));
        assert!(hold.release(t0 + JOIN_GRACE, Phase::Joining, &live));
        assert!(!JoinHold::new(t0, true).holding());
    }

    #[test]
    fn a_pause_puts_the_hold_back_until_the_node_is_active_again() {
        let t0 = Instant::now();
        let live = LiveSet::new();
        let mut hold = JoinHold::new(t0, true);
        assert!(!hold.after_pause(), "a start is no pause");
        assert!(!hold.rearm(t0, Phase::Active));
        assert!(hold.rearm(t0 + ms(10), Phase::Paused));
        assert!(hold.after_pause());
        assert!(hold.holding());
        assert!(!hold.rearm(t0 + ms(20), Phase::Paused), "once per pause");
        assert!(!hold.release(t0 + ms(30), Phase::Paused, &live));
        assert!(!hold.release(t0 + ms(40), Phase::Active, &live));
        assert!(hold.release(t0 + ms(40) + JOIN_SETTLE, Phase::Active, &live));
        assert!(hold.after_pause(), "the daemon asks once released");
        // Back from a pause to find every peer gone (declared down by this node's gossip): it
        // serves after the settle, not the start-up grace.
        assert!(hold.rearm(t0 + ms(1000), Phase::Paused));
        assert!(!hold.release(t0 + ms(1100), Phase::Paused, &live));
        assert!(!hold.release(t0 + ms(1200), Phase::Joining, &live));
        assert_eq!(hold.next_deadline(), Some(t0 + ms(1200) + JOIN_SETTLE));
        assert!(hold.release(t0 + ms(1200) + JOIN_SETTLE, Phase::Joining, &live));
        let mut starting = JoinHold::new(t0, false);
        assert!(
            !starting.release(t0 + JOIN_SETTLE * 2, Phase::Joining, &live),
            "a start waits"
        );
        let mut seen = JoinHold::new(t0, true);
        assert!(seen.rearm_now(t0 + ms(10)));
        assert!(seen.after_pause(), "a pause the owner watch saw");
        assert!(!starting.rearm_now(t0 + ms(10)), "held already");
        assert!(!starting.after_pause());
    }

    /// A rolling update on real nodes: the owner's speaker left, its successor paused 120 ms
    /// and, in its hold, heard of the Pods (the new one on the owner's node counts): it held
    /// until the new speaker joined, the VIP unanswered 2 s. The Pods count at start only.
    #[test]
    fn a_hold_after_a_pause_does_not_wait_for_the_pods_a_start_waits_for() {
        let t0 = Instant::now();
        let mut two = LiveSet::new();
        two.upsert(MemberMeta::new("node1"));
        two.upsert(MemberMeta::new("node2"));
        let mut three = two.clone();
        three.upsert(MemberMeta::new("node3"));
        let mut hold = JoinHold::new(t0, false);
        hold.expect(3);
        assert!(!hold.release(t0 + ms(10), Phase::Active, &three));
        assert!(hold.release(t0 + ms(300), Phase::Active, &three));
        assert!(hold.rearm_now(t0 + ms(5000)));
        hold.expect(3);
        assert!(!hold.release(t0 + ms(5010), Phase::Active, &two));
        assert_eq!(hold.next_deadline(), Some(t0 + ms(5010) + JOIN_SETTLE));
        assert!(
            hold.release(t0 + ms(5010) + JOIN_SETTLE, Phase::Active, &two),
            "node3's speaker left: the mesh is node1 and node2"
        );
        // Still every member's record: one that joined in the hold is awaited.
        assert!(hold.rearm_now(t0 + ms(9000)));
        let mut joined = two.clone();
        let mut placeholder = MemberMeta::new("node3");
        placeholder.version = 0;
        joined.upsert(placeholder);
        assert!(!hold.release(t0 + ms(9010), Phase::Active, &joined));
        assert!(!hold.release(t0 + ms(9010) + JOIN_SETTLE, Phase::Active, &joined));
        joined.upsert(MemberMeta::new("node3"));
        assert!(hold.release(t0 + ms(9300), Phase::Active, &joined));
    }
}
