use chrono::TimeZone;
use serde_json::json;

use super::*;

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 5, 1, 12, 0, 0).unwrap()
}

fn job(spec: Value) -> Job {
    let mut spec = spec;
    spec["template"] = json!({
        "metadata": {"labels": {"app": "work"}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]},
    });
    serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "pi", "namespace": "ns", "uid": "job-uid", "resourceVersion": "7"},
        "spec": spec,
    }))
    .expect("job")
}

fn with_status(mut job: Job, status: Value) -> Job {
    job.status = Some(serde_json::from_value(status).expect("status"));
    job
}

fn pod(name: &str, phase: &str, index: Option<i32>) -> Pod {
    let mut annotations = json!({});
    if let Some(i) = index {
        annotations[COMPLETION_INDEX] = json!(i.to_string());
    }
    serde_json::from_value(json!({
        "metadata": {
            "name": name, "namespace": "ns", "uid": format!("uid-{name}"),
            "annotations": annotations,
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "pi", "uid": "job-uid", "controller": true}],
        },
        "spec": {"containers": [{"name": "c", "image": "busybox"}], "nodeName": "n1"},
        "status": {"phase": phase},
    }))
    .expect("pod")
}

fn pods(prefix: &str, phase: &str, n: usize) -> Vec<Pod> {
    (0..n).map(|i| pod(&format!("{prefix}{i}"), phase, None)).collect()
}

fn creates(plan: &JobPlan) -> Vec<&Value> {
    plan.actions.iter().filter_map(|a| if let Action::Create(v) = a { Some(v) } else { None }).collect()
}

fn deleted_pods(plan: &JobPlan) -> Vec<String> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::Delete { kind, name, .. } if kind == "Pod" => Some(name.clone()),
            _ => None,
        })
        .collect()
}

fn must_status(plan: &JobPlan) -> JobStatus {
    plan.actions
        .iter()
        .find_map(|a| match a {
            Action::UpdateStatus(v) => {
                Some(serde_json::from_value::<Job>(v.clone()).expect("job").status.expect("status"))
            }
            _ => None,
        })
        .expect("a status update")
}

fn condition<'a>(status: &'a JobStatus, type_: &str) -> Option<&'a JobCondition> {
    status.conditions.iter().flatten().find(|c| c.type_ == type_)
}

#[test]
fn a_new_job_creates_parallelism_pods_from_its_template_owned_by_the_job() {
    let plan = reconcile(&job(json!({"completions": 5, "parallelism": 2})), &[], true, now());
    let created = creates(&plan);
    assert_eq!(created.len(), 2);
    assert_eq!(plan.expected_creations, 2);
    let p = created[0];
    assert_eq!(p["kind"], "Pod");
    assert_eq!(p["metadata"]["generateName"], "pi-");
    assert_eq!(p["metadata"]["labels"]["app"], "work");
    assert_eq!(p["metadata"]["labels"][CONTROLLER_UID_LABEL], "job-uid");
    assert_eq!(p["metadata"]["labels"][JOB_NAME_LABEL], "pi");
    assert_eq!(p["metadata"]["ownerReferences"][0]["uid"], "job-uid");
    assert_eq!(p["metadata"]["ownerReferences"][0]["controller"], true);
    assert_eq!(p["spec"]["restartPolicy"], "Never");
    let status = must_status(&plan);
    assert_eq!(status.start_time, Some(Time(now())));
    assert_eq!(status.active, Some(0));
}

#[test]
fn active_pods_are_capped_by_the_completions_still_needed() {
    let mut all = pods("done", "Succeeded", 4);
    all.extend(pods("run", "Running", 1));
    let plan = reconcile(&job(json!({"completions": 5, "parallelism": 3})), &all, true, now());
    assert!(creates(&plan).is_empty(), "one completion left and one pod running");
    let mut all = pods("done", "Succeeded", 3);
    let plan = reconcile(&job(json!({"completions": 5, "parallelism": 3})), &all, true, now());
    assert_eq!(creates(&plan).len(), 2);
    all.extend(pods("run", "Running", 3));
    let plan = reconcile(&job(json!({"completions": 5, "parallelism": 3})), &all, true, now());
    assert_eq!(deleted_pods(&plan).len(), 1, "three running for two completions");
}

#[test]
fn nothing_is_created_or_deleted_while_expectations_are_pending() {
    let plan = reconcile(&job(json!({"completions": 5, "parallelism": 2})), &[], false, now());
    assert!(creates(&plan).is_empty());
    assert_eq!(plan.expected_creations, 0);
}

#[test]
fn pods_owned_by_something_else_are_ignored() {
    let mut stranger = pod("other", "Running", None);
    stranger.metadata.owner_references.as_mut().unwrap()[0].uid = "another-job".into();
    let plan = reconcile(&job(json!({"completions": 1, "parallelism": 1})), &[stranger], true, now());
    assert_eq!(creates(&plan).len(), 1);
}

#[test]
fn enough_successes_complete_the_job_with_counts_and_completion_time() {
    let mut all = pods("done", "Succeeded", 3);
    all.extend(pods("bad", "Failed", 1));
    let plan = reconcile(&job(json!({"completions": 3, "parallelism": 2})), &all, true, now());
    let status = must_status(&plan);
    assert_eq!(condition(&status, "Complete").map(|c| c.status.as_str()), Some("True"));
    assert_eq!(status.completion_time, Some(Time(now())));
    assert_eq!((status.succeeded, status.failed, status.active), (Some(3), Some(1), Some(0)));
    assert!(plan.actions.iter().any(|a| matches!(a, Action::Event { reason, .. } if reason == "Completed")));
}

#[test]
fn a_work_queue_job_completes_when_one_pod_succeeded_and_none_is_active() {
    let mut all = pods("done", "Succeeded", 1);
    all.extend(pods("run", "Running", 1));
    let spec = json!({"parallelism": 2});
    let plan = reconcile(&job(spec.clone()), &all, true, now());
    assert!(creates(&plan).is_empty(), "after a success no new pods start");
    assert!(condition(&must_status(&plan), "Complete").is_none());
    let plan = reconcile(&job(spec), &pods("done", "Succeeded", 1), true, now());
    assert!(condition(&must_status(&plan), "Complete").is_some());
}

#[test]
fn failures_beyond_the_backoff_limit_fail_the_job_and_delete_active_pods() {
    let mut all = pods("bad", "Failed", 3);
    all.extend(pods("run", "Running", 1));
    let plan = reconcile(&job(json!({"completions": 5, "parallelism": 1, "backoffLimit": 2})), &all, true, now());
    let status = must_status(&plan);
    let failed = condition(&status, "Failed").expect("Failed condition");
    assert_eq!(failed.reason.as_deref(), Some("BackoffLimitExceeded"));
    assert_eq!(deleted_pods(&plan), vec!["run0".to_string()]);
    assert_eq!(plan.expected_deletions, vec!["uid-run0".to_string()]);
    assert!(creates(&plan).is_empty());
    // At the limit the job goes on.
    let plan = reconcile(&job(json!({"completions": 5, "parallelism": 1, "backoffLimit": 3})), &all, true, now());
    assert!(condition(&must_status(&plan), "Failed").is_none());
}

#[test]
fn running_past_the_active_deadline_fails_the_job() {
    let started = json!({"startTime": "2026-05-01T11:59:00Z", "active": 1, "ready": 0, "succeeded": 0, "failed": 0});
    let spec = json!({"completions": 1, "parallelism": 1, "activeDeadlineSeconds": 100});
    let running = pods("run", "Running", 1);
    let plan = reconcile(&with_status(job(spec.clone()), started.clone()), &running, true, now());
    assert_eq!(plan.requeue_after, Some(Duration::from_secs(40)));
    assert!(plan.actions.is_empty(), "nothing changed: {:?}", plan.actions);
    let later = now() + TimeDelta::seconds(40);
    let plan = reconcile(&with_status(job(spec), started), &running, true, later);
    let status = must_status(&plan);
    assert_eq!(condition(&status, "Failed").and_then(|c| c.reason.as_deref()), Some("DeadlineExceeded"));
    assert_eq!(deleted_pods(&plan), vec!["run0".to_string()]);
}

#[test]
fn indexed_jobs_create_the_lowest_missing_indexes_with_annotation_and_label() {
    let spec = json!({"completions": 6, "parallelism": 3, "completionMode": "Indexed"});
    let existing =
        vec![pod("p0", "Succeeded", Some(0)), pod("p1", "Running", Some(1)), pod("p3", "Succeeded", Some(3))];
    let plan = reconcile(&job(spec), &existing, true, now());
    let created = creates(&plan);
    let indexes: Vec<&str> =
        created.iter().map(|p| p["metadata"]["annotations"][COMPLETION_INDEX].as_str().unwrap()).collect();
    assert_eq!(indexes, vec!["2", "4"]);
    assert_eq!(created[0]["metadata"]["labels"][COMPLETION_INDEX], "2");
    assert_eq!(created[0]["metadata"]["generateName"], "pi-2-");
    let status = must_status(&plan);
    assert_eq!(status.completed_indexes.as_deref(), Some("0,3"));
    assert_eq!(status.succeeded, Some(2));
}

#[test]
fn indexed_jobs_delete_duplicate_pods_of_one_index() {
    let spec = json!({"completions": 2, "parallelism": 2, "completionMode": "Indexed"});
    let existing = vec![pod("a", "Running", Some(0)), pod("b", "Running", Some(0)), pod("c", "Running", Some(1))];
    let plan = reconcile(&job(spec), &existing, true, now());
    assert_eq!(deleted_pods(&plan).len(), 1);
    assert!(creates(&plan).is_empty());
}

#[test]
fn an_indexed_job_completes_when_every_index_succeeded_even_after_pods_are_gone() {
    let spec = json!({"completions": 3, "parallelism": 3, "completionMode": "Indexed"});
    let recorded =
        with_status(job(spec), json!({"completedIndexes": "0-1", "succeeded": 2, "startTime": "2026-05-01T11:00:00Z"}));
    let plan = reconcile(&recorded, &[pod("p2", "Succeeded", Some(2))], true, now());
    let status = must_status(&plan);
    assert_eq!(status.completed_indexes.as_deref(), Some("0-2"));
    assert!(condition(&status, "Complete").is_some());
}

#[test]
fn suspending_deletes_active_pods_and_resuming_restarts_the_clock() {
    let spec = json!({"completions": 2, "parallelism": 2, "suspend": true});
    let running = pods("run", "Running", 2);
    let plan = reconcile(&with_status(job(spec), json!({"startTime": "2026-05-01T11:00:00Z"})), &running, true, now());
    assert_eq!(deleted_pods(&plan).len(), 2);
    let status = must_status(&plan);
    assert_eq!(condition(&status, "Suspended").map(|c| c.status.as_str()), Some("True"));
    assert_eq!(status.start_time, None);

    let resumed = with_status(
        job(json!({"completions": 2, "parallelism": 2, "suspend": false})),
        serde_json::to_value(&status).unwrap(),
    );
    let later = now() + TimeDelta::minutes(5);
    let plan = reconcile(&resumed, &[], true, later);
    assert_eq!(creates(&plan).len(), 2);
    let status = must_status(&plan);
    let suspended = condition(&status, "Suspended").expect("condition kept");
    assert_eq!((suspended.status.as_str(), suspended.reason.as_deref()), ("False", Some("JobResumed")));
    assert_eq!(status.start_time, Some(Time(later)));
}

#[test]
fn a_finished_job_is_deleted_in_the_foreground_once_its_ttl_has_passed() {
    let spec = json!({"completions": 1, "parallelism": 1, "ttlSecondsAfterFinished": 60});
    let finished = with_status(
        job(spec),
        json!({"completionTime": "2026-05-01T11:59:30Z", "conditions": [{"type": "Complete", "status": "True"}]}),
    );
    let plan = reconcile(&finished, &[], true, now());
    assert_eq!(plan.requeue_after, Some(Duration::from_secs(30)));
    assert!(plan.actions.is_empty());
    let plan = reconcile(&finished, &[], true, now() + TimeDelta::seconds(30));
    assert_eq!(
        plan.actions,
        vec![Action::Delete {
            api_version: "batch/v1".into(),
            kind: "Job".into(),
            namespace: "ns".into(),
            name: "pi".into(),
            uid: Some("job-uid".into()),
            propagation: Some("Foreground".into()),
        }]
    );
}

#[test]
fn an_unchanged_job_writes_nothing() {
    let spec = json!({"completions": 3, "parallelism": 1});
    let running = vec![pod("run", "Running", None)];
    let first = reconcile(&job(spec.clone()), &running, true, now());
    let status = serde_json::to_value(must_status(&first)).unwrap();
    let again = reconcile(&with_status(job(spec), status), &running, true, now());
    assert!(again.actions.is_empty(), "{:?}", again.actions);
}

#[test]
fn ten_thousand_completions_reconcile_in_time_linear_in_pods() {
    let spec = json!({"completions": 10_000, "parallelism": 100, "completionMode": "Indexed"});
    let mut all: Vec<Pod> = (0..9_000).map(|i| pod(&format!("d{i}"), "Succeeded", Some(i))).collect();
    all.extend((9_000..9_050).map(|i| pod(&format!("r{i}"), "Running", Some(i))));
    let started = std::time::Instant::now();
    let plan = reconcile(&job(spec), &all, true, now());
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
    assert_eq!(creates(&plan).len(), 50);
    assert_eq!(must_status(&plan).completed_indexes.as_deref(), Some("0-8999"));
}

#[test]
fn index_sets_merge_ranges_and_print_as_kubernetes_does() {
    let mut set = IndexSet::parse("1,3-5, 9 ,bad,7-6");
    assert_eq!(set.to_string(), "1,3-5,9");
    set.insert(2);
    set.insert(8);
    assert_eq!(set.to_string(), "1-5,8-9");
    assert_eq!(set.len(), 7);
    assert!(set.contains(4) && !set.contains(6) && !set.contains(0));
    set.insert(7);
    set.insert(6);
    assert_eq!(set.to_string(), "1-9");
    assert!(IndexSet::parse("").is_empty());
}

#[test]
fn failed_pods_are_replaced_after_a_doubling_back_off() {
    let failed_at = |name: &str, at: DateTime<Utc>| {
        let mut p = pod(name, "Failed", None);
        p.status = Some(
            serde_json::from_value(json!({"phase": "Failed", "containerStatuses": [{
                "name": "c", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 1, "finishedAt": at.to_rfc3339()}}}]}))
            .expect("status"),
        );
        p
    };
    let spec = json!({"completions": 1, "parallelism": 1});
    let one = vec![failed_at("f1", now() - TimeDelta::seconds(4))];
    let plan = reconcile(&job(spec.clone()), &one, true, now());
    assert!(creates(&plan).is_empty());
    assert_eq!(plan.requeue_after, Some(Duration::from_secs(6)));
    assert_eq!(creates(&reconcile(&job(spec.clone()), &one, true, now() + TimeDelta::seconds(6))).len(), 1);
    // Three failures: 40s after the last.
    let three = vec![
        failed_at("f1", now() - TimeDelta::seconds(100)),
        failed_at("f2", now() - TimeDelta::seconds(50)),
        failed_at("f3", now() - TimeDelta::seconds(30)),
    ];
    assert_eq!(reconcile(&job(spec), &three, true, now()).requeue_after, Some(Duration::from_secs(10)));
}
