//! What the operator says of each FloatingIP of a pair: its `Accepted`, `Ready` and
//! `Conflict` conditions and `observedGeneration` (one field manager, one apply), and
//! whether its holder fields must give way to `state: Pending` because nobody holds the
//! VIP. Pure: the pair's observation and assessment in, the verdict out.
//!
//! The holder's agent writes `holder`, `state`, `holderMac`, `conflictMac`, `epoch` and
//! removes them when it stops holding; the operator clears them only when the named
//! holder provably holds nothing: its own report, written after its holder fields (both
//! timestamps come from that node's clock), gives a role that holds no VIPs. An agent
//! cut off from the API server may still hold the VIP, so a silent holder keeps its
//! fields and `Ready` reads `Unknown`.

use super::assess::{Assessment, is_reporting};
use super::observed::{Observed, Refusal, member_status};
use havip_crds::{FloatingIP, MemberRole, Phase, VipState, reason};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// A condition's status and reason, and its message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// `True`, `False` or `Unknown`.
    pub status: &'static str,
    /// CamelCase reason.
    pub reason: &'static str,
    /// A sentence.
    pub message: String,
}

impl Verdict {
    fn new(status: &'static str, reason: &'static str, message: String) -> Self {
        Self { status, reason, message }
    }
}

/// The operator's view of one FloatingIP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FipVerdict {
    /// `Accepted`: handed to the pair's agents, or refused and why.
    pub accepted: Verdict,
    /// `Ready`: held by the pair's active and announced with its self-check passing.
    pub ready: Verdict,
    /// `Conflict`: a foreign host answers for the address.
    pub conflict: Verdict,
    /// The status names a holder that holds nothing: clear the holder fields and write
    /// `state: Pending`; also when no holder is named and the state is not `Pending` yet.
    pub pending: bool,
}

/// The verdict on `fip`, a FloatingIP of the pair `o` describes (`refusal`: why the
/// operator refused it, if it did).
pub fn fip_verdict(o: &Observed, a: &Assessment, fip: &FloatingIP, refusal: Option<&Refusal>) -> FipVerdict {
    let address = fip.spec.address.as_str();
    let status = fip.status.clone().unwrap_or_default();
    let accepted = match refusal {
        None => Verdict::new(
            "True",
            reason::AS_EXPECTED,
            format!("address {address} is handed to the agents of pair {}", fip.spec.pair),
        ),
        Some(r) => Verdict::new("False", r.reason(), r.message(address)),
    };
    let holder = status.holder.clone().filter(|h| !h.is_empty());
    let holder_report = holder.as_deref().and_then(|h| member_status(&o.status, h));
    // The named holder provably holds nothing: a report of its own, later than the one
    // that named it holder (whole seconds, both from its clock), gives a role that holds
    // no VIPs.
    let holds_nothing = holder_report.is_some_and(|s| {
        let later = match (&s.last_seen, &status.last_announced) {
            (Some(seen), Some(named)) => seen.0 > named.0,
            _ => false,
        };
        later && !matches!(s.role, Some(MemberRole::Active | MemberRole::Demoting))
    });
    let nobody = |why: String| Verdict::new("False", reason::NOT_HELD, why);
    let ready = if let Some(r) = refusal {
        Verdict::new("False", r.reason(), r.message(address))
    } else if holder.is_none() || holds_nothing {
        nobody(match a.phase {
            Phase::Pending => format!("nobody holds {address}: the pair has not elected an active member yet"),
            Phase::Failed => format!("nobody holds {address}: {}", a.phase_message),
            _ => match &a.active {
                Some(act) => format!("nobody holds {address} yet: {act} is the pair's active"),
                None => format!("nobody holds {address}"),
            },
        })
    } else if let Some(h) = holder.as_deref()
        && !is_reporting(holder_report, o.now)
    {
        let since = holder_report
            .and_then(|s| s.last_seen.as_ref())
            .map(|t| t.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
            .unwrap_or_else(|| "it started".to_owned());
        Verdict::new(
            "Unknown",
            reason::HOLDER_NOT_REPORTING,
            format!("{h} held {address} when it last reported ({since}); it may still hold it"),
        )
    } else if let Some(h) = holder.as_deref()
        && a.active.as_deref() != Some(h)
    {
        Verdict::new(
            "False",
            reason::HOLDER_NOT_ACTIVE,
            format!(
                "{h} is named as holder of {address}, but the pair's active is {}",
                a.active.as_deref().unwrap_or("nobody")
            ),
        )
    } else {
        let h = holder.as_deref().unwrap_or_default();
        match status.state {
            Some(VipState::Conflict) => Verdict::new(
                "False",
                reason::VIP_CONFLICT,
                format!(
                    "{h} holds {address}, but a foreign host ({}) answers for it too",
                    status.conflict_mac.as_deref().unwrap_or("MAC unknown")
                ),
            ),
            Some(VipState::Unhealthy) => Verdict::new(
                "False",
                reason::VIP_UNHEALTHY,
                format!("{h} holds {address}, but it is missing from the kernel or its listeners do not answer"),
            ),
            Some(VipState::Announced) => Verdict::new(
                "True",
                reason::ANNOUNCED,
                format!("{address} is announced by {h} (epoch {})", status.epoch.unwrap_or_default()),
            ),
            Some(VipState::Pending) | None => {
                nobody(format!("{h} is the pair's active but has not announced {address} yet"))
            }
        }
    };
    let conflict = match (&holder, &status.state) {
        (Some(h), Some(VipState::Conflict)) if !holds_nothing => Verdict::new(
            "True",
            reason::VIP_CONFLICT,
            format!(
                "a foreign host ({}) answers for {address}, held by {h}: find it by its MAC and remove the address there",
                status.conflict_mac.as_deref().unwrap_or("MAC unknown")
            ),
        ),
        _ => Verdict::new("False", reason::NO_CONFLICT, String::new()),
    };
    let pending = if holder.is_some() { holds_nothing } else { status.state != Some(VipState::Pending) };
    FipVerdict { accepted, ready, conflict, pending }
}

/// The verdict on a FloatingIP whose pair does not exist: nobody holds it.
pub fn orphan_verdict(fip: &FloatingIP) -> FipVerdict {
    let message = format!("HAPair {} does not exist: no member will hold this VIP", fip.spec.pair);
    let status = fip.status.clone().unwrap_or_default();
    FipVerdict {
        accepted: Verdict::new("False", reason::PAIR_NOT_FOUND, message.clone()),
        ready: Verdict::new("False", reason::PAIR_NOT_FOUND, message),
        conflict: Verdict::new("False", reason::NO_CONFLICT, String::new()),
        pending: status.holder.is_none() && status.state != Some(VipState::Pending),
    }
}

/// The three conditions of a verdict, keeping each `lastTransitionTime` from
/// `previous` when its status did not change.
pub fn fip_conditions(
    previous: &[Condition],
    v: &FipVerdict,
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    [(havip_crds::condition::ACCEPTED, &v.accepted), (READY, &v.ready), (havip_crds::condition::CONFLICT, &v.conflict)]
        .into_iter()
        .map(|(type_, c)| {
            let since = previous
                .iter()
                .find(|p| p.type_ == type_ && p.status == c.status)
                .map(|p| p.last_transition_time.clone())
                .unwrap_or(Time(now));
            Condition {
                type_: type_.to_owned(),
                status: c.status.to_owned(),
                reason: c.reason.to_owned(),
                message: c.message.clone(),
                observed_generation: generation,
                last_transition_time: since,
            }
        })
        .collect()
}

/// Whether `previous` already says what `v` says (timestamps aside) for `generation`.
pub fn fip_conditions_current(previous: &[Condition], v: &FipVerdict, generation: Option<i64>) -> bool {
    [(havip_crds::condition::ACCEPTED, &v.accepted), (READY, &v.ready), (havip_crds::condition::CONFLICT, &v.conflict)]
        .into_iter()
        .all(|(type_, c)| {
            previous.iter().any(|p| {
                p.type_ == type_
                    && p.status == c.status
                    && p.reason == c.reason
                    && p.message == c.message
                    && p.observed_generation == generation
            })
        })
}

const READY: &str = havip_crds::condition::READY;
