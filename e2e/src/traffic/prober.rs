//! The [`Prober`]: a new TCP connection to an address every few milliseconds from a
//! namespace, recording who answered and when nobody did; and [`probe_once`] and
//! [`probe_stream`], the same probes in the current namespace.

use super::error::{Result, TrafficError};
use super::report::{Probe, ProbeError, ProbeReport, ms_between};
use crate::host::netns::{NetnsError, NetnsThread, Topology, run_in_netns};
use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Prober settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ProberConfig {
    /// The address to connect to, usually `VIP:port`.
    pub target: SocketAddr,
    /// Cadence: a probe starts at every multiple of this after the start (5 ms).
    pub interval: Duration,
    /// Connect timeout (50 ms).
    pub connect_timeout: Duration,
    /// Time allowed for the name to arrive after connecting (50 ms).
    pub read_timeout: Duration,
    /// Probes that may be in flight at once (1, the default: one after the other). With
    /// more, a probe starts at every slot even while earlier ones wait out their
    /// timeouts, so that a gap ends within one cadence (5 ms) of service returning
    /// instead of within one connect timeout (50 ms): a probe that started into a dead
    /// path no longer holds the next one back. The benchmarks' setting
    /// ([`ProberConfig::overlapping`]); the suites keep one at a time.
    pub in_flight: usize,
}

impl ProberConfig {
    /// The defaults: every 5 ms, 50 ms connect and read timeouts.
    pub fn new(target: SocketAddr) -> Self {
        Self {
            target,
            interval: Duration::from_millis(5),
            connect_timeout: Duration::from_millis(50),
            read_timeout: Duration::from_millis(50),
            in_flight: 1,
        }
    }

    /// Overlapping probes: enough in flight that a probe starts at every slot although
    /// each may wait out both timeouts (`(connect + read timeout) / interval + 2`).
    pub fn overlapping(mut self) -> Self {
        let busy = (self.connect_timeout + self.read_timeout).as_nanos();
        let per = self.interval.as_nanos().max(1);
        self.in_flight = usize::try_from(busy.div_ceil(per)).unwrap_or(64).saturating_add(2).min(64);
        self
    }

    /// Sets the cadence.
    pub fn interval(mut self, d: Duration) -> Self {
        self.interval = d;
        self
    }

    /// Sets the connect timeout.
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Sets the read timeout.
    pub fn read_timeout(mut self, d: Duration) -> Self {
        self.read_timeout = d;
        self
    }
}

#[derive(Debug, Default)]
struct Live {
    ok: AtomicU64,
    failed: AtomicU64,
    last: Mutex<Option<String>>,
}

/// Probes a TCP address from a namespace at a fixed cadence until stopped.
///
/// Probes are scheduled by absolute deadlines (`start + n × interval`): a slow
/// probe does not shift later ones; when a probe overruns, the slot that is due
/// runs at once and the ones that passed entirely are skipped and counted in
/// [`ProbeReport::missed_slots`].
#[derive(Debug)]
pub struct Prober {
    stop: Arc<AtomicBool>,
    thread: Option<NetnsThread<ProbeReport>>,
    live: Arc<Live>,
    ns: String,
    epoch: Instant,
}

impl Prober {
    /// Starts probing from namespace `ns`.
    pub fn start(ns: &str, config: ProberConfig) -> Result<Self> {
        if config.interval.is_zero()
            || config.connect_timeout.is_zero()
            || config.read_timeout.is_zero()
            || config.in_flight == 0
        {
            return Err(TrafficError::Invalid(format!("zero durations or no probe in flight in {config:?}")));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let live = Arc::new(Live::default());
        let (stop2, live2) = (stop.clone(), live.clone());
        let epoch = Instant::now();
        let thread = run_in_netns(ns, move || {
            if config.in_flight > 1 {
                probe_loop_overlapping(&config, epoch, &stop2, &live2)
            } else {
                probe_loop_with(&config, epoch, &stop2, &live2, &mut |_| {})
            }
        })?;
        Ok(Self { stop, thread: Some(thread), live, ns: ns.to_owned(), epoch })
    }

    /// Starts `n` probers from `ns` with the same settings, their cadences spread evenly
    /// over one interval (prober `k` starts `k × interval / n` after the first): `n`
    /// concurrent clients.
    pub fn start_many(ns: &str, config: &ProberConfig, n: usize) -> Result<Vec<Self>> {
        let mut out = Vec::with_capacity(n);
        let step = config.interval / u32::try_from(n.max(1)).unwrap_or(u32::MAX);
        let first = Instant::now();
        for k in 0..n {
            // A phase offset, not synchronisation: the cadences must not coincide.
            let due = first + step * u32::try_from(k).unwrap_or(u32::MAX);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            out.push(Self::start(ns, config.clone())?);
        }
        Ok(out)
    }

    /// The instant its report's times count from (`start_ms` 0).
    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// `t` in the report's time base: ms since [`Prober::epoch`] (negative before it).
    pub fn ms_at(&self, t: Instant) -> f64 {
        ms_between(self.epoch, t)
    }

    /// Starts probing `target` from the topology's client with the default settings.
    pub fn on_client(topo: &Topology, target: SocketAddr) -> Result<Self> {
        Self::start(&topo.client().ns, ProberConfig::new(target))
    }

    /// Successful probes so far.
    pub fn ok_count(&self) -> u64 {
        self.live.ok.load(Ordering::SeqCst)
    }

    /// Failed probes so far.
    pub fn failed_count(&self) -> u64 {
        self.live.failed.load(Ordering::SeqCst)
    }

    /// Who answered the latest successful probe.
    pub fn last_responder(&self) -> Option<String> {
        self.live.last.lock().map(|g| g.clone()).unwrap_or_default()
    }

    /// Waits until a probe is answered by `name`; returns how long that took.
    pub fn wait_for_responder(&self, name: &str, timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        loop {
            if self.last_responder().as_deref() == Some(name) {
                return Ok(start.elapsed());
            }
            if start.elapsed() >= timeout {
                return Err(TrafficError::Timeout {
                    what: format!("a probe answered by {name} (last: {:?})", self.last_responder()),
                    timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Waits until at least `n` probes in total have succeeded.
    pub fn wait_until_ok(&self, n: u64, timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        loop {
            if self.ok_count() >= n {
                return Ok(start.elapsed());
            }
            if start.elapsed() >= timeout {
                return Err(TrafficError::Timeout {
                    what: format!("{n} successful probes (have {})", self.ok_count()),
                    timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Waits until `n` more probes have failed than when called.
    pub fn wait_for_failures(&self, n: u64, timeout: Duration) -> Result<Duration> {
        let start = Instant::now();
        let base = self.failed_count();
        loop {
            if self.failed_count() >= base + n {
                return Ok(start.elapsed());
            }
            if start.elapsed() >= timeout {
                return Err(TrafficError::Timeout { what: format!("{n} failed probes"), timeout });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Stops probing and returns the report.
    pub fn stop(mut self) -> Result<ProbeReport> {
        self.stop.store(true, Ordering::SeqCst);
        match self.thread.take() {
            Some(t) => Ok(t.join()?),
            None => Err(TrafficError::Netns(NetnsError::Panicked { ns: self.ns.clone() })),
        }
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Probes `config.target` from the current network namespace until `stop` is set,
/// handing every probe to `each` as it completes (the `e2e-tool probe` of the kind
/// suite streams them as JSON lines).
pub fn probe_stream(config: &ProberConfig, stop: &AtomicBool, each: &mut dyn FnMut(&Probe)) -> ProbeReport {
    probe_loop_with(config, Instant::now(), stop, &Live::default(), each)
}

fn probe_loop_with(
    config: &ProberConfig,
    start: Instant,
    stop: &AtomicBool,
    live: &Live,
    each: &mut dyn FnMut(&Probe),
) -> ProbeReport {
    let ms = |t: Instant| t.duration_since(start).as_secs_f64() * 1e3;
    let interval_ns = config.interval.as_nanos().max(1);
    let mut timeline = Vec::new();
    let mut slot: u128 = 0;
    let mut missed: u64 = 0;
    while !stop.load(Ordering::SeqCst) {
        let due = start + Duration::from_nanos(u64::try_from(interval_ns * slot).unwrap_or(u64::MAX));
        let now = Instant::now();
        if now < due {
            std::thread::sleep(due - now);
            continue; // re-check the stop flag
        }
        let t0 = Instant::now();
        let outcome = probe_once(config);
        let t1 = Instant::now();
        live.count(&outcome);
        let probe = Probe { start_ms: ms(t0), end_ms: ms(t1), outcome };
        each(&probe);
        timeline.push(probe);
        slot = next_slot(slot, t1, start, interval_ns, &mut missed);
    }
    ProbeReport::from_timeline(config.target, config.interval, start.elapsed(), missed, timeline)
}

impl Live {
    fn count(&self, outcome: &std::result::Result<String, ProbeError>) {
        match outcome {
            Ok(name) => {
                self.ok.fetch_add(1, Ordering::SeqCst);
                if let Ok(mut g) = self.last.lock()
                    && g.as_deref() != Some(name.as_str())
                {
                    *g = Some(name.clone());
                }
            }
            Err(_) => {
                self.failed.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

/// The next slot after `slot`, whose probe started (or was missed) at `now`: slots that
/// passed entirely meanwhile are skipped and added to `missed`.
fn next_slot(slot: u128, now: Instant, start: Instant, interval_ns: u128, missed: &mut u64) -> u128 {
    let next = slot + 1;
    let latest_due = now.duration_since(start).as_nanos() / interval_ns;
    if latest_due > next {
        *missed += u64::try_from(latest_due - next).unwrap_or(u64::MAX);
        latest_due
    } else {
        next
    }
}

/// [`probe_loop_with`] with up to `config.in_flight` probes at once: `in_flight` worker
/// threads, started from this thread so that they share its network namespace, take a
/// slot each when it is due; a slot that finds every worker busy is missed. The timeline
/// is ordered by completion, as the report's gaps are measured between completions.
fn probe_loop_overlapping(config: &ProberConfig, start: Instant, stop: &AtomicBool, live: &Live) -> ProbeReport {
    use std::sync::atomic::AtomicUsize;
    use std::sync::mpsc;
    let ms = move |t: Instant| t.duration_since(start).as_secs_f64() * 1e3;
    let interval_ns = config.interval.as_nanos().max(1);
    let free = Arc::new(AtomicUsize::new(0));
    let (job_tx, job_rx) = mpsc::channel::<()>();
    let job_rx = Arc::new(Mutex::new(job_rx));
    let (done_tx, done_rx) = mpsc::channel::<Probe>();
    let mut workers = Vec::with_capacity(config.in_flight);
    for _ in 0..config.in_flight {
        let (idle, jobs, done, config) = (free.clone(), job_rx.clone(), done_tx.clone(), config.clone());
        let spawned = std::thread::Builder::new().name("prober".into()).spawn(move || {
            loop {
                // The lock is held only while waiting for a slot: one idle worker waits
                // on the channel, the others on the lock.
                let job = match jobs.lock() {
                    Ok(rx) => rx.recv(),
                    Err(_) => return,
                };
                if job.is_err() {
                    return;
                }
                let t0 = Instant::now();
                let outcome = probe_once(&config);
                let t1 = Instant::now();
                idle.fetch_add(1, Ordering::SeqCst);
                if done.send(Probe { start_ms: ms(t0), end_ms: ms(t1), outcome }).is_err() {
                    return;
                }
            }
        });
        match spawned {
            Ok(handle) => {
                free.fetch_add(1, Ordering::SeqCst);
                workers.push(handle);
            }
            // Fewer workers than asked: the missed slots say so.
            Err(_) => break,
        }
    }
    drop(done_tx);
    let mut timeline = Vec::new();
    let mut collect = |p: Probe| {
        live.count(&p.outcome);
        timeline.push(p);
    };
    let mut slot: u128 = 0;
    let mut missed: u64 = 0;
    while !stop.load(Ordering::SeqCst) {
        while let Ok(p) = done_rx.try_recv() {
            collect(p);
        }
        let due = start + Duration::from_nanos(u64::try_from(interval_ns * slot).unwrap_or(u64::MAX));
        let now = Instant::now();
        if now < due {
            std::thread::sleep(due - now);
            continue; // re-check the stop flag
        }
        let taken = free.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        if !taken || job_tx.send(()).is_err() {
            missed += 1;
        }
        slot = next_slot(slot, now, start, interval_ns, &mut missed);
    }
    // The probes in flight finish within their timeouts.
    drop(job_tx);
    for w in workers {
        let _ = w.join();
    }
    for p in done_rx.try_iter() {
        collect(p);
    }
    timeline.sort_by(|a, b| a.end_ms.total_cmp(&b.end_ms));
    ProbeReport::from_timeline(config.target, config.interval, start.elapsed(), missed, timeline)
}

/// One probe: connect, read `<name>\n`, close.
pub fn probe_once(config: &ProberConfig) -> std::result::Result<String, ProbeError> {
    let mut s = TcpStream::connect_timeout(&config.target, config.connect_timeout)
        .map_err(|e| ProbeError::from_io(&e, true))?;
    let deadline = Instant::now() + config.read_timeout;
    let mut buf = Vec::with_capacity(64);
    let mut chunk = [0u8; 256];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ProbeError::ReadTimeout);
        }
        s.set_read_timeout(Some(left)).map_err(|e| ProbeError::from_io(&e, false))?;
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.contains(&b'\n') || buf.len() > 1024 {
                    break;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(ProbeError::from_io(&e, false)),
        }
    }
    let text = String::from_utf8_lossy(&buf);
    let name = text.lines().next().unwrap_or_default().trim();
    if name.is_empty() { Err(ProbeError::NoReply) } else { Ok(name.to_owned()) }
}
