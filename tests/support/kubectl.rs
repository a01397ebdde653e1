//! The real kubectl against a test cluster's REST address: each call with
//! a fresh `--cache-dir`, so discovery is never stale between tests.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// A master's REST API as a test reaches it: its address and, on a
/// secured cluster, the CA to trust and the certificate to present.
#[derive(Clone, Debug)]
pub struct Api {
    pub addr: String,
    tls: Option<ClientCert>,
}

/// The files a client needs for HTTPS with a client certificate.
#[derive(Clone, Debug)]
pub struct ClientCert {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl ClientCert {
    /// The flags kubectl, skiffctl and Skiff's components take these files
    /// with: `--certificate-authority`, `--client-certificate`, `--client-key`.
    pub fn flags(&self) -> Vec<String> {
        [("--certificate-authority", &self.ca), ("--client-certificate", &self.cert), ("--client-key", &self.key)]
            .iter()
            .flat_map(|(flag, path)| [flag.to_string(), path.display().to_string()])
            .collect()
    }
}

impl Api {
    /// A master serving plain HTTP, which lets anyone in.
    pub fn plain(addr: &str) -> Api {
        Api { addr: addr.to_string(), tls: None }
    }

    /// A master serving HTTPS, reached as the holder of `cert`.
    pub fn secure(addr: &str, cert: ClientCert) -> Api {
        Api { addr: addr.to_string(), tls: Some(cert) }
    }

    /// The CA and client certificate of a secured cluster's API.
    pub fn client_cert(&self) -> Option<&ClientCert> {
        self.tls.as_ref()
    }

    /// The base URL: `https://ADDR` on a secured cluster, else `http://ADDR`.
    pub fn url(&self) -> String {
        match self.tls {
            Some(_) => format!("https://{}", self.addr),
            None => format!("http://{}", self.addr),
        }
    }

    /// kubectl's flags for this API: `--server`, and the CA and the
    /// client certificate on a secured cluster.
    pub fn kubectl_flags(&self) -> Vec<String> {
        let mut flags = vec!["--server".to_string(), self.url()];
        flags.extend(self.tls.iter().flat_map(ClientCert::flags));
        flags
    }

    /// curl's flags for this API (the CA and the client certificate).
    pub fn curl_flags(&self) -> Vec<String> {
        let Some(tls) = &self.tls else { return Vec::new() };
        [("--cacert", &tls.ca), ("--cert", &tls.cert), ("--key", &tls.key)]
            .iter()
            .flat_map(|(flag, path)| [flag.to_string(), path.display().to_string()])
            .collect()
    }

    /// `kubectl` for this API with a fresh discovery cache in `cache`.
    pub fn command(&self, cache: &std::path::Path) -> Command {
        let mut command = Command::new("kubectl");
        command.args(self.kubectl_flags()).arg("--cache-dir").arg(cache);
        command
    }
}

pub fn kubectl(api: &Api, args: &[&str]) -> Output {
    let cache = tempfile::tempdir().unwrap();
    api.command(cache.path()).args(args).output().expect("kubectl is installed (make test installs what is missing)")
}

pub fn kubectl_stdin(api: &Api, args: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    let cache = tempfile::tempdir().unwrap();
    let mut child = api
        .command(cache.path())
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
    pub fn start(api: &Api, target: &str, remote: u16) -> PortForward {
        PortForward::start_with(api, target, remote, false)
    }

    /// The same over a bare SPDY upgrade instead of kubectl's WebSocket
    /// tunnel (`KUBECTL_PORT_FORWARD_WEBSOCKETS=false`: what kubectl falls
    /// back to and client-go's SPDY dialer speaks), at `-v=6` so that its
    /// requests are in [`PortForward::stderr`].
    pub fn start_spdy(api: &Api, target: &str, remote: u16) -> PortForward {
        PortForward::start_with(api, target, remote, true)
    }

    fn start_with(api: &Api, target: &str, remote: u16, spdy: bool) -> PortForward {
        use std::io::BufRead;
        let dir = tempfile::tempdir().unwrap();
        let stderr = std::fs::File::create(dir.path().join("stderr")).unwrap();
        let mut command = api.command(&dir.path().join("cache"));
        command.args(["port-forward", target, &format!(":{remote}")]);
        if spdy {
            command.env("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false").arg("-v=6");
        }
        let mut child = command.stdout(Stdio::piped()).stderr(stderr).spawn().unwrap();
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

/// Waits (20 s at most) until the master at `api` has made the
/// `default` namespace, which it does once it leads or follows a leader.
pub async fn must_ready(api: &Api) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !String::from_utf8_lossy(&kubectl(api, &["get", "ns", "default", "-o", "name"]).stdout).contains("default") {
        assert!(std::time::Instant::now() < deadline, "namespace default never appeared");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
