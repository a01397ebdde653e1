//! The real kubectl against a test cluster's REST address: each call with
//! a fresh `--cache-dir`, so discovery is never stale between tests.

use std::process::{Command, Output, Stdio};

pub fn kubectl(server: &str, args: &[&str]) -> Output {
    let cache = tempfile::tempdir().unwrap();
    Command::new("kubectl")
        .args(["--server", &format!("http://{server}"), "--cache-dir"])
        .arg(cache.path())
        .args(args)
        .output()
        .expect("kubectl is installed (make test installs what is missing)")
}

pub fn kubectl_stdin(server: &str, args: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    let cache = tempfile::tempdir().unwrap();
    let mut child = Command::new("kubectl")
        .args(["--server", &format!("http://{server}"), "--cache-dir"])
        .arg(cache.path())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

#[track_caller]
pub fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "kubectl failed ({}):\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[track_caller]
pub fn fails(o: Output) -> String {
    assert!(!o.status.success(), "kubectl should have failed: {}", String::from_utf8_lossy(&o.stdout));
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A running `kubectl port-forward` to a random local port, killed when
/// dropped; its stderr is kept to read after it exits.
pub struct PortForward {
    child: std::process::Child,
    dir: tempfile::TempDir,
    /// The local port kubectl listens on.
    pub local: u16,
}

impl PortForward {
    /// Starts `kubectl port-forward <target> :<remote>` and waits for it
    /// to say where it listens.
    pub fn start(server: &str, target: &str, remote: u16) -> PortForward {
        use std::io::BufRead;
        let dir = tempfile::tempdir().unwrap();
        let stderr = std::fs::File::create(dir.path().join("stderr")).unwrap();
        let mut child = Command::new("kubectl")
            .args(["--server", &format!("http://{server}"), "--cache-dir"])
            .arg(dir.path().join("cache"))
            .args(["port-forward", target, &format!(":{remote}")])
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        // Reads on for the session's life ("Handling connection for ...").
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut forward = PortForward { child, dir, local: 0 };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            let Ok(line) = rx.recv_timeout(left) else { break };
            // "Forwarding from 127.0.0.1:40123 -> 8080"
            if let Some(port) = line
                .strip_prefix("Forwarding from 127.0.0.1:")
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|p| p.parse().ok())
            {
                forward.local = port;
                return forward;
            }
        }
        panic!("kubectl port-forward {target} did not start listening: {}", forward.stderr());
    }

    /// What kubectl wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    /// kubectl's exit status, if it exits within `within`.
    pub fn exited(&mut self, within: std::time::Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

impl Drop for PortForward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits (20 s at most) until the master at `server` has made the
/// `default` namespace, which it does once it leads or follows a leader.
pub async fn must_ready(server: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !String::from_utf8_lossy(&kubectl(server, &["get", "ns", "default", "-o", "name"]).stdout).contains("default")
    {
        assert!(std::time::Instant::now() < deadline, "namespace default never appeared");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
