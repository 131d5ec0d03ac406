//! VIP addresses, links and routes through rtnetlink, behind a small typed API.
//!
//! Ownership: havip marks every address it adds, so that it never touches one it
//! did not add.
//! - `IFA_PROTO` = [`HAVIP_ADDR_PROTO`] on every VIP (IPv4 and IPv6; kernel ≥ 6.3 keeps
//!   it, older kernels ignore it);
//! - an IPv4 label `<ifname>:hv` when it fits in 15 bytes (IPv6 has no labels), which is
//!   also what `ip addr` shows to people.
//!
//! An address is havip's when either mark is present. Adding an address that exists
//! and removing one that is gone are success (idempotent). IPv6 VIPs are added with
//! `IFA_F_NODAD`: duplicate address detection would keep a taken-over VIP tentative
//! (unusable) for about a second, and could mark it `dadfailed` while the old holder
//! still answers; duplicate detection is done by our own probe instead.
//!
//! VIPs are never the node's own address: an IPv6 VIP is added **deprecated**
//! (`preferred_lft 0`, valid forever), so the kernel's source address selection (RFC 6724
//! rule 3) never picks it for a connection the node opens — a connection that would break
//! when the VIP moves — while it still answers neighbour solicitations and accepts
//! connections to it. An IPv4 VIP in the subnet of the interface's own address becomes a
//! secondary address of that subnet, and a `/32` VIP comes after the address the node
//! already has (the kernel keeps addresses in the order they were added): the kernel,
//! kubelet and CNIs that take the interface's first (primary) IPv4 address never see a
//! VIP there. README ("VIPs are not the node's address") lists what that covers.
//!
//! Removing a primary IPv4 address deletes the secondaries of its subnet unless
//! `promote_secondaries` is on, so [`Netlink::add_vip`] turns it on for the interface
//! before a VIP can become anyone's primary. It is set through netlink (the interface's
//! IPv4 devconf in `RTM_SETLINK`), not by writing /proc/sys: a container runtime mounts
//! /proc/sys read-only even for a host-network pod with NET_ADMIN (the DaemonSet), while
//! netlink only needs NET_ADMIN.
//!
//! Size: the typed API over rtnetlink (addresses, links, routes, devconf) and the carrier
//! watch; it must not decide which VIPs a pair should hold.

use futures::TryStreamExt;
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage, AddressProtocol, CacheInfo,
};
use netlink_packet_route::link::{AfSpecInet, AfSpecUnspec, InetDevConf, LinkAttribute, LinkFlags, LinkMessage};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope, RouteType};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::{Handle, RouteMessageBuilder};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

pub mod holder;

/// The longest [`Netlink::await_local`] waits for the kernel to make a new VIP local.
const LOCAL_WAIT: Duration = Duration::from_millis(250);
/// The `IFA_PROTO` value that marks havip's addresses.
pub const HAVIP_ADDR_PROTO: u8 = 0x68;
/// The host prefix length of `addr` (32 or 128): a drained VIP on `lo`, a routed VIP, a
/// local route — one address each.
pub fn host_prefix(addr: IpAddr) -> u8 {
    if addr.is_ipv4() { 32 } else { 128 }
}

/// The metric of havip's local routes ([`Netlink::add_local_route`]): not the kernel's 0,
/// so that both exist while the address does.
pub const LOCAL_ROUTE_METRIC: u32 = 1;
/// The kernel's `local` routing table.
const RT_TABLE_LOCAL: u8 = 255;
/// Suffix of the IPv4 label havip puts on its addresses (`eth0:hv`).
pub const LABEL_SUFFIX: &str = ":hv";
/// An address lifetime that never runs out (`INFINITY_LIFE_TIME`, `forever` in `ip addr`).
const INFINITE_LIFETIME: u32 = u32::MAX;

/// A VIP as the netlink layer sees it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Vip {
    /// The address.
    pub addr: IpAddr,
    /// Its prefix length.
    pub prefix: u8,
    /// The interface it goes on.
    pub ifname: String,
}

impl std::fmt::Display for Vip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} dev {}", self.addr, self.prefix, self.ifname)
    }
}

/// An address found on an interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddrInfo {
    /// Interface index.
    pub ifindex: u32,
    /// The address.
    pub addr: IpAddr,
    /// Prefix length.
    pub prefix: u8,
    /// IPv4 label, if any.
    pub label: Option<String>,
    /// `IFA_PROTO`, if the kernel reported one.
    pub proto: Option<u8>,
    /// IPv6 duplicate address detection failed for it.
    pub dad_failed: bool,
    /// IPv6 duplicate address detection is still running (not usable yet).
    pub tentative: bool,
    /// Its preferred lifetime is over: never picked as the source of a new connection.
    pub deprecated: bool,
}

impl AddrInfo {
    /// Whether havip added this address (either ownership mark present).
    pub fn is_havip(&self) -> bool {
        self.proto == Some(HAVIP_ADDR_PROTO) || self.label.as_deref().is_some_and(|l| l.ends_with(LABEL_SUFFIX))
    }
}

/// State of a link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkState {
    /// Interface index.
    pub index: u32,
    /// Interface name.
    pub name: String,
    /// Administratively up.
    pub up: bool,
    /// Carrier present (`IFF_LOWER_UP`): a cable and a live peer.
    pub carrier: bool,
    /// Hardware address (6 bytes for Ethernet).
    pub mac: Vec<u8>,
    /// MTU in bytes, when the kernel says.
    pub mtu: Option<u32>,
}

/// Errors of netlink operations. Variants name the operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// The netlink socket could not be opened.
    #[error("failed to open a netlink socket: {0}")]
    Open(#[source] std::io::Error),
    /// The interface does not exist.
    #[error("failed to find interface {0}")]
    LinkNotFound(String),
    /// Listing links failed.
    #[error("failed to list links: {0}")]
    ListLinks(#[source] rtnetlink::Error),
    /// Listing addresses failed.
    #[error("failed to list addresses: {0}")]
    ListAddresses(#[source] rtnetlink::Error),
    /// Listing routes failed.
    #[error("failed to list routes: {0}")]
    ListRoutes(#[source] rtnetlink::Error),
    /// Adding a VIP failed.
    #[error("failed to add {vip}: {source}")]
    AddAddress {
        /// The VIP.
        vip: Vip,
        /// The cause.
        #[source]
        source: rtnetlink::Error,
    },
    /// Removing a VIP failed.
    #[error("failed to remove {vip}: {source}")]
    DelAddress {
        /// The VIP.
        vip: Vip,
        /// The cause.
        #[source]
        source: rtnetlink::Error,
    },
    /// The address is on the interface but havip did not add it: it is left alone.
    #[error("refusing to remove {0}: havip did not add it (no havip label or protocol mark)")]
    NotOurs(Vip),
    /// No interface holds an address in the VIP's subnet.
    #[error("failed to find an interface with an address in the subnet of {addr}/{prefix}")]
    NoInterfaceForSubnet {
        /// The VIP.
        addr: IpAddr,
        /// Its prefix.
        prefix: u8,
    },
    /// The dummy interface of routed VIPs could not be created or set up.
    #[error("failed to create or set up the dummy interface {ifname}: {source}")]
    AddLink {
        /// The interface.
        ifname: String,
        /// The cause.
        #[source]
        source: rtnetlink::Error,
    },
    /// A routed VIP's backup path could not be added or removed.
    #[error("failed to {op} the backup path of {addr}: {source}")]
    BackupRoute {
        /// `add` or `remove`.
        op: &'static str,
        /// The address.
        addr: IpAddr,
        /// The cause.
        #[source]
        source: rtnetlink::Error,
    },
    /// A route or rule that follows the holder could not be added or removed.
    #[error("failed to {op} the {what}: {source}")]
    HolderRoute {
        /// `add` or `remove`.
        op: &'static str,
        /// The route or rule.
        what: String,
        /// The cause.
        #[source]
        source: rtnetlink::Error,
    },
    /// A local route (a drained routed VIP's placeholder) could not be added or removed.
    #[error("failed to {op} the local route of {addr}: {source}")]
    LocalRoute {
        /// `add` or `remove`.
        op: &'static str,
        /// The address.
        addr: IpAddr,
        /// The cause.
        #[source]
        source: rtnetlink::Error,
    },
    /// The kernel's neighbour (ARP/NDP) entries could not be listed or one deleted.
    #[error("failed to {op} the neighbour entries of {addrs:?}: {source}")]
    Neighbours {
        /// `list` or `delete`.
        op: &'static str,
        /// The addresses.
        addrs: Vec<IpAddr>,
        /// The cause.
        #[source]
        source: rtnetlink::Error,
    },
    /// A route message could not be built (never for a host prefix of a valid address).
    #[error("cannot describe a route to {addr}: {reason}")]
    BadRoute {
        /// The address.
        addr: IpAddr,
        /// Why.
        reason: String,
    },
    /// `promote_secondaries` could not be turned on for an interface.
    #[error("failed to set net.ipv4.conf.{ifname}.promote_secondaries=1 (netlink): {source}")]
    PromoteSecondaries {
        /// The interface.
        ifname: String,
        /// The cause.
        #[source]
        source: rtnetlink::Error,
    },
    /// A virtual MAC interface's (or its parent's) ARP and filter settings could not be
    /// written.
    #[error("failed to set the ARP and reverse-path settings of {ifname}: {source}")]
    LinkSettings {
        /// The interface.
        ifname: String,
        /// The cause.
        #[source]
        source: rtnetlink::Error,
    },
    /// The name of a virtual MAC interface is taken by an interface that is not the pair's
    /// (another kind, parent or MAC: another pair with the same `virtualMAC.id` on this
    /// link, or the administrator's own).
    #[error(
        "interface {ifname} exists but is not this pair's virtual MAC interface ({found}): is another pair on this link using the same virtualMAC id?"
    )]
    VirtualLinkTaken {
        /// The interface.
        ifname: String,
        /// What it is.
        found: String,
    },
}

impl NetlinkError {
    /// A bounded label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            Self::Open(_) => "open",
            Self::LinkNotFound(_) => "link_not_found",
            Self::ListLinks(_) | Self::ListAddresses(_) | Self::ListRoutes(_) => "list",
            Self::AddAddress { .. } => "add_address",
            Self::DelAddress { .. } => "del_address",
            Self::NotOurs(_) => "not_ours",
            Self::NoInterfaceForSubnet { .. } => "no_interface",
            Self::AddLink { .. } => "add_link",
            Self::LocalRoute { .. } | Self::BadRoute { .. } => "local_route",
            Self::BackupRoute { .. } => "backup_route",
            Self::HolderRoute { .. } => "holder_route",
            Self::PromoteSecondaries { .. } | Self::LinkSettings { .. } => "sysctl",
            Self::VirtualLinkTaken { .. } => "virtual_link_taken",
            Self::Neighbours { .. } => "neighbours",
        }
    }
}

/// The errno of a netlink error, if it is one.
pub(crate) fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
        _ => None,
    }
}
const EBUSY: i32 = 16;
const ENETUNREACH: i32 = 101;
const EHOSTUNREACH: i32 = 113;
const EEXIST: i32 = 17;
const ENODEV: i32 = 19;
const ENOENT: i32 = 2;
const ESRCH: i32 = 3;
const EOPNOTSUPP: i32 = 95;
const EADDRNOTAVAIL: i32 = 99;

/// The identity of the calling thread's network namespace (its inode; 0 when unreadable):
/// what is shared per namespace is keyed by it (tests run agents of several namespaces in
/// one process).
pub fn netns_id() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/thread-self/ns/net").map_or(0, |m| m.ino())
}

/// What is shared per network namespace and tokio runtime: its key.
type SharedKey = (u64, Option<tokio::runtime::Id>);

fn shared_key() -> SharedKey {
    (netns_id(), tokio::runtime::Handle::try_current().ok().map(|h| h.id()))
}

/// A process-wide map of weakly held shared things: each lives while someone uses it.
pub(crate) type SharedMap<K, T> =
    std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<K, std::sync::Weak<T>>>>;

/// The live thing of `map` under `key` when it `fits`, else a new one from `make`, recorded
/// in its place (the dead ones are dropped on the way).
pub(crate) fn shared_in<K: std::hash::Hash + Eq, T, E>(
    map: &SharedMap<K, T>,
    key: K,
    fits: impl Fn(&T) -> bool,
    make: impl FnOnce() -> Result<T, E>,
) -> Result<std::sync::Arc<T>, E> {
    let mut m = map.get_or_init(Default::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    m.retain(|_, w| w.strong_count() > 0);
    if let Some(t) = m.get(&key).and_then(std::sync::Weak::upgrade).filter(|t| fits(t)) {
        return Ok(t);
    }
    let t = std::sync::Arc::new(make()?);
    m.insert(key, std::sync::Arc::downgrade(&t));
    Ok(t)
}

/// [`shared_in`] per network namespace and tokio runtime.
fn shared<T, E>(map: &SharedMap<SharedKey, T>, make: impl FnOnce() -> Result<T, E>) -> Result<std::sync::Arc<T>, E> {
    shared_in(map, shared_key(), |_| true, make)
}

/// A netlink connection and the task that drives it (stopped with the last user).
struct Connection {
    handle: Handle,
    task: tokio::task::JoinHandle<()>,
    /// Held through every dump: a netlink socket serves one dump at a time (a second one
    /// started meanwhile fails with EBUSY), and every pair of the agent shares this one.
    dumping: tokio::sync::Mutex<()>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A handle on the kernel's routing netlink in the current network namespace.
#[derive(Clone)]
pub struct Netlink {
    conn: std::sync::Arc<Connection>,
}

impl Netlink {
    /// The netlink connection of the current network namespace and tokio runtime, shared
    /// by every pair and task of the agent (a connection's buffers take about 72 KiB: one
    /// per pair cost more memory than the rest of a pair together); opened on first use,
    /// closed when its last user lets go of it.
    pub fn new() -> Result<Self, NetlinkError> {
        static SHARED: SharedMap<SharedKey, Connection> = std::sync::OnceLock::new();
        let conn = shared(&SHARED, || {
            let (conn, handle, _) = rtnetlink::new_connection().map_err(NetlinkError::Open)?;
            Ok(Connection { handle, task: tokio::spawn(conn), dumping: tokio::sync::Mutex::new(()) })
        })?;
        Ok(Self { conn })
    }

    /// Whether `other` uses the same connection.
    pub fn shares_connection_with(&self, other: &Netlink) -> bool {
        std::sync::Arc::ptr_eq(&self.conn, &other.conn)
    }

    /// The rtnetlink handle (the virtual MAC interfaces' operations live beside their
    /// transport: `announce::l2::vmac`).
    pub(crate) fn handle(&self) -> &Handle {
        &self.conn.handle
    }

    /// The neighbours the kernel knows on the link with index `ifindex` (ARP and NDP
    /// entries with a link-layer address: reachable, stale, delayed, probed or permanent),
    /// as (address, MAC).
    pub async fn neighbours_on(&self, ifindex: u32) -> Result<Vec<(IpAddr, [u8; 6])>, NetlinkError> {
        use netlink_packet_route::neighbour::{NeighbourAttribute, NeighbourState};
        let err = |source| NetlinkError::Neighbours { op: "list", addrs: Vec::new(), source };
        let mut out = Vec::new();
        let _dump = self.conn.dumping.lock().await;
        let mut s = self.handle().neighbours().get().execute();
        while let Some(msg) = s.try_next().await.map_err(err)? {
            if msg.header.ifindex != ifindex
                || !matches!(
                    msg.header.state,
                    NeighbourState::Reachable
                        | NeighbourState::Stale
                        | NeighbourState::Delay
                        | NeighbourState::Probe
                        | NeighbourState::Permanent
                )
            {
                continue;
            }
            let mac = msg.attributes.iter().find_map(|a| match a {
                NeighbourAttribute::LinkLayerAddress(m) => <[u8; 6]>::try_from(m.as_slice()).ok(),
                _ => None,
            });
            if let (Some(d), Some(m)) = (neighbour_destination(&msg), mac) {
                out.push((d, m));
            }
        }
        Ok(out)
    }

    /// Forgets what the kernel learned about the link-layer addresses of `addrs` (ARP and
    /// NDP entries in any state but permanent — a user's static entry stays), so that the
    /// next packet to each is resolved afresh and reaches whoever answers for it now. A
    /// standby's probes of the VIPs go through this cache: an entry left from an earlier
    /// holder (the announcements of the current one missed) would send them to a node that
    /// drops them and make a serving holder look down. Returns how many entries went.
    pub async fn forget_neighbours(&self, addrs: &[IpAddr]) -> Result<usize, NetlinkError> {
        use netlink_packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState};
        let err = |op: &'static str| move |source| NetlinkError::Neighbours { op, addrs: addrs.to_vec(), source };
        let mut doomed = Vec::new();
        let dump = self.conn.dumping.lock().await;
        let mut s = self.handle().neighbours().get().execute();
        while let Some(msg) = s.try_next().await.map_err(err("list"))? {
            let Some(dest) = neighbour_destination(&msg).filter(|d| addrs.contains(d)) else { continue };
            if matches!(msg.header.state, NeighbourState::Permanent | NeighbourState::Noarp) {
                continue;
            }
            let mut del = NeighbourMessage::default();
            del.header.family = msg.header.family;
            del.header.ifindex = msg.header.ifindex;
            del.attributes.push(NeighbourAttribute::Destination(match dest {
                IpAddr::V4(v4) => NeighbourAddress::Inet(v4),
                IpAddr::V6(v6) => NeighbourAddress::Inet6(v6),
            }));
            doomed.push(del);
        }
        drop(s);
        drop(dump);
        let mut gone = 0;
        for del in doomed {
            match self.handle().neighbours().del(del).execute().await {
                Ok(()) => gone += 1,
                // Gone already (expired, or forgotten by another pair's probes).
                Err(e) if errno(&e) == Some(ENOENT) => {}
                Err(e) => return Err(err("delete")(e)),
            }
        }
        Ok(gone)
    }

    /// Every link.
    pub async fn links(&self) -> Result<Vec<LinkState>, NetlinkError> {
        retry_busy(|| async {
            let mut out = Vec::new();
            let _dump = self.conn.dumping.lock().await;
            let mut s = self.handle().link().get().execute();
            while let Some(msg) = s.try_next().await? {
                out.push(link_state(&msg));
            }
            Ok(out)
        })
        .await
        .map_err(NetlinkError::ListLinks)
    }

    /// One link by name.
    pub async fn link(&self, name: &str) -> Result<LinkState, NetlinkError> {
        let mut s = self.handle().link().get().match_name(name.to_owned()).execute();
        match s.try_next().await {
            Ok(Some(msg)) => Ok(link_state(&msg)),
            Ok(None) => Err(NetlinkError::LinkNotFound(name.to_owned())),
            Err(e) if errno(&e) == Some(ENODEV) => Err(NetlinkError::LinkNotFound(name.to_owned())),
            Err(e) => Err(NetlinkError::ListLinks(e)),
        }
    }

    /// Makes sure the dummy interface `name` exists and is up (routed VIPs live there:
    /// see [`crate::announce::bgp`]). An existing interface of that name is used as it
    /// is, only set up; creating one that a concurrent agent created first is success.
    pub async fn ensure_dummy(&self, name: &str) -> Result<(), NetlinkError> {
        let add_link = |source| NetlinkError::AddLink { ifname: name.to_owned(), source };
        let link = match self.link(name).await {
            Ok(l) => l,
            Err(NetlinkError::LinkNotFound(_)) => {
                let dummy = self.handle().link().add(rtnetlink::LinkDummy::new(name).up().build()).execute().await;
                // A kernel without the dummy driver (CONFIG_DUMMY) refuses the kind; an
                // ifb device is the same for this purpose: no carrier to lose, no ARP,
                // and whatever is routed into it is dropped.
                let made = match dummy {
                    Err(e) if errno(&e) == Some(EOPNOTSUPP) => {
                        tracing::info!(ifname = name, "no dummy driver in this kernel: using an ifb device");
                        self.handle().link().add(rtnetlink::LinkIfb::new(name).up().build()).execute().await
                    }
                    other => other,
                };
                match made {
                    Ok(()) => return Ok(()),
                    Err(e) if errno(&e) == Some(EEXIST) => self.link(name).await?,
                    Err(e) => return Err(add_link(e)),
                }
            }
            Err(e) => return Err(e),
        };
        if !link.up {
            self.handle()
                .link()
                .set(rtnetlink::LinkUnspec::new_with_index(link.index).up().build())
                .execute()
                .await
                .map_err(add_link)?;
        }
        Ok(())
    }

    /// Makes `addr` local to this host without being an address of any interface: a
    /// route of type `local` on `lo` in the `local` table (protocol [`HAVIP_ADDR_PROTO`],
    /// metric [`LOCAL_ROUTE_METRIC`], beside the kernel's own while the address still
    /// exists). The kernel delivers the address's traffic to its sockets and lets them
    /// send from it, while routing daemons, which read interface addresses and the main
    /// table, do not see it: a drained routed VIP keeps its connections without being
    /// advertised. Idempotent.
    pub async fn add_local_route(&self, addr: IpAddr) -> Result<(), NetlinkError> {
        let err = |source| NetlinkError::LocalRoute { op: "add", addr, source };
        let msg = self.local_route(addr).await?;
        match self.handle().route().add(msg).execute().await {
            Ok(()) => Ok(()),
            Err(e) if errno(&e) == Some(EEXIST) => Ok(()),
            Err(e) => Err(err(e)),
        }
    }

    /// Removes the local route of `addr` that [`Netlink::add_local_route`] added (and no
    /// other: the kernel's own is of another protocol and metric). Gone is success.
    pub async fn remove_local_route(&self, addr: IpAddr) -> Result<(), NetlinkError> {
        let msg = self.local_route(addr).await?;
        self.delete_route(msg).await.map_err(|source| NetlinkError::LocalRoute { op: "remove", addr, source })
    }

    /// Deletes a route; one that is gone already is success.
    async fn delete_route(&self, msg: RouteMessage) -> Result<(), rtnetlink::Error> {
        match self.handle().route().del(msg).execute().await {
            Ok(()) => Ok(()),
            Err(e) if matches!(errno(&e), Some(ESRCH) | Some(ENOENT)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// What `pick` makes of each route of the main and every other table, both families.
    async fn routes_where<T>(&self, pick: impl Fn(&RouteMessage) -> Option<T>) -> Result<Vec<T>, NetlinkError> {
        let mut out = self.family_routes_where(true, &pick).await?;
        out.extend(self.family_routes_where(false, &pick).await?);
        Ok(out)
    }

    /// [`Netlink::routes_where`] of one family (IPv4 when `v4`).
    async fn family_routes_where<T>(
        &self,
        v4: bool,
        pick: &impl Fn(&RouteMessage) -> Option<T>,
    ) -> Result<Vec<T>, NetlinkError> {
        let msg = if v4 {
            RouteMessageBuilder::<Ipv4Addr>::new().build()
        } else {
            RouteMessageBuilder::<Ipv6Addr>::new().build()
        };
        let mut out = Vec::new();
        let _dump = self.conn.dumping.lock().await;
        let mut s = self.handle().route().get(msg).execute();
        while let Some(route) = s.try_next().await.map_err(NetlinkError::ListRoutes)? {
            out.extend(pick(&route));
        }
        Ok(out)
    }

    async fn local_route(&self, addr: IpAddr) -> Result<RouteMessage, NetlinkError> {
        let lo = self.link("lo").await?;
        let builder = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(addr, host_prefix(addr))
            .map_err(|e| NetlinkError::BadRoute { addr, reason: e.to_string() })?;
        Ok(builder
            .output_interface(lo.index)
            .table_id(u32::from(RT_TABLE_LOCAL))
            .kind(RouteType::Local)
            .scope(RouteScope::Host)
            .protocol(RouteProtocol::Other(HAVIP_ADDR_PROTO))
            .priority(LOCAL_ROUTE_METRIC)
            .build())
    }

    /// A routed VIP's **backup path** (see `announce::bgp`): the host route of `addr` in
    /// `table`, protocol 0x68, through `gateway` on interface `oif` — the way the node
    /// reaches the address anyway, so that when the speaker imports the table (and zebra
    /// installs the route in the main table) the node's own traffic to the VIP still
    /// goes where it went. Replaces one that is there (another gateway). The speaker
    /// advertises it with the worse preference its configuration gives imported routes.
    pub async fn add_backup_route(
        &self,
        addr: IpAddr,
        table: u32,
        gateway: IpAddr,
        oif: u32,
    ) -> Result<(), NetlinkError> {
        let err = |source| NetlinkError::BackupRoute { op: "add", addr, source };
        let msg = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(addr, host_prefix(addr))
            .and_then(|b| b.gateway(gateway))
            .map_err(|e| NetlinkError::BadRoute { addr, reason: e.to_string() })?
            .output_interface(oif)
            .table_id(table)
            .protocol(RouteProtocol::Other(HAVIP_ADDR_PROTO))
            .build();
        self.handle().route().add(msg).replace().execute().await.map_err(err)
    }

    /// Removes the backup path of `addr` from `table` (only havip's: protocol 0x68).
    /// Gone is success.
    pub async fn remove_backup_route(&self, addr: IpAddr, table: u32) -> Result<(), NetlinkError> {
        let msg = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(addr, host_prefix(addr))
            .map_err(|e| NetlinkError::BadRoute { addr, reason: e.to_string() })?
            .table_id(table)
            .protocol(RouteProtocol::Other(HAVIP_ADDR_PROTO))
            .build();
        self.delete_route(msg).await.map_err(|source| NetlinkError::BackupRoute { op: "remove", addr, source })
    }

    /// The destinations of havip's backup paths in `table` (protocol 0x68 host routes).
    pub async fn backup_routes(&self, table: u32) -> Result<Vec<IpAddr>, NetlinkError> {
        self.routes_where(|r| backup_destination(r, table)).await
    }

    /// Every address (of every interface).
    pub async fn addresses(&self) -> Result<Vec<AddrInfo>, NetlinkError> {
        retry_busy(|| async {
            let mut out = Vec::new();
            let _dump = self.conn.dumping.lock().await;
            let mut s = self.handle().address().get().execute();
            while let Some(msg) = s.try_next().await? {
                if let Some(info) = addr_info(&msg) {
                    out.push(info);
                }
            }
            Ok(out)
        })
        .await
        .map_err(NetlinkError::ListAddresses)
    }

    /// Addresses havip added (on any interface).
    pub async fn havip_addresses(&self) -> Result<Vec<AddrInfo>, NetlinkError> {
        Ok(self.addresses().await?.into_iter().filter(AddrInfo::is_havip).collect())
    }

    /// Turns `promote_secondaries` on for the interface, unless /proc/sys shows it on
    /// already; written through netlink, which works where /proc/sys is read-only.
    async fn promote_secondaries(&self, ifname: &str, index: u32) -> Result<(), NetlinkError> {
        let path = format!("/proc/sys/net/ipv4/conf/{ifname}/promote_secondaries");
        if std::fs::read_to_string(&path).is_ok_and(|v| v.trim() == "1") {
            return Ok(());
        }
        let mut conf = InetDevConf::default();
        conf.promote_secondaries = 1;
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes
            .push(LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet(vec![AfSpecInet::DevConfRequest(conf)])]));
        self.handle()
            .link()
            .set(msg)
            .execute()
            .await
            .map_err(|source| NetlinkError::PromoteSecondaries { ifname: ifname.to_owned(), source })?;
        tracing::debug!(%ifname, "promote_secondaries turned on");
        Ok(())
    }

    /// Adds a VIP, marked as havip's. Already present (ours) is success; present but
    /// not ours is left as it is and reported as success too (the duplicate-VIP probe
    /// and the status report flag it).
    pub async fn add_vip(&self, vip: &Vip) -> Result<(), NetlinkError> {
        self.add_vip_with_metric(vip, None).await
    }

    /// [`Netlink::add_vip`], with `metric` as the address's route priority
    /// (`IFA_RT_PRIORITY`, `ip addr … metric`) when given: an address of ours already
    /// there takes the new metric (the node's BGP speaker advertises it as the MED of the
    /// connected route, see [`crate::announce::bgp::route_metric`]); one not ours is left
    /// as it is.
    pub async fn add_vip_with_metric(&self, vip: &Vip, metric: Option<u32>) -> Result<(), NetlinkError> {
        let link = self.link(&vip.ifname).await?;
        if vip.addr.is_ipv4() {
            self.promote_secondaries(&vip.ifname, link.index).await?;
        }
        // IPv6: an address of ours already there is replaced, so that one added by an
        // older agent (not deprecated) becomes deprecated too.
        let check = metric.is_some() || vip.addr.is_ipv6();
        if check {
            let present = self
                .addresses()
                .await?
                .into_iter()
                .find(|a| a.ifindex == link.index && a.addr == vip.addr && a.prefix == vip.prefix);
            if present.is_some_and(|a| !a.is_havip()) {
                tracing::debug!(vip = %vip, "VIP present, not ours: left as it is");
                return Ok(());
            }
        }
        let mut req = self.handle().address().add(link.index, vip.addr, vip.prefix);
        if check {
            req = req.replace();
        }
        let msg = req.message_mut();
        msg.attributes.push(AddressAttribute::Protocol(AddressProtocol::Other(HAVIP_ADDR_PROTO)));
        if let Some(m) = metric {
            msg.attributes.push(AddressAttribute::RoutePriority(m));
        }
        match vip.addr {
            IpAddr::V4(_) => {
                let label = format!("{}{}", vip.ifname, LABEL_SUFFIX);
                if label.len() <= 15 {
                    msg.attributes.push(AddressAttribute::Label(label));
                }
            }
            IpAddr::V6(_) => {
                msg.header.flags |= AddressHeaderFlags::Nodad;
                msg.attributes.push(AddressAttribute::Flags(AddressFlags::Nodad));
                let mut lifetimes = CacheInfo::default();
                lifetimes.ifa_preferred = 0;
                lifetimes.ifa_valid = INFINITE_LIFETIME;
                msg.attributes.push(AddressAttribute::CacheInfo(lifetimes));
            }
        }
        match req.execute().await {
            Ok(()) => {
                tracing::info!(vip = %vip, "added VIP");
                if vip.addr.is_ipv6() {
                    self.await_local(vip.addr, (vip.ifname == "lo").then_some(link.index)).await;
                }
                Ok(())
            }
            Err(e) if errno(&e) == Some(EEXIST) => {
                tracing::debug!(vip = %vip, "VIP already present");
                Ok(())
            }
            Err(source) => Err(NetlinkError::AddAddress { vip: vip.clone(), source }),
        }
    }

    /// Waits until the kernel delivers `addr` locally, at most [`LOCAL_WAIT`]; with `on`,
    /// until the local route of its copy on that interface exists (a drained VIP's copy
    /// on `lo`, while the copy on its link still makes a lookup local). The kernel
    /// acknowledges a new IPv6 address before it makes it local: the address's local
    /// route is inserted by its duplicate address detection work, which runs later from a
    /// kernel work queue even for an `IFA_F_NODAD` address (about 2 ms in the lab). A VIP
    /// announced meanwhile draws connections the node drops: the neighbour advertisement
    /// moved the client's SYN here, but the node routes it as not its own (the lab's IPv6
    /// planned moves lost one SYN in about every tenth move this way). IPv4 addresses are
    /// local when acknowledged.
    pub async fn await_local(&self, addr: IpAddr, on: Option<u32>) {
        let start = std::time::Instant::now();
        let mut pause = Duration::from_millis(1);
        let mut looked = 0u32;
        loop {
            looked += 1;
            let local = match on {
                None => self.is_local(addr).await,
                Some(index) => self.has_local_route_on(addr, index).await,
            };
            match local {
                Ok(true) => {
                    if looked > 1 {
                        tracing::debug!(vip = %addr, waited_us = start.elapsed().as_micros() as u64, looked,
                            "the kernel made the VIP local");
                    }
                    return;
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::debug!(error = %e, vip = %addr, "failed to look up the VIP's route; not waiting for it");
                    return;
                }
            }
            if start.elapsed() >= LOCAL_WAIT {
                tracing::warn!(vip = %addr, waited_ms = LOCAL_WAIT.as_millis() as u64,
                    "the kernel has not made the VIP local yet: announced anyway, connections to it may be dropped until it does");
                return;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(8));
        }
    }

    /// Whether a route lookup of `addr` (as `ip route get`) gives a local route.
    pub async fn is_local(&self, addr: IpAddr) -> Result<bool, NetlinkError> {
        let msg = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(addr, host_prefix(addr))
            .map_err(|e| NetlinkError::BadRoute { addr, reason: e.to_string() })?
            .build();
        let mut answers = self.handle().route().get(msg).execute();
        match answers.try_next().await {
            Ok(Some(route)) => Ok(route.header.kind == RouteType::Local),
            Ok(None) => Ok(false),
            // No route at all (an isolated namespace): not local.
            Err(e) if matches!(errno(&e), Some(ENETUNREACH) | Some(EHOSTUNREACH)) => Ok(false),
            Err(e) => Err(NetlinkError::ListRoutes(e)),
        }
    }

    /// Whether the `local` table has the local route of `addr` on interface `index`.
    pub async fn has_local_route_on(&self, addr: IpAddr, index: u32) -> Result<bool, NetlinkError> {
        let found = self.family_routes_where(addr.is_ipv4(), &|r| local_route_of(r, addr, index).then_some(())).await?;
        Ok(!found.is_empty())
    }

    /// Removes a VIP that havip added. Missing is success; present but not ours is
    /// refused with [`NetlinkError::NotOurs`].
    pub async fn remove_vip(&self, vip: &Vip) -> Result<(), NetlinkError> {
        let link = match self.link(&vip.ifname).await {
            Ok(l) => l,
            // The interface is gone, and the address with it.
            Err(NetlinkError::LinkNotFound(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        let found = self
            .addresses()
            .await?
            .into_iter()
            .find(|a| a.ifindex == link.index && a.addr == vip.addr && a.prefix == vip.prefix);
        let Some(found) = found else {
            return Ok(());
        };
        if !found.is_havip() {
            return Err(NetlinkError::NotOurs(vip.clone()));
        }
        self.delete(&found, vip).await
    }

    async fn delete(&self, found: &AddrInfo, vip: &Vip) -> Result<(), NetlinkError> {
        let mut msg = AddressMessage::default();
        msg.header.family = if found.addr.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
        msg.header.prefix_len = found.prefix;
        msg.header.index = found.ifindex;
        msg.attributes.push(AddressAttribute::Local(found.addr));
        if found.addr.is_ipv6() {
            msg.attributes.push(AddressAttribute::Address(found.addr));
        }
        match self.handle().address().del(msg).execute().await {
            Ok(()) => {
                tracing::info!(vip = %vip, "removed VIP");
                Ok(())
            }
            Err(e) if matches!(errno(&e), Some(EADDRNOTAVAIL) | Some(ENODEV)) => Ok(()),
            Err(source) => Err(NetlinkError::DelAddress { vip: vip.clone(), source }),
        }
    }

    /// Removes the havip addresses that are among `candidates` (the VIPs a pair once
    /// added, from its ledger) and not in `keep` (its VIPs now): the cleanup of VIPs
    /// removed from a configuration while the agent was down, or of a pair that is gone.
    /// An address of another pair (not a candidate) or one havip did not add is never
    /// touched. Returns what was removed. Errors are collected, not fatal: the others
    /// are still removed.
    pub async fn remove_stale(&self, candidates: &[Vip], keep: &[Vip]) -> (Vec<AddrInfo>, Vec<NetlinkError>) {
        let mut removed = Vec::new();
        let mut errors = Vec::new();
        let links = match self.links().await {
            Ok(l) => l,
            Err(e) => return (removed, vec![e]),
        };
        let ours = match self.havip_addresses().await {
            Ok(a) => a,
            Err(e) => return (removed, vec![e]),
        };
        for a in ours {
            let ifname = links.iter().find(|l| l.index == a.ifindex).map(|l| l.name.clone()).unwrap_or_default();
            let vip = Vip { addr: a.addr, prefix: a.prefix, ifname };
            let same = |k: &Vip| k.addr == vip.addr && k.ifname == vip.ifname;
            if !candidates.iter().any(same) || keep.iter().any(same) {
                continue;
            }
            match self.delete(&a, &vip).await {
                Ok(()) => removed.push(a),
                Err(e) => errors.push(e),
            }
        }
        // A drained routed VIP is kept as a local route on `lo`, not an address: recorded
        // in the ledger in its `lo` form like a drained address, and removed the same way.
        for c in candidates.iter().filter(|c| c.ifname == "lo") {
            if keep.iter().any(|k| k.addr == c.addr && k.ifname == c.ifname) {
                continue;
            }
            if let Err(e) = self.remove_local_route(c.addr).await {
                errors.push(e);
            }
        }
        (removed, errors)
    }

    /// The unicast routes of the main table (both families), for the node checks.
    pub async fn main_routes(&self) -> Result<Vec<RouteFact>, NetlinkError> {
        self.routes_where(main_route).await
    }

    /// The default gateways (IPv4 and IPv6) with their interface index.
    pub async fn default_gateways(&self) -> Result<Vec<(IpAddr, u32)>, NetlinkError> {
        self.routes_where(default_gateway).await
    }

    /// The interface that holds one of the node's own (non-havip) addresses in the
    /// subnet `addr/prefix`; failing that (a host VIP such as `192.0.2.10/32`, as
    /// Services' addresses are), the interface of an own address whose own subnet
    /// contains `addr`.
    pub async fn interface_for_subnet(&self, addr: IpAddr, prefix: u8) -> Result<String, NetlinkError> {
        let links = self.links().await?;
        let own: Vec<_> = self.addresses().await?.into_iter().filter(|a| !a.is_havip()).collect();
        let own = own
            .iter()
            .find(|a| same_subnet(a.addr, addr, prefix))
            .or_else(|| own.iter().find(|a| same_subnet(a.addr, addr, a.prefix)));
        own.and_then(|a| links.into_iter().find(|l| l.index == a.ifindex))
            .map(|l| l.name)
            .ok_or(NetlinkError::NoInterfaceForSubnet { addr, prefix })
    }
}

/// Runs a dump, retrying while the kernel answers EBUSY: a netlink socket serves one dump
/// at a time (the agent's own dumps take turns on its connection; another process's
/// changes can still interrupt one).
async fn retry_busy<T, F, Fut>(mut f: F) -> Result<T, rtnetlink::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, rtnetlink::Error>>,
{
    let mut attempt = 0;
    loop {
        match f().await {
            Err(e) if errno(&e) == Some(EBUSY) && attempt < 20 => {
                attempt += 1;
                tokio::time::sleep(std::time::Duration::from_millis(5 * attempt)).await;
            }
            other => return other,
        }
    }
}

/// The link events of a network namespace, from one netlink subscription shared by every
/// pair of the agent (each pair had its own: a socket and 72 KiB of buffers per pair, and
/// every link event parsed once per pair).
struct LinkHub {
    tx: tokio::sync::broadcast::Sender<LinkState>,
    tasks: [tokio::task::JoinHandle<()>; 2],
}

impl Drop for LinkHub {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// What a [`LinkWatch`] has for its reader.
#[derive(Debug)]
pub enum LinkEvent {
    /// A link changed.
    Changed(LinkState),
    /// Events were missed (the reader fell behind): read the links again.
    Missed,
}

/// Watches link changes (carrier up/down) as netlink events — no polling.
pub struct LinkWatch {
    rx: tokio::sync::broadcast::Receiver<LinkState>,
    hub: std::sync::Arc<LinkHub>,
}

impl LinkWatch {
    /// Subscribes to RTNLGRP_LINK in the current network namespace (the agent's one
    /// subscription; events from now on).
    pub fn new() -> Result<Self, NetlinkError> {
        static SHARED: SharedMap<SharedKey, LinkHub> = std::sync::OnceLock::new();
        let hub = shared(&SHARED, || {
            let (conn, _handle, mut rx) =
                rtnetlink::new_multicast_connection(&[rtnetlink::MulticastGroup::Link]).map_err(NetlinkError::Open)?;
            let (tx, _) = tokio::sync::broadcast::channel(256);
            let pump = tx.clone();
            let relay = tokio::spawn(async move {
                use futures::StreamExt;
                while let Some((msg, _)) = rx.next().await {
                    if let netlink_packet_core::NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)) =
                        msg.payload
                    {
                        // No subscriber right now is no error: one may come.
                        let _ = pump.send(link_state(&link));
                    }
                }
            });
            Ok(LinkHub { tx, tasks: [tokio::spawn(conn), relay] })
        })?;
        Ok(Self { rx: hub.tx.subscribe(), hub })
    }

    /// Whether `other` reads the same subscription.
    pub fn shares_subscription_with(&self, other: &LinkWatch) -> bool {
        std::sync::Arc::ptr_eq(&self.hub, &other.hub)
    }

    /// The next link change; `None` when the subscription ended.
    pub async fn next(&mut self) -> Option<LinkEvent> {
        match self.rx.recv().await {
            Ok(l) => Some(LinkEvent::Changed(l)),
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => Some(LinkEvent::Missed),
            Err(tokio::sync::broadcast::error::RecvError::Closed) => None,
        }
    }
}

/// The links whose carrier a pair watches.
#[derive(Clone, Debug)]
pub struct CarrierLinks {
    /// The data link (the interface of the first heartbeat path's address).
    pub data: String,
    /// The interfaces that carry the pair's VIPs.
    pub vip: std::collections::BTreeSet<String>,
}

impl CarrierLinks {
    /// The machine's inputs for a carrier change of link `name` (none for other links).
    fn inputs(&self, name: &str, up: bool) -> Vec<crate::sm::Input> {
        let mut out = Vec::new();
        if name == self.data {
            out.push(crate::sm::Input::Carrier { link: crate::sm::Link::Data, up });
        }
        if self.vip.contains(name) {
            out.push(crate::sm::Input::Carrier { link: crate::sm::Link::Vip, up });
        }
        out
    }
}

/// Watches the carrier of `links`: sends the current state, then every change, as the
/// machine's `Carrier` inputs. Link events come from the agent's one subscription
/// ([`LinkWatch`]); when it cannot be opened or ends, the links are polled every 100 ms
/// (counted as an I/O error).
pub fn spawn_carrier_watch<E: From<crate::sm::Input> + Send + 'static>(
    nl: Netlink,
    links: CarrierLinks,
    metrics: crate::metrics::PairMetrics,
    tx: tokio::sync::mpsc::Sender<E>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut watch = match LinkWatch::new() {
            Ok(w) => Some(w),
            Err(e) => {
                metrics.io_error(e.category());
                tracing::error!(error = %e, "failed to watch links; carrier is polled instead");
                None
            }
        };
        let mut last: std::collections::HashMap<String, bool> = std::collections::HashMap::new();
        if let Ok(now) = nl.links().await {
            for l in now {
                last.insert(l.name.clone(), l.carrier);
                for i in links.inputs(&l.name, l.carrier) {
                    let _ = tx.send(i.into()).await;
                }
            }
        }
        loop {
            let ev = match watch.as_mut() {
                Some(w) => match w.next().await {
                    Some(ev) => Some(ev),
                    None => {
                        metrics.io_error("link_events");
                        tracing::error!("the link events ended; carrier is polled instead");
                        watch = None;
                        None
                    }
                },
                None => {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    None
                }
            };
            let changed: Vec<LinkState> = match ev {
                Some(LinkEvent::Changed(l)) => vec![l],
                Some(LinkEvent::Missed) | None => nl.links().await.unwrap_or_default(),
            };
            for l in changed {
                if last.get(&l.name) != Some(&l.carrier) {
                    last.insert(l.name.clone(), l.carrier);
                    tracing::info!(link = %l.name, carrier = l.carrier, "carrier changed");
                    for i in links.inputs(&l.name, l.carrier) {
                        if tx.send(i.into()).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    })
}

/// The address a neighbour entry is for.
fn neighbour_destination(msg: &netlink_packet_route::neighbour::NeighbourMessage) -> Option<IpAddr> {
    use netlink_packet_route::neighbour::{NeighbourAddress, NeighbourAttribute};
    msg.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => Some(IpAddr::V4(*v4)),
        NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => Some(IpAddr::V6(*v6)),
        _ => None,
    })
}

fn link_state(msg: &LinkMessage) -> LinkState {
    let mut name = String::new();
    let mut mac = Vec::new();
    let mut mtu = None;
    for a in &msg.attributes {
        match a {
            LinkAttribute::IfName(n) => name = n.clone(),
            LinkAttribute::Address(m) => mac = m.clone(),
            LinkAttribute::Mtu(m) => mtu = Some(*m),
            _ => {}
        }
    }
    LinkState {
        index: msg.header.index,
        name,
        up: msg.header.flags.contains(LinkFlags::Up),
        carrier: msg.header.flags.contains(LinkFlags::LowerUp),
        mac,
        mtu,
    }
}

fn addr_info(msg: &AddressMessage) -> Option<AddrInfo> {
    let mut local = None;
    let mut address = None;
    let mut label = None;
    let mut proto = None;
    let mut flags = AddressFlags::empty();
    for a in &msg.attributes {
        match a {
            AddressAttribute::Local(ip) => local = Some(*ip),
            AddressAttribute::Address(ip) => address = Some(*ip),
            AddressAttribute::Label(l) => label = Some(l.clone()),
            AddressAttribute::Protocol(p) => proto = Some(u8::from(*p)),
            AddressAttribute::Flags(f) => flags = *f,
            _ => {}
        }
    }
    // IPv4 reports the interface address as IFA_LOCAL; IPv6 only as IFA_ADDRESS.
    let addr = local.or(address)?;
    Some(AddrInfo {
        ifindex: msg.header.index,
        addr,
        prefix: msg.header.prefix_len,
        label,
        proto,
        dad_failed: flags.contains(AddressFlags::Dadfailed),
        tentative: flags.contains(AddressFlags::Tentative),
        deprecated: flags.contains(AddressFlags::Deprecated),
    })
}

fn default_gateway(route: &RouteMessage) -> Option<(IpAddr, u32)> {
    if route.header.destination_prefix_length != 0 || route.header.table != 254 {
        return None;
    }
    let mut gw = None;
    let mut oif = None;
    for a in &route.attributes {
        match a {
            RouteAttribute::Gateway(RouteAddress::Inet(ip)) => gw = Some(IpAddr::V4(*ip)),
            RouteAttribute::Gateway(RouteAddress::Inet6(ip)) => gw = Some(IpAddr::V6(*ip)),
            RouteAttribute::Oif(i) => oif = Some(*i),
            _ => {}
        }
    }
    Some((gw?, oif?))
}

/// A route of the main table, as the node checks read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteFact {
    /// Destination (the family's unspecified address for a default route).
    pub dst: IpAddr,
    /// Its prefix length.
    pub prefix: u8,
    /// The outgoing interface, when the route names one (not for multipath routes).
    pub oif: Option<u32>,
    /// Its metric (priority).
    pub metric: u32,
}

/// What the route readers look at in a route's attributes.
struct RouteKeys {
    /// Its table (`RTA_TABLE` over the header's 8-bit field).
    table: u32,
    dst: Option<IpAddr>,
    oif: Option<u32>,
    metric: u32,
}

fn route_keys(route: &RouteMessage) -> RouteKeys {
    let mut k = RouteKeys { table: u32::from(route.header.table), dst: None, oif: None, metric: 0 };
    for a in &route.attributes {
        match a {
            RouteAttribute::Table(t) => k.table = *t,
            RouteAttribute::Destination(RouteAddress::Inet(ip)) => k.dst = Some(IpAddr::V4(*ip)),
            RouteAttribute::Destination(RouteAddress::Inet6(ip)) => k.dst = Some(IpAddr::V6(*ip)),
            RouteAttribute::Oif(i) => k.oif = Some(*i),
            RouteAttribute::Priority(m) => k.metric = *m,
            _ => {}
        }
    }
    k
}

fn main_route(route: &RouteMessage) -> Option<RouteFact> {
    let h = &route.header;
    if h.kind != RouteType::Unicast {
        return None;
    }
    let RouteKeys { table, dst, oif, metric } = route_keys(route);
    if table != 254 {
        return None;
    }
    let dst = match (dst, h.address_family) {
        (Some(d), _) => d,
        (None, AddressFamily::Inet) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        (None, AddressFamily::Inet6) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        (None, _) => return None,
    };
    Some(RouteFact { dst, prefix: h.destination_prefix_length, oif, metric })
}

/// Whether `route` is the local route of `addr` on interface `index` in the `local` table.
fn local_route_of(route: &RouteMessage, addr: IpAddr, index: u32) -> bool {
    let h = &route.header;
    if h.kind != RouteType::Local || h.destination_prefix_length != host_prefix(addr) {
        return false;
    }
    let k = route_keys(route);
    k.table == u32::from(RT_TABLE_LOCAL) && k.dst == Some(addr) && k.oif == Some(index)
}

/// The destination of `route` if it is one of havip's backup paths in `table`.
fn backup_destination(route: &RouteMessage, table: u32) -> Option<IpAddr> {
    let h = &route.header;
    if h.protocol != RouteProtocol::Other(HAVIP_ADDR_PROTO) {
        return None;
    }
    let k = route_keys(route);
    let dst = k.dst?;
    (k.table == table && h.destination_prefix_length == host_prefix(dst)).then_some(dst)
}

/// Whether `a` and `b` share the first `prefix` bits (false across families).
pub fn same_subnet(a: IpAddr, b: IpAddr, prefix: u8) -> bool {
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let p = u32::from(prefix.min(32));
            let mask = if p == 0 { 0 } else { u32::MAX << (32 - p) };
            u32::from(a) & mask == u32::from(b) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let p = u32::from(prefix.min(128));
            let mask = if p == 0 { 0 } else { u128::MAX << (128 - p) };
            u128::from(a) & mask == u128::from(b) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::host_prefix;

    #[test]
    fn a_host_prefix_is_one_address() {
        assert_eq!(host_prefix("192.0.2.10".parse().expect("ip")), 32);
        assert_eq!(host_prefix("2001:db8::10".parse().expect("ip")), 128);
    }
}
