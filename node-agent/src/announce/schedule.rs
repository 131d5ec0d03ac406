//! The announcement schedule of a held VIP set (a burst, repeats past the ARP locktime,
//! a periodic refresh) and the gate that holds announcements back after a stall.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Holds announcements back after the agent was stalled (SIGSTOP, a VM pause, a long
/// scheduling delay). A stalled active may have been taken over meanwhile: the peer's
/// newer epoch sits in the socket buffer, unread. Announcing before reading it would
/// pull the clients back to a member that is about to drop the VIP. So once the runtime
/// sees a gap between its ticks (or an announcement finds the runtime has not ticked
/// for that long), announcements wait a settle time in which the queued inputs are
/// processed; a member that still holds the VIPs then announces.
#[derive(Debug)]
pub struct AnnounceGate {
    origin: tokio::time::Instant,
    /// A gap longer than this between two ticks of the runtime is a stall.
    stall_ms: u64,
    /// How long announcements wait after a stall.
    settle_ms: u64,
    last_tick_ms: std::sync::atomic::AtomicU64,
    blocked_until_ms: std::sync::atomic::AtomicU64,
}

impl AnnounceGate {
    /// A gate for a runtime that ticks every `tick`: a gap of `tick + stall` is a stall,
    /// after which announcements wait `settle`.
    pub fn new(tick: Duration, stall: Duration, settle: Duration) -> Arc<Self> {
        Arc::new(Self {
            origin: tokio::time::Instant::now(),
            stall_ms: (tick + stall).as_millis() as u64,
            settle_ms: settle.as_millis() as u64,
            last_tick_ms: std::sync::atomic::AtomicU64::new(0),
            blocked_until_ms: std::sync::atomic::AtomicU64::new(0),
        })
    }

    fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    /// If the runtime has not ticked for longer than the stall bound, block
    /// announcements for the settle time; returns the gap when it did.
    fn check(&self, now: u64) -> Option<Duration> {
        let gap = now.saturating_sub(self.last_tick_ms.load(Ordering::Relaxed));
        if gap > self.stall_ms {
            self.blocked_until_ms.fetch_max(now + self.settle_ms, Ordering::Relaxed);
            return Some(Duration::from_millis(gap));
        }
        None
    }

    /// Called by the runtime on every tick; returns the length of a stall that ended
    /// just now (announcements are held back for the settle time).
    pub fn tick(&self) -> Option<Duration> {
        let now = self.now_ms();
        let stalled = self.check(now);
        self.last_tick_ms.store(now, Ordering::Relaxed);
        stalled
    }

    /// Whether announcements are held back now.
    pub fn blocked(&self) -> bool {
        let now = self.now_ms();
        self.check(now);
        now < self.blocked_until_ms.load(Ordering::Relaxed)
    }

    /// Waits until announcements may go out.
    pub async fn cleared(&self) {
        loop {
            let now = self.now_ms();
            self.check(now);
            let until = self.blocked_until_ms.load(Ordering::Relaxed);
            if now >= until {
                return;
            }
            tokio::time::sleep(Duration::from_millis(until - now)).await;
        }
    }
}

/// Runs the announcement schedule of a held VIP set: for a burst, `burst` announcements
/// now and `repeats` more spaced past the ARP locktime; for a refresh, one; then one per
/// refresh interval until the task is aborted (the VIPs were removed). `send(n)` sends
/// `n` announcements of every VIP. Nothing is sent while the gate holds announcements
/// back, nor once `holding` turned false.
pub fn spawn_schedule(
    kind: crate::sm::AnnounceKind,
    sched: crate::config::AnnounceSchedule,
    gate: Arc<AnnounceGate>,
    holding: Arc<AtomicBool>,
    send: impl Fn(u32) + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // Waits for the gate; whether the VIPs are still held.
        let cleared = || async {
            gate.cleared().await;
            holding.load(Ordering::Relaxed)
        };
        let first = match kind {
            crate::sm::AnnounceKind::Burst => sched.burst,
            crate::sm::AnnounceKind::Refresh => 1,
        };
        if !cleared().await {
            return;
        }
        send(first);
        if kind == crate::sm::AnnounceKind::Burst {
            for _ in 0..sched.repeats {
                tokio::time::sleep(sched.repeat_interval).await;
                if !cleared().await {
                    return;
                }
                send(1);
            }
        }
        if sched.refresh_interval.is_zero() {
            return;
        }
        loop {
            tokio::time::sleep(sched.refresh_interval).await;
            if !cleared().await {
                return;
            }
            send(1);
        }
    })
}

#[cfg(test)]
mod schedule_tests {
    use super::{AnnounceGate, spawn_schedule};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::time::Duration;

    fn sched() -> crate::config::AnnounceSchedule {
        crate::config::AnnounceSchedule {
            mode: havip_crds::AnnounceMode::L2,
            burst: 3,
            repeats: 2,
            repeat_interval: Duration::from_millis(1100),
            refresh_interval: Duration::ZERO,
            unicast: false,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stall_holds_announcements_back_until_the_settle_time_passed() {
        let gate = AnnounceGate::new(Duration::from_millis(20), Duration::from_millis(150), Duration::from_millis(250));
        let holding = Arc::new(AtomicBool::new(true));
        let sent = Arc::new(AtomicU32::new(0));
        let s = sent.clone();
        // A runtime that ticks every 20 ms.
        let g = gate.clone();
        let ticker = tokio::spawn(async move {
            loop {
                g.tick();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        let task = spawn_schedule(crate::sm::AnnounceKind::Burst, sched(), gate.clone(), holding.clone(), move |n| {
            s.fetch_add(n, Ordering::Relaxed);
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(sent.load(Ordering::Relaxed), 3, "the burst goes out at once");
        assert!(!gate.blocked());
        // The whole process stalls for 2 s (the runtime does not tick; time passes):
        // the first repeat is overdue when it resumes.
        ticker.abort();
        tokio::time::advance(Duration::from_millis(2000)).await;
        tokio::task::yield_now().await;
        assert_eq!(sent.load(Ordering::Relaxed), 3, "no announcement right after the stall");
        assert!(gate.blocked(), "the gate noticed the stall");
        // The runtime resumes ticking and, reading the queued inputs, learns that it lost
        // the VIPs.
        let g = gate.clone();
        let _ticker = tokio::spawn(async move {
            loop {
                g.tick();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        holding.store(false, Ordering::Relaxed);
        for _ in 0..15 {
            tokio::time::advance(Duration::from_millis(20)).await;
            tokio::task::yield_now().await;
        }
        assert_eq!(sent.load(Ordering::Relaxed), 3, "a member that gave the VIPs up never announces them");
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        assert!(task.is_finished(), "the schedule ends with the holding");
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_stall_a_member_that_still_holds_the_vips_announces_after_the_settle_time() {
        let gate = AnnounceGate::new(Duration::from_millis(20), Duration::from_millis(150), Duration::from_millis(250));
        assert_eq!(gate.tick(), None);
        tokio::time::advance(Duration::from_millis(1000)).await;
        let stall = gate.tick().expect("a 1 s gap is a stall");
        assert!(stall >= Duration::from_millis(1000));
        assert!(gate.blocked());
        let holding = Arc::new(AtomicBool::new(true));
        let sent = Arc::new(AtomicU32::new(0));
        let s = sent.clone();
        let _task = spawn_schedule(crate::sm::AnnounceKind::Refresh, sched(), gate.clone(), holding, move |n| {
            s.fetch_add(n, Ordering::Relaxed);
        });
        tokio::task::yield_now().await;
        assert_eq!(sent.load(Ordering::Relaxed), 0);
        // The runtime keeps ticking through the settle time.
        for _ in 0..15 {
            tokio::time::advance(Duration::from_millis(20)).await;
            gate.tick();
            tokio::task::yield_now().await;
        }
        assert_eq!(sent.load(Ordering::Relaxed), 1, "announced once the settle time passed");
    }
}
