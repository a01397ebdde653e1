//! etcd's Watch service, served by every member from its own applied state.
//!
//! Each watcher is a task following the store's [`Changes`] feed for its
//! keys: history replayed from RocksDB from its start revision, then the
//! live revisions, whole, in order, once each (the feed goes back to RocksDB
//! whenever its live queue dropped revisions). The task filters events
//! (ranges, `NOPUT`/`NODELETE`) and packs them into responses. All watchers
//! of one stream share one bounded output channel; a slow client makes its
//! watchers fall behind and catch up from disk, never grows memory and
//! never slows the applier.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use skiff_proto::etcdserverpb::watch_request::RequestUnion;
use skiff_proto::etcdserverpb::watch_server::{Watch, WatchServer};
use skiff_proto::etcdserverpb::{watch_create_request::FilterType, WatchCreateRequest, WatchRequest, WatchResponse};
use skiff_proto::mvccpb;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use crate::changes::{Changes, ChangesError};
use crate::mvcc::{in_range, Event, EventKind, RevisionEvents};
use crate::store::Store;

/// Responses buffered per watch stream before its watchers wait.
const STREAM_BUFFER: usize = 1024;
/// Events packed into one response while catching up.
const MAX_EVENTS_PER_RESPONSE: usize = 1000;

pub struct WatchService {
    store: Store,
    progress_interval: Duration,
}

impl WatchService {
    /// `progress_interval`: how often watchers that asked for progress
    /// notifications get one (etcd's default is ten minutes).
    pub fn server(store: Store, progress_interval: Duration) -> WatchServer<WatchService> {
        WatchServer::new(WatchService { store, progress_interval })
    }
}

type WatchStream = super::ResponseStream<WatchResponse>;

#[tonic::async_trait]
impl Watch for WatchService {
    type WatchStream = WatchStream;

    async fn watch(&self, request: Request<Streaming<WatchRequest>>) -> Result<Response<WatchStream>, Status> {
        let caller = super::auth::caller(&self.store, request.metadata())?;
        let mut requests = request.into_inner();
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let store = self.store.clone();
        let progress_interval = self.progress_interval;
        let task = store.clone();
        task.spawn_stream(async move {
            let mut watchers: HashMap<i64, JoinHandle<()>> = HashMap::new();
            let mut next_id: i64 = 0;
            while let Some(Ok(req)) = requests.next().await {
                watchers.retain(|_, h| !h.is_finished());
                let response = match req.request_union {
                    Some(RequestUnion::CreateRequest(create)) => {
                        // etcd refuses a watch on keys the user may not read
                        // with a created-and-canceled response, keeping the stream.
                        if let Err(denied) = caller.renewed(&store).read(&create.key, &create.range_end) {
                            let refused = WatchResponse {
                                header: Some(super::header(store.header())),
                                watch_id: -1,
                                created: true,
                                canceled: true,
                                cancel_reason: denied.message().to_string(),
                                ..Default::default()
                            };
                            if tx.send(Ok(refused)).await.is_err() {
                                break;
                            }
                            continue;
                        }
                        let id = if create.watch_id != 0 { create.watch_id } else { next_id };
                        let slot = match watchers.entry(id) {
                            Entry::Vacant(slot) => slot,
                            Entry::Occupied(_) => {
                                let duplicate = WatchResponse {
                                    header: Some(super::header(store.header())),
                                    watch_id: id,
                                    created: true,
                                    canceled: true,
                                    cancel_reason: "etcdserver: duplicate watch ID".into(),
                                    ..Default::default()
                                };
                                if tx.send(Ok(duplicate)).await.is_err() {
                                    break;
                                }
                                continue;
                            }
                        };
                        {
                            next_id = next_id.max(id + 1);
                            let created = WatchResponse {
                                header: Some(super::header(store.header())),
                                watch_id: id,
                                created: true,
                                ..Default::default()
                            };
                            if tx.send(Ok(created)).await.is_err() {
                                break;
                            }
                            let spec = WatcherSpec::new(id, &create);
                            let handle =
                                store.spawn_stream(run_watcher(store.clone(), spec, tx.clone(), progress_interval));
                            slot.insert(handle);
                            continue;
                        }
                    }
                    Some(RequestUnion::CancelRequest(cancel)) => {
                        if let Some(h) = watchers.remove(&cancel.watch_id) {
                            h.abort();
                        }
                        WatchResponse {
                            header: Some(super::header(store.header())),
                            watch_id: cancel.watch_id,
                            canceled: true,
                            ..Default::default()
                        }
                    }
                    Some(RequestUnion::ProgressRequest(_)) => {
                        // Not tied to one watcher: etcd answers with id -1.
                        let mut header = super::header(store.header());
                        header.revision = store.revision();
                        WatchResponse { header: Some(header), watch_id: -1, ..Default::default() }
                    }
                    None => continue,
                };
                if tx.send(Ok(response)).await.is_err() {
                    break;
                }
            }
            for (_, h) in watchers {
                h.abort();
            }
        });
        Ok(Response::new(super::until_stopping(&self.store, rx)))
    }
}

/// What one watcher wants.
#[derive(Clone, Debug)]
struct WatcherSpec {
    id: i64,
    key: Vec<u8>,
    range_end: Vec<u8>,
    start_revision: i64,
    prev_kv: bool,
    progress_notify: bool,
    no_put: bool,
    no_delete: bool,
}

impl WatcherSpec {
    fn new(id: i64, c: &WatchCreateRequest) -> Self {
        WatcherSpec {
            id,
            key: c.key.clone(),
            range_end: c.range_end.clone(),
            start_revision: c.start_revision,
            prev_kv: c.prev_kv,
            progress_notify: c.progress_notify,
            no_put: c.filters.contains(&(FilterType::Noput as i32)),
            no_delete: c.filters.contains(&(FilterType::Nodelete as i32)),
        }
    }

    fn wants(&self, e: &Event) -> bool {
        in_range(&e.kv.key, &self.key, &self.range_end)
            && match e.kind {
                EventKind::Put => !self.no_put,
                EventKind::Delete => !self.no_delete,
            }
    }

    fn to_wire(&self, e: &Event) -> mvccpb::Event {
        mvccpb::Event {
            r#type: mvccpb::event::EventType::from(e.kind) as i32,
            kv: Some(e.kv.clone().into()),
            prev_kv: if self.prev_kv { e.prev_kv.clone().map(Into::into) } else { None },
        }
    }
}

type Out = mpsc::Sender<Result<WatchResponse, Status>>;

/// Why a watcher stopped.
enum Stop {
    /// The client went away or the watcher was canceled.
    Gone,
    /// Its next revision was compacted away.
    Compacted(i64),
}

struct Watcher {
    store: Store,
    spec: WatcherSpec,
    out: Out,
}

async fn run_watcher(store: Store, spec: WatcherSpec, out: Out, progress_interval: Duration) {
    let start = (spec.start_revision > 0).then_some(spec.start_revision);
    let mut changes = store.subscribe(&spec.key, &spec.range_end, start);
    let w = Watcher { store, spec, out };
    if let Err(Stop::Compacted(compacted)) = w.run(&mut changes, progress_interval).await {
        let response = WatchResponse {
            header: Some(super::header(w.store.header())),
            watch_id: w.spec.id,
            canceled: true,
            compact_revision: compacted,
            cancel_reason: "etcdserver: mvcc: required revision has been compacted".into(),
            ..Default::default()
        };
        let _ = w.out.send(Ok(response)).await;
    }
}

impl Watcher {
    async fn run(&self, changes: &mut Changes, progress_interval: Duration) -> Result<(), Stop> {
        let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + progress_interval, progress_interval);
        loop {
            tokio::select! {
                next = changes.next() => match next {
                    Ok(revisions) => self.send_revisions(&revisions).await?,
                    Err(ChangesError::Compacted { compacted }) => return Err(Stop::Compacted(compacted)),
                    Err(ChangesError::Read(e)) => {
                        tracing::error!(error = %e, "watch replay failed");
                        return Err(Stop::Gone);
                    }
                    Err(ChangesError::Closed) => return Err(Stop::Gone),
                },
                _ = progress.tick(), if self.spec.progress_notify => {
                    self.send_progress(changes.progress()).await?;
                }
            }
        }
    }

    /// Sends the events this watcher wants from consecutive revisions,
    /// never splitting a revision across responses.
    async fn send_revisions(&self, revisions: &[Arc<RevisionEvents>]) -> Result<(), Stop> {
        let mut events = Vec::new();
        let mut last = 0;
        for r in revisions {
            events.extend(r.events.iter().filter(|e| self.spec.wants(e)).map(|e| self.spec.to_wire(e)));
            last = r.revision;
            if events.len() >= MAX_EVENTS_PER_RESPONSE {
                self.send_events(std::mem::take(&mut events), last).await?;
            }
        }
        if !events.is_empty() {
            self.send_events(events, last).await?;
        }
        Ok(())
    }

    async fn send_events(&self, events: Vec<mvccpb::Event>, revision: i64) -> Result<(), Stop> {
        let mut header = super::header(self.store.header());
        header.revision = revision;
        let response = WatchResponse { header: Some(header), watch_id: self.spec.id, events, ..Default::default() };
        self.out.send(Ok(response)).await.map_err(|_| Stop::Gone)
    }

    /// Tells the client that every revision up to `revision` has been
    /// delivered to it.
    async fn send_progress(&self, revision: i64) -> Result<(), Stop> {
        let mut header = super::header(self.store.header());
        header.revision = revision;
        let response = WatchResponse { header: Some(header), watch_id: self.spec.id, ..Default::default() };
        self.out.send(Ok(response)).await.map_err(|_| Stop::Gone)
    }
}
