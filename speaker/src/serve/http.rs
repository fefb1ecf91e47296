//! The speaker's HTTP listener: `/metrics` (OpenMetrics text to a client that asks for it, as
//! Prometheus does, the classic text format otherwise: see [`swimlb_proto::exposition`]),
//! `/healthz`, `/readyz` and `/status` (JSON).
//!
//! The daemon publishes its state through a [`tokio::sync::watch`] channel; this module only
//! reads it. [`route`] is the pure part (path and state in, response out) and is tested without
//! a socket.

use crate::model::election::VerdictKind;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

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
    /// `standalone::ready`.
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

/// A response: status code, content type, body.
pub use swimlb_proto::listener::Reply;

/// Answers `method path` from `status` and `registry`; `accept` (the request's `Accept` header)
/// chooses the format of `/metrics`.
pub fn route(
    method: &Method,
    path: &str,
    accept: Option<&str>,
    status: &Status,
    registry: &Registry,
) -> Reply {
    if method != Method::GET && method != Method::HEAD {
        return (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            Bytes::from_static(b"GET only\n"),
        );
    }
    match path {
        "/metrics" => {
            let mut text = String::new();
            match prometheus_client::encoding::text::encode(&mut text, registry) {
                Ok(()) => match Format::negotiate(accept) {
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
                Err(_) => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    Bytes::from_static(b"encoding failed\n"),
                ),
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
        "/status" => match serde_json::to_vec_pretty(status) {
            Ok(body) => (StatusCode::OK, "application/json", Bytes::from(body)),
            Err(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                Bytes::from_static(b"encoding failed\n"),
            ),
        },
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            Bytes::from_static(b"not found\n"),
        ),
    }
}

/// The registry as OpenMetrics text, for tests that look at what a scrape would see.
#[cfg(test)]
pub(crate) fn metrics_text(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).expect("encodes");
    text
}

/// Serves on `listener` until the task is dropped.
pub async fn serve(
    listener: tokio::net::TcpListener,
    status: watch::Receiver<Status>,
    registry: Arc<Registry>,
) {
    swimlb_proto::listener::serve(listener, move |method, path, accept| {
        let current = status.borrow().clone();
        route(method, path, accept, &current, &registry)
    })
    .await;
}

/// Binds `addr` and serves in a background task.
pub async fn spawn(
    addr: SocketAddr,
    status: watch::Receiver<Status>,
    registry: Arc<Registry>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    Ok((local, tokio::spawn(serve(listener, status, registry))))
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
        let (code, ct, body) = route(
            &Method::GET,
            "/metrics",
            Some(PROMETHEUS_ACCEPT),
            &status,
            &registry(),
        );
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
            let (code, ct, body) = route(&Method::GET, "/metrics", accept, &status, &registry());
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
            route(&Method::GET, "/readyz", None, &s, &r).0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        s.ready = true;
        assert_eq!(
            route(&Method::GET, "/readyz", None, &s, &r).0,
            StatusCode::OK
        );
        s.draining = true;
        assert_eq!(
            route(&Method::GET, "/readyz", None, &s, &r).2,
            Bytes::from_static(b"draining\n")
        );
        assert_eq!(
            route(&Method::GET, "/healthz", None, &s, &r).0,
            StatusCode::OK
        );
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
        let (code, ct, body) = route(&Method::GET, "/status", None, &s, &registry());
        assert_eq!((code, ct), (StatusCode::OK, "application/json"));
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["addresses"][0]["owner"], "node2");
        assert_eq!(v["node"], "node1");
    }

    #[test]
    fn unknown_paths_and_methods_are_refused() {
        let r = registry();
        assert_eq!(
            route(&Method::GET, "/nope", None, &Status::default(), &r).0,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            route(&Method::POST, "/status", None, &Status::default(), &r).0,
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
        let (addr, task) = spawn("127.0.0.1:0".parse().unwrap(), rx, Arc::new(registry()))
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
}
