//! Services: a cluster IP and node ports, each held exclusively through a
//! key of its own (see [`crate::allocator`]), assigned on create and update
//! and released with the Service.

use serde_json::{json, Value};
use skiff_api::field::FieldError;

use super::{Claim, Strategy};
use crate::allocator;

pub struct Service;

impl Strategy for Service {
    fn allocate(&self, obj: &mut Value, old: Option<&Value>) -> Result<Vec<Claim>, FieldError> {
        let chosen = allocator::assign(obj, old)?;
        Ok(chosen
            .into_iter()
            .map(|(key, field)| {
                let value = key.rsplit('/').next().unwrap_or_default().to_string();
                let what = if field.contains("nodePort") { "port" } else { "IP" };
                let taken = FieldError::invalid(field, &json!(value), format!("provided {what} is already allocated"));
                Claim { key, taken }
            })
            .collect())
    }

    fn held(&self, obj: &Value) -> Vec<String> {
        allocator::held(obj)
    }
}
