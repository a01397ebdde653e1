//! Wiring of the Endpoints and EndpointSlice controllers, the service
//! load balancer, and the ResourceQuota controller (which also counts
//! what is in a namespace).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, ResourceQuota, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use skiff_api::resources::{self, Kind};
use skiff_client::resources::ListParams;
use skiff_client::runtime::controller::{Controller, ReconcileAction, Request};
use skiff_client::runtime::reflector::{Index, ObjectKey, Store};
use skiff_client::{Client, ClientError};
use skiff_shutdown::Shutdown;

use super::dynamic::{every_kind, AnyInformer};
use super::{drive, drive_about, export_queue_depth, Context};
use crate::action::Reconciled;
use crate::execute::ExecuteError;
use crate::{endpoints, endpointslice, resourcequota, servicelb};

/// Routes a pod's change to the Services of its namespace that select it
/// now or selected it before (its last labels are remembered), so a pod
/// whose labels change leaves the old Service's endpoints too.
struct ServiceRouter {
    services: Store<Service>,
    /// Pod (namespace, name) → the Services that selected it last time.
    last: Mutex<BTreeMap<(String, String), Vec<String>>>,
}

impl ServiceRouter {
    fn keys(&self, pod: &Pod) -> Vec<ObjectKey> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let empty = BTreeMap::new();
        let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
        let now: Vec<String> = self
            .services
            .by_index(Index::Namespace, &namespace)
            .iter()
            .filter(|s| {
                let selector = s.spec.as_ref().and_then(|s| s.selector.as_ref()).filter(|m| !m.is_empty());
                selector.is_some_and(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)))
            })
            .filter_map(|s| s.metadata.name.clone())
            .collect();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let before = last.insert((namespace.clone(), name), now.clone()).unwrap_or_default();
        let mut all: Vec<String> = now.into_iter().chain(before).collect();
        all.sort();
        all.dedup();
        all.into_iter().map(|s| ObjectKey::new(namespace.clone(), s)).collect()
    }
}

fn namespace_pods(pods: &Store<Pod>, namespace: &str) -> Vec<Pod> {
    pods.by_index(Index::Namespace, namespace).iter().map(|p| (**p).clone()).collect()
}

pub(super) fn endpoints(ctx: &Arc<Context>, shutdown: &Shutdown) {
    let services = ctx.informers.informer::<Service>();
    let pods = ctx.informers.informer::<Pod>();
    let current = ctx.informers.informer::<Endpoints>();
    let router = ServiceRouter { services: services.store(), last: Mutex::new(BTreeMap::new()) };
    // Someone else's write to an Endpoints object is put right again.
    let controller = Controller::new(&services)
        .watches(&pods, move |pod| router.keys(pod))
        .watches(&current, |e: &Endpoints| vec![ObjectKey::of(e)]);
    export_queue_depth("endpoint", controller.metrics(), shutdown);
    let shared = Arc::new((ctx.clone(), pods.store(), current.store()));
    type Shared = (Arc<Context>, Store<Pod>, Store<Endpoints>);
    let reconcile = |request: Request<Service>, shared: Arc<Shared>| async move {
        let started = Instant::now();
        let pods = namespace_pods(&shared.1, &request.key.namespace);
        let current = shared.2.get(&request.key);
        let actions = endpoints::reconcile(request.object.as_deref(), &pods, current.as_deref());
        drive(&shared.0, "endpoint", started, Reconciled { actions, requeue_after: None }, |_, _| {}).await
    };
    let workers = ctx.config.workers("endpoint");
    let stop = shutdown.clone();
    shutdown.spawn(controller.run(reconcile, shared, workers, stop));
}

pub(super) fn endpoint_slices(ctx: &Arc<Context>, shutdown: &Shutdown) {
    let services = ctx.informers.informer::<Service>();
    let pods = ctx.informers.informer::<Pod>();
    let slices = ctx.informers.informer::<EndpointSlice>();
    let router = ServiceRouter { services: services.store(), last: Mutex::new(BTreeMap::new()) };
    let controller =
        Controller::new(&services).watches(&pods, move |pod| router.keys(pod)).watches(&slices, |s: &EndpointSlice| {
            let labels = s.metadata.labels.as_ref();
            let service = labels.and_then(|l| l.get(endpointslice::SERVICE_NAME_LABEL));
            let namespace = s.metadata.namespace.clone().unwrap_or_default();
            service.map(|name| ObjectKey::new(namespace, name.clone())).into_iter().collect()
        });
    export_queue_depth("endpointslice", controller.metrics(), shutdown);
    let shared = Arc::new((ctx.clone(), pods.store(), slices.store()));
    type Shared = (Arc<Context>, Store<Pod>, Store<EndpointSlice>);
    let reconcile = |request: Request<Service>, shared: Arc<Shared>| async move {
        let started = Instant::now();
        let pods = namespace_pods(&shared.1, &request.key.namespace);
        let slices: Vec<EndpointSlice> =
            shared.2.by_index(Index::Namespace, &request.key.namespace).iter().map(|s| (**s).clone()).collect();
        let actions = endpointslice::reconcile(request.object.as_deref(), &pods, &slices);
        drive(&shared.0, "endpointslice", started, Reconciled { actions, requeue_after: None }, |_, _| {}).await
    };
    let workers = ctx.config.workers("endpointslice");
    let stop = shutdown.clone();
    shutdown.spawn(controller.run(reconcile, shared, workers, stop));
}

pub(super) fn service_lb(ctx: &Arc<Context>, shutdown: &Shutdown) {
    let services = ctx.informers.informer::<Service>();
    let nodes = ctx.informers.informer::<Node>();
    let service_store = services.store();
    // A node's change may change every LoadBalancer's addresses (and a
    // Service turned into another type keeps its key through its own events).
    let controller = Controller::new(&services).watches(&nodes, move |_: &Node| {
        service_store
            .list()
            .iter()
            .filter(|s| s.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer"))
            .map(|s| ObjectKey::of(s.as_ref()))
            .collect()
    });
    export_queue_depth("servicelb", controller.metrics(), shutdown);
    let shared = Arc::new((ctx.clone(), nodes.store()));
    type Shared = (Arc<Context>, Store<Node>);
    let reconcile = |request: Request<Service>, shared: Arc<Shared>| async move {
        let Some(service) = request.object else { return Ok::<_, ExecuteError>(ReconcileAction::AwaitChange) };
        let started = Instant::now();
        let nodes = shared.1.list();
        let ingress = servicelb::ingress_ips(nodes.iter().map(|n| n.as_ref()));
        let actions = servicelb::reconcile(&service, &ingress);
        drive(&shared.0, "servicelb", started, Reconciled { actions, requeue_after: None }, |_, _| {}).await
    };
    let stop = shutdown.clone();
    shutdown.spawn(controller.run(reconcile, shared, 1, stop));
}

/// What a quota counts, read from the apiserver rather than the caches.
async fn live_usage(
    client: &Client,
    quota: &ResourceQuota,
    namespace: &str,
) -> Result<(Vec<Pod>, resourcequota::ObjectCounts), ClientError> {
    let params = ListParams::default();
    let listed = client.list_all(resources::of(Kind::Pod), namespace, &params).await?;
    let pods = listed.items.into_iter().filter_map(|p| serde_json::from_value(p).ok()).collect();
    let mut counts = resourcequota::ObjectCounts::new();
    for wanted in resourcequota::counted_resources(quota) {
        let (plural, group) = wanted.split_once('.').unwrap_or((wanted.as_str(), ""));
        let Some(info) = resources::by_plural(Some(group), plural) else { continue };
        let n = client.list_all(info, namespace, &params).await?.items.len();
        counts.insert(wanted, i64::try_from(n).unwrap_or(i64::MAX));
    }
    Ok((pods, counts))
}

/// How often a quota is recounted even without a pod event (objects of
/// other kinds come and go without one).
const QUOTA_RESYNC: Duration = Duration::from_secs(5);

pub(super) fn resource_quotas(ctx: &Arc<Context>, shutdown: &Shutdown) {
    let quotas = ctx.informers.informer::<ResourceQuota>();
    let pods = ctx.informers.informer::<Pod>();
    let quota_store = quotas.store();
    let controller = Controller::new(&quotas).watches(&pods, move |pod: &Pod| {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        quota_store.by_index(Index::Namespace, namespace).iter().map(|q| ObjectKey::of(q.as_ref())).collect()
    });
    export_queue_depth("resourcequota", controller.metrics(), shutdown);
    let shared = Arc::new((ctx.clone(), pods.store(), every_kind(ctx)));
    type Shared = (Arc<Context>, Store<Pod>, Vec<Arc<AnyInformer>>);
    let reconcile = |request: Request<ResourceQuota>, shared: Arc<Shared>| async move {
        let Some(quota) = request.object else { return Ok::<_, ExecuteError>(ReconcileAction::AwaitChange) };
        let started = Instant::now();
        let namespace = request.key.namespace.as_str();
        let mut counts = resourcequota::ObjectCounts::new();
        for wanted in resourcequota::counted_resources(&quota) {
            let (plural, group) = wanted.split_once('.').unwrap_or((wanted.as_str(), ""));
            let Some(info) = resources::by_plural(Some(group), plural) else { continue };
            if let Some(informer) = shared.2.iter().find(|i| i.kind == info.kind_id) {
                (informer.ready)().await;
                let n = (informer.in_namespace)(namespace).len();
                counts.insert(wanted.clone(), i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
        let pods = namespace_pods(&shared.1, namespace);
        let mut actions: Vec<_> = resourcequota::reconcile(&quota, &pods, &counts).into_iter().collect();
        if actions.iter().any(|a| resourcequota::lowers_usage(&quota, a)) {
            // The caches may lag the creates admission charged: recount
            // from a linearizable read (the status write is still a
            // compare-and-swap on the quota's resourceVersion).
            let (pods, counts) =
                live_usage(&shared.0.client, &quota, namespace).await.map_err(|source| ExecuteError::Api {
                    verb: "list",
                    kind: "ResourceQuota usage".into(),
                    namespace: namespace.to_string(),
                    name: request.key.name.clone(),
                    source: Box::new(source),
                })?;
            actions = resourcequota::reconcile(&quota, &pods, &counts).into_iter().collect();
        }
        let reconciled = Reconciled { actions, requeue_after: Some(QUOTA_RESYNC) };
        drive_about(&shared.0, "resourcequota", started, reconciled, quota.as_ref(), |_, _| {}).await
    };
    let stop = shutdown.clone();
    shutdown.spawn(controller.run(reconcile, shared, 2, stop));
}
