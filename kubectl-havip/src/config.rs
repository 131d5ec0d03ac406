//! Which cluster the plugin talks to, as kubectl chooses it: `--kubeconfig` (only that
//! file), else `KUBECONFIG` (several files, merged: the first to set a value wins;
//! files that do not exist are skipped), else `~/.kube/config`, else the in-cluster
//! configuration (a pod's service account). `--context` picks a context of the
//! kubeconfig instead of its `current-context`.

use crate::error::{Identity, PluginError};
use crate::target::Target;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the client configuration comes from and which context to use.
#[derive(Clone, Debug, Default)]
pub struct ClientOptions {
    /// `--kubeconfig`.
    pub kubeconfig: Option<PathBuf>,
    /// `--context`.
    pub context: Option<String>,
    /// Bounds connecting to the API server.
    pub connect_timeout: Option<Duration>,
    /// Bounds waiting for the API server's next bytes of an answer (an API server whose
    /// etcd is down holds a request for its own 60 s timeout).
    pub read_timeout: Option<Duration>,
}

/// A kubeconfig read from files, with where it came from.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// The (merged) kubeconfig.
    pub kubeconfig: Kubeconfig,
    /// The file(s) it was read from, for messages.
    pub source: String,
}

/// Reads the kubeconfig kubectl would read: `explicit` (`--kubeconfig`), else the
/// files of `env` (`KUBECONFIG`), else `home/.kube/config`; `None` when there is none
/// (then the in-cluster configuration applies).
pub fn load_kubeconfig(
    explicit: Option<&Path>,
    env: Option<OsString>,
    home: Option<PathBuf>,
) -> Result<Option<Loaded>, PluginError> {
    let read = |p: &Path| {
        Kubeconfig::read_from(p)
            .map_err(|e| PluginError::Config(format!("cannot read kubeconfig {}: {e}", p.display())))
    };
    if let Some(p) = explicit {
        return Ok(Some(Loaded { kubeconfig: read(p)?, source: p.display().to_string() }));
    }
    if let Some(value) = env {
        let paths: Vec<PathBuf> =
            std::env::split_paths(&value).filter(|p| !p.as_os_str().is_empty() && p.exists()).collect();
        if !paths.is_empty() {
            let mut merged = Kubeconfig::default();
            for p in &paths {
                merged = merged.merge(read(p)?).map_err(|e| {
                    PluginError::Config(format!("cannot merge kubeconfig {} (KUBECONFIG): {e}", p.display()))
                })?;
            }
            let source = paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
            return Ok(Some(Loaded { kubeconfig: merged, source }));
        }
    }
    if let Some(p) = home.map(|h| h.join(".kube").join("config")).filter(|p| p.exists()) {
        return Ok(Some(Loaded { kubeconfig: read(&p)?, source: p.display().to_string() }));
    }
    Ok(None)
}

/// The context to use: `--context`, else the kubeconfig's `current-context`; an error
/// naming the contexts there are when neither names one of them.
pub fn pick_context(loaded: &Loaded, wanted: Option<&str>) -> Result<String, PluginError> {
    let names: Vec<&str> = loaded.kubeconfig.contexts.iter().map(|c| c.name.as_str()).collect();
    let known = if names.is_empty() { "it has none".to_owned() } else { format!("it has {}", names.join(", ")) };
    match wanted {
        Some(c) if names.contains(&c) => Ok(c.to_owned()),
        Some(c) => {
            Err(PluginError::Config(format!("context {c:?} not found in kubeconfig {}; {known}", loaded.source)))
        }
        None => match loaded.kubeconfig.current_context.as_deref().filter(|c| !c.is_empty()) {
            Some(c) if names.contains(&c) => Ok(c.to_owned()),
            Some(c) => Err(PluginError::Config(format!(
                "the current context {c:?} of kubeconfig {} does not exist; {known} (pass --context)",
                loaded.source
            ))),
            None => Err(PluginError::Config(format!(
                "kubeconfig {} sets no current context; pass --context ({known})",
                loaded.source
            ))),
        },
    }
}

/// The client configuration and its [`Target`].
pub async fn config(opts: &ClientOptions) -> Result<(kube::Config, Target), PluginError> {
    let loaded = load_kubeconfig(opts.kubeconfig.as_deref(), std::env::var_os("KUBECONFIG"), std::env::home_dir())?;
    let (mut config, target) = match loaded {
        Some(loaded) => {
            let context = pick_context(&loaded, opts.context.as_deref())?;
            let options = KubeConfigOptions { context: Some(context.clone()), ..KubeConfigOptions::default() };
            let config = kube::Config::from_custom_kubeconfig(loaded.kubeconfig, &options).await.map_err(|e| {
                PluginError::Config(format!("context {context:?} of kubeconfig {}: {e}", loaded.source))
            })?;
            let target =
                Target { server: config.cluster_url.to_string(), context: Some(context), source: loaded.source };
            (config, target)
        }
        None => {
            if let Some(c) = &opts.context {
                return Err(PluginError::Config(format!(
                    "--context {c:?}: no kubeconfig found (no --kubeconfig, KUBECONFIG names no existing file, no ~/.kube/config)"
                )));
            }
            let config = kube::Config::incluster().map_err(|e| {
                PluginError::Config(format!(
                    "no kubeconfig found (no --kubeconfig, KUBECONFIG names no existing file, no ~/.kube/config) and no in-cluster configuration: {e}"
                ))
            })?;
            let target = Target {
                server: config.cluster_url.to_string(),
                context: None,
                source: "the in-cluster configuration".to_owned(),
            };
            (config, target)
        }
    };
    if let Some(t) = opts.connect_timeout {
        config.connect_timeout = Some(t);
    }
    if let Some(t) = opts.read_timeout {
        config.read_timeout = Some(t);
    }
    Ok((config, target))
}

/// A client for `opts`, and its [`Target`].
pub async fn client(opts: &ClientOptions) -> Result<(kube::Client, Target), PluginError> {
    let (config, target) = config(opts).await?;
    let client = kube::Client::try_from(config)
        .map_err(|e| PluginError::Config(format!("cannot build a client for {}: {e}", target.describe())))?;
    Ok((client, target))
}

/// Who the API server says this client is (a SelfSubjectReview, which every
/// authenticated user may create); `None` when it does not say within 3 s.
pub async fn who_am_i(client: &kube::Client) -> Option<Identity> {
    let api: Api<SelfSubjectReview> = Api::all(client.clone());
    let review =
        tokio::time::timeout(Duration::from_secs(3), api.create(&PostParams::default(), &SelfSubjectReview::default()))
            .await
            .ok()?
            .ok()?;
    let info = review.status?.user_info?;
    Some(Identity { user: info.username?, groups: info.groups.unwrap_or_default() })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::{ClientOptions, config, load_kubeconfig, pick_context};
    use std::ffi::OsString;
    use std::time::Duration;

    fn kubeconfig(current: &str, contexts: &[(&str, &str)]) -> String {
        let mut s = String::from("apiVersion: v1\nkind: Config\nclusters:\n");
        for (name, server) in contexts {
            s.push_str(&format!("- name: {name}\n  cluster: {{server: \"{server}\"}}\n"));
        }
        s.push_str("users:\n- name: u\n  user: {token: t}\ncontexts:\n");
        for (name, _) in contexts {
            s.push_str(&format!("- name: {name}\n  context: {{cluster: {name}, user: u}}\n"));
        }
        if !current.is_empty() {
            s.push_str(&format!("current-context: {current}\n"));
        }
        s
    }

    #[test]
    fn explicit_wins_then_the_env_files_merge_then_home() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        std::fs::write(&a, kubeconfig("one", &[("one", "https://1.example:6443")])).unwrap();
        std::fs::write(&b, kubeconfig("two", &[("two", "https://2.example:6443")])).unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir_all(home.join(".kube")).unwrap();
        std::fs::write(home.join(".kube/config"), kubeconfig("h", &[("h", "https://h.example:6443")])).unwrap();
        let env = std::env::join_paths([&a, &dir.path().join("missing"), &b]).unwrap();

        let l = load_kubeconfig(Some(&b), Some(env.clone()), Some(home.clone())).unwrap().unwrap();
        assert_eq!(pick_context(&l, None).unwrap(), "two", "--kubeconfig wins over KUBECONFIG");

        let l = load_kubeconfig(None, Some(env), Some(home.clone())).unwrap().unwrap();
        assert_eq!(pick_context(&l, None).unwrap(), "one", "the first file's current-context");
        assert_eq!(pick_context(&l, Some("two")).unwrap(), "two", "contexts of both files");
        assert!(!l.source.contains("missing"), "a missing file is skipped: {}", l.source);

        let l = load_kubeconfig(None, Some(OsString::new()), Some(home.clone())).unwrap().unwrap();
        assert_eq!(pick_context(&l, None).unwrap(), "h", "an empty KUBECONFIG reads ~/.kube/config");
        let only_missing = dir.path().join("nope").into_os_string();
        let l = load_kubeconfig(None, Some(only_missing), Some(home)).unwrap().unwrap();
        assert_eq!(pick_context(&l, None).unwrap(), "h");

        assert!(load_kubeconfig(None, None, Some(dir.path().join("nohome"))).unwrap().is_none(), "in-cluster next");
    }

    #[test]
    fn unknown_or_missing_contexts_are_configuration_errors() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, kubeconfig("", &[("one", "https://1.example:6443"), ("two", "https://2.example:6443")]))
            .unwrap();
        let l = load_kubeconfig(Some(&a), None, None).unwrap().unwrap();
        let e = pick_context(&l, Some("three")).unwrap_err();
        assert_eq!(e.exit_code(), crate::error::exit::CONFIG);
        assert!(e.to_string().contains("\"three\" not found") && e.to_string().contains("one, two"), "{e}");
        let e = pick_context(&l, None).unwrap_err();
        assert!(e.to_string().contains("no current context"), "{e}");
        let broken = dir.path().join("broken");
        std::fs::write(&broken, "clusters: [").unwrap();
        let e = load_kubeconfig(Some(&broken), None, None).unwrap_err();
        assert_eq!(e.exit_code(), crate::error::exit::CONFIG);
        assert!(e.to_string().contains("broken"), "{e}");
    }

    #[tokio::test]
    async fn the_context_selects_the_server() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, kubeconfig("one", &[("one", "https://1.example:6443"), ("two", "https://2.example:6443")]))
            .unwrap();
        let opts = ClientOptions {
            kubeconfig: Some(a.clone()),
            context: Some("two".into()),
            connect_timeout: None,
            read_timeout: None,
        };
        let (_, t) = config(&opts).await.unwrap();
        assert_eq!(t.server, "https://2.example:6443/");
        assert_eq!(t.context.as_deref(), Some("two"));
        let opts = ClientOptions {
            kubeconfig: Some(a),
            context: None,
            connect_timeout: Some(Duration::from_secs(3)),
            read_timeout: Some(Duration::from_secs(8)),
        };
        let (c, t) = config(&opts).await.unwrap();
        assert_eq!(t.server, "https://1.example:6443/");
        assert_eq!(c.connect_timeout, Some(Duration::from_secs(3)));
        assert_eq!(c.read_timeout, Some(Duration::from_secs(8)));
    }
}
