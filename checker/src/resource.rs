//! The watch check for the Kubernetes resource API: one watch stream of one
//! resource against the acknowledged object writes.
//!
//! - resourceVersions only grow: an event's version is never below the last
//!   event's, and an object event is never at or below the last bookmark;
//! - no duplicates: an `(name, resourceVersion)` arrives at most once;
//! - no acknowledged write is missing: every write with a version in the
//!   stream's window (first observed version up to the last, bookmarks
//!   included) has its event, of the right type (`DELETED` for deletions).
//!
//! resourceVersions are compared as numbers (Skiff's are store revisions).

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::verdict::{Violation, ViolationKind};

/// An acknowledged create, update or delete of an object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectWrite {
    /// The object's name (with its namespace, if the caller wants it distinct).
    pub name: String,
    /// The resourceVersion the write returned.
    pub resource_version: u64,
    /// Whether it was a deletion.
    pub deleted: bool,
}

/// A watch event's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum ResourceEventType {
    Added,
    Modified,
    Deleted,
    Bookmark,
}

/// One event of a resource watch stream, in arrival order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceEvent {
    #[serde(rename = "type")]
    pub event_type: ResourceEventType,
    /// The object's name (ignored for bookmarks).
    pub name: String,
    pub resource_version: u64,
}

/// Checks one resource watch stream against the acknowledged writes (see module docs).
pub fn check_resource_watch(writes: &[ObjectWrite], events: &[ResourceEvent]) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut delivered: HashMap<(&str, u64), ResourceEventType> = HashMap::new();
    let mut last_event: Option<u64> = None;
    let mut last_bookmark: Option<u64> = None;
    let mut lower: Option<u64> = None;
    for e in events {
        let rv = e.resource_version;
        let v = |kind, why: String| Violation::new(kind, &e.name, why).with_revision(rv);
        if e.event_type == ResourceEventType::Bookmark {
            if let Some(l) = last_event.filter(|l| rv < *l) {
                out.push(v(ViolationKind::ResourceVersionOrder, format!("bookmark at {rv} after an event at {l}")));
            }
            lower.get_or_insert(rv.saturating_add(1));
            last_bookmark = last_bookmark.max(Some(rv));
            continue;
        }
        lower.get_or_insert(rv);
        if delivered.insert((e.name.as_str(), rv), e.event_type).is_some() {
            out.push(v(ViolationKind::ResourceDuplicate, format!("{:?} at {rv} delivered again", e.event_type)));
            continue;
        }
        if let Some(l) = last_event.filter(|l| rv < *l) {
            out.push(v(ViolationKind::ResourceVersionOrder, format!("resourceVersion {rv} arrived after {l}")));
        } else if let Some(b) = last_bookmark.filter(|b| rv <= *b) {
            out.push(v(
                ViolationKind::ResourceVersionOrder,
                format!("resourceVersion {rv} arrived after a bookmark at {b}"),
            ));
        }
        last_event = last_event.max(Some(rv));
    }
    let (Some(lower), Some(upper)) = (lower, last_event.max(last_bookmark)) else { return out };
    let mut checked: HashSet<(&str, u64)> = HashSet::new();
    for w in writes.iter().filter(|w| (lower..=upper).contains(&w.resource_version)) {
        let id = (w.name.as_str(), w.resource_version);
        if !checked.insert(id) {
            continue;
        }
        let rv = w.resource_version;
        match delivered.get(&id) {
            None => out.push(
                Violation::new(
                    ViolationKind::ResourceMissing,
                    &w.name,
                    format!(
                        "the acknowledged {} at resourceVersion {rv} has no event (watched {lower}..={upper})",
                        if w.deleted { "deletion" } else { "write" }
                    ),
                )
                .with_revision(rv),
            ),
            Some(t) if (*t == ResourceEventType::Deleted) != w.deleted => out.push(
                Violation::new(
                    ViolationKind::ResourceMismatch,
                    &w.name,
                    format!(
                        "the {} at resourceVersion {rv} arrived as {t:?}",
                        if w.deleted { "deletion" } else { "write" }
                    ),
                )
                .with_revision(rv),
            ),
            Some(_) => {}
        }
    }
    out
}
