//! The agent's metrics, under the kubelet's names where it has one.

use std::sync::OnceLock;

use prometheus::{IntCounterVec, IntGauge, Opts, Registry};

/// Every metric the agent exports, registered once.
pub struct Metrics {
    /// What `/metrics` serves.
    pub registry: Registry,
    /// Pods with a worker (kubelet's `kubelet_running_pods`).
    pub running_pods: IntGauge,
    /// Pod status writes by outcome (ok, gone, error).
    pub status_writes: IntCounterVec,
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
        Metrics { registry, running_pods, status_writes }
    })
}
