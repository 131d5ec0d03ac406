//! Routing daemons in a network namespace: an FRR instance (zebra, bgpd, bfdd from
//! Debian's `frr`) or a BIRD 2 instance, each with its configuration, sockets and logs
//! in a directory of its own, its processes stopped on drop, and a way to ask it
//! (`vtysh --vty_socket`, `birdc -s`).
//!
//! The daemons run in the foreground under [`ManagedProcess`] (never `-d`): a test
//! that dies takes them with it. FRR drops its privileges to the `frr` user, so its
//! directory is owned by `frr`; the Debian package creates the user.

use super::netns::spawn_in;
use super::process::ManagedProcess;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Where FRR's per-instance files live (tmpfs, next to the lab's lock files).
const ROUTING_DIR: &str = "/run/havip-e2e/routing";
/// Debian's FRR daemons.
const FRR_LIB: &str = "/usr/lib/frr";

/// Errors of the routing daemons.
#[derive(Debug, thiserror::Error)]
pub enum RoutingError {
    /// A file or directory could not be written.
    #[error("failed to {op}: {source}")]
    Io {
        /// What was done.
        op: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The daemon is not installed.
    #[error("{0} is not installed (hack/prereqs.sh installs frr and bird2)")]
    Missing(String),
    /// A daemon could not be started.
    #[error("failed to start {what}: {reason}")]
    Start {
        /// Which daemon.
        what: String,
        /// Why.
        reason: String,
    },
    /// A query failed.
    #[error("`{cmd}` failed: {reason}")]
    Query {
        /// The command.
        cmd: String,
        /// Why.
        reason: String,
    },
    /// A condition was not met in time.
    #[error("timed out after {timeout:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        timeout: Duration,
    },
}

type Result<T> = std::result::Result<T, RoutingError>;

fn io(op: impl Into<String>) -> impl FnOnce(std::io::Error) -> RoutingError {
    let op = op.into();
    move |source| RoutingError::Io { op, source }
}

fn instance_dir(name: &str) -> Result<PathBuf> {
    let dir = Path::new(ROUTING_DIR).join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(io(format!("remove {}", dir.display())))?;
    }
    std::fs::create_dir_all(&dir).map_err(io(format!("create {}", dir.display())))?;
    Ok(dir)
}

/// The next hops of the selected route of `prefix` in FRR's answer to `show ip route
/// <prefix> json` (`show ipv6 route …`), as addresses.
pub fn selected_next_hops(v: &serde_json::Value, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    for route in v.get(prefix).and_then(|r| r.as_array()).into_iter().flatten() {
        if route.get("selected").and_then(|s| s.as_bool()) != Some(true) {
            continue;
        }
        for nh in route.get("nexthops").and_then(|n| n.as_array()).into_iter().flatten() {
            if let Some(ip) = nh.get("ip").and_then(|i| i.as_str()) {
                out.push(ip.to_owned());
            }
        }
    }
    out
}

/// Whether FRR's answer to `show bgp neighbors <peer> json` says the session is Established.
pub fn session_established(v: &serde_json::Value, peer: &str) -> bool {
    v.get(peer).and_then(|n| n.get("bgpState")).and_then(|s| s.as_str()) == Some("Established")
}

/// Polls `cond` every 100 ms until it holds.
pub fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Result<Duration> {
    let start = Instant::now();
    loop {
        if cond() {
            return Ok(start.elapsed());
        }
        if start.elapsed() > timeout {
            return Err(RoutingError::Timeout { what: what.to_owned(), timeout });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A BGP path as [`Frr::bgp_path_attrs`] reads it: (peer, best, AS-path length, MED).
pub type PathAttrs = (String, bool, u64, Option<u64>);

/// One FRR instance (zebra, bgpd, bfdd) in a namespace.
pub struct Frr {
    name: String,
    ns: String,
    dir: PathBuf,
    /// zebra, bgpd, bfdd — in start order; stopped in reverse.
    daemons: Vec<(String, ManagedProcess)>,
}

impl Frr {
    /// Whether Debian's FRR is installed here.
    pub fn available() -> bool {
        Path::new(FRR_LIB).join("bgpd").exists() && which("vtysh")
    }

    /// Writes `config` (an integrated `frr.conf`) and starts zebra, bgpd and bfdd in `ns`.
    /// `name` must be unique among running instances (it names the directory).
    pub fn start(ns: &str, name: &str, config: &str) -> Result<Self> {
        if !Self::available() {
            return Err(RoutingError::Missing("FRR (Debian package frr)".into()));
        }
        let dir = instance_dir(name)?;
        let conf = dir.join("frr.conf");
        std::fs::write(&conf, config).map_err(io(format!("write {}", conf.display())))?;
        let status = Command::new("chown").args(["-R", "frr:frr"]).arg(&dir).status().map_err(io("run chown"))?;
        if !status.success() {
            return Err(RoutingError::Start { what: format!("FRR {name}"), reason: "chown frr:frr failed".into() });
        }
        let mut frr = Frr { name: name.to_owned(), ns: ns.to_owned(), dir, daemons: Vec::new() };
        for daemon in ["zebra", "bgpd", "bfdd"] {
            frr.start_daemon(daemon)?;
            if daemon == "zebra" {
                // The others connect to zebra's socket at start.
                let api = frr.dir.join("zserv.api");
                wait_for(&format!("{name}: zebra's socket"), Duration::from_secs(10), || api.exists())?;
            }
        }
        wait_for(&format!("{name}: bgpd answers"), Duration::from_secs(10), || frr.vtysh("show bgp summary").is_ok())?;
        Ok(frr)
    }

    fn start_daemon(&mut self, daemon: &str) -> Result<()> {
        let d = |p: &str| self.dir.join(p).display().to_string();
        let mut args = vec![
            "-f".to_owned(),
            d("frr.conf"),
            "-i".to_owned(),
            d(&format!("{daemon}.pid")),
            "--vty_socket".to_owned(),
            self.dir.display().to_string(),
            "-z".to_owned(),
            d("zserv.api"),
            "--log".to_owned(),
            format!("file:{}", d(&format!("{daemon}.log"))),
        ];
        if daemon == "bgpd" {
            args.extend(["-p".to_owned(), "179".to_owned()]);
        }
        let program = Path::new(FRR_LIB).join(daemon);
        let log = self.dir.join(format!("{daemon}.out"));
        let p = spawn_in(&self.ns, &format!("{}-{daemon}", self.name), &program, &args, &[], &log)
            .map_err(|e| RoutingError::Start { what: format!("{} {daemon}", self.name), reason: e.to_string() })?;
        self.daemons.push((daemon.to_owned(), p));
        Ok(())
    }

    /// The daemons' process ids (for a lab that records what to kill if it dies).
    pub fn pids(&self) -> Vec<u32> {
        self.daemons.iter().filter_map(|(_, p)| p.pid()).collect()
    }

    /// The instance's directory (its configuration, logs and vty sockets).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Runs one `vtysh` command against this instance; its output.
    pub fn vtysh(&self, cmd: &str) -> Result<String> {
        let out = Command::new("vtysh")
            .arg("--vty_socket")
            .arg(&self.dir)
            .args(["-c", cmd])
            .output()
            .map_err(io("run vtysh"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() || text.contains("failed to connect to any daemons") {
            return Err(RoutingError::Query {
                cmd: format!("vtysh -c '{cmd}' ({})", self.name),
                reason: format!("{}{}", text, String::from_utf8_lossy(&out.stderr)),
            });
        }
        Ok(text)
    }

    /// `vtysh` with a JSON answer.
    pub fn vtysh_json(&self, cmd: &str) -> Result<serde_json::Value> {
        let text = self.vtysh(cmd)?;
        serde_json::from_str(&text)
            .map_err(|e| RoutingError::Query { cmd: format!("vtysh -c '{cmd}'"), reason: format!("{e}: {text}") })
    }

    /// The next hops of the selected (best) route of `prefix` in the RIB (`show ip route
    /// <prefix> json` / `show ipv6 route …`), as addresses; empty when there is none.
    pub fn best_next_hops(&self, prefix: &str) -> Result<Vec<String>> {
        let family = if prefix.contains(':') { "ipv6" } else { "ip" };
        let v = self.vtysh_json(&format!("show {family} route {prefix} json"))?;
        Ok(selected_next_hops(&v, prefix))
    }

    /// The BGP paths of `prefix` this instance knows (`show bgp … json`): each as
    /// (peer address, best).
    pub fn bgp_paths(&self, prefix: &str) -> Result<Vec<(String, bool)>> {
        Ok(self.bgp_path_attrs(prefix)?.into_iter().map(|(peer, best, _, _)| (peer, best)).collect())
    }

    /// The paths of `prefix` in the BGP table: (peer, best, AS-path length, MED).
    pub fn bgp_path_attrs(&self, prefix: &str) -> Result<Vec<PathAttrs>> {
        let family = if prefix.contains(':') { "ipv6" } else { "ipv4" };
        let v = self.vtysh_json(&format!("show bgp {family} unicast {prefix} json"))?;
        let mut out = Vec::new();
        for p in v.get("paths").and_then(|p| p.as_array()).into_iter().flatten() {
            let peer = p.pointer("/peer/peerId").and_then(|x| x.as_str()).unwrap_or_default().to_owned();
            let best = p.pointer("/bestpath/overall").and_then(|x| x.as_bool()).unwrap_or(false);
            let len = p.pointer("/aspath/length").and_then(serde_json::Value::as_u64).unwrap_or(0);
            let med = p.get("metric").and_then(serde_json::Value::as_u64);
            out.push((peer, best, len, med));
        }
        Ok(out)
    }

    /// Applies configuration lines (`configure terminal`, then each line in order).
    pub fn configure(&self, lines: &[&str]) -> Result<()> {
        let mut cmd = Command::new("vtysh");
        cmd.arg("--vty_socket").arg(&self.dir).args(["-c", "configure terminal"]);
        for l in lines {
            cmd.args(["-c", l]);
        }
        let out = cmd.output().map_err(io("run vtysh"))?;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        if !out.status.success() || text.contains('%') {
            return Err(RoutingError::Query {
                cmd: format!("vtysh configure {lines:?} ({})", self.name),
                reason: text,
            });
        }
        Ok(())
    }

    /// Whether the BGP session with `peer` is Established.
    pub fn established(&self, peer: &str) -> bool {
        self.vtysh_json(&format!("show bgp neighbors {peer} json")).is_ok_and(|v| session_established(&v, peer))
    }

    /// Stops bgpd alone (SIGKILL: a crash, as a graceful restart must survive) and starts
    /// it again.
    pub fn restart_bgpd(&mut self) -> Result<()> {
        self.kill_bgpd();
        self.start_bgpd()
    }

    /// Starts bgpd (after [`Frr::kill_bgpd`]) and waits until it answers.
    pub fn start_bgpd(&mut self) -> Result<()> {
        self.start_daemon("bgpd")?;
        wait_for(&format!("{}: bgpd answers again", self.name), Duration::from_secs(10), || {
            self.vtysh("show bgp summary").is_ok()
        })?;
        Ok(())
    }

    /// SIGKILLs bgpd alone (a crash; its vty socket is left behind, refusing).
    pub fn kill_bgpd(&mut self) {
        if let Some(i) = self.daemons.iter().position(|(d, _)| d == "bgpd") {
            let (_, mut p) = self.daemons.remove(i);
            p.kill_now();
        }
    }

    /// The last lines of every daemon's log.
    pub fn logs_tail(&self, lines: usize) -> String {
        let mut out = String::new();
        for (d, _) in &self.daemons {
            let log = self.dir.join(format!("{d}.log"));
            out.push_str(&format!("--- {} {d}\n{}\n", self.name, super::process::tail(&log, lines)));
        }
        out
    }
}

impl Drop for Frr {
    fn drop(&mut self) {
        while let Some((_, mut p)) = self.daemons.pop() {
            p.stop(Duration::from_secs(2));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One BIRD 2 instance in a namespace.
pub struct Bird {
    dir: PathBuf,
    process: Option<ManagedProcess>,
}

impl Bird {
    /// Whether BIRD 2 is installed here.
    pub fn available() -> bool {
        which("bird") && which("birdc")
    }

    /// Writes `config` and starts `bird -f` in `ns`.
    pub fn start(ns: &str, name: &str, config: &str) -> Result<Self> {
        if !Self::available() {
            return Err(RoutingError::Missing("BIRD (Debian package bird2)".into()));
        }
        let dir = instance_dir(name)?;
        let conf = dir.join("bird.conf");
        std::fs::write(&conf, config).map_err(io(format!("write {}", conf.display())))?;
        let ctl = dir.join("bird.ctl");
        let args = vec![
            "-f".to_owned(),
            "-c".to_owned(),
            conf.display().to_string(),
            "-s".to_owned(),
            ctl.display().to_string(),
        ];
        let log = dir.join("bird.out");
        let p = spawn_in(ns, name, Path::new("bird"), &args, &[], &log)
            .map_err(|e| RoutingError::Start { what: format!("BIRD {name}"), reason: e.to_string() })?;
        let bird = Bird { dir, process: Some(p) };
        wait_for(&format!("{name}: BIRD answers"), Duration::from_secs(10), || bird.birdc("show status").is_ok())?;
        Ok(bird)
    }

    /// The instance's directory (its configuration and `bird.ctl`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Runs one `birdc` command; its output.
    pub fn birdc(&self, cmd: &str) -> Result<String> {
        let out = Command::new("birdc")
            .arg("-s")
            .arg(self.dir.join("bird.ctl"))
            .args(cmd.split_whitespace())
            .output()
            .map_err(io("run birdc"))?;
        if !out.status.success() {
            return Err(RoutingError::Query {
                cmd: format!("birdc {cmd}"),
                reason: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The output BIRD printed to its console.
    pub fn log_tail(&self, lines: usize) -> String {
        super::process::tail(&self.dir.join("bird.out"), lines)
    }
}

impl Drop for Bird {
    fn drop(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.stop(Duration::from_secs(2));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn which(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(program).is_file()))
}
