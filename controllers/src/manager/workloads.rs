//! Wiring of the ReplicaSet, ReplicationController and Deployment
//! controllers: which informers feed each, how a pod's change reaches its
//! owner's key (and lowers the owner's expectations first, so the reconcile
//! the change triggers already sees them lowered), and the reconcile that
//! hands the cache contents to the controller's logic.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use chrono::Utc;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, ReplicationController};
use skiff_api::selector::LabelSelector;
use skiff_client::runtime::api::Resource;
use skiff_client::runtime::controller::{Controller, ReconcileAction, Request};
use skiff_client::runtime::reflector::{Index, ObjectKey, Store};
use skiff_shutdown::Shutdown;

use super::{drive_about, export_queue_depth, Context};
use crate::execute::ExecuteError;
use crate::expectations::Expectations;
use crate::{deployment, ownership, replicaset, replication};

/// Routes pod changes to the controller of kind `O` that owns (or could
/// adopt) each pod, lowering that controller's expectations on the way.
pub(super) struct PodRouter<O> {
    kind: &'static str,
    expectations: Arc<Expectations>,
    pods: Store<Pod>,
    owners: Store<O>,
    /// Whether an owner's selector picks a pod with these labels.
    selects: fn(&O, &BTreeMap<String, String>) -> bool,
    /// Uids of owned pods seen alive, so an update is not counted as a
    /// creation; bounded by the pods in the cache.
    alive: Mutex<HashSet<String>>,
}

impl<O: Resource> PodRouter<O> {
    /// A router to controllers of `O`; `selects` says which could adopt an
    /// orphan (`never` for controllers that adopt nothing).
    pub(super) fn new(
        expectations: Arc<Expectations>,
        pods: Store<Pod>,
        owners: Store<O>,
        selects: fn(&O, &BTreeMap<String, String>) -> bool,
    ) -> PodRouter<O> {
        PodRouter { kind: O::KIND, expectations, pods, owners, selects, alive: Mutex::new(HashSet::new()) }
    }

    pub(super) fn keys(&self, pod: &Pod) -> Vec<ObjectKey> {
        let meta = &pod.metadata;
        let uid = meta.uid.clone().unwrap_or_default();
        // The feeder hears of a change after the cache has it: a pod not
        // in the cache (or replaced under its name) was deleted.
        let gone = self.pods.get(&ObjectKey::of(pod)).is_none_or(|p| p.metadata.uid != meta.uid);
        let mut alive = self.alive.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(owner) = ownership::owner_key(meta, self.kind) {
            if gone || meta.deletion_timestamp.is_some() {
                alive.remove(&uid);
                self.expectations.deletion_observed(&owner, &uid);
            } else if alive.insert(uid) {
                self.expectations.creation_observed(&owner);
            }
            let (namespace, name) = owner.split_once('/').unwrap_or(("", &owner));
            return vec![ObjectKey::new(namespace, name)];
        }
        if gone {
            alive.remove(&uid);
            return Vec::new();
        }
        if ownership::controller_of(meta).is_some() {
            return Vec::new();
        }
        // An orphan: every owner that could adopt it takes a look.
        let empty = BTreeMap::new();
        let labels = meta.labels.as_ref().unwrap_or(&empty);
        let namespace = meta.namespace.as_deref().unwrap_or_default();
        self.owners
            .by_index(Index::Namespace, namespace)
            .iter()
            .filter(|o| (self.selects)(o, labels))
            .map(|o| ObjectKey::of(o.as_ref()))
            .collect()
    }
}

pub(super) fn selector_picks(selector: Option<serde_json::Value>, labels: &BTreeMap<String, String>) -> bool {
    selector
        .filter(|s| s.as_object().is_some_and(|m| !m.is_empty()))
        .and_then(|s| LabelSelector::from_api(&s).ok())
        .is_some_and(|s| !s.is_empty() && s.matches(labels))
}

fn replica_set_selects(rs: &ReplicaSet, labels: &BTreeMap<String, String>) -> bool {
    selector_picks(rs.spec.as_ref().and_then(|s| serde_json::to_value(&s.selector).ok()), labels)
}

fn replication_controller_selects(rc: &ReplicationController, labels: &BTreeMap<String, String>) -> bool {
    let selector = rc.spec.as_ref().and_then(|s| s.selector.as_ref()).filter(|m| !m.is_empty());
    selector.is_some_and(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// What a replicated workload's reconciles share.
struct Replicas<O> {
    ctx: Arc<Context>,
    pods: Store<Pod>,
    expectations: Arc<Expectations>,
    _owner: std::marker::PhantomData<fn() -> O>,
}

/// A replicated workload's reconcile: the owner, its namespace's pods.
type ReplicatedLogic<O> = fn(&O, &[Arc<Pod>], &Expectations, chrono::DateTime<Utc>) -> crate::Reconciled;

/// Wires a controller of `O` (ReplicaSet or ReplicationController) whose
/// logic is `logic`.
fn replicated<O: Resource>(
    ctx: &Arc<Context>,
    shutdown: &Shutdown,
    name: &'static str,
    selects: fn(&O, &BTreeMap<String, String>) -> bool,
    logic: ReplicatedLogic<O>,
) {
    let owners = ctx.informers.informer::<O>();
    let pods = ctx.informers.informer::<Pod>();
    let expectations = Arc::new(Expectations::new());
    let router = PodRouter::new(expectations.clone(), pods.store(), owners.store(), selects);
    let controller = Controller::new(&owners).watches(&pods, move |pod| router.keys(pod));
    export_queue_depth(name, controller.metrics(), shutdown);
    let shared = Arc::new(Replicas { ctx: ctx.clone(), pods: pods.store(), expectations, _owner: Default::default() });
    let reconcile = move |request: Request<O>, shared: Arc<Replicas<O>>| async move {
        let key = format!("{}/{}", request.key.namespace, request.key.name);
        let Some(owner) = request.object else {
            shared.expectations.forget(&key);
            return Ok::<_, ExecuteError>(ReconcileAction::AwaitChange);
        };
        let started = Instant::now();
        let pods = shared.pods.by_index(Index::Namespace, &request.key.namespace);
        let reconciled = logic(&owner, &pods, &shared.expectations, Utc::now());
        let expectations = shared.expectations.clone();
        drive_about(&shared.ctx, name, started, reconciled, owner.as_ref(), |undone, error| {
            expectations.actions_skipped(&key, undone, &error.to_string())
        })
        .await
    };
    let workers = ctx.config.workers(name);
    let stop = shutdown.clone();
    shutdown.spawn(controller.run(reconcile, shared, workers, stop));
}

pub(super) fn replicasets(ctx: &Arc<Context>, shutdown: &Shutdown) {
    replicated::<ReplicaSet>(ctx, shutdown, "replicaset", replica_set_selects, replicaset::reconcile);
}

pub(super) fn replication_controllers(ctx: &Arc<Context>, shutdown: &Shutdown) {
    replicated::<ReplicationController>(
        ctx,
        shutdown,
        "replicationcontroller",
        replication_controller_selects,
        replication::reconcile,
    );
}

struct Deployments {
    ctx: Arc<Context>,
    sets: Store<ReplicaSet>,
    pods: Store<Pod>,
}

pub(super) fn deployments(ctx: &Arc<Context>, shutdown: &Shutdown) {
    let deployments = ctx.informers.informer::<Deployment>();
    let sets = ctx.informers.informer::<ReplicaSet>();
    let pods = ctx.informers.informer::<Pod>();
    let (deployment_store, set_store) = (deployments.store(), sets.store());
    // A ReplicaSet goes to its Deployment, an orphan to every Deployment
    // that could adopt it.
    let by_set = move |rs: &ReplicaSet| -> Vec<ObjectKey> {
        if let Some(owner) = ownership::owner_key(&rs.metadata, "Deployment") {
            let (namespace, name) = owner.split_once('/').unwrap_or(("", &owner));
            return vec![ObjectKey::new(namespace, name)];
        }
        if ownership::controller_of(&rs.metadata).is_some() {
            return Vec::new();
        }
        let empty = BTreeMap::new();
        let labels = rs.metadata.labels.as_ref().unwrap_or(&empty);
        let namespace = rs.metadata.namespace.as_deref().unwrap_or_default();
        deployment_store
            .by_index(Index::Namespace, namespace)
            .iter()
            .filter(|d| selector_picks(d.spec.as_ref().and_then(|s| serde_json::to_value(&s.selector).ok()), labels))
            .map(|d| ObjectKey::of(d.as_ref()))
            .collect()
    };
    // A pod goes to the Deployment of its ReplicaSet (Recreate waits for
    // old pods to be gone).
    let by_pod = move |pod: &Pod| -> Vec<ObjectKey> {
        let Some(owner) = ownership::owner_key(&pod.metadata, "ReplicaSet") else { return Vec::new() };
        let (namespace, name) = owner.split_once('/').unwrap_or(("", &owner));
        let Some(rs) = set_store.get_named(namespace, name) else { return Vec::new() };
        let deployment = ownership::owner_key(&rs.metadata, "Deployment");
        deployment
            .map(|d| {
                let (namespace, name) = d.split_once('/').unwrap_or(("", &d));
                ObjectKey::new(namespace, name)
            })
            .into_iter()
            .collect()
    };
    let controller = Controller::new(&deployments).watches(&sets, by_set).watches(&pods, by_pod);
    export_queue_depth("deployment", controller.metrics(), shutdown);
    let shared = Arc::new(Deployments { ctx: ctx.clone(), sets: sets.store(), pods: pods.store() });
    let reconcile = |request: Request<Deployment>, shared: Arc<Deployments>| async move {
        let Some(d) = request.object else { return Ok::<_, ExecuteError>(ReconcileAction::AwaitChange) };
        let started = Instant::now();
        let sets = shared.sets.by_index(Index::Namespace, &request.key.namespace);
        let pods = shared.pods.by_index(Index::Namespace, &request.key.namespace);
        let reconciled = deployment::reconcile(&d, &sets, &pods, Utc::now());
        drive_about(&shared.ctx, "deployment", started, reconciled, d.as_ref(), |_, _| {}).await
    };
    let workers = ctx.config.workers("deployment");
    let stop = shutdown.clone();
    shutdown.spawn(controller.run(reconcile, shared, workers, stop));
}

/// For controllers that adopt no orphans.
pub(super) fn never<O>(_: &O, _: &BTreeMap<String, String>) -> bool {
    false
}

/// Records what a plan asks to create and delete, before it is carried out.
pub(super) fn expect(
    expectations: &Expectations,
    key: &str,
    creations: usize,
    deletions: Vec<String>,
    now: chrono::DateTime<Utc>,
) {
    // A plan either grows or shrinks; a record holds one of the two.
    if !deletions.is_empty() {
        expectations.expect_deletions(key, deletions, now);
    } else if creations > 0 {
        expectations.expect_creations(key, creations, now);
    }
}
