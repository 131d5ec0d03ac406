//! `lab up` starts a control plane in the background and prints the export line;
//! `lab down` stops every process and removes the directory.

use std::process::Command;

#[test]
fn lab_up_then_down_leaves_nothing_behind() {
    let dir = tempfile::Builder::new().prefix("havip-lab-test-").tempdir().expect("tempdir");
    let lab_dir = dir.path().join("lab");
    let lab = env!("CARGO_BIN_EXE_lab");

    let up = Command::new(lab).arg("--dir").arg(&lab_dir).arg("up").output().expect("lab up runs");
    let stdout = String::from_utf8_lossy(&up.stdout);
    assert!(up.status.success(), "lab up failed: {}\n{}", stdout, String::from_utf8_lossy(&up.stderr));
    let line = stdout.lines().find(|l| l.starts_with("export KUBECONFIG=")).expect("export line printed");
    let kubeconfig = line.trim_start_matches("export KUBECONFIG=");
    assert!(std::path::Path::new(kubeconfig).is_file(), "kubeconfig {kubeconfig} exists");

    // The API server answers through that kubeconfig.
    let testbin = havip_e2e::testbin::TestBin::find().expect("testbin");
    let out = Command::new(testbin.kubectl())
        .env("KUBECONFIG", kubeconfig)
        .args(["get", "--raw", "/readyz"])
        .output()
        .expect("kubectl");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");

    // A second `up` is idempotent.
    let again = Command::new(lab).arg("--dir").arg(&lab_dir).arg("up").output().expect("lab up runs");
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).contains("already running"));

    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(lab_dir.join("state.json")).expect("state")).expect("json");
    let mut pids: Vec<i64> =
        state["children"].as_array().expect("children").iter().filter_map(|p| p.as_i64()).collect();
    pids.push(state["pid"].as_i64().expect("pid"));
    assert!(pids.len() >= 3, "supervisor, etcd and kube-apiserver: {pids:?}");

    let down = Command::new(lab).arg("--dir").arg(&lab_dir).arg("down").output().expect("lab down runs");
    assert!(down.status.success(), "lab down failed: {}", String::from_utf8_lossy(&down.stderr));
    assert!(!lab_dir.exists(), "lab down removes its directory");
    for pid in pids {
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "process {pid} still runs after lab down");
    }
    let status = Command::new(lab).arg("--dir").arg(&lab_dir).arg("status").output().expect("lab status runs");
    assert!(!status.status.success(), "status reports no lab");
}
