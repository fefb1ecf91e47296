//! How the speaker learns the links and routes, and that they changed (rtnetlink).
//!
//! [`snapshot`] dumps the links and the main-table routes of the current network namespace;
//! [`InterfaceWatch`] subscribes to the kernel's link and route multicast groups
//! (`RTNLGRP_LINK`, `RTNLGRP_IPV4_ROUTE`, `RTNLGRP_IPV6_ROUTE`) and resolves
//! [`InterfaceWatch::changed`] when any of them reports something, so the caller takes a new
//! snapshot and chooses again ([`crate::model::links::choose`]) without a restart. Changes are
//! pushed by the kernel, not polled. [`snapshot`] reads only, it never changes the system.

use std::net::IpAddr;

use futures::{StreamExt, TryStreamExt};
use rtnetlink::packet_route::{
    link::{
        InfoKind, InfoPortKind, LinkAttribute, LinkFlags, LinkInfo, LinkLayerType, LinkMessage,
    },
    route::{RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteType},
};
use rtnetlink::{MulticastGroup, RouteMessageBuilder};

use crate::model::links::{Link, MAIN_TABLE, Route, mark_bond_ports};

/// Errors of the interface I/O half.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The rtnetlink socket could not be opened or bound.
    #[error("cannot open an rtnetlink socket ({what}): {source}")]
    Socket {
        /// Which socket: "dump" or "watch".
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// A netlink dump failed.
    #[error("rtnetlink {what} dump failed: {source}")]
    Dump {
        /// What was dumped: "link", "ipv4 route", "ipv6 route".
        what: &'static str,
        /// The netlink error.
        source: Box<rtnetlink::Error>,
    },
    /// The watch's netlink connection ended; subscribe again.
    #[error("the rtnetlink change subscription closed")]
    WatchClosed,
}

/// Converts one link message into a [`Link`]; `slave` covers `IFF_SLAVE` and bond port kind
/// (call [`mark_bond_ports`] on the whole set to cover masters of kind bond).
pub fn link_from_message(msg: &LinkMessage) -> Link {
    let flags = msg.header.flags;
    let mut link = Link {
        index: msg.header.index,
        name: String::new(),
        mac: [0; 6],
        up: flags.contains(LinkFlags::Up),
        carrier: flags.contains(LinkFlags::LowerUp),
        noarp: flags.contains(LinkFlags::Noarp),
        slave: flags.contains(LinkFlags::Port),
        loopback: flags.contains(LinkFlags::Loopback),
        ethernet: false,
        master: None,
        kind: None,
    };
    let mut six_byte_address = false;
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::IfName(name) => link.name.clone_from(name),
            LinkAttribute::Address(bytes) => {
                if let Ok(mac) = <[u8; 6]>::try_from(bytes.as_slice()) {
                    link.mac = mac;
                    six_byte_address = true;
                }
            }
            LinkAttribute::Controller(master) => link.master = Some(*master),
            LinkAttribute::LinkInfo(infos) => {
                for info in infos {
                    match info {
                        LinkInfo::Kind(kind) => link.kind = Some(kind_name(kind)),
                        LinkInfo::PortKind(InfoPortKind::Bond) => link.slave = true,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    link.ethernet = six_byte_address && msg.header.link_layer_type == LinkLayerType::Ether;
    link
}

fn kind_name(kind: &InfoKind) -> String {
    kind.to_string()
}

/// Converts one route message into routes: one per next hop (multipath routes give several).
/// Non-unicast routes (local, broadcast, blackhole, unreachable, ...) give none.
pub fn routes_from_message(msg: &RouteMessage) -> Vec<Route> {
    if msg.header.kind != RouteType::Unicast {
        return Vec::new();
    }
    let mut dst = None;
    let mut ifindex = None;
    let mut gateway = None;
    let mut table = u32::from(msg.header.table);
    let mut metric = 0;
    let mut hops = Vec::new();
    for attr in &msg.attributes {
        match attr {
            RouteAttribute::Destination(addr) => dst = ip_of(addr),
            RouteAttribute::Oif(index) => ifindex = Some(*index),
            RouteAttribute::Gateway(addr) => gateway = ip_of(addr),
            RouteAttribute::Table(id) => table = *id,
            RouteAttribute::Priority(p) => metric = *p,
            RouteAttribute::MultiPath(next_hops) => {
                for hop in next_hops {
                    let hop_gateway = hop.attributes.iter().find_map(|a| match a {
                        RouteAttribute::Gateway(addr) => ip_of(addr),
                        _ => None,
                    });
                    hops.push((hop.interface_index, hop_gateway));
                }
            }
            _ => {}
        }
    }
    let dst = match dst {
        Some(dst) => dst,
        None => match msg.header.address_family {
            rtnetlink::packet_route::AddressFamily::Inet => IpAddr::from([0u8; 4]),
            rtnetlink::packet_route::AddressFamily::Inet6 => IpAddr::from([0u8; 16]),
            _ => return Vec::new(),
        },
    };
    if let Some(index) = ifindex {
        hops.push((index, gateway));
    }
    hops.into_iter()
        .map(|(ifindex, gateway)| Route {
            dst,
            prefix_len: msg.header.destination_prefix_length,
            ifindex,
            gateway,
            table,
            metric,
        })
        .collect()
}

fn ip_of(addr: &RouteAddress) -> Option<IpAddr> {
    match addr {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

/// Dumps the links and the main-table unicast routes (IPv4 and IPv6) of the calling thread's
/// network namespace. Opens and closes its own rtnetlink socket.
pub async fn snapshot() -> Result<(Vec<Link>, Vec<Route>), Error> {
    let (connection, handle, _) = rtnetlink::new_connection().map_err(|source| Error::Socket {
        what: "dump",
        source,
    })?;
    let task = tokio::spawn(connection);
    let result = async {
        let mut links: Vec<Link> = handle
            .link()
            .get()
            .execute()
            .map_ok(|msg| link_from_message(&msg))
            .try_collect()
            .await
            .map_err(|source| Error::Dump {
                what: "link",
                source: Box::new(source),
            })?;
        mark_bond_ports(&mut links);
        let mut routes = Vec::new();
        let requests = [
            (
                "ipv4 route",
                RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
            ),
            (
                "ipv6 route",
                RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
            ),
        ];
        for (what, request) in requests {
            let messages: Vec<RouteMessage> = handle
                .route()
                .get(request)
                .execute()
                .try_collect()
                .await
                .map_err(|source| Error::Dump {
                    what,
                    source: Box::new(source),
                })?;
            routes.extend(
                messages
                    .iter()
                    .filter(|m| m.header.table == RouteHeader::RT_TABLE_MAIN || m.header.table == 0)
                    .flat_map(routes_from_message)
                    .filter(|r| r.table == MAIN_TABLE),
            );
        }
        Ok((links, routes))
    }
    .await;
    task.abort();
    result
}

/// A subscription to link and route changes of the calling thread's network namespace.
///
/// Dropping it closes the socket.
#[derive(Debug)]
pub struct InterfaceWatch {
    messages: futures::channel::mpsc::UnboundedReceiver<(
        rtnetlink::packet_core::NetlinkMessage<rtnetlink::packet_route::RouteNetlinkMessage>,
        rtnetlink::sys::SocketAddr,
    )>,
    task: tokio::task::JoinHandle<()>,
}

impl InterfaceWatch {
    /// Subscribes to `RTNLGRP_LINK`, `RTNLGRP_IPV4_ROUTE` and `RTNLGRP_IPV6_ROUTE`. Subscribe
    /// before taking the snapshot, so no change between the two is missed.
    pub fn subscribe() -> Result<Self, Error> {
        let groups = [
            MulticastGroup::Link,
            MulticastGroup::Ipv4Route,
            MulticastGroup::Ipv6Route,
        ];
        let (connection, _handle, messages) = rtnetlink::new_multicast_connection(&groups)
            .map_err(|source| Error::Socket {
                what: "watch",
                source,
            })?;
        let task = tokio::spawn(connection);
        Ok(Self { messages, task })
    }

    /// Resolves when the kernel reported at least one link or route change (or a socket
    /// overrun, after which changes may have been lost) since the last call. Messages already
    /// queued are drained, so a burst of changes gives one signal. Cancel-safe.
    pub async fn changed(&mut self) -> Result<(), Error> {
        match self.messages.next().await {
            None => Err(Error::WatchClosed),
            Some(_) => {
                while self.messages.try_recv().is_ok() {}
                Ok(())
            }
        }
    }
}

impl Drop for InterfaceWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}
