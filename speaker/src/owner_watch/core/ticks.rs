//! The watch's timers: heartbeats and refutations due, the second checks and their verdicts,
//! the rechecks of this node's accusations and the checks of members ahead in line.

use std::time::Duration;

use rand::RngExt;
use swimlb_proto::WatchMessage;

use super::{
    CHECK_ROUNDS, Event, POLL_WAIT, Pause, PendingPoll, Purpose, REFUTE_REPEAT, WatchCore,
    check_round_at, interval_ms, node_ref, watch_addr,
};
use crate::gossip::NodeIdentity;
use crate::owner_watch::Verdict;
use crate::owner_watch::metrics::CheckResult;

impl WatchCore {
    /// The timer set for [`WatchCore::next_deadline`] fired at `now`: sends the heartbeats and
    /// refutations due, runs the second checks and the verdicts. Returns how late the timer
    /// fired (zero when nothing was due), also observed in the lateness histogram.
    pub fn tick(&mut self, now: Duration) -> Duration {
        let planned = self.next_deadline().map_or(now, |at| at.min(now));
        let late = now - planned;
        self.metrics.late(late);
        if late > self.knobs.interval * self.knobs.misses && self.paused.is_none() {
            // Not scheduled for longer than a watcher waits: the IPs may have moved.
            self.paused = Some(Pause::Held);
            self.schedules.clear();
            self.refute_after_pause |= self.refutes_left > 0;
            self.refutes_left = 0;
            // Its owners may have moved or dropped it meanwhile: it watches again from their
            // next heartbeats.
            self.watched.clear();
            self.ahead.clear();
            self.polls.clear();
            self.events.push(Event::Paused { late });
        }
        self.tick_heartbeats(now);
        self.tick_refute(now);
        self.tick_watched(now, planned);
        self.tick_rechecks(now);
        self.tick_ahead(now);
        self.polls.retain(|_, p| p.expires > now);
        self.update_sizes();
        late
    }

    fn tick_heartbeats(&mut self, now: Duration) {
        let mut beats = Vec::new();
        for (node, schedule) in &mut self.schedules {
            if let Some(beat) = schedule.poll(now) {
                beats.push((node.clone(), beat));
            }
        }
        for (node, beat) in beats {
            let Some(to) = self.watch_addr_of(&node) else {
                continue;
            };
            self.seq += 1;
            let message = WatchMessage::Heartbeat {
                incarnation: self.plan.me.bump,
                seq: self.seq,
                interval_ms: beat.interval_ms(),
            };
            self.send(to, &message);
        }
    }

    /// Refutations from `now` on, [`REFUTE_REPEAT`] of them.
    pub(super) fn arm_refute(&mut self, now: Duration) {
        self.refutes_left = REFUTE_REPEAT;
        self.next_refute = now;
    }

    /// Sends the refutations due: a heartbeat to every member.
    pub(super) fn tick_refute(&mut self, now: Duration) {
        if self.refutes_left == 0 || now < self.next_refute || self.paused.is_some() {
            return;
        }
        self.refutes_left -= 1;
        self.next_refute = now + self.knobs.interval;
        let message = WatchMessage::Heartbeat {
            incarnation: self.plan.me.bump,
            // Seq 0: a watcher's detector ignores it (not above its last); an accuser only
            // looks at the incarnation.
            seq: 0,
            interval_ms: interval_ms(self.knobs.interval),
        };
        self.send_to_all(&message);
        self.relay(&message);
    }

    /// Watched owners: the rounds of the second check due, then the verdicts.
    fn tick_watched(&mut self, now: Duration, planned: Duration) {
        let mut check = Vec::new();
        let mut silent = Vec::new();
        for (node, w) in &mut self.watched {
            let Some(deadline) = w.detector.deadline() else {
                continue;
            };
            if check_round_at(deadline, w.detector.promised(), w.checks_sent)
                .is_some_and(|at| now >= at)
            {
                w.checks_sent += 1;
                check.push(node.clone());
            }
            match w.detector.tick(now, planned) {
                Verdict::Silent { incarnation, .. } => {
                    w.silent_at = Some(now);
                    silent.push((node.clone(), incarnation, w.last_heard));
                }
                Verdict::Late { .. } => w.checks_sent = 0,
                Verdict::Fine | Verdict::NotArmed => {}
            }
        }
        for node in check {
            self.second_check(now, &node);
        }
        for (node, incarnation, last_heard) in silent {
            self.metrics.checked(CheckResult::Silent);
            if self.paused.is_some() {
                // Until the daemon heard the cluster again this node's own standing is unknown.
                self.watched.remove(&node);
                continue;
            }
            let Some(owner) = self
                .directory
                .get(&node)
                .filter(|id| id.bump == incarnation)
                .cloned()
            else {
                // Gone from the gossip, or renewed: nothing to take over on the watch's word.
                self.watched.remove(&node);
                continue;
            };
            self.events.push(Event::Silent {
                owner,
                silent_for: now.saturating_sub(last_heard),
            });
        }
    }

    /// This node's accusations due for a recheck: one round each, while the plan still accuses
    /// the member in that incarnation (nothing is sent during a pause).
    fn tick_rechecks(&mut self, now: Duration) {
        let accused = &self.plan.accused;
        self.rechecks
            .retain(|node, r| r.next > now || accused.get(node) == Some(&r.incarnation));
        let mut due = Vec::new();
        for (node, r) in &mut self.rechecks {
            if r.next <= now {
                r.next = now + POLL_WAIT;
                due.push((node.clone(), r.incarnation));
            }
        }
        if self.paused.is_some() {
            return;
        }
        for (node, incarnation) in due {
            if let Some(id) = self.directory.get(&node) {
                let target = NodeIdentity {
                    bump: incarnation,
                    ..id.clone()
                };
                self.poll_through(now, &target, Purpose::Accusation { incarnation });
            }
        }
    }

    /// Members ahead in line: the rounds due, then the verdicts (a member still in the
    /// directory in the incarnation checked, not answering, is silent).
    pub(super) fn tick_ahead(&mut self, now: Duration) {
        if self.paused.is_some() {
            self.ahead.clear();
            return;
        }
        let interval = self.knobs.interval;
        let mut rounds = Vec::new();
        let mut silent = Vec::new();
        self.ahead.retain(|node, c| {
            while c.rounds_sent < CHECK_ROUNDS && c.next_at(interval) <= now {
                c.rounds_sent += 1;
                rounds.push((node.clone(), c.incarnation));
            }
            let due = c.rounds_sent == CHECK_ROUNDS && c.next_at(interval) <= now;
            if due {
                silent.push((node.clone(), c.incarnation, c.started));
            }
            !due
        });
        for (node, incarnation) in rounds {
            if let Some(id) = self
                .directory
                .get(&node)
                .filter(|id| id.bump == incarnation)
            {
                let target = id.clone();
                self.poll_through(now, &target, Purpose::Ahead { incarnation });
            }
        }
        for (node, incarnation, started) in silent {
            self.metrics.checked(CheckResult::Silent);
            if let Some(id) = self
                .directory
                .get(&node)
                .filter(|id| id.bump == incarnation)
            {
                self.events.push(Event::Silent {
                    owner: id.clone(),
                    silent_for: now.saturating_sub(started),
                });
            }
        }
    }

    /// Remembers a poll of `target` sent at `now` until [`POLL_WAIT`] passes; its nonce.
    pub(super) fn new_poll(&mut self, now: Duration, target: &str, purpose: Purpose) -> u64 {
        let nonce = self.rng.random::<u64>();
        self.polls.insert(
            nonce,
            PendingPoll {
                target: target.to_string(),
                purpose,
                expires: now + POLL_WAIT,
            },
        );
        nonce
    }

    /// Polls `owner` directly and through one other member.
    fn second_check(&mut self, now: Duration, owner: &str) {
        if let Some(target) = self.directory.get(owner).cloned() {
            self.poll_through(now, &target, Purpose::SecondCheck);
        }
    }

    /// Polls `target` (as `target.bump`) directly and through one other member, for `purpose`.
    fn poll_through(&mut self, now: Duration, target: &NodeIdentity, purpose: Purpose) {
        let Some(to) = watch_addr(target.addr) else {
            return;
        };
        let owner = target.node.as_str();
        let nonce = self.new_poll(now, owner, purpose);
        self.send(
            to,
            &WatchMessage::Poll {
                nonce,
                incarnation: target.bump,
            },
        );
        let relays = self.directory.len().saturating_sub(1);
        if relays == 0 {
            return;
        }
        let pick = self.rng.random_range(0..relays);
        let Some(relay_to) = self
            .directory
            .values()
            .filter(|id| id.node != target.node)
            .nth(pick)
            .and_then(|relay| watch_addr(relay.addr))
        else {
            return;
        };
        let nonce = self.new_poll(now, owner, purpose);
        self.send(
            relay_to,
            &WatchMessage::Relay {
                nonce,
                target: node_ref(target),
            },
        );
    }
}
