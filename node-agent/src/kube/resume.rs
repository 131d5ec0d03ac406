//! Which pairs an agent resumes from their configuration snapshots when the API server
//! has not answered its first lists (pure: the snapshots as read, and this node's
//! interface addresses, in; a decision per pair out). `pairs::start_from_snapshots`
//! observes (reads the files and the kernel) and applies (starts the runtimes).

use super::config::{ClusterView, agent_config};
use super::plan::RunMemory;
use super::snapshot::{PairSnapshot, SnapshotError};
use crate::config::AgentConfig;
use havip_crds::{FloatingIP, HAPair};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

/// What to do with one pair's snapshot.
pub(super) enum Resume {
    /// Run the pair on this configuration; the loop remembers it as `memory`.
    Start {
        /// The pair's name.
        name: String,
        /// The pair as the snapshot holds it.
        pair: Box<HAPair>,
        /// Its configuration, built with the same code as a live one.
        cfg: Box<AgentConfig>,
        /// What the loop remembers of it (the snapshot's digest among it, so that the
        /// first live pass rewrites the file only if something changed).
        memory: Box<RunMemory>,
    },
    /// The snapshot's pair does not name this node (it was removed from the pair after
    /// the snapshot was written and the file not yet swept): nothing to run.
    NotAMember {
        /// The pair's name.
        name: String,
    },
    /// The snapshot cannot be read, or no configuration can be built from it: the pair
    /// waits for the API server (a warning says why).
    Refused {
        /// The pair's name.
        name: String,
        /// Why.
        why: String,
    },
}

/// The interface names the `interface:` heartbeat paths of the readable snapshots name
/// (whose addresses the configuration needs).
pub(super) fn interfaces_named(loaded: &[(String, Result<PairSnapshot, SnapshotError>)]) -> Vec<String> {
    let mut names: Vec<String> = loaded
        .iter()
        .filter_map(|(_, s)| s.as_ref().ok())
        .flat_map(|s| s.pair.spec.heartbeat.paths.iter().filter_map(|p| p.interface.clone()))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// One decision per snapshot, in order: this node (`node`, its operator namespace
/// `namespace` where the key Secrets are, its addresses on the named interfaces
/// `local_interfaces`) resumes every readable snapshot of a pair it is a member of and
/// whose configuration builds.
pub(super) fn resume(
    node: &str,
    namespace: &str,
    loaded: Vec<(String, Result<PairSnapshot, SnapshotError>)>,
    local_interfaces: &BTreeMap<String, IpAddr>,
) -> Vec<Resume> {
    loaded
        .into_iter()
        .map(|(name, snap)| {
            let snap = match snap {
                Ok(s) => s,
                Err(e) => return Resume::Refused { name, why: format!("unreadable snapshot: {e}") },
            };
            if !snap.pair.spec.members.iter().any(|m| m.node == node) {
                return Resume::NotAMember { name };
            }
            let nodes: Vec<Arc<k8s_openapi::api::core::v1::Node>> = snap.nodes.iter().cloned().map(Arc::new).collect();
            let secrets: Vec<Arc<k8s_openapi::api::core::v1::Secret>> =
                snap.secrets.iter().cloned().map(Arc::new).collect();
            let fips: Vec<&FloatingIP> = snap.fips.iter().collect();
            let view = ClusterView { node, namespace, nodes: &nodes, fips: &fips, secrets: &secrets, local_interfaces };
            match agent_config(&snap.pair, &view) {
                Ok(cfg) => {
                    let mut memory = RunMemory::started(&cfg, snap.pair.metadata.uid.clone());
                    memory.snapshot = Some(snap.digest());
                    Resume::Start { name, pair: Box::new(snap.pair), cfg: Box::new(cfg), memory: Box::new(memory) }
                }
                Err(e) => {
                    Resume::Refused { name, why: format!("no configuration can be built from its snapshot: {e}") }
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]

    use super::{Resume, interfaces_named, resume};
    use crate::kube::snapshot::{PairSnapshot, SnapshotError};
    use havip_crds::{FloatingIP, HAPair};
    use k8s_openapi::api::core::v1::{Node, Secret};
    use std::collections::BTreeMap;
    use std::net::IpAddr;
    use std::path::PathBuf;
    use std::sync::Arc;

    const NS: &str = "havip-system";
    const KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    fn pair(name: &str, members: &[&str], interface: Option<&str>) -> HAPair {
        let path = match interface {
            Some(i) => serde_json::json!({"name": "mgmt", "interface": i}),
            None => serde_json::json!({"name": "data", "addressType": "InternalIP"}),
        };
        let members: Vec<serde_json::Value> =
            members.iter().enumerate().map(|(i, m)| serde_json::json!({"node": m, "priority": 200 - i})).collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "havip.io/v1alpha1", "kind": "HAPair",
            "metadata": {"name": name, "uid": format!("uid-{name}")},
            "spec": {"members": members, "heartbeat": {"paths": [path]}},
        }))
        .expect("pair")
    }

    fn node(name: &str, address: &str) -> Arc<Node> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "status": {"addresses": [{"type": "InternalIP", "address": address}]},
            }))
            .expect("node"),
        )
    }

    fn secret(pair: &str) -> Secret {
        let mut s: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("havip-{pair}-key"), "namespace": NS},
        }))
        .expect("secret");
        let mut data = BTreeMap::new();
        data.insert("key".to_owned(), k8s_openapi::ByteString(KEY.as_bytes().to_vec()));
        data.insert("keyId".to_owned(), k8s_openapi::ByteString(b"1".to_vec()));
        s.data = Some(data);
        s
    }

    fn fip(pair: &str) -> FloatingIP {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "havip.io/v1alpha1", "kind": "FloatingIP",
            "metadata": {"name": format!("{pair}-vip")},
            "spec": {"pair": pair, "address": "192.0.2.10/24"},
        }))
        .expect("fip")
    }

    /// The snapshot of pair `name` of `members`, as the loop writes it.
    fn snapshot(name: &str, members: &[&str], interface: Option<&str>) -> PairSnapshot {
        let nodes = vec![node("a", "10.0.0.1"), node("b", "10.0.0.2"), node("c", "10.0.0.3")];
        PairSnapshot::new(&pair(name, members, interface), &[fip(name)], &nodes, Some(&secret(name)))
    }

    fn loaded(s: PairSnapshot) -> (String, Result<PairSnapshot, SnapshotError>) {
        (s.pair.metadata.name.clone().unwrap_or_default(), Ok(s))
    }

    /// `name: start|not-a-member|refused (why)` per decision.
    fn summary(r: &[Resume]) -> Vec<String> {
        r.iter()
            .map(|d| match d {
                Resume::Start { name, .. } => format!("{name}: start"),
                Resume::NotAMember { name } => format!("{name}: not a member"),
                Resume::Refused { name, why } => format!("{name}: refused ({why})"),
            })
            .collect()
    }

    #[test]
    fn a_members_snapshot_resumes_with_its_configuration_and_is_remembered_with_its_digest() {
        let s = snapshot("web", &["a", "b"], None);
        let digest = s.digest();
        let out = resume("a", NS, vec![loaded(s)], &BTreeMap::new());
        let [Resume::Start { name, pair, cfg, memory }] = out.as_slice() else { panic!("{:?}", summary(&out)) };
        assert_eq!(name, "web");
        assert_eq!(pair.metadata.uid.as_deref(), Some("uid-web"));
        assert_eq!(cfg.vips.len(), 1, "its FloatingIP");
        assert_eq!(memory.uid.as_deref(), Some("uid-web"));
        assert_eq!(memory.snapshot, Some(digest), "the first live pass rewrites only a changed snapshot");
        assert_eq!(memory.revision, cfg.sm.config_revision);
    }

    #[test]
    fn a_pair_that_does_not_name_this_node_is_not_resumed() {
        let out = resume("c", NS, vec![loaded(snapshot("web", &["a", "b"], None))], &BTreeMap::new());
        assert_eq!(summary(&out), ["web: not a member"]);
    }

    #[test]
    fn an_unreadable_snapshot_is_refused_naming_its_file_and_the_others_still_resume() {
        let torn =
            SnapshotError::Format { path: PathBuf::from("/var/lib/havip/db.config.json"), reason: "torn".into() };
        let out = resume(
            "a",
            NS,
            vec![("db".to_owned(), Err(torn)), loaded(snapshot("web", &["a", "b"], None))],
            &BTreeMap::new(),
        );
        let s = summary(&out);
        assert_eq!(s.len(), 2, "{s:?}");
        assert!(s[0].starts_with("db: refused (unreadable snapshot: /var/lib/havip/db.config.json"), "{s:?}");
        assert_eq!(s[1], "web: start");
    }

    #[test]
    fn a_snapshot_without_this_nodes_path_address_is_refused_with_the_reason() {
        // The pair's only heartbeat path is on interface eth9, on which this node has no
        // address now: its configuration cannot be built.
        let s = snapshot("web", &["a", "b"], Some("eth9"));
        let out = resume("a", NS, vec![loaded(s)], &BTreeMap::new());
        let s = summary(&out);
        assert!(s[0].starts_with("web: refused (no configuration can be built from its snapshot: "), "{s:?}");
        // With the address there, the same snapshot resumes.
        let ifs: BTreeMap<String, IpAddr> = [("eth9".to_owned(), "10.1.0.1".parse().expect("ip"))].into();
        let out = resume("a", NS, vec![loaded(snapshot("web", &["a", "b"], Some("eth9")))], &ifs);
        assert_eq!(summary(&out), ["web: start"]);
    }

    #[test]
    fn the_interfaces_to_read_are_those_the_readable_snapshots_name_once_each() {
        let torn = SnapshotError::Format { path: PathBuf::from("x"), reason: "torn".into() };
        let loaded = vec![
            loaded(snapshot("a1", &["a", "b"], Some("eth1"))),
            loaded(snapshot("a2", &["a", "b"], Some("eth1"))),
            loaded(snapshot("a3", &["a", "b"], None)),
            ("a4".to_owned(), Err(torn)),
            loaded(snapshot("a5", &["a", "b"], Some("bond0"))),
        ];
        assert_eq!(interfaces_named(&loaded), ["bond0", "eth1"]);
    }
}
