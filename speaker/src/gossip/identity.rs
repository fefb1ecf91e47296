//! The identity a speaker gossips under: node name, gossip address and a bump counter.
//!
//! Guarantees: two identities with the same address are ordered by `bump`, the higher one wins
//! (foca keeps it and renames the member), and [`NodeIdentity::renew`] always yields a winner, so a
//! node that learns it was declared down rejoins by itself under a fresh identity.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::membership::NodeName;

/// Who a member is in the gossip mesh. Members are tracked by [`NodeIdentity::addr`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeIdentity {
    /// The node name the member's metadata is keyed by.
    pub node: NodeName,
    /// The UDP address the member gossips from and listens on.
    pub addr: SocketAddr,
    /// Starts at a value the caller picks (a start-up epoch, for example milliseconds since the
    /// Unix epoch, so a restarted speaker beats its previous life) and grows by one per renewal.
    pub bump: u64,
}

impl NodeIdentity {
    /// An identity that only names an address, used to announce to a seed whose name and bump
    /// are not known yet (foca accepts an announce addressed to any identity with its address).
    pub fn seed(addr: SocketAddr) -> NodeIdentity {
        NodeIdentity {
            node: String::new(),
            addr,
            bump: 0,
        }
    }
}

impl foca::Identity for NodeIdentity {
    type Addr = SocketAddr;

    fn renew(&self) -> Option<Self> {
        Some(NodeIdentity {
            node: self.node.clone(),
            addr: self.addr,
            bump: self.bump.wrapping_add(1),
        })
    }

    fn addr(&self) -> SocketAddr {
        self.addr
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
}
