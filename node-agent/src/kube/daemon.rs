//! The Kubernetes mode's process (`havip-agent kubernetes`): the client, the metrics
//! endpoint and [`super::run`].

use crate::metrics::AgentMetrics;
use std::sync::Arc;

/// Runs the Kubernetes mode with its metrics endpoint on `metrics_address` (`off`: none).
pub async fn serve(opts: super::KubeAgentOptions, metrics_address: String) -> Result<(), String> {
    // TCP keepalive: a watch whose connection died silently fails within seconds
    // instead of minutes (havip_crds::client).
    let client = havip_crds::client::infer().await.map_err(|e| format!("failed to build a Kubernetes client: {e}"))?;
    let metrics = Arc::new(AgentMetrics::new());
    let _http = match crate::metrics::parse_address(&metrics_address)? {
        None => None,
        Some(addr) => {
            let ep = Arc::new(MetricsOnly(metrics.clone()));
            let (bound, t) = havip_endpoints::serve(addr, ep)
                .await
                .map_err(|e| format!("failed to serve metrics on {addr}: {e}"))?;
            tracing::info!(address = %bound, "metrics and health endpoints");
            Some(t)
        }
    };
    super::run(client, opts, metrics).await.map_err(|e| e.to_string())
}

struct MetricsOnly(Arc<AgentMetrics>);

impl havip_endpoints::Endpoints for MetricsOnly {
    fn metrics(&self) -> String {
        self.0.encode()
    }
    fn ready(&self) -> Result<(), String> {
        Ok(())
    }
}
