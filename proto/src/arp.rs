//! ARP for IPv4 over Ethernet (RFC 826), including gratuitous ARP (RFC 5227 section 3, RFC 5944
//! section 4.6).
//!
//! [`ArpRepr`] is the 28-byte Ethernet/IPv4 ARP packet as values. [`ArpRepr::parse`] accepts only
//! hardware type 1, protocol type 0x0800, lengths 6 and 4, and opcodes 1 (request) and 2 (reply);
//! everything else is an [`Error`] naming the field. Trailing bytes (Ethernet padding) are
//! ignored. Reading uses `pnet_packet`'s [`ArpPacket`] view after the length check it does.
//!
//! The constructors build what the speaker sends: [`ArpRepr::gratuitous_request`] (sender IP =
//! target IP, target MAC zero), [`ArpRepr::gratuitous_reply`] (target MAC broadcast) and
//! [`ArpRepr::reply_to`]; [`ArpRepr::emit_frame`] wraps one in its Ethernet header with the
//! right destination (broadcast for requests and gratuitous replies).

use core::net::Ipv4Addr;

use pnet_packet::arp::{
    ArpHardwareType, ArpOperation as PnetArpOperation, ArpPacket, MutableArpPacket,
};
use pnet_packet::ethernet::EtherType as PnetEtherType;

use crate::ethernet::{self, EtherType, EthernetRepr, MacAddr};
use crate::{Error, Result};

/// Length of an Ethernet/IPv4 ARP packet.
pub const PACKET_LEN: usize = 28;
/// Length of an ARP packet in its Ethernet frame, without padding to the 60-byte minimum.
pub const FRAME_LEN: usize = ethernet::HEADER_LEN + PACKET_LEN;

/// The ARP opcodes swimlb understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArpOperation {
    /// Opcode 1.
    Request,
    /// Opcode 2.
    Reply,
}

impl ArpOperation {
    /// The wire value.
    pub const fn code(self) -> u16 {
        match self {
            ArpOperation::Request => 1,
            ArpOperation::Reply => 2,
        }
    }

    /// A short, stable, lowercase name for logs and metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            ArpOperation::Request => "request",
            ArpOperation::Reply => "reply",
        }
    }
}

/// An Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ArpRepr {
    /// Request or reply.
    pub operation: ArpOperation,
    /// Sender hardware address.
    pub sender_mac: MacAddr,
    /// Sender protocol address.
    pub sender_ip: Ipv4Addr,
    /// Target hardware address (zero in a request).
    pub target_mac: MacAddr,
    /// Target protocol address.
    pub target_ip: Ipv4Addr,
}

impl ArpRepr {
    /// Reads an ARP packet (the payload of an Ethernet frame of type 0x0806).
    ///
    /// Checks, in order: length ([`Error::Truncated`]), hardware type
    /// ([`Error::ArpHardwareType`]), protocol type ([`Error::ArpProtocolType`]), hardware length
    /// ([`Error::ArpHardwareLength`]), protocol length ([`Error::ArpProtocolLength`]), opcode
    /// ([`Error::ArpOperation`]).
    pub fn parse(packet: &[u8]) -> Result<ArpRepr> {
        let view = ArpPacket::new(packet).ok_or(Error::Truncated)?;
        let htype = view.get_hardware_type().0;
        if htype != 1 {
            return Err(Error::ArpHardwareType(htype));
        }
        let ptype = view.get_protocol_type().0;
        if ptype != 0x0800 {
            return Err(Error::ArpProtocolType(ptype));
        }
        let hlen = view.get_hw_addr_len();
        if hlen != 6 {
            return Err(Error::ArpHardwareLength(hlen));
        }
        let plen = view.get_proto_addr_len();
        if plen != 4 {
            return Err(Error::ArpProtocolLength(plen));
        }
        let operation = match view.get_operation().0 {
            1 => ArpOperation::Request,
            2 => ArpOperation::Reply,
            other => return Err(Error::ArpOperation(other)),
        };
        Ok(ArpRepr {
            operation,
            sender_mac: view.get_sender_hw_addr(),
            sender_ip: view.get_sender_proto_addr(),
            target_mac: view.get_target_hw_addr(),
            target_ip: view.get_target_proto_addr(),
        })
    }

    /// Length of the packet: [`PACKET_LEN`].
    pub const fn buffer_len(&self) -> usize {
        PACKET_LEN
    }

    /// Writes the packet into the first [`PACKET_LEN`] bytes of `packet`.
    pub fn emit(&self, packet: &mut [u8]) -> Result<()> {
        let mut view = MutableArpPacket::new(packet).ok_or(Error::BufferTooSmall)?;
        view.set_hardware_type(ArpHardwareType(1));
        view.set_protocol_type(PnetEtherType(0x0800));
        view.set_hw_addr_len(6);
        view.set_proto_addr_len(4);
        view.set_operation(PnetArpOperation(self.operation.code()));
        view.set_sender_hw_addr(self.sender_mac);
        view.set_sender_proto_addr(self.sender_ip);
        view.set_target_hw_addr(self.target_mac);
        view.set_target_proto_addr(self.target_ip);
        Ok(())
    }

    /// A gratuitous ARP in request form (an "ARP announcement", RFC 5227 section 3): `mac` claims
    /// `ip`, sender IP = target IP, target MAC zero; sent to broadcast.
    pub const fn gratuitous_request(mac: MacAddr, ip: Ipv4Addr) -> ArpRepr {
        ArpRepr {
            operation: ArpOperation::Request,
            sender_mac: mac,
            sender_ip: ip,
            target_mac: ethernet::ZERO,
            target_ip: ip,
        }
    }

    /// A gratuitous ARP in reply form: `mac` claims `ip`, sender IP = target IP, target MAC
    /// broadcast; sent to broadcast. Some hosts only refresh their caches on replies.
    pub const fn gratuitous_reply(mac: MacAddr, ip: Ipv4Addr) -> ArpRepr {
        ArpRepr {
            operation: ArpOperation::Reply,
            sender_mac: mac,
            sender_ip: ip,
            target_mac: ethernet::BROADCAST,
            target_ip: ip,
        }
    }

    /// A request for the MAC of `target`, from `mac` at `sender` (`0.0.0.0`: an ARP probe, RFC
    /// 5227 section 2.1.1, which the target answers without learning the sender); sent to
    /// broadcast.
    pub const fn request(mac: MacAddr, sender: Ipv4Addr, target: Ipv4Addr) -> ArpRepr {
        ArpRepr {
            operation: ArpOperation::Request,
            sender_mac: mac,
            sender_ip: sender,
            target_mac: ethernet::ZERO,
            target_ip: target,
        }
    }

    /// The reply that says `our_mac` has the address `self` asks for, addressed to the asker;
    /// `None` when `self` is not a request.
    pub const fn reply_to(&self, our_mac: MacAddr) -> Option<ArpRepr> {
        match self.operation {
            ArpOperation::Reply => None,
            ArpOperation::Request => Some(ArpRepr {
                operation: ArpOperation::Reply,
                sender_mac: our_mac,
                sender_ip: self.target_ip,
                target_mac: self.sender_mac,
                target_ip: self.sender_ip,
            }),
        }
    }

    /// True when the sender announces its own address (sender IP = target IP), in either form.
    pub fn is_gratuitous(&self) -> bool {
        self.sender_ip == self.target_ip
    }

    /// The Ethernet destination this packet is sent to: broadcast for a request and for a
    /// gratuitous reply, the target's MAC for any other reply.
    pub fn ethernet_dst(&self) -> MacAddr {
        match self.operation {
            ArpOperation::Request => ethernet::BROADCAST,
            ArpOperation::Reply if self.is_gratuitous() => ethernet::BROADCAST,
            ArpOperation::Reply => self.target_mac,
        }
    }

    /// Length of the packet in its Ethernet frame: [`FRAME_LEN`].
    pub const fn frame_len(&self) -> usize {
        FRAME_LEN
    }

    /// Writes the Ethernet frame (source = sender MAC, destination = [`ArpRepr::ethernet_dst`])
    /// into the first [`FRAME_LEN`] bytes of `frame`.
    pub fn emit_frame(&self, frame: &mut [u8]) -> Result<()> {
        if frame.len() < FRAME_LEN {
            return Err(Error::BufferTooSmall);
        }
        let eth = EthernetRepr {
            dst: self.ethernet_dst(),
            src: self.sender_mac,
            ethertype: EtherType::Arp,
        };
        let payload = eth.emit(frame)?;
        self.emit(payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::golden;

    const A_MAC: MacAddr = MacAddr(2, 0, 0, 0, 0, 1);
    const B_MAC: MacAddr = MacAddr(2, 0, 0, 0, 0, 2);
    const A_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
    const B_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 20);

    fn request() -> ArpRepr {
        ArpRepr {
            operation: ArpOperation::Request,
            sender_mac: B_MAC,
            sender_ip: B_IP,
            target_mac: ethernet::ZERO,
            target_ip: A_IP,
        }
    }

    #[test]
    fn a_request_for_a_peer_is_the_kernels_request_and_goes_to_broadcast() {
        assert_eq!(ArpRepr::request(B_MAC, B_IP, A_IP), request());
        let probe = ArpRepr::request(B_MAC, Ipv4Addr::UNSPECIFIED, A_IP);
        assert!(!probe.is_gratuitous());
        assert_eq!(probe.ethernet_dst(), ethernet::BROADCAST);
        let mut frame = [0u8; FRAME_LEN];
        probe.emit_frame(&mut frame).unwrap();
        assert_eq!(ArpRepr::parse(body(&frame)).unwrap(), probe);
    }

    fn body(frame: &[u8]) -> &[u8] {
        &frame[ethernet::HEADER_LEN..]
    }

    #[test]
    fn read_request_fields_through_the_view() {
        let view = ArpPacket::new(body(&golden::ARP_REQUEST)).unwrap();
        assert_eq!(view.get_operation().0, 1);
        assert_eq!(view.get_sender_proto_addr(), B_IP);
        assert_eq!(view.get_target_proto_addr(), A_IP);
    }

    #[test]
    fn write_request_into_a_junk_filled_buffer_gives_the_golden_bytes() {
        let mut buf = [0xa5u8; PACKET_LEN];
        request().emit(&mut buf).unwrap();
        assert_eq!(&buf[..], body(&golden::ARP_REQUEST));
    }

    #[test]
    fn parse_request_golden_vector() {
        assert_eq!(ArpRepr::parse(body(&golden::ARP_REQUEST)), Ok(request()));
    }

    #[test]
    fn emit_request_frame_gives_the_golden_frame() {
        let mut buf = [0xa5u8; FRAME_LEN];
        request().emit_frame(&mut buf).unwrap();
        assert_eq!(buf, golden::ARP_REQUEST);
    }

    #[test]
    fn reply_to_the_golden_request_is_the_golden_reply() {
        let reply = request().reply_to(A_MAC).unwrap();
        assert_eq!(ArpRepr::parse(body(&golden::ARP_REPLY)), Ok(reply));
        let mut buf = [0xa5u8; FRAME_LEN];
        reply.emit_frame(&mut buf).unwrap();
        assert_eq!(buf, golden::ARP_REPLY);
        assert_eq!(reply.reply_to(A_MAC), None);
    }

    #[test]
    fn gratuitous_request_matches_the_golden_frame() {
        let garp = ArpRepr::gratuitous_request(A_MAC, A_IP);
        assert!(garp.is_gratuitous());
        assert_eq!(ArpRepr::parse(body(&golden::GARP_REQUEST)), Ok(garp));
        let mut buf = [0xa5u8; FRAME_LEN];
        garp.emit_frame(&mut buf).unwrap();
        assert_eq!(buf, golden::GARP_REQUEST);
    }

    #[test]
    fn gratuitous_reply_matches_the_golden_frame_and_goes_to_broadcast() {
        let garp = ArpRepr::gratuitous_reply(A_MAC, A_IP);
        assert_eq!(garp.ethernet_dst(), ethernet::BROADCAST);
        assert_eq!(ArpRepr::parse(body(&golden::GARP_REPLY)), Ok(garp));
        let mut buf = [0xa5u8; FRAME_LEN];
        garp.emit_frame(&mut buf).unwrap();
        assert_eq!(buf, golden::GARP_REPLY);
    }

    #[test]
    fn trailing_ethernet_padding_is_ignored() {
        let mut padded = body(&golden::ARP_REQUEST).to_vec();
        padded.extend_from_slice(&[0; 18]);
        assert_eq!(ArpRepr::parse(&padded), Ok(request()));
    }

    #[test]
    fn packet_shorter_than_28_bytes_is_truncated() {
        for len in 0..PACKET_LEN {
            assert_eq!(
                ArpRepr::parse(&body(&golden::ARP_REQUEST)[..len]),
                Err(Error::Truncated)
            );
        }
    }

    fn mutated(offset: usize, bytes: &[u8]) -> Vec<u8> {
        let mut p = body(&golden::ARP_REQUEST).to_vec();
        p[offset..offset + bytes.len()].copy_from_slice(bytes);
        p
    }

    #[test]
    fn hardware_type_other_than_ethernet_is_rejected() {
        assert_eq!(
            ArpRepr::parse(&mutated(0, &[0, 6])),
            Err(Error::ArpHardwareType(6))
        );
    }

    #[test]
    fn protocol_type_other_than_ipv4_is_rejected() {
        assert_eq!(
            ArpRepr::parse(&mutated(2, &[0x86, 0xdd])),
            Err(Error::ArpProtocolType(0x86dd))
        );
    }

    #[test]
    fn hardware_length_other_than_6_is_rejected() {
        assert_eq!(
            ArpRepr::parse(&mutated(4, &[8])),
            Err(Error::ArpHardwareLength(8))
        );
    }

    #[test]
    fn protocol_length_other_than_4_is_rejected() {
        assert_eq!(
            ArpRepr::parse(&mutated(5, &[16])),
            Err(Error::ArpProtocolLength(16))
        );
    }

    #[test]
    fn unknown_opcode_is_rejected() {
        assert_eq!(
            ArpRepr::parse(&mutated(6, &[0, 3])),
            Err(Error::ArpOperation(3))
        );
    }

    #[test]
    fn emit_into_a_short_buffer_is_refused() {
        assert_eq!(
            request().emit(&mut [0u8; PACKET_LEN - 1]),
            Err(Error::BufferTooSmall)
        );
        assert_eq!(
            request().emit_frame(&mut [0u8; FRAME_LEN - 1]),
            Err(Error::BufferTooSmall)
        );
    }
}
