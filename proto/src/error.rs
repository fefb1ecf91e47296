//! The one error type of `swimlb-proto`.
//!
//! Every parser and the envelope return [`Error`]. It is `Copy`, carries no heap data, and has a
//! stable [`Error::as_str`] used as a metric label (`swimlb_gossip_rejected_total{reason}`,
//! frame drop counters), so a caller can count a rejection without formatting anything.

/// Why bytes were rejected or could not be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The buffer is shorter than the structure it should hold.
    #[error("truncated")]
    Truncated,
    /// The output buffer is too small for what is being emitted.
    #[error("output buffer too small")]
    BufferTooSmall,
    /// The input is larger than the format allows; nothing else was examined.
    #[error("too large")]
    TooLarge,
    /// The envelope does not start with the swimlb magic bytes.
    #[error("wrong magic")]
    WrongMagic,
    /// The envelope or the owner-watch payload carries a version this build does not speak.
    #[error("unsupported version {0}")]
    UnsupportedVersion(u8),
    /// The envelope was sealed with a key that is not in the key ring.
    #[error("unknown key id {0:02x?}")]
    UnknownKey([u8; 4]),
    /// AES-GCM authentication failed: wrong key, wrong cluster name, or tampered bytes.
    #[error("authentication failed")]
    AuthenticationFailed,
    /// The envelope (version 3 on) names another receiver than the one opening it: a datagram
    /// captured on its way to another node, or sent to an address that changed hands.
    #[error("sealed for another receiver")]
    WrongReceiver,
    /// A key ring was built without keys, with a duplicate key, or with a bad cluster name.
    #[error("invalid key ring: {0}")]
    InvalidKeyRing(&'static str),
    /// The system's random number generator failed (a nonce salt or start could not be drawn).
    #[error("no system randomness")]
    NoRandomness,
    /// ARP hardware type is not Ethernet (1).
    #[error("arp hardware type {0} is not ethernet (1)")]
    ArpHardwareType(u16),
    /// ARP protocol type is not IPv4 (0x0800).
    #[error("arp protocol type {0:#06x} is not ipv4 (0x0800)")]
    ArpProtocolType(u16),
    /// ARP hardware address length is not 6.
    #[error("arp hardware address length {0} is not 6")]
    ArpHardwareLength(u8),
    /// ARP protocol address length is not 4.
    #[error("arp protocol address length {0} is not 4")]
    ArpProtocolLength(u8),
    /// ARP opcode is neither request (1) nor reply (2).
    #[error("arp opcode {0} is neither request nor reply")]
    ArpOperation(u16),
    /// A frame parsed as one protocol carries another EtherType.
    #[error("unexpected ethertype {0:#06x}")]
    UnexpectedEtherType(u16),
    /// An IPv4 or IPv6 header is malformed: wrong version, header length, or total length.
    #[error("malformed ip header: {0}")]
    MalformedIpHeader(&'static str),
    /// An IPv4 packet is a fragment; swimlb's protocols never fragment.
    #[error("ipv4 fragment")]
    Fragmented,
    /// The IPv4 header checksum does not verify.
    #[error("bad ipv4 header checksum")]
    BadIpv4HeaderChecksum,
    /// The IPv4 TTL or IPv6 hop limit is not 255, so the packet may come from off-link
    /// (RFC 4861 section 7.1, RFC 9568 section 7.1).
    #[error("hop limit {0} is not 255")]
    HopLimit(u8),
    /// The IPv4 protocol or IPv6 next header is not the one expected here.
    #[error("unexpected ip protocol {0}")]
    IpProtocol(u8),
    /// The ICMPv6 or VRRP checksum over the pseudo-header does not verify.
    #[error("bad checksum")]
    BadChecksum,
    /// The ICMPv6 type is not a neighbor solicitation (135) or advertisement (136).
    #[error("icmpv6 type {0} is not neighbor discovery")]
    Icmpv6Type(u8),
    /// The ICMPv6 code of a neighbor discovery message is not 0.
    #[error("icmpv6 code {0} is not 0")]
    Icmpv6Code(u8),
    /// The target address of a neighbor solicitation or advertisement is multicast.
    #[error("ndp target is multicast")]
    NdpMulticastTarget,
    /// A neighbor discovery option has length 0.
    #[error("ndp option of length 0")]
    NdpZeroLengthOption,
    /// A solicitation from the unspecified address carries a source link-layer address option.
    #[error("ndp solicitation from :: with a source link-layer address option")]
    NdpUnspecifiedSourceWithLinkAddr,
    /// A solicitation from the unspecified address (duplicate address detection) is not sent to
    /// the solicited-node multicast address of its target.
    #[error("ndp duplicate address detection not sent to the solicited-node address")]
    NdpDadNotSolicitedNode,
    /// A neighbor advertisement has the Solicited flag set but a multicast destination.
    #[error("ndp solicited advertisement sent to multicast")]
    NdpSolicitedToMulticast,
    /// The VRRP version is not 3.
    #[error("vrrp version {0} is not 3")]
    VrrpVersion(u8),
    /// The VRRP type is not advertisement (1).
    #[error("vrrp type {0} is not advertisement (1)")]
    VrrpType(u8),
    /// The VRRP address count disagrees with the packet length.
    #[error("vrrp address count {0} disagrees with the packet length")]
    VrrpAddressCount(u8),
    /// A value cannot be represented on the wire (a VRRP interval above 4095 centiseconds, more
    /// than 255 addresses, or an address of the wrong family).
    #[error("value out of range: {0}")]
    OutOfRange(&'static str),
    /// A payload given to the owner-watch parser does not start with its kind byte (it is a
    /// gossip payload, or garbage); the first byte.
    #[error("not an owner-watch payload (kind byte {0:#04x})")]
    NotWatchPayload(u8),
    /// The owner-watch message type is unknown.
    #[error("unknown owner-watch message type {0}")]
    WatchMessageType(u8),
    /// An owner-watch field holds a value the format does not allow (the field is named).
    #[error("malformed owner-watch message: {0}")]
    MalformedWatch(&'static str),
    /// The gossip payload kind is unknown (the first byte).
    #[error("unknown gossip payload kind {0}")]
    GossipKind(u8),
    /// A gossip payload field holds a value the format does not allow (the field is named).
    #[error("malformed gossip payload: {0}")]
    MalformedGossip(&'static str),
    /// Bytes are left after a complete message.
    #[error("trailing bytes after the message")]
    TrailingBytes,
}

impl Error {
    /// A short, stable, lowercase name for logs and metric labels.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Error::Truncated => "truncated",
            Error::BufferTooSmall => "buffer_too_small",
            Error::TooLarge => "too_large",
            Error::WrongMagic => "wrong_magic",
            Error::UnsupportedVersion(_) => "unsupported_version",
            Error::UnknownKey(_) => "unknown_key",
            Error::AuthenticationFailed => "authentication_failed",
            Error::WrongReceiver => "wrong_receiver",
            Error::InvalidKeyRing(_) => "invalid_key_ring",
            Error::NoRandomness => "no_randomness",
            Error::ArpHardwareType(_) => "arp_hardware_type",
            Error::ArpProtocolType(_) => "arp_protocol_type",
            Error::ArpHardwareLength(_) => "arp_hardware_length",
            Error::ArpProtocolLength(_) => "arp_protocol_length",
            Error::ArpOperation(_) => "arp_operation",
            Error::UnexpectedEtherType(_) => "unexpected_ethertype",
            Error::MalformedIpHeader(_) => "malformed_ip_header",
            Error::Fragmented => "fragmented",
            Error::BadIpv4HeaderChecksum => "bad_ipv4_header_checksum",
            Error::HopLimit(_) => "hop_limit",
            Error::IpProtocol(_) => "ip_protocol",
            Error::BadChecksum => "bad_checksum",
            Error::Icmpv6Type(_) => "icmpv6_type",
            Error::Icmpv6Code(_) => "icmpv6_code",
            Error::NdpMulticastTarget => "ndp_multicast_target",
            Error::NdpZeroLengthOption => "ndp_zero_length_option",
            Error::NdpUnspecifiedSourceWithLinkAddr => "ndp_unspecified_source_with_link_addr",
            Error::NdpDadNotSolicitedNode => "ndp_dad_not_solicited_node",
            Error::NdpSolicitedToMulticast => "ndp_solicited_to_multicast",
            Error::VrrpVersion(_) => "vrrp_version",
            Error::VrrpType(_) => "vrrp_type",
            Error::VrrpAddressCount(_) => "vrrp_address_count",
            Error::OutOfRange(_) => "out_of_range",
            Error::NotWatchPayload(_) => "not_watch_payload",
            Error::WatchMessageType(_) => "watch_message_type",
            Error::MalformedWatch(_) => "malformed_watch",
            Error::GossipKind(_) => "gossip_kind",
            Error::MalformedGossip(_) => "malformed_gossip",
            Error::TrailingBytes => "trailing_bytes",
        }
    }
}

/// The result type of `swimlb-proto`.
pub type Result<T> = core::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_distinct_snake_case() {
        let all = [
            Error::Truncated,
            Error::BufferTooSmall,
            Error::TooLarge,
            Error::WrongMagic,
            Error::UnsupportedVersion(0),
            Error::UnknownKey([0; 4]),
            Error::AuthenticationFailed,
            Error::WrongReceiver,
            Error::InvalidKeyRing(""),
            Error::NoRandomness,
            Error::ArpHardwareType(0),
            Error::ArpProtocolType(0),
            Error::ArpHardwareLength(0),
            Error::ArpProtocolLength(0),
            Error::ArpOperation(0),
            Error::UnexpectedEtherType(0),
            Error::MalformedIpHeader(""),
            Error::Fragmented,
            Error::BadIpv4HeaderChecksum,
            Error::HopLimit(0),
            Error::IpProtocol(0),
            Error::BadChecksum,
            Error::Icmpv6Type(0),
            Error::Icmpv6Code(0),
            Error::NdpMulticastTarget,
            Error::NdpZeroLengthOption,
            Error::NdpUnspecifiedSourceWithLinkAddr,
            Error::NdpDadNotSolicitedNode,
            Error::NdpSolicitedToMulticast,
            Error::VrrpVersion(0),
            Error::VrrpType(0),
            Error::VrrpAddressCount(0),
            Error::OutOfRange(""),
            Error::NotWatchPayload(0),
            Error::WatchMessageType(0),
            Error::MalformedWatch(""),
            Error::GossipKind(0),
            Error::MalformedGossip(""),
            Error::TrailingBytes,
        ];
        let mut labels: Vec<&str> = all.iter().map(Error::as_str).collect();
        for l in &labels {
            assert!(
                l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{l}"
            );
        }
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), all.len());
    }
}
