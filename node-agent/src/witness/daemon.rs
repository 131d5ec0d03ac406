//! The witness daemon (`havip-agent witness`): loads the key ring and the state file,
//! binds, serves until SIGTERM/SIGINT; and `havip-agent witness-key`, which prints a
//! member's key.

use std::path::PathBuf;
use std::sync::Arc;

/// The witness key files (`--key-file`, `--key-id`, and the previous key during a rotation).
#[derive(Debug, Clone)]
pub struct WitnessKeys {
    /// The current key.
    pub key_file: PathBuf,
    /// Its id.
    pub key_id: u32,
    /// The previous key, still accepted during a rotation.
    pub previous_key_file: Option<PathBuf>,
    /// Its id.
    pub previous_key_id: Option<u32>,
}

/// Serves the witness on `listen` until SIGTERM or SIGINT.
pub async fn run(
    listen: std::net::SocketAddr,
    keys: WitnessKeys,
    state_dir: PathBuf,
    metrics_address: String,
    max_pairs: usize,
) -> Result<(), String> {
    use crate::config::{KeySource, keyring};
    use crate::witness::{WitnessMetrics, WitnessOptions, WitnessState, server};
    let previous = match &keys.previous_key_file {
        Some(f) => Some(std::fs::read_to_string(f).map_err(|e| format!("failed to read {}: {e}", f.display()))?),
        None => None,
    };
    let keys = keyring(
        "witness",
        KeySource { key: None, key_file: Some(&keys.key_file) },
        keys.key_id,
        previous.as_deref(),
        keys.previous_key_id,
    )
    .map_err(|e| e.to_string())?;
    let state = WitnessState::new(&state_dir);
    let _lock = state.lock().map_err(|e| e.to_string())?;
    // Refuse a bad state file before binding: a witness that starts empty could grant
    // an epoch twice.
    state.load().map_err(|e| e.to_string())?;
    let sock = server::bind(listen).await.map_err(|e| e.to_string())?;
    let metrics = Arc::new(WitnessMetrics::new());
    let _http = match crate::metrics::parse_address(&metrics_address)? {
        None => None,
        Some(addr) => {
            let (bound, t) = havip_endpoints::serve(addr, Arc::new(WitnessEndpoints(metrics.clone())))
                .await
                .map_err(|e| format!("failed to serve metrics on {addr}: {e}"))?;
            tracing::info!(address = %bound, "metrics and health endpoints");
            Some(t)
        }
    };
    tracing::info!(listen = %listen, state = %state.path().display(), max_pairs, "havip witness serving");
    let serve = server::serve(sock, WitnessOptions { keys, state, max_pairs }, metrics);
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    tokio::select! {
        r = serve => r.map_err(|e| e.to_string()),
        _ = term.recv() => Ok(()),
        _ = int.recv() => Ok(()),
    }
}

/// The hex member key of `member` of `pair` under the witness key in `key_file`.
pub fn member_key_hex(key_file: &std::path::Path, pair: &str, member: &str) -> Result<String, String> {
    let text = std::fs::read_to_string(key_file).map_err(|e| format!("failed to read {}: {e}", key_file.display()))?;
    let secret = crate::config::parse_hex_key(&text).map_err(|e| format!("{}: {e}", key_file.display()))?;
    for (what, name) in [("pair", pair), ("member", member)] {
        if name.is_empty() || name.len() > havip_crds::wire::MAX_NAME {
            return Err(format!("--{what} must have 1 to {} bytes", havip_crds::wire::MAX_NAME));
        }
    }
    let key = havip_crds::witness::member_key(&havip_crds::wire::Key { id: 0, secret }, pair, member);
    Ok(key.secret.iter().map(|b| format!("{b:02x}")).collect())
}

struct WitnessEndpoints(Arc<crate::witness::WitnessMetrics>);

impl havip_endpoints::Endpoints for WitnessEndpoints {
    fn metrics(&self) -> String {
        self.0.encode()
    }
    fn ready(&self) -> Result<(), String> {
        Ok(())
    }
}
