//! A container's security settings, as the kubelet derives them: the
//! pod's `securityContext` under the container's (users, `runAsNonRoot`,
//! seccomp), the container's own (privileged, capabilities, read-only
//! root, `allowPrivilegeEscalation`), the pod's groups (`fsGroup`,
//! `supplementalGroups`), and the `runAsNonRoot` check against the image's
//! user that the kubelet makes before it creates the container; and the
//! pod's sysctls, which the kubelet admits only when they are safe (or
//! allowed by `--allowed-unsafe-sysctls`) and namespaced apart from the
//! host's.

use k8s_openapi::api::core::v1::{Container, Pod, SeccompProfile};

use super::spec::{ephemeral_containers, pod_identity, ConfigError};
use super::WorkerConfig;
use crate::runtime::{ImageInfo, Seccomp, SecuritySpec};

/// Whether any container of the pod, init and ephemeral ones included, is
/// privileged: its sandbox must then be made for one.
pub fn has_privileged_container(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else { return false };
    let privileged = |c: &Container| c.security_context.as_ref().and_then(|s| s.privileged).unwrap_or(false);
    spec.containers.iter().chain(spec.init_containers.iter().flatten()).any(privileged)
        || ephemeral_containers(pod).iter().any(privileged)
}

/// The security settings of `container` of `pod`, before the image's user
/// is known ([`with_image_user`] adds it).
pub fn security_spec(config: &WorkerConfig, pod: &Pod, container: &Container) -> SecuritySpec {
    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let sc = container.security_context.as_ref();
    let privileged = sc.and_then(|s| s.privileged).unwrap_or(false);
    let capabilities = sc.and_then(|s| s.capabilities.as_ref());
    let mut groups: Vec<i64> = pod_sc.and_then(|p| p.fs_group).into_iter().collect();
    groups.extend(pod_sc.and_then(|p| p.supplemental_groups.clone()).unwrap_or_default());
    let seccomp = sc.and_then(|s| s.seccomp_profile.as_ref()).or(pod_sc.and_then(|p| p.seccomp_profile.as_ref()));
    SecuritySpec {
        privileged,
        run_as_user: sc.and_then(|s| s.run_as_user).or(pod_sc.and_then(|p| p.run_as_user)),
        run_as_username: String::new(),
        run_as_group: sc.and_then(|s| s.run_as_group).or(pod_sc.and_then(|p| p.run_as_group)),
        supplemental_groups: groups,
        readonly_rootfs: sc.and_then(|s| s.read_only_root_filesystem).unwrap_or(false),
        // Set only when asked for: unset means the runtime's default.
        no_new_privs: sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
        add_capabilities: capabilities.and_then(|c| c.add.clone()).unwrap_or_default(),
        drop_capabilities: capabilities.and_then(|c| c.drop.clone()).unwrap_or_default(),
        seccomp: seccomp.map_or(Seccomp::Unconfined, |profile| seccomp_of(config, profile)),
    }
}

fn seccomp_of(config: &WorkerConfig, profile: &SeccompProfile) -> Seccomp {
    match profile.type_.as_str() {
        "RuntimeDefault" => Seccomp::RuntimeDefault,
        "Localhost" => {
            let relative = profile.localhost_profile.as_deref().unwrap_or_default();
            Seccomp::Localhost(config.seccomp_dir.join(relative).to_string_lossy().into_owned())
        }
        _ => Seccomp::Unconfined,
    }
}

/// The image's user where the pod names none, as the kubelet passes it:
/// its uid, or its user name for the runtime to resolve, or root when the
/// image names no user.
pub fn with_image_user(security: &mut SecuritySpec, image: &ImageInfo) {
    if security.run_as_user.is_some() {
        return;
    }
    match (image.uid, image.username.as_str()) {
        (Some(uid), _) => security.run_as_user = Some(uid),
        (None, "") => security.run_as_user = Some(0),
        (None, name) => security.run_as_username = name.to_string(),
    }
}

/// `runAsNonRoot`, checked as the kubelet checks it before creating the
/// container: by the uid the pod asks for, else by the image's user, which
/// must then be numeric.
pub fn verify_run_as_non_root(pod: &Pod, container: &Container, image: &ImageInfo) -> Result<(), ConfigError> {
    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let sc = container.security_context.as_ref();
    let non_root = sc.and_then(|s| s.run_as_non_root).or(pod_sc.and_then(|p| p.run_as_non_root));
    if non_root != Some(true) {
        return Ok(());
    }
    let (ns, name, uid) = pod_identity(pod);
    let pod_name = format!("{name}_{ns}({uid})");
    let container_name = container.name.clone();
    match sc.and_then(|s| s.run_as_user).or(pod_sc.and_then(|p| p.run_as_user)) {
        Some(0) => return Err(ConfigError::RunAsUserIsRoot { pod: pod_name, container: container_name }),
        Some(_) => return Ok(()),
        None => {}
    }
    match (image.uid, image.username.as_str()) {
        (Some(uid), _) if uid != 0 => Ok(()),
        (None, user) if !user.is_empty() => {
            Err(ConfigError::NonNumericImageUser { user: user.to_string(), pod: pod_name, container: container_name })
        }
        _ => Err(ConfigError::ImageRunsAsRoot { pod: pod_name, container: container_name }),
    }
}

/// The sysctls the kubelet allows any pod: namespaced, and unable to hurt
/// other pods or the node.
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

/// Sysctls of the IPC namespace: the host's with `hostIPC`.
fn is_ipc_sysctl(name: &str) -> bool {
    matches!(name, "kernel.sem" | "kernel.shmall" | "kernel.shmmax" | "kernel.shmmni" | "kernel.shm_rmid_forced")
        || name.starts_with("kernel.msg")
        || name.starts_with("fs.mqueue.")
}

/// Why the node refuses the pod's sysctls, in the kubelet's words
/// (`Pod was rejected: ...`, reason `SysctlForbidden`); `allowed_unsafe`
/// holds names, or prefixes ending in `*`.
pub fn forbidden_sysctl(pod: &Pod, allowed_unsafe: &[String]) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let sysctls = spec.security_context.as_ref()?.sysctls.as_ref()?;
    for sysctl in sysctls {
        // Either separator is accepted, as the kubelet accepts it.
        let name = sysctl.name.replace('/', ".");
        let allowed = SAFE_SYSCTLS.contains(&name.as_str())
            || allowed_unsafe.iter().any(|pattern| match pattern.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => *pattern == name,
            });
        if !allowed {
            return Some(format!("forbidden sysctl: \"{}\" not allowlisted", sysctl.name));
        }
        if is_ipc_sysctl(&name) {
            if spec.host_ipc == Some(true) {
                return Some(format!("sysctl \"{}\" not allowed with host ipc enabled", sysctl.name));
            }
        } else if name.starts_with("net.") {
            if spec.host_network == Some(true) {
                return Some(format!("sysctl \"{}\" not allowed with host net enabled", sysctl.name));
            }
        } else {
            return Some(format!("forbidden sysctl: \"{}\" not namespaced", sysctl.name));
        }
    }
    None
}

/// The pod's sysctls, for its sandbox, by their dotted names.
pub fn sysctls(pod: &Pod) -> std::collections::BTreeMap<String, String> {
    let listed = pod.spec.as_ref().and_then(|s| s.security_context.as_ref()).and_then(|s| s.sysctls.as_ref());
    listed.into_iter().flatten().map(|s| (s.name.replace('/', "."), s.value.clone())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "prod", "uid": "u-1"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn image(uid: Option<i64>, username: &str) -> ImageInfo {
        ImageInfo { id: "sha256:1".into(), repo_tags: vec![], size: 0, uid, username: username.into() }
    }

    fn first(pod: &Pod) -> Container {
        pod.spec.as_ref().unwrap().containers[0].clone()
    }

    #[test]
    fn the_container_overrides_the_pod_and_groups_come_from_the_pod() {
        let p = pod(serde_json::json!({
            "securityContext": {
                "runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000, "supplementalGroups": [4000, 5000],
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [{
                "name": "c",
                "securityContext": {
                    "runAsUser": 1001, "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                    "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
                },
            }],
        }));
        let s = security_spec(&WorkerConfig::default(), &p, &first(&p));
        assert_eq!(s.run_as_user, Some(1001));
        assert_eq!(s.run_as_group, Some(3000));
        assert_eq!(s.supplemental_groups, vec![2000, 4000, 5000]);
        assert!(s.readonly_rootfs && s.no_new_privs && !s.privileged);
        assert_eq!(s.add_capabilities, vec!["NET_BIND_SERVICE"]);
        assert_eq!(s.drop_capabilities, vec!["ALL"]);
        assert_eq!(s.seccomp, Seccomp::RuntimeDefault);
    }

    #[test]
    fn unset_fields_leave_the_runtime_its_defaults() {
        let p = pod(serde_json::json!({"containers": [{"name": "c"}]}));
        let s = security_spec(&WorkerConfig::default(), &p, &first(&p));
        assert_eq!(s, SecuritySpec::default());
        // allowPrivilegeEscalation: true (or unset) never sets no_new_privs.
        let p = pod(
            serde_json::json!({"containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": true}}]}),
        );
        assert!(!security_spec(&WorkerConfig::default(), &p, &first(&p)).no_new_privs);
    }

    #[test]
    fn a_localhost_seccomp_profile_is_found_under_the_agents_directory() {
        let p = pod(serde_json::json!({"containers": [{"name": "c", "securityContext": {
            "seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/audit.json"},
        }}]}));
        let config = WorkerConfig { seccomp_dir: "/data/seccomp".into(), ..WorkerConfig::default() };
        let s = security_spec(&config, &p, &first(&p));
        assert_eq!(s.seccomp, Seccomp::Localhost("/data/seccomp/profiles/audit.json".into()));
    }

    #[test]
    fn one_privileged_container_anywhere_makes_the_sandbox_privileged() {
        let plain = pod(serde_json::json!({"containers": [{"name": "c"}]}));
        assert!(!has_privileged_container(&plain));
        let init = pod(serde_json::json!({
            "initContainers": [{"name": "i", "securityContext": {"privileged": true}}],
            "containers": [{"name": "c"}],
        }));
        assert!(has_privileged_container(&init));
        let debug = pod(serde_json::json!({
            "containers": [{"name": "c"}],
            "ephemeralContainers": [{"name": "d", "securityContext": {"privileged": true}}],
        }));
        assert!(has_privileged_container(&debug));
    }

    #[test]
    fn the_image_user_fills_in_where_the_pod_names_none() {
        let mut s = SecuritySpec::default();
        with_image_user(&mut s, &image(Some(65534), ""));
        assert_eq!(s.run_as_user, Some(65534));
        let mut s = SecuritySpec::default();
        with_image_user(&mut s, &image(None, "nobody"));
        assert_eq!((s.run_as_user, s.run_as_username.as_str()), (None, "nobody"));
        let mut s = SecuritySpec::default();
        with_image_user(&mut s, &image(None, ""));
        assert_eq!(s.run_as_user, Some(0));
        let mut s = SecuritySpec { run_as_user: Some(7), ..SecuritySpec::default() };
        with_image_user(&mut s, &image(Some(65534), ""));
        assert_eq!(s.run_as_user, Some(7));
    }

    #[test]
    fn run_as_non_root_is_checked_against_the_pod_then_the_image() {
        let non_root = |extra: serde_json::Value| {
            let mut sc = serde_json::json!({"runAsNonRoot": true});
            sc.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            pod(serde_json::json!({"containers": [{"name": "c", "securityContext": sc}]}))
        };
        let root_image = image(None, "");
        let p = non_root(serde_json::json!({"runAsUser": 1000}));
        assert_eq!(verify_run_as_non_root(&p, &first(&p), &root_image), Ok(()));
        let p = non_root(serde_json::json!({"runAsUser": 0}));
        let e = verify_run_as_non_root(&p, &first(&p), &root_image).unwrap_err();
        assert_eq!(
            e.to_string(),
            "container's runAsUser breaks non-root policy (pod: \"web_prod(u-1)\", container: c)"
        );
        let p = non_root(serde_json::json!({}));
        let e = verify_run_as_non_root(&p, &first(&p), &root_image).unwrap_err();
        assert_eq!(
            e.to_string(),
            "container has runAsNonRoot and image will run as root (pod: \"web_prod(u-1)\", container: c)"
        );
        assert!(verify_run_as_non_root(&p, &first(&p), &image(Some(0), "")).is_err());
        assert_eq!(verify_run_as_non_root(&p, &first(&p), &image(Some(65534), "")), Ok(()));
        let e = verify_run_as_non_root(&p, &first(&p), &image(None, "nobody")).unwrap_err();
        assert!(e.to_string().contains("image has non-numeric user (nobody), cannot verify user is non-root"), "{e}");
        // The pod's runAsNonRoot applies to containers that say nothing.
        let p = pod(serde_json::json!({"securityContext": {"runAsNonRoot": true}, "containers": [{"name": "c"}]}));
        assert!(verify_run_as_non_root(&p, &first(&p), &root_image).is_err());
        let p = pod(serde_json::json!({"containers": [{"name": "c"}]}));
        assert_eq!(verify_run_as_non_root(&p, &first(&p), &root_image), Ok(()));
    }

    #[test]
    fn safe_sysctls_pass_and_others_need_the_flag_and_a_namespace() {
        let with = |extra: serde_json::Value, sysctls: serde_json::Value| {
            let mut spec = serde_json::json!({"securityContext": {"sysctls": sysctls}, "containers": [{"name": "c"}]});
            spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            pod(spec)
        };
        let none: &[String] = &[];
        let safe = with(
            serde_json::json!({}),
            serde_json::json!([{"name": "net.ipv4.ip_local_port_range", "value": "40000 50000"}]),
        );
        assert_eq!(forbidden_sysctl(&safe, none), None);
        assert_eq!(sysctls(&safe).get("net.ipv4.ip_local_port_range").map(String::as_str), Some("40000 50000"));
        let unsafe_ = with(serde_json::json!({}), serde_json::json!([{"name": "kernel.msgmax", "value": "65536"}]));
        assert_eq!(
            forbidden_sysctl(&unsafe_, none).as_deref(),
            Some("forbidden sysctl: \"kernel.msgmax\" not allowlisted")
        );
        assert_eq!(forbidden_sysctl(&unsafe_, &["kernel.msg*".to_string()]), None);
        assert_eq!(forbidden_sysctl(&unsafe_, &["kernel.msgmax".to_string()]), None);
        let host_ipc =
            with(serde_json::json!({"hostIPC": true}), serde_json::json!([{"name": "kernel.msgmax", "value": "1"}]));
        assert!(forbidden_sysctl(&host_ipc, &["kernel.msgmax".to_string()]).unwrap().contains("host ipc"));
        let host_net = with(
            serde_json::json!({"hostNetwork": true}),
            serde_json::json!([{"name": "net.ipv4.tcp_syncookies", "value": "1"}]),
        );
        assert!(forbidden_sysctl(&host_net, none).unwrap().contains("host net"));
        let global = with(serde_json::json!({}), serde_json::json!([{"name": "vm.swappiness", "value": "1"}]));
        assert!(forbidden_sysctl(&global, &["vm.*".to_string()]).unwrap().contains("not namespaced"));
        let slashed =
            with(serde_json::json!({}), serde_json::json!([{"name": "net/ipv4/tcp_syncookies", "value": "0"}]));
        assert_eq!(forbidden_sysctl(&slashed, none), None);
        assert_eq!(sysctls(&slashed).get("net.ipv4.tcp_syncookies").map(String::as_str), Some("0"));
    }
}
