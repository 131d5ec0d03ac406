//! Helpers for tests against a real kube-apiserver that need no havip binary: the CRDs,
//! a namespace, Nodes, pairs and FloatingIPs applied from YAML, polling with deadlines.
//! The operator's tests use it through `common`; the plugin's (`kubectl-havip/tests`)
//! include this file itself.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use havip_crds::HAPair;
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde::Deserialize;
use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

pub const NS: &str = "havip-system";

pub fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

pub fn yaml_docs(text: &str) -> Vec<serde_json::Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| serde_json::Value::deserialize(d).expect("valid YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

pub fn crd_docs() -> Vec<CustomResourceDefinition> {
    let text = std::fs::read_to_string(repo().join(havip_crds::CRDS_PATH)).expect("CRD YAML");
    yaml_docs(&text).into_iter().map(|d| serde_json::from_value(d).expect("a CRD")).collect()
}

/// Installs (or restores) the CRDs and waits until they are Established.
pub async fn install_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crd_docs() {
        let name = crd.name_any();
        crds.patch(&name, &PatchParams::apply("havip-test").force(), &Patch::Apply(&crd))
            .await
            .unwrap_or_else(|e| panic!("installing CRD {name} failed: {e}"));
    }
    for name in ["hapairs.havip.io", "floatingips.havip.io", "vippools.havip.io"] {
        eventually(&format!("CRD {name} Established"), Duration::from_secs(30), || {
            let crds = crds.clone();
            async move {
                let crd = crds.get(name).await.ok()?;
                crd.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True").then_some(())
            }
        })
        .await;
    }
}

pub async fn create_namespace(client: &Client, ns: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let obj: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("create namespace {ns}: {e}"),
    }
}

/// Creates a Node with one InternalIP.
pub async fn create_node(client: &Client, name: &str, ip: &str) {
    let api: Api<Node> = Api::all(client.clone());
    let obj: Node = serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("create node {name}: {e}"),
    }
    let patch = serde_json::json!({"status": {"addresses": [{"type": "InternalIP", "address": ip}]}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("node addresses");
}

pub async fn apply_yaml(client: &Client, yaml: &str) {
    for doc in yaml_docs(yaml) {
        let kind = doc["kind"].as_str().unwrap().to_owned();
        let name = doc["metadata"]["name"].as_str().unwrap().to_owned();
        let pp = PatchParams::apply("havip-test").force();
        let res = match kind.as_str() {
            "HAPair" => Api::<HAPair>::all(client.clone()).patch(&name, &pp, &Patch::Apply(&doc)).await.map(|_| ()),
            "FloatingIP" => Api::<havip_crds::FloatingIP>::all(client.clone())
                .patch(&name, &pp, &Patch::Apply(&doc))
                .await
                .map(|_| ()),
            other => panic!("unexpected kind {other}"),
        };
        res.unwrap_or_else(|e| panic!("apply {kind} {name}: {e}"));
    }
}

/// A pair manifest with two members.
pub fn pair_yaml(name: &str, a: &str, b: &str) -> String {
    format!(
        "apiVersion: havip.io/v1alpha1\nkind: HAPair\nmetadata: {{name: {name}}}\nspec:\n  members:\n  - {{node: {a}, priority: 200}}\n  - {{node: {b}, priority: 100}}\n"
    )
}

pub fn fip_yaml(name: &str, pair: &str, addr: &str) -> String {
    format!(
        "apiVersion: havip.io/v1alpha1\nkind: FloatingIP\nmetadata: {{name: {name}}}\nspec: {{pair: {pair}, address: {addr}}}\n"
    )
}

/// Polls `check` every 100 ms until it returns Some, or panics after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn get_pair(client: &Client, name: &str) -> HAPair {
    Api::<HAPair>::all(client.clone()).get(name).await.unwrap_or_else(|e| panic!("get HAPair {name}: {e}"))
}

pub fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

pub fn ago_rfc3339(secs: i64) -> String {
    let t = k8s_openapi::jiff::Timestamp::from_second(k8s_openapi::jiff::Timestamp::now().as_second() - secs).unwrap();
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}
