//! The HTTP listener: `/healthz`, `/livez`, `/readyz` and `/metrics`.
//!
//! `/readyz` answers 200 only while the member knows a leader; `/metrics` is Prometheus text: the
//! store's counters and histograms plus gauges read at scrape time.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus::{Encoder, IntGauge, Opts, Registry, TextEncoder};
use skiff_raft_store::Store;

pub fn router(store: Store) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(store)
}

async fn readyz(State(store): State<Store>) -> impl IntoResponse {
    let status = store.status();
    match status.leader {
        Some(_) => (StatusCode::OK, "ok".to_string()),
        None => (StatusCode::SERVICE_UNAVAILABLE, "no leader\n".to_string()),
    }
}

fn gauge(registry: &Registry, name: &str, help: &str, value: i64) {
    let g = IntGauge::with_opts(Opts::new(name, help)).expect("metric names are valid");
    g.set(value);
    registry.register(Box::new(g)).expect("each metric is registered once");
}

async fn metrics(State(store): State<Store>) -> impl IntoResponse {
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
