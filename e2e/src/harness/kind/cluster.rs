//! The [`KindCluster`]: the [`Cluster`] the scenarios run against, running the commands of
//! [`super::commands`], and its client (`e2e-tool probe` in a container).

use super::commands::{KindConfig, NAMESPACE, RESPONDER_PORTS, SERVICE_PORT, host_link_name, vip_at, vip_in_subnet};
use crate::harness::cluster::{Cluster, ClusterError, Result, SHARED_VIPS, TrafficClient};
use crate::harness::metrics::metric_sum;
use crate::traffic::{Probe, ProbeReport};
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Runs argv; stdout on success, else an error with stderr.
pub fn run(argv: &[String]) -> Result<String> {
    let (bin, args) = argv.split_first().ok_or(ClusterError::EmptyCommand)?;
    let out =
        Command::new(bin).args(args).output().map_err(|source| ClusterError::Spawn { cmd: argv.join(" "), source })?;
    if out.status.success() { Ok(String::from_utf8_lossy(&out.stdout).into_owned()) } else { Err(failed(argv, &out)) }
}

/// The error of a command that exited unsuccessfully.
fn failed(argv: &[String], out: &std::process::Output) -> ClusterError {
    ClusterError::Command {
        cmd: argv.join(" "),
        status: out.status.to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    }
}

/// A kind cluster created by [`KindCluster::up`].
pub struct KindCluster {
    /// Names and paths.
    pub cfg: KindConfig,
    vip: (Ipv4Addr, u8),
    api_blocked: bool,
    /// The chart runs with other values than [`KindConfig::install_chart`]'s, or is
    /// uninstalled: the next reset installs it again.
    chart_changed: bool,
    /// Services stopped by [`Cluster::set_service`] (node, port): restarted by the reset.
    stopped: std::collections::BTreeSet<(usize, u16)>,
}

impl KindCluster {
    /// Creates the cluster, loads the images, installs the chart and the responders;
    /// logs how long each step took.
    pub fn up(cfg: KindConfig) -> Result<Self> {
        let timed = |step: &str, f: &dyn Fn() -> Result<()>| -> Result<()> {
            let start = Instant::now();
            tracing::info!(step, "kind-e2e up: starting");
            f()?;
            tracing::info!(step, seconds = start.elapsed().as_secs_f64(), "kind-e2e up: done");
            Ok(())
        };
        timed("kind create cluster", &|| run(&cfg.create_cluster()).map(drop))?;
        // kind waits for the control plane only; the workers follow within seconds.
        timed("nodes Ready", &|| {
            run(&cfg.kubectl(&["wait", "--for=condition=Ready", "nodes", "--all", "--timeout=180s"])).map(drop)
        })?;
        timed("kind load docker-image", &|| run(&cfg.load_images()).map(drop))?;
        timed("helm install", &|| run(&cfg.install_chart()).map(drop))?;
        timed("responders", &|| Self::apply_responders(&cfg))?;
        Self::attach(cfg)
    }

    /// Applies YAML with `kubectl apply -f -`.
    pub fn kubectl_apply(cfg: &KindConfig, yaml: &str) -> Result<()> {
        let argv = cfg.kubectl(&["apply", "-f", "-"]);
        let (bin, args) = argv.split_first().ok_or(ClusterError::EmptyCommand)?;
        let cmd = || argv.join(" ");
        let mut child = Command::new(bin)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| ClusterError::Spawn { cmd: cmd(), source })?;
        if let Some(mut stdin) = child.stdin.take() {
            use std::io::Write;
            stdin.write_all(yaml.as_bytes()).map_err(|source| ClusterError::Io {
                op: "write the manifest to",
                cmd: cmd(),
                source,
            })?;
        }
        let out = child.wait_with_output().map_err(|source| ClusterError::Io { op: "wait for", cmd: cmd(), source })?;
        if !out.status.success() {
            return Err(failed(&argv, &out));
        }
        Ok(())
    }

    /// Applies the responder DaemonSet and waits for its rollout.
    pub fn apply_responders(cfg: &KindConfig) -> Result<()> {
        Self::kubectl_apply(cfg, &cfg.responders_yaml())?;
        run(&cfg.rollout_status("daemonset/havip-e2e-responder"))?;
        Ok(())
    }

    /// Attaches to an existing suite cluster (after `kind-e2e up`).
    pub fn attach(cfg: KindConfig) -> Result<Self> {
        let subnets = run(&KindConfig::inspect_subnets())?;
        let vip = subnets
            .split_whitespace()
            .find_map(vip_in_subnet)
            .ok_or_else(|| ClusterError::NoSubnet { subnets: subnets.clone() })?;
        Ok(Self { cfg, vip, api_blocked: false, chart_changed: false, stopped: Default::default() })
    }

    /// The host end of node `i`'s `eth0` on the kind bridge (its "cable").
    fn cable(&self, i: usize) -> Result<String> {
        let node = self.node_name(i)?;
        let index = run(&KindConfig::eth0_peer_index(&node))?;
        let index = index.trim();
        let links = run(&KindConfig::host_links())?;
        host_link_name(&links, index).ok_or_else(|| ClusterError::NoCable { node, index: index.to_owned() })
    }

    /// Deletes the cluster.
    pub fn down(cfg: &KindConfig) -> Result<()> {
        run(&cfg.delete_cluster()).map(drop)
    }
}

/// The client: `e2e-tool probe` in a container, its JSON lines read by a thread.
struct KindClient {
    child: Child,
    rm: Vec<String>,
    target: SocketAddr,
    started: Instant,
    timeline: Arc<Mutex<Vec<Probe>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl TrafficClient for KindClient {
    fn wait_for_responder(&self, name: &str, timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        loop {
            let last =
                self.timeline.lock().ok().and_then(|t| t.iter().rev().find_map(|p| p.outcome.as_ref().ok().cloned()));
            if last.as_deref() == Some(name) {
                return Ok(start.elapsed());
            }
            if start.elapsed() >= timeout {
                return Err(ClusterError::Timeout {
                    what: format!("a probe answered by {name}"),
                    timeout,
                    state: format!("the last answer was {last:?}"),
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn stop(mut self: Box<Self>) -> Result<ProbeReport> {
        let _ = run(&self.rm);
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        let timeline = self.timeline.lock().map(|t| t.clone()).unwrap_or_default();
        Ok(ProbeReport::from_timeline(self.target, Duration::from_millis(20), self.started.elapsed(), 0, timeline))
    }
}

impl Cluster for KindCluster {
    fn nodes(&self) -> Vec<String> {
        self.cfg.worker_nodes()
    }
    /// Next to the running binary (`target/debug/kind-e2e`), else from `PATH`.
    fn plugin_binary(&self) -> PathBuf {
        std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(|d| d.join("kubectl-havip")))
            .filter(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from("kubectl-havip"))
    }
    fn kubeconfig(&self) -> PathBuf {
        self.cfg.kubeconfig.clone()
    }
    fn kubectl_command(&self) -> Command {
        let mut c = Command::new(&self.cfg.kubectl);
        c.arg("--kubeconfig").arg(&self.cfg.kubeconfig);
        c
    }
    fn pair_yaml(&self, name: &str, members: usize) -> String {
        self.cfg.pair_yaml(name, members, self.vip.0, self.vip.1)
    }
    fn cut_node(&mut self, i: usize) -> Result<()> {
        let cable = self.cable(i)?;
        run(&KindConfig::host_link(&cable, false)).map(drop)
    }
    fn restore_node(&mut self, i: usize) -> Result<()> {
        let cable = self.cable(i)?;
        run(&KindConfig::host_link(&cable, true)).map(drop)
    }
    fn stop_operator(&mut self) -> Result<()> {
        run(&self.cfg.scale_operator(0))?;
        run(&self.cfg.kubectl(&[
            "-n",
            NAMESPACE,
            "wait",
            "--for=delete",
            "pod",
            "-l",
            "app.kubernetes.io/component=operator",
            "--timeout=60s",
        ]))
        .map(drop)
    }
    fn start_operator(&mut self) -> Result<()> {
        run(&self.cfg.scale_operator(2))?;
        run(&self.cfg.rollout_status("deployment/havip-operator")).map(drop)
    }
    fn restart_agent(&mut self, i: usize) -> Result<()> {
        self.delete_agent_pod(&self.node_name(i)?)?;
        run(&self.cfg.rollout_status("daemonset/havip-agent")).map(drop)
    }
    fn api_outage_begin(&mut self) -> Result<()> {
        for n in self.cfg.worker_nodes() {
            for argv in KindConfig::api_block(&n, true) {
                run(&argv)?;
            }
        }
        self.api_blocked = true;
        Ok(())
    }
    fn api_outage_end(&mut self) -> Result<()> {
        if self.api_blocked {
            for n in self.cfg.worker_nodes() {
                for argv in KindConfig::api_block(&n, false) {
                    run(&argv)?;
                }
            }
            self.api_blocked = false;
        }
        Ok(())
    }
    fn client(&self) -> Result<Box<dyn TrafficClient>> {
        self.client_for(SocketAddr::from((self.vip.0, SERVICE_PORT)))
    }
    fn holders(&self) -> Result<Vec<usize>> {
        self.holders_of(0)
    }
    fn logs_tail(&self, lines: usize) -> String {
        let mut out = String::new();
        for component in ["operator", "agent"] {
            let argv = self.cfg.kubectl(&[
                "-n",
                NAMESPACE,
                "logs",
                "-l",
                &format!("app.kubernetes.io/component={component}"),
                "--prefix",
                &format!("--tail={lines}"),
            ]);
            out.push_str(&format!("--- {component} ---\n{}\n", run(&argv).unwrap_or_else(|e| e.to_string())));
        }
        out
    }
    fn pair_yaml_on(&mut self, name: &str, members: &[usize], vip: u8, port: u16) -> Result<String> {
        if vip >= SHARED_VIPS || !RESPONDER_PORTS.contains(&port) {
            return Err(ClusterError::NoSharedSlot { vip, port });
        }
        for i in members {
            self.set_service(*i, port, true)?;
        }
        Ok(self.cfg.pair_yaml_on(name, members, vip_at(self.vip.0, vip), self.vip.1, port))
    }
    fn holders_of(&self, vip: u8) -> Result<Vec<usize>> {
        let vip = format!(" {}/", vip_at(self.vip.0, vip));
        let mut out = Vec::new();
        for (i, n) in self.cfg.worker_nodes().iter().enumerate() {
            if run(&KindConfig::addresses(n))?.contains(&vip) {
                out.push(i);
            }
        }
        Ok(out)
    }
    fn client_to(&self, vip: u8, port: u16) -> Result<Box<dyn TrafficClient>> {
        self.client_for(SocketAddr::from((vip_at(self.vip.0, vip), port)))
    }
    /// A stopped service refuses connections on its port (an iptables reset rule in the
    /// node): the responders keep running, as kubelet would restart a killed one.
    fn set_service(&mut self, i: usize, port: u16, up: bool) -> Result<()> {
        let node = self.node_name(i)?;
        if up {
            if self.stopped.remove(&(i, port)) {
                run(&KindConfig::service_block(&node, port, false))?;
            }
        } else if self.stopped.insert((i, port)) {
            run(&KindConfig::service_block(&node, port, true))?;
        }
        Ok(())
    }
    fn agent_metric(&self, i: usize, name: &str, filters: &[&str]) -> Result<f64> {
        let text =
            run(&self.cfg.agent_metrics(&self.node_name(i)?)).map_err(|_| ClusterError::NoMetrics { node: i })?;
        Ok(metric_sum(&text, name, filters))
    }
}

impl KindCluster {
    fn node_name(&self, i: usize) -> Result<String> {
        self.cfg.worker_nodes().get(i).cloned().ok_or(ClusterError::NoNode(i))
    }

    /// A client container probing `target` (`e2e-tool probe`).
    pub fn client_for(&self, target: SocketAddr) -> Result<Box<dyn TrafficClient>> {
        self.client_on(super::NETWORK, target)
    }

    /// [`KindCluster::client_for`] on docker network `network` (`container:<name>`: in
    /// that container's network namespace).
    pub fn client_on(&self, network: &str, target: SocketAddr) -> Result<Box<dyn TrafficClient>> {
        let argv = self.cfg.client_on(network, target);
        let _ = run(&self.cfg.client_rm());
        let (bin, args) = argv.split_first().ok_or(ClusterError::EmptyCommand)?;
        let mut child = Command::new(bin)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| ClusterError::Spawn { cmd: argv.join(" "), source })?;
        let stdout = child.stdout.take().ok_or_else(|| ClusterError::NoOutput { cmd: argv.join(" ") })?;
        let timeline: Arc<Mutex<Vec<Probe>>> = Arc::default();
        let t2 = timeline.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(std::result::Result::ok) {
                if let Ok(p) = serde_json::from_str::<Probe>(&line)
                    && let Ok(mut t) = t2.lock()
                {
                    t.push(p);
                }
            }
        });
        Ok(Box::new(KindClient {
            child,
            rm: self.cfg.client_rm(),
            target,
            started: Instant::now(),
            timeline,
            reader: Some(reader),
        }))
    }

    /// The suite's e2e-tools image (`respond`, `probe`).
    pub fn tools_image(&self) -> String {
        self.cfg.image("havip-e2e-tools")
    }

    /// `kubectl apply -f -` of `yaml`.
    pub fn apply_yaml(&self, yaml: &str) -> Result<()> {
        Self::kubectl_apply(&self.cfg, yaml)
    }

    /// The standard pair's VIP and prefix length.
    pub fn vip(&self) -> (Ipv4Addr, u8) {
        self.vip
    }

    /// Runs kubectl with the suite's kubeconfig; stdout, or an error with stderr.
    pub fn kubectl_run(&self, args: &[&str]) -> Result<String> {
        run(&self.cfg.kubectl(args))
    }

    /// `helm upgrade` of the chart with the suite's values plus `sets` (`key=value`).
    pub fn helm_upgrade(&mut self, sets: &[&str]) -> Result<()> {
        let mut argv = self.cfg.install_chart();
        for kv in sets {
            argv.extend(["--set".to_owned(), (*kv).to_owned()]);
        }
        self.chart_changed = true;
        run(&argv).map(drop)
    }

    /// `helm upgrade` of the chart with the suite's values plus a values file of
    /// `values_yaml` (for values `--set` cannot carry: multi-line strings, commas).
    pub fn helm_upgrade_values(&mut self, values_yaml: &str) -> Result<()> {
        let path = std::env::temp_dir().join(format!("{}-values.yaml", self.cfg.cluster));
        std::fs::write(&path, values_yaml)
            .map_err(|source| ClusterError::Spawn { cmd: format!("write {}", path.display()), source })?;
        let mut argv = self.cfg.install_chart();
        argv.extend(["-f".to_owned(), path.display().to_string()]);
        self.chart_changed = true;
        run(&argv).map(drop)
    }

    /// `helm upgrade --install` of the chart in `chart` with images tagged `tag` (the
    /// previous release's, or this one's without `--wait`): the chart counts as changed.
    pub fn helm_install_from(&mut self, chart: &std::path::Path, tag: &str, wait: bool) -> Result<()> {
        self.chart_changed = true;
        run(&self.cfg.install_chart_from(chart, tag, wait)).map(drop)
    }

    /// `helm uninstall` of the chart, waiting for its resources to go.
    pub fn helm_uninstall(&mut self) -> Result<()> {
        self.chart_changed = true;
        run(&self.cfg.uninstall_chart()).map(drop)
    }

    /// Back to the suite's baseline after a scenario changed the chart or the nodes:
    /// every worker schedulable, the chart installed with the suite's values (a VIP an
    /// uninstalled chart left behind is removed by hand first: nothing would own it).
    pub fn restore_baseline(&mut self) -> Result<()> {
        for n in self.cfg.worker_nodes() {
            run(&self.cfg.kubectl(&["uncordon", &n]))?;
        }
        for (i, port) in std::mem::take(&mut self.stopped) {
            run(&KindConfig::service_block(&self.node_name(i)?, port, false))?;
        }
        if self.chart_changed {
            // A scenario that ran an earlier release may have left its CRDs or a paused
            // operator rollout (the upgrade scenario): this release's CRDs, rollouts resumed.
            let crds = self.cfg.repo.join("charts/havip/charts/crds/crds");
            let crds = crds.display().to_string();
            run(&self.cfg.kubectl(&["apply", "--server-side", "--force-conflicts", "-f", &crds]))?;
            let _ = run(&self.cfg.kubectl(&["-n", NAMESPACE, "rollout", "resume", "deployment/havip-operator"]));
            let installed = run(&self.cfg.kubectl(&["-n", NAMESPACE, "get", "daemonset/havip-agent"])).is_ok();
            if !installed {
                let (vip, prefix) = self.vip;
                for i in self.holders()? {
                    let node = self.node_name(i)?;
                    tracing::warn!(%node, %vip, "removing a VIP the uninstalled chart left behind");
                    run(&KindConfig::addr_del(&node, vip, prefix))?;
                }
            }
            run(&self.cfg.install_chart())?;
            self.chart_changed = false;
        }
        Ok(())
    }

    /// The holder of the operator's leader-election Lease (a pod name).
    pub fn operator_leader(&self) -> Result<Option<String>> {
        let out = run(&self.cfg.kubectl(&[
            "-n",
            NAMESPACE,
            "get",
            "lease",
            "havip-operator",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ]))?;
        Ok(Some(out.trim().to_owned()).filter(|h| !h.is_empty()))
    }

    /// `jsonpath` over the pods of the chart's `component` (`agent`, `operator`), terminating
    /// ones included.
    pub fn pods_of(&self, component: &str, jsonpath: &str) -> Result<String> {
        run(&self.cfg.kubectl(&[
            "-n",
            NAMESPACE,
            "get",
            "pods",
            "-l",
            &format!("app.kubernetes.io/component={component}"),
            "-o",
            &format!("jsonpath={jsonpath}"),
        ]))
    }

    /// The names of the agent pods.
    pub fn agent_pods(&self) -> Result<Vec<String>> {
        Ok(self.pods_of("agent", "{.items[*].metadata.name}")?.split_whitespace().map(str::to_owned).collect())
    }

    /// Deletes node `node`'s agent pod and waits until it is gone (the DaemonSet starts
    /// another).
    pub fn delete_agent_pod(&self, node: &str) -> Result<()> {
        run(&self.cfg.delete_agent_pod(node)).map(drop)
    }
}
