//! Static pods: pod manifests the agent runs without the apiserver, from
//! `--manifest-dir` (read on change and at least every 20 s) and
//! `--manifest-url` (read every 20 s), as the seed's kubelet takes them.
//!
//! A static pod is named `<name>-<node>`, gets a uid from its manifest's
//! hash (a changed manifest is a new pod), and is mirrored in the
//! apiserver as a mirror pod with the `kubernetes.io/config.mirror`
//! annotation so `kubectl get pods` shows it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use sha2::{Digest, Sha256};

/// The annotation naming where a pod came from: "api", "file" or "http".
pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
/// The annotation carrying a static pod's manifest hash.
pub const CONFIG_HASH: &str = "kubernetes.io/config.hash";
/// The annotation marking a mirror pod, valued with its static pod's hash.
pub const CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";
/// How often every source is read in full even without a change seen.
pub const RESYNC: Duration = Duration::from_secs(20);

/// A manifest that could not be used, with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadManifest {
    /// The file or URL.
    pub source: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Turns manifest text into the static pods it declares (a Pod, or a
/// PodList), named and stamped for `node`.
pub fn parse(text: &str, source: &str, kind: &str, node: &str) -> Result<Vec<Pod>, BadManifest> {
    let bad = |reason: String| BadManifest { source: source.to_string(), reason };
    let value: serde_json::Value = serde_yaml::from_str(text).map_err(|e| bad(format!("not YAML or JSON: {e}")))?;
    let items = match value.get("kind").and_then(|k| k.as_str()) {
        Some("Pod") => vec![value.clone()],
        Some("PodList") => value.get("items").and_then(|i| i.as_array()).cloned().unwrap_or_default(),
        Some(other) => return Err(bad(format!("kind {other} is not Pod or PodList"))),
        None => return Err(bad("no kind".to_string())),
    };
    let mut pods = Vec::new();
    for item in items {
        let canonical = serde_json::to_vec(&item).map_err(|e| bad(e.to_string()))?;
        let mut pod: Pod = serde_json::from_value(item).map_err(|e| bad(format!("not a valid Pod: {e}")))?;
        let name = pod.metadata.name.clone().filter(|n| !n.is_empty()).ok_or_else(|| bad("no metadata.name".into()))?;
        if pod.spec.as_ref().is_none_or(|s| s.containers.is_empty()) {
            return Err(bad(format!("pod {name} has no containers")));
        }
        let mut hasher = Sha256::new();
        hasher.update(node.as_bytes());
        hasher.update(&canonical);
        let hash: String = hasher.finalize().iter().take(16).map(|b| format!("{b:02x}")).collect();
        pod.metadata.name = Some(format!("{name}-{node}"));
        pod.metadata.namespace =
            Some(pod.metadata.namespace.clone().filter(|n| !n.is_empty()).unwrap_or("default".into()));
        pod.metadata.uid = Some(hash.clone());
        let annotations = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
        annotations.insert(CONFIG_SOURCE.into(), kind.into());
        annotations.insert(CONFIG_HASH.into(), hash);
        if let Some(spec) = pod.spec.as_mut() {
            spec.node_name = Some(node.to_string());
        }
        pods.push(pod);
    }
    Ok(pods)
}

/// The mirror pod the apiserver shows for a static pod.
pub fn mirror_of(pod: &Pod) -> Pod {
    let mut mirror = pod.clone();
    mirror.metadata.uid = None;
    mirror.metadata.resource_version = None;
    mirror.status = None;
    let hash = pod.metadata.annotations.as_ref().and_then(|a| a.get(CONFIG_HASH)).cloned().unwrap_or_default();
    mirror.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(CONFIG_MIRROR.into(), hash);
    mirror
}

/// Whether a pod in the apiserver is a mirror pod.
pub fn is_mirror(pod: &Pod) -> bool {
    pod.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(CONFIG_MIRROR))
}

/// The static pods of a manifest directory as last read, re-read when a
/// file's modification time or the set of files changes.
#[derive(Debug, Default)]
pub struct ManifestDir {
    dir: PathBuf,
    seen: BTreeMap<PathBuf, SystemTime>,
}

/// What one read of a manifest source found.
#[derive(Debug, Default)]
pub struct Reading {
    /// Every static pod the source declares now.
    pub pods: Vec<Pod>,
    /// Manifests that could not be used.
    pub bad: Vec<BadManifest>,
}

impl ManifestDir {
    /// Reads from `dir`.
    pub fn new(dir: &Path) -> ManifestDir {
        ManifestDir { dir: dir.to_path_buf(), seen: BTreeMap::new() }
    }

    /// Whether any file appeared, went or changed since the last `read`.
    pub fn changed(&self) -> bool {
        self.stamps() != self.seen
    }

    fn stamps(&self) -> BTreeMap<PathBuf, SystemTime> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return BTreeMap::new() };
        entries
            .flatten()
            .filter(|e| is_manifest(&e.path()))
            .filter_map(|e| Some((e.path(), e.metadata().ok()?.modified().ok()?)))
            .collect()
    }

    /// Reads every manifest (`*.yaml`, `*.yml`, `*.json`; others and
    /// hidden files are skipped, as editors leave them).
    pub fn read(&mut self, node: &str) -> Reading {
        self.seen = self.stamps();
        let mut reading = Reading::default();
        for path in self.seen.keys() {
            let source = path.display().to_string();
            match std::fs::read_to_string(path) {
                Ok(text) => match parse(&text, &source, "file", node) {
                    Ok(pods) => reading.pods.extend(pods),
                    Err(bad) => reading.bad.push(bad),
                },
                Err(e) => reading.bad.push(BadManifest { source, reason: e.to_string() }),
            }
        }
        reading
    }
}

/// How long a manifest URL has to answer.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads the static pods a manifest URL serves (`http://` only).
pub async fn fetch(url: &str, node: &str) -> Result<Vec<Pod>, BadManifest> {
    use http_body_util::BodyExt;
    let bad = |reason: String| BadManifest { source: url.to_string(), reason };
    if !url.starts_with("http://") {
        return Err(bad("only http:// manifest URLs are supported".into()));
    }
    let uri: hyper::Uri = url.parse().map_err(|e| bad(format!("not a URL: {e}")))?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let answer = tokio::time::timeout(FETCH_TIMEOUT, client.get(uri))
        .await
        .map_err(|_| bad("no answer within 10 s".into()))?
        .map_err(|e| bad(e.to_string()))?;
    if !answer.status().is_success() {
        return Err(bad(format!("answered {}", answer.status())));
    }
    let body = tokio::time::timeout(FETCH_TIMEOUT, answer.into_body().collect())
        .await
        .map_err(|_| bad("body not read within 10 s".into()))?
        .map_err(|e| bad(e.to_string()))?
        .to_bytes();
    let text = String::from_utf8(body.to_vec()).map_err(|_| bad("not UTF-8".into()))?;
    parse(&text, url, "http", node)
}

fn is_manifest(path: &Path) -> bool {
    let hidden = path.file_name().and_then(|n| n.to_str()).is_none_or(|n| n.starts_with('.'));
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    !hidden && matches!(ext, "yaml" | "yml" | "json")
}

#[cfg(test)]
mod tests {
    use super::*;

    const WEB: &str =
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: busybox\n";

    #[test]
    fn a_static_pod_is_named_for_its_node_with_a_uid_from_its_manifest() {
        let pods = parse(WEB, "web.yaml", "file", "node-1").expect("parses");
        assert_eq!(pods.len(), 1);
        let pod = &pods[0];
        assert_eq!(pod.metadata.name.as_deref(), Some("web-node-1"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(pod.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some("node-1"));
        let annotations = pod.metadata.annotations.as_ref().expect("annotations");
        assert_eq!(annotations[CONFIG_SOURCE], "file");
        assert_eq!(pod.metadata.uid.as_ref(), Some(&annotations[CONFIG_HASH]));

        let again = parse(WEB, "web.yaml", "file", "node-1").expect("parses");
        assert_eq!(again[0].metadata.uid, pod.metadata.uid, "same manifest, same pod");
        let changed = parse(&WEB.replace("busybox", "busybox:2"), "web.yaml", "file", "node-1").expect("parses");
        assert_ne!(changed[0].metadata.uid, pod.metadata.uid, "a changed manifest is a new pod");
        let elsewhere = parse(WEB, "web.yaml", "file", "node-2").expect("parses");
        assert_ne!(elsewhere[0].metadata.uid, pod.metadata.uid);
    }

    #[test]
    fn malformed_manifests_are_refused_with_a_reason() {
        let bad = |text: &str| parse(text, "x.yaml", "file", "n").expect_err("refused").reason;
        assert!(bad("{{{").contains("not YAML"));
        assert!(bad("kind: Service\nmetadata: {name: s}\n").contains("not Pod"));
        assert!(bad("kind: Pod\nspec: {containers: [{name: c, image: i}]}\n").contains("metadata.name"));
        assert!(bad("kind: Pod\nmetadata: {name: p}\nspec: {containers: []}\n").contains("no containers"));
    }

    #[test]
    fn a_mirror_pod_carries_the_hash_and_no_uid() {
        let pod = parse(WEB, "web.yaml", "file", "node-1").expect("parses").remove(0);
        let mirror = mirror_of(&pod);
        assert!(is_mirror(&mirror));
        assert!(!is_mirror(&pod));
        assert_eq!(mirror.metadata.uid, None);
        assert_eq!(mirror.metadata.name, pod.metadata.name);
    }

    #[tokio::test]
    async fn a_manifest_url_is_read_and_bad_ones_say_why() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf).await;
                let reply =
                    format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{WEB}", WEB.len());
                let _ = stream.write_all(reply.as_bytes()).await;
            }
        });
        let pods = fetch(&format!("http://{addr}/pods.yaml"), "n").await.expect("read");
        assert_eq!(pods[0].metadata.name.as_deref(), Some("web-n"));
        assert_eq!(pods[0].metadata.annotations.as_ref().expect("annotations")[CONFIG_SOURCE], "http");
        assert!(fetch("https://example.invalid/x", "n").await.expect_err("refused").reason.contains("http://"));
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind").local_addr().expect("addr");
        assert!(fetch(&format!("http://{closed}/x"), "n").await.is_err());
    }

    #[test]
    fn a_manifest_dir_sees_new_changed_and_removed_files_and_skips_others() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut source = ManifestDir::new(dir.path());
        assert!(source.read("n").pods.is_empty());
        std::fs::write(dir.path().join("web.yaml"), WEB).expect("write");
        std::fs::write(dir.path().join(".web.yaml.swp"), "junk").expect("write");
        std::fs::write(dir.path().join("notes.txt"), "junk").expect("write");
        std::fs::write(dir.path().join("bad.yaml"), "kind: Pod\n").expect("write");
        assert!(source.changed());
        let reading = source.read("n");
        assert_eq!(reading.pods.len(), 1);
        assert_eq!(reading.bad.len(), 1);
        assert!(reading.bad[0].source.ends_with("bad.yaml"));
        assert!(!source.changed());
        std::fs::remove_file(dir.path().join("web.yaml")).expect("remove");
        assert!(source.changed());
        assert!(source.read("n").pods.is_empty());
    }
}
