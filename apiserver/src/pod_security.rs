//! PodSecurity admission, as Kubernetes' built-in plugin enforces the Pod
//! Security Standards: a namespace labelled
//! `pod-security.kubernetes.io/enforce: baseline` (or `restricted`) refuses
//! pods that break that level, with Kubernetes' message
//! (`violates PodSecurity "baseline:latest": host namespaces
//! (hostNetwork=true), ...`). Unlabelled namespaces are `privileged`
//! (nothing is checked); an unknown level enforces `restricted`, as
//! Kubernetes does. Pods are checked when created and when an update
//! changes their spec. The `warn` mode
//! (`pod-security.kubernetes.io/warn`) lets such a pod in with a warning
//! (`would violate PodSecurity ...`, which kubectl prints), and the `audit`
//! mode (`pod-security.kubernetes.io/audit`) lets it in with the violation
//! recorded in the request's audit event, under Kubernetes' annotation
//! `pod-security.kubernetes.io/audit-violations`; every pod checked also
//! records the level enforced (`pod-security.kubernetes.io/enforce-policy`).
//! The `*-version` labels only name the version in messages: every check is
//! the latest one.

use serde_json::Value;
use skiff_api::resources::{self, Kind};
use skiff_api::ApiError;

use crate::admission::{forbidden, Attributes};
use crate::registry::Context;
use crate::storage::ObjectStore;

const ENFORCE: &str = "pod-security.kubernetes.io/enforce";
const ENFORCE_VERSION: &str = "pod-security.kubernetes.io/enforce-version";
const WARN: &str = "pod-security.kubernetes.io/warn";
const WARN_VERSION: &str = "pod-security.kubernetes.io/warn-version";
const AUDIT: &str = "pod-security.kubernetes.io/audit";
const AUDIT_VERSION: &str = "pod-security.kubernetes.io/audit-version";
/// The audit annotations Kubernetes' plugin writes.
const AUDIT_VIOLATIONS: &str = "pod-security.kubernetes.io/audit-violations";
const ENFORCE_POLICY: &str = "pod-security.kubernetes.io/enforce-policy";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    Privileged,
    Baseline,
    Restricted,
}

impl Level {
    fn parse(label: Option<&str>) -> Level {
        match label {
            None | Some("privileged") => Level::Privileged,
            Some("baseline") => Level::Baseline,
            // Anything else is the most restrictive, as in Kubernetes.
            Some(_) => Level::Restricted,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }
}

/// The labels of a stored Namespace, without decoding the rest of it (its
/// managed fields, its status) on every pod create.
fn namespace_labels(json: &[u8]) -> Result<Value, ApiError> {
    #[derive(serde::Deserialize)]
    struct Namespace {
        #[serde(default)]
        metadata: Metadata,
    }
    #[derive(serde::Deserialize, Default)]
    struct Metadata {
        #[serde(default)]
        labels: Value,
    }
    serde_json::from_slice::<Namespace>(json)
        .map(|n| n.metadata.labels)
        .map_err(|e| ApiError::internal(format!("stored namespace is not JSON: {e}")))
}

/// Refuses a pod write that breaks its namespace's enforced level, warns
/// `ctx` of one that breaks its warned level, and records in its audit
/// event one that breaks its audited level.
pub(crate) async fn admit(
    objects: &ObjectStore,
    ctx: &Context,
    attrs: &Attributes<'_>,
    pod: &Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    if attrs.resource.kind_id != Kind::Pod || !attrs.subresource.is_empty() {
        return Ok(());
    }
    if !matches!(attrs.verb, "create" | "update" | "patch") || old.is_some_and(|o| o["spec"] == pod["spec"]) {
        return Ok(());
    }
    let key = resources::of(Kind::Namespace).key(None, attrs.namespace);
    let Some(namespace) = objects.get(&key, 0).await?.0 else { return Ok(()) };
    let labels = &namespace_labels(&namespace.json)?;
    if let Some(warned) = labels[WARN].as_str().map(|l| Level::parse(Some(l))) {
        let found = violations(warned, pod);
        if !found.is_empty() {
            let version = labels[WARN_VERSION].as_str().unwrap_or("latest");
            ctx.warn(format!("would violate PodSecurity \"{}:{version}\": {}", warned.name(), found.join(", ")));
        }
    }
    if let Some(audited) = labels[AUDIT].as_str().map(|l| Level::parse(Some(l))) {
        let found = violations(audited, pod);
        if !found.is_empty() {
            let version = labels[AUDIT_VERSION].as_str().unwrap_or("latest");
            let violation = format!("would violate PodSecurity \"{}:{version}\": {}", audited.name(), found.join(", "));
            ctx.annotate_audit(AUDIT_VIOLATIONS, violation);
        }
    }
    let level = Level::parse(labels[ENFORCE].as_str());
    let version = labels[ENFORCE_VERSION].as_str().unwrap_or("latest");
    ctx.annotate_audit(ENFORCE_POLICY, format!("{}:{version}", level.name()));
    let found = violations(level, pod);
    if found.is_empty() {
        return Ok(());
    }
    Err(forbidden(attrs, &format!("violates PodSecurity \"{}:{version}\": {}", level.name(), found.join(", "))))
}

/// Baseline's capabilities a container may add.
const BASELINE_CAPABILITIES: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

const SAFE_SYSCTLS: [&str; 10] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

const SELINUX_TYPES: [&str; 5] = ["", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"];

const RESTRICTED_VOLUMES: [&str; 8] =
    ["configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"];

/// `container "a"` or `containers "a", "b"`.
fn containers(names: &[String]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
    match quoted.len() {
        1 => format!("container {}", quoted[0]),
        _ => format!("containers {}", quoted.join(", ")),
    }
}

/// Every way `pod` breaks `level`, as `reason (detail)`.
pub(crate) fn violations(level: Level, pod: &Value) -> Vec<String> {
    if level == Level::Privileged {
        return Vec::new();
    }
    let spec = &pod["spec"];
    let pod_sc = &spec["securityContext"];
    let all: Vec<&Value> = ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|f| spec[*f].as_array().into_iter().flatten())
        .collect();
    let name = |c: &Value| c["name"].as_str().unwrap_or_default().to_string();
    let names_where =
        |test: &dyn Fn(&Value) -> bool| -> Vec<String> { all.iter().filter(|c| test(c)).map(|c| name(c)).collect() };
    let mut out = Vec::new();

    // ---- baseline
    let host: Vec<String> = ["hostNetwork", "hostPID", "hostIPC"]
        .iter()
        .filter(|f| spec[**f] == Value::Bool(true))
        .map(|f| format!("{f}=true"))
        .collect();
    if !host.is_empty() {
        out.push(format!("host namespaces ({})", host.join(", ")));
    }
    let privileged = names_where(&|c| c["securityContext"]["privileged"] == Value::Bool(true));
    if !privileged.is_empty() {
        out.push(format!("privileged ({} must not set securityContext.privileged=true)", containers(&privileged)));
    }
    let added = |c: &Value| -> Vec<String> {
        c["securityContext"]["capabilities"]["add"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect()
    };
    let mut extra_caps: Vec<String> = Vec::new();
    let with_extra = names_where(&|c| added(c).iter().any(|a| !BASELINE_CAPABILITIES.contains(&a.as_str())));
    for c in &all {
        extra_caps.extend(added(c).into_iter().filter(|a| !BASELINE_CAPABILITIES.contains(&a.as_str())));
    }
    extra_caps.sort();
    extra_caps.dedup();
    if !with_extra.is_empty() {
        let caps: Vec<String> = extra_caps.iter().map(|c| format!("{c:?}")).collect();
        out.push(format!(
            "non-default capabilities ({} must not include {} in securityContext.capabilities.add)",
            containers(&with_extra),
            caps.join(", ")
        ));
    }
    let volumes: Vec<&Value> = spec["volumes"].as_array().into_iter().flatten().collect();
    let host_paths: Vec<String> = volumes
        .iter()
        .filter(|v| v.get("hostPath").is_some())
        .map(|v| format!("{:?}", v["name"].as_str().unwrap_or_default()))
        .collect();
    if !host_paths.is_empty() {
        let noun = if host_paths.len() == 1 { "volume" } else { "volumes" };
        out.push(format!("hostPath volumes ({noun} {})", host_paths.join(", ")));
    }
    let mut host_ports = Vec::new();
    for c in &all {
        for p in c["ports"].as_array().into_iter().flatten() {
            if let Some(port) = p["hostPort"].as_i64().filter(|p| *p != 0) {
                host_ports.push((name(c), port));
            }
        }
    }
    if !host_ports.is_empty() {
        let list: Vec<String> = host_ports.iter().map(|(c, p)| format!("container {c:?} uses hostPort {p}")).collect();
        out.push(format!("hostPort ({})", list.join(", ")));
    }
    let unconfined = |sc: &Value, field: &str| sc[field]["type"].as_str() == Some("Unconfined");
    if unconfined(pod_sc, "appArmorProfile") || all.iter().any(|c| unconfined(&c["securityContext"], "appArmorProfile"))
    {
        out.push("forbidden AppArmor profile (appArmorProfile.type=\"Unconfined\")".into());
    }
    let bad_selinux = |sc: &Value| {
        let o = &sc["seLinuxOptions"];
        !SELINUX_TYPES.contains(&o["type"].as_str().unwrap_or_default())
            || o["user"].as_str().is_some_and(|u| !u.is_empty())
            || o["role"].as_str().is_some_and(|r| !r.is_empty())
    };
    if bad_selinux(pod_sc) || all.iter().any(|c| bad_selinux(&c["securityContext"])) {
        out.push("seLinuxOptions (the type, user and role of seLinuxOptions are restricted)".into());
    }
    let unmasked = names_where(&|c| c["securityContext"]["procMount"].as_str().is_some_and(|p| p != "Default"));
    if !unmasked.is_empty() {
        out.push(format!(
            "procMount ({} must not set securityContext.procMount to \"Unmasked\")",
            containers(&unmasked)
        ));
    }
    if unconfined(pod_sc, "seccompProfile") {
        out.push("seccompProfile (pod must not set securityContext.seccompProfile.type to \"Unconfined\")".into());
    }
    let seccomp_unconfined = names_where(&|c| unconfined(&c["securityContext"], "seccompProfile"));
    if !seccomp_unconfined.is_empty() {
        out.push(format!(
            "seccompProfile ({} must not set securityContext.seccompProfile.type to \"Unconfined\")",
            containers(&seccomp_unconfined)
        ));
    }
    let sysctls: Vec<&str> = pod_sc["sysctls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["name"].as_str())
        .filter(|s| !SAFE_SYSCTLS.contains(s))
        .collect();
    if !sysctls.is_empty() {
        out.push(format!("forbidden sysctls ({})", sysctls.join(", ")));
    }
    if level == Level::Baseline {
        return out;
    }

    // ---- restricted
    for v in &volumes {
        let kind = v.as_object().and_then(|o| o.keys().find(|k| *k != "name").cloned()).unwrap_or_default();
        if !RESTRICTED_VOLUMES.contains(&kind.as_str()) {
            out.push(format!(
                "restricted volume types (volume {:?} uses restricted volume type {kind:?})",
                v["name"].as_str().unwrap_or_default()
            ));
        }
    }
    let escalating = names_where(&|c| c["securityContext"]["allowPrivilegeEscalation"] != Value::Bool(false));
    if !escalating.is_empty() {
        out.push(format!(
            "allowPrivilegeEscalation != false ({} must set securityContext.allowPrivilegeEscalation=false)",
            containers(&escalating)
        ));
    }
    let pod_non_root = pod_sc["runAsNonRoot"] == Value::Bool(true);
    let root_possible = names_where(&|c| match &c["securityContext"]["runAsNonRoot"] {
        Value::Bool(b) => !b,
        _ => !pod_non_root,
    });
    if !root_possible.is_empty() {
        out.push(format!(
            "runAsNonRoot != true (pod or {} must set securityContext.runAsNonRoot=true)",
            containers(&root_possible)
        ));
    }
    if pod_sc["runAsUser"] == 0 {
        out.push("runAsUser=0 (pod must not set runAsUser=0)".into());
    }
    let as_root = names_where(&|c| c["securityContext"]["runAsUser"] == 0);
    if !as_root.is_empty() {
        out.push(format!("runAsUser=0 ({} must not set runAsUser=0)", containers(&as_root)));
    }
    let confined = |sc: &Value| matches!(sc["seccompProfile"]["type"].as_str(), Some("RuntimeDefault" | "Localhost"));
    let pod_confined = confined(pod_sc);
    let unset = names_where(&|c| {
        let sc = &c["securityContext"];
        if sc["seccompProfile"].is_null() {
            !pod_confined
        } else {
            !confined(sc)
        }
    });
    if !unset.is_empty() {
        out.push(format!(
            "seccompProfile (pod or {} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")",
            containers(&unset)
        ));
    }
    let keeps_all = names_where(&|c| {
        !c["securityContext"]["capabilities"]["drop"].as_array().is_some_and(|d| d.iter().any(|x| x == "ALL"))
    });
    if !keeps_all.is_empty() {
        out.push(format!(
            "unrestricted capabilities ({} must set securityContext.capabilities.drop=[\"ALL\"])",
            containers(&keeps_all)
        ));
    }
    let adds = names_where(&|c| added(c).iter().any(|a| a != "NET_BIND_SERVICE"));
    if !adds.is_empty() {
        let mut caps: Vec<String> =
            all.iter().flat_map(|c| added(c)).filter(|a| a != "NET_BIND_SERVICE").map(|c| format!("{c:?}")).collect();
        caps.sort();
        caps.dedup();
        out.push(format!(
            "unrestricted capabilities ({} must not include {} in securityContext.capabilities.add)",
            containers(&adds),
            caps.join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: Value) -> Value {
        json!({"metadata": {"name": "p"}, "spec": spec})
    }

    fn restricted_container(name: &str) -> Value {
        json!({"name": name, "image": "i", "securityContext": {"allowPrivilegeEscalation": false,
            "runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}, "capabilities": {"drop": ["ALL"]}}})
    }

    #[test]
    fn a_namespaces_labels_are_read_as_the_whole_object_has_them() {
        let ns = json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "a", "labels": {ENFORCE: "restricted", "x": "y"},
                "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:metadata": {}}}]},
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}});
        for ns in [ns, json!({"metadata": {"name": "b"}}), json!({"kind": "Namespace"})] {
            let labels = namespace_labels(&serde_json::to_vec(&ns).unwrap()).unwrap();
            assert_eq!(labels, ns["metadata"]["labels"]);
        }
        assert!(namespace_labels(b"{not json").is_err());
    }

    #[test]
    fn levels_parse_with_unknown_values_the_most_restrictive() {
        assert_eq!(Level::parse(None), Level::Privileged);
        assert_eq!(Level::parse(Some("baseline")), Level::Baseline);
        assert_eq!(Level::parse(Some("restricted")), Level::Restricted);
        assert_eq!(Level::parse(Some("strict")), Level::Restricted);
    }

    #[test]
    fn baseline_refuses_host_access_privilege_and_extra_capabilities() {
        let p = pod(json!({"hostNetwork": true, "hostPID": true,
            "containers": [
                {"name": "a", "image": "i", "securityContext": {"privileged": true},
                 "ports": [{"containerPort": 80, "hostPort": 8080}]},
                {"name": "b", "image": "i", "securityContext": {"capabilities": {"add": ["NET_ADMIN", "CHOWN"]}}}],
            "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
            "securityContext": {"sysctls": [{"name": "net.core.somaxconn", "value": "1"},
                {"name": "net.ipv4.tcp_syncookies", "value": "1"}]}}));
        assert_eq!(
            violations(Level::Baseline, &p),
            vec![
                "host namespaces (hostNetwork=true, hostPID=true)",
                "privileged (container \"a\" must not set securityContext.privileged=true)",
                "non-default capabilities (container \"b\" must not include \"NET_ADMIN\" in securityContext.capabilities.add)",
                "hostPath volumes (volume \"root\")",
                "hostPort (container \"a\" uses hostPort 8080)",
                "forbidden sysctls (net.core.somaxconn)",
            ]
        );
        assert!(violations(Level::Privileged, &p).is_empty());
        let plain =
            pod(json!({"containers": [{"name": "a", "image": "i"}], "volumes": [{"name": "d", "emptyDir": {}}]}));
        assert!(violations(Level::Baseline, &plain).is_empty());
    }

    #[test]
    fn restricted_requires_non_root_no_escalation_seccomp_and_dropped_capabilities() {
        let plain = pod(json!({"containers": [{"name": "a", "image": "i"}, {"name": "b", "image": "i"}]}));
        assert_eq!(
            violations(Level::Restricted, &plain),
            vec![
                "allowPrivilegeEscalation != false (containers \"a\", \"b\" must set securityContext.allowPrivilegeEscalation=false)",
                "runAsNonRoot != true (pod or containers \"a\", \"b\" must set securityContext.runAsNonRoot=true)",
                "seccompProfile (pod or containers \"a\", \"b\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")",
                "unrestricted capabilities (containers \"a\", \"b\" must set securityContext.capabilities.drop=[\"ALL\"])",
            ]
        );
        let good =
            pod(json!({"containers": [restricted_container("a")], "initContainers": [restricted_container("i")],
            "volumes": [{"name": "s", "secret": {"secretName": "x"}}]}));
        assert!(violations(Level::Restricted, &good).is_empty(), "{:?}", violations(Level::Restricted, &good));
        // Pod-level settings cover containers that leave them unset.
        let mut pod_level =
            pod(json!({"securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "a", "image": "i", "securityContext": {"allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}]}));
        assert!(violations(Level::Restricted, &pod_level).is_empty());
        pod_level["spec"]["containers"][0]["securityContext"]["runAsUser"] = json!(0);
        pod_level["spec"]["volumes"] = json!([{"name": "h", "hostPath": {"path": "/tmp"}}]);
        let found = violations(Level::Restricted, &pod_level);
        assert!(
            found.contains(&"restricted volume types (volume \"h\" uses restricted volume type \"hostPath\")".into()),
            "{found:?}"
        );
        assert!(found.contains(&"runAsUser=0 (container \"a\" must not set runAsUser=0)".into()), "{found:?}");
    }
}
