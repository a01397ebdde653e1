//! The scheduling queue: the pending pods waiting for a decision, as
//! kube-scheduler's `PriorityQueue`, in three places.
//!
//! - **active**: ready to be tried, highest `spec.priority` first, then
//!   the one queued longest ago; [`SchedulingQueue::pop`] takes from here.
//! - **backoff**: tried and failed, waiting out a back-off of
//!   `initial_backoff * 2^(attempts-1)`, capped at `max_backoff`; each
//!   moves to active when its back-off ends (`pop` wakes for the earliest).
//! - **unschedulable**: fit nowhere, waiting for the cluster to change
//!   ([`SchedulingQueue::on_cluster_event`] moves them all to backoff, or
//!   to active when their back-off has passed already) or, failing that,
//!   for `max_in_unschedulable`, after which they are tried again anyway.
//!
//! A popped pod is *in flight* until the loop reports its outcome:
//! [`done`](SchedulingQueue::done) (bound: forgotten),
//! [`requeue_error`](SchedulingQueue::requeue_error) (to backoff) or
//! [`requeue_unschedulable`](SchedulingQueue::requeue_unschedulable).
//! The last goes to backoff instead of unschedulable when a cluster event
//! arrived while the pod was in flight (kube's `moveRequestCycle`): the
//! decision was made on a cluster that has changed since, and parking the
//! pod until the next event could park it for good.
//!
//! Updates and deletes of a pod in flight are kept with its in-flight
//! record and applied when it comes back: a deleted pod is dropped, an
//! updated one comes back as updated.
//!
//! Every pod has one explicit [`Place`]; [`Queues`] is the I/O-free state
//! (every method takes `now`), [`SchedulingQueue`] shares it between the
//! scheduling loop and the informer-event task behind a mutex, with a
//! [`Notify`] to wake `pop`. The queue is bounded: past `capacity` pods
//! (in flight included) [`SchedulingQueue::add`] refuses a new pod with
//! [`QueueFull`]; a pod already counted always finds its way back.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use skiff_client::runtime::reflector::ObjectKey;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How the queue behaves.
#[derive(Clone, Debug)]
pub struct QueueConfig {
    /// The back-off after the first failed attempt; it doubles per attempt.
    pub initial_backoff: Duration,
    /// The longest back-off.
    pub max_backoff: Duration,
    /// How long a pod that fit nowhere waits for a cluster event before it
    /// is tried again anyway (an event the queue was not told of, such as
    /// a change the filters read but no informer reports, must not leave
    /// it pending for ever).
    pub max_in_unschedulable: Duration,
    /// Pods the queue holds at most, in flight included.
    pub capacity: usize,
}

impl Default for QueueConfig {
    /// kube-scheduler's defaults: 1 s doubling to 10 s, 5 minutes in
    /// unschedulable; room for 100,000 pending pods.
    fn default() -> Self {
        QueueConfig {
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(10),
            max_in_unschedulable: Duration::from_secs(5 * 60),
            capacity: 100_000,
        }
    }
}

/// A new pod was refused: the queue holds `capacity` pods.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the scheduling queue is full ({capacity} pods); pod {key} was not queued")]
pub struct QueueFull {
    /// The pod refused.
    pub key: ObjectKey,
    /// The queue's capacity.
    pub capacity: usize,
}

/// A pod as the queue hands it out and takes it back.
#[derive(Clone, Debug)]
pub struct QueuedPod {
    /// The latest version of the pod the queue was given.
    pub pod: Arc<Pod>,
    /// Its namespace and name.
    pub key: ObjectKey,
    /// Times it was popped, this pop included: the back-off doubles per attempt.
    pub attempts: u32,
    /// When the queue first saw it: end-to-end scheduling latency starts here.
    pub first_queued: Instant,
    /// When it last entered the queue (first add or requeue): among pods
    /// of one priority, the one queued longest ago goes first.
    pub queued: Instant,
}

impl QueuedPod {
    /// `spec.priority`, 0 when unset (the priority admission sets it on
    /// every pod it admits).
    pub fn priority(&self) -> i32 {
        priority_of(&self.pod)
    }
}

/// A change in the cluster that may make an unschedulable pod fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterEvent {
    /// A node joined.
    NodeAdded,
    /// A node's capacity, labels, taints or conditions changed.
    NodeChanged,
    /// A pod was bound to a node (pod affinity may now be met).
    AssignedPodAdded,
    /// A pod was deleted, freeing room (and anti-affinity terms).
    PodDeleted,
    /// An assigned pod changed, e.g. its labels (affinity terms).
    PodChanged,
}

impl ClusterEvent {
    /// A name for logs and metrics.
    pub fn label(self) -> &'static str {
        match self {
            ClusterEvent::NodeAdded => "NodeAdded",
            ClusterEvent::NodeChanged => "NodeChanged",
            ClusterEvent::AssignedPodAdded => "AssignedPodAdded",
            ClusterEvent::PodDeleted => "PodDeleted",
            ClusterEvent::PodChanged => "PodChanged",
        }
    }
}

/// How many pods wait where.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueLengths {
    /// Ready to be popped.
    pub active: usize,
    /// Waiting out a back-off.
    pub backoff: usize,
    /// Waiting for a cluster event.
    pub unschedulable: usize,
    /// Popped, outcome not yet reported.
    pub in_flight: usize,
}

/// Where a pod is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// In the active queue under this order.
    Active(ActiveOrder),
    /// In backoff until the instant (and a sequence number, for uniqueness).
    Backoff(Instant, u64),
    /// In the unschedulable pool since the instant.
    Unschedulable(Instant, u64),
}

/// The order of the active queue: highest priority, then queued longest
/// ago, then first added.
pub type ActiveOrder = (Reverse<i32>, Instant, u64);

/// A pod waiting in the queue.
struct Waiting {
    pod: QueuedPod,
    place: Place,
}

/// A popped pod, and what happened to it while it was out.
struct InFlight {
    /// The scheduling cycle it was popped in.
    cycle: u64,
    /// Its newest version, if it was updated meanwhile.
    update: Option<Arc<Pod>>,
    /// It was deleted meanwhile: it is dropped when it comes back.
    deleted: bool,
}

/// The queue's state, free of I/O and clocks: every method that depends
/// on time takes `now`.
pub struct Queues {
    config: QueueConfig,
    waiting: HashMap<ObjectKey, Waiting>,
    active: BTreeMap<ActiveOrder, ObjectKey>,
    backoff: BTreeMap<(Instant, u64), ObjectKey>,
    unschedulable: BTreeMap<(Instant, u64), ObjectKey>,
    in_flight: HashMap<ObjectKey, InFlight>,
    /// Pops so far; a popped pod remembers the cycle it was popped in.
    scheduling_cycle: u64,
    /// The scheduling cycle current at the last cluster event: a pod
    /// popped in it or before saw a cluster that has changed since.
    move_request_cycle: u64,
    /// Tie-breaker for the ordered maps.
    seq: u64,
    closed: bool,
}

fn priority_of(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// Whether an update may change the scheduling decision: anything but the
/// status and the bookkeeping metadata.
fn changes_decision(old: &Pod, new: &Pod) -> bool {
    old.spec != new.spec
        || old.metadata.labels != new.metadata.labels
        || old.metadata.annotations != new.metadata.annotations
}

impl Queues {
    /// An empty queue.
    pub fn new(config: QueueConfig) -> Queues {
        Queues {
            config,
            waiting: HashMap::new(),
            active: BTreeMap::new(),
            backoff: BTreeMap::new(),
            unschedulable: BTreeMap::new(),
            in_flight: HashMap::new(),
            scheduling_cycle: 0,
            move_request_cycle: 0,
            seq: 0,
            closed: false,
        }
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// The back-off after `attempts` attempts.
    pub fn backoff_of(&self, attempts: u32) -> Duration {
        let doublings = attempts.saturating_sub(1).min(31);
        self.config.initial_backoff.saturating_mul(1u32 << doublings).min(self.config.max_backoff)
    }

    /// Where `key` waits, if it does.
    pub fn place(&self, key: &ObjectKey) -> Option<Place> {
        self.waiting.get(key).map(|w| w.place)
    }

    /// How many pods wait where.
    pub fn lengths(&self) -> QueueLengths {
        QueueLengths {
            active: self.active.len(),
            backoff: self.backoff.len(),
            unschedulable: self.unschedulable.len(),
            in_flight: self.in_flight.len(),
        }
    }

    fn total(&self) -> usize {
        self.waiting.len() + self.in_flight.len()
    }

    /// Puts `pod` at `place`, indexing it.
    fn put(&mut self, pod: QueuedPod, place: Place) {
        let key = pod.key.clone();
        match place {
            Place::Active(order) => self.active.insert(order, key.clone()),
            Place::Backoff(at, seq) => self.backoff.insert((at, seq), key.clone()),
            Place::Unschedulable(at, seq) => self.unschedulable.insert((at, seq), key.clone()),
        };
        self.waiting.insert(key, Waiting { pod, place });
    }

    /// Takes `key` out of wherever it waits.
    fn take(&mut self, key: &ObjectKey) -> Option<QueuedPod> {
        let waiting = self.waiting.remove(key)?;
        match waiting.place {
            Place::Active(order) => self.active.remove(&order),
            Place::Backoff(at, seq) => self.backoff.remove(&(at, seq)),
            Place::Unschedulable(at, seq) => self.unschedulable.remove(&(at, seq)),
        };
        Some(waiting.pod)
    }

    /// To active, as queued now.
    fn activate(&mut self, mut pod: QueuedPod, now: Instant) {
        pod.queued = now;
        let order = (Reverse(pod.priority()), now, self.next_seq());
        self.put(pod, Place::Active(order));
    }

    /// To backoff until its back-off from `pod.queued` ends, or straight to
    /// active when it has ended already.
    fn back_off(&mut self, pod: QueuedPod, now: Instant) {
        let until = pod.queued + self.backoff_of(pod.attempts);
        if until <= now {
            self.activate(pod, now);
        } else {
            let seq = self.next_seq();
            self.put(pod, Place::Backoff(until, seq));
        }
    }

    /// A pending pod, new or updated. A new one goes to active (refused
    /// past capacity); a waiting one is replaced where it is, except that
    /// an unschedulable one whose spec or labels changed goes to active;
    /// one in flight comes back as this version.
    pub fn add(&mut self, pod: Arc<Pod>, now: Instant) -> Result<(), QueueFull> {
        let key = ObjectKey::of(pod.as_ref());
        if let Some(flight) = self.in_flight.get_mut(&key) {
            flight.update = Some(pod);
            flight.deleted = false;
            return Ok(());
        }
        if let Some(waiting) = self.waiting.get_mut(&key) {
            let moves = matches!(waiting.place, Place::Unschedulable(..)) && changes_decision(&waiting.pod.pod, &pod);
            waiting.pod.pod = pod;
            if moves {
                if let Some(queued) = self.take(&key) {
                    self.activate(queued, now);
                }
            }
            return Ok(());
        }
        if self.total() >= self.config.capacity {
            return Err(QueueFull { key, capacity: self.config.capacity });
        }
        self.activate(QueuedPod { pod, key, attempts: 0, first_queued: now, queued: now }, now);
        Ok(())
    }

    /// The pod is gone (deleted, or bound by someone else).
    pub fn delete(&mut self, key: &ObjectKey) {
        if let Some(flight) = self.in_flight.get_mut(key) {
            flight.deleted = true;
            flight.update = None;
            return;
        }
        self.take(key);
    }

    /// Moves what is due: backoffs that ended to active, pods unschedulable
    /// for `max_in_unschedulable` to backoff or active.
    pub fn flush(&mut self, now: Instant) {
        while let Some(entry) = self.backoff.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let key = entry.get().clone();
            if let Some(pod) = self.take(&key) {
                self.activate(pod, now);
            }
        }
        while let Some(entry) = self.unschedulable.first_entry() {
            if entry.key().0 + self.config.max_in_unschedulable > now {
                break;
            }
            let key = entry.get().clone();
            if let Some(pod) = self.take(&key) {
                self.back_off(pod, now);
            }
        }
    }

    /// When the next flush has something to move, if ever.
    pub fn next_due(&self) -> Option<Instant> {
        let backoff = self.backoff.keys().next().map(|(at, _)| *at);
        let unschedulable = self.unschedulable.keys().next().map(|(at, _)| *at + self.config.max_in_unschedulable);
        backoff.into_iter().chain(unschedulable).min()
    }

    /// The first active pod, now in flight; `None` when none is active.
    pub fn pop(&mut self, now: Instant) -> Option<QueuedPod> {
        self.flush(now);
        let (_, key) = self.active.pop_first()?;
        let mut pod = self.waiting.remove(&key)?.pod;
        self.scheduling_cycle += 1;
        pod.attempts += 1;
        self.in_flight.insert(key, InFlight { cycle: self.scheduling_cycle, update: None, deleted: false });
        Some(pod)
    }

    /// Ends `pod`'s flight; `None` if it was deleted meanwhile. Also says
    /// whether it was updated in a way that may change the decision.
    fn land(&mut self, mut pod: QueuedPod) -> Option<(QueuedPod, u64, bool)> {
        let flight = self.in_flight.remove(&pod.key)?;
        if flight.deleted {
            return None;
        }
        let mut changed = false;
        if let Some(update) = flight.update {
            changed = changes_decision(&pod.pod, &update);
            pod.pod = update;
        }
        Some((pod, flight.cycle, changed))
    }

    /// `pod` fit nowhere: to unschedulable, or to backoff if the cluster
    /// or the pod changed while it was in flight.
    pub fn requeue_unschedulable(&mut self, pod: QueuedPod, now: Instant) {
        let Some((mut pod, cycle, changed)) = self.land(pod) else { return };
        pod.queued = now;
        if changed || self.move_request_cycle >= cycle {
            self.back_off(pod, now);
        } else {
            let seq = self.next_seq();
            self.put(pod, Place::Unschedulable(now, seq));
        }
    }

    /// Scheduling `pod` failed for another reason (a failed bind): to backoff.
    pub fn requeue_error(&mut self, pod: QueuedPod, now: Instant) {
        let Some((mut pod, _, _)) = self.land(pod) else { return };
        pod.queued = now;
        self.back_off(pod, now);
    }

    /// `key` is scheduled: forgotten.
    pub fn done(&mut self, key: &ObjectKey) {
        self.in_flight.remove(key);
    }

    /// The cluster changed: every unschedulable pod to backoff (or active
    /// if its back-off has passed), and pods in flight will not be parked.
    pub fn on_cluster_event(&mut self, _event: ClusterEvent, now: Instant) {
        self.move_request_cycle = self.scheduling_cycle;
        let keys: Vec<ObjectKey> = self.unschedulable.values().cloned().collect();
        for key in keys {
            if let Some(pod) = self.take(&key) {
                self.back_off(pod, now);
            }
        }
    }
}

/// The queue shared by the scheduling loop and the informer-event task.
#[derive(Clone)]
pub struct SchedulingQueue {
    shared: Arc<Shared>,
}

struct Shared {
    queues: Mutex<Queues>,
    /// Woken when a pod becomes active or the queue shuts down.
    changed: Notify,
}

impl SchedulingQueue {
    /// An empty queue.
    pub fn new(config: QueueConfig) -> SchedulingQueue {
        SchedulingQueue { shared: Arc::new(Shared { queues: Mutex::new(Queues::new(config)), changed: Notify::new() }) }
    }

    fn lock(&self) -> MutexGuard<'_, Queues> {
        // A panic while holding the lock leaves plain data behind; go on.
        self.shared.queues.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// See [`Queues::add`].
    pub fn add(&self, pod: Arc<Pod>) -> Result<(), QueueFull> {
        let result = self.lock().add(pod, Instant::now());
        self.shared.changed.notify_waiters();
        result
    }

    /// See [`Queues::delete`].
    pub fn delete(&self, key: &ObjectKey) {
        self.lock().delete(key);
    }

    /// The next pod to try: highest priority first, then queued longest
    /// ago. Waits for one (and for back-offs to end); `None` once the
    /// queue is shut down.
    pub async fn pop(&self) -> Option<QueuedPod> {
        loop {
            let changed = self.shared.changed.notified();
            tokio::pin!(changed);
            // Registered before the state is read, so a wake-up between
            // the read and the wait is not lost.
            changed.as_mut().enable();
            let due = {
                let mut queues = self.lock();
                if queues.closed {
                    return None;
                }
                if let Some(pod) = queues.pop(Instant::now()) {
                    return Some(pod);
                }
                queues.next_due()
            };
            match due {
                Some(at) => {
                    tokio::select! {
                        () = &mut changed => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
                None => changed.await,
            }
        }
    }

    /// See [`Queues::requeue_unschedulable`].
    pub fn requeue_unschedulable(&self, pod: QueuedPod) {
        self.lock().requeue_unschedulable(pod, Instant::now());
        self.shared.changed.notify_waiters();
    }

    /// See [`Queues::requeue_error`].
    pub fn requeue_error(&self, pod: QueuedPod) {
        self.lock().requeue_error(pod, Instant::now());
        self.shared.changed.notify_waiters();
    }

    /// See [`Queues::done`].
    pub fn done(&self, key: &ObjectKey) {
        self.lock().done(key);
    }

    /// See [`Queues::on_cluster_event`].
    pub fn on_cluster_event(&self, event: ClusterEvent) {
        self.lock().on_cluster_event(event, Instant::now());
        self.shared.changed.notify_waiters();
    }

    /// How many pods wait where (after moving what is due).
    pub fn lengths(&self) -> QueueLengths {
        let mut queues = self.lock();
        queues.flush(Instant::now());
        queues.lengths()
    }

    /// Ends the queue: every `pop`, waiting or future, returns `None`.
    pub fn shut_down(&self) {
        self.lock().closed = true;
        self.shared.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests;
