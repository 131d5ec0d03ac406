//! The pair Lease as the fencing record: its name, the compare-and-swap the runtime
//! calls on every role change, and feeding what the Lease watch shows to the machine.
//! It holds no policy: the machine decides when to claim and what a newer epoch means.

use crate::lease::LeaseSnapshot;
use crate::runtime::LeaseStore;
use crate::sm;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, PostParams};

/// The name of a pair's Lease.
pub fn lease_name(pair: &str) -> String {
    havip_crds::lease::pair_lease_name(pair)
}

/// A compare-and-swap of the pair Lease against the API server.
pub struct KubeLease {
    api: Api<Lease>,
    name: String,
}

impl KubeLease {
    /// The Lease of `pair` in the namespace `api` is bound to.
    pub fn new(api: Api<Lease>, pair: &str) -> KubeLease {
        KubeLease { api, name: lease_name(pair) }
    }
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

    async fn renew(&self, holder: &str, epoch: u64) -> Option<(Option<sm::NodeId>, u64)> {
        let current = match self.api.get(&self.name).await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(lease = %self.name, error = %e, "Lease read for a renewal failed");
                return None;
            }
        };
        let view = lease_view(&current);
        if view.0.as_ref().map(sm::NodeId::as_str) != Some(holder) || view.1 != epoch {
            return Some(view);
        }
        let mut next = current;
        let spec = next.spec.get_or_insert_with(Default::default);
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        match self.api.replace(&self.name, &PostParams::default(), &next).await {
            Ok(l) => Some(lease_view(&l)),
            // Written in between: whatever it reads now.
            Err(kube::Error::Api(s)) if s.code == 409 => self.api.get(&self.name).await.ok().map(|l| lease_view(&l)),
            Err(e) => {
                tracing::warn!(lease = %self.name, error = %e, "Lease renewal refused");
                Some(view)
            }
        }
    }
}

impl LeaseSnapshot {
    /// The snapshot of `l`.
    pub fn of(l: &Lease) -> LeaseSnapshot {
        let (holder, epoch) = lease_view(l);
        let renewed = l.spec.as_ref().and_then(|s| s.renew_time.as_ref()).map(|t| t.0.to_string());
        LeaseSnapshot { holder, epoch, renewed }
    }
}

/// Holder and epoch of a Lease as the machine reads them (no or an empty holder: none).
pub fn lease_view(l: &Lease) -> (Option<sm::NodeId>, u64) {
    let spec = l.spec.as_ref();
    let holder =
        spec.and_then(|s| s.holder_identity.clone()).filter(|h| !h.is_empty()).and_then(|h| sm::NodeId::new(h).ok());
    let epoch = spec.and_then(|s| s.lease_transitions).map(|t| t.max(0) as u64).unwrap_or(0);
    (holder, epoch)
}
