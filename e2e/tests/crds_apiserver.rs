//! The generated CRDs against a real kube-apiserver: they install and become
//! Established, every example is accepted, a table of invalid manifests is
//! refused by the API server with a message that names the problem, and
//! `kubectl get` prints the printer columns.
//!
//! One control plane serves every check in this file (starting one takes seconds),
//! so the checks run in one test, in order, each reporting what it checked.

use havip_crds::{FloatingIP, HAPair};
use havip_e2e::controlplane::{ControlPlane, ControlPlaneOptions};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use serde::Deserialize;
use std::path::Path;
use std::time::Duration;

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn yaml_docs(text: &str) -> Vec<serde_json::Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| serde_json::Value::deserialize(d).expect("valid YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

fn dynamic_api(client: &Client, doc: &serde_json::Value) -> Api<DynamicObject> {
    let api_version = doc["apiVersion"].as_str().expect("apiVersion");
    let kind = doc["kind"].as_str().expect("kind");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let plural = match kind {
        "HAPair" => "hapairs",
        "FloatingIP" => "floatingips",
        "VIPPool" => "vippools",
        "Service" => "services",
        other => panic!("unexpected kind {other}"),
    };
    let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
    match kind {
        // The examples' namespaced objects go to `default`.
        "Service" => Api::namespaced_with(client.clone(), "default", &resource),
        _ => Api::all_with(client.clone(), &resource),
    }
}

async fn install_crds(client: &Client) {
    let text = std::fs::read_to_string(repo().join(havip_crds::CRDS_PATH)).expect("CRD YAML");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for doc in yaml_docs(&text) {
        let crd: CustomResourceDefinition = serde_json::from_value(doc).expect("a CRD");
        let name = crd.name_any();
        crds.patch(&name, &PatchParams::apply("havip-e2e").force(), &Patch::Apply(&crd))
            .await
            .unwrap_or_else(|e| panic!("installing CRD {name} failed: {e}"));
    }
    let names = ["hapairs.havip.io", "floatingips.havip.io", "vippools.havip.io"].map(String::from);
    havip_e2e::kubelab::wait_crds_established(client, &names, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

async fn apply_examples(client: &Client) -> usize {
    let mut applied = 0;
    let mut entries: Vec<_> = std::fs::read_dir(repo().join("examples"))
        .expect("examples")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("yaml"))
        .collect();
    entries.sort();
    for path in entries {
        let text = std::fs::read_to_string(&path).expect("example");
        for doc in yaml_docs(&text) {
            let api = dynamic_api(client, &doc);
            let obj: DynamicObject = serde_json::from_value(doc).expect("object");
            let name = obj.name_any();
            api.patch(&name, &PatchParams::apply("havip-e2e").force(), &Patch::Apply(&obj))
                .await
                .unwrap_or_else(|e| panic!("{}: {name} was refused: {e}", path.display()));
            applied += 1;
        }
    }
    applied
}

/// (what, manifest, a phrase the API server's message must contain)
fn invalid_manifests() -> Vec<(&'static str, &'static str, &'static str)> {
    vec![
        (
            "one member",
            "apiVersion: havip.io/v1alpha1\nkind: HAPair\nmetadata: {name: bad}\nspec: {members: [{node: a, priority: 1}]}",
            "a pair needs at least 2 members",
        ),
        (
            "nine members",
            "apiVersion: havip.io/v1alpha1\nkind: HAPair\nmetadata: {name: bad}\nspec: {members: [{node: a, priority: 1},{node: b, priority: 2},{node: c, priority: 3},{node: d, priority: 4},{node: e, priority: 5},{node: f, priority: 6},{node: g, priority: 7},{node: h, priority: 8},{node: i, priority: 9}]}",
            "must have at most 8 items",
        ),
        (
            "the same node twice",
            "apiVersion: havip.io/v1alpha1\nkind: HAPair\nmetadata: {name: bad}\nspec: {members: [{node: a, priority: 1},{node: a, priority: 2}]}",
            "each node may appear only once",
        ),
        (
            "the same priority twice",
            "apiVersion: havip.io/v1alpha1\nkind: HAPair\nmetadata: {name: bad}\nspec: {members: [{node: a, priority: 7},{node: b, priority: 7}]}",
            "member priorities must be distinct",
        ),
        (
            "a node name no Node can have",
            "apiVersion: havip.io/v1alpha1\nkind: HAPair\nmetadata: {name: bad}\nspec: {members: [{node: a, priority: 1},{node: 'Node_B!', priority: 2}]}",
            "spec.members[].node must be a Node name",
        ),
        (
            "an empty node name",
            "apiVersion: havip.io/v1alpha1\nkind: HAPair\nmetadata: {name: bad}\nspec: {members: [{node: a, priority: 1},{node: '', priority: 2}]}",
            "spec.members[].node must be a Node name",
        ),
        (
            "priority 0",
            "apiVersion: havip.io/v1alpha1\nkind: HAPair\nmetadata: {name: bad}\nspec: {members: [{node: a, priority: 0},{node: b, priority: 2}]}",
            "priority in body should be greater than or equal to 1",
        ),
        (
            "priority 255",
            "apiVersion: havip.io/v1alpha1\nkind: HAPair\nmetadata: {name: bad}\nspec: {members: [{node: a, priority: 255},{node: b, priority: 2}]}",
            "priority in body should be less than or equal to 254",
        ),
        (
            "two members in maintenance",
            "apiVersion: havip.io/v1alpha1\nkind: HAPair\nmetadata: {name: bad}\nspec: {members: [{node: a, priority: 1, maintenance: true},{node: b, priority: 2, maintenance: true}]}",
            "only one member can be in maintenance at a time",
        ),
        (
            "an unknown failback mode",
            "apiVersion: havip.io/v1alpha1\nkind: HAPair\nmetadata: {name: bad}\nspec: {members: [{node: a, priority: 1},{node: b, priority: 2}], failback: {mode: Sometimes}}",
            "Unsupported value: \"Sometimes\"",
        ),
        (
            "a malformed duration",
            "apiVersion: havip.io/v1alpha1\nkind: HAPair\nmetadata: {name: bad}\nspec: {members: [{node: a, priority: 1},{node: b, priority: 2}], takeover: {holdDown: three seconds}}",
            "spec.takeover.holdDown: Invalid value: \"three seconds\": must be a duration such as 100ms",
        ),
        (
            "a heartbeat timeout shorter than its interval",
            "apiVersion: havip.io/v1alpha1\nkind: HAPair\nmetadata: {name: bad}\nspec: {members: [{node: a, priority: 1},{node: b, priority: 2}], heartbeat: {interval: 200ms, timeout: 100ms}}",
            "heartbeat.timeout must be at least twice heartbeat.interval",
        ),
        (
            "a heartbeat port out of range",
            "apiVersion: havip.io/v1alpha1\nkind: HAPair\nmetadata: {name: bad}\nspec: {members: [{node: a, priority: 1},{node: b, priority: 2}], heartbeat: {port: 70000}}",
            "spec.heartbeat.port in body should be less than or equal to 65535",
        ),
        (
            "a heartbeat path with both an address type and an interface",
            "apiVersion: havip.io/v1alpha1\nkind: HAPair\nmetadata: {name: bad}\nspec: {members: [{node: a, priority: 1},{node: b, priority: 2}], heartbeat: {paths: [{name: data, addressType: InternalIP, interface: eth0}]}}",
            "a heartbeat path names exactly one of addressType or interface",
        ),
        (
            "a fence target that is not an IP",
            "apiVersion: havip.io/v1alpha1\nkind: HAPair\nmetadata: {name: bad}\nspec: {members: [{node: a, priority: 1},{node: b, priority: 2}], takeover: {fenceTargets: [gateway.example]}}",
            "takeover.fenceTargets must be IP addresses",
        ),
        (
            "an empty pair name",
            "apiVersion: havip.io/v1alpha1\nkind: FloatingIP\nmetadata: {name: bad}\nspec: {pair: '', address: 192.0.2.10/24}",
            "spec.pair must name an HAPair",
        ),
        (
            "a malformed address",
            "apiVersion: havip.io/v1alpha1\nkind: FloatingIP\nmetadata: {name: bad}\nspec: {pair: web, address: 192.0.2.300/24}",
            "the part before the / is not a valid IPv4 or IPv6 address",
        ),
        (
            "an address without a prefix length",
            "apiVersion: havip.io/v1alpha1\nkind: FloatingIP\nmetadata: {name: bad}\nspec: {pair: web, address: 192.0.2.10}",
            "spec.address must be an IP address with a prefix length",
        ),
        (
            "an IPv4 prefix over 32",
            "apiVersion: havip.io/v1alpha1\nkind: FloatingIP\nmetadata: {name: bad}\nspec: {pair: web, address: 192.0.2.10/33}",
            "an IPv4 prefix length must be between 0 and 32",
        ),
        (
            "an IPv6 prefix over 128",
            "apiVersion: havip.io/v1alpha1\nkind: FloatingIP\nmetadata: {name: bad}\nspec: {pair: web, address: '2001:db8::10/129'}",
            "an IPv6 prefix length must be between 0 and 128",
        ),
        (
            "a probe port out of range",
            "apiVersion: havip.io/v1alpha1\nkind: FloatingIP\nmetadata: {name: bad}\nspec: {pair: web, address: 192.0.2.10/24, probe: {ports: [80, 65536]}}",
            "a port must be between 1 and 65535",
        ),
        (
            "announcement repeats inside the ARP locktime",
            "apiVersion: havip.io/v1alpha1\nkind: FloatingIP\nmetadata: {name: bad}\nspec: {pair: web, address: 192.0.2.10/24, announce: {repeatInterval: 500ms}}",
            "announce.repeatInterval must be more than 1s",
        ),
        (
            "a pool without addresses",
            "apiVersion: havip.io/v1alpha1\nkind: VIPPool\nmetadata: {name: bad}\nspec: {pair: web, addresses: []}",
            "spec.addresses must list at least one CIDR or range",
        ),
        (
            "a pool entry that is neither a CIDR nor a range",
            "apiVersion: havip.io/v1alpha1\nkind: VIPPool\nmetadata: {name: bad}\nspec: {pair: web, addresses: [192.0.2.0/24, 192.0.2.300/32]}",
            "each entry must be a CIDR",
        ),
        (
            "a pool range across families",
            "apiVersion: havip.io/v1alpha1\nkind: VIPPool\nmetadata: {name: bad}\nspec: {pair: web, addresses: ['192.0.2.1-2001:db8::1']}",
            "a range of one family",
        ),
        (
            "a pool without a pair",
            "apiVersion: havip.io/v1alpha1\nkind: VIPPool\nmetadata: {name: bad}\nspec: {pair: '', addresses: [192.0.2.0/28]}",
            "spec.pair must name an HAPair",
        ),
    ]
}

async fn check_invalid_manifests(client: &Client) {
    let table = invalid_manifests();
    assert!(table.len() >= 12, "the table must hold at least 12 cases");
    let mut failures = Vec::new();
    for (what, yaml, phrase) in table {
        let doc = yaml_docs(yaml).pop().expect("one document");
        let api = dynamic_api(client, &doc);
        let obj: DynamicObject = serde_json::from_value(doc).expect("object");
        match api.create(&PostParams::default(), &obj).await {
            Ok(_) => {
                failures.push(format!("{what}: ACCEPTED by the API server"));
                let _ = api.delete("bad", &Default::default()).await;
            }
            Err(kube::Error::Api(status)) => {
                if status.code != 422 || !status.message.contains(phrase) {
                    failures.push(format!(
                        "{what}: refused with code {} and message {:?}, expected 422 containing {phrase:?}",
                        status.code, status.message
                    ));
                } else {
                    eprintln!("refused as expected: {what}: {}", status.message);
                }
            }
            Err(e) => failures.push(format!("{what}: unexpected error {e}")),
        }
    }
    assert!(failures.is_empty(), "invalid-manifest table:\n{}", failures.join("\n"));
}

async fn check_printer_columns(cp: &ControlPlane, client: &Client) {
    // Give the "web" pair a status, as the operator would, and read it back through kubectl.
    let pairs: Api<HAPair> = Api::all(client.clone());
    let status = serde_json::json!({
        "apiVersion": "havip.io/v1alpha1",
        "kind": "HAPair",
        "status": {"active": "node-a", "standby": "node-b", "phase": "Live", "epoch": 4, "vips": 2}
    });
    pairs
        .patch_status("web", &PatchParams::apply("havip-e2e").force(), &Patch::Apply(&status))
        .await
        .expect("status subresource accepts the operator's fields");
    let fips: Api<FloatingIP> = Api::all(client.clone());
    let fstatus = serde_json::json!({
        "apiVersion": "havip.io/v1alpha1",
        "kind": "FloatingIP",
        "status": {"holder": "node-a", "state": "Announced"}
    });
    fips.patch_status("web-ingress", &PatchParams::apply("havip-e2e").force(), &Patch::Apply(&fstatus))
        .await
        .expect("FloatingIP status subresource");

    let out = cp.kubectl().args(["get", "hapairs"]).output().expect("kubectl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "kubectl get hapairs failed: {}", String::from_utf8_lossy(&out.stderr));
    let header: Vec<&str> = text.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAME", "ACTIVE", "STANDBY", "PHASE", "EPOCH", "VIPS", "AGE"], "{text}");
    let web: Vec<&str> = text
        .lines()
        .find(|l| l.starts_with("web "))
        .unwrap_or_else(|| panic!("no web row in:\n{text}"))
        .split_whitespace()
        .collect();
    assert_eq!(&web[..6], ["web", "node-a", "node-b", "Live", "4", "2"], "{text}");

    let out = cp.kubectl().args(["get", "fip"]).output().expect("kubectl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "kubectl get fip failed: {}", String::from_utf8_lossy(&out.stderr));
    let header: Vec<&str> = text.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAME", "ADDRESS", "PAIR", "HOLDER", "STATE", "READY", "AGE"], "{text}");
    let row: Vec<&str> = text
        .lines()
        .find(|l| l.starts_with("web-ingress "))
        .unwrap_or_else(|| panic!("no web-ingress row in:\n{text}"))
        .split_whitespace()
        .collect();
    assert_eq!(&row[..5], ["web-ingress", "192.0.2.10/24", "web", "node-a", "Announced"], "{text}");

    // The short names and the category work too.
    let out = cp.kubectl().args(["get", "havip", "-o", "name"]).output().expect("kubectl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("hapair.havip.io/web") && text.contains("floatingip.havip.io/web-ingress"), "{text}");
}

#[test]
fn crds_against_a_real_apiserver() {
    havip_e2e::init_tracing();
    let cp =
        ControlPlane::start(ControlPlaneOptions::default()).expect("control plane starts (run `make testbin` first)");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let client = cp.client().await.expect("client");
        install_crds(&client).await;
        let applied = apply_examples(&client).await;
        assert!(applied >= 7, "expected at least 7 example objects, applied {applied}");
        // Defaults are filled in by the API server from the schema.
        let pairs: Api<HAPair> = Api::all(client.clone());
        let edge = pairs.get("edge").await.expect("edge pair");
        assert_eq!(edge.spec.heartbeat.interval, "100ms");
        assert_eq!(edge.spec.heartbeat.port, 7946);
        check_invalid_manifests(&client).await;
        check_printer_columns(&cp, &client).await;
    });
}

#[test]
fn apiserver_can_stop_and_restart_mid_test() {
    havip_e2e::init_tracing();
    let mut cp = ControlPlane::start(ControlPlaneOptions::default()).expect("control plane starts");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let ns_count = |cp: &ControlPlane| {
        cp.kubectl()
            .args(["get", "namespaces", "-o", "name", "--request-timeout=2s"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    assert!(ns_count(&cp), "API server answers after start");
    // Write something, stop the API server, check it is gone, restart, read it back.
    rt.block_on(async {
        let client = cp.client().await.expect("client");
        install_crds(&client).await;
    });
    cp.stop_apiserver();
    assert!(!cp.apiserver_running());
    assert!(!ns_count(&cp), "API server must not answer while stopped");
    cp.start_apiserver().expect("API server restarts");
    assert!(ns_count(&cp), "API server answers after restart");
    let out = cp.kubectl().args(["get", "crd", "hapairs.havip.io"]).output().expect("kubectl");
    assert!(out.status.success(), "data survived the restart: {}", String::from_utf8_lossy(&out.stderr));
    // RBAC is on: a user without bindings is forbidden.
    let nobody = cp.kubeconfig_for("nobody", None).expect("kubeconfig");
    let out = std::process::Command::new(cp.testbin().kubectl())
        .env("KUBECONFIG", &nobody)
        .args(["get", "hapairs"])
        .output()
        .expect("kubectl");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("forbidden"), "RBAC must refuse an unbound user: {err}");
    let dir = cp.dir().to_owned();
    drop(cp);
    assert!(!dir.exists(), "the control plane's directory is removed on drop");
}
