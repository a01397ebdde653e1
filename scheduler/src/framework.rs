//! What a decision reads, computed once: `PodInfo` for a pod (its requests,
//! ports, parsed affinity, tolerations and spread constraints) and
//! `NodeInfo` for a node (allocatable, the sums of its pods' requests, the
//! ports they use).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Node, Pod, PodAffinityTerm, Taint, Toleration, TopologySpreadConstraint};
use skiff_client::runtime::reflector::ObjectKey;

use crate::resources::{node_allocatable, pod_requests, Resources};
use crate::selector::{NodeSelectorTerms, NodeTerm, Operator, Requirement, Selector, NO_LABELS};

/// A host port a container asks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPort {
    /// `hostIP`, "0.0.0.0" when unset (every address).
    pub ip: String,
    /// TCP, UDP or SCTP.
    pub protocol: String,
    /// The port on the host.
    pub port: i32,
}

impl HostPort {
    /// Whether two pods asking for these ports cannot share a node.
    pub fn conflicts(&self, other: &HostPort) -> bool {
        self.port == other.port
            && self.protocol == other.protocol
            && (self.ip == other.ip || self.ip == "0.0.0.0" || other.ip == "0.0.0.0")
    }
}

/// A network disk that a node can attach read-write to one pod only
/// (kube's VolumeRestrictions / the seed's NoDiskConflict).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disk {
    /// A GCE persistent disk by name.
    GcePd {
        /// `pdName`.
        name: String,
        /// Mounted read-only.
        read_only: bool,
    },
    /// An AWS EBS volume by id (conflicts even read-only).
    AwsEbs {
        /// `volumeID`.
        volume_id: String,
    },
    /// A Ceph RBD image.
    Rbd {
        /// Ceph monitors; sharing one means the same cluster.
        monitors: Vec<String>,
        /// The pool ("rbd" by default).
        pool: String,
        /// The image.
        image: String,
        /// Mounted read-only.
        read_only: bool,
    },
    /// An iSCSI target.
    Iscsi {
        /// The target's IQN.
        iqn: String,
        /// Mounted read-only.
        read_only: bool,
    },
}

impl Disk {
    /// Whether two pods using these disks cannot share a node.
    pub fn conflicts(&self, other: &Disk) -> bool {
        match (self, other) {
            (Disk::GcePd { name: a, read_only: ra }, Disk::GcePd { name: b, read_only: rb }) => a == b && !(*ra && *rb),
            (Disk::AwsEbs { volume_id: a }, Disk::AwsEbs { volume_id: b }) => a == b,
            (Disk::Iscsi { iqn: a, read_only: ra }, Disk::Iscsi { iqn: b, read_only: rb }) => a == b && !(*ra && *rb),
            (
                Disk::Rbd { monitors: ma, pool: pa, image: ia, read_only: ra },
                Disk::Rbd { monitors: mb, pool: pb, image: ib, read_only: rb },
            ) => ma.iter().any(|m| mb.contains(m)) && pa == pb && ia == ib && !(*ra && *rb),
            _ => false,
        }
    }
}

/// Which namespaces an affinity term looks at.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Namespaces {
    /// Named namespaces; the pod's own when neither names nor a selector are given.
    pub names: BTreeSet<String>,
    /// `namespaceSelector`: `{}` selects every namespace; otherwise it is
    /// matched against namespace labels the cluster was told about.
    pub selector: Option<Selector>,
}

/// A pod (anti-)affinity term, resolved against its pod (namespaces,
/// matchLabelKeys). Equal terms of many pods share one index entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AffinityTerm {
    /// The namespaces whose pods count.
    pub namespaces: Namespaces,
    /// The pods that count; a term without labelSelector matches none.
    pub selector: Selector,
    /// The node label whose values are the domains.
    pub topology_key: String,
}

impl AffinityTerm {
    fn new(term: &PodAffinityTerm, namespace: &str, labels: &BTreeMap<String, String>) -> AffinityTerm {
        let mut selector = term.label_selector.as_ref().map_or_else(Selector::nothing, Selector::from_label_selector);
        if term.label_selector.is_some() {
            for (keys, operator) in
                [(&term.match_label_keys, Operator::In), (&term.mismatch_label_keys, Operator::NotIn)]
            {
                for key in keys.iter().flatten() {
                    if let Some(value) = labels.get(key) {
                        selector =
                            selector.with(Requirement { key: key.clone(), operator, values: vec![value.clone()] });
                    }
                }
            }
        }
        let mut names: BTreeSet<String> = term.namespaces.iter().flatten().cloned().collect();
        let ns_selector = term.namespace_selector.as_ref().map(Selector::from_label_selector);
        if names.is_empty() && ns_selector.is_none() {
            names.insert(namespace.to_string());
        }
        AffinityTerm {
            namespaces: Namespaces { names, selector: ns_selector },
            selector,
            topology_key: term.topology_key.clone(),
        }
    }

    /// Whether `pod` counts for this term; `namespace_labels` looks up a
    /// namespace's labels for a namespaceSelector.
    pub fn matches<'a>(
        &self,
        pod: &PodInfo,
        namespace_labels: impl Fn(&str) -> Option<&'a BTreeMap<String, String>>,
    ) -> bool {
        let ns = &pod.key.namespace;
        let in_namespace = self.namespaces.names.contains(ns)
            || self.namespaces.selector.as_ref().is_some_and(|s| s.matches(namespace_labels(ns).unwrap_or(&NO_LABELS)));
        in_namespace && self.selector.matches(pod.labels())
    }
}

/// A topology spread constraint, resolved against its pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpreadConstraint {
    /// The largest allowed difference between a domain's matching pods and the least.
    pub max_skew: i32,
    /// The node label whose values are the domains.
    pub topology_key: String,
    /// Pods of the pod's namespace that count (matchLabelKeys merged in).
    pub selector: Selector,
    /// Below this many domains the global minimum counts as 0.
    pub min_domains: i32,
    /// nodeAffinityPolicy Honor (the default): only nodes matching the pod's node affinity/selector count.
    pub honor_node_affinity: bool,
    /// nodeTaintsPolicy Honor (default Ignore): only nodes whose taints the pod tolerates count.
    pub honor_taints: bool,
    /// DoNotSchedule (a filter) rather than ScheduleAnyway (a score).
    pub hard: bool,
}

/// A pod, with everything a decision reads from it computed once.
#[derive(Debug, Clone)]
pub struct PodInfo {
    /// The pod as the informer saw it.
    pub pod: Arc<Pod>,
    /// namespace/name.
    pub key: ObjectKey,
    /// What filtering counts: max(containers + sidecars, init containers) + overhead.
    pub requests: Resources,
    /// What scoring counts: as `requests`, with 100m cpu / 200Mi memory for containers that ask for none.
    pub non_zero_requests: Resources,
    /// `spec.priority` (resolved at admission), 0 when unset.
    pub priority: i32,
    /// Host ports of containers and sidecars.
    pub host_ports: Vec<HostPort>,
    /// `spec.nodeSelector`.
    pub node_selector: BTreeMap<String, String>,
    /// Required node affinity.
    pub required_node_affinity: Option<NodeSelectorTerms>,
    /// Preferred node affinity: (weight, term).
    pub preferred_node_affinity: Vec<(i32, NodeTerm)>,
    /// `spec.tolerations`.
    pub tolerations: Vec<Toleration>,
    /// Required pod affinity terms.
    pub required_affinity: Vec<AffinityTerm>,
    /// Required pod anti-affinity terms.
    pub required_anti_affinity: Vec<AffinityTerm>,
    /// Preferred pod affinity: (weight, term).
    pub preferred_affinity: Vec<(i32, AffinityTerm)>,
    /// Preferred pod anti-affinity: (weight, term).
    pub preferred_anti_affinity: Vec<(i32, AffinityTerm)>,
    /// Topology spread constraints.
    pub spread_constraints: Vec<SpreadConstraint>,
    /// Network disks that allow one writer per node.
    pub disks: Vec<Disk>,
    /// `preemptionPolicy: Never`: this pod never evicts others.
    pub never_preempts: bool,
    /// `status.startTime`, for preemption's tie-break.
    pub start_time: Option<DateTime<Utc>>,
    /// Being deleted: spreading ignores it.
    pub terminating: bool,
    /// A request that does not parse: the pod fits nowhere, with this reason.
    pub malformed: Option<String>,
}

impl PodInfo {
    /// Computes everything a decision reads from `pod`.
    pub fn new(pod: Arc<Pod>) -> PodInfo {
        let key = ObjectKey::new(
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        let labels = pod.metadata.labels.as_ref().unwrap_or(&NO_LABELS);
        let mut malformed = None;
        let mut requests_of = |non_zero| {
            pod_requests(&pod, non_zero).unwrap_or_else(|(name, e)| {
                malformed = Some(format!("pod has a malformed {name} request: {e}"));
                Resources { pods: 1, ..Resources::default() }
            })
        };
        let requests = requests_of(false);
        let non_zero_requests = requests_of(true);
        let spec = pod.spec.as_ref();
        let mut host_ports = Vec::new();
        if let Some(spec) = spec {
            let sidecars =
                spec.init_containers.iter().flatten().filter(|c| c.restart_policy.as_deref() == Some("Always"));
            for c in spec.containers.iter().chain(sidecars) {
                for p in c.ports.iter().flatten() {
                    if let Some(port) = p.host_port.filter(|p| *p > 0) {
                        host_ports.push(HostPort {
                            ip: p.host_ip.clone().filter(|ip| !ip.is_empty()).unwrap_or_else(|| "0.0.0.0".into()),
                            protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                            port,
                        });
                    }
                }
            }
        }
        let affinity = spec.and_then(|s| s.affinity.as_ref());
        let node_affinity = affinity.and_then(|a| a.node_affinity.as_ref());
        let pod_affinity = affinity.and_then(|a| a.pod_affinity.as_ref());
        let anti = affinity.and_then(|a| a.pod_anti_affinity.as_ref());
        let ns = key.namespace.clone();
        let term = |t: &PodAffinityTerm| AffinityTerm::new(t, &ns, labels);
        let spread_constraints = spec
            .and_then(|s| s.topology_spread_constraints.as_ref())
            .into_iter()
            .flatten()
            .map(|c| spread_constraint(c, labels))
            .collect();
        let disks = spec
            .and_then(|s| s.volumes.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|v| {
                if let Some(g) = &v.gce_persistent_disk {
                    Some(Disk::GcePd { name: g.pd_name.clone(), read_only: g.read_only.unwrap_or(false) })
                } else if let Some(a) = &v.aws_elastic_block_store {
                    Some(Disk::AwsEbs { volume_id: a.volume_id.clone() })
                } else if let Some(r) = &v.rbd {
                    Some(Disk::Rbd {
                        monitors: r.monitors.clone(),
                        pool: r.pool.clone().unwrap_or_else(|| "rbd".into()),
                        image: r.image.clone(),
                        read_only: r.read_only.unwrap_or(false),
                    })
                } else {
                    v.iscsi
                        .as_ref()
                        .map(|i| Disk::Iscsi { iqn: i.iqn.clone(), read_only: i.read_only.unwrap_or(false) })
                }
            })
            .collect();
        PodInfo {
            requests,
            non_zero_requests,
            priority: spec.and_then(|s| s.priority).unwrap_or(0),
            host_ports,
            node_selector: spec.and_then(|s| s.node_selector.clone()).unwrap_or_default(),
            required_node_affinity: node_affinity
                .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
                .map(NodeSelectorTerms::new),
            preferred_node_affinity: node_affinity
                .and_then(|n| n.preferred_during_scheduling_ignored_during_execution.as_ref())
                .into_iter()
                .flatten()
                .map(|p| (p.weight, NodeTerm::new(&p.preference)))
                .collect(),
            tolerations: spec.and_then(|s| s.tolerations.clone()).unwrap_or_default(),
            required_affinity: pod_affinity
                .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref())
                .into_iter()
                .flatten()
                .map(term)
                .collect(),
            required_anti_affinity: anti
                .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref())
                .into_iter()
                .flatten()
                .map(term)
                .collect(),
            preferred_affinity: pod_affinity
                .and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_ref())
                .into_iter()
                .flatten()
                .map(|w| (w.weight, term(&w.pod_affinity_term)))
                .collect(),
            preferred_anti_affinity: anti
                .and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_ref())
                .into_iter()
                .flatten()
                .map(|w| (w.weight, term(&w.pod_affinity_term)))
                .collect(),
            spread_constraints,
            disks,
            never_preempts: spec.and_then(|s| s.preemption_policy.as_deref()) == Some("Never"),
            start_time: pod.status.as_ref().and_then(|s| s.start_time.as_ref()).map(|t| t.0),
            terminating: pod.metadata.deletion_timestamp.is_some(),
            malformed,
            key,
            pod,
        }
    }

    /// This pod with `spec.nodeName` set to `node`, as the loop assumes it
    /// before the binding is committed; only the pod object is copied,
    /// nothing is parsed again.
    pub fn bound_to(&self, node: &str) -> PodInfo {
        let mut pod = (*self.pod).clone();
        pod.spec.get_or_insert_with(Default::default).node_name = Some(node.to_string());
        PodInfo { pod: Arc::new(pod), ..self.clone() }
    }

    /// `spec.nodeName`, when the pod is bound (or assumed).
    pub fn node_name(&self) -> Option<&str> {
        self.pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).filter(|n| !n.is_empty())
    }

    /// The pod's labels.
    pub fn labels(&self) -> &BTreeMap<String, String> {
        self.pod.metadata.labels.as_ref().unwrap_or(&NO_LABELS)
    }

    /// Whether the pod carries any pod affinity or anti-affinity term, required or preferred.
    pub fn has_affinity_terms(&self) -> bool {
        !(self.required_affinity.is_empty()
            && self.required_anti_affinity.is_empty()
            && self.preferred_affinity.is_empty()
            && self.preferred_anti_affinity.is_empty())
    }

    /// Whether this pod ranks above `other` for reprieve order: higher
    /// priority, then earlier start (kube's MoreImportantPod).
    pub(crate) fn more_important_than(&self, other: &PodInfo) -> bool {
        if self.priority != other.priority {
            return self.priority > other.priority;
        }
        match (self.start_time, other.start_time) {
            (Some(a), Some(b)) => a < b,
            (Some(_), None) => true,
            _ => false,
        }
    }
}

fn spread_constraint(c: &TopologySpreadConstraint, labels: &BTreeMap<String, String>) -> SpreadConstraint {
    let mut selector = c.label_selector.as_ref().map_or_else(Selector::nothing, Selector::from_label_selector);
    if c.label_selector.is_some() {
        for key in c.match_label_keys.iter().flatten() {
            if let Some(value) = labels.get(key) {
                selector = selector.with(Requirement {
                    key: key.clone(),
                    operator: Operator::In,
                    values: vec![value.clone()],
                });
            }
        }
    }
    SpreadConstraint {
        max_skew: c.max_skew,
        topology_key: c.topology_key.clone(),
        selector,
        min_domains: c.min_domains.unwrap_or(1).max(1),
        honor_node_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
        honor_taints: c.node_taints_policy.as_deref() == Some("Honor"),
        hard: c.when_unsatisfiable != "ScheduleAnyway",
    }
}

/// A node and the pods placed on it, with the sums filters and scores read.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    /// The node as the informer saw it.
    pub node: Arc<Node>,
    /// `metadata.name`.
    pub name: String,
    /// `status.allocatable` (or capacity).
    pub allocatable: Resources,
    /// Sum of the placed pods' `requests`.
    pub requested: Resources,
    /// Sum of the placed pods' `non_zero_requests`, for scoring.
    pub non_zero_requested: Resources,
    /// Pods placed here, bound or assumed.
    pub pods: Vec<Arc<PodInfo>>,
    /// Host ports the placed pods use, one entry per use.
    pub used_ports: Vec<HostPort>,
    /// `spec.taints`.
    pub taints: Vec<Taint>,
    /// `spec.unschedulable` (cordoned).
    pub unschedulable: bool,
    /// Capacity that does not parse: the node is skipped, with this reason.
    pub malformed: Option<String>,
}

impl NodeInfo {
    /// A node with no pods yet.
    pub fn new(node: Arc<Node>) -> NodeInfo {
        let (allocatable, malformed) = match node_allocatable(&node) {
            Ok(a) => (a, None),
            Err((name, e)) => (Resources::default(), Some(format!("node has malformed {name} capacity: {e}"))),
        };
        NodeInfo {
            name: node.metadata.name.clone().unwrap_or_default(),
            allocatable,
            requested: Resources::default(),
            non_zero_requested: Resources::default(),
            pods: Vec::new(),
            used_ports: Vec::new(),
            taints: node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default(),
            unschedulable: node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false),
            malformed,
            node,
        }
    }

    /// The node's labels.
    pub fn labels(&self) -> &BTreeMap<String, String> {
        self.node.metadata.labels.as_ref().unwrap_or(&NO_LABELS)
    }

    /// Accounts `pod` here.
    pub fn add_pod(&mut self, pod: Arc<PodInfo>) {
        self.requested.add(&pod.requests);
        self.non_zero_requested.add(&pod.non_zero_requests);
        self.used_ports.extend(pod.host_ports.iter().cloned());
        self.pods.push(pod);
    }

    /// Stops accounting the pod `key` here.
    pub fn remove_pod(&mut self, key: &ObjectKey) -> Option<Arc<PodInfo>> {
        let i = self.pods.iter().position(|p| &p.key == key)?;
        let pod = self.pods.swap_remove(i);
        self.requested.sub(&pod.requests);
        self.non_zero_requested.sub(&pod.non_zero_requests);
        for port in &pod.host_ports {
            if let Some(j) = self.used_ports.iter().position(|p| p == port) {
                self.used_ports.swap_remove(j);
            }
        }
        Some(pod)
    }

    /// The same node with its pods, recounted.
    pub(crate) fn with_node(&self, node: Arc<Node>) -> NodeInfo {
        let mut info = NodeInfo::new(node);
        for p in &self.pods {
            info.add_pod(p.clone());
        }
        info
    }
}
