//! Lifeguard's two local ideas (HashiCorp's Lifeguard paper; memberlist's `awareness.go` and
//! `suspicion.go`), as pure values the [`Core`](super::Core) drives on top of foca 2, which has
//! neither:
//!
//! - [`LocalHealth`]: a score from 0 to `max - 1` that a member counts against itself when its
//!   own probes fail, when it has to refute a suspicion about itself, or when it was scheduled
//!   late. Its probe period, its probe timeout and its suspicion timeouts are stretched by
//!   `score + 1`, so a slow or lossy member slows down instead of accusing healthy ones. Every
//!   probe that succeeds takes one point back.
//! - [`suspicion_timeout`]: a suspicion starts at `max` and shrinks towards `min` with the
//!   number of independent confirmations `c` (out of the `k` wanted):
//!   `max(min, max - (max - min) * ln(c + 1) / ln(k + 1))`. A crash that several members confirm
//!   is declared after `min`; a lone observer's suspicion runs the full `max`, which leaves the
//!   suspect time to refute.
//!
//! How confirmations are gathered is the core's business (foca's suspicion carries no accuser,
//! so memberlist's way of counting distinct accusers cannot be reproduced from outside foca; see
//! [`super::core`]).

use std::time::Duration;

/// memberlist's `AwarenessMaxMultiplier`: timeouts stretch at most eight-fold.
pub const HEALTH_MAX: u32 = 8;

/// This member's estimate of its own health (0 is healthy). See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalHealth {
    score: u32,
    max: u32,
}

impl Default for LocalHealth {
    fn default() -> LocalHealth {
        LocalHealth::new(HEALTH_MAX)
    }
}

impl LocalHealth {
    /// A healthy member whose score stays below `max` (a `max` of 0 or 1 never stretches).
    pub const fn new(max: u32) -> LocalHealth {
        LocalHealth { score: 0, max }
    }

    /// The current score, 0 (healthy) to `max - 1`.
    pub const fn score(&self) -> u32 {
        self.score
    }

    /// Adds `delta` (negative: recovers), clamped to `0..max`; returns whether the score moved.
    pub fn apply(&mut self, delta: i32) -> bool {
        let ceiling = i64::from(self.max.saturating_sub(1));
        let next = (i64::from(self.score) + i64::from(delta)).clamp(0, ceiling);
        let next = u32::try_from(next).unwrap_or(0);
        let moved = next != self.score;
        self.score = next;
        moved
    }

    /// `timeout` stretched by `score + 1`.
    pub fn scale(&self, timeout: Duration) -> Duration {
        timeout.saturating_mul(self.score + 1)
    }
}

/// How long a suspicion lasts from its start with `confirmations` independent confirmations
/// out of the `wanted` that drive it to `min` (memberlist's `remainingSuspicionTime`, before
/// the elapsed time is taken off).
pub fn suspicion_timeout(
    confirmations: u32,
    wanted: u32,
    min: Duration,
    max: Duration,
) -> Duration {
    if max <= min || wanted == 0 || confirmations >= wanted {
        return min;
    }
    let fraction = f64::from(confirmations + 1).ln() / f64::from(wanted + 1).ln();
    let span = (max - min).as_secs_f64();
    let timeout = max.as_secs_f64() - fraction * span;
    Duration::from_secs_f64(timeout.max(min.as_secs_f64()))
}

/// How many independent confirmations shrink a suspicion to its shortest, out of `wanted`
/// (the timing's `suspicion_confirmations`), for a node that knows `others` other members.
///
/// Only the members besides this node and the suspect can confirm (`others - 1`), and wanting
/// every one of them lets a single silent one (a lost datagram, a member busy with its own
/// failed probe) stretch the suspicion towards its longest: at most all but one are wanted.
/// In a cluster too small to give `wanted` at all, none are (as memberlist does): a suspicion
/// lasts its shortest and any member that holds it may end it, as plain SWIM does. Lifeguard's
/// trust in numbers needs numbers. With 3 wanted: none up to 4 members, 2 at 5, 3 from 6.
pub fn wanted_confirmations(wanted: u32, others: usize) -> u32 {
    let could_confirm = u32::try_from(others.saturating_sub(1)).unwrap_or(u32::MAX);
    if could_confirm < wanted {
        0
    } else {
        wanted.min(could_confirm.saturating_sub(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn health_rises_to_its_ceiling_and_recovers_to_zero() {
        let mut h = LocalHealth::new(4);
        assert_eq!(h.scale(ms(80)), ms(80));
        assert!(h.apply(1));
        assert!(h.apply(5));
        assert_eq!(h.score(), 3, "clamped below max");
        assert!(!h.apply(1), "railed at the ceiling");
        assert_eq!(h.scale(ms(80)), ms(320));
        assert!(h.apply(-1));
        assert!(h.apply(-10));
        assert_eq!(h.score(), 0);
        assert!(!h.apply(-1), "railed at zero");
    }

    #[test]
    fn a_health_of_max_one_never_stretches() {
        let mut h = LocalHealth::new(1);
        assert!(!h.apply(3));
        assert_eq!(h.scale(ms(30)), ms(30));
    }

    #[test]
    fn suspicion_starts_at_max_and_reaches_min_with_the_wanted_confirmations() {
        let (min, max) = (ms(150), ms(900));
        assert_eq!(suspicion_timeout(0, 3, min, max), max);
        let one = suspicion_timeout(1, 3, min, max);
        let two = suspicion_timeout(2, 3, min, max);
        // memberlist's formula: 900 - 750 * ln 2 / ln 4 = 525 ms; ln 3 / ln 4 -> 305.6 ms.
        assert_eq!(one.as_millis(), 525);
        assert_eq!(two.as_millis(), 305);
        assert_eq!(suspicion_timeout(3, 3, min, max), min);
        assert_eq!(suspicion_timeout(9, 3, min, max), min);
        assert_eq!(suspicion_timeout(0, 0, min, max), min);
        assert_eq!(suspicion_timeout(0, 3, max, min), max, "max below min: min");
    }

    #[test]
    fn small_clusters_want_no_confirmations_and_leave_one_confirmer_spare() {
        // `others` excludes this node: 5 members are 4 others, 3 of whom could confirm.
        let wanted: Vec<u32> = (0..=8)
            .map(|others| wanted_confirmations(3, others))
            .collect();
        assert_eq!(wanted, [0, 0, 0, 0, 2, 3, 3, 3, 3]);
        // The 5-member case: two confirmations out of three reach the shortest suspicion, so
        // one silent confirmer no longer stretches it.
        let (min, max) = (ms(150), ms(900));
        assert_eq!(
            suspicion_timeout(2, wanted_confirmations(3, 4), min, max),
            min
        );
        assert_eq!(
            wanted_confirmations(1, 1),
            0,
            "only the suspect: none can confirm"
        );
        assert_eq!(wanted_confirmations(1, 3), 1);
        assert_eq!(wanted_confirmations(0, 99), 0);
        assert_eq!(wanted_confirmations(0, 0), 0);
        assert_eq!(
            wanted_confirmations(3, 99),
            3,
            "large clusters: all that are wanted"
        );
    }
}
