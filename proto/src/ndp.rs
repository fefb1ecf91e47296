//! IPv6 neighbor discovery: neighbor solicitations and advertisements (RFC 4861 sections 4.3,
//! 4.4, 7.1) in their IPv6 packet and Ethernet frame.
//!
//! [`NdpRepr`] is one NS or NA with the IPv6 addresses it travels between; [`NdpFrame`] adds the
//! Ethernet header. [`NdpRepr::parse`] applies the validity checks of RFC 4861 sections 7.1.1 and
//! 7.1.2, each with its own [`Error`]: hop limit 255, ICMPv6 code 0, the checksum over the IPv6
//! pseudo-header, an ICMPv6 length of at least 24, a unicast target, no option of length 0, no
//! source link-layer option when the source is `::`, a duplicate-address-detection solicitation
//! sent to its target's solicited-node address, and no Solicited flag on an advertisement sent to
//! multicast. Unknown options are skipped, as RFC 4861 requires. Parsing does not allocate.
//!
//! The IPv6 header uses `pnet_packet`'s view (see [`crate::ip`]); the ICMPv6 body is read at the
//! offsets in the private `field` module, because `pnet`'s NDP views allocate to list options.
//!
//! The constructors build what the speaker sends: [`NdpFrame::unsolicited_advert`] and
//! [`NdpFrame::reply_to`]; [`solicited_node_multicast`] and [`multicast_mac`] map addresses.

use core::net::Ipv6Addr;

use crate::checksum;
use crate::ethernet::{self, EtherType, EthernetRepr, MacAddr};
use crate::ip::{IPV6_HEADER_LEN, Ipv6Header};
use crate::{Error, Result};

/// IPv6 next header value of ICMPv6.
pub const ICMPV6: u8 = 58;
/// ICMPv6 type of a neighbor solicitation.
pub const NEIGHBOR_SOLICIT: u8 = 135;
/// ICMPv6 type of a neighbor advertisement.
pub const NEIGHBOR_ADVERT: u8 = 136;
/// The hop limit every neighbor discovery message carries and must arrive with.
pub const HOP_LIMIT: u8 = 255;
/// ICMPv6 length of an NS or NA without options.
pub const MESSAGE_LEN: usize = 24;
/// Length of a link-layer address option for Ethernet.
pub const LINK_ADDR_OPTION_LEN: usize = 8;
/// All-nodes multicast, where unsolicited advertisements and replies to DAD go.
pub const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

const OPTION_SOURCE_LINK_ADDR: u8 = 1;
const OPTION_TARGET_LINK_ADDR: u8 = 2;

mod field {
    use core::ops::Range;
    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: Range<usize> = 2..4;
    pub const FLAGS: usize = 4;
    pub const TARGET: Range<usize> = 8..24;
    pub const OPTIONS: usize = 24;
}

const FLAG_ROUTER: u8 = 0x80;
const FLAG_SOLICITED: u8 = 0x40;
const FLAG_OVERRIDE: u8 = 0x20;

/// The solicited-node multicast address of `ip` (RFC 4291 section 2.7.1): `ff02::1:ff` followed
/// by the low 24 bits of `ip`.
pub const fn solicited_node_multicast(ip: Ipv6Addr) -> Ipv6Addr {
    let o = ip.octets();
    Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | o[13] as u16,
        ((o[14] as u16) << 8) | o[15] as u16,
    )
}

/// The Ethernet address of IPv6 multicast address `ip` (RFC 2464 section 7): `33:33` followed by
/// its low 32 bits; for a solicited-node address, `33:33:ff:xx:xx:xx`.
pub const fn multicast_mac(ip: Ipv6Addr) -> MacAddr {
    let o = ip.octets();
    MacAddr(0x33, 0x33, o[12], o[13], o[14], o[15])
}

/// The flags of a neighbor advertisement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NeighborFlags {
    /// R: the sender is a router.
    pub router: bool,
    /// S: sent in response to a solicitation.
    pub solicited: bool,
    /// O: override an existing cache entry.
    pub override_: bool,
}

/// A neighbor discovery message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NdpMessage {
    /// Neighbor solicitation: who has `target`?
    NeighborSolicit {
        /// The address being resolved.
        target: Ipv6Addr,
        /// The solicitor's MAC, from the source link-layer address option.
        source_link_addr: Option<MacAddr>,
    },
    /// Neighbor advertisement: `target` is at `target_link_addr`.
    NeighborAdvert {
        /// R, S and O.
        flags: NeighborFlags,
        /// The address advertised.
        target: Ipv6Addr,
        /// The MAC, from the target link-layer address option.
        target_link_addr: Option<MacAddr>,
    },
}

impl NdpMessage {
    /// A short, stable, lowercase name for logs and metric labels.
    pub const fn as_str(&self) -> &'static str {
        match self {
            NdpMessage::NeighborSolicit { .. } => "neighbor_solicit",
            NdpMessage::NeighborAdvert { .. } => "neighbor_advert",
        }
    }

    /// The target address of either message.
    pub const fn target(&self) -> Ipv6Addr {
        match *self {
            NdpMessage::NeighborSolicit { target, .. }
            | NdpMessage::NeighborAdvert { target, .. } => target,
        }
    }

    fn link_addr(&self) -> Option<MacAddr> {
        match *self {
            NdpMessage::NeighborSolicit {
                source_link_addr, ..
            } => source_link_addr,
            NdpMessage::NeighborAdvert {
                target_link_addr, ..
            } => target_link_addr,
        }
    }
}

/// A neighbor solicitation or advertisement in its IPv6 packet (hop limit 255, no extension
/// headers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NdpRepr {
    /// IPv6 source; `::` for duplicate address detection.
    pub src_addr: Ipv6Addr,
    /// IPv6 destination.
    pub dst_addr: Ipv6Addr,
    /// The message.
    pub message: NdpMessage,
}

impl NdpRepr {
    /// Reads an IPv6 packet carrying an NS or NA and checks it as RFC 4861 section 7.1 says.
    ///
    /// Checks, in order: the IPv6 header ([`Ipv6Header::parse`]); next header ICMPv6
    /// ([`Error::IpProtocol`]); hop limit 255 ([`Error::HopLimit`]); ICMPv6 type 135 or 136
    /// ([`Error::Icmpv6Type`]); code 0 ([`Error::Icmpv6Code`]); ICMPv6 length at least 24
    /// ([`Error::Truncated`]); checksum ([`Error::BadChecksum`]); unicast target
    /// ([`Error::NdpMulticastTarget`]); options ([`Error::NdpZeroLengthOption`],
    /// [`Error::Truncated`]); then the rules on `::` and on Solicited advertisements.
    pub fn parse(packet: &[u8]) -> Result<NdpRepr> {
        let (ip, icmp) = Ipv6Header::parse(packet)?;
        if ip.next_header != ICMPV6 {
            return Err(Error::IpProtocol(ip.next_header));
        }
        if ip.hop_limit != HOP_LIMIT {
            return Err(Error::HopLimit(ip.hop_limit));
        }
        Self::parse_icmpv6(ip.src, ip.dst, icmp)
    }

    /// Reads the ICMPv6 part of an NS or NA whose IPv6 header has been checked (next header 58,
    /// hop limit 255); `icmp` is exactly the IPv6 payload.
    pub fn parse_icmpv6(src_addr: Ipv6Addr, dst_addr: Ipv6Addr, icmp: &[u8]) -> Result<NdpRepr> {
        let (&kind, &code) = match icmp {
            [kind, code, ..] => (kind, code),
            _ => return Err(Error::Truncated),
        };
        if kind != NEIGHBOR_SOLICIT && kind != NEIGHBOR_ADVERT {
            return Err(Error::Icmpv6Type(kind));
        }
        if code != 0 {
            return Err(Error::Icmpv6Code(code));
        }
        if icmp.len() < MESSAGE_LEN {
            return Err(Error::Truncated);
        }
        let length = u32::try_from(icmp.len()).map_err(|_| Error::TooLarge)?;
        let pseudo = checksum::ipv6_pseudo_header(src_addr, dst_addr, ICMPV6, length);
        if !checksum::verify(pseudo, icmp) {
            return Err(Error::BadChecksum);
        }
        let mut target_octets = [0u8; 16];
        target_octets.copy_from_slice(&icmp[field::TARGET]);
        let target = Ipv6Addr::from(target_octets);
        if target.is_multicast() {
            return Err(Error::NdpMulticastTarget);
        }
        let wanted_option = if kind == NEIGHBOR_SOLICIT {
            OPTION_SOURCE_LINK_ADDR
        } else {
            OPTION_TARGET_LINK_ADDR
        };
        let link_addr = read_link_addr_option(&icmp[field::OPTIONS..], wanted_option)?;
        let message = if kind == NEIGHBOR_SOLICIT {
            if src_addr.is_unspecified() {
                if link_addr.is_some() {
                    return Err(Error::NdpUnspecifiedSourceWithLinkAddr);
                }
                if dst_addr != solicited_node_multicast(target) {
                    return Err(Error::NdpDadNotSolicitedNode);
                }
            }
            NdpMessage::NeighborSolicit {
                target,
                source_link_addr: link_addr,
            }
        } else {
            let bits = icmp[field::FLAGS];
            let flags = NeighborFlags {
                router: bits & FLAG_ROUTER != 0,
                solicited: bits & FLAG_SOLICITED != 0,
                override_: bits & FLAG_OVERRIDE != 0,
            };
            if flags.solicited && dst_addr.is_multicast() {
                return Err(Error::NdpSolicitedToMulticast);
            }
            NdpMessage::NeighborAdvert {
                flags,
                target,
                target_link_addr: link_addr,
            }
        };
        Ok(NdpRepr {
            src_addr,
            dst_addr,
            message,
        })
    }

    /// Length of the ICMPv6 message: 24 bytes, plus 8 for a link-layer address option.
    pub fn icmp_len(&self) -> usize {
        MESSAGE_LEN
            + if self.message.link_addr().is_some() {
                LINK_ADDR_OPTION_LEN
            } else {
                0
            }
    }

    /// Length of the IPv6 packet.
    pub fn buffer_len(&self) -> usize {
        IPV6_HEADER_LEN + self.icmp_len()
    }

    /// Writes the IPv6 packet (hop limit 255, traffic class 0) with its checksum into the first
    /// [`NdpRepr::buffer_len`] bytes of `packet`. It writes what it is given: building a message
    /// that [`NdpRepr::parse`] rejects (say, a DAD solicitation with a link-layer option) is the
    /// caller's mistake, which the constructors on [`NdpFrame`] do not make.
    pub fn emit(&self, packet: &mut [u8]) -> Result<()> {
        let icmp_len = self.icmp_len();
        if packet.len() < IPV6_HEADER_LEN + icmp_len {
            return Err(Error::BufferTooSmall);
        }
        let ip = Ipv6Header {
            src: self.src_addr,
            dst: self.dst_addr,
            next_header: ICMPV6,
            hop_limit: HOP_LIMIT,
            traffic_class: 0,
            payload_len: icmp_len as u16,
        };
        let rest = ip.emit(packet)?;
        let icmp = &mut rest[..icmp_len];
        let (kind, flags, option) = match self.message {
            NdpMessage::NeighborSolicit { .. } => (NEIGHBOR_SOLICIT, 0, OPTION_SOURCE_LINK_ADDR),
            NdpMessage::NeighborAdvert { flags, .. } => {
                let mut bits = 0;
                if flags.router {
                    bits |= FLAG_ROUTER;
                }
                if flags.solicited {
                    bits |= FLAG_SOLICITED;
                }
                if flags.override_ {
                    bits |= FLAG_OVERRIDE;
                }
                (NEIGHBOR_ADVERT, bits, OPTION_TARGET_LINK_ADDR)
            }
        };
        icmp[field::TYPE] = kind;
        icmp[field::CODE] = 0;
        icmp[field::CHECKSUM].copy_from_slice(&[0, 0]);
        icmp[field::FLAGS..field::TARGET.start].copy_from_slice(&[flags, 0, 0, 0]);
        icmp[field::TARGET].copy_from_slice(&self.message.target().octets());
        if let Some(mac) = self.message.link_addr() {
            let o = &mut icmp[field::OPTIONS..field::OPTIONS + LINK_ADDR_OPTION_LEN];
            o[0] = option;
            o[1] = 1;
            o[2..8].copy_from_slice(&mac.octets());
        }
        let pseudo =
            checksum::ipv6_pseudo_header(self.src_addr, self.dst_addr, ICMPV6, icmp_len as u32);
        let sum = checksum::combine(&[pseudo, checksum::sum(icmp)]);
        icmp[field::CHECKSUM].copy_from_slice(&sum.to_be_bytes());
        Ok(())
    }
}

/// Walks the options and returns the first link-layer address option of type `wanted`.
fn read_link_addr_option(mut options: &[u8], wanted: u8) -> Result<Option<MacAddr>> {
    let mut found = None;
    while !options.is_empty() {
        let (kind, units) = match options {
            [kind, units, ..] => (*kind, usize::from(*units)),
            _ => return Err(Error::Truncated),
        };
        if units == 0 {
            return Err(Error::NdpZeroLengthOption);
        }
        let len = units * 8;
        if len > options.len() {
            return Err(Error::Truncated);
        }
        if kind == wanted && found.is_none() {
            let o = &options[2..8];
            found = Some(MacAddr(o[0], o[1], o[2], o[3], o[4], o[5]));
        }
        options = &options[len..];
    }
    Ok(found)
}

/// A neighbor discovery message in its Ethernet frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NdpFrame {
    /// The Ethernet header (type IPv6).
    pub ethernet: EthernetRepr,
    /// The IPv6 packet.
    pub ndp: NdpRepr,
}

impl NdpFrame {
    /// Reads an Ethernet frame carrying an NS or NA; see [`NdpRepr::parse`]. An EtherType other
    /// than IPv6 is [`Error::UnexpectedEtherType`].
    pub fn parse(frame: &[u8]) -> Result<NdpFrame> {
        let (ethernet, payload) = EthernetRepr::parse(frame)?;
        if ethernet.ethertype != EtherType::Ipv6 {
            return Err(Error::UnexpectedEtherType(ethernet.ethertype.into()));
        }
        Ok(NdpFrame {
            ethernet,
            ndp: NdpRepr::parse(payload)?,
        })
    }

    /// Length of the frame.
    pub fn frame_len(&self) -> usize {
        ethernet::HEADER_LEN + self.ndp.buffer_len()
    }

    /// Writes the frame into the first [`NdpFrame::frame_len`] bytes of `frame`.
    pub fn emit(&self, frame: &mut [u8]) -> Result<()> {
        if frame.len() < self.frame_len() {
            return Err(Error::BufferTooSmall);
        }
        let rest = self.ethernet.emit(frame)?;
        self.ndp.emit(rest)
    }

    /// An unsolicited advertisement that `our_mac` now has `ip` (RFC 4861 section 7.2.6): from
    /// `ip` to all-nodes (`ff02::1`, MAC 33:33:00:00:00:01), Override set, Solicited and Router
    /// clear, with the target link-layer address option.
    pub const fn unsolicited_advert(our_mac: MacAddr, ip: Ipv6Addr) -> NdpFrame {
        NdpFrame {
            ethernet: EthernetRepr {
                dst: multicast_mac(ALL_NODES),
                src: our_mac,
                ethertype: EtherType::Ipv6,
            },
            ndp: NdpRepr {
                src_addr: ip,
                dst_addr: ALL_NODES,
                message: NdpMessage::NeighborAdvert {
                    flags: NeighborFlags {
                        router: false,
                        solicited: false,
                        override_: true,
                    },
                    target: ip,
                    target_link_addr: Some(our_mac),
                },
            },
        }
    }

    /// A solicitation for the MAC of `target` from `our_mac` at `src` (RFC 4861 section 7.2.2):
    /// to `target`'s solicited-node multicast address, with the source link-layer option, so
    /// the target learns the solicitor as it answers.
    pub const fn solicit(our_mac: MacAddr, src: Ipv6Addr, target: Ipv6Addr) -> NdpFrame {
        let group = solicited_node_multicast(target);
        NdpFrame {
            ethernet: EthernetRepr {
                dst: multicast_mac(group),
                src: our_mac,
                ethertype: EtherType::Ipv6,
            },
            ndp: NdpRepr {
                src_addr: src,
                dst_addr: group,
                message: NdpMessage::NeighborSolicit {
                    target,
                    source_link_addr: Some(our_mac),
                },
            },
        }
    }

    /// The advertisement answering solicitation `self` with `our_mac` (RFC 4861 section 7.2.4):
    /// from the target, Override set, target link-layer option. To the solicitor (Solicited set;
    /// Ethernet destination its source link-layer option, else the frame's source MAC), or, when
    /// the solicitation came from `::` (duplicate address detection), to all-nodes with Solicited
    /// clear. `None` when `self` is not a solicitation.
    pub fn reply_to(&self, our_mac: MacAddr) -> Option<NdpFrame> {
        let NdpMessage::NeighborSolicit {
            target,
            source_link_addr,
        } = self.ndp.message
        else {
            return None;
        };
        let dad = self.ndp.src_addr.is_unspecified();
        let (dst_addr, dst_mac) = if dad {
            (ALL_NODES, multicast_mac(ALL_NODES))
        } else {
            (
                self.ndp.src_addr,
                source_link_addr.unwrap_or(self.ethernet.src),
            )
        };
        Some(NdpFrame {
            ethernet: EthernetRepr {
                dst: dst_mac,
                src: our_mac,
                ethertype: EtherType::Ipv6,
            },
            ndp: NdpRepr {
                src_addr: target,
                dst_addr,
                message: NdpMessage::NeighborAdvert {
                    flags: NeighborFlags {
                        router: false,
                        solicited: !dad,
                        override_: true,
                    },
                    target,
                    target_link_addr: Some(our_mac),
                },
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::golden;

    const A_MAC: MacAddr = MacAddr(2, 0, 0, 0, 0, 1);
    const B_MAC: MacAddr = MacAddr(2, 0, 0, 0, 0, 2);
    const A_IP: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
    const B_IP: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2);
    const A_SNM: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00, 1);

    fn ns_multicast() -> NdpFrame {
        NdpFrame {
            ethernet: EthernetRepr {
                dst: MacAddr(0x33, 0x33, 0xff, 0, 0, 1),
                src: B_MAC,
                ethertype: EtherType::Ipv6,
            },
            ndp: NdpRepr {
                src_addr: B_IP,
                dst_addr: A_SNM,
                message: NdpMessage::NeighborSolicit {
                    target: A_IP,
                    source_link_addr: Some(B_MAC),
                },
            },
        }
    }

    fn ns_dad() -> NdpFrame {
        NdpFrame {
            ethernet: EthernetRepr {
                dst: MacAddr(0x33, 0x33, 0xff, 0, 0, 1),
                src: A_MAC,
                ethertype: EtherType::Ipv6,
            },
            ndp: NdpRepr {
                src_addr: Ipv6Addr::UNSPECIFIED,
                dst_addr: A_SNM,
                message: NdpMessage::NeighborSolicit {
                    target: A_IP,
                    source_link_addr: None,
                },
            },
        }
    }

    #[test]
    fn a_solicitation_for_a_peer_goes_to_its_solicited_node_group_with_our_mac() {
        let f = NdpFrame::solicit(B_MAC, B_IP, A_IP);
        assert_eq!(f, ns_multicast());
        assert_eq!(NdpFrame::parse(&emitted(&f)).unwrap(), f);
    }

    fn emitted(f: &NdpFrame) -> Vec<u8> {
        let mut buf = vec![0xa5u8; f.frame_len()];
        f.emit(&mut buf).unwrap();
        buf
    }

    fn ipv6(frame: &[u8]) -> &[u8] {
        &frame[ethernet::HEADER_LEN..]
    }

    #[test]
    fn solicited_node_address_and_its_mac() {
        let ip: Ipv6Addr = "2001:db8::12:3456:789a".parse().unwrap();
        assert_eq!(
            solicited_node_multicast(ip),
            "ff02::1:ff56:789a".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(
            multicast_mac(solicited_node_multicast(ip)),
            MacAddr(0x33, 0x33, 0xff, 0x56, 0x78, 0x9a)
        );
        assert_eq!(multicast_mac(ALL_NODES), MacAddr(0x33, 0x33, 0, 0, 0, 1));
    }

    #[test]
    fn read_solicitation_fields_at_their_offsets() {
        let icmp = &ipv6(&golden::NS_MULTICAST)[IPV6_HEADER_LEN..];
        assert_eq!(icmp[field::TYPE], NEIGHBOR_SOLICIT);
        assert_eq!(icmp[field::CODE], 0);
        assert_eq!(&icmp[field::TARGET], &A_IP.octets());
        assert_eq!(&icmp[field::OPTIONS..field::OPTIONS + 2], &[1, 1]);
    }

    #[test]
    fn parse_multicast_solicitation_golden_vector() {
        assert_eq!(NdpFrame::parse(&golden::NS_MULTICAST), Ok(ns_multicast()));
    }

    #[test]
    fn emit_multicast_solicitation_into_junk_gives_the_golden_frame() {
        assert_eq!(emitted(&ns_multicast()), golden::NS_MULTICAST);
    }

    #[test]
    fn unicast_solicitation_round_trips_through_the_golden_vector() {
        let mut ns = ns_multicast();
        ns.ethernet.dst = A_MAC;
        ns.ndp.dst_addr = A_IP;
        assert_eq!(NdpFrame::parse(&golden::NS_UNICAST), Ok(ns));
        assert_eq!(emitted(&ns), golden::NS_UNICAST);
    }

    #[test]
    fn dad_solicitation_round_trips_through_the_golden_vector() {
        assert_eq!(NdpFrame::parse(&golden::NS_DAD), Ok(ns_dad()));
        assert_eq!(emitted(&ns_dad()), golden::NS_DAD);
    }

    #[test]
    fn reply_to_the_multicast_solicitation_is_the_golden_solicited_advert() {
        let reply = ns_multicast().reply_to(A_MAC).unwrap();
        assert_eq!(NdpFrame::parse(&golden::NA_SOLICITED), Ok(reply));
        assert_eq!(emitted(&reply), golden::NA_SOLICITED);
        assert_eq!(reply.reply_to(A_MAC), None);
    }

    #[test]
    fn reply_to_a_solicitation_without_link_option_goes_to_the_frame_source() {
        let mut ns = ns_multicast();
        ns.ndp.message = NdpMessage::NeighborSolicit {
            target: A_IP,
            source_link_addr: None,
        };
        ns.ethernet.src = MacAddr(2, 0, 0, 0, 0, 9);
        let reply = ns.reply_to(A_MAC).unwrap();
        assert_eq!(reply.ethernet.dst, MacAddr(2, 0, 0, 0, 0, 9));
        assert_eq!(reply.ndp.dst_addr, B_IP);
    }

    #[test]
    fn reply_to_dad_goes_to_all_nodes_without_solicited() {
        let reply = ns_dad().reply_to(A_MAC).unwrap();
        assert_eq!(reply.ndp.dst_addr, ALL_NODES);
        assert_eq!(reply.ethernet.dst, MacAddr(0x33, 0x33, 0, 0, 0, 1));
        let NdpMessage::NeighborAdvert { flags, .. } = reply.ndp.message else {
            panic!("not an advert")
        };
        assert!(!flags.solicited && flags.override_ && !flags.router);
        // And it parses: Solicited clear to multicast is allowed.
        assert_eq!(NdpFrame::parse(&emitted(&reply)), Ok(reply));
    }

    #[test]
    fn unsolicited_advert_is_the_golden_vector() {
        let na = NdpFrame::unsolicited_advert(A_MAC, A_IP);
        assert_eq!(NdpFrame::parse(&golden::NA_UNSOLICITED), Ok(na));
        assert_eq!(emitted(&na), golden::NA_UNSOLICITED);
    }

    #[test]
    fn router_flag_advert_round_trips_through_the_golden_vector() {
        let parsed = NdpFrame::parse(&golden::NA_ROUTER).unwrap();
        let NdpMessage::NeighborAdvert { flags, .. } = parsed.ndp.message else {
            panic!("not an advert")
        };
        assert_eq!(
            flags,
            NeighborFlags {
                router: true,
                solicited: true,
                override_: false
            }
        );
        assert_eq!(emitted(&parsed), golden::NA_ROUTER);
    }

    /// Applies `edit` to the IPv6 packet of `frame` and recomputes the ICMPv6 checksum.
    fn edited(frame: &[u8], edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut p = ipv6(frame).to_vec();
        edit(&mut p);
        let src = Ipv6Addr::from(<[u8; 16]>::try_from(&p[8..24]).unwrap());
        let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&p[24..40]).unwrap());
        let len = p.len() - IPV6_HEADER_LEN;
        p[4..6].copy_from_slice(&(len as u16).to_be_bytes());
        if p.len() < 44 {
            return p;
        }
        p[42..44].copy_from_slice(&[0, 0]);
        let pseudo = checksum::ipv6_pseudo_header(src, dst, ICMPV6, len as u32);
        let sum = checksum::combine(&[pseudo, checksum::sum(&p[40..])]);
        p[42..44].copy_from_slice(&sum.to_be_bytes());
        p
    }

    #[test]
    fn edited_without_change_still_parses() {
        let p = edited(&golden::NS_MULTICAST, |_| {});
        assert_eq!(NdpRepr::parse(&p), Ok(ns_multicast().ndp));
    }

    #[test]
    fn hop_limit_below_255_is_rejected() {
        let mut p = ipv6(&golden::NS_MULTICAST).to_vec();
        p[7] = 64;
        assert_eq!(NdpRepr::parse(&p), Err(Error::HopLimit(64)));
    }

    #[test]
    fn nonzero_icmp_code_is_rejected() {
        let p = edited(&golden::NS_MULTICAST, |p| p[41] = 1);
        assert_eq!(NdpRepr::parse(&p), Err(Error::Icmpv6Code(1)));
    }

    #[test]
    fn bad_checksum_is_rejected() {
        let mut p = ipv6(&golden::NA_SOLICITED).to_vec();
        p[43] ^= 0x01;
        assert_eq!(NdpRepr::parse(&p), Err(Error::BadChecksum));
    }

    #[test]
    fn icmp_length_below_24_is_rejected() {
        for len in 2..MESSAGE_LEN {
            let p = edited(&golden::NS_DAD, |p| p.truncate(IPV6_HEADER_LEN + len));
            assert_eq!(NdpRepr::parse(&p), Err(Error::Truncated), "length {len}");
        }
    }

    #[test]
    fn multicast_target_is_rejected() {
        let p = edited(&golden::NS_MULTICAST, |p| {
            p[48..64].copy_from_slice(&A_SNM.octets())
        });
        assert_eq!(NdpRepr::parse(&p), Err(Error::NdpMulticastTarget));
    }

    #[test]
    fn zero_length_option_is_rejected() {
        let p = edited(&golden::NS_MULTICAST, |p| p[65] = 0);
        assert_eq!(NdpRepr::parse(&p), Err(Error::NdpZeroLengthOption));
    }

    #[test]
    fn option_running_past_the_end_is_truncated() {
        let p = edited(&golden::NS_MULTICAST, |p| p[65] = 2);
        assert_eq!(NdpRepr::parse(&p), Err(Error::Truncated));
    }

    #[test]
    fn unknown_options_are_skipped() {
        let p = edited(&golden::NS_MULTICAST, |p| {
            p.extend_from_slice(&[14, 1, 0, 0, 0, 0, 0, 0]) // nonce option, RFC 3971
        });
        assert_eq!(NdpRepr::parse(&p), Ok(ns_multicast().ndp));
    }

    #[test]
    fn unspecified_source_with_source_link_option_is_rejected() {
        let p = edited(&golden::NS_MULTICAST, |p| {
            p[8..24].copy_from_slice(&Ipv6Addr::UNSPECIFIED.octets())
        });
        assert_eq!(
            NdpRepr::parse(&p),
            Err(Error::NdpUnspecifiedSourceWithLinkAddr)
        );
    }

    #[test]
    fn dad_not_sent_to_solicited_node_address_is_rejected() {
        let p = edited(&golden::NS_DAD, |p| {
            p[24..40].copy_from_slice(&ALL_NODES.octets())
        });
        assert_eq!(NdpRepr::parse(&p), Err(Error::NdpDadNotSolicitedNode));
    }

    #[test]
    fn solicited_advert_to_multicast_is_rejected() {
        let p = edited(&golden::NA_UNSOLICITED, |p| p[44] |= FLAG_SOLICITED);
        assert_eq!(NdpRepr::parse(&p), Err(Error::NdpSolicitedToMulticast));
    }

    #[test]
    fn other_icmpv6_types_are_rejected() {
        let p = edited(&golden::NS_MULTICAST, |p| p[40] = 128);
        assert_eq!(NdpRepr::parse(&p), Err(Error::Icmpv6Type(128)));
    }

    #[test]
    fn other_next_header_is_rejected() {
        let mut p = ipv6(&golden::NS_MULTICAST).to_vec();
        p[6] = 17;
        assert_eq!(NdpRepr::parse(&p), Err(Error::IpProtocol(17)));
    }

    #[test]
    fn frame_of_another_ethertype_is_not_ndp() {
        assert_eq!(
            NdpFrame::parse(&golden::ARP_REQUEST),
            Err(Error::UnexpectedEtherType(0x0806))
        );
    }

    #[test]
    fn emit_into_a_short_buffer_is_refused() {
        let f = ns_multicast();
        let mut buf = vec![0u8; f.frame_len() - 1];
        assert_eq!(f.emit(&mut buf), Err(Error::BufferTooSmall));
    }
}
