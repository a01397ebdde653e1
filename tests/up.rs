//! Real-process tests of the whole-cluster commands: `skiff up` (a
//! kubeconfig that kubectl uses, a status line, a clean stop of every
//! process on SIGINT/SIGTERM, a restart on the same directory that resumes
//! the same data, five masters, a master killed with SIGKILL and restarted,
//! processes that end with a `skiff up` killed with SIGKILL, a second
//! `skiff up` refused on a directory in use) and `skiff server` started
//! from a YAML config file.

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
            .args(["up", "--nodes", "0", "--masters", &masters.to_string(), "--dir"])
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

    /// etcdctl against the client port at `client` as the cluster's admin:
    /// `skiff up` serves it over TLS, and the etcd API is for
    /// system:masters only.
    fn etcdctl(&self, client: &str, args: &[&str]) -> Output {
        let pki = self.dir.join("pki");
        let file = |name: &str| pki.join(name).display().to_string();
        let (ca, cert, key) = (file("ca.crt"), file("admin.crt"), file("admin.key"));
        let tls = ["--cacert", &ca, "--cert", &cert, "--key", &key];
        etcdctl(&format!("https://{client}"), &[&tls[..], args].concat(), None)
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

/// Whether `pid` runs: a zombie has exited (an orphan's may wait a while
/// for a reaper that never comes in a container).
fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next()).is_some_and(|state| state != "Z")
}

/// The `THP_enabled` line of `pid`'s status: false once the process has
/// turned transparent huge pages off (`PR_SET_THP_DISABLE`).
fn thp_enabled(pid: u32) -> Option<bool> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("THP_enabled:"))?;
    Some(line.trim() == "1")
}

/// The pid of master `id` among the processes of `skiff up` `up_pid`.
#[track_caller]
fn master_pid(up_pid: u32, id: u64) -> u32 {
    let name = format!("\0--name\0master-{id}\0");
    let found = children_of(up_pid).into_iter().find(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(&name))
    });
    found.unwrap_or_else(|| panic!("skiff up {up_pid} runs no master-{id}"))
}

/// Runs `cmd` to its end, failing the test if that takes a minute.
#[track_caller]
fn must_exit_within_a_minute(cmd: &mut Command) -> Output {
    let child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
            panic!("{cmd:?} did not exit within a minute");
        }
    }
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

    // Over HTTPS, as the admin the kubeconfig names; without its
    // certificate, only the probes answer.
    let who =
        ok(up.kubectl(&["auth", "whoami", "-o", "jsonpath={.status.userInfo.username} {.status.userInfo.groups}"]));
    assert!(who.starts_with("skiff-admin ") && who.contains("system:masters"), "{who}");
    let ca = up.dir.join("pki/ca.crt").display().to_string();
    let anonymous = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", &ca])
        .args([format!("https://127.0.0.1:{http}/api/v1/namespaces"), format!("https://127.0.0.1:{http}/healthz")])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&anonymous.stdout), "401200");
    let ca_pem = std::fs::read(&ca).unwrap();

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
    // Not a terminal: a status line each time the status changes. The
    // first may predate the election (it is sampled every 2 s), so wait for
    // one that names the leader.
    up.must_print("masters up 3/3 · nodes ready 0/0", READY);
    up.must_print("\nleader master-", READY);

    let status = up.must_stop("INT");
    assert!(status.success(), "skiff up exited with {status}:\n{}", up.logs());
    for i in 1..=3 {
        let log = std::fs::read_to_string(up.dir.join(format!("member-{i}.log"))).unwrap();
        assert!(log.contains("shutting down"), "master-{i} was not stopped by a signal it handles:\n{log}");
    }
    assert!(up.output().contains("cluster stopped"), "{}", up.logs());

    // The same directory again: the same cluster, with its data and its
    // certificate authority.
    let mut up = Up::start(root.path(), 3, base, http, 2);
    assert_eq!(std::fs::read(&ca).unwrap(), ca_pem, "a second run keeps the cluster's CA");
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
        .args(["up", "--nodes", "0", "--masters", "5", "--dir"])
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
    let members = must_succeed(up.etcdctl(&format!("127.0.0.1:{base}"), &["member", "list"]));
    // Without the admin's certificate, the etcd API says who it is for.
    let ca = up.dir.join("pki/ca.crt").display().to_string();
    let anonymous = etcdctl(&format!("https://127.0.0.1:{base}"), &["--cacert", &ca, "get", "k"], None);
    assert!(String::from_utf8_lossy(&anonymous.stderr).contains("Unauthenticated"), "{anonymous:?}");
    for i in 1..=5 {
        assert!(members.contains(&format!("started, master-{i},")), "{members}");
    }
    // The masters turn transparent huge pages off for themselves; `skiff
    // up` keeps the host's policy, which the nodes it starts inherit.
    let ours = thp_enabled(std::process::id()).expect("the kernel reports THP_enabled in /proc/PID/status");
    assert_eq!(thp_enabled(up.pid()), Some(ours), "skiff up keeps its parent's setting");
    for i in 1..=5 {
        assert_eq!(thp_enabled(master_pid(up.pid(), i)), Some(false), "master-{i}");
    }
    let status = up.must_stop("INT");
    assert!(status.success(), "skiff up exited with {status}:\n{}", up.logs());
}

/// What a user does to watch a failover: `kill -9` the leader. `skiff up`
/// restarts it, appending to its log, while the other masters take writes.
#[test]
fn up_restarts_a_master_killed_with_sigkill_while_the_others_keep_serving() {
    let root = tempfile::tempdir().unwrap();
    let (base, http) = (free_span(25), free_span(25));
    let client = |id: u64| format!("127.0.0.1:{}", base + 10 * (id as u16 - 1));
    let mut up = Up::start(root.path(), 3, base, http, 1);
    up.must_kubectl_show(&["get", "ns", "-o", "name"], "namespace/default", READY);
    up.must_print("\nleader master-", READY);
    let output = up.output();
    let status = output.lines().rev().find(|l| l.starts_with("leader master-")).unwrap();
    let victim: u64 = status["leader master-".len()..].split(' ').next().unwrap().parse().unwrap();
    let other = victim % 3 + 1;
    let log = up.dir.join(format!("member-{victim}.log"));
    let old_pid = master_pid(up.pid(), victim);
    let log_before = std::fs::read_to_string(&log).unwrap();
    assert!(Command::new("kill").args(["-KILL", &old_pid.to_string()]).status().unwrap().success());
    // Until its listeners are closed: its main thread may be a zombie
    // while the others still exit.
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(client(victim)).is_ok() {
        assert!(Instant::now() < deadline, "master-{victim} still serves 30s after SIGKILL:\n{}", up.logs());
        std::thread::sleep(Duration::from_millis(10));
    }

    // Each round writes through another master, noting whether the killed
    // one was down (its client port refusing connections) when the write
    // began, until the killed one serves the write again. Its first
    // restart comes a second after its death, long after the first round
    // began.
    let mut writes_while_down = 0;
    let deadline = Instant::now() + READY;
    for round in 0.. {
        let down = std::net::TcpStream::connect(client(victim)).is_err();
        let key = format!("while-master-{victim}-restarts-{round}");
        must_succeed(up.etcdctl(&client(other), &["put", &key, "written"]));
        if down {
            writes_while_down += 1;
        } else if stdout(&up.etcdctl(&client(victim), &["get", &key])).contains("written") {
            break;
        }
        assert!(Instant::now() < deadline, "master-{victim} never served again:\n{}", up.logs());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(writes_while_down > 0, "no write began while master-{victim} was down:\n{}", up.logs());

    assert_ne!(master_pid(up.pid(), victim), old_pid, "a new process serves master-{victim}");
    let out = up.output();
    assert!(out.contains(&format!("master-{victim} exited (signal: 9")), "{}", up.logs());
    assert!(out.contains(&format!("master-{victim} restarted (restart 1)")), "{}", up.logs());
    up.must_print("masters up 3/3 · nodes ready 0/0 · restarts 1", READY);
    let log_after = std::fs::read_to_string(&log).unwrap();
    assert!(log_after.starts_with(&log_before), "the log of master-{victim} was not appended to");
    assert!(log_after.contains(&format!("skiff up: master-{victim} exited")), "{log_after}");

    let status = up.must_stop("INT");
    assert!(status.success(), "skiff up exited with {status}:\n{}", up.logs());
}

/// `skiff up` killed with SIGKILL cannot stop its processes: they end with
/// it anyway, and the next `skiff up` on the directory starts.
#[test]
fn processes_end_with_a_skiff_up_killed_with_sigkill_and_the_dir_starts_again() {
    let root = tempfile::tempdir().unwrap();
    let (base, http) = (free_span(25), free_span(25));
    let mut up = Up::start(root.path(), 3, base, http, 1);
    up.must_kubectl_show(&["get", "ns", "-o", "name"], "namespace/default", READY);
    up.must_print("masters up 3/3", READY);
    let members = children_of(up.pid());
    assert_eq!(members.len(), 9, "an apiserver, a controller manager and a scheduler per master:\n{}", up.logs());
    let mut child = up.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left: Vec<u32> = members.iter().copied().filter(|&p| alive(p)).collect();
        if left.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            for pid in &left {
                let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            }
            panic!("processes {left:?} outlived skiff up killed with SIGKILL by 30s:\n{}", up.logs());
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    let mut up = Up::start(root.path(), 3, base, http, 2);
    up.must_kubectl_show(&["get", "ns", "-o", "name"], "namespace/default", READY);
    up.must_print("masters up 3/3", READY);
    let status = up.must_stop("TERM");
    assert!(status.success(), "skiff up exited with {status}:\n{}", up.logs());
}

#[test]
fn a_second_up_on_a_dir_in_use_names_the_running_processes_and_leaves_them_be() {
    let root = tempfile::tempdir().unwrap();
    let (base, http) = (free_span(5), free_span(5));
    let mut up = Up::start(root.path(), 1, base, http, 1);
    up.must_kubectl_show(&["get", "ns", "-o", "name"], "namespace/default", READY);
    let master = master_pid(up.pid(), 1);

    let second = must_exit_within_a_minute(
        Command::new(SKIFF).args(["up", "--nodes", "0", "--masters", "1", "--dir"]).arg(&up.dir).args([
            "--base-port",
            &base.to_string(),
            "--http-base-port",
            &http.to_string(),
        ]),
    );
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("is in use by another skiff up"), "{err}");
    assert!(err.contains(&format!("skiff up (pid {})", up.pid())), "{err}");
    assert!(err.contains(&format!("master-1 (pid {master})")), "{err}");

    assert_eq!(master_pid(up.pid(), 1), master, "the running master was left alone");
    up.must_kubectl_show(&["get", "ns", "-o", "name"], "namespace/default", READY);
    let status = up.must_stop("INT");
    assert!(status.success(), "skiff up exited with {status}:\n{}", up.logs());
}

/// A running `skiff server`, killed if a test panics.
struct Server {
    child: Option<Child>,
    log: PathBuf,
}

impl Server {
    fn start(config: &Path, extra: &[&str]) -> Server {
        let log = config.with_extension("log");
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(SKIFF)
            .args(["server", "--config"])
            .arg(config)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        Server { child: Some(child), log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then its exit status.
    #[track_caller]
    fn must_stop(&mut self) -> ExitStatus {
        let mut child = self.child.take().unwrap();
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = child.try_wait().unwrap() {
                return s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("skiff server did not stop within 30s of SIGTERM:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs kubectl against `http` until its output contains `want`.
#[track_caller]
fn must_kubectl_at(http: &str, args: &[&str], want: &str, logs: &dyn Fn() -> String) -> String {
    must_kubectl_as(&format!("http://{http}"), &[], args, want, logs)
}

/// kubectl against `url` with `auth` (e.g. a CA and a client certificate)
/// until its output shows `want`.
#[track_caller]
fn must_kubectl_as(url: &str, auth: &[&str], args: &[&str], want: &str, logs: &dyn Fn() -> String) -> String {
    let cache = tempfile::tempdir().unwrap();
    let deadline = Instant::now() + READY;
    loop {
        let o = Command::new("kubectl")
            .args(["--server", url, "--cache-dir"])
            .arg(cache.path())
            .args(auth)
            .args(args)
            .output()
            .expect("kubectl is installed (make test installs what is missing)");
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        if o.status.success() && out.contains(want) {
            return out;
        }
        assert!(Instant::now() < deadline, "kubectl {args:?} never showed {want:?}: {out}\n{}", logs());
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// `etcdctl member list` through `client` once it shows `started` members.
#[track_caller]
fn must_started_members(client: &str, n: usize) -> String {
    must_started_members_as(client, &[], n)
}

/// [`must_started_members`] with `auth` (etcdctl's TLS flags).
#[track_caller]
fn must_started_members_as(client: &str, auth: &[&str], n: usize) -> String {
    // A member publishes its name through the log shortly after it starts.
    let deadline = Instant::now() + READY;
    loop {
        let members = stdout(&etcdctl(client, &[auth, &["member", "list"]].concat(), None));
        if members.matches(", started, ").count() == n {
            return members;
        }
        assert!(Instant::now() < deadline, "never {n} started members: {members}");
        std::thread::sleep(Duration::from_millis(200));
    }
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
    let mut server = Server::start(&config, &["--name", "from-flag"]);
    must_kubectl_at(&format!("127.0.0.1:{http}"), &["get", "ns", "-o", "name"], "namespace/default", &|| server.log());
    let members = must_started_members(&format!("127.0.0.1:{client}"), 1);
    assert!(members.contains("started, from-flag,"), "the command line overrides the file: {members}");
    let status = server.must_stop();
    assert!(status.success(), "skiff server exited with {status}:\n{}", server.log());
}

/// deploy/examples/master-N.yaml with each `10.0.0.N:PORT` moved to a free
/// loopback port, the data dir into `root` and /etc/skiff/pki to `pki`.
fn example_on_loopback(
    name: &str,
    root: &Path,
    pki: &Path,
    ports: &mut std::collections::BTreeMap<String, u16>,
) -> PathBuf {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples").join(name)).unwrap();
    let mut out = text.replace("/var/lib/skiff/data", &root.join(name).with_extension("data").display().to_string());
    out = out.replace("/etc/skiff/pki", &pki.display().to_string());
    for host in 1..=4 {
        for port in [2379, 2380, 6443] {
            let addr = format!("10.0.0.{host}:{port}");
            let local = *ports.entry(addr.clone()).or_insert_with(free_port);
            out = out.replace(&addr, &format!("127.0.0.1:{local}"));
        }
    }
    let settings: String = out.lines().map(|l| l.split('#').next().unwrap_or_default()).collect();
    assert!(!settings.contains("10.0.0."), "an address the test does not move: {out}");
    let path = root.join(name);
    std::fs::write(&path, out).unwrap();
    path
}

/// The files deploy/README.md's section 2 has the operator make, in
/// `pki`, for masters reached at 127.0.0.1.
fn deploy_pki(pki: &Path) {
    let p = pki.to_str().unwrap();
    let skiffctl = |args: &[&str]| {
        let o = Command::new(skiffctl_path()).args(args).output().unwrap();
        assert!(o.status.success(), "skiffctl {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    };
    skiffctl(&["certs", "ca", "--dir", p]);
    skiffctl(&["certs", "server", "--dir", p, "--host", "127.0.0.1"]);
    for i in 1..=3 {
        skiffctl(&["certs", "peer", "--dir", p, "--name", &format!("master-{i}"), "--host", "127.0.0.1"]);
    }
    skiffctl(&["certs", "client", "--dir", p, "--user", "admin", "--group", "system:masters"]);
    skiff_pki::load_or_create_signing_key(pki).unwrap();
}

/// The documented three-host bootstrap, with TLS and authentication on,
/// and a fourth master joining with a token, with the shipped example
/// configs moved onto loopback.
#[test]
fn deploy_examples_form_a_secured_cluster_and_a_fourth_master_joins_with_a_token() {
    let root = tempfile::tempdir().unwrap();
    let pki = root.path().join("pki");
    deploy_pki(&pki);
    let file = |name: &str| pki.join(name).display().to_string();
    let (ca, admin, admin_key) = (file("ca.crt"), file("admin.crt"), file("admin.key"));
    let kubectl_auth = ["--certificate-authority", &ca, "--client-certificate", &admin, "--client-key", &admin_key];
    let etcdctl_auth = ["--cacert", ca.as_str(), "--cert", &admin, "--key", &admin_key];
    let mut ports = std::collections::BTreeMap::new();
    let addr = |ports: &std::collections::BTreeMap<String, u16>, host: u32, port: u32| {
        format!("127.0.0.1:{}", ports[&format!("10.0.0.{host}:{port}")])
    };
    let mut servers: Vec<Server> = Vec::new();
    for i in 1..=3 {
        let config = example_on_loopback(&format!("master-{i}.yaml"), root.path(), &pki, &mut ports);
        servers.push(Server::start(&config, &[]));
    }
    let logs = |servers: &[Server]| servers.iter().map(Server::log).collect::<Vec<_>>().join("\n---\n");
    let https = |ports: &std::collections::BTreeMap<String, u16>, host| format!("https://{}", addr(ports, host, 6443));
    let url = https(&ports, 2);
    must_kubectl_as(&url, &kubectl_auth, &["get", "ns", "-o", "name"], "namespace/default", &|| logs(&servers));
    // Nobody else gets in.
    let anonymous = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", &ca, &format!("{url}/api/v1/namespaces")])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&anonymous.stdout), "401", "{anonymous:?}");
    let first = format!("https://{}", addr(&ports, 1, 2379));
    must_started_members_as(&first, &etcdctl_auth, 3);

    // The fourth master: the example's token line filled in, nothing else.
    let token = Command::new(skiffctl_path())
        .args(["--server", &first, "--certificate-authority", &ca, "--client-certificate", &admin])
        .args(["--client-key", &admin_key, "token", "create", "--usages", "join-master", "--ttl", "10m"])
        .output()
        .unwrap();
    assert!(token.status.success(), "{token:?}");
    let token = String::from_utf8(token.stdout).unwrap().trim().to_string();
    let config = example_on_loopback("master-4-join.yaml", root.path(), &pki, &mut ports);
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("token: K10<CA hash>::<id>.<secret>"), "{text}");
    std::fs::write(&config, text.replace("K10<CA hash>::<id>.<secret>", &token)).unwrap();
    servers.push(Server::start(&config, &[]));
    let members = must_started_members_as(&first, &etcdctl_auth, 4);
    let fourth = members.lines().find(|l| l.starts_with("4, started, master-4,")).unwrap_or_default();
    assert!(fourth.ends_with(", false"), "master-4 is a voter, not a learner: {members}");
    let url = https(&ports, 4);
    must_kubectl_as(&url, &kubectl_auth, &["get", "ns", "-o", "name"], "namespace/default", &|| logs(&servers));
    assert!(servers[3].log().contains("the cluster handed this master its credentials"), "{}", servers[3].log());

    for s in &mut servers {
        let status = s.must_stop();
        assert!(status.success(), "skiff server exited with {status}:\n{}", s.log());
    }
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
