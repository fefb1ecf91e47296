//! The payloads the core writes, byte for byte against `swimlb_proto::golden` (packed by
//! Python's `struct`, not by this crate), and golden payloads fed to a real core.

use std::net::SocketAddr;
use std::time::Duration;

use foca::{Codec, Member, State};
use swimlb_proto::{KeyRing, golden};

use super::*;

const BUMP: u64 = 1_700_000_000_000;
const NONCE: u64 = 0x0102_0304_0506_0708;
const TOKEN: u32 = 42;

fn ring() -> KeyRing {
    KeyRing::new("wire-tests", &[[3; 32]]).unwrap()
}

fn addr(last: u8) -> SocketAddr {
    SocketAddr::from(([192, 0, 2, last], 7946))
}

fn peer(last: u8) -> NodeIdentity {
    NodeIdentity {
        node: format!("peer-{last}").into(),
        addr: addr(last),
        bump: 5,
    }
}

fn core() -> Core {
    let settings = GossipSettings {
        node: "a".into(),
        addr: addr(1),
        seeds: Vec::new(),
        timing: Timing::fast(),
        bump: BUMP,
        rng_seed: 1,
    };
    let mut core = Core::new(
        settings,
        ring(),
        MemberMeta::new("a"),
        GossipMetrics::default(),
        Duration::ZERO,
    )
    .unwrap();
    core.drain_outgoing().for_each(drop);
    core
}

/// A core that holds `peer(2)` and `peer(3)` alive (their records not asked for), nothing
/// queued.
fn core_with_two_peers() -> (Core, NodeIdentity, NodeIdentity) {
    let mut core = core();
    let (b, c) = (peer(2), peer(3));
    let alive = [b.clone(), c.clone()].map(|id| Member::new(id, 0, State::Alive));
    let mut io = core.wire.at(Duration::ZERO);
    core.foca
        .apply_many(alive.into_iter(), true, &mut io)
        .unwrap();
    core.settle(Duration::ZERO);
    core.missing_meta.clear();
    core.drain_outgoing().for_each(drop);
    (core, b, c)
}

/// The payloads the core queued, opened, with their destinations.
fn sent(core: &mut Core) -> Vec<(SocketAddr, Vec<u8>)> {
    let ring = ring();
    core.drain_outgoing()
        .map(|mut out| {
            let payload = ring.open(&mut out.bytes).unwrap().to_vec();
            (out.to, payload)
        })
        .collect()
}

/// Seals `payload` as a peer would and hands it to the core from `from`.
fn receive(core: &mut Core, from: SocketAddr, payload: &[u8]) {
    let mut sealed = Vec::new();
    ring().seal(payload, &mut sealed).unwrap();
    core.handle_datagram(Duration::from_millis(1), from, &mut sealed);
}

#[test]
fn verdicts_are_written_as_the_golden_bytes() {
    let mut core = core();
    core.send_verdict(addr(2), TOKEN, Verdict::Reachable);
    core.send_verdict(addr(2), TOKEN, Verdict::Unreachable);
    assert_eq!(
        sent(&mut core),
        [
            (addr(2), golden::GOSSIP_VERDICT_REACHABLE.to_vec()),
            (addr(2), golden::GOSSIP_VERDICT_UNREACHABLE.to_vec()),
        ]
    );
}

#[test]
fn a_relayed_ping_is_written_as_the_golden_bytes() {
    let mut core = core();
    core.relays.push(Relay {
        requester: addr(2),
        token: TOKEN,
        target: addr(3),
        bump: BUMP,
        nonce: NONCE,
        attempts: 0,
    });
    core.relay_ping(Duration::ZERO, NONCE);
    assert_eq!(sent(&mut core), [(addr(3), golden::GOSSIP_PING.to_vec())]);
}

#[test]
fn the_golden_ping_is_answered_with_the_golden_pong() {
    let mut core = core();
    receive(&mut core, addr(2), &golden::GOSSIP_PING);
    assert_eq!(sent(&mut core), [(addr(2), golden::GOSSIP_PONG.to_vec())]);
    assert_eq!(core.metrics().rejected_count(RejectReason::Decode), 0);
}

#[test]
fn a_pull_is_written_as_the_golden_bytes_and_the_golden_pull_is_answered_with_the_record() {
    let mut core = core();
    core.missing_meta.insert("b".into());
    core.by_node.insert("b".into(), addr(2));
    core.housekeeping(Duration::ZERO);
    assert_eq!(
        sent(&mut core),
        [(addr(2), golden::GOSSIP_META_PULL.to_vec())]
    );

    receive(&mut core, addr(3), &golden::GOSSIP_META_PULL);
    let answers = sent(&mut core);
    assert_eq!(answers.len(), 1);
    let (to, payload) = &answers[0];
    assert_eq!(*to, addr(3));
    assert_eq!(payload[0], golden::GOSSIP_META[0]);
    let record = MetaRecord::decode(&payload[1..]).unwrap();
    assert_eq!((record.bump, record.meta.node.as_str()), (BUMP, "a"));
}

#[test]
fn a_missing_record_is_pulled_from_another_member_too_which_answers_with_the_record_it_holds() {
    let (mut core, b, c) = core_with_two_peers();
    core.missing_meta.insert("node3".into());
    core.by_node.insert("node3".into(), b.addr);
    core.housekeeping(Duration::ZERO);
    assert_eq!(
        sent(&mut core),
        [
            (b.addr, golden::GOSSIP_META_PULL.to_vec()),
            (c.addr, golden::GOSSIP_META_PULL_OF.to_vec()),
        ]
    );

    // Asked for node3's record: the one held goes back; none held, no answer.
    receive(&mut core, c.addr, &golden::GOSSIP_META_PULL_OF);
    assert_eq!(sent(&mut core), []);
    let held = MetaRecord {
        bump: 9,
        meta: MemberMeta::new("node3"),
    };
    core.book.lock().offer(held.clone());
    receive(&mut core, c.addr, &golden::GOSSIP_META_PULL_OF);
    let mut expected = vec![golden::GOSSIP_META[0]];
    expected.extend(held.encode().unwrap());
    assert_eq!(sent(&mut core), [(c.addr, expected)]);
    // A name that is not UTF-8 is a counted drop.
    receive(&mut core, c.addr, &[golden::GOSSIP_META_PULL[0], 0xff]);
    assert_eq!(sent(&mut core), []);
    assert_eq!(core.metrics().rejected_count(RejectReason::Decode), 1);
}

#[test]
fn a_digest_is_written_as_the_golden_bytes() {
    let Ok(GossipMessage::Sync { echo, digest }) = GossipMessage::parse(&golden::GOSSIP_SYNC)
    else {
        panic!("the golden digest parses");
    };
    let digest = Digest::from(digest).wire();
    let mut core = core();
    core.seal(addr(2), &GossipMessage::Sync { echo, digest });
    assert_eq!(sent(&mut core), [(addr(2), golden::GOSSIP_SYNC.to_vec())]);
}

#[test]
fn an_inquiry_is_framed_as_the_golden_bytes_and_one_about_us_is_answered_reachable() {
    let (mut core, b, c) = core_with_two_peers();

    core.timing.suspicion_inquiries = 1;
    core.send_inquiries(&c, 0, TOKEN);
    let mut suspect = Vec::new();
    let update = Member::new(c.clone(), 0, State::Suspect);
    core.codec.encode_member(&update, &mut suspect).unwrap();
    let mut expected = golden::GOSSIP_INQUIRE[..5].to_vec();
    expected.extend_from_slice(&suspect);
    assert_eq!(sent(&mut core), [(b.addr, expected)]);

    let me = Member::new(core.identity().clone(), 0, State::Suspect);
    let mut about_us = golden::GOSSIP_INQUIRE[..5].to_vec();
    core.codec.encode_member(&me, &mut about_us).unwrap();
    receive(&mut core, b.addr, &about_us);
    let verdicts: Vec<_> = sent(&mut core)
        .into_iter()
        .filter(|(_, p)| p[0] == golden::GOSSIP_VERDICT_REACHABLE[0])
        .collect();
    assert_eq!(
        verdicts,
        [(b.addr, golden::GOSSIP_VERDICT_REACHABLE.to_vec())]
    );
}

#[test]
fn a_foca_packet_follows_the_golden_kind_byte() {
    let mut core = core();
    core.set_seeds(Duration::ZERO, vec![addr(9)]);
    let announces = sent(&mut core);
    assert_eq!(announces.len(), 1);
    let (to, payload) = &announces[0];
    assert_eq!(*to, addr(9));
    assert_eq!(payload[0], golden::GOSSIP_FOCA[0]);
    let header: Header<NodeIdentity> = core.codec.decode_header(&mut &payload[1..]).unwrap();
    assert_eq!(header.message, Message::Announce);
}

#[test]
fn malformed_payloads_are_dropped_and_counted_as_decode_errors() {
    let mut core = core();
    let mut bad_verdict = golden::GOSSIP_VERDICT_REACHABLE;
    bad_verdict[5] = 2;
    let mut long_pong = golden::GOSSIP_PONG.to_vec();
    long_pong.push(0);
    let mut bad_flags = golden::GOSSIP_SYNC;
    bad_flags[1] = 2;
    let payloads: [&[u8]; 7] = [
        &[],
        &[9],
        &[swimlb_proto::heartbeat::KIND, 1, 1],
        &bad_verdict,
        &long_pong,
        &bad_flags,
        &golden::GOSSIP_PING[..16],
    ];
    for payload in payloads {
        receive(&mut core, addr(2), payload);
    }
    assert!(sent(&mut core).is_empty());
    let metrics = core.metrics();
    assert_eq!(metrics.rejected_count(RejectReason::Decode), 7);
    assert_eq!(metrics.rejected_count(RejectReason::Metadata), 0);
    receive(&mut core, addr(2), &golden::GOSSIP_META);
    assert_eq!(core.metrics().rejected_count(RejectReason::Metadata), 1);
}

#[test]
fn a_watch_payload_goes_to_every_member_as_the_golden_bytes_and_comes_out_for_the_watch() {
    let mut core = core();
    core.hold_member(peer(2));
    core.hold_member(peer(3));
    let refutation = &golden::GOSSIP_WATCH[1..];
    core.relay_watch(refutation);
    let mut out = sent(&mut core);
    out.sort();
    assert_eq!(
        out,
        [
            (addr(2), golden::GOSSIP_WATCH.to_vec()),
            (addr(3), golden::GOSSIP_WATCH.to_vec()),
        ]
    );
    receive(&mut core, addr(2), &golden::GOSSIP_WATCH);
    assert_eq!(
        core.drain_watch().collect::<Vec<_>>(),
        [WatchRelayed {
            from: addr(2),
            payload: refutation.to_vec(),
        }]
    );
    assert_eq!(core.drain_watch().count(), 0);
}

/// `payload` as a peer would emit it.
fn emitted(message: &GossipMessage<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    message.emit_vec(&mut out);
    out
}

/// The owner watch's relay request about `id` (its recheck of an accused member).
fn relay_request(id: &NodeIdentity) -> Vec<u8> {
    use swimlb_proto::WatchMessage;
    use swimlb_proto::heartbeat::NodeRef;
    let target = NodeRef {
        name: id.node.as_str(),
        addr: id.addr,
        bump: id.bump,
    };
    let mut payload = vec![0u8; swimlb_proto::heartbeat::MAX_LEN];
    let len = WatchMessage::Relay { nonce: 9, target }
        .emit(&mut payload)
        .unwrap();
    payload.truncate(len);
    payload
}

/// The refutation the watch is handed for `id`, parsed: (incarnation, seq).
fn refutations(core: &mut Core) -> Vec<(SocketAddr, u64, u64)> {
    use swimlb_proto::WatchMessage;
    core.drain_watch()
        .map(|r| match WatchMessage::parse(&r.payload) {
            Ok(WatchMessage::Heartbeat {
                incarnation, seq, ..
            }) => (r.from, incarnation, seq),
            other => panic!("not a refutation: {other:?}"),
        })
        .collect()
}

#[test]
fn a_watch_relay_request_is_checked_by_the_gossip_and_an_answer_comes_out_as_a_refutation() {
    let (mut core, b, c) = core_with_two_peers();
    core.relay_watch(&relay_request(&b));
    let out = sent(&mut core);
    // Sent to nobody as a watch payload: a ping to the member, an inquiry to the other.
    let (mut nonce, mut token) = (None, None);
    for (to, payload) in &out {
        match GossipMessage::parse(payload).unwrap() {
            GossipMessage::Ping { nonce: n, bump } if *to == b.addr && bump == b.bump => {
                nonce = Some(n);
            }
            GossipMessage::Inquire { token: t, .. } if *to == c.addr => token = Some(t),
            other => panic!("unexpected {other:?} to {to}"),
        }
    }
    let (nonce, token) = (nonce.expect("a ping"), token.expect("an inquiry"));
    // An "unreachable" verdict, or a pong from another address, says nothing.
    let unreachable = Verdict::Unreachable;
    let verdict = |verdict| emitted(&GossipMessage::Verdict { token, verdict });
    receive(&mut core, c.addr, &verdict(unreachable));
    receive(&mut core, c.addr, &emitted(&GossipMessage::Pong { nonce }));
    assert_eq!(refutations(&mut core), []);
    // The other member reached it: the watch gets its refutation in that identity, once.
    receive(&mut core, c.addr, &verdict(Verdict::Reachable));
    assert_eq!(refutations(&mut core), [(b.addr, b.bump, 0)]);
    receive(&mut core, b.addr, &emitted(&GossipMessage::Pong { nonce }));
    assert_eq!(refutations(&mut core), []);

    // A new round answered by the member itself.
    core.relay_watch(&relay_request(&b));
    let ping =
        sent(&mut core)
            .into_iter()
            .find_map(|(to, p)| match GossipMessage::parse(&p).unwrap() {
                GossipMessage::Ping { nonce, .. } if to == b.addr => Some(nonce),
                _ => None,
            });
    let pong = emitted(&GossipMessage::Pong {
        nonce: ping.expect("a ping"),
    });
    receive(&mut core, b.addr, &pong);
    assert_eq!(refutations(&mut core), [(b.addr, b.bump, 0)]);

    // An identity the gossip does not hold alive (renewed since, or unknown): nothing is sent.
    let old = NodeIdentity { bump: 4, ..b };
    core.relay_watch(&relay_request(&old));
    core.relay_watch(&relay_request(&peer(7)));
    assert_eq!(sent(&mut core), []);
}
