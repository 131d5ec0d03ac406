//! Whether the operator runs, as its leader-election Lease (`havip-operator` in havip's
//! namespace, see `havip_operator::leader`) tells: the leader renews it every couple of
//! seconds; a replica that stops gracefully clears the holder; one that dies leaves its
//! last renewal behind.
//!
//! The renewal time is the operator's clock and "now" is this machine's, so an expired
//! look alone is not trusted: the plugin also watches the Lease for a few seconds, and
//! a Lease that changes meanwhile belongs to a running operator whatever the clocks say.

use crate::error::{Action, PluginError};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use std::time::Duration;

/// The leader-election Lease's name (the operator's `--leader-election-lease` default).
pub const LEADER_LEASE: &str = "havip-operator";

/// What the leader Lease shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OperatorState {
    /// A holder renewed it within its lease duration.
    Leading {
        /// The leading replica.
        holder: String,
        /// Seconds since its last renewal (by this machine's clock).
        renewed_secs: i64,
    },
    /// The holder has not renewed it for longer than the lease duration.
    Expired {
        /// The last holder.
        holder: String,
        /// Seconds since the last renewal.
        renewed_secs: i64,
        /// The lease duration in seconds.
        duration_secs: i64,
    },
    /// Nobody holds it (the last leader stopped gracefully and no replica took over).
    Released {
        /// Seconds since it was released, if known.
        released_secs: Option<i64>,
    },
    /// There is no such Lease: no operator ever ran in this namespace.
    Missing,
    /// It cannot be read (no permission, an API error): nothing is known.
    Unknown(String),
}

impl OperatorState {
    /// Whether the Lease shows that no operator runs (an expired or released Lease).
    pub fn not_running(&self) -> bool {
        matches!(self, OperatorState::Expired { .. } | OperatorState::Released { .. })
    }

    /// A sentence about the operator, naming the Lease.
    pub fn describe(&self, namespace: &str) -> String {
        let lease = format!("Lease {namespace}/{LEADER_LEASE}");
        match self {
            OperatorState::Leading { holder, renewed_secs } => {
                format!("the operator {holder} leads ({lease} renewed {renewed_secs}s ago) but did not answer")
            }
            OperatorState::Expired { holder, renewed_secs, duration_secs } => format!(
                "its leader {holder} last renewed {lease} {} ago (it expires after {duration_secs}s) and nobody took over",
                human(*renewed_secs)
            ),
            OperatorState::Released { released_secs: Some(s) } => {
                format!("the last leader released {lease} {} ago and no replica took over", human(*s))
            }
            OperatorState::Released { released_secs: None } => {
                format!("nobody holds {lease}: the last leader stopped and no replica took over")
            }
            OperatorState::Missing => {
                format!("there is no {lease}: no operator has ever run in namespace {namespace}")
            }
            OperatorState::Unknown(why) => format!("whether the operator runs is unknown ({lease}: {why})"),
        }
    }
}

fn human(secs: i64) -> String {
    let s = secs.max(0);
    if s >= 86400 {
        format!("{}d{}h", s / 86400, (s % 86400) / 3600)
    } else if s >= 3600 {
        format!("{}h{}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m{}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

/// Reads the state off a Lease at `now`.
pub fn classify(lease: &Lease, now: Timestamp) -> OperatorState {
    let spec = lease.spec.clone().unwrap_or_default();
    let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()).map(|t| now.as_second() - t.0.as_second());
    match spec.holder_identity.filter(|h| !h.is_empty()) {
        None => OperatorState::Released { released_secs: renewed },
        Some(holder) => {
            let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15).max(1));
            match renewed {
                Some(s) if s <= duration => OperatorState::Leading { holder, renewed_secs: s.max(0) },
                Some(s) => OperatorState::Expired { holder, renewed_secs: s, duration_secs: duration },
                // A holder without a renewal time: trust it (an operator wrote it).
                None => OperatorState::Leading { holder, renewed_secs: 0 },
            }
        }
    }
}

async fn read(api: &Api<Lease>, namespace: &str) -> (OperatorState, Option<String>) {
    match api.get_opt(LEADER_LEASE).await {
        Ok(Some(l)) => (classify(&l, Timestamp::now()), l.metadata.resource_version),
        Ok(None) => (OperatorState::Missing, None),
        Err(e) => {
            let e = PluginError::from_kube(Action::lease("get", namespace, LEADER_LEASE), e);
            (OperatorState::Unknown(e.to_string()), None)
        }
    }
}

/// The operator's state now (one read).
pub async fn state(client: &kube::Client, namespace: &str) -> OperatorState {
    read(&Api::namespaced(client.clone(), namespace), namespace).await.0
}

/// Checks before a request is written. `Err(OperatorNotRunning)` only when the Lease
/// shows no running operator and stays unchanged for `grace` (a running leader renews
/// it every few seconds; a follower takes a released Lease within as long). A missing
/// or unreadable Lease lets the request go: havip may run in another namespace or
/// under another Lease name, or the user may not read Leases; the answer (or its
/// absence) tells then.
pub async fn precheck(client: &kube::Client, namespace: &str, grace: Duration) -> Result<(), PluginError> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let (first, version) = read(&api, namespace).await;
    if !first.not_running() {
        return Ok(());
    }
    tracing::debug!(?first, "the operator's Lease looks stale; watching it for {grace:?}");
    let deadline = tokio::time::Instant::now() + grace;
    let mut last = first;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (now, v) = read(&api, namespace).await;
        if v != version || !now.not_running() {
            return Ok(());
        }
        last = now;
    }
    Err(PluginError::OperatorNotRunning { detail: last.describe(namespace), namespace: namespace.to_owned() })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::{LEADER_LEASE, OperatorState, classify};
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::jiff::Timestamp;

    fn lease(holder: Option<&str>, renewed: Option<&str>, duration: i32) -> Lease {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": LEADER_LEASE},
            "spec": {"holderIdentity": holder, "renewTime": renewed, "leaseDurationSeconds": duration},
        }))
        .unwrap()
    }

    #[test]
    fn the_lease_tells_whether_the_operator_runs() {
        let now: Timestamp = "2027-01-15T08:00:00Z".parse().unwrap();
        let l = lease(Some("op-1"), Some("2027-01-15T07:59:58.000000Z"), 15);
        assert_eq!(classify(&l, now), OperatorState::Leading { holder: "op-1".into(), renewed_secs: 2 });
        let l = lease(Some("op-1"), Some("2027-01-15T07:50:00.000000Z"), 15);
        let s = classify(&l, now);
        assert_eq!(s, OperatorState::Expired { holder: "op-1".into(), renewed_secs: 600, duration_secs: 15 });
        assert!(s.not_running());
        assert!(s.describe("havip-system").contains("op-1 last renewed Lease havip-system/havip-operator 10m0s ago"));
        let l = lease(None, Some("2027-01-15T06:00:00.000000Z"), 1);
        let s = classify(&l, now);
        assert_eq!(s, OperatorState::Released { released_secs: Some(7200) });
        assert!(s.not_running());
        assert!(s.describe("x").contains("released Lease x/havip-operator 2h0m ago"), "{}", s.describe("x"));
        let l = lease(Some("op-1"), None, 15);
        assert!(!classify(&l, now).not_running());
        assert!(!OperatorState::Missing.not_running(), "a missing Lease may mean another namespace");
        assert!(OperatorState::Missing.describe("havip-system").contains("no operator has ever run"));
        assert!(!OperatorState::Unknown("forbidden".into()).not_running());
    }
}
