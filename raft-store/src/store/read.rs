//! The read path. Reads are linearizable by default: a read barrier
//! coalesces every read waiting at that moment into one
//! `ensure_linearizable` round on the leader (a follower asks the leader
//! for that read index, then waits until it has applied it locally).
//! Serializable reads, history and change feeds are served from this
//! member's applied state, with RocksDB work on the blocking pool.

use std::time::Duration;

use openraft::error::RaftError;
use tokio::sync::{mpsc, oneshot};

use super::{leader_addr, Header, Store};
use crate::changes::{Changes, ChangesSince, History};
use crate::error::{StoreError, WireError};
use crate::mvcc::{ReadError, Reader};
use crate::network::{PeerClients, PeerMethod};
use crate::types::{NodeId, Raft, RangeRequest, RangeResult};

pub(super) type ReadWaiter = oneshot::Sender<Result<u64, StoreError>>;

impl Store {
    /// Waits until this member's state reflects every write acknowledged
    /// before the call (linearizable read).
    pub async fn linearize(&self) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        self.inner.reads.send(tx).await.map_err(|_| StoreError::Stopped)?;
        let index = rx.await.map_err(|_| StoreError::Stopped)??;
        tokio::time::timeout(self.inner.config.request_timeout, self.inner.sm.wait_applied(index))
            .await
            .map_err(|_| StoreError::Timeout)
    }

    /// The read index for a linearizable read, computed on the leader
    /// (called by followers over the peer channel).
    pub async fn read_index(&self) -> Result<u64, StoreError> {
        let (tx, rx) = oneshot::channel();
        self.inner.reads.send(tx).await.map_err(|_| StoreError::Stopped)?;
        rx.await.map_err(|_| StoreError::Stopped)?
    }

    /// etcd's Range.
    pub async fn range(&self, req: RangeRequest, serializable: bool) -> Result<(RangeResult, Header), StoreError> {
        if !serializable {
            self.linearize().await?;
        }
        if let Some(cached) = self.range_cached(&req) {
            return Ok(cached);
        }
        self.read_view(move |view| view.range(&req)).await
    }

    /// A Range at the current revision the state machine's cache answers.
    fn range_cached(&self, req: &RangeRequest) -> Option<(RangeResult, Header)> {
        let (result, revision) = self.inner.sm.range_cached(req)?;
        crate::metrics::metrics().reads_from_cache.inc();
        Some((result, Header { revision, ..self.header() }))
    }

    /// etcd's Range, serializable, for a range known to hold a few keys
    /// (a namespace's ResourceQuotas, the cluster's PriorityClasses),
    /// read on the calling task: for such a read the blocking pool's
    /// hand-off (a spawn, a thread woken, two context switches) costs more
    /// than the read itself. A range that may be large goes through
    /// [`Store::range`], which keeps RocksDB off the async workers.
    /// What it reads from RocksDB at the current revision is kept in the
    /// cache for the next such read, until a write changes it.
    pub fn range_small(&self, req: &RangeRequest) -> Result<(RangeResult, Header), StoreError> {
        if let Some(cached) = self.range_cached(req) {
            return Ok(cached);
        }
        let header = self.header();
        let read = read_now(&self.inner.sm, |view| view.range(req));
        if let Ok((result, Ok(revision))) = &read {
            self.inner.sm.remember_read(req, result, *revision);
        }
        finish_read(read, header)
    }

    /// etcd's HashKV on this member's state: (hash, compacted revision,
    /// revision hashed), with the header of the view hashed.
    pub async fn hash_kv(&self, revision: i64) -> Result<((u32, i64, i64), Header), StoreError> {
        self.read_view(move |view| view.hash_kv(revision)).await
    }

    /// etcd's Hash on this member's state, with the header of the view hashed.
    pub async fn hash_all(&self) -> Result<(u32, Header), StoreError> {
        self.read_view(|view| view.hash_all().map_err(ReadError::Engine)).await
    }

    /// Runs `read` on a point-in-time view of this member's state, on the
    /// blocking pool; the header carries the view's revision.
    async fn read_view<T: Send + 'static>(
        &self,
        read: impl FnOnce(&Reader<'_>) -> Result<T, ReadError> + Send + 'static,
    ) -> Result<(T, Header), StoreError> {
        let sm = self.inner.sm.clone();
        let header = self.header();
        let result = tokio::task::spawn_blocking(move || read_now(&sm, read)).await?;
        finish_read(result, header)
    }

    /// The revision of this member's applied state.
    pub fn revision(&self) -> i64 {
        self.inner.sm.revision()
    }

    /// The revision up to which this member's history is compacted.
    pub fn compacted(&self) -> i64 {
        self.inner.sm.compacted()
    }

    /// Waits until this member has applied `revision` (a read asking for
    /// "at least N" on a member that is behind).
    pub async fn wait_for_revision(&self, revision: i64) {
        let mut applied = self.inner.sm.applied();
        // The sender lives as long as the state machine, so this cannot fail.
        let _ = applied.wait_for(|a| a.revision >= revision).await;
    }

    /// `key`'s history on this member, from one point-in-time view.
    pub async fn history(&self, key: Vec<u8>) -> Result<History, StoreError> {
        crate::changes::read_history(&self.inner.sm, key).await
    }

    /// The revisions from `from` up to the current one, at most a chunk
    /// (call again from after the last one for more); `ApplyError::Compacted`
    /// if `from` is compacted away.
    pub async fn changes_since(&self, from: i64) -> Result<ChangesSince, StoreError> {
        crate::changes::read_changes(&self.inner.sm, from).await
    }

    /// A live feed of the revisions touching `[key, range_end)` (etcd's
    /// range rules) from `start`, or from after the current revision.
    pub fn subscribe(&self, key: &[u8], range_end: &[u8], start: Option<i64>) -> Changes {
        Changes::new(&self.inner.sm, key, range_end, start)
    }

    /// Live feeds following this member (see [`Store::subscribe`]).
    pub fn watchers(&self) -> usize {
        self.inner.sm.hub().watchers()
    }
}

/// Runs `read` on a point-in-time view of `sm`'s state, here and now;
/// with the view's revision.
fn read_now<T>(
    sm: &crate::state_machine::StateMachine,
    read: impl FnOnce(&Reader<'_>) -> Result<T, ReadError>,
) -> Result<(T, Result<i64, crate::mvcc::EngineError>), ReadError> {
    let db = sm.db();
    let view = Reader::snapshot(&db);
    let revision = view.revision();
    read(&view).map(|r| (r, revision))
}

fn finish_read<T>(
    result: Result<(T, Result<i64, crate::mvcc::EngineError>), ReadError>,
    header: Header,
) -> Result<(T, Header), StoreError> {
    match result {
        Ok((r, revision)) => Ok((r, Header { revision: revision.unwrap_or(header.revision), ..header })),
        Err(ReadError::Request(e)) => Err(StoreError::Apply(e)),
        Err(ReadError::Engine(e)) => Err(e.into()),
    }
}

/// Serves linearizable reads: one quorum round (on the leader) or one read
/// index request (from a follower) for every read waiting at that moment.
pub(super) async fn run_read_barrier(
    raft: Raft,
    peers: PeerClients,
    id: NodeId,
    timeout: Duration,
    hold: super::transfer::Hold,
    rx: mpsc::Receiver<ReadWaiter>,
) {
    serve_reads(rx, || {
        // A leadership transfer in progress: the quorum round would renew
        // the followers' leases.
        let mut hold = hold.clone();
        let (raft, peers) = (&raft, &peers);
        async move {
            hold.released().await;
            read_index_once(raft, peers, id, timeout).await
        }
    })
    .await
}

/// The read barrier's loop: waits for a read, takes every read waiting
/// behind it, answers all of them with one `round`.
async fn serve_reads<F, Fut>(mut rx: mpsc::Receiver<ReadWaiter>, mut round: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<u64, StoreError>>,
{
    while let Some(first) = rx.recv().await {
        let mut waiters = vec![first];
        while let Ok(w) = rx.try_recv() {
            waiters.push(w);
        }
        let m = crate::metrics::metrics();
        m.read_rounds.inc();
        m.reads_linearized.inc_by(waiters.len() as u64);
        let result = round().await;
        for w in waiters {
            let _ = w.send(result.clone());
        }
    }
}

async fn read_index_once(raft: &Raft, peers: &PeerClients, id: NodeId, timeout: Duration) -> Result<u64, StoreError> {
    let leader = raft.metrics().borrow().current_leader;
    match leader {
        Some(l) if l == id => match raft.ensure_linearizable().await {
            Ok(log_id) => Ok(log_id.map_or(0, |l| l.index)),
            Err(RaftError::APIError(e)) => match e {
                openraft::error::CheckIsLeaderError::ForwardToLeader(f) => {
                    Err(StoreError::NotLeader { leader: f.leader_id })
                }
                other => Err(StoreError::raft("read index", other)),
            },
            Err(e) => Err(StoreError::raft("read index", e)),
        },
        Some(l) => {
            let Some(addr) = leader_addr(raft, l) else { return Err(StoreError::NoLeader) };
            match peers.call::<(), Result<u64, WireError>>(&addr, l, PeerMethod::ReadIndex, &(), timeout).await {
                Ok(r) => r.map_err(StoreError::from),
                Err(e) => Err(StoreError::Peer(e)),
            }
        }
        None => Err(StoreError::NoLeader),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_round_answers_every_read_waiting_at_that_moment() {
        let (tx, rx) = mpsc::channel(16);
        let rounds = Arc::new(AtomicU64::new(0));
        let counted = rounds.clone();
        tokio::spawn(serve_reads(rx, move || {
            let round = counted.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                // A quorum round takes a while; reads arriving meanwhile
                // wait for the next one.
                tokio::time::sleep(Duration::from_millis(10)).await;
                Ok(round * 100)
            }
        }));
        let mut first = Vec::new();
        for _ in 0..5 {
            let (reply, answer) = oneshot::channel();
            tx.send(reply).await.expect("barrier running");
            first.push(answer);
        }
        for answer in first {
            assert_eq!(answer.await.expect("answered"), Ok(100));
        }
        let (reply, answer) = oneshot::channel();
        tx.send(reply).await.expect("barrier running");
        assert_eq!(answer.await.expect("answered"), Ok(200));
        assert_eq!(rounds.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_round_fails_every_read_it_served() {
        let (tx, rx) = mpsc::channel(16);
        let mut answers = Vec::new();
        for _ in 0..3 {
            let (reply, answer) = oneshot::channel();
            tx.send(reply).await.expect("room in the queue");
            answers.push(answer);
        }
        tokio::spawn(serve_reads(rx, || async { Err(StoreError::NoLeader) }));
        for answer in answers {
            assert_eq!(answer.await.expect("answered"), Err(StoreError::NoLeader));
        }
    }
}
