//! Field ownership and server-side apply, as Kubernetes does them
//! (structured-merge-diff under `metadata.managedFields`). Pure functions on
//! JSON; the registry calls [`update`] on every write and [`apply`] for an
//! `application/apply-patch+yaml` PATCH.
//!
//! # How ownership flows
//!
//! Every writer is a *manager*: a name (`kubectl`, `kubectl-edit`, …), an
//! operation ([`Operation::Apply`] or [`Operation::Update`]), an apiVersion
//! and a subresource (`status`). Each owns a [`FieldSet`].
//!
//! - An **update** (create, PUT, merge/strategic/JSON patch) compares the
//!   object before and after: the writer gains every field it added or
//!   changed and every other manager loses them (an update never
//!   conflicts); fields removed are removed from everyone.
//! - An **apply** merges the applied configuration into the live object by
//!   the schema's list markers ([`schema`](self#schema)): list-maps merge
//!   element by element on their keys, set-lists by value, other lists are
//!   replaced whole. A field the merge changes or adds that another manager
//!   owns is a *conflict*: the apply fails with 409 listing them, unless
//!   `force` moves their ownership to the applier. The applier then owns
//!   exactly the fields of its configuration; a field it applied last time
//!   and applies no more is removed from the object, unless another manager
//!   still owns it (or something below it).
//!
//! Server-set metadata (`name`, `uid`, `resourceVersion`, …) is owned by
//! no one, as are `status` fields written through the main resource of a
//! kind with a status subresource and anything but `status` written through
//! that subresource.
//!
//! # Schema
//!
//! Which lists are maps (and on which keys), sets or atomic, and which maps
//! and structs are atomic, comes from the object's schema, read through
//! [`crate::structure`]: its `x-kubernetes-list-type`,
//! `x-kubernetes-list-map-keys` and `x-kubernetes-map-type` markers, those
//! `/openapi/v3` serves for a built-in kind and those of the CRD for a
//! custom resource. Fields the schema does not know are granular maps and
//! atomic lists, as for an unknown schema.

use serde_json::{json, Map, Value};

use crate::fieldpath::{FieldSet, FieldsError, Path, PathElement};
use crate::status::{ApiError, Cause, Details, Reason};
use crate::structure::{Field, ListType, Ty};

// ---------------------------------------------------------------------------
// Schema

/// Key fields with a default (`protocol` of ports): an element without
/// them is keyed as if it had the default, as Kubernetes keys it.
fn key_default(key: &str) -> Option<Value> {
    (key == "protocol").then(|| json!("TCP"))
}

/// The path element of a list element, `None` if a list-map element lacks
/// a key field (and it has no default).
fn element(item: &Value, list: ListType<'_>, index: usize) -> Option<PathElement> {
    match list {
        ListType::Atomic => Some(PathElement::Index(index)),
        ListType::Set => Some(PathElement::value(item)),
        ListType::Map(keys) => {
            let m = item.as_object()?;
            let values: Vec<Value> = keys
                .iter()
                .map(|k| m.get(k).filter(|v| !v.is_null()).cloned().or_else(|| key_default(k)))
                .collect::<Option<_>>()?;
            let fields: Vec<(&str, &Value)> = keys.iter().map(String::as_str).zip(values.iter()).collect();
            Some(PathElement::key(&fields))
        }
    }
}

/// The element of a list, falling back to its index when it has no key.
fn element_or_index(item: &Value, list: ListType<'_>, index: usize) -> PathElement {
    element(item, list, index).unwrap_or(PathElement::Index(index))
}

// ---------------------------------------------------------------------------
// Field sets of values

/// Why an applied configuration cannot be applied (before any conflict).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    #[error("the apply configuration must be a JSON or YAML object")]
    NotAnObject,
    #[error("{path}: element {index} of an associative list with keys {keys:?} omits a key field")]
    MissingKey { path: String, index: usize, keys: Vec<String> },
    #[error("{path}: duplicate entries for key {key}")]
    DuplicateKey { path: String, key: String },
    #[error("Apply failed with {} conflict{}: {}", .0.len(), if .0.len() == 1 { "" } else { "s" }, conflict_message(.0))]
    Conflicts(Vec<Conflict>),
}

/// A field another manager owns that an apply would change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The manager as Kubernetes prints it: `"kubectl"`, or
    /// `"kubectl-client-side-apply" using v1` for an Update manager.
    pub manager: String,
    pub path: Path,
}

fn conflict_message(conflicts: &[Conflict]) -> String {
    if let [c] = conflicts {
        return format!("conflict with {}: {}", c.manager, c.path);
    }
    let mut managers: Vec<&str> = conflicts.iter().map(|c| c.manager.as_str()).collect();
    managers.sort();
    managers.dedup();
    let mut lines = Vec::new();
    for m in managers {
        lines.push(format!("conflicts with {m}"));
        lines.extend(conflicts.iter().filter(|c| c.manager == m).map(|c| format!("- {}", c.path)));
    }
    lines.join("\n")
}

impl From<ApplyError> for ApiError {
    fn from(e: ApplyError) -> ApiError {
        match &e {
            ApplyError::Conflicts(conflicts) => {
                let causes = conflicts
                    .iter()
                    .map(|c| Cause {
                        kind: "FieldManagerConflict".into(),
                        message: format!("conflict with {}", c.manager),
                        field: c.path.to_string(),
                    })
                    .collect();
                ApiError {
                    reason: Reason::Conflict,
                    message: e.to_string(),
                    details: Some(Box::new(Details { causes, ..Default::default() })),
                }
            }
            _ => ApiError::new(Reason::Invalid, e.to_string()),
        }
    }
}

/// Inserts the fields `v` specifies below `path`: its leaves (scalars,
/// empty maps, atomic values) and every element of a granular list.
/// With `strict`, list-map elements without keys and duplicate keys are
/// errors (an applied configuration); otherwise they are keyed by index.
fn collect(v: &Value, ty: Ty<'_>, path: &Path, out: &mut FieldSet, strict: bool) -> Result<(), ApplyError> {
    match v {
        Value::Object(m) if !ty.is_atomic() && !m.is_empty() => {
            for (k, child) in m {
                collect_field(child, ty.field(k), &path.child(PathElement::field(k)), out, strict)?;
            }
            Ok(())
        }
        _ => {
            out.insert(path.clone());
            Ok(())
        }
    }
}

fn collect_field(v: &Value, f: Field<'_>, path: &Path, out: &mut FieldSet, strict: bool) -> Result<(), ApplyError> {
    match (v, f.list) {
        (Value::Array(items), ListType::Set | ListType::Map(_)) => {
            let mut seen = std::collections::HashSet::new();
            for (i, item) in items.iter().enumerate() {
                let e = match (element(item, f.list, i), f.list) {
                    (Some(e), _) => e,
                    (None, ListType::Map(keys)) if strict => {
                        return Err(ApplyError::MissingKey { path: path.to_string(), index: i, keys: keys.to_vec() })
                    }
                    (None, _) => PathElement::Index(i),
                };
                if strict && !seen.insert(e.clone()) {
                    return Err(ApplyError::DuplicateKey { path: path.to_string(), key: e.to_string() });
                }
                let p = path.child(e);
                out.insert(p.clone());
                if f.list != ListType::Set {
                    collect(item, f.ty, &p, out, strict)?;
                }
            }
            Ok(())
        }
        _ => collect(v, f.ty, path, out, strict),
    }
}

/// Inserts `path` and everything below it: what an added or removed
/// subtree contributes to a comparison. Struct nodes are not themselves
/// inserted, only their fields.
fn collect_all(v: &Value, f: Field<'_>, path: &Path, out: &mut FieldSet, element: bool) {
    if element || !f.ty.is_struct() {
        out.insert(path.clone());
    }
    match (v, f.list) {
        (Value::Array(items), ListType::Set | ListType::Map(_)) => {
            for (i, item) in items.iter().enumerate() {
                let p = path.child(element_or_index(item, f.list, i));
                if f.list == ListType::Set {
                    out.insert(p);
                } else {
                    collect_all(item, f.ty.as_field(), &p, out, true);
                }
            }
        }
        (Value::Object(m), _) if !f.ty.is_atomic() => {
            if m.is_empty() {
                out.insert(path.clone());
            }
            for (k, child) in m {
                collect_all(child, f.ty.field(k), &path.child(PathElement::field(k)), out, false);
            }
        }
        _ => out.insert(path.clone()),
    }
}

/// The fields an object or applied configuration of type `root` (a kind's
/// [`structure`](crate::structure::of)) specifies.
pub fn field_set<'s>(root: impl Into<Ty<'s>>, v: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    // Never fails when not strict.
    let _ = collect(v, root.into(), &Path::default(), &mut out, false);
    out
}

/// The fields an applied configuration specifies; list-map elements must
/// carry their keys, once each.
pub fn config_field_set<'s>(root: impl Into<Ty<'s>>, config: &Value) -> Result<FieldSet, ApplyError> {
    let mut out = FieldSet::new();
    collect(config, root.into(), &Path::default(), &mut out, true)?;
    Ok(out)
}

// ---------------------------------------------------------------------------
// Merge, compare, remove

/// Equality of JSON values, numbers by value.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

/// Merges an applied configuration into the live object of type `root`: maps
/// merge field by field, list-maps and set-lists element by element, every
/// other value of the configuration replaces the live one.
pub fn merge<'s>(root: impl Into<Ty<'s>>, live: &Value, config: &Value) -> Value {
    merge_value(live, config, root.into())
}

fn merge_value(live: &Value, config: &Value, ty: Ty<'_>) -> Value {
    match (live, config) {
        (Value::Object(l), Value::Object(c)) if !ty.is_atomic() => {
            let mut out = l.clone();
            for (k, cv) in c {
                let merged = match l.get(k) {
                    Some(lv) => merge_field(lv, cv, ty.field(k)),
                    None => cv.clone(),
                };
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        _ => config.clone(),
    }
}

fn merge_field(live: &Value, config: &Value, f: Field<'_>) -> Value {
    match (live, config, f.list) {
        (Value::Array(l), Value::Array(c), ListType::Set | ListType::Map(_)) => {
            let key = |items: &[Value]| -> Vec<PathElement> {
                items.iter().enumerate().map(|(i, v)| element_or_index(v, f.list, i)).collect()
            };
            let (lkeys, ckeys) = (key(l), key(c));
            let mut out = Vec::with_capacity(l.len() + c.len());
            let mut emitted = vec![false; c.len()];
            // Live order; an element new to the list goes just before the
            // first live element that follows it in the configuration.
            for (li, lv) in l.iter().enumerate() {
                match ckeys.iter().position(|k| *k == lkeys[li]) {
                    Some(ci) => {
                        for cj in 0..ci {
                            if !emitted[cj] && !lkeys.contains(&ckeys[cj]) {
                                emitted[cj] = true;
                                out.push(c[cj].clone());
                            }
                        }
                        emitted[ci] = true;
                        out.push(if f.list == ListType::Set { lv.clone() } else { merge_value(lv, &c[ci], f.ty) });
                    }
                    None => out.push(lv.clone()),
                }
            }
            for (cj, cv) in c.iter().enumerate() {
                if !emitted[cj] && !lkeys.contains(&ckeys[cj]) {
                    out.push(cv.clone());
                }
            }
            Value::Array(out)
        }
        _ => merge_value(live, config, f.ty),
    }
}

/// What changed between two versions of an object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Comparison {
    pub added: FieldSet,
    pub modified: FieldSet,
    pub removed: FieldSet,
}

/// Compares two versions of an object of type `root`, field by field and
/// list element by list element.
pub fn compare<'s>(root: impl Into<Ty<'s>>, old: &Value, new: &Value) -> Comparison {
    let mut c = Comparison::default();
    compare_field(Some(old), Some(new), root.into().as_field(), &Path::default(), &mut c);
    c
}

fn compare_field(old: Option<&Value>, new: Option<&Value>, f: Field<'_>, path: &Path, c: &mut Comparison) {
    match (old, new) {
        (None, None) => {}
        (None, Some(n)) => collect_all(n, f, path, &mut c.added, false),
        (Some(o), None) => collect_all(o, f, path, &mut c.removed, false),
        // Nothing below changed: most of an update (a pod's spec under a
        // status write or a binding) is not walked path by path.
        (Some(o), Some(n)) if same(o, n) => {}
        (Some(Value::Array(o)), Some(Value::Array(n))) if f.list != ListType::Atomic => {
            let (o, n) = (keyed(o, f.list), keyed(n, f.list));
            for (e, ov) in &o {
                let p = path.child(e.clone());
                match n.iter().find(|(k, _)| k == e) {
                    Some((_, nv)) if f.list != ListType::Set => {
                        compare_field(Some(ov), Some(nv), f.ty.as_field(), &p, c)
                    }
                    Some(_) => {}
                    None if f.list == ListType::Set => c.removed.insert(p),
                    None => collect_all(ov, f.ty.as_field(), &p, &mut c.removed, true),
                }
            }
            for (e, nv) in &n {
                if !o.iter().any(|(k, _)| k == e) {
                    let p = path.child(e.clone());
                    if f.list == ListType::Set {
                        c.added.insert(p);
                    } else {
                        collect_all(nv, f.ty.as_field(), &p, &mut c.added, true);
                    }
                }
            }
        }
        (Some(Value::Object(o)), Some(Value::Object(n))) if !(f.ty.is_atomic() || o.is_empty() && n.is_empty()) => {
            for (k, ov) in o {
                compare_field(Some(ov), n.get(k), f.ty.field(k), &path.child(PathElement::field(k)), c);
            }
            for (k, nv) in n {
                if !o.contains_key(k) {
                    compare_field(None, Some(nv), f.ty.field(k), &path.child(PathElement::field(k)), c);
                }
            }
        }
        (Some(_), Some(_)) => {
            c.modified.insert(path.clone());
        }
    }
}

fn keyed<'v>(items: &'v [Value], list: ListType<'_>) -> Vec<(PathElement, &'v Value)> {
    items.iter().enumerate().map(|(i, v)| (element_or_index(v, list, i), v)).collect()
}

/// Removes the field or list element at `path` from `obj`; `false` if it
/// was not there.
fn remove_path(root: Ty<'_>, obj: &mut Value, path: &Path) -> bool {
    fn walk(v: &mut Value, f: Field<'_>, rest: &[PathElement]) -> bool {
        let Some((first, tail)) = rest.split_first() else { return false };
        match (v, first) {
            (Value::Object(m), PathElement::Field(name)) => {
                let child = f.ty.field(name);
                if tail.is_empty() {
                    return m.remove(name).is_some();
                }
                m.get_mut(name).is_some_and(|c| walk(c, child, tail))
            }
            (Value::Array(items), e) => {
                let Some(i) = items.iter().enumerate().position(|(i, item)| element_or_index(item, f.list, i) == *e)
                else {
                    return false;
                };
                if tail.is_empty() {
                    items.remove(i);
                    return true;
                }
                walk(&mut items[i], f.ty.as_field(), tail)
            }
            _ => false,
        }
    }
    walk(obj, root.as_field(), &path.0)
}

/// The value at `path`, if any.
fn value_at<'a>(root: Ty<'_>, obj: &'a Value, path: &Path) -> Option<&'a Value> {
    let mut v = obj;
    let mut f = root.as_field();
    for e in &path.0 {
        match (v, e) {
            (Value::Object(m), PathElement::Field(name)) => {
                f = f.ty.field(name);
                v = m.get(name)?;
            }
            (Value::Array(items), e) => {
                v = items.iter().enumerate().find(|(i, item)| element_or_index(item, f.list, *i) == *e)?.1;
                f = f.ty.as_field();
            }
            _ => return None,
        }
    }
    Some(v)
}

// ---------------------------------------------------------------------------
// Managers

/// `Apply` or `Update`, as in `managedFields[].operation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operation {
    Apply,
    Update,
}

/// One entry of `metadata.managedFields`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manager {
    pub name: String,
    pub operation: Operation,
    pub api_version: String,
    /// `status`, `scale`, or empty for the main resource.
    pub subresource: String,
    /// RFC 3339, when the manager last changed the object.
    pub time: Option<String>,
    pub fields: FieldSet,
}

/// Who is writing: the identity of the manager the write is recorded under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Writer<'a> {
    pub manager: &'a str,
    pub api_version: &'a str,
    pub subresource: &'a str,
    /// Whether `status` belongs to a status subresource, so that writes to
    /// the main resource own none of it.
    pub status_subresource: bool,
    /// The time to record, RFC 3339.
    pub now: &'a str,
}

impl Manager {
    /// Where it goes in `managedFields`: Apply before Update, then oldest
    /// first.
    fn order(&self) -> (Operation, &Option<String>, &str, &str, &str) {
        (self.operation, &self.time, self.name.as_str(), self.api_version.as_str(), self.subresource.as_str())
    }

    /// Kubernetes keys managers by name, operation, subresource and, for
    /// Update managers, apiVersion.
    fn is(&self, name: &str, operation: Operation, api_version: &str, subresource: &str) -> bool {
        self.name == name
            && self.operation == operation
            && self.subresource == subresource
            && (operation == Operation::Apply || self.api_version == api_version)
    }

    /// As conflict messages print it.
    pub fn display(&self) -> String {
        let mut s = format!("{:?}", self.name);
        if !self.subresource.is_empty() {
            s.push_str(&format!(" with subresource {:?}", self.subresource));
        }
        if self.operation == Operation::Update {
            s.push_str(&format!(" using {}", self.api_version));
        }
        s
    }
}

/// Why `metadata.managedFields` could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManagedFieldsError {
    #[error("metadata.managedFields must be a list of ManagedFieldsEntry")]
    NotAList,
    #[error("metadata.managedFields[{index}]: {reason}")]
    Entry { index: usize, reason: String },
    #[error("metadata.managedFields[{index}].fieldsV1: {source}")]
    Fields {
        index: usize,
        #[source]
        source: FieldsError,
    },
}

/// The managers recorded in `obj`; `None` when it has no (or an empty)
/// `metadata.managedFields`.
pub fn decode(obj: &Value) -> Result<Option<Vec<Manager>>, ManagedFieldsError> {
    let entries = match obj.get("metadata").and_then(|m| m.get("managedFields")) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(a)) if a.is_empty() => return Ok(None),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ManagedFieldsError::NotAList),
    };
    entries.iter().enumerate().map(|(index, e)| decode_entry(index, e, true)).collect::<Result<_, _>>().map(Some)
}

/// Entry `index` of `metadata.managedFields`; its fields are left empty
/// unless `fields`.
fn decode_entry(index: usize, e: &Value, fields: bool) -> Result<Manager, ManagedFieldsError> {
    let text = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    let operation = match text("operation").as_str() {
        "Apply" => Operation::Apply,
        "Update" | "" => Operation::Update,
        other => return Err(ManagedFieldsError::Entry { index, reason: format!("unknown operation {other:?}") }),
    };
    if !matches!(text("fieldsType").as_str(), "FieldsV1" | "") {
        return Err(ManagedFieldsError::Entry { index, reason: "fieldsType must be FieldsV1".into() });
    }
    let fields = match e.get("fieldsV1") {
        Some(v) if fields && !v.is_null() => {
            FieldSet::from_fields_v1(v).map_err(|source| ManagedFieldsError::Fields { index, source })?
        }
        _ => FieldSet::new(),
    };
    Ok(Manager {
        name: text("manager"),
        operation,
        api_version: text("apiVersion"),
        subresource: text("subresource"),
        time: e.get("time").and_then(Value::as_str).map(str::to_string),
        fields,
    })
}

/// Writes `managers` into `obj`'s `metadata.managedFields`, in Kubernetes'
/// order (Apply before Update, then oldest first), dropping managers that
/// own nothing.
pub fn encode(managers: &[Manager], obj: &mut Value) {
    let mut kept: Vec<&Manager> = managers.iter().filter(|m| !m.fields.is_empty()).collect();
    kept.sort_by(|a, b| a.order().cmp(&b.order()));
    let entries: Vec<Value> = kept
        .iter()
        .map(|m| {
            entry(&m.name, m.operation, &m.api_version, m.time.as_deref(), m.fields.to_fields_v1(), &m.subresource)
        })
        .collect();
    set_entries(obj, entries);
}

/// One `ManagedFieldsEntry`.
fn entry(
    name: &str,
    operation: Operation,
    api_version: &str,
    time: Option<&str>,
    fields_v1: Value,
    subresource: &str,
) -> Value {
    let mut e = Map::new();
    e.insert("manager".into(), json!(name));
    e.insert("operation".into(), json!(if operation == Operation::Apply { "Apply" } else { "Update" }));
    e.insert("apiVersion".into(), json!(api_version));
    if let Some(t) = time {
        e.insert("time".into(), json!(t));
    }
    e.insert("fieldsType".into(), json!("FieldsV1"));
    e.insert("fieldsV1".into(), fields_v1);
    if !subresource.is_empty() {
        e.insert("subresource".into(), json!(subresource));
    }
    Value::Object(e)
}

fn set_entries(obj: &mut Value, entries: Vec<Value>) {
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else { return };
    if entries.is_empty() {
        meta.remove("managedFields");
    } else {
        meta.insert("managedFields".into(), Value::Array(entries));
    }
}

/// Records a create by `w` of `new` that supplied no managers: what
/// [`update`] from nothing and [`encode`] record (`w` owns every field of
/// `new` it can own), built straight into `FieldsV1`. A create is most
/// writes, and `update` would build a field path for every field of the
/// object, then copy the set of them three times over before encoding it.
pub fn record_create<'s>(root: impl Into<Ty<'s>>, new: &mut Value, w: &Writer) {
    let root = root.into();
    let fields = match new.as_object() {
        Some(m) if !m.is_empty() && !root.is_atomic() => created_fields(root, m, w),
        _ => {
            let managers = update(root, &Value::Null, new, Vec::new(), w);
            return encode(&managers, new);
        }
    };
    let entries = match fields {
        Some(fields) => vec![entry(w.manager, Operation::Update, w.api_version, Some(w.now), fields, w.subresource)],
        None => Vec::new(),
    };
    set_entries(new, entries);
}

/// A set of fields as a tree of `FieldsV1` elements.
#[derive(Default)]
struct FieldTree {
    member: bool,
    children: std::collections::BTreeMap<String, FieldTree>,
}

impl FieldTree {
    /// Its `FieldsV1` JSON, `None` if it holds no field.
    fn into_fields_v1(self) -> Option<Value> {
        let mut m = Map::new();
        for (e, child) in self.children {
            if let Some(v) = child.into_fields_v1() {
                m.insert(e, v);
            }
        }
        if m.is_empty() && !self.member {
            return None;
        }
        if self.member && !m.is_empty() {
            m.insert(".".into(), Value::Object(Map::new()));
        }
        Some(Value::Object(m))
    }

    /// Every field of `v` (of field type `f`), as [`collect_all`] gathers them.
    fn add_all(&mut self, v: &Value, f: Field<'_>, element: bool) {
        if element || !f.ty.is_struct() {
            self.member = true;
        }
        match (v, f.list) {
            (Value::Array(items), ListType::Set | ListType::Map(_)) => {
                for (i, item) in items.iter().enumerate() {
                    let child = self.children.entry(element_or_index(item, f.list, i).encode()).or_default();
                    if f.list == ListType::Set {
                        child.member = true;
                    } else {
                        child.add_all(item, f.ty.as_field(), true);
                    }
                }
            }
            (Value::Object(m), _) if !f.ty.is_atomic() => {
                if m.is_empty() {
                    self.member = true;
                }
                for (k, child) in m {
                    self.children.entry(format!("f:{k}")).or_default().add_all(child, f.ty.field(k), false);
                }
            }
            _ => self.member = true,
        }
    }
}

/// The `FieldsV1` of what a create of `new` by `w` owns (see [`ownable`]),
/// `None` if nothing.
fn created_fields(root: Ty<'_>, new: &Map<String, Value>, w: &Writer) -> Option<Value> {
    let mut tree = FieldTree::default();
    for (k, v) in new {
        let status = k == "status";
        let owned = match w.subresource {
            "status" => status,
            _ => !(w.status_subresource && status),
        };
        if !owned || k == "apiVersion" || k == "kind" {
            continue;
        }
        let f = root.field(k);
        let node = tree.children.entry(format!("f:{k}")).or_default();
        match v {
            Value::Object(meta) if k == "metadata" && !f.ty.is_atomic() => {
                // As `add_all`, without the server-set fields.
                if !f.ty.is_struct() || meta.is_empty() {
                    node.member = true;
                }
                for (name, child) in meta.iter().filter(|(name, _)| !SERVER_METADATA.contains(&name.as_str())) {
                    node.children.entry(format!("f:{name}")).or_default().add_all(child, f.ty.field(name), false);
                }
            }
            _ => node.add_all(v, f, false),
        }
    }
    tree.into_fields_v1()
}

/// Server-set metadata no manager owns.
const SERVER_METADATA: [&str; 8] =
    ["name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp", "managedFields", "selfLink"];

/// Whether a write by `w` can own `path`.
fn ownable(w: &Writer, path: &Path) -> bool {
    let first = |name: &str| matches!(path.0.first(), Some(PathElement::Field(f)) if f == name);
    if first("apiVersion") || first("kind") {
        return false;
    }
    if first("metadata") {
        if let Some(PathElement::Field(f)) = path.0.get(1) {
            if SERVER_METADATA.contains(&f.as_str()) {
                return false;
            }
        }
    }
    match w.subresource {
        "status" => first("status"),
        _ => !(w.status_subresource && first("status")),
    }
}

/// Records an update (create, PUT, non-apply PATCH) by `w` that turned
/// `live` (`Value::Null` for a create) into `new`. `managers` are the
/// managers before the write.
pub fn update<'s>(
    root: impl Into<Ty<'s>>,
    live: &Value,
    new: &Value,
    mut managers: Vec<Manager>,
    w: &Writer,
) -> Vec<Manager> {
    let (taken, removed) = changed_fields(root.into(), live, new, w);
    take(&mut managers, &taken, &removed, w);
    cap_update_managers(&mut managers);
    managers
}

/// The fields an update by `w` from `live` to `new` takes (added or
/// changed) and removes, of those it can own.
fn changed_fields(root: Ty<'_>, live: &Value, new: &Value, w: &Writer) -> (FieldSet, FieldSet) {
    let empty = json!({});
    let live = if live.is_null() { &empty } else { live };
    let c = compare(root, live, new);
    let keep = |p: &Path| ownable(w, p);
    let (added, modified, removed) = (c.added.filter(keep), c.modified.filter(keep), c.removed.filter(keep));
    (added.union(&modified), removed)
}

/// Gives `w` the fields it took, which every other manager loses, as
/// they lose the fields removed; drops managers left owning nothing.
fn take(managers: &mut Vec<Manager>, taken: &FieldSet, removed: &FieldSet, w: &Writer) {
    for m in managers.iter_mut() {
        m.fields = m.fields.difference(taken).difference(removed);
    }
    let existing = managers.iter().position(|m| m.is(w.manager, Operation::Update, w.api_version, w.subresource));
    if let Some(i) = existing {
        if !taken.is_empty() {
            managers[i].time = Some(w.now.to_string());
        }
        managers[i].fields = managers[i].fields.union(taken);
    } else if !taken.is_empty() {
        managers.push(Manager {
            name: w.manager.to_string(),
            operation: Operation::Update,
            api_version: w.api_version.to_string(),
            subresource: w.subresource.to_string(),
            time: Some(w.now.to_string()),
            fields: taken.clone(),
        });
    }
    managers.retain(|m| !m.fields.is_empty());
}

/// [`update`] then [`encode`] for a write whose managers are those stored
/// in `live` (validated when they were written). A manager that owns
/// nothing under the top-level fields the write changes cannot lose
/// anything to it: its `FieldsV1` is written back as stored instead of
/// being decoded into paths and encoded again (a pod's status write
/// leaves its creator's spec fields alone).
pub fn update_stored<'s>(root: impl Into<Ty<'s>>, live: &Value, new: &mut Value, w: &Writer) {
    let root = root.into();
    let entries = live.pointer("/metadata/managedFields").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
    let general = |new: &mut Value| {
        // Unreadable bookkeeping is dropped, as Kubernetes resets it.
        let managers = decode(live).ok().flatten().unwrap_or_default();
        let managers = update(root, live, new, managers, w);
        encode(&managers, new);
    };
    let Ok(identities) =
        entries.iter().enumerate().map(|(i, e)| decode_entry(i, e, false)).collect::<Result<Vec<_>, _>>()
    else {
        return general(new);
    };
    let (taken, removed) = changed_fields(root, live, new, w);
    let touched: std::collections::BTreeSet<String> = taken
        .iter()
        .chain(removed.iter())
        .filter_map(|p| match p.0.first() {
            Some(PathElement::Field(name)) => Some(format!("f:{name}")),
            _ => None,
        })
        .collect();
    let untouched = |m: &Manager, raw: Option<&Value>| match raw {
        Some(Value::Object(fields)) => {
            !fields.is_empty()
                && !m.is(w.manager, Operation::Update, w.api_version, w.subresource)
                && fields.keys().all(|k| k.starts_with("f:") && !touched.contains(k))
        }
        _ => false,
    };
    let mut kept = Vec::new();
    let mut changed = Vec::new();
    for (mut m, e) in identities.into_iter().zip(entries) {
        let raw = e.get("fieldsV1").filter(|v| !v.is_null());
        if untouched(&m, raw) {
            kept.push((m, raw.expect("untouched fields are an object")));
            continue;
        }
        match raw.map(FieldSet::from_fields_v1).transpose() {
            Ok(fields) => m.fields = fields.unwrap_or_default(),
            Err(_) => return general(new),
        }
        changed.push(m);
    }
    take(&mut changed, &taken, &removed, w);
    let updaters = kept.iter().map(|(m, _)| m).chain(&changed).filter(|m| m.operation == Operation::Update).count();
    if updaters > MAX_UPDATE_MANAGERS {
        // Merging the oldest needs everyone's fields.
        return general(new);
    }
    let mut all: Vec<(&Manager, Option<&Value>)> =
        kept.iter().map(|(m, raw)| (m, Some(*raw))).chain(changed.iter().map(|m| (m, None))).collect();
    all.sort_by(|(a, _), (b, _)| a.order().cmp(&b.order()));
    let entries = all
        .into_iter()
        .map(|(m, raw)| {
            let fields = raw.cloned().unwrap_or_else(|| m.fields.to_fields_v1());
            entry(&m.name, m.operation, &m.api_version, m.time.as_deref(), fields, &m.subresource)
        })
        .collect();
    set_entries(new, entries);
}

/// The most Update managers an object keeps, as Kubernetes keeps.
pub const MAX_UPDATE_MANAGERS: usize = 10;

/// Where the oldest Update managers' fields go once there are too many.
pub const ANCIENT_CHANGES: &str = "ancient-changes";

/// Keeps at most [`MAX_UPDATE_MANAGERS`] Update managers, as Kubernetes'
/// field manager does: oldest first, each is merged into an
/// `ancient-changes` manager of its apiVersion (the first of a version
/// becomes that manager when a second one comes), which takes the time of
/// the newest merged. Controllers that each touch an object once would
/// otherwise grow its managedFields without end.
fn cap_update_managers(managers: &mut Vec<Manager>) {
    let mut updaters: Vec<usize> =
        (0..managers.len()).filter(|&i| managers[i].operation == Operation::Update).collect();
    if updaters.len() <= MAX_UPDATE_MANAGERS {
        return;
    }
    let age = |m: &Manager| {
        (m.time.clone().unwrap_or_default(), m.name.clone(), m.api_version.clone(), m.subresource.clone())
    };
    updaters.sort_by_key(|&i| age(&managers[i]));
    let is_bucket =
        |m: &Manager, version: &str| m.name == ANCIENT_CHANGES && m.subresource.is_empty() && m.api_version == version;
    let mut first_of_version: std::collections::HashMap<String, usize> = Default::default();
    let mut merged = std::collections::BTreeSet::new();
    let mut left = updaters.len();
    for i in updaters {
        if left <= MAX_UPDATE_MANAGERS {
            break;
        }
        let version = managers[i].api_version.clone();
        let Some(&first) = first_of_version.get(&version) else {
            first_of_version.insert(version, i);
            continue;
        };
        let bucket = (0..managers.len()).find(|&b| !merged.contains(&b) && is_bucket(&managers[b], &version));
        let (into, from) = match bucket {
            // The manager at hand is the bucket itself: the older one goes in.
            Some(b) if b == i => (i, first),
            Some(b) => (b, i),
            None => {
                managers[first].name = ANCIENT_CHANGES.to_string();
                managers[first].subresource.clear();
                (first, i)
            }
        };
        managers[into].fields = managers[into].fields.union(&managers[from].fields);
        let newest = managers[into].time.clone().max(managers[from].time.clone());
        managers[into].time = newest;
        merged.insert(from);
        left -= 1;
    }
    for i in merged.into_iter().rev() {
        managers.remove(i);
    }
}

/// Server-side apply of `config` by `w` to `live` (`Value::Null` when the
/// object does not exist yet). Returns the new object (managedFields not
/// yet written: pass the managers to [`encode`]) and the new managers, or
/// the conflicts with other managers when `force` is off.
pub fn apply<'s>(
    root: impl Into<Ty<'s>>,
    live: &Value,
    config: &Value,
    mut managers: Vec<Manager>,
    w: &Writer,
    force: bool,
) -> Result<(Value, Vec<Manager>), ApplyError> {
    if !config.is_object() {
        return Err(ApplyError::NotAnObject);
    }
    let empty = json!({});
    let live = if live.is_null() { &empty } else { live };
    let keep = |p: &Path| ownable(w, p);
    let config = strip_unowned(config, w);
    let root = root.into();
    let applied = config_field_set(root, &config)?.filter(keep);
    let mut merged = merge(root, live, &config);

    let c = compare(root, live, &merged);
    let changed = c.added.union(&c.modified).filter(keep);
    let me = |m: &Manager| m.is(w.manager, Operation::Apply, w.api_version, w.subresource);
    let mut conflicts = Vec::new();
    for m in managers.iter().filter(|m| !me(m)) {
        for p in m.fields.intersection(&changed).iter() {
            conflicts.push(Conflict { manager: m.display(), path: p.clone() });
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(ApplyError::Conflicts(conflicts));
    }
    for m in managers.iter_mut().filter(|m| !me(m)) {
        m.fields = m.fields.difference(&changed);
    }

    let previous = managers.iter().position(&me);
    let last = previous.map(|i| managers[i].fields.clone()).unwrap_or_default();
    let time = previous.and_then(|i| managers[i].time.clone());
    managers.retain(|m| !me(m));
    managers.push(Manager {
        name: w.manager.to_string(),
        operation: Operation::Apply,
        api_version: w.api_version.to_string(),
        subresource: w.subresource.to_string(),
        time,
        fields: applied,
    });

    // Fields applied last time and not now go, unless someone owns them.
    let owned = managers.iter().fold(FieldSet::new(), |acc, m| acc.union(&m.fields));
    let held = |p: &Path| owned.contains(p) || owned.has_descendant(p);
    for p in last.iter() {
        if held(p) || !remove_path(root, &mut merged, p) {
            continue;
        }
        // A map or list left empty by the removal goes too.
        let mut parent = Path(p.0[..p.len() - 1].to_vec());
        while !parent.is_empty() && !held(&parent) {
            let empty = match value_at(root, &merged, &parent) {
                Some(Value::Object(m)) => m.is_empty(),
                Some(Value::Array(a)) => a.is_empty(),
                _ => false,
            };
            if !empty || !remove_path(root, &mut merged, &parent) {
                break;
            }
            parent = Path(parent.0[..parent.len() - 1].to_vec());
        }
    }

    if !same(&merged, live) {
        if let Some(m) = managers.iter_mut().find(|m| me(m)) {
            m.time = Some(w.now.to_string());
        }
    } else if let Some(m) = managers.iter_mut().find(|m| me(m) && m.time.is_none()) {
        m.time = Some(w.now.to_string());
    }
    managers.retain(|m| !m.fields.is_empty());
    cap_update_managers(&mut managers);
    Ok((merged, managers))
}

/// The configuration without what the writer cannot set: server-set
/// metadata, and `status` or everything but `status` per subresource.
fn strip_unowned(config: &Value, w: &Writer) -> Value {
    let mut c = config.clone();
    let Some(m) = c.as_object_mut() else { return c };
    m.retain(|k, _| ownable(w, &Path::fields(&[k])) || k == "metadata" || k == "apiVersion" || k == "kind");
    if let Some(meta) = m.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.retain(|k, v| !v.is_null() && !SERVER_METADATA[2..].contains(&k.as_str()));
    }
    drop_nulls(&mut c);
    c
}

/// Nulls in an applied configuration specify nothing.
fn drop_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, v| !v.is_null());
            m.values_mut().for_each(drop_nulls);
        }
        Value::Array(a) => a.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

#[cfg(test)]
mod tests;
