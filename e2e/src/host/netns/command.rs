//! Running `ip` and `nft`: in the root namespace, in a namespace with `ip -n`, and to
//! completion inside a namespace with `ip netns exec`; and whether this process may.

use super::error::{NetnsError, Result};
use std::io::Write;
use std::process::{Command, Stdio};

pub(super) const IP: &str = "ip";
pub(super) const NFT: &str = "nft";

/// Checks that this process may create namespaces; tests call it first.
///
/// `Err` carries the reason; [`skip_unless_root`] prints the standard skip line.
pub fn require_root() -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err(format!("running as uid {}, not root", nix::unistd::geteuid()));
    }
    for tool in [IP, NFT] {
        match Command::new(tool).arg("-V").stdout(Stdio::null()).stderr(Stdio::null()).status() {
            Ok(_) => {}
            Err(e) => return Err(format!("`{tool}` cannot be run: {e}")),
        }
    }
    Ok(())
}

/// For tests: `true` when root; otherwise prints
/// `SKIPPED: needs root (CAP_NET_ADMIN) …` and returns `false`.
pub fn skip_unless_root(test: &str) -> bool {
    match require_root() {
        Ok(()) => true,
        Err(why) => {
            // Straight to the stderr handle: the test harness captures `println!`.
            let line = format!("SKIPPED: needs root (CAP_NET_ADMIN) to create network namespaces: {test}: {why}\n");
            let _ = std::io::stderr().write_all(line.as_bytes());
            false
        }
    }
}

fn cmdline(program: &str, args: &[&str]) -> String {
    std::iter::once(program).chain(args.iter().copied()).collect::<Vec<_>>().join(" ")
}

/// Runs a command, returning its standard output; fails on a non-zero exit.
pub(super) fn run(program: &str, args: &[&str]) -> Result<String> {
    run_stdin(program, args, None)
}

pub(super) fn run_stdin(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String> {
    let cmd = cmdline(program, args);
    tracing::trace!(%cmd, "running");
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| NetnsError::Spawn { cmd: cmd.clone(), source })?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes()).map_err(|source| NetnsError::Spawn { cmd: cmd.clone(), source })?;
    }
    let out = child.wait_with_output().map_err(|source| NetnsError::Spawn { cmd: cmd.clone(), source })?;
    if !out.status.success() {
        return Err(NetnsError::Command {
            cmd,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip -n <ns> args…`.
pub(super) fn ip(ns: &str, args: &[&str]) -> Result<String> {
    let mut all = vec!["-n", ns];
    all.extend_from_slice(args);
    run(IP, &all)
}

pub(super) fn ip_json(ns: &str, args: &[&str]) -> Result<serde_json::Value> {
    let mut all = vec!["-j"];
    all.extend_from_slice(args);
    let out = ip(ns, &all)?;
    if out.trim().is_empty() {
        return Ok(serde_json::Value::Array(Vec::new()));
    }
    serde_json::from_str(&out)
        .map_err(|e| NetnsError::Parse { cmd: format!("ip -n {ns} {}", all.join(" ")), reason: e.to_string() })
}

/// `ip netns exec <ns> program args…`.
pub(super) fn exec_in(ns: &str, program: &str, args: &[&str], stdin: Option<&str>) -> Result<String> {
    let mut all = vec!["netns", "exec", ns, program];
    all.extend_from_slice(args);
    run_stdin(IP, &all, stdin)
}

/// Runs a command inside `ns` to completion (`ip netns exec`), returning stdout.
pub fn exec(ns: &str, program: &str, args: &[&str]) -> Result<String> {
    exec_in(ns, program, args, None)
}

/// The pids of processes in `ns` (`ip netns pids`).
pub fn ns_pids(ns: &str) -> Result<Vec<i32>> {
    let out = run(IP, &["netns", "pids", ns])?;
    Ok(out.lines().filter_map(|l| l.trim().parse().ok()).collect())
}
