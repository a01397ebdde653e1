use chrono::TimeZone;
use serde_json::json;

use super::*;

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 6, 1, 12, 0, 0).unwrap()
}

fn ds_with(spec_extra: Value, template_spec_extra: Value) -> DaemonSet {
    let mut template_spec = json!({"containers": [{"name": "agent", "image": "agent:1"}]});
    if let (Some(t), Some(e)) = (template_spec.as_object_mut(), template_spec_extra.as_object()) {
        t.extend(e.clone());
    }
    let mut spec = json!({
        "selector": {"matchLabels": {"app": "agent"}},
        "template": {"metadata": {"labels": {"app": "agent"}}, "spec": template_spec},
    });
    if let (Some(s), Some(e)) = (spec.as_object_mut(), spec_extra.as_object()) {
        s.extend(e.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "agent", "namespace": "kube-system", "uid": "ds-uid", "generation": 2, "resourceVersion": "5"},
        "spec": spec,
    }))
    .expect("daemonset")
}

fn ds() -> DaemonSet {
    ds_with(json!({}), json!({}))
}

fn node(name: &str, labels: Value, taints: Value) -> Node {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "spec": {"taints": taints}}))
        .expect("node")
}

fn plain_node(name: &str) -> Node {
    node(name, json!({}), json!([]))
}

/// A running, ready daemon pod on `node_name` made from the template with `hash`.
fn pod_on(name: &str, node_name: &str, hash: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "kube-system", "uid": format!("uid-{name}"),
                     "creationTimestamp": "2026-06-01T10:00:00Z",
                     "labels": {"app": "agent", REVISION_HASH_LABEL: hash},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "ds-uid", "controller": true}]},
        "spec": {"nodeName": node_name, "containers": [{"name": "agent", "image": "agent:1"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-06-01T10:01:00Z"}]},
    }))
    .expect("pod")
}

fn current_hash(ds: &DaemonSet) -> String {
    template_hash(&ds.spec.as_ref().unwrap().template, None)
}

fn created_nodes(plan: &DaemonSetPlan) -> Vec<String> {
    let mut nodes: Vec<String> = plan
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Create(v) => {
                serde_json::from_value::<Pod>(v.clone()).ok().and_then(|p| target_node(&p).map(str::to_string))
            }
            _ => None,
        })
        .collect();
    nodes.sort();
    nodes
}

fn deleted(plan: &DaemonSetPlan) -> Vec<String> {
    let mut names: Vec<String> = plan
        .actions
        .iter()
        .filter_map(|a| if let Action::Delete { name, .. } = a { Some(name.clone()) } else { None })
        .collect();
    names.sort();
    names
}

fn must_status(plan: &DaemonSetPlan) -> DaemonSetStatus {
    plan.actions
        .iter()
        .find_map(|a| match a {
            Action::UpdateStatus(v) => serde_json::from_value::<DaemonSet>(v.clone()).ok()?.status,
            _ => None,
        })
        .expect("a status update")
}

#[test]
fn every_node_gets_one_pod_placed_by_node_affinity_not_bound() {
    let nodes = vec![plain_node("n1"), plain_node("n2")];
    let plan = reconcile(&ds(), &nodes, &[], true, now());
    assert_eq!(created_nodes(&plan), vec!["n1", "n2"]);
    assert_eq!(plan.expected_creations, 2);
    let Action::Create(pod) = &plan.actions[0] else { panic!("create first: {:?}", plan.actions) };
    assert!(pod["spec"]["nodeName"].is_null(), "the scheduler binds it");
    assert_eq!(
        pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchFields"][0],
        json!({"key": "metadata.name", "operator": "In", "values": ["n1"]})
    );
    assert_eq!(pod["metadata"]["labels"][REVISION_HASH_LABEL], json!(current_hash(&ds())));
    assert_eq!(pod["metadata"]["labels"][TEMPLATE_GENERATION_LABEL], "2");
    assert_eq!(pod["metadata"]["ownerReferences"][0]["kind"], "DaemonSet");
    let keys: Vec<&str> =
        pod["spec"]["tolerations"].as_array().unwrap().iter().filter_map(|t| t["key"].as_str()).collect();
    for (key, _) in DAEMON_TOLERATIONS {
        assert!(keys.contains(&key), "{key} missing from {keys:?}");
    }
    let status = must_status(&plan);
    assert_eq!((status.desired_number_scheduled, status.current_number_scheduled), (2, 0));
    assert_eq!(status.observed_generation, Some(2));
}

#[test]
fn a_node_that_joins_later_gets_a_pod_and_one_that_leaves_loses_its_pod() {
    let hash = current_hash(&ds());
    let pods = vec![pod_on("p1", "n1", &hash), pod_on("gone", "n-old", &hash)];
    let plan = reconcile(&ds(), &[plain_node("n1"), plain_node("n2")], &pods, true, now());
    assert_eq!(created_nodes(&plan), vec!["n2"]);
    assert_eq!(deleted(&plan), vec!["gone"]);
    assert_eq!(plan.expected_deletions, vec!["uid-gone".to_string()]);
}

#[test]
fn a_pod_not_yet_scheduled_counts_for_the_node_its_affinity_names() {
    let plan = reconcile(&ds(), &[plain_node("n1")], &[], true, now());
    let Some(Action::Create(v)) = plan.actions.first() else { panic!("no create") };
    let mut pending: Pod = serde_json::from_value(v.clone()).unwrap();
    pending.metadata.name = Some("agent-x".into());
    pending.metadata.uid = Some("uid-x".into());
    let plan = reconcile(&ds(), &[plain_node("n1")], &[pending], true, now());
    assert!(created_nodes(&plan).is_empty());
    assert!(deleted(&plan).is_empty());
}

#[test]
fn node_selector_and_required_affinity_pick_the_nodes() {
    let affinity = json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]},
                              {"key": "gpu", "operator": "DoesNotExist"}]},
        {"matchExpressions": [{"key": "edge", "operator": "Exists"}, {"key": "zone", "operator": "NotIn", "values": ["c"]}]},
    ]}}}, "nodeSelector": {"os": "linux"}});
    let d = ds_with(json!({}), affinity);
    let nodes = vec![
        node("zone-a", json!({"os": "linux", "zone": "a"}), json!([])),
        node("zone-a-gpu", json!({"os": "linux", "zone": "a", "gpu": "1"}), json!([])),
        node("zone-c", json!({"os": "linux", "zone": "c"}), json!([])),
        node("edge", json!({"os": "linux", "edge": ""}), json!([])),
        node("edge-c", json!({"os": "linux", "edge": "", "zone": "c"}), json!([])),
        node("windows", json!({"os": "windows", "zone": "a"}), json!([])),
    ];
    assert_eq!(created_nodes(&reconcile(&d, &nodes, &[], true, now())), vec!["edge", "zone-a"]);
}

#[test]
fn taints_keep_pods_off_unless_tolerated_and_no_execute_evicts() {
    let nodes = vec![
        node("dedicated", json!({}), json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"}])),
        node("evicting", json!({}), json!([{"key": "maintenance", "effect": "NoExecute"}])),
        node("soft", json!({}), json!([{"key": "slow", "effect": "PreferNoSchedule"}])),
        node("cordoned", json!({}), json!([{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}])),
        node("not-ready", json!({}), json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}])),
    ];
    let hash = current_hash(&ds());
    let pods = vec![pod_on("on-dedicated", "dedicated", &hash), pod_on("on-evicting", "evicting", &hash)];
    let plan = reconcile(&ds(), &nodes, &pods, true, now());
    assert_eq!(created_nodes(&plan), vec!["cordoned", "not-ready", "soft"]);
    assert_eq!(deleted(&plan), vec!["on-evicting"], "NoSchedule leaves a running pod; NoExecute evicts");
    let status = must_status(&plan);
    assert_eq!(status.number_misscheduled, 2);

    let tolerant = ds_with(
        json!({}),
        json!({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"}, {"operator": "Exists", "effect": "NoExecute"}]}),
    );
    let plan = reconcile(&tolerant, &nodes, &[], true, now());
    assert_eq!(created_nodes(&plan), vec!["cordoned", "dedicated", "evicting", "not-ready", "soft"]);
}

#[test]
fn failed_pods_are_deleted_and_extra_pods_on_a_node_leave_the_oldest() {
    let hash = current_hash(&ds());
    let mut failed = pod_on("failed", "n1", &hash);
    failed.status.as_mut().unwrap().phase = Some("Failed".into());
    let old = pod_on("old", "n2", &hash);
    let mut young = pod_on("young", "n2", &hash);
    young.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
    let plan = reconcile(&ds(), &[plain_node("n1"), plain_node("n2")], &[failed, old, young], true, now());
    assert_eq!(deleted(&plan), vec!["failed", "young"]);
}

#[test]
fn nothing_is_created_or_deleted_while_expectations_are_pending() {
    let plan = reconcile(&ds(), &[plain_node("n1")], &[pod_on("gone", "n-old", "x")], false, now());
    assert!(created_nodes(&plan).is_empty() && deleted(&plan).is_empty());
    assert_eq!((plan.expected_creations, plan.expected_deletions.len()), (0, 0));
}

#[test]
fn a_rolling_update_replaces_at_most_max_unavailable_pods_at_a_time() {
    let nodes: Vec<Node> = (1..=4).map(|i| plain_node(&format!("n{i}"))).collect();
    let pods: Vec<Pod> = (1..=4).map(|i| pod_on(&format!("p{i}"), &format!("n{i}"), "old-hash")).collect();
    let plan = reconcile(&ds(), &nodes, &pods, true, now());
    assert_eq!(deleted(&plan), vec!["p1"], "default maxUnavailable is 1");
    let status = must_status(&plan);
    assert_eq!((status.updated_number_scheduled, status.number_available), (Some(0), Some(4)));

    let two = ds_with(
        json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "50%"}}}),
        json!({}),
    );
    assert_eq!(deleted(&reconcile(&two, &nodes, &pods, true, now())), vec!["p1", "p2"]);

    // One node already lacks its pod: that uses the whole budget.
    let plan = reconcile(&ds(), &nodes, &pods[1..], true, now());
    assert_eq!(created_nodes(&plan), vec!["n1"]);
    assert!(deleted(&plan).is_empty());

    // An old pod that is not available goes at once.
    let mut broken = pods.clone();
    broken[3].status.as_mut().unwrap().conditions = None;
    assert_eq!(deleted(&reconcile(&ds(), &nodes, &broken, true, now())), vec!["p1", "p4"]);
}

#[test]
fn on_delete_leaves_old_pods_until_someone_deletes_them() {
    let d = ds_with(json!({"updateStrategy": {"type": "OnDelete"}}), json!({}));
    let pods = vec![pod_on("p1", "n1", "old-hash")];
    let plan = reconcile(&d, &[plain_node("n1")], &pods, true, now());
    assert!(deleted(&plan).is_empty() && created_nodes(&plan).is_empty());
    assert_eq!(must_status(&plan).updated_number_scheduled, Some(0));
}

#[test]
fn with_max_surge_the_new_pod_starts_beside_the_old_which_goes_once_it_is_available() {
    let d = ds_with(
        json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}}),
        json!({}),
    );
    let hash = current_hash(&d);
    let nodes = vec![plain_node("n1"), plain_node("n2")];
    let old = vec![pod_on("o1", "n1", "old-hash"), pod_on("o2", "n2", "old-hash")];
    let plan = reconcile(&d, &nodes, &old, true, now());
    assert_eq!(created_nodes(&plan), vec!["n1"]);
    assert!(deleted(&plan).is_empty());

    let mut starting = pod_on("new1", "n1", &hash);
    starting.status.as_mut().unwrap().conditions = None;
    let mut pods = old.clone();
    pods.push(starting);
    let plan = reconcile(&d, &nodes, &pods, true, now());
    assert!(deleted(&plan).is_empty() && created_nodes(&plan).is_empty(), "{:?}", plan.actions);

    pods.pop();
    pods.push(pod_on("new1", "n1", &hash));
    let plan = reconcile(&d, &nodes, &pods, true, now());
    assert_eq!(deleted(&plan), vec!["o1"]);
}

#[test]
fn the_status_says_when_a_rollout_is_done() {
    let d = ds_with(json!({"minReadySeconds": 30}), json!({}));
    let hash = current_hash(&d);
    let mut pods = vec![pod_on("p1", "n1", &hash), pod_on("p2", "n2", &hash)];
    // p2 became ready 10s ago: ready, not yet available.
    pods[1].status.as_mut().unwrap().conditions.as_mut().unwrap()[0].last_transition_time =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now() - TimeDelta::seconds(10)));
    let plan = reconcile(&d, &[plain_node("n1"), plain_node("n2")], &pods, true, now());
    let status = must_status(&plan);
    assert_eq!(status.desired_number_scheduled, 2);
    assert_eq!(status.current_number_scheduled, 2);
    assert_eq!(status.number_ready, 2);
    assert_eq!(status.number_available, Some(1));
    assert_eq!(status.number_unavailable, Some(1));
    assert_eq!(status.updated_number_scheduled, Some(2));
    assert_eq!(status.number_misscheduled, 0);
    assert_eq!(plan.requeue_after, Some(Duration::from_secs(20)));
}

#[test]
fn the_template_hash_is_stable_and_follows_the_template() {
    let a = ds();
    let b = ds_with(json!({}), json!({"hostNetwork": true}));
    assert_eq!(current_hash(&a), current_hash(&ds()));
    assert_ne!(current_hash(&a), current_hash(&b));
    assert_ne!(template_hash(&a.spec.as_ref().unwrap().template, Some(1)), current_hash(&a));
    assert!(current_hash(&a).chars().all(|c| c.is_ascii_alphanumeric()));
}

#[test]
fn an_unchanged_daemon_set_writes_nothing() {
    let hash = current_hash(&ds());
    let pods = vec![pod_on("p1", "n1", &hash)];
    let first = reconcile(&ds(), &[plain_node("n1")], &pods, true, now());
    let mut settled = ds();
    settled.status = Some(must_status(&first));
    let again = reconcile(&settled, &[plain_node("n1")], &pods, true, now());
    assert!(again.actions.is_empty(), "{:?}", again.actions);
}
