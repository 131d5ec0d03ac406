//! MetalLB in layer-2 mode (its own controller and speakers, v0.15.2, built from the Go
//! module by `hack/testbin.sh metallb`) on the local control plane, for a network-namespace
//! topology: the third system of the failover benchmark, beside havip and keepalived.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use havip_e2e::metallb::{MetalLbConfig, MetalLbLab};
//! let lab = MetalLbLab::start(MetalLbConfig::default())?;
//! let holder = lab.announcer_index()?; // the node whose speaker answers ARP for the VIP
//! println!("{} is announced from n{holder}", lab.vip());
//! # Ok(()) }
//! ```
//!
//! # What runs where
//!
//! - The topology is built with [`crate::host::netns::TopologyBuilder::host_port`]: etcd and
//!   kube-apiserver run on the host, listening on the management bridge (`10.k.1.1`), as in
//!   [`crate::harness::kubelab`]; each node reaches the API server over its management cable only.
//! - The MetalLB **controller** (IP allocation) runs on the host with the admin
//!   kubeconfig, `--webhook-mode=disabled` (the lab has no webhook Service for the API
//!   server to call) and no `--ml-secret-name` (the lab creates the memberlist Secret).
//! - One **speaker** per node runs *inside the node's namespace* (`ip netns exec`), as a
//!   host-network DaemonSet pod would: `--node-name n<i>`, `--pod-name speaker-n<i>`,
//!   memberlist bound to the node's data address on port 7946
//!   (`--ml-bindaddr`/`--ml-bindport`), `--ml-labels app=metallb,component=speaker`, the
//!   memberlist key read from a file as from the mounted Secret, the admin kubeconfig.
//!   memberlist and every other setting are MetalLB's defaults (`DefaultLANConfig`: probe
//!   every 1 s, 500 ms probe timeout, suspicion 4 × probe interval for two nodes): its
//!   failure detection takes seconds by design, and that is what the benchmark measures.
//!
//! # The API objects, and why each is there
//!
//! - MetalLB's CRDs from the module's `config/crd/bases`, as they are: the BGPPeer
//!   conversion webhook is a kustomize patch on top of them (`config/crd/patches`), not
//!   applied, so no CRD needs a webhook Service (the lab uses no BGPPeer, the only kind with
//!   two versions); the `metallb-system` namespace, ServiceAccounts
//!   `controller` and `speaker` (the Pods' admission needs them), the memberlist Secret
//!   `memberlist` (key `secretkey`).
//! - A **Node** per lab node (labels `kubernetes.io/hostname`, `kubernetes.io/os`), with
//!   status addresses `InternalIP` = data address, `Hostname`, and conditions
//!   `Ready=True`, `NetworkUnavailable=False`. The speaker needs the Node to exist (its
//!   L2Advertisement matches nodes by label; no selector = every Node) and skips nodes
//!   whose `NetworkUnavailable` is `True`; it does not read `Ready`, which is set as a
//!   kubelet would. No node-lifecycle controller runs, so nothing turns a cut node
//!   `NotReady` during a run (a real one does after 40 s, long after MetalLB has moved).
//! - A **speaker Pod** per node (never started: there is no kubelet), `spec.nodeName` and
//!   `status.podIP` = the node's data address, labels `app=metallb,component=speaker`:
//!   each speaker reads its own Pod (it owns the `ServiceL2Status` objects) and lists the
//!   speaker Pods' IPs to join memberlist.
//! - An **IPAddressPool** holding exactly the VIP ([`Topology::vip`](crate::host::netns::Topology::vip)`(0)/32`) and an
//!   **L2Advertisement** for it (defaults: every node, every interface).
//! - The **Service** `havip-bench` (`type: LoadBalancer`, TCP 8080, no selector) with a
//!   hand-made **EndpointSlice** listing both nodes' listeners (address = the node's data
//!   address, `nodeName`, ready), as for host-network backends.
//!
//! # externalTrafficPolicy: Local
//!
//! With `Local` the speakers elect among nodes that have a ready endpoint — both do here, so
//! the election is the same as with `Cluster` — and kube-proxy sends traffic for the
//! address only to the node's *own* endpoints, which is exactly what the per-node DNAT
//! below does, and what makes "who answered" name the announcing node. With `Cluster`
//! kube-proxy would spread connections over both nodes' endpoints, and after a node dies
//! keep sending some to the dead one until the node-lifecycle and EndpointSlice
//! controllers catch up (40 s and more): that would measure those controllers, not
//! MetalLB's layer-2 failover. ([`TrafficPolicy::Cluster`] is there for experiments; the
//! lab's DNAT is the same either way.)
//!
//! # The data path: what kube-proxy would do
//!
//! MetalLB only answers ARP for the address; it never adds it to an interface. kube-proxy
//! (iptables or nftables mode) makes the node accept it with a DNAT of `VIP:port` to an
//! endpoint in the nat prerouting hook (and output, for the node itself). The lab installs
//! that rule, and nothing else, in each node's namespace: table `ip havip_kube_proxy`,
//! `ip daddr VIP tcp dport 8080 dnat to <node data address>:8080` — the node's own
//! listener, as `Local` does. Replies are un-NATed by conntrack.
//!
//! # Who announces
//!
//! MetalLB 0.15 publishes a `ServiceL2Status` per announced Service (label
//! `metallb.io/node`, `status.node`): [`MetalLbLab::announcers`] reads their label. After a
//! move the new announcer takes over the old node's object when that node could not delete
//! it (cut, or stopped): v0.15.2 rewrites its label but fails to change `status.node`, which
//! the CRD makes immutable (its log says `status.node: Invalid value: "n1": Value is
//! immutable`), so the label is the field that names the current announcer. The client's
//! own view is the MAC its ARP entry for the VIP resolves to
//! ([`MetalLbLab::wait_client_arp`]).
//!
//! # Modules
//!
//! | module | what |
//! |---|---|
//! | [`lab`] | the [`MetalLbLab`]: processes, the data path, what it waits for and observes |
//! | [`objects`] | the API objects: applied, and read back |
//! | [`memberlist`] | memberlist as a speaker's log tells it |
//! | [`config`] | [`MetalLbConfig`], names and ports |
//! | [`error`] | [`MetalLbError`] |

pub mod config;
pub mod error;
pub mod lab;
pub mod memberlist;
pub mod objects;

pub use config::{
    KUBE_PROXY_TABLE, MEMBERLIST_PORT, METALLB_NAMESPACE, MetalLbConfig, Mode, POOL, SERVICE_NAME, SERVICE_NAMESPACE,
    SPEAKER_LABELS, SPEAKER_METRICS_PORT, TrafficPolicy, speaker_pod,
};
pub use error::MetalLbError;
pub use lab::MetalLbLab;
pub use memberlist::{MemberEvent, member_events, members_after};
