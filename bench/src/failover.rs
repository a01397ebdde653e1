//! Failover: SIGKILL the leader, then measure the time until the first write
//! *sent after the kill* succeeds. Probes (puts to the survivors, alternating)
//! start every `probe_interval`, each with its own timeout, so the answer does
//! not depend on one client's retry policy. The killed member is restarted on
//! its data and the cluster has caught up before the next kill.

use std::time::{Duration, Instant};

use anyhow::Result;
use futures::stream::FuturesUnordered;
use futures::StreamExt;

use crate::client;
use crate::cluster::Cluster;

#[derive(Clone, Debug)]
pub struct FailoverConfig {
    pub kills: usize,
    pub probe_interval: Duration,
    pub probe_timeout: Duration,
    /// Quiet time after catch-up and before the kill.
    pub settle: Duration,
    /// A kill after which no write succeeds within this long counts as failed.
    pub give_up: Duration,
}

impl Default for FailoverConfig {
    fn default() -> Self {
        FailoverConfig {
            kills: 10,
            probe_interval: Duration::from_millis(10),
            probe_timeout: Duration::from_secs(5),
            settle: Duration::from_millis(500),
            give_up: Duration::from_secs(30),
        }
    }
}

#[derive(Default)]
pub struct FailoverResult {
    /// Kill to first successful write, one per successful kill.
    pub samples: Vec<Duration>,
    /// Kills after which no write succeeded within `give_up`.
    pub failures: usize,
}

impl FailoverResult {
    pub fn median(&self) -> Duration {
        let mut sorted = self.samples.clone();
        sorted.sort();
        match sorted.len() {
            0 => Duration::ZERO,
            n if n % 2 == 1 => sorted[n / 2],
            n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2,
        }
    }

    pub fn max(&self) -> Duration {
        self.samples.iter().max().copied().unwrap_or_default()
    }

    pub fn summary(&self) -> String {
        let ms: Vec<String> = self.samples.iter().map(|d| format!("{}", d.as_millis())).collect();
        format!(
            "{} kills: median {} ms, max {} ms, {} without a write within the limit; samples (ms): {}",
            self.samples.len() + self.failures,
            self.median().as_millis(),
            self.max().as_millis(),
            self.failures,
            ms.join(" "),
        )
    }
}

pub async fn run(cluster: &mut Cluster, config: &FailoverConfig) -> Result<FailoverResult> {
    let mut result = FailoverResult::default();
    let endpoints = cluster.endpoints();
    for kill in 1..=config.kills {
        let leader = cluster.must_leader().await?;
        client::must_catch_up(&cluster.running_endpoints(), Duration::from_secs(60)).await?;
        tokio::time::sleep(config.settle).await;
        let leader = {
            // An election during the settle time moves the target.
            let now = cluster.must_leader().await?;
            if now != leader {
                eprintln!("    leader moved from member {} to {} before kill {kill}", leader + 1, now + 1);
            }
            now
        };
        let mut survivors = Vec::new();
        for (i, endpoint) in endpoints.iter().enumerate() {
            if i != leader {
                survivors.push(client::connect(endpoint, Some(config.probe_timeout)).await?.kv_client());
            }
        }
        // Connections are up before the clock starts.
        for kv in &mut survivors {
            kv.get("skiff-bench/failover", None).await?;
        }

        let killed_at = Instant::now();
        let wall = humantime::format_rfc3339_millis(std::time::SystemTime::now());
        cluster.kill(leader)?;
        let outcome = probe(&survivors, killed_at, config).await;
        match outcome {
            Some(elapsed) => {
                eprintln!(
                    "    kill {kill}: member {} killed at {wall}, first write after {} ms",
                    leader + 1,
                    elapsed.as_millis()
                );
                result.samples.push(elapsed);
            }
            None => {
                eprintln!(
                    "    kill {kill}: member {} killed at {wall}, no write within {:?}",
                    leader + 1,
                    config.give_up
                );
                result.failures += 1;
            }
        }
        cluster.start(leader)?;
    }
    cluster.must_leader().await?;
    client::must_catch_up(&cluster.running_endpoints(), Duration::from_secs(60)).await?;
    Ok(result)
}

/// Starts a put every `probe_interval` until one succeeds; the time from
/// `killed_at` to its answer, or `None` after `give_up`.
async fn probe(survivors: &[etcd_client::KvClient], killed_at: Instant, config: &FailoverConfig) -> Option<Duration> {
    let give_up = tokio::time::Instant::from_std(killed_at + config.give_up);
    let mut next = tokio::time::Instant::from_std(killed_at);
    let mut inflight = FuturesUnordered::new();
    let max_inflight = (config.probe_timeout.as_millis() / config.probe_interval.as_millis().max(1)) as usize + 1;
    let mut sent: usize = 0;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(next), if inflight.len() < max_inflight => {
                let mut kv = survivors[sent % survivors.len()].clone();
                let key = format!("skiff-bench/failover/{sent}");
                inflight.push(async move { kv.put(key, "x", None).await.is_ok() });
                sent += 1;
                next += config.probe_interval;
            }
            Some(ok) = inflight.next() => {
                if ok {
                    return Some(killed_at.elapsed());
                }
            }
            _ = tokio::time::sleep_until(give_up) => return None,
        }
    }
}
