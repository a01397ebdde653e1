//! Deployments, ReplicaSets and DaemonSets (`apps/v1`), and the core
//! ReplicationController they grew out of: selectors, templates and update
//! strategies, as Kubernetes' `pkg/apis/apps/validation` (and
//! `ValidateReplicationControllerSpec` in `pkg/apis/core/validation`).

use serde_json::Value;

use super::names::{is_label_value, is_percent, is_qualified_name};
use super::object::validate_labels;
use super::pod::validate_pod_template;
use super::{get, get_arr, get_i64, get_obj, get_str, invalid_each, nonnegative, same, IMMUTABLE, IS_NEGATIVE};
use crate::field::{FieldError, Path};

pub(crate) const SELECTOR_MISMATCH: &str = "`selector` does not match template `labels`";

pub(crate) fn validate_deployment(obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let spec = get(obj, "spec");
    let path = Path::new("spec");
    let mut errs = replicated_spec(spec, &path, "deployment");
    errs.extend(validate_deployment_strategy(get(spec, "strategy"), &path.child("strategy")));
    if let Some(limit) = get_i64(spec, "progressDeadlineSeconds") {
        errs.extend(nonnegative(spec, "progressDeadlineSeconds", &path));
        if limit <= get_i64(spec, "minReadySeconds").unwrap_or(0) {
            errs.push(FieldError::invalid(
                path.child("progressDeadlineSeconds"),
                &Value::from(limit),
                "must be greater than minReadySeconds",
            ));
        }
    }
    errs.extend(selector_update(spec, old));
    errs
}

pub(crate) fn validate_replica_set(obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let spec = get(obj, "spec");
    let mut errs = replicated_spec(spec, &Path::new("spec"), "deployment");
    errs.extend(selector_update(spec, old));
    errs
}

/// A ReplicationController's selector is a plain label map (not a
/// `LabelSelector`), required, and may change (unlike a ReplicaSet's).
pub(crate) fn validate_replication_controller(obj: &Value, _old: Option<&Value>) -> Vec<FieldError> {
    let spec = get(obj, "spec");
    let path = Path::new("spec");
    let mut errs = Vec::new();
    errs.extend(nonnegative(spec, "replicas", &path));
    errs.extend(nonnegative(spec, "minReadySeconds", &path));
    let selector = get(spec, "selector");
    let sel_path = path.child("selector");
    let empty = get_obj(spec, "selector").is_none_or(|m| m.is_empty());
    if empty {
        errs.push(FieldError::required(&sel_path, ""));
    } else {
        errs.extend(validate_labels(selector, &sel_path));
    }
    let template = get(spec, "template");
    let tpath = path.child("template");
    if template.is_null() {
        errs.push(FieldError::required(&tpath, ""));
        return errs;
    }
    let labels = get(get(template, "metadata"), "labels");
    if !empty && !selector_matches(&serde_json::json!({ "matchLabels": selector }), labels) {
        errs.push(FieldError::invalid(tpath.child("metadata").child("labels"), labels, SELECTOR_MISMATCH));
    }
    errs.extend(template_rules(template, &tpath, "ReplicationController"));
    errs
}

pub(crate) fn validate_daemon_set(obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let spec = get(obj, "spec");
    let path = Path::new("spec");
    let mut errs = selector_and_template(spec, &path, "daemonset", "DaemonSet");
    errs.extend(nonnegative(spec, "minReadySeconds", &path));
    errs.extend(nonnegative(spec, "revisionHistoryLimit", &path));
    errs.extend(validate_daemon_set_update_strategy(get(spec, "updateStrategy"), &path.child("updateStrategy")));
    errs.extend(selector_update(spec, old));
    errs
}

/// The spec of a Deployment or ReplicaSet (Kubernetes' message says
/// "deployment" for both).
fn replicated_spec(spec: &Value, path: &Path, what: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    errs.extend(nonnegative(spec, "replicas", path));
    errs.extend(selector_and_template(spec, path, what, "ReplicaSet"));
    errs.extend(nonnegative(spec, "minReadySeconds", path));
    errs.extend(nonnegative(spec, "revisionHistoryLimit", path));
    errs
}

/// The selector (required, non-empty, valid), the template it must match,
/// and the template's restart policy (Always) and deadline (none).
fn selector_and_template(spec: &Value, path: &Path, what: &str, owner: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let selector = get(spec, "selector");
    let sel_path = path.child("selector");
    let mut selector_ok = false;
    if selector.is_null() {
        errs.push(FieldError::required(&sel_path, ""));
    } else {
        let sel_errs = validate_label_selector(selector, &sel_path);
        selector_ok = sel_errs.is_empty();
        errs.extend(sel_errs);
        if get_obj(selector, "matchLabels").is_none_or(|m| m.is_empty())
            && get_arr(selector, "matchExpressions").is_empty()
        {
            selector_ok = false;
            errs.push(FieldError::invalid(&sel_path, selector, format!("empty selector is invalid for {what}")));
        }
    }
    let template = get(spec, "template");
    let tpath = path.child("template");
    if template.is_null() {
        errs.push(FieldError::required(&tpath, ""));
        return errs;
    }
    let labels = get(get(template, "metadata"), "labels");
    if selector_ok && !selector_matches(selector, labels) {
        errs.push(FieldError::invalid(tpath.child("metadata").child("labels"), labels, SELECTOR_MISMATCH));
    }
    errs.extend(template_rules(template, &tpath, owner));
    errs
}

/// The template of a replicated workload: a valid pod template that
/// restarts Always and has no deadline.
fn template_rules(template: &Value, tpath: &Path, owner: &str) -> Vec<FieldError> {
    let mut errs = validate_pod_template(template, tpath);
    let pod_spec = get(template, "spec");
    let sp = tpath.child("spec");
    let restart = get(pod_spec, "restartPolicy");
    if restart.as_str().is_some_and(|r| !r.is_empty() && r != "Always") {
        errs.push(FieldError::not_supported(sp.child("restartPolicy"), restart, &["Always"]));
    }
    let deadline = get(pod_spec, "activeDeadlineSeconds");
    if !deadline.is_null() {
        errs.push(FieldError::invalid(
            sp.child("activeDeadlineSeconds"),
            deadline,
            format!("activeDeadlineSeconds in {owner} is not Supported"),
        ));
    }
    errs
}

/// Kubernetes' `ValidateLabelSelector`.
pub(crate) fn validate_label_selector(selector: &Value, path: &Path) -> Vec<FieldError> {
    let mut errs = validate_labels(get(selector, "matchLabels"), &path.child("matchLabels"));
    for (i, expr) in get_arr(selector, "matchExpressions").iter().enumerate() {
        let p = path.child("matchExpressions").index(i);
        let values = get_arr(expr, "values");
        match get_str(expr, "operator") {
            "In" | "NotIn" => {
                if values.is_empty() {
                    errs.push(FieldError::required(
                        p.child("values"),
                        "must be specified when `operator` is 'In' or 'NotIn'",
                    ));
                }
            }
            "Exists" | "DoesNotExist" => {
                if !values.is_empty() {
                    errs.push(FieldError::forbidden(
                        p.child("values"),
                        "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                    ));
                }
            }
            _ => errs.push(FieldError::invalid(
                p.child("operator"),
                get(expr, "operator"),
                "not a valid selector operator",
            )),
        }
        let key = get_str(expr, "key");
        errs.extend(invalid_each(&p.child("key"), key, is_qualified_name(key)));
        for (j, v) in values.iter().enumerate() {
            let s = v.as_str().unwrap_or("");
            errs.extend(invalid_each(&p.child("values").index(j), s, is_label_value(s)));
        }
    }
    errs
}

/// Whether a (valid) `LabelSelector` selects `labels`. Local to validation:
/// the selector module parses the string form.
pub(crate) fn selector_matches(selector: &Value, labels: &Value) -> bool {
    let label = |k: &str| labels.get(k).and_then(Value::as_str);
    let match_labels = get_obj(selector, "matchLabels").into_iter().flatten().all(|(k, v)| label(k) == v.as_str());
    let match_exprs = get_arr(selector, "matchExpressions").iter().all(|e| {
        let have = label(get_str(e, "key"));
        let in_values = || have.is_some_and(|h| get_arr(e, "values").iter().any(|v| v.as_str() == Some(h)));
        match get_str(e, "operator") {
            "In" => in_values(),
            "NotIn" => !in_values(),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            _ => false,
        }
    });
    match_labels && match_exprs
}

fn selector_update(spec: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let Some(old) = old else { return Vec::new() };
    let (new_sel, old_sel) = (get(spec, "selector"), get(get(old, "spec"), "selector"));
    if same(new_sel, old_sel) {
        Vec::new()
    } else {
        vec![FieldError::invalid("spec.selector", new_sel, IMMUTABLE)]
    }
}

fn validate_deployment_strategy(strategy: &Value, path: &Path) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let rolling = get(strategy, "rollingUpdate");
    match get_str(strategy, "type") {
        "Recreate" => {
            if !rolling.is_null() {
                errs.push(FieldError::forbidden(
                    path.child("rollingUpdate"),
                    "may not be specified when strategy `type` is 'Recreate'",
                ));
            }
        }
        "RollingUpdate" => {
            let rp = path.child("rollingUpdate");
            if rolling.is_null() {
                errs.push(FieldError::required(&rp, "this should be defaulted and never be nil"));
                return errs;
            }
            let unavailable = get(rolling, "maxUnavailable");
            let surge = get(rolling, "maxSurge");
            errs.extend(positive_int_or_percent(unavailable, &rp.child("maxUnavailable")));
            errs.extend(positive_int_or_percent(surge, &rp.child("maxSurge")));
            if int_or_percent(unavailable) == Some(0) && int_or_percent(surge) == Some(0) {
                errs.push(FieldError::invalid(
                    rp.child("maxUnavailable"),
                    unavailable,
                    "may not be 0 when `maxSurge` is 0",
                ));
            }
            errs.extend(not_more_than_100_percent(unavailable, &rp.child("maxUnavailable")));
        }
        _ => errs.push(FieldError::not_supported(
            path.child("type"),
            get(strategy, "type"),
            &["Recreate", "RollingUpdate"],
        )),
    }
    errs
}

fn validate_daemon_set_update_strategy(strategy: &Value, path: &Path) -> Vec<FieldError> {
    let mut errs = Vec::new();
    match get_str(strategy, "type") {
        "OnDelete" => {}
        "RollingUpdate" => {
            let rolling = get(strategy, "rollingUpdate");
            let rp = path.child("rollingUpdate");
            if rolling.is_null() {
                errs.push(FieldError::required(&rp, ""));
                return errs;
            }
            let unavailable = get(rolling, "maxUnavailable");
            let surge = get(rolling, "maxSurge");
            errs.extend(positive_int_or_percent(unavailable, &rp.child("maxUnavailable")));
            errs.extend(positive_int_or_percent(surge, &rp.child("maxSurge")));
            errs.extend(not_more_than_100_percent(unavailable, &rp.child("maxUnavailable")));
            errs.extend(not_more_than_100_percent(surge, &rp.child("maxSurge")));
            let has_unavailable = int_or_percent(unavailable).unwrap_or(0) != 0;
            let has_surge = int_or_percent(surge).unwrap_or(0) != 0;
            if has_unavailable && has_surge {
                errs.push(FieldError::invalid(
                    rp.child("maxSurge"),
                    surge,
                    "may not be set when maxUnavailable is non-zero",
                ));
            } else if !has_unavailable && !has_surge {
                errs.push(FieldError::required(rp.child("maxUnavailable"), "cannot be 0 when maxSurge is 0"));
            }
        }
        _ => errs.push(FieldError::not_supported(
            path.child("type"),
            get(strategy, "type"),
            &["RollingUpdate", "OnDelete"],
        )),
    }
    errs
}

/// The number of an int-or-percent (`25%` is 25); `None` if unset or malformed.
fn int_or_percent(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.strip_suffix('%').and_then(|d| d.parse().ok()),
        _ => None,
    }
}

pub(crate) fn positive_int_or_percent(v: &Value, path: &Path) -> Vec<FieldError> {
    match v {
        Value::String(s) => invalid_each(path, s, is_percent(s)),
        Value::Number(n) if n.as_i64().is_none_or(|n| n < 0) => vec![FieldError::invalid(path, v, IS_NEGATIVE)],
        _ => Vec::new(),
    }
}

pub(crate) fn not_more_than_100_percent(v: &Value, path: &Path) -> Option<FieldError> {
    match v {
        Value::String(s) if s.ends_with('%') && int_or_percent(v).is_some_and(|n| n > 100) => {
            Some(FieldError::invalid(path, v, "must not be greater than 100%"))
        }
        _ => None,
    }
}
