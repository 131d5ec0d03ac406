use havip_e2e::netns::{self, Topology};

#[test]
fn smoke() {
    if !netns::skip_unless_root("smoke") {
        return;
    }
    havip_e2e::init_tracing();
    let t = std::time::Instant::now();
    let topo = Topology::builder().nodes(3).build().expect("build");
    eprintln!("built in {:?}", t.elapsed());
    eprintln!("{:#?}", topo.node(0));
    eprintln!("{:?}", netns::addresses(&topo.node(0).ns, "eth0").unwrap());
    eprintln!("{}", netns::exec(&topo.node(0).ns, "ip", &["route"]).unwrap());
    let mac =
        netns::resolve_neighbour(&topo.node(0).ns, "eth0", topo.gateway().ip.into(), std::time::Duration::from_secs(3))
            .unwrap();
    eprintln!("gw mac {mac} vs {}", topo.gateway().mac);
    eprintln!("{:?}", netns::list_namespaces().unwrap());
}
