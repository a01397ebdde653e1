//! The audit log: one JSON line per request, in Kubernetes'
//! `audit.k8s.io/v1` `Event` format, to `--audit-log-path`. What each
//! event holds is chosen by a policy (`--audit-policy-file`, Kubernetes'
//! `Policy` YAML): the first rule matching the request gives its level,
//! `None` (not logged), `Metadata` (who did what to which object, and the
//! outcome), `Request` (and the object sent) or `RequestResponse` (and the
//! object returned). Without a policy file everything is logged at
//! `Metadata`. A request not matching any rule is not logged.
//!
//! Events are written in the order requests finish, by one task; a request
//! waits for its event to be queued (never for the disk), so a slow disk
//! slows the API rather than losing events, as Kubernetes' blocking mode.
//! Long-running requests (watches, exec) are logged once their response
//! has started (`ResponseStarted`); the rest when complete
//! (`ResponseComplete`). Requests refused before authentication (401) are
//! not logged.
//!
//! Calls on the gRPC resource API (the components', `skiffctl`'s) are
//! logged the same way, as [`Call`]s: the gRPC method is the event's
//! `requestURI`, the object a create or update sends its `requestObject`,
//! and the HTTP code of the outcome its `responseStatus`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{json, Value};
use skiff_shutdown::Shutdown;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::admission::UserInfo;
use crate::request_info::RequestInfo;

/// Bodies larger than this are logged without their object.
const MAX_LOGGED_BODY: usize = 3 * 1024 * 1024;
/// Events queued for the writer before requests wait.
const QUEUE: usize = 4096;

/// `--audit-log-path` and `--audit-policy-file`.
#[derive(Clone, Debug)]
pub struct AuditConfig {
    pub path: PathBuf,
    pub policy_file: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    #[default]
    None,
    Metadata,
    Request,
    RequestResponse,
}

/// A policy: its rules, first match wins.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Policy {
    #[serde(default)]
    rules: Vec<PolicyRule>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PolicyRule {
    level: Level,
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    user_groups: Vec<String>,
    #[serde(default)]
    verbs: Vec<String>,
    #[serde(default)]
    resources: Vec<GroupResources>,
    #[serde(default)]
    namespaces: Vec<String>,
    #[serde(default, rename = "nonResourceURLs")]
    non_resource_urls: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GroupResources {
    #[serde(default)]
    group: String,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    resource_names: Vec<String>,
}

impl Policy {
    /// Everything at `Metadata`.
    pub fn metadata_for_all() -> Policy {
        Policy { rules: vec![PolicyRule::everything(Level::Metadata)] }
    }

    pub fn parse(text: &str) -> Result<Policy, String> {
        let doc: Value = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
        match (doc["apiVersion"].as_str(), doc["kind"].as_str()) {
            (Some("audit.k8s.io/v1"), Some("Policy")) => {}
            (v, k) => {
                return Err(format!(
                    "expected apiVersion audit.k8s.io/v1 and kind Policy, got {} {}",
                    v.unwrap_or("(none)"),
                    k.unwrap_or("(none)")
                ))
            }
        }
        serde_json::from_value(doc).map_err(|e| e.to_string())
    }

    pub fn load(path: &Path) -> Result<Policy, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Policy::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The level of the first rule matching; `None` if no rule does.
    pub fn level(&self, user: &UserInfo, info: &RequestInfo) -> Level {
        self.rules.iter().find(|r| r.matches(user, info)).map_or(Level::None, |r| r.level)
    }
}

impl PolicyRule {
    fn everything(level: Level) -> PolicyRule {
        PolicyRule {
            level,
            users: vec![],
            user_groups: vec![],
            verbs: vec![],
            resources: vec![],
            namespaces: vec![],
            non_resource_urls: vec![],
        }
    }

    fn matches(&self, user: &UserInfo, info: &RequestInfo) -> bool {
        let any_or = |list: &[String], f: &dyn Fn(&str) -> bool| list.is_empty() || list.iter().any(|x| f(x));
        if !any_or(&self.users, &|u| u == user.name)
            || !any_or(&self.user_groups, &|g| user.groups.iter().any(|ug| ug == g))
            || !any_or(&self.verbs, &|v| v == info.verb)
        {
            return false;
        }
        if info.is_resource {
            // A rule for paths says nothing about resources.
            if !self.non_resource_urls.is_empty() {
                return false;
            }
            let resource = if info.subresource.is_empty() {
                info.resource.clone()
            } else {
                format!("{}/{}", info.resource, info.subresource)
            };
            any_or(&self.namespaces, &|n| n == info.namespace)
                && (self.resources.is_empty()
                    || self.resources.iter().any(|gr| {
                        gr.group == info.api_group
                            && (gr.resources.is_empty()
                                || gr.resources.iter().any(|r| {
                                    r == "*"
                                        || *r == resource
                                        || r.strip_prefix("*/").is_some_and(|s| s == info.subresource)
                                        || r.strip_suffix("/*").is_some_and(|p| p == info.resource)
                                }))
                            && (gr.resource_names.is_empty() || gr.resource_names.contains(&info.name))
                    }))
        } else {
            self.resources.is_empty()
                && self.namespaces.is_empty()
                && any_or(&self.non_resource_urls, &|u| match u.strip_suffix('*') {
                    Some(prefix) => info.path.starts_with(prefix),
                    None => u == info.path,
                })
        }
    }
}

/// The log: a policy and the queue to its writer.
#[derive(Clone)]
pub struct AuditLog {
    policy: Arc<Policy>,
    events: mpsc::Sender<Vec<u8>>,
}

impl AuditLog {
    /// Opens (appending; created 0600) the log file and starts its writer
    /// under `shutdown`.
    pub async fn open(config: &AuditConfig, shutdown: &Shutdown) -> Result<AuditLog, String> {
        let policy = match &config.policy_file {
            Some(path) => Policy::load(path)?,
            None => Policy::metadata_for_all(),
        };
        let mut file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&config.path)
            .await
            .map_err(|e| format!("{}: {e}", config.path.display()))?;
        let (events, mut queued) = mpsc::channel::<Vec<u8>>(QUEUE);
        let path = config.path.clone();
        shutdown.spawn(async move {
            while let Some(event) = queued.recv().await {
                let mut batch = event;
                while let Ok(more) = queued.try_recv() {
                    batch.extend_from_slice(&more);
                }
                if let Err(e) = file.write_all(&batch).await {
                    tracing::error!(path = %path.display(), error = %e, "writing the audit log");
                }
                let _ = file.flush().await;
            }
        });
        Ok(AuditLog { policy: Arc::new(policy), events })
    }

    async fn write(&self, event: &Value) {
        let mut line = serde_json::to_vec(event).expect("JSON values serialize");
        line.push(b'\n');
        // The writer stops only with the member.
        let _ = self.events.send(line).await;
    }
}

/// A body as the object it carries (JSON, YAML or Kubernetes protobuf,
/// which kubectl sends for built-in kinds), if it is one worth logging.
fn object_of(headers: &axum::http::HeaderMap, body: &Bytes) -> Option<Value> {
    if body.is_empty() || body.len() > MAX_LOGGED_BODY {
        return None;
    }
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("application/json");
    match content_type.split(';').next().unwrap_or_default().trim() {
        "application/vnd.kubernetes.protobuf" => skiff_api::protobuf::decode(body).ok(),
        t if t.ends_with("yaml") => serde_yaml::from_slice(body).ok(),
        t if t.contains("json") => serde_json::from_slice(body).ok(),
        _ => None,
    }
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// What an event says about one request, from either API.
struct Entry<'a> {
    level: Level,
    user: &'a UserInfo,
    info: &'a RequestInfo,
    uri: &'a str,
    source: Option<String>,
    user_agent: Option<String>,
    received: String,
    long_running: bool,
    code: u16,
    request_object: Option<Value>,
    response_object: Option<Value>,
    annotations: std::collections::BTreeMap<String, String>,
}

impl Entry<'_> {
    /// The `audit.k8s.io/v1` `Event`.
    fn event(self) -> Value {
        let (user, info) = (self.user, self.info);
        let mut event = json!({
            "kind": "Event",
            "apiVersion": "audit.k8s.io/v1",
            "level": format!("{:?}", self.level),
            "auditID": uuid::Uuid::new_v4().to_string(),
            "stage": if self.long_running { "ResponseStarted" } else { "ResponseComplete" },
            "requestURI": self.uri,
            "verb": info.verb,
            "user": {"username": user.name, "groups": user.groups},
            "responseStatus": {"metadata": {}, "code": self.code},
            "requestReceivedTimestamp": self.received,
            "stageTimestamp": now(),
        });
        if let Some(ip) = self.source {
            event["sourceIPs"] = json!([ip]);
        }
        if let Some(agent) = self.user_agent {
            event["userAgent"] = json!(agent);
        }
        if info.is_resource {
            let mut object_ref = json!({"resource": info.resource, "apiVersion": info.api_version});
            for (key, value) in [
                ("namespace", &info.namespace),
                ("name", &info.name),
                ("apiGroup", &info.api_group),
                ("subresource", &info.subresource),
            ] {
                if !value.is_empty() {
                    object_ref[key] = json!(value);
                }
            }
            event["objectRef"] = object_ref;
        }
        if let Some(object) = self.request_object {
            event["requestObject"] = object;
        }
        if !self.annotations.is_empty() {
            event["annotations"] = json!(self.annotations);
        }
        if let Some(object) = self.response_object {
            event["responseObject"] = object;
        }
        event
    }
}

/// A call on the gRPC resource API being audited: begun once its caller
/// is authenticated ([`AuditLog::begin`]), written when it ends.
pub struct Call {
    log: AuditLog,
    level: Level,
    user: UserInfo,
    info: RequestInfo,
    source: Option<String>,
    user_agent: Option<String>,
    received: String,
    request_object: Option<Value>,
    annotations: crate::registry::AuditAnnotations,
}

impl AuditLog {
    /// The event of a gRPC call by `user` on `info` (its `path` the gRPC
    /// method), if the policy logs it. `body` gives the object sent, read
    /// only at `Request` level and above; `annotations` are admission's.
    pub fn begin(
        &self,
        user: &UserInfo,
        info: RequestInfo,
        source: Option<SocketAddr>,
        user_agent: Option<&str>,
        body: impl FnOnce() -> Option<Value>,
        annotations: &crate::registry::AuditAnnotations,
    ) -> Option<Call> {
        let level = self.policy.level(user, &info);
        if level == Level::None {
            return None;
        }
        let long_running = info.verb == "watch";
        Some(Call {
            log: self.clone(),
            level,
            user: user.clone(),
            request_object: if level >= Level::Request && !long_running { body() } else { None },
            info,
            source: source.map(|a| a.ip().to_string()),
            user_agent: user_agent.map(str::to_string),
            received: now(),
            annotations: annotations.clone(),
        })
    }
}

impl Call {
    /// Writes the event: the call ended with HTTP status `code`, returning
    /// `response` (logged at `RequestResponse`).
    pub async fn finish(self, code: u16, response: Option<&Value>) {
        let long_running = self.info.verb == "watch";
        let entry = Entry {
            level: self.level,
            user: &self.user,
            info: &self.info,
            uri: &self.info.path,
            source: self.source,
            user_agent: self.user_agent,
            received: self.received,
            long_running,
            code,
            request_object: self.request_object,
            response_object: response.filter(|_| self.level == Level::RequestResponse && !long_running).cloned(),
            annotations: std::mem::take(&mut *self.annotations.lock().expect("audit annotations lock")),
        };
        self.log.write(&entry.event()).await;
    }
}

/// The HTTP layer: runs after authentication, so it knows the user.
pub async fn record(State(log): State<AuditLog>, request: Request, next: Next) -> Response {
    let (Some(user), Some(info)) =
        (request.extensions().get::<UserInfo>().cloned(), request.extensions().get::<RequestInfo>().cloned())
    else {
        return next.run(request).await;
    };
    let level = log.policy.level(&user, &info);
    if level == Level::None {
        return next.run(request).await;
    }
    let received = now();
    let source = request
        .extensions()
        .get::<SocketAddr>()
        .copied()
        .or_else(|| request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0))
        .map(|a| a.ip().to_string());
    let user_agent = request.headers().get(header::USER_AGENT).and_then(|v| v.to_str().ok()).map(String::from);
    let uri = request.uri().to_string();
    let long_running = info.is_long_running();
    let (request, request_object) = if level >= Level::Request && !long_running {
        let (parts, body) = request.into_parts();
        match axum::body::to_bytes(body, crate::rest::MAX_BODY).await {
            Ok(bytes) => {
                let object = object_of(&parts.headers, &bytes);
                (Request::from_parts(parts, Body::from(bytes)), object)
            }
            // Too large: the handler refuses it with 413 anyway.
            Err(_) => (Request::from_parts(parts, Body::empty()), None),
        }
    } else {
        (request, None)
    };
    // Admission adds to these (PodSecurity's audit mode).
    let annotations = crate::registry::AuditAnnotations::default();
    let mut request = request;
    request.extensions_mut().insert(annotations.clone());
    let response = next.run(request).await;
    let code = response.status().as_u16();
    let (response, response_object) = if level == Level::RequestResponse && !long_running {
        let (parts, body) = response.into_parts();
        match axum::body::to_bytes(body, MAX_LOGGED_BODY * 4).await {
            Ok(bytes) => {
                let object = object_of(&parts.headers, &bytes);
                (Response::from_parts(parts, Body::from(bytes)), object)
            }
            Err(_) => (Response::from_parts(parts, Body::empty()), None),
        }
    } else {
        (response, None)
    };
    let entry = Entry {
        level,
        user: &user,
        info: &info,
        uri: &uri,
        source,
        user_agent,
        received,
        long_running,
        code,
        request_object,
        response_object,
        annotations: std::mem::take(&mut *annotations.lock().expect("audit annotations lock")),
    };
    log.write(&entry.event()).await;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo { name: name.into(), groups: groups.iter().map(|g| g.to_string()).collect() }
    }

    #[test]
    fn the_first_matching_rule_decides() {
        let policy = Policy::parse(
            r#"
apiVersion: audit.k8s.io/v1
kind: Policy
rules:
- level: None
  users: ["system:kube-proxy"]
- level: Metadata
  resources:
  - group: ""
    resources: ["secrets", "configmaps/*"]
- level: RequestResponse
  verbs: ["create", "update", "patch", "delete"]
  namespaces: ["prod"]
- level: None
  nonResourceURLs: ["/healthz*", "/version"]
- level: Request
  userGroups: ["system:authenticated"]
"#,
        )
        .unwrap();
        let alice = user("alice", &["system:authenticated"]);
        let parse = |method: &str, path: &str| RequestInfo::parse(method, path, None);
        for (who, method, path, level) in [
            (&user("system:kube-proxy", &["system:authenticated"]), "GET", "/api/v1/services", Level::None),
            (&alice, "GET", "/api/v1/namespaces/prod/secrets/s", Level::Metadata),
            (&alice, "POST", "/api/v1/namespaces/prod/secrets", Level::Metadata),
            (&alice, "GET", "/api/v1/namespaces/d/configmaps/c/status", Level::Metadata),
            (&alice, "POST", "/api/v1/namespaces/prod/pods", Level::RequestResponse),
            (&alice, "GET", "/api/v1/namespaces/prod/pods", Level::Request),
            (&alice, "GET", "/healthz/ping", Level::None),
            (&alice, "GET", "/metrics", Level::Request),
            (&user("system:anonymous", &[]), "GET", "/metrics", Level::None),
        ] {
            assert_eq!(policy.level(who, &parse(method, path)), level, "{} {method} {path}", who.name);
        }
    }

    #[test]
    fn policies_of_another_kind_are_refused() {
        let e = Policy::parse("apiVersion: v1\nkind: ConfigMap\n").unwrap_err();
        assert!(e.contains("expected apiVersion audit.k8s.io/v1 and kind Policy"), "{e}");
        let e = Policy::parse("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Loud\n").unwrap_err();
        assert!(e.contains("Loud"), "{e}");
    }
}
