//! What a ResourceQuota measures, shared by the apiserver's admission
//! (which charges a create against `status.used`) and the controller
//! (which recomputes `status.used` from the objects): the meaning of each
//! `spec.hard` key, a pod's amount of a resource, and which pods a
//! quota's scopes select. Both sides must agree, or usage would drift
//! between a create and the next recount.

use std::cmp::Ordering;

use k8s_openapi::api::core::v1::{Container, Pod, ResourceQuotaSpec};

use crate::validation::quantity::Quantity;

/// The core resources whose bare name counts objects.
const BARE_COUNTS: [&str; 7] =
    ["pods", "services", "configmaps", "secrets", "persistentvolumeclaims", "replicationcontrollers", "resourcequotas"];

/// What a `spec.hard` key measures.
#[derive(Debug, PartialEq, Eq)]
pub enum Key {
    /// Objects of a resource (`pods`, `services`, `deployments.apps`).
    Count(String),
    /// The pods' requests of a resource (`cpu`).
    Requests(String),
    /// The pods' limits of a resource.
    Limits(String),
    Unknown,
}

impl Key {
    pub fn parse(key: &str) -> Key {
        if let Some(resource) = key.strip_prefix("count/") {
            return Key::Count(resource.to_string());
        }
        if BARE_COUNTS.contains(&key) {
            return Key::Count(key.to_string());
        }
        if let Some(name) = key.strip_prefix("requests.") {
            // `requests.storage` is PersistentVolumeClaim storage, not pods.
            return if name == "storage" { Key::Unknown } else { Key::Requests(name.to_string()) };
        }
        if let Some(name) = key.strip_prefix("limits.") {
            return Key::Limits(name.to_string());
        }
        match key {
            "cpu" | "memory" | "ephemeral-storage" => Key::Requests(key.to_string()),
            _ => Key::Unknown,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Side {
    Requests,
    Limits,
}

/// One pod's amount of `resource`: max(sum of containers, largest init
/// container) plus the pod overhead; and whether any of it was written in
/// binary form (`Mi`), so a total can be printed the same way.
pub fn pod_amount(pod: &Pod, resource: &str, side: Side) -> Option<(Quantity, bool)> {
    let spec = pod.spec.as_ref()?;
    let mut binary = false;
    let mut containers = Quantity::ZERO;
    for c in &spec.containers {
        if let Some(text) = container_amount(c, resource, side) {
            binary |= Quantity::is_binary_form(text);
            containers = containers.checked_add(&Quantity::parse(text)?)?;
        }
    }
    let mut amount = containers;
    for c in spec.init_containers.iter().flatten() {
        if let Some(text) = container_amount(c, resource, side) {
            binary |= Quantity::is_binary_form(text);
            let q = Quantity::parse(text)?;
            if q.compare(&amount) == Ordering::Greater {
                amount = q;
            }
        }
    }
    if let Some(text) = spec.overhead.as_ref().and_then(|o| o.get(resource)).map(|q| q.0.as_str()) {
        binary |= Quantity::is_binary_form(text);
        amount = amount.checked_add(&Quantity::parse(text)?)?;
    }
    Some((amount, binary))
}

/// A container's amount as written: its request, else its limit (what
/// defaulting would have set), or its limit.
fn container_amount<'a>(c: &'a Container, resource: &str, side: Side) -> Option<&'a str> {
    let resources = c.resources.as_ref()?;
    let limit = resources.limits.as_ref().and_then(|l| l.get(resource));
    let value = match side {
        Side::Limits => limit,
        Side::Requests => resources.requests.as_ref().and_then(|r| r.get(resource)).or(limit),
    }?;
    Some(value.0.as_str())
}

/// Succeeded and Failed pods use nothing.
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// The quota has `scopes` or a `scopeSelector`: it tracks pods only.
pub fn is_scoped(spec: &ResourceQuotaSpec) -> bool {
    spec.scopes.as_ref().is_some_and(|s| !s.is_empty())
        || spec.scope_selector.as_ref().and_then(|s| s.match_expressions.as_ref()).is_some_and(|e| !e.is_empty())
}

/// Whether a pod falls under every scope of the quota (`Terminating`:
/// it has an `activeDeadlineSeconds`; `BestEffort`: no requests or limits
/// of cpu or memory; `PriorityClass`: its class, by the selector's
/// operator). An unscoped quota selects every pod.
pub fn selects(spec: &ResourceQuotaSpec, pod: &Pod) -> bool {
    let scopes = spec.scopes.iter().flatten().map(|s| (s.as_str(), "Exists", &[][..]));
    let expressions = spec.scope_selector.as_ref().and_then(|s| s.match_expressions.as_ref());
    let selected = expressions
        .into_iter()
        .flatten()
        .map(|e| (e.scope_name.as_str(), e.operator.as_str(), e.values.as_deref().unwrap_or_default()));
    scopes.chain(selected).all(|(scope, operator, values)| matches_scope(scope, operator, values, pod))
}

fn matches_scope(scope: &str, operator: &str, values: &[String], pod: &Pod) -> bool {
    let spec = pod.spec.as_ref();
    let holds = match scope {
        "Terminating" => spec.is_some_and(|s| s.active_deadline_seconds.is_some()),
        "NotTerminating" => spec.is_none_or(|s| s.active_deadline_seconds.is_none()),
        "BestEffort" => is_best_effort(pod),
        "NotBestEffort" => !is_best_effort(pod),
        "PriorityClass" => {
            let class = spec.and_then(|s| s.priority_class_name.as_deref()).filter(|c| !c.is_empty());
            return match operator {
                "In" => class.is_some_and(|c| values.iter().any(|v| v == c)),
                "NotIn" => class.is_none_or(|c| !values.iter().any(|v| v == c)),
                "Exists" => class.is_some(),
                "DoesNotExist" => class.is_none(),
                _ => false,
            };
        }
        // CrossNamespacePodAffinity: no pod affinity term here spans
        // namespaces that the quota would have to limit.
        _ => false,
    };
    match operator {
        "DoesNotExist" => !holds,
        _ => holds,
    }
}

fn is_best_effort(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else { return true };
    spec.containers.iter().chain(spec.init_containers.iter().flatten()).all(|c| {
        let r = c.resources.as_ref();
        let empty = |m: Option<&std::collections::BTreeMap<String, _>>| {
            m.is_none_or(|m| !m.keys().any(|k| k == "cpu" || k == "memory"))
        };
        empty(r.and_then(|r| r.requests.as_ref())) && empty(r.and_then(|r| r.limits.as_ref()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
    }

    fn spec(v: serde_json::Value) -> ResourceQuotaSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn keys_parse_as_kubernetes_reads_them() {
        assert_eq!(Key::parse("pods"), Key::Count("pods".into()));
        assert_eq!(Key::parse("count/deployments.apps"), Key::Count("deployments.apps".into()));
        assert_eq!(Key::parse("cpu"), Key::Requests("cpu".into()));
        assert_eq!(Key::parse("requests.memory"), Key::Requests("memory".into()));
        assert_eq!(Key::parse("limits.cpu"), Key::Limits("cpu".into()));
        assert_eq!(Key::parse("requests.storage"), Key::Unknown);
        assert_eq!(Key::parse("gpus"), Key::Unknown);
    }

    #[test]
    fn scopes_select_pods_by_deadline_qos_and_priority_class() {
        let best_effort = pod(json!({"containers": [{"name": "c", "image": "i"}]}));
        let burstable = pod(json!({"containers": [{"name": "c", "image": "i",
            "resources": {"requests": {"cpu": "1"}}}], "activeDeadlineSeconds": 30, "priorityClassName": "high"}));
        let scoped = |scopes: serde_json::Value| spec(json!({"hard": {"pods": "1"}, "scopes": scopes}));
        assert!(selects(&spec(json!({"hard": {"pods": "1"}})), &best_effort));
        assert!(selects(&scoped(json!(["BestEffort"])), &best_effort));
        assert!(!selects(&scoped(json!(["BestEffort"])), &burstable));
        assert!(selects(&scoped(json!(["NotBestEffort", "Terminating"])), &burstable));
        assert!(!selects(&scoped(json!(["Terminating"])), &best_effort));
        assert!(selects(&scoped(json!(["NotTerminating"])), &best_effort));
        let by_class = |operator: &str, values: serde_json::Value| {
            spec(json!({"hard": {"pods": "1"}, "scopeSelector": {"matchExpressions": [
                {"scopeName": "PriorityClass", "operator": operator, "values": values}]}}))
        };
        assert!(selects(&by_class("In", json!(["high", "mid"])), &burstable));
        assert!(!selects(&by_class("In", json!(["high"])), &best_effort));
        assert!(selects(&by_class("NotIn", json!(["high"])), &best_effort));
        assert!(!selects(&by_class("NotIn", json!(["high"])), &burstable));
        assert!(selects(&by_class("Exists", json!([])), &burstable));
        assert!(selects(&by_class("DoesNotExist", json!([])), &best_effort));
        assert!(is_scoped(&by_class("Exists", json!([]))) && !is_scoped(&spec(json!({"hard": {}}))));
    }

    #[test]
    fn a_pod_amounts_to_its_containers_or_its_largest_init_container_plus_overhead() {
        let p = pod(json!({"containers": [
            {"name": "a", "image": "i", "resources": {"requests": {"cpu": "250m"}}},
            {"name": "b", "image": "i", "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}}}],
            "initContainers": [{"name": "i", "image": "i", "resources": {"requests": {"cpu": "1"}}}],
            "overhead": {"cpu": "100m"}}));
        let (cpu, _) = pod_amount(&p, "cpu", Side::Requests).unwrap();
        assert_eq!(cpu.format(false), "1100m");
        let (memory, binary) = pod_amount(&p, "memory", Side::Limits).unwrap();
        assert_eq!((memory.format(binary), binary), ("64Mi".to_string(), true));
    }
}
