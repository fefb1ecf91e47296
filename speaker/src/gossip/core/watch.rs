//! The owner watch's second path, through the gossip: claims and refutations sent to every
//! member and received ([`Core::relay_watch`], [`Core::drain_watch`]), and the checks of a
//! member the watch accuses, carried out with the gossip's own pings and inquiries.
//!
//! Why the checks: the watch checks a member it accuses again and again (a poll, and a relay
//! request to a third member, on the watch port), and the first answer ends the accusation.
//! When the accused owner's datagrams to the accuser are cut, and its watch datagrams to the
//! third member too, every path of that check is cut while the gossip's paths through the
//! third member still carry the owner's answers (the gossip holds it alive). The model checker
//! found it: the accuser answered beside the owner until the cut ended. So the watch asks the
//! gossip as well: a direct gossip ping, and an inquiry to a few members, who ping the member
//! on its gossip port in the accused identity. An answer is handed to the watch as the
//! refutation it amounts to.

use swimlb_proto::WatchMessage;
use swimlb_proto::heartbeat;

use super::*;

/// The most checks of the watch's remembered at once (the oldest is forgotten first). The
/// watch asks once per recheck round, every poll wait (100 ms), per accused member; an answer
/// comes within a few round trips.
const MAX_WATCH_CHECKS: usize = 32;

/// An owner-watch payload that arrived through the gossip: a claim or a refutation, sent this
/// way as well as on the watch port (see [`Core::relay_watch`]), or the refutation a check of
/// the watch's found (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchRelayed {
    /// The gossip address of the member that sent it (of the member found alive, for a check).
    pub from: SocketAddr,
    /// The watch payload, unopened by the gossip.
    pub payload: Vec<u8>,
}

/// A check of a member the watch asked for: a direct ping (`nonce`) and an inquiry (`token`).
#[derive(Debug)]
pub(super) struct WatchCheck {
    pub(super) token: u32,
    pub(super) nonce: u64,
    pub(super) id: NodeIdentity,
}

impl Core {
    /// The owner-watch payloads received through the gossip since the last call.
    pub fn drain_watch(&mut self) -> std::vec::Drain<'_, WatchRelayed> {
        self.watch_inbox.drain(..)
    }

    /// Sends an owner-watch `payload` (a claim or a refutation) to every alive member through
    /// the gossip, beside the watch's own copy on its port: a watch port dropped one way then
    /// keeps neither from its member.
    ///
    /// A relay request (the watch asks a third member to poll a member it accuses) is not sent:
    /// the gossip carries it out itself, with its own ping of the member and an inquiry to a few
    /// members (see the module docs); an answer in the identity asked about comes back through
    /// [`Core::drain_watch`] as that member's refutation.
    pub fn relay_watch(&mut self, payload: &[u8]) {
        if let Ok(WatchMessage::Relay { target, .. }) = WatchMessage::parse(payload) {
            self.check_for_watch(target.name, target.addr, target.bump);
            return;
        }
        // In address order: the simulation draws loss and delay per datagram, in send order.
        let mut members: Vec<SocketAddr> = self.members.keys().copied().collect();
        members.sort_unstable();
        for to in members {
            self.seal(to, &GossipMessage::Watch(payload));
        }
    }

    /// Pings the member `name` at `addr` in identity `bump`, and asks a few others to: only a
    /// member held alive in that identity.
    fn check_for_watch(&mut self, name: &str, addr: SocketAddr, bump: u64) {
        let Some(id) = self
            .members
            .get(&addr)
            .filter(|id| id.node == name && id.bump == bump)
            .cloned()
        else {
            return;
        };
        let Some(incarnation) = self
            .foca
            .iter_membership_state()
            .find(|m| m.id() == &id && m.state() != State::Down)
            .map(|m| m.incarnation())
        else {
            return;
        };
        self.next_token = self.next_token.wrapping_add(1);
        let token = self.next_token;
        let nonce = self.sync_rng.random::<u64>();
        if self.watch_checks.len() >= MAX_WATCH_CHECKS {
            self.watch_checks.pop_front();
        }
        self.watch_checks.push_back(WatchCheck {
            token,
            nonce,
            id: id.clone(),
        });
        self.seal(addr, &GossipMessage::Ping { nonce, bump });
        self.send_inquiries(&id, incarnation, token);
    }

    /// A check the first of `matches` names was answered (a pong to its ping, or a "reachable"
    /// verdict on its inquiry): the watch is handed the member's refutation in the identity
    /// checked (a heartbeat of sequence 0, which ends an accusation of that incarnation).
    pub(super) fn watch_check_answered(&mut self, matches: impl Fn(&WatchCheck) -> bool) {
        let Some(check) = self
            .watch_checks
            .iter()
            .position(matches)
            .and_then(|at| self.watch_checks.remove(at))
        else {
            return;
        };
        let refutation = WatchMessage::Heartbeat {
            incarnation: check.id.bump,
            seq: 0,
            interval_ms: 1,
        };
        let mut payload = vec![0u8; heartbeat::MAX_LEN];
        if let Ok(len) = refutation.emit(&mut payload) {
            payload.truncate(len);
            self.watch_inbox.push(WatchRelayed {
                from: check.id.addr,
                payload,
            });
        }
    }
}
