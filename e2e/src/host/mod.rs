//! What the harness does on this machine, below everything else: child processes that
//! never outlive the test ([`process`]), network namespaces wired into topologies of
//! nodes, a client and a gateway ([`netns`]), and the tracing set-up ([`logging`]).
//!
//! Nothing here knows about havip, Kubernetes or test traffic; every other room builds on
//! it.

pub mod logging;
pub mod netns;
pub mod process;
pub mod routing;
