//! The kind suite's command lines and manifests, as pure functions of a [`KindConfig`]:
//! unit-tested here, since kind cannot create a cluster where no image can be pulled.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

/// The port the responders answer on (and the pair's probe port).
pub const SERVICE_PORT: u16 = 8080;
/// The ports the responders answer on: [`SERVICE_PORT`] and one more for each further
/// pair of the shared-node scenarios (the scenarios use 8080, 8081 and 8082).
pub const RESPONDER_PORTS: [u16; 3] = [SERVICE_PORT, 8081, 8082];
/// The agents' metrics port on the node (the chart's `agent.metricsPort`).
pub const AGENT_METRICS_PORT: u16 = 9797;
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
    /// The previous release (`hack/previous-release.sh`: a directory with its `chart/`
    /// and `crds/`; its images are tagged [`PREVIOUS_TAG`]) for the upgrade scenario.
    pub previous: Option<PathBuf>,
}

/// The tag of the previous release's images (`hack/previous-release.sh`).
pub const PREVIOUS_TAG: &str = "prev";

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

    /// The images the suite loads into the cluster (`havip-frr`: the chart's in-pod FRR),
    /// and the previous release's operator and agent when there is one.
    pub fn images(&self) -> Vec<String> {
        let mut v: Vec<String> =
            ["havip-operator", "havip-agent", "havip-e2e-tools", "havip-frr"].iter().map(|n| self.image(n)).collect();
        if self.previous.is_some() {
            v.extend(
                ["havip-operator", "havip-agent"].iter().map(|n| format!("{}/{n}:{PREVIOUS_TAG}", self.image_prefix)),
            );
        }
        v
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
        self.install_chart_from(&self.repo.join("charts/havip"), &self.tag, true)
    }

    /// `helm upgrade --install` of the chart in `chart` (this one's, or the previous
    /// release's) with the suite's values and images tagged `tag`; `wait`: until every
    /// workload is ready (`--wait`, 180 s).
    pub fn install_chart_from(&self, chart: &std::path::Path, tag: &str, wait: bool) -> Vec<String> {
        let mut v = vec![
            self.helm.display().to_string(),
            s("upgrade"),
            s("--install"),
            s("havip"),
            chart.display().to_string(),
            s("--namespace"),
            s(NAMESPACE),
            s("--create-namespace"),
            s("--kubeconfig"),
            self.kubeconfig.display().to_string(),
            s("--set"),
            format!("image.repository={}", self.image_prefix),
            s("--set"),
            format!("image.tag={tag}"),
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
        ];
        if wait {
            v.extend([s("--wait"), s("--timeout"), s("180s")]);
        }
        v
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

    /// The responders: a hostNetwork DaemonSet answering its node's name on each of
    /// [`RESPONDER_PORTS`] (what the VIPs serve, and what the agents probe).
    pub fn responders_yaml(&self) -> String {
        let image = self.image("havip-e2e-tools");
        let mut containers = String::new();
        for port in RESPONDER_PORTS {
            containers.push_str(&format!(
                r#"        - name: responder-{port}
          image: {image}
          imagePullPolicy: Never
          args: ["respond", "--port", "{port}", "--name", "$(NODE_NAME)"]
          env:
            - name: NODE_NAME
              valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}
"#
            ));
        }
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
{containers}"#
        )
    }

    /// The standard pair over the first `members` workers: one heartbeat path (kind
    /// nodes have one address), one VIP in the kind network.
    pub fn pair_yaml(&self, name: &str, members: usize, vip: Ipv4Addr, prefix: u8) -> String {
        let members: Vec<usize> = (0..members.min(self.workers)).collect();
        self.pair_yaml_on(name, &members, vip, prefix, SERVICE_PORT)
    }

    /// A pair over the workers `members` (first = preferred, priorities descending), one
    /// heartbeat path, one VIP probed on `port`.
    pub fn pair_yaml_on(&self, name: &str, members: &[usize], vip: Ipv4Addr, prefix: u8, port: u16) -> String {
        let workers = self.worker_nodes();
        let mut y =
            format!("apiVersion: havip.io/v1alpha1\nkind: HAPair\nmetadata:\n  name: {name}\nspec:\n  members:\n");
        for (rank, n) in members.iter().filter_map(|i| workers.get(*i)).enumerate() {
            y.push_str(&format!("    - node: {n}\n      priority: {}\n", 200 - 10 * rank));
        }
        y.push_str("  heartbeat:\n    paths:\n      - name: kind\n        addressType: InternalIP\n");
        y.push_str(&format!(
            "---\napiVersion: havip.io/v1alpha1\nkind: FloatingIP\nmetadata:\n  name: {name}-vip\nspec:\n  pair: {name}\n  address: {vip}/{prefix}\n  interface: eth0\n  probe:\n    ports: [{port}]\n"
        ));
        y
    }

    /// Inserts (`insert`) or deletes the rule that makes node `node`'s service on `port`
    /// refuse connections (a reset, as a stopped server's port does) — for the agent's
    /// probes on the node and for clients alike.
    pub fn service_block(node: &str, port: u16, insert: bool) -> Vec<String> {
        let mut v = vec![s("docker"), s("exec"), node.to_owned(), s("iptables"), s(if insert { "-I" } else { "-D" })];
        v.extend(
            ["INPUT", "-p", "tcp", "--dport", &port.to_string(), "-m", "comment", "--comment"]
                .iter()
                .map(|a| (*a).to_owned()),
        );
        v.extend(["havip-e2e-service-down", "-j", "REJECT", "--reject-with", "tcp-reset"].map(s));
        v
    }

    /// The Prometheus metrics of node `node`'s agent, through the API server's node proxy.
    pub fn agent_metrics(&self, node: &str) -> Vec<String> {
        self.kubectl(&["get", "--raw", &format!("/api/v1/nodes/{node}:{AGENT_METRICS_PORT}/proxy/metrics")])
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
        self.client_on(NETWORK, target)
    }

    /// [`KindConfig::client`] on another docker network (`container:<name>`: in another
    /// container's network namespace).
    pub fn client_on(&self, network: &str, target: SocketAddr) -> Vec<String> {
        vec![
            s("docker"),
            s("run"),
            s("--rm"),
            s("--name"),
            format!("{}-client", self.cluster),
            s("--network"),
            network.to_owned(),
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

/// VIP number `k` of the shared-node scenarios: `k` below the suite's VIP (0: the VIP
/// itself).
pub fn vip_at(vip: Ipv4Addr, k: u8) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(vip).saturating_sub(u32::from(k)))
}

/// The name of the link with `index` in `ip -o link show` output (`42: veth1a2b@if41: …`).
pub(super) fn host_link_name(links: &str, index: &str) -> Option<String> {
    links.lines().find_map(|l| {
        let (i, rest) = l.split_once(": ")?;
        let name = rest.split(':').next()?.split('@').next()?;
        (i.trim() == index).then(|| name.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::{KindConfig, host_link_name, vip_at, vip_in_subnet};
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
            previous: None,
        }
    }

    #[test]
    fn workers_are_named_as_kind_names_them() {
        assert_eq!(cfg().worker_nodes(), ["havip-e2e-worker", "havip-e2e-worker2", "havip-e2e-worker3"]);
    }

    #[test]
    fn the_previous_release_is_loaded_and_installed_from_its_own_chart() {
        let c = KindConfig { previous: Some(PathBuf::from("/cache/previous/abc")), ..cfg() };
        assert_eq!(
            c.load_images().join(" "),
            "/c/kind load docker-image havip/havip-operator:dev havip/havip-agent:dev havip/havip-e2e-tools:dev havip/havip-frr:dev havip/havip-operator:prev havip/havip-agent:prev --name havip-e2e"
        );
        let old = c.install_chart_from(&PathBuf::from("/cache/previous/abc/chart"), "prev", false).join(" ");
        assert!(
            old.starts_with("/c/helm upgrade --install havip /cache/previous/abc/chart --namespace havip-system"),
            "{old}"
        );
        assert!(old.contains("--set image.tag=prev"), "{old}");
        assert!(!old.contains("--wait"), "{old}");
        let new = c.install_chart().join(" ");
        assert!(new.contains("/src/havip/charts/havip") && new.contains("image.tag=dev"), "{new}");
        assert!(new.ends_with("--wait --timeout 180s"), "{new}");
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
            "/c/kind load docker-image havip/havip-operator:dev havip/havip-agent:dev havip/havip-e2e-tools:dev havip/havip-frr:dev --name havip-e2e"
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
        let ports: Vec<String> = ds["spec"]["template"]["spec"]["containers"]
            .as_sequence()
            .expect("containers")
            .iter()
            .map(|c| c["args"][2].as_str().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(ports, ["8080", "8081", "8082"], "one responder per port of the shared-node scenarios");
    }

    #[test]
    fn shared_node_pairs_get_their_own_members_vip_and_port() {
        let c = cfg();
        let vip = vip_at(Ipv4Addr::new(172, 18, 255, 200), 2);
        let y = c.pair_yaml_on("db", &[0, 2], vip, 16, 8082);
        let docs: Vec<serde_yaml::Value> =
            serde_yaml::Deserializer::from_str(&y).map(|d| serde::Deserialize::deserialize(d).expect("yaml")).collect();
        let pair: havip_crds::HAPair = serde_yaml::from_value(docs[0].clone()).expect("HAPair");
        let members: Vec<(&str, i32)> = pair.spec.members.iter().map(|m| (m.node.as_str(), m.priority)).collect();
        assert_eq!(members, [("havip-e2e-worker", 200), ("havip-e2e-worker3", 190)]);
        let fip: havip_crds::FloatingIP = serde_yaml::from_value(docs[1].clone()).expect("FloatingIP");
        assert_eq!(fip.spec.address, "172.18.255.198/16");
        assert_eq!(fip.spec.probe.ports, [8082]);
    }

    #[test]
    fn a_stopped_service_is_a_reset_on_its_port_undone_by_the_same_rule() {
        let on = KindConfig::service_block("w", 8081, true).join(" ");
        assert_eq!(
            on,
            "docker exec w iptables -I INPUT -p tcp --dport 8081 -m comment --comment havip-e2e-service-down -j REJECT --reject-with tcp-reset"
        );
        assert_eq!(KindConfig::service_block("w", 8081, false).join(" "), on.replace(" -I ", " -D "));
    }

    #[test]
    fn agent_metrics_come_through_the_node_proxy_on_the_charts_port() {
        let argv = cfg().agent_metrics("havip-e2e-worker").join(" ");
        assert!(argv.ends_with("get --raw /api/v1/nodes/havip-e2e-worker:9797/proxy/metrics"), "{argv}");
        let values = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/havip/values.yaml"))
            .expect("the chart's values");
        let values: serde_yaml::Value = serde_yaml::from_str(&values).expect("values.yaml");
        assert_eq!(values["agent"]["metricsPort"].as_u64(), Some(u64::from(super::AGENT_METRICS_PORT)));
    }
}
