//! The scheduler's metrics, under kube-scheduler's names where it has
//! them: attempts by result, end-to-end scheduling latency, pending pods
//! by queue, binding latency, preemption; and whether this instance leads.

use std::sync::OnceLock;

use prometheus::{
    exponential_buckets, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
};

/// The scheduler's series, registered in `registry`.
pub struct Metrics {
    /// What `/metrics` serves.
    pub registry: prometheus::Registry,
    /// Attempts by result: `scheduled`, `unschedulable`, `error`.
    pub attempts: IntCounterVec,
    /// From a pod first entering the queue to its binding committed.
    pub e2e_latency: Histogram,
    /// One scheduling decision: filters, scores, the pick.
    pub algorithm_latency: Histogram,
    /// One `pods/binding` write.
    pub binding_latency: Histogram,
    /// Pods waiting, by queue: `active`, `backoff`, `unschedulable`.
    pub pending: IntGaugeVec,
    /// Preemptions carried out.
    pub preemption_attempts: IntCounter,
    /// Pods evicted by preemption.
    pub preemption_victims: IntCounter,
    /// 1 while this instance holds the lease.
    pub leader: IntGauge,
}

/// The process's scheduler metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let registry = prometheus::Registry::new();
        let latency = |name: &str, help: &str, start: f64| {
            Histogram::with_opts(
                HistogramOpts::new(name, help).buckets(exponential_buckets(start, 2.0, 20).expect("valid buckets")),
            )
            .expect("valid metric")
        };
        let attempts = IntCounterVec::new(
            Opts::new("scheduler_schedule_attempts_total", "Scheduling attempts by result."),
            &["result"],
        )
        .expect("valid metric");
        let e2e_latency = latency(
            "scheduler_pod_scheduling_duration_seconds",
            "From a pod entering the queue to its binding committed.",
            0.001,
        );
        let algorithm_latency =
            latency("scheduler_scheduling_algorithm_duration_seconds", "One scheduling decision.", 0.00001);
        let binding_latency = latency("scheduler_binding_duration_seconds", "One pods/binding write.", 0.0001);
        let pending = IntGaugeVec::new(Opts::new("scheduler_pending_pods", "Pods waiting, by queue."), &["queue"])
            .expect("valid metric");
        let preemption_attempts =
            IntCounter::new("scheduler_preemption_attempts_total", "Preemptions carried out.").expect("valid metric");
        let preemption_victims =
            IntCounter::new("scheduler_preemption_victims_total", "Pods evicted by preemption.").expect("valid metric");
        let leader = IntGauge::new("leader_election_master_status", "1 while this instance holds the leader lease.")
            .expect("valid metric");
        for m in [
            Box::new(attempts.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(e2e_latency.clone()),
            Box::new(algorithm_latency.clone()),
            Box::new(binding_latency.clone()),
            Box::new(pending.clone()),
            Box::new(preemption_attempts.clone()),
            Box::new(preemption_victims.clone()),
            Box::new(leader.clone()),
        ] {
            registry.register(m).expect("registered once");
        }
        Metrics {
            registry,
            attempts,
            e2e_latency,
            algorithm_latency,
            binding_latency,
            pending,
            preemption_attempts,
            preemption_victims,
            leader,
        }
    })
}
