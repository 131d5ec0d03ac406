//! The encoder against nft's own bytes, and the dump parser against the kernel's
//! bytes and against damaged input.
//!
//! `testdata/golden.hex` holds what nft 1.0.6 sends for `testdata/golden.nft`: run
//! `nft --debug=mnl -f golden.nft` in a scratch network namespace and convert the
//! dump with `python3 testdata/mnl2hex.py` (one line per message: nfgenmsg family and
//! the attributes after it, in hex). The rule text there is exactly what
//! [`forward_rule`], [`forward_unowned_rule`], [`forward_close_rule`], [`guard_rule`],
//! [`quiet_input_rule`] and [`quiet_output_rule`] document.

use super::{
    BASE_NETWORK, Counter, FWD_PREROUTING, GUARD_PREROUTING, IPPROTO_TCP, NFPROTO_ARP, NFPROTO_IPV4, NFPROTO_IPV6,
    NFTA_COUNTER_BYTES, NFTA_COUNTER_PACKETS, NFTA_RULE_CHAIN, NFTA_RULE_EXPRESSIONS, NFTA_RULE_TABLE,
    NFTA_TABLE_FLAGS, Program, QUIET_ARP_INPUT, QUIET_ARP_OUTPUT, QUIET_IP6_INPUT, QUIET_IP6_OUTPUT, REG_1,
    chain_attrs, daddr_offset, forward_close_rule, forward_rule, forward_unowned_rule, guard_rule, octets,
    parse_forward_rule, parse_table_name, quiet_input_rule, quiet_output_rule, table_attrs,
};
use crate::nft::msg::{self, Writer};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

const GOLDEN: &str = include_str!("../testdata/golden.hex");
/// A forwarder rule dump as Linux 6.18 sends it (`NFT_MSG_NEWRULE`, the attributes
/// after the nfgenmsg, family ip): `testdata/kernel-rule-dump.nft` loaded with nft
/// (which can preset a counter), read back with this module's dump and printed. Unlike
/// nft, the kernel does not set `NLA_F_NESTED` on the nests it sends.
const KERNEL_RULE_DUMP: &str = include_str!("../testdata/kernel-rule-dump.hex");

const VIP4: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 50);
const OWN4: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 10);
const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x50);
const OWN6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x10);

fn golden(label: &str) -> (u8, String) {
    for line in GOLDEN.lines().filter(|l| !l.starts_with('#')) {
        let mut w = line.split_whitespace();
        if w.next() == Some(label) {
            let family = w.next().and_then(|f| f.parse().ok()).expect("family");
            return (family, w.next().expect("hex").to_owned());
        }
    }
    panic!("no golden line {label}");
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.trim().len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
}

/// The attributes `body` writes, as they would follow the nfgenmsg.
fn encode(body: impl FnOnce(&mut Writer)) -> String {
    let mut w = Writer::new();
    body(&mut w);
    hex(&w.finish().unwrap())
}

/// Shows where two hex strings part, for a readable failure.
fn assert_same(label: &str, ours: &str, nft: &str) {
    if ours != nft {
        // The whole encoding, to decode and compare with testdata/mnl2hex.py's output.
        println!("{label} ours: {ours}");
        let at = ours.bytes().zip(nft.bytes()).position(|(a, b)| a != b).unwrap_or(ours.len().min(nft.len()));
        let from = at.saturating_sub(40);
        panic!(
            "{label}: differs from nft at byte {} (ours {} bytes, nft {} bytes)\n ours …{}\n  nft …{}",
            at / 2,
            ours.len() / 2,
            nft.len() / 2,
            &ours[from..(at + 40).min(ours.len())],
            &nft[from..(at + 40).min(nft.len())]
        );
    }
}

#[test]
fn tables_and_chains_encode_as_nft_does() {
    let cases: [(&str, u8, String); 12] = [
        ("table-ip-fwd", NFPROTO_IPV4, encode(|w| table_attrs(w, "havip-p1-fwd"))),
        ("chain-ip-fwd-prerouting", NFPROTO_IPV4, encode(|w| chain_attrs(w, "havip-p1-fwd", FWD_PREROUTING))),
        ("table-ip6-fwd", NFPROTO_IPV6, encode(|w| table_attrs(w, "havip-p1-fwd"))),
        ("table-arp-quiet", NFPROTO_ARP, encode(|w| table_attrs(w, "havip-p1-quiet"))),
        ("chain-arp-quiet-input", NFPROTO_ARP, encode(|w| chain_attrs(w, "havip-p1-quiet", QUIET_ARP_INPUT))),
        ("chain-arp-quiet-output", NFPROTO_ARP, encode(|w| chain_attrs(w, "havip-p1-quiet", QUIET_ARP_OUTPUT))),
        ("chain-ip6-quiet-input", NFPROTO_IPV6, encode(|w| chain_attrs(w, "havip-p1-quiet", QUIET_IP6_INPUT))),
        ("chain-ip6-quiet-output", NFPROTO_IPV6, encode(|w| chain_attrs(w, "havip-p1-quiet", QUIET_IP6_OUTPUT))),
        ("table-ip-guard", NFPROTO_IPV4, encode(|w| table_attrs(w, "havip-p1-guard"))),
        ("chain-ip-guard-prerouting", NFPROTO_IPV4, encode(|w| chain_attrs(w, "havip-p1-guard", GUARD_PREROUTING))),
        ("table-ip6-guard", NFPROTO_IPV6, encode(|w| table_attrs(w, "havip-p1-guard"))),
        ("chain-ip6-guard-prerouting", NFPROTO_IPV6, encode(|w| chain_attrs(w, "havip-p1-guard", GUARD_PREROUTING))),
    ];
    for (label, family, ours) in cases {
        let (nft_family, nft) = golden(label);
        assert_eq!(family, nft_family, "{label}");
        assert_same(label, &ours, &nft);
    }
}

#[test]
fn forwarder_rules_encode_as_nft_does() {
    let v4 = encode(|w| forward_rule(w, "havip-p1-fwd", VIP4.into(), OWN4.into(), 2, 2));
    assert_same("rule-fwd-ip", &v4, &golden("rule-fwd-ip").1);
    let v6 = encode(|w| forward_rule(w, "havip-p1-fwd", VIP6.into(), OWN6.into(), 2, 2));
    assert_same("rule-fwd-ip6", &v6, &golden("rule-fwd-ip6").1);
    let v4 = encode(|w| forward_unowned_rule(w, "havip-p1-fwd", VIP4.into(), OWN4.into(), 2, 2));
    assert_same("rule-fwd-unowned-ip", &v4, &golden("rule-fwd-unowned-ip").1);
    let v6 = encode(|w| forward_unowned_rule(w, "havip-p1-fwd", VIP6.into(), OWN6.into(), 2, 2));
    assert_same("rule-fwd-unowned-ip6", &v6, &golden("rule-fwd-unowned-ip6").1);
    let v4 = encode(|w| forward_close_rule(w, "havip-p1-fwd", VIP4.into(), OWN4.into(), 2, 2));
    assert_same("rule-fwd-close-ip", &v4, &golden("rule-fwd-close-ip").1);
    let v6 = encode(|w| forward_close_rule(w, "havip-p1-fwd", VIP6.into(), OWN6.into(), 2, 2));
    assert_same("rule-fwd-close-ip6", &v6, &golden("rule-fwd-close-ip6").1);
}

#[test]
fn guard_rules_encode_as_nft_does() {
    let v4 = encode(|w| guard_rule(w, "havip-p1-guard", VIP4.into(), 2));
    assert_same("rule-guard-ip", &v4, &golden("rule-guard-ip").1);
    let v6 = encode(|w| guard_rule(w, "havip-p1-guard", VIP6.into(), 2));
    assert_same("rule-guard-ip6", &v6, &golden("rule-guard-ip6").1);
}

#[test]
fn quieter_rules_encode_as_nft_does() {
    let t = "havip-p1-quiet";
    assert_same(
        "rule-quiet-arp-input",
        &encode(|w| quiet_input_rule(w, t, VIP4.into())),
        &golden("rule-quiet-arp-input").1,
    );
    assert_same(
        "rule-quiet-arp-output",
        &encode(|w| quiet_output_rule(w, t, VIP4.into(), OWN4.into())),
        &golden("rule-quiet-arp-output").1,
    );
    assert_same(
        "rule-quiet-ip6-input",
        &encode(|w| quiet_input_rule(w, t, VIP6.into())),
        &golden("rule-quiet-ip6-input").1,
    );
    assert_same(
        "rule-quiet-ip6-output",
        &encode(|w| quiet_output_rule(w, t, VIP6.into(), OWN6.into())),
        &golden("rule-quiet-ip6-output").1,
    );
}

#[test]
fn the_kernels_rule_dump_parses() {
    let body = unhex(KERNEL_RULE_DUMP);
    let r = parse_forward_rule(NFPROTO_IPV4, &body).unwrap();
    assert_eq!(r.table, "havip-p1-fwd");
    assert_eq!(r.chain, "prerouting");
    assert_eq!(r.vip, IpAddr::from(VIP4));
    assert_eq!(r.counter, Counter { packets: 3, bytes: 180 });
    // The same bytes are not an IPv6 rule.
    assert!(parse_forward_rule(NFPROTO_IPV6, &body).is_err());
    assert!(parse_forward_rule(NFPROTO_ARP, &body).is_err());
}

#[test]
fn our_own_rule_parses_back_in_both_families() {
    // What we send has an empty counter; the kernel's dump fills in the numbers.
    // Rebuild ours with numbers in the counter, the rest unchanged.
    for (vip, old, family) in
        [(IpAddr::from(VIP4), IpAddr::from(OWN4), NFPROTO_IPV4), (VIP6.into(), OWN6.into(), NFPROTO_IPV6)]
    {
        let mut w = Writer::new();
        w.string(NFTA_RULE_TABLE, "havip-p-fwd");
        w.string(NFTA_RULE_CHAIN, "prerouting");
        w.nest(NFTA_RULE_EXPRESSIONS, |w| {
            let mut p = Program { w };
            p.field_eq(BASE_NETWORK, daddr_offset(vip), &octets(vip));
            p.expr("counter", |w| {
                w.bytes(NFTA_COUNTER_BYTES, &7u64.to_be_bytes());
                w.bytes(NFTA_COUNTER_PACKETS, &1u64.to_be_bytes());
            });
            p.immediate(REG_1, &octets(old));
        });
        let r = parse_forward_rule(family, &w.finish().unwrap()).unwrap();
        assert_eq!((r.vip, r.counter), (vip, Counter { packets: 1, bytes: 7 }));
    }
}

#[test]
fn a_truncated_dump_is_an_error_never_a_panic() {
    let body = unhex(KERNEL_RULE_DUMP);
    for cut in 0..body.len() {
        // Cuts that land between two top-level attributes leave a shorter but
        // well-formed rule; all others must be errors, and none may panic.
        let r = parse_forward_rule(NFPROTO_IPV4, &body[..cut]);
        if let Ok(r) = &r {
            assert_eq!(r.vip, IpAddr::from(VIP4), "cut at {cut}");
        }
    }
    // Cutting anywhere inside the expressions (the last attribute) never yields a rule.
    let mut exprs_at = 0;
    for a in msg::attrs(&body) {
        let a = a.unwrap();
        if a.ty == NFTA_RULE_EXPRESSIONS {
            break;
        }
        exprs_at += (4 + a.value.len() + 3) & !3;
    }
    assert_eq!(exprs_at, 48, "table, chain and handle come first");
    for cut in exprs_at..body.len() {
        assert!(parse_forward_rule(NFPROTO_IPV4, &body[..cut]).is_err(), "cut at {cut}");
    }
}

#[test]
fn garbage_and_foreign_rules_are_errors() {
    // Deterministic pseudo-random bytes: no panic, whatever they are.
    let mut x: u32 = 0x1234_5678;
    for len in 0..600 {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        let _ = parse_forward_rule(NFPROTO_IPV4, &bytes);
        let _ = parse_table_name(&bytes);
    }
    // Flipping each byte of a real dump: an error or a rule, never a panic.
    let body = unhex(KERNEL_RULE_DUMP);
    for i in 0..body.len() {
        let mut b = body.clone();
        b[i] ^= 0xff;
        let _ = parse_forward_rule(NFPROTO_IPV4, &b);
    }
    // A rule that does not start with the VIP match (a quieter rule, say).
    let mut w = Writer::new();
    w.string(NFTA_RULE_TABLE, "havip-p-fwd");
    w.string(NFTA_RULE_CHAIN, "prerouting");
    w.nest(NFTA_RULE_EXPRESSIONS, |w| {
        let mut p = Program { w };
        p.l4proto(IPPROTO_TCP);
        p.counter();
    });
    let err = parse_forward_rule(NFPROTO_IPV4, &w.finish().unwrap()).unwrap_err();
    assert!(err.0.contains("destination address"), "{err}");
    // A VIP match without a counter.
    let mut w = Writer::new();
    w.string(NFTA_RULE_TABLE, "havip-p-fwd");
    w.string(NFTA_RULE_CHAIN, "prerouting");
    w.nest(NFTA_RULE_EXPRESSIONS, |w| Program { w }.field_eq(BASE_NETWORK, 16, &VIP4.octets()));
    assert!(parse_forward_rule(NFPROTO_IPV4, &w.finish().unwrap()).unwrap_err().0.contains("counter"));
    // A rule without expressions, and a table without a name.
    let mut w = Writer::new();
    w.string(NFTA_RULE_TABLE, "havip-p-fwd");
    assert!(parse_forward_rule(NFPROTO_IPV4, &w.finish().unwrap()).is_err());
    let mut w = Writer::new();
    w.u32_be(NFTA_TABLE_FLAGS, 0);
    assert!(parse_table_name(&w.finish().unwrap()).is_err());
}
