//! CustomResourceDefinitions, and the resources they add.
//!
//! The apiserver writes a definition's status itself (accepted names,
//! stored versions, `NamesAccepted` and `Established`): a stored definition
//! is served at once, so there is no controller to wait for. Deleting a
//! definition deletes every object of its resource in the same transaction
//! (Kubernetes does it through a finalizer, honouring the objects' own
//! finalizers; Skiff does not wait for those).

use serde_json::Value;
use skiff_api::custom;
use skiff_api::resources::ResourceInfo;

use super::Strategy;

pub struct Definition;

impl Strategy for Definition {
    fn prepare_for_create(&self, _info: &ResourceInfo, obj: &mut Value) {
        obj["status"] = custom::status_of(obj, None, &skiff_api::meta::now_rfc3339());
    }

    fn prepare_for_update(&self, _info: &ResourceInfo, obj: &mut Value, old: &Value) {
        obj["status"] = custom::status_of(obj, old.get("status"), &skiff_api::meta::now_rfc3339());
    }

    fn owned_prefixes(&self, obj: &Value) -> Vec<String> {
        let text = |p: &str| obj.pointer(p).and_then(Value::as_str).unwrap_or_default();
        let (group, plural) = (text("/spec/group"), text("/spec/names/plural"));
        if group.is_empty() || plural.is_empty() {
            return Vec::new();
        }
        vec![format!("/registry/{group}/{plural}/")]
    }
}

/// Custom resources: the generic rules, with a generation, as Kubernetes
/// gives every custom resource one.
pub struct Resource;

impl Strategy for Resource {
    fn tracks_generation(&self) -> bool {
        true
    }
}
