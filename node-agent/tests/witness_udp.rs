//! The witness over UDP on loopback, against forged and replayed requests: a real witness
//! (`server::serve`) and real member clients; the attacker holds a genuine member key of
//! another pair, or replays a member's recorded datagrams.

use havip_crds::wire::{Key, Keyring};
use havip_crds::witness::{self, Op, Request, member_keyring};
use havip_node_agent::runtime::LeaseStore;
use havip_node_agent::sm::CasResult;
use havip_node_agent::witness::{WitnessClient, WitnessMetrics, WitnessOptions, WitnessState, server};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_millis(300);

fn witness_ring() -> Keyring {
    Keyring { current: Key { id: 1, secret: b"the witness key, 32 bytes long!!".to_vec() }, previous: None }
}

/// A witness on 127.0.0.1 (random port), its state in a temporary directory.
async fn start_witness() -> (SocketAddr, Arc<WitnessMetrics>, tempfile::TempDir, tokio::task::JoinHandle<()>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = server::bind("127.0.0.1:0".parse().expect("address")).await.expect("bind");
    let addr = sock.local_addr().expect("address");
    let metrics = Arc::new(WitnessMetrics::new());
    let opts = WitnessOptions { keys: witness_ring(), state: WitnessState::new(dir.path()), max_pairs: 100 };
    let m = metrics.clone();
    let task = tokio::spawn(async move {
        let _ = server::serve(sock, opts, m).await;
    });
    (addr, metrics, dir, task)
}

async fn member(addr: SocketAddr, pair: &str, node: &str) -> Arc<WitnessClient> {
    WitnessClient::connect(addr, member_keyring(&witness_ring(), pair, node), pair, node, TIMEOUT)
        .await
        .expect("client")
}

#[tokio::test]
async fn a_member_of_another_pair_cannot_move_a_pairs_record() {
    let (addr, metrics, _dir, _task) = start_witness().await;
    let web0 = member(addr, "web", "n0").await;
    assert_eq!(web0.cas("n0", 1, 0).await, CasResult::Ok { epoch: 1 });
    // n0 is dead (it never reads again), so nothing but the key stops a claim of web's
    // record. db's member n0 speaks as web's n1 with the key it holds.
    let db_keys = member_keyring(&witness_ring(), "db", "n0");
    let forger = WitnessClient::connect(addr, db_keys.clone(), "web", "n1", TIMEOUT).await.expect("client");
    tokio::time::sleep(TIMEOUT).await;
    assert_eq!(forger.cas("n1", 2, 1).await, CasResult::Unavailable, "the witness answered a forged claim");
    // Nor can it speak as another member of its own pair.
    let forger = WitnessClient::connect(addr, db_keys.clone(), "db", "n1", TIMEOUT).await.expect("client");
    assert_eq!(forger.cas("n1", 1, 0).await, CasResult::Unavailable);
    let r = web0.read(false, Duration::from_secs(1)).await.expect("web's n0 reads");
    assert_eq!((r.holder.as_deref(), r.epoch), (Some("n0"), 1), "web's record moved");
    assert!(metrics.encode().contains("havip_witness_dropped_total{reason=\"bad_mac\"}"), "{}", metrics.encode());
    // Its own key works for its own pair and member.
    let db0 = WitnessClient::connect(addr, db_keys, "db", "n0", TIMEOUT).await.expect("client");
    assert_eq!(db0.cas("n0", 1, 0).await, CasResult::Ok { epoch: 1 });
}

#[tokio::test]
async fn replayed_reads_of_a_dead_holder_do_not_block_its_takeover() {
    let (addr, _metrics, _dir, _task) = start_witness().await;
    let web0 = member(addr, "web", "n0").await;
    let web1 = member(addr, "web", "n1").await;
    assert_eq!(web0.cas("n0", 1, 0).await, CasResult::Ok { epoch: 1 });
    // n0's last read, as an attacker on the path recorded it: signed with n0's key and
    // the challenge n0 held (it reached the witness once).
    let challenge = web0.read(true, Duration::from_secs(1)).await.expect("read").challenge;
    let n0_key = member_keyring(&witness_ring(), "web", "n0").current;
    let recorded = witness::encode_request(
        &Request { id: 42, challenge, pair: "web".into(), member: "n0".into(), op: Op::Read { holding: true } },
        &n0_key,
    );
    let attacker = tokio::net::UdpSocket::bind("127.0.0.1:0").await.expect("bind");
    attacker.send_to(&recorded, addr).await.expect("send");
    // n0 dies now; the attacker replays its read every 10 ms.
    let replayer = tokio::spawn(async move {
        loop {
            let _ = attacker.send_to(&recorded, addr).await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    tokio::time::sleep(TIMEOUT).await;
    let start = std::time::Instant::now();
    let mut outcome = CasResult::Unavailable;
    while start.elapsed() < Duration::from_secs(3) {
        outcome = web1.cas("n1", 2, 1).await;
        if outcome == (CasResult::Ok { epoch: 2 }) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    replayer.abort();
    assert_eq!(outcome, CasResult::Ok { epoch: 2 }, "the replayed reads kept the dead holder alive");
    assert!(start.elapsed() < Duration::from_millis(500), "granted after {:?}", start.elapsed());
}
