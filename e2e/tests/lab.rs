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

/// `lab demo --bgp` (`make demo-bgp`) runs its routed tour to the end — the router routes
/// the VIP to the holder, a cut moves the route to the standby, the planned failover back
/// loses no connect (the demo fails otherwise) — and `lab down` stops every daemon it
/// started, FRR's included.
#[test]
fn the_routed_demo_runs_to_the_end_and_lab_down_leaves_nothing_behind() {
    if !nix::unistd::geteuid().is_root() || !havip_e2e::host::routing::Frr::available() {
        eprintln!("skipped: needs root and FRR (hack/prereqs.sh test)");
        return;
    }
    if havip_e2e::harness::kubelab::operator_binary().is_err() {
        eprintln!("skipped: havip-operator is not built (cargo build --workspace --bins)");
        return;
    }
    let dir = tempfile::Builder::new().prefix("havip-lab-test-").tempdir().expect("tempdir");
    let lab_dir = dir.path().join("lab");
    let lab = env!("CARGO_BIN_EXE_lab");
    let demo = Command::new(lab).arg("--dir").arg(&lab_dir).args(["demo", "--bgp"]).output().expect("lab demo runs");
    let stdout = String::from_utf8_lossy(&demo.stdout).into_owned();
    let state: Option<serde_json::Value> =
        std::fs::read_to_string(lab_dir.join("state.json")).ok().and_then(|s| serde_json::from_str(&s).ok());
    let down = Command::new(lab).arg("--dir").arg(&lab_dir).arg("down").output().expect("lab down runs");
    assert!(demo.status.success(), "the routed demo failed:\n{stdout}\n{}", String::from_utf8_lossy(&demo.stderr));
    assert!(down.status.success(), "lab down failed: {}", String::from_utf8_lossy(&down.stderr));

    let state = state.expect("the lab's state file");
    let routed = &state["routed"];
    let vip = routed["vips"][0].as_str().expect("a routed VIP");
    let ips: Vec<&str> = state["node_ips"].as_array().expect("node_ips").iter().filter_map(|v| v.as_str()).collect();
    // The router's route, shown after the apply, the cut and the planned failover.
    let routes: Vec<&str> = stdout.lines().filter(|l| l.contains(&format!("the router routes {vip} to "))).collect();
    assert_eq!(
        routes,
        [
            format!("      the router routes {vip} to {} (n0):", ips[0]),
            format!("      the router routes {vip} to {} (n1):", ips[1]),
            format!("      the router routes {vip} to {} (n0):", ips[0]),
        ],
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("{vip}/32 advertised to {}", routed["router_ip"].as_str().unwrap_or("?"))),
        "{stdout}"
    );
    assert!(stdout.contains("n0 is active again: 0 failed connects"), "{stdout}");
    assert!(stdout.contains("[9/9] done"), "{stdout}");

    let mut pids: Vec<i64> =
        state["children"].as_array().expect("children").iter().filter_map(|p| p.as_i64()).collect();
    pids.push(state["pid"].as_i64().expect("pid"));
    // etcd, kube-apiserver, 2 agents, the operator, 3 FRR instances of 3 daemons each.
    assert!(pids.len() >= 15, "the lab's processes, FRR's included: {pids:?}");
    for pid in pids {
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "process {pid} still runs after lab down");
    }
    assert!(!lab_dir.exists(), "lab down removes its directory");
}
