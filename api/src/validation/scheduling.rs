//! PriorityClass, as Kubernetes' `ValidatePriorityClass` and
//! `ValidatePriorityClassUpdate` check it. The rules that need other
//! objects (one global default at most, a pod's class must exist) are the
//! apiserver's priority admission, not this.

use serde_json::Value;

use super::pod::one_of;
use super::{get, get_i64, get_str, same};
use crate::field::{FieldError, Path};

/// The highest value a user-defined class may have; above it are the
/// system classes.
pub const HIGHEST_USER_DEFINABLE_PRIORITY: i64 = 1_000_000_000;
/// Class names with this prefix are reserved for the system classes.
pub const SYSTEM_PRIORITY_CLASS_PREFIX: &str = "system-";
/// The value of `system-cluster-critical`.
pub const SYSTEM_CLUSTER_CRITICAL: i64 = 2_000_000_000;
/// The value of `system-node-critical`.
pub const SYSTEM_NODE_CRITICAL: i64 = SYSTEM_CLUSTER_CRITICAL + 1000;
/// The classes every cluster has: name, value, description.
pub const SYSTEM_PRIORITY_CLASSES: [(&str, i64, &str); 2] = [
    (
        "system-node-critical",
        SYSTEM_NODE_CRITICAL,
        "Used for system critical pods that must not be moved from their current node.",
    ),
    (
        "system-cluster-critical",
        SYSTEM_CLUSTER_CRITICAL,
        "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary.",
    ),
];
/// `preemptionPolicy` values, of classes and of pods.
pub const PREEMPTION_POLICIES: &[&str] = &["Never", "PreemptLowerPriority"];

/// Why a `system-` class is not one of the known ones, if it is not.
fn unknown_system_class(name: &str, value: i64, global_default: bool) -> Option<String> {
    let Some((_, known, _)) = SYSTEM_PRIORITY_CLASSES.iter().find(|(n, _, _)| *n == name) else {
        return Some(format!("{name} is not a known system priority class"));
    };
    if *known != value {
        return Some(format!("value of {name} PriorityClass must be {known}"));
    }
    global_default.then(|| format!("globalDefault of {name} PriorityClass must be false"))
}

pub(crate) fn validate_priority_class(obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let name = get_str(get(obj, "metadata"), "name");
    match get_i64(obj, "value") {
        None => errs.push(FieldError::required("value", "")),
        Some(value) if name.starts_with(SYSTEM_PRIORITY_CLASS_PREFIX) => {
            let global_default = get(obj, "globalDefault").as_bool() == Some(true);
            if let Some(why) = unknown_system_class(name, value, global_default) {
                errs.push(FieldError::forbidden(
                    "metadata.name",
                    format!(
                        "priority class names with '{SYSTEM_PRIORITY_CLASS_PREFIX}' prefix are reserved for system use only. error: {why}"
                    ),
                ));
            }
        }
        Some(value) if value > HIGHEST_USER_DEFINABLE_PRIORITY => errs.push(FieldError::forbidden(
            "value",
            format!("maximum allowed value of a user defined priority is {HIGHEST_USER_DEFINABLE_PRIORITY}"),
        )),
        Some(_) => {}
    }
    errs.extend(one_of(obj, "preemptionPolicy", PREEMPTION_POLICIES, &Path::new("preemptionPolicy")));
    if let Some(old) = old {
        if get_i64(obj, "value") != get_i64(old, "value") {
            errs.push(FieldError::forbidden("value", "may not be changed in an update."));
        }
        if !same(get(obj, "preemptionPolicy"), get(old, "preemptionPolicy")) {
            errs.push(FieldError::invalid("preemptionPolicy", get(obj, "preemptionPolicy"), super::IMMUTABLE));
        }
    }
    errs
}
