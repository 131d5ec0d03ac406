//! Watch plumbing the controllers share: one watch per kind feeding its store and
//! fanning out trigger streams through filters (`drive`), the managed-fields trim of
//! cached objects, and the logging of a controller's results. Decides nothing about
//! any object.

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::{self, Event};
use std::collections::HashMap;

/// Drops `metadata.managedFields` from an object before it is cached (the operator
/// never reads them; they are most of a small object's size).
pub(crate) fn drop_managed_fields<K: Resource>(o: &mut K) {
    o.meta_mut().managed_fields = None;
}

/// Which watch events of a resource trigger reconciles (one filter per consumer).
pub(crate) enum Filter<K, T> {
    /// Every object applied (its controller's primary stream: deletions are not
    /// reconciled, owner references and the periodic resync clean up).
    Applied,
    /// Every object touched (applied or deleted).
    Touched,
    /// Only objects appearing, disappearing, or changing `key(object)`. Used for Nodes
    /// (key: addresses — kubelets update Node status every few seconds, which must
    /// trigger nothing) and for HAPairs in the FloatingIP controller (key: none — only
    /// existence matters there).
    Changed(Box<dyn Fn(&K) -> T + Send + Sync>),
}

impl<K: Resource, T: PartialEq> Filter<K, T> {
    /// Whether an applied object triggers; `seen` holds the keys of [`Filter::Changed`].
    fn admits_applied(&self, o: &K, seen: &mut HashMap<String, T>) -> bool {
        let Filter::Changed(key) = self else { return true };
        let k = key(o);
        let name = o.meta().name.clone().unwrap_or_default();
        if seen.get(&name) == Some(&k) {
            return false;
        }
        seen.insert(name, k);
        true
    }

    /// Whether a deleted object triggers (its key is forgotten either way).
    fn admits_deleted(&self, o: &K, seen: &mut HashMap<String, T>) -> bool {
        seen.remove(o.meta().name.as_deref().unwrap_or_default());
        !matches!(self, Filter::Applied)
    }
}

/// A stream of objects that trigger reconciles.
pub(crate) type Triggers<K> = futures::stream::BoxStream<'static, Result<K, watcher::Error>>;

/// Drives a watch (already `.reflect`ed into its store) in a task of its own, and
/// forwards the objects that should trigger reconciles to each consumer through a
/// channel of its own, one per filter, in the filters' order (a kind is watched once,
/// however many controllers it triggers). A watch error goes to the first consumer only.
///
/// The stores the reconciles read are thus kept up to date (and become ready)
/// independently of how the controllers poll their trigger streams: a reconcile that
/// waits for every store can never wait on a stream only its own controller drives.
pub(crate) fn drive<K, T, const N: usize>(
    stream: impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    filters: [Filter<K, T>; N],
    ready: tokio::sync::watch::Sender<bool>,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) -> [Triggers<K>; N]
where
    K: Resource + Clone + Send + 'static,
    K::DynamicType: Default,
    T: PartialEq + Send + 'static,
{
    let mut outputs = Vec::with_capacity(N);
    let streams = filters.map(|filter| {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<K, watcher::Error>>(1024);
        outputs.push((filter, tx, HashMap::<String, T>::new()));
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) }).boxed()
    });
    tasks.push(tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(Event::Apply(o) | Event::InitApply(o)) => {
                    for (filter, tx, seen) in &mut outputs {
                        if filter.admits_applied(&o, seen) {
                            let _ = tx.send(Ok(o.clone())).await;
                        }
                    }
                }
                Ok(Event::Delete(o)) => {
                    for (filter, tx, seen) in &mut outputs {
                        if filter.admits_deleted(&o, seen) {
                            let _ = tx.send(Ok(o.clone())).await;
                        }
                    }
                }
                Ok(Event::Init) => {}
                Ok(Event::InitDone) => {
                    tracing::debug!(kind = %K::kind(&Default::default()), "initial list done");
                    ready.send_replace(true);
                }
                Err(e) => {
                    if let Some((_, tx, _)) = outputs.first() {
                        let _ = tx.send(Err(e)).await;
                    }
                }
            }
            if outputs.iter().all(|(_, tx, _)| tx.is_closed()) {
                break;
            }
        }
    }));
    streams
}

pub(crate) fn log_result<K: Resource, E: std::fmt::Display>(
    controller: &'static str,
    res: Result<(ObjectRef<K>, Action), kube::runtime::controller::Error<E, watcher::Error>>,
) {
    use kube::runtime::controller::Error as CE;
    match res {
        Ok((obj, _)) => tracing::trace!(controller, object = %obj.name, "reconciled"),
        // Already counted and logged by the error policy.
        Err(CE::ReconcilerFailed(..)) => {}
        Err(CE::ObjectNotFound(obj)) => tracing::debug!(controller, object = %obj.name, "object gone"),
        Err(e) => tracing::warn!(controller, error = %e, "controller stream error"),
    }
}
