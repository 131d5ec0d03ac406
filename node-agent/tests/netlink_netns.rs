//! The netlink layer on a real kernel, in a fresh network namespace per test
//! (created with unshare on a dedicated thread, gone when the thread ends).
//! Needs root (CAP_NET_ADMIN); without it each test says SKIPPED and returns.

use havip_node_agent::netlink::{HAVIP_ADDR_PROTO, LinkEvent, LinkWatch, Netlink, NetlinkError, Vip};
use std::net::IpAddr;
use std::time::Duration;

fn root() -> bool {
    if nix::unistd::geteuid().is_root() {
        true
    } else {
        eprintln!("SKIPPED: needs root (CAP_NET_ADMIN) to create network namespaces");
        false
    }
}

/// Runs `f` on a thread inside a new, empty network namespace with a veth pair
/// `hv0` (10.9.0.1/24, 2001:db8:9::1/64) ↔ `hv1`, both up.
fn in_netns<F, Fut>(f: F)
where
    F: FnOnce(Netlink) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
        rt.block_on(async move {
            let (conn, handle, _) = rtnetlink::new_connection().expect("netlink");
            tokio::spawn(conn);
            handle.link().add(rtnetlink::LinkVeth::new("hv0", "hv1").build()).execute().await.expect("veth");
            for name in ["lo", "hv0", "hv1"] {
                let idx = index(&handle, name).await;
                handle
                    .link()
                    .change(rtnetlink::LinkUnspec::new_with_index(idx).up().build())
                    .execute()
                    .await
                    .expect("up");
            }
            let idx = index(&handle, "hv0").await;
            handle.address().add(idx, "10.9.0.1".parse().expect("ip"), 24).execute().await.expect("addr");
            handle.address().add(idx, "2001:db8:9::1".parse().expect("ip"), 64).execute().await.expect("addr6");
            f(Netlink::new().expect("netlink")).await;
        });
    })
    .join()
    .expect("test thread");
}

async fn index(handle: &rtnetlink::Handle, name: &str) -> u32 {
    use futures::TryStreamExt;
    let mut s = handle.link().get().match_name(name.to_owned()).execute();
    s.try_next().await.expect("link").expect("exists").header.index
}

fn vip(s: &str, prefix: u8) -> Vip {
    Vip { addr: s.parse().expect("ip"), prefix, ifname: "hv0".into() }
}

#[test]
fn add_and_remove_are_idempotent_and_marked() {
    if !root() {
        return;
    }
    in_netns(|nl| async move {
        let v = vip("10.9.0.100", 24);
        nl.add_vip(&v).await.expect("add");
        nl.add_vip(&v).await.expect("add again is success");
        let found: Vec<_> = nl.addresses().await.expect("list").into_iter().filter(|a| a.addr == v.addr).collect();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].label.as_deref(), Some("hv0:hv"), "IPv4 VIPs carry the havip label");
        assert!(found[0].is_havip());
        // promote_secondaries is on, so removing a primary never takes a secondary with it.
        let ps = std::fs::read_to_string("/proc/sys/net/ipv4/conf/hv0/promote_secondaries").expect("sysctl");
        assert_eq!(ps.trim(), "1");
        nl.remove_vip(&v).await.expect("remove");
        nl.remove_vip(&v).await.expect("remove again is success");
        assert!(!nl.addresses().await.expect("list").iter().any(|a| a.addr == v.addr));
        // The node's own address was never touched.
        assert!(
            nl.addresses().await.expect("list").iter().any(|a| a.addr == "10.9.0.1".parse::<IpAddr>().expect("ip"))
        );
    });
}

#[test]
fn never_removes_an_address_havip_did_not_add() {
    if !root() {
        return;
    }
    in_netns(|nl| async move {
        let status = std::process::Command::new("ip").args(["addr", "add", "10.9.0.77/24", "dev", "hv0"]).status();
        assert!(status.expect("ip").success());
        let foreign = vip("10.9.0.77", 24);
        match nl.remove_vip(&foreign).await {
            Err(NetlinkError::NotOurs(v)) => assert_eq!(v, foreign),
            other => panic!("expected NotOurs, got {other:?}"),
        }
        let (removed, errors) = nl.remove_stale(std::slice::from_ref(&foreign), &[]).await;
        assert!(errors.is_empty(), "{errors:?}");
        assert!(removed.is_empty(), "stale cleanup must not touch foreign addresses: {removed:?}");
        assert!(nl.addresses().await.expect("list").iter().any(|a| a.addr == foreign.addr));
    });
}

#[test]
fn stale_cleanup_removes_only_unwanted_havip_addresses() {
    if !root() {
        return;
    }
    in_netns(|nl| async move {
        let keep = vip("10.9.0.10", 24);
        let stale = vip("10.9.0.11", 24);
        let stale6 = vip("2001:db8:9::11", 64);
        // Another pair's VIP in the same subnet on the same interface: not a candidate.
        let other_pair = vip("10.9.0.12", 24);
        for v in [&keep, &stale, &stale6, &other_pair] {
            nl.add_vip(v).await.expect("add");
        }
        let ledger = [keep.clone(), stale.clone(), stale6.clone()];
        let (removed, errors) = nl.remove_stale(&ledger, std::slice::from_ref(&keep)).await;
        assert!(errors.is_empty(), "{errors:?}");
        let mut gone: Vec<IpAddr> = removed.iter().map(|a| a.addr).collect();
        gone.sort();
        assert_eq!(gone, vec![stale.addr, stale6.addr]);
        let mut ours: Vec<IpAddr> = nl.havip_addresses().await.expect("list").iter().map(|a| a.addr).collect();
        ours.sort();
        assert_eq!(ours, vec![keep.addr, other_pair.addr], "another pair's VIP in the same subnet stays");
    });
}

/// The 60-minute chaos run of 2026-12-06: a FloatingIP's address deleted from pair gamma
/// and created again in pair alpha is in both pairs' ledgers for a while. When gamma's
/// cleanup runs (gamma gone here; the same rule holds for its reconfiguration's stale
/// VIPs), the address alpha holds now stays — before, gamma removed it from under alpha
/// and nobody answered for it until the FloatingIP was deleted.
#[test]
fn a_gone_pairs_cleanup_leaves_an_address_that_moved_to_another_pair() {
    if !root() {
        return;
    }
    in_netns(|nl| async move {
        let dir = tempfile::tempdir().expect("dir");
        let moved = vip("10.9.0.55", 24);
        let gammas_own = vip("10.9.0.60", 24);
        for v in [&moved, &gammas_own] {
            nl.add_vip(v).await.expect("add");
        }
        let gamma = havip_node_agent::ledger::VipLedger::new(dir.path(), "gamma");
        gamma.record(&[moved.clone(), gammas_own.clone()]).expect("gamma's ledger");
        havip_node_agent::ledger::VipLedger::new(dir.path(), "alpha")
            .record(std::slice::from_ref(&moved))
            .expect("alpha's ledger");
        assert!(havip_node_agent::leftovers::remove_vips_and_drain_tables(dir.path(), "gamma").await);
        let ours: Vec<IpAddr> = nl.havip_addresses().await.expect("list").iter().map(|a| a.addr).collect();
        assert_eq!(ours, vec![moved.addr], "alpha's address stays, gamma's own is gone");
    });
}

#[test]
fn ipv6_vips_skip_duplicate_address_detection() {
    if !root() {
        return;
    }
    in_netns(|nl| async move {
        let v = vip("2001:db8:9::100", 64);
        nl.add_vip(&v).await.expect("add");
        let a = nl.addresses().await.expect("list").into_iter().find(|a| a.addr == v.addr).expect("present");
        assert!(!a.tentative, "NODAD: usable at once, never tentative");
        assert!(!a.dad_failed);
        assert_eq!(a.proto, Some(HAVIP_ADDR_PROTO), "IPv6 has no labels: marked by IFA_PROTO");
        nl.remove_vip(&v).await.expect("remove");
        assert!(!nl.addresses().await.expect("list").iter().any(|a| a.addr == v.addr));
    });
}

/// An IPv6 VIP is local when `add_vip` returns: the kernel acknowledges a new IPv6
/// address before its duplicate address detection work (run later from a work queue,
/// even with NODAD) inserts its local route, and an announced VIP that is not local yet
/// drops the SYNs the announcement drew (one in about ten IPv6 planned moves of the lab
/// lost one). Each of 40 VIPs is looked up the moment `add_vip` returns, on its link and
/// as a drained copy on `lo` beside the link's (where only the `lo` route tells), and each
/// VIP is announced only then: without the wait most lookups here find no local route.
#[test]
fn an_ipv6_vip_is_local_when_add_vip_returns() {
    if !root() {
        return;
    }
    in_netns(|nl| async move {
        let lo = nl.link("lo").await.expect("lo").index;
        let mut missing = Vec::new();
        for i in 0..40u16 {
            let v = vip(&format!("2001:db8:9::{:x}", 0x200 + i), 64);
            nl.add_vip(&v).await.expect("add");
            if !nl.is_local(v.addr).await.expect("lookup") {
                missing.push(format!("{} on hv0", v.addr));
            }
            let drained = Vip { addr: v.addr, prefix: 128, ifname: "lo".into() };
            nl.add_vip(&drained).await.expect("add on lo");
            if !nl.has_local_route_on(v.addr, lo).await.expect("routes") {
                missing.push(format!("{} on lo", v.addr));
            }
            nl.remove_vip(&v).await.expect("remove");
            nl.remove_vip(&drained).await.expect("remove from lo");
        }
        assert!(missing.is_empty(), "not local when add_vip returned: {missing:?}");
        // IPv4 is local at once; an address nobody holds is not local.
        assert!(!nl.is_local("2001:db8:9::999".parse().expect("ip")).await.expect("lookup"));
        assert!(!nl.is_local("10.9.0.99".parse().expect("ip")).await.expect("lookup"));
        let v4 = vip("10.9.0.50", 24);
        nl.add_vip(&v4).await.expect("add v4");
        assert!(nl.is_local(v4.addr).await.expect("lookup v4"));
    });
}

/// The source address the kernel picks for a new connection to `dst` (`ip route get`).
fn source_for(dst: &str) -> String {
    let out = std::process::Command::new("ip").args(["route", "get", dst]).output().expect("ip route get");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut words = text.split_whitespace();
    while let Some(w) = words.next() {
        if w == "src" {
            return words.next().unwrap_or_default().to_owned();
        }
    }
    panic!("no src in {text}")
}

fn ip(args: &[&str]) {
    let st = std::process::Command::new("ip").args(args).status().expect("ip");
    assert!(st.success(), "ip {args:?}");
}

/// An IPv6 address on hv0 as an agent before deprecated VIPs added one (`ours`: marked
/// with havip's `IFA_PROTO`), preferred forever.
async fn add_preferred(addr: &str, ours: bool) {
    use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressHeaderFlags, AddressProtocol};
    let (conn, handle, _) = rtnetlink::new_connection().expect("netlink");
    tokio::spawn(conn);
    let idx = index(&handle, "hv0").await;
    let mut req = handle.address().add(idx, addr.parse().expect("ip"), 64);
    let msg = req.message_mut();
    msg.header.flags |= AddressHeaderFlags::Nodad;
    msg.attributes.push(AddressAttribute::Flags(AddressFlags::Nodad));
    if ours {
        msg.attributes.push(AddressAttribute::Protocol(AddressProtocol::Other(HAVIP_ADDR_PROTO)));
    }
    req.execute().await.expect("add");
}

#[test]
fn a_vip_is_never_the_source_of_the_nodes_own_connections() {
    if !root() {
        return;
    }
    in_netns(|nl| async move {
        // IPv6: the kernel prefers the address sharing the longest prefix with the
        // destination (RFC 6724 rule 8) — the VIP for 2001:db8:9::51 — unless it is
        // deprecated (rule 3).
        let v6 = vip("2001:db8:9::50", 64);
        nl.add_vip(&v6).await.expect("add");
        let a = nl.addresses().await.expect("list").into_iter().find(|a| a.addr == v6.addr).expect("present");
        assert!(a.deprecated && !a.tentative, "{a:?}");
        // The namespace's own address must have finished its duplicate detection: a
        // tentative address is no candidate at all.
        let own: IpAddr = "2001:db8:9::1".parse().expect("ip");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while nl.addresses().await.expect("list").iter().any(|a| a.addr == own && a.tentative) {
            assert!(std::time::Instant::now() < deadline, "2001:db8:9::1 still tentative after 10 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(source_for("2001:db8:9::51"), "2001:db8:9::1", "the node's own address, not the VIP");
        // The control: an ordinary address next to it is picked for its neighbour.
        ip(&["addr", "add", "2001:db8:9::60/64", "dev", "hv0", "nodad"]);
        assert_eq!(source_for("2001:db8:9::61"), "2001:db8:9::60", "rule 8 applies to addresses not deprecated");
        // A VIP of ours added by an older agent (preferred) is deprecated when added again;
        // the same address not ours is left as it is.
        add_preferred("2001:db8:9::70", true).await;
        add_preferred("2001:db8:9::80", false).await;
        for s in ["2001:db8:9::70", "2001:db8:9::80"] {
            nl.add_vip(&vip(s, 64)).await.expect("add");
        }
        let list = nl.addresses().await.expect("list");
        let dep = |s: &str| list.iter().find(|a| a.addr.to_string() == s).expect("present").deprecated;
        assert!(dep("2001:db8:9::70"), "ours: deprecated now");
        assert!(!dep("2001:db8:9::80"), "not ours: untouched");
        // IPv4: a VIP in the interface's subnet is a secondary address of it, a /32 comes
        // after the node's own; the node's address stays the source either way.
        nl.add_vip(&vip("10.9.0.50", 24)).await.expect("add");
        nl.add_vip(&vip("10.9.0.60", 32)).await.expect("add");
        assert_eq!(source_for("10.9.0.51"), "10.9.0.1");
        assert_eq!(source_for("10.9.0.61"), "10.9.0.1");
        ip(&["route", "add", "192.0.2.0/24", "dev", "hv0"]);
        assert_eq!(source_for("192.0.2.7"), "10.9.0.1", "a destination off every subnet: the first address");
        let out =
            std::process::Command::new("ip").args(["-4", "-o", "addr", "show", "dev", "hv0"]).output().expect("ip");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let first = text.lines().next().unwrap_or_default();
        assert!(first.contains("10.9.0.1/24"), "the node's address stays the interface's first: {text}");
        assert!(text.lines().any(|l| l.contains("10.9.0.50/24") && l.contains("secondary")), "{text}");
    });
}

/// The next link event of `watch` about `name` with carrier `carrier`, within 5 s.
async fn carrier_event(watch: &mut LinkWatch, name: &str, carrier: bool) -> havip_node_agent::netlink::LinkState {
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match watch.next().await.expect("stream open") {
                LinkEvent::Changed(ev) if ev.name == name && ev.carrier == carrier => return ev,
                LinkEvent::Changed(_) => {}
                LinkEvent::Missed => panic!("a watch missed events"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("carrier {carrier} event of {name} within 5 s"))
}

#[test]
fn carrier_changes_arrive_as_events_to_every_watch_of_one_subscription() {
    if !root() {
        return;
    }
    in_netns(|nl| async move {
        // Two pairs' watches: one netlink subscription, every event to both.
        let mut a = LinkWatch::new().expect("watch");
        let mut b = LinkWatch::new().expect("watch");
        assert!(a.shares_subscription_with(&b), "one subscription for the agent");
        assert!(nl.link("hv0").await.expect("link").carrier);
        // Taking the peer down is a pulled cable for hv0.
        let st = std::process::Command::new("ip").args(["link", "set", "hv1", "down"]).status();
        assert!(st.expect("ip").success());
        for w in [&mut a, &mut b] {
            let ev = carrier_event(w, "hv0", false).await;
            assert!(ev.up, "hv0 itself is still administratively up");
        }
        // A watch opened later sees what happens from then on.
        let mut c = LinkWatch::new().expect("watch");
        let st = std::process::Command::new("ip").args(["link", "set", "hv1", "up"]).status();
        assert!(st.expect("ip").success());
        for w in [&mut a, &mut b, &mut c] {
            carrier_event(w, "hv0", true).await;
        }
    });
}

#[test]
fn the_agent_has_one_netlink_connection_per_namespace_and_runtime() {
    if !root() {
        return;
    }
    in_netns(|nl| async move {
        let again = Netlink::new().expect("netlink");
        assert!(nl.shares_connection_with(&again), "one connection for every pair");
        // Another runtime (another test's, in one process) has its own: a connection is
        // driven by the runtime that opened it.
        let other = std::thread::spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
            rt.block_on(async { Netlink::new().expect("netlink") })
        })
        .join()
        .expect("thread");
        assert!(!nl.shares_connection_with(&other), "a runtime of its own, a connection of its own");
        drop(other);
        // The shared connection works for both users.
        assert!(again.link("hv0").await.expect("link").up);
        assert!(nl.link("hv1").await.expect("link").up);
    });
}

#[test]
fn finds_gateway_and_subnet_interface() {
    if !root() {
        return;
    }
    in_netns(|nl| async move {
        let st = std::process::Command::new("ip").args(["route", "add", "default", "via", "10.9.0.254"]).status();
        assert!(st.expect("ip").success());
        let gws = nl.default_gateways().await.expect("routes");
        let hv0 = nl.link("hv0").await.expect("link").index;
        assert!(gws.contains(&("10.9.0.254".parse().expect("ip"), hv0)), "{gws:?}");
        assert_eq!(nl.interface_for_subnet("10.9.0.50".parse().expect("ip"), 24).await.expect("found"), "hv0");
        assert!(matches!(
            nl.interface_for_subnet("192.0.2.1".parse().expect("ip"), 24).await,
            Err(NetlinkError::NoInterfaceForSubnet { .. })
        ));
        assert!(matches!(nl.link("nope0").await, Err(NetlinkError::LinkNotFound(_))));
        // Adding to a missing interface is a clear error, not a panic.
        let missing = Vip { addr: "10.9.0.9".parse().expect("ip"), prefix: 24, ifname: "nope0".into() };
        assert!(matches!(nl.add_vip(&missing).await, Err(NetlinkError::LinkNotFound(_))));
    });
}

#[test]
fn garp_updates_an_existing_neighbour_entry_and_is_heard() {
    if !root() {
        return;
    }
    in_netns(|_nl| async move {
        use havip_node_agent::announce::{ArpListener, L2Sender};
        let run = |args: &[&str]| {
            let st = std::process::Command::new("ip").args(args).status().expect("ip");
            assert!(st.success(), "ip {args:?}");
        };
        run(&["addr", "add", "10.9.0.2/24", "dev", "hv1"]);
        // hv1 believes the VIP is at a dead MAC.
        run(&["neigh", "replace", "10.9.0.100", "lladdr", "02:00:00:00:00:99", "dev", "hv1", "nud", "stale"]);
        let (tx, rx) = std::sync::mpsc::channel();
        let _listener = ArpListener::start("hv1", move |seen| {
            let _ = tx.send(seen);
        })
        .expect("listener");
        let sender = L2Sender::open("hv0").expect("sender");
        let vip: std::net::Ipv4Addr = "10.9.0.100".parse().expect("ip");
        sender.send_garp(vip).expect("garp sent");
        let seen = rx.recv_timeout(Duration::from_secs(2)).expect("GARP heard on the peer");
        assert_eq!((seen.op, seen.sender_ip, seen.target_ip, seen.sender_mac), (1, vip, vip, sender.mac()));
        // The kernel on hv1 replaced the dead MAC with hv0's (GARP form overrides at once).
        let want = sender.mac().to_string();
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        loop {
            let out = std::process::Command::new("ip")
                .args(["neigh", "show", "10.9.0.100", "dev", "hv1"])
                .output()
                .expect("ip");
            let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
            if text.contains(&want) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "neighbour entry not updated: {text}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

fn neighbours() -> String {
    let out = std::process::Command::new("ip").args(["neigh", "show", "dev", "hv0"]).output().expect("ip neigh");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A standby's urgent probes start from a clean neighbour cache for the VIPs: learned
/// entries (an earlier holder's MAC) go, a user's permanent entry and other addresses stay.
#[test]
fn forgetting_neighbours_drops_learned_entries_of_the_addresses_only() {
    if !root() {
        return;
    }
    in_netns(|nl| async move {
        ip(&["neigh", "replace", "10.9.0.50", "lladdr", "02:00:00:00:00:50", "dev", "hv0", "nud", "stale"]);
        ip(&["neigh", "replace", "10.9.0.51", "lladdr", "02:00:00:00:00:51", "dev", "hv0", "nud", "permanent"]);
        ip(&["neigh", "replace", "10.9.0.52", "lladdr", "02:00:00:00:00:52", "dev", "hv0", "nud", "reachable"]);
        ip(&["neigh", "replace", "2001:db8:9::50", "lladdr", "02:00:00:00:00:56", "dev", "hv0", "nud", "stale"]);
        let before = neighbours();
        for a in ["10.9.0.50 ", "10.9.0.51 ", "10.9.0.52 ", "2001:db8:9::50 "] {
            assert!(before.contains(a), "{a} set up: {before}");
        }
        let addrs: Vec<IpAddr> =
            ["10.9.0.50", "10.9.0.51", "2001:db8:9::50", "10.9.0.99"].iter().map(|a| a.parse().expect("ip")).collect();
        assert_eq!(nl.forget_neighbours(&addrs).await.expect("forget"), 2);
        let after = neighbours();
        assert!(!after.contains("10.9.0.50 "), "the learned entry went: {after}");
        assert!(!after.contains("2001:db8:9::50 "), "the learned IPv6 entry went: {after}");
        assert!(after.contains("10.9.0.51 ") && after.contains("PERMANENT"), "a static entry stays: {after}");
        assert!(after.contains("10.9.0.52 "), "another address stays: {after}");
        // Nothing left to forget: no error.
        assert_eq!(nl.forget_neighbours(&addrs).await.expect("again"), 0);
    });
}

#[test]
fn many_pairs_dumping_at_once_on_the_shared_connection_all_get_their_answers() {
    if !root() {
        return;
    }
    in_netns(|nl| async move {
        let idx = nl.link("hv0").await.expect("link").index;
        let addrs: Vec<IpAddr> = vec!["10.9.0.2".parse().expect("ip")];
        // Tables big enough that each dump takes several reads (and so overlaps the others).
        let mut batch = String::new();
        for i in 0..4000u32 {
            batch.push_str(&format!(
                "neigh add 10.{}.{}.{} lladdr 02:00:00:00:{:02x}:{:02x} dev hv0 nud permanent\n",
                20 + i / 65536,
                i / 256 % 256,
                i % 256,
                i / 256 % 256,
                i % 256
            ));
        }
        let mut ip = std::process::Command::new("ip")
            .args(["-batch", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("ip -batch");
        {
            use std::io::Write;
            ip.stdin.take().expect("stdin").write_all(batch.as_bytes()).expect("write the batch");
        }
        assert!(ip.wait().expect("ip").success(), "ip -batch");
        // A hundred pairs' dumps at once: a netlink socket serves one dump at a time, and
        // every pair shares this connection.
        let mut work = Vec::new();
        for i in 0..100 {
            let (nl, addrs) = (Netlink::new().expect("netlink"), addrs.clone());
            work.push(tokio::spawn(async move {
                match i % 4 {
                    0 => nl.neighbours_on(idx).await.map(drop),
                    1 => nl.forget_neighbours(&addrs).await.map(drop),
                    2 => nl.links().await.map(drop),
                    _ => nl.addresses().await.map(drop),
                }
            }));
        }
        for (i, w) in work.into_iter().enumerate() {
            w.await.expect("task").unwrap_or_else(|e| panic!("dump {i}: {e}"));
        }
        drop(nl);
    });
}
