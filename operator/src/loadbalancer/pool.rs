//! The VIPPool reconcile: `status.size`, `used`, `reserved`, `free` and the `Ready`
//! condition (False when the pool's pair is missing, its entries overlap, or it overlaps
//! an older pool — the message says which; it also names the reserved addresses the pool
//! skips), with an Event on every change of `Ready`, when FloatingIPs written by hand
//! hold addresses of the pool, and when the number of reserved addresses it skips
//! changes.

use super::model::{self, is_allocated};
use crate::Error;
use crate::context::{Context, Ev};
use crate::guard::guarded_reconcile;
use havip_crds::{VIPPool, condition, manager};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
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
    let skipped = skipped_sentence(&reserved);
    let (ready, reason, message) = match &state.problem {
        Some(p) => (false, p.reason(), format!("the pool hands out no address: {p}")),
        None if by_hand.is_empty() => {
            (true, havip_crds::reason::AS_EXPECTED, format!("{free} of {size} addresses free{skipped}"))
        }
        None => (
            true,
            havip_crds::reason::AS_EXPECTED,
            format!(
                "{free} of {size} addresses free; {} held by FloatingIPs written by hand ({}), which the pool skips{skipped}",
                by_hand.len(),
                by_hand.join(", ")
            ),
        ),
    };
    let status = pool.status.clone().unwrap_or_default();
    let previous = status.conditions.iter().find(|c| c.type_ == condition::READY);
    let generation = pool.meta().generation;
    let same = previous.is_some_and(|c| {
        c.status == if ready { "True" } else { "False" } && c.reason == reason && c.message == message
    }) && status.size == Some(size)
        && status.used == Some(used)
        && status.free == Some(free)
        && status.reserved == Some(reserved_count)
        && status.observed_generation == generation;
    if !same {
        ctx.guard("status")?;
        let cond = crate::model::condition(
            &status.conditions,
            condition::READY,
            ready,
            reason,
            message.clone(),
            generation,
            Timestamp::now(),
        );
        let patch = serde_json::json!({
            "apiVersion": VIPPool::api_version(&()),
            "kind": VIPPool::kind(&()),
            "status": {"size": size, "used": used, "free": free, "reserved": reserved_count,
                       "observedGeneration": generation, "conditions": [cond]},
        });
        let api: Api<VIPPool> = Api::all(ctx.client.clone());
        api.patch_status(&name, &PatchParams::apply(manager::OPERATOR).force(), &Patch::Apply(&patch))
            .await
            .map_err(|source| Error::ApplyStatus { kind: "VIPPool", name: name.clone(), source: Box::new(source) })?;
        ctx.metrics.status_writes.get_or_create(&crate::metrics::KindLabels { kind: "VIPPool" }).inc();
        let was = previous.map(|c| (c.status == "True", c.reason.clone(), c.message.contains("written by hand")));
        let now = (ready, reason.to_owned(), !by_hand.is_empty());
        if was.as_ref().map(|w| (w.0, &w.1)) != Some((now.0, &now.1)) {
            let ev = if ready {
                Ev::normal("Ready", "Validate", message.clone())
            } else {
                Ev::warning(reason, "Validate", message.clone())
            };
            ctx.event(pool, ev).await;
        }
        if now.2 && was.is_none_or(|w| !w.2) {
            let note =
                format!("addresses of this pool are held by FloatingIPs written by hand: {}", by_hand.join(", "));
            ctx.event(pool, Ev::warning(havip_crds::reason::ADDRESS_IN_USE, "Validate", note)).await;
        }
        // Once per change of how many it skips (the count is in the status).
        if reserved_count > 0 && status.reserved != Some(reserved_count) {
            let note = format!(
                "{reserved_count} address(es) of this pool are never handed out, being the API server's or a \
                 Node's own{skipped}"
            );
            ctx.event(pool, Ev::warning(havip_crds::reason::RESERVED_ADDRESS, "Validate", note)).await;
        }
    }
    Ok(Action::requeue(ctx.settings.resync * 5))
}

/// How many reserved addresses are listed by name.
const SKIPPED_LISTED: usize = 5;

/// "; skips 10.0.0.1 (the InternalIP of node n1), …" for the `Ready` message (empty when
/// the pool skips none).
fn skipped_sentence(reserved: &[(std::net::IpAddr, crate::model::Reserved)]) -> String {
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
