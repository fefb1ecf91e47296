//! What the gossip's datagrams are (`sim --kinds`): every datagram a core sends is opened
//! again with the simulation's key (as its receiver would) and counted by what it carries: a
//! foca message by its kind (probes, acknowledgements, indirect probes, periodic gossip,
//! announces...), or one of the speaker's own messages (metadata, digests, inquiries...).
//! Counted when sent, before the loss, as the traffic is.

use foca::Codec;
use swimlb_proto::gossip::GossipMessage;
use swimlb_speaker::gossip::WireRule;
use swimlb_speaker::gossip::replay::sender_id;
use swimlb_speaker::gossip::simnet::Tapped;

use super::*;

/// Datagram counts by kind.
#[derive(Debug)]
pub(super) struct Kinds {
    ring: KeyRing,
    rule: WireRule,
    /// The sender id of each member's address (the receiver an envelope is opened for).
    receivers: BTreeMap<SocketAddr, u64>,
    pub(super) counts: BTreeMap<&'static str, u64>,
}

impl Kinds {
    /// Counts nothing yet.
    pub(super) fn new() -> anyhow::Result<Kinds> {
        Ok(Kinds {
            ring: KeyRing::new("swimlb-sim", &[KEY])?,
            rule: WireRule::default(),
            receivers: BTreeMap::new(),
            counts: BTreeMap::new(),
        })
    }

    /// Counts each datagram of `tapped` by its kind.
    pub(super) fn count(&mut self, tapped: Vec<Tapped>) {
        for mut t in tapped {
            let me = *self
                .receivers
                .entry(t.to)
                .or_insert_with(|| sender_id(t.to));
            let kind = match self.rule.open(&self.ring, &mut t.bytes, me, t.from) {
                Ok(opened) => kind_of(opened.payload),
                Err(_) => "unopened",
            };
            *self.counts.entry(kind).or_default() += 1;
        }
    }
}

/// The kind of an opened gossip payload.
fn kind_of(payload: &[u8]) -> &'static str {
    let Ok(message) = GossipMessage::parse(payload) else {
        return "undecoded";
    };
    match message {
        GossipMessage::Foca(body) => {
            let header: Result<foca::Header<NodeIdentity>, _> =
                foca::PostcardCodec.decode_header(body);
            let Ok(header) = header else {
                return "foca_undecoded";
            };
            match header.message {
                foca::Message::Ping(_) => "ping",
                foca::Message::Ack(_) => "ack",
                foca::Message::PingReq { .. } => "ping_req",
                foca::Message::IndirectPing { .. } => "indirect_ping",
                foca::Message::IndirectAck { .. } => "indirect_ack",
                foca::Message::ForwardedAck { .. } => "forwarded_ack",
                foca::Message::Announce => "announce",
                foca::Message::Feed => "feed",
                foca::Message::Gossip => "gossip",
                foca::Message::Broadcast => "broadcast",
                foca::Message::TurnUndead => "turn_undead",
            }
        }
        GossipMessage::Meta(_) => "meta",
        GossipMessage::MetaPull { .. } => "meta_pull",
        GossipMessage::Sync { .. } => "sync",
        GossipMessage::Inquire { .. } => "inquire",
        GossipMessage::Ping { .. } => "inquiry_ping",
        GossipMessage::Pong { .. } => "inquiry_pong",
        GossipMessage::Verdict { .. } => "verdict",
        GossipMessage::Watch(_) => "watch_relay",
    }
}
