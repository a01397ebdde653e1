//! etcd's KV service.
//!
//! `Range` is a read: linearizable unless the client asks for a
//! serializable one, served from this member's state. `Put`, `DeleteRange`
//! and `Txn` are all replicated as one `Command::Txn` (a txn that only reads
//! goes through the log too, which keeps it linearizable with the writes
//! around it), and `Compact` as `Command::Compact`. Responses carry the
//! revision the write produced.

use skiff_proto::etcdserverpb::kv_server::{Kv, KvServer};
use skiff_proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse,
    RangeRequest, RangeResponse, ResponseHeader, TxnRequest, TxnResponse,
};
use tonic::{Request, Response, Status};

use crate::etcd::auth;
use crate::etcd::convert::{self, MAX_REQUEST_BYTES};
use crate::etcd::header;
use crate::etcd::status::unexpected;
use crate::store::{Header, Store};
use crate::types::{Command, Output, TxnResult};

/// Largest gRPC message the KV server decodes: etcd's request limit plus
/// 512 KiB of headroom (as etcd allows), so that a request a little over
/// the limit gets etcd's "request is too large" rather than a transport
/// error.
pub const MAX_DECODING_BYTES: usize = MAX_REQUEST_BYTES + 512 * 1024;

/// The KV service of one member.
#[derive(Clone)]
pub struct KvService {
    store: Store,
}

impl KvService {
    /// The KV service as a tonic server, with etcd's message size limit.
    pub fn server(store: Store) -> KvServer<KvService> {
        KvServer::new(KvService { store }).max_decoding_message_size(MAX_DECODING_BYTES)
    }

    /// The KV service as called from inside the server (the Lock and
    /// Election recipes).
    pub(crate) fn new(store: Store) -> KvService {
        KvService { store }
    }

    /// Replicates a txn command; returns its result and the revision after it.
    async fn write_txn(&self, command: Command) -> Result<(TxnResult, i64), Status> {
        match self.store.write(command).await? {
            Output::Txn { result, revision } => Ok((result, revision)),
            other => Err(unexpected(other)),
        }
    }

    /// The full response header at `revision`.
    fn header_at(&self, revision: i64) -> Option<ResponseHeader> {
        Some(header(Header { revision, ..self.store.header() }))
    }
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn range(&self, request: Request<RangeRequest>) -> Result<Response<RangeResponse>, Status> {
        let caller = auth::caller(&self.store, request.metadata())?;
        let request = request.into_inner();
        caller.read(&request.key, &request.range_end)?;
        let serializable = request.serializable;
        let range = convert::range_request(request)?;
        let (result, at) = self.store.range(range, serializable).await?;
        let mut response = convert::range_response(result, at.revision);
        response.header = Some(header(at));
        Ok(Response::new(response))
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        auth::caller(&self.store, request.metadata())?.put(request.get_ref())?;
        let command = convert::put_command(request.into_inner())?;
        let (result, revision) = self.write_txn(command).await?;
        let mut response = convert::put_response(result, revision).ok_or_else(|| unexpected("no put result"))?;
        response.header = self.header_at(revision);
        Ok(Response::new(response))
    }

    async fn delete_range(
        &self,
        request: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        auth::caller(&self.store, request.metadata())?.delete(request.get_ref())?;
        let command = convert::delete_command(request.into_inner())?;
        let (result, revision) = self.write_txn(command).await?;
        let mut response = convert::delete_response(result, revision).ok_or_else(|| unexpected("no delete result"))?;
        response.header = self.header_at(revision);
        Ok(Response::new(response))
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        auth::caller(&self.store, request.metadata())?.txn(request.get_ref())?;
        let command = convert::txn_command(request.into_inner())?;
        let (result, revision) = self.write_txn(command).await?;
        let mut response = convert::txn_response(result, revision);
        response.header = self.header_at(revision);
        Ok(Response::new(response))
    }

    /// `physical` is accepted and ignored: compaction is applied with the
    /// entry, and RocksDB reclaims the space in its own compactions.
    async fn compact(&self, request: Request<CompactionRequest>) -> Result<Response<CompactionResponse>, Status> {
        auth::caller(&self.store, request.metadata())?.admin()?;
        let revision = request.into_inner().revision;
        match self.store.write(Command::Compact { revision }).await? {
            Output::Compacted { .. } => {
                Ok(Response::new(CompactionResponse { header: Some(header(self.store.header())) }))
            }
            other => Err(unexpected(other)),
        }
    }
}
