//! Filters: each rules a node out for a pod, with kube's reason. Most read
//! only the pod and the node; inter-pod affinity and topology spread read
//! state computed once per decision from the cluster's indexes
//! (`AffinityState`, `SpreadState`), which preemption adjusts for victims.

use std::collections::HashMap;
use std::fmt;

use k8s_openapi::api::core::v1::{Taint, Toleration};

use crate::cluster::{Cluster, DomainCounts};
use crate::framework::{Namespaces, NodeInfo, PodInfo, SpreadConstraint};

/// Why a node cannot take a pod. The Display text is kube's.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// The node is cordoned.
    Unschedulable,
    /// `spec.nodeName` names another node.
    NodeName,
    /// A NoSchedule/NoExecute taint the pod does not tolerate.
    UntoleratedTaint {
        /// The taint's key.
        key: String,
        /// The taint's value ("" when none).
        value: String,
    },
    /// nodeSelector or required node affinity.
    NodeAffinity,
    /// A host port is taken.
    Ports,
    /// Not enough of a resource.
    Insufficient(String),
    /// No room for another pod.
    TooManyPods,
    /// A disk the pod needs is attached read-write to another pod here.
    DiskConflict,
    /// Required pod affinity is not met.
    PodAffinity,
    /// The pod's required anti-affinity is violated.
    PodAntiAffinity,
    /// A placed pod's required anti-affinity rejects this pod.
    ExistingPodsAntiAffinity,
    /// The node lacks a spread constraint's topology label.
    SpreadMissingLabel,
    /// Placing the pod here would exceed a spread constraint's maxSkew.
    SpreadSkew,
    /// The node's capacity does not parse.
    MalformedNode,
    /// The pod's requests do not parse.
    MalformedPod,
}

impl Reason {
    /// Whether evicting pods could remove this reason (kube's Unschedulable
    /// as opposed to UnschedulableAndUnresolvable): preemption only looks at
    /// nodes that failed for such reasons alone.
    pub fn resolvable(&self) -> bool {
        matches!(
            self,
            Reason::Ports
                | Reason::Insufficient(_)
                | Reason::TooManyPods
                | Reason::DiskConflict
                | Reason::PodAntiAffinity
                | Reason::ExistingPodsAntiAffinity
                | Reason::SpreadSkew
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Unschedulable => f.write_str("node(s) were unschedulable"),
            Reason::NodeName => f.write_str("node(s) didn't match the requested node name"),
            Reason::UntoleratedTaint { key, value } => write!(f, "node(s) had untolerated taint {{{key}: {value}}}"),
            Reason::NodeAffinity => f.write_str("node(s) didn't match Pod's node affinity/selector"),
            Reason::Ports => f.write_str("node(s) didn't have free ports for the requested pod ports"),
            Reason::Insufficient(resource) => write!(f, "Insufficient {resource}"),
            Reason::TooManyPods => f.write_str("Too many pods"),
            Reason::DiskConflict => f.write_str("node(s) had no available disk"),
            Reason::PodAffinity => f.write_str("node(s) didn't match pod affinity rules"),
            Reason::PodAntiAffinity => f.write_str("node(s) didn't match pod anti-affinity rules"),
            Reason::ExistingPodsAntiAffinity => f.write_str("node(s) didn't satisfy existing pods anti-affinity rules"),
            Reason::SpreadMissingLabel => {
                f.write_str("node(s) didn't match pod topology spread constraints (missing required label)")
            }
            Reason::SpreadSkew => f.write_str("node(s) didn't match pod topology spread constraints"),
            Reason::MalformedNode => f.write_str("node(s) had malformed capacity"),
            Reason::MalformedPod => f.write_str("pod has malformed resource requests"),
        }
    }
}

/// Whether `toleration` tolerates `taint` (kube's ToleratesTaint).
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = toleration.effect.as_deref().filter(|e| !e.is_empty()) {
        if effect != taint.effect {
            return false;
        }
    }
    let key = toleration.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => !key.is_empty() && toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        _ => false,
    }
}

/// The first NoSchedule/NoExecute taint of `taints` that `tolerations` leave untolerated.
pub fn untolerated_taint<'a>(taints: &'a [Taint], tolerations: &[Toleration]) -> Option<&'a Taint> {
    taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .find(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
}

/// A cordoned node takes only pods tolerating `node.kubernetes.io/unschedulable:NoSchedule`.
pub fn node_unschedulable(pod: &PodInfo, node: &NodeInfo) -> Result<(), Reason> {
    if !node.unschedulable {
        return Ok(());
    }
    let taint = Taint { key: "node.kubernetes.io/unschedulable".into(), effect: "NoSchedule".into(), ..Taint::default() };
    if pod.tolerations.iter().any(|t| tolerates(t, &taint)) {
        Ok(())
    } else {
        Err(Reason::Unschedulable)
    }
}

/// The seed's PodFitsHost: a pod naming a node fits only there.
pub fn node_name(pod: &PodInfo, node: &NodeInfo) -> Result<(), Reason> {
    match pod.node_name() {
        Some(name) if name != node.name => Err(Reason::NodeName),
        _ => Ok(()),
    }
}

/// NoSchedule and NoExecute taints must be tolerated.
pub fn taint_toleration(pod: &PodInfo, node: &NodeInfo) -> Result<(), Reason> {
    match untolerated_taint(&node.taints, &pod.tolerations) {
        Some(t) => Err(Reason::UntoleratedTaint { key: t.key.clone(), value: t.value.clone().unwrap_or_default() }),
        None => Ok(()),
    }
}

/// Whether the node matches the pod's nodeSelector and required node affinity.
pub fn matches_node_affinity(pod: &PodInfo, node: &NodeInfo) -> bool {
    let labels = node.labels();
    pod.node_selector.iter().all(|(k, v)| labels.get(k) == Some(v))
        && pod.required_node_affinity.as_ref().is_none_or(|a| a.matches(labels, &node.name))
}

/// The seed's PodSelectorMatches, with required node affinity.
pub fn node_affinity(pod: &PodInfo, node: &NodeInfo) -> Result<(), Reason> {
    if matches_node_affinity(pod, node) {
        Ok(())
    } else {
        Err(Reason::NodeAffinity)
    }
}

/// The seed's PodFitsPorts: no host port (protocol, ip, port) taken twice.
pub fn host_ports(pod: &PodInfo, node: &NodeInfo) -> Result<(), Reason> {
    if pod.host_ports.iter().any(|p| node.used_ports.iter().any(|u| u.conflicts(p))) {
        Err(Reason::Ports)
    } else {
        Ok(())
    }
}

/// The seed's PodFitsResources: every requested resource fits in what is
/// allocatable minus what placed pods request; one reason per resource short.
pub fn resources_fit(pod: &PodInfo, node: &NodeInfo) -> Result<(), Vec<Reason>> {
    let mut reasons = Vec::new();
    if node.pods.len() as i64 + 1 > node.allocatable.pods {
        reasons.push(Reason::TooManyPods);
    }
    let (want, used, have) = (&pod.requests, &node.requested, &node.allocatable);
    let short = |want: i64, used: i64, have: i64| want > 0 && want.saturating_add(used) > have;
    if short(want.milli_cpu, used.milli_cpu, have.milli_cpu) {
        reasons.push(Reason::Insufficient("cpu".into()));
    }
    if short(want.memory, used.memory, have.memory) {
        reasons.push(Reason::Insufficient("memory".into()));
    }
    if short(want.ephemeral_storage, used.ephemeral_storage, have.ephemeral_storage) {
        reasons.push(Reason::Insufficient("ephemeral-storage".into()));
    }
    for (name, amount) in &want.scalar {
        let used = used.scalar.get(name).copied().unwrap_or(0);
        if short(*amount, used, have.scalar.get(name).copied().unwrap_or(0)) {
            reasons.push(Reason::Insufficient(name.clone()));
        }
    }
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(reasons)
    }
}

/// The seed's NoDiskConflict: a GCE PD, RBD image or iSCSI target used
/// read-write, or any AWS EBS volume, is attached to one pod per node.
pub fn no_disk_conflict(pod: &PodInfo, node: &NodeInfo) -> Result<(), Reason> {
    if pod.disks.is_empty() {
        return Ok(());
    }
    let conflict = node.pods.iter().any(|p| p.disks.iter().any(|d| pod.disks.iter().any(|mine| mine.conflicts(d))));
    if conflict {
        Err(Reason::DiskConflict)
    } else {
        Ok(())
    }
}

/// Matching pods per topology key, then per value.
pub(crate) type PairCounts = HashMap<String, DomainCounts>;

fn pair_count(counts: &PairCounts, key: &str, value: &str) -> i64 {
    counts.get(key).and_then(|d| d.get(value)).copied().unwrap_or(0)
}

fn pair_add(counts: &mut PairCounts, key: &str, value: &str, delta: i64) {
    let n = counts.entry(key.to_string()).or_default().entry(value.to_string()).or_default();
    *n += delta;
}

/// What required inter-pod affinity reads, computed once per decision:
/// where the pods the incoming pod wants (or shuns) are, and where placed
/// pods' anti-affinity shuns it.
#[derive(Debug, Clone, Default)]
pub struct AffinityState {
    /// Pods matching all of the incoming pod's required affinity terms, counted per term's domain.
    affinity: PairCounts,
    /// How many placed pods match all of the incoming pod's required affinity terms.
    affinity_pods: i64,
    /// Pods matching one of the incoming pod's required anti-affinity terms, per domain.
    anti: PairCounts,
    /// Placed pods whose required anti-affinity matches the incoming pod, per domain.
    existing_anti: PairCounts,
}

impl AffinityState {
    /// Reads the cluster's indexes for `pod`.
    pub fn new(pod: &PodInfo, cluster: &Cluster) -> AffinityState {
        let mut state = AffinityState::default();
        for (term, domains) in &cluster.terms.required_anti {
            if cluster.term_matches(term, pod) {
                for (value, n) in domains {
                    pair_add(&mut state.existing_anti, &term.topology_key, value, *n);
                }
            }
        }
        if let Some(first) = pod.required_affinity.first() {
            cluster.for_each_match(&first.namespaces, &first.selector, |other, node| {
                state.update_affinity(pod, other, node, cluster, 1);
            });
        }
        for term in &pod.required_anti_affinity {
            cluster.for_each_match(&term.namespaces, &term.selector, |_, node| {
                if let Some(v) = node.labels().get(&term.topology_key) {
                    pair_add(&mut state.anti, &term.topology_key, v, 1);
                }
            });
        }
        state
    }

    fn update_affinity(&mut self, pod: &PodInfo, other: &PodInfo, node: &NodeInfo, cluster: &Cluster, delta: i64) {
        if pod.required_affinity.iter().all(|t| cluster.term_matches(t, other)) {
            self.affinity_pods += delta;
            for t in &pod.required_affinity {
                if let Some(v) = node.labels().get(&t.topology_key) {
                    pair_add(&mut self.affinity, &t.topology_key, v, delta);
                }
            }
        }
    }

    /// Counts `other`, placed on `node`, as gone (`delta` -1, a preemption
    /// victim) or back (`delta` 1, reprieved).
    pub fn update(&mut self, pod: &PodInfo, other: &PodInfo, node: &NodeInfo, cluster: &Cluster, delta: i64) {
        self.update_affinity(pod, other, node, cluster, delta);
        let labels = node.labels();
        for t in &pod.required_anti_affinity {
            if let Some(v) = labels.get(&t.topology_key) {
                if cluster.term_matches(t, other) {
                    pair_add(&mut self.anti, &t.topology_key, v, delta);
                }
            }
        }
        for t in &other.required_anti_affinity {
            if let Some(v) = labels.get(&t.topology_key) {
                if cluster.term_matches(t, pod) {
                    pair_add(&mut self.existing_anti, &t.topology_key, v, delta);
                }
            }
        }
    }
}

/// Required inter-pod affinity and anti-affinity, both ways.
pub fn inter_pod_affinity(pod: &PodInfo, node: &NodeInfo, state: &AffinityState, cluster: &Cluster) -> Result<(), Reason> {
    let labels = node.labels();
    let mut pods_exist = true;
    for t in &pod.required_affinity {
        match labels.get(&t.topology_key) {
            Some(v) => pods_exist &= pair_count(&state.affinity, &t.topology_key, v) > 0,
            None => return Err(Reason::PodAffinity),
        }
    }
    // The first pod of a group with affinity to itself may go anywhere
    // its topology keys exist, or it would wait forever.
    if !pods_exist && !(state.affinity_pods <= 0 && pod.required_affinity.iter().all(|t| cluster.term_matches(t, pod))) {
        return Err(Reason::PodAffinity);
    }
    for t in &pod.required_anti_affinity {
        if labels.get(&t.topology_key).is_some_and(|v| pair_count(&state.anti, &t.topology_key, v) > 0) {
            return Err(Reason::PodAntiAffinity);
        }
    }
    for (key, domains) in &state.existing_anti {
        if labels.get(key).is_some_and(|v| domains.get(v).is_some_and(|n| *n > 0)) {
            return Err(Reason::ExistingPodsAntiAffinity);
        }
    }
    Ok(())
}

/// Whether `node` counts for a spread constraint of `pod`: it has every
/// hard constraint's topology key and passes the constraint's node
/// inclusion policies.
pub(crate) fn spread_counts_node(pod: &PodInfo, constraint: &SpreadConstraint, node: &NodeInfo, hard: bool) -> bool {
    let labels = node.labels();
    pod.spread_constraints.iter().filter(|c| c.hard == hard).all(|c| labels.contains_key(&c.topology_key))
        && (!constraint.honor_node_affinity || matches_node_affinity(pod, node))
        && (!constraint.honor_taints || untolerated_taint(&node.taints, &pod.tolerations).is_none())
}

/// Whether `other` counts for a spread constraint of `pod`.
pub(crate) fn spread_counts_pod(pod: &PodInfo, constraint: &SpreadConstraint, other: &PodInfo) -> bool {
    other.key.namespace == pod.key.namespace && !other.terminating && constraint.selector.matches(other.labels())
}

/// What hard topology spread reads, computed once per decision: matching
/// pods per domain of every DoNotSchedule constraint, and each minimum.
#[derive(Debug, Clone, Default)]
pub struct SpreadState {
    /// Per hard constraint (in the pod's order): matching pods per domain; every eligible domain is present.
    counts: Vec<DomainCounts>,
    /// Per hard constraint: the least count over its domains.
    min: Vec<i64>,
}

impl SpreadState {
    /// Counts matching pods per domain over every eligible node.
    pub fn new(pod: &PodInfo, cluster: &Cluster) -> SpreadState {
        let mut state = SpreadState::default();
        for c in pod.spread_constraints.iter().filter(|c| c.hard) {
            let mut counts = DomainCounts::new();
            for node in cluster.nodes() {
                if let Some(v) = node.labels().get(&c.topology_key) {
                    if !counts.contains_key(v) && spread_counts_node(pod, c, node, true) {
                        counts.insert(v.clone(), 0);
                    }
                }
            }
            let namespaces = Namespaces { names: [pod.key.namespace.clone()].into(), selector: None };
            cluster.for_each_match(&namespaces, &c.selector, |other, node| {
                if let Some(n) = node.labels().get(&c.topology_key).and_then(|v| counts.get_mut(v)) {
                    if !other.terminating && spread_counts_node(pod, c, node, true) {
                        *n += 1;
                    }
                }
            });
            state.min.push(counts.values().copied().min().unwrap_or(0));
            state.counts.push(counts);
        }
        state
    }

    /// Counts `other`, placed on `node`, as gone (-1) or back (+1).
    pub fn update(&mut self, pod: &PodInfo, other: &PodInfo, node: &NodeInfo, delta: i64) {
        for (i, c) in pod.spread_constraints.iter().filter(|c| c.hard).enumerate() {
            if !spread_counts_pod(pod, c, other) || !spread_counts_node(pod, c, node, true) {
                continue;
            }
            if let Some(n) = node.labels().get(&c.topology_key).and_then(|v| self.counts[i].get_mut(v)) {
                *n += delta;
                self.min[i] = self.counts[i].values().copied().min().unwrap_or(0);
            }
        }
    }
}

/// DoNotSchedule topology spread constraints: the node must have each
/// topology key, and taking the pod must keep its domain within maxSkew
/// of the least-loaded domain.
pub fn topology_spread(pod: &PodInfo, node: &NodeInfo, state: &SpreadState) -> Result<(), Reason> {
    let labels = node.labels();
    for (i, c) in pod.spread_constraints.iter().filter(|c| c.hard).enumerate() {
        let Some(value) = labels.get(&c.topology_key) else { return Err(Reason::SpreadMissingLabel) };
        let counts = &state.counts[i];
        let min = if (counts.len() as i64) < i64::from(c.min_domains) { 0 } else { state.min[i] };
        let self_match = i64::from(c.selector.matches(pod.labels()));
        let skew = counts.get(value).copied().unwrap_or(0) + self_match - min;
        if skew > i64::from(c.max_skew) {
            return Err(Reason::SpreadSkew);
        }
    }
    Ok(())
}

/// Per-decision state of the filters that read the whole cluster.
#[derive(Debug, Clone, Default)]
pub struct FilterState {
    /// Inter-pod affinity, when the pod or a placed pod has required terms.
    pub affinity: Option<AffinityState>,
    /// Hard topology spread, when the pod has DoNotSchedule constraints.
    pub spread: Option<SpreadState>,
}

impl FilterState {
    /// Computes what `pod`'s decision needs, skipping what it does not.
    pub fn new(pod: &PodInfo, cluster: &Cluster) -> FilterState {
        let affinity_needed = !pod.required_affinity.is_empty()
            || !pod.required_anti_affinity.is_empty()
            || !cluster.terms.required_anti.is_empty();
        FilterState {
            affinity: affinity_needed.then(|| AffinityState::new(pod, cluster)),
            spread: pod.spread_constraints.iter().any(|c| c.hard).then(|| SpreadState::new(pod, cluster)),
        }
    }

    /// Counts `other`, placed on `node`, as gone (-1) or back (+1).
    pub fn update(&mut self, pod: &PodInfo, other: &PodInfo, node: &NodeInfo, cluster: &Cluster, delta: i64) {
        if let Some(a) = self.affinity.as_mut() {
            a.update(pod, other, node, cluster, delta);
        }
        if let Some(s) = self.spread.as_mut() {
            s.update(pod, other, node, delta);
        }
    }
}

/// Runs every filter in kube's order, stopping at the first that fails
/// (resources fit may give several reasons).
pub fn filter(pod: &PodInfo, node: &NodeInfo, state: &FilterState, cluster: &Cluster) -> Result<(), Vec<Reason>> {
    if node.malformed.is_some() {
        return Err(vec![Reason::MalformedNode]);
    }
    let one = |r: Result<(), Reason>| r.map_err(|r| vec![r]);
    one(node_unschedulable(pod, node))?;
    one(node_name(pod, node))?;
    one(taint_toleration(pod, node))?;
    one(node_affinity(pod, node))?;
    one(host_ports(pod, node))?;
    resources_fit(pod, node)?;
    one(no_disk_conflict(pod, node))?;
    if let Some(s) = &state.spread {
        one(topology_spread(pod, node, s))?;
    }
    if let Some(a) = &state.affinity {
        one(inter_pod_affinity(pod, node, a, cluster))?;
    }
    Ok(())
}
