//! `bench-scale`: havip in a big cluster, on the local control plane (root). JSON lines.
//!
//! The lab's two netns nodes run real agents and carry `--real-pairs` pairs (`real-0`,
//! `real-1`, …, each with its own VIP, all probing the nodes' service on port 8080);
//! around them, `--nodes` synthetic Nodes with a
//! realistic status (~`--node-status-kib` KiB each: addresses, an image list,
//! conditions, capacity) and `--pairs` pairs in all, the others spread over the
//! synthetic Nodes, each with one FloatingIP. Simulated agents make those pairs Live
//! (Lease compare-and-swap, member entries) and keep refreshing their member entries
//! like real agents (one write per member every `--refresh-seconds`).
//!
//! Lines:
//! - `scale_setup`: what was created and how long it took;
//! - `scale_operator`: the operator's RSS (idle with the Nodes, at Live, the largest
//!   seen) and its time to Live for every pair;
//! - `scale_agent`: the agent of node n0 (member of every real pair): its RSS, private
//!   memory and the watch events it received per minute in a steady window while every other pair
//!   writes status (its own counter, `havip_agent_watch_events_total`), next to the
//!   cluster's HAPair status writes per minute in the same window.
//!
//! The goals: agent RSS ≤ 20 MiB with 100 pairs of its own, and watch events
//! proportional to its own pairs; operator RSS ≤ 256 MiB (the chart's limit) and every
//! pair Live within 120 s of its creation. `make bench-scale` runs it with release
//! builds (`HAVIP_AGENT_BIN`, `HAVIP_OPERATOR_BIN`); the line says which build ran.

use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use havip_crds::{HAPair, Phase, manager};
use havip_e2e::bench::footprint;
use havip_e2e::harness::kubelab::{KubeLab, KubeLabOptions, NAMESPACE};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// havip with thousands of Nodes and thousands of pairs.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// Synthetic Nodes.
    #[arg(long, default_value_t = 10000)]
    nodes: usize,
    /// Pairs in all (`--real-pairs` of them on the lab's real nodes).
    #[arg(long, default_value_t = 5000)]
    pairs: usize,
    /// Pairs on the lab's two real nodes (each its own VIP; 1 to 100).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u8).range(1..=100))]
    real_pairs: u8,
    /// Approximate size of each synthetic Node's status, in KiB.
    #[arg(long, default_value_t = 20)]
    node_status_kib: usize,
    /// API requests in flight while creating objects.
    #[arg(long, default_value_t = 48)]
    concurrency: usize,
    /// Length of the steady window, in seconds.
    #[arg(long, default_value_t = 120)]
    steady_seconds: u64,
    /// Each simulated member refreshes its entry this often (real agents: 60 s).
    #[arg(long, default_value_t = 60)]
    refresh_seconds: u64,
}

/// VmRSS of a process, in KiB (0 when it is gone).
fn rss_kib(pid: Option<u32>) -> u64 {
    pid.map_or(0, |p| footprint::rss_kib(&[p]))
}

/// "release" or "debug", from where the binary lives.
fn build_of(path: Option<std::path::PathBuf>) -> &'static str {
    match path {
        Some(p) if p.components().any(|c| c.as_os_str() == "release") => "release",
        Some(_) => "debug",
        None => "unknown",
    }
}

/// A synthetic Node's status of about `kib` KiB: what a kubelet reports (addresses,
/// capacity, conditions, node info, the images on the node).
fn node_status(i: usize, kib: usize) -> serde_json::Value {
    let ip = format!("10.{}.{}.{}", 100 + i / 65536 % 100, i / 256 % 256, i % 256);
    let cond = |t: &str, status: &str, reason: &str| {
        json!({"type": t, "status": status, "reason": reason, "message": format!("kubelet reports {t} is {status} ({reason})"),
               "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"})
    };
    let mut status = json!({
        "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": format!("scale-node-{i}")}],
        "capacity": {"cpu": "16", "memory": "65843228Ki", "pods": "110", "ephemeral-storage": "507944172Ki"},
        "allocatable": {"cpu": "15800m", "memory": "64692252Ki", "pods": "110", "ephemeral-storage": "468118694813"},
        "conditions": [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID"),
            cond("Ready", "True", "KubeletReady"),
            cond("NetworkUnavailable", "False", "RouteCreated"),
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {"machineID": format!("{i:032x}"), "systemUUID": format!("{i:08x}-0000-0000-0000-000000000000"),
                     "bootID": format!("{i:08x}-1111-2222-3333-444444444444"), "kernelVersion": "6.8.0-1012-aws",
                     "osImage": "Ubuntu 24.04 LTS", "containerRuntimeVersion": "containerd://1.7.22",
                     "kubeletVersion": "v1.37.2", "kubeProxyVersion": "v1.37.2", "operatingSystem": "linux",
                     "architecture": "amd64"},
        "images": [],
    });
    let target = kib * 1024;
    let mut n = 0;
    while status.to_string().len() < target {
        let name = format!("registry.example.com/team-{}/service-{n}", n % 17);
        let image = json!({
            "names": [format!("{name}@sha256:{:064x}", n * 7919 + i), format!("{name}:v1.{n}.{}", i % 10)],
            "sizeBytes": 10_000_000 + n * 1_234_567,
        });
        if let Some(list) = status["images"].as_array_mut() {
            list.push(image);
        }
        n += 1;
    }
    status
}

/// Creates the synthetic Nodes, `concurrency` at a time.
async fn create_nodes(client: &Client, args: &Args) -> Result<usize, BoxError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let size = node_status(0, args.node_status_kib).to_string().len();
    futures::stream::iter(0..args.nodes)
        .map(|i| {
            let nodes = nodes.clone();
            let kib = args.node_status_kib;
            async move {
                let name = format!("scale-node-{i}");
                let n: Node = serde_json::from_value(json!({"metadata": {"name": name,
                    "labels": {"kubernetes.io/hostname": name, "node.kubernetes.io/instance-type": "m6i.4xlarge",
                               "topology.kubernetes.io/zone": format!("zone-{}", i % 3)}}}))?;
                match nodes.create(&PostParams::default(), &n).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(e) => return Err(e.into()),
                }
                nodes
                    .patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"status": node_status(i, kib)})),
                    )
                    .await?;
                Ok::<_, BoxError>(())
            }
        })
        .buffer_unordered(args.concurrency)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(size)
}

/// The synthetic pairs: `pair-<i>` over two synthetic Nodes, one FloatingIP each.
fn synthetic(i: usize, nodes: usize) -> (String, String, String, String) {
    let a = (2 * i) % nodes.max(2);
    let b = (2 * i + 1) % nodes.max(2);
    let vip = format!("172.{}.{}.{}/16", 16 + i / 65536 % 16, i / 256 % 256, i % 256);
    (format!("pair-{i}"), format!("scale-node-{a}"), format!("scale-node-{b}"), vip)
}

async fn create_pairs(client: &Client, args: &Args, real_yaml: &str, synthetic_pairs: usize) -> Result<(), BoxError> {
    havip_e2e::harness::api::apply_documents(client, real_yaml).await.map_err(|e| e.to_string())?;
    let pairs: Api<HAPair> = Api::all(client.clone());
    let fips: Api<havip_crds::FloatingIP> = Api::all(client.clone());
    futures::stream::iter(0..synthetic_pairs)
        .map(|i| {
            let (pairs, fips) = (pairs.clone(), fips.clone());
            async move {
                let (name, a, b, vip) = synthetic(i, args.nodes);
                let fip = json!({
                    "apiVersion": "havip.io/v1alpha1", "kind": "FloatingIP", "metadata": {"name": format!("{name}-vip")},
                    "spec": {"pair": name, "address": vip}
                });
                fips.patch(&format!("{name}-vip"), &PatchParams::apply("bench"), &Patch::Apply(&fip)).await?;
                let pair = json!({
                    "apiVersion": "havip.io/v1alpha1", "kind": "HAPair", "metadata": {"name": name},
                    "spec": {"members": [{"node": a, "priority": 200}, {"node": b, "priority": 100}]}
                });
                pairs.patch(&name, &PatchParams::apply("bench"), &Patch::Apply(&pair)).await?;
                Ok::<_, BoxError>(())
            }
        })
        .buffer_unordered(args.concurrency)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// A simulated agent's member entry of pair `i`.
fn entry(i: usize, node: &str, role: &str, revision: &str, nodes: usize) -> serde_json::Value {
    let (name, _, _, vip) = synthetic(i, nodes);
    let now = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    json!({
        "apiVersion": "havip.io/v1alpha1", "kind": "HAPair", "metadata": {"name": name},
        "status": {"members": [{
            "node": node, "role": role, "epoch": 1, "ready": [{"address": vip, "ready": true}],
            "heard": [{"path": "internal", "heard": true}], "appliedRevision": revision,
            "agentVersion": "0.1.0", "protocolVersion": "1.0", "keyId": 1, "lastSeen": now,
        }]},
    })
}

/// The simulated agents take the Leases and report, so that every synthetic pair goes Live.
async fn simulate_agents(client: &Client, args: &Args, synthetic_pairs: usize) -> Result<(), BoxError> {
    let pairs: Api<HAPair> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    futures::stream::iter(0..synthetic_pairs)
        .map(|i| {
            let (pairs, leases) = (pairs.clone(), leases.clone());
            async move {
                let (name, a, b, _) = synthetic(i, args.nodes);
                let lease_name = havip_crds::lease::pair_lease_name(&name);
                let mut lease = leases.get(&lease_name).await?;
                let spec = lease.spec.get_or_insert_with(Default::default);
                spec.holder_identity = Some(a.clone());
                spec.lease_transitions = Some(1);
                lease.metadata.managed_fields = None;
                leases.replace(&lease_name, &PostParams::default(), &lease).await?;
                let rev = pairs.get(&name).await?.status.and_then(|s| s.config_revision).unwrap_or_default();
                for (node, role) in [(&a, "Active"), (&b, "Standby")] {
                    let pp = PatchParams::apply(&manager::agent(node)).force();
                    pairs.patch_status(&name, &pp, &Patch::Apply(&entry(i, node, role, &rev, args.nodes))).await?;
                }
                Ok::<_, BoxError>(())
            }
        })
        .buffer_unordered(args.concurrency)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// Lists every pair (in pages) and counts those for which `pred` holds.
async fn count_pairs(client: &Client, pred: impl Fn(&HAPair) -> bool) -> Result<usize, BoxError> {
    let api: Api<HAPair> = Api::all(client.clone());
    let mut params = ListParams::default().limit(250);
    let mut n = 0;
    loop {
        let page = api.list(&params).await?;
        n += page.items.iter().filter(|p| pred(p)).count();
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => params = params.continue_token(&c),
            None => return Ok(n),
        }
    }
}

/// Polls until `want` pairs satisfy `pred` (or `timeout`); returns how many did.
async fn wait_pairs(
    client: &Client,
    want: usize,
    timeout: Duration,
    pred: impl Fn(&HAPair) -> bool,
    mut sample: impl FnMut(),
) -> Result<usize, BoxError> {
    let deadline = Instant::now() + timeout;
    loop {
        sample();
        let n = count_pairs(client, &pred).await?;
        if n >= want || Instant::now() > deadline {
            return Ok(n);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The n0 agent's watch counters by kind (applied + deleted), and its listed objects.
fn watch_counts(lab: &KubeLab) -> (BTreeMap<String, f64>, f64) {
    let mut by = BTreeMap::new();
    let mut listed = 0.0;
    for l in lab.agent_metrics(0).lines().filter(|l| l.starts_with("havip_agent_watch_events_total{")) {
        let label = |k: &str| l.split(&format!("{k}=\"")).nth(1).and_then(|r| r.split('"').next()).unwrap_or("");
        let v: f64 = l.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
        if label("event") == "listed" {
            listed += v;
        } else {
            *by.entry(label("kind").to_owned()).or_insert(0.0) += v;
        }
    }
    (by, listed)
}

fn phase(p: &HAPair) -> Option<Phase> {
    p.status.as_ref().and_then(|s| s.phase)
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if let Err(why) = havip_e2e::host::netns::require_root() {
        eprintln!("bench-scale needs root: {why}");
        return std::process::ExitCode::FAILURE;
    }
    // Standard output carries the JSON lines alone.
    havip_e2e::host::logging::init_tracing_quiet();
    match run(&args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-scale: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), BoxError> {
    let mut lab = KubeLab::start(KubeLabOptions::agents_only(2))?;
    let rt = tokio::runtime::Runtime::new()?;
    let client = rt.block_on(lab.client())?;
    let agent_build = build_of(havip_e2e::harness::agent::agent_binary().ok());
    let operator_build = build_of(havip_e2e::harness::kubelab::operator_binary().ok());

    // The cluster: synthetic Nodes, then the operator (its first list is the big one).
    let t = Instant::now();
    let status_bytes = rt.block_on(create_nodes(&client, args))?;
    let nodes_seconds = t.elapsed().as_secs_f64();
    eprintln!("bench-scale: {} Nodes of {status_bytes} bytes of status in {nodes_seconds:.0} s", args.nodes);
    lab.start_operator()?;
    let op_pid = lab.operator.as_ref().and_then(|p| p.pid());
    let mut op_max = 0u64;
    let started = Instant::now();
    // Idle with the Nodes: the operator has listed them once its RSS settles.
    let mut last = 0;
    while started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_secs(2));
        let now = rss_kib(op_pid);
        op_max = op_max.max(now);
        if now > 0 && now.abs_diff(last) < 256 && started.elapsed() > Duration::from_secs(10) {
            break;
        }
        last = now;
    }
    let op_idle = rss_kib(op_pid);

    // The pairs: `real_pairs` on the real nodes (each its own VIP), the rest synthetic.
    for i in [0, 1] {
        lab.serve(i, 8080)?;
    }
    let real_names: Vec<String> = (0..args.real_pairs).map(|j| format!("real-{j}")).collect();
    let real: String = (0..args.real_pairs)
        .map(|j| format!("{}---\n", lab.pair_yaml_on(&format!("real-{j}"), &[0, 1], j, 8080)))
        .collect();
    let synthetic_pairs = args.pairs.saturating_sub(usize::from(args.real_pairs));
    let t = Instant::now();
    rt.block_on(create_pairs(&client, args, &real, synthetic_pairs))?;
    let pairs_seconds = t.elapsed().as_secs_f64();
    println!(
        "{}",
        json!({"bench": "scale_setup", "nodes": args.nodes, "node_status_bytes": status_bytes, "pairs": args.pairs,
               "real_pairs": args.real_pairs, "create_nodes_s": (nodes_seconds * 10.0).round() / 10.0,
               "create_pairs_s": (pairs_seconds * 10.0).round() / 10.0})
    );
    let (converged, converged_s, live, live_s) = {
        let mut sample = || op_max = op_max.max(rss_kib(op_pid));
        let converged = rt.block_on(wait_pairs(
            &client,
            args.pairs,
            Duration::from_secs(900),
            |p| p.status.as_ref().and_then(|s| s.config_revision.as_ref()).is_some(),
            &mut sample,
        ))?;
        let converged_s = t.elapsed().as_secs_f64();
        rt.block_on(simulate_agents(&client, args, synthetic_pairs))?;
        let live = rt.block_on(wait_pairs(
            &client,
            args.pairs,
            Duration::from_secs(900),
            |p| phase(p) == Some(Phase::Live),
            &mut sample,
        ))?;
        (converged, converged_s, live, t.elapsed().as_secs_f64())
    };
    let op_live = rss_kib(op_pid);

    // The other pairs keep writing status like real agents: each member every
    // `refresh_seconds`, spread evenly.
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let writer = {
        let (client, stop, writes) = (client.clone(), stop.clone(), writes.clone());
        let (nodes, refresh) = (args.nodes, args.refresh_seconds.max(1));
        rt.spawn(async move {
            let pairs: Api<HAPair> = Api::all(client);
            let mut revs: BTreeMap<usize, String> = BTreeMap::new();
            let members = 2 * synthetic_pairs.max(1);
            let every = Duration::from_secs(refresh) / u32::try_from(members).unwrap_or(u32::MAX);
            let mut tick = tokio::time::interval(every.max(Duration::from_millis(1)));
            let mut k = 0usize;
            while !stop.load(Ordering::SeqCst) {
                tick.tick().await;
                let (i, standby) = (k / 2 % synthetic_pairs.max(1), k % 2 == 1);
                k += 1;
                let (name, a, b, _) = synthetic(i, nodes);
                if !revs.contains_key(&i)
                    && let Ok(p) = pairs.get(&name).await
                {
                    revs.insert(i, p.status.and_then(|s| s.config_revision).unwrap_or_default());
                }
                let rev = revs.get(&i).cloned().unwrap_or_default();
                let (node, role) = if standby { (&b, "Standby") } else { (&a, "Active") };
                let pp = PatchParams::apply(&manager::agent(node)).force();
                if pairs.patch_status(&name, &pp, &Patch::Apply(&entry(i, node, role, &rev, nodes))).await.is_ok() {
                    writes.fetch_add(1, Ordering::SeqCst);
                }
            }
        })
    };

    // The measured agent restarts in the big cluster (its start-up list of every pair),
    // then serves its pairs through a steady window.
    lab.stop_agent(0);
    lab.start_agent(0)?;
    let n0 = lab.topo.node(0).name.clone();
    let back = rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let mut ok = 0;
            for name in &real_names {
                if let Ok(p) = lab.pair(name).await
                    && phase(&p) == Some(Phase::Live)
                    && p.status
                        .as_ref()
                        .is_some_and(|s| s.members.iter().any(|m| m.node == n0 && m.heard.iter().all(|h| h.heard)))
                {
                    ok += 1;
                }
            }
            if ok == real_names.len() || Instant::now() > deadline {
                return ok == real_names.len();
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    std::thread::sleep(Duration::from_secs(10));
    let agent_pid = lab.agents[0].as_ref().and_then(|p| p.pid());
    let (before, _) = watch_counts(&lab);
    let writes_before = writes.load(Ordering::SeqCst);
    let window = Instant::now();
    let mut agent_max = 0u64;
    while window.elapsed() < Duration::from_secs(args.steady_seconds) {
        agent_max = agent_max.max(rss_kib(agent_pid));
        op_max = op_max.max(rss_kib(op_pid));
        std::thread::sleep(Duration::from_secs(2));
    }
    let secs = window.elapsed().as_secs_f64();
    let (after, listed) = watch_counts(&lab);
    let cluster_writes = writes.load(Ordering::SeqCst) - writes_before;
    stop.store(true, Ordering::SeqCst);
    rt.block_on(async {
        let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
    });
    let per_min = |n: f64| (n * 60.0 / secs * 10.0).round() / 10.0;
    let by_kind: BTreeMap<String, f64> =
        after.iter().map(|(k, v)| (k.clone(), per_min(v - before.get(k).copied().unwrap_or(0.0)))).collect();
    let total: f64 = by_kind.values().sum();
    let agent_rss = rss_kib(agent_pid);
    let agent_private = agent_pid.map_or(0, |p| footprint::private_kib(&[p]));
    let op_end = rss_kib(op_pid);
    op_max = op_max.max(op_end);
    println!(
        "{}",
        json!({"bench": "scale_operator", "nodes": args.nodes, "pairs": args.pairs, "build": operator_build,
               "rss_kib_idle_with_nodes": op_idle, "rss_kib_live": op_live, "rss_kib_end": op_end, "rss_kib_max": op_max,
               "pairs_converged": converged, "converged_s": (converged_s * 10.0).round() / 10.0,
               "pairs_live": live, "time_to_live_all_s": (live_s * 10.0).round() / 10.0,
               "goal_rss_mib": 256, "goal_live_s": 120,
               "goal_met": op_max <= 256 * 1024 && live >= args.pairs && live_s <= 120.0})
    );
    println!(
        "{}",
        json!({"bench": "scale_agent", "node": n0, "own_pairs": args.real_pairs, "nodes": args.nodes, "pairs": args.pairs,
               "build": agent_build, "restarted_and_live": back, "rss_kib": agent_rss, "rss_kib_max": agent_max,
               "private_kib": agent_private,
               "window_seconds": secs.round(), "watch_events_per_minute": (total * 10.0).round() / 10.0,
               "watch_events_per_minute_by_kind": by_kind, "objects_listed_at_start": listed,
               "cluster_hapair_status_writes_per_minute": per_min(cluster_writes as f64),
               "goal_rss_mib": 20, "goal_met": back && agent_max <= 20 * 1024})
    );
    Ok(())
}
