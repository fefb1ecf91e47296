//! When to start answering, stop answering and announce: a sans-IO state machine.
//!
//! The [`Announcer`] owns, for this node, the IPs it answers for and each IP's gratuitous
//! announcement schedule (gratuitous ARP in request form for IPv4, unsolicited neighbor
//! advertisements with Override set to ff02::1 for IPv6, RFC 4861 section 7.2.6). It reads no
//! clock (`now` is an argument), opens no socket and spawns nothing: every input returns the
//! [`Effect`]s the I/O layer carries out, in order, and [`Announcer::next_deadline`] says when
//! to call [`Announcer::tick`] next.
//!
//! Guarantees:
//!
//! - **Stopping is immediate.** [`Announcer::set_desired`] returns every `StopAnswering` first,
//!   before any `StartAnswering` or `Announce`, in the same call that removes the IP.
//! - **Start before announce.** An IP's `StartAnswering` comes before its first `Announce`.
//! - **keepalived's schedule by default** ([`Schedule::default`]): on takeover a burst of 5 sent
//!   at once (`garp_master_repeat`), a second burst of 5 after 5 s (`garp_master_delay`), no
//!   periodic refresh (`garp_master_refresh`). All of it is configurable.
//! - **Extra bursts, never storms.** [`Announcer::member_joined`] (a healed partition may have
//!   left stale caches) and [`Announcer::conflict`] (another MAC claimed one of our IPs) start a
//!   burst for the IPs concerned, unless a burst for that IP is already under way. An extra
//!   burst while the takeover's second burst is pending moves that second burst to
//!   `second_burst_after` past the extra one.
//! - **Bounded work.** A late [`Announcer::tick`] sends at most one burst per IP; whatever is
//!   still due stays due (`next_deadline` is then in the past).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use tokio::time::Instant;

/// The announcement schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// Announcements per burst (keepalived `garp_master_repeat`, 5). 0 disables announcing.
    pub burst: u32,
    /// Spacing inside a burst (keepalived sends them back to back: 0).
    pub burst_gap: Duration,
    /// Delay from the end of the first burst to the second (keepalived `garp_master_delay`,
    /// 5 s); `None`: no second burst.
    pub second_burst_after: Option<Duration>,
    /// Periodic refresh while owning (keepalived `garp_master_refresh`, off); `None`: off.
    pub refresh: Option<Duration>,
    /// Announcements per refresh (keepalived `garp_master_refresh_repeat`, 1).
    pub refresh_burst: u32,
}

impl Default for Schedule {
    fn default() -> Schedule {
        Schedule {
            burst: 5,
            burst_gap: Duration::ZERO,
            second_burst_after: Some(Duration::from_secs(5)),
            refresh: None,
            refresh_burst: 1,
        }
    }
}

/// What the I/O layer must do. Where (which links) is the caller's business: the announcer
/// only knows IPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Start answering ARP requests / neighbor solicitations for the IP.
    StartAnswering(IpAddr),
    /// Stop answering for the IP, now.
    StopAnswering(IpAddr),
    /// Send one gratuitous ARP (IPv4) or unsolicited neighbor advertisement (IPv6) for the IP.
    Announce(IpAddr),
}

impl Effect {
    /// A fixed label for logs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            Effect::StartAnswering(_) => "start_answering",
            Effect::StopAnswering(_) => "stop_answering",
            Effect::Announce(_) => "announce",
        }
    }
}

/// What an announced IP is waiting for after its current burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterBurst {
    /// The takeover's second burst is still to come.
    SecondBurst,
    /// Periodic refresh (or nothing, when refresh is off).
    Refresh,
}

/// One IP this node answers for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answering {
    /// Announcements left in the current burst.
    left_in_burst: u32,
    /// When the next announcement (or the next burst) is due; `None`: nothing scheduled.
    next: Option<Instant>,
    after_burst: AfterBurst,
}

/// The announcer of one speaker.
#[derive(Debug, Clone)]
pub struct Announcer {
    schedule: Schedule,
    answering: BTreeMap<IpAddr, Answering>,
}

impl Announcer {
    /// An announcer answering for nothing yet.
    pub fn new(schedule: Schedule) -> Announcer {
        Announcer {
            schedule,
            answering: BTreeMap::new(),
        }
    }

    /// The schedule in use.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The IPs answered for, in IP order.
    pub fn answering(&self) -> impl Iterator<Item = &IpAddr> {
        self.answering.keys()
    }

    /// Whether `ip` is answered for.
    pub fn is_answering(&self, ip: &IpAddr) -> bool {
        self.answering.contains_key(ip)
    }

    /// Sets the IPs this node should own. Returns, in order: `StopAnswering` for every IP no
    /// longer desired, then `StartAnswering` for every new one, then the announcements due at
    /// `now` (a new IP's first burst starts at `now`).
    pub fn set_desired(&mut self, now: Instant, desired: &BTreeSet<IpAddr>) -> Vec<Effect> {
        let mut effects = Vec::new();
        self.answering.retain(|ip, _| {
            let keep = desired.contains(ip);
            if !keep {
                effects.push(Effect::StopAnswering(*ip));
            }
            keep
        });
        for ip in desired {
            if self.own(now, *ip) {
                effects.push(Effect::StartAnswering(*ip));
            }
        }
        self.due(now, &mut effects);
        effects
    }

    /// Starts answering for `ip` with a takeover burst from `now` (sent by the next
    /// [`Announcer::tick`]). Returns false, changing nothing, when it is answered already.
    pub fn own(&mut self, now: Instant, ip: IpAddr) -> bool {
        if self.answering.contains_key(&ip) {
            return false;
        }
        let mut state = Answering {
            left_in_burst: 0,
            next: None,
            after_burst: AfterBurst::SecondBurst,
        };
        start_burst(&self.schedule, &mut state, now);
        self.answering.insert(ip, state);
        true
    }

    /// Stops answering for `ip`, forgetting its schedule. Returns whether it was answered.
    pub fn disown(&mut self, ip: &IpAddr) -> bool {
        self.answering.remove(ip).is_some()
    }

    /// Sends what is due at `now`.
    pub fn tick(&mut self, now: Instant) -> Vec<Effect> {
        let mut effects = Vec::new();
        self.due(now, &mut effects);
        effects
    }

    /// A member joined (possibly a healed partition): one extra burst for every IP not already
    /// in a burst. Returns the announcements due at `now`.
    pub fn member_joined(&mut self, now: Instant) -> Vec<Effect> {
        for state in self.answering.values_mut() {
            if state.left_in_burst == 0 {
                start_burst(&self.schedule, state, now);
            }
        }
        self.tick(now)
    }

    /// Another MAC was seen claiming `ip`: one extra burst for it, unless it is not ours or a
    /// burst is already under way. Returns the announcements due at `now`.
    pub fn conflict(&mut self, now: Instant, ip: IpAddr) -> Vec<Effect> {
        self.burst(now, ip);
        self.tick(now)
    }

    /// One extra burst for `ip` from `now`, unless it is not ours or a burst is under way (sent
    /// by the next [`Announcer::tick`]).
    pub fn burst(&mut self, now: Instant, ip: IpAddr) {
        if let Some(state) = self.answering.get_mut(&ip)
            && state.left_in_burst == 0
        {
            start_burst(&self.schedule, state, now);
        }
    }

    /// When [`Announcer::tick`] should be called next; `None`: nothing scheduled.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.answering.values().filter_map(|state| state.next).min()
    }

    fn due(&mut self, now: Instant, effects: &mut Vec<Effect>) {
        let schedule = &self.schedule;
        for (ip, state) in self.answering.iter_mut() {
            // Bounded: each pass either sends one announcement of a finite burst or moves
            // `next` past `now` / to `None`.
            let mut guard = schedule.burst.max(schedule.refresh_burst).saturating_add(2);
            while let Some(at) = state.next {
                if at > now || guard == 0 {
                    break;
                }
                guard -= 1;
                if state.left_in_burst == 0 {
                    // A burst is due (second burst or refresh).
                    state.left_in_burst = match state.after_burst {
                        AfterBurst::SecondBurst => schedule.burst,
                        AfterBurst::Refresh => schedule.refresh_burst,
                    };
                    if state.after_burst == AfterBurst::SecondBurst {
                        state.after_burst = AfterBurst::Refresh;
                    }
                    if state.left_in_burst == 0 {
                        state.next = None;
                        continue;
                    }
                }
                effects.push(Effect::Announce(*ip));
                state.left_in_burst -= 1;
                if state.left_in_burst > 0 {
                    state.next = Some(now + schedule.burst_gap);
                } else {
                    finish_burst(schedule, state, now);
                }
            }
        }
    }
}

/// Starts a burst for `state` at `now`.
fn start_burst(schedule: &Schedule, state: &mut Answering, now: Instant) {
    state.left_in_burst = schedule.burst;
    if schedule.burst == 0 {
        finish_burst(schedule, state, now);
    } else {
        state.next = Some(now);
    }
}

/// Schedules what follows a burst that ended at `now`: the second burst, a refresh, or nothing.
fn finish_burst(schedule: &Schedule, state: &mut Answering, now: Instant) {
    if state.after_burst == AfterBurst::SecondBurst {
        if let Some(delay) = schedule.second_burst_after {
            state.next = Some(now + delay);
            return;
        }
        state.after_burst = AfterBurst::Refresh;
    }
    state.next = schedule.refresh.map(|every| now + every);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn desired(entries: &[&str]) -> BTreeSet<IpAddr> {
        entries.iter().map(|a| ip(a)).collect()
    }

    fn start(a: &str) -> Effect {
        Effect::StartAnswering(ip(a))
    }

    fn stop(a: &str) -> Effect {
        Effect::StopAnswering(ip(a))
    }

    fn announce(a: &str) -> Effect {
        Effect::Announce(ip(a))
    }

    fn announces(a: &str, n: usize) -> Vec<Effect> {
        vec![announce(a); n]
    }

    #[test]
    fn takeover_announces_five_at_once_and_five_more_after_five_seconds() {
        let t0 = Instant::now();
        let mut announcer = Announcer::new(Schedule::default());
        let effects = announcer.set_desired(t0, &desired(&["192.0.2.1"]));
        let mut expected = vec![start("192.0.2.1")];
        expected.extend(announces("192.0.2.1", 5));
        assert_eq!(effects, expected);
        assert_eq!(announcer.next_deadline(), Some(t0 + ms(5000)));
        assert_eq!(announcer.tick(t0 + ms(4999)), vec![]);
        assert_eq!(announcer.tick(t0 + ms(5000)), announces("192.0.2.1", 5));
        assert_eq!(announcer.next_deadline(), None);
        assert_eq!(announcer.tick(t0 + ms(60_000)), vec![]);
    }

    #[test]
    fn stop_answering_comes_first_in_the_call_that_removes_the_ip() {
        let t0 = Instant::now();
        let mut announcer = Announcer::new(Schedule::default());
        announcer.set_desired(t0, &desired(&["192.0.2.1", "192.0.2.2"]));
        let effects = announcer.set_desired(t0 + ms(10), &desired(&["192.0.2.2", "2001:db8::1"]));
        let mut expected = vec![stop("192.0.2.1"), start("2001:db8::1")];
        expected.extend(announces("2001:db8::1", 5));
        assert_eq!(effects, expected);
        assert_eq!(
            announcer.set_desired(t0 + ms(20), &BTreeSet::new())[..1],
            [stop("192.0.2.2")]
        );
        assert_eq!(announcer.next_deadline(), None);
    }

    #[test]
    fn an_unchanged_desired_set_emits_nothing() {
        let t0 = Instant::now();
        let mut announcer = Announcer::new(Schedule::default());
        let set = desired(&["192.0.2.1"]);
        announcer.set_desired(t0, &set);
        assert_eq!(announcer.set_desired(t0 + ms(1), &set), vec![]);
    }

    #[test]
    fn a_burst_gap_spaces_the_announcements_of_a_burst() {
        let t0 = Instant::now();
        let schedule = Schedule {
            burst: 3,
            burst_gap: ms(100),
            second_burst_after: Some(ms(1000)),
            ..Schedule::default()
        };
        let mut announcer = Announcer::new(schedule);
        let a = "192.0.2.1";
        // (time in ms, announcements expected from tick at that time)
        let table: &[(u64, usize)] = &[
            (50, 0),
            (100, 1),
            (199, 0),
            (200, 1),
            (1199, 0),
            (1200, 1),
            (1300, 1),
            (1400, 1),
            (5000, 0),
        ];
        assert_eq!(
            announcer.set_desired(t0, &desired(&[a])),
            vec![start(a), announce(a)]
        );
        for (at, count) in table {
            assert_eq!(
                announcer.tick(t0 + ms(*at)),
                announces(a, *count),
                "at {at} ms"
            );
        }
        assert_eq!(announcer.next_deadline(), None);
    }

    #[test]
    fn periodic_refresh_sends_its_own_burst_size_forever() {
        let t0 = Instant::now();
        let schedule = Schedule {
            second_burst_after: None,
            refresh: Some(ms(60_000)),
            refresh_burst: 2,
            ..Schedule::default()
        };
        let mut announcer = Announcer::new(schedule);
        let a = "2001:db8::1";
        assert_eq!(announcer.set_desired(t0, &desired(&[a])).len(), 6);
        for round in 1..=3u64 {
            assert_eq!(announcer.next_deadline(), Some(t0 + ms(60_000 * round)));
            assert_eq!(announcer.tick(t0 + ms(60_000 * round)), announces(a, 2));
        }
    }

    #[test]
    fn a_joining_member_triggers_one_extra_burst_for_every_ip() {
        let t0 = Instant::now();
        let mut announcer = Announcer::new(Schedule::default());
        announcer.set_desired(t0, &desired(&["192.0.2.1", "192.0.2.2"]));
        announcer.tick(t0 + ms(5000));
        assert_eq!(announcer.next_deadline(), None);
        let mut expected = announces("192.0.2.1", 5);
        expected.extend(announces("192.0.2.2", 5));
        assert_eq!(announcer.member_joined(t0 + ms(9000)), expected);
        assert_eq!(announcer.next_deadline(), None);
    }

    #[test]
    fn a_conflict_re_announces_only_that_ip_and_only_if_it_is_ours() {
        let t0 = Instant::now();
        let mut announcer = Announcer::new(Schedule::default());
        announcer.set_desired(t0, &desired(&["192.0.2.1", "192.0.2.2"]));
        assert_eq!(
            announcer.conflict(t0 + ms(1000), ip("192.0.2.2")),
            announces("192.0.2.2", 5)
        );
        assert_eq!(
            announcer.conflict(t0 + ms(1000), ip("198.51.100.9")),
            vec![]
        );
        // The takeover's second burst is still due (for .1 at 5 s; .2's moved after its extra one).
        assert_eq!(announcer.tick(t0 + ms(5000)), announces("192.0.2.1", 5));
        assert_eq!(announcer.tick(t0 + ms(6000)), announces("192.0.2.2", 5));
    }

    #[test]
    fn an_extra_burst_does_not_restart_a_burst_under_way() {
        let t0 = Instant::now();
        let schedule = Schedule {
            burst: 3,
            burst_gap: ms(100),
            second_burst_after: None,
            ..Schedule::default()
        };
        let mut announcer = Announcer::new(schedule);
        let a = "192.0.2.1";
        announcer.set_desired(t0, &desired(&[a]));
        assert_eq!(announcer.conflict(t0 + ms(50), ip(a)), vec![]);
        assert_eq!(announcer.member_joined(t0 + ms(100)), announces(a, 1));
        assert_eq!(announcer.tick(t0 + ms(200)), announces(a, 1));
        assert_eq!(announcer.next_deadline(), None);
    }

    #[test]
    fn a_zero_burst_answers_without_announcing() {
        let t0 = Instant::now();
        let schedule = Schedule {
            burst: 0,
            ..Schedule::default()
        };
        let mut announcer = Announcer::new(schedule);
        let a = "192.0.2.1";
        assert_eq!(announcer.set_desired(t0, &desired(&[a])), vec![start(a)]);
        assert_eq!(announcer.tick(t0 + ms(5000)), vec![]);
        assert_eq!(announcer.member_joined(t0 + ms(6000)), vec![]);
        assert_eq!(announcer.next_deadline(), None);
    }

    #[test]
    fn a_very_late_tick_sends_a_bounded_number_of_announcements() {
        let t0 = Instant::now();
        let schedule = Schedule {
            refresh: Some(ms(1)),
            ..Schedule::default()
        };
        let mut announcer = Announcer::new(schedule);
        let a = "192.0.2.1";
        announcer.set_desired(t0, &desired(&[a]));
        let late = announcer.tick(t0 + ms(3_600_000));
        assert!(!late.is_empty() && late.len() <= 7, "{}", late.len());
        assert!(announcer.next_deadline().is_some());
    }

    #[test]
    fn effect_labels_are_fixed() {
        assert_eq!(start("192.0.2.1").as_str(), "start_answering");
        assert_eq!(stop("192.0.2.1").as_str(), "stop_answering");
        assert_eq!(announce("192.0.2.1").as_str(), "announce");
    }
}
