//! The big-cluster section: the operator and an agent with thousands of Nodes and a
//! thousand pairs, against their goals.

use crate::markdown::{fmt, mib, num, provenance, table, text};
use crate::runs::{Kind, RunFile, newest, rows};
use serde_json::Value;
use std::fmt::Write as _;

/// "yes" / "no (…)" for a goal.
fn goal(v: &Value) -> &'static str {
    match v.get("goal_met").and_then(Value::as_bool) {
        Some(true) => "met",
        Some(false) => "**missed**",
        None => "–",
    }
}

pub(crate) fn scale_section(out: &mut String, files: &[RunFile]) {
    out.push_str("## havip in a big cluster (measured here)\n\n");
    out.push_str(
        "How many pairs a node may carry: there is no fixed limit. One agent serves every pair of its node over one \
UDP socket per (local address, heartbeat port), so pairs may share a port (the default 7946) or use different ones; \
a second process on the same address and port refuses to start. The heartbeats of the pairs two agents share go \
in bundles (one datagram per member address and path for up to 16 pairs), and each pair costs the agent its share of \
them, its probes and its state machine (the idle section above measures 1, 10 and 100 pairs on two nodes); the \
end-to-end suites run two and three pairs per node (README, \"Many pairs on the same nodes\"). An agent watches \
only its own node's objects, \
so what it receives grows with its own pairs, not with the cluster:\n\n",
    );
    let Some(f) = newest(files, Kind::ScaleAgent).or_else(|| newest(files, Kind::ScaleOperator)) else {
        out.push_str("No results yet: run `make bench` (or `make bench-scale`).\n\n");
        return;
    };
    let _ = writeln!(out, "{}\n", provenance(f));
    for v in rows(f, Kind::ScaleSetup) {
        let _ = writeln!(
            out,
            "`bench-scale` on a local control plane (real kube-apiserver and etcd): {} synthetic Nodes with {} bytes of \
status each (addresses, capacity, conditions, node info, an image list — what a kubelet reports), created in {} s; {} \
pairs, {} of them on the lab's two network-namespace nodes with real agents (each pair its own VIP), the \
others over the synthetic Nodes with one FloatingIP each, created in {} s. Simulated agents take those pairs' Leases \
and report, then keep refreshing each member entry once a minute, as real agents do. The measured agent restarts once \
the cluster is full (its start-up path), then serves its pairs through the steady window. RSS from `/proc`; the \
agent's watch events from its own `havip_agent_watch_events_total` (applied and deleted objects).\n",
            text(v, "nodes"),
            text(v, "node_status_bytes"),
            text(v, "create_nodes_s"),
            text(v, "pairs"),
            text(v, "real_pairs"),
            text(v, "create_pairs_s"),
        );
    }
    let mut body = Vec::new();
    for v in rows(f, Kind::ScaleOperator) {
        body.push(vec![
            format!("operator ({} build)", text(v, "build")),
            format!(
                "idle with the Nodes {} MiB; all pairs Live {} MiB; largest {} MiB",
                mib(num(v, "rss_kib_idle_with_nodes")),
                mib(num(v, "rss_kib_live")),
                mib(num(v, "rss_kib_max"))
            ),
            format!(
                "{} of {} pairs Live {} s after they were created ({} converged after {} s)",
                text(v, "pairs_live"),
                text(v, "pairs"),
                text(v, "time_to_live_all_s"),
                text(v, "pairs_converged"),
                text(v, "converged_s")
            ),
            match v.get("goal_live_s") {
                Some(live) => format!("≤ {} MiB, all Live ≤ {live} s: {}", text(v, "goal_rss_mib"), goal(v)),
                None => format!("≤ {} MiB: {}", text(v, "goal_rss_mib"), goal(v)),
            },
        ]);
    }
    for v in rows(f, Kind::ScaleAgent) {
        let kinds: Vec<String> = v
            .get("watch_events_per_minute_by_kind")
            .and_then(Value::as_object)
            .map(|m| m.iter().map(|(k, n)| format!("{k} {}", fmt(n.as_f64(), 1))).collect())
            .unwrap_or_default();
        body.push(vec![
            format!("agent on {} ({} pairs, {} build)", text(v, "node"), text(v, "own_pairs"), text(v, "build")),
            match v.get("private_kib") {
                Some(_) => format!(
                    "{} MiB ({} MiB private); largest in the window {} MiB",
                    mib(num(v, "rss_kib")),
                    mib(num(v, "private_kib")),
                    mib(num(v, "rss_kib_max"))
                ),
                None => format!("{} MiB; largest in the window {} MiB", mib(num(v, "rss_kib")), mib(num(v, "rss_kib_max"))),
            },
            format!(
                "{} watch events/min ({}) while the cluster wrote {} HAPair statuses/min; {} objects in its start-up lists",
                fmt(num(v, "watch_events_per_minute"), 1),
                if kinds.is_empty() { "none".to_owned() } else { kinds.join(", ") },
                fmt(num(v, "cluster_hapair_status_writes_per_minute"), 0),
                text(v, "objects_listed_at_start")
            ),
            format!("≤ {} MiB: {}", text(v, "goal_rss_mib"), goal(v)),
        ]);
    }
    table(out, &["process", "RSS", "work", "goal"], body);
}
