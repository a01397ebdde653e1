//! The gRPC resource API (`skiff.resource.Resources`): the registry's
//! operations with objects as JSON bytes. Errors are gRPC statuses whose
//! details carry the Kubernetes `Status` JSON, so clients recover the
//! reason, code and causes exactly. Calls are audited as REST requests
//! are (`--audit-log-path`).

use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use serde_json::Value;
use skiff_api::resources::{self, ResourceInfo};
use skiff_api::{table, ApiError, Reason};
use skiff_proto::resource::resources_server::{Resources, ResourcesServer};
use skiff_proto::resource::{
    CreateRequest, DeleteRequest, GetAtRevisionRequest, GetRequest, HistoryRequest, HistoryResponse, ListRequest,
    ListResponse, Object, PatchRequest, ResourceRef, UpdateRequest, WatchEvent, WatchRequest,
};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status};

use crate::admission::{ClientCertificate, Credentials};
use crate::audit::Call;
use crate::metrics::RequestTimer;
use crate::registry::{Context, DeleteOptions, ListOptions, PatchOptions, PatchType, Registry};
use crate::request_info::RequestInfo;
use crate::watch::WatchOptions;

pub struct ResourceService {
    registry: Registry,
    /// The audit log (`--audit-log-path`), which calls here are written to
    /// as requests on the REST API are.
    audit: Option<crate::audit::AuditLog>,
}

impl ResourceService {
    pub fn server(registry: Registry, audit: Option<crate::audit::AuditLog>) -> ResourcesServer<ResourceService> {
        ResourcesServer::new(ResourceService { registry, audit }).max_decoding_message_size(8 * 1024 * 1024)
    }
}

/// What a call names, for its audit event: the resource, the object's
/// name and subresource, and the object it sends (JSON), if any.
trait Audited {
    fn resource(&self) -> Option<&ResourceRef>;
    fn name(&self) -> String {
        String::new()
    }
    fn subresource(&self) -> &str {
        ""
    }
    fn body(&self) -> Option<&[u8]> {
        None
    }
}

macro_rules! audited {
    ($($request:ty { $($method:ident),* }),* $(,)?) => {$(
        impl Audited for $request {
            fn resource(&self) -> Option<&ResourceRef> {
                self.resource.as_ref()
            }
            $(audited!(@ $method);)*
        }
    )*};
    (@ name) => {
        fn name(&self) -> String {
            self.name.clone()
        }
    };
    (@ subresource) => {
        fn subresource(&self) -> &str {
            &self.subresource
        }
    };
    (@ json) => {
        fn body(&self) -> Option<&[u8]> {
            Some(&self.json)
        }
    };
    (@ patch) => {
        fn body(&self) -> Option<&[u8]> {
            Some(&self.patch)
        }
    };
}

audited! {
    GetRequest { name, subresource },
    ListRequest {},
    CreateRequest { name, subresource, json },
    PatchRequest { name, subresource, patch },
    DeleteRequest { name },
    WatchRequest { name },
    HistoryRequest { name },
    GetAtRevisionRequest { name },
}

impl Audited for UpdateRequest {
    fn resource(&self) -> Option<&ResourceRef> {
        self.resource.as_ref()
    }
    /// An update names its object in the object.
    fn name(&self) -> String {
        #[derive(serde::Deserialize)]
        struct Named {
            metadata: Option<Meta>,
        }
        #[derive(serde::Deserialize)]
        struct Meta {
            name: Option<String>,
        }
        serde_json::from_slice::<Named>(&self.json).ok().and_then(|n| n.metadata?.name).unwrap_or_default()
    }
    fn subresource(&self) -> &str {
        &self.subresource
    }
    fn body(&self) -> Option<&[u8]> {
        Some(&self.json)
    }
}

/// The gRPC status of an API error: the code a gRPC client expects (see
/// [`Reason::grpc_code`]) and the Kubernetes `Status` JSON in the details.
pub fn to_status(e: &ApiError) -> Status {
    let code = tonic::Code::from(e.reason.grpc_code());
    let details = serde_json::to_vec(&e.to_status()).expect("status serializes");
    Status::with_details(code, e.message.clone(), details.into())
}

pub(crate) fn credentials<T>(request: &Request<T>) -> Credentials {
    let bearer_token = request
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    let client_certificate = request.extensions().get::<ClientCertificate>().map(|c| c.0.clone());
    Credentials { bearer_token, client_certificate }
}

/// The resource a request names: a built-in one, or one a
/// CustomResourceDefinition adds (by group and plural; a `ResourceRef`
/// names no version, so the definition's storage version serves it).
async fn resource(registry: &Registry, r: &Option<ResourceRef>) -> Result<(&'static ResourceInfo, String), ApiError> {
    let r = r.as_ref().ok_or_else(|| ApiError::bad_request("resource is required"))?;
    let group = if r.group.is_empty() { None } else { Some(r.group.as_str()) };
    let builtin = resources::by_plural(group, &r.resource).or_else(|| {
        if group.is_none() {
            resources::lookup(&r.resource)
        } else {
            None
        }
    });
    let info = match builtin {
        Some(info) => Some(info),
        None if group.is_some() => registry
            .custom_resources()
            .await?
            .into_iter()
            .filter(|c| c.group == r.group && c.plural == r.resource)
            .find(|c| c.custom.is_some_and(|x| x.storage_version == c.version)),
        None => None,
    };
    let info = info.ok_or_else(|| {
        ApiError::new(Reason::NotFound, format!("the server doesn't have a resource type \"{}\"", r.resource))
    })?;
    Ok((info, r.namespace.clone()))
}

/// The version a built-in resource is served at (custom resources'
/// definitions are not looked up for an audit event: "").
fn builtin_version(r: &ResourceRef) -> &'static str {
    let group = Some(r.group.as_str()).filter(|g| !g.is_empty());
    resources::by_plural(group, &r.resource).map_or("", |info| info.version)
}

fn parse_json(bytes: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("the object is not valid JSON: {e}")))
}

fn object(v: &Value) -> Object {
    Object { json: serde_json::to_vec(v).expect("JSON values serialize") }
}

impl ResourceService {
    /// The audit event of `request` by `ctx`'s user, begun if the policy
    /// logs it.
    fn audit<T: Audited>(&self, ctx: &Context, verb: &str, method: &str, request: &Request<T>) -> Option<Call> {
        let log = self.audit.as_ref()?;
        let r = request.get_ref();
        let resource = r.resource();
        let info = RequestInfo {
            is_resource: true,
            verb: verb.to_string(),
            api_group: resource.map(|r| r.group.clone()).unwrap_or_default(),
            api_version: resource.map_or("", builtin_version).to_string(),
            namespace: resource.map(|r| r.namespace.clone()).unwrap_or_default(),
            resource: resource.map(|r| r.resource.clone()).unwrap_or_default(),
            name: r.name(),
            subresource: r.subresource().to_string(),
            path: format!("/skiff.resource.Resources/{method}"),
        };
        let agent = request.metadata().get("user-agent").and_then(|v| v.to_str().ok());
        let body = || r.body().and_then(|b| serde_json::from_slice(b).ok());
        log.begin(&ctx.user, info, request.remote_addr(), agent, body, &ctx.audit)
    }

    async fn context<T>(&self, request: &Request<T>) -> Result<Context, ApiError> {
        let user = self.registry.security().authenticate_client_port(&credentials(request)).await?;
        let agent = request.metadata().get("user-agent").and_then(|v| v.to_str().ok()).unwrap_or_default();
        Ok(Context {
            user,
            field_manager: crate::registry::manager_from_user_agent(agent),
            warnings: Default::default(),
            audit: Default::default(),
        })
    }

    /// Runs one request, recording its metrics and its audit event and
    /// mapping its error.
    async fn call<T: Audited, F, Fut>(
        &self,
        verb: &'static str,
        method: &'static str,
        request: Request<T>,
        f: F,
    ) -> Result<Response<Object>, Status>
    where
        F: FnOnce(Context, T) -> Fut,
        Fut: std::future::Future<
            Output = Result<(&'static ResourceInfo, Value), (Option<&'static ResourceInfo>, ApiError)>,
        >,
    {
        let ctx = self.context(&request).await.map_err(|e| to_status(&e))?;
        let audit = self.audit(&ctx, verb, method, &request);
        let started = std::time::Instant::now();
        let result = f(ctx, request.into_inner()).await;
        let (resource, code) = match &result {
            Ok((info, _)) => (info.plural, if verb == "create" { 201 } else { 200 }),
            Err((info, e)) => (info.map_or("unknown", |i| i.plural), e.code()),
        };
        let timer = RequestTimer::start_at(verb, resource, started);
        timer.finish(code);
        if let Some(audit) = audit {
            audit.finish(code, result.as_ref().ok().map(|(_, v)| v)).await;
        }
        match result {
            Ok((_, v)) => Ok(Response::new(object(&v))),
            Err((_, e)) => Err(to_status(&e)),
        }
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Resources for ResourceService {
    async fn get(&self, request: Request<GetRequest>) -> Result<Response<Object>, Status> {
        let registry = self.registry.clone();
        self.call("get", "Get", request, |ctx, r| async move {
            let (info, ns) = resource(&registry, &r.resource).await.map_err(|e| (None, e))?;
            let got = match r.subresource.as_str() {
                "" => registry.get(&ctx, info, &ns, &r.name, &r.resource_version).await,
                "scale" => registry.get_scale(&ctx, info, &ns, &r.name).await,
                other => Err(ApiError::not_found(info, &format!("{}/{other}", r.name))),
            };
            got.map(|v| (info, v)).map_err(|e| (Some(info), e))
        })
        .await
    }

    async fn list(&self, request: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        let ctx = self.context(&request).await.map_err(|e| to_status(&e))?;
        let audit = self.audit(&ctx, "list", "List", &request);
        let r = request.into_inner();
        let started = std::time::Instant::now();
        let result = async {
            let (info, ns) = resource(&self.registry, &r.resource).await?;
            let opts = ListOptions {
                label_selector: r.label_selector.clone(),
                field_selector: r.field_selector.clone(),
                limit: r.limit,
                continue_token: r.r#continue.clone(),
                resource_version: r.resource_version.clone(),
                resource_version_match: r.resource_version_match.clone(),
            };
            let page = self.registry.list(&ctx, info, &ns, &opts).await?;
            let table = if r.as_table {
                let objects: Vec<Value> = page.items.iter().filter_map(|b| serde_json::from_slice(b).ok()).collect();
                let mut t = table::table(info, &objects, table::IncludeObject::Metadata, chrono::Utc::now());
                t["metadata"] = serde_json::json!({"resourceVersion": page.resource_version.to_string()});
                serde_json::to_vec(&t).expect("table serializes")
            } else {
                Vec::new()
            };
            Ok::<_, ApiError>((info, page, table))
        }
        .await;
        let timer_resource = match &result {
            Ok((info, ..)) => info.plural,
            Err(_) => "unknown",
        };
        let code = result.as_ref().map_or_else(|e| e.code(), |_| 200);
        RequestTimer::start_at("list", timer_resource, started).finish(code);
        if let Some(audit) = audit {
            // A list's items are not logged, even at RequestResponse.
            audit.finish(code, None).await;
        }
        let (_, page, table) = result.map_err(|e| to_status(&e))?;
        Ok(Response::new(ListResponse {
            items: page.items,
            resource_version: page.resource_version.to_string(),
            r#continue: page.continue_token.unwrap_or_default(),
            remaining_item_count: page.remaining_item_count,
            table,
        }))
    }

    async fn create(&self, request: Request<CreateRequest>) -> Result<Response<Object>, Status> {
        let registry = self.registry.clone();
        self.call("create", "Create", request, |ctx, r| async move {
            let (info, ns) = resource(&registry, &r.resource).await.map_err(|e| (None, e))?;
            let obj = parse_json(&r.json).map_err(|e| (Some(info), e))?;
            let created = match r.subresource.as_str() {
                "" => registry.create(&ctx, info, &ns, obj, r.dry_run).await,
                "binding" if info.has_subresource("binding") => registry.bind(&ctx, &ns, &r.name, &obj).await,
                "eviction" if info.has_subresource("eviction") => {
                    registry.evict(&ctx, &ns, &r.name, &obj, r.dry_run).await
                }
                "token" if info.has_subresource("token") => registry.request_token(&ctx, &ns, &r.name, &obj).await,
                other => {
                    Err(ApiError::method_not_allowed(format!("create is not supported on {}/{other}", info.plural)))
                }
            };
            created.map(|v| (info, v)).map_err(|e| (Some(info), e))
        })
        .await
    }

    async fn update(&self, request: Request<UpdateRequest>) -> Result<Response<Object>, Status> {
        let registry = self.registry.clone();
        self.call("update", "Update", request, |ctx, r| async move {
            let (info, ns) = resource(&registry, &r.resource).await.map_err(|e| (None, e))?;
            let obj = parse_json(&r.json).map_err(|e| (Some(info), e))?;
            let name = skiff_api::meta::name(&obj)
                .map(str::to_string)
                .ok_or_else(|| (Some(info), ApiError::bad_request("metadata.name is required for an update")))?;
            let ns = if ns.is_empty() { skiff_api::meta::namespace(&obj).unwrap_or_default().to_string() } else { ns };
            registry
                .update(&ctx, info, &ns, &name, obj, &r.subresource, r.dry_run)
                .await
                .map(|v| (info, v))
                .map_err(|e| (Some(info), e))
        })
        .await
    }

    async fn patch(&self, request: Request<PatchRequest>) -> Result<Response<Object>, Status> {
        let registry = self.registry.clone();
        self.call("patch", "Patch", request, |ctx, r| async move {
            let (info, ns) = resource(&registry, &r.resource).await.map_err(|e| (None, e))?;
            let patch_type = PatchType::parse(&r.patch_type).map_err(|e| (Some(info), e))?;
            registry
                .patch(
                    &ctx,
                    info,
                    &ns,
                    &r.name,
                    patch_type,
                    &r.patch,
                    &r.subresource,
                    PatchOptions { dry_run: r.dry_run, ..Default::default() },
                )
                .await
                .map(|v| (info, v))
                .map_err(|e| (Some(info), e))
        })
        .await
    }

    async fn delete(&self, request: Request<DeleteRequest>) -> Result<Response<Object>, Status> {
        let registry = self.registry.clone();
        self.call("delete", "Delete", request, |ctx, r| async move {
            let (info, ns) = resource(&registry, &r.resource).await.map_err(|e| (None, e))?;
            let pre = r.preconditions.unwrap_or_default();
            let opts = DeleteOptions {
                uid: Some(pre.uid).filter(|s| !s.is_empty()),
                resource_version: Some(pre.resource_version).filter(|s| !s.is_empty()),
                propagation_policy: Some(r.propagation_policy).filter(|s| !s.is_empty()),
                grace_period_seconds: r.grace_period_seconds,
                dry_run: r.dry_run,
            };
            registry
                .delete(&ctx, info, &ns, &r.name, &opts)
                .await
                .map(|d| (info, d.object().clone()))
                .map_err(|e| (Some(info), e))
        })
        .await
    }

    type WatchStream = WatchStream;

    async fn watch(&self, request: Request<WatchRequest>) -> Result<Response<WatchStream>, Status> {
        let ctx = self.context(&request).await.map_err(|e| to_status(&e))?;
        let audit = self.audit(&ctx, "watch", "Watch", &request);
        let r = request.into_inner();
        let rx = async {
            let (info, ns) = resource(&self.registry, &r.resource).await?;
            let opts = WatchOptions {
                resource_version: r.resource_version.clone(),
                allow_bookmarks: r.allow_bookmarks,
                send_initial_events: r.send_initial_events,
                timeout: (r.timeout_seconds > 0).then(|| Duration::from_secs(r.timeout_seconds as u64)),
            };
            self.registry.watch(&ctx, info, &ns, &r.name, &r.label_selector, &r.field_selector, opts).await
        }
        .await;
        if let Some(audit) = audit {
            audit.finish(rx.as_ref().map_or_else(|e| e.code(), |_| 200), None).await;
        }
        let rx = rx.map_err(|e| to_status(&e))?;
        let stream = ReceiverStream::new(rx)
            .map(|e| Ok(WatchEvent { r#type: e.kind.as_str().to_string(), object: e.object.as_ref().clone() }));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn history(&self, request: Request<HistoryRequest>) -> Result<Response<HistoryResponse>, Status> {
        let ctx = self.context(&request).await.map_err(|e| to_status(&e))?;
        let audit = self.audit(&ctx, "get", "History", &request);
        let r = request.into_inner();
        let result = async {
            let (info, ns) = resource(&self.registry, &r.resource).await?;
            self.registry.history(&ctx, info, &ns, &r.name).await
        }
        .await;
        if let Some(audit) = audit {
            audit.finish(result.as_ref().map_or_else(|e| e.code(), |_| 200), None).await;
        }
        let result = result.map_err(|e| to_status(&e))?;
        let (entries, compacted) = result;
        Ok(Response::new(HistoryResponse {
            entries: entries
                .into_iter()
                .map(|e| skiff_proto::resource::HistoryEntry {
                    revision: e.revision,
                    r#type: e.event.to_string(),
                    commit_time_ms: e.commit_time_ms,
                    object: serde_json::to_vec(&e.object).expect("JSON values serialize"),
                    summary: e.summary,
                })
                .collect(),
            compacted_revision: compacted,
            revision: self.registry.store().revision(),
        }))
    }

    async fn get_at_revision(&self, request: Request<GetAtRevisionRequest>) -> Result<Response<Object>, Status> {
        let registry = self.registry.clone();
        self.call("get", "GetAtRevision", request, |ctx, r| async move {
            let (info, ns) = resource(&registry, &r.resource).await.map_err(|e| (None, e))?;
            registry
                .get_at_revision(&ctx, info, &ns, &r.name, r.revision)
                .await
                .map(|v| (info, v))
                .map_err(|e| (Some(info), e))
        })
        .await
    }
}
