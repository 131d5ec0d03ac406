//! The controllers' shared context and their wiring: the HAPair controller (primary:
//! HAPairs; triggered also by FloatingIPs, Nodes, the pair Leases and key Secrets) and
//! the FloatingIP controller (primary: FloatingIPs; triggered also by HAPairs). Every
//! watch is guarded by `DeserializeGuard` where the objects are ours, so that one
//! malformed object cannot stop it; reconciles read from reflector stores, never list.

use crate::metrics::Metrics;
use crate::model::{self, pair_of_lease};
use crate::{Error, Settings};
use futures::{FutureExt, Stream, StreamExt};
use havip_crds::{FloatingIP, HAPair};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeStatus, Secret};
use k8s_openapi::api::events::v1::Event as KubeEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use kube::core::DeserializeGuard;
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store, reflector};
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Client, Resource, ResourceExt};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Label on every object the operator creates.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "havip-operator");
/// Label naming the pair a Lease or Secret belongs to.
pub const PAIR_LABEL: &str = "havip.io/pair";

/// What the operator remembers about a pair between reconciles (lost on restart:
/// nothing here is needed for correctness).
#[derive(Default, Debug)]
pub struct PairMemory {
    /// Member roles last seen (for role-change Events).
    pub roles: BTreeMap<String, havip_crds::MemberRole>,
    /// Consecutive reconcile failures (for the backoff).
    pub failures: u32,
    /// The generation of an unreadable object already warned about.
    pub warned_generation: Option<i64>,
    /// A role change seen but not yet announced by an Event (epoch), waiting for the
    /// new active to report why.
    pub unannounced_epoch: Option<i64>,
    /// Request ids acted on by this process (per request kind key), in case the cache
    /// does not show the operator's own record yet when the pair is reconciled again.
    pub handled: BTreeMap<String, String>,
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
            reporting_controller: Some("havip.io/operator".to_owned()),
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

/// An Event to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ev {
    /// Warning (else Normal).
    pub warning: bool,
    /// CamelCase reason.
    pub reason: String,
    /// What the operator did (CamelCase).
    pub action: &'static str,
    /// A sentence.
    pub note: String,
}

impl Ev {
    /// A Normal Event.
    pub fn normal(reason: impl Into<String>, action: &'static str, note: impl Into<String>) -> Self {
        Self { warning: false, reason: reason.into(), action, note: note.into() }
    }
    /// A Warning Event.
    pub fn warning(reason: impl Into<String>, action: &'static str, note: impl Into<String>) -> Self {
        Self { warning: true, reason: reason.into(), action, note: note.into() }
    }
}

fn drop_managed_fields<K: Resource>(o: &mut K) {
    o.meta_mut().managed_fields = None;
}

/// Keeps only what the operator reads of a Node (name, uid, addresses), so that
/// the cache stays small on big clusters.
fn slim_node(n: &mut Node) {
    let addresses = n.status.as_ref().and_then(|s| s.addresses.clone());
    *n = Node {
        metadata: ObjectMeta {
            name: n.metadata.name.take(),
            uid: n.metadata.uid.take(),
            resource_version: n.metadata.resource_version.take(),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(NodeStatus { addresses, ..NodeStatus::default() }),
    };
}

/// A Node's addresses as (type, address).
type NodeAddresses = Vec<(String, String)>;

fn node_addresses(n: &Node) -> NodeAddresses {
    n.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| a.iter().map(|x| (x.type_.clone(), x.address.clone())).collect())
        .unwrap_or_default()
}

/// Resolves once every flag is true (any number of concurrent waiters).
async fn all_ready(flags: &[tokio::sync::watch::Receiver<bool>]) {
    for rx in flags {
        let mut rx = rx.clone();
        let _ = rx.wait_for(|ready| *ready).await;
    }
}

/// Which watch events of a secondary resource trigger reconciles.
enum Filter<K, T> {
    /// Every object touched (applied or deleted).
    Touched,
    /// Only objects appearing, disappearing, or changing `key(object)`. Used for Nodes
    /// (key: addresses — kubelets update Node status every few seconds, which must
    /// trigger nothing) and for HAPairs in the FloatingIP controller (key: none — only
    /// existence matters there).
    Changed(Box<dyn Fn(&K) -> T + Send + Sync>),
}

/// Drives a secondary watch (already `.reflect`ed into its store) in a task of its
/// own, and forwards the objects that should trigger reconciles through a channel.
///
/// The stores the reconciles read are thus kept up to date (and become ready)
/// independently of how the controllers poll their trigger streams: a reconcile that
/// waits for every store can never wait on a stream only its own controller drives.
fn drive<K, T>(
    stream: impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    filter: Filter<K, T>,
    ready: tokio::sync::watch::Sender<bool>,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource + Send + 'static,
    K::DynamicType: Default,
    T: PartialEq + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<K, watcher::Error>>(1024);
    tasks.push(tokio::spawn(async move {
        let mut seen: HashMap<String, T> = HashMap::new();
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            let out = match ev {
                Ok(Event::Apply(o) | Event::InitApply(o)) => match &filter {
                    Filter::Touched => Some(Ok(o)),
                    Filter::Changed(key) => {
                        let k = key(&o);
                        let name = o.meta().name.clone().unwrap_or_default();
                        if seen.get(&name) == Some(&k) {
                            None
                        } else {
                            seen.insert(name, k);
                            Some(Ok(o))
                        }
                    }
                },
                Ok(Event::Delete(o)) => {
                    seen.remove(o.meta().name.as_deref().unwrap_or_default());
                    Some(Ok(o))
                }
                Ok(Event::Init) => None,
                Ok(Event::InitDone) => {
                    tracing::debug!(kind = %K::kind(&Default::default()), "initial list done");
                    ready.send_replace(true);
                    None
                }
                Err(e) => Some(Err(e)),
            };
            if let Some(item) = out
                && tx.send(item).await.is_err()
            {
                break;
            }
        }
    }));
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) })
}

/// Runs both controllers until `stop` resolves (graceful: running reconciles finish).
pub async fn run_controllers(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    leader: Arc<AtomicBool>,
    stop: futures::future::Shared<futures::future::BoxFuture<'static, ()>>,
) {
    let ns = settings.namespace.clone();
    let pairs_api: Api<DeserializeGuard<HAPair>> = Api::all(client.clone());
    let fips_api: Api<DeserializeGuard<FloatingIP>> = Api::all(client.clone());
    let nodes_api: Api<Node> = Api::all(client.clone());
    let leases_api: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let secrets_api: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let wc = watcher::Config::default().any_semantic();

    let (fips, fips_w) = reflector::store();
    let (pairs, pairs_w) = reflector::store();
    let (nodes, nodes_w) = reflector::store();
    let (leases, leases_w) = reflector::store();
    let (secrets, secrets_w) = reflector::store();

    // The primary watches drop managedFields (several managers per object: the user,
    // the operator, one per agent) before caching: nothing here reads them.
    let (pair_store, pair_w) = reflector::store();
    let hapair_ctrl = Controller::for_stream(
        watcher(pairs_api.clone(), wc.clone())
            .default_backoff()
            .modify(drop_managed_fields)
            .reflect(pair_w)
            .applied_objects(),
        pair_store.clone(),
    );
    let (fip_store, fip_w) = reflector::store();
    let fip_ctrl = Controller::for_stream(
        watcher(fips_api.clone(), wc.clone())
            .default_backoff()
            .modify(drop_managed_fields)
            .reflect(fip_w)
            .applied_objects(),
        fip_store.clone(),
    );

    let (pairs_ready, pairs_ready_rx) = tokio::sync::watch::channel(false);
    let (fips_ready, fips_ready_rx) = tokio::sync::watch::channel(false);
    let (nodes_ready, nodes_ready_rx) = tokio::sync::watch::channel(false);
    let (leases_ready, leases_ready_rx) = tokio::sync::watch::channel(false);
    let (secrets_ready, secrets_ready_rx) = tokio::sync::watch::channel(false);
    let ctx = Arc::new(Context {
        client: client.clone(),
        settings: settings.clone(),
        metrics: metrics.clone(),
        leader,
        pairs: pairs.clone(),
        fips: fips.clone(),
        nodes: nodes.clone(),
        leases,
        secrets,
        memory: Mutex::default(),
        ready: vec![pairs_ready_rx, fips_ready_rx, nodes_ready_rx, leases_ready_rx, secrets_ready_rx],
    });

    // FloatingIP → its pair (and the pair it named before, when it moved).
    let fip_pairs: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let mut tasks = Vec::new();
    let fip_stream = drive(
        reflector(fips_w, watcher(fips_api, wc.clone()).default_backoff().modify(drop_managed_fields)),
        Filter::<_, ()>::Touched,
        fips_ready,
        &mut tasks,
    );
    let fip_mapper = move |f: DeserializeGuard<FloatingIP>| {
        let name = f.name_any();
        let mut out = Vec::new();
        let mut map = match fip_pairs.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if let Ok(fip) = &f.0 {
            if let Some(old) = map.insert(name, fip.spec.pair.clone())
                && old != fip.spec.pair
            {
                out.push(ObjectRef::new(&old));
            }
            out.push(ObjectRef::new(&fip.spec.pair));
        } else if let Some(old) = map.remove(&name) {
            out.push(ObjectRef::new(&old));
        }
        out
    };
    // Node → the pairs naming it.
    let node_stream = drive(
        watcher(nodes_api, wc.clone()).default_backoff().modify(slim_node).reflect(nodes_w),
        Filter::Changed(Box::new(node_addresses)),
        nodes_ready,
        &mut tasks,
    );
    let pairs_for_nodes = pair_store.clone();
    let node_mapper = move |n: Node| {
        let name = n.name_any();
        pairs_for_nodes
            .state()
            .iter()
            .filter(|p| p.0.as_ref().is_ok_and(|p| p.spec.members.iter().any(|m| m.node == name)))
            .map(|p| ObjectRef::new(&p.name_any()))
            .collect::<Vec<_>>()
    };
    // Lease hapair-<pair> → pair (the leader-election Lease never has that prefix).
    let lease_stream = drive(
        reflector(
            leases_w,
            watcher(leases_api, wc.clone()).default_backoff().modify(|l: &mut Lease| {
                l.metadata.managed_fields = None;
            }),
        ),
        Filter::<_, ()>::Touched,
        leases_ready,
        &mut tasks,
    );
    let lease_mapper = |l: Lease| pair_of_lease(&l.name_any()).map(ObjectRef::new);
    // Key Secret → pair, by label.
    let secret_stream = drive(
        reflector(
            secrets_w,
            watcher(secrets_api, wc.clone().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1)))
                .default_backoff()
                .modify(|s: &mut Secret| {
                    s.metadata.managed_fields = None;
                }),
        ),
        Filter::<_, ()>::Touched,
        secrets_ready,
        &mut tasks,
    );
    let secret_mapper = |s: Secret| s.labels().get(PAIR_LABEL).map(|p| ObjectRef::new(p));
    // HAPair → the FloatingIPs naming it (for the FloatingIP controller).
    let pair_stream = drive(
        watcher(pairs_api, wc.clone()).default_backoff().modify(drop_managed_fields).reflect(pairs_w),
        Filter::Changed(Box::new(|_: &DeserializeGuard<HAPair>| ())),
        pairs_ready,
        &mut tasks,
    );
    let fips_for_pairs = fip_store.clone();
    let pair_mapper = move |p: DeserializeGuard<HAPair>| {
        let name = p.name_any();
        fips_for_pairs
            .state()
            .iter()
            .filter(|f| f.0.as_ref().is_ok_and(|f| f.spec.pair == name))
            .map(|f| ObjectRef::new(&f.name_any()))
            .collect::<Vec<_>>()
    };

    // Forget the memory of deleted objects now and then (the primary streams carry
    // no deletions).
    let gc = {
        let ctx = ctx.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_secs(300)).await;
                let pairs: std::collections::HashSet<String> = ctx.pairs.state().iter().map(|p| p.name_any()).collect();
                let fips: std::collections::HashSet<String> =
                    ctx.fips.state().iter().map(|f| format!("fip/{}", f.name_any())).collect();
                let mut memory = match ctx.memory.lock() {
                    Ok(g) => g,
                    Err(p) => p.into_inner(),
                };
                memory.retain(|k, _| pairs.contains(k) || fips.contains(k));
            }
        }
    };
    let config = ControllerConfig::default().concurrency(settings.concurrency);
    let hapair = hapair_ctrl
        .with_config(config.clone())
        .watches_stream(fip_stream, fip_mapper)
        .watches_stream(node_stream, node_mapper)
        .watches_stream(lease_stream, lease_mapper)
        .watches_stream(secret_stream, secret_mapper)
        .graceful_shutdown_on(stop.clone())
        .run(crate::hapair::reconcile, crate::hapair::error_policy, ctx.clone())
        .for_each(|res| async move { log_result("hapair", res) });
    let fip = fip_ctrl
        .with_config(config)
        .watches_stream(pair_stream, pair_mapper)
        .graceful_shutdown_on(stop)
        .run(crate::floatingip::reconcile, crate::floatingip::error_policy, ctx)
        .for_each(|res| async move { log_result("floatingip", res) });
    tracing::info!(namespace = %ns, "controllers started");
    tokio::select! {
        () = async { futures::join!(hapair, fip); } => {}
        () = gc => {}
    }
    for t in tasks {
        t.abort();
    }
    tracing::info!("controllers stopped");
}

fn log_result<K: Resource, E: std::fmt::Display>(
    controller: &'static str,
    res: Result<(ObjectRef<K>, Action), kube::runtime::controller::Error<E, watcher::Error>>,
) {
    use kube::runtime::controller::Error as CE;
    match res {
        Ok((obj, _)) => tracing::trace!(controller, object = %obj.name, "reconciled"),
        // Already counted and logged by the error policy.
        Err(CE::ReconcilerFailed(..)) => {}
        Err(CE::ObjectNotFound(obj)) => tracing::debug!(controller, object = %obj.name, "object gone"),
        Err(e) => tracing::warn!(controller, error = %e, "controller stream error"),
    }
}

/// A shareable future that resolves when `rx` turns true.
pub fn stop_future(
    mut rx: tokio::sync::watch::Receiver<bool>,
) -> futures::future::Shared<futures::future::BoxFuture<'static, ()>> {
    async move {
        let _ = rx.wait_for(|v| *v).await;
    }
    .boxed()
    .shared()
}

/// Backoff after `failures` consecutive failures: 1 s doubling to 5 min.
pub fn backoff(failures: u32) -> Duration {
    let secs = 1u64.checked_shl(failures.saturating_sub(1).min(16)).unwrap_or(u64::MAX).min(300);
    Duration::from_secs(secs)
}

/// Times a reconcile and counts its result.
pub struct Timer {
    start: Instant,
    controller: &'static str,
}

impl Timer {
    /// Starts timing.
    pub fn start(controller: &'static str) -> Self {
        Self { start: Instant::now(), controller }
    }
    /// Records the result.
    pub fn done(self, metrics: &Metrics, result: &'static str) {
        metrics.reconciled(self.controller, result, self.start.elapsed());
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
    use super::*;

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
    fn slim_node_keeps_only_addresses() {
        let mut n: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "labels": {"x": "y"}, "managedFields": [{"manager": "kubelet"}]},
            "spec": {"podCIDR": "10.0.0.0/24"},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}], "capacity": {"cpu": "4"}}
        }))
        .expect("node");
        slim_node(&mut n);
        assert_eq!(n.name_any(), "a");
        assert!(n.metadata.labels.is_none() && n.metadata.managed_fields.is_none() && n.spec.is_none());
        assert_eq!(node_addresses(&n), vec![("InternalIP".to_owned(), "10.0.0.1".to_owned())]);
    }
}
