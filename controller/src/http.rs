//! The controller's HTTP listener: `/metrics` (OpenMetrics text to a client that asks for it, as
//! Prometheus does, the classic text format otherwise: see [`swimlb_proto::exposition`]),
//! `/healthz` and `/readyz`.
//!
//! The run loop publishes a [`Health`] through a [`tokio::sync::watch`] channel; this module only
//! reads it. [`route`] is the pure part (method, path and health in, response out) and is tested
//! without a socket; the listener's bounds (head size and time, open connections, connection
//! lifetime) are [`swimlb_proto::listener`]'s.

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

/// A response: status code, content type, body; what a router sees of a request; the
/// listener's bounds and counters.
pub use swimlb_proto::listener::{Limits, ListenerMetrics, Reply, Request};

fn text(code: StatusCode, body: &'static str) -> Reply {
    (code, "text/plain", Bytes::from_static(body.as_bytes()))
}

/// Answers `request` from `health` and `registry`; the `Accept` header chooses the format of
/// `/metrics`.
pub fn route(request: &Request<'_>, health: Health, registry: &Registry) -> Reply {
    if request.method != Method::GET && request.method != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
    }
    match request.path {
        "/metrics" => {
            let mut out = String::new();
            match prometheus_client::encoding::text::encode(&mut out, registry) {
                Ok(()) => match Format::negotiate(request.accept) {
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

/// Serves on `listener` within `limits` until the task is dropped; `metrics` counts the
/// connections it closes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    limits: Limits,
    metrics: ListenerMetrics,
    health: watch::Receiver<Health>,
    registry: Arc<Registry>,
) {
    swimlb_proto::listener::serve(listener, limits, metrics, move |request| {
        let current = *health.borrow();
        route(request, current, &registry)
    })
    .await;
}

/// Binds `addr` and serves in a background task with the default [`Limits`]; returns the bound
/// address. `metrics` is [`ControllerMetrics::listener`](crate::metrics::ControllerMetrics).
pub async fn spawn(
    addr: SocketAddr,
    health: watch::Receiver<Health>,
    registry: Arc<Registry>,
    metrics: ListenerMetrics,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(serve(
        listener,
        Limits::default(),
        metrics,
        health,
        registry,
    ));
    Ok((local, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readyz_is_ready_for_a_standby_and_a_synced_leader_but_not_while_syncing_or_draining() {
        let r = Registry::default();
        let get = |h: Health| route(&Request::get("/readyz"), h, &r).0;
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
        let (code, ct, body) = route(
            &Request {
                accept: openmetrics,
                ..Request::get("/metrics")
            },
            Health::default(),
            &r,
        );
        assert_eq!(code, StatusCode::OK);
        assert!(ct.starts_with("application/openmetrics-text"));
        assert!(body.ends_with(b"# EOF\n"));
        let (code, ct, body) = route(&Request::get("/metrics"), Health::default(), &r);
        assert_eq!((code, ct), (StatusCode::OK, exposition::TEXT_CONTENT_TYPE));
        assert!(!body.ends_with(b"# EOF\n"));
        let (code, _, _) = route(&Request::get("/nope"), Health::default(), &r);
        assert_eq!(code, StatusCode::NOT_FOUND);
        let (code, _, _) = route(
            &Request {
                method: &Method::POST,
                ..Request::get("/healthz")
            },
            Health::default(),
            &r,
        );
        assert_eq!(code, StatusCode::METHOD_NOT_ALLOWED);
    }
}
