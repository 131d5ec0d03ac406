//! A network-namespace test topology: a few "nodes", a client and a gateway
//! plugged into two switches, all of it in namespaces of its own.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use havip_e2e::netns::{Link, Topology};
//! let topo = Topology::builder().nodes(2).build()?;
//! let n0 = topo.node(0);
//! println!("{} has {} on {}", n0.ns, n0.data_ip, n0.data_if);
//! topo.cut_cable(0, Link::Data)?; // n0's eth0 now reports NO-CARRIER
//! topo.restore_cable(0, Link::Data)?;
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! Every bridge lives inside a "switch" namespace: a Docker daemon on the host sets
//! the root namespace's iptables FORWARD policy to DROP and filters bridged frames,
//! which silently breaks host-side bridges. Nothing of a topology ever appears in
//! the root namespace: each veth pair is created with its two ends directly in their
//! target namespaces.
//!
//! | namespace         | interface | address (data `10.<k>.0.0/24`, mgmt `10.<k>.1.0/24`)        |
//! |-------------------|-----------|-------------------------------------------------------------|
//! | `<prefix>-sw`     | `data`    | bridge (no address), ports `n<i>-data`, `cl-data`, `gw-data` |
//! |                   | `mgmt`    | bridge (no address), ports `n<i>-mgmt`                       |
//! | `<prefix>-n<i>`   | `eth0`    | `10.<k>.0.<10+i>/24`, `fd00:6876:<k>::<10+i>/64`            |
//! |                   | `eth1`    | `10.<k>.1.<10+i>/24`, `fd00:6876:<k>:1::<10+i>/64`          |
//! | `<prefix>-cl`     | `eth0`    | `10.<k>.0.100/24`, `fd00:6876:<k>::100/64`                  |
//! | `<prefix>-gw`     | `eth0`    | `10.<k>.0.254/24`, `fd00:6876:<k>::254/64` (the gateway)    |
//!
//! VIPs for tests: [`Topology::vip`] is `10.<k>.0.<50+j>`, [`Topology::vip6`] is
//! `fd00:6876:<k>::<50+j>` (the IPv6 groups are written with the same digits as the
//! IPv4 octets, read as hex). Nodes have default routes (IPv4 and IPv6) via the
//! gateway. The static IPv6 addresses are added `nodad`, so they are usable at
//! once; link-local addresses go through normal DAD (see
//! [`Topology::wait_ipv6_ready`]).
//!
//! `<prefix>` is `hve2e-<pid>-<counter>`. `<k>` (100..=250) is unique among live
//! topologies on the machine: it is held with an exclusive `flock` on
//! `/run/havip-e2e/subnet-<k>.lock` for the topology's lifetime, which the kernel
//! releases when the process dies, so a crash never leaks a subnet. The same `k`
//! gives unique VRRP router ids (see the keepalived module).
//!
//! # Crash safety
//!
//! The owner also holds `flock` on `/run/havip-e2e/<prefix>.lock`. [`cleanup_stale`]
//! (called by every [`TopologyBuilder::build`]) deletes namespaces named
//! `hve2e-<pid>-…` whose pid is dead or whose owner lock is no longer held, so a
//! killed test run never poisons the next. `Drop` kills every process in the
//! topology's namespaces and deletes them; errors are logged, never panicked on.
//!
//! # Faults
//!
//! Every fault has an idempotent inverse, and [`Topology::heal_all`] undoes them all.
//! - [`Topology::cut_cable`] sets the *switch-side* end of a node's veth down: the
//!   node's interface stays administratively `UP` but reports `NO-CARRIER`,
//!   operstate `DOWN`, exactly like a pulled cable. The kernel then flushes the
//!   node's neighbour entries on that device and marks its routes `linkdown`;
//!   addresses (IPv4 and IPv6) stay. [`Topology::restore_cable`] brings `LOWER_UP`
//!   back at once (veth carrier follows the peer synchronously).
//! - [`Topology::partition_udp_port`], [`Topology::block_tcp_port`] and
//!   [`Topology::block_ip_proto`] install one `netdev` nftables table per fault in
//!   the node's namespace, hooked at ingress and egress of the chosen interfaces, so
//!   [`Topology::heal`] removes exactly that fault. The drop is silent to the
//!   sender, like loss on a wire; an `inet` OUTPUT-hook drop would make the
//!   sender's `send`/`connect` fail with EPERM instead, which no real partition does.
//! - [`Topology::set_link_loss`] drops a percentage of all frames (ARP included) at
//!   the node's switch port, both directions (`tc netem` is not available in this
//!   machine's kernel); 100 % is a black hole with carrier still up.
//! - [`Topology::set_gateway_up`] unplugs the gateway from the data switch.
//!
//! # Running code in a namespace
//!
//! [`spawn_in`] starts a program under `ip netns exec` as a [`ManagedProcess`](crate::host::process::ManagedProcess);
//! [`run_in_netns`] runs a closure on a thread that `setns`'d into the namespace
//! (sockets it opens live there; a tokio runtime must be created on that thread).
//!
//! # Sysctls
//!
//! Node, client and gateway namespaces get kernel defaults (this host has
//! `net.core.devconf_inherit_init_net = 0`), with `disable_ipv6 = 0` and the
//! client's `arp_accept = 0` set explicitly: the client must only *update* an
//! existing neighbour entry on a gratuitous ARP, never create one. The client also
//! has `tcp_tw_reuse = 1` (a load generator's setting: its probes may close first and
//! leave TIME_WAIT there). The switch
//! namespace has IPv6 disabled, and its bridges have multicast snooping off (VRRP
//! and NDP multicast is simply flooded, like a dumb switch).
//!
//! # Modules
//!
//! | module | what |
//! |---|---|
//! | [`topology`] | [`Topology`], its builder, nodes and hosts, removal on drop |
//! | [`faults`] | cables cut, drops and loss, [`Fault`]s and healing them |
//! | [`thread`] | code inside a namespace: [`run_in_netns`], [`in_netns`], [`spawn_in`] |
//! | [`state`] | links, addresses, neighbours and sysctls of a namespace; [`wait_until`] |
//! | [`command`] | `ip` and `nft`, [`exec`]; [`require_root`] |
//! | [`owner`] | lock files, and the cleanup of what dead runs left ([`cleanup_stale`]) |
//! | [`layout`] | names, places, the address plan and [`Link`] |
//! | [`error`] | [`NetnsError`] |

pub mod command;
pub mod error;
pub mod faults;
pub mod layout;
pub mod owner;
pub mod state;
pub mod thread;
pub mod topology;

pub use command::{exec, ns_pids, require_root, skip_unless_root};
pub use error::NetnsError;
pub use faults::Fault;
pub use layout::{DATA_IF, Link, MGMT_IF, NETNS_DIR, NS_PREFIX, STATE_DIR};
pub use owner::{cleanup_stale, list_namespaces};
pub use state::{
    Address, LinkState, Neighbour, addresses, has_address, link_index, link_state, neighbour, pin_neighbour,
    resolve_neighbour, set_forwarding, sysctl, wait_until, warm_neighbour,
};
pub use thread::{NetnsThread, in_netns, run_in_netns, spawn_in};
pub use topology::{HostInfo, NodeInfo, Topology, TopologyBuilder};
