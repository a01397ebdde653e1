//! etcd's Election service (`v3electionpb.Election`), served as etcd
//! serves it: the election recipe run inside the server (see
//! [`session`](super::session)).
//!
//! A campaigner puts `<name>/<lease hex>` with its value under its lease
//! and leads once every key under `<name>/` created before it is gone. The
//! leader is the first-created key; `Proclaim` rewrites its value while its
//! create revision is unchanged, `Resign` deletes it, and the lease's end
//! deletes it too. `Observe` streams the leader's key-value: the current
//! one, each new value, and each next leader.

use skiff_proto::etcdserverpb::request_op::Request as Op;
use skiff_proto::etcdserverpb::response_op::Response as OpResponse;
use skiff_proto::etcdserverpb::{PutRequest, ResponseHeader, TxnRequest};
use skiff_proto::v3electionpb::election_server::{Election, ElectionServer};
use skiff_proto::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest, LeaderResponse, ProclaimRequest, ProclaimResponse,
    ResignRequest, ResignResponse,
};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

use crate::etcd::session::{changes_status, create_revision_is, first_created, op, prefix_end, Session, Withdraw};
use crate::mvcc::EventKind;
use crate::store::Store;

/// etcd's `concurrency.ErrElectionNotLeader`.
const NOT_LEADER: &str = "election: not leader";
/// etcd's `concurrency.ErrElectionNoLeader`.
const NO_LEADER: &str = "election: no leader";
/// etcd's `v3election.ErrMissingLeaderKey`.
const MISSING_LEADER_KEY: &str = "\"leader\" field must be provided";

/// Leader updates buffered per `Observe` stream.
const OBSERVE_BUFFER: usize = 16;

/// The Election service of one member.
pub struct ElectionService {
    store: Store,
}

impl ElectionService {
    pub fn server(store: Store) -> ElectionServer<ElectionService> {
        ElectionServer::new(ElectionService { store })
    }
}

fn prefix_of(name: &[u8]) -> Vec<u8> {
    let mut prefix = name.to_vec();
    prefix.push(b'/');
    prefix
}

type ObserveStream = super::ResponseStream<LeaderResponse>;

#[tonic::async_trait]
impl Election for ElectionService {
    async fn campaign(&self, request: Request<CampaignRequest>) -> Result<Response<CampaignResponse>, Status> {
        let req = request.into_inner();
        let session = Session::open(&self.store, req.lease).await?;
        let prefix = prefix_of(&req.name);
        let key = session.key(&prefix);
        let enqueued = session.enqueue(&prefix, &req.value).await?;
        let header = enqueued.header;
        let mut revision = header.as_ref().map_or(0, |h| h.revision);
        if !enqueued.succeeded {
            // Campaigning again under the same lease: keep the key and its
            // place, and proclaim the new value if it differs.
            let existing = match enqueued.responses.into_iter().next().and_then(|r| r.response) {
                Some(OpResponse::ResponseRange(r)) => r.kvs.into_iter().next(),
                _ => None,
            };
            let existing = existing.ok_or_else(|| Status::internal("campaign: key read missing"))?;
            revision = existing.create_revision;
            if existing.value != req.value {
                proclaim(&session, &key, revision, req.value).await?;
            }
        }
        let withdraw = Withdraw::new(session.clone(), key.clone(), revision);
        session.wait_deletes(&prefix, revision - 1).await?;
        withdraw.disarm();
        let leader = LeaderKey { name: req.name, key, rev: revision, lease: session.lease() };
        Ok(Response::new(CampaignResponse { header, leader: Some(leader) }))
    }

    async fn proclaim(&self, request: Request<ProclaimRequest>) -> Result<Response<ProclaimResponse>, Status> {
        let req = request.into_inner();
        let leader = req.leader.ok_or_else(|| Status::unknown(MISSING_LEADER_KEY))?;
        let session = Session::open(&self.store, leader.lease).await?;
        let header = proclaim(&session, &leader.key, leader.rev, req.value).await?;
        Ok(Response::new(ProclaimResponse { header }))
    }

    async fn leader(&self, request: Request<LeaderRequest>) -> Result<Response<LeaderResponse>, Status> {
        let prefix = prefix_of(&request.into_inner().name);
        let found = Session::reader(&self.store).range(first_created(&prefix)).await?;
        let kv = found.kvs.into_iter().next().ok_or_else(|| Status::unknown(NO_LEADER))?;
        Ok(Response::new(LeaderResponse { header: found.header, kv: Some(kv) }))
    }

    type ObserveStream = ObserveStream;

    async fn observe(&self, request: Request<LeaderRequest>) -> Result<Response<ObserveStream>, Status> {
        let prefix = prefix_of(&request.into_inner().name);
        let (tx, rx) = mpsc::channel(OBSERVE_BUFFER);
        let session = Session::reader(&self.store);
        self.store.spawn_stream(async move {
            if let Err(e) = observe(&session, &prefix, &tx).await {
                let _ = tx.send(Err(e)).await;
            }
        });
        Ok(Response::new(super::until_stopping(&self.store, rx)))
    }

    async fn resign(&self, request: Request<ResignRequest>) -> Result<Response<ResignResponse>, Status> {
        let leader = request.into_inner().leader.ok_or_else(|| Status::unknown(MISSING_LEADER_KEY))?;
        let session = Session::open(&self.store, leader.lease).await?;
        // As etcd: resigning a leadership already lost deletes nothing and
        // is not an error.
        let header = session.delete_if_created_at(&leader.key, leader.rev).await?;
        Ok(Response::new(ResignResponse { header }))
    }
}

/// Rewrites the leader key's value if its create revision is still
/// `revision` (the caller still leads).
async fn proclaim(
    session: &Session,
    key: &[u8],
    revision: i64,
    value: Vec<u8>,
) -> Result<Option<ResponseHeader>, Status> {
    let put = PutRequest { key: key.to_vec(), value, lease: session.lease(), ..Default::default() };
    let response = session
        .txn(TxnRequest {
            compare: vec![create_revision_is(key, revision)],
            success: vec![op(Op::RequestPut(put))],
            failure: vec![],
        })
        .await?;
    if !response.succeeded {
        return Err(Status::unknown(NOT_LEADER));
    }
    Ok(response.header)
}

/// Sends the leader's key-value and every change to it to `tx`, until the
/// stream's receiver is gone: the current leader (or, with none, the first
/// to come), its new values, and after its key is deleted the next leader.
async fn observe(
    session: &Session,
    prefix: &[u8],
    tx: &mpsc::Sender<Result<LeaderResponse, Status>>,
) -> Result<(), Status> {
    loop {
        let found = session.range(first_created(prefix)).await?;
        let header = found.header.unwrap_or_default();
        let leader = match found.kvs.into_iter().next() {
            Some(kv) => LeaderResponse { header: Some(header), kv: Some(kv) },
            None => next_put(session, prefix, header.revision).await?,
        };
        let Some(kv) = leader.kv.clone() else { return Err(Status::internal("observe: leader without a key")) };
        if tx.send(Ok(leader)).await.is_err() {
            return Ok(());
        }
        let mut changes = session.store().subscribe(&kv.key, &[], Some(kv.mod_revision.max(header.revision) + 1));
        'leader: loop {
            for revision in changes.next().await.map_err(changes_status)? {
                for event in revision.events.iter().filter(|e| e.kv.key == kv.key) {
                    if event.kind == EventKind::Delete {
                        break 'leader;
                    }
                    if tx.send(Ok(session.leader_response(event.kv.clone().into()))).await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
    }
}

/// The first key put under `prefix` at revision `from` or later.
async fn next_put(session: &Session, prefix: &[u8], from: i64) -> Result<LeaderResponse, Status> {
    let mut changes = session.store().subscribe(prefix, &prefix_end(prefix), Some(from));
    loop {
        for revision in changes.next().await.map_err(changes_status)? {
            let put = revision.events.iter().find(|e| e.kind == EventKind::Put && e.kv.key.starts_with(prefix));
            if let Some(event) = put {
                return Ok(session.leader_response(event.kv.clone().into()));
            }
        }
    }
}
