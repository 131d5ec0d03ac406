//! Heartbeat key rotation: how far the members are and what to do with the Secret.
//! Pure, except [`random_key_hex`] (the operating system's random source).

use super::observed::{KeyInfo, Observed, member_status};
use std::collections::BTreeSet;
/// The members that do not report the current key id yet (empty: the rotation is done).
pub fn key_progress(o: &Observed, k: &KeyInfo) -> Vec<String> {
    o.spec
        .members
        .iter()
        .filter(|m| member_status(&o.status, &m.node).and_then(|s| s.key_id) != Some(k.key_id))
        .map(|m| m.node.clone())
        .collect()
}

/// What the key Secret needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyAction {
    /// Nothing.
    None,
    /// Every member signs with the new key: drop the previous one.
    FinishRotation,
    /// Members were removed from the spec: rotate, so they become strangers.
    RotateForRemoval {
        /// The removed nodes.
        removed: Vec<String>,
    },
    /// Members were only added (or never recorded): record the member set.
    RecordMembers,
}

/// The key Secret's next step, from its state and the spec's members.
pub fn key_action(o: &Observed) -> KeyAction {
    let Some(k) = &o.key else { return KeyAction::None };
    if o.spec.heartbeat.key_secret_ref.is_some() {
        return KeyAction::None;
    }
    if k.previous_key_id.is_some() {
        return if key_progress(o, k).is_empty() { KeyAction::FinishRotation } else { KeyAction::None };
    }
    let spec: BTreeSet<String> = o.spec.members.iter().map(|m| m.node.clone()).collect();
    match &k.members {
        None => KeyAction::RecordMembers,
        Some(recorded) => {
            let removed: Vec<String> = recorded.difference(&spec).cloned().collect();
            if !removed.is_empty() {
                KeyAction::RotateForRemoval { removed }
            } else if *recorded != spec {
                KeyAction::RecordMembers
            } else {
                KeyAction::None
            }
        }
    }
}

/// A random 32-byte key as 64 lowercase hex digits.
pub fn random_key_hex() -> Result<String, crate::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| crate::Error::Random(e.to_string()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
