//! Property tests: `parse(emit(x)) == x` for every Repr, and no panic on arbitrary bytes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;
use swimlb_proto::arp::{self, ArpOperation, ArpRepr};
use swimlb_proto::ethernet::{EtherType, EthernetRepr, MacAddr};
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
