//! The operator's decisions as pure functions of what it observed: member addresses
//! and the configuration revision, phase and conditions, the pair's last transition,
//! imperative requests (annotation → refusal or command), command answers and key
//! rotation. No I/O and no clock reads: `now` is an input. The controller
//! ([`crate::pair::hapair`]) gathers the inputs from its caches and applies the outputs.
//!
//! The observation ([`Observed`] and its parts) and the constants are in `observed`; the decisions
//! are in `spec`, `assess`, `status`, `requests`, `keys`, `fip` and `events` (their
//! items are re-exported here), and [`plan()`] composes them into every write of one
//! HAPair reconcile.

mod addresses;
mod assess;
mod events;
mod fip;
mod keys;
mod observed;
mod plan;
mod requests;
mod spec;
mod status;

pub use addresses::{AddressIndex, ApiServerSource, Reserved};
pub use assess::{Assessment, Cause, assess, is_reporting, next_settle, standby_problem};
pub use events::{
    Announcement, Ev, ROLE_CHANGE_GRACE, command_event, invalid_spec_event, is_warning_transition, member_lost_event,
    member_role_events, operation_event, phase_event, role_change_announcement, route_events,
};
pub use fip::{FipVerdict, Verdict, fip_conditions, fip_conditions_current, fip_verdict, orphan_verdict};
pub use keys::{KeyAction, key_action, key_progress, random_key_hex};
pub use observed::{
    COMMAND_TIMEOUT, HANDOVER_SETTLE, INVALID_REQUEUE, KeyInfo, LeaseInfo, NOT_REPORTING_AFTER, NodeInfo, Observed,
    Refusal, VipInfo, member_status,
};
pub use plan::{
    KeyChange, LabelPatch, LabelTarget, LeaseSeed, MEMBER_REMOVAL, PairInputs, PairMemo, Plan, SharedSecret,
    fip_refusals, fip_status_current, key_after, new_key, plan, spec_member_set,
};
pub use requests::{Decision, command_answer, command_deadline, decide, next_request};
pub use spec::{
    is_dns1123_subdomain, lease_name, member_addresses, member_label_patch, member_labels, member_nodes, member_patch,
    pair_of_lease, published_addresses, refusal, revision, secret_name, validate_spec, virtual_mac_conflict,
};
pub use status::{
    condition, conditions, departed_members, last_transition, next_staleness, operator_status, without_timestamps,
};

#[cfg(test)]
mod plan_tests;
#[cfg(test)]
mod tests;
