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
//!
//! The socket is created with mode `0600` (owner only, whatever the process umask: it is
//! bound under a temporary name, given its mode, then renamed into place, so there is no
//! moment at which another user can connect), its directory, when the agent creates it,
//! with `0700`. A request is at most [`MAX_REQUEST`] bytes and must arrive within 5 s; at
//! most [`MAX_CONNECTIONS`] are served at once (further ones wait for a slot). The client
//! reads at most [`MAX_REPLY`] bytes of reply.

use crate::runtime::{Handle, Reply, Request};
use crate::sm;
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

/// The largest request accepted, newline included (a request is a few dozen bytes).
pub const MAX_REQUEST: usize = 4096;
/// The largest reply the client reads (a status with eight members is a few KiB).
pub const MAX_REPLY: usize = 1 << 20;
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 8;
/// The socket's mode: read and write for its owner only.
pub const SOCKET_MODE: u32 = 0o600;
/// How long a client has to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

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

/// The status as JSON (a stable, readable subset of [`sm::Status`]), with each peer's
/// clock skew (`skew`, ms, from [`Handle::clock_skew`]).
pub fn status_json(
    st: &sm::Status,
    paths: &[String],
    skew: &std::collections::BTreeMap<String, i64>,
) -> serde_json::Value {
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
            "clockSkewMs": skew.get(p.node.as_str()),
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
            return AdminReply {
                ok: true,
                message: st.role.as_str().into(),
                status: Some(status_json(&st, paths, &agent.clock_skew())),
            };
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
    let path = path.to_owned();
    let paths = Arc::new(paths);
    serve_with(&path, move |req| {
        let agent = agent.clone();
        let paths = paths.clone();
        async move { handle_one(req, &agent, &paths).await }
    })
}

/// Binds `path` with mode [`SOCKET_MODE`] from the start: bound under a temporary name
/// in the same directory, given its mode, then renamed into place (a rename keeps the
/// socket; nobody can reach it under its final name before it has its mode).
fn bind_private(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.exists()
    {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp)?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(SOCKET_MODE))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(listener)
}

/// Reads one request line of at most [`MAX_REQUEST`] bytes.
async fn read_request(stream: &mut BufReader<tokio::net::unix::OwnedReadHalf>) -> Result<String, String> {
    let mut line = String::new();
    let mut limited = (&mut *stream).take(MAX_REQUEST as u64);
    match tokio::time::timeout(REQUEST_TIMEOUT, limited.read_line(&mut line)).await {
        Err(_) => Err(format!("no complete request within {REQUEST_TIMEOUT:?}")),
        Ok(Err(e)) => Err(format!("bad request: {e}")),
        Ok(Ok(_)) if !line.ends_with('\n') && line.len() >= MAX_REQUEST => {
            Err(format!("request too long (more than {MAX_REQUEST} bytes)"))
        }
        Ok(Ok(_)) => Ok(line),
    }
}

/// Serves the admin socket at `path` with `handler` until the task is dropped: one
/// request per connection, at most [`MAX_CONNECTIONS`] at once.
pub fn serve_with<F, Fut>(path: &Path, handler: F) -> std::io::Result<tokio::task::JoinHandle<()>>
where
    F: Fn(AdminRequest) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = AdminReply> + Send + 'static,
{
    let listener = bind_private(path)?;
    let handler = Arc::new(handler);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    Ok(tokio::spawn(async move {
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else { return };
            let Ok((stream, _)) = listener.accept().await else { continue };
            let handler = handler.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let (r, mut w) = stream.into_split();
                let mut reader = BufReader::new(r);
                let reply = match read_request(&mut reader).await {
                    Ok(line) => match serde_json::from_str::<AdminRequest>(line.trim()) {
                        Ok(req) => handler(req).await,
                        Err(e) => AdminReply { ok: false, message: format!("bad request: {e}"), status: None },
                    },
                    Err(message) => {
                        tracing::warn!(error = %message, "admin socket: request refused");
                        AdminReply { ok: false, message, status: None }
                    }
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
    BufReader::new(r).take(MAX_REPLY as u64).read_line(&mut reply).await?;
    serde_json::from_str(reply.trim()).map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::{AdminReply, AdminRequest, call, serve_with};
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    use std::path::Path;
    use std::time::Duration;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    use tokio::net::UnixStream;

    fn serve_status(path: &Path) -> tokio::task::JoinHandle<()> {
        serve_with(path, |_req| async { AdminReply { ok: true, message: "ok".into(), status: None } }).expect("serve")
    }

    #[tokio::test]
    async fn the_socket_is_owner_only_whatever_the_umask() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A permissive umask, as a unit or shell may leave it.
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o000));
        let path = dir.path().join("run/havip/web.sock");
        let task = serve_status(&path);
        nix::sys::stat::umask(old);
        let meta = std::fs::metadata(&path).expect("socket exists");
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "socket mode");
        let dmeta = std::fs::metadata(path.parent().expect("dir")).expect("dir");
        assert_eq!(dmeta.permissions().mode() & 0o077, 0, "the directory the agent created is private");
        let reply = call(&path, &AdminRequest::Status).await.expect("call");
        assert!(reply.ok);
        task.abort();
    }

    #[tokio::test]
    async fn an_endless_request_is_cut_off_at_the_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("web.sock");
        let task = serve_status(&path);
        let stream = UnixStream::connect(&path).await.expect("connect");
        let (r, mut w) = stream.into_split();
        // 64 MiB without a newline: the server stops reading after MAX_REQUEST bytes and
        // answers; it never buffers the rest.
        let writer = tokio::spawn(async move {
            let chunk = vec![b'a'; 1 << 16];
            let mut sent = 0usize;
            while sent < 64 << 20 {
                if w.write_all(&chunk).await.is_err() {
                    break;
                }
                sent += chunk.len();
            }
            sent
        });
        let mut reply = String::new();
        let n = tokio::time::timeout(Duration::from_secs(3), BufReader::new(r).read_line(&mut reply))
            .await
            .expect("an answer well before the request timeout")
            .expect("read");
        assert!(n > 0 && reply.contains("request too long"), "{reply}");
        let sent = tokio::time::timeout(Duration::from_secs(5), writer).await.expect("the writer stops").expect("join");
        assert!(sent < 64 << 20, "the server read all {sent} bytes");
        task.abort();
    }
}
