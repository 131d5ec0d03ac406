//! The last applied configuration of each pair, kept in the state directory
//! (`<pair>.config.json`), so that an agent restarted while the API server is unreachable
//! resumes its pairs — heartbeats, adoption of the VIPs it holds, takeover under the
//! standalone rules — instead of running nothing while its VIPs stay in the kernel.
//!
//! It holds the objects the configuration was built from (the HAPair, its FloatingIPs,
//! the member Nodes' names and addresses, the heartbeat-key Secret), slimmed, and is
//! rebuilt with the same code as a live configuration. The file holds the pair's
//! heartbeat keys: it is written with mode 0600, like the rest of the state directory
//! only root reads.

use havip_crds::{FloatingIP, HAPair};
use k8s_openapi::api::core::v1::{Node, NodeStatus, Secret};
use kube::ResourceExt;
use serde::{Deserialize, Serialize};
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The snapshot format; a file of another version is ignored (with a warning).
const VERSION: u32 = 1;

/// What a pair's configuration was built from.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PairSnapshot {
    version: u32,
    /// The HAPair.
    pub pair: HAPair,
    /// Its FloatingIPs.
    pub fips: Vec<FloatingIP>,
    /// The member Nodes (name, labels and addresses only).
    pub nodes: Vec<Node>,
    /// The pair's key Secret (when it exists).
    pub secrets: Vec<Secret>,
}

/// Why a snapshot could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// File system.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Not a snapshot of this version.
    #[error("{path}: not a configuration snapshot this agent can read: {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// The snapshot file of `pair`.
pub(super) fn path(dir: &Path, pair: &str) -> PathBuf {
    dir.join(format!("{pair}.config.json"))
}

impl PairSnapshot {
    /// The snapshot of `pair` as configured from these objects; only the member Nodes
    /// and the pair's key Secret are kept, without managed fields.
    pub fn new(pair: &HAPair, fips: &[FloatingIP], nodes: &[Arc<Node>], secret: Option<&Secret>) -> PairSnapshot {
        let mut pair = pair.clone();
        pair.metadata.managed_fields = None;
        let fips = fips
            .iter()
            .map(|f| {
                let mut f = f.clone();
                f.metadata.managed_fields = None;
                f
            })
            .collect();
        let members: Vec<&str> = pair.spec.members.iter().map(|m| m.node.as_str()).collect();
        let nodes = nodes
            .iter()
            .filter(|n| members.contains(&n.name_any().as_str()))
            .map(|n| {
                let mut slim = Node::default();
                slim.metadata.name = n.metadata.name.clone();
                slim.metadata.labels = n.metadata.labels.clone();
                slim.status = Some(NodeStatus {
                    addresses: n.status.as_ref().and_then(|s| s.addresses.clone()),
                    ..NodeStatus::default()
                });
                slim
            })
            .collect();
        let secrets = secret
            .map(|s| {
                let mut s = s.clone();
                s.metadata.managed_fields = None;
                vec![s]
            })
            .unwrap_or_default();
        PairSnapshot { version: VERSION, pair, fips, nodes, secrets }
    }

    /// A digest of the content (to write only what changed).
    pub fn digest(&self) -> u64 {
        let mut h = DefaultHasher::new();
        serde_json::to_string(self).unwrap_or_default().hash(&mut h);
        h.finish()
    }

    /// Writes it atomically (a temporary file renamed over the old one), mode 0600.
    pub fn save(&self, dir: &Path) -> Result<(), SnapshotError> {
        let target = path(dir, &self.pair.name_any());
        let data = serde_json::to_vec(self)
            .map_err(|e| SnapshotError::Format { path: target.clone(), reason: e.to_string() })?;
        crate::state::write_atomic(&target, &data).map_err(|source| SnapshotError::Io { path: target.clone(), source })
    }

    /// Reads the snapshot of `pair`.
    pub fn load(dir: &Path, pair: &str) -> Result<PairSnapshot, SnapshotError> {
        let p = path(dir, pair);
        let data = std::fs::read(&p).map_err(|source| SnapshotError::Io { path: p.clone(), source })?;
        let s: PairSnapshot = serde_json::from_slice(&data)
            .map_err(|e| SnapshotError::Format { path: p.clone(), reason: e.to_string() })?;
        if s.version != VERSION {
            return Err(SnapshotError::Format {
                path: p,
                reason: format!("version {} (expected {VERSION})", s.version),
            });
        }
        if s.pair.name_any() != pair {
            return Err(SnapshotError::Format { path: p, reason: format!("holds pair {}", s.pair.name_any()) });
        }
        Ok(s)
    }

    /// The pairs with a snapshot in `dir`.
    pub fn pairs_in(dir: &Path) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
        let mut out: Vec<String> = rd
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".config.json")).map(str::to_owned))
            .filter(|n| !n.starts_with('.'))
            .collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::PairSnapshot;
    use havip_crds::HAPair;
    use k8s_openapi::api::core::v1::Node;
    use std::sync::Arc;

    fn pair() -> HAPair {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "havip.io/v1alpha1", "kind": "HAPair",
            "metadata": {"name": "web", "uid": "u1", "managedFields": [{"manager": "kubectl"}]},
            "spec": {"members": [{"node": "n0", "priority": 200}, {"node": "n1", "priority": 100}],
                     "heartbeat": {"paths": [{"name": "data", "addressType": "InternalIP"}]}},
        }))
        .expect("pair")
    }

    fn node(name: &str) -> Arc<Node> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "labels": {"a": "b"}},
                "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                           "images": [{"names": ["big"], "sizeBytes": 1}]},
            }))
            .expect("node"),
        )
    }

    #[test]
    fn a_snapshot_keeps_only_what_the_configuration_needs_and_round_trips_with_mode_0600() {
        let dir = tempfile::tempdir().expect("tmp");
        let s = PairSnapshot::new(&pair(), &[], &[node("n0"), node("n1"), node("other")], None);
        assert_eq!(s.nodes.len(), 2, "only the members");
        assert!(s.nodes[0].status.as_ref().is_some_and(|st| st.images.is_none()), "no images");
        assert!(s.pair.metadata.managed_fields.is_none());
        s.save(dir.path()).expect("save");
        let mode = {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(dir.path().join("web.config.json")).expect("meta").permissions().mode() & 0o777
        };
        assert_eq!(mode, 0o600);
        let back = PairSnapshot::load(dir.path(), "web").expect("load");
        assert_eq!(back.digest(), s.digest());
        assert_eq!(PairSnapshot::pairs_in(dir.path()), vec!["web".to_owned()]);
    }

    #[test]
    fn a_torn_or_foreign_snapshot_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join("web.config.json"), "{torn").expect("write");
        let e = PairSnapshot::load(dir.path(), "web").expect_err("torn");
        assert!(e.to_string().contains("web.config.json"), "{e}");
        let s = PairSnapshot::new(&pair(), &[], &[], None);
        s.save(dir.path()).expect("save");
        std::fs::rename(dir.path().join("web.config.json"), dir.path().join("db.config.json")).expect("mv");
        let e = PairSnapshot::load(dir.path(), "db").expect_err("foreign");
        assert!(e.to_string().contains("holds pair web"), "{e}");
    }
}
