//! The owner watch's datagram payload: heartbeats from an owner to its watchers and
//! their acknowledgements, the watcher's quick second check (a poll, direct or relayed), and the
//! takeover claim.
//!
//! A watch datagram is an ordinary sealed envelope ([`crate::envelope`]): the payload below is
//! what [`KeyRing::seal_in`](crate::KeyRing::seal_in) seals and
//! [`KeyRing::open_envelope`](crate::KeyRing::open_envelope) returns. The envelope's
//! authenticated [`Sequence`](crate::Sequence) says who sent it (the sender id the gossip core
//! seals under, a hash of its gossip address) and lets the receiver reject replays with the same
//! guard as gossip; this payload does not repeat it.
//!
//! **Telling it from gossip.** The gossip core's payload ([`crate::gossip`]) starts with a kind
//! byte that counts up from 0 (`0`: a foca packet ... `7`: an inquiry verdict). A watch payload
//! starts with [`KIND`] = `0x80`: the high bit set, a value gossip never uses (its kinds stay
//! below `0x80`), so a receiver dispatches on the first byte after the envelope opens.
//! [`GossipMessage::parse`](crate::GossipMessage::parse) refuses `0x80` as an unknown kind; the
//! watch's receiver takes it.
//!
//! ```text
//!  0      1         2        3
//!  +------+---------+--------+------------------------------+
//!  | kind | version | type   | body (by type, exact length) |
//!  | 0x80 | 1       | 1..=7  |                              |
//!  +------+---------+--------+------------------------------+
//!
//!  type 1 Heartbeat   incarnation u64, seq u64, interval ms u16 (not 0)             18 bytes
//!  type 2 Poll        nonce u64, incarnation u64                                    16 bytes
//!  type 3 PollReply   nonce u64, alive u8 (0 or 1)                                   9 bytes
//!  type 4 Relay       nonce u64, target node                                     variable
//!  type 5 Claim       ip, epoch u64, claimant node, accused node                 variable
//!  type 6 Ack         incarnation u64, seq u64                                      16 bytes
//!  type 7 Move        ip, epoch u64, from node, to node                          variable
//!
//!  node = name length u8 (1..=253), name (UTF-8), address, bump u64
//!  address = family u8 (4 or 6), IPv4 (4 bytes) | IPv6 (16 bytes), port u16,
//!            and for IPv6 only: scope id u32
//!  ip = family u8 (4 or 6), IPv4 (4 bytes) | IPv6 (16 bytes)
//! ```
//!
//! All integers are big-endian. A node is named as the gossip names a member (the speaker's
//! `NodeIdentity`: node name, gossip address, bump). **Incarnation** is that bump everywhere:
//! it grows with every start of the speaker and every renewal of its identity, so a heartbeat or
//! claim about an older life of a member can be told apart from one about its current life.
//!
//! - `Heartbeat`: the owner to each watcher, every interval. `seq` grows by one per heartbeat
//!   of that incarnation (to that watcher or to all: the watcher only needs it to increase).
//!   `interval` is the owner's promise: the next heartbeat is due within that interval (plus
//!   its jitter), so the watcher measures silence at the rate the owner actually sends, slow
//!   (1 s) or fast, and a change of rate takes effect with the heartbeat that announces it (as
//!   BFD's Desired Min TX Interval does).
//! - `Ack`: the watcher to the owner: "I heard your heartbeat `seq` of `incarnation`". The owner
//!   sends at the slow rate until a watcher acknowledges, then fast (the watch is established),
//!   and back to slow when acknowledgements stop.
//! - `Poll`: the watcher to the owner, or a relay to the owner on the watcher's behalf: "are you
//!   alive as `incarnation`?". The owner answers with a `PollReply` with the same `nonce` and
//!   `alive = true` only when `incarnation` is its own (as the gossip's relayed ping does).
//! - `PollReply`: the answer to a `Poll` (`alive = true`), or a relay's verdict to the watcher
//!   (`alive`: whether the target answered the relay's poll in time).
//! - `Relay`: the watcher asks a third member to poll `target` (with `target.bump` as the
//!   incarnation) and answer with a `PollReply` carrying `nonce`: the independent path.
//! - `Claim`: the watcher that took `ip` over tells the mesh; `epoch` grows with every claim the
//!   claimant makes, so (ip, claimant, epoch) names one claim and newer ones supersede older.
//! - `Move`: `ip` moved from `from` to `to`, both alive, by what its sender (one of the two)
//!   was told (in Kubernetes, by the API): the first of the two to see a move tells the other,
//!   which follows at once instead of when its own view catches up. `epoch` as for `Claim`.
//!
//! Guarantees: [`WatchMessage::parse`] never panics and never allocates (names are borrowed
//! from the input), checks every field, and rejects trailing bytes: a longer body is a new
//! version. [`WatchMessage::emit`] writes into the caller's buffer without allocating and
//! checks everything before it writes a byte, so a refused emit leaves the buffer as it was.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use crate::reader::Reader;
use crate::{Error, Result};

/// The first byte of every watch payload; gossip payloads start below `0x80`.
pub const KIND: u8 = 0x80;
/// The payload version this build writes and reads.
pub const VERSION: u8 = 1;
/// Length of the kind, version and type bytes.
pub const HEADER_LEN: usize = 3;
/// The longest node name, in bytes (a DNS subdomain, as a Kubernetes node name).
pub const MAX_NAME_LEN: usize = 253;
/// Length of a heartbeat payload.
pub const HEARTBEAT_LEN: usize = HEADER_LEN + 18;
/// The longest payload of any type: a claim about an IPv6 address between two IPv6 nodes with
/// the longest names.
pub const MAX_LEN: usize = HEADER_LEN + IP6_LEN + 8 + 2 * MAX_NODE_LEN;

// Every message fits in one envelope.
const _: () = assert!(MAX_LEN <= crate::envelope::MAX_PAYLOAD_LEN);

const IP4_LEN: usize = 1 + 4;
const IP6_LEN: usize = 1 + 16;
/// A node with the longest name and an IPv6 address.
const MAX_NODE_LEN: usize = 1 + MAX_NAME_LEN + IP6_LEN + 2 + 4 + 8;

mod field {
    pub const KIND: usize = 0;
    pub const VERSION: usize = 1;
    pub const TYPE: usize = 2;
}

const FAMILY_V4: u8 = 4;
const FAMILY_V6: u8 = 6;

/// The message types, by their wire code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageType {
    /// Code 1.
    Heartbeat,
    /// Code 2.
    Poll,
    /// Code 3.
    PollReply,
    /// Code 4.
    Relay,
    /// Code 5.
    Claim,
    /// Code 6.
    Ack,
    /// Code 7.
    Move,
}

impl MessageType {
    /// The wire value.
    pub const fn code(self) -> u8 {
        match self {
            MessageType::Heartbeat => 1,
            MessageType::Poll => 2,
            MessageType::PollReply => 3,
            MessageType::Relay => 4,
            MessageType::Claim => 5,
            MessageType::Ack => 6,
            MessageType::Move => 7,
        }
    }

    /// The type with wire value `code`, if any.
    pub const fn from_code(code: u8) -> Option<MessageType> {
        match code {
            1 => Some(MessageType::Heartbeat),
            2 => Some(MessageType::Poll),
            3 => Some(MessageType::PollReply),
            4 => Some(MessageType::Relay),
            5 => Some(MessageType::Claim),
            6 => Some(MessageType::Ack),
            7 => Some(MessageType::Move),
            _ => None,
        }
    }

    /// A short, stable, lowercase name for logs and metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            MessageType::Heartbeat => "heartbeat",
            MessageType::Poll => "poll",
            MessageType::PollReply => "poll_reply",
            MessageType::Relay => "relay",
            MessageType::Claim => "claim",
            MessageType::Ack => "ack",
            MessageType::Move => "move",
        }
    }
}

/// A member as the gossip names it: node name, gossip address and bump (its incarnation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeRef<'a> {
    /// The node name, 1 to [`MAX_NAME_LEN`] bytes.
    pub name: &'a str,
    /// The gossip address.
    pub addr: SocketAddr,
    /// The identity bump: the incarnation.
    pub bump: u64,
}

impl NodeRef<'_> {
    /// Bytes this node takes on the wire.
    pub const fn buffer_len(&self) -> usize {
        1 + self.name.len() + addr_len(&self.addr) + 8
    }
}

/// One watch message, as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WatchMessage<'a> {
    /// The owner is alive as `incarnation`; `seq` grows by one per heartbeat.
    Heartbeat {
        /// The owner's incarnation (its identity bump).
        incarnation: u64,
        /// The heartbeat's number in that incarnation.
        seq: u64,
        /// The owner's promise, in milliseconds (1 to 65,535): the next heartbeat is due within
        /// this interval, plus up to a quarter of it of jitter.
        interval_ms: u16,
    },
    /// "Are you alive as `incarnation`?"; answered with a [`WatchMessage::PollReply`].
    Poll {
        /// Echoed in the reply.
        nonce: u64,
        /// The incarnation the poller holds for the polled member.
        incarnation: u64,
    },
    /// The answer to a poll, direct (`alive` is true) or through a relay.
    PollReply {
        /// The nonce of the poll or relay request.
        nonce: u64,
        /// Whether the polled member answered as the incarnation asked for.
        alive: bool,
    },
    /// Asks the receiver to poll `target` (as `target.bump`) and reply with `nonce`.
    Relay {
        /// Echoed in the relay's reply.
        nonce: u64,
        /// The member to poll.
        target: NodeRef<'a>,
    },
    /// `claimant` took `ip` over from `accused`, which it found silent.
    Claim {
        /// The IP taken over.
        ip: IpAddr,
        /// Grows with every claim of the claimant.
        epoch: u64,
        /// Who took it over (its bump: its incarnation).
        claimant: NodeRef<'a>,
        /// The owner found silent (its bump: the incarnation found silent).
        accused: NodeRef<'a>,
    },
    /// `ip` moved from `from` to `to` (both alive) by what the sender, one of the two, was
    /// told.
    Move {
        /// The IP.
        ip: IpAddr,
        /// Grows with every move the sender tells.
        epoch: u64,
        /// The owner before.
        from: NodeRef<'a>,
        /// The owner now.
        to: NodeRef<'a>,
    },
    /// The watcher heard the owner's heartbeat `seq` of `incarnation`.
    Ack {
        /// The incarnation of the heartbeat heard.
        incarnation: u64,
        /// Its number.
        seq: u64,
    },
}

impl<'a> WatchMessage<'a> {
    /// The message's type.
    pub const fn message_type(&self) -> MessageType {
        match self {
            WatchMessage::Heartbeat { .. } => MessageType::Heartbeat,
            WatchMessage::Poll { .. } => MessageType::Poll,
            WatchMessage::PollReply { .. } => MessageType::PollReply,
            WatchMessage::Relay { .. } => MessageType::Relay,
            WatchMessage::Claim { .. } => MessageType::Claim,
            WatchMessage::Ack { .. } => MessageType::Ack,
            WatchMessage::Move { .. } => MessageType::Move,
        }
    }

    /// Whether `payload` is meant for the watch (starts with [`KIND`]) rather than the gossip.
    /// Says nothing about whether it parses.
    pub fn is_watch(payload: &[u8]) -> bool {
        payload.first() == Some(&KIND)
    }

    /// Reads a watch payload (the opened envelope's payload, kind byte included).
    ///
    /// Checks, in order: the header is there ([`Error::Truncated`]), the kind byte
    /// ([`Error::NotWatchPayload`]), the version ([`Error::UnsupportedVersion`]), the type
    /// ([`Error::WatchMessageType`]); then the body field by field: too short
    /// ([`Error::Truncated`]), a bad value ([`Error::MalformedWatch`] naming the field), bytes
    /// left over ([`Error::TrailingBytes`]).
    pub fn parse(payload: &'a [u8]) -> Result<WatchMessage<'a>> {
        if payload.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if payload[field::KIND] != KIND {
            return Err(Error::NotWatchPayload(payload[field::KIND]));
        }
        if payload[field::VERSION] != VERSION {
            return Err(Error::UnsupportedVersion(payload[field::VERSION]));
        }
        let code = payload[field::TYPE];
        let message_type = MessageType::from_code(code).ok_or(Error::WatchMessageType(code))?;
        let mut r = Reader {
            rest: &payload[HEADER_LEN..],
        };
        let message = match message_type {
            MessageType::Heartbeat => WatchMessage::Heartbeat {
                incarnation: r.u64()?,
                seq: r.u64()?,
                interval_ms: match r.u16()? {
                    0 => return Err(Error::MalformedWatch("heartbeat interval is zero")),
                    ms => ms,
                },
            },
            MessageType::Poll => WatchMessage::Poll {
                nonce: r.u64()?,
                incarnation: r.u64()?,
            },
            MessageType::PollReply => WatchMessage::PollReply {
                nonce: r.u64()?,
                alive: match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(Error::MalformedWatch("alive is neither 0 nor 1")),
                },
            },
            MessageType::Relay => WatchMessage::Relay {
                nonce: r.u64()?,
                target: r.node()?,
            },
            MessageType::Claim => WatchMessage::Claim {
                ip: r.ip()?,
                epoch: r.u64()?,
                claimant: r.node()?,
                accused: r.node()?,
            },
            MessageType::Ack => WatchMessage::Ack {
                incarnation: r.u64()?,
                seq: r.u64()?,
            },
            MessageType::Move => WatchMessage::Move {
                ip: r.ip()?,
                epoch: r.u64()?,
                from: r.node()?,
                to: r.node()?,
            },
        };
        if !r.rest.is_empty() {
            return Err(Error::TrailingBytes);
        }
        Ok(message)
    }

    /// Bytes the payload takes, header included.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
            + match self {
                WatchMessage::Heartbeat { .. } => 18,
                WatchMessage::Poll { .. } | WatchMessage::Ack { .. } => 16,
                WatchMessage::PollReply { .. } => 9,
                WatchMessage::Relay { target, .. } => 8 + target.buffer_len(),
                WatchMessage::Claim {
                    ip,
                    claimant,
                    accused,
                    ..
                } => ip_len(ip) + 8 + claimant.buffer_len() + accused.buffer_len(),
                WatchMessage::Move { ip, from, to, .. } => {
                    ip_len(ip) + 8 + from.buffer_len() + to.buffer_len()
                }
            }
    }

    /// Writes the payload into the first [`WatchMessage::buffer_len`] bytes of `buf`; returns
    /// that length.
    ///
    /// Fails with [`Error::OutOfRange`] when a node name is empty or longer than
    /// [`MAX_NAME_LEN`] bytes or a heartbeat's interval is zero, and with [`Error::BufferTooSmall`] when `buf` is too short; `buf`
    /// is then unchanged.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        match self {
            WatchMessage::Heartbeat { interval_ms: 0, .. } => {
                return Err(Error::OutOfRange("heartbeat interval must not be zero"));
            }
            WatchMessage::Relay { target, .. } => check_name(target.name)?,
            WatchMessage::Claim {
                claimant, accused, ..
            } => {
                check_name(claimant.name)?;
                check_name(accused.name)?;
            }
            WatchMessage::Move { from, to, .. } => {
                check_name(from.name)?;
                check_name(to.name)?;
            }
            _ => {}
        }
        let len = self.buffer_len();
        let Some(out) = buf.get_mut(..len) else {
            return Err(Error::BufferTooSmall);
        };
        let mut w = Writer { out, at: 0 };
        w.bytes(&[KIND, VERSION, self.message_type().code()]);
        match *self {
            WatchMessage::Heartbeat {
                incarnation,
                seq,
                interval_ms,
            } => {
                w.u64(incarnation);
                w.u64(seq);
                w.bytes(&interval_ms.to_be_bytes());
            }
            WatchMessage::Ack { incarnation, seq } => {
                w.u64(incarnation);
                w.u64(seq);
            }
            WatchMessage::Poll { nonce, incarnation } => {
                w.u64(nonce);
                w.u64(incarnation);
            }
            WatchMessage::PollReply { nonce, alive } => {
                w.u64(nonce);
                w.bytes(&[u8::from(alive)]);
            }
            WatchMessage::Relay { nonce, target } => {
                w.u64(nonce);
                w.node(&target);
            }
            WatchMessage::Claim {
                ip,
                epoch,
                claimant,
                accused,
            } => {
                w.ip(ip);
                w.u64(epoch);
                w.node(&claimant);
                w.node(&accused);
            }
            WatchMessage::Move {
                ip,
                epoch,
                from,
                to,
            } => {
                w.ip(ip);
                w.u64(epoch);
                w.node(&from);
                w.node(&to);
            }
        }
        debug_assert_eq!(w.at, len);
        Ok(len)
    }
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(Error::OutOfRange("node name must be 1 to 253 bytes"));
    }
    Ok(())
}

const fn ip_len(ip: &IpAddr) -> usize {
    match ip {
        IpAddr::V4(_) => IP4_LEN,
        IpAddr::V6(_) => IP6_LEN,
    }
}

const fn addr_len(addr: &SocketAddr) -> usize {
    match addr {
        SocketAddr::V4(_) => IP4_LEN + 2,
        SocketAddr::V6(_) => IP6_LEN + 2 + 4,
    }
}

/// The owner watch's fields, read with the crate's [`Reader`].
impl<'a> Reader<'a> {
    fn ip(&mut self) -> Result<IpAddr> {
        match self.u8()? {
            FAMILY_V4 => Ok(IpAddr::V4(Ipv4Addr::from(self.take::<4>()?))),
            FAMILY_V6 => Ok(IpAddr::V6(Ipv6Addr::from(self.take::<16>()?))),
            _ => Err(Error::MalformedWatch("address family is neither 4 nor 6")),
        }
    }

    fn node(&mut self) -> Result<NodeRef<'a>> {
        let len = usize::from(self.u8()?);
        if len == 0 {
            return Err(Error::MalformedWatch("empty node name"));
        }
        if len > MAX_NAME_LEN {
            return Err(Error::MalformedWatch("node name longer than 253 bytes"));
        }
        if self.rest.len() < len {
            return Err(Error::Truncated);
        }
        let (name, rest) = self.rest.split_at(len);
        self.rest = rest;
        let name = core::str::from_utf8(name)
            .map_err(|_| Error::MalformedWatch("node name is not UTF-8"))?;
        let addr = match self.ip()? {
            IpAddr::V4(ip) => SocketAddr::V4(SocketAddrV4::new(ip, self.u16()?)),
            IpAddr::V6(ip) => {
                let port = self.u16()?;
                let scope = self.u32()?;
                SocketAddr::V6(SocketAddrV6::new(ip, port, 0, scope))
            }
        };
        Ok(NodeRef {
            name,
            addr,
            bump: self.u64()?,
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

    fn u64(&mut self, value: u64) {
        self.bytes(&value.to_be_bytes());
    }

    fn ip(&mut self, ip: IpAddr) {
        match ip {
            IpAddr::V4(ip) => {
                self.bytes(&[FAMILY_V4]);
                self.bytes(&ip.octets());
            }
            IpAddr::V6(ip) => {
                self.bytes(&[FAMILY_V6]);
                self.bytes(&ip.octets());
            }
        }
    }

    fn node(&mut self, node: &NodeRef<'_>) {
        // The length was checked by `emit` before anything was written.
        self.bytes(&[node.name.len() as u8]);
        self.bytes(node.name.as_bytes());
        self.ip(node.addr.ip());
        self.bytes(&node.addr.port().to_be_bytes());
        if let SocketAddr::V6(a) = node.addr {
            self.bytes(&a.scope_id().to_be_bytes());
        }
        self.u64(node.bump);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node<'a>(name: &'a str, addr: &str, bump: u64) -> NodeRef<'a> {
        NodeRef {
            name,
            addr: addr.parse().unwrap(),
            bump,
        }
    }

    /// A heartbeat, byte by byte.
    const HEARTBEAT: [u8; 21] = [
        0x80, 0x01, 0x01, // kind, version 1, type heartbeat
        0x00, 0x00, 0x01, 0x8b, 0xcf, 0xe5, 0x68, 0x00, // incarnation 1_700_000_000_000
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, // seq 258
        0x00, 0x14, // interval 20 ms
    ];

    /// A claim for 192.0.2.100 by `b` (IPv4 gossip address) against `na` (IPv6 gossip address, scope 3).
    const CLAIM: [u8; 67] = [
        0x80, 0x01, 0x05, // kind, version 1, type claim
        0x04, 0xc0, 0x00, 0x02, 0x64, // ip 192.0.2.100
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x07, // epoch 7
        0x01, b'b', // claimant name "b"
        0x04, 0xc0, 0x00, 0x02, 0x14, 0x1f, 0x0a, // 192.0.2.20:7946
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, // claimant bump 2
        0x02, b'n', b'a', // accused name "na"
        0x06, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00, // 2001:db8::1
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, //
        0x1f, 0x0a, 0x00, 0x00, 0x00, 0x03, // port 7946, scope id 3
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, // accused bump 5
    ];

    fn golden_claim() -> WatchMessage<'static> {
        WatchMessage::Claim {
            ip: "192.0.2.100".parse().unwrap(),
            epoch: 7,
            claimant: node("b", "192.0.2.20:7946", 2),
            accused: node("na", "[2001:db8::1%3]:7946", 5),
        }
    }

    #[test]
    fn heartbeat_golden_bytes_parse() {
        assert_eq!(
            WatchMessage::parse(&HEARTBEAT),
            Ok(WatchMessage::Heartbeat {
                incarnation: 1_700_000_000_000,
                seq: 258,
                interval_ms: 20,
            })
        );
    }

    #[test]
    fn heartbeat_emits_its_golden_bytes_into_a_junk_filled_buffer() {
        let mut buf = [0xa5u8; 64];
        let hb = WatchMessage::Heartbeat {
            incarnation: 1_700_000_000_000,
            seq: 258,
            interval_ms: 20,
        };
        assert_eq!(hb.buffer_len(), HEARTBEAT_LEN);
        assert_eq!(hb.emit(&mut buf), Ok(HEARTBEAT_LEN));
        assert_eq!(buf[..HEARTBEAT_LEN], HEARTBEAT);
        assert!(buf[HEARTBEAT_LEN..].iter().all(|&b| b == 0xa5));
    }

    #[test]
    fn claim_golden_bytes_parse_and_emit() {
        assert_eq!(WatchMessage::parse(&CLAIM), Ok(golden_claim()));
        let mut buf = [0x5au8; 128];
        let len = golden_claim().emit(&mut buf).unwrap();
        assert_eq!(buf[..len], CLAIM);
    }

    #[test]
    fn small_messages_have_their_documented_layout() {
        let mut buf = [0u8; 32];
        let n = WatchMessage::Poll {
            nonce: 0x0102_0304_0506_0708,
            incarnation: 9,
        }
        .emit(&mut buf)
        .unwrap();
        assert_eq!(
            buf[..n],
            [0x80, 1, 2, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0, 9]
        );
        let n = WatchMessage::PollReply {
            nonce: 0x0102_0304_0506_0708,
            alive: true,
        }
        .emit(&mut buf)
        .unwrap();
        assert_eq!(buf[..n], [0x80, 1, 3, 1, 2, 3, 4, 5, 6, 7, 8, 1]);
        let n = WatchMessage::Ack {
            incarnation: 0x0102_0304_0506_0708,
            seq: 9,
        }
        .emit(&mut buf)
        .unwrap();
        assert_eq!(
            buf[..n],
            [0x80, 1, 6, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0, 9]
        );
        let n = WatchMessage::Relay {
            nonce: 1,
            target: node("a", "192.0.2.10:7946", 4),
        }
        .emit(&mut buf)
        .unwrap();
        assert_eq!(
            buf[..n],
            [
                0x80, 1, 4, 0, 0, 0, 0, 0, 0, 0, 1, 1, b'a', 4, 192, 0, 2, 10, 0x1f, 0x0a, 0, 0, 0,
                0, 0, 0, 0, 4
            ]
        );
    }

    #[test]
    fn every_truncation_of_a_valid_payload_is_truncated() {
        for payload in [&HEARTBEAT[..], &CLAIM[..]] {
            for len in 0..payload.len() {
                assert_eq!(
                    WatchMessage::parse(&payload[..len]),
                    Err(Error::Truncated),
                    "length {len}"
                );
            }
        }
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let mut long = HEARTBEAT.to_vec();
        long.push(0);
        assert_eq!(WatchMessage::parse(&long), Err(Error::TrailingBytes));
    }

    #[test]
    fn gossip_payloads_are_not_watch_payloads() {
        for kind in 0..0x80u8 {
            let mut p = HEARTBEAT;
            p[0] = kind;
            assert!(!WatchMessage::is_watch(&p));
            assert_eq!(WatchMessage::parse(&p), Err(Error::NotWatchPayload(kind)));
        }
        assert!(WatchMessage::is_watch(&HEARTBEAT));
        assert!(!WatchMessage::is_watch(&[]));
    }

    #[test]
    fn unknown_version_and_type_are_named() {
        let mut p = HEARTBEAT;
        p[1] = 2;
        assert_eq!(WatchMessage::parse(&p), Err(Error::UnsupportedVersion(2)));
        for code in [0, 8, 0xff] {
            let mut p = HEARTBEAT;
            p[2] = code;
            assert_eq!(WatchMessage::parse(&p), Err(Error::WatchMessageType(code)));
        }
    }

    #[test]
    fn bad_field_values_are_malformed() {
        let mut zero_interval = HEARTBEAT;
        zero_interval[20] = 0;
        assert_eq!(
            WatchMessage::parse(&zero_interval),
            Err(Error::MalformedWatch("heartbeat interval is zero"))
        );
        let reply = [0x80, 1, 3, 0, 0, 0, 0, 0, 0, 0, 1, 2];
        assert_eq!(
            WatchMessage::parse(&reply),
            Err(Error::MalformedWatch("alive is neither 0 nor 1"))
        );
        // Claim: ip family (byte 3), claimant name length (byte 16), name byte (17), claimant
        // address family (18).
        let cases: [(usize, u8, &str); 4] = [
            (3, 5, "address family is neither 4 nor 6"),
            (16, 0, "empty node name"),
            (17, 0xff, "node name is not UTF-8"),
            (18, 0, "address family is neither 4 nor 6"),
        ];
        for (at, value, why) in cases {
            let mut p = CLAIM;
            p[at] = value;
            assert_eq!(
                WatchMessage::parse(&p),
                Err(Error::MalformedWatch(why)),
                "{at}"
            );
        }
        let mut p = CLAIM;
        p[16] = 254;
        assert_eq!(
            WatchMessage::parse(&p),
            Err(Error::MalformedWatch("node name longer than 253 bytes"))
        );
    }

    #[test]
    fn refused_emits_leave_the_buffer_alone() {
        let mut buf = [7u8; 600];
        let long = "x".repeat(MAX_NAME_LEN + 1);
        for name in ["", long.as_str()] {
            let relay = WatchMessage::Relay {
                nonce: 1,
                target: node(name, "192.0.2.1:1", 1),
            };
            assert!(matches!(relay.emit(&mut buf), Err(Error::OutOfRange(_))));
        }
        let never = WatchMessage::Heartbeat {
            incarnation: 1,
            seq: 1,
            interval_ms: 0,
        };
        assert!(matches!(never.emit(&mut buf), Err(Error::OutOfRange(_))));
        let claim = golden_claim();
        assert_eq!(
            claim.emit(&mut buf[..CLAIM.len() - 1]),
            Err(Error::BufferTooSmall)
        );
        assert!(buf.iter().all(|&b| b == 7));
    }

    #[test]
    fn the_longest_message_fits_max_len() {
        let name = "n".repeat(MAX_NAME_LEN);
        let claim = WatchMessage::Claim {
            ip: "2001:db8::100".parse().unwrap(),
            epoch: u64::MAX,
            claimant: node(&name, "[2001:db8::2]:7946", u64::MAX),
            accused: node(&name, "[2001:db8::1]:7946", u64::MAX),
        };
        assert_eq!(claim.buffer_len(), MAX_LEN);
        let mut buf = [0u8; MAX_LEN];
        assert_eq!(claim.emit(&mut buf), Ok(MAX_LEN));
        assert_eq!(WatchMessage::parse(&buf), Ok(claim));
    }

    #[test]
    fn a_heartbeat_travels_in_a_sealed_envelope() {
        let ring = crate::KeyRing::new("edge-1", &[[0x11; 32]]).unwrap();
        let mut stream = crate::SealStream::new(42, 1).unwrap();
        let mut payload = [0u8; HEARTBEAT_LEN];
        WatchMessage::Heartbeat {
            incarnation: 1,
            seq: 2,
            interval_ms: 1000,
        }
        .emit(&mut payload)
        .unwrap();
        let mut datagram = Vec::new();
        ring.seal_in(&mut stream, None, &payload, &mut datagram)
            .unwrap();
        assert_eq!(datagram.len(), crate::envelope::OVERHEAD_V2 + HEARTBEAT_LEN);
        let opened = ring.open_envelope(&mut datagram).unwrap();
        assert_eq!(opened.sequence.sender, 42);
        assert_eq!(
            WatchMessage::parse(opened.payload),
            Ok(WatchMessage::Heartbeat {
                incarnation: 1,
                seq: 2,
                interval_ms: 1000,
            })
        );
    }
}
