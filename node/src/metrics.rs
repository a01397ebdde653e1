//! The agent's metrics, under the kubelet's names where it has one.

use std::sync::OnceLock;

use prometheus::{
    exponential_buckets, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry,
};

/// Every metric the agent exports, registered once.
pub struct Metrics {
    /// What `/metrics` serves.
    pub registry: Registry,
    /// Pods with a worker (kubelet's `kubelet_running_pods`).
    pub running_pods: IntGauge,
    /// Pod status writes by outcome (ok, gone, error).
    pub status_writes: IntCounterVec,
    /// Cluster DNS queries by result (answered, nodata, nxdomain,
    /// forwarded, servfail, formerr, notimp, dropped): see `dns::server`.
    pub dns_queries: IntCounterVec,
    /// CRI calls by operation (`kubelet_runtime_operations_total`).
    pub runtime_operations: IntCounterVec,
    /// CRI calls' latency by operation
    /// (`kubelet_runtime_operations_duration_seconds`).
    pub runtime_operation_seconds: HistogramVec,
    /// CRI calls that failed, by operation; a `NotFound` answer is not
    /// counted (`kubelet_runtime_operations_errors_total`).
    pub runtime_operation_errors: IntCounterVec,
    /// From the agent taking a pod on to its first status with the phase
    /// Running (`kubelet_pod_start_duration_seconds`).
    pub pod_start_seconds: Histogram,
}

/// Buckets from 1 ms to about 33 s, each 1.5 times the last: fine enough
/// that a benchmark reads a pod start's p99 from them within 25%.
fn latency_buckets() -> Vec<f64> {
    exponential_buckets(0.001, 1.5, 27).expect("valid buckets")
}

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let registry = Registry::new();
        let running_pods = IntGauge::new("kubelet_running_pods", "Number of pods that have a running pod sandbox")
            .expect("valid metric");
        let status_writes = IntCounterVec::new(
            Opts::new("skiff_node_pod_status_writes_total", "Pod status writes to the apiserver, by result"),
            &["result"],
        )
        .expect("valid metric");
        for m in
            [Box::new(running_pods.clone()) as Box<dyn prometheus::core::Collector>, Box::new(status_writes.clone())]
        {
            registry.register(m).expect("metric registered once");
        }
        let dns_queries = IntCounterVec::new(
            Opts::new("skiff_node_dns_queries_total", "Queries to the node's cluster DNS server, by result"),
            &["result"],
        )
        .expect("valid metric");
        registry.register(Box::new(dns_queries.clone())).expect("metric registered once");
        let runtime_operations = IntCounterVec::new(
            Opts::new("kubelet_runtime_operations_total", "Cumulative number of runtime operations by operation type."),
            &["operation_type"],
        )
        .expect("valid metric");
        let runtime_operation_seconds = HistogramVec::new(
            HistogramOpts::new(
                "kubelet_runtime_operations_duration_seconds",
                "Duration in seconds of runtime operations, by operation type.",
            )
            .buckets(latency_buckets()),
            &["operation_type"],
        )
        .expect("valid metric");
        let runtime_operation_errors = IntCounterVec::new(
            Opts::new(
                "kubelet_runtime_operations_errors_total",
                "Cumulative number of runtime operation errors by operation type.",
            ),
            &["operation_type"],
        )
        .expect("valid metric");
        let pod_start_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "kubelet_pod_start_duration_seconds",
                "Duration in seconds from the agent seeing a pod for the first time to the pod starting to run.",
            )
            .buckets(latency_buckets()),
        )
        .expect("valid metric");
        for m in [
            Box::new(runtime_operations.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(runtime_operation_seconds.clone()),
            Box::new(runtime_operation_errors.clone()),
            Box::new(pod_start_seconds.clone()),
        ] {
            registry.register(m).expect("metric registered once");
        }
        Metrics {
            registry,
            running_pods,
            status_writes,
            dns_queries,
            runtime_operations,
            runtime_operation_seconds,
            runtime_operation_errors,
            pod_start_seconds,
        }
    })
}
