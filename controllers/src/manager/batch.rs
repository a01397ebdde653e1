//! Wiring of the Job, CronJob and DaemonSet controllers.

use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Node, Pod};
use skiff_client::runtime::controller::{Controller, ReconcileAction, Request};
use skiff_client::runtime::reflector::{Index, ObjectKey, Store};
use skiff_shutdown::Shutdown;

use super::workloads::{expect, never, PodRouter};
use super::{drive_about, export_queue_depth, Context};
use crate::action::Reconciled;
use crate::execute::ExecuteError;
use crate::expectations::Expectations;
use crate::{cronjob, daemonset, job, ownership};

/// The pods whose controller is the object with `uid`.
fn owned_pods(pods: &Store<Pod>, uid: Option<&str>) -> Vec<Pod> {
    let Some(uid) = uid else { return Vec::new() };
    pods.by_index(Index::OwnerUid, uid).iter().map(|p| (**p).clone()).collect()
}

struct Jobs {
    ctx: Arc<Context>,
    pods: Store<Pod>,
    expectations: Arc<Expectations>,
}

pub(super) fn jobs(ctx: &Arc<Context>, shutdown: &Shutdown) {
    let jobs = ctx.informers.informer::<Job>();
    let pods = ctx.informers.informer::<Pod>();
    let expectations = Arc::new(Expectations::new());
    let router = PodRouter::new(expectations.clone(), pods.store(), jobs.store(), never::<Job>);
    let controller = Controller::new(&jobs).watches(&pods, move |pod| router.keys(pod));
    export_queue_depth("job", controller.metrics(), shutdown);
    let shared = Arc::new(Jobs { ctx: ctx.clone(), pods: pods.store(), expectations });
    let reconcile = |request: Request<Job>, shared: Arc<Jobs>| async move {
        let key = format!("{}/{}", request.key.namespace, request.key.name);
        let Some(j) = request.object else {
            shared.expectations.forget(&key);
            return Ok::<_, ExecuteError>(ReconcileAction::AwaitChange);
        };
        let started = Instant::now();
        let now = Utc::now();
        let pods = owned_pods(&shared.pods, j.metadata.uid.as_deref());
        let plan = job::reconcile(&j, &pods, shared.expectations.satisfied(&key, now), now);
        expect(&shared.expectations, &key, plan.expected_creations, plan.expected_deletions, now);
        let reconciled = Reconciled { actions: plan.actions, requeue_after: plan.requeue_after };
        let expectations = shared.expectations.clone();
        drive_about(&shared.ctx, "job", started, reconciled, j.as_ref(), |undone, error| {
            expectations.actions_skipped(&key, undone, &error.to_string())
        })
        .await
    };
    let workers = ctx.config.workers("job");
    let stop = shutdown.clone();
    shutdown.spawn(controller.run(reconcile, shared, workers, stop));
}

pub(super) fn cron_jobs(ctx: &Arc<Context>, shutdown: &Shutdown) {
    let cron_jobs = ctx.informers.informer::<CronJob>();
    let jobs = ctx.informers.informer::<Job>();
    let controller = Controller::new(&cron_jobs).watches(&jobs, |j: &Job| {
        ownership::owner_key(&j.metadata, "CronJob")
            .map(|k| {
                let (namespace, name) = k.split_once('/').unwrap_or(("", &k));
                ObjectKey::new(namespace, name)
            })
            .into_iter()
            .collect()
    });
    export_queue_depth("cronjob", controller.metrics(), shutdown);
    let shared = Arc::new((ctx.clone(), jobs.store()));
    let reconcile = |request: Request<CronJob>, shared: Arc<(Arc<Context>, Store<Job>)>| async move {
        let Some(cj) = request.object else { return Ok::<_, ExecuteError>(ReconcileAction::AwaitChange) };
        let started = Instant::now();
        let owned: Vec<Job> = match cj.metadata.uid.as_deref() {
            Some(uid) => shared.1.by_index(Index::OwnerUid, uid).iter().map(|j| (**j).clone()).collect(),
            None => Vec::new(),
        };
        let plan = cronjob::reconcile(&cj, &owned, Utc::now());
        let reconciled = Reconciled { actions: plan.actions, requeue_after: plan.requeue_after };
        drive_about(&shared.0, "cronjob", started, reconciled, cj.as_ref(), |_, _| {}).await
    };
    let stop = shutdown.clone();
    shutdown.spawn(controller.run(reconcile, shared, 2, stop));
}

struct DaemonSets {
    ctx: Arc<Context>,
    nodes: Store<Node>,
    pods: Store<Pod>,
    expectations: Arc<Expectations>,
}

pub(super) fn daemon_sets(ctx: &Arc<Context>, shutdown: &Shutdown) {
    let sets = ctx.informers.informer::<DaemonSet>();
    let pods = ctx.informers.informer::<Pod>();
    let nodes = ctx.informers.informer::<Node>();
    let expectations = Arc::new(Expectations::new());
    let router = PodRouter::new(expectations.clone(), pods.store(), sets.store(), never::<DaemonSet>);
    // A node joining, leaving or changing concerns every DaemonSet.
    let all_sets = sets.store();
    let controller = Controller::new(&sets)
        .watches(&pods, move |pod| router.keys(pod))
        .watches(&nodes, move |_: &Node| all_sets.keys());
    export_queue_depth("daemonset", controller.metrics(), shutdown);
    let shared = Arc::new(DaemonSets { ctx: ctx.clone(), nodes: nodes.store(), pods: pods.store(), expectations });
    let reconcile = |request: Request<DaemonSet>, shared: Arc<DaemonSets>| async move {
        let key = format!("{}/{}", request.key.namespace, request.key.name);
        let Some(ds) = request.object else {
            shared.expectations.forget(&key);
            return Ok::<_, ExecuteError>(ReconcileAction::AwaitChange);
        };
        let started = Instant::now();
        let now = Utc::now();
        let nodes: Vec<Node> = shared.nodes.list().iter().map(|n| (**n).clone()).collect();
        let pods = owned_pods(&shared.pods, ds.metadata.uid.as_deref());
        let plan = daemonset::reconcile(&ds, &nodes, &pods, shared.expectations.satisfied(&key, now), now);
        expect(&shared.expectations, &key, plan.expected_creations, plan.expected_deletions, now);
        let reconciled = Reconciled { actions: plan.actions, requeue_after: plan.requeue_after };
        let expectations = shared.expectations.clone();
        drive_about(&shared.ctx, "daemonset", started, reconciled, ds.as_ref(), |undone, error| {
            expectations.actions_skipped(&key, undone, &error.to_string())
        })
        .await
    };
    let workers = ctx.config.workers("daemonset");
    let stop = shutdown.clone();
    shutdown.spawn(controller.run(reconcile, shared, workers, stop));
}
