//! Validation with field paths, as Kubernetes validates the fields Skiff uses.

use serde_json::Value;

use crate::field::FieldError;
use crate::resources::ResourceInfo;

/// Decodes `obj` into its typed form and encodes it again: unknown fields are
/// dropped and a value of the wrong shape is reported with its path.
pub fn normalize(_info: &ResourceInfo, _obj: &Value) -> Result<Value, FieldError> {
    todo!("validation helper")
}

/// Every problem with `obj` (already normalized and defaulted); `old` is the
/// stored object for an update, so immutable fields can be checked.
pub fn validate(_info: &ResourceInfo, _obj: &Value, _old: Option<&Value>) -> Vec<FieldError> {
    todo!()
}
