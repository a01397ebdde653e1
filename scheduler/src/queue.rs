//! The scheduling queue: the pending pods waiting for a decision, as
//! kube-scheduler's `PriorityQueue`, in three places.
//!
//! - **active**: ready to be tried, highest `spec.priority` first, then
//!   the one queued longest ago; [`SchedulingQueue::pop`] takes from here.
//! - **backoff**: tried and failed, waiting out a back-off of
//!   `initial_backoff * 2^(attempts-1)`, capped at `max_backoff`; each
//!   moves to active when its back-off ends (`pop` wakes for the earliest).
//! - **unschedulable**: fit nowhere, waiting for the cluster to change
//!   in a way that may help it, or, failing that, for
//!   `max_in_unschedulable` (or its [`Hint`]'s shorter `recheck`), after
//!   which it is tried again anyway. As kube-scheduler's queueing hints,
//!   each pod's [`Hint`] says which [`ClusterEvent`]s may make it fit (its
//!   filters' reasons decide) and, for a pod waiting for its victims to
//!   leave the node it preempted on, that only events on that node count;
//!   [`SchedulingQueue::on_cluster_event`] moves the pods an event may help
//!   to backoff, or to active when their back-off has passed already.
//!
//! A popped pod is *in flight* until the loop reports its outcome:
//! [`done`](SchedulingQueue::done) (bound: forgotten),
//! [`requeue_error`](SchedulingQueue::requeue_error) (to backoff) or
//! [`requeue_unschedulable`](SchedulingQueue::requeue_unschedulable).
//! The last goes to backoff instead of unschedulable when a cluster event
//! its hint admits arrived while the pod was in flight (kube's
//! `moveRequestCycle`, per kind of event and node): the decision was made
//! on a cluster that has changed since, and parking the pod until the
//! next event could park it for good.
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
use std::collections::{BTreeMap, HashMap, HashSet};
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
    /// A node left (topology spread's domains may change).
    NodeDeleted,
    /// A pod was bound to a node (pod affinity may now be met).
    AssignedPodAdded,
    /// A pod was deleted, freeing room (and anti-affinity terms).
    PodDeleted,
    /// An assigned pod's labels or spec changed (affinity terms).
    PodChanged,
}

/// Kinds of [`ClusterEvent`] in [`ClusterEvent::KINDS`].
const KINDS: usize = 6;

/// A set of kinds of [`ClusterEvent`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Events(u8);

impl Events {
    /// No event.
    pub const NONE: Events = Events(0);
    /// Every event.
    pub const ALL: Events = Events((1 << KINDS) - 1);

    /// These and `event`.
    pub const fn with(self, event: ClusterEvent) -> Events {
        Events(self.0 | 1 << event as u8)
    }

    /// These and `other`.
    pub const fn union(self, other: Events) -> Events {
        Events(self.0 | other.0)
    }

    /// Whether `event` is one of these.
    pub const fn contains(self, event: ClusterEvent) -> bool {
        self.0 & 1 << event as u8 != 0
    }

    fn kinds(self) -> impl Iterator<Item = ClusterEvent> {
        ClusterEvent::KINDS.into_iter().filter(move |e| self.contains(*e))
    }
}

/// What may make a pod that fit nowhere fit: the kinds of event, and the
/// node they must happen on. A pod waiting for its victims to leave
/// holds their room on that node and will go there: events elsewhere do
/// not concern it (a node joining always may).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hint {
    /// The kinds of event that may help.
    pub events: Events,
    /// Only events on this node, if set (a node joining aside).
    pub node: Option<String>,
    /// Tried again after this long without such an event, if shorter than
    /// `max_in_unschedulable`: for what no event may report, such as a
    /// victim's deletion that was sent but never shows.
    pub recheck: Option<Duration>,
}

impl Default for Hint {
    /// Every event anywhere helps: what the queue assumes when told nothing.
    fn default() -> Self {
        Hint { events: Events::ALL, node: None, recheck: None }
    }
}

impl Hint {
    /// A pod that failed for reasons these events may remove.
    pub fn events(events: Events) -> Hint {
        Hint { events, ..Hint::default() }
    }

    /// A pod holding room on `node` while pods it preempted there leave:
    /// their deletions, or the node's, concern it, and `events` that
    /// happen there or a node joining; after `recheck` it is tried anyway.
    pub fn holding_room(events: Events, node: String, recheck: Duration) -> Hint {
        let events = events.with(ClusterEvent::PodDeleted).with(ClusterEvent::NodeDeleted);
        Hint { events, node: Some(node), recheck: Some(recheck) }
    }

    /// Whether `event` on `node` (`None`: no node, or unknown) may help.
    pub fn admits(&self, event: ClusterEvent, node: Option<&str>) -> bool {
        self.events.contains(event)
            && (event == ClusterEvent::NodeAdded
                || node.is_none()
                || self.node.is_none()
                || self.node.as_deref() == node)
    }
}

impl ClusterEvent {
    /// Every kind, in the order of their bits in [`Events`].
    pub const KINDS: [ClusterEvent; KINDS] = [
        ClusterEvent::NodeAdded,
        ClusterEvent::NodeChanged,
        ClusterEvent::NodeDeleted,
        ClusterEvent::AssignedPodAdded,
        ClusterEvent::PodDeleted,
        ClusterEvent::PodChanged,
    ];

    /// A name for logs and metrics.
    pub fn label(self) -> &'static str {
        match self {
            ClusterEvent::NodeAdded => "NodeAdded",
            ClusterEvent::NodeChanged => "NodeChanged",
            ClusterEvent::NodeDeleted => "NodeDeleted",
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
    /// In the unschedulable pool until the instant, when it is tried
    /// again without an event.
    Unschedulable(Instant, u64),
}

/// The order of the active queue: highest priority, then queued longest
/// ago, then first added.
pub type ActiveOrder = (Reverse<i32>, Instant, u64);

/// A pod waiting in the queue.
struct Waiting {
    pod: QueuedPod,
    place: Place,
    /// What may help it, while unschedulable.
    hint: Option<Hint>,
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
    /// Unschedulable pods whose hint names no node, by the kinds of event
    /// their hint admits (a pod in the set of each).
    anywhere: [HashSet<ObjectKey>; KINDS],
    /// Unschedulable pods waiting for events on one node, by node.
    on_node: HashMap<String, HashSet<ObjectKey>>,
    /// Pops so far; a popped pod remembers the cycle it was popped in.
    scheduling_cycle: u64,
    /// The scheduling cycle current at the last cluster event of each
    /// kind: a pod popped in it or before saw a cluster that has changed
    /// since. Also the last of each kind with no node, and by node.
    moved: [u64; KINDS],
    moved_unplaced: [u64; KINDS],
    moved_on: HashMap<String, [u64; KINDS]>,
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
            anywhere: Default::default(),
            on_node: HashMap::new(),
            scheduling_cycle: 0,
            moved: [0; KINDS],
            moved_unplaced: [0; KINDS],
            moved_on: HashMap::new(),
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

    /// Puts `pod` at `place` (with its hint when unschedulable), indexing it.
    fn put(&mut self, pod: QueuedPod, place: Place, hint: Option<Hint>) {
        let key = pod.key.clone();
        match place {
            Place::Active(order) => self.active.insert(order, key.clone()),
            Place::Backoff(at, seq) => self.backoff.insert((at, seq), key.clone()),
            Place::Unschedulable(at, seq) => {
                match hint.as_ref().map(|h| (h.events, h.node.clone())) {
                    Some((_, Some(node))) => {
                        self.on_node.entry(node).or_default().insert(key.clone());
                    }
                    Some((events, None)) => {
                        for kind in events.kinds() {
                            self.anywhere[kind as usize].insert(key.clone());
                        }
                    }
                    None => {}
                }
                self.unschedulable.insert((at, seq), key.clone())
            }
        };
        self.waiting.insert(key, Waiting { pod, place, hint });
    }

    /// Takes `key` out of wherever it waits.
    fn take(&mut self, key: &ObjectKey) -> Option<QueuedPod> {
        let waiting = self.waiting.remove(key)?;
        match waiting.place {
            Place::Active(order) => self.active.remove(&order),
            Place::Backoff(at, seq) => self.backoff.remove(&(at, seq)),
            Place::Unschedulable(at, seq) => {
                match waiting.hint.map(|h| (h.events, h.node)) {
                    Some((_, Some(node))) => {
                        if let Some(keys) = self.on_node.get_mut(&node) {
                            keys.remove(key);
                            if keys.is_empty() {
                                self.on_node.remove(&node);
                            }
                        }
                    }
                    Some((events, None)) => {
                        for kind in events.kinds() {
                            self.anywhere[kind as usize].remove(key);
                        }
                    }
                    None => {}
                }
                self.unschedulable.remove(&(at, seq))
            }
        };
        Some(waiting.pod)
    }

    /// To active, as queued now.
    fn activate(&mut self, mut pod: QueuedPod, now: Instant) {
        pod.queued = now;
        let order = (Reverse(pod.priority()), now, self.next_seq());
        self.put(pod, Place::Active(order), None);
    }

    /// To backoff until its back-off from `pod.queued` ends, or straight to
    /// active when it has ended already.
    fn back_off(&mut self, pod: QueuedPod, now: Instant) {
        let until = pod.queued + self.backoff_of(pod.attempts);
        if until <= now {
            self.activate(pod, now);
        } else {
            let seq = self.next_seq();
            self.put(pod, Place::Backoff(until, seq), None);
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
    /// for `max_in_unschedulable` (or their hint's `recheck`) to backoff or
    /// active.
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
            if entry.key().0 > now {
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
        let unschedulable = self.unschedulable.keys().next().map(|(at, _)| *at);
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

    /// `pod` fit nowhere, and only what `hint` admits may help: to
    /// unschedulable, or to backoff if the pod changed, or such an event
    /// came, while it was in flight.
    pub fn requeue_unschedulable(&mut self, pod: QueuedPod, hint: Hint, now: Instant) {
        let Some((mut pod, cycle, changed)) = self.land(pod) else { return };
        pod.queued = now;
        if changed || self.moved_since(&hint, cycle) {
            self.back_off(pod, now);
        } else {
            let wait =
                hint.recheck.map_or(self.config.max_in_unschedulable, |r| r.min(self.config.max_in_unschedulable));
            let seq = self.next_seq();
            self.put(pod, Place::Unschedulable(now + wait, seq), Some(hint));
        }
    }

    /// Whether an event `hint` admits came in scheduling cycle `cycle` or later.
    fn moved_since(&self, hint: &Hint, cycle: u64) -> bool {
        let on = hint.node.as_ref().and_then(|n| self.moved_on.get(n));
        hint.events.kinds().any(|kind| {
            let k = kind as usize;
            match &hint.node {
                Some(_) if kind != ClusterEvent::NodeAdded => {
                    self.moved_unplaced[k] >= cycle || on.is_some_and(|on| on[k] >= cycle)
                }
                _ => self.moved[k] >= cycle,
            }
        })
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

    /// The cluster changed by `event` on `node` (`None`: on no node in
    /// particular): the unschedulable pods it may help to backoff (or
    /// active if their back-off has passed), and pods in flight it may
    /// help will not be parked.
    pub fn on_cluster_event(&mut self, event: ClusterEvent, node: Option<&str>, now: Instant) {
        let k = event as usize;
        self.moved[k] = self.scheduling_cycle;
        match node {
            Some(node) => match self.moved_on.get_mut(node) {
                Some(on) => on[k] = self.scheduling_cycle,
                None => {
                    let mut on = [0; KINDS];
                    on[k] = self.scheduling_cycle;
                    self.moved_on.insert(node.to_string(), on);
                }
            },
            None => self.moved_unplaced[k] = self.scheduling_cycle,
        }
        if event == ClusterEvent::NodeDeleted {
            // Nothing more happens there: its entry goes, and the deletion
            // counts as on no node, for the pods in flight that waited on it.
            self.moved_on.remove(node.unwrap_or_default());
            self.moved_unplaced[k] = self.scheduling_cycle;
        }
        // Those whose hint names no node are indexed by kind; those waiting
        // on a node are few per node.
        let on_node: Vec<&ObjectKey> = match node {
            Some(node) if event != ClusterEvent::NodeAdded => self.on_node.get(node).into_iter().flatten().collect(),
            _ => self.on_node.values().flatten().collect(),
        };
        let moving: Vec<ObjectKey> = on_node
            .into_iter()
            .filter(|key| self.waiting.get(*key).and_then(|w| w.hint.as_ref()).is_some_and(|h| h.admits(event, node)))
            .chain(&self.anywhere[k])
            .cloned()
            .collect();
        for key in moving {
            if let Some(pod) = self.take(&key) {
                self.back_off(pod, now);
            }
        }
    }

    /// Every unschedulable pod to backoff (or active), and no pod in
    /// flight parked: after a resync, which may have missed any change.
    pub fn move_all(&mut self, now: Instant) {
        self.moved = [self.scheduling_cycle; KINDS];
        self.moved_unplaced = [self.scheduling_cycle; KINDS];
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
    pub fn requeue_unschedulable(&self, pod: QueuedPod, hint: Hint) {
        self.lock().requeue_unschedulable(pod, hint, Instant::now());
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
    pub fn on_cluster_event(&self, event: ClusterEvent, node: Option<&str>) {
        self.lock().on_cluster_event(event, node, Instant::now());
        self.shared.changed.notify_waiters();
    }

    /// See [`Queues::move_all`].
    pub fn move_all(&self) {
        self.lock().move_all(Instant::now());
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
