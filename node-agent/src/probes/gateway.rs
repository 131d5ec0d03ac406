//! Gateway (fence target) reachability by ARP or neighbour solicitation, with the
//! "never answered → check off" rule, and the node's memory of the fence targets that did
//! answer ([`GatewayMemory`]), which keeps that rule from switching the check off when an
//! agent restarts while its node hears nothing.
//!
//! Its observer is a task that runs probes for a pair and feed their verdicts to the
//! state machine as `sm::Input`s through the runtime's queue (`E` is the queue's event
//! type; observers know only the inputs they produce). It stops once the queue is
//! closed (the runtime's tasks are also aborted when it stops).

use super::l2::{ARP_WAIT, L2Port};
use crate::sm;
use crate::timer::Timer;
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Gateway (fence target) probes: one ARP round this often.
const GATEWAY_PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// Gateway reachability with the "never answered → check off" rule.
#[derive(Debug, Default, Clone)]
pub struct GatewayTracker {
    ever_answered: bool,
    /// A fence target answered this tracker (not only an earlier run or watch).
    heard: bool,
    misses: u32,
}

impl GatewayTracker {
    /// Consecutive misses after which a gateway that answered before is unreachable.
    pub const MISSES: u32 = 3;

    /// A tracker that starts knowing whether a fence target answered before (from this
    /// node, by an earlier run of the agent: [`GatewayMemory`]).
    pub fn remembering(answered_before: bool) -> Self {
        Self { ever_answered: answered_before, heard: false, misses: 0 }
    }

    /// Records one probe round (`answered`: some fence target answered) and returns
    /// the state machine's view: `None` = check off, `Some(reachable)`; or nothing to say
    /// yet (the outer `None`): a target answered before, but not this tracker, and fewer
    /// than [`GatewayTracker::MISSES`] rounds have gone unanswered. A tracker is new at
    /// every start and reconfiguration (the watch restarts); saying "reachable" before it
    /// heard anything unfenced a member whose link still dropped every frame towards it the
    /// moment its pair's timings were edited (the seventh 60-minute chaos run). The state
    /// machine keeps its previous view meanwhile.
    pub fn observe(&mut self, answered: bool) -> Option<Option<bool>> {
        if answered {
            self.ever_answered = true;
            self.heard = true;
            self.misses = 0;
        } else {
            self.misses = self.misses.saturating_add(1);
        }
        if !self.ever_answered {
            return Some(None);
        }
        let reachable = self.misses < Self::MISSES;
        (self.heard || !reachable).then_some(Some(reachable))
    }
}

/// The fence targets that answered from this node, remembered across restarts in the
/// agent's state directory (`fence-targets-answered.json`, a JSON list of addresses; one
/// file per node, shared by its pairs). Without it an agent restarted while its node
/// receives nothing on the fence target's link (a cable that drops every frame towards
/// the node) would never hear the gateway, so the "never answered → check off" rule would
/// turn the check off, and the standby could take the VIPs over a link it cannot serve on
/// (the third 60-minute chaos run, beta-vip at 2,528 s). A target that ever answered keeps
/// the check on; a network whose gateway never answers ARP keeps it off, as before. A
/// file that cannot be read counts as "nothing remembered" (the rule as before).
#[derive(Clone, Debug, Default)]
pub struct GatewayMemory {
    path: Option<PathBuf>,
}

impl GatewayMemory {
    /// The file's name in the state directory.
    pub const FILE: &'static str = "fence-targets-answered.json";

    /// The memory kept in `dir` (the agent's state directory).
    pub fn in_dir(dir: &Path) -> Self {
        Self { path: Some(dir.join(Self::FILE)) }
    }

    /// What is remembered (nothing when the file is missing or unreadable).
    pub fn load(&self) -> BTreeSet<IpAddr> {
        let Some(path) = &self.path else { return BTreeSet::new() };
        std::fs::read_to_string(path).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default()
    }

    /// Whether one of `targets` answered before.
    pub fn answered_before(&self, targets: &[IpAddr]) -> bool {
        let known = self.load();
        targets.iter().any(|t| known.contains(t))
    }

    /// Remembers that `target` answered (an atomic replace of the file; a no-op when it is
    /// known already).
    pub fn remember(&self, target: IpAddr) -> std::io::Result<()> {
        let Some(path) = &self.path else { return Ok(()) };
        let mut known = self.load();
        if !known.insert(target) {
            return Ok(());
        }
        let text = serde_json::to_vec(&known).map_err(std::io::Error::other)?;
        crate::state::write_atomic(path, &text)
    }
}

/// A gateway or fence target probed by ARP or neighbour solicitation: (target, source
/// address, port).
pub type FenceProbe = (IpAddr, IpAddr, Arc<L2Port>);

/// Asks the fence targets every 500 ms, on the agent's grid (any answer means reachable), and sends the
/// [`GatewayTracker`]'s view whenever it changes.
pub fn spawn_gateway_watch<E: From<sm::Input> + Send + 'static>(
    targets: Vec<FenceProbe>,
    memory: GatewayMemory,
    tx: mpsc::Sender<E>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut timer = Timer::new();
        let addrs: Vec<IpAddr> = targets.iter().map(|(t, _, _)| *t).collect();
        let mut tracker = GatewayTracker::remembering(memory.answered_before(&addrs));
        let mut remembered = memory.load();
        let mut last: Option<Option<bool>> = None;
        loop {
            let mut answered = false;
            for (target, src, port) in &targets {
                if !port.who_has_shared(*target, *src, ARP_WAIT).await.is_empty() {
                    answered = true;
                    if !remembered.contains(target) {
                        match memory.remember(*target) {
                            Ok(()) => {
                                remembered.insert(*target);
                            }
                            Err(e) => {
                                tracing::warn!(%target, error = %e, "failed to remember that the fence target answered")
                            }
                        }
                    }
                    break;
                }
            }
            let Some(view) = tracker.observe(answered) else {
                timer.sleep_on_grid(GATEWAY_PROBE_INTERVAL).await;
                continue;
            };
            if last != Some(view) {
                last = Some(view);
                if tx.send(sm::Input::Gateway { reachable: view }.into()).await.is_err() {
                    return;
                }
            }
            // On the agent's grid: every pair's watch asks at the same moment, and the
            // port sends one request for all of them (`L2Port::who_has`).
            timer.sleep_on_grid(GATEWAY_PROBE_INTERVAL).await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::{GatewayMemory, GatewayTracker};
    use std::net::IpAddr;

    #[test]
    fn gateway_never_answered_is_off_then_reachable_then_unreachable() {
        let mut g = GatewayTracker::default();
        assert_eq!(g.observe(false), Some(None), "no answer ever: the check is off");
        assert_eq!(g.observe(false), Some(None));
        assert_eq!(g.observe(true), Some(Some(true)));
        assert_eq!(g.observe(false), Some(Some(true)), "one miss is not yet unreachable");
        assert_eq!(g.observe(false), Some(Some(true)));
        assert_eq!(g.observe(false), Some(Some(false)), "three misses in a row");
        assert_eq!(g.observe(true), Some(Some(true)));
    }

    /// A tracker starts afresh at every start and reconfiguration: with a target that
    /// answered before it says nothing — the state machine keeps what it knew, a fenced
    /// member stays fenced — until a target answers it or three rounds went unanswered.
    /// (It said "reachable" after its first unanswered round, which unfenced a member whose
    /// link still dropped every frame towards it: the seventh 60-minute chaos run.)
    #[test]
    fn a_fresh_tracker_claims_no_reachability_before_an_answer() {
        let mut g = GatewayTracker::remembering(true);
        assert_eq!(g.observe(false), None, "remembered, not heard: nothing to say yet");
        assert_eq!(g.observe(false), None);
        assert_eq!(g.observe(false), Some(Some(false)), "three misses: unreachable, not off");
        assert_eq!(g.observe(true), Some(Some(true)), "an answer: reachable");
        assert_eq!(g.observe(false), Some(Some(true)), "heard now: one miss is not yet unreachable");
        let mut g = GatewayTracker::remembering(true);
        assert_eq!(g.observe(true), Some(Some(true)), "answered at once: reachable at once");
        let mut g = GatewayTracker::remembering(false);
        assert_eq!(g.observe(false), Some(None), "nothing remembered: off, as before");
    }

    #[test]
    fn the_memory_survives_in_its_file_and_a_bad_file_remembers_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let m = GatewayMemory::in_dir(dir.path());
        let gw: IpAddr = "10.0.0.1".parse().expect("ip");
        let other: IpAddr = "fd00::1".parse().expect("ip");
        assert!(!m.answered_before(&[gw]));
        m.remember(gw).expect("remember");
        m.remember(gw).expect("again: a no-op");
        let again = GatewayMemory::in_dir(dir.path());
        assert!(again.answered_before(&[other, gw]), "a new run reads it");
        assert!(!again.answered_before(&[other]));
        again.remember(other).expect("remember");
        assert_eq!(GatewayMemory::in_dir(dir.path()).load().len(), 2);
        std::fs::write(dir.path().join(GatewayMemory::FILE), "{not json").expect("corrupt");
        assert!(!GatewayMemory::in_dir(dir.path()).answered_before(&[gw]), "unreadable: nothing remembered");
        assert!(!GatewayMemory::default().answered_before(&[gw]), "no directory: nothing");
    }
}
