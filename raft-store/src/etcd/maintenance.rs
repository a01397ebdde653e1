//! etcd's Maintenance service: what `etcdctl endpoint status`, `alarm` and
//! `defrag` need. Hashes, snapshots over the client API and leader
//! transfer are not offered yet and say so.

use futures::stream::BoxStream;
use skiff_proto::etcdserverpb::maintenance_server::{Maintenance, MaintenanceServer};
use skiff_proto::etcdserverpb::{
    AlarmMember, AlarmRequest, AlarmResponse, AlarmType, DefragmentRequest, DefragmentResponse, HashKvRequest,
    HashKvResponse, HashRequest, HashResponse, MoveLeaderRequest, MoveLeaderResponse, ResponseHeader, SnapshotRequest,
    SnapshotResponse, StatusRequest, StatusResponse,
};
use tonic::{Request, Response, Status};

use crate::etcd::header;
use crate::store::Store;

/// The etcd version Skiff reports, the API level it serves.
pub const ETCD_VERSION: &str = "3.5.0";

/// The Maintenance service of one member.
#[derive(Clone)]
pub struct MaintenanceService {
    store: Store,
}

impl MaintenanceService {
    /// The Maintenance service as a tonic server.
    pub fn server(store: Store) -> MaintenanceServer<MaintenanceService> {
        MaintenanceServer::new(MaintenanceService { store })
    }

    fn header(&self) -> Option<ResponseHeader> {
        Some(header(self.store.header()))
    }
}

fn not_supported(what: &str) -> Status {
    Status::unimplemented(format!("{what} is not supported by Skiff yet"))
}

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    /// No alarms exist yet: every action answers with an empty list.
    async fn alarm(&self, _: Request<AlarmRequest>) -> Result<Response<AlarmResponse>, Status> {
        // NOSPACE is derived from the database size, so it clears itself once
        // compaction (and defragmentation) bring the size under the quota;
        // disarming is accepted and changes nothing.
        let alarms = if self.store.over_quota() {
            vec![AlarmMember { member_id: self.store.id(), alarm: AlarmType::Nospace as i32 }]
        } else {
            Vec::new()
        };
        Ok(Response::new(AlarmResponse { header: self.header(), alarms }))
    }

    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        let status = self.store.status();
        let db_size = i64::try_from(status.db_size).unwrap_or(i64::MAX);
        Ok(Response::new(StatusResponse {
            header: self.header(),
            version: ETCD_VERSION.into(),
            db_size,
            leader: status.leader.unwrap_or(0),
            raft_index: status.last_log_index,
            raft_term: status.term,
            raft_applied_index: status.applied_index,
            errors: Vec::new(),
            db_size_in_use: db_size,
            is_learner: status.is_learner,
            ..Default::default()
        }))
    }

    /// Nothing to do: RocksDB reclaims space in its own compactions.
    async fn defragment(&self, _: Request<DefragmentRequest>) -> Result<Response<DefragmentResponse>, Status> {
        let sm = self.store.state_machine().clone();
        tokio::task::spawn_blocking(move || sm.reclaim_space())
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(|e| Status::internal(format!("defragment: {e}")))?;
        Ok(Response::new(DefragmentResponse { header: self.header() }))
    }

    async fn hash(&self, _: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        Err(not_supported("Hash"))
    }

    async fn hash_kv(&self, _: Request<HashKvRequest>) -> Result<Response<HashKvResponse>, Status> {
        Err(not_supported("HashKV"))
    }

    type SnapshotStream = BoxStream<'static, Result<SnapshotResponse, Status>>;

    async fn snapshot(&self, _: Request<SnapshotRequest>) -> Result<Response<Self::SnapshotStream>, Status> {
        Err(not_supported("Snapshot"))
    }

    async fn move_leader(&self, _: Request<MoveLeaderRequest>) -> Result<Response<MoveLeaderResponse>, Status> {
        Err(not_supported("MoveLeader"))
    }
}
