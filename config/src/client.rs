//! The Kubernetes API client both daemons use ([`client`]): a read timeout that ends a watch
//! connection the network half-closed, and a retry of the answers that ask for one (429, 503,
//! 504) that never waits longer than [`LONGEST_RETRY_WAIT`].
//!
//! kube's own retry layer honours the server's `Retry-After` whatever it says, up to 15 times: a
//! kube-apiserver that has just started answers the lists of custom resources `503` with
//! `Retry-After: 5` for a second or two, so a speaker started during an API outage listed its
//! pools 5 s after the server could have answered it, and joined the mesh only then.

use std::time::Duration;

use http::{Request, Response, StatusCode};
use kube::client::{Body, ClientBuilder};

use crate::reflect::READ_TIMEOUT;

/// The longest wait before a request is sent again, whatever `Retry-After` asks.
pub const LONGEST_RETRY_WAIT: Duration = Duration::from_secs(1);
/// The shortest wait (an answer without `Retry-After`, or one that says 0).
pub const SHORTEST_RETRY_WAIT: Duration = Duration::from_millis(200);
/// How many times one request is sent again; then its error goes to the caller (a watch
/// retries on its own, with [`RetryBackoff`](crate::reflect::RetryBackoff)).
pub const RETRIES: u32 = 3;
/// Requests waiting for the client's buffer (the retry layer needs a cloneable service).
const BUFFERED: usize = 1024;

/// A client for `config` with [`READ_TIMEOUT`] and the capped retry. Must be called inside a
/// Tokio runtime (the buffer's worker is spawned on it).
pub fn client(mut config: kube::Config) -> Result<kube::Client, kube::Error> {
    config.read_timeout = Some(READ_TIMEOUT);
    config.default_retry = false;
    let builder = ClientBuilder::try_from(config)?;
    let builder = builder.with_layer(&tower::buffer::BufferLayer::new(BUFFERED));
    let builder = builder.with_layer(&tower::retry::RetryLayer::new(CappedRetry::default()));
    Ok(builder.build())
}

/// The retry policy of [`client`]: 429, 503 and 504 are sent again up to [`RETRIES`] times, after
/// the server's `Retry-After` clamped between [`SHORTEST_RETRY_WAIT`] and [`LONGEST_RETRY_WAIT`].
#[derive(Debug, Clone, Default)]
pub struct CappedRetry {
    sent_again: u32,
}

impl CappedRetry {
    /// How long to wait before sending the request again after `response` (`None`: do not).
    pub fn wait_after<B>(&mut self, response: &Response<B>) -> Option<Duration> {
        let asks = matches!(
            response.status(),
            StatusCode::TOO_MANY_REQUESTS
                | StatusCode::SERVICE_UNAVAILABLE
                | StatusCode::GATEWAY_TIMEOUT
        );
        if !asks || self.sent_again >= RETRIES {
            return None;
        }
        self.sent_again += 1;
        let asked = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(Duration::ZERO, Duration::from_secs);
        Some(asked.clamp(SHORTEST_RETRY_WAIT, LONGEST_RETRY_WAIT))
    }
}

impl<Res, E> tower::retry::Policy<Request<Body>, Response<Res>, E> for CappedRetry {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        _request: &mut Request<Body>,
        result: &mut Result<Response<Res>, E>,
    ) -> Option<Self::Future> {
        let wait = self.wait_after(result.as_ref().ok()?)?;
        Some(tokio::time::sleep(wait))
    }

    fn clone_request(&mut self, request: &Request<Body>) -> Option<Request<Body>> {
        // Only a body held whole can be sent again (every request of ours is one).
        let body = request.body().try_clone()?;
        let mut copy = Request::builder()
            .method(request.method().clone())
            .uri(request.uri().clone())
            .version(request.version())
            .body(body)
            .ok()?;
        *copy.headers_mut() = request.headers().clone();
        *copy.extensions_mut() = request.extensions().clone();
        Some(copy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, retry_after: Option<&str>) -> Response<()> {
        let mut response = Response::builder().status(status);
        if let Some(after) = retry_after {
            response = response.header("Retry-After", after);
        }
        response.body(()).unwrap()
    }

    #[test]
    fn a_retry_after_is_honoured_up_to_a_second_and_three_times() {
        let mut policy = CappedRetry::default();
        // The starting API server's answer to a custom resource's list.
        assert_eq!(
            policy.wait_after(&answer(503, Some("5"))),
            Some(LONGEST_RETRY_WAIT)
        );
        assert_eq!(
            policy.wait_after(&answer(429, None)),
            Some(SHORTEST_RETRY_WAIT)
        );
        assert_eq!(
            policy.wait_after(&answer(504, Some("garbage"))),
            Some(SHORTEST_RETRY_WAIT)
        );
        assert_eq!(policy.wait_after(&answer(503, Some("1"))), None, "three");
        let mut fresh = CappedRetry::default();
        assert_eq!(
            fresh.wait_after(&answer(429, Some("0"))),
            Some(SHORTEST_RETRY_WAIT)
        );
        for other in [200, 404, 409, 410, 500] {
            assert_eq!(fresh.wait_after(&answer(other, Some("1"))), None, "{other}");
        }
    }

    #[test]
    fn a_request_is_sent_again_whole() {
        let mut policy = CappedRetry::default();
        let request = Request::builder()
            .method("PATCH")
            .uri("https://198.51.100.1:6443/api/v1/namespaces/x/events")
            .header("Content-Type", "application/json")
            .body(Body::from(b"{}".to_vec()))
            .unwrap();
        let copy = <CappedRetry as tower::retry::Policy<_, Response<()>, ()>>::clone_request(
            &mut policy,
            &request,
        )
        .expect("a body held whole");
        assert_eq!(copy.method(), request.method());
        assert_eq!(copy.uri(), request.uri());
        assert_eq!(copy.headers(), request.headers());
    }
}
