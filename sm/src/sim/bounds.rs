//! The bounds used by the checker (see the module documentation of [`super`] for the reasoning).

use super::world::{PROBE_INTERVAL, PROBE_TIMEOUT};
use crate::config::Timings;

/// (a) over a lossy path.
pub const DUAL_LOSSY: u64 = 3_000;

/// (a) over a lossless path: `2 × interval + tick + max delay`.
pub fn dual_lossless(t: &Timings, max_delay: u64) -> u64 {
    2 * t.heartbeat_interval_ms + t.tick_ms + max_delay
}

/// (b) the window of continuous service that rules out usable down-evidence.
pub fn stale_evidence(t: &Timings) -> u64 {
    t.probe_fresh_ms + PROBE_TIMEOUT + PROBE_INTERVAL + t.tick_ms
}

/// (d) the replacement bound for `n` members.
pub fn takeover(t: &Timings, max_delay: u64, n: usize, store_latency_max: u64, store_cut: bool) -> u64 {
    let stagger = (n.saturating_sub(2) as u64) * t.heartbeat_interval_ms;
    t.heartbeat_timeout_ms
        + t.probe_span_ms
        + t.tick_ms
        + max_delay
        + stagger
        + 4 * store_latency_max
        + if store_cut { t.cas_timeout_ms } else { 0 }
}
