//! Building a [`Topology`] (namespaces, switches, cables, addresses), what it is made of,
//! and removing it again.

use super::command::{IP, ip, run};
use super::error::{NetnsError, Result};
use super::layout::{DATA_IF, Link, MGMT_IF, NS_PREFIX, STATE_DIR, v6};
use super::owner::{allocate_subnet, cleanup_stale, destroy_ns, lock_file, owner_lock_path};
use super::state::{addresses, link_state, sysctls, wait_until};
use super::thread::spawn_in;
use crate::host::process::ManagedProcess;
use nix::fcntl::Flock;
use std::fs::File;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// The gateway's interface towards the routed client.
pub const ROUTED_IF: &str = "eth1";

/// One node of a topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// 0-based index.
    pub index: usize,
    /// Short name, `n<i>` (what listeners answer with by default).
    pub name: String,
    /// Its network namespace.
    pub ns: String,
    /// The data interface (`eth0`).
    pub data_if: String,
    /// The management interface (`eth1`).
    pub mgmt_if: String,
    /// IPv4 address on the data link (`10.<k>.0.<10+i>`).
    pub data_ip: Ipv4Addr,
    /// IPv4 address on the management link (`10.<k>.1.<10+i>`).
    pub mgmt_ip: Ipv4Addr,
    /// IPv6 address on the data link (`fd00:6876:<k>::<10+i>`).
    pub data_ip6: Ipv6Addr,
    /// IPv6 address on the management link (`fd00:6876:<k>:1::<10+i>`).
    pub mgmt_ip6: Ipv6Addr,
    /// Prefix length of the IPv4 subnets (24).
    pub prefix_len: u8,
    /// MAC address of `eth0`, lower-case `aa:bb:…`.
    pub data_mac: String,
    /// MAC address of `eth1`.
    pub mgmt_mac: String,
    /// The switch-side end of the data veth (in the switch namespace).
    pub switch_data_port: String,
    /// The switch-side end of the management veth.
    pub switch_mgmt_port: String,
}

impl NodeInfo {
    /// The node-side interface of `link`.
    pub fn ifname(&self, link: Link) -> &str {
        match link {
            Link::Data => &self.data_if,
            Link::Mgmt => &self.mgmt_if,
        }
    }

    /// The node's IPv4 address on `link`.
    pub fn ip(&self, link: Link) -> Ipv4Addr {
        match link {
            Link::Data => self.data_ip,
            Link::Mgmt => self.mgmt_ip,
        }
    }

    /// The switch-side port of `link`.
    pub fn switch_port(&self, link: Link) -> &str {
        match link {
            Link::Data => &self.switch_data_port,
            Link::Mgmt => &self.switch_mgmt_port,
        }
    }
}

/// The client (or the gateway): one namespace with `eth0` on the data bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostInfo {
    /// Its network namespace.
    pub ns: String,
    /// Its interface (`eth0`).
    pub ifname: String,
    /// Its IPv4 address.
    pub ip: Ipv4Addr,
    /// Its IPv6 address.
    pub ip6: Ipv6Addr,
    /// MAC address of `eth0`.
    pub mac: String,
    /// The switch-side end of its veth.
    pub switch_port: String,
}

/// Builds a [`Topology`].
#[derive(Debug, Clone)]
pub struct TopologyBuilder {
    nodes: usize,
    host_port: bool,
    routed_client: bool,
}

impl TopologyBuilder {
    /// Number of nodes, 2..=5 (default 2).
    pub fn nodes(mut self, n: usize) -> Self {
        self.nodes = n;
        self
    }

    /// Also plug the **root** namespace into the management bridge, as `10.k.1.1/24`
    /// ([`Topology::host_ip`]): the nodes reach a control plane that runs on the host
    /// there. The bridge stays inside the switch namespace; only a veth end is in the
    /// root namespace, and it disappears with the switch namespace.
    pub fn host_port(mut self, on: bool) -> Self {
        self.host_port = on;
        self
    }

    /// Also a client in **another subnet** behind the gateway (`10.k.2.100/24`,
    /// [`Topology::routed_client`]), on a cable of its own to the gateway's `eth1`
    /// (`10.k.2.254`), sharing no layer 2 with the nodes; the gateway forwards. What
    /// it reaches, it reaches through the gateway's routes (the BGP lab's router).
    pub fn routed_client(mut self, on: bool) -> Self {
        self.routed_client = on;
        self
    }

    /// Creates the namespaces, switches, links and addresses, after removing stale
    /// namespaces of dead runs. Everything created is removed again on error.
    pub fn build(self) -> Result<Topology> {
        if !(2..=5).contains(&self.nodes) {
            return Err(NetnsError::Invalid(format!("{} nodes; 2..=5 are supported", self.nodes)));
        }
        let started = Instant::now();
        std::fs::create_dir_all(STATE_DIR)
            .map_err(|source| NetnsError::Io { op: format!("create {STATE_DIR}"), source })?;
        if let Err(e) = cleanup_stale() {
            tracing::warn!(error = %e, "cleanup of stale namespaces failed");
        }
        let pid = std::process::id();
        let ctr = COUNTER.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("{NS_PREFIX}{pid}-{ctr}");
        let owner_lock_file = owner_lock_path(&prefix);
        let owner_lock = lock_file(&owner_lock_file)?
            .ok_or_else(|| NetnsError::Invalid(format!("{} is locked by someone else", owner_lock_file.display())))?;
        let (k, subnet_lock) = allocate_subnet(pid.wrapping_mul(7).wrapping_add(ctr.wrapping_mul(13)))?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("{prefix}-"))
            .tempdir()
            .map_err(|source| NetnsError::Io { op: "create a temporary directory".into(), source })?;
        let switch_ns = format!("{prefix}-sw");
        let host = |role: &str, last: u8, port: &str| HostInfo {
            ns: format!("{prefix}-{role}"),
            ifname: DATA_IF.to_owned(),
            ip: Ipv4Addr::new(10, k, 0, last),
            ip6: v6(k, 0, last),
            mac: String::new(),
            switch_port: port.to_owned(),
        };
        let gateway = host("gw", 254, "gw-data");
        let client = host("cl", 100, "cl-data");
        let routed_client = self.routed_client.then(|| HostInfo {
            ns: format!("{prefix}-rc"),
            ifname: DATA_IF.to_owned(),
            ip: Ipv4Addr::new(10, k, 2, 100),
            ip6: v6(k, 2, 100),
            mac: String::new(),
            switch_port: String::new(),
        });
        let nodes = (0..self.nodes)
            .map(|i| {
                let last = 10 + i as u8;
                NodeInfo {
                    index: i,
                    name: format!("n{i}"),
                    ns: format!("{prefix}-n{i}"),
                    data_if: DATA_IF.to_owned(),
                    mgmt_if: MGMT_IF.to_owned(),
                    data_ip: Ipv4Addr::new(10, k, 0, last),
                    mgmt_ip: Ipv4Addr::new(10, k, 1, last),
                    data_ip6: v6(k, 0, last),
                    mgmt_ip6: v6(k, 1, last),
                    prefix_len: 24,
                    data_mac: String::new(),
                    mgmt_mac: String::new(),
                    switch_data_port: format!("n{i}-data"),
                    switch_mgmt_port: format!("n{i}-mgmt"),
                }
            })
            .collect();
        let mut topo = Topology {
            host_port: self.host_port.then(|| format!("hve2e{k}")),
            prefix,
            k,
            switch_ns,
            gateway,
            client,
            routed_client,
            nodes,
            namespaces: Vec::new(),
            dir,
            subnet_lock: Some(subnet_lock),
            owner_lock: Some(owner_lock),
            owner_lock_file,
        };
        // On error `topo` is dropped, which removes whatever was created.
        topo.create()?;
        tracing::info!(prefix = %topo.prefix, k, nodes = self.nodes, took = ?started.elapsed(), "topology up");
        Ok(topo)
    }
}

/// A running topology; everything is removed on drop. See the module docs.
#[derive(Debug)]
pub struct Topology {
    host_port: Option<String>,
    prefix: String,
    k: u8,
    switch_ns: String,
    gateway: HostInfo,
    client: HostInfo,
    routed_client: Option<HostInfo>,
    nodes: Vec<NodeInfo>,
    namespaces: Vec<String>,
    dir: tempfile::TempDir,
    subnet_lock: Option<Flock<File>>,
    owner_lock: Option<Flock<File>>,
    owner_lock_file: PathBuf,
}

impl Topology {
    /// A builder (2 nodes unless told otherwise).
    pub fn builder() -> TopologyBuilder {
        TopologyBuilder { nodes: 2, host_port: false, routed_client: false }
    }

    fn add_ns(&mut self, ns: &str) -> Result<()> {
        run(IP, &["netns", "add", ns])?;
        self.namespaces.push(ns.to_owned());
        Ok(())
    }

    /// Creates a veth with `ifname` in `host_ns` and `port` on `bridge`.
    fn plug(&self, host_ns: &str, ifname: &str, port: &str, bridge: &str, v4: Ipv4Addr, v6: Ipv6Addr) -> Result<()> {
        let sw = self.switch_ns.as_str();
        ip(host_ns, &["link", "add", ifname, "type", "veth", "peer", "name", port, "netns", sw])?;
        ip(sw, &["link", "set", port, "master", bridge, "up"])?;
        ip(host_ns, &["addr", "add", &format!("{v4}/24"), "dev", ifname])?;
        ip(host_ns, &["addr", "add", &format!("{v6}/64"), "dev", ifname, "nodad"])?;
        ip(host_ns, &["link", "set", ifname, "up"])?;
        Ok(())
    }

    fn create(&mut self) -> Result<()> {
        let sw = self.switch_ns.clone();
        self.add_ns(&sw)?;
        // The switch is pure L2: no IPv6 autoconfiguration noise on its ports.
        sysctls(&sw, &[("net.ipv6.conf.all.disable_ipv6", "1"), ("net.ipv6.conf.default.disable_ipv6", "1")])?;
        ip(&sw, &["link", "set", "lo", "up"])?;
        for bridge in ["data", "mgmt"] {
            ip(&sw, &["link", "add", bridge, "type", "bridge", "mcast_snooping", "0", "stp_state", "0"])?;
            ip(&sw, &["link", "set", bridge, "up"])?;
        }
        let hosts: Vec<HostInfo> = vec![self.gateway.clone(), self.client.clone()];
        let nodes = self.nodes.clone();
        let all_host_ns: Vec<String> =
            hosts.iter().map(|h| h.ns.clone()).chain(nodes.iter().map(|n| n.ns.clone())).collect();
        for ns in &all_host_ns {
            self.add_ns(ns)?;
            let mut settings =
                vec![("net.ipv6.conf.all.disable_ipv6", "0"), ("net.ipv6.conf.default.disable_ipv6", "0")];
            if *ns == self.client.ns {
                // The point of the client: a GARP may only update an existing entry.
                settings.push(("net.ipv4.conf.all.arp_accept", "0"));
                settings.push(("net.ipv4.conf.default.arp_accept", "0"));
                // The client is the load generator: against echo listeners it closes first,
                // so TIME_WAIT stays here, and 800 connections a second (4 probers) would
                // exhaust the ephemeral ports within 35 s of TIME_WAIT's 60. With
                // timestamps (the default) a port in TIME_WAIT may be reused for a new
                // outgoing connection after 1 s, as load generators configure it.
                settings.push(("net.ipv4.tcp_tw_reuse", "1"));
            }
            sysctls(ns, &settings)?;
            ip(ns, &["link", "set", "lo", "up"])?;
        }
        for h in &hosts {
            self.plug(&h.ns, DATA_IF, &h.switch_port, "data", h.ip, h.ip6)?;
        }
        for n in &nodes {
            self.plug(&n.ns, DATA_IF, &n.switch_data_port, "data", n.data_ip, n.data_ip6)?;
            self.plug(&n.ns, MGMT_IF, &n.switch_mgmt_port, "mgmt", n.mgmt_ip, n.mgmt_ip6)?;
            ip(&n.ns, &["route", "add", "default", "via", &self.gateway.ip.to_string(), "dev", DATA_IF])?;
            ip(&n.ns, &["-6", "route", "add", "default", "via", &self.gateway.ip6.to_string(), "dev", DATA_IF])?;
        }
        if let Some(rc) = self.routed_client.clone() {
            self.add_ns(&rc.ns)?;
            // A load generator like the client (see above): without TIME_WAIT reuse, four
            // probers exhaust its ephemeral ports in about 35 s (the benchmark's
            // planned-200 stopped at move 33 for it).
            sysctls(
                &rc.ns,
                &[
                    ("net.ipv6.conf.all.disable_ipv6", "0"),
                    ("net.ipv6.conf.default.disable_ipv6", "0"),
                    ("net.ipv4.tcp_tw_reuse", "1"),
                ],
            )?;
            ip(&rc.ns, &["link", "set", "lo", "up"])?;
            let gw = self.gateway.ns.clone();
            ip(&gw, &["link", "add", ROUTED_IF, "type", "veth", "peer", "name", DATA_IF, "netns", &rc.ns])?;
            let (gw4, gw6) = (self.routed_gateway_ip(), v6(self.k, 2, 254));
            ip(&gw, &["addr", "add", &format!("{gw4}/24"), "dev", ROUTED_IF])?;
            ip(&gw, &["addr", "add", &format!("{gw6}/64"), "dev", ROUTED_IF, "nodad"])?;
            ip(&gw, &["link", "set", ROUTED_IF, "up"])?;
            ip(&rc.ns, &["addr", "add", &format!("{}/24", rc.ip), "dev", DATA_IF])?;
            ip(&rc.ns, &["addr", "add", &format!("{}/64", rc.ip6), "dev", DATA_IF, "nodad"])?;
            ip(&rc.ns, &["link", "set", DATA_IF, "up"])?;
            ip(&rc.ns, &["route", "add", "default", "via", &gw4.to_string()])?;
            ip(&rc.ns, &["-6", "route", "add", "default", "via", &gw6.to_string()])?;
            sysctls(&gw, &[("net.ipv4.ip_forward", "1"), ("net.ipv6.conf.all.forwarding", "1")])?;
            wait_until(
                &format!("carrier on {} {DATA_IF}", rc.ns),
                Duration::from_secs(5),
                Duration::from_millis(10),
                || Ok(link_state(&rc.ns, DATA_IF)?.has_carrier()),
            )?;
            if let Some(r) = self.routed_client.as_mut() {
                r.mac = link_state(&r.ns, DATA_IF)?.mac;
            }
        }
        if let Some(hp) = self.host_port.clone() {
            // A stale end of a crashed run with the same k would be gone with its switch
            // namespace; delete defensively anyway.
            let _ = run(IP, &["link", "del", &hp]);
            run(IP, &["link", "add", &hp, "type", "veth", "peer", "name", "host-mgmt", "netns", &sw])?;
            ip(&sw, &["link", "set", "host-mgmt", "master", "mgmt", "up"])?;
            run(IP, &["addr", "add", &format!("{}/24", self.host_ip()), "dev", &hp])?;
            run(IP, &["link", "set", &hp, "up"])?;
        }
        // Carrier is immediate on veths once both ends are up; check anyway.
        let timeout = Duration::from_secs(5);
        for h in &hosts {
            wait_until(&format!("carrier on {} {}", h.ns, DATA_IF), timeout, Duration::from_millis(10), || {
                Ok(link_state(&h.ns, DATA_IF)?.has_carrier())
            })?;
        }
        for n in &nodes {
            for l in Link::BOTH {
                wait_until(&format!("carrier on {} {}", n.ns, l.ifname()), timeout, Duration::from_millis(10), || {
                    Ok(link_state(&n.ns, l.ifname())?.has_carrier())
                })?;
            }
        }
        self.gateway.mac = link_state(&self.gateway.ns, DATA_IF)?.mac;
        self.client.mac = link_state(&self.client.ns, DATA_IF)?.mac;
        for n in &mut self.nodes {
            n.data_mac = link_state(&n.ns, DATA_IF)?.mac;
            n.mgmt_mac = link_state(&n.ns, MGMT_IF)?.mac;
        }
        Ok(())
    }

    /// The root namespace's address on the management bridge (`10.k.1.1`), when built
    /// with [`TopologyBuilder::host_port`].
    pub fn host_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.k, 1, 1)
    }

    /// The client in another subnet ([`TopologyBuilder::routed_client`]).
    pub fn routed_client(&self) -> Option<&HostInfo> {
        self.routed_client.as_ref()
    }

    /// The gateway's address towards the routed client (`10.k.2.254`).
    pub fn routed_gateway_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.k, 2, 254)
    }

    /// An address for routed VIP `j` (0..=9), outside every subnet of the topology:
    /// `10.<k>.9.<50+j>` — reachable only through a route.
    pub fn routed_vip(&self, j: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, self.k, 9, 50 + j.min(9))
    }

    /// The IPv6 form of [`Topology::routed_vip`]: `fd00:6876:<k>:9::<50+j>`.
    pub fn routed_vip6(&self, j: u8) -> Ipv6Addr {
        v6(self.k, 9, 50 + j.min(9))
    }

    /// The unique prefix of every namespace (`hve2e-<pid>-<ctr>`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The `k` of the address plan (`10.<k>.0.0/24`), unique among live topologies.
    pub fn k(&self) -> u8 {
        self.k
    }

    /// The data subnet, `10.<k>.0.0`, prefix 24.
    pub fn data_subnet(&self) -> (Ipv4Addr, u8) {
        (Ipv4Addr::new(10, self.k, 0, 0), 24)
    }

    /// The management subnet, `10.<k>.1.0`, prefix 24.
    pub fn mgmt_subnet(&self) -> (Ipv4Addr, u8) {
        (Ipv4Addr::new(10, self.k, 1, 0), 24)
    }

    /// A free address on the data subnet for VIP number `j` (0..=9): `10.<k>.0.<50+j>`.
    pub fn vip(&self, j: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, self.k, 0, 50 + j.min(9))
    }

    /// The `j`-th of up to 110 IPv4 VIPs on the data link: [`Topology::vip`]`(j)` for the
    /// first ten, then `10.<k>.0.<140+j>`.
    pub fn vip_at(&self, j: u8) -> Ipv4Addr {
        if j < 10 { self.vip(j) } else { Ipv4Addr::new(10, self.k, 0, 140u8.saturating_add(j)) }
    }

    /// An IPv6 VIP on the data link: `fd00:6876:<k>::<50+j>`.
    pub fn vip6(&self, j: u8) -> Ipv6Addr {
        v6(self.k, 0, 50 + j.min(9))
    }

    /// The namespace holding the `data` and `mgmt` bridges.
    pub fn switch_ns(&self) -> &str {
        &self.switch_ns
    }

    /// All nodes.
    pub fn nodes(&self) -> &[NodeInfo] {
        &self.nodes
    }

    /// Node `i`. Panics if out of range, like indexing.
    pub fn node(&self, i: usize) -> &NodeInfo {
        &self.nodes[i]
    }

    /// The client (`10.<k>.0.100`).
    pub fn client(&self) -> &HostInfo {
        &self.client
    }

    /// The gateway (`10.<k>.0.254`), the nodes' default route.
    pub fn gateway(&self) -> &HostInfo {
        &self.gateway
    }

    /// Every namespace of the topology.
    pub fn namespaces(&self) -> &[String] {
        &self.namespaces
    }

    /// A temporary directory for logs, removed with the topology.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Starts a process in `ns` with its log at `<dir>/<name>.log`; see [`spawn_in`].
    pub fn spawn(
        &self,
        ns: &str,
        name: &str,
        program: &Path,
        args: &[String],
        envs: &[(String, String)],
    ) -> Result<ManagedProcess> {
        let log = self.dir().join(format!("{name}.log"));
        spawn_in(ns, name, program, args, envs, &log)
    }

    pub(super) fn node_checked(&self, node: usize) -> Result<&NodeInfo> {
        self.nodes.get(node).ok_or_else(|| NetnsError::Invalid(format!("no node {node}")))
    }

    pub(super) fn set_port(&self, port: &str, up: bool) -> Result<()> {
        ip(&self.switch_ns, &["link", "set", port, if up { "up" } else { "down" }]).map(drop)
    }

    /// Waits until every node, client and gateway interface has a link-local IPv6
    /// address and no address is tentative (DAD done; about 1–2 s after creation).
    pub fn wait_ipv6_ready(&self, timeout: Duration) -> Result<()> {
        let mut ifs: Vec<(String, &str)> =
            vec![(self.client.ns.clone(), DATA_IF), (self.gateway.ns.clone(), self.gateway.ifname.as_str())];
        for n in &self.nodes {
            ifs.push((n.ns.clone(), DATA_IF));
            ifs.push((n.ns.clone(), MGMT_IF));
        }
        let deadline = Instant::now() + timeout;
        for (ns, dev) in ifs {
            let left = deadline.saturating_duration_since(Instant::now());
            wait_until(&format!("IPv6 ready on {ns} {dev}"), left, Duration::from_millis(50), || {
                let addrs = addresses(&ns, dev)?;
                Ok(addrs.iter().any(|a| a.scope == "link" && a.ip.is_ipv6()) && !addrs.iter().any(|a| a.tentative))
            })?;
        }
        Ok(())
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        let mut errors = Vec::new();
        // Hosts first, the switch (and with it every veth) last.
        for ns in self.namespaces.iter().rev() {
            if let Err(e) = destroy_ns(ns) {
                errors.push(format!("{ns}: {e}"));
            }
        }
        if let Err(e) = std::fs::remove_file(&self.owner_lock_file)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            errors.push(format!("{}: {e}", self.owner_lock_file.display()));
        }
        drop(self.owner_lock.take());
        // The subnet lock file stays: removing a file others may be about to lock
        // would let two topologies hold "the same" lock.
        drop(self.subnet_lock.take());
        if errors.is_empty() {
            tracing::debug!(prefix = %self.prefix, "topology removed");
        } else {
            tracing::warn!(prefix = %self.prefix, ?errors, "topology removed with errors");
        }
    }
}
