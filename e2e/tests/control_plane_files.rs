//! The control-plane mode's files: the example pair file loads as a member reads it (with
//! a real CA), `havip-agent control-plane manifest` turns it into a static pod that
//! Kubernetes' own types parse, and refuses a file that cannot serve the job; the systemd
//! unit runs the same command.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use havip_node_agent::controlplane::{ManifestOptions, manifest};
use k8s_openapi::api::core::v1::Pod;
use std::path::{Path, PathBuf};

const EXAMPLE: &str = include_str!("../../examples/control-plane/control-plane.yaml");
const UNIT: &str = include_str!("../../examples/control-plane/havip-control-plane.service");

/// The example, its CA and key files placed in `dir` (the PKI in a directory of its own,
/// as /etc/kubernetes/pki is), edited by `edit`.
fn example_in(dir: &Path, edit: impl Fn(String) -> String) -> PathBuf {
    let pki = dir.join("pki");
    let etc = dir.join("etc");
    std::fs::create_dir_all(&pki).unwrap();
    std::fs::create_dir_all(&etc).unwrap();
    let ca = havip_e2e::certs::Ca::new().unwrap();
    std::fs::write(pki.join("ca.crt"), &ca.cert_pem).unwrap();
    std::fs::write(etc.join("control-plane.key"), "000102030405060708090a0b0c0d0e0f").unwrap();
    let yaml = EXAMPLE
        .replace("/etc/kubernetes/pki/ca.crt", &pki.join("ca.crt").display().to_string())
        .replace("/etc/havip/control-plane.key", &etc.join("control-plane.key").display().to_string());
    let path = etc.join("control-plane.yaml");
    std::fs::write(&path, edit(yaml)).unwrap();
    path
}

fn opts(config: PathBuf) -> ManifestOptions {
    ManifestOptions {
        config,
        node: "cp-2".to_owned(),
        image: "registry.example/havip-agent:1.0".to_owned(),
        state_dir: PathBuf::from("/var/lib/havip-control-plane"),
        metrics_address: "127.0.0.1:9798".to_owned(),
    }
}

#[test]
fn the_manifest_is_a_host_network_static_pod_that_runs_this_member() {
    let dir = tempfile::tempdir().unwrap();
    let config = example_in(dir.path(), |y| y);
    let text = manifest(&opts(config.clone())).unwrap();
    let pod: Pod = serde_yaml::from_str(&text).unwrap();
    assert_eq!(pod.metadata.namespace.as_deref(), Some("kube-system"));
    let spec = pod.spec.unwrap();
    assert_eq!(spec.host_network, Some(true));
    assert_eq!(spec.priority_class_name.as_deref(), Some("system-node-critical"));
    let c = &spec.containers[0];
    assert_eq!(c.image.as_deref(), Some("registry.example/havip-agent:1.0"));
    let args = c.args.clone().unwrap();
    let config_s = config.display().to_string();
    assert_eq!(
        args,
        [
            "standalone",
            "--config",
            config_s.as_str(),
            "--node",
            "cp-2",
            "--state-dir",
            "/var/lib/havip-control-plane",
            "--metrics-address",
            "127.0.0.1:9798"
        ]
    );
    let caps = c.security_context.as_ref().unwrap().capabilities.as_ref().unwrap();
    assert_eq!(caps.add.clone().unwrap(), ["NET_ADMIN", "NET_RAW"]);
    // The pair file's directory, the state and the CA's directory are mounted.
    let mounts: Vec<String> = c.volume_mounts.clone().unwrap().iter().map(|m| m.mount_path.clone()).collect();
    let etc = config.parent().unwrap().display().to_string();
    let pki = dir.path().join("pki").display().to_string();
    assert_eq!(mounts, [etc.as_str(), "/var/lib/havip-control-plane", pki.as_str()]);
    let live = c.liveness_probe.as_ref().unwrap().http_get.as_ref().unwrap();
    assert_eq!((live.host.as_deref(), live.path.as_deref()), (Some("127.0.0.1"), Some("/healthz")));
}

#[test]
fn a_file_that_cannot_serve_the_api_vip_gets_no_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let no_node = opts(example_in(dir.path(), |y| y));
    let e = manifest(&ManifestOptions { node: "cp-9".to_owned(), ..no_node }).unwrap_err();
    assert!(e.contains("not a member"), "{e}");
    let e = manifest(&opts(example_in(dir.path(), |y| y.replace("port: 7950", "port: 7946")))).unwrap_err();
    assert!(e.contains("7946") && e.contains("DaemonSet"), "{e}");
    let e = manifest(&opts(example_in(dir.path(), |y| {
        let cut = y.find("quorum:").unwrap();
        let end = y.find("apiServer:").unwrap();
        format!("{}{}", &y[..cut], &y[end..])
    })))
    .unwrap_err();
    assert!(e.contains("quorum"), "{e}");
    let e = manifest(&opts(example_in(dir.path(), |y| {
        let cut = y.find("apiServer:").unwrap();
        let end = y.find("startAlone:").unwrap();
        format!("{}{}", &y[..cut], &y[end..])
    })))
    .unwrap_err();
    assert!(e.contains("apiServer"), "{e}");
    // A CA file that is no certificate is named.
    let bad = example_in(dir.path(), |y| y);
    std::fs::write(dir.path().join("pki/ca.crt"), "not a certificate").unwrap();
    let e = manifest(&opts(bad)).unwrap_err();
    assert!(e.contains("caFile"), "{e}");
}

#[test]
fn the_systemd_unit_runs_the_same_member_command() {
    let exec: String = UNIT
        .lines()
        .skip_while(|l| !l.starts_with("ExecStart="))
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
        .replace('\\', "");
    for part in
        ["havip-agent standalone", "--config /etc/havip/control-plane.yaml", "--state-dir /var/lib/havip-control-plane"]
    {
        assert!(exec.contains(part), "{part} in {exec}");
    }
    assert!(UNIT.contains("AmbientCapabilities=CAP_NET_ADMIN CAP_NET_RAW"));
    assert!(EXAMPLE.contains("stateDir: /var/lib/havip-control-plane"));
}
