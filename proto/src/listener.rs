//! The accept-and-serve loop shared by the speaker's and the controller's HTTP listeners (the
//! `listener` feature): each answer comes from a pure router the caller hands in, so this is the
//! only HTTP I/O either daemon has.
//!
//! It bounds what a client can make a daemon hold ([`Limits`]): a request head must arrive
//! whole within a few seconds and fit in a small buffer, a connection lives for a bounded time,
//! and only so many are open at once, in all and from one client address, so one client cannot
//! take every slot from the kubelet's probes and Prometheus; a connection over the cap per
//! client is accepted and closed at once. When every slot is taken, a new connection takes the
//! slot of the connection that has waited longest for a request head (clients on many
//! addresses holding every slot with unfinished heads thus lose them one by one to the probes,
//! which send theirs at once); only when none waits is it closed.
//! Every connection closed for one of these reasons is counted in
//! `swimlb_http_connections_dropped_total{reason}` ([`ListenerMetrics`]).
//!
//! It lives beside [`crate::exposition`], which decides the `/metrics` format those routers
//! answer in; the feature keeps tokio and hyper out of the wire-format build (fuzzing,
//! benchmarks).

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Response, StatusCode};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::{Notify, Semaphore};

/// What a router answers: status, `Content-Type` and body.
pub type Reply = (StatusCode, &'static str, Bytes);

/// What a router sees of a request.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The method.
    pub method: &'a Method,
    /// The path, without the query.
    pub path: &'a str,
    /// The query (after `?`), if any.
    pub query: Option<&'a str>,
    /// The `Accept` header, if any and readable.
    pub accept: Option<&'a str>,
}

impl<'a> Request<'a> {
    /// A `GET` of `path` with no query and no `Accept` (for tests).
    pub fn get(path: &'a str) -> Request<'a> {
        Request {
            method: &Method::GET,
            path,
            query: None,
            accept: None,
        }
    }

    /// Whether the query has the flag `name` (`?name`, `?name=...`, `?a&name`).
    pub fn has_flag(&self, name: &str) -> bool {
        self.query.is_some_and(|q| {
            q.split('&')
                .any(|pair| pair.split('=').next() == Some(name))
        })
    }
}

/// What one listener allows a client. The requests both daemons serve are a line and a few
/// headers, and their clients (Prometheus, probes, `swimlb-speaker status`) are quick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A request head (the request line and the headers) must arrive whole within this time
    /// of the connection opening or of the previous answer, so it also closes idle keep-alive
    /// connections.
    pub header_read_timeout: Duration,
    /// The largest request head read (hyper's read buffer; at least 8 KiB). A larger one gets
    /// `431` and the connection is closed.
    pub max_head_bytes: usize,
    /// Connections served at once; one more takes the slot of the one that has waited longest
    /// for a request head, or is accepted and closed at once when none waits.
    pub max_connections: usize,
    /// Connections served at once from one client address; one more from it is accepted and
    /// closed at once.
    pub max_per_client: usize,
    /// The longest a connection is kept, whatever it does (a client that reads an answer
    /// slowly included).
    pub connection_lifetime: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            header_read_timeout: Duration::from_secs(5),
            max_head_bytes: 16 * 1024,
            max_connections: 512,
            max_per_client: 8,
            connection_lifetime: Duration::from_secs(60),
        }
    }
}

/// Reads a listen address: `address:port` (`192.0.2.10:7572`, `[2001:db8::1]:7572`), or an
/// address alone (`192.0.2.10`, `2001:db8::1`, `[2001:db8::1]`), which gets `default_port`. So
/// a Pod's address from the downward API (`status.hostIP`, `status.podIP`), IPv4 or IPv6, is a
/// whole listen address as it comes, without gluing a port to an IPv6 address.
pub fn parse_listen(text: &str, default_port: u16) -> Result<SocketAddr, String> {
    let text = text.trim();
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let bare = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    bare.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, default_port))
        .map_err(|_| {
            format!(
                "`{text}` is not an address, nor an address with a port (`192.0.2.10`, \
                 `192.0.2.10:{default_port}`, `2001:db8::1`, `[2001:db8::1]:{default_port}`)"
            )
        })
}

/// Why a connection was closed by the listener rather than by the client.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum DropReason {
    /// [`Limits::max_connections`] were open and none waited for a request head: accepted and
    /// closed at once.
    connection_limit,
    /// [`Limits::max_connections`] were open: this one, of those waiting for a request head the
    /// one that had waited longest, was closed to make room for a new one.
    evicted,
    /// [`Limits::max_per_client`] were open from the same address: accepted and closed at once.
    client_limit,
    /// No whole request head within [`Limits::header_read_timeout`] (idle keep-alive
    /// connections included).
    header_timeout,
    /// A request head over [`Limits::max_head_bytes`].
    head_too_large,
    /// Open for [`Limits::connection_lifetime`].
    lifetime,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabels {
    reason: DropReason,
}

/// `swimlb_http_connections_dropped_total{reason}`.
#[derive(Debug, Clone, Default)]
pub struct ListenerMetrics {
    dropped: Family<DropLabels, Counter>,
}

impl ListenerMetrics {
    /// Registers the counter in `registry`.
    pub fn register(registry: &mut Registry) -> ListenerMetrics {
        let metrics = ListenerMetrics::default();
        registry.register(
            "swimlb_http_connections_dropped",
            "HTTP connections the listener closed, by reason",
            metrics.dropped.clone(),
        );
        // Every reason from the start, at 0.
        for reason in [
            DropReason::connection_limit,
            DropReason::evicted,
            DropReason::client_limit,
            DropReason::header_timeout,
            DropReason::head_too_large,
            DropReason::lifetime,
        ] {
            let _ = metrics.dropped.get_or_create(&DropLabels { reason });
        }
        metrics
    }

    /// How many connections were closed for `reason`.
    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.dropped.get_or_create(&DropLabels { reason }).get()
    }

    fn count(&self, reason: DropReason) {
        self.dropped.get_or_create(&DropLabels { reason }).inc();
    }
}

/// The connections waiting for a request head (their first, or the next on a kept-alive
/// connection), oldest first, each with the signal that closes it.
#[derive(Debug, Default)]
struct Waiting {
    inner: Mutex<(u64, BTreeMap<u64, Arc<Notify>>)>,
}

impl Waiting {
    /// Puts `close` last in line; returns its place.
    fn push(&self, close: &Arc<Notify>) -> u64 {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let place = inner.0;
        inner.0 += 1;
        inner.1.insert(place, Arc::clone(close));
        place
    }

    /// Takes `place` out of the line (its head arrived, or it closed).
    fn remove(&self, place: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.1.remove(&place);
    }

    /// Signals the connection first in line to close; whether there was one.
    fn close_oldest(&self) -> bool {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        match inner.1.pop_first() {
            Some((_, close)) => {
                close.notify_one();
                true
            }
            None => false,
        }
    }
}

/// The connections open per client address; a [`ClientSlot`] gives its one back when dropped.
#[derive(Debug, Default)]
struct PerClient {
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One open connection of `client`, counted in [`PerClient`] until dropped.
#[derive(Debug)]
struct ClientSlot {
    clients: Arc<PerClient>,
    client: IpAddr,
}

impl PerClient {
    /// A slot for `client`, unless it has `max` open already.
    fn take(self: &Arc<Self>, client: IpAddr, max: usize) -> Option<ClientSlot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(client).or_default();
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(ClientSlot {
            clients: Arc::clone(self),
            client,
        })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self.clients.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.client);
            }
        }
    }
}

/// Serves HTTP/1 on `listener` within `limits` until the task is dropped. `route` answers each
/// request; a `HEAD` request gets its answer without the body.
pub async fn serve<R>(
    listener: tokio::net::TcpListener,
    limits: Limits,
    metrics: ListenerMetrics,
    route: R,
) where
    R: Fn(&Request<'_>) -> Reply + Clone + Send + Sync + 'static,
{
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let clients = Arc::new(PerClient::default());
    let waiting = Arc::new(Waiting::default());
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            // Out of descriptors or a connection reset before it was accepted: the next
            // accept may work; do not spin.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let Some(slot) = clients.take(peer.ip(), limits.max_per_client) else {
            metrics.count(DropReason::client_limit);
            drop(stream);
            continue;
        };
        let permit = match Arc::clone(&open).try_acquire_owned() {
            Ok(permit) => permit,
            // Every slot is taken: the connection that has waited longest for a head gives
            // its slot up (it closes at once and frees it); none waits: refused.
            Err(_) if waiting.close_oldest() => {
                let freed = Arc::clone(&open).acquire_owned();
                match tokio::time::timeout(EVICTION_WAIT, freed).await {
                    Ok(Ok(permit)) => permit,
                    _ => {
                        metrics.count(DropReason::connection_limit);
                        continue;
                    }
                }
            }
            Err(_) => {
                metrics.count(DropReason::connection_limit);
                drop(stream);
                continue;
            }
        };
        let connection = Connection {
            limits,
            metrics: metrics.clone(),
            waiting: Arc::clone(&waiting),
        };
        let route = route.clone();
        tokio::spawn(async move {
            connection.serve(stream, route).await;
            drop(permit);
            drop(slot);
        });
    }
}

/// How long a new connection waits for the slot of the connection it closed.
const EVICTION_WAIT: Duration = Duration::from_millis(100);

/// What one connection's task needs.
struct Connection {
    limits: Limits,
    metrics: ListenerMetrics,
    waiting: Arc<Waiting>,
}

impl Connection {
    /// Serves `stream` until it closes, is closed by a bound, or is closed to make room.
    async fn serve<R>(self, stream: tokio::net::TcpStream, route: R)
    where
        R: Fn(&Request<'_>) -> Reply + Clone + Send + Sync + 'static,
    {
        let Connection {
            limits,
            metrics,
            waiting,
        } = self;
        let close = Arc::new(Notify::new());
        let place = Arc::new(Mutex::new(waiting.push(&close)));
        let (in_line, line, signal) = (Arc::clone(&place), Arc::clone(&waiting), close.clone());
        let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            // A whole head came: out of the line while it is answered, then back in, last,
            // for the next one on this connection.
            let mut at = in_line.lock().unwrap_or_else(|e| e.into_inner());
            line.remove(*at);
            let response = respond(&route, &req);
            *at = line.push(&signal);
            async move { Ok::<_, Infallible>(response) }
        });
        let io = hyper_util::rt::TokioIo::new(stream);
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .max_buf_size(limits.max_head_bytes.max(8192))
            .serve_connection(io, service);
        tokio::select! {
            ended = tokio::time::timeout(limits.connection_lifetime, connection) => match ended {
                Err(_) => metrics.count(DropReason::lifetime),
                Ok(Err(e)) if e.is_timeout() => metrics.count(DropReason::header_timeout),
                Ok(Err(e)) if e.is_parse_too_large() => metrics.count(DropReason::head_too_large),
                Ok(_) => {}
            },
            () = close.notified() => metrics.count(DropReason::evicted),
        }
        waiting.remove(*place.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

/// `route`'s answer to `req`, without the body for a `HEAD`.
fn respond<R>(route: &R, req: &hyper::Request<Incoming>) -> Response<Full<Bytes>>
where
    R: Fn(&Request<'_>) -> Reply,
{
    let request = Request {
        method: req.method(),
        path: req.uri().path(),
        query: req.uri().query(),
        accept: req
            .headers()
            .get(hyper::header::ACCEPT)
            .and_then(|v| v.to_str().ok()),
    };
    let (code, content_type, body) = route(&request);
    let body = if req.method() == Method::HEAD {
        Bytes::new()
    } else {
        body
    };
    Response::builder()
        .status(code)
        .header(hyper::header::CONTENT_TYPE, content_type)
        .body(Full::new(body))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listen_address_is_an_address_with_or_without_its_port() {
        let cases = [
            ("192.0.2.10", "192.0.2.10:7572"),
            ("192.0.2.10:9100", "192.0.2.10:9100"),
            ("2001:db8::1", "[2001:db8::1]:7572"),
            ("[2001:db8::1]", "[2001:db8::1]:7572"),
            ("[2001:db8::1]:9100", "[2001:db8::1]:9100"),
            (" 0.0.0.0 ", "0.0.0.0:7572"),
        ];
        for (text, want) in cases {
            assert_eq!(
                parse_listen(text, 7572),
                Ok(want.parse().expect("a socket address")),
                "{text}"
            );
        }
        for bad in [
            "",
            "node-1",
            "192.0.2.10:",
            "2001:db8::1:7572:",
            "[2001:db8::1",
            "$(HOST_IP)",
        ] {
            let e = parse_listen(bad, 7572).expect_err(bad);
            assert!(e.contains("is not an address"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_client_gets_at_most_its_slots_and_gets_them_back_when_they_close() {
        let clients = Arc::new(PerClient::default());
        let a: IpAddr = "192.0.2.1".parse().expect("ip");
        let b: IpAddr = "192.0.2.2".parse().expect("ip");
        let first = clients.take(a, 2).expect("a first slot");
        let second = clients.take(a, 2).expect("a second slot");
        assert!(clients.take(a, 2).is_none(), "a third slot for one client");
        let other = clients.take(b, 2);
        assert!(
            other.is_some(),
            "another client is not counted with the first"
        );
        drop(first);
        assert!(clients.take(a, 2).is_some(), "a closed slot is given back");
        drop((second, other));
        assert!(
            clients.open.lock().expect("lock").get(&b).is_none(),
            "a client with nothing open is forgotten"
        );
    }
}
