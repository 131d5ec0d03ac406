//! The `VIPPool` resource: addresses that havip hands out to Services of type
//! LoadBalancer, and the pair whose active member holds them. Also the names,
//! annotations and labels of the Service contract ([`service`]).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Addresses for Services of type LoadBalancer, held by one HAPair.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "havip.io",
    version = "v1alpha1",
    kind = "VIPPool",
    doc = "A pool of addresses havip hands out to Services of type LoadBalancer (loadBalancerClass havip.io/l2): each allocated address becomes a FloatingIP held by the pool's HAPair.",
    plural = "vippools",
    singular = "vippool",
    shortname = "vpool",
    category = "havip",
    status = "VIPPoolStatus",
    printcolumn = r#"{"name":"Pair","type":"string","jsonPath":".spec.pair","description":"The HAPair that holds the pool's addresses"}"#,
    printcolumn = r#"{"name":"Size","type":"integer","jsonPath":".status.size","description":"Addresses in the pool"}"#,
    printcolumn = r#"{"name":"Used","type":"integer","jsonPath":".status.used","description":"Addresses allocated to Services or held by other FloatingIPs"}"#,
    printcolumn = r#"{"name":"Free","type":"integer","jsonPath":".status.free","description":"Addresses left to hand out"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status","description":"Whether the pool hands out addresses"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct VIPPoolSpec {
    /// Name of the HAPair whose active member holds this pool's addresses.
    #[x_kube(validation = Rule::new("size(self) > 0").message("spec.pair must name an HAPair (it is empty)"))]
    #[schemars(length(max = 63))]
    pub pair: String,

    /// The pool's addresses: CIDRs (`192.0.2.0/28`, `2001:db8::/120`) and ranges of
    /// one family (`192.0.2.20-192.0.2.29`). In an IPv4 CIDR of /30 or wider the
    /// network and broadcast addresses are not handed out. Two entries of one pool must
    /// not overlap; two pools must not overlap either (the newer one is not used, with a
    /// condition and an Event).
    #[x_kube(
        validation = Rule::new("size(self) > 0").message("spec.addresses must list at least one CIDR or range"),
        validation = Rule::new("self.all(a, a.contains('-') ? (a.split('-').size() == 2 && isIP(a.split('-')[0]) && isIP(a.split('-')[1]) && ip(a.split('-')[0]).family() == ip(a.split('-')[1]).family()) : isCIDR(a))").message("spec.addresses: each entry must be a CIDR (192.0.2.0/28) or a range of one family (192.0.2.20-192.0.2.29)")
    )]
    #[schemars(length(max = 64), inner(length(max = 100)))]
    pub addresses: Vec<String>,

    /// The interface the VIPs are added to. Default: the interface holding the node's
    /// own address in a subnet that contains the VIP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 15), regex(pattern = r"^[^\s/:]+$"))]
    pub interface: Option<String>,

    /// Hand addresses of this pool to Services that ask for none. False: only Services
    /// that request an address of the pool (`spec.loadBalancerIP`, the annotation
    /// `havip.io/address`) or name it (`havip.io/pool`) get one.
    #[serde(default = "default_true")]
    pub auto_assign: bool,

    /// Only Services with these labels get addresses of this pool (default: every
    /// Service).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_selector: Option<LabelSelector>,

    /// Only Services in namespaces with these labels get addresses of this pool
    /// (default: every namespace). A Service whose namespace the operator has not seen
    /// yet matches no namespace selector (neither `In` nor `NotIn`): it waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,

    /// Which Services may share an address of this pool (Services with the same
    /// `havip.io/sharing-key` annotation, on other ports). `Namespace` (default): only
    /// Services of the address's namespace (that of its oldest Service), so a Service of
    /// another namespace cannot join an address by reusing a sharing key it read on the
    /// FloatingIP. `Cluster`: Services of any namespace the pool serves.
    #[serde(default, skip_serializing_if = "SharingScope::is_default")]
    pub sharing_scope: SharingScope,

    /// How the pool's addresses are made known: `L2`, `BGP` or `Both` (see the
    /// FloatingIP's `announce.mode`). Default: the pair's `spec.announceMode`. In `BGP` mode the
    /// addresses need not be in any node's subnet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub announce_mode: Option<crate::AnnounceMode>,
}

/// Which Services may share an address of a pool.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SharingScope {
    /// Only Services of the same namespace share an address.
    #[default]
    Namespace,
    /// Services of any namespace the pool serves share an address.
    Cluster,
}

impl SharingScope {
    fn is_default(&self) -> bool {
        *self == SharingScope::default()
    }
}

fn default_true() -> bool {
    true
}

/// Observed state of a pool, written by the operator.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct VIPPoolStatus {
    /// Addresses in the pool (at most 2^62; larger IPv6 pools read as that).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,
    /// Addresses of the pool allocated to Services or held by FloatingIPs written by
    /// hand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used: Option<i64>,
    /// Addresses left to hand out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free: Option<i64>,
    /// Addresses of the pool that are never handed out because they are the API
    /// server's or a Node's own addresses (not counted in `used` nor in `free`; the
    /// `Ready` condition's message names them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved: Option<i64>,
    /// Addresses of the pool held by FloatingIPs written by hand (counted in `used`;
    /// never handed out while they hold them; the `Ready` condition's message names
    /// them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by_hand: Option<i64>,
    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`: the pool hands out addresses (False: its pair is missing, or it
    /// overlaps an older pool; the message says which, and which addresses it skips).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// The contract with Services: which ones havip serves and what they may ask for.
pub mod service {
    /// The `spec.loadBalancerClass` of the Services havip serves (and, with the chart
    /// value `loadBalancer.default`, Services without a class).
    pub const LOAD_BALANCER_CLASS: &str = "havip.io/l2";
    /// Annotation: the address(es) the Service asks for, one per IP family,
    /// comma-separated (`192.0.2.10` or `192.0.2.10,2001:db8::10`). Takes precedence
    /// over `spec.loadBalancerIP`.
    pub const ADDRESS: &str = "havip.io/address";
    /// Annotation: the pool(s) to allocate from, comma-separated (default: every pool
    /// that selects the Service and has `autoAssign`).
    pub const POOL: &str = "havip.io/pool";
    /// Annotation: Services with the same value may share an address when their ports
    /// differ (protocol and port).
    pub const SHARING_KEY: &str = "havip.io/sharing-key";
    /// Annotation on a FloatingIP the operator allocated: the Services
    /// (`namespace/name`, comma-separated) that use its address.
    pub const SERVICES: &str = "havip.io/services";
    /// Label on a FloatingIP the operator allocated: the pool it came from.
    pub const POOL_LABEL: &str = "havip.io/pool";
    /// Annotation on a FloatingIP the operator allocated: the sharing key of its
    /// Services (absent: not shared).
    pub const FIP_SHARING_KEY: &str = "havip.io/sharing-key";
    /// The `ipMode` of the Services' ingress entries: traffic to the address is handled
    /// on the node (kube-proxy), the address is not a proxy in front of it.
    pub const IP_MODE: &str = "VIP";

    /// The name of the FloatingIP that holds `address` for Services: `lb-` and the
    /// address, IPv4 dotted with dashes (`lb-192-0-2-10`), IPv6 with all eight groups
    /// (`lb-2001-db8-0-0-0-0-0-10`). One name per address, so the API server refuses a
    /// second allocation of it (by another replica, or after a stale read).
    pub fn fip_name(address: std::net::IpAddr) -> String {
        match address {
            std::net::IpAddr::V4(a) => {
                let o = a.octets();
                format!("lb-{}-{}-{}-{}", o[0], o[1], o[2], o[3])
            }
            std::net::IpAddr::V6(a) => {
                let g: Vec<String> = a.segments().iter().map(|s| format!("{s:x}")).collect();
                format!("lb-{}", g.join("-"))
            }
        }
    }
}

/// An IP family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    /// The family of `a`.
    pub fn of(a: IpAddr) -> Self {
        if a.is_ipv4() { Family::V4 } else { Family::V6 }
    }
    /// The name Services use in `spec.ipFamilies`.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
}

/// A block of consecutive addresses of one family, first and last included.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Block {
    /// The family.
    pub family: Family,
    /// The first address, as a number.
    pub first: u128,
    /// The last address, as a number (`>= first`).
    pub last: u128,
}

/// Why a pool entry cannot be read.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum BlockError {
    /// Neither a CIDR nor a range.
    #[error("{0:?} is neither a CIDR (192.0.2.0/28) nor a range (192.0.2.20-192.0.2.29)")]
    Syntax(String),
    /// A range with its ends in two families, or its last address before its first.
    #[error("{0:?}: a range must go up within one family")]
    BadRange(String),
    /// A CIDR's prefix length is too long for its family.
    #[error("{0:?}: the prefix length is too long for the family")]
    BadPrefix(String),
}

fn to_u128(a: IpAddr) -> u128 {
    match a {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// The address `n` of `family`.
pub fn from_u128(family: Family, n: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(u32::try_from(n).unwrap_or(u32::MAX))),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(n)),
    }
}

impl Block {
    /// Reads a pool entry: a CIDR or a range `first-last`.
    pub fn parse(entry: &str) -> Result<Block, BlockError> {
        let s = entry.trim();
        if let Some((a, b)) = s.split_once('-') {
            let (a, b): (IpAddr, IpAddr) = match (a.trim().parse(), b.trim().parse()) {
                (Ok(a), Ok(b)) => (a, b),
                _ => return Err(BlockError::Syntax(entry.to_owned())),
            };
            let (family, first, last) = (Family::of(a), to_u128(a), to_u128(b));
            if Family::of(b) != family || last < first {
                return Err(BlockError::BadRange(entry.to_owned()));
            }
            return Ok(Block { family, first, last });
        }
        let (a, p) = s.split_once('/').ok_or_else(|| BlockError::Syntax(entry.to_owned()))?;
        let a: IpAddr = a.parse().map_err(|_| BlockError::Syntax(entry.to_owned()))?;
        let p: u32 = p.parse().map_err(|_| BlockError::Syntax(entry.to_owned()))?;
        let (family, bits) = (Family::of(a), if a.is_ipv4() { 32 } else { 128 });
        if p > bits {
            return Err(BlockError::BadPrefix(entry.to_owned()));
        }
        let host_bits = bits - p;
        let mask: u128 = if host_bits == 128 { u128::MAX } else { (1u128 << host_bits) - 1 };
        let first = to_u128(a) & !mask;
        let mut block = Block { family, first, last: first | mask };
        // No network or broadcast address of an IPv4 subnet of 4 addresses or more.
        if family == Family::V4 && p <= 30 {
            block.first += 1;
            block.last -= 1;
        }
        Ok(block)
    }

    /// Addresses in the block.
    pub fn size(&self) -> u128 {
        (self.last - self.first).saturating_add(1)
    }

    /// Whether `a` is in the block.
    pub fn contains(&self, a: IpAddr) -> bool {
        Family::of(a) == self.family && (self.first..=self.last).contains(&to_u128(a))
    }

    /// Whether two blocks share an address.
    pub fn overlaps(&self, other: &Block) -> bool {
        self.family == other.family && self.first <= other.last && other.first <= self.last
    }

    /// The block's addresses in order.
    pub fn addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        (self.first..=self.last).map(|n| from_u128(self.family, n))
    }
}

/// A pool's entries, read; the first unreadable one is an error.
pub fn pool_blocks(spec: &VIPPoolSpec) -> Result<Vec<Block>, BlockError> {
    spec.addresses.iter().map(|e| Block::parse(e)).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::{Block, BlockError, IpAddr, service};

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn cidrs_and_ranges_read_as_blocks() {
        let b = Block::parse("192.0.2.0/29").expect("cidr");
        // Network and broadcast skipped: .1 to .6.
        assert_eq!(b.size(), 6);
        assert!(!b.contains(ip("192.0.2.0")) && b.contains(ip("192.0.2.1")) && b.contains(ip("192.0.2.6")));
        assert!(!b.contains(ip("192.0.2.7")));
        assert_eq!(Block::parse("192.0.2.9/32").expect("host").size(), 1);
        assert_eq!(Block::parse("192.0.2.8/31").expect("/31").size(), 2);
        let r = Block::parse("192.0.2.20 - 192.0.2.29").expect("range");
        assert_eq!(r.size(), 10);
        assert_eq!(r.addresses().next(), Some(ip("192.0.2.20")));
        let v6 = Block::parse("2001:db8::/120").expect("v6");
        assert_eq!(v6.size(), 256, "IPv6 has no broadcast: every address counts");
        assert!(v6.contains(ip("2001:db8::ff")) && !v6.contains(ip("192.0.2.1")));
        assert_eq!(Block::parse("::/0").expect("all").size(), u128::MAX, "saturates");
        assert!(matches!(Block::parse("192.0.2.9-2001:db8::1"), Err(BlockError::BadRange(_))));
        assert!(matches!(Block::parse("192.0.2.9-192.0.2.1"), Err(BlockError::BadRange(_))));
        assert!(matches!(Block::parse("192.0.2.0/33"), Err(BlockError::BadPrefix(_))));
        assert!(matches!(Block::parse("web"), Err(BlockError::Syntax(_))));
        assert!(r.overlaps(&Block::parse("192.0.2.29/32").expect("b")));
        assert!(!r.overlaps(&Block::parse("192.0.2.30/32").expect("b")));
    }

    #[test]
    fn floating_ip_names_are_one_per_address_and_valid_names() {
        assert_eq!(service::fip_name(ip("192.0.2.10")), "lb-192-0-2-10");
        assert_eq!(service::fip_name(ip("2001:db8::10")), "lb-2001-db8-0-0-0-0-0-10");
        assert_eq!(service::fip_name(ip("2001:db8::")), "lb-2001-db8-0-0-0-0-0-0");
        assert_eq!(service::fip_name(ip("2001:0db8:0::10")), service::fip_name(ip("2001:db8::10")));
        for a in ["::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "255.255.255.255"] {
            let n = service::fip_name(ip(a));
            assert!(n.len() <= 63 && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'), "{n}");
            assert!(n.ends_with(|c: char| c.is_ascii_alphanumeric()), "{n}");
        }
    }
}
