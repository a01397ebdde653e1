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
//! A quota with scopes (`Terminating`, `BestEffort`, `PriorityClass` and
//! their opposites, by `scopes` or `scopeSelector`) counts only the pods
//! they select, and no other objects. What the keys and scopes mean is
//! `skiff_api::quota`'s, which admission shares.
//!
//! Other keys are left out of `status.used`. `status.hard` mirrors
//! `spec.hard`. The status is written only when it changes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, ResourceQuota, ResourceQuotaStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use skiff_api::quota::{is_scoped, is_terminal, pod_amount, selects, Key, Side};
use skiff_api::validation::quantity::Quantity;

use crate::action::Action;

/// The object counts a quota needs, keyed as [`counted_resources`] names
/// them (`services`, `deployments.apps`): the number of such objects in
/// the quota's namespace.
pub type ObjectCounts = BTreeMap<String, i64>;

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
    let spec = quota.spec.clone().unwrap_or_default();
    let live: Vec<&Pod> = pods.iter().filter(|p| !is_terminal(p) && selects(&spec, p)).collect();
    let mut used = BTreeMap::new();
    for (key, limit) in &hard {
        let value = match Key::parse(key) {
            Key::Count(resource) if resource == "pods" => Some(count(live.len())),
            // A scoped quota tracks pods only, as admission charges it.
            Key::Count(_) if is_scoped(&spec) => None,
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

/// Whether `update` (from [`reconcile`]) lowers any `used` value of
/// `quota`. Admission raises `used` in the same transaction that creates
/// an object, so a count lower than the quota's may only mean the caches
/// have not seen that object yet: the wiring recounts from a linearizable
/// read before writing such an update, or the next create could be
/// admitted over the limit.
pub fn lowers_usage(quota: &ResourceQuota, update: &Action) -> bool {
    let Action::UpdateStatus(updated) = update else { return false };
    let old = quota.status.as_ref().and_then(|s| s.used.as_ref());
    old.into_iter().flatten().any(|(key, before)| {
        let after = updated["status"]["used"][key].as_str().and_then(Quantity::parse);
        match (Quantity::parse(&before.0), after) {
            (Some(before), Some(after)) => after.compare(&before) == std::cmp::Ordering::Less,
            _ => false,
        }
    })
}

fn hard(quota: &ResourceQuota) -> BTreeMap<String, ApiQuantity> {
    quota.spec.as_ref().and_then(|s| s.hard.clone()).unwrap_or_default()
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
