//! The Kubernetes lab: a real control plane on the host, N node namespaces (each with
//! a registered Node object, a listener and `havip-agent kubernetes`), a client
//! namespace, and optionally `havip-operator`. The API server listens on the host's
//! address on the management bridge (`10.k.1.1`), so each node reaches it over its
//! management link and each node's access can be cut on its own.
//!
//! Used by `lab up --nodes N` and by the end-to-end suite.

use crate::harness::agent::{SERVICE_PORT, agent_binary};
use crate::harness::api::ApplyError;
pub use crate::harness::api::NAMESPACE;
use crate::harness::controlplane::{ControlPlane, ControlPlaneOptions};
use crate::harness::metrics::{apiserver_requests, metric_sum, metrics_in};
use crate::host::netns::{self, Topology};
use crate::host::process::{ManagedProcess, tail};
use crate::traffic::Listener;
use havip_crds::HAPair;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The agents' DaemonSet (as the chart names it).
pub const AGENT_DAEMONSET: &str = "havip-agent";

/// Where each node's agent serves its metrics (inside the node's namespace).
pub const AGENT_METRICS_PORT: u16 = 9797;

/// Errors of the Kubernetes lab.
#[derive(Debug, thiserror::Error)]
pub enum KubeLabError {
    /// Topology.
    #[error(transparent)]
    Netns(#[from] netns::NetnsError),
    /// Control plane.
    #[error(transparent)]
    ControlPlane(#[from] crate::harness::controlplane::ControlPlaneError),
    /// Agent binary or listeners.
    #[error(transparent)]
    Lab(#[from] crate::harness::agent::LabError),
    /// Listener.
    #[error(transparent)]
    Traffic(#[from] crate::traffic::TrafficError),
    /// A routing daemon of a routed lab failed.
    #[error(transparent)]
    Routing(#[from] crate::host::routing::RoutingError),
    /// A process.
    #[error(transparent)]
    Process(#[from] crate::host::process::ProcessError),
    /// An API call.
    #[error("failed to {op}: {source}")]
    Kube {
        /// What.
        op: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// A manifest could not be applied.
    #[error(transparent)]
    Apply(#[from] ApplyError),
    /// A CRD could not be read or did not become Established.
    #[error(transparent)]
    Crds(#[from] CrdError),
    /// A file or directory operation failed.
    #[error("failed to {op}: {source}")]
    Io {
        /// What was attempted.
        op: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An object built by the lab does not deserialize (a bug of the lab).
    #[error("invalid object: {0}")]
    Object(#[from] serde_json::Error),
    /// A manifest file is not YAML.
    #[error("invalid YAML: {0}")]
    Yaml(#[from] serde_yaml::Error),
    /// kubectl could not be started.
    #[error("failed to run kubectl to {what}: {source}")]
    KubectlSpawn {
        /// What kubectl was to do.
        what: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// kubectl exited unsuccessfully.
    #[error("kubectl failed to {what}: {stderr}")]
    Kubectl {
        /// What kubectl was to do.
        what: &'static str,
        /// Its standard error.
        stderr: String,
    },
    /// A binary of the workspace is not built.
    #[error("{} not found: run `cargo build --workspace --bins`", .0.display())]
    NotBuilt(PathBuf),
    /// A condition did not come true in time.
    #[error("timed out after {timeout:?} waiting for {what}; {state}")]
    Timeout {
        /// The condition.
        what: String,
        /// How long we waited.
        timeout: Duration,
        /// What there was instead (the pair's status, the logs).
        state: String,
    },
}

/// A CRD that could not be read, or did not become Established in time.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// Reading it failed.
    #[error("read CRD {name}: {source}")]
    Read {
        /// The CRD.
        name: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// It was not Established in time.
    #[error("CRD {name} not Established within {timeout:?}")]
    NotEstablished {
        /// The CRD.
        name: String,
        /// How long we waited.
        timeout: Duration,
    },
}

type Result<T, E = KubeLabError> = std::result::Result<T, E>;

fn kerr(op: impl Into<String>) -> impl FnOnce(kube::Error) -> KubeLabError {
    let op = op.into();
    move |source| KubeLabError::Kube { op, source }
}

/// How to start the lab.
#[derive(Clone, Debug)]
pub struct KubeLabOptions {
    /// Node namespaces (2..=5).
    pub nodes: usize,
    /// Run `havip-operator` (it must be built).
    pub operator: bool,
    /// Keep the lab's files under this directory (the `lab` binary) instead of a temp dir.
    pub dir: Option<PathBuf>,
    /// Install the rendered Helm chart (RBAC, the admission policy) and run the operator
    /// and each agent with a token of the chart's own ServiceAccount (the agents' tokens
    /// bound to a Pod on their node) instead of the admin kubeconfig.
    pub chart_rbac: bool,
    /// A routed lab (see [`crate::harness::bgp`]): the gateway is an FRR router peering
    /// with this BGP speaker on every node, and a client sits in another subnet behind it.
    pub bgp: Option<crate::harness::bgp::Speaker>,
    /// Extra environment of node `i`'s agent (`agent_env[i]`; none past the end), e.g.
    /// the chaos run's libfaketime.
    pub agent_env: Vec<Vec<(String, String)>>,
}

impl Default for KubeLabOptions {
    fn default() -> Self {
        Self { nodes: 2, operator: true, dir: None, chart_rbac: false, bgp: None, agent_env: Vec::new() }
    }
}

impl KubeLabOptions {
    /// `nodes` nodes with their agents and no operator (the caller creates what the
    /// operator would), the admin kubeconfig, a switched lab.
    pub fn agents_only(nodes: usize) -> Self {
        Self { nodes, operator: false, ..Default::default() }
    }
}

/// The `kubectl-havip` binary: next to the agent binary, as cargo builds them.
fn plugin_binary() -> Result<PathBuf> {
    Ok(agent_binary()?.with_file_name("kubectl-havip"))
}

/// A running Kubernetes lab. Drop order: processes, control plane, topology.
pub struct KubeLab {
    /// Agents per node.
    pub agents: Vec<Option<ManagedProcess>>,
    /// The operator.
    pub operator: Option<ManagedProcess>,
    /// Listeners per node (answer with the node's name on `[::]:8080`).
    pub listeners: Vec<Listener>,
    /// Listeners on other ports, by (node, port) (started by [`KubeLab::serve`]).
    pub extra_listeners: BTreeMap<(usize, u16), Listener>,
    /// The routing daemons of a routed lab ([`KubeLabOptions::bgp`]).
    pub routing: Option<crate::harness::bgp::Routing>,
    /// The control plane.
    pub cp: ControlPlane,
    /// The topology.
    pub topo: Topology,
    dir: PathBuf,
    agent_kubeconfigs: Vec<PathBuf>,
    agent_env: Vec<Vec<(String, String)>>,
    /// Another agent binary for node `i` (another release) from its next start on.
    pub agent_bins: BTreeMap<usize, PathBuf>,
    operator_kubeconfig: PathBuf,
    _tmp: Option<tempfile::TempDir>,
}

/// The operator binary next to the test binary, or `$HAVIP_OPERATOR_BIN`.
pub fn operator_binary() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("HAVIP_OPERATOR_BIN") {
        return Ok(PathBuf::from(p));
    }
    let agent = agent_binary()?;
    let p = agent.with_file_name("havip-operator");
    if p.is_file() { Ok(p) } else { Err(KubeLabError::NotBuilt(p)) }
}

impl KubeLab {
    /// Starts everything and waits until the agents run.
    pub fn start(opts: KubeLabOptions) -> Result<Self> {
        let topo = Topology::builder().nodes(opts.nodes).host_port(true).routed_client(opts.bgp.is_some()).build()?;
        let routing = match opts.bgp {
            Some(speaker) => Some(crate::harness::bgp::Routing::start(&topo, speaker)?),
            None => None,
        };
        // HAVIP_E2E_KEEP=<dir>: keep every lab's logs there (for post-mortems).
        let kept = opts
            .dir
            .clone()
            .or_else(|| std::env::var_os("HAVIP_E2E_KEEP").map(|d| PathBuf::from(d).join(topo.prefix())));
        let (dir, tmp) = match &kept {
            Some(d) => {
                std::fs::create_dir_all(d)
                    .map_err(|source| KubeLabError::Io { op: format!("create {}", d.display()), source })?;
                (d.clone(), None)
            }
            None => {
                let t = tempfile::Builder::new()
                    .prefix("havip-kubelab-")
                    .tempdir()
                    .map_err(|source| KubeLabError::Io { op: "create a temporary directory".into(), source })?;
                (t.path().to_owned(), Some(t))
            }
        };
        let host = IpAddr::V4(topo.host_ip());
        let cp = ControlPlane::start(ControlPlaneOptions {
            bind_address: host,
            dir: kept.as_ref().map(|d| d.join("controlplane")),
            ..Default::default()
        })?;
        let admin = cp.kubeconfig();
        let mut listeners = Vec::new();
        for i in 0..opts.nodes {
            let bind = SocketAddr::new(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), SERVICE_PORT);
            listeners.push(Listener::start(&topo.node(i).ns, &format!("n{i}"), bind)?);
        }
        let mut lab = Self {
            agents: (0..opts.nodes).map(|_| None).collect(),
            operator: None,
            listeners,
            extra_listeners: BTreeMap::new(),
            routing,
            cp,
            topo,
            dir,
            agent_kubeconfigs: vec![admin.clone(); opts.nodes],
            agent_env: opts.agent_env,
            agent_bins: BTreeMap::new(),
            operator_kubeconfig: admin,
            _tmp: tmp,
        };
        lab.block_on(lab.prepare_cluster())?;
        if opts.chart_rbac {
            lab.install_chart_identities()?;
        } else {
            lab.block_on(lab.create_agent_daemonset())?;
        }
        if opts.operator {
            lab.start_operator()?;
        }
        for i in 0..opts.nodes {
            lab.start_agent(i)?;
        }
        Ok(lab)
    }

    /// Runs a future on a fresh current-thread runtime (the lab's API is synchronous).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt.block_on(f),
            Err(e) => panic!("failed to build a runtime: {e}"),
        }
    }

    /// An admin client (a new connection each call).
    pub async fn client(&self) -> Result<Client> {
        Ok(self.cp.client().await?)
    }

    async fn prepare_cluster(&self) -> Result<()> {
        let client = self.client().await?;
        install_crds(&client).await?;
        let ns: Api<Namespace> = Api::all(client.clone());
        let obj: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": NAMESPACE}}))?;
        match ns.create(&PostParams::default(), &obj).await {
            Ok(_) | Err(kube::Error::Api(_)) => {}
            Err(e) => return Err(kerr("create the namespace")(e)),
        }
        let nodes: Api<Node> = Api::all(client);
        for n in self.topo.nodes() {
            let node: Node = serde_json::from_value(serde_json::json!({
                "metadata": {"name": n.name, "labels": {"kubernetes.io/hostname": n.name}},
            }))?;
            nodes.create(&PostParams::default(), &node).await.map_err(kerr(format!("register node {}", n.name)))?;
            let status = serde_json::json!({
                "status": {"addresses": [
                    {"type": "InternalIP", "address": n.data_ip.to_string()},
                    {"type": "ExternalIP", "address": n.mgmt_ip.to_string()},
                    {"type": "Hostname", "address": n.name},
                ]}
            });
            nodes
                .patch_status(&n.name, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .map_err(kerr(format!("set addresses of node {}", n.name)))?;
        }
        Ok(())
    }

    /// The agents' DaemonSet object (no controller runs here, so it starts no pods): the
    /// agents check it on SIGTERM to tell an uninstall from a rolling update, as they do
    /// under the chart. The chart's own DaemonSet serves when the chart is installed.
    async fn create_agent_daemonset(&self) -> Result<()> {
        let client = self.client().await?;
        let api: Api<k8s_openapi::api::apps::v1::DaemonSet> = Api::namespaced(client, NAMESPACE);
        let labels = serde_json::json!({"app.kubernetes.io/name": "havip", "app.kubernetes.io/component": "agent"});
        let ds = serde_json::from_value(serde_json::json!({
            "metadata": {"name": AGENT_DAEMONSET, "namespace": NAMESPACE},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "agent", "image": "havip/havip-agent:lab"}]},
                },
            },
        }))?;
        api.create(&PostParams::default(), &ds).await.map_err(kerr("create the agents' DaemonSet"))?;
        Ok(())
    }

    /// Deletes the agents' DaemonSet (what `helm uninstall` does).
    pub async fn delete_agent_daemonset(&self) -> Result<()> {
        let api: Api<k8s_openapi::api::apps::v1::DaemonSet> = Api::namespaced(self.client().await?, NAMESPACE);
        api.delete(AGENT_DAEMONSET, &Default::default()).await.map_err(kerr("delete the agents' DaemonSet"))?;
        Ok(())
    }

    /// Applies the chart rendered in `charts/rendered/havip-default.yaml` (server-side), and
    /// gives the operator a token of `havip-operator` and each agent a token of
    /// `havip-agent` bound to a Pod on its node (what the kubelet would give a DaemonSet
    /// pod: the token carries the node name the admission policy checks).
    fn install_chart_identities(&mut self) -> Result<()> {
        let rendered = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/rendered/havip-default.yaml");
        let out = self
            .cp
            .kubectl()
            .args(["apply", "--server-side", "--field-manager=helm", "-f"])
            .arg(&rendered)
            .output()
            .map_err(|source| KubeLabError::KubectlSpawn { what: "apply the rendered chart", source })?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            return Err(KubeLabError::Kubectl { what: "apply the rendered chart", stderr });
        }
        let token = |args: Vec<String>| -> Result<String> {
            let out = self
                .cp
                .kubectl()
                .args(&args)
                .output()
                .map_err(|source| KubeLabError::KubectlSpawn { what: "create a token", source })?;
            if !out.status.success() {
                let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
                return Err(KubeLabError::Kubectl { what: "create a token", stderr });
            }
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        };
        let op = token(vec![
            "-n".into(),
            NAMESPACE.into(),
            "create".into(),
            "token".into(),
            "havip-operator".into(),
            "--duration=2h".into(),
        ])?;
        self.operator_kubeconfig = self.cp.kubeconfig_with_token("havip-operator", &op)?;
        let nodes: Vec<String> = self.topo.nodes().iter().map(|n| n.name.clone()).collect();
        for (i, node) in nodes.iter().enumerate() {
            // A pod of the DaemonSet on that node (never started: there is no kubelet).
            let pod = format!("havip-agent-{node}");
            let manifest = serde_json::json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "namespace": NAMESPACE, "labels": {"app.kubernetes.io/component": "agent"}},
                "spec": {"nodeName": node, "serviceAccountName": "havip-agent",
                         "containers": [{"name": "agent", "image": "ghcr.io/havip/havip-agent:0.1.0"}]},
            });
            let path = self.dir.join(format!("{pod}.json"));
            std::fs::write(&path, manifest.to_string())
                .map_err(|source| KubeLabError::Io { op: format!("write {}", path.display()), source })?;
            let out = self
                .cp
                .kubectl()
                .args(["apply", "-f"])
                .arg(&path)
                .output()
                .map_err(|source| KubeLabError::KubectlSpawn { what: "create a pod", source })?;
            if !out.status.success() {
                let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
                return Err(KubeLabError::Kubectl { what: "create a pod", stderr });
            }
            let t = token(vec![
                "-n".into(),
                NAMESPACE.into(),
                "create".into(),
                "token".into(),
                "havip-agent".into(),
                "--bound-object-kind=Pod".into(),
                format!("--bound-object-name={pod}"),
                "--duration=2h".into(),
            ])?;
            self.agent_kubeconfigs[i] = self.cp.kubeconfig_with_token(&format!("havip-agent-{node}"), &t)?;
        }
        Ok(())
    }

    /// The kubeconfig the operator uses.
    pub fn operator_kubeconfig(&self) -> &Path {
        &self.operator_kubeconfig
    }

    /// The kubeconfig node `i`'s agent uses.
    pub fn agent_kubeconfig(&self, i: usize) -> &Path {
        &self.agent_kubeconfigs[i]
    }

    /// Starts (or restarts) the operator.
    pub fn start_operator(&mut self) -> Result<()> {
        let p = self.spawn_operator("operator")?;
        self.operator = Some(p);
        Ok(())
    }

    /// Starts an operator replica that the caller owns, logging to `<name>.log` in the
    /// lab's directory (replicas elect their leader on the Lease `havip-operator`; each
    /// one's identity is `<hostname>-<pid>`).
    pub fn spawn_operator(&self, name: &str) -> Result<ManagedProcess> {
        let bin = operator_binary()?;
        let args = vec![
            "--namespace".to_owned(),
            NAMESPACE.to_owned(),
            "--metrics-address".to_owned(),
            "127.0.0.1:0".to_owned(),
        ];
        let envs = vec![
            ("KUBECONFIG".to_owned(), self.operator_kubeconfig.display().to_string()),
            ("RUST_LOG".to_owned(), std::env::var("HAVIP_E2E_OPERATOR_LOG").unwrap_or_else(|_| "info".to_owned())),
            ("NO_COLOR".to_owned(), "1".to_owned()),
        ];
        Ok(ManagedProcess::spawn(name, &bin, &args, &envs, &self.dir.join(format!("{name}.log")))?)
    }

    /// Where the operator started by [`KubeLab::start_operator`] serves its metrics: it
    /// binds an ephemeral port on 127.0.0.1 and logs the address (the last start's).
    pub fn operator_metrics_address(&self) -> Option<SocketAddr> {
        let log = std::fs::read_to_string(self.dir.join("operator.log")).ok()?;
        log.lines()
            .rev()
            .filter(|l| l.contains("metrics and health endpoints listening"))
            .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("address=")).and_then(|a| a.parse().ok()))
    }

    /// Stops the operator.
    pub fn stop_operator(&mut self) {
        if let Some(mut p) = self.operator.take() {
            p.stop(Duration::from_secs(10));
        }
    }

    /// Starts (or restarts) the agent of node `i`.
    pub fn start_agent(&mut self, i: usize) -> Result<()> {
        let bin = match self.agent_bins.get(&i) {
            Some(b) => b.clone(),
            None => agent_binary()?,
        };
        let node = self.topo.node(i).clone();
        let args = vec![
            "kubernetes".to_owned(),
            "--node-name".to_owned(),
            node.name.clone(),
            "--namespace".to_owned(),
            NAMESPACE.to_owned(),
            "--state-dir".to_owned(),
            self.dir.join(format!("state-{i}")).display().to_string(),
            "--metrics-address".to_owned(),
            format!("127.0.0.1:{AGENT_METRICS_PORT}"),
            "--daemonset".to_owned(),
            AGENT_DAEMONSET.to_owned(),
        ];
        let mut envs = vec![
            ("KUBECONFIG".to_owned(), self.agent_kubeconfigs[i].display().to_string()),
            ("RUST_LOG".to_owned(), "info,havip_node_agent=debug".to_owned()),
            ("NO_COLOR".to_owned(), "1".to_owned()),
        ];
        if let Some(r) = &self.routing {
            envs.extend(r.agent_env(i));
        }
        envs.extend(self.agent_env.get(i).cloned().unwrap_or_default());
        let log = self.dir.join(format!("agent-{i}.log"));
        let p = netns::spawn_in(&node.ns, &format!("agent-{i}"), &bin, &args, &envs, &log)?;
        self.agents[i] = Some(p);
        Ok(())
    }

    /// SIGKILLs the agent of node `i`.
    pub fn kill_agent(&mut self, i: usize) {
        if let Some(mut p) = self.agents[i].take() {
            p.kill_now();
        }
    }

    /// Stops the agent of node `i` with SIGTERM (a rolling upgrade).
    pub fn stop_agent(&mut self, i: usize) {
        if let Some(mut p) = self.agents[i].take() {
            p.stop(Duration::from_secs(15));
        }
    }

    /// Cuts node `i`'s access to the API server (its management link's TCP to the API port).
    pub fn block_api(&self, i: usize) -> Result<netns::Fault> {
        Ok(self.topo.block_host_tcp(i, self.cp.api_port())?)
    }

    /// Applies YAML documents (server-side apply, field manager `havip-e2e`).
    pub async fn apply(&self, yaml: &str) -> Result<()> {
        let client = self.client().await?;
        crate::harness::api::apply_documents(&client, yaml).await.map_err(KubeLabError::Apply)
    }

    /// The lab's standard pair over all nodes: paths data (InternalIP) and mgmt
    /// (ExternalIP), one VIP `vip(0)/24` on eth0 probed on 8080.
    pub fn pair_yaml(&self, name: &str) -> String {
        let mut y =
            format!("apiVersion: havip.io/v1alpha1\nkind: HAPair\nmetadata:\n  name: {name}\nspec:\n  members:\n");
        for (i, n) in self.topo.nodes().iter().enumerate() {
            y.push_str(&format!("    - node: {}\n      priority: {}\n", n.name, 200 - 10 * i));
        }
        y.push_str(
            "  heartbeat:\n    paths:\n      - name: data\n        addressType: InternalIP\n      - name: mgmt\n        addressType: ExternalIP\n",
        );
        y.push_str(&format!(
            "---\napiVersion: havip.io/v1alpha1\nkind: FloatingIP\nmetadata:\n  name: {name}-vip\nspec:\n  pair: {name}\n  address: {}/24\n  interface: eth0\n  probe:\n    ports: [{SERVICE_PORT}]\n",
            self.topo.vip(0)
        ));
        y
    }

    /// A pair `name` over the nodes `members` (priorities 200, 190, … in that order)
    /// with the paths of [`KubeLab::pair_yaml`] and one VIP, `vip_at(vip)/24` on eth0 probed
    /// on `port` (FloatingIP `<name>-vip`). Start the nodes' listeners on `port` with
    /// [`KubeLab::serve`].
    pub fn pair_yaml_on(&self, name: &str, members: &[usize], vip: u8, port: u16) -> String {
        let mut y =
            format!("apiVersion: havip.io/v1alpha1\nkind: HAPair\nmetadata:\n  name: {name}\nspec:\n  members:\n");
        for (rank, i) in members.iter().enumerate() {
            y.push_str(&format!("    - node: {}\n      priority: {}\n", self.topo.node(*i).name, 200 - 10 * rank));
        }
        y.push_str(
            "  heartbeat:\n    paths:\n      - name: data\n        addressType: InternalIP\n      - name: mgmt\n        addressType: ExternalIP\n",
        );
        y.push_str(&format!(
            "---\napiVersion: havip.io/v1alpha1\nkind: FloatingIP\nmetadata:\n  name: {name}-vip\nspec:\n  pair: {name}\n  address: {}/24\n  interface: eth0\n  probe:\n    ports: [{port}]\n",
            self.topo.vip_at(vip)
        ));
        y
    }

    /// Makes node `i` answer on `[::]:port` (the standard listener for
    /// [`SERVICE_PORT`], another one started once per port otherwise), running.
    pub fn serve(&mut self, i: usize, port: u16) -> Result<()> {
        if port == SERVICE_PORT {
            if !self.listeners[i].is_running() {
                self.listeners[i].start_again()?;
            }
            return Ok(());
        }
        match self.extra_listeners.get_mut(&(i, port)) {
            Some(l) if l.is_running() => {}
            Some(l) => l.start_again()?,
            None => {
                let bind = SocketAddr::new(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), port);
                let l = Listener::start(&self.topo.node(i).ns, &format!("n{i}"), bind)?;
                self.extra_listeners.insert((i, port), l);
            }
        }
        Ok(())
    }

    /// Stops node `i`'s listener on `port` (a service outage on that node).
    pub fn stop_serving(&mut self, i: usize, port: u16) {
        if port == SERVICE_PORT {
            self.listeners[i].stop();
        } else if let Some(l) = self.extra_listeners.get_mut(&(i, port)) {
            l.stop();
        }
    }

    /// The nodes whose kernel holds VIP `j`.
    pub fn holders_of(&self, j: u8) -> Result<Vec<usize>> {
        let vip = IpAddr::V4(self.topo.vip(j));
        let mut out = Vec::new();
        for (i, n) in self.topo.nodes().iter().enumerate() {
            if netns::has_address(&n.ns, &n.data_if, vip)? {
                out.push(i);
            }
        }
        Ok(out)
    }

    /// Node `i`'s agent's Prometheus metrics (empty when it does not answer).
    pub fn agent_metrics(&self, i: usize) -> String {
        metrics_in(&self.topo.node(i).ns, AGENT_METRICS_PORT)
    }

    /// The sum of the samples of metric `name` of node `i`'s agent whose line contains
    /// every `filters` substring; None when the agent's metrics cannot be read.
    pub fn agent_metric_sum(&self, i: usize, name: &str, filters: &[&str]) -> Option<f64> {
        let text = self.agent_metrics(i);
        if text.is_empty() {
            return None;
        }
        Some(metric_sum(&text, name, filters))
    }

    /// The pair.
    pub async fn pair(&self, name: &str) -> Result<HAPair> {
        crate::harness::api::get_pair(&self.client().await?, name).await.map_err(kerr(format!("get HAPair {name}")))
    }

    /// The pair's Lease: (holder, epoch).
    pub async fn lease(&self, pair: &str) -> Result<(Option<String>, i64)> {
        crate::harness::api::get_lease(&self.client().await?, pair).await.map_err(kerr("get the pair Lease"))
    }

    /// Polls `cond` on the pair until it holds or `timeout` passes.
    pub async fn wait_pair(
        &self,
        name: &str,
        timeout: Duration,
        what: &str,
        cond: impl Fn(&HAPair) -> bool,
    ) -> Result<HAPair> {
        let start = Instant::now();
        loop {
            if let Ok(p) = self.pair(name).await
                && cond(&p)
            {
                return Ok(p);
            }
            if start.elapsed() > timeout {
                let p = self.pair(name).await.ok();
                let status =
                    p.and_then(|p| p.status).map(|s| serde_json::to_string(&s).unwrap_or_default()).unwrap_or_default();
                return Err(KubeLabError::Timeout {
                    what: what.to_owned(),
                    timeout,
                    state: format!("pair status: {status}\n{}", self.logs_tail(25)),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the pair's status reports member `node` ready for all its VIPs
    /// (`ready`) or not ready for one of them (`!ready`).
    pub async fn wait_member_ready(&self, pair: &str, node: &str, ready: bool, timeout: Duration) -> Result<HAPair> {
        let what = format!("{node} reported {}", if ready { "ready" } else { "not ready" });
        self.wait_pair(pair, timeout, &what, |p| {
            p.status.as_ref().is_some_and(|s| {
                s.members.iter().any(|m| {
                    m.node == node
                        && if ready {
                            !m.ready.is_empty() && m.ready.iter().all(|r| r.ready)
                        } else {
                            m.ready.iter().any(|r| !r.ready)
                        }
                })
            })
        })
        .await
    }

    /// kube-proxy's health check of an `externalTrafficPolicy: Local` Service, stood in for
    /// on node `i`: its healthCheckNodePort `port` answers 200 when the node has a local
    /// endpoint (`has_endpoint`), 503 when it has none.
    pub fn endpoint_health(
        &self,
        i: usize,
        port: u16,
        has_endpoint: bool,
    ) -> std::result::Result<Listener, crate::traffic::TrafficError> {
        let reply = if has_endpoint { "HTTP/1.0 200 OK" } else { "HTTP/1.0 503 Service Unavailable" };
        Listener::http(&self.topo.node(i).ns, reply, SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, port)))
    }

    /// kube-proxy's stand-ins move an `externalTrafficPolicy: Local` Service's endpoint from
    /// node `from` to node `to` (`health[i]` is node i's [`KubeLab::endpoint_health`] on
    /// `port`): `to` gets one and pair `pair` reports it ready, then `from` loses its last.
    pub fn move_endpoint(&self, pair: &str, health: &mut [Listener], port: u16, from: usize, to: usize) -> Result<()> {
        health[to].stop();
        health[to] = self.endpoint_health(to, port, true)?;
        self.block_on(self.wait_member_ready(pair, &format!("n{to}"), true, Duration::from_secs(10)))?;
        health[from].stop();
        health[from] = self.endpoint_health(from, port, false)?;
        Ok(())
    }

    /// The members whose kernel holds VIP 0.
    pub fn holders(&self) -> Result<Vec<usize>> {
        let vip = IpAddr::V4(self.topo.vip(0));
        let mut out = Vec::new();
        for (i, n) in self.topo.nodes().iter().enumerate() {
            if netns::has_address(&n.ns, &n.data_if, vip)? {
                out.push(i);
            }
        }
        Ok(out)
    }

    /// VIP 0:8080.
    pub fn target(&self) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.topo.vip(0)), SERVICE_PORT)
    }

    /// Runs `kubectl-havip <args>` against the lab; (success, output).
    pub fn plugin(&self, args: &[&str]) -> (bool, String) {
        match plugin_binary() {
            Ok(bin) => crate::harness::api::run_plugin(&bin, &self.cp.kubeconfig(), args),
            Err(e) => (false, e.to_string()),
        }
    }

    /// [`KubeLab::plugin`], killed after `limit`.
    pub fn plugin_within(&self, args: &[&str], limit: Duration) -> (bool, String) {
        match plugin_binary() {
            Ok(bin) => crate::harness::api::run_plugin_within(&bin, &self.cp.kubeconfig(), args, limit),
            Err(e) => (false, e.to_string()),
        }
    }

    /// `kubectl <args>` against the lab; (success, stdout).
    pub fn kubectl(&self, args: &[&str]) -> (bool, String) {
        match self.cp.kubectl().args(args).output() {
            Ok(o) => (o.status.success(), String::from_utf8_lossy(&o.stdout).into_owned()),
            Err(e) => (false, e.to_string()),
        }
    }

    /// The API server's request counters (`apiserver_request_total`) summed by
    /// (verb, resource), for request-rate measurements.
    pub fn apiserver_requests(&self) -> BTreeMap<(String, String), f64> {
        let (_, text) = self.kubectl(&["get", "--raw", "/metrics"]);
        apiserver_requests(&text)
    }

    /// The lab directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Logs of the operator and the agents, for failure reports.
    pub fn logs_tail(&self, lines: usize) -> String {
        let mut out = format!("--- operator ---\n{}\n", tail(&self.dir.join("operator.log"), lines));
        for i in 0..self.agents.len() {
            out.push_str(&format!("--- agent n{i} ---\n{}\n", tail(&self.dir.join(format!("agent-{i}.log")), lines)));
        }
        out
    }
}

/// Installs the chart's CRDs and waits until they are Established.
pub async fn install_crds(client: &Client) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use serde::Deserialize;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(havip_crds::CRDS_PATH);
    let text = std::fs::read_to_string(&path)
        .map_err(|source| KubeLabError::Io { op: format!("read {}", path.display()), source })?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v = serde_json::Value::deserialize(doc)?;
        if v.is_null() {
            continue;
        }
        let crd: CustomResourceDefinition = serde_json::from_value(v)?;
        let name = crd.name_any();
        crds.patch(&name, &PatchParams::apply("havip-e2e").force(), &Patch::Apply(&crd))
            .await
            .map_err(kerr(format!("install CRD {name}")))?;
        names.push(name);
    }
    Ok(wait_crds_established(client, &names, Duration::from_secs(30)).await?)
}

/// Waits until every CRD in `names` is Established; the error names the first that is
/// not by `timeout` (or that cannot be read).
pub async fn wait_crds_established(
    client: &Client,
    names: &[String],
    timeout: Duration,
) -> std::result::Result<(), CrdError> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = Instant::now() + timeout;
    for name in names {
        loop {
            let crd = crds.get(name).await.map_err(|source| CrdError::Read { name: name.clone(), source })?;
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            if Instant::now() > deadline {
                return Err(CrdError::NotEstablished { name: name.clone(), timeout });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}
