//! The Job controller's logic: from a Job, the pods it owns and the time,
//! the pods to create or delete and the status to record, as Kubernetes'
//! `pkg/controller/job` documents it.
//!
//! One [`reconcile`] call, in this order:
//!
//! 1. A Job being deleted is left alone. A finished Job (condition
//!    `Complete` or `Failed`) only waits out `ttlSecondsAfterFinished` and
//!    is then deleted with `Foreground` propagation, as Kubernetes' TTL
//!    controller does (Skiff folds that controller in here).
//! 2. `spec.suspend` deletes the active pods and records the `Suspended`
//!    condition; resuming records it `False` and restarts `startTime`.
//! 3. Failure: more failed pods (plus container restarts under
//!    `restartPolicy: OnFailure`) than `backoffLimit` ends the Job with
//!    reason `BackoffLimitExceeded`; running past `activeDeadlineSeconds`
//!    ends it with `DeadlineExceeded`. Active pods are deleted.
//! 4. Success: `completions` pods succeeded (NonIndexed), every index in
//!    `0..completions` succeeded (Indexed), or, without `completions`, one
//!    pod succeeded and none is active. `Complete` and `completionTime` are
//!    recorded; pods still active are deleted.
//! 5. Otherwise the active pods are brought to
//!    `min(parallelism, completions - succeeded)`: missing ones created from
//!    the template, extra ones deleted — only when the wiring's
//!    [`Expectations`](crate::expectations::Expectations) for the Job are
//!    satisfied, so a cache that lags its own writes never over-creates.
//!    A failed pod is replaced after a back-off of 10s doubling per failure
//!    since the last success (at most 10 minutes).
//!
//! Counts only grow: `succeeded` and `failed` are the larger of the recorded
//! value and the pods seen, and Indexed Jobs merge `completedIndexes` with
//! the succeeded pods, so a terminated pod that is later deleted still
//! counts (Kubernetes keeps it with a finalizer instead). The work is
//! linear in the Job's pods; Indexed bookkeeping is linear in the number
//! of index ranges, not in `completions`.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use k8s_openapi::api::batch::v1::{Job, JobCondition, JobSpec, JobStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde_json::{json, Value};

use crate::action::Action;

/// The label (and its legacy twin) that selects a Job's pods by its uid.
pub const CONTROLLER_UID_LABEL: &str = "batch.kubernetes.io/controller-uid";
/// The label (and its legacy twin) naming a pod's Job.
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";
/// The annotation and label carrying an Indexed Job pod's index.
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";

/// Kubernetes' default `backoffLimit`.
const DEFAULT_BACKOFF_LIMIT: i32 = 6;

/// The first delay before replacing a failed pod, doubled per failure
/// (Kubernetes' `DefaultJobPodFailureBackOff`), and its cap.
const FAILURE_BACKOFF_BASE: TimeDelta = TimeDelta::seconds(10);
const FAILURE_BACKOFF_MAX: TimeDelta = TimeDelta::minutes(10);

/// What one reconcile of a Job asks for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobPlan {
    /// The writes, in order.
    pub actions: Vec<Action>,
    /// How many pod creations `actions` holds; the wiring records them with
    /// `Expectations::expect_creations` before carrying them out.
    pub expected_creations: usize,
    /// The uids of the pods `actions` deletes, for
    /// `Expectations::expect_deletions`.
    pub expected_deletions: Vec<String>,
    /// Reconcile again after this long even without an event (the active
    /// deadline, or the TTL of a finished Job).
    pub requeue_after: Option<Duration>,
}

/// Reconciles one Job. `pods` are the pods of the Job's namespace the
/// wiring indexes under this Job (its controller owner reference); pods
/// owned by anything else are ignored. `expectations_satisfied` is
/// `Expectations::satisfied` for the Job's key.
pub fn reconcile(job: &Job, pods: &[Pod], expectations_satisfied: bool, now: DateTime<Utc>) -> JobPlan {
    let mut plan = JobPlan::default();
    let (Some(uid), Some(name)) = (job.metadata.uid.as_deref(), job.metadata.name.as_deref()) else {
        return plan;
    };
    if job.metadata.deletion_timestamp.is_some() {
        return plan;
    }
    let namespace = job.metadata.namespace.clone().unwrap_or_default();
    let default_spec = JobSpec::default();
    let spec = job.spec.as_ref().unwrap_or(&default_spec);
    let old_status = job.status.clone().unwrap_or_default();

    if let Some(finished_at) = finished_at(&old_status) {
        plan.requeue_after = expire_after_ttl(job, spec, finished_at, now, &mut plan.actions);
        return plan;
    }

    let owned: Vec<&Pod> = pods.iter().filter(|p| controller_uid(p) == Some(uid)).collect();
    let active: Vec<&Pod> = owned.iter().copied().filter(|p| is_active(p)).collect();
    let phase_count = |phase: &str| owned.iter().filter(|p| pod_phase(p) == phase).count();
    let indexed = spec.completion_mode.as_deref() == Some("Indexed");
    let completions = spec.completions;
    let parallelism = spec.parallelism.unwrap_or(1).max(0);

    let mut status = old_status.clone();
    let mut completed = IndexSet::parse(old_status.completed_indexes.as_deref().unwrap_or(""));
    if indexed {
        let limit = completions.unwrap_or(0);
        for pod in owned.iter().filter(|p| pod_phase(p) == "Succeeded") {
            if let Some(i) = completion_index(pod).filter(|i| *i < limit) {
                completed.insert(i);
            }
        }
        status.succeeded = Some(to_i32(completed.len()));
        status.completed_indexes = Some(completed.to_string());
    } else {
        status.succeeded = Some(old_status.succeeded.unwrap_or(0).max(to_i32(phase_count("Succeeded"))));
    }
    status.failed = Some(old_status.failed.unwrap_or(0).max(to_i32(phase_count("Failed"))));
    let succeeded = status.succeeded.unwrap_or(0);
    let failed = status.failed.unwrap_or(0);

    let job_value = reference(job);
    let event = |type_: &str, reason: &str, message: String| Action::Event {
        regarding: job_value.clone(),
        type_: type_.to_string(),
        reason: reason.to_string(),
        message,
    };
    let mut deletions: Vec<&Pod> = Vec::new();
    let mut creations: Vec<Value> = Vec::new();
    let mut events = Vec::new();

    let suspended = spec.suspend == Some(true);
    let was_suspended = has_condition(&old_status, "Suspended");
    if suspended {
        deletions.extend(active.iter().copied());
        if !was_suspended {
            set_condition(&mut status, "Suspended", "True", "JobSuspended", "Job suspended", now);
            events.push(event("Normal", "Suspended", "Job suspended".into()));
        }
        // The deadline counts running time only: it restarts on resume.
        status.start_time = None;
    } else {
        if was_suspended {
            set_condition(&mut status, "Suspended", "False", "JobResumed", "Job resumed", now);
            events.push(event("Normal", "Resumed", "Job resumed".into()));
            status.start_time = Some(Time(now));
        }
        if status.start_time.is_none() {
            status.start_time = Some(Time(now));
        }
        let started = status.start_time.as_ref().map_or(now, |t| t.0);

        let backoff_limit = spec.backoff_limit.unwrap_or(DEFAULT_BACKOFF_LIMIT);
        let restarts =
            if restart_policy(spec) == "OnFailure" { active.iter().map(|p| restart_count(p)).sum() } else { 0 };
        let deadline = spec.active_deadline_seconds.map(|s| started + TimeDelta::seconds(s));
        let failure = if failed.saturating_add(restarts) > backoff_limit {
            Some(("BackoffLimitExceeded", "Job has reached the specified backoff limit"))
        } else if deadline.is_some_and(|d| now >= d) {
            Some(("DeadlineExceeded", "Job was active longer than specified deadline"))
        } else {
            None
        };

        let done = if indexed {
            completed.len() >= usize::try_from(completions.unwrap_or(0)).unwrap_or(0)
        } else {
            match completions {
                Some(n) => succeeded >= n,
                None => succeeded > 0 && active.is_empty(),
            }
        };

        if let Some((reason, message)) = failure {
            deletions.extend(active.iter().copied());
            set_condition(&mut status, "Failed", "True", reason, message, now);
            events.push(event("Warning", reason, message.into()));
        } else if done {
            deletions.extend(active.iter().copied());
            set_condition(&mut status, "Complete", "True", "", "", now);
            status.completion_time = Some(Time(now));
            events.push(event("Normal", "Completed", "Job completed".into()));
            if let Some(ttl) = spec.ttl_seconds_after_finished {
                plan.requeue_after = Some(seconds(ttl.into()));
            }
        } else {
            if expectations_satisfied {
                let template = PodFactory { name, uid, namespace: &namespace, spec };
                if indexed {
                    manage_indexed(
                        &active,
                        &completed,
                        completions.unwrap_or(0),
                        parallelism,
                        &template,
                        &mut creations,
                        &mut deletions,
                    );
                } else {
                    let remaining =
                        completions.map_or(if succeeded > 0 { 0 } else { parallelism }, |n| (n - succeeded).max(0));
                    let want = usize::try_from(parallelism.min(remaining)).unwrap_or(0);
                    if active.len() > want {
                        let mut ranked = active.clone();
                        ranked.sort_by_key(|p| deletion_rank(p));
                        deletions.extend(ranked.into_iter().take(active.len() - want));
                    } else {
                        creations.extend((active.len()..want).map(|_| template.pod(None)));
                    }
                }
            }
            // Replacements for failed pods wait out the back-off; the
            // deletions of extra pods go ahead.
            let backoff_until = failure_backoff_until(&owned).filter(|t| *t > now);
            if backoff_until.is_some() {
                creations.clear();
            }
            plan.requeue_after = [deadline, backoff_until].into_iter().flatten().min().map(|d| to_duration(d - now));
        }
    }

    let deleting: HashSet<&str> = deletions.iter().filter_map(|p| p.metadata.uid.as_deref()).collect();
    let still_active = active.iter().filter(|p| !deleting.contains(p.metadata.uid.as_deref().unwrap_or(""))).count();
    status.active = Some(to_i32(still_active));
    status.ready = Some(to_i32(
        active.iter().filter(|p| !deleting.contains(p.metadata.uid.as_deref().unwrap_or("")) && is_ready(p)).count(),
    ));

    let mut seen = HashSet::new();
    for pod in deletions {
        let Some(pod_uid) = pod.metadata.uid.clone() else { continue };
        if !seen.insert(pod_uid.clone()) {
            continue;
        }
        plan.actions.push(Action::delete_of(pod, None));
        plan.expected_deletions.push(pod_uid);
    }
    plan.expected_creations = creations.len();
    plan.actions.extend(creations.into_iter().map(Action::Create));
    if status != old_status {
        let mut updated = job.clone();
        updated.status = Some(status);
        if let Ok(v) = serde_json::to_value(&updated) {
            plan.actions.push(Action::UpdateStatus(v));
        }
    }
    plan.actions.extend(events);
    plan
}

/// The Indexed part of step 5: one active pod per index still to complete,
/// at most `parallelism` of them, lowest indexes first.
fn manage_indexed<'a>(
    active: &[&'a Pod],
    completed: &IndexSet,
    completions: i32,
    parallelism: i32,
    factory: &PodFactory<'_>,
    creations: &mut Vec<Value>,
    deletions: &mut Vec<&'a Pod>,
) {
    // Keep one pod per wanted index; delete the rest (duplicates, indexes
    // out of range or already complete).
    let mut by_index: BTreeMap<i32, &Pod> = BTreeMap::new();
    let mut ranked = active.to_vec();
    ranked.sort_by_key(|p| std::cmp::Reverse(deletion_rank(p)));
    for pod in ranked {
        match completion_index(pod) {
            Some(i) if i < completions && !completed.contains(i) && !by_index.contains_key(&i) => {
                by_index.insert(i, pod);
            }
            _ => deletions.push(pod),
        }
    }
    let want = usize::try_from(parallelism).unwrap_or(0);
    while by_index.len() > want {
        if let Some((_, pod)) = by_index.pop_last() {
            deletions.push(pod);
        }
    }
    let mut missing = want - by_index.len();
    let mut i = 0;
    while missing > 0 && i < completions {
        if let Some(end) = completed.range_end_at(i) {
            i = end + 1;
            continue;
        }
        if !by_index.contains_key(&i) {
            creations.push(factory.pod(Some(i)));
            missing -= 1;
        }
        i += 1;
    }
}

/// Builds the Job's pods from its template.
struct PodFactory<'a> {
    name: &'a str,
    uid: &'a str,
    namespace: &'a str,
    spec: &'a JobSpec,
}

impl PodFactory<'_> {
    /// A pod of the template: the Job's selector labels (the apiserver sets
    /// them on the template unless `manualSelector`), the index annotation
    /// and label for Indexed Jobs, and the Job as controlling owner.
    fn pod(&self, index: Option<i32>) -> Value {
        let template = &self.spec.template;
        let meta = template.metadata.clone().unwrap_or_default();
        let mut labels = meta.labels.unwrap_or_default();
        let mut annotations = meta.annotations.unwrap_or_default();
        if self.spec.manual_selector != Some(true) {
            for (k, v) in [
                (CONTROLLER_UID_LABEL, self.uid),
                ("controller-uid", self.uid),
                (JOB_NAME_LABEL, self.name),
                ("job-name", self.name),
            ] {
                labels.entry(k.to_string()).or_insert_with(|| v.to_string());
            }
        }
        let generate_name = match index {
            Some(i) => {
                annotations.insert(COMPLETION_INDEX.into(), i.to_string());
                labels.insert(COMPLETION_INDEX.into(), i.to_string());
                format!("{}-{i}-", self.name)
            }
            None => format!("{}-", self.name),
        };
        let pod = Pod {
            metadata: ObjectMeta {
                generate_name: Some(generate_name),
                namespace: Some(self.namespace.to_string()),
                labels: Some(labels),
                annotations: (!annotations.is_empty()).then_some(annotations),
                owner_references: Some(vec![OwnerReference {
                    api_version: "batch/v1".into(),
                    kind: "Job".into(),
                    name: self.name.to_string(),
                    uid: self.uid.to_string(),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]),
                ..ObjectMeta::default()
            },
            spec: template.spec.clone(),
            status: None,
        };
        serde_json::to_value(pod).unwrap_or(Value::Null)
    }
}

/// When the next pod may be created after failures: Kubernetes' back-off
/// of 10s doubling with each failure since the last success, at most 10
/// minutes, from the last failure. `None` without failures.
fn failure_backoff_until(owned: &[&Pod]) -> Option<DateTime<Utc>> {
    let last_success = owned.iter().filter(|p| pod_phase(p) == "Succeeded").filter_map(|p| pod_finished_at(p)).max();
    let failures: Vec<DateTime<Utc>> = owned
        .iter()
        .filter(|p| pod_phase(p) == "Failed")
        .filter_map(|p| pod_finished_at(p))
        .filter(|t| last_success.is_none_or(|s| *t > s))
        .collect();
    let last = *failures.iter().max()?;
    let doublings = u32::try_from(failures.len() - 1).unwrap_or(u32::MAX).min(16);
    let delay = (FAILURE_BACKOFF_BASE * 2_i32.pow(doublings)).min(FAILURE_BACKOFF_MAX);
    Some(last + delay)
}

/// When a terminated pod finished: its last container's exit, else when
/// it stopped being ready.
fn pod_finished_at(pod: &Pod) -> Option<DateTime<Utc>> {
    let status = pod.status.as_ref()?;
    let exited = status
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref().map(|t| t.0))
        .max();
    exited.or_else(|| {
        status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Ready")
            .and_then(|c| c.last_transition_time.as_ref().map(|t| t.0))
    })
}

/// Step 1: the TTL of a finished Job. Deletes the Job once it has passed,
/// else says how long until it does.
fn expire_after_ttl(
    job: &Job,
    spec: &JobSpec,
    finished_at: DateTime<Utc>,
    now: DateTime<Utc>,
    actions: &mut Vec<Action>,
) -> Option<Duration> {
    let ttl = spec.ttl_seconds_after_finished?;
    let expires = finished_at + TimeDelta::seconds(ttl.into());
    if now < expires {
        return Some(to_duration(expires - now));
    }
    actions.push(Action::Delete {
        api_version: "batch/v1".into(),
        kind: "Job".into(),
        namespace: job.metadata.namespace.clone().unwrap_or_default(),
        name: job.metadata.name.clone().unwrap_or_default(),
        uid: job.metadata.uid.clone(),
        // The TTL controller waits for the pods to go first.
        propagation: Some("Foreground".into()),
    });
    None
}

/// When the Job finished: `completionTime`, else the transition of its
/// `Complete`/`Failed` condition; `None` while it runs.
fn finished_at(status: &JobStatus) -> Option<DateTime<Utc>> {
    let condition = status
        .conditions
        .iter()
        .flatten()
        .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")?;
    Some(
        status
            .completion_time
            .as_ref()
            .or(condition.last_transition_time.as_ref())
            .map_or(DateTime::<Utc>::MIN_UTC, |t| t.0),
    )
}

fn has_condition(status: &JobStatus, type_: &str) -> bool {
    status.conditions.iter().flatten().any(|c| c.type_ == type_ && c.status == "True")
}

/// Sets a condition, keeping its transition time when the status is unchanged.
fn set_condition(status: &mut JobStatus, type_: &str, value: &str, reason: &str, message: &str, now: DateTime<Utc>) {
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    let new = JobCondition {
        type_: type_.into(),
        status: value.into(),
        reason: (!reason.is_empty()).then(|| reason.into()),
        message: (!message.is_empty()).then(|| message.into()),
        last_probe_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) if c.status == value => {}
        Some(c) => *c = new,
        None => conditions.push(new),
    }
}

fn controller_uid(pod: &Pod) -> Option<&str> {
    pod.metadata.owner_references.iter().flatten().find(|r| r.controller == Some(true)).map(|r| r.uid.as_str())
}

fn pod_phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
}

/// Running or about to: not terminated and not being deleted.
fn is_active(pod: &Pod) -> bool {
    !matches!(pod_phase(pod), "Succeeded" | "Failed") && pod.metadata.deletion_timestamp.is_none()
}

fn is_ready(pod: &Pod) -> bool {
    pod.status.iter().flat_map(|s| s.conditions.iter().flatten()).any(|c| c.type_ == "Ready" && c.status == "True")
}

fn restart_count(pod: &Pod) -> i32 {
    pod.status.iter().flat_map(|s| s.container_statuses.iter().flatten()).map(|c| c.restart_count).sum()
}

fn restart_policy(spec: &JobSpec) -> &str {
    spec.template.spec.as_ref().and_then(|s| s.restart_policy.as_deref()).unwrap_or("Never")
}

fn completion_index(pod: &Pod) -> Option<i32> {
    let from = |m: &Option<BTreeMap<String, String>>| m.as_ref()?.get(COMPLETION_INDEX)?.parse::<i32>().ok();
    from(&pod.metadata.annotations).or_else(|| from(&pod.metadata.labels)).filter(|i| *i >= 0)
}

/// Which active pods go first when there are too many: not yet on a node,
/// then pending, then not ready, then the newest (Kubernetes' `ActivePods`
/// order). Lower sorts first.
fn deletion_rank(pod: &Pod) -> (bool, bool, bool, std::cmp::Reverse<Option<DateTime<Utc>>>) {
    let scheduled = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
    (
        scheduled,
        pod_phase(pod) != "Pending",
        is_ready(pod),
        std::cmp::Reverse(pod.metadata.creation_timestamp.as_ref().map(|t| t.0)),
    )
}

fn to_i32(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn seconds(s: i64) -> Duration {
    Duration::from_secs(u64::try_from(s).unwrap_or(0))
}

fn to_duration(d: TimeDelta) -> Duration {
    d.to_std().unwrap_or(Duration::ZERO)
}

/// A set of completion indexes as sorted, disjoint, non-adjacent ranges:
/// the form of `status.completedIndexes` (`"1,3-5"`), so a Job of many
/// completions costs the number of ranges, not of indexes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IndexSet {
    ranges: Vec<(i32, i32)>,
}

impl IndexSet {
    /// Parses `"1,3-5"`; malformed parts are skipped, as Kubernetes does.
    pub fn parse(s: &str) -> IndexSet {
        let mut set = IndexSet::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (a.parse::<i32>(), b.parse::<i32>()),
                None => (part.parse::<i32>(), part.parse::<i32>()),
            };
            if let (Ok(a), Ok(b)) = (a, b) {
                if 0 <= a && a <= b {
                    set.insert_range(a, b);
                }
            }
        }
        set
    }

    /// Adds one index.
    pub fn insert(&mut self, i: i32) {
        self.insert_range(i, i);
    }

    fn insert_range(&mut self, a: i32, b: i32) {
        // The first range that ends at or after a-1 (could merge with [a, b]).
        let start = self.ranges.partition_point(|&(_, end)| end < a.saturating_sub(1));
        let mut lo = a;
        let mut hi = b;
        let mut stop = start;
        while stop < self.ranges.len() && self.ranges[stop].0 <= b.saturating_add(1) {
            lo = lo.min(self.ranges[stop].0);
            hi = hi.max(self.ranges[stop].1);
            stop += 1;
        }
        self.ranges.splice(start..stop, [(lo, hi)]);
    }

    /// Whether `i` is in the set.
    pub fn contains(&self, i: i32) -> bool {
        self.range_end_at(i).is_some()
    }

    /// The end of the range holding `i`, if any.
    fn range_end_at(&self, i: i32) -> Option<i32> {
        let k = self.ranges.partition_point(|&(_, end)| end < i);
        self.ranges.get(k).filter(|&&(start, _)| start <= i).map(|&(_, end)| end)
    }

    /// How many indexes the set holds.
    pub fn len(&self) -> usize {
        self.ranges.iter().map(|&(a, b)| usize::try_from(b - a).unwrap_or(0) + 1).sum()
    }

    /// Whether the set holds no index.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

impl std::fmt::Display for IndexSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (n, &(a, b)) in self.ranges.iter().enumerate() {
            if n > 0 {
                f.write_str(",")?;
            }
            if a == b {
                write!(f, "{a}")?;
            } else {
                write!(f, "{a}-{b}")?;
            }
        }
        Ok(())
    }
}

/// What an event about the Job names it by.
fn reference(job: &Job) -> Value {
    json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job.metadata.name, "namespace": job.metadata.namespace, "uid": job.metadata.uid},
    })
}

#[cfg(test)]
mod tests;
