//! Leader election between operator replicas on a Lease (`havip-operator` in the
//! operator namespace), by compare-and-swap on its `resourceVersion`.
//!
//! A follower takes the Lease when it has no holder, or when its record (resource
//! version) has not changed for `leaseDuration` as measured on the follower's own
//! clock (no comparison of clocks between machines). The leader renews every
//! `renewInterval`; when it cannot renew for `renewDeadline` (less than the lease
//! duration) or finds another holder, it stops its controllers at once — before a
//! follower may take over. On shutdown it releases the Lease so that a follower
//! takes over without waiting.
//!
//! By hand, not a kube-rs community crate: `kube-leader-election` (which also takes the
//! Lease with a merge patch no `resourceVersion` guards) and `kube-lease-manager` (with a
//! tolerated skew) judge expiry by comparing the Lease's `renewTime` with the local clock.

use crate::Error;
use crate::metrics::Metrics;
use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Leader-election settings.
#[derive(Clone, Debug)]
pub struct LeaderConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This replica's identity.
    pub identity: String,
    /// How long a silent leader keeps the Lease.
    pub lease_duration: Duration,
    /// How often the leader renews.
    pub renew_interval: Duration,
    /// The leader steps down when it could not renew for this long.
    pub renew_deadline: Duration,
}

/// One replica's view of the election.
pub struct LeaderElector {
    api: Api<Lease>,
    cfg: LeaderConfig,
    observed: Option<(String, Instant)>,
}

fn secs(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

impl LeaderElector {
    /// An elector on `cfg.namespace/cfg.name`.
    pub fn new(client: kube::Client, cfg: LeaderConfig) -> Self {
        Self { api: Api::namespaced(client, &cfg.namespace), cfg, observed: None }
    }

    fn err(&self, op: &'static str) -> impl FnOnce(kube::Error) -> Error + '_ {
        move |source| Error::LeaderLease {
            op,
            namespace: self.cfg.namespace.clone(),
            name: self.cfg.name.clone(),
            source: Box::new(source),
        }
    }

    /// Takes or renews the Lease; `Ok(true)` when this replica holds it now.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, Error> {
        let now = MicroTime(Timestamp::now());
        let pp = PostParams { field_manager: Some(havip_crds::manager::OPERATOR.to_owned()), ..PostParams::default() };
        let Some(current) = self.api.get_opt(&self.cfg.name).await.map_err(self.err("read"))? else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.cfg.name.clone()), ..ObjectMeta::default() },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.cfg.identity.clone()),
                    lease_duration_seconds: Some(secs(self.cfg.lease_duration)),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&pp, &lease).await {
                Ok(_) => Ok(true),
                Err(e) if crate::error::is_status(&e, 409) => Ok(false),
                Err(e) => Err(self.err("acquire")(e)),
            };
        };
        let spec = current.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let mine = holder.as_deref() == Some(self.cfg.identity.as_str());
        let rv = current.metadata.resource_version.clone().unwrap_or_default();
        if !mine && holder.is_some() {
            let duration = spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map(Duration::from_secs)
                .unwrap_or(self.cfg.lease_duration);
            match &self.observed {
                Some((seen, at)) if *seen == rv => {
                    if at.elapsed() < duration {
                        return Ok(false);
                    }
                }
                _ => {
                    self.observed = Some((rv, Instant::now()));
                    return Ok(false);
                }
            }
            tracing::info!(previous = ?holder, "the leader's Lease expired; taking over");
        }
        let mut lease = current;
        lease.metadata.managed_fields = None;
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(self.cfg.identity.clone()),
            lease_duration_seconds: Some(secs(self.cfg.lease_duration)),
            acquire_time: if mine { spec.acquire_time.clone() } else { Some(now.clone()) },
            renew_time: Some(now),
            lease_transitions: Some(spec.lease_transitions.unwrap_or(0) + i32::from(!mine)),
            ..spec
        });
        match self.api.replace(&self.cfg.name, &pp, &lease).await {
            Ok(_) => Ok(true),
            Err(e) if crate::error::is_status(&e, 409) => Ok(false),
            Err(e) => Err(self.err(if mine { "renew" } else { "acquire" })(e)),
        }
    }

    /// Gives the Lease up (if this replica holds it).
    pub async fn release(&mut self) -> Result<(), Error> {
        let Some(mut lease) = self.api.get_opt(&self.cfg.name).await.map_err(self.err("read"))? else {
            return Ok(());
        };
        let spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.cfg.identity.as_str()) {
            return Ok(());
        }
        lease.metadata.managed_fields = None;
        lease.spec = Some(LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..spec
        });
        let pp = PostParams { field_manager: Some(havip_crds::manager::OPERATOR.to_owned()), ..PostParams::default() };
        self.api.replace(&self.cfg.name, &pp, &lease).await.map_err(self.err("release"))?;
        Ok(())
    }
}

/// Runs `work` while this replica leads, until `shutdown` turns true. `work` gets a
/// receiver that turns true for a graceful stop; on a lost Lease it is aborted at
/// once (and `leader` cleared first, so that no write leaves after that).
pub async fn run<F>(
    client: kube::Client,
    cfg: LeaderConfig,
    metrics: Arc<Metrics>,
    leader: Arc<AtomicBool>,
    mut shutdown: watch::Receiver<bool>,
    work: F,
) -> Result<(), Error>
where
    F: Fn(watch::Receiver<bool>) -> BoxFuture<'static, ()>,
{
    let mut elector = LeaderElector::new(client, cfg.clone());
    loop {
        // Follow until the Lease is ours.
        loop {
            if *shutdown.borrow() {
                return Ok(());
            }
            match elector.try_acquire_or_renew().await {
                Ok(true) => {
                    metrics.set_ready();
                    break;
                }
                Ok(false) => metrics.set_ready(),
                Err(e) => {
                    metrics.error(&e);
                    tracing::warn!(error = %e, "leader election");
                }
            }
            tokio::select! {
                _ = shutdown.wait_for(|v| *v) => return Ok(()),
                () = tokio::time::sleep(cfg.renew_interval) => {}
            }
        }
        tracing::info!(identity = %cfg.identity, lease = %cfg.name, "became the leader");
        leader.store(true, Ordering::SeqCst);
        metrics.leader.set(1);
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut task = tokio::spawn(work(stop_rx));
        let mut last_renew = Instant::now();
        let outcome = loop {
            tokio::select! {
                _ = shutdown.wait_for(|v| *v) => break Outcome::Shutdown,
                res = &mut task => {
                    break Outcome::WorkEnded(res.err().map(|e| e.to_string()));
                }
                () = tokio::time::sleep(cfg.renew_interval) => {
                    // A hanging request must not keep a leader that cannot renew: the
                    // attempt gets only what is left of the renew deadline.
                    let left = cfg.renew_deadline.saturating_sub(last_renew.elapsed()).max(Duration::from_millis(100));
                    let attempt = tokio::time::timeout(left, elector.try_acquire_or_renew())
                        .await
                        .unwrap_or_else(|_| Err(Error::RenewTimeout { seconds: left.as_secs_f64() }));
                    match attempt {
                        Ok(true) => last_renew = Instant::now(),
                        Ok(false) => break Outcome::Lost("another replica holds the Lease".to_owned()),
                        Err(e) => {
                            metrics.error(&e);
                            tracing::warn!(error = %e, since = ?last_renew.elapsed(), "failed to renew the leader Lease");
                            if last_renew.elapsed() >= cfg.renew_deadline {
                                break Outcome::Lost(format!("no renewal for {:?}", last_renew.elapsed()));
                            }
                        }
                    }
                }
            }
        };
        match outcome {
            Outcome::Lost(why) => {
                leader.store(false, Ordering::SeqCst);
                metrics.leader.set(0);
                task.abort();
                tracing::warn!(reason = %why, "lost leadership; controllers stopped");
            }
            Outcome::Shutdown => {
                let _ = stop_tx.send(true);
                if tokio::time::timeout(Duration::from_secs(10), &mut task).await.is_err() {
                    tracing::warn!("controllers did not stop within 10 s; aborting them");
                    task.abort();
                }
                leader.store(false, Ordering::SeqCst);
                metrics.leader.set(0);
                match elector.release().await {
                    Ok(()) => tracing::info!(lease = %cfg.name, "released the leader Lease"),
                    Err(e) => tracing::warn!(error = %e, "failed to release the leader Lease"),
                }
                return Ok(());
            }
            Outcome::WorkEnded(panic) => {
                leader.store(false, Ordering::SeqCst);
                metrics.leader.set(0);
                let _ = elector.release().await;
                tracing::error!(panic = ?panic, "controllers ended unexpectedly");
                return Err(Error::Watch { kind: "controllers", message: panic.unwrap_or_else(|| "ended".to_owned()) });
            }
        }
    }
}

enum Outcome {
    Shutdown,
    Lost(String),
    WorkEnded(Option<String>),
}
