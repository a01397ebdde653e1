//! Priority admission, as Kubernetes' `Priority` plugin: a pod's
//! `spec.priorityClassName` becomes its `spec.priority` (and
//! `spec.preemptionPolicy`) when it is created, so the scheduler and
//! preemption read one integer and never the class; a pod without a class
//! gets the global default class, or priority 0.
//!
//! It also keeps PriorityClasses consistent where validation of one object
//! cannot: at most one class is the global default, and the system classes
//! (which every master creates at start, [`system_priority_classes`]) are
//! never deleted.
//!
//! It is a step of the registry rather than an
//! [`AdmissionPlugin`](crate::admission::AdmissionPlugin) because it reads
//! the PriorityClasses from the store, which plugins cannot; the registry
//! calls [`admit`] before defaulting, so a priority the client did not send
//! is told apart from one it sent. The reads and the rules are apart: the
//! rules are plain functions of the classes read.

use std::sync::Arc;

use serde_json::{json, Value};
use skiff_api::resources::{self, Kind};
use skiff_api::validation::scheduling::SYSTEM_PRIORITY_CLASSES;
use skiff_api::ApiError;

use crate::admission::{forbidden, Attributes};
use crate::storage::{prefix_end, Consistency, ObjectStore};

/// The only namespace whose pods may use the system classes, as
/// Kubernetes' default quota configuration limits them.
const SYSTEM_NAMESPACE: &str = "kube-system";

/// Runs the priority rules on a write of `obj` (`old`: the stored object
/// on update and delete).
pub(crate) async fn admit(
    objects: &ObjectStore,
    attrs: &Attributes<'_>,
    obj: &mut Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    match (attrs.resource.kind_id, attrs.verb, attrs.subresource) {
        (Kind::Pod, "create", "") => {
            let named = obj["spec"]["priorityClassName"].as_str().filter(|n| !n.is_empty()).map(str::to_string);
            let mut classes = read_classes(objects, Consistency::Any).await?;
            if let Some(name) = &named {
                if !classes.iter().any(|c| class_name(c) == name) {
                    // Maybe created through another master and not applied here yet.
                    classes = read_classes(objects, Consistency::Linearizable).await?;
                }
            }
            resolve_pod(attrs, obj, &classes)
        }
        (Kind::Pod, "update" | "patch", _) => {
            if let Some(old) = old {
                keep_on_update(obj, old);
            }
            Ok(())
        }
        (Kind::PriorityClass, "create" | "update" | "patch", _) if obj["globalDefault"] == json!(true) => {
            // Another master may have just made another class the default.
            let classes = read_classes(objects, Consistency::Linearizable).await?;
            one_global_default(attrs, obj, &classes)
        }
        (Kind::PriorityClass, "delete", _) if is_system_class(attrs.name) => {
            Err(forbidden(attrs, "this is a system priority class and cannot be deleted"))
        }
        _ => Ok(()),
    }
}

/// The system classes, as the objects every cluster has.
pub fn system_priority_classes() -> Vec<Value> {
    let info = resources::of(Kind::PriorityClass);
    SYSTEM_PRIORITY_CLASSES
        .iter()
        .map(|(name, value, description)| {
            json!({"apiVersion": info.api_version(), "kind": info.kind, "metadata": {"name": name},
                   "value": value, "description": description})
        })
        .collect()
}

fn is_system_class(name: &str) -> bool {
    SYSTEM_PRIORITY_CLASSES.iter().any(|(n, _, _)| *n == name)
}

fn class_name(class: &Value) -> &str {
    class["metadata"]["name"].as_str().unwrap_or_default()
}

async fn read_classes(objects: &ObjectStore, consistency: Consistency) -> Result<Arc<[Value]>, ApiError> {
    let revision = objects.prepare_read(consistency).await?;
    let prefix = resources::of(Kind::PriorityClass).prefix();
    objects.range_decoded(prefix.as_bytes(), &prefix_end(prefix.as_bytes()), revision)
}

/// Sets a new pod's priority from its class, the global default class or
/// 0; refuses an unknown class, a system class outside `kube-system`, and
/// a priority or preemption policy the pod sent that the class does not
/// give.
fn resolve_pod(attrs: &Attributes<'_>, pod: &mut Value, classes: &[Value]) -> Result<(), ApiError> {
    let named = pod["spec"]["priorityClassName"].as_str().filter(|n| !n.is_empty()).map(str::to_string);
    let class = match &named {
        Some(name) => match classes.iter().find(|c| class_name(c) == name) {
            Some(class) => Some(class),
            None => return Err(forbidden(attrs, &format!("no PriorityClass with name {name} was found"))),
        },
        // Of several defaults (a race between masters), the lowest wins.
        None => classes
            .iter()
            .filter(|c| c["globalDefault"] == json!(true))
            .min_by_key(|c| c["value"].as_i64().unwrap_or_default()),
    };
    if let Some(name) = &named {
        if is_system_class(name) && attrs.namespace != SYSTEM_NAMESPACE {
            let scopes = SYSTEM_PRIORITY_CLASSES.map(|(n, _, _)| n).join(" ");
            return Err(forbidden(
                attrs,
                &format!("insufficient quota to match these scopes: [{{PriorityClass In [{scopes}]}}]"),
            ));
        }
    }
    let priority = class.and_then(|c| c["value"].as_i64()).unwrap_or(0);
    if let Some(sent) = pod["spec"]["priority"].as_i64() {
        if sent != priority {
            return Err(forbidden(
                attrs,
                &format!(
                    "the integer value of priority ({sent}) must not be provided in pod spec; priority admission controller computed {priority} from the given PriorityClass name"
                ),
            ));
        }
    }
    pod["spec"]["priority"] = json!(priority);
    if let Some(class) = class {
        if named.is_none() {
            pod["spec"]["priorityClassName"] = json!(class_name(class));
        }
        if let Some(policy) = class["preemptionPolicy"].as_str() {
            if let Some(sent) = pod["spec"]["preemptionPolicy"].as_str().filter(|s| *s != policy) {
                return Err(forbidden(
                    attrs,
                    &format!(
                        "the string value of PreemptionPolicy ({sent}) must not be provided in pod spec; priority admission controller computed {policy} from the given PriorityClass name"
                    ),
                ));
            }
            pod["spec"]["preemptionPolicy"] = json!(policy);
        }
    }
    Ok(())
}

/// An update that leaves out the priority (or preemption policy) keeps
/// the stored one, so a client that round-trips an old form of the pod
/// does not trip the rule that the spec is immutable.
fn keep_on_update(pod: &mut Value, old: &Value) {
    for field in ["priority", "preemptionPolicy"] {
        let missing = pod["spec"].get(field).is_none_or(Value::is_null);
        if let (true, Some(kept)) = (missing, old["spec"].get(field).filter(|v| !v.is_null())) {
            if let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) {
                spec.insert(field.to_string(), kept.clone());
            }
        }
    }
}

/// A class marked `globalDefault` is refused while another one is.
fn one_global_default(attrs: &Attributes<'_>, class: &Value, classes: &[Value]) -> Result<(), ApiError> {
    let name = class_name(class);
    match classes.iter().find(|c| c["globalDefault"] == json!(true) && class_name(c) != name) {
        Some(other) => Err(forbidden(
            attrs,
            &format!("PriorityClass {} is already marked as default. Only one default can exist", class_name(other)),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use skiff_api::{resources, Reason};

    use skiff_api::validation::scheduling::SYSTEM_PRIORITY_CLASS_PREFIX;

    use super::*;
    use crate::admission::UserInfo;

    fn attrs<'a>(user: &'a UserInfo, kind: Kind, verb: &'a str, namespace: &'a str, name: &'a str) -> Attributes<'a> {
        Attributes { user, verb, resource: resources::of(kind), subresource: "", namespace, name }
    }

    fn class(name: &str, value: i64) -> Value {
        json!({"metadata": {"name": name}, "value": value, "preemptionPolicy": "PreemptLowerPriority"})
    }

    fn pod(spec: Value) -> Value {
        json!({"metadata": {"name": "x", "namespace": "default"}, "spec": spec})
    }

    fn resolved(namespace: &str, spec: Value, classes: &[Value]) -> Result<Value, ApiError> {
        let user = UserInfo::anonymous();
        let mut p = pod(spec);
        resolve_pod(&attrs(&user, Kind::Pod, "create", namespace, "x"), &mut p, classes).map(|()| p)
    }

    #[test]
    fn a_pod_gets_the_value_and_policy_of_its_class() {
        let mut never = class("batch", 10);
        never["preemptionPolicy"] = json!("Never");
        let p = resolved("default", json!({"priorityClassName": "batch"}), &[class("high", 1000), never]).unwrap();
        assert_eq!(p["spec"]["priority"], 10);
        assert_eq!(p["spec"]["preemptionPolicy"], "Never");
    }

    #[test]
    fn a_pod_without_a_class_gets_the_global_default_or_zero() {
        assert_eq!(resolved("default", json!({}), &[class("high", 1000)]).unwrap()["spec"]["priority"], 0);
        let mut default = class("normal", 50);
        default["globalDefault"] = json!(true);
        let p = resolved("default", json!({}), &[class("high", 1000), default]).unwrap();
        assert_eq!(p["spec"]["priority"], 50);
        assert_eq!(p["spec"]["priorityClassName"], "normal");
    }

    #[test]
    fn an_unknown_class_is_forbidden_in_kubernetes_words() {
        let err = resolved("default", json!({"priorityClassName": "foo"}), &[class("high", 1000)]).unwrap_err();
        assert_eq!(err.reason, Reason::Forbidden);
        assert_eq!(err.message, "pods \"x\" is forbidden: no PriorityClass with name foo was found");
    }

    #[test]
    fn a_priority_the_class_does_not_give_is_forbidden_and_a_matching_one_is_kept() {
        let err = resolved("default", json!({"priorityClassName": "high", "priority": 5}), &[class("high", 1000)])
            .unwrap_err();
        assert_eq!(
            err.message,
            "pods \"x\" is forbidden: the integer value of priority (5) must not be provided in pod spec; priority admission controller computed 1000 from the given PriorityClass name"
        );
        let p = resolved("default", json!({"priorityClassName": "high", "priority": 1000}), &[class("high", 1000)]);
        assert_eq!(p.unwrap()["spec"]["priority"], 1000);
        let err = resolved("default", json!({"priority": 7}), &[]).unwrap_err();
        assert_eq!(err.reason, Reason::Forbidden);
    }

    #[test]
    fn system_classes_are_only_for_kube_system_pods() {
        let classes = system_priority_classes();
        let spec = json!({"priorityClassName": "system-node-critical"});
        let p = resolved("kube-system", spec.clone(), &classes).unwrap();
        assert_eq!(p["spec"]["priority"], 2_000_001_000);
        let err = resolved("default", spec, &classes).unwrap_err();
        assert_eq!(
            err.message,
            "pods \"x\" is forbidden: insufficient quota to match these scopes: [{PriorityClass In [system-node-critical system-cluster-critical]}]"
        );
    }

    #[test]
    fn only_one_class_may_be_the_global_default() {
        let user = UserInfo::anonymous();
        let mut existing = class("normal", 50);
        existing["globalDefault"] = json!(true);
        let mut second = class("other", 60);
        second["globalDefault"] = json!(true);
        let a = attrs(&user, Kind::PriorityClass, "create", "", "other");
        let err = one_global_default(&a, &second, &[existing.clone()]).unwrap_err();
        assert_eq!(err.reason, Reason::Forbidden);
        assert_eq!(
            err.message,
            "priorityclasses.scheduling.k8s.io \"other\" is forbidden: PriorityClass normal is already marked as default. Only one default can exist"
        );
        // Updating the default itself is fine.
        let a = attrs(&user, Kind::PriorityClass, "update", "", "normal");
        assert!(one_global_default(&a, &existing, &[existing.clone()]).is_ok());
    }

    #[test]
    fn an_update_without_the_priority_keeps_the_stored_one() {
        let old = pod(json!({"priority": 1000, "preemptionPolicy": "Never"}));
        let mut next = pod(json!({"containers": []}));
        keep_on_update(&mut next, &old);
        assert_eq!(next["spec"]["priority"], 1000);
        assert_eq!(next["spec"]["preemptionPolicy"], "Never");
    }

    #[test]
    fn the_system_classes_are_valid_priority_classes() {
        let info = resources::of(Kind::PriorityClass);
        for class in system_priority_classes() {
            // As the registry takes them: normalized, then defaulted.
            let mut normalized = skiff_api::validation::normalize(info, &class).unwrap();
            skiff_api::defaults::apply(info, &mut normalized);
            assert!(skiff_api::validation::validate(info, &normalized, None).is_empty(), "{class}");
            assert!(class_name(&class).starts_with(SYSTEM_PRIORITY_CLASS_PREFIX));
        }
    }
}
