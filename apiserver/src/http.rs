//! The HTTP listener: `/healthz`, `/livez`, `/readyz` and `/metrics`,
//! and the authentication step every request on it passes first (with
//! the authorization of paths outside the resource API).
//!
//! `/readyz` answers 200 only while the member knows a leader, and once
//! it has seen the default objects in (the namespaces, priority classes
//! and RBAC defaults every cluster has, as kube-apiserver's post-start
//! hooks gate its readiness); `/metrics` is Prometheus text: the store's
//! counters and histograms plus gauges read at scrape time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus::{Encoder, IntGauge, Opts, Registry, TextEncoder};
use skiff_raft_store::Store;

use crate::admission::{ClientCertificate, Credentials, Security, UserInfo};
use crate::request_info::RequestInfo;

/// What anyone may read, authenticated or not, as kube-apiserver's
/// `system:public-info-viewer` role allows: probes must work without
/// credentials.
const PUBLIC_PATHS: [&str; 4] = ["/healthz", "/livez", "/readyz", "/version"];

/// `Authorization: Bearer <token>`.
pub fn bearer_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| t.trim().to_string())
}

/// Finds who sent the request (a verified client certificate, a bearer
/// token) and puts them into its extensions for the handlers; a request
/// no authenticator accepts gets kube's 401 `Status`, except on the
/// public paths, where it goes on as `system:anonymous`.
pub async fn authenticate(State(security): State<Security>, mut request: Request, next: Next) -> Response {
    let credentials = Credentials {
        bearer_token: bearer_token(request.headers()),
        client_certificate: request.extensions().get::<ClientCertificate>().map(|c| c.0.clone()),
    };
    let path = request.uri().path();
    let public = PUBLIC_PATHS.contains(&path);
    let user = match security.authenticate_request(&credentials).await {
        Ok(user) => user,
        Err(_) if public => UserInfo::anonymous(),
        Err(e) => return crate::rest::error_response(&e),
    };
    // Resource requests are authorized where their verb is known (the
    // registry); everything else here, by path.
    let info = RequestInfo::parse(request.method().as_str(), path, request.uri().query());
    if !public && !info.is_resource {
        if let Err(e) = security.authorize_path(&user, &info.verb, path) {
            return crate::rest::error_response(&e);
        }
    }
    request.extensions_mut().insert(info);
    request.extensions_mut().insert(user);
    next.run(request).await
}

/// The probes' and metrics' view of the member.
#[derive(Clone)]
struct Health {
    store: Store,
    /// Set once this member has seen the default objects in.
    defaults: Arc<AtomicBool>,
}

/// The probes and metrics; `defaults` is set once the default objects
/// are in.
pub fn router(store: Store, defaults: Arc<AtomicBool>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(Health { store, defaults })
}

async fn readyz(State(health): State<Health>) -> impl IntoResponse {
    if health.store.status().leader.is_none() {
        return (StatusCode::SERVICE_UNAVAILABLE, "no leader\n");
    }
    if !health.defaults.load(Ordering::Acquire) {
        return (StatusCode::SERVICE_UNAVAILABLE, "the default namespaces and roles are not created yet\n");
    }
    (StatusCode::OK, "ok")
}

fn gauge(registry: &Registry, name: &str, help: &str, value: i64) {
    let g = IntGauge::with_opts(Opts::new(name, help)).expect("metric names are valid");
    g.set(value);
    registry.register(Box::new(g)).expect("each metric is registered once");
}

async fn metrics(State(Health { store, .. }): State<Health>) -> impl IntoResponse {
    let s = store.status();
    let registry = Registry::new();
    gauge(&registry, "skiff_raft_term", "Current Raft term.", s.term as i64);
    gauge(&registry, "skiff_raft_is_leader", "1 if this member is the leader.", (s.leader == Some(s.id)) as i64);
    gauge(&registry, "skiff_raft_has_leader", "1 if this member knows a leader.", s.leader.is_some() as i64);
    gauge(&registry, "skiff_raft_last_log_index", "Index of the last entry in the log.", s.last_log_index as i64);
    gauge(&registry, "skiff_raft_applied_index", "Index of the last applied entry.", s.applied_index as i64);
    gauge(&registry, "skiff_raft_snapshot_index", "Log index the newest snapshot covers.", s.snapshot_index as i64);
    gauge(&registry, "skiff_raft_purged_index", "Last log index purged after a snapshot.", s.purged_index as i64);
    gauge(&registry, "skiff_mvcc_revision", "Current store revision.", s.revision);
    gauge(&registry, "skiff_mvcc_compacted_revision", "Compacted revision.", s.compacted);
    gauge(&registry, "skiff_mvcc_db_size_bytes", "Approximate state-machine database size.", s.db_size as i64);
    gauge(&registry, "skiff_watchers", "Watchers following this member's live feed.", store.watchers() as i64);
    gauge(&registry, "skiff_leases", "Leases in the store.", store.leases().map_or(0, |l| l.len() as i64));
    let mut families = registry.gather();
    families.extend(skiff_raft_store::metrics::metrics().registry.gather());
    let mut out = Vec::new();
    if let Err(e) = TextEncoder::new().encode(&families, &mut out) {
        tracing::error!(error = %e, "encoding metrics");
        out.extend_from_slice(format!("# error encoding metrics: {e}\n").as_bytes());
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out)
}
