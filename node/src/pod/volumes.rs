//! A pod's volumes, made real under `<pods_dir>/<uid>/volumes/<plugin>/<name>`
//! as the kubelet lays them out (`kubernetes.io~empty-dir`, `~configmap`,
//! `~secret`, `~downward-api`, `~projected` with service account tokens;
//! hostPath is used in place),
//! and the bind mounts each container gets from its `volumeMounts`.
//!
//! Files of configMap, secret, downwardAPI and projected volumes are
//! rewritten only when their content changes, so materializing again on
//! every container start picks up edits. A volume that cannot be made is
//! reported by name with a message (the worker turns it into a
//! `FailedMount` event), and containers mounting it wait; the other
//! volumes are still made.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, DownwardAPIVolumeFile, KeyToPath, Pod, ServiceAccountTokenProjection};

use super::spec::{field_value, pod_identity, resource_value, ConfigError};
use super::{PodResources, WorkerConfig};
use crate::runtime::Mount;

/// Why a volume could not be made.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// A ConfigMap or Secret the volume needs is missing, or a key in it.
    #[error("MountVolume.SetUp failed for volume \"{volume}\" : {source}")]
    Source {
        /// The volume's name.
        volume: String,
        /// What is missing.
        #[source]
        source: ConfigError,
    },
    /// A hostPath of a checked type is missing or of the wrong kind.
    #[error("MountVolume.SetUp failed for volume \"{volume}\" : hostPath type check failed: {path} is not a {kind}")]
    HostPathType {
        /// The volume's name.
        volume: String,
        /// The host path.
        path: String,
        /// The expected kind.
        kind: String,
    },
    /// A file or directory could not be written.
    #[error("MountVolume.SetUp failed for volume \"{volume}\" : {path}: {source}")]
    Io {
        /// The volume's name.
        volume: String,
        /// The path written.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// An item path leaves the volume.
    #[error("MountVolume.SetUp failed for volume \"{volume}\" : invalid path \"{path}\"")]
    BadPath {
        /// The volume's name.
        volume: String,
        /// The item path.
        path: String,
    },
}

impl VolumeError {
    /// The volume's name.
    pub fn volume(&self) -> &str {
        match self {
            VolumeError::Source { volume, .. }
            | VolumeError::HostPathType { volume, .. }
            | VolumeError::Io { volume, .. }
            | VolumeError::BadPath { volume, .. } => volume,
        }
    }
}

/// The volumes that were made: name to host path, and whether every mount
/// of it is read-only (configMap, secret, downwardAPI, projected are).
#[derive(Debug, Clone, Default)]
pub struct Volumes {
    paths: HashMap<String, (PathBuf, bool)>,
}

/// The pod's directory, `<pods_dir>/<uid>`.
pub fn pod_dir(config: &WorkerConfig, pod: &Pod) -> PathBuf {
    config.pods_dir.join(pod_identity(pod).2)
}

/// Makes every volume of `pod`; returns those made and the errors of the
/// others.
pub fn materialize(
    config: &WorkerConfig,
    pod: &Pod,
    resources: &dyn PodResources,
    pod_ip: &str,
) -> (Volumes, Vec<VolumeError>) {
    let mut volumes = Volumes::default();
    let mut errors = Vec::new();
    let root = pod_dir(config, pod).join("volumes");
    let fs_group = pod.spec.as_ref().and_then(|s| s.security_context.as_ref()).and_then(|s| s.fs_group);
    for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let name = volume.name.clone();
        let result = if let Some(empty) = &volume.empty_dir {
            let dir = root.join("kubernetes.io~empty-dir").join(&name);
            let memory = empty.medium.as_deref() == Some("Memory");
            let new = !dir.exists();
            make_dir(&name, &dir).and_then(|()| {
                if memory && config.memory_medium_tmpfs {
                    mount_tmpfs(&name, &dir)?;
                }
                // Any user the pod runs as may write it, as the kubelet
                // makes it; what the containers write there is theirs, so
                // the fsGroup is set once, on the new directory (setgid:
                // what is made in it inherits the group).
                if new {
                    let io_error = |source| VolumeError::Io { volume: name.clone(), path: dir.clone(), source };
                    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).map_err(io_error)?;
                    if let Some(gid) = fs_group {
                        set_ownership(&name, &dir, gid, false)?;
                    }
                }
                Ok((dir, false))
            })
        } else if let Some(host) = &volume.host_path {
            host_path(&name, &host.path, host.type_.as_deref().unwrap_or("")).map(|p| (p, false))
        } else {
            let mut files = Files::default();
            let (plugin, mode) = if let Some(cm) = &volume.config_map {
                let r = config_map_files(&mut files, resources, pod, &cm.name, cm.items.as_deref(), cm.optional);
                ("kubernetes.io~configmap", r.map(|()| cm.default_mode))
            } else if let Some(secret) = &volume.secret {
                let secret_name = secret.secret_name.clone().unwrap_or_default();
                let r =
                    secret_files(&mut files, resources, pod, &secret_name, secret.items.as_deref(), secret.optional);
                ("kubernetes.io~secret", r.map(|()| secret.default_mode))
            } else if let Some(downward) = &volume.downward_api {
                let r = downward_files(&mut files, pod, downward.items.as_deref().unwrap_or(&[]), config, pod_ip);
                ("kubernetes.io~downward-api", r.map(|()| downward.default_mode))
            } else if let Some(projected) = &volume.projected {
                let mut r = Ok(());
                for source in projected.sources.iter().flatten() {
                    if r.is_err() {
                        break;
                    }
                    r = if let Some(cm) = &source.config_map {
                        config_map_files(&mut files, resources, pod, &cm.name, cm.items.as_deref(), cm.optional)
                    } else if let Some(secret) = &source.secret {
                        secret_files(&mut files, resources, pod, &secret.name, secret.items.as_deref(), secret.optional)
                    } else if let Some(downward) = &source.downward_api {
                        downward_files(&mut files, pod, downward.items.as_deref().unwrap_or(&[]), config, pod_ip)
                    } else if let Some(token) = &source.service_account_token {
                        token_file(&mut files, resources, pod, token)
                    } else {
                        // clusterTrustBundle sources are not supported.
                        Ok(())
                    };
                }
                ("kubernetes.io~projected", r.map(|()| projected.default_mode))
            } else {
                // Other volume kinds (persistent, cloud) are not supported:
                // an empty directory stands in so the pod still runs.
                ("kubernetes.io~unsupported", Ok(None))
            };
            match mode {
                Ok(mode) => {
                    let dir = root.join(plugin).join(&name);
                    write_files(&name, &dir, &files, mode.unwrap_or(0o644))
                        .and_then(|()| match fs_group {
                            Some(gid) => set_ownership(&name, &dir, gid, true),
                            None => Ok(()),
                        })
                        .map(|()| (dir, plugin != "kubernetes.io~unsupported"))
                }
                Err(source) => Err(VolumeError::Source { volume: name.clone(), source }),
            }
        };
        match result {
            Ok(entry) => {
                volumes.paths.insert(name, entry);
            }
            Err(e) => errors.push(e),
        }
    }
    (volumes, errors)
}

/// The bind mounts of `container` from its `volumeMounts`; a subPath is
/// created inside the volume if missing.
pub fn mounts(container: &Container, volumes: &Volumes) -> Result<Vec<Mount>, ConfigError> {
    let mut out = Vec::new();
    for m in container.volume_mounts.iter().flatten() {
        let (path, forced_readonly) =
            volumes.paths.get(&m.name).ok_or_else(|| ConfigError::VolumeUnavailable(m.name.clone()))?;
        let host_path = match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
            Some(sub) => {
                if !is_relative_inside(sub) {
                    return Err(ConfigError::SubPath(sub.to_string()));
                }
                let full = path.join(sub);
                if !full.exists() {
                    // A missing subPath is made a directory, as the kubelet does.
                    let _ = std::fs::create_dir_all(&full);
                }
                full
            }
            None => path.clone(),
        };
        out.push(Mount {
            container_path: m.mount_path.clone(),
            host_path: host_path.to_string_lossy().into_owned(),
            readonly: m.read_only.unwrap_or(false) || *forced_readonly,
        });
    }
    Ok(out)
}

/// Removes the pod's directory, unmounting tmpfs volumes first.
pub fn cleanup(config: &WorkerConfig, pod: &Pod) -> io::Result<()> {
    let dir = pod_dir(config, pod);
    if config.memory_medium_tmpfs {
        let empty = dir.join("volumes").join("kubernetes.io~empty-dir");
        if let Ok(entries) = std::fs::read_dir(&empty) {
            for entry in entries.flatten() {
                if is_mountpoint(&entry.path()) {
                    let _ = std::process::Command::new("umount").arg(entry.path()).status();
                }
            }
        }
    }
    match std::fs::remove_dir_all(&dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Files to write into a volume: relative path to content and mode.
#[derive(Default)]
struct Files(BTreeMap<String, (Vec<u8>, Option<i32>)>);

fn select(
    files: &mut Files,
    data: BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    missing: impl Fn(&str) -> ConfigError,
    optional: bool,
) -> Result<(), ConfigError> {
    match items {
        None => {
            for (k, v) in data {
                files.0.insert(k, (v, None));
            }
        }
        Some(items) => {
            for item in items {
                match data.get(&item.key) {
                    Some(v) => {
                        files.0.insert(item.path.clone(), (v.clone(), item.mode));
                    }
                    None if optional => {}
                    None => return Err(missing(&item.key)),
                }
            }
        }
    }
    Ok(())
}

fn token_file(
    files: &mut Files,
    resources: &dyn PodResources,
    pod: &Pod,
    source: &ServiceAccountTokenProjection,
) -> Result<(), ConfigError> {
    let Some(token) = resources.service_account_token(pod, source) else {
        let account = pod.spec.as_ref().and_then(|s| s.service_account_name.clone()).filter(|a| !a.is_empty());
        let account = account.unwrap_or_else(|| skiff_api::pod_refs::DEFAULT_SERVICE_ACCOUNT.to_string());
        return Err(ConfigError::TokenUnavailable { account });
    };
    // The volume's mode, as the kubelet writes it: the pod's user may not be root.
    files.0.insert(source.path.clone(), (token.into_bytes(), None));
    Ok(())
}

fn config_map_files(
    files: &mut Files,
    resources: &dyn PodResources,
    pod: &Pod,
    name: &str,
    items: Option<&[KeyToPath]>,
    optional: Option<bool>,
) -> Result<(), ConfigError> {
    let ns = pod_identity(pod).0;
    let optional = optional.unwrap_or(false);
    let Some(cm) = resources.config_map(ns, name) else {
        return if optional { Ok(()) } else { Err(ConfigError::ConfigMapNotFound { name: name.to_string() }) };
    };
    let mut data: BTreeMap<String, Vec<u8>> =
        cm.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.into_bytes())).collect();
    data.extend(cm.binary_data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)));
    let missing = |key: &str| ConfigError::ConfigMapKeyNotFound {
        namespace: ns.to_string(),
        name: name.to_string(),
        key: key.to_string(),
    };
    select(files, data, items, missing, optional)
}

fn secret_files(
    files: &mut Files,
    resources: &dyn PodResources,
    pod: &Pod,
    name: &str,
    items: Option<&[KeyToPath]>,
    optional: Option<bool>,
) -> Result<(), ConfigError> {
    let ns = pod_identity(pod).0;
    let optional = optional.unwrap_or(false);
    let Some(secret) = resources.secret(ns, name) else {
        return if optional { Ok(()) } else { Err(ConfigError::SecretNotFound { name: name.to_string() }) };
    };
    let mut data: BTreeMap<String, Vec<u8>> =
        secret.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect();
    data.extend(secret.string_data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.into_bytes())));
    let missing = |key: &str| ConfigError::SecretKeyNotFound {
        namespace: ns.to_string(),
        name: name.to_string(),
        key: key.to_string(),
    };
    select(files, data, items, missing, optional)
}

fn downward_files(
    files: &mut Files,
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    config: &WorkerConfig,
    pod_ip: &str,
) -> Result<(), ConfigError> {
    for item in items {
        let value = if let Some(r) = &item.field_ref {
            field_value(pod, &r.field_path, config, pod_ip)?
        } else if let Some(r) = &item.resource_field_ref {
            resource_value(pod, None, r, config)?
        } else {
            continue;
        };
        files.0.insert(item.path.clone(), (value.into_bytes(), item.mode));
    }
    Ok(())
}

fn write_files(volume: &str, dir: &Path, files: &Files, default_mode: i32) -> Result<(), VolumeError> {
    make_dir(volume, dir)?;
    for (relative, (content, mode)) in &files.0 {
        if !is_relative_inside(relative) {
            return Err(VolumeError::BadPath { volume: volume.to_string(), path: relative.clone() });
        }
        let path = dir.join(relative);
        let io_error = |source| VolumeError::Io { volume: volume.to_string(), path: path.clone(), source };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io_error)?;
        }
        if std::fs::read(&path).ok().as_deref() != Some(content.as_slice()) {
            std::fs::write(&path, content).map_err(io_error)?;
        }
        let mode = mode.unwrap_or(default_mode) as u32 & 0o777;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).map_err(io_error)?;
    }
    Ok(())
}

/// The pod's `fsGroup` on everything in a volume, as the kubelet sets it:
/// group `gid`, readable by the group (and writable unless `readonly`),
/// directories searchable and setgid.
fn set_ownership(volume: &str, dir: &Path, gid: i64, readonly: bool) -> Result<(), VolumeError> {
    let io_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| VolumeError::Io { volume: volume.to_string(), path, source }
    };
    let gid = u32::try_from(gid).map_err(|_| io_error(dir)(io::Error::other(format!("fsGroup {gid} is not a gid"))))?;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        let meta = std::fs::symlink_metadata(&path).map_err(io_error(&path))?;
        if meta.file_type().is_symlink() {
            continue;
        }
        std::os::unix::fs::lchown(&path, None, Some(gid)).map_err(io_error(&path))?;
        let mut mask = if readonly { 0o440 } else { 0o660 };
        if meta.is_dir() {
            mask |= 0o2110;
            for entry in std::fs::read_dir(&path).map_err(io_error(&path))? {
                pending.push(entry.map_err(io_error(&path))?.path());
            }
        }
        let mode = meta.permissions().mode() & 0o7777 | mask;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).map_err(io_error(&path))?;
    }
    Ok(())
}

fn make_dir(volume: &str, dir: &Path) -> Result<(), VolumeError> {
    std::fs::create_dir_all(dir).map_err(|source| VolumeError::Io {
        volume: volume.to_string(),
        path: dir.to_path_buf(),
        source,
    })
}

fn host_path(volume: &str, path: &str, kind: &str) -> Result<PathBuf, VolumeError> {
    let p = PathBuf::from(path);
    let wrong = |kind: &str| VolumeError::HostPathType {
        volume: volume.to_string(),
        path: path.to_string(),
        kind: kind.to_string(),
    };
    let io_error = |source| VolumeError::Io { volume: volume.to_string(), path: p.clone(), source };
    match kind {
        "DirectoryOrCreate" if !p.exists() => {
            std::fs::create_dir_all(&p).map_err(io_error)?;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).map_err(io_error)?;
        }
        "FileOrCreate" if !p.exists() => {
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent).map_err(io_error)?;
            }
            std::fs::write(&p, b"").map_err(io_error)?;
        }
        "Directory" if !p.is_dir() => return Err(wrong("directory")),
        "File" if !p.is_file() => return Err(wrong("file")),
        "Socket" | "CharDevice" | "BlockDevice" if !p.exists() => return Err(wrong(kind)),
        _ => {}
    }
    Ok(p)
}

fn is_relative_inside(path: &str) -> bool {
    let p = Path::new(path);
    !path.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

fn is_mountpoint(path: &Path) -> bool {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    let wanted = path.to_string_lossy();
    mounts.lines().any(|line| line.split(' ').nth(4) == Some(wanted.as_ref()))
}

/// `medium: Memory`: a tmpfs on the volume's directory, with mount(8)
/// (the crate forbids unsafe code, so no mount(2) here); needs root.
fn mount_tmpfs(volume: &str, dir: &Path) -> Result<(), VolumeError> {
    if is_mountpoint(dir) {
        return Ok(());
    }
    let status = std::process::Command::new("mount").args(["-t", "tmpfs", "tmpfs"]).arg(dir).status();
    match status {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(VolumeError::Io {
            volume: volume.to_string(),
            path: dir.to_path_buf(),
            source: io::Error::other(format!("mount -t tmpfs exited with {s}")),
        }),
        Err(source) => Err(VolumeError::Io { volume: volume.to_string(), path: dir.to_path_buf(), source }),
    }
}
