//! Every example manifest parses into the typed resources, and every duration in it parses.

use havip_crds::duration::parse_duration;
use havip_crds::{FloatingIP, HAPair};
use serde::Deserialize;
use std::path::Path;

fn examples() -> Vec<(String, serde_yaml::Value)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut docs = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(&dir).expect("examples dir").flatten().collect();
    entries.sort_by_key(|e| e.path());
    for entry in entries {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("readable");
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_yaml::Value::deserialize(doc).expect("valid YAML");
            docs.push((path.display().to_string(), value));
        }
    }
    docs
}

#[test]
fn examples_parse_into_typed_resources() {
    let docs = examples();
    let mut pairs = 0;
    let mut routed = 0;
    let mut fips = 0;
    let (mut pools, mut services) = (0, 0);
    // Every example applies beside the others (the API-server test applies them all):
    // no two objects of one kind share a name.
    let mut names = std::collections::BTreeMap::new();
    for (file, doc) in &docs {
        let key = (
            doc["kind"].as_str().unwrap_or_default().to_owned(),
            doc["metadata"]["name"].as_str().unwrap_or_default().to_owned(),
        );
        if let Some(other) = names.insert(key.clone(), file.clone()) {
            panic!("{} {} is in both {other} and {file}", key.0, key.1);
        }
    }
    for (file, doc) in docs {
        match doc["kind"].as_str() {
            Some("HAPair") => {
                let p: HAPair = serde_yaml::from_value(doc).unwrap_or_else(|e| panic!("{file}: {e}"));
                assert!(p.spec.members.len() >= 2, "{file}: pair needs 2 members");
                for d in [
                    &p.spec.heartbeat.interval,
                    &p.spec.heartbeat.timeout,
                    &p.spec.takeover.probe_span,
                    &p.spec.takeover.hold_down,
                    &p.spec.takeover.boot_hold,
                    &p.spec.failback.recovery_window,
                    &p.spec.failback.quarantine.hold,
                    &p.spec.flap_suspension.within,
                ] {
                    parse_duration(d).unwrap_or_else(|e| panic!("{file}: {e}"));
                }
                if p.spec.announce_mode == havip_crds::AnnounceMode::BGP {
                    routed += 1;
                }
                pairs += 1;
            }
            Some("FloatingIP") => {
                let f: FloatingIP = serde_yaml::from_value(doc).unwrap_or_else(|e| panic!("{file}: {e}"));
                assert!(f.spec.address.contains('/'), "{file}: address needs a prefix");
                fips += 1;
            }
            Some("VIPPool") => {
                let p: havip_crds::VIPPool = serde_yaml::from_value(doc).unwrap_or_else(|e| panic!("{file}: {e}"));
                let blocks = havip_crds::vippool::pool_blocks(&p.spec).unwrap_or_else(|e| panic!("{file}: {e}"));
                assert!(!blocks.is_empty(), "{file}: a pool needs addresses");
                pools += 1;
            }
            Some("Service") => {
                let class = doc["spec"]["loadBalancerClass"].as_str();
                assert_eq!(
                    class,
                    Some(havip_crds::vippool::service::LOAD_BALANCER_CLASS),
                    "{file}: the Service's class"
                );
                services += 1;
            }
            other => panic!("{file}: unexpected kind {other:?}"),
        }
    }
    // Two IPv4 VIPs, one IPv6 pair, one failback pair, one routed (BGP) pair.
    assert_eq!(pairs, 4, "expected four example pairs");
    assert_eq!(routed, 1, "examples/hapair-bgp.yaml: announceMode BGP");
    assert_eq!((pools, services), (1, 1), "the LoadBalancer example: a pool and a Service");
    assert!(fips >= 4, "expected at least four FloatingIPs");
}
