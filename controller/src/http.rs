//! The controller's HTTP listener: `/metrics` (OpenMetrics text to a client that asks for it, as
//! Prometheus does, the classic text format otherwise: see [`swimlb_proto::exposition`]),
//! `/healthz` and `/readyz`.
//!
//! The run loop publishes a [`Health`] through a [`tokio::sync::watch`] channel; this module only
//! reads it. [`route`] is the pure part (method, path and health in, response out) and is tested
//! without a socket.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::body::Bytes;
use hyper::{Method, StatusCode};
use prometheus_client::registry::Registry;
use swimlb_proto::exposition::{self, Format};
use tokio::sync::watch;

/// What `/readyz` decides from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Health {
    /// A standby waiting for the lease, or a leader whose caches are synced and whose existing
    /// assignments are loaded.
    pub ready: bool,
    /// This replica holds the lease.
    pub leader: bool,
    /// Shutting down (signal received or lease lost).
    pub draining: bool,
}

/// A response: status code, content type, body.
pub use swimlb_proto::listener::Reply;

fn text(code: StatusCode, body: &'static str) -> Reply {
    (code, "text/plain", Bytes::from_static(body.as_bytes()))
}

/// Answers `method path` from `health` and `registry`; `accept` (the request's `Accept` header)
/// chooses the format of `/metrics`.
pub fn route(
    method: &Method,
    path: &str,
    accept: Option<&str>,
    health: Health,
    registry: &Registry,
) -> Reply {
    if method != Method::GET && method != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
    }
    match path {
        "/metrics" => {
            let mut out = String::new();
            match prometheus_client::encoding::text::encode(&mut out, registry) {
                Ok(()) => match Format::negotiate(accept) {
                    Format::OpenMetrics => (
                        StatusCode::OK,
                        Format::OpenMetrics.content_type(),
                        Bytes::from(out),
                    ),
                    Format::Text => (
                        StatusCode::OK,
                        Format::Text.content_type(),
                        Bytes::from(exposition::to_text(&out)),
                    ),
                },
                Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n"),
            }
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" if health.draining => text(StatusCode::SERVICE_UNAVAILABLE, "draining\n"),
        "/readyz" if health.ready && health.leader => text(StatusCode::OK, "ready: leader\n"),
        "/readyz" if health.ready => text(StatusCode::OK, "ready: standby\n"),
        "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "syncing\n"),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

/// Serves on `listener` until the task is dropped.
pub async fn serve(
    listener: tokio::net::TcpListener,
    health: watch::Receiver<Health>,
    registry: Arc<Registry>,
) {
    swimlb_proto::listener::serve(listener, move |method, path, accept| {
        let current = *health.borrow();
        route(method, path, accept, current, &registry)
    })
    .await;
}

/// Binds `addr` and serves in a background task; returns the bound address.
pub async fn spawn(
    addr: SocketAddr,
    health: watch::Receiver<Health>,
    registry: Arc<Registry>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    Ok((local, tokio::spawn(serve(listener, health, registry))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readyz_is_ready_for_a_standby_and_a_synced_leader_but_not_while_syncing_or_draining() {
        let r = Registry::default();
        let get = |h: Health| route(&Method::GET, "/readyz", None, h, &r).0;
        assert_eq!(get(Health::default()), StatusCode::SERVICE_UNAVAILABLE);
        let standby = Health {
            ready: true,
            ..Health::default()
        };
        assert_eq!(get(standby), StatusCode::OK);
        let leader = Health {
            ready: true,
            leader: true,
            draining: false,
        };
        assert_eq!(get(leader), StatusCode::OK);
        let draining = Health {
            draining: true,
            ..leader
        };
        assert_eq!(get(draining), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn metrics_are_openmetrics_to_prometheus_classic_text_to_others_and_unknown_paths_are_404() {
        let mut r = Registry::default();
        crate::metrics::ControllerMetrics::register(&mut r);
        let openmetrics = Some("application/openmetrics-text;version=1.0.0,text/plain;q=0.5");
        let (code, ct, body) = route(&Method::GET, "/metrics", openmetrics, Health::default(), &r);
        assert_eq!(code, StatusCode::OK);
        assert!(ct.starts_with("application/openmetrics-text"));
        assert!(body.ends_with(b"# EOF\n"));
        let (code, ct, body) = route(&Method::GET, "/metrics", None, Health::default(), &r);
        assert_eq!((code, ct), (StatusCode::OK, exposition::TEXT_CONTENT_TYPE));
        assert!(!body.ends_with(b"# EOF\n"));
        let (code, _, _) = route(&Method::GET, "/nope", None, Health::default(), &r);
        assert_eq!(code, StatusCode::NOT_FOUND);
        let (code, _, _) = route(&Method::POST, "/healthz", None, Health::default(), &r);
        assert_eq!(code, StatusCode::METHOD_NOT_ALLOWED);
    }
}
