//! A lab's life: `serve` runs it in the foreground and writes its [`State`], `start` runs
//! `serve` in the background and waits for that file, `down` stops it and removes what
//! it left.

use havip_e2e::harness::controlplane::{ControlPlane, ControlPlaneOptions};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What `serve` writes once the lab is ready.
#[derive(Serialize, Deserialize, Debug)]
pub(crate) struct State {
    /// The serving process.
    pub(crate) pid: u32,
    /// The admin kubeconfig.
    pub(crate) kubeconfig: PathBuf,
    /// The API server URL.
    pub(crate) server: String,
    /// Child process ids (killed by `down` if `serve` died without cleaning up).
    pub(crate) children: Vec<u32>,
    /// Node namespaces, in order (n0, n1, …), when started with `--nodes`.
    #[serde(default)]
    pub(crate) nodes: Vec<String>,
    /// The client namespace.
    #[serde(default)]
    pub(crate) client: Option<String>,
    /// The switch namespace (cut a node's cable: `ip -n <switch> link set n0-data down`).
    #[serde(default)]
    pub(crate) switch: Option<String>,
    /// Node names, in the order of `nodes` (`n0`, `n1`, …).
    #[serde(default)]
    pub(crate) node_names: Vec<String>,
    /// The nodes' addresses on the data network, in the order of `nodes`.
    #[serde(default)]
    pub(crate) node_ips: Vec<Ipv4Addr>,
    /// The client's address on the data network.
    #[serde(default)]
    pub(crate) client_ip: Option<Ipv4Addr>,
    /// Free addresses on the data network for VIPs (`10.<k>.0.50` …).
    #[serde(default)]
    pub(crate) vips: Vec<Ipv4Addr>,
    /// The TCP port on which every node's server answers with the node's name.
    #[serde(default)]
    pub(crate) service_port: Option<u16>,
    /// The kubectl the lab uses.
    #[serde(default)]
    pub(crate) kubectl: Option<PathBuf>,
    /// The directory of the operator's and the agents' logs.
    #[serde(default)]
    pub(crate) logs: Option<PathBuf>,
    /// A routed lab (`--bgp`): the router, its FRR and the client behind it.
    #[serde(default)]
    pub(crate) routed: Option<Routed>,
}

/// What a routed lab (`lab up --bgp`) adds: a router namespace running FRR that peers
/// (eBGP, BFD) with the FRR of every node, and a client in another subnet behind it.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub(crate) struct Routed {
    /// The router's namespace (the nodes' gateway).
    pub(crate) router: String,
    /// The router's address on the nodes' data network (their BGP neighbour).
    pub(crate) router_ip: Ipv4Addr,
    /// The router's FRR directory (`vtysh --vty_socket <dir>`).
    pub(crate) router_vty: PathBuf,
    /// Each node's FRR directory, in node order.
    pub(crate) node_vty: Vec<PathBuf>,
    /// The client behind the router.
    pub(crate) client: String,
    /// Its address.
    pub(crate) client_ip: Ipv4Addr,
    /// Addresses outside every subnet of the lab, for routed VIPs (`10.<k>.9.50` …).
    pub(crate) vips: Vec<Ipv4Addr>,
}

fn state_path(dir: &Path) -> PathBuf {
    dir.join("state.json")
}

pub(crate) fn read_state(dir: &Path) -> Option<State> {
    let text = std::fs::read_to_string(state_path(dir)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Whether process `pid` lives.
pub(crate) fn alive(pid: u32) -> bool {
    i32::try_from(pid).is_ok_and(|p| kill(Pid::from_raw(p), None).is_ok())
}

/// Starts `lab serve` in the background (no lab may be running in `dir`) and waits until
/// it has written its state file. `testbin`: the directory of kube-apiserver, etcd and
/// kubectl, when the caller knows it (`HAVIP_TESTBIN_DIR` for the lab).
pub(crate) fn start(
    dir: &Path,
    timeout: Duration,
    nodes: usize,
    bgp: bool,
    testbin: Option<&Path>,
) -> Result<State, String> {
    // Leftovers of a lab that died: clean them first.
    if dir.exists() {
        down(dir)?;
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("failed to create {}: {e}", dir.display()))?;
    let log = dir.join("lab.log");
    let out = std::fs::File::create(&log).map_err(|e| format!("failed to create {}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| format!("failed to open {}: {e}", log.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("failed to find the lab binary: {e}"))?;
    // `setsid` detaches the lab from this terminal session, so it outlives `lab up`.
    let mut cmd = Command::new("setsid");
    if let Some(t) = testbin {
        cmd.env("HAVIP_TESTBIN_DIR", t);
    }
    let mut child = cmd
        .arg(&exe)
        .arg("--dir")
        .arg(dir)
        .arg("serve")
        .arg("--nodes")
        .arg(nodes.to_string())
        .args(bgp.then_some("--bgp"))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("failed to start the lab in the background: {e}"))?;
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(state) = read_state(dir) {
            return Ok(state);
        }
        if let Ok(Some(status)) = child.try_wait() {
            let tail = havip_e2e::host::process::tail(&log, 30);
            let _ = down(dir);
            return Err(format!("the lab exited during start-up ({status}):\n{tail}"));
        }
        if Instant::now() > deadline {
            // `serve` has not written its state yet, so `down` cannot find it: stop it
            // here (what it started dies with it; `down` removes its namespaces).
            let _ = child.kill();
            let _ = child.wait();
            let _ = down(dir);
            return Err(format!("the lab was not ready within {timeout:?}; see {}", log.display()));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Stops the lab of `dir` (SIGTERM, then SIGKILL to what is left of it), removes its
/// namespaces and the directory.
pub(crate) fn down(dir: &Path) -> Result<(), String> {
    let state = read_state(dir);
    let mut pids = Vec::new();
    if let Some(state) = &state {
        pids = state.children.iter().copied().chain([state.pid]).collect();
        if alive(state.pid) {
            eprintln!("stopping the lab (pid {}) …", state.pid);
            if let Ok(p) = i32::try_from(state.pid) {
                let _ = kill(Pid::from_raw(p), Signal::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            while alive(state.pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        for pid in pids.iter().copied() {
            if alive(pid)
                && let Ok(p) = i32::try_from(pid)
            {
                let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
            }
        }
    }
    // A lab whose `serve` was killed leaves its namespaces behind; their owner is dead,
    // so this removes them (namespaces of live labs and test runs are left alone).
    if nix::unistd::geteuid().is_root()
        && let Err(e) = havip_e2e::host::netns::cleanup_stale()
    {
        eprintln!("warning: cleaning up stale namespaces failed: {e}");
    }
    // What is left of this lab: processes, namespaces (all share the switch's prefix;
    // the host's veth end and address go with the switch namespace).
    let prefix = state.as_ref().and_then(|s| s.switch.as_deref()).and_then(|sw| sw.strip_suffix("sw"));
    let deadline = Instant::now() + Duration::from_secs(5);
    let leftovers = loop {
        let mut left: Vec<String> = pids.iter().filter(|p| alive(**p)).map(|p| format!("process {p}")).collect();
        if let Some(prefix) = prefix {
            let names = havip_e2e::host::netns::list_namespaces().map_err(|e| e.to_string())?;
            left.extend(names.into_iter().filter(|n| n.starts_with(prefix)).map(|n| format!("namespace {n}")));
        }
        if left.is_empty() || Instant::now() > deadline {
            break left;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if !leftovers.is_empty() {
        return Err(format!("the lab left {} behind", leftovers.join(", ")));
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| format!("failed to remove {}: {e}", dir.display()))?;
        eprintln!("lab is down; removed {}", dir.display());
    } else if state.is_none() {
        eprintln!("no lab in {}: nothing to remove", dir.display());
    }
    Ok(())
}

/// Runs the lab in the foreground (a bare control plane, or with `nodes` node
/// namespaces the whole Kubernetes lab, routed with `bgp`), writes its [`State`] once
/// ready, and stops it on SIGTERM or SIGINT.
pub(crate) fn serve(dir: &Path, nodes: usize, bgp: bool) -> Result<(), String> {
    if bgp && nodes == 0 {
        return Err("--bgp needs node namespaces (--nodes 2 or more)".to_owned());
    }
    // Either a bare control plane, or the whole Kubernetes lab with node namespaces.
    let (cp_holder, kube_lab);
    let state = if nodes == 0 {
        let cp = ControlPlane::start(ControlPlaneOptions { dir: Some(dir.join("controlplane")), ..Default::default() })
            .map_err(|e| e.to_string())?;
        let state = State {
            pid: std::process::id(),
            kubeconfig: cp.kubeconfig(),
            server: cp.server_url(),
            children: cp.pids(),
            nodes: Vec::new(),
            client: None,
            switch: None,
            node_names: Vec::new(),
            node_ips: Vec::new(),
            client_ip: None,
            vips: Vec::new(),
            service_port: None,
            kubectl: Some(cp.testbin().kubectl()),
            logs: None,
            routed: None,
        };
        cp_holder = Some(cp);
        kube_lab = None;
        state
    } else {
        let operator = havip_e2e::harness::kubelab::operator_binary().is_ok();
        if !operator {
            eprintln!("note: havip-operator is not built; the lab runs without it");
        }
        let lab = havip_e2e::harness::kubelab::KubeLab::start(havip_e2e::harness::kubelab::KubeLabOptions {
            nodes,
            operator,
            dir: Some(dir.join("kubelab")),
            chart_rbac: false,
            bgp: bgp.then_some(havip_e2e::harness::bgp::Speaker::Frr),
            agent_env: Vec::new(),
        })
        .map_err(|e| e.to_string())?;
        let mut children = lab.cp.pids();
        children.extend(lab.agents.iter().flatten().filter_map(|p| p.pid()));
        children.extend(lab.operator.iter().filter_map(|p| p.pid()));
        if let Some(r) = &lab.routing {
            children.extend(r.router.pids());
            for n in &r.nodes {
                if let havip_e2e::harness::bgp::NodeSpeaker::Frr(f) = n {
                    children.extend(f.pids());
                }
            }
        }
        let state = State {
            pid: std::process::id(),
            kubeconfig: lab.cp.kubeconfig(),
            server: lab.cp.server_url(),
            children,
            nodes: lab.topo.nodes().iter().map(|n| n.ns.clone()).collect(),
            client: Some(lab.topo.client().ns.clone()),
            switch: Some(lab.topo.switch_ns().to_owned()),
            node_names: lab.topo.nodes().iter().map(|n| n.name.clone()).collect(),
            node_ips: lab.topo.nodes().iter().map(|n| n.data_ip).collect(),
            client_ip: Some(lab.topo.client().ip),
            vips: (0..4).map(|j| lab.topo.vip(j)).collect(),
            service_port: Some(havip_e2e::harness::agent::SERVICE_PORT),
            kubectl: Some(lab.cp.testbin().kubectl()),
            logs: Some(lab.dir().to_owned()),
            routed: routed(&lab),
        };
        cp_holder = None;
        kube_lab = Some(lab);
        state
    };
    let json = serde_json::to_string_pretty(&state).map_err(|e| e.to_string())?;
    // Write-then-rename, so `up` never reads a half-written file.
    let tmp = dir.join("state.json.tmp");
    std::fs::write(&tmp, json).map_err(|e| format!("failed to write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, state_path(dir)).map_err(|e| format!("failed to write the state file: {e}"))?;
    tracing::info!(kubeconfig = %state.kubeconfig.display(), "lab ready");

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("failed to start the runtime: {e}"))?;
    rt.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
        let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        Ok::<(), String>(())
    })?;
    tracing::info!("stopping the lab");
    drop(kube_lab);
    drop(cp_holder);
    let _ = std::fs::remove_file(state_path(dir));
    Ok(())
}

/// The routed part of a lab's [`State`], when it has one.
fn routed(lab: &havip_e2e::harness::kubelab::KubeLab) -> Option<Routed> {
    use havip_e2e::harness::bgp::NodeSpeaker;
    let routing = lab.routing.as_ref()?;
    let client = lab.topo.routed_client()?;
    Some(Routed {
        router: lab.topo.gateway().ns.clone(),
        router_ip: lab.topo.gateway().ip,
        router_vty: routing.router.dir().to_owned(),
        node_vty: routing
            .nodes
            .iter()
            .map(|n| match n {
                NodeSpeaker::Frr(f) => f.dir().to_owned(),
                NodeSpeaker::Bird(b) => b.dir().to_owned(),
            })
            .collect(),
        client: client.ns.clone(),
        client_ip: client.ip,
        vips: (0..4).map(|j| lab.topo.routed_vip(j)).collect(),
    })
}
