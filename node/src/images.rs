//! Images without a registry, as k3s's air-gap images: a small OCI
//! image-layout archive writer, the built-in images made with it (busybox
//! and the pause image), and the import of every `*.tar` archive in an
//! images directory into containerd's `k8s.io` namespace.
//!
//! An archive is one uncompressed layer, its config and manifest, and an
//! `index.json` naming the image (`io.containerd.image.name` with the full
//! reference, `org.opencontainers.image.ref.name` likewise), which is what
//! `ctr images import` tags it by. Archives are byte-for-byte reproducible:
//! every timestamp is 0 and entries are sorted.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::json;
use sha2::{Digest, Sha256};
use skiff_shutdown::Shutdown;
use tokio::task::JoinHandle;

/// Skiff's own sandbox image: busybox's `sh` as PID 1, sleeping until
/// SIGTERM and reaping what is reparented to it.
pub const PAUSE_IMAGE: &str = "skiff.local/pause:1";
/// A busybox image with the usual applets linked (`sh`, `httpd`, `nc`...).
pub const BUSYBOX_IMAGE: &str = "skiff.local/busybox:1";
/// Where Debian's `busybox-static` puts its binary.
pub const BUSYBOX_BINARY: &str = "/bin/busybox";
/// The containerd namespace the CRI plugin uses.
pub const K8S_NAMESPACE: &str = "k8s.io";
/// How often the images directory is checked for new archives.
pub const IMPORT_INTERVAL: Duration = Duration::from_secs(2);

/// The applets linked in [`busybox_image`], each `/bin/<name>`.
pub const BUSYBOX_APPLETS: &[&str] = &[
    "sh",
    "ash",
    "sleep",
    "cat",
    "echo",
    "ls",
    "httpd",
    "nc",
    "wget",
    "env",
    "true",
    "false",
    "test",
    "[",
    "printf",
    "ps",
    "kill",
    "mkdir",
    "rm",
    "cp",
    "mv",
    "ln",
    "touch",
    "head",
    "tail",
    "grep",
    "sed",
    "awk",
    "tr",
    "wc",
    "date",
    "hostname",
    "id",
    "pwd",
    "dd",
    "uname",
    "ip",
    "ifconfig",
    "ping",
    "nslookup",
    "vi",
    "tee",
    "yes",
    "seq",
    "sort",
    "uniq",
    "find",
    "xargs",
    "chmod",
    "stat",
    "df",
    "du",
    "free",
    "top",
    "mount",
    "timeout",
    "nohup",
    "md5sum",
    "sha256sum",
    "base64",
    "dirname",
    "tar",
    "basename",
    "readlink",
    "realpath",
    "expr",
    "which",
    "stty",
    "tty",
    "clear",
    "reset",
];

/// Why building or importing an image failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// Reading or writing a file.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The io error.
        source: std::io::Error,
    },
    /// An entry's path is not a relative path inside the image.
    #[error("bad path in image: {0:?}")]
    BadPath(String),
    /// `ctr images import` failed.
    #[error("importing {archive}: {message}")]
    Import {
        /// The archive.
        archive: PathBuf,
        /// ctr's output.
        message: String,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ImageError {
    let what = what.into();
    move |source| ImageError::Io { what, source }
}

/// One entry of an image's filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    File { bytes: Vec<u8>, mode: u32 },
    Symlink { target: String },
    Dir { mode: u32 },
}

/// An image to write as an OCI image-layout archive: a filesystem (files,
/// symlinks, directories; missing parents are added as 0755 directories)
/// and the config a container starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageBuilder {
    name: String,
    entries: BTreeMap<String, Entry>,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    env: Vec<String>,
    working_dir: String,
}

/// What [`ImageBuilder::build`] made: the archive and its digests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageArchive {
    /// The archive's bytes (a tar of the OCI image layout).
    pub bytes: Vec<u8>,
    /// The manifest's digest (`sha256:...`).
    pub manifest_digest: String,
    /// The config's digest, which is the image id (`sha256:...`).
    pub config_digest: String,
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// The OCI architecture name of this machine.
fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// An image path without leading `/` and without `.`, `..` or empty parts.
fn clean_path(path: &str) -> Result<String, ImageError> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    if parts.is_empty() || parts.iter().any(|p| *p == "." || *p == "..") {
        return Err(ImageError::BadPath(path.to_string()));
    }
    Ok(parts.join("/"))
}

impl ImageBuilder {
    /// An empty image named `name` (a full reference, `repo:tag`).
    pub fn new(name: &str) -> ImageBuilder {
        ImageBuilder {
            name: name.to_string(),
            entries: BTreeMap::new(),
            entrypoint: Vec::new(),
            cmd: Vec::new(),
            env: vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string()],
            working_dir: "/".to_string(),
        }
    }

    /// The image's reference.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Adds a regular file with permission bits `mode` (e.g. `0o755`).
    pub fn file(mut self, path: &str, bytes: Vec<u8>, mode: u32) -> Result<ImageBuilder, ImageError> {
        self.entries.insert(clean_path(path)?, Entry::File { bytes, mode });
        Ok(self)
    }

    /// Adds a symbolic link at `path` pointing to `target`.
    pub fn symlink(mut self, path: &str, target: &str) -> Result<ImageBuilder, ImageError> {
        self.entries.insert(clean_path(path)?, Entry::Symlink { target: target.to_string() });
        Ok(self)
    }

    /// Adds a directory with permission bits `mode` (e.g. `0o1777`).
    pub fn dir(mut self, path: &str, mode: u32) -> Result<ImageBuilder, ImageError> {
        self.entries.insert(clean_path(path)?, Entry::Dir { mode });
        Ok(self)
    }

    /// The config's `Entrypoint`.
    pub fn entrypoint(mut self, entrypoint: &[&str]) -> ImageBuilder {
        self.entrypoint = entrypoint.iter().map(|s| s.to_string()).collect();
        self
    }

    /// The config's `Cmd`.
    pub fn cmd(mut self, cmd: &[&str]) -> ImageBuilder {
        self.cmd = cmd.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Adds `NAME=value` to the config's `Env` (which starts with PATH).
    pub fn env(mut self, name: &str, value: &str) -> ImageBuilder {
        self.env.retain(|e| e.split('=').next() != Some(name));
        self.env.push(format!("{name}={value}"));
        self
    }

    /// The config's `WorkingDir`.
    pub fn working_dir(mut self, dir: &str) -> ImageBuilder {
        self.working_dir = dir.to_string();
        self
    }

    /// Every entry plus its missing parent directories, sorted so parents
    /// come first.
    fn all_entries(&self) -> BTreeMap<String, Entry> {
        let mut all = self.entries.clone();
        for path in self.entries.keys() {
            let mut parent = Path::new(path).parent();
            while let Some(dir) = parent.filter(|d| !d.as_os_str().is_empty()) {
                all.entry(dir.to_string_lossy().into_owned()).or_insert(Entry::Dir { mode: 0o755 });
                parent = dir.parent();
            }
        }
        all
    }

    /// The layer: an uncompressed tar of the filesystem, owned by root,
    /// every mtime 0.
    fn layer(&self) -> Result<Vec<u8>, ImageError> {
        let mut tar = tar::Builder::new(Vec::new());
        for (path, entry) in self.all_entries() {
            let mut header = tar::Header::new_ustar();
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            match entry {
                Entry::File { bytes, mode } => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_mode(mode);
                    header.set_size(bytes.len() as u64);
                    tar.append_data(&mut header, &path, bytes.as_slice()).map_err(io(format!("layer entry {path}")))?;
                }
                Entry::Symlink { target } => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_mode(0o777);
                    header.set_size(0);
                    tar.append_link(&mut header, &path, &target).map_err(io(format!("layer entry {path}")))?;
                }
                Entry::Dir { mode } => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(mode);
                    header.set_size(0);
                    tar.append_data(&mut header, format!("{path}/"), std::io::empty())
                        .map_err(io(format!("layer entry {path}")))?;
                }
            }
        }
        tar.into_inner().map_err(io("finishing the layer"))
    }

    /// The OCI image-layout archive.
    pub fn build(&self) -> Result<ImageArchive, ImageError> {
        let layer = self.layer()?;
        let layer_digest = sha256(&layer);
        let mut container_config = serde_json::Map::new();
        container_config.insert("Env".into(), json!(self.env));
        container_config.insert("WorkingDir".into(), json!(self.working_dir));
        if !self.entrypoint.is_empty() {
            container_config.insert("Entrypoint".into(), json!(self.entrypoint));
        }
        if !self.cmd.is_empty() {
            container_config.insert("Cmd".into(), json!(self.cmd));
        }
        let config = json!({
            "created": "1970-01-01T00:00:00Z",
            "architecture": oci_arch(),
            "os": "linux",
            "config": container_config,
            "rootfs": { "type": "layers", "diff_ids": [layer_digest] },
            "history": [{ "created": "1970-01-01T00:00:00Z", "created_by": "skiff-node image builder" }],
        });
        let config = serde_json::to_vec(&config).map_err(|e| io("config")(e.into()))?;
        let config_digest = sha256(&config);
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": config.len(),
            },
            "layers": [{
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": layer_digest,
                "size": layer.len(),
            }],
        });
        let manifest = serde_json::to_vec(&manifest).map_err(|e| io("manifest")(e.into()))?;
        let manifest_digest = sha256(&manifest);
        let index = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": manifest.len(),
                "platform": { "architecture": oci_arch(), "os": "linux" },
                "annotations": {
                    "io.containerd.image.name": self.name,
                    "org.opencontainers.image.ref.name": self.name,
                },
            }],
        });
        let index = serde_json::to_vec(&index).map_err(|e| io("index")(e.into()))?;

        let mut archive = tar::Builder::new(Vec::new());
        let mut add = |path: String, bytes: &[u8]| -> Result<(), ImageError> {
            let mut header = tar::Header::new_ustar();
            header.set_entry_type(tar::EntryType::Regular);
            header.set_mode(0o644);
            header.set_mtime(0);
            header.set_size(bytes.len() as u64);
            archive.append_data(&mut header, &path, bytes).map_err(io(format!("archive entry {path}")))
        };
        add("oci-layout".to_string(), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        add("index.json".to_string(), &index)?;
        for (digest, bytes) in [(&manifest_digest, &manifest), (&config_digest, &config), (&layer_digest, &layer)] {
            add(format!("blobs/sha256/{}", digest.trim_start_matches("sha256:")), bytes)?;
        }
        let bytes = archive.into_inner().map_err(io("finishing the archive"))?;
        Ok(ImageArchive { bytes, manifest_digest, config_digest })
    }

    /// Writes the archive to `path` (through a temporary file renamed into
    /// place, so an importer never sees half of it).
    pub fn write(&self, path: &Path) -> Result<ImageArchive, ImageError> {
        let archive = self.build()?;
        let partial = path.with_extension("tar.partial");
        std::fs::write(&partial, &archive.bytes).map_err(io(format!("writing {}", partial.display())))?;
        std::fs::rename(&partial, path).map_err(io(format!("renaming {} into place", partial.display())))?;
        Ok(archive)
    }
}

/// The base every built-in image shares: busybox at `/bin/busybox`, the
/// applets as symlinks to it, and the directories a container expects.
fn busybox_base(name: &str, busybox: Vec<u8>) -> Result<ImageBuilder, ImageError> {
    let mut image = ImageBuilder::new(name).file("bin/busybox", busybox, 0o755)?;
    for applet in BUSYBOX_APPLETS {
        image = image.symlink(&format!("bin/{applet}"), "busybox")?;
    }
    for dir in ["etc", "proc", "sys", "dev", "root", "var", "www", "usr/bin", "sbin"] {
        image = image.dir(dir, 0o755)?;
    }
    image.dir("tmp", 0o1777)
}

fn read_busybox() -> Result<Vec<u8>, ImageError> {
    std::fs::read(BUSYBOX_BINARY).map_err(io(format!("reading {BUSYBOX_BINARY} (Debian's busybox-static)")))
}

/// A busybox image named `name`: Debian's static `/bin/busybox` and its
/// applets (see [`BUSYBOX_APPLETS`]), `sh` as the default command. Add
/// files or change the config with the builder's methods.
pub fn busybox_image(name: &str) -> Result<ImageBuilder, ImageError> {
    Ok(busybox_base(name, read_busybox()?)?.cmd(&["sh"]))
}

/// What the pause image's PID 1 runs: sleep in the background and wait,
/// so SIGTERM (the trap) ends it at once and `wait` reaps every child.
pub const PAUSE_SCRIPT: &str = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done";

/// Skiff's sandbox image ([`PAUSE_IMAGE`]).
pub fn pause_image() -> Result<ImageBuilder, ImageError> {
    Ok(busybox_base(PAUSE_IMAGE, read_busybox()?)?.entrypoint(&["/bin/sh", "-c", PAUSE_SCRIPT]))
}

/// Writes the built-in images ([`PAUSE_IMAGE`], [`BUSYBOX_IMAGE`]) into
/// `dir` as `skiff-pause.tar` and `skiff-busybox.tar`; returns the paths.
pub fn write_builtin_images(dir: &Path) -> Result<Vec<PathBuf>, ImageError> {
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    let mut written = Vec::new();
    for (file, image) in [("skiff-pause.tar", pause_image()?), ("skiff-busybox.tar", busybox_image(BUSYBOX_IMAGE)?)] {
        let path = dir.join(file);
        // Rewritten only when different, so the importer's mtime check
        // does not import it again on every start.
        let archive = image.build()?;
        if std::fs::read(&path).ok().as_deref() != Some(archive.bytes.as_slice()) {
            image.write(&path)?;
        }
        written.push(path);
    }
    Ok(written)
}

/// Imports one image archive (OCI layout or `docker save`) into
/// containerd's `k8s.io` namespace with `ctr`.
pub async fn import_archive(ctr: &Path, socket: &Path, archive: &Path) -> Result<(), ImageError> {
    let output = tokio::process::Command::new(ctr)
        .arg("--address")
        .arg(socket)
        .args(["--namespace", K8S_NAMESPACE, "images", "import"])
        .arg(archive)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(io(format!("running {}", ctr.display())))?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    Err(ImageError::Import {
        archive: archive.to_path_buf(),
        message: format!("{} ({})", stderr.trim().replace('\n', "; "), output.status),
    })
}

/// What an archive looked like when it was last imported (or tried).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    modified: SystemTime,
    len: u64,
}

/// Imports every `*.tar` in a directory once, and again when it changes
/// (by modification time and size). A failed import is not retried until
/// the file changes (a half-copied archive fails, and changes when the
/// copy finishes).
#[derive(Debug)]
pub struct ImageImporter {
    dir: PathBuf,
    ctr: PathBuf,
    socket: PathBuf,
    seen: HashMap<PathBuf, Seen>,
}

impl ImageImporter {
    /// An importer of `dir` into the containerd listening on `socket`,
    /// through the `ctr` binary at `ctr` (usually just `ctr`).
    pub fn new(dir: &Path, ctr: &Path, socket: &Path) -> ImageImporter {
        ImageImporter {
            dir: dir.to_path_buf(),
            ctr: ctr.to_path_buf(),
            socket: socket.to_path_buf(),
            seen: HashMap::new(),
        }
    }

    /// Archives that are new or changed since the last scan, sorted.
    fn changed(&self) -> Result<Vec<(PathBuf, Seen)>, ImageError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(format!("reading {}", self.dir.display()))(e)),
        };
        let mut changed = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("tar") {
                continue;
            }
            let Ok(meta) = entry.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            let seen = Seen { modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH), len: meta.len() };
            if self.seen.get(&path) != Some(&seen) {
                changed.push((path, seen));
            }
        }
        changed.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(changed)
    }

    /// Imports what is new or changed; returns the archives imported and
    /// the failures (each logged).
    pub async fn scan(&mut self) -> Result<(Vec<PathBuf>, Vec<ImageError>), ImageError> {
        let mut imported = Vec::new();
        let mut failed = Vec::new();
        for (path, seen) in self.changed()? {
            match import_archive(&self.ctr, &self.socket, &path).await {
                Ok(()) => {
                    tracing::info!(archive = %path.display(), "imported image archive");
                    imported.push(path.clone());
                }
                Err(e) => {
                    tracing::warn!(error = %e, "image archive not imported");
                    failed.push(e);
                }
            }
            self.seen.insert(path, seen);
        }
        Ok((imported, failed))
    }

    /// Scans every `interval` until `shutdown` is cancelled.
    pub fn spawn(mut self, interval: Duration, shutdown: &Shutdown) -> JoinHandle<()> {
        let stop = shutdown.clone();
        shutdown.spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = ticks.tick() => {}
                }
                if let Err(e) = self.scan().await {
                    tracing::warn!(error = %e, "scanning the images directory");
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// The archive's files by path.
    fn files(bytes: &[u8]) -> BTreeMap<String, Vec<u8>> {
        let mut archive = tar::Archive::new(bytes);
        let mut files = BTreeMap::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            files.insert(path, data);
        }
        files
    }

    fn blob<'a>(files: &'a BTreeMap<String, Vec<u8>>, digest: &str) -> &'a Vec<u8> {
        let path = format!("blobs/sha256/{}", digest.strip_prefix("sha256:").unwrap());
        let bytes = files.get(&path).unwrap_or_else(|| panic!("no blob {path}"));
        assert_eq!(sha256(bytes), digest, "blob {path} does not match its digest");
        bytes
    }

    fn small_image() -> ImageBuilder {
        ImageBuilder::new("example.test/app:2")
            .file("/usr/bin/app", b"#!/bin/sh\necho hi\n".to_vec(), 0o755)
            .unwrap()
            .symlink("bin/app", "/usr/bin/app")
            .unwrap()
            .dir("tmp", 0o1777)
            .unwrap()
            .entrypoint(&["/usr/bin/app"])
            .cmd(&["--flag"])
            .env("MODE", "test")
            .working_dir("/tmp")
    }

    #[test]
    fn an_archive_is_an_oci_layout_whose_digests_match_the_blobs() {
        let built = small_image().build().unwrap();
        let files = files(&built.bytes);
        assert_eq!(files["oci-layout"], br#"{"imageLayoutVersion":"1.0.0"}"#);
        let index: serde_json::Value = serde_json::from_slice(&files["index.json"]).unwrap();
        let descriptor = &index["manifests"][0];
        assert_eq!(descriptor["annotations"]["org.opencontainers.image.ref.name"], "example.test/app:2");
        assert_eq!(descriptor["annotations"]["io.containerd.image.name"], "example.test/app:2");
        assert_eq!(descriptor["digest"], built.manifest_digest.as_str());

        let manifest_bytes = blob(&files, &built.manifest_digest);
        assert_eq!(descriptor["size"], manifest_bytes.len());
        let manifest: serde_json::Value = serde_json::from_slice(manifest_bytes).unwrap();
        assert_eq!(manifest["config"]["digest"], built.config_digest.as_str());
        let config: serde_json::Value = serde_json::from_slice(blob(&files, &built.config_digest)).unwrap();
        let layer_digest = manifest["layers"][0]["digest"].as_str().unwrap();
        let layer = blob(&files, layer_digest);
        assert_eq!(manifest["layers"][0]["size"], layer.len());
        assert_eq!(config["rootfs"]["diff_ids"][0], layer_digest);
        assert_eq!(config["config"]["Entrypoint"][0], "/usr/bin/app");
        assert_eq!(config["config"]["Cmd"][0], "--flag");
        assert_eq!(config["config"]["WorkingDir"], "/tmp");
        assert!(config["config"]["Env"].as_array().unwrap().iter().any(|e| e == "MODE=test"));
    }

    #[test]
    fn the_layer_holds_files_links_and_parent_directories_with_their_modes() {
        let layer = small_image().layer().unwrap();
        let mut archive = tar::Archive::new(layer.as_slice());
        let mut seen = Vec::new();
        for entry in archive.entries().unwrap() {
            let entry = entry.unwrap();
            let header = entry.header();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            let link = entry.link_name().unwrap().map(|l| l.to_string_lossy().into_owned());
            seen.push((path, header.entry_type(), header.mode().unwrap(), link, header.mtime().unwrap()));
        }
        let paths: Vec<&str> = seen.iter().map(|s| s.0.as_str()).collect();
        assert_eq!(paths, ["bin/", "bin/app", "tmp/", "usr/", "usr/bin/", "usr/bin/app"]);
        assert_eq!(seen[1].1, tar::EntryType::Symlink);
        assert_eq!(seen[1].3.as_deref(), Some("/usr/bin/app"));
        assert_eq!(seen[2].2, 0o1777);
        assert_eq!(seen[5].2, 0o755);
        assert!(seen.iter().all(|s| s.4 == 0));
    }

    #[test]
    fn the_same_image_builds_to_the_same_bytes() {
        assert_eq!(small_image().build().unwrap(), small_image().build().unwrap());
    }

    #[test]
    fn paths_leaving_the_image_are_refused() {
        assert!(matches!(ImageBuilder::new("x:1").file("../etc/passwd", vec![], 0o644), Err(ImageError::BadPath(_))));
        assert!(matches!(ImageBuilder::new("x:1").dir("/", 0o755), Err(ImageError::BadPath(_))));
    }

    #[test]
    fn the_pause_image_runs_sh_as_pid_1_with_a_term_trap() {
        let image = busybox_base(PAUSE_IMAGE, b"not really busybox".to_vec()).unwrap().entrypoint(&[
            "/bin/sh",
            "-c",
            PAUSE_SCRIPT,
        ]);
        let built = image.build().unwrap();
        let files = files(&built.bytes);
        let config: serde_json::Value = serde_json::from_slice(blob(&files, &built.config_digest)).unwrap();
        assert_eq!(config["config"]["Entrypoint"][0], "/bin/sh");
        assert!(config["config"]["Entrypoint"][2].as_str().unwrap().contains("trap 'exit 0' TERM"));
        assert!(image.all_entries().contains_key("bin/httpd"));
    }

    #[tokio::test]
    async fn the_importer_takes_each_archive_once_until_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        // A `ctr` that only records its arguments.
        let log = dir.path().join("calls");
        let ctr = dir.path().join("ctr");
        std::fs::write(&ctr, format!("#!/bin/sh\necho \"$@\" >> {}\n", log.display())).unwrap();
        std::process::Command::new("chmod").arg("+x").arg(&ctr).status().unwrap();
        let images = dir.path().join("images");
        std::fs::create_dir(&images).unwrap();
        std::fs::write(images.join("a.tar"), b"a").unwrap();
        std::fs::write(images.join("notes.txt"), b"not an image").unwrap();

        let mut importer = ImageImporter::new(&images, &ctr, Path::new("/run/c.sock"));
        let (imported, failed) = importer.scan().await.unwrap();
        assert_eq!((imported.len(), failed.len()), (1, 0));
        assert!(importer.scan().await.unwrap().0.is_empty(), "an unchanged archive is not imported again");
        std::fs::write(images.join("b.tar"), b"bb").unwrap();
        let (imported, _) = importer.scan().await.unwrap();
        assert_eq!(imported, vec![images.join("b.tar")]);
        let calls = std::fs::read_to_string(&log).unwrap();
        assert_eq!(calls.lines().count(), 2);
        assert!(calls.contains("--address /run/c.sock --namespace k8s.io images import"), "{calls}");
    }
}
