//! The standalone configuration file (documented in `docs/standalone.md`): its schema,
//! its validation with precise errors, and its translation into the agent's
//! [`AgentConfig`]. The timing and policy sections use exactly the schema of the HAPair
//! spec and of the FloatingIP spec, with the same defaults, so a pair moves between the
//! two modes without translation.

use crate::config::{
    AgentConfig, AnnounceSchedule, ConfigError, KeySource, MemberConfig, ProbeConfig, QuorumConfig, SmSettings,
    VipConfig, WitnessConfig, build_sm_config, dur, health_checks, invalid, keyring, ms, parse_cidr, revision_of,
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
    /// Flap suspension (the HAPair `flapSuspension` schema); unset: the HAPair defaults,
    /// or with `apiServer:` [`CONTROL_PLANE_FLAP_MOVES`] moves (see docs/control-plane.md).
    #[serde(default)]
    pub flap_suspension: Option<FlapSuspensionSpec>,
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
    /// Routed VIPs: a ready standby advertises a backup path of each (as the HAPair's
    /// `bgpBackupPaths`; docs/bgp.md).
    #[serde(default)]
    pub bgp_backup_paths: bool,
    /// A virtual MAC that moves with the VIPs (as the HAPair's `virtualMAC`;
    /// docs/virtual-mac.md).
    #[serde(default, rename = "virtualMAC")]
    pub virtual_mac: Option<havip_crds::VirtualMacSpec>,
    /// Routes that follow the holder (as the HAPair's `routes`; docs/routes.md).
    #[serde(default)]
    pub routes: Vec<havip_crds::HolderRouteSpec>,
    /// Policy rules that follow the holder (as the HAPair's `rules`).
    #[serde(default)]
    pub rules: Vec<havip_crds::HolderRuleSpec>,
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
    /// The control-plane mode's arbitration: the members vote, a takeover needs a
    /// majority, and a holder without a majority gives the VIPs up (docs/control-plane.md).
    #[serde(default)]
    pub quorum: Option<StandaloneQuorum>,
    /// The control-plane mode's readiness gate: this node's kube-apiserver must answer
    /// `GET /readyz` over HTTPS (docs/control-plane.md).
    #[serde(default)]
    pub api_server: Option<StandaloneApiServer>,
}

/// Flap suspension's move count in control-plane mode (`apiServer:` set, `flapSuspension`
/// not): the schema's largest — in practice never.
pub const CONTROL_PLANE_FLAP_MOVES: i32 = 100;

/// The `apiServer:` section of the standalone file.
#[derive(Deserialize, Debug, Clone)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StandaloneApiServer {
    /// The API server's port on this node's address in each VIP's subnet.
    #[serde(default = "default_api_port")]
    pub port: u16,
    /// The readiness path.
    #[serde(default = "default_api_path")]
    pub path: String,
    /// The cluster CA (PEM) the API server's serving certificate is verified with.
    pub ca_file: PathBuf,
    /// A client certificate (PEM) for an API server that refuses anonymous `/readyz`.
    #[serde(default)]
    pub client_cert_file: Option<PathBuf>,
    /// Its key (PEM).
    #[serde(default)]
    pub client_key_file: Option<PathBuf>,
    /// The name the serving certificate must carry (default: the address asked).
    #[serde(default)]
    pub server_name: Option<String>,
    /// How often it is asked.
    #[serde(default = "default_api_interval")]
    pub interval: String,
    /// How long one answer may take.
    #[serde(default = "default_api_timeout")]
    pub timeout: String,
    /// A holder whose API server has not been ready for this long hands the VIPs to a
    /// member whose API server is.
    #[serde(default = "default_api_not_ready_for")]
    pub not_ready_for: String,
}

fn default_api_port() -> u16 {
    6443
}

fn default_api_path() -> String {
    "/readyz".to_owned()
}

fn default_api_interval() -> String {
    "200ms".to_owned()
}

fn default_api_timeout() -> String {
    "500ms".to_owned()
}

fn default_api_not_ready_for() -> String {
    "600ms".to_owned()
}

impl StandaloneApiServer {
    fn resolve(&self) -> Result<crate::config::ApiServerCheck, ConfigError> {
        if self.port == 0 {
            return Err(invalid("apiServer.port must be 1..=65535"));
        }
        if !self.path.starts_with('/') {
            return Err(invalid(format!("apiServer.path {:?} must start with /", self.path)));
        }
        let client = match (&self.client_cert_file, &self.client_key_file) {
            (Some(c), Some(k)) => Some((c.as_path(), k.as_path())),
            (None, None) => None,
            _ => return Err(invalid("apiServer: clientCertFile and clientKeyFile go together")),
        };
        let mut check =
            crate::probes::https::HttpsCheck::new(&self.path, &self.ca_file, client, self.server_name.as_deref())
                .map_err(|e| invalid(format!("apiServer: {e}")))?;
        check.timeout = dur("apiServer.timeout", &self.timeout)?;
        if check.timeout.is_zero() {
            return Err(invalid("apiServer.timeout must be positive"));
        }
        let interval = dur("apiServer.interval", &self.interval)?;
        if interval.is_zero() {
            return Err(invalid("apiServer.interval must be positive"));
        }
        Ok(crate::config::ApiServerCheck { port: self.port, check: std::sync::Arc::new(check), interval })
    }
}

/// The `quorum:` section of the standalone file.
#[derive(Deserialize, Debug, Clone)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StandaloneQuorum {
    /// UDP port of every member's voter, on its address on the first heartbeat path.
    #[serde(default = "default_quorum_port")]
    pub port: u16,
    /// A holder that no majority confirmed for this long gives the VIPs up.
    #[serde(default = "default_quorum_lease")]
    pub lease: String,
}

/// The default UDP port of the members' voters.
pub const QUORUM_PORT: u16 = 7948;

fn default_quorum_port() -> u16 {
    QUORUM_PORT
}

fn default_quorum_lease() -> String {
    "400ms".to_owned()
}

/// The member name under which the voters' key is derived from the heartbeat key (no
/// member can have it: node names are DNS labels).
const QUORUM_KEY_LABEL: &str = "\u{1}havip-quorum-voters";

impl StandaloneQuorum {
    /// Every member's voter on the first heartbeat path, the voters' key derived from the
    /// heartbeat key ring (it rotates with it), and the lease.
    fn resolve(
        &self,
        pair: &str,
        node: &str,
        members: &[MemberConfig],
        first_path: &str,
        heartbeat: &havip_crds::wire::Keyring,
    ) -> Result<QuorumConfig, ConfigError> {
        // Two members are allowed — a step while a control plane grows from one node to
        // three, one member at a time — but both are then needed (the daemon warns).
        if self.port == 0 {
            return Err(invalid("quorum.port must be 1..=65535"));
        }
        let lease = dur("quorum.lease", &self.lease)?;
        let mut voters = Vec::new();
        for m in members {
            let ip = m.addresses.get(first_path).ok_or_else(|| {
                invalid(format!("member {} has no address for heartbeat path {first_path:?}", m.node))
            })?;
            voters.push((m.node.clone(), SocketAddr::new(*ip, self.port)));
        }
        let listen = voters
            .iter()
            .find(|(n, _)| n == node)
            .map(|(_, a)| *a)
            .ok_or_else(|| invalid(format!("node {node:?} is not a member of pair {pair}")))?;
        let keys = havip_crds::witness::member_keyring(heartbeat, pair, QUORUM_KEY_LABEL);
        Ok(QuorumConfig { listen, voters, keys, lease })
    }
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
        if witness.is_some() && self.quorum.is_some() {
            return Err(invalid("witness and quorum: a pair is arbitrated by one or the other"));
        }
        let first_path = paths.first().cloned().unwrap_or_default();
        let api_server = self.api_server.as_ref().map(StandaloneApiServer::resolve).transpose()?;
        let quorum = match &self.quorum {
            Some(q) => Some(q.resolve(&self.pair, &node, &members, &first_path, &keys)?),
            None => None,
        };
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
        // A control-plane pair moves away from an API server that is not ready whenever a
        // ready one exists: suspending those moves after three would leave the VIP on a dead
        // API server (a rolling upgrade restarts every API server, and etcd, in turn).
        let flap = self.flap_suspension.clone().unwrap_or_else(|| match self.api_server {
            Some(_) => FlapSuspensionSpec { moves: CONTROL_PLANE_FLAP_MOVES, ..FlapSuspensionSpec::default() },
            None => FlapSuspensionSpec::default(),
        });
        let virtual_mac = self.virtual_mac.as_ref().map(crate::config::VirtualMac::from_spec).transpose()?;
        let (routes, rules) = crate::config::holder_routes(&self.routes, &self.rules)?;
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
            flap,
            // Every member must agree on whether takeovers need the witness's vote.
            witness.as_ref().map(|w| format!("|witness {}", w.address)).unwrap_or_default()
        ) + &quorum
            .as_ref()
            .map(|q| format!("|quorum {} {:?}", q.listen.port(), q.lease))
            .unwrap_or_default()
            + &self
                .api_server
                .as_ref()
                .map(|a| format!("|apiserver {} {} {} {} {}", a.port, a.path, a.interval, a.timeout, a.not_ready_for))
                .unwrap_or_default()
            + if self.profile.is_standard() { "" } else { "|profile fast" }
            + &if self.drain_timeout == havip_crds::defaults::DRAIN_TIMEOUT {
                String::new()
            } else {
                format!("|drain {}", self.drain_timeout)
            }
            // (Each only when set, so that a file without them keeps the revision that
            // members of earlier releases compute.)
            + &virtual_mac.map(|v| format!("|vmac {v:?}")).unwrap_or_default()
            + &if routes.is_empty() && rules.is_empty() {
                String::new()
            } else {
                format!("|routes {routes:?} {rules:?}")
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
            flap: &flap,
            drain_timeout: &self.drain_timeout,
            start_alone: self.start_alone,
            config_revision: revision_of(&canonical),
        })?;
        sm.lease_vote_required = witness.is_some() || quorum.is_some();
        if let (Some(a), Some(api)) = (&self.api_server, &api_server) {
            // The API server is every VIP's listener on its port; a holder whose API server
            // is not ready hands over after notReadyFor.
            for v in &mut sm.vips {
                if !v.probe_ports.contains(&api.port) && !v.health_ports.contains(&api.port) {
                    v.health_ports.push(api.port);
                }
            }
            sm.timings.listener_down_ms = ms("apiServer.notReadyFor", &a.not_ready_for)?;
        }
        if let Some(q) = &quorum {
            sm.quorum_lease_ms = Some(u64::try_from(q.lease.as_millis()).unwrap_or(u64::MAX));
            sm.validate().map_err(|e| invalid(format!("quorum.lease {:?}: {e}", q.lease)))?;
        }
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
            bgp_backup_paths: self.bgp_backup_paths,
            witness,
            quorum,
            api_server,
            virtual_mac,
            routes,
            rules,
        })
    }
}
