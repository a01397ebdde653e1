//! Wiring of the disruption controller: PodDisruptionBudgets against the
//! pods of their namespace and the scales of those pods' controllers.
//!
//! The built-in controllers' scales come from their informers. A pod may
//! also be controlled by a custom resource (an operator's), whose scale is
//! its `scale` subresource when its CustomResourceDefinition has one: read
//! from the apiserver at each sync, as Kubernetes' scale finder does, since
//! no informer watches every custom kind. Nothing announces a change of
//! that scale, so a budget that counts one is looked at again every
//! [`CUSTOM_SCALE_RESYNC`].

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, ReplicationController};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use skiff_client::runtime::controller::{Controller, ReconcileAction, Request};
use skiff_client::runtime::reflector::{Index, ObjectKey, Store};
use skiff_client::Client;
use skiff_shutdown::Shutdown;

use super::custom::Definitions;
use super::{drive_about, export_queue_depth, Context};
use crate::disruption::{self, Scale};
use crate::execute::ExecuteError;
use crate::ownership::controller_of;

/// How often a budget whose pods a custom resource controls is synced
/// again, to see that resource's scale change.
const CUSTOM_SCALE_RESYNC: Duration = Duration::from_secs(15);

/// The controllers whose scale a budget's percentages are of.
struct Scales {
    replica_sets: Store<ReplicaSet>,
    deployments: Store<Deployment>,
    controllers: Store<ReplicationController>,
    definitions: Definitions,
}

/// Whether the built-in finders know `owner`'s kind.
fn built_in(owner: &OwnerReference) -> bool {
    matches!(
        (owner.api_version.as_str(), owner.kind.as_str()),
        ("apps/v1", "ReplicaSet") | ("v1", "ReplicationController")
    )
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

    /// The scales of the custom resources that control some of `pods` (in
    /// `namespace`), by their uids. A resource whose definition has no
    /// `scale` subresource, that is gone, or that is a newer object of the
    /// same name is left out, so the sync fails safe on its pods.
    async fn custom(&self, client: &Client, namespace: &str, pods: &[&Pod]) -> HashMap<String, Scale> {
        let mut scales = HashMap::new();
        // Each owner is read once, however many of the pods it controls.
        let mut read = HashSet::new();
        for owner in pods.iter().filter_map(|p| controller_of(&p.metadata)).filter(|o| !built_in(o)) {
            if !read.insert(owner.uid.as_str()) {
                continue;
            }
            let Some(served) = self.definitions.serving(&owner.api_version, &owner.kind, true).filter(|s| s.namespaced)
            else {
                continue;
            };
            let scale = match client.get_scale_of(&served.group, &served.plural, namespace, &owner.name).await {
                Ok(scale) => scale,
                Err(e) => {
                    tracing::debug!(owner = %owner.name, kind = %owner.kind, error = %e, "no scale for a pod's controller");
                    continue;
                }
            };
            if scale.pointer("/metadata/uid").and_then(serde_json::Value::as_str) != Some(owner.uid.as_str()) {
                continue;
            }
            let replicas = scale.pointer("/spec/replicas").and_then(serde_json::Value::as_i64).unwrap_or(0);
            let replicas = i32::try_from(replicas).unwrap_or(i32::MAX);
            scales.insert(owner.uid.clone(), Scale { uid: owner.uid.clone(), replicas });
        }
        scales
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
    let definitions = ctx.informers.informer::<CustomResourceDefinition>();
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
        definitions: Definitions(definitions.store()),
    };
    let shared = Arc::new(Shared { ctx: ctx.clone(), pods: pods.store(), scales });
    let reconcile = |request: Request<PodDisruptionBudget>, shared: Arc<Shared>| async move {
        let Some(budget) = request.object else { return Ok::<_, ExecuteError>(ReconcileAction::AwaitChange) };
        let started = Instant::now();
        let pods: Vec<Pod> =
            shared.pods.by_index(Index::Namespace, &request.key.namespace).iter().map(|p| (**p).clone()).collect();
        let selected = disruption::selected(&budget, &pods);
        let custom = shared.scales.custom(&shared.ctx.client, &request.key.namespace, &selected).await;
        let scales = |namespace: &str, owner: &OwnerReference| {
            shared.scales.of(namespace, owner).or_else(|| custom.get(&owner.uid).cloned())
        };
        let mut reconciled = disruption::reconcile(&budget, &pods, &scales, Utc::now());
        if selected.iter().filter_map(|p| controller_of(&p.metadata)).any(|o| !built_in(o)) {
            reconciled.requeue_within(CUSTOM_SCALE_RESYNC);
        }
        drive_about(&shared.ctx, "disruption", started, reconciled, budget.as_ref(), |_, _| {}).await
    };
    let workers = ctx.config.workers("disruption");
    let stop = shutdown.clone();
    shutdown.spawn(controller.run(reconcile, shared, workers, stop));
}
