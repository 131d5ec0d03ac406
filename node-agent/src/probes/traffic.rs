//! The traffic of the VIP interfaces, sampled for the failback quiet window.
//!
//! Its observer is a task are tasks that run probes for a pair and feed their verdicts to the
//! state machine as `sm::Input`s through the runtime's queue (`E` is the queue's event
//! type; observers know only the inputs they produce). It stops once the queue is
//! closed (the runtime's tasks are also aborted when it stops).

use crate::sm;
use crate::timer::Timer;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Traffic is sampled this often.
const TRAFFIC_SAMPLE_INTERVAL: Duration = Duration::from_secs(2);

/// Bytes per second over some interfaces, from `/sys/class/net/<if>/statistics`.
pub struct TrafficSampler {
    ifaces: Vec<String>,
    last: Option<(Instant, u64)>,
}

impl TrafficSampler {
    /// Samples the sum of rx+tx bytes of `ifaces`.
    pub fn new(ifaces: Vec<String>) -> Self {
        Self { ifaces, last: None }
    }

    fn total(&self) -> Option<u64> {
        let mut sum = 0u64;
        for i in &self.ifaces {
            for dir in ["rx_bytes", "tx_bytes"] {
                let s = std::fs::read_to_string(format!("/sys/class/net/{i}/statistics/{dir}")).ok()?;
                sum = sum.saturating_add(s.trim().parse::<u64>().ok()?);
            }
        }
        Some(sum)
    }

    /// The rate since the previous call (`None`: unknown — first call or unreadable).
    pub fn sample(&mut self) -> Option<u64> {
        let now = Instant::now();
        let total = self.total();
        let out = match (self.last, total) {
            (Some((t0, b0)), Some(b1)) if b1 >= b0 => {
                let secs = now.duration_since(t0).as_secs_f64();
                (secs > 0.0).then(|| ((b1 - b0) as f64 / secs) as u64)
            }
            _ => None,
        };
        self.last = total.map(|b| (now, b));
        out
    }
}

/// Samples the traffic of the VIP interfaces every 2 s (the failback quiet window).
pub fn spawn_traffic_sampler<E: From<sm::Input> + Send + 'static>(
    ifaces: Vec<String>,
    tx: mpsc::Sender<E>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut timer = Timer::new();
        let mut sampler = TrafficSampler::new(ifaces);
        loop {
            let bps = sampler.sample();
            if tx.send(sm::Input::Traffic { bytes_per_sec: bps }.into()).await.is_err() {
                return;
            }
            timer.sleep(TRAFFIC_SAMPLE_INTERVAL).await;
        }
    })
}
