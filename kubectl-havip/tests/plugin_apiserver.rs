//! `kubectl-havip` (the built binary) against a real kube-apiserver + etcd, with no
//! operator running: `list` and `status -o json|yaml` of two pairs, the exit codes of
//! a missing pair, of a user without RBAC and of one without `patch`, `--kubeconfig`,
//! `KUBECONFIG` with several files and `--context` choosing between a working and a
//! broken context, a request nobody answers (no operator Lease: withdrawn after the
//! timeout; an expired Lease: refused before it is written; a live Lease whose
//! operator stays silent), `doctor` (members' findings, a VIP that is a Node's address),
//! and completion of pair and node names.
//!
//! One control plane serves every scenario, in order, in one test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../operator/tests/common/api.rs"]
mod common;

use common::{NS, ago_rfc3339, apply_yaml, create_namespace, fip_yaml, free_port, get_pair, install_crds, pair_yaml};
use havip_crds::HAPair;
use havip_e2e::controlplane::ControlPlane;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use kubectl_havip::exit;
use kubectl_havip::render::PairList;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_kubectl-havip");

struct Run {
    code: i32,
    out: String,
    err: String,
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {}\n--- stdout ---\n{}--- stderr ---\n{}", self.code, self.out, self.err)
    }
}

/// Runs the plugin with `KUBECONFIG=kubeconfig` (none when empty) and no other
/// kubeconfig in reach (HOME points at an empty directory).
fn plugin_env(kubeconfig: &str, home: &Path, args: &[&str]) -> Run {
    let mut c = Command::new(BIN);
    c.args(args).env("HOME", home).env_remove("HAVIP_KUBECONFIG").env_remove("HAVIP_NAMESPACE");
    c.env_remove("KUBERNETES_SERVICE_HOST");
    if kubeconfig.is_empty() {
        c.env_remove("KUBECONFIG");
    } else {
        c.env("KUBECONFIG", kubeconfig);
    }
    let o = c.output().expect("kubectl-havip runs");
    Run {
        code: o.status.code().unwrap_or(-1),
        out: String::from_utf8_lossy(&o.stdout).into_owned(),
        err: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

struct Env {
    admin: PathBuf,
    home: tempfile::TempDir,
}

impl Env {
    fn run(&self, args: &[&str]) -> Run {
        plugin_env(self.admin.to_str().unwrap(), self.home.path(), args)
    }
    fn run_as(&self, kubeconfig: &Path, args: &[&str]) -> Run {
        plugin_env(kubeconfig.to_str().unwrap(), self.home.path(), args)
    }
}

/// Writes `status` as the operator would (a merge patch of the status subresource).
async fn set_status(client: &Client, pair: &str, status: serde_json::Value) {
    Api::<HAPair>::all(client.clone())
        .patch_status(pair, &PatchParams::default(), &Patch::Merge(&serde_json::json!({ "status": status })))
        .await
        .unwrap_or_else(|e| panic!("status of {pair}: {e}"));
}

#[test]
fn plugin_against_a_real_api_server() {
    let mut cp = ControlPlane::start(Default::default()).expect("control plane");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = cp.client().await.expect("client");
        install_crds(&client).await;
        create_namespace(&client, NS).await;
        apply_yaml(&client, &pair_yaml("alpha", "n1", "n2")).await;
        apply_yaml(&client, &pair_yaml("beta", "n3", "n4")).await;
        set_status(
            &client,
            "alpha",
            serde_json::json!({
                "phase": "Live", "active": "n1", "standby": "n2", "epoch": 4, "vips": 2,
                "lastTransition": {"from": "n2", "to": "n1", "reason": "PlannedFailover", "epoch": 4, "time": ago_rfc3339(300)},
            }),
        )
        .await;
        set_status(
            &client,
            "beta",
            serde_json::json!({
                "phase": "Degraded", "active": "n4", "epoch": 9, "vips": 1,
                "lastTransition": {"from": "n3", "to": "n4", "reason": "PeerLost", "epoch": 9, "time": ago_rfc3339(7200)},
            }),
        )
        .await;
        let env = Env { admin: cp.kubeconfig(), home: tempfile::tempdir().unwrap() };
        list_and_status(&env);
        not_found(&env);
        forbidden(&env, &cp, &client).await;
        contexts(&env, &cp);
        operator_not_running(&env, &client).await;
        doctor(&env, &client).await;
        completion(&env);
    });
    etcd_down(&mut cp);
}

/// Last: etcd stopped. The API server holds every request that needs it for its own 60 s
/// timeout; the plugin gives up 5 s after its `--timeout` (a chaos run's nemesis stalled a
/// minute in such calls).
fn etcd_down(cp: &mut ControlPlane) {
    let env = Env { admin: cp.kubeconfig(), home: tempfile::tempdir().unwrap() };
    cp.stop_etcd();
    for args in [&["--timeout", "2s", "failover", "alpha"][..], &["--timeout", "2s", "status", "alpha"]] {
        let start = Instant::now();
        let r = env.run(args);
        let took = start.elapsed();
        assert_ne!(r.code, 0, "{args:?} cannot succeed without etcd: {r}");
        assert!(took < Duration::from_secs(20), "{args:?} gave up after {took:?}, not 5 s after its --timeout: {r}");
    }
}

fn list_and_status(env: &Env) {
    let r = env.run(&["list"]);
    assert_eq!(r.code, 0, "{r}");
    let lines: Vec<&str> = r.out.lines().collect();
    assert_eq!(lines.len(), 3, "{r}");
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(header, ["NAME", "PHASE", "ACTIVE", "EPOCH", "VIPS", "LAST", "FAILOVER", "REASON"], "{r}");
    let alpha: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(alpha[..5], ["alpha", "Live", "n1", "4", "2"], "{r}");
    assert!(alpha[5].starts_with('5') && alpha[5].ends_with('s'), "about 5m ago: {r}");
    assert_eq!(alpha[6], "PlannedFailover");
    let beta: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(beta, ["beta", "Degraded", "n4", "9", "1", "2h0m", "PeerLost"], "{r}");
    eprintln!("kubectl havip list:\n{}", r.out);
    let r = env.run(&["list", "-o", "wide"]);
    assert!(r.code == 0 && r.out.contains("n2→n1") && r.out.contains("STANDBY"), "{r}");

    for format in ["json", "yaml"] {
        let r = env.run(&["list", "-o", format]);
        assert_eq!(r.code, 0, "{r}");
        let list: PairList = if format == "json" {
            serde_json::from_str(&r.out).unwrap()
        } else {
            serde_yaml::from_str(&r.out).unwrap()
        };
        let names: Vec<&str> = list.items.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["alpha", "beta"]);
        assert_eq!(list.items[0].standby, ["n2"]);
        let t = list.items[1].last_transition.as_ref().unwrap();
        assert_eq!((t.from.as_str(), t.to.as_str(), t.reason.as_str(), t.epoch), ("n3", "n4", "PeerLost", 9));

        let r = env.run(&["status", "alpha", "-o", format]);
        assert_eq!(r.code, 0, "{r}");
        let p: HAPair = if format == "json" {
            serde_json::from_str(&r.out).unwrap()
        } else {
            serde_yaml::from_str(&r.out).unwrap()
        };
        assert_eq!(p.name_any(), "alpha");
        assert_eq!(p.status.as_ref().and_then(|s| s.active.as_deref()), Some("n1"));
        assert_eq!(p.spec.members.len(), 2);
        assert!(p.metadata.managed_fields.is_none(), "{r}");

        let r = env.run(&["status", "--output", format]);
        assert_eq!(r.code, 0, "{r}");
        let v: serde_json::Value = if format == "json" {
            serde_json::from_str(&r.out).unwrap()
        } else {
            serde_yaml::from_str(&r.out).unwrap()
        };
        assert_eq!(v["kind"], "List");
        let items: Vec<HAPair> = serde_json::from_value(v["items"].clone()).unwrap();
        assert_eq!(items.iter().map(|p| p.name_any()).collect::<Vec<_>>(), ["alpha", "beta"]);
    }
    let r = env.run(&["status", "alpha"]);
    assert!(r.code == 0 && r.out.contains("HAPair alpha: Live, active n1, epoch 4"), "the default stays text: {r}");
    eprintln!("list and status -o json|yaml ✓");
}

fn not_found(env: &Env) {
    for args in
        [&["status", "gamma"][..], &["status", "gamma", "-o", "json"], &["failover", "gamma"], &["clear", "gamma"]]
    {
        let r = env.run(args);
        assert_eq!(r.code, i32::from(exit::NOT_FOUND), "{args:?}: {r}");
        assert!(r.err.contains("HAPair \"gamma\" not found") && r.err.contains("kubectl havip list"), "{r}");
        assert!(r.out.is_empty(), "nothing on stdout: {r}");
    }
    eprintln!("kubectl havip clear gamma: {r}", r = env.run(&["clear", "gamma"]));
    let r = env.run(&["maintenance", "gamma", "n1", "on"]);
    assert_eq!(r.code, i32::from(exit::NOT_FOUND), "{r}");
    let r = env.run(&["maintenance", "alpha", "n9", "on"]);
    assert_eq!(r.code, i32::from(exit::USAGE), "{r}");
    assert!(r.err.contains("n9 is not a member of HAPair alpha (members: n1, n2)"), "{r}");
    let r = env.run(&["status", "-o", "xml"]);
    assert_eq!(r.code, i32::from(exit::USAGE), "{r}");
    eprintln!("not found and usage ✓");
}

async fn forbidden(env: &Env, cp: &ControlPlane, client: &Client) {
    // eve: no RBAC at all.
    let eve = cp.kubeconfig_for("eve", None).unwrap();
    let r = env.run_as(&eve, &["list"]);
    assert_eq!(r.code, i32::from(exit::FORBIDDEN), "{r}");
    assert!(r.err.contains("not allowed to list hapairs.havip.io as user \"eve\""), "{r}");
    assert!(r.err.contains("kubectl auth can-i list hapairs.havip.io"), "{r}");
    eprintln!("kubectl havip list as eve: {r}");
    // viewer: may read pairs, not patch them.
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let pp = PatchParams::apply("havip-test").force();
    let role: ClusterRole = serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "havip-viewer"},
        "rules": [{"apiGroups": ["havip.io"], "resources": ["hapairs"], "verbs": ["get", "list", "watch"]}],
    }))
    .unwrap();
    Api::<ClusterRole>::all(client.clone()).patch("havip-viewer", &pp, &Patch::Apply(&role)).await.unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "havip-viewer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "havip-viewer"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "viewer"}],
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(client.clone()).patch("havip-viewer", &pp, &Patch::Apply(&binding)).await.unwrap();
    let viewer = cp.kubeconfig_for("viewer", Some("havip-viewers")).unwrap();
    // RBAC takes a moment to reach the authorizer.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = env.run_as(&viewer, &["list"]);
        if r.code == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the viewer never could list: {r}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let r = env.run_as(&viewer, &["--timeout", "3s", "failover", "alpha"]);
    assert_eq!(r.code, i32::from(exit::FORBIDDEN), "{r}");
    assert!(
        r.err.contains("not allowed to patch hapairs.havip.io \"alpha\" as user \"viewer\" (groups havip-viewers"),
        "the verb, the object and who: {r}"
    );
    eprintln!("kubectl havip failover alpha as viewer: {r}");
    let p = get_pair(client, "alpha").await;
    assert!(!p.annotations().contains_key("havip.io/failover"), "nothing written: {:?}", p.annotations());
    eprintln!("forbidden ✓");
}

fn yaml(path: &Path) -> serde_yaml::Value {
    serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn write_yaml(path: &Path, v: &serde_yaml::Value) {
    std::fs::write(path, serde_yaml::to_string(v).unwrap()).unwrap();
}

fn contexts(env: &Env, cp: &ControlPlane) {
    let admin = yaml(&env.admin);
    let cluster = admin["clusters"][0]["cluster"].clone();
    let user = admin["users"][0].clone();
    let user_name = user["name"].as_str().unwrap().to_owned();
    let closed = free_port();
    let mut broken = cluster.clone();
    broken["server"] = format!("https://127.0.0.1:{closed}").into();
    let ctx = |name: &str| -> serde_yaml::Value {
        serde_yaml::from_str(&format!("{{name: {name}, context: {{cluster: {name}, user: {user_name}}}}}")).unwrap()
    };
    let named = |name: &str, c: &serde_yaml::Value| -> serde_yaml::Value {
        let mut m = serde_yaml::Mapping::new();
        m.insert("name".into(), name.into());
        m.insert("cluster".into(), c.clone());
        serde_yaml::Value::Mapping(m)
    };
    let doc = |clusters: Vec<serde_yaml::Value>, contexts: Vec<serde_yaml::Value>, current: Option<&str>| {
        let mut m = serde_yaml::Mapping::new();
        m.insert("apiVersion".into(), "v1".into());
        m.insert("kind".into(), "Config".into());
        m.insert("clusters".into(), clusters.into());
        m.insert("users".into(), vec![user.clone()].into());
        m.insert("contexts".into(), contexts.into());
        if let Some(c) = current {
            m.insert("current-context".into(), c.into());
        }
        serde_yaml::Value::Mapping(m)
    };
    let dir = cp.dir();
    let both = dir.join("kubeconfig-two-contexts");
    write_yaml(
        &both,
        &doc(vec![named("good", &cluster), named("broken", &broken)], vec![ctx("good"), ctx("broken")], Some("broken")),
    );
    let both = both.to_str().unwrap();

    // The current context is the broken one: unreachable, naming the server.
    let r = plugin_env("", env.home.path(), &["--kubeconfig", both, "--timeout", "3s", "list"]);
    assert_eq!(r.code, i32::from(exit::UNREACHABLE), "{r}");
    assert!(r.err.contains("cannot reach the API server") && r.err.contains(&format!("127.0.0.1:{closed}")), "{r}");
    assert!(r.err.contains("context \"broken\""), "{r}");
    eprintln!("kubectl havip list on the broken context: {r}");
    // --context picks the good one.
    let r = plugin_env("", env.home.path(), &["--kubeconfig", both, "--context", "good", "list"]);
    assert!(r.code == 0 && r.out.contains("alpha"), "{r}");
    // --kubeconfig wins over KUBECONFIG; --context after the command works too.
    let r =
        plugin_env(env.admin.to_str().unwrap(), env.home.path(), &["--kubeconfig", both, "--timeout", "3s", "list"]);
    assert_eq!(r.code, i32::from(exit::UNREACHABLE), "--kubeconfig wins: {r}");
    let r = plugin_env(both, env.home.path(), &["status", "alpha", "--context", "good"]);
    assert!(r.code == 0 && r.out.contains("HAPair alpha"), "KUBECONFIG: {r}");
    // An unknown context: a configuration error naming the contexts there are.
    let r = plugin_env(both, env.home.path(), &["--context", "nope", "list"]);
    assert_eq!(r.code, i32::from(exit::CONFIG), "{r}");
    assert!(r.err.contains("context \"nope\" not found") && r.err.contains("good, broken"), "{r}");
    eprintln!("kubectl havip --context nope list: {r}");
    // KUBECONFIG with several files (and a missing one), merged as kubectl does: the
    // first file's current-context names a context of the second.
    let first = dir.join("kubeconfig-first");
    let second = dir.join("kubeconfig-second");
    write_yaml(&first, &doc(vec![named("broken", &broken)], vec![ctx("broken")], Some("good")));
    write_yaml(&second, &doc(vec![named("good", &cluster)], vec![ctx("good")], Some("broken")));
    let paths = std::env::join_paths([first.clone(), dir.join("kubeconfig-missing"), second]).unwrap();
    let r = plugin_env(paths.to_str().unwrap(), env.home.path(), &["list"]);
    assert!(r.code == 0 && r.out.contains("beta"), "merged KUBECONFIG: {r}");
    let r = plugin_env(paths.to_str().unwrap(), env.home.path(), &["--context", "broken", "--timeout", "3s", "list"]);
    assert_eq!(r.code, i32::from(exit::UNREACHABLE), "{r}");
    // No kubeconfig anywhere and not in a cluster.
    let r = plugin_env("", env.home.path(), &["list"]);
    assert_eq!(r.code, i32::from(exit::CONFIG), "{r}");
    assert!(r.err.contains("no kubeconfig found"), "{r}");
    // ~/.kube/config is read when nothing else names a kubeconfig.
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join(".kube")).unwrap();
    std::fs::copy(&env.admin, home.path().join(".kube/config")).unwrap();
    let r = plugin_env("", home.path(), &["list", "-o", "json"]);
    assert!(r.code == 0 && r.out.contains("\"alpha\""), "~/.kube/config: {r}");
    eprintln!("--kubeconfig, KUBECONFIG and --context ✓");
}

async fn operator_not_running(env: &Env, client: &Client) {
    let pairs: Api<HAPair> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    // No operator has ever run: the request goes out, nobody answers, it is withdrawn.
    let start = Instant::now();
    let r = env.run(&["--timeout", "2s", "failover", "alpha"]);
    assert_eq!(r.code, i32::from(exit::NO_OPERATOR), "{r}");
    for phrase in [
        "PlannedFailover on alpha",
        "no answer from the operator within 2s; the request was withdrawn",
        "there is no Lease havip-system/havip-operator",
        "kubectl -n havip-system get pods -l app.kubernetes.io/component=operator",
    ] {
        assert!(r.err.contains(phrase), "{phrase:?}: {r}");
    }
    assert!(start.elapsed() < Duration::from_secs(10), "{:?}", start.elapsed());
    eprintln!("kubectl havip failover alpha, no operator: {r}");
    let p = pairs.get("alpha").await.unwrap();
    assert!(!p.annotations().contains_key("havip.io/failover"), "withdrawn: {:?}", p.annotations());
    // The same with another namespace named.
    let r = env.run(&["--timeout", "1s", "-n", "elsewhere", "clear", "alpha"]);
    assert_eq!(r.code, i32::from(exit::NO_OPERATOR), "{r}");
    assert!(r.err.contains("Lease elsewhere/havip-operator") && r.err.contains("(now elsewhere)"), "{r}");

    // An operator that died long ago: refused before anything is written.
    let stale: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "havip-operator"},
        "spec": {"holderIdentity": "op-gone", "leaseDurationSeconds": 15,
                 "renewTime": format!("{}.000000Z", ago_rfc3339(600).trim_end_matches('Z'))},
    }))
    .unwrap();
    leases.create(&PostParams::default(), &stale).await.unwrap();
    let start = Instant::now();
    let r = env.run(&["--timeout", "3s", "rotate-key", "beta"]);
    assert_eq!(r.code, i32::from(exit::NO_OPERATOR), "{r}");
    assert!(
        r.err.contains(
            "the havip operator is not running: its leader op-gone last renewed Lease havip-system/havip-operator 10m"
        ) && r.err.contains("the request was not sent"),
        "{r}"
    );
    assert!(start.elapsed() < Duration::from_secs(8), "within the grace: {:?}", start.elapsed());
    eprintln!("kubectl havip rotate-key beta, expired operator Lease: {r}");
    let p = pairs.get("beta").await.unwrap();
    assert!(!p.annotations().contains_key("havip.io/rotate-key"), "never written: {:?}", p.annotations());

    // A leader that renews but does not answer (a wedged operator): the Lease is
    // renewed during the plugin's check, so the request goes out, and is withdrawn.
    let renewer = {
        let leases = leases.clone();
        tokio::spawn(async move {
            loop {
                let now = k8s_openapi::jiff::Timestamp::now();
                let patch = serde_json::json!({"spec": {"holderIdentity": "op-wedged",
                    "renewTime": now.strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string()}});
                let _ = leases.patch("havip-operator", &PatchParams::default(), &Patch::Merge(&patch)).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    let r = tokio::task::spawn_blocking({
        let admin = env.admin.clone();
        let home = env.home.path().to_owned();
        move || plugin_env(admin.to_str().unwrap(), &home, &["--timeout", "2s", "failover", "beta", "--to", "n3"])
    })
    .await
    .unwrap();
    renewer.abort();
    assert_eq!(r.code, i32::from(exit::NO_OPERATOR), "{r}");
    assert!(r.err.contains("the operator op-wedged leads") && r.err.contains("did not answer"), "{r}");
    eprintln!("kubectl havip failover beta, wedged operator: {r}");
    let p = pairs.get("beta").await.unwrap();
    assert!(!p.annotations().contains_key("havip.io/failover"), "withdrawn: {:?}", p.annotations());
    eprintln!("operator not running ✓");
}

/// `doctor`: nothing on healthy pairs; then what a member reported (its `findings`) and a
/// Node whose InternalIP is one of the pair's VIPs, each with its fix (exit 10); a pair
/// without either stays clean.
async fn doctor(env: &Env, client: &Client) {
    use k8s_openapi::api::core::v1::Node;
    let r = env.run(&["doctor"]);
    assert!(r.code == i32::from(exit::OK) && r.out == "no findings\n", "{r}");
    apply_yaml(client, &fip_yaml("alpha-vip", "alpha", "192.0.2.50/24")).await;
    let nodes = Api::<Node>::all(client.clone());
    let node: Node = serde_json::from_value(serde_json::json!({"metadata": {"name": "n2"}})).unwrap();
    nodes.create(&PostParams::default(), &node).await.expect("node n2");
    let addresses = serde_json::json!({"status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.50"}]}});
    nodes.patch_status("n2", &PatchParams::default(), &Patch::Merge(&addresses)).await.expect("n2's addresses");
    let finding = serde_json::json!({
        "check": "RpFilterDropsHeartbeats", "subject": "eth1 (path mgmt)",
        "detail": "heartbeats from n2 (10.1.0.12) arrive on eth1, whose rp_filter is strict (1), but the route back to 10.1.0.12 leaves by eth0: the kernel drops them",
    });
    let members = serde_json::json!({"members": [{"node": "n1", "findings": [finding]}]});
    set_status(client, "alpha", members).await;
    let r = env.run(&["doctor"]);
    assert_eq!(r.code, i32::from(exit::FINDINGS), "{r}");
    assert!(r.out.contains("alpha/n1: RpFilterDropsHeartbeats eth1 (path mgmt): heartbeats from n2"), "{r}");
    assert!(r.out.contains("alpha/n2: VipIsNodeAddress node n2: Node n2 reports 192.0.2.50, the VIP of FloatingIP alpha-vip, as its InternalIP"), "{r}");
    assert_eq!(r.out.matches("\n  fix: ").count(), 2, "{r}");
    let r = env.run(&["doctor", "beta"]);
    assert!(r.code == i32::from(exit::OK) && r.out == "no findings\n", "another pair's findings are not beta's: {r}");
    let r = env.run(&["doctor", "gamma"]);
    assert_eq!(r.code, i32::from(exit::NOT_FOUND), "{r}");
    eprintln!("doctor ✓");
}

fn completion(env: &Env) {
    let r = env.run(&["__complete", "failover", ""]);
    assert_eq!(r.code, 0, "{r}");
    let lines: Vec<&str> = r.out.lines().collect();
    assert_eq!(lines, ["alpha\tLive, active n1", "beta\tDegraded, active n4", ":4"], "{r}");
    let r = env.run(&["__complete", "maintenance", "alpha", ""]);
    assert_eq!(r.out.lines().collect::<Vec<_>>(), ["n1\tpriority 200, active", "n2\tpriority 100", ":4"], "{r}");
    // As kubectl runs it: an executable named kubectl_complete-havip (a link).
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("kubectl_complete-havip");
    std::os::unix::fs::symlink(BIN, &link).unwrap();
    let o = Command::new(&link)
        .env("KUBECONFIG", &env.admin)
        .args(["--context", "havip-lab", "status", "b"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "beta\tDegraded, active n4\n:4\n");
    let r = env.run(&["completion", "bash"]);
    assert!(r.code == 0 && r.out.contains("kubectl-havip"), "{r}");
    eprintln!("completion ✓");
}
