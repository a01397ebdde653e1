//! Defaulting, as Kubernetes defaults the fields Skiff uses.

use serde_json::Value;

use crate::resources::ResourceInfo;

/// Fills in defaults on a normalized object.
pub fn apply(_info: &ResourceInfo, _obj: &mut Value) {
    todo!("validation helper")
}
