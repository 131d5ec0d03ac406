//! Adverts, status snapshots and the read-only accessors.

use super::state::{Machine, OpPhase, TgtPhase};
use crate::advert::{Advert, OpKind, OpMsg};
use crate::config::Config;
use crate::status::{OperationPhase, OperationStatus, PeerStatus, Status, Transition};
use crate::types::Role;

/// How long a data-plane result counts as current in the reported status: several of
/// the I/O layer's slow rounds (one probe every 2 s while the holder is heard).
pub const REPORTED_PROBE_FRESH_MS: u64 = 5_000;

impl Machine {
    /// The heartbeat this member sends now.
    /// This member's advert, declaring `interval_ms` (its current heartbeat interval).
    pub(super) fn make_advert(&self, interval_ms: u64) -> Advert {
        let holds_or_claims =
            self.holding || self.store.claim.is_some() || matches!(self.role, Role::Active | Role::Demoting);
        Advert {
            sender: self.cfg.local.clone(),
            role: self.role,
            epoch: if holds_or_claims { self.held_epoch } else { self.epoch },
            priority: self.my_priority,
            holds_vips: self.holding,
            config_revision: self.cfg.config_revision,
            protocol_major: self.cfg.protocol.major,
            protocol_minor: self.cfg.protocol.minor,
            ready_all: self.not_ready().is_none(),
            maintenance: self.maintenance,
            carrier_ok: self.carrier_ok(),
            gateway: self.gateway,
            suspended: self.flap.suspended,
            failback_paused: self.failback_paused,
            draining: self.drain_advertised(),
            op: self.current_op_msg(),
            interval_ms: u32::try_from(interval_ms).unwrap_or(u32::MAX),
        }
    }

    fn current_op_msg(&self) -> Option<OpMsg> {
        if let Some(op) = &self.ops.op {
            let kind = match op.phase {
                OpPhase::Preparing => OpKind::Prepare { to: op.to.clone() },
                OpPhase::Committed { epoch, .. } => OpKind::Commit { to: op.to.clone(), epoch },
            };
            return Some(OpMsg { id: op.id, kind });
        }
        if let Some(t) = &self.ops.tgt {
            let kind = match t.phase {
                TgtPhase::Acked => OpKind::PrepareAck,
                TgtPhase::Accepted { .. } => OpKind::Confirm,
            };
            return Some(OpMsg { id: t.id, kind });
        }
        self.ops.sticky.as_ref().map(|(m, _)| m.clone())
    }

    /// A snapshot for reporting, as of the last `step`.
    pub fn status(&self) -> Status {
        let now = self.last_now;
        let peers = self
            .peers
            .iter()
            .map(|p| {
                let heard_paths = self
                    .cfg
                    .paths
                    .iter()
                    .zip(&p.heard_until)
                    .filter(|(_, u)| u.is_some_and(|u| now < u))
                    .map(|(path, _)| *path)
                    .collect();
                let a = p.advert.as_ref();
                PeerStatus {
                    node: p.node.clone(),
                    priority: p.priority,
                    heard_paths,
                    last_heard: p.last_heard.iter().flatten().max().copied(),
                    role: a.map(|a| a.role),
                    epoch: a.map(|a| a.epoch),
                    holds_vips: a.is_some_and(|a| a.holds_vips),
                    ready_all: a.is_some_and(|a| a.ready_all),
                    maintenance: a.is_some_and(|a| a.maintenance),
                    suspended: a.is_some_and(|a| a.suspended),
                    protocol: a.map(|a| (a.protocol_major, a.protocol_minor)),
                    config_revision: a.map(|a| a.config_revision),
                }
            })
            .collect();
        let operation = if let Some(op) = &self.ops.op {
            Some(OperationStatus {
                id: op.id,
                peer: op.to.clone(),
                phase: match op.phase {
                    OpPhase::Preparing => OperationPhase::Preparing,
                    OpPhase::Committed { .. } => OperationPhase::Committed,
                },
            })
        } else {
            self.ops.tgt.as_ref().map(|t| OperationStatus {
                id: t.id,
                peer: t.from.clone(),
                phase: match t.phase {
                    TgtPhase::Acked => OperationPhase::Acked,
                    TgtPhase::Accepted { .. } => OperationPhase::Accepted,
                },
            })
        };
        let holds_or_claims =
            self.holding || self.store.claim.is_some() || matches!(self.role, Role::Active | Role::Demoting);
        Status {
            node: self.cfg.local.clone(),
            role: self.role,
            epoch: self.epoch,
            held_epoch: holds_or_claims.then_some(self.held_epoch),
            holds_vips: self.holding,
            priority: self.my_priority,
            maintenance: self.maintenance,
            paused: self.paused,
            failback_paused: self.failback_paused,
            suspended: self.flap.suspended,
            quarantined_until: self.flap.quarantined_until.filter(|u| now < *u),
            hold_down_until: self.last_vip_change.map(|t| t.plus(self.t().hold_down_ms)).filter(|u| now < *u),
            boot_hold_until: self.boot_hold_until().filter(|u| now < *u),
            ready_all: self.ready_all(),
            not_ready: self.not_ready(),
            carrier_ok: self.carrier_ok(),
            carrier_settled_at: self.carrier_settled_at().filter(|t| now < *t),
            gateway: self.gateway,
            // While the holder is heard its VIPs are probed only now and then (the I/O
            // layer's slow round): the reported verdict counts an answer as current for
            // longer than a takeover does, so that the status does not flap to Pending.
            probe: self.probe_state_within(now, self.t().probe_fresh_ms.max(REPORTED_PROBE_FRESH_MS)),
            blocker: self.current_blocker(now),
            peers,
            alarms: self.alarms.iter().copied().collect(),
            conflicts: self.conflict_macs.iter().map(|(v, m)| (v.clone(), *m)).collect(),
            lease: self.store.lease.clone(),
            lease_stale: self.store.lease_stale,
            operation,
            last_transition: self.last_transition.clone(),
            draining: self.draining.drain.as_ref().filter(|d| d.started).map(|d| (d.to.clone(), d.until)),
            forwarding_to: self.draining.forwarding.clone(),
            config_valid: self.cfg_error.is_none(),
            ignored_adverts: self.ignored_adverts,
            local_vips: self
                .local_vips
                .as_ref()
                .map(|s| s.iter().filter(|v| self.cfg.vips.iter().any(|c| &c.id == *v)).cloned().collect()),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Current role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Whether this member holds the VIPs (added or adopted, not removed).
    pub fn holds_vips(&self) -> bool {
        self.holding
    }

    /// Highest pair epoch known (persisted; never goes backwards).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Epoch under which the VIPs are held or claimed (`None` when neither).
    pub fn held_epoch(&self) -> Option<u64> {
        let holds_or_claims =
            self.holding || self.store.claim.is_some() || matches!(self.role, Role::Active | Role::Demoting);
        holds_or_claims.then_some(self.held_epoch)
    }

    /// Routed VIPs: whether this member hands its node's speaker a **backup path** of the
    /// VIPs (where the pair asks for them): a worse-preference route that lets routers
    /// know the next holder before it is needed. Only a ready standby does — in role
    /// Standby, holding and claiming nothing, its listeners up, not cut off (carrier,
    /// gateway) and its carrier settled: the member peers would hand the VIPs to. Every
    /// other member (holder, claimant, demoting, starting, fenced, in maintenance,
    /// unpaired) withdraws it at the step that makes it one, before any action of that
    /// step is executed; the runtime applies it after each step. A backup path never
    /// makes a member answer for a VIP: traffic that follows it is dropped there.
    pub fn advertises_backup(&self) -> bool {
        self.role == Role::Standby && !self.holding && self.store.claim.is_none() && self.not_ready().is_none()
    }

    /// Last role change, if any.
    pub fn last_transition(&self) -> Option<&Transition> {
        self.last_transition.as_ref()
    }
}
