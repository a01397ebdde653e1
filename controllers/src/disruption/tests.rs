use serde_json::{json, Value};

use super::*;

fn now() -> DateTime<Utc> {
    "2026-12-05T04:00:00Z".parse().expect("time")
}

fn budget(spec: Value, status: Value) -> PodDisruptionBudget {
    serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": "team", "generation": 3, "resourceVersion": "7"},
        "spec": spec,
        "status": status,
    }))
    .expect("budget")
}

fn selecting(bound: Value) -> Value {
    let mut spec = bound;
    spec["selector"] = json!({"matchLabels": {"app": "web"}});
    spec
}

/// A pod of the web app, owned by ReplicaSet `owner` (none if empty).
fn pod(name: &str, ready: bool, owner: &str) -> Pod {
    let mut meta = json!({"name": name, "namespace": "team", "labels": {"app": "web"}});
    if !owner.is_empty() {
        meta["ownerReferences"] =
            json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner, "uid": owner, "controller": true}]);
    }
    serde_json::from_value(json!({
        "metadata": meta,
        "spec": {"containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
    }))
    .expect("pod")
}

/// ReplicaSet `rs-a` wants 4 replicas, `rs-b` 2; anything else is unknown.
fn scales(_: &str, owner: &OwnerReference) -> Option<Scale> {
    let replicas = match owner.name.as_str() {
        "rs-a" => 4,
        "rs-b" => 2,
        _ => return None,
    };
    Some(Scale { uid: owner.uid.clone(), replicas })
}

fn written(out: &Reconciled) -> PodDisruptionBudgetStatus {
    let Some(Action::UpdateStatus(v)) = out.actions.first() else { panic!("expected a status update, got {out:?}") };
    let b: PodDisruptionBudget = serde_json::from_value(v.clone()).expect("budget");
    b.status.expect("status")
}

fn counts(s: &PodDisruptionBudgetStatus) -> (i32, i32, i32, i32) {
    (s.current_healthy, s.desired_healthy, s.expected_pods, s.disruptions_allowed)
}

fn condition(s: &PodDisruptionBudgetStatus) -> (String, String) {
    let c = s.conditions.iter().flatten().find(|c| c.type_ == "DisruptionAllowed").expect("condition");
    (c.status.clone(), c.reason.clone())
}

#[test]
fn an_integer_min_available_counts_the_pods_there_are() {
    let pods = vec![pod("a", true, ""), pod("b", true, ""), pod("c", false, ""), pod("d", true, "")];
    let out = reconcile(&budget(selecting(json!({"minAvailable": 2})), json!({})), &pods, &scales, now());
    let status = written(&out);
    assert_eq!(counts(&status), (3, 2, 4, 1));
    assert_eq!(status.observed_generation, Some(3));
    assert_eq!(condition(&status), ("True".into(), "SufficientPods".into()));
}

#[test]
fn max_unavailable_and_percentages_scale_with_the_controllers_rounding_up() {
    let pods: Vec<Pod> = (0..4).map(|i| pod(&format!("a{i}"), true, "rs-a")).chain([pod("b0", true, "rs-b")]).collect();
    // Expected = 4 + 2 (each ReplicaSet once, by its scale, not its pods).
    let max = reconcile(&budget(selecting(json!({"maxUnavailable": "25%"})), json!({})), &pods, &scales, now());
    // 25% of 6 rounds up to 2: desired 4.
    assert_eq!(counts(&written(&max)), (5, 4, 6, 1));
    let min = reconcile(&budget(selecting(json!({"minAvailable": "50%"})), json!({})), &pods, &scales, now());
    assert_eq!(counts(&written(&min)), (5, 3, 6, 2));
    let int = reconcile(&budget(selecting(json!({"maxUnavailable": 1})), json!({})), &pods, &scales, now());
    assert_eq!(counts(&written(&int)), (5, 5, 6, 0));
    assert_eq!(condition(&written(&int)), ("False".into(), "InsufficientPods".into()));
}

#[test]
fn a_pod_whose_controller_has_no_scale_fails_safe_and_unmanaged_pods_are_reported() {
    let pods = vec![pod("a", true, "rs-a"), pod("x", true, "rs-unknown")];
    let out = reconcile(
        &budget(selecting(json!({"maxUnavailable": 1})), json!({"disruptionsAllowed": 3})),
        &pods,
        &scales,
        now(),
    );
    let status = written(&out);
    assert_eq!(status.disruptions_allowed, 0);
    assert_eq!(condition(&status), ("False".into(), "SyncFailed".into()));
    assert!(out
        .actions
        .iter()
        .any(|a| matches!(a, Action::Event { reason, .. } if reason == "CalculateExpectedPodCountFailed")));

    let pods = vec![pod("a", true, "rs-a"), pod("loose", true, "")];
    let out = reconcile(&budget(selecting(json!({"maxUnavailable": 1})), json!({})), &pods, &scales, now());
    assert_eq!(counts(&written(&out)), (2, 3, 4, 0));
    assert!(out.actions.iter().any(|a| matches!(a, Action::Event { reason, message, .. }
        if reason == "UnmanagedPods" && message.contains("loose"))));
}

#[test]
fn evicted_pods_stop_counting_until_they_go_or_two_minutes_pass() {
    let pods = vec![pod("a", true, ""), pod("b", true, ""), pod("c", true, "")];
    let recent = "2026-12-05T03:59:00Z";
    let stale = "2026-12-05T03:57:00Z";
    let status = json!({"disruptedPods": {"a": recent, "b": stale, "gone": recent}});
    let out = reconcile(&budget(selecting(json!({"minAvailable": 1})), status), &pods, &scales, now());
    let written = written(&out);
    // `a` is still being evicted; `b`'s record expired and `gone` is gone.
    assert_eq!(counts(&written), (2, 1, 3, 1));
    let kept: Vec<&String> = written.disrupted_pods.iter().flatten().map(|(k, _)| k).collect();
    assert_eq!(kept, ["a"]);
    // Looked at again once `a`'s record expires (at 04:01:00).
    let after = out.requeue_after.expect("a recheck");
    assert!(after > Duration::from_secs(59) && after <= Duration::from_secs(62), "{after:?}");
}

#[test]
fn a_budget_that_selects_nothing_allows_nothing_and_says_so() {
    let pods = vec![pod("a", true, "")];
    let none = reconcile(&budget(json!({"minAvailable": 0}), json!({})), &pods, &scales, now());
    assert_eq!(counts(&written(&none)), (0, 0, 0, 0));
    assert!(none.actions.iter().any(|a| matches!(a, Action::Event { reason, .. } if reason == "NoPods")));
    // An empty selector selects every pod of the namespace.
    let all = reconcile(&budget(json!({"minAvailable": 0, "selector": {}}), json!({})), &pods, &scales, now());
    assert_eq!(counts(&written(&all)), (1, 0, 1, 1));
}

#[test]
fn an_unchanged_status_is_not_written_again() {
    let pods = vec![pod("a", true, ""), pod("b", true, "")];
    let first = reconcile(&budget(selecting(json!({"minAvailable": 1})), json!({})), &pods, &scales, now());
    let status = serde_json::to_value(written(&first)).expect("status");
    let later = now() + chrono::Duration::seconds(30);
    let again = reconcile(&budget(selecting(json!({"minAvailable": 1})), status), &pods, &scales, later);
    assert!(again.actions.is_empty(), "{again:?}");
}
