//! The API-server section: requests per pair per minute (measured, and computed from other
//! projects' documented defaults), apply to VIP, and a failover's requests.

use crate::markdown::{fmt, num, provenance, table, text};
use crate::runs::{Kind, RunFile, newest, rows};
use serde_json::Value;
use std::fmt::Write as _;

/// Requests per minute on Leases, from a `"<verb> <resource>"` or `"<resource>:<verb>"` map.
fn lease_rate(by: &serde_json::Map<String, Value>, seconds: f64) -> f64 {
    by.iter()
        .filter(|(k, _)| k.ends_with(" leases") || k.starts_with("leases:"))
        .filter_map(|(_, n)| n.as_f64())
        .sum::<f64>()
        * 60.0
        / seconds.max(1.0)
}

pub(crate) fn api_section(out: &mut String, files: &[RunFile]) {
    out.push_str("## API-server requests per pair per minute\n\n");
    let steady_file = newest(files, Kind::ApiSteady);
    let reference_file = newest(files, Kind::LeaseReference);
    if steady_file.is_none() && reference_file.is_none() {
        out.push_str("No results yet: run `make bench` (or `make bench-k8s`).\n\n");
        return;
    }
    if let Some(f) = steady_file {
        let _ = writeln!(out, "{}\n", provenance(f));
    }
    out.push_str(
        "havip's rows are **measured**: the API server's own `apiserver_request_total`, counted over a \
steady window with one pair of two members, the operator and both agents running (requests on HAPairs, \
FloatingIPs, Leases, Events, Secrets and Nodes; the harness's reads of `/metrics` are not counted). The \
kube-vip and Cilium rows are **computed from documented defaults** (client-go leader election: the holder \
renews every retry period with one PUT, the follower GETs every retry period × 1.1 on average), per VIP \
with two nodes; they were not measured.\n\n",
    );
    // The operator benchmark's steady Lease rate with many pairs tells the fixed part.
    let many = newest(files, Kind::OperatorStage).and_then(|f| {
        rows(f, Kind::OperatorStage).into_iter().find(|v| text(v, "stage") == "steady").and_then(|v| {
            let by = v.get("apiserver_requests_in_window")?.as_object()?;
            Some((text(v, "pairs"), lease_rate(by, num(v, "window_seconds").unwrap_or(0.0))))
        })
    });
    let mut body = Vec::new();
    let mut notes = Vec::new();
    if let Some(f) = steady_file {
        for v in rows(f, Kind::ApiSteady) {
            let secs = num(v, "seconds").unwrap_or(60.0);
            let total = num(v, "requests_per_pair_per_minute");
            body.push(vec![
                format!("havip, all requests ({} pair, {} members)", text(v, "pairs"), text(v, "members")),
                "measured".to_owned(),
                fmt(total, 1),
                fmt(num(v, "writes_per_pair_per_minute"), 1),
                format!("steady window {} s", text(v, "seconds")),
            ]);
            if let (Some(by), Some(total)) = (v.get("by_verb_resource").and_then(Value::as_object), total) {
                let leases = lease_rate(by, secs);
                let writes = num(v, "writes_per_pair_per_minute").unwrap_or(0.0);
                let lease_writes = num(v, "lease_writes_per_minute").unwrap_or(0.0);
                body.push(vec![
                    "havip, without Lease requests: the part that grows with the pairs".to_owned(),
                    "measured".to_owned(),
                    fmt(Some(total - leases), 1),
                    fmt(Some(writes - lease_writes), 1),
                    "the same window".to_owned(),
                ]);
                let mut note = format!(
                    "Lease requests were {leases:.1}/min of havip's {total:.1}/min. No pair Lease is written in a \
steady state (it changes only on a role change), so they are fixed costs of the cluster, not of the pair: \
by their rates, the operator's leader election (a GET and a PUT every 2 s) and the API server's own \
identity Lease (a PUT every 10 s)"
                );
                if let Some((pairs, rate)) = &many {
                    let _ = write!(
                        note,
                        "; the operator benchmark below saw {rate:.1} Lease requests/min in its steady window \
with {pairs} pairs"
                    );
                }
                note.push_str(". The rest are the agents' status refreshes (one apply per member every 60 s).");
                notes.push(note);
            }
        }
    }
    if let Some(f) = reference_file {
        for v in rows(f, Kind::LeaseReference) {
            let computed = v.get("computed_from_documented_defaults").and_then(Value::as_bool).unwrap_or(false);
            body.push(vec![
                format!("{} (per VIP)", text(v, "system")),
                if computed { "**computed from documented defaults**" } else { "reference" }.to_owned(),
                fmt(num(v, "requests_per_vip_per_minute"), 1),
                fmt(num(v, "writes_per_vip_per_minute"), 1),
                format!(
                    "lease {} s / renew deadline {} s / retry period {} s",
                    text(v, "lease_duration_s"),
                    text(v, "renew_deadline_s"),
                    text(v, "retry_period_s")
                ),
            ]);
        }
    }
    table(out, &["system", "kind", "requests/min", "writes/min", "settings"], body);
    for n in notes {
        let _ = writeln!(out, "{n}\n");
    }
    if let Some(f) = steady_file {
        for v in rows(f, Kind::ApiSteady) {
            if let Some(by) = v.get("by_verb_resource").and_then(Value::as_object).filter(|m| !m.is_empty()) {
                let secs = num(v, "seconds").unwrap_or(60.0).max(1.0);
                let _ = writeln!(out, "havip's steady-state requests by verb and resource ({secs:.0} s window):\n");
                let body = by
                    .iter()
                    .map(|(k, n)| vec![k.clone(), fmt(n.as_f64(), 0), fmt(n.as_f64().map(|n| n * 60.0 / secs), 1)])
                    .collect();
                table(out, &["verb resource", "requests", "per minute"], body);
            }
        }
    }
    if let Some(f) = newest(files, Kind::ApiFailover) {
        for v in rows(f, Kind::ApiFailover) {
            let reached = v.get("failed_over").and_then(Value::as_bool) != Some(false);
            let _ = writeln!(
                out,
                "During a failover (the active's cables cut; {} s window): {} requests, {} of them writes. {}\n",
                text(v, "window_seconds"),
                fmt(num(v, "requests"), 0),
                fmt(num(v, "writes"), 0),
                if reached && v.get("harness_gets_excluded").is_some() {
                    format!(
                        "The status named the new active under the next epoch {} ms after the cut (the harness's \
own {} status reads are excluded from the counts).",
                        text(v, "status_failed_over_ms"),
                        text(v, "harness_gets_excluded")
                    )
                } else if reached {
                    format!("The pair read FailedOver {} ms after the cut.", text(v, "status_failed_over_ms"))
                } else {
                    format!(
                        "The pair did not read FailedOver within {} ms: `bench-k8s` waits for that phase, but while \
the old active stays cut off the pair reads Degraded (no ready standby), so the wait ran out; the takeover \
itself is measured in the failover table above.",
                        text(v, "status_failed_over_ms")
                    )
                }
            );
            if let Some(by) = v.get("by_verb_resource").and_then(Value::as_object).filter(|m| !m.is_empty()) {
                let list: Vec<String> = by.iter().map(|(k, n)| format!("{k} {}", fmt(n.as_f64(), 0))).collect();
                let note = if v.get("harness_gets_excluded").is_some() {
                    " The Lease requests include the operator's leader election (a GET and a PUT every 2 s) and the \
API server's own Lease, which do not grow with the number of pairs."
                } else {
                    " The GETs of HAPairs are mostly the benchmark's own polling of the pair's phase (every 50 ms), \
not havip's."
                };
                let _ = writeln!(out, "By verb and resource: {}.{note}\n", list.join(", "));
            }
        }
    }
    if let Some(f) = newest(files, Kind::ApplyToVip) {
        for v in rows(f, Kind::ApplyToVip) {
            let _ = writeln!(
                out,
                "From `kubectl apply` of a new HAPair + FloatingIP to the first successful TCP connect to the \
VIP: {} ms{}; to phase Live: {} ms{}.\n",
                text(v, "ms"),
                if v.get("vip_answered").and_then(Value::as_bool) == Some(false) { " (never answered)" } else { "" },
                text(v, "apply_to_live_ms"),
                if v.get("live").and_then(Value::as_bool) == Some(false) { " (never Live)" } else { "" }
            );
        }
    }
}
