//! The cluster-provider interface the end-to-end scenarios ([`crate::scenarios`]) run
//! against, and its local implementation on [`KubeLab`] (a real kube-apiserver and
//! etcd, one network namespace per node). The kind implementation is
//! [`crate::harness::kind::KindCluster`]: a provider only knows how to cut a node, restart an
//! agent, stop the operator, cut the nodes off the API server, run a client and say
//! which nodes hold the VIP; everything that talks to Kubernetes is shared here.

use crate::harness::agent::agent_binary;
use crate::harness::api::{ApplyError, apply_documents, get_lease, get_pair, run_plugin};
use crate::harness::controlplane::{ControlPlaneError, client_from_kubeconfig};
use crate::harness::kubelab::{KubeLab, KubeLabError};
use crate::host::netns::{Link, NetnsError};
use crate::traffic::{ProbeReport, Prober, TrafficError};
use havip_crds::{FloatingIP, HAPair};
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, DeleteParams, ListParams};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// How many VIPs a cluster offers pairs on shared nodes ([`Cluster::pair_yaml_on`]'s
/// `vip` is below it).
pub const SHARED_VIPS: u8 = 3;

/// What a provider failed at, with its cause.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The local lab failed (an agent or the operator started, a listener).
    #[error(transparent)]
    Lab(#[from] KubeLabError),
    /// The control plane failed (a client from the kubeconfig, the API server restarted).
    #[error(transparent)]
    ControlPlane(#[from] ControlPlaneError),
    /// A manifest could not be applied.
    #[error(transparent)]
    Apply(#[from] ApplyError),
    /// A namespace operation failed (a cable cut or plugged in again).
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The client failed.
    #[error(transparent)]
    Traffic(#[from] TrafficError),
    /// An API call failed.
    #[error("failed to {op}: {source}")]
    Kube {
        /// What was attempted.
        op: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// A command could not be started.
    #[error("failed to run `{cmd}`: {source}")]
    Spawn {
        /// The command line.
        cmd: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Feeding or waiting for a running command failed.
    #[error("failed to {op} `{cmd}`: {source}")]
    Io {
        /// What was attempted.
        op: &'static str,
        /// The command line.
        cmd: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A command exited unsuccessfully.
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        cmd: String,
        /// Its exit status.
        status: String,
        /// Its standard error.
        stderr: String,
    },
    /// A command to run was empty.
    #[error("an empty command")]
    EmptyCommand,
    /// A command started with its output piped has none to read.
    #[error("`{cmd}` has no standard output to read")]
    NoOutput {
        /// The command line.
        cmd: String,
    },
    /// A condition did not come true in time.
    #[error("timed out after {timeout:?} waiting for {what}; {state}")]
    Timeout {
        /// The condition.
        what: String,
        /// How long we waited.
        timeout: Duration,
        /// What there was instead (for a pair: its status and the logs).
        state: String,
    },
    /// The VIP stayed on nodes after its pair was deleted (a reset between scenarios).
    #[error("the VIP is still held by nodes {nodes:?} {waited:?} after the pair was deleted")]
    VipStillHeld {
        /// The nodes that hold it.
        nodes: Vec<usize>,
        /// How long we waited.
        waited: Duration,
    },
    /// The cluster has no node with this index.
    #[error("the cluster has no node {0}")]
    NoNode(usize),
    /// A kind node's cable (the host end of its `eth0`) was not found.
    #[error("no host link with index {index} (the peer of {node}'s eth0)")]
    NoCable {
        /// The node.
        node: String,
        /// The `iflink` its `eth0` names.
        index: String,
    },
    /// The kind network has no subnet the suite can take a VIP from.
    #[error("no IPv4 subnet of /8../24 in the kind network: {subnets:?}")]
    NoSubnet {
        /// The network's subnets.
        subnets: String,
    },
    /// The provider has no VIP number `vip` or no service on `port` for another pair.
    #[error("no VIP number {vip} or no service on port {port} for a pair on shared nodes")]
    NoSharedSlot {
        /// The VIP number asked for.
        vip: u8,
        /// The port asked for.
        port: u16,
    },
    /// Node `node`'s agent does not serve its metrics.
    #[error("the agent of node {node} does not serve its metrics")]
    NoMetrics {
        /// The node's index.
        node: usize,
    },
}

/// Provider results.
pub type Result<T, E = ClusterError> = std::result::Result<T, E>;

/// A client that connects to the VIP over and over (a new TCP connection every few
/// milliseconds) and records who answered.
pub trait TrafficClient {
    /// Waits until a probe is answered by node `name`.
    fn wait_for_responder(&self, name: &str, timeout: Duration) -> Result<Duration>;
    /// Stops and returns the report.
    fn stop(self: Box<Self>) -> Result<ProbeReport>;
}

/// What a scenario needs from a cluster. Node indices are positions in
/// [`Cluster::nodes`]; the standard pair's members are the first nodes in that order,
/// priorities descending (node 0 is the preferred active).
pub trait Cluster {
    /// The nodes that can be pair members, in order.
    fn nodes(&self) -> Vec<String>;
    /// A kubeconfig with admin rights.
    fn kubeconfig(&self) -> PathBuf;
    /// `kubectl` with the cluster's kubeconfig.
    fn kubectl_command(&self) -> Command;
    /// The `kubectl-havip` plugin binary: next to the agent binary (as cargo builds
    /// them), else from `PATH`.
    fn plugin_binary(&self) -> PathBuf {
        agent_binary().map(|a| a.with_file_name("kubectl-havip")).unwrap_or_else(|_| PathBuf::from("kubectl-havip"))
    }
    /// The standard pair `name` over the first `members` nodes with one VIP (its
    /// FloatingIP is `<name>-vip`), probed on the port the cluster's responders use.
    fn pair_yaml(&self, name: &str, members: usize) -> String;
    /// Disconnects node `i` from every network (the node dies as far as its peers and
    /// the clients can tell; its processes keep running).
    fn cut_node(&mut self, i: usize) -> Result<()>;
    /// Reconnects node `i`.
    fn restore_node(&mut self, i: usize) -> Result<()>;
    /// Stops the operator (all replicas).
    fn stop_operator(&mut self) -> Result<()>;
    /// Starts the operator again.
    fn start_operator(&mut self) -> Result<()>;
    /// A rolling upgrade of node `i`'s agent: SIGTERM, then a new agent process.
    fn restart_agent(&mut self, i: usize) -> Result<()>;
    /// Makes the API server unreachable for every node (agents and operator alike).
    fn api_outage_begin(&mut self) -> Result<()>;
    /// Ends the outage.
    fn api_outage_end(&mut self) -> Result<()>;
    /// Starts a client against the standard pair's VIP.
    fn client(&self) -> Result<Box<dyn TrafficClient>>;
    /// The nodes whose kernel holds the standard pair's VIP.
    fn holders(&self) -> Result<Vec<usize>>;
    /// The operator's and agents' recent logs (for failure messages).
    fn logs_tail(&self, lines: usize) -> String;

    /// Several pairs on the same nodes: pair `name` over the nodes `members` (first =
    /// preferred), with one VIP (`<name>-vip`, the cluster's VIP number `vip`, below
    /// [`SHARED_VIPS`]) probed on `port`, each member answering on `port`.
    fn pair_yaml_on(&mut self, name: &str, members: &[usize], vip: u8, port: u16) -> Result<String>;
    /// The nodes whose kernel holds VIP number `vip` (0: the standard pair's).
    fn holders_of(&self, vip: u8) -> Result<Vec<usize>>;
    /// A client against VIP number `vip` on `port`.
    fn client_to(&self, vip: u8, port: u16) -> Result<Box<dyn TrafficClient>>;
    /// Stops (false) or restarts (true) node `i`'s service on `port`.
    fn set_service(&mut self, i: usize, port: u16, up: bool) -> Result<()>;
    /// The sum of the samples of node `i`'s agent metric `name` whose line contains
    /// every `filters` substring.
    fn agent_metric(&self, i: usize, name: &str, filters: &[&str]) -> Result<f64>;

    /// Runs a future on a fresh current-thread runtime (scenarios are synchronous).
    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output
    where
        Self: Sized,
    {
        match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt.block_on(f),
            Err(e) => panic!("failed to build a runtime: {e}"),
        }
    }

    /// An admin client.
    fn kube_client(&self) -> impl std::future::Future<Output = Result<kube::Client>>
    where
        Self: Sized,
    {
        let path = self.kubeconfig();
        async move { Ok(client_from_kubeconfig(&path).await?) }
    }

    /// Applies HAPair/FloatingIP YAML documents server-side (field manager `havip-e2e`).
    fn apply_yaml(&self, yaml: &str) -> Result<()>
    where
        Self: Sized,
    {
        self.block_on(async { Ok(apply_documents(&self.kube_client().await?, yaml).await?) })
    }

    /// Deletes pair `name` and every FloatingIP naming it (between scenarios).
    fn delete_pair(&self, name: &str) -> Result<()>
    where
        Self: Sized,
    {
        self.block_on(async {
            let client = self.kube_client().await?;
            let dp = DeleteParams::default();
            let fips = Api::<FloatingIP>::all(client.clone());
            let mut names = vec![format!("{name}-vip")];
            if let Ok(list) = fips.list(&ListParams::default()).await {
                names.extend(
                    list.items
                        .into_iter()
                        .filter(|f| f.spec.pair == name)
                        .filter_map(|f| f.metadata.name)
                        .filter(|n| *n != format!("{name}-vip")),
                );
            }
            let mut results = Vec::new();
            for f in &names {
                results.push(fips.delete(f, &dp).await.map(drop));
            }
            results.push(Api::<HAPair>::all(client).delete(name, &dp).await.map(drop));
            for r in results {
                match r {
                    Ok(()) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(source) => return Err(ClusterError::Kube { op: format!("delete pair {name}"), source }),
                }
            }
            Ok(())
        })
    }

    /// Deletes every pair and the FloatingIPs naming them (between scenarios).
    fn delete_every_pair(&self) -> Result<()>
    where
        Self: Sized,
    {
        let names = self.block_on(async {
            let client = self.kube_client().await?;
            let list = Api::<HAPair>::all(client)
                .list(&ListParams::default())
                .await
                .map_err(|source| ClusterError::Kube { op: "list HAPairs".to_owned(), source })?;
            Ok::<_, ClusterError>(list.items.into_iter().filter_map(|p| p.metadata.name).collect::<Vec<_>>())
        })?;
        for n in names {
            self.delete_pair(&n)?;
        }
        Ok(())
    }

    /// The pair.
    fn pair(&self, name: &str) -> Result<HAPair>
    where
        Self: Sized,
    {
        self.block_on(async {
            get_pair(&self.kube_client().await?, name)
                .await
                .map_err(|source| ClusterError::Kube { op: format!("get HAPair {name}"), source })
        })
    }

    /// The pair's Lease: (holder, epoch).
    fn lease(&self, pair: &str) -> Result<(Option<String>, i64)>
    where
        Self: Sized,
    {
        self.block_on(async {
            get_lease(&self.kube_client().await?, pair)
                .await
                .map_err(|source| ClusterError::Kube { op: format!("get the Lease of {pair}"), source })
        })
    }

    /// Polls `cond` on the pair until it holds or `timeout` passes; the error carries
    /// the pair's status and the logs.
    fn wait_pair(&self, name: &str, timeout: Duration, what: &str, cond: impl Fn(&HAPair) -> bool) -> Result<HAPair>
    where
        Self: Sized,
    {
        let start = Instant::now();
        loop {
            if let Ok(p) = self.pair(name)
                && cond(&p)
            {
                return Ok(p);
            }
            if start.elapsed() > timeout {
                let status = self
                    .pair(name)
                    .ok()
                    .and_then(|p| p.status)
                    .map(|s| serde_json::to_string(&s).unwrap_or_default())
                    .unwrap_or_default();
                return Err(ClusterError::Timeout {
                    what: what.to_owned(),
                    timeout,
                    state: format!("pair status: {status}\n{}", self.logs_tail(25)),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs `kubectl-havip <args>`; (success, output).
    fn plugin(&self, args: &[&str]) -> (bool, String) {
        run_plugin(&self.plugin_binary(), &self.kubeconfig(), args)
    }

    /// `kubectl <args>`; (success, stdout).
    fn kubectl(&self, args: &[&str]) -> (bool, String) {
        match self.kubectl_command().args(args).output() {
            Ok(o) => (o.status.success(), String::from_utf8_lossy(&o.stdout).into_owned()),
            Err(e) => (false, e.to_string()),
        }
    }

    /// The FloatingIP `name`.
    fn floating_ip(&self, name: &str) -> Result<FloatingIP>
    where
        Self: Sized,
    {
        self.block_on(async {
            Api::<FloatingIP>::all(self.kube_client().await?)
                .get(name)
                .await
                .map_err(|source| ClusterError::Kube { op: format!("get FloatingIP {name}"), source })
        })
    }

    /// Deletes FloatingIP `name` (absent is fine).
    fn delete_floating_ip(&self, name: &str) -> Result<()>
    where
        Self: Sized,
    {
        self.block_on(async {
            match Api::<FloatingIP>::all(self.kube_client().await?).delete(name, &DeleteParams::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(source) => Err(ClusterError::Kube { op: format!("delete FloatingIP {name}"), source }),
            }
        })
    }

    /// The Events about object `name` as "Reason message".
    fn events_about(&self, name: &str) -> Vec<String>
    where
        Self: Sized,
    {
        self.block_on(async {
            let Ok(client) = self.kube_client().await else { return Vec::new() };
            Api::<Event>::all(client)
                .list(&ListParams::default())
                .await
                .map(|l| {
                    l.items
                        .into_iter()
                        .filter(|e| e.involved_object.name.as_deref() == Some(name))
                        .map(|e| format!("{} {}", e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
                        .collect()
                })
                .unwrap_or_default()
        })
    }
}

/// The local provider's client: a [`Prober`] in the client namespace.
struct LocalClient(Prober);

impl TrafficClient for LocalClient {
    fn wait_for_responder(&self, name: &str, timeout: Duration) -> Result<Duration> {
        Ok(self.0.wait_for_responder(name, timeout)?)
    }
    fn stop(self: Box<Self>) -> Result<ProbeReport> {
        Ok(self.0.stop()?)
    }
}

/// The local provider: a [`KubeLab`] (node = network namespace, agents and operator =
/// processes, API outage = the API server stopped).
pub struct LocalCluster {
    /// The lab.
    pub lab: KubeLab,
    api_down: bool,
}

impl LocalCluster {
    /// Wraps a started lab.
    pub fn new(lab: KubeLab) -> Self {
        Self { lab, api_down: false }
    }
}

impl Cluster for LocalCluster {
    fn nodes(&self) -> Vec<String> {
        self.lab.topo.nodes().iter().map(|n| n.name.clone()).collect()
    }
    fn kubeconfig(&self) -> PathBuf {
        self.lab.cp.kubeconfig()
    }
    fn kubectl_command(&self) -> Command {
        self.lab.cp.kubectl()
    }
    fn pair_yaml(&self, name: &str, members: usize) -> String {
        let mut y = self.lab.pair_yaml(name);
        for (i, n) in self.lab.topo.nodes().iter().enumerate().skip(members) {
            y = y.replace(&format!("    - node: {}\n      priority: {}\n", n.name, 200 - 10 * i), "");
        }
        y
    }
    fn cut_node(&mut self, i: usize) -> Result<()> {
        self.lab.topo.cut_cable(i, Link::Mgmt)?;
        self.lab.topo.cut_cable(i, Link::Data)?;
        Ok(())
    }
    fn restore_node(&mut self, i: usize) -> Result<()> {
        self.lab.topo.restore_cable(i, Link::Data)?;
        self.lab.topo.restore_cable(i, Link::Mgmt)?;
        Ok(())
    }
    fn stop_operator(&mut self) -> Result<()> {
        self.lab.stop_operator();
        Ok(())
    }
    fn start_operator(&mut self) -> Result<()> {
        Ok(self.lab.start_operator()?)
    }
    fn restart_agent(&mut self, i: usize) -> Result<()> {
        self.lab.stop_agent(i);
        Ok(self.lab.start_agent(i)?)
    }
    fn api_outage_begin(&mut self) -> Result<()> {
        self.lab.cp.stop_apiserver();
        self.api_down = true;
        Ok(())
    }
    fn api_outage_end(&mut self) -> Result<()> {
        if self.api_down {
            self.lab.cp.start_apiserver()?;
            self.api_down = false;
        }
        Ok(())
    }
    fn client(&self) -> Result<Box<dyn TrafficClient>> {
        Ok(Box::new(LocalClient(Prober::on_client(&self.lab.topo, self.lab.target())?)))
    }
    fn holders(&self) -> Result<Vec<usize>> {
        Ok(self.lab.holders()?)
    }
    fn logs_tail(&self, lines: usize) -> String {
        self.lab.logs_tail(lines)
    }
    fn pair_yaml_on(&mut self, name: &str, members: &[usize], vip: u8, port: u16) -> Result<String> {
        for i in members {
            self.lab.serve(*i, port)?;
        }
        Ok(self.lab.pair_yaml_on(name, members, vip, port))
    }
    fn holders_of(&self, vip: u8) -> Result<Vec<usize>> {
        Ok(self.lab.holders_of(vip)?)
    }
    fn client_to(&self, vip: u8, port: u16) -> Result<Box<dyn TrafficClient>> {
        let target = std::net::SocketAddr::new(std::net::IpAddr::V4(self.lab.topo.vip(vip)), port);
        Ok(Box::new(LocalClient(Prober::on_client(&self.lab.topo, target)?)))
    }
    fn set_service(&mut self, i: usize, port: u16, up: bool) -> Result<()> {
        if up {
            self.lab.serve(i, port)?;
        } else {
            self.lab.stop_serving(i, port);
        }
        Ok(())
    }
    fn agent_metric(&self, i: usize, name: &str, filters: &[&str]) -> Result<f64> {
        self.lab.agent_metric_sum(i, name, filters).ok_or(ClusterError::NoMetrics { node: i })
    }
}
