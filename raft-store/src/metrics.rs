//! Process-wide Prometheus metrics of the store (one member per process;
//! in-process test clusters share them).
//!
//! Counters and histograms are updated where the work happens (the
//! batcher, the log's synced writes, the applier); gauges describing the
//! member's state are read from it when `/metrics` is scraped.

use std::sync::OnceLock;

use prometheus::{exponential_buckets, Histogram, HistogramOpts, IntCounter, IntGauge, Opts, Registry};

pub struct Metrics {
    pub registry: Registry,
    pub leader_changes: IntCounter,
    pub proposals_committed: IntCounter,
    pub proposals_failed: IntCounter,
    pub proposals_pending: IntGauge,
    pub batch_size: Histogram,
    pub forward_batch_size: Histogram,
    pub apply_seconds: Histogram,
    pub log_sync_seconds: Histogram,
    pub reads_linearized: IntCounter,
    pub read_rounds: IntCounter,
    pub reads_from_cache: IntCounter,
    pub snapshots_installed: IntCounter,
}

fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::with_opts(Opts::new(name, help)).expect("valid metric");
    registry.register(Box::new(c.clone())).expect("registered once");
    c
}

fn histogram(registry: &Registry, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)).expect("valid metric");
    registry.register(Box::new(h.clone())).expect("registered once");
    h
}

/// The process's store metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let registry = Registry::new();
        let latency = exponential_buckets(0.0001, 2.0, 16).expect("valid buckets");
        let proposals_pending =
            IntGauge::with_opts(Opts::new("skiff_proposals_pending", "Writes waiting for their Raft entry to apply."))
                .expect("valid metric");
        registry.register(Box::new(proposals_pending.clone())).expect("registered once");
        Metrics {
            leader_changes: counter(
                &registry,
                "skiff_raft_leader_changes_total",
                "Leader changes seen by this member.",
            ),
            proposals_committed: counter(
                &registry,
                "skiff_proposals_committed_total",
                "Writes applied through this member's batcher.",
            ),
            proposals_failed: counter(
                &registry,
                "skiff_proposals_failed_total",
                "Writes this member's batcher could not commit.",
            ),
            proposals_pending,
            batch_size: histogram(
                &registry,
                "skiff_batch_size",
                "Writes per Raft entry proposed by the leader.",
                exponential_buckets(1.0, 2.0, 13).expect("valid buckets"),
            ),
            forward_batch_size: histogram(
                &registry,
                "skiff_forward_batch_size",
                "Writes per call a follower sends on to the leader.",
                exponential_buckets(1.0, 2.0, 13).expect("valid buckets"),
            ),
            apply_seconds: histogram(
                &registry,
                "skiff_apply_duration_seconds",
                "Time to apply one batch of entries.",
                latency.clone(),
            ),
            log_sync_seconds: histogram(
                &registry,
                "skiff_log_fsync_duration_seconds",
                "Time of one synced write to the Raft log.",
                latency,
            ),
            reads_linearized: counter(&registry, "skiff_reads_linearized_total", "Linearizable reads served."),
            read_rounds: counter(
                &registry,
                "skiff_read_index_rounds_total",
                "Read-index rounds (each serves every read waiting).",
            ),
            reads_from_cache: counter(
                &registry,
                "skiff_reads_from_cache_total",
                "Reads of one key answered from the cache of newest records, without RocksDB.",
            ),
            snapshots_installed: counter(
                &registry,
                "skiff_raft_snapshots_installed_total",
                "Snapshots received from the leader and installed.",
            ),
            registry,
        }
    })
}
