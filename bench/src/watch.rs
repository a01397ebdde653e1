//! Watch delivery latency: `watchers` watch streams spread over every member
//! and over `keys` keys, while a paced writer puts `rate` values per second to
//! the leader. Each value is its send time (ns since the Unix epoch, the
//! harness and the servers share one clock), so a watcher's latency is
//! receive time minus the value: commit, apply on its member, and delivery.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use etcd_client::WatchStream;
use futures::{StreamExt, TryStreamExt};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::client::{self, Target};
use crate::latency::Latency;

/// Writes in flight at once; a writer that falls this far behind the pace
/// sends late (and its values carry the late send time).
pub const MAX_INFLIGHT_WRITES: usize = 256;

/// How long watchers may take to deliver the last events once writing stops.
const DRAIN: Duration = Duration::from_secs(5);

#[derive(Clone, Debug)]
pub struct WatchConfig {
    pub watchers: usize,
    /// Watcher `i` watches key `i % keys`; each write reaches watchers/keys watchers.
    pub keys: usize,
    /// Writes per second.
    pub rate: u64,
    pub duration: Duration,
    /// Connections the watch streams share; 0 means one per 100 watchers.
    pub conns: usize,
    pub writer_target: Target,
}

#[derive(Default)]
pub struct WatchResult {
    pub writes: u64,
    pub write_errors: u64,
    pub write_elapsed: Duration,
    /// Events the acknowledged writes should have produced.
    pub expected_events: u64,
    pub events: u64,
    /// Delivery latency: receive time minus the value's send time.
    pub latency: Latency,
    /// The writer's put latency, to tell a slow commit from a slow delivery.
    pub write_latency: Latency,
}

impl WatchResult {
    pub fn write_rate(&self) -> f64 {
        self.writes as f64 / self.write_elapsed.as_secs_f64().max(1e-9)
    }

    pub fn summary(&self) -> String {
        format!(
            "{} writes ({:.0}/s, {} errors, put p99 {:.2} ms, max {:.2} ms), {}/{} events delivered: \
             p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            self.writes,
            self.write_rate(),
            self.write_errors,
            self.write_latency.quantile_ms(0.99),
            self.write_latency.max_ms(),
            self.events,
            self.expected_events,
            self.latency.quantile_ms(0.50),
            self.latency.quantile_ms(0.99),
            self.latency.max_ms(),
        )
    }
}

fn key(index: usize) -> String {
    format!("skiff-bench/watch/{index:05}")
}

fn now_nanos() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

pub async fn run(endpoints: &[String], config: &WatchConfig) -> Result<WatchResult> {
    if config.watchers == 0 || config.keys == 0 || config.rate == 0 {
        bail!("watchers, keys and rate must be positive");
    }
    let keys = config.keys.min(config.watchers);
    let conns = if config.conns == 0 { config.watchers.div_ceil(100) } else { config.conns };
    let mut clients = Vec::with_capacity(conns);
    for i in 0..conns {
        clients.push(client::connect(&endpoints[i % endpoints.len()], None).await?);
    }

    // Create every watcher and wait for its `created` answer before writing.
    let streams: Vec<WatchStream> = futures::stream::iter(0..config.watchers)
        .map(|i| {
            let mut watch_client = clients[i % conns].watch_client();
            async move {
                let mut stream = watch_client.watch(key(i % keys), None).await?;
                let created = tokio::time::timeout(Duration::from_secs(10), stream.message())
                    .await
                    .context("watch creation timed out")??;
                match created {
                    Some(response) if response.created() => Ok(stream),
                    other => bail!("watch {i} was not created: {other:?}"),
                }
            }
        })
        .buffer_unordered(64)
        .try_collect()
        .await?;

    let delivered = Arc::new(AtomicU64::new(0));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut receivers = JoinSet::new();
    for stream in streams {
        receivers.spawn(receive(stream, delivered.clone(), stop_rx.clone()));
    }

    let writer = client::resolve(endpoints, config.writer_target).await?;
    let kv = client::connect(&writer[0], Some(Duration::from_secs(10))).await?.kv_client();
    let per_key: Vec<u64> = (0..keys).map(|k| (config.watchers - k).div_ceil(keys) as u64).collect();
    let mut result = write_paced(kv, config, keys, &per_key).await;

    // Wait for the tail of the deliveries, then stop the receivers.
    let drain_deadline = Instant::now() + DRAIN;
    while delivered.load(Ordering::Relaxed) < result.expected_events && Instant::now() < drain_deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop_tx.send(true);
    while let Some(part) = receivers.join_next().await {
        let (events, latency) = part?;
        result.events += events;
        result.latency.merge(&latency);
    }
    Ok(result)
}

/// Puts `config.rate` values per second for `config.duration`, round-robin over the keys.
async fn write_paced(kv: etcd_client::KvClient, config: &WatchConfig, keys: usize, per_key: &[u64]) -> WatchResult {
    let period = Duration::from_secs_f64(1.0 / config.rate as f64);
    let total = (config.duration.as_secs_f64() * config.rate as f64) as u64;
    let inflight = Arc::new(Semaphore::new(MAX_INFLIGHT_WRITES));
    let mut writes = JoinSet::new();
    let mut result = WatchResult::default();
    let tally =
        |outcome: Result<Option<(usize, Duration)>, tokio::task::JoinError>, result: &mut WatchResult| match outcome {
            Ok(Some((k, latency))) => {
                result.writes += 1;
                result.expected_events += per_key[k];
                result.write_latency.record(latency);
            }
            _ => result.write_errors += 1,
        };
    let start = tokio::time::Instant::now();
    for n in 0..total {
        tokio::time::sleep_until(start + period.mul_f64(n as f64)).await;
        let Ok(permit) = inflight.clone().acquire_owned().await else { break };
        let mut kv = kv.clone();
        let k = n as usize % keys;
        writes.spawn(async move {
            let sent = Instant::now();
            let outcome = kv.put(key(k), now_nanos().to_string(), None).await;
            drop(permit);
            outcome.ok().map(|_| (k, sent.elapsed()))
        });
        while let Some(done) = writes.try_join_next() {
            tally(done, &mut result);
        }
    }
    while let Some(done) = writes.join_next().await {
        tally(done, &mut result);
    }
    result.write_elapsed = start.elapsed();
    result
}

/// One watcher: records the delivery latency of every event until told to stop.
async fn receive(
    mut stream: WatchStream,
    delivered: Arc<AtomicU64>,
    mut stop: watch::Receiver<bool>,
) -> (u64, Latency) {
    let mut latency = Latency::default();
    let mut events = 0;
    loop {
        tokio::select! {
            message = stream.message() => {
                let Ok(Some(response)) = message else { break };
                let now = now_nanos();
                for event in response.events() {
                    let sent = event.kv().and_then(|kv| std::str::from_utf8(kv.value()).ok()?.parse::<u64>().ok());
                    if let Some(sent) = sent {
                        latency.record(Duration::from_nanos(now.saturating_sub(sent)));
                        events += 1;
                    }
                }
                delivered.fetch_add(response.events().len() as u64, Ordering::Relaxed);
            }
            _ = stop.changed() => break,
        }
    }
    (events, latency)
}
