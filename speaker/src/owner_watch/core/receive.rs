//! What the watch receives: sealed datagrams on its socket, claims and refutations relayed by
//! the gossip, and what each asks of it (acknowledgements, polls and their answers, relays).

use std::net::SocketAddr;
use std::time::Duration;

use swimlb_proto::WatchMessage;

use super::{Purpose, WatchCore, Watched, watch_addr};
use crate::model::membership::NodeName;
use crate::owner_watch::metrics::{CheckResult, DropReason};
use crate::owner_watch::{Detector, Event, Heard};

impl WatchCore {
    /// Handles one received datagram from `from` (opened in place, hence `&mut`).
    pub fn handle_datagram(&mut self, now: Duration, from: SocketAddr, datagram: &mut [u8]) {
        let me = self.stream.sender();
        let opened = match self.wire.open(&self.ring, datagram, me, from) {
            Ok(opened) => opened,
            Err(swimlb_proto::Error::WrongReceiver) => {
                self.metrics.dropped(DropReason::WrongReceiver);
                return;
            }
            Err(_) => {
                self.metrics.dropped(DropReason::Unauthentic);
                return;
            }
        };
        let sender = self.senders.get(&opened.sequence.sender).cloned();
        let message = WatchMessage::parse(opened.payload);
        let stranger_poll = matches!(message, Ok(WatchMessage::Poll { .. }));
        if sender.is_none() && !stranger_poll {
            self.metrics.dropped(DropReason::UnknownSender);
            return;
        }
        if self.guard.admit(opened.sequence, now).is_err() {
            self.metrics.dropped(DropReason::Replay);
            return;
        }
        let Ok(message) = message else {
            self.metrics.dropped(DropReason::Malformed);
            return;
        };
        self.metrics.received(message.message_type());
        match sender {
            Some(sender) => self.handle(now, from, sender, &message),
            // A poll from a node that holds the key but is no member here: a watcher this node
            // declared down (falsely, or before its renewal reached here) still watches it,
            // and heartbeats it no more; unanswered, its second check would take over from a
            // live owner. Whether this node is alive is the one thing a poll asks.
            None => self.answer_poll(from, &message),
        }
        self.update_sizes();
    }

    /// Answers a poll: alive in the incarnation it asks about, and not paused. Whether this
    /// node answers for anything is the election's business (a watcher it stopped heartbeating
    /// learns it here).
    fn answer_poll(&mut self, from: SocketAddr, message: &WatchMessage<'_>) {
        if let WatchMessage::Poll { nonce, incarnation } = *message {
            let alive = incarnation == self.plan.me.bump && self.paused.is_none();
            self.send(from, &WatchMessage::PollReply { nonce, alive });
        }
    }

    /// Handles a watch `payload` that arrived through the gossip from the member at gossip
    /// address `from` ([`crate::gossip::Core::relay_watch`]; the gossip's envelope made it
    /// authentic and fresh). Only claims and refutations travel that way: anything else is
    /// dropped as malformed.
    pub fn handle_relayed(&mut self, now: Duration, from: SocketAddr, payload: &[u8]) {
        let Some(sender) = self
            .directory
            .values()
            .find(|id| id.addr == from)
            .map(|id| id.node.to_string())
        else {
            self.metrics.dropped(DropReason::UnknownSender);
            return;
        };
        let relayable = |m: &WatchMessage<'_>| {
            matches!(
                m,
                WatchMessage::Claim { .. }
                    | WatchMessage::Move { .. }
                    | WatchMessage::Heartbeat { seq: 0, .. }
            )
        };
        let (Ok(message), Some(watch_from)) = (WatchMessage::parse(payload), watch_addr(from))
        else {
            self.metrics.dropped(DropReason::Malformed);
            return;
        };
        if !relayable(&message) {
            self.metrics.dropped(DropReason::Malformed);
            return;
        }
        self.metrics.received(message.message_type());
        self.handle(now, watch_from, sender, &message);
        self.update_sizes();
    }

    /// Handles one authentic, admitted `message` from member `sender` at address `from`.
    fn handle(
        &mut self,
        now: Duration,
        from: SocketAddr,
        sender: NodeName,
        message: &WatchMessage<'_>,
    ) {
        match *message {
            WatchMessage::Heartbeat {
                incarnation,
                seq,
                interval_ms,
            } => self.heartbeat(now, from, &sender, incarnation, seq, interval_ms),
            WatchMessage::Ack { incarnation, .. } => {
                if incarnation == self.plan.me.bump
                    && let Some(schedule) = self.schedules.get_mut(&sender)
                {
                    schedule.acknowledged(now);
                }
            }
            WatchMessage::Poll { .. } => self.answer_poll(from, message),
            WatchMessage::PollReply { nonce, alive } => {
                self.poll_reply(now, &sender, nonce, alive);
            }
            WatchMessage::Relay { nonce, target } => {
                let Some(to) = watch_addr(target.addr) else {
                    self.metrics.dropped(DropReason::Malformed);
                    return;
                };
                let purpose = Purpose::Relay {
                    requester: from,
                    nonce,
                };
                let ours = self.new_poll(now, target.name, purpose);
                self.send(
                    to,
                    &WatchMessage::Poll {
                        nonce: ours,
                        incarnation: target.bump,
                    },
                );
            }
            WatchMessage::Claim {
                ip,
                claimant,
                accused,
                ..
            } => {
                if claimant.name != sender {
                    self.metrics.dropped(DropReason::Malformed);
                    return;
                }
                self.events.push(Event::Claimed {
                    claimant: sender,
                    accused: accused.name.to_string(),
                    incarnation: accused.bump,
                    ip,
                });
            }
            WatchMessage::Move { ip, from, to, .. } => {
                if (from.name != sender && to.name != sender) || from.name == to.name {
                    self.metrics.dropped(DropReason::Malformed);
                    return;
                }
                self.events.push(Event::Moved {
                    sender,
                    ip,
                    from: from.name.to_string(),
                    to: to.name.to_string(),
                });
            }
        }
    }

    fn poll_reply(&mut self, now: Duration, sender: &str, nonce: u64, alive: bool) {
        let Some(poll) = self.polls.remove(&nonce) else {
            self.metrics.dropped(DropReason::Stale);
            return;
        };
        match poll.purpose {
            Purpose::SecondCheck => {}
            Purpose::Relay { requester, nonce } => {
                if sender == poll.target {
                    self.send(requester, &WatchMessage::PollReply { nonce, alive });
                }
                return;
            }
            Purpose::Accusation { incarnation } => {
                if alive
                    && self.plan.accused.get(&poll.target) == Some(&incarnation)
                    && self.rechecks.remove(&poll.target).is_some()
                {
                    self.heard_alive(&poll.target);
                    self.events.push(Event::Alive {
                        node: poll.target,
                        incarnation,
                    });
                }
                return;
            }
            Purpose::Ahead { incarnation } => {
                if alive
                    && self
                        .ahead
                        .get(&poll.target)
                        .is_some_and(|c| c.incarnation == incarnation)
                {
                    self.metrics.checked(CheckResult::Vouched);
                    self.ahead.remove(&poll.target);
                }
                return;
            }
        }
        if alive && let Some(w) = self.watched.get_mut(&poll.target) {
            self.metrics.checked(CheckResult::Vouched);
            w.vouches_without_beat += 1;
            if w.vouches_without_beat >= 2 {
                // Alive but no longer heartbeating here: not its watcher any more.
                self.watched.remove(&poll.target);
            } else {
                w.detector.vouched(now);
                w.checks_sent = 0;
            }
        }
    }

    fn heartbeat(
        &mut self,
        now: Duration,
        from: SocketAddr,
        sender: &str,
        incarnation: u64,
        seq: u64,
        interval_ms: u16,
    ) {
        if self.plan.accused.get(sender) == Some(&incarnation) {
            self.heard_alive(sender);
            self.events.push(Event::Alive {
                node: sender.to_string(),
                incarnation,
            });
        }
        if seq == 0 {
            // A refutation, not a watch heartbeat.
            return;
        }
        let Some(known) = self.directory.get(sender) else {
            self.metrics.dropped(DropReason::UnknownSender);
            return;
        };
        if incarnation < known.bump {
            self.metrics.dropped(DropReason::Stale);
            return;
        }
        let (addr, bump) = (known.addr, known.bump);
        let knobs = self.knobs;
        let w = self
            .watched
            .entry(sender.to_string())
            .or_insert_with(|| Watched {
                detector: Detector::new(&knobs, incarnation),
                checks_sent: 0,
                vouches_without_beat: 0,
                last_heard: now,
                silent_at: None,
            });
        let interval = Duration::from_millis(u64::from(interval_ms));
        match w.detector.heard(now, incarnation, seq, interval) {
            Heard::Fresh { ack } => {
                w.checks_sent = 0;
                w.vouches_without_beat = 0;
                w.last_heard = now;
                if ack {
                    self.send(from, &WatchMessage::Ack { incarnation, seq });
                }
                if incarnation == bump {
                    self.note_alive(now, addr, bump);
                }
            }
            Heard::StaleIncarnation | Heard::OldSeq => self.metrics.dropped(DropReason::Stale),
        }
    }
}
