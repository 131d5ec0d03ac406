//! The highly available control plane inside network namespaces
//! (`havip_e2e::cpcluster`): three etcd members and three kube-apiservers come up on
//! three nodes, each API server answers `/readyz` and kubectl from the client namespace,
//! also on a VIP added to a node later (the serving certificate covers it), each has an
//! identity Lease of its own, losing one API server leaves the other two ready until it is
//! started again, a frozen one (SIGSTOP) is not ready, and the cluster writes without one
//! etcd member, which rejoins.
//!
//! Root only (network namespaces), and the control plane must be built
//! (`bash hack/testbin.sh control-plane`): otherwise the test prints a SKIPPED line and
//! passes.

use havip_e2e::cpcluster::{APISERVER_PORT, CpCluster};
use havip_e2e::netns::{self, Topology};
use havip_e2e::testbin::TestBin;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// `true` when root and the control plane is built; otherwise prints why not.
fn can_run(test: &str) -> bool {
    if !netns::skip_unless_root(test) {
        return false;
    }
    match TestBin::find() {
        Ok(_) => true,
        Err(e) => {
            let line = format!("SKIPPED: {test}: {e} (or `bash hack/testbin.sh control-plane`)\n");
            let _ = std::io::stderr().write_all(line.as_bytes());
            false
        }
    }
}

#[test]
fn three_members_serve_and_survive_the_loss_of_one_apiserver() {
    if !can_run("cp_cluster::three_members_serve_and_survive_the_loss_of_one_apiserver") {
        return;
    }
    havip_e2e::init_tracing();
    let topo = Topology::builder().nodes(3).build().expect("topology");
    let client = topo.client().ns.clone();
    let vip = topo.vip(0);

    let started = Instant::now();
    let mut cp = CpCluster::start(&topo, &[0, 1, 2], &[IpAddr::V4(vip)]).expect("control-plane cluster starts");
    eprintln!("3-member control plane (etcd + kube-apiserver on each node) ready in {:?}", started.elapsed());
    for i in 0..3 {
        cp.wait_ready(i, Duration::from_secs(10)).unwrap_or_else(|e| panic!("n{i} ready: {e}\n{}", cp.diagnostics()));
    }

    let (ok, out) = cp.kubectl(&client, cp.apiserver_addr(1), &["get", "ns", "-o", "name"]);
    assert!(ok && out.contains("namespace/default"), "kubectl get ns through n1: {out}\n{}", cp.diagnostics());

    // Each member has an identity of its own (its own host name in its own UTS namespace).
    let leases = wait_for(Duration::from_secs(10), || {
        let (ok, out) = cp.kubectl(
            &client,
            cp.apiserver_addr(0),
            &[
                "get",
                "leases",
                "-n",
                "kube-system",
                "-l",
                "apiserver.kubernetes.io/identity=kube-apiserver",
                "-o",
                "name",
            ],
        );
        (ok && out.lines().count() == 3).then_some(out)
    });
    assert!(leases.is_some(), "three API server identity leases\n{}", cp.diagnostics());

    // A VIP added to n1 later is served too: 0.0.0.0:6443 and the VIP in the certificate.
    netns::exec(&topo.node(1).ns, "ip", &["addr", "add", &format!("{vip}/24"), "dev", "eth0"]).expect("add VIP");
    let at_vip = SocketAddr::new(IpAddr::V4(vip), APISERVER_PORT);
    assert!(cp.readyz_at(&client, at_vip, Duration::from_secs(5)), "readyz through the VIP\n{}", cp.diagnostics());
    let (ok, out) = cp.kubectl(&client, at_vip, &["get", "ns", "kube-system", "-o", "name"]);
    assert!(ok && out.contains("namespace/kube-system"), "kubectl through the VIP: {out}");

    cp.kill_apiserver(0);
    assert!(!cp.readyz(0, Duration::from_secs(1)), "n0's API server answers after SIGKILL");
    for i in [1, 2] {
        assert!(cp.readyz(i, Duration::from_secs(5)), "n{i} ready while n0's API server is down\n{}", cp.diagnostics());
    }
    let (ok, out) = cp.kubectl(&client, cp.apiserver_addr(2), &["get", "ns", "-o", "name"]);
    assert!(ok && out.contains("namespace/default"), "kubectl get ns through n2 without n0: {out}");

    let restarted = Instant::now();
    cp.start_apiserver(0).unwrap_or_else(|e| panic!("n0's API server restarts: {e}\n{}", cp.diagnostics()));
    eprintln!("n0's kube-apiserver ready again {:?} after its restart", restarted.elapsed());
    assert!(cp.readyz(0, Duration::from_secs(5)), "n0 ready after the restart");

    // A frozen API server accepts connections but never answers.
    cp.stop_apiserver(1);
    assert!(!cp.readyz(1, Duration::from_secs(1)), "n1's API server answers while stopped");
    cp.cont_apiserver(1);
    cp.wait_ready(1, Duration::from_secs(10)).unwrap_or_else(|e| panic!("n1 ready after SIGCONT: {e}"));

    // Two of three etcd members are a quorum: n2's API server writes (through the other
    // members) without its own etcd. When n2's member led, a write in flight is lost (etcd
    // fails it after its request timeout, 7 s): kubectl gives up after 3 s and tries again,
    // and the others have elected a leader by then (an election timeout, 1 s).
    cp.kill_etcd(2);
    let killed = Instant::now();
    let mut last = String::new();
    let wrote = wait_for(Duration::from_secs(20), || {
        let (ok, out) = cp.kubectl(
            &client,
            cp.apiserver_addr(2),
            &["--request-timeout=3s", "create", "namespace", "without-n2-etcd"],
        );
        last = out;
        // A retry after a write that timed out but was committed finds it there.
        (ok || last.contains("AlreadyExists")).then_some(())
    });
    assert!(wrote.is_some(), "a write through n2 without its etcd member: {last}\n{}", cp.diagnostics());
    eprintln!("a write through n2 succeeded {:?} after its etcd member was killed", killed.elapsed());
    cp.wait_ready(2, Duration::from_secs(10)).unwrap_or_else(|e| panic!("n2 ready without its etcd: {e}"));
    cp.start_etcd(2).unwrap_or_else(|e| panic!("n2's etcd member rejoins: {e}\n{}", cp.diagnostics()));
    let (ok, out) = cp.kubectl(&client, cp.apiserver_addr(0), &["get", "ns", "without-n2-etcd", "-o", "name"]);
    assert!(ok, "the namespace written without n2's etcd: {out}");
}

/// Polls `f` every 100 ms until it returns `Some`, for up to `timeout`.
fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() > timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
