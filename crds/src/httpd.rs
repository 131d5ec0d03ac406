//! A minimal HTTP/1.1 server for the metrics and health endpoints of every havip
//! binary: `GET /metrics` (Prometheus text format), `GET /healthz` (the process
//! runs), `GET /readyz` (the binary says it is ready). Anything else is 404.
//!
//! It reads one request per connection with a short timeout and a size bound, so a
//! slow or hostile scraper cannot hold it up.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// What the endpoints serve.
pub trait Endpoints: Send + Sync + 'static {
    /// The Prometheus text exposition.
    fn metrics(&self) -> String;
    /// Whether the binary is ready (for `/readyz`), with a short reason when not.
    fn ready(&self) -> Result<(), String>;
}

/// Binds `addr` and serves until the task is dropped. Returns the bound address
/// (useful with port 0) and the server task.
pub async fn serve(
    addr: SocketAddr,
    endpoints: Arc<dyn Endpoints>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let endpoints = endpoints.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 2048];
                let mut n = 0;
                let read = tokio::time::timeout(Duration::from_secs(2), async {
                    while n < buf.len() {
                        let m = stream.read(&mut buf[n..]).await?;
                        if m == 0 {
                            break;
                        }
                        n += m;
                        if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                            break;
                        }
                    }
                    Ok::<_, std::io::Error>(())
                })
                .await;
                if !matches!(read, Ok(Ok(()))) {
                    return;
                }
                let request = String::from_utf8_lossy(&buf[..n]);
                let path = request.split_whitespace().nth(1).unwrap_or("/");
                let (status, ctype, body) = match path {
                    "/metrics" => ("200 OK", "text/plain; version=0.0.4; charset=utf-8", endpoints.metrics()),
                    "/healthz" | "/livez" => ("200 OK", "text/plain", "ok\n".to_owned()),
                    "/readyz" => match endpoints.ready() {
                        Ok(()) => ("200 OK", "text/plain", "ok\n".to_owned()),
                        Err(why) => ("503 Service Unavailable", "text/plain", format!("{why}\n")),
                    },
                    _ => ("404 Not Found", "text/plain", "not found\n".to_owned()),
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(body.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    Ok((local, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(bool);
    impl Endpoints for Fixed {
        fn metrics(&self) -> String {
            "havip_up 1\n".to_owned()
        }
        fn ready(&self) -> Result<(), String> {
            if self.0 { Ok(()) } else { Err("not yet".to_owned()) }
        }
    }

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes()).await.expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        out
    }

    #[tokio::test]
    async fn serves_metrics_health_and_readiness() {
        let (addr, task) = serve("127.0.0.1:0".parse().expect("addr"), Arc::new(Fixed(false))).await.expect("bind");
        let m = get(addr, "/metrics").await;
        assert!(m.starts_with("HTTP/1.1 200") && m.ends_with("havip_up 1\n"), "{m}");
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        let r = get(addr, "/readyz").await;
        assert!(r.starts_with("HTTP/1.1 503") && r.contains("not yet"), "{r}");
        assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
        task.abort();
        let (addr, task) = serve("127.0.0.1:0".parse().expect("addr"), Arc::new(Fixed(true))).await.expect("bind");
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        task.abort();
    }
}
