//! The control-plane mode on real kernels and a real control plane: three standalone
//! members that vote (`quorum:`) and gate on their own kube-apiserver's `/readyz` over
//! HTTPS (`apiServer:`, the cluster CA), with etcd and kube-apiserver running on each node
//! ([`havip_e2e::cpcluster`]), and a client asking `/readyz` through the VIP on fresh
//! connections the whole time — what kubelets and kubectl see.
//!
//! The claims tried here: the VIP is held before any API server exists (as `kubeadm init`
//! needs: it reaches its API server through the endpoint); a holder whose API server dies
//! or freezes (SIGSTOP: the port still accepts TCP connections — a TCP probe would keep the
//! VIP there) hands the VIP to a member whose API server is ready; a holder node cut off
//! is replaced by the majority; restarting every agent does not move the VIP or fail a
//! request; a standby cut off from the others never holds the VIP, and a holder cut off from
//! them gives it up before the majority takes it. Numbers are printed (`--nocapture`).
//!
//! Root only, and the control plane must be built (`bash hack/testbin.sh control-plane`):
//! otherwise each test prints a SKIPPED line and passes.

use havip_e2e::agent::{API_PORT, AgentLab, PairOptions};
use havip_e2e::cpcluster::{CpCluster, ReadyzReport};
use havip_e2e::netns;
use havip_e2e::testbin::TestBin;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const UP: Duration = Duration::from_secs(20);
/// A client's request through the VIP: a fresh TCP and TLS connection each time.
const REQUEST_EVERY: Duration = Duration::from_millis(50);
const REQUEST_TIMEOUT: Duration = Duration::from_millis(1000);

/// The lab: three voting members gated on their API servers, started before the control
/// plane exists (no CA file yet, nothing on 6443). `None` (after a SKIPPED line) when not
/// root or the control plane is not built.
fn lab(test: &str) -> Option<AgentLab> {
    if !netns::skip_unless_root(test) {
        return None;
    }
    if let Err(e) = TestBin::find() {
        let line = format!("SKIPPED: {test}: {e} (or `bash hack/testbin.sh control-plane`)\n");
        let _ = std::io::stderr().write_all(line.as_bytes());
        return None;
    }
    havip_e2e::agent::lab_for_test(
        test,
        PairOptions {
            api_server: Some("  interval: 200ms\n  timeout: 500ms\n  notReadyFor: 600ms\n".to_owned()),
            drain_timeout: Some("2s".to_owned()),
            ..PairOptions::control_plane()
        },
    )
}

/// Starts etcd and kube-apiserver on every node (the VIP in the serving certificate),
/// puts the cluster CA where the agents expect it, and waits until the client reaches
/// a ready API server through the VIP.
fn control_plane(lab: &AgentLab) -> CpCluster {
    let started = Instant::now();
    let cp = CpCluster::for_agent_lab(lab).unwrap_or_else(|e| panic!("control plane: {e}"));
    let reached = wait_for(
        "the API through the VIP",
        Duration::from_secs(10),
        || cp.readyz_at(lab.client_ns(), vip_api(lab), REQUEST_TIMEOUT),
        || format!("{}\n{}", lab.diagnostics(), cp.diagnostics()),
    );
    eprintln!("control plane up {:?} after its start; ready through the VIP {reached:?} later", started.elapsed());
    cp
}

fn diag(lab: &AgentLab, cp: &CpCluster) -> String {
    format!("{}\n{}", lab.diagnostics(), cp.diagnostics())
}

fn vip_api(lab: &AgentLab) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(lab.vip_addr(0)), API_PORT)
}

fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool, diag: impl Fn() -> String) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < timeout, "{what} not within {timeout:?}\n{}", diag());
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

/// Samples the VIP's holders every 10 ms on its own thread until dropped: the longest
/// time two members held it at once. A planned move is make-before-break — the target adds
/// the VIP, then the old holder removes it — so a few milliseconds of overlap are by design;
/// an unplanned overlap (a partition, a fencing failure) would last a lease or more.
struct HolderWatch<'a> {
    dual_ms: &'a AtomicUsize,
    stop: &'a AtomicBool,
}

fn watch_holders<'s, 'a: 's>(
    scope: &'s std::thread::Scope<'s, 'a>,
    lab: &'a AgentLab,
    dual_ms: &'a AtomicUsize,
    stop: &'a AtomicBool,
) -> HolderWatch<'a> {
    scope.spawn(move || {
        let mut since: Option<Instant> = None;
        while !stop.load(Ordering::SeqCst) {
            let n = lab.holders(0).map(|h| h.len()).unwrap_or(0);
            if n > 1 {
                let start = *since.get_or_insert_with(Instant::now);
                let ms = usize::try_from(start.elapsed().as_millis()).unwrap_or(usize::MAX).max(1);
                dual_ms.fetch_max(ms, Ordering::SeqCst);
            } else {
                since = None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    HolderWatch { dual_ms, stop }
}

/// Longest overlap allowed: a planned move's make-before-break (the target's add, its
/// announcement and the old holder's removal), never a lease.
const MAX_PLANNED_OVERLAP_MS: usize = 150;

impl HolderWatch<'_> {
    fn longest_dual_ms(&self) -> usize {
        self.dual_ms.load(Ordering::SeqCst)
    }
}

impl Drop for HolderWatch<'_> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The sole holder of the VIP, waited for.
fn sole_holder(lab: &AgentLab, among: &[usize], timeout: Duration, diag: impl Fn() -> String) -> usize {
    let mut holder = None;
    wait_for(
        &format!("one of {among:?} to hold the VIP alone"),
        timeout,
        || {
            holder = lab.holders(0).ok().filter(|h| h.len() == 1 && among.contains(&h[0])).map(|h| h[0]);
            holder.is_some()
        },
        diag,
    );
    holder.unwrap_or_default()
}

/// Applies `fault` to the holder `first` and waits until one of the other two members
/// holds the VIP alone and the client is answered through it again; prints the times
/// (`what`) and asserts that no two members held the VIP at once — an unplanned move
/// never overlaps.
fn replaced_without_overlap(lab: &AgentLab, cp: &CpCluster, first: usize, what: &str, fault: impl FnOnce()) {
    let dual = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let holders = watch_holders(scope, lab, &dual, &stop);
        let watch = cp.watch_readyz(lab.client_ns(), vip_api(lab), REQUEST_EVERY, REQUEST_TIMEOUT).expect("client");
        let start = Instant::now();
        fault();
        let others: Vec<usize> = (0..3).filter(|&i| i != first).collect();
        let holder = sole_holder(lab, &others, Duration::from_secs(15), || diag(lab, cp));
        let taken = start.elapsed();
        let answered = watch.wait_ok_after(start + taken, Duration::from_secs(15));
        assert!(
            answered.is_some(),
            "{what}: no answer through the VIP after the move: {}\n{}",
            watch.report().timeline(start),
            diag(lab, cp)
        );
        let report = watch.stop();
        let answered = answered.map(|t| t - start);
        eprintln!(
            "{what}: n{holder} held the VIP {taken:?} after the fault; the client was answered {answered:?} after it; {}",
            report.summary()
        );
        let overlap = holders.longest_dual_ms();
        assert_eq!(overlap, 0, "{what}: two members held the VIP at once for {overlap} ms\n{}", diag(lab, cp));
    });
}

/// Waits until every member reports itself ready (its API server answers) and one member
/// holds the VIP alone; returns that member.
fn settled(lab: &AgentLab, cp: &CpCluster) -> usize {
    wait_for(
        "every member ready",
        Duration::from_secs(15),
        || (0..3).all(|i| lab.status(i).is_some_and(|s| s["readyAll"].as_bool() == Some(true))),
        || diag(lab, cp),
    );
    sole_holder(lab, &[0, 1, 2], Duration::from_secs(5), || diag(lab, cp))
}

fn last_reason(lab: &AgentLab, i: usize) -> Option<String> {
    lab.status(i)?.get("lastTransition")?.get("reason")?.as_str().map(str::to_owned)
}

#[test]
fn held_before_any_api_server_then_a_dead_or_frozen_api_server_moves_the_vip() {
    let Some(lab) = lab("control_plane::held_before_any_api_server_then_a_dead_or_frozen_api_server_moves_the_vip")
    else {
        return;
    };
    // Bootstrap: no API server anywhere (no CA file, nothing listening on 6443) — a
    // listener down never blocks the election: the best member holds the VIP.
    lab.wait_sole_holder(0, UP).unwrap_or_else(|e| panic!("n0 holds the VIP with no API server: {e}"));
    let st = lab.status(0).expect("n0's status");
    eprintln!("held with no API server: {st}");

    let mut cp = control_plane(&lab);
    // When the API servers come up the VIP may move once, from a holder whose own API
    // server was not ready to the first member found ready: settle first.
    let first = settled(&lab, &cp);
    let dual = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let third = std::thread::scope(|scope| {
        let holders = watch_holders(scope, &lab, &dual, &stop);
        let watch = cp.watch_readyz(lab.client_ns(), vip_api(&lab), REQUEST_EVERY, REQUEST_TIMEOUT).expect("client");
        std::thread::sleep(Duration::from_millis(300));

        // The holder's kube-apiserver dies: it hands the VIP to a member whose API server
        // is ready.
        let killed = Instant::now();
        cp.kill_apiserver(first);
        let others: Vec<usize> = (0..3).filter(|&i| i != first).collect();
        let second = sole_holder(&lab, &others, Duration::from_secs(10), || diag(&lab, &cp));
        let moved = killed.elapsed();
        assert_eq!(
            last_reason(&lab, first).as_deref(),
            Some("ListenerDown"),
            "n{first} handed over\n{}",
            diag(&lab, &cp)
        );
        std::thread::sleep(Duration::from_millis(500));

        // Its kube-apiserver freezes: the kernel still completes TCP connects on 6443 (a
        // TCP probe would call it up), but /readyz times out: the VIP moves to the third.
        let frozen = Instant::now();
        cp.stop_apiserver(second);
        let third = (0..3).find(|&i| i != first && i != second).unwrap_or_default();
        let second_api = SocketAddr::new(IpAddr::V4(lab.topo.node(second).ip(netns::Link::Data)), API_PORT);
        let tcp_up = netns::in_netns(lab.client_ns(), move || {
            std::net::TcpStream::connect_timeout(&second_api, Duration::from_secs(1)).is_ok()
        })
        .unwrap_or(false);
        let moved_again = frozen.elapsed()
            + wait_for(
                &format!("n{third} to hold the VIP"),
                Duration::from_secs(10),
                || lab.holders(0).is_ok_and(|h| h == [third]),
                || diag(&lab, &cp),
            );
        assert_eq!(
            last_reason(&lab, second).as_deref(),
            Some("ListenerDown"),
            "n{second} handed over\n{}",
            diag(&lab, &cp)
        );
        watch.wait_ok_after(frozen + moved_again, Duration::from_secs(5));
        cp.cont_apiserver(second);
        let report: ReadyzReport = watch.stop();
        let ok_after_kill = report.first_ok_after(killed + Duration::from_millis(1)).map(|t| t - killed);
        let ok_after_freeze = report.first_ok_after(frozen + Duration::from_millis(1)).map(|t| t - frozen);
        eprintln!(
            "dead API server: n{second} held the VIP {moved:?} after n{first}'s was killed (client answered {ok_after_kill:?} after); frozen: n{third} held it {moved_again:?} after n{second}'s SIGSTOP (client answered {ok_after_freeze:?} after); client: {}",
            report.summary()
        );
        let timeline = report.timeline(killed);
        assert!(tcp_up, "the premise: a frozen API server still accepts TCP connects");
        assert!(
            ok_after_kill.is_some_and(|t| t < frozen - killed),
            "answered through n{second} before the freeze: {timeline}"
        );
        assert!(ok_after_freeze.is_some(), "answered through n{third} after the freeze: {timeline}");
        let overlap = holders.longest_dual_ms();
        eprintln!("longest time two members held the VIP (planned moves): {overlap} ms");
        assert!(overlap <= MAX_PLANNED_OVERLAP_MS, "two members held the VIP for {overlap} ms\n{}", diag(&lab, &cp));
        // The client's longest wait: a request in flight to the dead server (refused at
        // once) or the frozen one (its timeout), then the move.
        assert!(
            report.longest_gap() < Duration::from_secs(4),
            "the API was unreachable through the VIP for {:?}: {timeline}",
            report.longest_gap()
        );
        third
    });
    // kubectl through the VIP works, as an administrator's would after the two moves.
    let (ok, out) = cp.kubectl(lab.client_ns(), vip_api(&lab), &["get", "ns", "kube-system", "-o", "name"]);
    assert!(
        ok && out.contains("namespace/kube-system"),
        "kubectl through the VIP after the moves: {out}\n{}",
        diag(&lab, &cp)
    );
    // The first holder's API server back: the VIP stays where it is (no failback).
    cp.start_apiserver(first).unwrap_or_else(|e| panic!("n{first}'s API server restarts: {e}"));
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(lab.holders(0).expect("holders"), vec![third], "{}", diag(&lab, &cp));
}

#[test]
fn a_cut_holder_is_replaced_and_restarting_every_agent_moves_nothing() {
    let Some(mut lab) = lab("control_plane::a_cut_holder_is_replaced_and_restarting_every_agent_moves_nothing") else {
        return;
    };
    lab.wait_sole_holder(0, UP).unwrap_or_else(|e| panic!("n0 holds the VIP: {e}"));
    let cp = control_plane(&lab);
    let first = settled(&lab, &cp);

    // Every agent restarted, one after the other, with the API servers up: the VIP stays
    // where it is and no request through it fails.
    let watch = cp.watch_readyz(lab.client_ns(), vip_api(&lab), REQUEST_EVERY, REQUEST_TIMEOUT).expect("client");
    let mut order: Vec<usize> = (0..3).filter(|&i| i != first).collect();
    order.push(first);
    for i in order {
        lab.kill_agent(i);
        lab.start_agent(i).expect("agent restarts");
        wait_for(
            &format!("n{i} back as a member"),
            UP,
            || lab.role(i).is_some_and(|r| r == if i == first { "Active" } else { "Standby" }),
            || diag(&lab, &cp),
        );
        assert_eq!(lab.holders(0).expect("holders"), vec![first], "after restarting n{i}\n{}", diag(&lab, &cp));
    }
    let report = watch.stop();
    eprintln!("every agent restarted: {}", report.summary());
    assert_eq!(report.failures(), 0, "requests failed through the VIP while agents restarted: {}", report.summary());

    // The holder's cables cut, management first (a dead node): the majority takes the VIP; the client reaches a ready API
    // server through it once etcd, which lost a member too, serves again.
    replaced_without_overlap(&lab, &cp, first, "cut holder", || {
        lab.topo.kill_node_links(first).expect("cut the holder");
    });
    lab.topo.restore_node(first).expect("restore the old holder");
    std::thread::sleep(Duration::from_secs(2));
    let h = lab.holders(0).expect("holders");
    assert!(
        h.len() == 1 && h[0] != first,
        "back together: the new holder keeps the VIP alone: {h:?}\n{}",
        diag(&lab, &cp)
    );
}

/// Partitions on the real control plane, the client reaching every node throughout: a
/// standby cut off from the other two members is a minority of one and never holds the VIP;
/// the holder cut off from the other two gives the VIP up before the majority takes it (no
/// moment with two holders), and the client is answered through the VIP again by a member
/// of the majority. (Its etcd member is cut off too, so its API server stops being ready
/// as well; the agents' plain-lab test `agent_quorum` tries the votes alone.)
#[test]
fn a_partitioned_minority_never_holds_the_vip_and_an_isolated_holder_gives_it_up() {
    let Some(lab) = lab("control_plane::a_partitioned_minority_never_holds_the_vip_and_an_isolated_holder_gives_it_up")
    else {
        return;
    };
    lab.wait_sole_holder(0, UP).unwrap_or_else(|e| panic!("n0 holds the VIP: {e}"));
    let cp = control_plane(&lab);
    let first = settled(&lab, &cp);
    // Every frame between `node` and the other two members dropped, both ways.
    let isolate = |node: usize| {
        let mut faults = Vec::new();
        for p in (0..3).filter(|&p| p != node) {
            faults.push(lab.topo.partition_peer(node, p).expect("partition"));
            faults.push(lab.topo.partition_peer(p, node).expect("partition"));
        }
        faults
    };

    // A standby alone, for several leases: it never holds the VIP. (Requests may fail
    // meanwhile if its etcd member led etcd: the other two elect a leader first.)
    let minority = (0..3).find(|&i| i != first).unwrap_or_default();
    let dual = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let holders = watch_holders(scope, &lab, &dual, &stop);
        let watch = cp.watch_readyz(lab.client_ns(), vip_api(&lab), REQUEST_EVERY, REQUEST_TIMEOUT).expect("client");
        let faults = isolate(minority);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            let h = lab.holders(0).expect("holders");
            assert!(
                !h.contains(&minority),
                "n{minority}, a minority of one, holds the VIP: {h:?}\n{}",
                diag(&lab, &cp)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let report = watch.stop();
        eprintln!("n{minority} cut off from the others for 5 s: {}", report.summary());
        let overlap = holders.longest_dual_ms();
        assert!(overlap <= MAX_PLANNED_OVERLAP_MS, "two holders for {overlap} ms\n{}", diag(&lab, &cp));
        for f in &faults {
            lab.topo.heal(f).expect("heal");
        }
    });
    wait_for(
        &format!("n{minority} to stand by again"),
        UP,
        || lab.role(minority).as_deref() == Some("Standby"),
        || diag(&lab, &cp),
    );
    let first = settled(&lab, &cp);

    // The holder alone: it gives the VIP up, the majority takes it, never both at once.
    let mut faults = Vec::new();
    replaced_without_overlap(&lab, &cp, first, "isolated holder", || faults = isolate(first));
    for f in &faults {
        lab.topo.heal(f).expect("heal");
    }
}
