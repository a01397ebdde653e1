//! Real-process tests of the whole-cluster commands: `skiff up` (a
//! kubeconfig that kubectl uses, a status line, a clean stop of every
//! process on SIGINT/SIGTERM, a restart on the same directory that resumes
//! the same data, five masters) and `skiff server` started from a YAML
//! config file.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use support::*;

/// A base port with `span` free ports from it (`skiff up` puts master `i`
/// at base + 10(i-1) and the port above). Moves support's shared counter
/// past the span so that no other test of this process is handed one.
fn free_span(span: u16) -> u16 {
    loop {
        let base = free_port();
        if u32::from(base) + u32::from(span) >= 32_000 {
            continue;
        }
        if (base..base + span).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            for _ in 0..span {
                free_port();
            }
            return base;
        }
    }
}

/// A running `skiff up`, stopped with SIGTERM (then SIGKILL) if a test
/// panics: its members are in process groups of their own, so only `skiff
/// up` can stop them.
struct Up {
    child: Option<Child>,
    dir: PathBuf,
    out: PathBuf,
}

impl Up {
    fn start(root: &Path, masters: u64, base: u16, http_base: u16, run: u32) -> Up {
        let dir = root.join("cluster");
        let out = root.join(format!("up-{run}.out"));
        let log = std::fs::File::create(&out).unwrap();
        let child = Command::new(SKIFF)
            .args(["up", "--masters", &masters.to_string(), "--dir"])
            .arg(&dir)
            .args(["--base-port", &base.to_string(), "--http-base-port", &http_base.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        Up { child: Some(child), dir, out }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    fn logs(&self) -> String {
        let mut all = format!("--- skiff up ---\n{}", self.output());
        for entry in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let p = entry.path();
            if p.extension().is_some_and(|e| e == "log") {
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect();
                all += &format!("\n--- {} ---\n{}", p.display(), tail.join("\n"));
            }
        }
        all
    }

    fn kubectl(&self, args: &[&str]) -> Output {
        let cache = tempfile::tempdir().unwrap();
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .arg("--cache-dir")
            .arg(cache.path())
            .args(args)
            .output()
            .expect("kubectl is installed (make test installs what is missing)")
    }

    /// Runs kubectl until its output contains `want`.
    #[track_caller]
    fn must_kubectl_show(&self, args: &[&str], want: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let o = self.kubectl(args);
            let out = String::from_utf8_lossy(&o.stdout).into_owned();
            if o.status.success() && out.contains(want) {
                return out;
            }
            assert!(
                Instant::now() < deadline,
                "kubectl {args:?} never showed {want:?}: {out}{}\n{}",
                String::from_utf8_lossy(&o.stderr),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    #[track_caller]
    fn must_print(&self, want: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.output().contains(want) {
            assert!(Instant::now() < deadline, "skiff up never printed {want:?}:\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Sends `signal` to `skiff up` alone and waits for it and for every
    /// process it started; returns its exit status.
    #[track_caller]
    fn must_stop(&mut self, signal: &str) -> ExitStatus {
        let members = children_of(self.pid());
        assert!(!members.is_empty(), "skiff up runs no process:\n{}", self.logs());
        let ok = Command::new("kill").args([&format!("-{signal}"), &self.pid().to_string()]).status().unwrap();
        assert!(ok.success());
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                self.child = Some(child);
                panic!("skiff up did not exit within 60s of SIG{signal}:\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let left: Vec<u32> = members.into_iter().filter(|p| Path::new(&format!("/proc/{p}")).exists()).collect();
        assert!(left.is_empty(), "processes {left:?} outlived skiff up:\n{}", self.logs());
        status
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let members = children_of(child.id());
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            let deadline = Instant::now() + Duration::from_secs(30);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
            for pid in members {
                let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            }
        }
    }
}

/// The processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // `pid (comm) state ppid ...`; comm may itself hold spaces and parentheses.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { continue };
        if rest.split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok()) == Some(pid) {
            out.push(child);
        }
    }
    out
}

#[track_caller]
fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "failed ({}):\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

const READY: Duration = Duration::from_secs(90);

#[test]
fn up_serves_kubectl_stops_every_process_and_resumes_on_the_same_dir() {
    let root = tempfile::tempdir().unwrap();
    let (base, http) = (free_span(25), free_span(25));

    let mut up = Up::start(root.path(), 3, base, http, 1);
    up.must_kubectl_show(&["get", "ns", "-o", "name"], "namespace/default", READY);
    let contexts = ok(up.kubectl(&["config", "get-contexts", "-o", "name"]));
    let mut contexts: Vec<&str> = contexts.lines().collect();
    contexts.sort();
    assert_eq!(contexts, ["skiff", "skiff-master-1", "skiff-master-2", "skiff-master-3"]);
    assert_eq!(ok(up.kubectl(&["config", "current-context"])).trim(), "skiff");
    ok(up.kubectl(&["create", "namespace", "kept"]));
    // Through master 3 alone, so that the data must replicate to the others.
    ok(up.kubectl(&[
        "--context",
        "skiff-master-3",
        "create",
        "configmap",
        "greeting",
        "-n",
        "kept",
        "--from-literal=hello=world",
    ]));

    let out = up.output();
    let kubeconfig = up.kubeconfig().display().to_string();
    assert!(out.contains(&format!("kubectl --kubeconfig {kubeconfig} get nodes")), "{out}");
    for i in 0..3u16 {
        let (client, peer, web) = (base + 10 * i, base + 10 * i + 1, http + 10 * i);
        let line = out.lines().find(|l| l.starts_with(&format!("master-{} ", i + 1))).unwrap_or_default();
        for port in [client, peer, web] {
            assert!(line.contains(&format!("127.0.0.1:{port} ")), "master-{}'s endpoints in {line:?}", i + 1);
        }
    }
    // Not a terminal: a status line each time the status changes.
    up.must_print("masters up 3/3 · nodes ready 0/0", READY);
    assert!(up.output().lines().any(|l| l.starts_with("leader master-")), "{}", up.output());

    let status = up.must_stop("INT");
    assert!(status.success(), "skiff up exited with {status}:\n{}", up.logs());
    for i in 1..=3 {
        let log = std::fs::read_to_string(up.dir.join(format!("member-{i}.log"))).unwrap();
        assert!(log.contains("shutting down"), "master-{i} was not stopped by a signal it handles:\n{log}");
    }
    assert!(up.output().contains("cluster stopped"), "{}", up.logs());

    // The same directory again: the same cluster, with its data.
    let mut up = Up::start(root.path(), 3, base, http, 2);
    up.must_kubectl_show(&["get", "ns", "-o", "name"], "namespace/kept", READY);
    let value = up.must_kubectl_show(
        &["--context", "skiff-master-2", "get", "configmap", "greeting", "-n", "kept", "-o", "jsonpath={.data.hello}"],
        "world",
        READY,
    );
    assert_eq!(value, "world");
    let status = up.must_stop("TERM");
    assert!(status.success(), "skiff up exited with {status}:\n{}", up.logs());

    // Another shape on that directory would strand members: refused.
    let o = Command::new(SKIFF)
        .args(["up", "--masters", "5", "--dir"])
        .arg(&up.dir)
        .args(["--base-port", &base.to_string(), "--http-base-port", &http.to_string()])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("holds a cluster of 3 masters"), "{o:?}");
}

#[test]
fn up_runs_five_masters() {
    let root = tempfile::tempdir().unwrap();
    let (base, http) = (free_span(45), free_span(45));
    let mut up = Up::start(root.path(), 5, base, http, 1);
    up.must_kubectl_show(&["--context", "skiff-master-5", "get", "ns", "-o", "name"], "namespace/default", READY);
    up.must_print("masters up 5/5", READY);
    let members = must_succeed(etcdctl(&format!("127.0.0.1:{base}"), &["member", "list"], None));
    for i in 1..=5 {
        assert!(members.contains(&format!("started, master-{i},")), "{members}");
    }
    let status = up.must_stop("INT");
    assert!(status.success(), "skiff up exited with {status}:\n{}", up.logs());
}

#[test]
fn server_starts_a_cluster_from_a_config_file_and_flags_override_it() {
    let root = tempfile::tempdir().unwrap();
    let (client, peer, http) = (free_port(), free_port(), free_port());
    let config = root.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "# a one-master cluster\nid: 1\nname: from-file\ndata-dir: {}\nclient-listen: 127.0.0.1:{client}\n\
             peer-listen: 127.0.0.1:{peer}\nhttp-listen: 127.0.0.1:{http}\ninitial-cluster:\n  - 1=127.0.0.1:{peer}\n\
             history-retention: 10000\n",
            root.path().join("data").display()
        ),
    )
    .unwrap();
    let log = root.path().join("server.log");
    let file = std::fs::File::create(&log).unwrap();
    let mut server = Command::new(SKIFF)
        .args(["server", "--config"])
        .arg(&config)
        .args(["--name", "from-flag"])
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    let stop = |server: &mut Child| {
        let _ = Command::new("kill").args(["-TERM", &server.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = server.try_wait().unwrap() {
                return Some(s);
            }
            if Instant::now() > deadline {
                let _ = server.kill();
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let cache = tempfile::tempdir().unwrap();
    let deadline = Instant::now() + READY;
    loop {
        let o = Command::new("kubectl")
            .args(["--server", &format!("http://127.0.0.1:{http}"), "--cache-dir"])
            .arg(cache.path())
            .args(["get", "ns", "-o", "name"])
            .output()
            .expect("kubectl is installed");
        if String::from_utf8_lossy(&o.stdout).contains("namespace/default") {
            break;
        }
        if Instant::now() > deadline {
            stop(&mut server);
            panic!("kubectl never listed default:\n{}", std::fs::read_to_string(&log).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    // A member publishes its name through the log shortly after it starts.
    let mut members = String::new();
    while !members.contains(", started, ") && Instant::now() < deadline {
        members = stdout(&etcdctl(&format!("127.0.0.1:{client}"), &["member", "list"], None));
        std::thread::sleep(Duration::from_millis(200));
    }
    let status = stop(&mut server);
    assert!(members.contains("started, from-flag,"), "the command line overrides the file: {members}");
    assert!(!members.contains("from-file"), "{members}");
    let status = status.expect("skiff server stops within 30s of SIGTERM");
    assert!(status.success(), "skiff server exited with {status}");
}

#[test]
fn server_refuses_a_config_file_with_an_unknown_key() {
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("config.yaml");
    std::fs::write(&config, "id: 1\ndata_dir: /tmp/x\n").unwrap();
    let o = Command::new(SKIFF).args(["server", "--config"]).arg(&config).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("unknown key \"data_dir\"") && err.contains("data-dir"), "{err}");
}
