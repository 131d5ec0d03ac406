//! The metrics and health endpoints every havip binary serves, over hyper's HTTP/1.1:
//! `GET /metrics` (the OpenMetrics text exposition `prometheus-client` writes, with the
//! OpenMetrics content type), `GET /healthz` and `/livez` (the process runs), `GET
//! /readyz` (the binary says it is ready, 503 with the reason when not). `HEAD` is
//! answered like `GET` without a body, another method on these paths gets 405, any
//! other path 404.
//!
//! A slow or hostile scraper cannot hold a connection: the request head must arrive
//! within 2 s, a connection serves one request and lives at most 10 s.

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ALLOW, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// The content type of `/metrics`: the OpenMetrics text format.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How long a client may take to send its request head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one connection may live.
const CONNECTION_LIMIT: Duration = Duration::from_secs(10);

/// What the endpoints serve.
pub trait Endpoints: Send + Sync + 'static {
    /// The OpenMetrics text exposition.
    fn metrics(&self) -> String;
    /// Whether the binary is ready (for `/readyz`), with a short reason when not.
    fn ready(&self) -> Result<(), String>;
}

/// Binds `addr` and serves until the task is dropped or aborted. Returns the bound
/// address (useful with port 0) and the server task.
pub async fn serve(
    addr: SocketAddr,
    endpoints: Arc<dyn Endpoints>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    tracing::warn!(address = %local, error = %e, "failed to accept a connection on the metrics endpoint");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let endpoints = endpoints.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| {
                    let response = respond(endpoints.as_ref(), req.method(), req.uri().path());
                    async move { Ok::<_, Infallible>(response) }
                });
                let connection = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .keep_alive(false)
                    .serve_connection(TokioIo::new(stream), service);
                let _ = tokio::time::timeout(CONNECTION_LIMIT, connection).await;
            });
        }
    });
    Ok((local, task))
}

/// The answer to `method path`.
fn respond(endpoints: &dyn Endpoints, method: &Method, path: &str) -> Response<Full<Bytes>> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    let known = matches!(path, "/metrics" | "/healthz" | "/livez" | "/readyz");
    let (status, content_type, body) = if !known {
        (StatusCode::NOT_FOUND, PLAIN, "not found\n".to_owned())
    } else if method != Method::GET && method != Method::HEAD {
        (StatusCode::METHOD_NOT_ALLOWED, PLAIN, "method not allowed\n".to_owned())
    } else {
        match path {
            "/metrics" => (StatusCode::OK, OPENMETRICS, endpoints.metrics()),
            "/readyz" => match endpoints.ready() {
                Ok(()) => (StatusCode::OK, PLAIN, "ok\n".to_owned()),
                Err(why) => (StatusCode::SERVICE_UNAVAILABLE, PLAIN, format!("{why}\n")),
            },
            _ => (StatusCode::OK, PLAIN, "ok\n".to_owned()),
        }
    };
    let length = body.len();
    let body = if method == Method::HEAD { Bytes::new() } else { Bytes::from(body) };
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, hyper::header::HeaderValue::from_static(content_type));
    if method == Method::HEAD {
        headers.insert(hyper::header::CONTENT_LENGTH, hyper::header::HeaderValue::from(length));
    }
    if status == StatusCode::METHOD_NOT_ALLOWED {
        headers.insert(ALLOW, hyper::header::HeaderValue::from_static("GET, HEAD"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::{Arc, Duration, Endpoints, OPENMETRICS, SocketAddr, serve};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    struct Fixed(bool);
    impl Endpoints for Fixed {
        fn metrics(&self) -> String {
            "havip_up 1\n# EOF\n".to_owned()
        }
        fn ready(&self) -> Result<(), String> {
            if self.0 { Ok(()) } else { Err("not yet".to_owned()) }
        }
    }

    async fn send(addr: SocketAddr, request: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(request.as_bytes()).await.expect("write");
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out))
            .await
            .expect("the server closes the connection")
            .expect("read");
        out
    }

    async fn get(addr: SocketAddr, path: &str) -> String {
        send(addr, &format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n")).await
    }

    #[tokio::test]
    async fn serves_metrics_health_and_readiness() {
        let (addr, task) = serve("127.0.0.1:0".parse().expect("addr"), Arc::new(Fixed(false))).await.expect("bind");
        let m = get(addr, "/metrics").await;
        assert!(m.starts_with("HTTP/1.1 200") && m.ends_with("havip_up 1\n# EOF\n"), "{m}");
        assert!(m.to_lowercase().contains(&format!("content-type: {OPENMETRICS}")), "{m}");
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/livez").await.starts_with("HTTP/1.1 200"));
        let r = get(addr, "/readyz").await;
        assert!(r.starts_with("HTTP/1.1 503") && r.contains("not yet"), "{r}");
        assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
        // The e2e helpers' plain HTTP/1.0 request without a Host header.
        let old = send(addr, "GET /metrics HTTP/1.0\r\n\r\n").await;
        assert!(old.contains(" 200 ") && old.ends_with("# EOF\n"), "{old}");
        task.abort();
        let (addr, task) = serve("127.0.0.1:0".parse().expect("addr"), Arc::new(Fixed(true))).await.expect("bind");
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        task.abort();
    }

    #[tokio::test]
    async fn head_has_no_body_and_other_methods_are_refused() {
        let (addr, task) = serve("127.0.0.1:0".parse().expect("addr"), Arc::new(Fixed(true))).await.expect("bind");
        let h = send(addr, "HEAD /metrics HTTP/1.1\r\nhost: x\r\n\r\n").await;
        assert!(h.starts_with("HTTP/1.1 200") && h.ends_with("\r\n\r\n"), "{h}");
        let p = send(addr, "POST /metrics HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n").await;
        assert!(p.starts_with("HTTP/1.1 405") && p.to_lowercase().contains("allow: get, head"), "{p}");
        task.abort();
    }

    #[tokio::test]
    async fn a_client_that_never_sends_its_request_is_dropped() {
        let (addr, task) = serve("127.0.0.1:0".parse().expect("addr"), Arc::new(Fixed(true))).await.expect("bind");
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET /metr").await.expect("write");
        let mut out = Vec::new();
        // The server gives up after the header timeout (2 s) and closes the connection.
        let read = tokio::time::timeout(Duration::from_secs(6), s.read_to_end(&mut out)).await;
        assert!(read.is_ok(), "the connection was still open after 6 s");
        // Meanwhile others are served.
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        task.abort();
    }
}
