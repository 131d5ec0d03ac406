//! havip agents in standalone mode on a network-namespace topology: one agent and
//! one TCP listener (that names its node) per member namespace, a client that
//! connects to the VIP, and helpers to observe and disturb them.
//!
//! Shared by the agent scenario tests and the failover benchmark.

use crate::harness::metrics::{metric_sum, metrics_in};
use crate::host::netns::{self, Link, Topology};
use crate::host::process::ManagedProcess;
use crate::traffic::Listener;
use nix::sys::signal::Signal;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The TCP port every member's listener serves (and the VIP's probe port).
pub const SERVICE_PORT: u16 = 8080;
/// The heartbeat port.
pub const HEARTBEAT_PORT: u16 = 7946;
/// The API servers' port in a control-plane lab ([`PairOptions::api_server`]).
pub const API_PORT: u16 = 6443;
/// The heartbeat key of every lab pair (hex).
pub const KEY_HEX: &str = "6861766970206c6162206b65792030316861766970206c6162206b6579203031";

/// The witness's UDP port in the lab.
pub const WITNESS_PORT: u16 = 7947;
/// The witness's metrics port (in the client's namespace).
pub const WITNESS_METRICS_PORT: u16 = 9798;
/// The witness key of the lab (hex).
pub const WITNESS_KEY_HEX: &str = "7769746e657373206b65792030317769746e657373206b6579203031";

/// The witness key of `member` of `pair` (hex), derived from [`WITNESS_KEY_HEX`] as
/// `havip-agent witness-key` does.
pub fn witness_member_key_hex(pair: &str, member: &str) -> String {
    let secret = havip_node_agent::config::parse_hex_key(WITNESS_KEY_HEX).unwrap_or_default();
    let key = havip_crds::witness::member_key(&havip_crds::wire::Key { id: 1, secret }, pair, member);
    key.secret.iter().map(|b| format!("{b:02x}")).collect()
}

/// Errors of the agent lab.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// Topology or namespace operation failed.
    #[error(transparent)]
    Netns(#[from] netns::NetnsError),
    /// A listener or prober failed.
    #[error(transparent)]
    Traffic(#[from] crate::traffic::TrafficError),
    /// A file could not be written.
    #[error("failed to write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The agent binary is missing.
    #[error("havip-agent not found at {0}: run `cargo build -p havip-node-agent --bin havip-agent` (make test does)")]
    NoBinary(PathBuf),
    /// The agent binary is older than its sources.
    #[error(
        "{0} is older than node-agent/src: run `cargo build -p havip-node-agent --bin havip-agent` (make test does)"
    )]
    StaleBinary(PathBuf),
    /// A routing daemon of the BGP lab failed.
    #[error(transparent)]
    Routing(#[from] crate::host::routing::RoutingError),
    /// A condition was not reached in time.
    #[error("timed out after {timeout:?} waiting for {what}")]
    Timeout {
        /// What.
        what: String,
        /// How long.
        timeout: Duration,
    },
}

type Result<T, E = LabError> = std::result::Result<T, E>;

/// The havip-agent binary next to the test binary (`target/<profile>/havip-agent`),
/// or `$HAVIP_AGENT_BIN`.
pub fn agent_binary() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("HAVIP_AGENT_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().unwrap_or_default();
    // target/<profile>/deps/<test> or target/<profile>/<bin>
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let p = dir.join("havip-agent");
    if !p.is_file() {
        return Err(LabError::NoBinary(p));
    }
    // A binary older than the agent's sources would test yesterday's code.
    let built = std::fs::metadata(&p).and_then(|m| m.modified()).ok();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../node-agent/src");
    if let (Some(built), Some(newest)) = (built, newest_mtime(&src))
        && newest > built
    {
        return Err(LabError::StaleBinary(p));
    }
    Ok(p)
}

fn newest_mtime(dir: &Path) -> Option<std::time::SystemTime> {
    let mut newest = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        let t = if path.is_dir() { newest_mtime(&path) } else { entry.metadata().and_then(|m| m.modified()).ok() };
        if t > newest {
            newest = t;
        }
    }
    newest
}

/// How the pair is configured.
#[derive(Clone, Debug)]
pub struct PairOptions {
    /// Number of members (2..=5).
    pub members: usize,
    /// Extra YAML appended under `takeover:` etc. is not needed for most tests; this
    /// replaces the whole `takeover:` section when set (`{gateway6}` in it stands for the
    /// gateway's IPv6 address).
    pub takeover_yaml: Option<String>,
    /// `startAlone:`.
    pub start_alone: bool,
    /// Number of VIPs (IPv4, see [`AgentLab::vip_addr`]; at most 109).
    pub vips: u8,
    /// Also an IPv6 VIP.
    pub ipv6_vip: bool,
    /// `failback:` section.
    pub failback_yaml: Option<String>,
    /// Number of pairs on the same members (1..=5), all served by one agent process per
    /// member on the same heartbeat port: pair `k` is [`pair_name`]`(k)`, with its own key,
    /// VIPs `k * vips ..` ([`AgentLab::vip_addr`]) and service port `SERVICE_PORT + k`.
    pub pairs: usize,
    /// Run a witness (`havip-agent witness`) in the client's namespace and name it in every
    /// pair's file: takeovers need its vote.
    pub witness: bool,
    /// `profile: Fast` (heartbeat 30 ms, timeout 90 ms, fast probes).
    pub fast_profile: bool,
    /// `drainTimeout:` (a duration such as `4s`; `0s` turns the drain off); `None`
    /// leaves the agent's default.
    pub drain_timeout: Option<String>,
    /// The members' listeners echo ([`Listener::echo`]: greet with the node's name, then
    /// answer every line) instead of naming themselves and closing, so that long-lived
    /// connections can be served; probers see the same name either way.
    pub echo_listeners: bool,
    /// IPv4 and IPv6 forwarding on in every member's namespace, as on a Kubernetes node
    /// (see [`netns::set_forwarding`]); off otherwise.
    pub forwarding: bool,
    /// A routed lab: the VIPs are in `BGP` mode (outside every subnet, see
    /// [`Topology::routed_vip`]), the gateway is a router running FRR that peers with
    /// every member's BGP speaker (this one), and the client is in another subnet behind
    /// it ([`AgentLab::client_ns`]). See [`crate::harness::bgp`].
    pub bgp: Option<crate::harness::bgp::Speaker>,
    /// The routed lab's BFD interval (ms, × 3) on the router and the members (`None`:
    /// [`crate::harness::bgp::bfd_interval_ms`]).
    pub bfd_ms: Option<u32>,
    /// `bgpBackupPaths: true`: a ready standby advertises a backup path of each routed VIP.
    pub bgp_backup_paths: bool,
    /// With [`PairOptions::bgp`]: the VIPs in `Both` mode instead — addresses of the data
    /// subnet on `eth0` (as without `bgp`), also advertised by the members' speakers.
    pub announce_both: bool,
    /// `quorum: {lease: …}`: the members vote (the control-plane mode's arbitration; three
    /// or more members); the lease as given (`None`: no quorum).
    pub quorum: Option<String>,
    /// The control-plane mode's readiness gate: an `apiServer:` section (the cluster CA at
    /// [`AgentLab::api_ca_file`], which the test writes once its control plane exists —
    /// the agents start before it, as before `kubeadm init`) with this YAML added under
    /// it (e.g. `"  notReadyFor: 600ms\n"`), and every VIP probed on the API port 6443.
    pub api_server: Option<String>,
    /// `virtualMAC: {id: …}`: the pair's VIPs answer with a virtual MAC (pair `k` gets
    /// id `id + k`); see [`AgentLab::vip_if`].
    pub virtual_mac: Option<u8>,
    /// `announce: {unicastToNeighbours: true}` on the layer-2 VIPs: each announcement also
    /// goes unicast to the neighbours the holder knows in the VIP's subnet.
    pub unicast_announce: bool,
    /// Top-level YAML lines added to every pair file (e.g. `routes:`), with `{vip}` (the
    /// pair's first VIP), `{vip6}` (the IPv6 VIP), `{gateway}` and `{gateway6}` (the
    /// gateway's addresses) and `{k}` (the pair's index) replaced.
    pub pair_yaml: Option<String>,
    /// The members whose agents start with the lab (`None`: all); the others start when
    /// the test says ([`AgentLab::start_agent`]).
    pub started: Option<Vec<usize>>,
    /// The members the pair files list at the start (`None`: every node); a test grows or
    /// shrinks the pair with [`AgentLab::write_members`].
    pub file_members: Option<Vec<usize>>,
}

impl PairOptions {
    /// A control-plane pair: three members that vote (`quorum.lease` 400 ms) and gate on
    /// their own API server with the `apiServer:` defaults (see [`PairOptions::api_server`];
    /// start the control plane with `CpCluster::for_agent_lab`).
    pub fn control_plane() -> Self {
        Self { members: 3, quorum: Some("400ms".to_owned()), api_server: Some(String::new()), ..Self::default() }
    }
}

impl Default for PairOptions {
    fn default() -> Self {
        Self {
            members: 2,
            takeover_yaml: None,
            start_alone: false,
            vips: 1,
            ipv6_vip: false,
            failback_yaml: None,
            pairs: 1,
            witness: false,
            fast_profile: false,
            drain_timeout: None,
            echo_listeners: false,
            forwarding: false,
            bgp: None,
            bfd_ms: None,
            bgp_backup_paths: false,
            announce_both: false,
            quorum: None,
            api_server: None,
            virtual_mac: None,
            unicast_announce: false,
            pair_yaml: None,
            started: None,
            file_members: None,
        }
    }
}

/// The name of lab pair `k`.
pub fn pair_name(k: usize) -> String {
    if k == 0 { "lab".to_owned() } else { format!("lab{k}") }
}

/// The heartbeat key of lab pair `k` (hex): pair 0 has [`KEY_HEX`], the others differ.
pub fn pair_key_hex(k: usize) -> String {
    if k == 0 { KEY_HEX.to_owned() } else { format!("{}{:02x}", &KEY_HEX[..KEY_HEX.len() - 2], k) }
}

/// Pairs of standalone agents on a topology.
pub struct AgentLab {
    /// Agents, one per member (None while stopped); each serves every pair.
    pub agents: Vec<Option<ManagedProcess>>,
    /// Listeners of pair 0, one per member.
    pub listeners: Vec<Listener>,
    /// Listeners of pairs 1.. (`pair_listeners[k - 1][member]`), on `SERVICE_PORT + k`.
    pub pair_listeners: Vec<Vec<Listener>>,
    /// The witness, when [`PairOptions::witness`] (None while stopped).
    pub witness: Option<ManagedProcess>,
    /// The routing daemons of a BGP lab ([`PairOptions::bgp`]).
    pub routing: Option<crate::harness::bgp::Routing>,
    /// The topology (dropped last: namespaces go after the processes).
    pub topo: Topology,
    binary: PathBuf,
    /// `configs[member][pair]`.
    configs: Vec<Vec<PathBuf>>,
    opts: PairOptions,
}

fn node_name(i: usize) -> String {
    format!("n{i}")
}

fn listener(ns: &str, name: &str, bind: SocketAddr, echo: bool) -> Result<Listener> {
    Ok(if echo { Listener::echo(ns, name, bind)? } else { Listener::start(ns, name, bind)? })
}

impl AgentLab {
    /// Builds the topology, writes the pair configuration, starts a listener on every
    /// member and an agent on every member.
    pub fn start(opts: PairOptions) -> Result<Self> {
        let binary = agent_binary()?;
        let topo = Topology::builder().nodes(opts.members).routed_client(opts.bgp.is_some()).build()?;
        for n in topo.nodes() {
            netns::set_forwarding(&n.ns, opts.forwarding)?;
        }
        let routing = match opts.bgp {
            Some(speaker) => Some(crate::harness::bgp::Routing::start_with(
                &topo,
                speaker,
                opts.bfd_ms.unwrap_or_else(crate::harness::bgp::bfd_interval_ms),
            )?),
            None => None,
        };
        let mut listeners = Vec::new();
        for i in 0..opts.members {
            // [::] is dual-stack on Linux: one listener answers the IPv4 and IPv6 VIPs.
            let bind = SocketAddr::new(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), SERVICE_PORT);
            listeners.push(listener(&topo.node(i).ns, &node_name(i), bind, opts.echo_listeners)?);
        }
        let mut pair_listeners = Vec::new();
        for k in 1..opts.pairs {
            let mut per_member = Vec::new();
            for i in 0..opts.members {
                let bind = SocketAddr::new(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), SERVICE_PORT + k as u16);
                per_member.push(listener(&topo.node(i).ns, &node_name(i), bind, opts.echo_listeners)?);
            }
            pair_listeners.push(per_member);
        }
        let mut lab = Self {
            agents: Vec::new(),
            listeners,
            pair_listeners,
            witness: None,
            routing,
            topo,
            binary,
            configs: Vec::new(),
            opts,
        };
        if lab.opts.witness {
            let key = lab.topo.dir().join("witness.key");
            std::fs::write(&key, WITNESS_KEY_HEX).map_err(|source| LabError::Write { path: key.clone(), source })?;
            lab.start_witness()?;
        }
        for i in 0..lab.opts.members {
            let mut files = Vec::new();
            for k in 0..lab.opts.pairs {
                let path = if k == 0 {
                    lab.topo.dir().join(format!("pair-{i}.yaml"))
                } else {
                    lab.topo.dir().join(format!("pair-{i}-{k}.yaml"))
                };
                let yaml = lab.pair_config_yaml(i, k);
                std::fs::write(&path, yaml).map_err(|source| LabError::Write { path: path.clone(), source })?;
                files.push(path);
            }
            lab.configs.push(files);
            lab.agents.push(None);
        }
        for i in 0..lab.opts.members {
            if lab.opts.started.as_ref().is_none_or(|s| s.contains(&i)) {
                lab.start_agent(i)?;
            }
        }
        Ok(lab)
    }

    /// The configuration of pair 0 as member `i` sees it.
    pub fn config_yaml(&self, i: usize) -> String {
        self.pair_config_yaml(i, 0)
    }

    /// Rewrites member `i`'s file of pair 0 listing only `members` (a pair that grows or
    /// shrinks); the agent applies it at SIGHUP ([`AgentLab::signal_agent`]) or when it
    /// sees the file change.
    pub fn write_members(&self, i: usize, members: &[usize]) -> Result<()> {
        let path = self.configs[i][0].clone();
        let yaml = self.pair_config_yaml_members(i, 0, Some(members));
        std::fs::write(&path, yaml).map_err(|source| LabError::Write { path, source })
    }

    /// Rewrites member `i`'s file of pair 0 with `extra` (top-level YAML lines) appended: a
    /// new configuration revision the agent applies at SIGHUP
    /// ([`AgentLab::signal_agent`]) or when it sees the file change.
    pub fn write_config_with(&self, i: usize, extra: &str) -> Result<()> {
        let path = self.configs[i][0].clone();
        let yaml = self.pair_config_yaml(i, 0) + extra;
        std::fs::write(&path, yaml).map_err(|source| LabError::Write { path, source })
    }

    /// `text` with pair `k`'s `{vip}`, `{vip6}`, `{gateway}`, `{gateway6}` and `{k}` (see
    /// [`PairOptions::pair_yaml`]).
    pub fn substitute(&self, text: &str, k: usize) -> String {
        text.replace("{vip}", &self.vip_addr(self.pair_vip(k, 0)).to_string())
            .replace("{vip6}", &self.topo.vip6(0).to_string())
            .replace("{gateway6}", &self.topo.gateway().ip6.to_string())
            .replace("{gateway}", &self.topo.gateway().ip.to_string())
            .replace("{k}", &k.to_string())
    }

    /// Waits until `cond` holds (checked every 20 ms) and returns how long that took;
    /// panics with the lab's diagnostics after `timeout`.
    pub fn wait_for(&self, what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Duration {
        let start = std::time::Instant::now();
        while !cond() {
            assert!(start.elapsed() < timeout, "{what} not within {timeout:?}\n{}", self.diagnostics());
            std::thread::sleep(Duration::from_millis(20));
        }
        start.elapsed()
    }

    /// Member `i`'s agent log (all of it).
    pub fn agent_log(&self, i: usize) -> String {
        std::fs::read_to_string(self.topo.dir().join(format!("agent-{i}.log"))).unwrap_or_default()
    }

    /// The configuration of pair `k` as member `i` sees it.
    pub fn pair_config_yaml(&self, i: usize, k: usize) -> String {
        self.pair_config_yaml_members(i, k, self.opts.file_members.as_deref())
    }

    fn pair_config_yaml_members(&self, i: usize, k: usize, members: Option<&[usize]>) -> String {
        let mut y = String::new();
        y.push_str(&format!("pair: {}\nnode: {}\nmembers:\n", pair_name(k), node_name(i)));
        // With an IPv6 VIP the members also heartbeat over IPv6 on the data link: a drain
        // forwards an IPv6 VIP's connections to the old holder's address in its subnet,
        // which the members know from their paths.
        let v6 = self.opts.ipv6_vip;
        for (j, n) in self.topo.nodes().iter().enumerate() {
            if members.is_some_and(|m| !m.contains(&j)) {
                continue;
            }
            let data6 = if v6 { format!(", data6: \"{}\"", n.data_ip6) } else { String::new() };
            y.push_str(&format!(
                "  - node: {}\n    priority: {}\n    addresses: {{data: {}, mgmt: {}{data6}}}\n",
                node_name(j),
                200 - 10 * j,
                n.ip(Link::Data),
                n.ip(Link::Mgmt)
            ));
        }
        y.push_str(&format!(
            "heartbeat:\n  port: {HEARTBEAT_PORT}\n  paths: [data, mgmt{}]\n  key: {}\n  keyId: 1\n",
            if v6 { ", data6" } else { "" },
            pair_key_hex(k)
        ));
        match &self.opts.takeover_yaml {
            // `{gateway6}`: the gateway's IPv6 address.
            Some(t) => y.push_str(&t.replace("{gateway6}", &self.topo.gateway().ip6.to_string())),
            None => y.push_str("takeover:\n  bootHold: 60s\n"),
        }
        if let Some(f) = &self.opts.failback_yaml {
            y.push_str(f);
        }
        if self.opts.fast_profile {
            y.push_str("profile: Fast\n");
        }
        if let Some(d) = &self.opts.drain_timeout {
            y.push_str(&format!("drainTimeout: {d}\n"));
        }
        if self.opts.bgp_backup_paths {
            y.push_str("bgpBackupPaths: true\n");
        }
        if let Some(id) = self.opts.virtual_mac {
            y.push_str(&format!("virtualMAC: {{id: {}}}\n", usize::from(id) + k));
        }
        if let Some(extra) = &self.opts.pair_yaml {
            y.push_str(&self.substitute(extra, k));
        }
        y.push_str("vips:\n");
        let unicast = if self.opts.unicast_announce { "    announce: {unicastToNeighbours: true}\n" } else { "" };
        for j in 0..self.opts.vips {
            if self.opts.bgp.is_some() && self.opts.announce_both {
                y.push_str(&format!(
                    "  - address: {}/24\n    interface: eth0\n    announce: {{mode: Both}}\n    probePorts: [{}]\n",
                    self.vip_addr(self.pair_vip(k, j)),
                    SERVICE_PORT + k as u16
                ));
                continue;
            }
            if self.opts.bgp.is_some() {
                y.push_str(&format!(
                    "  - address: {}/32\n    announce: {{mode: BGP}}\n    probePorts: [{}]\n",
                    self.vip_addr(self.pair_vip(k, j)),
                    SERVICE_PORT + k as u16
                ));
                continue;
            }
            y.push_str(&format!(
                "  - address: {}/24\n    interface: eth0\n    probePorts: [{}]\n{unicast}",
                self.vip_addr(self.pair_vip(k, j)),
                if self.opts.api_server.is_some() { API_PORT } else { SERVICE_PORT + k as u16 }
            ));
        }
        if self.opts.ipv6_vip && k == 0 && self.opts.bgp.is_some() {
            y.push_str(&format!(
                "  - address: {}/128\n    announce: {{mode: BGP}}\n    probePorts: [{SERVICE_PORT}]\n",
                self.topo.routed_vip6(0)
            ));
        } else if self.opts.ipv6_vip && k == 0 {
            y.push_str(&format!(
                "  - address: {}/64\n    interface: eth0\n    probePorts: [{SERVICE_PORT}]\n{unicast}",
                self.topo.vip6(0)
            ));
        }
        if self.opts.witness {
            y.push_str(&format!(
                "witness:\n  address: {}:{WITNESS_PORT}\n  key: {}\n",
                self.topo.client().ip,
                witness_member_key_hex(&pair_name(k), &node_name(i))
            ));
        }
        if let Some(lease) = &self.opts.quorum {
            y.push_str(&format!("quorum:\n  lease: {lease}\n"));
        }
        if let Some(extra) = &self.opts.api_server {
            y.push_str(&format!("apiServer:\n  port: {API_PORT}\n  caFile: {}\n{extra}", self.api_ca_file().display()));
        }
        y.push_str(&format!(
            "startAlone: {}\nstateDir: {}\nmetricsAddress: 127.0.0.1:9797\nadminSocket: {}\n",
            self.opts.start_alone,
            self.state_dir(i).display(),
            self.pair_admin_socket(i, k).display()
        ));
        y
    }

    /// Where the members' `apiServer:` expects the cluster CA ([`PairOptions::api_server`]).
    pub fn api_ca_file(&self) -> PathBuf {
        self.topo.dir().join("pki").join("ca.crt")
    }

    /// The index (for [`Self::vip_addr`]) of pair `k`'s VIP `j`.
    pub fn pair_vip(&self, k: usize, j: u8) -> u8 {
        (k as u8).saturating_mul(self.opts.vips).saturating_add(j)
    }

    /// Member `i`'s configuration files, one per pair.
    pub fn config_files(&self, i: usize) -> &[PathBuf] {
        &self.configs[i]
    }

    /// Address of VIP `j`: the topology's VIPs for 0..10, then `10.k.0.150…249`.
    pub fn vip_addr(&self, j: u8) -> std::net::Ipv4Addr {
        if self.routed_vips() { self.topo.routed_vip(j) } else { self.topo.vip_at(j) }
    }

    /// The VIPs are routed only (a BGP lab, not `Both` mode): outside every subnet, on the
    /// agent's dummy interface.
    fn routed_vips(&self) -> bool {
        self.opts.bgp.is_some() && !self.opts.announce_both
    }

    /// The interface member `i` holds the VIPs on: `eth0`, or in a BGP lab the agent's
    /// dummy interface.
    pub fn vip_if(&self, i: usize) -> String {
        if self.routed_vips() {
            havip_node_agent::announce::bgp::LINK.to_owned()
        } else if self.opts.virtual_mac.is_some() {
            self.virtual_if(i, 0, false)
        } else {
            self.topo.node(i).data_if.clone()
        }
    }

    /// The virtual MAC interface that carries pair `k`'s VIPs of one family on member
    /// `i`'s data link ([`PairOptions::virtual_mac`]), named as the agent names it; an empty
    /// name without a virtual MAC.
    pub fn virtual_if(&self, i: usize, k: usize, v6: bool) -> String {
        if self.opts.virtual_mac.is_none() {
            return String::new();
        }
        let node = self.topo.node(i);
        let index = netns::link_index(&node.ns, &node.data_if).unwrap_or(0);
        self.virtual_mac(k).link_name(v6, index)
    }

    /// Pair `k`'s virtual MACs ([`PairOptions::virtual_mac`]), as the agent derives them.
    pub fn virtual_mac(&self, k: usize) -> havip_node_agent::config::VirtualMac {
        let id = self.opts.virtual_mac.unwrap_or(0).saturating_add(u8::try_from(k).unwrap_or(u8::MAX));
        havip_node_agent::config::VirtualMac { id, v4: [0, 0, 0x5e, 0, 1, id], v6: [0, 0, 0x5e, 0, 2, id] }
    }

    /// The namespace the client of the VIPs runs in: the client on the data link, or
    /// in a BGP lab the one behind the router.
    pub fn client_ns(&self) -> &str {
        match self.topo.routed_client() {
            Some(rc) if self.opts.bgp.is_some() => &rc.ns,
            _ => &self.topo.client().ns,
        }
    }

    /// Member `i`'s state directory.
    pub fn state_dir(&self, i: usize) -> PathBuf {
        self.topo.dir().join(format!("state-{i}"))
    }

    /// Member `i`'s admin socket (pair 0).
    pub fn admin_socket(&self, i: usize) -> PathBuf {
        self.pair_admin_socket(i, 0)
    }

    /// Member `i`'s admin socket of pair `k`.
    pub fn pair_admin_socket(&self, i: usize, k: usize) -> PathBuf {
        if k == 0 {
            self.topo.dir().join(format!("admin-{i}.sock"))
        } else {
            self.topo.dir().join(format!("admin-{i}-{k}.sock"))
        }
    }

    /// Starts (or restarts) the agent of member `i` (one process for every pair).
    pub fn start_agent(&mut self, i: usize) -> Result<()> {
        self.start_agent_with_env(i, &[])
    }

    /// Starts (or restarts) the agent of member `i` with extra environment variables
    /// (e.g. libfaketime's, to step its wall clock).
    pub fn start_agent_with_env(&mut self, i: usize, extra: &[(String, String)]) -> Result<()> {
        let p = self.spawn_agent(i, &format!("agent-{i}"), &self.configs[i].clone(), extra)?;
        self.agents[i] = Some(p);
        Ok(())
    }

    /// Spawns another agent process in member `i`'s namespace with the given pair
    /// files; its log is `<name>.log` in the lab directory. The lab does not track it.
    pub fn spawn_agent(
        &self,
        i: usize,
        name: &str,
        files: &[PathBuf],
        extra: &[(String, String)],
    ) -> Result<ManagedProcess> {
        let ns = self.topo.node(i).ns.clone();
        let mut args = vec!["standalone".to_owned()];
        for f in files {
            args.push("--config".to_owned());
            args.push(f.display().to_string());
        }
        let mut envs = vec![
            ("RUST_LOG".to_owned(), "info,havip_node_agent=debug".to_owned()),
            ("NO_COLOR".to_owned(), "1".to_owned()),
        ];
        if let Some(r) = &self.routing {
            envs.extend(r.agent_env(i));
        }
        envs.extend(extra.iter().cloned());
        Ok(self.topo.spawn(&ns, name, &self.binary, &args, &envs)?)
    }

    /// Starts (or restarts) the witness in the client's namespace (its records persist in
    /// the lab directory).
    pub fn start_witness(&mut self) -> Result<()> {
        let dir = self.topo.dir();
        let args: Vec<String> = [
            "witness",
            "--listen",
            &format!("{}:{WITNESS_PORT}", self.topo.client().ip),
            "--key-file",
            &dir.join("witness.key").display().to_string(),
            "--state-dir",
            &dir.join("witness-state").display().to_string(),
            "--metrics-address",
            &format!("127.0.0.1:{WITNESS_METRICS_PORT}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let envs = vec![("RUST_LOG".to_owned(), "info".to_owned()), ("NO_COLOR".to_owned(), "1".to_owned())];
        let ns = self.topo.client().ns.clone();
        self.witness = Some(self.topo.spawn(&ns, "witness", &self.binary, &args, &envs)?);
        Ok(())
    }

    /// SIGKILLs the witness.
    pub fn kill_witness(&mut self) {
        if let Some(mut p) = self.witness.take() {
            p.kill_now();
        }
    }

    /// The witness's metrics (text exposition; empty when it does not answer).
    pub fn witness_metrics(&self) -> String {
        metrics_in(&self.topo.client().ns, WITNESS_METRICS_PORT)
    }

    /// SIGKILLs member `i`'s agent (the VIPs stay on the interface).
    pub fn kill_agent(&mut self, i: usize) {
        if let Some(mut p) = self.agents[i].take() {
            p.kill_now();
        }
    }

    /// Stops member `i`'s agent with SIGTERM (a rolling upgrade).
    pub fn stop_agent(&mut self, i: usize) {
        if let Some(mut p) = self.agents[i].take() {
            p.stop(Duration::from_secs(10));
        }
    }

    /// Sends a signal to member `i`'s agent (SIGSTOP / SIGCONT).
    pub fn signal_agent(&self, i: usize, sig: Signal) {
        if let Some(p) = &self.agents[i] {
            let _ = p.signal(sig);
        }
    }

    /// The members whose kernel holds pair `k`'s first VIP.
    pub fn pair_holders(&self, k: usize) -> Result<Vec<usize>> {
        self.holders(self.pair_vip(k, 0))
    }

    /// Member `i`'s status of pair `k` (`admin status`) as JSON.
    pub fn pair_status(&self, i: usize, k: usize) -> Option<serde_json::Value> {
        let (ok, out) = self.pair_admin(i, k, &["status"]);
        if !ok {
            return None;
        }
        serde_json::from_str(&out).ok()
    }

    /// `havip-agent admin <args>` against member `i`'s pair `k`; (success, stdout).
    pub fn pair_admin(&self, i: usize, k: usize, args: &[&str]) -> (bool, String) {
        let mut all =
            vec!["admin".to_owned(), "--socket".to_owned(), self.pair_admin_socket(i, k).display().to_string()];
        all.extend(args.iter().map(|s| (*s).to_owned()));
        match std::process::Command::new(&self.binary).args(&all).output() {
            Ok(o) => (
                o.status.success(),
                format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
            ),
            Err(e) => (false, e.to_string()),
        }
    }

    /// `havip-agent doctor` for member `i` (its pair files and admin socket), run in its
    /// namespace behind `wrap` (e.g. `setpriv --bounding-set -net_raw`); (exit code,
    /// stdout and stderr).
    pub fn doctor(&self, i: usize, wrap: &[&str]) -> (Option<i32>, String) {
        let files: Vec<String> = self.config_files(i).iter().map(|f| f.display().to_string()).collect();
        let mut all: Vec<String> = ["netns", "exec", &self.topo.node(i).ns].map(str::to_owned).to_vec();
        all.extend(wrap.iter().map(|s| (*s).to_owned()));
        all.push(self.binary.display().to_string());
        all.extend(["doctor".to_owned(), "--config".to_owned(), files.join(","), "--node".to_owned(), node_name(i)]);
        if self.config_files(i).len() == 1 {
            all.extend(["--admin-socket".to_owned(), self.admin_socket(i).display().to_string()]);
        }
        match std::process::Command::new("ip").args(&all).output() {
            Ok(o) => (
                o.status.code(),
                format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
            ),
            Err(e) => (None, e.to_string()),
        }
    }

    /// The VIP:port of pair `k` (its first VIP, its service port).
    pub fn pair_target(&self, k: usize) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.vip_addr(self.pair_vip(k, 0))), SERVICE_PORT + k as u16)
    }

    /// The members whose kernel holds VIP `j` on eth0.
    pub fn holders(&self, j: u8) -> Result<Vec<usize>> {
        let vip = IpAddr::V4(self.vip_addr(j));
        // With a virtual MAC, each pair's VIPs are on its own interface.
        let pair = usize::from(j / self.opts.vips.max(1));
        let mut out = Vec::new();
        for (i, n) in self.topo.nodes().iter().enumerate() {
            let ifname = if self.opts.virtual_mac.is_some() { self.virtual_if(i, pair, false) } else { self.vip_if(i) };
            let held = match netns::has_address(&n.ns, &ifname, vip) {
                Ok(h) => h,
                // The agent creates the dummy interface of routed VIPs (and the virtual MAC
                // interfaces) when it first runs.
                Err(e)
                    if (self.opts.bgp.is_some() || self.opts.virtual_mac.is_some())
                        && e.to_string().contains("does not exist") =>
                {
                    false
                }
                Err(e) => return Err(e.into()),
            };
            if held {
                out.push(i);
            }
        }
        Ok(out)
    }

    /// Waits until exactly member `i` holds VIP 0.
    pub fn wait_sole_holder(&self, i: usize, timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        loop {
            if self.holders(0)? == vec![i] {
                return Ok(start.elapsed());
            }
            if start.elapsed() > timeout {
                return Err(LabError::Timeout {
                    what: format!(
                        "n{i} to be the sole holder (holders: {:?})\n{}",
                        self.holders(0)?,
                        self.diagnostics()
                    ),
                    timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `havip-agent admin <args>` against member `i` (pair 0); (success, stdout).
    pub fn admin(&self, i: usize, args: &[&str]) -> (bool, String) {
        self.pair_admin(i, 0, args)
    }

    /// `admin failover` on member `from`, retried every 50 ms until accepted (a planned
    /// move starts only once the target is a ready standby) or `timeout`; returns when
    /// the accepted attempt began (the command returns once the handover is done).
    pub fn failover_when_ready(&self, from: usize, timeout: Duration) -> Result<Instant> {
        self.pair_failover_when_ready(from, 0, timeout)
    }

    /// [`AgentLab::failover_when_ready`] of pair `k`.
    pub fn pair_failover_when_ready(&self, from: usize, k: usize, timeout: Duration) -> Result<Instant> {
        let start = Instant::now();
        loop {
            let attempt = Instant::now();
            let (ok, out) = self.pair_admin(from, k, &["failover"]);
            if ok {
                return Ok(attempt);
            }
            if start.elapsed() > timeout {
                let what =
                    format!("n{from} to accept a planned failover of pair {k} (its last answer: {})", out.trim());
                return Err(LabError::Timeout { what, timeout });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Member `i`'s status (`admin status`) as JSON.
    pub fn status(&self, i: usize) -> Option<serde_json::Value> {
        let (ok, out) = self.admin(i, &["status"]);
        if !ok {
            return None;
        }
        serde_json::from_str(&out).ok()
    }

    /// Member `i`'s role per its status.
    pub fn role(&self, i: usize) -> Option<String> {
        self.status(i).and_then(|s| s["role"].as_str().map(str::to_owned))
    }

    /// Member `i`'s epoch per its status.
    pub fn epoch(&self, i: usize) -> Option<u64> {
        self.status(i).and_then(|s| s["epoch"].as_u64())
    }

    /// Member `i`'s Prometheus metrics.
    pub fn metrics(&self, i: usize) -> String {
        metrics_in(&self.topo.node(i).ns, 9797)
    }

    /// The sum of a metric's samples whose line contains every `filters` substring.
    pub fn metric_sum(&self, i: usize, name: &str, filters: &[&str]) -> f64 {
        metric_sum(&self.metrics(i), name, filters)
    }

    /// The VIP:port the client connects to.
    pub fn target(&self) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.vip_addr(0)), SERVICE_PORT)
    }

    /// The IPv6 VIP:port ([`PairOptions::ipv6_vip`]).
    pub fn target6(&self) -> SocketAddr {
        let vip = if self.opts.bgp.is_some() { self.topo.routed_vip6(0) } else { self.topo.vip6(0) };
        SocketAddr::new(IpAddr::V6(vip), SERVICE_PORT)
    }

    /// The nftables tables in member `i`'s namespace (`nft list tables`), as
    /// `"<family> <name>"`, sorted.
    pub fn nft_tables(&self, i: usize) -> Result<Vec<String>> {
        let out = netns::exec(&self.topo.node(i).ns, "nft", &["list", "tables"])?;
        let mut t: Vec<String> =
            out.lines().filter_map(|l| l.trim().strip_prefix("table ")).map(str::to_owned).collect();
        t.sort();
        Ok(t)
    }

    /// Member `i`'s tables of pair `k`'s drain (`havip-<pair>-fwd` and `-quiet`; see
    /// `havip_node_agent::nft::table_name`), as `"<family> <name>"`.
    pub fn drain_tables(&self, i: usize, k: usize) -> Result<Vec<String>> {
        Ok(self.pair_tables(i, k)?.into_iter().filter(|t| !t.ends_with("-guard")).collect())
    }

    /// Member `i`'s guard tables of pair `k` (`ip|ip6 havip-<pair>-guard`: from its agent's
    /// start to its stop).
    pub fn guard_tables(&self, i: usize, k: usize) -> Result<Vec<String>> {
        Ok(self.pair_tables(i, k)?.into_iter().filter(|t| t.ends_with("-guard")).collect())
    }

    /// Every table of pair `k` on member `i` (`havip-<pair>-…`).
    pub fn pair_tables(&self, i: usize, k: usize) -> Result<Vec<String>> {
        let prefix = format!("{}{}-", havip_node_agent::nft::TABLE_PREFIX, pair_name(k));
        Ok(self
            .nft_tables(i)?
            .into_iter()
            .filter(|t| t.split_once(' ').is_some_and(|(_, name)| name.starts_with(&prefix)))
            .collect())
    }

    /// The addresses of member `i`'s `lo` that are VIPs of the lab (IPv4 VIPs of every
    /// pair and the IPv6 VIP): what a drain leaves there.
    pub fn vips_on_lo(&self, i: usize) -> Result<Vec<netns::Address>> {
        let vips: Vec<IpAddr> = (0..self.opts.pairs)
            .flat_map(|k| (0..self.opts.vips).map(move |j| (k, j)))
            .map(|(k, j)| IpAddr::V4(self.vip_addr(self.pair_vip(k, j))))
            .chain(self.opts.ipv6_vip.then(|| IpAddr::V6(self.topo.vip6(0))))
            .collect();
        Ok(netns::addresses(&self.topo.node(i).ns, "lo")?.into_iter().filter(|a| vips.contains(&a.ip)).collect())
    }

    /// Every member's status and log tail, for failure reports.
    pub fn diagnostics(&self) -> String {
        let mut out = String::new();
        for i in 0..self.opts.members {
            let st = self.status(i).map(|s| s.to_string()).unwrap_or_else(|| "(no status)".into());
            out.push_str(&format!("--- status n{i}: {st}\n"));
            let tables = self.nft_tables(i).map(|t| t.join(", ")).unwrap_or_else(|e| e.to_string());
            let lo = self
                .vips_on_lo(i)
                .map(|a| a.iter().map(|a| format!("{}/{}", a.ip, a.prefix_len)).collect::<Vec<_>>().join(", "))
                .unwrap_or_else(|e| e.to_string());
            out.push_str(&format!("    nft tables: [{tables}]; VIPs on lo: [{lo}]\n"));
        }
        out.push_str(&self.logs_tail(30));
        out
    }

    /// The last lines of every agent's log.
    pub fn logs_tail(&self, lines: usize) -> String {
        let mut out = String::new();
        for i in 0..self.opts.members {
            let log = self.topo.dir().join(format!("agent-{i}.log"));
            out.push_str(&format!("--- agent n{i} ---\n{}\n", crate::host::process::tail(&log, lines)));
        }
        out
    }
}

/// A lab for a test in `module` (pass `module_path!()`), or `None` with a skip line when
/// the test does not run as root.
pub fn lab_for_test(module: &str, opts: PairOptions) -> Option<AgentLab> {
    if !netns::skip_unless_root(module) {
        return None;
    }
    crate::host::logging::init_tracing();
    match AgentLab::start(opts) {
        Ok(lab) => Some(lab),
        Err(e) => panic!("agent lab starts: {e}"),
    }
}

/// Waits (up to `up`) for n0 (priority 200) to hold the VIP alone and the client to
/// reach it through the VIP; returns the client's prober.
pub fn bring_up(lab: &AgentLab, up: Duration) -> crate::traffic::Prober {
    if let Err(e) = lab.wait_sole_holder(0, up) {
        panic!("the higher priority member holds the VIP: {e}");
    }
    let prober = match crate::traffic::Prober::start(lab.client_ns(), crate::traffic::ProberConfig::new(lab.target())) {
        Ok(p) => p,
        Err(e) => panic!("prober: {e}"),
    };
    if let Err(e) = prober.wait_for_responder("n0", Duration::from_secs(5)) {
        panic!("client reaches n0 through the VIP: {e}");
    }
    // Every standby has reached the VIP through the network at least once: the tests'
    // premise that it sees the active's data plane (its neighbour entry for the VIP may
    // still be unresolved from probes made before the VIP existed).
    for i in 1..lab.opts.members {
        let start = std::time::Instant::now();
        while lab.metric_sum(i, "havip_agent_probes", &["pair=\"lab\"", "kind=\"peer\"", "result=\"up\""]) < 1.0 {
            if start.elapsed() > Duration::from_secs(5) {
                panic!("n{i} never probed the VIP up:\n{}", lab.diagnostics());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    prober
}
