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

/// What the machine is told of a fencing record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseInput {
    /// A new record (holder or epoch), or the same again while the runtime's is behind.
    Observed,
    /// The same holder and epoch under a new renewal mark.
    Renewed,
}

/// The Lease rule: a new holder or epoch is an observation, and so is the same record
/// while the runtime knows its record is behind (`stale`: a compare-and-swap timed out
/// while the store was unreachable — that is when it reconciles it); a new renewal mark
/// under the same holder and epoch is a renewal; nothing else is fed.
pub fn lease_input(seen: Option<&LeaseSnapshot>, now: Option<&LeaseSnapshot>, stale: bool) -> Option<LeaseInput> {
    let now = now?;
    let same_record = seen.is_some_and(|b| b.holder == now.holder && b.epoch == now.epoch);
    if !same_record || stale {
        return Some(LeaseInput::Observed);
    }
    (seen.is_some_and(|b| b.renewed != now.renewed) && now.holder.is_some()).then_some(LeaseInput::Renewed)
}

/// What of the record one pair's machine was last told.
#[derive(Default)]
pub struct LeaseFeed {
    seen: Option<LeaseSnapshot>,
}

impl LeaseFeed {
    /// Feeds the record to the machine as [`lease_input`] says.
    pub async fn feed(&mut self, handle: &Handle, lease: Option<LeaseSnapshot>) {
        let Some(now) = lease else { return };
        let input = lease_input(self.seen.as_ref(), Some(&now), handle.status().lease_stale);
        self.seen = Some(now.clone());
        match input {
            Some(LeaseInput::Observed) => {
                handle.input(sm::Input::LeaseObserved { holder: now.holder, epoch: now.epoch }).await;
            }
            Some(LeaseInput::Renewed) => {
                if let Some(holder) = now.holder {
                    handle.input(sm::Input::LeaseRenewed { holder, epoch: now.epoch }).await;
                }
            }
            None => {}
        }
    }

    /// Forgets what was fed: the next record is fed as an observation, never as a
    /// renewal (the witness restarted: its renewal marks start afresh).
    pub fn forget(&mut self) {
        self.seen = None;
    }
}
