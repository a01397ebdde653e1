//! The controller manager's metrics and its HTTP listener: `/metrics`
//! (Prometheus text) and `/healthz`.
//!
//! Per controller: work queue depth, reconciles by result, retries and
//! reconcile duration; for the process: whether it leads.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus::{
    exponential_buckets, Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
};
use skiff_shutdown::Shutdown;

pub struct Metrics {
    pub registry: prometheus::Registry,
    /// Keys waiting in a controller's queue.
    pub queue_depth: IntGaugeVec,
    /// Reconciles by controller and result (`success`, `error`, `conflict`).
    pub reconciles: IntCounterVec,
    /// Keys put back after a failed reconcile.
    pub retries: IntCounterVec,
    pub duration: HistogramVec,
    /// 1 while this instance holds the lease (Kubernetes' `leader_election_master_status`).
    pub leader: IntGauge,
}

/// The process's controller metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let registry = prometheus::Registry::new();
        let queue_depth = IntGaugeVec::new(
            Opts::new("skiff_controller_queue_depth", "Keys waiting in the controller's work queue."),
            &["controller"],
        )
        .expect("valid metric");
        let reconciles = IntCounterVec::new(
            Opts::new("skiff_controller_reconciles_total", "Reconciles by controller and result."),
            &["controller", "result"],
        )
        .expect("valid metric");
        let retries = IntCounterVec::new(
            Opts::new("skiff_controller_retries_total", "Keys requeued with back-off after a failed reconcile."),
            &["controller"],
        )
        .expect("valid metric");
        let duration = HistogramVec::new(
            HistogramOpts::new("skiff_controller_reconcile_duration_seconds", "Time one reconcile took.")
                .buckets(exponential_buckets(0.0001, 2.0, 18).expect("valid buckets")),
            &["controller"],
        )
        .expect("valid metric");
        let leader = IntGauge::new("leader_election_master_status", "1 while this instance holds the leader lease.")
            .expect("valid metric");
        for m in [
            Box::new(queue_depth.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(reconciles.clone()),
            Box::new(retries.clone()),
            Box::new(duration.clone()),
            Box::new(leader.clone()),
        ] {
            registry.register(m).expect("registered once");
        }
        Metrics { registry, queue_depth, reconciles, retries, duration, leader }
    })
}

impl Metrics {
    /// Records one reconcile of `controller`.
    pub fn reconciled(&self, controller: &str, result: &str, took: Duration) {
        self.reconciles.with_label_values(&[controller, result]).inc();
        self.duration.with_label_values(&[controller]).observe(took.as_secs_f64());
    }
}

/// What `/healthz` reports: the process is up and its tasks are running.
#[derive(Clone)]
struct Health {
    shutdown: Shutdown,
}

/// Serves `/metrics` and `/healthz` on `addr` until `shutdown`.
pub async fn serve(addr: SocketAddr, shutdown: Shutdown) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let health = Arc::new(Health { shutdown: shutdown.clone() });
    let app = axum::Router::new().route("/metrics", get(render)).route("/healthz", get(healthz)).with_state(health);
    let stopped = shutdown.cancelled_owned();
    shutdown.spawn(async move {
        if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stopped).await {
            tracing::error!(error = %e, "metrics listener failed");
        }
    });
    Ok(bound)
}

async fn render() -> impl IntoResponse {
    let mut out = Vec::new();
    let families = metrics().registry.gather();
    if let Err(e) = prometheus::TextEncoder::new().encode(&families, &mut out) {
        out.extend_from_slice(format!("# error encoding metrics: {e}\n").as_bytes());
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out)
}

async fn healthz(State(health): State<Arc<Health>>) -> impl IntoResponse {
    if health.shutdown.token().is_cancelled() {
        (StatusCode::SERVICE_UNAVAILABLE, "stopping\n")
    } else {
        (StatusCode::OK, "ok\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn metrics_and_healthz_answer_until_shutdown() {
        let shutdown = Shutdown::new();
        let addr = serve("127.0.0.1:0".parse().unwrap(), shutdown.clone()).await.unwrap();
        metrics().reconciled("replicaset", "success", Duration::from_millis(3));
        metrics().queue_depth.with_label_values(&["replicaset"]).set(7);
        let body = get_body(addr, "/metrics").await;
        assert!(
            body.contains("skiff_controller_reconciles_total{controller=\"replicaset\",result=\"success\"} 1"),
            "{body}"
        );
        assert!(body.contains("skiff_controller_queue_depth{controller=\"replicaset\"} 7"), "{body}");
        assert!(get_body(addr, "/healthz").await.ends_with("ok\n"));
        shutdown.stop().await;
        assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "the listener is closed");
    }

    async fn get_body(addr: SocketAddr, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }
}
