//! Faults of a [`Topology`], each with an idempotent inverse: cables cut, the gateway
//! unplugged, silent drops of chosen traffic in one `netdev` nftables table per fault,
//! and random loss at a switch port.

use super::command::{NFT, exec_in};
use super::error::{NetnsError, Result};
use super::layout::Link;
use super::topology::Topology;

const FAULT_TABLE_PREFIX: &str = "hvfault_";
const LOSS_TABLE_PREFIX: &str = "hvloss_";

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

/// Installs (atomically replacing) table `netdev <table>` in `ns` with an ingress
/// and an egress chain per device, each dropping packets that match any of
/// `matches` (an empty match drops everything). `netdev` hooks sit at the device,
/// below IP: a drop there is silent to the sender's socket (UDP `send` succeeds,
/// TCP retransmits), exactly like loss on the wire. (An `inet` OUTPUT drop would
/// instead fail `send`/`connect` with EPERM.) ARP is affected only by an empty
/// match.
fn netdev_drop_table(ns: &str, table: &str, devices: &[&str], matches: &[String]) -> Result<Fault> {
    netdev_drop_table_hooks(ns, table, devices, matches, &[("in", "ingress"), ("out", "egress")])
}

/// [`netdev_drop_table`] with a chain at only the given `(name, hook)`s.
fn netdev_drop_table_hooks(
    ns: &str,
    table: &str,
    devices: &[&str],
    matches: &[String],
    hooks: &[(&str, &str)],
) -> Result<Fault> {
    let mut script = format!("add table netdev {table}\ndelete table netdev {table}\ntable netdev {table} {{\n");
    for (i, dev) in devices.iter().enumerate() {
        for &(chain, hook) in hooks {
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

impl Topology {
    /// Blocks (or, with `false`, unblocks) node `node`'s TCP traffic to `host_ip:port`
    /// (an API-server outage seen by that node only).
    pub fn block_host_tcp(&self, node: usize, port: u16) -> Result<Fault> {
        self.block_tcp_port(node, port, &[Link::Mgmt])
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

    /// Cuts a node off the way a dead node goes: the management cable first, then the data
    /// cable. ([`Topology::cut_node`] goes the other way: a holder that sees its data
    /// carrier drop hands the VIPs over the management path in the moments before that
    /// cable goes too — a planned move the cut then interrupts, not a takeover.)
    pub fn kill_node_links(&self, node: usize) -> Result<()> {
        self.cut_cable(node, Link::Mgmt)?;
        self.cut_cable(node, Link::Data)
    }

    /// Restores both of a node's cables.
    pub fn restore_node(&self, node: usize) -> Result<()> {
        Link::BOTH.into_iter().try_for_each(|l| self.restore_cable(node, l))
    }

    /// Connects (`true`) or disconnects the gateway from the data switch. Idempotent.
    pub fn set_gateway_up(&self, up: bool) -> Result<()> {
        tracing::info!(up, "gateway");
        self.set_port(&self.gateway().switch_port, up)
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
        for ns in self.namespaces() {
            for f in self.faults_in(ns)? {
                self.heal(&f)?;
            }
        }
        for i in 0..self.nodes().len() {
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
        let fault = Fault { ns: self.switch_ns().to_owned(), family: "netdev".into(), table: table.clone() };
        if percent == 0 {
            self.heal(&fault)?;
            return Ok(fault);
        }
        let rule = if percent >= 100 { String::new() } else { format!("numgen random mod 100 < {percent}") };
        tracing::info!(node = %n.name, %link, percent, "setting link loss");
        netdev_drop_table(self.switch_ns(), &table, &[port.as_str()], &[rule])?;
        Ok(fault)
    }

    /// An nftables table on node `node`'s switch port of `link` dropping the frames towards
    /// the node that match any of `rules` (egress of the switch port; nothing else is
    /// touched).
    fn drop_towards(&self, node: usize, link: Link, table: &str, rules: &[String]) -> Result<Fault> {
        let n = self.node_checked(node)?;
        netdev_drop_table_hooks(self.switch_ns(), table, &[n.switch_port(link)], rules, &[("out", "egress")])
    }

    /// Drops every ARP frame and every IPv6 neighbour advertisement towards node `node`
    /// on its `link`, at the switch port (`hvfault_nd_n<i>_<link>`): the node's ARP
    /// requests and neighbour solicitations go out and nothing answers them — its gateway
    /// check fails — while other traffic passes both ways (a routed member keeps its BGP
    /// session; its neighbour entry for the router stays until it expires).
    pub fn drop_neighbour_answers_towards(&self, node: usize, link: Link) -> Result<Fault> {
        tracing::info!(node, %link, "dropping ARP and neighbour advertisements towards the node");
        let rules = [
            "meta protocol arp".to_owned(),
            "meta protocol ip6 meta l4proto ipv6-icmp icmpv6 type nd-neighbor-advert".to_owned(),
        ];
        self.drop_towards(node, link, &format!("{FAULT_TABLE_PREFIX}nd_n{node}_{}", link.short()), &rules)
    }

    /// Drops the ARP replies from `from` that answer node `node`'s kernel (their target
    /// address is the node's own on `link`), at the switch port (`hvfault_arpreply_n<i>_<link>`):
    /// the node's kernel never resolves `from`, while an ARP probe's reply (target address
    /// 0.0.0.0, RFC 5227) still gets through — a kernel's request whose answer was lost,
    /// deterministically.
    pub fn drop_kernel_arp_replies_towards(&self, node: usize, link: Link, from: std::net::Ipv4Addr) -> Result<Fault> {
        let own = self.node_checked(node)?.ip(link);
        let rule = format!("meta protocol arp arp operation reply arp saddr ip {from} arp daddr ip {own}");
        tracing::info!(node, %link, %from, "dropping the ARP replies to the node's kernel");
        self.drop_towards(node, link, &format!("{FAULT_TABLE_PREFIX}arpreply_n{node}_{}", link.short()), &[rule])
    }

    /// Drops three of every four TCP SYN-ACKs from `from` port `port` towards node `node`
    /// on its `link`, at the switch port (`hvfault_synack_n<i>_<link>`, a counter, not
    /// chance: every fourth passes): the node's connects to that address mostly time out
    /// as on a lossy cable, yet some are answered, while everything else passes (RSTs
    /// included).
    pub fn drop_most_syn_acks_towards(
        &self,
        node: usize,
        link: Link,
        from: std::net::IpAddr,
        port: u16,
    ) -> Result<Fault> {
        let family = if from.is_ipv4() { "ip" } else { "ip6" };
        let rule = format!(
            "{family} saddr {from} tcp sport {port} tcp flags & (syn | ack) == syn | ack numgen inc mod 4 != 0"
        );
        tracing::info!(node, %link, %from, port, "dropping most SYN-ACKs towards the node");
        self.drop_towards(node, link, &format!("{FAULT_TABLE_PREFIX}synack_n{node}_{}", link.short()), &[rule])
    }

    /// Random loss of `percent` % of the frames in one direction only on a node's
    /// cable, at the switch port (`hvloss_n<i>_<link>_to` for frames towards the node,
    /// `…_from` for frames from it): a one-way fault, as a bad transceiver makes it.
    /// 100 drops every frame that way, ARP included.
    pub fn set_link_loss_one_way(&self, node: usize, link: Link, percent: u8, towards_node: bool) -> Result<Fault> {
        let n = self.node_checked(node)?;
        let port = n.switch_port(link).to_owned();
        let (dir, hook) = if towards_node { ("to", ("out", "egress")) } else { ("from", ("in", "ingress")) };
        let table = format!("{LOSS_TABLE_PREFIX}n{node}_{}_{dir}", link.short());
        let rule = if percent >= 100 { String::new() } else { format!("numgen random mod 100 < {percent}") };
        tracing::info!(node = %n.name, %link, percent, dir, "setting one-way link loss");
        netdev_drop_table_hooks(self.switch_ns(), &table, &[port.as_str()], &[rule], &[hook])
    }
}
