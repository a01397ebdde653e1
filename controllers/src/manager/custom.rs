//! Custom resources that controllers meet only as references: a pod's
//! owner that an operator's CustomResourceDefinition serves. No informer
//! watches every custom kind, so such an object is found through its
//! definition and read live from the apiserver, as Kubernetes' garbage
//! collector and disruption controller do through their REST mappers.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use skiff_client::runtime::reflector::Store;

/// A custom resource as the resource API names it.
#[derive(Clone, Debug, PartialEq, Eq)]
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

/// Custom owners found alive by a live read, by uid, so that each is read
/// once per `fresh_for` however many dependents it has.
pub(super) struct SeenAlive {
    fresh_for: Duration,
    seen: Mutex<HashMap<String, Instant>>,
}

impl SeenAlive {
    pub fn new(fresh_for: Duration) -> SeenAlive {
        SeenAlive { fresh_for, seen: Mutex::new(HashMap::new()) }
    }

    /// Whether `uid` was found alive less than `fresh_for` ago.
    pub fn recently(&self, uid: &str, now: Instant) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.retain(|_, at| now.duration_since(*at) < self.fresh_for);
        seen.contains_key(uid)
    }

    pub fn saw(&self, uid: &str, now: Instant) {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).insert(uid.to_string(), now);
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

    #[test]
    fn an_owner_seen_alive_is_not_read_again_until_the_sighting_is_stale() {
        let seen = SeenAlive::new(Duration::from_secs(15));
        let t0 = Instant::now();
        assert!(!seen.recently("a", t0));
        seen.saw("a", t0);
        assert!(seen.recently("a", t0 + Duration::from_secs(14)));
        assert!(!seen.recently("b", t0 + Duration::from_secs(14)));
        assert!(!seen.recently("a", t0 + Duration::from_secs(15)));
        // Stale sightings are dropped, so the map does not grow.
        assert!(seen.seen.lock().unwrap().is_empty());
    }
}
