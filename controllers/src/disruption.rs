//! The disruption controller's logic: a PodDisruptionBudget's status from
//! the pods it selects, as Kubernetes' `pkg/controller/disruption` keeps
//! it, so the eviction subresource can tell whether one more pod may go.
//!
//! - Pods: those of the budget's namespace its selector matches (a
//!   missing selector matches none, an empty one all, as in `policy/v1`).
//! - Expected and desired: an integer `minAvailable` wants that many
//!   healthy pods of the pods there are. A percentage, or `maxUnavailable`,
//!   is of the scale of the pods' controllers (a ReplicaSet owned by a
//!   Deployment counts as the Deployment), rounded up; pods without a
//!   controller are reported (`UnmanagedPods`) and left out, and a
//!   controller whose scale is unknown fails the sync safe: no disruption
//!   allowed, condition `SyncFailed`.
//! - Healthy: Ready, not being deleted, and not recorded by an eviction in
//!   `disruptedPods` within the last two minutes. Entries for pods that are
//!   gone, being deleted, or older than that are dropped; the budget is
//!   looked at again when the next one expires.
//! - Allowed: healthy minus desired, never below 0, and 0 while no pod is
//!   expected (so a budget is safe before it has seen its first pods).
//!
//! The status (with `observedGeneration` and the `DisruptionAllowed`
//! condition) is written only when it changes.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use skiff_api::selector::LabelSelector;

use crate::action::{Action, Reconciled};
use crate::ownership::controller_of;
use crate::pod_state::is_ready;

/// How long an eviction's record keeps a pod out of the healthy count
/// (Kubernetes' `DeletionTimeout`).
pub const DELETION_TIMEOUT: Duration = Duration::from_secs(120);

/// A controller's identity and desired replicas, as a [`Scales`] finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scale {
    /// The uid that identifies the controller (a Deployment's for its
    /// ReplicaSets), so its pods are counted once.
    pub uid: String,
    pub replicas: i32,
}

/// Finds the scale of a pod's controller in the pod's namespace; None when
/// the controller is unknown or has no scale.
pub type Scales<'a> = dyn Fn(&str, &OwnerReference) -> Option<Scale> + 'a;

/// The pods of `pods` (the budget's namespace) that `budget` selects.
pub fn selected<'a>(budget: &PodDisruptionBudget, pods: &'a [Pod]) -> Vec<&'a Pod> {
    let Some(selector) = budget.spec.as_ref().and_then(|s| s.selector.as_ref()) else { return Vec::new() };
    let Ok(selector) =
        serde_json::to_value(selector).map_err(|_| ()).and_then(|v| LabelSelector::from_api(&v).map_err(|_| ()))
    else {
        return Vec::new();
    };
    let empty = BTreeMap::new();
    pods.iter().filter(|p| selector.matches(p.metadata.labels.as_ref().unwrap_or(&empty))).collect()
}

/// Reconciles one budget against the pods of its namespace.
pub fn reconcile(budget: &PodDisruptionBudget, pods: &[Pod], scales: &Scales<'_>, now: DateTime<Utc>) -> Reconciled {
    let mut out = Reconciled::default();
    if budget.metadata.deletion_timestamp.is_some() {
        return out;
    }
    let pods = selected(budget, pods);
    let mut events = Vec::new();
    if pods.is_empty() {
        events.push(("Normal", "NoPods", "No matching pods found".to_string()));
    }
    let status = match expected(budget, &pods, scales) {
        Ok(counts) => {
            if !counts.unmanaged.is_empty() {
                events.push((
                    "Normal",
                    "UnmanagedPods",
                    format!(
                        "Pods selected by this PodDisruptionBudget were found to be unmanaged: {}. As a result, the \
                         status of the PDB cannot be calculated correctly, which may result in undefined behavior. \
                         To account for these pods please set \".spec.minAvailable\" field of the PDB to an integer value.",
                        counts.unmanaged.join(", ")
                    ),
                ));
            }
            let (disrupted, recheck) = disrupted_pods(budget, &pods, now);
            if let Some(at) = recheck {
                out.requeue_within((at - now).to_std().unwrap_or_default() + Duration::from_secs(1));
            }
            let healthy = healthy_count(&pods, &disrupted, now);
            status(budget, healthy, counts.desired, counts.expected, disrupted, now)
        }
        Err(why) => {
            events.push((
                "Warning",
                "CalculateExpectedPodCountFailed",
                format!("Failed to calculate the number of expected pods: {why}"),
            ));
            fail_safe(budget, &why, now)
        }
    };
    // An unchanged condition keeps its transition time, so equality holds
    // exactly when nothing changed.
    let old = budget.status.clone().unwrap_or_default();
    if old == status {
        return out;
    }
    let mut updated = budget.clone();
    updated.status = Some(status);
    if let Ok(value) = serde_json::to_value(&updated) {
        out.actions.push(Action::UpdateStatus(value));
    }
    for (type_, reason, message) in events {
        out.actions.push(Action::event_about(budget, type_, reason, message));
    }
    out
}

/// Expected pods, desired healthy pods, and the pods without a controller.
struct Counts {
    expected: i32,
    desired: i32,
    unmanaged: Vec<String>,
}

fn expected(budget: &PodDisruptionBudget, pods: &[&Pod], scales: &Scales<'_>) -> Result<Counts, String> {
    let spec = budget.spec.clone().unwrap_or_default();
    if let Some(max) = &spec.max_unavailable {
        let (expected, unmanaged) = controllers_scale(pods, scales)?;
        let max = scaled(max, expected)?;
        return Ok(Counts { expected, desired: (expected - max).max(0), unmanaged });
    }
    match &spec.min_available {
        Some(IntOrString::Int(n)) => {
            Ok(Counts { expected: i32::try_from(pods.len()).unwrap_or(i32::MAX), desired: *n, unmanaged: Vec::new() })
        }
        Some(percent @ IntOrString::String(_)) => {
            let (expected, unmanaged) = controllers_scale(pods, scales)?;
            Ok(Counts { expected, desired: scaled(percent, expected)?, unmanaged })
        }
        None => Ok(Counts { expected: 0, desired: 0, unmanaged: Vec::new() }),
    }
}

/// The sum of the scales of the pods' controllers, each counted once, and
/// the names of pods without one.
fn controllers_scale(pods: &[&Pod], scales: &Scales<'_>) -> Result<(i32, Vec<String>), String> {
    let mut seen: BTreeMap<String, i32> = BTreeMap::new();
    let mut unmanaged = Vec::new();
    for pod in pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let Some(owner) = controller_of(&pod.metadata) else {
            unmanaged.push(name);
            continue;
        };
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let scale = scales(namespace, owner).ok_or_else(|| format!("found no controllers for pod {name:?}"))?;
        seen.insert(scale.uid, scale.replicas);
    }
    Ok((seen.values().map(|r| (*r).max(0)).sum(), unmanaged))
}

/// An int-or-percent of `total`, percentages rounded up (Kubernetes'
/// `GetScaledValueFromIntOrPercent(.., true)`).
fn scaled(value: &IntOrString, total: i32) -> Result<i32, String> {
    match value {
        IntOrString::Int(n) => Ok(*n),
        IntOrString::String(s) => {
            let percent: i64 = s
                .strip_suffix('%')
                .and_then(|d| d.parse().ok())
                .ok_or_else(|| format!("invalid value for IntOrString: invalid value {s:?}"))?;
            let scaled = (percent * i64::from(total) + 99).div_euclid(100);
            Ok(i32::try_from(scaled).unwrap_or(i32::MAX))
        }
    }
}

/// The evictions still pending among `pods` and when the earliest expires.
fn disrupted_pods(
    budget: &PodDisruptionBudget,
    pods: &[&Pod],
    now: DateTime<Utc>,
) -> (BTreeMap<String, Time>, Option<DateTime<Utc>>) {
    let recorded = budget.status.as_ref().and_then(|s| s.disrupted_pods.as_ref());
    let mut kept = BTreeMap::new();
    let mut recheck: Option<DateTime<Utc>> = None;
    let Some(recorded) = recorded else { return (kept, recheck) };
    for pod in pods {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = pod.metadata.name.clone().unwrap_or_default();
        let Some(at) = recorded.get(&name) else { continue };
        let expires = at.0 + DELETION_TIMEOUT;
        if expires < now {
            continue;
        }
        recheck = Some(recheck.map_or(expires, |r| r.min(expires)));
        kept.insert(name, at.clone());
    }
    (kept, recheck)
}

fn healthy_count(pods: &[&Pod], disrupted: &BTreeMap<String, Time>, now: DateTime<Utc>) -> i32 {
    let healthy = pods.iter().filter(|pod| {
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let evicted = disrupted.get(name).is_some_and(|at| at.0 + DELETION_TIMEOUT > now);
        pod.metadata.deletion_timestamp.is_none() && !evicted && is_ready(pod)
    });
    i32::try_from(healthy.count()).unwrap_or(i32::MAX)
}

fn status(
    budget: &PodDisruptionBudget,
    healthy: i32,
    desired: i32,
    expected: i32,
    disrupted: BTreeMap<String, Time>,
    now: DateTime<Utc>,
) -> PodDisruptionBudgetStatus {
    let allowed = if expected <= 0 { 0 } else { (healthy - desired).max(0) };
    let old = budget.status.clone().unwrap_or_default();
    let mut status = PodDisruptionBudgetStatus {
        current_healthy: healthy,
        desired_healthy: desired,
        expected_pods: expected,
        disruptions_allowed: allowed,
        disrupted_pods: (!disrupted.is_empty()).then_some(disrupted),
        observed_generation: budget.metadata.generation,
        conditions: old.conditions,
    };
    let (state, reason) = if allowed > 0 { ("True", "SufficientPods") } else { ("False", "InsufficientPods") };
    set_condition(&mut status, state, reason, "", now);
    status
}

/// The status of a budget whose pods could not be counted: nothing may be
/// disrupted until they can (Kubernetes' `failSafe`).
fn fail_safe(budget: &PodDisruptionBudget, why: &str, now: DateTime<Utc>) -> PodDisruptionBudgetStatus {
    let mut status = budget.status.clone().unwrap_or_default();
    status.disruptions_allowed = 0;
    status.observed_generation = budget.metadata.generation;
    set_condition(&mut status, "False", "SyncFailed", why, now);
    status
}

fn set_condition(status: &mut PodDisruptionBudgetStatus, state: &str, reason: &str, message: &str, now: DateTime<Utc>) {
    let observed = status.observed_generation;
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    match conditions.iter_mut().find(|c| c.type_ == "DisruptionAllowed") {
        Some(c) => {
            if c.status != state {
                c.last_transition_time = Time(now);
            }
            c.status = state.to_string();
            c.reason = reason.to_string();
            c.message = message.to_string();
            c.observed_generation = observed;
        }
        None => conditions.push(Condition {
            type_: "DisruptionAllowed".into(),
            status: state.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Time(now),
            observed_generation: observed,
        }),
    }
}

#[cfg(test)]
mod tests;
