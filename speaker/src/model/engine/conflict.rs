//! Conflict damping: how often the owner answers another MAC's claim on one of its IPs.
//!
//! Two owners (a partition healing) each see the other's announcements as conflicts; answering
//! each one with a burst would feed a storm. So: one re-announcement burst per IP per
//! [`CONFLICT_HOLDOFF`]; a claim during the hold-off gets one trailing burst when it ends (a
//! node losing the IP may have claimed it once more before the gossip told it, and the last
//! word on the segment must be the owner's); one log line per IP per [`CONFLICT_LOG_INTERVAL`].
//! Pure: `now` is an argument.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use tokio::time::Instant;

/// After a conflict is answered with a burst, further conflicts for that IP only get the
/// trailing burst for this long.
pub const CONFLICT_HOLDOFF: Duration = Duration::from_secs(1);
/// A conflict for one IP is logged at most once per this interval.
pub const CONFLICT_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// When a conflict for one IP was last answered and last logged.
#[derive(Debug, Clone, Copy, Default)]
struct Guard {
    reannounced: Option<Instant>,
    logged: Option<Instant>,
    /// A claim came during the hold-off: re-announce at this time, if still the owner.
    trailing: Option<Instant>,
    /// The last claim.
    claimed: Option<Instant>,
}

/// What to do about one claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    /// Re-announce now.
    pub reannounce: bool,
    /// Log this claim (rate-limited).
    pub log: bool,
}

/// The damping state of every IP that saw a conflict while owned.
#[derive(Debug, Clone, Default)]
pub struct ConflictDamper {
    guards: BTreeMap<IpAddr, Guard>,
}

impl ConflictDamper {
    /// Another MAC claimed `ip` (owned by this node) at `now`.
    pub fn claim(&mut self, now: Instant, ip: IpAddr) -> Response {
        let guard = self.guards.entry(ip).or_default();
        guard.claimed = Some(now);
        let log = guard
            .logged
            .is_none_or(|t| now >= t + CONFLICT_LOG_INTERVAL);
        if log {
            guard.logged = Some(now);
        }
        let reannounce = guard
            .reannounced
            .is_none_or(|t| now >= t + CONFLICT_HOLDOFF);
        if reannounce {
            guard.reannounced = Some(now);
            guard.trailing = None;
        } else if guard.trailing.is_none() {
            guard.trailing = guard.reannounced.map(|t| t + CONFLICT_HOLDOFF);
        }
        Response { reannounce, log }
    }

    /// When the next trailing re-announcement is due.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.guards.values().filter_map(|g| g.trailing).min()
    }

    /// The IPs whose trailing re-announcement is due at `now` (each counts as a re-announcement
    /// for the hold-off).
    pub fn due(&mut self, now: Instant) -> Vec<IpAddr> {
        let mut due = Vec::new();
        for (ip, guard) in &mut self.guards {
            if guard.trailing.is_some_and(|t| t <= now) {
                guard.trailing = None;
                guard.reannounced = Some(now);
                due.push(*ip);
            }
        }
        due
    }

    /// Whether another MAC claimed `ip` at `since` or later.
    pub fn claimed_since(&self, ip: &IpAddr, since: Instant) -> bool {
        self.guards
            .get(ip)
            .and_then(|g| g.claimed)
            .is_some_and(|t| t >= since)
    }

    /// Forgets `ip` (no longer owned), so the state stays bounded by the owned IPs.
    pub fn forget(&mut self, ip: &IpAddr) {
        self.guards.remove(ip);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_storm_gets_one_burst_per_second_then_a_trailing_one() {
        let t0 = Instant::now();
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let mut damper = ConflictDamper::default();
        let first = damper.claim(t0, ip);
        assert!(first.reannounce && first.log);
        let mut bursts = 0;
        // 100 claims over the next 990 ms: none answered at once, none logged.
        for i in 1..=99u64 {
            let r = damper.claim(t0 + ms(i * 10), ip);
            assert!(!r.log);
            bursts += usize::from(r.reannounce);
        }
        assert_eq!(bursts, 0);
        assert_eq!(damper.next_deadline(), Some(t0 + CONFLICT_HOLDOFF));
        assert!(damper.due(t0 + ms(999)).is_empty());
        assert_eq!(damper.due(t0 + CONFLICT_HOLDOFF), vec![ip]);
        assert_eq!(damper.next_deadline(), None);
        // Quiet after the trailing burst: the next claim waits out the hold-off again.
        assert!(!damper.claim(t0 + ms(1500), ip).reannounce);
        assert!(damper.claim(t0 + ms(2000), ip).reannounce);
    }

    #[test]
    fn ips_are_damped_apart_and_forgotten_when_disowned() {
        let t0 = Instant::now();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "2001:db8::1".parse().unwrap();
        let mut damper = ConflictDamper::default();
        assert!(damper.claim(t0, a).reannounce);
        assert!(damper.claim(t0, b).reannounce);
        assert!(!damper.claim(t0 + ms(5), a).reannounce);
        damper.forget(&a);
        assert_eq!(damper.next_deadline(), None);
        assert!(damper.claim(t0 + ms(6), a).reannounce, "a fresh start");
    }
}
