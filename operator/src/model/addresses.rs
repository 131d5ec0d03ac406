//! Addresses that are never a VIP: every Node's own addresses (members of a pair or
//! not) and the API server's (the ClusterIPs of the Service `default/kubernetes` and the
//! addresses of its EndpointSlice). A VIP on one of them takes a host's address over,
//! and giving it up removes that address from the holder: a node or the control plane
//! would lose its address. The operator refuses such a FloatingIP and its pools skip
//! them.
//!
//! [`AddressIndex`] keeps them by address, so that a refusal or an allocation looks one
//! address up instead of scanning every Node (clusters of 5,000 Nodes). It is fed from
//! the watches' events, in order, and says which addresses each event changed, so that
//! only what those addresses concern is reconciled again. Pure: no I/O.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;

/// Where the operator learns an address of the API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ApiServerSource {
    /// `spec.clusterIPs` of the Service `default/kubernetes`.
    ClusterIp,
    /// The addresses of the EndpointSlice `default/kubernetes` (the API servers' own
    /// addresses, as they advertise them).
    Endpoint,
}

/// Why an address is never a VIP.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reserved {
    /// An address of the API server.
    ApiServer(ApiServerSource),
    /// An address of a Node.
    Node {
        /// The Node.
        node: String,
        /// Which of its addresses (`InternalIP`, `ExternalIP`, …).
        kind: String,
    },
}

impl fmt::Display for Reserved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reserved::ApiServer(ApiServerSource::ClusterIp) => {
                f.write_str("the API server's ClusterIP (Service default/kubernetes)")
            }
            Reserved::ApiServer(ApiServerSource::Endpoint) => {
                f.write_str("an address of the API server (EndpointSlice default/kubernetes)")
            }
            Reserved::Node { node, kind } => write!(f, "the {kind} of node {node}"),
        }
    }
}

/// Every reserved address, by address (see the module's documentation).
#[derive(Debug, Default)]
pub struct AddressIndex {
    /// Address → why (several Nodes may report one address; the API server may be a Node).
    by_address: BTreeMap<IpAddr, BTreeSet<Reserved>>,
    /// Node → its addresses as indexed (to remove them when they change).
    nodes: HashMap<String, Vec<(IpAddr, String)>>,
    /// API server addresses by source.
    api_server: BTreeMap<ApiServerSource, BTreeSet<IpAddr>>,
    /// The Nodes seen since the watch started listing again (None: not relisting).
    relisting: Option<HashSet<String>>,
}

impl AddressIndex {
    /// Why `a` is reserved (None: it is not). The API server first, then Nodes by name.
    pub fn lookup(&self, a: IpAddr) -> Option<&Reserved> {
        self.by_address.get(&a).and_then(|why| why.iter().next())
    }

    /// The reserved addresses from `first` to `last` (of one family), in order.
    pub fn range(&self, first: IpAddr, last: IpAddr) -> impl Iterator<Item = (IpAddr, &Reserved)> {
        let bounds = if first <= last { Some(first..=last) } else { None };
        bounds
            .into_iter()
            .flat_map(|r| self.by_address.range(r))
            .filter_map(|(a, why)| why.iter().next().map(|w| (*a, w)))
    }

    /// How many addresses are reserved.
    pub fn len(&self) -> usize {
        self.by_address.len()
    }

    /// Whether nothing is reserved.
    pub fn is_empty(&self) -> bool {
        self.by_address.is_empty()
    }

    fn insert(&mut self, a: IpAddr, why: Reserved) {
        self.by_address.entry(a).or_default().insert(why);
    }

    fn remove(&mut self, a: IpAddr, why: &Reserved) {
        if let Some(set) = self.by_address.get_mut(&a) {
            set.remove(why);
            if set.is_empty() {
                self.by_address.remove(&a);
            }
        }
    }

    /// Node `node` now has these addresses (`status.addresses` as (type, address);
    /// host names and unparsable entries are skipped). Returns the addresses whose
    /// reservation changed (reserved or not, or for another reason).
    pub fn set_node(&mut self, node: &str, addresses: &[(String, String)]) -> Vec<IpAddr> {
        if let Some(seen) = self.relisting.as_mut() {
            seen.insert(node.to_owned());
        }
        let mut now: Vec<(IpAddr, String)> = addresses
            .iter()
            .filter_map(|(kind, a)| a.trim().parse::<IpAddr>().ok().map(|ip| (ip, kind.clone())))
            .collect();
        now.sort();
        now.dedup();
        let before = self.nodes.get(node).cloned().unwrap_or_default();
        if before == now {
            return Vec::new();
        }
        for (a, kind) in &before {
            self.remove(*a, &Reserved::Node { node: node.to_owned(), kind: kind.clone() });
        }
        for (a, kind) in &now {
            self.insert(*a, Reserved::Node { node: node.to_owned(), kind: kind.clone() });
        }
        let changed = changed(before.iter().map(|(a, _)| *a), now.iter().map(|(a, _)| *a));
        if now.is_empty() {
            self.nodes.remove(node);
        } else {
            self.nodes.insert(node.to_owned(), now);
        }
        changed
    }

    /// Node `node` is gone. Returns the addresses whose reservation changed.
    pub fn remove_node(&mut self, node: &str) -> Vec<IpAddr> {
        self.set_node(node, &[])
    }

    /// The Node watch lists every Node again (after a restart or an expired watch):
    /// Nodes not listed before [`AddressIndex::end_node_relist`] are gone.
    pub fn begin_node_relist(&mut self) {
        self.relisting = Some(HashSet::new());
    }

    /// The relist is complete: forgets the Nodes it did not list. Returns the
    /// addresses whose reservation changed.
    pub fn end_node_relist(&mut self) -> Vec<IpAddr> {
        let Some(seen) = self.relisting.take() else { return Vec::new() };
        let gone: Vec<String> = self.nodes.keys().filter(|n| !seen.contains(*n)).cloned().collect();
        let mut out = Vec::new();
        for n in gone {
            out.extend(self.set_node(&n, &[]));
        }
        out
    }

    /// The API server's addresses from `source` are now `addresses`. Returns the
    /// addresses whose reservation changed.
    pub fn set_api_server(&mut self, source: ApiServerSource, addresses: BTreeSet<IpAddr>) -> Vec<IpAddr> {
        let before = self.api_server.get(&source).cloned().unwrap_or_default();
        if before == addresses {
            return Vec::new();
        }
        let why = Reserved::ApiServer(source);
        for a in &before {
            self.remove(*a, &why);
        }
        for a in &addresses {
            self.insert(*a, why.clone());
        }
        let out = changed(before.iter().copied(), addresses.iter().copied());
        self.api_server.insert(source, addresses);
        out
    }
}

/// The addresses in one list and not the other.
fn changed(before: impl Iterator<Item = IpAddr>, now: impl Iterator<Item = IpAddr>) -> Vec<IpAddr> {
    let before: BTreeSet<IpAddr> = before.collect();
    let now: BTreeSet<IpAddr> = now.collect();
    before.symmetric_difference(&now).copied().collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::{AddressIndex, ApiServerSource, Reserved};
    use std::collections::BTreeSet;
    use std::net::IpAddr;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn addrs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(k, a)| ((*k).to_owned(), (*a).to_owned())).collect()
    }

    fn node(n: &str, kind: &str) -> Reserved {
        Reserved::Node { node: n.to_owned(), kind: kind.to_owned() }
    }

    #[test]
    fn every_nodes_addresses_are_reserved_and_follow_the_node() {
        let mut idx = AddressIndex::default();
        let ch = idx
            .set_node("n7", &addrs(&[("InternalIP", "10.0.0.7"), ("Hostname", "n7"), ("ExternalIP", "2001:db8::7")]));
        assert_eq!(ch, vec![ip("10.0.0.7"), ip("2001:db8::7")]);
        assert_eq!(idx.lookup(ip("10.0.0.7")), Some(&node("n7", "InternalIP")));
        assert_eq!(idx.lookup(ip("2001:db8:0::7")), Some(&node("n7", "ExternalIP")), "any spelling");
        assert_eq!(idx.lookup(ip("10.0.0.8")), None);
        // The same report again changes nothing (kubelets report every few seconds).
        assert!(idx.set_node("n7", &addrs(&[("ExternalIP", "2001:db8::7"), ("InternalIP", "10.0.0.7")])).is_empty());
        // The address moves to another node: both changes are reported.
        assert_eq!(
            idx.set_node("n7", &addrs(&[("InternalIP", "10.0.0.17")])),
            vec![ip("10.0.0.7"), ip("10.0.0.17"), ip("2001:db8::7")]
        );
        assert_eq!(idx.lookup(ip("10.0.0.7")), None);
        // Two nodes reporting one address: it stays reserved until both let it go.
        idx.set_node("n8", &addrs(&[("InternalIP", "10.0.0.17")]));
        assert_eq!(idx.remove_node("n7"), vec![ip("10.0.0.17")], "its reason changed");
        assert_eq!(idx.lookup(ip("10.0.0.17")), Some(&node("n8", "InternalIP")), "n8 still has it");
        assert_eq!(idx.remove_node("n8"), vec![ip("10.0.0.17")]);
        assert!(idx.is_empty());
    }

    #[test]
    fn a_relist_forgets_the_nodes_it_does_not_list() {
        let mut idx = AddressIndex::default();
        idx.set_node("a", &addrs(&[("InternalIP", "10.0.0.1")]));
        idx.set_node("b", &addrs(&[("InternalIP", "10.0.0.2")]));
        idx.begin_node_relist();
        assert!(idx.set_node("a", &addrs(&[("InternalIP", "10.0.0.1")])).is_empty());
        // Until the relist is complete, what it has not listed yet stays.
        assert_eq!(idx.lookup(ip("10.0.0.2")), Some(&node("b", "InternalIP")));
        assert_eq!(idx.end_node_relist(), vec![ip("10.0.0.2")], "b was deleted while the watch was down");
        assert_eq!(idx.lookup(ip("10.0.0.2")), None);
        assert!(idx.end_node_relist().is_empty());
    }

    #[test]
    fn the_api_servers_addresses_are_reserved_before_a_nodes() {
        let mut idx = AddressIndex::default();
        idx.set_node("cp", &addrs(&[("InternalIP", "10.0.0.1")]));
        let ch = idx.set_api_server(ApiServerSource::Endpoint, [ip("10.0.0.1")].into());
        assert_eq!(ch, vec![ip("10.0.0.1")]);
        assert_eq!(idx.lookup(ip("10.0.0.1")), Some(&Reserved::ApiServer(ApiServerSource::Endpoint)));
        idx.set_api_server(ApiServerSource::ClusterIp, [ip("10.96.0.1"), ip("fd00::1")].into());
        assert_eq!(
            idx.lookup(ip("10.96.0.1")).map(ToString::to_string).as_deref(),
            Some("the API server's ClusterIP (Service default/kubernetes)")
        );
        let r: Vec<IpAddr> = idx.range(ip("10.0.0.0"), ip("10.255.255.255")).map(|(a, _)| a).collect();
        assert_eq!(r, vec![ip("10.0.0.1"), ip("10.96.0.1")]);
        assert_eq!(idx.range(ip("10.0.0.2"), ip("10.0.0.1")).count(), 0, "an empty range");
        assert_eq!(idx.set_api_server(ApiServerSource::Endpoint, BTreeSet::new()), vec![ip("10.0.0.1")]);
        assert_eq!(idx.lookup(ip("10.0.0.1")), Some(&node("cp", "InternalIP")), "still a Node's address");
        assert_eq!(idx.len(), 3);
    }
}
