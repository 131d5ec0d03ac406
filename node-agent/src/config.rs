//! The agent's runtime configuration, whichever mode builds it.
//!
//! Both modes produce one [`AgentConfig`]: in Kubernetes mode it is built from the
//! HAPair, its FloatingIPs, the Node addresses and the key Secret; in standalone mode
//! from a YAML file (documented in `docs/standalone.md`). The timing and policy
//! sections use exactly the schema of the HAPair spec (`heartbeat`, `takeover`,
//! `failback`, `flapSuspension`) and of the FloatingIP spec (`announce`), with the
//! same defaults, so a pair moves between the two modes without translation.
//!
//! The standalone file's schema lives in [`crate::standalone::config`].

use crate::sm;
use havip_crds::duration::{DurationError, parse_duration};
use havip_crds::wire::{Key, Keyring};
use havip_crds::{AnnounceMode, AnnounceSpec, FailbackMode, FailbackSpec, FlapSuspensionSpec, TakeoverSpec};
use std::collections::BTreeMap;
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

pub(crate) fn invalid(msg: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(msg.into())
}

pub(crate) fn dur(field: &str, value: &str) -> Result<Duration, ConfigError> {
    parse_duration(value).map_err(|source| ConfigError::Duration { field: field.to_owned(), source })
}

pub(crate) fn ms(field: &str, value: &str) -> Result<u64, ConfigError> {
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

/// How a VIP is made known, and for layer 2 when it is announced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnnounceSchedule {
    /// Layer 2 (an address of its link, GARP/NA) or BGP (a host address of the dummy
    /// interface the node's BGP speaker advertises; see [`crate::announce::bgp`]).
    pub mode: AnnounceMode,
    /// Announcements at once on taking the VIP.
    pub burst: u32,
    /// Repeats after the burst.
    pub repeats: u32,
    /// Spacing of the repeats (> 1 s, past the ARP locktime).
    pub repeat_interval: Duration,
    /// Periodic refresh while holding; zero disables it.
    pub refresh_interval: Duration,
    /// Each announcement also goes unicast to the neighbours the holder knows in the VIP's
    /// subnet (`announce.unicastToNeighbours`).
    pub unicast: bool,
}

impl AnnounceSchedule {
    /// From the FloatingIP `announce` schema; `default_mode` where it names no mode (the
    /// pair's `announceMode`).
    pub fn from_spec(spec: &AnnounceSpec, default_mode: AnnounceMode) -> Result<Self, ConfigError> {
        let s = Self {
            mode: spec.mode.unwrap_or(default_mode),
            burst: u32::try_from(spec.burst).map_err(|_| invalid("announce.burst must be positive"))?,
            repeats: u32::try_from(spec.repeats).map_err(|_| invalid("announce.repeats must not be negative"))?,
            repeat_interval: dur("announce.repeatInterval", &spec.repeat_interval)?,
            refresh_interval: dur("announce.refreshInterval", &spec.refresh_interval)?,
            unicast: spec.unicast_to_neighbours,
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
    /// Routed VIPs: a ready standby hands its speaker a backup path of each (the HAPair's
    /// `bgpBackupPaths`; see [`crate::announce::bgp`]).
    pub bgp_backup_paths: bool,
    /// The witness (standalone mode only): takeovers need its vote.
    pub witness: Option<WitnessConfig>,
    /// Standalone control-plane mode: the members vote (a majority), see [`QuorumConfig`].
    pub quorum: Option<QuorumConfig>,
    /// Standalone control-plane mode: the local API server's readiness check, a listener
    /// of every VIP (see [`ApiServerCheck`]).
    pub api_server: Option<ApiServerCheck>,
    /// The pair's virtual MAC (the HAPair's `virtualMAC`): the holder's layer-2 VIPs live
    /// on a macvlan interface with that MAC (see [`crate::announce::l2::vmac`]).
    pub virtual_mac: Option<VirtualMac>,
    /// Routes the holder carries (the HAPair's `routes`; see `runtime::routes`).
    pub routes: Vec<havip_crds::HolderRoute>,
    /// Policy rules the holder carries (the HAPair's `rules`).
    pub rules: Vec<havip_crds::HolderRule>,
}

/// The pair's routes and rules that follow the holder, checked (the HAPair's or the
/// standalone file's `routes` and `rules`).
pub fn holder_routes(
    routes: &[havip_crds::HolderRouteSpec],
    rules: &[havip_crds::HolderRuleSpec],
) -> Result<(Vec<havip_crds::HolderRoute>, Vec<havip_crds::HolderRule>), ConfigError> {
    havip_crds::routes::parse_all(routes, rules).map_err(|e| invalid(e.to_string()))
}

/// The MACs a pair's layer-2 VIPs answer with while held (the HAPair's `virtualMAC`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VirtualMac {
    /// The id (1..=255).
    pub id: u8,
    /// The IPv4 VIPs' MAC.
    pub v4: [u8; 6],
    /// The IPv6 VIPs' MAC (the same as `v4` when the spec gives an address).
    pub v6: [u8; 6],
}

impl VirtualMac {
    /// From the HAPair's (or the standalone file's) `virtualMAC`.
    pub fn from_spec(spec: &havip_crds::VirtualMacSpec) -> Result<Self, ConfigError> {
        let err = |e: havip_crds::VirtualMacError| invalid(e.to_string());
        let id = u8::try_from(spec.id).map_err(|_| err(havip_crds::VirtualMacError::Id(spec.id)))?;
        Ok(Self { id, v4: spec.mac(false).map_err(err)?, v6: spec.mac(true).map_err(err)? })
    }

    /// The MAC of the VIPs of one family.
    pub fn mac(&self, v6: bool) -> [u8; 6] {
        if v6 { self.v6 } else { self.v4 }
    }

    /// The name of the macvlan interface that carries the VIPs of one family on the link
    /// with index `parent`: `hv4-33-2` (id 0x33 on ifindex 2; `hv6-…` for IPv6, `hv-…`
    /// when both families share one MAC). At most 15 characters, as the kernel requires.
    pub fn link_name(&self, v6: bool, parent: u32) -> String {
        let family = match (self.v4 == self.v6, v6) {
            (true, _) => "",
            (false, false) => "4",
            (false, true) => "6",
        };
        format!("hv{family}-{:02x}-{parent:x}", self.id)
    }
}

/// The control-plane mode's readiness gate: `GET /readyz` over HTTPS on this node's own
/// API server, verified with the cluster CA. It counts as every VIP's listener on `port`:
/// a holder whose API server is not ready hands over to a member whose API server is, and
/// a member whose API server is not ready is no target of a planned move.
#[derive(Clone, Debug)]
pub struct ApiServerCheck {
    /// The API server's port (6443).
    pub port: u16,
    /// The check.
    pub check: std::sync::Arc<crate::probes::https::HttpsCheck>,
    /// How often it is asked.
    pub interval: Duration,
}

/// The control-plane mode's arbitration: every member runs a voter (the witness protocol's
/// server) and a takeover needs a majority of their votes; see `docs/control-plane.md`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuorumConfig {
    /// Where this member's voter listens (its address on the first heartbeat path).
    pub listen: SocketAddr,
    /// Every member's voter, this member's included: (node, address).
    pub voters: Vec<(String, SocketAddr)>,
    /// The voters' key (the witness key of the witness protocol), derived from the
    /// heartbeat key unless given; each member signs with its member key under it.
    pub keys: Keyring,
    /// A holder without a majority's confirmation for this long gives the VIPs up.
    pub lease: Duration,
}

impl QuorumConfig {
    /// How many voters make a majority.
    pub fn majority(&self) -> usize {
        self.voters.len() / 2 + 1
    }
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
