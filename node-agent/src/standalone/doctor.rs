//! `havip-agent doctor`: the node checks ([`crate::doctor`]) for the standalone pairs of
//! this node, read from their files; the peers each pair hears on which path come from
//! the running agent's admin socket when it answers.

use super::admin::{self, AdminRequest};
use super::config::StandaloneFile;
use crate::config::AgentConfig;
use crate::doctor::{self, Heard};
use havip_crds::Finding;
use std::path::{Path, PathBuf};

/// What the checks found, and what could not be checked (sentences).
#[derive(Debug, Default)]
pub struct Report {
    /// The findings, sorted.
    pub findings: Vec<Finding>,
    /// Checks skipped, and why.
    pub skipped: Vec<String>,
}

/// Checks this node for the pairs of `config` (files or directories, as the daemon
/// reads them) as member `node`; `admin_socket` overrides a single pair's.
pub async fn run(config: &[PathBuf], node: Option<&str>, admin_socket: Option<&Path>) -> Result<Report, String> {
    let files = super::daemon::load_pair_files(config)?;
    let mut report = Report::default();
    let mut cfgs: Vec<AgentConfig> = Vec::new();
    let mut heard = Vec::new();
    for (path, f) in files {
        let admin = admin_socket.map(Path::to_path_buf).or_else(|| f.admin_socket.clone());
        let cfg = pair_config(f, node).map_err(|e| format!("{}: {e}", path.display()))?;
        heard.push(match &admin {
            Some(socket) => match peers_heard(socket, &cfg.paths).await {
                Ok(h) => Some(h),
                Err(e) => {
                    report.skipped.push(format!(
                        "pair {}: heartbeat paths not checked: the agent's admin socket {} did not answer ({e})",
                        cfg.pair,
                        socket.display()
                    ));
                    None
                }
            },
            None => {
                report.skipped.push(format!(
                    "pair {}: heartbeat paths not checked: its file names no adminSocket to ask the agent",
                    cfg.pair
                ));
                None
            }
        });
        cfgs.push(cfg);
    }
    let nl = crate::netlink::Netlink::new().map_err(|e| e.to_string())?;
    let refs: Vec<&AgentConfig> = cfgs.iter().collect();
    let facts = doctor::gather(&nl, &refs).await.map_err(|e| format!("cannot read the node's network state: {e}"))?;
    report.findings = doctor::check(&facts, &refs, &heard);
    Ok(report)
}

fn pair_config(f: StandaloneFile, node: Option<&str>) -> Result<AgentConfig, String> {
    f.into_agent_config(node).map_err(|e| e.to_string())
}

/// Which peer the running agent hears on which path, from its `status` answer.
async fn peers_heard(socket: &Path, paths: &[String]) -> Result<Heard, String> {
    let reply = admin::call(socket, &AdminRequest::Status).await.map_err(|e| e.to_string())?;
    let status = reply.status.ok_or_else(|| reply.message.clone())?;
    let mut heard = Heard::default();
    for p in status["peers"].as_array().into_iter().flatten() {
        let Some(node) = p["node"].as_str() else { continue };
        let on = p["heardOn"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x.as_str())
            .filter(|x| paths.iter().any(|p| p == x))
            .map(str::to_owned)
            .collect();
        heard.peers.insert(node.to_owned(), on);
        if let Some(skew) = p["clockSkewMs"].as_i64() {
            heard.skew_ms.insert(node.to_owned(), skew);
        }
    }
    Ok(heard)
}

/// The report as people read it: each finding with its fix, then what was skipped.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    for f in &report.findings {
        out.push_str(&format!("{} {}: {}\n  fix: {}\n", f.check, f.subject, f.detail, f.check.fix()));
    }
    for s in &report.skipped {
        out.push_str(&format!("not checked: {s}\n"));
    }
    if report.findings.is_empty() {
        out.push_str("no findings\n");
    }
    out
}
