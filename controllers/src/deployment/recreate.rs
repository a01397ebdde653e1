//! The Recreate strategy, as Kubernetes' `recreate.go`: scale every old
//! ReplicaSet to zero, wait until none of their pods is left running (a
//! terminating pod still runs), and only then create or scale up the new
//! ReplicaSet. Old and new pods never run together.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::ReplicaSet;

use super::{status, sync, Plan};

pub(crate) fn rollout(plan: &mut Plan<'_>, sets: &[Arc<ReplicaSet>]) {
    let mut scaled_down = false;
    for i in 0..plan.old.len() {
        if plan.old[i].replicas() > 0 {
            scaled_down |= plan.set_replicas(false, Some(i), 0);
        }
    }
    if scaled_down || old_pods_running(plan) {
        status::write(plan, true);
        return;
    }
    let replicas = plan.replicas();
    match &plan.new {
        None => {
            if !plan.create_new(sets, replicas) {
                status::write(plan, true);
                return;
            }
        }
        Some(new) if new.replicas() != replicas => {
            plan.set_replicas(true, None, replicas);
        }
        Some(_) => {}
    }
    if status::complete(plan.deployment, plan.deployment.status.as_ref()) {
        sync::cleanup(plan);
    }
    status::write(plan, true);
}

/// Whether an old ReplicaSet still reports pods, or owns a pod that has not
/// finished (terminating ones included).
fn old_pods_running(plan: &Plan<'_>) -> bool {
    if plan.old.iter().any(|p| p.actual() > 0) {
        return true;
    }
    plan.old.iter().filter_map(|p| p.rs.metadata.uid.as_ref()).any(|uid| {
        plan.pods_by_owner.get(uid).into_iter().flatten().any(|pod| {
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
    })
}
