//! The VIPPool reconcile: `status.size`, `used`, `reserved`, `heldByHand`, `free` and the `Ready`
//! condition (False when the pool's pair is missing, its entries overlap, or it overlaps
//! an older pool — the message says which; it also names the reserved addresses the pool
//! skips), with an Event on every change of `Ready`, when FloatingIPs written by hand
//! hold addresses of the pool, and when the number of reserved addresses it skips
//! changes.

use super::model::{self, PoolProblem, is_allocated};
use crate::Error;
use crate::context::{Context, Ev};
use crate::guard::guarded_reconcile;
use crate::model::Reserved;
use havip_crds::{VIPPool, condition, manager, reason};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use std::net::IpAddr;
use std::sync::Arc;

/// Reconciles one pool (an unreadable one gets `InvalidSpec`; see [`crate::guard`]).
pub async fn reconcile(obj: Arc<DeserializeGuard<VIPPool>>, ctx: Arc<Context>) -> Result<Action, Error> {
    guarded_reconcile(obj, ctx, reconcile_pool).await
}

async fn reconcile_pool(pool: &VIPPool, ctx: &Context) -> Result<Action, Error> {
    ctx.wait_lb_ready().await?;
    let name = pool.name_any();
    let states = super::service::pools(ctx);
    let Some(state) = states.iter().find(|s| s.name == name) else { return Ok(Action::await_change()) };
    let fips: Vec<havip_crds::FloatingIP> =
        ctx.fips.state().iter().filter_map(|f| f.0.as_ref().ok().cloned()).collect();
    let holdings = model::holdings(&fips, "", |_| None);
    let size = state.size();
    let used = state.used(&holdings);
    let reserved = ctx.reserved.read(|idx| state.reserved(idx, &holdings));
    let reserved_count = i64::try_from(reserved.len()).unwrap_or(i64::MAX);
    let free = size.saturating_sub(used).saturating_sub(reserved_count).max(0);
    let by_hand: Vec<String> = fips
        .iter()
        .filter(|f| !is_allocated(f))
        .filter(|f| {
            havip_crds::floatingip::vip_address(&f.spec.address)
                .is_some_and(|a| state.blocks.iter().any(|b| b.contains(a)))
        })
        .map(|f| f.name_any())
        .collect();
    let held_by_hand = i64::try_from(by_hand.len()).unwrap_or(i64::MAX);
    let verdict = readiness(state.problem.as_ref(), free, size, &by_hand, &reserved);
    let status = pool.status.clone().unwrap_or_default();
    let previous = status.conditions.iter().find(|c| c.type_ == condition::READY);
    let generation = pool.meta().generation;
    let same = previous.is_some_and(|c| {
        c.status == if verdict.ready { "True" } else { "False" }
            && c.reason == verdict.reason
            && c.message == verdict.message
    }) && status.size == Some(size)
        && status.used == Some(used)
        && status.free == Some(free)
        && status.reserved == Some(reserved_count)
        && status.held_by_hand == Some(held_by_hand)
        && status.observed_generation == generation;
    if !same {
        ctx.guard("status")?;
        let cond = crate::model::condition(
            &status.conditions,
            condition::READY,
            verdict.ready,
            verdict.reason,
            verdict.message.clone(),
            generation,
            Timestamp::now(),
        );
        let patch = serde_json::json!({
            "apiVersion": VIPPool::api_version(&()),
            "kind": VIPPool::kind(&()),
            "status": {"size": size, "used": used, "free": free, "reserved": reserved_count,
                       "heldByHand": held_by_hand, "observedGeneration": generation, "conditions": [cond]},
        });
        let api: Api<VIPPool> = Api::all(ctx.client.clone());
        api.patch_status(&name, &PatchParams::apply(manager::OPERATOR).force(), &Patch::Apply(&patch))
            .await
            .map_err(|source| Error::ApplyStatus { kind: "VIPPool", name: name.clone(), source: Box::new(source) })?;
        ctx.metrics.status_writes.get_or_create(&crate::metrics::KindLabels { kind: "VIPPool" }).inc();
        let was = previous.map(|c| (c.status == "True", c.reason.as_str()));
        if was != Some((verdict.ready, verdict.reason)) {
            let ev = if verdict.ready {
                Ev::normal(reason::READY, "Validate", verdict.message.clone())
            } else {
                Ev::warning(verdict.reason, "Validate", verdict.message.clone())
            };
            ctx.event(pool, ev).await;
        }
        // Once when FloatingIPs written by hand start holding addresses of the pool (the
        // count is in the status). A status written before the count was kept there reads
        // as none held.
        if held_by_hand > 0 && status.held_by_hand.unwrap_or(0) == 0 {
            let note =
                format!("addresses of this pool are held by FloatingIPs written by hand: {}", by_hand.join(", "));
            ctx.event(pool, Ev::warning(reason::ADDRESS_IN_USE, "Validate", note)).await;
        }
        // Once per change of how many it skips (the count is in the status).
        if reserved_count > 0 && status.reserved != Some(reserved_count) {
            let note = format!(
                "{reserved_count} address(es) of this pool are never handed out, being the API server's or a \
                 Node's own{}",
                skipped_sentence(&reserved)
            );
            ctx.event(pool, Ev::warning(reason::RESERVED_ADDRESS, "Validate", note)).await;
        }
    }
    Ok(Action::requeue(ctx.settings.resync * 5))
}

/// The pool's `Ready` condition.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Readiness {
    /// It hands out addresses.
    ready: bool,
    /// The condition's reason.
    reason: &'static str,
    /// The condition's message.
    message: String,
}

/// The `Ready` condition of a pool with `problem` (None: usable), `free` of `size`
/// addresses free, the FloatingIPs written by hand that hold some of its addresses, and
/// the reserved addresses it skips.
fn readiness(
    problem: Option<&PoolProblem>,
    free: i64,
    size: i64,
    by_hand: &[String],
    reserved: &[(IpAddr, Reserved)],
) -> Readiness {
    let skipped = skipped_sentence(reserved);
    match problem {
        Some(p) => {
            Readiness { ready: false, reason: p.reason(), message: format!("the pool hands out no address: {p}") }
        }
        None if by_hand.is_empty() => Readiness {
            ready: true,
            reason: reason::AS_EXPECTED,
            message: format!("{free} of {size} addresses free{skipped}"),
        },
        None => Readiness {
            ready: true,
            reason: reason::AS_EXPECTED,
            message: format!(
                "{free} of {size} addresses free; {} held by FloatingIPs written by hand ({}), which the pool skips{skipped}",
                by_hand.len(),
                by_hand.join(", ")
            ),
        },
    }
}

/// How many reserved addresses are listed by name.
const SKIPPED_LISTED: usize = 5;

/// "; skips 10.0.0.1 (the InternalIP of node n1), …" for the `Ready` message (empty when
/// the pool skips none).
fn skipped_sentence(reserved: &[(IpAddr, Reserved)]) -> String {
    if reserved.is_empty() {
        return String::new();
    }
    let listed: Vec<String> = reserved.iter().take(SKIPPED_LISTED).map(|(a, why)| format!("{a} ({why})")).collect();
    let more = reserved.len().saturating_sub(SKIPPED_LISTED);
    format!(
        "; skips {} reserved address(es), never a Service's: {}{}",
        reserved.len(),
        listed.join(", "),
        if more > 0 { format!(" and {more} more") } else { String::new() }
    )
}

#[cfg(test)]
mod tests {
    use super::{PoolProblem, Reserved, readiness};
    use havip_crds::reason;

    #[test]
    fn readiness_says_why_a_pool_hands_out_nothing_and_what_it_skips() {
        let r = readiness(Some(&PoolProblem::PairNotFound("p".into())), 0, 4, &[], &[]);
        assert_eq!((r.ready, r.reason), (false, reason::PAIR_NOT_FOUND));
        assert_eq!(r.message, "the pool hands out no address: HAPair p does not exist");
        let r = readiness(Some(&PoolProblem::Overlap("old".into())), 0, 4, &[], &[]);
        assert_eq!((r.ready, r.reason), (false, reason::OVERLAP));

        let r = readiness(None, 3, 4, &[], &[]);
        assert_eq!((r.ready, r.reason, r.message.as_str()), (true, reason::AS_EXPECTED, "3 of 4 addresses free"));

        let by_hand = ["fip-a".to_owned()];
        let node = Reserved::Node { node: "n1".into(), kind: "InternalIP".into() };
        let r = readiness(None, 2, 4, &by_hand, &[("10.0.0.1".parse().expect("ip"), node)]);
        assert!(r.ready);
        assert_eq!(
            r.message,
            "2 of 4 addresses free; 1 held by FloatingIPs written by hand (fip-a), which the pool skips; skips 1 \
             reserved address(es), never a Service's: 10.0.0.1 (the InternalIP of node n1)"
        );
    }
}
