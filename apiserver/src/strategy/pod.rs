//! Pods: graceful deletion (a pod on a node gets its termination grace
//! period to stop), and the `binding` subresource, the one way a pod's
//! node is set.

use serde_json::{json, Value};
use skiff_api::field::FieldError;
use skiff_api::resources::ResourceInfo;
use skiff_api::{meta, validation, ApiError};

use super::Strategy;

pub struct Pod;

impl Strategy for Pod {
    fn validate_update(&self, info: &ResourceInfo, obj: &Value, old: &Value, subresource: &str) -> Vec<FieldError> {
        if subresource == "binding" {
            // Binding sets the node; the pod update rule (spec immutable)
            // judges everything else.
            let mut old = old.clone();
            old["spec"]["nodeName"] = obj["spec"]["nodeName"].clone();
            return validation::validate(info, obj, Some(&old));
        }
        validation::validate(info, obj, Some(old))
    }

    /// A pod running on a node gets `asked`, or its
    /// `terminationGracePeriodSeconds` (30 by default); one not scheduled
    /// or already finished has nothing to stop.
    fn grace_period(&self, obj: &Value, asked: Option<i64>) -> i64 {
        let scheduled = obj["spec"]["nodeName"].as_str().is_some_and(|n| !n.is_empty());
        let finished = matches!(obj["status"]["phase"].as_str(), Some("Succeeded") | Some("Failed"));
        if !scheduled || finished {
            return 0;
        }
        asked.unwrap_or_else(|| obj["spec"]["terminationGracePeriodSeconds"].as_i64().unwrap_or(30)).max(0)
    }
}

/// `pods/binding`: `current` assigned to `node`, with its `PodScheduled`
/// condition; refused for a pod being deleted or already assigned.
pub fn bind(info: &ResourceInfo, current: &Value, node: &str) -> Result<Value, ApiError> {
    let name = meta::name(current).unwrap_or_default();
    if meta::deletion_timestamp(current).is_some() {
        return Err(ApiError::conflict(info, name, "pod is being deleted, cannot be assigned to a host"));
    }
    if let Some(n) = current["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
        return Err(ApiError::conflict(info, name, &format!("pod {name} is already assigned to node \"{n}\"")));
    }
    let mut next = current.clone();
    next["spec"]["nodeName"] = json!(node);
    let condition = json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null,
            "lastTransitionTime": meta::now_rfc3339()});
    let conditions = next["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let mut conditions: Vec<Value> = conditions.into_iter().filter(|c| c["type"] != "PodScheduled").collect();
    conditions.push(condition);
    next["status"]["conditions"] = Value::Array(conditions);
    Ok(next)
}

#[cfg(test)]
mod tests {
    use skiff_api::resources::{self, Kind};

    use super::*;

    #[test]
    fn only_a_pod_running_on_a_node_gets_a_grace_period() {
        let running =
            json!({"spec": {"nodeName": "n1", "terminationGracePeriodSeconds": 5}, "status": {"phase": "Running"}});
        assert_eq!(Pod.grace_period(&running, None), 5);
        assert_eq!(Pod.grace_period(&running, Some(0)), 0);
        assert_eq!(Pod.grace_period(&json!({"spec": {"nodeName": "n1"}}), None), 30);
        assert_eq!(Pod.grace_period(&json!({"spec": {}}), Some(10)), 0);
        let done = json!({"spec": {"nodeName": "n1"}, "status": {"phase": "Succeeded"}});
        assert_eq!(Pod.grace_period(&done, Some(10)), 0);
    }

    #[test]
    fn binding_assigns_a_node_once() {
        let info = resources::of(Kind::Pod);
        let pod = json!({"metadata": {"name": "p"}, "spec": {}, "status": {"conditions": [{"type": "PodScheduled", "status": "False"}]}});
        let bound = bind(info, &pod, "n1").unwrap();
        assert_eq!(bound["spec"]["nodeName"], "n1");
        let conditions = bound["status"]["conditions"].as_array().unwrap();
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0]["status"], "True");
        assert_eq!(bind(info, &bound, "n2").unwrap_err().reason, skiff_api::Reason::Conflict);
    }
}
