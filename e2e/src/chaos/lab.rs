//! The chaos run's lab and its nemesis's hands: the Kubernetes lab with three nodes, pairs
//! that share nodes (Standard and Fast profiles, two and three members), a VIPPool with
//! LoadBalancer Services, two operator replicas, every agent under libfaketime (its wall
//! clock steppable while it runs), and the injection and heal of every fault kind.

use super::schedule::{Action, Cable, Edit, Fault, Shape};
use crate::harness::api::external_ip;
use crate::harness::kubelab::{KubeLab, KubeLabOptions, NAMESPACE};
use crate::host::netns::{self, Link};
use crate::host::process::ManagedProcess;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, PostParams};
use nix::sys::signal::Signal;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The port every node's listener answers on (the FloatingIPs' probe port).
pub const SERVICE_PORT: u16 = crate::harness::agent::SERVICE_PORT;
/// The node ports of the Services (`svc-a`, `svc-b`, and the one the nemesis adds).
pub const NODE_PORTS: [u16; 3] = [30080, 30081, 30082];
/// The extra Service's name.
pub const EXTRA_SERVICE: &str = "svc-x";
/// The VIP index (`Topology::vip`) of the extra FloatingIP.
const EXTRA_VIP: u8 = 5;

/// How long one API call of the nemesis may take: a call that reaches the API server
/// while etcd is down hangs until the server's own timeout or longer (seen: a Service
/// delete that took 830 s, stalling every fault behind it). A call that times out fails
/// the inject (recorded) or the heal (retried every second).
const API_CALL: Duration = Duration::from_secs(10);

/// libfaketime (Debian's `faketime` package), multi-threaded flavour.
const LIBFAKETIME: [&str; 2] =
    ["/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1", "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1"];

/// A pair of the lab.
#[derive(Debug, Clone)]
pub struct PairDef {
    /// Its name.
    pub name: &'static str,
    /// Its members, in priority order.
    pub members: Vec<usize>,
    /// The Fast profile (else Standard).
    pub fast: bool,
    /// The index of its own FloatingIP's address (`Topology::vip`), if it has one.
    pub vip: Option<u8>,
    /// Automatic failback to the preferred member (else Manual, the default).
    pub failback: bool,
}

impl PairDef {
    /// Its heartbeat timeout (ms), and with the timing edit.
    pub fn timeouts_ms(&self) -> (f64, f64) {
        if self.fast { (90.0, 135.0) } else { (300.0, 450.0) }
    }
}

/// A VIP the clients probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VipDef {
    /// The FloatingIP's or the Service's name.
    pub name: String,
    /// Its address.
    pub address: Ipv4Addr,
    /// The port the clients connect to.
    pub port: u16,
    /// Its pair.
    pub pair: usize,
}

impl VipDef {
    /// Where the clients connect.
    pub fn target(&self) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.address), self.port)
    }
}

/// What a fault left that its heal needs.
#[derive(Debug)]
enum Held {
    Tables(Vec<netns::Fault>),
    Replica(usize),
    Node(usize),
    Nothing,
}

/// The lab.
pub struct ChaosLab {
    /// Two operator replicas (None while killed).
    pub operators: Vec<Option<ManagedProcess>>,
    /// The Kubernetes lab.
    pub lab: KubeLab,
    /// The pairs.
    pub pairs: Vec<PairDef>,
    /// The VIPs that exist for the whole run.
    pub vips: Vec<VipDef>,
    /// Per node, the file libfaketime reads the agent's clock offset from (None without
    /// libfaketime: no clock steps).
    faketime: Option<Vec<PathBuf>>,
    held: BTreeMap<usize, Held>,
    /// The temporary directory of the clock files (None: the caller's directory).
    _tmp: Option<tempfile::TempDir>,
}

/// A failure to build the lab or to carry out a fault.
pub type LabResult<T> = Result<T, String>;

/// libfaketime's library, when installed (Debian's `faketime`): a process started with it
/// in `LD_PRELOAD` reads its wall clock with an offset (`FAKETIME`, or the file named by
/// `FAKETIME_TIMESTAMP_FILE`).
pub fn libfaketime() -> Option<&'static str> {
    LIBFAKETIME.into_iter().find(|p| Path::new(p).exists())
}

impl ChaosLab {
    /// Whether clock steps are possible here (libfaketime installed).
    pub fn clock_steps_possible() -> bool {
        libfaketime().is_some()
    }

    /// Starts the lab and waits until every VIP answers its clients.
    pub fn start(dir: Option<PathBuf>) -> LabResult<Self> {
        let nodes = 3;
        // The clock files live in the given directory, or in a temporary one removed with
        // the lab.
        let tmp = match &dir {
            Some(_) => None,
            None => Some(
                tempfile::Builder::new()
                    .prefix("havip-chaos-")
                    .tempdir()
                    .map_err(|e| format!("create a temporary directory: {e}"))?,
            ),
        };
        let work = dir.clone().or_else(|| tmp.as_ref().map(|t| t.path().to_owned())).unwrap_or_else(std::env::temp_dir);
        std::fs::create_dir_all(&work).map_err(|e| format!("create {}: {e}", work.display()))?;
        let faketime: Option<Vec<PathBuf>> = libfaketime()
            .map(|_| (0..nodes).map(|i| work.join(format!("chaos-faketime-{}-{i}", std::process::id()))).collect());
        let mut agent_env = Vec::new();
        if let (Some(lib), Some(files)) = (libfaketime(), &faketime) {
            for f in files {
                std::fs::write(f, "+0s\n").map_err(|e| format!("write {}: {e}", f.display()))?;
                agent_env.push(vec![
                    ("LD_PRELOAD".to_owned(), lib.to_owned()),
                    ("FAKETIME_TIMESTAMP_FILE".to_owned(), f.display().to_string()),
                    ("FAKETIME_DONT_FAKE_MONOTONIC".to_owned(), "1".to_owned()),
                    ("FAKETIME_CACHE_DURATION".to_owned(), "1".to_owned()),
                ]);
            }
        }
        let mut lab = KubeLab::start(KubeLabOptions { nodes, operator: false, dir, agent_env, ..Default::default() })
            .map_err(|e| format!("start the lab: {e}"))?;
        let mut operators = Vec::new();
        for r in 0..2 {
            operators.push(Some(lab.spawn_operator(&format!("operator-{r}")).map_err(|e| e.to_string())?));
        }
        for i in 0..nodes {
            for port in std::iter::once(SERVICE_PORT).chain(NODE_PORTS) {
                lab.serve(i, port).map_err(|e| format!("listener n{i}:{port}: {e}"))?;
            }
        }
        let pairs = vec![
            PairDef { name: "alpha", members: vec![0, 1], fast: false, vip: Some(0), failback: true },
            PairDef { name: "beta", members: vec![1, 2], fast: true, vip: Some(1), failback: false },
            PairDef { name: "gamma", members: vec![2, 0, 1], fast: false, vip: None, failback: true },
        ];
        let mut me = Self { operators, lab, pairs, vips: Vec::new(), faketime, held: BTreeMap::new(), _tmp: tmp };
        let mut yaml = String::new();
        for p in 0..me.pairs.len() {
            yaml.push_str(&me.pair_yaml(p, None));
            yaml.push_str("---\n");
            if let Some(j) = me.pairs[p].vip {
                let name = format!("{}-vip", me.pairs[p].name);
                yaml.push_str(&me.fip_yaml(&name, p, j));
                yaml.push_str("---\n");
                me.vips.push(VipDef { name, address: me.lab.topo.vip(j), port: SERVICE_PORT, pair: p });
            }
        }
        let (net, _) = me.lab.topo.data_subnet();
        let o = net.octets();
        yaml.push_str(&format!(
            "apiVersion: havip.io/v1alpha1\nkind: VIPPool\nmetadata: {{name: lan}}\nspec:\n  pair: gamma\n  addresses: [\"{0}.{1}.{2}.60-{0}.{1}.{2}.69\"]\n",
            o[0], o[1], o[2]
        ));
        me.lab.block_on(me.lab.apply(&yaml)).map_err(|e| format!("apply the pairs: {e}"))?;
        for (k, name) in ["svc-a", "svc-b"].into_iter().enumerate() {
            let address = me.add_service(name, NODE_PORTS[k], Duration::from_secs(30))?;
            me.vips.push(VipDef { name: name.to_owned(), address, port: NODE_PORTS[k], pair: 2 });
        }
        Ok(me)
    }

    /// The pairs' shape for the schedule.
    pub fn shape(&self) -> Shape {
        Shape { nodes: self.lab.topo.nodes().len(), pairs: self.pairs.iter().map(|p| p.members.clone()).collect() }
    }

    fn pair_yaml(&self, p: usize, edit: Option<Edit>) -> String {
        let def = &self.pairs[p];
        let mut y = format!("apiVersion: havip.io/v1alpha1\nkind: HAPair\nmetadata:\n  name: {}\nspec:\n", def.name);
        if def.fast {
            y.push_str("  profile: Fast\n");
        }
        if def.failback {
            y.push_str("  failback:\n    mode: Automatic\n");
        }
        y.push_str("  members:\n");
        for (rank, i) in def.members.iter().enumerate() {
            if edit == Some(Edit::RemoveMember { node: *i }) {
                continue;
            }
            y.push_str(&format!("    - node: {}\n      priority: {}\n", self.lab.topo.node(*i).name, 200 - 10 * rank));
        }
        y.push_str("  heartbeat:\n");
        if edit == Some(Edit::Timings) {
            let (interval, timeout) = if def.fast { ("45ms", "135ms") } else { ("150ms", "450ms") };
            y.push_str(&format!("    interval: {interval}\n    timeout: {timeout}\n"));
        }
        y.push_str(
            "    paths:\n      - name: data\n        addressType: InternalIP\n      - name: mgmt\n        addressType: ExternalIP\n",
        );
        y
    }

    fn fip_yaml(&self, name: &str, pair: usize, j: u8) -> String {
        format!(
            "apiVersion: havip.io/v1alpha1\nkind: FloatingIP\nmetadata:\n  name: {name}\nspec:\n  pair: {}\n  address: {}/24\n  interface: eth0\n  probe:\n    ports: [{SERVICE_PORT}]\n",
            self.pairs[pair].name,
            self.lab.topo.vip(j)
        )
    }

    /// Runs `call` against the API server for at most [`API_CALL`].
    fn api<T>(&self, what: &str, call: impl std::future::Future<Output = LabResult<T>>) -> LabResult<T> {
        self.lab.block_on(async {
            tokio::time::timeout(API_CALL, call)
                .await
                .unwrap_or_else(|_| Err(format!("{what}: no answer from the API server within {API_CALL:?}")))
        })
    }

    /// Applies `yaml` (server-side) for at most [`API_CALL`].
    fn apply(&self, yaml: &str) -> LabResult<()> {
        self.api("apply", async { self.lab.apply(yaml).await.map_err(|e| e.to_string()) })
    }

    /// Creates LoadBalancer Service `name` on `node_port` and waits for its address.
    pub fn add_service(&self, name: &str, node_port: u16, timeout: Duration) -> LabResult<Ipv4Addr> {
        self.api("create the Service", async {
            let client = self.lab.client().await.map_err(|e| e.to_string())?;
            let services: Api<Service> = Api::namespaced(client, "default");
            let svc: Service = serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                "spec": {"type": "LoadBalancer", "loadBalancerClass": "havip.io/l2",
                         "ports": [{"port": 80, "nodePort": node_port, "protocol": "TCP"}], "selector": {"app": name}},
            }))
            .map_err(|e| e.to_string())?;
            match services.create(&PostParams::default(), &svc).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                Err(e) => Err(format!("create Service {name}: {e}")),
            }
        })?;
        self.service_address(name, timeout)
    }

    /// The address of Service `name`, waited for up to `timeout`.
    pub fn service_address(&self, name: &str, timeout: Duration) -> LabResult<Ipv4Addr> {
        self.lab.block_on(async {
            let client = self.lab.client().await.map_err(|e| e.to_string())?;
            let services: Api<Service> = Api::namespaced(client, "default");
            let deadline = Instant::now() + timeout;
            loop {
                if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(2), services.get(name)).await
                    && let Some(IpAddr::V4(ip)) = external_ip(&s)
                {
                    return Ok(ip);
                }
                if Instant::now() > deadline {
                    return Err(format!("Service {name} got no address within {timeout:?}"));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    }

    fn delete_service(&self, name: &str) -> LabResult<()> {
        self.api("delete the Service", async {
            let client = self.lab.client().await.map_err(|e| e.to_string())?;
            let services: Api<Service> = Api::namespaced(client, "default");
            match services.delete(name, &DeleteParams::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                Err(e) => Err(format!("delete Service {name}: {e}")),
            }
        })
    }

    fn kubectl(&self, args: &[&str]) -> LabResult<String> {
        let out = self
            .lab
            .cp
            .kubectl()
            .arg("--request-timeout=10s")
            .args(args)
            .output()
            .map_err(|e| format!("run kubectl: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!("kubectl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
        }
    }

    fn plugin(&self, args: &[&str]) -> LabResult<String> {
        // 5 s for the answer (the plugin's default is 15): the nemesis has more to do.
        let args: Vec<&str> = ["--timeout", "5s"].into_iter().chain(args.iter().copied()).collect();
        // Bounded as a whole: its API calls hang up to 60 s while etcd is down.
        let (ok, out) = self.lab.plugin_within(&args, API_CALL + Duration::from_secs(5));
        if ok { Ok(out) } else { Err(format!("kubectl havip {}: {}", args.join(" "), out.trim())) }
    }

    /// The node whose kernel holds `vip` on its data interface (the first if several).
    pub fn holder_of(&self, vip: Ipv4Addr) -> Option<usize> {
        self.lab
            .topo
            .nodes()
            .iter()
            .position(|n| netns::has_address(&n.ns, &n.data_if, IpAddr::V4(vip)).unwrap_or(false))
    }

    fn step_clock(&self, node: usize, seconds: i64) -> LabResult<()> {
        let files = self.faketime.as_ref().ok_or("libfaketime is not installed")?;
        let f = &files[node];
        let spec = if seconds < 0 { format!("{seconds}s\n") } else { format!("+{seconds}s\n") };
        std::fs::write(f, spec).map_err(|e| format!("write {}: {e}", f.display()))
    }

    fn signal_agent(&self, node: usize, signal: Signal) -> LabResult<()> {
        match &self.lab.agents[node] {
            Some(p) => p.signal(signal).map_err(|e| format!("{signal} to agent n{node}: {e}")),
            None => Err(format!("agent n{node} is not running")),
        }
    }

    fn leader_replica(&self) -> LabResult<usize> {
        let holder = self.api("read the leader Lease", async {
            let client = self.lab.client().await.map_err(|e| e.to_string())?;
            let leases: Api<Lease> = Api::namespaced(client, NAMESPACE);
            let l = leases.get("havip-operator").await.map_err(|e| format!("read the leader Lease: {e}"))?;
            l.spec.and_then(|s| s.holder_identity).ok_or_else(|| "the leader Lease has no holder".to_owned())
        })?;
        self.operators
            .iter()
            .position(|o| {
                o.as_ref().and_then(ManagedProcess::pid).is_some_and(|pid| holder.ends_with(&format!("-{pid}")))
            })
            .ok_or_else(|| format!("no running replica is the leader {holder}"))
    }

    /// Injects `f`; returns the nodes it acts on (a drain interrupted picks the holder).
    pub fn inject(&mut self, f: &Fault) -> LabResult<Vec<usize>> {
        let topo = &self.lab.topo;
        let link = |c: Cable| if c == Cable::Data { Link::Data } else { Link::Mgmt };
        let mut nodes = f.action.nodes(&self.shape());
        let held = match f.action {
            Action::NodeCut { node } => {
                topo.kill_node_links(node).map_err(|e| e.to_string())?;
                Held::Nothing
            }
            Action::CableCut { node, cable } => {
                topo.cut_cable(node, link(cable)).map_err(|e| e.to_string())?;
                Held::Nothing
            }
            Action::PeerPartition { a, b } => {
                let t1 = topo.partition_peer(a, b).map_err(|e| e.to_string())?;
                let t2 = topo.partition_peer(b, a).map_err(|e| e.to_string())?;
                Held::Tables(vec![t1, t2])
            }
            Action::OneWayLoss { node, cable, towards_node, percent } => Held::Tables(vec![
                topo.set_link_loss_one_way(node, link(cable), percent, towards_node).map_err(|e| e.to_string())?,
            ]),
            Action::Loss { node, cable, percent } => {
                Held::Tables(vec![topo.set_link_loss(node, link(cable), percent).map_err(|e| e.to_string())?])
            }
            Action::ApiServerDown => {
                self.lab.cp.stop_apiserver();
                Held::Nothing
            }
            Action::EtcdDown => {
                self.lab.cp.stop_etcd();
                Held::Nothing
            }
            Action::OperatorLeaderKilled => {
                let r = self.leader_replica()?;
                if let Some(mut p) = self.operators[r].take() {
                    p.kill_now();
                }
                Held::Replica(r)
            }
            Action::AgentKill { node } => {
                self.lab.kill_agent(node);
                Held::Nothing
            }
            Action::AgentStop { node } => {
                self.signal_agent(node, Signal::SIGSTOP)?;
                Held::Nothing
            }
            Action::AgentRestart { node } => {
                self.lab.stop_agent(node);
                self.lab.start_agent(node).map_err(|e| e.to_string())?;
                Held::Nothing
            }
            Action::ClockStep { node, seconds } => {
                self.step_clock(node, seconds)?;
                Held::Nothing
            }
            Action::StateFile { node, corrupt } => {
                let dir = self.lab.dir().join(format!("state-{node}"));
                let files: Vec<PathBuf> = std::fs::read_dir(&dir)
                    .map_err(|e| format!("read {}: {e}", dir.display()))?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.to_string_lossy().ends_with(".state.json"))
                    .collect();
                for p in &files {
                    let r = if corrupt {
                        std::fs::write(p, b"{\"epoch\": garbage\x00\xff")
                    } else {
                        std::fs::remove_file(p)
                    };
                    r.map_err(|e| format!("{} {}: {e}", if corrupt { "overwrite" } else { "delete" }, p.display()))?;
                }
                self.lab.kill_agent(node);
                self.lab.start_agent(node).map_err(|e| e.to_string())?;
                Held::Nothing
            }
            Action::KeyRotation { pair } => {
                self.plugin(&["rotate-key", self.pairs[pair].name])?;
                Held::Nothing
            }
            Action::PairEdit { pair, edit } => {
                let y = self.pair_yaml(pair, Some(edit));
                self.apply(&y)?;
                Held::Nothing
            }
            Action::PlannedFailover { pair, to } => {
                let name = self.pairs[pair].name;
                match to {
                    Some(n) => {
                        let node = self.lab.topo.node(n).name.clone();
                        self.plugin(&["failover", name, "--to", &node])?
                    }
                    None => self.plugin(&["failover", name])?,
                };
                Held::Nothing
            }
            Action::Maintenance { pair, node } => {
                let n = self.lab.topo.node(node).name.clone();
                self.plugin(&["maintenance", self.pairs[pair].name, &n, "on"])?;
                Held::Nothing
            }
            Action::FailbackResume { pair } => {
                self.plugin(&["resume-failback", self.pairs[pair].name])?;
                Held::Nothing
            }
            Action::FloatingIpChurn { pair } => {
                let y = self.fip_yaml(&extra_fip_name(), pair, EXTRA_VIP);
                self.apply(&y)?;
                Held::Nothing
            }
            Action::ServiceChurn => {
                self.add_service(EXTRA_SERVICE, NODE_PORTS[2], Duration::from_secs(10))?;
                Held::Nothing
            }
            Action::DrainInterrupted { pair } => {
                let vip = self.pair_address(pair).ok_or("the pair has no address")?;
                let holder = self.holder_of(vip).ok_or("nobody holds the pair's address")?;
                self.plugin(&["failover", self.pairs[pair].name])?;
                // Into the drain: the new holder announced, the old one keeps the
                // established connections.
                std::thread::sleep(Duration::from_millis(500));
                self.lab.kill_agent(holder);
                nodes = vec![holder];
                Held::Node(holder)
            }
        };
        self.held.insert(f.id, held);
        Ok(nodes)
    }

    /// The first address of pair `p` (its own FloatingIP's, or its first Service's).
    pub fn pair_address(&self, p: usize) -> Option<Ipv4Addr> {
        self.vips.iter().find(|v| v.pair == p).map(|v| v.address)
    }

    /// The extra FloatingIP's address.
    pub fn extra_fip_address(&self) -> Ipv4Addr {
        self.lab.topo.vip(EXTRA_VIP)
    }

    /// Heals `f`.
    pub fn heal(&mut self, f: &Fault) -> LabResult<()> {
        let held = self.held.remove(&f.id).unwrap_or(Held::Nothing);
        let topo = &self.lab.topo;
        let link = |c: Cable| if c == Cable::Data { Link::Data } else { Link::Mgmt };
        match f.action {
            Action::NodeCut { node } => topo.restore_node(node).map_err(|e| e.to_string()),
            Action::CableCut { node, cable } => topo.restore_cable(node, link(cable)).map_err(|e| e.to_string()),
            Action::PeerPartition { .. } | Action::OneWayLoss { .. } | Action::Loss { .. } => {
                if let Held::Tables(tables) = held {
                    for t in &tables {
                        topo.heal(t).map_err(|e| e.to_string())?;
                    }
                }
                Ok(())
            }
            Action::ApiServerDown | Action::EtcdDown => {
                self.lab.cp.start_etcd().map_err(|e| e.to_string())?;
                self.lab.cp.start_apiserver().map_err(|e| e.to_string())
            }
            Action::OperatorLeaderKilled => {
                if let Held::Replica(r) = held {
                    self.operators[r] =
                        Some(self.lab.spawn_operator(&format!("operator-{r}")).map_err(|e| e.to_string())?);
                }
                Ok(())
            }
            Action::AgentKill { node } => self.lab.start_agent(node).map_err(|e| e.to_string()),
            Action::AgentStop { node } => self.signal_agent(node, Signal::SIGCONT),
            Action::ClockStep { node, .. } => self.step_clock(node, 0),
            Action::PairEdit { pair, .. } => {
                let y = self.pair_yaml(pair, None);
                self.apply(&y)
            }
            Action::Maintenance { pair, node } => {
                let n = self.lab.topo.node(node).name.clone();
                self.plugin(&["maintenance", self.pairs[pair].name, &n, "off"]).map(drop)
            }
            Action::FloatingIpChurn { .. } => {
                self.kubectl(&["delete", "floatingips.havip.io", &extra_fip_name(), "--ignore-not-found"]).map(drop)
            }
            Action::ServiceChurn => self.delete_service(EXTRA_SERVICE),
            Action::DrainInterrupted { .. } => match held {
                Held::Node(n) => self.lab.start_agent(n).map_err(|e| e.to_string()),
                _ => Ok(()),
            },
            Action::AgentRestart { .. }
            | Action::StateFile { .. }
            | Action::KeyRotation { .. }
            | Action::PlannedFailover { .. }
            | Action::FailbackResume { .. } => Ok(()),
        }
    }

    /// Heals whatever a fault that could not be healed left: every cable and table,
    /// the control plane, the operators, the agents (continued, started), the clocks.
    pub fn heal_everything(&mut self) -> Vec<String> {
        let mut errors = Vec::new();
        if let Err(e) = self.lab.topo.heal_all() {
            errors.push(format!("heal the network: {e}"));
        }
        if let Err(e) = self.lab.cp.start_etcd() {
            errors.push(format!("start etcd: {e}"));
        }
        if let Err(e) = self.lab.cp.start_apiserver() {
            errors.push(format!("start the API server: {e}"));
        }
        for r in 0..self.operators.len() {
            if self.operators[r].is_none() {
                match self.lab.spawn_operator(&format!("operator-{r}")) {
                    Ok(p) => self.operators[r] = Some(p),
                    Err(e) => errors.push(format!("start operator {r}: {e}")),
                }
            }
        }
        for i in 0..self.lab.agents.len() {
            if self.faketime.is_some()
                && let Err(e) = self.step_clock(i, 0)
            {
                errors.push(e);
            }
            match &self.lab.agents[i] {
                Some(p) => {
                    let _ = p.signal(Signal::SIGCONT);
                }
                None => {
                    if let Err(e) = self.lab.start_agent(i) {
                        errors.push(format!("start agent n{i}: {e}"));
                    }
                }
            }
        }
        self.held.clear();
        errors
    }

    /// Deletes every object the run made (Services, the pool, FloatingIPs, pairs).
    pub fn delete_everything(&self) -> LabResult<()> {
        for name in ["svc-a", "svc-b", EXTRA_SERVICE] {
            self.delete_service(name)?;
        }
        self.kubectl(&["delete", "vippools.havip.io", "--all"])?;
        self.kubectl(&["delete", "floatingips.havip.io", "--all"])?;
        self.kubectl(&["delete", "hapairs.havip.io", "--all"])?;
        Ok(())
    }

    /// What the run left behind once every object is gone (empty: nothing): VIP
    /// addresses on any interface of any node, havip's nftables tables, state and
    /// ledger files, pair Leases.
    pub fn leftovers(&self, addresses: &[Ipv4Addr]) -> Vec<String> {
        let mut out = Vec::new();
        for (i, n) in self.lab.topo.nodes().iter().enumerate() {
            match netns::exec(&n.ns, "ip", &["-o", "-4", "addr", "show"]) {
                Ok(text) => {
                    for a in addresses {
                        let needle = format!(" {a}/");
                        for line in text.lines().filter(|l| l.contains(&needle)) {
                            out.push(format!(
                                "n{i}: address left: {}",
                                line.split_whitespace().collect::<Vec<_>>().join(" ")
                            ));
                        }
                    }
                }
                Err(e) => out.push(format!("n{i}: cannot list addresses: {e}")),
            }
            match netns::exec(&n.ns, "nft", &["list", "tables"]) {
                Ok(text) => {
                    for l in text.lines().filter(|l| l.contains("havip")) {
                        out.push(format!("n{i}: nftables table left: {}", l.trim()));
                    }
                }
                Err(e) => out.push(format!("n{i}: cannot list nftables tables: {e}")),
            }
            let dir = self.lab.dir().join(format!("state-{i}"));
            if let Ok(entries) = std::fs::read_dir(&dir) {
                for e in entries.flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if self.pairs.iter().any(|p| name.starts_with(&format!("{}.", p.name))) {
                        out.push(format!("n{i}: state file left: {name}"));
                    }
                }
            }
        }
        // Pair Leases owned by their (deleted) HAPair are the garbage collector's: a real
        // cluster's kube-controller-manager deletes them; the lab runs none. Others are
        // left behind.
        let leases = self.api("list the Leases", async {
            let client = self.lab.client().await.map_err(|e| e.to_string())?;
            let leases: Api<Lease> = Api::namespaced(client, NAMESPACE);
            let list = leases.list(&Default::default()).await.map_err(|e| e.to_string())?;
            Ok::<Vec<String>, String>(
                list.items
                    .into_iter()
                    .filter(|l| l.metadata.name.as_deref().is_some_and(|n| n.starts_with("hapair-")))
                    .filter(|l| {
                        !l.metadata.owner_references.as_deref().unwrap_or_default().iter().any(|o| o.kind == "HAPair")
                    })
                    .filter_map(|l| l.metadata.name)
                    .collect(),
            )
        });
        match leases {
            Ok(names) => out.extend(names.into_iter().map(|n| format!("Lease left: {n}"))),
            Err(e) => out.push(format!("cannot list the Leases: {e}")),
        }
        out
    }

    /// A poller of the pairs' Leases and status that runs on its own thread.
    pub fn poller(&self) -> Poller {
        Poller {
            kubeconfig: self.lab.cp.kubeconfig(),
            pairs: self.pairs.iter().map(|p| p.name).collect(),
            nodes: self.lab.topo.nodes().iter().map(|n| n.name.clone()).collect(),
        }
    }
}

/// Reads every pair's Lease and status (see [`ChaosLab::poller`]).
#[derive(Debug, Clone)]
pub struct Poller {
    kubeconfig: PathBuf,
    pairs: Vec<&'static str>,
    nodes: Vec<String>,
}

impl Poller {
    /// The pair Lease's (holder node, epoch) and the status's active node of every pair
    /// (None where the API does not answer within 800 ms).
    pub async fn poll(&self) -> Vec<(Option<usize>, Option<i64>, Option<usize>)> {
        let node_of = |name: Option<String>| -> Option<usize> {
            let name = name?;
            self.nodes.iter().position(|n| *n == name)
        };
        let Ok(client) = crate::harness::controlplane::client_from_kubeconfig(&self.kubeconfig).await else {
            return vec![(None, None, None); self.pairs.len()];
        };
        let mut out = Vec::new();
        for p in &self.pairs {
            let limit = Duration::from_millis(800);
            let (holder, epoch) = match tokio::time::timeout(limit, crate::harness::api::get_lease(&client, p)).await {
                Ok(Ok((h, e))) => (node_of(h), Some(e)),
                _ => (None, None),
            };
            let active = match tokio::time::timeout(limit, crate::harness::api::get_pair(&client, p)).await {
                Ok(Ok(hp)) => node_of(hp.status.and_then(|s| s.active)),
                _ => None,
            };
            out.push((holder, epoch, active));
        }
        out
    }
}

/// The extra FloatingIP's name.
pub fn extra_fip_name() -> String {
    "extra-vip".to_owned()
}
