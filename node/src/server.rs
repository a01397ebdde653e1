//! The agent's HTTP API, where the apiservers proxy `pods/log` and
//! `pods/exec` to, beside `/metrics`, `/healthz` and `/stats/summary`
//! (the seed's resource figures: node and per-pod CPU and memory).
//!
//! - `GET /containerLogs/{namespace}/{pod}/{container}` with `kubectl
//!   logs`' query (`follow`, `tailLines`, `sinceSeconds`, `sinceTime`,
//!   `timestamps`, `limitBytes`, `previous`), as text.
//! - `POST /exec/{namespace}/{pod}/{container}?command=..&command=..`: runs
//!   the command to its end (CRI `ExecSync`) and answers
//!   `{"stdout": <base64>, "stderr": <base64>, "exitCode": N}`.
//! - `GET` of the same, upgraded to a WebSocket speaking kubectl's
//!   `v5.channel.k8s.io`: the command runs with stdin (channel 0, closed
//!   by `255 0`), its stdout and stderr stream out on channels 1 and 2 and
//!   its exit Status comes on 3. With `tty=true` the command runs in a
//!   terminal: its output comes on channel 1 and channel 4 resizes it.
//!   The apiserver relays `kubectl exec -i`, `exec -it` and `kubectl cp`
//!   into a pod here.
//! - `GET /attach/{namespace}/{pod}/{container}?stdin=..&tty=..` as a
//!   WebSocket in the same protocol: the container's own stdio (CRI
//!   `Attach` through the runtime's streaming server).
//! - `GET /portForward/{namespace}/{pod}?port=N` with `Upgrade: tcp`: a
//!   TCP connection to the pod's port, as raw bytes once upgraded (the
//!   apiserver carries kubectl's port-forward streams over it).
//! - `GET /stats/summary`: the kubelet's summary shape, CPU and memory only.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path as UrlPath, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine;
use chrono::{DateTime, Utc};
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use skiff_api::ApiError;
use skiff_shutdown::Shutdown;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncSeekExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::logs::{self, LogOptions};
use crate::pty::Pty;
use crate::runtime::{ContainerState, LabelFilter, PipedExec, Runtime, RuntimeError, LABEL_CONTAINER_NAME, LABEL_NODE};
use crate::stats::UsageCell;

/// How long an exec may run before it is cut off.
const EXEC_TIMEOUT: Duration = Duration::from_secs(600);
/// The WebSocket subprotocol exec is served in, as the apiserver relays it.
const EXEC_PROTOCOLS: [&str; 1] = ["v5.channel.k8s.io"];
/// How long a pod's port has to accept a forwarded connection.
const PORT_FORWARD_CONNECT: Duration = Duration::from_secs(10);
/// How often a followed log file is checked for more.
const FOLLOW_POLL: Duration = Duration::from_millis(100);

/// What the server asks the agent about the pods it runs.
pub trait PodLookup: Send + Sync + 'static {
    /// The runtime id of the current instance of a container of a pod on
    /// this node, if it has one.
    fn container_id(&self, namespace: &str, pod: &str, container: &str) -> Option<String>;
    /// The address of a pod on this node (the node's own for a
    /// host-network pod), once its sandbox has one.
    fn pod_ip(&self, namespace: &str, pod: &str) -> Option<String>;
}

/// What the agent's API answers from.
pub struct Api {
    /// This node's name.
    pub node: String,
    /// The container runtime.
    pub runtime: Arc<dyn Runtime>,
    /// The agent's pods.
    pub pods: Arc<dyn PodLookup>,
    /// The agent's data dir (its filesystem's figures are the node's).
    pub data_dir: PathBuf,
    /// The agent's metrics.
    pub registry: prometheus::Registry,
    /// CPU rates from the housekeeping sampler.
    pub usage: UsageCell,
}

struct Served {
    api: Api,
    shutdown: Shutdown,
}

/// Serves the agent's API on `addr` until `shutdown`; the address bound.
pub async fn serve(addr: SocketAddr, api: Api, shutdown: Shutdown) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let served = Arc::new(Served { api, shutdown: shutdown.clone() });
    let app = axum::Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/stats/summary", get(summary))
        .route("/containerLogs/:namespace/:pod/:container", get(container_logs))
        .route("/exec/:namespace/:pod/:container", post(exec).get(exec_stream))
        .route("/attach/:namespace/:pod/:container", get(attach_stream))
        .route("/portForward/:namespace/:pod", get(port_forward))
        .with_state(served);
    let stopped = shutdown.cancelled_owned();
    shutdown.spawn(async move {
        if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stopped).await {
            tracing::error!(error = %e, "node listener failed");
        }
    });
    Ok(bound)
}

/// A Kubernetes `Status` error body.
fn status(code: StatusCode, reason: &str, message: impl Into<String>) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message.into(), "reason": reason, "code": code.as_u16(),
    });
    (code, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

fn runtime_error(e: RuntimeError) -> Response {
    match e {
        RuntimeError::NotFound(m) => status(StatusCode::NOT_FOUND, "NotFound", m),
        other => status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", other.to_string()),
    }
}

async fn healthz(State(s): State<Arc<Served>>) -> impl IntoResponse {
    if s.shutdown.is_cancelled() {
        (StatusCode::SERVICE_UNAVAILABLE, "stopping\n")
    } else {
        (StatusCode::OK, "ok\n")
    }
}

async fn metrics(State(s): State<Arc<Served>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], skiff_metrics::text(&s.api.registry))
}

/// Query pairs in order; keys repeat (`command`).
fn pairs(query: &Option<String>) -> Vec<(String, String)> {
    form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes()).into_owned().collect()
}

/// Reads `kubectl logs`' query into options; a bad value is a 400.
pub fn log_options(pairs: &[(String, String)], now: DateTime<Utc>) -> Result<LogOptions, String> {
    let mut options = LogOptions::default();
    for (k, v) in pairs {
        let number = || v.parse::<i64>().map_err(|_| format!("{k}: {v:?} is not an integer"));
        match k.as_str() {
            "follow" => options.follow = v == "true" || v == "1",
            "previous" => options.previous = v == "true" || v == "1",
            "timestamps" => options.timestamps = v == "true" || v == "1",
            "tailLines" => options.tail_lines = Some(number()?.max(0) as usize),
            "limitBytes" => options.limit_bytes = Some(number()?.max(1) as usize),
            "sinceSeconds" => options.since = Some(now - chrono::Duration::seconds(number()?.max(1))),
            "sinceTime" => {
                let t = DateTime::parse_from_rfc3339(v).map_err(|e| format!("sinceTime: {e}"))?;
                options.since = Some(t.with_timezone(&Utc));
            }
            _ => {}
        }
    }
    Ok(options)
}

/// The log file of the container's previous instance: the numbered file
/// before `current` in its directory (`<container>/<n>.log`).
fn previous_log(current: &Path) -> Option<PathBuf> {
    let dir = current.parent()?;
    let number = |p: &Path| p.file_stem()?.to_str()?.parse::<u64>().ok();
    let now = number(current)?;
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter_map(|p| Some((number(&p)?, p)))
        .filter(|(n, _)| *n < now)
        .max_by_key(|(n, _)| *n)
        .map(|(_, p)| p)
}

async fn container_logs(
    State(s): State<Arc<Served>>,
    UrlPath((namespace, pod, container)): UrlPath<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let options = match log_options(&pairs(&query), Utc::now()) {
        Ok(o) => o,
        Err(m) => return status(StatusCode::BAD_REQUEST, "BadRequest", m),
    };
    let Some(id) = s.api.pods.container_id(&namespace, &pod, &container) else {
        let message = format!("container \"{container}\" in pod \"{pod}\" is waiting to start or does not exist");
        return status(StatusCode::BAD_REQUEST, "BadRequest", message);
    };
    let current = match s.api.runtime.container_status(&id).await {
        Ok(c) => c,
        Err(e) => return runtime_error(e),
    };
    let path = if options.previous {
        match previous_log(Path::new(&current.log_path)) {
            Some(p) => p,
            None => {
                let message = format!("previous terminated container \"{container}\" in pod \"{pod}\" not found");
                return status(StatusCode::BAD_REQUEST, "BadRequest", message);
            }
        }
    } else {
        PathBuf::from(&current.log_path)
    };
    let text = match tokio::fs::read_to_string(&path).await {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => {
            return status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", format!("{}: {e}", path.display()))
        }
    };
    let head = logs::select(&text, &options);
    let running = current.state == ContainerState::Running || current.state == ContainerState::Created;
    if !options.follow || options.previous || !running {
        return ([(header::CONTENT_TYPE, "text/plain")], head).into_response();
    }
    // Follow: what is there, then what the container writes next, until
    // it stops (or the client goes, which drops the stream).
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, std::io::Error>>(16);
    let offset = text.len() as u64;
    let runtime = s.api.runtime.clone();
    let shutdown = s.shutdown.clone();
    s.shutdown.spawn(async move {
        if !head.is_empty() && tx.send(Ok(head)).await.is_err() {
            return;
        }
        follow(path, offset, id, runtime, options, tx, shutdown).await;
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    Response::builder()
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", "response"))
}

/// Sends complete lines appended to `path` after `offset` until the
/// container is no longer running and the file is read to its end.
async fn follow(
    path: PathBuf,
    mut offset: u64,
    id: String,
    runtime: Arc<dyn Runtime>,
    options: LogOptions,
    tx: tokio::sync::mpsc::Sender<Result<String, std::io::Error>>,
    shutdown: Shutdown,
) {
    let options = LogOptions { tail_lines: None, limit_bytes: None, since: None, ..options };
    let mut pending = String::new();
    let mut checks = 0u32;
    loop {
        let mut grew = false;
        if let Ok(mut file) = tokio::fs::File::open(&path).await {
            if file.seek(std::io::SeekFrom::Start(offset)).await.is_ok() {
                let mut more = Vec::new();
                if let Ok(n) = file.read_to_end(&mut more).await {
                    offset += n as u64;
                    grew = n > 0;
                    pending.push_str(&String::from_utf8_lossy(&more));
                }
            }
        }
        if let Some(end) = pending.rfind('\n') {
            let complete: String = pending.drain(..=end).collect();
            let out = logs::select(&complete, &options);
            if !out.is_empty() && tx.send(Ok(out)).await.is_err() {
                return;
            }
        }
        if !grew {
            checks += 1;
            // Every second without growth, ask whether the container still runs.
            if checks.is_multiple_of(10) {
                match runtime.container_status(&id).await {
                    Ok(c) if c.state == ContainerState::Running => {}
                    _ => return,
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tx.closed() => return,
            _ = tokio::time::sleep(FOLLOW_POLL) => {}
        }
    }
}

async fn exec(
    State(s): State<Arc<Served>>,
    UrlPath((namespace, pod, container)): UrlPath<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let command: Vec<String> = pairs(&query).into_iter().filter(|(k, _)| k == "command").map(|(_, v)| v).collect();
    if command.is_empty() {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "you must specify at least 1 command");
    }
    let id = match running_container(&s, &namespace, &pod, &container) {
        Ok(id) => id,
        Err(refused) => return refused,
    };
    match s.api.runtime.exec_sync(&id, &command, EXEC_TIMEOUT).await {
        Ok(result) => {
            let b64 = base64::engine::general_purpose::STANDARD;
            let body = json!({
                "stdout": b64.encode(&result.stdout),
                "stderr": b64.encode(&result.stderr),
                "exitCode": result.exit_code,
            });
            ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
        }
        Err(e) => runtime_error(e),
    }
}

/// The runtime id of a pod's container that exec and attach can reach,
/// or the 400 kubelet answers for one that is not there.
// The error is the handler's answer, returned at once: no need to box it.
#[allow(clippy::result_large_err)]
fn running_container(s: &Served, namespace: &str, pod: &str, container: &str) -> Result<String, Response> {
    s.api.pods.container_id(namespace, pod, container).ok_or_else(|| {
        let message = format!("container {container} is not valid for pod {pod}");
        status(StatusCode::BAD_REQUEST, "BadRequest", message)
    })
}

/// Whether a query flag (`stdin`, `tty`) is on.
fn flag(pairs: &[(String, String)], name: &str) -> bool {
    pairs.iter().any(|(k, v)| k == name && (v == "true" || v == "1"))
}

/// `GET /exec/...` as a WebSocket: the command with its stdio streamed,
/// through a terminal with `tty=true`.
async fn exec_stream(
    State(s): State<Arc<Served>>,
    UrlPath((namespace, pod, container)): UrlPath<(String, String, String)>,
    RawQuery(query): RawQuery,
    upgrade: WebSocketUpgrade,
) -> Response {
    let pairs = pairs(&query);
    let command: Vec<String> = pairs.iter().filter(|(k, _)| k == "command").map(|(_, v)| v.clone()).collect();
    if command.is_empty() {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "you must specify at least 1 command");
    }
    let tty = flag(&pairs, "tty");
    let id = match running_container(&s, &namespace, &pod, &container) {
        Ok(id) => id,
        Err(refused) => return refused,
    };
    let exec = match s.api.runtime.exec_piped(&id, &command, tty) {
        Ok(p) => p,
        Err(e) => return runtime_error(e),
    };
    let shutdown = s.shutdown.clone();
    upgrade.protocols(EXEC_PROTOCOLS).on_upgrade(move |socket| exec_session(socket, exec, tty, shutdown))
}

/// One channel message: the channel id, then the bytes.
fn frame(channel: u8, data: &[u8]) -> Message {
    let mut out = Vec::with_capacity(data.len() + 1);
    out.push(channel);
    out.extend_from_slice(data);
    Message::Binary(out)
}

type Output = Box<dyn AsyncRead + Send + Unpin>;
type Input = Box<dyn AsyncWrite + Send + Unpin>;

/// An exec's process as spawned.
struct Spawned {
    child: tokio::process::Child,
    /// Its outputs, with the channels they go out on.
    outputs: Vec<(u8, Output)>,
    stdin: Option<Input>,
    /// The terminal, with `tty`.
    pty: Option<Pty>,
}

/// Spawns an exec's process with pipes, or with a terminal.
fn spawn_exec(mut process: tokio::process::Command, tty: bool) -> std::io::Result<Spawned> {
    process.kill_on_drop(true);
    if tty {
        // A terminal merges stdout and stderr, as it does for kubelet.
        let (pty, child) = Pty::spawn(&process)?;
        let outputs: Vec<(u8, Output)> = vec![(1, Box::new(pty.clone()))];
        return Ok(Spawned { child, outputs, stdin: Some(Box::new(pty.clone())), pty: Some(pty) });
    }
    process.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = process.spawn()?;
    let mut outputs: Vec<(u8, Output)> = Vec::new();
    if let Some(pipe) = child.stdout.take() {
        outputs.push((1, Box::new(pipe)));
    }
    if let Some(pipe) = child.stderr.take() {
        outputs.push((2, Box::new(pipe)));
    }
    let stdin = child.stdin.take().map(|pipe| Box::new(pipe) as Input);
    Ok(Spawned { child, outputs, stdin, pty: None })
}

/// A resize message (channel 4), as kubectl sends its terminal's size.
#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct TerminalSize {
    width: u16,
    height: u16,
}

/// Runs an exec with streamed stdio until it ends, or until the client
/// goes away. Then ctr is killed and the command's stdin closes. Without a
/// terminal the command runs on in the container until it ends, as with
/// kubelet and containerd, which do not tie an exec's life to its client.
/// With one, the command is sent `SIGHUP`, as a shell is when its terminal
/// hangs up (containerd would leave it waiting on a terminal no one holds).
async fn exec_session(socket: WebSocket, exec: PipedExec, tty: bool, shutdown: Shutdown) {
    let PipedExec { process, hang_up } = exec;
    let hang_up = hang_up.filter(|_| tty);
    let (mut sink, mut source) = socket.split();
    let Spawned { mut child, outputs: pipes, mut stdin, pty } = match spawn_exec(process, tty) {
        Ok(spawned) => spawned,
        Err(e) => {
            let failed = ApiError::internal(format!("starting the exec: {e}"));
            let _ = sink.send(frame(3, failed.exec_status().to_string().as_bytes())).await;
            let _ = sink.send(Message::Close(Some(CloseFrame { code: 1000, reason: "".into() }))).await;
            return;
        }
    };
    let (output, mut outputs) = mpsc::channel::<Message>(16);
    for (channel, mut pipe) in pipes {
        let output = output.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 32 * 1024];
            while let Ok(n @ 1..) = pipe.read(&mut buf).await {
                if output.send(frame(channel, &buf[..n])).await.is_err() {
                    return;
                }
            }
        });
    }
    drop(output);
    // Input until the client hangs up: channel 0 is stdin, `255 0` closes
    // it, and channel 4 carries the client's terminal size.
    let mut input = tokio::spawn(async move {
        while let Some(Ok(message)) = source.next().await {
            match message {
                Message::Binary(b) if b.first() == Some(&0) => {
                    if let Some(pipe) = stdin.as_mut() {
                        if pipe.write_all(&b[1..]).await.is_err() {
                            stdin = None;
                        }
                    }
                }
                Message::Binary(b) if b.as_slice() == [255, 0] => stdin = None,
                Message::Binary(b) if b.first() == Some(&4) => {
                    let size = serde_json::from_slice::<TerminalSize>(&b[1..]);
                    if let (Some(pty), Ok(size)) = (pty.as_ref(), size) {
                        if let Err(e) = pty.resize(size.width, size.height) {
                            tracing::debug!(error = %e, "resizing an exec's terminal");
                        }
                    }
                }
                Message::Close(_) => return,
                _ => {}
            }
        }
    });
    loop {
        tokio::select! {
            next = outputs.recv() => match next {
                Some(message) => {
                    if sink.send(message).await.is_err() {
                        return;
                    }
                }
                None => break,
            },
            // The client left before the command's output ended: ctr is
            // killed as the child is dropped, and a terminal hangs up.
            _ = &mut input => return hang_up_terminal(hang_up).await,
            _ = shutdown.cancelled() => return hang_up_terminal(hang_up).await,
        }
    }
    let code = match child.wait().await {
        Ok(status) => {
            status.code().unwrap_or_else(|| 128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0))
        }
        Err(_) => 1,
    };
    let status = skiff_api::status::exec_exit_status(code as i64);
    let _ = sink.send(frame(3, status.to_string().as_bytes())).await;
    let _ = sink.send(Message::Close(Some(CloseFrame { code: 1000, reason: "".into() }))).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), input).await;
}

/// Sends `SIGHUP` to a terminal exec whose client went away. The command
/// may have ended meanwhile, so a failure is only logged.
async fn hang_up_terminal(hang_up: Option<tokio::process::Command>) {
    let Some(mut command) = hang_up else { return };
    command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).kill_on_drop(true);
    match tokio::time::timeout(Duration::from_secs(10), command.output()).await {
        Ok(Ok(out)) if out.status.success() => {}
        Ok(Ok(out)) => tracing::debug!(stderr = %String::from_utf8_lossy(&out.stderr), "hanging up an exec's terminal"),
        Ok(Err(e)) => tracing::warn!(error = %e, "hanging up an exec's terminal"),
        Err(_) => tracing::warn!("hanging up an exec's terminal took over 10 s"),
    }
}

/// The subprotocol of the runtime's streaming server (kubelet's
/// remotecommand server, which containerd embeds).
const RUNTIME_STREAM_PROTOCOL: &str = "v4.channel.k8s.io";

/// `GET /attach/...` as a WebSocket: the container's own stdio, joined
/// through the runtime's streaming server (CRI `Attach`) and relayed
/// message for message. The channels are the same in both protocols; v4
/// has no way to close stdin alone, so `255 0` is dropped (the container's
/// stdin stays open, as for kubelet's v4 clients).
async fn attach_stream(
    State(s): State<Arc<Served>>,
    UrlPath((namespace, pod, container)): UrlPath<(String, String, String)>,
    RawQuery(query): RawQuery,
    upgrade: WebSocketUpgrade,
) -> Response {
    let pairs = pairs(&query);
    let (stdin, tty) = (flag(&pairs, "stdin"), flag(&pairs, "tty"));
    let id = match running_container(&s, &namespace, &pod, &container) {
        Ok(id) => id,
        Err(refused) => return refused,
    };
    let url = match s.api.runtime.attach_url(&id, stdin, tty).await {
        Ok(url) => url,
        Err(e) => return runtime_error(e),
    };
    let uri = match url.replacen("http://", "ws://", 1).parse::<axum::http::Uri>() {
        Ok(uri) => uri,
        Err(e) => return runtime_error(RuntimeError::Unavailable(format!("the runtime's attach address {url}: {e}"))),
    };
    let request =
        tokio_tungstenite::tungstenite::ClientRequestBuilder::new(uri).with_sub_protocol(RUNTIME_STREAM_PROTOCOL);
    let runtime = match tokio::time::timeout(PORT_FORWARD_CONNECT, tokio_tungstenite::connect_async(request)).await {
        Ok(Ok((socket, _))) => socket,
        Ok(Err(e)) => return runtime_error(RuntimeError::Unavailable(format!("attaching through the runtime: {e}"))),
        Err(_) => return runtime_error(RuntimeError::Unavailable("attaching through the runtime: timed out".into())),
    };
    let shutdown = s.shutdown.clone();
    upgrade.protocols(EXEC_PROTOCOLS).on_upgrade(move |socket| attach_session(socket, runtime, shutdown))
}

/// Relays an attach session between the apiserver and the runtime until
/// either side ends it.
async fn attach_session<S>(socket: WebSocket, runtime: tokio_tungstenite::WebSocketStream<S>, shutdown: Shutdown)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio_tungstenite::tungstenite::Message as Runtime;
    let (mut to_client, mut from_client) = socket.split();
    let (mut to_runtime, mut from_runtime) = runtime.split();
    let upstream = async {
        while let Some(Ok(message)) = from_client.next().await {
            let message = match message {
                Message::Binary(b) if b.as_slice() == [255, 0] => continue,
                Message::Binary(b) => Runtime::Binary(b),
                Message::Close(_) => break,
                _ => continue,
            };
            if to_runtime.send(message).await.is_err() {
                break;
            }
        }
        let _ = to_runtime.close().await;
    };
    let downstream = async {
        while let Some(Ok(message)) = from_runtime.next().await {
            let message = match message {
                // The server opens each channel with an empty message.
                Runtime::Binary(b) if b.len() > 1 => Message::Binary(b),
                Runtime::Close(_) => break,
                _ => continue,
            };
            if to_client.send(message).await.is_err() {
                return;
            }
        }
        let _ = to_client.send(Message::Close(Some(CloseFrame { code: 1000, reason: "".into() }))).await;
    };
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
        _ = shutdown.cancelled() => {}
    }
}

/// Connects to a port of a pod and, once connected, hands the upgraded
/// connection over to it. The pod is reached at its address on the
/// node's bridge, so a port bound only to the pod's loopback is not.
async fn port_forward(
    State(s): State<Arc<Served>>,
    UrlPath((namespace, pod)): UrlPath<(String, String)>,
    RawQuery(query): RawQuery,
    mut request: axum::extract::Request,
) -> Response {
    let port = pairs(&query).into_iter().rev().find(|(k, _)| k == "port").and_then(|(_, v)| v.parse::<u16>().ok());
    let Some(port) = port.filter(|p| *p > 0) else {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "a port from 1 to 65535 is required");
    };
    let upgrade = request.headers().get(header::UPGRADE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    if !upgrade.eq_ignore_ascii_case("tcp") {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "port-forwarding needs `Upgrade: tcp`");
    }
    let Some(ip) = s.api.pods.pod_ip(&namespace, &pod) else {
        return status(StatusCode::NOT_FOUND, "NotFound", format!("pod {namespace}/{pod} has no address on this node"));
    };
    let address = if ip.contains(':') { format!("[{ip}]:{port}") } else { format!("{ip}:{port}") };
    let connected = tokio::time::timeout(PORT_FORWARD_CONNECT, tokio::net::TcpStream::connect(&address)).await;
    let mut to_pod = match connected {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            let message = format!("failed to connect to {address} in pod {pod}: {e}");
            return status(StatusCode::BAD_GATEWAY, "ServiceUnavailable", message);
        }
        Err(_) => {
            let message = format!("failed to connect to {address} in pod {pod}: timed out");
            return status(StatusCode::GATEWAY_TIMEOUT, "Timeout", message);
        }
    };
    let upgraded = hyper::upgrade::on(&mut request);
    let shutdown = s.shutdown.clone();
    tokio::spawn(async move {
        let Ok(upgraded) = upgraded.await else { return };
        let mut from_apiserver = hyper_util::rt::TokioIo::new(upgraded);
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut from_apiserver, &mut to_pod) => {}
            _ = shutdown.cancelled() => {}
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, "tcp")
        .body(Body::empty())
        .expect("a valid response")
}

async fn summary(State(s): State<Arc<Served>>) -> Response {
    let now = Utc::now().to_rfc3339();
    let host = crate::host::figures(&s.api.data_dir);
    let usage = s.api.usage.get();
    // The rates' window, as metrics-server reports it.
    let window = format!("{}s", usage.window.as_secs());
    let filter = LabelFilter(BTreeMap::from([(LABEL_NODE.to_string(), s.api.node.clone())]));
    let stats = match s.api.runtime.list_container_stats(&filter).await {
        Ok(stats) => stats,
        Err(e) => return runtime_error(e),
    };
    /// A pod's sums: CPU time, nanocores (if every container has a rate), working set.
    #[derive(Default)]
    struct Totals {
        cpu_ns: u64,
        nano_cores: Option<u64>,
        memory: u64,
    }
    let mut pods: BTreeMap<(String, String, String), (Totals, Vec<Value>)> = BTreeMap::new();
    for c in &stats {
        let label = |k: &str| c.labels.get(k).cloned().unwrap_or_default();
        let key = (
            label(crate::runtime::LABEL_POD_NAMESPACE),
            label(crate::runtime::LABEL_POD_NAME),
            label(crate::runtime::LABEL_POD_UID),
        );
        let nano_cores = usage.containers.get(&c.id).copied();
        let (totals, containers) =
            pods.entry(key).or_insert_with(|| (Totals { nano_cores: Some(0), ..Totals::default() }, Vec::new()));
        totals.cpu_ns += c.cpu_usage_core_nanoseconds;
        totals.memory += c.memory_working_set_bytes;
        totals.nano_cores = totals.nano_cores.zip(nano_cores).map(|(a, b)| a + b);
        containers.push(json!({
            "name": label(LABEL_CONTAINER_NAME),
            "cpu": cpu_json(&now, c.cpu_usage_core_nanoseconds, nano_cores),
            "memory": {"time": now, "workingSetBytes": c.memory_working_set_bytes},
        }));
    }
    let pods: Vec<Value> = pods
        .into_iter()
        .map(|(key, (totals, containers))| {
            json!({
                "podRef": {"namespace": key.0, "name": key.1, "uid": key.2},
                "cpu": cpu_json(&now, totals.cpu_ns, totals.nano_cores),
                "memory": {"time": now, "workingSetBytes": totals.memory},
                "containers": containers,
            })
        })
        .collect();
    let body = json!({
        "node": {
            "nodeName": s.api.node,
            "cpu": cpu_json(&now, crate::stats::host_cpu_nanoseconds(), usage.node_nano_cores),
            "memory": {
                "time": now,
                "availableBytes": host.memory_available,
                "workingSetBytes": host.memory_total.saturating_sub(host.memory_available),
            },
        },
        "pods": pods,
        "window": window,
    });
    ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// A summary's `cpu`: the cumulative time, and the rate once known.
fn cpu_json(now: &str, core_nanoseconds: u64, nano_cores: Option<u64>) -> Value {
    let mut cpu = json!({"time": now, "usageCoreNanoSeconds": core_nanoseconds});
    if let Some(rate) = nano_cores {
        cpu["usageNanoCores"] = json!(rate);
    }
    cpu
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_pairs_keep_repeated_keys_and_decode() {
        let q = Some("command=sh&command=-c&command=echo%20hi+there&container=app".to_string());
        let p = pairs(&q);
        let commands: Vec<&str> = p.iter().filter(|(k, _)| k == "command").map(|(_, v)| v.as_str()).collect();
        assert_eq!(commands, ["sh", "-c", "echo hi there"]);
        let p = pairs(&Some("a=100%&b=%2Ftmp%2Ffoo".to_string()));
        assert_eq!(p, [("a".to_string(), "100%".to_string()), ("b".to_string(), "/tmp/foo".to_string())]);
    }

    #[test]
    fn log_options_read_kubectls_query_and_refuse_bad_numbers() {
        let now = DateTime::parse_from_rfc3339("2026-12-02T10:00:00Z").expect("time").with_timezone(&Utc);
        let p = |q: &str| pairs(&Some(q.to_string()));
        let o = log_options(&p("follow=true&tailLines=5&timestamps=true&sinceSeconds=60"), now).expect("valid");
        assert!(o.follow && o.timestamps);
        assert_eq!(o.tail_lines, Some(5));
        assert_eq!(o.since, Some(now - chrono::Duration::seconds(60)));
        assert!(log_options(&p("tailLines=lots"), now).expect_err("refused").contains("tailLines"));
    }

    #[test]
    fn the_previous_log_is_the_numbered_file_before_the_current_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        for n in [0, 1, 3] {
            std::fs::write(dir.path().join(format!("{n}.log")), "x").expect("write");
        }
        assert_eq!(previous_log(&dir.path().join("3.log")), Some(dir.path().join("1.log")));
        assert_eq!(previous_log(&dir.path().join("0.log")), None);
    }
}
