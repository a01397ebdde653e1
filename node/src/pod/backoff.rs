//! Per-key exponential back-off, as the kubelet's `flowcontrol.Backoff`:
//! CrashLoopBackOff per container (10 s doubling to 5 min) and
//! ImagePullBackOff per image. An entry not touched for twice the maximum
//! (10 min) is forgotten, so a container that ran 10 minutes before
//! crashing restarts at once and starts again from 10 s.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug, Clone, Copy)]
struct Entry {
    delay: Duration,
    last_update: Instant,
}

/// Back-off delays by key.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    entries: HashMap<String, Entry>,
}

impl Backoff {
    /// Delays start at `initial` and double up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff { initial, max, entries: HashMap::new() }
    }

    fn live(&self, key: &str, now: Instant) -> Option<Entry> {
        self.entries.get(key).copied().filter(|e| now.duration_since(e.last_update) <= 2 * self.max)
    }

    /// The delay `key` is at, if it has a live entry.
    pub fn delay(&self, key: &str, now: Instant) -> Option<Duration> {
        self.live(key, now).map(|e| e.delay)
    }

    /// When `key` may go again if the failure happened at `since`: `None`
    /// if now, else the instant its back-off ends.
    pub fn blocked_until(&self, key: &str, since: Instant, now: Instant) -> Option<Instant> {
        let entry = self.live(key, now)?;
        let until = since + entry.delay;
        (now < until).then_some(until)
    }

    /// When `key` may go again counting from its last `next`.
    pub fn blocked_since_update(&self, key: &str, now: Instant) -> Option<Instant> {
        let entry = self.live(key, now)?;
        self.blocked_until(key, entry.last_update, now)
    }

    /// Records a try of `key` at `now`: its first (or first after 10 idle
    /// minutes) sets the initial delay, every other doubles it up to the
    /// maximum.
    pub fn next(&mut self, key: &str, now: Instant) {
        let delay = match self.live(key, now) {
            Some(entry) => (entry.delay * 2).min(self.max),
            None => self.initial,
        };
        self.entries.insert(key.to_string(), Entry { delay, last_update: now });
    }

    /// Forgets `key`.
    pub fn reset(&mut self, key: &str) {
        self.entries.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn delays_double_to_the_cap_and_reset_after_ten_idle_minutes() {
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        let mut seen = Vec::new();
        for _ in 0..8 {
            b.next("c", Instant::now());
            seen.push(b.delay("c", Instant::now()).unwrap_or_default().as_secs());
        }
        assert_eq!(seen, vec![10, 20, 40, 80, 160, 300, 300, 300]);
        tokio::time::advance(Duration::from_secs(601)).await;
        assert_eq!(b.delay("c", Instant::now()), None);
        b.next("c", Instant::now());
        assert_eq!(b.delay("c", Instant::now()), Some(Duration::from_secs(10)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_is_blocked_until_its_delay_has_passed_since_the_failure() {
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        let start = Instant::now();
        assert_eq!(b.blocked_until("c", start, start), None);
        b.next("c", start);
        assert_eq!(b.blocked_until("c", start, start), Some(start + Duration::from_secs(10)));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(b.blocked_until("c", start, Instant::now()), None);
    }
}
