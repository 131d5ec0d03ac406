//! The standalone admin socket: one JSON request per connection, one JSON reply.
//!
//! ```text
//! {"cmd":"failover","to":"node-b","force":false}   planned (or forced) failover
//! {"cmd":"maintenance","on":true,"force":false}    maintenance of this member
//! {"cmd":"clear"}                                  clear a flap suspension
//! {"cmd":"resume-failback"}                        resume automatic failback
//! {"cmd":"pause","on":true}                        pause policy moves
//! {"cmd":"status"}                                 this member's view
//! ```
//! `havip-agent admin` is the client.

use crate::runtime::{Handle, Reply, Request};
use crate::sm;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

/// A request on the admin socket.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum AdminRequest {
    /// Planned or forced failover.
    Failover {
        /// Target node (default: the best ready standby).
        #[serde(default)]
        to: Option<String>,
        /// Skip the readiness checks.
        #[serde(default)]
        force: bool,
    },
    /// Maintenance of this member.
    Maintenance {
        /// On or off.
        on: bool,
        /// Leave even when nobody can take the VIPs.
        #[serde(default)]
        force: bool,
    },
    /// Clear a flap suspension.
    Clear,
    /// Resume automatic failback.
    ResumeFailback,
    /// Pause or resume policy moves.
    Pause {
        /// Paused.
        on: bool,
    },
    /// This member's status.
    Status,
}

/// The reply.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct AdminReply {
    /// Success.
    pub ok: bool,
    /// A sentence.
    pub message: String,
    /// The status, for `status`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}

/// The status as JSON (a stable, readable subset of [`sm::Status`]).
pub fn status_json(st: &sm::Status, paths: &[String]) -> serde_json::Value {
    let path_name = |p: &sm::PathId| paths.get(p.0 as usize).cloned().unwrap_or_else(|| format!("path{}", p.0));
    serde_json::json!({
        "node": st.node.as_str(),
        "role": st.role.as_str(),
        "epoch": st.epoch,
        "holdsVips": st.holds_vips,
        "readyAll": st.ready_all,
        "carrierOk": st.carrier_ok,
        "gateway": match st.gateway { None => "Unknown", Some(true) => "Reachable", Some(false) => "Unreachable" },
        "probe": format!("{:?}", st.probe),
        "blocker": st.blocker.map(|b| format!("{b:?}")),
        "maintenance": st.maintenance,
        "paused": st.paused,
        "failbackPaused": st.failback_paused,
        "suspended": st.suspended,
        "alarms": st.alarms.iter().map(|a| a.as_str()).collect::<Vec<_>>(),
        "ignoredAdverts": st.ignored_adverts,
        "drainingTo": st.draining.as_ref().map(|(to, _)| to.as_str()),
        "drainingUntilMs": st.draining.as_ref().map(|(_, until)| until.0),
        "forwardingTo": st.forwarding_to.as_ref().map(|n| n.as_str()),
        "lastTransition": st.last_transition.as_ref().map(|t| serde_json::json!({
            "from": t.from.as_str(), "to": t.to.as_str(), "reason": format!("{:?}", t.reason), "epoch": t.epoch,
        })),
        "peers": st.peers.iter().map(|p| serde_json::json!({
            "node": p.node.as_str(),
            "role": p.role.map(|r| r.as_str()),
            "epoch": p.epoch,
            "heardOn": p.heard_paths.iter().map(path_name).collect::<Vec<_>>(),
            "holdsVips": p.holds_vips,
            "readyAll": p.ready_all,
        })).collect::<Vec<_>>(),
    })
}

fn next_op_id() -> u64 {
    // Operator-side ids must leave the top bit clear (the machine uses it for its own).
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
    now & !sm::AUTO_OP_BIT
}

async fn handle_one(req: AdminRequest, agent: &Handle, paths: &[String]) -> AdminReply {
    let node = |s: Option<String>| s.and_then(|n| sm::NodeId::new(n).ok());
    let (request, wait) = match req {
        AdminRequest::Status => {
            let st = agent.status();
            return AdminReply { ok: true, message: st.role.as_str().into(), status: Some(status_json(&st, paths)) };
        }
        AdminRequest::Failover { to, force } => {
            let id = next_op_id();
            let cmd = if force {
                sm::Command::ForcedFailover { id, target: node(to) }
            } else {
                sm::Command::PlannedFailover { id, target: node(to) }
            };
            (Request::Command(cmd), Duration::from_secs(5))
        }
        AdminRequest::Maintenance { on, force } => {
            (Request::Command(sm::Command::Maintenance { on, force }), Duration::from_secs(2))
        }
        AdminRequest::Clear => (Request::Command(sm::Command::ClearSuspension), Duration::from_secs(2)),
        AdminRequest::ResumeFailback => (Request::Command(sm::Command::ResumeFailback), Duration::from_secs(2)),
        AdminRequest::Pause { on } => (Request::Command(sm::Command::SetPaused(on)), Duration::from_secs(2)),
    };
    match agent.request(request, wait).await {
        Some(Reply::Done { ok, message }) => AdminReply { ok, message, status: None },
        Some(Reply::Status(_)) => AdminReply { ok: true, message: String::new(), status: None },
        None => {
            AdminReply { ok: false, message: "no answer in time: check `status` before retrying".into(), status: None }
        }
    }
}

/// Serves the admin socket at `path` until the task is dropped.
pub async fn serve(path: &Path, agent: Handle, paths: Vec<String>) -> std::io::Result<tokio::task::JoinHandle<()>> {
    if path.exists() {
        std::fs::remove_file(path)?;
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let listener = UnixListener::bind(path)?;
    Ok(tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let agent = agent.clone();
            let paths = paths.clone();
            tokio::spawn(async move {
                let (r, mut w) = stream.into_split();
                let mut line = String::new();
                let mut reader = BufReader::new(r);
                if tokio::time::timeout(Duration::from_secs(5), reader.read_line(&mut line)).await.is_err() {
                    return;
                }
                let reply = match serde_json::from_str::<AdminRequest>(line.trim()) {
                    Ok(req) => handle_one(req, &agent, &paths).await,
                    Err(e) => AdminReply { ok: false, message: format!("bad request: {e}"), status: None },
                };
                let mut out = serde_json::to_string(&reply).unwrap_or_default();
                out.push('\n');
                let _ = w.write_all(out.as_bytes()).await;
            });
        }
    }))
}

/// The client side: sends one request, returns the reply.
pub async fn call(path: &Path, req: &AdminRequest) -> std::io::Result<AdminReply> {
    let stream = UnixStream::connect(path).await?;
    let (r, mut w) = stream.into_split();
    let mut line = serde_json::to_string(req).map_err(std::io::Error::other)?;
    line.push('\n');
    w.write_all(line.as_bytes()).await?;
    let mut reply = String::new();
    BufReader::new(r).read_line(&mut reply).await?;
    serde_json::from_str(reply.trim()).map_err(std::io::Error::other)
}
