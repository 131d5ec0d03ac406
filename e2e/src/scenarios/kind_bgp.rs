//! The routed scenario of the kind suite: the chart's **in-pod FRR** (`agent.bgp.frr.inPod`,
//! the `havip-frr` image) on every node, peering over eBGP with a router — FRR from the same
//! image in containers of its own on the kind network — and a pair in `BGP` mode whose VIP is
//! in no subnet of the cluster: only the route the holder's in-pod FRR advertises reaches it.
//! The client probes from the router's network namespace.

use crate::harness::bgp::{NODE_ASN, ROUTER_ASN};
use crate::harness::cluster::Cluster;
use crate::harness::kind::{KindCluster, NETWORK, SERVICE_PORT, run};
use crate::scenarios::PAIR;
use havip_crds::HAPair;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// The VIP: TEST-NET-2, outside the kind network.
const VIP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);

/// The router: two containers (zebra, bgpd) sharing one network namespace on the kind
/// network, their sockets and configuration in a directory of this machine's.
struct Router {
    name: String,
    dir: PathBuf,
    ip: Ipv4Addr,
}

fn docker(args: &[&str]) -> crate::harness::cluster::Result<String> {
    let mut argv = vec!["docker".to_owned()];
    argv.extend(args.iter().map(|a| (*a).to_owned()));
    run(&argv)
}

impl Router {
    /// Starts it: `bgp listen range` over the kind network's IPv4 subnet, so every node's
    /// in-pod FRR may peer with it whatever its address.
    fn start(c: &KindCluster) -> Router {
        let name = format!("{}-router", c.cfg.cluster);
        let dir = std::env::temp_dir().join(&name);
        Self::remove(&name, &dir);
        std::fs::create_dir_all(dir.join("run")).expect("router dir");
        let subnet = docker(&["network", "inspect", NETWORK, "-f", "{{range .IPAM.Config}}{{.Subnet}} {{end}}"])
            .expect("kind subnets")
            .split_whitespace()
            .find(|s| !s.contains(':'))
            .map(str::to_owned)
            .expect("an IPv4 subnet on the kind network");
        let conf = format!(
            "frr defaults datacenter\nhostname router\n!\nrouter bgp {ROUTER_ASN}\n no bgp ebgp-requires-policy\n \
             bgp graceful-restart\n neighbor MEMBERS peer-group\n neighbor MEMBERS remote-as {NODE_ASN}\n \
             bgp listen range {subnet} peer-group MEMBERS\n!\n"
        );
        std::fs::write(dir.join("frr.conf"), conf).expect("router frr.conf");
        std::fs::write(dir.join("vtysh.conf"), "").expect("router vtysh.conf");
        let image = c.cfg.image("havip-frr");
        let etc = format!("{}:/etc/frr:ro", dir.display());
        let varrun = format!("{}:/var/run/frr", dir.join("run").display());
        for (daemon, network) in [("zebra", NETWORK.to_owned()), ("bgpd", format!("container:{name}"))] {
            let cname = if daemon == "zebra" { name.clone() } else { format!("{name}-{daemon}") };
            let entry = format!("/usr/lib/frr/{daemon}");
            let mut args = vec![
                "run",
                "-d",
                "--name",
                &cname,
                "--network",
                &network,
                "--cap-drop",
                "ALL",
                "--cap-add",
                "NET_ADMIN",
                "--cap-add",
                "NET_RAW",
                "--cap-add",
                "SYS_ADMIN",
                "--cap-add",
                "NET_BIND_SERVICE",
                "-v",
                &etc,
                "-v",
                &varrun,
                "--entrypoint",
                &entry,
                &image,
                "-u",
                "root",
                "-g",
                "root",
                "-f",
                "/etc/frr/frr.conf",
                "--vty_socket",
                "/var/run/frr",
                "-z",
                "/var/run/frr/zserv.api",
                "--log",
                "stdout",
            ];
            let pid = format!("/var/run/frr/{daemon}.pid");
            args.extend(["-i", &pid]);
            docker(&args).unwrap_or_else(|e| panic!("router {daemon}: {e}"));
            if daemon == "zebra" {
                wait_for("the router's zebra socket", Duration::from_secs(20), || dir.join("run/zserv.api").exists());
            }
        }
        let ip = docker(&["inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", &name])
            .expect("router address")
            .trim()
            .parse()
            .expect("the router's IPv4 address");
        Router { name, dir, ip }
    }

    /// The router's best next hops of `VIP/32` in its RIB (this machine's vtysh on the
    /// router's socket directory).
    fn next_hops(&self) -> Vec<String> {
        let out = std::process::Command::new("vtysh")
            .arg("--vty_socket")
            .arg(self.dir.join("run"))
            .args(["-c", &format!("show ip route {VIP}/32 json")])
            .output();
        let Ok(out) = out else { return Vec::new() };
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        crate::host::routing::selected_next_hops(&v, &format!("{VIP}/32"))
    }

    fn remove(name: &str, dir: &std::path::Path) {
        let _ = docker(&["rm", "-f", name, &format!("{name}-bgpd")]);
        let _ = std::fs::remove_dir_all(dir);
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        Self::remove(&self.name, &self.dir);
    }
}

fn wait_for(what: &str, timeout: Duration, cond: impl FnMut() -> bool) -> Duration {
    crate::host::routing::wait_for(what, timeout, cond).unwrap_or_else(|e| panic!("{e}"))
}

/// Every node's in-pod FRR: the `havip0` connected routes to the router, as docs/bgp.md
/// has it (router ID: each node's own, left out).
fn node_frr_values(router: Ipv4Addr) -> String {
    format!(
        "agent:\n  bgp:\n    frr:\n      inPod: true\n      config: |\n        frr defaults datacenter\n        \
         route-map HAVIP-VIPS permit 10\n         match interface havip0\n        !\n        \
         router bgp {NODE_ASN}\n         no bgp ebgp-requires-policy\n         bgp graceful-restart\n         \
         neighbor {router} remote-as {ROUTER_ASN}\n         address-family ipv4 unicast\n          \
         redistribute connected route-map HAVIP-VIPS\n         exit-address-family\n        !\n"
    )
}

/// The node's address on the kind network.
fn node_ip(node: &str) -> String {
    docker(&["inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", node])
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

fn advertises_to(p: &HAPair, node: &str, router: Ipv4Addr) -> bool {
    p.status.as_ref().is_some_and(|s| {
        s.members.iter().any(|m| {
            m.node == node
                && m.bgp.as_ref().is_some_and(|b| {
                    b.speaker.as_deref() == Some("FRR")
                        && b.advertised
                            .iter()
                            .any(|a| a.address == format!("{VIP}/32") && a.peers.contains(&router.to_string()))
                })
        })
    })
}

/// The chart with `agent.bgp.frr.inPod`, a router on the kind network, and a pair in BGP
/// mode: the holder's in-pod FRR advertises the VIP (its agent reports it, read from the
/// pod's FRR), the router routes it to the holder and the client behind it is answered;
/// a cut of the holder moves the route to the standby (the newer epoch's MED wins while
/// the dead holder's path waits for the hold timer) and the client is answered by it.
pub fn in_pod_frr(c: &mut KindCluster) {
    let router = Router::start(c);
    c.helm_upgrade_values(&node_frr_values(router.ip)).expect("helm upgrade with the in-pod FRR");
    c.kubectl_run(&[
        "-n",
        crate::harness::kind::NAMESPACE,
        "rollout",
        "status",
        "daemonset/havip-agent",
        "--timeout=300s",
    ])
    .expect("agents rolled with FRR in their pods");
    // The router is the members' way to the VIP (their default route is the kind bridge).
    let workers = c.cfg.worker_nodes();
    for n in &workers {
        docker(&["exec", n, "ip", "route", "replace", &format!("{VIP}/32"), "via", &router.ip.to_string()])
            .expect("route to the VIP via the router");
    }
    let yaml = c
        .pair_yaml(PAIR, 2)
        .replace(
            &format!("  address: {}/{}\n  interface: eth0\n", c.vip().0, c.vip().1),
            &format!("  address: {VIP}/32\n"),
        )
        .replace("  probe:\n", "  announce:\n    mode: BGP\n  probe:\n");
    assert!(yaml.contains("mode: BGP") && yaml.contains(&format!("{VIP}/32")), "the pair's YAML: {yaml}");
    let n0 = workers[0].clone();
    let n1 = workers[1].clone();
    c.apply_yaml(&yaml).expect("apply the routed pair");
    c.wait_pair(PAIR, Duration::from_secs(60), &format!("{n0} advertising {VIP} to the router"), |p| {
        advertises_to(p, &n0, router.ip)
    })
    .expect("the holder's in-pod FRR advertises the VIP");
    let (ip0, ip1) = (node_ip(&n0), node_ip(&n1));
    let took =
        wait_for("the router to route the VIP to n0", Duration::from_secs(30), || router.next_hops() == [ip0.clone()]);
    tracing::info!(?took, "routed to n0");
    let client =
        c.client_on(&format!("container:{}", router.name), SocketAddr::from((VIP, SERVICE_PORT))).expect("client");
    client.wait_for_responder(&n0, Duration::from_secs(10)).expect("the client behind the router reaches n0");

    c.cut_node(0).expect("cut n0");
    let moved =
        wait_for("the router to route the VIP to n1", Duration::from_secs(15), || router.next_hops() == [ip1.clone()]);
    client.wait_for_responder(&n1, Duration::from_secs(15)).expect("the client reaches n1");
    tracing::info!(?moved, "route moved to n1 after the cut");
    c.restore_node(0).expect("restore n0");
    let report = client.stop().expect("report");
    tracing::info!(summary = %report.summary(), "routed client");
    // The next reset deletes the pair and puts the chart back without the in-pod FRR.
    for n in &workers {
        let _ = docker(&["exec", n, "ip", "route", "del", &format!("{VIP}/32")]);
    }
}
