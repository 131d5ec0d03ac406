//! At SIGTERM: is the agent being uninstalled from this node (its VIPs must go), or only
//! restarted (a rolling update, a deleted pod, a reboot: the next agent adopts them)?
//!
//! Removing every VIP of the node is an outage for every pair it serves, so only
//! positive evidence that the agent will not come back counts: its DaemonSet read as
//! gone (NotFound), being deleted (a deletionTimestamp), or no longer selecting this
//! node — from a read at SIGTERM, or, when that read fails, from the agent's watch of its
//! DaemonSet, which saw the deletion before anything else of the installation was
//! removed (`helm uninstall` deletes the DaemonSet first, then the RBAC objects and the
//! ServiceAccount while the pods are still terminating: by SIGTERM the token may no
//! longer authenticate). An error by itself — 401, 403, a timeout, a 5xx — is no such
//! evidence: a rotated token, an RBAC mistake or an API outage must not take every VIP of
//! the node down. [`decide`] is the decision, free of I/O; the agent feeds it.

use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// What a read of the agent's DaemonSet at SIGTERM returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DaemonSetRead {
    /// It exists.
    Found {
        /// It has a deletionTimestamp.
        deleting: bool,
        /// Its pod template's nodeSelector still matches this node's labels (`None`: the
        /// node's labels are not known, so it cannot be told).
        selects_node: Option<bool>,
    },
    /// The API server answered 404.
    NotFound,
    /// Any other outcome (an API error with its code, a transport error, a timeout).
    Failed(String),
}

/// The last state the agent's watch of its DaemonSet saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Watched {
    /// Nothing yet (the watch has not listed, or never could).
    #[default]
    Unknown,
    /// The DaemonSet exists.
    Present {
        /// It has a deletionTimestamp.
        deleting: bool,
    },
    /// A delete event, or a list that did not contain it.
    Gone,
}

impl Watched {
    /// The state after a list or an update that shows `ds`.
    pub fn of(ds: &DaemonSet) -> Watched {
        Watched::Present { deleting: ds.metadata.deletion_timestamp.is_some() }
    }
}

/// What to do at SIGTERM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Departure {
    /// The agent leaves the node for good: remove every VIP (why, for the log).
    Uninstall(String),
    /// The next agent takes over: keep the VIPs. `warning`: the read failed, and what
    /// to tell the user (the VIPs stay on a guess they may not want, so it is a warning).
    Stay {
        /// Why the decision was made without a successful read, if it was.
        warning: Option<String>,
    },
}

/// The decision for the DaemonSet `name`, from the read at SIGTERM and what the watch
/// saw last. A successful read decides; a failed one defers to the watch, and only its
/// positive evidence (gone, or being deleted) means an uninstall.
pub fn decide(name: &str, read: &DaemonSetRead, watched: Watched) -> Departure {
    match read {
        DaemonSetRead::NotFound => Departure::Uninstall(format!("DaemonSet {name} is gone")),
        DaemonSetRead::Found { deleting: true, .. } => {
            Departure::Uninstall(format!("DaemonSet {name} is being deleted"))
        }
        DaemonSetRead::Found { selects_node: Some(false), .. } => {
            Departure::Uninstall(format!("DaemonSet {name} no longer selects this node (nodeSelector)"))
        }
        DaemonSetRead::Found { .. } => Departure::Stay { warning: None },
        DaemonSetRead::Failed(error) => match watched {
            Watched::Gone => Departure::Uninstall(format!(
                "DaemonSet {name} was deleted (seen by the agent's watch; reading it now failed: {error})"
            )),
            Watched::Present { deleting: true } => Departure::Uninstall(format!(
                "DaemonSet {name} is being deleted (seen by the agent's watch; reading it now failed: {error})"
            )),
            Watched::Present { deleting: false } | Watched::Unknown => Departure::Stay {
                warning: Some(format!(
                    "cannot read DaemonSet {name} ({error}) and nothing showed it deleted: keeping the VIPs for the \
                     next agent (if this was an uninstall, remove them by hand: `ip address show` lists them with \
                     the label <interface>:hv)"
                )),
            },
        },
    }
}

/// Whether a pod template's `selector` (its nodeSelector) matches a node's `labels`.
pub fn selects(selector: Option<&BTreeMap<String, String>>, labels: &BTreeMap<String, String>) -> bool {
    selector.is_none_or(|sel| sel.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// The agent's watch of its own DaemonSet (by name): what it saw last, for [`decide`]
/// when the read at SIGTERM fails. Aborted when dropped.
pub struct DaemonSetWatch {
    seen: Arc<Mutex<Watched>>,
    task: tokio::task::JoinHandle<()>,
}

impl DaemonSetWatch {
    /// Starts watching DaemonSet `name` in `namespace` (RBAC: get, list and watch of that
    /// one name; the list and the watch select it with a `metadata.name` field selector).
    pub fn start(client: Client, namespace: &str, name: &str) -> DaemonSetWatch {
        let seen = Arc::new(Mutex::new(Watched::Unknown));
        let api: Api<DaemonSet> = Api::namespaced(client, namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let (state, name) = (seen.clone(), name.to_owned());
        let task = tokio::spawn(async move {
            let stream = watcher(api, config).default_backoff();
            let mut stream = std::pin::pin!(stream);
            // Whether the list in progress contained the DaemonSet.
            let mut listed = false;
            let mut failing = false;
            while let Some(ev) = stream.next().await {
                let next = match ev {
                    Ok(watcher::Event::Init) => {
                        listed = false;
                        continue;
                    }
                    Ok(watcher::Event::InitApply(ds)) => {
                        listed = true;
                        Watched::of(&ds)
                    }
                    Ok(watcher::Event::InitDone) if listed => continue,
                    Ok(watcher::Event::InitDone) | Ok(watcher::Event::Delete(_)) => Watched::Gone,
                    Ok(watcher::Event::Apply(ds)) => Watched::of(&ds),
                    Err(e) => {
                        // The decision at SIGTERM does not need it (a read comes first):
                        // a debug line while it fails, as the watcher retries.
                        if !std::mem::replace(&mut failing, true) {
                            tracing::debug!(daemonset = %name, error = %e, "watch of the agent's DaemonSet failed; retrying");
                        }
                        continue;
                    }
                };
                failing = false;
                let before = match state.lock() {
                    Ok(mut s) => std::mem::replace(&mut *s, next),
                    Err(poisoned) => std::mem::replace(&mut *poisoned.into_inner(), next),
                };
                if before != next {
                    match next {
                        Watched::Gone => {
                            tracing::info!(daemonset = %name, "the agent's DaemonSet is gone: at SIGTERM this agent removes its VIPs (an uninstall), unless the DaemonSet is back by then")
                        }
                        Watched::Present { deleting: true } => {
                            tracing::info!(daemonset = %name, "the agent's DaemonSet is being deleted: at SIGTERM this agent removes its VIPs (an uninstall)")
                        }
                        Watched::Present { deleting: false } | Watched::Unknown => {
                            tracing::debug!(daemonset = %name, "the agent's DaemonSet is present")
                        }
                    }
                }
            }
        });
        DaemonSetWatch { seen, task }
    }

    /// What the watch saw last.
    pub fn seen(&self) -> Watched {
        match self.seen.lock() {
            Ok(s) => *s,
            Err(poisoned) => *poisoned.into_inner(),
        }
    }
}

impl Drop for DaemonSetWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::{DaemonSetRead, Departure, Watched, decide, selects};
    use std::collections::BTreeMap;

    const NAME: &str = "havip-agent";

    fn found(deleting: bool, selects_node: Option<bool>) -> DaemonSetRead {
        DaemonSetRead::Found { deleting, selects_node }
    }

    fn failed(e: &str) -> DaemonSetRead {
        DaemonSetRead::Failed(e.to_owned())
    }

    fn uninstall(d: &Departure) -> bool {
        matches!(d, Departure::Uninstall(_))
    }

    #[test]
    fn only_positive_evidence_means_an_uninstall() {
        use Watched::{Gone, Present, Unknown};
        let present = Present { deleting: false };
        let deleting = Present { deleting: true };
        // (read, watched, uninstall?)
        let table = [
            // A read decides, whatever the watch saw.
            (DaemonSetRead::NotFound, Unknown, true),
            (DaemonSetRead::NotFound, present, true),
            (found(true, Some(true)), present, true),
            (found(true, None), Unknown, true),
            (found(false, Some(false)), present, true),
            (found(false, Some(true)), present, false),
            (found(false, Some(true)), Gone, false), // re-created since the watch saw it go
            (found(false, None), Unknown, false),    // node labels unknown: no guess
            // A failed read: only what the watch saw deleted counts.
            (failed("401 Unauthorized"), Unknown, false),
            (failed("403 Forbidden"), Unknown, false),
            (failed("403 Forbidden"), present, false),
            (failed("500 etcdserver: request timed out"), present, false),
            (failed("timed out after 5 s"), Unknown, false),
            (failed("error trying to connect: connection refused"), present, false),
            (failed("401 Unauthorized"), Gone, true),
            (failed("403 Forbidden"), deleting, true),
            (failed("timed out after 5 s"), Gone, true),
        ];
        for (read, watched, want) in table {
            let d = decide(NAME, &read, watched);
            assert_eq!(uninstall(&d), want, "{read:?} with the watch at {watched:?}: {d:?}");
        }
    }

    #[test]
    fn a_failed_read_that_keeps_the_vips_warns_and_says_why() {
        let d = decide(NAME, &failed("403 Forbidden"), Watched::Unknown);
        let Departure::Stay { warning: Some(w) } = d else { panic!("{d:?}") };
        assert!(w.contains("403 Forbidden") && w.contains("keeping the VIPs"), "{w}");
        // A successful read that keeps them is no warning.
        assert_eq!(decide(NAME, &found(false, Some(true)), Watched::Unknown), Departure::Stay { warning: None });
        // The reasons name the evidence.
        let Departure::Uninstall(why) = decide(NAME, &failed("401 Unauthorized"), Watched::Gone) else { panic!() };
        assert!(why.contains("was deleted") && why.contains("watch") && why.contains("401"), "{why}");
        let Departure::Uninstall(why) = decide(NAME, &DaemonSetRead::NotFound, Watched::Unknown) else { panic!() };
        assert_eq!(why, "DaemonSet havip-agent is gone");
    }

    #[test]
    fn a_node_selector_matches_when_every_entry_is_a_label_of_the_node() {
        let labels: BTreeMap<String, String> =
            [("kubernetes.io/os", "linux"), ("role", "edge")].map(|(k, v)| (k.to_owned(), v.to_owned())).into();
        let sel = |e: &[(&str, &str)]| -> BTreeMap<String, String> {
            e.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
        };
        assert!(selects(None, &labels));
        assert!(selects(Some(&sel(&[])), &labels));
        assert!(selects(Some(&sel(&[("role", "edge")])), &labels));
        assert!(!selects(Some(&sel(&[("role", "core")])), &labels));
        assert!(!selects(Some(&sel(&[("zone", "a")])), &labels));
    }
}
