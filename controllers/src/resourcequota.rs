//! The ResourceQuota controller's logic: `status.used` recomputed exactly
//! from the namespace's objects, for the keys the quota's `spec.hard`
//! names, as Kubernetes' `pkg/controller/resourcequota` and the quota
//! evaluators document it. Admission (refusing a create that would exceed
//! `hard`) is the apiserver's part; this keeps the numbers it checks true.
//!
//! Keys understood:
//! - object counts: `pods`, `services`, `configmaps`, `secrets`,
//!   `persistentvolumeclaims`, `replicationcontrollers`, `resourcequotas`,
//!   and `count/<resource>` or `count/<resource>.<group>` for any kind;
//! - compute over the non-terminal pods (phase not `Succeeded`/`Failed`):
//!   `requests.<name>` (also bare `cpu`, `memory`, `ephemeral-storage`) and
//!   `limits.<name>`. A pod's amount is the larger of its containers' sum
//!   and its largest init container, plus `overhead`; a container without a
//!   request uses its limit, as defaulting does.
//!
//! Other keys are left out of `status.used`. `status.hard` mirrors
//! `spec.hard`. The status is written only when it changes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, ResourceQuota, ResourceQuotaStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use skiff_api::validation::quantity::Quantity;

use crate::action::Action;

/// The object counts a quota needs, keyed as [`counted_resources`] names
/// them (`services`, `deployments.apps`): the number of such objects in
/// the quota's namespace.
pub type ObjectCounts = BTreeMap<String, i64>;

/// The core resources whose bare name counts objects (`pods` is counted
/// from the pods themselves).
const BARE_COUNTS: [&str; 6] =
    ["services", "configmaps", "secrets", "persistentvolumeclaims", "replicationcontrollers", "resourcequotas"];

/// The resources (`<resource>` for the core group, `<resource>.<group>`
/// otherwise) whose objects the wiring must count for `quota`. Pods are
/// not listed: they are passed whole.
pub fn counted_resources(quota: &ResourceQuota) -> Vec<String> {
    let mut out: Vec<String> = hard(quota)
        .keys()
        .filter_map(|key| match Key::parse(key) {
            Key::Count(resource) if resource != "pods" => Some(resource),
            _ => None,
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Reconciles one quota. `pods` are all pods of its namespace; `counts`
/// the number of objects per [`counted_resources`] entry (missing means 0).
/// Returns the status update, if the status changed.
pub fn reconcile(quota: &ResourceQuota, pods: &[Pod], counts: &ObjectCounts) -> Option<Action> {
    if quota.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let hard = hard(quota);
    let live: Vec<&Pod> = pods.iter().filter(|p| !is_terminal(p)).collect();
    let mut used = BTreeMap::new();
    for (key, limit) in &hard {
        let value = match Key::parse(key) {
            Key::Count(resource) if resource == "pods" => Some(count(live.len())),
            Key::Count(resource) => Some(count(usize::try_from(*counts.get(&resource).unwrap_or(&0)).unwrap_or(0))),
            Key::Requests(name) => Some(sum(&live, &name, Side::Requests, Quantity::is_binary_form(&limit.0))),
            Key::Limits(name) => Some(sum(&live, &name, Side::Limits, Quantity::is_binary_form(&limit.0))),
            Key::Unknown => None,
        };
        if let Some(v) = value {
            used.insert(key.clone(), ApiQuantity(v));
        }
    }
    let status = ResourceQuotaStatus { hard: Some(hard), used: Some(used) };
    let old = quota.status.clone().unwrap_or_default();
    if same_quantities(old.hard.as_ref(), status.hard.as_ref())
        && same_quantities(old.used.as_ref(), status.used.as_ref())
    {
        return None;
    }
    let mut updated = quota.clone();
    updated.status = Some(status);
    serde_json::to_value(&updated).ok().map(Action::UpdateStatus)
}

fn hard(quota: &ResourceQuota) -> BTreeMap<String, ApiQuantity> {
    quota.spec.as_ref().and_then(|s| s.hard.clone()).unwrap_or_default()
}

/// What a `spec.hard` key measures.
#[derive(Debug, PartialEq)]
enum Key {
    /// Objects of a resource (`pods`, `services`, `deployments.apps`).
    Count(String),
    /// The pods' requests of a resource (`cpu`).
    Requests(String),
    /// The pods' limits of a resource.
    Limits(String),
    Unknown,
}

impl Key {
    fn parse(key: &str) -> Key {
        if let Some(resource) = key.strip_prefix("count/") {
            return Key::Count(resource.to_string());
        }
        if key == "pods" || BARE_COUNTS.contains(&key) {
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

#[derive(Clone, Copy)]
enum Side {
    Requests,
    Limits,
}

/// The total of one resource over the pods, printed canonically: with
/// binary suffixes when the quota's limit or the pods' amounts use them,
/// as memory usually does.
fn sum(pods: &[&Pod], resource: &str, side: Side, binary: bool) -> String {
    let mut total = Quantity::ZERO;
    let mut binary = binary;
    for pod in pods {
        if let Some((q, pod_binary)) = pod_amount(pod, resource, side) {
            total = total.checked_add(&q).unwrap_or(total);
            binary |= pod_binary;
        }
    }
    total.format(binary)
}

/// One pod's amount: max(sum of containers, largest init container) plus
/// the pod overhead; and whether any of it was written in binary form.
fn pod_amount(pod: &Pod, resource: &str, side: Side) -> Option<(Quantity, bool)> {
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
            if q.compare(&amount) == std::cmp::Ordering::Greater {
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

fn is_terminal(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

fn count(n: usize) -> String {
    n.to_string()
}

/// Equal maps of equal values (`1000m` equals `1`), so a status written in
/// another form is not rewritten.
fn same_quantities(a: Option<&BTreeMap<String, ApiQuantity>>, b: Option<&BTreeMap<String, ApiQuantity>>) -> bool {
    let empty = BTreeMap::new();
    let (a, b) = (a.unwrap_or(&empty), b.unwrap_or(&empty));
    a.len() == b.len()
        && a.iter().zip(b).all(|((ka, va), (kb, vb))| {
            ka == kb
                && match (Quantity::parse(&va.0), Quantity::parse(&vb.0)) {
                    (Some(x), Some(y)) => x.compare(&y) == std::cmp::Ordering::Equal,
                    _ => va.0 == vb.0,
                }
        })
}

#[cfg(test)]
mod tests;
