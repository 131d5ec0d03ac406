//! The standalone file's `takeover` section reaches the state machine's timings.
#![allow(clippy::unwrap_used)] // tests: a panic is the failure report

use havip_node_agent::standalone::config::StandaloneFile;

fn agent_timings(takeover: &str) -> Result<havip_node_agent::sm::Timings, String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pair.yaml");
    let yaml = format!(
        "pair: web\nnode: a\nmembers:\n  - {{node: a, priority: 200, addresses: {{data: 10.0.0.1}}}}\n  \
         - {{node: b, priority: 100, addresses: {{data: 10.0.0.2}}}}\nheartbeat: {{key: \
         000102030405060708090a0b0c0d0e0f}}\n{takeover}vips:\n  - {{address: 10.0.0.50/24}}\n"
    );
    std::fs::write(&path, yaml).unwrap();
    let file = StandaloneFile::load(&path).map_err(|e| e.to_string())?;
    file.into_agent_config(None).map(|c| c.sm.timings).map_err(|e| e.to_string())
}

#[test]
fn carrier_stable_for_sets_the_link_dampening_time() {
    assert_eq!(agent_timings("").unwrap().carrier_stable_ms, 2_000, "the documented default");
    assert_eq!(agent_timings("takeover: {carrierStableFor: 5s}\n").unwrap().carrier_stable_ms, 5_000);
    assert_eq!(agent_timings("takeover: {carrierStableFor: 0s}\n").unwrap().carrier_stable_ms, 0);
    let e = agent_timings("takeover: {carrierStableFor: soon}\n").unwrap_err();
    assert!(e.contains("takeover.carrierStableFor"), "{e}");
}
