//! Links and routes as facts, and which link announces a virtual IP: the interface named in
//! the configuration, else the interface holding a connected route to the IP's subnet.
//! Interfaces that are down, NOARP, bond ports, loopback or not Ethernet are never chosen.
//!
//! [`choose`] is a function over values returning either the link or a typed [`NoInterface`]
//! verdict. Same inputs, same answer (ties between equal routes are broken by metric, then
//! interface index); it never logs or awaits. The kernel's links and routes are read by
//! [`crate::net::netlink`].

use std::net::IpAddr;

/// The kernel's main routing table (`RT_TABLE_MAIN`).
pub const MAIN_TABLE: u32 = 254;

/// One network interface as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// Kernel interface index (`ifindex`).
    pub index: u32,
    /// Interface name (`IFLA_IFNAME`).
    pub name: String,
    /// Hardware address; all zeros when the link has no 6-byte address (see `ethernet`).
    pub mac: [u8; 6],
    /// Administratively up (`IFF_UP`).
    pub up: bool,
    /// The carrier is there (`IFF_LOWER_UP`): a cable, a switch port, a veth peer that is up.
    pub carrier: bool,
    /// `IFF_NOARP`: the link does not resolve neighbours, so announcing on it means nothing.
    pub noarp: bool,
    /// A port of a bond (`IFF_SLAVE`, port kind `bond`, or a master whose kind is `bond`):
    /// the bond itself announces, never its ports.
    pub slave: bool,
    /// `IFF_LOOPBACK`.
    pub loopback: bool,
    /// Ethernet link layer (`ARPHRD_ETHER`) with a 6-byte hardware address.
    pub ethernet: bool,
    /// Index of the master device (bond, bridge, VRF), if any.
    pub master: Option<u32>,
    /// `IFLA_INFO_KIND` (`"veth"`, `"bond"`, `"dummy"`, ...); `None` for plain hardware NICs.
    pub kind: Option<String>,
}

impl Link {
    /// An up, ARP-capable Ethernet link that is nobody's port (tests, benchmarks).
    pub fn ethernet(index: u32, name: &str, mac: [u8; 6]) -> Link {
        Link {
            index,
            name: name.to_string(),
            mac,
            up: true,
            carrier: true,
            noarp: false,
            slave: false,
            loopback: false,
            ethernet: true,
            master: None,
            kind: None,
        }
    }
}

/// One unicast route of the kernel's routing tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Destination network address.
    pub dst: IpAddr,
    /// Destination prefix length.
    pub prefix_len: u8,
    /// Outgoing interface index.
    pub ifindex: u32,
    /// Next hop; `None` for a connected (on-link) route.
    pub gateway: Option<IpAddr>,
    /// Routing table id ([`MAIN_TABLE`] for `main`).
    pub table: u32,
    /// Route metric (`RTA_PRIORITY`); lower is preferred.
    pub metric: u32,
}

impl Route {
    /// Whether `ip` lies inside this route's destination prefix (same address family only).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.dst, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let len = u32::from(self.prefix_len.min(32));
                let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let len = u32::from(self.prefix_len.min(128));
                let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// The addresses of `peers` a connected route of the main table puts on the link `ifindex`:
/// the ones the kernel resolves with ARP or NDP on that link.
pub fn on_link(peers: &[IpAddr], routes: &[Route], ifindex: u32) -> Vec<IpAddr> {
    peers
        .iter()
        .copied()
        .filter(|ip| {
            routes.iter().any(|r| {
                r.ifindex == ifindex
                    && r.gateway.is_none()
                    && r.table == MAIN_TABLE
                    && r.contains(*ip)
            })
        })
        .collect()
}

/// Why no interface can announce an IP. A typed verdict: log and count with [`Self::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum NoInterface {
    /// The configured interface does not exist.
    #[error("the configured interface does not exist")]
    NamedMissing,
    /// The configured interface is administratively down.
    #[error("the configured interface is down")]
    NamedDown,
    /// The configured interface has IFF_NOARP set.
    #[error("the configured interface is NOARP")]
    NamedNoArp,
    /// The configured interface is a bond port; name the bond instead.
    #[error("the configured interface is a bond port")]
    NamedSlave,
    /// The configured interface is the loopback interface.
    #[error("the configured interface is loopback")]
    NamedLoopback,
    /// The configured interface has no Ethernet address, so ARP/NDP cannot name it.
    #[error("the configured interface is not Ethernet")]
    NamedNotEthernet,
    /// No connected route in the main table covers the IP.
    #[error("no connected route in the main table covers the IP")]
    NoRoute,
    /// Connected routes cover the IP, but every one of them leads to an interface that is down,
    /// NOARP, a bond port, loopback, not Ethernet, or unknown.
    #[error("every connected route covering the IP leads to an unusable interface")]
    NoUsableRoute,
}

impl NoInterface {
    /// Stable label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NamedMissing => "named_missing",
            Self::NamedDown => "named_down",
            Self::NamedNoArp => "named_noarp",
            Self::NamedSlave => "named_slave",
            Self::NamedLoopback => "named_loopback",
            Self::NamedNotEthernet => "named_not_ethernet",
            Self::NoRoute => "no_route",
            Self::NoUsableRoute => "no_usable_route",
        }
    }
}

/// Why a single link cannot announce; `None` when it can.
fn unusable(link: &Link) -> Option<NoInterface> {
    if !link.up {
        Some(NoInterface::NamedDown)
    } else if link.noarp {
        Some(NoInterface::NamedNoArp)
    } else if link.slave {
        Some(NoInterface::NamedSlave)
    } else if link.loopback {
        Some(NoInterface::NamedLoopback)
    } else if !link.ethernet {
        Some(NoInterface::NamedNotEthernet)
    } else {
        None
    }
}

/// Chooses the interface that announces `ip`.
///
/// With `named`, that interface or a `Named*` verdict saying why it cannot announce (no
/// fallback: the operator asked for it). Without, the longest-prefix connected route
/// (no gateway, main table) covering `ip`; among equally long prefixes the lowest metric, then
/// the lowest interface index. A route leading to a link that is down, NOARP, a bond port,
/// loopback, not Ethernet or not in `links` is skipped and the next best route is tried.
/// A gateway-less default route (`default dev eth0`) counts as connected with prefix 0.
pub fn choose<'a>(
    ip: IpAddr,
    named: Option<&str>,
    links: &'a [Link],
    routes: &[Route],
) -> Result<&'a Link, NoInterface> {
    if let Some(name) = named {
        let link = links
            .iter()
            .find(|link| link.name == name)
            .ok_or(NoInterface::NamedMissing)?;
        return match unusable(link) {
            Some(verdict) => Err(verdict),
            None => Ok(link),
        };
    }
    let mut covering: Vec<&Route> = routes
        .iter()
        .filter(|r| r.table == MAIN_TABLE && r.gateway.is_none() && r.contains(ip))
        .collect();
    if covering.is_empty() {
        return Err(NoInterface::NoRoute);
    }
    covering.sort_by_key(|r| (std::cmp::Reverse(r.prefix_len), r.metric, r.ifindex));
    covering
        .iter()
        .filter_map(|r| links.iter().find(|link| link.index == r.ifindex))
        .find(|link| unusable(link).is_none())
        .ok_or(NoInterface::NoUsableRoute)
}

/// Marks as `slave` every link whose master is a bond (the kernel sets `IFF_SLAVE` on bond
/// ports too, this also covers dumps where only the master relation is visible).
pub fn mark_bond_ports(links: &mut [Link]) {
    let bonds: Vec<u32> = links
        .iter()
        .filter(|link| link.kind.as_deref() == Some("bond"))
        .map(|link| link.index)
        .collect();
    for link in links.iter_mut() {
        if link.master.is_some_and(|m| bonds.contains(&m)) {
            link.slave = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(index: u32, name: &str) -> Link {
        Link::ethernet(index, name, [2, 0, 0, 0, 0, index as u8])
    }

    fn connected(dst: &str, prefix_len: u8, ifindex: u32) -> Route {
        Route {
            dst: dst.parse().expect("test address"),
            prefix_len,
            ifindex,
            gateway: None,
            table: MAIN_TABLE,
            metric: 0,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    fn name_of(result: Result<&Link, NoInterface>) -> Result<&str, NoInterface> {
        result.map(|l| l.name.as_str())
    }

    type Spoil = fn(&mut Link);

    #[test]
    fn the_longest_connected_prefix_wins() {
        let links = [link(2, "eth0"), link(3, "eth1")];
        let routes = [
            connected("198.51.0.0", 16, 2),
            connected("198.51.100.0", 24, 3),
        ];
        assert_eq!(
            name_of(choose(ip("198.51.100.7"), None, &links, &routes)),
            Ok("eth1")
        );
        assert_eq!(
            name_of(choose(ip("198.51.7.7"), None, &links, &routes)),
            Ok("eth0")
        );
    }

    #[test]
    fn routes_with_a_gateway_or_in_another_table_are_not_connected_routes() {
        let links = [link(2, "eth0"), link(3, "eth1")];
        let mut via = connected("198.51.100.0", 24, 2);
        via.gateway = Some(ip("192.0.2.1"));
        let mut other_table = connected("198.51.100.0", 24, 3);
        other_table.table = 100;
        let routes = [via, other_table];
        assert_eq!(
            choose(ip("198.51.100.7"), None, &links, &routes),
            Err(NoInterface::NoRoute)
        );
    }

    #[test]
    fn the_peers_on_a_link_are_those_its_connected_routes_cover() {
        let mut via = connected("203.0.113.0", 24, 2);
        via.gateway = Some(ip("198.51.100.1"));
        let routes = [
            connected("198.51.100.0", 24, 2),
            connected("2001:db8:100::", 64, 2),
            connected("192.0.2.0", 24, 3),
            via,
        ];
        let peers = [
            ip("198.51.100.11"),
            ip("192.0.2.12"),
            ip("203.0.113.13"),
            ip("2001:db8:100::14"),
        ];
        assert_eq!(
            on_link(&peers, &routes, 2),
            vec![ip("198.51.100.11"), ip("2001:db8:100::14")]
        );
        assert_eq!(on_link(&peers, &routes, 3), vec![ip("192.0.2.12")]);
        assert!(on_link(&peers, &routes, 4).is_empty());
    }

    #[test]
    fn an_ip_outside_every_route_has_no_route() {
        let links = [link(2, "eth0")];
        let routes = [connected("198.51.100.0", 24, 2)];
        assert_eq!(
            choose(ip("203.0.113.1"), None, &links, &routes),
            Err(NoInterface::NoRoute)
        );
        assert_eq!(
            choose(ip("2001:db8::1"), None, &links, &routes),
            Err(NoInterface::NoRoute)
        );
    }

    #[test]
    fn ipv6_routes_match_ipv6_addresses_by_prefix() {
        let links = [link(2, "eth0"), link(3, "eth1")];
        let routes = [
            connected("2001:db8:100::", 64, 2),
            connected("2001:db8::", 32, 3),
        ];
        assert_eq!(
            name_of(choose(ip("2001:db8:100::9"), None, &links, &routes)),
            Ok("eth0")
        );
        assert_eq!(
            name_of(choose(ip("2001:db8:200::9"), None, &links, &routes)),
            Ok("eth1")
        );
        assert_eq!(
            choose(ip("198.51.100.1"), None, &links, &routes),
            Err(NoInterface::NoRoute)
        );
    }

    #[test]
    fn unusable_links_are_skipped_for_the_next_best_route() {
        let cases: [(&str, Spoil); 6] = [
            ("down", |l| l.up = false),
            ("noarp", |l| l.noarp = true),
            ("slave", |l| l.slave = true),
            ("loopback", |l| l.loopback = true),
            ("not ethernet", |l| l.ethernet = false),
            ("missing", |l| l.index = 99),
        ];
        for (what, spoil) in cases {
            let mut best = link(3, "eth1");
            spoil(&mut best);
            let links = [link(2, "eth0"), best];
            let routes = [
                connected("198.51.0.0", 16, 2),
                connected("198.51.100.0", 24, 3),
            ];
            assert_eq!(
                name_of(choose(ip("198.51.100.7"), None, &links, &routes)),
                Ok("eth0"),
                "{what}"
            );
            assert_eq!(
                choose(ip("198.51.100.7"), None, &links[1..], &routes),
                Err(NoInterface::NoUsableRoute),
                "{what}"
            );
        }
    }

    #[test]
    fn equal_prefixes_prefer_the_lower_metric_then_the_lower_index() {
        let links = [link(2, "eth0"), link(3, "eth1"), link(4, "eth2")];
        let mut high = connected("198.51.100.0", 24, 2);
        high.metric = 100;
        let routes = [
            high,
            connected("198.51.100.0", 24, 4),
            connected("198.51.100.0", 24, 3),
        ];
        assert_eq!(
            name_of(choose(ip("198.51.100.7"), None, &links, &routes)),
            Ok("eth1")
        );
    }

    #[test]
    fn a_named_interface_is_used_without_a_route_or_says_why_not() {
        let routes = [];
        let links = [link(2, "eth0")];
        assert_eq!(
            name_of(choose(ip("203.0.113.1"), Some("eth0"), &links, &routes)),
            Ok("eth0")
        );
        assert_eq!(
            choose(ip("203.0.113.1"), Some("eth9"), &links, &routes),
            Err(NoInterface::NamedMissing)
        );
        let cases: [(NoInterface, Spoil); 5] = [
            (NoInterface::NamedDown, |l| l.up = false),
            (NoInterface::NamedNoArp, |l| l.noarp = true),
            (NoInterface::NamedSlave, |l| l.slave = true),
            (NoInterface::NamedLoopback, |l| l.loopback = true),
            (NoInterface::NamedNotEthernet, |l| l.ethernet = false),
        ];
        for (verdict, spoil) in cases {
            let mut named = link(2, "eth0");
            spoil(&mut named);
            let routes = [connected("203.0.113.0", 24, 2)];
            assert_eq!(
                choose(ip("203.0.113.1"), Some("eth0"), &[named], &routes),
                Err(verdict)
            );
        }
    }

    #[test]
    fn a_gateway_less_default_route_covers_everything_but_loses_to_a_subnet() {
        let links = [link(2, "eth0"), link(3, "eth1")];
        let routes = [connected("0.0.0.0", 0, 2), connected("198.51.100.0", 24, 3)];
        assert_eq!(
            name_of(choose(ip("198.51.100.7"), None, &links, &routes)),
            Ok("eth1")
        );
        assert_eq!(
            name_of(choose(ip("203.0.113.7"), None, &links, &routes)),
            Ok("eth0")
        );
    }

    #[test]
    fn ports_of_a_bond_are_marked_as_slaves_but_bridge_ports_are_not() {
        let mut bond = link(5, "bond0");
        bond.kind = Some("bond".into());
        let mut bridge = link(6, "br0");
        bridge.kind = Some("bridge".into());
        let mut bond_port = link(2, "eth0");
        bond_port.master = Some(5);
        let mut bridge_port = link(3, "eth1");
        bridge_port.master = Some(6);
        let mut links = [bond, bridge, bond_port, bridge_port];
        mark_bond_ports(&mut links);
        assert!(links[2].slave);
        assert!(!links[3].slave);
        assert!(!links[0].slave);
    }

    #[test]
    fn verdict_labels_are_distinct() {
        let all = [
            NoInterface::NamedMissing,
            NoInterface::NamedDown,
            NoInterface::NamedNoArp,
            NoInterface::NamedSlave,
            NoInterface::NamedLoopback,
            NoInterface::NamedNotEthernet,
            NoInterface::NoRoute,
            NoInterface::NoUsableRoute,
        ];
        let labels: std::collections::BTreeSet<_> = all.iter().map(|v| v.as_str()).collect();
        assert_eq!(labels.len(), all.len());
    }

    #[test]
    fn prefix_containment_handles_zero_and_full_lengths() {
        assert!(connected("0.0.0.0", 0, 1).contains(ip("203.0.113.9")));
        assert!(connected("203.0.113.9", 32, 1).contains(ip("203.0.113.9")));
        assert!(!connected("203.0.113.9", 32, 1).contains(ip("203.0.113.8")));
        assert!(connected("::", 0, 1).contains(ip("2001:db8::1")));
        assert!(!connected("2001:db8::1", 128, 1).contains(ip("2001:db8::2")));
        // a prefix length past the family's width is clamped instead of overflowing
        assert!(connected("203.0.113.9", 200, 1).contains(ip("203.0.113.9")));
    }
}
