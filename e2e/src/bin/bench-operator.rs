//! `bench-operator`: the operator's footprint and reconcile time with many pairs, on a
//! local control plane (real kube-apiserver + etcd). Not a test: it prints JSON lines.
//!
//! ```text
//! cargo build --release -p havip-operator --bin havip-operator -p havip-e2e --bin bench-operator
//! target/release/bench-operator --pairs 1000
//! ```
//!
//! Stages: `created` (N pairs and N FloatingIPs applied), `converged` (every pair has its
//! Lease, key Secret and a Pending status), `live` (simulated agents reported and took
//! the Leases; every pair Live), `steady` (a window with nothing changing: reconciles,
//! status writes, API requests of the operator). Each line carries the operator's RSS,
//! CPU time and reconcile-duration statistics from its own metrics.

use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use havip_crds::{FloatingIP, HAPair, Phase, manager};
use havip_e2e::bench::footprint;
use havip_e2e::harness::controlplane::ControlPlane;
use havip_e2e::harness::metrics::{self, metric_sum};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde::Deserialize;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Operator benchmark on a local control plane.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// Number of HAPairs (each with one FloatingIP).
    #[arg(long, env = "BENCH_PAIRS", default_value = "1000")]
    pairs: usize,
    /// Number of Nodes the pairs are spread over.
    #[arg(long, env = "BENCH_NODES", default_value = "100")]
    nodes: usize,
    /// API requests in flight while creating objects.
    #[arg(long, env = "BENCH_CONCURRENCY", default_value = "32")]
    concurrency: usize,
    /// Length of the steady-state window, in seconds.
    #[arg(long, env = "BENCH_STEADY_SECONDS", default_value = "30")]
    steady_seconds: u64,
    /// The operator binary (default: `havip-operator` next to this one).
    #[arg(long, env = "BENCH_OPERATOR_BIN")]
    operator_bin: Option<PathBuf>,
    /// Simulate agents (member reports and Lease holders) so that pairs go Live.
    #[arg(long, env = "BENCH_AGENTS", default_value = "true", action = clap::ArgAction::Set)]
    agents: bool,
}

const NS: &str = "havip-system";

struct Operator {
    child: Child,
    metrics_port: u16,
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Operator {
    fn metrics(&self) -> String {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.metrics_port)) else { return String::new() };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    fn rss_kib(&self) -> u64 {
        footprint::rss_kib(&[self.child.id()])
    }

    /// User + system CPU seconds.
    fn cpu_seconds(&self) -> f64 {
        footprint::cpu_seconds(self.child.id())
    }
}

/// The sum of the samples whose line starts with `prefix` (a name, or a name and labels).
fn metric(text: &str, prefix: &str) -> f64 {
    metric_sum(text, prefix, &[])
}

/// (count, mean ms, p50 ms, p99 ms) of the hapair reconcile histogram (quantiles are
/// bucket upper bounds).
fn reconcile_stats(text: &str) -> (f64, f64, f64, f64) {
    let prefix = "havip_operator_reconcile_duration_seconds";
    let count = metric(text, &format!("{prefix}_count{{controller=\"hapair\"}}"));
    let sum = metric(text, &format!("{prefix}_sum{{controller=\"hapair\"}}"));
    let mut buckets: Vec<(f64, f64)> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{prefix}_bucket{{")) && l.contains("controller=\"hapair\""))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let q = |p: f64| buckets.iter().find(|(_, c)| *c >= p * count).map(|(le, _)| le * 1000.0).unwrap_or(f64::NAN);
    let mean = if count > 0.0 { sum / count * 1000.0 } else { 0.0 };
    (count, mean, q(0.5), q(0.99))
}

fn line(stage: &str, started: Instant, op: &Operator, extra: serde_json::Value) {
    let text = op.metrics();
    let (count, mean, p50, p99) = reconcile_stats(&text);
    let mut v = serde_json::json!({
        "stage": stage,
        "seconds": (started.elapsed().as_secs_f64() * 100.0).round() / 100.0,
        "rss_kib": op.rss_kib(),
        "cpu_seconds": op.cpu_seconds(),
        "reconciles": count,
        "reconcile_mean_ms": (mean * 100.0).round() / 100.0,
        "reconcile_p50_ms_le": p50,
        "reconcile_p99_ms_le": p99,
        "status_writes": metric(&text, "havip_operator_status_writes_total{kind=\"HAPair\"}"),
        "errors": metric(&text, "havip_operator_errors_total"),
    });
    if let (Some(obj), serde_json::Value::Object(extra)) = (v.as_object_mut(), extra) {
        obj.extend(extra);
    }
    println!("{v}");
}

/// The API server's count of requests by the operator's user agent, by verb.
async fn apiserver_requests(client: &Client) -> Result<serde_json::Value, BoxError> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(req).await?;
    let mut by_verb = std::collections::BTreeMap::<String, f64>::new();
    for ((verb, resource), v) in metrics::apiserver_requests(&text) {
        // Only requests to our resources and the objects the operator writes.
        if ["hapairs", "floatingips", "leases", "secrets", "events", "nodes"].contains(&resource.as_str()) {
            *by_verb.entry(format!("{resource}:{verb}")).or_default() += v;
        }
    }
    Ok(serde_json::to_value(by_verb)?)
}

fn yaml_docs(text: &str) -> Result<Vec<serde_json::Value>, BoxError> {
    let mut out = Vec::new();
    for d in serde_yaml::Deserializer::from_str(text) {
        let v = serde_json::Value::deserialize(d)?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    // The control plane's processes are tied to this thread: keep it alive throughout.
    let cp = ControlPlane::start(Default::default())?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(bench(&cp, &args))
}

async fn bench(cp: &ControlPlane, args: &Args) -> Result<(), BoxError> {
    let client = cp.client().await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let root = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    for doc in yaml_docs(&std::fs::read_to_string(root.join(havip_crds::CRDS_PATH))?)? {
        let crd: CustomResourceDefinition = serde_json::from_value(doc)?;
        crds.patch(&crd.name_any(), &PatchParams::apply("bench").force(), &Patch::Apply(&crd)).await?;
    }
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": NS}}))?;
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await?;
    // Established?
    let deadline = Instant::now() + Duration::from_secs(30);
    while Api::<HAPair>::all(client.clone()).list(&ListParams::default().limit(1)).await.is_err() {
        if Instant::now() > deadline {
            return Err("CRDs not established".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let nodes: Api<Node> = Api::all(client.clone());
    futures::stream::iter(0..args.nodes)
        .map(|i| {
            let nodes = nodes.clone();
            async move {
                let name = format!("node-{i}");
                let n: Node = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
                nodes.create(&PostParams::default(), &n).await?;
                let ip = format!("10.{}.{}.{}", i / 65536 % 256, i / 256 % 256, i % 256);
                let patch = serde_json::json!({"status": {"addresses": [{"type": "InternalIP", "address": ip}]}});
                nodes.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                Ok::<_, BoxError>(())
            }
        })
        .buffer_unordered(args.concurrency)
        .try_collect::<Vec<_>>()
        .await?;

    let bin = match &args.operator_bin {
        Some(b) => b.clone(),
        None => std::env::current_exe()?.with_file_name("havip-operator"),
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let log = std::fs::File::create(cp.dir().join("operator.log"))?;
    let child = Command::new(&bin)
        .args(["--kubeconfig", &cp.kubeconfig().display().to_string(), "--namespace", NS])
        .args(["--metrics-address", &format!("127.0.0.1:{port}"), "--identity", "bench"])
        .env("RUST_LOG", "warn")
        .stdout(log.try_clone()?)
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("start {}: {e}", bin.display()))?;
    let op = Operator { child, metrics_port: port };
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(&op.metrics(), "havip_operator_leader ") < 1.0 {
        if Instant::now() > deadline {
            return Err("the operator did not become leader".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    line("idle", Instant::now(), &op, serde_json::json!({"pairs": 0}));

    let started = Instant::now();
    let pairs: Api<HAPair> = Api::all(client.clone());
    let fips: Api<FloatingIP> = Api::all(client.clone());
    let n_nodes = args.nodes.max(2);
    futures::stream::iter(0..args.pairs)
        .map(|i| {
            let (pairs, fips) = (pairs.clone(), fips.clone());
            async move {
                let (a, b) = (i % n_nodes, (i + 1) % n_nodes);
                let name = format!("pair-{i}");
                let pair = serde_json::json!({
                    "apiVersion": "havip.io/v1alpha1", "kind": "HAPair", "metadata": {"name": name},
                    "spec": {"members": [{"node": format!("node-{a}"), "priority": 200}, {"node": format!("node-{b}"), "priority": 100}]}
                });
                pairs.patch(&name, &PatchParams::apply("bench"), &Patch::Apply(&pair)).await?;
                let fip = serde_json::json!({
                    "apiVersion": "havip.io/v1alpha1", "kind": "FloatingIP", "metadata": {"name": format!("vip-{i}")},
                    "spec": {"pair": name, "address": format!("172.{}.{}.{}/16", 16 + i / 65536 % 16, i / 256 % 256, i % 256)}
                });
                fips.patch(&format!("vip-{i}"), &PatchParams::apply("bench"), &Patch::Apply(&fip)).await?;
                Ok::<_, BoxError>(())
            }
        })
        .buffer_unordered(args.concurrency)
        .try_collect::<Vec<_>>()
        .await?;
    line("created", started, &op, serde_json::json!({"pairs": args.pairs}));

    let converged = wait_all(&pairs, args.pairs, |p| {
        p.status.as_ref().and_then(|s| s.phase).is_some() && p.status.as_ref().and_then(|s| s.vips) == Some(1)
    })
    .await?;
    let leases = Api::<Lease>::namespaced(client.clone(), NS).list(&ListParams::default()).await?.items.len();
    line(
        "converged",
        started,
        &op,
        serde_json::json!({"pairs": args.pairs, "pairs_with_status": converged, "leases": leases}),
    );

    if args.agents {
        let live_started = Instant::now();
        let leases_api: Api<Lease> = Api::namespaced(client.clone(), NS);
        futures::stream::iter(0..args.pairs)
            .map(|i| {
                let (pairs, leases_api) = (pairs.clone(), leases_api.clone());
                async move {
                    let name = format!("pair-{i}");
                    let (a, b) = (format!("node-{}", i % n_nodes), format!("node-{}", (i + 1) % n_nodes));
                    let mut lease = leases_api.get(&havip_crds::lease::pair_lease_name(&name)).await?;
                    let spec = lease.spec.get_or_insert_with(Default::default);
                    spec.holder_identity = Some(a.clone());
                    spec.lease_transitions = Some(1);
                    lease.metadata.managed_fields = None;
                    leases_api
                        .replace(&havip_crds::lease::pair_lease_name(&name), &PostParams::default(), &lease)
                        .await?;
                    let p = pairs.get(&name).await?;
                    let rev = p.status.and_then(|s| s.config_revision).unwrap_or_default();
                    let vip = format!("172.{}.{}.{}/16", 16 + i / 65536 % 16, i / 256 % 256, i % 256);
                    let now = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
                    for (node, role) in [(&a, "Active"), (&b, "Standby")] {
                        let patch = serde_json::json!({
                            "apiVersion": "havip.io/v1alpha1", "kind": "HAPair",
                            "status": {"members": [{
                                "node": node, "role": role, "epoch": 1, "ready": [{"address": vip, "ready": true}],
                                "heard": [{"path": "internal", "heard": true}], "appliedRevision": rev,
                                "agentVersion": "0.1.0", "protocolVersion": "1.0", "keyId": 1, "lastSeen": now,
                            }]},
                        });
                        pairs
                            .patch_status(
                                &name,
                                &PatchParams::apply(&manager::agent(node)).force(),
                                &Patch::Apply(&patch),
                            )
                            .await?;
                    }
                    Ok::<_, BoxError>(())
                }
            })
            .buffer_unordered(args.concurrency)
            .try_collect::<Vec<_>>()
            .await?;
        let live =
            wait_all(&pairs, args.pairs, |p| p.status.as_ref().and_then(|s| s.phase) == Some(Phase::Live)).await?;
        line("live", live_started, &op, serde_json::json!({"pairs": args.pairs, "pairs_live": live}));
    }

    let before_text = op.metrics();
    let before_api = apiserver_requests(&client).await.unwrap_or_default();
    let (before_count, ..) = reconcile_stats(&before_text);
    let before_writes = metric(&before_text, "havip_operator_status_writes_total{kind=\"HAPair\"}");
    let before_cpu = op.cpu_seconds();
    let window = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.steady_seconds)).await;
    let after_text = op.metrics();
    let after_api = apiserver_requests(&client).await.unwrap_or_default();
    let (after_count, ..) = reconcile_stats(&after_text);
    let secs = window.elapsed().as_secs_f64();
    let window_mean = {
        let sum = |t: &str| metric(t, "havip_operator_reconcile_duration_seconds_sum{controller=\"hapair\"}");
        let n = after_count - before_count;
        if n > 0.0 { ((sum(&after_text) - sum(&before_text)) / n * 1000.0 * 100.0).round() / 100.0 } else { 0.0 }
    };
    let mut api_delta = serde_json::Map::new();
    if let (Some(a), Some(b)) = (after_api.as_object(), before_api.as_object()) {
        for (k, v) in a {
            let d = v.as_f64().unwrap_or(0.0) - b.get(k).and_then(|x| x.as_f64()).unwrap_or(0.0);
            if d > 0.0 {
                api_delta.insert(k.clone(), serde_json::json!(d));
            }
        }
    }
    line(
        "steady",
        started,
        &op,
        serde_json::json!({
            "pairs": args.pairs,
            "window_seconds": (secs * 10.0).round() / 10.0,
            "reconciles_per_second": ((after_count - before_count) / secs * 100.0).round() / 100.0,
            "reconcile_mean_ms_in_window": window_mean,
            "status_writes_in_window": metric(&after_text, "havip_operator_status_writes_total{kind=\"HAPair\"}") - before_writes,
            "cpu_seconds_in_window": ((op.cpu_seconds() - before_cpu) * 100.0).round() / 100.0,
            "apiserver_requests_in_window": api_delta,
        }),
    );
    Ok(())
}

async fn wait_all(pairs: &Api<HAPair>, n: usize, pred: impl Fn(&HAPair) -> bool) -> Result<usize, BoxError> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let list = pairs.list(&ListParams::default()).await?;
        let done = list.items.iter().filter(|p| pred(p)).count();
        if done >= n {
            return Ok(done);
        }
        if Instant::now() > deadline {
            return Ok(done);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
