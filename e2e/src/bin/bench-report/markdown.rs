//! Writing the report: numbers, cells, tables, and where a section's numbers come from.

use crate::runs::RunFile;
use serde_json::Value;
use std::fmt::Write as _;

pub(crate) fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

pub(crate) fn text(v: &Value, key: &str) -> String {
    match v.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => "–".to_owned(),
        Some(other) => other.to_string(),
    }
}

/// A number with `digits` decimals, or "–".
pub(crate) fn fmt(x: Option<f64>, digits: usize) -> String {
    match x {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        _ => "–".to_owned(),
    }
}

/// KiB → MiB with one decimal.
pub(crate) fn mib(kib: Option<f64>) -> String {
    fmt(kib.map(|k| k / 1024.0), 1)
}

/// The "where these numbers come from" line of a section.
pub(crate) fn provenance(f: &RunFile) -> String {
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

pub(crate) fn table(out: &mut String, header: &[&str], body: Vec<Vec<String>>) {
    let _ = writeln!(out, "| {} |", header.join(" | "));
    let _ = writeln!(out, "|{}", header.iter().map(|_| "---|").collect::<String>());
    for r in body {
        let _ = writeln!(out, "| {} |", r.join(" | "));
    }
    out.push('\n');
}
