//! `pods/<name>/portforward`: kubectl's port-forward protocol
//! (`portforward.k8s.io`, SPDY/3.1 streams), over either transport:
//! - the WebSocket tunnel kubectl 1.32 opens first
//!   (`SPDY/3.1+portforward.k8s.io`, [`session`]): binary messages carry a
//!   SPDY byte stream and their boundaries mean nothing;
//! - a bare `Upgrade: SPDY/3.1` of the HTTP/1.1 connection ([`spdy_upgrade`]):
//!   what kubectl falls back to, what it sends with
//!   `KUBECTL_PORT_FORWARD_WEBSOCKETS=false`, and what client-go's SPDY
//!   dialer and older kubectls send.
//!
//! kubectl upgrades once and multiplexes every local connection over that
//! one tunnel, each as a pair of streams sharing a `requestid`: an error
//! stream (whatever the server writes on it is an error, then FIN) and a
//! data stream. For each pair the apiserver opens an upgraded connection
//! to the pod's node agent (`GET /portForward/{ns}/{pod}?port=N` with
//! `Upgrade: tcp`), which connects to the pod, and relays bytes both ways.
//! When the pod's side ends, the data stream and then the error stream are
//! FIN'd: kubectl closes its local socket only once the error stream is.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use axum::http::{header, HeaderValue, Request, StatusCode, Uri};
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use futures::{SinkExt, Stream, StreamExt};
use http_body_util::{BodyExt, Empty};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinSet};

use skiff_api::status::ApiError;

use super::node_proxy::PodTarget;
use super::spdy::{self, Decoder, Encoder, Frame};

/// The WebSocket subprotocol the tunnel is served in.
pub const PROTOCOLS: [&str; 1] = ["SPDY/3.1+portforward.k8s.io"];
/// The stream protocol of a bare SPDY upgrade (`X-Stream-Protocol-Version`).
const STREAM_PROTOCOL: &str = "portforward.k8s.io";
const STREAM_PROTOCOL_HEADER: &str = "x-stream-protocol-version";
/// The largest data frame sent to kubectl.
const MAX_DATA_FRAME: usize = 32 * 1024;
/// How long the node agent has to accept a forwarded connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Client bytes buffered per stream before the tunnel's reading waits.
const UPLOAD_BUFFER: usize = 32;

/// The two streams of one forwarded connection, as they are opened.
#[derive(Default)]
struct Pair {
    port: Option<String>,
    error: Option<u32>,
    data: Option<(u32, mpsc::Receiver<Bytes>)>,
}

/// A forwarded connection in flight, by its data stream.
struct Running {
    task: AbortHandle,
    error: u32,
    error_closed: Arc<AtomicBool>,
}

/// One kubectl port-forward session: the tunnel's streams and relays.
struct Session {
    target: Arc<PodTarget>,
    out: mpsc::Sender<Frame>,
    /// The client's bytes for each open data stream.
    uploads: HashMap<u32, mpsc::Sender<Bytes>>,
    pairs: HashMap<String, Pair>,
    running: HashMap<u32, Running>,
    tasks: JoinSet<()>,
}

/// Serves one port-forward tunnel over a WebSocket until kubectl goes away.
pub async fn session(socket: WebSocket, target: PodTarget) {
    let (mut sink, source) = socket.split();
    let (out, mut outgoing) = mpsc::channel::<Frame>(64);
    let writer = tokio::spawn(async move {
        let mut encoder = Encoder::default();
        while let Some(frame) = outgoing.recv().await {
            if sink.send(Message::Binary(encoder.encode(&frame))).await.is_err() {
                return;
            }
        }
        let _ = sink.send(Message::Close(Some(CloseFrame { code: 1000, reason: "".into() }))).await;
    });
    let incoming = futures::stream::unfold(source, |mut source| async move {
        loop {
            match source.next().await? {
                Ok(Message::Binary(bytes)) => return Some((Bytes::from(bytes), source)),
                Ok(Message::Close(_)) | Err(_) => return None,
                Ok(_) => continue,
            }
        }
    });
    serve(Box::pin(incoming), out, target).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
}

/// Whether a request asks for a bare SPDY upgrade.
pub fn wants_spdy(headers: &header::HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|u| u.trim().eq_ignore_ascii_case("SPDY/3.1"))
}

/// Accepts a bare SPDY upgrade: `101 Switching Protocols` now, and the
/// session on the connection once hyper hands it over. A client that names
/// stream protocols must name `portforward.k8s.io` (kube-apiserver's
/// handshake: 403 otherwise); one that names none gets it.
pub fn spdy_upgrade(parts: &mut axum::http::request::Parts, target: PodTarget) -> Result<Response, ApiError> {
    let offered: Vec<String> = parts
        .headers
        .get_all(STREAM_PROTOCOL_HEADER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect();
    if !offered.is_empty() && !offered.iter().any(|p| p == STREAM_PROTOCOL) {
        return Err(ApiError::forbidden(format!(
            "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server accepts [\"{STREAM_PROTOCOL}\"]"
        )));
    }
    let on_upgrade = parts
        .extensions
        .remove::<hyper::upgrade::OnUpgrade>()
        .ok_or_else(|| ApiError::bad_request("a SPDY upgrade needs an HTTP/1.1 connection"))?;
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => spdy_session(upgraded, target).await,
            Err(e) => tracing::debug!(error = %e, "port-forward: the SPDY upgrade did not complete"),
        }
    });
    let mut response = Response::new(axum::body::Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    headers.insert(STREAM_PROTOCOL_HEADER, HeaderValue::from_static(STREAM_PROTOCOL));
    Ok(response)
}

/// Serves one port-forward session on an upgraded connection: SPDY frames
/// straight on the bytes.
async fn spdy_session(upgraded: Upgraded, target: PodTarget) {
    let (read, mut write) = tokio::io::split(TokioIo::new(upgraded));
    let (out, mut outgoing) = mpsc::channel::<Frame>(64);
    let writer = tokio::spawn(async move {
        let mut encoder = Encoder::default();
        while let Some(frame) = outgoing.recv().await {
            if write.write_all(&encoder.encode(&frame)).await.is_err() {
                return;
            }
        }
        let _ = write.shutdown().await;
    });
    let incoming = futures::stream::unfold(read, |mut read| async move {
        let mut buf = BytesMut::with_capacity(MAX_DATA_FRAME);
        match read.read_buf(&mut buf).await {
            Ok(0) | Err(_) => None,
            Ok(_) => Some((buf.freeze(), read)),
        }
    });
    serve(Box::pin(incoming), out, target).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
}

/// Runs a session on the SPDY bytes kubectl sends (`incoming` ends when
/// the transport does), answering through `out` until kubectl goes away.
///
/// Not generic over the stream: one copy of the session's state machine
/// serves both transports.
async fn serve(mut incoming: Pin<Box<dyn Stream<Item = Bytes> + Send>>, out: mpsc::Sender<Frame>, target: PodTarget) {
    let mut session = Session {
        target: Arc::new(target),
        out,
        uploads: HashMap::new(),
        pairs: HashMap::new(),
        running: HashMap::new(),
        tasks: JoinSet::new(),
    };
    let mut decoder = Decoder::default();
    'tunnel: while let Some(bytes) = incoming.next().await {
        decoder.push(&bytes);
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => {
                    if !session.handle(frame).await {
                        break 'tunnel;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(pod = %session.target.pod, error = %e, "port-forward: bad SPDY from the client");
                    let _ = session.out.send(Frame::GoAway { last_stream: 0, status: spdy::RST_PROTOCOL_ERROR }).await;
                    break 'tunnel;
                }
            }
        }
    }
    session.tasks.abort_all();
}

impl Session {
    /// Acts on one frame from kubectl; false ends the session.
    async fn handle(&mut self, frame: Frame) -> bool {
        match frame {
            Frame::SynStream { stream, headers, .. } => self.open(stream, &headers).await,
            Frame::Data { stream, fin, data } => {
                if let Some(upload) = self.uploads.get(&stream) {
                    if !data.is_empty() && upload.send(data).await.is_err() {
                        self.uploads.remove(&stream);
                    }
                }
                // FIN: the client is done writing; dropping the sender
                // half-closes the connection to the pod.
                if fin {
                    self.uploads.remove(&stream);
                }
            }
            Frame::RstStream { stream, .. } => {
                self.uploads.remove(&stream);
                if let Some(running) = self.running.remove(&stream) {
                    running.task.abort();
                    if !running.error_closed.swap(true, Ordering::SeqCst) {
                        let fin = Frame::Data { stream: running.error, fin: true, data: Bytes::new() };
                        let _ = self.out.send(fin).await;
                    }
                }
            }
            Frame::Ping(id) => {
                let _ = self.out.send(Frame::Ping(id)).await;
            }
            Frame::GoAway { .. } => return false,
            Frame::SynReply { .. } | Frame::Ignored { .. } => {}
        }
        true
    }

    /// A stream kubectl opened: accept it, and start relaying once both
    /// streams of its connection are open.
    async fn open(&mut self, stream: u32, headers: &spdy::Headers) {
        let kind = spdy::header(headers, "streamtype").unwrap_or_default().to_string();
        if kind != "error" && kind != "data" {
            let _ = self.out.send(Frame::RstStream { stream, status: spdy::RST_PROTOCOL_ERROR }).await;
            return;
        }
        let _ = self.out.send(Frame::SynReply { stream, headers: Vec::new(), fin: false }).await;
        let request = spdy::header(headers, "requestid").unwrap_or_default().to_string();
        let pair = self.pairs.entry(request.clone()).or_default();
        pair.port = pair.port.take().or_else(|| spdy::header(headers, "port").map(str::to_string));
        if kind == "error" {
            pair.error = Some(stream);
        } else {
            let (upload, uploaded) = mpsc::channel(UPLOAD_BUFFER);
            self.uploads.insert(stream, upload);
            pair.data = Some((stream, uploaded));
        }
        if pair.error.is_none() || pair.data.is_none() {
            return;
        }
        let Some(Pair { port, error: Some(error), data: Some((data, uploaded)) }) = self.pairs.remove(&request) else {
            return;
        };
        let error_closed = Arc::new(AtomicBool::new(false));
        let relay = Relay {
            target: self.target.clone(),
            port: port.unwrap_or_default(),
            error,
            data,
            out: self.out.clone(),
            error_closed: error_closed.clone(),
        };
        let task = self.tasks.spawn(relay.run(uploaded));
        self.running.insert(data, Running { task, error, error_closed });
    }
}

/// One forwarded connection: kubectl's data stream to the pod's port.
struct Relay {
    target: Arc<PodTarget>,
    port: String,
    error: u32,
    data: u32,
    out: mpsc::Sender<Frame>,
    error_closed: Arc<AtomicBool>,
}

impl Relay {
    async fn run(self, uploaded: mpsc::Receiver<Bytes>) {
        let outcome = self.relay(uploaded).await;
        if self.error_closed.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Err(message) = outcome {
            let message = format!("error forwarding port {} to pod {}: {message}", self.port, self.target.pod);
            tracing::info!(namespace = %self.target.namespace, "{message}");
            let _ = self.out.send(Frame::Data { stream: self.error, fin: false, data: message.into() }).await;
            let _ = self.out.send(Frame::Data { stream: self.data, fin: true, data: Bytes::new() }).await;
        }
        let _ = self.out.send(Frame::Data { stream: self.error, fin: true, data: Bytes::new() }).await;
    }

    async fn relay(&self, mut uploaded: mpsc::Receiver<Bytes>) -> Result<(), String> {
        let port: u16 = self
            .port
            .parse()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("invalid port {:?}: it must be a number from 1 to 65535", self.port))?;
        let pod = connect(&self.target, port).await?;
        let (mut from_pod, mut to_pod) = tokio::io::split(pod);
        let upload = async move {
            while let Some(bytes) = uploaded.recv().await {
                if to_pod.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            let _ = to_pod.shutdown().await;
        };
        let download = async {
            let mut buf = vec![0u8; MAX_DATA_FRAME];
            loop {
                match from_pod.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        let frame =
                            Frame::Data { stream: self.data, fin: false, data: Bytes::copy_from_slice(&buf[..n]) };
                        if self.out.send(frame).await.is_err() {
                            return;
                        }
                    }
                }
            }
        };
        tokio::pin!(upload, download);
        // The pod's side ending ends the connection; the client's ending
        // only half-closes it, and the pod's answer still comes back.
        tokio::select! {
            _ = &mut download => {}
            _ = &mut upload => download.await,
        }
        let _ = self.out.send(Frame::Data { stream: self.data, fin: true, data: Bytes::new() }).await;
        Ok(())
    }
}

/// A byte stream to `port` of the pod, through its node agent.
async fn connect(target: &PodTarget, port: u16) -> Result<TokioIo<Upgraded>, String> {
    let uri: Uri = target.node_url.parse().map_err(|e| format!("bad node address {}: {e}", target.node_url))?;
    let authority = uri.authority().map(|a| a.to_string()).unwrap_or_default();
    let unreachable = |e: &dyn std::fmt::Display| format!("cannot reach the node agent at {}: {e}", target.node_url);
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(&authority))
        .await
        .map_err(|_| unreachable(&"timed out"))?
        .map_err(|e| unreachable(&e))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await.map_err(|e| unreachable(&e))?;
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    });
    let request = Request::get(format!("/portForward/{}/{}?port={port}", target.namespace, target.pod))
        .header(header::HOST, &authority)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "tcp")
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let response = tokio::time::timeout(CONNECT_TIMEOUT, sender.send_request(request))
        .await
        .map_err(|_| unreachable(&"timed out"))?
        .map_err(|e| unreachable(&e))?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        let body = response.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let status: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        return Err(status["message"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into()));
    }
    let upgraded = hyper::upgrade::on(response).await.map_err(|e| unreachable(&e))?;
    Ok(TokioIo::new(upgraded))
}
