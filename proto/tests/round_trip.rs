//! Property tests: `parse(emit(x)) == x` for every Repr, and no panic on arbitrary bytes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use proptest::prelude::*;
use swimlb_proto::arp::{self, ArpOperation, ArpRepr};
use swimlb_proto::ethernet::{EtherType, EthernetRepr, MacAddr};
use swimlb_proto::gossip::{self, Digest, GossipMessage, Verdict};
use swimlb_proto::heartbeat::{self, NodeRef, WatchMessage};
use swimlb_proto::ndp::{self, NdpFrame, NdpMessage, NdpRepr, NeighborFlags};
use swimlb_proto::vrrp::{self, VrrpAddresses, VrrpFrame, VrrpRepr};
use swimlb_proto::{Frame, golden};

fn mac() -> impl Strategy<Value = MacAddr> {
    any::<[u8; 6]>().prop_map(|o| MacAddr(o[0], o[1], o[2], o[3], o[4], o[5]))
}

fn ipv4() -> impl Strategy<Value = Ipv4Addr> {
    any::<[u8; 4]>().prop_map(Ipv4Addr::from)
}

fn ipv6() -> impl Strategy<Value = Ipv6Addr> {
    any::<[u8; 16]>().prop_map(Ipv6Addr::from)
}

fn unicast_ipv6() -> impl Strategy<Value = Ipv6Addr> {
    ipv6().prop_filter("unicast, specified", |a| {
        !a.is_multicast() && !a.is_unspecified()
    })
}

fn ethertype() -> impl Strategy<Value = EtherType> {
    any::<u16>().prop_map(EtherType::from)
}

fn ndp_frame() -> impl Strategy<Value = NdpFrame> {
    let solicit = (
        unicast_ipv6(),
        prop_oneof![Just(None), unicast_ipv6().prop_map(Some)],
        any::<bool>(),
        proptest::option::of(mac()),
    )
        .prop_map(|(target, src, to_snm, link)| {
            let (src_addr, dst_addr, link) = match src {
                // Duplicate address detection: from ::, to the solicited-node address, no option.
                None => (
                    Ipv6Addr::UNSPECIFIED,
                    ndp::solicited_node_multicast(target),
                    None,
                ),
                Some(src) if to_snm => (src, ndp::solicited_node_multicast(target), link),
                Some(src) => (src, target, link),
            };
            NdpRepr {
                src_addr,
                dst_addr,
                message: NdpMessage::NeighborSolicit {
                    target,
                    source_link_addr: link,
                },
            }
        });
    let advert = (
        unicast_ipv6(),
        unicast_ipv6(),
        any::<[bool; 3]>(),
        any::<bool>(),
        proptest::option::of(mac()),
    )
        .prop_map(|(target, peer, [r, s, o], multicast, link)| NdpRepr {
            src_addr: target,
            dst_addr: if multicast && !s {
                ndp::ALL_NODES
            } else {
                peer
            },
            message: NdpMessage::NeighborAdvert {
                flags: NeighborFlags {
                    router: r,
                    solicited: s,
                    override_: o,
                },
                target,
                target_link_addr: link,
            },
        });
    (prop_oneof![solicit, advert], mac(), mac()).prop_map(|(ndp, src, dst)| NdpFrame {
        ethernet: EthernetRepr {
            dst,
            src,
            ethertype: EtherType::Ipv6,
        },
        ndp,
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    #[test]
    fn ethernet_round_trips(dst in mac(), src in mac(), ethertype in ethertype()) {
        let repr = EthernetRepr { dst, src, ethertype };
        let mut buf = [0u8; 14];
        repr.emit(&mut buf).unwrap();
        prop_assert_eq!(EthernetRepr::parse(&buf).unwrap().0, repr);
    }

    #[test]
    fn arp_round_trips(
        reply in any::<bool>(), sender_mac in mac(), sender_ip in ipv4(),
        target_mac in mac(), target_ip in ipv4(),
    ) {
        let operation = if reply { ArpOperation::Reply } else { ArpOperation::Request };
        let repr = ArpRepr { operation, sender_mac, sender_ip, target_mac, target_ip };
        let mut buf = [0u8; arp::FRAME_LEN];
        repr.emit_frame(&mut buf).unwrap();
        match Frame::parse(&buf).unwrap() {
            Frame::Arp { arp, .. } => prop_assert_eq!(arp, repr),
            other => prop_assert!(false, "parsed as {}", other.as_str()),
        }
    }

    #[test]
    fn ndp_round_trips(frame in ndp_frame()) {
        let mut buf = vec![0xa5u8; frame.frame_len()];
        frame.emit(&mut buf).unwrap();
        prop_assert_eq!(NdpFrame::parse(&buf), Ok(frame));
        prop_assert_eq!(Frame::parse(&buf), Ok(Frame::Ndp(frame)));
    }

    #[test]
    fn vrrp_ipv4_round_trips(
        src in ipv4(), vrid in any::<u8>(), priority in any::<u8>(),
        interval in 0u16..=vrrp::MAX_ADVERT_INTERVAL,
        addrs in proptest::collection::vec(ipv4(), 0..16),
    ) {
        let repr = VrrpRepr { vrid, priority, max_advert_interval: interval,
            addresses: VrrpAddresses::Ipv4(&addrs) };
        let frame = VrrpFrame::advertisement(IpAddr::V4(src), repr);
        let mut buf = vec![0xa5u8; frame.frame_len()];
        frame.emit(&mut buf).unwrap();
        prop_assert_eq!(VrrpFrame::parse(&buf), Ok(frame));
        prop_assert_eq!(Frame::parse(&buf), Ok(Frame::Vrrp(frame)));
    }

    #[test]
    fn vrrp_ipv6_round_trips(
        src in ipv6(), vrid in any::<u8>(), priority in any::<u8>(),
        interval in 0u16..=vrrp::MAX_ADVERT_INTERVAL,
        addrs in proptest::collection::vec(ipv6(), 0..16),
    ) {
        let repr = VrrpRepr { vrid, priority, max_advert_interval: interval,
            addresses: VrrpAddresses::Ipv6(&addrs) };
        let frame = VrrpFrame::advertisement(IpAddr::V6(src), repr);
        let mut buf = vec![0xa5u8; frame.frame_len()];
        frame.emit(&mut buf).unwrap();
        prop_assert_eq!(VrrpFrame::parse(&buf), Ok(frame));
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_frame_parser(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = Frame::parse(&bytes);
    }

    #[test]
    fn mutated_golden_frames_never_panic_the_frame_parser(
        which in 0usize..6, at in any::<proptest::sample::Index>(), value in any::<u8>(),
        cut in any::<proptest::sample::Index>(),
    ) {
        let frames: [&[u8]; 6] = [&golden::ARP_REQUEST, &golden::NS_MULTICAST, &golden::NS_DAD,
            &golden::NA_SOLICITED, &golden::VRRP_V4, &golden::VRRP_V6];
        let mut f = frames[which].to_vec();
        let i = at.index(f.len());
        f[i] = value;
        let len = cut.index(f.len() + 1);
        let _ = Frame::parse(&f[..len]);
    }
}

fn ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![ipv4().prop_map(IpAddr::V4), ipv6().prop_map(IpAddr::V6)]
}

fn gossip_addr() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        (ipv4(), any::<u16>()).prop_map(|(ip, port)| SocketAddr::V4(SocketAddrV4::new(ip, port))),
        // The flow label is not carried (it names no endpoint); the scope id is.
        (ipv6(), any::<u16>(), any::<u32>())
            .prop_map(|(ip, port, scope)| SocketAddr::V6(SocketAddrV6::new(ip, port, 0, scope))),
    ]
}

/// A node name of 1 to 253 bytes, any Unicode.
fn node_name() -> impl Strategy<Value = String> {
    prop_oneof!["[a-z0-9.-]{1,253}", "\\PC{1,63}"].prop_filter("1 to 253 bytes", |n| {
        !n.is_empty() && n.len() <= heartbeat::MAX_NAME_LEN
    })
}

fn owned_node() -> impl Strategy<Value = (String, SocketAddr, u64)> {
    (node_name(), gossip_addr(), any::<u64>())
}

fn node_ref(n: &(String, SocketAddr, u64)) -> NodeRef<'_> {
    NodeRef {
        name: &n.0,
        addr: n.1,
        bump: n.2,
    }
}

/// Emits into a junk-filled buffer, checks the length and the round trip.
fn watch_round_trips(message: WatchMessage<'_>) -> Result<(), TestCaseError> {
    let mut buf = vec![0xa5u8; message.buffer_len() + 8];
    let len = message.emit(&mut buf).unwrap();
    prop_assert_eq!(len, message.buffer_len());
    prop_assert!(len <= heartbeat::MAX_LEN);
    prop_assert!(buf[len..].iter().all(|&b| b == 0xa5));
    prop_assert_eq!(WatchMessage::parse(&buf[..len]), Ok(message));
    // One byte short of its length is truncated; one more is trailing.
    prop_assert_eq!(
        WatchMessage::parse(&buf[..len - 1]),
        Err(swimlb_proto::Error::Truncated)
    );
    prop_assert_eq!(
        WatchMessage::parse(&buf[..len + 1]),
        Err(swimlb_proto::Error::TrailingBytes)
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    #[test]
    fn watch_heartbeat_round_trips(
        incarnation in any::<u64>(), seq in any::<u64>(), interval_ms in 1u16..,
    ) {
        watch_round_trips(WatchMessage::Heartbeat { incarnation, seq, interval_ms })?;
    }

    #[test]
    fn watch_ack_round_trips(incarnation in any::<u64>(), seq in any::<u64>()) {
        watch_round_trips(WatchMessage::Ack { incarnation, seq })?;
    }

    #[test]
    fn watch_poll_round_trips(nonce in any::<u64>(), incarnation in any::<u64>()) {
        watch_round_trips(WatchMessage::Poll { nonce, incarnation })?;
    }

    #[test]
    fn watch_poll_reply_round_trips(nonce in any::<u64>(), alive in any::<bool>()) {
        watch_round_trips(WatchMessage::PollReply { nonce, alive })?;
    }

    #[test]
    fn watch_relay_round_trips(nonce in any::<u64>(), target in owned_node()) {
        watch_round_trips(WatchMessage::Relay { nonce, target: node_ref(&target) })?;
    }

    #[test]
    fn watch_claim_round_trips(
        ip in ip(), epoch in any::<u64>(), claimant in owned_node(), accused in owned_node(),
    ) {
        watch_round_trips(WatchMessage::Claim {
            ip, epoch, claimant: node_ref(&claimant), accused: node_ref(&accused),
        })?;
    }

    #[test]
    fn watch_move_round_trips(
        ip in ip(), epoch in any::<u64>(), from in owned_node(), to in owned_node(),
    ) {
        watch_round_trips(WatchMessage::Move {
            ip, epoch, from: node_ref(&from), to: node_ref(&to),
        })?;
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_watch_parser(
        kind_and_version in any::<bool>(), bytes in proptest::collection::vec(any::<u8>(), 0..700),
    ) {
        let mut bytes = bytes;
        // Half the cases get past the header checks, so the body readers are exercised.
        if kind_and_version && bytes.len() >= 2 {
            bytes[0] = heartbeat::KIND;
            bytes[1] = heartbeat::VERSION;
        }
        if let Ok(message) = WatchMessage::parse(&bytes) {
            // Whatever parses emits back to the same bytes.
            let mut out = vec![0u8; message.buffer_len()];
            message.emit(&mut out).unwrap();
            prop_assert_eq!(out, bytes);
        }
    }
}

fn digest() -> impl Strategy<Value = Digest> {
    (0..=gossip::MAX_DIGEST_BITS).prop_flat_map(|bits| {
        proptest::collection::vec(any::<u64>(), 1usize << bits)
            .prop_map(move |buckets| Digest::new(bits, &buckets).unwrap())
    })
}

/// The message of kind `kind` (0 to 7) built from the given field values.
fn gossip_message(
    kind: u8,
    opaque: &[u8],
    echo: bool,
    digest: Digest,
    (token, nonce, bump): (u32, u64, u64),
) -> GossipMessage<'_> {
    let verdict = if echo {
        Verdict::Reachable
    } else {
        Verdict::Unreachable
    };
    match kind {
        0 => GossipMessage::Foca(opaque),
        1 => GossipMessage::Meta(opaque),
        2 => GossipMessage::MetaPull { node: opaque },
        3 => GossipMessage::Sync { echo, digest },
        4 => GossipMessage::Inquire {
            token,
            suspect: opaque,
        },
        5 => GossipMessage::Ping { nonce, bump },
        6 => GossipMessage::Pong { nonce },
        _ => GossipMessage::Verdict { token, verdict },
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    #[test]
    fn gossip_messages_round_trip(
        kind in 0u8..8, opaque in proptest::collection::vec(any::<u8>(), 0..64),
        echo in any::<bool>(), digest in digest(), numbers in any::<(u32, u64, u64)>(),
    ) {
        let message = gossip_message(kind, &opaque, echo, digest, numbers);
        prop_assert_eq!(message.kind().code(), kind);
        let mut buf = vec![0xa5u8; message.buffer_len() + 8];
        let len = message.emit(&mut buf).unwrap();
        prop_assert_eq!(len, message.buffer_len());
        prop_assert!(buf[len..].iter().all(|&b| b == 0xa5));
        prop_assert_eq!(GossipMessage::parse(&buf[..len]), Ok(message));
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_gossip_parser(
        kind in 0u8..10, bytes in proptest::collection::vec(any::<u8>(), 0..600),
    ) {
        let mut bytes = bytes;
        // Mostly known kinds, so the body readers are exercised.
        if let Some(first) = bytes.first_mut() {
            *first = kind;
        }
        if let Ok(message) = GossipMessage::parse(&bytes) {
            let mut out = Vec::new();
            message.emit_vec(&mut out);
            prop_assert_eq!(out, bytes);
        }
    }
}
