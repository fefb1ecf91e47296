//! Member metadata on the wire: the versioned record each member gossips about itself, the book
//! of the newest record seen per node, and the foca broadcast handler that fills it.
//!
//! Records are ordered by `(bump, version)`: a record from a newer identity of the node (a
//! restart or a renewal) beats any record of an older one, and within one identity a higher
//! version wins. The order is total, so a stale record can never flip back and forth.
//! A record is at most [`MAX_META_RECORD_LEN`] bytes; larger or undecodable ones are rejected.
//!
//! **Extensions.** After the record's postcard encoding come its extensions, each a type byte,
//! a length byte and that many bytes of value. A speaker of the previous release decodes the
//! record with `postcard::from_bytes`, which stops at the record's end and ignores what follows,
//! and re-disseminates the bytes as they came (foca keeps each broadcast's bytes), so what a
//! newer speaker adds there never makes it refuse the record. Only a metadata pull answered by
//! such a speaker re-encodes the record from its book, without the extensions: a newer speaker
//! then holds the record without them (it takes the member for a previous-release speaker, the
//! safe side) until the record with them arrives, which replaces it ([`MetaBook::offer`]).
//! Extension types: [`EXT_ENVELOPE_VERSIONS`], [`EXT_VRRP_SOURCES`]. A newer extension type is
//! skipped; a truncated extension rejects the record.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use swimlb_proto::envelope::Versions;

use super::identity::NodeIdentity;
use crate::model::membership::{MemberMeta, NodeName};

/// The largest encoded metadata record, extensions included.
pub const MAX_META_RECORD_LEN: usize = 1024;

/// The extension that announces the envelope versions the member speaks
/// ([`MemberMeta::wire`]): one byte per version. Absent when the member announces nothing.
pub const EXT_ENVELOPE_VERSIONS: u8 = 1;

/// The extension that announces the addresses the member sends VRRP advertisements from
/// ([`MemberMeta::vrrp_sources`]): 16 bytes per address (an IPv4 one IPv4-mapped), at most 15
/// per extension, repeated when there are more; a trailing part shorter than 16 bytes is
/// ignored. Absent when the member has none, and left out when the record would not fit
/// otherwise: without it a fellow speaker's death waits for its Master_Down_Interval, the
/// previous release's behaviour.
pub const EXT_VRRP_SOURCES: u8 = 2;

/// The VRRP source addresses per [`EXT_VRRP_SOURCES`] extension.
const VRRP_SOURCES_PER_EXT: usize = 15;

/// What travels: the member's metadata and the bump of the identity that wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaRecord {
    /// The writer's identity bump (see [`NodeIdentity::bump`]).
    pub bump: u64,
    /// The metadata.
    pub meta: MemberMeta,
}

impl MetaRecord {
    /// The order key: newer identity first, then newer version.
    pub fn order(&self) -> (u64, u64) {
        (self.bump, self.meta.version)
    }

    /// Encodes the record and its extensions; fails when it exceeds [`MAX_META_RECORD_LEN`].
    pub fn encode(&self) -> Result<Vec<u8>, MetaError> {
        let mut bytes = postcard::to_allocvec(self).map_err(|_| MetaError::Encode)?;
        let versions = self.meta.wire;
        if !versions.is_empty() {
            let listed: Vec<u8> = versions.iter().collect();
            bytes.push(EXT_ENVELOPE_VERSIONS);
            bytes.push(u8::try_from(listed.len()).map_err(|_| MetaError::Encode)?);
            bytes.extend_from_slice(&listed);
        }
        let sources: Vec<[u8; 16]> = self
            .meta
            .vrrp_sources
            .iter()
            .map(|ip| match ip {
                std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
                std::net::IpAddr::V6(v6) => v6.octets(),
            })
            .collect();
        let extra = sources.len() * 16 + sources.len().div_ceil(VRRP_SOURCES_PER_EXT) * 2;
        if bytes.len() + extra <= MAX_META_RECORD_LEN {
            for chunk in sources.chunks(VRRP_SOURCES_PER_EXT) {
                bytes.push(EXT_VRRP_SOURCES);
                bytes.push(u8::try_from(chunk.len() * 16).map_err(|_| MetaError::Encode)?);
                bytes.extend(chunk.iter().flatten());
            }
        }
        if bytes.len() > MAX_META_RECORD_LEN {
            return Err(MetaError::TooLarge {
                node: self.meta.node.clone(),
                len: bytes.len(),
            });
        }
        Ok(bytes)
    }

    /// Decodes a record received from a peer.
    pub fn decode(bytes: &[u8]) -> Result<MetaRecord, MetaError> {
        if bytes.len() > MAX_META_RECORD_LEN {
            return Err(MetaError::TooLarge {
                node: String::new(),
                len: bytes.len(),
            });
        }
        let (mut record, mut rest): (MetaRecord, &[u8]) =
            postcard::take_from_bytes(bytes).map_err(|_| MetaError::Decode)?;
        record.meta.wire = Versions::NONE;
        record.meta.vrrp_sources.clear();
        while let [kind, len, tail @ ..] = rest {
            let len = usize::from(*len);
            if tail.len() < len {
                return Err(MetaError::Decode);
            }
            let (value, next) = tail.split_at(len);
            if *kind == EXT_ENVELOPE_VERSIONS {
                record.meta.wire = value.iter().copied().collect();
            } else if *kind == EXT_VRRP_SOURCES {
                let addrs = value.chunks_exact(16).filter_map(|a| {
                    let octets: [u8; 16] = a.try_into().ok()?;
                    Some(std::net::Ipv6Addr::from(octets).to_canonical())
                });
                record.meta.vrrp_sources.extend(addrs);
            }
            rest = next;
        }
        if !rest.is_empty() {
            return Err(MetaError::Decode);
        }
        Ok(record)
    }

    /// Whether this record was written by `identity` (same node, same bump).
    pub fn written_by(&self, identity: &NodeIdentity) -> bool {
        self.bump == identity.bump && self.meta.node == identity.node
    }
}

/// Why a metadata record was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    /// The record could not be encoded.
    #[error("metadata record could not be encoded")]
    Encode,
    /// The record is not a valid encoding.
    #[error("metadata record could not be decoded")]
    Decode,
    /// The record is larger than the bound.
    #[error("metadata record of node {node:?} is {len} bytes, more than {MAX_META_RECORD_LEN}")]
    TooLarge {
        /// The node whose record it is (empty when it could not be decoded).
        node: NodeName,
        /// Its encoded length.
        len: usize,
    },
}

/// The gossip core's hash map: foldhash instead of SipHash. Its keys are node names and
/// addresses of authenticated peers, looked up several times per datagram; the hasher is still
/// seeded per process.
pub type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The newest record seen per node, and the nodes whose record changed since the last drain.
#[derive(Debug, Default)]
pub struct MetaBook {
    /// Looked up for every record a datagram carries: hashed, not ordered (nothing iterates it).
    latest: FastMap<NodeName, MetaRecord>,
    changed: Vec<NodeName>,
}

impl MetaBook {
    /// Keeps `record` if it is newer than the one held, or as new and the first to carry the
    /// member's envelope versions or VRRP sources (the held one came through a
    /// previous-release speaker's pull answer, which drops the extensions); returns whether it
    /// was kept.
    pub fn offer(&mut self, record: MetaRecord) -> bool {
        // What `b` carries that `a` lacks.
        let lacks = |a: &MetaRecord, b: &MetaRecord| {
            (a.meta.wire.is_empty() && !b.meta.wire.is_empty())
                || (a.meta.vrrp_sources.is_empty() && !b.meta.vrrp_sources.is_empty())
        };
        let completes = |held: &MetaRecord| {
            held.order() == record.order() && lacks(held, &record) && !lacks(&record, held)
        };
        match self.latest.get(&record.meta.node) {
            Some(held) if held.order() >= record.order() && !completes(held) => false,
            _ => {
                self.changed.push(record.meta.node.clone());
                self.latest.insert(record.meta.node.clone(), record);
                true
            }
        }
    }

    /// The newest record of `node`.
    pub fn get(&self, node: &str) -> Option<&MetaRecord> {
        self.latest.get(node)
    }

    /// Takes the nodes whose record changed.
    pub fn take_changed(&mut self) -> Vec<NodeName> {
        std::mem::take(&mut self.changed)
    }
}

/// A [`MetaBook`] shared between the core and the broadcast handler foca owns.
#[derive(Debug, Clone, Default)]
pub struct SharedBook(Arc<Mutex<MetaBook>>);

impl SharedBook {
    /// Locks the book (a poisoned lock still holds consistent data: every update is one insert).
    pub fn lock(&self) -> MutexGuard<'_, MetaBook> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The key foca uses to replace a record still being disseminated by a newer one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaKey {
    node: NodeName,
    order: (u64, u64),
}

impl foca::Invalidates for MetaKey {
    fn invalidates(&self, other: &Self) -> bool {
        self.node == other.node && self.order >= other.order
    }
}

/// foca's custom broadcast handler: decodes records, keeps and re-disseminates the newer ones.
#[derive(Debug, Clone)]
pub struct MetaBroadcasts {
    book: SharedBook,
}

impl MetaBroadcasts {
    /// A handler writing into `book`.
    pub fn new(book: SharedBook) -> MetaBroadcasts {
        MetaBroadcasts { book }
    }
}

impl foca::BroadcastHandler<NodeIdentity> for MetaBroadcasts {
    type Key = MetaKey;
    type Error = MetaError;

    fn receive_item(
        &mut self,
        data: &[u8],
        sender: Option<&NodeIdentity>,
    ) -> Result<Option<MetaKey>, MetaError> {
        let record = MetaRecord::decode(data)?;
        let key = MetaKey {
            node: record.meta.node.clone(),
            order: record.order(),
        };
        // Our own record (no sender) is always (re)disseminated: it is how late joiners and
        // lost broadcasts are caught up.
        let kept = self.book.lock().offer(record);
        Ok((kept || sender.is_none()).then_some(key))
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv6Addr};

    use super::*;

    fn record(node: &str, bump: u64, version: u64) -> MetaRecord {
        let mut meta = MemberMeta::new(node);
        meta.version = version;
        MetaRecord { bump, meta }
    }

    #[test]
    fn newer_identity_beats_higher_version_of_older_identity() {
        let mut book = MetaBook::default();
        assert!(book.offer(record("a", 1, 9)));
        assert!(book.offer(record("a", 2, 1)));
        assert!(!book.offer(record("a", 1, 10)));
        assert_eq!(book.get("a").unwrap().order(), (2, 1));
        assert_eq!(book.take_changed(), vec!["a".to_string(), "a".to_string()]);
    }

    #[test]
    fn record_round_trips_and_oversized_record_is_rejected() {
        let rec = record("node-1", 7, 3);
        assert_eq!(MetaRecord::decode(&rec.encode().unwrap()), Ok(rec));
        let mut big = record("b", 1, 1);
        big.meta.node = "x".repeat(MAX_META_RECORD_LEN);
        assert!(matches!(big.encode(), Err(MetaError::TooLarge { .. })));
        assert_eq!(MetaRecord::decode(&[0xff; 3]), Err(MetaError::Decode));
    }

    #[test]
    fn the_envelope_versions_travel_after_the_record_where_the_previous_release_ignores_them() {
        let mut rec = record("node-1", 7, 3);
        let plain = rec.encode().unwrap();
        rec.meta.wire = Versions::THIS_BUILD;
        let announced = rec.encode().unwrap();
        assert_eq!(
            announced[..plain.len()],
            plain[..],
            "the record itself is unchanged"
        );
        assert_eq!(announced[plain.len()..], [EXT_ENVELOPE_VERSIONS, 2, 2, 3]);
        assert_eq!(MetaRecord::decode(&announced), Ok(rec.clone()));
        // The previous release decodes with `postcard::from_bytes` (its `MetaRecord::decode`):
        // the same record, the extension unseen.
        let old: MetaRecord = postcard::from_bytes(&announced).unwrap();
        assert_eq!(old, record("node-1", 7, 3));
        // Its record, without extensions: announces nothing.
        assert_eq!(
            MetaRecord::decode(&plain).unwrap().meta.wire,
            Versions::NONE
        );
        // A later extension type is skipped; a cut one rejects the record.
        let mut later = announced.clone();
        later.extend_from_slice(&[9, 2, 0xaa, 0xbb]);
        assert_eq!(MetaRecord::decode(&later), Ok(rec));
        for cut in [1, 2, 3] {
            let short = &announced[..announced.len() - cut];
            assert_eq!(MetaRecord::decode(short), Err(MetaError::Decode), "{cut}");
        }
    }

    #[test]
    fn a_record_as_new_completes_one_that_lost_its_versions_and_never_the_reverse() {
        let mut book = MetaBook::default();
        let stripped = record("a", 2, 5);
        let mut full = stripped.clone();
        full.meta.wire = Versions::THIS_BUILD;
        assert!(book.offer(stripped.clone()));
        assert!(book.offer(full.clone()), "the versions complete it");
        assert!(!book.offer(stripped), "and are not lost again");
        assert!(!book.offer(full));
        assert_eq!(book.get("a").unwrap().meta.wire, Versions::THIS_BUILD);
    }

    #[test]
    fn the_vrrp_sources_travel_as_an_extension_and_complete_a_stripped_record() {
        let mut rec = record("node-1", 7, 3);
        rec.meta.wire = Versions::THIS_BUILD;
        let plain = rec.encode().unwrap();
        rec.meta.vrrp_sources =
            ["fe80::1".parse().unwrap(), "198.51.100.11".parse().unwrap()].into();
        let announced = rec.encode().unwrap();
        assert_eq!(announced[..plain.len()], plain[..]);
        assert_eq!(announced[plain.len()..][..2], [EXT_VRRP_SOURCES, 32]);
        assert_eq!(announced.len(), plain.len() + 2 + 32);
        assert_eq!(MetaRecord::decode(&announced), Ok(rec.clone()));
        // The previous release: the record, the extension unseen.
        let old: MetaRecord = postcard::from_bytes(&announced).unwrap();
        assert_eq!(old, record("node-1", 7, 3));
        // Many sources: several extensions of 15, read back as one set.
        let link_local = |i: u16| IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, i));
        let mut many = record("node-2", 1, 1);
        many.meta.vrrp_sources = (1..=40).map(link_local).collect();
        let bytes = many.encode().unwrap();
        assert_eq!(MetaRecord::decode(&bytes), Ok(many.clone()));
        // Too many for the bound: left out, the record still goes.
        many.meta.vrrp_sources = (1..=200).map(link_local).collect();
        let bytes = many.encode().unwrap();
        assert!(
            MetaRecord::decode(&bytes)
                .unwrap()
                .meta
                .vrrp_sources
                .is_empty()
        );
        // A part shorter than an address is ignored; a cut extension rejects the record.
        let mut odd = plain.clone();
        odd.extend_from_slice(&[EXT_VRRP_SOURCES, 3, 1, 2, 3]);
        assert!(
            MetaRecord::decode(&odd)
                .unwrap()
                .meta
                .vrrp_sources
                .is_empty()
        );
        assert_eq!(
            MetaRecord::decode(&announced[..announced.len() - 1]),
            Err(MetaError::Decode)
        );
        // A record stripped of its extensions (a previous-release pull answer) is completed by
        // the full one, never the reverse.
        let mut book = MetaBook::default();
        assert!(book.offer(record("node-1", 7, 3)));
        assert!(book.offer(rec.clone()));
        assert!(!book.offer(record("node-1", 7, 3)));
        assert_eq!(book.get("node-1"), Some(&rec));
    }
}
