//! Prometheus metrics of the operator, served with `/healthz` and `/readyz` by
//! [`havip_endpoints::serve`].

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Labels of the reconcile counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    /// `hapair` or `floatingip`.
    pub controller: &'static str,
    /// `ok`, `error` or `invalid` (an object that cannot be read).
    pub result: &'static str,
}

/// Labels of the duration histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// `hapair` or `floatingip`.
    pub controller: &'static str,
}

/// Labels of the error counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// [`crate::Error::category`].
    pub category: &'static str,
}

/// Labels of the status-write and event counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// HAPair or FloatingIP.
    pub kind: &'static str,
}

/// Labels of the pairs-by-phase gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// The pair's `status.phase` (`Unknown` before the operator wrote one).
    pub phase: String,
}

/// Counts the pairs by phase at scrape time.
pub type PhaseSource = Box<dyn Fn() -> BTreeMap<String, i64> + Send + Sync>;

/// `havip_operator_pairs{phase}`: read from the operator's HAPair cache at every scrape,
/// so that a deleted pair leaves no stale count (the source is set once the cache exists;
/// until then nothing is exported).
#[derive(Default)]
pub struct PairPhases {
    source: Mutex<Option<PhaseSource>>,
}

impl std::fmt::Debug for PairPhases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PairPhases")
    }
}

impl PairPhases {
    /// Sets where the counts come from.
    pub fn set_source(&self, source: PhaseSource) {
        *self.source.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(source);
    }

    fn counts(&self) -> BTreeMap<String, i64> {
        self.source.lock().unwrap_or_else(std::sync::PoisonError::into_inner).as_ref().map(|f| f()).unwrap_or_default()
    }
}

impl Collector for PairPhases {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counts = self.counts();
        if counts.is_empty() {
            return Ok(());
        }
        let family = Family::<PhaseLabels, Gauge>::default();
        for (phase, n) in counts {
            family.get_or_create(&PhaseLabels { phase }).set(n);
        }
        let metric = encoder.encode_descriptor("pairs", "HAPairs by status.phase", None, family.metric_type())?;
        family.encode(metric)
    }
}

/// Every metric of the operator.
pub struct Metrics {
    registry: Registry,
    /// Reconciles by controller and result.
    pub reconciles: Family<ReconcileLabels, Counter>,
    /// Reconcile duration by controller.
    pub reconcile_duration: Family<ControllerLabels, Histogram>,
    /// Errors by category.
    pub errors: Family<ErrorLabels, Counter>,
    /// Status writes (server-side applies) by kind.
    pub status_writes: Family<KindLabels, Counter>,
    /// 1 while this replica is the leader.
    pub leader: Gauge,
    /// HAPairs by phase (set its source once the HAPair cache exists).
    pub pair_phases: Arc<PairPhases>,
    ready: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric under the `havip_operator` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("havip_operator");
        let reconciles = Family::<ReconcileLabels, Counter>::default();
        registry.register("reconciles", "Reconciles by controller and result", reconciles.clone());
        let reconcile_duration = Family::<ControllerLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5])
        });
        registry.register(
            "reconcile_duration_seconds",
            "Duration of one reconcile by controller",
            reconcile_duration.clone(),
        );
        let errors = Family::<ErrorLabels, Counter>::default();
        for category in crate::Error::CATEGORIES {
            // 0 from the start: "no errors" reads as 0, not as a missing series.
            let _ = errors.get_or_create(&ErrorLabels { category });
        }
        registry.register("errors", "Reconcile and leader-election errors by category", errors.clone());
        let status_writes = Family::<KindLabels, Counter>::default();
        registry.register("status_writes", "Status server-side applies by kind", status_writes.clone());
        let leader = Gauge::default();
        registry.register("leader", "1 while this replica holds the leader-election Lease", leader.clone());
        let pair_phases = Arc::new(PairPhases::default());
        registry.register_collector(Box::new(pair_phases.clone()));
        Self {
            registry,
            reconciles,
            reconcile_duration,
            errors,
            status_writes,
            leader,
            pair_phases,
            ready: AtomicBool::new(false),
        }
    }

    /// Counts one reconcile.
    pub fn reconciled(&self, controller: &'static str, result: &'static str, took: Duration) {
        self.reconciles.get_or_create(&ReconcileLabels { controller, result }).inc();
        self.reconcile_duration.get_or_create(&ControllerLabels { controller }).observe(took.as_secs_f64());
    }

    /// Counts one error.
    pub fn error(&self, e: &crate::Error) {
        self.errors.get_or_create(&ErrorLabels { category: e.category() }).inc();
    }

    /// Marks the process ready (it reached the API server once).
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

impl havip_endpoints::Endpoints for Metrics {
    fn metrics(&self) -> String {
        self.encode()
    }

    fn ready(&self) -> Result<(), String> {
        if self.ready.load(Ordering::Relaxed) { Ok(()) } else { Err("the API server has not answered yet".to_owned()) }
    }
}

#[cfg(test)]
mod tests {
    use super::Metrics;
    use std::time::Duration;

    #[test]
    fn encodes_every_family() {
        let m = Metrics::new();
        m.reconciled("hapair", "ok", Duration::from_millis(3));
        m.error(&crate::Error::CacheSync { seconds: 1 });
        m.leader.set(1);
        let text = m.encode();
        assert!(text.contains("havip_operator_reconciles_total{controller=\"hapair\",result=\"ok\"} 1"), "{text}");
        assert!(text.contains("havip_operator_reconcile_duration_seconds_count{controller=\"hapair\"} 1"), "{text}");
        assert!(text.contains("havip_operator_errors_total{category=\"cache_sync\"} 1"), "{text}");
        assert!(text.contains("havip_operator_leader 1"), "{text}");
        assert!(!text.contains("havip_operator_pairs"), "no source yet, no pairs: {text}");
    }

    #[test]
    fn pairs_by_phase_are_read_at_every_scrape() {
        let m = Metrics::new();
        let phases = std::sync::Arc::new(std::sync::Mutex::new(vec!["Live", "Live", "Degraded"]));
        let p = phases.clone();
        m.pair_phases.set_source(Box::new(move || {
            let mut counts = std::collections::BTreeMap::new();
            for ph in p.lock().expect("lock").iter() {
                *counts.entry((*ph).to_owned()).or_insert(0) += 1;
            }
            counts
        }));
        let text = m.encode();
        assert!(text.contains("havip_operator_pairs{phase=\"Live\"} 2"), "{text}");
        assert!(text.contains("havip_operator_pairs{phase=\"Degraded\"} 1"), "{text}");
        // A pair deleted: gone from the next scrape, no stale series.
        phases.lock().expect("lock").retain(|p| *p != "Degraded");
        let text = m.encode();
        assert!(!text.contains("Degraded"), "{text}");
        assert!(text.contains("# TYPE havip_operator_pairs gauge"), "{text}");
    }
}
