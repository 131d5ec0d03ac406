//! Prometheus metrics of the agent. Label values come from bounded sets (path names
//! from the configuration, reason/role/kind constants), never from `{:?}` of data.

use prometheus_client::encoding::EncodeLabelSet;
pub use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::{Arc, Mutex};

/// Labels: a pair and one of its heartbeat paths.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PathLabel {
    /// The pair.
    pub pair: String,
    /// Path name.
    pub path: String,
}

/// Labels: a dropped heartbeat.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabels {
    /// The pair the datagram names (empty when it names none this agent runs, or none).
    pub pair: String,
    /// Path name (the local address when the pair is unknown).
    pub path: String,
    /// Why (truncated, oversized, bad_magic, unknown_pair, unknown_key, bad_mac,
    /// unsupported_major, malformed, replayed, retired_session, unconfirmed_session,
    /// stale, unknown_sender, own).
    pub reason: String,
}

/// Label: a pair.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PairLabel {
    /// The pair.
    pub pair: String,
}

/// Labels: a pair and a role, reason, kind or alarm constant.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PairNameLabel {
    /// The pair.
    pub pair: String,
    /// The value.
    pub name: String,
}

/// Label: a category constant.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NameLabel {
    /// The value.
    pub name: String,
}

/// Labels: a watch event the Kubernetes agent received.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchLabels {
    /// The kind watched (`HAPair`, `FloatingIP`, `Node`, `Secret`, `Lease`).
    pub kind: String,
    /// `applied` or `deleted` (a watch event), `listed` (an object of a list).
    pub event: String,
}

/// Labels: a probe result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    /// The pair.
    pub pair: String,
    /// `peer` (through the VIP) or `local` (own listener).
    pub kind: String,
    /// `up` or `down`.
    pub result: String,
}

/// Every category of `havip_agent_io_errors_total` (the `io_error` calls' own and what the
/// netlink, nftables and drain errors' `category()` name): each starts at 0, so that a
/// dashboard or alert tells "no errors" from "not scraped". A test checks the list against
/// the source.
pub const IO_ERROR_CATEGORIES: &[&str] = &[
    // The io_error call sites' own.
    "announce",
    "drain",
    "guard",
    "heartbeat_queue_full",
    "heartbeat_recv",
    "heartbeat_send",
    "lease_cas_late",
    "link_events",
    "pair_start",
    "persist",
    "reconfigure",
    // DrainError::category.
    "ledger",
    "no_own_address",
    "task",
    // NetlinkError::category.
    "add_address",
    "add_link",
    "backup_route",
    "holder_route",
    "del_address",
    "link_not_found",
    "list",
    "local_route",
    "neighbours",
    "no_interface",
    "not_ours",
    "open",
    "sysctl",
    "virtual_link_taken",
    // NftError::category ("open" as well).
    "dump",
    "invalid",
    "io",
    "kernel",
    "permission",
    "remove",
    "timeout",
];

/// Buckets of the heartbeat round-trip time, seconds: from a quiet LAN (≈ 0.1 ms) to a
/// path that costs a Fast pair its timeout.
pub const RTT_BUCKETS: [f64; 12] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0];

fn rtt_histogram() -> Histogram {
    Histogram::new(RTT_BUCKETS)
}

/// Every metric of the agent. Everything about a pair carries a `pair` label: one agent
/// serves every pair of its node.
pub struct AgentMetrics {
    registry: Mutex<Registry>,
    /// Heartbeats sent, per pair and path.
    pub heartbeats_sent: Family<PathLabel, Counter>,
    /// Authentic heartbeats accepted, per pair and path.
    pub heartbeats_received: Family<PathLabel, Counter>,
    /// Datagrams dropped, per pair, path and reason.
    pub heartbeats_dropped: Family<DropLabels, Counter>,
    /// Heartbeat round-trip time, per pair and path (from the peers' echoes).
    pub heartbeat_rtt: Family<PathLabel, Histogram>,
    /// 1 for the current role, 0 for the others.
    pub role: Family<PairNameLabel, Gauge>,
    /// The epoch this member knows.
    pub epoch: Family<PairLabel, Gauge>,
    /// Role changes, per reason.
    pub transitions: Family<PairNameLabel, Counter>,
    /// VIPs held in the kernel.
    pub vips_held: Family<PairLabel, Gauge>,
    /// Gratuitous ARPs / NAs sent, per kind (`garp`, `na`; to one neighbour: `arp_unicast`, `na_unicast`).
    pub announcements: Family<PairNameLabel, Counter>,
    /// Data-plane probe results.
    pub probes: Family<ProbeLabels, Counter>,
    /// Foreign MACs seen answering for a held VIP.
    pub conflicts: Family<PairLabel, Counter>,
    /// 1 while an alarm is raised.
    pub alarms: Family<PairNameLabel, Gauge>,
    /// Errors of I/O operations, per category.
    pub io_errors: Family<NameLabel, Counter>,
    /// Heartbeat datagrams sent, per kind: `single` (one pair's heartbeat) or `bundle`
    /// (several pairs' heartbeats to the same member address).
    pub heartbeat_datagrams: Family<NameLabel, Counter>,
    /// Authentic heartbeats the state machine ignored for an epoch outside the domain.
    pub adverts_ignored: Family<PairLabel, Gauge>,
    /// Objects the Kubernetes agent's watches delivered, per kind and event.
    pub watch_events: Family<WatchLabels, Counter>,
    /// 1 while this member drains (old holder) or forwards a drain (new holder).
    pub drain_active: Family<PairLabel, Gauge>,
    /// Routed VIPs: 1 while the node's BGP speaker answers.
    pub bgp_speaker_up: Family<PairLabel, Gauge>,
    /// Routed VIPs: the speaker's established BGP sessions.
    pub bgp_sessions_established: Family<PairLabel, Gauge>,
    /// Routed VIPs: the speaker's BGP sessions.
    pub bgp_sessions: Family<PairLabel, Gauge>,
    /// Routed VIPs held here that the speaker advertises to at least one peer.
    pub bgp_vips_advertised: Family<PairLabel, Gauge>,
    /// Routed VIPs: routes handed to the speaker or taken back (`name`: advertised,
    /// withdrawn, backup_advertised, backup_withdrawn).
    pub bgp_route_changes: Family<PairNameLabel, Counter>,
    /// Packets of the old holder's connections forwarded to it (new holder).
    pub drain_forwarded_packets: Family<PairLabel, Counter>,
    /// Bytes of the old holder's connections forwarded to it (new holder).
    pub drain_forwarded_bytes: Family<PairLabel, Counter>,
    /// Established connections on the drained VIPs (old holder).
    pub drain_connections: Family<PairLabel, Gauge>,
    /// Connections still open when a drain ended (they lose their path).
    pub drain_connections_cut: Family<PairLabel, Counter>,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl AgentMetrics {
    /// Registers every metric under the `havip_agent_` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("havip_agent");
        let m = Self {
            registry: Mutex::new(Registry::default()),
            heartbeats_sent: Family::default(),
            heartbeats_received: Family::default(),
            heartbeats_dropped: Family::default(),
            heartbeat_rtt: Family::new_with_constructor(rtt_histogram),
            role: Family::default(),
            epoch: Family::default(),
            transitions: Family::default(),
            vips_held: Family::default(),
            announcements: Family::default(),
            probes: Family::default(),
            conflicts: Family::default(),
            alarms: Family::default(),
            io_errors: Family::default(),
            heartbeat_datagrams: Family::default(),
            adverts_ignored: Family::default(),
            watch_events: Family::default(),
            drain_active: Family::default(),
            bgp_speaker_up: Family::default(),
            bgp_sessions_established: Family::default(),
            bgp_sessions: Family::default(),
            bgp_vips_advertised: Family::default(),
            bgp_route_changes: Family::default(),
            drain_forwarded_packets: Family::default(),
            drain_forwarded_bytes: Family::default(),
            drain_connections: Family::default(),
            drain_connections_cut: Family::default(),
        };
        registry.register("heartbeats_sent", "Heartbeats sent", m.heartbeats_sent.clone());
        registry.register("heartbeats_received", "Authentic heartbeats accepted", m.heartbeats_received.clone());
        registry.register("heartbeats_dropped", "Heartbeat datagrams dropped", m.heartbeats_dropped.clone());
        registry.register(
            "heartbeat_rtt_seconds",
            "Heartbeat round-trip time per path: a heartbeat sent until the peer's echo of it came back on the same path, less the time the peer held it",
            m.heartbeat_rtt.clone(),
        );
        registry.register("role", "1 for the member's current role", m.role.clone());
        registry.register("epoch", "Pair epoch known to this member", m.epoch.clone());
        registry.register("role_transitions", "Role changes of this member", m.transitions.clone());
        registry.register("vips_held", "VIPs held in the kernel", m.vips_held.clone());
        registry.register("announcements", "Gratuitous ARPs and unsolicited NAs sent", m.announcements.clone());
        registry.register("probes", "Data-plane probe results", m.probes.clone());
        registry.register("vip_conflicts", "Foreign MACs answering for a held VIP", m.conflicts.clone());
        registry.register("alarms", "1 while an alarm is raised", m.alarms.clone());
        for name in IO_ERROR_CATEGORIES {
            let _ = m.io_errors.get_or_create(&NameLabel { name: (*name).to_owned() });
        }
        registry.register("io_errors", "Errors of I/O operations", m.io_errors.clone());
        registry.register(
            "heartbeat_datagrams_sent",
            "Heartbeat datagrams sent: single (one pair's heartbeat) or bundle (several pairs' to one member address)",
            m.heartbeat_datagrams.clone(),
        );
        registry.register(
            "heartbeats_ignored_epoch",
            "Authentic heartbeats ignored for an epoch above 2147483647 (since start)",
            m.adverts_ignored.clone(),
        );
        registry.register(
            "watch_events",
            "Objects delivered by the Kubernetes watches (applied, deleted, listed)",
            m.watch_events.clone(),
        );
        registry.register("drain_active", "1 while this member drains or forwards a drain", m.drain_active.clone());
        registry.register(
            "bgp_speaker_up",
            "Routed VIPs: 1 while the node's BGP speaker answers on its control socket",
            m.bgp_speaker_up.clone(),
        );
        registry.register(
            "bgp_sessions_established",
            "Routed VIPs: BGP sessions of the node's speaker that are established",
            m.bgp_sessions_established.clone(),
        );
        registry.register("bgp_sessions", "Routed VIPs: BGP sessions of the node's speaker", m.bgp_sessions.clone());
        registry.register(
            "bgp_vips_advertised",
            "Routed VIPs held here that the node's speaker advertises to at least one peer",
            m.bgp_vips_advertised.clone(),
        );
        registry.register(
            "bgp_route_changes",
            "Routed VIPs: routes this member handed to its BGP speaker or took back (advertised, withdrawn, backup_advertised, backup_withdrawn)",
            m.bgp_route_changes.clone(),
        );
        registry.register(
            "drain_forwarded_packets",
            "Packets of the old holder's connections forwarded to it during drains",
            m.drain_forwarded_packets.clone(),
        );
        registry.register(
            "drain_forwarded_bytes",
            "Bytes of the old holder's connections forwarded to it during drains",
            m.drain_forwarded_bytes.clone(),
        );
        registry.register(
            "drain_connections",
            "Established connections on the VIPs this member drains",
            m.drain_connections.clone(),
        );
        registry.register(
            "drain_connections_cut",
            "Connections still open when a drain ended (they lose their path)",
            m.drain_connections_cut.clone(),
        );
        *m.registry.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = registry;
        m
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let reg = self.registry.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if prometheus_client::encoding::text::encode(&mut out, &reg).is_err() {
            out.clear();
        }
        out
    }

    /// Counts a dropped datagram.
    pub fn dropped(&self, pair: &str, path: &str, reason: &str) {
        self.heartbeats_dropped
            .get_or_create(&DropLabels { pair: pair.to_owned(), path: path.to_owned(), reason: reason.to_owned() })
            .inc();
    }

    /// Counts a heartbeat datagram sent (`single` or `bundle`).
    pub fn datagram_sent(&self, kind: &str) {
        self.heartbeat_datagrams.get_or_create(&NameLabel { name: kind.to_owned() }).inc();
    }

    /// Counts an I/O error.
    pub fn io_error(&self, category: &str) {
        self.io_errors.get_or_create(&NameLabel { name: category.to_owned() }).inc();
    }

    /// Counts an object a watch delivered.
    pub fn watch_event(&self, kind: &str, event: &str) {
        self.watch_events.get_or_create(&WatchLabels { kind: kind.to_owned(), event: event.to_owned() }).inc();
    }

    /// The metrics of one pair.
    pub fn pair(self: &Arc<Self>, pair: &str) -> PairMetrics {
        PairMetrics { all: self.clone(), pair: pair.to_owned() }
    }
}

/// The metrics of one pair: the agent's families with the pair's label filled in.
#[derive(Clone)]
pub struct PairMetrics {
    all: Arc<AgentMetrics>,
    pair: String,
}

impl PairMetrics {
    fn named(&self, name: &str) -> PairNameLabel {
        PairNameLabel { pair: self.pair.clone(), name: name.to_owned() }
    }
    fn label(&self) -> PairLabel {
        PairLabel { pair: self.pair.clone() }
    }
    /// The counter of heartbeats sent on `path` (kept by the endpoint: no label lookup per
    /// heartbeat).
    pub fn sent_counter(&self, path: &str) -> Counter {
        self.all.heartbeats_sent.get_or_create(&PathLabel { pair: self.pair.clone(), path: path.to_owned() }).clone()
    }
    /// The counter of authentic heartbeats accepted on `path`.
    pub fn received_counter(&self, path: &str) -> Counter {
        self.all
            .heartbeats_received
            .get_or_create(&PathLabel { pair: self.pair.clone(), path: path.to_owned() })
            .clone()
    }
    /// A round trip measured on `path`.
    pub fn rtt(&self, path: &str, rtt: std::time::Duration) {
        self.all
            .heartbeat_rtt
            .get_or_create(&PathLabel { pair: self.pair.clone(), path: path.to_owned() })
            .observe(rtt.as_secs_f64());
    }
    /// A datagram naming this pair dropped on `path`.
    pub fn dropped(&self, path: &str, reason: &str) {
        self.all.dropped(&self.pair, path, reason);
    }
    /// An I/O error (process-wide categories).
    pub fn io_error(&self, category: &str) {
        self.all.io_error(category);
    }
    /// Sets the role gauges so that only `role` is 1.
    pub fn set_role(&self, role: &str, all: &[&str]) {
        for r in all {
            self.all.role.get_or_create(&self.named(r)).set(i64::from(*r == role));
        }
    }
    /// The epoch this member knows.
    pub fn set_epoch(&self, epoch: u64) {
        self.all.epoch.get_or_create(&self.label()).set(i64::try_from(epoch).unwrap_or(i64::MAX));
    }
    /// VIPs held in the kernel.
    pub fn set_vips_held(&self, n: usize) {
        self.all.vips_held.get_or_create(&self.label()).set(n as i64);
    }
    /// A role change for `reason`.
    pub fn transition(&self, reason: &str) {
        self.all.transitions.get_or_create(&self.named(reason)).inc();
    }
    /// An announcement of `kind` (`garp`, `na`, `arp_unicast`, `na_unicast`) sent.
    pub fn announced(&self, kind: &str) {
        self.all.announcements.get_or_create(&self.named(kind)).inc();
    }
    /// A probe result.
    pub fn probe(&self, kind: &str, up: bool) {
        let l = ProbeLabels {
            pair: self.pair.clone(),
            kind: kind.to_owned(),
            result: if up { "up" } else { "down" }.to_owned(),
        };
        self.all.probes.get_or_create(&l).inc();
    }
    /// A foreign MAC answering for a held VIP.
    pub fn conflict(&self) {
        self.all.conflicts.get_or_create(&self.label()).inc();
    }
    /// Authentic heartbeats ignored for an epoch outside the domain (since start).
    pub fn set_adverts_ignored(&self, n: u64) {
        self.all.adverts_ignored.get_or_create(&self.label()).set(i64::try_from(n).unwrap_or(i64::MAX));
    }
    /// Raises (1) or clears (0) an alarm gauge.
    pub fn set_alarm(&self, alarm: &str, on: bool) {
        self.all.alarms.get_or_create(&self.named(alarm)).set(i64::from(on));
    }
    /// What the node's BGP speaker said (pairs with routed VIPs): whether it answered,
    /// its sessions, how many of them are established, and how many held VIPs it
    /// advertises.
    pub fn set_speaker(&self, up: bool, sessions: usize, established: usize, advertised: usize) {
        let n = |x: usize| i64::try_from(x).unwrap_or(i64::MAX);
        self.all.bgp_speaker_up.get_or_create(&self.label()).set(i64::from(up));
        self.all.bgp_sessions_established.get_or_create(&self.label()).set(n(established));
        self.all.bgp_sessions.get_or_create(&self.label()).set(n(sessions));
        self.all.bgp_vips_advertised.get_or_create(&self.label()).set(n(advertised));
    }
    /// A route handed to the node's speaker or taken back (`advertised`, `withdrawn`,
    /// `backup_advertised`, `backup_withdrawn`).
    pub fn bgp_route_change(&self, change: &str) {
        self.all.bgp_route_changes.get_or_create(&self.named(change)).inc();
    }
    /// Whether this member drains or forwards a drain.
    pub fn set_drain_active(&self, on: bool) {
        self.all.drain_active.get_or_create(&self.label()).set(i64::from(on));
    }
    /// Forwarded to a draining old holder.
    pub fn drain_forwarded(&self, packets: u64, bytes: u64) {
        self.all.drain_forwarded_packets.get_or_create(&self.label()).inc_by(packets);
        self.all.drain_forwarded_bytes.get_or_create(&self.label()).inc_by(bytes);
    }
    /// Established connections on the drained VIPs.
    pub fn set_drain_connections(&self, n: usize) {
        self.all.drain_connections.get_or_create(&self.label()).set(i64::try_from(n).unwrap_or(i64::MAX));
    }
    /// Connections still open when a drain ended.
    pub fn drain_connections_cut(&self, n: usize) {
        self.all.drain_connections_cut.get_or_create(&self.label()).inc_by(n as u64);
    }
    /// Removes the pair's gauges (the agent stopped serving it): a stale role or alarm
    /// must not outlive the pair. Counters stay (they only ever grow).
    pub fn forget(&self, roles: &[&str], alarms: &[&str]) {
        for r in roles {
            self.all.role.remove(&self.named(r));
        }
        for a in alarms {
            self.all.alarms.remove(&self.named(a));
        }
        self.all.epoch.remove(&self.label());
        self.all.vips_held.remove(&self.label());
        self.all.adverts_ignored.remove(&self.label());
        self.all.drain_active.remove(&self.label());
        self.all.drain_connections.remove(&self.label());
        self.all.bgp_speaker_up.remove(&self.label());
        self.all.bgp_sessions_established.remove(&self.label());
        self.all.bgp_sessions.remove(&self.label());
        self.all.bgp_vips_advertised.remove(&self.label());
    }
}

/// Parses a metrics and health address: `off` (no endpoint, `None`), `ip:port`,
/// `[ipv6]:port`, or `ipv6:port` with the IPv6 address unbracketed — what the chart
/// passes as `$(HAVIP_HOST_IP):<port>` from the downward API (`status.hostIP` carries no
/// brackets, the image has no shell to add them, and the kubelet's `$(VAR)` expansion
/// cannot tell the families apart). The port is mandatory, so the part after the last
/// colon of an unbracketed IPv6 form is always the port.
pub fn parse_address(s: &str) -> Result<Option<std::net::SocketAddr>, String> {
    use std::net::{IpAddr, Ipv6Addr, SocketAddr};
    if s == "off" {
        return Ok(None);
    }
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(Some(a));
    }
    let unbracketed = s.rsplit_once(':').and_then(|(host, port)| {
        let ip = host.parse::<Ipv6Addr>().ok()?;
        let port = port.parse::<u16>().ok()?;
        Some(SocketAddr::new(IpAddr::V6(ip), port))
    });
    unbracketed.map(Some).ok_or_else(|| {
        format!("invalid metrics address {s:?}: expected off, IP:PORT, [IPv6]:PORT or IPv6:PORT (the port is required)")
    })
}

#[cfg(test)]
mod tests {
    use super::{AgentMetrics, IO_ERROR_CATEGORIES, parse_address};
    use std::collections::BTreeSet;
    use std::path::Path;
    use std::sync::Arc;

    fn sources(dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).expect("source dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                sources(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(std::fs::read_to_string(&p).expect("source"));
            }
        }
    }

    /// The list is what the source names: the `io_error` calls' string literals and the string arms of
    /// every `fn category(&self) -> &'static str` (netlink, nftables, drain errors).
    #[test]
    fn every_io_error_category_of_the_source_is_listed_and_starts_at_zero() {
        let mut files = Vec::new();
        sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut files);
        let mut named = BTreeSet::new();
        for src in &files {
            for rest in src.split("io_error(\"").skip(1) {
                named.insert(rest.split('"').next().unwrap_or_default().to_owned());
            }
            for body in src.split("pub fn category(&self) -> &'static str {").skip(1) {
                let body = body.split("\n    }\n").next().unwrap_or_default();
                named.extend(body.split("=> \"").skip(1).filter_map(|r| r.split('"').next()).map(str::to_owned));
            }
        }
        let listed: BTreeSet<String> = IO_ERROR_CATEGORIES.iter().map(|s| (*s).to_owned()).collect();
        assert_eq!(listed.len(), IO_ERROR_CATEGORIES.len(), "a category listed twice");
        assert!(named.len() > 20, "{named:?}");
        assert_eq!(named, listed);
        let text = AgentMetrics::new().encode();
        for c in IO_ERROR_CATEGORIES {
            assert!(text.contains(&format!("havip_agent_io_errors_total{{name=\"{c}\"}} 0")), "{c}: {text}");
        }
    }

    #[test]
    fn encodes_every_family_with_the_pair_label() {
        let m = Arc::new(AgentMetrics::new());
        let web = m.pair("web");
        let db = m.pair("db");
        web.dropped("data", "bad_mac");
        m.dropped("", "10.0.0.1", "unknown_pair");
        m.io_error("persist");
        web.set_role("Active", &["Init", "Active"]);
        db.set_role("Init", &["Init", "Active"]);
        web.set_epoch(3);
        web.transition("Takeover");
        web.conflict();
        web.set_alarm("VipConflict", true);
        web.probe("peer", true);
        let text = m.encode();
        for want in [
            "havip_agent_heartbeats_dropped_total{pair=\"web\",path=\"data\",reason=\"bad_mac\"} 1",
            "havip_agent_heartbeats_dropped_total{pair=\"\",path=\"10.0.0.1\",reason=\"unknown_pair\"} 1",
            "havip_agent_role{pair=\"web\",name=\"Active\"} 1",
            "havip_agent_role{pair=\"db\",name=\"Active\"} 0",
            "havip_agent_epoch{pair=\"web\"} 3",
            "havip_agent_vip_conflicts_total{pair=\"web\"} 1",
            "havip_agent_alarms{pair=\"web\",name=\"VipConflict\"} 1",
        ] {
            assert!(text.contains(want), "missing {want:?} in:\n{text}");
        }
        web.forget(&["Init", "Active"], &["VipConflict"]);
        let text = m.encode();
        assert!(!text.contains("havip_agent_role{pair=\"web\""), "forgotten:\n{text}");
        assert!(!text.contains("havip_agent_epoch{pair=\"web\""), "forgotten:\n{text}");
        assert!(!text.contains("havip_agent_alarms{pair=\"web\""), "forgotten:\n{text}");
        assert!(text.contains("havip_agent_role{pair=\"db\""), "the other pair stays:\n{text}");
    }

    #[test]
    fn metrics_addresses_take_every_form_the_chart_and_people_write() {
        let ok = |s: &str| parse_address(s).expect(s).expect("an address").to_string();
        assert_eq!(parse_address("off"), Ok(None));
        assert_eq!(ok("0.0.0.0:9797"), "0.0.0.0:9797");
        assert_eq!(ok("10.0.0.7:9797"), "10.0.0.7:9797");
        assert_eq!(ok("[fd00::7]:9797"), "[fd00::7]:9797");
        // The downward API's IPv6 host IP, unbracketed: the last group is the port.
        assert_eq!(ok("fd00::7:9797"), "[fd00::7]:9797");
        assert_eq!(ok("2001:db8:0:1:0:0:0:7:9797"), "[2001:db8:0:1::7]:9797");
        assert_eq!(ok("::1:9797"), "[::1]:9797");
        assert_eq!(ok(":::9797"), "[::]:9797");
        for bad in ["", "10.0.0.7", "10.0.0.7:", "10.0.0.7:70000", "fd00::7", "[fd00::7]", "host:9797", "fd00::7:x"] {
            let e = parse_address(bad).expect_err(bad);
            assert!(e.contains("the port is required"), "{bad}: {e}");
        }
    }
}
