//! The command line of `kubectl havip` and what each command does.

use crate::config::ClientOptions;
use crate::error::{Action, PluginError, Unanswered, exit};
use crate::liveness;
use crate::maintenance::set_maintenance;
use crate::render::{self, Format};
use crate::requests::{Waited, Withdrawal, annotate, request_id, wait_for_answer, withdraw};
use crate::target::{DEFAULT_NAMESPACE, Target};
use clap::{Parser, Subcommand, ValueEnum, ValueHint};
use havip_crds::request::RequestKind;
use havip_crds::{HAPair, Operation, OperationResult};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

fn duration(s: &str) -> Result<Duration, String> {
    havip_crds::duration::parse_duration(s).map_err(|e| e.to_string())
}

/// The exit codes, for `--help` (docs/plugin.md has the same table; a test checks).
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  ok: Succeeded, maintenance confirmed, output printed
  1  error: any other error
  2  usage: invalid arguments, a node that is not a member
  3  not found: the HAPair (or the HAPair API) does not exist
  4  not allowed: credentials refused (401) or action forbidden (403)
  5  operator not answering: not running, or no answer within --timeout (request withdrawn)
  6  refused: the operator answered Refused or Failed
  7  pending: InProgress at --timeout, or maintenance not yet confirmed (may still complete)
  8  unreachable: the API server cannot be reached
  9  configuration: no kubeconfig, unknown context, unreadable kubeconfig
  10  findings: doctor found something wrong (each finding on stdout, with its fix)";

/// Imperative verbs and status for havip HAPairs.
#[derive(Parser, Debug)]
#[command(name = "kubectl-havip", bin_name = "kubectl havip", version, after_help = EXIT_CODES_HELP)]
pub struct Args {
    /// Kubeconfig file, and only that one (default: the files in KUBECONFIG, merged,
    /// else ~/.kube/config, else the in-cluster configuration).
    #[arg(long, global = true, env = "HAVIP_KUBECONFIG", value_hint = ValueHint::FilePath)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current-context).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// havip's namespace: where the operator and its leader-election Lease are
    /// (HAPairs themselves are cluster-scoped).
    #[arg(short = 'n', long, global = true, env = "HAVIP_NAMESPACE", default_value = DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// How long to wait for the answer; also bounds connecting to the API server.
    #[arg(long, global = true, env = "HAVIP_TIMEOUT", default_value = "15s", value_parser = duration)]
    pub timeout: Duration,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// `status -o`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusOutput {
    /// The HAPair object (a v1 List of them without a PAIR), as JSON.
    Json,
    /// The same as YAML.
    Yaml,
}

/// `list -o`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListOutput {
    /// The table with STANDBY, the last move (FROM→TO) and its time.
    Wide,
    /// The table's data as JSON: {"items": [{name, phase, paused, active, standby, epoch, vips, lastTransition}]}.
    Json,
    /// The same as YAML.
    Yaml,
}

/// The commands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Move the VIPs to a standby (planned: make-before-break; --force: skip readiness checks).
    Failover {
        /// The HAPair.
        pair: String,
        /// Forced failover: skips the readiness checks.
        #[arg(long)]
        force: bool,
        /// The member that should take the VIPs (default: the best ready standby).
        #[arg(long)]
        to: Option<String>,
    },
    /// Put a member into maintenance or take it out (spec.members[].maintenance).
    Maintenance {
        /// The HAPair.
        pair: String,
        /// The member node.
        node: String,
        /// on or off.
        #[arg(value_parser = ["on", "off"])]
        state: String,
    },
    /// Clear a flap suspension.
    Clear {
        /// The HAPair.
        pair: String,
    },
    /// Rotate the heartbeat key (waits until every member uses the new key).
    RotateKey {
        /// The HAPair.
        pair: String,
    },
    /// Resume automatic failback after a manual move paused it.
    ResumeFailback {
        /// The HAPair.
        pair: String,
    },
    /// Show one pair, or every pair, member by member.
    Status {
        /// The HAPair (default: all).
        pair: Option<String>,
        /// Output format (default: the readable view).
        #[arg(short = 'o', long, value_enum)]
        output: Option<StatusOutput>,
    },
    /// List every pair: phase, active member, epoch, last failover and why.
    List {
        /// Output format (default: a table).
        #[arg(short = 'o', long, value_enum)]
        output: Option<ListOutput>,
    },
    /// Check every member's node (or one pair's) for what keeps havip from working: the
    /// findings each agent reports (capabilities, reverse-path filtering, arp_ignore, a VIP
    /// first on its interface, a heartbeat path silent) and VIPs that a Node reports as its
    /// own address; each with its fix. Exit 10 when there is a finding.
    Doctor {
        /// The HAPair (default: all).
        pair: Option<String>,
    },
    /// Print a shell completion script for kubectl-havip.
    ///
    /// For `kubectl havip <TAB>` (kubectl 1.26+), link `kubectl_complete-havip` to
    /// `kubectl-havip` on your PATH instead: see docs/plugin.md.
    Completion {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// How a command ended without an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done (exit 0).
    Done,
    /// The operator answered `Refused` or `Failed` (exit 6).
    Refused,
    /// Under way but not finished within the timeout (exit 7).
    Pending,
    /// `doctor` found something (exit 10).
    Findings,
}

impl Outcome {
    /// The documented exit code.
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Done => exit::OK,
            Outcome::Refused => exit::REFUSED,
            Outcome::Pending => exit::PENDING,
            Outcome::Findings => exit::FINDINGS,
        }
    }
}

/// Prints to stdout. A closed pipe (`| head`) is not an error.
pub fn out(text: &str) -> Result<(), PluginError> {
    let mut o = std::io::stdout().lock();
    match o.write_all(text.as_bytes()).and_then(|()| o.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(PluginError::Output(e.to_string())),
    }
}

fn answer_line(op: &Operation) -> String {
    format!("{} {}: {} — {}\n", op.kind, op.id, op.result, op.message)
}

/// A connected plugin: the client, where it points, and the global flags.
pub struct Session {
    /// The client.
    pub client: kube::Client,
    /// The cluster in use.
    pub target: Target,
    /// havip's namespace.
    pub namespace: String,
    /// `--timeout`.
    pub timeout: Duration,
}

impl Session {
    fn pairs(&self) -> Api<HAPair> {
        Api::all(self.client.clone())
    }
}

/// The client options of `args`.
pub fn client_options(args: &Args) -> ClientOptions {
    ClientOptions {
        kubeconfig: args.kubeconfig.clone(),
        context: args.context.clone(),
        connect_timeout: Some(args.timeout.max(Duration::from_secs(1))),
        // A request the API server holds (its etcd down) fails 5 s after --timeout rather
        // than after the API server's own 60 s.
        read_timeout: Some(args.timeout.max(Duration::from_secs(1)) + Duration::from_secs(5)),
    }
}

/// Runs a command that needs the cluster.
pub async fn run(session: &Session, command: Command) -> Result<Outcome, PluginError> {
    let (pair, kind, target) = match command {
        Command::Status { pair, output } => return status(session, pair.as_deref(), output).await,
        Command::List { output } => return list(session, output).await,
        Command::Doctor { pair } => return doctor(session, pair.as_deref()).await,
        Command::Maintenance { pair, node, state } => return maintenance(session, &pair, &node, state == "on").await,
        Command::Completion { .. } => return Err(PluginError::Internal("completion needs no cluster".to_owned())),
        Command::Failover { pair, force, to } => {
            (pair, if force { RequestKind::ForceFailover } else { RequestKind::Failover }, to)
        }
        Command::Clear { pair } => (pair, RequestKind::Clear, None),
        Command::RotateKey { pair } => (pair, RequestKind::RotateKey, None),
        Command::ResumeFailback { pair } => (pair, RequestKind::ResumeFailback, None),
    };
    request(session, &pair, kind, target).await
}

/// Writes a request annotation and waits for the operator's answer.
async fn request(
    session: &Session,
    pair: &str,
    kind: RequestKind,
    target: Option<String>,
) -> Result<Outcome, PluginError> {
    let api = session.pairs();
    let timeout = session.timeout;
    // Fail early, naming the pair, when it does not exist or cannot be read.
    api.get(pair).await.map_err(|e| PluginError::from_kube(Action::pair("get", pair), e))?;
    // Fail early when the operator's Lease shows that none runs (nobody would answer).
    liveness::precheck(&session.client, &session.namespace, timeout.min(Duration::from_secs(5))).await?;
    let id = request_id()?;
    let value = match &target {
        Some(t) => format!("{id}:{t}"),
        None => id.clone(),
    };
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let mut waiter = {
        let api = api.clone();
        let pair = pair.to_owned();
        let id = id.clone();
        // The watch's initial list also shows an answer that came before it started.
        tokio::spawn(async move {
            wait_for_answer(&api, &pair, &id, timeout, Some(ready_tx), |op| {
                let _ = out(&answer_line(op));
            })
            .await
        })
    };
    let joined = |r: Result<Result<Waited, PluginError>, tokio::task::JoinError>| {
        r.map_err(|e| PluginError::Internal(format!("waiting for the answer failed: {e}")))?
    };
    // Write the request only once its answer can be seen (the watch started).
    tokio::select! {
        Ok(()) = ready_rx => {}
        r = &mut waiter => {
            // The watch ended before it started: refused, or the timeout.
            return match joined(r)? {
                Waited::Answered(_) | Waited::TimedOut(_) => Err(PluginError::Unreachable {
                    message: format!("no watch on HAPair {pair} started within {}s", timeout.as_secs()),
                }),
            };
        }
    }
    if let Err(e) = annotate(&api, pair, kind, &value).await {
        waiter.abort();
        return Err(e);
    }
    eprintln!(
        "requested {} on {pair} (id {id}); waiting up to {}s for the answer",
        kind.operation(),
        timeout.as_secs()
    );
    match joined(waiter.await)? {
        Waited::Answered(op) => {
            out(&answer_line(&op))?;
            Ok(if op.result == OperationResult::Succeeded { Outcome::Done } else { Outcome::Refused })
        }
        Waited::TimedOut(Some(op)) => {
            out(&format!(
                "{} {}: still {} after {}s — {}\n",
                op.kind,
                op.id,
                op.result,
                timeout.as_secs(),
                op.message
            ))?;
            Ok(Outcome::Pending)
        }
        Waited::TimedOut(None) => {
            let withdrawal = withdraw(&api, pair, kind, &id, &value).await;
            if withdrawal == Withdrawal::TakenUp {
                out(&format!(
                    "{} {id}: taken up by the operator as the wait ended; it may still complete (kubectl havip status {pair})\n",
                    kind.operation()
                ))?;
                return Ok(Outcome::Pending);
            }
            if let Withdrawal::Failed(why) = &withdrawal {
                eprintln!("warning: could not withdraw the request: {why}");
            }
            let state = liveness::state(&session.client, &session.namespace).await;
            Err(PluginError::NoAnswer(Box::new(Unanswered {
                operation: kind.operation().to_string(),
                pair: pair.to_owned(),
                id,
                seconds: timeout.as_secs(),
                withdrawn: withdrawal == Withdrawal::Withdrawn,
                operator: state.describe(&session.namespace),
                namespace: session.namespace.clone(),
            })))
        }
    }
}

async fn fetch(api: &Api<HAPair>, pair: Option<&str>) -> Result<Vec<HAPair>, PluginError> {
    match pair {
        Some(p) => Ok(vec![api.get(p).await.map_err(|e| PluginError::from_kube(Action::pair("get", p), e))?]),
        None => {
            let mut items = api
                .list(&ListParams::default())
                .await
                .map_err(|e| PluginError::from_kube(Action::pairs("list"), e))?
                .items;
            items.sort_by_key(kube::ResourceExt::name_any);
            Ok(items)
        }
    }
}

fn encode(value: &serde_json::Value, format: Format) -> Result<String, PluginError> {
    render::encode(value, format).map_err(PluginError::Output)
}

async fn status(session: &Session, pair: Option<&str>, output: Option<StatusOutput>) -> Result<Outcome, PluginError> {
    let pairs = fetch(&session.pairs(), pair).await?;
    let format = match output {
        Some(StatusOutput::Json) => Format::Json,
        Some(StatusOutput::Yaml) => Format::Yaml,
        None => {
            let now = Timestamp::now();
            if pairs.is_empty() {
                out("no HAPairs\n")?;
            }
            let views: Vec<String> = pairs.iter().map(|p| render::render_status(p, now)).collect();
            out(&views.join("\n"))?;
            return Ok(Outcome::Done);
        }
    };
    out(&encode(&render::status_value(&pairs, pair.is_some()), format)?)?;
    Ok(Outcome::Done)
}

async fn doctor(session: &Session, pair: Option<&str>) -> Result<Outcome, PluginError> {
    let pairs = fetch(&session.pairs(), pair).await?;
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(session.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| PluginError::from_kube(Action::all("list", crate::error::NODES), e))?
        .items;
    let fips = Api::<havip_crds::FloatingIP>::all(session.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| PluginError::from_kube(Action::all("list", crate::error::FLOATINGIPS), e))?
        .items;
    let report = crate::doctor::diagnose(&pairs, &nodes, &fips);
    out(&crate::doctor::render(&report))?;
    Ok(if report.is_empty() { Outcome::Done } else { Outcome::Findings })
}

async fn list(session: &Session, output: Option<ListOutput>) -> Result<Outcome, PluginError> {
    let pairs = fetch(&session.pairs(), None).await?;
    let text = match output {
        Some(ListOutput::Json) => encode(&render::list_value(&pairs), Format::Json)?,
        Some(ListOutput::Yaml) => encode(&render::list_value(&pairs), Format::Yaml)?,
        Some(ListOutput::Wide) | None if pairs.is_empty() => {
            eprintln!("no HAPairs in {}", session.target.describe());
            return Ok(Outcome::Done);
        }
        Some(ListOutput::Wide) => render::render_list(&pairs, Timestamp::now(), true),
        None => render::render_list(&pairs, Timestamp::now(), false),
    };
    out(&text)?;
    Ok(Outcome::Done)
}

async fn maintenance(session: &Session, pair: &str, node: &str, on: bool) -> Result<Outcome, PluginError> {
    let api = session.pairs();
    let timeout = session.timeout;
    set_maintenance(&api, pair, node, on).await?;
    let word = if on { "on" } else { "off" };
    eprintln!("set maintenance {word} for {node} in {pair}; waiting up to {}s for its agent", timeout.as_secs());
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let p = api.get(pair).await.map_err(|e| PluginError::from_kube(Action::pair("get", pair), e))?;
        let applied = p.status.as_ref().and_then(|s| render::member_status(s, node)).and_then(|m| m.maintenance);
        if applied == Some(on) {
            out(&format!("{node}: maintenance {word} (applied by its agent)\n"))?;
            return Ok(Outcome::Done);
        }
        if tokio::time::Instant::now() >= deadline {
            out(&format!(
                "{node}: maintenance {word} is in the spec; the agent has not confirmed within {}s\n",
                timeout.as_secs()
            ))?;
            return Ok(Outcome::Pending);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `completion SHELL`: the clap_complete script for the `kubectl-havip` executable.
pub fn completion_script(shell: clap_complete::Shell) -> Vec<u8> {
    let mut cmd = <Args as clap::CommandFactory>::command();
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut cmd, "kubectl-havip", &mut buf);
    buf
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::{Args, Command, EXIT_CODES_HELP, ListOutput, Outcome, StatusOutput, completion_script};
    use crate::error::exit;
    use crate::target::DEFAULT_NAMESPACE;
    use clap::Parser;
    use std::time::Duration;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("kubectl-havip").chain(args.iter().copied()))
    }

    #[test]
    fn the_definition_is_consistent() {
        <Args as clap::CommandFactory>::command().debug_assert();
    }

    #[test]
    fn global_flags_go_before_or_after_the_command() {
        let a = parse(&["--context", "prod", "status", "web", "-o", "json"]).unwrap();
        assert_eq!(a.context.as_deref(), Some("prod"));
        assert!(
            matches!(a.command, Command::Status { pair: Some(ref p), output: Some(StatusOutput::Json) } if p == "web")
        );
        let a = parse(&["list", "--kubeconfig", "/tmp/kc", "-n", "havip", "--timeout", "3s", "-o", "yaml"]).unwrap();
        assert_eq!(a.kubeconfig.as_deref(), Some(std::path::Path::new("/tmp/kc")));
        assert_eq!((a.namespace.as_str(), a.timeout), ("havip", Duration::from_secs(3)));
        assert!(matches!(a.command, Command::List { output: Some(ListOutput::Yaml) }));
        let a = parse(&["failover", "web", "--to", "b", "--force"]).unwrap();
        assert!(matches!(a.command, Command::Failover { force: true, to: Some(ref t), .. } if t == "b"));
        let a = parse(&["status"]).unwrap();
        assert_eq!(a.namespace, DEFAULT_NAMESPACE);
        assert_eq!(a.timeout, Duration::from_secs(15));
        assert!(matches!(a.command, Command::Status { pair: None, output: None }));
        let a = parse(&["completion", "zsh"]).unwrap();
        assert!(matches!(a.command, Command::Completion { shell: clap_complete::Shell::Zsh }));
    }

    #[test]
    fn invalid_arguments_are_usage_errors() {
        for bad in [
            &["status", "-o", "xml"][..],
            &["list", "-o", "text"],
            &["maintenance", "web", "a", "maybe"],
            &["failover"],
            &["--timeout", "soon", "status"],
            &["frobnicate"],
            &["completion", "tcsh"],
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.use_stderr(), "{bad:?}");
            assert_eq!(e.exit_code(), i32::from(exit::USAGE), "{bad:?}: clap's usage code is ours");
        }
    }

    #[test]
    fn completion_scripts_name_the_binary_and_its_commands() {
        for shell in [clap_complete::Shell::Bash, clap_complete::Shell::Zsh, clap_complete::Shell::Fish] {
            let s = String::from_utf8(completion_script(shell)).unwrap();
            assert!(s.contains("kubectl-havip"), "{shell}");
            for word in ["failover", "maintenance", "list", "status", "context", "completion"] {
                assert!(s.contains(word), "{shell} script lacks {word}");
            }
        }
    }

    #[test]
    fn the_help_lists_every_exit_code() {
        for (code, name) in exit::ALL {
            assert!(EXIT_CODES_HELP.contains(&format!("  {code}  {name}:")), "{code} {name}");
        }
    }

    #[test]
    fn outcomes_have_their_codes() {
        assert_eq!(Outcome::Done.exit_code(), 0);
        assert_eq!(Outcome::Refused.exit_code(), exit::REFUSED);
        assert_eq!(Outcome::Pending.exit_code(), exit::PENDING);
    }
}
