//! VRRPv3 advertisements (RFC 9568, formerly RFC 5798) over IPv4 and IPv6.
//!
//! [`VrrpRepr`] is the VRRP message: VRID, priority, maximum advertisement interval (12 bits,
//! centiseconds) and the address list, which stays a borrowed view ([`VrrpAddresses`]) so parsing
//! does not allocate. [`VrrpPacket`] adds the IP header (protocol 112, TTL / hop limit 255, to
//! 224.0.0.18 or ff02::12) and [`VrrpFrame`] the Ethernet header, with the virtual router MACs
//! 00:00:5e:00:01:VRID ([`virtual_mac_v4`]) and 00:00:5e:00:02:VRID ([`virtual_mac_v6`]).
//!
//! [`VrrpRepr::parse`] rejects, each with its own [`Error`]: version not 3 (RFC 9568 section
//! 7.1, VRRPv2 is not spoken), type not 1, an address count that disagrees with the length, and a
//! bad checksum (over the IP pseudo-header for both families, section 5.2.8). [`VrrpPacket`]
//! also rejects a TTL / hop limit other than 255. Fields are read at the offsets in the private
//! `field` module (`pnet` has no VRRP type).

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::checksum;
use crate::ethernet::{self, EtherType, EthernetRepr, MacAddr};
use crate::ip::{IPV4_HEADER_LEN, IPV6_HEADER_LEN, Ipv4Header, Ipv6Header, NETWORK_CONTROL_TOS};
use crate::{Error, Result};

/// IP protocol number of VRRP.
pub const PROTOCOL: u8 = 112;
/// The TTL / hop limit VRRP packets are sent and must arrive with.
pub const HOP_LIMIT: u8 = 255;
/// IPv4 multicast group of VRRP.
pub const IPV4_GROUP: Ipv4Addr = Ipv4Addr::new(224, 0, 0, 18);
/// IPv6 multicast group of VRRP.
pub const IPV6_GROUP: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 0x12);
/// Ethernet address of [`IPV4_GROUP`].
pub const IPV4_GROUP_MAC: MacAddr = MacAddr(0x01, 0x00, 0x5e, 0x00, 0x00, 0x12);
/// Ethernet address of [`IPV6_GROUP`].
pub const IPV6_GROUP_MAC: MacAddr = MacAddr(0x33, 0x33, 0x00, 0x00, 0x00, 0x12);
/// Length of the VRRP header before the addresses.
pub const HEADER_LEN: usize = 8;
/// The largest maximum advertisement interval: 12 bits of centiseconds.
pub const MAX_ADVERT_INTERVAL: u16 = 0x0fff;

mod field {
    use core::ops::Range;
    pub const VERSION_TYPE: usize = 0;
    pub const VRID: usize = 1;
    pub const PRIORITY: usize = 2;
    pub const COUNT: usize = 3;
    pub const INTERVAL: Range<usize> = 4..6;
    pub const CHECKSUM: Range<usize> = 6..8;
    pub const ADDRESSES: usize = 8;
}

/// The virtual router MAC for IPv4, `00:00:5e:00:01:{vrid}` (RFC 9568 section 7.3).
pub const fn virtual_mac_v4(vrid: u8) -> MacAddr {
    MacAddr(0x00, 0x00, 0x5e, 0x00, 0x01, vrid)
}

/// The virtual router MAC for IPv6, `00:00:5e:00:02:{vrid}` (RFC 9568 section 7.3).
pub const fn virtual_mac_v6(vrid: u8) -> MacAddr {
    MacAddr(0x00, 0x00, 0x5e, 0x00, 0x02, vrid)
}

/// The addresses of an advertisement: a view over the wire bytes when parsed, or a slice of
/// addresses when built. Two lists are equal when they hold the same addresses of the same
/// family in the same order, whichever form they are in.
#[derive(Debug, Clone, Copy)]
pub enum VrrpAddresses<'a> {
    /// IPv4 addresses as read: a multiple of 4 bytes.
    Ipv4Wire(&'a [u8]),
    /// IPv6 addresses as read: a multiple of 16 bytes.
    Ipv6Wire(&'a [u8]),
    /// IPv4 addresses to send.
    Ipv4(&'a [Ipv4Addr]),
    /// IPv6 addresses to send.
    Ipv6(&'a [Ipv6Addr]),
}

impl<'a> VrrpAddresses<'a> {
    /// True for IPv6 addresses.
    pub const fn is_ipv6(&self) -> bool {
        matches!(self, VrrpAddresses::Ipv6Wire(_) | VrrpAddresses::Ipv6(_))
    }

    /// Bytes per address: 4 or 16.
    pub const fn address_len(&self) -> usize {
        if self.is_ipv6() { 16 } else { 4 }
    }

    /// Number of addresses.
    pub const fn len(&self) -> usize {
        match self {
            VrrpAddresses::Ipv4Wire(b) => b.len() / 4,
            VrrpAddresses::Ipv6Wire(b) => b.len() / 16,
            VrrpAddresses::Ipv4(a) => a.len(),
            VrrpAddresses::Ipv6(a) => a.len(),
        }
    }

    /// True when there are no addresses.
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The address at `index`, if any.
    pub fn get(&self, index: usize) -> Option<IpAddr> {
        match *self {
            VrrpAddresses::Ipv4Wire(b) => {
                let o = b.get(index.checked_mul(4)?..index.checked_mul(4)?.checked_add(4)?)?;
                Some(IpAddr::V4(Ipv4Addr::new(o[0], o[1], o[2], o[3])))
            }
            VrrpAddresses::Ipv6Wire(b) => {
                let start = index.checked_mul(16)?;
                let o: [u8; 16] = b.get(start..start.checked_add(16)?)?.try_into().ok()?;
                Some(IpAddr::V6(Ipv6Addr::from(o)))
            }
            VrrpAddresses::Ipv4(a) => a.get(index).copied().map(IpAddr::V4),
            VrrpAddresses::Ipv6(a) => a.get(index).copied().map(IpAddr::V6),
        }
    }

    /// The addresses, in order.
    pub fn iter(&self) -> impl Iterator<Item = IpAddr> + 'a {
        let list = *self;
        (0..list.len()).filter_map(move |i| list.get(i))
    }
}

impl PartialEq for VrrpAddresses<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.is_ipv6() == other.is_ipv6()
            && self.len() == other.len()
            && self.iter().eq(other.iter())
    }
}

impl Eq for VrrpAddresses<'_> {}

/// A VRRPv3 advertisement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VrrpRepr<'a> {
    /// Virtual router id.
    pub vrid: u8,
    /// Priority: 255 for the address owner, 0 when the master stops.
    pub priority: u8,
    /// Maximum advertisement interval in centiseconds (at most [`MAX_ADVERT_INTERVAL`]).
    pub max_advert_interval: u16,
    /// The virtual addresses.
    pub addresses: VrrpAddresses<'a>,
}

impl<'a> VrrpRepr<'a> {
    /// Reads a VRRP message carried from `src` to `dst` (both of one family, which sets the
    /// address size); `message` is exactly the IP payload.
    ///
    /// Checks, in order: at least 8 bytes ([`Error::Truncated`]), version 3
    /// ([`Error::VrrpVersion`]), type 1 ([`Error::VrrpType`]), length = 8 + count x address size
    /// ([`Error::VrrpAddressCount`]), checksum ([`Error::BadChecksum`]).
    pub fn parse(src: IpAddr, dst: IpAddr, message: &'a [u8]) -> Result<VrrpRepr<'a>> {
        if message.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        let version = message[field::VERSION_TYPE] >> 4;
        if version != 3 {
            return Err(Error::VrrpVersion(version));
        }
        let kind = message[field::VERSION_TYPE] & 0x0f;
        if kind != 1 {
            return Err(Error::VrrpType(kind));
        }
        let count = message[field::COUNT];
        let ipv6 = match (src, dst) {
            (IpAddr::V4(_), IpAddr::V4(_)) => false,
            (IpAddr::V6(_), IpAddr::V6(_)) => true,
            _ => return Err(Error::OutOfRange("mixed address families")),
        };
        let address_len = if ipv6 { 16 } else { 4 };
        if message.len() != HEADER_LEN + usize::from(count) * address_len {
            return Err(Error::VrrpAddressCount(count));
        }
        if !checksum::verify(pseudo_header(src, dst, message.len())?, message) {
            return Err(Error::BadChecksum);
        }
        let list = &message[field::ADDRESSES..];
        Ok(VrrpRepr {
            vrid: message[field::VRID],
            priority: message[field::PRIORITY],
            max_advert_interval: u16::from_be_bytes([
                message[field::INTERVAL.start],
                message[field::INTERVAL.start + 1],
            ]) & MAX_ADVERT_INTERVAL,
            addresses: if ipv6 {
                VrrpAddresses::Ipv6Wire(list)
            } else {
                VrrpAddresses::Ipv4Wire(list)
            },
        })
    }

    /// Length of the message: 8 bytes plus the addresses.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN + self.addresses.len() * self.addresses.address_len()
    }

    /// Writes the message, with its checksum for the pseudo-header of `src` and `dst`, into the
    /// first [`VrrpRepr::buffer_len`] bytes of `message`.
    ///
    /// Refuses ([`Error::OutOfRange`]) an interval above [`MAX_ADVERT_INTERVAL`], more than 255
    /// addresses, and addresses or endpoints of different families.
    pub fn emit(&self, src: IpAddr, dst: IpAddr, message: &mut [u8]) -> Result<()> {
        if self.max_advert_interval > MAX_ADVERT_INTERVAL {
            return Err(Error::OutOfRange("vrrp interval above 4095 centiseconds"));
        }
        let count = u8::try_from(self.addresses.len())
            .map_err(|_| Error::OutOfRange("more than 255 vrrp addresses"))?;
        if src.is_ipv6() != self.addresses.is_ipv6() || dst.is_ipv6() != src.is_ipv6() {
            return Err(Error::OutOfRange("mixed address families"));
        }
        let len = self.buffer_len();
        if message.len() < len {
            return Err(Error::BufferTooSmall);
        }
        let message = &mut message[..len];
        message[field::VERSION_TYPE] = 0x31;
        message[field::VRID] = self.vrid;
        message[field::PRIORITY] = self.priority;
        message[field::COUNT] = count;
        message[field::INTERVAL].copy_from_slice(&self.max_advert_interval.to_be_bytes());
        message[field::CHECKSUM].copy_from_slice(&[0, 0]);
        let width = self.addresses.address_len();
        for (i, address) in self.addresses.iter().enumerate() {
            let at = field::ADDRESSES + i * width;
            match address {
                IpAddr::V4(a) => message[at..at + 4].copy_from_slice(&a.octets()),
                IpAddr::V6(a) => message[at..at + 16].copy_from_slice(&a.octets()),
            }
        }
        let sum = checksum::combine(&[pseudo_header(src, dst, len)?, checksum::sum(message)]);
        message[field::CHECKSUM].copy_from_slice(&sum.to_be_bytes());
        Ok(())
    }
}

fn pseudo_header(src: IpAddr, dst: IpAddr, len: usize) -> Result<u32> {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let len = u16::try_from(len).map_err(|_| Error::TooLarge)?;
            Ok(checksum::ipv4_pseudo_header(s, d, PROTOCOL, len))
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let len = u32::try_from(len).map_err(|_| Error::TooLarge)?;
            Ok(checksum::ipv6_pseudo_header(s, d, PROTOCOL, len))
        }
        _ => Err(Error::OutOfRange("mixed address families")),
    }
}

/// A VRRP advertisement in its IPv4 or IPv6 packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VrrpPacket<'a> {
    /// The sender's primary address (IPv4) or link-local address (IPv6).
    pub src_addr: IpAddr,
    /// [`IPV4_GROUP`], [`IPV6_GROUP`], or a unicast peer.
    pub dst_addr: IpAddr,
    /// The message.
    pub vrrp: VrrpRepr<'a>,
}

impl<'a> VrrpPacket<'a> {
    /// Reads an IPv4 packet carrying VRRP: the IPv4 header checks, protocol 112
    /// ([`Error::IpProtocol`]), TTL 255 ([`Error::HopLimit`]), then [`VrrpRepr::parse`].
    pub fn parse_ipv4(packet: &'a [u8]) -> Result<VrrpPacket<'a>> {
        let (ip, payload) = Ipv4Header::parse(packet)?;
        if ip.protocol != PROTOCOL {
            return Err(Error::IpProtocol(ip.protocol));
        }
        if ip.ttl != HOP_LIMIT {
            return Err(Error::HopLimit(ip.ttl));
        }
        let (src, dst) = (IpAddr::V4(ip.src), IpAddr::V4(ip.dst));
        Ok(VrrpPacket {
            src_addr: src,
            dst_addr: dst,
            vrrp: VrrpRepr::parse(src, dst, payload)?,
        })
    }

    /// Reads an IPv6 packet carrying VRRP (no extension headers): next header 112
    /// ([`Error::IpProtocol`]), hop limit 255 ([`Error::HopLimit`]), then [`VrrpRepr::parse`].
    pub fn parse_ipv6(packet: &'a [u8]) -> Result<VrrpPacket<'a>> {
        let (ip, payload) = Ipv6Header::parse(packet)?;
        if ip.next_header != PROTOCOL {
            return Err(Error::IpProtocol(ip.next_header));
        }
        if ip.hop_limit != HOP_LIMIT {
            return Err(Error::HopLimit(ip.hop_limit));
        }
        let (src, dst) = (IpAddr::V6(ip.src), IpAddr::V6(ip.dst));
        Ok(VrrpPacket {
            src_addr: src,
            dst_addr: dst,
            vrrp: VrrpRepr::parse(src, dst, payload)?,
        })
    }

    /// Length of the IP packet.
    pub const fn buffer_len(&self) -> usize {
        let ip = if self.src_addr.is_ipv6() {
            IPV6_HEADER_LEN
        } else {
            IPV4_HEADER_LEN
        };
        ip + self.vrrp.buffer_len()
    }

    /// Writes the IP packet (TTL / hop limit 255, TOS / traffic class 0xc0) into the first
    /// [`VrrpPacket::buffer_len`] bytes of `packet`.
    pub fn emit(&self, packet: &mut [u8]) -> Result<()> {
        if packet.len() < self.buffer_len() {
            return Err(Error::BufferTooSmall);
        }
        let len = self.vrrp.buffer_len();
        let rest = match (self.src_addr, self.dst_addr) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => Ipv4Header {
                src,
                dst,
                protocol: PROTOCOL,
                ttl: HOP_LIMIT,
                tos: NETWORK_CONTROL_TOS,
                payload_len: u16::try_from(len).map_err(|_| Error::TooLarge)?,
            }
            .emit(packet)?,
            (IpAddr::V6(src), IpAddr::V6(dst)) => Ipv6Header {
                src,
                dst,
                next_header: PROTOCOL,
                hop_limit: HOP_LIMIT,
                traffic_class: NETWORK_CONTROL_TOS,
                payload_len: u16::try_from(len).map_err(|_| Error::TooLarge)?,
            }
            .emit(packet)?,
            _ => return Err(Error::OutOfRange("mixed address families")),
        };
        self.vrrp.emit(self.src_addr, self.dst_addr, rest)
    }
}

/// A VRRP advertisement in its Ethernet frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VrrpFrame<'a> {
    /// The Ethernet header.
    pub ethernet: EthernetRepr,
    /// The IP packet.
    pub packet: VrrpPacket<'a>,
}

impl<'a> VrrpFrame<'a> {
    /// The multicast advertisement a master sends: from the virtual router MAC of `vrrp.vrid`
    /// for the family of `src_addr`, to the VRRP group and its MAC.
    pub const fn advertisement(src_addr: IpAddr, vrrp: VrrpRepr<'a>) -> VrrpFrame<'a> {
        let (src_mac, dst_mac, dst_addr, ethertype) = match src_addr {
            IpAddr::V4(_) => (
                virtual_mac_v4(vrrp.vrid),
                IPV4_GROUP_MAC,
                IpAddr::V4(IPV4_GROUP),
                EtherType::Ipv4,
            ),
            IpAddr::V6(_) => (
                virtual_mac_v6(vrrp.vrid),
                IPV6_GROUP_MAC,
                IpAddr::V6(IPV6_GROUP),
                EtherType::Ipv6,
            ),
        };
        VrrpFrame {
            ethernet: EthernetRepr {
                dst: dst_mac,
                src: src_mac,
                ethertype,
            },
            packet: VrrpPacket {
                src_addr,
                dst_addr,
                vrrp,
            },
        }
    }

    /// Reads an Ethernet frame carrying VRRP over IPv4 or IPv6; any other EtherType is
    /// [`Error::UnexpectedEtherType`].
    pub fn parse(frame: &'a [u8]) -> Result<VrrpFrame<'a>> {
        let (ethernet, payload) = EthernetRepr::parse(frame)?;
        let packet = match ethernet.ethertype {
            EtherType::Ipv4 => VrrpPacket::parse_ipv4(payload)?,
            EtherType::Ipv6 => VrrpPacket::parse_ipv6(payload)?,
            other => return Err(Error::UnexpectedEtherType(other.into())),
        };
        Ok(VrrpFrame { ethernet, packet })
    }

    /// Length of the frame.
    pub const fn frame_len(&self) -> usize {
        ethernet::HEADER_LEN + self.packet.buffer_len()
    }

    /// Writes the frame into the first [`VrrpFrame::frame_len`] bytes of `frame`.
    pub fn emit(&self, frame: &mut [u8]) -> Result<()> {
        if frame.len() < self.frame_len() {
            return Err(Error::BufferTooSmall);
        }
        let rest = self.ethernet.emit(frame)?;
        self.packet.emit(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::golden;

    const V4_ADDRS: [Ipv4Addr; 2] = [Ipv4Addr::new(192, 0, 2, 100), Ipv4Addr::new(192, 0, 2, 101)];
    const V6_ADDRS: [Ipv6Addr; 2] = [
        Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 7),
        Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x100),
    ];
    const V4_SRC: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
    const V6_SRC: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1));

    fn v4() -> VrrpFrame<'static> {
        VrrpFrame::advertisement(
            V4_SRC,
            VrrpRepr {
                vrid: 7,
                priority: 100,
                max_advert_interval: 100,
                addresses: VrrpAddresses::Ipv4(&V4_ADDRS),
            },
        )
    }

    fn v6() -> VrrpFrame<'static> {
        VrrpFrame::advertisement(
            V6_SRC,
            VrrpRepr {
                vrid: 7,
                priority: 200,
                max_advert_interval: 35,
                addresses: VrrpAddresses::Ipv6(&V6_ADDRS),
            },
        )
    }

    fn emitted(f: &VrrpFrame<'_>) -> Vec<u8> {
        let mut buf = vec![0xa5u8; f.frame_len()];
        f.emit(&mut buf).unwrap();
        buf
    }

    #[test]
    fn virtual_macs_follow_rfc_9568() {
        assert_eq!(virtual_mac_v4(7), MacAddr(0, 0, 0x5e, 0, 1, 7));
        assert_eq!(virtual_mac_v6(255), MacAddr(0, 0, 0x5e, 0, 2, 255));
    }

    #[test]
    fn read_ipv4_advert_fields_at_their_offsets() {
        let m = &golden::VRRP_V4[34..];
        assert_eq!(m[field::VERSION_TYPE], 0x31);
        assert_eq!(m[field::VRID], 7);
        assert_eq!(m[field::PRIORITY], 100);
        assert_eq!(m[field::COUNT], 2);
        assert_eq!(&m[field::INTERVAL], &[0, 100]);
        assert_eq!(
            &m[field::ADDRESSES..field::ADDRESSES + 4],
            &[192, 0, 2, 100]
        );
    }

    #[test]
    fn parse_ipv4_golden_vector() {
        let f = VrrpFrame::parse(&golden::VRRP_V4).unwrap();
        assert_eq!(f, v4());
        let addrs: Vec<IpAddr> = f.packet.vrrp.addresses.iter().collect();
        assert_eq!(
            addrs,
            vec![IpAddr::V4(V4_ADDRS[0]), IpAddr::V4(V4_ADDRS[1])]
        );
    }

    #[test]
    fn emit_ipv4_into_junk_gives_the_golden_frame() {
        assert_eq!(emitted(&v4()), golden::VRRP_V4);
    }

    #[test]
    fn parse_ipv6_golden_vector() {
        assert_eq!(VrrpFrame::parse(&golden::VRRP_V6), Ok(v6()));
    }

    #[test]
    fn emit_ipv6_into_junk_gives_the_golden_frame() {
        assert_eq!(emitted(&v6()), golden::VRRP_V6);
    }

    fn message_v4() -> Vec<u8> {
        golden::VRRP_V4[34..].to_vec()
    }

    fn parse_v4(m: &[u8]) -> Result<VrrpRepr<'_>> {
        VrrpRepr::parse(V4_SRC, IpAddr::V4(IPV4_GROUP), m)
    }

    #[test]
    fn version_2_is_rejected() {
        let mut m = message_v4();
        m[0] = 0x21;
        assert_eq!(parse_v4(&m), Err(Error::VrrpVersion(2)));
    }

    #[test]
    fn type_other_than_advertisement_is_rejected() {
        let mut m = message_v4();
        m[0] = 0x32;
        assert_eq!(parse_v4(&m), Err(Error::VrrpType(2)));
    }

    #[test]
    fn ttl_below_255_is_rejected() {
        let mut f = golden::VRRP_V4;
        f[22] = 64;
        // Fix the IPv4 header checksum so only the TTL is wrong.
        f[24..26].copy_from_slice(&[0, 0]);
        let sum = checksum::combine(&[checksum::sum(&f[14..34])]);
        f[24..26].copy_from_slice(&sum.to_be_bytes());
        assert_eq!(VrrpFrame::parse(&f), Err(Error::HopLimit(64)));
    }

    #[test]
    fn hop_limit_below_255_is_rejected() {
        let mut f = golden::VRRP_V6;
        f[21] = 1;
        assert_eq!(VrrpFrame::parse(&f), Err(Error::HopLimit(1)));
    }

    #[test]
    fn bad_checksum_is_rejected() {
        let mut m = message_v4();
        m[7] ^= 1;
        assert_eq!(parse_v4(&m), Err(Error::BadChecksum));
    }

    #[test]
    fn address_count_larger_than_the_list_is_rejected() {
        let mut m = message_v4();
        m[3] = 3;
        assert_eq!(parse_v4(&m), Err(Error::VrrpAddressCount(3)));
    }

    #[test]
    fn address_count_smaller_than_the_list_is_rejected() {
        let mut m = message_v4();
        m[3] = 1;
        assert_eq!(parse_v4(&m), Err(Error::VrrpAddressCount(1)));
    }

    #[test]
    fn message_shorter_than_the_header_is_truncated() {
        let m = message_v4();
        for len in 0..HEADER_LEN {
            assert_eq!(parse_v4(&m[..len]), Err(Error::Truncated));
        }
    }

    #[test]
    fn checksum_without_pseudo_header_is_rejected() {
        // VRRPv2-style checksum (message only) must not pass as VRRPv3.
        let mut m = message_v4();
        m[6..8].copy_from_slice(&[0, 0]);
        let sum = checksum::combine(&[checksum::sum(&m)]);
        m[6..8].copy_from_slice(&sum.to_be_bytes());
        assert_eq!(parse_v4(&m), Err(Error::BadChecksum));
    }

    #[test]
    fn interval_above_12_bits_is_refused_on_emit() {
        let mut f = v4();
        f.packet.vrrp.max_advert_interval = 4096;
        let mut buf = vec![0u8; f.frame_len()];
        assert!(matches!(f.emit(&mut buf), Err(Error::OutOfRange(_))));
    }

    #[test]
    fn addresses_of_the_other_family_are_refused_on_emit() {
        let mut f = v4();
        f.packet.vrrp.addresses = VrrpAddresses::Ipv6(&V6_ADDRS);
        let mut buf = vec![0u8; 200];
        assert!(matches!(f.emit(&mut buf), Err(Error::OutOfRange(_))));
    }

    #[test]
    fn more_than_255_addresses_are_refused_on_emit() {
        let many = [Ipv4Addr::new(192, 0, 2, 1); 256];
        let mut f = v4();
        f.packet.vrrp.addresses = VrrpAddresses::Ipv4(&many);
        let mut buf = vec![0u8; f.frame_len()];
        assert!(matches!(f.emit(&mut buf), Err(Error::OutOfRange(_))));
    }

    #[test]
    fn frame_of_another_ethertype_is_not_vrrp() {
        assert_eq!(
            VrrpFrame::parse(&golden::ARP_REQUEST),
            Err(Error::UnexpectedEtherType(0x0806))
        );
    }

    #[test]
    fn emit_into_a_short_buffer_is_refused() {
        let f = v6();
        let mut buf = vec![0u8; f.frame_len() - 1];
        assert_eq!(f.emit(&mut buf), Err(Error::BufferTooSmall));
    }

    #[test]
    fn wire_and_value_address_lists_compare_by_content() {
        let wire = [192, 0, 2, 100, 192, 0, 2, 101];
        assert_eq!(
            VrrpAddresses::Ipv4Wire(&wire),
            VrrpAddresses::Ipv4(&V4_ADDRS)
        );
        assert_ne!(
            VrrpAddresses::Ipv4Wire(&wire[..4]),
            VrrpAddresses::Ipv4(&V4_ADDRS)
        );
    }
}
