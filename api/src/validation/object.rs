//! `metadata`, for every kind: Kubernetes' `ValidateObjectMeta` and
//! `ValidateObjectMetaUpdate`.

use serde_json::Value;

use super::names::{is_dns1035_label, is_dns1123_label, is_dns1123_subdomain, is_label_value, is_qualified_name};
use super::{get, get_arr, get_str, invalid_each, nonnegative, string_pairs, IMMUTABLE};
use crate::field::{FieldError, Path};
use crate::resources::{Kind, ResourceInfo};

/// Annotations may hold at most this many bytes, keys and values together.
pub(crate) const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

/// Finalizers Kubernetes allows without a `/` prefix.
const STANDARD_FINALIZERS: &[&str] = &["kubernetes", "orphan", "foregroundDeletion"];

/// The name check for objects of `kind`.
fn name_check(kind: Kind) -> fn(&str) -> Vec<String> {
    match kind {
        Kind::Namespace => is_dns1123_label,
        Kind::Service => is_dns1035_label,
        Kind::Role | Kind::ClusterRole | Kind::RoleBinding | Kind::ClusterRoleBinding => {
            super::rbac::is_path_segment_name
        }
        _ => is_dns1123_subdomain,
    }
}

/// Kubernetes masks a trailing dash of `generateName` before checking it.
fn generate_name_errors(kind: Kind, prefix: &str) -> Vec<String> {
    let masked = match prefix.strip_suffix('-') {
        Some(p) if !p.is_empty() => format!("{p}a"),
        _ => prefix.to_string(),
    };
    name_check(kind)(&masked)
}

pub(crate) fn validate_meta(info: &ResourceInfo, obj: &Value) -> Vec<FieldError> {
    let meta = get(obj, "metadata");
    let path = Path::new("metadata");
    let mut errs = Vec::new();

    let generate_name = get_str(meta, "generateName");
    if !generate_name.is_empty() {
        errs.extend(invalid_each(
            &path.child("generateName"),
            generate_name,
            generate_name_errors(info.kind_id, generate_name),
        ));
    }
    let name = get_str(meta, "name");
    if name.is_empty() {
        errs.push(FieldError::required(path.child("name"), "name or generateName is required"));
    } else {
        errs.extend(invalid_each(&path.child("name"), name, name_check(info.kind_id)(name)));
    }

    let namespace = get_str(meta, "namespace");
    if info.namespaced {
        if namespace.is_empty() {
            errs.push(FieldError::required(path.child("namespace"), ""));
        } else {
            errs.extend(invalid_each(&path.child("namespace"), namespace, is_dns1123_label(namespace)));
        }
    } else if !namespace.is_empty() {
        errs.push(FieldError::forbidden(path.child("namespace"), "not allowed on this type"));
    }

    errs.extend(nonnegative(meta, "generation", &path));
    errs.extend(validate_labels(get(meta, "labels"), &path.child("labels")));
    errs.extend(validate_annotations(get(meta, "annotations"), &path.child("annotations")));
    errs.extend(validate_owner_references(get_arr(meta, "ownerReferences"), &path.child("ownerReferences")));
    errs.extend(validate_finalizers(get_arr(meta, "finalizers"), &path.child("finalizers")));
    errs
}

/// Kubernetes' `ValidateLabels`: the errors name the map, not the entry.
pub(crate) fn validate_labels(labels: &Value, path: &Path) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (k, v) in string_pairs(labels) {
        errs.extend(invalid_each(path, k, is_qualified_name(k)));
        errs.extend(invalid_each(path, v, is_label_value(v)));
    }
    errs
}

/// Kubernetes' `ValidateAnnotations`: keys are qualified names (any case),
/// and all of them together at most 256 KiB.
pub(crate) fn validate_annotations(annotations: &Value, path: &Path) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut total = 0usize;
    if let Some(m) = annotations.as_object() {
        for (k, v) in m {
            errs.extend(invalid_each(path, k, is_qualified_name(&k.to_ascii_lowercase())));
            total = total.saturating_add(k.len()).saturating_add(v.as_str().map_or(0, str::len));
        }
    }
    if total > TOTAL_ANNOTATION_SIZE_LIMIT {
        errs.push(FieldError::too_long(path, TOTAL_ANNOTATION_SIZE_LIMIT));
    }
    errs
}

fn validate_owner_references(refs: &[Value], path: &Path) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut first_controller: Option<String> = None;
    for r in refs {
        let api_version = get_str(r, "apiVersion");
        // `apps/v1` or `v1`: the version is the part after the last `/`.
        let version = api_version.rsplit('/').next().unwrap_or("");
        if version.is_empty() {
            errs.push(FieldError::invalid(path.child("apiVersion"), get(r, "apiVersion"), "version must not be empty"));
        }
        let checks =
            [("kind", "kind must not be empty"), ("name", "name must not be empty"), ("uid", "uid must not be empty")];
        for (field, msg) in checks {
            if get_str(r, field).is_empty() {
                errs.push(FieldError::invalid(path.child(field), &Value::String(String::new()), msg));
            }
        }
        if get(r, "controller").as_bool() == Some(true) {
            let this = format!("{}/{}", get_str(r, "kind"), get_str(r, "name"));
            match &first_controller {
                Some(first) => errs.push(FieldError::invalid(
                    path,
                    &Value::Array(refs.to_vec()),
                    format!(
                        "Only one reference can have Controller set to true. Found \"true\" in references for {first} and {this}"
                    ),
                )),
                None => first_controller = Some(this),
            }
        }
    }
    errs
}

fn validate_finalizers(finalizers: &[Value], path: &Path) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let names: Vec<&str> = finalizers.iter().map(|f| f.as_str().unwrap_or("")).collect();
    for f in &names {
        let msgs = is_qualified_name(f);
        if !msgs.is_empty() {
            errs.extend(invalid_each(path, f, msgs));
        } else if !f.contains('/') && !STANDARD_FINALIZERS.contains(f) {
            errs.extend(invalid_each(
                path,
                f,
                vec!["name is neither a standard finalizer name nor is it fully qualified".into()],
            ));
        }
    }
    if names.contains(&"orphan") && names.contains(&"foregroundDeletion") {
        errs.push(FieldError::invalid(
            path,
            &Value::from(names.clone()),
            "finalizer orphan and foregroundDeletion cannot be both set",
        ));
    }
    errs
}

/// Kubernetes' `ValidateObjectMetaUpdate`. The registry copies `uid` and
/// `creationTimestamp` from the stored object when a client leaves them out,
/// so only a different non-empty value is a change.
pub(crate) fn validate_meta_update(obj: &Value, old: &Value) -> Vec<FieldError> {
    let (meta, old_meta) = (get(obj, "metadata"), get(old, "metadata"));
    let path = Path::new("metadata");
    let mut errs = Vec::new();
    for field in ["name", "namespace"] {
        if get_str(meta, field) != get_str(old_meta, field) {
            errs.push(FieldError::invalid(path.child(field), get(meta, field), IMMUTABLE));
        }
    }
    for field in ["uid", "creationTimestamp"] {
        let new = get_str(meta, field);
        if !new.is_empty() && new != get_str(old_meta, field) {
            errs.push(FieldError::invalid(path.child(field), get(meta, field), IMMUTABLE));
        }
    }
    if !get_str(old_meta, "deletionTimestamp").is_empty() {
        let old_finalizers = get_arr(old_meta, "finalizers");
        let added: Vec<&Value> = get_arr(meta, "finalizers").iter().filter(|f| !old_finalizers.contains(f)).collect();
        if !added.is_empty() {
            let list: Vec<String> = added.iter().map(|f| f.to_string()).collect();
            errs.push(FieldError::forbidden(
                path.child("finalizers"),
                format!(
                    "no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                    list.join(", ")
                ),
            ));
        }
    }
    errs
}
