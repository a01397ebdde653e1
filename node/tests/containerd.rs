//! A real private containerd (as root): Skiff's own images imported from
//! archives, a sandbox with its own IP on a CNI bridge, an HTTP server
//! reached on the pod IP, exec, logs, an OOM kill, and everything removed
//! afterwards, also when the test fails.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use skiff_node::cni::{self, CniConfig};
use skiff_node::containerd::{teardown, Containerd, ContainerdConfig};
use skiff_node::images::{self, ImageImporter, BUSYBOX_IMAGE, PAUSE_IMAGE};
use skiff_node::runtime::cri::CriRuntime;
use skiff_node::runtime::{
    ContainerResources, ContainerSpec, ContainerState, ContainerStatus, LabelFilter, Runtime, SandboxSpec,
    SandboxState, LABEL_NODE, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID,
};
use skiff_shutdown::Shutdown;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NODE: &str = "skiff-cri-test";
const POD_CIDR: &str = "10.244.250.0/24";
/// A second node on the same host, with its own containerd and bridge.
const NODE2: &str = "skiff-cri-test-2";
const POD_CIDR2: &str = "10.244.251.0/24";
const CGROUP_PARENT: &str = "/skiff-cri-test";

/// Removes what the test made even when it panics: the nodes' sandboxes
/// (through their containerds, which still run while the test's runtime
/// is being dropped), their bridges, the cgroup parent.
struct Cleanup {
    /// Each node's name and CRI endpoint.
    nodes: Vec<(&'static str, String)>,
    /// Blackhole routes this test added (not those already there).
    routes: Vec<&'static str>,
    armed: bool,
}

impl Cleanup {
    async fn run(&self) {
        for (node, endpoint) in &self.nodes {
            if let Ok(runtime) = CriRuntime::connect(endpoint).await {
                if let Err(e) = teardown(&runtime, node).await {
                    eprintln!("cleanup: teardown of {node} failed: {e}");
                }
            }
            if let Err(e) = cni::delete_bridge(&cni::bridge_name(node)).await {
                eprintln!("cleanup: {e}");
            }
        }
        if let Err(e) = cni::delete_blackhole_routes(&self.routes).await {
            eprintln!("cleanup: {e}");
        }
        remove_cgroup_parent();
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let cleanup = Cleanup { nodes: self.nodes.clone(), routes: self.routes.clone(), armed: false };
        // Drop cannot await; a runtime of its own on another thread can.
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() {
                rt.block_on(cleanup.run());
            }
        })
        .join();
    }
}

/// The per-controller directories of the test's cgroup parent (cgroup v1
/// and v2 layouts), removed once empty.
fn remove_cgroup_parent() {
    let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") else { return };
    let mut dirs: Vec<PathBuf> =
        controllers.flatten().map(|c| c.path().join(CGROUP_PARENT.trim_start_matches('/'))).collect();
    dirs.push(Path::new("/sys/fs/cgroup").join(CGROUP_PARENT.trim_start_matches('/')));
    for dir in dirs {
        let _ = std::fs::remove_dir(dir);
    }
}

fn has_blackhole(cidr: &str) -> bool {
    std::process::Command::new("ip")
        .args(["route", "show", "type", "blackhole"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l.split_whitespace().any(|w| w == cidr)))
        .unwrap_or(false)
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

fn labels(node: &str, pod: &str, uid: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_NODE.to_string(), node.to_string()),
        (LABEL_POD_NAME.to_string(), pod.to_string()),
        (LABEL_POD_NAMESPACE.to_string(), "default".to_string()),
        (LABEL_POD_UID.to_string(), uid.to_string()),
    ])
}

fn container(node: &str, name: &str, command: &[&str], memory: i64) -> ContainerSpec {
    ContainerSpec {
        name: name.to_string(),
        image: BUSYBOX_IMAGE.to_string(),
        command: command.iter().map(|s| s.to_string()).collect(),
        labels: BTreeMap::from([(LABEL_NODE.to_string(), node.to_string())]),
        log_path: format!("{name}/0.log"),
        resources: ContainerResources { memory_limit_in_bytes: memory, ..Default::default() },
        ..Default::default()
    }
}

/// Polls a container's status until `done` holds (at most `limit`).
async fn wait_for(
    runtime: &CriRuntime,
    id: &str,
    limit: Duration,
    done: impl Fn(&ContainerStatus) -> bool,
) -> ContainerStatus {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let status = runtime.container_status(id).await.expect("container status");
        if done(&status) || tokio::time::Instant::now() >= deadline {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn http_get(address: &str) -> std::io::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    stream.write_all(b"GET / HTTP/1.0\r\n\r\n").await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_containerd_runs_a_pod_from_skiffs_own_images() {
    if !is_root() {
        eprintln!("skipped: running containers needs root");
        return;
    }
    // SKIFF_TEST_KEEP=1 keeps the directory (containerd's log) to debug.
    let dir = tempfile::Builder::new()
        .prefix("skiff-cri")
        .disable_cleanup(std::env::var_os("SKIFF_TEST_KEEP").is_some())
        .tempdir_in("/tmp")
        .expect("tempdir");
    let data = dir.path().join("cd");
    let config = ContainerdConfig::new(&data);
    let bridge = cni::bridge_name(NODE);
    let config2 = ContainerdConfig::new(&dir.path().join("cd2"));
    let ranges = [cni::CLUSTER_CIDR];
    let routes = ranges.into_iter().filter(|r| !has_blackhole(r)).collect();
    let nodes = vec![(NODE, config.endpoint()), (NODE2, config2.endpoint())];
    let mut cleanup = Cleanup { nodes, routes, armed: true };

    // Images and network first: containerd's CRI plugin reads the CNI dir.
    let images_dir = dir.path().join("images");
    images::write_builtin_images(&images_dir).expect("built-in images");
    let cni =
        CniConfig { node_name: NODE.to_string(), pod_cidr: POD_CIDR.to_string(), ipam_data_dir: data.join("cni/ipam") };
    cni.write(&config.cni_conf_dir).expect("CNI config");
    // Nothing for the cluster's ranges leaves this host.
    cni::add_blackhole_routes(&ranges).await.expect("blackhole routes");
    cni::add_service_sink(cni::SERVICE_CIDR).await.expect("the service range's sink");

    let shutdown = Shutdown::new();
    let containerd = Containerd::start(config.clone(), &shutdown).await.expect("containerd starts");
    let mut importer = ImageImporter::new(&images_dir, Path::new("ctr"), &containerd.socket());
    let (imported, failed) = importer.scan().await.expect("scan");
    assert!(failed.is_empty(), "imports failed: {failed:?}");
    assert_eq!(imported.len(), 2);

    // A second node's containerd on the same host, beside the first,
    // sharing nothing with it.
    let cni2 = CniConfig {
        node_name: NODE2.to_string(),
        pod_cidr: POD_CIDR2.to_string(),
        ipam_data_dir: config2.data_dir.join("cni/ipam"),
    };
    cni2.write(&config2.cni_conf_dir).expect("second CNI config");
    let other =
        Containerd::start(config2.clone(), &shutdown).await.expect("a second containerd starts beside the first");
    let runtime2 = CriRuntime::connect(&other.endpoint()).await.expect("second CRI client");
    assert!(runtime2.list_images().await.expect("images").is_empty(), "the second containerd shares images");
    let (imported, _) = ImageImporter::new(&images_dir, Path::new("ctr"), &other.socket()).scan().await.expect("scan");
    assert_eq!(imported.len(), 2);

    let runtime = CriRuntime::connect(&containerd.endpoint()).await.expect("CRI client");
    let version = runtime.version().await.expect("version");
    assert_eq!(version.runtime_name, "containerd");
    for image in [PAUSE_IMAGE, BUSYBOX_IMAGE] {
        assert!(runtime.image_status(image).await.expect("image status").is_some(), "{image} was not imported");
    }
    assert!(runtime.image_status("skiff.local/absent:1").await.expect("image status").is_none());

    // The pod.
    let logs = dir.path().join("logs/default_web_u1");
    let sandbox = SandboxSpec {
        name: "web".into(),
        namespace: "default".into(),
        uid: "u1".into(),
        hostname: "web".into(),
        log_directory: logs.to_string_lossy().into_owned(),
        labels: labels(NODE, "web", "u1"),
        cgroup_parent: CGROUP_PARENT.into(),
        ..Default::default()
    };
    let sandbox_id = runtime.run_sandbox(&sandbox).await.expect("sandbox runs");
    let status = runtime.sandbox_status(&sandbox_id).await.expect("sandbox status");
    assert_eq!(status.state, SandboxState::Ready);
    let ip = status.ip.clone().expect("the sandbox has a pod IP");
    assert!(ip.starts_with("10.244.250."), "pod IP {ip} is not in {POD_CIDR}");

    let web = runtime
        .create_container(&sandbox_id, &container(NODE, "web", &["httpd", "-f", "-p", "8080"], 0), &sandbox)
        .await
        .expect("create web");
    runtime.start_container(&web).await.expect("start web");
    let status = wait_for(&runtime, &web, Duration::from_secs(5), |s| s.state == ContainerState::Running).await;
    assert_eq!(status.state, ContainerState::Running, "{status:?}");
    assert_eq!(status.sandbox_id, sandbox_id);

    // Served on the pod IP (only that address is contacted).
    let address = format!("{ip}:8080");
    let mut answer = Err(std::io::Error::other("not tried"));
    for _ in 0..50 {
        answer = http_get(&address).await;
        if answer.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answer = answer.expect("httpd answers on the pod IP");
    assert!(answer.starts_with("HTTP/1."), "{answer}");

    // containerd dies; its supervisor starts it again, and the pod, kept
    // by its shims, still serves.
    let first_pid = containerd.pid().expect("containerd runs");
    let killed = std::process::Command::new("kill").args(["-9", &first_pid.to_string()]).status().expect("kill");
    assert!(killed.success());
    let mut restarted = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if containerd.pid().is_some_and(|pid| pid != first_pid) {
            if let Ok(again) = CriRuntime::connect(&containerd.endpoint()).await {
                restarted = Some(again);
                break;
            }
        }
    }
    let runtime = restarted.expect("containerd is restarted after it dies");
    let status = runtime.container_status(&web).await.expect("status after the restart");
    assert_eq!(status.state, ContainerState::Running);
    assert!(http_get(&address).await.expect("httpd still answers").starts_with("HTTP/1."));

    // A pod of the second node reaches the first one's on its IP, across
    // the two bridges.
    let client = SandboxSpec {
        name: "client".into(),
        namespace: "default".into(),
        uid: "u2".into(),
        hostname: "client".into(),
        log_directory: dir.path().join("logs/default_client_u2").to_string_lossy().into_owned(),
        labels: labels(NODE2, "client", "u2"),
        cgroup_parent: CGROUP_PARENT.into(),
        ..Default::default()
    };
    let client_sandbox = runtime2.run_sandbox(&client).await.expect("second node's sandbox runs");
    let client_ip = runtime2.sandbox_status(&client_sandbox).await.expect("status").ip.expect("pod IP");
    assert!(client_ip.starts_with("10.244.251."), "pod IP {client_ip} is not in {POD_CIDR2}");
    let sleeper = runtime2
        .create_container(&client_sandbox, &container(NODE2, "client", &["sleep", "3600"], 0), &client)
        .await
        .expect("create client");
    runtime2.start_container(&sleeper).await.expect("start client");
    let request = format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {ip} 8080");
    let fetched = runtime2
        .exec_sync(&sleeper, &["sh".into(), "-c".into(), request], Duration::from_secs(10))
        .await
        .expect("exec in the second node's pod");
    let answer = String::from_utf8_lossy(&fetched.stdout);
    assert!(
        answer.starts_with("HTTP/1."),
        "from the other node: {answer:?} {:?}",
        String::from_utf8_lossy(&fetched.stderr)
    );
    assert_eq!(teardown(&runtime2, NODE2).await.expect("teardown of the second node"), 1);
    other.stop().await;

    let exec = runtime.exec_sync(&web, &["echo".into(), "hi".into()], Duration::from_secs(5)).await.expect("exec");
    assert_eq!((String::from_utf8_lossy(&exec.stdout).trim(), exec.exit_code), ("hi", 0));

    // A container that writes a line and exits: its log holds it.
    let hello = runtime
        .create_container(&sandbox_id, &container(NODE, "hello", &["echo", "hello-log"], 0), &sandbox)
        .await
        .expect("create hello");
    runtime.start_container(&hello).await.expect("start hello");
    let status = wait_for(&runtime, &hello, Duration::from_secs(5), |s| s.state == ContainerState::Exited).await;
    assert_eq!((status.state, status.exit_code, status.reason.as_str()), (ContainerState::Exited, 0, "Completed"));
    assert_eq!(Path::new(&status.log_path), logs.join("hello/0.log"));
    let log = std::fs::read_to_string(&status.log_path).expect("the container's log file");
    assert!(log.contains("hello-log"), "{log}");
    assert!(logs.join("web/0.log").exists());

    // 64 MiB of buffer under a 16 MiB limit.
    let hog = runtime
        .create_container(
            &sandbox_id,
            &container(NODE, "hog", &["dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"], 16 << 20),
            &sandbox,
        )
        .await
        .expect("create hog");
    runtime.start_container(&hog).await.expect("start hog");
    let status = wait_for(&runtime, &hog, Duration::from_secs(10), |s| s.state == ContainerState::Exited).await;
    assert_eq!(status.state, ContainerState::Exited, "{status:?}");
    assert_eq!(status.reason, "OOMKilled", "{status:?}");

    let filter = LabelFilter(BTreeMap::from([(LABEL_NODE.to_string(), NODE.to_string())]));
    let listed = runtime.list_containers(&filter).await.expect("list containers");
    assert_eq!(listed.len(), 3);
    let sandboxes = runtime.list_sandboxes(&filter).await.expect("list sandboxes");
    assert_eq!(sandboxes.len(), 1);
    assert_eq!(sandboxes[0].ip.as_deref(), Some(ip.as_str()));
    let stats = runtime.list_container_stats(&filter).await.expect("stats");
    assert!(!stats.is_empty());

    // Everything goes.
    assert_eq!(teardown(&runtime, NODE).await.expect("teardown"), 1);
    assert!(runtime.list_sandboxes(&filter).await.expect("list").is_empty());
    assert!(runtime.list_containers(&filter).await.expect("list").is_empty());
    containerd.stop().await;
    assert!(CriRuntime::connect(&config.endpoint()).await.is_err(), "containerd still answers after stop");
    cleanup.armed = false;
    cleanup.run().await;
    let links = std::process::Command::new("ip").args(["-br", "link"]).output().expect("ip link");
    for bridge in [bridge, cni::bridge_name(NODE2)] {
        assert!(!String::from_utf8_lossy(&links.stdout).contains(&bridge), "the bridge {bridge} is still there");
    }
}
