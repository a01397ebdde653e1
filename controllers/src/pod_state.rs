//! What controllers read from a pod: whether it still counts (active),
//! whether it serves (ready, available after `minReadySeconds`), and which
//! of several to delete first (Kubernetes' `ActivePods` order).

use std::cmp::Ordering;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;

/// Not terminating and not finished: a pod a replica count includes.
pub fn is_active(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_none() && !matches!(phase, Some("Succeeded" | "Failed"))
}

/// When the pod's `Ready` condition turned true; `None` if it is not ready.
pub fn ready_since(pod: &Pod) -> Option<DateTime<Utc>> {
    let ready = pod.status.as_ref()?.conditions.iter().flatten().find(|c| c.type_ == "Ready" && c.status == "True")?;
    // A ready condition without a time counts as ready since forever: it
    // cannot have been written by a kubelet, and waiting on it would never end.
    Some(ready.last_transition_time.as_ref().map_or(DateTime::<Utc>::MIN_UTC, |t| t.0))
}

pub fn is_ready(pod: &Pod) -> bool {
    ready_since(pod).is_some()
}

/// Ready for at least `min_ready_seconds` at `now`.
pub fn is_available(pod: &Pod, min_ready_seconds: i32, now: DateTime<Utc>) -> bool {
    available_at(pod, min_ready_seconds).is_some_and(|at| at <= now)
}

/// When a ready pod becomes (or became) available.
pub fn available_at(pod: &Pod, min_ready_seconds: i32) -> Option<DateTime<Utc>> {
    let since = ready_since(pod)?;
    Some(since.checked_add_signed(chrono::Duration::seconds(i64::from(min_ready_seconds.max(0)))).unwrap_or(since))
}

fn restarts(pod: &Pod) -> i32 {
    pod.status.iter().flat_map(|s| s.container_statuses.iter().flatten()).map(|c| c.restart_count).max().unwrap_or(0)
}

fn phase_rank(pod: &Pod) -> u8 {
    match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Pending") | None => 0,
        Some("Unknown") => 1,
        Some("Running") => 2,
        Some(_) => 3,
    }
}

/// Orders pods so the ones to delete first come first: unassigned before
/// assigned, pending before unknown before running, not ready before ready,
/// ready for less time before more, more restarts before fewer, newer before
/// older.
pub fn deletion_order(a: &Pod, b: &Pod) -> Ordering {
    let assigned = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty());
    let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
    assigned(a)
        .cmp(&assigned(b))
        .then_with(|| phase_rank(a).cmp(&phase_rank(b)))
        .then_with(|| is_ready(a).cmp(&is_ready(b)))
        // Both ready (or both not): the one ready more recently goes first.
        .then_with(|| ready_since(b).cmp(&ready_since(a)))
        .then_with(|| restarts(b).cmp(&restarts(a)))
        .then_with(|| created(b).cmp(&created(a)))
        .then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

#[cfg(test)]
pub(crate) mod tests {
    use chrono::TimeZone;
    use k8s_openapi::api::core::v1::{ContainerStatus, PodCondition, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    use super::*;

    pub(crate) fn at(secs: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap() + chrono::Duration::seconds(secs)
    }

    /// A pod named `name`, created at `created`, in `phase`, on `node`,
    /// ready since `ready` if set.
    pub(crate) fn pod(name: &str, created: i64, phase: &str, node: Option<&str>, ready: Option<i64>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{name}")),
                creation_timestamp: Some(Time(at(created))),
                ..Default::default()
            },
            spec: Some(PodSpec { node_name: node.map(String::from), ..Default::default() }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                conditions: ready.map(|r| {
                    vec![PodCondition {
                        type_: "Ready".into(),
                        status: "True".into(),
                        last_transition_time: Some(Time(at(r))),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn terminating_and_finished_pods_are_not_active() {
        let mut p = pod("a", 0, "Running", Some("n"), Some(1));
        assert!(is_active(&p));
        p.metadata.deletion_timestamp = Some(Time(at(5)));
        assert!(!is_active(&p));
        assert!(!is_active(&pod("b", 0, "Succeeded", Some("n"), None)));
        assert!(!is_active(&pod("c", 0, "Failed", Some("n"), None)));
    }

    #[test]
    fn a_ready_pod_is_available_after_min_ready_seconds() {
        let p = pod("a", 0, "Running", Some("n"), Some(10));
        assert!(!is_available(&p, 5, at(14)));
        assert!(is_available(&p, 5, at(15)));
        assert!(is_available(&p, 0, at(10)));
        assert!(!is_available(&pod("b", 0, "Running", Some("n"), None), 0, at(100)));
    }

    #[test]
    fn pods_are_deleted_in_kubernetes_active_pods_order() {
        let mut restarted = pod("restarted", 1, "Running", Some("n"), Some(50));
        restarted.status.as_mut().unwrap().container_statuses =
            Some(vec![ContainerStatus { restart_count: 3, ..Default::default() }]);
        let mut pods = [
            pod("old-ready", 0, "Running", Some("n"), Some(10)),
            pod("unassigned", 5, "Pending", None, None),
            pod("running-not-ready", 2, "Running", Some("n"), None),
            pod("pending", 3, "Pending", Some("n"), None),
            pod("unknown", 4, "Unknown", Some("n"), None),
            pod("new-ready", 6, "Running", Some("n"), Some(40)),
            restarted,
            pod("same-but-newer", 9, "Running", Some("n"), Some(50)),
        ];
        pods.sort_by(deletion_order);
        let names: Vec<&str> = pods.iter().map(|p| p.metadata.name.as_deref().unwrap()).collect();
        assert_eq!(
            names,
            [
                "unassigned",
                "pending",
                "unknown",
                "running-not-ready",
                "restarted",
                "same-but-newer",
                "new-ready",
                "old-ready"
            ]
        );
    }
}
