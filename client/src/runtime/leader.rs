//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's
//! `leaderelection` package does it.
//!
//! Candidates read the Lease and write it back carrying the
//! resourceVersion they read, so every write is a compare-and-swap: of two
//! racing candidates one gets `Conflict` and stays a follower. The record
//! is kept as Kubernetes keeps it: `holderIdentity`,
//! `leaseDurationSeconds`, `acquireTime` (set when the holder changes),
//! `renewTime` (every renewal) and `leaseTransitions` (+1 per change of
//! holder).
//!
//! Time rules (why two leaders never act at once):
//! - Expiry is judged by the candidate's own monotonic clock: a held lease
//!   is free only once the record has not changed for `lease_duration`
//!   since *this candidate* last saw it change. Remote timestamps are
//!   never compared with the local clock.
//! - The leader counts its `renew_deadline` from the moment it *sent* its
//!   last successful renewal, which is before any follower could have seen
//!   it. If it cannot renew by then it steps down (cancels the shutdown
//!   its work runs under). Since `renew_deadline < lease_duration`, that
//!   happens before any follower may take the lease over.
//! - On a clean stop the leader first stops its work, then clears
//!   `holderIdentity` so a successor takes over at its next retry instead
//!   of waiting a whole lease duration.
//!
//! The elector is an explicit [`State`] advanced by
//! [`LeaderElector::step`] (one read-and-maybe-write), tested with paused
//! time against [`MemoryLeaseStore`]; [`LeaderElector::run`] adds the
//! timers and runs the caller's work while leading, on a child
//! [`Shutdown`] it stops (cancels, then waits for) on losing the lease.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use rand::Rng;
use skiff_api::{ApiError, Reason};
use skiff_shutdown::Shutdown;
use tokio::sync::watch;
use tokio::time::Instant;

use super::api::Api;
use crate::resources::{Client, ClientError};

/// Which lease, who we are, and the timings (Kubernetes' names and
/// defaults).
#[derive(Clone, Debug)]
pub struct LeaderElectionConfig {
    /// The Lease's namespace (`kube-system` for the control plane).
    pub namespace: String,
    /// The Lease's name (`skiff-controller-manager`).
    pub name: String,
    /// This candidate's identity, unique among candidates (host name and
    /// a random suffix).
    pub identity: String,
    /// How long followers wait, after last seeing the lease change, before
    /// taking it over. Default 15s.
    pub lease_duration: Duration,
    /// How long a leader keeps acting without a successful renewal.
    /// Default 10s; must be less than `lease_duration`.
    pub renew_deadline: Duration,
    /// How often candidates try to acquire and leaders renew. Default 2s.
    pub retry_period: Duration,
    /// Clear the holder when stopping cleanly, so a successor need not
    /// wait for the lease to expire. Default true.
    pub release_on_cancel: bool,
}

impl LeaderElectionConfig {
    /// The lease `namespace/name` for `identity`, with the default timings.
    pub fn new(namespace: &str, name: &str, identity: &str) -> LeaderElectionConfig {
        LeaderElectionConfig {
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            release_on_cancel: true,
        }
    }
}

/// Where the Lease lives: the apiserver ([`ApiLeaseStore`]) or memory
/// ([`MemoryLeaseStore`], for tests).
pub trait LeaseStore: Send + Sync + 'static {
    /// The Lease, or `None` if it does not exist.
    fn get(&self) -> BoxFuture<'_, Result<Option<Lease>, ClientError>>;
    /// Creates the Lease (`AlreadyExists` if another candidate was first).
    fn create(&self, lease: Lease) -> BoxFuture<'_, Result<Lease, ClientError>>;
    /// Replaces the Lease if its resourceVersion is still the one given
    /// (`Conflict` otherwise).
    fn replace(&self, lease: Lease) -> BoxFuture<'_, Result<Lease, ClientError>>;
}

/// The Lease `namespace/name` on the apiservers.
#[derive(Clone, Debug)]
pub struct ApiLeaseStore {
    api: Api<Lease>,
    name: String,
}

impl ApiLeaseStore {
    /// The Lease `namespace/name` through `client`.
    pub fn new(client: Client, namespace: &str, name: &str) -> ApiLeaseStore {
        ApiLeaseStore { api: Api::namespaced(client, namespace), name: name.to_string() }
    }
}

impl LeaseStore for ApiLeaseStore {
    fn get(&self) -> BoxFuture<'_, Result<Option<Lease>, ClientError>> {
        self.api.get_opt(&self.name).boxed()
    }

    fn create(&self, lease: Lease) -> BoxFuture<'_, Result<Lease, ClientError>> {
        async move { self.api.create(&lease).await }.boxed()
    }

    fn replace(&self, lease: Lease) -> BoxFuture<'_, Result<Lease, ClientError>> {
        async move { self.api.replace(&lease).await }.boxed()
    }
}

/// An in-memory Lease with compare-and-swap. [`view`](MemoryLeaseStore::view)s
/// share the Lease but each can be cut off on its own, as one candidate's
/// network can fail.
#[derive(Clone, Debug, Default)]
pub struct MemoryLeaseStore {
    shared: Arc<Mutex<MemoryLease>>,
    unreachable: Arc<AtomicBool>,
}

#[derive(Debug, Default)]
struct MemoryLease {
    lease: Option<Lease>,
    revision: u64,
    /// Writes to fail with `Conflict` regardless, to stage a lost race.
    conflicts: u32,
}

impl MemoryLeaseStore {
    /// No Lease yet.
    pub fn new() -> MemoryLeaseStore {
        MemoryLeaseStore::default()
    }

    /// Another handle on the same Lease with its own reachability.
    pub fn view(&self) -> MemoryLeaseStore {
        MemoryLeaseStore { shared: self.shared.clone(), unreachable: Arc::default() }
    }

    /// Cuts this handle off (every call fails as unreachable) or restores it.
    pub fn set_unreachable(&self, unreachable: bool) {
        self.unreachable.store(unreachable, Ordering::SeqCst);
    }

    /// Makes the next write fail with `Conflict`, as if another candidate
    /// had written first.
    pub fn conflict_next_write(&self) {
        self.lock().conflicts += 1;
    }

    /// The Lease as stored.
    pub fn lease(&self) -> Option<Lease> {
        self.lock().lease.clone()
    }

    /// Stores `lease` unconditionally (a new resourceVersion), as another
    /// writer would.
    pub fn put(&self, lease: Lease) -> Lease {
        let mut m = self.lock();
        m.store(lease)
    }

    fn lock(&self) -> MutexGuard<'_, MemoryLease> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn check(&self) -> Result<(), ClientError> {
        if self.unreachable.load(Ordering::SeqCst) {
            return Err(ClientError::Unreachable("cut off".into()));
        }
        Ok(())
    }
}

impl MemoryLease {
    fn store(&mut self, mut lease: Lease) -> Lease {
        self.revision += 1;
        lease.metadata.resource_version = Some(self.revision.to_string());
        self.lease = Some(lease.clone());
        lease
    }

    fn conflict(&mut self) -> Option<ClientError> {
        if self.conflicts > 0 {
            self.conflicts -= 1;
            return Some(ClientError::Api(ApiError::new(Reason::Conflict, "lost the race")));
        }
        None
    }
}

impl LeaseStore for MemoryLeaseStore {
    fn get(&self) -> BoxFuture<'_, Result<Option<Lease>, ClientError>> {
        let result = self.check().map(|_| self.lease());
        async move { result }.boxed()
    }

    fn create(&self, lease: Lease) -> BoxFuture<'_, Result<Lease, ClientError>> {
        let result = self.check().and_then(|_| {
            let mut m = self.lock();
            if let Some(e) = m.conflict() {
                return Err(e);
            }
            if m.lease.is_some() {
                return Err(ClientError::Api(ApiError::new(Reason::AlreadyExists, "lease exists")));
            }
            Ok(m.store(lease))
        });
        async move { result }.boxed()
    }

    fn replace(&self, lease: Lease) -> BoxFuture<'_, Result<Lease, ClientError>> {
        let result = self.check().and_then(|_| {
            let mut m = self.lock();
            if let Some(e) = m.conflict() {
                return Err(e);
            }
            let current = m.lease.as_ref().and_then(|l| l.metadata.resource_version.clone());
            if current.is_none() {
                return Err(ClientError::Api(ApiError::new(Reason::NotFound, "no lease")));
            }
            if current != lease.metadata.resource_version {
                return Err(ClientError::Api(ApiError::new(Reason::Conflict, "stale resourceVersion")));
            }
            Ok(m.store(lease))
        });
        async move { result }.boxed()
    }
}

/// How often a follower reads a lease another candidate holds, at most.
const OBSERVE_PERIOD: Duration = Duration::from_millis(500);

/// Whether this candidate leads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Not leading: trying to acquire every retry period.
    Following,
    /// Leading; `renewed_at` is when the last successful renewal (or the
    /// acquisition) was sent.
    Leading {
        /// When the last successful write was sent (local clock).
        renewed_at: Instant,
    },
}

/// What one [`LeaderElector::step`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Was following, now leads.
    Acquired,
    /// Leads and renewed.
    Renewed,
    /// Leads, could not renew, the renew deadline has not passed yet.
    RenewFailed,
    /// Led, and stepped down (deadline passed or another holder seen).
    Lost,
    /// Follows still (the lease is held and fresh, or the race was lost).
    Following,
}

/// The lease record as last seen, and when (local clock) it last changed.
#[derive(Clone, Debug)]
struct Observed {
    spec: LeaseSpec,
    resource_version: Option<String>,
    changed_at: Instant,
}

/// One candidate of one election.
pub struct LeaderElector<S = ApiLeaseStore> {
    store: S,
    config: LeaderElectionConfig,
    state: State,
    observed: Option<Observed>,
    leading: watch::Sender<bool>,
}

impl LeaderElector<ApiLeaseStore> {
    /// A candidate for the Lease `config.namespace/config.name` on the
    /// apiservers.
    pub fn new(client: Client, config: LeaderElectionConfig) -> LeaderElector<ApiLeaseStore> {
        let store = ApiLeaseStore::new(client, &config.namespace, &config.name);
        LeaderElector::with_store(store, config)
    }
}

fn now_micro() -> MicroTime {
    MicroTime(chrono::Utc::now())
}

fn seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs()).unwrap_or(i32::MAX).max(1)
}

impl<S: LeaseStore> LeaderElector<S> {
    /// A candidate whose Lease lives in `store`.
    pub fn with_store(store: S, config: LeaderElectionConfig) -> LeaderElector<S> {
        LeaderElector { store, config, state: State::Following, observed: None, leading: watch::channel(false).0 }
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.state
    }

    /// Whether this candidate leads now.
    pub fn is_leader(&self) -> bool {
        matches!(self.state, State::Leading { .. })
    }

    /// Follows leadership changes (true while leading), for status and
    /// metrics.
    pub fn leader_watch(&self) -> watch::Receiver<bool> {
        self.leading.subscribe()
    }

    fn set_state(&mut self, state: State) {
        self.state = state;
        self.leading.send_replace(matches!(state, State::Leading { .. }));
    }

    /// Notes the record as seen now; its clock restarts if it changed.
    fn observe(&mut self, lease: &Lease, now: Instant) {
        let spec = lease.spec.clone().unwrap_or_default();
        let resource_version = lease.metadata.resource_version.clone();
        let changed = match &self.observed {
            Some(o) => o.spec != spec || o.resource_version != resource_version,
            None => true,
        };
        if changed {
            self.observed = Some(Observed { spec, resource_version, changed_at: now });
        }
    }

    /// The holder other than us that the last seen record names, if any.
    fn other_holder(&self) -> Option<&str> {
        let holder = self.observed.as_ref()?.spec.holder_identity.as_deref()?;
        (!holder.is_empty() && holder != self.config.identity).then_some(holder)
    }

    /// One read of the Lease and, if it is ours or free, one
    /// compare-and-swap write making us the holder. `Ok(true)`: we hold it.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, ClientError> {
        let now = Instant::now();
        let Some(mut lease) = self.store.get().await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.config.identity.clone()),
                    lease_duration_seconds: Some(seconds(self.config.lease_duration)),
                    acquire_time: Some(now_micro()),
                    renew_time: Some(now_micro()),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.store.create(lease).await {
                Ok(created) => {
                    self.observe(&created, now);
                    Ok(true)
                }
                Err(e) if e.is(Reason::AlreadyExists) || e.is(Reason::Conflict) => Ok(false),
                Err(e) => Err(e),
            };
        };
        self.observe(&lease, now);
        let observed = self.observed.clone().expect("observe just set it");
        if self.other_holder().is_some() {
            // The record's own duration, as client-go reads it; measured
            // on our clock from when we saw the record change.
            let duration = observed
                .spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map(Duration::from_secs)
                .unwrap_or(self.config.lease_duration);
            if observed.changed_at + duration > now {
                return Ok(false);
            }
        }
        let old = observed.spec;
        let ours = old.holder_identity.as_deref() == Some(self.config.identity.as_str());
        let spec = LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(seconds(self.config.lease_duration)),
            acquire_time: if ours { old.acquire_time.clone() } else { Some(now_micro()) },
            renew_time: Some(now_micro()),
            lease_transitions: Some(if ours {
                old.lease_transitions.unwrap_or(0)
            } else {
                old.lease_transitions.unwrap_or(0) + 1
            }),
            ..old
        };
        lease.spec = Some(spec);
        match self.store.replace(lease).await {
            Ok(updated) => {
                self.observe(&updated, now);
                Ok(true)
            }
            Err(e) if e.is(Reason::Conflict) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// One attempt: acquire while following, renew while leading. A
    /// leader's attempt is cut off at its renew deadline, and a leader
    /// steps down once the deadline passes or another holder is seen.
    pub async fn step(&mut self) -> Outcome {
        match self.state {
            State::Following => {
                let sent = Instant::now();
                match self.try_acquire_or_renew().await {
                    Ok(true) => {
                        self.set_state(State::Leading { renewed_at: sent });
                        Outcome::Acquired
                    }
                    Ok(false) => Outcome::Following,
                    Err(e) => {
                        tracing::debug!(lease = %self.config.name, error = %e, "cannot reach the lease");
                        Outcome::Following
                    }
                }
            }
            State::Leading { renewed_at } => {
                let deadline = renewed_at + self.config.renew_deadline;
                let sent = Instant::now();
                if sent >= deadline {
                    return self.step_down();
                }
                match tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await {
                    Ok(Ok(true)) => {
                        self.set_state(State::Leading { renewed_at: sent });
                        Outcome::Renewed
                    }
                    _ if self.other_holder().is_some() || Instant::now() >= deadline => self.step_down(),
                    _ => Outcome::RenewFailed,
                }
            }
        }
    }

    fn step_down(&mut self) -> Outcome {
        tracing::warn!(lease = %self.config.name, identity = %self.config.identity, "stepping down as leader");
        self.set_state(State::Following);
        Outcome::Lost
    }

    /// Gives the lease up if we hold it: clears the holder so a successor
    /// takes it at its next attempt. Call only after the work has stopped.
    pub async fn release(&mut self) -> Result<(), ClientError> {
        if !self.is_leader() {
            return Ok(());
        }
        self.set_state(State::Following);
        let Some(mut lease) = self.store.get().await? else { return Ok(()) };
        let spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        lease.spec = Some(LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            acquire_time: Some(now_micro()),
            renew_time: Some(now_micro()),
            ..spec
        });
        self.store.replace(lease).await.map(|_| ())
    }

    /// The wait before a follower's next attempt: the retry period plus up
    /// to 1.2 times it in jitter, as client-go, so candidates spread out;
    /// but no later than just after the held lease would expire (by our
    /// clock), so a dead leader is replaced within its lease duration plus
    /// a few tens of milliseconds rather than up to two retry periods more.
    fn follower_wait(&self) -> Duration {
        let mut rng = rand::thread_rng();
        let periodic = self.config.retry_period.mul_f64(1.0 + rng.gen_range(0.0..1.2));
        let Some(observed) = self.observed.as_ref().filter(|_| self.other_holder().is_some()) else {
            return periodic;
        };
        let duration = observed
            .spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map(Duration::from_secs)
            .unwrap_or(self.config.lease_duration);
        let expires_in = (observed.changed_at + duration).saturating_duration_since(Instant::now());
        // A held lease is read every [`OBSERVE_PERIOD`] too: a read is one
        // GET, and the sooner a follower sees the holder's last renewal,
        // the sooner after the holder's death its own clock runs out.
        periodic.min(OBSERVE_PERIOD).min(expires_in + Duration::from_millis(rng.gen_range(10..60)))
    }

    /// Competes until `shutdown`; each time it leads it runs
    /// `on_leading(leading)` as a task, where `leading` is a child of
    /// `shutdown` to start the leader's work on (controllers' `run`). When
    /// leadership is lost `leading` is stopped: cancelled, then waited for
    /// (the task and everything spawned on `leading`) before competing
    /// again. If the work ends by itself the lease is released and the
    /// candidate competes again. On shutdown the work is stopped first,
    /// then (with `release_on_cancel`) the lease is released.
    pub async fn run<F, Fut>(mut self, shutdown: Shutdown, on_leading: F)
    where
        F: Fn(Shutdown) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut work: Option<(Shutdown, tokio::task::JoinHandle<()>)> = None;
        // Every select checks the shutdown first: the work's shutdown is a
        // child of this one, so at shutdown the work ends too, and
        // that must not read as "the work ended by itself".
        while !shutdown.is_cancelled() {
            match self.state {
                State::Following => {
                    let outcome = tokio::select! {
                        biased;
                        _ = shutdown.cancelled() => break,
                        outcome = self.step() => outcome,
                    };
                    if outcome == Outcome::Acquired {
                        tracing::info!(lease = %self.config.name, identity = %self.config.identity, "became leader");
                        let leading = shutdown.child();
                        work = Some((leading.clone(), tokio::spawn(on_leading(leading))));
                        continue;
                    }
                    let wait = self.follower_wait();
                    tokio::select! {
                        biased;
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
                State::Leading { renewed_at } => {
                    let next = (Instant::now() + self.config.retry_period).min(renewed_at + self.config.renew_deadline);
                    let finished = match work.as_mut() {
                        Some((_, task)) => tokio::select! {
                            biased;
                            _ = shutdown.cancelled() => break,
                            _ = tokio::time::sleep_until(next) => false,
                            _ = task => true,
                        },
                        None => false,
                    };
                    if finished {
                        tracing::info!(lease = %self.config.name, "leader's work ended; releasing the lease");
                        // Its task has been awaited; stop what it spawned.
                        if let Some((leading, _)) = work.take() {
                            leading.stop().await;
                        }
                        if let Err(e) = self.release().await {
                            tracing::warn!(error = %e, "releasing the lease failed");
                        }
                        // Give others a turn rather than re-acquiring at once.
                        let wait = self.follower_wait();
                        tokio::select! {
                            biased;
                            _ = shutdown.cancelled() => break,
                            _ = tokio::time::sleep(wait) => {}
                        }
                        continue;
                    }
                    let outcome = tokio::select! {
                        biased;
                        _ = shutdown.cancelled() => break,
                        outcome = self.step() => outcome,
                    };
                    if outcome == Outcome::Lost {
                        stop_work(work.take()).await;
                    }
                }
            }
        }
        let was_leading = self.is_leader();
        stop_work(work.take()).await;
        if was_leading && self.config.release_on_cancel {
            // A courtesy to the successor (the lease expires anyway), so
            // it may not hold up a stop: a member stopping without quorum
            // would wait out the whole write timeout.
            let deadline = self.config.retry_period;
            match tokio::time::timeout(deadline, self.release()).await {
                Ok(Ok(())) => tracing::info!(lease = %self.config.name, "released the lease"),
                Ok(Err(e)) => tracing::warn!(error = %e, "releasing the lease failed"),
                Err(_) => tracing::warn!("releasing the lease timed out"),
            }
        }
        self.set_state(State::Following);
    }
}

/// Stops the leader's work: cancels it and waits for its task and every
/// task spawned on its shutdown.
async fn stop_work(work: Option<(Shutdown, tokio::task::JoinHandle<()>)>) {
    if let Some((leading, task)) = work {
        leading.cancel();
        if let Err(e) = task.await {
            tracing::error!(error = %e, "the leader's work failed");
        }
        leading.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn config(identity: &str) -> LeaderElectionConfig {
        LeaderElectionConfig::new("kube-system", "skiff-controller-manager", identity)
    }

    fn spec(store: &MemoryLeaseStore) -> LeaseSpec {
        store.lease().and_then(|l| l.spec).unwrap_or_default()
    }

    /// A lease held by `holder` whose timestamps are decades old.
    fn held_by(holder: &str, transitions: i32) -> Lease {
        let old = MicroTime(chrono::Utc.with_ymd_and_hms(2001, 1, 1, 0, 0, 0).unwrap());
        Lease {
            metadata: ObjectMeta {
                name: Some("skiff-controller-manager".into()),
                namespace: Some("kube-system".into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(15),
                acquire_time: Some(old.clone()),
                renew_time: Some(old),
                lease_transitions: Some(transitions),
                ..Default::default()
            }),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_candidate_creates_and_holds_a_lease_that_does_not_exist() {
        let store = MemoryLeaseStore::new();
        let mut a = LeaderElector::with_store(store.clone(), config("a"));
        let watch = a.leader_watch();
        assert_eq!(a.step().await, Outcome::Acquired);
        assert!(a.is_leader() && *watch.borrow());
        let s = spec(&store);
        assert_eq!(s.holder_identity.as_deref(), Some("a"));
        assert_eq!(s.lease_duration_seconds, Some(15));
        assert_eq!(s.lease_transitions, Some(0));
        assert!(s.acquire_time.is_some() && s.renew_time.is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn renewing_keeps_the_acquire_time_and_the_transitions() {
        let store = MemoryLeaseStore::new();
        let mut a = LeaderElector::with_store(store.clone(), config("a"));
        a.step().await;
        let first = spec(&store);
        let rv = store.lease().unwrap().metadata.resource_version;
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(a.step().await, Outcome::Renewed);
        let renewed = spec(&store);
        assert_eq!(renewed.acquire_time, first.acquire_time);
        assert_eq!(renewed.lease_transitions, Some(0));
        assert_ne!(store.lease().unwrap().metadata.resource_version, rv, "a renewal is a write");
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_judges_expiry_by_its_own_clock_not_the_remote_timestamps() {
        let store = MemoryLeaseStore::new();
        store.put(held_by("b", 3));
        let mut a = LeaderElector::with_store(store.clone(), config("a"));
        // The renewTime is from 2001, but a has only just seen the record.
        assert_eq!(a.step().await, Outcome::Following);
        tokio::time::advance(Duration::from_secs(14)).await;
        assert_eq!(a.step().await, Outcome::Following);
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert_eq!(a.step().await, Outcome::Acquired);
        let s = spec(&store);
        assert_eq!(s.holder_identity.as_deref(), Some("a"));
        assert_eq!(s.lease_transitions, Some(4));
        assert_ne!(s.acquire_time, held_by("b", 3).spec.unwrap().acquire_time);
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_tries_again_just_after_the_lease_it_watches_expires() {
        let store = MemoryLeaseStore::new();
        store.put(held_by("b", 3));
        let mut a = LeaderElector::with_store(store.clone(), config("a"));
        assert_eq!(a.step().await, Outcome::Following);
        let wait = a.follower_wait();
        assert_eq!(wait, OBSERVE_PERIOD, "far from expiry: it reads the held lease every observe period");
        tokio::time::advance(Duration::from_millis(14_500)).await;
        let wait = a.follower_wait();
        assert!(
            wait >= Duration::from_millis(500) && wait < Duration::from_millis(600),
            "just after the expiry, not a whole retry period later ({wait:?})"
        );
        tokio::time::advance(wait).await;
        assert_eq!(a.step().await, Outcome::Acquired);
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_restarts_its_clock_whenever_the_holder_renews() {
        let store = MemoryLeaseStore::new();
        let mut b = LeaderElector::with_store(store.view(), config("b"));
        assert_eq!(b.step().await, Outcome::Acquired);
        let mut a = LeaderElector::with_store(store.view(), config("a"));
        for _ in 0..30 {
            assert_eq!(a.step().await, Outcome::Following);
            tokio::time::advance(Duration::from_secs(2)).await;
            assert_eq!(b.step().await, Outcome::Renewed);
        }
        assert_eq!(spec(&store).holder_identity.as_deref(), Some("b"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_candidate_that_loses_the_write_race_keeps_following() {
        let store = MemoryLeaseStore::new();
        let mut a = LeaderElector::with_store(store.clone(), config("a"));
        store.conflict_next_write();
        assert_eq!(a.step().await, Outcome::Following);
        assert!(!a.is_leader());
        // A free (released) lease lost to a conflict likewise.
        store.put(Lease { spec: Some(LeaseSpec::default()), ..held_by("", 1) });
        store.conflict_next_write();
        assert_eq!(a.step().await, Outcome::Following);
        assert_eq!(a.step().await, Outcome::Acquired);
        assert_eq!(spec(&store).lease_transitions, Some(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_that_sees_another_holder_steps_down_at_once() {
        let store = MemoryLeaseStore::new();
        let mut a = LeaderElector::with_store(store.clone(), config("a"));
        a.step().await;
        store.put(held_by("b", 1));
        assert_eq!(a.step().await, Outcome::Lost);
        assert!(!a.is_leader());
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_cut_off_steps_down_by_its_renew_deadline_before_anyone_can_take_over() {
        let store = MemoryLeaseStore::new();
        let (a_store, b_store) = (store.view(), store.view());
        let mut a = LeaderElector::with_store(a_store.clone(), config("a"));
        let mut b = LeaderElector::with_store(b_store, config("b"));
        let acquired_at = Instant::now();
        assert_eq!(a.step().await, Outcome::Acquired);
        assert_eq!(b.step().await, Outcome::Following);
        a_store.set_unreachable(true);
        let mut a_lost = None;
        let mut b_acquired = None;
        let start = Instant::now();
        while (a_lost.is_none() || b_acquired.is_none()) && start.elapsed() < Duration::from_secs(60) {
            tokio::time::advance(Duration::from_millis(500)).await;
            if a.is_leader() && a.step().await == Outcome::Lost {
                a_lost = Some(Instant::now());
            }
            if b_acquired.is_none() && b.step().await == Outcome::Acquired {
                b_acquired = Some(Instant::now());
            }
        }
        let (a_lost, b_acquired) = (a_lost.unwrap(), b_acquired.unwrap());
        assert!(a_lost <= acquired_at + Duration::from_secs(10), "{:?}", a_lost - acquired_at);
        assert!(b_acquired >= acquired_at + Duration::from_secs(15));
        assert!(a_lost < b_acquired);
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_that_hangs_is_cut_off_at_the_deadline() {
        /// A store whose writes never answer once `hang` is set.
        struct Hanging(MemoryLeaseStore, Arc<AtomicBool>);
        impl LeaseStore for Hanging {
            fn get(&self) -> BoxFuture<'_, Result<Option<Lease>, ClientError>> {
                self.0.get()
            }
            fn create(&self, lease: Lease) -> BoxFuture<'_, Result<Lease, ClientError>> {
                self.0.create(lease)
            }
            fn replace(&self, lease: Lease) -> BoxFuture<'_, Result<Lease, ClientError>> {
                if self.1.load(Ordering::SeqCst) {
                    return futures::future::pending().boxed();
                }
                self.0.replace(lease)
            }
        }
        let hang = Arc::new(AtomicBool::new(false));
        let mut a = LeaderElector::with_store(Hanging(MemoryLeaseStore::new(), hang.clone()), config("a"));
        let start = Instant::now();
        assert_eq!(a.step().await, Outcome::Acquired);
        tokio::time::advance(Duration::from_secs(2)).await;
        hang.store(true, Ordering::SeqCst);
        assert_eq!(a.step().await, Outcome::Lost);
        assert_eq!(start.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn run_stops_the_work_then_releases_so_a_successor_takes_over_at_once() {
        let store = MemoryLeaseStore::new();
        let a_stop = Shutdown::new();
        let events = Arc::new(Mutex::new(Vec::<(String, Instant)>::new()));
        let record = |who: &'static str| {
            let events = events.clone();
            move |leading: Shutdown| {
                let events = events.clone();
                async move {
                    events.lock().unwrap().push((format!("{who} leads"), Instant::now()));
                    leading.cancelled().await;
                    events.lock().unwrap().push((format!("{who} stops"), Instant::now()));
                }
            }
        };
        let a = LeaderElector::with_store(store.view(), config("a"));
        let a_leader = a.leader_watch();
        let a_run = tokio::spawn(a.run(a_stop.clone(), record("a")));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(*a_leader.borrow());
        let b_stop = Shutdown::new();
        let b_run = tokio::spawn(LeaderElector::with_store(store.view(), config("b")).run(b_stop.clone(), record("b")));
        tokio::time::sleep(Duration::from_secs(30)).await;
        let stopped_at = Instant::now();
        a_stop.cancel();
        a_run.await.unwrap();
        assert!(!*a_leader.borrow());
        assert_eq!(spec(&store).holder_identity, None, "released");
        tokio::time::sleep(Duration::from_secs(10)).await;
        b_stop.stop().await;
        b_run.await.unwrap();
        let events = events.lock().unwrap().clone();
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a leads", "a stops", "b leads", "b stops"]);
        // b took over within its retry period (2s plus jitter), not a lease duration.
        let b_leads = events[2].1;
        assert!(b_leads - stopped_at <= Duration::from_millis(4400), "{:?}", b_leads - stopped_at);
    }

    #[tokio::test(start_paused = true)]
    async fn run_cancels_the_work_when_the_lease_is_lost() {
        let store = MemoryLeaseStore::new();
        let a_store = store.view();
        let stop = Shutdown::new();
        let cancelled = Arc::new(Mutex::new(None::<Instant>));
        let c = cancelled.clone();
        let run = tokio::spawn(LeaderElector::with_store(a_store.clone(), config("a")).run(
            stop.clone(),
            move |leading: Shutdown| {
                let c = c.clone();
                async move {
                    // The work runs on tasks of its own, as controllers do.
                    let work = leading.clone();
                    leading.spawn(async move {
                        work.cancelled().await;
                        *c.lock().unwrap() = Some(Instant::now());
                    });
                    leading.cancelled().await;
                }
            },
        ));
        tokio::time::sleep(Duration::from_secs(5)).await;
        let cut = Instant::now();
        a_store.set_unreachable(true);
        tokio::time::sleep(Duration::from_secs(20)).await;
        let at = cancelled.lock().unwrap().expect("the work was cancelled");
        // The last renewal was sent at most a retry period before the cut.
        assert!(at - cut <= Duration::from_secs(10), "{:?}", at - cut);
        assert!(at - cut >= Duration::from_secs(8), "{:?}", at - cut);
        stop.stop().await;
        run.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn work_that_ends_by_itself_releases_the_lease_and_competes_again() {
        let store = MemoryLeaseStore::new();
        let stop = Shutdown::new();
        let terms = Arc::new(Mutex::new(0));
        let t = terms.clone();
        let run = tokio::spawn(LeaderElector::with_store(store.clone(), config("a")).run(stop.clone(), move |_| {
            let t = t.clone();
            async move {
                *t.lock().unwrap() += 1;
            }
        }));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(spec(&store).holder_identity, None, "released after the work ended");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(*terms.lock().unwrap() >= 2);
        stop.stop().await;
        run.await.unwrap();
    }
}
