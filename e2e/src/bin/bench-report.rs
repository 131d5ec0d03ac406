//! `bench-report`: turns the benchmark JSON lines in `docs/bench/` into
//! `docs/benchmarks.md`.
//!
//! - `bench-report meta --name failover --command "…"` prints the first line of a
//!   results file: what ran, when, and on which machine (CPUs, kernel, CPU model, load).
//! - `bench-report render --dir docs/bench --out docs/benchmarks.md` reads every
//!   `<name>-<YYYY-MM-DD>[-N].jsonl` file and writes the report: for each kind of result
//!   the newest file that has it, with its command, date and machine, then a summary of
//!   the earlier files.
//!
//! The inputs are the JSON lines that `bench-failover`, `bench-k8s`, `bench-operator` and `bench-scale`
//! print; lines of unknown shape are ignored. Rows computed from other projects'
//! documented defaults (`computed_from_documented_defaults`) are labelled as such.
//! `make bench` runs every benchmark and then this.

use clap::{Parser, Subcommand};
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Renders docs/benchmarks.md from the JSON lines in docs/bench/.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Print the metadata line that starts a results file.
    Meta {
        /// The benchmark's name (the file name's prefix).
        #[arg(long)]
        name: String,
        /// The command that produces the results.
        #[arg(long)]
        command: String,
    },
    /// Write the report from every results file in a directory.
    Render {
        /// Directory of the `<name>-<date>[-N].jsonl` files.
        #[arg(long, default_value = "docs/bench")]
        dir: PathBuf,
        /// The Markdown file to write.
        #[arg(long, default_value = "docs/benchmarks.md")]
        out: PathBuf,
    },
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match args.command {
        Cmd::Meta { name, command } => {
            println!("{}", meta_line(&name, &command));
            std::process::ExitCode::SUCCESS
        }
        Cmd::Render { dir, out } => {
            let files = match load_dir(&dir) {
                Ok(f) => f,
                Err(e) => {
                    eprintln!("bench-report: {e}");
                    return std::process::ExitCode::FAILURE;
                }
            };
            let text = render(&files);
            if let Err(e) = std::fs::write(&out, text) {
                eprintln!("bench-report: failed to write {}: {e}", out.display());
                return std::process::ExitCode::FAILURE;
            }
            // The pictures the report links, next to their results files.
            if let Some((name, svg)) = newest(&files, Kind::Failover).and_then(timeline_svg) {
                let path = dir.join(&name);
                if let Err(e) = std::fs::write(&path, svg) {
                    eprintln!("bench-report: failed to write {}: {e}", path.display());
                    return std::process::ExitCode::FAILURE;
                }
            }
            eprintln!("bench-report: wrote {} from {} file(s) in {}", out.display(), files.len(), dir.display());
            std::process::ExitCode::SUCCESS
        }
    }
}

/// `{"meta": {…}}`: the benchmark, the command, the start time and the machine.
fn meta_line(name: &str, command: &str) -> Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
        .unwrap_or_default();
    let load: Vec<f64> = read("/proc/loadavg").split_whitespace().take(3).filter_map(|v| v.parse().ok()).collect();
    let started = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    json!({"meta": {
        "name": name,
        "command": command,
        "started": started,
        "nproc": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "kernel": read("/proc/sys/kernel/osrelease").trim(),
        "cpu": cpu,
        "loadavg": load,
    }})
}

/// One results file.
#[derive(Clone, Debug)]
struct RunFile {
    /// File name, e.g. `failover-2026-11-29.jsonl`.
    file: String,
    /// The date in the file name.
    date: String,
    /// 1 for `<name>-<date>.jsonl`, N for `<name>-<date>-N.jsonl`.
    seq: u32,
    /// The `meta` object, when the file has one.
    meta: Option<Value>,
    /// Every other JSON line.
    lines: Vec<Value>,
}

/// `<name>-<YYYY-MM-DD>[-N].jsonl` → (name, date, N).
fn parse_file_name(file: &str) -> Option<(String, String, u32)> {
    let stem = file.strip_suffix(".jsonl")?;
    let is_date = |s: &str| {
        s.len() == 10 && s.char_indices().all(|(i, c)| if i == 4 || i == 7 { c == '-' } else { c.is_ascii_digit() })
    };
    // With a sequence number: <name>-<date>-N.
    if let Some((rest, n)) = stem.rsplit_once('-')
        && let Ok(seq) = n.parse::<u32>()
        && rest.len() > 11
        && is_date(&rest[rest.len() - 10..])
        && rest.as_bytes()[rest.len() - 11] == b'-'
    {
        return Some((rest[..rest.len() - 11].to_owned(), rest[rest.len() - 10..].to_owned(), seq));
    }
    if stem.len() > 11 && is_date(&stem[stem.len() - 10..]) && stem.as_bytes()[stem.len() - 11] == b'-' {
        return Some((stem[..stem.len() - 11].to_owned(), stem[stem.len() - 10..].to_owned(), 1));
    }
    None
}

/// Parses one file's text.
fn parse_file(file: &str, text: &str) -> Option<RunFile> {
    let (_, date, seq) = parse_file_name(file)?;
    let mut meta = None;
    let mut lines = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| l.starts_with('{')) {
        let Ok(v) = serde_json::from_str::<Value>(line) else { continue };
        match v.get("meta") {
            Some(m) => meta = Some(m.clone()),
            None => lines.push(v),
        }
    }
    Some(RunFile { file: file.to_owned(), date, seq, meta, lines })
}

/// Every results file of `dir`, oldest first.
fn load_dir(dir: &Path) -> Result<Vec<RunFile>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("failed to read {}: {e}", dir.display()))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("failed to read {}: {e}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if parse_file_name(&name).is_none() {
            continue;
        }
        let text = std::fs::read_to_string(entry.path())
            .map_err(|e| format!("failed to read {}: {e}", entry.path().display()))?;
        files.extend(parse_file(&name, &text));
    }
    files.sort_by_key(order);
    Ok(files)
}

/// Oldest first: by the date in the name, then the recorded start time (files without one
/// first), then the sequence number.
fn order(f: &RunFile) -> (String, String, u32, String) {
    let started = f.meta.as_ref().and_then(|m| m.get("started")).and_then(Value::as_str).unwrap_or("");
    (f.date.clone(), started.to_owned(), f.seq, f.file.clone())
}

/// The kinds of result lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// bench-failover: one (system, scenario) summary.
    Failover,
    /// bench-failover: havip/keepalived ratios.
    Ratio,
    /// bench-failover: the agent's idle footprint with N VIPs (files before the idle rows).
    Footprint,
    /// bench-failover: one system holding N VIPs at idle, both nodes measured.
    Idle,
    /// bench-k8s: apply → VIP answering.
    ApplyToVip,
    /// bench-k8s: steady-state API requests.
    ApiSteady,
    /// bench-k8s: API requests during a failover.
    ApiFailover,
    /// bench-k8s: lease renewal rates computed from documented defaults.
    LeaseReference,
    /// bench-operator: one stage.
    OperatorStage,
    /// bench-scale: what was created.
    ScaleSetup,
    /// bench-scale: the operator in the big cluster.
    ScaleOperator,
    /// bench-scale: the agent of a node with two pairs in the big cluster.
    ScaleAgent,
    /// bench-failover: the median run's client probes around a move.
    Timeline,
    /// bench-failover: a system it could not run here (`{"system":…,"skipped":why}`).
    Skipped,
}

fn kind(v: &Value) -> Option<Kind> {
    if v.get("stage").is_some() {
        return Some(Kind::OperatorStage);
    }
    if v.get("ratio").is_some() {
        // The idle section computes its own ratios from the rows.
        return (v.get("bench").and_then(Value::as_str) != Some("idle")).then_some(Kind::Ratio);
    }
    if v.get("system").is_some() && v.get("skipped").is_some() {
        return Some(Kind::Skipped);
    }
    if v.get("system").is_some() && v.get("scenario").is_some() && v.get("p50_gap_ms").is_some() {
        return Some(Kind::Failover);
    }
    match v.get("bench").and_then(Value::as_str)? {
        "agent-idle-footprint" => Some(Kind::Footprint),
        "idle" => Some(Kind::Idle),
        "apply_to_vip" => Some(Kind::ApplyToVip),
        "api_requests_steady" => Some(Kind::ApiSteady),
        "api_requests_failover" => Some(Kind::ApiFailover),
        "lease_renewal_reference" => Some(Kind::LeaseReference),
        "scale_setup" => Some(Kind::ScaleSetup),
        "scale_operator" => Some(Kind::ScaleOperator),
        "scale_agent" => Some(Kind::ScaleAgent),
        "timeline" => Some(Kind::Timeline),
        _ => None,
    }
}

fn rows(f: &RunFile, k: Kind) -> Vec<&Value> {
    f.lines.iter().filter(|v| kind(v) == Some(k)).collect()
}

/// The newest file with rows of kind `k`.
fn newest(files: &[RunFile], k: Kind) -> Option<&RunFile> {
    files.iter().rev().find(|f| !rows(f, k).is_empty())
}

fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

fn text(v: &Value, key: &str) -> String {
    match v.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => "–".to_owned(),
        Some(other) => other.to_string(),
    }
}

/// A number with `digits` decimals, or "–".
fn fmt(x: Option<f64>, digits: usize) -> String {
    match x {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        _ => "–".to_owned(),
    }
}

/// KiB → MiB with one decimal.
fn mib(kib: Option<f64>) -> String {
    fmt(kib.map(|k| k / 1024.0), 1)
}

/// The "where these numbers come from" line of a section.
fn provenance(f: &RunFile) -> String {
    let mut out = format!("Source: [`docs/bench/{0}`](bench/{0})", f.file);
    match &f.meta {
        Some(m) => {
            let _ = write!(out, ", started {}", text(m, "started"));
            let _ = write!(out, " on {} CPU(s)", text(m, "nproc"));
            let cpu = text(m, "cpu");
            if cpu != "–" && !cpu.is_empty() {
                let _ = write!(out, " ({cpu})");
            }
            let _ = write!(out, ", Linux {}", text(m, "kernel"));
            if let Some(load) = m.get("loadavg").and_then(Value::as_array).filter(|l| !l.is_empty()) {
                let l: Vec<String> = load.iter().map(|x| fmt(x.as_f64(), 2)).collect();
                let _ = write!(out, ", load average at start {} (a shared machine)", l.join(" / "));
            }
            let _ = write!(out, ".\nCommand: `{}`.", text(m, "command"));
        }
        None => {
            let _ = write!(
                out,
                " ({}); this file predates `make bench` and does not record its command line or machine.",
                f.date
            );
        }
    }
    out
}

fn table(out: &mut String, header: &[&str], body: Vec<Vec<String>>) {
    let _ = writeln!(out, "| {} |", header.join(" | "));
    let _ = writeln!(out, "|{}", header.iter().map(|_| "---|").collect::<String>());
    for r in body {
        let _ = writeln!(out, "| {} |", r.join(" | "));
    }
    out.push('\n');
}

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

The gap is the longest time between two successful connects of a client that connects to \
VIP:8080 every 5 ms with a 50 ms timeout; \"failed connects\" counts the connection \
attempts that failed in the worst run. Systems: `havip` with its defaults (heartbeat \
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

const DOCUMENTED: &str = "\
These are the other projects' own documented defaults and claims, or arithmetic on them, \
each with its source; none of them was measured here.

| system | setting | failover time | kind | source |
|---|---|---|---|---|
| keepalived (VRRPv2) | advert_int 1 s, priority 100 | 3.6 s (3 × advert + skew) | computed from documented defaults | keepalived.conf(5), `vrrp.h`; RFC 5798 §6.1; acassen/keepalived#1458 |
| keepalived (VRRPv3) | advert_int 0.1 s, priority 100 | 0.36 s | computed | same formula |
| kube-vip | lease 15 s / renew 10 s / retry 2 s (defaults since kube-vip#1429; 5/3/1 before) | ≈ 13–20 s | computed from client-go semantics; \"~15 s\" user report | `cmd/kube-vip.go`; rwlove/home-ops#13727 |
| MetalLB L2 | memberlist LAN defaults | \"within a few seconds\"; ≈ 5–6 s | documented; computed from memberlist | metallb.io/concepts/layer2; hashicorp/memberlist `suspicionTimeout` |
| Cilium L2 announcements | lease 15 s / renew 5 s / retry 2 s | 10–20 s (2–4 s with 3 s / 1 s / 200 ms) | documented | docs.cilium.io network/l2-announcements |
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

fn failover_section(out: &mut String, files: &[RunFile]) {
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
    let with_drain = rows(f, Kind::Failover).into_iter().any(is_drain_scenario);
    if with_drain {
        out.push_str(DRAIN_SCENARIOS);
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

/// The SVG drawn from a failover file's `timeline` lines, and its file name (the
/// results file's, `.svg`): a panel per scenario, a row per system, each probe a bar from
/// its start to its end, blue for the old holder, green for the new one, red for a failed
/// connect. `None` without timelines.
fn timeline_svg(f: &RunFile) -> Option<(String, String)> {
    let lines = rows(f, Kind::Timeline);
    if lines.is_empty() {
        return None;
    }
    struct Row<'a> {
        system: &'a str,
        gap: f64,
        probes: Vec<(f64, f64, Option<&'a str>)>,
    }
    let mut panels: Vec<(&str, Vec<Row<'_>>)> = Vec::new();
    for v in lines {
        let scenario = v.get("scenario").and_then(Value::as_str).unwrap_or("?");
        let probes = v
            .get("probes")
            .and_then(Value::as_array)
            .map(|ps| {
                ps.iter()
                    .filter_map(|p| {
                        let p = p.as_array()?;
                        Some((p.first()?.as_f64()?, p.get(1)?.as_f64()?, p.get(2).and_then(Value::as_str)))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let row = Row {
            system: v.get("system").and_then(Value::as_str).unwrap_or("?"),
            gap: num(v, "gap_ms").unwrap_or(0.0),
            probes,
        };
        match panels.iter_mut().find(|(s, _)| *s == scenario) {
            Some((_, rows)) => rows.push(row),
            None => panels.push((scenario, vec![row])),
        }
    }
    const W: f64 = 960.0;
    const LEFT: f64 = 230.0;
    const RIGHT: f64 = 20.0;
    const ROW: f64 = 26.0;
    const PANEL_HEAD: f64 = 46.0;
    const AXIS: f64 = 30.0;
    let esc = |s: &str| s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    let height: f64 = 40.0 + panels.iter().map(|(_, rows)| PANEL_HEAD + ROW * rows.len() as f64 + AXIS).sum::<f64>();
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" viewBox="0 0 {W} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r##"<rect width="{W}" height="{height}" fill="#ffffff"/>"##);
    let _ = writeln!(
        svg,
        r##"<text x="10" y="20" font-size="14" font-weight="bold">Client connects around a move ({})</text>"##,
        esc(&f.file)
    );
    for (i, (label, color)) in
        [("old holder answered", "#4878d0"), ("new holder answered", "#3a9d4a"), ("connect failed", "#d65f5f")]
            .iter()
            .enumerate()
    {
        let x = W - 520.0 + 170.0 * i as f64;
        let _ = writeln!(svg, r#"<rect x="{x}" y="10" width="12" height="12" fill="{color}"/>"#);
        let _ = writeln!(svg, r#"<text x="{}" y="20">{label}</text>"#, x + 16.0);
    }
    let mut y = 40.0;
    for (scenario, rows) in &panels {
        // One scale per panel, so the systems compare at a glance.
        let lo = rows.iter().flat_map(|r| r.probes.iter().map(|p| p.0)).fold(0.0_f64, f64::min);
        let hi = rows.iter().flat_map(|r| r.probes.iter().map(|p| p.1)).fold(1.0_f64, f64::max);
        let span = (hi - lo).max(1.0);
        let x_of = |ms: f64| LEFT + (ms - lo) / span * (W - LEFT - RIGHT);
        let _ = writeln!(
            svg,
            r#"<text x="10" y="{}" font-size="13" font-weight="bold">{}</text>"#,
            y + 24.0,
            esc(scenario)
        );
        y += PANEL_HEAD;
        for r in rows {
            let _ =
                writeln!(svg, r#"<text x="10" y="{}">{} — gap {:.1} ms</text>"#, y + ROW * 0.6, esc(r.system), r.gap);
            let first = r.probes.iter().find_map(|p| p.2);
            for (s, e, who) in &r.probes {
                let color = match who {
                    None => "#d65f5f",
                    Some(w) if Some(*w) == first => "#4878d0",
                    Some(_) => "#3a9d4a",
                };
                let (x0, x1) = (x_of(*s), x_of(*e));
                let _ = writeln!(
                    svg,
                    r#"<rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{color}"/>"#,
                    y + 4.0,
                    (x1 - x0).max(1.0),
                    ROW - 8.0
                );
            }
            y += ROW;
        }
        // The time axis: a tick every `step` ms.
        let step = [10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0]
            .into_iter()
            .find(|s| span / s <= 12.0)
            .unwrap_or(10_000.0);
        let _ = writeln!(svg, r##"<line x1="{LEFT}" y1="{y}" x2="{}" y2="{y}" stroke="#555555"/>"##, W - RIGHT);
        let mut t = (lo / step).ceil() * step;
        while t <= hi {
            let x = x_of(t);
            let _ = writeln!(svg, r##"<line x1="{x:.1}" y1="{y}" x2="{x:.1}" y2="{}" stroke="#555555"/>"##, y + 4.0);
            let _ = writeln!(svg, r#"<text x="{x:.1}" y="{}" text-anchor="middle">{t:.0} ms</text>"#, y + 16.0);
            t += step;
        }
        y += AXIS;
    }
    svg.push_str("</svg>\n");
    let name = format!("{}.svg", f.file.strip_suffix(".jsonl").unwrap_or(&f.file));
    Some((name, svg))
}

/// The keepalived system a havip profile is compared with: the same heartbeat interval.
fn idle_yardstick(system: &str) -> &'static str {
    if system == "havip-fast" { "keepalived-v3-30ms" } else { "keepalived-v3" }
}

/// The idle rows (both nodes of each system, side by side in one run) with the goals.
fn idle_section(out: &mut String, f: &RunFile) {
    let _ = writeln!(out, "{}\n", provenance(f));
    out.push_str(
        "Each system holds N VIPs on two nodes (havip: a standalone pair, release build, a listener probed on \
one port per VIP; keepalived: one VRRP instance with N virtual addresses) and sits idle for the window; both \
daemons are measured at once. CPU is user + system time from every thread's `schedstat` (nanoseconds, both \
nodes together, per minute of wall time); wakeups are the times a thread was scheduled in; packets are what \
each node sent on its interfaces (heartbeats or adverts, probes, ARP); the private memory is the part of the \
RSS that is the process's own (`smaps_rollup` Private_*), the rest being pages of the executable and \
libraries shared with every process that maps them. havip is compared with keepalived at \
the same heartbeat interval: the Standard profile (100 ms) with VRRPv3 `advert_int 0.1`, the Fast profile \
(30 ms) with `advert_int 0.03`.\n\n",
    );
    let mut r = rows(f, Kind::Idle);
    r.sort_by(|a, b| {
        num(a, "vips")
            .unwrap_or(0.0)
            .total_cmp(&num(b, "vips").unwrap_or(0.0))
            .then(text(a, "system").cmp(&text(b, "system")))
    });
    let total = |v: &Value| num(v, "cpu_ms_per_min_total");
    let yard = |v: &Value| {
        let (sys, vips) = (text(v, "system"), num(v, "vips"));
        r.iter().find(|k| text(k, "system") == idle_yardstick(&sys) && num(k, "vips") == vips).and_then(|k| total(k))
    };
    let node = |v: &Value, n: &str, key: &str| v.get(n).and_then(|x| x.get(key)).and_then(Value::as_f64);
    let mut goals = Vec::new();
    let body = r
        .iter()
        .map(|v| {
            let sys = text(v, "system");
            let per_packet = total(v)
                .zip(num(v, "packets_per_s_total"))
                .filter(|(_, p)| *p > 0.0)
                .map(|(c, p)| c * 1000.0 / (p * 60.0));
            let ratio = if sys.starts_with("havip") { total(v).zip(yard(v)).map(|(h, k)| h / k) } else { None };
            let rss = match (node(v, "active", "rss_kib"), node(v, "standby", "rss_kib")) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
            if sys == "havip" {
                let vips = num(v, "vips").unwrap_or(0.0);
                let limit = if vips <= 1.0 {
                    Some(2.0)
                } else if vips >= 100.0 {
                    Some(3.0)
                } else {
                    None
                };
                if let (Some(limit), Some(x)) = (limit, ratio) {
                    let verdict = if x <= limit { "met" } else { "**missed**" };
                    goals.push(format!(
                        "{} VIP(s): {:.2} × keepalived (goal ≤ {limit} ×): {verdict}",
                        text(v, "vips"),
                        x
                    ));
                }
                if let Some(rss) = rss {
                    let verdict = if rss <= 12.0 * 1024.0 { "met" } else { "**missed**" };
                    goals.push(format!(
                        "{} VIP(s): largest RSS {} MiB (goal ≤ 12 MiB): {verdict}",
                        text(v, "vips"),
                        mib(Some(rss))
                    ));
                }
            }
            vec![
                text(v, "vips"),
                sys,
                fmt(total(v), 1),
                format!(
                    "{} / {}",
                    fmt(node(v, "active", "cpu_ms_per_min"), 1),
                    fmt(node(v, "standby", "cpu_ms_per_min"), 1)
                ),
                format!(
                    "{} / {}",
                    fmt(node(v, "active", "wakeups_per_s"), 1),
                    fmt(node(v, "standby", "wakeups_per_s"), 1)
                ),
                fmt(num(v, "packets_per_s_total"), 1),
                fmt(per_packet, 0),
                format!(
                    "{} ({}) / {} ({})",
                    mib(node(v, "active", "rss_kib")),
                    mib(node(v, "active", "private_kib")),
                    mib(node(v, "standby", "rss_kib")),
                    mib(node(v, "standby", "private_kib"))
                ),
                ratio.map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    table(
        out,
        &[
            "VIPs",
            "system",
            "CPU ms/min (both nodes)",
            "CPU ms/min (active / standby)",
            "wakeups/s (active / standby)",
            "packets/s sent (both)",
            "CPU µs per packet sent",
            "RSS MiB, private in brackets (active / standby)",
            "× keepalived, same interval",
        ],
        body,
    );
    if !goals.is_empty() {
        out.push_str("Goals (issue 17): ");
        out.push_str(&goals.join("; "));
        out.push_str(".\n\n");
    }
}

fn footprint_section(out: &mut String, files: &[RunFile]) {
    out.push_str("## The agent at idle (measured here)\n\n");
    if let Some(f) = newest(files, Kind::Idle) {
        idle_section(out, f);
        return;
    }
    let Some(f) = newest(files, Kind::Footprint) else {
        out.push_str("No results yet: run `make bench`.\n\n");
        return;
    };
    let _ = writeln!(out, "{}\n", provenance(f));
    out.push_str(
        "One standalone pair (two agents, release build) holding N VIPs, each with a listener probed on one \
port; resident set size and CPU (user + system, percent of one core) of each agent over the idle window, \
read from `/proc`.\n\n",
    );
    let mut r = rows(f, Kind::Footprint);
    r.sort_by(|a, b| num(a, "vips").unwrap_or(0.0).total_cmp(&num(b, "vips").unwrap_or(0.0)));
    let body = r
        .into_iter()
        .map(|v| {
            vec![
                text(v, "vips"),
                mib(num(v, "active_rss_kib")),
                fmt(num(v, "active_cpu_percent"), 2),
                mib(num(v, "standby_rss_kib")),
                fmt(num(v, "standby_cpu_percent"), 2),
                format!("{} s", text(v, "idle_seconds")),
            ]
        })
        .collect();
    table(out, &["VIPs", "active RSS (MiB)", "active CPU (%)", "standby RSS (MiB)", "standby CPU (%)", "window"], body);
    out.push_str(
        "For scale (reported by others, not measured here): keepalived 1.6 MiB (acassen/keepalived#658); \
kube-vip 21–71 MiB and 2–13 mCPU per pod (kube-vip/kube-vip#1370).\n\n",
    );
}

/// Requests per minute on Leases, from a `"<verb> <resource>"` or `"<resource>:<verb>"` map.
fn lease_rate(by: &serde_json::Map<String, Value>, seconds: f64) -> f64 {
    by.iter()
        .filter(|(k, _)| k.ends_with(" leases") || k.starts_with("leases:"))
        .filter_map(|(_, n)| n.as_f64())
        .sum::<f64>()
        * 60.0
        / seconds.max(1.0)
}

fn api_section(out: &mut String, files: &[RunFile]) {
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

fn operator_section(out: &mut String, files: &[RunFile]) {
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

/// "yes" / "no (…)" for a goal.
fn goal(v: &Value) -> &'static str {
    match v.get("goal_met").and_then(Value::as_bool) {
        Some(true) => "met",
        Some(false) => "**missed**",
        None => "–",
    }
}

fn scale_section(out: &mut String, files: &[RunFile]) {
    out.push_str("## havip in a big cluster (measured here)\n\n");
    out.push_str(
        "How many pairs a node may carry: there is no fixed limit. One agent serves every pair of its node over one \
UDP socket per (local address, heartbeat port), so pairs may share a port (the default 7946) or use different ones; \
a second process on the same address and port refuses to start. Each pair costs the agent its heartbeats (pairs × \
peers × paths × 10 datagrams/s at the default interval), its probes and about 1 MiB; the end-to-end suites run two \
and three pairs per node (README, \"Many pairs on the same nodes\"). An agent watches only its own node's objects, \
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
pairs, {} of them on the lab's two network-namespace nodes with real agents (each pair its own VIP and service), the \
others over the synthetic Nodes with one FloatingIP each, created in {} s. Simulated agents take those pairs' Leases \
and report, then keep refreshing each member entry once a minute, as real agents do. The measured agent restarts once \
the cluster is full (its start-up path), then serves its two pairs through the steady window. RSS from `/proc`; the \
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
            format!("≤ {} MiB: {}", text(v, "goal_rss_mib"), goal(v)),
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
            format!("{} MiB; largest in the window {} MiB", mib(num(v, "rss_kib")), mib(num(v, "rss_kib_max"))),
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

fn history_section(out: &mut String, files: &[RunFile]) {
    out.push_str("## Every results file\n\n");
    out.push_str(
        "The sections above show the newest file of each kind. All files, oldest first (failover lines: \
havip's and keepalived's p50 gap per scenario):\n\n",
    );
    for f in files {
        let mut summary = Vec::new();
        for v in rows(f, Kind::Failover) {
            summary.push(format!(
                "{} {} p50 {} ms",
                text(v, "system"),
                text(v, "scenario"),
                fmt(num(v, "p50_gap_ms"), 1)
            ));
        }
        for v in rows(f, Kind::Footprint) {
            summary.push(format!(
                "{} VIP(s): active {} MiB / {} %",
                text(v, "vips"),
                mib(num(v, "active_rss_kib")),
                fmt(num(v, "active_cpu_percent"), 2)
            ));
        }
        for v in rows(f, Kind::ApiSteady) {
            summary.push(format!("{} requests/pair/min", fmt(num(v, "requests_per_pair_per_minute"), 1)));
        }
        for v in rows(f, Kind::OperatorStage).into_iter().filter(|v| text(v, "stage") == "steady") {
            summary.push(format!("{} pairs: operator {} MiB", text(v, "pairs"), mib(num(v, "rss_kib"))));
        }
        for v in rows(f, Kind::ScaleAgent) {
            summary.push(format!(
                "{} Nodes, {} pairs: agent {} MiB, {} watch events/min",
                text(v, "nodes"),
                text(v, "pairs"),
                mib(num(v, "rss_kib_max")),
                fmt(num(v, "watch_events_per_minute"), 1)
            ));
        }
        for v in rows(f, Kind::ScaleOperator) {
            summary.push(format!(
                "operator {} MiB, Live in {} s",
                mib(num(v, "rss_kib_max")),
                text(v, "time_to_live_all_s")
            ));
        }
        let runs = f.meta.as_ref().map(|m| format!(" — `{}`", text(m, "command"))).unwrap_or_default();
        let _ = writeln!(out, "- [`{0}`](bench/{0}){runs}: {1}", f.file, summary.join("; "));
    }
    out.push('\n');
}

/// The whole report.
fn render(files: &[RunFile]) -> String {
    let mut out = String::new();
    out.push_str("# Benchmarks\n\n");
    out.push_str(
        "<!-- Generated by `make bench` (e2e/src/bin/bench-report.rs) from docs/bench/*.jsonl; do not edit by \
hand: re-run `make bench`, or `make bench-report` to re-render. -->\n\n",
    );
    out.push_str(
        "Every number in the tables below was measured on this project's harness unless its row says \
**computed from documented defaults** (arithmetic on another project's documented settings) or it sits in \
the section \"What the others document\". Each section names its results file, the command that produced \
it, when, and the machine. The machine is shared with other builds and tests, so CPU figures are upper \
bounds and gaps include some scheduling noise.\n\n",
    );
    failover_section(&mut out, files);
    footprint_section(&mut out, files);
    api_section(&mut out, files);
    operator_section(&mut out, files);
    scale_section(&mut out, files);
    out.push_str("## What the others document (not measured here)\n\n");
    out.push_str(DOCUMENTED);
    out.push('\n');
    history_section(&mut out, files);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAILOVER: &str = r#"{"meta":{"name":"failover","command":"target/release/bench-failover --runs 5","started":"2026-11-30T10:00:00Z","nproc":2,"kernel":"6.18.0","cpu":"Test CPU","loadavg":[1.5,1.25,1.0]}}
{"failed_connects_max":7,"max_gap_ms":354.3,"p50_gap_ms":307.0,"p99_gap_ms":354.3,"runs":5,"runs_without_takeover":0,"scenario":"cut","system":"havip"}
{"failed_connects_max":49,"max_gap_ms":2475.5,"p50_gap_ms":2472.3,"p99_gap_ms":2475.5,"runs":5,"runs_without_takeover":0,"scenario":"cut","system":"keepalived-v2"}
{"p50_gap_ratio":0.124,"p99_gap_ratio":0.143,"ratio":"havip/keepalived-v2","scenario":"cut"}
{"active_cpu_percent":1.0,"active_rss_kib":7448,"bench":"agent-idle-footprint","idle_seconds":20,"standby_cpu_percent":0.95,"standby_rss_kib":7536,"vips":1}
{"active_cpu_percent":4.1,"active_rss_kib":7928,"bench":"agent-idle-footprint","idle_seconds":20,"standby_cpu_percent":4.95,"standby_rss_kib":7880,"vips":100}
{"bench":"idle","system":"havip","profile":"Standard","vips":1,"window_s":30.0,"cpu_ms_per_min_total":200.0,"packets_per_s_total":44.0,"active":{"cpu_ms_per_min":100.0,"wakeups_per_s":20.0,"rss_kib":11000,"private_kib":1500,"threads_exited":0,"packets_per_s":22.0},"standby":{"cpu_ms_per_min":100.0,"wakeups_per_s":20.0,"rss_kib":11500,"private_kib":1600,"threads_exited":0,"packets_per_s":22.0}}
{"bench":"idle","system":"keepalived-v3","profile":"VRRPv3","vips":1,"window_s":30.0,"cpu_ms_per_min_total":80.0,"packets_per_s_total":10.0,"active":{"cpu_ms_per_min":60.0,"wakeups_per_s":10.0,"rss_kib":13000,"threads_exited":0,"packets_per_s":10.0},"standby":{"cpu_ms_per_min":20.0,"wakeups_per_s":10.0,"rss_kib":13000,"threads_exited":0,"packets_per_s":0.0}}
{"bench":"idle","cpu_ratio":2.5,"ratio":"havip/keepalived-v3","vips":1}
not json at all
"#;

    const K8S: &str = r#"{"meta":{"name":"k8s","command":"target/release/bench-k8s","started":"2026-11-30T10:30:00Z","nproc":2,"kernel":"6.18.0","cpu":"","loadavg":[]}}
{"bench":"apply_to_vip","ms":1834,"vip_answered":true,"apply_to_live_ms":2210,"live":true}
{"bench":"api_requests_steady","pairs":1,"members":2,"seconds":60,"requests_per_pair_per_minute":41.5,"writes_per_pair_per_minute":36.0,"lease_writes_per_minute":36.0,"by_verb_resource":{"PUT leases":36.0,"GET leases":5.5}}
{"bench":"api_requests_failover","window_seconds":12,"status_failed_over_ms":1650,"failed_over":true,"requests":57.0,"writes":19.0,"by_verb_resource":{}}
{"bench":"lease_renewal_reference","system":"kube-vip","computed_from_documented_defaults":true,"lease_duration_s":15.0,"renew_deadline_s":10.0,"retry_period_s":2.0,"requests_per_vip_per_minute":57.3,"writes_per_vip_per_minute":30.0}
{"bench":"lease_renewal_reference","system":"cilium-l2","computed_from_documented_defaults":true,"lease_duration_s":15.0,"renew_deadline_s":5.0,"retry_period_s":2.0,"requests_per_vip_per_minute":57.3,"writes_per_vip_per_minute":30.0}
"#;

    const OPERATOR: &str = r#"{"stage":"created","seconds":12.5,"rss_kib":40960,"cpu_seconds":3.2,"reconciles":900.0,"reconcile_mean_ms":4.1,"reconcile_p50_ms_le":5.0,"reconcile_p99_ms_le":50.0,"status_writes":800.0,"errors":0.0,"pairs":1000}
{"stage":"steady","seconds":95.0,"rss_kib":61440,"cpu_seconds":20.5,"reconciles":5000.0,"reconcile_mean_ms":3.3,"reconcile_p50_ms_le":5.0,"reconcile_p99_ms_le":25.0,"status_writes":3000.0,"errors":0.0,"pairs":1000,"window_seconds":30.0,"reconciles_per_second":16.67,"reconcile_mean_ms_in_window":1.25,"status_writes_in_window":0.0,"cpu_seconds_in_window":0.8,"apiserver_requests_in_window":{"leases:GET":3.0}}
"#;

    const SCALE: &str = r#"{"meta":{"name":"scale","command":"target/release/bench-scale --nodes 5000 --pairs 1000","started":"2026-11-30T11:00:00Z","nproc":2,"kernel":"6.18.0","cpu":"","loadavg":[]}}
{"bench":"scale_setup","nodes":5000,"node_status_bytes":20610,"pairs":1000,"real_pairs":2,"create_nodes_s":95.2,"create_pairs_s":31.0}
{"bench":"scale_operator","nodes":5000,"pairs":1000,"build":"release","rss_kib_idle_with_nodes":40960,"rss_kib_live":61440,"rss_kib_end":61440,"rss_kib_max":70000,"pairs_converged":1000,"converged_s":40.5,"pairs_live":1000,"time_to_live_all_s":88.8,"goal_rss_mib":256,"goal_met":true}
{"bench":"scale_agent","node":"n0","own_pairs":2,"nodes":5000,"pairs":1000,"build":"release","restarted_and_live":true,"rss_kib":20480,"rss_kib_max":21504,"window_seconds":120,"watch_events_per_minute":6.5,"watch_events_per_minute_by_kind":{"HAPair":6.0,"FloatingIP":0.5},"objects_listed_at_start":7,"cluster_hapair_status_writes_per_minute":1996,"goal_rss_mib":32,"goal_met":false}
"#;

    #[test]
    fn the_scale_section_shows_both_processes_and_their_goals() {
        let files: Vec<RunFile> = parse_file("scale-2026-11-30.jsonl", SCALE).into_iter().collect();
        let md = render(&files);
        assert!(md.contains("## havip in a big cluster (measured here)"), "{md}");
        assert!(
            md.contains(
                "the end-to-end suites run two \
and three pairs per node"
            ),
            "{md}"
        );
        assert!(md.contains("5000 synthetic Nodes with 20610 bytes of status"), "{md}");
        assert!(md.contains("| operator (release build) | idle with the Nodes 40.0 MiB; all pairs Live 60.0 MiB; largest 68.4 MiB | 1000 of 1000 pairs Live 88.8 s after they were created (1000 converged after 40.5 s) | ≤ 256 MiB: met |"), "{md}");
        assert!(md.contains("| agent on n0 (2 pairs, release build) | 20.0 MiB; largest in the window 21.0 MiB | 6.5 watch events/min (FloatingIP 0.5, HAPair 6.0) while the cluster wrote 1996 HAPair statuses/min; 7 objects in its start-up lists | ≤ 32 MiB: **missed** |"), "{md}");
        assert!(md.contains("5000 Nodes, 1000 pairs: agent 21.0 MiB, 6.5 watch events/min"), "{md}");
    }

    fn sample() -> Vec<RunFile> {
        let mut files = vec![
            parse_file("failover-2026-11-29.jsonl", "{\"failed_connects_max\":1,\"max_gap_ms\":999.9,\"p50_gap_ms\":888.8,\"p99_gap_ms\":999.9,\"runs\":10,\"runs_without_takeover\":0,\"scenario\":\"cut\",\"system\":\"havip\"}\n"),
            parse_file("failover-2026-11-30.jsonl", FAILOVER),
            parse_file("k8s-2026-11-30.jsonl", K8S),
            parse_file("operator-2026-11-30-2.jsonl", OPERATOR),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>();
        files.sort_by_key(order);
        files
    }

    #[test]
    fn file_names_give_name_date_and_sequence() {
        assert_eq!(parse_file_name("failover-2026-11-29.jsonl"), Some(("failover".into(), "2026-11-29".into(), 1)));
        assert_eq!(parse_file_name("k8s-2026-11-29-3.jsonl"), Some(("k8s".into(), "2026-11-29".into(), 3)));
        assert_eq!(parse_file_name("bench-k8s-2026-01-02.jsonl"), Some(("bench-k8s".into(), "2026-01-02".into(), 1)));
        assert_eq!(parse_file_name("notes.md"), None);
        assert_eq!(parse_file_name("failover.jsonl"), None);
        assert_eq!(parse_file_name("failover-2026-1-29.jsonl"), None);
    }

    #[test]
    fn the_tables_contain_the_numbers_of_the_newest_files() {
        let md = render(&sample());
        // Failover: the newest file's rows, not the older one's.
        assert!(md.contains("| cut | havip | 5 | 307.0 | 354.3 | 354.3 | 7 | 0 |"), "{md}");
        assert!(md.contains("| cut | keepalived-v2 | 5 | 2472.3 | 2475.5 | 2475.5 | 49 | 0 |"), "{md}");
        assert!(md.contains("| cut | havip/keepalived-v2 | 0.124 | 0.143 |"), "{md}");
        assert!(!md.contains("| cut | havip | 10 | 888.8"), "an older file must not fill the main table: {md}");
        assert!(md.contains("888.8"), "older files are listed at the end: {md}");
        // Where it comes from.
        assert!(md.contains("Command: `target/release/bench-failover --runs 5`"), "{md}");
        assert!(md.contains("on 2 CPU(s) (Test CPU), Linux 6.18.0"), "{md}");
        assert!(md.contains("started 2026-11-30T10:00:00Z"), "{md}");
        assert!(md.contains("does not record its command line or machine"), "{md}");
        // Idle: both systems side by side, the ratio at the same interval, CPU per packet and the goals.
        assert!(
            md.contains(
                "| 1 | havip | 200.0 | 100.0 / 100.0 | 20.0 / 20.0 | 44.0 | 76 | 10.7 (1.5) / 11.2 (1.6) | 2.50 |"
            ),
            "{md}"
        );
        assert!(
            md.contains(
                "| 1 | keepalived-v3 | 80.0 | 60.0 / 20.0 | 10.0 / 10.0 | 10.0 | 133 | 12.7 (–) / 12.7 (–) | - |"
            ),
            "{md}"
        );
        assert!(md.contains("1 VIP(s): 2.50 × keepalived (goal ≤ 2 ×): **missed**"), "{md}");
        assert!(md.contains("largest RSS 11.2 MiB (goal ≤ 12 MiB): met"), "{md}");
        assert!(!md.contains("| cut | havip/keepalived-v3 | 2.5"), "idle ratios stay out of the failover table: {md}");
        // A file without idle rows still renders its footprint rows.
        let old_only: Vec<RunFile> = parse_file(
            "failover-2026-11-28.jsonl",
            "{\"active_cpu_percent\":1.0,\"active_rss_kib\":7448,\"bench\":\"agent-idle-footprint\",\"idle_seconds\":20,\"standby_cpu_percent\":0.95,\"standby_rss_kib\":7536,\"vips\":1}\n",
        )
        .into_iter()
        .collect();
        assert!(render(&old_only).contains("| 1 | 7.3 | 1.00 | 7.4 | 0.95 | 20 s |"));
        // API requests: measured and computed rows, labelled.
        assert!(md.contains("| havip, all requests (1 pair, 2 members) | measured | 41.5 | 36.0 |"), "{md}");
        assert!(
            md.contains("| havip, without Lease requests: the part that grows with the pairs | measured | 0.0 | 0.0 |"),
            "{md}"
        );
        assert!(md.contains("Lease requests were 41.5/min"), "{md}");
        assert!(md.contains("saw 6.0 Lease requests/min in its steady window with 1000 pairs"), "{md}");
        assert!(md.contains("| kube-vip (per VIP) | **computed from documented defaults** | 57.3 | 30.0 | lease 15.0 s / renew deadline 10.0 s / retry period 2.0 s |"), "{md}");
        assert!(md.contains("| cilium-l2 (per VIP) | **computed from documented defaults** | 57.3 |"), "{md}");
        assert!(md.contains("| PUT leases | 36 | 36.0 |"), "{md}");
        assert!(md.contains("1834 ms"), "{md}");
        assert!(md.contains("read FailedOver 1650 ms after the cut"), "{md}");
        // Operator.
        assert!(md.contains("| steady | 1000 | 95.0 | 60.0 | 20.50 | 5000 | 3.30 | 25 | 3000 | 0 |"), "{md}");
        assert!(md.contains("16.67 reconciles/s"), "{md}");
    }

    #[test]
    fn a_failover_wait_that_ran_out_is_explained_not_reported_as_a_time() {
        let k8s = K8S.replace(r#""failed_over":true"#, r#""failed_over":false"#);
        let files: Vec<RunFile> = parse_file("k8s-2026-11-30.jsonl", &k8s).into_iter().collect();
        let md = render(&files);
        assert!(md.contains("did not read FailedOver within 1650 ms"), "{md}");
        assert!(!md.contains("read FailedOver 1650 ms after the cut"), "{md}");
    }

    #[test]
    fn the_timelines_are_drawn_from_their_json_lines_and_linked_from_the_report() {
        let timelines = r#"{"bench":"timeline","system":"havip","scenario":"cut","gap_ms":310.0,"interval_ms":5,"probes":[[-10.0,-9.5,"n0"],[-5.0,45.0,null],[300.0,310.0,"n1"]]}
{"bench":"timeline","system":"keepalived-v3","scenario":"cut","gap_ms":360.0,"interval_ms":5,"probes":[[-10.0,-9.0,"n0"],[355.0,360.0,"n1"]]}
{"bench":"timeline","system":"havip","scenario":"planned","gap_ms":6.0,"interval_ms":5,"probes":[[-5.0,-4.0,"n0"],[1.0,6.0,"n1"]]}
"#;
        let text = format!("{FAILOVER}{timelines}");
        let files: Vec<RunFile> = parse_file("failover-2026-11-30.jsonl", &text).into_iter().collect();
        let (name, svg) = timeline_svg(&files[0]).expect("an SVG");
        assert_eq!(name, "failover-2026-11-30.svg");
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\"") && svg.trim_end().ends_with("</svg>"));
        // One bar per probe (7), plus the background and the 3 legend swatches.
        assert_eq!(svg.matches("<rect ").count(), 7 + 4, "{svg}");
        assert_eq!(svg.matches(r##"fill="#d65f5f""##).count(), 1 + 1, "one failed connect plus its legend swatch");
        assert_eq!(svg.matches(r##"fill="#3a9d4a""##).count(), 3 + 1, "three answers of the new holder");
        for label in ["havip — gap 310.0 ms", "keepalived-v3 — gap 360.0 ms", ">cut<", ">planned<", "0 ms"] {
            assert!(svg.contains(label), "{label}: {svg}");
        }
        let md = render(&files);
        assert!(md.contains("](bench/failover-2026-11-30.svg)"), "{md}");
        // Without timelines: no picture, no link.
        let plain: Vec<RunFile> = parse_file("failover-2026-11-30.jsonl", FAILOVER).into_iter().collect();
        assert!(timeline_svg(&plain[0]).is_none());
        assert!(!render(&plain).contains(".svg"));
    }

    #[test]
    fn metallb_rows_render_with_their_ratios_and_a_skip_is_said() {
        let metallb = r#"{"failed_connects_max":131,"max_gap_ms":6604.6,"p50_gap_ms":6160.4,"p99_gap_ms":6604.6,"runs":5,"runs_without_takeover":0,"scenario":"cut","system":"metallb-l2"}
{"p50_gap_ratio":0.05,"p99_gap_ratio":0.054,"ratio":"havip/metallb-l2","scenario":"cut"}
"#;
        let text = format!("{FAILOVER}{metallb}");
        let files: Vec<RunFile> = parse_file("failover-2026-12-02.jsonl", &text).into_iter().collect();
        let md = render(&files);
        assert!(md.contains("## Failover gaps: havip, keepalived and MetalLB side by side (measured here)"), "{md}");
        assert!(md.contains("| cut | metallb-l2 | 5 | 6160.4 | 6604.6 | 6604.6 | 131 | 0 |"), "{md}");
        assert!(md.contains("| cut | havip/metallb-l2 | 0.050 | 0.054 |"), "{md}");
        assert!(md.contains("`metallb-l2`: MetalLB v0.15.2 in layer-2 mode"), "{md}");
        // A run without MetalLB built says so and keeps the old title.
        let skipped = r#"{"system":"metallb-l2","skipped":"MetalLB v0.15.2 is not built"}"#;
        let text = format!("{FAILOVER}{skipped}\n");
        let files: Vec<RunFile> = parse_file("failover-2026-12-02.jsonl", &text).into_iter().collect();
        let md = render(&files);
        assert!(md.contains("## Failover gaps: havip and keepalived side by side"), "{md}");
        assert!(md.contains("Not run for this file: `metallb-l2` (MetalLB v0.15.2 is not built)."), "{md}");
        assert!(!md.contains("`metallb-l2`: MetalLB v0.15.2 in layer-2 mode"), "{md}");
    }

    #[test]
    fn the_planned_moves_that_keep_connections_have_tables_of_their_own() {
        let drain = r#"{"failed_connects_max":0,"longlived_break_kinds":{"reset":20},"longlived_broken_max":0,"longlived_broken_total":0,"longlived_connections":20,"longlived_cut_at_drain_end_max":20,"max_gap_ms":7.1,"mid_handshake_failed_max":0,"mid_handshake_per_run":4,"p50_gap_ms":6.2,"p99_gap_ms":7.1,"resets_max":0,"runs":5,"runs_without_takeover":0,"scenario":"planned-drain","system":"havip"}
{"failed_connects_max":1,"longlived_break_kinds":{"reset":100},"longlived_broken_max":20,"longlived_broken_total":100,"longlived_connections":20,"longlived_cut_at_drain_end_max":null,"max_gap_ms":60.0,"mid_handshake_failed_max":4,"mid_handshake_per_run":4,"p50_gap_ms":55.2,"p99_gap_ms":60.0,"resets_max":0,"runs":5,"runs_without_takeover":0,"scenario":"planned-drain","system":"keepalived-v3"}
{"p50_gap_ratio":0.112,"p99_gap_ratio":0.118,"ratio":"havip/keepalived-v3","scenario":"planned-drain"}
{"failed_connects_max":0,"failed_connects_total":0,"failure_kinds":{},"lost_after_connect_total":0,"max_gap_ms":12.5,"mid_handshake":400,"mid_handshake_failed":0,"mid_handshake_kinds":{},"move_wait_p50_ms":13.7,"moves":200,"moves_asked":200,"p50_gap_ms":8.8,"p99_gap_ms":11.0,"resets_total":0,"runs":1,"runs_without_takeover":0,"scenario":"planned-200","stopped":null,"streams":4,"system":"havip"}
{"failed_connects_max":800,"failed_connects_total":800,"failure_kinds":{"connect_timeout":800,"read_timeout":3},"lost_after_connect_total":3,"max_gap_ms":70.5,"mid_handshake":400,"mid_handshake_failed":400,"mid_handshake_kinds":{"reset":400},"move_wait_p50_ms":0.0,"moves":200,"moves_asked":200,"p50_gap_ms":55.7,"p99_gap_ms":60.5,"resets_total":0,"runs":1,"runs_without_takeover":0,"scenario":"planned-200","stopped":null,"streams":4,"system":"keepalived-v3"}
{"p50_gap_ratio":0.158,"p99_gap_ratio":0.182,"ratio":"havip/keepalived-v3","scenario":"planned-200"}
"#;
        let files: Vec<RunFile> = parse_file("failover-2026-12-03.jsonl", drain).into_iter().collect();
        let md = render(&files);
        assert!(md.contains("- `planned-drain`: `planned` with 20 long-lived connections"), "{md}");
        assert!(md.contains("| havip | 5 | 0 of 20 | 20 | 0 of 4 | 0 | 0 | 6.2 |"), "{md}");
        assert!(md.contains("| keepalived-v3 | 5 | 20 of 20 | – | 4 of 4 | 1 | 0 | 55.2 |"), "{md}");
        assert!(
            md.contains("| havip | 200 × 4 streams | 0 | 0 | 0 (none) | 0 of 400 | 8.8 | 11.0 | 12.5 | 14 |"),
            "{md}"
        );
        assert!(
            md.contains("| keepalived-v3 | 200 × 4 streams | 800 | 0 | 3 (connect_timeout 800, read_timeout 3) | 400 of 400 | 55.7 | 60.5 | 70.5 | 0 |"),
            "{md}"
        );
        assert!(md.contains("| planned-200 | havip/keepalived-v3 | 0.158 | 0.182 |"), "{md}");
        // Without such rows, nothing of it.
        let files: Vec<RunFile> = parse_file("failover-2026-12-02.jsonl", FAILOVER).into_iter().collect();
        assert!(!render(&files).contains("planned-drain"));
    }

    #[test]
    fn missing_results_say_how_to_get_them() {
        let md = render(&[]);
        assert!(md.contains("No results yet: run `make bench`"), "{md}");
        assert!(md.contains("What the others document"), "{md}");
    }

    #[test]
    fn the_meta_line_names_the_command_and_the_machine() {
        let v = meta_line("failover", "make bench");
        let m = v.get("meta").expect("meta");
        assert_eq!(m.get("name").and_then(Value::as_str), Some("failover"));
        assert_eq!(m.get("command").and_then(Value::as_str), Some("make bench"));
        assert!(m.get("nproc").and_then(Value::as_u64).is_some_and(|n| n >= 1));
        assert!(m.get("started").and_then(Value::as_str).is_some_and(|s| s.ends_with('Z')));
    }
}
