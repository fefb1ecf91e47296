//! The speaker's HTTP listener: `/metrics` (OpenMetrics text to a client that asks for it, as
//! Prometheus does, the classic text format otherwise: see [`swimlb_proto::exposition`]),
//! `/healthz`, `/readyz` and `/status` (JSON).
//!
//! The daemon publishes its state through a [`tokio::sync::watch`] channel; this module only
//! reads it. [`route`] is the pure part (path and state in, response out) and is tested without
//! a socket. The listener's bounds (head size and time, open connections, connection lifetime)
//! are [`swimlb_proto::listener`]'s; `/status` is compact JSON (`?pretty` indents it), made
//! once per change and shared by the requests that ask for it.

use crate::model::election::VerdictKind;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use hyper::{Method, StatusCode};
use prometheus_client::registry::Registry;
use serde::Serialize;
use smol_str::SmolStr;
use swimlb_proto::exposition::{self, Format};
use tokio::sync::watch;

use crate::model::engine::placement::LinkSet;

/// What `/status` shows and `/readyz` decides from.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Status {
    /// This node.
    pub node: String,
    /// Whether the speaker has joined the mesh (or has no peers to join); see
    /// `sources::ready`.
    pub ready: bool,
    /// Whether the speaker is draining (SIGTERM received).
    pub draining: bool,
    /// Alive members, with their metadata, in name order (a JSON list).
    #[serde(serialize_with = "values")]
    pub members: BTreeMap<String, MemberStatus>,
    /// Every VIP, its group and owner, in IP order (a JSON list).
    #[serde(serialize_with = "values")]
    pub addresses: BTreeMap<IpAddr, AddressStatus>,
    /// This node's checks.
    pub checks: Vec<CheckStatus>,
}

/// One alive member.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemberStatus {
    /// Node name.
    pub node: String,
    /// Up for at least its preemption delay.
    pub settled: bool,
    /// Shutting down.
    pub draining: bool,
}

/// One VIP. Its JSON also has `interface`: the first of `interfaces` (null when this node
/// does not answer). The strings and the link set are shared with the engine's view, so that
/// 10,000 entries allocate nothing of their own.
#[derive(Debug, Clone, PartialEq)]
pub struct AddressStatus {
    /// The address.
    pub ip: IpAddr,
    /// Group (standalone) or `namespace/service`.
    pub group: SmolStr,
    /// The elected owner, if any.
    pub owner: Option<SmolStr>,
    /// This node's verdict (`owner`, `not_owner`, `no_candidates`, ...).
    pub verdict: VerdictKind,
    /// Every interface this node answers for it on (`None`: it does not answer; `[]` in JSON).
    pub interfaces: Option<LinkSet>,
    /// When this node saw the owner change last (or the IP appear), in seconds since the Unix
    /// epoch (`swimlb-speaker status` shows it as an age).
    pub owner_since: Option<f64>,
}

impl Serialize for AddressStatus {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let links = self.interfaces.as_deref();
        let mut s = serializer.serialize_struct("AddressStatus", 7)?;
        s.serialize_field("ip", &self.ip)?;
        s.serialize_field("group", &self.group)?;
        s.serialize_field("owner", &self.owner)?;
        s.serialize_field("verdict", self.verdict.as_str())?;
        s.serialize_field("interface", &links.and_then(|l| l.first()))?;
        s.serialize_field(
            "interfaces",
            &links.into_iter().flatten().collect::<Vec<_>>(),
        )?;
        s.serialize_field("owner_since", &self.owner_since)?;
        s.end()
    }
}

/// Serializes a map as the list of its values.
fn values<S: serde::Serializer, K, V: Serialize>(
    map: &BTreeMap<K, V>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(map.values())
}

/// One health check on this node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckStatus {
    /// Group.
    pub group: String,
    /// Check.
    pub check: String,
    /// Passing after hysteresis.
    pub passing: bool,
    /// The last outcome (`pass`, `timeout`, `status`, ...).
    pub last: String,
}

/// A response: status code, content type, body; what a router sees of a request; the
/// listener's bounds and counters.
pub use swimlb_proto::listener::{Limits, ListenerMetrics, Reply, Request};

/// Answers `request` from `status` and `registry`, but `/status` (see [`StatusBody`]); the
/// `Accept` header chooses the format of `/metrics`.
pub fn route(request: &Request<'_>, status: &Status, registry: &Registry) -> Reply {
    if request.method != Method::GET && request.method != Method::HEAD {
        return (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            Bytes::from_static(b"GET only\n"),
        );
    }
    match request.path {
        "/metrics" => {
            let mut text = String::new();
            match prometheus_client::encoding::text::encode(&mut text, registry) {
                Ok(()) => match Format::negotiate(request.accept) {
                    Format::OpenMetrics => (
                        StatusCode::OK,
                        Format::OpenMetrics.content_type(),
                        Bytes::from(text),
                    ),
                    Format::Text => (
                        StatusCode::OK,
                        Format::Text.content_type(),
                        Bytes::from(exposition::to_text(&text)),
                    ),
                },
                Err(_) => encoding_failed(),
            }
        }
        "/healthz" => (StatusCode::OK, "text/plain", Bytes::from_static(b"ok\n")),
        "/readyz" if status.ready && !status.draining => {
            (StatusCode::OK, "text/plain", Bytes::from_static(b"ready\n"))
        }
        "/readyz" if status.draining => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            Bytes::from_static(b"draining\n"),
        ),
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            Bytes::from_static(b"joining\n"),
        ),
        "/status" => match status_json(status, request.has_flag("pretty")) {
            Ok(body) => (StatusCode::OK, "application/json", body),
            Err(_) => encoding_failed(),
        },
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            Bytes::from_static(b"not found\n"),
        ),
    }
}

fn encoding_failed() -> Reply {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        "text/plain",
        Bytes::from_static(b"encoding failed\n"),
    )
}

/// `status` as JSON: compact, or indented for `?pretty`.
fn status_json(status: &Status, pretty: bool) -> serde_json::Result<Bytes> {
    let body = if pretty {
        serde_json::to_vec_pretty(status)?
    } else {
        serde_json::to_vec(status)?
    };
    Ok(Bytes::from(body))
}

/// The `/status` body, made once per change of the status and shared by every request until
/// the next: serialized from the channel's value under its read lock (no copy of the status),
/// so concurrent and repeated requests hold one body between them, not one each.
#[derive(Debug)]
struct StatusBody {
    status: watch::Receiver<Status>,
    compact: Option<Bytes>,
    pretty: Option<Bytes>,
}

impl StatusBody {
    fn new(status: watch::Receiver<Status>) -> StatusBody {
        StatusBody {
            status,
            compact: None,
            pretty: None,
        }
    }

    /// The answer to `request`: `/status` from the shared body, the rest from [`route`].
    fn answer(&mut self, request: &Request<'_>, registry: &Registry) -> Reply {
        let get = request.method == Method::GET || request.method == Method::HEAD;
        if request.path != "/status" || !get {
            // Not under the channel's lock: `/metrics` takes it again for the owner gauges.
            let (ready, draining) = {
                let status = self.status.borrow();
                (status.ready, status.draining)
            };
            let flags = Status {
                ready,
                draining,
                ..Status::default()
            };
            return route(request, &flags, registry);
        }
        if self.status.has_changed().unwrap_or(false) {
            self.status.mark_unchanged();
            self.compact = None;
            self.pretty = None;
        }
        let pretty = request.has_flag("pretty");
        let slot = if pretty {
            &mut self.pretty
        } else {
            &mut self.compact
        };
        if slot.is_none() {
            *slot = status_json(&self.status.borrow(), pretty).ok();
        }
        match slot {
            Some(body) => (StatusCode::OK, "application/json", body.clone()),
            None => encoding_failed(),
        }
    }
}

/// The registry as OpenMetrics text, for tests that look at what a scrape would see.
#[cfg(test)]
pub(crate) fn metrics_text(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).expect("encodes");
    text
}

/// Serves on `listener` within `limits` until the task is dropped; `metrics` counts the
/// connections it closes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    limits: Limits,
    metrics: ListenerMetrics,
    status: watch::Receiver<Status>,
    registry: Arc<Registry>,
) {
    let body = Arc::new(Mutex::new(StatusBody::new(status)));
    swimlb_proto::listener::serve(listener, limits, metrics, move |request| {
        let mut body = body
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        body.answer(request, &registry)
    })
    .await;
}

/// Binds `addr` and serves in a background task with the default [`Limits`]; `metrics` is
/// [`StatusBoard::listener_metrics`](crate::serve::status::StatusBoard::listener_metrics).
pub async fn spawn(
    addr: SocketAddr,
    status: watch::Receiver<Status>,
    registry: Arc<Registry>,
    metrics: ListenerMetrics,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(serve(
        listener,
        Limits::default(),
        metrics,
        status,
        registry,
    ));
    Ok((local, task))
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    fn registry() -> Registry {
        let mut r = Registry::with_prefix("swimlb");
        let c: Counter = Counter::default();
        c.inc();
        r.register("gratuitous_sent", "Gratuitous ARP sent", c);
        r
    }

    /// Prometheus 2.42's scrape header.
    const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

    #[test]
    fn metrics_are_openmetrics_to_prometheus_and_classic_text_to_curl() {
        let status = Status::default();
        let request = Request {
            accept: Some(PROMETHEUS_ACCEPT),
            ..Request::get("/metrics")
        };
        let (code, ct, body) = route(&request, &status, &registry());
        assert_eq!(code, StatusCode::OK);
        assert!(ct.starts_with("application/openmetrics-text"));
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(
            text.contains("# TYPE swimlb_gratuitous_sent counter"),
            "{text}"
        );
        assert!(text.contains("swimlb_gratuitous_sent_total 1"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
        for accept in [None, Some("*/*")] {
            let (code, ct, body) = route(
                &Request {
                    accept,
                    ..Request::get("/metrics")
                },
                &status,
                &registry(),
            );
            assert_eq!((code, ct), (StatusCode::OK, exposition::TEXT_CONTENT_TYPE));
            let text = String::from_utf8(body.to_vec()).unwrap();
            assert!(
                text.contains("# TYPE swimlb_gratuitous_sent_total counter"),
                "{text}"
            );
            assert!(text.contains("swimlb_gratuitous_sent_total 1"), "{text}");
            assert!(!text.contains("# EOF"), "{text}");
        }
    }

    #[test]
    fn readyz_follows_ready_and_draining() {
        let r = registry();
        let mut s = Status::default();
        assert_eq!(
            route(&Request::get("/readyz"), &s, &r).0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        s.ready = true;
        assert_eq!(route(&Request::get("/readyz"), &s, &r).0, StatusCode::OK);
        s.draining = true;
        assert_eq!(
            route(&Request::get("/readyz"), &s, &r).2,
            Bytes::from_static(b"draining\n")
        );
        assert_eq!(route(&Request::get("/healthz"), &s, &r).0, StatusCode::OK);
    }

    #[test]
    fn status_is_json_with_owners() {
        let s = Status {
            node: "node1".into(),
            ready: true,
            addresses: BTreeMap::from([(
                "198.51.100.100".parse().unwrap(),
                AddressStatus {
                    ip: "198.51.100.100".parse().unwrap(),
                    group: "api".into(),
                    owner: Some("node2".into()),
                    verdict: VerdictKind::NotOwner,
                    interfaces: None,
                    owner_since: None,
                },
            )]),
            ..Status::default()
        };
        let (code, ct, body) = route(&Request::get("/status"), &s, &registry());
        assert_eq!((code, ct), (StatusCode::OK, "application/json"));
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["addresses"][0]["owner"], "node2");
        assert_eq!(v["node"], "node1");
    }

    #[test]
    fn unknown_paths_and_methods_are_refused() {
        let r = registry();
        assert_eq!(
            route(&Request::get("/nope"), &Status::default(), &r).0,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            route(
                &Request {
                    method: &Method::POST,
                    ..Request::get("/status")
                },
                &Status::default(),
                &r
            )
            .0,
            StatusCode::METHOD_NOT_ALLOWED
        );
    }

    #[tokio::test]
    async fn serves_over_tcp() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let (_tx, rx) = watch::channel(Status {
            ready: true,
            ..Status::default()
        });
        let (addr, task) = spawn(
            "127.0.0.1:0".parse().unwrap(),
            rx,
            Arc::new(registry()),
            ListenerMetrics::default(),
        )
        .await
        .unwrap();
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /readyz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).await.unwrap();
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.ends_with("ready\n"), "{text}");
        task.abort();
    }

    use std::time::Duration;
    use swimlb_proto::listener::DropReason;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// A listener within `limits` on the loopback, with its counters.
    async fn listening(
        limits: Limits,
    ) -> (SocketAddr, ListenerMetrics, tokio::task::JoinHandle<()>) {
        let (_tx, rx) = watch::channel(Status::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = ListenerMetrics::default();
        let task = tokio::spawn(serve(
            listener,
            limits,
            metrics.clone(),
            rx,
            Arc::new(registry()),
        ));
        (addr, metrics, task)
    }

    /// Reads until the server closes (or resets) the connection, within 5 s.
    async fn read_until_closed(s: &mut tokio::net::TcpStream) -> Vec<u8> {
        let mut got = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got))
            .await
            .expect("the server closes the connection");
        got
    }

    #[tokio::test]
    async fn a_request_head_over_the_bound_gets_431_and_is_counted() {
        let (addr, metrics, task) = listening(Limits::default()).await;
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut head = b"GET /healthz HTTP/1.1\r\nx-pad: ".to_vec();
        head.resize(head.len() + 2 * Limits::default().max_head_bytes, b'a');
        let _ = s.write_all(&head).await;
        let got = read_until_closed(&mut s).await;
        // The 431 may be lost to the reset of the bytes the server did not read.
        assert!(
            got.is_empty() || got.starts_with(b"HTTP/1.1 431"),
            "{}",
            String::from_utf8_lossy(&got)
        );
        assert_eq!(metrics.dropped(DropReason::head_too_large), 1);
        task.abort();
    }

    #[tokio::test]
    async fn an_unfinished_request_head_is_closed_after_the_header_timeout_and_counted() {
        let limits = Limits {
            header_read_timeout: Duration::from_millis(200),
            ..Limits::default()
        };
        let (addr, metrics, task) = listening(limits).await;
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
            .await
            .unwrap();
        let started = tokio::time::Instant::now();
        read_until_closed(&mut s).await;
        assert!(started.elapsed() >= Duration::from_millis(150));
        assert_eq!(metrics.dropped(DropReason::header_timeout), 1);
        task.abort();
    }

    #[tokio::test]
    async fn an_idle_keep_alive_connection_is_closed_after_the_header_timeout() {
        let limits = Limits {
            header_read_timeout: Duration::from_millis(200),
            ..Limits::default()
        };
        let (addr, _, task) = listening(limits).await;
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let got = read_until_closed(&mut s).await;
        assert!(
            got.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&got)
        );
        assert!(got.ends_with(b"ok\n"), "{}", String::from_utf8_lossy(&got));
        task.abort();
    }

    /// Opens `held` connections that send half a request head, then one more: that one must be
    /// closed long before the header timeout (so it was refused, not served), and counted as
    /// `reason`; once the held ones close, a request is answered again.
    async fn one_over_the_cap_is_refused(limits: Limits, held: usize, reason: DropReason) {
        let (addr, metrics, task) = listening(limits).await;
        let mut open = Vec::new();
        for _ in 0..held {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
            open.push(s);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut refused = tokio::net::TcpStream::connect(addr).await.unwrap();
        let started = tokio::time::Instant::now();
        assert!(read_until_closed(&mut refused).await.is_empty());
        assert!(
            started.elapsed() < limits.header_read_timeout / 2,
            "closed after {:?}: served until the header timeout, not refused",
            started.elapsed()
        );
        assert_eq!(metrics.dropped(reason), 1);
        drop(open);
        // The server notices the closed ones; then a request is answered again.
        let mut answered = Vec::new();
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET /healthz HTTP/1.1\r\nconnection: close\r\n\r\n")
                .await
                .unwrap();
            answered = read_until_closed(&mut s).await;
            if !answered.is_empty() {
                break;
            }
        }
        assert!(answered.starts_with(b"HTTP/1.1 200"));
        task.abort();
    }

    #[tokio::test]
    async fn with_every_slot_held_by_unfinished_heads_a_new_connection_takes_the_oldest_slot() {
        let limits = Limits {
            max_connections: 2,
            max_per_client: 8,
            header_read_timeout: Duration::from_secs(10),
            ..Limits::default()
        };
        let (addr, metrics, task) = listening(limits).await;
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
            held.push(s);
            // One after the other, so the first is the oldest.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // A probe: its whole request at once, answered long before the heads' timeout.
        let mut probe = tokio::net::TcpStream::connect(addr).await.unwrap();
        probe
            .write_all(b"GET /healthz HTTP/1.1\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let started = tokio::time::Instant::now();
        let answer = read_until_closed(&mut probe).await;
        assert!(
            answer.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
        assert!(started.elapsed() < limits.header_read_timeout / 2);
        // The oldest unfinished head lost its slot; the younger one still holds its own.
        let mut oldest = held.remove(0);
        assert!(read_until_closed(&mut oldest).await.is_empty());
        let mut byte = [0u8; 1];
        let younger = tokio::time::timeout(Duration::from_millis(200), held[0].read(&mut byte));
        assert!(
            younger.await.is_err(),
            "the younger connection was closed too"
        );
        assert_eq!(metrics.dropped(DropReason::evicted), 1);
        assert_eq!(metrics.dropped(DropReason::connection_limit), 0);
        task.abort();
    }

    #[tokio::test]
    async fn a_client_over_its_own_cap_is_closed_at_once_and_counted() {
        let limits = Limits {
            max_connections: 8,
            max_per_client: 2,
            header_read_timeout: Duration::from_secs(10),
            ..Limits::default()
        };
        one_over_the_cap_is_refused(limits, 2, DropReason::client_limit).await;
    }

    #[tokio::test]
    async fn a_connection_is_closed_at_its_lifetime_and_counted() {
        let limits = Limits {
            connection_lifetime: Duration::from_millis(200),
            ..Limits::default()
        };
        let (addr, metrics, task) = listening(limits).await;
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
        read_until_closed(&mut s).await;
        assert_eq!(metrics.dropped(DropReason::lifetime), 1);
        task.abort();
    }

    #[test]
    fn status_is_compact_unless_pretty_and_one_body_is_shared_until_the_status_changes() {
        let (tx, rx) = watch::channel(Status {
            node: "node1".into(),
            ..Status::default()
        });
        let mut body = StatusBody::new(rx);
        let r = registry();
        let first = body.answer(&Request::get("/status"), &r).2;
        let second = body.answer(&Request::get("/status"), &r).2;
        assert!(!first.contains(&b'\n'), "{first:?}");
        assert_eq!(
            first.as_ptr(),
            second.as_ptr(),
            "one body for both requests"
        );
        let pretty = Request {
            query: Some("pretty"),
            ..Request::get("/status")
        };
        let indented = body.answer(&pretty, &r).2;
        assert!(indented.contains(&b'\n'), "{indented:?}");
        tx.send_modify(|s| s.node = "node2".into());
        let third = body.answer(&Request::get("/status"), &r).2;
        let v: serde_json::Value = serde_json::from_slice(&third).unwrap();
        assert_eq!(v["node"], "node2");
        assert_eq!(body.answer(&Request::get("/healthz"), &r).0, StatusCode::OK);
    }
}
