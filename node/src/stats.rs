//! CPU usage rates, as the kubelet's housekeeping (cAdvisor) keeps them:
//! every `interval` the host's and each container's cumulative CPU time
//! is sampled, and the rate over the last window is what
//! `/stats/summary` reports as `usageNanoCores` (and the apiserver's
//! metrics API, hence `kubectl top`, shows). Cumulative counters alone
//! would make every reader keep its own previous sample.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use skiff_shutdown::Shutdown;

use crate::runtime::{LabelFilter, Runtime, LABEL_NODE};

/// One reading of the cumulative counters.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When it was taken (monotonic).
    pub at: Instant,
    /// The host's busy CPU time, nanoseconds.
    pub host_cpu_ns: u64,
    /// Each container's CPU time, nanoseconds, by container id.
    pub containers: HashMap<String, u64>,
}

/// Rates over the last window between two samples.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    /// When the window ended.
    pub time: Option<DateTime<Utc>>,
    /// The window's length.
    pub window: Duration,
    /// The host's CPU use in nanocores.
    pub node_nano_cores: Option<u64>,
    /// Each container's CPU use in nanocores, by container id; a container
    /// is here only if it was in both samples.
    pub containers: HashMap<String, u64>,
}

/// The rates between `before` and `after`; counters that went backwards
/// (a restarted container under the same id) count as zero.
pub fn rates(before: &Sample, after: &Sample, time: DateTime<Utc>) -> Usage {
    let window = after.at.saturating_duration_since(before.at);
    let secs = window.as_secs_f64();
    if secs <= 0.0 {
        return Usage::default();
    }
    let per_second = |from: u64, to: u64| (to.saturating_sub(from) as f64 / secs) as u64;
    let containers = after
        .containers
        .iter()
        .filter_map(|(id, &to)| before.containers.get(id).map(|&from| (id.clone(), per_second(from, to))))
        .collect();
    Usage {
        time: Some(time),
        window,
        node_nano_cores: Some(per_second(before.host_cpu_ns, after.host_cpu_ns)),
        containers,
    }
}

/// The latest rates, shared between the sampler and the readers.
#[derive(Debug, Clone, Default)]
pub struct UsageCell(Arc<Mutex<Usage>>);

impl UsageCell {
    /// The latest rates (empty until two samples were taken).
    pub fn get(&self) -> Usage {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, usage: Usage) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = usage;
    }
}

/// Samples this node's counters every `interval` until `shutdown`,
/// keeping the rates in the returned cell. A runtime that does not answer
/// leaves the last rates in place.
pub fn spawn_sampler(node: &str, runtime: Arc<dyn Runtime>, interval: Duration, shutdown: &Shutdown) -> UsageCell {
    let cell = UsageCell::default();
    let out = cell.clone();
    let filter = LabelFilter(BTreeMap::from([(LABEL_NODE.to_string(), node.to_string())]));
    let stop = shutdown.clone();
    shutdown.spawn(async move {
        let mut previous: Option<Sample> = None;
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let stats = match runtime.list_container_stats(&filter).await {
                Ok(stats) => stats,
                Err(e) => {
                    tracing::debug!(error = %e, "container stats unavailable; keeping the last rates");
                    continue;
                }
            };
            let sample = Sample {
                at: Instant::now(),
                host_cpu_ns: host_cpu_nanoseconds(),
                containers: stats.into_iter().map(|c| (c.id, c.cpu_usage_core_nanoseconds)).collect(),
            };
            if let Some(before) = &previous {
                out.set(rates(before, &sample, Utc::now()));
            }
            previous = Some(sample);
        }
    });
    cell
}

/// Cumulative busy CPU time of the host in nanoseconds, from /proc/stat.
pub fn host_cpu_nanoseconds() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    parse_proc_stat(&stat)
}

fn parse_proc_stat(text: &str) -> u64 {
    // user nice system idle iowait irq softirq steal: busy is all but idle and iowait.
    let Some(line) = text.lines().find(|l| l.starts_with("cpu ")) else { return 0 };
    let f: Vec<u64> = line.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    let busy: u64 = f.iter().enumerate().filter(|(i, _)| *i != 3 && *i != 4).take(6).map(|(_, v)| v).sum();
    // USER_HZ is 100 on Linux.
    busy * 10_000_000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at: Instant, host: u64, containers: &[(&str, u64)]) -> Sample {
        Sample { at, host_cpu_ns: host, containers: containers.iter().map(|(id, ns)| (id.to_string(), *ns)).collect() }
    }

    #[test]
    fn rates_are_the_counters_growth_per_second_over_the_window() {
        let t0 = Instant::now();
        let before = sample(t0, 1_000_000_000, &[("a", 0), ("b", 500)]);
        let after = sample(t0 + Duration::from_secs(2), 2_000_000_000, &[("a", 200_000_000), ("c", 7)]);
        let usage = rates(&before, &after, Utc::now());
        assert_eq!(usage.window, Duration::from_secs(2));
        assert_eq!(usage.node_nano_cores, Some(500_000_000));
        // "a" was in both samples; "b" is gone and "c" is new: no rate yet.
        assert_eq!(usage.containers, HashMap::from([("a".to_string(), 100_000_000)]));
    }

    #[test]
    fn a_counter_that_went_backwards_counts_as_idle() {
        let t0 = Instant::now();
        let before = sample(t0, 10, &[("a", 900)]);
        let after = sample(t0 + Duration::from_secs(1), 5, &[("a", 100)]);
        let usage = rates(&before, &after, Utc::now());
        assert_eq!(usage.node_nano_cores, Some(0));
        assert_eq!(usage.containers["a"], 0);
    }

    #[test]
    fn proc_stat_busy_time_leaves_out_idle_and_iowait() {
        let text = "cpu  100 5 50 1000 30 1 2 3 0 0\ncpu0 1 1 1 1 1 1 1 1 0 0\n";
        assert_eq!(parse_proc_stat(text), (100 + 5 + 50 + 1 + 2 + 3) * 10_000_000);
        assert_eq!(parse_proc_stat("garbage"), 0);
    }
}
