//! The apiserver's own metrics, in the process registry beside the store's:
//! requests by verb and resource (count and latency) and open watchers by
//! resource.

use std::sync::OnceLock;
use std::time::Instant;

use prometheus::{
    exponential_buckets, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
};

struct Metrics {
    requests: IntCounterVec,
    rejected: IntCounter,
    latency: HistogramVec,
    watchers: IntGaugeVec,
}

fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let registry = &skiff_raft_store::metrics::metrics().registry;
        let requests = IntCounterVec::new(
            Opts::new("skiff_apiserver_requests_total", "Resource API requests by verb, resource and code."),
            &["verb", "resource", "code"],
        )
        .expect("valid metric");
        let latency = HistogramVec::new(
            HistogramOpts::new("skiff_apiserver_request_duration_seconds", "Resource API request latency.")
                .buckets(exponential_buckets(0.0005, 2.0, 16).expect("valid buckets")),
            &["verb", "resource"],
        )
        .expect("valid metric");
        let watchers = IntGaugeVec::new(
            Opts::new("skiff_apiserver_watchers", "Open resource watches on this member, by resource."),
            &["resource"],
        )
        .expect("valid metric");
        let rejected = IntCounter::with_opts(Opts::new(
            "skiff_apiserver_rejected_requests_total",
            "Requests refused with 429 because their user had too many in flight.",
        ))
        .expect("valid metric");
        registry.register(Box::new(requests.clone())).expect("registered once");
        registry.register(Box::new(rejected.clone())).expect("registered once");
        registry.register(Box::new(latency.clone())).expect("registered once");
        registry.register(Box::new(watchers.clone())).expect("registered once");
        Metrics { requests, rejected, latency, watchers }
    })
}

/// One request refused by the fairness limits.
pub fn rejected(user: &str) {
    tracing::debug!(user, "too many requests in flight");
    metrics().rejected.inc();
}

/// Open watchers of `resource`.
pub fn watchers(resource: &str) -> IntGauge {
    metrics().watchers.with_label_values(&[resource])
}

/// Times one request; `finish` records it with its outcome's HTTP code.
pub struct RequestTimer {
    verb: &'static str,
    resource: String,
    started: Instant,
}

impl RequestTimer {
    pub fn start(verb: &'static str, resource: &str) -> RequestTimer {
        Self::start_at(verb, resource, Instant::now())
    }

    pub fn start_at(verb: &'static str, resource: &str, started: Instant) -> RequestTimer {
        RequestTimer { verb, resource: resource.to_string(), started }
    }

    pub fn finish(self, code: u16) {
        let m = metrics();
        m.requests.with_label_values(&[self.verb, &self.resource, &code.to_string()]).inc();
        m.latency.with_label_values(&[self.verb, &self.resource]).observe(self.started.elapsed().as_secs_f64());
    }
}
