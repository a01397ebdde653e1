//! The Kubernetes REST API for kubectl and the Kubernetes client libraries,
//! on the HTTP listener beside health and metrics. One code path with the
//! gRPC API: every request goes to the same [`Registry`] (admission chain,
//! validation, store transactions) and watches to the same fan-out; only
//! the encoding differs. What kubectl 1.32 sends, request by request, is in
//! `shared/KUBECTL.md`; the paths follow Kubernetes':
//!
//! ```text
//! /api/v1/<resource>[/<name>[/<subresource>]]                       core, cluster-scoped or all namespaces
//! /api/v1/namespaces/<ns>/<resource>[/<name>[/<subresource>]]       core, namespaced
//! /apis/<group>/v1/...                                              the same for named groups
//! /apis/metrics.k8s.io/v1beta1/{nodes,namespaces/<ns>/pods}[/<name>] kubectl top, from the node agents
//! ```

pub mod discovery;
pub mod node_proxy;
pub mod openapi;
pub mod port_forward;
pub mod resource_metrics;
mod spdy;

use std::collections::HashMap;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;
use futures::StreamExt;
use serde_json::{json, Value};
use skiff_api::resources::{self, Kind, ResourceInfo};
use skiff_api::table::{self, IncludeObject};
use skiff_api::{meta, validation, ApiError, Reason};

use crate::admission::{Attributes, Security, UserInfo};
use crate::metrics::RequestTimer;
use crate::rbac::{Action, Rule};
use crate::registry::{
    unknown_fields, Context, DeleteOptions, Deleted, ListOptions, PatchOptions, PatchType, Registry,
};
use crate::watch::{EventType, WatchOptions};

/// Request bodies larger than this are refused before decoding (413).
pub(crate) const MAX_BODY: usize = 3 * 1024 * 1024;

#[derive(Clone)]
pub struct RestState {
    pub registry: Registry,
    /// This member's HTTP address, for legacy discovery.
    pub address: String,
}

/// A response carrying JSON.
fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn value_response(status: StatusCode, v: &Value) -> Response {
    json_response(status, serde_json::to_vec(v).expect("JSON values serialize"))
}

/// A Kubernetes `Status` with the error's HTTP code.
pub fn error_response(e: &ApiError) -> Response {
    let status = StatusCode::from_u16(e.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    value_response(status, &e.to_status())
}

fn not_found_path() -> ApiError {
    ApiError::new(Reason::NotFound, "the server could not find the requested resource")
}

/// Who sent a request: the HTTP listener's authentication step
/// ([`crate::http::authenticate`]) put them into its extensions. A request
/// that did not pass that step is nobody's.
fn user_of(extensions: &axum::http::Extensions) -> Result<UserInfo, ApiError> {
    extensions.get::<UserInfo>().cloned().ok_or_else(|| ApiError::unauthorized("Unauthorized"))
}

fn query(uri: &Uri) -> HashMap<String, String> {
    form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()).into_owned().collect()
}

/// What a request's path names.
#[derive(Debug, PartialEq, Eq)]
enum Target<'a> {
    Version,
    /// `/api` (core) or `/apis`.
    Groups {
        core: bool,
    },
    /// `/apis/<group>`.
    Group(&'a str),
    /// `/api/v1`, `/apis/<group>/<version>`.
    Resources {
        group: &'a str,
        version: &'a str,
    },
    /// `/openapi/v3`.
    OpenApiRoot,
    /// `/openapi/v3/<gv>`.
    OpenApi(String),
    /// `/openapi/v2`.
    OpenApiV2,
    /// A collection, an object or a subresource.
    Object {
        group: &'a str,
        version: &'a str,
        namespace: Option<&'a str>,
        resource: &'a str,
        name: Option<&'a str>,
        sub: Option<&'a str>,
    },
}

fn parse_path(path: &str) -> Option<Target<'_>> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segments.as_slice() {
        ["version"] => return Some(Target::Version),
        ["api"] => return Some(Target::Groups { core: true }),
        ["apis"] => return Some(Target::Groups { core: false }),
        ["apis", g] => return Some(Target::Group(g)),
        ["openapi", "v2"] => return Some(Target::OpenApiV2),
        ["openapi", "v3"] => return Some(Target::OpenApiRoot),
        ["openapi", "v3", gv @ ..] => return Some(Target::OpenApi(gv.join("/"))),
        ["api", v] => return Some(Target::Resources { group: "", version: v }),
        ["apis", g, v] => return Some(Target::Resources { group: g, version: v }),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        // `namespaces/<ns>/<resource>...`, unless the third segment is a
        // subresource of the namespace itself.
        ["namespaces", ns, r, tail @ ..] if !matches!(*r, "status" | "finalize") => {
            (Some(*ns), [&[*r][..], tail].concat())
        }
        other => (None, other.to_vec()),
    };
    match rest.as_slice() {
        [resource] => Some(Target::Object { group, version, namespace, resource, name: None, sub: None }),
        [resource, name] => Some(Target::Object { group, version, namespace, resource, name: Some(name), sub: None }),
        [resource, name, sub] => {
            Some(Target::Object { group, version, namespace, resource, name: Some(name), sub: Some(sub) })
        }
        _ => None,
    }
}

/// Serves everything under the HTTP listener that is not health or metrics.
pub async fn handle(State(state): State<RestState>, request: axum::extract::Request) -> Response {
    let (mut parts, body) = request.into_parts();
    let user = match user_of(&parts.extensions) {
        Ok(user) => user,
        Err(e) => return error_response(&e),
    };
    if let Some(target) = pod_stream(parts.uri.path()) {
        return match stream_to_node(&state, user, &mut parts, target).await {
            Ok(r) => r,
            Err(e) => error_response(&e),
        };
    }
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(_) => {
            return error_response(&ApiError::too_large(format!("Request entity too large: limit is {MAX_BODY}")))
        }
    };
    let audit = parts.extensions.get::<crate::registry::AuditAnnotations>().cloned().unwrap_or_default();
    match route(&state, &user, &audit, &parts.method, &parts.uri, &parts.headers, body).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

/// A pod subresource the node answers: (namespace, pod, subresource).
fn pod_stream(path: &str) -> Option<(String, String, String)> {
    match parse_path(path)? {
        Target::Object {
            group: "",
            version: "v1",
            namespace: Some(ns),
            resource: "pods",
            name: Some(name),
            sub: Some(sub),
        } if matches!(sub, "log" | "exec" | "attach" | "portforward") => {
            Some((ns.to_string(), name.to_string(), sub.to_string()))
        }
        _ => None,
    }
}

/// The context of a request that writes nothing (logs, exec, metrics):
/// its user; the field manager is only for completeness.
fn reader_context(user: UserInfo, headers: &HeaderMap) -> Context {
    let agent = headers.get(header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or_default();
    Context {
        user,
        field_manager: crate::registry::manager_from_user_agent(agent),
        warnings: Default::default(),
        audit: Default::default(),
    }
}

/// `pods/log`, `pods/exec`, `pods/attach` and `pods/portforward`, proxied
/// to the pod's node (`node_proxy`, `port_forward`). Reading a log takes
/// `get pods/log`; the streams take
/// `create` on their subresource, as kube-apiserver asks of WebSocket
/// upgrades.
async fn stream_to_node(
    state: &RestState,
    user: UserInfo,
    parts: &mut axum::http::request::Parts,
    (namespace, pod, sub): (String, String, String),
) -> Result<Response, ApiError> {
    let ctx = reader_context(user, &parts.headers);
    let pods = resources::by_plural(Some(""), "pods").expect("pods are served");
    state.registry.security().authorize(&Attributes {
        user: &ctx.user,
        verb: if sub == "log" { "get" } else { "create" },
        resource: pods,
        subresource: &sub,
        namespace: &namespace,
        name: &pod,
    })?;
    let pairs = node_proxy::query_pairs(parts.uri.query());
    let container = pairs.iter().rev().find(|(k, _)| k == "container").map(|(_, v)| v.as_str());
    let websocket = parts
        .headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
    match sub.as_str() {
        "log" => {
            if parts.method != Method::GET {
                return Err(ApiError::method_not_allowed(format!("{} is not supported on pods/log", parts.method)));
            }
            let target = node_proxy::locate(&state.registry, &ctx, &namespace, &pod, container).await?;
            node_proxy::log(&target, parts.uri.query()).await
        }
        "exec" | "attach" => {
            let located = node_proxy::locate(&state.registry, &ctx, &namespace, &pod, container).await;
            if !websocket {
                // kubectl falls back to SPDY only after the WebSocket
                // attempt failed; tell it why, or why the pod is not there.
                located?;
                return Err(ApiError::bad_request(format!(
                    "Skiff serves {sub} over WebSocket (v5.channel.k8s.io) only; SPDY is not supported"
                )));
            }
            let located = Ok(located?);
            let upgrade = websocket_upgrade(parts, state).await?;
            let params = node_proxy::ExecParams::parse(&pairs);
            let raw_query = parts.uri.query().unwrap_or_default().to_string();
            let upgrade = upgrade.protocols(node_proxy::EXEC_PROTOCOLS);
            Ok(if sub == "attach" {
                upgrade.on_upgrade(move |socket| node_proxy::attach_session(socket, located, params, raw_query))
            } else {
                upgrade.on_upgrade(move |socket| node_proxy::exec_session(socket, located, params, raw_query))
            })
        }
        "portforward" => {
            let located = node_proxy::locate_pod(&state.registry, &ctx, &namespace, &pod).await;
            if !websocket {
                let target = located?;
                if port_forward::wants_spdy(&parts.headers) {
                    return port_forward::spdy_upgrade(parts, target);
                }
                return Err(ApiError::bad_request(
                    "pods/portforward is an upgrade: to a WebSocket (SPDY/3.1+portforward.k8s.io) or to SPDY/3.1",
                ));
            }
            let target = located?;
            let upgrade = websocket_upgrade(parts, state).await?;
            Ok(upgrade
                .protocols(port_forward::PROTOCOLS)
                .on_upgrade(move |socket| port_forward::session(socket, target)))
        }
        other => Err(ApiError::bad_request(format!("pods/{other} is not supported by Skiff yet"))),
    }
}

/// The WebSocket handshake of a streaming subresource, or a 400 saying
/// what is wrong with it.
async fn websocket_upgrade(
    parts: &mut axum::http::request::Parts,
    state: &RestState,
) -> Result<axum::extract::ws::WebSocketUpgrade, ApiError> {
    use axum::extract::FromRequestParts;
    axum::extract::ws::WebSocketUpgrade::from_request_parts(parts, state)
        .await
        .map_err(|e| ApiError::bad_request(format!("WebSocket upgrade: {}", e.body_text())))
}

fn wants_aggregated(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=APIGroupDiscoveryList") && a.contains("v=v2"))
}

async fn route(
    state: &RestState,
    user: &UserInfo,
    audit: &crate::registry::AuditAnnotations,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let target = parse_path(uri.path()).ok_or_else(not_found_path)?;
    let get_only = |v: Value| -> Result<Response, ApiError> {
        if method != Method::GET {
            return Err(ApiError::method_not_allowed(format!("{method} is not supported here")));
        }
        Ok(value_response(StatusCode::OK, &v))
    };
    match target {
        Target::Version => get_only(discovery::version()),
        Target::Groups { core } => {
            if wants_aggregated(headers) {
                let custom = state.registry.custom_resources().await?;
                let mut r = get_only(discovery::aggregated(core, &custom))?;
                r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(discovery::AGGREGATED));
                Ok(r)
            } else if core {
                get_only(discovery::api_versions(&state.address))
            } else {
                get_only(discovery::api_group_list(&state.registry.custom_resources().await?))
            }
        }
        Target::Group(g) => {
            let custom = state.registry.custom_resources().await?;
            get_only(discovery::group(g, &custom).ok_or_else(not_found_path)?)
        }
        Target::Resources { group, version } => {
            let custom = state.registry.custom_resources().await?;
            get_only(discovery::resource_list(group, version, &custom).ok_or_else(not_found_path)?)
        }
        Target::OpenApiRoot | Target::OpenApi(_) | Target::OpenApiV2 => {
            if method != Method::GET {
                return Err(ApiError::method_not_allowed(format!("{method} is not supported here")));
            }
            let custom = state.registry.custom_resources().await?;
            openapi_response(&target, uri, headers, &custom)
        }
        Target::Object {
            group: resource_metrics::GROUP,
            version: resource_metrics::VERSION,
            namespace,
            resource,
            name,
            sub,
        } => {
            let ctx = reader_context(user.clone(), headers);
            let label_selector = query(uri).remove("labelSelector").unwrap_or_default();
            let request = resource_metrics::MetricsRequest { resource, namespace, name, sub, label_selector };
            resource_metrics::serve(&state.registry, &ctx, method, request).await
        }
        Target::Object { group, version, namespace, resource, name, sub } => {
            if version == "v1" {
                if let Some(r) = review(state, user, method, headers, group, resource, &body).await? {
                    return Ok(r);
                }
            }
            let info = state.registry.resource(group, version, resource).await?.ok_or_else(not_found_path)?;
            if namespace.is_some() && !info.namespaced {
                return Err(not_found_path());
            }
            let request = Request {
                state,
                info,
                namespace: namespace.unwrap_or(""),
                name,
                sub,
                user,
                headers,
                query: query(uri),
                warnings: Default::default(),
                audit: audit.clone(),
            };
            request.serve(method, body).await
        }
    }
}

/// An OpenAPI document, as kube-apiserver serves it: a v3 document asked
/// for with its current `?hash=` may be cached for good, one with a stale
/// hash is redirected to the current one; every answer has an `ETag` and
/// `If-None-Match` is honoured. `/openapi/v2` is JSON only: kubectl asks
/// for protobuf alone and gets 406, on which it falls back (to its
/// compiled-in types for strategic-merge patches; validation and explain
/// use v3). The documents of custom resources' group-versions are built
/// on request from `custom`, and listed in the index beside the built-in
/// ones.
fn openapi_response(
    target: &Target<'_>,
    uri: &Uri,
    headers: &HeaderMap,
    custom: &[&'static ResourceInfo],
) -> Result<Response, ApiError> {
    let docs = openapi::documents();
    let mut immutable = false;
    let built;
    let served = match target {
        Target::OpenApiRoot if custom.is_empty() => &docs.index,
        Target::OpenApiRoot => {
            let mut index: Value = serde_json::from_slice(&docs.index.body).expect("the index is JSON");
            for (gv, infos) in openapi::custom_group_versions(custom) {
                let hash = openapi::custom_document(&infos).hash;
                index["paths"][&gv] = json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash={hash}")});
            }
            built = openapi::Served::new(&index);
            &built
        }
        Target::OpenApi(gv) => {
            let served = match docs.v3.get(gv.as_str()) {
                Some(s) => s,
                None => {
                    let infos =
                        openapi::custom_group_versions(custom).remove(gv.as_str()).ok_or_else(not_found_path)?;
                    built = openapi::custom_document(&infos);
                    &built
                }
            };
            match query(uri).get("hash") {
                Some(h) if *h != served.hash => {
                    let mut r = Response::new(Body::empty());
                    *r.status_mut() = StatusCode::MOVED_PERMANENTLY;
                    let url = format!("/openapi/v3/{gv}?hash={}", served.hash);
                    r.headers_mut().insert(header::LOCATION, HeaderValue::from_str(&url).expect("URLs are ASCII"));
                    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
                    return Ok(r);
                }
                Some(_) => immutable = true,
                None => {}
            }
            served
        }
        _ => {
            if !accepts_json(headers) {
                return Err(ApiError::new(
                    Reason::NotAcceptable,
                    "only application/json is served at /openapi/v2, not the protobuf encoding",
                ));
            }
            &docs.v2
        }
    };
    let etag = served.etag();
    let matched = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let mut r = if matched {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::NOT_MODIFIED;
        r
    } else {
        json_response(StatusCode::OK, served.body.clone())
    };
    let h = r.headers_mut();
    h.insert(header::ETAG, HeaderValue::from_str(&etag).expect("hex hashes are ASCII"));
    let cache = if immutable { "public, immutable" } else { "no-cache, private" };
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    Ok(r)
}

/// Whether an `Accept` header admits JSON (no header admits anything).
fn accepts_json(headers: &HeaderMap) -> bool {
    let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    accept.split(',').any(|range| {
        let media = range.split(';').next().unwrap_or_default().trim();
        matches!(media, "application/json" | "application/*" | "*/*" | "")
    })
}

/// The review APIs, answered by the same layers every request passes:
/// `selfsubjectaccessreviews` (kubectl auth can-i), `selfsubjectrulesreviews`
/// (kubectl auth can-i --list), `subjectaccessreviews` (the same question
/// about someone else) and `selfsubjectreviews` (kubectl auth whoami).
async fn review(
    state: &RestState,
    user: &UserInfo,
    method: &Method,
    headers: &HeaderMap,
    group: &str,
    resource: &str,
    body: &Bytes,
) -> Result<Option<Response>, ApiError> {
    let kind = match (group, resource) {
        ("authorization.k8s.io", "selfsubjectaccessreviews") => "SelfSubjectAccessReview",
        ("authorization.k8s.io", "selfsubjectrulesreviews") => "SelfSubjectRulesReview",
        ("authorization.k8s.io", "subjectaccessreviews") => "SubjectAccessReview",
        ("authentication.k8s.io", "selfsubjectreviews") => "SelfSubjectReview",
        _ => return Ok(None),
    };
    if method != Method::POST {
        return Err(ApiError::method_not_allowed(format!("only POST is supported on {resource}")));
    }
    let security = state.registry.security();
    let asked = Action::Resource { verb: "create", group, resource, subresource: "", namespace: "", name: "" };
    security
        .authorize_action(user, &asked)
        .map_err(|why| ApiError::forbidden(format!("{resource}.{group} is forbidden: {why}")))?;
    let review = decode_body(headers, body)?;
    let mut answer = review.clone();
    answer["apiVersion"] = json!(format!("{group}/v1"));
    answer["kind"] = json!(kind);
    let spec = &review["spec"];
    answer["status"] = match kind {
        "SelfSubjectReview" => json!({"userInfo": {"username": user.name, "groups": user.groups}}),
        "SelfSubjectRulesReview" => rules_review(security, user, spec["namespace"].as_str().unwrap_or_default()),
        "SubjectAccessReview" => {
            let subject = UserInfo {
                name: spec["user"].as_str().unwrap_or_default().to_string(),
                groups: spec["groups"]
                    .as_array()
                    .map(|g| g.iter().filter_map(Value::as_str).map(String::from).collect())
                    .unwrap_or_default(),
            };
            if subject.name.is_empty() && subject.groups.is_empty() {
                return Err(ApiError::new(
                    Reason::Invalid,
                    format!("{kind}.authorization.k8s.io \"\" is invalid: spec.user: Invalid value: \"\": at least one of user or group must be specified"),
                ));
            }
            access_review(security, &subject, spec)?
        }
        _ => access_review(security, user, spec)?,
    };
    Ok(Some(value_response(StatusCode::CREATED, &answer)))
}

/// Whether the spec's resource or non-resource attributes are allowed to
/// `user`. As Kubernetes' RBAC, a denial gives no reason.
fn access_review(security: &Security, user: &UserInfo, spec: &Value) -> Result<Value, ApiError> {
    let resource = &spec["resourceAttributes"];
    let path = &spec["nonResourceAttributes"];
    let text = |v: &Value, k: &str| v[k].as_str().unwrap_or_default().to_string();
    let allowed = if resource.is_object() {
        let (verb, group, plural, subresource, namespace, name) = (
            text(resource, "verb"),
            text(resource, "group"),
            text(resource, "resource"),
            text(resource, "subresource"),
            text(resource, "namespace"),
            text(resource, "name"),
        );
        let action = Action::Resource {
            verb: &verb,
            group: &group,
            resource: &plural,
            subresource: &subresource,
            namespace: &namespace,
            name: &name,
        };
        security.authorize_action(user, &action).is_ok()
    } else if path.is_object() {
        let (verb, path) = (text(path, "verb"), text(path, "path"));
        security.authorize_action(user, &Action::Path { verb: &verb, path: &path }).is_ok()
    } else {
        return Err(ApiError::new(
            Reason::Invalid,
            "spec.resourceAttributes: Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified",
        ));
    };
    Ok(json!({"allowed": allowed}))
}

/// What `user` may do in `namespace`, rule by rule.
fn rules_review(security: &Security, user: &UserInfo, namespace: &str) -> Value {
    let rules = security.rules_for(user, namespace).unwrap_or_else(|| {
        // Everything is allowed: say so as one rule of each kind.
        let all = vec!["*".to_string()];
        vec![
            Rule { verbs: all.clone(), api_groups: all.clone(), resources: all.clone(), ..Default::default() },
            Rule { verbs: all.clone(), non_resource_urls: all, ..Default::default() },
        ]
    });
    let (paths, resources): (Vec<&Rule>, Vec<&Rule>) = rules.iter().partition(|r| !r.non_resource_urls.is_empty());
    let resource_rules: Vec<Value> = resources
        .iter()
        .map(|r| {
            let mut rule = json!({"verbs": r.verbs, "apiGroups": r.api_groups, "resources": r.resources});
            if !r.resource_names.is_empty() {
                rule["resourceNames"] = json!(r.resource_names);
            }
            rule
        })
        .collect();
    let non_resource_rules: Vec<Value> =
        paths.iter().map(|r| json!({"verbs": r.verbs, "nonResourceURLs": r.non_resource_urls})).collect();
    json!({"resourceRules": resource_rules, "nonResourceRules": non_resource_rules, "incomplete": false})
}

/// The body as JSON, whatever it was sent as.
fn decode_body(headers: &HeaderMap, body: &Bytes) -> Result<Value, ApiError> {
    if body.len() > MAX_BODY {
        return Err(ApiError::too_large(format!("Request entity too large: limit is {MAX_BODY}")));
    }
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("application/json");
    let base = content_type.split(';').next().unwrap_or_default().trim();
    match base {
        "application/vnd.kubernetes.protobuf" => crate::rest::protobuf(body),
        "application/yaml" | "application/apply-patch+yaml" => serde_yaml::from_slice::<Value>(body)
            .map_err(|e| ApiError::bad_request(format!("the body is not valid YAML: {e}"))),
        _ => {
            serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))
        }
    }
}

/// Protobuf request bodies (kubectl 1.32's typed commands), as JSON.
fn protobuf(body: &[u8]) -> Result<Value, ApiError> {
    use skiff_api::protobuf::{decode, ProtobufError};
    decode(body).map_err(|e| match e {
        ProtobufError::UnsupportedKind { .. } | ProtobufError::UnsupportedEncoding { .. } => {
            ApiError::new(Reason::UnsupportedMediaType, e.to_string())
        }
        other => ApiError::bad_request(format!("the protobuf body could not be decoded: {other}")),
    })
}

/// A custom resource as the version `info` serves it. Versions of a CRD
/// convert as `None` conversion does: only `apiVersion` changes. Other
/// kinds (a `Scale`) are left as they are.
fn convert(info: &ResourceInfo, mut obj: Value) -> Value {
    if info.kind_id == Kind::Custom && obj.is_object() && obj["kind"] == info.kind {
        obj["apiVersion"] = Value::String(info.api_version());
    }
    obj
}

/// One request on a collection, object or subresource.
struct Request<'a> {
    state: &'a RestState,
    info: &'static ResourceInfo,
    namespace: &'a str,
    name: Option<&'a str>,
    sub: Option<&'a str>,
    user: &'a UserInfo,
    headers: &'a HeaderMap,
    query: HashMap<String, String>,
    /// `Warning` headers for the response (`fieldValidation=Warn`).
    warnings: crate::registry::Warnings,
    /// The audit layer's annotations for this request's event, if it is
    /// audited.
    audit: crate::registry::AuditAnnotations,
}

impl Request<'_> {
    fn param(&self, k: &str) -> &str {
        self.query.get(k).map(String::as_str).unwrap_or("")
    }

    fn flag(&self, k: &str) -> bool {
        matches!(self.param(k), "true" | "1")
    }

    fn dry_run(&self) -> Result<bool, ApiError> {
        match self.param("dryRun") {
            "" => Ok(false),
            "All" => Ok(true),
            other => {
                Err(ApiError::bad_request(format!("unsupported dryRun value {other:?}: supported values: \"All\"")))
            }
        }
    }

    fn wants_table(&self) -> bool {
        self.headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.split(',').next().is_some_and(|first| first.contains("as=Table")))
    }

    fn context(&self) -> Result<Context, ApiError> {
        let user = self.user.clone();
        let field_manager = match self.param("fieldManager") {
            "" => {
                let agent = self.headers.get(header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or_default();
                crate::registry::manager_from_user_agent(agent)
            }
            m if m.chars().count() > 128 => {
                return Err(ApiError::new(
                    Reason::Invalid,
                    format!("fieldManager: Invalid value: {m:?}: must be no more than 128 characters"),
                ))
            }
            m => m.to_string(),
        };
        Ok(Context { user, field_manager, warnings: self.warnings.clone(), audit: self.audit.clone() })
    }

    fn table(&self, objects: &[Value], resource_version: Option<String>, continue_token: Option<String>) -> Value {
        let include = IncludeObject::from_param(self.query.get("includeObject").map(String::as_str));
        let mut t = table::table(self.info, objects, include, chrono::Utc::now());
        let mut metadata = json!({});
        if let Some(rv) = resource_version {
            metadata["resourceVersion"] = json!(rv);
        }
        if let Some(c) = continue_token.filter(|c| !c.is_empty()) {
            metadata["continue"] = json!(c);
        }
        t["metadata"] = metadata;
        t
    }

    fn object_response(&self, status: StatusCode, obj: &Value) -> Response {
        let converted;
        let obj = if self.info.kind_id == Kind::Custom
            && obj["kind"] == self.info.kind
            && obj["apiVersion"] != self.info.api_version().as_str()
        {
            converted = convert(self.info, obj.clone());
            &converted
        } else {
            obj
        };
        if self.wants_table() && obj.get("kind").and_then(Value::as_str) == Some(self.info.kind) {
            let rv = meta::resource_version(obj).map(str::to_string);
            value_response(status, &self.table(std::slice::from_ref(obj), rv, None))
        } else {
            value_response(status, obj)
        }
    }

    async fn serve(self, method: &Method, body: Bytes) -> Result<Response, ApiError> {
        let verb = match (method, self.name, self.flag("watch")) {
            (&Method::GET, None, true) | (&Method::GET, Some(_), true) => "watch",
            (&Method::GET, None, false) => "list",
            (&Method::GET, Some(_), false) => "get",
            (&Method::POST, _, _) => "create",
            (&Method::PUT, _, _) => "update",
            (&Method::PATCH, _, _) => "patch",
            (&Method::DELETE, _, _) => "delete",
            _ => {
                return Err(ApiError::method_not_allowed(format!("{method} is not supported on {}", self.info.plural)))
            }
        };
        let timer = RequestTimer::start(verb, self.info.plural);
        let result = self.dispatch(verb, body).await;
        timer.finish(match &result {
            Ok(r) => r.status().as_u16(),
            Err(e) => e.code(),
        });
        result
    }

    async fn dispatch(&self, verb: &'static str, body: Bytes) -> Result<Response, ApiError> {
        let ctx = self.context()?;
        let registry = &self.state.registry;
        let info = self.info;
        let ns = self.namespace;
        match (verb, self.name, self.sub) {
            ("list", None, None) => self.list(&ctx).await,
            ("watch", _, None) => self.watch(&ctx).await,
            ("get", Some(name), None) => {
                let obj = registry.get(&ctx, info, ns, name, self.param("resourceVersion")).await?;
                Ok(self.object_response(StatusCode::OK, &obj))
            }
            ("get", Some(name), Some("status" | "ephemeralcontainers")) => {
                let obj = registry.get(&ctx, info, ns, name, self.param("resourceVersion")).await?;
                Ok(value_response(StatusCode::OK, &convert(info, obj)))
            }
            ("get", Some(name), Some("scale")) => {
                Ok(value_response(StatusCode::OK, &registry.get_scale(&ctx, info, ns, name).await?))
            }
            ("create", None, None) => {
                let obj = self.checked_body(&body)?;
                let created = registry.create(&ctx, info, ns, obj, self.dry_run()?).await?;
                Ok(self.warned(self.object_response(StatusCode::CREATED, &created)))
            }
            ("create", Some(name), Some("token")) if info.has_subresource("token") => {
                let request = decode_body(self.headers, &body)?;
                Ok(value_response(StatusCode::CREATED, &registry.request_token(&ctx, ns, name, &request).await?))
            }
            ("create", Some(name), Some("eviction")) if info.has_subresource("eviction") => {
                let eviction = decode_body(self.headers, &body)?;
                Ok(value_response(
                    StatusCode::CREATED,
                    &registry.evict(&ctx, ns, name, &eviction, self.dry_run()?).await?,
                ))
            }
            ("create", Some(name), Some("binding")) if info.has_subresource("binding") => {
                let binding = decode_body(self.headers, &body)?;
                Ok(value_response(StatusCode::CREATED, &registry.bind(&ctx, ns, name, &binding).await?))
            }
            ("update", Some(name), sub) => {
                let sub = sub.unwrap_or("");
                let obj = if sub == "scale" { decode_body(self.headers, &body)? } else { self.checked_body(&body)? };
                let updated = registry.update(&ctx, info, ns, name, obj, sub, self.dry_run()?).await?;
                Ok(self.warned(self.object_response(StatusCode::OK, &updated)))
            }
            ("patch", Some(name), sub) => {
                let content_type = self.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
                let patch_type = PatchType::parse(content_type.split(';').next().unwrap_or_default().trim())?;
                if body.len() > MAX_BODY {
                    return Err(ApiError::too_large(format!("Request entity too large: limit is {MAX_BODY}")));
                }
                let mode = self.param("fieldValidation");
                let sink = (mode == "Warn").then(Default::default);
                let opts = PatchOptions {
                    dry_run: self.dry_run()?,
                    strict_fields: mode == "Strict",
                    warnings: sink.clone(),
                    force: self.flag("force"),
                };
                let sub = sub.unwrap_or("");
                let (patched, created) = if patch_type == PatchType::Apply {
                    if self.param("fieldManager").is_empty() {
                        return Err(ApiError::new(
                            Reason::Invalid,
                            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                        ));
                    }
                    registry.apply(&ctx, info, ns, name, &body, sub, opts).await?
                } else {
                    (registry.patch(&ctx, info, ns, name, patch_type, &body, sub, opts).await?, false)
                };
                if let Some(sink) = sink {
                    let found = std::mem::take(&mut *sink.lock().expect("warnings lock"));
                    self.warnings.lock().expect("warnings lock").extend(found);
                }
                let status = if created { StatusCode::CREATED } else { StatusCode::OK };
                Ok(self.warned(self.object_response(status, &patched)))
            }
            ("delete", Some(name), None) => {
                let opts = self.delete_options(&body)?;
                match registry.delete(&ctx, info, ns, name, &opts).await? {
                    Deleted::Now(obj) | Deleted::Marked(obj) => Ok(self.object_response(StatusCode::OK, &obj)),
                }
            }
            _ => Err(ApiError::method_not_allowed(format!(
                "{verb} is not supported on {}{}",
                info.plural,
                self.sub.map(|s| format!("/{s}")).unwrap_or_default()
            ))),
        }
    }

    /// The request body, with `fieldValidation=Strict` refusing unknown
    /// fields (400) and `Warn` reporting them in `Warning` headers.
    fn checked_body(&self, body: &Bytes) -> Result<Value, ApiError> {
        let obj = decode_body(self.headers, body)?;
        let mode = self.param("fieldValidation");
        if !matches!(mode, "Strict" | "Warn") || !obj.is_object() {
            return Ok(obj);
        }
        let Ok(normalized) = validation::normalize(self.info, &obj) else {
            // The registry reports the shape error itself.
            return Ok(obj);
        };
        let mut unknown = Vec::new();
        unknown_fields(&obj, &normalized, "", &mut unknown);
        if unknown.is_empty() {
            return Ok(obj);
        }
        let list: Vec<String> = unknown.iter().map(|f| format!("unknown field \"{f}\"")).collect();
        if mode == "Strict" {
            return Err(ApiError::bad_request(format!("strict decoding error: {}", list.join(", "))));
        }
        self.warnings.lock().expect("warnings lock").extend(list);
        Ok(obj)
    }

    fn warned(&self, mut r: Response) -> Response {
        for w in self.warnings.lock().expect("warnings lock").drain(..) {
            if let Ok(v) = HeaderValue::from_str(&format!("299 - \"{}\"", w.replace('"', "\\\""))) {
                r.headers_mut().append(header::WARNING, v);
            }
        }
        r
    }

    fn delete_options(&self, body: &Bytes) -> Result<DeleteOptions, ApiError> {
        let b: Value = if body.is_empty() { json!({}) } else { decode_body(self.headers, body)? };
        let mut opts = DeleteOptions::from_body(&b);
        let g = self.param("gracePeriodSeconds");
        if !g.is_empty() {
            let parsed =
                g.parse::<i64>().map_err(|_| ApiError::bad_request(format!("invalid gracePeriodSeconds {g:?}")))?;
            opts.grace_period_seconds = Some(parsed);
        }
        opts.dry_run |= self.dry_run()?;
        // The body's propagationPolicy, then the query's, then orphanDependents.
        if b["propagationPolicy"].as_str().is_none_or(str::is_empty) {
            let param = self.param("propagationPolicy");
            if !param.is_empty() {
                opts.propagation_policy = Some(param.to_string());
            }
        }
        Ok(opts)
    }

    async fn list(&self, ctx: &Context) -> Result<Response, ApiError> {
        let limit = match self.param("limit") {
            "" => 0,
            l => l.parse::<i64>().map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
        };
        let opts = ListOptions {
            label_selector: self.param("labelSelector").to_string(),
            field_selector: self.param("fieldSelector").to_string(),
            limit,
            continue_token: self.param("continue").to_string(),
            resource_version: self.param("resourceVersion").to_string(),
            resource_version_match: self.param("resourceVersionMatch").to_string(),
        };
        let mut page = self.state.registry.list(ctx, self.info, self.namespace, &opts).await?;
        if self.info.kind_id == Kind::Custom {
            // Stored at the version they were written through.
            for item in page.items.iter_mut() {
                if let Ok(obj) = serde_json::from_slice::<Value>(item) {
                    *item = serde_json::to_vec(&convert(self.info, obj)).expect("JSON values serialize");
                }
            }
        }
        if self.wants_table() {
            let objects: Vec<Value> = page.items.iter().filter_map(|b| serde_json::from_slice(b).ok()).collect();
            let t = self.table(&objects, Some(page.resource_version.to_string()), page.continue_token);
            return Ok(value_response(StatusCode::OK, &t));
        }
        // Splice the stored bytes: no decode of the items.
        let mut metadata = json!({"resourceVersion": page.resource_version.to_string()});
        if let Some(c) = &page.continue_token {
            metadata["continue"] = json!(c);
        }
        if let Some(r) = page.remaining_item_count {
            metadata["remainingItemCount"] = json!(r);
        }
        let head = json!({"kind": self.info.list_kind(), "apiVersion": self.info.api_version(), "metadata": metadata});
        let head = serde_json::to_vec(&head).expect("JSON values serialize");
        let size: usize = page.items.iter().map(|i| i.len() + 1).sum();
        let mut out = Vec::with_capacity(head.len() + size + 16);
        out.extend_from_slice(&head[..head.len() - 1]);
        out.extend_from_slice(b",\"items\":[");
        for (i, item) in page.items.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(item);
        }
        out.extend_from_slice(b"]}");
        Ok(json_response(StatusCode::OK, out))
    }

    async fn watch(&self, ctx: &Context) -> Result<Response, ApiError> {
        let registry = &self.state.registry;
        let timeout = match self.param("timeoutSeconds") {
            "" => None,
            t => Some(Duration::from_secs(
                t.parse::<u64>().map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds {t:?}")))?,
            )),
        };
        let opts = WatchOptions {
            resource_version: self.param("resourceVersion").to_string(),
            allow_bookmarks: self.flag("allowWatchBookmarks"),
            send_initial_events: self.flag("sendInitialEvents"),
            timeout,
        };
        let (label_selector, field_selector) = (self.param("labelSelector"), self.param("fieldSelector"));
        let name = self.name.unwrap_or("");
        let events =
            match registry.watch(ctx, self.info, self.namespace, name, label_selector, field_selector, opts).await {
                Ok(rx) => rx,
                // Kubernetes answers a too-old revision with an ERROR event, not a failed request.
                Err(e) if crate::watch::is_expired(&e) => {
                    let line = serde_json::to_vec(&json!({"type": "ERROR", "object": e.to_status()})).expect("status");
                    let mut body = line;
                    body.push(b'\n');
                    return Ok(json_response(StatusCode::OK, body));
                }
                Err(e) => return Err(e),
            };
        let table = self.wants_table();
        let info = self.info;
        let include = IncludeObject::from_param(self.query.get("includeObject").map(String::as_str));
        let stream = tokio_stream::wrappers::ReceiverStream::new(events).map(move |event| {
            let object: Value = serde_json::from_slice(&event.object).unwrap_or(Value::Null);
            let object =
                if info.kind_id == Kind::Custom && object.is_object() { convert(info, object) } else { object };
            let object = if table && matches!(event.kind, EventType::Added | EventType::Modified | EventType::Deleted) {
                let rv = meta::resource_version(&object).map(str::to_string);
                let mut t = table::table(info, std::slice::from_ref(&object), include, chrono::Utc::now());
                t["metadata"] = json!({"resourceVersion": rv});
                t
            } else {
                object
            };
            let mut line = serde_json::to_vec(&json!({"type": event.kind.as_str(), "object": object})).expect("event");
            line.push(b'\n');
            Ok::<_, std::convert::Infallible>(Bytes::from(line))
        });
        let mut r = Response::new(Body::from_stream(stream));
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_collections_objects_and_subresources() {
        assert_eq!(
            parse_path("/api/v1/namespaces/default/pods"),
            Some(Target::Object {
                group: "",
                version: "v1",
                namespace: Some("default"),
                resource: "pods",
                name: None,
                sub: None
            })
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/kube-system"),
            Some(Target::Object {
                group: "",
                version: "v1",
                namespace: None,
                resource: "namespaces",
                name: Some("kube-system"),
                sub: None
            })
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/x/status"),
            Some(Target::Object {
                group: "",
                version: "v1",
                namespace: None,
                resource: "namespaces",
                name: Some("x"),
                sub: Some("status")
            })
        );
        assert_eq!(
            parse_path("/apis/apps/v1/namespaces/d/deployments/web/scale"),
            Some(Target::Object {
                group: "apps",
                version: "v1",
                namespace: Some("d"),
                resource: "deployments",
                name: Some("web"),
                sub: Some("scale")
            })
        );
        assert_eq!(parse_path("/apis/apps/v1"), Some(Target::Resources { group: "apps", version: "v1" }));
        assert_eq!(
            parse_path("/api/v1/pods"),
            Some(Target::Object { group: "", version: "v1", namespace: None, resource: "pods", name: None, sub: None })
        );
        assert_eq!(parse_path("/nothing/here"), None);
    }

    #[test]
    fn strict_validation_finds_fields_the_type_does_not_have() {
        let info = resources::of(skiff_api::Kind::ConfigMap);
        let obj = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "colour": "red"}, "data": {"k": "v"}, "extra": 1});
        let normalized = validation::normalize(info, &obj).unwrap();
        let mut unknown = Vec::new();
        unknown_fields(&obj, &normalized, "", &mut unknown);
        unknown.sort();
        assert_eq!(unknown, vec!["extra".to_string(), "metadata.colour".to_string()]);
    }

    proptest::proptest! {
        /// Whatever the body and its declared type, decoding answers with a
        /// value or an error, and strict validation never panics on it.
        #[test]
        fn no_body_makes_decoding_panic(body in proptest::collection::vec(proptest::num::u8::ANY, 0..512), kind in 0usize..4) {
            let content_type = ["application/json", "application/yaml", "application/vnd.kubernetes.protobuf", "text/plain"][kind];
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            if let Ok(v) = decode_body(&headers, &Bytes::from(body)) {
                for info in resources::catalog() {
                    if let Ok(n) = validation::normalize(info, &v) {
                        unknown_fields(&v, &n, "", &mut Vec::new());
                    }
                }
            }
        }

        #[test]
        fn no_json_object_makes_strict_validation_panic(text in "\\{\"(apiVersion|kind|metadata|spec|data)\":[\\[\\]{}0-9a-z\",:]{0,64}\\}") {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            if let Ok(v) = decode_body(&headers, &Bytes::from(text)) {
                for info in resources::catalog() {
                    if let Ok(n) = validation::normalize(info, &v) {
                        unknown_fields(&v, &n, "", &mut Vec::new());
                    }
                }
            }
        }
    }

    #[test]
    fn query_components_are_percent_decoded() {
        let uri: Uri = "/api/v1/pods?fieldSelector=metadata.name%3Dweb&labelSelector=a+in+(b)&x=%zz".parse().unwrap();
        let q = query(&uri);
        assert_eq!(q["fieldSelector"], "metadata.name=web");
        assert_eq!(q["labelSelector"], "a in (b)");
        assert_eq!(q["x"], "%zz");
    }
}
