//! The sealed gossip envelope, the [`KeyRing`] that seals and opens it, and the [`SealStream`]
//! that numbers a sender's envelopes.
//!
//! Every gossip and owner-watch datagram travels inside an envelope. Version 2:
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
//! Version 3 is version 2 with the receiver: eight more header bytes after the nonce, the
//! receiver's id (the id the receiver itself seals under as a sender: the speaker uses a hash of
//! the receiving socket's address, see [`Addressing`]):
//!
//! ```text
//!  0      4   5         9          17         25                  37         45       len-16  len
//!  | magic| 3 | key id  | sender   | epoch    | nonce             | receiver | cipher.. | tag  |
//! ```
//!
//! The cipher is AES-256-GCM (`ring`). The associated data is the header (37 bytes in version
//! 2, 45 in version 3) followed by the cluster name, so a datagram from another cluster, or one
//! whose header was altered, fails to open even under the right key; in version 3 a datagram
//! sealed for one receiver fails to open at another ([`KeyRing::open_for`] refuses it as
//! [`Error::WrongReceiver`] before any cryptography, and altering the receiver field fails
//! authentication). All integers are big-endian.
//!
//! **Versions and the wire-compatibility rule.** Each speaker announces the envelope versions it
//! speaks ([`Versions`]; the speaker puts them in its gossiped metadata, where a speaker of the
//! previous release ignores them); a mesh speaks the highest version every live member speaks;
//! a release keeps opening and sealing the previous version ([`PREVIOUS_VERSION`]), and seals
//! the previous version to any member whose announcement it has not heard. So a rolling upgrade
//! never has two halves that cannot open each other's datagrams: the mesh speaks version 2 until
//! the last speaker of the previous release is gone, then version 3, and version 2 again if
//! such a speaker joins. The choice per receiver is the caller's ([`Addressing`]); this module
//! seals what it is told and opens every version it is allowed to ([`KeyRing::open_for`]).
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
//! ring, so it goes on across a key rotation, and one stream seals both versions.
//!
//! Guarantees: [`KeyRing::open`] checks the length bound before it looks at any other byte, never
//! panics, never allocates, and distinguishes truncation, wrong magic, unsupported version
//! (version 1, the envelope without a sequence, included), wrong receiver, unknown key and
//! failed authentication.

use core::sync::atomic::{AtomicU64, Ordering};

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::digest::{SHA256, digest};
use ring::rand::{SecureRandom, SystemRandom};

use crate::{Error, Result};

/// The four bytes every envelope starts with.
pub const MAGIC: [u8; 4] = *b"swlb";
/// The newest envelope version this build seals and opens: version 2 bound to its receiver.
pub const VERSION: u8 = 3;
/// The previous envelope version, which this build still seals and opens (see the module docs).
pub const PREVIOUS_VERSION: u8 = 2;
/// Length of the version-2 cleartext header: magic, version, key id, sender, epoch, nonce.
pub const HEADER_LEN: usize = 4 + 1 + 4 + 8 + 8 + NONCE_LEN;
/// Length of the receiver id version 3 adds after the version-2 header.
pub const RECEIVER_LEN: usize = 8;
/// Length of the version-3 cleartext header.
pub const HEADER_LEN_V3: usize = HEADER_LEN + RECEIVER_LEN;
/// Length of the authentication tag.
pub const TAG_LEN: usize = 16;
/// Bytes a version-2 envelope adds to its payload.
pub const OVERHEAD_V2: usize = HEADER_LEN + TAG_LEN;
/// Bytes an envelope adds to its payload, at most (version 3).
pub const OVERHEAD: usize = HEADER_LEN_V3 + TAG_LEN;
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
    pub const RECEIVER: Range<usize> = 37..45;
}

/// A set of envelope versions (0 to 31): what a speaker speaks, or announces it speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Versions(u32);

impl Versions {
    /// No version: nothing announced.
    pub const NONE: Versions = Versions(0);
    /// The previous version alone: what a speaker that announced nothing is taken to speak.
    pub const PREVIOUS: Versions = Versions(1 << PREVIOUS_VERSION);
    /// What this build speaks: [`PREVIOUS_VERSION`] and [`VERSION`].
    pub const THIS_BUILD: Versions = Versions(1 << PREVIOUS_VERSION | 1 << VERSION);

    /// This set with `version` added; versions above 31 are ignored.
    pub const fn with(self, version: u8) -> Versions {
        if version < 32 {
            Versions(self.0 | 1 << version)
        } else {
            self
        }
    }

    /// Whether `version` is in the set.
    pub const fn contains(self, version: u8) -> bool {
        version < 32 && self.0 & 1 << version != 0
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The versions in both sets.
    pub const fn intersection(self, other: Versions) -> Versions {
        Versions(self.0 & other.0)
    }

    /// The highest version in the set.
    pub const fn highest(self) -> Option<u8> {
        if self.0 == 0 {
            None
        } else {
            Some(31 - self.0.leading_zeros() as u8)
        }
    }

    /// The versions, lowest first.
    pub fn iter(self) -> impl Iterator<Item = u8> {
        (0..32u8).filter(move |v| self.contains(*v))
    }
}

impl FromIterator<u8> for Versions {
    fn from_iter<I: IntoIterator<Item = u8>>(iter: I) -> Versions {
        iter.into_iter().fold(Versions::NONE, Versions::with)
    }
}

/// How an envelope is sealed: in the previous version, which any holder of the key opens, or in
/// version 3 for one receiver. The receiver's id is the sender id the receiving socket seals
/// its own envelopes under (the speaker: a hash of that socket's address, known to whoever
/// sends to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Addressing {
    /// Version 2: for a receiver not known to speak version 3.
    V2,
    /// Version 3, bound to the receiver with this id.
    V3 {
        /// The receiver's id.
        receiver: u64,
    },
}

impl Addressing {
    /// The envelope version this addressing seals in.
    pub const fn version(self) -> u8 {
        match self {
            Addressing::V2 => PREVIOUS_VERSION,
            Addressing::V3 { .. } => VERSION,
        }
    }

    const fn header_len(self) -> usize {
        match self {
            Addressing::V2 => HEADER_LEN,
            Addressing::V3 { .. } => HEADER_LEN_V3,
        }
    }
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
    /// The envelope version it was sealed in.
    pub version: u8,
    /// The receiver it was sealed for (version 3 on).
    pub receiver: Option<u64>,
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
    /// epoch 0), as a version-2 envelope, and appends it to `out`. A speaker seals through
    /// [`KeyRing::seal_to`] instead, so its receivers can reject replays across its restarts.
    ///
    /// Fails with [`Error::TooLarge`] (and leaves `out` unchanged) when `payload` is longer than
    /// [`MAX_PAYLOAD_LEN`].
    pub fn seal(&self, payload: &[u8], out: &mut Vec<u8>) -> Result<()> {
        if payload.len() > MAX_PAYLOAD_LEN {
            return Err(Error::TooLarge);
        }
        let (sequence, salt) = self.next_anonymous();
        self.seal_with_key(0, Addressing::V2, sequence, salt, payload, out)
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
        self.seal_with_key(index, Addressing::V2, sequence, salt, payload, out)
    }

    /// Seals `payload` as the next envelope of `stream`, with the ring's key `key` (`None`: the
    /// sealing key), as a version-2 envelope ([`KeyRing::seal_to`] with [`Addressing::V2`]),
    /// and appends it to `out`.
    ///
    /// Fails as [`KeyRing::seal_to`] does.
    pub fn seal_in(
        &self,
        stream: &mut SealStream,
        key: Option<KeyId>,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<()> {
        self.seal_to(stream, key, Addressing::V2, payload, out)
    }

    /// Seals `payload` as the next envelope of `stream`, with the ring's key `key` (`None`: the
    /// sealing key), in the version and for the receiver `to` names, and appends it to `out`.
    ///
    /// Fails with [`Error::UnknownKey`] when the ring does not hold `key`, with
    /// [`Error::TooLarge`] when `payload` is longer than [`MAX_PAYLOAD_LEN`], and with
    /// [`Error::OutOfRange`] when the stream's counter is exhausted; `out` and `stream` are then
    /// unchanged.
    pub fn seal_to(
        &self,
        stream: &mut SealStream,
        key: Option<KeyId>,
        to: Addressing,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let index = self.key_index(key)?;
        if payload.len() > MAX_PAYLOAD_LEN {
            return Err(Error::TooLarge);
        }
        let sequence = stream.take()?;
        self.seal_with_key(index, to, sequence, stream.salt, payload, out)
    }

    /// Seals with a given sequence and salt. Crate-private: a repeated nonce breaks AES-GCM, so
    /// only the golden-vector tests choose one.
    #[cfg(test)]
    pub(crate) fn seal_fixed(
        &self,
        to: Addressing,
        sequence: Sequence,
        salt: [u8; 4],
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<()> {
        if payload.len() > MAX_PAYLOAD_LEN {
            return Err(Error::TooLarge);
        }
        self.seal_with_key(0, to, sequence, salt, payload, out)
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
        to: Addressing,
        sequence: Sequence,
        salt: [u8; 4],
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let key = &self.keys[index];
        let start = out.len();
        let header_len = to.header_len();
        out.reserve(header_len + TAG_LEN + payload.len());
        out.extend_from_slice(&MAGIC);
        out.push(to.version());
        out.extend_from_slice(&key.id.0);
        out.extend_from_slice(&sequence.sender.to_be_bytes());
        out.extend_from_slice(&sequence.epoch.to_be_bytes());
        out.extend_from_slice(&salt);
        out.extend_from_slice(&sequence.counter.to_be_bytes());
        if let Addressing::V3 { receiver } = to {
            out.extend_from_slice(&receiver.to_be_bytes());
        }
        out.extend_from_slice(payload);
        let (header, body) = out[start..].split_at_mut(header_len);
        let nonce: [u8; NONCE_LEN] = header[field::NONCE].try_into().expect("12 bytes");
        let (aad, aad_len) = self.associated_data(header);
        let tag = key
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&aad[..aad_len]),
                body,
            )
            .map_err(|_| Error::TooLarge)?;
        out.extend_from_slice(tag.as_ref());
        Ok(())
    }

    /// Opens `datagram` in place and returns the payload, a sub-slice of `datagram`. Opens every
    /// version this build speaks without checking a version-3 receiver: for tools and tests; a
    /// speaker opens with [`KeyRing::open_for`].
    ///
    /// On error the bytes of `datagram` may have been overwritten and must not be used.
    /// Checks, in order: length at most [`MAX_DATAGRAM_LEN`] ([`Error::TooLarge`]), at least
    /// [`OVERHEAD_V2`] ([`Error::Truncated`]), magic, version (and the longer version-3 header),
    /// key id, authentication.
    pub fn open<'a>(&self, datagram: &'a mut [u8]) -> Result<&'a [u8]> {
        self.open_envelope(datagram).map(|opened| opened.payload)
    }

    /// [`KeyRing::open`], returning the version, the receiver, the key id and the (now
    /// authenticated) [`Sequence`] with the payload.
    pub fn open_envelope<'a>(&self, datagram: &'a mut [u8]) -> Result<Opened<'a>> {
        self.open_checked(datagram, None, Versions::THIS_BUILD)
    }

    /// Opens `datagram` in place at the receiver `receiver`, accepting the versions in
    /// `accepted` (a speaker: [`Versions::THIS_BUILD`]; one that keeps the previous release's
    /// behaviour: [`Versions::PREVIOUS`]). A version-3 envelope sealed for another receiver is
    /// refused as [`Error::WrongReceiver`] before its key is looked up; a version-2 one opens
    /// anywhere (it names no receiver).
    ///
    /// Checks, in order: as [`KeyRing::open`], with the receiver between version and key id.
    pub fn open_for<'a>(
        &self,
        datagram: &'a mut [u8],
        receiver: u64,
        accepted: Versions,
    ) -> Result<Opened<'a>> {
        self.open_checked(datagram, Some(receiver), accepted)
    }

    fn open_checked<'a>(
        &self,
        datagram: &'a mut [u8],
        me: Option<u64>,
        accepted: Versions,
    ) -> Result<Opened<'a>> {
        let (version, header_len) = Self::check_header(datagram, accepted)?;
        let receiver = (version == VERSION).then(|| u64_at(datagram, field::RECEIVER));
        if let (Some(me), Some(receiver)) = (me, receiver)
            && me != receiver
        {
            return Err(Error::WrongReceiver);
        }
        let key_id = KeyId(datagram[field::KEY_ID].try_into().expect("4 bytes"));
        let key = self
            .keys
            .iter()
            .find(|k| k.id == key_id)
            .ok_or(Error::UnknownKey(key_id.0))?;
        let (header, body) = datagram.split_at_mut(header_len);
        let nonce: [u8; NONCE_LEN] = header[field::NONCE].try_into().expect("12 bytes");
        let sequence = sequence_of(header);
        let (aad, aad_len) = self.associated_data(header);
        let payload = key
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&aad[..aad_len]),
                body,
            )
            .map_err(|_| Error::AuthenticationFailed)?;
        Ok(Opened {
            version,
            receiver,
            key_id,
            sequence,
            payload,
        })
    }

    /// Reads the header of `datagram` without opening it: the checks of [`KeyRing::open`] up to,
    /// but not including, key lookup and authentication. Returns the key id.
    pub fn peek_key_id(datagram: &[u8]) -> Result<KeyId> {
        Self::check_header(datagram, Versions::THIS_BUILD)?;
        Ok(KeyId(datagram[field::KEY_ID].try_into().expect("4 bytes")))
    }

    /// The length, magic and version checks: the version and its header's length.
    fn check_header(datagram: &[u8], accepted: Versions) -> Result<(u8, usize)> {
        if datagram.len() > MAX_DATAGRAM_LEN {
            return Err(Error::TooLarge);
        }
        if datagram.len() < OVERHEAD_V2 {
            return Err(Error::Truncated);
        }
        if datagram[field::MAGIC] != MAGIC {
            return Err(Error::WrongMagic);
        }
        let version = datagram[field::VERSION];
        let header_len = match version {
            PREVIOUS_VERSION => HEADER_LEN,
            VERSION => HEADER_LEN_V3,
            other => return Err(Error::UnsupportedVersion(other)),
        };
        if !accepted.contains(version) {
            return Err(Error::UnsupportedVersion(version));
        }
        if datagram.len() < header_len + TAG_LEN {
            return Err(Error::Truncated);
        }
        Ok((version, header_len))
    }

    /// The associated data of an envelope whose header is `header`: the header, then the
    /// cluster name; and its length.
    fn associated_data(&self, header: &[u8]) -> ([u8; HEADER_LEN_V3 + MAX_CLUSTER_LEN], usize) {
        let mut aad = [0u8; HEADER_LEN_V3 + MAX_CLUSTER_LEN];
        aad[..header.len()].copy_from_slice(header);
        aad[header.len()..header.len() + self.cluster_len].copy_from_slice(self.cluster());
        (aad, header.len() + self.cluster_len)
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

/// The big-endian integer at `range` (eight bytes) of a header already checked to be long
/// enough.
fn u64_at(header: &[u8], range: core::ops::Range<usize>) -> u64 {
    u64::from_be_bytes(header[range].try_into().expect("8 bytes"))
}

fn sequence_of(header: &[u8]) -> Sequence {
    Sequence {
        sender: u64_at(header, field::SENDER),
        epoch: u64_at(header, field::EPOCH),
        counter: u64_at(header, field::COUNTER),
    }
}

#[cfg(test)]
mod tests;
