//! NodeRestriction, Kubernetes' admission plugin of that name: a node
//! (`system:node:NAME` in `system:nodes`) writes only its own Node, its
//! own Lease in `kube-node-lease`, and pods bound to it: mirror pods it
//! creates for its static pods, the status of its pods, their deletion
//! and eviction. RBAC's `system:node` role says which kinds a node may
//! write at all; this says which objects.

use serde_json::Value;

use skiff_api::ApiError;

use crate::admission::{AdmissionPlugin, Attributes};

/// The group every node's identity is in.
pub const NODES_GROUP: &str = "system:nodes";
const NODE_USER_PREFIX: &str = "system:node:";
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// The node a user is, if it is one.
pub fn node_name(user: &crate::admission::UserInfo) -> Option<&str> {
    let name = user.name.strip_prefix(NODE_USER_PREFIX)?;
    (user.groups.iter().any(|g| g == NODES_GROUP) && !name.is_empty()).then_some(name)
}

pub struct NodeRestriction;

fn refused(message: String) -> ApiError {
    ApiError::forbidden(message)
}

fn node_of(pod: &Value) -> &str {
    pod.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or_default()
}

impl AdmissionPlugin for NodeRestriction {
    fn name(&self) -> &'static str {
        "NodeRestriction"
    }

    fn validate(&self, attrs: &Attributes<'_>, object: &Value, old: Option<&Value>) -> Result<(), ApiError> {
        let Some(node) = node_name(attrs.user) else { return Ok(()) };
        let (group, resource) = (attrs.resource.group, attrs.resource.plural);
        match (group, resource) {
            ("", "nodes") if attrs.name != node => {
                Err(refused(format!("node {node:?} is not allowed to modify node {:?}", attrs.name)))
            }
            ("coordination.k8s.io", "leases") if attrs.namespace == NODE_LEASE_NAMESPACE && attrs.name != node => {
                Err(refused(format!("node {node:?} is not allowed to modify lease {:?}", attrs.name)))
            }
            ("", "pods") => pod(node, attrs, object, old),
            _ => Ok(()),
        }
    }
}

/// A node's writes of pods: mirror pods bound to it, and the status,
/// deletion and eviction of pods bound to it.
fn pod(node: &str, attrs: &Attributes<'_>, object: &Value, old: Option<&Value>) -> Result<(), ApiError> {
    let bound = old.map_or(node_of(object), node_of);
    match (attrs.verb, attrs.subresource) {
        ("create", "") => {
            let mirror = object.pointer("/metadata/annotations").and_then(|a| a.get(MIRROR_ANNOTATION)).is_some();
            if !mirror {
                return Err(refused(format!(
                    "pod does not have \"{MIRROR_ANNOTATION}\" annotation, node {node:?} can only create mirror pods"
                )));
            }
            if node_of(object) != node {
                return Err(refused(format!("node {node:?} can only create pods with spec.nodeName set to itself")));
            }
            Ok(())
        }
        (_, "status") | ("delete", "") | (_, "eviction") if bound == node => Ok(()),
        (_, "status") => {
            Err(refused(format!("node {node:?} can only update pod status for pods with spec.nodeName set to itself")))
        }
        ("delete", "") | (_, "eviction") => {
            Err(refused(format!("node {node:?} can only delete pods with spec.nodeName set to itself")))
        }
        _ => Err(refused(format!("node {node:?} can only update the status of pods, not their spec"))),
    }
}

/// The pod a node's TokenRequest binds its token to, by name; the
/// request is refused unless it names one (Kubernetes: a node asks only
/// for tokens bound to its pods).
pub fn token_pod(node: &str, request: &Value) -> Result<String, ApiError> {
    let bound = request.pointer("/spec/boundObjectRef");
    let kind = bound.and_then(|b| b.get("kind")).and_then(Value::as_str).unwrap_or_default();
    let name = bound.and_then(|b| b.get("name")).and_then(Value::as_str).unwrap_or_default();
    if kind != "Pod" || name.is_empty() {
        return Err(refused(format!("node {node:?} requested a token not bound to a pod")));
    }
    Ok(name.to_string())
}

/// A node's TokenRequest bound to `pod` (as stored; `None`: no such pod):
/// only for a pod bound to the node, and with that pod's uid if it names one.
pub fn token_request(node: &str, request: &Value, pod: Option<&Value>) -> Result<(), ApiError> {
    let Some(pod) = pod.filter(|p| node_of(p) == node) else {
        return Err(refused(format!("node {node:?} requested a token bound to a pod scheduled on a different node")));
    };
    let wanted = request.pointer("/spec/boundObjectRef/uid").and_then(Value::as_str).unwrap_or_default();
    if !wanted.is_empty() && pod.pointer("/metadata/uid").and_then(Value::as_str) != Some(wanted) {
        return Err(refused(format!("node {node:?} requested a token bound to a pod with a different uid")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use skiff_api::resources;

    use super::*;
    use crate::admission::UserInfo;

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo { name: name.into(), groups: groups.iter().map(|g| g.to_string()).collect() }
    }

    /// `what`: verb, resource, subresource, namespace, name.
    fn check(who: &UserInfo, what: [&str; 5], obj: Value, old: Option<Value>) -> Result<(), String> {
        let [verb, plural, sub, ns, name] = what;
        let resource = resources::catalog().iter().find(|r| r.plural == plural).expect("a built-in resource");
        let attrs = Attributes { user: who, verb, resource, subresource: sub, namespace: ns, name };
        NodeRestriction.validate(&attrs, &obj, old.as_ref()).map_err(|e| e.message)
    }

    fn pod_on(node: &str) -> Value {
        json!({"metadata": {"name": "p"}, "spec": {"nodeName": node}})
    }

    #[test]
    fn a_node_writes_its_own_node_lease_and_pods_and_nothing_of_another_node() {
        let a = user("system:node:a", &[NODES_GROUP, "system:authenticated"]);
        assert!(check(&a, ["update", "nodes", "status", "", "a"], json!({}), Some(json!({}))).is_ok());
        let e = check(&a, ["patch", "nodes", "status", "", "b"], json!({}), Some(json!({}))).unwrap_err();
        assert_eq!(e, "node \"a\" is not allowed to modify node \"b\"");
        assert!(check(&a, ["delete", "nodes", "", "", "b"], json!({}), Some(json!({}))).is_err());
        assert!(check(&a, ["update", "leases", "", NODE_LEASE_NAMESPACE, "a"], json!({}), Some(json!({}))).is_ok());
        assert!(check(&a, ["update", "leases", "", NODE_LEASE_NAMESPACE, "b"], json!({}), Some(json!({}))).is_err());

        // Pods: status, deletion and eviction of its own; mirror pods only.
        assert!(check(&a, ["update", "pods", "status", "ns", "p"], pod_on("a"), Some(pod_on("a"))).is_ok());
        let e = check(&a, ["update", "pods", "status", "ns", "p"], pod_on("b"), Some(pod_on("b"))).unwrap_err();
        assert!(e.contains("can only update pod status for pods with spec.nodeName set to itself"), "{e}");
        // Rebinding someone else's pod to itself through its status: the old pod decides.
        assert!(check(&a, ["update", "pods", "status", "ns", "p"], pod_on("a"), Some(pod_on("b"))).is_err());
        assert!(check(&a, ["delete", "pods", "", "ns", "p"], pod_on("a"), Some(pod_on("a"))).is_ok());
        assert!(check(&a, ["delete", "pods", "", "ns", "p"], pod_on("b"), Some(pod_on("b"))).is_err());
        assert!(check(&a, ["update", "pods", "", "ns", "p"], pod_on("a"), Some(pod_on("a"))).is_err());
        let e = check(&a, ["create", "pods", "", "ns", "p"], pod_on("a"), None).unwrap_err();
        assert!(e.contains("can only create mirror pods"), "{e}");
        let mut mirror = pod_on("a");
        mirror["metadata"]["annotations"] = json!({MIRROR_ANNOTATION: "hash"});
        assert!(check(&a, ["create", "pods", "", "ns", "p"], mirror.clone(), None).is_ok());
        mirror["spec"]["nodeName"] = json!("b");
        assert!(check(&a, ["create", "pods", "", "ns", "p"], mirror, None).is_err());

        // Anyone else, and a user named like a node outside the group, is
        // not this plugin's to judge.
        let admin = user("admin", &["system:masters"]);
        assert!(check(&admin, ["update", "pods", "", "ns", "p"], pod_on("b"), Some(pod_on("b"))).is_ok());
        let impostor = user("system:node:a", &["system:authenticated"]);
        assert_eq!(node_name(&impostor), None);
        // Other kinds go to RBAC alone.
        assert!(check(&a, ["create", "events", "", "ns", "e"], json!({}), None).is_ok());
    }

    #[test]
    fn a_node_asks_for_tokens_only_for_its_own_pods() {
        let request =
            |kind: &str, uid: &str| json!({"spec": {"boundObjectRef": {"kind": kind, "name": "p", "uid": uid}}});
        let mut pod = pod_on("a");
        pod["metadata"]["uid"] = json!("u1");
        assert_eq!(token_pod("a", &request("Pod", "u1")).unwrap(), "p");
        assert!(token_pod("a", &request("Secret", "u1")).unwrap_err().message.contains("not bound to a pod"));
        assert!(token_pod("a", &json!({"spec": {}})).is_err());
        assert!(token_request("a", &request("Pod", "u1"), Some(&pod)).is_ok());
        assert!(token_request("a", &request("Pod", ""), Some(&pod)).is_ok());
        let e = token_request("a", &request("Pod", "u2"), Some(&pod)).unwrap_err();
        assert!(e.message.contains("different uid"), "{}", e.message);
        assert!(token_request("b", &request("Pod", "u1"), Some(&pod)).unwrap_err().message.contains("different node"));
        assert!(token_request("a", &request("Pod", "u1"), None).is_err());
    }
}
