//! Node agents as real processes running real containers: three masters,
//! a controller manager, a scheduler and two `skiff node`s, each with its
//! private containerd, runc and a CNI bridge for its own pod CIDR. Images
//! are Skiff's built-in busybox image (no registry); pod traffic goes only
//! to the pods' own addresses on the bridges the nodes make.
//!
//! The tests run one at a time (they share the host's bridges and the
//! 10.244.0.0/16 blackhole route) and need root.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::controllers::*;
use support::kubectl::*;
use support::node::NodeAgent;
use support::*;

/// The tests share the host's network: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const BUSYBOX: &str = "skiff.local/busybox:1";

/// Dropped in field order: the nodes stop (removing their pods) while the
/// masters still run.
struct Setup {
    nodes: Vec<NodeAgent>,
    _components: Vec<Component>,
    cluster: Cluster,
    /// A follower master's REST API: logs and exec are proxied from any.
    api: Api,
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

impl Setup {
    /// Masters, components, and nodes named `node-<i>` with pod CIDRs
    /// 10.244.<base+i>.0/24; `node_extra[i]` are extra flags for node i.
    async fn new(base: u8, node_extra: &[&[&str]]) -> Setup {
        let cluster = Cluster::spawn(3).await;
        let leader = cluster.must_leader().await;
        let follower = cluster.members.keys().copied().find(|id| *id != leader).unwrap();
        let api = cluster.api(follower);
        let fast_eviction = ["--node-monitor-grace-period", "6s", "--default-not-ready-toleration-seconds", "2"];
        let components =
            vec![Component::spawn(&cluster, "cm", &fast_eviction), Component::scheduler(&cluster, "sched", &[])];
        let nodes = node_extra
            .iter()
            .enumerate()
            .map(|(i, extra)| {
                let cidr = format!("10.244.{}.0/24", base as usize + i);
                NodeAgent::start(cluster.root.path(), &cluster, &format!("node-{i}"), &cidr, extra)
            })
            .collect();
        let setup = Setup { nodes, _components: components, cluster, api };
        for node in &setup.nodes {
            setup.wait(&format!("node {} Ready", node.name), Duration::from_secs(60), || {
                let node = setup.json(&["get", "node", &node.name]);
                condition(&node, "Ready") == "True"
            });
        }
        setup
    }

    fn kubectl(&self, args: &[&str]) -> String {
        ok(kubectl(&self.api, args))
    }

    fn apply(&self, manifest: &str) {
        ok(kubectl_stdin(&self.api, &["apply", "-f", "-"], manifest));
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.extend(["-o", "json"]);
        let out = kubectl(&self.api, &args);
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    fn pod(&self, name: &str) -> Value {
        self.json(&["get", "pod", name])
    }

    fn pods(&self, selector: &str) -> Vec<Value> {
        self.json(&["get", "pods", "-l", selector])["items"].as_array().cloned().unwrap_or_default()
    }

    /// Waits until `done`, or fails with the node agents' logs.
    fn wait(&self, what: &str, within: Duration, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if done() {
                return;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        let logs: Vec<String> =
            self.nodes.iter().map(|n| format!("--- {} ---\n{}", n.name, tail(&n.log(), 60))).collect();
        panic!("timed out waiting for {what}\n{}", logs.join("\n"));
    }

    /// `kubectl debug POD --image=busybox -c CONTAINER FLAGS -- COMMAND`,
    /// to the ephemeral container's successful end; its logs.
    fn debug_to_end(&self, pod: &str, container: &str, flags: &[&str], command: &[&str]) -> String {
        let image = format!("--image={BUSYBOX}");
        let mut args = vec!["debug", pod, &image, "--image-pull-policy=Never", "-c", container];
        args.extend(flags);
        args.push("--");
        args.extend(command);
        self.kubectl(&args);
        self.wait(&format!("ephemeral container {container} to run to its end"), Duration::from_secs(60), || {
            let pod = self.json(&["get", "pod", pod]);
            let statuses = pod["status"]["ephemeralContainerStatuses"].as_array().cloned().unwrap_or_default();
            statuses.iter().any(|s| s["name"] == container && s["state"]["terminated"]["exitCode"] == 0)
        });
        self.kubectl(&["logs", pod, "-c", container])
    }

    fn wait_phase(&self, pod: &str, phase: &str, within: Duration) -> Value {
        self.wait_pod(pod, phase, within, |p| p["status"]["phase"] == phase)
    }

    /// Waits until the pod is as `done` says (`what`, for the failure);
    /// the pod as last read. A timeout fails with the pod's status and
    /// events beside the node agents' logs.
    fn wait_pod(&self, pod: &str, what: &str, within: Duration, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let last = self.pod(pod);
            if done(&last) {
                return last;
            }
            if Instant::now() > deadline {
                let selector = format!("involvedObject.name={pod}");
                let events = kubectl(&self.api, &["get", "events", "--field-selector", &selector]);
                let events = String::from_utf8_lossy(&events.stdout);
                let what = format!("pod {pod} {what}; its status: {}\nits events:\n{events}", last["status"]);
                self.wait(&what, Duration::ZERO, || false);
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

/// Another "host" for the routes test: a network namespace this test makes,
/// reached over a veth pair, with an address on each end. Nothing is sent
/// to it; the namespace, the pair and any route to `pod_cidr` go on drop.
struct PeerHost {
    netns: String,
    link: String,
    pod_cidr: String,
}

impl PeerHost {
    const HOST_ADDRESS: &'static str = "169.254.77.1";
    const PEER_ADDRESS: &'static str = "169.254.77.2";

    fn create(netns: &str, pod_cidr: &str) -> PeerHost {
        let peer = PeerHost { netns: netns.into(), link: format!("{netns}-h"), pod_cidr: pod_cidr.into() };
        peer.cleanup();
        let inside = format!("{netns}-p");
        ip(&["netns", "add", netns]);
        ip(&["link", "add", &peer.link, "type", "veth", "peer", "name", &inside, "netns", netns]);
        ip(&["addr", "add", &format!("{}/30", Self::HOST_ADDRESS), "dev", &peer.link]);
        ip(&["link", "set", &peer.link, "up"]);
        ip(&["-n", netns, "addr", "add", &format!("{}/30", Self::PEER_ADDRESS), "dev", &inside]);
        ip(&["-n", netns, "link", "set", &inside, "up"]);
        peer
    }

    /// What the host's routing table says about an address in the CIDR.
    fn route_to_pods(&self) -> String {
        let address = self.pod_cidr.replace(".0/24", ".5");
        let out = std::process::Command::new("ip").args(["route", "get", &address]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn cleanup(&self) {
        for args in [
            vec!["route", "del", self.pod_cidr.as_str(), "proto", skiff_node::routes::PROTO],
            vec!["link", "del", self.link.as_str()],
            vec!["netns", "del", self.netns.as_str()],
        ] {
            let _ = std::process::Command::new("ip").args(&args).stderr(std::process::Stdio::null()).status();
        }
    }
}

impl Drop for PeerHost {
    fn drop(&mut self) {
        self.cleanup();
    }
}

fn ip(args: &[&str]) {
    let out = std::process::Command::new("ip").args(args).output().unwrap();
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn condition(obj: &Value, type_: &str) -> String {
    obj["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == type_)
        .and_then(|c| c["status"].as_str())
        .unwrap_or("")
        .to_string()
}

/// kubectl run in a terminal of its own, as a user at a terminal runs it.
struct Terminal {
    pty: skiff_node::pty::Pty,
    child: tokio::process::Child,
    output: Vec<u8>,
    _cache: tempfile::TempDir,
}

impl Terminal {
    fn kubectl(api: &Api, args: &[&str], (columns, rows): (u16, u16)) -> Terminal {
        let cache = tempfile::tempdir().unwrap();
        let mut command = tokio::process::Command::from(api.command(cache.path()));
        command.args(args);
        let (pty, child) = skiff_node::pty::Pty::spawn(&command).unwrap();
        pty.resize(columns, rows).unwrap();
        Terminal { pty, child, output: Vec::new(), _cache: cache }
    }

    fn output(&self) -> String {
        String::from_utf8_lossy(&self.output).into_owned()
    }

    /// Changes the window size: kubectl is signalled and passes it on.
    fn resize(&self, columns: u16, rows: u16) {
        self.pty.resize(columns, rows).unwrap();
    }

    /// Reads what kubectl shows for up to `wait`; false once it has ended.
    async fn read_for(&mut self, wait: Duration) -> bool {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 4096];
        match tokio::time::timeout(wait, self.pty.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => false,
            Ok(Ok(n)) => {
                self.output.extend_from_slice(&buf[..n]);
                true
            }
            Err(_) => true,
        }
    }

    /// Types `keys` every second or so until kubectl shows `wanted` (the
    /// session may still be starting, or a resize still on its way).
    async fn type_until(&mut self, keys: &str, wanted: &str) {
        use tokio::io::AsyncWriteExt;
        let deadline = Instant::now() + Duration::from_secs(30);
        let start = self.output.len();
        while Instant::now() < deadline {
            self.pty.write_all(keys.as_bytes()).await.unwrap();
            let typed = Instant::now();
            while typed.elapsed() < Duration::from_secs(1) {
                let alive = self.read_for(Duration::from_millis(100)).await;
                if String::from_utf8_lossy(&self.output[start..]).contains(wanted) {
                    return;
                }
                assert!(alive, "kubectl ended before showing {wanted:?}: {:?}", self.output());
            }
        }
        panic!("kubectl did not show {wanted:?} in 30 s: {:?}", self.output());
    }

    /// Types `keys`, reads until kubectl ends, and returns its exit code.
    async fn type_to_end(&mut self, keys: &str) -> Option<i32> {
        use tokio::io::AsyncWriteExt;
        self.pty.write_all(keys.as_bytes()).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.read_for(Duration::from_millis(200)).await {
            assert!(Instant::now() < deadline, "kubectl did not end: {:?}", self.output());
        }
        tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await.ok()?.ok()?.code()
    }
}

/// A plain HTTP GET to a pod's address (one the test's nodes made).
fn http_get(ip: &str, port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&format!("{ip}:{port}").parse().ok()?, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {ip}\r\n\r\n").ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).ok()?;
    Some(body)
}

fn web_deployment(replicas: u32) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      terminationGracePeriodSeconds: 2
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - labelSelector: {{matchLabels: {{app: web}}}}
            topologyKey: kubernetes.io/hostname
      containers:
      - name: httpd
        image: {BUSYBOX}
        imagePullPolicy: Never
        command: ["sh", "-c", "mkdir -p /www && echo hello-from-$(hostname) > /www/index.html && echo started && exec httpd -f -p 8080 -h /www"]
        ports: [{{containerPort: 8080}}]
        readinessProbe:
          httpGet: {{path: /index.html, port: 8080}}
          periodSeconds: 1
          failureThreshold: 1
"#
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deployment_runs_in_containers_answers_across_nodes_and_serves_logs_and_exec() {
    if !is_root() {
        eprintln!("skipped: needs root for containerd, runc and bridges");
        return;
    }
    let _serial = SERIAL.lock().await;
    let setup = Setup::new(201, &[&[], &[]]).await;

    // The nodes as kubectl shows them.
    let wide = setup.kubectl(&["get", "nodes", "-o", "wide"]);
    assert!(wide.contains("node-0") && wide.contains("node-1") && wide.contains("containerd://"), "{wide}");
    let node = setup.json(&["get", "node", "node-0"]);
    assert!(node["status"]["capacity"]["cpu"].is_string(), "{node}");
    assert_eq!(node["metadata"]["labels"]["kubernetes.io/os"], "linux");
    assert!(!node["status"]["nodeInfo"]["kernelVersion"].as_str().unwrap_or("").is_empty());

    setup.apply(&web_deployment(2));
    let mut pods = Vec::new();
    setup.wait("2 web pods Running and Ready on both nodes", Duration::from_secs(90), || {
        pods = setup.pods("app=web");
        let ready = pods.iter().filter(|p| p["status"]["phase"] == "Running" && condition(p, "Ready") == "True");
        let nodes: std::collections::BTreeSet<&str> = ready.filter_map(|p| p["spec"]["nodeName"].as_str()).collect();
        nodes.len() == 2
    });
    let name = |p: &Value| p["metadata"]["name"].as_str().unwrap().to_string();
    let ip = |p: &Value| p["status"]["podIP"].as_str().unwrap().to_string();
    for p in &pods {
        assert!(ip(p).starts_with("10.244.20"), "pod IP from its node's CIDR: {p}");
        let status = &p["status"]["containerStatuses"][0];
        assert!(status["containerID"].as_str().unwrap().starts_with("containerd://"), "{status}");
        assert_eq!(status["ready"], true);
        // Each pod answers on its own address, from the host.
        let body = http_get(&ip(p), 8080, "/").unwrap_or_default();
        assert!(body.contains(&format!("hello-from-{}", name(p))), "{body}");
    }

    // From one pod to the other across nodes, through kubectl exec on a follower.
    let (a, b) = (&pods[0], &pods[1]);
    let url = format!("http://{}:8080/", ip(b));
    let fetched = setup.kubectl(&["exec", &name(a), "--", "wget", "-qO-", &url]);
    assert!(fetched.contains(&format!("hello-from-{}", name(b))), "{fetched}");
    // The exit code comes back.
    let failed = kubectl(&setup.api, &["exec", &name(a), "--", "sh", "-c", "echo out; echo err >&2; exit 3"]);
    assert_eq!(failed.status.code(), Some(3), "{failed:?}");
    assert_eq!(String::from_utf8_lossy(&failed.stdout), "out\n");
    assert!(String::from_utf8_lossy(&failed.stderr).contains("err"));

    // Logs through the follower.
    let logs = setup.kubectl(&["logs", &name(a)]);
    assert_eq!(logs, "started\n");

    // kubectl cp out of a pod: tar through exec.
    let copied = setup.cluster.root.path().join("copied.html");
    setup.kubectl(&["cp", &format!("{}:/www/index.html", name(a)), copied.to_str().unwrap()]);
    let text = std::fs::read_to_string(&copied).unwrap_or_default();
    assert_eq!(text, format!("hello-from-{}\n", name(a)));

    // kubectl cp into a pod and exec -i: stdin streams to the command
    // through the node agent's exec WebSocket.
    let upload = setup.cluster.root.path().join("upload.bin");
    let bytes: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&upload, &bytes).unwrap();
    setup.kubectl(&["cp", upload.to_str().unwrap(), &format!("{}:/www/upload.bin", name(a))]);
    let size = setup.kubectl(&["exec", &name(a), "--", "wc", "-c", "/www/upload.bin"]);
    assert_eq!(size.split_whitespace().next(), Some("1000000"), "{size}");
    let copied_back = setup.cluster.root.path().join("back.bin");
    setup.kubectl(&["cp", &format!("{}:/www/upload.bin", name(a)), copied_back.to_str().unwrap()]);
    assert!(std::fs::read(&copied_back).unwrap_or_default() == bytes, "the file came back changed");
    let piped = kubectl_stdin(
        &setup.api,
        &["exec", "-i", &name(a), "--", "sh", "-c", "tr a-z A-Z; echo err >&2; exit 4"],
        "hello\n",
    );
    assert_eq!(piped.status.code(), Some(4), "{piped:?}");
    assert_eq!(String::from_utf8_lossy(&piped.stdout), "HELLO\n");
    assert!(String::from_utf8_lossy(&piped.stderr).contains("err"), "{piped:?}");

    // kubectl exec -it from a terminal: the shell gets a terminal of
    // kubectl's size, follows it when the window changes, and its exit
    // code comes back. (kubectl sends its size once connected, so the
    // shell's first command may run before the size is set, as with a
    // kubelet: the command is typed again until the size shows.)
    let mut terminal = Terminal::kubectl(&setup.api, &["exec", "-it", &name(a), "--", "sh"], (100, 37));
    terminal.type_until("stty size; tty\r", "\r\n37 100\r\n/dev/pts/").await;
    let typed = terminal.output();
    assert!(typed.contains("\r\n37 100\r\n/dev/pts/"), "the shell's stdin is a terminal of kubectl's size: {typed:?}");
    terminal.resize(120, 40);
    terminal.type_until("stty size\r", "40 120").await;
    let code = terminal.type_to_end("exit 5\r").await;
    assert_eq!(code, Some(5), "{:?}", terminal.output());

    // A terminal hung up: kubectl goes away mid-session, and the shell gets
    // SIGHUP as it would from a closed terminal, instead of running on.
    let mut terminal = Terminal::kubectl(&setup.api, &["exec", "-it", &name(a), "--", "sh"], (80, 24));
    terminal.type_until("echo $$ > /tmp/hup; echo saved-$((6*7))\r", "saved-42").await;
    let shell = setup.kubectl(&["exec", &name(a), "--", "cat", "/tmp/hup"]).trim().to_string();
    assert!(shell.parse::<u32>().is_ok(), "{shell:?}");
    let alive = || kubectl(&setup.api, &["exec", &name(a), "--", "kill", "-0", &shell]).status.success();
    assert!(alive(), "the shell runs while kubectl does");
    terminal.child.kill().await.unwrap();
    setup.wait("the hung-up shell to end", Duration::from_secs(20), || !alive());

    // kubectl attach -it to a container's own shell (CRI Attach through
    // containerd's streaming server): what is typed reaches the
    // container's main process, resizes follow, and its exit ends it.
    setup.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: console}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: sh
    image: {BUSYBOX}
    imagePullPolicy: Never
    command: ["sh"]
    stdin: true
    tty: true
"#
    ));
    setup.wait_phase("console", "Running", Duration::from_secs(60));
    let mut terminal = Terminal::kubectl(&setup.api, &["attach", "-it", "console"], (90, 30));
    terminal.type_until("echo attached-$((6*7))\r", "attached-42").await;
    terminal.resize(91, 31);
    terminal.type_until("stty size\r", "31 91").await;
    let code = terminal.type_to_end("exit 6\r").await;
    assert_eq!(code, Some(0), "{:?}", terminal.output());
    setup.wait_phase("console", "Failed", Duration::from_secs(30));
    let console = setup.json(&["get", "pod", "console"]);
    assert_eq!(console["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"], 6, "{console}");
    setup.kubectl(&["delete", "pod", "console", "--wait=true"]);

    // kubectl run -i: the pod is made with stdin, and kubectl attaches
    // its own stdin to it; --rm deletes it after. The container waits a
    // moment between reading and answering: containerd's CRI attach starts
    // copying stdin before it joins the attach to the container's stdout,
    // so an answer given in that instant is lost (under the kubelet too).
    // Even with the wait, a CI run under load lost it once (the pod ran,
    // exited 0 and was deleted; kubectl got no output), so a lost answer
    // is tried again, twice at most, each time with a new pod.
    let mut runs = Vec::new();
    for attempt in 0..3 {
        let name = format!("reader-{attempt}");
        let run = kubectl_stdin(
            &setup.api,
            &[
                "run",
                &name,
                "-i",
                "--rm",
                "--restart=Never",
                &format!("--image={BUSYBOX}"),
                "--image-pull-policy=Never",
                "--",
                "sh",
                "-c",
                "read line; sleep 1; echo got-$line",
            ],
            "piped\n",
        );
        assert!(run.status.success(), "{run:?}");
        setup.wait("the --rm pod to be deleted", Duration::from_secs(30), || {
            !kubectl(&setup.api, &["get", "pod", &name]).status.success()
        });
        let answered = String::from_utf8_lossy(&run.stdout).contains("got-piped");
        runs.push(run);
        if answered {
            break;
        }
    }
    let answered = runs.iter().any(|r| String::from_utf8_lossy(&r.stdout).contains("got-piped"));
    assert!(answered, "no attempt got its answer back: {runs:?}");

    // kubectl debug: an ephemeral container joins the running pod (its
    // network: the web server answers on the pod's loopback), runs once,
    // and its logs and status are the pod's; with -it kubectl attaches.
    let command = "wget -qO- http://127.0.0.1:8080/; echo debug-$((6*7))";
    let debugged = setup.debug_to_end(&name(a), "probe", &[], &["sh", "-c", command]);
    assert_eq!(debugged, format!("hello-from-{}\ndebug-42\n", name(a)));
    let pod = setup.json(&["get", "pod", &name(a)]);
    assert_eq!(pod["spec"]["ephemeralContainers"][0]["name"], "probe", "{pod}");
    assert_eq!(pod["status"]["containerStatuses"][0]["restartCount"], 0, "the pod's own container runs on: {pod}");
    let args = [
        "debug",
        "-it",
        &name(a),
        &format!("--image={BUSYBOX}"),
        "--image-pull-policy=Never",
        "-c",
        "shell",
        "--",
        "sh",
    ];
    let mut terminal = Terminal::kubectl(&setup.api, &args, (80, 24));
    terminal.type_until("echo in-debug-$((6*7))\r", "in-debug-42").await;
    let code = terminal.type_to_end("exit\r").await;
    assert_eq!(code, Some(0), "{:?}", terminal.output());
    // kubectl debug --target: the debug container joins the target
    // container's process namespace, where the web server is PID 1.
    let processes = setup.debug_to_end(&name(a), "procs", &["--target=httpd"], &["ps"]);
    let pid_one = processes.lines().find(|l| l.split_whitespace().next() == Some("1"));
    assert!(pid_one.is_some_and(|l| l.contains("httpd -f -p 8080")), "{processes}");
    // shareProcessNamespace: one PID namespace for the pod's containers.
    setup.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: shared}}
spec:
  shareProcessNamespace: true
  terminationGracePeriodSeconds: 1
  containers:
  - {{name: a, image: {BUSYBOX}, imagePullPolicy: Never, command: ["sleep", "3601"]}}
  - {{name: b, image: {BUSYBOX}, imagePullPolicy: Never, command: ["sleep", "3602"]}}
"#
    ));
    setup.wait_phase("shared", "Running", Duration::from_secs(60));
    let processes = setup.kubectl(&["exec", "shared", "-c", "b", "--", "ps"]);
    assert!(processes.contains("sleep 3601") && processes.contains("sleep 3602"), "{processes}");
    setup.kubectl(&["delete", "pod", "shared", "--wait=false"]);
    // The list may only grow: removing an ephemeral container is refused.
    let removed = kubectl(
        &setup.api,
        &[
            "patch",
            "pod",
            &name(a),
            "--subresource=ephemeralcontainers",
            "--type=json",
            "-p",
            r#"[{"op": "remove", "path": "/spec/ephemeralContainers/0"}]"#,
        ],
    );
    assert!(!removed.status.success(), "{removed:?}");
    assert!(String::from_utf8_lossy(&removed.stderr).contains("may not be removed"), "{removed:?}");

    // kubectl attach: the container's output from then on, until it ends.
    setup.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: ticker}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: tick
    image: {BUSYBOX}
    imagePullPolicy: Never
    command: ["sh", "-c", "sleep 3; for i in 1 2 3 4 5; do echo tick-$i; sleep 1; done"]
"#
    ));
    setup.wait_phase("ticker", "Running", Duration::from_secs(60));
    let attached = setup.kubectl(&["attach", "ticker"]);
    assert!(attached.contains("tick-5\n"), "{attached:?}");
    setup.kubectl(&["delete", "pod", "ticker", "--wait=true"]);

    // kubectl port-forward through the follower: one tunnel carries
    // connection after connection, several at once, and bodies larger
    // than SPDY's 64 KiB window.
    let forward = PortForward::start(&setup.api, &format!("pod/{}", name(a)), 8080);
    for _ in 0..3 {
        let body = http_get("127.0.0.1", forward.local, "/").unwrap_or_default();
        assert!(body.contains(&format!("hello-from-{}", name(a))), "{body:?}\n{}", forward.stderr());
    }
    setup.kubectl(&["exec", &name(a), "--", "sh", "-c", "seq 1 60000 > /www/big"]);
    let expected: String = (1..=60000).map(|i| format!("{i}\n")).collect();
    let local = forward.local;
    let fetches: Vec<_> =
        (0..3).map(|_| std::thread::spawn(move || http_get("127.0.0.1", local, "/big").unwrap_or_default())).collect();
    for fetch in fetches {
        let big = fetch.join().unwrap();
        assert!(big.ends_with(&expected), "{} bytes through the port-forward, want {}", big.len(), expected.len());
    }
    drop(forward);
    // The same over a bare SPDY upgrade (a POST; the WebSocket tunnel is a GET).
    let spdy = PortForward::start_spdy(&setup.api, &format!("pod/{}", name(a)), 8080);
    let big = http_get("127.0.0.1", spdy.local, "/big").unwrap_or_default();
    assert!(big.ends_with(&expected), "{} bytes through SPDY, want {}: {}", big.len(), expected.len(), spdy.stderr());
    let upgraded = spdy.stderr().lines().any(|l| l.contains("POST ") && l.contains("/portforward 101"));
    assert!(upgraded, "kubectl did not upgrade to SPDY:\n{}", spdy.stderr());
    drop(spdy);
    // Nothing listens on the pod's port 9: kubectl shows the error the
    // node met and ends, as it does against kube.
    let mut refused = PortForward::start(&setup.api, &format!("pod/{}", name(a)), 9);
    let _ = http_get("127.0.0.1", refused.local, "/");
    let status = refused.exited(Duration::from_secs(20));
    assert!(status.is_some_and(|s| !s.success()), "{status:?}: {}", refused.stderr());
    assert!(refused.stderr().contains("error forwarding port 9 to pod"), "{}", refused.stderr());

    // kubectl top, from the agents' summaries through the metrics API
    // (rates need two housekeeping samples: wait for them).
    let mut top = String::new();
    setup.wait("kubectl top nodes to show both nodes", Duration::from_secs(30), || {
        let out = kubectl(&setup.api, &["top", "nodes", "--no-headers"]);
        top = String::from_utf8_lossy(&out.stdout).into_owned();
        out.status.success() && top.lines().filter(|l| l.starts_with("node-") && !l.contains("<unknown>")).count() == 2
    });
    for line in top.lines() {
        // NAME CPU(cores) CPU(%) MEMORY(bytes) MEMORY(%)
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cols.len(), 5, "{top}");
        assert!(cols[1].ends_with('m') && cols[3].ends_with("Mi"), "{top}");
    }
    setup.wait("kubectl top pods to show both web pods", Duration::from_secs(30), || {
        let out = kubectl(&setup.api, &["top", "pods", "-l", "app=web", "--no-headers"]);
        top = String::from_utf8_lossy(&out.stdout).into_owned();
        out.status.success() && pods.iter().all(|p| top.contains(&name(p)))
    });
    let containers = setup.kubectl(&["top", "pod", &name(a), "--containers", "--no-headers"]);
    assert!(containers.contains("httpd"), "{containers}");
    let metrics: Value =
        serde_json::from_str(&setup.kubectl(&["get", "--raw", "/apis/metrics.k8s.io/v1beta1/nodes/node-0"]))
            .unwrap_or(Value::Null);
    assert_eq!(metrics["kind"], "NodeMetrics");
    assert!(metrics["usage"]["memory"].as_str().unwrap_or("").ends_with("Ki"), "{metrics}");
    // The agent's own metrics, as Prometheus scrapes them.
    // The ticker's worker may still be tearing down after its deletion
    // (kubectl returns once the object is gone): wait for the gauge.
    let (ip, port) = setup.nodes[0].listen.rsplit_once(':').unwrap();
    let mut scraped = String::new();
    setup.wait("node-0 to count its one web pod", Duration::from_secs(30), || {
        scraped = http_get(ip, port.parse().unwrap(), "/metrics").unwrap_or_default();
        scraped.contains("kubelet_running_pods 1\n")
    });
    assert!(scraped.contains("skiff_node_pod_status_writes_total{result=\"ok\"}"), "{scraped}");
    let missing = kubectl(&setup.api, &["top", "pod", "no-such-pod"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("not found"), "{missing:?}");

    // Readiness: take the page away and the pod turns not Ready, its container still running.
    setup.kubectl(&["exec", &name(a), "--", "rm", "/www/index.html"]);
    setup.wait("pod not Ready after its readiness probe fails", Duration::from_secs(20), || {
        condition(&setup.pod(&name(a)), "Ready") == "False"
    });
    let pod = setup.pod(&name(a));
    assert_eq!(pod["status"]["phase"], "Running");
    assert_eq!(pod["status"]["containerStatuses"][0]["restartCount"], 0);

    // Events as kubectl describe shows them.
    let described = setup.kubectl(&["describe", "pod", &name(a)]);
    for reason in ["Scheduled", "Created", "Started", "Unhealthy"] {
        assert!(described.contains(reason), "no {reason} event:\n{described}");
    }

    // Routes to another host's pods, host-gw style: a Node whose
    // InternalIP is on a network this host is directly on gets a route to
    // its pod CIDR via that address. The two nodes here (127.0.0.1) share
    // this host, whose bridges already route their CIDRs: no route.
    let installed = || {
        let out = std::process::Command::new("ip").args(["route", "show", "proto", skiff_node::routes::PROTO]).output();
        String::from_utf8_lossy(&out.unwrap().stdout).into_owned()
    };
    assert!(!installed().contains("10.244.20"), "{}", installed());
    let far = PeerHost::create("skiff-far", "10.244.250.0/24");
    setup.apply(&format!(
        r#"
apiVersion: v1
kind: Node
metadata: {{name: far-away}}
spec: {{podCIDR: {}}}
status:
  addresses: [{{type: InternalIP, address: {}}}, {{type: Hostname, address: far-away}}]
"#,
        far.pod_cidr,
        PeerHost::PEER_ADDRESS
    ));
    setup.wait("a route to far-away's pods via its InternalIP", Duration::from_secs(20), || {
        far.route_to_pods().contains(&format!("via {} dev {}", PeerHost::PEER_ADDRESS, far.link))
    });
    setup.kubectl(&["delete", "node", "far-away"]);
    setup.wait("the route gone with its node", Duration::from_secs(20), || !installed().contains("10.244.250.0/24"));
    assert!(far.route_to_pods().contains("blackhole") || far.route_to_pods().is_empty(), "{}", far.route_to_pods());

    // `kubectl drain`: cordoned, and its pods deleted through the typed
    // client (DeleteOptions in protobuf) until none is left on it. The
    // web pods shun each other's nodes, so the replacement waits.
    let drained = setup.kubectl(&["drain", "node-1", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=60s"]);
    assert!(drained.contains("node/node-1 drained"), "{drained}");
    assert_eq!(setup.json(&["get", "node", "node-1"])["spec"]["unschedulable"], true);
    let on_drained: Vec<Value> =
        setup.pods("app=web").into_iter().filter(|p| p["spec"]["nodeName"] == "node-1").collect();
    assert!(on_drained.is_empty(), "{on_drained:?}");
    drop(setup);
}

#[tokio::test(flavor = "multi_thread")]
async fn containers_start_restart_and_end_by_kubernetes_rules() {
    if !is_root() {
        eprintln!("skipped: needs root for containerd, runc and bridges");
        return;
    }
    let _serial = SERIAL.lock().await;
    let setup = Setup::new(211, &[&[]]).await;
    let marks = setup.cluster.root.path().join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let marks = marks.display().to_string();

    setup.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: inits}}
spec:
  restartPolicy: Never
  volumes: [{{name: data, emptyDir: {{}}}}]
  initContainers:
  - {{name: one, image: {BUSYBOX}, command: ["sh", "-c", "echo -n 1 >> /data/order"], volumeMounts: [{{name: data, mountPath: /data}}]}}
  - {{name: two, image: {BUSYBOX}, command: ["sh", "-c", "echo -n 2 >> /data/order"], volumeMounts: [{{name: data, mountPath: /data}}]}}
  containers:
  - {{name: main, image: {BUSYBOX}, command: ["sh", "-c", "cat /data/order; echo"], volumeMounts: [{{name: data, mountPath: /data}}]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: never}}
spec:
  restartPolicy: Never
  containers: [{{name: c, image: {BUSYBOX}, command: ["sh", "-c", "exit 1"]}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: onfailure}}
spec:
  restartPolicy: OnFailure
  volumes: [{{name: data, emptyDir: {{}}}}]
  containers:
  - name: c
    image: {BUSYBOX}
    command: ["sh", "-c", "if [ -f /data/ran ]; then exit 0; fi; touch /data/ran; exit 1"]
    volumeMounts: [{{name: data, mountPath: /data}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: liveness}}
spec:
  containers:
  - name: c
    image: {BUSYBOX}
    command: ["sh", "-c", "touch /tmp/alive; sleep 2; rm /tmp/alive; sleep 3600"]
    livenessProbe:
      exec: {{command: ["cat", "/tmp/alive"]}}
      periodSeconds: 1
      failureThreshold: 1
      terminationGracePeriodSeconds: 1
---
apiVersion: v1
kind: Pod
metadata: {{name: hungry}}
spec:
  restartPolicy: Never
  containers:
  - name: c
    image: {BUSYBOX}
    command: ["sh", "-c", "dd if=/dev/zero of=/dev/null bs=64M count=1"]
    resources: {{limits: {{memory: 16Mi}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: graceful}}
spec:
  terminationGracePeriodSeconds: 10
  volumes: [{{name: marks, hostPath: {{path: {marks}}}}}]
  containers:
  - name: c
    image: {BUSYBOX}
    command: ["sh", "-c", "trap 'echo term >> /marks/log; exit 0' TERM; echo started >> /marks/log; while :; do sleep 1; done"]
    volumeMounts: [{{name: marks, mountPath: /marks}}]
    lifecycle:
      preStop:
        exec: {{command: ["sh", "-c", "echo prestop >> /marks/log"]}}
"#
    ));

    // Init containers ran one by one, in order, before the main one.
    setup.wait_phase("inits", "Succeeded", Duration::from_secs(60));
    assert_eq!(setup.kubectl(&["logs", "inits", "-c", "main"]), "12\n");
    let inits = setup.pod("inits");
    assert_eq!(inits["status"]["initContainerStatuses"][1]["state"]["terminated"]["reason"], "Completed");

    // Never: one failure ends the pod. OnFailure: restarted until it succeeds.
    let never = setup.wait_phase("never", "Failed", Duration::from_secs(60));
    let state = &never["status"]["containerStatuses"][0];
    assert_eq!(state["state"]["terminated"]["exitCode"], 1, "{state}");
    assert_eq!(state["restartCount"], 0);
    let onfailure = setup.wait_phase("onfailure", "Succeeded", Duration::from_secs(60));
    assert_eq!(onfailure["status"]["containerStatuses"][0]["restartCount"], 1, "{onfailure}");

    // Liveness: the container is killed and started again.
    let live = setup.wait_pod("liveness", "restarted", Duration::from_secs(60), |p| {
        p["status"]["containerStatuses"][0]["restartCount"].as_u64().unwrap_or(0) >= 1
    });
    assert!(live["status"]["containerStatuses"][0]["lastState"]["terminated"].is_object(), "{live}");

    // Over its memory limit: killed by the OOM killer (SIGKILL, 137), and
    // said so. (containerd misses some of these kills on cgroup v1; the
    // agent finds them in the kernel's log, at the latest one sync later.)
    setup.wait_phase("hungry", "Failed", Duration::from_secs(60));
    let hungry = setup.wait_pod("hungry", "OOMKilled", Duration::from_secs(10), |p| {
        p["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] == "OOMKilled"
    });
    assert_eq!(hungry["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"], 137, "{hungry}");

    // Graceful deletion: preStop, then SIGTERM, well before the grace ends, then the pod goes.
    let log = format!("{marks}/log");
    setup.wait_phase("graceful", "Running", Duration::from_secs(60));
    setup.wait("graceful started", Duration::from_secs(10), || {
        std::fs::read_to_string(&log).unwrap_or_default().contains("started")
    });
    let started = Instant::now();
    setup.kubectl(&["delete", "pod", "graceful", "--wait=true"]);
    assert!(started.elapsed() < Duration::from_secs(9), "deleted in {:?}", started.elapsed());
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "started\nprestop\nterm\n");
    drop(setup);
}

/// The value of `field` in a `/proc/<pid>/status` dump.
fn proc_status_field<'a>(status: &'a str, field: &str) -> &'a str {
    status.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':')).map_or("", str::trim)
}

#[tokio::test(flavor = "multi_thread")]
async fn security_contexts_hold_in_the_container_and_debug_node_reaches_the_host() {
    if !is_root() {
        eprintln!("skipped: needs root for containerd, runc and bridges");
        return;
    }
    let _serial = SERIAL.lock().await;
    let setup = Setup::new(216, &[&[]]).await;
    setup.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: confined}}
spec:
  restartPolicy: Never
  securityContext: {{runAsUser: 1000, runAsGroup: 3000, fsGroup: 2000, supplementalGroups: [4000]}}
  volumes: [{{name: data, emptyDir: {{}}}}]
  containers:
  - name: c
    image: {BUSYBOX}
    imagePullPolicy: Never
    command: ["sh", "-c", "id; stat -c '%g %a' /data; touch /data/f && stat -c '%g' /data/f; touch /f 2>/dev/null || echo read-only; cat /proc/self/status"]
    volumeMounts: [{{name: data, mountPath: /data}}]
    securityContext:
      readOnlyRootFilesystem: true
      allowPrivilegeEscalation: false
      capabilities: {{drop: [ALL]}}
      seccompProfile: {{type: RuntimeDefault}}
---
apiVersion: v1
kind: Pod
metadata: {{name: plain}}
spec:
  restartPolicy: Never
  containers: [{{name: c, image: {BUSYBOX}, imagePullPolicy: Never, command: ["cat", "/proc/self/status"]}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: nonroot}}
spec:
  containers:
  - {{name: c, image: {BUSYBOX}, imagePullPolicy: Never, command: ["sleep", "3600"], securityContext: {{runAsNonRoot: true}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: tuned}}
spec:
  restartPolicy: Never
  securityContext: {{sysctls: [{{name: net.ipv4.ip_local_port_range, value: "40000 50000"}}]}}
  containers: [{{name: c, image: {BUSYBOX}, imagePullPolicy: Never, command: ["cat", "/proc/sys/net/ipv4/ip_local_port_range"]}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: untuned}}
spec:
  securityContext: {{sysctls: [{{name: kernel.msgmax, value: "65536"}}]}}
  containers: [{{name: c, image: {BUSYBOX}, imagePullPolicy: Never, command: ["sleep", "3600"]}}]
"#
    ));

    // Users, groups, the fsGroup on the volume, a read-only root, no
    // capabilities, no_new_privs and a seccomp filter, from inside.
    setup.wait_phase("confined", "Succeeded", Duration::from_secs(60));
    let logs = setup.kubectl(&["logs", "confined"]);
    let mut lines = logs.lines();
    let id = lines.next().unwrap_or_default();
    assert!(id.starts_with("uid=1000 gid=3000 groups="), "{logs}");
    let groups: Vec<&str> = id.rsplit('=').next().unwrap_or_default().split(',').collect();
    assert!(groups.contains(&"2000") && groups.contains(&"4000"), "{logs}");
    assert_eq!(lines.next(), Some("2000 2777"), "the emptyDir: group fsGroup, writable by all, setgid\n{logs}");
    assert_eq!(lines.next(), Some("2000"), "a file made in it has the fsGroup\n{logs}");
    assert_eq!(lines.next(), Some("read-only"), "{logs}");
    assert_eq!(proc_status_field(&logs, "CapEff"), "0000000000000000", "{logs}");
    assert_eq!(proc_status_field(&logs, "NoNewPrivs"), "1", "{logs}");
    assert_eq!(proc_status_field(&logs, "Seccomp"), "2", "a filter is loaded\n{logs}");
    // Without a securityContext: root with the runtime's default set, no filter.
    setup.wait_phase("plain", "Succeeded", Duration::from_secs(60));
    let plain = setup.kubectl(&["logs", "plain"]);
    assert_eq!(proc_status_field(&plain, "Uid").split_whitespace().next(), Some("0"), "{plain}");
    let default_caps = proc_status_field(&plain, "CapEff").to_string();
    assert!(!default_caps.is_empty() && default_caps != "0000000000000000", "{plain}");
    assert_eq!(proc_status_field(&plain, "Seccomp"), "0", "{plain}");

    // A safe sysctl is set in the pod's own network namespace; an unsafe
    // one gets the pod refused, as the kubelet refuses it.
    setup.wait_phase("tuned", "Succeeded", Duration::from_secs(60));
    let range = setup.kubectl(&["logs", "tuned"]);
    assert_eq!(range.split_whitespace().collect::<Vec<_>>(), ["40000", "50000"], "{range}");
    let untuned = setup.wait_phase("untuned", "Failed", Duration::from_secs(60));
    assert_eq!(untuned["status"]["reason"], "SysctlForbidden", "{untuned}");
    assert_eq!(untuned["status"]["message"], "Pod was rejected: forbidden sysctl: \"kernel.msgmax\" not allowlisted");

    // runAsNonRoot with an image that runs as root: never created.
    let nonroot = setup.wait_pod("nonroot", "refused", Duration::from_secs(60), |p| {
        p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "CreateContainerConfigError"
    });
    let waiting = &nonroot["status"]["containerStatuses"][0]["state"]["waiting"];
    let message = waiting["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("container has runAsNonRoot and image will run as root (pod: \"nonroot_default("),
        "{waiting}"
    );

    // `kubectl debug node/`: a privileged pod in the host's PID, IPC and
    // network namespaces with the host's root at /host. It sees this test's
    // process and reads a file this test wrote.
    let mark = setup.cluster.root.path().join("debug-mark");
    std::fs::write(&mark, "from the host\n").unwrap();
    let script = format!(
        "cat /host{}; test -d /proc/{} && echo host-pids; grep CapEff /proc/self/status",
        mark.display(),
        std::process::id()
    );
    let image = format!("--image={BUSYBOX}");
    let out = setup.kubectl(&[
        "debug",
        "node/node-0",
        &image,
        "--image-pull-policy=Never",
        "--profile=sysadmin",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let debugger = out
        .split_whitespace()
        .find(|w| w.starts_with("node-debugger-node-0-"))
        .unwrap_or_else(|| panic!("no debug pod named in {out:?}"))
        .to_string();
    let pod = setup.wait_phase(&debugger, "Succeeded", Duration::from_secs(60));
    assert_eq!(pod["spec"]["hostPID"], true, "{pod}");
    let logs = setup.kubectl(&["logs", &debugger]);
    let mut lines = logs.lines();
    assert_eq!(lines.next(), Some("from the host"), "{logs}");
    assert_eq!(lines.next(), Some("host-pids"), "{logs}");
    let own = std::fs::read_to_string("/proc/self/status").unwrap();
    let every = proc_status_field(&own, "CapBnd");
    assert_eq!(proc_status_field(&logs, "CapEff"), every, "privileged: every capability the host has\n{logs}");
    assert_ne!(every, default_caps);

    // `kubectl debug --copy-to`: a copy of the pod with a debug container
    // beside its own, sharing its processes.
    setup.kubectl(&[
        "debug",
        "plain",
        "--copy-to=plain-copy",
        "--share-processes",
        &image,
        "--image-pull-policy=Never",
        "--container=dbg",
        "--profile=general",
        "--",
        "echo",
        "copied",
    ]);
    let copy = setup.wait_phase("plain-copy", "Succeeded", Duration::from_secs(60));
    assert_eq!(copy["spec"]["shareProcessNamespace"], true, "{copy}");
    assert_eq!(copy["spec"]["containers"].as_array().map(Vec::len), Some(2), "{copy}");
    assert_eq!(setup.kubectl(&["logs", "plain-copy", "-c", "dbg"]), "copied\n");
    drop(setup);
}

#[tokio::test(flavor = "multi_thread")]
async fn static_pods_are_mirrored_and_agents_adopt_their_containers_and_lost_nodes_are_evicted() {
    if !is_root() {
        eprintln!("skipped: needs root for containerd, runc and bridges");
        return;
    }
    let _serial = SERIAL.lock().await;
    let manifests = tempfile::tempdir().unwrap();
    let dir = manifests.path().display().to_string();
    let setup = Setup::new(221, &[&["--manifest-dir", &dir], &[]]).await;

    // A static pod, mirrored as <name>-<node>.
    std::fs::write(
        manifests.path().join("static.yaml"),
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: static}}\nspec:\n  containers:\n  - {{name: c, image: {BUSYBOX}, command: [sleep, '3600']}}\n"
        ),
    )
    .unwrap();
    let mirror = setup.wait_phase("static-node-0", "Running", Duration::from_secs(60));
    assert!(mirror["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_string(), "{mirror}");
    // A deleted mirror comes back; the static pod kept running.
    let first_uid = mirror["metadata"]["uid"].clone();
    let container = mirror["status"]["containerStatuses"][0]["containerID"].clone();
    setup.kubectl(&["delete", "pod", "static-node-0", "--wait=false"]);
    setup.wait("the mirror recreated", Duration::from_secs(30), || {
        let m = setup.pod("static-node-0");
        m["metadata"]["uid"] != first_uid && m["status"]["containerStatuses"][0]["containerID"] == container
    });

    // A Deployment on node-1 only (the node we will lose).
    setup.apply(&format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: sleeper}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: sleeper}}}}
  template:
    metadata: {{labels: {{app: sleeper}}}}
    spec:
      terminationGracePeriodSeconds: 1
      affinity:
        nodeAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            preference: {{matchExpressions: [{{key: kubernetes.io/hostname, operator: In, values: [node-1]}}]}}
      containers: [{{name: c, image: {BUSYBOX}, command: [sleep, "3600"]}}]
"#
    ));
    let mut pod = Value::Null;
    setup.wait("sleeper Running on node-1", Duration::from_secs(60), || {
        pod = setup.pods("app=sleeper").into_iter().next().unwrap_or(Value::Null);
        pod["status"]["phase"] == "Running" && pod["spec"]["nodeName"] == "node-1"
    });
    let sleeper = pod["metadata"]["name"].as_str().unwrap().to_string();
    let id = pod["status"]["containerStatuses"][0]["containerID"].clone();

    // A restarted agent adopts what runs: same container, no restart.
    let mut setup = setup;
    setup.nodes[1].restart();
    setup.wait("node-1 back and its pod still Running", Duration::from_secs(60), || {
        let p = setup.pod(&sleeper);
        condition(&setup.json(&["get", "node", "node-1"]), "Ready") == "True" && p["status"]["phase"] == "Running"
    });
    std::thread::sleep(Duration::from_secs(3));
    let after = setup.pod(&sleeper);
    assert_eq!(after["status"]["containerStatuses"][0]["containerID"], id, "{after}");
    assert_eq!(after["status"]["containerStatuses"][0]["restartCount"], 0, "{after}");

    // Lose node-1: NotReady, its pod evicted and made again on node-0.
    setup.nodes[1].kill();
    setup.wait("sleeper recreated on node-0", Duration::from_secs(90), || {
        setup.pods("app=sleeper").iter().any(|p| p["spec"]["nodeName"] == "node-0" && p["status"]["phase"] == "Running")
    });
    let node = setup.json(&["get", "node", "node-1"]);
    assert_ne!(condition(&node, "Ready"), "True", "{node}");
    drop(setup);
}

/// `iptables-save` of the host.
fn iptables_save() -> String {
    let out = std::process::Command::new("iptables-save").output().expect("iptables-save runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What `wget` fetched from inside pod `pod` for each of `count` requests
/// to `url` (an empty line for a failed one), in one exec. (busybox's
/// static wget crashes with its own `-T`; `timeout` bounds it instead.)
fn fetch_from(setup: &Setup, pod: &str, url: &str, count: usize) -> Vec<String> {
    let script = format!("for i in $(seq {count}); do timeout 3 wget -qO- {url} 2>/dev/null || echo; done");
    let out = setup.kubectl(&["exec", pod, "--", "sh", "-c", &script]);
    out.lines().map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn services_reach_ready_pods_by_cluster_ip_dns_and_node_port_and_survive_the_agent() {
    services_reach_ready_pods("iptables", 226).await;
}

/// The same with node-0 (the client's node, whose rules take the
/// client's traffic) in the nftables mode, beside node-1 in iptables mode.
#[tokio::test(flavor = "multi_thread")]
async fn services_work_the_same_in_nftables_mode() {
    services_reach_ready_pods("nftables", 228).await;
}

async fn services_reach_ready_pods(mode: &str, base: u8) {
    if !is_root() {
        eprintln!("skipped: needs root for containerd, runc, bridges and iptables");
        return;
    }
    let _serial = SERIAL.lock().await;
    let setup = Setup::new(base, &[&["--proxy-mode", mode], &[]]).await;
    let gateways = [format!("10.244.{base}.1"), format!("10.244.{}.1", base + 1)];
    let gateways = [gateways[0].as_str(), gateways[1].as_str()];
    let nftables = mode == "nftables";

    setup.apply(&web_deployment(2));
    setup.apply(&format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: client}}
spec:
  nodeName: node-0
  terminationGracePeriodSeconds: 1
  containers: [{{name: c, image: {BUSYBOX}, imagePullPolicy: Never, command: ["sleep", "3600"]}}]
"#
    ));
    setup.kubectl(&["expose", "deployment", "web", "--port", "80", "--target-port", "8080"]);
    setup.kubectl(&[
        "expose",
        "deployment",
        "web",
        "--name",
        "web-np",
        "--type",
        "NodePort",
        "--port",
        "80",
        "--target-port",
        "8080",
    ]);
    // A targetPort no pod names: no endpoints, and connections refused at once.
    setup.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: nothing}\nspec:\n  selector: {app: web}\n  ports: [{port: 81, targetPort: nosuchport}]\n",
    );
    let mut pods = Vec::new();
    setup.wait("2 web pods Ready and the client Running", Duration::from_secs(90), || {
        pods = setup.pods("app=web");
        let ready = pods.iter().filter(|p| condition(p, "Ready") == "True").count();
        ready == 2 && setup.pod("client")["status"]["phase"] == "Running"
    });
    let names: Vec<String> = pods.iter().map(|p| p["metadata"]["name"].as_str().unwrap().to_string()).collect();
    let tag0 = skiff_node::proxy::rules::tag("node-0");
    let cluster_ip = setup.kubectl(&["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"]);
    let node_port = setup.kubectl(&["get", "svc", "web-np", "-o", "jsonpath={.spec.ports[0].nodePort}"]);
    let node_port: u16 = node_port.trim().parse().expect("a NodePort");

    // The cluster IP, the short name and the full name, from a pod on
    // node-0: both replicas (one on each node) answer.
    for target in [cluster_ip.trim(), "web", "web.default.svc.cluster.local"] {
        let mut seen = std::collections::BTreeSet::new();
        setup.wait(&format!("both replicas to answer at {target}"), Duration::from_secs(30), || {
            for body in fetch_from(&setup, "client", &format!("http://{target}/"), 12) {
                seen.insert(body);
            }
            names.iter().all(|n| seen.contains(&format!("hello-from-{n}")))
        });
    }
    let resolved = setup.kubectl(&["exec", "client", "--", "nslookup", "web.default.svc.cluster.local"]);
    assert!(resolved.contains(cluster_ip.trim()), "{resolved}");
    let missing = kubectl(&setup.api, &["exec", "client", "--", "nslookup", "nosuch.default.svc.cluster.local"]);
    assert!(String::from_utf8_lossy(&missing.stdout).contains("NXDOMAIN"), "{missing:?}");
    // (The filter table rejects a Service with no endpoints.)
    let started = Instant::now();
    let refused = kubectl(&setup.api, &["exec", "client", "--", "timeout", "5", "wget", "-qO-", "http://nothing:81/"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("can't connect"), "failed at once, not timed out: {refused:?}");
    assert!(started.elapsed() < Duration::from_secs(4), "{refused:?}");

    // The NodePort on both nodes' addresses, from the host and from the pod.
    for gateway in gateways {
        let body = http_get(gateway, node_port, "/").unwrap_or_default();
        assert!(body.contains("hello-from-"), "NodePort {node_port} on {gateway}: {body:?}");
        let fetched = fetch_from(&setup, "client", &format!("http://{gateway}:{node_port}/"), 1);
        assert!(fetched[0].starts_with("hello-from-"), "{fetched:?}");
    }
    // The host reaches a cluster IP (its route goes into the service
    // range's sink, and the OUTPUT chain translates first); a Service
    // with no endpoints is refused at once, not left to time out.
    let body = http_get(cluster_ip.trim(), 80, "/").unwrap_or_default();
    assert!(body.contains("hello-from-"), "the cluster IP {} from the host: {body:?}", cluster_ip.trim());
    let nothing_ip = setup.kubectl(&["get", "svc", "nothing", "-o", "jsonpath={.spec.clusterIP}"]);
    let refused = TcpStream::connect_timeout(
        &format!("{}:81", nothing_ip.trim()).parse().expect("a cluster IP"),
        Duration::from_secs(3),
    );
    assert!(
        refused.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused),
        "a Service with no endpoints from the host: {refused:?}"
    );
    // 127.0.0.1 is one of the host's addresses too, in the iptables mode
    // (kube-proxy's localhostNodePorts; its nftables mode has none).
    if !nftables {
        let body = http_get("127.0.0.1", node_port, "/").unwrap_or_default();
        assert!(body.contains("hello-from-"), "NodePort {node_port} on 127.0.0.1: {body:?}");
    }

    // A LoadBalancer is published at the Ready nodes' addresses (these
    // nodes' InternalIP is 127.0.0.1) and answers there on its port.
    setup.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web-lb}\nspec:\n  type: LoadBalancer\n  selector: {app: web}\n  ports: [{port: 18080, targetPort: 8080}]\n",
    );
    setup.wait("web-lb published at the nodes' address", Duration::from_secs(30), || {
        setup.kubectl(&["get", "svc", "web-lb", "-o", "jsonpath={.status.loadBalancer.ingress[*].ip}"]) == "127.0.0.1"
    });
    let shown = setup.kubectl(&["get", "svc", "web-lb"]);
    assert!(shown.lines().nth(1).is_some_and(|l| l.split_whitespace().nth(3) == Some("127.0.0.1")), "{shown}");
    if !nftables {
        setup.wait("web-lb to answer at 127.0.0.1:18080", Duration::from_secs(30), || {
            http_get("127.0.0.1", 18080, "/").unwrap_or_default().contains("hello-from-")
        });
    }

    // Hairpin: a pod reaches itself through its own Service (one pod on
    // each node, so through each node's rules).
    for name in &names {
        let own = format!("hello-from-{name}");
        setup.wait(&format!("{name} to reach itself through its Service"), Duration::from_secs(30), || {
            fetch_from(&setup, name, "http://web/", 8).contains(&own)
        });
    }

    // A pod that fails its readiness probe gets no traffic.
    let (failing, kept) = (&names[0], &names[1]);
    setup.kubectl(&["exec", failing, "--", "rm", "/www/index.html"]);
    setup.wait("the unready pod to get no traffic", Duration::from_secs(20), || {
        fetch_from(&setup, "client", "http://web/", 10).iter().all(|b| *b == format!("hello-from-{kept}"))
    });
    setup.kubectl(&["exec", failing, "--", "sh", "-c", &format!("echo hello-from-{failing} > /www/index.html")]);

    // Session affinity: one client sticks to one pod.
    setup.kubectl(&["patch", "svc", "web", "-p", r#"{"spec":{"sessionAffinity":"ClientIP"}}"#]);
    setup.wait("both ready again, and one client on one pod", Duration::from_secs(30), || {
        let ready = setup.pods("app=web").iter().filter(|p| condition(p, "Ready") == "True").count() == 2;
        let bodies = fetch_from(&setup, "client", "http://web/", 10);
        ready && bodies[0].starts_with("hello-from-") && bodies.iter().all(|b| *b == bodies[0])
    });

    // An established connection keeps its endpoint while a sync rewrites
    // its Service's chain: the client on node-0 talks to echo-1 on node-1
    // (its nc reads a pipe that stays open: at EOF it would hang up),
    // echo-2 joins the Service (node-0's chain for it is rewritten), and
    // the connection carries its second line.
    let echo = |name: &str, node: &str| {
        format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: {name}, labels: {{app: echo}}}}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers: [{{name: c, image: {BUSYBOX}, imagePullPolicy: Never, command: ["sh", "-c", "sleep 3600 | nc -l -p 9000 > /tmp/heard"]}}]
"#
        )
    };
    setup.apply(&echo("echo-1", "node-1"));
    setup.apply("apiVersion: v1\nkind: Service\nmetadata: {name: echo}\nspec:\n  selector: {app: echo}\n  ports: [{port: 9000}]\n");
    let echo_ip = |name: &str| setup.pod(name)["status"]["podIP"].as_str().unwrap_or_default().to_string();
    let in_node0_chain = |ip: &str| {
        if nftables {
            let table = skiff_node::proxy::nft::table(&tag0);
            let chain = nft(&["list", "chain", "ip", &table, "service-default/echo/tcp/p9000"]);
            return chain.contains(&format!("dnat to {ip}:9000")) || chain.contains(&format!("{ip} . 9000"));
        }
        let marker = format!("\"default/echo -> {ip}:9000\"");
        iptables_save().lines().any(|l| l.starts_with(&format!("-A SKIFF-SVC-{tag0}-")) && l.contains(&marker))
    };
    setup.wait("echo-1 in node-0's rules", Duration::from_secs(60), || {
        let ip = echo_ip("echo-1");
        !ip.is_empty() && in_node0_chain(&ip)
    });
    let cache = tempfile::tempdir().unwrap();
    let mut talk = setup
        .api
        .command(cache.path())
        .args(["exec", "client", "--", "sh", "-c"])
        .arg("(echo first; while [ ! -e /tmp/go ]; do sleep 0.2; done; echo second) | timeout 60 nc echo 9000")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("kubectl runs");
    let heard = || kubectl(&setup.api, &["exec", "echo-1", "--", "cat", "/tmp/heard"]).stdout;
    setup.wait("echo-1 to hear the first line", Duration::from_secs(30), || heard() == b"first\n");
    setup.apply(&echo("echo-2", "node-0"));
    setup.wait("echo-2 in node-0's rules", Duration::from_secs(60), || {
        let ip = echo_ip("echo-2");
        !ip.is_empty() && in_node0_chain(&ip)
    });
    setup.kubectl(&["exec", "client", "--", "touch", "/tmp/go"]);
    setup.wait("the same connection to carry the second line", Duration::from_secs(30), || {
        heard() == b"first\nsecond\n"
    });
    let _ = talk.kill();
    let _ = talk.wait();

    // A UDP client sending from one port (busybox's syslogd forwarding to
    // a remote, as statsd and syslog clients do) keeps one conntrack entry
    // alive; when its endpoint goes, the proxy clears that entry and the
    // next message reaches the new endpoint instead of the gone one. The
    // endpoints are sockets of this test on the two bridges' gateways
    // (busybox has no UDP server), in a Service without selector.
    let first = std::net::UdpSocket::bind((gateways[1], 0)).expect("a UDP socket on node-1's gateway");
    let udp_port = first.local_addr().unwrap().port();
    let second = std::net::UdpSocket::bind((gateways[0], udp_port)).expect("a UDP socket on node-0's gateway");
    for socket in [&first, &second] {
        socket.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    }
    let slice = |address: &str| {
        format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: syslog-1, labels: {{kubernetes.io/service-name: syslog}}}}\naddressType: IPv4\nendpoints: [{{addresses: [{address}], conditions: {{ready: true}}}}]\nports: [{{port: {udp_port}, protocol: UDP}}]\n"
        )
    };
    setup.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: syslog}\nspec:\n  ports: [{port: 514, protocol: UDP}]\n",
    );
    setup.apply(&slice(gateways[1]));
    let syslog_ip = setup.kubectl(&["get", "svc", "syslog", "-o", "jsonpath={.spec.clusterIP}"]);
    let mut sender = setup
        .api
        .command(cache.path())
        .args(["exec", "client", "--", "sh", "-c"])
        .arg(format!("syslogd -R {}:514 && while true; do logger ping; sleep 0.2; done", syslog_ip.trim()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("kubectl runs");
    let hears_ping = |socket: &std::net::UdpSocket| {
        let mut buf = [0u8; 512];
        (0..5).any(|_| socket.recv(&mut buf).is_ok_and(|n| String::from_utf8_lossy(&buf[..n]).contains("ping")))
    };
    setup.wait("the first endpoint to hear the client", Duration::from_secs(30), || hears_ping(&first));
    setup.apply(&slice(gateways[0]));
    setup.wait("the same client's flow to move to the new endpoint", Duration::from_secs(30), || hears_ping(&second));
    let _ = sender.kill();
    let _ = sender.wait();

    // A NodePort another process on the host listens on is reported.
    let squatted = (30000..32768)
        .find(|p| *p != node_port && std::net::TcpListener::bind(("0.0.0.0", *p)).is_ok())
        .expect("a free port in the NodePort range");
    let taken = std::net::TcpListener::bind(("0.0.0.0", squatted)).expect("the NodePort to take");
    setup.apply(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: squatted}}\nspec:\n  type: NodePort\n  selector: {{app: echo}}\n  ports: [{{port: 9000, nodePort: {squatted}}}]\n"
    ));
    setup.wait("a NodePortInUse event on the Service", Duration::from_secs(30), || {
        let events =
            setup.kubectl(&["get", "events", "--field-selector", "involvedObject.name=squatted", "-o", "json"]);
        events.contains("\"NodePortInUse\"") && events.contains(&format!("NodePort {squatted}/tcp is already in use"))
    });
    drop(taken);

    // A killed agent's rules stay in the kernel: traffic still flows. Its
    // restart resyncs without doubling its jumps.
    let tag = &tag0;
    let bridge = skiff_node::cni::bridge_name("node-0");
    let mut setup = setup;
    setup.nodes[0].kill();
    let body = http_get(gateways[0], node_port, "/").unwrap_or_default();
    assert!(body.contains("hello-from-"), "forwarding with the agent dead: {body:?}");
    let synced_before = setup.nodes[0].log().matches("service rules synced in full").count();
    setup.nodes[0].restart();
    setup.wait("the restarted agent's first sync", Duration::from_secs(60), || {
        setup.nodes[0].log().matches("service rules synced in full").count() > synced_before
    });
    if nftables {
        let table = skiff_node::proxy::nft::table(tag);
        let prerouting = nft(&["list", "chain", "ip", &table, "nat-prerouting"]);
        let own_bridge_jumps = prerouting.lines().filter(|l| l.contains(&format!("iifname \"{bridge}\""))).count();
        assert_eq!(own_bridge_jumps, 1, "{prerouting}");
        let saved = iptables_save();
        assert!(!saved.contains(&format!("SKIFF-SVCS-{tag}")), "no iptables rules of node-0's: {saved}");
    } else {
        let saved = iptables_save();
        let own_bridge_jumps =
            saved.lines().filter(|l| l.starts_with("-A PREROUTING") && l.contains(&format!("-i {bridge} "))).count();
        assert_eq!(own_bridge_jumps, 1, "{saved}");
        assert!(saved.contains(&format!(":SKIFF-SVCS-{tag} ")), "{saved}");
    }
    assert!(fetch_from(&setup, "client", "http://web/", 1)[0].starts_with("hello-from-"));

    // `skiff proxy --cleanup` leaves no Skiff chain behind.
    setup.nodes[1].kill();
    let cleanup = std::process::Command::new(SKIFF).args(["proxy", "--cleanup"]).output().expect("skiff proxy runs");
    assert!(cleanup.status.success(), "{cleanup:?}");
    let saved = iptables_save();
    assert!(!saved.contains("SKIFF-"), "{saved}");
    let tables = nft(&["list", "tables"]);
    assert!(!tables.contains(skiff_node::proxy::nft::TABLE_PREFIX), "{tables}");
}

/// What `nft` prints for `args` (empty if it fails).
fn nft(args: &[&str]) -> String {
    let out = std::process::Command::new("nft").args(args).output().expect("nft runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `test` on a thread in a network namespace of its own: the
/// iptables commands it (or a `Syncer` in it) starts see only that
/// namespace's tables, which go with the thread.
fn in_own_network_namespace<T: Send + 'static>(test: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        // SAFETY: only the network namespace is unshared, never the file table.
        unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNET) }
            .expect("a network namespace of its own (needs root)");
        test()
    })
    .join()
    .expect("the test's thread")
}

fn run_with_stdin(program: &str, args: &[&str], stdin: &str) -> std::process::Output {
    let mut child = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{program} runs: {e}"));
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

/// One port of every kind the proxy's rules have.
fn every_kind_of_service_port() -> Vec<skiff_node::proxy::model::ServicePort> {
    use skiff_node::proxy::model::{Endpoint, ServicePort};
    use std::net::Ipv4Addr;
    let port = |name: &str, ip: u8, endpoints: &[(u8, bool)]| ServicePort {
        key: format!("default/{name}:http"),
        protocol: "tcp",
        cluster_ips: vec![Ipv4Addr::new(10, 96, 0, ip)],
        external_ips: vec![],
        port: 80,
        node_port: None,
        affinity_seconds: None,
        external_local: false,
        internal_local: false,
        endpoints: endpoints
            .iter()
            .map(|&(last, local)| Endpoint { ip: Ipv4Addr::new(10, 244, 1, last), port: 8080, local })
            .collect(),
    };
    let spread = port("spread", 1, &[(1, true), (2, false), (3, false), (4, false), (5, false)]);
    let mut sticky = port("sticky", 2, &[(6, true), (7, false)]);
    sticky.affinity_seconds = Some(600);
    let mut node_port = port("nodeport", 3, &[(8, true), (9, false)]);
    node_port.node_port = Some(30080);
    node_port.external_ips = vec![Ipv4Addr::new(192, 0, 2, 10)];
    let mut local = port("local", 4, &[(10, true), (11, false)]);
    local.node_port = Some(30081);
    local.external_local = true;
    local.internal_local = true;
    let mut dns = port("dns", 5, &[(12, false)]);
    dns.protocol = "udp";
    dns.port = 53;
    let mut empty = port("empty", 6, &[]);
    empty.node_port = Some(30082);
    vec![spread, sticky, node_port, local, dns, empty]
}

/// The proxy's syncs against the real iptables (in a namespace of the
/// test's own): every kind of rule reads back from `iptables-save` exactly
/// as rendered, so a full sync compares instead of rewriting; a restarted
/// proxy writes nothing; drift is repaired; UDP flows are cleared with the
/// real `conntrack`.
#[test]
fn proxy_full_syncs_read_the_kernel_back_and_write_only_what_differs() {
    use skiff_node::proxy::rules::{self, Context};
    use skiff_node::proxy::{cleanup, ProxyConfig, Syncer};
    if !is_root() {
        eprintln!("skipped: needs root for a network namespace and iptables");
        return;
    }
    let save = || String::from_utf8(std::process::Command::new("iptables-save").output().unwrap().stdout).unwrap();
    in_own_network_namespace(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        runtime.block_on(async {
            let mut config = ProxyConfig::new("node-a", "10.244.0.0/16");
            config.bridge = Some("skiff0a1b2c3d".into());
            let context = Context { tag: rules::tag("node-a"), cluster_cidr: config.cluster_cidr.clone() };
            let ports = every_kind_of_service_port();
            let wanted = rules::render(&ports, &context);
            let chains = wanted.nat.len() + wanted.filter.len();

            let mut first = Syncer::new(config.clone(), context.clone());
            let synced = first.sync(&ports).await.expect("the first sync");
            assert_eq!((synced.chains_written, synced.jumps_added), (chains, 9));
            assert_eq!(synced.new_node_ports, vec![(30080, "tcp"), (30081, "tcp"), (30082, "tcp")]);
            assert_eq!(rules::parse_save(&save()).ours, wanted, "every rule reads back as rendered");
            assert!(first.kernel_has_rules().await);
            assert_eq!(first.sync(&ports).await.expect("a sync").chains_written, 0, "nothing changed");

            // The UDP port loses its endpoint: its flows are cleared
            // (`conntrack -D` takes the arguments; none match here).
            let mut without = ports.clone();
            without.iter_mut().find(|p| p.protocol == "udp").expect("the UDP port").endpoints.clear();
            let synced = first.sync(&without).await.expect("a sync");
            assert_eq!(synced.flows_cleared, 1, "through its cluster IP");
            assert!(synced.chains_written > 0);
            first.sync(&ports).await.expect("a sync");

            // A restarted proxy finds its rules in place and writes nothing.
            let mut restarted = Syncer::new(config.clone(), context.clone());
            let synced = restarted.sync(&ports).await.expect("the restarted sync");
            assert_eq!((synced.chains_written, synced.chains_deleted, synced.jumps_added), (0, 0, 0));

            // A chain a previous run left, a jump someone deleted.
            let output = rules::jumps(&context.tag, config.bridge.as_deref())
                .into_iter()
                .find(|j| j.table == "nat" && j.chain == "OUTPUT")
                .expect("the OUTPUT jump");
            let stale = format!("SKIFF-SVC-{}-0000000000", context.tag);
            let drift = format!("*nat\n:{stale} - [0:0]\n-A {stale} -j RETURN\n-D OUTPUT {}\nCOMMIT\n", output.rule);
            let out = run_with_stdin("iptables-restore", &["--noflush"], &drift);
            assert!(out.status.success(), "{out:?}");
            assert!(!restarted.kernel_has_rules().await, "the missing jump is noticed");
            restarted.forget();
            let synced = restarted.sync(&ports).await.expect("the repairing sync");
            assert_eq!((synced.chains_written, synced.chains_deleted, synced.jumps_added), (0, 1, 1));
            assert!(restarted.kernel_has_rules().await);
            let saved = save();
            let line = format!("-A OUTPUT {}", output.rule);
            assert_eq!(saved.lines().filter(|l| *l == line).count(), 1, "the jump is there once");
            assert!(!saved.contains(&stale));

            assert_eq!(cleanup(Some(context.tag.as_str())).await.expect("the cleanup"), chains);
            let saved = save();
            assert!(!saved.contains(rules::PREFIX), "nothing of Skiff's is left: {saved}");
        })
    });
}

/// The nftables mode against the real `nft` (in a namespace of the
/// test's own): the whole table is accepted; a second sync writes
/// nothing; an incremental sync writes only the chains that changed and
/// deletes those gone in the same transaction; a restarted proxy rewrites
/// the table and deletes what a previous run left in it; a deleted table
/// is noticed; switching modes and `cleanup` leave nothing behind.
#[test]
fn proxy_nftables_mode_programs_one_table_and_changes_only_what_changed() {
    use skiff_node::proxy::nft;
    use skiff_node::proxy::rules::{self, Context};
    use skiff_node::proxy::{cleanup, Mode, ProxyConfig, Syncer};
    if !is_root() {
        eprintln!("skipped: needs root for a network namespace and nftables");
        return;
    }
    in_own_network_namespace(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        runtime.block_on(async {
            let mut config = ProxyConfig::new("node-a", "10.244.0.0/16");
            config.mode = Mode::Nftables;
            config.bridge = Some("skiff0a1b2c3d".into());
            let context = Context { tag: rules::tag("node-a"), cluster_cidr: config.cluster_cidr.clone() };
            let table = nft::table(&context.tag);
            let ports = every_kind_of_service_port();
            let wanted = nft::render(&ports, &context, config.bridge.as_deref());

            let mut first = Syncer::new(config.clone(), context.clone());
            let synced = first.sync(&ports).await.expect("the first sync");
            assert_eq!(synced.chains_written, wanted.chains.len());
            assert_eq!(synced.new_node_ports, vec![(30080, "tcp"), (30081, "tcp"), (30082, "tcp")]);
            let listed = nft::Kernel::list(&table).await.expect("the listing");
            assert_eq!(listed.chains, wanted.chains.keys().cloned().collect(), "every chain is in the kernel");
            let affinity = |listed: &nft::Listed| -> std::collections::BTreeSet<String> {
                listed.sets.iter().filter(|s| s.starts_with("affinity-")).cloned().collect()
            };
            assert_eq!(affinity(&listed), wanted.sets.keys().cloned().collect(), "every affinity set");
            let held = nft(&["list", "map", "ip", &table, nft::SERVICE_IPS]);
            assert!(held.contains("10.96.0.2 . tcp . 80 : goto service-default/sticky/tcp/p80"), "{held}");
            let held = nft(&["list", "map", "ip", &table, nft::NO_ENDPOINT_NODEPORTS]);
            assert!(held.contains("tcp . 30082 : goto reject-chain"), "{held}");
            let held = nft(&["list", "set", "ip", &table, nft::HAIRPIN]);
            assert!(held.contains("10.244.1.1 . 10.244.1.1"), "this node's endpoints: {held}");
            assert!(!held.contains("10.244.1.2 . 10.244.1.2"), "not another node's: {held}");
            assert!(first.kernel_has_rules().await);
            let synced = first.sync(&ports).await.expect("a sync");
            assert_eq!((synced.chains_written, synced.chains_deleted), (0, 0), "nothing changed");

            // An endpoint goes from a sticky Service: its chain and its
            // affinity set go with it, and only the Service's chain is rewritten.
            let mut fewer = ports.clone();
            let sticky = fewer.iter_mut().find(|p| p.key.starts_with("default/sticky")).expect("the sticky port");
            sticky.endpoints.pop();
            let synced = first.sync(&fewer).await.expect("an incremental sync");
            assert_eq!((synced.chains_written, synced.chains_deleted), (1, 1));
            let listed = nft::Kernel::list(&table).await.expect("the listing");
            let after = nft::render(&fewer, &context, config.bridge.as_deref());
            assert_eq!(listed.chains, after.chains.keys().cloned().collect());
            assert_eq!(affinity(&listed), after.sets.keys().cloned().collect());
            // The UDP port loses its endpoint: its flows are cleared.
            let mut without = fewer.clone();
            without.iter_mut().find(|p| p.protocol == "udp").expect("the UDP port").endpoints.clear();
            let synced = first.sync(&without).await.expect("a sync");
            assert_eq!(synced.flows_cleared, 1, "through its cluster IP");
            let held = nft(&["list", "map", "ip", &table, nft::NO_ENDPOINT_SERVICES]);
            assert!(held.contains("10.96.0.5 . udp . 53 : goto reject-chain"), "{held}");

            // A restarted proxy: a full rewrite, and a chain a previous
            // run left is deleted.
            let planted = format!("add chain ip {table} service-default/gone/tcp/p80\n");
            assert!(run_with_stdin("nft", &["-f", "-"], &planted).status.success());
            let mut restarted = Syncer::new(config.clone(), context.clone());
            let synced = restarted.sync(&ports).await.expect("the restarted sync");
            assert_eq!((synced.chains_written, synced.chains_deleted), (wanted.chains.len(), 1));
            let listed = nft::Kernel::list(&table).await.expect("the listing");
            assert_eq!(listed.chains, wanted.chains.keys().cloned().collect());

            // Someone deletes the table: noticed, and rewritten in full.
            assert!(run_with_stdin("nft", &["-f", "-"], &format!("delete table ip {table}\n")).status.success());
            assert!(!restarted.kernel_has_rules().await, "the missing table is noticed");
            restarted.forget();
            restarted.sync(&ports).await.expect("the repairing sync");
            assert!(restarted.kernel_has_rules().await);

            assert_eq!(cleanup(Some(context.tag.as_str())).await.expect("the cleanup"), wanted.chains.len());
            assert!(!nft(&["list", "tables"]).contains(nft::TABLE_PREFIX), "nothing of Skiff's is left");
        })
    });
}
