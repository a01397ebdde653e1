//! The resource API client. Objects are `serde_json::Value`s of the
//! Kubernetes types; errors carry the server's Kubernetes `Status`.
//!
//! Endpoints are tried in turn: a request that could not reach a server
//! (connection refused, server shutting down, no leader) moves on to the
//! next one, so a client keeps working while masters die, as long as one
//! that can serve is left.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use serde_json::Value;
pub use skiff_api::watch::EventType;
use skiff_api::{ApiError, Reason, ResourceInfo};
use skiff_proto::resource::resources_client::ResourcesClient;
use skiff_proto::resource::{
    CreateRequest, DeleteRequest, GetAtRevisionRequest, GetRequest, HistoryRequest, HistoryResponse, ListRequest,
    PatchRequest, Preconditions, ResourceRef, UpdateRequest, WatchRequest,
};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::runtime::config::{BearerToken, TokenBucket};

#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// The server refused or failed the request.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// No server could be reached.
    #[error("cannot reach any apiserver: {0}")]
    Unreachable(String),
    /// A response the client could not read.
    #[error("bad response: {0}")]
    Decode(String),
    /// A typed [`Api`](crate::runtime::api::Api) of a type no apiserver serves.
    #[error("no resource serves {api_version} {kind}")]
    UnknownKind { api_version: String, kind: String },
    /// An object the client could not encode.
    #[error("cannot encode the object: {0}")]
    Encode(String),
}

impl ClientError {
    /// The Kubernetes reason of a refusal by the server; `None` for
    /// transport and decoding failures.
    pub fn reason(&self) -> Option<Reason> {
        match self {
            ClientError::Api(e) => Some(e.reason),
            _ => None,
        }
    }

    /// Whether the server refused the request for `reason`.
    pub fn is(&self, reason: Reason) -> bool {
        self.reason() == Some(reason)
    }
}

/// The API error a gRPC status carries (its details hold the `Status`).
pub fn api_error(status: &Status) -> ApiError {
    if let Some(e) = serde_json::from_slice::<Value>(status.details()).ok().and_then(|v| ApiError::from_status(&v)) {
        return e;
    }
    let reason = Reason::from_grpc_code(status.code() as i32);
    ApiError::new(reason, status.message().to_string())
}

/// Whether the request never reached a server able to serve it, so it can
/// go to another one.
fn try_elsewhere(status: &Status) -> bool {
    status.code() == Code::Unavailable
}

/// One watch event, decoded.
#[derive(Clone, Debug)]
pub struct WatchEvent {
    pub kind: EventType,
    pub object: Value,
}

impl WatchEvent {
    /// The event's object's resourceVersion.
    pub fn resource_version(&self) -> Option<&str> {
        skiff_api::meta::resource_version(&self.object)
    }
}

/// One watch event with its object as the server sent it, JSON: for a
/// caller that decodes it into its own type, without a [`Value`] between.
#[derive(Clone, Debug)]
pub struct RawWatchEvent {
    pub kind: EventType,
    pub json: Vec<u8>,
}

impl RawWatchEvent {
    /// The object as a [`Value`].
    pub fn decode(&self) -> Result<Value, ClientError> {
        from_json(&self.json)
    }
}

#[derive(Clone, Debug, Default)]
pub struct ListParams {
    pub label_selector: String,
    pub field_selector: String,
    pub limit: i64,
    pub continue_token: String,
    pub resource_version: String,
}

#[derive(Clone, Debug)]
pub struct ObjectList {
    pub items: Vec<Value>,
    pub resource_version: String,
    pub continue_token: String,
    pub remaining_item_count: Option<i64>,
}

#[derive(Clone, Debug, Default)]
pub struct WatchParams {
    pub label_selector: String,
    pub field_selector: String,
    pub resource_version: String,
    pub allow_bookmarks: bool,
    pub send_initial_events: bool,
    pub timeout_seconds: i64,
    pub name: String,
}

/// How to delete: preconditions, propagation and grace period.
#[derive(Clone, Debug, Default)]
pub struct DeleteParams {
    /// Precondition: delete only the object with this uid ("" for any).
    pub uid: String,
    /// Precondition: delete only at this resourceVersion ("" for any).
    pub resource_version: String,
    /// `Background`, `Foreground` or `Orphan`; "" for the kind's default.
    pub propagation_policy: String,
    /// Seconds of graceful termination (pods); `None` for the default.
    pub grace_period_seconds: Option<i64>,
}

impl DeleteParams {
    /// Dependents are deleted by the garbage collector afterwards.
    pub fn background() -> DeleteParams {
        DeleteParams { propagation_policy: "Background".into(), ..Default::default() }
    }

    /// The object goes once its dependents with `blockOwnerDeletion` are gone.
    pub fn foreground() -> DeleteParams {
        DeleteParams { propagation_policy: "Foreground".into(), ..Default::default() }
    }

    /// Dependents are left, without this owner.
    pub fn orphan() -> DeleteParams {
        DeleteParams { propagation_policy: "Orphan".into(), ..Default::default() }
    }

    /// Adds the uid precondition, so a newer object of the same name is
    /// never deleted instead.
    pub fn with_uid(self, uid: impl Into<String>) -> DeleteParams {
        DeleteParams { uid: uid.into(), ..self }
    }
}

/// The resource an object's `apiVersion` and `kind` name, for code that
/// writes objects of many kinds as JSON (the controllers' action executor).
pub fn resource_of(obj: &Value) -> Result<&'static ResourceInfo, ClientError> {
    let field = |name: &str| obj.get(name).and_then(Value::as_str).unwrap_or_default().to_string();
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    skiff_api::resources::by_kind(&api_version, &kind).ok_or(ClientError::UnknownKind { api_version, kind })
}

/// Calls the unary RPC `$method` with `$req` through [`Client::call`].
macro_rules! rpc {
    ($self:ident, $method:ident, $req:ident) => {
        $self
            .call(|mut c| {
                let r = $req.clone();
                async move { c.$method(r).await }
            })
            .await
    };
}

/// A client of any of the given apiservers (their client gRPC addresses).
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    channels: Vec<(String, Channel)>,
    /// The endpoint that answered last; requests start there.
    current: AtomicUsize,
    /// Paces writes (create, update, patch, delete, bind) so a runaway
    /// controller cannot flood the apiservers; `None`: unlimited.
    write_limiter: Option<TokenBucket>,
    authorization: Authorization,
}

/// Adds the bearer token, if the client has one, to every request.
#[derive(Clone, Default)]
struct Authorization(Option<Arc<BearerToken>>);

impl tonic::service::Interceptor for Authorization {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(token) = &self.0 {
            let header = token.header().map_err(Status::unauthenticated)?;
            request.metadata_mut().insert("authorization", header);
        }
        Ok(request)
    }
}

type Transport = tonic::service::interceptor::InterceptedService<Channel, Authorization>;

fn resource_ref(info: &ResourceInfo, namespace: &str) -> Option<ResourceRef> {
    Some(ResourceRef {
        group: info.group.to_string(),
        resource: info.plural.to_string(),
        namespace: if info.namespaced { namespace.to_string() } else { String::new() },
    })
}

fn list_request(resource: Option<ResourceRef>, p: &ListParams, as_table: bool) -> ListRequest {
    ListRequest {
        resource,
        label_selector: p.label_selector.clone(),
        field_selector: p.field_selector.clone(),
        limit: p.limit,
        r#continue: p.continue_token.clone(),
        resource_version: p.resource_version.clone(),
        resource_version_match: String::new(),
        as_table,
    }
}

fn named_ref(group: &str, plural: &str, namespace: &str) -> Option<ResourceRef> {
    Some(ResourceRef { group: group.to_string(), resource: plural.to_string(), namespace: namespace.to_string() })
}

fn to_json(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).expect("JSON values serialize")
}

fn from_json(bytes: &[u8]) -> Result<Value, ClientError> {
    serde_json::from_slice(bytes).map_err(|e| ClientError::Decode(e.to_string()))
}

/// The User-Agent every client sends: `<program>/<version>`, the program
/// being `skiff-<subcommand>` for the one binary's components
/// (`skiff-scheduler`, `skiff-controller-manager`, `skiff-node`), as
/// client-go names a program after its binary. The apiserver records a
/// client's writes in `metadata.managedFields` under that program name.
pub fn default_user_agent() -> String {
    let args: Vec<String> = std::env::args().take(2).collect();
    user_agent_of(&args)
}

fn user_agent_of(args: &[String]) -> String {
    let program = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "skiff-client".to_string());
    let name = match args.get(1) {
        Some(sub) if !sub.starts_with('-') && sub.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') => {
            format!("{program}-{sub}")
        }
        _ => program,
    };
    // Header-safe: what is not a token character becomes '-'.
    let name: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '-' }).collect();
    format!("{name}/{}", env!("CARGO_PKG_VERSION"))
}

impl Client {
    /// `endpoints`: `HOST:PORT` or URLs. Connections are made lazily.
    pub fn new<S: AsRef<str>>(endpoints: &[S]) -> Result<Client, ClientError> {
        Client::with_write_limiter(endpoints, None)
    }

    /// [`Client::new`] whose writes wait for a token of `limiter` first.
    pub fn with_write_limiter<S: AsRef<str>>(
        endpoints: &[S],
        write_limiter: Option<TokenBucket>,
    ) -> Result<Client, ClientError> {
        Client::connect(endpoints, write_limiter, None)
    }

    /// [`Client::with_write_limiter`] over TLS when `tls` is given (then
    /// every endpoint is dialed with it, whatever its scheme).
    pub fn connect<S: AsRef<str>>(
        endpoints: &[S],
        write_limiter: Option<TokenBucket>,
        tls: Option<skiff_pki::Connector>,
    ) -> Result<Client, ClientError> {
        Client::connect_as(endpoints, write_limiter, tls, None)
    }

    /// [`Client::connect`] sending `token` with every request.
    pub(crate) fn connect_as<S: AsRef<str>>(
        endpoints: &[S],
        write_limiter: Option<TokenBucket>,
        tls: Option<skiff_pki::Connector>,
        token: Option<Arc<BearerToken>>,
    ) -> Result<Client, ClientError> {
        let mut channels = Vec::new();
        for e in endpoints {
            let e = e.as_ref().trim();
            if e.is_empty() {
                continue;
            }
            let scheme = if tls.is_some() { "https" } else { "http" };
            let url = match e.split_once("://") {
                Some((_, rest)) => format!("{scheme}://{rest}"),
                None => format!("{scheme}://{e}"),
            };
            let endpoint = Endpoint::from_shared(url.clone())
                .map_err(|err| ClientError::Unreachable(format!("bad address {e:?}: {err}")))?
                .connect_timeout(Duration::from_secs(2))
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(5))
                .keep_alive_timeout(Duration::from_secs(5))
                .user_agent(default_user_agent())
                .map_err(|err| ClientError::Unreachable(format!("user agent: {err}")))?;
            let channel = match &tls {
                Some(tls) => endpoint.connect_with_connector_lazy(tls.clone()),
                None => endpoint.connect_lazy(),
            };
            channels.push((e.to_string(), channel));
        }
        if channels.is_empty() {
            return Err(ClientError::Unreachable("no endpoint given".into()));
        }
        Ok(Client {
            inner: Arc::new(Inner {
                channels,
                current: AtomicUsize::new(0),
                write_limiter,
                authorization: Authorization(token),
            }),
        })
    }

    /// Waits for the write limiter, if any.
    async fn throttle_write(&self) {
        if let Some(limiter) = &self.inner.write_limiter {
            limiter.acquire().await;
        }
    }

    /// Runs `call` against the current endpoint, moving on to the next one
    /// while servers cannot serve it, for at most two rounds.
    async fn call<T, F, Fut>(&self, call: F) -> Result<T, ClientError>
    where
        F: Fn(ResourcesClient<Transport>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let n = self.inner.channels.len();
        let start = self.inner.current.load(Ordering::Relaxed);
        let mut last = None;
        for attempt in 0..2 * n {
            let i = (start + attempt) % n;
            let channel = self.inner.channels[i].1.clone();
            let client = ResourcesClient::with_interceptor(channel, self.inner.authorization.clone())
                .max_decoding_message_size(256 * 1024 * 1024);
            match call(client).await {
                Ok(r) => {
                    self.inner.current.store(i, Ordering::Relaxed);
                    return Ok(r.into_inner());
                }
                Err(s) if try_elsewhere(&s) => {
                    tracing::debug!(endpoint = %self.inner.channels[i].0, error = %s, "trying another apiserver");
                    last = Some(s);
                    if attempt + 1 == n {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                    }
                }
                Err(s) => return Err(ClientError::Api(api_error(&s))),
            }
        }
        let last = last.map(|s| s.message().to_string()).unwrap_or_default();
        Err(ClientError::Unreachable(last))
    }

    pub async fn get(&self, info: &ResourceInfo, namespace: &str, name: &str) -> Result<Value, ClientError> {
        self.get_with(info, namespace, name, "").await
    }

    /// `resource_version`: "" (latest), "0" (any), or at least N.
    pub async fn get_with(
        &self,
        info: &ResourceInfo,
        namespace: &str,
        name: &str,
        resource_version: &str,
    ) -> Result<Value, ClientError> {
        let req = GetRequest {
            resource: resource_ref(info, namespace),
            name: name.to_string(),
            resource_version: resource_version.to_string(),
            subresource: String::new(),
        };
        let obj = rpc!(self, get, req)?;
        from_json(&obj.json)
    }

    pub async fn get_scale(&self, info: &ResourceInfo, namespace: &str, name: &str) -> Result<Value, ClientError> {
        self.get_at(resource_ref(info, namespace), name, "scale").await
    }

    /// The object `name` among the resources `plural` of `group` in
    /// `namespace` ("" for a cluster-scoped resource): for kinds a client
    /// knows only from a reference to one of their objects, such as a
    /// custom resource that owns pods.
    pub async fn get_of(&self, group: &str, plural: &str, namespace: &str, name: &str) -> Result<Value, ClientError> {
        self.get_at(named_ref(group, plural, namespace), name, "").await
    }

    /// [`Client::get_of`]'s `scale` subresource (an `autoscaling/v1` Scale).
    pub async fn get_scale_of(
        &self,
        group: &str,
        plural: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Value, ClientError> {
        self.get_at(named_ref(group, plural, namespace), name, "scale").await
    }

    async fn get_at(&self, resource: Option<ResourceRef>, name: &str, subresource: &str) -> Result<Value, ClientError> {
        let req = GetRequest {
            resource,
            name: name.to_string(),
            resource_version: String::new(),
            subresource: subresource.to_string(),
        };
        let obj = rpc!(self, get, req)?;
        from_json(&obj.json)
    }

    /// `namespace` "": all namespaces.
    pub async fn list(
        &self,
        info: &ResourceInfo,
        namespace: &str,
        params: &ListParams,
    ) -> Result<ObjectList, ClientError> {
        self.list_at(resource_ref(info, namespace), params).await
    }

    /// Every page of a list, concatenated.
    pub async fn list_all(
        &self,
        info: &ResourceInfo,
        namespace: &str,
        params: &ListParams,
    ) -> Result<ObjectList, ClientError> {
        self.list_all_at(resource_ref(info, namespace), params).await
    }

    /// Every page of a list of the resources `plural` of `group` (see
    /// [`Client::get_of`]); `namespace` "": all namespaces.
    pub async fn list_all_of(
        &self,
        group: &str,
        plural: &str,
        namespace: &str,
        params: &ListParams,
    ) -> Result<ObjectList, ClientError> {
        self.list_all_at(named_ref(group, plural, namespace), params).await
    }

    async fn list_at(&self, resource: Option<ResourceRef>, params: &ListParams) -> Result<ObjectList, ClientError> {
        let req = list_request(resource, params, false);
        let r = rpc!(self, list, req)?;
        Ok(ObjectList {
            items: r.items.iter().map(|b| from_json(b)).collect::<Result<_, _>>()?,
            resource_version: r.resource_version,
            continue_token: r.r#continue,
            remaining_item_count: r.remaining_item_count,
        })
    }

    async fn list_all_at(&self, resource: Option<ResourceRef>, params: &ListParams) -> Result<ObjectList, ClientError> {
        let mut params = params.clone();
        let mut all = self.list_at(resource.clone(), &params).await?;
        while !all.continue_token.is_empty() {
            params.continue_token = std::mem::take(&mut all.continue_token);
            let page = self.list_at(resource.clone(), &params).await?;
            all.items.extend(page.items);
            all.continue_token = page.continue_token;
        }
        Ok(all)
    }

    /// The list as a `meta.k8s.io/v1` Table.
    pub async fn list_table(
        &self,
        info: &ResourceInfo,
        namespace: &str,
        params: &ListParams,
    ) -> Result<Value, ClientError> {
        let req = list_request(resource_ref(info, namespace), params, true);
        let r = rpc!(self, list, req)?;
        from_json(&r.table)
    }

    pub async fn create(&self, info: &ResourceInfo, namespace: &str, obj: &Value) -> Result<Value, ClientError> {
        from_json(&self.create_raw(info, namespace, obj).await?)
    }

    /// [`Client::create`], answering the created object's JSON undecoded
    /// (for a caller that decodes it into its own type, or ignores it).
    pub async fn create_raw(&self, info: &ResourceInfo, namespace: &str, obj: &Value) -> Result<Vec<u8>, ClientError> {
        self.throttle_write().await;
        let req = CreateRequest { resource: resource_ref(info, namespace), json: to_json(obj), ..Default::default() };
        Ok(rpc!(self, create, req)?.json)
    }

    /// Binds a pod to a node (`pods/binding`).
    pub async fn bind(&self, namespace: &str, pod: &str, node: &str) -> Result<(), ClientError> {
        let info = skiff_api::resources::of(skiff_api::Kind::Pod);
        let binding = serde_json::json!({"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": pod, "namespace": namespace}, "target": {"kind": "Node", "name": node}});
        self.create_subresource(info, namespace, pod, "binding", &binding).await.map(|_| ())
    }

    /// Asks for a token of service account `account` (a TokenRequest,
    /// `serviceaccounts/token`); the answer carries it in `status.token`.
    pub async fn request_token(&self, namespace: &str, account: &str, request: &Value) -> Result<Value, ClientError> {
        let info = skiff_api::resources::of(skiff_api::Kind::ServiceAccount);
        let answer = self.create_subresource(info, namespace, account, "token", request).await?;
        from_json(&answer)
    }

    async fn create_subresource(
        &self,
        info: &ResourceInfo,
        namespace: &str,
        name: &str,
        subresource: &str,
        obj: &Value,
    ) -> Result<Vec<u8>, ClientError> {
        self.throttle_write().await;
        let req = CreateRequest {
            resource: resource_ref(info, namespace),
            json: to_json(obj),
            subresource: subresource.into(),
            name: name.to_string(),
            ..Default::default()
        };
        rpc!(self, create, req).map(|obj| obj.json)
    }

    /// Replaces the object; a resourceVersion in it makes the update
    /// conditional (Conflict if stale).
    pub async fn update(&self, info: &ResourceInfo, obj: &Value) -> Result<Value, ClientError> {
        self.update_subresource(info, obj, "").await
    }

    pub async fn update_status(&self, info: &ResourceInfo, obj: &Value) -> Result<Value, ClientError> {
        self.update_subresource(info, obj, "status").await
    }

    pub async fn update_subresource(
        &self,
        info: &ResourceInfo,
        obj: &Value,
        subresource: &str,
    ) -> Result<Value, ClientError> {
        self.throttle_write().await;
        let namespace = skiff_api::meta::namespace(obj).unwrap_or_default();
        let req = UpdateRequest {
            resource: resource_ref(info, namespace),
            json: to_json(obj),
            subresource: subresource.to_string(),
            dry_run: false,
        };
        let obj = rpc!(self, update, req)?;
        from_json(&obj.json)
    }

    /// `patch_type`: "merge", "json" or "strategic".
    pub async fn patch(
        &self,
        info: &ResourceInfo,
        namespace: &str,
        name: &str,
        patch_type: &str,
        patch: &Value,
        subresource: &str,
    ) -> Result<Value, ClientError> {
        from_json(&self.patch_raw(info, namespace, name, patch_type, patch, subresource).await?)
    }

    /// [`Client::patch`], answering the patched object's JSON undecoded.
    pub async fn patch_raw(
        &self,
        info: &ResourceInfo,
        namespace: &str,
        name: &str,
        patch_type: &str,
        patch: &Value,
        subresource: &str,
    ) -> Result<Vec<u8>, ClientError> {
        self.patch_at(resource_ref(info, namespace), name, patch_type, patch, subresource).await
    }

    /// [`Client::patch`] of an object of the resources `plural` of `group`
    /// (see [`Client::get_of`]).
    pub async fn patch_of(
        &self,
        group: &str,
        plural: &str,
        namespace: &str,
        name: &str,
        patch_type: &str,
        patch: &Value,
    ) -> Result<Value, ClientError> {
        from_json(&self.patch_at(named_ref(group, plural, namespace), name, patch_type, patch, "").await?)
    }

    async fn patch_at(
        &self,
        resource: Option<ResourceRef>,
        name: &str,
        patch_type: &str,
        patch: &Value,
        subresource: &str,
    ) -> Result<Vec<u8>, ClientError> {
        self.throttle_write().await;
        let req = PatchRequest {
            resource,
            name: name.to_string(),
            patch_type: patch_type.to_string(),
            patch: to_json(patch),
            subresource: subresource.to_string(),
            dry_run: false,
        };
        Ok(rpc!(self, patch, req)?.json)
    }

    pub async fn delete(
        &self,
        info: &ResourceInfo,
        namespace: &str,
        name: &str,
        params: &DeleteParams,
    ) -> Result<Value, ClientError> {
        self.delete_at(resource_ref(info, namespace), name, params).await
    }

    /// [`Client::delete`] of an object of the resources `plural` of `group`
    /// (see [`Client::get_of`]).
    pub async fn delete_of(
        &self,
        group: &str,
        plural: &str,
        namespace: &str,
        name: &str,
        params: &DeleteParams,
    ) -> Result<Value, ClientError> {
        self.delete_at(named_ref(group, plural, namespace), name, params).await
    }

    async fn delete_at(
        &self,
        resource: Option<ResourceRef>,
        name: &str,
        params: &DeleteParams,
    ) -> Result<Value, ClientError> {
        self.throttle_write().await;
        let req = DeleteRequest {
            resource,
            name: name.to_string(),
            preconditions: Some(Preconditions {
                uid: params.uid.clone(),
                resource_version: params.resource_version.clone(),
            }),
            propagation_policy: params.propagation_policy.clone(),
            grace_period_seconds: params.grace_period_seconds,
            dry_run: false,
        };
        let obj = rpc!(self, delete, req)?;
        from_json(&obj.json)
    }

    /// A watch stream from one apiserver. It ends when the server ends it
    /// (after an ERROR event, or on shutdown); resume from the last
    /// resourceVersion seen.
    pub async fn watch(
        &self,
        info: &ResourceInfo,
        namespace: &str,
        params: &WatchParams,
    ) -> Result<impl Stream<Item = Result<WatchEvent, ClientError>> + Send + 'static, ClientError> {
        self.watch_at(resource_ref(info, namespace), params).await
    }

    /// [`Client::watch`] of the resources `plural` of `group` (see
    /// [`Client::get_of`]); `namespace` "": all namespaces.
    pub async fn watch_of(
        &self,
        group: &str,
        plural: &str,
        namespace: &str,
        params: &WatchParams,
    ) -> Result<impl Stream<Item = Result<WatchEvent, ClientError>> + Send + 'static, ClientError> {
        self.watch_at(named_ref(group, plural, namespace), params).await
    }

    async fn watch_at(
        &self,
        resource: Option<ResourceRef>,
        params: &WatchParams,
    ) -> Result<impl Stream<Item = Result<WatchEvent, ClientError>> + Send + 'static, ClientError> {
        let stream = self.watch_raw_at(resource, params).await?;
        Ok(stream.map(|item| item.and_then(|e| Ok(WatchEvent { object: e.decode()?, kind: e.kind }))))
    }

    /// [`Client::watch`] with each object left as its JSON.
    pub async fn watch_raw(
        &self,
        info: &ResourceInfo,
        namespace: &str,
        params: &WatchParams,
    ) -> Result<impl Stream<Item = Result<RawWatchEvent, ClientError>> + Send + 'static, ClientError> {
        self.watch_raw_at(resource_ref(info, namespace), params).await
    }

    async fn watch_raw_at(
        &self,
        resource: Option<ResourceRef>,
        params: &WatchParams,
    ) -> Result<impl Stream<Item = Result<RawWatchEvent, ClientError>> + Send + 'static, ClientError> {
        let req = WatchRequest {
            resource,
            label_selector: params.label_selector.clone(),
            field_selector: params.field_selector.clone(),
            resource_version: params.resource_version.clone(),
            allow_bookmarks: params.allow_bookmarks,
            send_initial_events: params.send_initial_events,
            timeout_seconds: params.timeout_seconds,
            name: params.name.clone(),
        };
        let stream = rpc!(self, watch, req)?;
        Ok(stream.map(|item| match item {
            Ok(e) => Ok(RawWatchEvent {
                kind: e
                    .r#type
                    .parse()
                    .map_err(|e: skiff_api::watch::UnknownEventType| ClientError::Decode(e.to_string()))?,
                json: e.object,
            }),
            Err(s) if try_elsewhere(&s) => Err(ClientError::Unreachable(s.message().to_string())),
            Err(s) => Err(ClientError::Api(api_error(&s))),
        }))
    }

    pub async fn history(
        &self,
        info: &ResourceInfo,
        namespace: &str,
        name: &str,
    ) -> Result<HistoryResponse, ClientError> {
        let req = HistoryRequest { resource: resource_ref(info, namespace), name: name.to_string() };
        rpc!(self, history, req)
    }

    pub async fn get_at_revision(
        &self,
        info: &ResourceInfo,
        namespace: &str,
        name: &str,
        revision: i64,
    ) -> Result<Value, ClientError> {
        let req = GetAtRevisionRequest { resource: resource_ref(info, namespace), name: name.to_string(), revision };
        let obj = rpc!(self, get_at_revision, req)?;
        from_json(&obj.json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_agent_names_the_component_as_its_field_manager() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(user_agent_of(&args(&["/usr/bin/skiff", "scheduler"])), format!("skiff-scheduler/{version}"));
        assert_eq!(user_agent_of(&args(&["skiff", "--help"])), format!("skiff/{version}"));
        assert_eq!(user_agent_of(&args(&["my operator"])), format!("my-operator/{version}"));
        assert_eq!(user_agent_of(&[]), format!("skiff-client/{version}"));
    }

    #[test]
    fn resource_of_reads_api_version_and_kind() {
        let rs = serde_json::json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "x"}});
        assert_eq!(resource_of(&rs).unwrap().plural, "replicasets");
        let widget = serde_json::json!({"apiVersion": "example.com/v1", "kind": "Widget"});
        assert!(matches!(resource_of(&widget), Err(ClientError::UnknownKind { .. })));
    }

    #[test]
    fn delete_params_carry_propagation_and_the_uid_precondition() {
        let params = DeleteParams::foreground().with_uid("u-1");
        assert_eq!(params.propagation_policy, "Foreground");
        assert_eq!(params.uid, "u-1");
        assert_eq!(DeleteParams::orphan().propagation_policy, "Orphan");
        assert_eq!(DeleteParams::background().propagation_policy, "Background");
    }
}
