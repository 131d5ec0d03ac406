//! `lab demo`: the guided tour that `make demo` runs once havip is built (its step 1).
//!
//! It builds or reuses the test binaries, starts a lab with two node namespaces and a
//! client (`lab up --nodes 2`: it keeps running after the demo), applies
//! `examples/hapair.yaml` with its nodes and addresses rewritten for the lab, cuts the
//! active node off the network while a client connects to the VIP, reconnects it, moves
//! the VIPs back with a planned failover (which must lose no connection attempt), and
//! prints how to explore the lab. Every step is one numbered line; any failure ends the
//! demo with an error (the lab stays up for a post-mortem).
//!
//! `lab demo --bgp` (`make demo-bgp`) tours a routed lab instead: a router namespace
//! running FRR in front of the nodes, FRR on each node, a client in another subnet behind
//! the router, and `examples/hapair-bgp.yaml`; each move is shown in the router's table.

use crate::lifecycle::{Routed, State, alive, down, read_state, start};
use havip_crds::{FloatingIP, HAPair, MemberRole, Phase, VipState};
use havip_e2e::harness::controlplane::client_from_kubeconfig;
use havip_e2e::traffic::{ProbeReport, Prober, ProberConfig};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ListParams};
use serde::Deserialize;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Steps in all; step 1 (building havip) is `make demo`'s.
const STEPS: usize = 9;
/// Indentation of the lines under a step.
const INDENT: &str = "      ";

/// Logs at `warn` unless `RUST_LOG` says otherwise: the demo's output is its steps.
pub fn init_tracing() {
    havip_e2e::host::logging::init_tracing_quiet();
}

/// Prints the steps: `[n/steps] what … result`, details indented below.
pub(crate) struct Out {
    /// A step line waits for its result.
    pub(crate) open: bool,
    /// Steps in all.
    steps: usize,
}

impl Out {
    pub(crate) fn new(steps: usize) -> Out {
        Out { open: false, steps }
    }

    pub(crate) fn step(&mut self, n: usize, what: &str) {
        self.close();
        print!("[{n}/{}] {what} … ", self.steps);
        let _ = std::io::stdout().flush();
        self.open = true;
    }

    pub(crate) fn done(&mut self, result: &str) {
        if self.open {
            println!("{result}");
        } else {
            println!("{INDENT}{result}");
        }
        self.open = false;
    }

    pub(crate) fn detail(&mut self, line: &str) {
        self.close();
        println!("{}", format!("{INDENT}{line}").trim_end());
    }

    fn close(&mut self) {
        if self.open {
            println!();
            self.open = false;
        }
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `path` with the home directory written as `~`, and `..` of the repository resolved.
fn show(path: &Path) -> String {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    let s = path.display().to_string();
    match std::env::var("HOME") {
        Ok(home) if !home.is_empty() && home != "/" && s.starts_with(&format!("{home}/")) => {
            format!("~{}", &s[home.len()..])
        }
        _ => s,
    }
}

pub(crate) fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 60.0 { format!("{s:.1} s") } else { format!("{} min {:02} s", d.as_secs() / 60, d.as_secs() % 60) }
}

/// Runs the demo against a new lab in `dir` (routed with `bgp`).
pub fn run(dir: &Path, timeout: Duration, bgp: bool) -> Result<(), String> {
    if let Some(s) = read_state(dir).filter(|s| alive(s.pid)) {
        return Err(format!(
            "a lab is already running in {} (pid {}): `make demo-down` removes it, then run `make demo` again",
            dir.display(),
            s.pid
        ));
    }
    let mut out = Out::new(STEPS);
    let result = tour(&mut out, dir, timeout, bgp);
    if let Err(e) = result {
        if out.open {
            println!("FAILED");
        }
        let running = read_state(dir).is_some_and(|s| alive(s.pid));
        let hint = if running {
            format!(
                "\nthe lab is still running for a post-mortem (logs in {}); `make demo-down` removes it",
                dir.display()
            )
        } else {
            String::new()
        };
        let again = if bgp { "make demo-bgp" } else { "make demo" };
        return Err(format!("the demo failed: {e}{hint} (then `{again}` starts again)"));
    }
    Ok(())
}

fn tour(out: &mut Out, dir: &Path, timeout: Duration, bgp: bool) -> Result<(), String> {
    let started = Instant::now();
    havip_e2e::host::netns::require_root().map_err(|e| format!("the demo needs root (network namespaces): {e}"))?;
    if bgp && !havip_e2e::host::routing::Frr::available() {
        return Err("the routed demo needs FRR (bgpd, zebra, bfdd, vtysh): `bash hack/prereqs.sh demo-bgp` installs Debian's frr".to_owned());
    }
    let agent = havip_e2e::harness::agent::agent_binary().map_err(|e| e.to_string())?;
    havip_e2e::harness::kubelab::operator_binary().map_err(|e| e.to_string())?;
    let plugin = agent.with_file_name("kubectl-havip");
    if !plugin.is_file() {
        return Err(format!("{} not found: run `cargo build --workspace --bins`", plugin.display()));
    }
    let bin_dir = agent.parent().map(Path::to_path_buf).unwrap_or_default();
    // What a lab that died left behind (`lab down` says what it removed).
    if dir.exists() {
        down(dir)?;
    }

    // 2. kube-apiserver, etcd, kubectl.
    let testbin = test_binaries(out)?;

    // 3. The lab.
    out.step(3, "starting the lab");
    let t = Instant::now();
    let state = start(dir, timeout, 2, bgp, Some(&testbin))?;
    let lab = Lab::from_state(state)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("failed to start a runtime: {e}"))?;
    let client = rt.block_on(client_from_kubeconfig(&lab.state.kubeconfig)).map_err(|e| e.to_string())?;
    // The CRDs serve (the lab installed them and waited until they were Established).
    rt.block_on(Api::<HAPair>::all(client.clone()).list(&ListParams::default().limit(1)))
        .map_err(|e| format!("the HAPair CRD does not serve: {e}"))?;
    out.done(&format!("ready in {}", secs(t.elapsed())));
    out.detail(&format!("etcd and kube-apiserver at {}, with the havip CRDs", lab.state.server));
    let nodes: Vec<String> = lab.names.iter().zip(&lab.state.node_ips).map(|(n, ip)| format!("{n} ({ip})")).collect();
    out.detail(&format!(
        "nodes {} and a client ({}): network namespaces on one switch",
        nodes.join(" and "),
        lab.client_ip
    ));
    if let Some(r) = &lab.routed {
        out.detail(&format!(
            "a router ({}) running FRR peers over eBGP with BFD with the FRR on each node; the client ({}) is behind it, in another subnet",
            r.router, r.client_ip
        ));
    }
    out.detail("havip-operator, and havip-agent on each node");

    // 4. The example pair.
    let (file, vips, prefix_len) = match &lab.routed {
        Some(r) => ("examples/hapair-bgp.yaml", r.vips.as_slice(), 32),
        None => ("examples/hapair.yaml", lab.state.vips.as_slice(), 24),
    };
    let example = repo().join(file);
    let text = std::fs::read_to_string(&example).map_err(|e| format!("failed to read {}: {e}", example.display()))?;
    let adapted = adapt_example(file, &text, &lab.names, vips, prefix_len, lab.port)?;
    let saved = dir.join(example.file_name().unwrap_or_default());
    std::fs::write(&saved, &adapted.yaml).map_err(|e| format!("failed to write {}: {e}", saved.display()))?;
    let pair = adapted.pair.clone();
    let (first, second) = (lab.names[0].clone(), lab.names[1].clone());
    out.step(4, &format!("applying {file} (nodes and addresses rewritten for the lab)"));
    let t = Instant::now();
    lab.kubectl(&["apply", "--server-side", "-f", &saved.display().to_string()])?;
    let fips: Vec<String> = adapted.vips.iter().map(|(name, _)| name.clone()).collect();
    rt.block_on(wait_pair(&client, &pair, Duration::from_secs(60), "Live, its VIPs announced", |p, f| {
        phase(p) == Some(Phase::Live)
            && active(p).as_deref() == Some(first.as_str())
            && fips.iter().all(|n| {
                f.iter().any(|x| {
                    x.metadata.name.as_deref() == Some(n.as_str())
                        && x.status.as_ref().and_then(|s| s.state) == Some(VipState::Announced)
                })
            })
    }))?;
    let (vip_name, vip) = adapted.vips[0].clone();
    if lab.routed.is_some() {
        lab.wait_routed(vip, 0, Duration::from_secs(20))?;
    }
    out.done(&format!("{pair} is Live after {}: {first} holds the VIPs, {second} is standby", secs(t.elapsed())));
    for change in &adapted.changes {
        out.detail(change);
    }
    out.detail(&format!("(the rewritten file: {})", saved.display()));
    out.detail("$ kubectl get hapairs,floatingips");
    for line in lab.kubectl(&["get", "hapairs,floatingips"])?.lines() {
        out.detail(&format!("  {line}"));
    }
    if lab.routed.is_some() {
        lab.show_route(out, vip)?;
        // What each agent asked its node's FRR (every 5 s): the holder advertises the VIP.
        rt.block_on(wait_pair(
            &client,
            &pair,
            Duration::from_secs(20),
            "the holder's FRR to advertise the VIP",
            |p, _| advertises(p, &first, vip),
        ))?;
        out.detail(&format!("$ kubectl havip status {pair}   (each member's FRR, as its agent asked it)"));
        for line in lab.plugin(&plugin, &["status", &pair])?.lines().filter(|l| l.contains("FRR")) {
            out.detail(&format!("  {}", line.trim()));
        }
    }

    // 5. A client.
    let target = SocketAddr::from((vip, lab.port));
    out.step(
        5,
        &format!(
            "starting a client{} that connects to {target} ({vip_name}) every 5 ms; each node's server answers with its name",
            if lab.routed.is_some() { " behind the router" } else { "" }
        ),
    );
    let prober = lab.prober(target)?;
    prober.wait_for_responder(&first, Duration::from_secs(10)).map_err(|e| e.to_string())?;
    out.done(&format!("{first} answers"));

    // 6. Unplanned: the active node loses both cables.
    out.step(6, &format!("cutting {first} off the network (both cables)"));
    let epoch_before = rt.block_on(pair_now(&client, &pair))?.status.and_then(|s| s.epoch).unwrap_or(0);
    let cut_at = Timestamp::now();
    let cut = lab.set_cables(0, false)?;
    prober.wait_for_responder(&second, Duration::from_secs(15)).map_err(|e| e.to_string())?;
    if lab.routed.is_some() {
        lab.wait_routed(vip, 1, Duration::from_secs(10))?;
    }
    let p = rt.block_on(wait_pair(&client, &pair, Duration::from_secs(20), "the takeover in the status", |p, _| {
        active(p).as_deref() == Some(second.as_str()) && p.status.as_ref().and_then(|s| s.epoch) > Some(epoch_before)
    }))?;
    // A second of traffic after the takeover shows that it holds.
    std::thread::sleep(Duration::from_secs(1));
    let report = prober.stop().map_err(|e| e.to_string())?;
    let (during, after) = failures_around_takeover(&report, &second);
    out.done(&format!(
        "{second} took over: longest gap {:.0} ms, {after} failed connects after the takeover",
        report.longest_gap_ms
    ));
    out.detail(&format!("$ {}", cut.join("; ")));
    out.detail(&format!(
        "the client: {during} connects failed while nobody held {vip}, {} of {} answered",
        report.ok, report.attempts
    ));
    out.detail(&format!("{pair}: {}", describe(&p)));
    if lab.routed.is_some() {
        lab.show_route(out, vip)?;
    }
    rt.block_on(print_events(out, &client, &pair, &fips, cut_at, "the cut"));

    // 7. The node comes back: as standby (failback is Manual in the example).
    out.step(7, &format!("reconnecting {first}"));
    let prober = lab.prober(target)?;
    prober.wait_for_responder(&second, Duration::from_secs(10)).map_err(|e| e.to_string())?;
    let t = Instant::now();
    let restore = lab.set_cables(0, true)?;
    // Back means: the pair is FailedOver and the node reports itself a ready standby
    // under the pair's epoch (it may first come back as a standby of the epoch it knew,
    // then learn of the newer one, be fenced for a moment, and step down again).
    let p = rt.block_on(wait_pair(&client, &pair, Duration::from_secs(30), "the node back as standby", |p, _| {
        phase(p) == Some(Phase::FailedOver) && active(p).as_deref() == Some(second.as_str()) && ready_standby(p, &first)
    }))?;
    // Routed: back also means peered again — a member whose BGP session is not up yet is
    // no ready target (its agent refuses the move until its speaker carries routes).
    if lab.routed.is_some() {
        lab.wait_peered(0, Duration::from_secs(30))?;
    }
    let back = t.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    let report = prober.stop().map_err(|e| e.to_string())?;
    out.done(&format!(
        "{first} is back as standby after {}; the VIPs stay on {second} (failback: {})",
        secs(back),
        failback_mode(&p)
    ));
    out.detail(&format!("$ {}", restore.join("; ")));
    out.detail(&format!(
        "the client meanwhile: {} failed connects of {}, answered by {}",
        report.failed,
        report.attempts,
        report.responder_sequence().join(" then ")
    ));
    out.detail(&format!("{pair}: {}", describe(&p)));

    // 8. Planned failover back: make-before-break, no connection attempt may fail.
    out.step(8, &format!("planned failover back to {first}: kubectl havip failover {pair}"));
    let prober = lab.prober(target)?;
    prober.wait_for_responder(&second, Duration::from_secs(10)).map_err(|e| e.to_string())?;
    let asked_at = Timestamp::now();
    let answer = lab.plugin(&plugin, &["failover", &pair])?;
    prober.wait_for_responder(&first, Duration::from_secs(10)).map_err(|e| e.to_string())?;
    if lab.routed.is_some() {
        lab.wait_routed(vip, 0, Duration::from_secs(10))?;
    }
    let p = rt.block_on(wait_pair(&client, &pair, Duration::from_secs(20), "Live again", |p, _| {
        phase(p) == Some(Phase::Live) && active(p).as_deref() == Some(first.as_str())
    }))?;
    std::thread::sleep(Duration::from_millis(500));
    let report = prober.stop().map_err(|e| e.to_string())?;
    if report.failed > 0 || report.responder_sequence() != [second.as_str(), first.as_str()] {
        out.done("connects failed");
        return Err(format!("the planned failover must lose no connect: {}", report.summary()));
    }
    out.done(&format!(
        "{first} is active again: 0 failed connects of {}, longest gap {:.0} ms",
        report.attempts, report.longest_gap_ms
    ));
    for line in answer.lines().filter(|l| !l.trim().is_empty()) {
        out.detail(&format!("> {line}"));
    }
    out.detail(&format!("{pair}: {}", describe(&p)));
    if lab.routed.is_some() {
        lab.show_route(out, vip)?;
    }
    rt.block_on(print_events(out, &client, &pair, &fips, asked_at, "the request"));

    // 9. Exploring.
    out.close();
    println!("[9/{STEPS}] done in {}. The lab keeps running; to explore it:", secs(started.elapsed()));
    let kubectl_dir = lab.state.kubectl.as_deref().and_then(Path::parent).map(Path::to_path_buf).unwrap_or(testbin);
    for line in explore(&lab, &pair, &vip, &kubectl_dir, &bin_dir, dir) {
        println!("{INDENT}{line}");
    }
    Ok(())
}

/// Step 2: `hack/testbin.sh control-plane`, its progress shown; returns the directory.
fn test_binaries(out: &mut Out) -> Result<PathBuf, String> {
    use havip_e2e::harness::testbin::{ETCD_VERSION, K8S_VERSION};
    out.step(
        2,
        &format!(
            "kube-apiserver and kubectl v{K8S_VERSION}, etcd v{ETCD_VERSION} (built from Go modules on first use)"
        ),
    );
    let t = Instant::now();
    let script = repo().join("hack/testbin.sh");
    let mut child = Command::new("bash")
        .arg(&script)
        .arg("control-plane")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("failed to run {}: {e}", script.display()))?;
    let mut other = Vec::new();
    let mut built = false;
    if let Some(stderr) = child.stderr.take() {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            match line.strip_prefix("[testbin] ") {
                Some(progress) => {
                    built |= progress.starts_with("building");
                    out.detail(progress);
                }
                None => other.push(line),
            }
        }
    }
    let output = child.wait_with_output().map_err(|e| format!("{}: {e}", script.display()))?;
    if !output.status.success() {
        return Err(format!("{} failed ({}):\n{}", script.display(), output.status, other.join("\n")));
    }
    let dir = String::from_utf8_lossy(&output.stdout).lines().last().unwrap_or_default().trim().to_owned();
    if dir.is_empty() {
        return Err(format!("{} printed no directory", script.display()));
    }
    let dir = PathBuf::from(dir);
    if built {
        out.done(&format!("built in {}, cached in {}", secs(t.elapsed()), show(&dir)));
    } else {
        out.done(&format!("using {}", show(&dir)));
    }
    Ok(dir)
}

/// What the demo needs of a running lab.
struct Lab {
    state: State,
    names: Vec<String>,
    switch: String,
    client_ns: String,
    client_ip: Ipv4Addr,
    port: u16,
    /// A routed lab's router and the client behind it.
    routed: Option<Routed>,
}

impl Lab {
    fn from_state(state: State) -> Result<Self, String> {
        let missing = |what: &str| format!("the lab's state file lacks {what} (an older `lab` binary?)");
        let switch = state.switch.clone().ok_or_else(|| missing("the switch namespace"))?;
        let client_ns = state.client.clone().ok_or_else(|| missing("the client namespace"))?;
        let client_ip = state.client_ip.ok_or_else(|| missing("the client's address"))?;
        let port = state.service_port.ok_or_else(|| missing("the service port"))?;
        if state.node_names.len() < 2 || state.node_ips.len() != state.node_names.len() || state.vips.is_empty() {
            return Err(missing("two nodes with addresses, and VIPs"));
        }
        let routed = state.routed.clone();
        Ok(Self { names: state.node_names.clone(), state, switch, client_ns, client_ip, port, routed })
    }

    /// `kubectl <args>` against the lab; stdout, or an error with stderr.
    fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        let kubectl = self.state.kubectl.clone().unwrap_or_else(|| PathBuf::from("kubectl"));
        let out = Command::new(&kubectl)
            .env("KUBECONFIG", &self.state.kubeconfig)
            .args(args)
            .output()
            .map_err(|e| format!("failed to run {}: {e}", kubectl.display()))?;
        if !out.status.success() {
            return Err(format!("kubectl {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `kubectl-havip <args>`; its stdout, or an error with everything it said.
    fn plugin(&self, plugin: &Path, args: &[&str]) -> Result<String, String> {
        let out = Command::new(plugin)
            .env("KUBECONFIG", &self.state.kubeconfig)
            .args(args)
            .output()
            .map_err(|e| format!("failed to run {}: {e}", plugin.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(format!(
                "kubectl havip {} failed ({}): {stdout}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(stdout)
    }

    /// A client connecting to `target` every 5 ms: in the client namespace, or in a
    /// routed lab behind the router.
    fn prober(&self, target: SocketAddr) -> Result<Prober, String> {
        Prober::start(self.client(), ProberConfig::new(target)).map_err(|e| e.to_string())
    }

    /// The client's namespace.
    fn client(&self) -> &str {
        self.routed.as_ref().map_or(self.client_ns.as_str(), |r| r.client.as_str())
    }

    /// `ip route show <vip>` in the router's namespace (its kernel's route, which FRR's
    /// zebra installs from BGP's best path).
    fn router_route(&self, vip: Ipv4Addr) -> Result<String, String> {
        let r = self.routed.as_ref().ok_or("not a routed lab")?;
        let args = ["-n", r.router.as_str(), "route", "show", &vip.to_string()];
        let out = Command::new("ip").args(args).output().map_err(|e| format!("failed to run `ip`: {e}"))?;
        if !out.status.success() {
            return Err(format!("ip {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// Waits (every 20 ms) until the router's only next hop for `vip` is node `i`.
    /// Waits until the router's BGP session with node `i` is Established.
    fn wait_peered(&self, i: usize, timeout: Duration) -> Result<(), String> {
        let r = self.routed.as_ref().ok_or("not a routed lab")?;
        let peer = self.state.node_ips[i].to_string();
        let start = Instant::now();
        loop {
            let out = std::process::Command::new("vtysh")
                .arg("--vty_socket")
                .arg(&r.router_vty)
                .args(["-c", &format!("show bgp neighbors {peer} json")])
                .output()
                .map_err(|e| format!("vtysh: {e}"))?;
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            if havip_e2e::routing::session_established(&v, &peer) {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(format!("the router's session with {} is not up within {timeout:?}", self.names[i]));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_routed(&self, vip: Ipv4Addr, i: usize, timeout: Duration) -> Result<(), String> {
        let want = [self.state.node_ips[i]];
        let start = Instant::now();
        loop {
            let route = self.router_route(vip)?;
            if next_hops(&route) == want {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(format!(
                    "the router does not route {vip} to {} within {timeout:?}; it has: {route:?}",
                    self.names[i]
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The router's route to `vip`, as a detail line.
    fn show_route(&self, out: &mut Out, vip: Ipv4Addr) -> Result<(), String> {
        let route = self.router_route(vip)?;
        let hops = next_hops(&route);
        let to: Vec<String> = hops
            .iter()
            .map(|h| match self.state.node_ips.iter().position(|n| n == h) {
                Some(i) => format!("{h} ({})", self.names[i]),
                None => h.to_string(),
            })
            .collect();
        out.detail(&format!("the router routes {vip} to {}:", to.join(" and ")));
        let router = self.routed.as_ref().map(|r| r.router.as_str()).unwrap_or_default();
        out.detail(&format!("  $ ip -n {router} route show {vip}"));
        for line in route.lines() {
            out.detail(&format!("  {}", line.trim()));
        }
        Ok(())
    }

    /// The `ip` commands that unplug (`up == false`) or plug in node `i`'s cables, run.
    /// The management cable goes first: a node that loses only its data cable hands the
    /// VIPs over through the management path (a planned move), which is not the point.
    fn set_cables(&self, i: usize, up: bool) -> Result<Vec<String>, String> {
        let mut done = Vec::new();
        for link in ["mgmt", "data"] {
            let args = cable_command(&self.switch, &self.names[i], link, up);
            let out = Command::new("ip").args(&args).output().map_err(|e| format!("failed to run `ip`: {e}"))?;
            if !out.status.success() {
                return Err(format!("ip {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()));
            }
            done.push(format!("ip {}", args.join(" ")));
        }
        Ok(done)
    }
}

/// `-n <switch> link set <node>-<link> down|up`: the switch side of a node's cable.
fn cable_command(switch: &str, node: &str, link: &str, up: bool) -> Vec<String> {
    ["-n", switch, "link", "set", &format!("{node}-{link}"), if up { "up" } else { "down" }]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
}

/// The next hops (`via <ip>`) of an `ip route show` answer, in order.
fn next_hops(route: &str) -> Vec<Ipv4Addr> {
    let words: Vec<&str> = route.split_whitespace().collect();
    words.windows(2).filter(|w| w[0] == "via").filter_map(|w| w[1].parse().ok()).collect()
}

/// Whether member `node`'s status says its speaker advertises `vip` to some peer.
fn advertises(p: &HAPair, node: &str, vip: Ipv4Addr) -> bool {
    let prefix = format!("{vip}/32");
    p.status
        .iter()
        .flat_map(|s| &s.members)
        .filter(|m| m.node == node)
        .filter_map(|m| m.bgp.as_ref())
        .any(|b| b.advertised.iter().any(|a| a.address == prefix && !a.peers.is_empty()))
}

fn phase(p: &HAPair) -> Option<Phase> {
    p.status.as_ref().and_then(|s| s.phase)
}

fn active(p: &HAPair) -> Option<String> {
    p.status.as_ref().and_then(|s| s.active.clone())
}

/// Whether member `node` reports itself Standby under the pair's epoch (or a later one),
/// ready for every VIP and hearing its peer on every path.
fn ready_standby(p: &HAPair, node: &str) -> bool {
    let Some(s) = p.status.as_ref() else { return false };
    s.members.iter().any(|m| {
        m.node == node
            && m.role == Some(MemberRole::Standby)
            && m.epoch.is_some()
            && m.epoch >= s.epoch
            && !m.ready.is_empty()
            && m.ready.iter().all(|r| r.ready)
            && !m.heard.is_empty()
            && m.heard.iter().all(|h| h.heard)
    })
}

fn failback_mode(p: &HAPair) -> String {
    serde_json::to_value(p.spec.failback.mode)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "Manual".to_owned())
}

/// `n1 active, epoch 2, phase Degraded (…)`.
fn describe(p: &HAPair) -> String {
    let Some(s) = &p.status else { return "no status yet".to_owned() };
    let mut d = format!(
        "{} active, epoch {}, phase {}",
        s.active.as_deref().unwrap_or("nobody"),
        s.epoch.unwrap_or(0),
        s.phase.map(|p| format!("{p:?}")).unwrap_or_else(|| "-".to_owned())
    );
    if s.phase == Some(Phase::Degraded)
        && let Some(c) = s.conditions.iter().find(|c| c.type_ == "Degraded" && c.status == "True")
    {
        d.push_str(&format!(" ({})", c.message));
    }
    d
}

async fn pair_now(client: &Client, name: &str) -> Result<HAPair, String> {
    Api::<HAPair>::all(client.clone()).get(name).await.map_err(|e| format!("failed to read HAPair {name}: {e}"))
}

/// Polls the pair and the FloatingIPs until `cond` holds.
async fn wait_pair(
    client: &Client,
    name: &str,
    timeout: Duration,
    what: &str,
    cond: impl Fn(&HAPair, &[FloatingIP]) -> bool,
) -> Result<HAPair, String> {
    let pairs: Api<HAPair> = Api::all(client.clone());
    let fips: Api<FloatingIP> = Api::all(client.clone());
    let start = Instant::now();
    let mut last = None;
    loop {
        if let (Ok(p), Ok(f)) = (pairs.get(name).await, fips.list(&ListParams::default()).await) {
            if cond(&p, &f.items) {
                return Ok(p);
            }
            last = Some(p);
        }
        if start.elapsed() > timeout {
            let status = last
                .and_then(|p| p.status)
                .map(|s| serde_json::to_string(&s).unwrap_or_default())
                .unwrap_or_else(|| "none".to_owned());
            return Err(format!("timed out after {timeout:?} waiting for {what}; the pair's status: {status}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Failed probes while nobody answered (before `taker`'s first answer) and after it.
fn failures_around_takeover(report: &ProbeReport, taker: &str) -> (usize, usize) {
    let first = report.runs.iter().find(|r| r.name == taker).map_or(f64::INFINITY, |r| r.first_ms);
    let after = report.failures.iter().filter(|f| f.t_ms > first).count();
    (report.failed - after, after)
}

/// The Events about the pair and its FloatingIPs since `since`, oldest first, as
/// `+0.31 s  Normal  PeerLost  n1: Standby → Active (epoch 2)  [havip-agent n1]`.
async fn print_events(out: &mut Out, client: &Client, pair: &str, fips: &[String], since: Timestamp, what: &str) {
    // The agents publish from a queue of their own: give the last ones a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let events = match Api::<Event>::namespaced(client.clone(), "default").list(&ListParams::default()).await {
        Ok(l) => l.items,
        Err(e) => {
            out.detail(&format!("(could not read the Events: {e})"));
            return;
        }
    };
    let mut rows: Vec<(i64, [String; 4])> = events
        .into_iter()
        .filter_map(|e| {
            let about = e.regarding.as_ref().and_then(|r| r.name.clone()).unwrap_or_default();
            if about != pair && !fips.contains(&about) {
                return None;
            }
            // A series (kube-runtime's Recorder folds repeats of a reason) keeps the
            // first occurrence's time and note.
            let t = e.event_time.as_ref().map(|t| t.0).or(e.deprecated_first_timestamp.as_ref().map(|t| t.0)).or(e
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0))?;
            let ms = t.as_millisecond() - since.as_millisecond();
            (ms >= 0).then(|| (ms, event_columns(&e, pair)))
        })
        .collect();
    rows.sort_by_key(|r| r.0);
    out.detail(&format!("Events since {what}:"));
    if rows.is_empty() {
        out.detail("  (none yet)");
    }
    let width = |i: usize| rows.iter().map(|r| r.1[i].chars().count()).max().unwrap_or(0);
    let (w0, w1, w2) = (width(0), width(1), width(2));
    for (ms, [from, type_, reason, note]) in &rows {
        out.detail(&format!("  {:+.2} s  {from:<w0$}  {type_:<w1$}  {reason:<w2$}  {note}", *ms as f64 / 1000.0));
    }
}

/// Who reported it, its type, its reason and its note (naming the object unless it is
/// the pair, and how many repeats a series folded into it).
fn event_columns(e: &Event, pair: &str) -> [String; 4] {
    let from = match (e.reporting_controller.as_deref(), e.reporting_instance.as_deref()) {
        (Some(c), Some(i)) if c.contains("agent") => format!("agent {i}"),
        (Some(c), _) if c.contains("operator") => "operator".to_owned(),
        (Some(c), _) => c.to_owned(),
        _ => "?".to_owned(),
    };
    let about = e.regarding.as_ref().and_then(|r| r.name.clone()).unwrap_or_default();
    let mut note = e.note.clone().unwrap_or_default();
    if about != pair {
        note = format!("{about}: {note}");
    }
    if let Some(s) = e.series.as_ref().filter(|s| s.count > 1) {
        note.push_str(&format!(" (and {} more with this reason)", s.count - 1));
    }
    [from, e.type_.clone().unwrap_or_default(), e.reason.clone().unwrap_or_default(), note]
}

/// The closing instructions: lines to paste into a root shell.
fn explore(lab: &Lab, pair: &str, vip: &Ipv4Addr, kubectl_dir: &Path, bin_dir: &Path, dir: &Path) -> Vec<String> {
    let first = &lab.names[0];
    let cut: Vec<String> = ["mgmt", "data"]
        .iter()
        .map(|l| format!("ip {}", cable_command(&lab.switch, first, l, false).join(" ")))
        .collect();
    let logs = lab.state.logs.as_deref().unwrap_or(dir);
    let mut lines = vec![
        format!("export KUBECONFIG={}", lab.state.kubeconfig.display()),
        "# kubectl, and kubectl-havip (the plugin behind `kubectl havip`):".to_owned(),
        format!("export PATH={}:{}:$PATH", kubectl_dir.display(), bin_dir.display()),
        "kubectl get hapairs,floatingips".to_owned(),
        format!("kubectl havip status {pair}"),
        format!("kubectl havip failover {pair}"),
        format!("kubectl get events --field-selector involvedObject.name={pair} --sort-by=.eventTime"),
        "# who answers on the VIP, asked from the client:".to_owned(),
        format!("ip netns exec {} bash -c 'cat </dev/tcp/{vip}/{}'", lab.client(), lab.port),
        format!("# cut {first} off by hand (`up` instead of `down` plugs it back in):"),
        cut.join("; "),
        format!("# logs: {}/{{operator,agent-0,agent-1}}.log", logs.display()),
    ];
    if let Some(r) = &lab.routed {
        let vtysh = |ns: &str, dir: &Path, cmd: &str| {
            format!("ip netns exec {ns} vtysh --vty_socket {} -c '{cmd}'", dir.display())
        };
        lines.push("# the router: its BGP sessions, the VIP's paths, and the route it installed".to_owned());
        lines.push(vtysh(&r.router, &r.router_vty, "show bgp summary"));
        lines.push(vtysh(&r.router, &r.router_vty, &format!("show bgp ipv4 unicast {vip}/32")));
        lines.push(format!("ip -n {} route show {vip}", r.router));
        if let (Some(ns), Some(vty)) = (lab.state.nodes.first(), r.node_vty.first()) {
            lines.push(format!("# {first}'s FRR: what it advertises to the router"));
            lines.push(vtysh(ns, vty, &format!("show bgp ipv4 unicast neighbors {} advertised-routes", r.router_ip)));
        }
    }
    lines.push("make demo-down    # stops and removes the lab".to_owned());
    lines
}

/// `examples/hapair.yaml` made to run in the lab, and what was changed.
#[derive(Debug)]
struct Adapted {
    /// The documents to apply.
    yaml: String,
    /// One line per kind of change, for the reader.
    changes: Vec<String>,
    /// The HAPair's name.
    pair: String,
    /// The FloatingIPs, in order: (name, lab address).
    vips: Vec<(String, Ipv4Addr)>,
}

/// Rewrites example `file` for the lab: the HAPair's members become the lab's nodes (in
/// order), each FloatingIP's address becomes one of the lab's VIPs with `prefix_len`
/// (24: on the lab's data network; 32: a routed host address), and probe ports become
/// the one port the lab's nodes serve. Everything else is applied as written.
fn adapt_example(
    file: &str,
    text: &str,
    nodes: &[String],
    vips: &[Ipv4Addr],
    prefix_len: u8,
    port: u16,
) -> Result<Adapted, String> {
    use serde_yaml::Value;
    let mut docs = Vec::new();
    let (mut renamed, mut moved) = (Vec::new(), Vec::new());
    let mut ports_changed = false;
    let mut pair = None;
    let mut fips = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let mut v = Value::deserialize(doc).map_err(|e| format!("{file}: {e}"))?;
        if v.is_null() {
            continue;
        }
        let kind = v.get("kind").and_then(Value::as_str).unwrap_or_default().to_owned();
        let name = v.get("metadata").and_then(|m| m.get("name")).and_then(Value::as_str).unwrap_or_default().to_owned();
        let spec = v.get_mut("spec").ok_or_else(|| format!("{kind} {name} has no spec"))?;
        match kind.as_str() {
            "HAPair" => {
                let members = spec
                    .get_mut("members")
                    .and_then(Value::as_sequence_mut)
                    .ok_or_else(|| format!("HAPair {name} has no members"))?;
                if members.len() > nodes.len() {
                    return Err(format!(
                        "HAPair {name} has {} members; the lab has {} nodes",
                        members.len(),
                        nodes.len()
                    ));
                }
                for (m, node) in members.iter_mut().zip(nodes) {
                    let slot = m.get_mut("node").ok_or_else(|| format!("a member of {name} names no node"))?;
                    renamed.push((slot.as_str().unwrap_or_default().to_owned(), node.clone()));
                    *slot = Value::from(node.as_str());
                }
                // `interface` paths stay as written: the lab's nodes have eth0 (data)
                // and eth1 (management), and the agent reads its own address there.
                let paths = spec
                    .get("heartbeat")
                    .and_then(|h| h.get("paths"))
                    .and_then(Value::as_sequence)
                    .map(|p| p.iter())
                    .into_iter()
                    .flatten();
                for path in paths {
                    if let Some(ifname) = path.get("interface").and_then(Value::as_str)
                        && !["eth0", "eth1"].contains(&ifname)
                    {
                        return Err(format!(
                            "heartbeat path on interface {ifname}: the lab's nodes have eth0 and eth1"
                        ));
                    }
                }
                pair = Some(name);
            }
            "FloatingIP" => {
                let lab_vip = *vips
                    .get(fips.len())
                    .ok_or_else(|| format!("more FloatingIPs than the lab's {} VIPs", vips.len()))?;
                let slot = spec.get_mut("address").ok_or_else(|| format!("FloatingIP {name} has no address"))?;
                moved.push((slot.as_str().unwrap_or_default().to_owned(), format!("{lab_vip}/{prefix_len}")));
                *slot = Value::from(format!("{lab_vip}/{prefix_len}"));
                if let Some(ports) = spec.get_mut("probe").and_then(|p| p.get_mut("ports")) {
                    let lab_ports = Value::Sequence(vec![Value::from(port)]);
                    if *ports != lab_ports {
                        *ports = lab_ports;
                        ports_changed = true;
                    }
                }
                fips.push((name, lab_vip));
            }
            other => return Err(format!("{file}: unexpected kind {other:?}")),
        }
        docs.push(v);
    }
    let pair = pair.ok_or_else(|| format!("{file} has no HAPair"))?;
    let mut changes = vec![pair_list("members", &renamed), pair_list("VIPs", &moved)];
    if ports_changed {
        changes.push(format!("probe ports → {port} (the port on which the lab's nodes serve)"));
    }
    let mut yaml = format!(
        "# {file}, rewritten for the lab by `lab demo`:\n{}\n",
        changes.iter().map(|c| format!("#   {c}")).collect::<Vec<_>>().join("\n")
    );
    for (i, d) in docs.iter().enumerate() {
        if i > 0 {
            yaml.push_str("---\n");
        }
        yaml.push_str(&serde_yaml::to_string(d).map_err(|e| e.to_string())?);
    }
    Ok(Adapted { yaml, changes, pair, vips: fips })
}

/// `members node-a, node-b → n0, n1`.
fn pair_list(what: &str, pairs: &[(String, String)]) -> String {
    let from: Vec<&str> = pairs.iter().map(|p| p.0.as_str()).collect();
    let to: Vec<&str> = pairs.iter().map(|p| p.1.as_str()).collect();
    format!("{what} {} → {}", from.join(", "), to.join(", "))
}

#[cfg(test)]
mod tests {
    use super::{Adapted, adapt_example, cable_command, failures_around_takeover, repo, secs};
    use havip_crds::NodeAddressType;
    use havip_crds::{FloatingIP, HAPair};
    use havip_e2e::traffic::ProbeReport;
    use havip_e2e::traffic::{Probe, ProbeError};
    use serde::Deserialize;
    use std::net::{Ipv4Addr, SocketAddr};
    use std::time::Duration;

    fn lab_adapt() -> Adapted {
        let text = std::fs::read_to_string(repo().join("examples/hapair.yaml")).expect("example");
        let nodes = vec!["n0".to_owned(), "n1".to_owned()];
        let vips = vec![Ipv4Addr::new(10, 123, 0, 50), Ipv4Addr::new(10, 123, 0, 51)];
        adapt_example("examples/hapair.yaml", &text, &nodes, &vips, 24, 8080).expect("adapted")
    }

    #[test]
    fn the_example_is_rewritten_for_the_lab_and_still_parses_as_havip_objects() {
        let a = lab_adapt();
        assert_eq!(a.pair, "web");
        assert_eq!(
            a.changes,
            [
                "members node-a, node-b → n0, n1",
                "VIPs 192.0.2.10/24, 192.0.2.11/24 → 10.123.0.50/24, 10.123.0.51/24",
                "probe ports → 8080 (the port on which the lab's nodes serve)",
            ]
        );
        assert_eq!(
            a.vips,
            [
                ("web-ingress".to_owned(), Ipv4Addr::new(10, 123, 0, 50)),
                ("web-api".to_owned(), Ipv4Addr::new(10, 123, 0, 51))
            ]
        );
        let mut docs = serde_yaml::Deserializer::from_str(&a.yaml);
        let p = HAPair::deserialize(docs.next().expect("HAPair")).expect("a HAPair");
        let members: Vec<(&str, i32)> = p.spec.members.iter().map(|m| (m.node.as_str(), m.priority)).collect();
        assert_eq!(members, [("n0", 200), ("n1", 100)]);
        let paths: Vec<(&str, Option<NodeAddressType>, Option<&str>)> =
            p.spec.heartbeat.paths.iter().map(|p| (p.name.as_str(), p.address_type, p.interface.as_deref())).collect();
        assert_eq!(paths, [("data", Some(NodeAddressType::InternalIP), None), ("mgmt", None, Some("eth1"))]);
        for (doc, addr) in docs.zip(["10.123.0.50/24", "10.123.0.51/24"]) {
            let f = FloatingIP::deserialize(doc).expect("a FloatingIP");
            assert_eq!(f.spec.address, addr);
            assert_eq!(f.spec.pair, "web");
            assert_eq!(f.spec.probe.ports, [8080]);
        }
        assert!(a.yaml.starts_with("# examples/hapair.yaml, rewritten for the lab"), "{}", a.yaml);
    }

    #[test]
    fn an_example_with_more_members_than_lab_nodes_is_refused() {
        let text = "kind: HAPair\nmetadata: {name: p}\nspec:\n  members: [{node: a}, {node: b}, {node: c}]\n";
        let err = adapt_example("x.yaml", text, &["n0".to_owned(), "n1".to_owned()], &[Ipv4Addr::LOCALHOST], 24, 8080)
            .expect_err("refused");
        assert!(err.contains("3 members; the lab has 2 nodes"), "{err}");
    }

    #[test]
    fn failures_are_split_at_the_first_answer_of_the_new_holder() {
        let probe = |t: f64, outcome: Result<&str, ProbeError>| Probe {
            start_ms: t,
            end_ms: t + 1.0,
            outcome: outcome.map(str::to_owned),
        };
        let timeline = vec![
            probe(0.0, Ok("n0")),
            probe(10.0, Err(ProbeError::ConnectTimeout)),
            probe(60.0, Err(ProbeError::ConnectTimeout)),
            probe(110.0, Ok("n1")),
            probe(120.0, Err(ProbeError::Reset)),
            probe(130.0, Ok("n1")),
        ];
        let target = SocketAddr::from((Ipv4Addr::LOCALHOST, 8080));
        let r = ProbeReport::from_timeline(target, Duration::from_millis(5), Duration::from_millis(140), 0, timeline);
        assert_eq!(failures_around_takeover(&r, "n1"), (2, 1));
        assert_eq!(failures_around_takeover(&r, "n2"), (3, 0));
    }

    #[test]
    fn cable_commands_name_the_switch_side_ports() {
        assert_eq!(
            cable_command("hve2e-1-0-sw", "n0", "data", false).join(" "),
            "-n hve2e-1-0-sw link set n0-data down"
        );
        assert_eq!(cable_command("hve2e-1-0-sw", "n1", "mgmt", true).join(" "), "-n hve2e-1-0-sw link set n1-mgmt up");
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(secs(Duration::from_millis(1234)), "1.2 s");
        assert_eq!(secs(Duration::from_secs(612)), "10 min 12 s");
    }
}
