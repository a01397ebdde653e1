//! Jobs and CronJobs (`batch/v1`), as Kubernetes' `pkg/apis/batch/validation`.

use serde_json::Value;

use super::apps::{selector_matches, validate_label_selector, SELECTOR_MISMATCH};
use super::cron::{parse_standard, time_zone};
use super::object::{validate_annotations, validate_labels};
use super::pod::{equal_ignoring_empty, one_of, validate_pod_template};
use super::{get, get_str, nonnegative, same, IMMUTABLE};
use crate::field::{FieldError, Path};

/// CronJob names leave room for the 11 characters of a job's suffix.
const CRON_JOB_NAME_MAX: usize = 52;

/// An Indexed Job runs at most this many pods at once (Kubernetes'
/// `maxParallelismForIndexedJob`).
const MAX_INDEXED_PARALLELISM: i64 = 100_000;

pub(crate) fn validate_job(obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let spec = get(obj, "spec");
    let path = Path::new("spec");
    let mut errs = Vec::new();
    let selector = get(spec, "selector");
    let sel_path = path.child("selector");
    if selector.is_null() {
        // Kubernetes generates the selector (`batch.kubernetes.io/controller-uid`)
        // before validating unless `manualSelector` is true.
        if get(spec, "manualSelector").as_bool() == Some(true) {
            errs.push(FieldError::required(&sel_path, ""));
        }
    } else {
        let sel_errs = validate_label_selector(selector, &sel_path);
        let labels = get(get(get(spec, "template"), "metadata"), "labels");
        if sel_errs.is_empty() && !selector_matches(selector, labels) {
            errs.push(FieldError::invalid(
                path.child("template").child("metadata").child("labels"),
                labels,
                SELECTOR_MISMATCH,
            ));
        }
        errs.extend(sel_errs);
    }
    errs.extend(validate_job_spec(spec, &path));

    if let Some(old) = old {
        let old_spec = get(old, "spec");
        for field in ["selector", "completionMode"] {
            if !same(get(spec, field), get(old_spec, field)) {
                errs.push(FieldError::invalid(path.child(field), get(spec, field), IMMUTABLE));
            }
        }
        if !equal_ignoring_empty(get(spec, "template"), get(old_spec, "template")) {
            errs.push(FieldError::invalid(path.child("template"), get(spec, "template"), IMMUTABLE));
        }
        if get_str(spec, "completionMode") != "Indexed" && !same(get(spec, "completions"), get(old_spec, "completions"))
        {
            errs.push(FieldError::invalid(path.child("completions"), get(spec, "completions"), IMMUTABLE));
        }
    }
    errs
}

/// What a Job and a CronJob's job template share.
fn validate_job_spec(spec: &Value, path: &Path) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for field in ["parallelism", "completions", "activeDeadlineSeconds", "backoffLimit", "ttlSecondsAfterFinished"] {
        errs.extend(nonnegative(spec, field, path));
    }
    let mode = get(spec, "completionMode");
    if let Some(m) = mode.as_str() {
        if m != "NonIndexed" && m != "Indexed" {
            errs.push(FieldError::not_supported(path.child("completionMode"), mode, &["NonIndexed", "Indexed"]));
        } else if m == "Indexed" {
            if get(spec, "completions").is_null() {
                errs.push(FieldError::required(path.child("completions"), "when completion mode is Indexed"));
            }
            let parallelism = get(spec, "parallelism");
            if parallelism.as_i64().is_some_and(|p| p > MAX_INDEXED_PARALLELISM) {
                errs.push(FieldError::invalid(
                    path.child("parallelism"),
                    parallelism,
                    format!("must be less than or equal to {MAX_INDEXED_PARALLELISM} when completion mode is Indexed"),
                ));
            }
        }
    }
    let template = get(spec, "template");
    let tpath = path.child("template");
    errs.extend(validate_pod_template(template, &tpath));
    let restart = get(get(template, "spec"), "restartPolicy");
    if !matches!(restart.as_str(), Some("OnFailure" | "Never")) {
        errs.push(FieldError::not_supported(
            tpath.child("spec").child("restartPolicy"),
            restart,
            &["OnFailure", "Never"],
        ));
    }
    errs
}

pub(crate) fn validate_cron_job(obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let spec = get(obj, "spec");
    let path = Path::new("spec");
    let mut errs = Vec::new();

    let name = get(get(obj, "metadata"), "name");
    if name.as_str().is_some_and(|n| n.len() > CRON_JOB_NAME_MAX) {
        errs.push(FieldError::invalid(
            "metadata.name",
            name,
            format!("must be no more than {CRON_JOB_NAME_MAX} characters"),
        ));
    }

    let schedule = get_str(spec, "schedule");
    let sched_path = path.child("schedule");
    if schedule.is_empty() {
        errs.push(FieldError::required(&sched_path, ""));
    } else {
        if let Err(e) = parse_standard(schedule) {
            errs.push(FieldError::invalid(&sched_path, get(spec, "schedule"), e));
        }
        let old_had_tz = old.is_some_and(|o| get_str(get(o, "spec"), "schedule").contains("TZ"));
        if schedule.contains("TZ") && !old_had_tz {
            errs.push(FieldError::invalid(
                &sched_path,
                get(spec, "schedule"),
                "cannot use TZ or CRON_TZ in schedule, use timeZone field instead",
            ));
        }
    }
    errs.extend(validate_time_zone(get(spec, "timeZone"), &path.child("timeZone")));
    errs.extend(nonnegative(spec, "startingDeadlineSeconds", &path));
    errs.extend(one_of(spec, "concurrencyPolicy", &["Allow", "Forbid", "Replace"], &path.child("concurrencyPolicy")));
    errs.extend(nonnegative(spec, "successfulJobsHistoryLimit", &path));
    errs.extend(nonnegative(spec, "failedJobsHistoryLimit", &path));

    let jt = get(spec, "jobTemplate");
    let jt_path = path.child("jobTemplate");
    let jt_meta = get(jt, "metadata");
    errs.extend(validate_labels(get(jt_meta, "labels"), &jt_path.child("metadata").child("labels")));
    errs.extend(validate_annotations(get(jt_meta, "annotations"), &jt_path.child("metadata").child("annotations")));
    let job_spec = get(jt, "spec");
    let js_path = jt_path.child("spec");
    errs.extend(validate_job_spec(job_spec, &js_path));
    let selector = get(job_spec, "selector");
    if !selector.is_null() {
        errs.push(FieldError::invalid(js_path.child("selector"), selector, "`selector` will be auto-generated"));
    }
    let manual = get(job_spec, "manualSelector");
    if manual.as_bool() == Some(true) {
        errs.push(FieldError::not_supported(js_path.child("manualSelector"), manual, &["nil", "false"]));
    }
    errs
}

/// `spec.timeZone`: unset, or a zone of the IANA database (Kubernetes loads
/// it with Go's `time.LoadLocation`; Skiff looks it up in the database
/// compiled in, so the answer does not depend on the host).
fn validate_time_zone(zone: &Value, path: &Path) -> Vec<FieldError> {
    let Some(name) = zone.as_str() else {
        return Vec::new();
    };
    if name.is_empty() {
        return vec![FieldError::invalid(path, zone, "timeZone must be nil or non-empty string")];
    }
    if name.eq_ignore_ascii_case("Local") {
        return vec![FieldError::invalid(
            path,
            zone,
            "timeZone must be an explicit time zone as defined in https://www.iana.org/time-zones",
        )];
    }
    match time_zone(name) {
        Some(_) => Vec::new(),
        None => vec![FieldError::invalid(path, zone, format!("unknown time zone {name}"))],
    }
}
