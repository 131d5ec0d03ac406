//! What the runtime's parts exchange: the stores and reporters it is given
//! ([`LeaseStore`], [`Reporter`]), what it reports ([`VipLink`]), requests and their
//! answers ([`Request`], [`Reply`]), its errors ([`RuntimeError`]), the events its task
//! receives ([`Event`]) and the VIPs of a configuration as resolved ([`ResolvedVip`]). A
//! leaf module: [`super`] re-exports the public ones.

use crate::config::{AgentConfig, AnnounceSchedule};
use crate::heartbeat::Received;
use crate::netlink::Vip;
use crate::sm;
use tokio::sync::oneshot;

/// The Lease as a fencing record (Kubernetes mode); standalone mode has none and
/// answers every compare-and-swap with `Unavailable` at once.
#[async_trait::async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// Compare-and-swap: set holder and epoch if the Lease's epoch is `expected_epoch`.
    async fn cas(&self, holder: &str, new_epoch: u64, expected_epoch: u64) -> sm::CasResult;

    /// Renews the Lease (a fresh renew time, same holder and epoch) if it still names
    /// `holder` under `epoch`; returns the Lease's holder and epoch as read, `None` when
    /// the store could not be read.
    async fn renew(&self, _holder: &str, _epoch: u64) -> Option<(Option<sm::NodeId>, u64)> {
        None
    }
}

/// Receives what the runtime reports (Kubernetes mode writes status and Events).
pub trait Reporter: Send + Sync + 'static {
    /// A state machine event, with the status after it.
    fn event(&self, event: &sm::Event, status: &sm::Status);
    /// The status changed (called after every step that changed it).
    fn status(&self, status: &sm::Status);
    /// The interfaces the configuration's VIPs resolved to (after a start or a
    /// reconfiguration, before the machine acts on it).
    fn links(&self, _links: &[VipLink]) {}
    /// What the node's BGP speaker said (pairs with routed VIPs, every
    /// [`crate::announce::bgp::speaker::POLL`]).
    fn speaker(&self, _report: &crate::announce::bgp::SpeakerReport) {}
}

/// A VIP's interface, as resolved from the configuration and the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VipLink {
    /// The VIP id (the FloatingIP's name in Kubernetes mode).
    pub id: String,
    /// The interface that carries it.
    pub ifname: String,
    /// That interface's MAC address.
    pub mac: Option<[u8; 6]>,
}

/// A request from the admin socket (or the Kubernetes command watcher).
#[derive(Debug)]
pub enum Request {
    /// A command for the machine; operations answer when their result is reported.
    Command(sm::Command),
    /// A snapshot of the status.
    Status,
}

/// The answer to a [`Request`].
#[derive(Debug, Clone)]
pub enum Reply {
    /// The operation finished (or the command was accepted, for commands without a result).
    Done {
        /// Success.
        ok: bool,
        /// Details.
        message: String,
    },
    /// The status.
    Status(Box<sm::Status>),
}

/// What the runtime's task receives: inputs, requests and orders from the [`Handle`](super::Handle)
/// and the tasks around it.
pub(super) enum Event {
    Input(sm::Input),
    ObserveVips,
    /// What the node's BGP speaker said (pairs with routed VIPs).
    Speaker(crate::announce::bgp::SpeakerReport),
    SetKeys(havip_crds::wire::Keyring),
    SetLease(Option<std::sync::Arc<dyn super::LeaseStore>>),
    Reconfigure(Box<AgentConfig>, oneshot::Sender<Result<(), RuntimeError>>),
    Release,
    Received(Received),
    Request(Request, oneshot::Sender<Reply>),
    Stop,
}

impl From<sm::Input> for Event {
    fn from(i: sm::Input) -> Self {
        Event::Input(i)
    }
}

/// Errors that stop the agent from starting.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The state file is unreadable.
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    /// Netlink could not be opened.
    #[error(transparent)]
    Netlink(#[from] crate::netlink::NetlinkError),
    /// Heartbeat sockets could not be bound.
    #[error(transparent)]
    Heartbeat(#[from] crate::heartbeat::HeartbeatError),
    /// A layer-2 socket could not be opened.
    #[error(transparent)]
    Announce(#[from] crate::announce::AnnounceError),
    /// Something in the configuration does not match this node.
    #[error("invalid configuration for this node: {0}")]
    Config(String),
    /// The runtime is not running any more.
    #[error("the pair's runtime has stopped")]
    Stopped,
}

/// A VIP of the configuration with its interface resolved.
#[derive(Clone)]
pub(super) struct ResolvedVip {
    pub(super) id: sm::VipId,
    pub(super) vip: Vip,
    pub(super) ports: Vec<u16>,
    pub(super) health_checks: Vec<(u16, String)>,
    pub(super) announce: AnnounceSchedule,
    /// The interface's MAC address (`None`: not an Ethernet address).
    pub(super) mac: Option<[u8; 6]>,
    /// Advertised by the node's BGP speaker (on [`crate::announce::bgp::LINK`]), not
    /// announced at layer 2.
    pub(super) routed: bool,
    /// The link its traffic arrives on: its own for a layer-2 VIP, the data link (the
    /// first heartbeat path's, facing the router) for a routed one.
    pub(super) ingress: String,
    /// Announce mode `Both`: beside the layer-2 address ([`ResolvedVip::vip`]), the host
    /// address of [`crate::announce::bgp::LINK`] the node's speaker advertises; added and
    /// removed with it, withdrawn at a drain's start.
    pub(super) also_routed: Option<Vip>,
    /// [`ResolvedVip::vip`] is on the pair's virtual MAC interface (a macvlan of
    /// [`ResolvedVip::ingress`], up on the holder only; see `announce::l2::vmac`).
    pub(super) virtual_link: bool,
    /// The prefix length of the VIP's subnet, as configured ([`ResolvedVip::vip`] has the
    /// host prefix on a macvlan or `havip0`): where the node's own address and the old
    /// holder's are looked for on the link.
    pub(super) subnet_prefix: u8,
}

impl ResolvedVip {
    /// The address the node's BGP speaker advertises while this VIP is held: the VIP
    /// itself in `BGP` mode, its host address of `havip0` in `Both` mode.
    pub(super) fn advertised(&self) -> Option<&Vip> {
        if self.routed { Some(&self.vip) } else { self.also_routed.as_ref() }
    }

    /// The kernel addresses holding this VIP takes: the VIP's, and in `Both` mode its host
    /// address of `havip0` too.
    pub(super) fn addresses(&self) -> impl Iterator<Item = &Vip> {
        std::iter::once(&self.vip).chain(self.also_routed.as_ref())
    }

    /// The interface whose layer-2 port asks who has the VIP (the duplicate-VIP checks,
    /// a standby's own resolution): the VIP's link — for a virtual MAC VIP its parent, as
    /// the macvlan is down on every member but the holder. A routed VIP's `havip0` has no
    /// port.
    pub(super) fn probe_ifname(&self) -> &str {
        if self.routed { &self.vip.ifname } else { &self.ingress }
    }

    /// What the reporter is told of it.
    pub(super) fn link(&self) -> VipLink {
        VipLink { id: self.id.as_str().to_owned(), ifname: self.vip.ifname.clone(), mac: self.mac }
    }
}
