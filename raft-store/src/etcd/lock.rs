//! etcd's Lock service (`v3lockpb.Lock`), served as etcd serves it: the
//! mutex recipe run inside the server (see [`session`](super::session)).
//!
//! `Lock` puts `<name>/<lease hex>` under the caller's lease and answers
//! once every key under `<name>/` created before it is gone; the answer's
//! key is the ownership, and the lock is released when `Unlock` deletes it
//! or the lease expires or is revoked. A `Lock` whose client goes away
//! while it waits withdraws its key.

use skiff_proto::etcdserverpb::kv_server::Kv;
use skiff_proto::etcdserverpb::response_op::Response as OpResponse;
use skiff_proto::etcdserverpb::DeleteRangeRequest;
use skiff_proto::v3lockpb::lock_server::{Lock, LockServer};
use skiff_proto::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use tonic::{Request, Response, Status};

use crate::etcd::kv::KvService;
use crate::etcd::session::{Session, Withdraw};
use crate::store::Store;

/// The Lock service of one member.
pub struct LockService {
    store: Store,
}

impl LockService {
    pub fn server(store: Store) -> LockServer<LockService> {
        LockServer::new(LockService { store })
    }
}

#[tonic::async_trait]
impl Lock for LockService {
    async fn lock(&self, request: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        let req = request.into_inner();
        let session = Session::open(&self.store, req.lease).await?;
        let mut prefix = req.name;
        prefix.push(b'/');
        let key = session.key(&prefix);
        let enqueued = session.enqueue(&prefix, b"").await?;
        let txn_header = enqueued.header;
        let mut responses = enqueued.responses.into_iter().map(|r| r.response);
        let mine = responses.next().flatten();
        let owner = match responses.next().flatten() {
            Some(OpResponse::ResponseRange(r)) => r.kvs.into_iter().next(),
            _ => return Err(Status::internal("lock: queue read missing from the txn response")),
        };
        // Our key's create revision: this txn's revision if it created the
        // key, else the key's (a second Lock under the same lease).
        let revision = if enqueued.succeeded {
            txn_header.as_ref().map_or(0, |h| h.revision)
        } else {
            match mine {
                Some(OpResponse::ResponseRange(r)) => r.kvs.first().map_or(0, |kv| kv.create_revision),
                _ => return Err(Status::internal("lock: key read missing from the txn response")),
            }
        };
        if owner.is_none_or(|o| o.create_revision == revision) {
            return Ok(Response::new(LockResponse { header: txn_header, key }));
        }
        let withdraw = Withdraw::new(session.clone(), key.clone(), revision);
        let header = session.wait_deletes(&prefix, revision - 1).await?;
        withdraw.disarm();
        Ok(Response::new(LockResponse { header: Some(header), key }))
    }

    async fn unlock(&self, request: Request<UnlockRequest>) -> Result<Response<UnlockResponse>, Status> {
        let key = request.into_inner().key;
        let kv = KvService::new(self.store.clone());
        let deleted = kv.delete_range(Request::new(DeleteRangeRequest { key, ..Default::default() })).await?;
        Ok(Response::new(UnlockResponse { header: deleted.into_inner().header }))
    }
}
