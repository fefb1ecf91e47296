//! Replay protection for gossip datagrams, with no extra round trip: the [`ReplayGuard`] a
//! receiver keeps, and the [`sender_id`] each speaker seals under.
//!
//! Every envelope carries a [`Sequence`] in its authenticated header (see
//! [`swimlb_proto::envelope`]): the sender's id, its epoch and a counter. The gossip core seals
//! with the hash of its gossip address as sender id (the same across restarts, and what foca
//! tracks members by), its start-up identity bump as epoch (milliseconds since the Unix epoch
//! in the speaker, so a restart always starts a larger epoch), and a counter that grows by one
//! per datagram over every destination and across key rotations and identity renewals.
//!
//! After an envelope has opened (so its sequence is authentic), the receiver admits it only if
//! it is new, in the manner of IPsec's anti-replay window (RFC 4303 section 3.4.3) and
//! WireGuard's: per sender it keeps the newest epoch, the highest counter seen in it and a
//! 128-bit map of the counters just below. A datagram is a replay ([`Replay`]) when
//! - its epoch is older than the newest seen from its sender: sent before the sender restarted;
//! - its counter is 128 or more below the highest: too old to tell, so refused;
//! - its counter is in the window and already seen: a copy.
//!
//! A newer epoch starts a fresh window (the sender restarted). Datagrams may arrive out of order
//! by up to 127 of the sender's datagrams (all destinations together): enough for a sender's
//! burst, several times what a LAN reorders. A replay is counted
//! (`swimlb_gossip_rejected_total{reason="replay"}`) and never reaches foca.
//!
//! The check runs after authentication, not before: a replay then costs one AES-GCM open (as a
//! forged datagram does), and the label says exactly "authentic, but seen before" (a forged
//! datagram is `authentication_failed` whatever its header claims).
//!
//! Cost: 16 bytes per datagram (sender id and epoch; the counter rides in the nonce), and per
//! sender one map entry of 64 bytes (epoch, highest counter, 128-bit window, last heard).
//! Admitting a datagram is one hash lookup and a few shifts; it allocates only for a sender seen
//! for the first time.
//!
//! Bounds: only authentic datagrams create state, so only key holders can add senders. A
//! sender is remembered for [`FORGET_AFTER`] (24 h, as long as foca remembers a down member)
//! after its last admitted datagram, and at most [`MIN_SENDERS`] or four times the cluster's
//! size, whichever is larger; above that the least recently heard are forgotten first. A
//! member's entry is not dropped when it leaves or goes down: the replay that matters most is
//! that of a departed member's announces, hours later.
//!
//! Limits, by design of a scheme without a round trip:
//! - A receiver that restarts has no memory: until a sender's next real datagram reaches it,
//!   it may accept, once each and in increasing order, older datagrams of that sender's current
//!   epoch (trust on first use). Once a real one arrives, the older ones fall behind the window.
//! - A speaker whose clock stepped back across a restart starts an older epoch than its
//!   previous life and is refused (counted as `replay`) until receivers forget that life, as
//!   foca already refuses an identity with a lower bump than the one it holds for that address.

use std::collections::hash_map::Entry;
use std::net::SocketAddr;
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use swimlb_proto::Sequence;

use super::metadata::FastMap;

/// Width of each sender's window of recent counters.
pub const WINDOW: u64 = 128;
/// Senders remembered at least (about 256 KiB at most).
pub const MIN_SENDERS: usize = 4096;
/// How long a sender with no admitted datagram is remembered (foca's `remove_down_after`).
pub const FORGET_AFTER: Duration = Duration::from_secs(24 * 3600);
/// How often the guard looks for senders to forget by age.
const AGE_SWEEP_PERIOD: Duration = Duration::from_secs(600);

/// The id a speaker at gossip address `addr` seals under: the first eight bytes of
/// `SHA-256("swimlb sender" || family || address || port [|| scope id])`. The same across the
/// speaker's restarts, so receivers can order its epochs.
pub fn sender_id(addr: SocketAddr) -> u64 {
    let mut hash = Sha256::new();
    hash.update(b"swimlb sender");
    match addr {
        SocketAddr::V4(a) => {
            hash.update([4]);
            hash.update(a.ip().octets());
            hash.update(a.port().to_be_bytes());
        }
        SocketAddr::V6(a) => {
            hash.update([6]);
            hash.update(a.ip().octets());
            hash.update(a.port().to_be_bytes());
            hash.update(a.scope_id().to_be_bytes());
        }
    }
    let digest = hash.finalize();
    let mut id = [0u8; 8];
    id.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(id)
}

/// Why an authentic datagram was refused as a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// From an epoch older than the newest seen from its sender (sent before a restart).
    OldEpoch,
    /// Its counter is a window or more below the highest seen in its epoch.
    BehindWindow,
    /// Already seen.
    Duplicate,
}

impl Replay {
    /// The verdict's name for logs.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Replay::OldEpoch => "old_epoch",
            Replay::BehindWindow => "behind_window",
            Replay::Duplicate => "duplicate",
        }
    }
}

/// One sender's newest epoch, highest counter in it, and which of the counters just below have
/// been seen (bit `i`: counter `top - i`).
#[derive(Debug, Clone, Copy)]
struct Window {
    epoch: u64,
    top: u64,
    seen: u128,
    heard: Duration,
}

impl Window {
    fn fresh(sequence: Sequence, now: Duration) -> Window {
        Window {
            epoch: sequence.epoch,
            top: sequence.counter,
            seen: 1,
            heard: now,
        }
    }

    /// Admits `sequence` (and records it) or says why it is a replay (and changes nothing).
    fn admit(&mut self, sequence: Sequence, now: Duration) -> Result<(), Replay> {
        match sequence.epoch.cmp(&self.epoch) {
            std::cmp::Ordering::Less => return Err(Replay::OldEpoch),
            std::cmp::Ordering::Greater => {
                *self = Window::fresh(sequence, now);
                return Ok(());
            }
            std::cmp::Ordering::Equal => {}
        }
        if sequence.counter > self.top {
            let ahead = sequence.counter - self.top;
            self.seen = if ahead >= WINDOW {
                0
            } else {
                self.seen << ahead
            };
            self.seen |= 1;
            self.top = sequence.counter;
        } else {
            let behind = self.top - sequence.counter;
            if behind >= WINDOW {
                return Err(Replay::BehindWindow);
            }
            let bit = 1u128 << behind;
            if self.seen & bit != 0 {
                return Err(Replay::Duplicate);
            }
            self.seen |= bit;
        }
        self.heard = now;
        Ok(())
    }
}

/// What a receiver remembers of each sender's stream. See the module docs.
#[derive(Debug, Default)]
pub struct ReplayGuard {
    senders: FastMap<u64, Window>,
    next_age_sweep: Duration,
}

impl ReplayGuard {
    /// Admits the (authenticated) `sequence` heard at `now` and records it, or says why it is a
    /// replay; a refused sequence changes nothing.
    pub fn admit(&mut self, sequence: Sequence, now: Duration) -> Result<(), Replay> {
        match self.senders.entry(sequence.sender) {
            Entry::Occupied(entry) => entry.into_mut().admit(sequence, now),
            Entry::Vacant(entry) => {
                entry.insert(Window::fresh(sequence, now));
                Ok(())
            }
        }
    }

    /// How many senders are remembered.
    pub fn len(&self) -> usize {
        self.senders.len()
    }

    /// Whether no sender is remembered.
    pub fn is_empty(&self) -> bool {
        self.senders.is_empty()
    }

    /// Forgets senders with no admitted datagram for [`FORGET_AFTER`] (looked for every ten
    /// minutes), then, while more than `max(MIN_SENDERS, 4 x members)` remain, the least
    /// recently heard. Cheap when there is nothing to do: called every second.
    pub fn prune(&mut self, now: Duration, members: usize) {
        if now >= self.next_age_sweep {
            self.next_age_sweep = now + AGE_SWEEP_PERIOD;
            self.senders
                .retain(|_, window| now.saturating_sub(window.heard) < FORGET_AFTER);
        }
        let bound = MIN_SENDERS.max(members.saturating_mul(4));
        if self.senders.len() <= bound {
            return;
        }
        // Keep the `bound` most recently heard.
        let mut heard: Vec<Duration> = self.senders.values().map(|w| w.heard).collect();
        let cut = heard.len() - bound;
        let (_, oldest_kept, _) = heard.select_nth_unstable(cut);
        let oldest_kept = *oldest_kept;
        self.senders.retain(|_, window| window.heard >= oldest_kept);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const A: u64 = 0xa;
    const B: u64 = 0xb;

    fn seq(sender: u64, epoch: u64, counter: u64) -> Sequence {
        Sequence {
            sender,
            epoch,
            counter,
        }
    }

    fn at(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn a_datagram_seen_twice_is_a_replay_the_second_time() {
        let mut guard = ReplayGuard::default();
        assert_eq!(guard.admit(seq(A, 1, 100), at(0)), Ok(()));
        assert_eq!(guard.admit(seq(A, 1, 100), at(1)), Err(Replay::Duplicate));
        assert_eq!(guard.admit(seq(A, 1, 101), at(1)), Ok(()));
        assert_eq!(guard.admit(seq(A, 1, 100), at(2)), Err(Replay::Duplicate));
        assert_eq!(guard.admit(seq(A, 1, 101), at(2)), Err(Replay::Duplicate));
    }

    #[test]
    fn reordering_within_the_window_is_accepted_once_each() {
        let mut guard = ReplayGuard::default();
        assert_eq!(guard.admit(seq(A, 1, 1000), at(0)), Ok(()));
        // Later datagrams first, then the ones they overtook, as far back as the window goes.
        for counter in [1005, 1003, 1001, 1004, 1002, 1005 - (WINDOW - 1), 999] {
            assert_eq!(guard.admit(seq(A, 1, counter), at(0)), Ok(()), "{counter}");
        }
        for counter in [1000, 1001, 1002, 1003, 1004, 1005, 999] {
            assert_eq!(
                guard.admit(seq(A, 1, counter), at(0)),
                Err(Replay::Duplicate),
                "{counter}"
            );
        }
    }

    #[test]
    fn a_datagram_a_window_or_more_behind_is_refused() {
        let mut guard = ReplayGuard::default();
        assert_eq!(guard.admit(seq(A, 1, 10), at(0)), Ok(()));
        assert_eq!(guard.admit(seq(A, 1, 10 + WINDOW), at(0)), Ok(()));
        // 10 is exactly a window behind: refused; 11, never seen and just inside, is admitted.
        assert_eq!(guard.admit(seq(A, 1, 10), at(0)), Err(Replay::BehindWindow));
        assert_eq!(guard.admit(seq(A, 1, 11), at(0)), Ok(()));
        // A jump of more than a window forgets everything below.
        assert_eq!(guard.admit(seq(A, 1, 1_000_000), at(0)), Ok(()));
        assert_eq!(
            guard.admit(seq(A, 1, 10 + WINDOW), at(0)),
            Err(Replay::BehindWindow)
        );
        assert_eq!(guard.admit(seq(A, 1, 0), at(0)), Err(Replay::BehindWindow));
    }

    #[test]
    fn after_a_restart_every_datagram_of_the_previous_life_is_refused() {
        let mut guard = ReplayGuard::default();
        for counter in 500..510 {
            assert_eq!(guard.admit(seq(A, 1_000, counter), at(0)), Ok(()));
        }
        // The sender restarts: a newer epoch, and a counter that starts anywhere (even lower).
        assert_eq!(guard.admit(seq(A, 2_000, 7), at(5)), Ok(()));
        for counter in [500, 509, 510, 10_000] {
            assert_eq!(
                guard.admit(seq(A, 1_000, counter), at(6)),
                Err(Replay::OldEpoch),
                "{counter}"
            );
        }
        assert_eq!(guard.admit(seq(A, 2_000, 8), at(6)), Ok(()));
        assert_eq!(guard.admit(seq(A, 2_000, 7), at(6)), Err(Replay::Duplicate));
    }

    #[test]
    fn each_sender_has_its_own_window() {
        let mut guard = ReplayGuard::default();
        assert_eq!(guard.admit(seq(A, 5, 1_000_000), at(0)), Ok(()));
        // B's counters are far below A's and its epoch older: no matter.
        assert_eq!(guard.admit(seq(B, 1, 3), at(0)), Ok(()));
        assert_eq!(guard.admit(seq(B, 1, 2), at(0)), Ok(()));
        assert_eq!(
            guard.admit(seq(A, 5, 1_000_000), at(0)),
            Err(Replay::Duplicate)
        );
        assert_eq!(guard.admit(seq(B, 1, 3), at(0)), Err(Replay::Duplicate));
        // A restart of B leaves A's window alone.
        assert_eq!(guard.admit(seq(B, 2, 0), at(0)), Ok(()));
        assert_eq!(guard.admit(seq(A, 5, 1_000_001), at(0)), Ok(()));
        assert_eq!(guard.admit(seq(B, 1, 4), at(0)), Err(Replay::OldEpoch));
        assert_eq!(guard.len(), 2);
    }

    #[test]
    fn a_replay_hours_later_is_refused_and_a_day_of_silence_forgets_the_sender() {
        let mut guard = ReplayGuard::default();
        for counter in 0..200 {
            assert_eq!(guard.admit(seq(A, 1, counter), at(0)), Ok(()));
        }
        let hours = at(23 * 3600);
        guard.prune(hours, 3);
        for counter in [0, 150, 199] {
            assert!(guard.admit(seq(A, 1, counter), hours).is_err(), "{counter}");
        }
        guard.prune(at(24 * 3600 + 1), 3);
        assert!(
            guard.is_empty(),
            "forgotten after a day without an admitted datagram"
        );
    }

    #[test]
    fn above_the_bound_the_least_recently_heard_senders_are_forgotten() {
        let mut guard = ReplayGuard::default();
        let n = MIN_SENDERS as u64 + 100;
        for sender in 0..n {
            assert_eq!(guard.admit(seq(sender, 1, 0), at(sender)), Ok(()));
        }
        guard.prune(at(n), 10);
        assert_eq!(guard.len(), MIN_SENDERS);
        // The first 100 senders (heard longest ago) are the ones gone.
        assert_eq!(guard.admit(seq(100, 1, 0), at(n)), Err(Replay::Duplicate));
        assert_eq!(guard.admit(seq(99, 1, 0), at(n)), Ok(()));
        // A large cluster raises the bound.
        for sender in n..2 * n {
            assert_eq!(guard.admit(seq(sender, 1, 0), at(n)), Ok(()));
        }
        guard.prune(at(n), 2 * MIN_SENDERS);
        assert_eq!(guard.len() as u64, 2 * n - 100 + 1);
    }

    #[test]
    fn sender_ids_differ_by_address_and_stay_the_same_for_one() {
        let id = |s: &str| sender_id(s.parse().unwrap());
        assert_eq!(id("192.0.2.10:7946"), id("192.0.2.10:7946"));
        assert_ne!(id("192.0.2.10:7946"), id("192.0.2.11:7946"));
        assert_ne!(id("192.0.2.10:7946"), id("192.0.2.10:7947"));
        assert_ne!(id("192.0.2.10:7946"), id("[::ffff:192.0.2.10]:7946"));
        assert_ne!(id("[fe80::1%1]:7946"), id("[fe80::1%2]:7946"));
    }

    proptest! {
        /// The window agrees with a model that remembers every counter: a counter is admitted
        /// exactly when it was never admitted and is less than a window below the highest
        /// admitted so far.
        #[test]
        fn the_window_matches_a_model_with_perfect_memory(
            counters in proptest::collection::vec(0u64..400, 1..300),
        ) {
            let mut guard = ReplayGuard::default();
            let mut admitted = std::collections::BTreeSet::new();
            for counter in counters {
                let top = admitted.last().copied();
                let expected = !admitted.contains(&counter)
                    && top.is_none_or(|top| counter + WINDOW > top);
                let got = guard.admit(seq(A, 1, counter), at(0)).is_ok();
                prop_assert_eq!(got, expected, "counter {}", counter);
                if got {
                    admitted.insert(counter);
                }
            }
        }
    }
}
