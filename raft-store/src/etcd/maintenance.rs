//! etcd's Maintenance service: what `etcdctl endpoint status`, `hashkv`,
//! `alarm`, `defrag` and `snapshot save` need. Leader transfer is not
//! offered (openraft 0.9 has no leadership transfer) and says so.

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

/// Bytes per message of a streamed backup.
const SNAPSHOT_CHUNK: usize = 64 * 1024;

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

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    /// NOSPACE is the only alarm: listed while this member's database is
    /// over `--quota-backend-bytes`.
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

    /// A hash of this member's whole keyspace (history, revision index,
    /// leases) at its current state.
    async fn hash(&self, _: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        let (hash, at) = self.store.hash_all().await?;
        Ok(Response::new(HashResponse { header: Some(header(at)), hash }))
    }

    /// A hash of every version of every key up to the requested revision
    /// (`etcdctl endpoint hashkv`): equal on every member at the same
    /// revision, as with etcd, which is how divergence is detected.
    async fn hash_kv(&self, request: Request<HashKvRequest>) -> Result<Response<HashKvResponse>, Status> {
        let ((hash, compact_revision, hash_revision), at) = self.store.hash_kv(request.into_inner().revision).await?;
        Ok(Response::new(HashKvResponse { header: Some(header(at)), hash, compact_revision, hash_revision }))
    }

    type SnapshotStream = BoxStream<'static, Result<SnapshotResponse, Status>>;

    /// A backup of this member's state: a RocksDB checkpoint packed into
    /// one file, streamed in chunks (never held whole in memory). Restore it
    /// with `skiff apiserver --restore-from FILE`.
    async fn snapshot(&self, _: Request<SnapshotRequest>) -> Result<Response<Self::SnapshotStream>, Status> {
        use tokio::io::AsyncReadExt;
        let sm = self.store.state_machine().clone();
        let path = tokio::task::spawn_blocking(move || sm.export())
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(|e| Status::internal(format!("snapshot: {e}")))?;
        let mut file = tokio::fs::File::open(&path).await.map_err(|e| Status::internal(e.to_string()))?;
        let total = file.metadata().await.map_err(|e| Status::internal(e.to_string()))?.len();
        let header = self.header();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        // Like etcd, the stream ends with the SHA-256 of everything before
        // it (etcdctl checks that it is there); restore verifies it.
        let total = total + 32;
        tokio::spawn(async move {
            use sha2::Digest;
            let mut hash = sha2::Sha256::new();
            let mut sent = 0u64;
            loop {
                let mut blob = vec![0u8; SNAPSHOT_CHUNK];
                let n = match file.read(&mut blob).await {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) => {
                        let _ = tx.send(Err(Status::internal(e.to_string()))).await;
                        break;
                    }
                };
                blob.truncate(n);
                hash.update(&blob);
                sent += n as u64;
                let chunk = SnapshotResponse {
                    header,
                    remaining_bytes: total.saturating_sub(sent),
                    blob,
                    version: String::new(),
                };
                if tx.send(Ok(chunk)).await.is_err() {
                    let _ = tokio::fs::remove_file(&path).await;
                    return;
                }
            }
            let trailer =
                SnapshotResponse { header, remaining_bytes: 0, blob: hash.finalize().to_vec(), version: String::new() };
            let _ = tx.send(Ok(trailer)).await;
            let _ = tokio::fs::remove_file(&path).await;
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn move_leader(&self, _: Request<MoveLeaderRequest>) -> Result<Response<MoveLeaderResponse>, Status> {
        Err(Status::unimplemented(
            "MoveLeader is not supported: Skiff's Raft (openraft 0.9) has no leadership transfer; \
             stopping the leader's process hands leadership over within an election timeout",
        ))
    }
}
