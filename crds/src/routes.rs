//! Routes and policy rules that follow the holder (the HAPair's `routes` and `rules`, the
//! standalone file's too): the holder adds them after its VIPs and removes them before it
//! gives the VIPs up, so that, say, a pair of edge or NAT nodes keeps its default route or
//! its source-based routing on whichever member holds the VIPs. The spec types and their
//! typed, checked form ([`HolderRoute`], [`HolderRule`]) that the agent applies and the
//! operator validates with.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// The most routes (and, separately, rules) one pair may carry.
pub const MAX_HOLDER_ROUTES: usize = 32;

/// The kernel's main routing table (what `ip route` shows without `table`).
pub const MAIN_TABLE: u32 = 254;

/// One route the holder carries (see [`crate::HAPairSpec::routes`]).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HolderRouteSpec {
    /// The destination prefix: `0.0.0.0/0` (a default route), `198.51.100.0/24`, `::/0`.
    /// No host bits set beyond the prefix length.
    #[x_kube(validation = Rule::new("isCIDR(self)").message("routes[].destination must be a prefix such as 0.0.0.0/0 or 2001:db8::/64"))]
    #[schemars(length(max = 43))]
    pub destination: String,

    /// The next hop, of the destination's family. A route needs a gateway, an
    /// interface, or both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("isIP(self)").message("routes[].gateway must be an IP address"))]
    #[schemars(length(max = 39))]
    pub gateway: Option<String>,

    /// The outgoing interface (its name on every member; unset: the kernel picks the one
    /// the gateway is reached through).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 15))]
    pub interface: Option<String>,

    /// The kernel routing table (1 to 4294967295 but 255, the kernel's `local`; default
    /// 254, `main`). Pair it with a rule (`rules`) to route by source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4294967295_i64))]
    pub table: Option<i64>,

    /// The preferred source address of what the node sends along the route — usually a
    /// VIP of the pair, which is why the route is added after the VIPs. Of the
    /// destination's family.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("isIP(self)").message("routes[].source must be an IP address"))]
    #[schemars(length(max = 39))]
    pub source: Option<String>,

    /// The route's metric (priority; default 0, which IPv6 reads as 1024). A route of the
    /// same destination, table and metric that is not havip's is left alone: give
    /// havip's routes a metric of their own where the node has such a route already.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 4294967295_i64))]
    pub metric: Option<i64>,
}

/// One policy rule the holder carries (see [`crate::HAPairSpec::rules`]).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HolderRuleSpec {
    /// Packets from this prefix (`192.0.2.10/32`, a VIP; `2001:db8::10/128`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("isCIDR(self)").message("rules[].from must be a prefix such as 192.0.2.10/32"))]
    #[schemars(length(max = 43))]
    pub from: Option<String>,

    /// Packets to this prefix. A rule needs `from`, `to` or both, of one family.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("isCIDR(self)").message("rules[].to must be a prefix such as 198.51.100.0/24"))]
    #[schemars(length(max = 43))]
    pub to: Option<String>,

    /// The table they are looked up in (1 to 4294967295 but 255).
    #[schemars(range(min = 1, max = 4294967295_i64))]
    pub table: i64,

    /// The rule's priority (`ip rule`'s `pref`), 1 to 32765 so that it comes before the
    /// kernel's `main` (32766) and `default` (32767) rules; unique among the rules the
    /// node has (havip's rule is found and removed by it).
    #[schemars(range(min = 1, max = 32765))]
    pub priority: i64,
}

/// A prefix: an address and its length, no host bits set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Prefix {
    /// The network address.
    pub addr: IpAddr,
    /// The prefix length.
    pub len: u8,
}

impl std::fmt::Display for Prefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl Prefix {
    /// `198.51.100.0/24` → a prefix; `None` for anything else (no length, a length beyond
    /// the family's, host bits set).
    pub fn parse(s: &str) -> Option<Self> {
        let (a, l) = s.split_once('/')?;
        let addr: IpAddr = a.parse().ok()?;
        let len: u8 = l.parse().ok()?;
        let bits = if addr.is_ipv4() { 32 } else { 128 };
        if len > bits {
            return None;
        }
        // The bits below the prefix.
        let host = u32::from(bits - len);
        let mask = if host == 128 { u128::MAX } else { (1u128 << host) - 1 };
        let value = match addr {
            IpAddr::V4(v) => u128::from(u32::from(v)),
            IpAddr::V6(v) => u128::from(v),
        };
        let host_bits = value & mask;
        (host_bits == 0).then_some(Self { addr, len })
    }
}

/// A route the holder carries, checked.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct HolderRoute {
    /// The destination.
    pub destination: Prefix,
    /// The next hop.
    pub gateway: Option<IpAddr>,
    /// The outgoing interface.
    pub interface: Option<String>,
    /// The table.
    pub table: u32,
    /// The preferred source.
    pub source: Option<IpAddr>,
    /// The metric.
    pub metric: u32,
}

impl std::fmt::Display for HolderRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.destination)?;
        if let Some(g) = self.gateway {
            write!(f, " via {g}")?;
        }
        if let Some(i) = &self.interface {
            write!(f, " dev {i}")?;
        }
        if let Some(s) = self.source {
            write!(f, " src {s}")?;
        }
        write!(f, " table {} metric {}", self.table, self.metric)
    }
}

/// A policy rule the holder carries, checked.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct HolderRule {
    /// Whether it is an IPv6 rule.
    pub v6: bool,
    /// The source prefix.
    pub from: Option<Prefix>,
    /// The destination prefix.
    pub to: Option<Prefix>,
    /// The table.
    pub table: u32,
    /// The priority.
    pub priority: u32,
}

impl std::fmt::Display for HolderRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "priority {}", self.priority)?;
        if let Some(p) = self.from {
            write!(f, " from {p}")?;
        }
        if let Some(p) = self.to {
            write!(f, " to {p}")?;
        }
        write!(f, " lookup {}", self.table)
    }
}

/// Why a route or rule of the spec cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteSpecError {
    /// A prefix that is not one.
    #[error("{field} {value:?} is not a prefix (an address, a slash and a length, no host bits set: 198.51.100.0/24)")]
    Prefix {
        /// Which field.
        field: &'static str,
        /// Its value.
        value: String,
    },
    /// An address that is not one.
    #[error("{field} {value:?} is not an IP address")]
    Address {
        /// Which field.
        field: &'static str,
        /// Its value.
        value: String,
    },
    /// Addresses of two families in one route or rule.
    #[error("{0}: every address of one route or rule must be of one family")]
    Family(String),
    /// A route with neither a gateway nor an interface.
    #[error("route to {0}: needs a gateway, an interface or both")]
    NoNextHop(String),
    /// A rule that selects nothing.
    #[error("rule priority {0}: needs from, to or both")]
    NoSelector(i64),
    /// A table, metric or priority out of range.
    #[error("{field} {value} is out of range ({range})")]
    Range {
        /// Which field.
        field: &'static str,
        /// Its value.
        value: i64,
        /// The range.
        range: &'static str,
    },
    /// An interface name the kernel cannot have.
    #[error("routes[].interface {0:?} is not an interface name (1 to 15 characters, no '/', no whitespace)")]
    Interface(String),
    /// Two rules with one priority, or two routes with one destination, table and metric.
    #[error("{0} is given twice")]
    Duplicate(String),
    /// Too many routes or rules.
    #[error("at most {MAX_HOLDER_ROUTES} routes and {MAX_HOLDER_ROUTES} rules")]
    TooMany,
}

fn table(field: &'static str, value: i64) -> Result<u32, RouteSpecError> {
    match u32::try_from(value) {
        Ok(t) if t != 0 && t != 255 => Ok(t),
        _ => Err(RouteSpecError::Range { field, value, range: "1 to 4294967295 but 255, the kernel's local table" }),
    }
}

fn prefix(field: &'static str, s: &str) -> Result<Prefix, RouteSpecError> {
    Prefix::parse(s).ok_or_else(|| RouteSpecError::Prefix { field, value: s.to_owned() })
}

fn address(field: &'static str, s: &str) -> Result<IpAddr, RouteSpecError> {
    s.parse().map_err(|_| RouteSpecError::Address { field, value: s.to_owned() })
}

impl HolderRouteSpec {
    /// The checked route.
    pub fn parse(&self) -> Result<HolderRoute, RouteSpecError> {
        let destination = prefix("routes[].destination", &self.destination)?;
        let gateway = self.gateway.as_deref().map(|g| address("routes[].gateway", g)).transpose()?;
        let source = self.source.as_deref().map(|s| address("routes[].source", s)).transpose()?;
        let v4 = destination.addr.is_ipv4();
        if gateway.iter().chain(source.iter()).any(|a| a.is_ipv4() != v4) {
            return Err(RouteSpecError::Family(format!("route to {destination}")));
        }
        if let Some(i) = &self.interface
            && (i.is_empty() || i.len() > 15 || i.contains('/') || i.chars().any(char::is_whitespace))
        {
            return Err(RouteSpecError::Interface(i.clone()));
        }
        if gateway.is_none() && self.interface.is_none() {
            return Err(RouteSpecError::NoNextHop(destination.to_string()));
        }
        let table = self.table.map_or(Ok(MAIN_TABLE), |t| table("routes[].table", t))?;
        let metric = match self.metric {
            None => 0,
            Some(m) => u32::try_from(m).map_err(|_| RouteSpecError::Range {
                field: "routes[].metric",
                value: m,
                range: "0 to 4294967295",
            })?,
        };
        Ok(HolderRoute { destination, gateway, interface: self.interface.clone(), table, source, metric })
    }
}

impl HolderRuleSpec {
    /// The checked rule.
    pub fn parse(&self) -> Result<HolderRule, RouteSpecError> {
        let from = self.from.as_deref().map(|p| prefix("rules[].from", p)).transpose()?;
        let to = self.to.as_deref().map(|p| prefix("rules[].to", p)).transpose()?;
        let v6 = match (from, to) {
            (None, None) => return Err(RouteSpecError::NoSelector(self.priority)),
            (Some(f), Some(t)) if f.addr.is_ipv4() != t.addr.is_ipv4() => {
                return Err(RouteSpecError::Family(format!("rule priority {}", self.priority)));
            }
            (Some(p), _) | (None, Some(p)) => p.addr.is_ipv6(),
        };
        let priority = u32::try_from(self.priority)
            .ok()
            .filter(|p| (1..=32765).contains(p))
            .ok_or(RouteSpecError::Range { field: "rules[].priority", value: self.priority, range: "1 to 32765" })?;
        Ok(HolderRule { v6, from, to, table: table("rules[].table", self.table)?, priority })
    }
}

/// Every route and rule of a spec, checked: the first problem, if any. Two routes with
/// one destination, table and metric (the kernel's key), or two rules of one family with
/// one priority, are refused.
pub fn parse_all(
    routes: &[HolderRouteSpec],
    rules: &[HolderRuleSpec],
) -> Result<(Vec<HolderRoute>, Vec<HolderRule>), RouteSpecError> {
    if routes.len() > MAX_HOLDER_ROUTES || rules.len() > MAX_HOLDER_ROUTES {
        return Err(RouteSpecError::TooMany);
    }
    let routes = routes.iter().map(HolderRouteSpec::parse).collect::<Result<Vec<_>, _>>()?;
    let rules = rules.iter().map(HolderRuleSpec::parse).collect::<Result<Vec<_>, _>>()?;
    for (i, r) in routes.iter().enumerate() {
        if routes[..i].iter().any(|o| (o.destination, o.table, o.metric) == (r.destination, r.table, r.metric)) {
            return Err(RouteSpecError::Duplicate(format!(
                "the route to {} in table {} with metric {}",
                r.destination, r.table, r.metric
            )));
        }
    }
    for (i, r) in rules.iter().enumerate() {
        if rules[..i].iter().any(|o| (o.v6, o.priority) == (r.v6, r.priority)) {
            return Err(RouteSpecError::Duplicate(format!("rule priority {}", r.priority)));
        }
    }
    Ok((routes, rules))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(destination: &str) -> HolderRouteSpec {
        HolderRouteSpec {
            destination: destination.to_owned(),
            gateway: Some("192.0.2.1".to_owned()),
            interface: None,
            table: Some(100),
            source: Some("192.0.2.10".to_owned()),
            metric: None,
        }
    }

    fn rule(from: Option<&str>, to: Option<&str>, priority: i64) -> HolderRuleSpec {
        HolderRuleSpec { from: from.map(str::to_owned), to: to.map(str::to_owned), table: 100, priority }
    }

    #[test]
    fn prefixes_have_no_host_bits_and_a_length_of_their_family() {
        assert_eq!(Prefix::parse("0.0.0.0/0").map(|p| p.len), Some(0));
        assert_eq!(Prefix::parse("198.51.100.0/24").map(|p| p.to_string()).as_deref(), Some("198.51.100.0/24"));
        assert!(Prefix::parse("198.51.100.1/24").is_none(), "host bits");
        assert!(Prefix::parse("198.51.100.1/32").is_some());
        assert!(Prefix::parse("198.51.100.0/33").is_none());
        assert!(Prefix::parse("198.51.100.0").is_none(), "no length");
        assert!(Prefix::parse("::/0").is_some());
        assert!(Prefix::parse("2001:db8::/32").is_some());
        assert!(Prefix::parse("2001:db8::1/64").is_none(), "host bits");
        assert!(Prefix::parse("2001:db8::1/128").is_some());
        assert!(Prefix::parse("2001:db8::/129").is_none());
        assert!(Prefix::parse("x/8").is_none());
    }

    #[test]
    fn a_route_is_checked_field_by_field() {
        let r = route("0.0.0.0/0").parse().expect("valid");
        assert_eq!(r.to_string(), "0.0.0.0/0 via 192.0.2.1 src 192.0.2.10 table 100 metric 0");
        let main = HolderRouteSpec { table: None, ..route("0.0.0.0/0") }.parse().expect("valid");
        assert_eq!(main.table, MAIN_TABLE);
        assert!(matches!(route("10.0.0.1/8").parse(), Err(RouteSpecError::Prefix { .. })));
        assert!(matches!(route("::/0").parse(), Err(RouteSpecError::Family(_))), "IPv4 gateway for ::/0");
        let no_hop = HolderRouteSpec { gateway: None, ..route("0.0.0.0/0") };
        assert!(matches!(no_hop.parse(), Err(RouteSpecError::NoNextHop(_))));
        let dev = HolderRouteSpec { gateway: None, interface: Some("eth1".into()), ..route("0.0.0.0/0") };
        assert_eq!(dev.parse().expect("valid").interface.as_deref(), Some("eth1"));
        let bad_dev = HolderRouteSpec { interface: Some("a/b".into()), ..route("0.0.0.0/0") };
        assert!(matches!(bad_dev.parse(), Err(RouteSpecError::Interface(_))));
        for t in [0, 255, -1, 1 << 32] {
            assert!(
                matches!(
                    HolderRouteSpec { table: Some(t), ..route("0.0.0.0/0") }.parse(),
                    Err(RouteSpecError::Range { .. })
                ),
                "{t}"
            );
        }
        assert!(matches!(
            HolderRouteSpec { metric: Some(-1), ..route("0.0.0.0/0") }.parse(),
            Err(RouteSpecError::Range { .. })
        ));
        let bad_gw = HolderRouteSpec { gateway: Some("gw".into()), ..route("0.0.0.0/0") };
        assert!(matches!(bad_gw.parse(), Err(RouteSpecError::Address { .. })));
    }

    #[test]
    fn a_rule_selects_something_of_one_family_before_the_main_table() {
        let r = rule(Some("192.0.2.10/32"), None, 1000).parse().expect("valid");
        assert_eq!(r.to_string(), "priority 1000 from 192.0.2.10/32 lookup 100");
        assert!(!r.v6);
        assert!(rule(None, Some("2001:db8::/32"), 1000).parse().expect("valid").v6);
        assert!(matches!(rule(None, None, 1000).parse(), Err(RouteSpecError::NoSelector(1000))));
        assert!(matches!(rule(Some("192.0.2.10/32"), Some("::/0"), 1).parse(), Err(RouteSpecError::Family(_))));
        for p in [0, 32766, 32767, -5] {
            assert!(matches!(rule(Some("192.0.2.10/32"), None, p).parse(), Err(RouteSpecError::Range { .. })), "{p}");
        }
    }

    #[test]
    fn the_kernels_key_is_given_once() {
        let two = [route("0.0.0.0/0"), HolderRouteSpec { gateway: Some("192.0.2.2".into()), ..route("0.0.0.0/0") }];
        assert!(matches!(parse_all(&two, &[]), Err(RouteSpecError::Duplicate(_))));
        let other_metric = [route("0.0.0.0/0"), HolderRouteSpec { metric: Some(10), ..route("0.0.0.0/0") }];
        assert_eq!(parse_all(&other_metric, &[]).expect("valid").0.len(), 2);
        let rules = [rule(Some("192.0.2.10/32"), None, 7), rule(Some("192.0.2.11/32"), None, 7)];
        assert!(matches!(parse_all(&[], &rules), Err(RouteSpecError::Duplicate(_))));
        // One priority in each family is two rules.
        let both = [rule(Some("192.0.2.10/32"), None, 7), rule(Some("2001:db8::10/128"), None, 7)];
        assert_eq!(parse_all(&[], &both).expect("valid").1.len(), 2);
        let many: Vec<_> = (0..=MAX_HOLDER_ROUTES).map(|_| route("0.0.0.0/0")).collect();
        assert_eq!(parse_all(&many, &[]), Err(RouteSpecError::TooMany));
    }
}
