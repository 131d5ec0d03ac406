//! Bounded fuzzing of the heartbeat decoder (runs in CI on every `make test`).
//!
//! Random datagrams never pass the MAC, so the interesting inputs are *authentic*
//! garbage: random headers and bodies signed with the right key, which reach the
//! field parser. Every input must decode or be refused — never panic, never loop.
//! `HAVIP_FUZZ_CASES` sets the number of cases per strategy (default 20000).

use havip_wire::{self as wire, Key, Keyring, MAC_LEN};
use hmac::{Hmac, Mac};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use sha2::Sha256;

fn cases() -> u32 {
    std::env::var("HAVIP_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000)
}

fn ring() -> Keyring {
    Keyring { current: Key { id: 3, secret: b"fuzz-key-fuzz-key-fuzz-key-32by".to_vec() }, previous: None }
}

fn sign(mut data: Vec<u8>, key: &Key) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(&key.secret).expect("any key length");
    mac.update(&data);
    data.extend_from_slice(&mac.finalize().into_bytes());
    data
}

#[test]
fn random_bytes_never_panic() {
    let k = ring();
    let mut runner = TestRunner::new(Config { cases: cases(), failure_persistence: None, ..Config::default() });
    runner
        .run(&proptest::collection::vec(any::<u8>(), 0..600), |bytes| {
            let r = wire::decode(&bytes, &k);
            prop_assert!(r.is_err(), "random bytes cannot carry a valid MAC");
            Ok(())
        })
        .expect("no panic");
}

#[test]
fn authentic_garbage_never_panics() {
    let k = ring();
    let mut runner = TestRunner::new(Config { cases: cases(), failure_persistence: None, ..Config::default() });
    // A valid magic and key id, then random bytes, correctly signed.
    let strategy = (any::<u8>(), proptest::collection::vec(any::<u8>(), 0..(wire::MAX_DATAGRAM - MAC_LEN - 8)));
    runner
        .run(&strategy, |(major, rest)| {
            let mut data = b"HV".to_vec();
            data.push(major % 3);
            data.push(0);
            data.extend_from_slice(&k.current.id.to_be_bytes());
            data.extend_from_slice(&rest);
            let signed = sign(data, &k.current);
            let _ = wire::decode(&signed, &k);
            Ok(())
        })
        .expect("no panic");
}

#[test]
fn mutated_valid_heartbeats_never_panic() {
    let k = ring();
    let hb = wire::Heartbeat {
        major: wire::PROTOCOL_MAJOR,
        minor: wire::PROTOCOL_MINOR,
        key_id: 3,
        seq: 1,
        timestamp_ms: 2,
        pair: "p".into(),
        sender: "n".into(),
        body: wire::Body {
            role: wire::WireRole::Standby,
            epoch: 1,
            priority: 1,
            holds_vips: false,
            ready_all: true,
            maintenance: false,
            carrier_ok: true,
            suspended: false,
            failback_paused: false,
            draining: false,
            gateway: wire::WireGateway::Unknown,
            config_revision: 1,
            op: Some(wire::WireOp::Prepare { id: 1, to: "m".into() }),
            interval_ms: 100,
        },
        session: Some(wire::Session { id: 5, echo: 6 }),
        echoes: vec![wire::PathEcho { to: std::net::IpAddr::from([10, 0, 0, 1]), seq: 9, held_us: 100 }],
    };
    let valid = wire::encode(&hb, &k.current);
    let unsigned = valid[..valid.len() - MAC_LEN].to_vec();
    let mut runner = TestRunner::new(Config { cases: cases(), failure_persistence: None, ..Config::default() });
    let strategy = proptest::collection::vec((0..unsigned.len(), any::<u8>()), 1..8);
    runner
        .run(&strategy, |edits| {
            let mut data = unsigned.clone();
            for (i, v) in edits {
                data[i] = v;
            }
            // Re-signed so the mutation reaches the parser.
            let _ = wire::decode(&sign(data, &k.current), &k);
            Ok(())
        })
        .expect("no panic");
}
