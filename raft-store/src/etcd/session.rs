//! What etcd's Lock and Election services share: a lease-backed session
//! and a queue of keys under one prefix, ordered by create revision.
//!
//! etcd runs its client-side concurrency recipes inside the server for
//! these two services; Skiff does the same against its own KV service, so
//! the keys, revisions and errors are the ones an etcd client sees: a
//! contender puts `<prefix><lease in hex>` under its lease, and its turn
//! comes once every key under the prefix with a lower create revision has
//! been deleted (unlocked, resigned, or gone with its lease). Each waiter
//! watches only the key just ahead of it, so a release wakes one waiter.

use skiff_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use skiff_proto::etcdserverpb::kv_server::Kv;
use skiff_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use skiff_proto::etcdserverpb::request_op::Request as Op;
use skiff_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RangeResponse, RequestOp, ResponseHeader, TxnRequest,
    TxnResponse,
};
use skiff_proto::mvccpb;
use skiff_proto::v3electionpb::LeaderResponse;
use tonic::{Request, Status};

use crate::changes::ChangesError;
use crate::etcd::kv::KvService;
use crate::mvcc::EventKind;
use crate::store::Store;

/// TTL of the lease granted for a request that names none (etcd's session
/// default). Nobody keeps it alive: the ownership ends when it runs out.
pub const DEFAULT_TTL_SECONDS: i64 = 60;

/// A lease-backed session: the KV service the recipes go through and the
/// lease their keys are attached to.
#[derive(Clone)]
pub struct Session {
    store: Store,
    kv: KvService,
    lease: i64,
}

impl Session {
    /// A session on `lease`, or on a fresh lease of [`DEFAULT_TTL_SECONDS`]
    /// if it is 0. A lease that does not exist is not detected here but
    /// by the first put under it (etcd's "requested lease not found").
    pub async fn open(store: &Store, lease: i64) -> Result<Session, Status> {
        let lease = match lease {
            0 => store.lease_grant(0, DEFAULT_TTL_SECONDS).await?.0,
            id => id,
        };
        Ok(Session { store: store.clone(), kv: KvService::new(store.clone()), lease })
    }

    /// A session without a lease, for the requests that only read.
    pub fn reader(store: &Store) -> Session {
        Session { store: store.clone(), kv: KvService::new(store.clone()), lease: 0 }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// An Election `LeaderResponse` for `kv`, as of its last change.
    pub fn leader_response(&self, kv: mvccpb::KeyValue) -> LeaderResponse {
        let header = ResponseHeader { revision: kv.mod_revision, ..super::header(self.store.header()) };
        LeaderResponse { header: Some(header), kv: Some(kv) }
    }

    pub fn lease(&self) -> i64 {
        self.lease
    }

    /// This session's key under `prefix`.
    pub fn key(&self, prefix: &[u8]) -> Vec<u8> {
        let mut key = prefix.to_vec();
        key.extend_from_slice(format!("{:x}", self.lease).as_bytes());
        key
    }

    pub async fn txn(&self, txn: TxnRequest) -> Result<TxnResponse, Status> {
        Ok(self.kv.txn(Request::new(txn)).await?.into_inner())
    }

    pub async fn range(&self, range: RangeRequest) -> Result<RangeResponse, Status> {
        Ok(self.kv.range(Request::new(range)).await?.into_inner())
    }

    /// Puts this session's key under `prefix` with `value` unless it exists;
    /// either way also reads the key the prefix's queue starts with. Returns
    /// the txn response: `succeeded` if the key was created, and the
    /// responses `[put or get of the key, first-created key]`.
    pub async fn enqueue(&self, prefix: &[u8], value: &[u8]) -> Result<TxnResponse, Status> {
        let key = self.key(prefix);
        let put = PutRequest { key: key.clone(), value: value.to_vec(), lease: self.lease, ..Default::default() };
        let get = RangeRequest { key: key.clone(), ..Default::default() };
        self.txn(TxnRequest {
            compare: vec![create_revision_is(&key, 0)],
            success: vec![op(Op::RequestPut(put)), op(Op::RequestRange(first_created(prefix)))],
            failure: vec![op(Op::RequestRange(get)), op(Op::RequestRange(first_created(prefix)))],
        })
        .await
    }

    /// Waits until no key under `prefix` has a create revision of
    /// `max_create_revision` or lower; returns the header of the read that
    /// found none left.
    pub async fn wait_deletes(&self, prefix: &[u8], max_create_revision: i64) -> Result<ResponseHeader, Status> {
        loop {
            let ahead = self.range(RangeRequest { max_create_revision, ..last_created(prefix) }).await?;
            let Some(kv) = ahead.kvs.first() else {
                return ahead.header.ok_or_else(|| Status::internal("range response without a header"));
            };
            let from = ahead.header.as_ref().map_or(0, |h| h.revision);
            self.wait_delete(&kv.key, from).await?;
        }
    }

    /// Waits until `key` is deleted at revision `from` or later.
    async fn wait_delete(&self, key: &[u8], from: i64) -> Result<(), Status> {
        let mut changes = self.store.subscribe(key, &[], Some(from));
        loop {
            let revisions = changes.next().await.map_err(changes_status)?;
            let deleted =
                revisions.iter().flat_map(|r| r.events.iter()).any(|e| e.kind == EventKind::Delete && e.kv.key == key);
            if deleted {
                return Ok(());
            }
        }
    }

    /// Deletes `key` if its create revision is still `revision`; the txn's
    /// header either way.
    pub async fn delete_if_created_at(&self, key: &[u8], revision: i64) -> Result<Option<ResponseHeader>, Status> {
        let delete = DeleteRangeRequest { key: key.to_vec(), ..Default::default() };
        let response = self
            .txn(TxnRequest {
                compare: vec![create_revision_is(key, revision)],
                success: vec![op(Op::RequestDeleteRange(delete))],
                failure: vec![],
            })
            .await?;
        Ok(response.header)
    }
}

/// Undoes a contender's enqueue when its request ends before it got its
/// turn (the client went away): the key would otherwise later hand the
/// lock or leadership to nobody. etcd does the same on a cancelled context.
pub struct Withdraw {
    session: Session,
    key: Vec<u8>,
    revision: i64,
    armed: bool,
}

impl Withdraw {
    pub fn new(session: Session, key: Vec<u8>, revision: i64) -> Withdraw {
        Withdraw { session, key, revision, armed: true }
    }

    /// The request succeeded: the key stays.
    pub fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Outside a runtime (the process is ending) the lease cleans up.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let session = self.session.clone();
        let key = std::mem::take(&mut self.key);
        let revision = self.revision;
        runtime.spawn(async move {
            if let Err(e) = session.delete_if_created_at(&key, revision).await {
                tracing::warn!(key = %String::from_utf8_lossy(&key), error = %e, "withdrawing an abandoned contender");
            }
        });
    }
}

/// Compare: `key`'s create revision is `revision` (0: the key is absent).
pub fn create_revision_is(key: &[u8], revision: i64) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Create as i32,
        key: key.to_vec(),
        range_end: Vec::new(),
        target_union: Some(TargetUnion::CreateRevision(revision)),
    }
}

pub fn op(request: Op) -> RequestOp {
    RequestOp { request: Some(request) }
}

/// The first-created key under `prefix` (the owner, the leader).
pub fn first_created(prefix: &[u8]) -> RangeRequest {
    RangeRequest {
        key: prefix.to_vec(),
        range_end: prefix_end(prefix),
        limit: 1,
        sort_order: SortOrder::Ascend as i32,
        sort_target: SortTarget::Create as i32,
        ..Default::default()
    }
}

/// The last-created key under `prefix`.
fn last_created(prefix: &[u8]) -> RangeRequest {
    RangeRequest { sort_order: SortOrder::Descend as i32, ..first_created(prefix) }
}

/// The end of the range of keys starting with `prefix`, by etcd's rule:
/// the prefix with its last byte below 0xff incremented and the rest cut;
/// `\0` (every key from the prefix on) if there is no such byte.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// The status a failed change feed ends a waiting request with.
pub fn changes_status(e: ChangesError) -> Status {
    match e {
        ChangesError::Compacted { .. } => Status::out_of_range(e.to_string()),
        ChangesError::Read(e) => e.into(),
        ChangesError::Closed => Status::unavailable("etcdserver: server stopped"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_the_last_byte_below_0xff() {
        assert_eq!(prefix_end(b"lock/"), b"lock0".to_vec());
        assert_eq!(prefix_end(b"a\xff\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }

    #[test]
    fn queue_reads_sort_by_create_revision_and_take_one() {
        let first = first_created(b"e/");
        assert_eq!(
            (first.limit, first.sort_target, first.sort_order),
            (1, SortTarget::Create as i32, SortOrder::Ascend as i32)
        );
        let last = last_created(b"e/");
        assert_eq!((last.range_end.as_slice(), last.sort_order), (&b"e0"[..], SortOrder::Descend as i32));
    }
}
