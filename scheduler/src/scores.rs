//! Scores: each ranks the feasible nodes 0..=100 after normalizing as
//! kube normalizes it; the decision adds them up, weighted. Each function
//! takes the pod and the feasible nodes and returns one normalized score
//! per node, in order.

use std::collections::HashMap;

use crate::cluster::Cluster;
use crate::filters::{spread_counts_node, spread_counts_pod, tolerates, PairCounts};
use crate::framework::{NodeInfo, PodInfo};
use crate::resources::Resources;

/// The highest score a node can get from one score.
pub const MAX_SCORE: i64 = 100;

/// kube's DefaultNormalizeScore: scale to 0..=100 by the largest score,
/// reversed (`100 - s`) when lower is better. All zero stays zero
/// (reversed: all 100).
pub fn normalize(scores: &mut [i64], reverse: bool) {
    let max = scores.iter().copied().max().unwrap_or(0);
    for s in scores.iter_mut() {
        let scaled = if max == 0 { 0 } else { *s * MAX_SCORE / max };
        *s = if reverse { MAX_SCORE - scaled } else { scaled };
    }
}

/// The requests a node would carry with the pod, as scoring counts them.
fn requested_with(pod: &PodInfo, node: &NodeInfo) -> Resources {
    let mut r = node.non_zero_requested.clone();
    r.milli_cpu += pod.non_zero_requests.milli_cpu;
    r.memory += pod.non_zero_requests.memory;
    r
}

/// The seed's LeastRequestedPriority: per resource
/// `(capacity - requested) * 100 / capacity` (0 when requested exceeds
/// capacity), averaged over cpu and memory; requests counted with the pod
/// and kube's non-zero defaults.
pub fn least_allocated(pod: &PodInfo, node: &NodeInfo) -> i64 {
    let free = |requested: i64, capacity: i64| {
        if capacity == 0 || requested > capacity {
            0
        } else {
            (capacity - requested) * MAX_SCORE / capacity
        }
    };
    let r = requested_with(pod, node);
    (free(r.milli_cpu, node.allocatable.milli_cpu) + free(r.memory, node.allocatable.memory)) / 2
}

/// BalancedResourceAllocation: nodes whose cpu and memory would be used
/// in equal fractions score higher, `(1 - |cpu - memory| / 2) * 100`.
pub fn balanced_allocation(pod: &PodInfo, node: &NodeInfo) -> i64 {
    let r = requested_with(pod, node);
    let fraction = |requested: i64, capacity: i64| {
        (capacity > 0).then(|| (requested as f64 / capacity as f64).min(1.0))
    };
    let fractions: Vec<f64> = [fraction(r.milli_cpu, node.allocatable.milli_cpu), fraction(r.memory, node.allocatable.memory)]
        .into_iter()
        .flatten()
        .collect();
    let std = match fractions.as_slice() {
        [a, b] => (a - b).abs() / 2.0,
        _ => 0.0,
    };
    ((1.0 - std) * MAX_SCORE as f64) as i64
}

/// NodeAffinity: the summed weights of the preferred terms the node
/// matches, normalized by the best node.
pub fn node_affinity(pod: &PodInfo, nodes: &[&NodeInfo]) -> Vec<i64> {
    let mut scores: Vec<i64> = nodes
        .iter()
        .map(|n| {
            let labels = n.labels();
            pod.preferred_node_affinity.iter().filter(|(_, t)| t.matches(labels, &n.name)).map(|(w, _)| i64::from(*w)).sum()
        })
        .collect();
    normalize(&mut scores, false);
    scores
}

/// TaintToleration: fewer untolerated PreferNoSchedule taints score higher.
pub fn taint_toleration(pod: &PodInfo, nodes: &[&NodeInfo]) -> Vec<i64> {
    let tolerations: Vec<_> = pod
        .tolerations
        .iter()
        .filter(|t| t.effect.as_deref().is_none_or(|e| e.is_empty() || e == "PreferNoSchedule"))
        .collect();
    let mut scores: Vec<i64> = nodes
        .iter()
        .map(|n| {
            n.taints
                .iter()
                .filter(|t| t.effect == "PreferNoSchedule" && !tolerations.iter().any(|tol| tolerates(tol, t)))
                .count() as i64
        })
        .collect();
    normalize(&mut scores, true);
    scores
}

/// kube's hardPodAffinityWeight: how much a placed pod's required
/// affinity to the incoming pod counts in scoring.
pub const HARD_POD_AFFINITY_WEIGHT: i64 = 1;

/// Whether inter-pod affinity scoring has anything to do for `pod`.
pub fn inter_pod_affinity_applies(pod: &PodInfo, cluster: &Cluster) -> bool {
    !pod.preferred_affinity.is_empty()
        || !pod.preferred_anti_affinity.is_empty()
        || !cluster.terms.preferred.is_empty()
        || !cluster.terms.required_affinity.is_empty()
}

/// InterPodAffinity: per domain, + weight for every pod the incoming pod
/// prefers and every placed pod preferring it (or requiring it, with
/// kube's hard weight), - weight for anti-affinity; a node scores its
/// domains' sum, min-max normalized over the nodes.
pub fn inter_pod_affinity(pod: &PodInfo, nodes: &[&NodeInfo], cluster: &Cluster) -> Vec<i64> {
    let mut domains = PairCounts::new();
    let mut add = |key: &str, value: &str, amount: i64| {
        *domains.entry(key.to_string()).or_default().entry(value.to_string()).or_default() += amount;
    };
    let incoming = pod.preferred_affinity.iter().map(|(w, t)| (i64::from(*w), t));
    let incoming = incoming.chain(pod.preferred_anti_affinity.iter().map(|(w, t)| (-i64::from(*w), t)));
    for (weight, term) in incoming {
        cluster.for_each_match(&term.namespaces, &term.selector, |_, node| {
            if let Some(v) = node.labels().get(&term.topology_key) {
                add(&term.topology_key, v, weight);
            }
        });
    }
    for ((term, weight), counts) in &cluster.terms.preferred {
        if cluster.term_matches(term, pod) {
            for (v, n) in counts {
                add(&term.topology_key, v, weight * n);
            }
        }
    }
    for (term, counts) in &cluster.terms.required_affinity {
        if cluster.term_matches(term, pod) {
            for (v, n) in counts {
                add(&term.topology_key, v, HARD_POD_AFFINITY_WEIGHT * n);
            }
        }
    }
    let raw: Vec<i64> = nodes
        .iter()
        .map(|n| {
            let labels = n.labels();
            domains.iter().filter_map(|(key, values)| labels.get(key).and_then(|v| values.get(v))).sum()
        })
        .collect();
    let (min, max) = (raw.iter().copied().min().unwrap_or(0), raw.iter().copied().max().unwrap_or(0));
    raw.iter().map(|s| if max > min { MAX_SCORE * (s - min) / (max - min) } else { 0 }).collect()
}

/// PodTopologySpread for ScheduleAnyway constraints: fewer matching pods
/// in the node's domains score higher, each constraint weighted by
/// ln(domains + 2); nodes lacking a topology key score 0. kube's system
/// default constraints (for pods without any) are not applied: selector
/// spreading plays that part here.
pub fn topology_spread(pod: &PodInfo, nodes: &[&NodeInfo], cluster: &Cluster) -> Vec<i64> {
    let soft: Vec<_> = pod.spread_constraints.iter().filter(|c| !c.hard).collect();
    if soft.is_empty() {
        return vec![0; nodes.len()];
    }
    let ignored: Vec<bool> =
        nodes.iter().map(|n| soft.iter().any(|c| !n.labels().contains_key(&c.topology_key))).collect();
    let mut raw = vec![0f64; nodes.len()];
    for c in &soft {
        let mut domains: HashMap<&str, i64> = HashMap::new();
        for (n, _) in nodes.iter().zip(&ignored).filter(|(_, ignored)| !**ignored) {
            if let Some(v) = n.labels().get(&c.topology_key) {
                domains.insert(v, 0);
            }
        }
        let namespaces = crate::framework::Namespaces { names: [pod.key.namespace.clone()].into(), selector: None };
        cluster.for_each_match(&namespaces, &c.selector, |other, node| {
            if let Some(n) = node.labels().get(&c.topology_key).and_then(|v| domains.get_mut(v.as_str())) {
                if spread_counts_pod(pod, c, other) && spread_counts_node(pod, c, node, false) {
                    *n += 1;
                }
            }
        });
        let weight = ((domains.len() + 2) as f64).ln();
        for (i, n) in nodes.iter().enumerate() {
            if let Some(count) = n.labels().get(&c.topology_key).and_then(|v| domains.get(v.as_str())) {
                raw[i] += *count as f64 * weight + f64::from(c.max_skew - 1);
            }
        }
    }
    let raw: Vec<i64> = raw.iter().map(|s| s.round() as i64).collect();
    let kept = raw.iter().zip(&ignored).filter(|(_, i)| !**i).map(|(s, _)| *s);
    let (min, max) = (kept.clone().min().unwrap_or(0), kept.max().unwrap_or(0));
    raw.iter()
        .zip(&ignored)
        .map(|(s, ignored)| match (ignored, max) {
            (true, _) => 0,
            (false, 0) => MAX_SCORE,
            (false, _) => MAX_SCORE * (max + min - s) / max,
        })
        .collect()
}

/// The zone of a node, as kube's GetZoneKey builds it from region and zone labels.
fn zone_of(node: &NodeInfo) -> Option<String> {
    let labels = node.labels();
    let get = |a: &str, b: &str| labels.get(a).or_else(|| labels.get(b)).map(String::as_str).unwrap_or("");
    let region = get("topology.kubernetes.io/region", "failure-domain.beta.kubernetes.io/region");
    let zone = get("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone");
    (!region.is_empty() || !zone.is_empty()).then(|| format!("{region}:\x00:{zone}"))
}

/// SelectorSpread (the seed's SelectorSpreadPriority): fewer pods of the
/// same Service/ReplicaSet/RC/StatefulSet on a node score higher; with
/// zones, two thirds of the score come from the zone's count.
pub fn selector_spread(pod: &PodInfo, nodes: &[&NodeInfo], cluster: &Cluster) -> Vec<i64> {
    let selectors = cluster.spreading_selectors(pod);
    if selectors.is_empty() {
        return vec![MAX_SCORE; nodes.len()];
    }
    let counts: Vec<i64> = nodes
        .iter()
        .map(|n| {
            n.pods
                .iter()
                .filter(|p| {
                    p.key.namespace == pod.key.namespace
                        && !p.terminating
                        && selectors.iter().all(|s| s.matches(p.labels()))
                })
                .count() as i64
        })
        .collect();
    let zones: Vec<Option<String>> = nodes.iter().map(|n| zone_of(n)).collect();
    let mut by_zone: HashMap<&str, i64> = HashMap::new();
    for (z, c) in zones.iter().zip(&counts) {
        if let Some(z) = z {
            *by_zone.entry(z).or_default() += c;
        }
    }
    let max_node = counts.iter().copied().max().unwrap_or(0);
    let max_zone = by_zone.values().copied().max().unwrap_or(0);
    counts
        .iter()
        .zip(&zones)
        .map(|(c, z)| {
            let mut score = if max_node > 0 { MAX_SCORE as f64 * (max_node - c) as f64 / max_node as f64 } else { 100.0 };
            if let Some(z) = z {
                let zone_score = if max_zone > 0 {
                    MAX_SCORE as f64 * (max_zone - by_zone[z.as_str()]) as f64 / max_zone as f64
                } else {
                    100.0
                };
                score = score / 3.0 + zone_score * 2.0 / 3.0;
            }
            score as i64
        })
        .collect()
}
