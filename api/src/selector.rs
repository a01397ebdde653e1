//! Label and field selectors: parsing (Kubernetes' syntax), matching, and
//! the fields each kind can be selected by.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::resources::Kind;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SelectorError(pub String);

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {}

impl LabelSelector {
    pub fn parse(_s: &str) -> Result<Self, SelectorError> {
        todo!("selector helper")
    }
    pub fn is_empty(&self) -> bool {
        todo!()
    }
    pub fn matches(&self, _labels: &BTreeMap<String, String>) -> bool {
        todo!()
    }
    /// A `metav1.LabelSelector` (matchLabels + matchExpressions) as JSON.
    pub fn from_api(_selector: &Value) -> Result<Self, SelectorError> {
        todo!()
    }
}

/// The selectable fields of one object, by field name.
pub type Fields = BTreeMap<&'static str, String>;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector {}

impl FieldSelector {
    pub fn parse(_s: &str) -> Result<Self, SelectorError> {
        todo!()
    }
    pub fn is_empty(&self) -> bool {
        todo!()
    }
    pub fn matches(&self, _fields: &Fields) -> bool {
        todo!()
    }
    /// The value `field` must equal (`spec.nodeName=n1`), for indexing.
    pub fn exact(&self, _field: &str) -> Option<&str> {
        todo!()
    }
    /// Refuses fields `kind` cannot be selected by.
    pub fn check_supported(&self, _kind: Kind) -> Result<(), SelectorError> {
        todo!()
    }
}

pub fn supported_fields(_kind: Kind) -> &'static [&'static str] {
    todo!()
}

pub fn object_fields(_kind: Kind, _obj: &Value) -> Fields {
    todo!()
}
