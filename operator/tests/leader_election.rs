//! Two operator processes on one control plane: only the leader reconciles and writes
//! status; killing it hands over to the other; SIGTERM releases the Lease at once and
//! exits 0. Short lease timings (flags) keep the test quick.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use havip_crds::Phase;
use havip_e2e::controlplane::ControlPlane;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::Api;
use std::time::{Duration, Instant};

const FAST: &[&str] = &[
    "--leader-election-lease-duration",
    "4s",
    "--leader-election-renew-interval",
    "500ms",
    "--leader-election-renew-deadline",
    "3s",
];

async fn holder(client: &Client) -> Option<String> {
    let lease = Api::<Lease>::namespaced(client.clone(), NS).get_opt("havip-operator").await.ok()??;
    lease.spec?.holder_identity.filter(|h| !h.is_empty())
}

#[test]
fn one_leader_writes_and_hands_over() {
    let mut cp = ControlPlane::start(Default::default()).expect("control plane");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = cp.client().await.expect("client");
        install_crds(&client).await;
        create_namespace(&client, NS).await;
        create_node(&client, "n1", "10.0.0.1").await;
        create_node(&client, "n2", "10.0.0.2").await;
        let mut a = Some(Operator::start(&cp, "op-a", FAST));
        let b = Operator::start(&cp, "op-b", FAST);
        let first = eventually("a leader", Duration::from_secs(20), || holder(&client)).await;
        let (leader, follower) = if first == "op-a" { (a.take().unwrap(), b) } else { (b, a.take().unwrap()) };
        eprintln!("leader: {}", leader.identity);

        apply_yaml(&client, &pair_yaml("p1", "n1", "n2")).await;
        wait_pair(&client, "p1", "Pending", |p| phase_of(p) == Some(Phase::Pending)).await;
        eventually("the leader's metrics", Duration::from_secs(10), || async {
            (leader.metric("havip_operator_leader ") == 1.0
                && leader.metric("havip_operator_status_writes_total{kind=\"HAPair\"}") >= 1.0)
                .then_some(())
        })
        .await;
        assert_eq!(follower.metric("havip_operator_leader "), 0.0, "{}", follower.metrics());
        assert_eq!(follower.metric("havip_operator_status_writes_total{kind=\"HAPair\"}"), 0.0);
        assert_eq!(follower.metric("havip_operator_reconciles_total{controller=\"hapair\",result=\"ok\"}"), 0.0);
        for op in [&leader, &follower] {
            assert!(op.http_get("/healthz").starts_with("HTTP/1.1 200"), "{}", op.identity);
            assert!(op.http_get("/readyz").starts_with("HTTP/1.1 200"), "{} reached the API server", op.identity);
        }

        // Kill the leader without a chance to release: the follower takes over once
        // the Lease record has not changed for its duration.
        let killed_at = Instant::now();
        leader.signal("KILL");
        let new = eventually("the follower takes over", Duration::from_secs(20), || async {
            holder(&client).await.filter(|h| *h == follower.identity)
        })
        .await;
        let took = killed_at.elapsed();
        eprintln!("{new} took over {took:?} after the leader was killed");
        // The follower counts the lease duration (4 s) from when it last saw the record
        // change (the leader renewed every 500 ms; the follower polls every 500 ms).
        assert!(took >= Duration::from_secs(2), "took over before the lease could expire: {took:?}");
        drop(leader);
        apply_yaml(&client, &pair_yaml("p2", "n1", "n2")).await;
        wait_pair(&client, "p2", "reconciled by the new leader", |p| phase_of(p) == Some(Phase::Pending)).await;
        assert!(follower.metric("havip_operator_status_writes_total{kind=\"HAPair\"}") >= 1.0);

        // The API server goes away: the leader cannot renew and stops reconciling
        // within the renew deadline; when the API returns it leads again.
        cp.stop_apiserver();
        let stopped = Instant::now();
        let deadline = Instant::now() + Duration::from_secs(15);
        while follower.metric("havip_operator_leader ") != 0.0 {
            assert!(Instant::now() < deadline, "still leader without an API server:\n{}", follower.log_tail(20));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!("stepped down {:?} after the API server stopped", stopped.elapsed());
        assert!(follower.log_text().contains("lost leadership"), "{}", follower.log_tail(20));
        cp.start_apiserver().expect("API server restarts");
        let client = cp.client().await.expect("client");
        eventually("leader again", Duration::from_secs(30), || async {
            (follower.metric("havip_operator_leader ") == 1.0).then_some(())
        })
        .await;
        apply_yaml(&client, &pair_yaml("p3", "n1", "n2")).await;
        wait_pair(&client, "p3", "reconciled after the API outage", |p| phase_of(p) == Some(Phase::Pending)).await;

        // SIGTERM: the new leader stops, releases the Lease and exits 0.
        let mut last = follower;
        last.signal("TERM");
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(s) = last.child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "no exit after SIGTERM:\n{}", last.log_tail(30));
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(status.success(), "exit status {status}:\n{}", last.log_tail(30));
        assert_eq!(holder(&client).await, None, "the Lease was released");
        let log = last.log_text();
        assert!(log.contains("released the leader Lease"), "{log}");
        assert!(log.contains("SIGTERM"), "{log}");
    });
}

#[test]
fn refuses_bad_flags() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_havip-operator"))
        .args(["--metrics-address", "not-an-address"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--metrics-address"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_havip-operator"))
        .args(["--leader-election-renew-deadline", "20s", "--kubeconfig", "/nonexistent"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("renew-deadline must be shorter"), "{out:?}");
    // A leader-election Lease named like a pair Lease would be writable by the agents.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_havip-operator"))
        .args(["--leader-election-lease", "hapair-x", "--kubeconfig", "/nonexistent"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("the prefix of the pair Leases"), "{out:?}");
}
