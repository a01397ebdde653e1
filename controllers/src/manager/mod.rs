//! `run(config, shutdown)`: the controller manager. It serves `/metrics`
//! and `/healthz` at once, competes for the `kube-system` Lease, and while
//! it leads runs every enabled controller on one set of shared informers
//! (one watch per resource type). Losing the lease stops the controllers
//! and their informers before anyone else can take it over; the manager
//! then competes again, and starts afresh from new caches if it wins.
//!
//! # Layout
//! - this module: `run`, the [`Context`] every controller's wiring gets,
//!   and [`drive`], which carries out one reconcile's actions and records
//!   its metrics.
//! - `dynamic`: every kind's shared informer seen as JSON.
//! - `custom`: custom resources met as references (a pod's owner).
//! - `workloads`: ReplicaSets, ReplicationControllers, Deployments.
//! - `batch`: Jobs, CronJobs, DaemonSets.
//! - `network`: Endpoints, EndpointSlices; ResourceQuota usage.
//! - `disruption`: PodDisruptionBudgets.
//! - `cluster`: namespaces, garbage collection, service accounts, pod GC,
//!   node IPAM, node lifecycle.

mod batch;
mod cluster;
mod custom;
mod disruption;
mod dynamic;
mod network;
mod workloads;

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use skiff_client::runtime::controller::{ControllerMetrics, ReconcileAction};
use skiff_client::runtime::informer::Informers;
use skiff_client::runtime::leader::{LeaderElectionConfig, LeaderElector};
use skiff_client::{Client, ClientConfig, ClientError};
use skiff_shutdown::Shutdown;

use crate::action::{Action, Reconciled};
use crate::config::ControllerManagerConfig;
use crate::execute::{execute, ExecuteError, Failed, Recorder};
use crate::metrics::{self, metrics};

/// Why the controller manager could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("apiserver client: {0}")]
    Client(#[from] ClientError),
    #[error("cannot listen on {addr} for /metrics: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// What every controller's wiring gets.
pub struct Context {
    pub client: Client,
    /// One informer per resource type, shared by every controller.
    pub informers: Informers,
    pub recorder: Recorder,
    pub config: ControllerManagerConfig,
    /// The CustomResourceDefinitions, so that actions on custom objects
    /// (the garbage collector's) find their resource.
    custom: custom::Definitions,
}

/// Runs the controller manager until `shutdown`.
pub async fn run(config: ControllerManagerConfig, shutdown: Shutdown) -> Result<(), RunError> {
    let mut client_config = ClientConfig::new(&config.servers);
    client_config.tls = config.tls.clone();
    client_config.token = config.token.clone();
    client_config.qps = config.kube_api_qps;
    client_config.burst = config.kube_api_burst;
    let client = Client::from_config(&client_config)?;
    if let Some(addr) = config.http {
        let bound = metrics::serve(addr, shutdown.clone()).await.map_err(|source| RunError::Listen { addr, source })?;
        tracing::info!(%bound, "serving /metrics and /healthz");
    }
    tracing::info!(controllers = ?config.controllers, identity = %config.identity, "controller manager starting");
    let election = config.leader_election.clone();
    if !election.enabled {
        metrics().leader.set(1);
        run_controllers(client, config, shutdown.child()).await;
        return Ok(());
    }
    let mut lease = LeaderElectionConfig::new(&election.namespace, &election.name, &config.identity);
    lease.lease_duration = election.lease_duration;
    lease.renew_deadline = election.renew_deadline;
    lease.retry_period = election.retry_period;
    let elector = LeaderElector::new(client.clone(), lease);
    let mut leading = elector.leader_watch();
    let stopped = shutdown.clone();
    shutdown.spawn(async move {
        loop {
            tokio::select! {
                _ = stopped.cancelled() => break,
                changed = leading.changed() => if changed.is_err() { break },
            }
            metrics().leader.set(i64::from(*leading.borrow()));
        }
        metrics().leader.set(0);
    });
    elector
        .run(shutdown.clone(), move |leading: Shutdown| {
            let (client, config) = (client.clone(), config.clone());
            async move {
                tracing::info!("leading: starting the controllers");
                // Losing the lease cancels `leading`; the elector then waits
                // for every task started on it before competing again.
                run_controllers(client, config, leading).await;
                tracing::info!("controllers stopped");
            }
        })
        .await;
    Ok(())
}

/// Runs the enabled controllers until `shutdown` is cancelled, then waits
/// for them.
async fn run_controllers(client: Client, config: ControllerManagerConfig, shutdown: Shutdown) {
    let informers = Informers::new(client.clone(), shutdown.clone());
    let custom = custom::Definitions(informers.informer::<CustomResourceDefinition>().store());
    let recorder = Recorder::new("controller-manager");
    let ctx = Arc::new(Context { client, informers, recorder, config, custom });
    for &name in &ctx.config.controllers {
        if !start(name, &ctx, &shutdown) {
            tracing::warn!(controller = name, "not built yet; not started");
        }
    }
    shutdown.cancelled().await;
}

/// Starts controller `name` on `shutdown`; false if this manager has none
/// of that name.
fn start(name: &'static str, ctx: &Arc<Context>, shutdown: &Shutdown) -> bool {
    match name {
        "replicaset" => workloads::replicasets(ctx, shutdown),
        "replicationcontroller" => workloads::replication_controllers(ctx, shutdown),
        "deployment" => workloads::deployments(ctx, shutdown),
        "namespace" => cluster::namespaces(ctx, shutdown),
        "serviceaccount" => cluster::service_accounts(ctx, shutdown),
        "root-ca-cert-publisher" => cluster::root_ca_publisher(ctx, shutdown),
        "garbagecollector" => cluster::garbage_collector(ctx, shutdown),
        "podgc" => cluster::pod_gc(ctx, shutdown),
        "nodeipam" => cluster::node_ipam(ctx, shutdown),
        "nodelifecycle" => cluster::node_lifecycle(ctx, shutdown),
        "job" => batch::jobs(ctx, shutdown),
        "cronjob" => batch::cron_jobs(ctx, shutdown),
        "daemonset" => batch::daemon_sets(ctx, shutdown),
        "endpoint" => network::endpoints(ctx, shutdown),
        "endpointslice" => network::endpoint_slices(ctx, shutdown),
        "servicelb" => network::service_lb(ctx, shutdown),
        "resourcequota" => network::resource_quotas(ctx, shutdown),
        "disruption" => disruption::disruption(ctx, shutdown),
        _ => return false,
    }
    true
}

/// Carries out one reconcile's actions as controller `name`, and says when
/// to look again. `skipped` hears the actions a failure left undone.
pub(crate) async fn drive(
    ctx: &Context,
    name: &'static str,
    started: Instant,
    reconciled: Reconciled,
    skipped: impl FnOnce(&[Action], &ExecuteError),
) -> Result<ReconcileAction, ExecuteError> {
    let result = execute(&ctx.client, &ctx.recorder, &ctx.custom, reconciled.actions).await;
    let outcome = match &result {
        Ok(_) => "success",
        Err(Failed { error, .. }) if error.is_conflict() => "conflict",
        Err(_) => "error",
    };
    metrics().reconciled(name, outcome, started.elapsed());
    match result {
        Ok(_) => Ok(reconciled.requeue_after.map_or(ReconcileAction::AwaitChange, ReconcileAction::RequeueAfter)),
        Err(Failed { error, skipped: undone }) => {
            skipped(&undone, &error);
            metrics().retries.with_label_values(&[name]).inc();
            Err(error)
        }
    }
}

/// [`drive`] for a reconcile of `about`: a failure (other than a stale
/// cache's Conflict, which the retry settles) is also recorded as a
/// Warning Event on it, as Kubernetes' controllers do, so `kubectl
/// describe` shows why it is stuck.
pub(crate) async fn drive_about<K: skiff_client::runtime::api::Resource>(
    ctx: &Context,
    name: &'static str,
    started: Instant,
    reconciled: Reconciled,
    about: &K,
    skipped: impl FnOnce(&[Action], &ExecuteError),
) -> Result<ReconcileAction, ExecuteError> {
    let result = drive(ctx, name, started, reconciled, skipped).await;
    if let Err(e) = &result {
        if !e.is_conflict() {
            let regarding = serde_json::to_value(about).unwrap_or_default();
            let message = format!("{name} controller: {e}");
            ctx.recorder.record(&ctx.client, &regarding, "Warning", "ReconcileFailed", &message).await;
        }
    }
    result
}

/// Copies a runner's queue depth into `/metrics` once a second.
pub(crate) fn export_queue_depth(name: &'static str, counters: Arc<ControllerMetrics>, shutdown: &Shutdown) {
    let stopped = shutdown.clone();
    shutdown.spawn(async move {
        let gauge = metrics().queue_depth.with_label_values(&[name]);
        loop {
            gauge.set(i64::try_from(counters.snapshot().queue_depth).unwrap_or(i64::MAX));
            tokio::select! {
                _ = stopped.cancelled() => break,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
        gauge.set(0);
    });
}
