//! What one pair's agent tells the cluster: its own `status.members[]` entry (on every
//! meaningful change and every 60 s), the FloatingIP status while it holds the VIPs,
//! Events for its role changes and alarms, and its answers to the operator's commands.
//! The state machine's values are mapped to the API's words here, once; both status
//! writers go through one apply-until-accepted loop. Nothing here decides anything.

use crate::config::{AgentConfig, VipConfig};
use crate::runtime::{self, Reporter};
use crate::sm;
use havip_crds::hapair::{PathAddress, PathHeard, VipReadiness};
use havip_crds::{
    FloatingIP, GatewayState, HAPair, MemberAlarm, MemberRole, MemberStatus, Operation, OperationKind, OperationResult,
    Transition, TransitionReason, VipState,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KEvent, EventType, Recorder, Reporter as KReporter};
use kube::{Client, Resource, ResourceExt};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// How often the member entry is written even without a change (`lastSeen`, which the
/// operator uses to tell a silent member).
const REFRESH: Duration = Duration::from_secs(60);

/// The FloatingIP status of the held VIPs: their state and the epoch they are held under.
type FipState = (VipState, u64);

/// A failover command this member was handed, waiting for the machine's result.
struct Pending {
    op: u64,
    id: String,
    kind: OperationKind,
}

/// Turns what the runtime reports into this member's status entry, the FloatingIP
/// status and Events (the writers run as tasks, see [`spawn_writers`]).
pub(super) struct KubeReporter {
    node: String,
    view: Mutex<ReporterView>,
    fip: watch::Sender<Option<FipState>>,
    entry: watch::Sender<Option<MemberStatus>>,
    events: mpsc::UnboundedSender<sm::Event>,
    /// The one failover this member may be executing for the operator: the machine
    /// reports its result under the numeric id, the API wants the request id.
    pending: Mutex<Option<Pending>>,
    last_op: Mutex<Option<Operation>>,
}

/// What the reporter knows of the configuration (updated on a reconfiguration).
struct ReporterView {
    paths: Vec<String>,
    vips: Vec<VipConfig>,
    revision: String,
    key_id: i64,
    path_addresses: Vec<(String, String)>,
    /// Why the current configuration could not be applied (the view above is the last
    /// one that was).
    config_error: Option<String>,
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
            config_error: None,
        }
    }
}

/// The receiving ends of a reporter, for [`spawn_writers`].
pub(super) struct Outlets {
    fip: watch::Receiver<Option<FipState>>,
    entry: watch::Receiver<Option<MemberStatus>>,
    events: mpsc::UnboundedReceiver<sm::Event>,
}

fn now_time() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl KubeReporter {
    /// A reporter for `node` running `cfg`, and the ends its writers read.
    pub(super) fn new(node: &str, cfg: &AgentConfig) -> (KubeReporter, Outlets) {
        let (entry, entry_rx) = watch::channel(None);
        let (fip, fip_rx) = watch::channel(None);
        let (events, events_rx) = mpsc::unbounded_channel();
        let reporter = KubeReporter {
            node: node.to_owned(),
            view: Mutex::new(ReporterView::of(cfg)),
            fip,
            entry,
            events,
            pending: Mutex::new(None),
            last_op: Mutex::new(None),
        };
        (reporter, Outlets { fip: fip_rx, entry: entry_rx, events: events_rx })
    }

    /// This member's node name.
    pub(super) fn node(&self) -> &str {
        &self.node
    }

    /// Whether the applied configuration has a VIP of FloatingIP `name`.
    pub(super) fn runs_vip(&self, name: &str) -> bool {
        lock(&self.view).vips.iter().any(|v| v.id == name)
    }

    /// Takes a new configuration into account (paths, VIPs, revision, key id): called
    /// once the runtime applied it, never before.
    pub(super) fn set_config(&self, cfg: &AgentConfig) {
        let next = ReporterView::of(cfg);
        let vips_changed = {
            let mut v = lock(&self.view);
            let changed = v.vips != next.vips;
            *v = next;
            changed
        };
        // A VIP added to (or changed in) a held configuration needs its FloatingIP's
        // holder fields written, though role and epoch stay what they were.
        if vips_changed {
            self.fip.send_if_modified(|cur| cur.is_some());
        }
    }

    /// Records why the current configuration cannot be applied (`None`: it was), and
    /// publishes the entry when that changed. Returns whether it changed.
    pub(super) fn set_config_error(&self, error: Option<String>, status: &sm::Status) -> bool {
        let changed = {
            let mut v = lock(&self.view);
            let changed = v.config_error != error;
            v.config_error = error;
            changed
        };
        if changed {
            self.publish(status);
        }
        changed
    }

    /// Remembers the failover command `id` handed to the machine as operation `op`: the
    /// machine's result for `op` becomes this member's answer to `id`. A newer command
    /// replaces it (the operator issues one command at a time).
    pub(super) fn expect_result(&self, op: u64, id: String, kind: OperationKind) {
        *lock(&self.pending) = Some(Pending { op, id, kind });
    }

    /// Records this member's answer to a command and publishes the entry with it.
    pub(super) fn answer(&self, id: String, kind: OperationKind, ok: bool, message: String, status: &sm::Status) {
        *lock(&self.last_op) =
            Some(Operation { id, kind, result: OperationResult::from_ok(ok), message, time: Some(now_time()) });
        self.publish(status);
    }

    /// Publishes the entry for `status` if it differs from the last one: only meaningful
    /// changes are written (never just timestamps).
    fn publish(&self, status: &sm::Status) {
        let next = self.member_status(status);
        self.entry.send_if_modified(|cur| {
            if cur.as_ref() == Some(&next) {
                false
            } else {
                *cur = Some(next);
                true
            }
        });
    }

    fn member_status(&self, st: &sm::Status) -> MemberStatus {
        let view = lock(&self.view);
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
                .map(|(p, a)| PathAddress { path: p.clone(), address: a.clone() })
                .collect(),
            carrier: Some(st.carrier_ok),
            gateway: Some(api_gateway(st.gateway)),
            applied_revision: Some(view.revision.clone()),
            config_error: view.config_error.clone(),
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
            last_operation: lock(&self.last_op).clone(),
            last_seen: None,
        }
    }
}

impl Reporter for KubeReporter {
    fn event(&self, event: &sm::Event, status: &sm::Status) {
        runtime::log_event(event);
        if let sm::Event::OperationResult { id, ok, message } = event {
            let mut pending = lock(&self.pending);
            if let Some(p) = pending.take_if(|p| p.op == *id) {
                drop(pending);
                *lock(&self.last_op) = Some(Operation {
                    id: p.id,
                    kind: p.kind,
                    result: OperationResult::from_ok(*ok),
                    message: message.clone(),
                    time: Some(now_time()),
                });
            }
        }
        let _ = self.events.send(event.clone());
        let _ = self.entry.send(Some(self.member_status(status)));
    }

    fn status(&self, status: &sm::Status) {
        let fip = (status.holds_vips && status.role == sm::Role::Active).then(|| {
            let state = if status.alarms.contains(&sm::Alarm::VipConflict) {
                VipState::Conflict
            } else if status.alarms.contains(&sm::Alarm::VipUnhealthy) {
                VipState::Unhealthy
            } else {
                VipState::Announced
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
        self.publish(status);
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

/// The gateway check as the cluster API spells it (`None`: no fence target ever answered).
fn api_gateway(g: Option<bool>) -> GatewayState {
    match g {
        None => GatewayState::Unknown,
        Some(true) => GatewayState::Reachable,
        Some(false) => GatewayState::Unreachable,
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
        sm::Alarm::HeartbeatReplay => MemberAlarm::HeartbeatReplay,
        sm::Alarm::PeerPartition => MemberAlarm::PeerPartition,
        sm::Alarm::WitnessUnreachable => MemberAlarm::WitnessUnreachable,
        sm::Alarm::EpochExhausted => MemberAlarm::EpochExhausted,
        sm::Alarm::PeerSilent => MemberAlarm::PeerSilent,
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

/// Starts the three writers of one pair: member entry, FloatingIP status, Events.
pub(super) fn spawn_writers(
    client: &Client,
    pair: &HAPair,
    reporter: std::sync::Arc<KubeReporter>,
    outlets: Outlets,
) -> Vec<tokio::task::JoinHandle<()>> {
    let name = pair.name_any();
    let pp = PatchParams::apply(&havip_crds::manager::agent(&reporter.node)).force();
    vec![
        tokio::spawn(entry_writer(Api::all(client.clone()), name, pp.clone(), outlets.entry)),
        tokio::spawn(event_writer(client.clone(), pair.clone(), reporter.node.clone(), outlets.events)),
        tokio::spawn(fip_writer(Api::all(client.clone()), pp, reporter, outlets.fip)),
    ]
}

/// Server-side applies `patch` to the status of `name` until the API server takes it,
/// backing off from 200 ms to 5 s: an outage delays status, nothing else. Stops early
/// when the object is gone (404), or when `superseded` says a newer value is waiting.
async fn apply_until_accepted<K>(
    api: &Api<K>,
    name: &str,
    pp: &PatchParams,
    patch: &serde_json::Value,
    superseded: impl Fn() -> bool,
) where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut delay = Duration::from_millis(200);
    loop {
        match api.patch_status(name, pp, &Patch::Apply(patch)).await {
            Ok(_) => return,
            Err(kube::Error::Api(s)) if s.code == 404 => return,
            Err(e) => {
                tracing::debug!(kind = %K::kind(&()), name, error = %e, "status write failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
                if superseded() {
                    return;
                }
            }
        }
    }
}

/// Applies this member's entry of the pair status when it changes, and every
/// [`REFRESH`] (`lastSeen`).
async fn entry_writer(api: Api<HAPair>, pair: String, pp: PatchParams, mut rx: watch::Receiver<Option<MemberStatus>>) {
    loop {
        let entry = rx.borrow_and_update().clone();
        if let Some(mut entry) = entry {
            entry.last_seen = Some(now_time());
            let patch = serde_json::json!({
                "apiVersion": "havip.io/v1alpha1",
                "kind": "HAPair",
                "status": {"members": [entry]},
            });
            apply_until_accepted(&api, &pair, &pp, &patch, || rx.has_changed().unwrap_or(false)).await;
        }
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(REFRESH) => {},
        }
    }
}

/// Writes the FloatingIP status while this member holds the VIPs (holder, state,
/// epoch), when it changes. The previous holder's entries are taken over (forced apply).
async fn fip_writer(
    api: Api<FloatingIP>,
    pp: PatchParams,
    reporter: std::sync::Arc<KubeReporter>,
    mut rx: watch::Receiver<Option<FipState>>,
) {
    loop {
        let cur = *rx.borrow_and_update();
        if let Some((state, epoch)) = cur {
            let vips = lock(&reporter.view).vips.clone();
            for v in &vips {
                let patch = serde_json::json!({
                    "apiVersion": "havip.io/v1alpha1",
                    "kind": "FloatingIP",
                    "status": {
                        "holder": reporter.node,
                        "state": state,
                        "interface": v.interface,
                        "epoch": epoch,
                        "lastAnnounced": now_time(),
                    },
                });
                apply_until_accepted(&api, &v.id, &pp, &patch, || rx.has_changed().unwrap_or(false)).await;
            }
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Publishes Events for role changes, alarms and operation results (on the HAPair).
async fn event_writer(client: Client, pair: HAPair, node: String, mut rx: mpsc::UnboundedReceiver<sm::Event>) {
    let recorder = Recorder::new(client, KReporter { controller: "havip-agent".into(), instance: Some(node.clone()) });
    let reference = pair.object_ref(&());
    while let Some(ev) = rx.recv().await {
        let (type_, reason, note) = match &ev {
            // The machine's own reason names (the README lists them), not the pair's.
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn roles_and_alarms_keep_their_names() {
        for r in sm::Role::ALL {
            assert_eq!(api_role(r).as_str(), r.as_str());
        }
        for a in sm::Alarm::ALL {
            assert_eq!(api_alarm(a).as_str(), a.as_str());
            assert!(MemberAlarm::KNOWN.contains(&api_alarm(a)), "{a:?} is a known value of the contract");
        }
        assert_eq!(api_gateway(None), GatewayState::Unknown);
        assert_eq!(api_gateway(Some(false)), GatewayState::Unreachable);
    }
}
