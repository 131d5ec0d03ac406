//! Helpers for the tests against a real kube-apiserver: CRDs, Nodes, the operator as a
//! process, simulated agents (status entries by SSA with the agents' field managers,
//! Lease compare-and-swap), polling with deadlines, Events and metrics. What needs no
//! havip binary is in [`api`] (shared with the plugin's tests).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod api;

// Each test binary uses some of these.
#[allow(unused_imports)]
pub use api::{
    NS, ago_rfc3339, apply_yaml, crd_docs, create_namespace, create_node, eventually, fip_yaml, free_port, get_pair,
    install_crds, now_rfc3339, pair_yaml, repo, yaml_docs,
};

use havip_crds::{HAPair, manager};
use havip_e2e::controlplane::ControlPlane;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde::Deserialize;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Waits until the pair's status satisfies `pred`; returns the pair.
pub async fn wait_pair(client: &Client, name: &str, what: &str, pred: impl Fn(&HAPair) -> bool) -> HAPair {
    let mut last = None;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(p) = Api::<HAPair>::all(client.clone()).get(name).await {
            if pred(&p) {
                return p;
            }
            last = Some(p);
        }
        if Instant::now() > deadline {
            panic!(
                "timed out waiting for HAPair {name}: {what}; last status:\n{}",
                serde_json::to_string_pretty(&last.and_then(|p| p.status)).unwrap()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A simulated agent's report: SSA of its own `members[]` entry under its field manager.
pub async fn report(client: &Client, pair: &str, entry: serde_json::Value) {
    let node = entry["node"].as_str().expect("entry.node").to_owned();
    let patch = serde_json::json!({
        "apiVersion": "havip.io/v1alpha1", "kind": "HAPair",
        "status": {"members": [entry]},
    });
    Api::<HAPair>::all(client.clone())
        .patch_status(pair, &PatchParams::apply(&manager::agent(&node)).force(), &Patch::Apply(&patch))
        .await
        .unwrap_or_else(|e| panic!("agent {node} report on {pair}: {e}"));
}

/// A healthy member entry on `revision` (role, epoch, ready for `vip`, heard, key 1, seen now).
pub fn entry(node: &str, role: &str, epoch: i64, revision: &str, vip: &str) -> serde_json::Value {
    serde_json::json!({
        "node": node, "role": role, "epoch": epoch,
        "ready": [{"address": vip, "ready": true}],
        "heard": [{"path": "internal", "heard": true}],
        "appliedRevision": revision, "agentVersion": "0.1.0", "protocolVersion": "1.0",
        "keyId": 1, "maintenance": false, "alarms": [],
        "lastSeen": now_rfc3339(),
    })
}

/// A simulated agent's role change: compare-and-swap of the pair Lease.
pub async fn set_lease(client: &Client, pair: &str, holder: Option<&str>, epoch: i32) {
    let api: Api<Lease> = Api::namespaced(client.clone(), NS);
    let name = havip_crds::lease::pair_lease_name(pair);
    let mut lease = api.get(&name).await.unwrap_or_else(|e| panic!("get Lease {name}: {e}"));
    let spec = lease.spec.get_or_insert_with(Default::default);
    spec.holder_identity = holder.map(str::to_owned);
    spec.lease_transitions = Some(epoch);
    spec.renew_time =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(k8s_openapi::jiff::Timestamp::now()));
    lease.metadata.managed_fields = None;
    api.replace(&name, &PostParams::default(), &lease).await.unwrap_or_else(|e| panic!("CAS Lease {name}: {e}"));
}

/// Events about `object` (in `default`, where Events of cluster-scoped objects go).
pub async fn events_for(client: &Client, object: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(client.clone(), "default");
    api.list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(object))
        .collect()
}

pub fn event_summary(events: &[Event]) -> String {
    events
        .iter()
        .map(|e| {
            format!(
                "{} {} {}",
                e.type_.as_deref().unwrap_or(""),
                e.reason.as_deref().unwrap_or(""),
                e.note.as_deref().unwrap_or("")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits for an Event with `reason` (and a note containing `phrase`) about `object`.
pub async fn wait_event(client: &Client, object: &str, reason: &str, phrase: &str) -> Event {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let evs = events_for(client, object).await;
        if let Some(e) =
            evs.iter().find(|e| e.reason.as_deref() == Some(reason) && e.note.as_deref().unwrap_or("").contains(phrase))
        {
            return e.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no Event {reason} ({phrase:?}) about {object}; events:\n{}",
            event_summary(&evs)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `kubectl-havip` binary, a crate of its own: cargo puts it next to the operator's
/// (`cargo build --workspace --bins`, `cargo test --workspace` or `cargo build -p
/// kubectl-havip` build it there).
pub fn plugin_binary() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_havip-operator")).with_file_name("kubectl-havip");
    assert!(bin.is_file(), "{} is missing: build it first (cargo build -p kubectl-havip)", bin.display());
    bin
}

/// The operator binary as a child process, killed on drop.
pub struct Operator {
    pub child: Child,
    pub log: PathBuf,
    pub metrics_port: u16,
    pub identity: String,
}

impl Operator {
    pub fn start(cp: &ControlPlane, identity: &str, extra: &[&str]) -> Self {
        Self::start_with(cp, &cp.kubeconfig(), identity, extra)
    }

    /// Starts the operator with another identity's kubeconfig.
    pub fn start_with(cp: &ControlPlane, kubeconfig: &Path, identity: &str, extra: &[&str]) -> Self {
        let log = cp.dir().join(format!("operator-{identity}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let metrics_port = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_havip-operator"))
            .args([
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
                "--namespace",
                NS,
                "--metrics-address",
                &format!("127.0.0.1:{metrics_port}"),
                "--log-format",
                "json",
                "--identity",
                identity,
            ])
            .args(extra)
            .env("RUST_LOG", "info,havip_operator=debug")
            .env("NO_COLOR", "1")
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .expect("operator starts");
        Self { child, log, metrics_port, identity: identity.to_owned() }
    }

    pub fn log_text(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = self.log_text();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// `GET /metrics` (empty when not answering).
    pub fn metrics(&self) -> String {
        self.http_get("/metrics")
    }

    /// The raw HTTP answer to `GET path` on the metrics address (empty when not answering).
    pub fn http_get(&self, path: &str) -> String {
        use std::io::Write;
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.metrics_port)) else { return String::new() };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes());
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    /// The value of one metric line (0 when absent).
    pub fn metric(&self, line_prefix: &str) -> f64 {
        self.metrics()
            .lines()
            .find(|l| l.starts_with(line_prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill").args([&format!("-{sig}"), &self.child.id().to_string()]).status().unwrap();
        assert!(ok.success());
    }

    /// Lines of the operator's log that mark the start of a reconcile of `pair`.
    pub fn reconciles_of(&self, pair: &str) -> usize {
        let needle = format!("\"pair\":\"{pair}\"");
        self.log_text().lines().filter(|l| l.contains("\"reconciling\"") && l.contains(&needle)).count()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- operator {} log (tail) ---\n{}", self.identity, self.log_tail(80));
        }
    }
}

/// The revision the operator wrote.
pub fn revision_of(p: &HAPair) -> String {
    p.status.as_ref().and_then(|s| s.config_revision.clone()).unwrap_or_default()
}

pub fn phase_of(p: &HAPair) -> Option<havip_crds::Phase> {
    p.status.as_ref().and_then(|s| s.phase)
}

pub fn condition_of<'a>(
    p: &'a HAPair,
    t: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    p.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == t))
}

/// The least privileges the operator runs with: the chart's ClusterRole `havip-operator`
/// and its Role in `default` (read from the rendered chart, so the tests run with exactly
/// what users install), bound to `user`.
pub async fn install_operator_rbac(client: &Client, user: &str) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    let pp = PatchParams::apply("havip-test").force();
    let rendered =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/rendered/havip-default.yaml"))
            .expect("charts/rendered/havip-default.yaml (make chart)");
    let mut cr: ClusterRole = serde_yaml::Deserializer::from_str(&rendered)
        .filter_map(|d| serde_yaml::Value::deserialize(d).ok())
        .find(|v| {
            v.get("kind").and_then(|k| k.as_str()) == Some("ClusterRole")
                && v.get("metadata").and_then(|m| m.get("name")).and_then(|n| n.as_str()) == Some("havip-operator")
        })
        .map(|v| serde_yaml::from_value(v).expect("the chart's ClusterRole"))
        .expect("the chart renders the ClusterRole havip-operator");
    cr.metadata = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        name: Some("havip-operator".into()),
        ..Default::default()
    };
    Api::<ClusterRole>::all(client.clone())
        .patch("havip-operator", &pp, &Patch::Apply(&cr))
        .await
        .expect("ClusterRole");
    let crb: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "havip-operator"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "havip-operator"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch("havip-operator", &pp, &Patch::Apply(&crb))
        .await
        .expect("binding");
    let role: Role = serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "havip-operator", "namespace": NS},
        "rules": [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "list", "watch", "create", "update", "patch"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch", "create", "update", "patch"]}
        ]
    }))
    .unwrap();
    Api::<Role>::namespaced(client.clone(), NS).patch("havip-operator", &pp, &Patch::Apply(&role)).await.expect("Role");
    let rb: RoleBinding = serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "havip-operator", "namespace": NS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "havip-operator"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), NS)
        .patch("havip-operator", &pp, &Patch::Apply(&rb))
        .await
        .expect("RoleBinding");
    // The chart's Role in `default`: the API server's EndpointSlice, by name.
    let name = "havip-operator-api-server-addresses";
    let mut role: Role = serde_yaml::Deserializer::from_str(&rendered)
        .filter_map(|d| serde_yaml::Value::deserialize(d).ok())
        .find(|v| {
            v.get("kind").and_then(|k| k.as_str()) == Some("Role")
                && v.get("metadata").and_then(|m| m.get("name")).and_then(|n| n.as_str()) == Some(name)
        })
        .map(|v| serde_yaml::from_value(v).expect("the chart's Role"))
        .unwrap_or_else(|| panic!("the chart renders the Role {name}"));
    assert_eq!(role.metadata.namespace.as_deref(), Some("default"));
    role.metadata = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        name: Some(name.into()),
        namespace: Some("default".into()),
        ..Default::default()
    };
    Api::<Role>::namespaced(client.clone(), "default").patch(name, &pp, &Patch::Apply(&role)).await.expect("Role");
    let rb: RoleBinding = serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": "default"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), "default")
        .patch(name, &pp, &Patch::Apply(&rb))
        .await
        .expect("RoleBinding");
}
