//! etcd's Maintenance service: what `etcdctl endpoint status`, `hashkv`,
//! `alarm`, `defrag`, `snapshot save` and `move-leader` need.
//!
//! Replies follow etcd 3.4's for the same request: `Status`, `Hash` and
//! `HashKV` carry a response header; `Alarm`, `Defragment`, `MoveLeader`
//! and the `Snapshot` chunks carry none.

use std::time::Instant;

use futures::stream::BoxStream;
use skiff_proto::etcdserverpb::alarm_request::AlarmAction;
use skiff_proto::etcdserverpb::maintenance_server::{Maintenance, MaintenanceServer};
use skiff_proto::etcdserverpb::{
    AlarmMember, AlarmRequest, AlarmResponse, AlarmType, DefragmentRequest, DefragmentResponse, HashKvRequest,
    HashKvResponse, HashRequest, HashResponse, MoveLeaderRequest, MoveLeaderResponse, ResponseHeader, SnapshotRequest,
    SnapshotResponse, StatusRequest, StatusResponse,
};
use tonic::{Request, Response, Status};

use crate::error::StoreError;
use crate::etcd::header;
use crate::store::{grpc_timeout, Store};
use crate::types::{Alarm, AlarmKind};

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
    /// The cluster's alarms (replicated, so every member answers alike).
    /// Listing is a linearizable read. A member raises NOSPACE itself when
    /// its database is over `--quota-backend-bytes` and clears it once
    /// compaction brings it back under; `etcdctl alarm disarm` clears it at
    /// once (the next write over the quota raises it again).
    async fn alarm(&self, request: Request<AlarmRequest>) -> Result<Response<AlarmResponse>, Status> {
        let req = request.into_inner();
        let kind = match AlarmType::try_from(req.alarm) {
            Ok(AlarmType::None) => None,
            Ok(AlarmType::Nospace) => Some(AlarmKind::NoSpace),
            Ok(AlarmType::Corrupt) => {
                return Err(Status::unimplemented("etcdserver: Skiff has no CORRUPT alarm; it raises only NOSPACE"))
            }
            Err(_) => return Err(Status::invalid_argument(format!("unknown alarm type {}", req.alarm))),
        };
        let alarms = match AlarmAction::try_from(req.action) {
            Ok(AlarmAction::Get) => {
                self.store.linearize().await?;
                let mut alarms = self.store.alarms()?;
                alarms.retain(|a| kind.is_none_or(|k| a.kind == k));
                alarms
            }
            Ok(action) => match kind {
                // etcd answers a change of alarm NONE with nothing changed.
                None => Vec::new(),
                Some(kind) => {
                    let alarm = Alarm { member: req.member_id, kind };
                    self.store.change_alarm(alarm, action == AlarmAction::Activate).await?
                }
            },
            Err(_) => return Err(Status::invalid_argument(format!("unknown alarm action {}", req.action))),
        };
        let alarms = alarms.iter().map(alarm_member).collect();
        Ok(Response::new(AlarmResponse { header: None, alarms }))
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
            // As etcd: "no leader" without one, then every raised alarm in
            // the text form `alarm list` prints.
            errors: status
                .leader
                .is_none()
                .then(|| StoreError::NoLeader.to_string())
                .into_iter()
                .chain(
                    self.store
                        .alarms()?
                        .iter()
                        .map(|a| format!("memberID:{} alarm:{}", a.member, alarm_type(a.kind).as_str_name())),
                )
                .collect(),
            db_size_in_use: db_size,
            is_learner: status.is_learner,
            ..Default::default()
        }))
    }

    /// Nothing to do: RocksDB reclaims space in its own compactions.
    async fn defragment(&self, request: Request<DefragmentRequest>) -> Result<Response<DefragmentResponse>, Status> {
        // etcd lets only the root role defragment, hash or back up.
        super::auth::caller(&self.store, request.metadata())?.admin()?;
        let sm = self.store.state_machine().clone();
        tokio::task::spawn_blocking(move || sm.reclaim_space())
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(|e| Status::internal(format!("defragment: {e}")))?;
        Ok(Response::new(DefragmentResponse { header: None }))
    }

    /// A hash of this member's whole keyspace (history, revision index,
    /// leases) at its current state.
    async fn hash(&self, request: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        // etcd lets only the root role defragment, hash or back up.
        super::auth::caller(&self.store, request.metadata())?.admin()?;
        let (hash, at) = self.store.hash_all().await?;
        Ok(Response::new(HashResponse { header: Some(header(at)), hash }))
    }

    /// A hash of every version of every key up to the requested revision
    /// (`etcdctl endpoint hashkv`): equal on every member at the same
    /// revision, as with etcd, which is how divergence is detected.
    async fn hash_kv(&self, request: Request<HashKvRequest>) -> Result<Response<HashKvResponse>, Status> {
        super::auth::caller(&self.store, request.metadata())?.admin()?;
        let ((hash, compact_revision, hash_revision), at) = self.store.hash_kv(request.into_inner().revision).await?;
        Ok(Response::new(HashKvResponse { header: Some(header(at)), hash, compact_revision, hash_revision }))
    }

    type SnapshotStream = BoxStream<'static, Result<SnapshotResponse, Status>>;

    /// A backup of this member's state: a RocksDB checkpoint packed into
    /// one file, streamed in chunks (never held whole in memory). Restore it
    /// with `skiff apiserver --restore-from FILE`.
    async fn snapshot(&self, request: Request<SnapshotRequest>) -> Result<Response<Self::SnapshotStream>, Status> {
        // etcd lets only the root role defragment, hash or back up.
        super::auth::caller(&self.store, request.metadata())?.admin()?;
        use tokio::io::AsyncReadExt;
        let sm = self.store.state_machine().clone();
        let path = tokio::task::spawn_blocking(move || sm.export())
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(|e| Status::internal(format!("snapshot: {e}")))?;
        let mut file = tokio::fs::File::open(&path).await.map_err(|e| Status::internal(e.to_string()))?;
        let total = file.metadata().await.map_err(|e| Status::internal(e.to_string()))?.len();
        // etcd 3.4 sends its chunks without a header.
        let header = None;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        // Like etcd, the stream ends with the SHA-256 of everything before
        // it (etcdctl checks that it is there); restore verifies it.
        let total = total + 32;
        self.store.spawn_stream(async move {
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

    /// Hands leadership to the target member, answering once it leads
    /// (see `Store::move_leader`). Only the leader takes the request, as
    /// with etcd; the deadline is the client's, within the store's request
    /// timeout.
    async fn move_leader(&self, request: Request<MoveLeaderRequest>) -> Result<Response<MoveLeaderResponse>, Status> {
        let timeout = self.store.config().request_timeout;
        let timeout = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(grpc_timeout)
            .map_or(timeout, |t| t.min(timeout));
        let target = request.into_inner().target_id;
        self.store.move_leader(target, Instant::now() + timeout).await?;
        Ok(Response::new(MoveLeaderResponse { header: None }))
    }
}

fn alarm_type(kind: AlarmKind) -> AlarmType {
    match kind {
        AlarmKind::NoSpace => AlarmType::Nospace,
    }
}

fn alarm_member(alarm: &Alarm) -> AlarmMember {
    AlarmMember { member_id: alarm.member, alarm: alarm_type(alarm.kind) as i32 }
}
