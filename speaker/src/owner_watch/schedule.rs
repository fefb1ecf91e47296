//! When an owner sends its heartbeats: one [`Grid`] per owner, shared by the [`Schedule`] of
//! each of its watchers, so that one wake-up sends every heartbeat due (see the parent module's
//! docs for the rates).
//!
//! **One grid.** Tick `k` of an owner's grid is due at `origin + k * I + jitter_k`, `jitter_k`
//! drawn from 0 to [`max_jitter`]`(I)` once per tick, the same for every watcher. A fast
//! schedule sends on every tick, a slow one on every `SLOW_INTERVAL / I`-th (and its
//! establishing burst on every tick). Each watcher still sees its beats on a grid with a jitter
//! of at most a quarter interval, so the silence window ([`super::window`]) holds as before; the
//! jitter keeps owners apart from each other, which is what it is for (an owner's watchers are
//! different receivers). Before, each watcher had its own grid and jitter, and an owner of three
//! watchers woke three times an interval.

use std::time::Duration;

use super::{ACK_LINGER, ESTABLISH_BURST, max_jitter};
use crate::model::watch_knobs::{Knobs, MIN_INTERVAL, SLOW_INTERVAL};

/// The rate an owner's [`Schedule`] sends at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rate {
    /// [`SLOW_INTERVAL`]: not established.
    Slow,
    /// The knobs' interval: a watcher acknowledged within [`ACK_LINGER`].
    Fast,
}

impl Rate {
    /// A short, stable, lowercase name for logs and metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            Rate::Slow => "slow",
            Rate::Fast => "fast",
        }
    }
}

/// One heartbeat to send now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beat {
    /// Its sequence number: one more than the previous beat of this schedule.
    pub seq: u64,
    /// When it was due.
    pub scheduled_at: Duration,
    /// How late the caller woke for it (`now - scheduled_at`), for the lateness histogram.
    pub lateness: Duration,
    /// The interval it promises until the next beat (the heartbeat's `interval_ms`).
    pub interval: Duration,
}

impl Beat {
    /// [`Beat::interval`] in whole milliseconds, as the heartbeat carries it (at least 1).
    pub fn interval_ms(&self) -> u16 {
        u16::try_from(self.interval.as_millis())
            .unwrap_or(u16::MAX)
            .max(1)
    }
}

/// An owner's heartbeat ticks (see the module docs). Copied into each of its schedules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    origin: Duration,
    interval: Duration,
    seed: u64,
}

impl Grid {
    /// The grid of the knobs' interval (at least [`MIN_INTERVAL`]) whose tick 0 is at `origin`;
    /// `seed` draws the jitter.
    pub fn new(origin: Duration, knobs: &Knobs, seed: u64) -> Grid {
        Grid {
            origin,
            interval: knobs.interval.max(MIN_INTERVAL),
            seed,
        }
    }

    /// Its interval: the fast rate's.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// When tick `k` is due: its slot plus its jitter.
    pub fn at(&self, k: u64) -> Duration {
        self.slot(k).saturating_add(self.jitter(k))
    }

    /// The first tick due at or after `now`.
    pub fn next(&self, now: Duration) -> u64 {
        let k = self.slots_passed(now);
        if self.at(k) >= now { k } else { k + 1 }
    }

    /// Tick `k`'s slot, without its jitter.
    fn slot(&self, k: u64) -> Duration {
        let nanos = self.interval.as_nanos().saturating_mul(u128::from(k));
        let offset = u64::try_from(nanos).map_or(Duration::MAX, Duration::from_nanos);
        self.origin.saturating_add(offset)
    }

    /// The tick whose slot is the last at or before `now` (0 before the origin).
    fn slots_passed(&self, now: Duration) -> u64 {
        let passed = now.saturating_sub(self.origin).as_nanos() / self.interval.as_nanos();
        u64::try_from(passed).unwrap_or(u64::MAX / 2)
    }

    /// Tick `k`'s jitter, from 0 to a quarter interval: drawn from the seed and the tick, so
    /// every schedule of the grid sees the same.
    fn jitter(&self, k: u64) -> Duration {
        let max = u64::try_from(max_jitter(self.interval).as_nanos()).unwrap_or(u64::MAX - 1);
        Duration::from_nanos(splitmix64(self.seed ^ splitmix64(k)) % (max + 1))
    }
}

/// SplitMix64's output function: a well-mixed 64-bit value of `x`.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// When an owner sends its heartbeats to one watcher, on the owner's [`Grid`] (see the module
/// docs).
#[derive(Debug)]
pub struct Schedule {
    grid: Grid,
    rate: Rate,
    /// Grid tick of the next beat.
    tick: u64,
    /// When the next beat is due: its tick's time.
    next_at: Duration,
    next_seq: u64,
    last_ack: Option<Duration>,
    /// Beats of the establishing burst still to send ([`ESTABLISH_BURST`]).
    burst_left: u32,
}

impl Schedule {
    /// A slow schedule on a grid of its own whose tick 0 is at `origin`; `knobs` should be
    /// valid; `seed` draws the jitter. An owner's schedules share one grid: [`Schedule::on`].
    pub fn new(origin: Duration, knobs: &Knobs, seed: u64) -> Schedule {
        Schedule::on(Grid::new(origin, knobs, seed), origin)
    }

    /// A slow schedule on `grid` started at `now`: its first beat is due on the first tick at
    /// or after `now`.
    pub fn on(grid: Grid, now: Duration) -> Schedule {
        let tick = grid.next(now);
        Schedule {
            grid,
            rate: Rate::Slow,
            tick,
            next_at: grid.at(tick),
            next_seq: 1,
            last_ack: None,
            burst_left: ESTABLISH_BURST,
        }
    }

    /// The current rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// The interval between beats now: the fast one while established or in the establishing
    /// burst, else the slow one.
    pub fn interval(&self) -> Duration {
        self.grid.interval * u32::try_from(self.step()).unwrap_or(u32::MAX)
    }

    /// Ticks between two beats now: 1 while established or in the establishing burst, else
    /// those of the slow interval (at least 1).
    fn step(&self) -> u64 {
        match self.rate {
            Rate::Slow if self.burst_left == 0 => {
                let ticks = SLOW_INTERVAL.as_nanos() / self.grid.interval.as_nanos();
                u64::try_from(ticks).unwrap_or(u64::MAX).max(1)
            }
            Rate::Slow | Rate::Fast => 1,
        }
    }

    /// What a beat promises: the current rate's interval (the slow one during the burst too,
    /// so a watcher never measures silence at a rate the owner has not settled at).
    fn promise(&self) -> Duration {
        match self.rate {
            Rate::Slow => SLOW_INTERVAL,
            Rate::Fast => self.grid.interval,
        }
    }

    /// When the next beat is due: the caller's next wake-up.
    pub fn next_at(&self) -> Duration {
        self.next_at
    }

    /// The beat to send at `now`, if one is due. Skips the ticks a late wake-up missed (one beat,
    /// never a burst); later beats stay on their grid. A fast schedule with no acknowledgement
    /// for [`ACK_LINGER`] turns slow here: the beat returned already promises the slow interval.
    pub fn poll(&mut self, now: Duration) -> Option<Beat> {
        if now < self.next_at {
            return None;
        }
        let scheduled_at = self.next_at;
        let lingered = self
            .last_ack
            .is_none_or(|acked| now.saturating_sub(acked) > ACK_LINGER);
        if self.rate == Rate::Fast && lingered {
            // The next beat is a slow interval after this one.
            self.rate = Rate::Slow;
        }
        let beat = Beat {
            seq: self.next_seq,
            scheduled_at,
            lateness: now - scheduled_at,
            interval: self.promise(),
        };
        self.next_seq += 1;
        if self.rate == Rate::Slow && self.burst_left > 0 {
            // The last beat of the burst starts the slow steps.
            self.burst_left -= 1;
        }
        let step = self.step();
        // The first tick whose slot is past `now`: the ticks before it were missed.
        let first = self.grid.slots_passed(now).saturating_add(1);
        let mut tick = self.tick.saturating_add(step);
        if tick < first {
            tick = tick.saturating_add((first - tick).div_ceil(step).saturating_mul(step));
        }
        self.tick = tick;
        self.next_at = self.grid.at(tick);
        Some(beat)
    }

    /// The watcher acknowledged a heartbeat at `now`: the watch is established. A slow schedule
    /// goes fast at once, its first fast beat due on the grid's first tick at or after `now`.
    pub fn acknowledged(&mut self, now: Duration) {
        self.last_ack = Some(now);
        self.burst_left = 0;
        if self.rate == Rate::Slow {
            self.rate = Rate::Fast;
            self.tick = self.grid.next(now);
            self.next_at = self.grid.at(self.tick);
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};

    use super::*;
    use crate::model::watch_knobs::DEFAULT_INTERVAL;

    const MS: Duration = Duration::from_millis(1);
    const I: Duration = DEFAULT_INTERVAL;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_schedule_sends_slowly_until_a_watcher_acknowledges() {
        let origin = ms(5_000);
        let mut s = Schedule::new(origin, &Knobs::default(), 1);
        assert_eq!(s.rate(), Rate::Slow);
        let mut beats = Vec::new();
        let mut now = origin;
        while now < origin + ms(3_500) {
            if let Some(beat) = s.poll(now) {
                beats.push(beat);
            }
            now += MS;
        }
        // The establishing burst on the grid's ticks, then one beat a second from its last
        // beat's tick; every beat promises the slow interval.
        let burst = ESTABLISH_BURST as usize;
        assert_eq!(beats.len(), burst + 3, "{beats:?}");
        for (k, beat) in beats.iter().enumerate() {
            let slot = if k < burst {
                origin + I * k as u32
            } else {
                origin + I * (burst as u32 - 1) + SLOW_INTERVAL * (k + 1 - burst) as u32
            };
            assert!(
                beat.scheduled_at >= slot && beat.scheduled_at <= slot + I / 4,
                "beat {k}: {beat:?}"
            );
            assert_eq!(beat.interval, SLOW_INTERVAL);
            assert_eq!(beat.interval_ms(), 1000);
            assert_eq!(beat.seq, k as u64 + 1);
        }
        s.acknowledged(now);
        assert_eq!(s.rate(), Rate::Fast);
        assert!(s.next_at() >= now && s.next_at() <= now + I + I / 4);
        let beat = s.poll(s.next_at()).unwrap();
        assert_eq!(
            (beat.interval_ms(), beat.seq),
            (20, ESTABLISH_BURST as u64 + 4)
        );
    }

    #[test]
    fn a_schedule_without_acknowledgements_falls_back_to_slow_and_says_so_first() {
        let mut s = Schedule::new(Duration::ZERO, &Knobs::default(), 2);
        s.acknowledged(Duration::ZERO);
        let mut now = Duration::ZERO;
        let mut last_fast = None;
        let switch = loop {
            if let Some(beat) = s.poll(now) {
                if beat.interval == SLOW_INTERVAL {
                    break beat;
                }
                last_fast = Some(beat);
            }
            now += MS;
        };
        // The switch comes with the first beat after the linger, on the fast grid ...
        assert!(switch.scheduled_at > ACK_LINGER);
        assert!(switch.scheduled_at - last_fast.unwrap().scheduled_at <= I + I / 4);
        // ... and the next beat is a slow interval after its tick (each with its jitter).
        assert_eq!(s.rate(), Rate::Slow);
        let gap = s.next_at() - switch.scheduled_at;
        assert!(
            gap >= SLOW_INTERVAL - I / 4 && gap <= SLOW_INTERVAL + I / 4,
            "{gap:?}"
        );
    }

    #[test]
    fn ten_thousand_fast_beats_stay_on_their_grid_with_jitter_within_a_quarter() {
        let mut s = Schedule::new(Duration::ZERO, &Knobs::default(), 3);
        let origin = ms(700);
        s.acknowledged(origin);
        let mut rng = StdRng::seed_from_u64(99);
        let (mut min_jitter, mut max_jitter_seen) = (Duration::MAX, Duration::ZERO);
        for k in 0..10_000u32 {
            // Wake up late by up to half an interval, acknowledge every second.
            let now = s.next_at() + Duration::from_micros(rng.random_range(0..10_000));
            if k % 50 == 0 {
                s.acknowledged(now);
            }
            let beat = s.poll(now).expect("due");
            let slot = origin + I * k;
            assert!(beat.scheduled_at >= slot, "beat {k} early");
            let jitter = beat.scheduled_at - slot;
            assert!(jitter <= I / 4, "beat {k}: jitter {jitter:?}");
            assert_eq!(beat.seq, u64::from(k) + 1);
            assert_eq!(beat.interval, I);
            min_jitter = min_jitter.min(jitter);
            max_jitter_seen = max_jitter_seen.max(jitter);
        }
        // The jitter spans its range (it is drawn, not constant).
        assert!(min_jitter < ms(1) && max_jitter_seen > ms(4));
    }

    #[test]
    fn a_late_wake_up_sends_one_beat_and_moves_no_later_beat() {
        let mut s = Schedule::new(Duration::ZERO, &Knobs::default(), 4);
        s.acknowledged(Duration::ZERO);
        let first = s.poll(s.next_at()).unwrap();
        // Asleep for 3.5 intervals past the second beat's time.
        let late = s.next_at() + I * 3 + I / 2;
        let beat = s.poll(late).unwrap();
        assert_eq!(beat.seq, first.seq + 1);
        assert_eq!(beat.lateness, late - beat.scheduled_at);
        assert_eq!(s.poll(late), None, "no burst");
        // The next beat is in slot 5 of the grid, not 3.5 intervals later than planned.
        let next = s.next_at();
        assert!(next >= I * 5 && next <= I * 5 + I / 4, "{next:?}");
    }

    #[test]
    fn a_late_slow_schedule_keeps_its_step() {
        let mut s = Schedule::new(Duration::ZERO, &Knobs::default(), 6);
        for _ in 0..ESTABLISH_BURST {
            s.poll(s.next_at()).unwrap();
        }
        // The burst's last tick was 4; the next slow beat is on tick 54. Asleep until 2.5 s.
        assert!(s.next_at() >= I * 54 && s.next_at() <= I * 54 + I / 4);
        let beat = s.poll(ms(2_500)).unwrap();
        assert_eq!(beat.interval, SLOW_INTERVAL);
        // Ticks 104 (2.08 s) was missed: the next is 154, a slow step on, not right away.
        let next = s.next_at();
        assert!(next >= I * 154 && next <= I * 154 + I / 4, "{next:?}");
    }

    #[test]
    fn schedules_on_one_grid_started_apart_beat_on_the_same_ticks() {
        let grid = Grid::new(ms(3), &Knobs::default(), 7);
        let mut schedules = [
            Schedule::on(grid, ms(3)),
            Schedule::on(grid, ms(41)),
            Schedule::on(grid, ms(117)),
        ];
        for (s, at) in schedules.iter_mut().zip([ms(10), ms(50), ms(130)]) {
            s.acknowledged(at);
        }
        // Once the last one is fast (from 130 ms), all are due on the same ticks: one wake-up
        // sends the three beats.
        let mut together = 0;
        for _ in 0..200 {
            let now = schedules.iter().map(Schedule::next_at).min().unwrap();
            let sent = schedules.iter_mut().filter_map(|s| s.poll(now)).count();
            if now >= ms(150) {
                assert_eq!(sent, 3, "at {now:?}");
                together += 1;
            }
        }
        assert!(together >= 190, "{together}");
        // The ticks' jitter is drawn per tick: it differs between ticks, within a quarter.
        let jitters: Vec<Duration> = (0..50).map(|k| grid.at(k) - ms(3) - I * k as u32).collect();
        assert!(jitters.iter().all(|j| *j <= I / 4));
        assert!(jitters.iter().any(|j| *j != jitters[0]));
    }

    #[test]
    fn the_next_tick_is_never_before_now() {
        let grid = Grid::new(ms(1), &Knobs::default(), 8);
        for t in 0..10_000u64 {
            let now = Duration::from_micros(t * 37);
            let k = grid.next(now);
            assert!(grid.at(k) >= now, "{now:?}");
            assert!(
                k == 0 || grid.at(k - 1) < now,
                "{now:?}: tick {k} is not the first"
            );
        }
    }
}
