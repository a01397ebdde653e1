//! Preemption: when a pod fits nowhere, find a node where evicting
//! lower-priority pods would let it fit, evicting as few and as
//! unimportant pods as possible, and breaking as few PodDisruptionBudgets
//! as it can (kube's DefaultPreemption).
//!
//! Only nodes that failed for reasons eviction can resolve are tried. On
//! each, every lower-priority pod is removed; if the pod then fits, the
//! removed pods are added back, first those whose eviction would exceed a
//! budget's allowed disruptions, then the others, each group most
//! important first, and each one whose return breaks the fit stays a
//! victim. Among the candidate nodes the winner breaks the fewest
//! budgets, then has the lowest highest-victim priority, then the
//! smallest sum of victim priorities, then the fewest victims, then the
//! latest start time of its most important victims. Budgets are a
//! preference, as in Kubernetes: when every way to make room breaks one,
//! the pod still preempts.

use std::collections::BTreeSet;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

use crate::algorithm::{FitError, Profile};
use crate::cluster::Cluster;
use crate::filters::{filter, FilterState};
use crate::framework::{NodeInfo, PodInfo};
use crate::selector::Selector;

/// Where a preempting pod goes, and whom it evicts there.
#[derive(Debug, Clone)]
pub struct Preemption {
    /// The node to nominate (`status.nominatedNodeName`).
    pub node: String,
    /// Pods to delete (gracefully), most important first.
    pub victims: Vec<Arc<PodInfo>>,
    /// How many victims a PodDisruptionBudget does not allow to go.
    pub budget_violations: usize,
}

/// What preemption reads of a PodDisruptionBudget.
#[derive(Debug, Clone)]
pub struct Budget {
    namespace: String,
    selector: Selector,
    /// `status.disruptionsAllowed`.
    allowed: i32,
    /// `status.disruptedPods`: already charged, so evicting them costs nothing.
    disrupted: BTreeSet<String>,
}

impl Budget {
    /// The budget of `pdb`; None for one that selects nothing (a missing
    /// or empty selector, as kube's preemption reads it).
    pub fn new(pdb: &PodDisruptionBudget) -> Option<Budget> {
        let selector = pdb.spec.as_ref()?.selector.as_ref()?;
        let selector = Selector::from_label_selector(selector);
        if selector.requirements().is_empty() || selector.is_nothing() {
            return None;
        }
        let status = pdb.status.clone().unwrap_or_default();
        Some(Budget {
            namespace: pdb.metadata.namespace.clone().unwrap_or_default(),
            selector,
            allowed: status.disruptions_allowed,
            disrupted: status.disrupted_pods.unwrap_or_default().into_keys().collect(),
        })
    }
}

/// Splits `pods` (in order) into those whose eviction, after the ones
/// before them, exceeds some budget's allowed disruptions, and the rest
/// (kube's filterPodsWithPDBViolation).
fn split_by_budgets(pods: Vec<Arc<PodInfo>>, budgets: &[Budget]) -> (Vec<Arc<PodInfo>>, Vec<Arc<PodInfo>>) {
    let mut allowed: Vec<i32> = budgets.iter().map(|b| b.allowed).collect();
    let (mut violating, mut other) = (Vec::new(), Vec::new());
    for pod in pods {
        let mut violates = false;
        if !pod.labels().is_empty() {
            for (budget, left) in budgets.iter().zip(allowed.iter_mut()) {
                if budget.namespace != pod.key.namespace
                    || !budget.selector.matches(pod.labels())
                    || budget.disrupted.contains(&pod.key.name)
                {
                    continue;
                }
                *left -= 1;
                violates |= *left < 0;
            }
        }
        if violates {
            violating.push(pod);
        } else {
            other.push(pod);
        }
    }
    (violating, other)
}

/// kube's minCandidateNodesPercentage and minCandidateNodesAbsolute:
/// stop looking once this many candidate nodes are found.
const MIN_CANDIDATES_PERCENTAGE: usize = 10;
const MIN_CANDIDATES: usize = 100;

/// Whether `pod` may preempt at all: not with `preemptionPolicy: Never`,
/// and not while a victim of its earlier preemption is still terminating
/// on its nominated node (kube's PodEligibleToPreemptOthers).
pub fn eligible(pod: &PodInfo, cluster: &Cluster) -> bool {
    if pod.never_preempts {
        return false;
    }
    let nominated =
        pod.pod.status.as_ref().and_then(|s| s.nominated_node_name.as_deref()).and_then(|n| cluster.node(n));
    !nominated.is_some_and(|node| node.pods.iter().any(|p| p.terminating && p.priority < pod.priority))
}

/// Chooses a node and victims for `pod`, which failed with `fit`; None
/// when the pod may not preempt or no eviction of lower-priority pods helps.
/// `budgets` are the cluster's PodDisruptionBudgets.
pub fn preempt(
    pod: &PodInfo,
    cluster: &Cluster,
    _profile: &Profile,
    fit: &FitError,
    budgets: &[Budget],
) -> Option<Preemption> {
    if !eligible(pod, cluster) || fit.resolvable.is_empty() {
        return None;
    }
    let state = FilterState::new(pod, cluster);
    let wanted = (cluster.node_count() * MIN_CANDIDATES_PERCENTAGE / 100).max(MIN_CANDIDATES);
    let mut candidates: Vec<Preemption> = Vec::new();
    let nodes = cluster.nodes();
    for node in fit.resolvable.iter().map(|&i| &nodes[i]) {
        if let Some((victims, budget_violations)) = select_victims(pod, node, &state, cluster, budgets) {
            let candidate = Preemption { node: node.name.clone(), victims, budget_violations };
            if candidate.victims.is_empty() {
                return Some(candidate);
            }
            candidates.push(candidate);
            if candidates.len() >= wanted {
                break;
            }
        }
    }
    pick(candidates)
}

/// What a failed preemption adds to the FailedScheduling message
/// (`FitError::post_filter`), in kube's words: nodes where evicting could
/// have helped but found no victims, and nodes where it cannot help.
pub fn failure_message(fit: &FitError) -> String {
    let tried = fit.resolvable.len();
    let mut parts = Vec::new();
    if tried > 0 {
        parts.push(format!("{tried} No preemption victims found for incoming pod"));
    }
    if fit.nodes > tried {
        parts.push(format!("{} Preemption is not helpful for scheduling", fit.nodes - tried));
    }
    parts.sort();
    format!("preemption: 0/{} nodes are available: {}", fit.nodes, parts.join(", "))
}

/// The fewest, least important pods on `node` whose eviction lets `pod`
/// fit, sparing those a budget protects where it can, and how many of them
/// a budget protects; None if evicting every lower-priority pod is not enough.
pub fn select_victims(
    pod: &PodInfo,
    node: &NodeInfo,
    state: &FilterState,
    cluster: &Cluster,
    budgets: &[Budget],
) -> Option<(Vec<Arc<PodInfo>>, usize)> {
    let mut lower: Vec<Arc<PodInfo>> = node.pods.iter().filter(|p| p.priority < pod.priority).cloned().collect();
    if lower.is_empty() {
        return None;
    }
    let mut info = node.clone();
    let mut state = state.clone();
    for v in &lower {
        info.remove_pod(&v.key);
        state.update(pod, v, node, cluster, -1);
    }
    if filter(pod, &info, &state, cluster).is_err() {
        return None;
    }
    lower.sort_by(|a, b| importance(a, b));
    let (violating, other) = split_by_budgets(lower, budgets);
    let mut victims = Vec::new();
    let mut violations = 0;
    for (protected, v) in violating.into_iter().map(|v| (true, v)).chain(other.into_iter().map(|v| (false, v))) {
        info.add_pod(v.clone());
        state.update(pod, &v, node, cluster, 1);
        if filter(pod, &info, &state, cluster).is_err() {
            info.remove_pod(&v.key);
            state.update(pod, &v, node, cluster, -1);
            violations += usize::from(protected);
            victims.push(v);
        }
    }
    victims.sort_by(|a, b| importance(a, b));
    Some((victims, violations))
}

/// Most important first.
fn importance(a: &PodInfo, b: &PodInfo) -> std::cmp::Ordering {
    if a.more_important_than(b) {
        std::cmp::Ordering::Less
    } else if b.more_important_than(a) {
        std::cmp::Ordering::Greater
    } else {
        std::cmp::Ordering::Equal
    }
}

/// The earliest start among the highest-priority victims (None sorts first).
fn earliest_top_start(victims: &[Arc<PodInfo>]) -> Option<DateTime<Utc>> {
    let top = victims.iter().map(|v| v.priority).max()?;
    victims.iter().filter(|v| v.priority == top).map(|v| v.start_time).min().flatten()
}

/// kube's pickOneNodeForPreemption.
fn pick(candidates: Vec<Preemption>) -> Option<Preemption> {
    candidates.into_iter().min_by(|a, b| {
        let highest = |p: &Preemption| p.victims.iter().map(|v| v.priority).max().unwrap_or(i32::MIN);
        let sum =
            |p: &Preemption| p.victims.iter().map(|v| i64::from(v.priority) + i64::from(i32::MAX) + 1).sum::<i64>();
        a.budget_violations
            .cmp(&b.budget_violations)
            .then(highest(a).cmp(&highest(b)))
            .then(sum(a).cmp(&sum(b)))
            .then(a.victims.len().cmp(&b.victims.len()))
            // Later is better: reverse.
            .then(earliest_top_start(&b.victims).cmp(&earliest_top_start(&a.victims)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::schedule;
    use crate::testkit::{must_cluster, must_node, must_pod};
    use serde_json::json;

    fn prio(name: &str, cpu: &str, priority: i32, start: &str) -> Arc<PodInfo> {
        must_pod(name, cpu, "", json!({"spec": {"priority": priority}, "status": {"startTime": start}}))
    }

    const T0: &str = "2026-01-01T00:00:00Z";

    fn preempt_for(pod: &PodInfo, cluster: &Cluster) -> Option<(String, Vec<String>)> {
        let fit = schedule(pod, cluster, &Profile::default(), &mut 0).expect_err("fits nowhere");
        preempt(pod, cluster, &Profile::default(), &fit, &[])
            .map(|p| (p.node, p.victims.iter().map(|v| v.key.name.clone()).collect()))
    }

    #[test]
    fn victims_are_reprieved_most_important_first_and_only_the_rest_are_evicted() {
        let cluster = must_cluster(
            vec![must_node("n1", "1", "8Gi", json!({}))],
            vec![
                (prio("p1", "300m", 1, T0), "n1"),
                (prio("p2", "300m", 2, T0), "n1"),
                (prio("p3", "400m", 3, T0), "n1"),
            ],
        );
        // 500m needed: p3 (400m) is reprieved first, then neither 300m pod fits back.
        let pod = prio("high", "500m", 10, T0);
        assert_eq!(preempt_for(&pod, &cluster), Some(("n1".into(), vec!["p2".into(), "p1".into()])));
        // 300m needed: p3 and p2 return, p1 goes.
        let pod = prio("high", "300m", 10, T0);
        assert_eq!(preempt_for(&pod, &cluster), Some(("n1".into(), vec!["p1".into()])));
    }

    #[test]
    fn the_node_is_chosen_by_kubes_criteria_in_order() {
        let node = |n: &str| must_node(n, "1", "8Gi", json!({}));
        let cases = [
            (
                "lowest highest-victim priority",
                vec![(prio("a1", "500m", 1, T0), "a"), (prio("a2", "500m", 1, T0), "a"), (prio("b1", "1", 5, T0), "b")],
                "a",
            ),
            (
                "smallest priority sum",
                vec![(prio("a1", "500m", 3, T0), "a"), (prio("a2", "500m", 3, T0), "a"), (prio("b1", "1", 3, T0), "b")],
                "b",
            ),
            (
                "latest start of the most important victims",
                vec![
                    (prio("a1", "1", 3, "2026-01-01T00:00:00Z"), "a"),
                    (prio("b1", "1", 3, "2026-01-02T00:00:00Z"), "b"),
                ],
                "b",
            ),
        ];
        for (name, placed, want) in cases {
            let cluster = must_cluster(vec![node("a"), node("b")], placed);
            let got = preempt_for(&prio("high", "1", 10, T0), &cluster).map(|(n, _)| n);
            assert_eq!(got.as_deref(), Some(want), "{name}");
        }
        // The sum counts every victim (priority + 2^31), so fewer victims of equal priority win.
        let cluster = must_cluster(
            vec![node("a"), node("b")],
            vec![(prio("a1", "500m", 0, T0), "a"), (prio("a2", "500m", 0, T0), "a"), (prio("b1", "1", 0, T0), "b")],
        );
        assert_eq!(preempt_for(&prio("high", "1", 10, T0), &cluster).map(|(n, _)| n).as_deref(), Some("b"));
    }

    #[test]
    fn equal_or_higher_priority_pods_are_never_victims() {
        let cluster =
            must_cluster(vec![must_node("n1", "1", "8Gi", json!({}))], vec![(prio("peer", "1", 10, T0), "n1")]);
        assert_eq!(preempt_for(&prio("high", "1", 10, T0), &cluster), None);
    }

    #[test]
    fn a_pod_with_preemption_policy_never_does_not_preempt() {
        let cluster = must_cluster(vec![must_node("n1", "1", "8Gi", json!({}))], vec![(prio("low", "1", 0, T0), "n1")]);
        let pod = must_pod("high", "1", "", json!({"spec": {"priority": 10, "preemptionPolicy": "Never"}}));
        assert_eq!(preempt_for(&pod, &cluster), None);
    }

    #[test]
    fn nodes_ruled_out_for_unresolvable_reasons_are_not_candidates() {
        let cluster = must_cluster(
            vec![must_node("n1", "1", "8Gi", json!({"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}))],
            vec![(prio("low", "1", 0, T0), "n1")],
        );
        assert_eq!(preempt_for(&prio("high", "1", 10, T0), &cluster), None);
    }

    #[test]
    fn evicting_a_pod_the_incoming_pod_shuns_resolves_anti_affinity() {
        let web = must_pod("web", "", "", json!({"metadata": {"labels": {"app": "web"}}, "spec": {"priority": 1}}));
        let cluster = must_cluster(
            vec![must_node("n1", "1", "8Gi", json!({}))],
            vec![(web, "n1"), (prio("other", "100m", 0, T0), "n1")],
        );
        let pod = must_pod(
            "p",
            "",
            "",
            json!({"spec": {"priority": 10, "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}
            ]}}}}),
        );
        assert_eq!(preempt_for(&pod, &cluster), Some(("n1".into(), vec!["web".into()])));
    }

    #[test]
    fn a_pod_whose_earlier_victims_are_still_terminating_waits() {
        let terminating =
            must_pod("old", "1", "", json!({"metadata": {"deletionTimestamp": T0}, "spec": {"priority": 0}}));
        let cluster = must_cluster(vec![must_node("n1", "1", "8Gi", json!({}))], vec![(terminating, "n1")]);
        let pod = must_pod("p", "1", "", json!({"spec": {"priority": 10}, "status": {"nominatedNodeName": "n1"}}));
        assert!(!eligible(&pod, &cluster));
        assert!(eligible(&prio("q", "1", 10, T0), &cluster));
    }

    #[test]
    fn a_failed_preemption_explains_itself_as_kube_does() {
        let cluster = must_cluster(
            vec![
                must_node("n1", "1", "8Gi", json!({})),
                must_node("n2", "1", "8Gi", json!({"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}})),
            ],
            vec![(prio("peer", "1", 10, T0), "n1")],
        );
        let pod = prio("high", "1", 10, T0);
        let mut fit = schedule(&pod, &cluster, &Profile::default(), &mut 0).expect_err("fits nowhere");
        assert!(preempt(&pod, &cluster, &Profile::default(), &fit, &[]).is_none());
        fit.post_filter = Some(failure_message(&fit));
        assert_eq!(
            fit.to_string(),
            "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint {k: }. \
             preemption: 0/2 nodes are available: 1 No preemption victims found for incoming pod, \
             1 Preemption is not helpful for scheduling."
        );
    }

    fn labelled(name: &str, app: &str, priority: i32) -> Arc<PodInfo> {
        must_pod(name, "500m", "", json!({"metadata": {"labels": {"app": app}}, "spec": {"priority": priority}}))
    }

    fn budget(app: &str, allowed: i32, disrupted: &[&str]) -> Budget {
        let disrupted: serde_json::Map<String, serde_json::Value> =
            disrupted.iter().map(|p| (p.to_string(), json!(T0))).collect();
        let pdb: PodDisruptionBudget = serde_json::from_value(json!({
            "metadata": {"name": app, "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": app}}},
            "status": {"disruptionsAllowed": allowed, "disruptedPods": disrupted, "currentHealthy": 0,
                       "desiredHealthy": 0, "expectedPods": 0},
        }))
        .unwrap();
        Budget::new(&pdb).expect("selects pods")
    }

    fn preempt_with(pod: &PodInfo, cluster: &Cluster, budgets: &[Budget]) -> Option<(String, Vec<String>, usize)> {
        let fit = schedule(pod, cluster, &Profile::default(), &mut 0).expect_err("fits nowhere");
        preempt(pod, cluster, &Profile::default(), &fit, budgets)
            .map(|p| (p.node, p.victims.iter().map(|v| v.key.name.clone()).collect(), p.budget_violations))
    }

    #[test]
    fn a_pod_a_budget_protects_is_spared_when_another_victim_will_do() {
        let cluster = must_cluster(
            vec![must_node("n1", "1", "8Gi", json!({}))],
            vec![(labelled("db", "db", 1), "n1"), (labelled("web", "web", 2), "n1")],
        );
        let pod = prio("high", "500m", 10, T0);
        // Without budgets the less important pod goes.
        assert_eq!(preempt_with(&pod, &cluster, &[]), Some(("n1".into(), vec!["db".into()], 0)));
        // A budget with no disruption left spares it; one with room does not.
        assert_eq!(preempt_with(&pod, &cluster, &[budget("db", 0, &[])]), Some(("n1".into(), vec!["web".into()], 0)));
        assert_eq!(preempt_with(&pod, &cluster, &[budget("db", 1, &[])]), Some(("n1".into(), vec!["db".into()], 0)));
        // A pod already charged to its budget costs it nothing more.
        assert_eq!(preempt_with(&pod, &cluster, &[budget("db", 0, &["db"])]).unwrap().1, vec!["db".to_string()]);
        // When every way breaks a budget the pod still preempts, and says so.
        let both = [budget("db", 0, &[]), budget("web", 0, &[])];
        assert_eq!(preempt_with(&pod, &cluster, &both), Some(("n1".into(), vec!["db".into()], 1)));
    }

    #[test]
    fn the_node_that_breaks_fewer_budgets_wins_before_priorities_count() {
        let cluster = must_cluster(
            vec![must_node("a", "500m", "8Gi", json!({})), must_node("b", "500m", "8Gi", json!({}))],
            vec![(labelled("db", "db", 1), "a"), (labelled("web", "web", 5), "b")],
        );
        let pod = prio("high", "500m", 10, T0);
        assert_eq!(preempt_with(&pod, &cluster, &[]).map(|p| p.0).as_deref(), Some("a"));
        let chosen = preempt_with(&pod, &cluster, &[budget("db", 0, &[])]);
        assert_eq!(chosen, Some(("b".into(), vec!["web".into()], 0)));
    }

    #[test]
    fn a_budget_without_a_selector_or_with_an_empty_one_protects_nothing() {
        let pdb = |spec: serde_json::Value| -> PodDisruptionBudget {
            serde_json::from_value(json!({"metadata": {"name": "x", "namespace": "default"}, "spec": spec})).unwrap()
        };
        assert!(Budget::new(&pdb(json!({}))).is_none());
        assert!(Budget::new(&pdb(json!({"selector": {}}))).is_none());
    }
}
