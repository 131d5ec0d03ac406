//! The agent's runtime configuration, and the standalone configuration file.
//!
//! Both modes produce one [`AgentConfig`]: in Kubernetes mode it is built from the
//! HAPair, its FloatingIPs, the Node addresses and the key Secret; in standalone mode
//! from a YAML file (documented in `docs/standalone.md`). The timing and policy
//! sections use exactly the schema of the HAPair spec (`heartbeat`, `takeover`,
//! `failback`, `flapSuspension`) and of the FloatingIP spec (`announce`), with the
//! same defaults, so a pair moves between the two modes without translation.
//!
//! Size: the whole standalone file schema, its validation with precise errors and the
//! translation into the machine's settings, kept together so the schema has one source.

use crate::sm;
use havip_crds::duration::{DurationError, parse_duration};
use havip_crds::wire::{Key, Keyring};
use havip_crds::{AnnounceSpec, FailbackMode, FailbackSpec, FlapSuspensionSpec, TakeoverSpec};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Errors in a configuration (standalone file or cluster objects).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("failed to read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid YAML for this schema.
    #[error("failed to parse {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_yaml::Error,
    },
    /// A duration field is malformed.
    #[error("{field}: {source}")]
    Duration {
        /// The field.
        field: String,
        /// The cause.
        #[source]
        source: DurationError,
    },
    /// Any other invalid value, with a sentence that names it.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

fn invalid(msg: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(msg.into())
}

fn dur(field: &str, value: &str) -> Result<Duration, ConfigError> {
    parse_duration(value).map_err(|source| ConfigError::Duration { field: field.to_owned(), source })
}

fn ms(field: &str, value: &str) -> Result<u64, ConfigError> {
    Ok(dur(field, value)?.as_millis().try_into().unwrap_or(u64::MAX))
}

/// One VIP as the agent runs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VipConfig {
    /// Stable id (the FloatingIP name, or the address in standalone mode).
    pub id: String,
    /// The address.
    pub addr: IpAddr,
    /// Prefix length.
    pub prefix: u8,
    /// Interface; `None` = the interface holding the node's address in the subnet.
    pub interface: Option<String>,
    /// TCP ports probed on the VIP.
    pub probe_ports: Vec<u16>,
    /// HTTP health checks of this node (port, path), probed on its own address: more
    /// listeners of its own, never probed by a peer.
    pub health_checks: Vec<(u16, String)>,
    /// Announcement schedule.
    pub announce: AnnounceSchedule,
}

/// When to announce a VIP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnnounceSchedule {
    /// Announcements at once on taking the VIP.
    pub burst: u32,
    /// Repeats after the burst.
    pub repeats: u32,
    /// Spacing of the repeats (> 1 s, past the ARP locktime).
    pub repeat_interval: Duration,
    /// Periodic refresh while holding; zero disables it.
    pub refresh_interval: Duration,
}

impl AnnounceSchedule {
    /// From the FloatingIP `announce` schema.
    pub fn from_spec(spec: &AnnounceSpec) -> Result<Self, ConfigError> {
        let s = Self {
            burst: u32::try_from(spec.burst).map_err(|_| invalid("announce.burst must be positive"))?,
            repeats: u32::try_from(spec.repeats).map_err(|_| invalid("announce.repeats must not be negative"))?,
            repeat_interval: dur("announce.repeatInterval", &spec.repeat_interval)?,
            refresh_interval: dur("announce.refreshInterval", &spec.refresh_interval)?,
        };
        if s.burst == 0 || s.burst > 10 {
            return Err(invalid("announce.burst must be between 1 and 10"));
        }
        if s.repeats > 0 && s.repeat_interval <= Duration::from_secs(1) {
            return Err(invalid("announce.repeatInterval must be more than 1s (the Linux ARP locktime)"));
        }
        Ok(s)
    }
}

/// One member: its priority and its address on each heartbeat path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberConfig {
    /// Node name.
    pub node: String,
    /// Priority 1..254.
    pub priority: u8,
    /// Address per path name.
    pub addresses: BTreeMap<String, IpAddr>,
}

/// Probing parameters for the I/O layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeConfig {
    /// Interval between two data-plane probes.
    pub interval: Duration,
    /// Connect timeout of one probe.
    pub timeout: Duration,
    /// Fence targets (empty = the default gateway).
    pub fence_targets: Vec<IpAddr>,
}

/// Everything one agent needs to run one pair.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// Pair name (carried in heartbeats).
    pub pair: String,
    /// This node.
    pub node: String,
    /// All members, this node included.
    pub members: Vec<MemberConfig>,
    /// Heartbeat path names, in order (`PathId(i)` = `paths[i]`).
    pub paths: Vec<String>,
    /// Heartbeat UDP port.
    pub heartbeat_port: u16,
    /// Heartbeat keys.
    pub keys: Keyring,
    /// The VIPs.
    pub vips: Vec<VipConfig>,
    /// Probe parameters.
    pub probe: ProbeConfig,
    /// The state machine's configuration.
    pub sm: sm::Config,
    /// Policy moves paused.
    pub paused: bool,
    /// The witness (standalone mode only): takeovers need its vote.
    pub witness: Option<WitnessConfig>,
}

/// A standalone pair's witness, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WitnessConfig {
    /// Its UDP address.
    pub address: SocketAddr,
    /// The witness key (and during a rotation the previous one).
    pub keys: Keyring,
}

impl AgentConfig {
    /// This member's entry.
    pub fn local_member(&self) -> Option<&MemberConfig> {
        self.members.iter().find(|m| m.node == self.node)
    }
}

/// What the state machine's configuration is built from: the resolved members, paths
/// and VIPs, and the schema sections both modes share (HAPair spec / standalone file).
#[derive(Clone, Copy, Debug)]
pub struct SmSettings<'a> {
    /// This node.
    pub node: &'a str,
    /// All members, this node included.
    pub members: &'a [MemberConfig],
    /// Heartbeat path names, in order.
    pub paths: &'a [String],
    /// The VIPs.
    pub vips: &'a [VipConfig],
    /// `heartbeat.interval`.
    pub heartbeat_interval: &'a str,
    /// `heartbeat.timeout`.
    pub heartbeat_timeout: &'a str,
    /// `takeover`.
    pub takeover: &'a TakeoverSpec,
    /// `failback`.
    pub failback: &'a FailbackSpec,
    /// `flapSuspension`.
    pub flap: &'a FlapSuspensionSpec,
    /// `drainTimeout`.
    pub drain_timeout: &'a str,
    /// Serve alone without the boot hold (standalone `startAlone`).
    pub start_alone: bool,
    /// The pair-wide configuration revision.
    pub config_revision: u64,
}

/// Builds the state machine's configuration from the shared schema sections.
pub fn build_sm_config(settings: &SmSettings<'_>) -> Result<sm::Config, ConfigError> {
    let SmSettings {
        node,
        members,
        paths,
        vips,
        heartbeat_interval,
        heartbeat_timeout,
        takeover,
        failback,
        flap,
        drain_timeout,
        start_alone,
        config_revision,
    } = *settings;
    let node_id = |n: &str| sm::NodeId::new(n).map_err(|e| invalid(format!("node name {n:?}: {e}")));
    let sm_members = members
        .iter()
        .map(|m| Ok(sm::Member { node: node_id(&m.node)?, priority: m.priority }))
        .collect::<Result<Vec<_>, ConfigError>>()?;
    let mut cfg = sm::Config::new(node_id(node)?, sm_members);
    cfg.paths = (0..paths.len()).map(|i| sm::PathId(i as u8)).collect();
    cfg.vips = vips
        .iter()
        .map(|v| {
            Ok(sm::VipSpec {
                id: sm::VipId::new(v.id.clone()).map_err(|e| invalid(format!("VIP id {:?}: {e}", v.id)))?,
                probe_ports: v.probe_ports.clone(),
                health_ports: v.health_checks.iter().map(|(p, _)| *p).collect(),
            })
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    cfg.config_revision = config_revision;
    cfg.start_alone = start_alone;
    let t = &mut cfg.timings;
    t.heartbeat_interval_ms = ms("heartbeat.interval", heartbeat_interval)?;
    t.heartbeat_timeout_ms = ms("heartbeat.timeout", heartbeat_timeout)?;
    if t.heartbeat_interval_ms == 0 || t.heartbeat_timeout_ms < 2 * t.heartbeat_interval_ms {
        return Err(invalid("heartbeat.timeout must be at least twice heartbeat.interval (and the interval above 0)"));
    }
    // The machine's resolution while something is pending: a fifth of a heartbeat, 5 to
    // 20 ms (20 ms at the default 100 ms; 6 ms with the Fast profile's 30 ms).
    t.tick_ms = (t.heartbeat_interval_ms / 5).clamp(5, 20);
    t.probe_failures =
        u32::try_from(takeover.probe_failures).map_err(|_| invalid("takeover.probeFailures must be positive"))?.max(1);
    t.probe_span_ms = ms("takeover.probeSpan", &takeover.probe_span)?;
    t.hold_down_ms = ms("takeover.holdDown", &takeover.hold_down)?;
    t.boot_hold_ms = ms("takeover.bootHold", &takeover.boot_hold)?;
    t.carrier_stable_ms = ms("takeover.carrierStableFor", &takeover.carrier_stable_for)?;
    t.drain_ms = ms("drainTimeout", drain_timeout)?;
    let probe_interval = ms("takeover.probeInterval", &takeover.probe_interval)?;
    let probe_timeout = ms("takeover.probeTimeout", &takeover.probe_timeout)?;
    // A verdict must be refreshed well within its freshness window.
    t.probe_fresh_ms = t.probe_fresh_ms.max(3 * (probe_interval + probe_timeout));
    cfg.failback = match failback.mode {
        FailbackMode::Manual => sm::FailbackPolicy::Manual,
        FailbackMode::Automatic => sm::FailbackPolicy::Automatic(sm::AutoFailback {
            recovery_window_ms: ms("failback.recoveryWindow", &failback.recovery_window)?,
            min_on_nonpreferred_ms: ms("failback.minimumTimeOnStandby", &failback.minimum_time_on_standby)?,
            quarantine_failovers: u32::try_from(failback.quarantine.failovers)
                .map_err(|_| invalid("failback.quarantine.failovers must be positive"))?,
            quarantine_window_ms: ms("failback.quarantine.within", &failback.quarantine.within)?,
            quarantine_hold_ms: ms("failback.quarantine.hold", &failback.quarantine.hold)?,
            quiet_window_ms: ms("failback.quietWindow", &failback.quiet_window)?,
            quiet_threshold_bps: u64::try_from(failback.quiet_threshold_bytes_per_second)
                .map_err(|_| invalid("failback.quietThresholdBytesPerSecond must not be negative"))?,
        }),
    };
    cfg.flap = sm::FlapPolicy {
        moves: u32::try_from(flap.moves).map_err(|_| invalid("flapSuspension.moves must be positive"))?,
        window_ms: ms("flapSuspension.within", &flap.within)?,
        quiet_ms: ms("flapSuspension.quietClear", &flap.quiet_clear)?,
    };
    cfg.validate().map_err(|e| invalid(e.to_string()))?;
    Ok(cfg)
}

/// Parses `a.b.c.d/nn` or `x::y/nn`.
pub fn parse_cidr(s: &str) -> Result<(IpAddr, u8), ConfigError> {
    let (addr, prefix) = s.split_once('/').ok_or_else(|| invalid(format!("{s:?}: expected address/prefix")))?;
    let addr: IpAddr = addr.parse().map_err(|_| invalid(format!("{s:?}: not an IP address")))?;
    let prefix: u8 = prefix.parse().map_err(|_| invalid(format!("{s:?}: bad prefix length")))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    if prefix > max {
        return Err(invalid(format!("{s:?}: prefix length over {max}")));
    }
    Ok((addr, prefix))
}

/// A stable 64-bit revision of the pair-wide configuration (FNV-1a over a canonical
/// rendering). Members compare it before a planned handover.
pub fn revision_of(canonical: &str) -> u64 {
    havip_crds::revision::fnv1a(canonical.as_bytes())
}

// ---------------------------------------------------------------------------------
// The standalone file.

/// The standalone configuration file (see `docs/standalone.md`).
#[derive(Deserialize, Debug, Clone)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StandaloneFile {
    /// Pair name (the same on every member).
    pub pair: String,
    /// This member's node name (overridden by `--node`).
    #[serde(default)]
    pub node: Option<String>,
    /// Every member.
    pub members: Vec<StandaloneMember>,
    /// Heartbeat settings.
    #[serde(default)]
    pub heartbeat: StandaloneHeartbeat,
    /// Takeover rules (the HAPair `takeover` schema).
    #[serde(default)]
    pub takeover: TakeoverSpec,
    /// Failback policy (the HAPair `failback` schema).
    #[serde(default)]
    pub failback: FailbackSpec,
    /// Flap suspension (the HAPair `flapSuspension` schema).
    #[serde(default)]
    pub flap_suspension: FlapSuspensionSpec,
    /// The VIPs.
    pub vips: Vec<StandaloneVip>,
    /// Serve alone without the boot hold when no peer was ever heard.
    #[serde(default)]
    pub start_alone: bool,
    /// No automatic policy moves.
    #[serde(default)]
    pub paused: bool,
    /// Timing profile (`Standard` or `Fast`, as in the HAPair): sets the heartbeat and
    /// probe timings left at their defaults.
    #[serde(default)]
    pub profile: havip_crds::hapair::TimingProfile,
    /// How long the old holder of a planned move keeps the VIPs for its established
    /// connections (as the HAPair's `drainTimeout`; `0s`: off).
    #[serde(default = "default_drain_timeout")]
    pub drain_timeout: String,
    /// Directory for the persisted state (epoch, maintenance).
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    /// Metrics and health endpoint address.
    #[serde(default)]
    pub metrics_address: Option<SocketAddr>,
    /// Unix socket for `havip-agent admin`.
    #[serde(default)]
    pub admin_socket: Option<PathBuf>,
    /// A witness whose vote every takeover needs (see docs/standalone.md).
    #[serde(default)]
    pub witness: Option<StandaloneWitness>,
}

/// The `witness:` section of the standalone file.
#[derive(Deserialize, Debug, Clone)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StandaloneWitness {
    /// `ip:port`, or an IP address alone for the default port 7947.
    pub address: String,
    /// The witness key (hex, at least 16 bytes), or use `keyFile`.
    #[serde(default)]
    pub key: Option<String>,
    /// A file holding the hex key.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// Id of the key.
    #[serde(default = "default_key_id")]
    pub key_id: u32,
    /// During a rotation: the previous key (hex) still accepted.
    #[serde(default)]
    pub previous_key: Option<String>,
    /// Id of the previous key.
    #[serde(default)]
    pub previous_key_id: Option<u32>,
}

impl StandaloneWitness {
    /// Address and keys.
    pub fn resolve(&self) -> Result<WitnessConfig, ConfigError> {
        let address = parse_witness_address(&self.address)?;
        let keys = keyring(
            "witness",
            KeySource { key: self.key.as_deref(), key_file: self.key_file.as_deref() },
            self.key_id,
            self.previous_key.as_deref(),
            self.previous_key_id,
        )?;
        Ok(WitnessConfig { address, keys })
    }
}

/// `ip:port`, `[v6]:port`, or an address alone (port [`havip_crds::witness::DEFAULT_PORT`]).
pub fn parse_witness_address(s: &str) -> Result<SocketAddr, ConfigError> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    s.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, havip_crds::witness::DEFAULT_PORT))
        .map_err(|_| invalid(format!("witness.address: {s:?} is neither ip:port nor an IP address")))
}

/// Where a key comes from: inline hex or a file (exactly one).
#[derive(Clone, Copy, Debug)]
pub struct KeySource<'a> {
    /// Inline hex.
    pub key: Option<&'a str>,
    /// A file holding the hex key.
    pub key_file: Option<&'a Path>,
}

/// A keyring from a key source and an optional previous key (`section` names the
/// configuration section in errors).
pub fn keyring(
    section: &str,
    current: KeySource<'_>,
    key_id: u32,
    previous_key: Option<&str>,
    previous_key_id: Option<u32>,
) -> Result<Keyring, ConfigError> {
    let key_hex = match (current.key, current.key_file) {
        (Some(k), None) => k.to_owned(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).map_err(|source| ConfigError::Read { path: f.to_owned(), source })?
        }
        _ => return Err(invalid(format!("{section}: set exactly one of key or keyFile"))),
    };
    let current = Key { id: key_id, secret: parse_hex_key(&key_hex)? };
    let previous = match previous_key {
        Some(k) => Some(Key {
            id: previous_key_id
                .ok_or_else(|| invalid(format!("{section}.previousKeyId is required with previousKey")))?,
            secret: parse_hex_key(k)?,
        }),
        None => None,
    };
    Ok(Keyring { current, previous })
}

/// A member in the standalone file.
#[derive(Deserialize, Debug, Clone)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StandaloneMember {
    /// Node name.
    pub node: String,
    /// Priority 1..254.
    pub priority: i32,
    /// The member's address on each heartbeat path, by path name.
    pub addresses: BTreeMap<String, IpAddr>,
}

/// Heartbeat settings in the standalone file.
#[derive(Deserialize, Debug, Clone)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StandaloneHeartbeat {
    /// UDP port.
    #[serde(default = "default_port")]
    pub port: u16,
    /// Interval.
    #[serde(default = "default_interval")]
    pub interval: String,
    /// Timeout.
    #[serde(default = "default_timeout")]
    pub timeout: String,
    /// Path names, in order; every member lists an address for each.
    #[serde(default)]
    pub paths: Vec<String>,
    /// The HMAC key (hex, at least 16 bytes), or use `keyFile`.
    #[serde(default)]
    pub key: Option<String>,
    /// A file holding the hex key.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// Id of the key.
    #[serde(default = "default_key_id")]
    pub key_id: u32,
    /// During a rotation: the previous key (hex) still accepted.
    #[serde(default)]
    pub previous_key: Option<String>,
    /// Id of the previous key.
    #[serde(default)]
    pub previous_key_id: Option<u32>,
}

impl Default for StandaloneHeartbeat {
    fn default() -> Self {
        Self {
            port: default_port(),
            interval: default_interval(),
            timeout: default_timeout(),
            paths: Vec::new(),
            key: None,
            key_file: None,
            key_id: default_key_id(),
            previous_key: None,
            previous_key_id: None,
        }
    }
}

fn default_port() -> u16 {
    havip_crds::defaults::HEARTBEAT_PORT as u16
}
fn default_drain_timeout() -> String {
    havip_crds::defaults::DRAIN_TIMEOUT.to_owned()
}

fn default_interval() -> String {
    havip_crds::defaults::HEARTBEAT_INTERVAL.to_owned()
}
fn default_timeout() -> String {
    havip_crds::defaults::HEARTBEAT_TIMEOUT.to_owned()
}
fn default_key_id() -> u32 {
    1
}

/// A VIP in the standalone file.
#[derive(Deserialize, Debug, Clone)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StandaloneVip {
    /// Address with prefix length.
    pub address: String,
    /// Interface (default: the one holding the node's address in the subnet).
    #[serde(default)]
    pub interface: Option<String>,
    /// TCP ports served on the VIP (probed).
    #[serde(default)]
    pub probe_ports: Vec<u16>,
    /// HTTP health checks of this node (the FloatingIP `probe.healthChecks` schema).
    #[serde(default)]
    pub health_checks: Vec<havip_crds::HealthCheck>,
    /// Announcement schedule (the FloatingIP `announce` schema).
    #[serde(default)]
    pub announce: AnnounceSpec,
}

/// The health checks of a VIP as (port, path); a port outside 1..=65535 or a path not
/// starting with `/` is an error.
pub fn health_checks(checks: &[havip_crds::HealthCheck]) -> Result<Vec<(u16, String)>, ConfigError> {
    checks
        .iter()
        .map(|c| match u16::try_from(c.port) {
            Ok(p) if p > 0 && c.path.starts_with('/') => Ok((p, c.path.clone())),
            _ => Err(invalid(format!(
                "health check {}:{:?}: a port 1..=65535 and a path starting with /",
                c.port, c.path
            ))),
        })
        .collect()
}

/// Decodes a hex key.
pub fn parse_hex_key(s: &str) -> Result<Vec<u8>, ConfigError> {
    let s = s.trim();
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(invalid("heartbeat key must be hex digits"));
    }
    let bytes: Vec<u8> = (0..s.len()).step_by(2).filter_map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok()).collect();
    if bytes.len() < 16 {
        return Err(invalid("heartbeat key must be at least 16 bytes (32 hex digits)"));
    }
    Ok(bytes)
}

impl StandaloneFile {
    /// Reads and parses a file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        serde_yaml::from_str(&text).map_err(|source| ConfigError::Parse { path: path.to_owned(), source })
    }

    /// Validates and turns the file into the agent's configuration for `node`.
    pub fn into_agent_config(self, node_override: Option<&str>) -> Result<AgentConfig, ConfigError> {
        let node = node_override
            .map(str::to_owned)
            .or(self.node.clone())
            .ok_or_else(|| invalid("no node name: set `node:` in the file or pass --node"))?;
        if self.pair.is_empty() || self.pair.len() > 63 {
            return Err(invalid("pair must be 1 to 63 characters"));
        }
        if !(1..=8).contains(&self.members.len()) {
            return Err(invalid("members: a pair has 1 to 8 members"));
        }
        let paths = if self.heartbeat.paths.is_empty() {
            // Default: every path name the first member lists.
            self.members.first().map(|m| m.addresses.keys().cloned().collect()).unwrap_or_default()
        } else {
            self.heartbeat.paths.clone()
        };
        if paths.is_empty() || paths.len() > 4 {
            return Err(invalid("heartbeat.paths: 1 to 4 paths"));
        }
        let mut seen_nodes = BTreeSet::new();
        let mut seen_prio = BTreeSet::new();
        let mut members = Vec::new();
        for m in &self.members {
            let priority = u8::try_from(m.priority)
                .ok()
                .filter(|p| (1..=254).contains(p))
                .ok_or_else(|| invalid(format!("member {}: priority must be between 1 and 254", m.node)))?;
            if !seen_nodes.insert(m.node.clone()) {
                return Err(invalid(format!("member {} appears twice", m.node)));
            }
            if !seen_prio.insert(priority) {
                return Err(invalid(format!("priority {priority} appears twice (priorities must be distinct)")));
            }
            for p in &paths {
                if !m.addresses.contains_key(p) {
                    return Err(invalid(format!("member {} has no address for heartbeat path {p:?}", m.node)));
                }
            }
            members.push(MemberConfig { node: m.node.clone(), priority, addresses: m.addresses.clone() });
        }
        if !seen_nodes.contains(&node) {
            return Err(invalid(format!("node {node:?} is not a member of pair {}", self.pair)));
        }
        let keys = keyring(
            "heartbeat",
            KeySource { key: self.heartbeat.key.as_deref(), key_file: self.heartbeat.key_file.as_deref() },
            self.heartbeat.key_id,
            self.heartbeat.previous_key.as_deref(),
            self.heartbeat.previous_key_id,
        )?;
        let witness = self.witness.as_ref().map(StandaloneWitness::resolve).transpose()?;
        let mut vips = Vec::new();
        for v in &self.vips {
            let (addr, prefix) = parse_cidr(&v.address)?;
            if vips.iter().any(|x: &VipConfig| x.addr == addr) {
                return Err(invalid(format!("VIP {addr} appears twice")));
            }
            vips.push(VipConfig {
                id: addr.to_string(),
                addr,
                prefix,
                interface: v.interface.clone(),
                probe_ports: v.probe_ports.clone(),
                health_checks: health_checks(&v.health_checks)?,
                announce: AnnounceSchedule::from_spec(&v.announce)?,
            });
        }
        if vips.is_empty() {
            return Err(invalid("vips: at least one VIP"));
        }
        let fence_targets = self
            .takeover
            .fence_targets
            .iter()
            .map(|t| t.parse().map_err(|_| invalid(format!("takeover.fenceTargets: {t:?} is not an IP address"))))
            .collect::<Result<Vec<IpAddr>, _>>()?;
        // The timings in force: the profile's where the file leaves the defaults.
        let (mut hb_interval, mut hb_timeout, mut takeover) =
            (self.heartbeat.interval.clone(), self.heartbeat.timeout.clone(), self.takeover.clone());
        self.profile.apply(&mut hb_interval, &mut hb_timeout, &mut takeover);
        let probe = ProbeConfig {
            interval: dur("takeover.probeInterval", &takeover.probe_interval)?,
            timeout: dur("takeover.probeTimeout", &takeover.probe_timeout)?,
            fence_targets,
        };
        // Everything pair-wide (not this node's identity) goes into the revision.
        let canonical = format!(
            "{}|{:?}|{:?}|{}|{}|{}|{:?}|{:?}|{:?}|{:?}{}",
            self.pair,
            members,
            paths,
            self.heartbeat.interval,
            self.heartbeat.timeout,
            self.heartbeat.port,
            vips,
            self.takeover,
            self.failback,
            self.flap_suspension,
            // Every member must agree on whether takeovers need the witness's vote.
            witness.as_ref().map(|w| format!("|witness {}", w.address)).unwrap_or_default()
        ) + if self.profile.is_standard() { "" } else { "|profile fast" }
            + &if self.drain_timeout == havip_crds::defaults::DRAIN_TIMEOUT {
                String::new()
            } else {
                format!("|drain {}", self.drain_timeout)
            };
        let mut sm = build_sm_config(&SmSettings {
            node: &node,
            members: &members,
            paths: &paths,
            vips: &vips,
            heartbeat_interval: &hb_interval,
            heartbeat_timeout: &hb_timeout,
            takeover: &takeover,
            failback: &self.failback,
            flap: &self.flap_suspension,
            drain_timeout: &self.drain_timeout,
            start_alone: self.start_alone,
            config_revision: revision_of(&canonical),
        })?;
        sm.lease_vote_required = witness.is_some();
        Ok(AgentConfig {
            pair: self.pair,
            node,
            members,
            paths,
            heartbeat_port: self.heartbeat.port,
            keys,
            vips,
            probe,
            sm,
            paused: self.paused,
            witness,
        })
    }
}
