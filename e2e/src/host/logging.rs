//! `tracing` for the tests and the binaries.

/// Initialises `tracing` for tests and binaries (idempotent); `RUST_LOG` filters.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_test_writer()
        .try_init();
}

/// Initialises `tracing` on standard error at `warn` unless `RUST_LOG` says otherwise
/// (idempotent), for binaries whose standard output is their product (the demo's steps,
/// the chaos run's JSON lines). The kube client's own error lines are left out: the chaos
/// run stops the API server on purpose, and every call that fails because of it is
/// retried or reported by the caller.
pub fn init_tracing_quiet() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,kube_client=off")),
        )
        .with_writer(std::io::stderr)
        .try_init();
}
