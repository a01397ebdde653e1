use serde_json::json;

use super::*;
use k8s_openapi::api::batch::v1::CronJobStatus;

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).expect("time").with_timezone(&Utc)
}

fn cron_job(schedule: &str, extra: Value, status: Value) -> CronJob {
    let mut spec = json!({
        "schedule": schedule,
        "jobTemplate": {
            "metadata": {"labels": {"app": "report"}},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}},
        },
    });
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": "cj", "namespace": "ns", "uid": "cj-uid", "resourceVersion": "3",
                     "creationTimestamp": "2026-03-01T00:00:00Z"},
        "spec": spec,
        "status": status,
    }))
    .expect("cronjob")
}

/// A Job owned by the CronJob: `None` running, else complete or failed.
fn job(name: &str, started: &str, outcome: Option<bool>) -> Job {
    let mut status = json!({"startTime": started});
    if let Some(ok) = outcome {
        status["conditions"] = json!([{"type": if ok { "Complete" } else { "Failed" }, "status": "True"}]);
        if ok {
            status["completionTime"] = json!(started);
        }
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "cj", "uid": "cj-uid", "controller": true}]},
        "spec": {"template": {"spec": {"containers": []}}},
        "status": status,
    }))
    .expect("job")
}

fn active(names: &[&str]) -> Value {
    json!(names.iter().map(|n| json!({"apiVersion": "batch/v1", "kind": "Job", "name": n, "namespace": "ns", "uid": format!("uid-{n}")})).collect::<Vec<_>>())
}

fn created(plan: &CronJobPlan) -> Vec<&Value> {
    plan.actions.iter().filter_map(|a| if let Action::Create(v) = a { Some(v) } else { None }).collect()
}

fn deleted(plan: &CronJobPlan) -> Vec<String> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::Delete { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect()
}

fn events(plan: &CronJobPlan) -> Vec<String> {
    plan.actions
        .iter()
        .filter_map(|a| if let Action::Event { reason, .. } = a { Some(reason.clone()) } else { None })
        .collect()
}

fn must_status(plan: &CronJobPlan) -> CronJobStatus {
    plan.actions
        .iter()
        .find_map(|a| match a {
            Action::UpdateStatus(v) => serde_json::from_value::<CronJob>(v.clone()).ok()?.status,
            _ => None,
        })
        .expect("a status update")
}

#[test]
fn a_job_name_is_the_scheduled_minute_since_the_epoch() {
    assert_eq!(job_name("cj", at("2026-01-01T00:00:00Z")), "cj-29453760");
    assert_eq!(job_name("cj", at("2026-01-01T00:00:59Z")), "cj-29453760");
}

#[test]
fn a_time_zone_schedule_fires_at_its_local_minute_across_a_daylight_saving_change() {
    // 09:00 New York: 14:00 UTC in winter, 13:00 UTC from 2026-03-08 (EDT).
    let cj = cron_job(
        "0 9 * * *",
        json!({"timeZone": "America/New_York"}),
        json!({"lastScheduleTime": "2026-03-07T14:00:00Z"}),
    );
    let early = reconcile(&cj, &[], at("2026-03-08T12:30:00Z"));
    assert!(created(&early).is_empty());
    assert_eq!(early.requeue_after, Some(Duration::from_secs(30 * 60) + REQUEUE_SLACK));

    let due = at("2026-03-08T13:00:00Z");
    let plan = reconcile(&cj, &[], due + TimeDelta::seconds(5));
    let jobs = created(&plan);
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0]["metadata"]["name"], job_name("cj", due));
    assert_eq!(jobs[0]["metadata"]["annotations"][SCHEDULED_TIMESTAMP_ANNOTATION], "2026-03-08T09:00:00-04:00");
    assert_eq!(jobs[0]["metadata"]["labels"]["app"], "report");
    assert_eq!(jobs[0]["metadata"]["ownerReferences"][0]["uid"], "cj-uid");
    assert_eq!(jobs[0]["spec"]["template"]["spec"]["restartPolicy"], "Never");
    let status = must_status(&plan);
    assert_eq!(status.last_schedule_time, Some(Time(due)));
    assert_eq!(status.active.map(|a| a.len()), Some(1));
    assert!(events(&plan).contains(&"SuccessfulCreate".to_string()));
    // Next: 09:00 EDT the day after, almost a day later.
    assert_eq!(plan.requeue_after, Some(Duration::from_secs(24 * 3600 - 5) + REQUEUE_SLACK));
}

#[test]
fn forbid_skips_a_start_while_a_job_is_active() {
    let cj = cron_job(
        "*/10 * * * *",
        json!({"concurrencyPolicy": "Forbid"}),
        json!({"lastScheduleTime": "2026-03-02T10:00:00Z", "active": active(&["cj-old"])}),
    );
    let running = job("cj-old", "2026-03-02T10:00:00Z", None);
    let plan = reconcile(&cj, &[running], at("2026-03-02T10:10:30Z"));
    assert!(created(&plan).is_empty());
    assert!(deleted(&plan).is_empty());
    assert!(events(&plan).contains(&"JobAlreadyActive".to_string()));
    // Once it has finished, the start runs.
    let finished = job("cj-old", "2026-03-02T10:00:00Z", Some(true));
    let plan = reconcile(&cj, &[finished], at("2026-03-02T10:11:00Z"));
    assert_eq!(created(&plan).len(), 1);
}

#[test]
fn replace_deletes_the_running_job_before_starting_the_next() {
    let cj = cron_job(
        "*/10 * * * *",
        json!({"concurrencyPolicy": "Replace"}),
        json!({"lastScheduleTime": "2026-03-02T10:00:00Z", "active": active(&["cj-old"])}),
    );
    let running = job("cj-old", "2026-03-02T10:00:00Z", None);
    let plan = reconcile(&cj, &[running], at("2026-03-02T10:10:30Z"));
    assert_eq!(deleted(&plan), vec!["cj-old".to_string()]);
    assert_eq!(created(&plan).len(), 1);
    let status = must_status(&plan);
    let names: Vec<_> = status.active.into_iter().flatten().filter_map(|r| r.name).collect();
    assert_eq!(names, vec![job_name("cj", at("2026-03-02T10:10:00Z"))]);
}

#[test]
fn allow_starts_alongside_a_running_job() {
    let cj = cron_job(
        "*/10 * * * *",
        json!({}),
        json!({"lastScheduleTime": "2026-03-02T10:00:00Z", "active": active(&["cj-old"])}),
    );
    let plan = reconcile(&cj, &[job("cj-old", "2026-03-02T10:00:00Z", None)], at("2026-03-02T10:10:30Z"));
    assert_eq!(created(&plan).len(), 1);
    assert!(deleted(&plan).is_empty());
    assert_eq!(must_status(&plan).active.map(|a| a.len()), Some(2));
}

#[test]
fn finished_jobs_beyond_the_history_limits_are_deleted_oldest_first() {
    let cj = cron_job("0 0 1 1 *", json!({}), json!({"lastScheduleTime": "2026-03-01T00:00:00Z"}));
    let jobs = vec![
        job("ok-1", "2026-03-01T01:00:00Z", Some(true)),
        job("ok-2", "2026-03-01T02:00:00Z", Some(true)),
        job("ok-3", "2026-03-01T03:00:00Z", Some(true)),
        job("ok-4", "2026-03-01T04:00:00Z", Some(true)),
        job("ok-5", "2026-03-01T05:00:00Z", Some(true)),
        job("bad-1", "2026-03-01T01:30:00Z", Some(false)),
        job("bad-2", "2026-03-01T02:30:00Z", Some(false)),
        job("running", "2026-03-01T06:00:00Z", None),
    ];
    let plan = reconcile(&cj, &jobs, at("2026-03-02T00:00:00Z"));
    let mut gone = deleted(&plan);
    gone.sort();
    assert_eq!(gone, vec!["bad-1", "ok-1", "ok-2"]);
    assert_eq!(must_status(&plan).last_successful_time, Some(Time(at("2026-03-01T05:00:00Z"))));
    let custom =
        cron_job("0 0 1 1 *", json!({"successfulJobsHistoryLimit": 0, "failedJobsHistoryLimit": 5}), json!({}));
    assert_eq!(deleted(&reconcile(&custom, &jobs, at("2026-03-02T00:00:00Z"))).len(), 5);
}

#[test]
fn a_start_missed_beyond_the_starting_deadline_is_skipped() {
    let cj = cron_job(
        "0 * * * *",
        json!({"startingDeadlineSeconds": 60}),
        json!({"lastScheduleTime": "2026-03-02T10:00:00Z"}),
    );
    let plan = reconcile(&cj, &[], at("2026-03-02T11:05:00Z"));
    assert!(created(&plan).is_empty(), "11:00 is more than 60s ago");
    assert_eq!(plan.requeue_after, Some(Duration::from_secs(55 * 60) + REQUEUE_SLACK));
    let in_time = reconcile(&cj, &[], at("2026-03-02T11:00:45Z"));
    assert_eq!(created(&in_time).len(), 1);
}

#[test]
fn too_many_missed_starts_are_reported_and_only_the_latest_runs() {
    let cj = cron_job("* * * * *", json!({}), json!({}));
    let now = at("2026-03-04T08:30:20Z");
    let plan = reconcile(&cj, &[], now);
    assert!(events(&plan).contains(&"TooManyMissedTimes".to_string()));
    let jobs = created(&plan);
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0]["metadata"]["name"], job_name("cj", at("2026-03-04T08:30:00Z")));
}

#[test]
fn a_start_whose_job_exists_is_not_created_again() {
    let cj = cron_job("*/10 * * * *", json!({}), json!({"lastScheduleTime": "2026-03-02T10:00:00Z"}));
    let due = at("2026-03-02T10:10:00Z");
    let existing = job(&job_name("cj", due), "2026-03-02T10:10:01Z", Some(true));
    let plan = reconcile(&cj, &[existing], at("2026-03-02T10:10:30Z"));
    assert!(created(&plan).is_empty());
}

#[test]
fn a_suspended_cron_job_starts_nothing_and_sleeps() {
    let cj = cron_job("* * * * *", json!({"suspend": true}), json!({"lastScheduleTime": "2026-03-02T10:00:00Z"}));
    let plan = reconcile(&cj, &[], at("2026-03-02T11:00:00Z"));
    assert!(plan.actions.is_empty());
    assert_eq!(plan.requeue_after, None);
}

#[test]
fn an_unknown_zone_or_schedule_is_reported_and_starts_nothing() {
    let cj = cron_job("0 9 * * *", json!({"timeZone": "Mars/Olympus"}), json!({}));
    let plan = reconcile(&cj, &[], at("2026-03-02T11:00:00Z"));
    assert_eq!(events(&plan), vec!["UnknownTimeZone".to_string()]);
    let cj = cron_job("61 * * * *", json!({}), json!({}));
    assert_eq!(events(&reconcile(&cj, &[], at("2026-03-02T11:00:00Z"))), vec!["UnparseableSchedule".to_string()]);
}

#[test]
fn a_finished_job_leaves_the_active_list() {
    let cj = cron_job(
        "0 0 1 1 *",
        json!({}),
        json!({"lastScheduleTime": "2026-03-01T00:00:00Z", "active": active(&["cj-a"])}),
    );
    let plan = reconcile(&cj, &[job("cj-a", "2026-03-01T00:00:00Z", Some(true))], at("2026-03-01T00:05:00Z"));
    let status = must_status(&plan);
    assert_eq!(status.active, None);
    assert_eq!(status.last_successful_time, Some(Time(at("2026-03-01T00:00:00Z"))));
    assert!(events(&plan).contains(&"SawCompletedJob".to_string()));
}
