//! What the machine is told about its pair's fencing record (the Kubernetes Lease, or the
//! witness's record in standalone mode): a change of holder or epoch, and renewals.

use crate::runtime::Handle;
use crate::sm;

/// What the agent reads of a fencing record: holder and epoch, and a renewal mark (the
/// Lease's `renewTime`, the witness's session and renewal count) whose change under the
/// same holder and epoch is a renewal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseSnapshot {
    /// Holder (none or empty: `None`).
    pub holder: Option<sm::NodeId>,
    /// The epoch (`leaseTransitions`).
    pub epoch: u64,
    /// The renewal mark as read.
    pub renewed: Option<String>,
}

/// What of the record one pair's machine was last told.
#[derive(Default)]
pub struct LeaseFeed {
    seen: Option<LeaseSnapshot>,
}

impl LeaseFeed {
    /// Feeds the record to the machine when holder or epoch changed, and again while the
    /// machine knows the record is behind (a CAS that timed out while the store was
    /// unreachable): that is when it reconciles it. A new renewal mark under the same
    /// holder and epoch is a renewal.
    pub async fn feed(&mut self, handle: &Handle, lease: Option<LeaseSnapshot>) {
        let Some(now) = lease else { return };
        let before = self.seen.replace(now.clone());
        let same_record = before.as_ref().is_some_and(|b| b.holder == now.holder && b.epoch == now.epoch);
        if !same_record || handle.status().lease_stale {
            handle.input(sm::Input::LeaseObserved { holder: now.holder, epoch: now.epoch }).await;
        } else if before.is_some_and(|b| b.renewed != now.renewed)
            && let Some(holder) = now.holder
        {
            handle.input(sm::Input::LeaseRenewed { holder, epoch: now.epoch }).await;
        }
    }

    /// Forgets what was fed: the next record is fed as an observation, never as a
    /// renewal (the witness restarted: its renewal marks start afresh).
    pub fn forget(&mut self) {
        self.seen = None;
    }
}
