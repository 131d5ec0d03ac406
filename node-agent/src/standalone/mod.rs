//! Standalone mode (no Kubernetes): what is specific to running pairs from local files.
//! Today: the start-up sweep of what pairs that are no longer configured left behind
//! ([`sweep`]). The daemon's entry point is `havip-agent standalone` (`main.rs`), its
//! configuration `config::StandaloneFile`, its admin socket `admin`.

pub mod sweep;
