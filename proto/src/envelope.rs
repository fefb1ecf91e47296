//! The sealed gossip envelope and the [`KeyRing`] that seals and opens it.
//!
//! Every gossip datagram travels inside an envelope:
//!
//! ```text
//!  0      4   5          9                     21                    len-16     len
//!  +------+---+----------+---------------------+---------------------+----------+
//!  | magic| v | key id   | nonce (96 bits)     | ciphertext          | GCM tag  |
//!  +------+---+----------+---------------------+---------------------+----------+
//!  "swlb"  1   4 bytes    12 bytes               payload length        16 bytes
//! ```
//!
//! The cipher is AES-256-GCM (`ring`). The associated data is the 21-byte header followed by the
//! cluster name, so a datagram from another cluster, or one whose header was altered, fails to
//! open even under the right key.
//!
//! A key's id is the first four bytes of `SHA-256("swimlb key id" || key)`: it comes from the
//! key material, not from the key's position in the ring, so two nodes may list the same keys in
//! different orders while a rotation is in progress. The first key of a ring seals; every key
//! opens.
//!
//! Nonces never repeat within one ring: each ring draws a random 96-bit starting value and
//! counts up from it, so two rings collide only if their random ranges overlap (negligible in a
//! 2^96 space), without the 2^32-message limit of purely random nonces.
//!
//! Guarantees: [`KeyRing::open`] checks the length bound before it looks at any other byte, never
//! panics, never allocates, and distinguishes truncation, wrong magic, unsupported version,
//! unknown key and failed authentication.

use core::sync::atomic::{AtomicU64, Ordering};

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::digest::{SHA256, digest};
use ring::rand::{SecureRandom, SystemRandom};

use crate::{Error, Result};

/// The four bytes every envelope starts with.
pub const MAGIC: [u8; 4] = *b"swlb";
/// The envelope version this build seals and opens.
pub const VERSION: u8 = 1;
/// Length of the cleartext header: magic, version, key id, nonce.
pub const HEADER_LEN: usize = 4 + 1 + 4 + NONCE_LEN;
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

mod field {
    use core::ops::Range;
    pub const MAGIC: Range<usize> = 0..4;
    pub const VERSION: usize = 4;
    pub const KEY_ID: Range<usize> = 5..9;
    pub const NONCE: Range<usize> = 9..21;
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

struct RingKey {
    id: KeyId,
    key: LessSafeKey,
}

/// The keys of one cluster: the first seals, all open.
pub struct KeyRing {
    cluster: [u8; MAX_CLUSTER_LEN],
    cluster_len: usize,
    keys: Vec<RingKey>,
    nonce_high: u32,
    nonce_low: AtomicU64,
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
    /// [`MAX_CLUSTER_LEN`] bytes.
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
        let mut start = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut start)
            .map_err(|_| Error::InvalidKeyRing("no system randomness for nonces"))?;
        let mut buf = [0u8; MAX_CLUSTER_LEN];
        buf[..cluster.len()].copy_from_slice(cluster.as_bytes());
        Ok(KeyRing {
            cluster: buf,
            cluster_len: cluster.len(),
            keys: ring_keys,
            nonce_high: u32::from_be_bytes([start[0], start[1], start[2], start[3]]),
            nonce_low: AtomicU64::new(u64::from_be_bytes([
                start[4], start[5], start[6], start[7], start[8], start[9], start[10], start[11],
            ])),
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

    /// Seals `payload` with the first key and appends the envelope to `out`.
    ///
    /// Fails with [`Error::TooLarge`] (and leaves `out` unchanged) when `payload` is longer than
    /// [`MAX_PAYLOAD_LEN`].
    pub fn seal(&self, payload: &[u8], out: &mut Vec<u8>) -> Result<()> {
        if payload.len() > MAX_PAYLOAD_LEN {
            return Err(Error::TooLarge);
        }
        self.seal_with_nonce(self.next_nonce(), payload, out)
    }

    /// Seals `payload` with the ring's key `id` (for example the key a peer last sealed with,
    /// during a rotation) and appends the envelope to `out`.
    ///
    /// Fails with [`Error::UnknownKey`] when the ring does not hold `id`, and with
    /// [`Error::TooLarge`] as [`KeyRing::seal`] does; `out` is then unchanged.
    pub fn seal_with(&self, id: KeyId, payload: &[u8], out: &mut Vec<u8>) -> Result<()> {
        let index = self
            .keys
            .iter()
            .position(|k| k.id == id)
            .ok_or(Error::UnknownKey(id.0))?;
        if payload.len() > MAX_PAYLOAD_LEN {
            return Err(Error::TooLarge);
        }
        self.seal_with_key(index, self.next_nonce(), payload, out)
    }

    /// [`KeyRing::seal`] with a given nonce. Crate-private: a repeated nonce breaks AES-GCM, so
    /// only the golden-vector test chooses one.
    pub(crate) fn seal_with_nonce(
        &self,
        nonce: [u8; NONCE_LEN],
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<()> {
        if payload.len() > MAX_PAYLOAD_LEN {
            return Err(Error::TooLarge);
        }
        self.seal_with_key(0, nonce, payload, out)
    }

    fn seal_with_key(
        &self,
        index: usize,
        nonce: [u8; NONCE_LEN],
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let key = &self.keys[index];
        let start = out.len();
        out.reserve(OVERHEAD + payload.len());
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&key.id.0);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(payload);
        let (header, body) = out[start..].split_at_mut(HEADER_LEN);
        let header: [u8; HEADER_LEN] = (&*header).try_into().expect("header is HEADER_LEN bytes");
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
        let header = Self::check_header(datagram)?;
        let key_id = KeyId(header[field::KEY_ID].try_into().expect("4 bytes"));
        let key = self
            .keys
            .iter()
            .find(|k| k.id == key_id)
            .ok_or(Error::UnknownKey(key_id.0))?;
        let nonce: [u8; NONCE_LEN] = header[field::NONCE].try_into().expect("12 bytes");
        let aad = self.associated_data(&header);
        let plain = key
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&aad[..HEADER_LEN + self.cluster_len]),
                &mut datagram[HEADER_LEN..],
            )
            .map_err(|_| Error::AuthenticationFailed)?;
        Ok(plain)
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

    fn next_nonce(&self) -> [u8; NONCE_LEN] {
        let low = self.nonce_low.fetch_add(1, Ordering::Relaxed);
        let mut nonce = [0u8; NONCE_LEN];
        nonce[..4].copy_from_slice(&self.nonce_high.to_be_bytes());
        nonce[4..].copy_from_slice(&low.to_be_bytes());
        nonce
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
        assert_eq!(d[4], 1);
        assert_eq!(ring.open(&mut d).unwrap(), b"hello gossip");
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
        let mut d = sealed(&ring, b"payload");
        d[4] = 2;
        assert_eq!(ring.open(&mut d), Err(Error::UnsupportedVersion(2)));
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

    #[test]
    fn seal_with_a_fixed_nonce_matches_python_cryptography() {
        // `crate::golden::ENVELOPE` was sealed by Python `cryptography`'s AESGCM (see its doc).
        let ring = KeyRing::new("edge-1", &[K1]).unwrap();
        let nonce: [u8; NONCE_LEN] = core::array::from_fn(|i| i as u8);
        let mut out = Vec::new();
        ring.seal_with_nonce(nonce, b"hello gossip", &mut out)
            .unwrap();
        assert_eq!(out, crate::golden::ENVELOPE);
    }

    #[test]
    fn envelope_sealed_by_python_cryptography_opens() {
        let ring = KeyRing::new("edge-1", &[K1]).unwrap();
        let mut d = crate::golden::ENVELOPE;
        assert_eq!(ring.open(&mut d).unwrap(), b"hello gossip");
    }

    #[test]
    fn debug_output_has_no_key_material() {
        let ring = KeyRing::new("c", &[K1]).unwrap();
        let text = format!("{ring:?}");
        assert!(text.contains("KeyId"), "{text}");
        assert!(!text.contains("17, 17"), "{text}");
    }
}
