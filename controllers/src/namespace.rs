//! The namespace controller: empties a namespace being deleted, then
//! releases it.
//!
//! Deleting a namespace whose `spec.finalizers` holds `kubernetes` (the
//! apiserver adds it on create) only marks it `Terminating`. For such a
//! namespace [`reconcile`] asks for every object still in it to be deleted
//! (propagation `Background`), reports progress in the namespace's status
//! conditions as Kubernetes does (`NamespaceContentRemaining`,
//! `NamespaceFinalizersRemaining`, ...), and once nothing is left removes
//! `kubernetes` from `spec.finalizers` through the `finalize` subresource,
//! after which the apiserver removes the namespace.
//!
//! The content comes as JSON, grouped by resource: the wiring lists every
//! namespaced kind of [`namespaced_resources`] in the namespace (from its
//! caches), and every namespaced custom resource (from the API, as
//! Kubernetes finds them through discovery), and passes what it found, so
//! custom objects go through their own deletion, finalizers included,
//! before the namespace does. The wiring requeues
//! the namespace while content remains (Kubernetes re-checks after a few
//! seconds), since objects with finalizers or grace periods leave later.

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use k8s_openapi::api::core::v1::Namespace;
use serde_json::{json, Value};
use skiff_api::resources::{self, ResourceInfo};

use crate::action::Action;

/// The finalizer in `spec.finalizers` that this controller owns.
pub const FINALIZER: &str = "kubernetes";

/// The objects left in a namespace (each with its `apiVersion` and
/// `kind`), by resource as Kubernetes names it in the namespace's
/// conditions: `pods`, `deployments.apps`, `widgets.example.com`.
pub type Content = BTreeMap<String, Vec<Value>>;

/// The namespaced resources a namespace's content is made of: the kinds
/// the wiring lists for [`reconcile`].
pub fn namespaced_resources() -> impl Iterator<Item = &'static ResourceInfo> {
    resources::catalog().iter().filter(|r| r.namespaced)
}

/// What to do about `namespace` given what is left in it (`content`,
/// every namespaced kind's objects in that namespace) at `now`. Nothing
/// for a namespace that is not being deleted or not finalized by us.
pub fn reconcile(namespace: &Namespace, content: &Content, now: DateTime<Utc>) -> Vec<Action> {
    let finalizers = namespace.spec.as_ref().and_then(|s| s.finalizers.clone()).unwrap_or_default();
    if namespace.metadata.deletion_timestamp.is_none() || !finalizers.iter().any(|f| f == FINALIZER) {
        return vec![];
    }
    let mut actions = Vec::new();
    // Per resource: how many objects remain; per finalizer: on how many.
    let mut remaining: BTreeMap<String, usize> = BTreeMap::new();
    let mut held: BTreeMap<String, usize> = BTreeMap::new();
    for (resource, objects) in content {
        for obj in objects {
            *remaining.entry(resource.clone()).or_default() += 1;
            for finalizer in skiff_api::meta::finalizers(obj) {
                *held.entry(finalizer).or_default() += 1;
            }
            if skiff_api::meta::deletion_timestamp(obj).is_none() {
                actions.push(delete(obj));
            }
        }
    }
    if remaining.is_empty() {
        // Finalize alone: a status write first would change the
        // resourceVersion the finalize is conditional on.
        let rest: Vec<&String> = finalizers.iter().filter(|f| *f != FINALIZER).collect();
        let mut finalized = to_json(namespace);
        finalized["spec"]["finalizers"] = json!(rest);
        return vec![Action::Finalize(finalized)];
    }
    if let Some(status) = status_update(namespace, &remaining, &held, now) {
        actions.push(Action::UpdateStatus(status));
    }
    actions
}

fn delete(obj: &Value) -> Action {
    let field = |name: &str| obj[name].as_str().unwrap_or_default().to_string();
    Action::Delete {
        api_version: field("apiVersion"),
        kind: field("kind"),
        namespace: skiff_api::meta::namespace(obj).unwrap_or_default().to_string(),
        name: skiff_api::meta::name(obj).unwrap_or_default().to_string(),
        uid: skiff_api::meta::uid(obj).map(str::to_string),
        propagation: Some("Background".into()),
    }
}

fn to_json(namespace: &Namespace) -> Value {
    // A k8s-openapi object always serializes (apiVersion and kind included).
    serde_json::to_value(namespace).unwrap_or(Value::Null)
}

/// The namespace with its deletion conditions brought up to date, or
/// `None` when they already say so. Only while content remains.
fn status_update(
    namespace: &Namespace,
    remaining: &BTreeMap<String, usize>,
    held: &BTreeMap<String, usize>,
    now: DateTime<Utc>,
) -> Option<Value> {
    // Called while content remains: the namespace is finalized, not
    // updated, once it is empty.
    let parts: Vec<String> = remaining.iter().map(|(r, n)| format!("{r} has {n} resource instances")).collect();
    let content = Condition::new(
        "NamespaceContentRemaining",
        true,
        "SomeResourcesRemain",
        &format!("Some resources are remaining: {}", parts.join(", ")),
    );
    let finalizers = if held.is_empty() {
        Condition::new(
            "NamespaceFinalizersRemaining",
            false,
            "ContentHasNoFinalizers",
            "All content-preserving finalizers finished",
        )
    } else {
        let parts: Vec<String> = held.iter().map(|(f, n)| format!("{f} in {n} resource instances")).collect();
        Condition::new(
            "NamespaceFinalizersRemaining",
            true,
            "SomeFinalizersRemain",
            &format!("Some content in the namespace has finalizers remaining: {}", parts.join(", ")),
        )
    };
    let wanted = [
        Condition::new(
            "NamespaceDeletionDiscoveryFailure",
            false,
            "ResourcesDiscovered",
            "All resources successfully discovered",
        ),
        Condition::new(
            "NamespaceDeletionGroupVersionParsingFailure",
            false,
            "ParsedGroupVersions",
            "All legacy kube types successfully parsed",
        ),
        Condition::new(
            "NamespaceDeletionContentFailure",
            false,
            "ContentDeleted",
            "All content successfully deleted, may be waiting on finalization",
        ),
        content,
        finalizers,
    ];
    let mut obj = to_json(namespace);
    let current = obj["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let mut changed = false;
    let mut conditions = Vec::new();
    for want in &wanted {
        let old = current.iter().find(|c| c["type"] == want.type_);
        let same = old.is_some_and(|c| {
            c["status"] == want.status() && c["reason"] == want.reason && c["message"] == want.message
        });
        changed |= !same;
        let since = match old {
            Some(c) if c["status"] == want.status() => c["lastTransitionTime"].clone(),
            _ => json!(now.to_rfc3339_opts(SecondsFormat::Secs, true)),
        };
        conditions.push(json!({"type": want.type_, "status": want.status(), "lastTransitionTime": since,
            "reason": want.reason, "message": want.message}));
    }
    // Conditions someone else set are kept after ours.
    conditions.extend(current.iter().filter(|c| !wanted.iter().any(|w| c["type"] == w.type_)).cloned());
    if !changed {
        return None;
    }
    obj["status"]["conditions"] = json!(conditions);
    if obj["status"]["phase"].is_null() {
        obj["status"]["phase"] = json!("Terminating");
    }
    Some(obj)
}

struct Condition {
    type_: &'static str,
    true_: bool,
    reason: &'static str,
    message: String,
}

impl Condition {
    fn new(type_: &'static str, true_: bool, reason: &'static str, message: &str) -> Self {
        Condition { type_, true_, reason, message: message.to_string() }
    }

    fn status(&self) -> &'static str {
        if self.true_ {
            "True"
        } else {
            "False"
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use k8s_openapi::api::core::v1::NamespaceSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use skiff_api::resources::Kind;

    use super::*;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()
    }

    fn terminating(finalizers: &[&str]) -> Namespace {
        let mut ns = Namespace::default();
        ns.metadata.name = Some("team".into());
        ns.metadata.resource_version = Some("7".into());
        ns.metadata.deletion_timestamp = Some(Time(now()));
        ns.spec = Some(NamespaceSpec { finalizers: Some(finalizers.iter().map(|f| f.to_string()).collect()) });
        ns
    }

    fn cm(name: &str, extra: Value) -> Value {
        let mut obj = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "team", "uid": format!("uid-{name}")}});
        if let Some(m) = extra.as_object() {
            for (k, v) in m {
                obj["metadata"][k] = v.clone();
            }
        }
        obj
    }

    fn condition<'a>(actions: &'a [Action], type_: &str) -> &'a Value {
        let status = actions
            .iter()
            .find_map(|a| match a {
                Action::UpdateStatus(obj) => Some(obj),
                _ => None,
            })
            .expect("a status update");
        status["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == type_).unwrap()
    }

    #[test]
    fn an_active_namespace_is_left_alone() {
        let mut ns = terminating(&["kubernetes"]);
        ns.metadata.deletion_timestamp = None;
        let content = Content::from([("configmaps".to_string(), vec![cm("a", json!({}))])]);
        assert!(reconcile(&ns, &content, now()).is_empty());
    }

    #[test]
    fn a_namespace_without_our_finalizer_is_left_alone() {
        let ns = terminating(&["example.com/other"]);
        assert!(reconcile(&ns, &Content::new(), now()).is_empty());
    }

    #[test]
    fn every_object_not_yet_deleting_is_deleted_in_the_background() {
        let ns = terminating(&["kubernetes"]);
        let content = Content::from([
            (
                "configmaps".to_string(),
                vec![cm("a", json!({})), cm("b", json!({"deletionTimestamp": "2026-01-01T00:00:00Z"}))],
            ),
            ("pods".to_string(), vec![]),
        ]);
        let actions = reconcile(&ns, &content, now());
        let deletes: Vec<&Action> = actions.iter().filter(|a| matches!(a, Action::Delete { .. })).collect();
        assert_eq!(
            deletes,
            vec![&Action::Delete {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                namespace: "team".into(),
                name: "a".into(),
                uid: Some("uid-a".into()),
                propagation: Some("Background".into()),
            }]
        );
        assert!(!actions.iter().any(|a| matches!(a, Action::Finalize(_))), "content remains");
    }

    #[test]
    fn custom_objects_are_deleted_as_their_definition_names_them_and_hold_the_namespace() {
        let ns = terminating(&["kubernetes"]);
        let flock = json!({"apiVersion": "example.com/v1", "kind": "Flock",
            "metadata": {"name": "birds", "namespace": "team", "uid": "u1", "finalizers": ["example.com/keep"]}});
        let content = Content::from([("flocks.example.com".to_string(), vec![flock])]);
        let actions = reconcile(&ns, &content, now());
        assert!(actions.contains(&Action::Delete {
            api_version: "example.com/v1".into(),
            kind: "Flock".into(),
            namespace: "team".into(),
            name: "birds".into(),
            uid: Some("u1".into()),
            propagation: Some("Background".into()),
        }));
        assert!(!actions.iter().any(|a| matches!(a, Action::Finalize(_))), "the Flock remains");
        assert_eq!(
            condition(&actions, "NamespaceContentRemaining")["message"],
            "Some resources are remaining: flocks.example.com has 1 resource instances"
        );
        assert_eq!(
            condition(&actions, "NamespaceFinalizersRemaining")["message"],
            "Some content in the namespace has finalizers remaining: example.com/keep in 1 resource instances"
        );
    }

    #[test]
    fn conditions_name_what_remains_and_which_finalizers_hold_it() {
        let ns = terminating(&["kubernetes"]);
        let content = Content::from([(
            "configmaps".to_string(),
            vec![cm("a", json!({"finalizers": ["example.com/keep"]})), cm("b", json!({}))],
        )]);
        let actions = reconcile(&ns, &content, now());
        let remaining = condition(&actions, "NamespaceContentRemaining");
        assert_eq!(remaining["status"], "True");
        assert_eq!(remaining["message"], "Some resources are remaining: configmaps has 2 resource instances");
        let held = condition(&actions, "NamespaceFinalizersRemaining");
        assert_eq!(held["status"], "True");
        assert_eq!(
            held["message"],
            "Some content in the namespace has finalizers remaining: example.com/keep in 1 resource instances"
        );
        assert_eq!(condition(&actions, "NamespaceDeletionContentFailure")["status"], "False");
    }

    #[test]
    fn unchanged_conditions_are_not_written_again() {
        let mut ns = terminating(&["kubernetes"]);
        let content = Content::from([("configmaps".to_string(), vec![cm("a", json!({"deletionTimestamp": "x"}))])]);
        let first = reconcile(&ns, &content, now());
        let Some(Action::UpdateStatus(written)) = first.iter().find(|a| matches!(a, Action::UpdateStatus(_))) else {
            panic!("first pass writes the conditions");
        };
        ns = serde_json::from_value(written.clone()).unwrap();
        let later = now() + chrono::Duration::seconds(30);
        assert!(reconcile(&ns, &content, later).is_empty());
    }

    #[test]
    fn an_empty_namespace_is_finalized_keeping_other_finalizers() {
        let ns = terminating(&["example.com/other", "kubernetes"]);
        let actions = reconcile(&ns, &Content::from([("pods".to_string(), vec![])]), now());
        let [Action::Finalize(obj)] = &actions[..] else { panic!("finalize alone: {actions:?}") };
        assert_eq!(obj["spec"]["finalizers"], json!(["example.com/other"]));
        assert_eq!(obj["metadata"]["resourceVersion"], "7");
        assert_eq!(obj["kind"], "Namespace");
    }

    #[test]
    fn every_namespaced_kind_is_listed_and_no_cluster_scoped_one() {
        let kinds: Vec<Kind> = namespaced_resources().map(|r| r.kind_id).collect();
        assert!(kinds.contains(&Kind::Pod) && kinds.contains(&Kind::ConfigMap));
        assert!(!kinds.contains(&Kind::Namespace) && !kinds.contains(&Kind::Node));
    }
}
