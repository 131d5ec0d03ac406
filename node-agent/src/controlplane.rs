//! The control-plane mode's packaging: `havip-agent control-plane manifest` prints the
//! static pod that runs this node's member of the API VIP's pair from
//! `/etc/kubernetes/manifests` (the agent in standalone mode, with the votes of the
//! control-plane members and the local API server's readiness; docs/control-plane.md).
//! The systemd unit for the same job is `examples/control-plane/havip-control-plane.service`.

use crate::standalone::config::StandaloneFile;
use serde_json::json;
use std::path::{Path, PathBuf};

/// The DaemonSet agent's heartbeat port: a control-plane node runs both agents on the
/// host network, so the control-plane pair needs another.
pub const DAEMONSET_HEARTBEAT_PORT: u16 = 7946;

/// What the static pod is made of.
#[derive(Debug, Clone)]
pub struct ManifestOptions {
    /// The pair file on the node (mounted read-only with its directory).
    pub config: PathBuf,
    /// This node's member name.
    pub node: String,
    /// The agent's image.
    pub image: String,
    /// The state directory on the node.
    pub state_dir: PathBuf,
    /// The metrics and health address (on the host network).
    pub metrics_address: String,
}

/// Loads and checks `opts.config` as member `opts.node` would (so that a wrong file fails
/// here rather than in a crash-looping static pod), and returns the static pod manifest.
pub fn manifest(opts: &ManifestOptions) -> Result<String, String> {
    let file = StandaloneFile::load(&opts.config).map_err(|e| format!("{}: {e}", opts.config.display()))?;
    let ca_dir = file.api_server.as_ref().and_then(|a| a.ca_file.parent().map(Path::to_path_buf));
    let cfg = file.into_agent_config(Some(&opts.node)).map_err(|e| format!("{}: {e}", opts.config.display()))?;
    if cfg.quorum.is_none() && cfg.witness.is_none() && cfg.members.len() > 1 {
        return Err(format!(
            "{}: a control-plane pair needs arbitration without the API: `quorum:` (the members vote; three or more \
             survive the loss of one) or a `witness:` (a pair that stays at two members)",
            opts.config.display()
        ));
    }
    if cfg.api_server.is_none() {
        return Err(format!(
            "{}: a control-plane pair needs `apiServer:` (the local kube-apiserver's /readyz gates every member)",
            opts.config.display()
        ));
    }
    if cfg.heartbeat_port == DAEMONSET_HEARTBEAT_PORT {
        return Err(format!(
            "{}: heartbeat.port {DAEMONSET_HEARTBEAT_PORT} is the havip DaemonSet's on the same host network; give the \
             control-plane pair another (docs/control-plane.md uses 7950)",
            opts.config.display()
        ));
    }
    let config_dir = opts.config.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("/"));
    let mut mounts = vec![
        json!({"name": "config", "mountPath": config_dir, "readOnly": true}),
        json!({"name": "state", "mountPath": opts.state_dir}),
    ];
    let mut volumes = vec![
        json!({"name": "config", "hostPath": {"path": config_dir, "type": "Directory"}}),
        json!({"name": "state", "hostPath": {"path": opts.state_dir, "type": "DirectoryOrCreate"}}),
    ];
    if let Some(ca) = ca_dir.filter(|d| !config_dir.starts_with(d) && !d.starts_with(&config_dir)) {
        mounts.push(json!({"name": "pki", "mountPath": ca, "readOnly": true}));
        volumes.push(json!({"name": "pki", "hostPath": {"path": ca, "type": "DirectoryOrCreate"}}));
    }
    let health_port = opts.metrics_address.rsplit(':').next().and_then(|p| p.parse::<u16>().ok());
    let host = opts.metrics_address.rsplit_once(':').map(|(h, _)| h.trim_matches(['[', ']']).to_owned());
    let mut container = json!({
        "name": "havip-agent",
        "image": opts.image,
        "imagePullPolicy": "IfNotPresent",
        "args": [
            "standalone",
            "--config", opts.config,
            "--node", opts.node,
            "--state-dir", opts.state_dir,
            "--metrics-address", opts.metrics_address,
        ],
        "securityContext": {
            "capabilities": {"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]},
            "readOnlyRootFilesystem": true,
        },
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
        "volumeMounts": mounts,
    });
    if let (Some(port), Some(host)) = (health_port, host) {
        container["livenessProbe"] = json!({
            "httpGet": {"host": host, "port": port, "path": "/healthz"},
            "periodSeconds": 10,
            "failureThreshold": 3,
        });
    }
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "havip-control-plane",
            "namespace": "kube-system",
            "labels": {"app.kubernetes.io/name": "havip", "app.kubernetes.io/component": "control-plane-vip"},
        },
        "spec": {
            "hostNetwork": true,
            "dnsPolicy": "ClusterFirstWithHostNet",
            "priority": 2000001000,
            "priorityClassName": "system-node-critical",
            "containers": [container],
            "volumes": volumes,
        },
    });
    let yaml = serde_yaml::to_string(&pod).map_err(|e| e.to_string())?;
    Ok(format!(
        "# havip control-plane VIP member {node} of pair {pair} (generated by `havip-agent control-plane manifest`).\n\
         # Put it in /etc/kubernetes/manifests/ on this control-plane node; docs/control-plane.md.\n{yaml}",
        node = opts.node,
        pair = cfg.pair
    ))
}
