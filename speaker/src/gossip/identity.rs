//! The identity a speaker gossips under: node name, gossip address and a bump counter.
//!
//! Guarantees: two identities with the same address are ordered by `bump`, the higher one wins
//! (foca keeps it and renames the member), and [`NodeIdentity::renew`] always yields a winner, so a
//! node that learns it was declared down rejoins by itself under a fresh identity.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use smol_str::SmolStr;

/// Who a member is in the gossip mesh. Members are tracked by [`NodeIdentity::addr`].
///
/// foca compares and copies identities for every update it applies and every message it
/// decodes, so at 1,000 members their cost shows: the name is a [`SmolStr`] (names up to 23 bytes
/// live inline, so comparing or decoding one touches no heap), and equality compares the address
/// and the bump first, which tell almost every pair apart (the result is the same as comparing
/// field by field). On the wire the name is an ordinary string.
#[derive(Debug, Clone, Eq, Serialize, Deserialize)]
pub struct NodeIdentity {
    /// The node name the member's metadata is keyed by.
    pub node: SmolStr,
    /// The UDP address the member gossips from and listens on.
    pub addr: SocketAddr,
    /// Starts at a value the caller picks (a start-up epoch, for example milliseconds since the
    /// Unix epoch, so a restarted speaker beats its previous life) and grows by one per renewal.
    pub bump: u64,
}

impl PartialEq for NodeIdentity {
    fn eq(&self, other: &Self) -> bool {
        self.addr == other.addr && self.bump == other.bump && self.node == other.node
    }
}

impl std::hash::Hash for NodeIdentity {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.addr.hash(state);
        self.bump.hash(state);
        self.node.hash(state);
    }
}

impl NodeIdentity {
    /// An identity that only names an address, used to announce to a seed whose name and bump
    /// are not known yet (foca accepts an announce addressed to any identity with its address).
    pub fn seed(addr: SocketAddr) -> NodeIdentity {
        NodeIdentity {
            node: SmolStr::default(),
            addr,
            bump: 0,
        }
    }
}

/// A gossip address as foca compares it. foca finds a member by scanning every member and
/// comparing addresses, on every update it applies, so at 1,000 members this comparison is the
/// hottest code of the gossip core; two integers compare in a few instructions where
/// `SocketAddr` compares field by field (and calls `memcmp`). IPv4 and IPv6 addresses never
/// collide (the family is part of the key); an IPv6 flow label is not (it names no endpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddrKey {
    ip: u128,
    /// Port (bits 0-15), IPv6 (bit 16), IPv6 scope id (bits 32-63).
    rest: u64,
}

impl From<SocketAddr> for AddrKey {
    fn from(addr: SocketAddr) -> AddrKey {
        match addr {
            SocketAddr::V4(a) => AddrKey {
                ip: u128::from(u32::from(*a.ip())),
                rest: u64::from(a.port()),
            },
            SocketAddr::V6(a) => AddrKey {
                ip: u128::from(*a.ip()),
                rest: u64::from(a.port()) | 1 << 16 | u64::from(a.scope_id()) << 32,
            },
        }
    }
}

impl foca::Identity for NodeIdentity {
    type Addr = AddrKey;

    fn renew(&self) -> Option<Self> {
        Some(NodeIdentity {
            node: self.node.clone(),
            addr: self.addr,
            bump: self.bump.wrapping_add(1),
        })
    }

    fn addr(&self) -> AddrKey {
        AddrKey::from(self.addr)
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.bump > adversary.bump
    }
}

#[cfg(test)]
mod tests {
    use foca::Identity;

    use super::*;

    #[test]
    fn renewed_identity_wins_over_the_old_one_at_the_same_address() {
        let old = NodeIdentity {
            node: "a".into(),
            addr: "127.0.0.1:7946".parse().unwrap(),
            bump: 41,
        };
        let new = old.renew().unwrap();
        assert_eq!(new.bump, 42);
        assert!(new.win_addr_conflict(&old));
        assert!(!old.win_addr_conflict(&new));
        assert_eq!(new.addr(), old.addr());
    }

    #[test]
    fn address_keys_are_equal_exactly_when_the_endpoints_are() {
        let key = |s: &str| AddrKey::from(s.parse::<SocketAddr>().unwrap());
        assert_eq!(key("192.0.2.1:7946"), key("192.0.2.1:7946"));
        assert_ne!(key("192.0.2.1:7946"), key("192.0.2.1:7947"));
        assert_ne!(key("192.0.2.1:7946"), key("192.0.2.2:7946"));
        // The same 32 bits as an IPv4 address and inside an IPv6 one are different endpoints.
        assert_ne!(key("192.0.2.1:7946"), key("[::c000:201]:7946"));
        assert_ne!(key("[2001:db8::1]:7946"), key("[2001:db8::1%2]:7946"));
        assert_eq!(key("[2001:db8::1]:7946"), key("[2001:db8::1]:7946"));
    }
}
