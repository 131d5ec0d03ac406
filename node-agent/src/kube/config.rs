//! One pair's agent configuration from the cluster objects: the HAPair, its
//! FloatingIPs, the members' Node addresses (or, for interface paths, this node's own
//! address and the peers' published ones) and the heartbeat-key Secret. Pure: the
//! caller passes what the watches and the kernel show, and gets a configuration or a
//! typed reason to wait. No I/O, no clock.

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
    /// The Nodes.
    pub nodes: &'a [Arc<Node>],
    /// The Secrets of the operator namespace.
    pub secrets: &'a [Arc<Secret>],
    /// This node's address on each interface named by an `interface:` heartbeat path
    /// (read from the kernel, see [`pick_path_address`]).
    pub local_interfaces: &'a BTreeMap<String, IpAddr>,
}

/// Builds the agent configuration of `pair` (with `fips`, the FloatingIPs naming it).
///
/// The peers' addresses on `interface:` paths come from their
/// `status.members[].pathAddresses`; this node's from [`ClusterView::local_interfaces`].
pub fn agent_config(
    pair: &HAPair,
    fips: &[FloatingIP],
    view: &ClusterView<'_>,
) -> Result<AgentConfig, PairConfigError> {
    let name = pair.name_any();
    let spec = &pair.spec;
    let paths: Vec<String> = spec.heartbeat.paths.iter().map(|p| p.name.clone()).collect();
    // What each member published for its interface paths.
    let reported: BTreeMap<&str, BTreeMap<&str, &str>> = pair
        .status
        .iter()
        .flat_map(|s| &s.members)
        .map(|m| (m.node.as_str(), m.path_addresses.iter().map(|a| (a.path.as_str(), a.address.as_str())).collect()))
        .collect();
    let mut members = Vec::new();
    let mut addr_table: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for m in &spec.members {
        let node = view.nodes.iter().find(|n| n.name_any() == m.node);
        let local = m.node == view.node;
        let mut addresses = BTreeMap::new();
        for p in &spec.heartbeat.paths {
            let addr = match (&p.address_type, &p.interface) {
                (Some(t), _) => node.and_then(|n| node_address(n, *t)),
                (None, Some(ifname)) if local => view.local_interfaces.get(ifname).copied(),
                (None, Some(_)) => {
                    reported.get(m.node.as_str()).and_then(|r| r.get(p.name.as_str())).and_then(|a| a.parse().ok())
                }
                (None, None) => None,
            };
            match (addr, &p.interface) {
                (Some(a), _) => {
                    addresses.insert(p.name.clone(), a);
                }
                // A peer without an address on a path is heard on the others; this
                // node cannot run the pair without its own.
                (None, _) if !local => {}
                (None, Some(i)) => {
                    return Err(PairConfigError::NoInterfaceAddress { interface: i.clone(), path: p.name.clone() });
                }
                (None, None) => return Err(PairConfigError::NoNodeAddress { path: p.name.clone() }),
            }
        }
        addr_table.insert(m.node.clone(), addresses.iter().map(|(k, v)| (k.clone(), v.to_string())).collect());
        let priority = u8::try_from(m.priority)
            .map_err(|_| PairConfigError::Priority { node: m.node.clone(), priority: m.priority })?;
        members.push(MemberConfig { node: m.node.clone(), priority, addresses });
    }
    let keys = pair_keys(pair, view)?;
    let mut vips = Vec::new();
    let mut fip_specs = BTreeMap::new();
    for f in fips {
        let fip_error = |source| PairConfigError::FloatingIp { name: f.name_any(), source };
        let (addr, prefix) = parse_cidr(&f.spec.address).map_err(fip_error)?;
        vips.push(VipConfig {
            id: f.name_any(),
            addr,
            prefix,
            interface: f.spec.interface.clone(),
            probe_ports: f.spec.probe.ports.iter().filter_map(|p| u16::try_from(*p).ok()).collect(),
            announce: AnnounceSchedule::from_spec(&f.spec.announce).map_err(fip_error)?,
        });
        fip_specs.insert(f.name_any(), f.spec.clone());
    }
    vips.sort_by(|a, b| a.id.cmp(&b.id));
    let revision = havip_crds::revision::config_revision(spec, &fip_specs, &addr_table);
    let sm = build_sm_config(&SmSettings {
        node: view.node,
        members: &members,
        paths: &paths,
        vips: &vips,
        heartbeat_interval: &spec.heartbeat.interval,
        heartbeat_timeout: &spec.heartbeat.timeout,
        takeover: &spec.takeover,
        failback: &spec.failback,
        flap: &spec.flap_suspension,
        start_alone: false,
        config_revision: revision,
    })?;
    let duration = |field: &str, value: &str| {
        havip_crds::duration::parse_duration(value)
            .map_err(|source| ConfigError::Duration { field: field.into(), source })
    };
    let probe = ProbeConfig {
        interval: duration("takeover.probeInterval", &spec.takeover.probe_interval)?,
        timeout: duration("takeover.probeTimeout", &spec.takeover.probe_timeout)?,
        // The schema refuses anything but IP addresses here.
        fence_targets: spec.takeover.fence_targets.iter().filter_map(|t| t.parse().ok()).collect(),
    };
    let heartbeat_port =
        u16::try_from(spec.heartbeat.port).map_err(|_| PairConfigError::HeartbeatPort { port: spec.heartbeat.port })?;
    Ok(AgentConfig {
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
    })
}

/// The keyring of the Secret the pair names (`keySecretRef`), or of its own key Secret.
fn pair_keys(pair: &HAPair, view: &ClusterView<'_>) -> Result<Keyring, PairConfigError> {
    let (name, namespace) = match &pair.spec.heartbeat.key_secret_ref {
        Some(r) => (r.name.clone(), r.namespace.clone().unwrap_or_else(|| view.namespace.to_owned())),
        None => (key_secret_name(&pair.name_any()), view.namespace.to_owned()),
    };
    let secret = view
        .secrets
        .iter()
        .find(|s| s.name_any() == name && s.namespace().as_deref() == Some(namespace.as_str()))
        .ok_or_else(|| PairConfigError::SecretMissing { namespace: namespace.clone(), name: name.clone() })?;
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
    use super::*;

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
                secrets: &self.secrets,
                local_interfaces: &self.interfaces,
            }
        }
    }

    #[test]
    fn a_pair_with_its_secret_and_addresses_is_configured() {
        let w = World::new();
        let cfg = agent_config(&internal_pair(), &[fip("vip", "192.0.2.10/24")], &w.view()).expect("config");
        assert_eq!((cfg.pair.as_str(), cfg.node.as_str()), ("web", "a"));
        assert_eq!(cfg.keys.current.id, 3);
        let b = cfg.members.iter().find(|m| m.node == "b").expect("b");
        assert_eq!(b.addresses.get("internal"), Some(&"10.0.0.2".parse().expect("ip")));
        assert_eq!(cfg.vips.len(), 1);
        assert_eq!(cfg.vips[0].addr, "192.0.2.10".parse::<IpAddr>().expect("ip"));
    }

    #[test]
    fn a_missing_secret_is_waited_for() {
        let mut w = World::new();
        w.secrets = vec![secret("havip-web-key", "elsewhere", KEY)];
        let e = agent_config(&internal_pair(), &[], &w.view()).expect_err("no secret");
        assert!(
            matches!(&e, PairConfigError::SecretMissing { namespace, name }
            if namespace == "havip-system" && name == "havip-web-key"),
            "{e}"
        );
        w.secrets = vec![secret("havip-web-key", "havip-system", "not hex")];
        let e = agent_config(&internal_pair(), &[], &w.view()).expect_err("bad key");
        assert!(
            matches!(&e, PairConfigError::Secret { source: KeySecretError::BadKey { field: "key", .. }, .. }),
            "{e}"
        );
    }

    #[test]
    fn this_node_needs_its_own_address_a_peer_does_not() {
        let mut w = World::new();
        w.nodes = vec![node("a", None), node("b", Some("10.0.0.2"))];
        let e = agent_config(&internal_pair(), &[], &w.view()).expect_err("no own address");
        assert!(matches!(&e, PairConfigError::NoNodeAddress { path } if path == "internal"), "{e}");
        // The peer's missing Node leaves it without an address on the path; the pair runs.
        w.nodes = vec![node("a", Some("10.0.0.1"))];
        let cfg = agent_config(&internal_pair(), &[], &w.view()).expect("config");
        assert!(cfg.members.iter().find(|m| m.node == "b").expect("b").addresses.is_empty());
    }

    #[test]
    fn interface_paths_use_the_own_kernel_address_and_the_peers_published_one() {
        let p = pair(
            serde_json::json!([{"name": "mgmt", "interface": "eth1"}]),
            serde_json::json!({"members": [{"node": "b", "pathAddresses": [{"path": "mgmt", "address": "172.16.0.2"}]}]}),
        );
        let mut w = World::new();
        let e = agent_config(&p, &[], &w.view()).expect_err("no eth1 address");
        assert!(
            matches!(&e, PairConfigError::NoInterfaceAddress { interface, path }
            if interface == "eth1" && path == "mgmt"),
            "{e}"
        );
        w.interfaces.insert("eth1".to_owned(), "172.16.0.1".parse().expect("ip"));
        let cfg = agent_config(&p, &[], &w.view()).expect("config");
        let addr = |n: &str| cfg.members.iter().find(|m| m.node == n).and_then(|m| m.addresses.get("mgmt")).copied();
        assert_eq!(addr("a"), Some("172.16.0.1".parse().expect("ip")));
        assert_eq!(addr("b"), Some("172.16.0.2".parse().expect("ip")));
    }

    #[test]
    fn a_bad_floating_ip_address_names_the_floating_ip() {
        let w = World::new();
        let e = agent_config(&internal_pair(), &[fip("broken", "192.0.2.300/24")], &w.view()).expect_err("bad");
        assert!(matches!(&e, PairConfigError::FloatingIp { name, .. } if name == "broken"), "{e}");
        assert!(e.to_string().contains("not an IP address"), "{e}");
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
