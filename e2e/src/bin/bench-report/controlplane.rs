//! The control-plane VIP section: API unavailability through the VIP, havip's
//! control-plane mode against keepalived as the kubeadm HA guide sets it up.

use crate::markdown::{fmt, provenance, table, text};
use crate::runs::{Kind, RunFile, newest, rows};
use serde_json::Value;
use std::fmt::Write as _;

fn ms(v: &Value, key: &str) -> Option<f64> {
    v.get("unavailable_ms").and_then(|u| u.get(key)).and_then(Value::as_f64)
}

pub(crate) fn control_plane_section(out: &mut String, files: &[RunFile]) {
    out.push_str(
        "## The control-plane VIP: havip against keepalived as the kubeadm guide sets it up (measured here)\n\n",
    );
    let Some(f) = newest(files, Kind::ControlPlane) else {
        out.push_str(
            "No results yet: run `make bench` (or `bench-failover --scenarios api-planned,api-kill,api-cut`).\n\n",
        );
        return;
    };
    let _ = writeln!(out, "{}\n", provenance(f));
    out.push_str(
        "A real three-node control plane (etcd and kube-apiserver on every node namespace) and a client that sends a \
fresh HTTPS `GET /readyz` through the VIP every 20 ms (a new TCP and TLS connection each, 1 s timeout, not waiting \
for the ones before). Unavailability is the time from the fault until a request sent after it is answered `ok`; \
each scenario runs several times in one lab per system, against whichever member holds the VIP. `api-kill`: the \
holder's kube-apiserver is SIGKILLed; `api-cut`: the holder node's cables are cut, management first as a dead node goes (its etcd member is lost too); \
`api-planned`: a planned move (havip `admin failover`; keepalived SIGTERM, its priority-0 handover) — failed \
requests count there. `havip-cp`: three voting members (`quorum.lease` 400 ms) gated on their own API server's \
`/readyz` (every 200 ms, 500 ms timeout, `notReadyFor` 600 ms; docs/control-plane.md). `keepalived-kubeadm`: the \
guide's `keepalived.conf` (VRRPv2, `advert_int 1`, priorities 101/100/100) and `check_apiserver.sh` track script at \
its timings (`interval 3`, `weight -2`, `fall 10`, `rise 2`; the script's `curl` asks `/healthz`, which anonymous \
clients may read); `keepalived-kubeadm-tuned`: VRRPv3 `advert_int 0.1`, the script every second, `fall 2`. \
keepalived has no quorum: a partition can leave two holders, which these scenarios do not provoke.\n\n",
    );
    let mut body = Vec::new();
    for v in rows(f, Kind::ControlPlane) {
        body.push(vec![
            text(v, "scenario"),
            text(v, "system"),
            text(v, "runs"),
            fmt(ms(v, "p50"), 1),
            fmt(ms(v, "p99"), 1),
            fmt(ms(v, "max"), 1),
            format!("{} of {}", text(v, "failed_requests"), text(v, "requests")),
        ]);
    }
    table(
        out,
        &[
            "scenario",
            "system",
            "runs",
            "p50 unavailable (ms)",
            "p99 (ms)",
            "max (ms)",
            "failed requests (all runs, from the fault on)",
        ],
        body,
    );
    let ratios: Vec<String> = rows(f, Kind::ControlPlaneRatio)
        .into_iter()
        .map(|v| {
            format!(
                "{} `{}`: {}",
                text(v, "scenario"),
                text(v, "ratio"),
                fmt(v.get("p50_unavailable_ratio").and_then(Value::as_f64), 3)
            )
        })
        .collect();
    if !ratios.is_empty() {
        let _ = writeln!(out, "Ratios of the p50 unavailability: {}.\n", ratios.join("; "));
    }
}
