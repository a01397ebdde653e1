//! Validation with field paths, as Kubernetes validates the fields Skiff uses.
//!
//! Two steps, run by the registry on every write:
//!
//! 1. [`normalize`] decodes the JSON into the `k8s-openapi` type of its kind
//!    and encodes it again. A value of the wrong shape (`spec.replicas:
//!    "three"`) is reported with its path; unknown fields are dropped, as
//!    Kubernetes drops them; `apiVersion` and `kind` are set from the catalog.
//!    Numbers where a quantity belongs (`cpu: 1`) become strings, and a
//!    Secret's `stringData` is merged into `data`, as the Kubernetes
//!    conversion does.
//! 2. [`validate`] checks the normalized and defaulted object against the
//!    Kubernetes rules, with Kubernetes' field paths and messages (from
//!    `k8s.io/apimachinery/pkg/util/validation` and
//!    `pkg/apis/*/validation`), and, on update, the immutable fields.
//!
//! The name checks ([`is_dns1123_label`] and friends) return the list of
//! problems as Kubernetes' `validation.IsDNS1123Label` does: empty means valid.
//!
//! Everything works on `serde_json::Value` and never panics on any input:
//! a field of an unexpected shape is treated as missing.
//!
//! Two of its parsers are public because controllers compute with what
//! they parse: [`cron`] (a CronJob's start times, in its time zone) and
//! [`quantity`] (a ResourceQuota's sums). [`scheduling`] is public for
//! the constants of the system priority classes, which the apiserver
//! creates and its priority admission reads.

use std::borrow::Cow;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::field::{FieldError, Path};
use crate::resources::{Kind, ResourceInfo};

mod apps;
mod batch;
pub mod cron;
mod names;
mod object;
mod other;
mod pod;
pub mod policy;
pub mod quantity;
mod rbac;
pub mod scheduling;
mod service;
#[cfg(test)]
mod tests;

pub use names::{
    is_config_map_key, is_dns1035_label, is_dns1123_label, is_dns1123_subdomain, is_label_value, is_port_name,
    is_qualified_name,
};

/// Decodes `obj` into its typed form and encodes it again: unknown fields are
/// dropped and a value of the wrong shape is reported with its path.
pub fn normalize(info: &ResourceInfo, obj: &Value) -> Result<Value, FieldError> {
    let Some(map) = obj.as_object() else {
        return Err(FieldError::type_invalid("", "the object must be a JSON object"));
    };
    // Typed as the catalog says (as nearly every object is), the object is
    // decoded where it is; it is copied only when something must change.
    let api_version = info.api_version();
    let typed = |k: &str, want: &str| map.get(k).and_then(Value::as_str) == Some(want);
    let mut input = if typed("apiVersion", &api_version) && typed("kind", info.kind) {
        Cow::Borrowed(obj)
    } else {
        let mut m = map.clone();
        m.insert("apiVersion".into(), Value::String(api_version));
        m.insert("kind".into(), Value::String(info.kind.to_string()));
        Cow::Owned(Value::Object(m))
    };
    if info.kind_id == Kind::Secret {
        merge_string_data(input.to_mut())?;
    }
    if info.kind_id == Kind::Custom {
        return crate::custom::normalize(info, &input);
    }
    use k8s_openapi::api::{
        apps::v1 as apps, batch::v1 as batch, coordination::v1 as coordination, core::v1 as core,
        discovery::v1 as discovery, policy::v1 as policy, rbac::v1 as rbac, scheduling::v1 as scheduling,
    };
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as crds;
    let mut out = match info.kind_id {
        Kind::Namespace => roundtrip::<core::Namespace>(input),
        Kind::Pod => roundtrip::<core::Pod>(input),
        Kind::Node => roundtrip::<core::Node>(input),
        Kind::Service => roundtrip::<core::Service>(input),
        Kind::Endpoints => roundtrip::<core::Endpoints>(input),
        Kind::EndpointSlice => roundtrip::<discovery::EndpointSlice>(input),
        Kind::ConfigMap => roundtrip::<core::ConfigMap>(input),
        Kind::Secret => roundtrip::<core::Secret>(input),
        Kind::ServiceAccount => roundtrip::<core::ServiceAccount>(input),
        Kind::Event => roundtrip::<core::Event>(input),
        Kind::Lease => roundtrip::<coordination::Lease>(input),
        Kind::ReplicationController => roundtrip::<core::ReplicationController>(input),
        Kind::ReplicaSet => roundtrip::<apps::ReplicaSet>(input),
        Kind::Deployment => roundtrip::<apps::Deployment>(input),
        Kind::DaemonSet => roundtrip::<apps::DaemonSet>(input),
        Kind::Job => roundtrip::<batch::Job>(input),
        Kind::CronJob => roundtrip::<batch::CronJob>(input),
        Kind::ResourceQuota => roundtrip::<core::ResourceQuota>(input),
        Kind::LimitRange => roundtrip::<core::LimitRange>(input),
        Kind::PodDisruptionBudget => roundtrip::<policy::PodDisruptionBudget>(input),
        Kind::CustomResourceDefinition => roundtrip::<crds::CustomResourceDefinition>(input),
        Kind::Role => roundtrip::<rbac::Role>(input),
        Kind::ClusterRole => roundtrip::<rbac::ClusterRole>(input),
        Kind::RoleBinding => roundtrip::<rbac::RoleBinding>(input),
        Kind::ClusterRoleBinding => roundtrip::<rbac::ClusterRoleBinding>(input),
        Kind::Custom => unreachable!("custom resources return above"),
        Kind::PriorityClass => {
            let has_value = input.get("value").is_some_and(|v| !v.is_null());
            roundtrip::<scheduling::PriorityClass>(input).map(|mut out| {
                // The typed form reads a missing value as 0; keep it missing,
                // so validation can say it is required.
                if let (false, Some(m)) = (has_value, out.as_object_mut()) {
                    m.remove("value");
                }
                out
            })
        }
    }?;
    // k8s-openapi writes these itself, but say so explicitly: the catalog wins.
    if let Some(m) = out.as_object_mut() {
        m.insert("apiVersion".into(), Value::String(info.api_version()));
        m.insert("kind".into(), Value::String(info.kind.to_string()));
    }
    Ok(out)
}

/// The problems with `obj`'s metadata, and with its change from `old`'s
/// for an update: all a write needs checked when it leaves the rest of the
/// object as stored (a pod's status, its binding).
pub fn validate_metadata(info: &ResourceInfo, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = object::validate_meta(info, obj);
    if let Some(old) = old {
        errs.extend(object::validate_meta_update(obj, old));
    }
    errs
}

/// Every problem with `obj` (already normalized and defaulted); `old` is the
/// stored object for an update, so immutable fields can be checked.
pub fn validate(info: &ResourceInfo, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = validate_metadata(info, obj, old);
    errs.extend(match info.kind_id {
        Kind::Pod => pod::validate_pod(obj, old),
        Kind::Service => service::validate_service(obj, old),
        Kind::Deployment => apps::validate_deployment(obj, old),
        Kind::ReplicaSet => apps::validate_replica_set(obj, old),
        Kind::ReplicationController => apps::validate_replication_controller(obj, old),
        Kind::DaemonSet => apps::validate_daemon_set(obj, old),
        Kind::Job => batch::validate_job(obj, old),
        Kind::CronJob => batch::validate_cron_job(obj, old),
        Kind::ConfigMap => other::validate_config_map(obj, old),
        Kind::Secret => other::validate_secret(obj, old),
        Kind::Lease => other::validate_lease(obj),
        Kind::Namespace => other::validate_namespace(obj),
        Kind::Node => other::validate_node(obj),
        Kind::Endpoints => other::validate_endpoints(obj),
        Kind::EndpointSlice => other::validate_endpoint_slice(obj, old),
        Kind::ResourceQuota => other::validate_resource_quota(obj),
        Kind::LimitRange => other::validate_limit_range(obj),
        Kind::PriorityClass => scheduling::validate_priority_class(obj, old),
        Kind::PodDisruptionBudget => policy::validate_pod_disruption_budget(obj),
        Kind::Event => other::validate_event(obj),
        Kind::ServiceAccount => Vec::new(),
        Kind::CustomResourceDefinition => crate::custom::validate_definition(obj, old),
        Kind::Role => rbac::validate_role(obj, true),
        Kind::ClusterRole => rbac::validate_role(obj, false),
        Kind::RoleBinding => rbac::validate_binding(obj, old, true),
        Kind::ClusterRoleBinding => rbac::validate_binding(obj, old, false),
        Kind::Custom => crate::custom::validate(info, obj, old),
    });
    errs
}

/// Numbers where a quantity belongs are accepted (`cpu: 1`, `memory: 1e9`),
/// as Kubernetes accepts them; they are retried as strings. Bounded, so a
/// pathological object cannot loop.
const MAX_QUANTITY_FIXES: usize = 256;

/// Map fields whose values are quantities, and single quantity fields.
const QUANTITY_MAPS: &[&str] = &[
    "limits",
    "requests",
    "hard",
    "used",
    "capacity",
    "allocatable",
    "overhead",
    "max",
    "min",
    "default",
    "defaultRequest",
    "maxLimitRequestRatio",
];
const QUANTITY_FIELDS: &[&str] = &["sizeLimit", "divisor"];

fn roundtrip<T: DeserializeOwned + Serialize>(mut input: Cow<'_, Value>) -> Result<Value, FieldError> {
    for _ in 0..=MAX_QUANTITY_FIXES {
        let err = match serde_path_to_error::deserialize::<_, T>(&*input) {
            Ok(typed) => {
                return serde_json::to_value(&typed).map_err(|e| FieldError::type_invalid("", e.to_string()));
            }
            Err(e) => e,
        };
        if fix_quantity(input.to_mut(), err.path()) {
            continue;
        }
        return Err(FieldError::type_invalid(kube_path(err.path()), err.into_inner().to_string()));
    }
    Err(FieldError::type_invalid("", "too many numeric quantities"))
}

/// `spec.containers[0].ports[0].containerPort` from serde_path_to_error's path.
fn kube_path(path: &serde_path_to_error::Path) -> String {
    let mut p = Path::new("");
    for seg in path.iter() {
        p = match seg {
            serde_path_to_error::Segment::Seq { index } => p.index(*index),
            serde_path_to_error::Segment::Map { key } => p.child(key),
            serde_path_to_error::Segment::Enum { variant } => p.child(variant),
            serde_path_to_error::Segment::Unknown => p.child("?"),
        };
    }
    p.into()
}

/// If the error is at a number in a quantity position, turns it into its
/// string form and says so.
fn fix_quantity(input: &mut Value, path: &serde_path_to_error::Path) -> bool {
    let segs: Vec<&serde_path_to_error::Segment> = path.iter().collect();
    let Some(last) = segs.last() else { return false };
    let is_quantity = match last {
        serde_path_to_error::Segment::Map { key } if QUANTITY_FIELDS.contains(&key.as_str()) => true,
        serde_path_to_error::Segment::Map { .. } => matches!(
            segs.len().checked_sub(2).and_then(|i| segs.get(i)),
            Some(serde_path_to_error::Segment::Map { key }) if QUANTITY_MAPS.contains(&key.as_str())
        ),
        _ => false,
    };
    if !is_quantity {
        return false;
    }
    let mut cur = input;
    for seg in &segs {
        let next = match seg {
            serde_path_to_error::Segment::Seq { index } => cur.get_mut(*index),
            serde_path_to_error::Segment::Map { key } => cur.get_mut(key.as_str()),
            _ => None,
        };
        match next {
            Some(n) => cur = n,
            None => return false,
        }
    }
    match cur {
        Value::Number(n) => {
            *cur = Value::String(n.to_string());
            true
        }
        _ => false,
    }
}

/// `stringData` is write-only: Kubernetes merges it into `data` (base64),
/// its keys winning, and drops it.
fn merge_string_data(input: &mut Value) -> Result<(), FieldError> {
    use base64::Engine as _;
    let Some(m) = input.as_object_mut() else { return Ok(()) };
    let Some(sd) = m.remove("stringData") else { return Ok(()) };
    let sd = match sd {
        Value::Null => return Ok(()),
        Value::Object(sd) => sd,
        other => {
            return Err(FieldError::type_invalid(
                "stringData",
                format!("invalid type: {}, expected a map", json_type(&other)),
            ))
        }
    };
    let data = m.entry("data").or_insert_with(|| Value::Object(Map::new()));
    if data.is_null() {
        *data = Value::Object(Map::new());
    }
    let Some(data) = data.as_object_mut() else {
        return Err(FieldError::type_invalid("data", "invalid type, expected a map"));
    };
    for (k, v) in sd {
        let Some(s) = v.as_str() else {
            return Err(FieldError::type_invalid(
                Path::new("stringData").child(&k),
                format!("invalid type: {}, expected a string", json_type(&v)),
            ));
        };
        data.insert(k, Value::String(base64::engine::general_purpose::STANDARD.encode(s)));
    }
    Ok(())
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "sequence",
        Value::Object(_) => "map",
    }
}

// ---- small readers shared by the rule modules; a wrong shape reads as missing

static NULL: Value = Value::Null;

/// `v[key]`, or null.
pub(crate) fn get<'a>(v: &'a Value, key: &str) -> &'a Value {
    v.as_object().and_then(|m| m.get(key)).unwrap_or(&NULL)
}

/// The string at `v[key]`, or "".
pub(crate) fn get_str<'a>(v: &'a Value, key: &str) -> &'a str {
    get(v, key).as_str().unwrap_or("")
}

/// The array at `v[key]`, or an empty slice.
pub(crate) fn get_arr<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    get(v, key).as_array().map(Vec::as_slice).unwrap_or(&[])
}

/// The object at `v[key]`, if any.
pub(crate) fn get_obj<'a>(v: &'a Value, key: &str) -> Option<&'a Map<String, Value>> {
    get(v, key).as_object()
}

/// The integer at `v[key]`, if any.
pub(crate) fn get_i64(v: &Value, key: &str) -> Option<i64> {
    get(v, key).as_i64()
}

/// A string map (`labels`) as (key, value) pairs; non-string values read as "".
pub(crate) fn string_pairs(v: &Value) -> Vec<(&str, &str)> {
    v.as_object().map(|m| m.iter().map(|(k, v)| (k.as_str(), v.as_str().unwrap_or(""))).collect()).unwrap_or_default()
}

/// Whether a value is absent: null, or an empty object, array or string.
pub(crate) fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::String(s) => s.is_empty(),
        _ => false,
    }
}

/// `field.Invalid` for each message of a name check.
pub(crate) fn invalid_each(path: &Path, value: &str, msgs: Vec<String>) -> Vec<FieldError> {
    msgs.into_iter().map(|m| FieldError::invalid(path, &Value::String(value.to_string()), m)).collect()
}

/// Kubernetes' `ValidateNonnegativeField` on an optional integer.
pub(crate) fn nonnegative(v: &Value, key: &str, path: &Path) -> Option<FieldError> {
    match get_i64(v, key) {
        Some(n) if n < 0 => Some(FieldError::invalid(path.child(key), &Value::from(n), IS_NEGATIVE)),
        _ => None,
    }
}

pub(crate) const IS_NEGATIVE: &str = "must be greater than or equal to 0";
pub(crate) const IMMUTABLE: &str = "field is immutable";

/// Two values equal for immutability checks: null, missing and empty are one.
pub(crate) fn same(a: &Value, b: &Value) -> bool {
    (is_empty(a) && is_empty(b)) || a == b
}
