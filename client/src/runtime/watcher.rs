//! The watcher: a list followed by a watch from the list's revision, kept
//! alive across errors, as a stream of [`Event`]s (kube-runtime's
//! `watcher`, client-go's Reflector loop).
//!
//! The loop is an explicit [`State`] machine advanced by [`step`], which
//! does one request at a time and has no timers, so it is tested against a
//! fake source without I/O:
//!
//! ```text
//! Empty --Init--> Listing --(page)--> Applying --InitApply*--> (next page: Listing)
//!                                              \--InitDone--> Listed --(watch)--> Watching
//! Watching --Apply/Delete--> Watching        (bookmarks move the resume point)
//! Watching --stream ends / transport error--> Listed   (resume from the last revision seen)
//! any --Expired/Gone (410)--> Empty                      (relist)
//! ```
//!
//! [`watcher`] drives the machine as a stream and backs off with jitter
//! between repeated errors; a reconnect goes through the [`Client`]'s
//! endpoint failover, so it lands on another apiserver if this one died.
//!
//! [`Client`]: crate::Client

use std::collections::VecDeque;
use std::time::Duration;

use futures::{Stream, StreamExt};
use rand::Rng;
use skiff_api::Reason;

use super::api::{ListParams, ListWatch, Resource, WatchEvent, WatchParams, WatchStream};
use crate::resources::ClientError;

/// What the watcher saw, in kube-runtime's terms. A (re)list is bracketed
/// by `Init` and `InitDone`; what a list did not return was deleted while
/// the watcher was not looking, which the reflector works out.
#[derive(Clone, Debug, PartialEq)]
pub enum Event<K> {
    /// A list begins; the objects follow as `InitApply`.
    Init,
    /// One object of the list.
    InitApply(K),
    /// The list is complete.
    InitDone,
    /// An object was created or changed.
    Apply(K),
    /// An object was deleted (its last state).
    Delete(K),
}

/// A failed request of the watcher. The watcher keeps going after any of
/// them; they are reported so the caller can log and count them.
#[derive(Debug, thiserror::Error)]
pub enum WatcherError {
    /// A list (page) failed.
    #[error("list failed: {0}")]
    List(#[source] ClientError),
    /// A watch could not be started.
    #[error("starting the watch failed: {0}")]
    WatchStart(#[source] ClientError),
    /// An open watch failed.
    #[error("watch failed: {0}")]
    Watch(#[source] ClientError),
}

/// What to list and watch, and how.
#[derive(Clone, Debug)]
pub struct WatcherConfig {
    /// Only objects with these labels (a label selector), "" for all.
    pub label_selector: String,
    /// Only objects matching this field selector, "" for all.
    pub field_selector: String,
    /// Objects per list page; 0 lists everything in one response.
    pub page_size: i64,
    /// Ask the server for bookmarks, which keep the resume point fresh.
    pub bookmarks: bool,
}

impl Default for WatcherConfig {
    fn default() -> Self {
        WatcherConfig { label_selector: String::new(), field_selector: String::new(), page_size: 500, bookmarks: true }
    }
}

/// The watcher's state.
pub enum State<K> {
    /// Nothing listed yet, or the last revision expired: (re)list.
    Empty,
    /// Fetch a list page (`None`: the first one).
    Listing {
        /// The continue token of the next page.
        continue_token: Option<String>,
    },
    /// Hand out the objects of the page just read.
    Applying {
        /// Objects not yet emitted.
        items: VecDeque<K>,
        /// The continue token of the next page, if there is one.
        next_page: Option<String>,
        /// The revision the list is read at.
        resource_version: String,
    },
    /// Listed (or disconnected): start a watch from `resource_version`.
    Listed {
        /// The last revision seen.
        resource_version: String,
    },
    /// A watch is open.
    Watching {
        /// The last revision seen: where a new watch resumes.
        resource_version: String,
        /// The open watch.
        stream: WatchStream<K>,
    },
}

impl<K> State<K> {
    /// The state's name, for logs and tests.
    pub fn name(&self) -> &'static str {
        match self {
            State::Empty => "Empty",
            State::Listing { .. } => "Listing",
            State::Applying { .. } => "Applying",
            State::Listed { .. } => "Listed",
            State::Watching { .. } => "Watching",
        }
    }
}

/// Whether the revision the request named is gone from the server's
/// history (410): only a relist recovers.
fn expired(e: &ClientError) -> bool {
    e.is(Reason::Expired) || e.is(Reason::Gone)
}

/// One transition. Returns the event it produced, if any (`None`: call
/// again), and the next state.
pub async fn step_once<K: Resource, S: ListWatch<K>>(
    source: &S,
    config: &WatcherConfig,
    state: State<K>,
) -> (Option<Result<Event<K>, WatcherError>>, State<K>) {
    match state {
        State::Empty => (Some(Ok(Event::Init)), State::Listing { continue_token: None }),
        State::Listing { continue_token } => {
            let params = ListParams {
                label_selector: config.label_selector.clone(),
                field_selector: config.field_selector.clone(),
                limit: config.page_size,
                continue_token: continue_token.clone().unwrap_or_default(),
                resource_version: String::new(),
            };
            match source.list(params).await {
                Ok(page) => (
                    None,
                    State::Applying {
                        items: page.items.into(),
                        next_page: Some(page.continue_token).filter(|t| !t.is_empty()),
                        resource_version: page.resource_version,
                    },
                ),
                // The continue token's revision was compacted: start over.
                Err(e) if expired(&e) => (Some(Err(WatcherError::List(e))), State::Empty),
                Err(e) => (Some(Err(WatcherError::List(e))), State::Listing { continue_token }),
            }
        }
        State::Applying { mut items, next_page, resource_version } => match items.pop_front() {
            Some(obj) => (Some(Ok(Event::InitApply(obj))), State::Applying { items, next_page, resource_version }),
            None => match next_page {
                Some(token) => (None, State::Listing { continue_token: Some(token) }),
                None => (Some(Ok(Event::InitDone)), State::Listed { resource_version }),
            },
        },
        State::Listed { resource_version } => {
            let params = WatchParams {
                label_selector: config.label_selector.clone(),
                field_selector: config.field_selector.clone(),
                resource_version: resource_version.clone(),
                allow_bookmarks: config.bookmarks,
                ..Default::default()
            };
            match source.watch(params).await {
                Ok(stream) => (None, State::Watching { resource_version, stream }),
                Err(e) if expired(&e) => (Some(Err(WatcherError::WatchStart(e))), State::Empty),
                Err(e) => (Some(Err(WatcherError::WatchStart(e))), State::Listed { resource_version }),
            }
        }
        State::Watching { mut resource_version, mut stream } => match stream.next().await {
            Some(Ok(event)) => {
                let (event, revision) = match event {
                    WatchEvent::Added(obj) | WatchEvent::Modified(obj) => {
                        let rv = obj.metadata().resource_version.clone();
                        (Some(Event::Apply(obj)), rv)
                    }
                    WatchEvent::Deleted(obj) => {
                        let rv = obj.metadata().resource_version.clone();
                        (Some(Event::Delete(obj)), rv)
                    }
                    WatchEvent::Bookmark(rv) => (None, Some(rv)),
                };
                if let Some(rv) = revision.filter(|rv| !rv.is_empty()) {
                    resource_version = rv;
                }
                (event.map(Ok), State::Watching { resource_version, stream })
            }
            Some(Err(e)) if expired(&e) => (Some(Err(WatcherError::Watch(e))), State::Empty),
            Some(Err(e)) => (Some(Err(WatcherError::Watch(e))), State::Listed { resource_version }),
            // The server ended the watch (timeout, shutdown, lost
            // connection): resume where it stopped.
            None => (None, State::Listed { resource_version }),
        },
    }
}

/// Transitions until one produces an event.
pub async fn step<K: Resource, S: ListWatch<K>>(
    source: &S,
    config: &WatcherConfig,
    mut state: State<K>,
) -> (Result<Event<K>, WatcherError>, State<K>) {
    loop {
        match step_once(source, config, state).await {
            (Some(event), next) => return (event, next),
            (None, next) => state = next,
        }
    }
}

/// Exponential back-off with jitter: each delay is drawn from
/// `[d/2, 3d/2)` where `d` doubles from `initial` up to `max`.
#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Default for Backoff {
    /// 800ms doubling to 30s, as kube-runtime's watcher default.
    fn default() -> Self {
        Backoff::new(Duration::from_millis(800), Duration::from_secs(30))
    }
}

impl Backoff {
    /// Delays from `initial` doubling up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff { initial, max, next: initial }
    }

    /// The delay before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(self.max);
        base.mul_f64(rand::thread_rng().gen_range(0.5..1.5))
    }

    /// After a success: the next failure waits `initial` again.
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

/// The watcher as a stream: every event, and every error (after which it
/// waits a back-off delay before trying again). It never ends on its own;
/// drop it to stop.
pub fn watcher<K: Resource, S: ListWatch<K>>(
    source: S,
    config: WatcherConfig,
) -> impl Stream<Item = Result<Event<K>, WatcherError>> + Send {
    watcher_with_backoff(source, config, Backoff::default())
}

/// [`watcher`] with a chosen back-off.
pub fn watcher_with_backoff<K: Resource, S: ListWatch<K>>(
    source: S,
    config: WatcherConfig,
    backoff: Backoff,
) -> impl Stream<Item = Result<Event<K>, WatcherError>> + Send {
    let start = (source, config, State::Empty, backoff, None::<Duration>);
    futures::stream::unfold(start, |(source, config, state, mut backoff, delay)| async move {
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        let (event, state) = step(&source, &config, state).await;
        let delay = match &event {
            Ok(_) => {
                backoff.reset();
                None
            }
            Err(e) => {
                let delay = backoff.next_delay();
                tracing::debug!(error = %e, ?delay, state = state.name(), "watcher backing off");
                Some(delay)
            }
        };
        Some((event, (source, config, state, backoff, delay)))
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use skiff_api::ApiError;
    use tokio::time::Instant;

    use super::*;
    use crate::runtime::fake::FakeSource;

    fn cm(name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta { name: Some(name.into()), namespace: Some("ns".into()), ..Default::default() },
            ..Default::default()
        }
    }

    fn name<K: Resource>(obj: &K) -> String {
        obj.metadata().name.clone().unwrap_or_default()
    }

    /// A readable trace of an event.
    fn show(event: &Result<Event<ConfigMap>, WatcherError>) -> String {
        match event {
            Ok(Event::Init) => "Init".into(),
            Ok(Event::InitApply(o)) => format!("InitApply {}", name(o)),
            Ok(Event::InitDone) => "InitDone".into(),
            Ok(Event::Apply(o)) => format!("Apply {}", name(o)),
            Ok(Event::Delete(o)) => format!("Delete {}", name(o)),
            Err(e) => format!("Err {e}"),
        }
    }

    async fn run_steps(
        source: &FakeSource<ConfigMap>,
        config: &WatcherConfig,
        mut state: State<ConfigMap>,
        n: usize,
    ) -> (Vec<String>, State<ConfigMap>) {
        let mut trace = Vec::new();
        for _ in 0..n {
            let (event, next) = step(source, config, state).await;
            trace.push(show(&event));
            state = next;
        }
        (trace, state)
    }

    fn unreachable() -> ClientError {
        ClientError::Unreachable("connection refused".into())
    }

    #[tokio::test]
    async fn a_paginated_list_is_bracketed_by_init_and_init_done_then_watched_from_its_revision() {
        let source = FakeSource::new(vec![cm("a"), cm("b"), cm("c")]);
        let config = WatcherConfig { page_size: 2, ..Default::default() };
        let (trace, state) = run_steps(&source, &config, State::Empty, 5).await;
        assert_eq!(trace, ["Init", "InitApply a", "InitApply b", "InitApply c", "InitDone"]);
        assert_eq!(source.lists(), 2, "two pages");
        source.apply(cm("d"));
        let (trace, state) = run_steps(&source, &config, state, 1).await;
        assert_eq!(trace, ["Apply d"]);
        assert!(matches!(state, State::Watching { .. }));
        // The watch started from the list's revision (4: three creates after 1).
        assert_eq!(source.watch_versions(), ["4"]);
    }

    #[tokio::test]
    async fn a_dropped_watch_resumes_from_the_last_revision_seen_without_a_relist() {
        let source = FakeSource::new(vec![cm("a")]);
        let config = WatcherConfig::default();
        let (_, state) = run_steps(&source, &config, State::Empty, 3).await;
        source.apply(cm("b"));
        let (_, state) = run_steps(&source, &config, state, 1).await;
        source.disconnect();
        source.apply(cm("c"));
        source.delete("ns", "a");
        let (trace, _) = run_steps(&source, &config, state, 2).await;
        assert_eq!(trace, ["Apply c", "Delete a"]);
        assert_eq!(source.lists(), 1);
        assert_eq!(source.watch_versions(), ["2", "3"]);
    }

    #[tokio::test]
    async fn a_bookmark_alone_advances_where_the_watch_resumes() {
        let source = FakeSource::new(vec![cm("a")]);
        let config = WatcherConfig::default();
        let (_, state) = run_steps(&source, &config, State::Empty, 3).await;
        let (_, state) = step_once(&source, &config, state).await; // opens the watch
        assert_eq!(state.name(), "Watching");
        // Changes we do not see (another selector's) moved the revision on;
        // the stream carries only a bookmark, then ends.
        source.bookmark();
        source.disconnect();
        let (event, state) = step_once(&source, &config, state).await; // bookmark
        assert!(event.is_none());
        match &state {
            State::Watching { resource_version, .. } => assert_eq!(resource_version, "3"),
            other => panic!("unexpected state {}", other.name()),
        }
        let (event, state) = step_once(&source, &config, state).await; // stream ends
        assert!(event.is_none());
        assert_eq!(state.name(), "Listed");
        let (event, _) = step_once(&source, &config, state).await; // reopens
        assert!(event.is_none());
        assert_eq!(source.watch_versions(), ["2", "3"]);
    }

    #[tokio::test]
    async fn an_expired_watch_relists_and_the_relist_is_bracketed_again() {
        let source = FakeSource::new(vec![cm("a"), cm("b")]);
        let config = WatcherConfig::default();
        let (_, state) = run_steps(&source, &config, State::Empty, 4).await;
        let (_, state) = step_once(&source, &config, state).await; // opens the watch
        source.delete("ns", "a");
        source.compact();
        let (trace, _) = run_steps(&source, &config, state, 5).await;
        // The deletion is in the stream before the Expired error.
        assert_eq!(trace[0], "Delete a");
        assert!(trace[1].starts_with("Err watch failed"), "{trace:?}");
        assert_eq!(&trace[2..], ["Init", "InitApply b", "InitDone"]);
        assert_eq!(source.lists(), 2);
    }

    #[tokio::test]
    async fn a_watch_that_cannot_resume_from_a_compacted_revision_relists() {
        let source = FakeSource::new(vec![cm("a")]);
        let config = WatcherConfig::default();
        source.compact();
        source.apply(cm("b"));
        source.compact();
        let state = State::Listed { resource_version: "2".into() };
        let (trace, _) = run_steps(&source, &config, state, 4).await;
        assert!(trace[0].starts_with("Err starting the watch failed"), "{trace:?}");
        assert_eq!(&trace[1..], ["Init", "InitApply a", "InitApply b"]);
    }

    #[tokio::test]
    async fn transport_errors_retry_the_same_step() {
        let source = FakeSource::new(vec![cm("a")]);
        let config = WatcherConfig::default();
        source.fail_next_list(unreachable());
        source.fail_next_watch(unreachable());
        let (trace, state) = run_steps(&source, &config, State::Empty, 5).await;
        assert_eq!(trace[0], "Init");
        assert!(trace[1].starts_with("Err list failed"));
        assert_eq!(&trace[2..4], ["InitApply a", "InitDone"]);
        assert!(trace[4].starts_with("Err starting the watch failed"));
        assert_eq!(state.name(), "Listed");
        assert_eq!(source.lists(), 2);
    }

    #[tokio::test]
    async fn an_expired_continue_token_restarts_the_list() {
        let source = FakeSource::new(vec![cm("a"), cm("b")]);
        let config = WatcherConfig { page_size: 1, ..Default::default() };
        let (_, state) = run_steps(&source, &config, State::Empty, 2).await; // Init, InitApply a
        source.fail_next_list(ClientError::Api(ApiError::expired("continue token expired")));
        let (trace, _) = run_steps(&source, &config, state, 5).await;
        assert!(trace[0].starts_with("Err list failed"));
        assert_eq!(&trace[1..], ["Init", "InitApply a", "InitApply b", "InitDone"]);
    }

    #[tokio::test(start_paused = true)]
    async fn repeated_errors_back_off_exponentially_with_jitter_and_success_resets_it() {
        let source = FakeSource::new(vec![cm("a")]);
        for _ in 0..5 {
            source.fail_next_list(unreachable());
        }
        let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(8));
        let stream = watcher_with_backoff(source.clone(), WatcherConfig::default(), backoff);
        futures::pin_mut!(stream);
        let mut times = Vec::new();
        let start = Instant::now();
        for _ in 0..8 {
            let event = stream.next().await.unwrap();
            times.push((show(&event), start.elapsed()));
        }
        assert_eq!(times[0], ("Init".to_string(), Duration::ZERO));
        // Errors at 0, then waits of [d/2, 3d/2) for d = 1, 2, 4, 8 seconds.
        // Tokio's timer counts whole milliseconds and rounds a sleep up, so
        // a wait drawn just under 3d/2 may be observed as exactly 3d/2.
        let errors: Vec<Duration> = times[1..6].iter().map(|(_, t)| *t).collect();
        for (i, d) in [1u64, 2, 4, 8].iter().enumerate() {
            let gap = errors[i + 1] - errors[i];
            let d = Duration::from_secs(*d);
            assert!(gap >= d / 2 && gap <= d * 3 / 2, "gap {i}: {gap:?}");
        }
        assert_eq!(times[6].0, "InitApply a");
        let recovered = times[6].1;
        assert_eq!(times[7], ("InitDone".to_string(), recovered));
    }

    #[tokio::test(start_paused = true)]
    async fn the_back_off_never_exceeds_one_and_a_half_times_its_max() {
        let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_secs(1));
        for _ in 0..50 {
            assert!(backoff.next_delay() < Duration::from_millis(1500));
        }
        backoff.reset();
        assert!(backoff.next_delay() < Duration::from_millis(15));
    }
}
