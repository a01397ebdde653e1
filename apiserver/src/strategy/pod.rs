//! Pods: graceful deletion (a pod on a node gets its termination grace
//! period to stop), and the `binding` subresource, the one way a pod's
//! node is set.

use serde_json::{json, Value};
use skiff_api::field::{FieldError, Path};
use skiff_api::resources::ResourceInfo;
use skiff_api::{meta, validation, ApiError};

use super::Strategy;

pub struct Pod;

impl Strategy for Pod {
    fn validate_update(&self, info: &ResourceInfo, obj: &Value, old: &Value, subresource: &str) -> Vec<FieldError> {
        if subresource == "binding" {
            // Binding sets the node and the PodScheduled condition: the rest
            // of the spec is as stored, validated when it was written.
            let mut errors = validation::validate_metadata(info, obj, Some(old));
            let node = &obj["spec"]["nodeName"];
            for problem in validation::is_dns1123_subdomain(node.as_str().unwrap_or_default()) {
                errors.push(FieldError::invalid("spec.nodeName", node, problem));
            }
            return errors;
        }
        if subresource == "status" && obj["spec"] == old["spec"] {
            // A status write leaves the spec as stored, validated when it was
            // written (Kubernetes checks only metadata and status here too).
            return validation::validate_metadata(info, obj, Some(old));
        }
        if subresource == "ephemeralcontainers" {
            // The pod update rule judges the rest with the new list taken
            // as it was; the list itself may only grow.
            let mut old_rest = old.clone();
            old_rest["spec"]["ephemeralContainers"] = obj["spec"]["ephemeralContainers"].clone();
            let mut errors = validation::validate(info, obj, Some(&old_rest));
            errors.extend(validate_ephemeral_containers(&obj["spec"], &old["spec"]));
            return errors;
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

/// Fields a container has that an ephemeral container may not set
/// (Kubernetes' `validateEphemeralContainers`): it is not served, probed,
/// sized or hooked, and runs once.
const NOT_FOR_EPHEMERAL: [&str; 8] = [
    "ports",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
    "resources",
    "resizePolicy",
    "restartPolicy",
];

/// `pods/ephemeralcontainers`: ephemeral containers may be added, never
/// changed or removed; each needs a name no other container of the pod has
/// and an image; and none sets what only regular containers may.
fn validate_ephemeral_containers(spec: &Value, old_spec: &Value) -> Vec<FieldError> {
    let path = Path::new("spec").child("ephemeralContainers");
    let listed = |s: &Value, key: &str| s[key].as_array().cloned().unwrap_or_default();
    let (new, old) = (listed(spec, "ephemeralContainers"), listed(old_spec, "ephemeralContainers"));
    let mut errors = Vec::new();
    for (i, before) in old.iter().enumerate() {
        let name = before["name"].as_str().unwrap_or_default();
        match new.iter().find(|c| c["name"] == before["name"]) {
            None => errors.push(FieldError::forbidden(
                &path,
                format!("existing ephemeral containers \"{name}\" may not be removed"),
            )),
            Some(after) if after != before => errors.push(FieldError::forbidden(
                path.index(i),
                format!("existing ephemeral containers \"{name}\" may not be changed"),
            )),
            Some(_) => {}
        }
    }
    let regular: Vec<Value> = listed(spec, "containers").into_iter().chain(listed(spec, "initContainers")).collect();
    let names = || regular.iter().chain(&new).filter_map(|c| c["name"].as_str());
    let mut seen = std::collections::HashSet::new();
    for (i, c) in new.iter().enumerate() {
        let at = path.index(i);
        let name = c["name"].as_str().unwrap_or_default();
        if name.is_empty() {
            errors.push(FieldError::required(at.child("name"), ""));
        } else if regular.iter().any(|r| r["name"] == c["name"]) || !seen.insert(name) {
            errors.push(FieldError::duplicate(at.child("name"), &c["name"]));
        }
        if c["image"].as_str().is_none_or(str::is_empty) {
            errors.push(FieldError::required(at.child("image"), ""));
        }
        // `kubectl debug --target`: the process namespace to join.
        let target = c["targetContainerName"].as_str().unwrap_or_default();
        if !target.is_empty() && (target == name || !names().any(|n| n == target)) {
            errors.push(FieldError::not_found(at.child("targetContainerName"), &c["targetContainerName"]));
        }
        for field in NOT_FOR_EPHEMERAL {
            // kubectl debug sends `resources: {}`: empty counts as unset.
            let set = |v: &Value| match v {
                Value::Null => false,
                Value::Object(m) => !m.is_empty(),
                Value::Array(a) => !a.is_empty(),
                _ => true,
            };
            if c.get(field).is_some_and(set) {
                errors.push(FieldError::forbidden(at.child(field), "cannot be set for an Ephemeral Container"));
            }
        }
    }
    errors
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
    fn ephemeral_containers_may_be_added_but_not_changed_removed_or_served() {
        let info = resources::of(Kind::Pod);
        let pod = |ephemeral: Value| {
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
                   "spec": {"restartPolicy": "Always", "dnsPolicy": "ClusterFirst",
                            "containers": [{"name": "web", "image": "busybox", "imagePullPolicy": "IfNotPresent",
                                            "terminationMessagePolicy": "File"}],
                            "ephemeralContainers": ephemeral}})
        };
        let debugger = json!({"name": "debugger", "image": "busybox", "stdin": true, "tty": true});
        let old = pod(json!([]));
        let added = pod(json!([debugger]));
        let errors = |new: &Value, old: &Value| {
            Pod.validate_update(info, new, old, "ephemeralcontainers").iter().map(|e| e.to_string()).collect::<Vec<_>>()
        };
        assert_eq!(errors(&added, &old), Vec::<String>::new());
        // The same list through the pod itself is a forbidden spec change.
        assert!(!Pod.validate_update(info, &added, &old, "").is_empty());

        let removed = errors(&old, &added);
        assert!(removed.iter().any(|e| e.contains("may not be removed")), "{removed:?}");
        let changed = errors(&pod(json!([{"name": "debugger", "image": "other"}])), &added);
        assert!(changed.iter().any(|e| e.contains("may not be changed")), "{changed:?}");
        let clash = errors(&pod(json!([{"name": "web", "image": "busybox"}])), &old);
        assert!(
            clash.iter().any(|e| e.contains("spec.ephemeralContainers[0].name") && e.contains("Duplicate")),
            "{clash:?}"
        );
        let served = errors(&pod(json!([{"name": "d", "image": "b", "ports": [{"containerPort": 80}]}])), &old);
        assert!(served.iter().any(|e| e.contains("spec.ephemeralContainers[0].ports")), "{served:?}");
        assert_eq!(errors(&pod(json!([{"name": "d", "image": "b", "resources": {}}])), &old), Vec::<String>::new());
        let imageless = errors(&pod(json!([{"name": "d"}])), &old);
        assert!(imageless.iter().any(|e| e.contains("spec.ephemeralContainers[0].image")), "{imageless:?}");
        let targets =
            |target: &str| errors(&pod(json!([{"name": "d", "image": "b", "targetContainerName": target}])), &old);
        assert_eq!(targets("web"), Vec::<String>::new());
        for missing in ["nginx", "d"] {
            let found = targets(missing);
            assert_eq!(
                found,
                vec![format!("spec.ephemeralContainers[0].targetContainerName: Not found: \"{missing}\"")],
                "{missing}"
            );
        }
    }

    #[test]
    fn a_binding_checks_its_node_name_and_a_status_write_its_metadata_not_the_stored_spec() {
        let info = resources::of(Kind::Pod);
        // Stored before some rule it breaks: no containers.
        let stored = json!({"metadata": {"name": "p", "namespace": "default"}, "spec": {}, "status": {}});
        let bound = bind(info, &stored, "node-1").unwrap();
        assert_eq!(Pod.validate_update(info, &bound, &stored, "binding"), vec![]);
        let bad = bind(info, &stored, "Node_1").unwrap();
        let errors = Pod.validate_update(info, &bad, &stored, "binding");
        assert!(!errors.is_empty() && errors.iter().all(|e| e.field == "spec.nodeName"), "{errors:?}");

        let mut running = bound.clone();
        running["status"]["phase"] = json!("Running");
        assert_eq!(Pod.validate_update(info, &running, &bound, "status"), vec![]);
        let mut renamed = running.clone();
        renamed["metadata"]["name"] = json!("q");
        assert!(!Pod.validate_update(info, &renamed, &bound, "status").is_empty(), "metadata is still checked");
        let mut respecced = running.clone();
        respecced["spec"]["containers"] = json!([]);
        let errors = Pod.validate_update(info, &respecced, &bound, "status");
        assert!(errors.iter().any(|e| e.field == "spec.containers"), "a changed spec is checked: {errors:?}");
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
