//! PodDisruptionBudget (`policy/v1`), as Kubernetes'
//! `ValidatePodDisruptionBudget` checks it: at most one of `minAvailable`
//! and `maxUnavailable`, each a non-negative integer or a percentage of at
//! most 100%, a valid selector and a known unhealthy-pod eviction policy.
//! Since `policy/v1` the spec may change; the status counts are never
//! negative.

use serde_json::Value;

use super::apps::{not_more_than_100_percent, positive_int_or_percent, validate_label_selector};
use super::{get, nonnegative};
use crate::field::{FieldError, Path};

/// `spec.unhealthyPodEvictionPolicy` values.
pub const UNHEALTHY_POD_EVICTION_POLICIES: &[&str] = &["AlwaysAllow", "IfHealthyBudget"];

pub(crate) fn validate_pod_disruption_budget(obj: &Value) -> Vec<FieldError> {
    let spec = get(obj, "spec");
    let path = Path::new("spec");
    let mut errs = Vec::new();
    let (min, max) = (get(spec, "minAvailable"), get(spec, "maxUnavailable"));
    if !min.is_null() && !max.is_null() {
        errs.push(FieldError::invalid(&path, spec, "minAvailable and maxUnavailable cannot be both set"));
    }
    for (key, value) in [("minAvailable", min), ("maxUnavailable", max)] {
        if value.is_null() {
            continue;
        }
        let p = path.child(key);
        errs.extend(positive_int_or_percent(value, &p));
        errs.extend(not_more_than_100_percent(value, &p));
    }
    let selector = get(spec, "selector");
    if !selector.is_null() {
        errs.extend(validate_label_selector(selector, &path.child("selector")));
    }
    let policy = get(spec, "unhealthyPodEvictionPolicy");
    if let Some(p) = policy.as_str() {
        if !UNHEALTHY_POD_EVICTION_POLICIES.contains(&p) {
            errs.push(FieldError::not_supported(
                path.child("unhealthyPodEvictionPolicy"),
                policy,
                UNHEALTHY_POD_EVICTION_POLICIES,
            ));
        }
    }
    let status = get(obj, "status");
    let sp = Path::new("status");
    for key in ["disruptionsAllowed", "currentHealthy", "desiredHealthy", "expectedPods"] {
        errs.extend(nonnegative(status, key, &sp));
    }
    errs
}
