//! Naming, validation and batch framing; the kernel tests are in
//! `e2e/tests/netns_drain_rules.rs`.

use super::msg::{self, NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END, NLM_F_ACK, NLM_F_REQUEST};
use super::sock::{self, Batch};
use super::{
    Counter, Family, ForwardRule, GuardRule, KEPT_PAIR, MAX_NAME, MAX_PLAIN_PAIR, Nft, NftError, Op, QuietRule,
    TableKind, TableRef, expr, fnv1a64, replace_table, table_name,
};
use nix::errno::Errno;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

#[test]
fn short_pair_names_are_used_as_they_are() {
    assert_eq!(table_name("web", TableKind::Forwarder).unwrap(), "havip-web-fwd");
    assert_eq!(table_name("a.b-c", TableKind::Quieter).unwrap(), "havip-a.b-c-quiet");
    let tables = TableRef::of_pair("web").unwrap();
    let shown: Vec<String> = tables.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "ip havip-web-fwd",
            "ip6 havip-web-fwd",
            "arp havip-web-quiet",
            "ip6 havip-web-quiet",
            "ip havip-web-guard",
            "ip6 havip-web-guard"
        ]
    );
    assert_eq!(tables[0].kind(), Some(TableKind::Forwarder));
    assert_eq!(tables[3].kind(), Some(TableKind::Quieter));
    assert_eq!(tables[5].kind(), Some(TableKind::Guard));
    assert_eq!(table_name("web", TableKind::Guard).unwrap(), "havip-web-guard");
    let drain: Vec<String> = TableRef::of_pair_kinds("web", &[TableKind::Forwarder, TableKind::Quieter])
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(drain, shown[..4], "the drain's tables, without the guard");
}

#[test]
fn long_pair_names_get_a_stable_hash_and_fit() {
    let longest_plain = "a".repeat(MAX_PLAIN_PAIR);
    let quiet = table_name(&longest_plain, TableKind::Quieter).unwrap();
    assert_eq!(quiet.len(), MAX_NAME);
    assert_eq!(quiet, format!("havip-{longest_plain}-quiet"));

    let long = format!("{}b", "a".repeat(MAX_PLAIN_PAIR));
    let other = format!("{}c", "a".repeat(MAX_PLAIN_PAIR));
    for kind in TableKind::ALL {
        let n = table_name(&long, kind).unwrap();
        assert!(n.len() <= MAX_NAME, "{} bytes", n.len());
        assert!(n.contains('_'), "{n}");
        assert_ne!(n, table_name(&other, kind).unwrap(), "same prefix, different pairs");
        assert_eq!(TableRef { family: Family::Ip, name: n }.kind(), Some(kind));
    }
    // The longest DNS-1123 name.
    let max = format!("{}.{}", "x".repeat(126), "y".repeat(126));
    assert_eq!(max.len(), 253);
    let n = table_name(&max, TableKind::Quieter).unwrap();
    assert_eq!(n.len(), MAX_NAME);
    // Stable: FNV-1a of the pair, pinned so that a change of the function shows.
    assert_eq!(fnv1a64(""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a64("a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(n, format!("havip-{}_{:016x}-quiet", &max[..KEPT_PAIR], fnv1a64(&max)));
}

#[test]
fn invalid_pair_names_are_refused() {
    for bad in ["", "Web", "a_b", "-a", "a-", "a\0b", "a b", "é", &"a".repeat(254)] {
        assert!(matches!(table_name(bad, TableKind::Forwarder), Err(NftError::InvalidPair { .. })), "{bad:?}");
    }
}

#[test]
fn havip_table_names_are_recognised_and_others_not() {
    let kind = |n: &str| TableRef { family: Family::Ip, name: n.to_owned() }.kind();
    assert_eq!(kind("havip-x-fwd"), Some(TableKind::Forwarder));
    assert_eq!(kind("havip-x-fwd-quiet"), Some(TableKind::Quieter));
    assert_eq!(kind("havip-x-guard"), Some(TableKind::Guard));
    for other in ["havip--fwd", "havip-fwd", "filter", "havip-x", "hvfault_udp", "xhavip-x-fwd"] {
        assert_eq!(kind(other), None, "{other}");
    }
}

#[test]
fn families_round_trip() {
    for f in [Family::Ip, Family::Ip6, Family::Arp, Family::Inet, Family::Bridge, Family::Netdev, Family::Other(42)] {
        assert_eq!(Family::from_nfproto(f.nfproto()), f);
    }
    assert_eq!(Family::of(Ipv4Addr::LOCALHOST.into()), Family::Ip);
    assert_eq!(Family::of(Ipv6Addr::LOCALHOST.into()), Family::Ip6);
}

#[test]
fn a_batch_is_framed_by_begin_and_end_and_acks_every_message() {
    let mut b = Batch::new(100);
    replace_table(&mut b, &TableRef { family: Family::Ip, name: "havip-p-fwd".into() }, true);
    let sock::Sealed { bytes, begin_seq: begin, after, ops } = b.finish().unwrap();
    assert_eq!((begin, after), (100, 105));
    let msgs: Vec<_> = msg::messages(&bytes).collect::<Result<_, _>>().unwrap();
    let types: Vec<u16> = msgs.iter().map(|m| m.ty).collect();
    assert_eq!(types, [NFNL_MSG_BATCH_BEGIN, 0x0a00, 0x0a02, 0x0a00, NFNL_MSG_BATCH_END]);
    let seqs: Vec<u32> = msgs.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, [100, 101, 102, 103, 104]);
    // BEGIN and END: family unspec, res_id NFNL_SUBSYS_NFTABLES in network order.
    for m in [&msgs[0], &msgs[4]] {
        assert_eq!(m.payload, &[0, 0, 0, 10]);
        assert_eq!(m.flags, NLM_F_REQUEST);
    }
    for m in &msgs[1..4] {
        assert_eq!(m.flags & (NLM_F_REQUEST | NLM_F_ACK), NLM_F_REQUEST | NLM_F_ACK, "every message is acked");
        assert_eq!(m.payload[0], 2, "family ip");
    }
    assert_eq!(msgs[1].flags & msg::NLM_F_CREATE, msg::NLM_F_CREATE);
    let names: Vec<String> = ops.iter().map(|(_, op)| op.to_string()).collect();
    assert_eq!(names, ["add table ip havip-p-fwd", "delete table ip havip-p-fwd", "add table ip havip-p-fwd"]);
}

#[test]
fn invalid_rules_are_refused_before_anything_is_sent() {
    // No socket is needed to refuse these: validation comes first. (`Nft::open` works
    // unprivileged, as creating the socket needs no capability.)
    let Ok(mut nft) = Nft::open() else { return };
    let vip: IpAddr = Ipv4Addr::new(10, 0, 0, 50).into();
    let v6: IpAddr = Ipv6Addr::LOCALHOST.into();
    let bad_fwd = [
        vec![ForwardRule { vip, old_holder: v6, ifindex: 2, iif: 2 }],
        vec![ForwardRule { vip, old_holder: vip, ifindex: 0, iif: 0 }],
        vec![ForwardRule { vip, old_holder: vip, ifindex: u32::MAX, iif: u32::MAX }],
        vec![
            ForwardRule { vip, old_holder: vip, ifindex: 2, iif: 2 },
            ForwardRule { vip, old_holder: vip, ifindex: 3, iif: 3 },
        ],
    ];
    for rules in bad_fwd {
        assert!(matches!(nft.set_forwarder("p", &rules), Err(NftError::InvalidRule { .. })), "{rules:?}");
    }
    let bad_quiet = [vec![QuietRule { vip, own: v6 }], vec![QuietRule { vip, own: vip }, QuietRule { vip, own: vip }]];
    for rules in bad_quiet {
        assert!(matches!(nft.set_quieter("p", &rules), Err(NftError::InvalidRule { .. })), "{rules:?}");
    }
    assert!(matches!(nft.set_forwarder("P", &[]), Err(NftError::InvalidPair { .. })));
    let bad_guard = [
        vec![GuardRule { vip, ifindex: 0 }],
        vec![GuardRule { vip, ifindex: u32::MAX }],
        vec![GuardRule { vip, ifindex: 2 }, GuardRule { vip, ifindex: 3 }],
    ];
    for rules in bad_guard {
        assert!(matches!(nft.set_guard("p", &rules), Err(NftError::InvalidRule { kind: "guard", .. })), "{rules:?}");
    }
}

#[test]
fn errors_say_what_failed_and_why() {
    let t = TableRef { family: Family::Ip, name: "havip-p-fwd".into() };
    let e = NftError::kernel(Op::AddRule { table: t.clone(), chain: "prerouting", rule: "x".into() }, 2, None);
    let s = e.to_string();
    assert!(s.starts_with("failed to add rule ip havip-p-fwd prerouting (x): ENOENT"), "{s}");
    assert!(s.contains("nft_dup"), "{s}");
    assert_eq!(e.errno(), Some(Errno::ENOENT));
    let e = NftError::kernel(Op::Batch, 1, Some("no".into()));
    assert_eq!(e.category(), "permission");
    assert!(e.to_string().contains("(no)") && e.to_string().contains("CAP_NET_ADMIN"), "{e}");
    let e = NftError::Remove {
        errors: vec![NftError::kernel(Op::DeleteTable(t), 16, None), NftError::kernel(Op::Batch, 5, None)],
    };
    assert!(
        e.to_string().starts_with("failed to remove 2 nftables table(s): failed to delete table ip havip-p-fwd: EBUSY"),
        "{e}"
    );
}

/// Runs `f` on a thread of its own in a fresh, empty network namespace (only that
/// thread moves, and the namespace dies with it); `None`, after a `SKIPPED:` line, when
/// not root.
fn in_fresh_netns<T: Send + 'static>(test: &str, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: needs root (CAP_NET_ADMIN) for a network namespace: {test}");
        return None;
    }
    let t = std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
        f()
    });
    Some(t.join().expect("thread in a fresh network namespace"))
}

#[test]
fn a_batch_that_fails_part_way_changes_nothing_and_names_the_failing_message() {
    in_fresh_netns("batch atomicity", || {
        let mut nft = Nft::open().expect("open");
        let kept = TableRef { family: Family::Ip, name: "havip-kept-fwd".into() };
        let missing = TableRef { family: Family::Ip6, name: "havip-missing-fwd".into() };
        let mut b = Batch::new(nft.conn.next_seq());
        replace_table(&mut b, &kept, true);
        // A plain delete of a table that is not there: ENOENT, and the whole batch
        // (the table added before it, too) is rolled back.
        b.push(Op::DeleteTable(missing.clone()), expr::NFT_MSG_DELTABLE, missing.family.nfproto(), 0, |w| {
            expr::table_name_attr(w, &missing.name)
        });
        match nft.apply(b) {
            Err(NftError::Kernel { op: Op::DeleteTable(t), errno: Errno::ENOENT, .. }) => assert_eq!(t, missing),
            other => panic!("{other:?}"),
        }
        assert_eq!(nft.havip_tables().expect("tables"), vec![], "nothing of the failed batch is left");

        // The same socket goes on working, and deleting what is not there is success.
        nft.set_forwarder(
            "p",
            &[ForwardRule {
                vip: Ipv4Addr::new(10, 0, 0, 50).into(),
                old_holder: Ipv4Addr::new(10, 0, 0, 10).into(),
                ifindex: 1,
                iif: 1,
            }],
        )
        .expect("forwarder");
        assert_eq!(nft.havip_tables().expect("tables"), vec![kept_named("p")]);
        nft.remove_tables(&[missing.clone(), missing]).expect("missing tables are removed already");
        nft.remove_pair("p").expect("remove");
        nft.remove_pair("p").expect("remove again");
        assert_eq!(nft.havip_tables().expect("tables"), vec![]);
    });
}

fn kept_named(pair: &str) -> TableRef {
    TableRef { family: Family::Ip, name: format!("havip-{pair}-fwd") }
}

#[test]
fn replacing_keeps_exactly_the_new_rules_and_an_empty_list_removes() {
    in_fresh_netns("replace semantics", || {
        let mut nft = Nft::open().expect("open");
        let a: IpAddr = Ipv4Addr::new(10, 0, 0, 50).into();
        let b: IpAddr = Ipv4Addr::new(10, 0, 0, 51).into();
        let c: IpAddr = "fd00::50".parse().expect("v6");
        let old4: IpAddr = Ipv4Addr::new(10, 0, 0, 10).into();
        let old6: IpAddr = "fd00::10".parse().expect("v6");
        let rule = |vip, old_holder| ForwardRule { vip, old_holder, ifindex: 1, iif: 1 };
        nft.set_forwarder("p", &[rule(a, old4), rule(b, old4), rule(c, old6)]).expect("three");
        let mut vips: Vec<IpAddr> = nft.forwarded("p").expect("forwarded").into_iter().map(|(v, _)| v).collect();
        vips.sort();
        assert_eq!(vips, [a, b, c]);
        nft.set_forwarder("p", &[rule(b, old4)]).expect("one");
        assert_eq!(nft.forwarded("p").expect("forwarded"), [(b, Counter::default())]);
        // Only an IPv4 VIP left: the ip6 table is gone.
        assert_eq!(nft.havip_tables().expect("tables"), vec![kept_named("p")]);
        nft.set_forwarder("p", &[]).expect("none");
        assert_eq!(nft.havip_tables().expect("tables"), vec![]);
        assert_eq!(nft.forwarded("p").expect("forwarded of nothing"), []);
        nft.set_quieter("p", &[QuietRule { vip: c, own: old6 }]).expect("quieter");
        assert_eq!(
            nft.havip_tables().expect("tables"),
            vec![TableRef { family: Family::Ip6, name: "havip-p-quiet".into() }]
        );
        nft.set_quieter("p", &[]).expect("no quieter");
        assert_eq!(nft.havip_tables().expect("tables"), vec![]);
        // The guard: replaced like the others; a start's cleanup of the drain keeps it,
        // removing the pair does not.
        nft.set_guard("p", &[GuardRule { vip: a, ifindex: 1 }, GuardRule { vip: c, ifindex: 1 }]).expect("guard");
        nft.set_forwarder("p", &[rule(a, old4)]).expect("forwarder");
        nft.remove_drain("p").expect("remove the drain");
        let guard = |family| TableRef { family, name: "havip-p-guard".into() };
        assert_eq!(nft.havip_tables().expect("tables"), vec![guard(Family::Ip), guard(Family::Ip6)]);
        nft.set_guard("p", &[GuardRule { vip: c, ifindex: 1 }]).expect("guard, IPv6 only");
        assert_eq!(nft.havip_tables().expect("tables"), vec![guard(Family::Ip6)]);
        nft.remove_pair("p").expect("remove the pair");
        assert_eq!(nft.havip_tables().expect("tables"), vec![]);
    });
}

#[test]
fn a_silent_socket_times_out_instead_of_hanging() {
    // Nothing is sent, so nothing can come: the receive must give up at the deadline.
    let Ok(mut conn) = sock::Conn::open(Duration::from_millis(100)) else { return };
    let start = std::time::Instant::now();
    assert!(conn.recv_for_test(Duration::from_millis(100)).is_none());
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(90) && took < Duration::from_secs(2), "{took:?}");
}

#[test]
fn a_batch_larger_than_the_default_send_buffer_and_a_multi_part_dump_work() {
    in_fresh_netns("large batch", || {
        let mut nft = Nft::open().expect("open");
        let old_holder: IpAddr = Ipv4Addr::new(10, 255, 0, 1).into();
        // Three rules a VIP, about 1 KB each: some 1.7 MB in one batch, several times
        // `wmem_default`; read back, the dump spans many datagrams.
        let rules: Vec<ForwardRule> = (1..=600u32)
            .map(|i| ForwardRule { vip: Ipv4Addr::from(0x0a00_0000 + i).into(), old_holder, ifindex: 1, iif: 1 })
            .collect();
        nft.set_forwarder("big", &rules).expect("600 rules in one batch");
        let got = nft.forwarded("big").expect("forwarded");
        let mut vips: Vec<IpAddr> = got.iter().map(|(v, _)| *v).collect();
        vips.sort();
        assert_eq!(vips, rules.iter().map(|r| r.vip).collect::<Vec<_>>());
        nft.remove_pair("big").expect("remove");
    });
}
