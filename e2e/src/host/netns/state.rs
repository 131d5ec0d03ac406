//! The state of a namespace: its links, addresses and neighbour entries (from `ip -j`),
//! its sysctls (read and written through `/proc/sys` from inside it), and waiting for a
//! condition on them.

use super::command::ip_json;
use super::error::{NetnsError, Result};
use super::thread::in_netns;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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
    /// Its preferred lifetime is over (never a source address for new connections).
    pub deprecated: bool,
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

fn sysctl_path(key: &str) -> PathBuf {
    Path::new("/proc/sys").join(key.replace('.', "/"))
}

/// Writes sysctls in `ns` through `/proc/sys` from a thread inside the namespace
/// (`/proc/sys/net` shows the network namespace of the reading thread), so no
/// `sysctl` binary is needed.
pub(super) fn sysctls(ns: &str, settings: &[(&str, &str)]) -> Result<()> {
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

/// The interface index of `dev` in `ns`.
pub fn link_index(ns: &str, dev: &str) -> Result<u32> {
    let v = ip_json(ns, &["link", "show", "dev", dev])?;
    v.get(0).and_then(|l| l.get("ifindex")).and_then(|i| i.as_u64()).and_then(|i| u32::try_from(i).ok()).ok_or_else(
        || NetnsError::Parse { cmd: format!("ip -n {ns} -j link show dev {dev}"), reason: "no ifindex".into() },
    )
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
                deprecated: flag("deprecated"),
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

/// Resolves `ip` on `dev` in `ns` (see [`resolve_neighbour`]) and pins the entry to the
/// MAC it resolved to (`nud permanent`): from now on that host ignores every
/// announcement for `ip`, as a router with a static ARP entry does. Returns the MAC.
pub fn pin_neighbour(ns: &str, dev: &str, ip: IpAddr, timeout: Duration) -> Result<String> {
    let mac = resolve_neighbour(ns, dev, ip, timeout)?;
    super::command::exec(
        ns,
        "ip",
        &["neigh", "replace", &ip.to_string(), "lladdr", &mac, "dev", dev, "nud", "permanent"],
    )?;
    Ok(mac)
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
