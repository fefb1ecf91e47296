//! The owner watch's knobs ([`Knobs`]): its interval and misses, and their limits. Plain data
//! below both the gossip's timing profiles (which carry them) and the owner watch (which runs
//! on them); the watch's own rules are in [`crate::owner_watch`].

use std::time::Duration;

/// The fast interval `I` by default (the `fast` profile).
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(20);
/// Missed intervals `M` before silence, by default.
pub const DEFAULT_MISSES: u32 = 5;
/// The shortest interval `check-config` accepts.
pub const MIN_INTERVAL: Duration = Duration::from_millis(10);
/// The fewest misses `check-config` accepts.
pub const MIN_MISSES: u32 = 3;
/// The rate of a watch not yet established, and the longest interval accepted.
pub const SLOW_INTERVAL: Duration = Duration::from_secs(1);
/// The watch's knobs, per profile. Validate with [`Knobs::validate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Knobs {
    /// The fast interval `I`.
    pub interval: Duration,
    /// Missed intervals `M` before silence.
    pub misses: u32,
    /// The off switch: when false the caller runs no watch (gossip alone detects).
    pub enabled: bool,
}

impl Default for Knobs {
    fn default() -> Knobs {
        Knobs {
            interval: DEFAULT_INTERVAL,
            misses: DEFAULT_MISSES,
            enabled: true,
        }
    }
}

/// Why [`Knobs`] are invalid. Each names the value it refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KnobsError {
    /// `I` < [`MIN_INTERVAL`].
    #[error("owner watch interval {0:?} is shorter than the minimum of 10ms")]
    IntervalTooShort(Duration),
    /// `I` > [`SLOW_INTERVAL`] (a heartbeat carries at most 65,535 ms anyway).
    #[error("owner watch interval {0:?} is longer than the slow rate of 1s")]
    IntervalTooLong(Duration),
    /// `M` < [`MIN_MISSES`].
    #[error("owner watch misses {0} is fewer than the minimum of 3")]
    TooFewMisses(u32),
}

impl Knobs {
    /// Checks `I` >= 10 ms, `I` <= 1 s and `M` >= 3, also when the watch is off (so a profile
    /// switched on later is already valid); returns every problem at once.
    pub fn validate(&self) -> Result<(), Vec<KnobsError>> {
        let mut problems = Vec::new();
        if self.interval < MIN_INTERVAL {
            problems.push(KnobsError::IntervalTooShort(self.interval));
        }
        if self.interval > SLOW_INTERVAL {
            problems.push(KnobsError::IntervalTooLong(self.interval));
        }
        if self.misses < MIN_MISSES {
            problems.push(KnobsError::TooFewMisses(self.misses));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}
