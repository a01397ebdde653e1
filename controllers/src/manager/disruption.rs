//! Wiring of the disruption controller: PodDisruptionBudgets against the
//! pods of their namespace and the scales of those pods' controllers.

use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, ReplicationController};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use skiff_client::runtime::controller::{Controller, ReconcileAction, Request};
use skiff_client::runtime::reflector::{Index, ObjectKey, Store};
use skiff_shutdown::Shutdown;

use super::{drive_about, export_queue_depth, Context};
use crate::disruption::{self, Scale};
use crate::execute::ExecuteError;
use crate::ownership::controller_of;

/// The controllers whose scale a budget's percentages are of.
struct Scales {
    replica_sets: Store<ReplicaSet>,
    deployments: Store<Deployment>,
    controllers: Store<ReplicationController>,
}

impl Scales {
    /// Kubernetes' finders: a ReplicaSet (or the Deployment that controls
    /// it), or a ReplicationController; the owner must be the object of
    /// that uid, not a newer one of the same name.
    fn of(&self, namespace: &str, owner: &OwnerReference) -> Option<Scale> {
        match (owner.api_version.as_str(), owner.kind.as_str()) {
            ("apps/v1", "ReplicaSet") => {
                let rs =
                    self.replica_sets.get_named(namespace, &owner.name).filter(|rs| same_uid(&rs.metadata, owner))?;
                if let Some(up) = controller_of(&rs.metadata).filter(|o| o.kind == "Deployment") {
                    let d = self.deployments.get_named(namespace, &up.name).filter(|d| same_uid(&d.metadata, up))?;
                    let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
                    return Some(Scale { uid: up.uid.clone(), replicas });
                }
                Some(Scale { uid: owner.uid.clone(), replicas: rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1) })
            }
            ("v1", "ReplicationController") => {
                let rc =
                    self.controllers.get_named(namespace, &owner.name).filter(|rc| same_uid(&rc.metadata, owner))?;
                Some(Scale { uid: owner.uid.clone(), replicas: rc.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1) })
            }
            _ => None,
        }
    }
}

fn same_uid(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, owner: &OwnerReference) -> bool {
    meta.uid.as_deref() == Some(owner.uid.as_str())
}

/// Every budget of the namespace of `obj`: cheap (budgets are few) and
/// right when a pod's labels change in either direction.
fn budgets_of_namespace(
    budgets: &Store<PodDisruptionBudget>,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Vec<ObjectKey> {
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    budgets.by_index(Index::Namespace, namespace).iter().map(|b| ObjectKey::of(b.as_ref())).collect()
}

struct Shared {
    ctx: Arc<Context>,
    pods: Store<Pod>,
    scales: Scales,
}

pub(super) fn disruption(ctx: &Arc<Context>, shutdown: &Shutdown) {
    let budgets = ctx.informers.informer::<PodDisruptionBudget>();
    let pods = ctx.informers.informer::<Pod>();
    let replica_sets = ctx.informers.informer::<ReplicaSet>();
    let deployments = ctx.informers.informer::<Deployment>();
    let controllers = ctx.informers.informer::<ReplicationController>();
    let (b1, b2, b3, b4) = (budgets.store(), budgets.store(), budgets.store(), budgets.store());
    let controller = Controller::new(&budgets)
        .watches(&pods, move |p: &Pod| budgets_of_namespace(&b1, &p.metadata))
        .watches(&replica_sets, move |r: &ReplicaSet| budgets_of_namespace(&b2, &r.metadata))
        .watches(&deployments, move |d: &Deployment| budgets_of_namespace(&b3, &d.metadata))
        .watches(&controllers, move |c: &ReplicationController| budgets_of_namespace(&b4, &c.metadata));
    export_queue_depth("disruption", controller.metrics(), shutdown);
    let scales = Scales {
        replica_sets: replica_sets.store(),
        deployments: deployments.store(),
        controllers: controllers.store(),
    };
    let shared = Arc::new(Shared { ctx: ctx.clone(), pods: pods.store(), scales });
    let reconcile = |request: Request<PodDisruptionBudget>, shared: Arc<Shared>| async move {
        let Some(budget) = request.object else { return Ok::<_, ExecuteError>(ReconcileAction::AwaitChange) };
        let started = Instant::now();
        let pods: Vec<Pod> =
            shared.pods.by_index(Index::Namespace, &request.key.namespace).iter().map(|p| (**p).clone()).collect();
        let scales = |namespace: &str, owner: &OwnerReference| shared.scales.of(namespace, owner);
        let reconciled = disruption::reconcile(&budget, &pods, &scales, Utc::now());
        drive_about(&shared.ctx, "disruption", started, reconciled, budget.as_ref(), |_, _| {}).await
    };
    let workers = ctx.config.workers("disruption");
    let stop = shutdown.clone();
    shutdown.spawn(controller.run(reconcile, shared, workers, stop));
}
