//! Ethernet II framing: the 14-byte header, the EtherTypes swimlb handles, and MAC addresses.
//!
//! [`EthernetRepr::parse`] never fails on a frame of 14 bytes or more: an EtherType it does not
//! know is [`EtherType::Unknown`], so only the layer above decides to drop. The MAC type is
//! `pnet_base`'s [`MacAddr`], re-exported, so callers that also use `pnet_datalink` share it.
//! 802.1Q tags are not interpreted (the tagged frame reads as `Unknown(0x8100)`).

pub use pnet_base::MacAddr;

use crate::{Error, Result};
use pnet_packet::ethernet::{EtherType as PnetEtherType, EthernetPacket, MutableEthernetPacket};

/// Length of the Ethernet II header.
pub const HEADER_LEN: usize = 14;
/// The all-ones broadcast address.
pub const BROADCAST: MacAddr = MacAddr(0xff, 0xff, 0xff, 0xff, 0xff, 0xff);
/// The all-zeros address (the ARP request's unknown target).
pub const ZERO: MacAddr = MacAddr(0, 0, 0, 0, 0, 0);

/// The EtherType field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EtherType {
    /// 0x0800.
    Ipv4,
    /// 0x0806.
    Arp,
    /// 0x86dd.
    Ipv6,
    /// Anything else, kept so that reading never fails.
    Unknown(u16),
}

impl From<u16> for EtherType {
    fn from(value: u16) -> Self {
        match value {
            0x0800 => EtherType::Ipv4,
            0x0806 => EtherType::Arp,
            0x86dd => EtherType::Ipv6,
            other => EtherType::Unknown(other),
        }
    }
}

impl From<EtherType> for u16 {
    fn from(value: EtherType) -> Self {
        match value {
            EtherType::Ipv4 => 0x0800,
            EtherType::Arp => 0x0806,
            EtherType::Ipv6 => 0x86dd,
            EtherType::Unknown(other) => other,
        }
    }
}

/// True for a group (multicast or broadcast) address: the I/G bit of the first octet.
pub fn is_multicast(mac: MacAddr) -> bool {
    mac.0 & 1 == 1
}

/// The Ethernet II header, as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EthernetRepr {
    /// Destination address.
    pub dst: MacAddr,
    /// Source address.
    pub src: MacAddr,
    /// What the payload is.
    pub ethertype: EtherType,
}

impl EthernetRepr {
    /// Reads the header of `frame` and returns it with the payload (which may include padding).
    ///
    /// Fails only with [`Error::Truncated`] when `frame` is shorter than [`HEADER_LEN`].
    pub fn parse(frame: &[u8]) -> Result<(EthernetRepr, &[u8])> {
        let packet = EthernetPacket::new(frame).ok_or(Error::Truncated)?;
        let repr = EthernetRepr {
            dst: packet.get_destination(),
            src: packet.get_source(),
            ethertype: EtherType::from(packet.get_ethertype().0),
        };
        Ok((repr, &frame[HEADER_LEN..]))
    }

    /// Length of the header: [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of `frame` and returns the rest.
    pub fn emit<'a>(&self, frame: &'a mut [u8]) -> Result<&'a mut [u8]> {
        let mut packet = MutableEthernetPacket::new(frame).ok_or(Error::BufferTooSmall)?;
        packet.set_destination(self.dst);
        packet.set_source(self.src);
        packet.set_ethertype(PnetEtherType(self.ethertype.into()));
        Ok(&mut frame[HEADER_LEN..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Ethernet header of the ARP golden vector in `arp.rs` (scapy).
    const HEADER: [u8; 14] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06,
    ];

    fn repr() -> EthernetRepr {
        EthernetRepr {
            dst: BROADCAST,
            src: MacAddr(2, 0, 0, 0, 0, 1),
            ethertype: EtherType::Arp,
        }
    }

    #[test]
    fn parse_reads_the_header_and_returns_the_payload() {
        let mut frame = HEADER.to_vec();
        frame.extend_from_slice(b"xyz");
        let (r, payload) = EthernetRepr::parse(&frame).unwrap();
        assert_eq!(r, repr());
        assert_eq!(payload, b"xyz");
    }

    #[test]
    fn emit_into_a_junk_filled_buffer_writes_the_golden_bytes() {
        let mut buf = [0xa5u8; 14];
        let rest = repr().emit(&mut buf).unwrap();
        assert!(rest.is_empty());
        assert_eq!(buf, HEADER);
    }

    #[test]
    fn frame_shorter_than_the_header_is_truncated() {
        for len in 0..HEADER_LEN {
            assert_eq!(EthernetRepr::parse(&HEADER[..len]), Err(Error::Truncated));
        }
    }

    #[test]
    fn emit_into_a_short_buffer_is_refused() {
        assert_eq!(repr().emit(&mut [0u8; 13]), Err(Error::BufferTooSmall));
    }

    #[test]
    fn unknown_ethertype_reads_as_unknown() {
        let mut frame = HEADER;
        frame[12..14].copy_from_slice(&[0x81, 0x00]);
        let (r, _) = EthernetRepr::parse(&frame).unwrap();
        assert_eq!(r.ethertype, EtherType::Unknown(0x8100));
        assert_eq!(u16::from(r.ethertype), 0x8100);
    }

    #[test]
    fn group_bit_marks_multicast() {
        assert!(is_multicast(BROADCAST));
        assert!(is_multicast(MacAddr(0x33, 0x33, 0, 0, 0, 1)));
        assert!(!is_multicast(MacAddr(2, 0, 0, 0, 0, 1)));
    }
}
