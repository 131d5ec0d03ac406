//! `bench-k8s`: what havip costs the API server, and how fast a new pair serves, on the
//! local control plane (root). JSON lines:
//!
//! - `apply_to_vip`: time from applying a HAPair + FloatingIP until a client's TCP
//!   connect to the VIP succeeds;
//! - `api_requests_steady`: API requests per pair per minute in steady state (read from
//!   the API server's own `apiserver_request_total`, over `--steady-seconds`), by verb;
//! - `api_requests_failover`: requests during a failover (node cut until the status names
//!   the new active under the next epoch, + 10 s; the harness's own reads excluded);
//! - `lease_renewal_reference`: the documented defaults of kube-vip and Cilium L2
//!   announcements turned into requests per VIP per minute (computed, not measured).

use clap::Parser;
use havip_crds::Phase;
use havip_e2e::harness::kubelab::{KubeLab, KubeLabOptions};
use havip_e2e::host::netns::Link;
use havip_e2e::traffic::Prober;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// API-server cost and apply-to-serving time of havip.
#[derive(Parser, Debug)]
struct Args {
    /// Seconds of steady state to count requests over.
    #[arg(long, default_value_t = 60)]
    steady_seconds: u64,
}

type Counts = BTreeMap<(String, String), f64>;

fn delta(after: &Counts, before: &Counts) -> Counts {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// Requests on havip's resources (pairs, FloatingIPs, Leases, Events, Secrets, Nodes),
/// i.e. not the harness's own metrics reads.
fn havip_requests(d: &Counts) -> (f64, f64, BTreeMap<String, f64>) {
    let mut total = 0.0;
    let mut writes = 0.0;
    let mut by = BTreeMap::new();
    for ((verb, resource), n) in d {
        if !["hapairs", "floatingips", "leases", "events", "secrets", "nodes"].contains(&resource.as_str()) {
            continue;
        }
        total += n;
        if ["POST", "PUT", "PATCH", "DELETE", "APPLY"].contains(&verb.as_str()) {
            writes += n;
        }
        *by.entry(format!("{verb} {resource}")).or_insert(0.0) += n;
    }
    (total, writes, by)
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if let Err(why) = havip_e2e::host::netns::require_root() {
        eprintln!("bench-k8s needs root: {why}");
        return std::process::ExitCode::FAILURE;
    }
    let lab = match KubeLab::start(KubeLabOptions {
        nodes: 2,
        operator: true,
        dir: None,
        chart_rbac: false,
        bgp: None,
        ..Default::default()
    }) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("lab: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    // Apply → VIP answering.
    let prober = match Prober::on_client(&lab.topo, lab.target()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("prober: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let start = Instant::now();
    if let Err(e) = lab.block_on(lab.apply(&lab.pair_yaml("web"))) {
        eprintln!("apply: {e}");
        return std::process::ExitCode::FAILURE;
    }
    let answered = prober.wait_until_ok(1, Duration::from_secs(30));
    let apply_to_vip = start.elapsed();
    let live = lab.block_on(lab.wait_pair("web", Duration::from_secs(30), "Live", |p| {
        p.status.as_ref().and_then(|s| s.phase) == Some(Phase::Live)
    }));
    let apply_to_live = start.elapsed();
    println!(
        "{}",
        json!({"bench": "apply_to_vip", "ms": apply_to_vip.as_millis(), "vip_answered": answered.is_ok(),
               "apply_to_live_ms": apply_to_live.as_millis(), "live": live.is_ok()})
    );
    // Steady state.
    std::thread::sleep(Duration::from_secs(10));
    let before = lab.apiserver_requests();
    std::thread::sleep(Duration::from_secs(args.steady_seconds));
    let after = lab.apiserver_requests();
    let (total, writes, by) = havip_requests(&delta(&after, &before));
    let per_min = 60.0 / args.steady_seconds as f64;
    println!(
        "{}",
        json!({"bench": "api_requests_steady", "pairs": 1, "members": 2, "seconds": args.steady_seconds,
               "requests_per_pair_per_minute": (total * per_min * 10.0).round() / 10.0,
               "writes_per_pair_per_minute": (writes * per_min * 10.0).round() / 10.0,
               "lease_writes_per_minute": by.iter().filter(|(k, _)| k.starts_with("PUT leases") || k.starts_with("PATCH leases")).map(|(_, v)| v * per_min).sum::<f64>(),
               "by_verb_resource": by})
    );
    // During a failover.
    let before = lab.apiserver_requests();
    let t0 = Instant::now();
    let _ = lab.topo.cut_cable(0, Link::Mgmt);
    let _ = lab.topo.cut_cable(0, Link::Data);
    // Until the status names n1 active under epoch 2 (the pair reads Degraded while n0
    // is away). The harness's own reads are counted and taken off the totals.
    let mut harness_gets = 0.0;
    let failed_over = loop {
        harness_gets += 1.0;
        let p = lab.block_on(lab.pair("web"));
        if let Ok(p) = &p
            && p.status.as_ref().is_some_and(|s| s.active.as_deref() == Some("n1") && s.epoch == Some(2))
        {
            break true;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let status_caught_up = t0.elapsed();
    std::thread::sleep(Duration::from_secs(10));
    let after = lab.apiserver_requests();
    let mut d = delta(&after, &before);
    if let Some(n) = d.get_mut(&("GET".to_owned(), "hapairs".to_owned())) {
        *n = (*n - harness_gets).max(0.0);
    }
    let (total, writes, by) = havip_requests(&d);
    println!(
        "{}",
        json!({"bench": "api_requests_failover", "harness_gets_excluded": harness_gets, "window_seconds": t0.elapsed().as_secs(),
               "status_failed_over_ms": status_caught_up.as_millis(), "failed_over": failed_over,
               "requests": total, "writes": writes, "by_verb_resource": by})
    );
    let _ = prober.stop();
    // The documented defaults of lease-based L2 announcers (client-go leader election:
    // the leader renews every retryPeriod with one PUT, each follower GETs every
    // retryPeriod), per VIP with 2 nodes.
    for (system, lease, renew, retry) in [("kube-vip", 15.0, 10.0, 2.0), ("cilium-l2", 15.0, 5.0, 2.0)] {
        let leader_put: f64 = 60.0 / retry;
        let follower_get: f64 = 60.0 / (retry * 1.1);
        println!(
            "{}",
            json!({"bench": "lease_renewal_reference", "system": system, "computed_from_documented_defaults": true,
                   "lease_duration_s": lease, "renew_deadline_s": renew, "retry_period_s": retry,
                   "requests_per_vip_per_minute": ((leader_put + follower_get) * 10.0).round() / 10.0,
                   "writes_per_vip_per_minute": leader_put})
        );
    }
    std::process::ExitCode::SUCCESS
}
