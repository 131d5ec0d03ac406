//! The failover section: the gaps of havip, keepalived and MetalLB per scenario, their
//! ratios, and the planned moves that should keep connections.

use crate::markdown::{fmt, num, provenance, table, text};
use crate::runs::{Kind, RunFile, kind, newest, rows};
use crate::timeline::timeline_svg;
use serde_json::Value;
use std::fmt::Write as _;

const SCENARIOS: &str = "\
- `cut`: the active node's cables (management first, then data) are pulled, so it is \
gone the way a dead node is.
- `kill-then-cut`: the HA daemon on the active is SIGKILLed (keepalived: its VRRP child and \
parent; the VIP stays on the interface), and the active's cables are pulled 2 s later. A \
killed havip agent leaves the VIP in place and the node keeps serving, so the standby hears \
the heartbeats stop but the data plane still answer and does not take over until the cut \
(by design: a dead agent is not a dead service). keepalived's backup acts on missing adverts \
alone and may take over before the cut.
- `planned`: havip `admin failover` (make-before-break); keepalived SIGTERM (its \
priority-0 advert makes the backup take over at once).

The gap is the longest time between two successful connects of a client that starts a \
connection to VIP:8080 every 5 ms, each with a 50 ms timeout, whether or not the earlier \
ones have answered (up to 22 in flight), so that a gap ends within 5 ms of service \
returning; \"failed connects\" counts the connection attempts that failed in the worst \
run. (Files up to failover-2026-12-06.jsonl waited for each connect before the next: their \
gaps moved in steps of the 50 ms timeout and ran up to 50 ms long, and they counted fewer \
failed connects.) The planned-200 and drain rows keep one connection at a time per stream. Systems: `havip` with its defaults (heartbeat \
100 ms, timeout 300 ms, 2 failed probes over ≥ 100 ms); `keepalived-v2`: Debian's \
keepalived, VRRPv2 defaults (advert_int 1 s); `keepalived-v3`: VRRPv3 with \
`advert_int 0.1`. Same network-namespace topology, same client, same listeners.
";

/// Added to [`SCENARIOS`] when the file has `metallb-l2` rows.
const METALLB_SCENARIOS: &str = "
`metallb-l2`: MetalLB v0.15.2 in layer-2 mode with its own defaults (memberlist LAN \
settings: its failure detection takes seconds by design), its controller and one speaker \
per node (in the node's namespace, memberlist on the node's data address) on a local \
kube-apiserver reached over the management cable; a `type: LoadBalancer` Service \
(`externalTrafficPolicy: Local`) whose EndpointSlice lists both nodes' listeners, and in \
each node the DNAT of VIP:8080 to its own listener that kube-proxy would install. The \
active is the node MetalLB elects to announce. `kill-then-cut` SIGKILLs that node's speaker \
(no memberlist leave; the node keeps serving through the DNAT) and pulls its cables 2 s \
later; `planned` SIGTERMs it (it leaves memberlist; the old node serves until the new \
one's gratuitous ARPs move the client).
";

/// Added to [`SCENARIOS`] when the file has routed (`…bgp…`) rows.
const ROUTED_SCENARIOS: &str = "
Routed rows (`havip-bgp`, `havip-bgp-fast`, `metallb-bgp`, `metallb-bgp-3s`; their ratios are \
taken against routed rows only): the gateway is a router namespace running FRR (bgpd, bfdd; \
`frr defaults datacenter`: keepalive 3 s, hold 9 s) that peers over eBGP with every member, \
and the client sits in another subnet behind it, sharing no layer 2 with the members. \
`havip-bgp` (Standard profile) and `havip-bgp-fast` (Fast): FloatingIPs in `BGP` mode, FRR on \
each member advertising `havip0`'s connected routes (docs/bgp.md), BFD 100 ms × 3 on every \
session; the holder's address carries its epoch as the route's MED, so the router prefers a \
takeover's path the moment it arrives. `metallb-bgp`: MetalLB v0.15.2's native BGP speaker \
(no BFD) at its defaults (`holdTime` 90 s: the session's hold time is the router's 9 s), \
peering with the same router; both nodes advertise the Service's address (ECMP) and the \
active is the node the router's hash sends the client to; `metallb-bgp-3s`: `holdTime: 3s`, \
the shortest it accepts. MetalLB's `kill-then-cut` kills the speaker, whose BGP session the \
kernel then closes (the router withdraws at once); its `planned` SIGTERMs it (it closes its \
session).
";

/// Added to [`SCENARIOS`] when the file has `planned-drain` or `planned-200` rows.
const DRAIN_SCENARIOS: &str = "
Planned moves that should keep connections (issue 18's drain; measured for `havip` with its \
default `drainTimeout` and for `keepalived-v3`, whose planned move is a SIGTERM; the members' \
listeners greet with their name and then echo):
- `planned-drain`: `planned` with 20 long-lived connections (a message every 50 ms each, \
each answer checked) and 4 connections held in the middle of their handshake (their SYN \
answered by the old holder, their ACK sent once the new holder has answered 20 new \
connections, about 100 ms after the move) besides the 5 ms stream. Broken \
long-lived connections are those that broke within 2 s of the move; havip keeps them on the \
old holder until its drain ends, when the ones still open are cut (counted apart).
- `planned-200`: 200 planned moves back and forth in one lab, at most one every 1.2 s and \
none before the system accepts it (havip retries `admin failover` until the target is a \
ready standby; keepalived, with `nopreempt`, is SIGTERMed and started again as backup), with \
4 concurrent streams of new connections (every 5 ms each) and 2 mid-handshake connections \
per move, their ACK sent as soon as every stream has seen the new holder (right after the \
flip). The gap of a move is the longest of the 4 streams' gaps around it; p50 and p99 are \
over the moves. Goal: 0 failed connects and 0 resets over all moves.
";

/// Added to [`SCENARIOS`] when the file has `static-arp` rows.
const STATIC_ARP_SCENARIO: &str = "
- `static-arp` (issue 31): `cut` with the client's neighbour entry of the VIP pinned \
(`nud permanent`) to the MAC it resolved before the cut, as a router with a static ARP entry \
or a host that ignores gratuitous ARP. `havip-vmac` (`virtualMAC: {id: 51}`) and \
`keepalived-v3-vmac` (`use_vmac`) answer with a MAC that moves with the VIP; `havip` and \
`keepalived-v3` are the controls: their new holder is never reached (a run waits 5 s, counted \
in \"runs without takeover\"). The `-vmac` systems also run `cut`. Goal: `havip-vmac`'s \
`static-arp` p50 within 50 ms of `havip`'s `cut` p50.
";

fn is_drain_scenario(v: &Value) -> bool {
    matches!(v.get("scenario").and_then(Value::as_str), Some("planned-drain" | "planned-200"))
}

/// A count of `key`, "–" when absent.
fn count(v: &Value, key: &str) -> String {
    match v.get(key) {
        Some(Value::Number(n)) => n.to_string(),
        _ => "–".to_owned(),
    }
}

/// `{"reset": 3, …}` as `reset 3, …` (empty: "none").
fn kinds(v: &Value, key: &str) -> String {
    match v.get(key).and_then(Value::as_object) {
        Some(m) if !m.is_empty() => m.iter().map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(", "),
        Some(_) => "none".to_owned(),
        None => "–".to_owned(),
    }
}

/// The tables of the planned moves that should keep connections.
fn drain_tables(out: &mut String, f: &RunFile) {
    let rows_of = |name: &str| -> Vec<&Value> {
        rows(f, Kind::Failover)
            .into_iter()
            .filter(|v| v.get("scenario").and_then(Value::as_str) == Some(name))
            .collect()
    };
    let drain = rows_of("planned-drain");
    if !drain.is_empty() {
        out.push_str(
            "`planned-drain` (worst run of each row):

",
        );
        let body = drain
            .into_iter()
            .map(|v| {
                vec![
                    text(v, "system"),
                    text(v, "runs"),
                    format!("{} of {}", count(v, "longlived_broken_max"), count(v, "longlived_connections")),
                    count(v, "longlived_cut_at_drain_end_max"),
                    format!("{} of {}", count(v, "mid_handshake_failed_max"), count(v, "mid_handshake_per_run")),
                    text(v, "failed_connects_max"),
                    count(v, "resets_max"),
                    fmt(num(v, "p50_gap_ms"), 1),
                ]
            })
            .collect();
        table(
            out,
            &[
                "system",
                "runs",
                "long-lived broken in the move",
                "cut when the drain ended",
                "mid-handshake failed",
                "failed connects",
                "resets",
                "p50 gap (ms)",
            ],
            body,
        );
    }
    let many = rows_of("planned-200");
    if !many.is_empty() {
        out.push_str(
            "`planned-200` (all moves of one lab):

",
        );
        let body = many
            .into_iter()
            .map(|v| {
                let stopped = match v.get("stopped") {
                    Some(Value::String(why)) => format!(" (stopped: {why})"),
                    _ => String::new(),
                };
                vec![
                    format!("{}{stopped}", text(v, "system")),
                    format!("{} × {} streams", count(v, "moves"), count(v, "streams")),
                    count(v, "failed_connects_total"),
                    count(v, "resets_total"),
                    format!("{} ({})", count(v, "lost_after_connect_total"), kinds(v, "failure_kinds")),
                    format!("{} of {}", count(v, "mid_handshake_failed"), count(v, "mid_handshake")),
                    fmt(num(v, "p50_gap_ms"), 1),
                    fmt(num(v, "p99_gap_ms"), 1),
                    fmt(num(v, "max_gap_ms"), 1),
                    fmt(num(v, "move_wait_p50_ms"), 0),
                ]
            })
            .collect();
        table(
            out,
            &[
                "system",
                "moves",
                "failed connects",
                "resets",
                "lost after connect (all failures by kind)",
                "mid-handshake failed",
                "per-move gap p50 (ms)",
                "p99 (ms)",
                "max (ms)",
                "wait before a move p50 (ms)",
            ],
            body,
        );
    }
}

/// Whether a failover file has rows of `system`.
fn has_system(f: &RunFile, system: &str) -> bool {
    rows(f, Kind::Failover).iter().any(|v| v.get("system").and_then(Value::as_str) == Some(system))
}

pub(crate) fn failover_section(out: &mut String, files: &[RunFile]) {
    let newest_file = newest(files, Kind::Failover);
    let with_metallb = newest_file.is_some_and(|f| has_system(f, "metallb-l2"));
    let _ = writeln!(
        out,
        "## Failover gaps: havip{} side by side (measured here)\n",
        if with_metallb { ", keepalived and MetalLB" } else { " and keepalived" }
    );
    let Some(f) = newest_file else {
        out.push_str("No results yet: run `make bench` (or `make bench-failover`).\n\n");
        return;
    };
    let _ = writeln!(out, "{}\n", provenance(f));
    out.push_str(SCENARIOS);
    if with_metallb {
        out.push_str(METALLB_SCENARIOS);
    }
    let routed = rows(f, Kind::Failover)
        .into_iter()
        .any(|v| v.get("system").and_then(Value::as_str).is_some_and(|s| s.contains("bgp")));
    if routed {
        out.push_str(ROUTED_SCENARIOS);
    }
    let with_drain = rows(f, Kind::Failover).into_iter().any(is_drain_scenario);
    if with_drain {
        out.push_str(DRAIN_SCENARIOS);
    }
    if rows(f, Kind::Failover).into_iter().any(|v| v.get("scenario").and_then(Value::as_str) == Some("static-arp")) {
        out.push_str(STATIC_ARP_SCENARIO);
    }
    out.push('\n');
    for v in rows(f, Kind::Skipped) {
        let _ = writeln!(out, "Not run for this file: `{}` ({}).\n", text(v, "system"), text(v, "skipped"));
    }
    let body = rows(f, Kind::Failover)
        .into_iter()
        .map(|v| {
            vec![
                text(v, "scenario"),
                text(v, "system"),
                text(v, "runs"),
                fmt(num(v, "p50_gap_ms"), 1),
                fmt(num(v, "p99_gap_ms"), 1),
                fmt(num(v, "max_gap_ms"), 1),
                text(v, "failed_connects_max"),
                text(v, "runs_without_takeover"),
            ]
        })
        .collect();
    table(
        out,
        &[
            "scenario",
            "system",
            "runs",
            "p50 gap (ms)",
            "p99 gap (ms)",
            "max gap (ms)",
            "failed connects (worst run)",
            "runs without takeover",
        ],
        body,
    );
    let ratios = rows(f, Kind::Ratio);
    if !ratios.is_empty() {
        out.push_str("Ratios (below 1: havip's gap is shorter):\n\n");
        let body = ratios
            .into_iter()
            .map(|v| {
                vec![
                    text(v, "scenario"),
                    text(v, "ratio"),
                    fmt(num(v, "p50_gap_ratio"), 3),
                    fmt(num(v, "p99_gap_ratio"), 3),
                ]
            })
            .collect();
        table(out, &["scenario", "ratio", "p50", "p99"], body);
    }
    if with_drain {
        drain_tables(out, f);
    }
    if f.lines.iter().filter(|v| kind(v) == Some(Kind::Failover)).any(|v| num(v, "runs").unwrap_or(0.0) < 10.0) {
        out.push_str("With fewer than 10 runs per row the p99 is the largest gap seen, not a statistical p99.\n\n");
    }
    if let Some((name, _)) = timeline_svg(f) {
        let _ = writeln!(
            out,
            "What the client saw in the median run of each row — every connect attempt (one every 5 ms) as a bar from \
its start to its end, by who answered; 0 is the old holder's last answer (drawn by `bench-report` from the \
`timeline` lines of [`{}`](bench/{})):\n\n![client connects around each move, the systems side by side](bench/{name})\n",
            f.file, f.file
        );
    }
}
