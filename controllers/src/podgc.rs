//! The pod garbage collector: deletes pods nobody else will.
//!
//! Every pass ([`PodGc::reconcile`], run periodically, Kubernetes every
//! 20 s, with every pod and node from the caches) deletes:
//!
//! - terminated pods (`Succeeded`/`Failed`) beyond
//!   `terminated_pod_gc_threshold`, oldest first (0 turns this off);
//! - pods bound to a node that has been missing for
//!   [`NODE_MISSING_GRACE`] (a node just created may not be in the cache
//!   yet), force-deleted since no kubelet will finish them;
//! - pods being deleted that were never scheduled, force-deleted.
//!
//! The time a node was first seen missing is the only state, kept in
//! [`PodGc`] and judged by our own clock (`now`).

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Duration, Utc};
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::action::Action;

/// Kubernetes' `--terminated-pod-gc-threshold` default.
pub const DEFAULT_TERMINATED_POD_GC_THRESHOLD: usize = 12500;
/// How long a node must be missing before its pods are deleted.
pub const NODE_MISSING_GRACE: Duration = Duration::seconds(40);

/// The pod garbage collector's flags.
#[derive(Clone, Debug)]
pub struct Config {
    /// `--terminated-pod-gc-threshold`: terminated pods kept; 0 keeps all.
    pub terminated_pod_gc_threshold: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config { terminated_pod_gc_threshold: DEFAULT_TERMINATED_POD_GC_THRESHOLD }
    }
}

/// The pod garbage collector and what it remembers between passes.
#[derive(Debug)]
pub struct PodGc {
    config: Config,
    /// Node name → when a pod's node was first seen missing.
    missing_since: BTreeMap<String, DateTime<Utc>>,
}

impl PodGc {
    pub fn new(config: Config) -> Self {
        PodGc { config, missing_since: BTreeMap::new() }
    }

    /// One pass over every pod and node at `now`.
    pub fn reconcile(&mut self, pods: &[Pod], nodes: &[Node], now: DateTime<Utc>) -> Vec<Action> {
        let mut actions = self.terminated(pods);
        let known: BTreeSet<&str> = nodes.iter().filter_map(|n| n.metadata.name.as_deref()).collect();
        let mut missing = BTreeSet::new();
        for pod in pods {
            let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).filter(|n| !n.is_empty());
            match node {
                Some(node) if !known.contains(node) => {
                    missing.insert(node.to_string());
                    let since = *self.missing_since.entry(node.to_string()).or_insert(now);
                    if now - since >= NODE_MISSING_GRACE {
                        actions.push(force_delete(pod));
                    }
                }
                Some(_) => {}
                None if pod.metadata.deletion_timestamp.is_some() => actions.push(force_delete(pod)),
                None => {}
            }
        }
        // A node back, or without pods, is forgotten.
        self.missing_since.retain(|node, _| missing.contains(node));
        actions
    }

    /// The oldest terminated pods beyond the threshold.
    fn terminated(&self, pods: &[Pod]) -> Vec<Action> {
        let threshold = self.config.terminated_pod_gc_threshold;
        if threshold == 0 {
            return vec![];
        }
        let mut done: Vec<&Pod> = pods
            .iter()
            .filter(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded") | Some("Failed"))
            })
            .collect();
        if done.len() <= threshold {
            return vec![];
        }
        done.sort_by(|a, b| {
            let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
            created(a).cmp(&created(b)).then_with(|| a.metadata.name.cmp(&b.metadata.name))
        });
        let excess = done.len() - threshold;
        done.into_iter().take(excess).map(|p| Action::delete_of(p, None)).collect()
    }
}

fn force_delete(pod: &Pod) -> Action {
    Action::ForceDelete {
        api_version: "v1".into(),
        kind: "Pod".into(),
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone(),
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn t(seconds: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap() + Duration::seconds(seconds)
    }

    fn pod(name: &str, node: Option<&str>, phase: &str, created: i64) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.namespace = Some("default".into());
        pod.metadata.creation_timestamp = Some(Time(t(created)));
        pod.spec = Some(PodSpec { node_name: node.map(str::to_string), ..Default::default() });
        pod.status = Some(PodStatus { phase: Some(phase.into()), ..Default::default() });
        pod
    }

    fn node(name: &str) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some(name.into());
        node
    }

    fn names(actions: &[Action]) -> Vec<(&'static str, String)> {
        actions
            .iter()
            .map(|a| match a {
                Action::Delete { name, .. } => ("delete", name.clone()),
                Action::ForceDelete { name, .. } => ("force", name.clone()),
                other => panic!("unexpected {other:?}"),
            })
            .collect()
    }

    #[test]
    fn terminated_pods_over_the_threshold_are_deleted_oldest_first() {
        let mut gc = PodGc::new(Config { terminated_pod_gc_threshold: 2 });
        let pods = [
            pod("new", Some("n1"), "Succeeded", 30),
            pod("old", Some("n1"), "Failed", 10),
            pod("running", Some("n1"), "Running", 0),
            pod("middle", Some("n1"), "Succeeded", 20),
            pod("oldest", Some("n1"), "Succeeded", 5),
        ];
        assert_eq!(
            names(&gc.reconcile(&pods, &[node("n1")], t(100))),
            vec![("delete", "oldest".into()), ("delete", "old".into())]
        );
    }

    #[test]
    fn a_zero_threshold_keeps_every_terminated_pod() {
        let mut gc = PodGc::new(Config { terminated_pod_gc_threshold: 0 });
        assert!(gc.reconcile(&[pod("done", Some("n1"), "Succeeded", 0)], &[node("n1")], t(0)).is_empty());
    }

    #[test]
    fn pods_of_a_missing_node_are_force_deleted_after_the_grace() {
        let mut gc = PodGc::new(Config::default());
        let pods = [pod("orphan", Some("gone"), "Running", 0), pod("fine", Some("n1"), "Running", 0)];
        let nodes = [node("n1")];
        assert!(gc.reconcile(&pods, &nodes, t(0)).is_empty(), "the node may just be new");
        assert!(gc.reconcile(&pods, &nodes, t(39)).is_empty());
        assert_eq!(names(&gc.reconcile(&pods, &nodes, t(40))), vec![("force", "orphan".into())]);
    }

    #[test]
    fn a_node_that_comes_back_restarts_the_grace() {
        let mut gc = PodGc::new(Config::default());
        let pods = [pod("p", Some("flaky"), "Running", 0)];
        gc.reconcile(&pods, &[], t(0));
        gc.reconcile(&pods, &[node("flaky")], t(30));
        assert!(gc.reconcile(&pods, &[], t(50)).is_empty(), "missing again only since 50");
        assert_eq!(names(&gc.reconcile(&pods, &[], t(90))), vec![("force", "p".into())]);
    }

    #[test]
    fn unscheduled_pods_being_deleted_are_force_deleted() {
        let mut gc = PodGc::new(Config::default());
        let mut leaving = pod("leaving", None, "Pending", 0);
        leaving.metadata.deletion_timestamp = Some(Time(t(0)));
        let pending = pod("pending", None, "Pending", 0);
        assert_eq!(names(&gc.reconcile(&[leaving, pending], &[], t(1))), vec![("force", "leaving".into())]);
    }
}
