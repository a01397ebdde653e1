//! The Deployment's status, added up from its ReplicaSets, and the
//! `Available` and `Progressing` conditions, as Kubernetes' `progress.go`
//! and `sync.go`: `kubectl rollout status` waits on these numbers, and
//! `Progressing` turns False once `progressDeadlineSeconds` pass without
//! progress.

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::Plan;

pub const AVAILABLE: &str = "Available";
pub const PROGRESSING: &str = "Progressing";
pub const MINIMUM_REPLICAS_AVAILABLE: &str = "MinimumReplicasAvailable";
pub const MINIMUM_REPLICAS_UNAVAILABLE: &str = "MinimumReplicasUnavailable";
pub const NEW_RS_CREATED: &str = "NewReplicaSetCreated";
pub const FOUND_NEW_RS: &str = "FoundNewReplicaSet";
pub const RS_UPDATED: &str = "ReplicaSetUpdated";
pub const NEW_RS_AVAILABLE: &str = "NewReplicaSetAvailable";
pub const TIMED_OUT: &str = "ProgressDeadlineExceeded";
pub const PAUSED: &str = "DeploymentPaused";
pub const RESUMED: &str = "DeploymentResumed";
pub const REPLICA_FAILURE: &str = crate::replicaset::REPLICA_FAILURE;

pub fn condition<'s>(status: &'s DeploymentStatus, type_: &str) -> Option<&'s DeploymentCondition> {
    status.conditions.iter().flatten().find(|c| c.type_ == type_)
}

pub fn condition_of(type_: &str, status: &str, reason: &str, message: &str, now: DateTime<Utc>) -> DeploymentCondition {
    DeploymentCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_update_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

/// Sets a condition; one with the same status and reason is kept as it is,
/// and one with the same status keeps its transition time.
pub fn set_condition(status: &mut DeploymentStatus, mut cond: DeploymentCondition) {
    if let Some(current) = condition(status, &cond.type_) {
        if current.status == cond.status && current.reason == cond.reason {
            return;
        }
        if current.status == cond.status {
            cond.last_transition_time = current.last_transition_time.clone();
        }
    }
    remove_condition(status, &cond.type_);
    status.conditions.get_or_insert_with(Vec::new).push(cond);
}

pub fn remove_condition(status: &mut DeploymentStatus, type_: &str) {
    if let Some(conditions) = status.conditions.as_mut() {
        conditions.retain(|c| c.type_ != type_);
        if conditions.is_empty() {
            status.conditions = None;
        }
    }
}

fn has_progress_deadline(d: &Deployment) -> bool {
    d.spec.as_ref().and_then(|s| s.progress_deadline_seconds).is_some_and(|s| s != i32::MAX)
}

/// `Progressing` says Unknown/DeploymentPaused while paused, and
/// Unknown/DeploymentResumed once resumed (until the rollout moves on); a
/// timed-out rollout keeps saying so.
pub(crate) fn check_paused(plan: &mut Plan<'_>) {
    if !has_progress_deadline(plan.deployment) {
        return;
    }
    let current = condition(&plan.status, PROGRESSING).and_then(|c| c.reason.clone());
    if current.as_deref() == Some(TIMED_OUT) {
        return;
    }
    let paused = plan.spec().paused == Some(true);
    let shown = current.as_deref() == Some(PAUSED);
    if paused && !shown {
        set_condition(&mut plan.status, condition_of(PROGRESSING, "Unknown", PAUSED, "Deployment is paused", plan.now));
    } else if !paused && shown {
        set_condition(
            &mut plan.status,
            condition_of(PROGRESSING, "Unknown", RESUMED, "Deployment is resumed", plan.now),
        );
    }
}

/// Whether a status shows the rollout done: every replica updated and
/// available, no old pods, the latest spec observed (what `kubectl rollout
/// status` waits for).
pub fn complete(d: &Deployment, status: Option<&DeploymentStatus>) -> bool {
    let Some(s) = status else { return false };
    let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    s.updated_replicas.unwrap_or(0) == replicas
        && s.replicas.unwrap_or(0) == replicas
        && s.available_replicas.unwrap_or(0) == replicas
        && s.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0)
}

/// Whether `new` shows progress over `old`: more updated, ready or
/// available pods, or fewer old ones.
fn progressed(old: &DeploymentStatus, new: &DeploymentStatus) -> bool {
    let olds = |s: &DeploymentStatus| s.replicas.unwrap_or(0) - s.updated_replicas.unwrap_or(0);
    new.updated_replicas.unwrap_or(0) > old.updated_replicas.unwrap_or(0)
        || olds(new) < olds(old)
        || new.ready_replicas.unwrap_or(0) > old.ready_replicas.unwrap_or(0)
        || new.available_replicas.unwrap_or(0) > old.available_replicas.unwrap_or(0)
}

/// Go's `omitempty`: zero is not written.
fn nonzero(n: i32) -> Option<i32> {
    (n != 0).then_some(n)
}

/// Fills `plan.status` from the ReplicaSets as planned; with `rollout`, also
/// judges progress against the deadline (and requeues for it).
pub(crate) fn write(plan: &mut Plan<'_>, rollout: bool) {
    let d = plan.deployment;
    let now = plan.now;
    let available: i32 = plan.all().map(|p| p.reported_available()).sum();
    let total: i32 = plan.all().map(|p| p.replicas()).sum();
    let s = &mut plan.status;
    s.observed_generation = d.metadata.generation;
    s.replicas = nonzero(plan.new.iter().chain(plan.old.iter()).map(|p| p.actual()).sum());
    s.updated_replicas = nonzero(plan.new.as_ref().map_or(0, |n| n.actual()));
    s.ready_replicas = nonzero(plan.new.iter().chain(plan.old.iter()).map(|p| p.ready()).sum());
    s.available_replicas = nonzero(available);
    s.unavailable_replicas = nonzero((total - available).max(0));
    let replicas = plan.deployment.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let min_available = replicas - plan.max_unavailable();
    let cond = if available >= min_available {
        condition_of(AVAILABLE, "True", MINIMUM_REPLICAS_AVAILABLE, "Deployment has minimum availability.", now)
    } else {
        condition_of(
            AVAILABLE,
            "False",
            MINIMUM_REPLICAS_UNAVAILABLE,
            "Deployment does not have minimum availability.",
            now,
        )
    };
    set_condition(&mut plan.status, cond);
    if rollout {
        progress(plan);
        replica_failure(plan);
    }
}

/// A ReplicaSet that cannot create or delete pods (quota, admission) says
/// so in its `ReplicaFailure` condition; the Deployment repeats the first
/// one, the new ReplicaSet's before the old ones'.
fn replica_failure(plan: &mut Plan<'_>) {
    let failure = plan.all().find_map(|p| {
        p.rs.status.as_ref()?.conditions.iter().flatten().find(|c| c.type_ == REPLICA_FAILURE && c.status == "True")
    });
    match failure {
        Some(c) => {
            let cond = condition_of(
                REPLICA_FAILURE,
                "True",
                c.reason.as_deref().unwrap_or(""),
                c.message.as_deref().unwrap_or(""),
                plan.now,
            );
            set_condition(&mut plan.status, cond);
        }
        None => remove_condition(&mut plan.status, REPLICA_FAILURE),
    }
}

fn progress(plan: &mut Plan<'_>) {
    let d = plan.deployment;
    let now = plan.now;
    if !has_progress_deadline(d) {
        remove_condition(&mut plan.status, PROGRESSING);
        return;
    }
    let deadline =
        chrono::Duration::seconds(i64::from(d.spec.as_ref().and_then(|s| s.progress_deadline_seconds).unwrap_or(0)));
    let new_name = plan.new.as_ref().map(|n| n.name().to_string()).unwrap_or_default();
    let current = condition(&plan.status, PROGRESSING).cloned();
    let already_complete = plan.status.replicas == plan.status.updated_replicas
        && current.as_ref().is_some_and(|c| c.reason.as_deref() == Some(NEW_RS_AVAILABLE));
    if already_complete {
        return;
    }
    let stored = d.status.clone().unwrap_or_default();
    if complete(d, Some(&plan.status)) {
        let message = format!("ReplicaSet \"{new_name}\" has successfully progressed.");
        set_condition(&mut plan.status, condition_of(PROGRESSING, "True", NEW_RS_AVAILABLE, &message, now));
    } else if progressed(&stored, &plan.status) {
        let message = format!("ReplicaSet \"{new_name}\" is progressing.");
        let mut cond = condition_of(PROGRESSING, "True", RS_UPDATED, &message, now);
        if let Some(c) = current.as_ref().filter(|c| c.status == "True") {
            cond.last_transition_time = c.last_transition_time.clone();
        }
        remove_condition(&mut plan.status, PROGRESSING);
        set_condition(&mut plan.status, cond);
    } else if let Some(c) = &current {
        let since = c.last_update_time.as_ref().map(|t| t.0);
        let timed_out = match c.reason.as_deref() {
            Some(TIMED_OUT) => true,
            Some(NEW_RS_AVAILABLE) | Some(PAUSED) => false,
            _ => since.is_some_and(|since| since + deadline < now),
        };
        if timed_out {
            let message = format!("ReplicaSet \"{new_name}\" has timed out progressing.");
            set_condition(&mut plan.status, condition_of(PROGRESSING, "False", TIMED_OUT, &message, now));
        }
    }
    // Look again when the deadline passes, in case nothing else moves.
    if let Some(c) = condition(&plan.status, PROGRESSING) {
        let pending = c.status == "True" && c.reason.as_deref() != Some(NEW_RS_AVAILABLE);
        if let Some(since) = c.last_update_time.as_ref().map(|t| t.0).filter(|_| pending) {
            let wait = (since + deadline - now).to_std().unwrap_or_default() + std::time::Duration::from_secs(1);
            plan.requeue_after = Some(plan.requeue_after.map_or(wait, |r| r.min(wait)));
        }
    }
}
