//! From a v1 `Pod` to what the runtime is asked for: the sandbox spec
//! (labels, hostname, DNS, hostPorts, cgroup parent, log directory) and
//! each container's spec (command and args with `$(VAR)` expanded, the
//! environment from literals, ConfigMaps, Secrets, the downward API and
//! Service variables, cgroup limits, log path), as the kubelet lays them
//! out.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};

use super::{PodResources, WorkerConfig};
use crate::runtime::{
    ContainerResources, ContainerSpec, DnsConfig, Mount, PortMapping, SandboxSpec, LABEL_CONTAINER_NAME, LABEL_NODE,
    LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID,
};

/// Annotation on every container: how many times it restarted before.
pub const ANNOTATION_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
/// Annotation on every container: a hash of its spec, so a changed spec
/// (a new image) restarts it.
pub const ANNOTATION_HASH: &str = "io.kubernetes.container.hash";

/// A stable hash of a container's spec (FNV-1a over its JSON form, whose
/// field order is fixed).
pub fn container_hash(container: &Container) -> String {
    let json = serde_json::to_string(container).unwrap_or_default();
    let hash = json.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3));
    format!("{hash:016x}")
}

/// Why a container's spec could not be made; the container waits with
/// reason `CreateContainerConfigError` and this as its message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A required ConfigMap does not exist.
    #[error("configmap \"{name}\" not found")]
    ConfigMapNotFound {
        /// The ConfigMap's name.
        name: String,
    },
    /// A required key is missing from a ConfigMap.
    #[error("couldn't find key {key} in ConfigMap {namespace}/{name}")]
    ConfigMapKeyNotFound {
        /// The namespace.
        namespace: String,
        /// The ConfigMap's name.
        name: String,
        /// The key.
        key: String,
    },
    /// A required Secret does not exist.
    #[error("secret \"{name}\" not found")]
    SecretNotFound {
        /// The Secret's name.
        name: String,
    },
    /// A required key is missing from a Secret.
    #[error("couldn't find key {key} in Secret {namespace}/{name}")]
    SecretKeyNotFound {
        /// The namespace.
        namespace: String,
        /// The Secret's name.
        name: String,
        /// The key.
        key: String,
    },
    /// A `fieldRef` names a field the downward API does not offer.
    #[error("unsupported fieldPath: {0}")]
    FieldPath(String),
    /// A `resourceFieldRef` names an unknown resource or container.
    #[error("unsupported resourceFieldRef: {0}")]
    ResourceField(String),
    /// No valid token of the pod's service account is at hand (the
    /// TokenRequest failed or was refused).
    #[error("failed to fetch token: serviceaccount \"{account}\": no token was issued for this pod")]
    TokenUnavailable {
        /// The service account.
        account: String,
    },
    /// A volume mount names no volume of the pod, or one that failed.
    #[error("volume \"{0}\" is not available to mount")]
    VolumeUnavailable(String),
    /// A subPath leaves the volume.
    #[error("invalid subPath \"{0}\": must be a relative path inside the volume")]
    SubPath(String),
    /// The image's user could not be read from the runtime.
    #[error("failed to read the user of image \"{image}\": {reason}")]
    ImageUser {
        /// The image.
        image: String,
        /// Why.
        reason: String,
    },
    /// `runAsNonRoot` with `runAsUser: 0`.
    #[error("container's runAsUser breaks non-root policy (pod: \"{pod}\", container: {container})")]
    RunAsUserIsRoot {
        /// The pod, as the kubelet names it: `name_namespace(uid)`.
        pod: String,
        /// The container's name.
        container: String,
    },
    /// `runAsNonRoot` and an image whose user is root (or none).
    #[error("container has runAsNonRoot and image will run as root (pod: \"{pod}\", container: {container})")]
    ImageRunsAsRoot {
        /// The pod, as the kubelet names it.
        pod: String,
        /// The container's name.
        container: String,
    },
    /// `runAsNonRoot` and an image whose user is a name, not a uid.
    #[error(
        "container has runAsNonRoot and image has non-numeric user ({user}), cannot verify user is non-root \
         (pod: \"{pod}\", container: {container})"
    )]
    NonNumericImageUser {
        /// The image's user.
        user: String,
        /// The pod, as the kubelet names it.
        pod: String,
        /// The container's name.
        container: String,
    },
}
/// A pod's ephemeral containers (`kubectl debug`) as containers: the
/// same fields, less `targetContainerName` ([`pid_target`] reads it).
pub fn ephemeral_containers(pod: &Pod) -> Vec<Container> {
    let listed = pod.spec.as_ref().and_then(|s| s.ephemeral_containers.as_ref());
    listed
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let mut fields = serde_json::to_value(e).ok()?;
            fields.as_object_mut()?.remove("targetContainerName");
            serde_json::from_value(fields).ok()
        })
        .collect()
}

/// The container whose process namespace the container `name` joins: an
/// ephemeral container's `targetContainerName` (`kubectl debug --target`).
pub fn pid_target<'a>(pod: &'a Pod, name: &str) -> Option<&'a str> {
    let listed = pod.spec.as_ref().and_then(|s| s.ephemeral_containers.as_ref());
    let ephemeral = listed.into_iter().flatten().find(|e| e.name == name)?;
    ephemeral.target_container_name.as_deref().filter(|t| !t.is_empty())
}

/// The pod's namespace, name and uid (empty when unset).
pub fn pod_identity(pod: &Pod) -> (&str, &str, &str) {
    let meta = &pod.metadata;
    (
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or(""),
        meta.uid.as_deref().unwrap_or(""),
    )
}

/// `<pod_log_dir>/<namespace>_<name>_<uid>`, as the kubelet names it.
pub fn pod_log_directory(config: &WorkerConfig, pod: &Pod) -> PathBuf {
    let (ns, name, uid) = pod_identity(pod);
    config.pod_log_dir.join(format!("{ns}_{name}_{uid}"))
}

/// The labels naming the pod and this node, on every sandbox and container.
pub fn pod_labels(config: &WorkerConfig, pod: &Pod) -> BTreeMap<String, String> {
    let (ns, name, uid) = pod_identity(pod);
    BTreeMap::from([
        (LABEL_POD_NAME.to_string(), name.to_string()),
        (LABEL_POD_NAMESPACE.to_string(), ns.to_string()),
        (LABEL_POD_UID.to_string(), uid.to_string()),
        (LABEL_NODE.to_string(), config.node_name.clone()),
    ])
}

/// The sandbox for `pod`, its `attempt`-th.
pub fn sandbox_spec(config: &WorkerConfig, pod: &Pod, attempt: u32) -> SandboxSpec {
    let (ns, name, uid) = pod_identity(pod);
    let spec = pod.spec.clone().unwrap_or_default();
    let mut labels = pod.metadata.labels.clone().unwrap_or_default();
    labels.extend(pod_labels(config, pod));
    // A pod on the host's network has the host's name (the runtime cannot
    // set one without a UTS namespace of its own), as the kubelet leaves it.
    let mut hostname = match spec.host_network {
        Some(true) => String::new(),
        _ => spec.hostname.clone().unwrap_or_else(|| name.to_string()),
    };
    hostname.truncate(63);
    let port_mappings = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.unwrap_or(0) > 0)
        .map(|p| PortMapping {
            protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_string()),
            container_port: p.container_port.clamp(0, u16::MAX as i32) as u16,
            host_port: p.host_port.unwrap_or(0).clamp(0, u16::MAX as i32) as u16,
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect();
    let qos = match qos_class(pod) {
        "Guaranteed" => String::new(),
        "Burstable" => "burstable/".to_string(),
        _ => "besteffort/".to_string(),
    };
    SandboxSpec {
        name: name.to_string(),
        namespace: ns.to_string(),
        uid: uid.to_string(),
        attempt,
        hostname,
        log_directory: pod_log_directory(config, pod).to_string_lossy().into_owned(),
        dns: dns_config(config, pod),
        port_mappings,
        labels,
        annotations: pod.metadata.annotations.clone().unwrap_or_default(),
        cgroup_parent: format!("{}/{qos}pod{uid}", config.cgroup_root.trim_end_matches('/')),
        host_network: spec.host_network.unwrap_or(false),
        share_process_namespace: spec.share_process_namespace.unwrap_or(false),
        host_pid: spec.host_pid.unwrap_or(false),
        host_ipc: spec.host_ipc.unwrap_or(false),
        privileged: super::security::has_privileged_container(pod),
        sysctls: super::security::sysctls(pod),
    }
}

/// resolv.conf for the pod by its `dnsPolicy` and `dnsConfig`.
pub fn dns_config(config: &WorkerConfig, pod: &Pod) -> DnsConfig {
    let (ns, _, _) = pod_identity(pod);
    let spec = pod.spec.clone().unwrap_or_default();
    let host_network = spec.host_network.unwrap_or(false);
    let policy = spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
    let cluster = match policy {
        "ClusterFirstWithHostNet" => true,
        "ClusterFirst" => !host_network,
        _ => false,
    };
    let mut dns = if policy == "None" {
        DnsConfig::default()
    } else if cluster && !config.cluster_dns.is_empty() {
        let domain = &config.cluster_domain;
        let mut searches = vec![format!("{ns}.svc.{domain}"), format!("svc.{domain}"), domain.clone()];
        searches.extend(config.host_dns.searches.iter().cloned());
        DnsConfig { servers: config.cluster_dns.clone(), searches, options: vec!["ndots:5".to_string()] }
    } else {
        config.host_dns.clone()
    };
    if let Some(extra) = &spec.dns_config {
        for server in extra.nameservers.iter().flatten() {
            if !dns.servers.contains(server) {
                dns.servers.push(server.clone());
            }
        }
        for search in extra.searches.iter().flatten() {
            if !dns.searches.contains(search) {
                dns.searches.push(search.clone());
            }
        }
        for option in extra.options.iter().flatten() {
            let Some(name) = option.name.as_deref() else { continue };
            dns.options.retain(|o| o.split(':').next() != Some(name));
            dns.options.push(match &option.value {
                Some(value) => format!("{name}:{value}"),
                None => name.to_string(),
            });
        }
    }
    dns
}

/// What a container's spec is made with besides the pod.
pub struct ContainerInputs<'a> {
    /// The agent's configuration.
    pub config: &'a WorkerConfig,
    /// ConfigMaps, Secrets, Service variables.
    pub resources: &'a dyn PodResources,
    /// The sandbox's IP (the host's with hostNetwork).
    pub pod_ip: &'a str,
    /// Its bind mounts, from the volumes.
    pub mounts: Vec<Mount>,
    /// Its attempt (= its restart count).
    pub attempt: u32,
}

/// The spec of `container` of `pod`.
pub fn container_spec(
    pod: &Pod,
    container: &Container,
    inputs: ContainerInputs<'_>,
) -> Result<ContainerSpec, ConfigError> {
    let envs = environment(pod, container, inputs.config, inputs.resources, inputs.pod_ip)?;
    let vars: HashMap<String, String> = envs.iter().cloned().collect();
    let expand_all =
        |args: &Option<Vec<String>>| -> Vec<String> { args.iter().flatten().map(|a| expand(a, &[&vars])).collect() };
    let mut labels = pod_labels(inputs.config, pod);
    labels.insert(LABEL_CONTAINER_NAME.to_string(), container.name.clone());
    let mut annotations = BTreeMap::from([
        (ANNOTATION_RESTART_COUNT.to_string(), inputs.attempt.to_string()),
        (ANNOTATION_HASH.to_string(), container_hash(container)),
    ]);
    if let Some(path) = &container.termination_message_path {
        annotations.insert("io.kubernetes.container.terminationMessagePath".to_string(), path.clone());
    }
    Ok(ContainerSpec {
        name: container.name.clone(),
        attempt: inputs.attempt,
        image: container.image.clone().unwrap_or_default(),
        command: expand_all(&container.command),
        args: expand_all(&container.args),
        working_dir: container.working_dir.clone().unwrap_or_default(),
        envs,
        mounts: inputs.mounts,
        labels,
        annotations,
        log_path: format!("{}/{}.log", container.name, inputs.attempt),
        resources: cgroup_resources(container.resources.as_ref()),
        stdin: container.stdin.unwrap_or(false),
        tty: container.tty.unwrap_or(false),
        // The target's runtime id is known only where it runs: the worker
        // sets it.
        pid_target: None,
        security: super::security::security_spec(inputs.config, pod, container),
    })
}

/// CPU and memory limits as cgroups take them: a CPU limit becomes a CFS
/// quota over a 100 ms period, the request (the limit if none) becomes
/// shares (1024 per core, at least 2), a memory limit becomes bytes.
pub fn cgroup_resources(resources: Option<&ResourceRequirements>) -> ContainerResources {
    let get = |which: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>, key: &str| {
        which.and_then(|m| m.get(key)).and_then(|q| parse_quantity(&q.0))
    };
    let limits = resources.and_then(|r| r.limits.as_ref());
    let requests = resources.and_then(|r| r.requests.as_ref());
    let cpu_limit = get(limits, "cpu");
    let cpu_request = get(requests, "cpu").or(cpu_limit);
    let mut out = ContainerResources::default();
    if let Some(cores) = cpu_limit {
        let millis = (cores * 1000.0).ceil() as i64;
        out.cpu_period = 100_000;
        out.cpu_quota = (millis * 100_000 / 1000).max(1000);
    }
    out.cpu_shares = match cpu_request {
        Some(cores) => (((cores * 1000.0).ceil() as i64) * 1024 / 1000).max(2),
        None => 2,
    };
    if let Some(bytes) = get(limits, "memory") {
        out.memory_limit_in_bytes = bytes.ceil() as i64;
    }
    out
}

/// A quantity ("100m", "1.5", "128Mi", "1G", "1e3") in base units.
pub fn parse_quantity(text: &str) -> Option<f64> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let scale = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exponent if exponent.starts_with(['e', 'E']) => 10f64.powi(exponent[1..].parse().ok()?),
        _ => return None,
    };
    Some(number * scale)
}

/// The pod's QoS class as the apiserver and kubelet compute it.
pub fn qos_class(pod: &Pod) -> &'static str {
    let Some(spec) = &pod.spec else { return "BestEffort" };
    let mut any = false;
    let mut guaranteed = true;
    for c in spec.init_containers.iter().flatten().chain(spec.containers.iter()) {
        let r = c.resources.clone().unwrap_or_default();
        let limits = r.limits.unwrap_or_default();
        let requests = r.requests.unwrap_or_default();
        for resource in ["cpu", "memory"] {
            let limit = limits.get(resource).and_then(|q| parse_quantity(&q.0));
            let request = requests.get(resource).and_then(|q| parse_quantity(&q.0)).or(limit);
            if limit.is_some() || request.is_some_and(|r| r > 0.0) {
                any = true;
            }
            if limit.is_none() || request != limit {
                guaranteed = false;
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

/// Kubernetes' `$(VAR)` expansion: `$(NAME)` becomes the first mapping's
/// value for NAME, an unknown `$(NAME)` stays as written, `$$` is a
/// literal `$`.
pub fn expand(input: &str, mappings: &[&HashMap<String, String>]) -> String {
    let bytes = input.as_bytes();
    let mut out = String::with_capacity(input.len());
    let mut i = 0;
    let mut literal_start = 0;
    while i < bytes.len() {
        if bytes[i] != b'$' || i + 1 >= bytes.len() {
            i += 1;
            continue;
        }
        match bytes[i + 1] {
            b'$' => {
                out.push_str(&input[literal_start..i]);
                out.push('$');
                i += 2;
                literal_start = i;
            }
            b'(' => match input[i + 2..].find(')') {
                Some(len) => {
                    let name = &input[i + 2..i + 2 + len];
                    out.push_str(&input[literal_start..i]);
                    match mappings.iter().find_map(|m| m.get(name)) {
                        Some(value) => out.push_str(value),
                        None => out.push_str(&input[i..i + 3 + len]),
                    }
                    i += 3 + len;
                    literal_start = i;
                }
                None => i += 1,
            },
            _ => i += 1,
        }
    }
    out.push_str(&input[literal_start..]);
    out
}

/// The container's environment, in kube's order: `envFrom` sources, then
/// `env` (each value expanded against what came before and the Service
/// variables), then the Service variables not already set.
pub fn environment(
    pod: &Pod,
    container: &Container,
    config: &WorkerConfig,
    resources: &dyn PodResources,
    pod_ip: &str,
) -> Result<Vec<(String, String)>, ConfigError> {
    let (ns, _, _) = pod_identity(pod);
    let service_links = pod.spec.as_ref().and_then(|s| s.enable_service_links).unwrap_or(true);
    let service_env: HashMap<String, String> =
        if service_links { resources.service_env(ns).into_iter().collect() } else { HashMap::new() };
    let mut env = OrderedEnv::default();
    for source in container.env_from.iter().flatten() {
        let prefix = source.prefix.clone().unwrap_or_default();
        if let Some(r) = &source.config_map_ref {
            match resources.config_map(ns, &r.name) {
                Some(cm) => {
                    for (k, v) in cm.data.iter().flatten() {
                        env.set(format!("{prefix}{k}"), v.clone());
                    }
                }
                None if r.optional.unwrap_or(false) => {}
                None => return Err(ConfigError::ConfigMapNotFound { name: r.name.clone() }),
            }
        }
        if let Some(r) = &source.secret_ref {
            match resources.secret(ns, &r.name) {
                Some(secret) => {
                    for (k, v) in secret.data.iter().flatten() {
                        env.set(format!("{prefix}{k}"), String::from_utf8_lossy(&v.0).into_owned());
                    }
                    for (k, v) in secret.string_data.iter().flatten() {
                        env.set(format!("{prefix}{k}"), v.clone());
                    }
                }
                None if r.optional.unwrap_or(false) => {}
                None => return Err(ConfigError::SecretNotFound { name: r.name.clone() }),
            }
        }
    }
    for var in container.env.iter().flatten() {
        let value = match &var.value_from {
            None => {
                let so_far = env.map();
                expand(var.value.as_deref().unwrap_or(""), &[&so_far, &service_env])
            }
            Some(from) => {
                if let Some(r) = &from.field_ref {
                    field_value(pod, &r.field_path, config, pod_ip)?
                } else if let Some(r) = &from.resource_field_ref {
                    resource_value(pod, Some(container), r, config)?
                } else if let Some(r) = &from.config_map_key_ref {
                    let optional = r.optional.unwrap_or(false);
                    match resources.config_map(ns, &r.name) {
                        Some(cm) => match cm.data.as_ref().and_then(|d| d.get(&r.key)) {
                            Some(v) => v.clone(),
                            None if optional => continue,
                            None => {
                                return Err(ConfigError::ConfigMapKeyNotFound {
                                    namespace: ns.to_string(),
                                    name: r.name.clone(),
                                    key: r.key.clone(),
                                })
                            }
                        },
                        None if optional => continue,
                        None => return Err(ConfigError::ConfigMapNotFound { name: r.name.clone() }),
                    }
                } else if let Some(r) = &from.secret_key_ref {
                    let optional = r.optional.unwrap_or(false);
                    match resources.secret(ns, &r.name) {
                        Some(secret) => match secret_value(&secret, &r.key) {
                            Some(v) => v,
                            None if optional => continue,
                            None => {
                                return Err(ConfigError::SecretKeyNotFound {
                                    namespace: ns.to_string(),
                                    name: r.name.clone(),
                                    key: r.key.clone(),
                                })
                            }
                        },
                        None if optional => continue,
                        None => return Err(ConfigError::SecretNotFound { name: r.name.clone() }),
                    }
                } else {
                    String::new()
                }
            }
        };
        env.set(var.name.clone(), value);
    }
    let mut service: Vec<_> = service_env.into_iter().collect();
    service.sort();
    for (k, v) in service {
        if !env.contains(&k) {
            env.set(k, v);
        }
    }
    Ok(env.vars)
}

/// A Secret's value for `key`, from `data` or `stringData`.
pub fn secret_value(secret: &k8s_openapi::api::core::v1::Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        .or_else(|| secret.string_data.as_ref().and_then(|d| d.get(key)).cloned())
}

/// Environment variables in insertion order; setting one again replaces
/// its value in place, as kube does.
#[derive(Default)]
struct OrderedEnv {
    vars: Vec<(String, String)>,
}

impl OrderedEnv {
    fn set(&mut self, name: String, value: String) {
        match self.vars.iter_mut().find(|(k, _)| *k == name) {
            Some(slot) => slot.1 = value,
            None => self.vars.push((name, value)),
        }
    }

    fn contains(&self, name: &str) -> bool {
        self.vars.iter().any(|(k, _)| k == name)
    }

    fn map(&self) -> HashMap<String, String> {
        self.vars.iter().cloned().collect()
    }
}

/// A downward API `fieldRef`'s value.
pub fn field_value(pod: &Pod, path: &str, config: &WorkerConfig, pod_ip: &str) -> Result<String, ConfigError> {
    let (ns, name, uid) = pod_identity(pod);
    let spec = pod.spec.clone().unwrap_or_default();
    let meta = &pod.metadata;
    let subscript = |prefix: &str| -> Option<String> {
        let rest = path.strip_prefix(prefix)?.strip_prefix('[')?.strip_suffix(']')?;
        Some(rest.trim_matches(|c| c == '\'' || c == '"').to_string())
    };
    let value = match path {
        "metadata.name" => name.to_string(),
        "metadata.namespace" => ns.to_string(),
        "metadata.uid" => uid.to_string(),
        "metadata.labels" => map_lines(meta.labels.as_ref()),
        "metadata.annotations" => map_lines(meta.annotations.as_ref()),
        "spec.nodeName" => spec.node_name.clone().unwrap_or_else(|| config.node_name.clone()),
        "spec.serviceAccountName" => spec.service_account_name.clone().unwrap_or_default(),
        "status.podIP" | "status.podIPs" => pod_ip.to_string(),
        "status.hostIP" | "status.hostIPs" => config.host_ip.clone(),
        _ => {
            if let Some(key) = subscript("metadata.labels") {
                meta.labels.as_ref().and_then(|l| l.get(&key)).cloned().unwrap_or_default()
            } else if let Some(key) = subscript("metadata.annotations") {
                meta.annotations.as_ref().and_then(|l| l.get(&key)).cloned().unwrap_or_default()
            } else {
                return Err(ConfigError::FieldPath(path.to_string()));
            }
        }
    };
    Ok(value)
}

/// `key="value"` lines, sorted, as the downward API writes maps.
fn map_lines(map: Option<&BTreeMap<String, String>>) -> String {
    map.iter().flat_map(|m| m.iter()).map(|(k, v)| format!("{k}={v:?}\n")).collect()
}

/// A downward API `resourceFieldRef`'s value: the container's request or
/// limit (a missing limit is the node's allocatable) divided by the
/// divisor, rounded up.
pub fn resource_value(
    pod: &Pod,
    current: Option<&Container>,
    selector: &k8s_openapi::api::core::v1::ResourceFieldSelector,
    config: &WorkerConfig,
) -> Result<String, ConfigError> {
    let spec = pod.spec.clone().unwrap_or_default();
    let container = match selector.container_name.as_deref().filter(|n| !n.is_empty()) {
        Some(name) => spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .find(|c| c.name == name)
            .cloned()
            .ok_or_else(|| ConfigError::ResourceField(format!("no container {name}")))?,
        None => current.cloned().ok_or_else(|| ConfigError::ResourceField("containerName is required".to_string()))?,
    };
    let resources = container.resources.unwrap_or_default();
    let (kind, resource) =
        selector.resource.split_once('.').ok_or_else(|| ConfigError::ResourceField(selector.resource.clone()))?;
    let limit = resources.limits.as_ref().and_then(|m| m.get(resource)).and_then(|q| parse_quantity(&q.0));
    let request = resources.requests.as_ref().and_then(|m| m.get(resource)).and_then(|q| parse_quantity(&q.0));
    let allocatable = match resource {
        "cpu" => config.node_cpu_cores,
        "memory" => config.node_memory_bytes as f64,
        "ephemeral-storage" => config.node_ephemeral_storage_bytes as f64,
        other => return Err(ConfigError::ResourceField(other.to_string())),
    };
    let value = match kind {
        "limits" => limit.unwrap_or(allocatable),
        "requests" => request.or(limit).unwrap_or(0.0),
        other => return Err(ConfigError::ResourceField(other.to_string())),
    };
    let divisor = selector.divisor.as_ref().and_then(|q| parse_quantity(&q.0)).filter(|d| *d > 0.0).unwrap_or(1.0);
    // Rounding against float noise: 0.5 cores / 1m is 500, not 500.0000001.
    let scaled = value / divisor;
    let rounded = if (scaled - scaled.round()).abs() < 1e-9 { scaled.round() } else { scaled.ceil() };
    Ok(format!("{}", rounded as i64))
}
