//! The columns `get` shows per kind, as a `meta.k8s.io/v1` Table, and the
//! text rendering of a Table the way kubectl prints it.

use serde_json::Value;

use crate::resources::ResourceInfo;

/// What each row carries besides its cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

/// A Table of `objects` (all of `info`'s kind) at `now`.
pub fn table(_info: &ResourceInfo, _objects: &[Value], _include: IncludeObject, _now: chrono::DateTime<chrono::Utc>) -> Value {
    todo!("table helper")
}

#[derive(Clone, Copy, Debug, Default)]
pub struct RenderOptions {
    /// `-o wide`: also the priority-1 columns.
    pub wide: bool,
    /// A leading NAMESPACE column (`-A`).
    pub namespace_column: bool,
    pub no_headers: bool,
    pub show_labels: bool,
}

/// The text kubectl prints for a Table.
pub fn render(_table: &Value, _options: RenderOptions) -> String {
    todo!()
}
