//! Completion for `kubectl havip <TAB>`.
//!
//! kubectl (1.26 and later) completes a plugin's arguments by running the executable
//! `kubectl_complete-<plugin>` with the words after the plugin name, the last one being
//! the word under completion (empty after a space), and reads the answer in the format
//! of cobra's `__complete` command: one candidate a line (`value<TAB>description`), then
//! `:<directive>` (4: no file names; 0: the shell's own file completion). The same
//! binary answers when it runs as `kubectl_complete-havip` (a link to it) or as
//! `kubectl-havip __complete WORDS…`.
//!
//! Commands, flags and fixed values come from the clap definition; pair names, member
//! nodes and kubeconfig contexts from the cluster and the kubeconfig (with a short
//! timeout; nothing is offered when they cannot be read).

use crate::cli::Args;
use crate::config::{self, ClientOptions};
use clap::{Arg, Command};
use havip_crds::HAPair;
use kube::api::{Api, ListParams};
use std::path::PathBuf;
use std::time::Duration;

/// The name kubectl runs for completion.
pub const COMPLETER: &str = "kubectl_complete-havip";
/// The hidden command that answers completion requests.
pub const COMPLETE_COMMAND: &str = "__complete";

/// Cobra's directive: complete nothing but the candidates.
pub const NO_FILE_COMP: u32 = 4;
/// Cobra's directive: let the shell complete file names.
pub const DEFAULT: u32 = 0;

/// A candidate and its description.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The value.
    pub value: String,
    /// What it is.
    pub help: Option<String>,
}

impl Candidate {
    fn new(value: impl Into<String>, help: Option<String>) -> Self {
        Self { value: value.into(), help }
    }
}

/// What the word under completion needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Need {
    /// These (subcommands, flags, fixed values).
    Fixed(Vec<Candidate>),
    /// HAPair names.
    Pairs,
    /// The member nodes of this pair.
    Members(String),
    /// Context names of the kubeconfig.
    Contexts,
    /// File names (the shell completes them).
    Files,
    /// Nothing to offer (a free value such as a duration).
    Nothing,
}

/// The analysis of a command line being completed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Analysis {
    /// What to offer.
    pub need: Need,
    /// The part of the current word before the value (`--output=`), put back in front
    /// of every candidate.
    pub prefix: String,
    /// The current word's value part: candidates must start with it.
    pub partial: String,
    /// `--kubeconfig` as given earlier on the line.
    pub kubeconfig: Option<String>,
    /// `--context` as given earlier on the line.
    pub context: Option<String>,
}

fn takes_value(a: &Arg) -> bool {
    a.get_action().takes_values()
}

fn fixed_values(a: &Arg) -> Need {
    let values: Vec<Candidate> = a
        .get_possible_values()
        .into_iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| Candidate::new(v.get_name(), v.get_help().map(|h| h.to_string())))
        .collect();
    if values.is_empty() { Need::Nothing } else { Need::Fixed(values) }
}

fn value_need(a: &Arg, positionals: &[String]) -> Need {
    match a.get_id().as_str() {
        "kubeconfig" => Need::Files,
        "context" => Need::Contexts,
        "to" | "node" => positionals.first().map(|p| Need::Members(p.clone())).unwrap_or(Need::Nothing),
        "pair" => Need::Pairs,
        _ => fixed_values(a),
    }
}

fn flags(cmd: &Command) -> Vec<Candidate> {
    let mut out = Vec::new();
    for a in cmd.get_arguments().filter(|a| !a.is_positional() && !a.is_hide_set()) {
        if let Some(l) = a.get_long() {
            out.push(Candidate::new(format!("--{l}"), a.get_help().map(|h| h.to_string())));
        }
    }
    out
}

fn subcommands(cmd: &Command) -> Vec<Candidate> {
    cmd.get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(|s| Candidate::new(s.get_name(), s.get_about().map(|h| h.to_string())))
        .collect()
}

/// Works out what the last of `words` (the words after `kubectl havip`) needs.
pub fn analyse(root: &Command, words: &[String]) -> Analysis {
    let mut root = root.clone();
    root.build();
    let (done, current) = match words.split_last() {
        Some((last, rest)) => (rest, last.as_str()),
        None => (&[][..], ""),
    };
    let mut cmd = &root;
    let mut positionals: Vec<String> = Vec::new();
    let mut pending: Option<Arg> = None;
    let mut only_positionals = false;
    let mut kubeconfig = None;
    let mut context = None;
    let mut remember = |id: &str, v: &str| match id {
        "kubeconfig" => kubeconfig = Some(v.to_owned()),
        "context" => context = Some(v.to_owned()),
        _ => {}
    };
    let mut unknown_command = false;
    for w in done {
        if let Some(a) = pending.take() {
            remember(a.get_id().as_str(), w);
            continue;
        }
        if !only_positionals && w == "--" {
            only_positionals = true;
            continue;
        }
        if !only_positionals && let Some(long) = w.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (long, None),
            };
            if let Some(a) = cmd.get_arguments().find(|a| a.get_long() == Some(name)) {
                match inline {
                    Some(v) => remember(a.get_id().as_str(), v),
                    None if takes_value(a) => pending = Some(a.clone()),
                    None => {}
                }
            }
            continue;
        }
        if !only_positionals && w.len() > 1 && w.starts_with('-') {
            for (i, c) in w[1..].char_indices() {
                let Some(a) = cmd.get_arguments().find(|a| a.get_short() == Some(c)) else { continue };
                if takes_value(a) {
                    let rest = &w[1 + i + c.len_utf8()..];
                    if rest.is_empty() {
                        pending = Some(a.clone());
                    } else {
                        remember(a.get_id().as_str(), rest.trim_start_matches('='));
                    }
                    break;
                }
            }
            continue;
        }
        if cmd.has_subcommands() {
            match cmd.find_subcommand(w) {
                Some(sub) => cmd = sub,
                None => unknown_command = true,
            }
            continue;
        }
        positionals.push(w.clone());
    }
    let analysis = |need, prefix: &str, partial: &str| Analysis {
        need,
        prefix: prefix.to_owned(),
        partial: partial.to_owned(),
        kubeconfig: kubeconfig.clone(),
        context: context.clone(),
    };
    if unknown_command {
        return analysis(Need::Nothing, "", current);
    }
    if let Some(a) = pending {
        return analysis(value_need(&a, &positionals), "", current);
    }
    if !only_positionals && current.starts_with('-') {
        if let Some((flag, partial)) = current.strip_prefix("--").and_then(|l| l.split_once('=')) {
            let need = cmd
                .get_arguments()
                .find(|a| a.get_long() == Some(flag))
                .map(|a| value_need(a, &positionals))
                .unwrap_or(Need::Nothing);
            return analysis(need, &format!("--{flag}="), partial);
        }
        return analysis(Need::Fixed(flags(cmd)), "", current);
    }
    if cmd.has_subcommands() {
        return analysis(Need::Fixed(subcommands(cmd)), "", current);
    }
    let need = match cmd.get_positionals().nth(positionals.len()) {
        Some(a) => value_need(a, &positionals),
        None => Need::Nothing,
    };
    analysis(need, "", current)
}

async fn client(a: &Analysis) -> Option<kube::Client> {
    let opts = ClientOptions {
        kubeconfig: a.kubeconfig.as_ref().map(PathBuf::from),
        context: a.context.clone(),
        connect_timeout: Some(Duration::from_secs(2)),
        read_timeout: Some(Duration::from_secs(2)),
    };
    config::client(&opts).await.ok().map(|(c, _)| c)
}

/// Resolves what the analysis needs (reading the cluster or kubeconfig when it must).
pub async fn candidates(a: &Analysis) -> (Vec<Candidate>, u32) {
    let limit = Duration::from_secs(3);
    let found = match &a.need {
        Need::Fixed(c) => c.clone(),
        Need::Files => return (Vec::new(), DEFAULT),
        Need::Nothing => Vec::new(),
        Need::Contexts => {
            let explicit = a.kubeconfig.as_ref().map(PathBuf::from);
            match config::load_kubeconfig(explicit.as_deref(), std::env::var_os("KUBECONFIG"), std::env::home_dir()) {
                Ok(Some(l)) => l
                    .kubeconfig
                    .contexts
                    .iter()
                    .map(|c| {
                        let cluster = c.context.as_ref().map(|x| x.cluster.clone()).filter(|x| !x.is_empty());
                        Candidate::new(c.name.clone(), cluster.map(|x| format!("cluster {x}")))
                    })
                    .collect(),
                _ => Vec::new(),
            }
        }
        Need::Pairs => {
            let list = async {
                let c = client(a).await?;
                Api::<HAPair>::all(c).list(&ListParams::default()).await.ok()
            };
            match tokio::time::timeout(limit, list).await {
                Ok(Some(l)) => l
                    .items
                    .iter()
                    .map(|p| {
                        let st = p.status.clone().unwrap_or_default();
                        let phase = st.phase.map(|x| x.as_str()).unwrap_or("Unknown");
                        let help = match st.active {
                            Some(active) => format!("{phase}, active {active}"),
                            None => phase.to_owned(),
                        };
                        Candidate::new(kube::ResourceExt::name_any(p), Some(help))
                    })
                    .collect(),
                _ => Vec::new(),
            }
        }
        Need::Members(pair) => {
            let get = async {
                let c = client(a).await?;
                Api::<HAPair>::all(c).get(pair).await.ok()
            };
            match tokio::time::timeout(limit, get).await {
                Ok(Some(p)) => {
                    let active = p.status.as_ref().and_then(|s| s.active.clone());
                    p.spec
                        .members
                        .iter()
                        .map(|m| {
                            let role = if active.as_deref() == Some(m.node.as_str()) { ", active" } else { "" };
                            Candidate::new(m.node.clone(), Some(format!("priority {}{role}", m.priority)))
                        })
                        .collect()
                }
                _ => Vec::new(),
            }
        }
    };
    (found, NO_FILE_COMP)
}

/// The answer in cobra's `__complete` format.
pub fn format(a: &Analysis, found: &[Candidate], directive: u32) -> String {
    let mut out = String::new();
    for c in found.iter().filter(|c| c.value.starts_with(&a.partial)) {
        out.push_str(&a.prefix);
        out.push_str(&c.value);
        if let Some(h) = c.help.as_deref().map(|h| h.lines().next().unwrap_or("").trim()).filter(|h| !h.is_empty()) {
            out.push('\t');
            out.push_str(h);
        }
        out.push('\n');
    }
    out.push_str(&format!(":{directive}\n"));
    out
}

/// Answers a completion request for `words` (the words after `kubectl havip`).
pub async fn complete(words: &[String]) -> String {
    let a = analyse(&<Args as clap::CommandFactory>::command(), words);
    let (found, directive) = candidates(&a).await;
    format(&a, &found, directive)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::{Analysis, NO_FILE_COMP, Need, analyse, complete, format};
    use crate::cli::Args;

    fn at(words: &[&str]) -> Analysis {
        let words: Vec<String> = words.iter().map(|s| (*s).to_owned()).collect();
        analyse(&<Args as clap::CommandFactory>::command(), &words)
    }

    fn values(n: &Need) -> Vec<String> {
        match n {
            Need::Fixed(c) => c.iter().map(|c| c.value.clone()).collect(),
            other => panic!("not fixed: {other:?}"),
        }
    }

    #[test]
    fn completes_commands_flags_and_values() {
        let top = values(&at(&[""]).need);
        for c in ["failover", "maintenance", "clear", "rotate-key", "resume-failback", "status", "list", "completion"] {
            assert!(top.contains(&c.to_owned()), "{c} in {top:?}");
        }
        let a = at(&["st"]);
        let text = format(
            &a,
            &match &a.need {
                Need::Fixed(c) => c.clone(),
                _ => unreachable!(),
            },
            NO_FILE_COMP,
        );
        assert!(text.starts_with("status\tShow one pair"), "{text}");
        assert!(text.ends_with(":4\n"), "{text}");

        let f = values(&at(&["status", "--"]).need);
        for flag in ["--output", "--context", "--kubeconfig", "--namespace", "--timeout"] {
            assert!(f.contains(&flag.to_owned()), "global and own flags: {f:?}");
        }
        assert_eq!(values(&at(&["status", "-o", ""]).need), ["json", "yaml"]);
        assert_eq!(values(&at(&["list", "--output", "j"]).need), ["wide", "json", "yaml"]);
        let a = at(&["list", "--output=y"]);
        assert_eq!((a.prefix.as_str(), a.partial.as_str()), ("--output=", "y"));
        assert_eq!(values(&at(&["completion", ""]).need).len(), 5);
        assert_eq!(values(&at(&["maintenance", "web", "n1", ""]).need), ["on", "off"]);
    }

    #[test]
    fn knows_where_pairs_nodes_contexts_and_files_go() {
        assert_eq!(at(&["failover", ""]).need, Need::Pairs);
        assert_eq!(at(&["--context", "x", "status", "w"]).need, Need::Pairs);
        assert_eq!(at(&["maintenance", "web", ""]).need, Need::Members("web".into()));
        assert_eq!(at(&["failover", "web", "--to", ""]).need, Need::Members("web".into()));
        assert_eq!(at(&["failover", "web", "--force", ""]).need, Need::Nothing, "one pair only");
        assert_eq!(at(&["--context", ""]).need, Need::Contexts);
        assert_eq!(at(&["status", "--kubeconfig", ""]).need, Need::Files);
        assert_eq!(at(&["status", "--timeout", ""]).need, Need::Nothing);
        assert_eq!(at(&["nope", ""]).need, Need::Nothing);
        let a = at(&["--kubeconfig=/k", "--context", "prod", "-n", "havip", "failover", ""]);
        assert_eq!(a.need, Need::Pairs);
        assert_eq!((a.kubeconfig.as_deref(), a.context.as_deref()), (Some("/k"), Some("prod")));
    }

    #[tokio::test]
    async fn answers_in_cobras_format() {
        let text = complete(&["list".to_owned(), "-o".to_owned(), "w".to_owned()]).await;
        assert_eq!(
            text.lines().collect::<Vec<_>>(),
            ["wide\tThe table with STANDBY, the last move (FROM→TO) and its time", ":4"]
        );
        let text = complete(&["--kubeconfig".to_owned(), String::new()]).await;
        assert_eq!(text, ":0\n", "the shell completes file names");
    }
}
