//! The wire format's tests: round trips, every truncation and bit flip, keys, versions,
//! and the replay windows.

use super::codec::{FIXED_HEADER, MAGIC, encode_body};
use super::{
    Body, DecodeError, ECHO_MINOR, Heartbeat, INTERVAL_MINOR, Key, Keyring, MAC_LEN, MAX_DATAGRAM, MAX_ECHOES,
    PROTOCOL_MAJOR, PROTOCOL_MINOR, PathEcho, RETIRED_SESSIONS, ReplayError, ReplayWindow, SESSION_MINOR, SenderWindow,
    Session, WireGateway, WireOp, WireRole, decode, encode, mac_of, peek_pair, put_name,
};
use proptest::prelude::*;
use std::net::IpAddr;

fn keyring() -> Keyring {
    Keyring { current: Key { id: 7, secret: b"0123456789abcdef0123456789abcdef".to_vec() }, previous: None }
}

fn sample() -> Heartbeat {
    Heartbeat {
        major: PROTOCOL_MAJOR,
        minor: PROTOCOL_MINOR,
        key_id: 7,
        seq: 1_700_000_000_000_000,
        timestamp_ms: 1_700_000_000_000,
        pair: "web".into(),
        sender: "node-a".into(),
        body: Body {
            role: WireRole::Active,
            epoch: 42,
            priority: 200,
            holds_vips: true,
            ready_all: true,
            maintenance: false,
            carrier_ok: true,
            suspended: false,
            failback_paused: true,
            draining: true,
            gateway: WireGateway::Reachable,
            config_revision: 0xdead_beef,
            op: Some(WireOp::Commit { id: 9, to: "node-b".into(), epoch: 43 }),
            interval_ms: 1_000,
        },
        session: Some(Session { id: 0x1234_5678_9abc_def0, echo: 77 }),
        echoes: vec![
            PathEcho { to: IpAddr::from([10, 0, 0, 2]), seq: 1_700_000_000_000_123, held_us: 4_321 },
            PathEcho { to: "fd00::2".parse().expect("address"), seq: 1_700_000_000_000_124, held_us: u32::MAX },
        ],
    }
}

/// Signs `signed` (everything before the MAC) with the sample keyring's key.
fn sign(mut signed: Vec<u8>, k: &Keyring) -> Vec<u8> {
    let mac = mac_of(&k.current.secret, &signed);
    signed.extend_from_slice(&mac);
    signed
}

/// The sample's datagram with minor `minor` and `tail` after the session, by hand.
fn with_tail(minor: u8, tail: &[u8]) -> Vec<u8> {
    let k = keyring();
    let hb = sample();
    let mut out = Vec::new();
    out.extend_from_slice(&MAGIC);
    out.push(PROTOCOL_MAJOR);
    out.push(minor);
    out.extend_from_slice(&k.current.id.to_be_bytes());
    out.extend_from_slice(&hb.seq.to_be_bytes());
    out.extend_from_slice(&hb.timestamp_ms.to_be_bytes());
    put_name(&mut out, &hb.pair);
    put_name(&mut out, &hb.sender);
    let mut body = encode_body(&hb.body);
    let sess = hb.session.expect("sample has a session");
    body.extend_from_slice(&sess.id.to_be_bytes());
    body.extend_from_slice(&sess.echo.to_be_bytes());
    body.extend_from_slice(tail);
    out.extend_from_slice(&(body.len() as u16).to_be_bytes());
    out.extend_from_slice(&body);
    sign(out, &k)
}

#[test]
fn echoes_roundtrip_and_a_minor_one_receiver_ignores_them() {
    let k = keyring();
    let hb = sample();
    let bytes = encode(&hb, &k.current);
    let got = decode(&bytes, &k).expect("accepted");
    assert_eq!(got.echoes, hb.echoes);
    // What a minor-1 agent does with a minor-2 datagram: it reads the session and ignores
    // the bytes after it — here the same bytes labelled minor 1.
    let mut old = bytes[..bytes.len() - MAC_LEN].to_vec();
    old[3] = SESSION_MINOR;
    let got = decode(&sign(old, &k), &k).expect("a minor-1 reading is accepted");
    assert_eq!(
        (got.body, got.session, got.echoes),
        (Body { interval_ms: 0, ..hb.body.clone() }, hb.session, Vec::new())
    );
    // A minor-1 sender's datagram carries none.
    let got = decode(&encode(&Heartbeat { minor: SESSION_MINOR, ..hb.clone() }, &k.current), &k).expect("accepted");
    assert!(got.echoes.is_empty());
    // Never more than MAX_ECHOES on the wire.
    let many = Heartbeat { echoes: vec![hb.echoes[0]; MAX_ECHOES + 3], ..hb };
    let got = decode(&encode(&many, &k.current), &k).expect("accepted");
    assert_eq!(got.echoes.len(), MAX_ECHOES);
}

#[test]
fn the_interval_roundtrips_and_a_minor_two_receiver_ignores_it() {
    let k = keyring();
    let hb = sample();
    let bytes = encode(&hb, &k.current);
    assert_eq!(decode(&bytes, &k).expect("accepted").body.interval_ms, 1_000);
    // A minor-2 agent reads the echoes and ignores the 4 bytes after them.
    let mut old = bytes[..bytes.len() - MAC_LEN].to_vec();
    old[3] = ECHO_MINOR;
    let got = decode(&sign(old, &k), &k).expect("a minor-2 reading is accepted");
    assert_eq!((got.body.interval_ms, got.echoes), (0, hb.echoes.clone()));
    // A minor-2 sender declares none: 0, whatever its body says.
    let got = decode(&encode(&Heartbeat { minor: ECHO_MINOR, ..hb.clone() }, &k.current), &k).expect("accepted");
    assert_eq!(got.body.interval_ms, 0);
    // A minor-3 datagram that ends after its echoes is malformed.
    assert_eq!(decode(&with_tail(INTERVAL_MINOR, &[0]), &k), Err(DecodeError::Malformed { field: "interval" }));
    assert_eq!(
        decode(&with_tail(INTERVAL_MINOR, &[0, 0, 0, 3]), &k),
        Err(DecodeError::Malformed { field: "interval" })
    );
    assert_eq!(decode(&with_tail(INTERVAL_MINOR, &[0, 0, 0, 3, 0xe8]), &k).expect("accepted").body.interval_ms, 1_000);
}

#[test]
fn malformed_echoes_are_refused() {
    let k = keyring();
    let mut too_many = vec![(MAX_ECHOES + 1) as u8];
    for _ in 0..=MAX_ECHOES {
        too_many.extend_from_slice(&[4, 10, 0, 0, 2]);
        too_many.extend_from_slice(&[0; 12]);
    }
    assert_eq!(decode(&with_tail(ECHO_MINOR, &too_many), &k), Err(DecodeError::Malformed { field: "echo count" }));
    let mut family = vec![1, 5];
    family.extend_from_slice(&[0; 16]);
    assert_eq!(decode(&with_tail(ECHO_MINOR, &family), &k), Err(DecodeError::Malformed { field: "echo address" }));
    assert_eq!(
        decode(&with_tail(ECHO_MINOR, &[1, 4, 10, 0]), &k),
        Err(DecodeError::Malformed { field: "echo address" })
    );
    assert_eq!(
        decode(&with_tail(ECHO_MINOR, &[1, 4, 10, 0, 0, 2, 0, 0]), &k),
        Err(DecodeError::Malformed { field: "echo seq" })
    );
    assert_eq!(decode(&with_tail(ECHO_MINOR, &[]), &k), Err(DecodeError::Malformed { field: "echo count" }));
}

#[test]
fn roundtrip() {
    let k = keyring();
    let bytes = encode(&sample(), &k.current);
    assert!(bytes.len() < 192, "compact: {} bytes", bytes.len());
    assert_eq!(decode(&bytes, &k), Ok(sample()));
}

#[test]
fn every_truncation_is_refused() {
    let k = keyring();
    let bytes = encode(&sample(), &k.current);
    for len in 0..bytes.len() {
        assert!(decode(&bytes[..len], &k).is_err(), "truncated to {len} must fail");
    }
}

#[test]
fn every_bit_flip_is_refused() {
    let k = keyring();
    let bytes = encode(&sample(), &k.current);
    for i in 0..bytes.len() {
        for bit in 0..8 {
            let mut b = bytes.clone();
            b[i] ^= 1 << bit;
            assert!(decode(&b, &k).is_err(), "flip byte {i} bit {bit} must fail");
        }
    }
}

#[test]
fn forged_with_another_key_is_refused() {
    let k = keyring();
    let forger = Key { id: 7, secret: b"not the key".to_vec() };
    assert_eq!(decode(&encode(&sample(), &forger), &k), Err(DecodeError::BadMac));
    let unknown = Key { id: 8, secret: k.current.secret.clone() };
    assert_eq!(decode(&encode(&sample(), &unknown), &k), Err(DecodeError::UnknownKey { key_id: 8 }));
}

#[test]
fn rotation_accepts_previous_key() {
    let old = Key { id: 1, secret: b"old-old-old-old-old".to_vec() };
    let new = Key { id: 2, secret: b"new-new-new-new-new".to_vec() };
    let ring = Keyring { current: new.clone(), previous: Some(old.clone()) };
    assert!(decode(&encode(&sample(), &old), &ring).is_ok());
    assert!(decode(&encode(&sample(), &new), &ring).is_ok());
    let done = Keyring { current: new, previous: None };
    assert_eq!(decode(&encode(&sample(), &old), &done), Err(DecodeError::UnknownKey { key_id: 1 }));
}

#[test]
fn other_major_is_reported_after_authentication() {
    let k = keyring();
    let mut hb = sample();
    hb.major = 2;
    assert_eq!(
        decode(&encode(&hb, &k.current), &k),
        Err(DecodeError::UnsupportedMajor {
            major: 2,
            sender: "node-a".into(),
            seq: hb.seq,
            timestamp_ms: hb.timestamp_ms
        })
    );
}

#[test]
fn newer_minor_with_extra_body_bytes_is_accepted() {
    let k = keyring();
    let hb = sample();
    // Minor 5: no echoes, the interval, then 3 bytes this build does not know.
    let out = with_tail(5, &[0, 0, 0, 3, 0xe8, 1, 2, 3]);
    let got = decode(&out, &k).expect("accepted");
    assert_eq!(got.minor, 5);
    assert_eq!(got.body, hb.body);
    assert_eq!(got.session, hb.session);
}

#[test]
fn minor_zero_senders_carry_no_session_and_still_decode() {
    let k = keyring();
    let mut hb = sample();
    hb.minor = 0;
    let got = decode(&encode(&hb, &k.current), &k).expect("accepted");
    assert_eq!(got.session, None, "a minor-0 datagram carries no session");
    assert_eq!(got.body, Body { interval_ms: 0, ..hb.body });
    // A minor-1 datagram without the session bytes is malformed (authentic but short).
    let mut out = encode(&Heartbeat { minor: 0, ..sample() }, &k.current);
    out[3] = SESSION_MINOR;
    let n = out.len() - MAC_LEN;
    out.truncate(n);
    let mac = mac_of(&k.current.secret, &out);
    out.extend_from_slice(&mac);
    assert_eq!(decode(&out, &k), Err(DecodeError::Malformed { field: "session" }));
}

#[test]
fn peek_pair_reads_the_name_without_the_key() {
    let k = keyring();
    let bytes = encode(&sample(), &k.current);
    assert_eq!(peek_pair(&bytes), Ok("web"));
    // A forged datagram still names its pair; authentication comes after.
    let forged = encode(&sample(), &Key { id: 7, secret: b"not the key".to_vec() });
    assert_eq!(peek_pair(&forged), Ok("web"));
    assert_eq!(peek_pair(&bytes[..10]), Err(DecodeError::Truncated { len: 10 }));
    let mut bad = bytes.clone();
    bad[0] = b'X';
    assert_eq!(peek_pair(&bad), Err(DecodeError::BadMagic));
    let mut long = bytes.clone();
    long[FIXED_HEADER] = 200;
    assert_eq!(peek_pair(&long), Err(DecodeError::Malformed { field: "pair" }));
    let mut utf = bytes;
    utf[FIXED_HEADER + 1] = 0xff;
    assert_eq!(peek_pair(&utf), Err(DecodeError::Malformed { field: "pair" }));
    for len in 0..80 {
        let _ = peek_pair(&vec![b'H'; len]);
    }
}

const OWN: u64 = 0xaaaa;
fn sess(id: u64, echo: u64) -> Option<Session> {
    Some(Session { id, echo })
}

#[test]
fn a_restarted_sender_whose_clock_stepped_back_is_heard_once_it_echoes_us() {
    let mut w = SenderWindow::default();
    let now = 10_000_000;
    // The sender ran with its clock ahead: high sequence numbers.
    for seq in 5_000..5_010 {
        assert!(w.check("data", sess(1, OWN), OWN, seq, now, now, 60_000).is_ok());
    }
    // Restarted on the true clock: lower sequence numbers, a new session. Before it
    // heard us it cannot echo us: refused, and the old session stays current.
    assert_eq!(
        w.check("data", sess(2, 0), OWN, 100, now, now, 60_000),
        Err(ReplayError::UnconfirmedSession { session: 2 })
    );
    assert_eq!(w.session(), Some(1));
    // Once it echoes our session it is heard at once, lower sequence or not.
    assert!(w.check("data", sess(2, OWN), OWN, 101, now, now, 60_000).is_ok());
    assert!(w.check("mgmt", sess(2, OWN), OWN, 101, now, now, 60_000).is_ok(), "every path");
    assert_eq!(w.session(), Some(2));
    assert!(w.check("data", sess(2, OWN), OWN, 102, now, now, 60_000).is_ok());
    // Replay protection holds within the new session …
    assert_eq!(w.check("data", sess(2, OWN), OWN, 101, now, now, 60_000), Err(ReplayError::Replayed { seq: 101 }));
    // … and the replaced session is refused for good, echo or not.
    assert_eq!(
        w.check("data", sess(1, OWN), OWN, 9_999, now, now, 60_000),
        Err(ReplayError::RetiredSession { session: 1 })
    );
}

#[test]
fn the_first_session_is_accepted_without_an_echo_and_replaced_by_a_confirmed_one() {
    let mut w = SenderWindow::default();
    let now = 10_000_000;
    // Receiver just started: the sender still echoes our previous incarnation.
    assert!(w.check("data", sess(7, 0x1111), OWN, 10, now, now, 60_000).is_ok());
    // Another unconfirmed session cannot displace it (a replay of older traffic) …
    assert_eq!(
        w.check("data", sess(8, 0x1111), OWN, 500, now, now, 60_000),
        Err(ReplayError::UnconfirmedSession { session: 8 })
    );
    // … a confirmed one can.
    assert!(w.check("data", sess(8, OWN), OWN, 1, now, now, 60_000).is_ok());
    assert_eq!(
        w.check("data", sess(7, OWN), OWN, 11, now, now, 60_000),
        Err(ReplayError::RetiredSession { session: 7 })
    );
}

#[test]
fn retired_sessions_are_bounded_and_stale_comes_first() {
    let mut w = SenderWindow::default();
    let now = 10_000_000;
    for id in 1..=(RETIRED_SESSIONS as u64 + 3) {
        assert!(w.check("data", sess(id, OWN), OWN, 1, now, now, 60_000).is_ok());
    }
    assert_eq!(w.retired.len(), RETIRED_SESSIONS);
    assert_eq!(
        w.check("data", sess(RETIRED_SESSIONS as u64 + 3, OWN), OWN, 2, now - 61_000, now, 60_000),
        Err(ReplayError::Stale { skew_ms: 61_000 })
    );
}

#[test]
fn senders_without_sessions_keep_the_old_window_per_path() {
    let mut w = SenderWindow::default();
    let now = 10_000_000;
    assert!(w.check("data", None, OWN, 100, now, now, 60_000).is_ok());
    assert!(w.check("mgmt", None, OWN, 100, now, now, 60_000).is_ok());
    assert_eq!(w.check("data", None, OWN, 100, now, now, 60_000), Err(ReplayError::Replayed { seq: 100 }));
    assert_eq!(w.session(), None);
    // Upgraded: sessions from now on.
    assert!(w.check("data", sess(3, 0), OWN, 1, now, now, 60_000).is_ok());
    // A datagram without a session is now a replay of the older traffic …
    assert_eq!(
        w.check("data", None, OWN, 101, now + 1_000, now + 1_000, 60_000),
        Err(ReplayError::Replayed { seq: 101 })
    );
    // … until the session has been silent past the freshness bound (a downgrade).
    assert!(w.check("data", None, OWN, 102, now + 61_000, now + 61_000, 60_000).is_ok());
    assert_eq!(w.session(), None);
    assert_eq!(
        w.check("data", sess(3, OWN), OWN, 2, now + 61_000, now + 61_000, 60_000),
        Err(ReplayError::RetiredSession { session: 3 })
    );
}

#[test]
fn oversized_is_refused_unread() {
    let k = keyring();
    assert_eq!(decode(&[0u8; MAX_DATAGRAM + 1], &k), Err(DecodeError::Oversized { len: MAX_DATAGRAM + 1 }));
}

#[test]
fn replay_window() {
    let mut w = ReplayWindow::default();
    let now = 1_000_000;
    assert!(w.check(100, now, now, 60_000).is_ok());
    assert_eq!(w.check(100, now, now, 60_000), Err(ReplayError::Replayed { seq: 100 }));
    assert!(w.check(102, now, now, 60_000).is_ok());
    assert!(w.check(101, now, now, 60_000).is_ok(), "out of order within the window");
    assert_eq!(w.check(101, now, now, 60_000), Err(ReplayError::Replayed { seq: 101 }));
    assert!(w.check(1000, now, now, 60_000).is_ok());
    assert_eq!(w.check(900, now, now, 60_000), Err(ReplayError::Replayed { seq: 900 }), "below the window");
    assert_eq!(w.check(2000, now - 61_000, now, 60_000), Err(ReplayError::Stale { skew_ms: 61_000 }));
    assert_eq!(w.check(2000, now + 61_000, now, 60_000), Err(ReplayError::Stale { skew_ms: -61_000 }));
}

fn arb_body() -> impl Strategy<Value = Body> {
    let op = prop_oneof![
        Just(None),
        (any::<u64>(), "[a-z0-9-]{0,63}").prop_map(|(id, to)| Some(WireOp::Prepare { id, to })),
        any::<u64>().prop_map(|id| Some(WireOp::PrepareAck { id })),
        (any::<u64>(), any::<u8>()).prop_map(|(id, reason)| Some(WireOp::Refuse { id, reason })),
        (any::<u64>(), "[a-z0-9-]{0,63}", any::<u64>()).prop_map(|(id, to, epoch)| Some(WireOp::Commit {
            id,
            to,
            epoch
        })),
        any::<u64>().prop_map(|id| Some(WireOp::Confirm { id })),
        any::<u64>().prop_map(|id| Some(WireOp::Abort { id })),
    ];
    let gateway = prop_oneof![Just(WireGateway::Unknown), Just(WireGateway::Reachable), Just(WireGateway::Unreachable)];
    (0u8..7, any::<u64>(), any::<u8>(), any::<[bool; 7]>(), gateway, any::<u64>(), op, any::<u32>()).prop_map(
        |(role, epoch, priority, f, gateway, config_revision, op, interval_ms)| Body {
            role: WireRole::from_u8(role).unwrap_or(WireRole::Init),
            epoch,
            priority,
            holds_vips: f[0],
            ready_all: f[1],
            maintenance: f[2],
            carrier_ok: f[3],
            suspended: f[4],
            failback_paused: f[5],
            draining: f[6],
            gateway,
            config_revision,
            op,
            interval_ms,
        },
    )
}

proptest! {
    #[test]
    fn any_heartbeat_roundtrips(body in arb_body(), seq in any::<u64>(), ts in any::<u64>(),
                                pair in "[a-z0-9-]{1,63}", sender in "[a-z0-9.-]{1,63}",
                                echoes in proptest::collection::vec((any::<[u8; 4]>(), any::<[u8; 16]>(), any::<bool>(), any::<u64>(), any::<u32>()), 0..=MAX_ECHOES)) {
        let k = keyring();
        let session = Some(Session { id: seq | 1, echo: ts });
        let echoes = echoes.into_iter().map(|(v4, v6, pick, seq, held_us)| PathEcho {
            to: if pick { IpAddr::from(v4) } else { IpAddr::from(v6) }, seq, held_us,
        }).collect();
        let hb = Heartbeat { major: PROTOCOL_MAJOR, minor: PROTOCOL_MINOR, key_id: 7, seq, timestamp_ms: ts, pair, sender, body, session, echoes };
        let bytes = encode(&hb, &k.current);
        prop_assert!(bytes.len() <= MAX_DATAGRAM);
        prop_assert_eq!(decode(&bytes, &k), Ok(hb));
    }
}

mod bundles {
    use super::super::bundle::{MAX_BUNDLE_SENT, MAX_SECTIONS, is_bundle, pack, sections};
    use super::*;

    /// The sample heartbeat of pair `pair`, signed with `key`.
    fn hb_of(pair: &str, key: &Key) -> Vec<u8> {
        encode(&Heartbeat { pair: pair.into(), ..sample() }, key)
    }

    #[test]
    fn sections_come_back_whole_and_each_verifies_with_its_own_pairs_key() {
        let k1 = keyring();
        let k2 =
            Keyring { current: Key { id: 9, secret: b"another pair's key, 32 bytes ok!".to_vec() }, previous: None };
        let a = hb_of("web", &k1.current);
        let b = hb_of("db", &k2.current);
        let packed = pack(&[a.as_slice(), b.as_slice()]);
        assert_eq!(packed.len(), 1, "two heartbeats fit one bundle");
        assert_eq!(packed[0].1, 2);
        assert!(is_bundle(&packed[0].0));
        let got = sections(&packed[0].0).expect("framing");
        assert_eq!(got, vec![a.as_slice(), b.as_slice()]);
        assert_eq!(peek_pair(got[0]), Ok("web"));
        assert_eq!(decode(got[0], &k1).expect("web verifies with web's key").pair, "web");
        assert_eq!(decode(got[1], &k2).expect("db verifies with db's key").pair, "db");
        // A section verified with the other pair's keys fails, as a datagram alone would.
        assert!(decode(got[1], &k1).is_err());
    }

    #[test]
    fn a_lone_heartbeat_goes_as_a_plain_datagram() {
        let a = hb_of("web", &keyring().current);
        assert_eq!(pack(&[a.as_slice()]), vec![(a.clone(), 1)]);
        assert!(!is_bundle(&a));
        assert!(pack(&[]).is_empty());
    }

    #[test]
    fn many_heartbeats_fill_bundles_up_to_the_size_and_section_limits() {
        let k = keyring();
        let all: Vec<Vec<u8>> = (0..100).map(|i| hb_of(&format!("pair-{i}"), &k.current)).collect();
        let refs: Vec<&[u8]> = all.iter().map(Vec::as_slice).collect();
        let packed = pack(&refs);
        let mut back: Vec<Vec<u8>> = Vec::new();
        for (d, n) in &packed {
            assert!(d.len() <= MAX_BUNDLE_SENT, "{} bytes", d.len());
            let s = if is_bundle(d) { sections(d).expect("framing") } else { vec![d.as_slice()] };
            assert_eq!(s.len(), *n);
            assert!(s.len() <= MAX_SECTIONS);
            back.extend(s.into_iter().map(<[u8]>::to_vec));
        }
        assert_eq!(back, all, "every heartbeat once, in order");
        let per = all[0].len() + 2;
        let expected = 100usize.div_ceil(((MAX_BUNDLE_SENT - 4) / per).min(MAX_SECTIONS));
        assert_eq!(packed.len(), expected, "{per} bytes per section");
    }

    #[test]
    fn bad_framing_is_refused() {
        let k = keyring();
        let a = hb_of("web", &k.current);
        let good = pack(&[a.as_slice(), a.as_slice()]).remove(0).0;
        for len in 0..good.len() {
            assert!(sections(&good[..len]).is_err(), "truncated to {len}");
        }
        let mut v = good.clone();
        v[2] = 2;
        assert_eq!(sections(&v), Err(DecodeError::Malformed { field: "bundle version" }));
        for n in [0u8, 1, (MAX_SECTIONS + 1) as u8] {
            let mut v = good.clone();
            v[3] = n;
            assert_eq!(sections(&v), Err(DecodeError::Malformed { field: "bundle count" }), "count {n}");
        }
        let mut v = good.clone();
        v.push(0);
        assert_eq!(sections(&v), Err(DecodeError::Malformed { field: "bundle trailing bytes" }));
        let mut v = good.clone();
        v[4] = 0x7f;
        assert_eq!(sections(&v), Err(DecodeError::Malformed { field: "bundle section" }));
        assert_eq!(sections(&a), Err(DecodeError::BadMagic));
        assert!(matches!(sections(&vec![b'H'; 2000]), Err(DecodeError::Oversized { .. })));
    }

    proptest! {
        #[test]
        fn any_bytes_after_the_magic_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..1600)) {
            let mut buf = b"HB".to_vec();
            buf.extend_from_slice(&tail);
            let _ = sections(&buf);
        }
    }
}
