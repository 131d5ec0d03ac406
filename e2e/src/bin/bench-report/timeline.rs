//! The picture of the probes around a move, drawn from a failover file's `timeline` lines.

use crate::markdown::num;
use crate::runs::{Kind, RunFile, rows};
use serde_json::Value;
use std::fmt::Write as _;

/// The SVG drawn from a failover file's `timeline` lines, and its file name (the
/// results file's, `.svg`): a panel per scenario, a row per system, each probe a bar from
/// its start to its end, blue for the old holder, green for the new one, red for a failed
/// connect. `None` without timelines.
pub(crate) fn timeline_svg(f: &RunFile) -> Option<(String, String)> {
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
