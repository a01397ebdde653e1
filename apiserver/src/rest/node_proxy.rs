//! `pods/log` and `pods/exec`, which the apiserver does not answer itself
//! but proxies to the node agent running the pod, as kube-apiserver
//! proxies them to the kubelet: any master serves them, whichever node
//! the pod is on.
//!
//! - `GET pods/<name>/log`: the node's `/containerLogs/...` with the same
//!   query, streamed through (so `kubectl logs -f` follows).
//! - `GET pods/<name>/exec` upgraded to a WebSocket speaking
//!   `v5.channel.k8s.io` (kubectl 1.32's only offer): the command runs on
//!   the node to its end (CRI `ExecSync`), then its stdout (channel 1),
//!   stderr (channel 2) and a `Status` with the exit code (channel 3) are
//!   sent and the socket is closed with code 1000, as kubectl expects.
//!   With stdin or a terminal (`kubectl exec -i`, `exec -it`, `kubectl cp`
//!   into a pod) the session is relayed to the node agent's exec WebSocket
//!   instead, so input, output and terminal resizes stream both ways.
//! - `GET pods/<name>/attach`, the same way: with stdin or a terminal it
//!   is relayed to the agent's attach WebSocket; without, it follows the
//!   container's log.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ws::{CloseFrame, Message, WebSocket};
use axum::http::{header, StatusCode, Uri};
use axum::response::Response;
use base64::Engine;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use skiff_api::resources::{self, ResourceInfo};
use skiff_api::ApiError;

use crate::registry::{Context, Registry};

/// The WebSocket subprotocols exec is served in, best first.
pub const EXEC_PROTOCOLS: [&str; 1] = ["v5.channel.k8s.io"];
/// How long a node has to answer before the request fails.
const NODE_TIMEOUT: Duration = Duration::from_secs(600);

/// Where a pod's container runs: the node agent's address and the names.
#[derive(Debug, Clone)]
pub struct ContainerTarget {
    /// `http://<InternalIP>:<kubelet port>`.
    pub node_url: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container, defaulted as kube defaults it.
    pub container: String,
}

/// Where a pod runs, for a port-forward: the node agent and the names.
#[derive(Debug, Clone)]
pub struct PodTarget {
    /// `http://<InternalIP>:<kubelet port>`.
    pub node_url: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
}

fn pods() -> &'static ResourceInfo {
    resources::by_plural(Some(""), "pods").expect("pods are served")
}

fn nodes() -> &'static ResourceInfo {
    resources::by_plural(Some(""), "nodes").expect("nodes are served")
}

/// Finds the node and container a log or exec request is for, with
/// kube's errors: no such pod (404), no node yet (400), a container the
/// pod does not have or must be named (400).
pub async fn locate(
    registry: &Registry,
    ctx: &Context,
    namespace: &str,
    name: &str,
    container: Option<&str>,
) -> Result<ContainerTarget, ApiError> {
    let pod = registry.get(ctx, pods(), namespace, name, "").await?;
    let names: Vec<&str> = ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|k| pod["spec"][k].as_array().into_iter().flatten())
        .filter_map(|c| c["name"].as_str())
        .collect();
    let main: Vec<&str> =
        pod["spec"]["containers"].as_array().into_iter().flatten().filter_map(|c| c["name"].as_str()).collect();
    let container = match container.filter(|c| !c.is_empty()) {
        Some(c) if names.contains(&c) => c.to_string(),
        Some(c) => {
            return Err(ApiError::bad_request(format!("container {c} is not valid for pod {name}")));
        }
        None => {
            let default = pod["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"].as_str();
            match (default, main.as_slice()) {
                (Some(d), _) if names.contains(&d) => d.to_string(),
                (_, [only]) => only.to_string(),
                _ => {
                    return Err(ApiError::bad_request(format!(
                        "a container name must be specified for pod {name}, choose one of: [{}]",
                        main.join(" ")
                    )))
                }
            }
        }
    };
    let node_url = node_of(registry, ctx, &pod).await?;
    Ok(ContainerTarget { node_url, namespace: namespace.to_string(), pod: name.to_string(), container })
}

/// The agent URL of the node `pod` is bound to (400 if it is not bound).
pub async fn node_of(registry: &Registry, ctx: &Context, pod: &Value) -> Result<String, ApiError> {
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let node_name = pod["spec"]["nodeName"]
        .as_str()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::bad_request(format!("pod {name} does not have a host assigned")))?;
    let node = registry.get(ctx, nodes(), "", node_name, "").await?;
    node_url(&node)
}

/// Finds the node a port-forward is for: the pod must exist (404), be
/// bound (400) and be running (400, as kube-apiserver refuses it).
pub async fn locate_pod(
    registry: &Registry,
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<PodTarget, ApiError> {
    let pod = registry.get(ctx, pods(), namespace, name, "").await?;
    let phase = pod["status"]["phase"].as_str().unwrap_or("Pending");
    if phase != "Running" {
        return Err(ApiError::bad_request(format!(
            "unable to forward ports to pod {name}: its phase is {phase}, not Running"
        )));
    }
    let node_url = node_of(registry, ctx, &pod).await?;
    Ok(PodTarget { node_url, namespace: namespace.to_string(), pod: name.to_string() })
}

/// `http://<InternalIP>:<agent port>` of a Node, from its status.
pub fn node_url(node: &Value) -> Result<String, ApiError> {
    let node_name = node["metadata"]["name"].as_str().unwrap_or_default();
    let address = node["status"]["addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["type"] == "InternalIP")
        .and_then(|a| a["address"].as_str())
        .ok_or_else(|| ApiError::bad_request(format!("node {node_name} reports no InternalIP address")))?;
    let port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
        .as_u64()
        .filter(|p| *p > 0)
        .ok_or_else(|| ApiError::bad_request(format!("node {node_name} reports no agent port")))?;
    let host = if address.contains(':') { format!("[{address}]") } else { address.to_string() };
    Ok(format!("http://{host}:{port}"))
}

pub(super) fn client<B>() -> Client<hyper_util::client::legacy::connect::HttpConnector, B>
where
    B: hyper::body::Body + Send + 'static + Unpin,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    Client::builder(TokioExecutor::new()).build_http()
}

fn unreachable(target: &ContainerTarget, e: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        skiff_api::Reason::ServiceUnavailable,
        format!("cannot reach the node agent for pod {} at {}: {e}", target.pod, target.node_url),
    )
}

/// Proxies `pods/<name>/log` to the node, streaming its answer through.
pub async fn log(target: &ContainerTarget, raw_query: Option<&str>) -> Result<Response, ApiError> {
    // The node reads the same options; the container is resolved here.
    let query: String = raw_query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("container="))
        .collect::<Vec<_>>()
        .join("&");
    let uri: Uri =
        format!("{}/containerLogs/{}/{}/{}?{query}", target.node_url, target.namespace, target.pod, target.container)
            .parse()
            .map_err(|e| ApiError::internal(format!("node URL: {e}")))?;
    let answer = client::<Empty<Bytes>>().get(uri).await.map_err(|e| unreachable(target, e))?;
    let status = answer.status();
    let content_type = answer.headers().get(header::CONTENT_TYPE).cloned();
    let mut response = Response::new(Body::new(answer.into_body()));
    *response.status_mut() = status;
    if let Some(ct) = content_type {
        response.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    Ok(response)
}

/// What an exec on the node gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutcome {
    /// Standard output.
    pub stdout: Vec<u8>,
    /// Standard error.
    pub stderr: Vec<u8>,
    /// The command's exit code.
    pub exit_code: i64,
}

/// Runs `command` in the target container through its node.
pub async fn exec_on_node(target: &ContainerTarget, command: &[String]) -> Result<ExecOutcome, ApiError> {
    let query = command_query(command);
    let uri = format!("{}/exec/{}/{}/{}?{query}", target.node_url, target.namespace, target.pod, target.container);
    let request = hyper::Request::post(uri)
        .body(Full::new(Bytes::new()))
        .map_err(|e| ApiError::internal(format!("exec request: {e}")))?;
    let answer = tokio::time::timeout(NODE_TIMEOUT, client::<Full<Bytes>>().request(request))
        .await
        .map_err(|_| ApiError::timeout("the node did not answer the exec in time"))?
        .map_err(|e| unreachable(target, e))?;
    let status = answer.status();
    let body = answer.into_body().collect().await.map_err(|e| unreachable(target, e))?.to_bytes();
    let value: Value = serde_json::from_slice(&body)
        .map_err(|_| ApiError::internal(format!("the node answered the exec with {status}")))?;
    if !status.is_success() {
        let message = value["message"].as_str().unwrap_or("exec failed on the node").to_string();
        let reason = match status {
            StatusCode::NOT_FOUND => skiff_api::Reason::NotFound,
            StatusCode::BAD_REQUEST => skiff_api::Reason::BadRequest,
            _ => skiff_api::Reason::InternalError,
        };
        return Err(ApiError::new(reason, message));
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let bytes = |k: &str| b64.decode(value[k].as_str().unwrap_or("")).unwrap_or_default();
    Ok(ExecOutcome {
        stdout: bytes("stdout"),
        stderr: bytes("stderr"),
        exit_code: value["exitCode"].as_i64().unwrap_or(1),
    })
}

/// `command=<word>&...`, each word form-encoded for the node.
fn command_query(command: &[String]) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for word in command {
        query.append_pair("command", word);
    }
    query.finish()
}

/// One channel message: the channel id, then the bytes.
fn frame(channel: u8, data: &[u8]) -> Message {
    let mut out = Vec::with_capacity(data.len() + 1);
    out.push(channel);
    out.extend_from_slice(data);
    Message::Binary(out)
}

/// The parameters of an exec request, from its query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecParams {
    /// The command and its arguments.
    pub command: Vec<String>,
    /// The container asked for.
    pub container: Option<String>,
    /// Standard input wanted.
    pub stdin: bool,
    /// A terminal wanted.
    pub tty: bool,
}

impl ExecParams {
    /// Reads `command` (repeated), `container`, `stdin`, `tty`.
    pub fn parse(pairs: &[(String, String)]) -> ExecParams {
        let mut p = ExecParams::default();
        for (k, v) in pairs {
            let on = v == "true" || v == "1";
            match k.as_str() {
                "command" => p.command.push(v.clone()),
                "container" => p.container = Some(v.clone()),
                "stdin" => p.stdin = on,
                "tty" => p.tty = on,
                _ => {}
            }
        }
        p
    }
}

/// Serves one exec session on an upgraded socket. Without stdin or a
/// terminal: runs the command, sends its output and exit Status, closes
/// with 1000 (pings are answered while it runs). With stdin or a terminal:
/// relays the session (resizes included) to the node agent's own
/// `v5.channel.k8s.io` WebSocket, message for message, as kube-apiserver
/// proxies it to the kubelet.
pub async fn exec_session(
    socket: WebSocket,
    located: Result<ContainerTarget, ApiError>,
    params: ExecParams,
    raw_query: String,
) {
    match &located {
        Ok(target) if (params.stdin || params.tty) && !params.command.is_empty() => {
            return relay_to_node(socket, "exec", target, &raw_query).await;
        }
        _ => {}
    }
    let (mut sink, mut stream) = socket.split();
    // Reading answers pings; stop on the client's close or hang-up.
    let reader = tokio::spawn(async move {
        while let Some(Ok(message)) = stream.next().await {
            if matches!(message, Message::Close(_)) {
                break;
            }
        }
    });
    let outcome = match located {
        Err(e) => Err(e),
        Ok(_) if params.command.is_empty() => Err(ApiError::bad_request("you must specify at least 1 command")),
        Ok(target) => exec_on_node(&target, &params.command).await,
    };
    let mut messages = Vec::new();
    let status = match outcome {
        Ok(out) => {
            if !out.stdout.is_empty() {
                messages.push(frame(1, &out.stdout));
            }
            if !out.stderr.is_empty() {
                messages.push(frame(2, &out.stderr));
            }
            skiff_api::status::exec_exit_status(out.exit_code)
        }
        Err(e) => e.exec_status(),
    };
    messages.push(frame(3, status.to_string().as_bytes()));
    messages.push(Message::Close(Some(CloseFrame { code: 1000, reason: "".into() })));
    for m in messages {
        if sink.send(m).await.is_err() {
            break;
        }
    }
    // Give the client a moment to answer the close, then let go.
    let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
}

/// Serves `kubectl attach`. Without stdin or a terminal: the container's
/// output from now on (stdout and stderr together, from its log as the
/// node follows it) on channel 1 until the container ends, then a Success
/// Status. With stdin or a terminal (`kubectl attach -it`, `kubectl run
/// -it`): the session is relayed to the node agent's attach WebSocket,
/// which joins the container's own stdio through the runtime.
pub async fn attach_session(
    socket: WebSocket,
    located: Result<ContainerTarget, ApiError>,
    params: ExecParams,
    raw_query: String,
) {
    if let (Ok(target), true) = (&located, params.stdin || params.tty) {
        return relay_to_node(socket, "attach", target, &raw_query).await;
    }
    let (mut sink, mut stream) = socket.split();
    let mut reader = tokio::spawn(async move {
        while let Some(Ok(message)) = stream.next().await {
            if matches!(message, Message::Close(_)) {
                break;
            }
        }
    });
    let mut client_gone = false;
    let outcome = async {
        let target = located?;
        let response = log(&target, Some("follow=true&tailLines=0")).await?;
        if !response.status().is_success() {
            let body = axum::body::to_bytes(response.into_body(), 64 * 1024).await.unwrap_or_default();
            let status: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let message = status["message"].as_str().map(str::to_string);
            return Err(ApiError::bad_request(message.unwrap_or_else(|| String::from_utf8_lossy(&body).into())));
        }
        let mut output = response.into_body().into_data_stream();
        loop {
            tokio::select! {
                chunk = output.next() => match chunk {
                    Some(Ok(bytes)) => {
                        if sink.send(frame(1, &bytes)).await.is_err() {
                            client_gone = true;
                            return Ok(());
                        }
                    }
                    _ => return Ok(()),
                },
                _ = &mut reader => {
                    client_gone = true;
                    return Ok(());
                }
            }
        }
    }
    .await;
    if client_gone {
        return;
    }
    let status = match outcome {
        Ok(()) => skiff_api::status::exec_exit_status(0),
        Err(e) => e.exec_status(),
    };
    let _ = sink.send(frame(3, status.to_string().as_bytes())).await;
    let _ = sink.send(Message::Close(Some(CloseFrame { code: 1000, reason: "".into() }))).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
}

/// Relays an exec or attach session (`what`) between kubectl and the node
/// agent, both speaking `v5.channel.k8s.io`; a node that cannot be reached
/// is reported on channel 3 as kubectl expects.
async fn relay_to_node(socket: WebSocket, what: &str, target: &ContainerTarget, raw_query: &str) {
    use tokio_tungstenite::tungstenite::{self, ClientRequestBuilder};
    let url = format!(
        "ws://{}/{what}/{}/{}/{}?{raw_query}",
        target.node_url.trim_start_matches("http://"),
        target.namespace,
        target.pod,
        target.container
    );
    let connected = match url.parse::<Uri>() {
        Ok(uri) => {
            let request = ClientRequestBuilder::new(uri).with_sub_protocol(EXEC_PROTOCOLS[0]);
            tokio::time::timeout(Duration::from_secs(10), tokio_tungstenite::connect_async(request))
                .await
                .map_err(|_| unreachable(target, "timed out"))
                .and_then(|r| r.map_err(|e| unreachable(target, e)))
        }
        Err(e) => Err(unreachable(target, e)),
    };
    let (mut to_client, mut from_client) = socket.split();
    let node = match connected {
        Ok((node, _)) => node,
        Err(e) => {
            let _ = to_client.send(frame(3, e.exec_status().to_string().as_bytes())).await;
            let _ = to_client.send(Message::Close(Some(CloseFrame { code: 1000, reason: "".into() }))).await;
            return;
        }
    };
    let (mut to_node, mut from_node) = node.split();
    let upstream = async move {
        while let Some(Ok(message)) = from_client.next().await {
            let (message, last) = match message {
                Message::Binary(b) => (tungstenite::Message::Binary(b), false),
                Message::Text(t) => (tungstenite::Message::Text(t), false),
                Message::Close(_) => (tungstenite::Message::Close(None), true),
                Message::Ping(_) | Message::Pong(_) => continue,
            };
            if to_node.send(message).await.is_err() || last {
                break;
            }
        }
        let _ = to_node.close().await;
    };
    let downstream = async move {
        while let Some(Ok(message)) = from_node.next().await {
            let message = match message {
                tungstenite::Message::Binary(b) => Message::Binary(b),
                tungstenite::Message::Text(t) => Message::Text(t),
                tungstenite::Message::Close(_) => break,
                _ => continue,
            };
            if to_client.send(message).await.is_err() {
                return;
            }
        }
        let _ = to_client.send(Message::Close(Some(CloseFrame { code: 1000, reason: "".into() }))).await;
    };
    tokio::pin!(upstream, downstream);
    // The node ends the session (status, close); kubectl hanging up ends
    // it too, once the node has closed its side.
    tokio::select! {
        _ = &mut downstream => {}
        _ = &mut upstream => {
            let _ = tokio::time::timeout(Duration::from_secs(5), downstream).await;
        }
    }
}

/// Query pairs in order, decoded; keys repeat (`command`).
pub fn query_pairs(raw: Option<&str>) -> Vec<(String, String)> {
    form_urlencoded::parse(raw.unwrap_or("").as_bytes()).into_owned().collect()
}

/// Query pairs as a map, last value winning.
pub fn query_map(pairs: &[(String, String)]) -> HashMap<String, String> {
    pairs.iter().cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_params_keep_every_command_word_in_order() {
        let pairs = query_pairs(Some("command=sh&command=-c&command=echo%20hi&container=app&stderr=true&stdout=true"));
        let p = ExecParams::parse(&pairs);
        assert_eq!(p.command, ["sh", "-c", "echo hi"]);
        assert_eq!(p.container.as_deref(), Some("app"));
        assert!(!p.stdin && !p.tty);
        assert!(ExecParams::parse(&query_pairs(Some("command=sh&stdin=true&tty=true"))).tty);
    }

    #[test]
    fn command_words_survive_the_trip_to_the_node() {
        let command: Vec<String> = ["sh", "-c", "echo hi/there&x=1+2 %41"].map(String::from).to_vec();
        let query = command_query(&command);
        assert!(!query.contains(' ') && query.matches('&').count() == 2, "{query}");
        let back: Vec<String> = query_pairs(Some(&query)).into_iter().map(|(_, v)| v).collect();
        assert_eq!(back, command);
    }

    #[test]
    fn frames_start_with_their_channel() {
        match frame(2, b"err") {
            Message::Binary(b) => assert_eq!(b, b"\x02err"),
            other => panic!("{other:?}"),
        }
    }
}
