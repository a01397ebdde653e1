//! Skiff's own `Control` service, served beside etcd's: a key's full
//! history (for `skiffctl history`), and the join handshake a fresh member
//! sends (see [`crate::join`]).

use skiff_proto::control::control_server::{Control, ControlServer};
use skiff_proto::control::{self as wire, HistoryRequest, HistoryResponse, JoinRequest, JoinResponse};
use skiff_proto::mvccpb;
use tonic::{Request, Response, Status};

use crate::changes::HistoryEntry;
use crate::error::StoreError;
use crate::etcd::cluster::peer_addr;
use crate::etcd::convert::RequestError;
use crate::etcd::header;
use crate::etcd::status::unexpected;
use crate::store::{AdminRequest, AdminResponse, Header, Store};
use crate::types::MemberInfo;

/// Longest a join may wait for the new member to catch up; also keeps the
/// client's number far from overflow.
const MAX_JOIN_TIMEOUT_MS: u64 = 60 * 60 * 1000;

/// The Control service of one member.
#[derive(Clone)]
pub struct ControlService {
    store: Store,
}

impl ControlService {
    /// The Control service as a tonic server.
    pub fn server(store: Store) -> ControlServer<ControlService> {
        ControlServer::new(ControlService { store })
    }
}

fn entry(e: HistoryEntry) -> wire::HistoryEntry {
    wire::HistoryEntry {
        revision: e.revision,
        commit_time_ms: e.timestamp_ms,
        r#type: mvccpb::event::EventType::from(e.kind) as i32,
        kv: Some(e.kv.into()),
    }
}

#[tonic::async_trait]
impl Control for ControlService {
    /// Linearizable unless `serializable`; the compaction point says where
    /// the (possibly truncated) history begins.
    async fn history(&self, request: Request<HistoryRequest>) -> Result<Response<HistoryResponse>, Status> {
        let request = request.into_inner();
        if request.key.is_empty() {
            return Err(RequestError::EmptyKey.into());
        }
        if !request.serializable {
            self.store.linearize().await?;
        }
        let history = self.store.history(request.key).await?;
        Ok(Response::new(HistoryResponse {
            header: Some(header(Header { revision: history.revision, ..self.store.header() })),
            entries: history.entries.into_iter().map(entry).collect(),
            compact_revision: history.compacted,
        }))
    }

    /// Adds the member as a learner, waits for it to catch up, then makes
    /// it a voter; answers once it is one. A `timeout_ms` of 0 means this
    /// member's configured join timeout.
    async fn join(&self, request: Request<JoinRequest>) -> Result<Response<JoinResponse>, Status> {
        let request = request.into_inner();
        if request.id == 0 {
            return Err(StoreError::InvalidArgument("member id 0 is reserved: choose an id of 1 or more".into()).into());
        }
        let addr = peer_addr(&request.peer_urls)?;
        let timeout_ms = match request.timeout_ms {
            0 => u64::try_from(self.store.config().join_timeout.as_millis()).unwrap_or(u64::MAX),
            ms => ms,
        }
        .min(MAX_JOIN_TIMEOUT_MS);
        let info = MemberInfo {
            id: request.id,
            name: request.name,
            peer_urls: vec![format!("http://{addr}")],
            client_urls: request.client_urls,
            incarnation: request.incarnation,
        };
        match self.store.admin(AdminRequest::Join { info, timeout_ms }).await? {
            AdminResponse::Joined { cluster_id } => Ok(Response::new(JoinResponse { cluster_id })),
            other => Err(unexpected(other)),
        }
    }
}
