//! A highly available Kubernetes control plane inside network namespaces: on each of
//! one or three nodes of a [`Topology`], an etcd member and a kube-apiserver, for tests
//! of a control-plane VIP (the address clients and kubelets use for the API server,
//! moved between the control-plane nodes).
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use havip_e2e::cpcluster::CpCluster;
//! use havip_e2e::netns::Topology;
//! use std::net::IpAddr;
//! let topo = Topology::builder().nodes(3).build()?;
//! let vip = IpAddr::V4(topo.vip(0));
//! let mut cp = CpCluster::start(&topo, &[0, 1, 2], &[vip])?;
//! let (ok, out) = cp.kubectl(&topo.client().ns, cp.apiserver_addr(1), &["get", "ns"]);
//! assert!(ok, "{out}");
//! cp.kill_apiserver(0);
//! assert!(!cp.readyz(0, std::time::Duration::from_secs(1)));
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! On node `i` (namespace `<prefix>-n<i>`, data address `10.<k>.0.<10+i>`):
//!
//! - **etcd** member `n<i>`: clients on `http://<data ip>:2379` and
//!   `http://127.0.0.1:2379`, peers on `http://<data ip>:2380`; one cluster of all
//!   members (`--initial-cluster-state new`, a token unique to the topology). Peer and
//!   client traffic is **plain HTTP** on the data network: acceptable for a throw-away
//!   test lab, never for a real cluster.
//! - **kube-apiserver** on `0.0.0.0:6443` inside the namespace, so that it also serves on
//!   any address added to the namespace later (the VIP); `--advertise-address` is the node's
//!   data address and `--etcd-servers` lists the node's own etcd first, then the others.
//!   Every member shares one serving certificate, signed by the cluster CA, valid for every
//!   member's data address, `127.0.0.1`, `10.96.0.1`, the caller's extra addresses (the
//!   VIPs), `localhost`, `kubernetes`, `kubernetes.default` and `kubernetes.default.svc`;
//!   and one service-account key pair, so that a token issued by one member is valid on
//!   all. Anonymous requests stay allowed, so that `GET /readyz` answers without a client
//!   certificate (the default `system:public-info-viewer` binding). Each runs in a UTS
//!   namespace of its own with the node's namespace name as host name: the API server
//!   derives its identity Lease from the host name, and members on one machine would
//!   otherwise share (and fight over) one Lease.
//!   `--shutdown-delay-duration=0s` and `--shutdown-watch-termination-grace-period=0s`
//!   make a stop quick.
//!
//! Certificates, data, kubeconfigs and logs live in a temporary directory that is removed,
//! with every process, when the `CpCluster` is dropped — also when a test panics. Start it
//! from a thread that lives as long as you need it: the processes are tied to the starting
//! thread (`--pdeathsig`, see [`crate::host::process`]), and so are those that
//! [`CpCluster::start_apiserver`] and [`CpCluster::start_etcd`] start again.
//!
//! Nodes are named by their index in the topology (`i` in [`CpCluster::apiserver_addr`]
//! and the rest), not by their position in the list given to [`CpCluster::start`].

use crate::harness::certs::{self, Ca, CertError, Pem};
use crate::harness::testbin::{NotFound, TestBin};
use crate::host::netns::{self, Link, NetnsError, Topology, spawn_in};
use crate::host::process::{ManagedProcess, tail};
use nix::sys::signal::Signal;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The API server's port on every member.
pub const APISERVER_PORT: u16 = 6443;
/// etcd's client port on every member.
pub const ETCD_CLIENT_PORT: u16 = 2379;
/// etcd's peer port on every member.
pub const ETCD_PEER_PORT: u16 = 2380;
/// How long [`CpCluster::start`], [`CpCluster::start_apiserver`] and
/// [`CpCluster::start_etcd`] wait for readiness.
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Errors of the control-plane cluster.
#[derive(Debug, thiserror::Error)]
pub enum CpClusterError {
    /// Test binaries missing.
    #[error(transparent)]
    NotFound(#[from] NotFound),
    /// Certificates could not be made.
    #[error(transparent)]
    Cert(#[from] CertError),
    /// A process could not be started in its namespace.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The nodes asked for are not usable.
    #[error("invalid control-plane nodes: {0}")]
    Invalid(String),
    /// A file or directory could not be written.
    #[error("failed to {op}: {source}")]
    Io {
        /// What was attempted.
        op: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A process did not become ready in time.
    #[error("{what} on n{node} did not become ready within {timeout:?}; last log lines:\n{log}")]
    NotReady {
        /// etcd or kube-apiserver.
        what: &'static str,
        /// The node (topology index).
        node: usize,
        /// How long we waited.
        timeout: Duration,
        /// Its log tail.
        log: String,
    },
    /// A process exited while we waited for it.
    #[error("{what} on n{node} exited during start-up; last log lines:\n{log}")]
    Exited {
        /// etcd or kube-apiserver.
        what: &'static str,
        /// The node (topology index).
        node: usize,
        /// Its log tail.
        log: String,
    },
}

/// One control-plane node: its etcd member and API server.
struct Member {
    /// Index in the topology.
    node: usize,
    ns: String,
    ip: IpAddr,
    etcd: Option<ManagedProcess>,
    apiserver: Option<ManagedProcess>,
    etcd_args: Vec<String>,
    /// The whole command line after `ip netns exec <ns>`: `unshare … kube-apiserver …`.
    apiserver_cmd: (PathBuf, Vec<String>),
}

/// etcd and kube-apiserver on one or more nodes of a topology; see the module docs.
pub struct CpCluster {
    members: Vec<Member>,
    testbin: TestBin,
    ca: Ca,
    /// The CA certificate in DER, for the `/readyz` client.
    ca_der: Vec<u8>,
    ca_file: PathBuf,
    admin: Pem,
    client_ns: String,
    dir: tempfile::TempDir,
}

impl CpCluster {
    /// Starts an etcd member and a kube-apiserver on each of the topology's nodes `nodes`
    /// (usually `[0, 1, 2]`, or one node), with `extra_sans` (the VIPs) added to the
    /// serving certificate, and waits until every etcd member is healthy and every API
    /// server is ready (up to [`READY_TIMEOUT`]).
    pub fn start(topo: &Topology, nodes: &[usize], extra_sans: &[IpAddr]) -> Result<CpCluster, CpClusterError> {
        if nodes.is_empty() {
            return Err(CpClusterError::Invalid("no nodes".to_owned()));
        }
        for (j, &n) in nodes.iter().enumerate() {
            if n >= topo.nodes().len() {
                return Err(CpClusterError::Invalid(format!("the topology has no node {n}")));
            }
            if nodes[..j].contains(&n) {
                return Err(CpClusterError::Invalid(format!("node {n} given twice")));
            }
        }
        let testbin = TestBin::find()?;
        let dir = tempfile::Builder::new()
            .prefix("havip-cpcluster-")
            .tempdir()
            .map_err(|source| CpClusterError::Io { op: "create a temporary directory".to_owned(), source })?;
        let root = dir.path().to_owned();

        // Certificates and keys, shared by every member.
        let ips: Vec<IpAddr> = nodes.iter().map(|&n| IpAddr::V4(topo.node(n).ip(Link::Data))).collect();
        let ca = Ca::new()?;
        let mut sans = ips.clone();
        sans.push(IpAddr::V4(Ipv4Addr::LOCALHOST));
        sans.push(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1)));
        sans.extend(extra_sans.iter().copied().filter(|ip| !ips.contains(ip)));
        let serving = ca.serving(&sans)?;
        let admin = ca.client("havip-admin", Some("system:masters"))?;
        let (sa_key, sa_pub) = certs::service_account_key()?;
        let pki = root.join("pki");
        mkdir(&pki)?;
        write(&pki.join("ca.crt"), &ca.cert_pem)?;
        write(&pki.join("apiserver.crt"), &serving.cert)?;
        write(&pki.join("apiserver.key"), &serving.key)?;
        write(&pki.join("sa.key"), &sa_key)?;
        write(&pki.join("sa.pub"), &sa_pub)?;
        let ca_der = pem_to_der(&ca.cert_pem)
            .ok_or_else(|| CpClusterError::Invalid("the CA certificate is not valid PEM".to_owned()))?;

        let initial_cluster = nodes
            .iter()
            .zip(&ips)
            .map(|(n, ip)| format!("n{n}=http://{ip}:{ETCD_PEER_PORT}"))
            .collect::<Vec<_>>()
            .join(",");
        let unshare = ["/usr/bin/unshare", "/bin/unshare"].into_iter().map(PathBuf::from).find(|p| p.exists());
        let mut members = Vec::with_capacity(nodes.len());
        for (&n, &ip) in nodes.iter().zip(&ips) {
            let node = topo.node(n);
            let etcd_args = vec![
                format!("--name=n{n}"),
                format!("--data-dir={}", root.join(format!("etcd-n{n}")).display()),
                format!("--listen-client-urls=http://{ip}:{ETCD_CLIENT_PORT},http://127.0.0.1:{ETCD_CLIENT_PORT}"),
                format!("--advertise-client-urls=http://{ip}:{ETCD_CLIENT_PORT}"),
                format!("--listen-peer-urls=http://{ip}:{ETCD_PEER_PORT}"),
                format!("--initial-advertise-peer-urls=http://{ip}:{ETCD_PEER_PORT}"),
                format!("--initial-cluster={initial_cluster}"),
                // Ignored when the data directory exists (a restart after kill_etcd).
                "--initial-cluster-state=new".to_owned(),
                format!("--initial-cluster-token={}", topo.prefix()),
                "--unsafe-no-fsync".to_owned(),
                "--log-level=warn".to_owned(),
            ];
            // The own member first; the others after it.
            let etcd_servers = std::iter::once(ip)
                .chain(ips.iter().copied().filter(|&o| o != ip))
                .map(|o| format!("http://{o}:{ETCD_CLIENT_PORT}"))
                .collect::<Vec<_>>()
                .join(",");
            let apiserver_args = vec![
                format!("--etcd-servers={etcd_servers}"),
                "--bind-address=0.0.0.0".to_owned(),
                format!("--advertise-address={ip}"),
                format!("--secure-port={APISERVER_PORT}"),
                format!("--tls-cert-file={}", pki.join("apiserver.crt").display()),
                format!("--tls-private-key-file={}", pki.join("apiserver.key").display()),
                format!("--client-ca-file={}", pki.join("ca.crt").display()),
                format!("--service-account-key-file={}", pki.join("sa.pub").display()),
                format!("--service-account-signing-key-file={}", pki.join("sa.key").display()),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
                "--api-audiences=https://kubernetes.default.svc.cluster.local".to_owned(),
                "--authorization-mode=RBAC".to_owned(),
                // The default, stated: /readyz must answer without a client certificate.
                "--anonymous-auth=true".to_owned(),
                "--service-cluster-ip-range=10.96.0.0/12".to_owned(),
                "--allow-privileged=true".to_owned(),
                // Nothing routes to the members from pods here; do not maintain the
                // kubernetes Service endpoints.
                "--endpoint-reconciler-type=none".to_owned(),
                "--shutdown-delay-duration=0s".to_owned(),
                "--shutdown-watch-termination-grace-period=0s".to_owned(),
                format!("--cert-dir={}", root.join(format!("apiserver-certs-n{n}")).display()),
                "--profiling=false".to_owned(),
                "--v=1".to_owned(),
            ];
            let apiserver_cmd = match &unshare {
                // A UTS namespace of its own with the node's host name; each step execs
                // the next, so the pid we hold is kube-apiserver's.
                Some(unshare) => {
                    let mut args = vec![
                        "--uts".to_owned(),
                        "--".to_owned(),
                        "/bin/sh".to_owned(),
                        "-c".to_owned(),
                        r#"echo "$0" > /proc/sys/kernel/hostname && exec "$@""#.to_owned(),
                        node.ns.clone(),
                        testbin.kube_apiserver().display().to_string(),
                    ];
                    args.extend(apiserver_args);
                    (unshare.clone(), args)
                }
                None => (testbin.kube_apiserver(), apiserver_args),
            };
            members.push(Member {
                node: n,
                ns: node.ns.clone(),
                ip,
                etcd: None,
                apiserver: None,
                etcd_args,
                apiserver_cmd,
            });
        }
        let mut cp = CpCluster {
            members,
            testbin,
            ca,
            ca_der,
            ca_file: pki.join("ca.crt"),
            admin,
            client_ns: topo.client().ns.clone(),
            dir,
        };
        // etcd first: a member of a new cluster is healthy only once a quorum runs.
        let deadline = Instant::now() + READY_TIMEOUT;
        for j in 0..cp.members.len() {
            cp.spawn_etcd(j)?;
        }
        for j in 0..cp.members.len() {
            cp.await_etcd(j, deadline)?;
        }
        // Then every API server at once.
        for j in 0..cp.members.len() {
            cp.spawn_apiserver(j)?;
        }
        for j in 0..cp.members.len() {
            cp.await_apiserver(j, deadline)?;
        }
        tracing::info!(nodes = ?nodes, "control-plane cluster ready");
        Ok(cp)
    }

    /// Starts etcd and kube-apiserver on every node of an agent lab whose members gate on
    /// their API server ([`crate::agent::PairOptions::api_server`]), with the lab's first VIP
    /// in the serving certificate, and puts the cluster CA where the agents read it
    /// ([`crate::agent::AgentLab::api_ca_file`]).
    pub fn for_agent_lab(lab: &crate::agent::AgentLab) -> Result<CpCluster, CpClusterError> {
        let nodes: Vec<usize> = (0..lab.topo.nodes().len()).collect();
        let cp = CpCluster::start(&lab.topo, &nodes, &[IpAddr::V4(lab.vip_addr(0))])?;
        let ca = lab.api_ca_file();
        let io = |op: String| move |source| CpClusterError::Io { op, source };
        if let Some(dir) = ca.parent() {
            std::fs::create_dir_all(dir).map_err(io(format!("create {}", dir.display())))?;
        }
        std::fs::copy(cp.ca_file(), &ca).map_err(io(format!("copy the cluster CA to {}", ca.display())))?;
        Ok(cp)
    }

    /// The directory that holds the certificates, data, kubeconfigs and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The cluster CA's certificate (PEM file).
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// The cluster CA's certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca.cert_pem
    }

    /// The test binaries in use.
    pub fn testbin(&self) -> &TestBin {
        &self.testbin
    }

    /// The topology indexes of the control-plane nodes, in the order given to
    /// [`CpCluster::start`].
    pub fn nodes(&self) -> Vec<usize> {
        self.members.iter().map(|m| m.node).collect()
    }

    /// Node `i`'s API server address, `<data ip>:6443`. Panics if `i` is not a
    /// control-plane node.
    pub fn apiserver_addr(&self, i: usize) -> SocketAddr {
        SocketAddr::new(self.member(i).ip, APISERVER_PORT)
    }

    /// Node `i`'s etcd client URL, `http://<data ip>:2379`. Panics if `i` is not a
    /// control-plane node.
    pub fn etcd_url(&self, i: usize) -> String {
        format!("http://{}:{ETCD_CLIENT_PORT}", self.member(i).ip)
    }

    /// Whether node `i`'s API server answers `GET /readyz` with `ok` within `timeout`,
    /// asked from the **client** namespace over the data network (a fresh TCP and TLS
    /// connection, the server verified against the cluster CA, no client certificate).
    pub fn readyz(&self, i: usize, timeout: Duration) -> bool {
        self.readyz_at(&self.client_ns, self.apiserver_addr(i), timeout)
    }

    /// Whether the API server at `server` (a member's address or a VIP) answers
    /// `GET /readyz` with `ok` within `timeout`, asked from namespace `ns` as
    /// [`CpCluster::readyz`] does.
    pub fn readyz_at(&self, ns: &str, server: SocketAddr, timeout: Duration) -> bool {
        let ca = self.ca_der.clone();
        netns::in_netns(ns, move || readyz_probe(server, ca, timeout)).unwrap_or(false)
    }

    /// Asks `GET /readyz` at `server` from namespace `ns` every `every` (each on a fresh
    /// connection, `timeout` each, without waiting for the ones before) until the returned
    /// watch is stopped.
    pub fn watch_readyz(
        &self,
        ns: &str,
        server: SocketAddr,
        every: Duration,
        timeout: Duration,
    ) -> Result<ReadyzWatch, CpClusterError> {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ca = self.ca_der.clone();
        let flag = stop.clone();
        let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = samples.clone();
        let thread = netns::run_in_netns(ns, move || {
            let _quiet = tracing::subscriber::set_default(tracing::subscriber::NoSubscriber::default());
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                return;
            };
            // A request every `every` whether or not the ones before were answered: one
            // stuck on a dead or frozen server does not hide when the VIP answers again.
            rt.block_on(async move {
                let mut tick = tokio::time::interval(every);
                let mut inflight = tokio::task::JoinSet::new();
                while !flag.load(std::sync::atomic::Ordering::SeqCst) {
                    tick.tick().await;
                    let (ca, seen) = (ca.clone(), seen.clone());
                    inflight.spawn(async move {
                        let at = Instant::now();
                        let ok = readyz_request(server, ca, timeout).await;
                        if let Ok(mut s) = seen.lock() {
                            s.push(ReadyzSample { at, ok });
                        }
                    });
                    while inflight.try_join_next().is_some() {}
                }
                while inflight.join_next().await.is_some() {}
            });
        })?;
        Ok(ReadyzWatch { stop, samples, thread: Some(thread) })
    }

    /// Waits until node `i`'s API server is ready ([`CpCluster::readyz`]); returns how
    /// long that took. Fails early when the process has exited.
    pub fn wait_ready(&mut self, i: usize, timeout: Duration) -> Result<Duration, CpClusterError> {
        let start = Instant::now();
        let j = self.index(i);
        self.await_apiserver(j, start + timeout)?;
        Ok(start.elapsed())
    }

    /// Whether node `i`'s API server process runs (stopped with SIGSTOP counts as
    /// running).
    pub fn apiserver_running(&mut self, i: usize) -> bool {
        let j = self.index(i);
        self.members[j].apiserver.as_mut().is_some_and(ManagedProcess::is_running)
    }

    /// Kills node `i`'s API server at once (SIGKILL) and reaps it.
    pub fn kill_apiserver(&mut self, i: usize) {
        let j = self.index(i);
        if let Some(mut p) = self.members[j].apiserver.take() {
            p.kill_now();
            tracing::info!(node = i, "kube-apiserver killed");
        }
    }

    /// Starts node `i`'s API server again (same flags, certificates and port) and waits
    /// until it is ready (up to [`READY_TIMEOUT`]). A no-op while it runs.
    pub fn start_apiserver(&mut self, i: usize) -> Result<(), CpClusterError> {
        if self.apiserver_running(i) {
            return Ok(());
        }
        let j = self.index(i);
        self.spawn_apiserver(j)?;
        self.await_apiserver(j, Instant::now() + READY_TIMEOUT)
    }

    /// Freezes node `i`'s API server (SIGSTOP): it keeps its sockets, so connections are
    /// accepted by the kernel but never answered.
    pub fn stop_apiserver(&self, i: usize) {
        self.signal_apiserver(i, Signal::SIGSTOP);
    }

    /// Resumes node `i`'s API server after [`CpCluster::stop_apiserver`] (SIGCONT).
    pub fn cont_apiserver(&self, i: usize) {
        self.signal_apiserver(i, Signal::SIGCONT);
    }

    /// Kills node `i`'s etcd member at once (SIGKILL) and reaps it; its data stays.
    pub fn kill_etcd(&mut self, i: usize) {
        let j = self.index(i);
        if let Some(mut p) = self.members[j].etcd.take() {
            p.kill_now();
            tracing::info!(node = i, "etcd killed");
        }
    }

    /// Starts node `i`'s etcd member again from its data directory and waits until it is
    /// healthy (up to [`READY_TIMEOUT`]; that needs a quorum). A no-op while it runs.
    pub fn start_etcd(&mut self, i: usize) -> Result<(), CpClusterError> {
        let j = self.index(i);
        if self.members[j].etcd.as_mut().is_some_and(ManagedProcess::is_running) {
            return Ok(());
        }
        self.spawn_etcd(j)?;
        self.await_etcd(j, Instant::now() + READY_TIMEOUT)
    }

    /// Writes an admin kubeconfig (user `havip-admin` in `system:masters`, a client
    /// certificate signed by the cluster CA) for the API server at `server` — a member's
    /// address or a VIP in the serving certificate — and returns its path.
    pub fn kubeconfig_for(&self, server: SocketAddr) -> Result<PathBuf, CpClusterError> {
        let name = server.to_string().replace([':', '[', ']'], "_");
        let path = self.dir().join(format!("kubeconfig-{name}"));
        write(&path, &self.admin_kubeconfig(server))?;
        Ok(path)
    }

    /// Runs the test kubectl with `args` inside namespace `ns` against `server` as admin
    /// (see [`CpCluster::kubeconfig_for`]), with `--request-timeout=10s` unless `args`
    /// say otherwise. Returns whether it succeeded, and its standard output — followed
    /// by its standard error when it failed.
    pub fn kubectl(&self, ns: &str, server: SocketAddr, args: &[&str]) -> (bool, String) {
        let kubeconfig = match self.kubeconfig_for(server) {
            Ok(p) => p,
            Err(e) => return (false, e.to_string()),
        };
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns])
            .arg(self.testbin.kubectl())
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--request-timeout=10s")
            .args(args);
        // No proxy of the root namespace's environment is reachable from a namespace.
        for var in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"] {
            cmd.env_remove(var);
        }
        match cmd.output() {
            Ok(out) => {
                let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
                if !out.status.success() {
                    text.push_str(&String::from_utf8_lossy(&out.stderr));
                }
                (out.status.success(), text)
            }
            Err(e) => (false, format!("failed to run kubectl in {ns}: {e}")),
        }
    }

    /// The last lines of every member's etcd and API server logs, and which processes
    /// run (for failure reports).
    pub fn diagnostics(&self) -> String {
        let mut out = String::new();
        for m in &self.members {
            let state = |p: &Option<ManagedProcess>| match p.as_ref().and_then(ManagedProcess::pid) {
                Some(pid) => format!("pid {pid}"),
                None => "not running".to_owned(),
            };
            out.push_str(&format!(
                "--- n{} etcd ({}) ---\n{}\n--- n{} kube-apiserver ({}) ---\n{}\n",
                m.node,
                state(&m.etcd),
                tail(&self.etcd_log(m.node), 15),
                m.node,
                state(&m.apiserver),
                tail(&self.apiserver_log(m.node), 25),
            ));
        }
        out
    }

    /// Node `i`'s etcd log.
    pub fn etcd_log(&self, i: usize) -> PathBuf {
        self.dir().join(format!("etcd-n{i}.log"))
    }

    /// Node `i`'s API server log (appended to across restarts).
    pub fn apiserver_log(&self, i: usize) -> PathBuf {
        self.dir().join(format!("kube-apiserver-n{i}.log"))
    }

    fn index(&self, i: usize) -> usize {
        match self.members.iter().position(|m| m.node == i) {
            Some(j) => j,
            None => panic!("n{i} is not a control-plane node (they are {:?})", self.nodes()),
        }
    }

    fn member(&self, i: usize) -> &Member {
        &self.members[self.index(i)]
    }

    fn signal_apiserver(&self, i: usize, signal: Signal) {
        if let Some(p) = &self.member(i).apiserver
            && let Err(e) = p.signal(signal)
        {
            tracing::warn!(node = i, %signal, error = %e, "cannot signal kube-apiserver");
        }
    }

    fn spawn_etcd(&mut self, j: usize) -> Result<(), CpClusterError> {
        let log = self.etcd_log(self.members[j].node);
        let m = &self.members[j];
        let p = spawn_in(&m.ns, &format!("etcd-n{}", m.node), &self.testbin.etcd(), &m.etcd_args, &[], &log)?;
        self.members[j].etcd = Some(p);
        Ok(())
    }

    fn spawn_apiserver(&mut self, j: usize) -> Result<(), CpClusterError> {
        let log = self.apiserver_log(self.members[j].node);
        let m = &self.members[j];
        let (program, args) = &m.apiserver_cmd;
        let p = spawn_in(&m.ns, &format!("kube-apiserver-n{}", m.node), program, args, &[], &log)?;
        self.members[j].apiserver = Some(p);
        Ok(())
    }

    /// Polls member `j`'s etcd `/health` (from its own namespace) until it answers 200.
    fn await_etcd(&mut self, j: usize, deadline: Instant) -> Result<(), CpClusterError> {
        let started = Instant::now();
        let (node, ns) = (self.members[j].node, self.members[j].ns.clone());
        let addr = SocketAddr::new(self.members[j].ip, ETCD_CLIENT_PORT);
        let log_path = self.etcd_log(node);
        loop {
            let log = || tail(&log_path, 30);
            if !self.members[j].etcd.as_mut().is_some_and(ManagedProcess::is_running) {
                return Err(CpClusterError::Exited { what: "etcd", node, log: log() });
            }
            if netns::in_netns(&ns, move || http_get_ok(addr, "/health")).unwrap_or(false) {
                tracing::debug!(node, took = ?started.elapsed(), "etcd healthy");
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(CpClusterError::NotReady { what: "etcd", node, timeout: started.elapsed(), log: log() });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Polls member `j`'s `/readyz` (from the client namespace) until it answers `ok`.
    fn await_apiserver(&mut self, j: usize, deadline: Instant) -> Result<(), CpClusterError> {
        let started = Instant::now();
        let node = self.members[j].node;
        let log_path = self.apiserver_log(node);
        loop {
            let log = || tail(&log_path, 30);
            if !self.members[j].apiserver.as_mut().is_some_and(ManagedProcess::is_running) {
                return Err(CpClusterError::Exited { what: "kube-apiserver", node, log: log() });
            }
            if self.readyz(node, Duration::from_secs(2)) {
                tracing::debug!(node, took = ?started.elapsed(), "kube-apiserver ready");
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(CpClusterError::NotReady {
                    what: "kube-apiserver",
                    node,
                    timeout: started.elapsed(),
                    log: log(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The admin kubeconfig for `server`.
    fn admin_kubeconfig(&self, server: SocketAddr) -> String {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
        format!(
            "apiVersion: v1
kind: Config
clusters:
- name: havip-cp
  cluster:
    server: https://{server}
    certificate-authority-data: {ca}
users:
- name: havip-admin
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: havip-cp
  context:
    cluster: havip-cp
    user: havip-admin
current-context: havip-cp
",
            ca = b64(&self.ca.cert_pem),
            cert = b64(&self.admin.cert),
            key = b64(&self.admin.key),
        )
    }
}

impl Drop for CpCluster {
    fn drop(&mut self) {
        // The data is thrown away: no graceful stop. API servers first, so that they do
        // not log a burst of etcd errors.
        for m in &mut self.members {
            if let Some(mut p) = m.apiserver.take() {
                p.kill_now();
            }
        }
        for m in &mut self.members {
            if let Some(mut p) = m.etcd.take() {
                p.kill_now();
            }
        }
        // The directory goes with `dir`.
    }
}

/// One `GET /readyz` to `server` with a fresh client (so a fresh connection), in the
/// calling thread's network namespace.
fn readyz_probe(server: SocketAddr, ca_der: Vec<u8>, timeout: Duration) -> bool {
    // kube's client logs every failed request at ERROR; an unready server is an answer
    // here, not an error. This thread is the probe's own.
    let _quiet = tracing::subscriber::set_default(tracing::subscriber::NoSubscriber::default());
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        return false;
    };
    rt.block_on(readyz_request(server, ca_der, timeout))
}

/// One `GET /readyz` on a fresh connection (a new client: no connection is reused).
async fn readyz_request(server: SocketAddr, ca_der: Vec<u8>, timeout: Duration) -> bool {
    let Ok(url) = format!("https://{server}").parse::<http::Uri>() else {
        return false;
    };
    let mut config = kube::Config::new(url);
    config.root_cert = Some(vec![ca_der]);
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    // An unready server answers 500 (or 503 while shutting down): report it, do not retry.
    config.default_retry = false;
    let Ok(client) = kube::Client::try_from(config) else {
        return false;
    };
    let Ok(request) = http::Request::get("/readyz").body(Vec::new()) else {
        return false;
    };
    matches!(
        tokio::time::timeout(timeout, client.request_text(request)).await,
        Ok(Ok(body)) if body.trim() == "ok"
    )
}

/// A client that asks `/readyz` through one address (usually the VIP) again and again,
/// each time on a fresh connection, from its own thread in a namespace
/// ([`CpCluster::watch_readyz`]): what a client of the control plane sees.
pub struct ReadyzWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    samples: std::sync::Arc<std::sync::Mutex<Vec<ReadyzSample>>>,
    thread: Option<netns::NetnsThread<()>>,
}

/// One answer (or its absence) seen by a [`ReadyzWatch`].
#[derive(Clone, Copy, Debug)]
pub struct ReadyzSample {
    /// When the request was sent.
    pub at: Instant,
    /// Whether it was answered `ok`.
    pub ok: bool,
}

/// What a [`ReadyzWatch`] saw.
#[derive(Clone, Debug, Default)]
pub struct ReadyzReport {
    /// Every request answered or timed out, in the order they were sent.
    pub samples: Vec<ReadyzSample>,
}

impl ReadyzReport {
    /// Requests not answered `ok`.
    pub fn failures(&self) -> usize {
        self.samples.iter().filter(|s| !s.ok).count()
    }

    /// The longest time without an `ok` answer: from the last request answered before a
    /// run of failures to the first answered after it (zero without failures).
    pub fn longest_gap(&self) -> Duration {
        let mut longest = Duration::ZERO;
        let mut last_ok: Option<Instant> = None;
        let mut failed = false;
        for s in &self.samples {
            if s.ok {
                if failed && let Some(t) = last_ok {
                    longest = longest.max(s.at.duration_since(t));
                }
                last_ok = Some(s.at);
                failed = false;
            } else {
                failed = true;
            }
        }
        longest
    }

    /// The first `ok` answer to a request sent at or after `t`.
    pub fn first_ok_after(&self, t: Instant) -> Option<Instant> {
        self.samples.iter().find(|s| s.ok && s.at >= t).map(|s| s.at)
    }

    /// Every request as `+<ms since t> ok|failed`, for failure reports.
    pub fn timeline(&self, t: Instant) -> String {
        self.samples
            .iter()
            .map(|s| {
                let ms = if s.at >= t {
                    format!("+{}", s.at.duration_since(t).as_millis())
                } else {
                    format!("-{}", t.duration_since(s.at).as_millis())
                };
                format!("{ms}ms {}", if s.ok { "ok" } else { "failed" })
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// One line for logs.
    pub fn summary(&self) -> String {
        format!("{} requests, {} failed, longest gap {:?}", self.samples.len(), self.failures(), self.longest_gap())
    }
}

impl ReadyzWatch {
    /// What was seen so far.
    pub fn report(&self) -> ReadyzReport {
        let mut samples = self.samples.lock().map(|s| s.clone()).unwrap_or_default();
        samples.sort_by_key(|s| s.at);
        ReadyzReport { samples }
    }

    /// Waits (up to `timeout`) until a request sent at or after `t` was answered `ok`;
    /// returns when it was sent.
    pub fn wait_ok_after(&self, t: Instant, timeout: Duration) -> Option<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(at) = self.report().first_ok_after(t) {
                return Some(at);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops asking and returns what was seen (a request in flight is waited for).
    pub fn stop(mut self) -> ReadyzReport {
        self.finish()
    }

    fn finish(&mut self) -> ReadyzReport {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.report()
    }
}

impl Drop for ReadyzWatch {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// The DER bytes of the first certificate in `pem`.
fn pem_to_der(pem: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    let body: String = pem
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN CERTIFICATE-----"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    base64::engine::general_purpose::STANDARD.decode(body.trim()).ok()
}

fn mkdir(p: &Path) -> Result<(), CpClusterError> {
    std::fs::create_dir_all(p).map_err(|source| CpClusterError::Io { op: format!("create {}", p.display()), source })
}

fn write(p: &Path, content: &str) -> Result<(), CpClusterError> {
    std::fs::write(p, content).map_err(|source| CpClusterError::Io { op: format!("write {}", p.display()), source })
}

/// Whether `GET path` over plain HTTP answers 200 (in the calling thread's namespace).
fn http_get_ok(addr: SocketAddr, path: &str) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).is_err() {
        return false;
    }
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    buf.starts_with("HTTP/1.0 200") || buf.starts_with("HTTP/1.1 200")
}
