//! The Grafana dashboard against a live lab, through the tool that runs its queries: a real
//! Prometheus server (built from Prometheus's Go module by `hack/testbin.sh prometheus`,
//! like promtool) scrapes the lab's agents and operator every second with the target
//! labels the chart's ServiceMonitors give them (`namespace`, `pod`, and the agents'
//! `node` relabeling). The lab goes through what the panels show — an election, a VIP
//! conflict, a stranger's datagram, a planned failover, a node cut and its takeover —
//! and then every panel's query (and every variable's `label_values`) is run over the
//! test's time range exactly as Grafana sends it, with the variables set to the lab's
//! namespace and pair (a regex match on a label the series lack would match everything
//! if `.*` were used). Each query must return data; the only ones that must return none
//! are the pair-state counts that mean trouble the lab never had (more than one Active,
//! a suspended pair), and the "nobody active" count may go either way (a takeover can
//! fall between two scrapes).
//!
//! Root (network namespaces) and the Prometheus build are needed; without either the
//! test says SKIPPED and returns.

use havip_e2e::kubelab::{AGENT_METRICS_PORT, KubeLab, KubeLabOptions, NAMESPACE};
use havip_e2e::netns;
use havip_e2e::process::ManagedProcess;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const PAIR: &str = "web";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Prometheus server binary, or `None` (printed) when it cannot be built.
fn prometheus() -> Option<PathBuf> {
    let out = Command::new("bash").arg(repo().join("hack/testbin.sh")).arg("prometheus").output().ok()?;
    if !out.status.success() {
        eprintln!("SKIPPED: prometheus cannot be built: {}", String::from_utf8_lossy(&out.stderr));
        return None;
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default());
    Some(dir.join("prometheus")).filter(|p| p.is_file())
}

/// Forwards TCP connections from 127.0.0.1 (a port of the host's namespace, which is where
/// Prometheus runs) to 127.0.0.1:`port` inside namespace `ns` (where an agent serves its
/// metrics), byte for byte: Prometheus talks to the agent's own HTTP server.
fn relay(ns: &str, port: u16) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("relay listener");
    let addr = listener.local_addr().expect("relay address");
    let ns = ns.to_owned();
    std::thread::spawn(move || {
        for down in listener.incoming().flatten() {
            let ns = ns.clone();
            std::thread::spawn(move || {
                let Ok(Ok(up)) = netns::in_netns(&ns, move || TcpStream::connect(("127.0.0.1", port))) else {
                    return; // the agent is down: the scrape fails, as it would
                };
                let (Ok(mut down_r), Ok(mut up_w)) = (down.try_clone(), up.try_clone()) else { return };
                let forward = std::thread::spawn(move || {
                    let _ = std::io::copy(&mut down_r, &mut up_w);
                    let _ = up_w.shutdown(std::net::Shutdown::Write);
                });
                let (mut up_r, mut down_w) = (up, down);
                let _ = std::io::copy(&mut up_r, &mut down_w);
                let _ = down_w.shutdown(std::net::Shutdown::Write);
                let _ = forward.join();
            });
        }
    });
    addr
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `GET path` on Prometheus's HTTP API: the `data` of a successful answer, or why not.
fn api(prom: SocketAddr, path: &str) -> Result<Value, String> {
    let mut s = TcpStream::connect(prom).map_err(|e| format!("connect {prom}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {prom}\r\n\r\n").as_bytes()).map_err(|e| e.to_string())?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).map_err(|e| format!("read: {e}"))?;
    let body = raw.split_once("\r\n\r\n").map(|(_, b)| b).ok_or_else(|| format!("no HTTP body: {raw}"))?;
    let v: Value = serde_json::from_str(body).map_err(|e| format!("{e}: {body}"))?;
    if v["status"] != "success" {
        return Err(format!("{path}: {v}"));
    }
    Ok(v["data"].clone())
}

fn now_s() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or_default()
}

/// A range query as a Grafana time-series panel sends it; the series it returned.
fn range(prom: SocketAddr, expr: &str, start: f64, end: f64) -> Result<Vec<Value>, String> {
    let path = format!("/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step=1", percent_encode(expr));
    let data = api(prom, &path)?;
    Ok(data["result"].as_array().cloned().unwrap_or_default())
}

/// The Prometheus configuration: the targets the chart's ServiceMonitors would give it.
fn config(agents: &[(String, SocketAddr)], operator: SocketAddr) -> String {
    let mut y = String::from(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: havip-agent-metrics\n    static_configs:\n",
    );
    for (node, addr) in agents {
        y.push_str(&format!(
            "      - targets: ['{addr}']\n        labels: {{namespace: {NAMESPACE}, pod: havip-agent-{node}, service: havip-agent-metrics, endpoint: metrics, node: {node}}}\n"
        ));
    }
    y.push_str(&format!(
        "  - job_name: havip-operator-metrics\n    static_configs:\n      - targets: ['{operator}']\n        labels: {{namespace: {NAMESPACE}, pod: havip-operator-0, service: havip-operator-metrics, endpoint: metrics}}\n"
    ));
    y
}

/// How a query of the dashboard must answer after the lab's run.
#[derive(Debug, PartialEq)]
enum Expect {
    Data,
    Nothing,
    Either,
}

/// What the "Pairs by state" stat's targets count (by their legend): trouble the lab never
/// had must count nothing.
fn expectation(panel: &str, legend: &str) -> Expect {
    match (panel, legend) {
        ("Pairs by state", "more than one active" | "suspended (flapping)") => Expect::Nothing,
        ("Pairs by state", "nobody active" | "serving, no standby") => Expect::Either,
        _ => Expect::Data,
    }
}

fn wait(what: &str, secs: u64, cond: impl FnMut() -> bool) {
    let mut cond = cond;
    netns::wait_until(what, Duration::from_secs(secs), Duration::from_millis(100), || Ok(cond()))
        .unwrap_or_else(|e| panic!("{e}"));
}

fn start_prometheus(bin: &Path, dir: &Path, cfg: &str) -> (ManagedProcess, SocketAddr) {
    std::fs::write(dir.join("prometheus.yml"), cfg).expect("write the configuration");
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let args = vec![
        format!("--config.file={}", dir.join("prometheus.yml").display()),
        format!("--storage.tsdb.path={}", dir.join("tsdb").display()),
        format!("--web.listen-address={addr}"),
        "--log.level=warn".to_owned(),
    ];
    let p = ManagedProcess::spawn("prometheus", bin, &args, &[], &dir.join("prometheus.log")).expect("prometheus");
    (p, addr)
}

#[test]
fn every_dashboard_panel_returns_data_from_a_live_lab_scraped_by_prometheus() {
    if !netns::skip_unless_root(module_path!()) {
        return;
    }
    let Some(bin) = prometheus() else { return };
    havip_e2e::init_tracing();
    let lab = KubeLab::start(KubeLabOptions { nodes: 2, ..Default::default() }).expect("lab");
    let t0 = now_s();
    let agents: Vec<(String, SocketAddr)> =
        (0..2).map(|i| (lab.topo.node(i).name.clone(), relay(&lab.topo.node(i).ns, AGENT_METRICS_PORT))).collect();
    let mut operator = None;
    wait("the operator to log its metrics address", 20, || {
        operator = lab.operator_metrics_address();
        operator.is_some()
    });
    let operator = operator.expect("operator metrics address");
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut prom_proc, prom) = start_prometheus(&bin, dir.path(), &config(&agents, operator));
    let targets_up = || {
        api(prom, "/api/v1/targets?state=active").is_ok_and(|d| {
            let t = d["activeTargets"].as_array().cloned().unwrap_or_default();
            t.len() == 3 && t.iter().all(|t| t["health"] == "up")
        })
    };
    netns::wait_until(
        "Prometheus to scrape all three targets",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || Ok(targets_up()),
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e}: {:?}\n{}",
            api(prom, "/api/v1/targets?state=active"),
            std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default()
        )
    });

    // An election.
    lab.block_on(lab.apply(&lab.pair_yaml(PAIR))).expect("apply the pair");
    wait("n0 to hold the VIP", 20, || lab.holders().is_ok_and(|h| h == [0]));

    // A foreign host answering for the VIP (the gateway adds it too): a VIP conflict.
    let gw = lab.topo.gateway().clone();
    let vip = format!("{}/24", lab.topo.vip(0));
    netns::exec(&gw.ns, "ip", &["addr", "add", &vip, "dev", &gw.ifname]).expect("add the VIP on the gateway");
    wait("n0 to count a VIP conflict", 15, || {
        lab.agent_metric_sum(0, "havip_agent_vip_conflicts", &[]).is_some_and(|n| n >= 1.0)
    });
    netns::exec(&gw.ns, "ip", &["addr", "del", &vip, "dev", &gw.ifname]).expect("remove it");

    // A stranger's datagram on the heartbeat port: dropped and counted.
    let n1 = lab.topo.node(1).data_ip;
    let port = u16::try_from(havip_crds::defaults::HEARTBEAT_PORT).expect("a port");
    netns::in_netns(&lab.topo.client().ns, move || {
        let s = std::net::UdpSocket::bind("0.0.0.0:0").expect("udp");
        for _ in 0..3 {
            let _ = s.send_to(b"not a heartbeat", (n1, port));
        }
    })
    .expect("send");
    wait("n1 to count the dropped datagrams", 10, || {
        lab.agent_metric_sum(1, "havip_agent_heartbeats_dropped", &[]).is_some_and(|n| n >= 1.0)
    });

    // A planned failover, then the new holder dies (its management cable first, then the
    // data cable: no handover over the management path can precede the cut): n0 takes over.
    let (ok, out) = lab.plugin(&["failover", PAIR]);
    assert!(ok, "planned failover: {out}");
    wait("n1 to hold the VIP", 20, || lab.holders().is_ok_and(|h| h == [1]));
    lab.topo.kill_node_links(1).expect("cut");
    wait("n0 to take the VIP over", 20, || lab.holders().is_ok_and(|h| h == [0]));
    lab.topo.heal_all().expect("heal");
    wait("both members back, n0 holding", 30, || {
        lab.holders().is_ok_and(|h| h == [0])
            && lab.agent_metric_sum(1, "havip_agent_role{", &["name=\"Standby\""]) == Some(1.0)
    });

    // The variables, as Grafana asks for them (label_values → the label values API).
    let d: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("charts/havip/dashboards/havip.json")).expect("dashboard"),
    )
    .expect("dashboard JSON");
    let mut values: BTreeMap<String, String> = BTreeMap::new();
    for v in d["templating"]["list"].as_array().expect("variables").iter().filter(|v| v["type"] == "query") {
        let name = v["name"].as_str().expect("name");
        let q = v["query"]["query"].as_str().expect("query");
        let (series, label) = q
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
            .and_then(|r| r.rsplit_once(", "))
            .unwrap_or_else(|| panic!("{q} is not label_values(series, label)"));
        let mut series = series.to_owned();
        for (k, val) in &values {
            series = series.replace(&format!("${k}"), val);
        }
        let path = format!(
            "/api/v1/label/{label}/values?match[]={}&start={t0:.3}&end={:.3}",
            percent_encode(&series),
            now_s()
        );
        let got = api(prom, &path).unwrap_or_else(|e| panic!("variable {name}: {e}"));
        let got: Vec<String> =
            got.as_array().into_iter().flatten().filter_map(|v| v.as_str().map(String::from)).collect();
        let want = if name == "namespace" { NAMESPACE } else { PAIR };
        assert!(got.iter().any(|g| g == want), "variable {name} ({q}) offers {got:?}, not {want}");
        values.insert(name.to_owned(), want.to_owned());
    }

    // Every panel's queries over the run, with the variables set as a user would.
    let substitute = |q: &str| {
        let mut q = q.replace("$__rate_interval", "4s"); // Grafana's: 4 × the 1 s scrape interval
        for (k, v) in &values {
            q = q.replace(&format!("${k}"), v);
        }
        assert!(!q.contains('$'), "an unknown variable in {q}");
        q
    };
    let queries: Vec<(String, String, String)> = d["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .filter(|p| p["type"] != "row")
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap_or_default().to_owned();
            p["targets"].as_array().cloned().unwrap_or_default().into_iter().map(move |t| {
                let legend = t["legendFormat"].as_str().unwrap_or_default().to_owned();
                (title.clone(), legend, t["expr"].as_str().unwrap_or_default().to_owned())
            })
        })
        .collect();
    assert!(queries.len() >= 20, "the dashboard's queries: {}", queries.len());
    // The last scrapes of the run must be in before the verdict: await the takeover's
    // counter rather than sleep.
    wait("Prometheus to have scraped the takeover", 20, || {
        range(prom, "havip_agent_role_transitions_total{name=\"Takeover\"}", t0, now_s()).is_ok_and(|r| !r.is_empty())
    });
    let end = now_s();
    let mut wrong = Vec::new();
    for (title, legend, expr) in &queries {
        let expr = substitute(expr);
        let got = range(prom, &expr, t0, end).unwrap_or_else(|e| panic!("{title}: {e}"));
        let points: usize = got.iter().map(|s| s["values"].as_array().map_or(0, Vec::len)).sum();
        let ok = match expectation(title, legend) {
            Expect::Data => points > 0,
            Expect::Nothing => points == 0,
            Expect::Either => true,
        };
        eprintln!("{title} [{legend}]: {} series, {points} points", got.len());
        if !ok {
            wrong.push(format!("{title} [{legend}] ({:?}): {} series: {expr}", expectation(title, legend), got.len()));
        }
    }
    assert!(prom_proc.is_running(), "Prometheus exited: {}", prom_proc.log_tail(20));
    assert!(wrong.is_empty(), "panels that did not answer as a live lab should:\n{}", wrong.join("\n"));
}
