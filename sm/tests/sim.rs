//! The deterministic simulator as a test: a short run is clean, and a seed replays the same
//! trace. (The deliberate-break test lives next to the simulator, in
//! `src/sim/mod.rs`, because its knob only exists in the library's own test build.)

use havip_sm::sim::{Invariant, SimOptions, report, run_schedule, schedule_seed};

#[test]
fn sim_short_run_has_no_violations() {
    let opts = SimOptions::default();
    let mut takeovers = 0;
    for i in 0..150 {
        let o = run_schedule(schedule_seed(2024, i), &opts);
        assert!(o.violations.is_empty(), "{}", report(&o));
        takeovers += o.takeovers;
    }
    assert!(takeovers > 50, "the schedules exercise takeovers ({takeovers})");
}

#[test]
fn sim_replay_is_deterministic() {
    let opts = SimOptions::default().with_full_trace();
    for i in 0..5 {
        let seed = schedule_seed(7, i);
        let a = run_schedule(seed, &opts);
        let b = run_schedule(seed, &opts);
        assert_eq!(a.digest, b.digest);
        assert_eq!(a.trace, b.trace);
        assert_eq!(a.steps, b.steps);
        assert!(!a.trace.is_empty());
    }
    let x = run_schedule(schedule_seed(7, 0), &opts);
    let y = run_schedule(schedule_seed(7, 1), &opts);
    assert_ne!(x.digest, y.digest, "different seeds, different schedules");
}

#[test]
fn sim_invariant_codes_are_stable() {
    let codes: Vec<&str> = [
        Invariant::DualHolders,
        Invariant::HeartbeatOnlyMove,
        Invariant::IsolatedTakeover,
        Invariant::SlowReplacement,
        Invariant::PolicyViolated,
        Invariant::EpochBackwards,
        Invariant::StaleEpoch,
        Invariant::FlappingLinkAttracts,
        Invariant::RestartMovedVips,
        Invariant::AnnouncedStale,
        Invariant::SilentDualHolder,
        Invariant::NoHolderAfterHeal,
    ]
    .iter()
    .map(|i| i.code())
    .collect();
    assert_eq!(codes, vec!["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "heal"]);
}
