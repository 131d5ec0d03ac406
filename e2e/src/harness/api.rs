//! Kubernetes API helpers shared by the local lab ([`crate::harness::kubelab`]) and the cluster
//! providers ([`crate::harness::cluster`]): applying manifests, reading a pair and its Lease, and
//! running the `kubectl-havip` plugin. Nothing here knows how a cluster is run.

use havip_crds::{FloatingIP, HAPair};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use std::path::Path;
use std::process::Command;

/// The namespace of the operator, the agents, the pair Leases and key Secrets.
pub const NAMESPACE: &str = "havip-system";

/// A manifest that could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// A document is not YAML.
    #[error("invalid manifest: {0}")]
    Yaml(#[from] serde_yaml::Error),
    /// A kind [`apply_documents`] does not apply.
    #[error("unsupported kind {0}")]
    UnsupportedKind(String),
    /// The API server refused it.
    #[error("apply {kind}/{name}: {source}")]
    Api {
        /// The object's kind.
        kind: String,
        /// Its name.
        name: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
}

/// Applies HAPair/FloatingIP/VIPPool YAML documents server-side (field manager `havip-e2e`).
pub async fn apply_documents(client: &kube::Client, yaml: &str) -> Result<(), ApplyError> {
    use serde::Deserialize;
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let v = serde_json::Value::deserialize(doc)?;
        if v.is_null() {
            continue;
        }
        let kind = v["kind"].as_str().unwrap_or_default().to_owned();
        let name = v["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        let pp = PatchParams::apply("havip-e2e").force();
        match kind.as_str() {
            "HAPair" => Api::<HAPair>::all(client.clone()).patch(&name, &pp, &Patch::Apply(&v)).await.map(drop),
            "FloatingIP" => Api::<FloatingIP>::all(client.clone()).patch(&name, &pp, &Patch::Apply(&v)).await.map(drop),
            "VIPPool" => {
                Api::<havip_crds::VIPPool>::all(client.clone()).patch(&name, &pp, &Patch::Apply(&v)).await.map(drop)
            }
            other => return Err(ApplyError::UnsupportedKind(other.to_owned())),
        }
        .map_err(|source| ApplyError::Api { kind, name, source })?;
    }
    Ok(())
}

/// The pair `name`.
pub async fn get_pair(client: &kube::Client, name: &str) -> kube::Result<HAPair> {
    Api::<HAPair>::all(client.clone()).get(name).await
}

/// The Lease of pair `pair`: (holder, epoch = `leaseTransitions`).
pub async fn get_lease(client: &kube::Client, pair: &str) -> kube::Result<(Option<String>, i64)> {
    let l = Api::<Lease>::namespaced(client.clone(), NAMESPACE).get(&havip_crds::lease::pair_lease_name(pair)).await?;
    let s = l.spec.unwrap_or_default();
    Ok((s.holder_identity.filter(|h| !h.is_empty()), i64::from(s.lease_transitions.unwrap_or(0))))
}

/// The first EXTERNAL-IP of a LoadBalancer Service (`status.loadBalancer.ingress[0].ip`),
/// if it has one.
pub fn external_ip(svc: &k8s_openapi::api::core::v1::Service) -> Option<std::net::IpAddr> {
    svc.status.as_ref()?.load_balancer.as_ref()?.ingress.as_ref()?.first()?.ip.as_deref()?.parse().ok()
}

/// [`run_plugin`], killed after `limit`: while etcd is down the API server holds a request
/// for its own 60 s timeout, and the plugin's `--timeout` bounds only the wait for the
/// agents' answer — a chaos nemesis stalled a minute in such a call.
pub fn run_plugin_within(bin: &Path, kubeconfig: &Path, args: &[&str], limit: std::time::Duration) -> (bool, String) {
    let child = Command::new(bin)
        .env("KUBECONFIG", kubeconfig)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return (false, format!("{}: {e}", bin.display())),
    };
    let deadline = std::time::Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return (false, format!("{}: no answer within {limit:?} (killed)", bin.display()));
            }
        }
    }
    plugin_outcome(bin, child.wait_with_output())
}

/// A plugin run's (success, stdout and stderr).
fn plugin_outcome(bin: &Path, out: std::io::Result<std::process::Output>) -> (bool, String) {
    match out {
        Ok(o) => (
            o.status.success(),
            format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
        ),
        Err(e) => (false, format!("{}: {e}", bin.display())),
    }
}

/// Runs `kubectl-havip <args>` with `kubeconfig`; (success, stdout and stderr).
pub fn run_plugin(bin: &Path, kubeconfig: &Path, args: &[&str]) -> (bool, String) {
    plugin_outcome(bin, Command::new(bin).env("KUBECONFIG", kubeconfig).args(args).output())
}
