//! Prometheus metrics of the agent. Label values come from bounded sets (path names
//! from the configuration, reason/role/kind constants), never from `{:?}` of data.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Mutex;

/// Label: a heartbeat path.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PathLabel {
    /// Path name.
    pub path: String,
}

/// Labels: a dropped heartbeat.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabels {
    /// Path name.
    pub path: String,
    /// Why (truncated, oversized, bad_magic, unknown_key, bad_mac, unsupported_major,
    /// malformed, replayed, stale, foreign_pair, unknown_sender, own).
    pub reason: String,
}

/// Label: a role, reason, kind or category constant.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NameLabel {
    /// The value.
    pub name: String,
}

/// Labels: a probe result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    /// `peer` (through the VIP) or `local` (own listener).
    pub kind: String,
    /// `up` or `down`.
    pub result: String,
}

/// Every metric of the agent.
pub struct AgentMetrics {
    registry: Mutex<Registry>,
    /// Heartbeats sent, per path.
    pub heartbeats_sent: Family<PathLabel, Counter>,
    /// Authentic heartbeats accepted, per path.
    pub heartbeats_received: Family<PathLabel, Counter>,
    /// Datagrams dropped, per path and reason.
    pub heartbeats_dropped: Family<DropLabels, Counter>,
    /// 1 for the current role, 0 for the others.
    pub role: Family<NameLabel, Gauge>,
    /// The epoch this member knows.
    pub epoch: Gauge,
    /// Role changes, per reason.
    pub transitions: Family<NameLabel, Counter>,
    /// VIPs held in the kernel.
    pub vips_held: Gauge,
    /// Gratuitous ARPs / NAs sent, per kind (`garp`, `na`).
    pub announcements: Family<NameLabel, Counter>,
    /// Data-plane probe results.
    pub probes: Family<ProbeLabels, Counter>,
    /// Foreign MACs seen answering for a held VIP.
    pub conflicts: Counter,
    /// 1 while an alarm is raised.
    pub alarms: Family<NameLabel, Gauge>,
    /// Errors of I/O operations, per category.
    pub io_errors: Family<NameLabel, Counter>,
    /// Authentic heartbeats the state machine ignored for an epoch outside the domain.
    pub adverts_ignored: Gauge,
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
            role: Family::default(),
            epoch: Gauge::default(),
            transitions: Family::default(),
            vips_held: Gauge::default(),
            announcements: Family::default(),
            probes: Family::default(),
            conflicts: Counter::default(),
            alarms: Family::default(),
            io_errors: Family::default(),
            adverts_ignored: Gauge::default(),
        };
        registry.register("heartbeats_sent", "Heartbeats sent", m.heartbeats_sent.clone());
        registry.register("heartbeats_received", "Authentic heartbeats accepted", m.heartbeats_received.clone());
        registry.register("heartbeats_dropped", "Heartbeat datagrams dropped", m.heartbeats_dropped.clone());
        registry.register("role", "1 for the member's current role", m.role.clone());
        registry.register("epoch", "Pair epoch known to this member", m.epoch.clone());
        registry.register("role_transitions", "Role changes of this member", m.transitions.clone());
        registry.register("vips_held", "VIPs held in the kernel", m.vips_held.clone());
        registry.register("announcements", "Gratuitous ARPs and unsolicited NAs sent", m.announcements.clone());
        registry.register("probes", "Data-plane probe results", m.probes.clone());
        registry.register("vip_conflicts", "Foreign MACs answering for a held VIP", m.conflicts.clone());
        registry.register("alarms", "1 while an alarm is raised", m.alarms.clone());
        registry.register("io_errors", "Errors of I/O operations", m.io_errors.clone());
        registry.register(
            "heartbeats_ignored_epoch",
            "Authentic heartbeats ignored for an epoch above 2147483647 (since start)",
            m.adverts_ignored.clone(),
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
    pub fn dropped(&self, path: &str, reason: &str) {
        self.heartbeats_dropped.get_or_create(&DropLabels { path: path.to_owned(), reason: reason.to_owned() }).inc();
    }

    /// Counts an I/O error.
    pub fn io_error(&self, category: &str) {
        self.io_errors.get_or_create(&NameLabel { name: category.to_owned() }).inc();
    }

    /// Sets the role gauge family so that only `role` is 1.
    pub fn set_role(&self, role: &str, all: &[&str]) {
        for r in all {
            self.role.get_or_create(&NameLabel { name: (*r).to_owned() }).set(i64::from(*r == role));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_every_family() {
        let m = AgentMetrics::new();
        m.dropped("data", "bad_mac");
        m.io_error("persist");
        m.set_role("Active", &["Init", "Active"]);
        m.epoch.set(3);
        m.transitions.get_or_create(&NameLabel { name: "Takeover".into() }).inc();
        m.conflicts.inc();
        m.alarms.get_or_create(&NameLabel { name: "VipConflict".into() }).set(1);
        m.probes.get_or_create(&ProbeLabels { kind: "peer".into(), result: "up".into() }).inc();
        let text = m.encode();
        for want in [
            "havip_agent_heartbeats_dropped_total{path=\"data\",reason=\"bad_mac\"} 1",
            "havip_agent_role{name=\"Active\"} 1",
            "havip_agent_epoch 3",
            "havip_agent_vip_conflicts_total 1",
            "havip_agent_alarms{name=\"VipConflict\"} 1",
        ] {
            assert!(text.contains(want), "missing {want:?} in:\n{text}");
        }
    }
}
