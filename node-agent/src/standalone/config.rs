//! The standalone configuration file (documented in `docs/standalone.md`): its schema,
//! its validation with precise errors, and its translation into the agent's
//! [`AgentConfig`]. The timing and policy sections use exactly the schema of the HAPair
//! spec and of the FloatingIP spec, with the same defaults, so a pair moves between the
//! two modes without translation.

use crate::config::{
    AgentConfig, AnnounceSchedule, ConfigError, KeySource, MemberConfig, ProbeConfig, SmSettings, VipConfig,
    WitnessConfig, build_sm_config, dur, health_checks, invalid, keyring, parse_cidr, revision_of,
};
use havip_crds::{AnnounceSpec, FailbackSpec, FlapSuspensionSpec, TakeoverSpec};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

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
    /// How the VIPs are made known unless a VIP's `announce.mode` says otherwise (as the
    /// HAPair's `announceMode`): `L2` (default) or `BGP`.
    #[serde(default)]
    pub announce_mode: havip_crds::AnnounceMode,
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
                announce: AnnounceSchedule::from_spec(&v.announce, self.announce_mode)?,
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
