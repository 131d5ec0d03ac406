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
//! - An **IPAddressPool** holding exactly the VIP ([`Topology::vip`]`(0)/32`) and an
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

use crate::harness::agent::SERVICE_PORT;
use crate::harness::controlplane::{ControlPlane, ControlPlaneError, ControlPlaneOptions, client_from_kubeconfig};
use crate::harness::testbin::{MetalLbBin, MetalLbNotFound};
use crate::host::netns::{self, DATA_IF, NetnsError, Topology};
use crate::host::process::{ManagedProcess, ProcessError, free_port};
use crate::traffic::{Listener, ProberConfig, TrafficError, probe_once};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use nix::sys::signal::Signal;
use serde::Deserialize;
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The namespace MetalLB runs in.
pub const METALLB_NAMESPACE: &str = "metallb-system";
/// The namespace of the benchmark's Service.
pub const SERVICE_NAMESPACE: &str = "default";
/// The benchmark's Service.
pub const SERVICE_NAME: &str = "havip-bench";
/// The IPAddressPool (and L2Advertisement) name.
pub const POOL: &str = "havip-bench";
/// The labels of the speaker Pods, as `--ml-labels` selects them.
pub const SPEAKER_LABELS: &str = "app=metallb,component=speaker";
/// memberlist's port (MetalLB's default).
pub const MEMBERLIST_PORT: u16 = 7946;
/// The speakers' metrics port, inside each node's namespace (MetalLB's default).
pub const SPEAKER_METRICS_PORT: u16 = 7472;
/// The nftables table that stands in for kube-proxy in each node's namespace.
pub const KUBE_PROXY_TABLE: &str = "havip_kube_proxy";

const FIELD_MANAGER: &str = "havip-e2e";
const MEMBERLIST_SECRET: &str = "memberlist";
const MEMBERLIST_EVENT: &str = "node event - forcing sync";

/// Errors of the MetalLB lab.
#[derive(Debug, thiserror::Error)]
pub enum MetalLbError {
    /// MetalLB is not built.
    #[error(transparent)]
    NotFound(#[from] MetalLbNotFound),
    /// A namespace operation failed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The control plane failed.
    #[error(transparent)]
    ControlPlane(#[from] ControlPlaneError),
    /// A listener or probe failed.
    #[error(transparent)]
    Traffic(#[from] TrafficError),
    /// A process could not be started.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// An API call failed.
    #[error("failed to {op}: {source}")]
    Kube {
        /// What was attempted.
        op: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// A file operation failed.
    #[error("failed to {op}: {source}")]
    Io {
        /// What was attempted.
        op: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A manifest could not be read.
    #[error("invalid manifest {what}: {reason}")]
    Manifest {
        /// Which.
        what: String,
        /// Why.
        reason: String,
    },
    /// The configuration is unusable.
    #[error("invalid MetalLB lab configuration: {0}")]
    Invalid(String),
    /// MetalLB did not get where it should, or a process exited.
    #[error("MetalLB {what}; last log lines:\n{logs}")]
    Failed {
        /// What went wrong.
        what: String,
        /// The controller's and speakers' log tails.
        logs: String,
    },
}

type Result<T, E = MetalLbError> = std::result::Result<T, E>;

fn kerr(op: impl Into<String>) -> impl FnOnce(kube::Error) -> MetalLbError {
    let op = op.into();
    move |source| MetalLbError::Kube { op, source }
}

/// The Service's `externalTrafficPolicy` (see the module docs for why `Local` is the
/// default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrafficPolicy {
    /// Only nodes with a ready local endpoint announce; traffic stays on the node.
    Local,
    /// Every node with a speaker may announce.
    Cluster,
}

impl TrafficPolicy {
    /// The API value.
    pub fn as_str(self) -> &'static str {
        match self {
            TrafficPolicy::Local => "Local",
            TrafficPolicy::Cluster => "Cluster",
        }
    }
}

/// What to run. MetalLB's own settings stay at its defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct MetalLbConfig {
    /// Lab nodes (2..=5), each with a speaker and a listener.
    pub nodes: usize,
    /// The Service's port, and the listeners' (8080).
    pub port: u16,
    /// The Service's `externalTrafficPolicy` (`Local`).
    pub traffic_policy: TrafficPolicy,
    /// The controller's and speakers' `--log-level` (`info`).
    pub log_level: String,
    /// How long [`MetalLbLab::start`] waits for each step (60 s).
    pub timeout: Duration,
}

impl Default for MetalLbConfig {
    fn default() -> Self {
        Self {
            nodes: 2,
            port: SERVICE_PORT,
            traffic_policy: TrafficPolicy::Local,
            log_level: "info".to_owned(),
            timeout: Duration::from_secs(60),
        }
    }
}

/// One memberlist event a speaker logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberEvent {
    /// The member's node name.
    pub node: String,
    /// `NodeJoin`, `NodeLeave` or `NodeUpdate`.
    pub event: String,
}

/// The memberlist events in a speaker's log (its JSON lines), oldest first.
pub fn member_events(log: &str) -> Vec<MemberEvent> {
    log.lines()
        .filter(|l| l.contains(MEMBERLIST_EVENT))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("msg").and_then(|m| m.as_str()) == Some(MEMBERLIST_EVENT))
        .filter_map(|v| {
            Some(MemberEvent {
                node: v.get("node name")?.as_str()?.to_owned(),
                event: v.get("node event")?.as_str()?.to_owned(),
            })
        })
        .collect()
}

/// The members a speaker sees after `events` (joins and updates add, leaves remove).
pub fn members_after(events: &[MemberEvent]) -> BTreeSet<String> {
    let mut members = BTreeSet::new();
    for e in events {
        if e.event == "NodeLeave" {
            members.remove(&e.node);
        } else {
            members.insert(e.node.clone());
        }
    }
    members
}

/// A MetalLB layer-2 setup on its own control plane and topology; everything is stopped
/// and removed on drop (speakers and controller SIGKILLed: nothing of theirs outlives the
/// namespaces and the control plane).
pub struct MetalLbLab {
    // Field order matters: processes first, then the control plane, then the topology.
    speakers: Vec<Option<ManagedProcess>>,
    speaker_log_start: Vec<u64>,
    controller: Option<ManagedProcess>,
    /// Listeners per node (answer with the node's name on `0.0.0.0:port`).
    pub listeners: Vec<Listener>,
    /// The control plane.
    pub cp: ControlPlane,
    /// The topology.
    pub topo: Topology,
    bin: MetalLbBin,
    config: MetalLbConfig,
    vip: Ipv4Addr,
}

impl std::fmt::Debug for MetalLbLab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetalLbLab")
            .field("topology", &self.topo.prefix())
            .field("api", &self.cp.server_url())
            .field("vip", &self.vip)
            .field("bin", &self.bin.dir())
            .finish()
    }
}

/// The API resource of a MetalLB kind (group `metallb.io`, version `v1beta1`).
fn metallb_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "metallb.io".into(),
        version: "v1beta1".into(),
        api_version: "metallb.io/v1beta1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

impl MetalLbLab {
    /// Builds the topology, starts the control plane, applies the objects (see the module
    /// docs), installs the kube-proxy stand-in, starts the controller and the speakers,
    /// and returns once the Service has its address, every speaker sees every other in
    /// memberlist, exactly one node announces, the client's ARP entry for the VIP names
    /// that node's MAC, a connect through the VIP is answered by it, and its burst of
    /// gratuitous ARPs is over (see [`MetalLbLab::wait_announcements_done`]).
    pub fn start(config: MetalLbConfig) -> Result<Self> {
        if !(2..=5).contains(&config.nodes) {
            return Err(MetalLbError::Invalid(format!("{} nodes; 2..=5 are supported", config.nodes)));
        }
        let bin = MetalLbBin::find()?;
        let topo = Topology::builder().nodes(config.nodes).host_port(true).build()?;
        let cp = ControlPlane::start(ControlPlaneOptions {
            bind_address: IpAddr::V4(topo.host_ip()),
            ..Default::default()
        })?;
        let mut listeners = Vec::new();
        for i in 0..config.nodes {
            listeners.push(Listener::on_node(&topo, i, config.port)?);
        }
        let vip = topo.vip(0);
        let mut lab = Self {
            speakers: (0..config.nodes).map(|_| None).collect(),
            speaker_log_start: vec![0; config.nodes],
            controller: None,
            listeners,
            cp,
            topo,
            bin,
            config,
            vip,
        };
        for i in 0..lab.config.nodes {
            lab.install_kube_proxy_rule(i)?;
        }
        let key = lab.write_memberlist_key()?;
        lab.block_on(lab.apply_objects(&key))??;
        lab.start_controller()?;
        lab.wait_ingress_ip(lab.config.timeout)?;
        for i in 0..lab.config.nodes {
            lab.start_speaker(i)?;
        }
        lab.wait_memberlist_converged(lab.config.timeout)?;
        let holder = lab.settle_announcer(lab.config.timeout)?;
        lab.check_answered_by(holder)?;
        lab.wait_announcements_done(holder, lab.config.timeout)?;
        tracing::info!(vip = %lab.vip, holder = %lab.topo.node(holder).name, "MetalLB is announcing");
        Ok(lab)
    }

    /// Runs a future on a fresh current-thread runtime (the lab's API is synchronous).
    fn block_on<F: std::future::Future>(&self, f: F) -> Result<F::Output> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| MetalLbError::Io { op: "build a tokio runtime".into(), source })?;
        Ok(rt.block_on(f))
    }

    async fn client(&self) -> Result<Client> {
        Ok(client_from_kubeconfig(&self.cp.kubeconfig()).await?)
    }

    /// The VIP (the pool's only address).
    pub fn vip(&self) -> Ipv4Addr {
        self.vip
    }

    /// `VIP:port`, what the client connects to.
    pub fn target(&self) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.vip), self.config.port)
    }

    /// The binaries in use.
    pub fn bin(&self) -> &MetalLbBin {
        &self.bin
    }

    fn memberlist_dir(&self) -> PathBuf {
        self.topo.dir().join("memberlist")
    }

    /// The memberlist key, as the Secret's `secretkey` would be mounted (random, base64).
    fn write_memberlist_key(&self) -> Result<String> {
        use base64::Engine;
        let dir = self.memberlist_dir();
        std::fs::create_dir_all(&dir)
            .map_err(|source| MetalLbError::Io { op: format!("create {}", dir.display()), source })?;
        let mut raw = [0u8; 16];
        let mut f = std::fs::File::open("/dev/urandom")
            .map_err(|source| MetalLbError::Io { op: "open /dev/urandom".into(), source })?;
        std::io::Read::read_exact(&mut f, &mut raw)
            .map_err(|source| MetalLbError::Io { op: "read /dev/urandom".into(), source })?;
        let key = base64::engine::general_purpose::STANDARD_NO_PAD.encode(raw);
        let path = dir.join("secretkey");
        std::fs::write(&path, &key)
            .map_err(|source| MetalLbError::Io { op: format!("write {}", path.display()), source })?;
        Ok(key)
    }

    /// What kube-proxy does for a LoadBalancer address with `Local` endpoints on the node:
    /// DNAT `VIP:port` to the node's own endpoint (its data address), in prerouting and
    /// output. Replaces the table if present.
    fn install_kube_proxy_rule(&self, node: usize) -> Result<()> {
        let n = self.topo.node(node);
        let (vip, port, to) = (self.vip, self.config.port, n.data_ip);
        let t = KUBE_PROXY_TABLE;
        let script = format!(
            "add table ip {t}\ndelete table ip {t}\ntable ip {t} {{\n\
             \x20 chain prerouting {{\n    type nat hook prerouting priority dstnat; policy accept;\n    \
             ip daddr {vip} tcp dport {port} dnat to {to}:{port}\n  }}\n\
             \x20 chain output {{\n    type nat hook output priority -100; policy accept;\n    \
             ip daddr {vip} tcp dport {port} dnat to {to}:{port}\n  }}\n}}\n"
        );
        let path = self.topo.dir().join(format!("kube-proxy-{}.nft", n.name));
        std::fs::write(&path, script)
            .map_err(|source| MetalLbError::Io { op: format!("write {}", path.display()), source })?;
        netns::exec(&n.ns, "nft", &["-f", &path.display().to_string()])?;
        Ok(())
    }

    /// Applies the objects of the module docs; `key` is the memberlist key.
    async fn apply_objects(&self, key: &str) -> Result<()> {
        let client = self.client().await?;
        self.apply_crds(&client).await?;
        let ns = METALLB_NAMESPACE;
        let core = |kind: &str, plural: &str| ApiResource {
            group: String::new(),
            version: "v1".into(),
            api_version: "v1".into(),
            kind: kind.into(),
            plural: plural.into(),
        };
        apply(&client, &core("Namespace", "namespaces"), None, serde_json::json!({"metadata": {"name": ns}})).await?;
        for sa in ["controller", "speaker"] {
            apply(
                &client,
                &core("ServiceAccount", "serviceaccounts"),
                Some(ns),
                serde_json::json!({"metadata": {"name": sa, "namespace": ns, "labels": {"app": "metallb"}}}),
            )
            .await?;
        }
        apply(
            &client,
            &core("Secret", "secrets"),
            Some(ns),
            serde_json::json!({
                "metadata": {"name": MEMBERLIST_SECRET, "namespace": ns},
                "stringData": {"secretkey": key},
            }),
        )
        .await?;
        let nodes: Api<Node> = Api::all(client.clone());
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        for n in self.topo.nodes() {
            apply(
                &client,
                &core("Node", "nodes"),
                None,
                serde_json::json!({"metadata": {"name": n.name, "labels": {
                    "kubernetes.io/hostname": n.name, "kubernetes.io/os": "linux",
                }}}),
            )
            .await?;
            let status = serde_json::json!({"status": {
                "addresses": [
                    {"type": "InternalIP", "address": n.data_ip.to_string()},
                    {"type": "Hostname", "address": n.name},
                ],
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "havip-e2e lab node"},
                    {"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated", "message": "havip-e2e lab node"},
                ],
            }});
            nodes
                .patch_status(&n.name, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .map_err(kerr(format!("set the status of node {}", n.name)))?;
            let pod = speaker_pod(&n.name);
            apply(
                &client,
                &core("Pod", "pods"),
                Some(ns),
                serde_json::json!({
                    "metadata": {"name": pod, "namespace": ns,
                                 "labels": {"app": "metallb", "component": "speaker"}},
                    "spec": {
                        "nodeName": n.name, "hostNetwork": true, "serviceAccountName": "speaker",
                        "containers": [{"name": "speaker",
                                        "image": format!("quay.io/metallb/speaker:v{}", crate::harness::testbin::METALLB_VERSION)}],
                    },
                }),
            )
            .await?;
            let ip = n.data_ip.to_string();
            let status = serde_json::json!({"status": {
                "phase": "Running", "hostIP": ip, "hostIPs": [{"ip": ip}], "podIP": ip, "podIPs": [{"ip": ip}],
                "conditions": [{"type": "Ready", "status": "True"}],
            }});
            pods.patch_status(&pod, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .map_err(kerr(format!("set the status of pod {pod}")))?;
        }
        apply(
            &client,
            &metallb_resource("IPAddressPool", "ipaddresspools"),
            Some(ns),
            serde_json::json!({
                "metadata": {"name": POOL, "namespace": ns},
                "spec": {"addresses": [format!("{}/32", self.vip)]},
            }),
        )
        .await?;
        apply(
            &client,
            &metallb_resource("L2Advertisement", "l2advertisements"),
            Some(ns),
            serde_json::json!({
                "metadata": {"name": POOL, "namespace": ns},
                "spec": {"ipAddressPools": [POOL]},
            }),
        )
        .await?;
        let port = self.config.port;
        apply(
            &client,
            &core("Service", "services"),
            Some(SERVICE_NAMESPACE),
            serde_json::json!({
                "metadata": {"name": SERVICE_NAME, "namespace": SERVICE_NAMESPACE},
                "spec": {
                    "type": "LoadBalancer",
                    "externalTrafficPolicy": self.config.traffic_policy.as_str(),
                    "ports": [{"name": "probe", "protocol": "TCP", "port": port, "targetPort": port}],
                },
            }),
        )
        .await?;
        let endpoints: Vec<serde_json::Value> = self
            .topo
            .nodes()
            .iter()
            .map(|n| {
                serde_json::json!({
                    "addresses": [n.data_ip.to_string()],
                    "nodeName": n.name,
                    "conditions": {"ready": true, "serving": true, "terminating": false},
                })
            })
            .collect();
        apply(
            &client,
            &ApiResource {
                group: "discovery.k8s.io".into(),
                version: "v1".into(),
                api_version: "discovery.k8s.io/v1".into(),
                kind: "EndpointSlice".into(),
                plural: "endpointslices".into(),
            },
            Some(SERVICE_NAMESPACE),
            serde_json::json!({
                "metadata": {"name": format!("{SERVICE_NAME}-lab"), "namespace": SERVICE_NAMESPACE, "labels": {
                    "kubernetes.io/service-name": SERVICE_NAME,
                    "endpointslice.kubernetes.io/managed-by": "havip-e2e",
                }},
                "addressType": "IPv4",
                "endpoints": endpoints,
                "ports": [{"name": "probe", "protocol": "TCP", "port": port}],
            }),
        )
        .await?;
        Ok(())
    }

    /// Applies every CRD of the module's `config/crd/bases` and waits until each is
    /// Established.
    async fn apply_crds(&self, client: &Client) -> Result<()> {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let files = self
            .bin
            .crd_files()
            .map_err(|source| MetalLbError::Io { op: format!("list {}", self.bin.crds_dir().display()), source })?;
        if files.is_empty() {
            return Err(MetalLbError::Invalid(format!("no CRDs in {}", self.bin.crds_dir().display())));
        }
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        let mut names = Vec::new();
        for file in files {
            for v in yaml_documents(&file)? {
                let crd: CustomResourceDefinition = serde_json::from_value(v)
                    .map_err(|e| MetalLbError::Manifest { what: file.display().to_string(), reason: e.to_string() })?;
                let name = crd.name_any();
                crds.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&crd))
                    .await
                    .map_err(kerr(format!("apply CRD {name}")))?;
                names.push(name);
            }
        }
        crate::harness::kubelab::wait_crds_established(client, &names, Duration::from_secs(30))
            .await
            .map_err(MetalLbError::Invalid)
    }

    fn kube_env(&self) -> Vec<(String, String)> {
        vec![("KUBECONFIG".to_owned(), self.cp.kubeconfig().display().to_string())]
    }

    fn controller_log(&self) -> PathBuf {
        self.topo.dir().join("metallb-controller.log")
    }

    /// The log file of node `node`'s speaker (every start appended).
    pub fn speaker_log(&self, node: usize) -> PathBuf {
        self.topo.dir().join(format!("metallb-speaker-{}.log", self.topo.node(node).name))
    }

    fn start_controller(&mut self) -> Result<()> {
        let port = free_port(IpAddr::V4(Ipv4Addr::LOCALHOST))
            .map_err(|source| MetalLbError::Io { op: "find a free port for the controller".into(), source })?;
        let args = vec![
            format!("--namespace={METALLB_NAMESPACE}"),
            "--webhook-mode=disabled".to_owned(),
            format!("--port={port}"),
            format!("--log-level={}", self.config.log_level),
        ];
        let p = ManagedProcess::spawn(
            "metallb-controller",
            &self.bin.controller(),
            &args,
            &self.kube_env(),
            &self.controller_log(),
        )?;
        self.controller = Some(p);
        Ok(())
    }

    /// Starts node `node`'s speaker in its namespace (again, after
    /// [`MetalLbLab::terminate_speaker`] or [`MetalLbLab::kill_speaker`]); does nothing while
    /// it runs.
    pub fn start_speaker(&mut self, node: usize) -> Result<()> {
        let n = self.topo.nodes().get(node).ok_or_else(|| MetalLbError::Invalid(format!("no node {node}")))?.clone();
        if self.speakers[node].as_mut().is_some_and(ManagedProcess::is_running) {
            return Ok(());
        }
        let args = vec![
            format!("--node-name={}", n.name),
            format!("--pod-name={}", speaker_pod(&n.name)),
            format!("--namespace={METALLB_NAMESPACE}"),
            format!("--ml-bindaddr={}", n.data_ip),
            format!("--ml-bindport={MEMBERLIST_PORT}"),
            format!("--ml-labels={SPEAKER_LABELS}"),
            format!("--ml-secret-key-path={}", self.memberlist_dir().display()),
            format!("--port={SPEAKER_METRICS_PORT}"),
            format!("--log-level={}", self.config.log_level),
        ];
        let log = self.speaker_log(node);
        self.speaker_log_start[node] = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        let p = netns::spawn_in(
            &n.ns,
            &format!("metallb-speaker-{}", n.name),
            &self.bin.speaker(),
            &args,
            &self.kube_env(),
            &log,
        )?;
        self.speakers[node] = Some(p);
        Ok(())
    }

    /// The planned move: SIGTERM to node `node`'s speaker (it leaves memberlist on its way
    /// out, so the others take over without waiting for failure detection). Returns at
    /// once; see [`MetalLbLab::wait_speaker_exit`].
    pub fn terminate_speaker(&mut self, node: usize) -> Result<()> {
        let p = self.speakers.get(node).and_then(Option::as_ref).ok_or_else(|| self.failed("speaker not running"))?;
        tracing::info!(node = %self.topo.node(node).name, "stopping the MetalLB speaker (SIGTERM)");
        p.signal(Signal::SIGTERM).map_err(|e| MetalLbError::Io { op: "signal the speaker".into(), source: e.into() })
    }

    /// Waits until node `node`'s speaker has exited (SIGKILL after `timeout`).
    pub fn wait_speaker_exit(&mut self, node: usize, timeout: Duration) -> bool {
        let Some(p) = self.speakers.get_mut(node).and_then(Option::as_mut) else { return true };
        let start = Instant::now();
        while p.is_running() {
            if start.elapsed() >= timeout {
                p.kill_now();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// A crash: SIGKILL to node `node`'s speaker (no memberlist leave).
    pub fn kill_speaker(&mut self, node: usize) {
        if let Some(mut p) = self.speakers.get_mut(node).and_then(Option::take) {
            tracing::info!(node = %self.topo.node(node).name, "killing the MetalLB speaker (SIGKILL)");
            p.kill_now();
        }
    }

    /// Whether node `node`'s speaker runs.
    pub fn speaker_running(&mut self, node: usize) -> bool {
        self.speakers.get_mut(node).and_then(Option::as_mut).is_some_and(ManagedProcess::is_running)
    }

    fn check_processes(&mut self) -> Result<()> {
        if !self.controller.as_mut().is_some_and(ManagedProcess::is_running) {
            return Err(self.failed("controller exited"));
        }
        for i in 0..self.speakers.len() {
            if self.speakers[i].is_some() && !self.speaker_running(i) {
                return Err(self.failed(&format!("speaker on n{i} exited")));
            }
        }
        Ok(())
    }

    fn failed(&self, what: &str) -> MetalLbError {
        MetalLbError::Failed { what: what.to_owned(), logs: self.logs_tail(25) }
    }

    /// The Service's load-balancer ingress addresses.
    pub fn ingress_ips(&self) -> Result<Vec<String>> {
        self.block_on(async {
            let client = self.client().await?;
            let svcs: Api<Service> = Api::namespaced(client, SERVICE_NAMESPACE);
            let svc = svcs.get(SERVICE_NAME).await.map_err(kerr("read the Service"))?;
            Ok(svc
                .status
                .and_then(|s| s.load_balancer)
                .and_then(|lb| lb.ingress)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|i| i.ip)
                .collect())
        })?
    }

    fn wait_ingress_ip(&mut self, timeout: Duration) -> Result<()> {
        let want = self.vip.to_string();
        let start = Instant::now();
        loop {
            self.check_processes()?;
            if self.ingress_ips()?.contains(&want) {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                return Err(self.failed(&format!("controller did not assign {want} to the Service within {timeout:?}")));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The memberlist members node `node`'s speaker has logged since its last start.
    pub fn members_seen_by(&self, node: usize) -> BTreeSet<String> {
        let text = std::fs::read(self.speaker_log(node)).unwrap_or_default();
        let from = usize::try_from(self.speaker_log_start[node]).unwrap_or(0);
        let fresh = String::from_utf8_lossy(text.get(from..).unwrap_or(&[]));
        members_after(&member_events(&fresh))
    }

    /// Waits until every running speaker sees every node's speaker in memberlist.
    pub fn wait_memberlist_converged(&mut self, timeout: Duration) -> Result<()> {
        let all: BTreeSet<String> = self.topo.nodes().iter().map(|n| n.name.clone()).collect();
        let start = Instant::now();
        loop {
            self.check_processes()?;
            let converged = (0..self.speakers.len()).all(|i| {
                let mut seen = self.members_seen_by(i);
                seen.insert(self.topo.node(i).name.clone());
                seen == all
            });
            if converged {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                return Err(self.failed(&format!("speakers did not all join memberlist within {timeout:?}")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The nodes named by the Service's `ServiceL2Status` objects (label `metallb.io/node`,
    /// else `status.node`; see the module docs for why the label), sorted.
    pub fn announcers(&self) -> Result<Vec<String>> {
        self.block_on(async {
            let client = self.client().await?;
            let api: Api<DynamicObject> = Api::namespaced_with(
                client,
                METALLB_NAMESPACE,
                &metallb_resource("ServiceL2Status", "servicel2statuses"),
            );
            let list = api
                .list(&ListParams::default().labels(&format!("metallb.io/service-name={SERVICE_NAME}")))
                .await
                .map_err(kerr("list ServiceL2Status objects"))?;
            let mut nodes: Vec<String> = list
                .items
                .iter()
                .filter_map(|o| {
                    o.labels()
                        .get("metallb.io/node")
                        .cloned()
                        .or_else(|| o.data.get("status")?.get("node")?.as_str().map(str::to_owned))
                })
                .collect();
            nodes.sort();
            Ok(nodes)
        })?
    }

    fn node_index(&self, name: &str) -> Option<usize> {
        self.topo.nodes().iter().position(|n| n.name == name)
    }

    /// The index of the one node that announces, when exactly one does.
    pub fn announcer_index(&self) -> Result<usize> {
        match self.announcers()?.as_slice() {
            [one] => self.node_index(one).ok_or_else(|| MetalLbError::Invalid(format!("unknown node {one}"))),
            other => Err(self.failed(&format!("announcers: {other:?}, not exactly one"))),
        }
    }

    /// Waits until exactly one node announces; returns its index.
    pub fn wait_one_announcer(&mut self, timeout: Duration) -> Result<usize> {
        let start = Instant::now();
        loop {
            self.check_processes()?;
            if let [one] = self.announcers()?.as_slice()
                && let Some(i) = self.node_index(one)
            {
                return Ok(i);
            }
            if start.elapsed() >= timeout {
                let now = self.announcers()?;
                return Err(self.failed(&format!("not exactly one announcer within {timeout:?} (now: {now:?})")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Setup: waits until there is one announcer and the client's ARP entry names it.
    /// Right after memberlist converges MetalLB may elect again, and the client may keep
    /// the first announcer's entry (it was seen once in about 16 setups): such an entry
    /// is deleted, so that the next resolution asks everyone, and the announcer is read
    /// again. Only before any measurement.
    fn settle_announcer(&mut self, timeout: Duration) -> Result<usize> {
        let start = Instant::now();
        let client = self.topo.client().ns.clone();
        loop {
            let left = timeout.saturating_sub(start.elapsed()).max(Duration::from_millis(1));
            let holder = self.wait_one_announcer(left)?;
            match self.wait_client_arp(holder, left.min(Duration::from_secs(5))) {
                Ok(_) => return Ok(holder),
                Err(e) if start.elapsed() < timeout => {
                    tracing::info!("MetalLB lab: the client's entry is not the announcer's; asking again");
                    tracing::debug!(error = %e, "MetalLB lab: client entry");
                    let vip = self.vip.to_string();
                    if let Err(e) = netns::exec(&client, "ip", &["neigh", "del", &vip, "dev", DATA_IF]) {
                        tracing::debug!(error = %e, "MetalLB lab: no client entry to delete");
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Waits until node `node` publishes a `ServiceL2Status` (others may still have theirs).
    pub fn wait_announced_by(&self, node: usize, timeout: Duration) -> Result<Duration> {
        let name = self.topo.node(node).name.clone();
        let start = Instant::now();
        loop {
            if self.announcers()?.contains(&name) {
                return Ok(start.elapsed());
            }
            if start.elapsed() >= timeout {
                return Err(self.failed(&format!("{name} did not announce within {timeout:?}")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the client's ARP entry for the VIP resolves to node `node`'s data MAC
    /// (asking again whenever it is unresolved); returns how long it took.
    pub fn wait_client_arp(&self, node: usize, timeout: Duration) -> Result<Duration> {
        let n = self.topo.node(node);
        let client = self.topo.client().ns.clone();
        let start = Instant::now();
        loop {
            let left = timeout.saturating_sub(start.elapsed());
            let mac =
                netns::resolve_neighbour(&client, DATA_IF, IpAddr::V4(self.vip), left.max(Duration::from_millis(1)));
            match mac {
                Ok(m) if m.eq_ignore_ascii_case(&n.data_mac) => return Ok(start.elapsed()),
                Ok(_) | Err(NetnsError::Timeout { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            if start.elapsed() >= timeout {
                let now = netns::neighbour(&client, DATA_IF, IpAddr::V4(self.vip))?;
                return Err(self.failed(&format!(
                    "the client's ARP entry for {} did not name {} ({}) within {timeout:?}; now: {now:?}",
                    self.vip, n.name, n.data_mac
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Node `node`'s speaker's `metallb_layer2_gratuitous_sent` for the VIP (its metrics
    /// inside the node's namespace); `None` when it cannot be read or has no such sample.
    pub fn gratuitous_sent(&self, node: usize) -> Option<f64> {
        let text = crate::harness::agent::metrics_in(&self.topo.node(node).ns, SPEAKER_METRICS_PORT);
        metric_value(&text, "metallb_layer2_gratuitous_sent", &format!("ip=\"{}\"", self.vip))
    }

    /// Waits until node `node`'s speaker has sent gratuitous ARPs for the VIP and then no
    /// more for 2 s: the burst MetalLB sends on taking an address (every 1.1 s for 5 s)
    /// is over. A holder stopped during its burst goes on announcing itself until its
    /// process exits, so the planned move starts from a settled holder (as havip's and
    /// keepalived's do).
    pub fn wait_announcements_done(&self, node: usize, timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        let mut last: Option<(f64, Instant)> = None;
        loop {
            let now = self.gratuitous_sent(node);
            match (now, last) {
                // Unchanged (a counter: equal floats are the same count) for 2 s: done.
                (Some(n), Some((l, since))) if n == l && since.elapsed() >= Duration::from_secs(2) => {
                    return Ok(start.elapsed());
                }
                (Some(n), Some((l, _))) if n == l => {}
                (Some(n), _) if n > 0.0 => last = Some((n, Instant::now())),
                _ => {}
            }
            if start.elapsed() >= timeout {
                return Err(self.failed(&format!(
                    "n{node}'s gratuitous ARPs for {} did not settle within {timeout:?} (now {now:?})",
                    self.vip
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// One connect from the client through the VIP must be answered by node `node`.
    fn check_answered_by(&self, node: usize) -> Result<()> {
        let config = ProberConfig::new(self.target())
            .connect_timeout(Duration::from_millis(500))
            .read_timeout(Duration::from_millis(500));
        let answer = netns::in_netns(&self.topo.client().ns, move || probe_once(&config))?;
        let want = &self.topo.node(node).name;
        match answer {
            Ok(who) if &who == want => Ok(()),
            Ok(who) => Err(self.failed(&format!("a connect to {} was answered by {who}, not {want}", self.target()))),
            Err(e) => Err(self.failed(&format!("a connect to {} failed: {e}", self.target()))),
        }
    }

    /// The controller's and the speakers' last `lines` log lines, for failure reports.
    pub fn logs_tail(&self, lines: usize) -> String {
        let mut out =
            format!("--- metallb controller ---\n{}\n", crate::host::process::tail(&self.controller_log(), lines));
        for i in 0..self.topo.nodes().len() {
            out.push_str(&format!(
                "--- metallb speaker {} ---\n{}\n",
                self.topo.node(i).name,
                crate::host::process::tail(&self.speaker_log(i), lines)
            ));
        }
        out
    }
}

impl Drop for MetalLbLab {
    fn drop(&mut self) {
        for p in self.speakers.iter_mut().filter_map(Option::as_mut) {
            p.kill_now();
        }
        if let Some(p) = self.controller.as_mut() {
            p.kill_now();
        }
    }
}

/// The speaker Pod of node `node`.
pub fn speaker_pod(node: &str) -> String {
    format!("speaker-{node}")
}

/// Server-side apply of `obj` (`metadata` at least; `apiVersion` and `kind` are filled in).
async fn apply(client: &Client, ar: &ApiResource, ns: Option<&str>, mut obj: serde_json::Value) -> Result<()> {
    let name = obj
        .pointer("/metadata/name")
        .and_then(|n| n.as_str())
        .map(str::to_owned)
        .ok_or_else(|| MetalLbError::Manifest { what: ar.kind.clone(), reason: "no metadata.name".into() })?;
    if let Some(map) = obj.as_object_mut() {
        map.insert("apiVersion".into(), ar.api_version.clone().into());
        map.insert("kind".into(), ar.kind.clone().into());
    }
    let api: Api<DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
        None => Api::all_with(client.clone(), ar),
    };
    api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&obj))
        .await
        .map_err(kerr(format!("apply {} {name}", ar.kind)))?;
    Ok(())
}

/// The value of the first sample of `name` whose labels contain `label` (`key="value"`)
/// in a Prometheus text exposition.
pub fn metric_value(text: &str, name: &str, label: &str) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .find(|l| l.split('}').next().is_some_and(|labels| labels.contains(label)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The non-empty documents of a YAML file, as JSON values.
fn yaml_documents(path: &Path) -> Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| MetalLbError::Io { op: format!("read {}", path.display()), source })?;
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v = serde_json::Value::deserialize(doc)
            .map_err(|e| MetalLbError::Manifest { what: path.display().to_string(), reason: e.to_string() })?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memberlist_view_follows_joins_and_leaves() {
        let log = r#"{"caller":"speakerlist.go:331","level":"info","msg":"node event - forcing sync","node addr":"10.1.0.10","node event":"NodeJoin","node name":"n0","ts":"2026-12-02T08:00:00Z"}
{"caller":"main.go:1","level":"info","msg":"something else","node name":"n7"}
not json at all, node event - forcing sync
{"caller":"speakerlist.go:331","level":"info","msg":"node event - forcing sync","node addr":"10.1.0.11","node event":"NodeJoin","node name":"n1","ts":"2026-12-02T08:00:01Z"}
{"caller":"speakerlist.go:331","level":"info","msg":"node event - forcing sync","node addr":"10.1.0.11","node event":"NodeLeave","node name":"n1","ts":"2026-12-02T08:00:09Z"}
"#;
        let events = member_events(log);
        assert_eq!(events.len(), 3, "{events:?}");
        assert_eq!(events[2], MemberEvent { node: "n1".into(), event: "NodeLeave".into() });
        assert_eq!(members_after(&events), BTreeSet::from(["n0".to_owned()]));
        assert_eq!(members_after(&events[..2]), BTreeSet::from(["n0".to_owned(), "n1".to_owned()]));
    }

    #[test]
    fn reads_a_metric_sample() {
        let text = "# HELP metallb_layer2_gratuitous_sent Number of gratuitous\n\
                    metallb_layer2_gratuitous_sent_total{ip=\"10.1.0.50\"} 9\n\
                    metallb_layer2_gratuitous_sent{ip=\"10.1.0.51\"} 3\n\
                    metallb_layer2_gratuitous_sent{ip=\"10.1.0.50\"} 12\n";
        assert_eq!(metric_value(text, "metallb_layer2_gratuitous_sent", "ip=\"10.1.0.50\""), Some(12.0));
        assert_eq!(metric_value(text, "metallb_layer2_gratuitous_sent", "ip=\"10.1.0.52\""), None);
    }

    #[test]
    fn traffic_policy_names() {
        assert_eq!(TrafficPolicy::Local.as_str(), "Local");
        assert_eq!(TrafficPolicy::Cluster.as_str(), "Cluster");
        assert_eq!(MetalLbConfig::default().traffic_policy, TrafficPolicy::Local);
    }
}
