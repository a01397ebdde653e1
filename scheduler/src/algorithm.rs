//! One scheduling decision: filter nodes (starting where the last decision
//! stopped, and only until enough feasible nodes are found), score the
//! feasible ones, pick the best. When no node fits, `FitError` says why,
//! node by node, in kube's words.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::cluster::Cluster;
use crate::filters::{filter, FilterState, Reason};
use crate::framework::{NodeInfo, PodInfo};
use crate::queue::{ClusterEvent, Events};
use crate::scores;
use crate::selector::Narrowing;

/// The weight of every score (kube's defaults); 0 turns a score off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Weights {
    /// Untolerated PreferNoSchedule taints.
    pub taint_toleration: i64,
    /// Preferred node affinity.
    pub node_affinity: i64,
    /// Preferred inter-pod affinity and anti-affinity.
    pub inter_pod_affinity: i64,
    /// ScheduleAnyway topology spread.
    pub pod_topology_spread: i64,
    /// NodeResourcesFit with the seed's LeastRequested formula.
    pub least_allocated: i64,
    /// BalancedResourceAllocation.
    pub balanced_allocation: i64,
    /// Spreading of one Service/ReplicaSet/RC/StatefulSet's pods.
    pub selector_spread: i64,
}

impl Default for Weights {
    fn default() -> Weights {
        Weights {
            taint_toleration: 3,
            node_affinity: 2,
            inter_pod_affinity: 2,
            pod_topology_spread: 2,
            least_allocated: 1,
            balanced_allocation: 1,
            selector_spread: 1,
        }
    }
}

/// A scheduler profile (in the spirit of KubeSchedulerConfiguration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// Pods whose `spec.schedulerName` is this are ours.
    pub scheduler_name: String,
    /// Score weights.
    pub weights: Weights,
    /// Stop filtering once this percentage of the nodes is feasible; 0 is
    /// kube's adaptive value (50 - nodes/125, at least 5), and at least 100
    /// nodes are always looked for.
    pub percentage_of_nodes_to_score: u32,
}

impl Default for Profile {
    fn default() -> Profile {
        Profile {
            scheduler_name: "default-scheduler".into(),
            weights: Weights::default(),
            percentage_of_nodes_to_score: 0,
        }
    }
}

/// kube's minFeasibleNodesToFind.
const MIN_FEASIBLE_NODES_TO_FIND: usize = 100;
/// kube's minFeasibleNodesPercentageToFind.
const MIN_FEASIBLE_PERCENTAGE: usize = 5;

/// How many feasible nodes a decision looks for among `nodes` (kube's numFeasibleNodesToFind).
pub fn feasible_nodes_to_find(percentage: u32, nodes: usize) -> usize {
    if nodes < MIN_FEASIBLE_NODES_TO_FIND || percentage >= 100 {
        return nodes;
    }
    let percentage = match percentage as usize {
        0 => (50usize.saturating_sub(nodes / 125)).max(MIN_FEASIBLE_PERCENTAGE),
        p => p,
    };
    (nodes * percentage / 100).max(MIN_FEASIBLE_NODES_TO_FIND)
}

/// Where a pod goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The chosen node.
    pub node: String,
    /// Nodes filtered.
    pub evaluated: usize,
    /// Nodes that passed every filter (and were scored).
    pub feasible: usize,
}

/// Why a pod fits no node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FitError {
    /// Nodes in the cluster.
    pub nodes: usize,
    /// How many nodes each reason ruled out (a node may count under several).
    pub reasons: BTreeMap<String, usize>,
    /// Nodes that failed only for reasons evicting pods could resolve:
    /// preemption's candidates, by their position in the decision's
    /// `Cluster::nodes`, ascending.
    pub resolvable: Vec<usize>,
    /// What preemption found, appended to the message as kube does.
    pub post_filter: Option<String>,
    /// The cluster events that may remove a reason of a node's: what the
    /// pod waits for in the queue.
    pub helped_by: Events,
    /// The counts while the nodes are walked, by reason: `reasons` once
    /// `finish`ed. A failed decision of a large cluster records thousands
    /// of nodes, mostly for the same few reasons (one per filter at most,
    /// taints aside), and a reason's text is only needed once.
    counted: Vec<(Reason, usize)>,
}

impl FitError {
    fn record(&mut self, position: usize, reasons: &[Reason]) {
        for r in reasons {
            match self.counted.iter_mut().find(|(counted, _)| counted == r) {
                Some((_, n)) => *n += 1,
                None => self.counted.push((r.clone(), 1)),
            }
        }
        if reasons.iter().all(Reason::resolvable) {
            self.resolvable.push(position);
        }
    }

    /// Turns the counts by reason into counts by kube's text for them.
    fn finish(mut self) -> Self {
        for (r, n) in std::mem::take(&mut self.counted) {
            self.helped_by = self.helped_by.union(r.helped_by());
            *self.reasons.entry(r.to_string()).or_default() += n;
        }
        // The walk started anywhere and wrapped around.
        self.resolvable.sort_unstable();
        self
    }
}

impl fmt::Display for FitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0/{} nodes are available", self.nodes)?;
        // kube sorts the "<count> <reason>" strings themselves.
        let mut parts: Vec<String> = self.reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
        parts.sort();
        if !parts.is_empty() {
            write!(f, ": {}", parts.join(", "))?;
        }
        if let Some(post) = &self.post_filter {
            write!(f, ". {post}")?;
        }
        f.write_str(".")
    }
}

impl std::error::Error for FitError {}

/// Decides the node of `pod`. Filters from `*start` on, wrapping, until
/// enough feasible nodes are found, then advances `*start` past the nodes
/// evaluated (kube's nextStartNodeIndex), so consecutive decisions spread
/// their look over the whole cluster. A pod nominated to a node by an
/// earlier preemption goes there if it fits. Ties go to one of the tied
/// nodes at random, as kube-scheduler's selectHost does, so equal nodes
/// share the load rather than the first one taking it.
pub fn schedule(pod: &PodInfo, cluster: &Cluster, profile: &Profile, start: &mut usize) -> Result<Placement, FitError> {
    let nodes = cluster.nodes();
    let mut error = FitError { nodes: nodes.len(), ..FitError::default() };
    if nodes.is_empty() {
        error.helped_by = Events::NONE.with(ClusterEvent::NodeAdded);
        return Err(error);
    }
    if pod.malformed.is_some() {
        error.reasons.insert(Reason::MalformedPod.to_string(), nodes.len());
        return Err(error);
    }
    let state = FilterState::new(pod, cluster);
    let nominated =
        pod.pod.status.as_ref().and_then(|s| s.nominated_node_name.as_deref()).and_then(|n| cluster.node(n));
    if let Some(node) = nominated {
        if filter(pod, node, &state, cluster).is_ok() {
            return Ok(Placement { node: node.name.clone(), evaluated: 1, feasible: 1 });
        }
    }
    let want = feasible_nodes_to_find(profile.percentage_of_nodes_to_score, nodes.len());
    let first = *start % nodes.len();
    let mut feasible: Vec<&NodeInfo> = Vec::with_capacity(want);
    let mut evaluated = 0;
    if let Some(candidates) = candidates(pod, &state, cluster) {
        // The same walk over only the nodes that can pass, from the first
        // one at or after `first`. Nothing is recorded: when none fits,
        // the full walk below says why, node by node.
        let from = candidates.partition_point(|&i| i < first);
        let mut last = first;
        for &i in candidates[from..].iter().chain(&candidates[..from]) {
            evaluated += 1;
            last = i;
            if filter(pod, &nodes[i], &state, cluster).is_ok() {
                feasible.push(&nodes[i]);
                if feasible.len() >= want {
                    break;
                }
            }
        }
        if !feasible.is_empty() {
            *start = (last + 1) % nodes.len();
            return Ok(pick(pod, feasible, evaluated, cluster, &profile.weights));
        }
        evaluated = 0;
    }
    for i in 0..nodes.len() {
        let position = (first + i) % nodes.len();
        let node = &nodes[position];
        evaluated += 1;
        match filter(pod, node, &state, cluster) {
            Ok(()) => {
                feasible.push(node);
                if feasible.len() >= want {
                    break;
                }
            }
            Err(reasons) => error.record(position, &reasons),
        }
    }
    *start = (first + evaluated) % nodes.len();
    if feasible.is_empty() {
        return Err(error.finish());
    }
    Ok(pick(pod, feasible, evaluated, cluster, &profile.weights))
}

/// Scores the feasible nodes and picks the best.
fn pick(pod: &PodInfo, feasible: Vec<&NodeInfo>, evaluated: usize, cluster: &Cluster, weights: &Weights) -> Placement {
    let best = if feasible.len() == 1 {
        0
    } else {
        best_node(&score(pod, &feasible, cluster, weights), &mut rand::thread_rng())
    };
    Placement { node: feasible[best].name.clone(), evaluated, feasible: feasible.len() }
}

/// The nodes that can pass the filters, in order, when the pod's own
/// constraints narrow them to at most half the cluster (the node-label
/// index answers): the nodes with the rarest of its nodeSelector labels,
/// those its required node affinity's `In` requirements name, or those in
/// the domains its required pod affinity wants, whichever are fewest. None
/// when every node must be looked at. A superset: the filters still run
/// on each.
fn candidates(pod: &PodInfo, state: &FilterState, cluster: &Cluster) -> Option<Vec<usize>> {
    // Narrowing to most of the cluster saves less than it costs.
    let limit = cluster.node_count() / 2;
    let labelled = |key: &str, value: &str| cluster.nodes_labelled(key, value).into_iter().flatten().copied();
    let by_selector = pod
        .node_selector
        .iter()
        .map(|(k, v)| cluster.nodes_labelled(k, v))
        .min_by_key(|set| set.map_or(0, BTreeSet::len))
        .filter(|set| set.map_or(0, BTreeSet::len) <= limit)
        .map(|set| set.into_iter().flatten().copied().collect::<Vec<_>>());
    let by_node_affinity = pod.required_node_affinity.as_ref().and_then(|t| t.narrowing()).and_then(|terms| {
        let mut nodes = Vec::new();
        for term in terms {
            match term {
                Narrowing::Names(names) => nodes.extend(names.iter().filter_map(|n| cluster.position(n))),
                Narrowing::Labels { key, values } => nodes.extend(values.iter().flat_map(|v| labelled(key, v))),
                Narrowing::Nothing => {}
            }
            if nodes.len() > limit {
                return None;
            }
        }
        nodes.sort_unstable();
        nodes.dedup();
        Some(nodes)
    });
    let by_affinity =
        state.affinity.as_ref().and_then(|a| a.wanted_domains(pod, cluster)).and_then(|(key, domains)| {
            let sets: Vec<&BTreeSet<usize>> =
                domains.into_iter().filter_map(|v| cluster.nodes_labelled(key, v)).collect();
            if sets.iter().map(|s| s.len()).sum::<usize>() > limit {
                return None;
            }
            let mut nodes: Vec<usize> = sets.into_iter().flatten().copied().collect();
            nodes.sort_unstable();
            Some(nodes)
        });
    [by_selector, by_node_affinity, by_affinity].into_iter().flatten().min_by_key(Vec::len)
}

/// The index of the highest total; among equal highest totals each is
/// as likely (reservoir sampling: the k-th tie replaces the pick with
/// probability 1/k).
fn best_node(totals: &[i64], rng: &mut impl rand::Rng) -> usize {
    let mut best = 0;
    let mut ties = 1;
    for (i, t) in totals.iter().enumerate().skip(1) {
        if *t > totals[best] {
            best = i;
            ties = 1;
        } else if *t == totals[best] {
            ties += 1;
            if rng.gen_range(0..ties) == 0 {
                best = i;
            }
        }
    }
    best
}

/// The weighted sum of every score, per node.
pub fn score(pod: &PodInfo, nodes: &[&NodeInfo], cluster: &Cluster, weights: &Weights) -> Vec<i64> {
    let mut totals = vec![0i64; nodes.len()];
    let mut add = |weight: i64, scores: Vec<i64>| {
        for (t, s) in totals.iter_mut().zip(scores) {
            *t += weight * s;
        }
    };
    if weights.least_allocated != 0 {
        add(weights.least_allocated, nodes.iter().map(|n| scores::least_allocated(pod, n)).collect());
    }
    if weights.balanced_allocation != 0 {
        add(weights.balanced_allocation, nodes.iter().map(|n| scores::balanced_allocation(pod, n)).collect());
    }
    if weights.node_affinity != 0 && !pod.preferred_node_affinity.is_empty() {
        add(weights.node_affinity, scores::node_affinity(pod, nodes));
    }
    if weights.taint_toleration != 0 {
        add(weights.taint_toleration, scores::taint_toleration(pod, nodes));
    }
    if weights.inter_pod_affinity != 0 && scores::inter_pod_affinity_applies(pod, cluster) {
        add(weights.inter_pod_affinity, scores::inter_pod_affinity(pod, nodes, cluster));
    }
    if weights.pod_topology_spread != 0 && pod.spread_constraints.iter().any(|c| !c.hard) {
        add(weights.pod_topology_spread, scores::topology_spread(pod, nodes, cluster));
    }
    if weights.selector_spread != 0 {
        add(weights.selector_spread, scores::selector_spread(pod, nodes, cluster));
    }
    totals
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{must_cluster, must_node, must_pod};
    use serde_json::json;

    #[test]
    fn the_number_of_nodes_to_find_follows_kubes_adaptive_percentage() {
        let cases = [
            (0, 50, 50),
            (0, 100, 100),
            (0, 1000, 420),
            (0, 1500, 570),
            (0, 5000, 500),
            (0, 6000, 300),
            (10, 5000, 500),
            (100, 5000, 5000),
            (1, 5000, 100),
        ];
        for (percentage, nodes, want) in cases {
            assert_eq!(feasible_nodes_to_find(percentage, nodes), want, "{percentage}% of {nodes}");
        }
    }

    #[test]
    fn a_pod_that_fits_nowhere_gets_kubes_message_with_reasons_counted_and_sorted() {
        let cluster = must_cluster(
            vec![
                must_node("small", "1", "1Gi", json!({"metadata": {"labels": {"disk": "ssd"}}})),
                must_node("hdd1", "8", "8Gi", json!({"metadata": {"labels": {"disk": "hdd"}}})),
                must_node("hdd2", "8", "8Gi", json!({"metadata": {"labels": {"disk": "hdd"}}})),
            ],
            vec![],
        );
        let pod = must_pod("p", "2", "1Mi", json!({"spec": {"nodeSelector": {"disk": "ssd"}}}));
        let err = schedule(&pod, &cluster, &Profile::default(), &mut 0).expect_err("fits nowhere");
        assert_eq!(
            err.to_string(),
            "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) didn't match Pod's node affinity/selector."
        );
        let resolvable: Vec<&str> = err.resolvable.iter().map(|&i| cluster.nodes()[i].name.as_str()).collect();
        assert_eq!(resolvable, ["small"], "only the cpu shortage can be preempted away");
        use ClusterEvent::*;
        assert_eq!(
            err.helped_by,
            Events::NONE.with(NodeAdded).with(NodeChanged).with(PodDeleted),
            "room freed, or a node joined or relabelled; a pod bound or relabelled does not help"
        );
        let empty = Cluster::new();
        let err = schedule(&pod, &empty, &Profile::default(), &mut 0).expect_err("no nodes");
        assert_eq!(err.to_string(), "0/0 nodes are available.");
        assert_eq!(err.helped_by, Events::NONE.with(NodeAdded));
    }

    #[test]
    fn the_least_requested_feasible_node_wins() {
        let busy = must_pod("busy", "3", "1Gi", json!({}));
        let cluster = must_cluster(
            vec![
                must_node("busy", "4", "8Gi", json!({})),
                must_node("idle", "4", "8Gi", json!({})),
                must_node("tiny", "100m", "8Gi", json!({})),
            ],
            vec![(busy, "busy")],
        );
        let placement =
            schedule(&must_pod("p", "500m", "1Gi", json!({})), &cluster, &Profile::default(), &mut 0).expect("fits");
        assert_eq!(placement, Placement { node: "idle".into(), evaluated: 3, feasible: 2 });
    }

    #[test]
    fn ties_are_broken_evenly_at_random_and_never_for_a_lower_total() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let totals = [5, 7, 7, 3, 7];
        let mut picks = [0usize; 5];
        for _ in 0..3000 {
            picks[best_node(&totals, &mut rng)] += 1;
        }
        assert_eq!((picks[0], picks[3]), (0, 0), "{picks:?}");
        for tied in [1, 2, 4] {
            assert!((800..1200).contains(&picks[tied]), "each tie about a third: {picks:?}");
        }
        assert_eq!(best_node(&[1, 9, 2], &mut rng), 1);
    }

    #[test]
    fn a_large_cluster_is_filtered_only_until_enough_nodes_fit_and_the_next_search_starts_after() {
        let nodes: Vec<_> = (0..400).map(|i| must_node(&format!("n{i:03}"), "4", "8Gi", json!({}))).collect();
        let cluster = must_cluster(nodes, vec![]);
        let profile = Profile { percentage_of_nodes_to_score: 30, ..Profile::default() };
        let mut start = 0;
        let first = schedule(&must_pod("p", "1", "1Gi", json!({})), &cluster, &profile, &mut start).expect("fits");
        assert_eq!((first.evaluated, first.feasible, start), (120, 120, 120));
        let second = schedule(&must_pod("q", "1", "1Gi", json!({})), &cluster, &profile, &mut start).expect("fits");
        let picked: usize = second.node[1..].parse().unwrap();
        assert!((120..240).contains(&picked), "the second search looked at n120..n239 only: {}", second.node);
        assert_eq!(start, 240);
        schedule(&must_pod("r", "1", "1Gi", json!({})), &cluster, &profile, &mut start).expect("fits");
        schedule(&must_pod("s", "1", "1Gi", json!({})), &cluster, &profile, &mut start).expect("fits");
        assert_eq!(start, 80, "the start wraps around");
    }

    #[test]
    fn a_pod_that_names_its_nodes_is_filtered_on_those_alone() {
        let nodes = (0..400)
            .map(|i| {
                let zone = format!("z{}", i % 10);
                must_node(&format!("n{i:03}"), "4", "8Gi", json!({"metadata": {"labels": {"zone": zone}}}))
            })
            .collect();
        let anchor = must_pod("anchor", "", "", json!({"metadata": {"labels": {"team": "a"}}}));
        let cluster = must_cluster(nodes, vec![(anchor, "n007")]);
        let in_zone = |p: &Placement, zone: usize| p.node[1..].parse::<usize>().expect("n<i>") % 10 == zone;
        let mut start = 0;

        let selected = must_pod("s", "1", "1Gi", json!({"spec": {"nodeSelector": {"zone": "z3"}}}));
        let placed = schedule(&selected, &cluster, &Profile::default(), &mut start).expect("fits");
        assert!(in_zone(&placed, 3), "{placed:?}");
        assert_eq!((placed.evaluated, placed.feasible), (40, 40), "only zone z3's nodes were filtered");

        let required = |terms: serde_json::Value| json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}}});
        let zones = must_pod(
            "z",
            "1",
            "1Gi",
            required(json!([{"matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["z1", "z2"]},
                {"key": "zone", "operator": "NotIn", "values": ["z2"]}
            ]}])),
        );
        let placed = schedule(&zones, &cluster, &Profile::default(), &mut start).expect("fits");
        assert!(in_zone(&placed, 1), "{placed:?}");
        assert_eq!((placed.evaluated, placed.feasible), (80, 40), "zones z1 and z2 were filtered, z2 failed");
        let named = must_pod(
            "n",
            "1",
            "1Gi",
            required(json!([
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n005", "n404"]}]},
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z9"]}]}
            ])),
        );
        let placed = schedule(&named, &cluster, &Profile::default(), &mut start).expect("fits");
        assert!(placed.node == "n005" || in_zone(&placed, 9), "{placed:?}");
        assert_eq!((placed.evaluated, placed.feasible), (41, 41), "n005 and zone z9");

        let drawn = must_pod(
            "d",
            "1",
            "1Gi",
            json!({"metadata": {"labels": {"team": "a"}}, "spec": {"affinity": {"podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchLabels": {"team": "a"}}, "topologyKey": "zone"}]
            }}}}),
        );
        let placed = schedule(&drawn, &cluster, &Profile::default(), &mut start).expect("fits");
        assert!(in_zone(&placed, 7), "drawn to the anchor's zone: {placed:?}");
        assert_eq!((placed.evaluated, placed.feasible), (40, 40), "only zone z7's nodes were filtered");

        // When none of them fits, the message counts every node, as before.
        let big = must_pod("big", "5", "1Gi", json!({"spec": {"nodeSelector": {"zone": "z3"}}}));
        let err = schedule(&big, &cluster, &Profile::default(), &mut start).expect_err("too big");
        assert_eq!(
            err.to_string(),
            "0/400 nodes are available: 360 node(s) didn't match Pod's node affinity/selector, 40 Insufficient cpu."
        );
        assert_eq!(err.resolvable.len(), 40);
    }

    #[test]
    fn a_nominated_node_is_taken_when_the_pod_fits_there() {
        let cluster =
            must_cluster(vec![must_node("a", "4", "8Gi", json!({})), must_node("b", "4", "8Gi", json!({}))], vec![]);
        let pod = must_pod("p", "1", "1Gi", json!({"status": {"nominatedNodeName": "b"}}));
        assert_eq!(schedule(&pod, &cluster, &Profile::default(), &mut 0).expect("fits").node, "b");
    }

    #[test]
    fn a_node_with_malformed_capacity_is_skipped_with_a_reason() {
        let cluster = must_cluster(
            vec![must_node("bad", "lots", "8Gi", json!({})), must_node("good", "1", "8Gi", json!({}))],
            vec![],
        );
        assert!(cluster.node("bad").expect("node").malformed.is_some());
        let pod = must_pod("p", "100m", "", json!({}));
        assert_eq!(schedule(&pod, &cluster, &Profile::default(), &mut 0).expect("fits").node, "good");
        let big = must_pod("big", "2", "", json!({}));
        assert_eq!(
            schedule(&big, &cluster, &Profile::default(), &mut 0).expect_err("too big").to_string(),
            "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) had malformed capacity."
        );
        let malformed = must_pod("m", "a lot", "", json!({}));
        assert_eq!(
            schedule(&malformed, &cluster, &Profile::default(), &mut 0).expect_err("malformed").to_string(),
            "0/2 nodes are available: 2 pod has malformed resource requests."
        );
    }

    #[test]
    fn weights_decide_between_scores() {
        // "ssd" is busier but preferred by node affinity.
        let busy = must_pod("busy", "2", "4Gi", json!({}));
        let cluster = must_cluster(
            vec![
                must_node("ssd", "4", "8Gi", json!({"metadata": {"labels": {"disk": "ssd"}}})),
                must_node("hdd", "4", "8Gi", json!({})),
            ],
            vec![(busy, "ssd")],
        );
        let pod = must_pod(
            "p",
            "1",
            "1Gi",
            json!({"spec": {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}
            ]}}}}),
        );
        assert_eq!(schedule(&pod, &cluster, &Profile::default(), &mut 0).expect("fits").node, "ssd");
        let no_affinity = Profile { weights: Weights { node_affinity: 0, ..Weights::default() }, ..Profile::default() };
        assert_eq!(schedule(&pod, &cluster, &no_affinity, &mut 0).expect("fits").node, "hdd");
    }

    #[test]
    fn consecutive_decisions_see_the_pods_placed_between_them() {
        let nodes = (0..3).map(|i| must_node(&format!("n{i}"), "4", "8Gi", json!({}))).collect();
        let mut cluster = must_cluster(nodes, vec![]);
        let shy = |i: usize| {
            must_pod(
                &format!("shy-{i}"),
                "100m",
                "",
                json!({"metadata": {"labels": {"app": "shy"}}, "spec": {"affinity": {"podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchLabels": {"app": "shy"}}, "topologyKey": "kubernetes.io/hostname"}]
                }}}}),
            )
        };
        let mut start = 0;
        let mut used = BTreeSet::new();
        for i in 0..3 {
            let pod = shy(i);
            let placement = schedule(&pod, &cluster, &Profile::default(), &mut start).expect("a free node");
            assert!(used.insert(placement.node.clone()), "{} placed twice on {}", pod.key, placement.node);
            cluster.add_pod(crate::testkit::must_place(&pod, &placement.node));
        }
        let err = schedule(&shy(3), &cluster, &Profile::default(), &mut start).expect_err("every node taken");
        assert_eq!(err.to_string(), "0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules.");
        assert_eq!(err.resolvable.len(), 3, "evicting the shy pod would help");
        let gone =
            cluster.remove_pod(&skiff_client::runtime::reflector::ObjectKey::new("default", "shy-1")).expect("placed");
        let placement = schedule(&shy(4), &cluster, &Profile::default(), &mut start).expect("freed");
        assert_eq!(Some(placement.node.as_str()), gone.node_name());
    }
}
