//! Pods and pod templates: Kubernetes' `ValidatePodSpec`,
//! `ValidatePodTemplateSpec` and `ValidatePodUpdate`.

use std::collections::BTreeSet;

use serde_json::Value;

use super::names::{
    inclusive_range_error, is_dns1123_label, is_dns1123_subdomain, is_env_var_name, is_label_value, is_port_name,
    is_port_num, is_qualified_name,
};
use super::object::{validate_annotations, validate_labels};
use super::quantity::{Quantity, QUANTITY_FORMAT};
use super::{get, get_arr, get_i64, get_obj, get_str, invalid_each, is_empty, nonnegative, IS_NEGATIVE};
use crate::field::{FieldError, Path};

pub(crate) const PORT_PROTOCOLS: &[&str] = &["SCTP", "TCP", "UDP"];
const RESTART_POLICIES: &[&str] = &["Always", "OnFailure", "Never"];
const DNS_POLICIES: &[&str] = &["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"];
const PULL_POLICIES: &[&str] = &["Always", "IfNotPresent", "Never"];
const TERMINATION_MESSAGE_POLICIES: &[&str] = &["File", "FallbackToLogsOnError"];
const TAINT_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];
const MAX_INT32: i64 = i32::MAX as i64;

/// Fields of a volume that name its source.
const NOT_A_SOURCE: &[&str] = &["name"];

/// The fields a pod update may change, as Kubernetes lists them.
pub(crate) const POD_UPDATE_MESSAGE: &str = "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

pub(crate) fn validate_pod(obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let spec = get(obj, "spec");
    let path = Path::new("spec");
    let mut errs = validate_pod_spec(spec, &path, true);
    if let Some(old) = old {
        errs.extend(validate_pod_update(spec, get(old, "spec"), &path));
    }
    errs
}

/// A pod template (`spec.template` of a workload): its labels and
/// annotations and its pod spec. Images may be left for later, as in
/// Kubernetes.
pub(crate) fn validate_pod_template(template: &Value, path: &Path) -> Vec<FieldError> {
    let meta = get(template, "metadata");
    let meta_path = path.child("metadata");
    let mut errs = validate_labels(get(meta, "labels"), &meta_path.child("labels"));
    errs.extend(validate_annotations(get(meta, "annotations"), &meta_path.child("annotations")));
    errs.extend(validate_pod_spec(get(template, "spec"), &path.child("spec"), false));
    errs
}

/// `is_pod`: a pod rather than a template (images are required).
pub(crate) fn validate_pod_spec(spec: &Value, path: &Path, is_pod: bool) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let volumes = validate_volumes(get_arr(spec, "volumes"), &path.child("volumes"), &mut errs);

    let mut names = BTreeSet::new();
    let init = get_arr(spec, "initContainers");
    for (i, c) in init.iter().enumerate() {
        let p = path.child("initContainers").index(i);
        errs.extend(validate_container(c, &p, &volumes, &mut names, is_pod, true));
    }
    let containers = get_arr(spec, "containers");
    if containers.is_empty() {
        errs.push(FieldError::required(path.child("containers"), ""));
    }
    for (i, c) in containers.iter().enumerate() {
        let p = path.child("containers").index(i);
        errs.extend(validate_container(c, &p, &volumes, &mut names, is_pod, false));
    }

    errs.extend(one_of(spec, "restartPolicy", RESTART_POLICIES, &path.child("restartPolicy")));
    errs.extend(one_of(spec, "dnsPolicy", DNS_POLICIES, &path.child("dnsPolicy")));
    if let Some(n) = get_i64(spec, "activeDeadlineSeconds") {
        if !(1..=MAX_INT32).contains(&n) {
            errs.push(FieldError::invalid(
                path.child("activeDeadlineSeconds"),
                &Value::from(n),
                inclusive_range_error(1, MAX_INT32),
            ));
        }
    }
    errs.extend(validate_labels(get(spec, "nodeSelector"), &path.child("nodeSelector")));
    for (field, check) in [
        ("serviceAccountName", is_dns1123_subdomain as fn(&str) -> Vec<String>),
        ("nodeName", is_dns1123_subdomain),
        ("priorityClassName", is_dns1123_subdomain),
        ("hostname", is_dns1123_label),
        ("subdomain", is_dns1123_label),
    ] {
        let v = get_str(spec, field);
        if !v.is_empty() {
            errs.extend(invalid_each(&path.child(field), v, check(v)));
        }
    }
    errs.extend(validate_tolerations(get_arr(spec, "tolerations"), &path.child("tolerations")));
    errs.extend(one_of_if_set(
        spec,
        "preemptionPolicy",
        super::scheduling::PREEMPTION_POLICIES,
        &path.child("preemptionPolicy"),
    ));
    errs
}

/// `field.Required` when empty, `field.NotSupported` when not one of `allowed`.
pub(crate) fn one_of(v: &Value, key: &str, allowed: &[&str], path: &Path) -> Option<FieldError> {
    let value = get(v, key);
    match value.as_str() {
        None | Some("") => Some(FieldError::required(path, "")),
        Some(s) if allowed.contains(&s) => None,
        Some(_) => Some(FieldError::not_supported(path, value, allowed)),
    }
}

/// `field.NotSupported` when set and not one of `allowed`.
fn one_of_if_set(v: &Value, key: &str, allowed: &[&str], path: &Path) -> Option<FieldError> {
    match get(v, key).as_str() {
        None | Some("") => None,
        Some(_) => one_of(v, key, allowed, path),
    }
}

/// The volume names, checking each volume.
fn validate_volumes(volumes: &[Value], path: &Path, errs: &mut Vec<FieldError>) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (i, vol) in volumes.iter().enumerate() {
        let p = path.index(i);
        let name = get_str(vol, "name");
        if name.is_empty() {
            errs.push(FieldError::required(p.child("name"), ""));
        } else {
            errs.extend(invalid_each(&p.child("name"), name, is_dns1123_label(name)));
        }
        if !names.insert(name.to_string()) {
            errs.push(FieldError::duplicate(p.child("name"), get(vol, "name")));
        }
        let sources: Vec<&String> = vol
            .as_object()
            .map(|m| {
                m.iter().filter(|(k, v)| !NOT_A_SOURCE.contains(&k.as_str()) && !v.is_null()).map(|(k, _)| k).collect()
            })
            .unwrap_or_default();
        match sources.as_slice() {
            [] => errs.push(FieldError::required(&p, "must specify a volume type")),
            [_] => {}
            [_, second, ..] => {
                errs.push(FieldError::forbidden(p.child(second), "may not specify more than 1 volume type"))
            }
        }
    }
    names
}

fn validate_container(
    c: &Value,
    path: &Path,
    volumes: &BTreeSet<String>,
    names: &mut BTreeSet<String>,
    is_pod: bool,
    is_init: bool,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let name = get_str(c, "name");
    if name.is_empty() {
        errs.push(FieldError::required(path.child("name"), ""));
    } else {
        errs.extend(invalid_each(&path.child("name"), name, is_dns1123_label(name)));
        if !names.insert(name.to_string()) {
            errs.push(FieldError::duplicate(path.child("name"), get(c, "name")));
        }
    }

    let image = get_str(c, "image");
    if is_pod && image.is_empty() {
        errs.push(FieldError::required(path.child("image"), ""));
    } else if image.trim() != image {
        errs.push(FieldError::invalid(
            path.child("image"),
            get(c, "image"),
            "must not have leading or trailing whitespace",
        ));
    }

    errs.extend(validate_container_ports(get_arr(c, "ports"), &path.child("ports")));
    errs.extend(validate_env(get_arr(c, "env"), &path.child("env")));
    errs.extend(validate_resources(get(c, "resources"), &path.child("resources")));
    errs.extend(validate_volume_mounts(get_arr(c, "volumeMounts"), &path.child("volumeMounts"), volumes));
    errs.extend(one_of(c, "imagePullPolicy", PULL_POLICIES, &path.child("imagePullPolicy")));
    errs.extend(one_of(
        c,
        "terminationMessagePolicy",
        TERMINATION_MESSAGE_POLICIES,
        &path.child("terminationMessagePolicy"),
    ));

    let sidecar = get_str(c, "restartPolicy") == "Always";
    if is_init {
        errs.extend(one_of_if_set(c, "restartPolicy", &["Always"], &path.child("restartPolicy")));
    } else if !get_str(c, "restartPolicy").is_empty() {
        errs.push(FieldError::forbidden(path.child("restartPolicy"), "may not be set for non-init containers"));
    }
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        let p = get(c, probe);
        if p.is_null() {
            continue;
        }
        if is_init && !sidecar {
            errs.push(FieldError::forbidden(
                path.child(probe),
                "may not be set for init containers without restartPolicy=Always",
            ));
            continue;
        }
        errs.extend(validate_probe(p, &path.child(probe)));
        if probe != "readinessProbe" {
            if let Some(n) = get_i64(p, "successThreshold") {
                if n != 1 {
                    errs.push(FieldError::invalid(
                        path.child(probe).child("successThreshold"),
                        &Value::from(n),
                        "must be 1",
                    ));
                }
            }
        }
    }
    errs
}

fn validate_container_ports(ports: &[Value], path: &Path) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut names = BTreeSet::new();
    for (i, port) in ports.iter().enumerate() {
        let p = path.index(i);
        let name = get_str(port, "name");
        if !name.is_empty() {
            let msgs = is_port_name(name);
            if !msgs.is_empty() {
                errs.extend(invalid_each(&p.child("name"), name, msgs));
            } else if !names.insert(name.to_string()) {
                errs.push(FieldError::duplicate(p.child("name"), get(port, "name")));
            }
        }
        match get_i64(port, "containerPort") {
            None | Some(0) => errs.push(FieldError::required(p.child("containerPort"), "")),
            Some(n) => errs.extend(port_num_errors(n, &p.child("containerPort"))),
        }
        if let Some(n) = get_i64(port, "hostPort").filter(|n| *n != 0) {
            errs.extend(port_num_errors(n, &p.child("hostPort")));
        }
        errs.extend(one_of(port, "protocol", PORT_PROTOCOLS, &p.child("protocol")));
    }
    errs
}

pub(crate) fn port_num_errors(n: i64, path: &Path) -> Vec<FieldError> {
    is_port_num(n).into_iter().map(|m| FieldError::invalid(path, &Value::from(n), m)).collect()
}

/// Kubernetes' `ValidatePortNumOrName` on an int-or-string.
pub(crate) fn port_num_or_name_errors(v: &Value, path: &Path) -> Vec<FieldError> {
    match v {
        Value::Number(n) => port_num_errors(n.as_i64().unwrap_or(0), path),
        Value::String(s) => invalid_each(path, s, is_port_name(s)),
        _ => vec![FieldError::required(path, "")],
    }
}

fn validate_env(env: &[Value], path: &Path) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (i, e) in env.iter().enumerate() {
        let p = path.index(i);
        let name = get_str(e, "name");
        if name.is_empty() {
            errs.push(FieldError::required(p.child("name"), ""));
        } else {
            errs.extend(invalid_each(&p.child("name"), name, is_env_var_name(name)));
        }
        let from = get(e, "valueFrom");
        if from.is_null() {
            continue;
        }
        let fp = p.child("valueFrom");
        let sources = ["fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef"]
            .iter()
            .filter(|k| !get(from, k).is_null())
            .count();
        if !get_str(e, "value").is_empty() {
            errs.push(FieldError::invalid(
                &fp,
                &Value::String(String::new()),
                "may not be specified when `value` is not empty",
            ));
        }
        match sources {
            0 => errs.push(FieldError::invalid(
                &fp,
                &Value::String(String::new()),
                "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`",
            )),
            1 => {
                for key_ref in ["configMapKeyRef", "secretKeyRef"] {
                    let r = get(from, key_ref);
                    if !r.is_null() && get_str(r, "key").is_empty() {
                        errs.push(FieldError::required(fp.child(key_ref).child("key"), ""));
                    }
                }
                let fr = get(from, "fieldRef");
                if !fr.is_null() && get_str(fr, "fieldPath").is_empty() {
                    errs.push(FieldError::required(fp.child("fieldRef").child("fieldPath"), ""));
                }
            }
            _ => errs.push(FieldError::invalid(
                &fp,
                &Value::String(String::new()),
                "may not have more than one field specified at a time",
            )),
        }
    }
    errs
}

/// Resource names a container may ask for without a `/` prefix.
fn is_standard_container_resource(name: &str) -> bool {
    matches!(name, "cpu" | "memory" | "ephemeral-storage") || name.starts_with("hugepages-")
}

fn validate_resources(res: &Value, path: &Path) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let parsed = |field: &str, errs: &mut Vec<FieldError>| -> Vec<(String, Option<Quantity>)> {
        let mut out = Vec::new();
        for (name, q) in get_obj(res, field).into_iter().flatten() {
            let p = path.child(field).key(name);
            let name_errs = is_qualified_name(name);
            if !name_errs.is_empty() {
                errs.extend(invalid_each(&p, name, name_errs));
            } else if !name.contains('/') && !is_standard_container_resource(name) {
                errs.push(FieldError::invalid(
                    &p,
                    &Value::String(name.clone()),
                    "must be a standard resource for containers",
                ));
            }
            let qty = q.as_str().and_then(Quantity::parse);
            match qty {
                None => errs.push(FieldError::invalid(&p, q, QUANTITY_FORMAT)),
                Some(v) if v.is_negative() => errs.push(FieldError::invalid(&p, q, IS_NEGATIVE)),
                Some(_) => {}
            }
            out.push((name.clone(), qty));
        }
        out
    };
    let limits = parsed("limits", &mut errs);
    let requests = parsed("requests", &mut errs);
    for (name, req) in &requests {
        let Some(req) = req else { continue };
        let Some((_, Some(lim))) = limits.iter().find(|(n, _)| n == name) else { continue };
        let shown = |field: &str| get(get(res, field), name).as_str().unwrap_or("").to_string();
        let (req_s, lim_s) = (shown("requests"), shown("limits"));
        let overcommit = !name.starts_with("hugepages-") && (!name.contains('/') || name.starts_with("kubernetes.io/"));
        if !overcommit && req.cmp(lim) != std::cmp::Ordering::Equal {
            errs.push(FieldError::invalid(
                path.child("requests"),
                &Value::String(req_s),
                format!("must be equal to {name} limit of {lim_s}"),
            ));
        } else if req.cmp(lim) == std::cmp::Ordering::Greater {
            errs.push(FieldError::invalid(
                path.child("requests"),
                &Value::String(req_s),
                format!("must be less than or equal to {name} limit of {lim_s}"),
            ));
        }
    }
    errs
}

fn validate_volume_mounts(mounts: &[Value], path: &Path, volumes: &BTreeSet<String>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut mount_points = BTreeSet::new();
    for (i, m) in mounts.iter().enumerate() {
        let p = path.index(i);
        let name = get_str(m, "name");
        if name.is_empty() {
            errs.push(FieldError::required(p.child("name"), ""));
        } else if !volumes.contains(name) {
            // Kubernetes reports `field.NotFound`, which Skiff's field errors
            // express as an invalid value.
            errs.push(FieldError::invalid(p.child("name"), get(m, "name"), "not found: no volume of this name"));
        }
        let mount_path = get_str(m, "mountPath");
        if mount_path.is_empty() {
            errs.push(FieldError::required(p.child("mountPath"), ""));
        } else if !mount_points.insert(mount_path.to_string()) {
            errs.push(FieldError::invalid(p.child("mountPath"), get(m, "mountPath"), "must be unique"));
        }
    }
    errs
}

const PROBE_HANDLERS: &[&str] = &["exec", "httpGet", "tcpSocket", "grpc"];

fn validate_probe(probe: &Value, path: &Path) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let handlers: Vec<&&str> = PROBE_HANDLERS.iter().filter(|h| !get(probe, h).is_null()).collect();
    match handlers.as_slice() {
        [] => errs.push(FieldError::required(path, "must specify a handler type")),
        [one] => {
            let hp = path.child(one);
            let h = get(probe, one);
            match **one {
                "exec" if get_arr(h, "command").is_empty() => errs.push(FieldError::required(hp.child("command"), "")),
                "httpGet" => {
                    if get_str(h, "path").is_empty() {
                        errs.push(FieldError::required(hp.child("path"), ""));
                    }
                    errs.extend(port_num_or_name_errors(get(h, "port"), &hp.child("port")));
                    errs.extend(one_of_if_set(h, "scheme", &["HTTP", "HTTPS"], &hp.child("scheme")));
                }
                "tcpSocket" => errs.extend(port_num_or_name_errors(get(h, "port"), &hp.child("port"))),
                "grpc" => errs.extend(port_num_errors(get_i64(h, "port").unwrap_or(0), &hp.child("port"))),
                _ => {}
            }
        }
        [_, second, ..] => {
            errs.push(FieldError::forbidden(path.child(second), "may not specify more than 1 handler type"))
        }
    }
    for field in ["initialDelaySeconds", "timeoutSeconds", "periodSeconds", "successThreshold", "failureThreshold"] {
        errs.extend(nonnegative(probe, field, path));
    }
    errs
}

pub(crate) fn validate_tolerations(tolerations: &[Value], path: &Path) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (i, t) in tolerations.iter().enumerate() {
        let p = path.index(i);
        let key = get_str(t, "key");
        let operator = get_str(t, "operator");
        let effect = get_str(t, "effect");
        if !key.is_empty() {
            errs.extend(invalid_each(&p.child("key"), key, is_qualified_name(key)));
        } else if operator != "Exists" {
            errs.push(FieldError::invalid(
                p.child("operator"),
                get(t, "operator"),
                "operator must be Exists when `key` is empty, which means \"match all values and all keys\"",
            ));
        }
        if !get(t, "tolerationSeconds").is_null() && effect != "NoExecute" {
            errs.push(FieldError::invalid(
                p.child("effect"),
                get(t, "effect"),
                "effect must be 'NoExecute' when `tolerationSeconds` is set",
            ));
        }
        let value = get_str(t, "value");
        match operator {
            "" | "Equal" => {
                let msgs = is_label_value(value);
                if !msgs.is_empty() {
                    errs.push(FieldError::invalid(p.child("operator"), get(t, "value"), msgs.join(";")));
                }
            }
            "Exists" => {
                if !value.is_empty() {
                    errs.push(FieldError::invalid(
                        p.child("operator"),
                        t,
                        "value must be empty when `operator` is 'Exists'",
                    ));
                }
            }
            _ => errs.push(FieldError::not_supported(p.child("operator"), get(t, "operator"), &["Equal", "Exists"])),
        }
        if !effect.is_empty() {
            errs.extend(one_of(t, "effect", TAINT_EFFECTS, &p.child("effect")));
        }
    }
    errs
}

pub(crate) fn validate_taint_effect(t: &Value, path: &Path) -> Option<FieldError> {
    one_of(t, "effect", TAINT_EFFECTS, path)
}

/// Kubernetes' `ValidatePodUpdate`: only images, a shorter
/// `activeDeadlineSeconds`, added tolerations and a negative grace period
/// turned into 1 may change.
fn validate_pod_update(spec: &Value, old_spec: &Value, path: &Path) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let ads_path = path.child("activeDeadlineSeconds");
    match (get(spec, "activeDeadlineSeconds"), get_i64(old_spec, "activeDeadlineSeconds")) {
        (Value::Null, Some(_)) => {
            errs.push(FieldError::invalid(
                &ads_path,
                &Value::Null,
                "must not update from a positive integer to nil value",
            ));
            return errs;
        }
        (new, Some(old)) => {
            if let Some(n) = new.as_i64() {
                if n > old && (0..=MAX_INT32).contains(&n) {
                    errs.push(FieldError::invalid(&ads_path, new, "must be less than or equal to previous value"));
                    return errs;
                }
            }
        }
        _ => {}
    }

    let mut munged = spec.clone();
    for list in ["containers", "initContainers"] {
        let old_list = get_arr(old_spec, list);
        if let Some(cs) = munged.get_mut(list).and_then(Value::as_array_mut) {
            if cs.len() == old_list.len() {
                for (c, old_c) in cs.iter_mut().zip(old_list) {
                    if let Some(m) = c.as_object_mut() {
                        match old_c.get("image") {
                            Some(img) => m.insert("image".into(), img.clone()),
                            None => m.remove("image"),
                        };
                    }
                }
            }
        }
    }
    if let Some(m) = munged.as_object_mut() {
        for field in ["activeDeadlineSeconds", "tolerations"] {
            match old_spec.get(field) {
                Some(v) => m.insert(field.into(), v.clone()),
                None => m.remove(field),
            };
        }
        let old_grace = get_i64(old_spec, "terminationGracePeriodSeconds");
        if old_grace.is_some_and(|g| g < 0) && get_i64(spec, "terminationGracePeriodSeconds") == Some(1) {
            m.insert("terminationGracePeriodSeconds".into(), Value::from(old_grace));
        }
    }
    if !equal_ignoring_empty(&munged, old_spec) {
        let changed = changed_fields(&munged, old_spec);
        let detail = if changed.is_empty() {
            POD_UPDATE_MESSAGE.to_string()
        } else {
            format!("{POD_UPDATE_MESSAGE}\nchanged: {}", changed.join(", "))
        };
        errs.push(FieldError::forbidden(path, detail));
    }

    let old_tolerations = get_arr(old_spec, "tolerations");
    let new_tolerations = get_arr(spec, "tolerations");
    for old in old_tolerations {
        let kept = new_tolerations.iter().any(|new| {
            let mut o = old.clone();
            if let Some(m) = o.as_object_mut() {
                match new.get("tolerationSeconds") {
                    Some(s) => m.insert("tolerationSeconds".into(), s.clone()),
                    None => m.remove("tolerationSeconds"),
                };
            }
            equal_ignoring_empty(&o, new)
        });
        if !kept {
            errs.push(FieldError::forbidden(
                path.child("tolerations"),
                "existing toleration can not be modified except its tolerationSeconds",
            ));
            break;
        }
    }
    errs
}

/// Deep equality where null, missing and empty values are one (as Go's
/// semantic equality treats nil and empty slices and maps).
pub(crate) fn equal_ignoring_empty(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().all(|k| {
                let (va, vb) = (x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null));
                equal_ignoring_empty(va, vb)
            })
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| equal_ignoring_empty(a, b))
        }
        _ => (is_empty(a) && is_empty(b)) || a == b,
    }
}

/// The top-level spec fields that differ, for the update message.
fn changed_fields(a: &Value, b: &Value) -> Vec<String> {
    let (Some(x), Some(y)) = (a.as_object(), b.as_object()) else { return Vec::new() };
    let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
    keys.into_iter()
        .filter(|k| !equal_ignoring_empty(x.get(*k).unwrap_or(&Value::Null), y.get(*k).unwrap_or(&Value::Null)))
        .map(|k| format!("spec.{k}"))
        .collect()
}
