//! Informers of every served kind seen as JSON, for the controllers that
//! deal with objects of any kind: the garbage collector (ownerReferences
//! across kinds) and the namespace controller (everything in a namespace).
//! Each is the process's shared typed informer of that kind, so this adds
//! no watch.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Endpoints, Event, LimitRange, Namespace, Node, Pod, ReplicationController, ResourceQuota, Secret,
    Service, ServiceAccount,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::Value;
use skiff_api::resources::Kind;
use skiff_client::runtime::api::Resource;
use skiff_client::runtime::informer::{Informer, Notification};
use skiff_client::runtime::reflector::{Change, Index};
use skiff_shutdown::Shutdown;
use tokio::sync::mpsc;

use super::Context;

/// A change of any kind, as JSON.
pub(super) enum AnyChange {
    Applied(Value),
    Deleted(Value),
    /// A subscriber fell behind: re-read everything of `kind`.
    Resync(Kind),
}

/// Reads the objects of one namespace.
type NamespaceRead = Box<dyn Fn(&str) -> Vec<Value> + Send + Sync>;

/// One kind's shared informer, seen as JSON.
pub(super) struct AnyInformer {
    pub kind: Kind,
    /// The objects in one namespace.
    pub in_namespace: NamespaceRead,
    /// Every object.
    pub all: Box<dyn Fn() -> Vec<Value> + Send + Sync>,
    /// Resolves once the first list is in.
    pub ready: Box<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>,
    /// Forwards its changes to `to` until `shutdown`.
    pub forward: Box<dyn Fn(mpsc::Sender<AnyChange>, Shutdown) + Send + Sync>,
}

fn to_json<K: Resource>(obj: &K) -> Value {
    serde_json::to_value(obj).unwrap_or(Value::Null)
}

fn any<K: Resource>(kind: Kind, informer: Informer<K>) -> AnyInformer {
    let (a, b, c) = (informer.store(), informer.store(), informer.store());
    AnyInformer {
        kind,
        in_namespace: Box::new(move |ns| {
            a.by_index(Index::Namespace, ns).iter().map(|o| to_json(o.as_ref())).collect()
        }),
        all: Box::new(move || b.list().iter().map(|o| to_json(o.as_ref())).collect()),
        ready: Box::new(move || {
            let store = c.clone();
            async move {
                let _ = store.wait_until_ready().await;
            }
            .boxed()
        }),
        forward: Box::new(move |to, shutdown| {
            let mut changes = informer.subscribe();
            let stopped = shutdown.clone();
            shutdown.spawn(async move {
                loop {
                    let next = tokio::select! {
                        _ = stopped.cancelled() => return,
                        n = changes.recv() => n,
                    };
                    let change = match next {
                        Some(Notification::Changed(Change::Applied(o))) => AnyChange::Applied(to_json(o.as_ref())),
                        Some(Notification::Changed(Change::Deleted(o))) => AnyChange::Deleted(to_json(o.as_ref())),
                        Some(Notification::Resync) => AnyChange::Resync(kind),
                        None => return,
                    };
                    if to.send(change).await.is_err() {
                        return;
                    }
                }
            });
        }),
    }
}

/// Every served kind, from `ctx`'s shared informers.
pub(super) fn every_kind(ctx: &Context) -> Vec<Arc<AnyInformer>> {
    let i = &ctx.informers;
    vec![
        any(Kind::Namespace, i.informer::<Namespace>()),
        any(Kind::Pod, i.informer::<Pod>()),
        any(Kind::Node, i.informer::<Node>()),
        any(Kind::Service, i.informer::<Service>()),
        any(Kind::Endpoints, i.informer::<Endpoints>()),
        any(Kind::EndpointSlice, i.informer::<EndpointSlice>()),
        any(Kind::ConfigMap, i.informer::<ConfigMap>()),
        any(Kind::Secret, i.informer::<Secret>()),
        any(Kind::Event, i.informer::<Event>()),
        any(Kind::ServiceAccount, i.informer::<ServiceAccount>()),
        any(Kind::Lease, i.informer::<Lease>()),
        any(Kind::ReplicaSet, i.informer::<ReplicaSet>()),
        any(Kind::ReplicationController, i.informer::<ReplicationController>()),
        any(Kind::Deployment, i.informer::<Deployment>()),
        any(Kind::DaemonSet, i.informer::<DaemonSet>()),
        any(Kind::Job, i.informer::<Job>()),
        any(Kind::CronJob, i.informer::<CronJob>()),
        any(Kind::ResourceQuota, i.informer::<ResourceQuota>()),
        any(Kind::LimitRange, i.informer::<LimitRange>()),
    ]
    .into_iter()
    .map(Arc::new)
    .collect()
}
