//! The operator section: its footprint and reconcile times per stage with many pairs.

use crate::markdown::{fmt, mib, num, provenance, table, text};
use crate::runs::{Kind, RunFile, newest, rows};
use serde_json::Value;
use std::fmt::Write as _;

pub(crate) fn operator_section(out: &mut String, files: &[RunFile]) {
    out.push_str("## The operator with many pairs (measured here)\n\n");
    let Some(f) = newest(files, Kind::OperatorStage) else {
        out.push_str("No results yet: run `make bench`.\n\n");
        return;
    };
    let _ = writeln!(out, "{}\n", provenance(f));
    out.push_str(
        "`bench-operator` on a local control plane (real kube-apiserver and etcd): N pairs with one FloatingIP \
each are applied (`created`), the operator gives each its Lease, key Secret and status (`converged`), \
simulated agents report and take the Leases (`live`), then nothing changes (`steady`). RSS and CPU are the \
operator process's, from `/proc`; reconcile statistics from its own metrics (p50/p99 are histogram bucket \
bounds).\n\n",
    );
    let body = rows(f, Kind::OperatorStage)
        .into_iter()
        .map(|v| {
            vec![
                text(v, "stage"),
                text(v, "pairs"),
                fmt(num(v, "seconds"), 1),
                mib(num(v, "rss_kib")),
                fmt(num(v, "cpu_seconds"), 2),
                fmt(num(v, "reconciles"), 0),
                fmt(num(v, "reconcile_mean_ms"), 2),
                fmt(num(v, "reconcile_p99_ms_le"), 0),
                fmt(num(v, "status_writes"), 0),
                fmt(num(v, "errors"), 0),
            ]
        })
        .collect();
    table(
        out,
        &[
            "stage",
            "pairs",
            "seconds since start",
            "RSS (MiB)",
            "CPU (s, total)",
            "reconciles (total)",
            "reconcile mean (ms)",
            "reconcile p99 ≤ (ms)",
            "status writes (total)",
            "errors",
        ],
        body,
    );
    for v in rows(f, Kind::OperatorStage).into_iter().filter(|v| text(v, "stage") == "steady") {
        let api: Vec<String> = v
            .get("apiserver_requests_in_window")
            .and_then(Value::as_object)
            .map(|m| m.iter().map(|(k, n)| format!("{k} {}", fmt(n.as_f64(), 0))).collect())
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "Steady window of {} s with {} pairs: {} reconciles/s (mean {} ms), {} status writes, {} CPU s; \
API requests on havip's resources in the window (every client): {}.\n",
            text(v, "window_seconds"),
            text(v, "pairs"),
            fmt(num(v, "reconciles_per_second"), 2),
            fmt(num(v, "reconcile_mean_ms_in_window"), 2),
            fmt(num(v, "status_writes_in_window"), 0),
            fmt(num(v, "cpu_seconds_in_window"), 2),
            if api.is_empty() { "none".to_owned() } else { api.join(", ") }
        );
    }
}
