//! The standalone file's `routes` and `rules` reach the agent's configuration, checked.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use havip_node_agent::config::AgentConfig;
use havip_node_agent::standalone::config::StandaloneFile;

fn agent_config(extra: &str) -> Result<AgentConfig, String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pair.yaml");
    let yaml = format!(
        "pair: web\nnode: a\nmembers:\n  - {{node: a, priority: 200, addresses: {{data: 10.0.0.1}}}}\n  \
         - {{node: b, priority: 100, addresses: {{data: 10.0.0.2}}}}\nheartbeat: {{key: \
         000102030405060708090a0b0c0d0e0f}}\nvips:\n  - {{address: 10.0.0.50/24}}\n{extra}"
    );
    std::fs::write(&path, yaml).unwrap();
    let file = StandaloneFile::load(&path).map_err(|e| e.to_string())?;
    file.into_agent_config(None).map_err(|e| e.to_string())
}

#[test]
fn routes_and_rules_are_read_and_checked() {
    let none = agent_config("").unwrap();
    assert!(none.routes.is_empty() && none.rules.is_empty(), "none unless given");
    let c = agent_config(
        "routes:\n  - {destination: 0.0.0.0/0, gateway: 10.0.0.254, table: 100, source: 10.0.0.50}\n  \
         - {destination: 198.51.100.0/24, interface: eth1, metric: 50}\n\
         rules:\n  - {from: 10.0.0.50/32, table: 100, priority: 1000}\n",
    )
    .unwrap();
    let routes: Vec<String> = c.routes.iter().map(ToString::to_string).collect();
    assert_eq!(
        routes,
        ["0.0.0.0/0 via 10.0.0.254 src 10.0.0.50 table 100 metric 0", "198.51.100.0/24 dev eth1 table 254 metric 50"]
    );
    assert_eq!(
        c.rules.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["priority 1000 from 10.0.0.50/32 lookup 100"]
    );
    let e = agent_config("routes:\n  - {destination: 10.0.0.50/24, gateway: 10.0.0.254}\n").unwrap_err();
    assert!(e.contains("is not a prefix"), "{e}");
    let e = agent_config("rules:\n  - {table: 100, priority: 1000}\n").unwrap_err();
    assert!(e.contains("needs from, to or both"), "{e}");
}
