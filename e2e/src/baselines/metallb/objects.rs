//! The API objects of the lab (see the module docs of [`crate::baselines::metallb`]):
//! applying them, and reading what MetalLB wrote back (the Service's address, the
//! `ServiceL2Status` objects that name the announcer).

use super::config::{
    FIELD_MANAGER, MEMBERLIST_SECRET, METALLB_NAMESPACE, MetalLbConfig, Mode, POOL, SERVICE_NAME, SERVICE_NAMESPACE,
    speaker_pod,
};
use super::error::{MetalLbError, Result, kerr};
use crate::harness::bgp::{NODE_ASN, ROUTER_ASN};
use crate::harness::kubelab::wait_crds_established;
use crate::harness::testbin::{METALLB_VERSION, MetalLbBin};
use crate::host::netns::Topology;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde::Deserialize;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

/// The API resource of a MetalLB kind (group `metallb.io`, version `v1beta1`).
fn metallb_resource(kind: &str, plural: &str) -> ApiResource {
    metallb_resource_of("v1beta1", kind, plural)
}

/// The API resource of a MetalLB kind at `version`.
fn metallb_resource_of(version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "metallb.io".into(),
        version: version.into(),
        api_version: format!("metallb.io/{version}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// Applies the objects of the module docs for `topo` and its `vip`; `key` is the
/// memberlist key.
pub(super) async fn apply_objects(
    client: &Client,
    bin: &MetalLbBin,
    topo: &Topology,
    vip: Ipv4Addr,
    config: &MetalLbConfig,
    key: &str,
) -> Result<()> {
    apply_crds(client, bin).await?;
    let ns = METALLB_NAMESPACE;
    let core = |kind: &str, plural: &str| ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    apply(client, &core("Namespace", "namespaces"), None, serde_json::json!({"metadata": {"name": ns}})).await?;
    for sa in ["controller", "speaker"] {
        apply(
            client,
            &core("ServiceAccount", "serviceaccounts"),
            Some(ns),
            serde_json::json!({"metadata": {"name": sa, "namespace": ns, "labels": {"app": "metallb"}}}),
        )
        .await?;
    }
    apply(
        client,
        &core("Secret", "secrets"),
        Some(ns),
        serde_json::json!({
            "metadata": {"name": MEMBERLIST_SECRET, "namespace": ns},
            "stringData": {"secretkey": key},
        }),
    )
    .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for n in topo.nodes() {
        apply(
            client,
            &core("Node", "nodes"),
            None,
            serde_json::json!({"metadata": {"name": n.name, "labels": {
                "kubernetes.io/hostname": n.name, "kubernetes.io/os": "linux",
            }}}),
        )
        .await?;
        let status = serde_json::json!({"status": {
            "addresses": [
                {"type": "InternalIP", "address": n.data_ip.to_string()},
                {"type": "Hostname", "address": n.name},
            ],
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "havip-e2e lab node"},
                {"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated", "message": "havip-e2e lab node"},
            ],
        }});
        nodes
            .patch_status(&n.name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map_err(kerr(format!("set the status of node {}", n.name)))?;
        let pod = speaker_pod(&n.name);
        apply(
            client,
            &core("Pod", "pods"),
            Some(ns),
            serde_json::json!({
                "metadata": {"name": pod, "namespace": ns,
                             "labels": {"app": "metallb", "component": "speaker"}},
                "spec": {
                    "nodeName": n.name, "hostNetwork": true, "serviceAccountName": "speaker",
                    "containers": [{"name": "speaker",
                                    "image": format!("quay.io/metallb/speaker:v{}", METALLB_VERSION)}],
                },
            }),
        )
        .await?;
        let ip = n.data_ip.to_string();
        let status = serde_json::json!({"status": {
            "phase": "Running", "hostIP": ip, "hostIPs": [{"ip": ip}], "podIP": ip, "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True"}],
        }});
        pods.patch_status(&pod, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map_err(kerr(format!("set the status of pod {pod}")))?;
    }
    apply(
        client,
        &metallb_resource("IPAddressPool", "ipaddresspools"),
        Some(ns),
        serde_json::json!({
            "metadata": {"name": POOL, "namespace": ns},
            "spec": {"addresses": [format!("{}/32", vip)]},
        }),
    )
    .await?;
    match config.mode {
        Mode::Layer2 => {
            apply(
                client,
                &metallb_resource("L2Advertisement", "l2advertisements"),
                Some(ns),
                serde_json::json!({
                    "metadata": {"name": POOL, "namespace": ns},
                    "spec": {"ipAddressPools": [POOL]},
                }),
            )
            .await?;
        }
        Mode::Bgp { hold_time } => {
            // The router, as the members of havip's routed lab see it (harness::bgp).
            let mut spec = serde_json::json!({
                "myASN": NODE_ASN, "peerASN": ROUTER_ASN, "peerAddress": topo.gateway().ip.to_string(),
            });
            if let (Some(ht), Some(obj)) = (hold_time, spec.as_object_mut()) {
                obj.insert("holdTime".into(), format!("{}s", ht.as_secs()).into());
            }
            apply(
                client,
                &metallb_resource_of("v1beta2", "BGPPeer", "bgppeers"),
                Some(ns),
                serde_json::json!({"metadata": {"name": "router", "namespace": ns}, "spec": spec}),
            )
            .await?;
            apply(
                client,
                &metallb_resource("BGPAdvertisement", "bgpadvertisements"),
                Some(ns),
                serde_json::json!({
                    "metadata": {"name": POOL, "namespace": ns},
                    "spec": {"ipAddressPools": [POOL]},
                }),
            )
            .await?;
        }
    }
    let port = config.port;
    apply(
        client,
        &core("Service", "services"),
        Some(SERVICE_NAMESPACE),
        serde_json::json!({
            "metadata": {"name": SERVICE_NAME, "namespace": SERVICE_NAMESPACE},
            "spec": {
                "type": "LoadBalancer",
                "externalTrafficPolicy": config.traffic_policy.as_str(),
                "ports": [{"name": "probe", "protocol": "TCP", "port": port, "targetPort": port}],
            },
        }),
    )
    .await?;
    let endpoints: Vec<serde_json::Value> = topo
        .nodes()
        .iter()
        .map(|n| {
            serde_json::json!({
                "addresses": [n.data_ip.to_string()],
                "nodeName": n.name,
                "conditions": {"ready": true, "serving": true, "terminating": false},
            })
        })
        .collect();
    apply(
        client,
        &ApiResource {
            group: "discovery.k8s.io".into(),
            version: "v1".into(),
            api_version: "discovery.k8s.io/v1".into(),
            kind: "EndpointSlice".into(),
            plural: "endpointslices".into(),
        },
        Some(SERVICE_NAMESPACE),
        serde_json::json!({
            "metadata": {"name": format!("{SERVICE_NAME}-lab"), "namespace": SERVICE_NAMESPACE, "labels": {
                "kubernetes.io/service-name": SERVICE_NAME,
                "endpointslice.kubernetes.io/managed-by": "havip-e2e",
            }},
            "addressType": "IPv4",
            "endpoints": endpoints,
            "ports": [{"name": "probe", "protocol": "TCP", "port": port}],
        }),
    )
    .await?;
    Ok(())
}

/// Applies every CRD of the module's `config/crd/bases` and waits until each is
/// Established.
async fn apply_crds(client: &Client, bin: &MetalLbBin) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let files = bin
        .crd_files()
        .map_err(|source| MetalLbError::Io { op: format!("list {}", bin.crds_dir().display()), source })?;
    if files.is_empty() {
        return Err(MetalLbError::Invalid(format!("no CRDs in {}", bin.crds_dir().display())));
    }
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for file in files {
        for mut v in yaml_documents(&file)? {
            widen_int32_bounds(&mut v);
            let crd: CustomResourceDefinition = serde_json::from_value(v)
                .map_err(|e| MetalLbError::Manifest { what: file.display().to_string(), reason: e.to_string() })?;
            let name = crd.name_any();
            crds.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&crd))
                .await
                .map_err(kerr(format!("apply CRD {name}")))?;
            names.push(name);
        }
    }
    Ok(wait_crds_established(client, &names, Duration::from_secs(30)).await?)
}

/// Drops `format: int32` from every schema whose `maximum` does not fit it. MetalLB
/// v0.15.2's BGPPeer declares its ASNs `int32` with `maximum: 4294967295`, and this
/// kube-apiserver refuses every object of such a schema ("Maximum boundary value must be
/// of type integer with format int32"); without the format the bound, and MetalLB's
/// reading of the field as `uint32`, are what its authors meant.
pub(super) fn widen_int32_bounds(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            let too_big =
                map.get("maximum").and_then(serde_json::Value::as_f64).is_some_and(|m| m > f64::from(i32::MAX));
            if too_big && map.get("format").and_then(serde_json::Value::as_str) == Some("int32") {
                map.remove("format");
            }
            map.values_mut().for_each(widen_int32_bounds);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(widen_int32_bounds),
        _ => {}
    }
}

/// Server-side apply of `obj` (`metadata` at least; `apiVersion` and `kind` are filled in).
async fn apply(client: &Client, ar: &ApiResource, ns: Option<&str>, mut obj: serde_json::Value) -> Result<()> {
    let name = obj
        .pointer("/metadata/name")
        .and_then(|n| n.as_str())
        .map(str::to_owned)
        .ok_or_else(|| MetalLbError::Manifest { what: ar.kind.clone(), reason: "no metadata.name".into() })?;
    if let Some(map) = obj.as_object_mut() {
        map.insert("apiVersion".into(), ar.api_version.clone().into());
        map.insert("kind".into(), ar.kind.clone().into());
    }
    let api: Api<DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
        None => Api::all_with(client.clone(), ar),
    };
    api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&obj))
        .await
        .map_err(kerr(format!("apply {} {name}", ar.kind)))?;
    Ok(())
}

/// The non-empty documents of a YAML file, as JSON values.
fn yaml_documents(path: &Path) -> Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| MetalLbError::Io { op: format!("read {}", path.display()), source })?;
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v = serde_json::Value::deserialize(doc)
            .map_err(|e| MetalLbError::Manifest { what: path.display().to_string(), reason: e.to_string() })?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

/// The Service's load-balancer ingress addresses.
pub(super) async fn ingress_ips(client: Client) -> Result<Vec<String>> {
    let svcs: Api<Service> = Api::namespaced(client, SERVICE_NAMESPACE);
    let svc = svcs.get(SERVICE_NAME).await.map_err(kerr("read the Service"))?;
    Ok(svc
        .status
        .and_then(|s| s.load_balancer)
        .and_then(|lb| lb.ingress)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|i| i.ip)
        .collect())
}

/// The nodes named by the Service's `ServiceL2Status` objects (label `metallb.io/node`,
/// else `status.node`; see the module docs for why the label), sorted.
pub(super) async fn announcers(client: Client) -> Result<Vec<String>> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client, METALLB_NAMESPACE, &metallb_resource("ServiceL2Status", "servicel2statuses"));
    let list = api
        .list(&ListParams::default().labels(&format!("metallb.io/service-name={SERVICE_NAME}")))
        .await
        .map_err(kerr("list ServiceL2Status objects"))?;
    let mut nodes: Vec<String> = list
        .items
        .iter()
        .filter_map(|o| {
            o.labels()
                .get("metallb.io/node")
                .cloned()
                .or_else(|| o.data.get("status")?.get("node")?.as_str().map(str::to_owned))
        })
        .collect();
    nodes.sort();
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::widen_int32_bounds;

    #[test]
    fn only_an_int32_bound_it_cannot_hold_loses_its_format() {
        let mut v = serde_json::json!({"properties": {
            "myASN": {"type": "integer", "format": "int32", "maximum": 4294967295u64, "minimum": 0},
            "port": {"type": "integer", "format": "int32", "maximum": 16384},
            "list": [{"type": "integer", "format": "int32", "maximum": 2147483648u64}],
        }});
        widen_int32_bounds(&mut v);
        assert_eq!(v.pointer("/properties/myASN/format"), None);
        assert_eq!(v.pointer("/properties/myASN/maximum"), Some(&serde_json::json!(4294967295u64)));
        assert_eq!(v.pointer("/properties/port/format"), Some(&serde_json::json!("int32")));
        assert_eq!(v.pointer("/properties/list/0/format"), None);
    }
}
