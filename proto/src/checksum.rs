//! The internet checksum (RFC 1071) and the IPv4 / IPv6 pseudo-headers that ICMPv6 and VRRPv3
//! cover.
//!
//! Pure functions over byte slices: no allocation, no panics on any length (an odd trailing byte
//! is padded with zero, as RFC 1071 says). [`combine`] folds partial sums, so a caller sums the
//! pseudo-header and the message separately and never copies either.

use core::net::{Ipv4Addr, Ipv6Addr};

/// The one's complement sum of `data` as big-endian 16-bit words, not yet folded or inverted.
pub fn sum(data: &[u8]) -> u32 {
    let mut acc: u64 = 0;
    let mut chunks = data.chunks_exact(2);
    for word in &mut chunks {
        acc += u64::from(u16::from_be_bytes([word[0], word[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u64::from(u16::from_be_bytes([*last, 0]));
    }
    fold(acc)
}

fn fold(mut acc: u64) -> u32 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u32
}

/// Adds partial sums from [`sum`] and the pseudo-header functions, and returns the checksum
/// field value: the one's complement of the folded total.
pub fn combine(parts: &[u32]) -> u16 {
    let total = parts.iter().map(|&p| u64::from(p)).sum::<u64>();
    !(fold(total) as u16)
}

/// The partial sum of the IPv4 pseudo-header (RFC 768): source, destination, zero, protocol,
/// upper-layer length.
pub fn ipv4_pseudo_header(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, length: u16) -> u32 {
    let mut acc = sum(&src.octets()) + sum(&dst.octets());
    acc += u32::from(protocol) + u32::from(length);
    fold(u64::from(acc))
}

/// The partial sum of the IPv6 pseudo-header (RFC 8200 section 8.1): source, destination,
/// 32-bit upper-layer length, 24 zero bits, next header.
pub fn ipv6_pseudo_header(src: Ipv6Addr, dst: Ipv6Addr, next_header: u8, length: u32) -> u32 {
    let mut acc = u64::from(sum(&src.octets())) + u64::from(sum(&dst.octets()));
    acc += u64::from(length >> 16) + u64::from(length & 0xffff) + u64::from(next_header);
    fold(acc)
}

/// True when `data`, whose checksum field is filled in, sums to all ones together with the
/// pseudo-header partial sum `pseudo`.
pub fn verify(pseudo: u32, data: &[u8]) -> bool {
    combine(&[pseudo, sum(data)]) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc1071_example_sums_to_the_documented_value() {
        // RFC 1071 section 3: 00 01 f2 03 f4 f5 f6 f7 sums to ddf2 (before inversion).
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(sum(&data), 0xddf2);
        assert_eq!(combine(&[sum(&data)]), !0xddf2);
    }

    #[test]
    fn odd_length_pads_the_last_byte_with_zero() {
        assert_eq!(sum(&[0x12, 0x34, 0x56]), 0x1234 + 0x5600);
    }

    #[test]
    fn empty_input_sums_to_zero() {
        assert_eq!(sum(&[]), 0);
        assert_eq!(combine(&[]), 0xffff);
    }

    #[test]
    fn ipv4_header_checksum_matches_a_known_header() {
        // A classic example header (Wikipedia "IPv4 header checksum"), checksum b861.
        let mut h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(combine(&[sum(&h)]), 0xb861);
        h[10..12].copy_from_slice(&0xb861u16.to_be_bytes());
        assert!(verify(0, &h));
    }
}
