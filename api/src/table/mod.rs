//! `meta.k8s.io/v1` Tables: what `get` shows per kind, and its text.
//!
//! [`table`] answers `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`
//! the way the Kubernetes 1.32 apiserver does: one row per object, each with
//! the cells of its kind's printer and, as asked, the object or its
//! metadata. Like the apiserver, the cells always include the priority-1
//! (`-o wide`) columns; it is the client that hides them.
//!
//! # Layout
//! - [`printers`]: the columns and cells of each kind, as
//!   `pkg/printers/internalversion/printers.go` defines them.
//! - this module: the generic Table built from them ([`table`], [`row`]).
//! - [`render`](mod@render): a Table printed as `kubectl get` prints it.

use chrono::{DateTime, Utc};
use serde_json::{json, Map, Value};

use crate::resources::ResourceInfo;

pub mod printers;
pub mod render;
#[cfg(test)]
mod tests;

pub use printers::{cells, columns};
pub use render::{render, RenderOptions};

/// What each row carries besides its cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

impl IncludeObject {
    /// The `includeObject` query parameter (`None`, `Metadata`, `Object`);
    /// Kubernetes' default, `Metadata`, when absent or unknown.
    pub fn from_param(param: Option<&str>) -> IncludeObject {
        match param {
            Some("None") => IncludeObject::None,
            Some("Object") => IncludeObject::Object,
            _ => IncludeObject::Metadata,
        }
    }
}

/// One `TableColumnDefinition`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: &'static str,
    /// An OpenAPI type: `string`, `integer`, `boolean`, `date`.
    pub type_: &'static str,
    /// `name` for the column holding the object's name, else empty.
    pub format: &'static str,
    pub description: &'static str,
    /// 0 for the columns `get` shows; 1 for those only `-o wide` shows.
    pub priority: i32,
}

impl Column {
    /// The JSON form, every field present as the apiserver writes it.
    pub fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "type": self.type_,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        })
    }
}

/// A Table of `objects` (all of `info`'s kind) at `now`.
pub fn table(info: &ResourceInfo, objects: &[Value], include: IncludeObject, now: DateTime<Utc>) -> Value {
    let columns: Vec<Value> = columns(info).iter().map(Column::to_json).collect();
    let rows: Vec<Value> = objects.iter().map(|o| row(info, o, include, now)).collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {},
        "columnDefinitions": columns,
        "rows": rows,
    })
}

/// One `TableRow` of `obj`: its cells, its row conditions (a finished pod
/// has one) and, as `include` says, the object or its metadata.
pub fn row(info: &ResourceInfo, obj: &Value, include: IncludeObject, now: DateTime<Utc>) -> Value {
    let mut row = Map::new();
    row.insert("cells".into(), Value::Array(cells(info, obj, now)));
    if let Some(conditions) = printers::row_conditions(info, obj) {
        row.insert("conditions".into(), conditions);
    }
    match include {
        IncludeObject::None => {}
        IncludeObject::Metadata => {
            let metadata = obj.get("metadata").filter(|m| m.is_object()).cloned().unwrap_or_else(|| json!({}));
            row.insert(
                "object".into(),
                json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": metadata}),
            );
        }
        IncludeObject::Object => {
            row.insert("object".into(), obj.clone());
        }
    }
    Value::Object(row)
}
