//! The [`MetalLbLab`]: the topology, the control plane, MetalLB's controller and speakers,
//! the kube-proxy stand-in, and what the lab waits for and observes.

use super::config::{
    KUBE_PROXY_TABLE, MEMBERLIST_PORT, METALLB_NAMESPACE, MetalLbConfig, Mode, SPEAKER_LABELS, SPEAKER_METRICS_PORT,
    speaker_pod,
};
use super::error::{MetalLbError, Result};
use super::memberlist::{member_events, members_after};
use super::objects;
use crate::harness::bgp::router_config;
use crate::harness::controlplane::{ControlPlane, ControlPlaneOptions, client_from_kubeconfig};
use crate::harness::metrics::{metric_value, metrics_in};
use crate::harness::testbin::MetalLbBin;
use crate::host::netns::{self, DATA_IF, NetnsError, Topology};
use crate::host::process::{ManagedProcess, free_port, tail};
use crate::host::routing::{Frr, wait_for};
use crate::traffic::{Listener, ProberConfig, probe_once};
use kube::Client;
use nix::sys::signal::Signal;
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A MetalLB setup (layer 2 or BGP) on its own control plane and topology; everything is
/// stopped and removed on drop (speakers, controller and router SIGKILLed: nothing of
/// theirs outlives the namespaces and the control plane).
pub struct MetalLbLab {
    // Field order matters: processes first, then the control plane, then the topology.
    speakers: Vec<Option<ManagedProcess>>,
    speaker_log_start: Vec<u64>,
    controller: Option<ManagedProcess>,
    /// BGP mode: FRR on the gateway, the speakers' peer.
    router: Option<Frr>,
    /// Listeners per node (answer with the node's name on `0.0.0.0:port`).
    pub listeners: Vec<Listener>,
    /// The control plane.
    pub cp: ControlPlane,
    /// The topology.
    pub topo: Topology,
    bin: MetalLbBin,
    config: MetalLbConfig,
    vip: Ipv4Addr,
}

impl std::fmt::Debug for MetalLbLab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetalLbLab")
            .field("topology", &self.topo.prefix())
            .field("api", &self.cp.server_url())
            .field("vip", &self.vip)
            .field("bin", &self.bin.dir())
            .finish()
    }
}

impl MetalLbLab {
    /// Builds the topology, starts the control plane, applies the objects (see the module
    /// docs), installs the kube-proxy stand-in, starts the controller and the speakers,
    /// and returns once the Service has its address, every speaker sees every other in
    /// memberlist, and
    /// - layer 2: exactly one node announces, the client's ARP entry for the VIP names
    ///   that node's MAC, a connect through the VIP is answered by it, and its burst of
    ///   gratuitous ARPs is over (see [`MetalLbLab::wait_announcements_done`]);
    /// - BGP: the router has a session with every speaker, routes the VIP to every node
    ///   (ECMP), and a connect from the client behind it is answered.
    pub fn start(config: MetalLbConfig) -> Result<Self> {
        if !(2..=5).contains(&config.nodes) {
            return Err(MetalLbError::Invalid(format!("{} nodes; 2..=5 are supported", config.nodes)));
        }
        let bin = MetalLbBin::find()?;
        let bgp = matches!(config.mode, Mode::Bgp { .. });
        let topo = Topology::builder().nodes(config.nodes).host_port(true).routed_client(bgp).build()?;
        let cp = ControlPlane::start(ControlPlaneOptions {
            bind_address: IpAddr::V4(topo.host_ip()),
            ..Default::default()
        })?;
        let mut listeners = Vec::new();
        for i in 0..config.nodes {
            listeners.push(Listener::on_node(&topo, i, config.port)?);
        }
        let vip = if bgp { topo.routed_vip(0) } else { topo.vip(0) };
        let mut lab = Self {
            speakers: (0..config.nodes).map(|_| None).collect(),
            speaker_log_start: vec![0; config.nodes],
            controller: None,
            router: None,
            listeners,
            cp,
            topo,
            bin,
            config,
            vip,
        };
        for i in 0..lab.config.nodes {
            lab.install_kube_proxy_rule(i)?;
        }
        let key = lab.write_memberlist_key()?;
        lab.block_on(async {
            let client = lab.client().await?;
            objects::apply_objects(&client, &lab.bin, &lab.topo, lab.vip, &lab.config, &key).await
        })??;
        if bgp {
            let name = format!("{}-router", lab.topo.prefix());
            lab.router = Some(Frr::start(&lab.topo.gateway().ns, &name, &router_config(&lab.topo, None))?);
        }
        lab.start_controller()?;
        lab.wait_ingress_ip(lab.config.timeout)?;
        for i in 0..lab.config.nodes {
            lab.start_speaker(i)?;
        }
        lab.wait_memberlist_converged(lab.config.timeout)?;
        let holder = if bgp {
            lab.wait_routed_to_every_node(lab.config.timeout)?;
            lab.answered_by()?
        } else {
            let holder = lab.settle_announcer(lab.config.timeout)?;
            lab.check_answered_by(holder)?;
            lab.wait_announcements_done(holder, lab.config.timeout)?;
            holder
        };
        tracing::info!(vip = %lab.vip, holder = %lab.topo.node(holder).name, "MetalLB is announcing");
        Ok(lab)
    }

    /// The namespace of the client: behind the router in BGP mode, on the nodes' segment
    /// in layer 2.
    pub fn client_ns(&self) -> &str {
        match self.topo.routed_client() {
            Some(rc) => &rc.ns,
            None => &self.topo.client().ns,
        }
    }

    /// The router (BGP mode).
    pub fn router(&self) -> Option<&Frr> {
        self.router.as_ref()
    }

    /// BGP: waits until the router has a session with every speaker and routes the VIP to
    /// every node (ECMP: each speaker with a ready local endpoint advertises it).
    fn wait_routed_to_every_node(&mut self, timeout: Duration) -> Result<()> {
        let Some(router) = self.router.as_ref() else { return Err(MetalLbError::Invalid("not in BGP mode".into())) };
        let prefix = format!("{}/32", self.vip);
        let mut all: Vec<String> = self.topo.nodes().iter().map(|n| n.data_ip.to_string()).collect();
        all.sort();
        let routed = wait_for(&format!("the router to route {prefix} to every node"), timeout, || {
            let mut hops = router.best_next_hops(&prefix).unwrap_or_default();
            hops.sort();
            hops == all
        });
        if let Err(e) = routed {
            let sessions = router.vtysh("show bgp summary").unwrap_or_default();
            return Err(self.failed(&format!("{e}; router sessions:\n{sessions}")));
        }
        Ok(())
    }

    /// The node that serves the client now: in layer 2 the elected announcer; in BGP mode
    /// the node the router's ECMP hash sends the client's connections to (one flow key:
    /// the same node for every connect), read from the answer of one connect.
    pub fn active(&self) -> Result<usize> {
        match self.config.mode {
            Mode::Layer2 => self.announcer_index(),
            Mode::Bgp { .. } => self.answered_by(),
        }
    }

    /// Runs a future on a fresh current-thread runtime (the lab's API is synchronous).
    fn block_on<F: std::future::Future>(&self, f: F) -> Result<F::Output> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| MetalLbError::Io { op: "build a tokio runtime".into(), source })?;
        Ok(rt.block_on(f))
    }

    async fn client(&self) -> Result<Client> {
        Ok(client_from_kubeconfig(&self.cp.kubeconfig()).await?)
    }

    /// The VIP (the pool's only address).
    pub fn vip(&self) -> Ipv4Addr {
        self.vip
    }

    /// `VIP:port`, what the client connects to.
    pub fn target(&self) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.vip), self.config.port)
    }

    /// The binaries in use.
    pub fn bin(&self) -> &MetalLbBin {
        &self.bin
    }

    fn memberlist_dir(&self) -> PathBuf {
        self.topo.dir().join("memberlist")
    }

    /// The memberlist key, as the Secret's `secretkey` would be mounted (random, base64).
    fn write_memberlist_key(&self) -> Result<String> {
        use base64::Engine;
        let dir = self.memberlist_dir();
        std::fs::create_dir_all(&dir)
            .map_err(|source| MetalLbError::Io { op: format!("create {}", dir.display()), source })?;
        let mut raw = [0u8; 16];
        let mut f = std::fs::File::open("/dev/urandom")
            .map_err(|source| MetalLbError::Io { op: "open /dev/urandom".into(), source })?;
        std::io::Read::read_exact(&mut f, &mut raw)
            .map_err(|source| MetalLbError::Io { op: "read /dev/urandom".into(), source })?;
        let key = base64::engine::general_purpose::STANDARD_NO_PAD.encode(raw);
        let path = dir.join("secretkey");
        std::fs::write(&path, &key)
            .map_err(|source| MetalLbError::Io { op: format!("write {}", path.display()), source })?;
        Ok(key)
    }

    /// What kube-proxy does for a LoadBalancer address with `Local` endpoints on the node:
    /// DNAT `VIP:port` to the node's own endpoint (its data address), in prerouting and
    /// output. Replaces the table if present.
    fn install_kube_proxy_rule(&self, node: usize) -> Result<()> {
        let n = self.topo.node(node);
        let (vip, port, to) = (self.vip, self.config.port, n.data_ip);
        let t = KUBE_PROXY_TABLE;
        let script = format!(
            "add table ip {t}\ndelete table ip {t}\ntable ip {t} {{\n\
             \x20 chain prerouting {{\n    type nat hook prerouting priority dstnat; policy accept;\n    \
             ip daddr {vip} tcp dport {port} dnat to {to}:{port}\n  }}\n\
             \x20 chain output {{\n    type nat hook output priority -100; policy accept;\n    \
             ip daddr {vip} tcp dport {port} dnat to {to}:{port}\n  }}\n}}\n"
        );
        let path = self.topo.dir().join(format!("kube-proxy-{}.nft", n.name));
        std::fs::write(&path, script)
            .map_err(|source| MetalLbError::Io { op: format!("write {}", path.display()), source })?;
        netns::exec(&n.ns, "nft", &["-f", &path.display().to_string()])?;
        Ok(())
    }

    fn kube_env(&self) -> Vec<(String, String)> {
        vec![("KUBECONFIG".to_owned(), self.cp.kubeconfig().display().to_string())]
    }

    fn controller_log(&self) -> PathBuf {
        self.topo.dir().join("metallb-controller.log")
    }

    /// The log file of node `node`'s speaker (every start appended).
    pub fn speaker_log(&self, node: usize) -> PathBuf {
        self.topo.dir().join(format!("metallb-speaker-{}.log", self.topo.node(node).name))
    }

    fn start_controller(&mut self) -> Result<()> {
        let port = free_port(IpAddr::V4(Ipv4Addr::LOCALHOST))
            .map_err(|source| MetalLbError::Io { op: "find a free port for the controller".into(), source })?;
        let args = vec![
            format!("--namespace={METALLB_NAMESPACE}"),
            "--webhook-mode=disabled".to_owned(),
            format!("--port={port}"),
            format!("--log-level={}", self.config.log_level),
        ];
        let p = ManagedProcess::spawn(
            "metallb-controller",
            &self.bin.controller(),
            &args,
            &self.kube_env(),
            &self.controller_log(),
        )?;
        self.controller = Some(p);
        Ok(())
    }

    /// Starts node `node`'s speaker in its namespace (again, after
    /// [`MetalLbLab::terminate_speaker`] or [`MetalLbLab::kill_speaker`]); does nothing while
    /// it runs.
    pub fn start_speaker(&mut self, node: usize) -> Result<()> {
        let n = self.topo.nodes().get(node).ok_or_else(|| MetalLbError::Invalid(format!("no node {node}")))?.clone();
        if self.speakers[node].as_mut().is_some_and(ManagedProcess::is_running) {
            return Ok(());
        }
        let args = vec![
            format!("--node-name={}", n.name),
            format!("--pod-name={}", speaker_pod(&n.name)),
            format!("--namespace={METALLB_NAMESPACE}"),
            format!("--ml-bindaddr={}", n.data_ip),
            format!("--ml-bindport={MEMBERLIST_PORT}"),
            format!("--ml-labels={SPEAKER_LABELS}"),
            format!("--ml-secret-key-path={}", self.memberlist_dir().display()),
            format!("--port={SPEAKER_METRICS_PORT}"),
            format!("--log-level={}", self.config.log_level),
        ];
        let log = self.speaker_log(node);
        self.speaker_log_start[node] = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        let p = netns::spawn_in(
            &n.ns,
            &format!("metallb-speaker-{}", n.name),
            &self.bin.speaker(),
            &args,
            &self.kube_env(),
            &log,
        )?;
        self.speakers[node] = Some(p);
        Ok(())
    }

    /// The planned move: SIGTERM to node `node`'s speaker (it leaves memberlist on its way
    /// out, so the others take over without waiting for failure detection). Returns at
    /// once; see [`MetalLbLab::wait_speaker_exit`].
    pub fn terminate_speaker(&mut self, node: usize) -> Result<()> {
        let p = self.speakers.get(node).and_then(Option::as_ref).ok_or_else(|| self.failed("speaker not running"))?;
        tracing::info!(node = %self.topo.node(node).name, "stopping the MetalLB speaker (SIGTERM)");
        p.signal(Signal::SIGTERM).map_err(|e| MetalLbError::Io { op: "signal the speaker".into(), source: e.into() })
    }

    /// Waits until node `node`'s speaker has exited (SIGKILL after `timeout`).
    pub fn wait_speaker_exit(&mut self, node: usize, timeout: Duration) -> bool {
        let Some(p) = self.speakers.get_mut(node).and_then(Option::as_mut) else { return true };
        let start = Instant::now();
        while p.is_running() {
            if start.elapsed() >= timeout {
                p.kill_now();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// A crash: SIGKILL to node `node`'s speaker (no memberlist leave).
    pub fn kill_speaker(&mut self, node: usize) {
        if let Some(mut p) = self.speakers.get_mut(node).and_then(Option::take) {
            tracing::info!(node = %self.topo.node(node).name, "killing the MetalLB speaker (SIGKILL)");
            p.kill_now();
        }
    }

    /// Whether node `node`'s speaker runs.
    pub fn speaker_running(&mut self, node: usize) -> bool {
        self.speakers.get_mut(node).and_then(Option::as_mut).is_some_and(ManagedProcess::is_running)
    }

    fn check_processes(&mut self) -> Result<()> {
        if !self.controller.as_mut().is_some_and(ManagedProcess::is_running) {
            return Err(self.failed("controller exited"));
        }
        for i in 0..self.speakers.len() {
            if self.speakers[i].is_some() && !self.speaker_running(i) {
                return Err(self.failed(&format!("speaker on n{i} exited")));
            }
        }
        Ok(())
    }

    fn failed(&self, what: &str) -> MetalLbError {
        MetalLbError::Failed { what: what.to_owned(), logs: self.logs_tail(25) }
    }

    /// The Service's load-balancer ingress addresses.
    pub fn ingress_ips(&self) -> Result<Vec<String>> {
        self.block_on(async { objects::ingress_ips(self.client().await?).await })?
    }

    fn wait_ingress_ip(&mut self, timeout: Duration) -> Result<()> {
        let want = self.vip.to_string();
        let start = Instant::now();
        loop {
            self.check_processes()?;
            if self.ingress_ips()?.contains(&want) {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                return Err(self.failed(&format!("controller did not assign {want} to the Service within {timeout:?}")));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The memberlist members node `node`'s speaker has logged since its last start.
    pub fn members_seen_by(&self, node: usize) -> BTreeSet<String> {
        let text = std::fs::read(self.speaker_log(node)).unwrap_or_default();
        let from = usize::try_from(self.speaker_log_start[node]).unwrap_or(0);
        let fresh = String::from_utf8_lossy(text.get(from..).unwrap_or(&[]));
        members_after(&member_events(&fresh))
    }

    /// Waits until every running speaker sees every node's speaker in memberlist.
    pub fn wait_memberlist_converged(&mut self, timeout: Duration) -> Result<()> {
        let all: BTreeSet<String> = self.topo.nodes().iter().map(|n| n.name.clone()).collect();
        let start = Instant::now();
        loop {
            self.check_processes()?;
            let converged = (0..self.speakers.len()).all(|i| {
                let mut seen = self.members_seen_by(i);
                seen.insert(self.topo.node(i).name.clone());
                seen == all
            });
            if converged {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                return Err(self.failed(&format!("speakers did not all join memberlist within {timeout:?}")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The nodes named by the Service's `ServiceL2Status` objects (label `metallb.io/node`,
    /// else `status.node`; see the module docs for why the label), sorted.
    pub fn announcers(&self) -> Result<Vec<String>> {
        self.block_on(async { objects::announcers(self.client().await?).await })?
    }

    fn node_index(&self, name: &str) -> Option<usize> {
        self.topo.nodes().iter().position(|n| n.name == name)
    }

    /// The index of the one node that announces, when exactly one does.
    pub fn announcer_index(&self) -> Result<usize> {
        match self.announcers()?.as_slice() {
            [one] => self.node_index(one).ok_or_else(|| MetalLbError::Invalid(format!("unknown node {one}"))),
            other => Err(self.failed(&format!("announcers: {other:?}, not exactly one"))),
        }
    }

    /// Waits until exactly one node announces; returns its index.
    pub fn wait_one_announcer(&mut self, timeout: Duration) -> Result<usize> {
        let start = Instant::now();
        loop {
            self.check_processes()?;
            if let [one] = self.announcers()?.as_slice()
                && let Some(i) = self.node_index(one)
            {
                return Ok(i);
            }
            if start.elapsed() >= timeout {
                let now = self.announcers()?;
                return Err(self.failed(&format!("not exactly one announcer within {timeout:?} (now: {now:?})")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Setup: waits until there is one announcer and the client's ARP entry names it.
    /// Right after memberlist converges MetalLB may elect again, and the client may keep
    /// the first announcer's entry (it was seen once in about 16 setups): such an entry
    /// is deleted, so that the next resolution asks everyone, and the announcer is read
    /// again. Only before any measurement.
    fn settle_announcer(&mut self, timeout: Duration) -> Result<usize> {
        let start = Instant::now();
        let client = self.topo.client().ns.clone();
        loop {
            let left = timeout.saturating_sub(start.elapsed()).max(Duration::from_millis(1));
            let holder = self.wait_one_announcer(left)?;
            match self.wait_client_arp(holder, left.min(Duration::from_secs(5))) {
                Ok(_) => return Ok(holder),
                Err(e) if start.elapsed() < timeout => {
                    tracing::info!("MetalLB lab: the client's entry is not the announcer's; asking again");
                    tracing::debug!(error = %e, "MetalLB lab: client entry");
                    let vip = self.vip.to_string();
                    if let Err(e) = netns::exec(&client, "ip", &["neigh", "del", &vip, "dev", DATA_IF]) {
                        tracing::debug!(error = %e, "MetalLB lab: no client entry to delete");
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Waits until node `node` publishes a `ServiceL2Status` (others may still have theirs).
    pub fn wait_announced_by(&self, node: usize, timeout: Duration) -> Result<Duration> {
        let name = self.topo.node(node).name.clone();
        let start = Instant::now();
        loop {
            if self.announcers()?.contains(&name) {
                return Ok(start.elapsed());
            }
            if start.elapsed() >= timeout {
                return Err(self.failed(&format!("{name} did not announce within {timeout:?}")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the client's ARP entry for the VIP resolves to node `node`'s data MAC
    /// (asking again whenever it is unresolved); returns how long it took.
    pub fn wait_client_arp(&self, node: usize, timeout: Duration) -> Result<Duration> {
        let n = self.topo.node(node);
        let client = self.topo.client().ns.clone();
        let start = Instant::now();
        loop {
            let left = timeout.saturating_sub(start.elapsed());
            let mac =
                netns::resolve_neighbour(&client, DATA_IF, IpAddr::V4(self.vip), left.max(Duration::from_millis(1)));
            match mac {
                Ok(m) if m.eq_ignore_ascii_case(&n.data_mac) => return Ok(start.elapsed()),
                Ok(_) | Err(NetnsError::Timeout { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            if start.elapsed() >= timeout {
                let now = netns::neighbour(&client, DATA_IF, IpAddr::V4(self.vip))?;
                return Err(self.failed(&format!(
                    "the client's ARP entry for {} did not name {} ({}) within {timeout:?}; now: {now:?}",
                    self.vip, n.name, n.data_mac
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Node `node`'s speaker's `metallb_layer2_gratuitous_sent` for the VIP (its metrics
    /// inside the node's namespace); `None` when it cannot be read or has no such sample.
    pub fn gratuitous_sent(&self, node: usize) -> Option<f64> {
        let text = metrics_in(&self.topo.node(node).ns, SPEAKER_METRICS_PORT);
        metric_value(&text, "metallb_layer2_gratuitous_sent", &format!("ip=\"{}\"", self.vip))
    }

    /// Waits until node `node`'s speaker has sent gratuitous ARPs for the VIP and then no
    /// more for 2 s: the burst MetalLB sends on taking an address (every 1.1 s for 5 s)
    /// is over. A holder stopped during its burst goes on announcing itself until its
    /// process exits, so the planned move starts from a settled holder (as havip's and
    /// keepalived's do).
    pub fn wait_announcements_done(&self, node: usize, timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        let mut last: Option<(f64, Instant)> = None;
        loop {
            let now = self.gratuitous_sent(node);
            match (now, last) {
                // Unchanged (a counter: equal floats are the same count) for 2 s: done.
                (Some(n), Some((l, since))) if n == l && since.elapsed() >= Duration::from_secs(2) => {
                    return Ok(start.elapsed());
                }
                (Some(n), Some((l, _))) if n == l => {}
                (Some(n), _) if n > 0.0 => last = Some((n, Instant::now())),
                _ => {}
            }
            if start.elapsed() >= timeout {
                return Err(self.failed(&format!(
                    "n{node}'s gratuitous ARPs for {} did not settle within {timeout:?} (now {now:?})",
                    self.vip
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// One connect from the client through the VIP must be answered by node `node`.
    fn check_answered_by(&self, node: usize) -> Result<()> {
        let who = self.answered_by()?;
        if who == node {
            return Ok(());
        }
        let (got, want) = (&self.topo.node(who).name, &self.topo.node(node).name);
        Err(self.failed(&format!("a connect to {} was answered by {got}, not {want}", self.target())))
    }

    /// The node that answers one connect from the client through the VIP.
    fn answered_by(&self) -> Result<usize> {
        let config = ProberConfig::new(self.target())
            .connect_timeout(Duration::from_millis(500))
            .read_timeout(Duration::from_millis(500));
        let answer = netns::in_netns(self.client_ns(), move || probe_once(&config))?;
        match answer {
            Ok(who) => self.node_index(&who).ok_or_else(|| self.failed(&format!("answered by unknown {who}"))),
            Err(e) => Err(self.failed(&format!("a connect to {} failed: {e}", self.target()))),
        }
    }

    /// The controller's and the speakers' last `lines` log lines (and the router's), for
    /// failure reports.
    pub fn logs_tail(&self, lines: usize) -> String {
        let mut out = format!("--- metallb controller ---\n{}\n", tail(&self.controller_log(), lines));
        if let Some(r) = &self.router {
            out.push_str(&r.logs_tail(lines));
        }
        for i in 0..self.topo.nodes().len() {
            out.push_str(&format!(
                "--- metallb speaker {} ---\n{}\n",
                self.topo.node(i).name,
                tail(&self.speaker_log(i), lines)
            ));
        }
        out
    }
}

impl Drop for MetalLbLab {
    fn drop(&mut self) {
        for p in self.speakers.iter_mut().filter_map(Option::as_mut) {
            p.kill_now();
        }
        if let Some(p) = self.controller.as_mut() {
            p.kill_now();
        }
        self.router.take();
    }
}
