//! Agents of this release beside agents of the previous release (the pinned commit of
//! `hack/previous-release.sh`, its agent binary built from this repository's history), as
//! a rolling upgrade or a rollback leaves them for as long as it lasts: two pairs on the
//! same two nodes, every member hearing its peer on both paths through every restart of
//! either agent, the VIPs and epochs where they were; this release's agent sends the
//! previous one single-pair heartbeats (it would drop a bundle) and bundles to an agent of
//! this release. Needs root and the previous release's agent: `HAVIP_PREVIOUS_AGENT`, or
//! `$HAVIP_CACHE/previous/<commit>/bin/havip-agent` (hack/previous-release.sh builds it);
//! skipped without it unless `HAVIP_REQUIRE_PREVIOUS=1` (CI sets it).

use havip_crds::Phase;
use havip_e2e::cluster::{Cluster, LocalCluster};
use havip_e2e::kubelab::{KubeLab, KubeLabOptions};
use havip_e2e::netns;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The previous release's agent binary, if built.
fn previous_agent() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("HAVIP_PREVIOUS_AGENT") {
        return Some(PathBuf::from(p));
    }
    let script = include_str!("../../hack/previous-release.sh");
    let commit =
        script.lines().find_map(|l| l.strip_prefix("COMMIT=\"${HAVIP_PREVIOUS_RELEASE:-")?.strip_suffix("}\""))?;
    let cache = std::env::var("HAVIP_CACHE")
        .map(PathBuf::from)
        .or_else(|_| std::env::var("HOME").map(|h| PathBuf::from(h).join(".cache/havip")))
        .ok()?;
    let bin = cache.join("previous").join(commit).join("bin/havip-agent");
    bin.is_file().then_some(bin)
}

const PAIRS: [(&str, u8, u16); 2] = [("web", 0, 8080), ("db", 1, 8081)];
const BUNDLES: &str = "havip_agent_heartbeat_datagrams_sent_total";

fn bundles(c: &LocalCluster, i: usize) -> f64 {
    c.agent_metric(i, BUNDLES, &["name=\"bundle\""]).unwrap_or_else(|e| panic!("n{i}'s metrics: {e}"))
}

/// n0's bundle count once it stops growing: an agent of this release bundles to a member
/// that just went back to the previous release until that member's first heartbeat
/// arrives. Panics when it keeps growing for 15 s.
fn settled_bundles(c: &LocalCluster, what: &str) -> f64 {
    let start = Instant::now();
    loop {
        let a = bundles(c, 0);
        std::thread::sleep(Duration::from_secs(1));
        let b = bundles(c, 0);
        if a == b {
            return b;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{what}: n0 (this release) keeps sending bundles to n1 (the previous release)\n{}",
            c.logs_tail(40)
        );
    }
}

/// Both pairs: n0 active under the epoch they went Live with, n1 standby, every member
/// hearing its peer on both paths, each VIP on n0 alone.
fn hear_each_other(c: &LocalCluster, what: &str, epochs: &[i64]) {
    let names = c.nodes();
    for ((pair, vip, _), e) in PAIRS.iter().zip(epochs) {
        c.wait_pair(
            pair,
            Duration::from_secs(20),
            &format!("{what}: every member hears its peer on both paths"),
            |p| {
                p.status.as_ref().is_some_and(|s| {
                    s.active.as_deref() == Some(names[0].as_str())
                        && s.epoch == Some(*e)
                        && s.members.len() == 2
                        && s.members.iter().all(|m| m.heard.len() == 2 && m.heard.iter().all(|h| h.heard))
                })
            },
        )
        .unwrap_or_else(|err| panic!("{what}, pair {pair}: {err}\n{}", c.logs_tail(40)));
        assert_eq!(c.holders_of(*vip).expect("holders"), vec![0], "{what}: pair {pair}'s VIP");
    }
}

fn restart(c: &mut LocalCluster, i: usize, bin: Option<&PathBuf>) {
    match bin {
        Some(b) => c.lab.agent_bins.insert(i, b.clone()),
        None => c.lab.agent_bins.remove(&i),
    };
    c.lab.stop_agent(i);
    c.lab.start_agent(i).expect("start the agent");
}

#[test]
fn agents_of_this_and_the_previous_release_hear_each_other_through_restarts_and_bundle_only_among_themselves() {
    if !netns::skip_unless_root(module_path!()) {
        return;
    }
    let Some(previous) = previous_agent() else {
        assert!(
            std::env::var_os("HAVIP_REQUIRE_PREVIOUS").is_none(),
            "HAVIP_REQUIRE_PREVIOUS is set but the previous release's agent is not built (hack/previous-release.sh)"
        );
        eprintln!("skipped: the previous release's agent is not built (hack/previous-release.sh)");
        return;
    };
    havip_e2e::init_tracing();
    let lab = KubeLab::start(KubeLabOptions { nodes: 2, ..Default::default() }).expect("lab");
    let mut c = LocalCluster::new(lab);
    // n1 runs the previous release from the start.
    restart(&mut c, 1, Some(&previous));
    let mut yaml = String::new();
    for (name, vip, port) in PAIRS {
        yaml.push_str(&c.pair_yaml_on(name, &[0, 1], vip, port).expect("pair YAML"));
        yaml.push_str("---\n");
    }
    c.apply_yaml(&yaml).expect("apply the pairs");
    let mut epochs = Vec::new();
    for (name, _, _) in PAIRS {
        let p = c
            .wait_pair(name, Duration::from_secs(30), "Live", |p| {
                p.status.as_ref().is_some_and(|s| s.phase == Some(Phase::Live))
            })
            .unwrap_or_else(|e| panic!("pair {name}: {e}\n{}", c.logs_tail(40)));
        epochs.push(p.status.and_then(|s| s.epoch).expect("an epoch"));
    }

    // This release's n0 with the previous release's n1, through restarts of either.
    let steps: [(&str, usize); 3] =
        [("mixed", 1), ("mixed, n1 (previous) restarted", 0), ("mixed, n0 (this) restarted", 1)];
    for (what, next) in steps {
        hear_each_other(&c, what, &epochs);
        let before = settled_bundles(&c, what);
        std::thread::sleep(Duration::from_secs(3));
        hear_each_other(&c, &format!("{what}, 3 s later"), &epochs);
        assert_eq!(bundles(&c, 0), before, "{what}: n0 (this release) sent bundles to n1 (the previous release)");
        let bin = (next == 1).then_some(&previous);
        restart(&mut c, next, bin);
    }

    // n1 upgraded: both bundle.
    restart(&mut c, 1, None);
    hear_each_other(&c, "both of this release", &epochs);
    let start = Instant::now();
    while bundles(&c, 0) == 0.0 || bundles(&c, 1) == 0.0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "two agents of this release sharing two pairs never bundled"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // n1 rolled back: n0 goes back to single-pair heartbeats.
    restart(&mut c, 1, Some(&previous));
    hear_each_other(&c, "n1 rolled back", &epochs);
    let before = settled_bundles(&c, "n1 rolled back");
    std::thread::sleep(Duration::from_secs(3));
    hear_each_other(&c, "n1 rolled back, 3 s later", &epochs);
    assert_eq!(bundles(&c, 0), before, "n0 kept sending bundles to n1 rolled back to the previous release");
}
