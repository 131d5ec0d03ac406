//! Duplicate-VIP detection while holding: anyone else answering for a held VIP.
//!
//! Its observer is a task are tasks that run probes for a pair and feed their verdicts to the
//! state machine as `sm::Input`s through the runtime's queue (`E` is the queue's event
//! type; observers know only the inputs they produce). It stops once the queue is
//! closed (the runtime's tasks are also aborted when it stops).

use super::l2::{ARP_WAIT, L2Port, unspecified_like};
use crate::sm;
use crate::timer::Timer;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Duplicate-VIP detection while holding: one ARP round this often.
const CONFLICT_PROBE_INTERVAL: Duration = Duration::from_secs(2);

/// Duplicate-VIP detection every 2 s while holding: any host that answers an ARP
/// request or a neighbour solicitation for a held VIP is a conflict (this host does not
/// answer its own requests).
pub fn spawn_conflict_watch<E: From<sm::Input> + Send + 'static>(
    targets: Vec<(sm::VipId, IpAddr, Arc<L2Port>)>,
    holding: Arc<AtomicBool>,
    tx: mpsc::Sender<E>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut timer = Timer::new();
        loop {
            timer.sleep(CONFLICT_PROBE_INTERVAL).await;
            if tx.is_closed() {
                return;
            }
            if !holding.load(Ordering::Relaxed) {
                continue;
            }
            for (vip, ip, port) in &targets {
                for mac in port.who_has(*ip, unspecified_like(*ip), ARP_WAIT).await {
                    tracing::warn!(vip = %ip, foreign_mac = %mac, "a foreign host answers for a held VIP");
                    let _ = tx.send(sm::Input::Conflict { vip: vip.clone(), foreign_mac: mac.octets() }.into()).await;
                }
            }
        }
    })
}
