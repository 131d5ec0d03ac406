//! The `kubectl havip` plugin (binary `kubectl-havip`): imperative verbs for havip pairs,
//! a list and a readable status view.
//!
//! - [`cli`]: the command line and what each command does;
//! - [`requests`]: request ids, writing a request annotation, waiting for its answer,
//!   withdrawing an unanswered one (the annotations' grammar is shared with the
//!   operator: [`havip_crds::request`]);
//! - [`maintenance`]: the maintenance patch;
//! - [`liveness`]: whether the operator runs (its leader-election Lease);
//! - [`render`]: what it prints (`list`, `status`, `-o json|yaml`);
//! - [`complete`]: kubectl's shell completion;
//! - [`config`]: which cluster it talks to, as kubectl chooses it, and who it is there;
//! - [`target`]: the cluster and namespace in use, for messages;
//! - [`error`]: its errors, hints and exit codes.
//!
//! The plugin talks to the API server only; it shares no code with the operator but the
//! CRD types and the request grammar of `havip-crds`.

pub mod cli;
pub mod complete;
pub mod config;
pub mod doctor;
pub mod error;
pub mod liveness;
pub mod maintenance;
pub mod render;
pub mod requests;
pub mod target;

pub use error::{Action, PluginError, exit};
pub use target::DEFAULT_NAMESPACE;
