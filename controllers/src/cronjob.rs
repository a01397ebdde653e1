//! The CronJob controller's logic: from a CronJob, the Jobs it owns and the
//! time, the Jobs to create or delete and the status to record, as
//! Kubernetes' `cronjob_controllerv2` documents it.
//!
//! One [`reconcile`] call, in this order:
//!
//! 1. `status.active` is brought in line with the owned Jobs: finished
//!    ones leave it (event `SawCompletedJob`), running ones missing from it
//!    join it, and `lastSuccessfulTime` follows the latest completion.
//! 2. Finished Jobs beyond `successfulJobsHistoryLimit` (3) and
//!    `failedJobsHistoryLimit` (1) are deleted, oldest first.
//! 3. A suspended CronJob stops here.
//! 4. The schedule is read in `spec.timeZone` (the IANA database compiled
//!    into `skiff-api`, so every host agrees; UTC when unset). The most
//!    recent start time not yet run is found between `lastScheduleTime`
//!    (or creation) and now, no earlier than `startingDeadlineSeconds` ago;
//!    more than 100 missed times raise `TooManyMissedTimes` and only the
//!    latest runs.
//! 5. `concurrencyPolicy`: `Forbid` skips the start while a Job is active
//!    (it runs once the active Job ends, if still within the deadline);
//!    `Replace` deletes the active Jobs first; `Allow` starts regardless.
//! 6. The Job is created from `jobTemplate`, named
//!    `<cronjob>-<scheduled time in minutes since the epoch>`: a retry of
//!    the same start asks for the same name, so it can never run twice.
//!    `lastScheduleTime` records the start.
//!
//! [`CronJobPlan::requeue_after`] is the time until the next start, so the
//! wiring wakes the CronJob up when it is due without polling.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use chrono_tz::Tz;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde_json::{json, Value};
use skiff_api::validation::cron::{time_zone, Schedule};

use crate::action::Action;

/// The annotation on each Job with the start time it was created for.
pub const SCHEDULED_TIMESTAMP_ANNOTATION: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";

/// More missed start times than this are reported (and only the latest runs).
const MAX_MISSED: usize = 100;

/// Kubernetes' defaults for the history limits.
const DEFAULT_SUCCESSFUL_HISTORY: i32 = 3;
const DEFAULT_FAILED_HISTORY: i32 = 1;

/// Wake up this much after a start time, so the clock is surely past it.
const REQUEUE_SLACK: Duration = Duration::from_millis(100);

/// An active entry without a uid (recorded with the create, before the Job
/// was seen) whose Job is not in the cache is kept this long, for the cache
/// to catch up, and then dropped.
const UNSEEN_JOB_GRACE: TimeDelta = TimeDelta::minutes(1);

/// What one reconcile of a CronJob asks for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CronJobPlan {
    /// The writes, in order.
    pub actions: Vec<Action>,
    /// Reconcile again after this long: the next start time. `None` when
    /// suspended or when the schedule or zone cannot be read.
    pub requeue_after: Option<Duration>,
}

/// The name of the Job for the start at `scheduled`.
pub fn job_name(cron_job_name: &str, scheduled: DateTime<Utc>) -> String {
    format!("{cron_job_name}-{}", scheduled.timestamp().div_euclid(60))
}

/// Reconciles one CronJob. `jobs` are the Jobs of its namespace the wiring
/// indexes under it (its controller owner reference); others are ignored.
pub fn reconcile(cron_job: &CronJob, jobs: &[Job], now: DateTime<Utc>) -> CronJobPlan {
    let mut plan = CronJobPlan::default();
    let meta = &cron_job.metadata;
    let (Some(uid), Some(name)) = (meta.uid.as_deref(), meta.name.as_deref()) else {
        return plan;
    };
    if meta.deletion_timestamp.is_some() {
        return plan;
    }
    let namespace = meta.namespace.clone().unwrap_or_default();
    let spec = cron_job.spec.clone().unwrap_or_default();
    let old_status = cron_job.status.clone().unwrap_or_default();
    let mut status = old_status.clone();
    let regarding = reference(cron_job);
    let mut events = Vec::new();
    let mut event = |type_: &str, reason: &str, message: String| {
        events.push(Action::Event { regarding: regarding.clone(), type_: type_.into(), reason: reason.into(), message })
    };
    let owned: Vec<&Job> = jobs.iter().filter(|j| controller_uid(&j.metadata) == Some(uid)).collect();

    // 1. The active list and the last success.
    let mut active: Vec<ObjectReference> = Vec::new();
    for entry in old_status.active.iter().flatten() {
        match owned.iter().find(|j| same_job(entry, j)) {
            Some(job) if finished(job).is_some() => {
                let how = if finished(job) == Some(true) { "Complete" } else { "Failed" };
                event("Normal", "SawCompletedJob", format!("Saw completed job: {}, status: {how}", job_name_of(job)));
            }
            Some(job) => active.push(job_reference(job)),
            None => {
                let recent = old_status.last_schedule_time.as_ref().is_some_and(|t| now - t.0 < UNSEEN_JOB_GRACE);
                if entry.uid.is_none() && recent {
                    active.push(entry.clone());
                }
            }
        }
    }
    for job in &owned {
        if finished(job).is_none() && !active.iter().any(|e| same_job(e, job)) {
            active.push(job_reference(job));
        }
    }
    let last_success = owned
        .iter()
        .filter(|j| finished(j) == Some(true))
        .filter_map(|j| j.status.as_ref()?.completion_time.as_ref().map(|t| t.0))
        .chain(old_status.last_successful_time.as_ref().map(|t| t.0))
        .max();
    status.last_successful_time = last_success.map(Time);

    // 2. History.
    let mut deletions = Vec::new();
    for (succeeded, limit, default) in [
        (true, spec.successful_jobs_history_limit, DEFAULT_SUCCESSFUL_HISTORY),
        (false, spec.failed_jobs_history_limit, DEFAULT_FAILED_HISTORY),
    ] {
        let mut done: Vec<&Job> = owned.iter().copied().filter(|j| finished(j) == Some(succeeded)).collect();
        let keep = usize::try_from(limit.unwrap_or(default)).unwrap_or(0);
        if done.len() > keep {
            done.sort_by_key(|j| started_at(j));
            deletions.extend(done[..done.len() - keep].iter().map(|j| delete_job(j, &namespace)));
        }
    }

    let mut creation = None;
    if spec.suspend != Some(true) {
        match schedule_of(&spec.schedule, spec.time_zone.as_deref()) {
            Err((reason, message)) => event("Warning", reason, message),
            Ok((schedule, zone)) => {
                let earliest = {
                    let last = old_status.last_schedule_time.as_ref().map(|t| t.0);
                    let created = meta.creation_timestamp.as_ref().map_or(now, |t| t.0);
                    let from = last.unwrap_or(created);
                    match spec.starting_deadline_seconds {
                        Some(s) => from.max(now - TimeDelta::seconds(s)),
                        None => from,
                    }
                };
                let due = most_recent_start(&schedule, zone, earliest, now);
                if due.missed > MAX_MISSED {
                    event(
                        "Warning",
                        "TooManyMissedTimes",
                        format!(
                            "too many missed start times: more than {MAX_MISSED}. Set or decrease \
                             .spec.startingDeadlineSeconds or check clock skew"
                        ),
                    );
                }
                if let Some(scheduled) = due.latest {
                    let too_late =
                        spec.starting_deadline_seconds.is_some_and(|s| scheduled + TimeDelta::seconds(s) < now);
                    let job_name = job_name(name, scheduled);
                    let processed = owned.iter().any(|j| job_name_of(j) == job_name)
                        || active.iter().any(|e| e.name.as_deref() == Some(job_name.as_str()))
                        || old_status.last_schedule_time.as_ref().is_some_and(|t| t.0 >= scheduled);
                    let policy = spec.concurrency_policy.as_deref().unwrap_or("Allow");
                    if too_late {
                        event(
                            "Warning",
                            "MissSchedule",
                            format!("Missed scheduled time to start a job: {}", scheduled.to_rfc2822()),
                        );
                    } else if processed {
                        // This start already has its Job.
                    } else if policy == "Forbid" && !active.is_empty() {
                        event(
                            "Normal",
                            "JobAlreadyActive",
                            "Not starting job because prior execution is running and concurrency policy is Forbid"
                                .into(),
                        );
                    } else {
                        if policy == "Replace" {
                            for entry in active.drain(..) {
                                let Some(entry_name) = entry.name.clone() else { continue };
                                deletions.push(Action::Delete {
                                    api_version: "batch/v1".into(),
                                    kind: "Job".into(),
                                    namespace: namespace.clone(),
                                    name: entry_name.clone(),
                                    uid: entry.uid.clone(),
                                    propagation: Some("Background".into()),
                                });
                                event("Normal", "SuccessfulDelete", format!("Deleted job {entry_name}"));
                            }
                        }
                        creation = Some(new_job(cron_job, name, uid, &namespace, &job_name, scheduled, zone));
                        event("Normal", "SuccessfulCreate", format!("Created job {job_name}"));
                        active.push(ObjectReference {
                            api_version: Some("batch/v1".into()),
                            kind: Some("Job".into()),
                            name: Some(job_name),
                            namespace: Some(namespace.clone()),
                            ..ObjectReference::default()
                        });
                        status.last_schedule_time = Some(Time(scheduled));
                    }
                }
                plan.requeue_after = next_start(&schedule, zone, now).map(|t| to_duration(t - now) + REQUEUE_SLACK);
            }
        }
    }

    status.active = match (active.is_empty(), &old_status.active) {
        // Keep an empty list as it was written (absent or `[]`).
        (true, Some(old)) if old.is_empty() => old_status.active.clone(),
        (true, _) => None,
        (false, _) => Some(active),
    };
    plan.actions.extend(deletions);
    plan.actions.extend(creation.map(Action::Create));
    if status != old_status {
        let mut updated = cron_job.clone();
        updated.status = Some(status);
        if let Ok(v) = serde_json::to_value(&updated) {
            plan.actions.push(Action::UpdateStatus(v));
        }
    }
    plan.actions.extend(events);
    plan
}

/// The schedule and its zone, or the event reason and message saying why not.
fn schedule_of(spec: &str, zone: Option<&str>) -> Result<(Schedule, Tz), (&'static str, String)> {
    let schedule =
        Schedule::parse(spec).map_err(|e| ("UnparseableSchedule", format!("unparseable schedule: {spec:?} : {e}")))?;
    let zone_name = zone.or(schedule.zone());
    let zone = match zone_name {
        None => Tz::UTC,
        Some(z) => time_zone(z).ok_or(("UnknownTimeZone", format!("invalid timeZone: {z:?}")))?,
    };
    Ok((schedule, zone))
}

/// The start times in `(earliest, now]`: the latest, and how many (counted
/// up to just past [`MAX_MISSED`]).
#[derive(Debug, PartialEq)]
struct Due {
    latest: Option<DateTime<Utc>>,
    missed: usize,
}

fn most_recent_start(schedule: &Schedule, zone: Tz, earliest: DateTime<Utc>, now: DateTime<Utc>) -> Due {
    let mut due = Due { latest: None, missed: 0 };
    let mut t = earliest;
    while let Some(next) = next_start(schedule, zone, t).filter(|n| *n <= now) {
        due.latest = Some(next);
        due.missed += 1;
        if due.missed > MAX_MISSED {
            break;
        }
        t = next;
    }
    if due.missed <= MAX_MISSED {
        return due;
    }
    // Too many to walk: look back from now over growing windows; the first
    // that holds a start time holds the latest one, in few steps.
    for window in [TimeDelta::hours(1), TimeDelta::days(1), TimeDelta::days(32), TimeDelta::days(367)] {
        let mut t = earliest.max(now - window);
        let mut latest = None;
        while let Some(next) = next_start(schedule, zone, t).filter(|n| *n <= now) {
            latest = Some(next);
            t = next;
        }
        if latest.is_some() {
            due.latest = latest;
            break;
        }
    }
    due
}

fn next_start(schedule: &Schedule, zone: Tz, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
    schedule.next_after(&after.with_timezone(&zone)).map(|t| t.with_timezone(&Utc))
}

/// The Job for one start: the template's metadata and spec, the scheduled
/// time annotation (in the CronJob's zone), the CronJob as controller.
fn new_job(
    cron_job: &CronJob,
    name: &str,
    uid: &str,
    namespace: &str,
    job_name: &str,
    scheduled: DateTime<Utc>,
    zone: Tz,
) -> Value {
    let template = cron_job.spec.as_ref().map(|s| s.job_template.clone()).unwrap_or_default();
    let meta = template.metadata.unwrap_or_default();
    let mut annotations = meta.annotations.unwrap_or_default();
    annotations.insert(
        SCHEDULED_TIMESTAMP_ANNOTATION.into(),
        scheduled.with_timezone(&zone).to_rfc3339_opts(SecondsFormat::Secs, true),
    );
    let job = Job {
        metadata: ObjectMeta {
            name: Some(job_name.into()),
            namespace: Some(namespace.into()),
            labels: meta.labels,
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: "batch/v1".into(),
                kind: "CronJob".into(),
                name: name.into(),
                uid: uid.into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        spec: template.spec,
        status: None,
    };
    serde_json::to_value(job).unwrap_or(Value::Null)
}

fn delete_job(job: &Job, namespace: &str) -> Action {
    Action::Delete {
        api_version: "batch/v1".into(),
        kind: "Job".into(),
        namespace: job.metadata.namespace.clone().unwrap_or_else(|| namespace.into()),
        name: job_name_of(job).into(),
        uid: job.metadata.uid.clone(),
        propagation: Some("Background".into()),
    }
}

/// `Some(true)` if the Job completed, `Some(false)` if it failed, `None`
/// while it runs.
fn finished(job: &Job) -> Option<bool> {
    let conditions = job.status.as_ref()?.conditions.as_ref()?;
    conditions
        .iter()
        .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        .map(|c| c.type_ == "Complete")
}

fn started_at(job: &Job) -> Option<DateTime<Utc>> {
    job.status.as_ref().and_then(|s| s.start_time.as_ref()).or(job.metadata.creation_timestamp.as_ref()).map(|t| t.0)
}

fn job_name_of(job: &Job) -> &str {
    job.metadata.name.as_deref().unwrap_or("")
}

fn same_job(entry: &ObjectReference, job: &Job) -> bool {
    match (&entry.uid, &job.metadata.uid) {
        (Some(a), Some(b)) => a == b,
        _ => entry.name.as_deref() == Some(job_name_of(job)),
    }
}

fn job_reference(job: &Job) -> ObjectReference {
    ObjectReference {
        api_version: Some("batch/v1".into()),
        kind: Some("Job".into()),
        name: job.metadata.name.clone(),
        namespace: job.metadata.namespace.clone(),
        uid: job.metadata.uid.clone(),
        ..ObjectReference::default()
    }
}

fn controller_uid(meta: &ObjectMeta) -> Option<&str> {
    meta.owner_references.iter().flatten().find(|r| r.controller == Some(true)).map(|r| r.uid.as_str())
}

/// What an event about the CronJob names it by.
fn reference(cron_job: &CronJob) -> Value {
    let m = &cron_job.metadata;
    json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": m.name, "namespace": m.namespace, "uid": m.uid}})
}

fn to_duration(d: TimeDelta) -> Duration {
    d.to_std().unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests;
