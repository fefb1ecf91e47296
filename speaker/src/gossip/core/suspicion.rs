//! The suspicion half of the core (see the parent module's docs): suspects swept, inquiries
//! sent and answered, the pings relayed for an inquirer, the verdicts counted as confirmations.

use super::*;

/// A suspect the owner watch hears alive is not declared down by this node for up to this long
/// from the suspicion's first start: its suspicion starts over instead (see
/// [`Core::heard_on_watch`]). Bounded, because the watch runs on a thread of its own: a node
/// whose gossip is wedged while its watch still beats is declared down after it.
pub(crate) const WATCH_EVIDENCE_MAX: Duration = Duration::from_secs(10);

impl Core {
    /// Settles suspicions this node only heard about, which foca would otherwise hold forever.
    ///
    /// foca starts the suspicion timer only on the member whose probe failed; the others learn
    /// the suspicion, and then the refutation or the death, from the gossip. A member that
    /// missed every copy (heavy loss) would hold the suspect until its own probe reached it, up
    /// to n probe periods later. So a suspect held (same identity, same incarnation) for longer
    /// than `T = 2 x suspicion + probe period` is asked directly: it is told it is suspected
    /// (so it refutes) and announced to (its reply carries its current incarnation, which clears
    /// the suspicion here), once per sweep. One that has not answered `SUSPECT_MAX_ASKS` asks
    /// and `SUSPECT_EXPIRE_AFTER` is declared down.
    pub(super) fn sweep_suspects(&mut self, now: Duration) {
        let patience = (self.scaled.0 * 2 + self.timing.probe_period).max(SUSPECT_PATIENCE_MIN);
        let inquire_after = self.scaled.0 + self.timing.probe_period;
        let mut held = FastMap::with_capacity_and_hasher(self.suspects.len(), Default::default());
        let mut ask = Vec::new();
        let mut expired = Vec::new();
        let mut inquire = Vec::new();
        for member in self.foca.iter_membership_state() {
            if member.state() != State::Suspect {
                continue;
            }
            let id = member.id();
            let (since, mut asks) = match self.suspects.get(&id.addr) {
                Some((known, incarnation, since, asks))
                    if known == id && *incarnation == member.incarnation() =>
                {
                    (*since, *asks)
                }
                _ => (now, 0),
            };
            let timed = self
                .suspicions
                .get(&id.addr)
                .is_some_and(|s| s.id == *id && s.incarnation == member.incarnation());
            if !timed && now.saturating_sub(since) >= inquire_after {
                inquire.push((id.clone(), member.incarnation()));
            }
            if now.saturating_sub(since) >= patience {
                let heard = self.suspicions.get(&id.addr).is_some_and(|s| {
                    s.id == *id
                        && s.heard_on_watch
                            .is_some_and(|at| now.saturating_sub(at) < patience)
                        && now < s.began + WATCH_EVIDENCE_MAX
                });
                if asks >= SUSPECT_MAX_ASKS
                    && now.saturating_sub(since) >= SUSPECT_EXPIRE_AFTER
                    && !heard
                {
                    expired.push(foca::Member::new(
                        id.clone(),
                        member.incarnation(),
                        State::Down,
                    ));
                    continue;
                }
                asks += 1;
                ask.push(id.clone());
            }
            held.insert(id.addr, (id.clone(), member.incarnation(), since, asks));
        }
        self.suspects = held;
        // Suspicions that ended while no timer of theirs was pending: count how they ended.
        let ended: Vec<SocketAddr> = self
            .suspicions
            .iter()
            .filter(|(addr, s)| {
                s.pending == 0
                    && !self
                        .suspects
                        .get(*addr)
                        .is_some_and(|(id, inc, ..)| *id == s.id && *inc == s.incarnation)
            })
            .map(|(addr, _)| *addr)
            .collect();
        for addr in ended {
            if let Some(s) = self.suspicions.remove(&addr) {
                self.count_outcome(&s);
            }
        }
        // The suspect may never have heard of it (this node learnt it from the gossip, or
        // renewed its identity and forgot its timers): it is told, and has a whole suspicion
        // from now to refute.
        for (id, incarnation) in inquire {
            self.send_suspicion_notice(id.clone());
            self.start_suspicion(now, id, incarnation, None);
        }
        for id in ask {
            self.send_suspicion_notice(id.clone());
            let mut io = self.wire.at(now);
            if let Err(err) = self.foca.announce(id, &mut io) {
                tracing::debug!(error = %err, "announce to a lingering suspect");
            }
        }
        if expired.is_empty() {
            return;
        }
        let mut io = self.wire.at(now);
        if let Err(err) = self.foca.apply_many(expired.into_iter(), true, &mut io) {
            tracing::debug!(error = %err, "suspicion timeout");
        }
    }

    /// Starts timing the suspicions foca asked a timer for (our own probe failed).
    pub(super) fn take_accusations(&mut self, now: Duration) {
        for (id, incarnation, timer) in std::mem::take(&mut self.wire.accusations) {
            if let Some(s) = self.suspicions.get_mut(&id.addr)
                && s.id == id
                && s.incarnation == incarnation
            {
                s.accused.get_or_insert(timer);
                continue;
            }
            self.start_suspicion(now, id, incarnation, Some(timer));
        }
    }

    /// Times a suspicion of `id` at `incarnation` from `since` and asks members to probe it.
    pub(super) fn start_suspicion(
        &mut self,
        since: Duration,
        id: NodeIdentity,
        incarnation: u16,
        accused: Option<Timer<NodeIdentity>>,
    ) {
        if let Some(previous) = self.suspicions.remove(&id.addr) {
            self.count_outcome(&previous);
        }
        self.next_token = self.next_token.wrapping_add(1);
        let token = self.next_token;
        let addr = id.addr;
        self.suspicions.insert(
            addr,
            Suspicion {
                id: id.clone(),
                incarnation,
                since,
                began: since,
                started_over: false,
                heard_on_watch: None,
                confirmers: Vec::new(),
                accused,
                token,
                pending: 0,
                stretch: self.wire.health.score() + 1,
            },
        );
        self.schedule_suspicion(addr);
        self.send_inquiries(&id, incarnation, token);
    }

    /// When the suspicion of the member at `addr` ends, as things stand.
    pub(super) fn suspicion_deadline(&self, s: &Suspicion) -> Duration {
        let min = self.scaled.0;
        let max = min.saturating_mul(self.timing.suspicion_max_mult);
        let confirmations = u32::try_from(s.confirmers.len()).unwrap_or(u32::MAX);
        let timeout = suspicion_timeout(confirmations, self.wanted_confirmations(), min, max);
        // Where no confirmations are wanted (a small cluster), nothing else tells a lone
        // observer's lossy link from a crash either: the suspicion keeps its shortest, unstretched,
        // as in plain SWIM.
        let stretch = if self.wanted_confirmations() == 0 {
            1
        } else {
            s.stretch.max(self.wire.health.score() + 1)
        };
        s.since + timeout.saturating_mul(stretch)
    }

    /// How long a suspicion nobody confirms lasts, unstretched, in a member that knows the
    /// members this node knows: the longest where confirmations are wanted, the shortest where
    /// none are (a small cluster, see [`Core::suspicion_deadline`]). By then plus a probe period
    /// a node declared down hears so. (A suspicion started over by a member deaf during it runs
    /// longer, but that member tells the suspect again when it hears again.)
    pub fn unconfirmed_suspicion(&self) -> Duration {
        let min = self.scaled.0;
        let max = min.saturating_mul(self.timing.suspicion_max_mult);
        suspicion_timeout(0, self.wanted_confirmations(), min, max)
    }

    /// How many independent confirmations shrink a suspicion to its shortest, with the members
    /// this node knows (see [`wanted_confirmations`]).
    pub(super) fn wanted_confirmations(&self) -> u32 {
        wanted_confirmations(self.timing.suspicion_confirmations, self.members.len())
    }

    pub(super) fn schedule_suspicion(&mut self, addr: SocketAddr) {
        let Some(at) = self
            .suspicions
            .get(&addr)
            .map(|s| self.suspicion_deadline(s))
        else {
            return;
        };
        if let Some(s) = self.suspicions.get_mut(&addr) {
            s.pending += 1;
        }
        self.wire.timers.push(at, Task::Suspicion(addr));
    }

    /// A suspicion's timer fired: end it if it is due and still stands.
    pub(super) fn suspicion_due(&mut self, now: Duration, addr: SocketAddr) {
        let Some(s) = self.suspicions.get_mut(&addr) else {
            return;
        };
        s.pending = s.pending.saturating_sub(1);
        let s = &self.suspicions[&addr];
        let stands = self.foca.iter_membership_state().any(|m| {
            m.id() == &s.id && m.state() == State::Suspect && m.incarnation() == s.incarnation
        });
        if !stands {
            if s.pending == 0
                && let Some(s) = self.suspicions.remove(&addr)
            {
                self.count_outcome(&s);
            }
            return;
        }
        let deadline = self.suspicion_deadline(s);
        let s = self.suspicions.get_mut(&addr).expect("looked up above");
        if now < deadline {
            if s.pending == 0 {
                self.schedule_suspicion(addr);
            }
            return;
        }
        // Heard nobody during it (a link down, a pause): start over, while another member could
        // have been heard (of two members neither tells a cut from a crash) and for at most
        // the longest suspicion from the first start.
        let (since, began) = (s.since, s.began);
        if self.deaf_during(since, now)
            && now < began + self.longest_suspicion()
            && self
                .members
                .keys()
                .any(|a| *a != addr && *a != self.foca.identity().addr)
        {
            self.start_over(now, addr, "heard nobody during a suspicion");
            return;
        }
        let s = &self.suspicions[&addr];
        if s.heard_on_watch.is_some_and(|at| at >= since) && now < began + WATCH_EVIDENCE_MAX {
            // Heard alive on the owner watch during it: only the gossip's paths to the suspect
            // fail (its port cut, a relay too starved or lossy to carry the probes).
            self.start_over(now, addr, "heard on the owner watch during a suspicion");
            return;
        }
        if s.accused.is_none() && s.confirmers.is_empty() && self.wanted_confirmations() > 0 {
            // Heard of through the gossip and confirmed by nobody: not ours to end; the sweep
            // keeps asking the suspect.
            return;
        }
        let Some(s) = self.suspicions.remove(&addr) else {
            return;
        };
        let outcome = if s.confirmers.is_empty() {
            SuspicionOutcome::Expired
        } else {
            SuspicionOutcome::Confirmed
        };
        self.wire.metrics.suspicion(outcome);
        let mut io = self.wire.at(now);
        let result = match s.accused {
            Some(timer) => self.foca.handle_timer(timer, &mut io),
            None => self.foca.apply_many(
                std::iter::once(foca::Member::new(s.id, s.incarnation, State::Down)),
                true,
                &mut io,
            ),
        };
        if let Err(err) = result {
            tracing::debug!(error = %err, "suspicion timeout");
        }
    }

    /// The owner watch heard the member at `addr`, identity `bump`, alive at `at` (a fresh
    /// heartbeat on the watch's own port and thread): a suspicion of that identity then starts
    /// over when it falls due instead of ending, for up to [`WATCH_EVIDENCE_MAX`] from its first
    /// start, and the sweep does not expire it while it is heard. The gossip alone declared
    /// such members down where their only path went through a starved or lossy third member
    /// (docs/src/development/open-problems.md). Crashes and pauses send no heartbeats: they are not delayed.
    pub fn heard_on_watch(&mut self, at: Duration, addr: SocketAddr, bump: u64) {
        if let Some(s) = self.suspicions.get_mut(&addr)
            && s.id.bump == bump
        {
            s.heard_on_watch = Some(s.heard_on_watch.map_or(at, |t| t.max(at)));
        }
    }

    /// Notes an authentic datagram at `now`; the first after a silence ends a deaf spell.
    pub(super) fn note_heard(&mut self, now: Duration) {
        if now.saturating_sub(self.last_datagram) > self.deaf_after() {
            self.heard_again = now;
        }
        self.last_datagram = now;
    }

    /// A silence longer than this (two probe periods, in which this node probes a member and
    /// is probed) is this node's deafness, not the members' deaths.
    fn deaf_after(&self) -> Duration {
        self.timing.probe_period.saturating_mul(2)
    }

    /// Whether this node heard nothing at all for a while since `since`: a deaf spell ended
    /// after it, or one lasts still (a link down, a cut of its own, a pause).
    fn deaf_during(&self, since: Duration, now: Duration) -> bool {
        self.heard_again > since || now.saturating_sub(self.last_datagram) > self.deaf_after()
    }

    /// The longest suspicion, unstretched: what an unconfirmed one lasts.
    fn longest_suspicion(&self) -> Duration {
        self.scaled.0.saturating_mul(self.timing.suspicion_max_mult)
    }

    /// Starts the suspicion of the member at `addr` over from `now`: this node was deaf during
    /// it, so the suspect's silence is no evidence and the suspect could not hear that it was
    /// suspected. It is told again and the members are asked again.
    fn start_over(&mut self, now: Duration, addr: SocketAddr, why: &str) {
        let Some(s) = self.suspicions.get_mut(&addr) else {
            return;
        };
        // Logged once per suspicion: a deaf spell starts it over every shortest timeout.
        if !s.started_over {
            tracing::info!(suspect = %addr, "{why}; starting it over");
        }
        s.started_over = true;
        s.since = now;
        s.confirmers.clear();
        let (id, incarnation, token) = (s.id.clone(), s.incarnation, s.token);
        self.send_suspicion_notice(id.clone());
        self.send_inquiries(&id, incarnation, token);
        self.schedule_suspicion(addr);
    }

    /// Tells a member our probe of it just failed, with a foca gossip message carrying the one
    /// update "you are suspect". SWIM lets the suspect learn this from the gossip, which in a
    /// large cluster takes several rounds; told at once, it refutes (raises its incarnation)
    /// while the suspicion is still spreading, so short suspicion timeouts stay safe under loss.
    /// (Lifeguard's "buddy system" does the same by piggybacking the suspicion on the
    /// next ping to the suspect; foca has no such extension.)
    pub(super) fn send_suspicion_notice(&mut self, member: NodeIdentity) {
        let Some(incarnation) = self
            .foca
            .iter_membership_state()
            .find(|m| m.id() == &member)
            .filter(|m| m.state() != State::Down)
            .map(|m| m.incarnation())
        else {
            return;
        };
        let update = foca::Member::new(member.clone(), incarnation, State::Suspect);
        self.send_updates(member, &[update], 1);
    }

    /// Counts how a suspicion this node timed ended without this node ending it.
    pub(super) fn count_outcome(&self, s: &Suspicion) {
        let refuted = self.foca.iter_membership_state().any(|m| {
            m.id().addr == s.id.addr
                && m.state() != State::Down
                && (m.id() != &s.id || m.incarnation() > s.incarnation)
        });

        self.wire.metrics.suspicion(if refuted {
            SuspicionOutcome::Refuted
        } else {
            SuspicionOutcome::Confirmed
        });
    }

    /// Asks a few random alive members (not the suspect) to probe the suspect for us.
    pub(super) fn send_inquiries(&mut self, id: &NodeIdentity, incarnation: u16, token: u32) {
        let want = self.timing.suspicion_inquiries;
        if want == 0 {
            return;
        }
        let members = &self.members;
        let mut candidates: Vec<SocketAddr> = self
            .foca
            .iter_membership_state()
            .filter(|m| {
                m.state() == State::Alive
                    && m.id().addr != id.addr
                    && members.get(&m.id().addr) == Some(m.id())
            })
            .map(|m| m.id().addr)
            .collect();
        let mut suspect = Vec::with_capacity(96);
        let update = foca::Member::new(id.clone(), incarnation, State::Suspect);
        if self.codec.encode_member(&update, &mut suspect).is_err() {
            return;
        }
        let inquiry = GossipMessage::Inquire {
            token,
            suspect: &suspect,
        };
        for _ in 0..want.min(candidates.len()) {
            let pick = self.sync_rng.random_range(0..candidates.len());
            let to = candidates.swap_remove(pick);
            self.seal(to, &inquiry);
        }
    }

    /// Serves a member's inquiry about a suspect: what we hold when it is news to the
    /// inquirer, else pings to the suspect and a verdict.
    pub(super) fn answer_inquiry(
        &mut self,
        now: Duration,
        from: SocketAddr,
        token: u32,
        mut suspect: &[u8],
    ) {
        let Some(requester) = self.members.get(&from).cloned() else {
            return;
        };
        let Ok(accused) = Codec::<NodeIdentity>::decode_member(&mut self.codec, &mut suspect)
        else {
            self.wire.metrics.rejected(RejectReason::Decode);
            return;
        };
        let id = accused.id();
        if id.addr == self.foca.identity().addr {
            // About ourselves: we are alive; refute at once.
            if id == self.foca.identity() {
                let mut io = self.wire.at(now);
                let suspect = std::iter::once(accused.clone());
                if let Err(err) = self.foca.apply_many(suspect, true, &mut io) {
                    tracing::debug!(error = %err, "refuting an inquiry about ourselves");
                }
            }
            self.send_verdict(from, token, Verdict::Reachable);
            return;
        }
        let news = self
            .foca
            .iter_membership_state()
            .find(|m| m.id().addr == id.addr)
            .filter(|m| {
                if m.id() == id {
                    m.state() == State::Down || m.incarnation() > accused.incarnation()
                } else {
                    m.id().bump > id.bump
                }
            })
            .map(|m| foca::Member::new(m.id().clone(), m.incarnation(), m.state()));
        if let Some(news) = news {
            self.send_updates(requester, &[news], 1);
            return;
        }
        if self.relays.len() >= MAX_RELAYS {
            return;
        }
        let nonce = self.sync_rng.random::<u64>();
        self.relays.push(Relay {
            requester: from,
            token,
            target: id.addr,
            bump: id.bump,
            nonce,
            attempts: 0,
        });
        self.relay_ping(now, nonce);
    }

    /// Pings the suspect of an inquiry again, or answers "unreachable" after the last ping.
    pub(super) fn relay_ping(&mut self, now: Duration, nonce: u64) {
        let Some(at) = self.relays.iter().position(|r| r.nonce == nonce) else {
            return;
        };
        let relay = &mut self.relays[at];
        if relay.attempts >= RELAY_ATTEMPTS {
            let relay = self.relays.swap_remove(at);
            // An unhealthy member's silence is no evidence: it confirms nothing.
            if self.wire.health.score() == 0 {
                self.send_verdict(relay.requester, relay.token, Verdict::Unreachable);
            }
            return;
        }
        relay.attempts += 1;
        let ping = GossipMessage::Ping {
            nonce,
            bump: relay.bump,
        };
        let target = relay.target;
        self.seal(target, &ping);
        let wait = self.wire.health.scale(self.timing.probe_rtt);
        self.wire.timers.push(now + wait, Task::Relay(nonce));
    }

    /// The suspect of an inquiry answered our ping (or a member the owner watch asked about
    /// answered ours: [`Core::watch_check_answered`]).
    pub(super) fn relay_answered(&mut self, from: SocketAddr, nonce: u64) {
        let Some(at) = self
            .relays
            .iter()
            .position(|r| r.nonce == nonce && r.target == from)
        else {
            self.watch_check_answered(|c| c.nonce == nonce && c.id.addr == from);
            return;
        };
        let relay = self.relays.swap_remove(at);
        self.send_verdict(relay.requester, relay.token, Verdict::Reachable);
    }

    pub(super) fn send_verdict(&mut self, to: SocketAddr, token: u32, verdict: Verdict) {
        self.seal(to, &GossipMessage::Verdict { token, verdict });
    }

    /// A member's verdict on one of our inquiries.
    pub(super) fn verdict(
        &mut self,
        now: Duration,
        from: SocketAddr,
        token: u32,
        verdict: Verdict,
    ) {
        if !self.members.contains_key(&from) {
            return;
        }
        let Some((&addr, s)) = self.suspicions.iter_mut().find(|(_, s)| s.token == token) else {
            if verdict == Verdict::Reachable {
                self.watch_check_answered(|c| c.token == token && c.id.addr != from);
            }
            return;
        };
        match verdict {
            Verdict::Unreachable => {
                if from == addr || s.confirmers.contains(&from) {
                    return;
                }
                s.confirmers.push(from);
            }
            Verdict::Reachable => {
                // Someone reached it: start over at the longest, and tell it so it refutes.
                s.since = now;
                s.confirmers.clear();
                let id = s.id.clone();
                self.send_suspicion_notice(id);
            }
        }
        self.schedule_suspicion(addr);
    }
}
