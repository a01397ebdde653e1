//! Applying patches to objects: Kubernetes strategic merge patch
//! (`application/strategic-merge-patch+json`, what `kubectl apply`, `kubectl
//! patch` and `kubectl set image` send) and RFC 7386 JSON merge patch
//! (`application/merge-patch+json`), so the registry has one place for all
//! patch kinds. Pure functions on JSON; no I/O.
//!
//! # Strategic merge patch
//!
//! The semantics are those of `k8s.io/apimachinery/pkg/util/strategicpatch`
//! as the apiserver runs it (parallel deletion lists merged, unmatched nulls
//! ignored):
//!
//! - Maps merge key by key; `"field": null` deletes the field.
//! - A list merges only when its field has `patchStrategy: merge` in the Go
//!   types; every other list (`args`, `command`, `tolerations`, `envFrom`, …)
//!   is replaced whole. Lists of maps merge element by element on their
//!   `patchMergeKey` (containers by `name`, ports by `containerPort`, …);
//!   lists of scalars (`finalizers`) become the union of both lists.
//! - Merged lists are ordered as upstream orders them: the patch's elements in
//!   the patch's order, interleaved with the elements only the object has in
//!   their old order. An element new to the list comes before the first old
//!   element that the patch also names, so a patch adding one element without
//!   `$setElementOrder` puts it first, as the Kubernetes apiserver does.
//!
//! Directives:
//!
//! - `$patch: replace` on a map replaces the map with the rest of the patch;
//!   as an element of a keyed list (`[{"$patch": "replace"}, …]`) it replaces
//!   the list with the other elements.
//! - `$patch: delete` in an element of a keyed list deletes the element with
//!   that merge key; on a map it deletes the map.
//! - `$patch: merge` is the default and changes nothing.
//! - `$setElementOrder/<list>` orders the merged list: the listed elements in
//!   the given order; each element it does not list (kept from the object)
//!   goes, as upstream puts it, before the first listed element that came
//!   after it in the object, else at the end.
//! - `$retainKeys: [...]` on a map drops every key not listed, after merging
//!   (kubectl sends it for `volumes`, a Deployment's `strategy` and a
//!   DaemonSet's `updateStrategy`; like upstream it is honoured on any map).
//! - `$deleteFromPrimitiveList/<list>: [...]` removes those values from a list
//!   of scalars.
//!
//! Any other key starting with `$` is an error, as is a `$patch` value other
//! than the three above.
//!
//! Where upstream would copy directives into the stored object (a value the
//! object did not have is taken from the patch as is), this module merges the
//! value into an empty one instead, so directives are always applied and
//! removed and nulls dropped: the stored JSON never holds a `$patch` key.
//!
//! Which lists merge, and on which key, comes from the kind's schema, the one
//! `/openapi/v3` serves: its `x-kubernetes-patch-strategy` and
//! `x-kubernetes-patch-merge-key` markers, read through
//! [`crate::structure`]. A container's `env` is therefore found wherever a
//! container is: `spec.containers` of a Pod,
//! `spec.template.spec.initContainers` of a Deployment,
//! `spec.jobTemplate.spec.template.spec.ephemeralContainers` of a CronJob.
//! Fields the schema does not know are plain maps and atomic lists.

use std::collections::HashSet;

use serde_json::{Map, Value};

use crate::resources::Kind;
use crate::structure::{self, Strategy};

/// The built-in kinds' types; strategic merge is not for custom resources.
type Ty = structure::Ty<'static>;
type Field = structure::Field<'static>;

/// Why a strategic merge patch could not be applied. Every variant is the
/// client's fault (a 400/422 for the apiserver); `path` names the field in
/// the patched object, `containers[name=nginx].env` style.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    #[error("a strategic merge patch must be a JSON object")]
    PatchNotAnObject,
    #[error("the object to patch is not a JSON object")]
    OriginalNotAnObject,
    #[error("{path}: invalid patch directive \"$patch\": {value} (expected \"replace\", \"delete\" or \"merge\")")]
    InvalidDirective { path: String, value: String },
    #[error("{path}: unknown patch directive {key:?}")]
    UnknownDirective { path: String, key: String },
    #[error("{path}: list element {element} does not contain its merge key {key:?}")]
    MissingMergeKey { path: String, key: String, element: String },
    #[error("{path}: the value of {directive:?} must be a list")]
    DirectiveNotAList { path: String, directive: String },
    #[error("{path}: \"$retainKeys\" must be a list of field names")]
    InvalidRetainKeys { path: String },
    #[error("{path}: field {field:?} is in the patch but not in \"$retainKeys\"")]
    NotInRetainKeys { path: String, field: String },
    #[error("{path}: the order of the elements in the patch does not match \"$setElementOrder/{list}\"")]
    ElementOrderMismatch { path: String, list: String },
    #[error("{path}: {reason}")]
    InvalidList { path: String, reason: &'static str },
    #[error("{path}: the patch is nested too deeply")]
    TooDeep { path: String },
}

/// Applies an RFC 7386 JSON merge patch: objects merge, `null` deletes, every
/// other value (lists included) replaces. Never fails; a patch that is not an
/// object replaces the whole document, as the RFC says.
pub fn json_merge(original: &Value, patch: &Value) -> Value {
    let mut doc = original.clone();
    json_patch::merge(&mut doc, patch);
    doc
}

/// Applies a strategic merge patch to an object of `kind` (see the module
/// documentation). `original` must be a JSON object (or `null`, taken as an
/// empty object) and so must `patch`. Neither is modified.
pub fn strategic_merge(kind: Kind, original: &Value, patch: &Value) -> Result<Value, PatchError> {
    let patch = patch.as_object().ok_or(PatchError::PatchNotAnObject)?;
    let original = match original {
        Value::Object(m) => m.clone(),
        Value::Null => Map::new(),
        _ => return Err(PatchError::OriginalNotAnObject),
    };
    // `$patch: delete` at the root cannot delete the object: it empties it.
    let merged = merge_map(original, patch, Ty::from(kind), "", 0)?.unwrap_or_default();
    Ok(Value::Object(merged))
}

// ---------------------------------------------------------------------------
// Merging

const PATCH: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList/";

/// Deeper than any object Kubernetes stores (and than serde_json parses by
/// default); a limit so that no input can exhaust the stack.
const MAX_DEPTH: usize = 200;

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// The path for messages; the root is named.
fn at(path: &str) -> String {
    if path.is_empty() {
        "the object".to_string()
    } else {
        path.to_string()
    }
}

/// Compact JSON, cut short for error messages.
fn excerpt(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 120 {
        let mut cut: String = s.chars().take(117).collect();
        cut.push_str("...");
        cut
    } else {
        s
    }
}

/// `name=nginx` for a list element's path.
fn element_path(path: &str, key: &str, value: &Value) -> String {
    match value {
        Value::String(s) => format!("{path}[{key}={s}]"),
        other => format!("{path}[{key}={other}]"),
    }
}

/// Equality of merge-key values and scalars, as Go compares decoded JSON:
/// numbers by value whatever their representation.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

fn directive_error(path: &str, value: &Value) -> PatchError {
    PatchError::InvalidDirective { path: at(path), value: excerpt(value) }
}

/// Merges `patch` into `original`, a map of type `ty`. `None` means the patch
/// deletes the map (`$patch: delete`).
fn merge_map(
    mut original: Map<String, Value>,
    patch: &Map<String, Value>,
    ty: Ty,
    path: &str,
    depth: usize,
) -> Result<Option<Map<String, Value>>, PatchError> {
    if depth > MAX_DEPTH {
        return Err(PatchError::TooDeep { path: at(path) });
    }
    if let Some(directive) = patch.get(PATCH) {
        match directive.as_str() {
            Some("replace") => original = Map::new(),
            Some("delete") => return Ok(None),
            Some("merge") => {}
            _ => return Err(directive_error(path, directive)),
        }
    }

    if let Some(retain) = patch.get(RETAIN_KEYS) {
        let keys = retain
            .as_array()
            .and_then(|keys| keys.iter().map(Value::as_str).collect::<Option<HashSet<&str>>>())
            .ok_or_else(|| PatchError::InvalidRetainKeys { path: at(path) })?;
        if let Some((k, _)) =
            patch.iter().find(|(k, v)| !k.starts_with('$') && !v.is_null() && !keys.contains(k.as_str()))
        {
            return Err(PatchError::NotInRetainKeys { path: at(path), field: k.clone() });
        }
        original.retain(|k, _| keys.contains(k.as_str()));
    }

    // Lists with a `$setElementOrder` are merged and ordered first.
    let mut ordered: HashSet<&str> = HashSet::new();
    for (key, order) in patch {
        let Some(name) = key.strip_prefix(SET_ELEMENT_ORDER) else { continue };
        if set_element_order(&mut original, patch, ty, name, order, path, depth)? {
            ordered.insert(name);
        }
    }

    for (key, value) in patch {
        if key.starts_with('$') {
            if key == PATCH
                || key == RETAIN_KEYS
                || key.starts_with(SET_ELEMENT_ORDER)
                || key.starts_with(DELETE_FROM_PRIMITIVE_LIST)
            {
                continue;
            }
            return Err(PatchError::UnknownDirective { path: at(path), key: key.clone() });
        }
        if ordered.contains(key.as_str()) {
            continue;
        }
        if value.is_null() {
            original.remove(key);
            continue;
        }
        let field = ty.field(key);
        let child = join(path, key);
        let merged = match (original.remove(key), value) {
            (Some(Value::Object(o)), Value::Object(p)) => {
                merge_map(o, p, field.ty, &child, depth + 1)?.map(Value::Object)
            }
            (Some(Value::Array(o)), Value::Array(p)) => Some(Value::Array(merge_list(o, p, field, &child, depth + 1)?)),
            _ => fresh(value, field, &child, depth + 1)?,
        };
        if let Some(merged) = merged {
            original.insert(key.clone(), merged);
        }
    }

    // Deletions from lists of scalars come last, after any additions.
    for (key, value) in patch {
        let Some(name) = key.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) else { continue };
        let doomed =
            value.as_array().ok_or_else(|| PatchError::DirectiveNotAList { path: at(path), directive: key.clone() })?;
        if let Some(Value::Array(items)) = original.get_mut(name) {
            items.retain(|item| !doomed.iter().any(|d| same(d, item)));
        }
    }
    Ok(Some(original))
}

/// A patch value for a field the object does not have (or has with another
/// JSON type): the value merged into an empty one, so its directives are
/// applied and its nulls dropped. `None` if it deletes itself.
fn fresh(value: &Value, field: Field, path: &str, depth: usize) -> Result<Option<Value>, PatchError> {
    if depth > MAX_DEPTH {
        return Err(PatchError::TooDeep { path: at(path) });
    }
    Ok(match value {
        Value::Object(p) => merge_map(Map::new(), p, field.ty, path, depth)?.map(Value::Object),
        Value::Array(p) => Some(Value::Array(merge_list(Vec::new(), p, field, path, depth)?)),
        other => Some(other.clone()),
    })
}

/// What a merging list holds.
enum Elements {
    Empty,
    Maps,
    Scalars,
}

fn elements(path: &str, lists: &[&[Value]]) -> Result<Elements, PatchError> {
    let (mut maps, mut scalars) = (false, false);
    for v in lists.iter().flat_map(|l| l.iter()) {
        match v {
            Value::Object(_) => maps = true,
            Value::Array(_) => {
                return Err(PatchError::InvalidList { path: at(path), reason: "lists of lists cannot be merged" })
            }
            _ => scalars = true,
        }
    }
    match (maps, scalars) {
        (false, false) => Ok(Elements::Empty),
        (true, false) => Ok(Elements::Maps),
        (false, true) => Ok(Elements::Scalars),
        (true, true) => Err(PatchError::InvalidList {
            path: at(path),
            reason: "the elements of a merging list must be all objects or all scalars",
        }),
    }
}

/// Merges the list `patch` into `original`, a list field.
fn merge_list(
    original: Vec<Value>,
    patch: &[Value],
    field: Field,
    path: &str,
    depth: usize,
) -> Result<Vec<Value>, PatchError> {
    if depth > MAX_DEPTH {
        return Err(PatchError::TooDeep { path: at(path) });
    }
    let key = match field.strategy {
        Strategy::Replace => return replace_list(patch, field.ty, path, depth),
        Strategy::MergeScalars => None,
        Strategy::MergeByKey(key) => Some(key),
    };
    match elements(path, &[&original, patch])? {
        Elements::Empty => Ok(original),
        Elements::Scalars => Ok(merge_scalars(original, patch)),
        Elements::Maps => match key {
            Some(key) => merge_keyed(original, patch, key, field.ty, path, depth),
            None => Err(PatchError::InvalidList { path: at(path), reason: "a list of scalars cannot hold objects" }),
        },
    }
}

/// An atomic list: the patch's, each element cleaned of directives and nulls.
fn replace_list(patch: &[Value], ty: Ty, path: &str, depth: usize) -> Result<Vec<Value>, PatchError> {
    let mut out = Vec::with_capacity(patch.len());
    for (i, v) in patch.iter().enumerate() {
        let element = match v {
            Value::Object(_) | Value::Array(_) => fresh(v, ty.as_field(), &format!("{path}[{i}]"), depth + 1)?,
            other => Some(other.clone()),
        };
        out.extend(element);
    }
    Ok(out)
}

/// Removes duplicates, keeping first occurrences.
fn dedup(items: impl IntoIterator<Item = Value>) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for v in items {
        if !out.iter().any(|o| same(o, &v)) {
            out.push(v);
        }
    }
    out
}

/// The union of two lists of scalars.
fn merge_scalars(original: Vec<Value>, patch: &[Value]) -> Vec<Value> {
    let order = dedup(original);
    let from_patch = dedup(patch.iter().cloned());
    let server_only: Vec<Value> = order.iter().filter(|v| !from_patch.iter().any(|p| same(p, v))).cloned().collect();
    interleave(server_only, from_patch, |v| order.iter().position(|o| same(o, v)))
}

/// The merge key's value in a list element, if it is a map that has one.
fn key_of<'a>(element: &'a Value, key: &str) -> Option<&'a Value> {
    element.as_object()?.get(key)
}

fn missing_key(path: &str, key: &str, element: &Value) -> PatchError {
    PatchError::MissingMergeKey { path: at(path), key: key.to_string(), element: excerpt(element) }
}

/// Merges two lists of maps on `key`.
fn merge_keyed(
    mut original: Vec<Value>,
    patch: &[Value],
    key: &str,
    ty: Ty,
    path: &str,
    depth: usize,
) -> Result<Vec<Value>, PatchError> {
    // Special elements first: deletions and a whole-list replace.
    let mut plain: Vec<&Map<String, Value>> = Vec::with_capacity(patch.len());
    let mut replace = false;
    for v in patch {
        let Value::Object(element) = v else { continue };
        let Some(directive) = element.get(PATCH) else {
            plain.push(element);
            continue;
        };
        match directive.as_str() {
            Some("delete") => {
                let doomed = element.get(key).ok_or_else(|| missing_key(path, key, v))?;
                original.retain(|o| !key_of(o, key).is_some_and(|k| same(k, doomed)));
            }
            Some("replace") => replace = true,
            Some("merge") => {}
            _ => return Err(directive_error(path, directive)),
        }
    }
    let mut patch_keys: Vec<&Value> = Vec::with_capacity(plain.len());
    for element in &plain {
        let k = element.get(key).ok_or_else(|| missing_key(path, key, &Value::Object((*element).clone())))?;
        patch_keys.push(k);
    }
    if replace {
        original.clear();
    }

    // The object's order, for placing the elements the patch does not name.
    let server_order: Vec<Option<Value>> = original.iter().map(|o| key_of(o, key).cloned()).collect();
    for (element, k) in plain.iter().zip(&patch_keys) {
        let child = element_path(path, key, k);
        let found = original.iter().position(|o| key_of(o, key).is_some_and(|ok| same(ok, k)));
        match found {
            Some(i) => {
                let Some(Value::Object(o)) = original.get_mut(i).map(Value::take) else { continue };
                match merge_map(o, element, ty, &child, depth + 1)? {
                    Some(m) => original[i] = Value::Object(m),
                    None => {
                        original.remove(i);
                    }
                }
            }
            None => {
                if let Some(m) = merge_map(Map::new(), element, ty, &child, depth + 1)? {
                    original.push(Value::Object(m));
                }
            }
        }
    }

    // Patch elements in the patch's order, interleaved with the others.
    let (mut named, server_only): (Vec<Value>, Vec<Value>) =
        original.into_iter().partition(|o| key_of(o, key).is_some_and(|k| patch_keys.iter().any(|p| same(p, k))));
    let patch_index = |v: &Value| key_of(v, key).and_then(|k| patch_keys.iter().position(|p| same(p, k)));
    named.sort_by_key(|v| patch_index(v).unwrap_or(usize::MAX));
    Ok(interleave(server_only, named, |v| {
        let k = key_of(v, key)?;
        server_order.iter().position(|s| s.as_ref().is_some_and(|s| same(s, k)))
    }))
}

/// Upstream's `mergeSortedSlice`: merges the object-only elements (`left`, in
/// the object's order) into the patch's (`right`, in the patch's order),
/// taking a left element first only if both it and the next right element
/// were in the object and it came first there.
fn interleave(left: Vec<Value>, right: Vec<Value>, server_index: impl Fn(&Value) -> Option<usize>) -> Vec<Value> {
    let mut out = Vec::with_capacity(left.len() + right.len());
    let mut left = left.into_iter().peekable();
    let mut right = right.into_iter().peekable();
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => matches!((server_index(l), server_index(r)), (Some(a), Some(b)) if a < b),
        };
        out.extend(if take_left { left.next() } else { right.next() });
    }
    out
}

/// Handles `$setElementOrder/<name>`: merges the list `name` and orders it.
/// Returns whether the list was handled (and is to be skipped afterwards).
fn set_element_order(
    original: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    ty: Ty,
    name: &str,
    order: &Value,
    path: &str,
    depth: usize,
) -> Result<bool, PatchError> {
    let directive = format!("{SET_ELEMENT_ORDER}{name}");
    let order = order.as_array().ok_or_else(|| PatchError::DirectiveNotAList { path: at(path), directive })?;
    let field = ty.field(name);
    let key = match field.strategy {
        // An atomic list is the patch's, in the patch's order.
        Strategy::Replace => return Ok(false),
        Strategy::MergeScalars => None,
        Strategy::MergeByKey(key) => Some(key),
    };
    let child = join(path, name);
    let patch_list = match patch.get(name) {
        None => None,
        Some(Value::Array(list)) => Some(list),
        // `null` or another value: handled as a plain field.
        Some(_) => return Ok(false),
    };
    if let Some(key) = key {
        if let Some(missing) = order.iter().find(|o| key_of(o, key).is_none()) {
            return Err(missing_key(&child, key, missing));
        }
    }
    if let Some(list) = patch_list {
        check_order(list, order, key, &child, name)?;
    }
    let original_list = match original.get(name) {
        Some(Value::Array(list)) => Some(list.clone()),
        _ => None,
    };
    let merged = match (&original_list, patch_list) {
        (None, None) => return Ok(false),
        (Some(o), None) => o.clone(),
        (o, Some(p)) => merge_list(o.clone().unwrap_or_default(), p, field, &child, depth + 1)?,
    };
    let server_order = original_list.unwrap_or_default();

    // The identity of an element for ordering: its merge key, or itself.
    let ident = |v: &Value| -> Option<Value> {
        match key {
            Some(key) => key_of(v, key).cloned(),
            None => Some(v.clone()),
        }
    };
    let index_in = |list: &[Value], v: &Value| -> Option<usize> {
        let id = ident(v)?;
        list.iter().position(|o| ident(o).is_some_and(|oid| same(&oid, &id)))
    };
    let (mut listed, mut server_only): (Vec<Value>, Vec<Value>) =
        merged.into_iter().partition(|v| index_in(order, v).is_some());
    listed.sort_by_key(|v| index_in(order, v).unwrap_or(usize::MAX));
    server_only.sort_by_key(|v| index_in(&server_order, v).unwrap_or(usize::MAX));
    let result = interleave(server_only, listed, |v| index_in(&server_order, v));
    original.insert(name.to_string(), Value::Array(result));
    Ok(true)
}

/// Upstream's check that the patch list names its elements in the same
/// relative order as `$setElementOrder`, and names no other (deletions and
/// other directive elements aside).
fn check_order(list: &[Value], order: &[Value], key: Option<&str>, path: &str, name: &str) -> Result<(), PatchError> {
    let mut wanted = order.iter();
    for item in list {
        let id = match key {
            Some(key) => {
                if item.as_object().is_some_and(|m| m.contains_key(PATCH)) {
                    continue;
                }
                key_of(item, key).ok_or_else(|| missing_key(path, key, item))?
            }
            None => item,
        };
        let found = wanted.any(|o| match key {
            Some(key) => key_of(o, key).is_some_and(|ok| same(ok, id)),
            None => same(o, id),
        });
        if !found {
            return Err(PatchError::ElementOrderMismatch { path: at(path), list: name.to_string() });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::strategy::Strategy;
    use serde_json::json;

    fn smp(kind: Kind, original: Value, patch: Value) -> Value {
        strategic_merge(kind, &original, &patch).unwrap_or_else(|e| panic!("patch failed: {e}"))
    }

    fn deployment(containers: Value) -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"replicas": 1, "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": containers}}}
        })
    }

    fn containers_of(v: &Value) -> &Value {
        &v["spec"]["template"]["spec"]["containers"]
    }

    #[test]
    fn the_second_apply_example_removes_an_env_var_and_the_ports() {
        let original = deployment(json!([{
            "name": "nginx",
            "image": "nginx:1.27",
            "env": [{"name": "MODE", "value": "prod"}, {"name": "KEEP", "value": "yes"}],
            "ports": [{"containerPort": 80}]
        }]));
        let patch = json!({"spec":{"template":{"spec":{
            "$setElementOrder/containers":[{"name":"nginx"}],
            "containers":[{"$setElementOrder/env":[{"name":"MODE"}],"env":[{"$patch":"delete","name":"KEEP"}],"name":"nginx","ports":null}]
        }}}});
        let out = smp(Kind::Deployment, original, patch);
        assert_eq!(
            containers_of(&out),
            &json!([{"name": "nginx", "image": "nginx:1.27", "env": [{"name": "MODE", "value": "prod"}]}])
        );
        assert_eq!(out["spec"]["replicas"], 1);
        assert_eq!(out["spec"]["template"]["metadata"]["labels"]["app"], "web");
    }

    #[test]
    fn retain_keys_drops_rolling_update_when_the_strategy_becomes_recreate() {
        let mut original = deployment(json!([{"name": "a", "image": "a"}]));
        original["spec"]["strategy"] = json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}});
        let patch = json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}});
        let out = smp(Kind::Deployment, original, patch);
        assert_eq!(out["spec"]["strategy"], json!({"type": "Recreate"}));
    }

    #[test]
    fn retain_keys_rejects_a_patched_field_it_does_not_list() {
        let patch = json!({"spec": {"strategy": {"$retainKeys": ["type"], "rollingUpdate": {}}}});
        let err = strategic_merge(Kind::Deployment, &deployment(json!([])), &patch).unwrap_err();
        assert!(matches!(err, PatchError::NotInRetainKeys { ref field, .. } if field == "rollingUpdate"), "{err}");
    }

    #[test]
    fn finalizers_merge_as_a_union_without_duplicates() {
        let original = json!({"metadata": {"name": "x", "finalizers": ["a", "b"]}});
        let out = smp(Kind::Pod, original, json!({"metadata": {"finalizers": ["b", "c"]}}));
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b", "c"]));
    }

    #[test]
    fn a_new_finalizer_comes_first_as_upstream_orders_it_unless_an_order_is_given() {
        let original = json!({"metadata": {"finalizers": ["a"]}});
        let out = smp(Kind::Pod, original.clone(), json!({"metadata": {"finalizers": ["c"]}}));
        assert_eq!(out["metadata"]["finalizers"], json!(["c", "a"]));
        let patch = json!({"metadata": {"$setElementOrder/finalizers": ["a", "c"], "finalizers": ["c"]}});
        let out = smp(Kind::Pod, original, patch);
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "c"]));
    }

    #[test]
    fn delete_from_primitive_list_removes_only_the_named_values() {
        let original = json!({"metadata": {"finalizers": ["a", "b", "c"]}});
        let patch = json!({"metadata": {"$setElementOrder/finalizers": ["a", "c"], "$deleteFromPrimitiveList/finalizers": ["b"]}});
        let out = smp(Kind::Namespace, original, patch);
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "c"]));
    }

    #[test]
    fn keyed_list_elements_are_added_updated_and_deleted_by_merge_key() {
        let original = deployment(json!([
            {"name": "a", "image": "a:1"},
            {"name": "b", "image": "b:1", "args": ["x"]}
        ]));
        let patch = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "b", "image": "b:2"},
            {"name": "c", "image": "c:1"},
            {"$patch": "delete", "name": "a"}
        ]}}}});
        let out = smp(Kind::Deployment, original, patch);
        assert_eq!(
            containers_of(&out),
            &json!([{"name": "b", "image": "b:2", "args": ["x"]}, {"name": "c", "image": "c:1"}])
        );
    }

    #[test]
    fn set_element_order_puts_a_new_container_where_the_manifest_has_it() {
        let original = deployment(json!([{"name": "a"}, {"name": "b"}]));
        let unordered = json!({"spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}});
        let out = smp(Kind::Deployment, original.clone(), unordered);
        assert_eq!(containers_of(&out), &json!([{"name": "c"}, {"name": "a"}, {"name": "b"}]));
        let ordered = json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "a"}, {"name": "c"}, {"name": "b"}],
            "containers": [{"name": "c"}]
        }}}});
        let out = smp(Kind::Deployment, original, ordered);
        assert_eq!(containers_of(&out), &json!([{"name": "a"}, {"name": "c"}, {"name": "b"}]));
    }

    #[test]
    fn set_element_order_alone_reorders_the_list() {
        let original = deployment(json!([{"name": "a"}, {"name": "b"}, {"name": "c"}]));
        let patch =
            json!({"spec": {"template": {"spec": {"$setElementOrder/containers": [{"name": "c"}, {"name": "a"}]}}}});
        let out = smp(Kind::Deployment, original, patch);
        // `b` is not listed: it goes before `c`, which came after it in the object.
        assert_eq!(containers_of(&out), &json!([{"name": "b"}, {"name": "c"}, {"name": "a"}]));
    }

    #[test]
    fn a_patch_list_out_of_step_with_set_element_order_is_rejected() {
        let patch = json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
            "containers": [{"name": "b"}, {"name": "a"}]
        }}}});
        let err = strategic_merge(Kind::Deployment, &deployment(json!([])), &patch).unwrap_err();
        assert!(matches!(err, PatchError::ElementOrderMismatch { .. }), "{err}");
    }

    #[test]
    fn lists_without_a_merge_strategy_are_replaced_whole() {
        let mut original = deployment(
            json!([{"name": "a", "args": ["--x", "--y"], "command": ["run"], "envFrom": [{"prefix": "A"}]}]),
        );
        original["spec"]["template"]["spec"]["tolerations"] = json!([{"key": "k1", "operator": "Exists"}]);
        let patch = json!({"spec": {"template": {"spec": {
            "tolerations": [{"key": "k2", "operator": "Exists"}],
            "containers": [{"name": "a", "args": ["--z"]}]
        }}}});
        let out = smp(Kind::Deployment, original, patch);
        assert_eq!(out["spec"]["template"]["spec"]["tolerations"], json!([{"key": "k2", "operator": "Exists"}]));
        assert_eq!(
            containers_of(&out),
            &json!([{"name": "a", "args": ["--z"], "command": ["run"], "envFrom": [{"prefix": "A"}]}])
        );
    }

    #[test]
    fn patch_replace_on_a_map_replaces_it_wholly() {
        let original = deployment(json!([{"name": "a"}]));
        let patch = json!({"spec": {"template": {"metadata": {"labels": {"$patch": "replace", "tier": "front", "gone": null}}}}});
        let out = smp(Kind::Deployment, original, patch);
        assert_eq!(out["spec"]["template"]["metadata"]["labels"], json!({"tier": "front"}));
    }

    #[test]
    fn patch_replace_in_a_keyed_list_replaces_the_list() {
        let original = deployment(json!([{"name": "a", "image": "a"}, {"name": "b", "image": "b"}]));
        let patch = json!({"spec": {"template": {"spec": {"containers": [{"$patch": "replace"}, {"name": "z", "image": "z"}]}}}});
        let out = smp(Kind::Deployment, original, patch);
        assert_eq!(containers_of(&out), &json!([{"name": "z", "image": "z"}]));
    }

    #[test]
    fn patch_delete_on_a_map_deletes_it_and_merge_is_the_default() {
        let mut original = deployment(json!([]));
        original["spec"]["strategy"] = json!({"type": "Recreate"});
        let patch = json!({"spec": {"strategy": {"$patch": "delete"}, "selector": {"$patch": "merge", "matchLabels": {"a": "b"}}}});
        let out = smp(Kind::Deployment, original, patch);
        assert!(out["spec"].get("strategy").is_none());
        assert_eq!(out["spec"]["selector"], json!({"matchLabels": {"a": "b"}}));
    }

    #[test]
    fn null_deletes_a_field_and_is_ignored_where_there_is_none() {
        let original = json!({"spec": {"paused": true, "replicas": 2}});
        let out = smp(Kind::Deployment, original, json!({"spec": {"paused": null, "minReadySeconds": null}}));
        assert_eq!(out, json!({"spec": {"replicas": 2}}));
    }

    #[test]
    fn service_ports_merge_by_port() {
        let original =
            json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}, {"port": 443, "targetPort": 8443}]}});
        let patch = json!({"spec": {"ports": [{"port": 443, "targetPort": 9443}]}});
        let out = smp(Kind::Service, original, patch);
        assert_eq!(out["spec"]["ports"], json!([{"port": 80, "targetPort": 8080}, {"port": 443, "targetPort": 9443}]));
    }

    #[test]
    fn status_conditions_merge_by_type() {
        let original = json!({"status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "False"}
        ]}});
        let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let out = smp(Kind::Pod, original.clone(), patch.clone());
        assert_eq!(
            out["status"]["conditions"],
            json!([{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}])
        );
        for kind in [
            Kind::Node,
            Kind::Deployment,
            Kind::ReplicaSet,
            Kind::ReplicationController,
            Kind::DaemonSet,
            Kind::Job,
            Kind::Namespace,
        ] {
            assert_eq!(smp(kind, original.clone(), patch.clone()), out, "{kind:?}");
        }
        // Kinds without merged conditions replace the list.
        let replaced = smp(Kind::ConfigMap, original, patch);
        assert_eq!(replaced["status"]["conditions"], json!([{"type": "Ready", "status": "True"}]));
    }

    #[test]
    fn the_other_merge_keys_are_honoured() {
        let owner = |uid: &str, name: &str| json!({"uid": uid, "name": name, "kind": "ReplicaSet"});
        let original = json!({
            "metadata": {"ownerReferences": [owner("u1", "a")]},
            "status": {"podIPs": [{"ip": "10.0.0.1"}]}
        });
        let patch = json!({
            "metadata": {"ownerReferences": [owner("u1", "renamed"), owner("u2", "b")]},
            "status": {"podIPs": [{"ip": "10.0.0.2"}]}
        });
        let out = smp(Kind::Pod, original, patch);
        assert_eq!(out["metadata"]["ownerReferences"], json!([owner("u1", "renamed"), owner("u2", "b")]));
        assert_eq!(out["status"]["podIPs"], json!([{"ip": "10.0.0.2"}, {"ip": "10.0.0.1"}]));

        let node = json!({"status": {"addresses": [{"type": "InternalIP", "address": "1.1.1.1"}, {"type": "Hostname", "address": "n"}]}});
        let out =
            smp(Kind::Node, node, json!({"status": {"addresses": [{"type": "InternalIP", "address": "2.2.2.2"}]}}));
        assert_eq!(
            out["status"]["addresses"],
            json!([{"type": "InternalIP", "address": "2.2.2.2"}, {"type": "Hostname", "address": "n"}])
        );

        let sa = json!({"secrets": [{"name": "s1"}]});
        let out = smp(Kind::ServiceAccount, sa, json!({"secrets": [{"name": "s1"}, {"name": "s2"}]}));
        assert_eq!(out["secrets"], json!([{"name": "s1"}, {"name": "s2"}]));
    }

    #[test]
    fn container_fields_merge_in_init_containers_pods_and_cron_job_templates() {
        let container = json!({"name": "c", "env": [{"name": "A", "value": "1"}], "volumeMounts": [{"mountPath": "/a", "name": "v"}]});
        let patch_container = json!({"name": "c", "env": [{"name": "A", "value": "2"}], "volumeMounts": [{"mountPath": "/a", "readOnly": true}]});
        let merged = json!({"name": "c", "env": [{"name": "A", "value": "2"}], "volumeMounts": [{"mountPath": "/a", "name": "v", "readOnly": true}]});

        let pod = json!({"spec": {"initContainers": [container.clone()]}});
        let out = smp(Kind::Pod, pod, json!({"spec": {"initContainers": [patch_container.clone()]}}));
        assert_eq!(out["spec"]["initContainers"], json!([merged.clone()]));

        let cron = json!({"spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": [container]}}}}}});
        let patch =
            json!({"spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": [patch_container]}}}}}});
        let out = smp(Kind::CronJob, cron, patch);
        assert_eq!(out["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"], json!([merged]));
    }

    #[test]
    fn the_schema_finds_merge_keys_by_path_from_the_root() {
        fn resolve(kind: Kind, path: &[&str]) -> Field {
            let mut f = Ty::from(kind).as_field();
            for name in path {
                f = f.ty.field(name);
            }
            f
        }
        let env = ["spec", "template", "spec", "ephemeralContainers", "env"];
        assert_eq!(resolve(Kind::DaemonSet, &env).strategy, structure::Strategy::MergeByKey("name"));
        assert_eq!(
            resolve(Kind::Pod, &["spec", "containers", "ports"]).strategy,
            structure::Strategy::MergeByKey("containerPort")
        );
        assert_eq!(resolve(Kind::Service, &["spec", "ports"]).strategy, structure::Strategy::MergeByKey("port"));
        assert_eq!(resolve(Kind::Pod, &["spec", "volumes"]).strategy, structure::Strategy::MergeByKey("name"));
        assert_eq!(
            resolve(Kind::Job, &["spec", "template", "metadata", "finalizers"]).strategy,
            structure::Strategy::MergeScalars
        );
        assert_eq!(resolve(Kind::Pod, &["spec", "tolerations"]).strategy, structure::Strategy::Replace);
        assert_eq!(resolve(Kind::Pod, &["spec", "ports"]).strategy, structure::Strategy::Replace);
        assert_eq!(resolve(Kind::ConfigMap, &["spec", "containers"]).strategy, structure::Strategy::Replace);
    }

    #[test]
    fn a_new_field_is_merged_into_nothing_so_no_directive_is_stored() {
        let original = json!({"spec": {}});
        let patch = json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "a"}],
            "containers": [{"name": "a", "env": [{"$patch": "delete", "name": "X"}], "image": null}]
        }}}});
        let out = smp(Kind::Deployment, original, patch);
        assert_eq!(out, json!({"spec": {"template": {"spec": {"containers": [{"name": "a", "env": []}]}}}}));
    }

    #[test]
    fn malformed_patches_are_errors_with_a_path() {
        let original = deployment(json!([{"name": "a"}]));
        let err = |patch: Value| strategic_merge(Kind::Deployment, &original, &patch).unwrap_err();

        assert_eq!(err(json!(["not", "an", "object"])), PatchError::PatchNotAnObject);
        assert_eq!(strategic_merge(Kind::Pod, &json!(3), &json!({})).unwrap_err(), PatchError::OriginalNotAnObject);

        let e = err(json!({"spec": {"$patch": "explode"}}));
        assert!(matches!(e, PatchError::InvalidDirective { ref path, .. } if path == "spec"), "{e}");

        let e = err(json!({"metadata": {"$frobnicate": 1}}));
        assert_eq!(e.to_string(), "metadata: unknown patch directive \"$frobnicate\"");

        let e = err(json!({"spec": {"template": {"spec": {"containers": [{"image": "x"}]}}}}));
        assert!(
            matches!(e, PatchError::MissingMergeKey { ref path, ref key, .. }
                if path == "spec.template.spec.containers" && key == "name"),
            "{e}"
        );
        let e = err(json!({"spec": {"template": {"spec": {"containers": [{"$patch": "delete"}]}}}}));
        assert!(matches!(e, PatchError::MissingMergeKey { .. }), "{e}");

        let e = err(
            json!({"spec": {"template": {"spec": {"containers": [{"name": "a", "env": [{"name": "A", "$patch": 1}]}]}}}}),
        );
        assert!(matches!(e, PatchError::InvalidDirective { .. }), "{e}");

        let e = err(json!({"metadata": {"$deleteFromPrimitiveList/finalizers": "a"}}));
        assert!(matches!(e, PatchError::DirectiveNotAList { .. }), "{e}");
        let e = err(json!({"spec": {"$retainKeys": "type"}}));
        assert!(matches!(e, PatchError::InvalidRetainKeys { .. }), "{e}");
        let e = err(json!({"metadata": {"finalizers": [{"a": 1}]}}));
        assert!(matches!(e, PatchError::InvalidList { .. }), "{e}");
    }

    #[test]
    fn json_merge_follows_rfc_7386() {
        let original = json!({"a": 1, "b": {"c": 2, "d": [1, 2]}});
        let out = json_merge(&original, &json!({"a": null, "b": {"d": [3], "e": "x"}}));
        assert_eq!(out, json!({"b": {"c": 2, "d": [3], "e": "x"}}));
        assert_eq!(json_merge(&original, &json!([1])), json!([1]));
    }

    fn kinds() -> Vec<Kind> {
        crate::resources::catalog().iter().map(|r| r.kind_id).collect()
    }

    fn arb_key() -> impl Strategy<Value = String> {
        prop::sample::select(vec![
            "$patch",
            "$retainKeys",
            "$setElementOrder/containers",
            "$setElementOrder/finalizers",
            "$setElementOrder/env",
            "$deleteFromPrimitiveList/finalizers",
            "$bogus",
            "metadata",
            "finalizers",
            "ownerReferences",
            "uid",
            "spec",
            "template",
            "jobTemplate",
            "containers",
            "initContainers",
            "env",
            "ports",
            "port",
            "containerPort",
            "name",
            "value",
            "status",
            "conditions",
            "type",
            "strategy",
            "args",
        ])
        .prop_map(String::from)
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            (-2i64..3).prop_map(Value::from),
            prop::sample::select(vec!["replace", "delete", "merge", "a", "b", "name", "type", "containers"])
                .prop_map(Value::from),
        ];
        leaf.prop_recursive(6, 96, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::btree_map(arb_key(), inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn arb_object() -> impl Strategy<Value = Value> {
        prop::collection::btree_map(arb_key(), arb_json(), 0..5).prop_map(|m| Value::Object(m.into_iter().collect()))
    }

    /// Whether any map in `v` has a directive key.
    fn has_directive(v: &Value) -> bool {
        match v {
            Value::Object(m) => m.iter().any(|(k, v)| k.starts_with('$') || has_directive(v)),
            Value::Array(a) => a.iter().any(has_directive),
            _ => false,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn strategic_merge_never_panics_and_never_stores_a_directive(
            kind in prop::sample::select(kinds()),
            original in arb_json(),
            patch in arb_json(),
        ) {
            if let Ok(out) = strategic_merge(kind, &original, &patch) {
                prop_assert!(out.is_object());
                if !has_directive(&original) {
                    prop_assert!(!has_directive(&out), "{out}");
                }
            }
        }

        #[test]
        fn object_patches_never_panic_and_an_empty_patch_changes_nothing(
            kind in prop::sample::select(kinds()),
            original in arb_object(),
            patch in arb_object(),
        ) {
            let _ = strategic_merge(kind, &original, &patch);
            prop_assert_eq!(strategic_merge(kind, &original, &json!({})), Ok(original));
        }

        #[test]
        fn pod_template_patches_never_panic(original in arb_object(), patch in arb_object()) {
            let wrap = |v: Value| json!({"spec": {"template": {"spec": v}}});
            let (original, patch) = (wrap(original), wrap(patch));
            if let Ok(out) = strategic_merge(Kind::Deployment, &original, &patch) {
                if !has_directive(&original) {
                    prop_assert!(!has_directive(&out), "{out}");
                }
            }
        }
    }
}
