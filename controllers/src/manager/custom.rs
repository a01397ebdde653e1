//! Custom resources, which no typed informer watches: a pod's owner that
//! an operator's CustomResourceDefinition serves is found through its
//! definition and read live from the apiserver, as Kubernetes' garbage
//! collector and disruption controller do through their REST mappers; and
//! the garbage collector's graph is fed every custom object by a list and
//! watch per served definition ([`feed_custom_objects`]), as Kubernetes'
//! collector starts a monitor for every resource discovery finds.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;
use skiff_api::watch::EventType;
use skiff_client::resources::{ListParams, WatchParams};
use skiff_client::runtime::informer::Notification;
use skiff_client::runtime::reflector::Store;
use skiff_client::Client;
use skiff_shutdown::Shutdown;
use tokio::sync::mpsc;

use super::dynamic::AnyChange;
use super::Context;

use crate::execute::CustomKinds;

/// A custom resource as the resource API names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Served {
    pub group: String,
    pub plural: String,
    pub namespaced: bool,
}

/// The CustomResourceDefinitions, from the shared informer.
pub(super) struct Definitions(pub Store<CustomResourceDefinition>);

impl Definitions {
    /// The resource that serves `api_version` and `kind` (a reference's),
    /// if a definition serves that version (with a `scale` subresource, if
    /// `scalable`). None for the built-in kinds and for kinds nobody serves.
    pub fn serving(&self, api_version: &str, kind: &str, scalable: bool) -> Option<Served> {
        let (group, version) = api_version.rsplit_once('/')?;
        self.0.list().iter().find_map(|crd| {
            let spec = &crd.spec;
            let serves = spec.versions.iter().any(|v| {
                v.name == version
                    && v.served
                    && (!scalable || v.subresources.as_ref().is_some_and(|s| s.scale.is_some()))
            });
            (spec.group == group && spec.names.kind == kind && serves).then(|| Served {
                group: spec.group.clone(),
                plural: spec.names.plural.clone(),
                namespaced: spec.scope != "Cluster",
            })
        })
    }
}

impl CustomKinds for Definitions {
    fn serving(&self, api_version: &str, kind: &str) -> Option<(String, String)> {
        Definitions::serving(self, api_version, kind, false).map(|s| (s.group, s.plural))
    }
}

impl Served {
    /// The resource as Kubernetes names it in messages: `widgets.example.com`.
    pub fn qualified(&self) -> String {
        format!("{}.{}", self.plural, self.group)
    }
}

impl Definitions {
    /// The namespaced resources the definitions serve.
    pub fn namespaced(&self) -> Vec<Served> {
        self.0.list().iter().filter_map(|crd| served_by(crd)).filter(|s| s.namespaced).collect()
    }
}

/// The resource a definition serves, if it serves any version.
fn served_by(crd: &CustomResourceDefinition) -> Option<Served> {
    let spec = &crd.spec;
    spec.versions.iter().any(|v| v.served).then(|| Served {
        group: spec.group.clone(),
        plural: spec.names.plural.clone(),
        namespaced: spec.scope != "Cluster",
    })
}

/// The objects of one custom resource that a feed has passed on, by uid,
/// so that a new list tells which went meanwhile, and a definition's
/// removal which to report gone.
#[derive(Debug, Default)]
pub(super) struct Known(HashMap<String, Value>);

impl Known {
    /// A fresh list of every object: those not in it are reported deleted,
    /// every listed one applied.
    pub fn relisted(&mut self, items: Vec<Value>) -> Vec<AnyChange> {
        let mut now: HashMap<String, Value> = HashMap::with_capacity(items.len());
        for obj in items {
            if let Some(uid) = skiff_api::meta::uid(&obj) {
                now.insert(uid.to_string(), obj);
            }
        }
        let gone = self.0.drain().filter(|(uid, _)| !now.contains_key(uid)).map(|(_, obj)| AnyChange::Deleted(obj));
        let mut changes: Vec<AnyChange> = gone.collect();
        changes.extend(now.values().cloned().map(AnyChange::Applied));
        self.0 = now;
        changes
    }

    /// One watch event's change, if it is one.
    pub fn watched(&mut self, kind: EventType, obj: Value) -> Option<AnyChange> {
        let uid = skiff_api::meta::uid(&obj)?.to_string();
        match kind {
            EventType::Added | EventType::Modified => {
                self.0.insert(uid, obj.clone());
                Some(AnyChange::Applied(obj))
            }
            EventType::Deleted => {
                self.0.remove(&uid);
                Some(AnyChange::Deleted(obj))
            }
            EventType::Bookmark | EventType::Error => None,
        }
    }

    /// Every object, reported deleted: its definition is gone, and the
    /// apiserver deletes a definition's objects with it.
    pub fn forget_all(&mut self) -> Vec<AnyChange> {
        self.0.drain().map(|(_, obj)| AnyChange::Deleted(obj)).collect()
    }
}

/// How long a feed waits before watching or listing again, at first and
/// (doubling while lists fail) at most.
const FEED_RETRY_MIN: Duration = Duration::from_millis(200);
const FEED_RETRY_MAX: Duration = Duration::from_secs(10);
/// Objects per page of a feed's list.
const FEED_PAGE: i64 = 500;

/// Sends `to` every object of every custom resource and then their
/// changes, for as long as `shutdown` runs: one feed per resource a
/// definition serves, started when the definition appears and stopped when
/// it goes (its objects then reported deleted).
pub(super) fn feed_custom_objects(ctx: &Arc<Context>, shutdown: &Shutdown, to: mpsc::Sender<AnyChange>) {
    let definitions = ctx.informers.informer::<CustomResourceDefinition>();
    let store = definitions.store();
    let mut changes = definitions.subscribe();
    let (client, stop) = (ctx.client.clone(), shutdown.clone());
    shutdown.spawn(async move {
        let mut feeds: HashMap<Served, (Shutdown, Arc<Mutex<Known>>)> = HashMap::new();
        loop {
            let wanted: HashSet<Served> = store.list().iter().filter_map(|crd| served_by(crd)).collect();
            let gone: Vec<Served> = feeds.keys().filter(|s| !wanted.contains(*s)).cloned().collect();
            for served in gone {
                let Some((feed, known)) = feeds.remove(&served) else { continue };
                feed.stop().await;
                let forgotten = known.lock().unwrap_or_else(|e| e.into_inner()).forget_all();
                for change in forgotten {
                    if to.send(change).await.is_err() {
                        return;
                    }
                }
            }
            for served in wanted {
                if let std::collections::hash_map::Entry::Vacant(slot) = feeds.entry(served) {
                    let (feed, known) = (stop.child(), Arc::new(Mutex::new(Known::default())));
                    let served = slot.key().clone();
                    feed.spawn(feed_one(client.clone(), served, known.clone(), to.clone(), feed.clone()));
                    slot.insert((feed, known));
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                n = changes.recv() => if n.is_none() { return },
            }
            // A burst of definition changes is one look at the store.
            while let Ok(Some(Notification::Changed(_) | Notification::Resync)) =
                tokio::time::timeout(Duration::ZERO, changes.recv()).await
            {}
        }
    });
}

/// One custom resource's objects: a list, then a watch from the list's
/// revision, resumed from the last revision seen when the server ends it
/// (its timeout, an apiserver restarting); after a failure (the revision
/// compacted away, no apiserver) a new list, which also reports the
/// objects deleted meanwhile.
async fn feed_one(
    client: Client,
    served: Served,
    known: Arc<Mutex<Known>>,
    to: mpsc::Sender<AnyChange>,
    stop: Shutdown,
) {
    let mut retry = FEED_RETRY_MIN;
    let pause = |d: Duration| {
        let stop = stop.clone();
        async move {
            tokio::select! {
                _ = stop.cancelled() => false,
                _ = tokio::time::sleep(d) => true,
            }
        }
    };
    loop {
        let params = ListParams { limit: FEED_PAGE, ..ListParams::default() };
        let listed = tokio::select! {
            _ = stop.cancelled() => return,
            l = client.list_all_of(&served.group, &served.plural, "", &params) => l,
        };
        let list = match listed {
            Ok(list) => list,
            Err(e) => {
                // A definition not yet Established is not served yet.
                tracing::debug!(resource = %served.qualified(), error = %e, "cannot list custom objects");
                if !pause(retry).await {
                    return;
                }
                retry = (retry * 2).min(FEED_RETRY_MAX);
                continue;
            }
        };
        retry = FEED_RETRY_MIN;
        let changes = known.lock().unwrap_or_else(|e| e.into_inner()).relisted(list.items);
        for change in changes {
            if to.send(change).await.is_err() {
                return;
            }
        }
        let mut revision = list.resource_version;
        // Watches from `revision` until one fails; then the list again.
        loop {
            let params =
                WatchParams { resource_version: revision.clone(), allow_bookmarks: true, ..WatchParams::default() };
            let mut events = match client.watch_of(&served.group, &served.plural, "", &params).await {
                Ok(events) => Box::pin(events),
                Err(e) => {
                    tracing::debug!(resource = %served.qualified(), error = %e, "cannot watch custom objects");
                    break;
                }
            };
            let failed = loop {
                let event = tokio::select! {
                    _ = stop.cancelled() => return,
                    e = events.next() => e,
                };
                let event = match event {
                    None => break false,
                    Some(Err(_)) => break true,
                    Some(Ok(event)) if event.kind == EventType::Error => break true,
                    Some(Ok(event)) => event,
                };
                if let Some(rv) = event.resource_version() {
                    revision = rv.to_string();
                }
                let change = known.lock().unwrap_or_else(|e| e.into_inner()).watched(event.kind, event.object);
                if let Some(change) = change {
                    if to.send(change).await.is_err() {
                        return;
                    }
                }
            };
            if failed || !pause(FEED_RETRY_MIN).await {
                break;
            }
        }
        if !pause(retry).await {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use skiff_client::runtime::reflector::Writer;
    use skiff_client::runtime::watcher::Event;

    use super::*;

    fn definitions(crds: &[serde_json::Value]) -> Definitions {
        let mut writer = Writer::<CustomResourceDefinition>::new();
        writer.apply(Event::Init);
        for crd in crds {
            writer.apply(Event::InitApply(serde_json::from_value(crd.clone()).unwrap()));
        }
        writer.apply(Event::InitDone);
        Definitions(writer.store())
    }

    fn crd(kind: &str, scope: &str, versions: serde_json::Value) -> serde_json::Value {
        let plural = format!("{}s", kind.to_ascii_lowercase());
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.example.com")},
            "spec": {"group": "example.com", "scope": scope,
                "names": {"kind": kind, "plural": plural}, "versions": versions}})
    }

    #[test]
    fn a_reference_is_served_by_the_definition_of_its_group_version_and_kind() {
        let scaled = json!({"name": "v1", "served": true, "storage": true,
            "subresources": {"scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}}});
        let plain = json!({"name": "v1beta1", "served": true, "storage": false});
        let retired = json!({"name": "v1alpha1", "served": false, "storage": false,
            "subresources": {"scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}}});
        let defs = definitions(&[
            crd("Flock", "Namespaced", json!([scaled, plain, retired])),
            crd("Pasture", "Cluster", json!([{"name": "v1", "served": true, "storage": true}])),
        ]);
        let flocks = Some(Served { group: "example.com".into(), plural: "flocks".into(), namespaced: true });
        assert_eq!(defs.serving("example.com/v1", "Flock", true), flocks);
        assert_eq!(defs.serving("example.com/v1beta1", "Flock", false), flocks);
        // That version has no scale subresource; that one is not served.
        assert_eq!(defs.serving("example.com/v1beta1", "Flock", true), None);
        assert_eq!(defs.serving("example.com/v1alpha1", "Flock", false), None);
        let pastures = defs.serving("example.com/v1", "Pasture", false).unwrap();
        assert!(!pastures.namespaced);
        // Other groups, unknown kinds, and the core group's `v1` are not
        // custom resources.
        assert_eq!(defs.serving("other.io/v1", "Flock", false), None);
        assert_eq!(defs.serving("example.com/v1", "Herd", false), None);
        assert_eq!(defs.serving("v1", "Pod", false), None);
    }

    fn object(name: &str, uid: &str, rv: &str) -> Value {
        json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": name, "namespace": "default", "uid": uid, "resourceVersion": rv}})
    }

    /// (applied or deleted, name) of each change, sorted.
    fn summary(changes: &[AnyChange]) -> Vec<(&'static str, String)> {
        let mut out: Vec<_> = changes
            .iter()
            .map(|c| match c {
                AnyChange::Applied(o) => ("applied", o["metadata"]["name"].as_str().unwrap().to_string()),
                AnyChange::Deleted(o) => ("deleted", o["metadata"]["name"].as_str().unwrap().to_string()),
                AnyChange::Resync(_) => ("resync", String::new()),
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn a_feed_reports_what_a_relist_lost_and_a_removed_definition_takes_everything() {
        let mut known = Known::default();
        let listed = known.relisted(vec![object("a", "u1", "1"), object("b", "u2", "2")]);
        assert_eq!(summary(&listed), vec![("applied", "a".into()), ("applied", "b".into())]);

        let added = known.watched(EventType::Added, object("c", "u3", "3")).into_iter().collect::<Vec<_>>();
        assert_eq!(summary(&added), vec![("applied", "c".into())]);
        assert!(known.watched(EventType::Bookmark, object("", "u9", "4")).is_none());
        let deleted = known.watched(EventType::Deleted, object("a", "u1", "5")).into_iter().collect::<Vec<_>>();
        assert_eq!(summary(&deleted), vec![("deleted", "a".into())]);

        // The watch broke; meanwhile b went and d came, and c was replaced
        // by a new object of its name (a new uid): the old c is gone.
        let relisted = known.relisted(vec![object("c", "u4", "7"), object("d", "u5", "8")]);
        assert_eq!(
            summary(&relisted),
            vec![("applied", "c".into()), ("applied", "d".into()), ("deleted", "b".into()), ("deleted", "c".into())]
        );

        let forgotten = known.forget_all();
        assert_eq!(summary(&forgotten), vec![("deleted", "c".into()), ("deleted", "d".into())]);
        assert!(known.forget_all().is_empty());
    }
}
