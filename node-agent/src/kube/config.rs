//! One pair's agent configuration from the cluster objects: the HAPair, its
//! FloatingIPs, the members' heartbeat addresses and the heartbeat-key Secret. Pure: the
//! caller passes what the watches and the kernel show, and gets a configuration or a
//! typed reason to wait. No I/O, no clock.
//!
//! Addresses: this node's own from its Node object (or, for an interface path, from the
//! kernel); a peer's from what the operator publishes in the pair's
//! `status.memberAddresses` (agents do not watch other Nodes), else from the peer's Node
//! when the caller has it (an agent that watches every Node while the operator has not
//! labelled its objects yet), and for an interface path from the peer's own
//! `status.members[].pathAddresses`.
//!
//! FloatingIPs the operator refuses are skipped here too, with the same rules: one whose
//! address an older FloatingIP uses ([`havip_crds::floatingip::address_conflicts`] over
//! every FloatingIP the agent sees), and one whose address is a member's heartbeat
//! address (a node's own address).
//!
//! Size: every rule that turns cluster objects into an agent configuration, pure and unit
//! tested in one place.

use crate::config::{
    AgentConfig, AnnounceSchedule, ConfigError, MemberConfig, ProbeConfig, SmSettings, VipConfig, build_sm_config,
    parse_cidr,
};
use crate::netlink::AddrInfo;
use havip_crds::wire::{Key, Keyring};
use havip_crds::{FloatingIP, HAPair, NodeAddressType};
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::ResourceExt;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

/// The name of a pair's key Secret (when the spec names none).
pub fn key_secret_name(pair: &str) -> String {
    format!("havip-{pair}-key")
}

/// Why a pair cannot run (yet) on this node.
#[derive(Debug, thiserror::Error)]
pub enum PairConfigError {
    /// The heartbeat key Secret is not in the agent's cache.
    #[error("heartbeat key Secret {namespace}/{name} not found (yet)")]
    SecretMissing {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// The heartbeat key Secret cannot be used.
    #[error("heartbeat key Secret {namespace}/{name}: {source}")]
    Secret {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// What is wrong with it.
        #[source]
        source: KeySecretError,
    },
    /// This node has no address on a heartbeat path of the `addressType` kind.
    #[error("no address of this node for heartbeat path {path}")]
    NoNodeAddress {
        /// The path.
        path: String,
    },
    /// This node has no usable address on the interface of a heartbeat path.
    #[error("no usable address on interface {interface} of this node for heartbeat path {path}")]
    NoInterfaceAddress {
        /// The interface.
        interface: String,
        /// The path.
        path: String,
    },
    /// A member's priority does not fit the heartbeat's one byte.
    #[error("member {node}: priority {priority} out of range")]
    Priority {
        /// The member.
        node: String,
        /// Its priority.
        priority: i32,
    },
    /// A FloatingIP of the pair cannot be used.
    #[error("FloatingIP {name}: {source}")]
    FloatingIp {
        /// The FloatingIP.
        name: String,
        /// What is wrong with it.
        #[source]
        source: ConfigError,
    },
    /// `heartbeat.port` is not a port.
    #[error("heartbeat.port {port} out of range")]
    HeartbeatPort {
        /// The value.
        port: i32,
    },
    /// The timings and policies do not make a valid state machine configuration.
    #[error(transparent)]
    Settings(#[from] ConfigError),
}

/// What is wrong with a key Secret.
#[derive(Debug, thiserror::Error)]
pub enum KeySecretError {
    /// No `data` at all.
    #[error("it has no data")]
    NoData,
    /// No `key` entry.
    #[error("it has no `key`")]
    NoKey,
    /// `keyId` or `previousKeyId` is not a number.
    #[error("{field} is not a number")]
    BadId {
        /// `keyId` or `previousKeyId`.
        field: &'static str,
    },
    /// `key` or `previousKey` is not a usable hex key.
    #[error("{field}: {source}")]
    BadKey {
        /// `key` or `previousKey`.
        field: &'static str,
        /// Why.
        #[source]
        source: ConfigError,
    },
}

/// What the agent sees of the cluster and of its own node, besides the pair.
#[derive(Clone, Copy)]
pub struct ClusterView<'a> {
    /// This node.
    pub node: &'a str,
    /// The operator namespace (where the key Secrets are).
    pub namespace: &'a str,
    /// The Nodes the agent sees: its own (always, once listed), every other one only
    /// while it watches them all.
    pub nodes: &'a [Arc<Node>],
    /// Every FloatingIP the agent sees (of every pair), for the address conflicts.
    pub fips: &'a [&'a FloatingIP],
    /// The Secrets of the operator namespace.
    pub secrets: &'a [Arc<Secret>],
    /// This node's address on each interface named by an `interface:` heartbeat path
    /// (read from the kernel, see [`pick_path_address`]).
    pub local_interfaces: &'a BTreeMap<String, IpAddr>,
}

/// The FloatingIPs of `pair` that the agent sees and does not configure, with why: the
/// operator refuses them (and does not hand them to the agents; this is the defense in
/// depth should one reach the agent anyway).
pub fn skipped_floating_ips(pair: &HAPair, view: &ClusterView<'_>) -> BTreeMap<String, String> {
    let name = pair.name_any();
    let conflicts = havip_crds::floatingip::address_conflicts(view.fips.iter().copied());
    let own: Vec<IpAddr> = member_table(pair, view).values().flat_map(|a| a.values().copied()).collect();
    let mut out = BTreeMap::new();
    for f in view.fips.iter().filter(|f| f.spec.pair == name) {
        let fname = f.name_any();
        if let Some(holder) = conflicts.get(&fname) {
            out.insert(fname, format!("address {} is used by the older FloatingIP {holder}", f.spec.address));
        } else if let Some(a) = havip_crds::floatingip::vip_address(&f.spec.address).filter(|a| own.contains(a)) {
            out.insert(fname, format!("address {a} is a member's own heartbeat address"));
        }
    }
    out
}

/// Each member's address per heartbeat path (`node → path → address`), as far as known:
/// see the module documentation for where each comes from.
fn member_table(pair: &HAPair, view: &ClusterView<'_>) -> BTreeMap<String, BTreeMap<String, IpAddr>> {
    let spec = &pair.spec;
    let status = pair.status.as_ref();
    let reported: BTreeMap<&str, BTreeMap<&str, &str>> = status
        .iter()
        .flat_map(|s| &s.members)
        .map(|m| (m.node.as_str(), m.path_addresses.iter().map(|a| (a.path.as_str(), a.address.as_str())).collect()))
        .collect();
    let mut out = BTreeMap::new();
    for m in &spec.members {
        let node = view.nodes.iter().find(|n| n.name_any() == m.node);
        let local = m.node == view.node;
        let mut addresses = BTreeMap::new();
        for p in &spec.heartbeat.paths {
            let addr = match (&p.address_type, &p.interface) {
                (Some(t), _) if local => node.and_then(|n| node_address(n, *t)),
                (Some(t), _) => status
                    .and_then(|s| s.member_address(&m.node, &p.name))
                    .and_then(|a| a.parse().ok())
                    .or_else(|| node.and_then(|n| node_address(n, *t))),
                (None, Some(ifname)) if local => view.local_interfaces.get(ifname).copied(),
                (None, Some(_)) => {
                    reported.get(m.node.as_str()).and_then(|r| r.get(p.name.as_str())).and_then(|a| a.parse().ok())
                }
                (None, None) => None,
            };
            if let Some(a) = addr {
                addresses.insert(p.name.clone(), a);
            }
        }
        out.insert(m.node.clone(), addresses);
    }
    out
}

/// A pair's configuration (or why it has none) and the FloatingIPs it skips, each with
/// the reason.
pub(super) type PairConfigs = (Result<AgentConfig, PairConfigError>, BTreeMap<String, String>);

/// Builds the agent configuration of `pair` from the FloatingIPs naming it (less those
/// [`skipped_floating_ips`] names) and the rest of `view`.
pub fn agent_config(pair: &HAPair, view: &ClusterView<'_>) -> Result<AgentConfig, PairConfigError> {
    let name = pair.name_any();
    let spec = &pair.spec;
    let paths: Vec<String> = spec.heartbeat.paths.iter().map(|p| p.name.clone()).collect();
    let mut table = member_table(pair, view);
    let mut members = Vec::new();
    let mut addr_table: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for m in &spec.members {
        let addresses = table.remove(&m.node).unwrap_or_default();
        // A peer without an address on a path is heard on the others; this node cannot
        // run the pair without its own.
        if m.node == view.node
            && let Some(p) = spec.heartbeat.paths.iter().find(|p| !addresses.contains_key(&p.name))
        {
            return Err(match &p.interface {
                Some(i) => PairConfigError::NoInterfaceAddress { interface: i.clone(), path: p.name.clone() },
                None => PairConfigError::NoNodeAddress { path: p.name.clone() },
            });
        }
        addr_table.insert(m.node.clone(), addresses.iter().map(|(k, v)| (k.clone(), v.to_string())).collect());
        let priority = u8::try_from(m.priority)
            .map_err(|_| PairConfigError::Priority { node: m.node.clone(), priority: m.priority })?;
        members.push(MemberConfig { node: m.node.clone(), priority, addresses });
    }
    let keys = pair_keys(pair, view)?;
    let mut vips = Vec::new();
    let mut fip_specs = BTreeMap::new();
    let skipped = skipped_floating_ips(pair, view);
    for f in view.fips.iter().filter(|f| f.spec.pair == name && !skipped.contains_key(&f.name_any())) {
        let fip_error = |source| PairConfigError::FloatingIp { name: f.name_any(), source };
        let (addr, prefix) = parse_cidr(&f.spec.address).map_err(fip_error)?;
        vips.push(VipConfig {
            id: f.name_any(),
            addr,
            prefix,
            interface: f.spec.interface.clone(),
            probe_ports: f.spec.probe.ports.iter().filter_map(|p| u16::try_from(*p).ok()).collect(),
            health_checks: crate::config::health_checks(&f.spec.probe.health_checks).map_err(fip_error)?,
            announce: AnnounceSchedule::from_spec(&f.spec.announce, spec.announce_mode).map_err(fip_error)?,
        });
        fip_specs.insert(f.name_any(), f.spec.clone());
    }
    vips.sort_by(|a, b| a.id.cmp(&b.id));
    let revision = havip_crds::revision::config_revision(spec, &fip_specs, &addr_table);
    // The timings in force: the profile's where the spec leaves the defaults.
    let (mut hb_interval, mut hb_timeout, mut takeover) =
        (spec.heartbeat.interval.clone(), spec.heartbeat.timeout.clone(), spec.takeover.clone());
    spec.profile.apply(&mut hb_interval, &mut hb_timeout, &mut takeover);
    let mut sm = build_sm_config(&SmSettings {
        node: view.node,
        members: &members,
        paths: &paths,
        vips: &vips,
        heartbeat_interval: &hb_interval,
        heartbeat_timeout: &hb_timeout,
        takeover: &takeover,
        failback: &spec.failback,
        flap: &spec.flap_suspension,
        drain_timeout: &spec.drain_timeout,
        start_alone: false,
        config_revision: revision,
    })?;
    // The chart's Lease policy refuses an agent's write that raises the epoch further.
    sm.lease_max_step = Some(crate::sm::MAX_LEASE_STEP);
    let duration = |field: &str, value: &str| {
        havip_crds::duration::parse_duration(value)
            .map_err(|source| ConfigError::Duration { field: field.into(), source })
    };
    let probe = ProbeConfig {
        interval: duration("takeover.probeInterval", &takeover.probe_interval)?,
        timeout: duration("takeover.probeTimeout", &takeover.probe_timeout)?,
        // The schema refuses anything but IP addresses here.
        fence_targets: spec.takeover.fence_targets.iter().filter_map(|t| t.parse().ok()).collect(),
    };
    let heartbeat_port =
        u16::try_from(spec.heartbeat.port).map_err(|_| PairConfigError::HeartbeatPort { port: spec.heartbeat.port })?;
    let virtual_mac = spec.virtual_mac.as_ref().map(crate::config::VirtualMac::from_spec).transpose()?;
    let (routes, rules) = crate::config::holder_routes(&spec.routes, &spec.rules)?;
    Ok(AgentConfig {
        quorum: None,
        api_server: None,
        pair: name,
        node: view.node.to_owned(),
        members,
        paths,
        heartbeat_port,
        keys,
        vips,
        probe,
        sm,
        paused: spec.paused,
        bgp_backup_paths: spec.bgp_backup_paths,
        witness: None,
        virtual_mac,
        routes,
        rules,
    })
}

/// The Secret the pair names (`keySecretRef`), or its own key Secret.
pub fn pair_key_secret<'a>(pair: &HAPair, view: &ClusterView<'a>) -> Result<&'a Arc<Secret>, PairConfigError> {
    let (name, namespace) = match &pair.spec.heartbeat.key_secret_ref {
        Some(r) => (r.name.clone(), r.namespace.clone().unwrap_or_else(|| view.namespace.to_owned())),
        None => (key_secret_name(&pair.name_any()), view.namespace.to_owned()),
    };
    view.secrets
        .iter()
        .find(|s| s.name_any() == name && s.namespace().as_deref() == Some(namespace.as_str()))
        .ok_or(PairConfigError::SecretMissing { namespace, name })
}

/// The keyring of the pair's key Secret.
fn pair_keys(pair: &HAPair, view: &ClusterView<'_>) -> Result<Keyring, PairConfigError> {
    let secret = pair_key_secret(pair, view)?;
    let namespace = secret.namespace().unwrap_or_default();
    let name = secret.name_any();
    keyring_from_secret(secret).map_err(|source| PairConfigError::Secret { namespace, name, source })
}

fn node_address(node: &Node, t: NodeAddressType) -> Option<IpAddr> {
    let want = match t {
        NodeAddressType::InternalIP => "InternalIP",
        NodeAddressType::ExternalIP => "ExternalIP",
    };
    let addrs: Vec<IpAddr> = node
        .status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .filter(|a| a.type_ == want)
        .filter_map(|a| a.address.parse().ok())
        .collect();
    addrs.iter().find(|a| a.is_ipv4()).or(addrs.first()).copied()
}

/// The keyring held in a key Secret (`key`/`keyId`, and `previousKey`/`previousKeyId`
/// during a rotation).
pub fn keyring_from_secret(s: &Secret) -> Result<Keyring, KeySecretError> {
    let data = s.data.as_ref().ok_or(KeySecretError::NoData)?;
    let text = |k: &str| data.get(k).map(|b| String::from_utf8_lossy(&b.0).trim().to_owned());
    let key = text("key").ok_or(KeySecretError::NoKey)?;
    let id: u32 =
        text("keyId").unwrap_or_else(|| "1".into()).parse().map_err(|_| KeySecretError::BadId { field: "keyId" })?;
    let secret =
        crate::config::parse_hex_key(&key).map_err(|source| KeySecretError::BadKey { field: "key", source })?;
    let previous = match (text("previousKey"), text("previousKeyId")) {
        (Some(k), Some(i)) if !k.is_empty() => Some(Key {
            id: i.parse().map_err(|_| KeySecretError::BadId { field: "previousKeyId" })?,
            secret: crate::config::parse_hex_key(&k)
                .map_err(|source| KeySecretError::BadKey { field: "previousKey", source })?,
        }),
        _ => None,
    };
    Ok(Keyring { current: Key { id, secret }, previous })
}

/// The address a heartbeat path uses on an interface: the first IPv4 address, else the
/// first global IPv6 address — never a VIP (havip's own), a link-local or a tentative
/// or DAD-failed address.
pub fn pick_path_address<'a>(addrs: impl Iterator<Item = &'a AddrInfo>) -> Option<IpAddr> {
    let usable: Vec<IpAddr> = addrs
        .filter(|a| !a.is_havip() && !a.tentative && !a.dad_failed)
        .map(|a| a.addr)
        .filter(|ip| match ip {
            IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_link_local(),
            IpAddr::V6(v6) => !v6.is_loopback() && !v6.is_unicast_link_local(),
        })
        .collect();
    usable.iter().find(|ip| ip.is_ipv4()).or_else(|| usable.first()).copied()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::{ClusterView, KeySecretError, PairConfigError, agent_config, pick_path_address, skipped_floating_ips};
    use crate::config::AgentConfig;
    use crate::netlink::AddrInfo;
    use havip_crds::{FloatingIP, HAPair};
    use k8s_openapi::api::core::v1::{Node, Secret};
    use std::collections::BTreeMap;
    use std::net::IpAddr;
    use std::sync::Arc;

    const KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    fn pair(paths: serde_json::Value, status: serde_json::Value) -> HAPair {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "havip.io/v1alpha1", "kind": "HAPair",
            "metadata": {"name": "web"},
            "spec": {
                "members": [{"node": "a", "priority": 200}, {"node": "b", "priority": 100}],
                "heartbeat": {"paths": paths},
            },
            "status": status,
        }))
        .expect("pair")
    }

    fn internal_pair() -> HAPair {
        pair(serde_json::json!([{"name": "internal", "addressType": "InternalIP"}]), serde_json::json!({}))
    }

    fn node(name: &str, internal: Option<&str>) -> Arc<Node> {
        let addresses: Vec<_> =
            internal.iter().map(|a| serde_json::json!({"type": "InternalIP", "address": a})).collect();
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "status": {"addresses": addresses},
            }))
            .expect("node"),
        )
    }

    fn secret(name: &str, namespace: &str, key: &str) -> Arc<Secret> {
        let mut data = BTreeMap::new();
        data.insert("key".to_owned(), k8s_openapi::ByteString(key.as_bytes().to_vec()));
        data.insert("keyId".to_owned(), k8s_openapi::ByteString(b"3".to_vec()));
        let mut s: Secret =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name, "namespace": namespace}}))
                .expect("secret");
        s.data = Some(data);
        Arc::new(s)
    }

    fn fip(name: &str, address: &str) -> FloatingIP {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "havip.io/v1alpha1", "kind": "FloatingIP",
            "metadata": {"name": name},
            "spec": {"pair": "web", "address": address},
        }))
        .expect("fip")
    }

    struct World {
        nodes: Vec<Arc<Node>>,
        secrets: Vec<Arc<Secret>>,
        interfaces: BTreeMap<String, IpAddr>,
    }

    impl World {
        fn new() -> World {
            World {
                nodes: vec![node("a", Some("10.0.0.1")), node("b", Some("10.0.0.2"))],
                secrets: vec![secret("havip-web-key", "havip-system", KEY)],
                interfaces: BTreeMap::new(),
            }
        }
        fn view(&self) -> ClusterView<'_> {
            ClusterView {
                node: "a",
                namespace: "havip-system",
                nodes: &self.nodes,
                fips: &[],
                secrets: &self.secrets,
                local_interfaces: &self.interfaces,
            }
        }
    }

    /// `agent_config` of `pair` with `fips` as every FloatingIP the agent sees.
    fn config(w: &World, pair: &HAPair, fips: &[FloatingIP]) -> Result<AgentConfig, PairConfigError> {
        let refs: Vec<&FloatingIP> = fips.iter().collect();
        let mut view = w.view();
        view.fips = &refs;
        agent_config(pair, &view)
    }

    #[test]
    fn a_pair_with_its_secret_and_addresses_is_configured() {
        let w = World::new();
        let cfg = config(&w, &internal_pair(), &[fip("vip", "192.0.2.10/24")]).expect("config");
        assert_eq!((cfg.pair.as_str(), cfg.node.as_str()), ("web", "a"));
        assert_eq!(cfg.keys.current.id, 3);
        let b = cfg.members.iter().find(|m| m.node == "b").expect("b");
        assert_eq!(b.addresses.get("internal"), Some(&"10.0.0.2".parse().expect("ip")));
        assert_eq!(cfg.vips.len(), 1);
        assert_eq!(cfg.vips[0].addr, "192.0.2.10".parse::<IpAddr>().expect("ip"));
    }

    #[test]
    fn a_floating_ips_announce_mode_defaults_to_its_pairs() {
        use havip_crds::AnnounceMode;
        let w = World::new();
        let mut routed = fip("own", "203.0.113.11/32");
        routed.spec.announce.mode = Some(AnnounceMode::L2);
        let fips = [fip("vip", "203.0.113.10/32"), routed];
        let modes = |pair: &HAPair| -> Vec<(String, AnnounceMode)> {
            let cfg = config(&w, pair, &fips).expect("config");
            cfg.vips.iter().map(|v| (v.id.clone(), v.announce.mode)).collect()
        };
        let plain = internal_pair();
        assert_eq!(modes(&plain), [("own".into(), AnnounceMode::L2), ("vip".into(), AnnounceMode::L2)]);
        let mut bgp = internal_pair();
        bgp.spec.announce_mode = AnnounceMode::BGP;
        assert_eq!(
            modes(&bgp),
            [("own".into(), AnnounceMode::L2), ("vip".into(), AnnounceMode::BGP)],
            "the pair's default, unless the FloatingIP names its own"
        );
        // A pair's default changes its configuration revision (the agents reconfigure);
        // the default itself is not written, so upgraded pairs keep theirs.
        let rev = |p: &HAPair| config(&w, p, &fips).expect("config").sm.config_revision;
        assert_ne!(rev(&plain), rev(&bgp));
        assert!(serde_json::to_value(&plain.spec).expect("json").get("announceMode").is_none());
    }

    #[test]
    fn a_missing_secret_is_waited_for() {
        let mut w = World::new();
        w.secrets = vec![secret("havip-web-key", "elsewhere", KEY)];
        let e = config(&w, &internal_pair(), &[]).expect_err("no secret");
        assert!(
            matches!(&e, PairConfigError::SecretMissing { namespace, name }
            if namespace == "havip-system" && name == "havip-web-key"),
            "{e}"
        );
        w.secrets = vec![secret("havip-web-key", "havip-system", "not hex")];
        let e = config(&w, &internal_pair(), &[]).expect_err("bad key");
        assert!(
            matches!(&e, PairConfigError::Secret { source: KeySecretError::BadKey { field: "key", .. }, .. }),
            "{e}"
        );
    }

    #[test]
    fn this_node_needs_its_own_address_a_peer_does_not() {
        let mut w = World::new();
        w.nodes = vec![node("a", None), node("b", Some("10.0.0.2"))];
        let e = config(&w, &internal_pair(), &[]).expect_err("no own address");
        assert!(matches!(&e, PairConfigError::NoNodeAddress { path } if path == "internal"), "{e}");
        // The peer's missing Node leaves it without an address on the path; the pair runs.
        w.nodes = vec![node("a", Some("10.0.0.1"))];
        let cfg = config(&w, &internal_pair(), &[]).expect("config");
        assert!(cfg.members.iter().find(|m| m.node == "b").expect("b").addresses.is_empty());
    }

    #[test]
    fn interface_paths_use_the_own_kernel_address_and_the_peers_published_one() {
        let p = pair(
            serde_json::json!([{"name": "mgmt", "interface": "eth1"}]),
            serde_json::json!({"members": [{"node": "b", "pathAddresses": [{"path": "mgmt", "address": "172.16.0.2"}]}]}),
        );
        let mut w = World::new();
        let e = config(&w, &p, &[]).expect_err("no eth1 address");
        assert!(
            matches!(&e, PairConfigError::NoInterfaceAddress { interface, path }
            if interface == "eth1" && path == "mgmt"),
            "{e}"
        );
        w.interfaces.insert("eth1".to_owned(), "172.16.0.1".parse().expect("ip"));
        let cfg = config(&w, &p, &[]).expect("config");
        let addr = |n: &str| cfg.members.iter().find(|m| m.node == n).and_then(|m| m.addresses.get("mgmt")).copied();
        assert_eq!(addr("a"), Some("172.16.0.1".parse().expect("ip")));
        assert_eq!(addr("b"), Some("172.16.0.2".parse().expect("ip")));
    }

    #[test]
    fn a_bad_floating_ip_address_names_the_floating_ip() {
        let w = World::new();
        let e = config(&w, &internal_pair(), &[fip("broken", "192.0.2.300/24")]).expect_err("bad");
        assert!(matches!(&e, PairConfigError::FloatingIp { name, .. } if name == "broken"), "{e}");
        assert!(e.to_string().contains("not an IP address"), "{e}");
    }

    fn fip_at(name: &str, pair: &str, address: &str, created: &str) -> FloatingIP {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "havip.io/v1alpha1", "kind": "FloatingIP",
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": {"pair": pair, "address": address},
        }))
        .expect("fip")
    }

    #[test]
    fn peers_addresses_come_from_the_published_status_else_from_their_node() {
        let published = pair(
            serde_json::json!([{"name": "internal", "addressType": "InternalIP"}]),
            serde_json::json!({"memberAddresses": [
                {"node": "a", "paths": [{"path": "internal", "address": "10.9.9.9"}]},
                {"node": "b", "paths": [{"path": "internal", "address": "10.0.0.22"}]},
            ]}),
        );
        let mut w = World::new();
        // Only its own Node, as an agent that watches nothing else.
        w.nodes = vec![node("a", Some("10.0.0.1"))];
        let cfg = config(&w, &published, &[]).expect("config");
        let addr = |c: &AgentConfig, n: &str| {
            c.members.iter().find(|m| m.node == n).and_then(|m| m.addresses.get("internal")).copied()
        };
        assert_eq!(addr(&cfg, "b"), Some("10.0.0.22".parse().expect("ip")), "the published address");
        assert_eq!(addr(&cfg, "a"), Some("10.0.0.1".parse().expect("ip")), "its own from its own Node");
        // Nothing published (an operator that does not publish yet): the peer's Node,
        // when the agent watches it.
        w.nodes = vec![node("a", Some("10.0.0.1")), node("b", Some("10.0.0.2"))];
        let cfg = config(&w, &internal_pair(), &[]).expect("config");
        assert_eq!(addr(&cfg, "b"), Some("10.0.0.2".parse().expect("ip")));
        // The revision covers the addresses: a moved peer is a new revision.
        let moved = config(&w, &published, &[]).expect("config");
        assert_ne!(moved.sm.config_revision, cfg.sm.config_revision);
    }

    #[test]
    fn a_floating_ip_whose_address_an_older_one_holds_is_skipped_deterministically() {
        let w = World::new();
        let old_other_pair = fip_at("db-vip", "db", "192.0.2.10/32", "2026-01-01T00:00:00Z");
        let new_own = fip_at("web-dup", "web", "192.0.2.10/24", "2026-01-02T00:00:00Z");
        let own = fip_at("web-vip", "web", "192.0.2.11/24", "2026-01-03T00:00:00Z");
        let skipped = {
            let fips = [old_other_pair.clone(), new_own.clone(), own.clone()];
            let refs: Vec<&FloatingIP> = fips.iter().collect();
            let mut view = w.view();
            view.fips = &refs;
            skipped_floating_ips(&internal_pair(), &view)
        };
        assert_eq!(skipped.keys().collect::<Vec<_>>(), ["web-dup"], "{skipped:?}");
        let cfg = config(&w, &internal_pair(), &[old_other_pair.clone(), new_own.clone(), own.clone()]).expect("cfg");
        assert_eq!(cfg.vips.iter().map(|v| v.id.as_str()).collect::<Vec<_>>(), ["web-vip"]);
        // The same configuration (and revision) as if the refused one did not exist, which
        // is what the operator's revision counts.
        let without = config(&w, &internal_pair(), &[old_other_pair, own.clone()]).expect("cfg");
        assert_eq!(cfg.sm.config_revision, without.sm.config_revision);
        // The older of two in the same pair is kept whatever the order.
        let older_own = fip_at("web-z", "web", "192.0.2.11/24", "2025-12-31T00:00:00Z");
        let cfg = config(&w, &internal_pair(), &[own, older_own]).expect("cfg");
        assert_eq!(cfg.vips.iter().map(|v| v.id.as_str()).collect::<Vec<_>>(), ["web-z"]);
    }

    #[test]
    fn a_floating_ip_on_a_members_own_address_is_skipped() {
        let w = World::new();
        let cfg = config(&w, &internal_pair(), &[fip("peer-ip", "10.0.0.2/24"), fip("vip", "192.0.2.10/24")])
            .expect("config");
        assert_eq!(cfg.vips.iter().map(|v| v.id.as_str()).collect::<Vec<_>>(), ["vip"]);
    }

    fn a(addr: &str, label: Option<&str>) -> AddrInfo {
        AddrInfo {
            ifindex: 3,
            addr: addr.parse().expect("ip"),
            prefix: 24,
            label: label.map(str::to_owned),
            proto: None,
            dad_failed: false,
            tentative: false,
            deprecated: false,
        }
    }

    #[test]
    fn interface_path_address_skips_vips_link_local_and_prefers_ipv4() {
        let addrs = [
            a("fe80::1", None),
            a("2001:db8::5", None),
            a("192.0.2.10", Some("eth1:hv")),
            a("169.254.3.3", None),
            a("10.0.1.7", None),
        ];
        assert_eq!(pick_path_address(addrs.iter()), Some("10.0.1.7".parse().expect("ip")));
        assert_eq!(pick_path_address(addrs[..2].iter()), Some("2001:db8::5".parse().expect("ip")));
        let mut tentative = a("2001:db8::9", None);
        tentative.tentative = true;
        assert_eq!(pick_path_address([tentative].iter()), None);
        assert_eq!(pick_path_address([a("192.0.2.10", Some("eth1:hv"))].iter()), None);
    }
}
