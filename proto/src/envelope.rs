//! The sealed gossip envelope, the [`KeyRing`] that seals and opens it, and the [`SealStream`]
//! that numbers a sender's envelopes.
//!
//! Every gossip datagram travels inside an envelope (version 2):
//!
//! ```text
//!  0      4   5         9          17         25      29          37               len-16  len
//!  +------+---+---------+----------+----------+-------+-----------+----------------+-------+
//!  | magic| v | key id  | sender   | epoch    | nonce (96 bits)   | ciphertext     | tag   |
//!  |      |   |         |          |          | salt  | counter   |                |       |
//!  +------+---+---------+----------+----------+-------+-----------+----------------+-------+
//!  "swlb"  2   4 bytes   8 bytes    8 bytes    4 B     8 bytes     payload length   16 B
//! ```
//!
//! The cipher is AES-256-GCM (`ring`). The associated data is the 37-byte header followed by the
//! cluster name, so a datagram from another cluster, or one whose header was altered, fails to
//! open even under the right key. All integers are big-endian.
//!
//! A key's id is the first four bytes of `SHA-256("swimlb key id" || key)`: it comes from the
//! key material, not from the key's position in the ring, so two nodes may list the same keys in
//! different orders while a rotation is in progress. The first key of a ring seals; every key
//! opens.
//!
//! **Sequence.** The header names where the datagram stands in its sender's stream, a
//! [`Sequence`]: `sender` (an id the sender keeps across restarts; the gossip core uses a hash of
//! its gossip address), `epoch` (grows with every start of the sender; the gossip core uses its
//! start-up identity bump, milliseconds since the Unix epoch) and `counter` (the last eight bytes
//! of the nonce: one more for every envelope the sender seals in that epoch). The sequence is
//! part of the associated data, so it cannot be altered without failing authentication. The
//! envelope only carries it: rejecting replays is the receiver's job (the speaker's
//! `gossip::replay`), and [`KeyRing::open`] stays stateless.
//!
//! **Nonces** never repeat under one key. A [`SealStream`] draws a random 32-bit salt and a
//! random counter start below 2^62 when it is made, then counts up (it refuses to seal rather
//! than wrap), so two streams collide only if their salts are equal and their counter ranges
//! overlap: negligible, without the 2^32-message limit of purely random nonces. The ring's own
//! anonymous stream ([`KeyRing::seal`], [`KeyRing::seal_with`], for tools and tests) works the
//! same way under a random sender id and epoch 0. The counter lives in the stream, not in the
//! ring, so it goes on across a key rotation.
//!
//! Guarantees: [`KeyRing::open`] checks the length bound before it looks at any other byte, never
//! panics, never allocates, and distinguishes truncation, wrong magic, unsupported version
//! (version 1, the envelope without a sequence, included), unknown key and failed
//! authentication.

use core::sync::atomic::{AtomicU64, Ordering};

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::digest::{SHA256, digest};
use ring::rand::{SecureRandom, SystemRandom};

use crate::{Error, Result};

/// The four bytes every envelope starts with.
pub const MAGIC: [u8; 4] = *b"swlb";
/// The envelope version this build seals and opens.
pub const VERSION: u8 = 2;
/// Length of the cleartext header: magic, version, key id, sender, epoch, nonce.
pub const HEADER_LEN: usize = 4 + 1 + 4 + 8 + 8 + NONCE_LEN;
/// Length of the authentication tag.
pub const TAG_LEN: usize = 16;
/// Bytes an envelope adds to its payload.
pub const OVERHEAD: usize = HEADER_LEN + TAG_LEN;
/// The largest datagram [`KeyRing::open`] examines; larger ones are rejected before any work.
pub const MAX_DATAGRAM_LEN: usize = 8192;
/// The largest payload [`KeyRing::seal`] accepts.
pub const MAX_PAYLOAD_LEN: usize = MAX_DATAGRAM_LEN - OVERHEAD;
/// The longest cluster name, in bytes (a DNS name).
pub const MAX_CLUSTER_LEN: usize = 253;
/// Length of a key in bytes (AES-256).
pub const KEY_LEN: usize = 32;

/// Counters start below this bound, so a stream has at least 3 x 2^62 envelopes before it
/// would wrap.
const COUNTER_START_BOUND: u64 = 1 << 62;

mod field {
    use core::ops::Range;
    pub const MAGIC: Range<usize> = 0..4;
    pub const VERSION: usize = 4;
    pub const KEY_ID: Range<usize> = 5..9;
    pub const SENDER: Range<usize> = 9..17;
    pub const EPOCH: Range<usize> = 17..25;
    pub const NONCE: Range<usize> = 25..37;
    pub const COUNTER: Range<usize> = 29..37;
}

/// The identifier of a key, derived from its material.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(pub [u8; 4]);

impl KeyId {
    /// The id of `key`: the first four bytes of `SHA-256("swimlb key id" || key)`.
    pub fn of(key: &[u8; KEY_LEN]) -> KeyId {
        let mut input = [0u8; 13 + KEY_LEN];
        input[..13].copy_from_slice(b"swimlb key id");
        input[13..].copy_from_slice(key);
        let hash = digest(&SHA256, &input);
        let mut id = [0u8; 4];
        id.copy_from_slice(&hash.as_ref()[..4]);
        KeyId(id)
    }
}

impl core::fmt::Display for KeyId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Where an envelope stands in its sender's stream (see the module docs). Authenticated once
/// the envelope has opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sequence {
    /// The sender's id, the same across its restarts.
    pub sender: u64,
    /// The sender's epoch: larger after each restart.
    pub epoch: u64,
    /// The envelope's number in that epoch: one more for each envelope the sender sealed.
    pub counter: u64,
}

/// One sender's numbered stream of envelopes: its sender id and epoch, and the nonce salt and
/// counter its envelopes are sealed with. Seal through [`KeyRing::seal_in`].
#[derive(Debug, Clone)]
pub struct SealStream {
    sender: u64,
    epoch: u64,
    salt: [u8; 4],
    next: u64,
}

impl SealStream {
    /// A stream for `sender` in `epoch`, with a random nonce salt and counter start.
    ///
    /// Fails with [`Error::NoRandomness`] when the system cannot provide random bytes.
    pub fn new(sender: u64, epoch: u64) -> Result<SealStream> {
        let (salt, next) = random_salt_and_start()?;
        Ok(SealStream {
            sender,
            epoch,
            salt,
            next,
        })
    }

    /// The sender id this stream seals under.
    pub fn sender(&self) -> u64 {
        self.sender
    }

    /// The epoch this stream seals under.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The sequence the next envelope will carry.
    pub fn peek(&self) -> Sequence {
        Sequence {
            sender: self.sender,
            epoch: self.epoch,
            counter: self.next,
        }
    }

    /// Takes the next sequence; fails rather than wrap the counter (after at least 3 x 2^62
    /// envelopes: never in practice).
    fn take(&mut self) -> Result<Sequence> {
        let sequence = self.peek();
        self.next = self
            .next
            .checked_add(1)
            .ok_or(Error::OutOfRange("envelope counter exhausted"))?;
        Ok(sequence)
    }
}

fn random_salt_and_start() -> Result<([u8; 4], u64)> {
    let mut bytes = [0u8; 12];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| Error::NoRandomness)?;
    let salt = [bytes[0], bytes[1], bytes[2], bytes[3]];
    let start = u64::from_be_bytes([
        bytes[4], bytes[5], bytes[6], bytes[7], bytes[8], bytes[9], bytes[10], bytes[11],
    ]) % COUNTER_START_BOUND;
    Ok((salt, start))
}

/// An envelope [`KeyRing::open_envelope`] opened: who sealed it, where it stands in its sender's
/// stream (authenticated), and the payload.
#[derive(Debug, PartialEq, Eq)]
pub struct Opened<'a> {
    /// The key it was sealed with.
    pub key_id: KeyId,
    /// Its sequence.
    pub sequence: Sequence,
    /// The payload, a sub-slice of the datagram.
    pub payload: &'a [u8],
}

#[derive(Clone)]
struct RingKey {
    id: KeyId,
    key: LessSafeKey,
}

/// The keys of one cluster: the first seals, all open.
pub struct KeyRing {
    cluster: [u8; MAX_CLUSTER_LEN],
    cluster_len: usize,
    keys: Vec<RingKey>,
    /// The anonymous stream of [`KeyRing::seal`] and [`KeyRing::seal_with`]: random sender id,
    /// epoch 0, random salt, atomic counter.
    anonymous_sender: u64,
    anonymous_salt: [u8; 4],
    anonymous_next: AtomicU64,
}

impl core::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // Never print key material.
        f.debug_struct("KeyRing")
            .field("cluster", &String::from_utf8_lossy(self.cluster()))
            .field("key_ids", &self.key_ids().collect::<Vec<_>>())
            .finish()
    }
}

impl KeyRing {
    /// A ring for `cluster` with `keys`; the first key seals.
    ///
    /// Fails with [`Error::InvalidKeyRing`] when `keys` is empty, when two keys share an id (the
    /// same key twice, or a 32-bit id collision), or when the cluster name is empty or longer than
    /// [`MAX_CLUSTER_LEN`] bytes; with [`Error::NoRandomness`] when the system cannot provide
    /// random bytes.
    pub fn new(cluster: &str, keys: &[[u8; KEY_LEN]]) -> Result<KeyRing> {
        if cluster.is_empty() {
            return Err(Error::InvalidKeyRing("empty cluster name"));
        }
        if cluster.len() > MAX_CLUSTER_LEN {
            return Err(Error::InvalidKeyRing("cluster name longer than 253 bytes"));
        }
        if keys.is_empty() {
            return Err(Error::InvalidKeyRing("no key"));
        }
        let mut ring_keys: Vec<RingKey> = Vec::with_capacity(keys.len());
        for material in keys {
            let id = KeyId::of(material);
            if ring_keys.iter().any(|k| k.id == id) {
                return Err(Error::InvalidKeyRing("duplicate key"));
            }
            let unbound = UnboundKey::new(&AES_256_GCM, material)
                .map_err(|_| Error::InvalidKeyRing("rejected by AES-256-GCM"))?;
            ring_keys.push(RingKey {
                id,
                key: LessSafeKey::new(unbound),
            });
        }
        let (salt, start) = random_salt_and_start()?;
        let mut sender = [0u8; 8];
        SystemRandom::new()
            .fill(&mut sender)
            .map_err(|_| Error::NoRandomness)?;
        let mut buf = [0u8; MAX_CLUSTER_LEN];
        buf[..cluster.len()].copy_from_slice(cluster.as_bytes());
        Ok(KeyRing {
            cluster: buf,
            cluster_len: cluster.len(),
            keys: ring_keys,
            anonymous_sender: u64::from_be_bytes(sender),
            anonymous_salt: salt,
            anonymous_next: AtomicU64::new(start),
        })
    }

    /// A second ring with the same cluster and keys, for another socket of this node (the
    /// owner watch's). Its anonymous stream ([`KeyRing::seal`]) is drawn afresh, so the two
    /// rings never seal under the same nonce; streams sealed with [`KeyRing::seal_in`] are the
    /// caller's and must differ per socket anyway.
    ///
    /// Fails with [`Error::NoRandomness`] when the system cannot provide random bytes.
    pub fn duplicate(&self) -> Result<KeyRing> {
        let (salt, start) = random_salt_and_start()?;
        let mut sender = [0u8; 8];
        SystemRandom::new()
            .fill(&mut sender)
            .map_err(|_| Error::NoRandomness)?;
        Ok(KeyRing {
            cluster: self.cluster,
            cluster_len: self.cluster_len,
            keys: self.keys.clone(),
            anonymous_sender: u64::from_be_bytes(sender),
            anonymous_salt: salt,
            anonymous_next: AtomicU64::new(start),
        })
    }

    /// The cluster name bound into every envelope as associated data.
    pub fn cluster(&self) -> &[u8] {
        &self.cluster[..self.cluster_len]
    }

    /// The id of the sealing key.
    pub fn sealing_key_id(&self) -> KeyId {
        self.keys[0].id
    }

    /// The ids of all keys, sealing key first.
    pub fn key_ids(&self) -> impl Iterator<Item = KeyId> + '_ {
        self.keys.iter().map(|k| k.id)
    }

    /// Whether the ring holds the key `id`.
    pub fn has_key(&self, id: KeyId) -> bool {
        self.keys.iter().any(|k| k.id == id)
    }

    /// Seals `payload` with the first key, in the ring's anonymous stream (a random sender id,
    /// epoch 0), and appends the envelope to `out`. A speaker seals through
    /// [`KeyRing::seal_in`] instead, so its receivers can reject replays across its restarts.
    ///
    /// Fails with [`Error::TooLarge`] (and leaves `out` unchanged) when `payload` is longer than
    /// [`MAX_PAYLOAD_LEN`].
    pub fn seal(&self, payload: &[u8], out: &mut Vec<u8>) -> Result<()> {
        if payload.len() > MAX_PAYLOAD_LEN {
            return Err(Error::TooLarge);
        }
        let (sequence, salt) = self.next_anonymous();
        self.seal_with_key(0, sequence, salt, payload, out)
    }

    /// [`KeyRing::seal`] with the ring's key `id` (for example the key a peer last sealed with,
    /// during a rotation).
    ///
    /// Fails with [`Error::UnknownKey`] when the ring does not hold `id`, and with
    /// [`Error::TooLarge`] as [`KeyRing::seal`] does; `out` is then unchanged.
    pub fn seal_with(&self, id: KeyId, payload: &[u8], out: &mut Vec<u8>) -> Result<()> {
        let index = self.key_index(Some(id))?;
        if payload.len() > MAX_PAYLOAD_LEN {
            return Err(Error::TooLarge);
        }
        let (sequence, salt) = self.next_anonymous();
        self.seal_with_key(index, sequence, salt, payload, out)
    }

    /// Seals `payload` as the next envelope of `stream`, with the ring's key `key` (`None`: the
    /// sealing key), and appends it to `out`.
    ///
    /// Fails with [`Error::UnknownKey`] when the ring does not hold `key`, with
    /// [`Error::TooLarge`] when `payload` is longer than [`MAX_PAYLOAD_LEN`], and with
    /// [`Error::OutOfRange`] when the stream's counter is exhausted; `out` and `stream` are then
    /// unchanged.
    pub fn seal_in(
        &self,
        stream: &mut SealStream,
        key: Option<KeyId>,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let index = self.key_index(key)?;
        if payload.len() > MAX_PAYLOAD_LEN {
            return Err(Error::TooLarge);
        }
        let sequence = stream.take()?;
        self.seal_with_key(index, sequence, stream.salt, payload, out)
    }

    /// Seals with a given sequence and salt. Crate-private: a repeated nonce breaks AES-GCM, so
    /// only the golden-vector test chooses one.
    #[cfg(test)]
    pub(crate) fn seal_fixed(
        &self,
        sequence: Sequence,
        salt: [u8; 4],
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<()> {
        if payload.len() > MAX_PAYLOAD_LEN {
            return Err(Error::TooLarge);
        }
        self.seal_with_key(0, sequence, salt, payload, out)
    }

    fn key_index(&self, key: Option<KeyId>) -> Result<usize> {
        match key {
            None => Ok(0),
            Some(id) => self
                .keys
                .iter()
                .position(|k| k.id == id)
                .ok_or(Error::UnknownKey(id.0)),
        }
    }

    fn seal_with_key(
        &self,
        index: usize,
        sequence: Sequence,
        salt: [u8; 4],
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let key = &self.keys[index];
        let start = out.len();
        out.reserve(OVERHEAD + payload.len());
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&key.id.0);
        out.extend_from_slice(&sequence.sender.to_be_bytes());
        out.extend_from_slice(&sequence.epoch.to_be_bytes());
        out.extend_from_slice(&salt);
        out.extend_from_slice(&sequence.counter.to_be_bytes());
        out.extend_from_slice(payload);
        let (header, body) = out[start..].split_at_mut(HEADER_LEN);
        let header: [u8; HEADER_LEN] = (&*header).try_into().expect("header is HEADER_LEN bytes");
        let nonce: [u8; NONCE_LEN] = header[field::NONCE].try_into().expect("12 bytes");
        let aad = self.associated_data(&header);
        let tag = key
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&aad[..HEADER_LEN + self.cluster_len]),
                body,
            )
            .map_err(|_| Error::TooLarge)?;
        out.extend_from_slice(tag.as_ref());
        Ok(())
    }

    /// Opens `datagram` in place and returns the payload, a sub-slice of `datagram`.
    ///
    /// On error the bytes of `datagram` may have been overwritten and must not be used.
    /// Checks, in order: length at most [`MAX_DATAGRAM_LEN`] ([`Error::TooLarge`]), at least
    /// [`OVERHEAD`] ([`Error::Truncated`]), magic, version, key id, authentication.
    pub fn open<'a>(&self, datagram: &'a mut [u8]) -> Result<&'a [u8]> {
        self.open_envelope(datagram).map(|opened| opened.payload)
    }

    /// [`KeyRing::open`], returning the key id and the (now authenticated) [`Sequence`] with the
    /// payload.
    pub fn open_envelope<'a>(&self, datagram: &'a mut [u8]) -> Result<Opened<'a>> {
        let header = Self::check_header(datagram)?;
        let key_id = KeyId(header[field::KEY_ID].try_into().expect("4 bytes"));
        let key = self
            .keys
            .iter()
            .find(|k| k.id == key_id)
            .ok_or(Error::UnknownKey(key_id.0))?;
        let nonce: [u8; NONCE_LEN] = header[field::NONCE].try_into().expect("12 bytes");
        let aad = self.associated_data(&header);
        let payload = key
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&aad[..HEADER_LEN + self.cluster_len]),
                &mut datagram[HEADER_LEN..],
            )
            .map_err(|_| Error::AuthenticationFailed)?;
        Ok(Opened {
            key_id,
            sequence: sequence_of(&header),
            payload,
        })
    }

    /// Reads the header of `datagram` without opening it: the checks of [`KeyRing::open`] up to,
    /// but not including, key lookup and authentication. Returns the key id.
    pub fn peek_key_id(datagram: &[u8]) -> Result<KeyId> {
        let header = Self::check_header(datagram)?;
        Ok(KeyId(header[field::KEY_ID].try_into().expect("4 bytes")))
    }

    fn check_header(datagram: &[u8]) -> Result<[u8; HEADER_LEN]> {
        if datagram.len() > MAX_DATAGRAM_LEN {
            return Err(Error::TooLarge);
        }
        if datagram.len() < OVERHEAD {
            return Err(Error::Truncated);
        }
        if datagram[field::MAGIC] != MAGIC {
            return Err(Error::WrongMagic);
        }
        if datagram[field::VERSION] != VERSION {
            return Err(Error::UnsupportedVersion(datagram[field::VERSION]));
        }
        Ok(datagram[..HEADER_LEN]
            .try_into()
            .expect("length checked above"))
    }

    fn associated_data(&self, header: &[u8; HEADER_LEN]) -> [u8; HEADER_LEN + MAX_CLUSTER_LEN] {
        let mut aad = [0u8; HEADER_LEN + MAX_CLUSTER_LEN];
        aad[..HEADER_LEN].copy_from_slice(header);
        aad[HEADER_LEN..HEADER_LEN + self.cluster_len].copy_from_slice(self.cluster());
        aad
    }

    /// The next sequence and the salt of the anonymous stream. The counter starts below 2^62,
    /// so it cannot wrap within any realistic number of envelopes.
    fn next_anonymous(&self) -> (Sequence, [u8; 4]) {
        let counter = self.anonymous_next.fetch_add(1, Ordering::Relaxed);
        let sequence = Sequence {
            sender: self.anonymous_sender,
            epoch: 0,
            counter,
        };
        (sequence, self.anonymous_salt)
    }
}

fn sequence_of(header: &[u8; HEADER_LEN]) -> Sequence {
    let u64_at = |range: core::ops::Range<usize>| {
        u64::from_be_bytes(header[range].try_into().expect("8 bytes"))
    };
    Sequence {
        sender: u64_at(field::SENDER),
        epoch: u64_at(field::EPOCH),
        counter: u64_at(field::COUNTER),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: [u8; 32] = [0x11; 32];
    const K2: [u8; 32] = [0x22; 32];

    fn sealed(ring: &KeyRing, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        ring.seal(payload, &mut out).unwrap();
        out
    }

    #[test]
    fn seal_then_open_returns_the_payload() {
        let ring = KeyRing::new("edge-1", &[K1]).unwrap();
        let mut d = sealed(&ring, b"hello gossip");
        assert_eq!(d.len(), OVERHEAD + 12);
        assert_eq!(&d[..4], b"swlb");
        assert_eq!(d[4], 2);
        assert_eq!(ring.open(&mut d).unwrap(), b"hello gossip");
    }

    #[test]
    fn a_duplicate_ring_opens_and_seals_alike_under_another_anonymous_stream() {
        let ring = KeyRing::new("edge-1", &[K1, K2]).unwrap();
        let twin = ring.duplicate().unwrap();
        assert_eq!(twin.cluster(), ring.cluster());
        assert_eq!(
            twin.key_ids().collect::<Vec<_>>(),
            ring.key_ids().collect::<Vec<_>>()
        );
        let mut d = sealed(&twin, b"watch");
        assert_eq!(ring.open(&mut d).unwrap(), b"watch");
        let (a, b) = (sealed(&ring, b"x"), sealed(&twin, b"x"));
        assert_ne!(
            open_sequence(&a).sender,
            open_sequence(&b).sender,
            "the anonymous streams differ"
        );
    }

    fn open_sequence(d: &[u8]) -> Sequence {
        sequence_of(d[..HEADER_LEN].try_into().unwrap())
    }

    #[test]
    fn empty_payload_round_trips() {
        let ring = KeyRing::new("edge-1", &[K1]).unwrap();
        let mut d = sealed(&ring, b"");
        assert_eq!(ring.open(&mut d).unwrap(), b"");
    }

    #[test]
    fn key_id_comes_from_material_not_position() {
        let a = KeyRing::new("c", &[K1, K2]).unwrap();
        let b = KeyRing::new("c", &[K2, K1]).unwrap();
        assert_eq!(
            a.key_ids().collect::<Vec<_>>()[0],
            b.key_ids().collect::<Vec<_>>()[1]
        );
        // b seals with K2, a still opens it.
        let mut d = sealed(&b, b"rotating");
        assert_eq!(a.open(&mut d).unwrap(), b"rotating");
        // a seals with K1, b opens it too.
        let mut d = sealed(&a, b"rotating");
        assert_eq!(b.open(&mut d).unwrap(), b"rotating");
    }

    #[test]
    fn seal_with_picks_a_key_of_the_ring_and_refuses_others() {
        let new_first = KeyRing::new("c", &[K2, K1]).unwrap();
        let old_only = KeyRing::new("c", &[K1]).unwrap();
        assert!(new_first.has_key(KeyId::of(&K1)));
        assert!(!old_only.has_key(KeyId::of(&K2)));
        let mut d = Vec::new();
        new_first
            .seal_with(KeyId::of(&K1), b"to an old peer", &mut d)
            .unwrap();
        assert_eq!(KeyRing::peek_key_id(&d), Ok(KeyId::of(&K1)));
        assert_eq!(old_only.open(&mut d).unwrap(), b"to an old peer");
        let mut out = vec![9];
        assert_eq!(
            old_only.seal_with(KeyId::of(&K2), b"x", &mut out),
            Err(Error::UnknownKey(KeyId::of(&K2).0))
        );
        assert_eq!(
            old_only.seal_with(KeyId::of(&K1), &[0; MAX_PAYLOAD_LEN + 1], &mut out),
            Err(Error::TooLarge)
        );
        assert_eq!(out, vec![9], "a refused seal leaves the output alone");
    }

    #[test]
    fn known_key_id_vector() {
        // SHA-256("swimlb key id" || 0x11 * 32), first four bytes; computed with
        // `python3 -c "import hashlib;print(hashlib.sha256(b'swimlb key id'+b'\x11'*32).hexdigest()[:8])"`.
        assert_eq!(KeyId::of(&K1).to_string(), "4dbf27ca");
    }

    #[test]
    fn unknown_key_is_rejected_with_its_id() {
        let sender = KeyRing::new("c", &[K2]).unwrap();
        let receiver = KeyRing::new("c", &[K1]).unwrap();
        let mut d = sealed(&sender, b"x");
        assert_eq!(
            receiver.open(&mut d),
            Err(Error::UnknownKey(KeyId::of(&K2).0))
        );
    }

    #[test]
    fn other_cluster_name_fails_authentication() {
        let sender = KeyRing::new("edge-1", &[K1]).unwrap();
        let receiver = KeyRing::new("edge-2", &[K1]).unwrap();
        let mut d = sealed(&sender, b"x");
        assert_eq!(receiver.open(&mut d), Err(Error::AuthenticationFailed));
    }

    #[test]
    fn flipped_ciphertext_bit_fails_authentication() {
        let ring = KeyRing::new("c", &[K1]).unwrap();
        let mut d = sealed(&ring, b"payload");
        d[HEADER_LEN] ^= 1;
        assert_eq!(ring.open(&mut d), Err(Error::AuthenticationFailed));
    }

    #[test]
    fn flipped_nonce_bit_fails_authentication() {
        let ring = KeyRing::new("c", &[K1]).unwrap();
        let mut d = sealed(&ring, b"payload");
        d[field::NONCE.start] ^= 0x80;
        assert_eq!(ring.open(&mut d), Err(Error::AuthenticationFailed));
    }

    #[test]
    fn flipped_tag_bit_fails_authentication() {
        let ring = KeyRing::new("c", &[K1]).unwrap();
        let mut d = sealed(&ring, b"payload");
        let last = d.len() - 1;
        d[last] ^= 1;
        assert_eq!(ring.open(&mut d), Err(Error::AuthenticationFailed));
    }

    #[test]
    fn wrong_magic_is_rejected() {
        let ring = KeyRing::new("c", &[K1]).unwrap();
        let mut d = sealed(&ring, b"payload");
        d[0] = b'S';
        assert_eq!(ring.open(&mut d), Err(Error::WrongMagic));
    }

    #[test]
    fn unsupported_version_is_rejected() {
        let ring = KeyRing::new("c", &[K1]).unwrap();
        // Version 1 (the envelope without a sequence) and any later version.
        for version in [1, 3] {
            let mut d = sealed(&ring, b"payload");
            d[4] = version;
            assert_eq!(ring.open(&mut d), Err(Error::UnsupportedVersion(version)));
        }
    }

    #[test]
    fn datagram_shorter_than_overhead_is_truncated() {
        let ring = KeyRing::new("c", &[K1]).unwrap();
        let d = sealed(&ring, b"");
        for len in 0..OVERHEAD {
            let mut short = d[..len].to_vec();
            assert_eq!(ring.open(&mut short), Err(Error::Truncated), "length {len}");
        }
    }

    #[test]
    fn oversized_datagram_is_rejected_before_magic() {
        let ring = KeyRing::new("c", &[K1]).unwrap();
        let mut d = vec![0u8; MAX_DATAGRAM_LEN + 1];
        assert_eq!(ring.open(&mut d), Err(Error::TooLarge));
    }

    #[test]
    fn oversized_payload_is_refused_and_output_untouched() {
        let ring = KeyRing::new("c", &[K1]).unwrap();
        let mut out = vec![7u8];
        assert_eq!(
            ring.seal(&vec![0; MAX_PAYLOAD_LEN + 1], &mut out),
            Err(Error::TooLarge)
        );
        assert_eq!(out, vec![7u8]);
        ring.seal(&vec![0; MAX_PAYLOAD_LEN], &mut out).unwrap();
        assert_eq!(out.len(), 1 + MAX_DATAGRAM_LEN);
    }

    #[test]
    fn nonces_do_not_repeat() {
        let ring = KeyRing::new("c", &[K1]).unwrap();
        let a = sealed(&ring, b"same");
        let b = sealed(&ring, b"same");
        assert_ne!(a[field::NONCE], b[field::NONCE]);
        assert_ne!(a[HEADER_LEN..], b[HEADER_LEN..]);
    }

    #[test]
    fn invalid_rings_are_refused() {
        assert_eq!(
            KeyRing::new("c", &[]).unwrap_err(),
            Error::InvalidKeyRing("no key")
        );
        assert_eq!(
            KeyRing::new("c", &[K1, K1]).unwrap_err(),
            Error::InvalidKeyRing("duplicate key")
        );
        assert!(KeyRing::new("", &[K1]).is_err());
        assert!(KeyRing::new(&"a".repeat(254), &[K1]).is_err());
        assert!(KeyRing::new(&"a".repeat(253), &[K1]).is_ok());
    }

    /// The sequence and salt of `crate::golden::ENVELOPE`.
    const GOLDEN_SEQUENCE: Sequence = Sequence {
        sender: 0x2021_2223_2425_2627,
        epoch: 1_700_000_000_000,
        counter: 0x0405_0607_0809_0a0b,
    };
    const GOLDEN_SALT: [u8; 4] = [0, 1, 2, 3];

    #[test]
    fn seal_with_a_fixed_sequence_matches_python_cryptography() {
        // `crate::golden::ENVELOPE` was sealed by Python `cryptography`'s AESGCM (see its doc).
        let ring = KeyRing::new("edge-1", &[K1]).unwrap();
        let mut out = Vec::new();
        ring.seal_fixed(GOLDEN_SEQUENCE, GOLDEN_SALT, b"hello gossip", &mut out)
            .unwrap();
        assert_eq!(out, crate::golden::ENVELOPE);
    }

    #[test]
    fn envelope_sealed_by_python_cryptography_opens_with_its_sequence() {
        let ring = KeyRing::new("edge-1", &[K1]).unwrap();
        let mut d = crate::golden::ENVELOPE;
        let opened = ring.open_envelope(&mut d).unwrap();
        assert_eq!(opened.payload, b"hello gossip");
        assert_eq!(opened.sequence, GOLDEN_SEQUENCE);
        assert_eq!(opened.key_id, KeyId::of(&K1));
    }

    #[test]
    fn a_stream_numbers_its_envelopes_one_by_one_across_key_rings() {
        let first = KeyRing::new("c", &[K1]).unwrap();
        let rotated = KeyRing::new("c", &[K2, K1]).unwrap();
        let mut stream = SealStream::new(7, 1_700_000_000_000).unwrap();
        let start = stream.peek().counter;
        assert!(start < COUNTER_START_BOUND);
        let mut seen = Vec::new();
        for (ring, key) in [
            (&first, None),
            (&rotated, None),
            (&rotated, Some(KeyId::of(&K1))),
        ] {
            let mut d = Vec::new();
            ring.seal_in(&mut stream, key, b"x", &mut d).unwrap();
            let opened = rotated.open_envelope(&mut d).unwrap();
            assert_eq!(
                (opened.sequence.sender, opened.sequence.epoch),
                (7, 1_700_000_000_000)
            );
            seen.push(opened.sequence.counter);
        }
        assert_eq!(seen, vec![start, start + 1, start + 2]);
    }

    #[test]
    fn a_refused_seal_leaves_the_stream_and_the_output_alone() {
        let ring = KeyRing::new("c", &[K1]).unwrap();
        let mut stream = SealStream::new(1, 1).unwrap();
        let before = stream.peek();
        let mut out = vec![5];
        assert_eq!(
            ring.seal_in(&mut stream, Some(KeyId::of(&K2)), b"x", &mut out),
            Err(Error::UnknownKey(KeyId::of(&K2).0))
        );
        assert_eq!(
            ring.seal_in(&mut stream, None, &[0; MAX_PAYLOAD_LEN + 1], &mut out),
            Err(Error::TooLarge)
        );
        stream.next = u64::MAX;
        assert!(matches!(
            ring.seal_in(&mut stream, None, b"x", &mut out),
            Err(Error::OutOfRange(_))
        ));
        assert_eq!(stream.peek().counter, u64::MAX);
        stream.next = before.counter;
        assert_eq!(stream.peek(), before);
        assert_eq!(out, vec![5]);
    }

    #[test]
    fn streams_of_one_sender_and_epoch_never_share_a_nonce() {
        // Two streams made for the same sender and epoch (a restart within one millisecond, a
        // misconfigured bump) still draw their own salts and counter starts.
        let ring = KeyRing::new("c", &[K1]).unwrap();
        let mut a = SealStream::new(1, 1).unwrap();
        let mut b = SealStream::new(1, 1).unwrap();
        let (mut da, mut db) = (Vec::new(), Vec::new());
        ring.seal_in(&mut a, None, b"same", &mut da).unwrap();
        ring.seal_in(&mut b, None, b"same", &mut db).unwrap();
        assert_ne!(da[field::NONCE], db[field::NONCE]);
    }

    #[test]
    fn altered_sequence_fails_authentication() {
        let ring = KeyRing::new("c", &[K1]).unwrap();
        for byte in [
            field::SENDER.start,
            field::EPOCH.end - 1,
            field::COUNTER.end - 1,
        ] {
            let mut d = sealed(&ring, b"payload");
            d[byte] ^= 1;
            assert_eq!(
                ring.open(&mut d),
                Err(Error::AuthenticationFailed),
                "byte {byte}"
            );
        }
    }

    #[test]
    fn anonymous_seals_count_up_under_one_random_sender_in_epoch_zero() {
        let ring = KeyRing::new("c", &[K1, K2]).unwrap();
        let mut a = sealed(&ring, b"a");
        let mut b = Vec::new();
        ring.seal_with(KeyId::of(&K2), b"b", &mut b).unwrap();
        let a = ring.open_envelope(&mut a).unwrap().sequence;
        let b = ring.open_envelope(&mut b).unwrap().sequence;
        assert_eq!((a.sender, a.epoch), (b.sender, 0));
        assert_eq!(b.counter, a.counter + 1);
        let other = KeyRing::new("c", &[K1]).unwrap();
        let mut c = sealed(&other, b"c");
        assert_ne!(
            other.open_envelope(&mut c).unwrap().sequence.sender,
            a.sender
        );
    }

    #[test]
    fn debug_output_has_no_key_material() {
        let ring = KeyRing::new("c", &[K1]).unwrap();
        let text = format!("{ring:?}");
        assert!(text.contains("KeyId"), "{text}");
        assert!(!text.contains("17, 17"), "{text}");
    }
}
