//! The RollingUpdate strategy, as Kubernetes' `rolling.go`: scale the new
//! ReplicaSet up within `maxSurge`, then the old ones down within
//! `maxUnavailable`, one step per reconcile.
//!
//! The two bounds it keeps: the ReplicaSets' sizes (and, stricter than
//! Kubernetes, the pods they still report) never sum past
//! `replicas + maxSurge`; and old ReplicaSets are scaled down only by as
//! many available pods as exceed `replicas - maxUnavailable`, after their
//! unavailable pods.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::ReplicaSet;

use super::{status, sync, Plan};

pub(crate) fn rollout(plan: &mut Plan<'_>, sets: &[Arc<ReplicaSet>]) {
    if plan.new.is_none() {
        let size = new_size(plan);
        if !plan.create_new(sets, size) {
            // A hash collision: the status counts it, the next reconcile
            // tries the next name.
            status::write(plan, true);
            return;
        }
    }
    if scale_new(plan) || scale_old(plan) {
        status::write(plan, true);
        return;
    }
    if status::complete(plan.deployment, plan.deployment.status.as_ref()) {
        sync::cleanup(plan);
    }
    status::write(plan, true);
}

/// What the new ReplicaSet may grow to now (Kubernetes' `NewRSNewReplicas`).
fn new_size(plan: &Plan<'_>) -> i32 {
    let current = plan.new.as_ref().map_or(0, |n| n.replicas());
    // Pods the ReplicaSets hold or are about to: the larger of their size
    // and what they still report.
    let pods: i32 = plan.all().map(|p| p.replicas().max(p.actual())).sum();
    let max_total = plan.replicas() + plan.max_surge();
    if pods >= max_total {
        return current;
    }
    current + (max_total - pods).min((plan.replicas() - current).max(0))
}

fn scale_new(plan: &mut Plan<'_>) -> bool {
    let Some(current) = plan.new.as_ref().map(|n| n.replicas()) else { return false };
    let replicas = plan.replicas();
    if current == replicas {
        return false;
    }
    let target = if current > replicas { replicas } else { new_size(plan) };
    target != current && plan.set_replicas(true, None, target)
}

fn scale_old(plan: &mut Plan<'_>) -> bool {
    let old_total: i32 = plan.old.iter().map(|p| p.replicas()).sum();
    if old_total == 0 {
        return false;
    }
    let all_total: i32 = plan.all().map(|p| p.replicas()).sum();
    let min_available = plan.replicas() - plan.max_unavailable();
    let new_unavailable = plan.new.as_ref().map_or(0, |n| (n.replicas() - n.reported_available()).max(0));
    let max_scaled_down = all_total - min_available - new_unavailable;
    if max_scaled_down <= 0 {
        return false;
    }
    // First the old ReplicaSets' unavailable pods: removing them costs nothing.
    let mut cleaned = 0;
    for i in 0..plan.old.len() {
        if cleaned >= max_scaled_down {
            break;
        }
        let (size, available) = (plan.old[i].replicas(), plan.old[i].available());
        let unhealthy = (size - available).max(0);
        if size == 0 || unhealthy == 0 {
            continue;
        }
        let count = unhealthy.min(max_scaled_down - cleaned);
        plan.set_replicas(false, Some(i), size - count);
        cleaned += count;
    }
    // Then available ones, as far as availability allows, oldest first.
    let available: i32 = plan.all().map(|p| p.available()).sum();
    let mut scaled = 0;
    if available > min_available {
        let budget = available - min_available;
        for i in 0..plan.old.len() {
            if scaled >= budget {
                break;
            }
            let size = plan.old[i].replicas();
            if size == 0 {
                continue;
            }
            let count = size.min(budget - scaled);
            plan.set_replicas(false, Some(i), size - count);
            scaled += count;
        }
    }
    cleaned + scaled > 0
}
