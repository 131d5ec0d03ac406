//! `kubectl havip`: imperative verbs for havip pairs, a list and a readable status view.
//!
//! Each action writes its request annotation (a fresh id, field manager
//! `kubectl-havip`) and waits for `status.lastOperation` to answer that id. The exit
//! codes are in `docs/plugin.md` and `kubectl havip --help`: 0 `Succeeded`, 6 `Refused`
//! or `Failed`, 7 still in progress at the timeout, 5 no operator answering, 3 no such
//! pair, 4 not allowed, 8 API server unreachable, 9 bad kubeconfig/context, 2 usage,
//! 1 anything else.
//!
//! Run as `kubectl_complete-havip` (a link to this binary) or with `__complete`, it
//! answers kubectl's shell completion for `kubectl havip <TAB>`.

use clap::Parser;
use kubectl_havip::cli::{self, Args, Command, Session};
use kubectl_havip::complete::{self, COMPLETE_COMMAND, COMPLETER};
use kubectl_havip::config::{self, who_am_i};
use kubectl_havip::target::Target;
use kubectl_havip::{PluginError, exit};
use std::process::ExitCode;

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect();
    let invoked_as = argv
        .first()
        .and_then(|a| std::path::Path::new(a).file_name().map(|f| f.to_string_lossy().into_owned()))
        .unwrap_or_default();
    let completion_words = if invoked_as.starts_with(COMPLETER) {
        Some(argv.get(1..).unwrap_or_default().to_vec())
    } else if argv.get(1).map(String::as_str) == Some(COMPLETE_COMMAND) {
        Some(argv.get(2..).unwrap_or_default().to_vec())
    } else {
        None
    };
    let args = match completion_words {
        Some(words) => {
            let done = with_runtime(async move { cli::out(&complete::complete(&words).await) });
            return match done.and_then(|r| r) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => report_plain(e),
            };
        }
        None => match Args::try_parse_from(&argv) {
            Ok(a) => a,
            Err(e) => {
                let _ = e.print();
                return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(exit::USAGE));
            }
        },
    };
    // kube's client logs the connection errors that the plugin reports itself.
    let filter = tracing_subscriber::EnvFilter::try_from_env("HAVIP_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,kube_client=off"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    if let Command::Completion { shell } = &args.command {
        let script = cli::completion_script(*shell);
        return match cli::out(&String::from_utf8_lossy(&script)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => report_plain(e),
        };
    }
    let code = with_runtime(async move {
        let (client, target) = match config::client(&cli::client_options(&args)).await {
            Ok(c) => c,
            Err(e) => return report(e, &Target::default(), None).await,
        };
        let session = Session { client, target, namespace: args.namespace.clone(), timeout: args.timeout };
        match cli::run(&session, args.command).await {
            Ok(outcome) => outcome.exit_code(),
            Err(e) => report(e, &session.target, Some(&session.client)).await,
        }
    });
    match code {
        Ok(c) => ExitCode::from(c),
        Err(e) => report_plain(e),
    }
}

fn with_runtime<T>(f: impl std::future::Future<Output = T>) -> Result<T, PluginError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| PluginError::Internal(format!("failed to start the async runtime: {e}")))?;
    Ok(rt.block_on(f))
}

/// Prints the error and its hints; returns its exit code. A refusal gets the identity
/// the API server sees us as.
async fn report(mut e: PluginError, target: &Target, client: Option<&kube::Client>) -> u8 {
    if let (PluginError::Forbidden { identity, .. }, Some(c)) = (&mut e, client) {
        *identity = who_am_i(c).await.map(Box::new);
    }
    eprintln!("error: {e}");
    for h in e.hints(target) {
        eprintln!("hint: {h}");
    }
    e.exit_code()
}

fn report_plain(e: PluginError) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(e.exit_code())
}
