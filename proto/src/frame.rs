//! One entry point for every frame the speaker receives: [`Frame::parse`] reads the Ethernet
//! header and dispatches to ARP, IPv6 neighbor discovery, or VRRP over IPv4 / IPv6.
//!
//! A frame none of those modules owns (another EtherType, an IPv4 packet that is not VRRP, an
//! IPv6 packet that is neither VRRP nor an NS / NA) is [`Frame::Other`], not an error: it is
//! ordinary traffic for the caller to count and ignore. A frame that claims to be one of ours and
//! breaks a rule is an [`Error`](crate::Error). Parsing never panics and never allocates (the VRRP address list
//! borrows the frame).

use crate::Result;
use crate::arp::ArpRepr;
use crate::ethernet::{EtherType, EthernetRepr};
use crate::ip::IPV6_HEADER_LEN;
use crate::ndp::{self, NdpFrame, NdpRepr};
use crate::vrrp::{self, VrrpFrame, VrrpPacket};

/// A received frame, by protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame<'a> {
    /// An ARP request or reply.
    Arp {
        /// The Ethernet header.
        ethernet: EthernetRepr,
        /// The ARP packet.
        arp: ArpRepr,
    },
    /// An IPv6 neighbor solicitation or advertisement.
    Ndp(NdpFrame),
    /// A VRRPv3 advertisement over IPv4 or IPv6.
    Vrrp(VrrpFrame<'a>),
    /// Traffic none of the above: not examined past the layer that tells.
    Other {
        /// The Ethernet header.
        ethernet: EthernetRepr,
    },
}

impl<'a> Frame<'a> {
    /// Reads `frame`. Errors are those of [`ArpRepr::parse`], [`NdpRepr::parse`] and
    /// [`VrrpPacket`]'s parsers, plus [`crate::Error::Truncated`] for fewer than 14 bytes.
    ///
    /// ```
    /// use swimlb_proto::arp::{self, ArpRepr};
    /// use swimlb_proto::ethernet::MacAddr;
    /// use swimlb_proto::Frame;
    ///
    /// let mac = MacAddr(2, 0, 0, 0, 0, 1);
    /// let garp = ArpRepr::gratuitous_request(mac, "192.0.2.10".parse().unwrap());
    /// let mut buf = [0u8; arp::FRAME_LEN];
    /// garp.emit_frame(&mut buf).unwrap();
    /// match Frame::parse(&buf) {
    ///     Ok(Frame::Arp { arp, .. }) => assert!(arp.is_gratuitous()),
    ///     other => panic!("unexpected {other:?}"),
    /// }
    /// ```
    pub fn parse(frame: &'a [u8]) -> Result<Frame<'a>> {
        let (ethernet, payload) = EthernetRepr::parse(frame)?;
        match ethernet.ethertype {
            EtherType::Arp => Ok(Frame::Arp {
                ethernet,
                arp: ArpRepr::parse(payload)?,
            }),
            EtherType::Ipv4 => {
                // The protocol byte decides whether the packet is ours before any other check.
                if payload.get(9) != Some(&vrrp::PROTOCOL) {
                    return Ok(Frame::Other { ethernet });
                }
                Ok(Frame::Vrrp(VrrpFrame {
                    ethernet,
                    packet: VrrpPacket::parse_ipv4(payload)?,
                }))
            }
            EtherType::Ipv6 => match payload.get(6) {
                Some(&vrrp::PROTOCOL) => Ok(Frame::Vrrp(VrrpFrame {
                    ethernet,
                    packet: VrrpPacket::parse_ipv6(payload)?,
                })),
                Some(&ndp::ICMPV6)
                    if matches!(
                        payload.get(IPV6_HEADER_LEN),
                        Some(&ndp::NEIGHBOR_SOLICIT | &ndp::NEIGHBOR_ADVERT)
                    ) =>
                {
                    Ok(Frame::Ndp(NdpFrame {
                        ethernet,
                        ndp: NdpRepr::parse(payload)?,
                    }))
                }
                _ => Ok(Frame::Other { ethernet }),
            },
            EtherType::Unknown(_) => Ok(Frame::Other { ethernet }),
        }
    }

    /// The Ethernet header of any frame.
    pub const fn ethernet(&self) -> EthernetRepr {
        match self {
            Frame::Arp { ethernet, .. } | Frame::Other { ethernet } => *ethernet,
            Frame::Ndp(f) => f.ethernet,
            Frame::Vrrp(f) => f.ethernet,
        }
    }

    /// A short, stable, lowercase name of the kind of frame, for logs and metric labels.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Frame::Arp { .. } => "arp",
            Frame::Ndp(_) => "ndp",
            Frame::Vrrp(_) => "vrrp",
            Frame::Other { .. } => "other",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Error, golden};

    #[test]
    fn every_golden_frame_dispatches_to_its_protocol() {
        let cases: [(&[u8], &str); 12] = [
            (&golden::ARP_REQUEST, "arp"),
            (&golden::ARP_REPLY, "arp"),
            (&golden::GARP_REQUEST, "arp"),
            (&golden::GARP_REPLY, "arp"),
            (&golden::NS_MULTICAST, "ndp"),
            (&golden::NS_UNICAST, "ndp"),
            (&golden::NS_DAD, "ndp"),
            (&golden::NA_SOLICITED, "ndp"),
            (&golden::NA_UNSOLICITED, "ndp"),
            (&golden::NA_ROUTER, "ndp"),
            (&golden::VRRP_V4, "vrrp"),
            (&golden::VRRP_V6, "vrrp"),
        ];
        for (bytes, kind) in cases {
            let frame = Frame::parse(bytes).unwrap();
            assert_eq!(frame.as_str(), kind);
            assert_eq!(frame.ethernet(), EthernetRepr::parse(bytes).unwrap().0);
        }
    }

    #[test]
    fn ipv4_that_is_not_vrrp_is_other() {
        let mut f = golden::VRRP_V4;
        f[23] = 17;
        assert_eq!(Frame::parse(&f).unwrap().as_str(), "other");
    }

    #[test]
    fn icmpv6_that_is_not_neighbor_discovery_is_other() {
        let mut f = golden::NS_MULTICAST;
        f[54] = 128; // echo request
        assert_eq!(Frame::parse(&f).unwrap().as_str(), "other");
    }

    #[test]
    fn unknown_ethertype_is_other() {
        let mut f = golden::ARP_REQUEST;
        f[12..14].copy_from_slice(&[0x88, 0xcc]);
        assert_eq!(Frame::parse(&f).unwrap().as_str(), "other");
    }

    #[test]
    fn broken_frames_of_our_protocols_are_errors() {
        let mut f = golden::ARP_REQUEST;
        f[21] = 9;
        assert_eq!(Frame::parse(&f), Err(Error::ArpOperation(9)));
        let mut f = golden::NS_MULTICAST;
        f[21] = 64;
        assert_eq!(Frame::parse(&f), Err(Error::HopLimit(64)));
        assert_eq!(
            Frame::parse(&golden::VRRP_V6[..60]),
            Err(Error::MalformedIpHeader("ipv6 payload length"))
        );
    }

    #[test]
    fn every_prefix_of_every_golden_frame_parses_or_fails_without_panic() {
        for bytes in [
            &golden::NS_MULTICAST[..],
            &golden::VRRP_V4,
            &golden::VRRP_V6,
            &golden::ARP_REQUEST,
        ] {
            for len in 0..bytes.len() {
                let _ = Frame::parse(&bytes[..len]);
            }
        }
    }
}
