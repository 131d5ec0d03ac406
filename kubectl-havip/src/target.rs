//! The cluster and namespace the plugin works in, as its messages name them. A leaf: the
//! configuration ([`crate::config`]) finds the target, the errors' hints
//! ([`crate::error`]) name it.

/// havip's namespace when `-n` is not given (the chart's default).
pub const DEFAULT_NAMESPACE: &str = "havip-system";

/// The cluster in use, for messages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Target {
    /// The API server's URL.
    pub server: String,
    /// The context in use (none in-cluster).
    pub context: Option<String>,
    /// The kubeconfig file(s), or `in-cluster configuration`.
    pub source: String,
}

impl Target {
    /// `context "kind-a" of ~/.kube/config`, or `the in-cluster configuration`.
    pub fn describe(&self) -> String {
        match &self.context {
            Some(c) => format!("context {c:?} of {}", self.source),
            None if self.source.is_empty() => "the cluster".to_owned(),
            None => self.source.clone(),
        }
    }
}
