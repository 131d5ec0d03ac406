//! What one pair's agent tells the cluster: its own `status.members[]` entry (on every
//! meaningful change and every 60 s), the FloatingIP status while it holds the VIPs (and
//! its removal when it stops holding them), Events for its role changes and alarms, and
//! its answers to the operator's commands.
//! The state machine's values are mapped to the API's words here, once; both status
//! writers go through one apply-until-accepted loop. Nothing here decides anything.

use crate::announce::bgp::SpeakerReport;
use crate::config::{AgentConfig, VipConfig};
use crate::runtime::{self, Reporter, VipLink};
use crate::sm;
use havip_crds::hapair::{BgpAdvertisement, BgpSession, PathAddress, PathHeard, SpeakerStatus, VipReadiness};
use havip_crds::{
    FloatingIP, GatewayState, HAPair, MemberAlarm, MemberRole, MemberStatus, Operation, OperationKind, OperationResult,
    Transition, TransitionReason, VipState,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KEvent, EventType, Recorder, Reporter as KReporter};
use kube::{Client, Resource, ResourceExt};
use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// How often the member entry is written even without a change (`lastSeen`, which the
/// operator uses to tell a silent member).
const REFRESH: Duration = Duration::from_secs(60);

/// What this member tells the FloatingIPs of its pair.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
enum FipState {
    /// Starting up (role Init): whatever an earlier run wrote stays until the machine
    /// settles (a restarted holder adopts its VIPs within a second).
    #[default]
    Starting,
    /// Holds nothing: this member's holder fields are removed.
    Free,
    /// Holds the VIPs.
    Held(Held),
}

/// The VIPs this member holds: their state (pair-wide: `Announced` or `Unhealthy`), the
/// epoch they are held under, and the foreign MACs seen answering for some of them.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Held {
    state: VipState,
    epoch: u64,
    conflicts: Vec<(String, [u8; 6])>,
}

fn mac_string(m: &[u8; 6]) -> String {
    format!("{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5])
}

/// The status this member applies to the FloatingIP of `vip` while it holds the VIPs.
fn fip_status(node: &str, h: &Held, vip: &VipConfig, link: Option<&VipLink>) -> serde_json::Value {
    let conflict = h.conflicts.iter().find(|(id, _)| *id == vip.id).map(|(_, m)| mac_string(m));
    let state = if conflict.is_some() { VipState::Conflict } else { h.state };
    let mut status = serde_json::json!({
        "holder": node,
        "state": state,
        "interface": link.map(|l| l.ifname.clone()).or_else(|| vip.interface.clone()),
        "epoch": h.epoch,
        "lastAnnounced": now_time(),
    });
    if let Some(mac) = link.and_then(|l| l.mac.as_ref()) {
        status["holderMac"] = serde_json::Value::String(mac_string(mac));
    }
    if let Some(mac) = conflict {
        status["conflictMac"] = serde_json::Value::String(mac);
    }
    serde_json::json!({"apiVersion": "havip.io/v1alpha1", "kind": "FloatingIP", "status": status})
}

/// The holder fields, all removed: what this member writes onto a FloatingIP that still
/// names it as holder once it holds nothing, under the `resourceVersion` it read. (Not an
/// apply without the fields: a field another member applied with the same value, such
/// as `state: Announced`, is owned by both and would stay.)
fn fip_release(resource_version: Option<String>) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"resourceVersion": resource_version},
        "status": {
            "holder": null, "state": null, "holderMac": null, "conflictMac": null,
            "interface": null, "epoch": null, "lastAnnounced": null,
        },
    })
}

/// Removes this member's holder fields from FloatingIP `name` if it still names
/// `node`: a read, then a merge patch under the read's resourceVersion (a newer holder's
/// write in between wins: read again). Backs off like [`apply_until_accepted`]; false
/// when `superseded` stopped it first.
async fn release_fip(api: &Api<FloatingIP>, name: &str, node: &str, superseded: impl Fn() -> bool) -> bool {
    let mut delay = Duration::from_millis(200);
    loop {
        let result = match api.get_opt(name).await {
            Ok(None) => return true,
            Ok(Some(f)) if f.status.as_ref().and_then(|s| s.holder.as_deref()) != Some(node) => return true,
            Ok(Some(f)) => {
                let patch = fip_release(f.resource_version());
                let pp =
                    PatchParams { field_manager: Some(havip_crds::manager::agent(node)), ..PatchParams::default() };
                api.patch_status(name, &pp, &Patch::Merge(&patch)).await.map(|_| ())
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => return true,
            Err(kube::Error::Api(s)) if s.code == 404 => return true,
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => {
                tracing::warn!(kind = "FloatingIP", name, error = %e, retry_in = ?delay, "failed to remove this node's holder fields");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
                if superseded() {
                    return false;
                }
            }
        }
    }
}

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
    fip: watch::Sender<FipState>,
    /// The VIPs' interfaces as the runtime resolved them.
    links: Mutex<Vec<VipLink>>,
    entry: watch::Sender<Option<MemberStatus>>,
    events: mpsc::UnboundedSender<sm::Event>,
    /// The one failover this member may be executing for the operator: the machine
    /// reports its result under the numeric id, the API wants the request id.
    pending: Mutex<Option<Pending>>,
    last_op: Mutex<Option<Operation>>,
    /// The machine's last transition (its monotonic time) and the wall-clock time it was
    /// first reported at: the member entry's `lastTransition.time`.
    transition_seen: Mutex<Option<(sm::Millis, Time)>>,
    /// What the node's BGP speaker last said (pairs with routed VIPs).
    speaker: Mutex<Option<SpeakerStatus>>,
    /// The configuration as last applied, for the node checks.
    config: Mutex<AgentConfig>,
    /// What the node checks last found (see [`crate::doctor`]).
    findings: Mutex<Vec<havip_crds::Finding>>,
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
    fip: watch::Receiver<FipState>,
    entry: watch::Receiver<Option<MemberStatus>>,
    events: mpsc::UnboundedReceiver<sm::Event>,
}

/// When `t` happened, in wall-clock time: the time it was first reported (the runtime
/// reports a role change at once), kept while the machine's transition stays the same.
fn transition_time(
    seen: &mut Option<(sm::Millis, Time)>,
    t: &sm::Transition,
    now: impl FnOnce() -> Time,
) -> Option<Time> {
    match seen {
        Some((at, time)) if *at == t.at => Some(time.clone()),
        _ => {
            let time = now();
            *seen = Some((t.at, time.clone()));
            Some(time)
        }
    }
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
        let (fip, fip_rx) = watch::channel(FipState::Starting);
        let (events, events_rx) = mpsc::unbounded_channel();
        let reporter = KubeReporter {
            node: node.to_owned(),
            view: Mutex::new(ReporterView::of(cfg)),
            fip,
            links: Mutex::new(Vec::new()),
            entry,
            events,
            pending: Mutex::new(None),
            last_op: Mutex::new(None),
            transition_seen: Mutex::new(None),
            speaker: Mutex::new(None),
            config: Mutex::new(cfg.clone()),
            findings: Mutex::new(Vec::new()),
        };
        (reporter, Outlets { fip: fip_rx, entry: entry_rx, events: events_rx })
    }

    /// Takes a new configuration into account (paths, VIPs, revision, key id): called
    /// once the runtime applied it, never before.
    pub(super) fn set_config(&self, cfg: &AgentConfig) {
        *lock(&self.config) = cfg.clone();
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
            self.fip.send_modify(|_| {});
        }
    }

    /// Records what the node checks found and publishes the entry when that changed.
    pub(super) fn set_findings(&self, findings: Vec<havip_crds::Finding>) {
        {
            let mut cur = lock(&self.findings);
            if *cur == findings {
                return;
            }
            for f in findings.iter().filter(|f| !cur.contains(f)) {
                tracing::warn!(check = %f.check, subject = %f.subject, detail = %f.detail, fix = f.check.fix(), "node check");
            }
            *cur = findings.clone();
        }
        self.entry.send_if_modified(|e| match e {
            Some(e) if e.findings != findings => {
                e.findings = findings;
                true
            }
            _ => false,
        });
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
                ready: st.not_ready.is_none(),
                reason: st.not_ready.map(|n| {
                    match n {
                        sm::NotReady::Listener => "a listener of this VIP does not answer",
                        sm::NotReady::CutOff => "this member is cut off (a link without carrier, or no gateway)",
                        sm::NotReady::CarrierSettling => "its carrier returned a moment ago and is not stable yet",
                    }
                    .to_owned()
                }),
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
                time: transition_time(&mut lock(&self.transition_seen), t, now_time),
            }),
            key_id: Some(view.key_id),
            last_operation: lock(&self.last_op).clone(),
            last_seen: None,
            draining_to: st.draining.as_ref().map(|(to, _)| to.as_str().to_owned()),
            forwarding_to: st.forwarding_to.as_ref().map(|n| n.as_str().to_owned()),
            bgp: lock(&self.speaker).clone(),
            findings: lock(&self.findings).clone(),
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
        let fip = if status.holds_vips && status.role == sm::Role::Active {
            FipState::Held(Held {
                state: if status.alarms.contains(&sm::Alarm::VipUnhealthy) {
                    VipState::Unhealthy
                } else {
                    VipState::Announced
                },
                epoch: status.epoch,
                conflicts: status.conflicts.iter().map(|(v, m)| (v.as_str().to_owned(), *m)).collect(),
            })
        } else if status.role == sm::Role::Init {
            FipState::Starting
        } else {
            FipState::Free
        };
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

    fn links(&self, links: &[VipLink]) {
        *lock(&self.links) = links.to_vec();
        self.fip.send_modify(|_| {});
    }

    fn speaker(&self, report: &SpeakerReport) {
        let next = api_speaker(report);
        let changed = {
            let mut cur = lock(&self.speaker);
            let changed = cur.as_ref() != Some(&next);
            *cur = Some(next.clone());
            changed
        };
        if changed {
            // The entry as it stands, with the speaker's new word (written like any change).
            self.entry.send_if_modified(|e| match e {
                Some(e) if e.bgp.as_ref() != Some(&next) => {
                    e.bgp = Some(next);
                    true
                }
                _ => false,
            });
        }
    }
}

/// The speaker's report as the cluster API spells it.
fn api_speaker(r: &SpeakerReport) -> SpeakerStatus {
    SpeakerStatus {
        speaker: r.kind.map(|k| k.as_str().to_owned()),
        error: r.error.clone(),
        sessions: r
            .sessions
            .iter()
            .map(|s| BgpSession { peer: s.peer.clone(), state: s.state.clone(), established: s.established })
            .collect(),
        advertised: r
            .advertised
            .iter()
            .map(|a| BgpAdvertisement {
                address: crate::announce::bgp::speaker::host_route(a.address),
                peers: a.peers.clone(),
            })
            .collect(),
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
        sm::Alarm::LeaseBehind => MemberAlarm::LeaseBehind,
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
        R::LeaseConflict | R::NewerEpochPeer | R::NewerEpochLease | R::UnverifiedPeer => {
            TransitionReason::DualActiveResolved
        }
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
        // Quorum fencing is a standalone (control-plane) rule; it reads as fenced here.
        R::Fenced | R::QuorumLost => TransitionReason::Fenced,
        R::Unfenced => TransitionReason::Unfenced,
        R::Aborted => TransitionReason::Aborted,
        R::AbortedByPeer => TransitionReason::AbortedByPeer,
        R::Unpaired => TransitionReason::Unpaired,
        R::Paired => TransitionReason::Paired,
    }
}

/// Starts the three writers of one pair: member entry, FloatingIP status, Events.
/// How often a pair's agent checks its node (`members[].findings`); the first check waits
/// [`DOCTOR_FIRST`], so that a peer heard on one path but not yet on the other at start is
/// no finding.
pub(super) const DOCTOR_EVERY: Duration = Duration::from_secs(60);
/// See [`DOCTOR_EVERY`].
pub(super) const DOCTOR_FIRST: Duration = Duration::from_secs(10);

/// Checks the node every [`DOCTOR_EVERY`] against the pair's configuration and its state
/// machine's view of its peers, and hands the findings to the reporter.
pub(super) fn spawn_doctor(
    handle: runtime::Handle,
    reporter: std::sync::Arc<KubeReporter>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        tokio::time::sleep(DOCTOR_FIRST).await;
        loop {
            let cfg = lock(&reporter.config).clone();
            let facts = match crate::netlink::Netlink::new() {
                Ok(nl) => crate::doctor::gather(&nl, &[&cfg]).await,
                Err(e) => Err(e),
            };
            match facts {
                Ok(facts) => {
                    let heard = crate::doctor::Heard::of(&handle.status(), &cfg.paths).with_skew(handle.clock_skew());
                    reporter.set_findings(crate::doctor::check(&facts, &[&cfg], &[Some(heard)]));
                }
                Err(e) => {
                    tracing::warn!(pair = %cfg.pair, error = %e, "node check: cannot read the node's network state")
                }
            }
            tokio::time::sleep(DOCTOR_EVERY).await;
        }
    })
}

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
/// when the object is gone (404, counts as done), or when `superseded` says a newer
/// value is waiting (returns false: not written). Failures are logged at `warn` with
/// the object and the API server's reason (an RBAC or admission refusal must be seen).
async fn apply_until_accepted<K>(
    api: &Api<K>,
    name: &str,
    pp: &PatchParams,
    patch: &serde_json::Value,
    superseded: impl Fn() -> bool,
) -> bool
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut delay = Duration::from_millis(200);
    loop {
        match api.patch_status(name, pp, &Patch::Apply(patch)).await {
            Ok(_) => return true,
            Err(kube::Error::Api(s)) if s.code == 404 => return true,
            Err(e) => {
                tracing::warn!(kind = %K::kind(&()), name, error = %e, retry_in = ?delay, "status write failed");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
                if superseded() {
                    return false;
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
/// interface and its MAC, epoch, a foreign MAC seen answering), when it changes; the
/// previous holder's fields are taken over (forced apply). When it stops holding them
/// (or a VIP leaves the configuration) it removes the holder fields where they still name
/// it, so that a FloatingIP nobody holds names no holder.
async fn fip_writer(
    api: Api<FloatingIP>,
    pp: PatchParams,
    reporter: std::sync::Arc<KubeReporter>,
    mut rx: watch::Receiver<FipState>,
) {
    // FloatingIPs this member may have holder fields on: at start every VIP of the
    // configuration (an earlier run may have held them).
    let mut written: BTreeSet<String> = lock(&reporter.view).vips.iter().map(|v| v.id.clone()).collect();
    loop {
        let cur = rx.borrow_and_update().clone();
        let vips = lock(&reporter.view).vips.clone();
        let links = lock(&reporter.links).clone();
        let superseded = || rx.has_changed().unwrap_or(false);
        let held = match &cur {
            FipState::Starting => None,
            FipState::Free => Some(None),
            FipState::Held(h) => Some(Some(h)),
        };
        if let Some(held) = held {
            let mut holding = BTreeSet::new();
            if let Some(h) = held {
                for v in &vips {
                    let link = links.iter().find(|l| l.id == v.id);
                    let patch = fip_status(&reporter.node, h, v, link);
                    if apply_until_accepted(&api, &v.id, &pp, &patch, superseded).await {
                        written.insert(v.id.clone());
                    }
                    holding.insert(v.id.clone());
                }
            }
            let stale: Vec<String> = written.difference(&holding).cloned().collect();
            for id in stale {
                if release_fip(&api, &id, &reporter.node, superseded).await {
                    written.remove(&id);
                }
            }
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// The `action` of the agents' Events, one per kind.
pub mod action {
    /// A role change (reason: the pair's transition reason).
    pub const ROLE_CHANGE: &str = "RoleChange";
    /// An alarm raised (reason: the member alarm).
    pub const ALARM: &str = "Alarm";
    /// The result of an operation this member executed.
    pub const OPERATION: &str = "Operation";
    /// A drain started or ended.
    pub const DRAIN: &str = "Drain";
}

/// The Event of one of the machine's events (none for a cleared alarm): the pair's words
/// as reason, the kind as action, the machine's own cause in the note.
fn event_of(node: &str, ev: &sm::Event) -> Option<KEvent> {
    let (type_, reason, action, note) = match ev {
        // The pair's terms, as in `members[].lastTransition`; the machine's finer
        // cause is in the note.
        sm::Event::RoleChanged { from, to, reason, epoch } => (
            EventType::Normal,
            api_reason(*reason).as_str().to_owned(),
            action::ROLE_CHANGE,
            format!("{node}: {} → {} (epoch {epoch}; {})", from.as_str(), to.as_str(), reason.as_str()),
        ),
        sm::Event::AlarmRaised { alarm, detail } => {
            (EventType::Warning, api_alarm(*alarm).as_str().to_owned(), action::ALARM, format!("{node}: {detail}"))
        }
        sm::Event::AlarmCleared { .. } => return None,
        sm::Event::OperationResult { ok, message, .. } => (
            if *ok { EventType::Normal } else { EventType::Warning },
            havip_crds::reason::OPERATION_RESULT.to_owned(),
            action::OPERATION,
            format!("{node}: {message}"),
        ),
        sm::Event::Drain { started, peer, detail } => (
            EventType::Normal,
            if *started { havip_crds::reason::DRAIN_STARTED } else { havip_crds::reason::DRAIN_ENDED }.to_owned(),
            action::DRAIN,
            format!("{node} (drain to {peer}): {detail}"),
        ),
    };
    Some(KEvent { type_, reason, note: Some(note), action: action.into(), secondary: None })
}

/// Publishes Events for role changes, alarms and operation results (on the HAPair).
async fn event_writer(client: Client, pair: HAPair, node: String, mut rx: mpsc::UnboundedReceiver<sm::Event>) {
    let recorder = Recorder::new(
        client,
        KReporter { controller: havip_crds::reporting::AGENT.into(), instance: Some(node.clone()) },
    );
    let reference = pair.object_ref(&());
    while let Some(ev) = rx.recv().await {
        let Some(e) = event_of(&node, &ev) else { continue };
        if let Err(err) = recorder.publish(&e, &reference).await {
            tracing::debug!(error = %err, "failed to publish an Event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{
        Held, action, api_alarm, api_gateway, api_reason, api_role, event_of, fip_release, fip_status, transition_time,
    };
    use crate::config::VipConfig;
    use crate::runtime::VipLink;
    use crate::sm;
    use havip_crds::{GatewayState, MemberAlarm, TransitionReason, VipState};
    use kube::runtime::events::EventType;

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
            // Metric labels and the Events' notes keep the machine's own names.
            assert_eq!(r.as_str(), format!("{r:?}"));
        }
    }

    #[test]
    fn a_member_transition_carries_the_time_it_was_first_reported() {
        let t = |at: u64| sm::Transition {
            from: sm::Role::Standby,
            to: sm::Role::Active,
            reason: sm::Reason::Takeover,
            epoch: 2,
            at: sm::Millis(at),
        };
        let time = |s: i64| {
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(s).expect("time"),
            )
        };
        let mut seen = None;
        assert_eq!(transition_time(&mut seen, &t(100), || time(1_000)), Some(time(1_000)));
        // Published again later: the same transition keeps its time.
        assert_eq!(transition_time(&mut seen, &t(100), || time(1_060)), Some(time(1_000)));
        // A new transition gets the time it was first reported.
        assert_eq!(transition_time(&mut seen, &t(5_000), || time(1_090)), Some(time(1_090)));
    }

    #[test]
    fn agent_events_speak_the_pairs_words_with_an_action_per_kind() {
        let role = sm::Event::RoleChanged {
            from: sm::Role::Standby,
            to: sm::Role::Active,
            reason: sm::Reason::Takeover,
            epoch: 4,
        };
        let e = event_of("n1", &role).expect("role change");
        assert_eq!((e.reason.as_str(), e.action.as_str()), ("PeerLost", action::ROLE_CHANGE));
        assert_eq!(e.note.as_deref(), Some("n1: Standby → Active (epoch 4; Takeover)"));
        let alarm = sm::Event::AlarmRaised { alarm: sm::Alarm::KeyMismatch, detail: "unknown key".into() };
        let e = event_of("n1", &alarm).expect("alarm");
        assert_eq!((e.reason.as_str(), e.action.as_str()), ("KeyMismatch", action::ALARM));
        assert!(matches!(e.type_, EventType::Warning));
        assert!(event_of("n1", &sm::Event::AlarmCleared { alarm: sm::Alarm::KeyMismatch }).is_none());
        let mut actions = std::collections::BTreeSet::new();
        for ev in [
            role,
            alarm,
            sm::Event::OperationResult { id: 1, ok: true, message: "done".into() },
            sm::Event::Drain {
                started: true,
                peer: sm::NodeId::new("n0".to_owned()).expect("node id"),
                detail: "5 s".into(),
            },
        ] {
            actions.insert(event_of("n1", &ev).expect("an Event").action);
        }
        assert_eq!(actions.len(), 4, "one action per kind: {actions:?}");
    }

    #[test]
    fn the_floatingip_status_names_the_holder_its_mac_and_a_foreign_mac() {
        let vip = |id: &str| VipConfig {
            id: id.to_owned(),
            addr: "192.0.2.10".parse().expect("ip"),
            prefix: 24,
            interface: None,
            probe_ports: vec![80],
            health_checks: vec![],
            announce: crate::config::AnnounceSchedule::from_spec(&Default::default(), Default::default())
                .expect("defaults"),
        };
        let held =
            Held { state: VipState::Announced, epoch: 4, conflicts: vec![("b".to_owned(), [0x02, 0, 0, 0, 0, 0x0b])] };
        let link = VipLink { id: "a".to_owned(), ifname: "eth1".to_owned(), mac: Some([0xaa, 0xbb, 0xcc, 0, 1, 2]) };
        let a = fip_status("n0", &held, &vip("a"), Some(&link));
        let s = &a["status"];
        assert_eq!(s["holder"], "n0");
        assert_eq!(s["state"], "Announced");
        assert_eq!(s["interface"], "eth1", "the interface the runtime resolved");
        assert_eq!(s["holderMac"], "aa:bb:cc:00:01:02");
        assert_eq!(s["epoch"], 4);
        assert!(s.get("conflictMac").is_none(), "no foreign host answers for a: {s}");
        // Only the VIP a foreign host answers for is in conflict, with that host's MAC.
        let b = fip_status("n0", &held, &vip("b"), None);
        assert_eq!(b["status"]["state"], "Conflict");
        assert_eq!(b["status"]["conflictMac"], "02:00:00:00:00:0b");
        assert!(b["status"].get("holderMac").is_none(), "no link known: no MAC");
        // Released: every holder field removed, under the resourceVersion read.
        let r = fip_release(Some("42".to_owned()));
        assert_eq!(r["metadata"]["resourceVersion"], "42");
        for k in ["holder", "state", "holderMac", "conflictMac", "interface", "epoch", "lastAnnounced"] {
            assert!(r["status"][k].is_null() && r["status"].get(k).is_some(), "{k} removed: {r}");
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
