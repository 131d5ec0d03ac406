//! `lab demo-control-plane` (`make demo-control-plane`): the control-plane VIP's tour, in
//! the foreground. Three node namespaces run havip's agent in control-plane mode (the
//! members vote, each gated on its own kube-apiserver's `/readyz`) before any API server
//! exists; then etcd and kube-apiserver start on every node and kubectl works through the
//! VIP; the holder's API server is killed, then the new holder's node is cut off, and
//! kubectl through the VIP works again each time. Everything is removed at the end.

use crate::demo::{Out, secs};
use havip_e2e::agent::{API_PORT, AgentLab, PairOptions};
use havip_e2e::cpcluster::CpCluster;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

const STEPS: usize = 6;

/// Runs the tour.
pub fn run() -> Result<(), String> {
    let mut out = Out::new(STEPS);
    let started = Instant::now();
    let result = tour(&mut out);
    if result.is_err() && out.open {
        println!("FAILED");
    }
    result?;
    println!(
        "[{STEPS}/{STEPS}] done in {}; the lab is gone. docs/control-plane.md has the rest.",
        secs(started.elapsed())
    );
    Ok(())
}

fn holder(lab: &AgentLab, timeout: Duration) -> Result<usize, String> {
    let start = Instant::now();
    loop {
        if let Ok(h) = lab.holders(0)
            && let [one] = h.as_slice()
        {
            return Ok(*one);
        }
        if start.elapsed() > timeout {
            return Err(format!("no single holder within {timeout:?}\n{}", lab.diagnostics()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until a member other than `old` holds the VIP alone; returns it and how long.
fn moved_from(lab: &AgentLab, old: usize, timeout: Duration) -> Result<(usize, Duration), String> {
    let start = Instant::now();
    loop {
        if let Ok(h) = lab.holders(0)
            && let [one] = h.as_slice()
            && *one != old
        {
            return Ok((*one, start.elapsed()));
        }
        if start.elapsed() > timeout {
            return Err(format!("the VIP did not leave n{old} within {timeout:?}\n{}", lab.diagnostics()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `kubectl get namespaces` through the VIP from the client, retried for up to `timeout`.
fn kubectl_through_vip(cp: &CpCluster, lab: &AgentLab, timeout: Duration) -> Result<String, String> {
    let vip = SocketAddr::new(IpAddr::V4(lab.vip_addr(0)), API_PORT);
    let start = Instant::now();
    loop {
        let (ok, text) = cp.kubectl(lab.client_ns(), vip, &["--request-timeout=2s", "get", "namespaces", "-o", "name"]);
        if ok {
            return Ok(text.lines().map(|l| l.trim_start_matches("namespace/")).collect::<Vec<_>>().join(" "));
        }
        if start.elapsed() > timeout {
            return Err(format!("kubectl through the VIP: {text}"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn tour(out: &mut Out) -> Result<(), String> {
    out.step(1, "three control-plane nodes, havip in control-plane mode, no API server yet");
    let lab = AgentLab::start(PairOptions::control_plane()).map_err(|e| e.to_string())?;
    let first = holder(&lab, Duration::from_secs(20))?;
    out.done(&format!("n{first} holds {} (someone holds it before any API server exists)", lab.vip_addr(0)));
    out.detail("each member: quorum (a takeover needs 2 of 3 votes), apiServer (its own /readyz over HTTPS gates it)");

    out.step(2, "etcd and kube-apiserver on every node (the VIP in the serving certificate)");
    let t = Instant::now();
    let mut cp = CpCluster::for_agent_lab(&lab).map_err(|e| e.to_string())?;
    let names = kubectl_through_vip(&cp, &lab, Duration::from_secs(20))?;
    out.done(&format!("up in {}", secs(t.elapsed())));
    out.detail(&format!("kubectl get namespaces through the VIP: {names}"));
    // When the API servers come up the VIP may move once to the first one found ready.
    std::thread::sleep(Duration::from_secs(2));
    let h = holder(&lab, Duration::from_secs(10))?;

    out.step(3, &format!("kill n{h}'s kube-apiserver"));
    let t = Instant::now();
    cp.kill_apiserver(h);
    let (to, took) = moved_from(&lab, h, Duration::from_secs(10))?;
    kubectl_through_vip(&cp, &lab, Duration::from_secs(20))?;
    out.done(&format!(
        "n{to} holds the VIP {} later; kubectl through it works ({} after the kill)",
        secs(took),
        secs(t.elapsed())
    ));
    cp.start_apiserver(h).map_err(|e| e.to_string())?;
    out.detail(&format!("n{h}'s API server started again; the VIP stays on n{to} (no failback)"));

    out.step(4, &format!("cut n{to}'s cables (its etcd member goes too)"));
    let t = Instant::now();
    lab.topo.kill_node_links(to).map_err(|e| e.to_string())?;
    let (next, took) = moved_from(&lab, to, Duration::from_secs(10))?;
    kubectl_through_vip(&cp, &lab, Duration::from_secs(30))?;
    out.done(&format!(
        "n{next} holds the VIP {} later (the majority's vote); kubectl through it works {} after the cut",
        secs(took),
        secs(t.elapsed())
    ));
    let isolated = lab.status(to).and_then(|s| s["holdsVips"].as_bool());
    out.detail(&format!(
        "n{to}, alone, holds the VIP: {} (it gave it up without a majority)",
        isolated.unwrap_or(false)
    ));

    out.step(5, &format!("reconnect n{to}"));
    lab.topo.restore_node(to).map_err(|e| e.to_string())?;
    cp.wait_ready(to, Duration::from_secs(60)).map_err(|e| e.to_string())?;
    let h = holder(&lab, Duration::from_secs(10))?;
    out.done(&format!("its API server is ready again; n{h} keeps the VIP, one holder"));
    drop(cp);
    drop(lab);
    Ok(())
}
