//! Scores: each ranks the feasible nodes 0..=100 after normalizing as
//! kube normalizes it; the decision adds them up, weighted. Each function
//! takes the pod and the feasible nodes and returns one normalized score
//! per node, in order.

use std::collections::HashMap;
use std::sync::Arc;

use crate::cluster::{Cluster, DomainCounts};
use crate::filters::tolerates;
use crate::framework::{NodeInfo, PodInfo};
use crate::spread::SpreadQuery;

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

/// The cpu (millicores) and memory (bytes) a node would carry with the
/// pod, as scoring counts them.
fn requested_with(pod: &PodInfo, node: &NodeInfo) -> (i64, i64) {
    (
        node.non_zero_requested.milli_cpu + pod.non_zero_requests.milli_cpu,
        node.non_zero_requested.memory + pod.non_zero_requests.memory,
    )
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
    let (cpu, memory) = requested_with(pod, node);
    (free(cpu, node.allocatable.milli_cpu) + free(memory, node.allocatable.memory)) / 2
}

/// BalancedResourceAllocation: nodes whose cpu and memory would be used
/// in equal fractions score higher, `(1 - |cpu - memory| / 2) * 100`.
pub fn balanced_allocation(pod: &PodInfo, node: &NodeInfo) -> i64 {
    let (cpu, memory) = requested_with(pod, node);
    let fraction =
        |requested: i64, capacity: i64| (capacity > 0).then(|| (requested as f64 / capacity as f64).min(1.0));
    let std = match (fraction(cpu, node.allocatable.milli_cpu), fraction(memory, node.allocatable.memory)) {
        (Some(a), Some(b)) => (a - b).abs() / 2.0,
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
            pod.preferred_node_affinity
                .iter()
                .filter(|(_, t)| t.matches(labels, &n.name))
                .map(|(w, _)| i64::from(*w))
                .sum()
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
    // (topology key, weight, pods per domain): a node scores the weighted
    // counts of its domains, looked up per node rather than spread over
    // every domain.
    let mut weighted: Vec<(&str, i64, Arc<DomainCounts>)> = Vec::new();
    let incoming = pod.preferred_affinity.iter().map(|(w, t)| (i64::from(*w), t));
    let incoming = incoming.chain(pod.preferred_anti_affinity.iter().map(|(w, t)| (-i64::from(*w), t)));
    for (weight, term) in incoming {
        let counts = cluster.match_counts(&term.namespaces, &term.selector, &term.topology_key);
        weighted.push((&term.topology_key, weight, counts.domains.clone()));
    }
    for ((term, weight), counts) in &cluster.terms.preferred {
        if cluster.term_matches(term, pod) {
            weighted.push((&term.topology_key, *weight, counts.clone()));
        }
    }
    for (term, counts) in &cluster.terms.required_affinity {
        if cluster.term_matches(term, pod) {
            weighted.push((&term.topology_key, HARD_POD_AFFINITY_WEIGHT, counts.clone()));
        }
    }
    let raw: Vec<i64> = nodes
        .iter()
        .map(|n| {
            let labels = n.labels();
            weighted
                .iter()
                .filter_map(|(key, weight, counts)| labels.get(*key).and_then(|v| counts.get(v)).map(|c| weight * c))
                .sum()
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
        // The domains of the nodes being scored, with the cluster's counts.
        let counts = cluster.spread_counts(&SpreadQuery::new(pod, c));
        let mut domains: HashMap<&str, i64> = HashMap::new();
        for (n, _) in nodes.iter().zip(&ignored).filter(|(_, ignored)| !**ignored) {
            if let Some(v) = n.labels().get(&c.topology_key) {
                domains.insert(v, counts.get(v).copied().unwrap_or(0));
            }
        }
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
            let mut score =
                if max_node > 0 { MAX_SCORE as f64 * (max_node - c) as f64 / max_node as f64 } else { 100.0 };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{must_cluster, must_node, must_node_info, must_pod};
    use serde_json::json;

    #[test]
    fn least_requested_follows_the_seeds_formula_on_worked_examples() {
        // (allocatable cpu, memory; placed pod cpu, memory; incoming cpu, memory; score)
        let cases = [
            // cpu (4000-3000)*100/4000 = 25, memory (10000-5000)*100/10000 = 50, mean 37.
            ("4", "10000", None, ("3", "5000"), 37),
            // 50 and 50.
            ("6", "10000", None, ("3", "5000"), 50),
            // Placed pods count: cpu (4000-3000)/4000 = 25, memory (10000-8000)/10000 = 20, mean 22.
            ("4", "10000", Some(("1", "3000")), ("2", "5000"), 22),
            // Requests beyond capacity score 0 for that resource: cpu 0, memory 50.
            ("4", "10000", Some(("4", "0")), ("1", "5000"), 25),
            // An empty node and a pod asking nothing: 100m and 200Mi count.
            ("1", "2000Mi", None, ("", ""), 90),
        ];
        for (i, (cpu, memory, placed, (pod_cpu, pod_memory), want)) in cases.into_iter().enumerate() {
            let placed: Vec<_> = placed.into_iter().map(|(c, m)| must_pod("placed", c, m, json!({}))).collect();
            let node = must_node_info(must_node("n", cpu, memory, json!({})), &placed);
            assert_eq!(least_allocated(&must_pod("p", pod_cpu, pod_memory, json!({})), &node), want, "case {i}");
        }
    }

    #[test]
    fn balanced_allocation_prefers_equal_cpu_and_memory_fractions() {
        let cases = [
            // 0.75 and 0.5: 100 * (1 - 0.125) = 87.
            ("4", "10000", ("3", "5000"), 87),
            ("6", "10000", ("3", "5000"), 100),
            // 1.0 and 0.0: 50.
            ("1", "1000000000", ("1", "1"), 50),
        ];
        for (cpu, memory, (pc, pm), want) in cases {
            let node = must_node_info(must_node("n", cpu, memory, json!({})), &[]);
            assert_eq!(balanced_allocation(&must_pod("p", pc, pm, json!({})), &node), want, "{cpu} {memory}");
        }
    }

    #[test]
    fn preferred_node_affinity_scores_summed_weights_scaled_to_the_best() {
        let nodes = [
            must_node_info(
                must_node("both", "1", "1Gi", json!({"metadata": {"labels": {"zone": "a", "disk": "ssd"}}})),
                &[],
            ),
            must_node_info(must_node("zone", "1", "1Gi", json!({"metadata": {"labels": {"zone": "a"}}})), &[]),
            must_node_info(must_node("none", "1", "1Gi", json!({})), &[]),
        ];
        let term = |w: i32, k: &str, v: &str| json!({"weight": w, "preference": {"matchExpressions": [{"key": k, "operator": "In", "values": [v]}]}});
        let pod = must_pod(
            "p",
            "",
            "",
            json!({"spec": {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term(2, "zone", "a"), term(3, "disk", "ssd")]}}}}),
        );
        let refs: Vec<&NodeInfo> = nodes.iter().collect();
        assert_eq!(node_affinity(&pod, &refs), vec![100, 40, 0]);
    }

    #[test]
    fn taint_toleration_scores_fewer_untolerated_prefer_no_schedule_taints_higher() {
        let taints = |list: serde_json::Value| {
            must_node_info(must_node("n", "1", "1Gi", json!({"spec": {"taints": list}})), &[])
        };
        let nodes = [
            taints(json!([])),
            taints(json!([{"key": "a", "effect": "PreferNoSchedule"}])),
            taints(json!([{"key": "a", "effect": "PreferNoSchedule"}, {"key": "b", "effect": "PreferNoSchedule"}])),
            taints(json!([{"key": "c", "effect": "PreferNoSchedule"}])),
        ];
        let refs: Vec<&NodeInfo> = nodes.iter().collect();
        let pod = must_pod(
            "p",
            "",
            "",
            json!({"spec": {"tolerations": [{"key": "c", "operator": "Exists", "effect": "PreferNoSchedule"}]}}),
        );
        assert_eq!(taint_toleration(&pod, &refs), vec![100, 50, 0, 100]);
        let nodes = [taints(json!([]))];
        assert_eq!(taint_toleration(&pod, &[&nodes[0]]), vec![100], "no taints anywhere: every node scores 100");
    }

    fn zoned(name: &str, zone: &str) -> std::sync::Arc<k8s_openapi::api::core::v1::Node> {
        must_node(name, "4", "8Gi", json!({"metadata": {"labels": {"zone": zone}}}))
    }

    #[test]
    fn preferred_inter_pod_affinity_scores_domains_with_wanted_pods_and_without_shunned_ones() {
        let cache = must_pod("cache", "", "", json!({"metadata": {"labels": {"app": "cache"}}}));
        let noisy = must_pod("noisy", "", "", json!({"metadata": {"labels": {"app": "noisy"}}}));
        let cluster = must_cluster(
            vec![zoned("a1", "a"), zoned("b1", "b"), zoned("c1", "c")],
            vec![(cache, "a1"), (noisy, "b1")],
        );
        let term = |w: i32, app: &str| json!({"weight": w, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": "zone"}});
        let pod = must_pod(
            "p",
            "",
            "",
            json!({"spec": {"affinity": {
                "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term(10, "cache")]},
                "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term(5, "noisy")]}
            }}}),
        );
        let nodes: Vec<&NodeInfo> = cluster.nodes().iter().collect();
        // Raw: a 10, b -5, c 0; min-max normalized.
        assert_eq!(inter_pod_affinity(&pod, &nodes, &cluster), vec![100, 0, 33]);
        // A placed pod preferring the incoming one draws it too.
        let fan = must_pod(
            "fan",
            "",
            "",
            json!({"spec": {"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term(7, "web")]}}}}),
        );
        let cluster = must_cluster(vec![zoned("a1", "a"), zoned("b1", "b")], vec![(fan, "b1")]);
        let web = must_pod("web", "", "", json!({"metadata": {"labels": {"app": "web"}}}));
        let nodes: Vec<&NodeInfo> = cluster.nodes().iter().collect();
        assert_eq!(inter_pod_affinity(&web, &nodes, &cluster), vec![0, 100]);
    }

    #[test]
    fn schedule_anyway_spread_scores_emptier_domains_higher() {
        let web = |i: usize| must_pod(&format!("web-{i}"), "", "", json!({"metadata": {"labels": {"app": "web"}}}));
        let cluster = must_cluster(
            vec![zoned("a1", "a"), zoned("b1", "b"), zoned("c1", "c"), must_node("x", "4", "8Gi", json!({}))],
            vec![(web(0), "a1"), (web(1), "a1"), (web(2), "b1")],
        );
        let pod = must_pod(
            "p",
            "",
            "",
            json!({"metadata": {"labels": {"app": "web"}}, "spec": {"topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"app": "web"}}}
            ]}}),
        );
        let nodes: Vec<&NodeInfo> = cluster.nodes().iter().collect();
        // weight ln(3 + 2) = 1.609: raw a 3, b 2, c 0; score 100 * (3 + 0 - s) / 3; x lacks the key.
        assert_eq!(topology_spread(&pod, &nodes, &cluster), vec![0, 33, 100, 0]);
    }

    #[test]
    fn selector_spreading_scores_nodes_with_fewer_pods_of_the_same_service_higher() {
        let web = |i: usize| must_pod(&format!("web-{i}"), "", "", json!({"metadata": {"labels": {"app": "web"}}}));
        let other = must_pod("db", "", "", json!({"metadata": {"labels": {"app": "db"}}}));
        let plain = |n: &str| must_node(n, "4", "8Gi", json!({}));
        let mut cluster = must_cluster(
            vec![plain("n1"), plain("n2"), plain("n3")],
            vec![(web(0), "n1"), (web(1), "n1"), (web(2), "n2"), (other, "n3")],
        );
        let nodes: Vec<&NodeInfo> = cluster.nodes().iter().collect();
        assert_eq!(selector_spread(&web(9), &nodes, &cluster), vec![100, 100, 100], "no selector: no preference");
        cluster.set_spreading_selector(
            "default",
            "Service/web",
            Some(crate::selector::Selector::from_labels(&[("app".to_string(), "web".to_string())].into())),
        );
        let nodes: Vec<&NodeInfo> = cluster.nodes().iter().collect();
        assert_eq!(selector_spread(&web(9), &nodes, &cluster), vec![0, 50, 100]);
        // With zones, two thirds come from the zone: z1 = n1 + n2 (3 pods), z2 = n3 (0).
        let zoned_node = |n: &str, z: &str| {
            must_node(n, "4", "8Gi", json!({"metadata": {"labels": {"topology.kubernetes.io/zone": z}}}))
        };
        let mut cluster = must_cluster(
            vec![zoned_node("n1", "z1"), zoned_node("n2", "z1"), zoned_node("n3", "z2")],
            vec![(web(0), "n1"), (web(1), "n1"), (web(2), "n2")],
        );
        cluster.set_spreading_selector(
            "default",
            "Service/web",
            Some(crate::selector::Selector::from_labels(&[("app".to_string(), "web".to_string())].into())),
        );
        let nodes: Vec<&NodeInfo> = cluster.nodes().iter().collect();
        // n2: node 50, zone 0 -> 16; n3: 100 and 100.
        assert_eq!(selector_spread(&web(9), &nodes, &cluster), vec![0, 16, 100]);
    }

    #[test]
    fn default_normalization_scales_by_the_largest_and_can_reverse() {
        let cases: [(&[i64], bool, &[i64]); 4] = [
            (&[1, 2, 4], false, &[25, 50, 100]),
            (&[1, 2, 4], true, &[75, 50, 0]),
            (&[0, 0], false, &[0, 0]),
            (&[0, 0], true, &[100, 100]),
        ];
        for (input, reverse, want) in cases {
            let mut s = input.to_vec();
            normalize(&mut s, reverse);
            assert_eq!(s, want, "{input:?} reverse {reverse}");
        }
    }
}
