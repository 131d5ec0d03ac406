//! What the HAPair asks of this member's machine besides its configuration: the
//! declarative maintenance flag and `spec.paused`, and the operator's imperative
//! `status.command` — each handed to the machine once per change. Which member executes
//! a failover is the machine's rule ([`sm::Command::PairFailover`]), not decided here.

use super::report::KubeReporter;
use crate::runtime::Handle;
use crate::sm;
use havip_crds::{HAPair, OperationKind, PairCommand};

/// The machine's numeric id for a command's request id (top bit clear, as the machine
/// wants operator ids). The heartbeat carries this number to the peers; only this
/// member's reporter maps the machine's result back to the request id.
pub fn op_id(id: &str) -> u64 {
    havip_crds::revision::fnv1a(id.as_bytes()) & !sm::AUTO_OP_BIT
}

/// What of the HAPair one pair's machine was last told.
#[derive(Default)]
pub(super) struct PairInputs {
    maintenance: Option<bool>,
    paused: Option<bool>,
    command_seen: Option<String>,
}

impl PairInputs {
    /// Feeds maintenance, pause and a new command of `pair` to the machine behind `handle`.
    pub(super) async fn feed(&mut self, pair: &HAPair, handle: &Handle, reporter: &KubeReporter) {
        let node = reporter.node();
        let maint = pair.spec.members.iter().find(|m| m.node == node).map(|m| m.maintenance).unwrap_or(false);
        if self.maintenance != Some(maint) {
            self.maintenance = Some(maint);
            handle.input(sm::Input::Command(sm::Command::Maintenance { on: maint, force: false })).await;
        }
        if self.paused != Some(pair.spec.paused) {
            self.paused = Some(pair.spec.paused);
            handle.input(sm::Input::Command(sm::Command::SetPaused(pair.spec.paused))).await;
        }
        if let Some(cmd) = pair.status.as_ref().and_then(|s| s.command.as_ref())
            && self.command_seen.as_deref() != Some(cmd.id.as_str())
        {
            self.command_seen = Some(cmd.id.clone());
            dispatch(cmd, handle, reporter).await;
        }
    }
}

/// Hands one operator command to the machine. Failovers are answered by the machine's
/// result (on the member that executes them; the others stay silent); the other
/// commands, which every member executes, are answered once accepted.
async fn dispatch(cmd: &PairCommand, handle: &Handle, reporter: &KubeReporter) {
    let target = cmd.target.as_ref().and_then(|t| sm::NodeId::new(t.clone()).ok());
    let machine_cmd = match &cmd.kind {
        OperationKind::PlannedFailover | OperationKind::ForcedFailover => {
            let op = op_id(&cmd.id);
            reporter.expect_result(op, cmd.id.clone(), cmd.kind.clone());
            sm::Command::PairFailover { id: op, target, forced: cmd.kind == OperationKind::ForcedFailover }
        }
        OperationKind::ClearSuspension => sm::Command::ClearSuspension,
        OperationKind::ResumeFailback => sm::Command::ResumeFailback,
        OperationKind::RotateKey | OperationKind::Other(_) => {
            tracing::warn!(id = %cmd.id, kind = %cmd.kind, "unknown command from the operator");
            let message = format!("unknown command {}", cmd.kind);
            reporter.answer(cmd.id.clone(), cmd.kind.clone(), false, message, &handle.status());
            return;
        }
    };
    tracing::info!(id = %cmd.id, kind = %cmd.kind, target = ?cmd.target, "command from the operator");
    handle.input(sm::Input::Command(machine_cmd)).await;
    if !cmd.kind.is_failover() {
        reporter.answer(cmd.id.clone(), cmd.kind.clone(), true, "accepted".to_owned(), &handle.status());
    }
}
