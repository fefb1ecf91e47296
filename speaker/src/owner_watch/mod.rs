//! The owner watch, sans-IO: when an owner sends its heartbeats ([`Schedule`]), when the next
//! node in line finds the owner silent ([`Detector`]), the knobs ([`Knobs`]) and the model the
//! book states ([`worst_case_detection`], [`false_suspicions_per_hour`],
//! [`packets_per_second_per_pair`]). The protocol around them is [`WatchCore`] ([`core`]), what
//! the daemon makes of its events is [`accusations`]; [`service`] is the socket thread that
//! drives the core, the only part here that does I/O.
//!
//! Nothing here reads a clock, opens a socket, logs or draws system randomness. Time is a
//! [`Duration`] since an origin the caller picks, passed into every call, as in
//! [`crate::gossip::Core`]; the jitter comes from an RNG seeded by the caller. The datagrams are
//! [`swimlb_proto::heartbeat`]'s, sealed in the gossip envelope.
//!
//! **The rates.** An owner sends one heartbeat stream per watcher. It starts slow
//! ([`SLOW_INTERVAL`], 1 s; its first [`ESTABLISH_BURST`] beats go out at the fast interval,
//! still promising the slow one, so that one lost beat or acknowledgement does not leave a new
//! owner unwatched for a second) and goes fast (the knobs' interval `I`, 20 ms by default) once the
//! watch is established: when the watcher acknowledges a heartbeat. The watcher acknowledges the
//! first heartbeat it hears of an incarnation ([`ESTABLISH_BEATS`] = 1) and then at most once per
//! [`ACK_PERIOD`]; the owner falls back to slow after [`ACK_LINGER`] without an acknowledgement.
//! One heard beat is enough: the acknowledgement proves the path both ways, as BFD's three-way
//! handshake does, and waiting for more would only delay the fast rate after a failover, when
//! the new owner's watch matters most. Every heartbeat carries the interval its sender promises
//! until the next one, and the watcher measures silence at that rate, so a change of rate in
//! either direction (an acknowledgement lost, a watcher restarted) never looks like silence.
//!
//! **No drift, one grid.** An owner's beats to all its watchers are due on one [`Grid`]:
//! tick `k` at `origin + k * interval + jitter_k`, with `jitter_k` drawn from 0 to 25 % of the
//! interval once per tick, so one wake-up sends every beat due ([`schedule`]). A fast schedule
//! beats on every tick, a slow one every second's worth of ticks. A late wake-up sends one beat
//! (its lateness reported for the histogram) and skips the ticks already past; it moves no later
//! beat.
//!
//! **Silence.** The watcher declares the owner silent when nothing fresh arrived for
//! [`window`]`(interval, M)` = `M * interval` plus a quarter interval of jitter plus a quarter
//! interval of delivery slack, measured from the last fresh heartbeat. So `M` consecutive lost
//! heartbeats are needed, `M - 1` never suffice, whatever the jitter. A heartbeat of an older
//! incarnation, or one whose sequence number does not increase, changes nothing. Before it
//! counts a gap the detector checks its own timer: one that fired more than half an interval
//! late says the watcher itself was not running, so the gap may be its own fault; it accuses no
//! one and gives the owner a full window from the late wake-up (Lifeguard's local health,
//! applied to the watch). A [`Verdict::Silent`] is only a suspicion: the caller runs the quick
//! second check (polls, [`swimlb_proto::heartbeat::WatchMessage::Poll`]) before it acts.

pub mod accusations;
pub mod core;
pub mod metrics;
pub mod schedule;
pub mod service;

#[cfg(test)]
mod core_tests;

pub use self::core::{Command, Event, Plan, WatchCore};
pub use metrics::{CheckResult, DropReason, TakeoverResult, WatchMetrics};
pub use schedule::{Beat, Grid, Rate, Schedule};
pub use service::{WatchEvents, WatchHandle};

use crate::model::watch_knobs::{Knobs, MIN_INTERVAL, SLOW_INTERVAL};

use std::time::Duration;

/// Heartbeats of one incarnation a watcher hears before it acknowledges (see the module docs).
pub const ESTABLISH_BEATS: u32 = 1;
/// Beats a new schedule sends at the fast interval before it settles at the slow rate, each
/// promising the slow interval: a lost first beat or acknowledgement then costs an interval, not
/// a second (at 10 % loss per path five rounds all fail 0.03 % of the time). It matters most
/// right after a failover, when the new owner's watch starts.
pub const ESTABLISH_BURST: u32 = 5;
/// How often a watcher acknowledges at most, once established.
pub const ACK_PERIOD: Duration = Duration::from_secs(1);
/// An owner sends fast for this long after the last acknowledgement, then slow again.
pub const ACK_LINGER: Duration = Duration::from_secs(5);

/// The largest jitter of a beat at `interval`: a quarter of it.
pub fn max_jitter(interval: Duration) -> Duration {
    interval / 4
}

/// How long a watcher waits from the last fresh heartbeat before it declares the owner silent:
/// `misses * interval` + [`max_jitter`] + a quarter interval of slack for delivery.
pub fn window(interval: Duration, misses: u32) -> Duration {
    interval * misses + max_jitter(interval) + interval / 4
}

/// The worst-case time from an owner's crash to [`Verdict::Silent`] at its watcher, with the
/// watch established and the watcher's timer on time: the owner dies right after a heartbeat,
/// and the watcher waits one [`window`]. (A watcher timer late by up to half an interval adds its
/// lateness; the second check and the takeover come after.)
pub fn worst_case_detection(knobs: &Knobs) -> Duration {
    window(knobs.interval, knobs.misses)
}

/// The loss of a path from one node to another when each node's link loses `link_loss` (0 to
/// 1) independently: `1 - (1 - l)^2` (5 % per link is about 10 % per path).
pub fn path_loss(link_loss: f64) -> f64 {
    1.0 - (1.0 - link_loss).powi(2)
}

/// Expected silences declared per hour per watched pair when the owner is alive and the path
/// loses each datagram independently with probability `path_loss`: a silence needs `M`
/// consecutive heartbeats lost, and each heartbeat starts such a run, so about
/// `beats per hour * p^M` (an upper bound: the exact rate has a factor `1 - p` more). Each is
/// only a suspicion: the second check ([`second_check_miss`]) must fail too before a takeover.
pub fn false_suspicions_per_hour(knobs: &Knobs, path_loss: f64) -> f64 {
    if !knobs.enabled {
        return 0.0;
    }
    let beats_per_hour = 3600.0 / knobs.interval.as_secs_f64();
    beats_per_hour * path_loss.powi(knobs.misses as i32)
}

/// The chance that the quick second check misses a live owner at `path_loss` per path: in each
/// of its [`core::CHECK_ROUNDS`] rounds the direct poll fails (poll or reply lost: two paths)
/// and the relayed one fails too (four paths).
pub fn second_check_miss(path_loss: f64) -> f64 {
    let through = |paths: i32| 1.0 - (1.0 - path_loss).powi(paths);
    (through(2) * through(4)).powi(self::core::CHECK_ROUNDS as i32)
}

/// Expected false takeovers per hour per watched pair at `path_loss`: a silence
/// ([`false_suspicions_per_hour`]) that the second check misses too ([`second_check_miss`]).
/// Each is refuted (the owner answers the claim) and undone within milliseconds.
pub fn false_takeovers_per_hour(knobs: &Knobs, path_loss: f64) -> f64 {
    false_suspicions_per_hour(knobs, path_loss) * second_check_miss(path_loss)
}

/// Datagrams per second on one watched pair, both directions, once established: heartbeats at
/// `1 / I` one way, acknowledgements at `1 / ACK_PERIOD` back. Zero when the watch is off.
pub fn packets_per_second_per_pair(knobs: &Knobs) -> f64 {
    if !knobs.enabled {
        return 0.0;
    }
    1.0 / knobs.interval.as_secs_f64() + 1.0 / ACK_PERIOD.as_secs_f64()
}

/// What a received heartbeat did to a [`Detector`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard {
    /// Fresh: the silence window restarts. `ack`: acknowledge it now
    /// ([`swimlb_proto::heartbeat::WatchMessage::Ack`] with its incarnation and seq).
    Fresh {
        /// Send an acknowledgement.
        ack: bool,
    },
    /// From an older incarnation than the one watched: ignored.
    StaleIncarnation,
    /// Its sequence number is not above the last fresh one (reordered): ignored.
    OldSeq,
}

impl Heard {
    /// A short, stable, lowercase name for logs and metric labels.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Heard::Fresh { .. } => "fresh",
            Heard::StaleIncarnation => "stale_incarnation",
            Heard::OldSeq => "old_seq",
        }
    }
}

/// A [`Detector`]'s answer to a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to say: the owner is within its window, or was already declared silent.
    Fine,
    /// No fresh heartbeat yet: nothing to measure from (gossip alone detects meanwhile).
    NotArmed,
    /// The watcher's own timer fired `lateness` late (more than half an interval): no one is
    /// accused, and the owner gets a full window from now.
    Late {
        /// How late the timer fired.
        lateness: Duration,
    },
    /// No fresh heartbeat for a whole window: run the second check. Said once per silence.
    Silent {
        /// When the last fresh heartbeat arrived.
        since: Duration,
        /// The incarnation found silent (the claim's accused incarnation).
        incarnation: u64,
    },
}

impl Verdict {
    /// A short, stable, lowercase name for logs and metric labels.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Verdict::Fine => "fine",
            Verdict::NotArmed => "not_armed",
            Verdict::Late { .. } => "late",
            Verdict::Silent { .. } => "silent",
        }
    }
}

/// A watcher's view of one owner (see the module docs).
#[derive(Debug, Clone)]
pub struct Detector {
    misses: u32,
    incarnation: u64,
    last_seq: Option<u64>,
    /// When the last fresh heartbeat arrived.
    last_heard: Option<Duration>,
    /// Where the current window starts: the last fresh heartbeat, a late wake-up, or a vouch.
    measured_from: Option<Duration>,
    /// The interval the owner last promised.
    promised: Duration,
    heard: u32,
    last_ack: Option<Duration>,
    accused: bool,
}

impl Detector {
    /// A detector for an owner the gossip knows as `incarnation` (its identity bump).
    pub fn new(knobs: &Knobs, incarnation: u64) -> Detector {
        Detector {
            misses: knobs.misses.max(1),
            incarnation,
            last_seq: None,
            last_heard: None,
            measured_from: None,
            promised: SLOW_INTERVAL,
            heard: 0,
            last_ack: None,
            accused: false,
        }
    }

    /// The incarnation watched: the one given, or a newer one heard since.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The interval the owner last promised.
    pub fn promised(&self) -> Duration {
        self.promised
    }

    /// A heartbeat (authentic and admitted by the replay guard) arrived at `now`. A newer
    /// incarnation than the watched one is adopted (the owner restarted or renewed its
    /// identity, and is alive); an older one, or a sequence number that does not increase,
    /// changes nothing. `interval` is the heartbeat's promise, taken as at least
    /// [`MIN_INTERVAL`].
    pub fn heard(
        &mut self,
        now: Duration,
        incarnation: u64,
        seq: u64,
        interval: Duration,
    ) -> Heard {
        if incarnation < self.incarnation {
            return Heard::StaleIncarnation;
        }
        if incarnation > self.incarnation {
            self.incarnation = incarnation;
            self.last_seq = None;
            self.heard = 0;
            self.last_ack = None;
        }
        if self.last_seq.is_some_and(|last| seq <= last) {
            return Heard::OldSeq;
        }
        self.last_seq = Some(seq);
        self.last_heard = Some(now);
        self.measured_from = Some(now);
        self.promised = interval.max(MIN_INTERVAL);
        self.accused = false;
        self.heard = self.heard.saturating_add(1);
        let ack = self.heard >= ESTABLISH_BEATS
            && self
                .last_ack
                .is_none_or(|acked| now.saturating_sub(acked) >= ACK_PERIOD);
        if ack {
            self.last_ack = Some(now);
        }
        Heard::Fresh { ack }
    }

    /// The second check found the owner alive at `now` (a poll answered): the window restarts
    /// from `now`, as after a heartbeat, without touching the sequence.
    pub fn vouched(&mut self, now: Duration) {
        if self.measured_from.is_some() {
            self.measured_from = Some(now);
            self.accused = false;
        }
    }

    /// Whether the owner was found silent ([`Verdict::Silent`]) and not heard or vouched for
    /// since.
    pub fn is_silent(&self) -> bool {
        self.accused
    }

    /// When the owner would be declared silent: the caller's next tick. `None` before the first
    /// fresh heartbeat, and after [`Verdict::Silent`] until a heartbeat or a vouch.
    pub fn deadline(&self) -> Option<Duration> {
        if self.accused {
            return None;
        }
        self.measured_from
            .map(|from| from.saturating_add(window(self.promised, self.misses)))
    }

    /// The watcher's timer, set for `scheduled_at`, fired at `now`. A timer more than half an
    /// interval late gives [`Verdict::Late`] and restarts the window from `now`; otherwise the
    /// owner is [`Verdict::Silent`] when `now` is past [`Detector::deadline`].
    pub fn tick(&mut self, now: Duration, scheduled_at: Duration) -> Verdict {
        let (Some(since), Some(_)) = (self.last_heard, self.measured_from) else {
            return Verdict::NotArmed;
        };
        if self.accused {
            return Verdict::Fine;
        }
        let lateness = now.saturating_sub(scheduled_at);
        if lateness > self.promised / 2 {
            self.measured_from = Some(now);
            return Verdict::Late { lateness };
        }
        match self.deadline() {
            Some(deadline) if now > deadline => {
                self.accused = true;
                Verdict::Silent {
                    since,
                    incarnation: self.incarnation,
                }
            }
            _ => Verdict::Fine,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::watch_knobs::{DEFAULT_INTERVAL, DEFAULT_MISSES, KnobsError, MIN_MISSES};

    const MS: Duration = Duration::from_millis(1);
    const I: Duration = DEFAULT_INTERVAL;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A detector that heard one fast heartbeat (seq 1) at `at`.
    fn armed_at(at: Duration) -> Detector {
        let mut d = Detector::new(&Knobs::default(), 7);
        assert_eq!(d.heard(at, 7, 1, I), Heard::Fresh { ack: true });
        d
    }

    #[test]
    fn default_knobs_are_valid_and_give_the_documented_model() {
        let k = Knobs::default();
        assert_eq!(k.validate(), Ok(()));
        assert_eq!(worst_case_detection(&k), ms(110));
        assert_eq!(packets_per_second_per_pair(&k), 51.0);
        // 10 % per path (5 % per link), M = 5: 180,000 beats an hour * 1e-5.
        assert!((path_loss(0.05) - 0.0975).abs() < 1e-12);
        assert!((false_suspicions_per_hour(&k, 0.1) - 1.8).abs() < 1e-9);
        // A suspicion becomes a false takeover only if the second check misses too: two rounds
        // at 10 % per path, 0.4 %.
        assert!((second_check_miss(0.1) - 0.00426).abs() < 1e-4);
        assert!(false_takeovers_per_hour(&k, 0.1) < 0.01);
        let off = Knobs {
            enabled: false,
            ..k
        };
        assert_eq!(packets_per_second_per_pair(&off), 0.0);
        assert_eq!(false_suspicions_per_hour(&off, 0.1), 0.0);
    }

    #[test]
    fn invalid_knobs_are_all_reported_at_once() {
        let k = Knobs {
            interval: ms(9),
            misses: 2,
            enabled: false,
        };
        assert_eq!(
            k.validate(),
            Err(vec![
                KnobsError::IntervalTooShort(ms(9)),
                KnobsError::TooFewMisses(2)
            ])
        );
        let slow = Knobs {
            interval: ms(1001),
            ..Knobs::default()
        };
        assert_eq!(
            slow.validate(),
            Err(vec![KnobsError::IntervalTooLong(ms(1001))])
        );
        let edge = Knobs {
            interval: MIN_INTERVAL,
            misses: MIN_MISSES,
            enabled: true,
        };
        assert_eq!(edge.validate(), Ok(()));
        assert_eq!(
            KnobsError::TooFewMisses(2).to_string(),
            "owner watch misses 2 is fewer than the minimum of 3"
        );
    }

    #[test]
    fn silence_is_declared_just_past_the_window_and_once() {
        let t = ms(1_000);
        let mut d = armed_at(t);
        let deadline = t + window(I, DEFAULT_MISSES);
        assert_eq!(deadline, t + ms(110));
        assert_eq!(d.deadline(), Some(deadline));
        assert_eq!(d.tick(deadline, deadline), Verdict::Fine);
        let just_past = deadline + Duration::from_micros(1);
        assert_eq!(
            d.tick(just_past, deadline),
            Verdict::Silent {
                since: t,
                incarnation: 7
            }
        );
        assert_eq!(d.deadline(), None);
        assert_eq!(d.tick(just_past + MS, deadline), Verdict::Fine);
        // The second check found it alive: a new window from then.
        d.vouched(just_past + MS);
        assert_eq!(d.deadline(), Some(just_past + MS + ms(110)));
    }

    #[test]
    fn m_minus_one_missed_beats_never_accuse_whatever_the_jitter() {
        for seed in 0..10 {
            let mut s = Schedule::new(Duration::ZERO, &Knobs::default(), seed);
            s.acknowledged(Duration::ZERO);
            let mut d = Detector::new(&Knobs::default(), 1);
            let mut now = Duration::ZERO;
            let mut sent = 0u64;
            while now < ms(20_000) {
                if let Some(beat) = s.poll(now) {
                    sent += 1;
                    if sent.is_multiple_of(50) {
                        s.acknowledged(now);
                    }
                    // Lose M - 1 of every M beats.
                    if sent.is_multiple_of(u64::from(DEFAULT_MISSES)) {
                        d.heard(now, 1, beat.seq, beat.interval);
                    }
                }
                // The watcher ticks every 100 us, on time.
                assert_ne!(
                    d.tick(now, now).as_str(),
                    "silent",
                    "seed {seed} at {now:?}"
                );
                now += Duration::from_micros(100);
            }
        }
    }

    #[test]
    fn m_missed_beats_accuse_within_the_worst_case() {
        let mut s = Schedule::new(Duration::ZERO, &Knobs::default(), 5);
        s.acknowledged(Duration::ZERO);
        let mut d = Detector::new(&Knobs::default(), 1);
        let mut now = Duration::ZERO;
        let crash = ms(2_000);
        let step = Duration::from_micros(100);
        let mut last_sent = Duration::ZERO;
        loop {
            if now < crash
                && let Some(beat) = s.poll(now)
            {
                d.heard(now, 1, beat.seq, beat.interval);
                last_sent = now;
            }
            if let Verdict::Silent { since, .. } = d.tick(now, now) {
                assert_eq!(since, last_sent);
                // Within one tick of the window after the last heartbeat, so within the worst
                // case after the crash.
                assert!(now - last_sent <= worst_case_detection(&Knobs::default()) + step);
                assert!(now - crash <= worst_case_detection(&Knobs::default()) + step);
                break;
            }
            now += step;
            assert!(now < ms(3_000), "never declared silent");
        }
    }

    #[test]
    fn a_late_timer_never_accuses_and_gives_a_full_window_from_its_wake_up() {
        let t = ms(1_000);
        let mut d = armed_at(t);
        let deadline = d.deadline().unwrap();
        // The watcher was descheduled: its timer fires 2 s late, long past the window.
        let woke = deadline + ms(2_000);
        assert_eq!(
            d.tick(woke, deadline),
            Verdict::Late {
                lateness: ms(2_000)
            }
        );
        // A fresh window from the wake-up: fine within it ...
        let next = d.deadline().unwrap();
        assert_eq!(next, woke + ms(110));
        assert_eq!(d.tick(next, next), Verdict::Fine);
        // ... and a heartbeat arriving in it keeps the owner.
        assert_eq!(d.heard(woke + ms(5), 7, 2, I), Heard::Fresh { ack: true });
        assert_eq!(d.tick(next + MS, next + MS), Verdict::Fine);
        // Half an interval late is still the watcher's own timer on time.
        let mut d = armed_at(t);
        let deadline = d.deadline().unwrap();
        assert_eq!(
            d.tick(deadline + I / 2, deadline),
            Verdict::Silent {
                since: t,
                incarnation: 7
            }
        );
        // Every lateness above half an interval is excused, however often.
        let mut d = armed_at(t);
        let mut at = d.deadline().unwrap();
        for _ in 0..100 {
            let woke = at + I / 2 + Duration::from_micros(1);
            assert_eq!(d.tick(woke, at).as_str(), "late");
            at = d.deadline().unwrap();
        }
    }

    #[test]
    fn stale_incarnations_and_old_sequence_numbers_do_not_reset_the_window() {
        let t = ms(1_000);
        let mut d = armed_at(t);
        assert_eq!(d.heard(t + ms(5), 7, 5, I), Heard::Fresh { ack: false });
        let deadline = d.deadline().unwrap();
        assert_eq!(d.heard(t + ms(50), 6, 100, I), Heard::StaleIncarnation);
        assert_eq!(d.heard(t + ms(60), 7, 5, I), Heard::OldSeq);
        assert_eq!(d.heard(t + ms(70), 7, 3, I), Heard::OldSeq);
        assert_eq!(d.deadline(), Some(deadline));
        assert_eq!(d.tick(deadline + MS, deadline + MS).as_str(), "silent");
    }

    #[test]
    fn a_newer_incarnation_is_adopted_and_acknowledged() {
        let t = ms(1_000);
        let mut d = armed_at(t);
        assert_eq!(d.heard(t + ms(10), 8, 1, I), Heard::Fresh { ack: true });
        assert_eq!(d.incarnation(), 8);
        assert_eq!(d.heard(t + ms(20), 7, 99, I), Heard::StaleIncarnation);
    }

    #[test]
    fn acknowledgements_go_out_on_the_first_beat_and_then_once_a_period() {
        let mut d = Detector::new(&Knobs::default(), 1);
        let acks: Vec<u64> = (1..=120u64)
            .filter(|&seq| {
                let at = I * seq as u32;
                d.heard(at, 1, seq, I) == Heard::Fresh { ack: true }
            })
            .collect();
        assert_eq!(acks, vec![1, 51, 101]);
    }

    #[test]
    fn silence_is_measured_at_the_rate_the_owner_promised() {
        let t = ms(1_000);
        let mut d = Detector::new(&Knobs::default(), 1);
        assert_eq!(d.tick(t, t), Verdict::NotArmed);
        assert_eq!(d.deadline(), None);
        d.heard(t, 1, 1, SLOW_INTERVAL);
        assert_eq!(d.deadline(), Some(t + window(SLOW_INTERVAL, 5)));
        assert_eq!(d.tick(t + ms(200), t + ms(200)), Verdict::Fine);
        // A promise shorter than the minimum is taken as the minimum.
        d.heard(t + ms(300), 1, 2, Duration::from_micros(10));
        assert_eq!(d.promised(), MIN_INTERVAL);
    }
}
