//! The ARP observer: from the client's namespace, asks "who has VIP?" for every VIP each
//! round and records which nodes answered — two answers in one round are two nodes
//! claiming the address on the segment, whatever their agents believe.
//!
//! The requests come from an address and a MAC that are nobody's (`OBSERVER_IP` in the
//! data subnet, a locally administered MAC): the replies, unicast to that MAC, reach the
//! client's port (the switch learned the MAC there) and this socket, while the client's
//! kernel drops them (not its MAC) and keeps its own neighbour cache, which the clients'
//! connections rely on, untouched by the observer.

use super::checker::ArpChange;
use crate::host::netns::{NetnsThread, run_in_netns};
use havip_node_agent::announce::l2::frames::{arp_request_frame, parse_arp};
use pnet::datalink::{self, Channel, MacAddr};
use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The observer's MAC (locally administered, unicast).
pub const OBSERVER_MAC: MacAddr = MacAddr(0x02, 0x68, 0x76, 0x63, 0x68, 0x73);

/// What the observer recorded: per VIP, the change log of who answered.
pub type ArpLog = BTreeMap<Ipv4Addr, Vec<ArpChange>>;

/// The running observer.
pub struct ArpWatch {
    stop: Arc<AtomicBool>,
    vips: Arc<Mutex<Vec<Ipv4Addr>>>,
    log: Arc<Mutex<ArpLog>>,
    thread: Option<NetnsThread<Result<(), String>>>,
}

impl ArpWatch {
    /// Starts observing from `ns` on `ifname` every `round`, asking as `observer_ip`;
    /// `macs` names the nodes by their data MAC; times in ms since `epoch`.
    pub fn start(
        ns: &str,
        ifname: &str,
        observer_ip: Ipv4Addr,
        macs: BTreeMap<MacAddr, usize>,
        round: Duration,
        epoch: Instant,
    ) -> Result<Self, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let vips: Arc<Mutex<Vec<Ipv4Addr>>> = Arc::default();
        let log: Arc<Mutex<ArpLog>> = Arc::default();
        let (stop2, vips2, log2, ifname) = (stop.clone(), vips.clone(), log.clone(), ifname.to_owned());
        let thread =
            run_in_netns(ns, move || observe(&ifname, observer_ip, &macs, round, epoch, &stop2, &vips2, &log2))
                .map_err(|e| e.to_string())?;
        Ok(Self { stop, vips, log, thread: Some(thread) })
    }

    /// Starts asking for `vip` too.
    pub fn add(&self, vip: Ipv4Addr) {
        let mut v = self.vips.lock().unwrap_or_else(PoisonError::into_inner);
        if !v.contains(&vip) {
            v.push(vip);
        }
    }

    /// Stops asking for `vip`.
    pub fn remove(&self, vip: Ipv4Addr) {
        self.vips.lock().unwrap_or_else(PoisonError::into_inner).retain(|v| *v != vip);
    }

    /// Stops and returns the log (an error if the socket failed).
    pub fn finish(mut self) -> Result<ArpLog, String> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().map_err(|e| e.to_string())??;
        }
        Ok(std::mem::take(&mut *self.log.lock().unwrap_or_else(PoisonError::into_inner)))
    }
}

impl Drop for ArpWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

#[allow(clippy::too_many_arguments)]
fn observe(
    ifname: &str,
    observer_ip: Ipv4Addr,
    macs: &BTreeMap<MacAddr, usize>,
    round: Duration,
    epoch: Instant,
    stop: &AtomicBool,
    vips: &Mutex<Vec<Ipv4Addr>>,
    log: &Mutex<ArpLog>,
) -> Result<(), String> {
    let iface = datalink::interfaces()
        .into_iter()
        .find(|i| i.name == ifname)
        .ok_or_else(|| format!("no interface {ifname} in the observer's namespace"))?;
    let config = datalink::Config { read_timeout: Some(Duration::from_millis(2)), ..Default::default() };
    let (mut tx, mut rx) = match datalink::channel(&iface, config) {
        Ok(Channel::Ethernet(tx, rx)) => (tx, rx),
        Ok(_) => return Err("unsupported channel type".into()),
        Err(e) => return Err(format!("open a packet socket on {ifname}: {e}")),
    };
    let mut last: BTreeMap<Ipv4Addr, Vec<usize>> = BTreeMap::new();
    let mut next = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        let asked: Vec<Ipv4Addr> = vips.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let t_ms = epoch.elapsed().as_secs_f64() * 1e3;
        for vip in &asked {
            if let Some(Err(e)) = tx.send_to(&arp_request_frame(OBSERVER_MAC, observer_ip, *vip), None) {
                tracing::debug!(%vip, error = %e, "observer: ARP request not sent");
            }
        }
        next += round;
        let mut answered: BTreeMap<Ipv4Addr, BTreeSet<usize>> = BTreeMap::new();
        while Instant::now() < next {
            let Ok(frame) = rx.next() else { continue };
            if frame.len() < 42 || frame[12..14] != [0x08, 0x06] {
                continue;
            }
            let Some(arp) = parse_arp(&frame[14..]) else { continue };
            if arp.op != 2 || arp.target_ip != observer_ip || !asked.contains(&arp.sender_ip) {
                continue;
            }
            let who = macs.get(&arp.sender_mac).copied().unwrap_or(usize::MAX);
            answered.entry(arp.sender_ip).or_default().insert(who);
        }
        let mut g = log.lock().unwrap_or_else(PoisonError::into_inner);
        for vip in &asked {
            let nodes: Vec<usize> = answered.remove(vip).map(|s| s.into_iter().collect()).unwrap_or_default();
            if last.get(vip) != Some(&nodes) {
                g.entry(*vip).or_default().push(ArpChange { t_ms, nodes: nodes.clone() });
                last.insert(*vip, nodes);
            }
        }
        drop(g);
        // A round that overran starts the next one at once, from now.
        let now = Instant::now();
        if next < now {
            next = now;
        }
    }
    Ok(())
}
