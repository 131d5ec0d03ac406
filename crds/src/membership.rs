//! Member labels: how an agent finds the objects that concern its own node without
//! watching the whole cluster.
//!
//! The operator puts one label per member node on every HAPair, on the FloatingIPs it
//! accepted for the pair, on the pair's Lease and on its key Secret; an agent watches
//! each kind with the label selector of its own node ([`selector`]). The key is
//! `member.havip.io/<node>` when the node name is a valid label name (at most 63
//! characters, which most node names are), else a stable hashed form of it
//! ([`label_name`]). Both binaries compute it with this one function.
//!
//! Two node names could share a hashed form (a 64-bit hash): the agent of one of them
//! would then also watch the other's objects. That costs watch traffic, never
//! correctness: an agent runs only the pairs whose `spec.members` name its node.
//!
//! Next to the labels, the pair's FloatingIPs and its Lease carry the annotation
//! [`NODES_ANNOTATION`]: the member nodes' full names ([`nodes_value`]). The chart's
//! admission policies read it (a policy cannot compute the hashed form) to hold each
//! agent to the pairs its node is a member of.

use crate::revision::fnv1a;

/// The prefix of every member label key.
pub const PREFIX: &str = "member.havip.io/";

/// The value of every member label (the selector tests only that the key exists).
pub const VALUE: &str = "true";

/// The longest label name (the part after the prefix) Kubernetes accepts.
const MAX_NAME: usize = 63;

/// Characters of the node name kept in front of the hash in the hashed form.
const HASHED_KEEP: usize = MAX_NAME - 2 - 16;

/// Whether `s` is a valid label name: 1 to 63 characters of `[A-Za-z0-9_.-]`, starting
/// and ending with a letter or a digit.
fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_NAME
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// The label name standing for `node`: the node name itself when it is a valid label
/// name, else up to 45 characters of it, `-h` and 16 hex digits of its FNV-1a hash (a
/// stable form within the 63-character limit; node names may have 253).
pub fn label_name(node: &str) -> String {
    if is_label_name(node) {
        return node.to_owned();
    }
    let kept: String =
        node.chars().filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')).take(HASHED_KEEP).collect();
    let kept = kept.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    let hash = format!("{:016x}", fnv1a(node.as_bytes()));
    if kept.is_empty() { format!("h{hash}") } else { format!("{kept}-h{hash}") }
}

/// The member label key of `node`: `member.havip.io/<label name>`.
pub fn label_key(node: &str) -> String {
    format!("{PREFIX}{}", label_name(node))
}

/// The annotation listing the pair's member nodes by their full names, on the objects the
/// agents write (the pair's FloatingIPs and its Lease), written by the operator with the
/// member labels.
pub const NODES_ANNOTATION: &str = "havip.io/member-nodes";

/// The value of [`NODES_ANNOTATION`] for a set of member nodes: their names sorted,
/// without duplicates, joined by commas (node names, DNS subdomains, hold no comma).
pub fn nodes_value<'a>(nodes: impl IntoIterator<Item = &'a str>) -> String {
    let nodes: std::collections::BTreeSet<&str> = nodes.into_iter().collect();
    nodes.into_iter().collect::<Vec<_>>().join(",")
}

/// Whether a label key is a member label (any node's).
pub fn is_member_label(key: &str) -> bool {
    key.starts_with(PREFIX)
}

/// The label selector of the objects that concern `node` (the key exists).
pub fn selector(node: &str) -> String {
    label_key(node)
}

/// The member label keys of a set of member nodes, sorted and without duplicates.
pub fn label_keys<'a>(nodes: impl IntoIterator<Item = &'a str>) -> std::collections::BTreeSet<String> {
    nodes.into_iter().map(label_key).collect()
}

#[cfg(test)]
mod tests {
    use super::{is_label_name, is_member_label, label_key, label_keys, label_name, nodes_value, selector};

    #[test]
    fn a_node_name_that_is_a_label_name_is_used_as_is() {
        assert_eq!(label_key("n0"), "member.havip.io/n0");
        assert_eq!(
            label_key("ip-10-0-1-7.eu-west-1.compute.internal"),
            "member.havip.io/ip-10-0-1-7.eu-west-1.compute.internal"
        );
        let sixty_three = "a".repeat(63);
        assert_eq!(label_name(&sixty_three), sixty_three);
        assert!(is_member_label(&label_key("n0")));
        assert!(!is_member_label("havip.io/pair"));
        assert_eq!(selector("n0"), "member.havip.io/n0");
    }

    #[test]
    fn a_long_node_name_gets_a_stable_hashed_label_name_within_63_characters() {
        let long = format!("{}.example.com", "node-".repeat(50));
        assert!(long.len() > 200);
        let name = label_name(&long);
        assert!(name.len() <= 63, "{name} has {} characters", name.len());
        assert!(is_label_name(&name), "{name}");
        assert_eq!(name, label_name(&long), "stable");
        assert!(name.starts_with("node-node-"), "keeps a readable prefix: {name}");
        // Names that differ only past the kept prefix still get different labels.
        let other = format!("{}.example.org", "node-".repeat(50));
        assert_ne!(label_name(&other), name);
        // 64 characters is one too many.
        let sixty_four = "b".repeat(64);
        let hashed = label_name(&sixty_four);
        assert_ne!(hashed, sixty_four);
        assert!(hashed.len() <= 63 && is_label_name(&hashed), "{hashed}");
        // A name whose kept prefix would end with a dot or dash is trimmed.
        let dotted = format!("{}.{}", "c".repeat(44), "d".repeat(40));
        let n = label_name(&dotted);
        assert!(is_label_name(&n), "{n}");
    }

    #[test]
    fn names_that_are_not_label_names_are_hashed() {
        for bad in ["", "-a", "a-", "UPPER_lower.ok-9".repeat(5).as_str(), "a b", "ä"] {
            let n = label_name(bad);
            assert!(is_label_name(&n), "{bad:?} → {n:?}");
        }
        assert!(is_label_name("Upper_and.lower-9"));
        assert_eq!(label_name("Upper_and.lower-9"), "Upper_and.lower-9");
    }

    #[test]
    fn the_nodes_annotation_lists_every_member_by_its_full_name() {
        let long = format!("{}.example.com", "node-".repeat(20));
        assert_eq!(nodes_value(["n1", long.as_str(), "n0", "n1"]), format!("n0,n1,{long}"));
        assert_eq!(nodes_value([]), "");
    }

    #[test]
    fn label_keys_are_sorted_and_unique() {
        let keys = label_keys(["b", "a", "b"]);
        assert_eq!(keys.into_iter().collect::<Vec<_>>(), vec!["member.havip.io/a", "member.havip.io/b"]);
    }
}
