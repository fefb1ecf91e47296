//! The accept-and-serve loop shared by the speaker's and the controller's HTTP listeners (the
//! `listener` feature): each answer comes from a pure router the caller hands in, so this is the
//! only HTTP I/O either daemon has.
//!
//! It lives beside [`crate::exposition`], which decides the `/metrics` format those routers
//! answer in; the feature keeps tokio and hyper out of the wire-format build (fuzzing,
//! benchmarks).

use std::convert::Infallible;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};

/// What a router answers: status, `Content-Type` and body.
pub type Reply = (StatusCode, &'static str, Bytes);

/// Serves HTTP/1 on `listener` until the task is dropped. `route` gets the method, the path and
/// the `Accept` header of each request; a `HEAD` request gets its answer without the body.
pub async fn serve<R>(listener: tokio::net::TcpListener, route: R)
where
    R: Fn(&Method, &str, Option<&str>) -> Reply + Clone + Send + Sync + 'static,
{
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let route = route.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let accept = req
                    .headers()
                    .get(hyper::header::ACCEPT)
                    .and_then(|v| v.to_str().ok());
                let (code, content_type, body) = route(req.method(), req.uri().path(), accept);
                let body = if req.method() == Method::HEAD {
                    Bytes::new()
                } else {
                    body
                };
                let response = Response::builder()
                    .status(code)
                    .header(hyper::header::CONTENT_TYPE, content_type)
                    .body(Full::new(body))
                    .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())));
                async move { Ok::<_, Infallible>(response) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await;
        });
    }
}
