//! Maintenance: the merge patch that sets one member's `spec.members[].maintenance`,
//! and applying it under the pair's `resourceVersion`.

use crate::error::{Action, PluginError, is_status};
use havip_crds::{HAPair, manager};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

/// The merge patch that sets `spec.members[].maintenance` for `node`: the whole
/// (atomic) member list with that one flag changed, guarded by the object's
/// `resourceVersion` so that a concurrent edit of the list makes it fail (409)
/// instead of being overwritten.
pub fn maintenance_patch(pair: &HAPair, node: &str, on: bool) -> Result<serde_json::Value, PluginError> {
    if !pair.spec.members.iter().any(|m| m.node == node) {
        let members: Vec<&str> = pair.spec.members.iter().map(|m| m.node.as_str()).collect();
        return Err(PluginError::Usage(format!(
            "{node} is not a member of HAPair {} (members: {})",
            pair.name_any(),
            members.join(", ")
        )));
    }
    let mut members = pair.spec.members.clone();
    for m in &mut members {
        if m.node == node {
            m.maintenance = on;
        }
    }
    Ok(serde_json::json!({
        "metadata": {"resourceVersion": pair.resource_version()},
        "spec": {"members": members},
    }))
}

/// Applies [`maintenance_patch`] with the plugin's field manager, re-reading and
/// retrying when the pair changed in between.
pub async fn set_maintenance(api: &Api<HAPair>, pair: &str, node: &str, on: bool) -> Result<(), PluginError> {
    let pp = PatchParams { field_manager: Some(manager::PLUGIN.to_owned()), ..PatchParams::default() };
    let mut attempts = 0;
    loop {
        let current = api.get(pair).await.map_err(|e| PluginError::from_kube(Action::pair("get", pair), e))?;
        let patch = maintenance_patch(&current, node, on)?;
        match api.patch(pair, &pp, &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(()),
            Err(e) if is_status(&e, 409) && attempts < 5 => attempts += 1,
            Err(e) => return Err(PluginError::from_kube(Action::pair("patch", pair), e)),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::maintenance_patch;
    use crate::render::sample_pair as pair;

    #[test]
    fn maintenance_patch_changes_one_flag_under_the_resource_version() {
        let mut p = pair();
        p.metadata.resource_version = Some("42".to_owned());
        let patch = maintenance_patch(&p, "b", false).unwrap();
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        assert_eq!(patch["spec"]["members"][1]["node"], "b");
        assert_eq!(patch["spec"]["members"][1]["maintenance"], false);
        assert_eq!(patch["spec"]["members"][0]["priority"], 200);
        assert!(maintenance_patch(&p, "zz", true).is_err());
    }
}
