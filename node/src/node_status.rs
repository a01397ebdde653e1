//! The Node object as the agent registers it and the status it posts:
//! capacity and allocatable from the host minus `--system-reserved`,
//! addresses, nodeInfo with the runtime's version, and the four
//! conditions the kubelet reports (Ready, MemoryPressure, DiskPressure,
//! PIDPressure), each keeping its `lastTransitionTime` while unchanged.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus, NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use skiff_api::quantity::parse_quantity;

use crate::config::NodeConfig;
use crate::host::{HostFigures, HostInfo};
use crate::runtime::RuntimeVersion;

/// The version the agent reports as `kubeletVersion`.
pub const KUBELET_VERSION: &str = "v1.32.0-skiff";

/// Memory below which the node reports MemoryPressure (kube's eviction
/// default `memory.available<100Mi`).
const MEMORY_PRESSURE_BELOW: u64 = 100 * 1024 * 1024;
/// Free disk fraction below which the node reports DiskPressure
/// (`nodefs.available<10%`).
const DISK_PRESSURE_BELOW: f64 = 0.10;
/// Fraction of pid_max in use above which the node reports PIDPressure.
const PID_PRESSURE_ABOVE: f64 = 0.90;

/// Why a `--system-reserved` entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--system-reserved {name}={value}: {reason}")]
pub struct ReservedError {
    /// The resource name.
    pub name: String,
    /// The value given.
    pub value: String,
    /// Why.
    pub reason: String,
}

/// Amounts by resource name, as a Node's status carries them.
pub type ResourceList = BTreeMap<String, Quantity>;

/// Capacity and allocatable for cpu, memory, ephemeral-storage and pods.
pub fn resources(config: &NodeConfig, host: &HostFigures) -> Result<(ResourceList, ResourceList), ReservedError> {
    // In thousandths of the unit, as `parse_quantity` gives them.
    let mut capacity: BTreeMap<&str, i128> = BTreeMap::new();
    capacity.insert("cpu", i128::from(host.cpus) * 1000);
    capacity.insert("memory", i128::from(host.memory_total) * 1000);
    capacity.insert("ephemeral-storage", i128::from(host.disk_total) * 1000);
    capacity.insert("pods", i128::from(config.max_pods) * 1000);
    let mut allocatable = capacity.clone();
    for (name, value) in &config.system_reserved {
        let refuse = |reason: &str| ReservedError { name: name.clone(), value: value.clone(), reason: reason.into() };
        let reserved = parse_quantity(value).map_err(|e| refuse(&e.to_string()))?;
        if reserved < 0 {
            return Err(refuse("must not be negative"));
        }
        let slot = allocatable.get_mut(name.as_str()).ok_or_else(|| refuse("unknown resource"))?;
        *slot = (*slot - reserved).max(0);
    }
    let render = |m: BTreeMap<&str, i128>| -> ResourceList {
        m.into_iter().map(|(k, v)| (k.to_string(), Quantity(format_quantity(k, v)))).collect()
    };
    Ok((render(capacity), render(allocatable)))
}

/// A quantity in thousandths as Kubernetes prints it: CPU in cores or
/// millicores, memory in Ki, counts whole.
fn format_quantity(name: &str, milli: i128) -> String {
    match name {
        "cpu" if milli % 1000 == 0 => (milli / 1000).to_string(),
        "cpu" => format!("{milli}m"),
        "memory" | "ephemeral-storage" => {
            let bytes = milli / 1000;
            if bytes % 1024 == 0 {
                format!("{}Ki", bytes / 1024)
            } else {
                bytes.to_string()
            }
        }
        _ => (milli / 1000).to_string(),
    }
}

/// The Node the agent registers.
pub fn registration(config: &NodeConfig, host: &HostInfo) -> Node {
    let mut labels = BTreeMap::from([
        ("kubernetes.io/hostname".to_string(), config.name.clone()),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        ("kubernetes.io/arch".to_string(), host.architecture.clone()),
        ("beta.kubernetes.io/os".to_string(), "linux".to_string()),
        ("beta.kubernetes.io/arch".to_string(), host.architecture.clone()),
    ]);
    labels.extend(config.node_labels.clone());
    Node {
        metadata: ObjectMeta { name: Some(config.name.clone()), labels: Some(labels), ..Default::default() },
        spec: Some(NodeSpec {
            pod_cidr: config.pod_cidr.clone(),
            pod_cidrs: config.pod_cidr.clone().map(|c| vec![c]),
            taints: (!config.register_with_taints.is_empty()).then(|| config.register_with_taints.clone()),
            ..Default::default()
        }),
        status: None,
    }
}

/// What the node's health looks like now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// The runtime answered its last call; its error otherwise.
    pub runtime: Result<(), String>,
    /// The host's figures.
    pub host: HostFigures,
}

/// The status to post, keeping each condition's transition time from
/// `previous` while its status is unchanged.
pub fn status(
    config: &NodeConfig,
    info: &HostInfo,
    runtime: &RuntimeVersion,
    health: &Health,
    previous: Option<&NodeStatus>,
    now: DateTime<Utc>,
) -> Result<NodeStatus, ReservedError> {
    let (capacity, allocatable) = resources(config, &health.host)?;
    let host = &health.host;
    let disk_free = if host.disk_total == 0 { 1.0 } else { host.disk_available as f64 / host.disk_total as f64 };
    let pids_used = if host.pids_max == 0 { 0.0 } else { host.pids_running as f64 / host.pids_max as f64 };
    let memory_pressure = host.memory_total > 0 && host.memory_available < MEMORY_PRESSURE_BELOW;
    let conditions = vec![
        match &health.runtime {
            Ok(()) => condition("Ready", true, "KubeletReady", "kubelet is posting ready status"),
            Err(e) => condition("Ready", false, "KubeletNotReady", &format!("container runtime is down: {e}")),
        },
        if memory_pressure {
            condition(
                "MemoryPressure",
                true,
                "KubeletHasInsufficientMemory",
                "kubelet has insufficient memory available",
            )
        } else {
            condition("MemoryPressure", false, "KubeletHasSufficientMemory", "kubelet has sufficient memory available")
        },
        if disk_free < DISK_PRESSURE_BELOW {
            condition("DiskPressure", true, "KubeletHasDiskPressure", "kubelet has disk pressure")
        } else {
            condition("DiskPressure", false, "KubeletHasNoDiskPressure", "kubelet has no disk pressure")
        },
        if pids_used > PID_PRESSURE_ABOVE {
            condition("PIDPressure", true, "KubeletHasInsufficientPID", "kubelet has insufficient PID available")
        } else {
            condition("PIDPressure", false, "KubeletHasSufficientPID", "kubelet has sufficient PID available")
        },
    ];
    let conditions = conditions
        .into_iter()
        .map(|mut c| {
            let before =
                previous.and_then(|s| s.conditions.as_ref()).and_then(|cs| cs.iter().find(|p| p.type_ == c.type_));
            c.last_heartbeat_time = Some(Time(now));
            c.last_transition_time = match before {
                Some(p) if p.status == c.status && p.last_transition_time.is_some() => p.last_transition_time.clone(),
                _ => Some(Time(now)),
            };
            c
        })
        .collect();
    Ok(NodeStatus {
        capacity: Some(capacity),
        allocatable: Some(allocatable),
        conditions: Some(conditions),
        addresses: Some(vec![
            NodeAddress { type_: "InternalIP".into(), address: config.node_ip.clone() },
            NodeAddress { type_: "Hostname".into(), address: config.name.clone() },
        ]),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint { port: i32::from(config.listen.port()) }),
        }),
        node_info: Some(NodeSystemInfo {
            architecture: info.architecture.clone(),
            boot_id: info.boot_id.clone(),
            container_runtime_version: format!("{}://{}", runtime.runtime_name, runtime.runtime_version),
            kernel_version: info.kernel_version.clone(),
            kube_proxy_version: String::new(),
            kubelet_version: KUBELET_VERSION.to_string(),
            machine_id: info.machine_id.clone(),
            operating_system: "linux".to_string(),
            os_image: info.os_image.clone(),
            system_uuid: info.machine_id.clone(),
        }),
        ..Default::default()
    })
}

fn condition(type_: &str, status: bool, reason: &str, message: &str) -> NodeCondition {
    NodeCondition {
        type_: type_.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        ..Default::default()
    }
}

/// Whether two statuses differ in anything but heartbeat times, so a
/// change is posted at once and an unchanged status only every
/// `status_update_frequency`.
pub fn changed(a: &NodeStatus, b: &NodeStatus) -> bool {
    let strip = |s: &NodeStatus| {
        let mut s = s.clone();
        for c in s.conditions.iter_mut().flatten() {
            c.last_heartbeat_time = None;
        }
        s
    };
    strip(a) != strip(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> HostFigures {
        HostFigures {
            cpus: 2,
            memory_total: 4 * 1024 * 1024 * 1024,
            memory_available: 3 * 1024 * 1024 * 1024,
            disk_total: 100 * 1024 * 1024 * 1024,
            disk_available: 50 * 1024 * 1024 * 1024,
            pids_running: 400,
            pids_max: 32768,
        }
    }

    fn config() -> NodeConfig {
        NodeConfig::new("node-1", vec!["127.0.0.1:2379".into()], "/tmp/x".into())
    }

    fn runtime() -> RuntimeVersion {
        RuntimeVersion {
            runtime_name: "containerd".into(),
            runtime_version: "1.6.20".into(),
            runtime_api_version: "v1".into(),
        }
    }

    fn health(runtime: Result<(), String>) -> Health {
        Health { runtime, host: host() }
    }

    #[test]
    fn capacity_comes_from_the_host_and_allocatable_subtracts_what_is_reserved() {
        let mut config = config();
        config.system_reserved = BTreeMap::from([("cpu".into(), "500m".into()), ("memory".into(), "1Gi".into())]);
        let (capacity, allocatable) = resources(&config, &host()).expect("valid");
        assert_eq!(capacity["cpu"].0, "2");
        assert_eq!(capacity["memory"].0, "4194304Ki");
        assert_eq!(capacity["pods"].0, "110");
        assert_eq!(allocatable["cpu"].0, "1500m");
        assert_eq!(allocatable["memory"].0, "3145728Ki");
        assert_eq!(allocatable["ephemeral-storage"], capacity["ephemeral-storage"]);
    }

    #[test]
    fn a_bad_reservation_is_refused_with_its_name() {
        let mut config = config();
        config.system_reserved = BTreeMap::from([("cpu".into(), "lots".into())]);
        let err = resources(&config, &host()).expect_err("refused");
        assert_eq!(err.name, "cpu");
        config.system_reserved = BTreeMap::from([("gpus".into(), "1".into())]);
        assert!(resources(&config, &host()).expect_err("refused").to_string().contains("unknown resource"));
    }

    #[test]
    fn registration_carries_the_well_known_labels_and_the_taints_asked_for() {
        let mut config = config();
        config.node_labels = BTreeMap::from([("zone".into(), "a".into())]);
        config.register_with_taints = vec![k8s_openapi::api::core::v1::Taint {
            key: "dedicated".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }];
        let info = HostInfo { architecture: "amd64".into(), ..Default::default() };
        let node = registration(&config, &info);
        let labels = node.metadata.labels.expect("labels");
        assert_eq!(labels["kubernetes.io/hostname"], "node-1");
        assert_eq!(labels["kubernetes.io/arch"], "amd64");
        assert_eq!(labels["zone"], "a");
        assert_eq!(node.spec.expect("spec").taints.expect("taints")[0].key, "dedicated");
    }

    #[test]
    fn a_down_runtime_makes_the_node_not_ready_and_transition_times_hold_while_unchanged() {
        let config = config();
        let info = HostInfo::default();
        let t0 = DateTime::<Utc>::from_timestamp(1_000, 0).expect("time");
        let t1 = DateTime::<Utc>::from_timestamp(1_010, 0).expect("time");
        let first = status(&config, &info, &runtime(), &health(Ok(())), None, t0).expect("status");
        let again = status(&config, &info, &runtime(), &health(Ok(())), Some(&first), t1).expect("status");
        let ready = |s: &NodeStatus| s.conditions.as_ref().expect("conditions")[0].clone();
        assert_eq!(ready(&again).status, "True");
        assert_eq!(ready(&again).last_transition_time, Some(Time(t0)));
        assert_eq!(ready(&again).last_heartbeat_time, Some(Time(t1)));
        assert!(!changed(&first, &again), "only heartbeats moved");

        let down =
            status(&config, &info, &runtime(), &health(Err("socket gone".into())), Some(&again), t1).expect("status");
        assert_eq!(ready(&down).status, "False");
        assert!(ready(&down).message.expect("message").contains("socket gone"));
        assert_eq!(ready(&down).last_transition_time, Some(Time(t1)));
        assert!(changed(&again, &down));
        assert_eq!(down.node_info.expect("info").container_runtime_version, "containerd://1.6.20");
    }

    #[test]
    fn pressure_conditions_follow_kubes_eviction_thresholds() {
        let config = config();
        let mut h = health(Ok(()));
        h.host.memory_available = 50 * 1024 * 1024;
        h.host.disk_available = h.host.disk_total / 20;
        let now = DateTime::<Utc>::from_timestamp(1_000, 0).expect("time");
        let s = status(&config, &HostInfo::default(), &runtime(), &h, None, now).expect("status");
        let by_type: BTreeMap<_, _> =
            s.conditions.expect("conditions").into_iter().map(|c| (c.type_.clone(), c.status)).collect();
        assert_eq!(by_type["MemoryPressure"], "True");
        assert_eq!(by_type["DiskPressure"], "True");
        assert_eq!(by_type["PIDPressure"], "False");
    }
}
