//! What a prober saw: every [`Probe`], and the [`ProbeReport`] computed from them (gaps,
//! runs of one responder, failures by kind, slices of a time window).

use serde::Serialize;
use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Why one probe failed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize, thiserror::Error)]
pub enum ProbeError {
    /// RST to the SYN: the address is there, nothing listens.
    #[error("connection refused")]
    Refused,
    /// No answer to the SYN within the connect timeout (nobody has the address,
    /// ARP unresolved, or packets dropped).
    #[error("connect timed out")]
    ConnectTimeout,
    /// ICMP unreachable or no route (`EHOSTUNREACH`/`ENETUNREACH`).
    #[error("unreachable")]
    Unreachable,
    /// Reset after the connection was set up.
    #[error("connection reset")]
    Reset,
    /// Connected, but no name arrived within the read timeout.
    #[error("no reply within the read timeout")]
    ReadTimeout,
    /// Connected, but the peer closed without a name.
    #[error("closed without a reply")]
    NoReply,
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

impl ProbeError {
    pub(super) fn from_io(e: &std::io::Error, connecting: bool) -> Self {
        match e.kind() {
            ErrorKind::ConnectionRefused => Self::Refused,
            ErrorKind::TimedOut | ErrorKind::WouldBlock if connecting => Self::ConnectTimeout,
            ErrorKind::TimedOut | ErrorKind::WouldBlock => Self::ReadTimeout,
            ErrorKind::HostUnreachable | ErrorKind::NetworkUnreachable => Self::Unreachable,
            // EPIPE: a write after the connection was reset.
            ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe => Self::Reset,
            _ => Self::Other(e.to_string()),
        }
    }

    /// The connection was never set up (refused, connect timeout, unreachable), as
    /// opposed to one that was set up and then lost.
    pub fn is_connect_failure(&self) -> bool {
        matches!(self, Self::Refused | Self::ConnectTimeout | Self::Unreachable)
    }

    /// A short stable name (`refused`, `connect_timeout`, …) for reports.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Refused => "refused",
            Self::ConnectTimeout => "connect_timeout",
            Self::Unreachable => "unreachable",
            Self::Reset => "reset",
            Self::ReadTimeout => "read_timeout",
            Self::NoReply => "no_reply",
            Self::Other(_) => "other",
        }
    }
}

/// One probe: start and completion time (ms since the prober started) and outcome.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct Probe {
    /// When the connect began.
    pub start_ms: f64,
    /// When the probe completed (answer read, or failure).
    pub end_ms: f64,
    /// The responder's name, or why there was none.
    pub outcome: std::result::Result<String, ProbeError>,
}

/// A failed probe.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Failure {
    /// When the probe began.
    pub start_ms: f64,
    /// When it failed.
    pub t_ms: f64,
    /// Why.
    pub kind: ProbeError,
}

/// Consecutive successful probes answered by the same responder (failures in
/// between do not split a run).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Run {
    /// The responder.
    pub name: String,
    /// Completion time of the first answer in the run.
    pub first_ms: f64,
    /// Completion time of the last answer in the run.
    pub last_ms: f64,
    /// Number of answers.
    pub count: usize,
}

/// The longest stretch without a successful probe.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Gap {
    /// Completion time of the success before it.
    pub from_ms: f64,
    /// Completion time of the success after it.
    pub to_ms: f64,
    /// Who answered before.
    pub before: String,
    /// Who answered after.
    pub after: String,
}

impl Gap {
    /// Its length.
    pub fn len_ms(&self) -> f64 {
        self.to_ms - self.from_ms
    }
}

/// What a [`Prober`](super::Prober) saw.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeReport {
    /// What was probed.
    pub target: SocketAddr,
    /// Planned cadence.
    pub interval_ms: f64,
    /// How long it ran.
    pub duration_ms: f64,
    /// Probes made.
    pub attempts: usize,
    /// Probes answered with a name.
    pub ok: usize,
    /// Probes that failed.
    pub failed: usize,
    /// Cadence slots skipped because an earlier probe was still running.
    pub missed_slots: u64,
    /// Longest time between the completions of two consecutive successful
    /// probes; 0 with fewer than two successes.
    pub longest_gap_ms: f64,
    /// Where that gap was.
    pub longest_gap: Option<Gap>,
    /// Completion time of the first success.
    pub first_ok_ms: Option<f64>,
    /// Completion time of the last success.
    pub last_ok_ms: Option<f64>,
    /// Every failure, in order.
    pub failures: Vec<Failure>,
    /// Who answered, compressed into runs.
    pub runs: Vec<Run>,
    /// Every probe.
    pub timeline: Vec<Probe>,
}

impl ProbeReport {
    /// Computes the report from a timeline (probes in order of start).
    pub fn from_timeline(
        target: SocketAddr,
        interval: Duration,
        duration: Duration,
        missed_slots: u64,
        timeline: Vec<Probe>,
    ) -> Self {
        let mut failures = Vec::new();
        let mut runs: Vec<Run> = Vec::new();
        let mut longest_gap: Option<Gap> = None;
        let mut prev_ok: Option<(f64, &str)> = None;
        let (mut first_ok_ms, mut last_ok_ms) = (None, None);
        for p in &timeline {
            match &p.outcome {
                Ok(name) => {
                    first_ok_ms.get_or_insert(p.end_ms);
                    last_ok_ms = Some(p.end_ms);
                    if let Some((t, before)) = prev_ok {
                        let len = p.end_ms - t;
                        if longest_gap.as_ref().is_none_or(|g| len > g.len_ms()) {
                            longest_gap = Some(Gap {
                                from_ms: t,
                                to_ms: p.end_ms,
                                before: before.to_owned(),
                                after: name.clone(),
                            });
                        }
                    }
                    prev_ok = Some((p.end_ms, name));
                    match runs.last_mut() {
                        Some(r) if r.name == *name => {
                            r.last_ms = p.end_ms;
                            r.count += 1;
                        }
                        _ => runs.push(Run { name: name.clone(), first_ms: p.end_ms, last_ms: p.end_ms, count: 1 }),
                    }
                }
                Err(kind) => failures.push(Failure { start_ms: p.start_ms, t_ms: p.end_ms, kind: kind.clone() }),
            }
        }
        let ok = timeline.len() - failures.len();
        Self {
            target,
            interval_ms: interval.as_secs_f64() * 1e3,
            duration_ms: duration.as_secs_f64() * 1e3,
            attempts: timeline.len(),
            ok,
            failed: failures.len(),
            missed_slots,
            longest_gap_ms: longest_gap.as_ref().map_or(0.0, Gap::len_ms),
            longest_gap,
            first_ok_ms,
            last_ok_ms,
            failures,
            runs,
            timeline,
        }
    }

    /// How often the responder changed (runs − 1).
    pub fn holder_changes(&self) -> usize {
        self.runs.len().saturating_sub(1)
    }

    /// Who answered last.
    pub fn last_responder(&self) -> Option<&str> {
        self.runs.last().map(|r| r.name.as_str())
    }

    /// The responders in order of runs (`["n0", "n1", "n0"]`).
    pub fn responder_sequence(&self) -> Vec<&str> {
        self.runs.iter().map(|r| r.name.as_str()).collect()
    }

    /// The failures a planned move must not have: every failure except one that
    /// connected and then lost its connection (a reset, or no reply within the read
    /// timeout) and began across a change of responder (from `margin_ms` before the old
    /// responder's last answer to `margin_ms` after the new one's first). Such a probe's
    /// handshake straddled the flip: its SYN reached the old holder, its ACK or request
    /// the new one, which has no socket for it (a reset) or does not have the address
    /// yet (dropped) — the documented limit of a move that does not drain connections
    /// (a window of about one round trip).
    pub fn failures_beyond_the_flip(&self, margin_ms: f64) -> Vec<&Failure> {
        let flips: Vec<(f64, f64)> =
            self.runs.windows(2).map(|w| (w[0].last_ms - margin_ms, w[1].first_ms + margin_ms)).collect();
        self.failures
            .iter()
            .filter(|f| {
                let lost = matches!(f.kind, ProbeError::Reset | ProbeError::ReadTimeout);
                !lost || !flips.iter().any(|(from, to)| f.start_ms >= *from && f.start_ms <= *to)
            })
            .collect()
    }

    /// The report of the probes that began in `[from_ms, to_ms)` (same time base; the
    /// duration is the window's, missed slots are not known per window and are 0).
    pub fn slice(&self, from_ms: f64, to_ms: f64) -> ProbeReport {
        let timeline: Vec<Probe> =
            self.timeline.iter().filter(|p| p.start_ms >= from_ms && p.start_ms < to_ms).cloned().collect();
        // An open window (`to_ms` infinite) lasts until the report's end.
        let span = to_ms.min(self.duration_ms) - from_ms.max(0.0);
        let secs = |ms: f64| Duration::try_from_secs_f64((ms / 1e3).max(0.0)).unwrap_or_default();
        let (duration, interval) = (secs(span), secs(self.interval_ms));
        ProbeReport::from_timeline(self.target, interval, duration, 0, timeline)
    }

    /// Connection attempts that never connected: refused, connect timeout, unreachable.
    pub fn failed_connects(&self) -> usize {
        self.failures.iter().filter(|f| f.kind.is_connect_failure()).count()
    }

    /// Connections reset after they were set up.
    pub fn resets(&self) -> usize {
        self.failures.iter().filter(|f| f.kind == ProbeError::Reset).count()
    }

    /// Failures counted by kind.
    pub fn failure_kinds(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for f in &self.failures {
            *m.entry(f.kind.kind()).or_insert(0) += 1;
        }
        m
    }

    /// Longest stretch of consecutive failed probes (from the start of its first
    /// to the completion of its last), as `(from_ms, to_ms, count)`.
    pub fn longest_failure_streak(&self) -> Option<(f64, f64, usize)> {
        let mut best: Option<(f64, f64, usize)> = None;
        let mut cur: Option<(f64, f64, usize)> = None;
        for p in &self.timeline {
            match &p.outcome {
                Err(_) => {
                    let c = cur.get_or_insert((p.start_ms, p.end_ms, 0));
                    c.1 = p.end_ms;
                    c.2 += 1;
                }
                Ok(_) => cur = None,
            }
            if let Some(c) = cur
                && best.is_none_or(|b| c.2 > b.2)
            {
                best = Some(c);
            }
        }
        best
    }

    /// A one-paragraph human summary.
    pub fn summary(&self) -> String {
        let runs: Vec<String> = self
            .runs
            .iter()
            .map(|r| format!("{}×{} [{:.0}..{:.0} ms]", r.name, r.count, r.first_ms, r.last_ms))
            .collect();
        format!(
            "probe {}: {} attempts in {:.0} ms, {} ok, {} failed {:?}, {} missed slots, longest gap {:.1} ms{}; runs: {}",
            self.target,
            self.attempts,
            self.duration_ms,
            self.ok,
            self.failed,
            self.failure_kinds(),
            self.missed_slots,
            self.longest_gap_ms,
            self.longest_gap
                .as_ref()
                .map(|g| format!(" ({} @{:.0} → {} @{:.0})", g.before, g.from_ms, g.after, g.to_ms))
                .unwrap_or_default(),
            runs.join(", ")
        )
    }
}

/// `to − from` in ms, negative when `to` is earlier.
pub(super) fn ms_between(from: Instant, to: Instant) -> f64 {
    match to.checked_duration_since(from) {
        Some(d) => d.as_secs_f64() * 1e3,
        None => -(from.duration_since(to).as_secs_f64() * 1e3),
    }
}

#[cfg(test)]
mod tests {
    use super::{Probe, ProbeError, ProbeReport, Run};
    use std::io::ErrorKind;
    use std::time::Duration;

    fn ok(start: f64, end: f64, name: &str) -> Probe {
        Probe { start_ms: start, end_ms: end, outcome: Ok(name.to_owned()) }
    }

    fn err(start: f64, end: f64, e: ProbeError) -> Probe {
        Probe { start_ms: start, end_ms: end, outcome: Err(e) }
    }

    fn report(timeline: Vec<Probe>) -> ProbeReport {
        ProbeReport::from_timeline(
            "10.0.0.1:80".parse().unwrap(),
            Duration::from_millis(5),
            Duration::from_millis(1000),
            3,
            timeline,
        )
    }

    #[test]
    fn empty_timeline() {
        let r = report(vec![]);
        assert_eq!((r.attempts, r.ok, r.failed), (0, 0, 0));
        assert_eq!(r.longest_gap_ms, 0.0);
        assert!(r.longest_gap.is_none());
        assert_eq!(r.holder_changes(), 0);
        assert_eq!(r.last_responder(), None);
        assert_eq!(r.longest_failure_streak(), None);
    }

    #[test]
    fn single_success_has_no_gap() {
        let r = report(vec![err(0.0, 50.0, ProbeError::ConnectTimeout), ok(50.0, 51.0, "n0")]);
        assert_eq!(r.longest_gap_ms, 0.0);
        assert_eq!(r.first_ok_ms, Some(51.0));
        assert_eq!(r.last_ok_ms, Some(51.0));
        assert_eq!(r.last_responder(), Some("n0"));
    }

    #[test]
    fn gaps_are_between_completion_times_of_successes() {
        let r = report(vec![
            ok(0.0, 1.0, "n0"),
            ok(5.0, 6.0, "n0"),
            err(10.0, 60.0, ProbeError::ConnectTimeout),
            err(60.0, 61.0, ProbeError::Refused),
            ok(65.0, 66.5, "n1"),
            ok(70.0, 71.0, "n1"),
        ]);
        assert_eq!((r.attempts, r.ok, r.failed, r.missed_slots), (6, 4, 2, 3));
        assert_eq!(r.longest_gap_ms, 60.5);
        let g = r.longest_gap.as_ref().unwrap();
        assert_eq!((g.from_ms, g.to_ms, g.before.as_str(), g.after.as_str()), (6.0, 66.5, "n0", "n1"));
        assert_eq!(r.failures.len(), 2);
        assert_eq!(r.failures[0].t_ms, 60.0);
        assert_eq!(r.failures[1].kind, ProbeError::Refused);
        assert_eq!(r.failure_kinds().get("connect_timeout"), Some(&1));
        assert_eq!(r.longest_failure_streak(), Some((10.0, 61.0, 2)));
    }

    #[test]
    fn runs_compress_consecutive_responders_across_failures() {
        let r = report(vec![
            ok(0.0, 1.0, "n0"),
            ok(5.0, 6.0, "n0"),
            err(10.0, 11.0, ProbeError::Reset),
            ok(15.0, 16.0, "n0"),
            ok(20.0, 21.0, "n1"),
            ok(25.0, 26.0, "n0"),
            ok(30.0, 31.0, "n0"),
        ]);
        assert_eq!(
            r.runs,
            vec![
                Run { name: "n0".into(), first_ms: 1.0, last_ms: 16.0, count: 3 },
                Run { name: "n1".into(), first_ms: 21.0, last_ms: 21.0, count: 1 },
                Run { name: "n0".into(), first_ms: 26.0, last_ms: 31.0, count: 2 },
            ]
        );
        assert_eq!(r.holder_changes(), 2);
        assert_eq!(r.responder_sequence(), vec!["n0", "n1", "n0"]);
        assert_eq!(r.last_responder(), Some("n0"));
        // The first of equal gaps is kept.
        assert_eq!(r.longest_gap_ms, 10.0);
        assert_eq!(r.longest_gap.as_ref().unwrap().from_ms, 6.0);
    }

    #[test]
    fn only_a_reset_across_the_flip_is_excused_on_a_planned_move() {
        let r = report(vec![
            ok(0.0, 1.0, "n0"),
            ok(5.0, 6.0, "n0"),
            err(8.0, 9.0, ProbeError::Reset),
            ok(10.0, 11.0, "n1"),
            ok(15.0, 16.0, "n1"),
        ]);
        assert!(r.failures_beyond_the_flip(2.0).is_empty(), "{:?}", r.failures);
        // A reset far from the flip, another kind of failure at the flip, or no flip.
        let far = report(vec![ok(0.0, 1.0, "n0"), err(100.0, 101.0, ProbeError::Reset), ok(200.0, 201.0, "n0")]);
        assert_eq!(far.failures_beyond_the_flip(2.0).len(), 1);
        let timeout = report(vec![ok(0.0, 1.0, "n0"), err(2.0, 9.0, ProbeError::ConnectTimeout), ok(10.0, 11.0, "n1")]);
        assert_eq!(timeout.failures_beyond_the_flip(2.0).len(), 1);
        // A connection set up with the old holder whose reply never came (its request
        // went to the new one) is the same case; one that began long before is not.
        let lost = report(vec![ok(0.0, 1.0, "n0"), err(2.0, 60.0, ProbeError::ReadTimeout), ok(10.0, 11.0, "n1")]);
        assert!(lost.failures_beyond_the_flip(2.0).is_empty());
        let early = report(vec![
            ok(0.0, 1.0, "n0"),
            ok(50.0, 51.0, "n0"),
            err(20.0, 90.0, ProbeError::ReadTimeout),
            ok(95.0, 96.0, "n1"),
        ]);
        assert_eq!(early.failures_beyond_the_flip(2.0).len(), 1);
        let late = report(vec![ok(0.0, 1.0, "n0"), ok(10.0, 11.0, "n1"), err(40.0, 41.0, ProbeError::Reset)]);
        assert_eq!(late.failures_beyond_the_flip(2.0).len(), 1);
    }

    #[test]
    fn a_slice_is_the_report_of_the_probes_that_began_in_it() {
        let r = report(vec![
            ok(0.0, 1.0, "n0"),
            err(5.0, 55.0, ProbeError::ConnectTimeout),
            ok(55.0, 56.0, "n1"),
            err(60.0, 61.0, ProbeError::Reset),
            ok(65.0, 66.0, "n1"),
        ]);
        let s = r.slice(4.0, 64.0);
        assert_eq!((s.attempts, s.ok, s.failed), (3, 1, 2));
        assert_eq!((s.failed_connects(), s.resets()), (1, 1));
        assert_eq!(s.duration_ms, 60.0);
        let open = r.slice(50.0, f64::INFINITY);
        assert_eq!((open.attempts, open.longest_gap_ms), (3, 10.0));
        assert_eq!(open.duration_ms, 950.0, "an open window ends with the report");
        assert_eq!((r.failed_connects(), r.resets()), (1, 1));
    }

    #[test]
    fn report_serialises_to_json() {
        let r = report(vec![ok(0.0, 1.0, "n0"), err(5.0, 6.0, ProbeError::Other("x".into()))]);
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["ok"], 1);
        assert_eq!(v["timeline"][0]["outcome"]["Ok"], "n0");
        assert!(r.summary().contains("1 ok"));
    }

    #[test]
    fn io_errors_are_classified() {
        let e = |k| std::io::Error::from(k);
        assert_eq!(ProbeError::from_io(&e(ErrorKind::ConnectionRefused), true), ProbeError::Refused);
        assert_eq!(ProbeError::from_io(&e(ErrorKind::TimedOut), true), ProbeError::ConnectTimeout);
        assert_eq!(ProbeError::from_io(&e(ErrorKind::WouldBlock), false), ProbeError::ReadTimeout);
        assert_eq!(ProbeError::from_io(&e(ErrorKind::HostUnreachable), true), ProbeError::Unreachable);
        assert_eq!(ProbeError::from_io(&e(ErrorKind::ConnectionReset), false), ProbeError::Reset);
    }
}
