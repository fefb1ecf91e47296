//! What foca reports, acted on (see the parent module's docs): members up and down, this
//! node's identity renewed, its record published and settled.

use super::*;

/// A member held down that talks to us: how often we told it so since when (see
/// [`Core::tell_down`]).
pub(super) struct ToldDown {
    /// The identity held down (a new one at the same address starts the count over).
    pub(super) member: NodeIdentity,
    /// Tellings since `since`.
    pub(super) tellings: u32,
    /// When the count started.
    pub(super) since: Duration,
}

impl Core {
    /// Replaces this node's metadata (everything but `version`, which the core bumps) and
    /// gossips it. Unchanged metadata is a no-op.
    pub fn set_meta(&mut self, now: Duration, meta: MemberMeta) -> Result<(), GossipError> {
        if meta.node != self.own.node {
            return Err(GossipError::WrongNode {
                expected: self.own.node.clone(),
                got: meta.node,
            });
        }
        let mut next = meta;
        next.version = self.own.version;
        if next == self.own {
            return Ok(());
        }
        next.version = self.own.version + 1;
        let previous = std::mem::replace(&mut self.own, next);
        if let Err(err) = self.publish_own_record() {
            self.own = previous;
            return Err(err);
        }
        self.live.remove(&self.own.node);
        self.live.upsert(self.own.clone());
        self.changes.push(LiveChange::Meta(self.own.node.clone()));
        self.settle(now);
        Ok(())
    }

    /// Leaves the cluster: a few members are told at once (their datagrams are queued now; send
    /// them before exiting). The core is inert afterwards.
    pub fn leave(&mut self, now: Duration) {
        if self.phase == Phase::Left {
            return;
        }
        let mut io = self.wire.at(now);
        if let Err(err) = self.foca.leave_cluster(&mut io) {
            tracing::debug!(error = %err, "leave");
        }
        self.phase = Phase::Left;
        self.wire.notes.clear();
        self.wire.timers.heap.clear();
    }

    /// Encodes our record under the current identity and hands it to foca's dissemination.
    pub(super) fn publish_own_record(&mut self) -> Result<(), GossipError> {
        let record = MetaRecord {
            bump: self.foca.identity().bump,
            meta: self.own.clone(),
        };
        self.own_record = record.encode()?;
        self.foca
            .add_broadcast(&self.own_record)
            .map_err(|err| GossipError::Broadcast {
                node: self.own.node.clone(),
                reason: err.to_string(),
            })?;
        Ok(())
    }

    pub(super) fn offer_own_record(&mut self) {
        if let Err(err) = self.publish_own_record() {
            tracing::warn!(error = %err, "own metadata record");
        }
    }

    /// Reacts to foca's notifications until there are none, then applies new metadata.
    pub(super) fn settle(&mut self, now: Duration) {
        if !self.wire.accusations.is_empty() {
            self.take_accusations(now);
        }
        while !self.wire.notes.is_empty() {
            let notes = std::mem::take(&mut self.wire.notes);
            for note in notes {
                self.react(now, note);
            }
        }
        let changed = self.book.lock().take_changed();
        for node in changed {
            self.apply_record(&node);
        }
        self.rescale();
        self.wake_sweep(now, false);
    }

    /// Re-applies the size-dependent timings when the member count moved them.
    pub(super) fn rescale(&mut self) {
        let scaled = self.timing.scaled(self.members.len() + 1);
        if scaled == self.scaled {
            return;
        }
        match self.timing.foca_config(self.members.len() + 1) {
            Ok(config) => match self.foca.set_config(config) {
                Ok(()) => self.scaled = scaled,
                Err(err) => tracing::warn!(error = %err, "foca refused the rescaled timings"),
            },
            Err(err) => tracing::warn!(error = %err, "rescaled timings"),
        }
    }

    pub(super) fn react(&mut self, now: Duration, note: OwnedNotification<NodeIdentity>) {
        match note {
            OwnedNotification::MemberUp(id) => {
                let node = id.node.to_string();
                self.heard_before_down.remove(&node);
                self.by_node.insert(node.clone(), id.addr);
                let addr = id.addr;
                self.hold_member(id);
                self.live.remove(&node);
                let mut placeholder = MemberMeta::new(node.clone());
                placeholder.version = 0;
                self.live.upsert(placeholder);
                self.missing_meta.insert(node.clone());
                self.changes.push(LiveChange::Up(node.clone()));
                self.apply_record(&node);
                // Push our record to the newcomer: the gossip only carries records that are
                // new to the whole cluster.
                self.send_own_record(addr);
            }
            OwnedNotification::MemberDown(id) => {
                // Only the identity we hold at that address goes down: a late down of an older
                // identity (the member has renewed since) must not remove the living member.
                if self.members.get(&id.addr) != Some(&id) {
                    return;
                }
                self.drop_member(&id.addr);
                if self.by_node.get(id.node.as_str()) == Some(&id.addr) {
                    self.by_node.remove(id.node.as_str());
                }
                self.missing_meta.remove(id.node.as_str());
                self.live.remove(&id.node);
                // Detection time as seen from here: since the first sign of the failure this
                // node has, the suspicion it held or the last datagram it heard from the member,
                // whichever is later (in a large cluster a member may not have written to us for
                // seconds before it failed, so the last datagram alone overstates).
                let heard = self.last_heard.remove(&id.addr);
                let suspected = self
                    .suspects
                    .get(&id.addr)
                    .filter(|(held, ..)| *held == id)
                    .map(|(_, _, since, _)| *since);
                match heard {
                    Some(at) => self.heard_before_down.insert(id.node.to_string(), at),
                    None => self.heard_before_down.remove(id.node.as_str()),
                };
                let since = heard.max(suspected);
                self.wire
                    .metrics
                    .member_down(since.map(|t| now.saturating_sub(t).as_secs_f64()));
                self.changes.push(LiveChange::Down(id.node.to_string()));
            }
            OwnedNotification::Rename(_, new) => {
                if self.members.contains_key(&new.addr) {
                    self.hold_member(new.clone());
                    // The renewed member re-gossips its record; until it arrives the old one
                    // stays, and housekeeping asks for it if the gossip does not bring it.
                    let fresh = self
                        .book
                        .lock()
                        .get(&new.node)
                        .is_some_and(|record| record.written_by(&new));
                    if !fresh {
                        self.missing_meta.insert(new.node.to_string());
                    }
                    // The renewal is news even when the record is the same (a speaker restarted
                    // within a probe period starts its versions again from the same record): an
                    // accusation of the member's previous identity ends on it.
                    if !self.apply_record(&new.node) {
                        self.changes.push(LiveChange::Meta(new.node.to_string()));
                    }
                }
            }
            OwnedNotification::Active => self.phase = Phase::Active,
            OwnedNotification::Idle => {
                if self.phase != Phase::Left {
                    self.phase = Phase::Joining;
                    self.schedule_join_retry(now);
                }
            }
            OwnedNotification::Rejoin(id) => {
                self.rejoins += 1;
                tracing::info!(
                    bump = id.bump,
                    "declared down; rejoining under a renewed identity"
                );
                let (alive, down) = self.alive_and_down();
                if down >= alive {
                    self.restart_foca(now, id);
                } else {
                    self.forget_own_suspicions();
                }
                self.unsettle_own();
                self.offer_own_record();
            }
            OwnedNotification::ProbeFailed(_, member) => {
                if self.timing.notify_suspects {
                    self.send_suspicion_notice(member);
                }
            }
            OwnedNotification::DataReceived(_) | OwnedNotification::DataSent(_) => {}
            OwnedNotification::Defunct => {
                if self.phase != Phase::Left {
                    tracing::warn!("identity declared down and not renewed");
                }
            }
        }
    }

    /// Forgets how long we have suspected members and how often we asked them, after our
    /// identity was declared down and renewed in place (a false down: we keep the instance).
    ///
    /// The cluster held our previous identity down, so it ignored that life's notices and
    /// asks: a suspect never heard them and never refuted (a member starved of CPU is declared
    /// down again and again and suspects healthy members all along). Kept, the suspicion would
    /// run out its asks and expire into a down the whole cluster takes, against a member that
    /// was never told. The suspects stay suspect in foca; the sweep times them afresh and the
    /// new identity asks them, so a live suspect refutes.
    fn forget_own_suspicions(&mut self) {
        self.suspects.clear();
        self.suspicions.clear();
        self.wire.accusations.clear();
    }

    /// Tells `to` that we hold it as down, as foca's `notify_down_members` would (but never in
    /// answer to its own "you are down"): it then renews its identity and rejoins.
    pub(super) fn send_turn_undead(&mut self, to: NodeIdentity) {
        if let Some(body) = self.foca_header(&to, Message::TurnUndead) {
            self.seal(to.addr, &GossipMessage::Foca(&body));
        }
    }

    /// Tells a member we hold down, which talks to us, that it is down (it renews). One that
    /// goes on talking after three tellings over two probe periods never hears us: our path to
    /// it is cut (a one-way firewall rule) while its path to us is not, and the members that
    /// hold it alive under the same identity would keep electing it while we do not. So the
    /// members are told of its down too, and the first it talks to tells it. Repeated at most
    /// every two probe periods while it lasts.
    pub(super) fn tell_down(&mut self, now: Duration, member: NodeIdentity) {
        let fresh = || ToldDown {
            member: member.clone(),
            tellings: 0,
            since: now,
        };
        let told = self.told_down.entry(member.addr).or_insert_with(fresh);
        if told.member != member {
            *told = fresh();
        }
        told.tellings += 1;
        let unheard =
            told.tellings >= 3 && now.saturating_sub(told.since) >= self.timing.probe_period * 2;
        if unheard {
            *told = fresh();
        }
        self.send_turn_undead(member.clone());
        if unheard {
            self.spread_down(member);
        }
    }

    /// Sends our "`member` is down" to up to three members that are not it.
    fn spread_down(&mut self, member: NodeIdentity) {
        let Some(incarnation) = self
            .foca
            .iter_membership_state()
            .find(|m| m.id() == &member && m.state() == State::Down)
            .map(|m| m.incarnation())
        else {
            return;
        };
        let update = foca::Member::new(member.clone(), incarnation, State::Down);
        let peers: Vec<NodeIdentity> = self
            .members
            .values()
            .filter(|id| id.addr != member.addr)
            .take(3)
            .cloned()
            .collect();
        tracing::info!(
            member = %member.addr,
            told = peers.len(),
            "a member held down does not hear it is down: telling the others"
        );
        for peer in peers {
            self.send_updates(peer, std::slice::from_ref(&update), 1);
        }
    }

    /// Replaces foca, after our identity was declared down and renewed while we hold at least
    /// as many members down as alive (we were the ones cut off), with a fresh instance under
    /// `identity` that knows only the members we hold alive.
    ///
    /// What a node concluded while cut off is stale: it holds the members on the other side as
    /// down (foca never revives a down identity) and its update backlog still carries those
    /// downs. Kept, they make the node answer the other side's announces with "you are down"
    /// and gossip the downs once it is back, so healthy members renew in turn and the membership
    /// flaps for seconds after every heal. foca keeps its members and backlog across a renewal
    /// (its `reset` says so and suggests recreating the instance, which is what this does).
    /// A node that holds more members alive (a false down under loss) keeps its instance: its
    /// backlog carries the cluster's refutations and its own old identity's down.
    pub(super) fn restart_foca(&mut self, now: Duration, identity: NodeIdentity) {
        let config = match self.timing.foca_config(self.members.len() + 1) {
            Ok(config) => config,
            Err(err) => {
                tracing::warn!(error = %err, "gossip timings; keeping the renewed instance");
                return;
            }
        };
        let alive: Vec<foca::Member<NodeIdentity>> = self
            .foca
            .iter_membership_state()
            .filter(|m| m.state() != State::Down && self.members.get(&m.id().addr) == Some(m.id()))
            .map(|m| foca::Member::new(m.id().clone(), m.incarnation(), State::Alive))
            .collect();
        let rng = StdRng::seed_from_u64(self.rng_seed ^ identity.bump);
        let broadcasts = MetaBroadcasts::new(self.book.clone());
        self.foca =
            foca::Foca::with_custom_broadcast(identity, config, rng, PostcardCodec, broadcasts);
        // The old instance's timers mean nothing to the new one.
        self.wire
            .timers
            .heap
            .retain(|s| !matches!(s.task, Task::Foca(_)));
        self.suspects.clear();
        self.suspicions.clear();
        self.wire.accusations.clear();
        self.wire.held.clear();
        self.wire.probe = super::timers::ProbeSeen::default();
        self.wire.incarnation = 0;
        let held = std::mem::take(&mut self.wire.notes);
        if let Err(err) = self
            .foca
            .apply_many(alive.into_iter(), false, &mut self.wire.at(now))
        {
            tracing::debug!(error = %err, "restoring the alive members");
        }
        // Our previous identity is down: say so, as a renewal in place does, so members that
        // still hold it learn the news with the gossip instead of by probing it to death.
        let previous = NodeIdentity {
            bump: self.foca.identity().bump.wrapping_sub(1),
            ..self.foca.identity().clone()
        };
        let down = foca::Member::new(previous, 0, State::Down);
        if let Err(err) = self
            .foca
            .apply_many(std::iter::once(down), true, &mut self.wire.at(now))
        {
            tracing::debug!(error = %err, "declaring the previous identity down");
        }
        let restored = std::mem::replace(&mut self.wire.notes, held);
        // The members we hold come up again in the new instance: that is not news.
        let members = &self.members;
        self.wire.notes.extend(restored.into_iter().filter(|note| {
            !matches!(note, OwnedNotification::MemberUp(id) if members.get(&id.addr) == Some(id))
        }));
        // Announce the new identity at once (a join retry may be pending from before, up to
        // `join_retry` away), and keep announcing to the seeds until a member acknowledges it.
        self.phase = Phase::Joining;
        self.announce_to_seeds(now);
        self.schedule_join_retry(now + self.timing.join_retry);
    }

    /// Clears `settled` in our own record: a renewed identity is a new membership, and a node
    /// that comes back from a cut must not take addresses back before its preemption delay.
    /// Whoever owns the settle policy sets it again through [`Core::set_meta`].
    pub(super) fn unsettle_own(&mut self) {
        if !self.own.settled {
            return;
        }
        self.own.settled = false;
        self.own.version += 1;
        self.live.remove(&self.own.node);
        self.live.upsert(self.own.clone());
        self.changes.push(LiveChange::Meta(self.own.node.clone()));
    }

    /// Puts the newest record of `node` into the LiveSet if it was written by the identity we
    /// hold alive for that node and differs from the one there; returns whether it did (a
    /// [`LiveChange::Meta`] was queued).
    pub(super) fn apply_record(&mut self, node: &str) -> bool {
        let Some(id) = self.by_node.get(node).and_then(|a| self.members.get(a)) else {
            return false;
        };
        let book = self.book.lock();
        let Some(record) = book.get(node) else {
            return false;
        };
        if !record.written_by(id) || self.live.get(node) == Some(&record.meta) {
            return false;
        }
        let meta = record.meta.clone();
        drop(book);
        self.live.remove(node);
        self.live.upsert(meta);
        self.missing_meta.remove(node);
        self.changes.push(LiveChange::Meta(node.to_string()));
        true
    }
}
