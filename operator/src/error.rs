//! The operator's errors: each variant names the operation that failed; `category()`
//! gives a bounded label for metrics.

/// Everything that can go wrong in the operator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Building a Kubernetes client (kubeconfig or in-cluster config) failed.
    #[error("failed to build a Kubernetes client: {0}")]
    Client(String),
    /// Creating the pair's Lease failed.
    #[error("failed to create Lease {namespace}/{name}: {source}")]
    CreateLease {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The API error.
        #[source]
        source: Box<kube::Error>,
    },
    /// Creating the pair's key Secret failed.
    #[error("failed to create Secret {namespace}/{name}: {source}")]
    CreateSecret {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The API error.
        #[source]
        source: Box<kube::Error>,
    },
    /// Replacing the key Secret (rotation start, finish or member record) failed.
    #[error("failed to update Secret {namespace}/{name} ({what}): {source}")]
    UpdateSecret {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// What the update was for.
        what: &'static str,
        /// The API error.
        #[source]
        source: Box<kube::Error>,
    },
    /// Taking over the Lease of an earlier pair of the same name failed.
    #[error("failed to update Lease {namespace}/{name} ({what}): {source}")]
    UpdateLease {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// What the update was for.
        what: &'static str,
        /// The API error.
        #[source]
        source: Box<kube::Error>,
    },
    /// The key Secret exists but cannot be read (missing or malformed `key`/`keyId`).
    #[error("failed to read Secret {namespace}/{name}: {message}")]
    MalformedSecret {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// Applying an object's status failed.
    #[error("failed to apply the status of {kind} {name}: {source}")]
    ApplyStatus {
        /// HAPair or FloatingIP.
        kind: &'static str,
        /// Its name.
        name: String,
        /// The API error.
        #[source]
        source: Box<kube::Error>,
    },
    /// Writing an annotation failed.
    #[error("failed to annotate {kind} {name}: {source}")]
    Annotate {
        /// HAPair.
        kind: &'static str,
        /// Its name.
        name: String,
        /// The API error.
        #[source]
        source: Box<kube::Error>,
    },
    /// Setting an object's member labels failed.
    #[error("failed to label {kind} {name} with its member nodes: {source}")]
    Label {
        /// The kind.
        kind: &'static str,
        /// Its name.
        name: String,
        /// The API error.
        #[source]
        source: Box<kube::Error>,
    },
    /// Reading an object failed.
    #[error("failed to get {kind} {name}: {source}")]
    Get {
        /// The kind.
        kind: &'static str,
        /// Its name.
        name: String,
        /// The API error.
        #[source]
        source: Box<kube::Error>,
    },
    /// Creating, applying or deleting a FloatingIP of a Service's address failed.
    #[error("failed to {op} FloatingIP {name}: {source}")]
    FloatingIp {
        /// create, apply or delete.
        op: &'static str,
        /// Its name.
        name: String,
        /// The API error.
        #[source]
        source: Box<kube::Error>,
    },
    /// Listing objects failed.
    #[error("failed to list {kind}: {source}")]
    List {
        /// The kind.
        kind: &'static str,
        /// The API error.
        #[source]
        source: Box<kube::Error>,
    },
    /// Watching objects failed.
    #[error("failed to watch {kind}: {message}")]
    Watch {
        /// The kind.
        kind: &'static str,
        /// The watcher's error.
        message: String,
    },
    /// The leader-election Lease could not be read or written.
    #[error("failed to {op} the leader-election Lease {namespace}/{name}: {source}")]
    LeaderLease {
        /// acquire, renew or release.
        op: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The API error.
        #[source]
        source: Box<kube::Error>,
    },
    /// Renewing the leader-election Lease took longer than the renew deadline allows.
    #[error("failed to renew the leader-election Lease within {seconds:.1} s")]
    RenewTimeout {
        /// How long the attempt was given.
        seconds: f64,
    },
    /// The caches did not fill in time (the API server is not answering lists).
    #[error("failed to sync the caches within {seconds} s")]
    CacheSync {
        /// How long we waited.
        seconds: u64,
    },
    /// A write was suppressed because this replica is not the leader (any more).
    #[error("failed to write {what}: this replica is not the leader")]
    NotLeader {
        /// What would have been written.
        what: &'static str,
    },
    /// Serving the metrics endpoint failed.
    #[error("failed to serve metrics on {addr}: {source}")]
    Metrics {
        /// The address.
        addr: std::net::SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Installing the signal handlers failed.
    #[error("failed to install signal handlers: {0}")]
    Signals(#[source] std::io::Error),
    /// The random number generator failed.
    #[error("failed to generate random bytes: {0}")]
    Random(String),
    /// Bad command-line input.
    #[error("{0}")]
    Usage(String),
}

impl Error {
    /// Every category [`Error::category`] names: the error counter starts at 0 for each, so
    /// that a dashboard or alert tells "no errors" from "not scraped" (a test checks the
    /// list against the function).
    pub const CATEGORIES: &'static [&'static str] = &[
        "client",
        "create_lease",
        "create_secret",
        "update_secret",
        "update_lease",
        "malformed_secret",
        "apply_status",
        "annotate",
        "label",
        "get",
        "floating_ip",
        "list",
        "watch",
        "leader_lease",
        "renew_timeout",
        "cache_sync",
        "not_leader",
        "metrics",
        "signals",
        "random",
        "usage",
    ];

    /// A bounded label for metrics (never derived from messages).
    pub fn category(&self) -> &'static str {
        match self {
            Error::Client(_) => "client",
            Error::CreateLease { .. } => "create_lease",
            Error::CreateSecret { .. } => "create_secret",
            Error::UpdateSecret { .. } => "update_secret",
            Error::UpdateLease { .. } => "update_lease",
            Error::MalformedSecret { .. } => "malformed_secret",
            Error::ApplyStatus { .. } => "apply_status",
            Error::Annotate { .. } => "annotate",
            Error::Label { .. } => "label",
            Error::Get { .. } => "get",
            Error::FloatingIp { .. } => "floating_ip",
            Error::List { .. } => "list",
            Error::Watch { .. } => "watch",
            Error::LeaderLease { .. } => "leader_lease",
            Error::RenewTimeout { .. } => "renew_timeout",
            Error::CacheSync { .. } => "cache_sync",
            Error::NotLeader { .. } => "not_leader",
            Error::Metrics { .. } => "metrics",
            Error::Signals(_) => "signals",
            Error::Random(_) => "random",
            Error::Usage(_) => "usage",
        }
    }

    /// Whether the API answered 409 Conflict (a compare-and-swap lost) or 409 AlreadyExists.
    pub fn is_conflict(&self) -> bool {
        let source = match self {
            Error::CreateLease { source, .. }
            | Error::CreateSecret { source, .. }
            | Error::UpdateSecret { source, .. }
            | Error::UpdateLease { source, .. }
            | Error::ApplyStatus { source, .. }
            | Error::Annotate { source, .. }
            | Error::FloatingIp { source, .. }
            | Error::LeaderLease { source, .. } => source,
            _ => return false,
        };
        is_status(source, 409)
    }
}

/// Whether a kube error is an API status with this HTTP code.
pub fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

#[cfg(test)]
mod tests {
    use super::Error;

    #[test]
    fn categories_are_bounded_and_messages_name_the_operation() {
        let e = Error::CacheSync { seconds: 30 };
        assert_eq!(e.category(), "cache_sync");
        assert!(e.to_string().starts_with("failed to"));
        let e = Error::NotLeader { what: "status" };
        assert_eq!(e.category(), "not_leader");
        assert!(!e.is_conflict());
    }

    #[test]
    fn every_category_the_function_names_is_listed_once() {
        let src = include_str!("error.rs");
        let body = src
            .split("pub fn category(&self) -> &'static str {")
            .nth(1)
            .and_then(|r| r.split("\n    }\n").next())
            .expect("the category function");
        let named: Vec<&str> = body.split("=> \"").skip(1).filter_map(|r| r.split('"').next()).collect();
        assert!(named.len() > 10, "{named:?}");
        let named: std::collections::BTreeSet<&str> = named.into_iter().collect();
        let listed: std::collections::BTreeSet<&str> = Error::CATEGORIES.iter().copied().collect();
        assert_eq!(listed.len(), Error::CATEGORIES.len(), "a category listed twice");
        assert_eq!(named, listed);
    }
}
