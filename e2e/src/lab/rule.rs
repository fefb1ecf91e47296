//! MetalLB's layer-2 election rule, which swimlb's speakers follow too: the node the lab expects
//! to own an IP, computed apart from the speakers' own election code.

use std::net::IpAddr;

use sha2::{Digest, Sha256};

/// MetalLB's layer-2 order of `nodes` for `ip`: `sha256(node + "#" + ip)` ascending, bytewise.
/// With equal priorities and every node an eligible, settled candidate, the first one owns the
/// IP. Written here from MetalLB's rule, apart from the speaker's election code, so the lab checks
/// the product instead of agreeing with it.
pub fn metallb_order<'a>(nodes: &[&'a str], ip: IpAddr) -> Vec<&'a str> {
    let mut keyed: Vec<([u8; 32], &str)> = nodes
        .iter()
        .map(|node| {
            let digest = Sha256::digest(format!("{node}#{ip}").as_bytes());
            (digest.into(), *node)
        })
        .collect();
    keyed.sort();
    keyed.into_iter().map(|(_, node)| node).collect()
}

/// The owner MetalLB's order names for `ip` among `nodes` (every one a live, settled candidate
/// of equal priority).
pub fn metallb_owner(nodes: &[&str], ip: IpAddr) -> Option<String> {
    metallb_order(nodes, ip).first().map(|n| n.to_string())
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn metallbs_order_matches_its_own_golden_vectors() {
        // MetalLB's TestSortL2Candidates.
        let nodes = ["node-a", "node-b", "node-c"];
        let ip = |last| IpAddr::V4(Ipv4Addr::new(10, 0, 0, last));
        assert_eq!(metallb_order(&nodes, ip(1)), ["node-b", "node-a", "node-c"]);
        assert_eq!(metallb_order(&nodes, ip(2)), ["node-b", "node-c", "node-a"]);
    }

    #[test]
    fn the_labs_first_vip_belongs_to_node3_then_node2_then_node1() {
        let vip = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 100));
        assert_eq!(
            metallb_order(&["node1", "node2", "node3"], vip),
            ["node3", "node2", "node1"]
        );
        assert_eq!(
            metallb_owner(&["node1", "node2"], vip).as_deref(),
            Some("node2")
        );
    }
}
