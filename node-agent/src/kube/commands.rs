//! The operator's imperative `status.command`, handed to the machine (when is the plan's
//! rule, [`super::plan`]). Which member executes a failover is the machine's rule
//! ([`sm::Command::PairFailover`]), not decided here.

use super::report::KubeReporter;
use crate::runtime::Handle;
use crate::sm;
use havip_crds::{OperationKind, PairCommand};

/// The machine's numeric id for a command's request id (top bit clear, as the machine
/// wants operator ids). The heartbeat carries this number to the peers; only this
/// member's reporter maps the machine's result back to the request id.
pub fn op_id(id: &str) -> u64 {
    havip_crds::revision::fnv1a(id.as_bytes()) & !sm::AUTO_OP_BIT
}

/// Hands one operator command to the machine. Failovers are answered by the machine's
/// result (on the member that executes them; the others stay silent); the other
/// commands, which every member executes, are answered once accepted.
pub(super) async fn dispatch(cmd: &PairCommand, handle: &Handle, reporter: &KubeReporter) {
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
