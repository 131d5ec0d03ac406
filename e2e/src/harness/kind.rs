//! The kind provider of the end-to-end suite: the same [`crate::scenarios`] as
//! `make e2e`, on a kind cluster (one control plane, three workers) with the chart
//! installed from `charts/havip` and the images `make images` builds.
//!
//! Everything here is command construction (pure functions, unit-tested: kind cannot
//! create a cluster where no image can be pulled) and a thin [`Cluster`]
//! implementation that runs those commands:
//! node cut = the host end of the node's eth0 on the kind bridge down · agent restart =
//! delete the node's agent pod (the DaemonSet starts a new one) · operator stop =
//! scale the Deployment to 0 · API outage = drop the nodes' TCP to the API server
//! port · client = a container on the kind network running `e2e-tool probe`.

use crate::harness::cluster::{Cluster, ClusterError, Result, TrafficClient};
use crate::traffic::{Probe, ProbeReport};
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The port the responders answer on (and the pair's probe port).
pub const SERVICE_PORT: u16 = 8080;
/// The chart's namespace.
pub const NAMESPACE: &str = "havip-system";
/// The kind network.
pub const NETWORK: &str = "kind";
/// The API server's port inside the kind network.
pub const API_PORT: u16 = 6443;

/// Names and paths of one kind suite run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KindConfig {
    /// The kind cluster's name.
    pub cluster: String,
    /// Worker nodes (kind names them `<cluster>-worker`, `<cluster>-worker2`, …).
    pub workers: usize,
    /// Image prefix and tag (`<prefix>/havip-operator:<tag>`, …).
    pub image_prefix: String,
    /// Image tag.
    pub tag: String,
    /// Where the cluster's kubeconfig is written.
    pub kubeconfig: PathBuf,
    /// The kind binary.
    pub kind: PathBuf,
    /// The helm binary.
    pub helm: PathBuf,
    /// The kubectl binary.
    pub kubectl: PathBuf,
    /// The repository root (chart and kind config).
    pub repo: PathBuf,
    /// The kind node image (`hack/kind-node-image.sh` builds `havip/kind-node:v1.37.2`);
    /// `None`: kind's default image.
    pub node_image: Option<String>,
}

fn s(v: &str) -> String {
    v.to_owned()
}

impl KindConfig {
    /// The node containers that run workloads (pair members), in order.
    pub fn worker_nodes(&self) -> Vec<String> {
        (1..=self.workers)
            .map(|i| if i == 1 { format!("{}-worker", self.cluster) } else { format!("{}-worker{i}", self.cluster) })
            .collect()
    }

    /// An image reference.
    pub fn image(&self, name: &str) -> String {
        format!("{}/{name}:{}", self.image_prefix, self.tag)
    }

    /// The images the suite loads into the cluster.
    pub fn images(&self) -> Vec<String> {
        ["havip-operator", "havip-agent", "havip-e2e-tools"].iter().map(|n| self.image(n)).collect()
    }

    /// `kind create cluster`.
    pub fn create_cluster(&self) -> Vec<String> {
        let mut v = vec![
            self.kind.display().to_string(),
            s("create"),
            s("cluster"),
            s("--name"),
            self.cluster.clone(),
            s("--config"),
            self.repo.join("e2e/kind/cluster.yaml").display().to_string(),
            s("--kubeconfig"),
            self.kubeconfig.display().to_string(),
            s("--wait"),
            s("300s"),
        ];
        if let Some(image) = &self.node_image {
            v.extend([s("--image"), image.clone()]);
        }
        v
    }

    /// `kind delete cluster`.
    pub fn delete_cluster(&self) -> Vec<String> {
        vec![self.kind.display().to_string(), s("delete"), s("cluster"), s("--name"), self.cluster.clone()]
    }

    /// `kind load docker-image` of every image.
    pub fn load_images(&self) -> Vec<String> {
        let mut v = vec![self.kind.display().to_string(), s("load"), s("docker-image")];
        v.extend(self.images());
        v.extend([s("--name"), self.cluster.clone()]);
        v
    }

    /// `helm upgrade --install` of the chart with the suite's images.
    pub fn install_chart(&self) -> Vec<String> {
        vec![
            self.helm.display().to_string(),
            s("upgrade"),
            s("--install"),
            s("havip"),
            self.repo.join("charts/havip").display().to_string(),
            s("--namespace"),
            s(NAMESPACE),
            s("--create-namespace"),
            s("--kubeconfig"),
            self.kubeconfig.display().to_string(),
            s("--set"),
            format!("image.repository={}", self.image_prefix),
            s("--set"),
            format!("image.tag={}", self.tag),
            s("--set"),
            s("image.pullPolicy=Never"),
            // The operator on the control-plane node, off the pair's members: a cut member
            // must not also cut the operator's leader off the API server (that is its own
            // scenario, the leader pod deleted), or every status the scenarios wait for
            // would trail by a leader election.
            s("--set-string"),
            s(r"operator.nodeSelector.node-role\.kubernetes\.io/control-plane="),
            s("--set"),
            s("operator.tolerations[0].key=node-role.kubernetes.io/control-plane"),
            s("--set"),
            s("operator.tolerations[0].operator=Exists"),
            s("--set"),
            s("operator.tolerations[0].effect=NoSchedule"),
            s("--wait"),
            s("--timeout"),
            s("180s"),
        ]
    }

    /// `helm uninstall` of the chart.
    pub fn uninstall_chart(&self) -> Vec<String> {
        vec![
            self.helm.display().to_string(),
            s("uninstall"),
            s("havip"),
            s("--namespace"),
            s(NAMESPACE),
            s("--kubeconfig"),
            self.kubeconfig.display().to_string(),
            s("--wait"),
            s("--timeout"),
            s("180s"),
        ]
    }

    /// kubectl with the suite's kubeconfig and `args`.
    pub fn kubectl(&self, args: &[&str]) -> Vec<String> {
        let mut v = vec![self.kubectl.display().to_string(), s("--kubeconfig"), self.kubeconfig.display().to_string()];
        v.extend(args.iter().map(|a| (*a).to_owned()));
        v
    }

    /// The responders: a hostNetwork DaemonSet answering its node's name on
    /// [`SERVICE_PORT`] (what the VIP serves, and what the agents probe).
    pub fn responders_yaml(&self) -> String {
        format!(
            r#"apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: havip-e2e-responder
  namespace: {NAMESPACE}
spec:
  selector:
    matchLabels: {{app: havip-e2e-responder}}
  template:
    metadata:
      labels: {{app: havip-e2e-responder}}
    spec:
      hostNetwork: true
      tolerations: [{{operator: Exists}}]
      containers:
        - name: responder
          image: {image}
          imagePullPolicy: Never
          args: ["respond", "--port", "{SERVICE_PORT}", "--name", "$(NODE_NAME)"]
          env:
            - name: NODE_NAME
              valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}
"#,
            image = self.image("havip-e2e-tools")
        )
    }

    /// The standard pair over the first `members` workers: one heartbeat path (kind
    /// nodes have one address), one VIP in the kind network.
    pub fn pair_yaml(&self, name: &str, members: usize, vip: Ipv4Addr, prefix: u8) -> String {
        let mut y =
            format!("apiVersion: havip.io/v1alpha1\nkind: HAPair\nmetadata:\n  name: {name}\nspec:\n  members:\n");
        for (i, n) in self.worker_nodes().iter().take(members).enumerate() {
            y.push_str(&format!("    - node: {n}\n      priority: {}\n", 200 - 10 * i));
        }
        y.push_str("  heartbeat:\n    paths:\n      - name: kind\n        addressType: InternalIP\n");
        y.push_str(&format!(
            "---\napiVersion: havip.io/v1alpha1\nkind: FloatingIP\nmetadata:\n  name: {name}-vip\nspec:\n  pair: {name}\n  address: {vip}/{prefix}\n  interface: eth0\n  probe:\n    ports: [{SERVICE_PORT}]\n"
        ));
        y
    }

    /// The index of the host end of the node container's `eth0` (its `iflink`).
    pub fn eth0_peer_index(node: &str) -> Vec<String> {
        vec![s("docker"), s("exec"), node.to_owned(), s("cat"), s("/sys/class/net/eth0/iflink")]
    }

    /// The host's links, one per line (`<index>: <name>@…: …`).
    pub fn host_links() -> Vec<String> {
        vec![s("ip"), s("-o"), s("link"), s("show")]
    }

    /// Sets a host link (the node's cable on the kind bridge) down (node cut) or up
    /// (restore). Like pulling the node's cable: the node's `eth0` loses carrier and keeps
    /// its name, addresses and routes, so the restore is the cable plugged in again.
    pub fn host_link(name: &str, up: bool) -> Vec<String> {
        vec![s("ip"), s("link"), s("set"), s("dev"), name.to_owned(), s(if up { "up" } else { "down" })]
    }

    /// The kind network's subnets.
    pub fn inspect_subnets() -> Vec<String> {
        vec![
            s("docker"),
            s("network"),
            s("inspect"),
            s(NETWORK),
            s("-f"),
            s("{{range .IPAM.Config}}{{.Subnet}} {{end}}"),
        ]
    }

    /// Inserts (`insert`) or deletes the rules that cut a node off the API server:
    /// its own TCP to the API port (hostNetwork agents; after kube-proxy's DNAT) and
    /// forwarded TCP from its pods (the operator).
    pub fn api_block(node: &str, insert: bool) -> Vec<Vec<String>> {
        let op = if insert { "-I" } else { "-D" };
        ["OUTPUT", "FORWARD"]
            .iter()
            .map(|chain| {
                vec![
                    s("docker"),
                    s("exec"),
                    node.to_owned(),
                    s("iptables"),
                    s(op),
                    s(chain),
                    s("-p"),
                    s("tcp"),
                    s("--dport"),
                    API_PORT.to_string(),
                    s("-m"),
                    s("comment"),
                    s("--comment"),
                    s("havip-e2e-api-outage"),
                    s("-j"),
                    s("DROP"),
                ]
            })
            .collect()
    }

    /// Removes an address from the node's eth0.
    pub fn addr_del(node: &str, addr: Ipv4Addr, prefix: u8) -> Vec<String> {
        vec![
            s("docker"),
            s("exec"),
            node.to_owned(),
            s("ip"),
            s("addr"),
            s("del"),
            format!("{addr}/{prefix}"),
            s("dev"),
            s("eth0"),
        ]
    }

    /// The node's addresses on eth0 (who holds the VIP).
    pub fn addresses(node: &str) -> Vec<String> {
        vec![s("docker"), s("exec"), node.to_owned(), s("ip"), s("-o"), s("addr"), s("show"), s("dev"), s("eth0")]
    }

    /// The client container: `e2e-tool probe` against `target`, one JSON line per probe.
    pub fn client(&self, target: SocketAddr) -> Vec<String> {
        vec![
            s("docker"),
            s("run"),
            s("--rm"),
            s("--name"),
            format!("{}-client", self.cluster),
            s("--network"),
            s(NETWORK),
            self.image("havip-e2e-tools"),
            s("probe"),
            s("--target"),
            target.to_string(),
            s("--interval-ms"),
            s("20"),
            // The responders are containers on kind nodes that share this machine's cores
            // with four kubelets and the control plane: an accepted connection may wait
            // for its one-line answer longer than on the local lab. A connect that fails
            // (refused, reset, no SYN-ACK within 50 ms) still counts at once.
            s("--read-timeout-ms"),
            s("250"),
        ]
    }

    /// Removes the client container.
    pub fn client_rm(&self) -> Vec<String> {
        vec![s("docker"), s("rm"), s("-f"), format!("{}-client", self.cluster)]
    }

    /// Deletes node `node`'s agent pod (SIGTERM: a rolling upgrade of one node).
    pub fn delete_agent_pod(&self, node: &str) -> Vec<String> {
        self.kubectl(&[
            "-n",
            NAMESPACE,
            "delete",
            "pod",
            "-l",
            "app.kubernetes.io/component=agent",
            "--field-selector",
            &format!("spec.nodeName={node}"),
            "--wait=true",
        ])
    }

    /// Scales the operator Deployment.
    pub fn scale_operator(&self, replicas: u8) -> Vec<String> {
        self.kubectl(&["-n", NAMESPACE, "scale", "deployment/havip-operator", &format!("--replicas={replicas}")])
    }

    /// Waits for a rollout (`deployment/havip-operator`, `daemonset/havip-agent`, …).
    pub fn rollout_status(&self, what: &str) -> Vec<String> {
        self.kubectl(&["-n", NAMESPACE, "rollout", "status", what, "--timeout=120s"])
    }
}

/// The VIP the suite uses in an IPv4 subnet: 55 below the broadcast address (far
/// from the addresses Docker hands out from the bottom), with the subnet's prefix.
pub fn vip_in_subnet(cidr: &str) -> Option<(Ipv4Addr, u8)> {
    let (net, prefix) = cidr.trim().split_once('/')?;
    let net: Ipv4Addr = net.parse().ok()?;
    let prefix: u8 = prefix.parse().ok()?;
    if !(8..=24).contains(&prefix) {
        return None;
    }
    let host_bits = 32 - u32::from(prefix);
    let broadcast = u32::from(net) | ((1u32 << host_bits) - 1);
    Some((Ipv4Addr::from(broadcast - 55), prefix))
}

/// The name of the link with `index` in `ip -o link show` output (`42: veth1a2b@if41: …`).
fn host_link_name(links: &str, index: &str) -> Option<String> {
    links.lines().find_map(|l| {
        let (i, rest) = l.split_once(": ")?;
        let name = rest.split(':').next()?.split('@').next()?;
        (i.trim() == index).then(|| name.to_owned())
    })
}

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
        Ok(Self { cfg, vip, api_blocked: false, chart_changed: false })
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
        run(&self.cfg.delete_agent_pod(&self.node_name(i)?))?;
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
        let vip = format!(" {}/", self.vip.0);
        let mut out = Vec::new();
        for (i, n) in self.cfg.worker_nodes().iter().enumerate() {
            if run(&KindConfig::addresses(n))?.contains(&vip) {
                out.push(i);
            }
        }
        Ok(out)
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
}

impl KindCluster {
    fn node_name(&self, i: usize) -> Result<String> {
        self.cfg.worker_nodes().get(i).cloned().ok_or(ClusterError::NoNode(i))
    }

    /// A client container probing `target` (`e2e-tool probe`).
    pub fn client_for(&self, target: SocketAddr) -> Result<Box<dyn TrafficClient>> {
        let argv = self.cfg.client(target);
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
            argv.extend([s("--set"), (*kv).to_owned()]);
        }
        self.chart_changed = true;
        run(&argv).map(drop)
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
        if self.chart_changed {
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

    /// The names of the agent pods.
    pub fn agent_pods(&self) -> Result<Vec<String>> {
        let out = run(&self.cfg.kubectl(&[
            "-n",
            NAMESPACE,
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/component=agent",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ]))?;
        Ok(out.split_whitespace().map(str::to_owned).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::{KindConfig, host_link_name, vip_in_subnet};
    use std::net::{Ipv4Addr, SocketAddr};
    use std::path::PathBuf;

    fn cfg() -> KindConfig {
        KindConfig {
            cluster: "havip-e2e".to_owned(),
            workers: 3,
            image_prefix: "havip".to_owned(),
            tag: "dev".to_owned(),
            kubeconfig: PathBuf::from("/tmp/k/kubeconfig"),
            kind: PathBuf::from("/c/kind"),
            helm: PathBuf::from("/c/helm"),
            kubectl: PathBuf::from("/c/kubectl"),
            repo: PathBuf::from("/src/havip"),
            node_image: Some("havip/kind-node:v1.37.2".to_owned()),
        }
    }

    #[test]
    fn workers_are_named_as_kind_names_them() {
        assert_eq!(cfg().worker_nodes(), ["havip-e2e-worker", "havip-e2e-worker2", "havip-e2e-worker3"]);
    }

    #[test]
    fn cluster_lifecycle_commands() {
        let c = cfg();
        assert_eq!(
            c.create_cluster().join(" "),
            "/c/kind create cluster --name havip-e2e --config /src/havip/e2e/kind/cluster.yaml --kubeconfig /tmp/k/kubeconfig --wait 300s --image havip/kind-node:v1.37.2"
        );
        assert_eq!(c.delete_cluster().join(" "), "/c/kind delete cluster --name havip-e2e");
        assert_eq!(
            c.load_images().join(" "),
            "/c/kind load docker-image havip/havip-operator:dev havip/havip-agent:dev havip/havip-e2e-tools:dev --name havip-e2e"
        );
        let helm = c.install_chart().join(" ");
        assert!(helm.starts_with("/c/helm upgrade --install havip /src/havip/charts/havip --namespace havip-system"));
        assert!(helm.contains("--set image.repository=havip --set image.tag=dev --set image.pullPolicy=Never"));
    }

    #[test]
    fn node_cut_is_the_nodes_cable_on_the_kind_bridge_down_and_up() {
        assert_eq!(
            KindConfig::eth0_peer_index("havip-e2e-worker").join(" "),
            "docker exec havip-e2e-worker cat /sys/class/net/eth0/iflink"
        );
        assert_eq!(KindConfig::host_link("veth1a2b", false).join(" "), "ip link set dev veth1a2b down");
        assert_eq!(KindConfig::host_link("veth1a2b", true).join(" "), "ip link set dev veth1a2b up");
        let links = "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536\n41: br-1234: <BROADCAST> mtu 1500\n43: veth1a2b@if42: <BROADCAST,MULTICAST,UP> mtu 1500 master br-1234\n";
        assert_eq!(host_link_name(links, "43").as_deref(), Some("veth1a2b"));
        assert_eq!(host_link_name(links, "41").as_deref(), Some("br-1234"));
        assert_eq!(host_link_name(links, "4"), None);
    }

    #[test]
    fn api_outage_drops_the_api_port_in_output_and_forward_and_is_undone_symmetrically() {
        let on = KindConfig::api_block("w", true);
        let off = KindConfig::api_block("w", false);
        assert_eq!(on.len(), 2);
        assert_eq!(
            on[0].join(" "),
            "docker exec w iptables -I OUTPUT -p tcp --dport 6443 -m comment --comment havip-e2e-api-outage -j DROP"
        );
        assert!(on[1].join(" ").contains("-I FORWARD"));
        for (a, b) in on.iter().zip(&off) {
            assert_eq!(a.join(" ").replace(" -I ", " -D "), b.join(" "));
        }
    }

    #[test]
    fn agent_restart_deletes_only_that_nodes_agent_pod() {
        let c = cfg();
        assert_eq!(
            c.delete_agent_pod("havip-e2e-worker2").join(" "),
            "/c/kubectl --kubeconfig /tmp/k/kubeconfig -n havip-system delete pod -l app.kubernetes.io/component=agent --field-selector spec.nodeName=havip-e2e-worker2 --wait=true"
        );
        assert!(c.scale_operator(0).join(" ").ends_with("scale deployment/havip-operator --replicas=0"));
    }

    #[test]
    fn client_is_a_container_on_the_kind_network() {
        let c = cfg();
        assert_eq!(
            c.client(SocketAddr::from((Ipv4Addr::new(172, 18, 255, 200), 8080))).join(" "),
            "docker run --rm --name havip-e2e-client --network kind havip/havip-e2e-tools:dev probe --target 172.18.255.200:8080 --interval-ms 20 --read-timeout-ms 250"
        );
        assert_eq!(c.client_rm().join(" "), "docker rm -f havip-e2e-client");
    }

    #[test]
    fn vip_sits_near_the_top_of_the_kind_subnet() {
        assert_eq!(vip_in_subnet("172.18.0.0/16"), Some((Ipv4Addr::new(172, 18, 255, 200), 16)));
        assert_eq!(vip_in_subnet("192.168.5.0/24"), Some((Ipv4Addr::new(192, 168, 5, 200), 24)));
        assert_eq!(vip_in_subnet("fc00:f853:ccd:e793::/64"), None);
        assert_eq!(vip_in_subnet("10.0.0.0/30"), None);
    }

    #[test]
    fn pair_and_responders_manifests_parse_and_name_the_workers() {
        let c = cfg();
        let y = c.pair_yaml("web", 2, Ipv4Addr::new(172, 18, 255, 200), 16);
        let docs: Vec<serde_yaml::Value> =
            serde_yaml::Deserializer::from_str(&y).map(|d| serde::Deserialize::deserialize(d).expect("yaml")).collect();
        assert_eq!(docs.len(), 2);
        let pair: havip_crds::HAPair = serde_yaml::from_value(docs[0].clone()).expect("HAPair");
        let nodes: Vec<&str> = pair.spec.members.iter().map(|m| m.node.as_str()).collect();
        assert_eq!(nodes, ["havip-e2e-worker", "havip-e2e-worker2"]);
        let fip: havip_crds::FloatingIP = serde_yaml::from_value(docs[1].clone()).expect("FloatingIP");
        assert_eq!(fip.spec.address, "172.18.255.200/16");
        let ds: serde_yaml::Value = serde_yaml::from_str(&c.responders_yaml()).expect("DaemonSet");
        assert_eq!(ds["spec"]["template"]["spec"]["hostNetwork"], serde_yaml::Value::Bool(true));
        assert!(c.responders_yaml().contains("havip/havip-e2e-tools:dev"));
    }
}
