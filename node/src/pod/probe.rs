//! Probes and lifecycle hooks: the four handlers (exec through the
//! runtime's `exec_sync`; tcpSocket, httpGet and grpc from the agent's
//! process to the pod's IP) plus a hook's `sleep`, and the per-container
//! probe state that turns results into Ready, Started or "kill it" by the
//! thresholds.
//!
//! httpGet is a small HTTP/1.1 GET written here over a tokio `TcpStream`,
//! or over TLS for `scheme: HTTPS` (the server's certificate is not
//! verified, as the kubelet's `InsecureSkipVerify`): a probe needs only the
//! status line, and this keeps the node crate off a second HTTP client
//! stack. grpc calls `grpc.health.v1.Health/Check` (tonic-health's client)
//! in plaintext, as the kubelet does; only `SERVING` passes.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, HTTPGetAction, LifecycleHandler, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};

use crate::runtime::Runtime;

/// Which probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeKind {
    /// Restart the container when it fails.
    Liveness,
    /// Take the pod out of service when it fails.
    Readiness,
    /// Hold the other two until it succeeds once.
    Startup,
}

impl ProbeKind {
    /// "Liveness", "Readiness", "Startup", as events name them.
    pub fn name(self) -> &'static str {
        match self {
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
            ProbeKind::Startup => "Startup",
        }
    }
}

/// A probe's or hook's action.
#[derive(Debug, Clone, PartialEq)]
pub enum Handler {
    /// Run a command in the container; exit code 0 is success.
    Exec(Vec<String>),
    /// Connect to a port.
    Tcp {
        /// The host, the pod's IP unless given.
        host: String,
        /// The port.
        port: u16,
    },
    /// GET a path; 200..=399 is success.
    Http {
        /// "HTTP" or "HTTPS".
        scheme: String,
        /// The host, the pod's IP unless given.
        host: String,
        /// The port.
        port: u16,
        /// The path with query.
        path: String,
        /// Extra headers.
        headers: Vec<(String, String)>,
    },
    /// Call `grpc.health.v1.Health/Check` (probes only).
    Grpc {
        /// The pod's IP.
        host: String,
        /// The port.
        port: u16,
        /// The service asked about; empty for the server as a whole.
        service: String,
    },
    /// Wait (hooks only).
    Sleep(Duration),
}

/// `host:port`, with an IPv6 host in brackets.
fn authority(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// A container port by number or by its name in the container's `ports`.
fn resolve_port(port: &IntOrString, container: &Container) -> Result<u16, String> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| format!("invalid port {n}")),
        IntOrString::String(name) => {
            if let Ok(n) = name.parse::<u16>() {
                return Ok(n);
            }
            container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .ok_or_else(|| format!("couldn't find port {name} in container {}", container.name))
        }
    }
}

fn http_handler(action: &HTTPGetAction, container: &Container, pod_ip: &str) -> Result<Handler, String> {
    Ok(Handler::Http {
        scheme: action.scheme.clone().unwrap_or_else(|| "HTTP".to_string()),
        host: action.host.clone().filter(|h| !h.is_empty()).unwrap_or_else(|| pod_ip.to_string()),
        port: resolve_port(&action.port, container)?,
        path: action.path.clone().unwrap_or_else(|| "/".to_string()),
        headers: action.http_headers.iter().flatten().map(|h| (h.name.clone(), h.value.clone())).collect(),
    })
}

/// The handler of a probe.
pub fn probe_handler(probe: &Probe, container: &Container, pod_ip: &str) -> Result<Handler, String> {
    if let Some(exec) = &probe.exec {
        Ok(Handler::Exec(exec.command.clone().unwrap_or_default()))
    } else if let Some(http) = &probe.http_get {
        http_handler(http, container, pod_ip)
    } else if let Some(tcp) = &probe.tcp_socket {
        Ok(Handler::Tcp {
            host: tcp.host.clone().filter(|h| !h.is_empty()).unwrap_or_else(|| pod_ip.to_string()),
            port: resolve_port(&tcp.port, container)?,
        })
    } else if let Some(grpc) = &probe.grpc {
        Ok(Handler::Grpc {
            host: pod_ip.to_string(),
            port: u16::try_from(grpc.port).map_err(|_| format!("invalid port {}", grpc.port))?,
            service: grpc.service.clone().unwrap_or_default(),
        })
    } else {
        Err("probe has no handler".to_string())
    }
}

/// The handler of a lifecycle hook.
pub fn hook_handler(hook: &LifecycleHandler, container: &Container, pod_ip: &str) -> Result<Handler, String> {
    if let Some(exec) = &hook.exec {
        Ok(Handler::Exec(exec.command.clone().unwrap_or_default()))
    } else if let Some(http) = &hook.http_get {
        http_handler(http, container, pod_ip)
    } else if let Some(sleep) = &hook.sleep {
        Ok(Handler::Sleep(Duration::from_secs(sleep.seconds.max(0) as u64)))
    } else if let Some(tcp) = &hook.tcp_socket {
        Ok(Handler::Tcp {
            host: tcp.host.clone().filter(|h| !h.is_empty()).unwrap_or_else(|| pod_ip.to_string()),
            port: resolve_port(&tcp.port, container)?,
        })
    } else {
        Err("hook has no handler".to_string())
    }
}

/// Runs `handler` against container `container_id`, at most `timeout`;
/// `Err` carries why it failed, as the `Unhealthy` event says it.
pub async fn run(
    runtime: &dyn Runtime,
    container_id: &str,
    handler: &Handler,
    timeout: Duration,
) -> Result<(), String> {
    match handler {
        Handler::Exec(cmd) => {
            let result = tokio::time::timeout(timeout, runtime.exec_sync(container_id, cmd, timeout)).await;
            match result {
                Err(_) => Err(format!("command {cmd:?} timed out")),
                Ok(Err(e)) => Err(e.to_string()),
                Ok(Ok(r)) if r.exit_code == 0 => Ok(()),
                Ok(Ok(r)) => {
                    let output = String::from_utf8_lossy(if r.stdout.is_empty() { &r.stderr } else { &r.stdout });
                    Err(format!("command {cmd:?} exited with {}: {}", r.exit_code, output.trim()))
                }
            }
        }
        Handler::Tcp { host, port } => {
            match tokio::time::timeout(timeout, TcpStream::connect((host.as_str(), *port))).await {
                Err(_) => Err(format!("dial tcp {host}:{port}: i/o timeout")),
                Ok(Err(e)) => Err(format!("dial tcp {host}:{port}: {e}")),
                Ok(Ok(_)) => Ok(()),
            }
        }
        Handler::Http { scheme, host, port, path, headers } => {
            let tls = match scheme.to_ascii_lowercase().as_str() {
                "http" => false,
                "https" => true,
                _ => return Err(format!("unsupported scheme {scheme:?}")),
            };
            let url = format!("{}://{}{path}", if tls { "https" } else { "http" }, authority(host, *port));
            match tokio::time::timeout(timeout, http_get(tls, host, *port, path, headers)).await {
                Err(_) => Err(format!("Get \"{url}\": context deadline exceeded")),
                Ok(Err(e)) => Err(format!("Get \"{url}\": {e}")),
                Ok(Ok(code)) if (200..400).contains(&code) => Ok(()),
                Ok(Ok(code)) => Err(format!("HTTP probe failed with statuscode: {code}")),
            }
        }
        Handler::Grpc { host, port, service } => grpc_check(host, *port, service, timeout).await,
        Handler::Sleep(d) => {
            tokio::time::sleep((*d).min(timeout)).await;
            Ok(())
        }
    }
}

/// The probes' TLS configuration, built once.
fn tls_connector() -> std::io::Result<TlsConnector> {
    static CONFIG: OnceLock<Result<Arc<tokio_rustls::rustls::ClientConfig>, String>> = OnceLock::new();
    let config = CONFIG.get_or_init(|| skiff_pki::transport::probe_config().map(Arc::new).map_err(|e| e.to_string()));
    match config {
        Ok(config) => Ok(TlsConnector::from(config.clone())),
        Err(e) => Err(std::io::Error::other(e.clone())),
    }
}

/// GETs `path`, over TLS if `tls`, and returns the response's status code.
async fn http_get(tls: bool, host: &str, port: u16, path: &str, headers: &[(String, String)]) -> std::io::Result<u16> {
    let stream = TcpStream::connect((host, port)).await?;
    if !tls {
        return get_status(stream, host, port, path, headers).await;
    }
    let name = ServerName::try_from(host.to_string())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("host {host:?}: {e}")))?;
    let stream = tls_connector()?.connect(name, stream).await?;
    get_status(stream, host, port, path, headers).await
}

async fn get_status<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
) -> std::io::Result<u16> {
    let mut request = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: kube-probe/1.32\r\nAccept: */*\r\nConnection: close\r\n",
        authority(host, port)
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 256];
    while !buf.windows(2).any(|w| w == b"\r\n") && buf.len() < 4096 {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let line = String::from_utf8_lossy(&buf);
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "malformed HTTP response");
    let mut parts = line.split_whitespace();
    match parts.next() {
        Some(v) if v.starts_with("HTTP/") => {}
        _ => return Err(bad()),
    }
    parts.next().and_then(|code| code.parse().ok()).ok_or_else(bad)
}

/// Asks `host:port` for `service`'s health, with the kubelet's messages.
async fn grpc_check(host: &str, port: u16, service: &str, timeout: Duration) -> Result<(), String> {
    let addr = authority(host, port);
    let deadline = Instant::now() + timeout;
    let bad = |e: &dyn std::fmt::Display| format!("error: failed to connect service at {addr:?}: {e}");
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| bad(&e))?
        .user_agent("kube-probe/1.32")
        .map_err(|e| bad(&e))?
        .connect_timeout(timeout)
        .timeout(timeout);
    let channel = match tokio::time::timeout_at(deadline, endpoint.connect()).await {
        Err(_) => return Err(format!("timeout: failed to connect service {addr:?} within {timeout:?}")),
        Ok(Err(e)) => return Err(format!("error: failed to connect service at {addr:?}: {}", source_chain(&e))),
        Ok(Ok(channel)) => channel,
    };
    let request = HealthCheckRequest { service: service.to_string() };
    let timed_out = || format!("timeout: health rpc did not complete within {timeout:?}");
    let response = match tokio::time::timeout_at(deadline, HealthClient::new(channel).check(request)).await {
        Err(_) => return Err(timed_out()),
        Ok(Err(status)) => {
            return Err(match status.code() {
                tonic::Code::Unimplemented => format!(
                    "this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
                    status.message()
                ),
                tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => timed_out(),
                code => {
                    format!("error: health rpc probe failed: rpc error: code = {code:?} desc = {}", status.message())
                }
            })
        }
        Ok(Ok(response)) => response.into_inner(),
    };
    match ServingStatus::try_from(response.status) {
        Ok(ServingStatus::Serving) => Ok(()),
        Ok(other) => Err(format!("service unhealthy (responded with {:?})", other.as_str_name())),
        Err(_) => Err(format!("service unhealthy (responded with {:?})", response.status.to_string())),
    }
}

/// An error and its causes, as one line.
fn source_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

/// One probe of one container: its timings and the run of results.
#[derive(Debug, Clone)]
pub struct ProbeState {
    /// Which probe.
    pub kind: ProbeKind,
    /// The container it probes (a new container gets a new state).
    pub container_id: String,
    /// The current result: None until the thresholds decide once
    /// (readiness counts as failed then, liveness as passed).
    pub result: Option<bool>,
    successes: u32,
    failures: u32,
    /// When it runs next.
    pub next_at: Instant,
    period: Duration,
    /// How long one try may take.
    pub timeout: Duration,
    success_threshold: u32,
    failure_threshold: u32,
}

impl ProbeState {
    /// A probe of a container that started at `started`.
    pub fn new(kind: ProbeKind, probe: &Probe, container_id: &str, started: Instant) -> ProbeState {
        let secs = |v: Option<i32>, default: i32| Duration::from_secs(v.unwrap_or(default).max(0) as u64);
        ProbeState {
            kind,
            container_id: container_id.to_string(),
            result: None,
            successes: 0,
            failures: 0,
            next_at: started + secs(probe.initial_delay_seconds, 0),
            period: secs(probe.period_seconds, 10).max(Duration::from_secs(1)),
            timeout: secs(probe.timeout_seconds, 1).max(Duration::from_secs(1)),
            success_threshold: probe.success_threshold.unwrap_or(1).max(1) as u32,
            failure_threshold: probe.failure_threshold.unwrap_or(3).max(1) as u32,
        }
    }

    /// Whether it is time to run.
    pub fn due(&self, now: Instant) -> bool {
        now >= self.next_at
    }

    /// Counts one try's outcome; returns true when the result changed.
    pub fn record(&mut self, ok: bool, now: Instant) -> bool {
        let before = self.result;
        if ok {
            self.failures = 0;
            self.successes += 1;
            if self.successes >= self.success_threshold {
                self.result = Some(true);
            }
        } else {
            self.successes = 0;
            self.failures += 1;
            if self.failures >= self.failure_threshold {
                self.result = Some(false);
            }
        }
        self.next_at = now + self.period;
        before != self.result
    }

    /// Whether the thresholds say failed.
    pub fn failed(&self) -> bool {
        self.result == Some(false)
    }

    /// Whether the thresholds say passed.
    pub fn passed(&self) -> bool {
        self.result == Some(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn thresholds_decide_the_result_and_period_sets_the_next_run() {
        let probe = Probe {
            initial_delay_seconds: Some(5),
            period_seconds: Some(3),
            success_threshold: Some(2),
            failure_threshold: Some(2),
            ..Probe::default()
        };
        let start = Instant::now();
        let mut state = ProbeState::new(ProbeKind::Readiness, &probe, "c1", start);
        assert!(!state.due(start));
        assert!(state.due(start + Duration::from_secs(5)));
        assert!(!state.record(true, start));
        assert_eq!(state.next_at, start + Duration::from_secs(3));
        assert!(state.record(true, start));
        assert!(state.passed());
        assert!(!state.record(false, start));
        assert!(state.record(false, start));
        assert!(state.failed());
    }

    #[tokio::test]
    async fn http_get_reads_the_status_code_of_a_real_server() {
        let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
            Ok(l) => l,
            Err(e) => panic!("bind: {e}"),
        };
        let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
        tokio::spawn(async move {
            for code in [200, 503] {
                if let Ok((mut s, _)) = listener.accept().await {
                    let mut buf = [0u8; 512];
                    let _ = s.read(&mut buf).await;
                    let _ = s.write_all(format!("HTTP/1.1 {code} X\r\nContent-Length: 0\r\n\r\n").as_bytes()).await;
                }
            }
        });
        let handler = Handler::Http {
            scheme: "HTTP".into(),
            host: "127.0.0.1".into(),
            port,
            path: "/healthz".into(),
            headers: vec![],
        };
        let runtime = crate::runtime::fake::FakeRuntime::new();
        assert_eq!(run(&runtime, "c", &handler, Duration::from_secs(1)).await, Ok(()));
        let second = run(&runtime, "c", &handler, Duration::from_secs(1)).await;
        assert_eq!(second, Err("HTTP probe failed with statuscode: 503".to_string()));
    }
}

#[cfg(test)]
mod handler_tests {
    use super::*;

    async fn bound() -> (tokio::net::TcpListener, u16) {
        let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
            Ok(l) => l,
            Err(e) => panic!("bind: {e}"),
        };
        let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
        (listener, port)
    }

    fn https(port: u16) -> Handler {
        Handler::Http { scheme: "HTTPS".into(), host: "127.0.0.1".into(), port, path: "/ready".into(), headers: vec![] }
    }

    #[tokio::test]
    async fn https_probes_speak_tls_to_a_server_whose_certificate_is_not_trusted() {
        // A certificate from an authority the agent has never seen, for a
        // name that is not the address dialled: the kubelet probes such
        // servers (InsecureSkipVerify), and so does the agent.
        let dir = tempfile::tempdir().unwrap();
        let authority = skiff_pki::Authority::generate("pod-ca").unwrap();
        let profile = skiff_pki::Profile::Server { names: vec!["app.example".into()] };
        authority.issue(&profile, Duration::from_secs(3600)).unwrap().write(dir.path(), "app").unwrap();
        let files = skiff_pki::ServerFiles {
            cert: dir.path().join("app.crt"),
            key: dir.path().join("app.key"),
            client_ca: None,
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(skiff_pki::server_config(&files).unwrap()));
        let (listener, port) = bound().await;
        let (requests, mut seen) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            for code in [204, 500] {
                let Ok((tcp, _)) = listener.accept().await else { return };
                let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                let mut buf = [0u8; 512];
                let n = tls.read(&mut buf).await.unwrap_or(0);
                let _ = requests.send(String::from_utf8_lossy(&buf[..n]).into_owned());
                let _ = tls.write_all(format!("HTTP/1.1 {code} X\r\nContent-Length: 0\r\n\r\n").as_bytes()).await;
                let _ = tls.shutdown().await;
            }
        });
        let runtime = crate::runtime::fake::FakeRuntime::new();
        assert_eq!(run(&runtime, "c", &https(port), Duration::from_secs(5)).await, Ok(()));
        let request = seen.recv().await.unwrap();
        assert!(request.starts_with("GET /ready HTTP/1.1\r\n"), "{request}");
        assert!(request.contains("User-Agent: kube-probe/1.32\r\n"), "{request}");
        let failed = run(&runtime, "c", &https(port), Duration::from_secs(5)).await;
        assert_eq!(failed, Err("HTTP probe failed with statuscode: 500".to_string()));
    }

    #[tokio::test]
    async fn an_https_probe_of_a_plain_http_server_fails_with_the_tls_error() {
        let (listener, port) = bound().await;
        tokio::spawn(async move {
            let Ok((mut s, _)) = listener.accept().await else { return };
            let mut buf = [0u8; 512];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await;
        });
        let runtime = crate::runtime::fake::FakeRuntime::new();
        let err = run(&runtime, "c", &https(port), Duration::from_secs(5)).await.unwrap_err();
        assert!(err.starts_with(&format!("Get \"https://127.0.0.1:{port}/ready\": ")), "{err}");
    }

    #[tokio::test]
    async fn grpc_probes_pass_only_a_serving_service() {
        let (mut reporter, health) = tonic_health::server::health_reporter();
        reporter.set_service_status("db", tonic_health::ServingStatus::NotServing).await;
        let (listener, port) = bound().await;
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(tonic::transport::Server::builder().add_service(health).serve_with_incoming(incoming));
        let grpc = |service: &str| Handler::Grpc { host: "127.0.0.1".into(), port, service: service.into() };
        let runtime = crate::runtime::fake::FakeRuntime::new();
        let timeout = Duration::from_secs(5);

        assert_eq!(run(&runtime, "c", &grpc(""), timeout).await, Ok(()));
        let down = run(&runtime, "c", &grpc("db"), timeout).await;
        assert_eq!(down, Err("service unhealthy (responded with \"NOT_SERVING\")".to_string()));
        let unknown = run(&runtime, "c", &grpc("nope"), timeout).await.unwrap_err();
        assert_eq!(unknown, "error: health rpc probe failed: rpc error: code = NotFound desc = service not registered");
        reporter.set_service_status("db", tonic_health::ServingStatus::Serving).await;
        assert_eq!(run(&runtime, "c", &grpc("db"), timeout).await, Ok(()));
    }

    #[tokio::test]
    async fn a_grpc_probe_names_a_server_without_the_health_service_and_a_closed_port() {
        let (listener, port) = bound().await;
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let routes = tonic::service::Routes::default();
        tokio::spawn(tonic::transport::Server::builder().add_routes(routes).serve_with_incoming(incoming));
        let runtime = crate::runtime::fake::FakeRuntime::new();
        let timeout = Duration::from_secs(5);
        let handler = Handler::Grpc { host: "127.0.0.1".into(), port, service: String::new() };
        let err = run(&runtime, "c", &handler, timeout).await.unwrap_err();
        assert!(
            err.starts_with("this server does not implement the grpc health protocol (grpc.health.v1.Health)"),
            "{err}"
        );

        let (closed, port) = bound().await;
        drop(closed);
        let handler = Handler::Grpc { host: "127.0.0.1".into(), port, service: String::new() };
        let err = run(&runtime, "c", &handler, timeout).await.unwrap_err();
        assert!(err.starts_with(&format!("error: failed to connect service at \"127.0.0.1:{port}\": ")), "{err}");
    }

    #[test]
    fn a_grpc_probe_dials_the_pods_ip_at_its_port_and_service() {
        let container = must_container(serde_json::json!({"name": "c", "image": "i"}));
        let probe: Probe =
            serde_json::from_value(serde_json::json!({"grpc": {"port": 9090, "service": "db"}})).unwrap();
        let handler = probe_handler(&probe, &container, "10.0.0.7").unwrap();
        assert_eq!(handler, Handler::Grpc { host: "10.0.0.7".into(), port: 9090, service: "db".into() });
        let probe: Probe = serde_json::from_value(serde_json::json!({"grpc": {"port": 9090}})).unwrap();
        let handler = probe_handler(&probe, &container, "fd00::7").unwrap();
        assert_eq!(handler, Handler::Grpc { host: "fd00::7".into(), port: 9090, service: String::new() });
        assert_eq!(authority("fd00::7", 9090), "[fd00::7]:9090");
    }

    fn must_container(value: serde_json::Value) -> Container {
        match serde_json::from_value(value) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    #[tokio::test]
    async fn tcp_probes_connect_to_a_named_port_and_fail_on_a_closed_one() {
        let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
            Ok(l) => l,
            Err(e) => panic!("bind: {e}"),
        };
        let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
        let c = must_container(serde_json::json!({"name": "web", "ports": [{"name": "http", "containerPort": port}]}));
        let probe: Probe = match serde_json::from_value(serde_json::json!({"tcpSocket": {"port": "http"}})) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        };
        let handler = probe_handler(&probe, &c, "127.0.0.1");
        assert_eq!(handler, Ok(Handler::Tcp { host: "127.0.0.1".into(), port }));
        let runtime = crate::runtime::fake::FakeRuntime::new();
        let Ok(handler) = handler else { return };
        assert_eq!(run(&runtime, "c", &handler, Duration::from_secs(1)).await, Ok(()));
        drop(listener);
        assert!(run(&runtime, "c", &handler, Duration::from_secs(1)).await.is_err());
        let unknown: Probe = match serde_json::from_value(serde_json::json!({"httpGet": {"port": "nope"}})) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(probe_handler(&unknown, &c, "127.0.0.1"), Err("couldn't find port nope in container web".into()));
    }
}
