//! The speakers' ports and their HTTP endpoints (`/status`, `/metrics`) read from the client.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::netns::Lab;
use crate::probe;

/// The gossip port of the lab's speakers.
pub const GOSSIP_PORT: u16 = 7946;
/// The HTTP port of the lab's speakers.
pub const HTTP_PORT: u16 = 7572;

/// Every node's speaker HTTP address (`/status`, `/metrics`), in node order.
pub fn http_addrs(lab: &Lab) -> Vec<SocketAddr> {
    lab.nodes
        .iter()
        .map(|n| SocketAddr::from((n.v4, HTTP_PORT)))
        .collect()
}

/// `GET path` on `addr` from the current thread's namespace, with a short timeout.
pub fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: lab\r\nconnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (_, body) = text.split_once("\r\n\r\n")?;
    Some(body.to_string())
}

/// `GET path` on each of `addrs` from the client, in order, each answer read by `read`; `None`:
/// no answer `read` accepted in `tries` tries (with `--loss` a lost SYN fails one attempt).
pub fn read_each<T: Send + 'static>(
    lab: &Lab,
    addrs: Vec<SocketAddr>,
    path: &'static str,
    tries: usize,
    read: impl Fn(&str) -> Option<T> + Send + 'static,
) -> Vec<Option<T>> {
    let count = addrs.len();
    probe::in_netns(&lab.client_netns, move || {
        addrs
            .iter()
            .map(|addr| (0..tries).find_map(|_| read(&http_get(*addr, path)?)))
            .collect()
    })
    .unwrap_or_else(|_| (0..count).map(|_| None).collect())
}
