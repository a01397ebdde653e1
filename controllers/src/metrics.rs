//! The controller manager's metrics and its HTTP listener: `/metrics`
//! (Prometheus text) and `/healthz`.
//!
//! Per controller: work queue depth, reconciles by result, retries and
//! reconcile duration; for the process: whether it leads.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use prometheus::{exponential_buckets, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts};
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

/// Serves the controller metrics at `/metrics`, and `/healthz`, on `addr`
/// until `shutdown`.
pub async fn serve(addr: SocketAddr, shutdown: Shutdown) -> std::io::Result<SocketAddr> {
    skiff_metrics::serve(addr, metrics().registry.clone(), shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconciles_and_queue_depth_are_exported_per_controller() {
        metrics().reconciled("replicaset", "success", Duration::from_millis(3));
        metrics().queue_depth.with_label_values(&["replicaset"]).set(7);
        let body = skiff_metrics::text(&metrics().registry);
        assert!(
            body.contains("skiff_controller_reconciles_total{controller=\"replicaset\",result=\"success\"} 1"),
            "{body}"
        );
        assert!(body.contains("skiff_controller_queue_depth{controller=\"replicaset\"} 7"), "{body}");
    }
}
