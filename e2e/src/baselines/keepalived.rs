//! keepalived (Debian's 2.2.7) run inside topology nodes: the side-by-side
//! baseline for the failover benchmark.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use havip_e2e::keepalived::{Keepalived, KeepalivedConfig};
//! use havip_e2e::netns::Topology;
//! let topo = Topology::builder().nodes(2).build()?;
//! let k0 = Keepalived::start(&topo, 0, KeepalivedConfig::v3_fast())?; // priority 200
//! let k1 = Keepalived::start(&topo, 1, KeepalivedConfig::v3_fast())?; // priority 190
//! k0.wait_holds_vip(true, std::time::Duration::from_secs(3))?;
//! # Ok(()) }
//! ```
//!
//! Each instance runs in the foreground (`-n -l -D -G --vrrp`) under
//! [`ManagedProcess`], with its configuration and its own `--pid`, `--vrrp_pid`
//! and `--checkers_pid` files in a temporary directory, so that any number of
//! instances coexist. One VRRP instance on `eth0`, state `BACKUP` on every node
//! (the highest priority wins the election), multicast adverts on the data bridge
//! (`unicast_peer` only if asked for), preemption on (`nopreempt` off, so the
//! preferred node takes the VIP back when it returns), `vrrp_strict` off (it would
//! install filter rules and forbid some settings), no scripts (so
//! `enable_script_security` does not matter).
//!
//! What we found running it for real (keepalived 2.2.7, kernel 6.x, veths):
//! - carrier loss on `eth0` puts the master into FAULT at once: it sends a
//!   priority-0 advert (which no one receives over a cut cable) and removes the
//!   VIP, so a pulled cable never leaves a duplicate VIP behind;
//! - SIGKILL of the *parent* is not a crash: the VRRP child gets SIGTERM through
//!   its parent-death signal, sends priority 0 and removes the VIP; SIGKILL of the
//!   *VRRP child* alone is not one either: the parent respawns it within
//!   milliseconds, and the new child removes the VIP at start-up before winning the
//!   election again. [`Keepalived::kill`] therefore stops the parent first, then
//!   kills both: the VIP then stays configured on the dead node, and the backup
//!   adds it too (a duplicate VIP until someone removes it);
//! - a new instance removes stale VIPs of its configuration when it starts.

use crate::host::netns::{self, NetnsError, Topology};
use crate::host::process::{ManagedProcess, ProcessError};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The keepalived binary.
pub const KEEPALIVED: &str = "/usr/sbin/keepalived";
/// The name of the VRRP instance in the generated configuration.
pub const INSTANCE: &str = "VI_havip";

/// Errors of the keepalived runner.
#[derive(Debug, thiserror::Error)]
pub enum KeepalivedError {
    /// A namespace operation failed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The process could not be started.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// A file operation failed.
    #[error("failed to {op}: {source}")]
    Io {
        /// What was attempted.
        op: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The configuration is unusable.
    #[error("invalid keepalived configuration: {0}")]
    Invalid(String),
    /// keepalived exited or did not reach a VRRP state in time.
    #[error("keepalived on {node} {what}; last log lines:\n{log}")]
    Failed {
        /// The node.
        node: String,
        /// What went wrong.
        what: String,
        /// Its log tail.
        log: String,
    },
}

type Result<T, E = KeepalivedError> = std::result::Result<T, E>;

/// A VRRP state, from keepalived's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VrrpState {
    /// Backup.
    Backup,
    /// Master (holds the VIP).
    Master,
    /// Fault (e.g. the interface lost carrier).
    Fault,
}

/// What to run. Start from [`KeepalivedConfig::v2_defaults`] or
/// [`KeepalivedConfig::v3_fast`] and adjust with the setters.
#[derive(Debug, Clone, PartialEq)]
pub struct KeepalivedConfig {
    /// VRRP version, 2 or 3.
    pub version: u8,
    /// Advertisement interval (VRRPv2: whole seconds; v3: centiseconds).
    pub advert_int: Duration,
    /// Priority 1..=254; `None`: `200 − 10 × node index`, so node 0 is preferred.
    pub priority: Option<u8>,
    /// The VIP and its prefix; `None`: [`Topology::vip`]`(0)/24`.
    pub vip: Option<(Ipv4Addr, u8)>,
    /// The virtual router id; `None`: derived from the topology's `k`
    /// (`k − 99`, unique among live topologies).
    pub vrid: Option<u8>,
    /// The interface (`eth0`).
    pub interface: String,
    /// Do not take the VIP back from a lower-priority master (off by default).
    pub nopreempt: bool,
    /// Unicast peers instead of multicast (empty: multicast, the default).
    pub unicast_peers: Vec<Ipv4Addr>,
    /// `vrrp_garp_master_delay` (seconds; `None`: keepalived's default, 5).
    pub garp_master_delay: Option<u32>,
    /// `vrrp_garp_master_repeat` (`None`: keepalived's default, 5).
    pub garp_master_repeat: Option<u32>,
    /// Extra lines for `global_defs`.
    pub extra_global: Vec<String>,
    /// Extra lines for the `vrrp_instance`.
    pub extra_instance: Vec<String>,
    /// Blocks between `global_defs` and the `vrrp_instance` (a `vrrp_script`).
    pub extra_top: Vec<String>,
    /// More virtual addresses of the instance, after the VIP (same interface).
    pub more_vips: Vec<(Ipv4Addr, u8)>,
    /// More VRRP instances, one per address, with the same settings and the next virtual
    /// router ids (`VI_havip_1`, …): keepalived's way to move addresses independently.
    pub extra_instances: Vec<(Ipv4Addr, u8)>,
    /// `use_vmac`: the master carries the addresses on a macvlan `vrrp.<vrid>` of the
    /// interface whose MAC is the VRRP MAC `00:00:5e:00:01:<vrid>`.
    pub use_vmac: bool,
}

impl KeepalivedConfig {
    /// VRRPv2, `advert_int 1`, default gratuitous-ARP settings.
    pub fn v2_defaults() -> Self {
        Self {
            version: 2,
            advert_int: Duration::from_secs(1),
            priority: None,
            vip: None,
            vrid: None,
            interface: netns::DATA_IF.to_owned(),
            nopreempt: false,
            unicast_peers: Vec::new(),
            garp_master_delay: None,
            garp_master_repeat: None,
            extra_global: Vec::new(),
            extra_instance: Vec::new(),
            extra_top: Vec::new(),
            more_vips: Vec::new(),
            extra_instances: Vec::new(),
            use_vmac: false,
        }
    }

    /// VRRPv3 with `advert_int 0.1` (master-down after about 0.35 s).
    pub fn v3_fast() -> Self {
        Self { version: 3, advert_int: Duration::from_millis(100), ..Self::v2_defaults() }
    }

    /// Sets the priority.
    pub fn priority(mut self, p: u8) -> Self {
        self.priority = Some(p);
        self
    }

    /// Sets the VIP.
    pub fn vip(mut self, ip: Ipv4Addr, prefix_len: u8) -> Self {
        self.vip = Some((ip, prefix_len));
        self
    }

    /// Adds virtual addresses after the VIP.
    pub fn more_vips(mut self, vips: impl IntoIterator<Item = (Ipv4Addr, u8)>) -> Self {
        self.more_vips.extend(vips);
        self
    }

    /// Adds VRRP instances, one per address ([`Self::extra_instances`]).
    pub fn more_instances(mut self, vips: impl IntoIterator<Item = (Ipv4Addr, u8)>) -> Self {
        self.extra_instances.extend(vips);
        self
    }

    /// Sets the virtual router id.
    pub fn vrid(mut self, id: u8) -> Self {
        self.vrid = Some(id);
        self
    }

    /// Sets `nopreempt`.
    pub fn nopreempt(mut self, on: bool) -> Self {
        self.nopreempt = on;
        self
    }

    /// Uses unicast adverts to `peers`.
    pub fn unicast_peers(mut self, peers: Vec<Ipv4Addr>) -> Self {
        self.unicast_peers = peers;
        self
    }

    fn advert_int_text(&self) -> Result<String> {
        let cs = self.advert_int.as_millis() / 10;
        match self.version {
            2 if self.advert_int.subsec_nanos() == 0 && self.advert_int.as_secs() >= 1 => {
                Ok(self.advert_int.as_secs().to_string())
            }
            2 => Err(KeepalivedError::Invalid(format!("VRRPv2 needs whole seconds, not {:?}", self.advert_int))),
            3 if (1..=4095).contains(&cs) => Ok(format!("{}.{:02}", cs / 100, cs % 100)),
            3 => Err(KeepalivedError::Invalid(format!("VRRPv3 advert_int {:?} out of range", self.advert_int))),
            v => Err(KeepalivedError::Invalid(format!("VRRP version {v}"))),
        }
    }

    /// Renders `keepalived.conf` for `router_id`, with resolved priority, VIP and vrid.
    pub fn render(&self, router_id: &str, priority: u8, vip: (Ipv4Addr, u8), vrid: u8) -> Result<String> {
        if priority == 0 || priority == 255 {
            return Err(KeepalivedError::Invalid(format!("priority {priority}: use 1..=254")));
        }
        if vrid == 0 {
            return Err(KeepalivedError::Invalid("virtual_router_id 0".into()));
        }
        let mut c = String::new();
        let _ = writeln!(c, "# generated by havip-e2e");
        let _ = writeln!(c, "global_defs {{");
        let _ = writeln!(c, "    router_id {router_id}");
        let _ = writeln!(c, "    vrrp_version {}", self.version);
        if let Some(d) = self.garp_master_delay {
            let _ = writeln!(c, "    vrrp_garp_master_delay {d}");
        }
        if let Some(r) = self.garp_master_repeat {
            let _ = writeln!(c, "    vrrp_garp_master_repeat {r}");
        }
        for l in &self.extra_global {
            let _ = writeln!(c, "    {l}");
        }
        let _ = writeln!(c, "}}\n");
        for b in &self.extra_top {
            let _ = writeln!(c, "{b}\n");
        }
        let main: Vec<(Ipv4Addr, u8)> = std::iter::once(vip).chain(self.more_vips.iter().copied()).collect();
        self.write_instance(&mut c, INSTANCE, priority, vrid, &main)?;
        for (n, v) in self.extra_instances.iter().enumerate() {
            // Each its own virtual router id (the ids wrap within 1..=255).
            let id = u8::try_from((usize::from(vrid) - 1 + n + 1) % 255 + 1).unwrap_or(1);
            self.write_instance(&mut c, &format!("{INSTANCE}_{}", n + 1), priority, id, &[*v])?;
        }
        Ok(c)
    }

    /// One `vrrp_instance` block with this configuration's settings.
    fn write_instance(
        &self,
        c: &mut String,
        name: &str,
        priority: u8,
        vrid: u8,
        vips: &[(Ipv4Addr, u8)],
    ) -> Result<()> {
        let _ = writeln!(c, "vrrp_instance {name} {{");
        let _ = writeln!(c, "    state BACKUP");
        let _ = writeln!(c, "    interface {}", self.interface);
        let _ = writeln!(c, "    virtual_router_id {vrid}");
        let _ = writeln!(c, "    priority {priority}");
        let _ = writeln!(c, "    advert_int {}", self.advert_int_text()?);
        if self.nopreempt {
            let _ = writeln!(c, "    nopreempt");
        }
        if !self.unicast_peers.is_empty() {
            let _ = writeln!(c, "    unicast_peer {{");
            for p in &self.unicast_peers {
                let _ = writeln!(c, "        {p}");
            }
            let _ = writeln!(c, "    }}");
        }
        if self.use_vmac {
            let _ = writeln!(c, "    use_vmac");
        }
        for l in &self.extra_instance {
            let _ = writeln!(c, "    {l}");
        }
        let _ = writeln!(c, "    virtual_ipaddress {{");
        for v in vips {
            // With use_vmac an address without `dev` goes on the vmac interface.
            if self.use_vmac {
                let _ = writeln!(c, "        {}/{}", v.0, v.1);
            } else {
                let _ = writeln!(c, "        {}/{} dev {}", v.0, v.1, self.interface);
            }
        }
        let _ = writeln!(c, "    }}");
        let _ = writeln!(c, "}}");
        Ok(())
    }
}

/// A keepalived instance in a node's namespace; stopped (SIGTERM) on drop.
#[derive(Debug)]
pub struct Keepalived {
    node: String,
    ns: String,
    interface: String,
    vip: Ipv4Addr,
    priority: u8,
    dir: tempfile::TempDir,
    conf: PathBuf,
    log: PathBuf,
    process: Option<ManagedProcess>,
}

impl Keepalived {
    /// Writes the configuration and starts keepalived in node `node`'s namespace;
    /// returns once its VRRP instance has entered its first state.
    pub fn start(topo: &Topology, node: usize, config: KeepalivedConfig) -> Result<Self> {
        let n = topo.nodes().get(node).ok_or_else(|| KeepalivedError::Invalid(format!("no node {node}")))?;
        let default_priority = 200u8.saturating_sub(10 * u8::try_from(node).unwrap_or(u8::MAX));
        let priority = config.priority.unwrap_or(default_priority);
        let vip = config.vip.unwrap_or((topo.vip(0), 24));
        let vrid = config.vrid.unwrap_or(topo.k().saturating_sub(99).max(1));
        let text = config.render(&n.ns, priority, vip, vrid)?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("{}-keepalived-", n.ns))
            .tempdir()
            .map_err(|source| KeepalivedError::Io { op: "create a temporary directory".into(), source })?;
        let conf = dir.path().join("keepalived.conf");
        std::fs::write(&conf, text)
            .map_err(|source| KeepalivedError::Io { op: format!("write {}", conf.display()), source })?;
        let mut k = Self {
            node: n.name.clone(),
            ns: n.ns.clone(),
            // keepalived's own name for the vmac interface.
            interface: if config.use_vmac { format!("vrrp.{vrid}") } else { config.interface.clone() },
            vip: vip.0,
            priority,
            log: dir.path().join("keepalived.log"),
            dir,
            conf,
            process: None,
        };
        k.start_again()?;
        Ok(k)
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Starts it again after [`Keepalived::stop_graceful`] or [`Keepalived::kill`]
    /// (same configuration, same log); does nothing while it runs.
    pub fn start_again(&mut self) -> Result<()> {
        if self.process.as_mut().is_some_and(ManagedProcess::is_running) {
            return Ok(());
        }
        for f in ["keepalived.pid", "vrrp.pid", "checkers.pid"] {
            let _ = std::fs::remove_file(self.file(f));
        }
        let path = |p: PathBuf| p.display().to_string();
        let args = vec![
            "--dont-fork".to_owned(),
            "--log-console".to_owned(),
            "--log-detail".to_owned(),
            "--no-syslog".to_owned(),
            "--vrrp".to_owned(),
            "--use-file".to_owned(),
            path(self.conf.clone()),
            "--pid".to_owned(),
            path(self.file("keepalived.pid")),
            "--vrrp_pid".to_owned(),
            path(self.file("vrrp.pid")),
            "--checkers_pid".to_owned(),
            path(self.file("checkers.pid")),
        ];
        let log_start = std::fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0);
        let name = format!("keepalived-{}", self.node);
        let process = netns::spawn_in(&self.ns, &name, Path::new(KEEPALIVED), &args, &[], &self.log)?;
        self.process = Some(process);
        // Ready when the VRRP child has entered its first state.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = std::fs::read(&self.log).unwrap_or_default();
            let fresh = String::from_utf8_lossy(log.get(usize::try_from(log_start).unwrap_or(0)..).unwrap_or(&[]));
            if fresh.contains(&format!("({INSTANCE}) Entering")) {
                tracing::info!(node = %self.node, priority = self.priority, vip = %self.vip, "keepalived started");
                return Ok(());
            }
            if !self.is_running() {
                return Err(self.failed("exited during start-up"));
            }
            if Instant::now() >= deadline {
                return Err(self.failed("reached no VRRP state within 10 s"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn failed(&self, what: &str) -> KeepalivedError {
        KeepalivedError::Failed { node: self.node.clone(), what: what.to_owned(), log: self.log_tail(30) }
    }

    fn read_pid(&self, file: &str) -> Option<Pid> {
        std::fs::read_to_string(self.file(file)).ok()?.trim().parse::<i32>().ok().map(Pid::from_raw)
    }

    /// The planned handover: SIGTERM, upon which the master sends a priority-0
    /// advert (the backup takes over without waiting for the master-down timer)
    /// and removes its VIP; waits for it to exit (SIGKILL after 5 s).
    pub fn stop_graceful(&mut self) {
        if let Some(mut p) = self.process.take() {
            tracing::info!(node = %self.node, "stopping keepalived (SIGTERM)");
            p.stop(Duration::from_secs(5));
        }
    }

    /// A crash: stops the parent (so it cannot respawn its VRRP child), SIGKILLs
    /// the VRRP child, then the parent. Nothing is cleaned up: the VIP stays on
    /// the interface.
    pub fn kill(&mut self) {
        let Some(mut p) = self.process.take() else { return };
        tracing::info!(node = %self.node, "killing keepalived (SIGKILL)");
        let _ = p.signal(Signal::SIGSTOP);
        if let Some(child) = self.read_pid("vrrp.pid") {
            let _ = kill(child, Signal::SIGKILL);
        }
        p.kill_now();
    }

    /// Whether the parent process still runs.
    pub fn is_running(&mut self) -> bool {
        self.process.as_mut().is_some_and(ManagedProcess::is_running)
    }

    /// Whether the node's interface has the VIP now.
    pub fn holds_vip(&self) -> Result<bool> {
        Ok(netns::has_address(&self.ns, &self.interface, IpAddr::V4(self.vip))?)
    }

    /// Waits until [`Keepalived::holds_vip`] is `want`; returns how long it took.
    pub fn wait_holds_vip(&self, want: bool, timeout: Duration) -> Result<Duration> {
        let what = format!("keepalived on {} to {} {}", self.node, if want { "add" } else { "remove" }, self.vip);
        netns::wait_until(&what, timeout, Duration::from_millis(5), || {
            Ok(netns::has_address(&self.ns, &self.interface, IpAddr::V4(self.vip))? == want)
        })
        .map_err(|e| match e {
            NetnsError::Timeout { .. } => self.failed(&e.to_string()),
            e => e.into(),
        })
    }

    /// The last VRRP state keepalived logged.
    pub fn state(&self) -> Option<VrrpState> {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        log.lines().rev().find_map(|l| {
            let rest = l.split_once(&format!("({INSTANCE}) Entering "))?.1;
            match rest.split_whitespace().next()? {
                "MASTER" => Some(VrrpState::Master),
                "BACKUP" => Some(VrrpState::Backup),
                "FAULT" => Some(VrrpState::Fault),
                _ => None,
            }
        })
    }

    /// The keepalived parent's process id, while it runs (its VRRP child is below it).
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().and_then(ManagedProcess::pid)
    }

    /// The node's name (`n<i>`).
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The VIP.
    pub fn vip(&self) -> Ipv4Addr {
        self.vip
    }

    /// The priority in effect.
    pub fn priority(&self) -> u8 {
        self.priority
    }

    /// The configuration file.
    pub fn config_path(&self) -> &Path {
        &self.conf
    }

    /// The log file (all starts appended).
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        crate::host::process::tail(&self.log, lines)
    }
}

impl Drop for Keepalived {
    fn drop(&mut self) {
        // A VRRP child left over (its parent killed some other way) is killed too.
        let child = self.read_pid("vrrp.pid");
        self.stop_graceful();
        if let Some(c) = child
            && Path::new(&format!("/proc/{c}")).exists()
        {
            let _ = kill(c, Signal::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::KeepalivedConfig;
    use std::time::Duration;

    #[test]
    fn renders_v3_fast() {
        let c = KeepalivedConfig::v3_fast().render("r1", 150, ("10.100.0.50".parse().unwrap(), 24), 7).unwrap();
        assert!(c.contains("vrrp_version 3"), "{c}");
        assert!(c.contains("advert_int 0.10"), "{c}");
        assert!(c.contains("priority 150"), "{c}");
        assert!(c.contains("virtual_router_id 7"), "{c}");
        assert!(c.contains("10.100.0.50/24 dev eth0"), "{c}");
        assert!(c.contains("state BACKUP"), "{c}");
        assert!(!c.contains("nopreempt") && !c.contains("vrrp_strict") && !c.contains("unicast_peer"), "{c}");
    }

    #[test]
    fn renders_one_instance_per_extra_address_with_the_next_router_ids() {
        let extra = (1..=3u8).map(|i| (format!("10.1.0.{}", 50 + i).parse().unwrap(), 24));
        let c = KeepalivedConfig::v3_fast()
            .more_instances(extra)
            .render("r", 100, ("10.1.0.50".parse().unwrap(), 24), 254)
            .unwrap();
        assert_eq!(c.matches("vrrp_instance ").count(), 4, "{c}");
        for (name, id, vip) in
            [("VI_havip", 254, 50), ("VI_havip_1", 255, 51), ("VI_havip_2", 1, 52), ("VI_havip_3", 2, 53)]
        {
            let block = c.split(&format!("vrrp_instance {name} {{")).nth(1).expect(name);
            let block = block.split("vrrp_instance").next().unwrap_or(block);
            assert!(block.contains(&format!("virtual_router_id {id}\n")), "{name}: {block}");
            assert!(block.contains(&format!("10.1.0.{vip}/24 dev eth0")), "{name}: {block}");
            assert_eq!(block.matches("/24 dev").count(), 1, "{name}: one address each");
        }
    }

    #[test]
    fn renders_v2_and_options() {
        let c = KeepalivedConfig::v2_defaults()
            .nopreempt(true)
            .unicast_peers(vec!["10.1.0.11".parse().unwrap()])
            .render("r", 100, ("10.1.0.50".parse().unwrap(), 32), 1)
            .unwrap();
        assert!(c.contains("vrrp_version 2") && c.contains("advert_int 1\n"), "{c}");
        assert!(c.contains("nopreempt") && c.contains("unicast_peer {\n        10.1.0.11"), "{c}");
    }

    #[test]
    fn renders_use_vmac_with_the_addresses_on_the_vmac_interface() {
        let c = KeepalivedConfig { use_vmac: true, ..KeepalivedConfig::v3_fast() }
            .render("r", 100, ("10.1.0.50".parse().unwrap(), 24), 9)
            .unwrap();
        assert!(c.contains("    use_vmac\n"), "{c}");
        assert!(c.contains("        10.1.0.50/24\n") && !c.contains("10.1.0.50/24 dev"), "{c}");
    }

    #[test]
    fn rejects_bad_values() {
        let vip = ("10.1.0.50".parse().unwrap(), 24);
        let mut v2 = KeepalivedConfig::v2_defaults();
        v2.advert_int = Duration::from_millis(500);
        assert!(v2.render("r", 100, vip, 1).is_err());
        assert!(KeepalivedConfig::v3_fast().render("r", 255, vip, 1).is_err());
        assert!(KeepalivedConfig::v3_fast().render("r", 100, vip, 0).is_err());
    }
}
