//! The controllers' shared context: the API client, the caches every reconcile reads
//! (the load-balancer controllers' too), the per-object memory, Events, the metadata the
//! operator puts on what it creates, the backoff and the reconcile timer. It holds no decision (those are in [`crate::model`])
//! and writes nothing but Events.

use crate::metrics::Metrics;
use crate::{Error, Settings, model};
use havip_crds::{FloatingIP, HAPair, VIPPool};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Secret, Service};
use k8s_openapi::api::events::v1::Event as KubeEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use kube::core::DeserializeGuard;
use kube::runtime::reflector::Store;
use kube::{Client, Resource, ResourceExt};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use crate::labels::{MANAGED_BY, PAIR_LABEL};

/// What the operator remembers about a pair between reconciles (lost on restart:
/// nothing here is needed for correctness).
#[derive(Default, Debug)]
pub struct PairMemory {
    /// What the HAPair plan reads and returns (roles seen, a role change not announced
    /// yet, request ids acted on).
    pub pair: crate::model::PairMemo,
    /// Consecutive reconcile failures (for the backoff).
    pub failures: u32,
    /// The generation of an unreadable object already warned about.
    pub warned_generation: Option<i64>,
    /// Of a FloatingIP: the conditions (with the object's uid and generation) this
    /// process last applied, so that a reconcile that runs before the cache shows them
    /// neither writes them nor announces them again. The uid: a FloatingIP deleted and
    /// created again under its name (a Service's address released and allocated again)
    /// is a new object that needs its own conditions.
    pub admission: Option<(Option<String>, Option<i64>, crate::model::FipVerdict)>,
}

/// What the load-balancer controllers read besides pairs and FloatingIPs.
pub struct LbStores {
    /// Every Service (managedFields and the last-applied annotation dropped).
    pub services: Store<Service>,
    /// Every VIPPool.
    pub pools: Store<DeserializeGuard<VIPPool>>,
    /// Every Namespace, reduced to its name and labels.
    pub namespaces: Store<Namespace>,
    /// One flag per store above, true once its initial list is in.
    pub ready: Vec<tokio::sync::watch::Receiver<bool>>,
    /// Held while an allocation changes (plan and apply).
    pub lock: tokio::sync::Mutex<()>,
    /// Per-Service memory.
    pub memory: Mutex<HashMap<String, ServiceMemory>>,
}

impl LbStores {
    /// Runs `f` on a Service's memory.
    pub fn with_memory<T>(&self, key: &str, f: impl FnOnce(&mut ServiceMemory) -> T) -> T {
        let mut guard = match self.memory.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(guard.entry(key.to_owned()).or_default())
    }
}

/// What the operator remembers about a Service (lost on restart; nothing here is
/// needed for correctness).
#[derive(Default, Debug)]
pub struct ServiceMemory {
    /// What the Service plan reads and returns (the last warning, the holders seen).
    pub service: crate::loadbalancer::plan::ServiceMemo,
    /// Consecutive failed reconciles.
    pub failures: u32,
}

/// Everything a reconcile needs.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Flags.
    pub settings: Settings,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// True while this replica is the leader; every write checks it.
    pub leader: Arc<AtomicBool>,
    /// HAPairs (for the FloatingIP controller).
    pub pairs: Store<DeserializeGuard<HAPair>>,
    /// FloatingIPs (for the HAPair controller).
    pub fips: Store<DeserializeGuard<FloatingIP>>,
    /// Nodes, reduced to their names and addresses.
    pub nodes: Store<Node>,
    /// Leases of the operator namespace.
    pub leases: Store<Lease>,
    /// The operator's Secrets in its namespace.
    pub secrets: Store<Secret>,
    /// Per-pair memory.
    pub memory: Mutex<HashMap<String, PairMemory>>,
    /// One flag per secondary store, true once its initial list is in.
    pub ready: Vec<tokio::sync::watch::Receiver<bool>>,
    /// The addresses that are never a VIP (every Node's and the API server's).
    pub reserved: Arc<crate::reserved::ReservedAddresses>,
    /// What the load-balancer controllers read besides pairs and FloatingIPs.
    pub lb: LbStores,
}

impl Context {
    /// Refuses a write when this replica is no longer the leader.
    pub fn guard(&self, what: &'static str) -> Result<(), Error> {
        if self.leader.load(Ordering::SeqCst) { Ok(()) } else { Err(Error::NotLeader { what }) }
    }

    /// Waits until every store has its initial list.
    ///
    /// Readiness comes from watch channels set by the tasks that drive the stores, not
    /// from `Store::wait_until_ready`: that future keeps only the waker of the last
    /// task that polled it, so of several reconciles waiting at once (the HAPair and
    /// the FloatingIP controller at start-up) all but one were never woken.
    pub async fn wait_ready(&self) -> Result<(), Error> {
        let timeout = Duration::from_secs(30);
        tokio::time::timeout(timeout, all_ready(&self.ready))
            .await
            .map_err(|_| Error::CacheSync { seconds: timeout.as_secs() })
    }

    /// Waits until the stores of the load-balancer controllers have their initial lists
    /// (theirs, and those of pairs and FloatingIPs).
    pub async fn wait_lb_ready(&self) -> Result<(), Error> {
        let timeout = Duration::from_secs(30);
        tokio::time::timeout(timeout, async {
            all_ready(&self.ready).await;
            all_ready(&self.lb.ready).await;
        })
        .await
        .map_err(|_| Error::CacheSync { seconds: timeout.as_secs() })
    }

    /// Runs `f` on the pair's memory.
    pub fn with_memory<T>(&self, pair: &str, f: impl FnOnce(&mut PairMemory) -> T) -> T {
        let mut guard = match self.memory.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(guard.entry(pair.to_owned()).or_default())
    }

    /// Publishes an Event about `obj` (events.k8s.io/v1, in `default` for cluster-scoped
    /// objects); failures are logged and counted, never fatal.
    ///
    /// Every call creates its own Event: kube-runtime's `Recorder` folds Events with the
    /// same reason into a series that keeps the first note, which would lose entries of
    /// the audit log (e.g. two different `Degraded` causes within minutes).
    pub async fn event<K: Resource<DynamicType = ()>>(&self, obj: &K, ev: Ev) {
        if !self.leader.load(Ordering::SeqCst) {
            return;
        }
        let reference = obj.object_ref(&());
        let name = reference.name.clone().unwrap_or_default();
        let ns = reference.namespace.clone().unwrap_or_else(|| "default".to_owned());
        let now = k8s_openapi::jiff::Timestamp::now();
        let event = KubeEvent {
            action: Some(ev.action.to_owned()),
            reason: Some(ev.reason.clone()),
            note: Some(truncate(&ev.note, 1000)),
            type_: Some(if ev.warning { "Warning" } else { "Normal" }.to_owned()),
            event_time: Some(MicroTime(now)),
            regarding: Some(reference),
            reporting_controller: Some(havip_crds::reporting::OPERATOR.to_owned()),
            reporting_instance: Some(truncate(&self.settings.identity, 128)),
            metadata: ObjectMeta {
                name: Some(format!("{name}.{:x}", now.as_nanosecond())),
                namespace: Some(ns.clone()),
                ..ObjectMeta::default()
            },
            ..KubeEvent::default()
        };
        tracing::info!(object = %name, reason = %ev.reason, warning = ev.warning, note = %ev.note, "event");
        let api: Api<KubeEvent> = Api::namespaced(self.client.clone(), &ns);
        if let Err(e) = api.create(&PostParams::default(), &event).await {
            tracing::warn!(object = %name, reason = %ev.reason, error = %e, "failed to publish an Event");
            self.metrics.errors.get_or_create(&crate::metrics::ErrorLabels { category: "event" }).inc();
        }
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

pub use crate::model::Ev;

/// Metadata of an object the operator creates for `pair` in `ns`: the managed-by, pair
/// and member labels, and the pair as controlling owner.
pub fn owned_meta(pair: &HAPair, name: String, ns: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(ns.to_owned()),
        labels: Some(
            [(MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned()), (PAIR_LABEL.to_owned(), pair.name_any())]
                .into_iter()
                .chain(
                    model::member_labels(&pair.spec).into_iter().map(|k| (k, havip_crds::membership::VALUE.to_owned())),
                )
                .collect(),
        ),
        owner_references: pair.controller_owner_ref(&()).map(|r| vec![r]),
        ..ObjectMeta::default()
    }
}

/// Resolves once every flag is true.
pub(crate) async fn all_ready(flags: &[tokio::sync::watch::Receiver<bool>]) {
    for rx in flags {
        let mut rx = rx.clone();
        let _ = rx.wait_for(|ready| *ready).await;
    }
}

/// Backoff after `failures` consecutive failures: 1 s doubling to 5 min.
pub fn backoff(failures: u32) -> Duration {
    let secs = 1u64.checked_shl(failures.saturating_sub(1).min(16)).unwrap_or(u64::MAX).min(300);
    Duration::from_secs(secs)
}

/// Times a reconcile and counts its result when it is dropped, so that a reconcile that
/// returns early (an `?`) is counted too — as `error` unless [`ReconcileTimer::result`]
/// said otherwise.
pub struct ReconcileTimer {
    start: Instant,
    controller: &'static str,
    metrics: Arc<Metrics>,
    result: &'static str,
}

impl ReconcileTimer {
    /// Starts timing a reconcile of `controller`.
    pub fn start(controller: &'static str, metrics: Arc<Metrics>) -> Self {
        Self { start: Instant::now(), controller, metrics, result: "error" }
    }
    /// The result to count (`ok`, `invalid`; `error` by default).
    pub fn result(&mut self, result: &'static str) {
        self.result = result;
    }
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.metrics.reconciled(self.controller, self.result, self.start.elapsed());
    }
}

/// The node a Lease belongs to is irrelevant here; the pair's Lease as [`model::LeaseInfo`].
pub fn lease_info(l: &Lease) -> model::LeaseInfo {
    let spec = l.spec.clone().unwrap_or_default();
    model::LeaseInfo {
        holder: spec.holder_identity.filter(|h| !h.is_empty()),
        transitions: i64::from(spec.lease_transitions.unwrap_or(0)),
        renew_time: spec.renew_time.map(|t| t.0),
    }
}

#[cfg(test)]
mod tests {
    use super::{ReconcileTimer, all_ready, backoff};
    use crate::metrics::Metrics;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(2), Duration::from_secs(2));
        assert_eq!(backoff(5), Duration::from_secs(16));
        assert_eq!(backoff(30), Duration::from_secs(300));
    }

    #[tokio::test]
    async fn every_concurrent_waiter_sees_the_stores_ready() {
        let (a_tx, a) = tokio::sync::watch::channel(false);
        let (b_tx, b) = tokio::sync::watch::channel(false);
        let flags = vec![a, b];
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let flags = flags.clone();
                tokio::spawn(async move { all_ready(&flags).await })
            })
            .collect();
        tokio::task::yield_now().await;
        a_tx.send_replace(true);
        tokio::task::yield_now().await;
        assert!(waiters.iter().all(|w| !w.is_finished()), "ready before the second store");
        b_tx.send_replace(true);
        for w in waiters {
            tokio::time::timeout(Duration::from_secs(5), w).await.expect("woken").expect("task");
        }
    }

    #[test]
    fn the_reconcile_timer_counts_an_early_return_as_an_error() {
        let metrics = Arc::new(Metrics::default());
        let early = || -> Result<(), ()> {
            let _timer = ReconcileTimer::start("hapair", metrics.clone());
            Err(())?;
            Ok(())
        };
        assert!(early().is_err());
        {
            let mut t = ReconcileTimer::start("hapair", metrics.clone());
            t.result("ok");
        }
        let text = metrics.encode();
        assert!(text.lines().any(|l| l.contains("controller=\"hapair\"") && l.contains("result=\"error\"")), "{text}");
        assert!(text.lines().any(|l| l.contains("controller=\"hapair\"") && l.contains("result=\"ok\"")), "{text}");
    }
}
