//! `kubectl havip doctor`: what the agents found on their nodes (`members[].findings`,
//! see the agent's node checks) and what only the cluster shows — a VIP that a Node
//! reports as its own address. Pure: the command fetches, this module judges and renders.

use havip_crds::{DoctorCheck, Finding, FloatingIP, HAPair};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use std::net::IpAddr;

/// One finding, and whose.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Line {
    /// The pair whose member reported it (none for what the cluster shows).
    pub pair: Option<String>,
    /// The node.
    pub node: String,
    /// What was found.
    pub finding: Finding,
}

/// Every finding of `pairs`' members, and every Node address that is one of their VIPs
/// (all FloatingIPs when `pairs` is every pair), sorted.
pub fn diagnose(pairs: &[HAPair], nodes: &[Node], fips: &[FloatingIP]) -> Vec<Line> {
    let mut out = Vec::new();
    for p in pairs {
        for m in p.status.as_ref().map(|s| s.members.as_slice()).unwrap_or_default() {
            out.extend(m.findings.iter().map(|f| Line {
                pair: Some(p.name_any()),
                node: m.node.clone(),
                finding: f.clone(),
            }));
        }
    }
    let names: Vec<String> = pairs.iter().map(ResourceExt::name_any).collect();
    let vips: Vec<(IpAddr, &FloatingIP)> = fips
        .iter()
        .filter(|f| names.contains(&f.spec.pair))
        .filter_map(|f| f.spec.address.split('/').next().and_then(|a| a.parse().ok()).map(|a| (a, f)))
        .collect();
    for n in nodes {
        for a in n.status.as_ref().and_then(|s| s.addresses.as_ref()).into_iter().flatten() {
            let Ok(ip) = a.address.parse::<IpAddr>() else { continue };
            for (_, f) in vips.iter().filter(|(v, _)| *v == ip) {
                out.push(Line {
                    pair: Some(f.spec.pair.clone()),
                    node: n.name_any(),
                    finding: Finding {
                        check: DoctorCheck::VipIsNodeAddress,
                        subject: format!("node {}", n.name_any()),
                        detail: format!(
                            "Node {} reports {ip}, the VIP of FloatingIP {}, as its {}",
                            n.name_any(),
                            f.name_any(),
                            a.type_
                        ),
                    },
                });
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The findings as people read them, each with its fix; "no findings" when there is none.
pub fn render(lines: &[Line]) -> String {
    if lines.is_empty() {
        return "no findings\n".to_owned();
    }
    let mut out = String::new();
    for l in lines {
        let whose = match &l.pair {
            Some(p) => format!("{p}/{}", l.node),
            None => l.node.clone(),
        };
        out.push_str(&format!(
            "{whose}: {} {}: {}\n  fix: {}\n",
            l.finding.check,
            l.finding.subject,
            l.finding.detail,
            l.finding.check.fix()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::*;

    fn pair(name: &str, findings: serde_json::Value) -> HAPair {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "havip.io/v1alpha1", "kind": "HAPair", "metadata": {"name": name},
            "spec": {"members": [{"node": "a", "priority": 200}, {"node": "b", "priority": 100}]},
            "status": {"members": [{"node": "a", "findings": findings}, {"node": "b"}]},
        }))
        .expect("pair")
    }

    fn node(name: &str, ip: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
        }))
        .expect("node")
    }

    fn fip(name: &str, pair: &str, address: &str) -> FloatingIP {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "havip.io/v1alpha1", "kind": "FloatingIP", "metadata": {"name": name},
            "spec": {"pair": pair, "address": address},
        }))
        .expect("fip")
    }

    #[test]
    fn members_findings_and_a_vip_that_is_a_nodes_address_are_reported_with_their_fix() {
        let healthy = [pair("web", serde_json::json!([]))];
        let nodes = [node("a", "10.0.0.1"), node("b", "10.0.0.2")];
        let fips = [fip("web-vip", "web", "10.0.0.50/24"), fip("db-vip", "db", "10.0.0.2/24")];
        assert_eq!(diagnose(&healthy, &nodes, &fips), vec![], "db's VIP is b's address, but db is not asked about");
        assert_eq!(render(&[]), "no findings\n");

        let sick = [pair(
            "web",
            serde_json::json!([{"check": "ArpIgnoreHidesVip", "subject": "eth0 (10.0.0.50)", "detail": "arp_ignore=8"}]),
        )];
        let nodes = [node("a", "10.0.0.1"), node("b", "10.0.0.50")];
        let lines = diagnose(&sick, &nodes, &fips);
        let checks: Vec<(&str, &DoctorCheck)> = lines.iter().map(|l| (l.node.as_str(), &l.finding.check)).collect();
        assert_eq!(checks, vec![("a", &DoctorCheck::ArpIgnoreHidesVip), ("b", &DoctorCheck::VipIsNodeAddress)]);
        let text = render(&lines);
        assert!(text.contains("web/b: VipIsNodeAddress node b: Node b reports 10.0.0.50, the VIP of FloatingIP web-vip, as its InternalIP"), "{text}");
        assert!(text.contains(&format!("  fix: {}", DoctorCheck::ArpIgnoreHidesVip.fix())), "{text}");
        // A check a newer agent wrote is shown as written.
        let newer = [pair("web", serde_json::json!([{"check": "SomethingNew", "subject": "x", "detail": "y"}]))];
        assert!(render(&diagnose(&newer, &[], &[])).contains("SomethingNew x: y"));
    }
}
