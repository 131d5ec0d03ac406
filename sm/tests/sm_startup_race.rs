//! Start-up race found on real kernels: two members started together finish their Init
//! listens a few milliseconds apart. The lower-priority member must treat the
//! higher-priority peer that is still in Init as a candidate (and give it its turn),
//! instead of electing itself because the peer is "not a standby yet".
#![allow(clippy::unwrap_used)]

mod sm_support;
use havip_sm::*;
use sm_support::*;

#[test]
fn startup_lower_priority_waits_for_a_higher_priority_peer_still_in_init() {
    let mut b = H::new(pair(B), Persisted::default());
    b.env_ok();
    // A is heard from the start but still advertises Init when B's listen ends and when
    // A has been heard steadily for 1 s (A started later): B waits for A to leave Init.
    let out = b.run(1_900, &[adv(A, 200, Role::Init, 0, false)], Some(false));
    assert!(cas_of(&out).is_empty(), "B must not claim while A (higher priority) is in Init: {out:?}");
    assert_eq!(b.role(), Role::Standby);
    assert_eq!(b.status().blocker, Some(Blocker::PeerNotSteady));
    // A finishes its listen and claims: B stays standby.
    let out = b.run(3_000, &[adv(A, 200, Role::Active, 1, false)], Some(false));
    assert!(cas_of(&out).is_empty() && adds(&out).is_empty(), "{out:?}");
    assert_eq!(b.status().blocker, Some(Blocker::PeerActive));
}

#[test]
fn startup_a_peer_stuck_in_init_delays_the_election_at_most_two_listens() {
    let mut b = H::new(pair(B), Persisted::default());
    b.env_ok();
    // A never leaves Init (say it cannot read its addresses): B serves after two listens (plus its one-listen stagger).
    let out = b.run(4_500, &[adv(A, 200, Role::Init, 0, false)], Some(false));
    assert_eq!(cas_of(&out).len(), 1, "B elects itself once A stayed in Init for two listens: {out:?}");
}
