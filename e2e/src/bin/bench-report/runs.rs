//! The results files: their names, their JSON lines and the kinds of those lines, and the
//! `meta` line that starts a file.

use serde_json::{Value, json};
use std::path::Path;

/// `{"meta": {…}}`: the benchmark, the command, the start time and the machine.
pub(crate) fn meta_line(name: &str, command: &str) -> Value {
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
pub(crate) struct RunFile {
    /// File name, e.g. `failover-2026-11-29.jsonl`.
    pub(crate) file: String,
    /// The date in the file name.
    pub(crate) date: String,
    /// 1 for `<name>-<date>.jsonl`, N for `<name>-<date>-N.jsonl`.
    pub(crate) seq: u32,
    /// The `meta` object, when the file has one.
    pub(crate) meta: Option<Value>,
    /// Every other JSON line.
    pub(crate) lines: Vec<Value>,
}

/// `<name>-<YYYY-MM-DD>[-N].jsonl` → (name, date, N).
pub(crate) fn parse_file_name(file: &str) -> Option<(String, String, u32)> {
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
pub(crate) fn parse_file(file: &str, text: &str) -> Option<RunFile> {
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
pub(crate) fn load_dir(dir: &Path) -> Result<Vec<RunFile>, String> {
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
pub(crate) fn order(f: &RunFile) -> (String, String, u32, String) {
    let started = f.meta.as_ref().and_then(|m| m.get("started")).and_then(Value::as_str).unwrap_or("");
    (f.date.clone(), started.to_owned(), f.seq, f.file.clone())
}

/// The kinds of result lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
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
    /// bench-failover: the control-plane VIP's API unavailability, one (system, scenario).
    ControlPlane,
    /// bench-failover: havip-cp's ratios to keepalived's control-plane variants.
    ControlPlaneRatio,
    /// bench-failover: the node holding every one of P pairs cut (first and last pair).
    MassCut,
}

pub(crate) fn kind(v: &Value) -> Option<Kind> {
    // (The first results file's ratio lines carry no `bench`: their key names them.)
    if v.get("bench").and_then(Value::as_str) == Some("control-plane") || v.get("p50_unavailable_ratio").is_some() {
        return Some(if v.get("ratio").is_some() {
            Kind::ControlPlaneRatio
        } else if v.get("skipped").is_some() {
            Kind::Skipped
        } else {
            Kind::ControlPlane
        });
    }
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
        "mass-cut" => Some(Kind::MassCut),
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

pub(crate) fn rows(f: &RunFile, k: Kind) -> Vec<&Value> {
    f.lines.iter().filter(|v| kind(v) == Some(k)).collect()
}

/// The newest file with rows of kind `k`.
pub(crate) fn newest(files: &[RunFile], k: Kind) -> Option<&RunFile> {
    files.iter().rev().find(|f| !rows(f, k).is_empty())
}
