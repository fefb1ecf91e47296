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
    body(&text)
}

/// The body of an HTTP/1.1 `response`, its chunks joined when the server sent it chunked (Go's
/// server does for a large `/metrics`).
fn body(response: &str) -> Option<String> {
    let (head, body) = response.split_once("\r\n\r\n")?;
    let chunked = head.lines().any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.eq_ignore_ascii_case("transfer-encoding") && v.trim().eq_ignore_ascii_case("chunked")
        })
    });
    if !chunked {
        return Some(body.to_string());
    }
    let mut out = String::new();
    let mut rest = body;
    loop {
        let (size, after) = rest.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(after.get(..size)?);
        rest = after.get(size..)?.strip_prefix("\r\n")?;
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunked_body_is_joined_and_a_plain_one_kept() {
        let chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nmetal\r\na;x=1\r\nlb_speaker\r\n0\r\n\r\n";
        assert_eq!(body(chunked).as_deref(), Some("metallb_speaker"));
        let plain = "HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\na\r\nb";
        assert_eq!(body(plain).as_deref(), Some("a\r\nb"));
        // Cut short: no answer rather than half of one.
        assert_eq!(
            body("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n9\r\nabc"),
            None
        );
        assert_eq!(body("no head"), None);
    }
}
