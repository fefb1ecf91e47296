//! The IPv4 and IPv6 headers that carry neighbor discovery and VRRP.
//!
//! Only what those protocols need: a fixed IPv6 header with no extension headers, and an IPv4
//! header whose options are skipped. [`Ipv4Header::parse`] verifies the header checksum and
//! rejects fragments; both parsers trim the payload to the length the header declares (dropping
//! Ethernet padding) and reject a declared length longer than the bytes present. Reading uses
//! `pnet_packet`'s views after the length checks.

use core::net::{Ipv4Addr, Ipv6Addr};

use pnet_packet::ip::IpNextHeaderProtocol;
use pnet_packet::ipv4::{Ipv4Packet, MutableIpv4Packet};
use pnet_packet::ipv6::{Ipv6Packet, MutableIpv6Packet};

use crate::checksum;
use crate::{Error, Result};

/// Length of an IPv4 header without options.
pub const IPV4_HEADER_LEN: usize = 20;
/// Length of the fixed IPv6 header.
pub const IPV6_HEADER_LEN: usize = 40;
/// The traffic class / TOS byte swimlb sends control traffic with: DSCP CS6 (network control),
/// as keepalived does.
pub const NETWORK_CONTROL_TOS: u8 = 0xc0;

/// An IPv4 header, as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Header {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Protocol of the payload.
    pub protocol: u8,
    /// Time to live.
    pub ttl: u8,
    /// The TOS byte (DSCP and ECN).
    pub tos: u8,
    /// Length of the payload in bytes.
    pub payload_len: u16,
}

impl Ipv4Header {
    /// Reads an IPv4 header and returns it with its payload, trimmed to the total length.
    ///
    /// Rejects: fewer than 20 bytes ([`Error::Truncated`]); version not 4, header length below
    /// 20 or beyond the buffer, total length below the header length or beyond the buffer
    /// ([`Error::MalformedIpHeader`]); bad header checksum ([`Error::BadIpv4HeaderChecksum`]);
    /// a fragment ([`Error::Fragmented`]).
    pub fn parse(packet: &[u8]) -> Result<(Ipv4Header, &[u8])> {
        let view = Ipv4Packet::new(packet).ok_or(Error::Truncated)?;
        if view.get_version() != 4 {
            return Err(Error::MalformedIpHeader("ipv4 version is not 4"));
        }
        let header_len = usize::from(view.get_header_length()) * 4;
        if header_len < IPV4_HEADER_LEN || header_len > packet.len() {
            return Err(Error::MalformedIpHeader("ipv4 header length"));
        }
        let total_len = usize::from(view.get_total_length());
        if total_len < header_len || total_len > packet.len() {
            return Err(Error::MalformedIpHeader("ipv4 total length"));
        }
        if !checksum::verify(0, &packet[..header_len]) {
            return Err(Error::BadIpv4HeaderChecksum);
        }
        // More-fragments flag (bit 0 of the 3-bit flags) or a non-zero offset.
        if view.get_flags() & 0b001 != 0 || view.get_fragment_offset() != 0 {
            return Err(Error::Fragmented);
        }
        let header = Ipv4Header {
            src: view.get_source(),
            dst: view.get_destination(),
            protocol: view.get_next_level_protocol().0,
            ttl: view.get_ttl(),
            tos: (view.get_dscp() << 2) | view.get_ecn(),
            payload_len: (total_len - header_len) as u16,
        };
        Ok((header, &packet[header_len..total_len]))
    }

    /// Length of the header: [`IPV4_HEADER_LEN`] (no options are written).
    pub const fn buffer_len(&self) -> usize {
        IPV4_HEADER_LEN
    }

    /// Writes a 20-byte header (identification 0, no flags) with its checksum and returns the
    /// rest of `packet`.
    pub fn emit<'a>(&self, packet: &'a mut [u8]) -> Result<&'a mut [u8]> {
        let total = IPV4_HEADER_LEN + usize::from(self.payload_len);
        let total = u16::try_from(total).map_err(|_| Error::OutOfRange("ipv4 total length"))?;
        let mut view = MutableIpv4Packet::new(packet).ok_or(Error::BufferTooSmall)?;
        view.set_version(4);
        view.set_header_length(5);
        view.set_dscp(self.tos >> 2);
        view.set_ecn(self.tos & 0b11);
        view.set_total_length(total);
        view.set_identification(0);
        view.set_flags(0);
        view.set_fragment_offset(0);
        view.set_ttl(self.ttl);
        view.set_next_level_protocol(IpNextHeaderProtocol(self.protocol));
        view.set_checksum(0);
        view.set_source(self.src);
        view.set_destination(self.dst);
        let sum = checksum::combine(&[checksum::sum(&packet[..IPV4_HEADER_LEN])]);
        packet[10..12].copy_from_slice(&sum.to_be_bytes());
        Ok(&mut packet[IPV4_HEADER_LEN..])
    }
}

/// The fixed IPv6 header, as values (the flow label is written as 0 and not read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Header {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// Next header (protocol of the payload).
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Length of the payload in bytes.
    pub payload_len: u16,
}

impl Ipv6Header {
    /// Reads the fixed IPv6 header and returns it with its payload, trimmed to the payload
    /// length.
    ///
    /// Rejects: fewer than 40 bytes ([`Error::Truncated`]); version not 6 or a payload length
    /// beyond the buffer ([`Error::MalformedIpHeader`]).
    pub fn parse(packet: &[u8]) -> Result<(Ipv6Header, &[u8])> {
        let view = Ipv6Packet::new(packet).ok_or(Error::Truncated)?;
        if view.get_version() != 6 {
            return Err(Error::MalformedIpHeader("ipv6 version is not 6"));
        }
        let payload_len = view.get_payload_length();
        let end = IPV6_HEADER_LEN + usize::from(payload_len);
        if end > packet.len() {
            return Err(Error::MalformedIpHeader("ipv6 payload length"));
        }
        let header = Ipv6Header {
            src: view.get_source(),
            dst: view.get_destination(),
            next_header: view.get_next_header().0,
            hop_limit: view.get_hop_limit(),
            traffic_class: view.get_traffic_class(),
            payload_len,
        };
        Ok((header, &packet[IPV6_HEADER_LEN..end]))
    }

    /// Length of the header: [`IPV6_HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        IPV6_HEADER_LEN
    }

    /// Writes the header (flow label 0) and returns the rest of `packet`.
    pub fn emit<'a>(&self, packet: &'a mut [u8]) -> Result<&'a mut [u8]> {
        let mut view = MutableIpv6Packet::new(packet).ok_or(Error::BufferTooSmall)?;
        view.set_version(6);
        view.set_traffic_class(self.traffic_class);
        view.set_flow_label(0);
        view.set_payload_length(self.payload_len);
        view.set_next_header(IpNextHeaderProtocol(self.next_header));
        view.set_hop_limit(self.hop_limit);
        view.set_source(self.src);
        view.set_destination(self.dst);
        Ok(&mut packet[IPV6_HEADER_LEN..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ethernet, golden};

    fn ip(frame: &[u8]) -> &[u8] {
        &frame[ethernet::HEADER_LEN..]
    }

    #[test]
    fn ipv4_header_of_the_vrrp_golden_vector_reads_and_writes_back() {
        let (h, payload) = Ipv4Header::parse(ip(&golden::VRRP_V4)).unwrap();
        assert_eq!(h.src, Ipv4Addr::new(192, 0, 2, 1));
        assert_eq!(h.dst, Ipv4Addr::new(224, 0, 0, 18));
        assert_eq!(
            (h.protocol, h.ttl, h.tos, h.payload_len),
            (112, 255, 0xc0, 16)
        );
        assert_eq!(payload.len(), 16);
        let mut buf = [0xa5u8; IPV4_HEADER_LEN];
        h.emit(&mut buf).unwrap();
        assert_eq!(&buf[..], &ip(&golden::VRRP_V4)[..IPV4_HEADER_LEN]);
    }

    #[test]
    fn ipv6_header_of_the_vrrp_golden_vector_reads_and_writes_back() {
        let (h, payload) = Ipv6Header::parse(ip(&golden::VRRP_V6)).unwrap();
        assert_eq!(
            (h.next_header, h.hop_limit, h.traffic_class),
            (112, 255, 0xc0)
        );
        assert_eq!(payload.len(), 40);
        let mut buf = [0xa5u8; IPV6_HEADER_LEN];
        h.emit(&mut buf).unwrap();
        assert_eq!(&buf[..], &ip(&golden::VRRP_V6)[..IPV6_HEADER_LEN]);
    }

    #[test]
    fn ipv4_with_a_bad_header_checksum_is_rejected() {
        let mut p = ip(&golden::VRRP_V4).to_vec();
        p[10] ^= 1;
        assert_eq!(Ipv4Header::parse(&p), Err(Error::BadIpv4HeaderChecksum));
    }

    #[test]
    fn ipv4_fragment_is_rejected() {
        let (mut h, _) = Ipv4Header::parse(ip(&golden::VRRP_V4)).unwrap();
        h.payload_len = 0;
        let mut p = [0u8; IPV4_HEADER_LEN];
        h.emit(&mut p).unwrap();
        p[6] = 0x20; // more fragments
        p[10..12].copy_from_slice(&[0, 0]);
        let sum = checksum::combine(&[checksum::sum(&p)]);
        p[10..12].copy_from_slice(&sum.to_be_bytes());
        assert_eq!(Ipv4Header::parse(&p), Err(Error::Fragmented));
    }

    #[test]
    fn ipv4_total_length_beyond_the_buffer_is_rejected() {
        let p = ip(&golden::VRRP_V4);
        assert_eq!(
            Ipv4Header::parse(&p[..p.len() - 1]),
            Err(Error::MalformedIpHeader("ipv4 total length"))
        );
    }

    #[test]
    fn ipv6_payload_length_beyond_the_buffer_is_rejected() {
        let p = ip(&golden::VRRP_V6);
        assert_eq!(
            Ipv6Header::parse(&p[..p.len() - 1]),
            Err(Error::MalformedIpHeader("ipv6 payload length"))
        );
    }

    #[test]
    fn wrong_ip_versions_are_rejected() {
        let mut p = ip(&golden::VRRP_V6).to_vec();
        p[0] = 0x4c;
        assert_eq!(
            Ipv6Header::parse(&p),
            Err(Error::MalformedIpHeader("ipv6 version is not 6"))
        );
        let mut p = ip(&golden::VRRP_V4).to_vec();
        p[0] = 0x65;
        assert_eq!(
            Ipv4Header::parse(&p),
            Err(Error::MalformedIpHeader("ipv4 version is not 4"))
        );
    }

    #[test]
    fn padding_after_the_ip_packet_is_dropped() {
        let mut p = ip(&golden::VRRP_V4).to_vec();
        p.extend_from_slice(&[0; 10]);
        let (_, payload) = Ipv4Header::parse(&p).unwrap();
        assert_eq!(payload.len(), 16);
    }
}
