//! A one-shot timer on a `timerfd`, for the agent's periodic work.
//!
//! Tokio's timer wheel keeps a deadline more than 64 ms away on a coarser level and wakes
//! the thread when that level's slot comes up, to move it down — one or two wakeups
//! before the real one. An idle agent's timers are mostly 100 ms to 2 s away, so about
//! half its wakeups were those. A timerfd fires once, at the deadline. Re-arming it is
//! one system call, much cheaper than a wakeup.

use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;

struct Fd(TimerFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// A one-shot timer on `CLOCK_MONOTONIC` (the clock of [`Instant`]); tokio's timer where
/// no timerfd can be had.
pub struct Timer {
    fd: Option<AsyncFd<Fd>>,
    /// The deadline the timerfd is armed for.
    armed: Option<Instant>,
}

impl Timer {
    /// A disarmed timer.
    pub fn new() -> Timer {
        let fd = TimerFd::new(ClockId::CLOCK_MONOTONIC, TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC)
            .map_err(std::io::Error::from)
            // `AsyncFd::new` is deprecated in favour of an `unsafe` constructor (this crate
            // forbids unsafe code) because a registration could outlive a descriptor it
            // does not own; here the `AsyncFd` owns the timerfd, so it cannot.
            .and_then(|fd| {
                #[allow(deprecated)]
                AsyncFd::new(Fd(fd))
            });
        match fd {
            Ok(fd) => Timer { fd: Some(fd), armed: None },
            Err(e) => {
                tracing::warn!(error = %e, "failed to create a timerfd; using tokio's timer (more wakeups)");
                Timer { fd: None, armed: None }
            }
        }
    }

    /// Waits until `deadline` (returns at once when it has passed). Cancel-safe: a wait
    /// dropped before its deadline leaves the timer armed, and the next wait re-arms it.
    pub async fn sleep_until(&mut self, deadline: Instant) {
        loop {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            let Some(fd) = self.fd.as_ref() else {
                tokio::time::sleep_until(deadline.into()).await;
                return;
            };
            if self.armed != Some(deadline) {
                // Relative to now: `Instant` does not expose its clock value. A timerfd
                // never fires early, so the deadline is always reached when it fires.
                let left = TimeSpec::from_duration((deadline - now).max(Duration::from_nanos(1)));
                if let Err(e) = fd.get_ref().0.set(Expiration::OneShot(left), TimerSetTimeFlags::empty()) {
                    tracing::warn!(error = %e, "failed to arm a timerfd; using tokio's timer from now on");
                    self.fd = None;
                    continue;
                }
                self.armed = Some(deadline);
            }
            match fd.readable().await {
                Ok(mut ready) => {
                    // Read the expiration count (clears readiness); `WouldBlock`: a stale readiness.
                    let mut buf = [0u8; 8];
                    let _ = ready
                        .try_io(|fd| nix::unistd::read(fd.get_ref().0.as_fd(), &mut buf).map_err(std::io::Error::from));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "a timerfd failed; using tokio's timer from now on");
                    self.fd = None;
                }
            }
        }
    }

    /// Waits for `d`.
    pub async fn sleep(&mut self, d: Duration) {
        self.sleep_until(Instant::now() + d).await
    }

    /// Waits until the next multiple of `every` since the agent's start ([`origin`]):
    /// periodic work of different pairs that shares this grid runs in one wakeup (and can
    /// share what it sends: one gateway request for every pair).
    pub async fn sleep_on_grid(&mut self, every: Duration) {
        self.sleep_until(next_on_grid(Instant::now(), every)).await
    }
}

/// The instant the agent counts its periodic work from: every pair's state machine clock
/// and the grids of [`Timer::sleep_on_grid`].
pub fn origin() -> Instant {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// The first multiple of `every` since [`origin`] after `now`.
pub fn next_on_grid(now: Instant, every: Duration) -> Instant {
    let o = origin();
    let every_ns = every.as_nanos().max(1);
    let since = now.saturating_duration_since(o).as_nanos();
    let next = (since / every_ns + 1) * every_ns;
    o + Duration::from_nanos(u64::try_from(next).unwrap_or(u64::MAX))
}

impl Default for Timer {
    fn default() -> Self {
        Timer::new()
    }
}

#[cfg(test)]
mod tests {
    use super::Timer;
    use std::time::{Duration, Instant};

    #[tokio::test]
    async fn it_fires_at_the_deadline_not_before() {
        let mut t = Timer::new();
        assert!(t.fd.is_some(), "no timerfd");
        for ms in [1u64, 30, 5] {
            let start = Instant::now();
            t.sleep(Duration::from_millis(ms)).await;
            let took = start.elapsed();
            assert!(took >= Duration::from_millis(ms), "a {ms} ms sleep returned after {took:?}");
            assert!(took < Duration::from_millis(ms + 500), "a {ms} ms sleep took {took:?}");
        }
    }

    #[test]
    fn grid_points_are_multiples_of_the_period_after_now() {
        let o = super::origin();
        let every = Duration::from_millis(500);
        for ms in [0u64, 1, 499, 500, 501, 12_345] {
            let now = o + Duration::from_millis(ms);
            let next = super::next_on_grid(now, every);
            assert!(next > now && next <= now + every, "{ms}: {:?}", next - o);
            assert_eq!((next - o).as_nanos() % every.as_nanos(), 0, "{ms}: on the grid");
        }
    }

    #[tokio::test]
    async fn a_dropped_wait_does_not_disturb_the_next() {
        let mut t = Timer::new();
        assert!(t.fd.is_some(), "no timerfd");
        // Armed for 5 ms, abandoned after 1 ms; it fires meanwhile.
        let _ = tokio::time::timeout(Duration::from_millis(1), t.sleep(Duration::from_millis(5))).await;
        std::thread::sleep(Duration::from_millis(10));
        let start = Instant::now();
        t.sleep(Duration::from_millis(20)).await;
        assert!(start.elapsed() >= Duration::from_millis(20), "a stale expiry ended the next wait early");
        // A deadline in the past returns at once.
        t.sleep_until(Instant::now()).await;
    }
}
