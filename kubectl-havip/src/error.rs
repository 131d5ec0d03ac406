//! The plugin's errors and exit codes.
//!
//! Every way `kubectl havip` can end has one exit code, stable across releases and
//! documented in `docs/plugin.md` (a unit test keeps the table there and [`exit`] in
//! step). Errors print one `error:` line on stderr, then `hint:` lines that say what to
//! check; answers of the operator (refused, still in progress) print on stdout and end
//! with their own codes without an `error:` line.

use crate::target::{DEFAULT_NAMESPACE, Target};
use std::fmt::Write as _;

/// The exit codes.
pub mod exit {
    /// Success: the operator answered `Succeeded`, maintenance was confirmed, the output
    /// was printed.
    pub const OK: u8 = 0;
    /// Any other error (an unexpected API answer, output that could not be written).
    pub const ERROR: u8 = 1;
    /// Invalid arguments: unknown command or flag, bad value, a node that is not a
    /// member of the pair.
    pub const USAGE: u8 = 2;
    /// The HAPair does not exist (or the cluster does not serve the HAPair API).
    pub const NOT_FOUND: u8 = 3;
    /// Not allowed: the API server refused the credentials (401) or the action (403).
    pub const FORBIDDEN: u8 = 4;
    /// The operator is not running, or did not take the request up within `--timeout`
    /// (the request was withdrawn).
    pub const NO_OPERATOR: u8 = 5;
    /// The operator answered `Refused` or `Failed`.
    pub const REFUSED: u8 = 6;
    /// No final answer within `--timeout`, but the request is under way (`InProgress`;
    /// maintenance written but not confirmed by the node's agent): it may still complete.
    pub const PENDING: u8 = 7;
    /// The API server cannot be reached (connection refused, DNS, TLS, timeout).
    pub const UNREACHABLE: u8 = 8;
    /// The client configuration is unusable: no kubeconfig, an unknown context, an
    /// unreadable or invalid kubeconfig.
    pub const CONFIG: u8 = 9;
    /// `doctor` found something wrong (each finding is on stdout, with its fix).
    pub const FINDINGS: u8 = 10;

    /// Every code with its name, in order (for the docs test and `--help`).
    pub const ALL: [(u8, &str); 11] = [
        (OK, "ok"),
        (ERROR, "error"),
        (USAGE, "usage"),
        (NOT_FOUND, "not found"),
        (FORBIDDEN, "not allowed"),
        (NO_OPERATOR, "operator not answering"),
        (REFUSED, "refused"),
        (PENDING, "pending"),
        (UNREACHABLE, "unreachable"),
        (CONFIG, "configuration"),
        (FINDINGS, "findings"),
    ];
}

/// Who the API server says we are (from a SelfSubjectReview).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The user name.
    pub user: String,
    /// Its groups.
    pub groups: Vec<String>,
}

/// What the plugin asked the API server for, to name it in errors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Action {
    /// The API verb: get, list, watch, patch, create.
    pub verb: &'static str,
    /// The resource, `hapairs.havip.io` or `leases.coordination.k8s.io`.
    pub resource: &'static str,
    /// The object's name, if one.
    pub name: Option<String>,
    /// The object's namespace, if namespaced.
    pub namespace: Option<String>,
}

/// The HAPair resource, as RBAC names it.
pub const HAPAIRS: &str = "hapairs.havip.io";
/// The Lease resource, as RBAC names it.
pub const LEASES: &str = "leases.coordination.k8s.io";
/// The Node resource, as RBAC names it.
pub const NODES: &str = "nodes";
/// The FloatingIP resource, as RBAC names it.
pub const FLOATINGIPS: &str = "floatingips.havip.io";

impl Action {
    /// `verb` on HAPair `name`.
    pub fn pair(verb: &'static str, name: &str) -> Self {
        Self { verb, resource: HAPAIRS, name: Some(name.to_owned()), namespace: None }
    }

    /// `verb` on every HAPair.
    pub fn pairs(verb: &'static str) -> Self {
        Self { verb, resource: HAPAIRS, name: None, namespace: None }
    }

    /// `verb` on every object of `resource` (cluster-scoped).
    pub fn all(verb: &'static str, resource: &'static str) -> Self {
        Self { verb, resource, name: None, namespace: None }
    }

    /// `verb` on Lease `namespace/name`.
    pub fn lease(verb: &'static str, namespace: &str, name: &str) -> Self {
        Self { verb, resource: LEASES, name: Some(name.to_owned()), namespace: Some(namespace.to_owned()) }
    }

    /// `hapairs.havip.io "web"` (with ` in namespace "x"` when namespaced).
    pub fn object(&self) -> String {
        let mut s = self.resource.to_owned();
        if let Some(n) = &self.name {
            let _ = write!(s, " {n:?}");
        }
        if let Some(ns) = &self.namespace {
            let _ = write!(s, " in namespace {ns:?}");
        }
        s
    }
}

/// Everything that ends `kubectl havip` with an error. [`PluginError::exit_code`] maps
/// each to its documented exit code.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// Invalid input: a node that is not a member, a bad flag value.
    #[error("{0}")]
    Usage(String),
    /// The client configuration cannot be used.
    #[error("{0}")]
    Config(String),
    /// The HAPair does not exist.
    #[error("HAPair {name:?} not found")]
    PairNotFound {
        /// Its name.
        name: String,
    },
    /// The cluster does not serve `hapairs.havip.io` (the CRDs are not installed).
    #[error("the cluster does not serve the HAPair API ({HAPAIRS}): {message}")]
    ApiMissing {
        /// The API server's words.
        message: String,
    },
    /// The API server refused the action (403).
    #[error("not allowed to {} {}{}: {message}", .action.verb, .action.object(), identity_suffix(.identity.as_deref()))]
    Forbidden {
        /// What was refused.
        action: Box<Action>,
        /// Who we are, when the API server tells (filled in after the refusal).
        identity: Option<Box<Identity>>,
        /// The API server's words.
        message: String,
    },
    /// The API server refused the credentials (401), or they could not be obtained
    /// (an exec credential plugin failed, a token file is unreadable).
    #[error("not authenticated: {message}")]
    Unauthorized {
        /// Why.
        message: String,
    },
    /// No connection to the API server.
    #[error("cannot reach the API server: {message}")]
    Unreachable {
        /// The connection error, with its causes.
        message: String,
    },
    /// The operator's leader Lease shows that no operator runs; the request was not
    /// written.
    #[error("the havip operator is not running: {detail}; the request was not sent")]
    OperatorNotRunning {
        /// What the Lease shows.
        detail: String,
        /// havip's namespace.
        namespace: String,
    },
    /// Nobody took the request up within the timeout.
    #[error("{0}")]
    NoAnswer(Box<Unanswered>),
    /// Any other API error.
    #[error("failed to {} {}: {message}", .action.verb, .action.object())]
    Api {
        /// What failed.
        action: Box<Action>,
        /// The error, with its causes.
        message: String,
    },
    /// Printing the output failed.
    #[error("failed to write the output: {0}")]
    Output(String),
    /// Something that should not happen (no random bytes, a task that panicked).
    #[error("{0}")]
    Internal(String),
}

fn operator_hints(namespace: &str) -> Vec<String> {
    vec![
        format!(
            "check the operator: kubectl -n {namespace} get pods -l app.kubernetes.io/component=operator; kubectl -n {namespace} logs deploy/havip-operator"
        ),
        format!(
            "havip installed in another namespace? pass -n NAMESPACE (now {namespace}{})",
            if namespace == DEFAULT_NAMESPACE { ", the default" } else { "" }
        ),
    ]
}

/// A request nobody took up in time.
#[derive(Debug)]
pub struct Unanswered {
    /// The operation asked for.
    pub operation: String,
    /// The pair.
    pub pair: String,
    /// The request id.
    pub id: String,
    /// How long we waited.
    pub seconds: u64,
    /// Whether the request annotation was removed again.
    pub withdrawn: bool,
    /// What the operator's leader Lease shows.
    pub operator: String,
    /// havip's namespace.
    pub namespace: String,
}

impl std::fmt::Display for Unanswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} on {} (id {}): no answer from the operator within {}s; {}",
            self.operation,
            self.pair,
            self.id,
            self.seconds,
            if self.withdrawn {
                "the request was withdrawn"
            } else {
                "the request could not be withdrawn and may still run later"
            }
        )
    }
}

fn identity_suffix(identity: Option<&Identity>) -> String {
    match identity {
        Some(i) if i.groups.is_empty() => format!(" as user {:?}", i.user),
        Some(i) => format!(" as user {:?} (groups {})", i.user, i.groups.join(", ")),
        None => String::new(),
    }
}

/// An error and its causes, `outer: inner: innermost` (kube's connection errors keep
/// the useful part in their sources), without repeating a cause that the outer message
/// already contains.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = s.source();
    }
    out
}

impl PluginError {
    /// The documented exit code (see [`exit`]).
    pub fn exit_code(&self) -> u8 {
        match self {
            PluginError::Usage(_) => exit::USAGE,
            PluginError::Config(_) => exit::CONFIG,
            PluginError::PairNotFound { .. } | PluginError::ApiMissing { .. } => exit::NOT_FOUND,
            PluginError::Forbidden { .. } | PluginError::Unauthorized { .. } => exit::FORBIDDEN,
            PluginError::Unreachable { .. } => exit::UNREACHABLE,
            PluginError::OperatorNotRunning { .. } | PluginError::NoAnswer(_) => exit::NO_OPERATOR,
            PluginError::Api { .. } | PluginError::Output(_) | PluginError::Internal(_) => exit::ERROR,
        }
    }

    /// Classifies an API error of `action`: a missing pair, a refusal, no connection …
    pub fn from_kube(action: Action, e: kube::Error) -> Self {
        let action = Box::new(action);
        match e {
            kube::Error::Api(s) if s.code == 404 => {
                // A missing object names itself in the details; a missing resource
                // (the CRD is not installed) does not.
                let names_object = s.details.as_ref().is_some_and(|d| !d.name.is_empty());
                match (&action.name, action.resource) {
                    (Some(name), HAPAIRS) if names_object => PluginError::PairNotFound { name: name.clone() },
                    (_, HAPAIRS) => PluginError::ApiMissing { message: s.message.clone() },
                    _ => PluginError::Api { action, message: s.message.clone() },
                }
            }
            kube::Error::Api(s) if s.code == 403 => {
                PluginError::Forbidden { action, identity: None, message: s.message }
            }
            kube::Error::Api(s) if s.code == 401 => PluginError::Unauthorized { message: s.message },
            kube::Error::Api(s) => PluginError::Api { action, message: format!("{} ({})", s.message, s.code) },
            kube::Error::Auth(ref a) => PluginError::Unauthorized { message: chain(a) },
            kube::Error::HyperError(_) | kube::Error::Service(_) => PluginError::Unreachable { message: chain(&e) },
            other => PluginError::Api { action, message: chain(&other) },
        }
    }

    /// What to check next, one line each (printed as `hint:` lines). `context` names
    /// the kubeconfig context in use, if any.
    pub fn hints(&self, target: &Target) -> Vec<String> {
        match self {
            PluginError::PairNotFound { .. } => {
                vec![format!("the pairs in {}: kubectl havip list", target.describe())]
            }
            PluginError::ApiMissing { .. } => vec![format!(
                "is havip installed in {}? `kubectl get crd hapairs.havip.io` shows whether its CRDs are",
                target.describe()
            )],
            PluginError::Forbidden { action, .. } => {
                let mut h = vec![format!(
                    "check with: kubectl auth can-i {} {}{}",
                    action.verb,
                    action.resource,
                    action.namespace.as_deref().map(|n| format!(" -n {n}")).unwrap_or_default()
                )];
                if action.resource == HAPAIRS {
                    h.push(
                        "kubectl havip needs get, list, watch and patch on hapairs.havip.io (see docs/plugin.md, Permissions)"
                            .to_owned(),
                    );
                }
                h
            }
            PluginError::Unauthorized { .. } => {
                vec![format!("the credentials of {} were not accepted: log in again or check the user", target.describe())]
            }
            PluginError::Unreachable { .. } => vec![format!(
                "is {} up and reachable from here? check --context/--kubeconfig (using {})",
                target.server,
                target.describe()
            )],
            PluginError::OperatorNotRunning { namespace, .. } => operator_hints(namespace),
            PluginError::NoAnswer(u) => {
                let mut h = vec![u.operator.clone()];
                h.extend(operator_hints(&u.namespace));
                h
            }
            PluginError::Config(_) => vec![
                "kubectl havip reads --kubeconfig, else KUBECONFIG (several files merge), else ~/.kube/config, else the in-cluster config; --context picks a context".to_owned(),
            ],
            PluginError::Usage(_) => vec!["kubectl havip --help shows the commands and flags".to_owned()],
            PluginError::Api { .. } | PluginError::Output(_) | PluginError::Internal(_) => Vec::new(),
        }
    }
}

/// Whether `e` is the API server's answer with HTTP status `code`.
pub fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::{Action, Identity, PluginError, exit};
    use kube::core::Status;

    fn status(code: u16, name: &str) -> kube::Error {
        let mut s = Status::failure("msg", "Reason").with_code(code);
        if !name.is_empty() {
            s.details = Some(serde_json::from_value(serde_json::json!({"name": name})).unwrap());
        }
        kube::Error::Api(s.boxed())
    }

    #[test]
    fn api_errors_map_to_their_categories() {
        let e = PluginError::from_kube(Action::pair("get", "web"), status(404, "web"));
        assert!(matches!(&e, PluginError::PairNotFound { name } if name == "web"), "{e:?}");
        assert_eq!(e.exit_code(), exit::NOT_FOUND);
        assert_eq!(e.to_string(), "HAPair \"web\" not found");
        let e = PluginError::from_kube(Action::pairs("list"), status(404, ""));
        assert!(matches!(e, PluginError::ApiMissing { .. }), "{e:?}");
        assert_eq!(e.exit_code(), exit::NOT_FOUND);
        let e = PluginError::from_kube(Action::lease("get", "havip-system", "havip-operator"), status(404, "x"));
        assert_eq!(e.exit_code(), exit::ERROR);
        let e = PluginError::from_kube(Action::pair("patch", "web"), status(403, "web"));
        assert_eq!(e.exit_code(), exit::FORBIDDEN);
        assert!(e.to_string().starts_with("not allowed to patch hapairs.havip.io \"web\": msg"), "{e}");
        let e = PluginError::from_kube(Action::pairs("list"), status(401, ""));
        assert_eq!(e.exit_code(), exit::FORBIDDEN);
        let e = PluginError::from_kube(Action::pairs("list"), status(500, ""));
        assert_eq!(e.exit_code(), exit::ERROR);
        assert!(e.to_string().contains("(500)"), "{e}");
    }

    #[test]
    fn forbidden_names_the_identity_when_known() {
        let e = PluginError::Forbidden {
            action: Box::new(Action::lease("get", "havip-system", "havip-operator")),
            identity: Some(Box::new(Identity {
                user: "bob".into(),
                groups: vec!["dev".into(), "system:authenticated".into()],
            })),
            message: "no".into(),
        };
        assert_eq!(
            e.to_string(),
            "not allowed to get leases.coordination.k8s.io \"havip-operator\" in namespace \"havip-system\" as user \"bob\" (groups dev, system:authenticated): no"
        );
    }

    #[test]
    fn exit_codes_are_distinct_and_ordered() {
        for (i, (code, _)) in exit::ALL.iter().enumerate() {
            assert_eq!(usize::from(*code), i);
        }
    }
}
