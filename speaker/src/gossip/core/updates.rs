//! What the core sends of the membership (see the parent module's docs): foca updates packed
//! for one member, the digest exchange that finds what a member misses, and this node's record.

use super::*;

/// A down is repeated in a digest's answer only for a member unheard this long: one that talks
/// to us is told directly ([`Core::tell_down`]), and the first probes after a down are its
/// chance to.
const DOWN_UNHEARD: Duration = Duration::from_secs(1);

impl Core {
    /// Sends `updates` to `to` as foca gossip messages (foca applies them as it applies the
    /// updates any message piggybacks), packed into at most `max_datagrams` datagrams of at
    /// most the configured packet size; what does not fit is not sent. Returns how many updates
    /// went out.
    pub(super) fn send_updates(
        &mut self,
        to: NodeIdentity,
        updates: &[foca::Member<NodeIdentity>],
        max_datagrams: usize,
    ) -> usize {
        let Some(head) = self.foca_header(&to, Message::Gossip) else {
            return 0;
        };
        let limit = self.timing.max_packet_size;
        let (mut sent, mut datagrams) = (0, 0);
        let mut packed = Vec::with_capacity(limit);
        let mut count: u16 = 0;
        let mut one = Vec::with_capacity(128);
        for update in updates {
            one.clear();
            // An update that does not encode, or is larger than a packet on its own, is skipped.
            if self.codec.encode_member(update, &mut one).is_err()
                || head.len() + 2 + one.len() > limit
            {
                continue;
            }
            if head.len() + 2 + packed.len() + one.len() > limit || count == u16::MAX {
                self.seal_updates(to.addr, &head, count, &packed);
                sent += usize::from(count);
                datagrams += 1;
                packed.clear();
                count = 0;
                if datagrams == max_datagrams {
                    return sent;
                }
            }
            packed.extend_from_slice(&one);
            count += 1;
        }
        if count > 0 && datagrams < max_datagrams {
            self.seal_updates(to.addr, &head, count, &packed);
            sent += usize::from(count);
        }
        sent
    }

    /// The encoded header of a foca message from this node to `to` (incarnation 0, as foca's
    /// own messages carry), or `None` when it does not encode.
    pub(super) fn foca_header(
        &mut self,
        to: &NodeIdentity,
        message: Message<NodeIdentity>,
    ) -> Option<Vec<u8>> {
        let header = Header {
            src: self.foca.identity().clone(),
            src_incarnation: 0,
            dst: to.clone(),
            message,
        };
        let mut head = Vec::with_capacity(128);
        self.codec.encode_header(&header, &mut head).ok()?;
        Some(head)
    }

    /// Seals one foca message: `head`, then `count` and the `packed` updates.
    pub(super) fn seal_updates(&mut self, to: SocketAddr, head: &[u8], count: u16, packed: &[u8]) {
        let mut body = Vec::with_capacity(head.len() + 2 + packed.len());
        body.extend_from_slice(head);
        body.extend_from_slice(&count.to_be_bytes());
        body.extend_from_slice(packed);
        self.seal(to, &GossipMessage::Foca(&body));
    }

    /// The digest of the members this node holds alive, itself included.
    pub(super) fn digest(&self, bits: u8) -> Digest {
        self.digest.digest(bits, self.foca.identity())
    }

    /// Holds `id` alive at its address (replacing whoever was held there).
    pub(super) fn hold_member(&mut self, id: NodeIdentity) {
        self.members_version += 1;
        self.digest.toggle(&id);
        if let Some(previous) = self.members.insert(id.addr, id) {
            self.digest.toggle(&previous);
        }
    }

    /// Stops holding the member at `addr`.
    pub(super) fn drop_member(&mut self, addr: &SocketAddr) {
        if let Some(previous) = self.members.remove(addr) {
            self.members_version += 1;
            self.digest.toggle(&previous);
        }
    }

    /// Sends our digest to one random alive member (see [`super::sync`]).
    pub(super) fn start_sync(&mut self) {
        if self.members.is_empty() || self.phase != Phase::Active {
            return;
        }
        // Picked in foca's member order, not the hash map's, so a seeded run repeats itself.
        let pick = self.sync_rng.random_range(0..self.members.len());
        let members = &self.members;
        let Some(to) = self
            .foca
            .iter_membership_state()
            .map(|m| m.id())
            .filter(|id| members.get(&id.addr) == Some(*id))
            .nth(pick)
            .map(|id| id.addr)
        else {
            return;
        };
        let digest = self.digest(Digest::bits_for(self.members.len() + 1)).wire();
        self.seal(to, &GossipMessage::Sync { echo: true, digest });
    }

    /// Answers a member's digest: the members we hold alive in every bucket that differs, the
    /// identities we hold down there (whose address we hold under no other identity), and our
    /// own digest when asked for and different.
    ///
    /// The downs: a down is final for an identity, and only the member can end it, by renewing
    /// when it hears of it. A member declared down here while the path between it and this node
    /// was cut (it was paused, the gossip between the two cut) never hears of it from here; a
    /// peer that holds it alive (one that restarted after the down's transmissions ran out)
    /// gossips it alive, which this node ignores. Told the down, the peer holds it down too and
    /// spreads it to the member, which renews; both then take it back under its new identity.
    /// Without it, in a chaos run, this node kept electing without a live owner (and answering
    /// its IP beside it) until the cut healed, while the third member named the owner.
    pub(super) fn answer_digest(
        &mut self,
        now: Duration,
        from: SocketAddr,
        theirs: &Digest,
        echo: bool,
    ) {
        // Only a member we hold alive can be addressed (foca takes gossip only for its current
        // identity); an unknown sender is learned from the gossip and syncs later.
        let Some(peer) = self.members.get(&from).cloned() else {
            return;
        };
        let ours = self.digest(theirs.bits());
        let mask = ours.differing(theirs);
        if mask == 0 {
            return;
        }
        // Downs only from a node that holds at least as many members alive as down (the
        // larger side of a healed partition; the smaller side's downs are its own isolation,
        // see `alive_and_down`), and only of members unheard for [`DOWN_UNHEARD`] that have
        // not talked to us since (those are told directly, see `tell_down`).
        let (alive, down) = self.alive_and_down();
        let push_downs = alive >= down;
        let told = &self.told_down;
        let heard = &self.heard_before_down;
        let unheard = |id: &NodeIdentity| {
            heard
                .get(id.node.as_str())
                .is_some_and(|at| now.saturating_sub(*at) >= DOWN_UNHEARD)
                && told.get(&id.addr).is_none_or(|t| t.member != *id)
        };
        let members = &self.members;
        let updates: Vec<foca::Member<NodeIdentity>> = self
            .foca
            .iter_membership_state()
            .filter(|m| {
                // No suspicion: it travels with the gossip and its refutation; repeated here it
                // reached members that had already settled it (measured: 326 false downs in
                // 600 s at 5 % loss with 100 members, none without).
                let held = members.get(&m.id().addr);
                let alive = m.state() == State::Alive && held == Some(m.id());
                let down =
                    push_downs && m.state() == State::Down && held.is_none() && unheard(m.id());
                (alive || down) && m.id() != &peer && ours.in_mask(mask, m.id())
            })
            .map(|m| foca::Member::new(m.id().clone(), m.incarnation(), m.state()))
            .collect();
        let sent = self.send_updates(peer, &updates, SYNC_MAX_DATAGRAMS);
        self.wire.metrics.sync_updates(sent);
        if echo {
            let digest = ours.wire();
            self.seal(
                from,
                &GossipMessage::Sync {
                    echo: false,
                    digest,
                },
            );
        }
    }

    pub(super) fn seal(&mut self, to: SocketAddr, message: &GossipMessage<'_>) {
        self.wire.seal(to, message);
    }

    /// Answers a pull: our own record when it names nobody or us, else the newest record we
    /// hold of the node it names (none held: no answer; the puller asks another member next
    /// time). A name that is not UTF-8 is a counted drop.
    pub(super) fn answer_pull(&mut self, to: SocketAddr, node: &[u8]) {
        if node.is_empty() || node == self.own.node.as_bytes() {
            return self.send_own_record(to);
        }
        let Ok(node) = std::str::from_utf8(node) else {
            self.wire.metrics.rejected(RejectReason::Decode);
            return;
        };
        let record = self.book.lock().get(node).map(MetaRecord::encode);
        if let Some(Ok(bytes)) = record {
            self.seal(to, &GossipMessage::Meta(&bytes));
        }
    }

    /// Sends our metadata record to `to`.
    pub(super) fn send_own_record(&mut self, to: SocketAddr) {
        let record = std::mem::take(&mut self.own_record);
        self.seal(to, &GossipMessage::Meta(&record));
        self.own_record = record;
    }
}
