use serde_json::{json, Value};

use super::*;

fn quota(hard: Value, status: Value) -> ResourceQuota {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "q", "namespace": "team", "resourceVersion": "4"},
        "spec": {"hard": hard},
        "status": status,
    }))
    .expect("quota")
}

fn pod(phase: &str, containers: Value, extra_spec: Value) -> Pod {
    let mut spec = json!({"containers": containers});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra_spec.as_object()) {
        s.extend(e.clone());
    }
    serde_json::from_value(
        json!({"metadata": {"name": "p", "namespace": "team"}, "spec": spec, "status": {"phase": phase}}),
    )
    .expect("pod")
}

fn container(requests: Value, limits: Value) -> Value {
    json!({"name": "c", "image": "i", "resources": {"requests": requests, "limits": limits}})
}

fn must_used(action: Option<Action>) -> BTreeMap<String, String> {
    let Some(Action::UpdateStatus(v)) = action else { panic!("expected a status update, got {action:?}") };
    let q: ResourceQuota = serde_json::from_value(v).expect("quota");
    let status = q.status.expect("status");
    assert_eq!(status.hard, q.spec.and_then(|s| s.hard), "status.hard mirrors spec.hard");
    status.used.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect()
}

#[test]
fn object_counts_and_pod_counts_skip_terminal_pods() {
    let q = quota(
        json!({"pods": "10", "count/pods": "10", "services": "5", "count/deployments.apps": "3", "configmaps": "9", "secrets": "9"}),
        json!({}),
    );
    let pods = vec![
        pod("Running", json!([]), json!({})),
        pod("Pending", json!([]), json!({})),
        pod("Succeeded", json!([]), json!({})),
        pod("Failed", json!([]), json!({})),
    ];
    let counts: ObjectCounts =
        [("services".to_string(), 2), ("deployments.apps".to_string(), 1), ("secrets".to_string(), 4)].into();
    let used = must_used(reconcile(&q, &pods, &counts));
    assert_eq!(used["pods"], "2");
    assert_eq!(used["count/pods"], "2");
    assert_eq!(used["services"], "2");
    assert_eq!(used["count/deployments.apps"], "1");
    assert_eq!(used["configmaps"], "0");
    assert_eq!(used["secrets"], "4");
}

#[test]
fn the_wiring_is_told_which_kinds_to_count() {
    let q = quota(
        json!({"pods": "1", "services": "1", "count/deployments.apps": "1", "count/pods": "1", "requests.cpu": "1"}),
        json!({}),
    );
    assert_eq!(counted_resources(&q), vec!["deployments.apps".to_string(), "services".to_string()]);
}

#[test]
fn requests_and_limits_sum_over_live_pods_exactly() {
    let q = quota(
        json!({"requests.cpu": "4", "requests.memory": "8Gi", "limits.cpu": "8", "limits.memory": "16Gi", "cpu": "4"}),
        json!({}),
    );
    let pods = vec![
        pod(
            "Running",
            json!([
                container(json!({"cpu": "500m", "memory": "1Gi"}), json!({"cpu": "1", "memory": "2Gi"})),
                container(json!({"cpu": "250m", "memory": "512Mi"}), json!({}))
            ]),
            json!({}),
        ),
        // No request: its limit counts as the request.
        pod("Pending", json!([container(json!({}), json!({"cpu": "1", "memory": "1Gi"}))]), json!({})),
        pod("Succeeded", json!([container(json!({"cpu": "100"}), json!({}))]), json!({})),
    ];
    let used = must_used(reconcile(&q, &pods, &ObjectCounts::new()));
    assert_eq!(used["requests.cpu"], "1750m");
    assert_eq!(used["cpu"], "1750m");
    assert_eq!(used["requests.memory"], "2560Mi");
    assert_eq!(used["limits.cpu"], "2");
    assert_eq!(used["limits.memory"], "3Gi");
}

#[test]
fn an_init_container_larger_than_the_sum_and_the_overhead_count() {
    let q = quota(json!({"requests.cpu": "4"}), json!({}));
    let p = pod(
        "Running",
        json!([container(json!({"cpu": "100m"}), json!({})), container(json!({"cpu": "100m"}), json!({}))]),
        json!({"initContainers": [container(json!({"cpu": "1"}), json!({}))], "overhead": {"cpu": "50m"}}),
    );
    assert_eq!(must_used(reconcile(&q, &[p], &ObjectCounts::new()))["requests.cpu"], "1050m");
}

#[test]
fn an_unchanged_status_is_not_written_even_in_another_form() {
    let q = quota(
        json!({"pods": "10", "requests.cpu": "2"}),
        json!({"hard": {"pods": "10", "requests.cpu": "2"}, "used": {"pods": "1", "requests.cpu": "0.5"}}),
    );
    let pods = vec![pod("Running", json!([container(json!({"cpu": "500m"}), json!({}))]), json!({}))];
    assert_eq!(reconcile(&q, &pods, &ObjectCounts::new()), None);
    let more = vec![pods[0].clone(), pods[0].clone()];
    assert_eq!(must_used(reconcile(&q, &more, &ObjectCounts::new()))["requests.cpu"], "1");
}

#[test]
fn unknown_keys_are_left_out_of_used() {
    let q = quota(json!({"requests.storage": "10Gi", "example.com/widgets": "3", "pods": "1"}), json!({}));
    let used = must_used(reconcile(&q, &[], &ObjectCounts::new()));
    assert_eq!(used.keys().collect::<Vec<_>>(), vec!["pods"]);
}

#[test]
fn a_lower_count_than_the_quota_holds_is_flagged_for_a_live_recount() {
    let q = quota(json!({"pods": "5", "requests.cpu": "2"}), json!({"used": {"pods": "2", "requests.cpu": "500m"}}));
    let one = pod("Running", json!([container(json!({"cpu": "500m"}), json!({}))]), json!({}));
    // The cache has one pod where admission charged two: a decrease.
    let update = reconcile(&q, std::slice::from_ref(&one), &ObjectCounts::new()).expect("an update");
    assert!(lowers_usage(&q, &update));
    // Counting more than the quota holds (e.g. a new quota) is no decrease.
    let q = quota(json!({"pods": "5"}), json!({"used": {"pods": "0"}}));
    let update = reconcile(&q, &[one.clone(), one], &ObjectCounts::new()).expect("an update");
    assert!(!lowers_usage(&q, &update));
}

#[test]
fn a_scoped_quota_counts_only_the_pods_it_selects_and_no_other_objects() {
    let mut q = quota(json!({"pods": "5", "configmaps": "3"}), json!({}));
    q.spec.as_mut().unwrap().scopes = Some(vec!["BestEffort".into()]);
    let best_effort = pod("Running", json!([{"name": "c", "image": "i"}]), json!({}));
    let burstable = pod("Running", json!([container(json!({"cpu": "1"}), json!({}))]), json!({}));
    let counts = ObjectCounts::from([("configmaps".to_string(), 2)]);
    let used = must_used(reconcile(&q, &[best_effort, burstable], &counts));
    assert_eq!(used, BTreeMap::from([("pods".to_string(), "1".to_string())]));
}
