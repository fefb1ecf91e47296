//! The gossip core's datagram payload: what the speaker's `gossip::Core` seals into an envelope
//! ([`crate::envelope`]) and reads back once the envelope opens.
//!
//! ```text
//!  0      1
//!  +------+--------------------------------------------+
//!  | kind | body (by kind)                             |
//!  +------+--------------------------------------------+
//!
//!  kind 0 Foca      a foca packet (foca's postcard codec)                    opaque
//!  kind 1 Meta      a member's metadata record (postcard)                    opaque
//!  kind 2 MetaPull  the node whose record is wanted (UTF-8; empty: yours)  opaque
//!  kind 3 Sync      flags u8 (bit 0: echo), bits u8 (0..=6),
//!                   2^bits buckets u64 little-endian                 2 + 8 x 2^bits
//!  kind 4 Inquire   token u32, the suspect (a foca member update)    4 + opaque
//!  kind 5 Ping      nonce u64, bump u64                                     16 bytes
//!  kind 6 Pong      nonce u64                                                8 bytes
//!  kind 7 Verdict   token u32, verdict u8 (0 unreachable, 1 reachable)      5 bytes
//!  kind 8 Watch     an owner-watch payload (crate::heartbeat)               opaque
//! ```
//!
//! Integers are big-endian except the digest's buckets. Kinds stay below `0x80`, which starts an
//! owner-watch payload ([`crate::heartbeat::KIND`]).
//!
//! - `Foca`: SWIM itself. foca owns the packet's format; this module only frames it.
//! - `Meta` / `MetaPull`: a member's metadata record, pushed to one member, or asked for when a
//!   member is alive but its record has not arrived: of the member itself (empty body, the
//!   only form before the body named a node: such a pull still reads as "yours") and of
//!   another member that may hold it (the node's name), in case the path to the member is cut.
//!   The record's format is the speaker's.
//! - `Sync`: membership anti-entropy: the sender's [`Digest`] of the members it holds alive;
//!   the receiver answers with foca updates for the buckets that differ, and with its own
//!   digest when `echo` is set.
//! - `Inquire`: "probe this suspect for me": the receiver pings the suspect (`Ping`, answered
//!   by `Pong` with the same nonce when `bump` is the suspect's current identity bump) and sends
//!   a [`Verdict`] with the inquiry's `token`.
//! - `Watch`: an owner-watch claim or refutation ([`crate::heartbeat::WatchMessage`]) sent
//!   through the gossip as well as on the watch port, so that a watch port blocked one way does
//!   not keep a claim from its accused or a refutation from its claimant. The watch reads it.
//!
//! Guarantees: [`GossipMessage::parse`] never panics and never allocates (opaque bodies are
//! borrowed), checks every fixed-layout field and rejects trailing bytes, so every payload it
//! accepts has exactly one encoding and [`GossipMessage::emit`] writes it back byte for byte.
//! `emit` checks the buffer before it writes a byte: a refused emit leaves the buffer as it was.

use crate::reader::Reader;
use crate::{Error, Result};

/// The most a digest's bucket count exponent can be: 2^6 = 64 buckets, 512 bytes.
pub const MAX_DIGEST_BITS: u8 = 6;
/// The most buckets a digest has.
pub const MAX_BUCKETS: usize = 1 << MAX_DIGEST_BITS;

/// Bit 0 of a digest's flags: the receiver should answer with its own digest.
const FLAG_ECHO: u8 = 1;

/// The payload kinds, by their wire code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Code 0.
    Foca,
    /// Code 1.
    Meta,
    /// Code 2.
    MetaPull,
    /// Code 3.
    Sync,
    /// Code 4.
    Inquire,
    /// Code 5.
    Ping,
    /// Code 6.
    Pong,
    /// Code 7.
    Verdict,
    /// Code 8.
    Watch,
}

impl Kind {
    /// The wire value.
    pub const fn code(self) -> u8 {
        match self {
            Kind::Foca => 0,
            Kind::Meta => 1,
            Kind::MetaPull => 2,
            Kind::Sync => 3,
            Kind::Inquire => 4,
            Kind::Ping => 5,
            Kind::Pong => 6,
            Kind::Verdict => 7,
            Kind::Watch => 8,
        }
    }

    /// The kind with wire value `code`, if any.
    pub const fn from_code(code: u8) -> Option<Kind> {
        match code {
            0 => Some(Kind::Foca),
            1 => Some(Kind::Meta),
            2 => Some(Kind::MetaPull),
            3 => Some(Kind::Sync),
            4 => Some(Kind::Inquire),
            5 => Some(Kind::Ping),
            6 => Some(Kind::Pong),
            7 => Some(Kind::Verdict),
            8 => Some(Kind::Watch),
            _ => None,
        }
    }

    /// A short, stable, lowercase name for logs and metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Foca => "foca",
            Kind::Meta => "meta",
            Kind::MetaPull => "meta_pull",
            Kind::Sync => "sync",
            Kind::Inquire => "inquire",
            Kind::Ping => "ping",
            Kind::Pong => "pong",
            Kind::Verdict => "verdict",
            Kind::Watch => "watch",
        }
    }
}

/// What a member that probed a suspect on an inquirer's behalf found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Code 0: the suspect did not answer any ping (one independent confirmation).
    Unreachable,
    /// Code 1: the suspect answered, or the inquiry was about the receiver itself.
    Reachable,
}

impl Verdict {
    /// The wire value.
    pub const fn code(self) -> u8 {
        match self {
            Verdict::Unreachable => 0,
            Verdict::Reachable => 1,
        }
    }

    /// The verdict with wire value `code`, if any.
    pub const fn from_code(code: u8) -> Option<Verdict> {
        match code {
            0 => Some(Verdict::Unreachable),
            1 => Some(Verdict::Reachable),
            _ => None,
        }
    }

    /// A short, stable, lowercase name for logs and metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            Verdict::Unreachable => "unreachable",
            Verdict::Reachable => "reachable",
        }
    }
}

/// A membership digest as it travels: `2^bits` buckets, each the XOR of the hashes of the
/// members that fall into it (the hashing is the speaker's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest {
    bits: u8,
    /// Only the first `2^bits` are used; the rest stay zero so equality is that of the digest.
    buckets: [u64; MAX_BUCKETS],
}

impl Digest {
    /// A digest of `2^bits` `buckets`. Fails with [`Error::OutOfRange`] when `bits` exceeds
    /// [`MAX_DIGEST_BITS`] or `buckets` does not hold exactly `2^bits` values.
    pub fn new(bits: u8, buckets: &[u64]) -> Result<Digest> {
        if bits > MAX_DIGEST_BITS {
            return Err(Error::OutOfRange("digest bits above 6"));
        }
        if buckets.len() != 1 << bits {
            return Err(Error::OutOfRange("digest bucket count is not 2^bits"));
        }
        let mut all = [0; MAX_BUCKETS];
        all[..buckets.len()].copy_from_slice(buckets);
        Ok(Digest { bits, buckets: all })
    }

    /// The bucket count exponent, 0 to [`MAX_DIGEST_BITS`].
    pub const fn bits(&self) -> u8 {
        self.bits
    }

    /// The `2^bits` buckets.
    pub fn buckets(&self) -> &[u64] {
        &self.buckets[..1 << self.bits]
    }

    const fn body_len(&self) -> usize {
        2 + (8 << self.bits)
    }
}

/// One gossip payload, as values. Opaque bodies are borrowed from the parsed bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(
    clippy::large_enum_variant,
    reason = "the digest stays inline so parsing never allocates: 520 bytes of stack per datagram"
)]
pub enum GossipMessage<'a> {
    /// A foca packet.
    Foca(&'a [u8]),
    /// A member's metadata record.
    Meta(&'a [u8]),
    /// "Send me the newest metadata record you hold of `node`": empty, the receiver's own
    /// (as every speaker asks the member itself); a name, a member's record asked of another
    /// member that may hold it (the member itself may be out of reach).
    MetaPull {
        /// The node's name, UTF-8; empty for the receiver.
        node: &'a [u8],
    },
    /// The sender's membership digest.
    Sync {
        /// The receiver should answer with its own digest.
        echo: bool,
        /// The digest.
        digest: Digest,
    },
    /// "Probe this suspect for me, and answer with a verdict carrying `token`."
    Inquire {
        /// Matches the verdict to the inquirer's suspicion.
        token: u32,
        /// The suspect, as a foca member update (foca's codec).
        suspect: &'a [u8],
    },
    /// A ping to a suspect on an inquirer's behalf.
    Ping {
        /// Echoed in the pong.
        nonce: u64,
        /// The identity bump the inquirer holds for the suspect: only that life answers.
        bump: u64,
    },
    /// The suspect's answer to a ping.
    Pong {
        /// The ping's nonce.
        nonce: u64,
    },
    /// The answer to an inquiry.
    Verdict {
        /// The inquiry's token.
        token: u32,
        /// What the probes found.
        verdict: Verdict,
    },
    /// An owner-watch payload (a claim or a refutation), for the watch to read.
    Watch(&'a [u8]),
}

impl<'a> GossipMessage<'a> {
    /// The payload's kind.
    pub const fn kind(&self) -> Kind {
        match self {
            GossipMessage::Foca(_) => Kind::Foca,
            GossipMessage::Meta(_) => Kind::Meta,
            GossipMessage::MetaPull { .. } => Kind::MetaPull,
            GossipMessage::Sync { .. } => Kind::Sync,
            GossipMessage::Inquire { .. } => Kind::Inquire,
            GossipMessage::Ping { .. } => Kind::Ping,
            GossipMessage::Pong { .. } => Kind::Pong,
            GossipMessage::Verdict { .. } => Kind::Verdict,
            GossipMessage::Watch(_) => Kind::Watch,
        }
    }

    /// Reads a gossip payload (the opened envelope's payload, kind byte included).
    ///
    /// Checks, in order: the kind byte is there ([`Error::Truncated`]) and known
    /// ([`Error::GossipKind`]); then the body field by field: too short ([`Error::Truncated`]),
    /// a bad value ([`Error::MalformedGossip`] naming the field), bytes left over
    /// ([`Error::TrailingBytes`]). Opaque bodies are not examined.
    pub fn parse(payload: &'a [u8]) -> Result<GossipMessage<'a>> {
        let (&code, body) = payload.split_first().ok_or(Error::Truncated)?;
        let kind = Kind::from_code(code).ok_or(Error::GossipKind(code))?;
        let mut r = Reader { rest: body };
        let message = match kind {
            Kind::Foca => GossipMessage::Foca(r.rest_opaque()),
            Kind::Meta => GossipMessage::Meta(r.rest_opaque()),
            Kind::MetaPull => GossipMessage::MetaPull {
                node: r.rest_opaque(),
            },
            Kind::Sync => r.sync()?,
            Kind::Inquire => GossipMessage::Inquire {
                token: r.u32()?,
                suspect: r.rest_opaque(),
            },
            Kind::Ping => GossipMessage::Ping {
                nonce: r.u64()?,
                bump: r.u64()?,
            },
            Kind::Pong => GossipMessage::Pong { nonce: r.u64()? },
            Kind::Verdict => GossipMessage::Verdict {
                token: r.u32()?,
                verdict: Verdict::from_code(r.u8()?)
                    .ok_or(Error::MalformedGossip("verdict is neither 0 nor 1"))?,
            },
            Kind::Watch => GossipMessage::Watch(r.rest_opaque()),
        };
        if !r.rest.is_empty() {
            return Err(Error::TrailingBytes);
        }
        Ok(message)
    }

    /// Bytes the payload takes, kind byte included.
    pub const fn buffer_len(&self) -> usize {
        1 + match self {
            GossipMessage::Foca(body) | GossipMessage::Meta(body) | GossipMessage::Watch(body) => {
                body.len()
            }
            GossipMessage::MetaPull { node } => node.len(),
            GossipMessage::Sync { digest, .. } => digest.body_len(),
            GossipMessage::Inquire { suspect, .. } => 4 + suspect.len(),
            GossipMessage::Ping { .. } => 16,
            GossipMessage::Pong { .. } => 8,
            GossipMessage::Verdict { .. } => 5,
        }
    }

    /// Writes the payload into the first [`GossipMessage::buffer_len`] bytes of `buf`; returns
    /// that length. Fails with [`Error::BufferTooSmall`] when `buf` is too short; `buf` is
    /// then unchanged.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let len = self.buffer_len();
        let Some(out) = buf.get_mut(..len) else {
            return Err(Error::BufferTooSmall);
        };
        let mut w = Writer { out, at: 0 };
        w.bytes(&[self.kind().code()]);
        match *self {
            GossipMessage::Foca(body) | GossipMessage::Meta(body) | GossipMessage::Watch(body) => {
                w.bytes(body)
            }
            GossipMessage::MetaPull { node } => w.bytes(node),
            GossipMessage::Sync { echo, ref digest } => {
                w.bytes(&[if echo { FLAG_ECHO } else { 0 }, digest.bits]);
                for bucket in digest.buckets() {
                    w.bytes(&bucket.to_le_bytes());
                }
            }
            GossipMessage::Inquire { token, suspect } => {
                w.bytes(&token.to_be_bytes());
                w.bytes(suspect);
            }
            GossipMessage::Ping { nonce, bump } => {
                w.bytes(&nonce.to_be_bytes());
                w.bytes(&bump.to_be_bytes());
            }
            GossipMessage::Pong { nonce } => w.bytes(&nonce.to_be_bytes()),
            GossipMessage::Verdict { token, verdict } => {
                w.bytes(&token.to_be_bytes());
                w.bytes(&[verdict.code()]);
            }
        }
        debug_assert_eq!(w.at, len);
        Ok(len)
    }

    /// Appends the payload to `out` (the speaker's reusable send buffer).
    pub fn emit_vec(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.resize(start + self.buffer_len(), 0);
        // Sized to `buffer_len` just above: `emit` cannot refuse it.
        let written = self.emit(&mut out[start..]);
        debug_assert!(written.is_ok());
    }
}

/// The gossip's payloads, read with the crate's [`Reader`].
impl<'a> Reader<'a> {
    fn sync(&mut self) -> Result<GossipMessage<'a>> {
        let flags = self.u8()?;
        let bits = self.u8()?;
        if flags & !FLAG_ECHO != 0 {
            return Err(Error::MalformedGossip("unknown digest flags"));
        }
        if bits > MAX_DIGEST_BITS {
            return Err(Error::MalformedGossip("digest bits above 6"));
        }
        let mut buckets = [0; MAX_BUCKETS];
        for bucket in &mut buckets[..1 << bits] {
            *bucket = u64::from_le_bytes(self.take()?);
        }
        Ok(GossipMessage::Sync {
            echo: flags & FLAG_ECHO != 0,
            digest: Digest { bits, buckets },
        })
    }
}

/// Writes fields into a buffer whose length was checked against `buffer_len` beforehand.
struct Writer<'b> {
    out: &'b mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn bytes(&mut self, bytes: &[u8]) {
        self.out[self.at..self.at + bytes.len()].copy_from_slice(bytes);
        self.at += bytes.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::golden;

    const NONCE: u64 = 0x0102_0304_0506_0708;

    fn sync() -> GossipMessage<'static> {
        GossipMessage::Sync {
            echo: true,
            digest: Digest::new(1, &[NONCE, 0xf0e0_d0c0_b0a0_9080]).unwrap(),
        }
    }

    /// Every golden payload with the message it spells.
    fn golden_messages() -> [(&'static [u8], GossipMessage<'static>); 11] {
        [
            (&golden::GOSSIP_FOCA, GossipMessage::Foca(b"foca packet")),
            (&golden::GOSSIP_META, GossipMessage::Meta(b"meta record")),
            (
                &golden::GOSSIP_META_PULL,
                GossipMessage::MetaPull { node: b"" },
            ),
            (
                &golden::GOSSIP_META_PULL_OF,
                GossipMessage::MetaPull { node: b"node3" },
            ),
            (&golden::GOSSIP_SYNC, sync()),
            (
                &golden::GOSSIP_INQUIRE,
                GossipMessage::Inquire {
                    token: 42,
                    suspect: b"suspect",
                },
            ),
            (
                &golden::GOSSIP_PING,
                GossipMessage::Ping {
                    nonce: NONCE,
                    bump: 1_700_000_000_000,
                },
            ),
            (&golden::GOSSIP_PONG, GossipMessage::Pong { nonce: NONCE }),
            (
                &golden::GOSSIP_VERDICT_UNREACHABLE,
                GossipMessage::Verdict {
                    token: 42,
                    verdict: Verdict::Unreachable,
                },
            ),
            (
                &golden::GOSSIP_VERDICT_REACHABLE,
                GossipMessage::Verdict {
                    token: 42,
                    verdict: Verdict::Reachable,
                },
            ),
            (
                &golden::GOSSIP_WATCH,
                GossipMessage::Watch(&golden::GOSSIP_WATCH[1..]),
            ),
        ]
    }

    #[test]
    fn golden_payloads_parse_to_their_messages() {
        for (bytes, message) in golden_messages() {
            assert_eq!(GossipMessage::parse(bytes), Ok(message), "{bytes:02x?}");
            assert_eq!(message.buffer_len(), bytes.len());
        }
    }

    #[test]
    fn messages_emit_their_golden_bytes_into_a_junk_filled_buffer() {
        for (bytes, message) in golden_messages() {
            let mut buf = [0xa5u8; 64];
            assert_eq!(message.emit(&mut buf), Ok(bytes.len()));
            assert_eq!(&buf[..bytes.len()], bytes, "{message:?}");
            assert!(buf[bytes.len()..].iter().all(|&b| b == 0xa5));
            let mut appended = vec![9];
            message.emit_vec(&mut appended);
            assert_eq!((appended[0], &appended[1..]), (9, bytes));
        }
    }

    #[test]
    fn every_truncation_of_a_fixed_layout_payload_is_truncated() {
        for bytes in [
            &golden::GOSSIP_SYNC[..],
            &golden::GOSSIP_PING,
            &golden::GOSSIP_PONG,
            &golden::GOSSIP_VERDICT_REACHABLE,
            &golden::GOSSIP_INQUIRE[..5],
        ] {
            for len in 0..bytes.len() {
                assert_eq!(
                    GossipMessage::parse(&bytes[..len]),
                    Err(Error::Truncated),
                    "{bytes:02x?} cut at {len}"
                );
            }
        }
    }

    #[test]
    fn trailing_bytes_after_a_fixed_layout_body_are_refused() {
        for bytes in [
            &golden::GOSSIP_SYNC[..],
            &golden::GOSSIP_PING,
            &golden::GOSSIP_PONG,
            &golden::GOSSIP_VERDICT_UNREACHABLE,
        ] {
            let mut long = bytes.to_vec();
            long.push(0);
            assert_eq!(GossipMessage::parse(&long), Err(Error::TrailingBytes));
        }
    }

    #[test]
    fn opaque_bodies_may_be_empty() {
        assert_eq!(GossipMessage::parse(&[0]), Ok(GossipMessage::Foca(&[])));
        assert_eq!(GossipMessage::parse(&[1]), Ok(GossipMessage::Meta(&[])));
        assert_eq!(GossipMessage::parse(&[8]), Ok(GossipMessage::Watch(&[])));
        assert_eq!(
            GossipMessage::parse(&[2]),
            Ok(GossipMessage::MetaPull { node: &[] })
        );
        assert_eq!(
            GossipMessage::parse(&[4, 0, 0, 0, 7]),
            Ok(GossipMessage::Inquire {
                token: 7,
                suspect: &[]
            })
        );
    }

    #[test]
    fn unknown_kinds_and_bad_field_values_are_named() {
        for code in [9, 0x7f, crate::heartbeat::KIND, 0xff] {
            assert_eq!(GossipMessage::parse(&[code]), Err(Error::GossipKind(code)));
        }
        let mut verdict = golden::GOSSIP_VERDICT_REACHABLE;
        verdict[5] = 2;
        assert_eq!(
            GossipMessage::parse(&verdict),
            Err(Error::MalformedGossip("verdict is neither 0 nor 1"))
        );
        let mut flags = golden::GOSSIP_SYNC;
        flags[1] = 3;
        assert_eq!(
            GossipMessage::parse(&flags),
            Err(Error::MalformedGossip("unknown digest flags"))
        );
        let mut bits = vec![3, 0, 7];
        bits.extend_from_slice(&[0; 8 << 7]);
        assert_eq!(
            GossipMessage::parse(&bits),
            Err(Error::MalformedGossip("digest bits above 6"))
        );
    }

    #[test]
    fn the_largest_digest_round_trips_and_a_quiet_one_has_no_echo() {
        let buckets: Vec<u64> = (0..MAX_BUCKETS as u64).map(|i| i * NONCE).collect();
        let digest = Digest::new(MAX_DIGEST_BITS, &buckets).unwrap();
        assert_eq!(digest.buckets(), buckets.as_slice());
        let quiet = GossipMessage::Sync {
            echo: false,
            digest,
        };
        let mut buf = vec![0u8; quiet.buffer_len()];
        assert_eq!(quiet.emit(&mut buf), Ok(1 + 2 + 512));
        assert_eq!(buf[1], 0);
        assert_eq!(GossipMessage::parse(&buf), Ok(quiet));
    }

    #[test]
    fn digests_of_the_wrong_shape_are_refused() {
        assert!(matches!(
            Digest::new(7, &[0; 128]),
            Err(Error::OutOfRange(_))
        ));
        assert!(matches!(Digest::new(1, &[0; 3]), Err(Error::OutOfRange(_))));
        assert_eq!(Digest::new(0, &[5]).unwrap().buckets(), &[5]);
    }

    #[test]
    fn a_refused_emit_leaves_the_buffer_alone() {
        let mut buf = [7u8; 18];
        assert_eq!(sync().emit(&mut buf), Err(Error::BufferTooSmall));
        assert!(buf.iter().all(|&b| b == 7));
    }

    #[test]
    fn kinds_and_verdicts_round_trip_their_codes_and_labels_are_distinct() {
        let mut labels = Vec::new();
        for code in 0..=u8::MAX {
            if let Some(kind) = Kind::from_code(code) {
                assert_eq!(kind.code(), code);
                labels.push(kind.as_str());
            }
        }
        assert_eq!(labels.len(), 9);
        for verdict in [Verdict::Unreachable, Verdict::Reachable] {
            assert_eq!(Verdict::from_code(verdict.code()), Some(verdict));
            labels.push(verdict.as_str());
        }
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), 11);
    }

    #[test]
    fn a_verdict_travels_in_a_sealed_envelope() {
        let ring = crate::KeyRing::new("edge-1", &[[0x11; 32]]).unwrap();
        let mut stream = crate::SealStream::new(42, 1).unwrap();
        let mut payload = Vec::new();
        let verdict = GossipMessage::Verdict {
            token: 9,
            verdict: Verdict::Unreachable,
        };
        verdict.emit_vec(&mut payload);
        let mut datagram = Vec::new();
        ring.seal_in(&mut stream, None, &payload, &mut datagram)
            .unwrap();
        let opened = ring.open_envelope(&mut datagram).unwrap();
        assert_eq!(GossipMessage::parse(opened.payload), Ok(verdict));
    }
}
