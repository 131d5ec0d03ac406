//! Gateway (fence target) reachability by ARP or neighbour solicitation, with the
//! "never answered → check off" rule.
//!
//! Its observer is a task are tasks that run probes for a pair and feed their verdicts to the
//! state machine as `sm::Input`s through the runtime's queue (`E` is the queue's event
//! type; observers know only the inputs they produce). It stops once the queue is
//! closed (the runtime's tasks are also aborted when it stops).

use super::l2::{ARP_WAIT, L2Port};
use crate::sm;
use crate::timer::Timer;
use std::net::IpAddr;
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
    misses: u32,
}

impl GatewayTracker {
    /// Consecutive misses after which a gateway that answered before is unreachable.
    pub const MISSES: u32 = 3;

    /// Records one probe round (`answered`: some fence target answered) and returns
    /// the state machine's view: `None` = check off, `Some(reachable)`.
    pub fn observe(&mut self, answered: bool) -> Option<bool> {
        if answered {
            self.ever_answered = true;
            self.misses = 0;
        } else {
            self.misses = self.misses.saturating_add(1);
        }
        if !self.ever_answered { None } else { Some(self.misses < Self::MISSES) }
    }
}

/// A gateway or fence target probed by ARP or neighbour solicitation: (target, source
/// address, port).
pub type FenceProbe = (IpAddr, IpAddr, Arc<L2Port>);

/// Asks the fence targets every 500 ms (any answer means reachable) and sends the
/// [`GatewayTracker`]'s view whenever it changes.
pub fn spawn_gateway_watch<E: From<sm::Input> + Send + 'static>(
    targets: Vec<FenceProbe>,
    tx: mpsc::Sender<E>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut timer = Timer::new();
        let mut tracker = GatewayTracker::default();
        let mut last: Option<Option<bool>> = None;
        loop {
            let mut answered = false;
            for (target, src, port) in &targets {
                if !port.who_has(*target, *src, ARP_WAIT).await.is_empty() {
                    answered = true;
                    break;
                }
            }
            let view = tracker.observe(answered);
            if last != Some(view) {
                last = Some(view);
                if tx.send(sm::Input::Gateway { reachable: view }.into()).await.is_err() {
                    return;
                }
            }
            timer.sleep(GATEWAY_PROBE_INTERVAL).await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::GatewayTracker;

    #[test]
    fn gateway_never_answered_is_off_then_reachable_then_unreachable() {
        let mut g = GatewayTracker::default();
        assert_eq!(g.observe(false), None, "no answer ever: the check is off");
        assert_eq!(g.observe(false), None);
        assert_eq!(g.observe(true), Some(true));
        assert_eq!(g.observe(false), Some(true), "one miss is not yet unreachable");
        assert_eq!(g.observe(false), Some(true));
        assert_eq!(g.observe(false), Some(false), "three misses in a row");
        assert_eq!(g.observe(true), Some(true));
    }
}
