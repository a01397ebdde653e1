//! The peer listener's service: openraft's RPCs plus forwarded writes,
//! read-index requests and admin requests from other members.

use std::pin::Pin;

use futures::Stream;
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest};
use serde::de::DeserializeOwned;
use serde::Serialize;
use skiff_proto::peer::peer_server::{Peer, PeerServer};
use skiff_proto::peer::{Frame, Payload};
use tokio::sync::watch;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use crate::error::to_wire;
use crate::network::{Envelope, MAX_PEER_MESSAGE};
use crate::store::{AdminRequest, Store};
use crate::types::{NodeId, Proposal, TypeConfig};

pub struct PeerService {
    store: Store,
}

impl PeerService {
    pub fn server(store: Store) -> PeerServer<PeerService> {
        PeerServer::new(PeerService { store })
            .max_decoding_message_size(MAX_PEER_MESSAGE)
            .max_encoding_message_size(MAX_PEER_MESSAGE)
    }

    /// Decodes a request and checks that it was meant for this member.
    fn open<T: DeserializeOwned>(&self, request: Request<Payload>) -> Result<T, Status> {
        open_envelope(self.store.id(), &request.into_inner().data)
    }
}

fn open_envelope<T: DeserializeOwned>(me: NodeId, data: &[u8]) -> Result<T, Status> {
    let envelope: Envelope<T> =
        bincode::deserialize(data).map_err(|e| Status::invalid_argument(format!("undecodable peer message: {e}")))?;
    check_target(me, envelope.target)?;
    Ok(envelope.body)
}

/// The replies of one AppendEntries stream: each request in turn (openraft
/// sends a peer one at a time), each reply tagged with its request's id.
/// The reply stream itself reads and serves the requests, so a request goes
/// from the connection to Raft and its reply back without passing through a
/// task of its own. Ends when the sender closes the stream or goes away, or
/// this member shuts down (between requests; the sender then reconnects or
/// times out).
fn append_replies(
    store: Store,
    requests: Streaming<Frame>,
    stopping: watch::Receiver<bool>,
) -> impl Stream<Item = Result<Frame, Status>> + Send {
    futures::stream::unfold((store, requests, stopping), |(store, mut requests, mut stopping)| async move {
        let frame = tokio::select! {
            frame = requests.next() => frame,
            _ = stopping.wait_for(|stopping| *stopping) => return None,
        };
        let frame = match frame? {
            Ok(frame) => frame,
            Err(status) => {
                tracing::debug!(%status, "AppendEntries stream from a peer broke");
                return None;
            }
        };
        let reply = match open_envelope(store.id(), &frame.data) {
            Ok(req) => bincode::serialize(&store.raft().append_entries(req).await)
                .map(|data| Frame { id: frame.id, data, error: String::new() })
                .unwrap_or_else(|e| Frame { id: frame.id, data: Vec::new(), error: e.to_string() }),
            Err(status) => Frame { id: frame.id, data: Vec::new(), error: status.message().to_string() },
        };
        Some((Ok(reply), (store, requests, stopping)))
    })
}

fn check_target(me: NodeId, target: NodeId) -> Result<(), Status> {
    if me != target {
        return Err(Status::failed_precondition(format!(
            "this is member {me}, not member {target}: the sender has a wrong address for {target}"
        )));
    }
    Ok(())
}

fn reply<T: Serialize>(value: &T) -> Result<Response<Payload>, Status> {
    let data = bincode::serialize(value).map_err(|e| Status::internal(e.to_string()))?;
    Ok(Response::new(Payload { data }))
}

#[tonic::async_trait]
impl Peer for PeerService {
    type AppendStreamStream = Pin<Box<dyn Stream<Item = Result<Frame, Status>> + Send>>;

    async fn append_stream(
        &self,
        request: Request<Streaming<Frame>>,
    ) -> Result<Response<Self::AppendStreamStream>, Status> {
        // A long-lived AppendEntries stream ends when the member stops, so
        // that the listener's graceful shutdown does not wait for it.
        let replies = append_replies(self.store.clone(), request.into_inner(), self.store.stopping());
        Ok(Response::new(Box::pin(replies)))
    }

    async fn append_entries(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let req = self.open(request)?;
        reply(&self.store.raft().append_entries(req).await)
    }

    async fn vote(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let req = self.open(request)?;
        reply(&self.store.raft().vote(req).await)
    }

    async fn install_snapshot(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let req: InstallSnapshotRequest<TypeConfig> = self.open(request)?;
        // openraft 0.9 hands a chunk to its snapshot receiver without telling
        // Raft that the leader was heard from, and the leader sends no
        // heartbeat to this member until the whole snapshot is in: a
        // transfer longer than the election timeout made this member
        // campaign, depose the leader with its higher term, and have the
        // next leader start the transfer over, for ever (200 MB at some
        // 100 MB/s). Each chunk now counts as the heartbeat it is: an empty
        // AppendEntries under the chunk's vote, which checks no log entry
        // (no previous log id), commits nothing, and is refused like any
        // message of a stale leader.
        let heartbeat =
            AppendEntriesRequest { vote: req.vote, prev_log_id: None, leader_commit: None, entries: vec![] };
        if let Err(e) = self.store.raft().append_entries(heartbeat).await {
            tracing::debug!(error = %e, "a snapshot chunk's heartbeat was not taken");
        }
        reply(&self.store.raft().install_snapshot(req).await)
    }

    async fn forward(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let proposals: Vec<Proposal> = self.open(request)?;
        reply(&self.store.submit_local(proposals).await.iter().map(to_wire).collect::<Vec<_>>())
    }

    async fn read_index(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let () = self.open(request)?;
        reply(&to_wire(&self.store.read_index().await))
    }

    async fn admin(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let req: AdminRequest = self.open(request)?;
        reply(&to_wire(&self.store.admin_on_leader(req).await))
    }
}
