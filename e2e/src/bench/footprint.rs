//! What a daemon costs at idle, read from `/proc`: CPU time, wakeups and resident memory
//! of a process and every process below it (keepalived runs a parent and a VRRP child;
//! havip one process with several threads).
//!
//! CPU time comes from each thread's `schedstat` (nanoseconds on the CPU, and the number
//! of times it was scheduled in — every wakeup of a sleeping thread is one), not from
//! `stat`'s clock ticks: at 100 ticks a second, keepalived's few milliseconds a minute
//! would read as zero or one tick. A thread that exits inside the window takes its time
//! with it; [`Usage::threads_exited`] says how many did, so a reader can tell.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The process `root` and every live descendant (by parent pid), `root` first.
pub fn process_tree(root: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            if let Some(ppid) = stat_field(pid, None, 1).and_then(|v| u32::try_from(v).ok()) {
                parents.push((pid, ppid));
            }
        }
    }
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        out.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    out
}

/// Field `n` (0-based, counted after the command name) of `/proc/<pid>[/task/<tid>]/stat`.
fn stat_field(pid: u32, tid: Option<u32>, n: usize) -> Option<u64> {
    let path = match tid {
        Some(t) => format!("/proc/{pid}/task/{t}/stat"),
        None => format!("/proc/{pid}/stat"),
    };
    let stat = std::fs::read_to_string(path).ok()?;
    // The command name may contain spaces and parentheses: the fields start after the last ") ".
    let rest = stat.rsplit_once(") ")?.1;
    rest.split_whitespace().nth(n)?.parse().ok()
}

/// Per-thread counters at one moment: (pid, tid) → (ns on CPU, times scheduled in).
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    threads: BTreeMap<(u32, u32), (u64, u64)>,
    at: Option<Instant>,
}

/// Reads every thread of `pids`.
pub fn snapshot(pids: &[u32]) -> Snapshot {
    let mut threads = BTreeMap::new();
    for &pid in pids {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else { continue };
        for e in dir.flatten() {
            let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")) else { continue };
            let mut f = s.split_whitespace().map(|x| x.parse::<u64>().ok());
            if let (Some(Some(ns)), Some(_), Some(Some(slices))) = (f.next(), f.next(), f.next()) {
                threads.insert((pid, tid), (ns, slices));
            }
        }
    }
    Snapshot { threads, at: Some(Instant::now()) }
}

/// User + system CPU time of `pid` in seconds, from the clock ticks in its `stat` (at
/// 100 ticks a second: coarse, for processes that run for minutes; 0 when it is gone).
pub fn cpu_seconds(pid: u32) -> f64 {
    let ticks = |n: usize| stat_field(pid, None, n).unwrap_or(0) as f64;
    (ticks(11) + ticks(12)) / 100.0
}

/// Resident set size of `pids` together, KiB.
pub fn rss_kib(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            status.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .sum()
}

/// Private memory of `pids` together, KiB (`Private_Clean` + `Private_Dirty` of
/// `smaps_rollup`): the part of the RSS that is theirs alone — the rest are pages of the
/// executable and libraries, shared with every process that maps them.
pub fn private_kib(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok())
        .map(|t| {
            t.lines()
                .filter(|l| l.starts_with("Private_Clean:") || l.starts_with("Private_Dirty:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

/// What the processes used between two snapshots.
#[derive(Clone, Debug, PartialEq)]
pub struct Usage {
    /// CPU time (user + system), milliseconds per minute of wall time.
    pub cpu_ms_per_min: f64,
    /// Times a thread was scheduled in, per second: each wakeup of a sleeping thread, plus
    /// preemptions (rare at idle).
    pub wakeups_per_s: f64,
    /// Threads alive at the start but gone at the end (their time is not counted).
    pub threads_exited: usize,
    /// The window, seconds.
    pub window_s: f64,
}

/// The usage between `a` and `b` (threads present in both, plus threads born meanwhile).
pub fn usage(a: &Snapshot, b: &Snapshot) -> Usage {
    let mut ns = 0u64;
    let mut slices = 0u64;
    for (k, (n1, s1)) in &b.threads {
        let (n0, s0) = a.threads.get(k).copied().unwrap_or((0, 0));
        ns += n1.saturating_sub(n0);
        slices += s1.saturating_sub(s0);
    }
    let exited = a.threads.keys().filter(|k| !b.threads.contains_key(k)).count();
    let window = match (a.at, b.at) {
        (Some(x), Some(y)) => y.saturating_duration_since(x),
        _ => Duration::ZERO,
    };
    let secs = window.as_secs_f64().max(1e-9);
    Usage {
        cpu_ms_per_min: ns as f64 / 1e6 / secs * 60.0,
        wakeups_per_s: slices as f64 / secs,
        threads_exited: exited,
        window_s: secs,
    }
}

/// Packets sent by every interface but `lo` of network namespace `ns` so far (from
/// `/proc/thread-self/net/dev` read inside it: heartbeats, probes, ARP, everything).
pub fn tx_packets(ns: &str) -> Option<u64> {
    let dev = crate::host::netns::in_netns(ns, || std::fs::read_to_string("/proc/thread-self/net/dev").ok()).ok()??;
    let mut sum = 0u64;
    // "  eth0: rx_bytes rx_packets (6 more rx fields) tx_bytes tx_packets ..."
    for line in dev.lines().skip(2) {
        let (name, fields) = line.split_once(':')?;
        if name.trim() == "lo" {
            continue;
        }
        sum += fields.split_whitespace().nth(9)?.parse::<u64>().ok()?;
    }
    Some(sum)
}

/// Measures the process trees of `roots` (one per node) over `window`, all at once:
/// usage, RSS and private memory (KiB) of each.
pub fn measure(roots: &[u32], window: Duration) -> Vec<(Usage, u64, u64)> {
    let trees: Vec<Vec<u32>> = roots.iter().map(|r| process_tree(*r)).collect();
    let before: Vec<Snapshot> = trees.iter().map(|t| snapshot(t)).collect();
    std::thread::sleep(window);
    trees
        .iter()
        .zip(&before)
        .map(|(t, b)| {
            let after = snapshot(t);
            (usage(b, &after), rss_kib(t), private_kib(t))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{private_kib, process_tree, rss_kib, snapshot, usage};
    use std::time::{Duration, Instant};

    #[test]
    fn a_busy_thread_is_counted_and_an_idle_one_is_not() {
        let me = std::process::id();
        let a = snapshot(&[me]);
        // Burn about 50 ms of CPU on this thread.
        let start = Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(50) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let b = snapshot(&[me]);
        let u = usage(&a, &b);
        let ms = u.cpu_ms_per_min * u.window_s / 60.0;
        assert!(ms > 20.0, "50 ms of spinning read as {ms} ms ({u:?})");
        assert!(rss_kib(&[me]) > 0);
        let private = private_kib(&[me]);
        assert!(private > 0 && private <= rss_kib(&[me]), "private {private} KiB");
        assert_eq!(process_tree(me)[0], me);
    }

    #[test]
    fn a_missing_process_reads_as_nothing() {
        let a = snapshot(&[u32::MAX]);
        let b = snapshot(&[u32::MAX]);
        let u = usage(&a, &b);
        assert_eq!(u.cpu_ms_per_min, 0.0);
        assert_eq!(rss_kib(&[u32::MAX]), 0);
    }
}
