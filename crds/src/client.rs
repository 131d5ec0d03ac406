//! The Kubernetes client of the long-running binaries (agent and operator): kube's own
//! stack (base URI, retries of 429/503/504, authentication, extra headers) over a TCP
//! connector that notices a dead connection to the API server.
//!
//! kube's default connector sets no TCP keepalive and no read timeout; its watcher
//! notices a silent watch only after the watch's own timeout (290 s) and 5 s more. A
//! watch whose connection died without a FIN or RST reaching the node — the API server
//! restarted or a load balancer in front of it failed over while the node's network
//! dropped packets — would then miss every change for five minutes: a deleted pair's
//! VIPs and files would stay, an edit or a planned-move request would wait. With
//! keepalive probes after [`KEEPALIVE_IDLE`] of silence, every [`KEEPALIVE_INTERVAL`],
//! [`KEEPALIVE_PROBES`] of them, a dead connection fails within 25 s (at once, by the
//! peer's reset, when the API server is back at that address), and the watcher resumes
//! on a new one. [`USER_TIMEOUT`] bounds how long sent data may stay unacknowledged.
//!
//! The cost is one empty segment each way per 10 s of an idle connection, nothing on
//! the API server's side.

use kube::client::ConfigExt;
use kube::client::retry::RetryPolicy;
use std::time::Duration;
use tower::retry::RetryLayer;
use tower::{BoxError, ServiceBuilder};

/// Silence on a connection before the first keepalive probe.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// Between keepalive probes.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Unanswered probes before the connection is declared dead.
pub const KEEPALIVE_PROBES: u32 = 3;
/// How long sent data may stay unacknowledged before the connection is declared dead.
pub const USER_TIMEOUT: Duration = Duration::from_secs(30);

/// A client for `config` whose connections carry TCP keepalive (see the module).
/// `config.proxy_url` is not supported (as with kube's default client without its
/// proxy features).
pub fn build(config: kube::Config) -> Result<kube::Client, kube::Error> {
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    http.set_keepalive(Some(KEEPALIVE_IDLE));
    http.set_keepalive_interval(Some(KEEPALIVE_INTERVAL));
    http.set_keepalive_retries(Some(KEEPALIVE_PROBES));
    http.set_tcp_user_timeout(Some(USER_TIMEOUT));
    let https = config.rustls_https_connector_with_connector(http)?;
    let client: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.default_retry.then(|| RetryLayer::new(RetryPolicy::server_retry())))
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(client);
    Ok(kube::Client::new(service, config.default_namespace))
}

/// [`build`] from the usual inference (KUBECONFIG, `~/.kube/config`, in-cluster).
pub async fn infer() -> Result<kube::Client, kube::Error> {
    let config = kube::Config::infer().await.map_err(kube::Error::InferConfig)?;
    build(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stack builds from a plain configuration, and a request through it reaches the
    /// connector: a refused connection is an error of the request, not of the build.
    #[tokio::test]
    async fn the_client_builds_and_reports_a_refused_connection() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        drop(listener);
        let url: http::Uri = format!("http://127.0.0.1:{port}").parse().expect("uri");
        let client = build(kube::Config::new(url)).expect("client");
        let version = client.apiserver_version().await;
        assert!(version.is_err(), "nothing listens on {port}: {version:?}");
    }
}
