//! The report rendered from sample files.

use crate::render::render;
use crate::runs::{RunFile, meta_line, order, parse_file, parse_file_name};
use crate::timeline::timeline_svg;
use serde_json::Value;

const FAILOVER: &str = r#"{"meta":{"name":"failover","command":"target/release/bench-failover --runs 5","started":"2026-11-30T10:00:00Z","nproc":2,"kernel":"6.18.0","cpu":"Test CPU","loadavg":[1.5,1.25,1.0]}}
{"failed_connects_max":7,"max_gap_ms":354.3,"p50_gap_ms":307.0,"p99_gap_ms":354.3,"runs":5,"runs_without_takeover":0,"scenario":"cut","system":"havip"}
{"failed_connects_max":49,"max_gap_ms":2475.5,"p50_gap_ms":2472.3,"p99_gap_ms":2475.5,"runs":5,"runs_without_takeover":0,"scenario":"cut","system":"keepalived-v2"}
{"p50_gap_ratio":0.124,"p99_gap_ratio":0.143,"ratio":"havip/keepalived-v2","scenario":"cut"}
{"active_cpu_percent":1.0,"active_rss_kib":7448,"bench":"agent-idle-footprint","idle_seconds":20,"standby_cpu_percent":0.95,"standby_rss_kib":7536,"vips":1}
{"active_cpu_percent":4.1,"active_rss_kib":7928,"bench":"agent-idle-footprint","idle_seconds":20,"standby_cpu_percent":4.95,"standby_rss_kib":7880,"vips":100}
{"bench":"idle","system":"havip","profile":"Standard","vips":1,"window_s":30.0,"cpu_ms_per_min_total":200.0,"packets_per_s_total":44.0,"active":{"cpu_ms_per_min":100.0,"wakeups_per_s":20.0,"rss_kib":11000,"private_kib":1500,"threads_exited":0,"packets_per_s":22.0},"standby":{"cpu_ms_per_min":100.0,"wakeups_per_s":20.0,"rss_kib":11500,"private_kib":1600,"threads_exited":0,"packets_per_s":22.0}}
{"bench":"idle","system":"keepalived-v3","profile":"VRRPv3","vips":1,"window_s":30.0,"cpu_ms_per_min_total":80.0,"packets_per_s_total":10.0,"active":{"cpu_ms_per_min":60.0,"wakeups_per_s":10.0,"rss_kib":13000,"threads_exited":0,"packets_per_s":10.0},"standby":{"cpu_ms_per_min":20.0,"wakeups_per_s":10.0,"rss_kib":13000,"threads_exited":0,"packets_per_s":0.0}}
{"bench":"idle","cpu_ratio":2.5,"ratio":"havip/keepalived-v3","vips":1}
{"bench":"mass-cut","system":"havip","pairs":100,"runs":5,"complete_runs":5,"vips_not_back":0,"first_ms":{"p50":300.0,"p99":320.0},"last_ms":{"p50":450.0,"p99":520.0}}
{"bench":"idle","system":"havip","profile":"Standard","vips":1,"pairs":100,"window_s":30.0,"cpu_ms_per_min_total":600.0,"packets_per_s_total":400.0,"active":{"cpu_ms_per_min":300.0,"wakeups_per_s":40.0,"rss_kib":19000,"private_kib":5000,"threads_exited":0,"packets_per_s":200.0},"standby":{"cpu_ms_per_min":300.0,"wakeups_per_s":40.0,"rss_kib":21504,"private_kib":5100,"threads_exited":0,"packets_per_s":200.0}}
{"bench":"idle","system":"keepalived-v3","profile":"VRRPv3","vips":1,"pairs":100,"window_s":30.0,"cpu_ms_per_min_total":2000.0,"packets_per_s_total":1000.0,"active":{"cpu_ms_per_min":1600.0,"wakeups_per_s":900.0,"rss_kib":13000,"threads_exited":0,"packets_per_s":1000.0},"standby":{"cpu_ms_per_min":400.0,"wakeups_per_s":900.0,"rss_kib":13000,"threads_exited":0,"packets_per_s":0.0}}
not json at all
"#;

const K8S: &str = r#"{"meta":{"name":"k8s","command":"target/release/bench-k8s","started":"2026-11-30T10:30:00Z","nproc":2,"kernel":"6.18.0","cpu":"","loadavg":[]}}
{"bench":"apply_to_vip","ms":1834,"vip_answered":true,"apply_to_live_ms":2210,"live":true}
{"bench":"api_requests_steady","pairs":1,"members":2,"seconds":60,"requests_per_pair_per_minute":41.5,"writes_per_pair_per_minute":36.0,"lease_writes_per_minute":36.0,"by_verb_resource":{"PUT leases":36.0,"GET leases":5.5}}
{"bench":"api_requests_failover","window_seconds":12,"status_failed_over_ms":1650,"failed_over":true,"requests":57.0,"writes":19.0,"by_verb_resource":{}}
{"bench":"lease_renewal_reference","system":"kube-vip","computed_from_documented_defaults":true,"lease_duration_s":15.0,"renew_deadline_s":10.0,"retry_period_s":2.0,"requests_per_vip_per_minute":57.3,"writes_per_vip_per_minute":30.0}
{"bench":"lease_renewal_reference","system":"cilium-l2","computed_from_documented_defaults":true,"lease_duration_s":15.0,"renew_deadline_s":5.0,"retry_period_s":2.0,"requests_per_vip_per_minute":57.3,"writes_per_vip_per_minute":30.0}
"#;

const OPERATOR: &str = r#"{"stage":"created","seconds":12.5,"rss_kib":40960,"cpu_seconds":3.2,"reconciles":900.0,"reconcile_mean_ms":4.1,"reconcile_p50_ms_le":5.0,"reconcile_p99_ms_le":50.0,"status_writes":800.0,"errors":0.0,"pairs":1000}
{"stage":"steady","seconds":95.0,"rss_kib":61440,"cpu_seconds":20.5,"reconciles":5000.0,"reconcile_mean_ms":3.3,"reconcile_p50_ms_le":5.0,"reconcile_p99_ms_le":25.0,"status_writes":3000.0,"errors":0.0,"pairs":1000,"window_seconds":30.0,"reconciles_per_second":16.67,"reconcile_mean_ms_in_window":1.25,"status_writes_in_window":0.0,"cpu_seconds_in_window":0.8,"apiserver_requests_in_window":{"leases:GET":3.0}}
"#;

const SCALE: &str = r#"{"meta":{"name":"scale","command":"target/release/bench-scale --nodes 5000 --pairs 1000","started":"2026-11-30T11:00:00Z","nproc":2,"kernel":"6.18.0","cpu":"","loadavg":[]}}
{"bench":"scale_setup","nodes":5000,"node_status_bytes":20610,"pairs":1000,"real_pairs":2,"create_nodes_s":95.2,"create_pairs_s":31.0}
{"bench":"scale_operator","nodes":5000,"pairs":1000,"build":"release","rss_kib_idle_with_nodes":40960,"rss_kib_live":61440,"rss_kib_end":61440,"rss_kib_max":70000,"pairs_converged":1000,"converged_s":40.5,"pairs_live":1000,"time_to_live_all_s":88.8,"goal_rss_mib":256,"goal_met":true}
{"bench":"scale_agent","node":"n0","own_pairs":2,"nodes":5000,"pairs":1000,"build":"release","restarted_and_live":true,"rss_kib":20480,"rss_kib_max":21504,"window_seconds":120,"watch_events_per_minute":6.5,"watch_events_per_minute_by_kind":{"HAPair":6.0,"FloatingIP":0.5},"objects_listed_at_start":7,"cluster_hapair_status_writes_per_minute":1996,"goal_rss_mib":32,"goal_met":false}
"#;

#[test]
fn the_scale_section_shows_both_processes_and_their_goals() {
    let files: Vec<RunFile> = parse_file("scale-2026-11-30.jsonl", SCALE).into_iter().collect();
    let md = render(&files);
    assert!(md.contains("## havip in a big cluster (measured here)"), "{md}");
    assert!(
        md.contains(
            "the end-to-end suites run two \
and three pairs per node"
        ),
        "{md}"
    );
    assert!(md.contains("5000 synthetic Nodes with 20610 bytes of status"), "{md}");
    assert!(md.contains("| operator (release build) | idle with the Nodes 40.0 MiB; all pairs Live 60.0 MiB; largest 68.4 MiB | 1000 of 1000 pairs Live 88.8 s after they were created (1000 converged after 40.5 s) | ≤ 256 MiB: met |"), "{md}");
    assert!(md.contains("| agent on n0 (2 pairs, release build) | 20.0 MiB; largest in the window 21.0 MiB | 6.5 watch events/min (FloatingIP 0.5, HAPair 6.0) while the cluster wrote 1996 HAPair statuses/min; 7 objects in its start-up lists | ≤ 32 MiB: **missed** |"), "{md}");
    assert!(md.contains("5000 Nodes, 1000 pairs: agent 21.0 MiB, 6.5 watch events/min"), "{md}");
}

#[test]
fn the_scale_section_shows_the_agents_private_memory_and_the_live_goal_when_recorded() {
    let newer = SCALE
        .replace("\"real_pairs\":2", "\"real_pairs\":100")
        .replace("\"goal_rss_mib\":256,\"goal_met\":true", "\"goal_rss_mib\":256,\"goal_live_s\":120,\"goal_met\":true")
        .replace("\"own_pairs\":2", "\"own_pairs\":100")
        .replace("\"rss_kib_max\":21504,", "\"rss_kib_max\":21504,\"private_kib\":8192,")
        .replace("\"goal_rss_mib\":32", "\"goal_rss_mib\":20");
    let files: Vec<RunFile> = parse_file("scale-2026-12-07.jsonl", &newer).into_iter().collect();
    let md = render(&files);
    assert!(md.contains("1000 pairs, 100 of them on the lab's two network-namespace nodes"), "{md}");
    assert!(md.contains("| ≤ 256 MiB, all Live ≤ 120 s: met |"), "{md}");
    assert!(
        md.contains(
            "| agent on n0 (100 pairs, release build) | 20.0 MiB (8.0 MiB private); largest in the window 21.0 MiB |"
        ),
        "{md}"
    );
    assert!(md.contains("| ≤ 20 MiB: **missed** |"), "{md}");
}

fn sample() -> Vec<RunFile> {
    let mut files = vec![
        parse_file("failover-2026-11-29.jsonl", "{\"failed_connects_max\":1,\"max_gap_ms\":999.9,\"p50_gap_ms\":888.8,\"p99_gap_ms\":999.9,\"runs\":10,\"runs_without_takeover\":0,\"scenario\":\"cut\",\"system\":\"havip\"}\n"),
        parse_file("failover-2026-11-30.jsonl", FAILOVER),
        parse_file("k8s-2026-11-30.jsonl", K8S),
        parse_file("operator-2026-11-30-2.jsonl", OPERATOR),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>();
    files.sort_by_key(order);
    files
}

#[test]
fn file_names_give_name_date_and_sequence() {
    assert_eq!(parse_file_name("failover-2026-11-29.jsonl"), Some(("failover".into(), "2026-11-29".into(), 1)));
    assert_eq!(parse_file_name("k8s-2026-11-29-3.jsonl"), Some(("k8s".into(), "2026-11-29".into(), 3)));
    assert_eq!(parse_file_name("bench-k8s-2026-01-02.jsonl"), Some(("bench-k8s".into(), "2026-01-02".into(), 1)));
    assert_eq!(parse_file_name("notes.md"), None);
    assert_eq!(parse_file_name("failover.jsonl"), None);
    assert_eq!(parse_file_name("failover-2026-1-29.jsonl"), None);
}

#[test]
fn the_tables_contain_the_numbers_of_the_newest_files() {
    let md = render(&sample());
    // Failover: the newest file's rows, not the older one's.
    assert!(md.contains("| cut | havip | 5 | 307.0 | 354.3 | 354.3 | 7 | 0 |"), "{md}");
    assert!(md.contains("| cut | keepalived-v2 | 5 | 2472.3 | 2475.5 | 2475.5 | 49 | 0 |"), "{md}");
    assert!(md.contains("| cut | havip/keepalived-v2 | 0.124 | 0.143 |"), "{md}");
    assert!(!md.contains("| cut | havip | 10 | 888.8"), "an older file must not fill the main table: {md}");
    assert!(md.contains("888.8"), "older files are listed at the end: {md}");
    // Where it comes from.
    assert!(md.contains("Command: `target/release/bench-failover --runs 5`"), "{md}");
    assert!(md.contains("on 2 CPU(s) (Test CPU), Linux 6.18.0"), "{md}");
    assert!(md.contains("started 2026-11-30T10:00:00Z"), "{md}");
    assert!(md.contains("does not record its command line or machine"), "{md}");
    // Idle: both systems side by side, the ratio at the same interval, CPU per packet and the goals.
    assert!(
        md.contains(
            "| 1 × 1 | havip | 200.0 | 100.0 / 100.0 | 20.0 / 20.0 | 44.0 | 76 | 10.7 (1.5) / 11.2 (1.6) | 2.50 |"
        ),
        "{md}"
    );
    assert!(
        md.contains(
            "| 1 × 1 | keepalived-v3 | 80.0 | 60.0 / 20.0 | 10.0 / 10.0 | 10.0 | 133 | 12.7 (–) / 12.7 (–) | - |"
        ),
        "{md}"
    );
    assert!(md.contains("1 × 1: 2.50 × keepalived (goal ≤ 2 ×): **missed**"), "{md}");
    // The pairs dimension: 100 pairs against keepalived's 100 instances, and the agent's size.
    assert!(md.contains("| 100 × 1 | havip | 600.0 |"), "{md}");
    assert!(md.contains("100 × 1: 0.30 × keepalived (goal ≤ 0.3 ×): met"), "{md}");
    assert!(md.contains("100 × 1: largest RSS 21.0 MiB (goal ≤ 20 MiB): **missed**"), "{md}");
    // The mass cut: the first and the last pair, and the goal on the last.
    assert!(md.contains("| 100 | havip | 5 / 5 | 300.0 / 320.0 | 450.0 / 520.0 | 0 |"), "{md}");
    assert!(md.contains("100 pairs: the last pair back p99 520.0 ms (goal ≤ 500 ms): **missed**"), "{md}");
    assert!(!md.contains("| cut | havip/keepalived-v3 | 2.5"), "idle ratios stay out of the failover table: {md}");
    // A file without idle rows still renders its footprint rows.
    let old_only: Vec<RunFile> = parse_file(
        "failover-2026-11-28.jsonl",
        "{\"active_cpu_percent\":1.0,\"active_rss_kib\":7448,\"bench\":\"agent-idle-footprint\",\"idle_seconds\":20,\"standby_cpu_percent\":0.95,\"standby_rss_kib\":7536,\"vips\":1}\n",
    )
    .into_iter()
    .collect();
    assert!(render(&old_only).contains("| 1 | 7.3 | 1.00 | 7.4 | 0.95 | 20 s |"));
    // API requests: measured and computed rows, labelled.
    assert!(md.contains("| havip, all requests (1 pair, 2 members) | measured | 41.5 | 36.0 |"), "{md}");
    assert!(
        md.contains("| havip, without Lease requests: the part that grows with the pairs | measured | 0.0 | 0.0 |"),
        "{md}"
    );
    assert!(md.contains("Lease requests were 41.5/min"), "{md}");
    assert!(md.contains("saw 6.0 Lease requests/min in its steady window with 1000 pairs"), "{md}");
    assert!(md.contains("| kube-vip (per VIP) | **computed from documented defaults** | 57.3 | 30.0 | lease 15.0 s / renew deadline 10.0 s / retry period 2.0 s |"), "{md}");
    assert!(md.contains("| cilium-l2 (per VIP) | **computed from documented defaults** | 57.3 |"), "{md}");
    assert!(md.contains("| PUT leases | 36 | 36.0 |"), "{md}");
    assert!(md.contains("1834 ms"), "{md}");
    assert!(md.contains("read FailedOver 1650 ms after the cut"), "{md}");
    // Operator.
    assert!(md.contains("| steady | 1000 | 95.0 | 60.0 | 20.50 | 5000 | 3.30 | 25 | 3000 | 0 |"), "{md}");
    assert!(md.contains("16.67 reconciles/s"), "{md}");
}

#[test]
fn a_failover_wait_that_ran_out_is_explained_not_reported_as_a_time() {
    let k8s = K8S.replace(r#""failed_over":true"#, r#""failed_over":false"#);
    let files: Vec<RunFile> = parse_file("k8s-2026-11-30.jsonl", &k8s).into_iter().collect();
    let md = render(&files);
    assert!(md.contains("did not read FailedOver within 1650 ms"), "{md}");
    assert!(!md.contains("read FailedOver 1650 ms after the cut"), "{md}");
}

#[test]
fn the_timelines_are_drawn_from_their_json_lines_and_linked_from_the_report() {
    let timelines = r#"{"bench":"timeline","system":"havip","scenario":"cut","gap_ms":310.0,"interval_ms":5,"probes":[[-10.0,-9.5,"n0"],[-5.0,45.0,null],[300.0,310.0,"n1"]]}
{"bench":"timeline","system":"keepalived-v3","scenario":"cut","gap_ms":360.0,"interval_ms":5,"probes":[[-10.0,-9.0,"n0"],[355.0,360.0,"n1"]]}
{"bench":"timeline","system":"havip","scenario":"planned","gap_ms":6.0,"interval_ms":5,"probes":[[-5.0,-4.0,"n0"],[1.0,6.0,"n1"]]}
"#;
    let text = format!("{FAILOVER}{timelines}");
    let files: Vec<RunFile> = parse_file("failover-2026-11-30.jsonl", &text).into_iter().collect();
    let (name, svg) = timeline_svg(&files[0]).expect("an SVG");
    assert_eq!(name, "failover-2026-11-30.svg");
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\"") && svg.trim_end().ends_with("</svg>"));
    // One bar per probe (7), plus the background and the 3 legend swatches.
    assert_eq!(svg.matches("<rect ").count(), 7 + 4, "{svg}");
    assert_eq!(svg.matches(r##"fill="#d65f5f""##).count(), 1 + 1, "one failed connect plus its legend swatch");
    assert_eq!(svg.matches(r##"fill="#3a9d4a""##).count(), 3 + 1, "three answers of the new holder");
    for label in ["havip — gap 310.0 ms", "keepalived-v3 — gap 360.0 ms", ">cut<", ">planned<", "0 ms"] {
        assert!(svg.contains(label), "{label}: {svg}");
    }
    let md = render(&files);
    assert!(md.contains("](bench/failover-2026-11-30.svg)"), "{md}");
    // Without timelines: no picture, no link.
    let plain: Vec<RunFile> = parse_file("failover-2026-11-30.jsonl", FAILOVER).into_iter().collect();
    assert!(timeline_svg(&plain[0]).is_none());
    assert!(!render(&plain).contains(".svg"));
}

#[test]
fn metallb_rows_render_with_their_ratios_and_a_skip_is_said() {
    let metallb = r#"{"failed_connects_max":131,"max_gap_ms":6604.6,"p50_gap_ms":6160.4,"p99_gap_ms":6604.6,"runs":5,"runs_without_takeover":0,"scenario":"cut","system":"metallb-l2"}
{"p50_gap_ratio":0.05,"p99_gap_ratio":0.054,"ratio":"havip/metallb-l2","scenario":"cut"}
"#;
    let text = format!("{FAILOVER}{metallb}");
    let files: Vec<RunFile> = parse_file("failover-2026-12-02.jsonl", &text).into_iter().collect();
    let md = render(&files);
    assert!(md.contains("## Failover gaps: havip, keepalived and MetalLB side by side (measured here)"), "{md}");
    assert!(md.contains("| cut | metallb-l2 | 5 | 6160.4 | 6604.6 | 6604.6 | 131 | 0 |"), "{md}");
    assert!(md.contains("| cut | havip/metallb-l2 | 0.050 | 0.054 |"), "{md}");
    assert!(md.contains("`metallb-l2`: MetalLB v0.15.2 in layer-2 mode"), "{md}");
    // A run without MetalLB built says so and keeps the old title.
    let skipped = r#"{"system":"metallb-l2","skipped":"MetalLB v0.15.2 is not built"}"#;
    let text = format!("{FAILOVER}{skipped}\n");
    let files: Vec<RunFile> = parse_file("failover-2026-12-02.jsonl", &text).into_iter().collect();
    let md = render(&files);
    assert!(md.contains("## Failover gaps: havip and keepalived side by side"), "{md}");
    assert!(md.contains("Not run for this file: `metallb-l2` (MetalLB v0.15.2 is not built)."), "{md}");
    assert!(!md.contains("`metallb-l2`: MetalLB v0.15.2 in layer-2 mode"), "{md}");
}

#[test]
fn routed_rows_are_described_only_when_the_file_has_them() {
    let routed = r#"{"failed_connects_max":40,"max_gap_ms":210.0,"p50_gap_ms":190.0,"p99_gap_ms":210.0,"runs":5,"runs_without_takeover":0,"scenario":"cut","system":"havip-bgp-fast"}
{"failed_connects_max":540,"max_gap_ms":2900.0,"p50_gap_ms":2700.0,"p99_gap_ms":2900.0,"runs":5,"runs_without_takeover":0,"scenario":"cut","system":"metallb-bgp-3s"}
{"p50_gap_ratio":0.07,"p99_gap_ratio":0.072,"ratio":"havip-bgp-fast/metallb-bgp-3s","scenario":"cut"}
"#;
    let text = format!("{FAILOVER}{routed}");
    let files: Vec<RunFile> = parse_file("failover-2026-12-03.jsonl", &text).into_iter().collect();
    let md = render(&files);
    assert!(md.contains("Routed rows (`havip-bgp`"), "{md}");
    assert!(md.contains("| cut | metallb-bgp-3s | 5 | 2700.0 | 2900.0 | 2900.0 | 540 | 0 |"), "{md}");
    assert!(md.contains("| cut | havip-bgp-fast/metallb-bgp-3s | 0.070 | 0.072 |"), "{md}");
    let files: Vec<RunFile> = parse_file("failover-2026-12-03.jsonl", FAILOVER).into_iter().collect();
    assert!(!render(&files).contains("Routed rows"));
}

#[test]
fn the_planned_moves_that_keep_connections_have_tables_of_their_own() {
    let drain = r#"{"failed_connects_max":0,"longlived_break_kinds":{"reset":20},"longlived_broken_max":0,"longlived_broken_total":0,"longlived_connections":20,"longlived_cut_at_drain_end_max":20,"max_gap_ms":7.1,"mid_handshake_failed_max":0,"mid_handshake_per_run":4,"p50_gap_ms":6.2,"p99_gap_ms":7.1,"resets_max":0,"runs":5,"runs_without_takeover":0,"scenario":"planned-drain","system":"havip"}
{"failed_connects_max":1,"longlived_break_kinds":{"reset":100},"longlived_broken_max":20,"longlived_broken_total":100,"longlived_connections":20,"longlived_cut_at_drain_end_max":null,"max_gap_ms":60.0,"mid_handshake_failed_max":4,"mid_handshake_per_run":4,"p50_gap_ms":55.2,"p99_gap_ms":60.0,"resets_max":0,"runs":5,"runs_without_takeover":0,"scenario":"planned-drain","system":"keepalived-v3"}
{"p50_gap_ratio":0.112,"p99_gap_ratio":0.118,"ratio":"havip/keepalived-v3","scenario":"planned-drain"}
{"failed_connects_max":0,"failed_connects_total":0,"failure_kinds":{},"lost_after_connect_total":0,"max_gap_ms":12.5,"mid_handshake":400,"mid_handshake_failed":0,"mid_handshake_kinds":{},"move_wait_p50_ms":13.7,"moves":200,"moves_asked":200,"p50_gap_ms":8.8,"p99_gap_ms":11.0,"resets_total":0,"runs":1,"runs_without_takeover":0,"scenario":"planned-200","stopped":null,"streams":4,"system":"havip"}
{"failed_connects_max":800,"failed_connects_total":800,"failure_kinds":{"connect_timeout":800,"read_timeout":3},"lost_after_connect_total":3,"max_gap_ms":70.5,"mid_handshake":400,"mid_handshake_failed":400,"mid_handshake_kinds":{"reset":400},"move_wait_p50_ms":0.0,"moves":200,"moves_asked":200,"p50_gap_ms":55.7,"p99_gap_ms":60.5,"resets_total":0,"runs":1,"runs_without_takeover":0,"scenario":"planned-200","stopped":null,"streams":4,"system":"keepalived-v3"}
{"p50_gap_ratio":0.158,"p99_gap_ratio":0.182,"ratio":"havip/keepalived-v3","scenario":"planned-200"}
"#;
    let files: Vec<RunFile> = parse_file("failover-2026-12-03.jsonl", drain).into_iter().collect();
    let md = render(&files);
    assert!(md.contains("- `planned-drain`: `planned` with 20 long-lived connections"), "{md}");
    assert!(md.contains("| havip | 5 | 0 of 20 | 20 | 0 of 4 | 0 | 0 | 6.2 |"), "{md}");
    assert!(md.contains("| keepalived-v3 | 5 | 20 of 20 | – | 4 of 4 | 1 | 0 | 55.2 |"), "{md}");
    assert!(md.contains("| havip | 200 × 4 streams | 0 | 0 | 0 (none) | 0 of 400 | 8.8 | 11.0 | 12.5 | 14 |"), "{md}");
    assert!(
        md.contains("| keepalived-v3 | 200 × 4 streams | 800 | 0 | 3 (connect_timeout 800, read_timeout 3) | 400 of 400 | 55.7 | 60.5 | 70.5 | 0 |"),
        "{md}"
    );
    assert!(md.contains("| planned-200 | havip/keepalived-v3 | 0.158 | 0.182 |"), "{md}");
    // Without such rows, nothing of it.
    let files: Vec<RunFile> = parse_file("failover-2026-12-02.jsonl", FAILOVER).into_iter().collect();
    assert!(!render(&files).contains("planned-drain"));
}

#[test]
fn missing_results_say_how_to_get_them() {
    let md = render(&[]);
    assert!(md.contains("No results yet: run `make bench`"), "{md}");
    assert!(md.contains("What the others document"), "{md}");
}

#[test]
fn the_meta_line_names_the_command_and_the_machine() {
    let v = meta_line("failover", "make bench");
    let m = v.get("meta").expect("meta");
    assert_eq!(m.get("name").and_then(Value::as_str), Some("failover"));
    assert_eq!(m.get("command").and_then(Value::as_str), Some("make bench"));
    assert!(m.get("nproc").and_then(Value::as_u64).is_some_and(|n| n >= 1));
    assert!(m.get("started").and_then(Value::as_str).is_some_and(|s| s.ends_with('Z')));
}

const CONTROL_PLANE: &str = r#"{"meta":{"name":"control-plane","command":"target/release/bench-failover --scenarios api-kill","started":"2026-12-06T03:00:00Z","nproc":2,"kernel":"6.18.0","cpu":"","loadavg":[]}}
{"bench":"control-plane","system":"havip-cp","scenario":"api-kill","runs":5,"unavailable_ms":{"p50":741.1,"p99":761.5,"max":761.5},"failed_requests":111,"requests":462,"per_run_ms":[741.1]}
{"bench":"control-plane","system":"keepalived-kubeadm","scenario":"api-kill","runs":5,"unavailable_ms":{"p50":30261.3,"p99":30300.0,"max":30300.0},"failed_requests":1513,"requests":1630,"per_run_ms":[30261.3]}
{"bench":"control-plane","ratio":"havip-cp/keepalived-kubeadm","scenario":"api-kill","p50_unavailable_ratio":0.024}
{"bench":"control-plane","system":"keepalived-kubeadm-tuned","skipped":"not built"}
"#;

#[test]
fn the_control_plane_section_shows_each_system_and_the_ratios() {
    let files: Vec<RunFile> = parse_file("control-plane-2026-12-06.jsonl", CONTROL_PLANE).into_iter().collect();
    assert_eq!(files.len(), 1, "control-plane-<date>.jsonl is a results file");
    let md = render(&files);
    let section = md
        .split("## The control-plane VIP")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("the control-plane section");
    assert!(section.contains("| api-kill | havip-cp | 5 | 741.1 | 761.5 | 761.5 | 111 of 462 |"), "{section}");
    assert!(section.contains("| api-kill | keepalived-kubeadm | 5 | 30261.3 |"), "{section}");
    assert!(section.contains("api-kill `havip-cp/keepalived-kubeadm`: 0.024"), "{section}");
    // Not mistaken for the layer-2 failover rows or their ratios.
    let failover = md.split("## Failover gaps").nth(1).and_then(|s| s.split("\n## ").next()).unwrap_or_default();
    assert!(!failover.contains("havip-cp"), "{failover}");
    assert!(md.contains("havip-cp api-kill p50 741.1 ms unavailable"), "the history lists the file");
}
