//! The routed lab: the topology's gateway is a router running FRR (bgpd, bfdd) that
//! peers over eBGP with a BGP speaker on every member — FRR or BIRD, configured the way
//! docs/bgp.md tells users to — and a client in another subnet reaches the VIPs only
//! through it. The members advertise what the agent puts on its dummy interface.

use crate::host::netns::Topology;
use crate::host::routing::{Bird, Frr, RoutingError};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// The router's AS.
pub const ROUTER_ASN: u32 = 64512;
/// The members' AS (one for all: a VIP a member learns back from the router is refused
/// as an AS-path loop, so no member routes a VIP towards the router).
pub const NODE_ASN: u32 = 64600;
/// The BFD profile's interval (ms), × 3: 100, or `$HAVIP_LAB_BFD_MS` (10..=1000) — the
/// bound of an unplanned routed move, which a benchmark may want to vary.
pub fn bfd_interval_ms() -> u32 {
    std::env::var("HAVIP_LAB_BFD_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|v| (10..=1000).contains(v))
        .unwrap_or(100)
}

/// The BFD profile's name.
pub const BFD_PROFILE: &str = "havip";

/// The BGP speaker on the members.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Speaker {
    /// FRR (zebra, bgpd, bfdd).
    Frr,
    /// BIRD 2.
    Bird,
}

/// A member's BGP speaker.
pub enum NodeSpeaker {
    /// FRR.
    Frr(Frr),
    /// BIRD.
    Bird(Bird),
}

/// The routing daemons of a lab: the router and one speaker per member.
pub struct Routing {
    /// FRR on the gateway.
    pub router: Frr,
    /// One per member, in member order.
    pub nodes: Vec<NodeSpeaker>,
}

/// The router's `frr.conf`: eBGP with every member (graceful restart; with `bfd_ms`, the
/// BFD profile at that interval × 3 on every session). FRR's `datacenter` defaults:
/// keepalive 3 s, hold 9 s, paths of the same length from one AS shared (ECMP) unless
/// their MEDs differ (members in one AS: MEDs compared).
pub fn router_config(topo: &Topology, bfd_ms: Option<u32>) -> String {
    let gw = topo.gateway().ip;
    let interval = bfd_ms.unwrap_or_else(bfd_interval_ms);
    let profile = |group: &str| match bfd_ms {
        Some(_) => format!(" neighbor {group} bfd profile {BFD_PROFILE}\n"),
        None => String::new(),
    };
    let mut c = format!(
        "frr defaults datacenter\nhostname router\n!\nbfd\n profile {BFD_PROFILE}\n  detect-multiplier 3\n  \
         receive-interval {interval}\n  transmit-interval {interval}\n !\n!\nrouter bgp {ROUTER_ASN}\n bgp router-id {gw}\n \
         no bgp ebgp-requires-policy\n bgp graceful-restart\n neighbor MEMBERS peer-group\n \
         neighbor MEMBERS remote-as {NODE_ASN}\n{members}\
         neighbor MEMBERS6 peer-group\n neighbor MEMBERS6 remote-as {NODE_ASN}\n{members6}",
        members = profile("MEMBERS"),
        members6 = profile("MEMBERS6"),
    );
    for n in topo.nodes() {
        c.push_str(&format!(
            " neighbor {} peer-group MEMBERS\n neighbor {} peer-group MEMBERS6\n",
            n.data_ip, n.data_ip6
        ));
    }
    // IPv4 routes over the IPv4 sessions, IPv6 routes over the IPv6 ones.
    c.push_str(
        " address-family ipv4 unicast\n  no neighbor MEMBERS6 activate\n exit-address-family\n \
         address-family ipv6 unicast\n  neighbor MEMBERS6 activate\n exit-address-family\n!\n",
    );
    c
}

/// A member's `frr.conf`, as docs/bgp.md has it: the connected routes of `havip0`, and
/// nothing else, advertised to the router (BFD at `bfd` ms × 3); and the backup paths
/// (HAPair `bgpBackupPaths`): the routes of table [`BACKUP_TABLE`] imported and
/// advertised with a worse preference (the worst MED, the AS path prepended twice) and
/// this member as their next hop (IPv4: FRR 8.4 imports no IPv6 table).
///
/// [`BACKUP_TABLE`]: havip_node_agent::announce::bgp::BACKUP_TABLE
pub fn node_frr_config(topo: &Topology, i: usize, bfd: u32) -> String {
    let n = topo.node(i);
    let (gw, gw6) = (topo.gateway().ip, topo.gateway().ip6);
    format!(
        "frr defaults datacenter\nhostname {name}\nzebra work-queue 1\nip import-table {table}\n!\nbfd\n profile {BFD_PROFILE}\n  \
         detect-multiplier 3\n  receive-interval {bfd}\n  transmit-interval {bfd}\n !\n!\n\
         route-map HAVIP-VIPS permit 10\n match interface {link}\n!\n\
         route-map HAVIP-BACKUP permit 10\n set metric 4294967295\n set as-path prepend {NODE_ASN} {NODE_ASN}\n!\n\
         router bgp {NODE_ASN}\n bgp router-id {id}\n no bgp ebgp-requires-policy\n bgp graceful-restart\n \
         neighbor {gw} remote-as {ROUTER_ASN}\n neighbor {gw} bfd profile {BFD_PROFILE}\n \
         neighbor {gw6} remote-as {ROUTER_ASN}\n neighbor {gw6} bfd profile {BFD_PROFILE}\n \
         address-family ipv4 unicast\n  redistribute connected route-map HAVIP-VIPS\n  \
         redistribute table {table} route-map HAVIP-BACKUP\n  neighbor {gw} next-hop-self\n  no neighbor {gw6} activate\n \
         exit-address-family\n address-family ipv6 unicast\n  redistribute connected route-map HAVIP-VIPS\n  \
         neighbor {gw6} activate\n exit-address-family\n!\n",
        name = n.name,
        link = havip_node_agent::announce::bgp::LINK,
        table = havip_node_agent::announce::bgp::BACKUP_TABLE,
        id = n.data_ip,
    )
}

/// A member's `bird.conf`, as docs/bgp.md has it: the addresses of `havip0`, and the
/// backup paths learnt from table [`BACKUP_TABLE`] exported with the AS path prepended
/// twice and the worst MED, this member as their next hop.
///
/// [`BACKUP_TABLE`]: havip_node_agent::announce::bgp::BACKUP_TABLE
pub fn node_bird_config(topo: &Topology, i: usize) -> String {
    let n = topo.node(i);
    let gw = topo.gateway().ip;
    format!(
        "router id {id};\nprotocol device {{ scan time 1; }}\n\
         protocol direct havip {{\n  ipv4;\n  interface \"{link}\";\n}}\n\
         protocol kernel havip_backup {{\n  ipv4 {{ import all; export none; }};\n  kernel table {table};\n  \
         learn;\n  scan time 1;\n}}\n\
         protocol bgp upstream {{\n  local {id} as {NODE_ASN};\n  neighbor {gw} as {ROUTER_ASN};\n  \
         graceful restart on;\n  ipv4 {{\n    import none;\n    next hop self;\n    export filter {{\n      \
         if proto = \"havip\" then accept;\n      if proto = \"havip_backup\" then {{\n        \
         bgp_path.prepend({NODE_ASN}); bgp_path.prepend({NODE_ASN}); bgp_med = 4294967295; accept;\n      }}\n      \
         reject;\n    }};\n  }};\n}}\n",
        id = n.data_ip,
        link = havip_node_agent::announce::bgp::LINK,
        table = havip_node_agent::announce::bgp::BACKUP_TABLE,
    )
}

impl Routing {
    /// Starts the router and a speaker on every member, BFD at [`bfd_interval_ms`], and
    /// waits until every session is Established.
    pub fn start(topo: &Topology, speaker: Speaker) -> Result<Self, RoutingError> {
        Self::start_with(topo, speaker, bfd_interval_ms())
    }

    /// [`Routing::start`] with BFD at `bfd_ms` × 3.
    pub fn start_with(topo: &Topology, speaker: Speaker, bfd_ms: u32) -> Result<Self, RoutingError> {
        let name = format!("{}-router", topo.prefix());
        let router = Frr::start(&topo.gateway().ns, &name, &router_config(topo, Some(bfd_ms)))?;
        let mut nodes = Vec::new();
        for (i, n) in topo.nodes().iter().enumerate() {
            let name = format!("{}-{}", topo.prefix(), n.name);
            nodes.push(match speaker {
                Speaker::Frr => NodeSpeaker::Frr(Frr::start(&n.ns, &name, &node_frr_config(topo, i, bfd_ms))?),
                Speaker::Bird => NodeSpeaker::Bird(Bird::start(&n.ns, &name, &node_bird_config(topo, i))?),
            });
        }
        let routing = Routing { router, nodes };
        for n in topo.nodes() {
            let peer = n.data_ip.to_string();
            crate::host::routing::wait_for(
                &format!("the router's session with {}", n.name),
                Duration::from_secs(30),
                || routing.router.established(&peer),
            )?;
        }
        Ok(routing)
    }

    /// The environment that points member `i`'s agent at its speaker's control socket
    /// (`--bgp-speaker`, `--frr-vty-dir` / `--bird-socket`).
    pub fn agent_env(&self, i: usize) -> Vec<(String, String)> {
        let env = |k: &str, v: String| (k.to_owned(), v);
        match self.nodes.get(i) {
            Some(NodeSpeaker::Frr(f)) => {
                vec![env("HAVIP_BGP_SPEAKER", "frr".into()), env("HAVIP_FRR_VTY_DIR", f.dir().display().to_string())]
            }
            Some(NodeSpeaker::Bird(b)) => vec![
                env("HAVIP_BGP_SPEAKER", "bird".into()),
                env("HAVIP_BIRD_SOCKET", b.dir().join("bird.ctl").display().to_string()),
            ],
            None => Vec::new(),
        }
    }

    /// The router's best next hops for `prefix`.
    pub fn best_next_hops(&self, prefix: &str) -> Vec<String> {
        self.router.best_next_hops(prefix).unwrap_or_default()
    }

    /// Waits (every 20 ms) until the router's only best next hop of the host route to
    /// `ip` is `hop`; how long that took.
    pub fn wait_routed(&self, ip: IpAddr, hop: IpAddr, timeout: Duration) -> Result<Duration, RoutingError> {
        let prefix = format!("{ip}/{}", havip_node_agent::netlink::host_prefix(ip));
        let want = vec![hop.to_string()];
        let start = Instant::now();
        while self.best_next_hops(&prefix) != want {
            if start.elapsed() > timeout {
                let what = format!("the router to route {prefix} to {hop} (it has {:?})", self.best_next_hops(&prefix));
                return Err(RoutingError::Timeout { what, timeout });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(start.elapsed())
    }

    /// The logs of every daemon, for a failure message.
    pub fn diagnostics(&self) -> String {
        let mut out = self.router.logs_tail(15);
        for n in &self.nodes {
            match n {
                NodeSpeaker::Frr(f) => out.push_str(&f.logs_tail(10)),
                NodeSpeaker::Bird(b) => out.push_str(&b.log_tail(10)),
            }
        }
        out
    }
}
