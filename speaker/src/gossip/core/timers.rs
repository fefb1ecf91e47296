//! The core's timers (see the parent module's docs): foca's, the join retries to the seeds, and
//! housekeeping.

use super::*;

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
                    let probe = matches!(timer, Timer::ProbeRandomMember(_));
                    let started = std::mem::take(&mut self.wire.probe_started);
                    self.wire.probe_failed = false;
                    let mut io = self.wire.at(now);
                    if let Err(err) = self.foca.handle_timer(timer, &mut io) {
                        tracing::debug!(error = %err, "foca timer");
                    }
                    // The suspicion a failed probe starts is timed with the health from before
                    // that failure counts.
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
                    self.wire
                        .timers
                        .push(now + self.timing.suspect_to_down_after, Task::SuspectSweep);
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
