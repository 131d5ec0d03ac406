//! The committed CRD YAML must be exactly what the Rust types generate; the chart spells
//! the names the binaries use.

use std::path::Path;

#[test]
fn committed_crds_match_the_types() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(havip_crds::CRDS_PATH);
    let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let generated = havip_crds::crds_yaml().expect("CRDs serialize");
    if committed != generated {
        let first_diff = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(generated.lines().count()));
        panic!(
            "{} differs from the types at line {} (committed: {:?}, generated: {:?}); run `make crds`",
            path.display(),
            first_diff + 1,
            committed.lines().nth(first_diff),
            generated.lines().nth(first_diff),
        );
    }
}

/// The chart's admission policy lets agents write only Leases with the pair prefix: it
/// must spell the prefix the binaries use.
#[test]
fn the_chart_policy_spells_the_pair_lease_prefix() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/havip/templates/rbac-agent.yaml");
    let chart = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let rule = format!("object.metadata.name.startsWith('{}')", havip_crds::lease::PAIR_PREFIX);
    assert!(chart.contains(&rule), "{} has no {rule}", path.display());
}

/// The chart's admission policy lets the operator change only the member labels of pairs
/// and FloatingIPs: it must spell the prefix the binaries use.
#[test]
fn the_chart_policy_spells_the_member_label_prefix() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/havip/templates/rbac-operator.yaml");
    let chart = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let rule = format!("!k.startsWith('{}')", havip_crds::membership::PREFIX);
    assert_eq!(chart.matches(&rule).count(), 2, "{} must test {rule} for set and removed labels", path.display());
}

/// The agents' admission policies check membership by the annotation the operator writes
/// (and, on objects not annotated yet, by the member label): they must spell both as the
/// binaries do.
#[test]
fn the_chart_policies_spell_the_member_annotation_and_label_prefix() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/havip/templates/rbac-agent.yaml");
    let chart = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let annotation = format!("variables.oldAnnotations['{}'].split(',')", havip_crds::membership::NODES_ANNOTATION);
    assert_eq!(chart.matches(&annotation).count(), 2, "{} must read {annotation} (Lease, FloatingIP)", path.display());
    let label = format!("('{}' + variables.node) in variables.oldLabels", havip_crds::membership::PREFIX);
    assert_eq!(chart.matches(&label).count(), 2, "{} must test {label} (Lease, FloatingIP)", path.display());
}
