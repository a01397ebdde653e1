//! Quantities and resource requests: the Kubernetes quantity grammar, a
//! pod's effective requests as kube computes them (containers, init
//! containers with the sidecar rules, overhead), and a node's allocatable.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
pub use skiff_api::quantity::{parse_quantity, QuantityError};

/// Amounts of every resource the scheduler accounts for. CPU in
/// millicores, everything else in its base unit (bytes, pods, devices).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    /// CPU in thousandths of a core.
    pub milli_cpu: i64,
    /// Memory in bytes.
    pub memory: i64,
    /// Local ephemeral storage in bytes.
    pub ephemeral_storage: i64,
    /// Number of pods (only meaningful for a node's allocatable or requested).
    pub pods: i64,
    /// Extended resources (`nvidia.com/gpu`, `hugepages-2Mi`, ...), by name.
    pub scalar: BTreeMap<String, i64>,
}

/// The default cpu request, in millicores, that scoring counts for a
/// container which requests none (kube's `DefaultMilliCPURequest`).
pub const DEFAULT_MILLI_CPU_REQUEST: i64 = 100;
/// The default memory request that scoring counts for a container which
/// requests none (kube's `DefaultMemoryRequest`, 200 MiB).
pub const DEFAULT_MEMORY_REQUEST: i64 = 200 * 1024 * 1024;

/// `q` in thousandths of its unit, clamped to i64.
fn milli_of(q: &Quantity) -> Result<i64, QuantityError> {
    parse_quantity(&q.0).map(|v| v.clamp(i64::MIN as i128, i64::MAX as i128) as i64)
}

/// `q` in its unit, rounded up, clamped to i64.
fn value_of(q: &Quantity) -> Result<i64, QuantityError> {
    parse_quantity(&q.0).map(|v| {
        let whole = v.div_euclid(1000) + i128::from(v.rem_euclid(1000) != 0);
        whole.clamp(i64::MIN as i128, i64::MAX as i128) as i64
    })
}

impl Resources {
    /// Reads a resource list (`requests`, `allocatable`, `overhead`).
    pub fn from_list(list: &BTreeMap<String, Quantity>) -> Result<Resources, (String, QuantityError)> {
        let mut r = Resources::default();
        for (name, q) in list {
            let err = |e| (name.clone(), e);
            match name.as_str() {
                "cpu" => r.milli_cpu = milli_of(q).map_err(err)?,
                "memory" => r.memory = value_of(q).map_err(err)?,
                "ephemeral-storage" => r.ephemeral_storage = value_of(q).map_err(err)?,
                "pods" => r.pods = value_of(q).map_err(err)?,
                _ => {
                    r.scalar.insert(name.clone(), value_of(q).map_err(err)?);
                }
            }
        }
        Ok(r)
    }

    /// Adds `other` to `self`, resource by resource.
    pub fn add(&mut self, other: &Resources) {
        self.milli_cpu = self.milli_cpu.saturating_add(other.milli_cpu);
        self.memory = self.memory.saturating_add(other.memory);
        self.ephemeral_storage = self.ephemeral_storage.saturating_add(other.ephemeral_storage);
        self.pods = self.pods.saturating_add(other.pods);
        for (k, v) in &other.scalar {
            let e = self.scalar.entry(k.clone()).or_default();
            *e = e.saturating_add(*v);
        }
    }

    /// Subtracts `other` from `self`, resource by resource.
    pub fn sub(&mut self, other: &Resources) {
        self.milli_cpu = self.milli_cpu.saturating_sub(other.milli_cpu);
        self.memory = self.memory.saturating_sub(other.memory);
        self.ephemeral_storage = self.ephemeral_storage.saturating_sub(other.ephemeral_storage);
        self.pods = self.pods.saturating_sub(other.pods);
        for (k, v) in &other.scalar {
            let e = self.scalar.entry(k.clone()).or_default();
            *e = e.saturating_sub(*v);
        }
        self.scalar.retain(|_, v| *v != 0);
    }

    /// Raises every resource of `self` to at least `other`'s.
    pub fn max_with(&mut self, other: &Resources) {
        self.milli_cpu = self.milli_cpu.max(other.milli_cpu);
        self.memory = self.memory.max(other.memory);
        self.ephemeral_storage = self.ephemeral_storage.max(other.ephemeral_storage);
        self.pods = self.pods.max(other.pods);
        for (k, v) in &other.scalar {
            let e = self.scalar.entry(k.clone()).or_default();
            *e = (*e).max(*v);
        }
    }
}

/// A container's requests; a resource with a limit but no request
/// requests its limit, as the apiserver's defaulting would set it.
/// With `non_zero`, missing cpu and memory requests count as kube's
/// scoring defaults.
fn container_requests(c: &Container, non_zero: bool) -> Result<Resources, (String, QuantityError)> {
    let resources = c.resources.as_ref();
    let mut list = resources.and_then(|r| r.limits.clone()).unwrap_or_default();
    if let Some(requests) = resources.and_then(|r| r.requests.as_ref()) {
        list.extend(requests.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    let mut r = Resources::from_list(&list)?;
    if non_zero {
        if !list.contains_key("cpu") {
            r.milli_cpu = DEFAULT_MILLI_CPU_REQUEST;
        }
        if !list.contains_key("memory") {
            r.memory = DEFAULT_MEMORY_REQUEST;
        }
    }
    Ok(r)
}

/// A pod's effective requests as kube computes them: the larger of the sum
/// of its containers (plus sidecars, init containers with
/// `restartPolicy: Always`, which keep running) and the largest init
/// container (plus the sidecars started before it), then the overhead.
/// `pods` is 1. With `non_zero`, containers without cpu or memory requests
/// count kube's defaults (100m, 200Mi), as scoring does.
pub fn pod_requests(pod: &Pod, non_zero: bool) -> Result<Resources, (String, QuantityError)> {
    let Some(spec) = pod.spec.as_ref() else { return Ok(Resources { pods: 1, ..Resources::default() }) };
    let mut total = Resources::default();
    for c in &spec.containers {
        total.add(&container_requests(c, non_zero)?);
    }
    let mut sidecars = Resources::default();
    let mut init_max = Resources::default();
    for c in spec.init_containers.iter().flatten() {
        let mut r = container_requests(c, non_zero)?;
        if c.restart_policy.as_deref() == Some("Always") {
            total.add(&r);
            sidecars.add(&r);
            r = sidecars.clone();
        } else {
            r.add(&sidecars);
        }
        init_max.max_with(&r);
    }
    total.max_with(&init_max);
    if let Some(overhead) = spec.overhead.as_ref() {
        total.add(&Resources::from_list(overhead)?);
    }
    total.pods = 1;
    Ok(total)
}

/// A node's allocatable resources: `status.allocatable`, or its capacity
/// when it reports no allocatable. A node that reports neither has none
/// (kube: it then fits no pod, "Too many pods").
pub fn node_allocatable(node: &Node) -> Result<Resources, (String, QuantityError)> {
    let status = node.status.as_ref();
    match status.and_then(|s| s.allocatable.as_ref()).or_else(|| status.and_then(|s| s.capacity.as_ref())) {
        Some(list) => Resources::from_list(list),
        None => Ok(Resources::default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};

    fn container(cpu: Option<&str>, memory: Option<&str>, restart: Option<&str>) -> Container {
        let mut requests = BTreeMap::new();
        if let Some(c) = cpu {
            requests.insert("cpu".to_string(), Quantity(c.to_string()));
        }
        if let Some(m) = memory {
            requests.insert("memory".to_string(), Quantity(m.to_string()));
        }
        Container {
            name: "c".into(),
            resources: Some(ResourceRequirements { requests: Some(requests), ..Default::default() }),
            restart_policy: restart.map(str::to_string),
            ..Default::default()
        }
    }

    fn pod(containers: Vec<Container>, init: Vec<Container>, overhead: Option<&str>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers,
                init_containers: Some(init),
                overhead: overhead.map(|o| BTreeMap::from([("cpu".to_string(), Quantity(o.to_string()))])),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn pod_requests_take_the_larger_of_containers_and_init_containers_plus_overhead() {
        let c = |cpu: &str| container(Some(cpu), Some("1Mi"), None);
        let sidecar = |cpu: &str| container(Some(cpu), None, Some("Always"));
        // (containers, init containers, overhead, want milli cpu)
        type Case = (Vec<Container>, Vec<Container>, Option<&'static str>, i64);
        let cases: Vec<Case> = vec![
            (vec![c("100m"), c("200m")], vec![], None, 300),
            (vec![c("100m")], vec![c("500m")], None, 500),
            (vec![c("600m")], vec![c("500m")], None, 600),
            (vec![c("100m")], vec![c("500m")], Some("50m"), 550),
            // A sidecar runs beside the containers, and beside later init containers.
            (vec![c("100m")], vec![sidecar("200m"), c("250m")], None, 450),
            (vec![c("500m")], vec![sidecar("200m"), c("250m")], None, 700),
            // An init container before the sidecar does not add it.
            (vec![c("100m")], vec![c("250m"), sidecar("200m")], None, 300),
        ];
        for (i, (containers, init, overhead, want)) in cases.into_iter().enumerate() {
            let r = pod_requests(&pod(containers, init, overhead), false).expect("parses");
            assert_eq!(r.milli_cpu, want, "case {i}");
            assert_eq!(r.pods, 1);
        }
    }

    #[test]
    fn non_zero_requests_default_missing_cpu_and_memory_per_container() {
        let p = pod(vec![container(None, None, None), container(Some("300m"), None, None)], vec![], None);
        let plain = pod_requests(&p, false).expect("parses");
        assert_eq!((plain.milli_cpu, plain.memory), (300, 0));
        let scored = pod_requests(&p, true).expect("parses");
        assert_eq!((scored.milli_cpu, scored.memory), (400, 2 * DEFAULT_MEMORY_REQUEST));
    }

    #[test]
    fn a_limit_without_a_request_counts_as_the_request() {
        let mut c = container(None, None, None);
        c.resources = Some(ResourceRequirements {
            limits: Some(BTreeMap::from([("cpu".to_string(), Quantity("2".into()))])),
            ..Default::default()
        });
        assert_eq!(pod_requests(&pod(vec![c], vec![], None), false).expect("parses").milli_cpu, 2000);
    }

    #[test]
    fn a_malformed_request_names_its_resource() {
        let p = pod(vec![container(Some("lots"), None, None)], vec![], None);
        assert_eq!(pod_requests(&p, false).map_err(|(name, _)| name), Err("cpu".to_string()));
    }
}
