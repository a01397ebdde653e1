//! The ReplicaSet controller: keeps `spec.replicas` active pods matching the
//! selector, as Kubernetes' `pkg/controller/replicaset`.
//!
//! One reconcile, from the cache contents:
//! 1. claim pods: keep the owned and selected, adopt selected orphans,
//!    release owned pods the selector no longer matches;
//! 2. if [`Expectations`] are satisfied (every create and delete asked for
//!    earlier has been observed) and the set is not being deleted, create or
//!    delete the difference, at most `burst` per reconcile, deleting in
//!    [`deletion_order`];
//! 3. write `status` if it changed.
//!
//! The core works on a [`Replicated`] view, so the ReplicationController
//! (`crate::replication`) shares it through a small adapter.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{json, Map, Value};
use skiff_api::selector::LabelSelector;

use crate::expectations::Expectations;
use crate::ownership::{self, Claim};
use crate::pod_state::{available_at, deletion_order, is_active, is_available, is_ready};
use crate::{Action, Reconciled};

/// At most this many pods are created or deleted per reconcile (Kubernetes'
/// `BurstReplicas`). The next batch follows as soon as the previous one is
/// observed, so 1,000 pods take two rounds, not a thousand.
pub const BURST_REPLICAS: usize = 500;

/// The condition type reporting failed creates or deletes.
pub const REPLICA_FAILURE: &str = "ReplicaFailure";

/// Reconciles one ReplicaSet. `pods` are the pods of its namespace (others
/// are ignored); the result's actions adopt, release, create and delete pods
/// and update the set's status. Records the creates and deletes it asks for
/// in `expectations` before returning.
pub fn reconcile(rs: &ReplicaSet, pods: &[Arc<Pod>], expectations: &Expectations, now: DateTime<Utc>) -> Reconciled {
    reconcile_with_burst(rs, pods, expectations, now, BURST_REPLICAS)
}

/// [`reconcile`] with a different per-reconcile limit on creates and deletes.
pub fn reconcile_with_burst(
    rs: &ReplicaSet,
    pods: &[Arc<Pod>],
    expectations: &Expectations,
    now: DateTime<Utc>,
    burst: usize,
) -> Reconciled {
    let spec = rs.spec.as_ref();
    // A missing selector selects nothing (validation makes it required).
    let selector = spec
        .and_then(|s| serde_json::to_value(&s.selector).ok())
        .filter(|s| s.as_object().is_some_and(|m| !m.is_empty()))
        .and_then(|s| LabelSelector::from_api(&s).ok());
    let view = Replicated {
        api_version: "apps/v1",
        kind: "ReplicaSet",
        meta: &rs.metadata,
        replicas: spec.and_then(|s| s.replicas).unwrap_or(1),
        selector,
        template: spec.and_then(|s| s.template.as_ref()),
        min_ready_seconds: spec.and_then(|s| s.min_ready_seconds).unwrap_or(0),
        object: || serde_json::to_value(rs).unwrap_or(Value::Null),
        status: rs.status.as_ref().and_then(|s| serde_json::to_value(s).ok()).unwrap_or(Value::Null),
    };
    reconcile_replicated(&view, pods, expectations, now, burst)
}

/// A replicated workload as the shared core sees it.
pub(crate) struct Replicated<'a, F: Fn() -> Value> {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub meta: &'a ObjectMeta,
    pub replicas: i32,
    /// `None` selects nothing.
    pub selector: Option<LabelSelector>,
    pub template: Option<&'a PodTemplateSpec>,
    pub min_ready_seconds: i32,
    /// The whole object as JSON, built only when status must be written.
    pub object: F,
    /// The current status as JSON (`null` if none).
    pub status: Value,
}

pub(crate) fn reconcile_replicated<F: Fn() -> Value>(
    w: &Replicated<'_, F>,
    pods: &[Arc<Pod>],
    expectations: &Expectations,
    now: DateTime<Utc>,
    burst: usize,
) -> Reconciled {
    let key = ownership::key_of(w.meta);
    let namespace = w.meta.namespace.as_deref();
    let owner_ref = ownership::controller_ref(w.api_version, w.kind, w.meta);
    let mut out = Reconciled::default();
    let empty = BTreeMap::new();

    let mut owned: Vec<&Pod> = Vec::new();
    for pod in pods.iter().filter(|p| p.metadata.namespace.as_deref() == namespace) {
        let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
        let selected = w.selector.as_ref().is_some_and(|s| s.matches(labels));
        match ownership::claim(w.meta, &pod.metadata, selected) {
            Claim::Owned => owned.push(pod),
            Claim::Adopt => {
                out.actions.push(ownership::adopt("v1", "Pod", &pod.metadata, &owner_ref));
                owned.push(pod);
            }
            Claim::Release => out.actions.push(ownership::release("v1", "Pod", &pod.metadata, &owner_ref.uid)),
            Claim::Ignore => {}
        }
    }
    let mut active: Vec<&Pod> = owned.into_iter().filter(|p| is_active(p)).collect();

    let failure = expectations.take_failure(&key);
    if expectations.satisfied(&key, now) && w.meta.deletion_timestamp.is_none() {
        let diff = active.len() as i64 - i64::from(w.replicas.max(0));
        let count = usize::try_from(diff.unsigned_abs()).unwrap_or(usize::MAX).min(burst);
        if diff < 0 {
            if let Some(template) = w.template {
                expectations.expect_creations(&key, count, now);
                let pod = pod_from_template(template, w.meta, &owner_ref);
                out.actions.extend(std::iter::repeat_n(pod, count).map(Action::Create));
            }
        } else if diff > 0 {
            active.sort_by(|a, b| deletion_order(a, b));
            let doomed = &active[..count];
            expectations.expect_deletions(&key, doomed.iter().filter_map(|p| p.metadata.uid.clone()), now);
            out.actions.extend(doomed.iter().map(|p| delete_pod(p)));
        }
    } else if let Some(wait) = expectations.expires_in(&key, now) {
        out.requeue_within(wait);
    }

    let status = status_of(w, &active, failure.as_ref(), now);
    if status != w.status {
        let mut obj = (w.object)();
        obj["status"] = status;
        // A failure is reported before the writes that may fail again, so
        // the condition reaches the API even if they do.
        if failure.is_some() {
            out.actions.insert(0, Action::UpdateStatus(obj));
        } else {
            out.actions.push(Action::UpdateStatus(obj));
        }
    }

    // Look again when the next ready pod becomes available.
    if w.min_ready_seconds > 0 {
        let next = active.iter().filter_map(|p| available_at(p, w.min_ready_seconds)).filter(|at| *at > now).min();
        if let Some(wait) = next.and_then(|at| (at - now).to_std().ok()) {
            out.requeue_within(wait);
        }
    }
    out
}

/// The pod a workload creates from its template: named after the owner,
/// in its namespace, with the template's labels and annotations and a
/// controller reference back.
pub(crate) fn pod_from_template(
    template: &PodTemplateSpec,
    owner: &ObjectMeta,
    owner_ref: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
) -> Value {
    let tmeta = template.metadata.as_ref();
    let mut meta = Map::new();
    meta.insert("generateName".into(), json!(format!("{}-", owner.name.as_deref().unwrap_or(""))));
    meta.insert("namespace".into(), json!(owner.namespace));
    if let Some(labels) = tmeta.and_then(|m| m.labels.as_ref()) {
        meta.insert("labels".into(), json!(labels));
    }
    if let Some(annotations) = tmeta.and_then(|m| m.annotations.as_ref()) {
        meta.insert("annotations".into(), json!(annotations));
    }
    if let Some(finalizers) = tmeta.and_then(|m| m.finalizers.as_ref()) {
        meta.insert("finalizers".into(), json!(finalizers));
    }
    meta.insert("ownerReferences".into(), json!([owner_ref]));
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta});
    if let Some(spec) = &template.spec {
        pod["spec"] = serde_json::to_value(spec).unwrap_or(Value::Null);
    }
    pod
}

fn delete_pod(pod: &Pod) -> Action {
    Action::Delete {
        api_version: "v1".into(),
        kind: "Pod".into(),
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone(),
        propagation: None,
    }
}

/// The status the active pods add up to. Fields equal to zero are left out
/// (Go's `omitempty`), so it compares equal to what the API stores.
fn status_of<F: Fn() -> Value>(
    w: &Replicated<'_, F>,
    active: &[&Pod],
    failure: Option<&crate::expectations::Failure>,
    now: DateTime<Utc>,
) -> Value {
    let template_labels = w.template.and_then(|t| t.metadata.as_ref()).and_then(|m| m.labels.as_ref());
    let fully_labeled = active
        .iter()
        .filter(|p| {
            let labels = p.metadata.labels.as_ref();
            template_labels.into_iter().flatten().all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
        })
        .count();
    let ready = active.iter().filter(|p| is_ready(p)).count();
    let available = active.iter().filter(|p| is_available(p, w.min_ready_seconds, now)).count();
    let mut status = Map::new();
    status.insert("replicas".into(), json!(active.len()));
    for (field, n) in
        [("fullyLabeledReplicas", fully_labeled), ("readyReplicas", ready), ("availableReplicas", available)]
    {
        if n > 0 {
            status.insert(field.into(), json!(n));
        }
    }
    if let Some(generation) = w.meta.generation.filter(|g| *g > 0) {
        status.insert("observedGeneration".into(), json!(generation));
    }
    let mut conditions: Vec<Value> = w.status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["type"] != REPLICA_FAILURE)
        .cloned()
        .collect();
    if let Some(f) = failure {
        let previous = w.status["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == REPLICA_FAILURE);
        let since = match previous {
            Some(c) if c["status"] == "True" => c["lastTransitionTime"].clone(),
            _ => json!(rfc3339(now)),
        };
        conditions.push(json!({
            "type": REPLICA_FAILURE,
            "status": "True",
            "reason": f.reason,
            "message": f.message,
            "lastTransitionTime": since,
        }));
    }
    if !conditions.is_empty() {
        status.insert("conditions".into(), Value::Array(conditions));
    }
    Value::Object(status)
}

/// Kubernetes' wire form of a time: RFC 3339 in UTC, whole seconds.
pub(crate) fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
pub(crate) mod tests {
    use k8s_openapi::api::apps::v1::ReplicaSetSpec;
    use k8s_openapi::api::core::v1::{Container, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector as ApiSelector, Time};

    use super::*;
    use crate::pod_state::tests::{at, pod};

    pub(crate) fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    pub(crate) fn template(app: &str, image: &str) -> PodTemplateSpec {
        PodTemplateSpec {
            metadata: Some(ObjectMeta { labels: Some(labels(&[("app", app)])), ..Default::default() }),
            spec: Some(PodSpec {
                containers: vec![Container { name: "c".into(), image: Some(image.into()), ..Default::default() }],
                ..Default::default()
            }),
        }
    }

    fn rs(replicas: i32) -> ReplicaSet {
        ReplicaSet {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("ns".into()),
                uid: Some("rs-uid".into()),
                generation: Some(2),
                resource_version: Some("10".into()),
                ..Default::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(replicas),
                selector: ApiSelector { match_labels: Some(labels(&[("app", "web")])), ..Default::default() },
                template: Some(template("web", "nginx")),
                min_ready_seconds: None,
            }),
            status: None,
        }
    }

    /// A running, ready pod of `owner` (or an orphan), labelled `app=<app>`.
    fn member(name: &str, app: &str, owner: Option<&ReplicaSet>) -> Arc<Pod> {
        let mut p = pod(name, 0, "Running", Some("node-1"), Some(1));
        p.metadata.labels = Some(labels(&[("app", app)]));
        if let Some(o) = owner {
            p.metadata.owner_references = Some(vec![ownership::controller_ref("apps/v1", "ReplicaSet", &o.metadata)]);
        }
        Arc::new(p)
    }

    fn creates(r: &Reconciled) -> usize {
        r.actions.iter().filter(|a| matches!(a, Action::Create(_))).count()
    }

    fn deleted(r: &Reconciled) -> Vec<String> {
        r.actions
            .iter()
            .filter_map(|a| match a {
                Action::Delete { name, .. } => Some(name.clone()),
                _ => None,
            })
            .collect()
    }

    fn new_status(r: &Reconciled) -> Value {
        r.actions
            .iter()
            .find_map(|a| match a {
                Action::UpdateStatus(obj) => Some(obj["status"].clone()),
                _ => None,
            })
            .expect("a status update")
    }

    #[test]
    fn a_new_replica_set_creates_its_pods_from_the_template() {
        let e = Expectations::new();
        let r = reconcile(&rs(3), &[], &e, at(0));
        assert_eq!(creates(&r), 3);
        let Action::Create(pod) = &r.actions[0] else { panic!("first action creates a pod") };
        assert_eq!(pod["metadata"]["generateName"], "web-");
        assert_eq!(pod["metadata"]["namespace"], "ns");
        assert_eq!(pod["metadata"]["labels"], json!({"app": "web"}));
        assert_eq!(
            pod["metadata"]["ownerReferences"],
            json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "rs-uid", "controller": true, "blockOwnerDeletion": true}])
        );
        assert_eq!(pod["spec"]["containers"][0]["image"], "nginx");
        assert_eq!(new_status(&r), json!({"replicas": 0, "observedGeneration": 2}));
    }

    #[test]
    fn expectations_prevent_over_creation_while_the_watch_lags() {
        let e = Expectations::new();
        let set = rs(3);
        assert_eq!(creates(&reconcile(&set, &[], &e, at(0))), 3);
        // The cache has not seen the pods yet: a second reconcile must wait.
        let again = reconcile(&set, &[], &e, at(1));
        assert_eq!(creates(&again), 0, "created again before the first batch was observed");
        assert_eq!(again.requeue_after, Some(std::time::Duration::from_secs(299)));
        for _ in 0..3 {
            e.creation_observed("ns/web");
        }
        let pods = [member("a", "web", Some(&set)), member("b", "web", Some(&set)), member("c", "web", Some(&set))];
        assert_eq!(creates(&reconcile(&set, &pods, &e, at(2))), 0);
        // Once observed, a missing pod is replaced.
        assert_eq!(creates(&reconcile(&set, &pods[..2], &e, at(3))), 1);
    }

    #[test]
    fn expectations_that_never_arrive_expire_after_five_minutes() {
        let e = Expectations::new();
        let set = rs(2);
        reconcile(&set, &[], &e, at(0));
        assert_eq!(creates(&reconcile(&set, &[], &e, at(299))), 0);
        assert_eq!(creates(&reconcile(&set, &[], &e, at(300))), 2);
    }

    #[test]
    fn creates_are_limited_to_the_burst_per_reconcile() {
        let e = Expectations::new();
        let r = reconcile(&rs(1_000), &[], &e, at(0));
        assert_eq!(creates(&r), BURST_REPLICAS);
        assert_eq!(creates(&reconcile_with_burst(&rs(1_000), &[], &Expectations::new(), at(0), 64)), 64);
    }

    #[test]
    fn a_thousand_pods_are_asked_for_in_two_bursts() {
        let e = Expectations::new();
        let set = rs(1_000);
        assert_eq!(creates(&reconcile(&set, &[], &e, at(0))), BURST_REPLICAS);
        let pods: Vec<Arc<Pod>> = (0..BURST_REPLICAS).map(|i| member(&format!("p{i}"), "web", Some(&set))).collect();
        assert_eq!(creates(&reconcile(&set, &pods[..499], &e, at(1))), 0, "the first burst is not all observed yet");
        for _ in 0..BURST_REPLICAS {
            e.creation_observed("ns/web");
        }
        assert_eq!(creates(&reconcile(&set, &pods, &e, at(1))), 1_000 - BURST_REPLICAS);
    }

    #[test]
    fn selected_orphans_are_adopted_and_unselected_pods_released() {
        let set = rs(2);
        let orphan = member("orphan", "web", None);
        let strayed = member("strayed", "api", Some(&set));
        let stranger = member("stranger", "api", None);
        let r = reconcile(&set, &[orphan, strayed, stranger], &Expectations::new(), at(0));
        let patches: Vec<(&str, &Value)> = r
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Patch { name, patch, .. } => Some((name.as_str(), patch)),
                _ => None,
            })
            .collect();
        assert_eq!(patches.len(), 2);
        assert_eq!(patches[0].0, "orphan");
        assert_eq!(patches[0].1["metadata"]["ownerReferences"][0]["uid"], "rs-uid");
        assert_eq!(patches[1].0, "strayed");
        assert_eq!(patches[1].1["metadata"]["ownerReferences"], json!([]));
        // The adopted pod counts; the released one does not.
        assert_eq!(creates(&r), 1);
    }

    #[test]
    fn a_pod_another_controller_owns_is_not_adopted() {
        let mut other = rs(1);
        other.metadata.uid = Some("other-uid".into());
        let taken = member("taken", "web", Some(&other));
        let r = reconcile(&rs(1), &[taken], &Expectations::new(), at(0));
        assert!(r.actions.iter().all(|a| !matches!(a, Action::Patch { .. })));
        assert_eq!(creates(&r), 1);
    }

    #[test]
    fn surplus_pods_are_deleted_least_useful_first() {
        let set = rs(2);
        let owned = |p: Pod| {
            let mut p = p;
            p.metadata.labels = Some(labels(&[("app", "web")]));
            p.metadata.owner_references = Some(vec![ownership::controller_ref("apps/v1", "ReplicaSet", &set.metadata)]);
            Arc::new(p)
        };
        let pods = vec![
            owned(pod("ready-old", 0, "Running", Some("n"), Some(5))),
            owned(pod("pending", 1, "Pending", Some("n"), None)),
            owned(pod("ready-new", 2, "Running", Some("n"), Some(50))),
            owned(pod("unassigned", 3, "Pending", None, None)),
        ];
        let e = Expectations::new();
        let r = reconcile(&set, &pods, &e, at(100));
        assert_eq!(deleted(&r), ["unassigned", "pending"]);
        assert!(!e.satisfied("ns/web", at(100)));
        e.deletion_observed("ns/web", "uid-unassigned");
        e.deletion_observed("ns/web", "uid-pending");
        assert!(e.satisfied("ns/web", at(100)));
    }

    #[test]
    fn terminating_and_finished_pods_are_replaced_not_counted() {
        let set = rs(2);
        let mut terminating = (*member("terminating", "web", Some(&set))).clone();
        terminating.metadata.deletion_timestamp = Some(Time(at(0)));
        let mut done = (*member("done", "web", Some(&set))).clone();
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let r = reconcile(&set, &[Arc::new(terminating), Arc::new(done)], &Expectations::new(), at(0));
        assert_eq!(creates(&r), 2);
        assert!(deleted(&r).is_empty());
    }

    #[test]
    fn status_counts_ready_and_available_after_min_ready_seconds() {
        let mut set = rs(3);
        set.spec.as_mut().unwrap().min_ready_seconds = Some(10);
        let mut pods = vec![member("a", "web", Some(&set)), member("b", "web", Some(&set))];
        let mut not_ready = pod("c", 0, "Running", Some("n"), None);
        not_ready.metadata.labels = Some(labels(&[("app", "web"), ("extra", "x")]));
        not_ready.metadata.owner_references =
            Some(vec![ownership::controller_ref("apps/v1", "ReplicaSet", &set.metadata)]);
        pods.push(Arc::new(not_ready));
        let mut fresh = (*pods[1]).clone();
        fresh.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].last_transition_time = Some(Time(at(5)));
        pods[1] = Arc::new(fresh);
        let r = reconcile(&set, &pods, &Expectations::new(), at(12));
        assert_eq!(
            new_status(&r),
            json!({"replicas": 3, "fullyLabeledReplicas": 3, "readyReplicas": 2, "availableReplicas": 1, "observedGeneration": 2})
        );
        assert_eq!(r.requeue_after, Some(std::time::Duration::from_secs(3)), "b becomes available at 15s");
    }

    #[test]
    fn an_unchanged_status_is_not_written() {
        let mut set = rs(1);
        let pods = [member("a", "web", Some(&set))];
        let r = reconcile(&set, &pods, &Expectations::new(), at(10));
        set.status = Some(serde_json::from_value(new_status(&r)).unwrap());
        let again = reconcile(&set, &pods, &Expectations::new(), at(10));
        assert!(again.actions.is_empty(), "{:?}", again.actions);
    }

    #[test]
    fn a_reported_failure_becomes_a_replica_failure_condition_until_writes_succeed() {
        let set = rs(2);
        let e = Expectations::new();
        let first = reconcile(&set, &[], &e, at(0));
        e.actions_skipped("ns/web", &first.actions[1..], "exceeded quota");
        e.creation_observed("ns/web");
        let r = reconcile(&set, &[member("a", "web", Some(&set))], &e, at(1));
        let Action::UpdateStatus(obj) = &r.actions[0] else { panic!("the failure is reported first") };
        assert_eq!(obj["status"]["conditions"][0]["type"], REPLICA_FAILURE);
        assert_eq!(obj["status"]["conditions"][0]["reason"], "FailedCreate");
        assert_eq!(obj["status"]["conditions"][0]["message"], "exceeded quota");
        assert_eq!(creates(&r), 1);
        let mut set = set;
        set.status = Some(serde_json::from_value(obj["status"].clone()).unwrap());
        e.creation_observed("ns/web");
        let pods = [member("a", "web", Some(&set)), member("b", "web", Some(&set))];
        let cleared = new_status(&reconcile(&set, &pods, &e, at(2)));
        assert!(cleared.get("conditions").is_none(), "{cleared}");
    }

    #[test]
    fn a_replica_set_being_deleted_creates_nothing() {
        let mut set = rs(2);
        set.metadata.deletion_timestamp = Some(Time(at(0)));
        assert_eq!(creates(&reconcile(&set, &[], &Expectations::new(), at(0))), 0);
    }
}
