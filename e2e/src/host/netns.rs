//! A network-namespace test topology: a few "nodes", a client and a gateway
//! plugged into two switches, all of it in namespaces of its own.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use havip_e2e::netns::{Link, Topology};
//! let topo = Topology::builder().nodes(2).build()?;
//! let n0 = topo.node(0);
//! println!("{} has {} on {}", n0.ns, n0.data_ip, n0.data_if);
//! topo.cut_cable(0, Link::Data)?; // n0's eth0 now reports NO-CARRIER
//! topo.restore_cable(0, Link::Data)?;
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! Every bridge lives inside a "switch" namespace: a Docker daemon on the host sets
//! the root namespace's iptables FORWARD policy to DROP and filters bridged frames,
//! which silently breaks host-side bridges. Nothing of a topology ever appears in
//! the root namespace: each veth pair is created with its two ends directly in their
//! target namespaces.
//!
//! | namespace         | interface | address (data `10.<k>.0.0/24`, mgmt `10.<k>.1.0/24`)        |
//! |-------------------|-----------|-------------------------------------------------------------|
//! | `<prefix>-sw`     | `data`    | bridge (no address), ports `n<i>-data`, `cl-data`, `gw-data` |
//! |                   | `mgmt`    | bridge (no address), ports `n<i>-mgmt`                       |
//! | `<prefix>-n<i>`   | `eth0`    | `10.<k>.0.<10+i>/24`, `fd00:6876:<k>::<10+i>/64`            |
//! |                   | `eth1`    | `10.<k>.1.<10+i>/24`, `fd00:6876:<k>:1::<10+i>/64`          |
//! | `<prefix>-cl`     | `eth0`    | `10.<k>.0.100/24`, `fd00:6876:<k>::100/64`                  |
//! | `<prefix>-gw`     | `eth0`    | `10.<k>.0.254/24`, `fd00:6876:<k>::254/64` (the gateway)    |
//!
//! VIPs for tests: [`Topology::vip`] is `10.<k>.0.<50+j>`, [`Topology::vip6`] is
//! `fd00:6876:<k>::<50+j>` (the IPv6 groups are written with the same digits as the
//! IPv4 octets, read as hex). Nodes have default routes (IPv4 and IPv6) via the
//! gateway. The static IPv6 addresses are added `nodad`, so they are usable at
//! once; link-local addresses go through normal DAD (see
//! [`Topology::wait_ipv6_ready`]).
//!
//! `<prefix>` is `hve2e-<pid>-<counter>`. `<k>` (100..=250) is unique among live
//! topologies on the machine: it is held with an exclusive `flock` on
//! `/run/havip-e2e/subnet-<k>.lock` for the topology's lifetime, which the kernel
//! releases when the process dies, so a crash never leaks a subnet. The same `k`
//! gives unique VRRP router ids (see the keepalived module).
//!
//! # Crash safety
//!
//! The owner also holds `flock` on `/run/havip-e2e/<prefix>.lock`. [`cleanup_stale`]
//! (called by every [`TopologyBuilder::build`]) deletes namespaces named
//! `hve2e-<pid>-…` whose pid is dead or whose owner lock is no longer held, so a
//! killed test run never poisons the next. `Drop` kills every process in the
//! topology's namespaces and deletes them; errors are logged, never panicked on.
//!
//! # Faults
//!
//! Every fault has an idempotent inverse, and [`Topology::heal_all`] undoes them all.
//! - [`Topology::cut_cable`] sets the *switch-side* end of a node's veth down: the
//!   node's interface stays administratively `UP` but reports `NO-CARRIER`,
//!   operstate `DOWN`, exactly like a pulled cable. The kernel then flushes the
//!   node's neighbour entries on that device and marks its routes `linkdown`;
//!   addresses (IPv4 and IPv6) stay. [`Topology::restore_cable`] brings `LOWER_UP`
//!   back at once (veth carrier follows the peer synchronously).
//! - [`Topology::partition_udp_port`], [`Topology::block_tcp_port`] and
//!   [`Topology::block_ip_proto`] install one `netdev` nftables table per fault in
//!   the node's namespace, hooked at ingress and egress of the chosen interfaces, so
//!   [`Topology::heal`] removes exactly that fault. The drop is silent to the
//!   sender, like loss on a wire; an `inet` OUTPUT-hook drop would make the
//!   sender's `send`/`connect` fail with EPERM instead, which no real partition does.
//! - [`Topology::set_link_loss`] drops a percentage of all frames (ARP included) at
//!   the node's switch port, both directions (`tc netem` is not available in this
//!   machine's kernel); 100 % is a black hole with carrier still up.
//! - [`Topology::set_gateway_up`] unplugs the gateway from the data switch.
//!
//! # Running code in a namespace
//!
//! [`spawn_in`] starts a program under `ip netns exec` as a [`ManagedProcess`];
//! [`run_in_netns`] runs a closure on a thread that `setns`'d into the namespace
//! (sockets it opens live there; a tokio runtime must be created on that thread).
//!
//! # Sysctls
//!
//! Node, client and gateway namespaces get kernel defaults (this host has
//! `net.core.devconf_inherit_init_net = 0`), with `disable_ipv6 = 0` and the
//! client's `arp_accept = 0` set explicitly: the client must only *update* an
//! existing neighbour entry on a gratuitous ARP, never create one. The client also
//! has `tcp_tw_reuse = 1` (a load generator's setting: its probes may close first and
//! leave TIME_WAIT there). The switch
//! namespace has IPv6 disabled, and its bridges have multicast snooping off (VRRP
//! and NDP multicast is simply flooded, like a dumb switch).

use crate::host::process::{ManagedProcess, ProcessError};
use nix::fcntl::{Flock, FlockArg};
use nix::sched::{CloneFlags, setns};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::fmt;
use std::fs::File;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Every namespace of this harness starts with this.
pub const NS_PREFIX: &str = "hve2e-";
/// Where lock files live (tmpfs: gone after a reboot, as the namespaces are).
pub const STATE_DIR: &str = "/run/havip-e2e";
/// Where `ip netns` keeps its namespace handles.
pub const NETNS_DIR: &str = "/var/run/netns";
/// The data interface of nodes, the client and the gateway.
pub const DATA_IF: &str = "eth0";
/// The management interface of nodes.
pub const MGMT_IF: &str = "eth1";

const SUBNET_FIRST: u8 = 100;
const SUBNET_LAST: u8 = 250;
const IP: &str = "ip";
const NFT: &str = "nft";
const FAULT_TABLE_PREFIX: &str = "hvfault_";
const LOSS_TABLE_PREFIX: &str = "hvloss_";

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Errors of the namespace harness.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// A command could not be started.
    #[error("failed to run `{cmd}`: {source}")]
    Spawn {
        /// The command line.
        cmd: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A command exited unsuccessfully.
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        cmd: String,
        /// Its exit status.
        status: String,
        /// Its standard error.
        stderr: String,
    },
    /// A command's output could not be understood.
    #[error("cannot parse the output of `{cmd}`: {reason}")]
    Parse {
        /// The command line.
        cmd: String,
        /// Why.
        reason: String,
    },
    /// The topology asked for is not supported.
    #[error("invalid topology: {0}")]
    Invalid(String),
    /// All subnets 10.100..=250 are taken by live topologies.
    #[error("no free subnet: 10.{SUBNET_FIRST}..=10.{SUBNET_LAST} are all held by live topologies")]
    NoSubnet,
    /// A file operation failed.
    #[error("failed to {op}: {source}")]
    Io {
        /// What was attempted.
        op: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Entering a namespace failed.
    #[error("failed to enter network namespace {ns}: {source}")]
    Setns {
        /// The namespace.
        ns: String,
        /// The cause.
        #[source]
        source: nix::Error,
    },
    /// A thread running inside a namespace panicked.
    #[error("the thread in network namespace {ns} panicked")]
    Panicked {
        /// The namespace.
        ns: String,
    },
    /// A condition did not come true in time.
    #[error("timed out after {timeout:?} waiting for {what}")]
    Timeout {
        /// The condition.
        what: String,
        /// How long we waited.
        timeout: Duration,
    },
    /// A process could not be started.
    #[error(transparent)]
    Process(#[from] ProcessError),
}

type Result<T, E = NetnsError> = std::result::Result<T, E>;

/// Which of a node's two links.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Link {
    /// `eth0`, on the `data` bridge: the client, the gateway and the VIPs are here.
    Data,
    /// `eth1`, on the `mgmt` bridge: a second path for heartbeats.
    Mgmt,
}

impl Link {
    /// Both links.
    pub const BOTH: [Link; 2] = [Link::Data, Link::Mgmt];

    /// The node-side interface name.
    pub fn ifname(self) -> &'static str {
        match self {
            Link::Data => DATA_IF,
            Link::Mgmt => MGMT_IF,
        }
    }

    fn short(self) -> &'static str {
        match self {
            Link::Data => "data",
            Link::Mgmt => "mgmt",
        }
    }
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short())
    }
}

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

/// An address of an interface, from `ip -j addr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    /// The address.
    pub ip: IpAddr,
    /// Its prefix length.
    pub prefix_len: u8,
    /// The label as `ip` reports it: IPv4 addresses always have one (the interface
    /// name unless a label such as `eth0:vip` was given); IPv6 addresses have none.
    pub label: Option<String>,
    /// `host`, `link` or `global`.
    pub scope: String,
    /// Still doing duplicate address detection.
    pub tentative: bool,
    /// DAD found a duplicate.
    pub dadfailed: bool,
}

/// State of an interface, from `ip -j link`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkState {
    /// The interface name.
    pub ifname: String,
    /// Its MAC address.
    pub mac: String,
    /// `UP`, `DOWN`, `LOWERLAYERDOWN`, `UNKNOWN`, …
    pub operstate: String,
    /// `UP`, `LOWER_UP`, `NO-CARRIER`, `BROADCAST`, …
    pub flags: Vec<String>,
}

impl LinkState {
    /// Administratively up (`UP` flag).
    pub fn admin_up(&self) -> bool {
        self.flags.iter().any(|f| f == "UP")
    }

    /// Has carrier: `LOWER_UP` and no `NO-CARRIER`.
    pub fn has_carrier(&self) -> bool {
        self.flags.iter().any(|f| f == "LOWER_UP") && !self.flags.iter().any(|f| f == "NO-CARRIER")
    }
}

/// A neighbour (ARP/NDP) entry, from `ip -j neigh`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Neighbour {
    /// The link-layer address, absent for `INCOMPLETE`/`FAILED` entries.
    pub mac: Option<String>,
    /// `REACHABLE`, `STALE`, `DELAY`, `PROBE`, `INCOMPLETE`, `FAILED`, `PERMANENT`, …
    pub states: Vec<String>,
}

impl Neighbour {
    /// Resolved: has a MAC and is not `INCOMPLETE`/`FAILED`.
    pub fn is_resolved(&self) -> bool {
        self.mac.is_some() && !self.states.iter().any(|s| s == "INCOMPLETE" || s == "FAILED")
    }
}

/// A fault installed by [`Topology::partition_udp_port`] and friends: one nftables
/// table that [`Topology::heal`] removes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fault {
    /// The namespace the table is in.
    pub ns: String,
    /// nftables family (`netdev`).
    pub family: String,
    /// The table name.
    pub table: String,
}

/// Checks that this process may create namespaces; tests call it first.
///
/// `Err` carries the reason; [`skip_unless_root`] prints the standard skip line.
pub fn require_root() -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err(format!("running as uid {}, not root", nix::unistd::geteuid()));
    }
    for tool in [IP, NFT] {
        match Command::new(tool).arg("-V").stdout(Stdio::null()).stderr(Stdio::null()).status() {
            Ok(_) => {}
            Err(e) => return Err(format!("`{tool}` cannot be run: {e}")),
        }
    }
    Ok(())
}

/// For tests: `true` when root; otherwise prints
/// `SKIPPED: needs root (CAP_NET_ADMIN) …` and returns `false`.
pub fn skip_unless_root(test: &str) -> bool {
    match require_root() {
        Ok(()) => true,
        Err(why) => {
            // Straight to the stderr handle: the test harness captures `println!`.
            let line = format!("SKIPPED: needs root (CAP_NET_ADMIN) to create network namespaces: {test}: {why}\n");
            let _ = std::io::stderr().write_all(line.as_bytes());
            false
        }
    }
}

fn cmdline(program: &str, args: &[&str]) -> String {
    std::iter::once(program).chain(args.iter().copied()).collect::<Vec<_>>().join(" ")
}

/// Runs a command, returning its standard output; fails on a non-zero exit.
fn run(program: &str, args: &[&str]) -> Result<String> {
    run_stdin(program, args, None)
}

fn run_stdin(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String> {
    let cmd = cmdline(program, args);
    tracing::trace!(%cmd, "running");
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| NetnsError::Spawn { cmd: cmd.clone(), source })?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes()).map_err(|source| NetnsError::Spawn { cmd: cmd.clone(), source })?;
    }
    let out = child.wait_with_output().map_err(|source| NetnsError::Spawn { cmd: cmd.clone(), source })?;
    if !out.status.success() {
        return Err(NetnsError::Command {
            cmd,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip -n <ns> args…`.
fn ip(ns: &str, args: &[&str]) -> Result<String> {
    let mut all = vec!["-n", ns];
    all.extend_from_slice(args);
    run(IP, &all)
}

fn ip_json(ns: &str, args: &[&str]) -> Result<serde_json::Value> {
    let mut all = vec!["-j"];
    all.extend_from_slice(args);
    let out = ip(ns, &all)?;
    if out.trim().is_empty() {
        return Ok(serde_json::Value::Array(Vec::new()));
    }
    serde_json::from_str(&out)
        .map_err(|e| NetnsError::Parse { cmd: format!("ip -n {ns} {}", all.join(" ")), reason: e.to_string() })
}

/// `ip netns exec <ns> program args…`.
fn exec_in(ns: &str, program: &str, args: &[&str], stdin: Option<&str>) -> Result<String> {
    let mut all = vec!["netns", "exec", ns, program];
    all.extend_from_slice(args);
    run_stdin(IP, &all, stdin)
}

fn sysctl_path(key: &str) -> PathBuf {
    Path::new("/proc/sys").join(key.replace('.', "/"))
}

/// Writes sysctls in `ns` through `/proc/sys` from a thread inside the namespace
/// (`/proc/sys/net` shows the network namespace of the reading thread), so no
/// `sysctl` binary is needed.
fn sysctls(ns: &str, settings: &[(&str, &str)]) -> Result<()> {
    let settings: Vec<(String, String)> = settings.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    in_netns(ns, move || {
        for (k, v) in settings {
            let path = sysctl_path(&k);
            std::fs::write(&path, v.as_bytes())
                .map_err(|source| NetnsError::Io { op: format!("write {} (sysctl {k})", path.display()), source })?;
        }
        Ok(())
    })?
}

/// Turns IPv4 and IPv6 forwarding on or off in `ns` (`net.ipv4.ip_forward` and
/// `net.ipv6.conf.all.forwarding`), as a Kubernetes node has them on. A new namespace
/// inherits IPv4 forwarding from the host or not depending on
/// `net.core.devconf_inherit_init_net`, so a test that cares sets it.
pub fn set_forwarding(ns: &str, on: bool) -> Result<()> {
    let v = if on { "1" } else { "0" };
    sysctls(ns, &[("net.ipv4.ip_forward", v), ("net.ipv6.conf.all.forwarding", v)])
}

/// Reads one sysctl in a namespace (e.g. `net.ipv4.conf.eth0.arp_accept`).
pub fn sysctl(ns: &str, key: &str) -> Result<String> {
    let path = sysctl_path(key);
    in_netns(ns, move || {
        std::fs::read_to_string(&path)
            .map(|s| s.trim().to_owned())
            .map_err(|source| NetnsError::Io { op: format!("read {}", path.display()), source })
    })?
}

/// The state of `dev` in `ns`.
pub fn link_state(ns: &str, dev: &str) -> Result<LinkState> {
    let v = ip_json(ns, &["link", "show", "dev", dev])?;
    let cmd = || format!("ip -n {ns} -j link show dev {dev}");
    let l = v.get(0).ok_or_else(|| NetnsError::Parse { cmd: cmd(), reason: "empty".into() })?;
    let s = |k: &str| l.get(k).and_then(|x| x.as_str()).unwrap_or_default().to_owned();
    let flags = l
        .get("flags")
        .and_then(|f| f.as_array())
        .map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    Ok(LinkState { ifname: s("ifname"), mac: s("address"), operstate: s("operstate"), flags })
}

/// The addresses of `dev` in `ns`, from `ip -j addr`.
pub fn addresses(ns: &str, dev: &str) -> Result<Vec<Address>> {
    let v = ip_json(ns, &["addr", "show", "dev", dev])?;
    let cmd = || format!("ip -n {ns} -j addr show dev {dev}");
    let mut out = Vec::new();
    for link in v.as_array().into_iter().flatten() {
        for a in link.get("addr_info").and_then(|x| x.as_array()).into_iter().flatten() {
            // `ip` also prints empty objects for addresses it does not show.
            let Some(local) = a.get("local").and_then(|x| x.as_str()) else { continue };
            let ip: IpAddr =
                local.parse().map_err(|e| NetnsError::Parse { cmd: cmd(), reason: format!("address {local}: {e}") })?;
            let prefix_len = a
                .get("prefixlen")
                .and_then(|x| x.as_u64())
                .and_then(|p| u8::try_from(p).ok())
                .ok_or_else(|| NetnsError::Parse { cmd: cmd(), reason: format!("prefixlen of {local}") })?;
            let flag = |k: &str| a.get(k).and_then(|x| x.as_bool()).unwrap_or(false);
            out.push(Address {
                ip,
                prefix_len,
                label: a.get("label").and_then(|x| x.as_str()).map(str::to_owned),
                scope: a.get("scope").and_then(|x| x.as_str()).unwrap_or_default().to_owned(),
                tentative: flag("tentative"),
                dadfailed: flag("dadfailed"),
            });
        }
    }
    Ok(out)
}

/// Whether `dev` in `ns` has the address `ip` (any prefix length).
pub fn has_address(ns: &str, dev: &str, ip: IpAddr) -> Result<bool> {
    Ok(addresses(ns, dev)?.iter().any(|a| a.ip == ip))
}

/// The neighbour entry for `ip` on `dev` in `ns`, if any.
pub fn neighbour(ns: &str, dev: &str, ip: IpAddr) -> Result<Option<Neighbour>> {
    let ip_s = ip.to_string();
    let v = ip_json(ns, &["neigh", "show", "dev", dev, "to", &ip_s])?;
    for n in v.as_array().into_iter().flatten() {
        if n.get("dst").and_then(|x| x.as_str()).and_then(|d| d.parse::<IpAddr>().ok()) != Some(ip) {
            continue;
        }
        let states = n
            .get("state")
            .and_then(|x| x.as_array())
            .map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        return Ok(Some(Neighbour { mac: n.get("lladdr").and_then(|x| x.as_str()).map(str::to_owned), states }));
    }
    Ok(None)
}

/// Makes `ns` resolve `ip` without ping: sends one UDP datagram to `ip:9`
/// (discard) from inside the namespace, which makes the kernel send an ARP
/// request (or neighbour solicitation) and create the neighbour entry. The
/// datagram itself is harmless (the target answers port-unreachable at most).
pub fn warm_neighbour(ns: &str, ip: IpAddr) -> Result<()> {
    let ns_owned = ns.to_owned();
    in_netns(ns, move || {
        let bind: SocketAddr = match ip {
            IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
            IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        let sock =
            UdpSocket::bind(bind).map_err(|source| NetnsError::Io { op: format!("bind UDP in {ns_owned}"), source })?;
        match sock.send_to(b"havip-e2e arp warmup", (ip, 9)) {
            Ok(_) => Ok(()),
            // No route or an earlier failure reported asynchronously: still fine,
            // the neighbour lookup was attempted.
            Err(e) => {
                tracing::debug!(ns = %ns_owned, %ip, error = %e, "warmup datagram not sent");
                Ok(())
            }
        }
    })?
}

/// Warms the neighbour entry for `ip` and waits until it is resolved; returns
/// the MAC address.
pub fn resolve_neighbour(ns: &str, dev: &str, ip: IpAddr, timeout: Duration) -> Result<String> {
    let deadline = Instant::now() + timeout;
    let mut next_warm = Instant::now();
    loop {
        if Instant::now() >= next_warm {
            warm_neighbour(ns, ip)?;
            next_warm = Instant::now() + Duration::from_millis(500);
        }
        if let Some(Neighbour { mac: Some(mac), states }) = neighbour(ns, dev, ip)?
            && !states.iter().any(|s| s == "INCOMPLETE" || s == "FAILED")
        {
            return Ok(mac);
        }
        if Instant::now() >= deadline {
            return Err(NetnsError::Timeout { what: format!("{ns} to resolve {ip} on {dev}"), timeout });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Polls `cond` every `every` until it returns `Ok(true)`, an error, or the deadline.
pub fn wait_until(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut cond: impl FnMut() -> Result<bool>,
) -> Result<Duration> {
    let start = Instant::now();
    loop {
        if cond()? {
            return Ok(start.elapsed());
        }
        if start.elapsed() >= timeout {
            return Err(NetnsError::Timeout { what: what.to_owned(), timeout });
        }
        std::thread::sleep(every);
    }
}

/// A thread running inside a network namespace (see [`run_in_netns`]).
#[derive(Debug)]
pub struct NetnsThread<T> {
    ns: String,
    handle: JoinHandle<Option<T>>,
}

impl<T> NetnsThread<T> {
    /// Waits for the closure's result.
    pub fn join(self) -> Result<T> {
        match self.handle.join() {
            Ok(Some(v)) => Ok(v),
            _ => Err(NetnsError::Panicked { ns: self.ns }),
        }
    }

    /// Whether the closure has returned.
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// The namespace it runs in.
    pub fn ns(&self) -> &str {
        &self.ns
    }
}

/// Runs `f` on a new OS thread that first joins network namespace `ns`
/// (`setns(/var/run/netns/<ns>, CLONE_NEWNET)`): sockets it creates live in that
/// namespace. Only that thread moves; the rest of the process stays where it is.
///
/// Returns once the thread is inside the namespace (an error if it could not get
/// there). Threads that `f` spawns start in the namespace too, but a tokio runtime
/// created elsewhere does *not* run in it: async code must build its own runtime
/// (e.g. `tokio::runtime::Builder::new_current_thread().enable_all().build()`)
/// inside `f`. Processes started from such a thread with `std::process::Command`
/// inherit the namespace, but beware `--pdeathsig` (see [`crate::host::process`]): they
/// die when that thread ends; prefer [`spawn_in`].
pub fn run_in_netns<T, F>(ns: &str, f: F) -> Result<NetnsThread<T>>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let path = Path::new(NETNS_DIR).join(ns);
    let (tx, rx) = mpsc::sync_channel::<Result<()>>(1);
    let ns_owned = ns.to_owned();
    let handle = std::thread::Builder::new()
        .name(format!("netns {ns}"))
        .spawn(move || {
            let entered = File::open(&path)
                .map_err(|source| NetnsError::Io { op: format!("open {}", path.display()), source })
                .and_then(|f| {
                    setns(&f, CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Setns { ns: ns_owned, source })
                });
            let ok = entered.is_ok();
            let _ = tx.send(entered);
            if ok { Some(f()) } else { None }
        })
        .map_err(|source| NetnsError::Io { op: format!("spawn a thread for namespace {ns}"), source })?;
    match rx.recv() {
        Ok(Ok(())) => Ok(NetnsThread { ns: ns.to_owned(), handle }),
        Ok(Err(e)) => {
            let _ = handle.join();
            Err(e)
        }
        Err(_) => {
            let _ = handle.join();
            Err(NetnsError::Panicked { ns: ns.to_owned() })
        }
    }
}

/// Runs `f` inside `ns` and waits for its result.
pub fn in_netns<T, F>(ns: &str, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    run_in_netns(ns, f)?.join()
}

/// Starts `program args…` inside network namespace `ns` (`ip netns exec`), with
/// output appended to `log`, under [`ManagedProcess`] (stopped on drop, killed if
/// the starting thread dies). `ip netns exec` also gives the process a private
/// mount namespace with that namespace's `/sys`.
pub fn spawn_in(
    ns: &str,
    name: &str,
    program: &Path,
    args: &[String],
    envs: &[(String, String)],
    log: &Path,
) -> Result<ManagedProcess> {
    let mut all = vec!["netns".to_owned(), "exec".to_owned(), ns.to_owned(), program.display().to_string()];
    all.extend(args.iter().cloned());
    Ok(ManagedProcess::spawn(name, Path::new(IP), &all, envs, log)?)
}

/// Runs a command inside `ns` to completion (`ip netns exec`), returning stdout.
pub fn exec(ns: &str, program: &str, args: &[&str]) -> Result<String> {
    exec_in(ns, program, args, None)
}

/// The pids of processes in `ns` (`ip netns pids`).
pub fn ns_pids(ns: &str) -> Result<Vec<i32>> {
    let out = run(IP, &["netns", "pids", ns])?;
    Ok(out.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

/// The names of all namespaces in `/var/run/netns`.
pub fn list_namespaces() -> Result<Vec<String>> {
    let dir = match std::fs::read_dir(NETNS_DIR) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(NetnsError::Io { op: format!("list {NETNS_DIR}"), source }),
    };
    let mut names: Vec<String> = dir.filter_map(|e| e.ok()).filter_map(|e| e.file_name().into_string().ok()).collect();
    names.sort();
    Ok(names)
}

/// SIGKILLs every process in `ns` (never this process), then deletes it.
/// A namespace that is already gone is not an error.
fn destroy_ns(ns: &str) -> Result<()> {
    if !Path::new(NETNS_DIR).join(ns).exists() {
        return Ok(());
    }
    let me = std::process::id() as i32;
    match ns_pids(ns) {
        Ok(pids) => {
            for pid in pids.into_iter().filter(|p| *p != me) {
                tracing::debug!(ns, pid, "killing process left in namespace");
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        Err(e) => tracing::debug!(ns, error = %e, "cannot list processes in namespace"),
    }
    match run(IP, &["netns", "delete", ns]) {
        Ok(_) => Ok(()),
        Err(_) if !Path::new(NETNS_DIR).join(ns).exists() => Ok(()),
        Err(e) => Err(e),
    }
}

fn owner_lock_path(owner: &str) -> PathBuf {
    Path::new(STATE_DIR).join(format!("{owner}.lock"))
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// `Some(true)` if the owner lock file exists and nobody holds it.
fn owner_lock_free(owner: &str) -> Option<bool> {
    let f = File::options().read(true).write(true).open(owner_lock_path(owner)).ok()?;
    match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
        Ok(_held) => Some(true), // released on drop
        Err(_) => Some(false),
    }
}

/// Parses `hve2e-<pid>-<ctr>-<role>` into (`hve2e-<pid>-<ctr>`, pid).
fn parse_owner(ns: &str) -> Option<(String, u32)> {
    let rest = ns.strip_prefix(NS_PREFIX)?;
    let mut parts = rest.splitn(3, '-');
    let pid: u32 = parts.next()?.parse().ok()?;
    let ctr: u32 = parts.next()?.parse().ok()?;
    Some((format!("{NS_PREFIX}{pid}-{ctr}"), pid))
}

/// Deletes namespaces left behind by dead topologies: names starting with
/// `hve2e-<pid>-` whose pid is dead, or whose owner lock is no longer held (pid
/// reused), with their temporary directories (`$TMPDIR/hve2e-<pid>-…`) and
/// lock files. Live topologies, also of this process, are left alone. Returns the
/// namespaces deleted. Called by every [`TopologyBuilder::build`].
pub fn cleanup_stale() -> Result<Vec<String>> {
    let mut deleted = Vec::new();
    let mut owners_done = Vec::new();
    for ns in list_namespaces()? {
        let Some((owner, pid)) = parse_owner(&ns) else { continue };
        let stale = !pid_alive(pid) || owner_lock_free(&owner) == Some(true);
        if !stale {
            continue;
        }
        tracing::info!(ns, owner, "deleting stale namespace of a dead test run");
        match destroy_ns(&ns) {
            Ok(()) => deleted.push(ns),
            Err(e) => tracing::warn!(ns, error = %e, "failed to delete stale namespace"),
        }
        if !owners_done.contains(&owner) {
            owners_done.push(owner);
        }
    }
    // Temporary directories (logs, keepalived configurations) and owner lock
    // files of dead owners; a lock file only once none of its namespaces is left.
    let owners_with_ns: Vec<String> =
        list_namespaces()?.iter().filter_map(|ns| parse_owner(ns)).map(|(owner, _)| owner).collect();
    let mut stale_locks = Vec::new();
    for dir in [std::env::temp_dir(), PathBuf::from(STATE_DIR)] {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.filter_map(|e| e.ok()) {
            let Ok(name) = entry.file_name().into_string() else { continue };
            let Some((owner, pid)) = parse_owner(name.trim_end_matches(".lock")) else { continue };
            if !(owners_done.contains(&owner) || !pid_alive(pid) || owner_lock_free(&owner) == Some(true)) {
                continue;
            }
            let path = entry.path();
            if name.ends_with(".lock") {
                if !owners_with_ns.contains(&owner) {
                    stale_locks.push(path);
                }
                continue;
            }
            match std::fs::remove_dir_all(&path) {
                Ok(()) => tracing::debug!(path = %path.display(), "removed stale directory of a dead test run"),
                Err(e) => tracing::debug!(path = %path.display(), error = %e, "cannot remove stale directory"),
            }
        }
    }
    for lock in stale_locks {
        let _ = std::fs::remove_file(lock);
    }
    Ok(deleted)
}

fn lock_file(path: &Path) -> Result<Option<Flock<File>>> {
    let f = File::options()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(|source| NetnsError::Io { op: format!("open {}", path.display()), source })?;
    match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
        Ok(l) => Ok(Some(l)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(NetnsError::Io { op: format!("lock {}", path.display()), source: e.into() }),
    }
}

fn allocate_subnet(seed: u32) -> Result<(u8, Flock<File>)> {
    let span = u32::from(SUBNET_LAST - SUBNET_FIRST) + 1;
    for off in 0..span {
        let k = SUBNET_FIRST + ((seed.wrapping_add(off)) % span) as u8;
        let path = Path::new(STATE_DIR).join(format!("subnet-{k}.lock"));
        if let Some(lock) = lock_file(&path)? {
            return Ok((k, lock));
        }
    }
    Err(NetnsError::NoSubnet)
}

fn v6(k: u8, net: u8, host: u8) -> Ipv6Addr {
    // Written with the decimal digits read as hex, so that `fd00:6876:100::10`
    // matches `10.100.0.10`.
    let hex = |d: u32| -> u16 {
        u16::from_str_radix(&d.to_string(), 16).unwrap_or_default() // digits ≤ 255 always parse
    };
    Ipv6Addr::new(0xfd00, 0x6876, hex(u32::from(k)), hex(u32::from(net)), 0, 0, 0, hex(u32::from(host)))
}

/// Installs (atomically replacing) table `netdev <table>` in `ns` with an ingress
/// and an egress chain per device, each dropping packets that match any of
/// `matches` (an empty match drops everything). `netdev` hooks sit at the device,
/// below IP: a drop there is silent to the sender's socket (UDP `send` succeeds,
/// TCP retransmits), exactly like loss on the wire. (An `inet` OUTPUT drop would
/// instead fail `send`/`connect` with EPERM.) ARP is affected only by an empty
/// match.
fn netdev_drop_table(ns: &str, table: &str, devices: &[&str], matches: &[String]) -> Result<Fault> {
    let mut script = format!("add table netdev {table}\ndelete table netdev {table}\ntable netdev {table} {{\n");
    for (i, dev) in devices.iter().enumerate() {
        for (chain, hook) in [("in", "ingress"), ("out", "egress")] {
            script.push_str(&format!(
                "  chain {chain}{i} {{\n    type filter hook {hook} device \"{dev}\" priority 0; policy accept;\n"
            ));
            for m in matches {
                script.push_str(&format!("    {m} counter drop\n"));
            }
            script.push_str("  }\n");
        }
    }
    script.push_str("}\n");
    exec_in(ns, NFT, &["-f", "-"], Some(&script))?;
    Ok(Fault { ns: ns.to_owned(), family: "netdev".into(), table: table.to_owned() })
}

/// Builds a [`Topology`].
#[derive(Debug, Clone)]
pub struct TopologyBuilder {
    nodes: usize,
    host_port: bool,
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
        TopologyBuilder { nodes: 2, host_port: false }
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

    /// Blocks (or, with `false`, unblocks) node `node`'s TCP traffic to `host_ip:port`
    /// (an API-server outage seen by that node only).
    pub fn block_host_tcp(&self, node: usize, port: u16) -> Result<Fault> {
        self.block_tcp_port(node, port, &[Link::Mgmt])
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

    fn node_checked(&self, node: usize) -> Result<&NodeInfo> {
        self.nodes.get(node).ok_or_else(|| NetnsError::Invalid(format!("no node {node}")))
    }

    fn set_port(&self, port: &str, up: bool) -> Result<()> {
        ip(&self.switch_ns, &["link", "set", port, if up { "up" } else { "down" }]).map(drop)
    }

    /// Pulls a cable: sets the switch-side end of node's `link` down, so the node
    /// sees carrier loss (`NO-CARRIER`, operstate `DOWN`) exactly as with a real
    /// cable, while its interface stays administratively up. Idempotent.
    pub fn cut_cable(&self, node: usize, link: Link) -> Result<()> {
        let n = self.node_checked(node)?;
        tracing::info!(node = %n.name, %link, "cutting cable");
        self.set_port(n.switch_port(link), false)
    }

    /// Plugs the cable back in (switch-side end up). Idempotent.
    pub fn restore_cable(&self, node: usize, link: Link) -> Result<()> {
        let n = self.node_checked(node)?;
        tracing::info!(node = %n.name, %link, "restoring cable");
        self.set_port(n.switch_port(link), true)
    }

    /// Cuts both of a node's cables.
    pub fn cut_node(&self, node: usize) -> Result<()> {
        Link::BOTH.into_iter().try_for_each(|l| self.cut_cable(node, l))
    }

    /// Restores both of a node's cables.
    pub fn restore_node(&self, node: usize) -> Result<()> {
        Link::BOTH.into_iter().try_for_each(|l| self.restore_cable(node, l))
    }

    /// Connects (`true`) or disconnects the gateway from the data switch. Idempotent.
    pub fn set_gateway_up(&self, up: bool) -> Result<()> {
        tracing::info!(up, "gateway");
        self.set_port(&self.gateway.switch_port, up)
    }

    fn install_filter(&self, node: usize, table: String, matches: &[String], links: &[Link]) -> Result<Fault> {
        let n = self.node_checked(node)?;
        if links.is_empty() {
            return Err(NetnsError::Invalid("a fault needs at least one link".into()));
        }
        let mut devices: Vec<&str> = links.iter().map(|l| n.ifname(*l)).collect();
        devices.sort_unstable();
        devices.dedup();
        tracing::info!(node = %n.name, table, "installing fault");
        netdev_drop_table(&n.ns, &table, &devices, matches)
    }

    fn links_tag(links: &[Link]) -> String {
        let mut tags: Vec<&str> = links.iter().map(|l| l.short()).collect();
        tags.sort_unstable();
        tags.dedup();
        tags.join("_")
    }

    /// A heartbeat-only partition: drops UDP to or from `port` on the node's
    /// `links`, both directions, in one nftables table (`netdev
    /// hvfault_udp_<port>_<links>`, ingress and egress hooks on the node's
    /// interfaces) in the node's namespace. The drop is silent, as on a wire: the
    /// sender's `send` succeeds. TCP, ARP and everything else passes. Installing
    /// the same fault twice replaces it.
    pub fn partition_udp_port(&self, node: usize, port: u16, links: &[Link]) -> Result<Fault> {
        let table = format!("{FAULT_TABLE_PREFIX}udp_{port}_{}", Self::links_tag(links));
        self.install_filter(node, table, &[format!("udp dport {port}"), format!("udp sport {port}")], links)
    }

    /// A partition between two nodes only, as a switch fault would make it: on `node`'s
    /// interfaces every frame from or to a MAC of node `peer` is dropped (ARP, heartbeats,
    /// probes through the VIP), in both directions; the gateway, the client and the API
    /// server stay reachable (table `hvfault_peer<peer>`). Install it on both nodes for a
    /// symmetric partition.
    pub fn partition_peer(&self, node: usize, peer: usize) -> Result<Fault> {
        let p = self.node_checked(peer)?;
        let macs = format!("{{ {}, {} }}", p.data_mac, p.mgmt_mac);
        let table = format!("{FAULT_TABLE_PREFIX}peer{peer}");
        self.install_filter(
            node,
            table,
            &[format!("ether saddr {macs}"), format!("ether daddr {macs}")],
            &[Link::Data, Link::Mgmt],
        )
    }

    /// Blackholes a node while its links keep carrier: every frame in and out of both
    /// of its interfaces is dropped, ARP and neighbour discovery included (table
    /// `hvfault_blackhole`), as a dead switch port that still shows link would.
    pub fn blackhole(&self, node: usize) -> Result<Fault> {
        self.install_filter(node, format!("{FAULT_TABLE_PREFIX}blackhole"), &[String::new()], &Link::BOTH)
    }

    /// Drops TCP to or from `port` on the node's `links` (table `hvfault_tcp_…`).
    pub fn block_tcp_port(&self, node: usize, port: u16, links: &[Link]) -> Result<Fault> {
        let table = format!("{FAULT_TABLE_PREFIX}tcp_{port}_{}", Self::links_tag(links));
        self.install_filter(node, table, &[format!("tcp dport {port}"), format!("tcp sport {port}")], links)
    }

    /// Drops every IP packet of protocol `proto` on the node's `links`, e.g. 112
    /// for VRRP (table `hvfault_proto<proto>_…`).
    pub fn block_ip_proto(&self, node: usize, proto: u8, links: &[Link]) -> Result<Fault> {
        let table = format!("{FAULT_TABLE_PREFIX}proto{proto}_{}", Self::links_tag(links));
        self.install_filter(node, table, &[format!("meta l4proto {proto}")], links)
    }

    /// Removes exactly the table of `fault`. Idempotent.
    pub fn heal(&self, fault: &Fault) -> Result<()> {
        tracing::info!(ns = %fault.ns, table = %fault.table, "healing fault");
        let f = &fault.family;
        let t = &fault.table;
        exec_in(&fault.ns, NFT, &["-f", "-"], Some(&format!("add table {f} {t}\ndelete table {f} {t}\n"))).map(drop)
    }

    /// The fault tables present in `ns` (`hvfault_…` and `hvloss_…`).
    pub fn faults_in(&self, ns: &str) -> Result<Vec<Fault>> {
        let out = exec_in(ns, NFT, &["list", "tables"], None)?;
        Ok(out
            .lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                match (w.next(), w.next(), w.next()) {
                    (Some("table"), Some(family), Some(table))
                        if table.starts_with(FAULT_TABLE_PREFIX) || table.starts_with(LOSS_TABLE_PREFIX) =>
                    {
                        Some(Fault { ns: ns.to_owned(), family: family.to_owned(), table: table.to_owned() })
                    }
                    _ => None,
                }
            })
            .collect())
    }

    /// Removes every nftables fault and loss in the topology, restores every
    /// cable and reconnects the gateway.
    pub fn heal_all(&self) -> Result<()> {
        for ns in &self.namespaces {
            for f in self.faults_in(ns)? {
                self.heal(&f)?;
            }
        }
        for i in 0..self.nodes.len() {
            self.restore_node(i)?;
        }
        self.set_gateway_up(true)
    }

    /// Random loss of `percent` % of all frames (ARP included) in both directions
    /// on a node's cable, applied at the switch port with an nftables `netdev`
    /// table (`hvloss_n<i>_<link>`, ingress and egress hooks). 0 removes it; 100
    /// is a silent black hole with carrier still up. (`tc netem` is not in this
    /// machine's kernel, hence nftables.)
    pub fn set_link_loss(&self, node: usize, link: Link, percent: u8) -> Result<Fault> {
        let n = self.node_checked(node)?;
        let port = n.switch_port(link).to_owned();
        let table = format!("{LOSS_TABLE_PREFIX}n{node}_{}", link.short());
        let fault = Fault { ns: self.switch_ns.clone(), family: "netdev".into(), table: table.clone() };
        if percent == 0 {
            self.heal(&fault)?;
            return Ok(fault);
        }
        let rule = if percent >= 100 { String::new() } else { format!("numgen random mod 100 < {percent}") };
        tracing::info!(node = %n.name, %link, percent, "setting link loss");
        netdev_drop_table(&self.switch_ns, &table, &[port.as_str()], &[rule])?;
        Ok(fault)
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
