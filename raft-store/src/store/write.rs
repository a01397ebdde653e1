//! The write path. Any member accepts writes. The leader's batcher drains
//! every write waiting at that moment into one Raft entry (openraft 0.9
//! fsyncs once per `client_write`), with up to `max_in_flight` entries in
//! flight; a follower's forwarder sends every write waiting at that moment
//! to the leader in one peer call. Each write has a [`RequestId`] fixed when
//! it first arrives, so a retry after a failover is applied once (the state
//! machine remembers recent ids). A forwarded write is answered once this
//! member has applied it too, so a client sees its own writes on the
//! member it wrote through.

use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, RaftError};
use skiff_shutdown::Shutdown;
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::{Inner, Store};
use crate::error::{StoreError, WireError};
use crate::network::PeerMethod;
use crate::types::{now_ms, ApplyError, Batch, Command, NodeId, Output, Proposal, ProposalResult, Raft, RequestId};

pub(super) struct PendingWrite {
    proposal: Proposal,
    reply: oneshot::Sender<Result<ProposalResult, StoreError>>,
}

/// A write a follower sends on to the leader (see [`run_forwarder`]).
pub(super) struct PendingForward {
    leader: NodeId,
    write: PendingWrite,
    deadline: Instant,
}

impl Store {
    /// Replicates `command` and returns its result. Retries across leader
    /// changes with the same request id until `request_timeout`.
    pub async fn write(&self, command: Command) -> Result<Output, StoreError> {
        if command.adds_data() && self.over_quota() {
            self.raise_nospace();
            return Err(StoreError::NoSpace);
        }
        let proposal = Proposal { id: RequestId::fresh(), command };
        let deadline = Instant::now() + self.inner.config.request_timeout;
        let mut backoff = Duration::from_millis(20);
        loop {
            let attempt = match self.leader() {
                Some(l) if l == self.id() => self.submit_local(vec![proposal.clone()]).await.pop(),
                Some(l) => {
                    let forwarded = self.forward_one(l, proposal.clone(), deadline).await;
                    if let Ok(Ok(output)) = &forwarded {
                        self.see_own_write(output, deadline).await;
                    }
                    Some(forwarded)
                }
                None => Some(Err(StoreError::NoLeader)),
            };
            let result = attempt.unwrap_or_else(|| Err(StoreError::Internal("empty response".into())));
            match result {
                Ok(Err(ApplyError::NoSpace)) => return Err(StoreError::NoSpace),
                Ok(r) => return r.map_err(StoreError::Apply),
                Err(e) if e.is_retryable() && Instant::now() + backoff < deadline => {
                    tracing::debug!(error = %e, id = %proposal.id, "write will be retried");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                }
                Err(e) if e.is_retryable() => return Err(StoreError::Timeout),
                Err(e) => return Err(e),
            }
        }
    }

    /// Waits, until `deadline` at most, for this member to apply a write
    /// the leader answered, so that what the client does next on this
    /// member sees its own write, as on etcd's members. The leader sends
    /// the new commit index at once, so this is about one round trip. A
    /// member that cannot catch up in time answers anyway: the write is
    /// committed.
    async fn see_own_write(&self, output: &Output, deadline: Instant) {
        let Some(revision) = output.revision() else { return };
        if tokio::time::timeout_at(deadline.into(), self.wait_for_revision(revision)).await.is_err() {
            tracing::debug!(revision, "answering a forwarded write this member has not applied yet");
        }
    }

    /// Hands proposals to this member's batcher (which succeeds only while
    /// this member is the leader).
    pub async fn submit_local(&self, proposals: Vec<Proposal>) -> Vec<Result<ProposalResult, StoreError>> {
        let mut replies = Vec::with_capacity(proposals.len());
        for proposal in proposals {
            let (reply, rx) = oneshot::channel();
            if self.inner.writes.send(PendingWrite { proposal, reply }).await.is_err() {
                replies.push(None);
            } else {
                replies.push(Some(rx));
            }
        }
        let mut out = Vec::with_capacity(replies.len());
        for rx in replies {
            out.push(match rx {
                Some(rx) => rx.await.unwrap_or_else(|_| Err(StoreError::Stopped)),
                None => Err(StoreError::Stopped),
            });
        }
        out
    }

    /// Sends one write on to the leader, together with the others waiting
    /// at that moment (see [`run_forwarder`]).
    async fn forward_one(
        &self,
        leader: NodeId,
        proposal: Proposal,
        deadline: Instant,
    ) -> Result<ProposalResult, StoreError> {
        let stopped = || StoreError::Stopped;
        let (reply, rx) = oneshot::channel();
        let forward = PendingForward { leader, write: PendingWrite { proposal, reply }, deadline };
        self.inner.forwards.send(forward).await.map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    async fn forward(
        &self,
        leader: NodeId,
        proposals: Vec<Proposal>,
        deadline: Instant,
    ) -> Vec<Result<ProposalResult, StoreError>> {
        let n = proposals.len();
        let Some(addr) = self.leader_addr(leader) else {
            return vec![Err(StoreError::NoLeader); n];
        };
        let timeout = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
        let r: Result<Vec<Result<ProposalResult, WireError>>, _> =
            self.inner.peers.call(&addr, leader, PeerMethod::Forward, &proposals, timeout).await;
        match r {
            Ok(results) => results.into_iter().map(|r| r.map_err(StoreError::from)).collect(),
            Err(e) => vec![Err(StoreError::Peer(e)); n],
        }
    }
}

/// Bytes of proposals the leader puts in one Raft entry (a single larger
/// write still gets an entry of its own), so that entries stay small enough
/// to replicate and fsync within a heartbeat.
const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;

fn proposal_size(p: &Proposal) -> usize {
    bincode::serialized_size(p).map_or(usize::MAX / 2, |n| n as usize)
}

/// How a batch is cut from a queue of waiting writes.
#[derive(Clone, Copy, Debug)]
struct Limits {
    /// Most writes in one batch.
    items: usize,
    /// Most bytes in one batch, unless its first write alone is larger.
    bytes: usize,
}

/// One batch being gathered from a queue: the batcher's Raft entry or the
/// forwarder's peer call. The first write opens it; each write waiting
/// after it joins until the batch is full, and the first that does not fit
/// (too large, or bound elsewhere) is carried over to open the next batch.
#[derive(Debug)]
struct Gather<T> {
    items: Vec<T>,
    bytes: usize,
    limits: Limits,
}

/// What became of a write offered to a [`Gather`].
#[derive(Debug)]
enum Offer<T> {
    Joined,
    /// It does not fit: it opens the next batch.
    Carry(T),
}

impl<T> Gather<T> {
    fn open(first: T, size: usize, limits: Limits) -> Gather<T> {
        Gather { items: vec![first], bytes: size, limits }
    }

    /// Whether another write may still join.
    fn has_room(&self) -> bool {
        self.items.len() < self.limits.items && self.bytes < self.limits.bytes
    }

    /// Offers the next waiting write; `belongs`: whether it may share this
    /// batch at all (the forwarder's writes must go to the same leader).
    fn offer(&mut self, item: T, size: usize, belongs: bool) -> Offer<T> {
        if !belongs || self.bytes + size > self.limits.bytes {
            return Offer::Carry(item);
        }
        self.bytes += size;
        self.items.push(item);
        Offer::Joined
    }
}

/// Cuts the next batch: `first` and the writes waiting behind it in `rx`,
/// within `limits`; returns it with the write carried over to the next one.
fn gather<T>(
    first: T,
    rx: &mut mpsc::Receiver<T>,
    limits: Limits,
    size: impl Fn(&T) -> usize,
    belongs: impl Fn(&T, &T) -> bool,
) -> (Vec<T>, Option<T>) {
    let first_size = size(&first);
    let mut batch = Gather::open(first, first_size, limits);
    while batch.has_room() {
        let Ok(next) = rx.try_recv() else { break };
        let (next_size, fits) = (size(&next), belongs(&batch.items[0], &next));
        if let Offer::Carry(next) = batch.offer(next, next_size, fits) {
            return (batch.items, Some(next));
        }
    }
    (batch.items, None)
}

/// Drains waiting writes into Raft entries, keeping up to `max_in_flight`
/// entries in flight; while they are, new writes queue up and form the next
/// batch.
pub(super) async fn run_batcher(
    raft: Raft,
    mut rx: mpsc::Receiver<PendingWrite>,
    max_batch: usize,
    max_in_flight: usize,
    mut hold: super::transfer::Hold,
    tasks: Shutdown,
) {
    let slots = Arc::new(Semaphore::new(max_in_flight.max(1)));
    // A write that did not fit the previous entry opens the next one.
    let mut carry: Option<PendingWrite> = None;
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let first = match carry.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        // A leadership transfer in progress: the entry would renew the
        // followers' leases and keep the target from being elected.
        hold.released().await;
        let limits = Limits { items: max_batch, bytes: MAX_BATCH_BYTES };
        let (pending, next) = gather(first, &mut rx, limits, |w| proposal_size(&w.proposal), |_, _| true);
        carry = next;
        let raft = raft.clone();
        let m = crate::metrics::metrics();
        m.batch_size.observe(pending.len() as f64);
        m.proposals_pending.add(pending.len() as i64);
        let stop = tasks.clone();
        tasks.spawn(async move {
            // The proposals move into the entry; only the reply channels stay.
            let (proposals, replies): (Vec<_>, Vec<_>) = pending.into_iter().map(|p| (p.proposal, p.reply)).unzip();
            let write = raft.client_write(Batch { timestamp_ms: now_ms(), proposals: proposals.into() });
            let outcome = tokio::select! {
                outcome = write => Some(outcome),
                // The entry may still commit; its writers hear that the
                // store stopped, as after a timeout.
                _ = stop.cancelled() => None,
            };
            drop(slot);
            let Some(outcome) = outcome else {
                m.proposals_pending.sub(replies.len() as i64);
                return;
            };
            m.proposals_pending.sub(replies.len() as i64);
            match outcome {
                Ok(resp) => {
                    m.proposals_committed.inc_by(replies.len() as u64);
                    let mut results = resp.data.results.into_iter();
                    for reply in replies {
                        let r = results.next().ok_or_else(|| StoreError::Internal("missing result".into()));
                        let _ = reply.send(r);
                    }
                }
                Err(e) => {
                    m.proposals_failed.inc_by(replies.len() as u64);
                    let err = match e {
                        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
                            StoreError::NotLeader { leader: f.leader_id }
                        }
                        other => StoreError::raft("write", other),
                    };
                    for reply in replies {
                        let _ = reply.send(Err(err.clone()));
                    }
                }
            }
        });
    }
}

/// A follower's side of write batching: every write waiting to go to the
/// leader at that moment goes in one `Forward` call, which the leader's
/// batcher drains into one entry, instead of one call per write (whose
/// HTTP/2 framing and task hand-offs cost the leader more than the write
/// itself). Calls do not wait for each other.
pub(super) async fn run_forwarder(inner: std::sync::Weak<Inner>, mut rx: mpsc::Receiver<PendingForward>) {
    let mut carry: Option<PendingForward> = None;
    loop {
        let first = match carry.take() {
            Some(f) => f,
            None => match rx.recv().await {
                Some(f) => f,
                // The store is gone.
                None => return,
            },
        };
        // The writes arriving with this one (the calls of a client
        // connection, which are polled together) queue up first.
        tokio::task::yield_now().await;
        let Some(inner) = inner.upgrade() else { return };
        let leader = first.leader;
        let limits = Limits { items: inner.config.max_batch, bytes: MAX_BATCH_BYTES };
        let size = |f: &PendingForward| proposal_size(&f.write.proposal);
        let (forwards, next) = gather(first, &mut rx, limits, size, |a, b| a.leader == b.leader);
        carry = next;
        // The call may run until the latest deadline of its writes: one
        // with an earlier deadline gets its answer late rather than a
        // spurious failure.
        let deadline = forwards.iter().map(|f| f.deadline).max().expect("a batch has a first write");
        let batch: Vec<_> = forwards.into_iter().map(|f| f.write).collect();
        crate::metrics::metrics().forward_batch_size.observe(batch.len() as f64);
        let store = Store { inner };
        let task = store.clone();
        task.spawn(async move {
            let (proposals, replies): (Vec<_>, Vec<_>) = batch.into_iter().map(|w| (w.proposal, w.reply)).unzip();
            let mut results = store.forward(leader, proposals, deadline).await.into_iter();
            for reply in replies {
                let _ =
                    reply.send(results.next().unwrap_or_else(|| Err(StoreError::Internal("missing result".into()))));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits { items: 4, bytes: 100 };

    /// Queues `(name, size)` writes and cuts one batch from them.
    fn cut(
        first: (&'static str, usize),
        waiting: &[(&'static str, usize)],
    ) -> (Vec<&'static str>, Option<&'static str>) {
        let (tx, mut rx) = mpsc::channel(16);
        for w in waiting {
            tx.try_send(*w).expect("room in the queue");
        }
        let (batch, carry) = gather(first, &mut rx, LIMITS, |w| w.1, |_, _| true);
        (batch.into_iter().map(|w| w.0).collect(), carry.map(|w| w.0))
    }

    #[test]
    fn every_waiting_write_joins_the_batch_up_to_the_item_limit() {
        let (batch, carry) = cut(("a", 1), &[("b", 1), ("c", 1), ("d", 1), ("e", 1)]);
        assert_eq!(batch, ["a", "b", "c", "d"]);
        // "e" stays queued for the next batch: it was never taken out.
        assert_eq!(carry, None);
    }

    #[test]
    fn a_write_that_does_not_fit_the_bytes_opens_the_next_batch() {
        let (batch, carry) = cut(("a", 60), &[("b", 30), ("c", 20), ("d", 1)]);
        assert_eq!(batch, ["a", "b"]);
        assert_eq!(carry, Some("c"));
    }

    #[test]
    fn a_write_larger_than_the_limit_gets_a_batch_of_its_own() {
        let (batch, carry) = cut(("big", 500), &[("small", 1)]);
        assert_eq!((batch, carry), (vec!["big"], None));
        let (batch, carry) = cut(("small", 1), &[("big", 500)]);
        assert_eq!((batch, carry), (vec!["small"], Some("big")));
    }

    #[test]
    fn forwarded_writes_for_another_leader_go_in_the_next_call() {
        let (tx, mut rx) = mpsc::channel(16);
        for w in [(1, "b"), (2, "c"), (1, "d")] {
            tx.try_send(w).expect("room in the queue");
        }
        let (batch, carry) = gather((1, "a"), &mut rx, LIMITS, |_| 1, |a, b| a.0 == b.0);
        assert_eq!(batch, [(1, "a"), (1, "b")]);
        assert_eq!(carry, Some((2, "c")));
    }
}
