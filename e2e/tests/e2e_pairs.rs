//! End to end on the local control plane: the operator, one agent per node namespace,
//! the kubectl plugin, a client on the data network. `make e2e` runs these (root).
//! The scenarios themselves live in `havip_e2e::scenarios` and run unchanged on kind
//! (`kind-e2e run`); a failure prints the operator's and the agents' logs and the
//! pair's status.

use havip_e2e::cluster::LocalCluster;
use havip_e2e::kubelab::{KubeLab, KubeLabOptions};
use havip_e2e::{netns, scenarios};

/// A local lab with `nodes` node namespaces and the operator, or None without root.
fn local(nodes: usize) -> Option<LocalCluster> {
    if !netns::skip_unless_root(module_path!()) {
        return None;
    }
    havip_e2e::init_tracing();
    let lab = KubeLab::start(KubeLabOptions {
        nodes,
        operator: true,
        dir: None,
        chart_rbac: false,
        bgp: None,
        ..Default::default()
    })
    .expect("lab");
    Some(LocalCluster::new(lab))
}

macro_rules! scenario {
    ($test:ident, $nodes:expr, $f:path) => {
        #[test]
        fn $test() {
            let Some(mut c) = local($nodes) else { return };
            $f(&mut c);
        }
    };
}

scenario!(pair_goes_live_within_5s_and_kubectl_shows_its_columns, 2, scenarios::pair_goes_live);
scenario!(active_node_cut_fails_over_with_a_new_epoch_lease_and_events, 2, scenarios::active_node_cut);
scenario!(planned_failover_through_the_plugin_loses_no_connect, 2, scenarios::planned_failover);
scenario!(forced_failover_through_the_plugin, 2, scenarios::forced_failover);
scenario!(maintenance_on_the_active_hands_over_and_on_the_standby_takes_it_out, 2, scenarios::maintenance);
scenario!(automatic_failback_honours_its_recovery_window_and_quarantine, 2, scenarios::automatic_failback);
scenario!(operator_stopped_failover_still_works, 2, scenarios::operator_stopped);
scenario!(api_server_unreachable_then_active_cut_still_takes_over_and_catches_up, 2, scenarios::api_outage);
scenario!(agent_restart_on_the_active_loses_no_connect_and_moves_nothing, 2, scenarios::agent_restart);
scenario!(a_bad_spec_edit_is_refused_or_conditioned_and_nothing_moves, 2, scenarios::bad_spec_edit);
scenario!(key_rotation_through_the_plugin_misses_no_heartbeat, 2, scenarios::key_rotation);
scenario!(
    member_replacement_keeps_the_vips_rotates_the_key_and_the_newcomer_joins_as_standby,
    3,
    scenarios::member_replacement
);
scenario!(a_floating_ip_on_an_address_in_use_is_refused_and_nothing_moves, 2, scenarios::floating_ip_address_conflict);
scenario!(two_pairs_on_the_same_two_nodes_and_port_stay_apart_and_move_together, 2, scenarios::two_pairs_on_two_nodes);
scenario!(
    three_pairs_on_three_nodes_two_sharing_only_one_node_all_leave_the_cut_node,
    3,
    scenarios::three_pairs_on_three_nodes
);

/// Every shared scenario has a local test above (the kind suite runs the same list).
#[test]
fn every_shared_scenario_runs_locally() {
    let src = include_str!("e2e_pairs.rs");
    for s in scenarios::all::<LocalCluster>().into_iter().chain(scenarios::shared_nodes::<LocalCluster>()) {
        assert!(
            src.contains(&format!("scenario!({}", s.name)) || src.contains(&format!("    {},\n", s.name)),
            "{} has no local test",
            s.name
        );
    }
}
