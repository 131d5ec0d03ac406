//! The agent in Kubernetes mode: one [`runtime`] per HAPair that names this node,
//! configured from the HAPair, its FloatingIPs, the members' Node addresses and the
//! heartbeat-key Secret; the pair Lease as the fencing record (compare-and-swap on
//! every role change, watched for newer epochs); its own `status.members[]` entry and
//! the FloatingIP status by server-side apply; Events for role changes; commands from
//! `status.command`. See docs/kubernetes.md for the contract.
//!
//! When the API server is unreachable the pair runtimes keep running on the last
//! configuration: the compare-and-swap times out (200 ms) and the standalone rules
//! apply; the Lease and the status catch up when the API server answers again.

use crate::config::{AgentConfig, AnnounceSchedule, MemberConfig, ProbeConfig, VipConfig, build_sm_config, parse_cidr};
use crate::metrics::AgentMetrics;
use crate::runtime::{self, Handle, LeaseStore, Options, Reply, Reporter, Request};
use crate::sm;
use crate::state::StateFile;
use futures::StreamExt;
use havip_crds::hapair::{PathHeard, VipReadiness};
use havip_crds::wire::{Key, Keyring};
use havip_crds::{
    FloatingIP, GatewayState, HAPair, MemberAlarm, MemberRole, MemberStatus, NodeAddressType, Operation, OperationKind,
    OperationResult, Transition, TransitionReason,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::DeserializeGuard;
use kube::runtime::events::{Event as KEvent, EventType, Recorder, Reporter as KReporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, watch};

/// How the Kubernetes agent runs.
#[derive(Clone, Debug)]
pub struct KubeAgentOptions {
    /// This node.
    pub node: String,
    /// The operator namespace (pair Leases and key Secrets).
    pub namespace: String,
    /// Persisted state directory (a hostPath).
    pub state_dir: PathBuf,
    /// Hand the VIPs over before exiting when the node is cordoned.
    pub handover_when_cordoned: bool,
}

/// A compare-and-swap of the pair Lease against the API server.
pub struct KubeLease {
    api: Api<Lease>,
    name: String,
}

#[async_trait::async_trait]
impl LeaseStore for KubeLease {
    async fn cas(&self, holder: &str, new_epoch: u64, expected_epoch: u64) -> sm::CasResult {
        let current = match self.api.get(&self.name).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(lease = %self.name, error = %e, "lease read failed; acting under the standalone rules");
                return sm::CasResult::Unavailable;
            }
        };
        let (cur_holder, cur_epoch) = lease_view(&current);
        if cur_epoch != expected_epoch {
            return sm::CasResult::Conflict { holder: cur_holder, epoch: cur_epoch };
        }
        let mut next = current.clone();
        let spec = next.spec.get_or_insert_with(Default::default);
        spec.holder_identity = Some(holder.to_owned());
        spec.lease_transitions = Some(i32::try_from(new_epoch).unwrap_or(i32::MAX));
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        spec.acquire_time = Some(now.clone());
        spec.renew_time = Some(now);
        // `replace` sends the resourceVersion we read: the API server refuses it (409)
        // when somebody wrote in between — that is the compare-and-swap.
        match self.api.replace(&self.name, &PostParams::default(), &next).await {
            Ok(_) => sm::CasResult::Ok { epoch: new_epoch },
            Err(kube::Error::Api(s)) if s.code == 409 => match self.api.get(&self.name).await {
                Ok(l) => {
                    let (h, e) = lease_view(&l);
                    sm::CasResult::Conflict { holder: h, epoch: e }
                }
                Err(_) => sm::CasResult::Unavailable,
            },
            Err(e) => {
                tracing::warn!(lease = %self.name, error = %e, "lease write failed; acting under the standalone rules");
                sm::CasResult::Unavailable
            }
        }
    }
}

fn lease_view(l: &Lease) -> (Option<sm::NodeId>, u64) {
    let spec = l.spec.as_ref();
    let holder =
        spec.and_then(|s| s.holder_identity.clone()).filter(|h| !h.is_empty()).and_then(|h| sm::NodeId::new(h).ok());
    let epoch = spec.and_then(|s| s.lease_transitions).map(|t| t.max(0) as u64).unwrap_or(0);
    (holder, epoch)
}

/// The name of a pair's Lease.
pub fn lease_name(pair: &str) -> String {
    format!("havip-{pair}")
}

/// The name of a pair's key Secret (when the spec names none).
pub fn key_secret_name(pair: &str) -> String {
    format!("havip-{pair}-key")
}

/// Writes this member's status entry, the FloatingIP status and Events.
struct KubeReporter {
    node: String,
    view: Mutex<ReporterView>,
    /// (state, epoch) of the VIPs while this member holds them as the active.
    fip: watch::Sender<Option<(&'static str, u64)>>,
    tx: watch::Sender<Option<MemberStatus>>,
    events: tokio::sync::mpsc::UnboundedSender<sm::Event>,
    operations: Mutex<HashMap<u64, (String, OperationKind)>>,
    last_op: Mutex<Option<Operation>>,
}

fn now_time() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// What the reporter knows of the configuration (updated on a reconfiguration).
struct ReporterView {
    paths: Vec<String>,
    vips: Vec<VipConfig>,
    revision: String,
    key_id: i64,
    path_addresses: Vec<(String, String)>,
}

impl ReporterView {
    fn of(cfg: &AgentConfig) -> Self {
        Self {
            paths: cfg.paths.clone(),
            vips: cfg.vips.clone(),
            revision: havip_crds::revision::format_revision(cfg.sm.config_revision),
            key_id: i64::from(cfg.keys.current.id),
            path_addresses: cfg
                .paths
                .iter()
                .filter_map(|p| cfg.local_member().and_then(|m| m.addresses.get(p)).map(|a| (p.clone(), a.to_string())))
                .collect(),
        }
    }
}

impl KubeReporter {
    fn set_config(&self, cfg: &AgentConfig) {
        *self.view.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = ReporterView::of(cfg);
    }

    fn member_status(&self, st: &sm::Status) -> MemberStatus {
        let view = self.view.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let heard = view
            .paths
            .iter()
            .enumerate()
            .map(|(i, p)| PathHeard {
                path: p.clone(),
                heard: !st.peers.is_empty()
                    && st.peers.iter().all(|peer| peer.heard_paths.contains(&sm::PathId(i as u8))),
            })
            .collect();
        let ready = view
            .vips
            .iter()
            .map(|v| VipReadiness {
                address: format!("{}/{}", v.addr, v.prefix),
                ready: st.ready_all,
                reason: (!st.ready_all).then(|| "a listener of this VIP does not answer".to_owned()),
            })
            .collect();
        MemberStatus {
            node: self.node.clone(),
            role: Some(api_role(st.role)),
            epoch: Some(st.epoch as i64),
            ready,
            heard,
            path_addresses: view
                .path_addresses
                .iter()
                .map(|(p, a)| havip_crds::hapair::PathAddress { path: p.clone(), address: a.clone() })
                .collect(),
            carrier: Some(st.carrier_ok),
            gateway: Some(match st.gateway {
                None => GatewayState::Unknown,
                Some(true) => GatewayState::Reachable,
                Some(false) => GatewayState::Unreachable,
            }),
            applied_revision: Some(view.revision.clone()),
            agent_version: Some(env!("CARGO_PKG_VERSION").to_owned()),
            protocol_version: Some(format!("{}.{}", sm::PROTOCOL.major, sm::PROTOCOL.minor)),
            clock_skew_ms: None,
            maintenance: Some(st.maintenance),
            alarms: st.alarms.iter().map(|a| api_alarm(*a)).collect(),
            last_transition: st.last_transition.as_ref().map(|t| Transition {
                from: t.from.as_str().to_owned(),
                to: t.to.as_str().to_owned(),
                reason: api_reason(t.reason),
                epoch: t.epoch as i64,
                time: None,
            }),
            key_id: Some(view.key_id),
            last_operation: self.last_op.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone(),
            last_seen: None,
        }
    }

    fn answer(&self, id: String, kind: OperationKind, ok: bool, message: String) {
        *self.last_op.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some(Operation { id, kind, result: OperationResult::from_ok(ok), message, time: Some(now_time()) });
    }
}

/// The role as the cluster API spells it.
fn api_role(r: sm::Role) -> MemberRole {
    match r {
        sm::Role::Init => MemberRole::Init,
        sm::Role::Active => MemberRole::Active,
        sm::Role::Standby => MemberRole::Standby,
        sm::Role::Demoting => MemberRole::Demoting,
        sm::Role::Maintenance => MemberRole::Maintenance,
        sm::Role::Fenced => MemberRole::Fenced,
        sm::Role::Unpaired => MemberRole::Unpaired,
    }
}

/// The alarm as the cluster API spells it.
fn api_alarm(a: sm::Alarm) -> MemberAlarm {
    match a {
        sm::Alarm::Suspended => MemberAlarm::Suspended,
        sm::Alarm::VersionMismatch => MemberAlarm::VersionMismatch,
        sm::Alarm::KeyMismatch => MemberAlarm::KeyMismatch,
        sm::Alarm::ClockSkew => MemberAlarm::ClockSkew,
        sm::Alarm::VipUnhealthy => MemberAlarm::VipUnhealthy,
        sm::Alarm::VipConflict => MemberAlarm::VipConflict,
        sm::Alarm::Misconfigured => MemberAlarm::Misconfigured,
        sm::Alarm::MaintenancePending => MemberAlarm::MaintenancePending,
    }
}

/// The reason of a role change in the pair's terms (the operator copies the new
/// active's reason into `status.lastTransition`). Several causes the state machine
/// tells apart are one reason for the pair: how the VIPs arrived at the new holder
/// matters there, not which of the machine's rules moved them.
fn api_reason(r: sm::Reason) -> TransitionReason {
    use sm::Reason as R;
    match r {
        R::Startup => TransitionReason::Startup,
        R::Adopted => TransitionReason::Adopted,
        R::Election => TransitionReason::Elected,
        R::Takeover => TransitionReason::PeerLost,
        R::LeaseConflict | R::NewerEpochPeer | R::NewerEpochLease => TransitionReason::DualActiveResolved,
        R::ClaimAbandoned => TransitionReason::ClaimAbandoned,
        R::PlannedFailover | R::HandoverAccepted => TransitionReason::PlannedFailover,
        R::ForcedFailover => TransitionReason::ForcedFailover,
        R::AutoHandoverAccepted => TransitionReason::AutoHandoverAccepted,
        R::CarrierLost => TransitionReason::CarrierLost,
        R::GatewayLost => TransitionReason::GatewayLost,
        R::VipUnhealthy | R::ListenerDown => TransitionReason::VipUnhealthy,
        R::Failback => TransitionReason::Failback,
        R::MaintenanceOn => TransitionReason::Maintenance,
        R::MaintenanceOff => TransitionReason::MaintenanceOff,
        R::Fenced => TransitionReason::Fenced,
        R::Unfenced => TransitionReason::Unfenced,
        R::Aborted => TransitionReason::Aborted,
        R::AbortedByPeer => TransitionReason::AbortedByPeer,
        R::Unpaired => TransitionReason::Unpaired,
        R::Paired => TransitionReason::Paired,
    }
}

impl Reporter for KubeReporter {
    fn event(&self, event: &sm::Event, status: &sm::Status) {
        runtime::log_event(event);
        if let sm::Event::OperationResult { id, ok, message } = event {
            let known = self.operations.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(id);
            if let Some((sid, kind)) = known {
                self.answer(sid, kind, *ok, message.clone());
            }
        }
        let _ = self.events.send(event.clone());
        let _ = self.tx.send(Some(self.member_status(status)));
    }

    fn status(&self, status: &sm::Status) {
        let fip = (status.holds_vips && status.role == sm::Role::Active).then(|| {
            let state = if status.alarms.contains(&sm::Alarm::VipConflict) {
                "Conflict"
            } else if status.alarms.contains(&sm::Alarm::VipUnhealthy) {
                "Unhealthy"
            } else {
                "Announced"
            };
            (state, status.epoch)
        });
        self.fip.send_if_modified(|cur| {
            if *cur == fip {
                false
            } else {
                *cur = fip;
                true
            }
        });
        let next = self.member_status(status);
        // Only meaningful changes are written (never just timestamps).
        self.tx.send_if_modified(|cur| {
            if cur.as_ref() == Some(&next) {
                false
            } else {
                *cur = Some(next);
                true
            }
        });
    }
}

/// Applies the member entry when it changes, and every 60 s (`lastSeen`).
async fn status_writer(client: Client, pair: String, node: String, mut rx: watch::Receiver<Option<MemberStatus>>) {
    let api: Api<HAPair> = Api::all(client);
    let pp = PatchParams::apply(&havip_crds::manager::agent(&node)).force();
    loop {
        let entry = rx.borrow_and_update().clone();
        if let Some(mut entry) = entry {
            entry.last_seen = Some(now_time());
            let patch = serde_json::json!({
                "apiVersion": "havip.io/v1alpha1",
                "kind": "HAPair",
                "status": {"members": [entry]},
            });
            // Retry until the API server takes it (an outage delays status, nothing else).
            let mut delay = Duration::from_millis(200);
            loop {
                match api.patch_status(&pair, &pp, &Patch::Apply(&patch)).await {
                    Ok(_) => break,
                    Err(kube::Error::Api(s)) if s.code == 404 => break,
                    Err(e) => {
                        tracing::debug!(pair = %pair, error = %e, "status write failed; retrying");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(5));
                        if rx.has_changed().unwrap_or(false) {
                            break;
                        }
                    }
                }
            }
        }
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(Duration::from_secs(60)) => {},
        }
    }
}

/// Publishes Events for role changes and writes the FloatingIP status of held VIPs.
async fn event_writer(
    client: Client,
    pair: HAPair,
    node: String,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<sm::Event>,
) {
    let recorder =
        Recorder::new(client.clone(), KReporter { controller: "havip-agent".into(), instance: Some(node.clone()) });
    let reference = pair.object_ref(&());
    while let Some(ev) = rx.recv().await {
        let (type_, reason, note) = match &ev {
            sm::Event::RoleChanged { from, to, reason, epoch } => (
                EventType::Normal,
                reason.as_str().to_owned(),
                format!("{node}: {} → {} (epoch {epoch})", from.as_str(), to.as_str()),
            ),
            sm::Event::AlarmRaised { alarm, detail } => {
                (EventType::Warning, alarm.as_str().to_owned(), format!("{node}: {detail}"))
            }
            sm::Event::AlarmCleared { .. } => continue,
            sm::Event::OperationResult { ok, message, .. } => (
                if *ok { EventType::Normal } else { EventType::Warning },
                "OperationResult".to_owned(),
                format!("{node}: {message}"),
            ),
        };
        let e = KEvent { type_, reason, note: Some(note), action: "RoleChange".into(), secondary: None };
        if let Err(err) = recorder.publish(&e, &reference).await {
            tracing::debug!(error = %err, "failed to publish an Event");
        }
    }
}

/// Writes the FloatingIP status while this member holds the VIPs (holder, state, epoch),
/// when it changes. The previous holder's entries are taken over (forced apply).
async fn fip_writer(
    client: Client,
    node: String,
    reporter: Arc<KubeReporter>,
    mut rx: watch::Receiver<Option<(&'static str, u64)>>,
) {
    let fips: Api<FloatingIP> = Api::all(client);
    let pp = PatchParams::apply(&havip_crds::manager::agent(&node)).force();
    loop {
        let cur = *rx.borrow_and_update();
        if let Some((state, epoch)) = cur {
            let vips = reporter.view.lock().unwrap_or_else(std::sync::PoisonError::into_inner).vips.clone();
            for v in &vips {
                let patch = serde_json::json!({
                    "apiVersion": "havip.io/v1alpha1",
                    "kind": "FloatingIP",
                    "status": {
                        "holder": node,
                        "state": state,
                        "interface": v.interface,
                        "epoch": epoch,
                        "lastAnnounced": now_time(),
                    },
                });
                let mut delay = Duration::from_millis(200);
                loop {
                    match fips.patch_status(&v.id, &pp, &Patch::Apply(&patch)).await {
                        Ok(_) => break,
                        Err(kube::Error::Api(s)) if s.code == 404 => break,
                        Err(err) => {
                            tracing::debug!(fip = %v.id, error = %err, "FloatingIP status write failed; retrying");
                            tokio::time::sleep(delay).await;
                            delay = (delay * 2).min(Duration::from_secs(5));
                            if rx.has_changed().unwrap_or(false) {
                                break;
                            }
                        }
                    }
                }
            }
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// One pair this agent runs.
struct PairRun {
    revision: u64,
    keys: Keyring,
    handle: Handle,
    task: tokio::task::JoinHandle<()>,
    aux: Vec<tokio::task::JoinHandle<()>>,
    reporter: Arc<KubeReporter>,
    lease_seen: Option<(Option<String>, u64)>,
    maintenance: Option<bool>,
    paused: Option<bool>,
    command_seen: Option<String>,
}

/// Runs the Kubernetes mode until SIGTERM/SIGINT.
pub async fn run(client: Client, opts: KubeAgentOptions, metrics: Arc<AgentMetrics>) -> Result<(), String> {
    let notify = Arc::new(Notify::new());
    let pairs = spawn_store::<DeserializeGuard<HAPair>>(Api::all(client.clone()), notify.clone());
    let fips = spawn_store::<DeserializeGuard<FloatingIP>>(Api::all(client.clone()), notify.clone());
    let nodes = spawn_store::<Node>(Api::all(client.clone()), notify.clone());
    let secrets = spawn_store::<Secret>(Api::namespaced(client.clone(), &opts.namespace), notify.clone());
    let leases = spawn_store::<Lease>(Api::namespaced(client.clone(), &opts.namespace), notify.clone());

    let mut running: BTreeMap<String, PairRun> = BTreeMap::new();
    // Configure nothing before every watch has listed once: a pair started from a
    // partial view (a peer's Node not seen yet) would restart moments later with another
    // configuration revision.
    tracing::info!("waiting for the initial lists of pairs, FloatingIPs, Nodes, Secrets and Leases");
    for (what, ready) in [
        (
            "HAPairs",
            Box::pin(pairs.wait_until_ready()) as std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>>,
        ),
        ("FloatingIPs", Box::pin(fips.wait_until_ready())),
        ("Nodes", Box::pin(nodes.wait_until_ready())),
        ("Secrets", Box::pin(secrets.wait_until_ready())),
        ("Leases", Box::pin(leases.wait_until_ready())),
    ] {
        if ready.await.is_err() {
            return Err(format!("the {what} watch ended before its first list"));
        }
    }
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    tracing::info!(node = %opts.node, namespace = %opts.namespace, "havip-agent running (kubernetes)");
    loop {
        tokio::select! {
            _ = notify.notified() => {},
            _ = tokio::time::sleep(Duration::from_secs(1)) => {},
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
        // Coalesce bursts of watch events.
        tokio::time::sleep(Duration::from_millis(20)).await;
        reconcile(&client, &opts, &metrics, &pairs, &fips, &nodes, &secrets, &leases, &mut running).await;
    }
    // SIGTERM: a rolling upgrade keeps the VIPs and the role; a cordoned (draining) node
    // hands them over first.
    let cordoned = nodes
        .state()
        .iter()
        .find(|n| n.name_any() == opts.node)
        .and_then(|n| n.spec.as_ref().and_then(|s| s.unschedulable))
        .unwrap_or(false);
    for (name, run) in &running {
        if cordoned && opts.handover_when_cordoned && run.handle.status().holds_vips {
            tracing::info!(pair = %name, "node is cordoned: handing the VIPs over before exiting");
            let id = rand_id();
            let r = run
                .handle
                .request(Request::Command(sm::Command::PlannedFailover { id, target: None }), Duration::from_secs(5))
                .await;
            tracing::info!(pair = %name, result = ?r, "handover before exit");
        }
        run.handle.stop().await;
    }
    for (_, run) in running {
        let _ = tokio::time::timeout(Duration::from_secs(5), run.task).await;
        for t in run.aux {
            t.abort();
        }
    }
    Ok(())
}

fn rand_id() -> u64 {
    let t =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
    havip_crds::revision::fnv1a(&t.to_be_bytes()) & !sm::AUTO_OP_BIT
}

/// A reflector store fed by a watcher that never gives up (errors back off and retry).
fn spawn_store<K>(api: Api<K>, notify: Arc<Notify>) -> Store<K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()).default_backoff());
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(_) => notify.notify_one(),
                Err(e) => tracing::debug!(error = %e, "watch error (retrying)"),
            }
        }
    });
    store
}

/// A u64 operation id for a command's string id (top bit clear, as the machine wants).
pub fn op_id(id: &str) -> u64 {
    havip_crds::revision::fnv1a(id.as_bytes()) & !sm::AUTO_OP_BIT
}

#[allow(clippy::too_many_arguments)]
async fn reconcile(
    client: &Client,
    opts: &KubeAgentOptions,
    metrics: &Arc<AgentMetrics>,
    pairs: &Store<DeserializeGuard<HAPair>>,
    fips: &Store<DeserializeGuard<FloatingIP>>,
    nodes: &Store<Node>,
    secrets: &Store<Secret>,
    leases: &Store<Lease>,
    running: &mut BTreeMap<String, PairRun>,
) {
    let mut wanted: BTreeMap<String, HAPair> = BTreeMap::new();
    for p in pairs.state() {
        match &p.0 {
            Ok(pair) if pair.spec.members.iter().any(|m| m.node == opts.node) => {
                wanted.insert(pair.name_any(), pair.clone());
            }
            Ok(_) => {}
            Err(invalid) => tracing::debug!(error = %invalid.error, "ignoring a malformed HAPair"),
        }
    }
    // Pairs this node left (or that were deleted): the runtime gives the VIPs up.
    let gone: Vec<String> = running.keys().filter(|k| !wanted.contains_key(*k)).cloned().collect();
    for name in gone {
        if let Some(run) = running.remove(&name) {
            tracing::info!(pair = %name, "this node is no longer a member: giving up the pair's VIPs");
            run.handle.release().await;
            let _ = tokio::time::timeout(Duration::from_secs(5), run.task).await;
            for t in run.aux {
                t.abort();
            }
        }
    }
    let ifnames: Vec<String> =
        wanted.values().flat_map(|p| p.spec.heartbeat.paths.iter().filter_map(|x| x.interface.clone())).collect();
    let local_interfaces = interface_addresses(&ifnames).await;
    for (name, pair) in wanted {
        let pair_fips: Vec<FloatingIP> =
            fips.state().iter().filter_map(|f| f.0.as_ref().ok()).filter(|f| f.spec.pair == name).cloned().collect();
        let cfg = match agent_config(&pair, &pair_fips, nodes, secrets, opts, &local_interfaces) {
            Ok(c) => c,
            Err(why) => {
                tracing::warn!(pair = %name, reason = %why, "cannot run the pair yet");
                continue;
            }
        };
        let lease = leases.state().iter().find(|l| l.name_any() == lease_name(&name)).map(|l| lease_view(l));
        match running.get_mut(&name) {
            None => match start_pair(client, opts, metrics, &pair, cfg).await {
                Ok(run) => {
                    running.insert(name.clone(), run);
                }
                Err(e) => {
                    metrics.io_error("pair_start");
                    tracing::error!(pair = %name, error = %e, "failed to start the pair");
                    continue;
                }
            },
            Some(run) => {
                if run.revision != cfg.sm.config_revision {
                    // Applied in place: role, epoch and peers are kept (no Init period).
                    tracing::info!(pair = %name, revision = cfg.sm.config_revision, "configuration changed");
                    run.revision = cfg.sm.config_revision;
                    run.keys = cfg.keys.clone();
                    run.reporter.set_config(&cfg);
                    run.handle.reconfigure(cfg).await;
                } else if run.keys != cfg.keys {
                    tracing::info!(pair = %name, key_id = cfg.keys.current.id, "heartbeat key changed");
                    run.handle.set_keys(cfg.keys.clone()).await;
                    run.reporter.set_config(&cfg);
                    run.keys = cfg.keys.clone();
                }
            }
        }
        let Some(run) = running.get_mut(&name) else { continue };
        // The Lease as the machine should see it.
        if let Some((holder, epoch)) = lease {
            let seen = (holder.as_ref().map(|h| h.as_str().to_owned()), epoch);
            // Fed on every change, and again while the machine knows the Lease is behind
            // (a CAS that timed out during an API outage): that is when it reconciles.
            if run.lease_seen.as_ref() != Some(&seen) || run.handle.status().lease_stale {
                run.lease_seen = Some(seen);
                run.handle.input(sm::Input::LeaseObserved { holder, epoch }).await;
            }
        }
        // Declarative maintenance and pause.
        let maint = pair.spec.members.iter().find(|m| m.node == opts.node).map(|m| m.maintenance).unwrap_or(false);
        if run.maintenance != Some(maint) {
            run.maintenance = Some(maint);
            run.handle.input(sm::Input::Command(sm::Command::Maintenance { on: maint, force: false })).await;
        }
        if run.paused != Some(pair.spec.paused) {
            run.paused = Some(pair.spec.paused);
            run.handle.input(sm::Input::Command(sm::Command::SetPaused(pair.spec.paused))).await;
        }
        // Commands from the operator.
        if let Some(cmd) = pair.status.as_ref().and_then(|s| s.command.clone())
            && run.command_seen.as_deref() != Some(cmd.id.as_str())
        {
            run.command_seen = Some(cmd.id.clone());
            dispatch_command(run, cmd).await;
        }
    }
}

async fn dispatch_command(run: &mut PairRun, cmd: havip_crds::PairCommand) {
    let target = cmd.target.as_ref().and_then(|t| sm::NodeId::new(t.clone()).ok());
    let id = op_id(&cmd.id);
    let status = run.handle.status();
    let (machine_cmd, executes) = match cmd.kind {
        OperationKind::PlannedFailover => (Some(sm::Command::PlannedFailover { id, target }), status.holds_vips),
        OperationKind::ForcedFailover => (Some(sm::Command::ForcedFailover { id, target }), status.holds_vips),
        OperationKind::ClearSuspension => (Some(sm::Command::ClearSuspension), true),
        OperationKind::ResumeFailback => (Some(sm::Command::ResumeFailback), true),
        OperationKind::RotateKey | OperationKind::Other(_) => (None, false),
    };
    let Some(machine_cmd) = machine_cmd else {
        run.reporter.answer(cmd.id.clone(), cmd.kind.clone(), false, format!("unknown command {}", cmd.kind));
        return;
    };
    if !executes {
        // Failovers are the active member's to execute.
        return;
    }
    if cmd.kind.is_failover() && cmd.target.as_deref() == Some(run.reporter.node.as_str()) {
        // Nor is a failover to this member ever its own to execute: it holds the VIPs
        // here only when it saw the command late (a watch that stalled, e.g. after a cut
        // cable), after the handover this command asked for. Executing it would answer
        // "not a peer" and race the real answer of the member that handed over.
        return;
    }
    run.reporter
        .operations
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(id, (cmd.id.clone(), cmd.kind.clone()));
    let handle = run.handle.clone();
    let reporter = run.reporter.clone();
    tokio::spawn(async move {
        let reply = handle.request(Request::Command(machine_cmd), Duration::from_secs(5)).await;
        match reply {
            // Failovers are answered by the machine's OperationResult (the reporter maps
            // it); the others are done when accepted.
            Some(Reply::Done { ok, message }) if !cmd.kind.is_failover() => {
                reporter.answer(cmd.id, cmd.kind, ok, message);
                reporter.tx.send_modify(|_| {});
            }
            Some(_) => {}
            None => {
                reporter.answer(cmd.id, cmd.kind, false, "no answer in time: check the roles before retrying".into());
                reporter.tx.send_modify(|_| {});
            }
        }
    });
}

async fn start_pair(
    client: &Client,
    opts: &KubeAgentOptions,
    metrics: &Arc<AgentMetrics>,
    pair: &HAPair,
    cfg: AgentConfig,
) -> Result<PairRun, String> {
    let name = pair.name_any();
    let (tx, rx) = watch::channel(None);
    let (etx, erx) = tokio::sync::mpsc::unbounded_channel();
    let (fip_tx, fip_rx) = watch::channel(None);
    let reporter = Arc::new(KubeReporter {
        node: opts.node.clone(),
        view: Mutex::new(ReporterView::of(&cfg)),
        fip: fip_tx,
        tx,
        events: etx,
        operations: Mutex::new(HashMap::new()),
        last_op: Mutex::new(None),
    });
    let lease = Arc::new(KubeLease { api: Api::namespaced(client.clone(), &opts.namespace), name: lease_name(&name) });
    let keys = cfg.keys.clone();
    let revision = cfg.sm.config_revision;
    let (handle, task) = runtime::start(
        cfg,
        Options {
            state: StateFile::new(&opts.state_dir, &name),
            lease: Some(lease),
            reporter: reporter.clone(),
            metrics: metrics.clone(),
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    let aux = vec![
        tokio::spawn(status_writer(client.clone(), name.clone(), opts.node.clone(), rx)),
        tokio::spawn(event_writer(client.clone(), pair.clone(), opts.node.clone(), erx)),
        tokio::spawn(fip_writer(client.clone(), opts.node.clone(), reporter.clone(), fip_rx)),
    ];
    Ok(PairRun {
        revision,
        keys,
        handle,
        task,
        aux,
        reporter,
        lease_seen: None,
        maintenance: None,
        paused: None,
        command_seen: None,
    })
}

/// This node's address on each of `names` (interfaces of `interface:` heartbeat paths),
/// read from the kernel; see [`pick_path_address`]. Interfaces that do not exist or
/// have no usable address are left out (the pair then waits, saying why).
pub async fn interface_addresses(names: &[String]) -> BTreeMap<String, IpAddr> {
    let mut out = BTreeMap::new();
    if names.is_empty() {
        return out;
    }
    let nl = match crate::netlink::Netlink::new() {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read interface addresses for interface heartbeat paths");
            return out;
        }
    };
    let (links, addrs) = match (nl.links().await, nl.addresses().await) {
        (Ok(l), Ok(a)) => (l, a),
        (Err(e), _) | (_, Err(e)) => {
            tracing::warn!(error = %e, "cannot read interface addresses for interface heartbeat paths");
            return out;
        }
    };
    for name in names {
        if let Some(link) = links.iter().find(|l| &l.name == name)
            && let Some(a) = pick_path_address(addrs.iter().filter(|a| a.ifindex == link.index))
        {
            out.insert(name.clone(), a);
        }
    }
    out
}

/// The address a heartbeat path uses on an interface: the first IPv4 address, else the
/// first global IPv6 address — never a VIP (havip's own), a link-local or a tentative
/// or DAD-failed address.
pub fn pick_path_address<'a>(addrs: impl Iterator<Item = &'a crate::netlink::AddrInfo>) -> Option<IpAddr> {
    let usable: Vec<IpAddr> = addrs
        .filter(|a| !a.is_havip() && !a.tentative && !a.dad_failed)
        .map(|a| a.addr)
        .filter(|ip| match ip {
            IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_link_local(),
            IpAddr::V6(v6) => !v6.is_loopback() && !v6.is_unicast_link_local(),
        })
        .collect();
    usable.iter().find(|ip| ip.is_ipv4()).or_else(|| usable.first()).copied()
}

/// Builds the agent configuration of `pair` from the cluster objects.
///
/// `local_interfaces` holds this node's address on each interface named by an
/// `interface:` heartbeat path (see [`interface_addresses`]); the peers' addresses on
/// such paths come from their `status.members[].pathAddresses`.
pub fn agent_config(
    pair: &HAPair,
    fips: &[FloatingIP],
    nodes: &Store<Node>,
    secrets: &Store<Secret>,
    opts: &KubeAgentOptions,
    local_interfaces: &BTreeMap<String, IpAddr>,
) -> Result<AgentConfig, String> {
    let name = pair.name_any();
    let spec = &pair.spec;
    let paths: Vec<String> = spec.heartbeat.paths.iter().map(|p| p.name.clone()).collect();
    // Member addresses per path.
    let reported: BTreeMap<String, BTreeMap<String, String>> = pair
        .status
        .as_ref()
        .map(|s| {
            s.members
                .iter()
                .map(|m| {
                    (m.node.clone(), m.path_addresses.iter().map(|a| (a.path.clone(), a.address.clone())).collect())
                })
                .collect()
        })
        .unwrap_or_default();
    let mut members = Vec::new();
    let mut addr_table: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for m in &spec.members {
        let node = nodes.state().into_iter().find(|n| n.name_any() == m.node);
        let mut addresses = BTreeMap::new();
        for p in &spec.heartbeat.paths {
            let addr = match (&p.address_type, &p.interface) {
                (Some(t), _) => node.as_ref().and_then(|n| node_address(n, *t)),
                (None, Some(ifname)) if m.node == opts.node => local_interfaces.get(ifname).copied(),
                (None, Some(_)) => reported.get(&m.node).and_then(|r| r.get(&p.name)).and_then(|a| a.parse().ok()),
                (None, None) => None,
            };
            match addr {
                Some(a) => {
                    addresses.insert(p.name.clone(), a);
                }
                None if m.node == opts.node => {
                    return Err(match &p.interface {
                        Some(i) => {
                            format!("no usable address on interface {i} of this node for heartbeat path {}", p.name)
                        }
                        None => format!("no address of this node for heartbeat path {}", p.name),
                    });
                }
                None => {}
            }
        }
        addr_table.insert(m.node.clone(), addresses.iter().map(|(k, v)| (k.clone(), v.to_string())).collect());
        let priority = u8::try_from(m.priority).map_err(|_| format!("member {}: priority out of range", m.node))?;
        members.push(MemberConfig { node: m.node.clone(), priority, addresses });
    }
    // Key.
    let (secret_name, secret_ns) = match &spec.heartbeat.key_secret_ref {
        Some(r) => (r.name.clone(), r.namespace.clone().unwrap_or_else(|| opts.namespace.clone())),
        None => (key_secret_name(&name), opts.namespace.clone()),
    };
    let secret = secrets
        .state()
        .into_iter()
        .find(|s| s.name_any() == secret_name && s.namespace().as_deref() == Some(secret_ns.as_str()))
        .ok_or_else(|| format!("heartbeat key Secret {secret_ns}/{secret_name} not found (yet)"))?;
    let keys = keyring_from_secret(&secret)?;
    // VIPs.
    let mut vips = Vec::new();
    let mut fip_specs = BTreeMap::new();
    for f in fips {
        let (addr, prefix) = parse_cidr(&f.spec.address).map_err(|e| format!("FloatingIP {}: {e}", f.name_any()))?;
        vips.push(VipConfig {
            id: f.name_any(),
            addr,
            prefix,
            interface: f.spec.interface.clone(),
            probe_ports: f.spec.probe.ports.iter().filter_map(|p| u16::try_from(*p).ok()).collect(),
            announce: AnnounceSchedule::from_spec(&f.spec.announce).map_err(|e| e.to_string())?,
        });
        fip_specs.insert(f.name_any(), f.spec.clone());
    }
    vips.sort_by(|a, b| a.id.cmp(&b.id));
    let revision = havip_crds::revision::config_revision(spec, &fip_specs, &addr_table);
    let sm_cfg = build_sm_config(
        &opts.node,
        &members,
        &paths,
        &vips,
        &spec.heartbeat.interval,
        &spec.heartbeat.timeout,
        &spec.takeover,
        &spec.failback,
        &spec.flap_suspension,
        false,
        revision,
    )
    .map_err(|e| e.to_string())?;
    let fence_targets = spec.takeover.fence_targets.iter().filter_map(|t| t.parse().ok()).collect();
    let probe = ProbeConfig {
        interval: havip_crds::duration::parse_duration(&spec.takeover.probe_interval).map_err(|e| e.to_string())?,
        timeout: havip_crds::duration::parse_duration(&spec.takeover.probe_timeout).map_err(|e| e.to_string())?,
        fence_targets,
    };
    let port = u16::try_from(spec.heartbeat.port).map_err(|_| "heartbeat.port out of range".to_owned())?;
    Ok(AgentConfig {
        pair: name,
        node: opts.node.clone(),
        members,
        paths,
        heartbeat_port: port,
        keys,
        vips,
        probe,
        sm: sm_cfg,
        paused: spec.paused,
    })
}

fn node_address(node: &Node, t: NodeAddressType) -> Option<IpAddr> {
    let want = match t {
        NodeAddressType::InternalIP => "InternalIP",
        NodeAddressType::ExternalIP => "ExternalIP",
    };
    let addrs: Vec<IpAddr> = node
        .status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .filter(|a| a.type_ == want)
        .filter_map(|a| a.address.parse().ok())
        .collect();
    addrs.iter().find(|a| a.is_ipv4()).or(addrs.first()).copied()
}

/// The keyring held in a key Secret (`key`/`keyId`, and `previousKey`/`previousKeyId`
/// during a rotation).
pub fn keyring_from_secret(s: &Secret) -> Result<Keyring, String> {
    let data = s.data.as_ref().ok_or("key Secret has no data")?;
    let text = |k: &str| data.get(k).map(|b| String::from_utf8_lossy(&b.0).trim().to_owned());
    let key = text("key").ok_or("key Secret has no `key`")?;
    let id: u32 = text("keyId").unwrap_or_else(|| "1".into()).parse().map_err(|_| "keyId is not a number")?;
    let current = Key { id, secret: crate::config::parse_hex_key(&key).map_err(|e| e.to_string())? };
    let previous = match (text("previousKey"), text("previousKeyId")) {
        (Some(k), Some(i)) if !k.is_empty() => Some(Key {
            id: i.parse().map_err(|_| "previousKeyId is not a number")?,
            secret: crate::config::parse_hex_key(&k).map_err(|e| e.to_string())?,
        }),
        _ => None,
    };
    Ok(Keyring { current, previous })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::AddrInfo;

    fn a(addr: &str, label: Option<&str>) -> AddrInfo {
        AddrInfo {
            ifindex: 3,
            addr: addr.parse().expect("ip"),
            prefix: 24,
            label: label.map(str::to_owned),
            proto: None,
            dad_failed: false,
            tentative: false,
        }
    }

    #[test]
    fn role_change_reasons_reach_the_api_in_the_pairs_terms() {
        use sm::Reason as R;
        for (r, api) in [
            (R::Takeover, TransitionReason::PeerLost),
            (R::Election, TransitionReason::Elected),
            (R::HandoverAccepted, TransitionReason::PlannedFailover),
            (R::PlannedFailover, TransitionReason::PlannedFailover),
            (R::NewerEpochLease, TransitionReason::DualActiveResolved),
            (R::LeaseConflict, TransitionReason::DualActiveResolved),
            (R::ListenerDown, TransitionReason::VipUnhealthy),
            (R::MaintenanceOn, TransitionReason::Maintenance),
            (R::AutoHandoverAccepted, TransitionReason::AutoHandoverAccepted),
            (R::Startup, TransitionReason::Startup),
        ] {
            assert_eq!(api_reason(r), api, "{r:?}");
            // Agent Events and metric labels keep the machine's own names.
            assert_eq!(r.as_str(), format!("{r:?}"));
        }
    }

    #[test]
    fn interface_path_address_skips_vips_link_local_and_prefers_ipv4() {
        let addrs = [
            a("fe80::1", None),
            a("2001:db8::5", None),
            a("192.0.2.10", Some("eth1:hv")),
            a("169.254.3.3", None),
            a("10.0.1.7", None),
        ];
        assert_eq!(pick_path_address(addrs.iter()), Some("10.0.1.7".parse().expect("ip")));
        assert_eq!(pick_path_address(addrs[..2].iter()), Some("2001:db8::5".parse().expect("ip")));
        let mut tentative = a("2001:db8::9", None);
        tentative.tentative = true;
        assert_eq!(pick_path_address([tentative].iter()), None);
        assert_eq!(pick_path_address([a("192.0.2.10", Some("eth1:hv"))].iter()), None);
    }
}
