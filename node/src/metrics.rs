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
    /// Cluster DNS queries by result (answered, nodata, nxdomain,
    /// forwarded, servfail, formerr, notimp, dropped): see `dns::server`.
    pub dns_queries: IntCounterVec,
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
        Metrics { registry, running_pods, status_writes, dns_queries }
    })
}
