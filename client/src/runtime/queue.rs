//! The work queue between informers and reconcilers (client-go's
//! `workqueue` with its rate-limiting and delaying layers):
//!
//! - de-duplicating: a key waiting in the queue is queued once however
//!   often it is added;
//! - exclusive: a key handed out by [`WorkQueue::next`] is not handed out
//!   again until [`WorkQueue::done`]; added meanwhile, it is queued again
//!   at `done`, so the latest change is always processed;
//! - delaying: [`WorkQueue::add_after`] keeps the earliest due time per key;
//! - rate-limited: [`WorkQueue::add_rate_limited`] waits 5ms doubling per
//!   failure up to 1000s per key (until [`WorkQueue::forget`]), and at
//!   least what an optional overall token bucket asks;
//! - bounded: at most `capacity` keys wait in the ready queue. When it is
//!   full, [`WorkQueue::try_add`] returns [`QueueError::Full`] and
//!   [`WorkQueue::add`] waits for room. Delayed and rate-limited adds never
//!   wait (a worker requeueing its own key must not block on the queue it
//!   drains): their keys wait in the delayed set until there is room. A key
//!   re-added while processing goes back at `done` even into a full queue,
//!   so the ready queue holds at most `capacity` plus the number of workers.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::config::TokenBucket;

/// How a [`WorkQueue`] behaves.
#[derive(Clone, Debug)]
pub struct QueueConfig {
    /// Keys the ready queue holds at most.
    pub capacity: usize,
    /// The first per-key retry delay; it doubles per failure.
    pub base_delay: Duration,
    /// The longest per-key retry delay.
    pub max_delay: Duration,
    /// Overall retries per second (a token bucket over every key); 0: off.
    pub qps: f64,
    /// The bucket's burst.
    pub burst: u32,
}

impl Default for QueueConfig {
    /// 4096 keys; 5ms doubling to 1000s per key, as client-go; no overall bucket.
    fn default() -> Self {
        QueueConfig {
            capacity: 4096,
            base_delay: Duration::from_millis(5),
            max_delay: Duration::from_secs(1000),
            qps: 0.0,
            burst: 0,
        }
    }
}

/// Why an add was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// The ready queue holds `capacity` keys.
    #[error("the work queue is full")]
    Full,
    /// The queue was shut down.
    #[error("the work queue is shut down")]
    ShutDown,
}

struct State<T> {
    /// Keys ready to be handed out, oldest first.
    ready: VecDeque<T>,
    /// The keys in `ready`.
    queued: HashSet<T>,
    /// Keys handed out and not yet done.
    processing: HashSet<T>,
    /// Processing keys added again: back into `ready` at `done`.
    dirty: HashSet<T>,
    /// Delayed keys by due time (and a sequence number, for uniqueness).
    delayed: BTreeMap<(Instant, u64), T>,
    /// Each delayed key's entry in `delayed`.
    delayed_at: HashMap<T, (Instant, u64)>,
    sequence: u64,
    /// Failures per key since its last `forget`.
    failures: HashMap<T, u32>,
    shut_down: bool,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    config: QueueConfig,
    bucket: Option<TokenBucket>,
    /// Signalled when a key may be ready, the due time changed, or on shutdown.
    ready: Notify,
    /// Signalled when the ready queue has room, or on shutdown.
    room: Notify,
}

/// A bounded, de-duplicating, rate-limited work queue; clones share it.
pub struct WorkQueue<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Clone for WorkQueue<T> {
    fn clone(&self) -> Self {
        WorkQueue { shared: self.shared.clone() }
    }
}

impl<T> std::fmt::Debug for WorkQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WorkQueue")
    }
}

impl<T: Clone + Eq + Hash + Send + 'static> WorkQueue<T> {
    /// An empty queue.
    pub fn new(config: QueueConfig) -> WorkQueue<T> {
        let bucket = TokenBucket::new(config.qps, config.burst);
        WorkQueue {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    ready: VecDeque::new(),
                    queued: HashSet::new(),
                    processing: HashSet::new(),
                    dirty: HashSet::new(),
                    delayed: BTreeMap::new(),
                    delayed_at: HashMap::new(),
                    sequence: 0,
                    failures: HashMap::new(),
                    shut_down: false,
                }),
                config: QueueConfig { capacity: config.capacity.max(1), ..config },
                bucket,
                ready: Notify::new(),
                room: Notify::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `key` now if there is room (see [`WorkQueue::add`]).
    pub fn try_add(&self, key: T) -> Result<(), QueueError> {
        let result = self.offer(&mut self.lock(), key);
        if result.is_ok() {
            self.shared.ready.notify_waiters();
        }
        result
    }

    /// Queues `key`, waiting while the ready queue is full. A key already
    /// queued or being processed never waits.
    pub async fn add(&self, key: T) -> Result<(), QueueError> {
        loop {
            let room = self.shared.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            match self.try_add(key.clone()) {
                Err(QueueError::Full) => room.await,
                result => return result,
            }
        }
    }

    fn offer(&self, state: &mut State<T>, key: T) -> Result<(), QueueError> {
        if state.shut_down {
            return Err(QueueError::ShutDown);
        }
        if state.queued.contains(&key) {
            return Ok(());
        }
        if state.processing.contains(&key) {
            state.dirty.insert(key);
            return Ok(());
        }
        if state.ready.len() >= self.shared.config.capacity {
            return Err(QueueError::Full);
        }
        if let Some(at) = state.delayed_at.remove(&key) {
            state.delayed.remove(&at);
        }
        state.queued.insert(key.clone());
        state.ready.push_back(key);
        Ok(())
    }

    /// Queues `key` once `delay` has passed (never waits). A key already
    /// delayed keeps the earlier of its two due times.
    pub fn add_after(&self, key: T, delay: Duration) {
        let mut state = self.lock();
        if state.shut_down || state.queued.contains(&key) {
            return;
        }
        let due = Instant::now() + delay;
        if let Some(&(at, seq)) = state.delayed_at.get(&key) {
            if at <= due {
                return;
            }
            state.delayed.remove(&(at, seq));
        }
        state.sequence += 1;
        let entry = (due, state.sequence);
        state.delayed.insert(entry, key.clone());
        state.delayed_at.insert(key, entry);
        drop(state);
        self.shared.ready.notify_waiters();
    }

    /// Queues `key` after its back-off: 5ms doubling per failure since
    /// its last [`forget`](WorkQueue::forget), at most 1000s (the
    /// configured values), or longer if the overall bucket says so.
    pub fn add_rate_limited(&self, key: T) {
        let delay = {
            let mut state = self.lock();
            let failures = state.failures.entry(key.clone()).or_insert(0);
            let exponent = (*failures).min(30);
            *failures = failures.saturating_add(1);
            let config = &self.shared.config;
            config.base_delay.saturating_mul(1u32 << exponent).min(config.max_delay)
        };
        let delay = match &self.shared.bucket {
            Some(bucket) => delay.max(bucket.reserve()),
            None => delay,
        };
        self.add_after(key, delay);
    }

    /// Forgets `key`'s failures: its next back-off starts over.
    pub fn forget(&self, key: &T) {
        self.lock().failures.remove(key);
    }

    /// How often `key` was requeued with back-off since its last `forget`.
    pub fn requeues(&self, key: &T) -> u32 {
        self.lock().failures.get(key).copied().unwrap_or(0)
    }

    /// Moves due delayed keys into the ready queue while there is room.
    fn promote(&self, state: &mut State<T>, now: Instant) {
        while let Some((&(at, seq), _)) = state.delayed.first_key_value() {
            if at > now {
                break;
            }
            let key = state.delayed[&(at, seq)].clone();
            let can_go = state.queued.contains(&key)
                || state.processing.contains(&key)
                || state.ready.len() < self.shared.config.capacity;
            if !can_go {
                break;
            }
            state.delayed.remove(&(at, seq));
            state.delayed_at.remove(&key);
            let _ = self.offer(state, key);
        }
    }

    /// The next key to process, waiting for one; `None` once the queue is
    /// shut down. Call [`done`](WorkQueue::done) with it afterwards.
    pub async fn next(&self) -> Option<T> {
        loop {
            let ready = self.shared.ready.notified();
            tokio::pin!(ready);
            ready.as_mut().enable();
            let due = {
                let mut state = self.lock();
                if state.shut_down {
                    return None;
                }
                self.promote(&mut state, Instant::now());
                if let Some(key) = state.ready.pop_front() {
                    state.queued.remove(&key);
                    state.processing.insert(key.clone());
                    drop(state);
                    self.shared.room.notify_waiters();
                    return Some(key);
                }
                state.delayed.first_key_value().map(|(&(at, _), _)| at)
            };
            match due {
                Some(at) => {
                    tokio::select! {
                        _ = &mut ready => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                None => ready.await,
            }
        }
    }

    /// Marks `key` processed; if it was added meanwhile it is queued again.
    pub fn done(&self, key: &T) {
        let mut state = self.lock();
        state.processing.remove(key);
        if state.dirty.remove(key) && !state.shut_down && !state.queued.contains(key) {
            state.queued.insert(key.clone());
            state.ready.push_back(key.clone());
            drop(state);
            self.shared.ready.notify_waiters();
        }
    }

    /// Stops the queue: `next` returns `None` and adds fail from now on.
    pub fn shut_down(&self) {
        self.lock().shut_down = true;
        self.shared.ready.notify_waiters();
        self.shared.room.notify_waiters();
    }

    /// Keys ready to be handed out (the queue depth).
    pub fn len(&self) -> usize {
        self.lock().ready.len()
    }

    /// Whether no key is ready.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys waiting for their delay or back-off.
    pub fn delayed_len(&self) -> usize {
        self.lock().delayed.len()
    }

    /// Keys being processed.
    pub fn processing_len(&self) -> usize {
        self.lock().processing.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(capacity: usize) -> WorkQueue<&'static str> {
        WorkQueue::new(QueueConfig { capacity, ..Default::default() })
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_added_twice_is_handed_out_once() {
        let q = queue(10);
        q.try_add("a").unwrap();
        q.try_add("b").unwrap();
        q.try_add("a").unwrap();
        assert_eq!(q.len(), 2);
        assert_eq!(q.next().await, Some("a"));
        assert_eq!(q.next().await, Some("b"));
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_added_while_processing_is_handed_out_again_only_after_done() {
        let q = queue(10);
        q.try_add("a").unwrap();
        assert_eq!(q.next().await, Some("a"));
        q.try_add("a").unwrap();
        q.try_add("b").unwrap();
        assert_eq!(q.next().await, Some("b"), "a is still being processed");
        let waiting = tokio::time::timeout(Duration::from_secs(5), q.next()).await;
        assert!(waiting.is_err(), "a must not be handed out twice at once");
        q.done(&"a");
        assert_eq!(q.next().await, Some("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn add_after_delays_a_key_and_keeps_its_earliest_due_time() {
        let q = queue(10);
        let start = Instant::now();
        q.add_after("a", Duration::from_secs(10));
        q.add_after("a", Duration::from_secs(3));
        q.add_after("a", Duration::from_secs(7));
        assert_eq!(q.delayed_len(), 1);
        assert_eq!(q.next().await, Some("a"));
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        q.done(&"a");
        // An immediate add supersedes a delayed one.
        q.add_after("b", Duration::from_secs(60));
        q.try_add("b").unwrap();
        assert_eq!(q.next().await, Some("b"));
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        assert_eq!(q.delayed_len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limited_adds_back_off_from_5ms_doubling_to_1000s_until_forgotten() {
        let q = queue(10);
        let mut delays = Vec::new();
        for _ in 0..20 {
            let start = Instant::now();
            q.add_rate_limited("a");
            assert_eq!(q.next().await, Some("a"));
            q.done(&"a");
            delays.push(start.elapsed());
        }
        assert_eq!(delays[0], Duration::from_millis(5));
        assert_eq!(delays[1], Duration::from_millis(10));
        assert_eq!(delays[4], Duration::from_millis(80));
        assert_eq!(delays[19], Duration::from_secs(1000));
        assert_eq!(q.requeues(&"a"), 20);
        q.forget(&"a");
        let start = Instant::now();
        q.add_rate_limited("a");
        assert_eq!(q.next().await, Some("a"));
        assert_eq!(start.elapsed(), Duration::from_millis(5));
    }

    #[tokio::test(start_paused = true)]
    async fn the_overall_bucket_spaces_out_retries_of_different_keys() {
        let q = WorkQueue::new(QueueConfig { capacity: 10, qps: 1.0, burst: 1, ..Default::default() });
        let start = Instant::now();
        q.add_rate_limited("a");
        q.add_rate_limited("b");
        q.add_rate_limited("c");
        for expected in [5u64, 1000, 2000] {
            q.next().await.unwrap();
            assert_eq!(start.elapsed(), Duration::from_millis(expected));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_refuses_try_add_and_makes_add_wait_for_room() {
        let q = queue(3);
        for key in ["a", "b", "c"] {
            q.try_add(key).unwrap();
        }
        assert_eq!(q.try_add("d"), Err(QueueError::Full));
        // Adding a key that is already queued never waits.
        q.add("a").await.unwrap();
        let adder = {
            let q = q.clone();
            tokio::spawn(async move { q.add("d").await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!adder.is_finished(), "add waits while the queue is full");
        assert_eq!(q.next().await, Some("a"));
        adder.await.unwrap().unwrap();
        assert_eq!(q.len(), 3);
        // A key being processed can be re-added into a full queue.
        q.try_add("a").unwrap();
        q.done(&"a");
        assert_eq!(q.len(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_keys_wait_for_room_instead_of_blocking_the_caller() {
        let q = queue(1);
        q.try_add("a").unwrap();
        q.add_after("b", Duration::from_secs(1));
        q.add_rate_limited("c");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(q.len(), 1);
        assert_eq!(q.delayed_len(), 2);
        let mut seen = Vec::new();
        for _ in 0..3 {
            let key = q.next().await.unwrap();
            q.done(&key);
            seen.push(key);
        }
        seen.sort();
        assert_eq!(seen, ["a", "b", "c"]);
    }

    #[tokio::test(start_paused = true)]
    async fn shutting_down_wakes_workers_and_waiting_adders() {
        let q = queue(1);
        q.try_add("a").unwrap();
        let adder = {
            let q = q.clone();
            tokio::spawn(async move { q.add("b").await })
        };
        assert_eq!(q.next().await, Some("a"));
        let worker = {
            let q = q.clone();
            tokio::spawn(async move { q.next().await })
        };
        // "b" got in once "a" left; the worker takes it.
        assert_eq!(worker.await.unwrap(), Some("b"));
        adder.await.unwrap().unwrap();
        let worker = {
            let q = q.clone();
            tokio::spawn(async move { q.next().await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        q.shut_down();
        assert_eq!(worker.await.unwrap(), None);
        assert_eq!(q.try_add("c"), Err(QueueError::ShutDown));
    }
}
