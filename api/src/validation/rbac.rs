//! Role, ClusterRole and their bindings, as Kubernetes' RBAC validation
//! checks them: every rule names verbs and either resources (with API
//! groups) or non-resource URLs, never both, and only cluster roles may
//! name URLs; a binding's role reference is one of the two role kinds and
//! never changes; every subject has a kind it can be.

use serde_json::Value;

use super::{get, get_arr, get_str, same};
use crate::field::{FieldError, Path};

const SUBJECT_KINDS: &[&str] = &["ServiceAccount", "User", "Group"];
const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// Kubernetes' `ValidatePathSegmentName`: RBAC names may hold colons
/// (`system:node`), but not what would break a URL path.
pub(crate) fn is_path_segment_name(name: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if name == "." || name == ".." {
        errs.push(format!("may not be '{name}'"));
    }
    for bad in ["/", "%"] {
        if name.contains(bad) {
            errs.push(format!("may not contain '{bad}'"));
        }
    }
    errs
}

/// `namespaced`: a Role, which may not name non-resource URLs.
pub(crate) fn validate_role(obj: &Value, namespaced: bool) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let rules = Path::new("rules");
    for (i, rule) in get_arr(obj, "rules").iter().enumerate() {
        errs.extend(validate_rule(rule, &rules.index(i), namespaced));
    }
    if !namespaced {
        if let Some(aggregation) = obj.get("aggregationRule").filter(|a| !a.is_null()) {
            if get_arr(aggregation, "clusterRoleSelectors").is_empty() {
                errs.push(FieldError::required(
                    "aggregationRule.clusterRoleSelectors",
                    "at least one clusterRoleSelector required if aggregationRule is non-nil",
                ));
            }
        }
    }
    errs
}

fn validate_rule(rule: &Value, path: &Path, namespaced: bool) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if get_arr(rule, "verbs").is_empty() {
        errs.push(FieldError::required(path.child("verbs"), "verbs must contain at least one value"));
    }
    let urls = get_arr(rule, "nonResourceURLs");
    let resources = get_arr(rule, "resources");
    if !urls.is_empty() {
        if namespaced {
            errs.push(FieldError::invalid(
                path.child("nonResourceURLs"),
                get(rule, "nonResourceURLs"),
                "namespaced rules cannot apply to non-resource URLs",
            ));
        }
        if !get_arr(rule, "apiGroups").is_empty() || !resources.is_empty() {
            errs.push(FieldError::invalid(
                path.child("nonResourceURLs"),
                get(rule, "nonResourceURLs"),
                "rules cannot apply to both regular resources and non-resource URLs",
            ));
        }
        return errs;
    }
    if get_arr(rule, "apiGroups").is_empty() {
        errs.push(FieldError::required(path.child("apiGroups"), "resource rules must supply at least one api group"));
    }
    if resources.is_empty() {
        errs.push(FieldError::required(path.child("resources"), "resource rules must supply at least one resource"));
    }
    errs
}

pub(crate) fn validate_binding(obj: &Value, old: Option<&Value>, namespaced: bool) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let role_ref = get(obj, "roleRef");
    let path = Path::new("roleRef");
    let group = get_str(role_ref, "apiGroup");
    if group != RBAC_GROUP {
        errs.push(FieldError::not_supported(path.child("apiGroup"), get(role_ref, "apiGroup"), &[RBAC_GROUP]));
    }
    let kinds: &[&str] = if namespaced { &["Role", "ClusterRole"] } else { &["ClusterRole"] };
    if !kinds.contains(&get_str(role_ref, "kind")) {
        errs.push(FieldError::not_supported(path.child("kind"), get(role_ref, "kind"), kinds));
    }
    let name = get_str(role_ref, "name");
    if name.is_empty() {
        errs.push(FieldError::required(path.child("name"), ""));
    } else {
        for msg in is_path_segment_name(name) {
            errs.push(FieldError::invalid(path.child("name"), get(role_ref, "name"), msg));
        }
    }
    let subjects = Path::new("subjects");
    for (i, subject) in get_arr(obj, "subjects").iter().enumerate() {
        errs.extend(validate_subject(subject, &subjects.index(i), namespaced));
    }
    if let Some(old) = old {
        if !same(role_ref, get(old, "roleRef")) {
            errs.push(FieldError::invalid("roleRef", role_ref, "cannot change roleRef"));
        }
    }
    errs
}

fn validate_subject(subject: &Value, path: &Path, namespaced: bool) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let name = get_str(subject, "name");
    if name.is_empty() {
        errs.push(FieldError::required(path.child("name"), ""));
    }
    match get_str(subject, "kind") {
        "ServiceAccount" => {
            if !get_str(subject, "apiGroup").is_empty() {
                errs.push(FieldError::not_supported(path.child("apiGroup"), get(subject, "apiGroup"), &[""]));
            }
            if !namespaced && get_str(subject, "namespace").is_empty() {
                errs.push(FieldError::required(path.child("namespace"), ""));
            }
        }
        "User" | "Group" => {
            if get_str(subject, "apiGroup") != RBAC_GROUP {
                errs.push(FieldError::not_supported(path.child("apiGroup"), get(subject, "apiGroup"), &[RBAC_GROUP]));
            }
        }
        _ => errs.push(FieldError::not_supported(path.child("kind"), get(subject, "kind"), SUBJECT_KINDS)),
    }
    errs
}
