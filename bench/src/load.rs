//! Closed-loop load: `clients` tasks each issue one request at a time (put or
//! range) over `conns` shared connections until the duration ends or the
//! whole run has issued `max_ops` requests, whichever comes first.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use etcd_client::{GetOptions, KvClient};
use rand::Rng;

use crate::client::{self, Target};
use crate::latency::Latency;

/// Key of the single record range scenarios read.
const RANGE_KEY: &str = "skiff-bench/range";

/// Per-request timeout: a request slower than this counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// Concurrent in-flight requests (one task each).
    pub clients: usize,
    /// gRPC connections the clients share; 0 means min(clients, 16).
    pub conns: usize,
    pub duration: Duration,
    pub max_ops: u64,
    pub target: Target,
    pub value_size: usize,
}

/// What each request does.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    /// Put a `value_size` value under a random one of `key_space` keys.
    Put { key_space: u64 },
    /// Read one key, linearizable or serializable.
    Range { serializable: bool },
}

#[derive(Default)]
pub struct LoadResult {
    pub ops: u64,
    pub errors: u64,
    pub elapsed: Duration,
    pub latency: Latency,
    /// The first error seen, for the report.
    pub first_error: Option<String>,
}

impl LoadResult {
    /// Adds another run of the same load to this one.
    pub fn absorb(&mut self, other: &LoadResult) {
        self.ops += other.ops;
        self.errors += other.errors;
        self.elapsed += other.elapsed;
        self.latency.merge(&other.latency);
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
    }

    pub fn throughput(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn summary(&self) -> String {
        format!(
            "{} ops in {:.1}s: {:.0} ops/s, p50 {:.2} ms, p99 {:.2} ms, {} errors{}",
            self.ops,
            self.elapsed.as_secs_f64(),
            self.throughput(),
            self.latency.quantile_ms(0.50),
            self.latency.quantile_ms(0.99),
            self.errors,
            self.first_error.as_deref().map(|e| format!(" (first: {e})")).unwrap_or_default(),
        )
    }
}

/// Runs one closed-loop load against `endpoints`.
pub async fn run(endpoints: &[String], config: &LoadConfig, op: Op) -> Result<LoadResult> {
    if config.clients == 0 {
        bail!("at least one client is needed");
    }
    let targets = client::resolve(endpoints, config.target).await?;
    let conns = if config.conns == 0 { config.clients.min(16) } else { config.conns.min(config.clients) };
    let mut kv = Vec::with_capacity(conns);
    for i in 0..conns {
        kv.push(client::connect(&targets[i % targets.len()], Some(REQUEST_TIMEOUT)).await?.kv_client());
    }
    let value = vec![b'v'; config.value_size];
    if let Op::Range { .. } = op {
        kv[0].put(RANGE_KEY, value.clone(), None).await?;
    }
    // Every connection answers once before the clock starts.
    for client in &mut kv {
        client.get(RANGE_KEY, Some(GetOptions::new().with_serializable())).await?;
    }

    let issued = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + config.duration;
    let mut tasks = Vec::with_capacity(config.clients);
    for i in 0..config.clients {
        let kv = kv[i % conns].clone();
        let issued = issued.clone();
        let value = value.clone();
        let max_ops = config.max_ops;
        tasks.push(tokio::spawn(client_loop(kv, op, value, deadline, issued, max_ops)));
    }
    let mut result = LoadResult::default();
    for task in tasks {
        let part = task.await?;
        result.ops += part.ops;
        result.errors += part.errors;
        result.latency.merge(&part.latency);
        if result.first_error.is_none() {
            result.first_error = part.first_error;
        }
    }
    result.elapsed = start.elapsed();
    Ok(result)
}

async fn client_loop(
    mut kv: KvClient,
    op: Op,
    value: Vec<u8>,
    deadline: Instant,
    issued: Arc<AtomicU64>,
    max_ops: u64,
) -> LoadResult {
    let mut result = LoadResult::default();
    while Instant::now() < deadline && issued.fetch_add(1, Ordering::Relaxed) < max_ops {
        let sent = Instant::now();
        let outcome = match op {
            Op::Put { key_space } => {
                let key = format!("skiff-bench/put/{:08}", rand::thread_rng().gen_range(0..key_space.max(1)));
                kv.put(key, value.clone(), None).await.map(drop)
            }
            Op::Range { serializable } => {
                let options = serializable.then(|| GetOptions::new().with_serializable());
                kv.get(RANGE_KEY, options).await.map(drop)
            }
        };
        match outcome {
            Ok(()) => {
                result.ops += 1;
                result.latency.record(sent.elapsed());
            }
            Err(e) => {
                result.errors += 1;
                result.first_error.get_or_insert_with(|| e.to_string());
                // A failing member is not hammered in a tight loop.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(ops: u64, seconds: u64, latency_ms: u64, error: Option<&str>) -> LoadResult {
        let mut latency = Latency::default();
        for _ in 0..ops {
            latency.record(Duration::from_millis(latency_ms));
        }
        LoadResult {
            ops,
            errors: error.is_some() as u64,
            elapsed: Duration::from_secs(seconds),
            latency,
            first_error: error.map(str::to_string),
        }
    }

    #[test]
    fn rounds_add_up_to_one_run_over_their_whole_time() {
        let mut total = run(1000, 10, 1, None);
        total.absorb(&run(3000, 10, 3, Some("first")));
        total.absorb(&run(2000, 10, 2, Some("second")));
        assert_eq!(total.ops, 6000);
        assert_eq!(total.errors, 2);
        assert!((total.throughput() - 200.0).abs() < 1e-9, "{}", total.throughput());
        // Half the requests took 3 ms: the median is 2-3 ms, p99 3 ms.
        assert!((total.latency.quantile_ms(0.5) - 2.0).abs() < 0.01, "{}", total.latency.quantile_ms(0.5));
        assert!((total.latency.quantile_ms(0.99) - 3.0).abs() < 0.01);
        assert_eq!(total.first_error.as_deref(), Some("first"));
    }
}
