//! The labels the operator puts on what it creates (a leaf: every room reads it).

/// Label on every object the operator creates.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "havip-operator");
/// Label naming the pair a Lease or Secret belongs to.
pub const PAIR_LABEL: &str = "havip.io/pair";
