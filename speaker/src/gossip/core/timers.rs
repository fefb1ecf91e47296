//! The core's timers (see the parent module's docs): foca's, the join retries to the seeds, and
//! housekeeping.
//!
//! Two timers would wake the core to find nothing to do, and wait outside the heap instead:
//!
//! - foca's `SendIndirectProbe`, due `probe_rtt` after every probe, though the member answered
//!   within a millisecond. foca, handed it, checks its timer token, marks the probe's indirect
//!   stage reached, and returns at once if the probe succeeded (`Foca::handle_timer`). That mark
//!   is read only by the next `ProbeRandomMember` (`Probe::validate`: a probe that never
//!   reached the stage is an `IncompleteProbeCycle`), and a probe's success is cleared only
//!   when the next probe starts. So once the core knows the probe was answered ([`ProbeSeen`])
//!   the timer is taken out of the heap and handed to foca just before the next
//!   `ProbeRandomMember`, with the same effect as on time. Dropping it instead would make foca
//!   report the cycle incomplete (`timer_tests.rs` shows both).
//! - The suspect sweep, every `suspect_to_down_after`, with no member suspect: parked on its
//!   grid while no member is suspect and no suspicion is timed, and set again (at its next
//!   grid point) as soon as one may be: foca queues every member it turns suspect as an update
//!   (`updates_backlog`), a suspicion of ours is timed, and housekeeping's count of suspects
//!   (every second) catches anything else.

use super::*;

#[derive(Debug)]
pub(super) enum Task {
    Foca(Timer<NodeIdentity>),
    JoinRetry,
    MetaRefresh,
    Housekeeping,
    SuspectSweep,
    Sync,
    /// A suspicion this node holds may be due (see [`Core::suspicion_due`]).
    Suspicion(SocketAddr),
    /// The next ping of an inquiry this node serves (by nonce).
    Relay(u64),
}

#[derive(Debug)]
pub(super) struct Scheduled {
    pub(super) at: Duration,
    seq: u64,
    pub(super) task: Task,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at && self.seq == other.seq
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    // Reversed: BinaryHeap is a max-heap, the earliest deadline (then the first set) must pop.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.at.cmp(&self.at).then(other.seq.cmp(&self.seq))
    }
}

#[derive(Debug, Default)]
pub(super) struct TimerHeap {
    pub(super) heap: BinaryHeap<Scheduled>,
    seq: u64,
}

impl TimerHeap {
    pub(super) fn push(&mut self, at: Duration, task: Task) {
        self.seq += 1;
        self.heap.push(Scheduled {
            at,
            seq: self.seq,
            task,
        });
    }

    pub(super) fn pop_due(&mut self, now: Duration) -> Option<(Duration, Task)> {
        if self.heap.peek().is_some_and(|s| s.at <= now) {
            self.heap.pop().map(|s| (s.at, s.task))
        } else {
            None
        }
    }
}

/// foca's probe under way, as its notifications show it: the `Ping` it sent, and whether the
/// `Ack` that makes the probe succeed came in.
#[derive(Debug, Default)]
pub(super) struct ProbeSeen {
    /// The member the last `Ping` went to, and its probe number.
    target: Option<(NodeIdentity, foca::ProbeNumber)>,
    /// An `Ack` from the target with that number came in the call under way.
    acked: bool,
    /// The target went down or was renamed since the ping: foca may have refused its `Ack`
    /// (an inactive sender's message is not read), so its probe is never taken as answered.
    spoiled: bool,
}

impl ProbeSeen {
    /// foca pinged `to` with probe `number` (it starts a probe).
    pub(super) fn pinged(&mut self, to: &NodeIdentity, number: foca::ProbeNumber) {
        self.target = Some((to.clone(), number));
        self.acked = false;
        self.spoiled = false;
    }

    /// An `Ack` from `from` with `number` is being handed to foca.
    pub(super) fn ack_received(&mut self, from: &NodeIdentity, number: foca::ProbeNumber) {
        self.acked |= self
            .target
            .as_ref()
            .is_some_and(|(id, n)| id == from && *n == number);
    }

    /// A notification foca sent during a call.
    pub(super) fn note(&mut self, note: &foca::Notification<'_, NodeIdentity>) {
        let gone = match note {
            foca::Notification::MemberDown(id) | foca::Notification::Rename(id, _) => *id,
            _ => return,
        };
        self.spoiled |= self.target.as_ref().is_some_and(|(id, _)| id == gone);
    }

    /// Whether the call that just ended (`ok`: foca returned no error) made the probe succeed:
    /// foca read the target's `Ack` ([`ProbeSeen::ack_received`]), the target active. An `Ack`
    /// foca may not have read (an error, the target gone) counts as none: its indirect probe
    /// stays due on time.
    pub(super) fn take_answered(&mut self, ok: bool) -> bool {
        let answered = std::mem::take(&mut self.acked) && ok && !self.spoiled;
        if answered {
            // One hold per probe.
            self.spoiled = true;
        }
        answered
    }

    /// The member being probed.
    fn target(&self) -> Option<&NodeIdentity> {
        self.target.as_ref().map(|(id, _)| id)
    }
}

impl Core {
    /// When [`Core::handle_due_timers`] should be called next.
    pub fn next_deadline(&self) -> Option<Duration> {
        let heap = self.wire.timers.heap.peek().map(|s| s.at);
        // A parked gossip timer is due (in the past) once there is something to gossip.
        let parked = self
            .gossip_parked
            .as_ref()
            .filter(|_| self.has_gossip())
            .map(|(at, _)| *at);
        match (heap, parked) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether foca has updates or broadcasts to gossip.
    pub(super) fn has_gossip(&self) -> bool {
        self.foca.updates_backlog() > 0 || self.foca.custom_broadcast_backlog() > 0
    }

    /// Runs every timer due at `now`, in deadline order.
    pub fn handle_due_timers(&mut self, now: Duration) {
        let mut late = false;
        // Due now, not when it was parked: it is not late (a late timer counts against this
        // node's health).
        if self.has_gossip()
            && let Some((_, timer)) = self.gossip_parked.take()
        {
            self.wire.timers.push(now, Task::Foca(timer));
        }
        while let Some((at, task)) = self.wire.timers.pop_due(now) {
            if self.phase == Phase::Left {
                continue;
            }
            // Scheduled late (a starved or paused process): count it against ourselves once.
            if !late && now.saturating_sub(at) > self.timing.probe_period {
                late = true;
                self.wire.health(1);
            }
            match task {
                // Nothing to gossip: foca would only re-arm it. Parked until there is.
                Task::Foca(timer @ Timer::PeriodicGossip(_)) if !self.has_gossip() => {
                    self.gossip_parked = Some((at, timer));
                }
                Task::Foca(timer) => {
                    if matches!(timer, Timer::ProbeRandomMember(_)) {
                        for held in std::mem::take(&mut self.wire.held) {
                            self.run_foca_timer(now, held);
                        }
                    }
                    self.run_foca_timer(now, timer);
                }
                Task::Suspicion(addr) => self.suspicion_due(now, addr),
                Task::Relay(nonce) => self.relay_ping(now, nonce),
                Task::JoinRetry => {
                    self.join_retry_pending = false;
                    if self.phase == Phase::Joining {
                        self.announce_to_seeds(now);
                        self.schedule_join_retry(now + self.timing.join_retry);
                    }
                }
                Task::MetaRefresh => {
                    self.offer_own_record();
                    self.wire
                        .timers
                        .push(now + self.timing.meta_refresh, Task::MetaRefresh);
                }
                Task::Housekeeping => {
                    self.housekeeping(now);
                    self.wire
                        .timers
                        .push(now + HOUSEKEEPING_PERIOD, Task::Housekeeping);
                }
                Task::SuspectSweep => {
                    self.sweep_suspects(now);
                    let next = now + self.timing.suspect_to_down_after;
                    if self.suspects.is_empty() && self.suspicions.is_empty() {
                        self.sweep_parked = Some(next);
                    } else {
                        self.wire.timers.push(next, Task::SuspectSweep);
                    }
                }
                Task::Sync => {
                    self.start_sync();
                    self.wire
                        .timers
                        .push(now + self.timing.sync_period, Task::Sync);
                }
            }
            self.settle(now);
        }
    }

    /// Hands one of foca's timers to foca, with Lifeguard's bookkeeping around it.
    fn run_foca_timer(&mut self, now: Duration, timer: Timer<NodeIdentity>) {
        let probe = matches!(timer, Timer::ProbeRandomMember(_));
        let started = std::mem::take(&mut self.wire.probe_started);
        self.wire.probe_failed = false;
        let mut io = self.wire.at(now);
        if let Err(err) = self.foca.handle_timer(timer, &mut io) {
            tracing::debug!(error = %err, "foca timer");
        }
        // The suspicion a failed probe starts is timed with the health from before that
        // failure counts.
        if !self.wire.accusations.is_empty() {
            self.take_accusations(now);
        }
        if probe && self.wire.probe_failed {
            self.wire.health(1);
        } else if probe && started {
            self.wire.health(-1);
        }
        self.wire.probe_started |= started && !probe;
    }

    /// foca's probe was answered: its indirect-probe timer leaves the heap, to be handed over
    /// just before the next probe timer (see the module docs). The heap holds a few dozen
    /// timers at most; this runs once per answered probe.
    pub(super) fn hold_answered_probe(&mut self) {
        let Some(target) = self.wire.probe.target() else {
            return;
        };
        let answered = |s: &Scheduled| matches!(&s.task, Task::Foca(Timer::SendIndirectProbe { probed_id, .. }) if probed_id == target);
        if !self.wire.timers.heap.iter().any(answered) {
            return;
        }
        let (held, kept): (Vec<Scheduled>, Vec<Scheduled>) =
            std::mem::take(&mut self.wire.timers.heap)
                .into_vec()
                .into_iter()
                .partition(answered);
        self.wire.timers.heap = kept.into();
        for s in held {
            if let Task::Foca(timer) = s.task {
                self.wire.held.push(timer);
            }
        }
    }

    /// Sets the parked suspect sweep again, at its next grid point from `now`, when a member
    /// may be suspect: foca has updates queued (every member it turns suspect is one), a
    /// suspicion is timed, or `suspect` says so (housekeeping counted one).
    pub(super) fn wake_sweep(&mut self, now: Duration, suspect: bool) {
        let Some(at) = self.sweep_parked else {
            return;
        };
        if !suspect && self.foca.updates_backlog() == 0 && self.suspicions.is_empty() {
            return;
        }
        self.sweep_parked = None;
        let period = self
            .timing
            .suspect_to_down_after
            .max(Duration::from_millis(1));
        let behind = now.saturating_sub(at).as_nanos();
        let periods = u32::try_from(behind.div_ceil(period.as_nanos())).unwrap_or(u32::MAX);
        let due = at.saturating_add(period.saturating_mul(periods));
        self.wire.timers.push(due, Task::SuspectSweep);
    }

    pub(super) fn schedule_join_retry(&mut self, at: Duration) {
        if !self.join_retry_pending {
            self.join_retry_pending = true;
            self.wire.timers.push(at, Task::JoinRetry);
        }
    }

    pub(super) fn announce_to_seeds(&mut self, now: Duration) {
        for i in 0..self.seeds.len() {
            let seed = NodeIdentity::seed(self.seeds[i]);
            let mut io = self.wire.at(now);
            if let Err(err) = self.foca.announce(seed, &mut io) {
                tracing::debug!(error = %err, "announce");
            }
        }
    }

    pub(super) fn housekeeping(&mut self, now: Duration) {
        let (mut alive, mut suspect, mut down) = (0, 0, 0);
        for member in self.foca.iter_membership_state() {
            match member.state() {
                State::Alive => alive += 1,
                State::Suspect => suspect += 1,
                State::Down => down += 1,
            }
        }
        self.wire.metrics.set_members(alive, suspect, down);
        self.wake_sweep(now, suspect > 0);
        let foca = &self.foca;
        self.told_down.retain(|_, told| {
            foca.iter_membership_state()
                .any(|m| m.state() == State::Down && m.id() == &told.member)
        });
        // Keys are remembered for members and seeds only, so the map stays as small as the
        // cluster (pruned once it holds more entries than that; at 1,000 members a sweep every
        // second on every member was a measurable share of the simulation).
        let (members, seeds) = (&self.members, &self.seeds);
        if self.wire.peer_keys.len() > members.len() + seeds.len() {
            self.wire
                .peer_keys
                .retain(|addr, _| members.contains_key(addr) || seeds.contains(addr));
        }
        if self.wire.offered.len() > members.len() + seeds.len() {
            self.wire
                .offered
                .retain(|addr, _| members.contains_key(addr) || seeds.contains(addr));
        }
        self.wire.replay.prune(now, self.members.len() + 1);
        // Ask alive members for records that neither their push nor the gossip brought: the
        // member itself, and one other member in turn, in case the path to the member is cut
        // (a firewall rule between two nodes: the member is alive through the others' probes
        // and gossip, its own record never arrives).
        let missing: Vec<(NodeName, SocketAddr)> = self
            .missing_meta
            .iter()
            .filter_map(|node| Some((node.clone(), *self.by_node.get(node)?)))
            .collect();
        for (node, addr) in missing {
            self.seal(addr, &GossipMessage::MetaPull { node: &[] });
            if let Some(holder) = self.next_other_member(addr) {
                let node = node.as_bytes();
                self.seal(holder, &GossipMessage::MetaPull { node });
            }
        }
    }

    /// The next alive member other than the one at `skip`, in foca's member order (so a
    /// seeded run repeats itself), turning with every call.
    fn next_other_member(&mut self, skip: SocketAddr) -> Option<SocketAddr> {
        let members = &self.members;
        let held = |id: &&NodeIdentity| id.addr != skip && members.get(&id.addr) == Some(*id);
        let count = self
            .foca
            .iter_membership_state()
            .map(|m| m.id())
            .filter(held)
            .count();
        if count == 0 {
            return None;
        }
        self.pull_turn = self.pull_turn.wrapping_add(1);
        self.foca
            .iter_membership_state()
            .map(|m| m.id())
            .filter(held)
            .nth(self.pull_turn % count)
            .map(|id| id.addr)
    }
}
