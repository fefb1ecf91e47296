//! Membership anti-entropy: a digest of the members a node holds alive, compared with a peer's,
//! so that members the gossip never brought are found.
//!
//! SWIM spreads each update a bounded number of times. When many members join at once (a
//! thousand speakers started together), some updates run out of transmissions before they reach
//! everyone: measured with `swimlb-lab sim --nodes 1000`, 10 to 13 members still missed one
//! member 30 s after the start, and nothing but that member's own probe cycle (up to
//! `n x probe period`, 80 s) would have told them. A member missing from one speaker's view makes
//! that speaker elect differently from the others, so its addresses can have two owners.
//! memberlist closes the same gap with a periodic full-state push-pull; this is its compact form.
//!
//! Every `sync_period` a node sends one random alive member its digest: the members it holds
//! alive (itself included) hashed into `2^bits` buckets, each bucket the XOR of its members'
//! hashes. The receiver computes the same digest of its own view; for every bucket that differs
//! it sends back the members it holds in that bucket as ordinary foca updates, and, when asked,
//! its own digest, so the first node can do the same for it. Equal views cost one datagram of
//! `2 + 8 x 2^bits` bytes per period. A member known to one side only under an older identity is
//! settled by foca's identity rules (the higher bump wins); a member one side holds down stays
//! down there, and that side answers with the down too (see `Core::answer_digest`), so that the
//! member hears of it through the other side and renews.
//!
//! The wire form is [`swimlb_proto::gossip::Digest`], in a `Sync` payload; this module owns the
//! hashing and the comparison.

use swimlb_proto::gossip::{self, MAX_BUCKETS};

use super::identity::NodeIdentity;

/// The most buckets a digest has (2^6 = 64, 512 bytes).
pub const MAX_BITS: u8 = gossip::MAX_DIGEST_BITS;

/// Members per bucket a digest aims for: a differing bucket costs about this many updates.
const MEMBERS_PER_BUCKET: usize = 16;

/// A digest of a membership view: its wire form, with the comparisons the sync needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Digest(gossip::Digest);

impl From<gossip::Digest> for Digest {
    fn from(wire: gossip::Digest) -> Digest {
        Digest(wire)
    }
}

impl Digest {
    /// The bucket count for a view of `members` members (itself included).
    pub fn bits_for(members: usize) -> u8 {
        let wanted = members.div_ceil(MEMBERS_PER_BUCKET).max(1);
        let bits = wanted.next_power_of_two().trailing_zeros();
        u8::try_from(bits).unwrap_or(MAX_BITS).min(MAX_BITS)
    }

    /// The digest of `members` with `2^bits` buckets (`bits` at most [`MAX_BITS`]).
    pub fn of<'a>(bits: u8, members: impl IntoIterator<Item = &'a NodeIdentity>) -> Digest {
        let bits = bits.min(MAX_BITS);
        let mut buckets = [0u64; MAX_BUCKETS];
        for id in members {
            let hash = hash(id);
            buckets[bucket(hash, bits)] ^= hash;
        }
        Digest::first(bits, &buckets)
    }

    /// The digest of the first `2^bits` of `buckets` (`bits` clamped to [`MAX_BITS`]).
    fn first(bits: u8, buckets: &[u64; MAX_BUCKETS]) -> Digest {
        let bits = bits.min(MAX_BITS);
        let wire = gossip::Digest::new(bits, &buckets[..1 << bits]);
        Digest(wire.expect("at most MAX_BITS bits and exactly 2^bits buckets"))
    }

    /// The bucket count exponent.
    pub fn bits(&self) -> u8 {
        self.0.bits()
    }

    /// The wire form.
    pub fn wire(&self) -> gossip::Digest {
        self.0
    }

    /// The buckets where `self` and `other` differ, as a bit mask (bit `i`: bucket `i`); all
    /// buckets when the two do not have the same bucket count.
    pub fn differing(&self, other: &Digest) -> u64 {
        if self.bits() != other.bits() {
            return all_buckets(self.bits());
        }
        self.0
            .buckets()
            .iter()
            .zip(other.0.buckets())
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .fold(0, |mask, (i, _)| mask | 1 << i)
    }

    /// Whether `id` falls into one of the buckets of `mask`.
    pub fn in_mask(&self, mask: u64, id: &NodeIdentity) -> bool {
        mask & 1 << bucket(hash(id), self.bits()) != 0
    }
}

/// The digest of a changing view, kept up to date member by member so that sending and
/// answering a digest costs no pass over the membership (at 1,000 members, hashing every member
/// for every digest was a tenth of the simulation's time).
#[derive(Debug, Clone)]
pub struct RunningDigest {
    /// At the finest resolution, [`MAX_BITS`]; coarser digests fold these.
    buckets: [u64; MAX_BUCKETS],
}

impl Default for RunningDigest {
    fn default() -> RunningDigest {
        RunningDigest {
            buckets: [0; MAX_BUCKETS],
        }
    }
}

impl RunningDigest {
    /// Adds `id` to the view, or removes it if it is there (both are one XOR).
    pub fn toggle(&mut self, id: &NodeIdentity) {
        let hash = hash(id);
        self.buckets[bucket(hash, MAX_BITS)] ^= hash;
    }

    /// The view's digest with `2^bits` buckets, `extra` (this node) included.
    pub fn digest(&self, bits: u8, extra: &NodeIdentity) -> Digest {
        let bits = bits.min(MAX_BITS);
        let mut buckets = [0u64; MAX_BUCKETS];
        let shift = MAX_BITS - bits;
        for (i, value) in self.buckets.iter().enumerate() {
            buckets[i >> shift] ^= value;
        }
        let hash = hash(extra);
        buckets[bucket(hash, bits)] ^= hash;
        Digest::first(bits, &buckets)
    }
}

fn all_buckets(bits: u8) -> u64 {
    if bits >= MAX_BITS {
        u64::MAX
    } else {
        (1u64 << (1u32 << bits)) - 1
    }
}

fn bucket(hash: u64, bits: u8) -> usize {
    if bits == 0 {
        0
    } else {
        (hash >> (64 - u32::from(bits))) as usize
    }
}

/// FNV-1a over the identity's name, address and bump, then a final mix so the top bits (the
/// bucket) depend on every byte. Stable across builds and platforms: peers must agree on it.
fn hash(id: &NodeIdentity) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(PRIME);
        }
    };
    eat(&(id.node.len() as u64).to_le_bytes());
    eat(id.node.as_bytes());
    match id.addr.ip() {
        std::net::IpAddr::V4(ip) => eat(&ip.octets()),
        std::net::IpAddr::V6(ip) => eat(&ip.octets()),
    }
    eat(&id.addr.port().to_le_bytes());
    eat(&id.bump.to_le_bytes());
    // splitmix64's finaliser.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(i: u16, bump: u64) -> NodeIdentity {
        NodeIdentity {
            node: format!("node-{i}").into(),
            addr: format!("192.0.2.1:{}", 7000 + i).parse().unwrap(),
            bump,
        }
    }

    #[test]
    fn equal_views_have_equal_digests_whatever_the_order() {
        let view: Vec<_> = (0..100).map(|i| id(i, 1)).collect();
        let bits = Digest::bits_for(view.len());
        let forward = Digest::of(bits, &view);
        let backward = Digest::of(bits, view.iter().rev());
        assert_eq!(forward, backward);
        assert_eq!(forward.differing(&backward), 0);
    }

    #[test]
    fn a_missing_member_or_an_older_identity_shows_in_exactly_its_buckets() {
        let full: Vec<_> = (0..300).map(|i| id(i, 1)).collect();
        let bits = Digest::bits_for(full.len());
        assert_eq!(bits, 5);
        let digest = Digest::of(bits, &full);
        let missing = Digest::of(bits, full.iter().filter(|m| m.node != "node-17"));
        let mask = digest.differing(&missing);
        assert_eq!(mask.count_ones(), 1);
        assert!(digest.in_mask(mask, &id(17, 1)));
        let members_in_mask = full.iter().filter(|m| digest.in_mask(mask, m)).count();
        assert!(
            members_in_mask < 40,
            "{members_in_mask} members in one bucket"
        );

        let mut renewed = full.clone();
        renewed[42].bump = 2;
        // The old identity's bucket and the new one's (one bucket if they share it).
        let mask = digest.differing(&Digest::of(bits, &renewed));
        assert!(digest.in_mask(mask, &id(42, 1)));
        assert!(digest.in_mask(mask, &id(42, 2)));
        let both = 1u64 << bucket(hash(&id(42, 1)), bits) | 1 << bucket(hash(&id(42, 2)), bits);
        assert_eq!(mask, both);
    }

    #[test]
    fn a_running_digest_equals_the_digest_of_its_view_at_every_resolution() {
        let me = id(999, 1);
        let mut running = RunningDigest::default();
        let mut view: Vec<_> = (0..200).map(|i| id(i, 1)).collect();
        for member in &view {
            running.toggle(member);
        }
        // A renewal: the old identity leaves, the new one comes; a member goes down.
        running.toggle(&view[7]);
        view[7].bump = 2;
        running.toggle(&view[7]);
        running.toggle(&view[100]);
        view.remove(100);
        for bits in 0..=MAX_BITS {
            let expected = Digest::of(bits, view.iter().chain([&me]));
            assert_eq!(running.digest(bits, &me), expected, "bits {bits}");
        }
    }

    #[test]
    fn bucket_counts_grow_with_the_view_and_stop_at_64() {
        assert_eq!(Digest::bits_for(1), 0);
        assert_eq!(Digest::bits_for(3), 0);
        assert_eq!(Digest::bits_for(17), 1);
        assert_eq!(Digest::bits_for(100), 3);
        assert_eq!(Digest::bits_for(1000), 6);
        assert_eq!(Digest::bits_for(100_000), 6);
        let a = Digest::of(0, [&id(1, 1)]);
        let b = Digest::of(6, [&id(1, 1)]);
        assert_eq!(a.differing(&b), 1);
        assert_eq!(b.differing(&a), u64::MAX);
    }

    #[test]
    fn a_digest_travels_as_its_wire_form() {
        let digest = Digest::of(3, &[id(1, 1), id(2, 1)]);
        let message = gossip::GossipMessage::Sync {
            echo: true,
            digest: digest.wire(),
        };
        let mut payload = Vec::new();
        message.emit_vec(&mut payload);
        assert_eq!(payload.len(), 1 + 2 + 8 * 8);
        let Ok(gossip::GossipMessage::Sync { echo, digest: read }) =
            gossip::GossipMessage::parse(&payload)
        else {
            panic!("a digest payload parses as a digest");
        };
        assert!(echo);
        assert_eq!(Digest::from(read), digest);
        assert_eq!(Digest::from(read).differing(&digest), 0);
    }
}
