//! A chaos run: the lab up, clients on every VIP, the ARP observer and the pair poller
//! running, the nemesis carrying out the schedule; then the checker's verdict, and what
//! is left once every object is deleted. Everything it reports is a JSON line.

use super::arp::ArpWatch;
use super::checker::{self, ArpChange, Executed, PairSeen, Record, Sample, Verdict, Vip};
use super::lab::{ChaosLab, EXTRA_SERVICE, NODE_PORTS, SERVICE_PORT, VipDef, extra_fip_name};
use super::schedule::{self, Action, Fault};
use crate::host::netns::{NetnsThread, run_in_netns};
use crate::traffic::ProberConfig;
use crate::traffic::prober::probe_once;
use pnet::datalink::MacAddr;
use serde_json::json;
use std::collections::BTreeMap;
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How a run goes.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The schedule's seed.
    pub seed: u64,
    /// How long the nemesis acts.
    pub duration: Duration,
    /// Only the first this many faults of the schedule (a reproduction).
    pub faults: Option<usize>,
    /// Calm after the last heal, clients still probing.
    pub settle: Duration,
    /// Keep the lab's files here.
    pub dir: Option<PathBuf>,
    /// Where the JSON lines go too (besides standard output).
    pub out: Option<PathBuf>,
}

/// The outcome.
#[derive(Debug)]
pub struct Outcome {
    /// The checker's verdict.
    pub verdict: Verdict,
    /// Left behind once every object was deleted.
    pub leftovers: Vec<String>,
    /// Every broken invariant, one line each.
    pub broken: Vec<String>,
    /// The command that reproduces the first broken invariant.
    pub reproduce: Option<String>,
}

/// JSON lines to standard output and the `--out` file.
struct Lines {
    file: Option<std::fs::File>,
}

impl Lines {
    fn emit(&mut self, v: serde_json::Value) {
        let line = v.to_string();
        println!("{line}");
        if let Some(f) = &mut self.file {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// A client probing one VIP from the client's namespace.
struct Client {
    def: VipDef,
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    thread: Option<NetnsThread<()>>,
    from_ms: Option<f64>,
    until_ms: Option<f64>,
}

impl Client {
    fn start(ns: &str, def: VipDef, epoch: Instant) -> Result<Self, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
        // 200 ms: a lost SYN costs a 1 s retransmission, a busy 2-core machine not.
        let config = ProberConfig::new(def.target())
            .connect_timeout(Duration::from_millis(200))
            .read_timeout(Duration::from_millis(200));
        let (stop2, samples2) = (stop.clone(), samples.clone());
        let thread = run_in_netns(ns, move || {
            let interval = Duration::from_millis(20);
            let mut next = Instant::now();
            while !stop2.load(Ordering::SeqCst) {
                let t0 = Instant::now();
                let outcome = probe_once(&config);
                let t1 = Instant::now();
                let answered_by = outcome.ok().and_then(|name| name.strip_prefix('n').and_then(|i| i.parse().ok()));
                let ms = |t: Instant| t.duration_since(epoch).as_secs_f64() * 1e3;
                samples2.lock().unwrap_or_else(PoisonError::into_inner).push(Sample {
                    start_ms: ms(t0),
                    end_ms: ms(t1),
                    answered_by,
                });
                next += interval;
                let now = Instant::now();
                if next > now {
                    std::thread::sleep(next - now);
                } else {
                    next = now;
                }
            }
        })
        .map_err(|e| e.to_string())?;
        Ok(Self { def, stop, samples, thread: Some(thread), from_ms: None, until_ms: None })
    }

    /// Stops probing; returns the samples.
    fn finish(&mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.samples.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn answered_once(&self) -> Option<f64> {
        self.samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|s| s.answered_by.is_some())
            .map(|s| s.end_ms)
    }
}

fn ms_since(epoch: Instant) -> f64 {
    epoch.elapsed().as_secs_f64() * 1e3
}

/// The reproduction command for a prefix of the schedule.
pub fn reproduce_command(seed: u64, duration: Duration, faults: usize) -> String {
    format!("make chaos SEED={seed} DURATION={}s FAULTS={faults}", duration.as_secs())
}

/// Runs the chaos run.
pub fn run(opts: &RunOptions) -> Result<Outcome, String> {
    let mut lines = Lines {
        file: match &opts.out {
            Some(p) => Some(std::fs::File::create(p).map_err(|e| format!("create {}: {e}", p.display()))?),
            None => None,
        },
    };
    let started = Instant::now();
    let mut lab = ChaosLab::start(opts.dir.clone())?;
    let shape = lab.shape();
    let clock = ChaosLab::clock_steps_possible();
    let mut faults = schedule::schedule(opts.seed, opts.duration, Duration::ZERO, &shape, clock);
    if let Some(n) = opts.faults {
        faults.truncate(n);
    }
    lines.emit(json!({
        "type": "run", "seed": opts.seed, "duration_s": opts.duration.as_secs(), "faults": faults.len(),
        "clock_steps": clock, "lab_dir": lab.lab.dir().display().to_string(),
        "lab_up_ms": started.elapsed().as_millis() as u64,
        "pairs": lab.pairs.iter().map(|p| json!({"name": p.name, "members": p.members, "fast": p.fast})).collect::<Vec<_>>(),
        "vips": lab.vips.iter().map(|v| json!({"name": v.name, "address": v.address.to_string(), "port": v.port, "pair": lab.pairs[v.pair].name})).collect::<Vec<_>>(),
        "reproduce": reproduce_command(opts.seed, opts.duration, faults.len()),
    }));
    for f in &faults {
        let mut v = serde_json::to_value(f).map_err(|e| e.to_string())?;
        v["type"] = json!("schedule");
        lines.emit(v);
    }

    // Clients, the observer, the poller.
    let epoch = Instant::now();
    let client_ns = lab.lab.topo.client().ns.clone();
    let (net, _) = lab.lab.topo.data_subnet();
    let o = net.octets();
    let observer_ip = Ipv4Addr::new(o[0], o[1], o[2], 249);
    let macs: BTreeMap<MacAddr, usize> = lab
        .lab
        .topo
        .nodes()
        .iter()
        .enumerate()
        .filter_map(|(i, n)| n.data_mac.parse::<MacAddr>().ok().map(|m| (m, i)))
        .collect();
    let arp = ArpWatch::start(&client_ns, "eth0", observer_ip, macs, Duration::from_millis(20), epoch)?;
    let mut clients: Vec<Client> = Vec::new();
    for v in lab.vips.clone() {
        arp.add(v.address);
        clients.push(Client::start(&client_ns, v, epoch)?);
    }
    // Every VIP answers before the first fault.
    let deadline = Instant::now() + Duration::from_secs(60);
    while clients.iter().any(|c| c.answered_once().is_none()) {
        if Instant::now() > deadline {
            let silent: Vec<&str> =
                clients.iter().filter(|c| c.answered_once().is_none()).map(|c| c.def.name.as_str()).collect();
            return Err(format!("VIPs never answered before the first fault: {silent:?}\n{}", lab.lab.logs_tail(30)));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for c in &mut clients {
        c.from_ms = c.answered_once();
    }
    let stop_poll = Arc::new(AtomicBool::new(false));
    let seen: Arc<Mutex<Vec<PairSeen>>> = Arc::default();
    let poll_thread = {
        let (poller, stop, seen) = (lab.poller(), stop_poll.clone(), seen.clone());
        std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            while !stop.load(Ordering::SeqCst) {
                let t_ms = ms_since(epoch);
                let polled = rt.block_on(poller.poll());
                let mut g = seen.lock().unwrap_or_else(PoisonError::into_inner);
                for (pair, (lease_holder, lease_epoch, status_active)) in polled.into_iter().enumerate() {
                    g.push(PairSeen { t_ms, pair, lease_holder, lease_epoch, status_active });
                }
                drop(g);
                std::thread::sleep(Duration::from_millis(1000));
            }
        })
    };

    // The nemesis. Times count from the run's epoch; faults run late when an action
    // takes long (a restarted API server waits until it is ready): the actual times are
    // recorded and judged.
    let mut events: Vec<(u64, bool, usize)> = Vec::new();
    for (k, f) in faults.iter().enumerate() {
        events.push((f.at_ms, true, k));
        events.push((f.heal_ms(), false, k));
    }
    events.sort_by_key(|e| (e.0, e.1, e.2));
    let mut executed: Vec<Option<Executed>> = vec![None; faults.len()];
    let mut churn: Vec<Client> = Vec::new();
    // Heals that failed (the API server down for a deletion, say) are tried again every
    // second until they succeed: a fault never outlives its schedule for want of a retry.
    let mut pending: Vec<usize> = Vec::new();
    let retry = |lab: &mut ChaosLab,
                 pending: &mut Vec<usize>,
                 executed: &mut Vec<Option<Executed>>,
                 lines: &mut Lines| {
        pending.retain(|&k| {
            let f = &faults[k];
            match lab.heal(f) {
                Ok(()) => {
                    let t = ms_since(epoch);
                    lines.emit(json!({"type": "heal", "id": f.id, "kind": f.action.kind(), "t_ms": t.round(), "took_ms": 0.0, "outcome": "ok", "retried": true}));
                    if let Some(e) = executed[k].as_mut() {
                        e.healed_ms = t;
                    }
                    false
                }
                Err(_) => true,
            }
        });
    };
    for (at, inject, k) in events {
        let due = epoch + Duration::from_millis(at);
        while !pending.is_empty() && Instant::now() + Duration::from_secs(1) < due {
            std::thread::sleep(Duration::from_secs(1));
            retry(&mut lab, &mut pending, &mut executed, &mut lines);
        }
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        let f = &faults[k];
        let t = ms_since(epoch);
        if inject {
            let r = lab.inject(f);
            let (nodes, outcome) = match r {
                Ok(n) => (n, "ok".to_owned()),
                Err(e) => (f.action.nodes(&shape), e),
            };
            lines.emit(json!({"type": "inject", "id": f.id, "kind": f.action.kind(), "t_ms": t.round(), "late_ms": (t - at as f64).round(), "outcome": outcome, "nodes": nodes}));
            if outcome == "ok" {
                start_churn_client(&lab, f, &client_ns, epoch, &arp, &mut churn)?;
            }
            executed[k] = Some(Executed { fault: f.clone(), injected_ms: t, healed_ms: f64::MAX, nodes, outcome });
        } else {
            let ok = executed[k].as_ref().is_some_and(|e| e.outcome == "ok");
            let outcome =
                if ok { lab.heal(f).err().unwrap_or_else(|| "ok".to_owned()) } else { "not injected".to_owned() };
            let t_done = ms_since(epoch);
            lines.emit(json!({"type": "heal", "id": f.id, "kind": f.action.kind(), "t_ms": t.round(), "took_ms": (t_done - t).round(), "outcome": outcome}));
            if ok && outcome != "ok" {
                pending.push(k);
            } else if let Some(e) = executed[k].as_mut() {
                e.healed_ms = t_done;
            }
            stop_churn_client(f, t, &arp, &mut churn);
        }
    }
    // Calm: everything healed (retried while the calm lasts), the clients still probing.
    let calm = Instant::now() + opts.settle;
    while Instant::now() < calm {
        retry(&mut lab, &mut pending, &mut executed, &mut lines);
        std::thread::sleep(Duration::from_secs(1).min(calm.saturating_duration_since(Instant::now())));
    }
    let end_ms = ms_since(epoch);
    stop_poll.store(true, Ordering::SeqCst);
    let _ = poll_thread.join();
    let arp_log = arp.finish()?;
    let mut record = Record {
        executed: executed.into_iter().flatten().collect(),
        vips: Vec::new(),
        pairs_seen: std::mem::take(&mut *seen.lock().unwrap_or_else(PoisonError::into_inner)),
        pairs: lab.pairs.len(),
    };
    for e in &mut record.executed {
        e.healed_ms = e.healed_ms.min(end_ms);
    }
    for mut c in clients.into_iter().chain(churn) {
        let samples = c.finish();
        let pair = &lab.pairs[c.def.pair];
        let (limit, edited) = pair.timeouts_ms();
        let arp_changes: Vec<ArpChange> = arp_log.get(&c.def.address).cloned().unwrap_or_default();
        let from_ms = c.from_ms.or_else(|| samples.iter().find(|s| s.answered_by.is_some()).map(|s| s.end_ms));
        let Some(from_ms) = from_ms else {
            lines.emit(json!({"type": "never_answered", "vip": c.def.name, "address": c.def.address.to_string()}));
            continue;
        };
        let vip = Vip {
            name: c.def.name.clone(),
            address: c.def.address.to_string(),
            pair: c.def.pair,
            members: pair.members.clone(),
            dual_limit_ms: limit,
            dual_limit_edited_ms: edited,
            from_ms,
            to_ms: c.until_ms.unwrap_or(end_ms),
        };
        record.vips.push((vip, samples, arp_changes));
    }
    let verdict = checker::judge(&record);

    // Everything healed (what a failed heal left too), every object deleted: nothing may
    // be left behind.
    for e in lab.heal_everything() {
        lines.emit(json!({"type": "heal_error", "error": e}));
    }
    let mut addresses: Vec<Ipv4Addr> = lab.vips.iter().map(|v| v.address).collect();
    addresses.push(lab.extra_fip_address());
    for k in 60..70 {
        addresses.push(Ipv4Addr::new(o[0], o[1], o[2], k));
    }
    let mut leftovers = match lab.delete_everything() {
        Ok(()) => Vec::new(),
        Err(e) => vec![format!("could not delete the objects: {e}")],
    };
    if leftovers.is_empty() {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            leftovers = lab.leftovers(&addresses);
            if leftovers.is_empty() || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    // What the agents said last, for the post-mortem of what they left (CI keeps no lab).
    if !leftovers.is_empty() {
        eprintln!("chaos: something was left behind; the logs' last lines:\n{}", lab.lab.logs_tail(80));
    }

    // The report.
    for e in &record.executed {
        let mut v = serde_json::to_value(e).map_err(|e| e.to_string())?;
        v["type"] = json!("fault");
        lines.emit(v);
    }
    for d in &verdict.dual_windows {
        let mut v = serde_json::to_value(d).map_err(|e| e.to_string())?;
        v["type"] = json!("dual_answer");
        v["broken"] = json!(d.broken());
        lines.emit(v);
    }
    for o in &verdict.outages {
        let mut v = serde_json::to_value(o).map_err(|e| e.to_string())?;
        v["type"] = json!("outage");
        lines.emit(v);
    }
    for s in &verdict.status_contradictions {
        let mut v = serde_json::to_value(s).map_err(|e| e.to_string())?;
        v["type"] = json!("status_contradiction");
        lines.emit(v);
    }
    for (kind, row) in &verdict.kinds {
        let mut v = serde_json::to_value(row).map_err(|e| e.to_string())?;
        v["type"] = json!("kind");
        v["kind"] = json!(kind);
        lines.emit(v);
    }
    for l in &leftovers {
        lines.emit(json!({"type": "leftover", "what": l}));
    }
    let mut broken = verdict.broken();
    broken.extend(leftovers.iter().map(|l| format!("left behind: {l}")));
    let prefix = verdict.reproducing_prefix(&record.executed);
    let reproduce = if broken.is_empty() {
        None
    } else {
        Some(reproduce_command(opts.seed, opts.duration, prefix.unwrap_or(record.executed.len())))
    };
    let dual_max = verdict.dual_windows.iter().map(checker::DualWindow::len_ms).fold(0.0, f64::max);
    lines.emit(json!({
        "type": "verdict", "seed": opts.seed, "passed": broken.is_empty(), "broken": broken,
        "reproduce": reproduce, "faults": record.executed.len(),
        "refused": record.executed.iter().filter(|e| e.outcome != "ok").count(),
        "probes": verdict.probes, "failed_probes": verdict.failed_probes,
        "outages": verdict.outages.len(),
        "unexplained_outages": verdict.outages.iter().filter(|o| o.explained_by.is_empty()).count(),
        "dual_windows": verdict.dual_windows.len(), "longest_dual_ms": dual_max,
        "dual_windows_over_limit": verdict.dual_windows.iter().filter(|d| d.broken()).count(),
        "status_contradictions": verdict.status_contradictions.len(),
        "epoch_regressions": verdict.epoch_regressions.len(),
        "left_behind": leftovers.len(),
        "took_s": started.elapsed().as_secs(),
    }));
    Ok(Outcome { verdict, leftovers, broken, reproduce })
}

/// A VIP the fault just made gets a client (and the observer asks for it).
fn start_churn_client(
    lab: &ChaosLab,
    f: &Fault,
    ns: &str,
    epoch: Instant,
    arp: &ArpWatch,
    churn: &mut Vec<Client>,
) -> Result<(), String> {
    let def = match f.action {
        Action::FloatingIpChurn { pair } => {
            VipDef { name: extra_fip_name(), address: lab.extra_fip_address(), port: SERVICE_PORT, pair }
        }
        Action::ServiceChurn => {
            let address = lab.service_address(EXTRA_SERVICE, Duration::from_secs(1))?;
            VipDef { name: EXTRA_SERVICE.to_owned(), address, port: NODE_PORTS[2], pair: 2 }
        }
        _ => return Ok(()),
    };
    arp.add(def.address);
    churn.push(Client::start(ns, def, epoch)?);
    Ok(())
}

/// The client of a VIP the heal deleted stops being judged from the heal on.
fn stop_churn_client(f: &Fault, t_ms: f64, arp: &ArpWatch, churn: &mut [Client]) {
    let name = match f.action {
        Action::FloatingIpChurn { .. } => extra_fip_name(),
        Action::ServiceChurn => EXTRA_SERVICE.to_owned(),
        _ => return,
    };
    for c in churn.iter_mut().filter(|c| c.def.name == name && c.until_ms.is_none()) {
        c.until_ms = Some(t_ms);
        if c.from_ms.is_none() {
            c.from_ms = c.answered_once();
        }
        c.stop.store(true, Ordering::SeqCst);
    }
    // The observer keeps asking for an address only while a live client probes it.
    for c in churn.iter().filter(|c| c.until_ms.is_some()) {
        if !churn.iter().any(|o| o.until_ms.is_none() && o.def.address == c.def.address) {
            arp.remove(c.def.address);
        }
    }
}
