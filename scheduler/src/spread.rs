//! What topology spread counts, as questions the cluster answers from
//! counts it keeps current. For each constraint a decision asks: how many
//! pods of the pod's namespace matching the constraint's selector, not
//! terminating, sit in each domain of its topology key, over the nodes
//! the constraint counts (kube's node inclusion policies). kube's
//! PodTopologySpread walks every node's pods to answer that at every
//! decision; with 5,000 nodes and thousands of matching pods the walk was
//! 60% of the scheduler's CPU in `make bench-scheduler`'s spread workload
//! (profiled with perf), so the answers are cached in the `Cluster` and
//! updated by every pod it places or removes.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use k8s_openapi::api::core::v1::Toleration;

use crate::filters::{node_matches_selectors, untolerated_taint};
use crate::framework::{NodeInfo, PodInfo, SpreadConstraint};
use crate::selector::{NodeSelectorTerms, Selector};

/// Which nodes count for a spread constraint of a pod.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRule {
    /// Labels a node must carry: the topology keys of every constraint
    /// of the pod of the same kind (DoNotSchedule or ScheduleAnyway).
    keys: Vec<String>,
    /// nodeAffinityPolicy Honor: the pod's nodeSelector and required node affinity.
    affinity: Option<(BTreeMap<String, String>, Option<NodeSelectorTerms>)>,
    /// nodeTaintsPolicy Honor: the pod's tolerations.
    tolerations: Option<Vec<Toleration>>,
}

// Tolerations are compared field by field, so equal rules are equal values.
impl Eq for NodeRule {}

impl Hash for NodeRule {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.keys.hash(state);
        self.affinity.hash(state);
        self.tolerations.is_some().hash(state);
        for t in self.tolerations.iter().flatten() {
            (&t.key, &t.operator, &t.value, &t.effect, t.toleration_seconds).hash(state);
        }
    }
}

impl NodeRule {
    /// The nodes `constraint` of `pod` counts.
    pub fn new(pod: &PodInfo, constraint: &SpreadConstraint) -> NodeRule {
        let mut keys: Vec<String> = pod
            .spread_constraints
            .iter()
            .filter(|c| c.hard == constraint.hard)
            .map(|c| c.topology_key.clone())
            .collect();
        keys.sort_unstable();
        keys.dedup();
        NodeRule {
            keys,
            affinity: constraint
                .honor_node_affinity
                .then(|| (pod.node_selector.clone(), pod.required_node_affinity.clone())),
            tolerations: constraint.honor_taints.then(|| pod.tolerations.clone()),
        }
    }

    /// Whether `node` counts.
    pub fn admits(&self, node: &NodeInfo) -> bool {
        let labels = node.labels();
        self.keys.iter().all(|k| labels.contains_key(k))
            && self
                .affinity
                .as_ref()
                .is_none_or(|(selector, required)| node_matches_selectors(selector, required.as_ref(), node))
            && self.tolerations.as_ref().is_none_or(|t| untolerated_taint(&node.taints, t).is_none())
    }
}

/// One spread constraint's question: matching pods per domain of
/// `topology_key`, on the nodes `nodes` admits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SpreadQuery {
    /// The pod's namespace: only its pods count.
    pub namespace: String,
    /// The constraint's selector, matchLabelKeys merged in.
    pub selector: Selector,
    /// The node label whose values are the domains.
    pub topology_key: String,
    /// The nodes that count.
    pub nodes: NodeRule,
}

impl SpreadQuery {
    /// The question `constraint` of `pod` asks.
    pub fn new(pod: &PodInfo, constraint: &SpreadConstraint) -> SpreadQuery {
        SpreadQuery {
            namespace: pod.key.namespace.clone(),
            selector: constraint.selector.clone(),
            topology_key: constraint.topology_key.clone(),
            nodes: NodeRule::new(pod, constraint),
        }
    }

    /// Whether `other` counts, wherever it is placed.
    pub fn counts_pod(&self, other: &PodInfo) -> bool {
        other.key.namespace == self.namespace && !other.terminating && self.selector.matches(other.labels())
    }

    /// The domain `other`, placed on `node`, counts in, if it counts.
    pub fn domain_of<'a>(&self, other: &PodInfo, node: &'a NodeInfo) -> Option<&'a String> {
        let value = node.labels().get(&self.topology_key)?;
        (self.counts_pod(other) && self.nodes.admits(node)).then_some(value)
    }
}
