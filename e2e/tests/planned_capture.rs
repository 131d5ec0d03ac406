//! Evidence for the resets of planned moves (issue 17 §3), on demand: 40 planned moves
//! back and forth under four client streams (a new connection every 5 ms each) with a
//! packet capture on the data bridge; prints what the client saw and where the capture is.
//! `DRAIN=0s` (drain off) shows the handshake that straddles the flip: SYN and SYN-ACK
//! with the old holder, the ACK to the new one, which resets it; with the default drain the
//! new holder forwards that ACK to the old holder and no node sends a reset.
//!
//! `cargo test -p havip-e2e --test planned_capture -- --ignored --nocapture` (root, needs
//! `tcpdump`; `MOVES=n`, `DRAIN=5s|0s`). Read the capture with
//! `tcpdump -r <file> -nn -e 'tcp[tcpflags] & tcp-rst != 0'`.

use havip_e2e::agent::PairOptions;
use havip_e2e::traffic::Prober;
use std::time::Duration;

#[test]
#[ignore = "an evidence run (about a minute, needs tcpdump): run it with --ignored"]
fn planned_moves_under_capture() {
    let drain = std::env::var("DRAIN").unwrap_or_else(|_| "5s".into());
    let moves: usize = std::env::var("MOVES").ok().and_then(|m| m.parse().ok()).unwrap_or(40);
    let opts = PairOptions { failback_yaml: Some(format!("drainTimeout: {drain}\n")), ..Default::default() };
    let Some(lab) = havip_e2e::agent::lab_for_test(module_path!(), opts) else { return };
    let first = havip_e2e::agent::bring_up(&lab, Duration::from_secs(15));
    std::thread::sleep(Duration::from_secs(1));
    // Outside the lab's directory, which goes with the lab.
    let pcap = std::env::temp_dir().join(format!("havip-planned-drain-{drain}-{}.pcap", std::process::id()));
    let pcap_s = pcap.display().to_string();
    let mut dump = std::process::Command::new("ip")
        .args(["netns", "exec", lab.topo.switch_ns(), "tcpdump", "-i", "data", "-w", &pcap_s, "-U", "-s", "128"])
        .arg("tcp port 8080 or arp")
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("tcpdump (apt-get install tcpdump)");
    std::thread::sleep(Duration::from_millis(500));
    let more: Vec<Prober> = (0..3).map(|_| Prober::on_client(&lab.topo, lab.target()).expect("prober")).collect();
    let mut holder = 0;
    for m in 0..moves {
        std::thread::sleep(Duration::from_millis(1200));
        let (ok, out) = lab.admin(holder, &["failover"]);
        assert!(ok, "move {m} refused: {out}");
        holder = 1 - holder;
        lab.wait_sole_holder(holder, Duration::from_secs(3)).expect("moved");
    }
    std::thread::sleep(Duration::from_millis(500));
    let mut failed = 0;
    for r in std::iter::once(first).chain(more).map(|p| p.stop().expect("report")) {
        println!("{}", r.summary().split(" runs:").next().unwrap_or_default());
        failed += r.failed;
    }
    let _ = dump.kill();
    let _ = dump.wait();
    for n in lab.topo.nodes() {
        println!("{} eth0 {}", n.name, n.data_mac);
    }
    println!("client eth0 {}\ncapture {pcap_s}", lab.topo.client().mac);
    let resets = std::process::Command::new("tcpdump")
        .args(["-r", &pcap_s, "-nn", "tcp[tcpflags] & tcp-rst != 0 and tcp src port 8080"])
        .output()
        .expect("tcpdump -r");
    let lines = String::from_utf8_lossy(&resets.stdout).lines().count();
    println!("resets sent by a node: {lines}");
    if drain != "0s" {
        assert_eq!(failed, 0, "failed connects across {moves} drained moves");
        assert_eq!(lines, 0, "a node reset a client's connection during drained moves");
    }
}
