//! The peer listener's service: openraft's RPCs plus forwarded writes,
//! read-index requests and admin requests from other members.

use serde::de::DeserializeOwned;
use serde::Serialize;
use skiff_proto::peer::peer_server::{Peer, PeerServer};
use skiff_proto::peer::Payload;
use tonic::{Request, Response, Status};

use crate::network::{Envelope, MAX_PEER_MESSAGE};
use crate::store::{AdminRequest, Store};
use crate::types::{NodeId, Proposal};

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
        let envelope: Envelope<T> = bincode::deserialize(&request.into_inner().data)
            .map_err(|e| Status::invalid_argument(format!("undecodable peer message: {e}")))?;
        check_target(self.store.id(), envelope.target)?;
        Ok(envelope.body)
    }
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
    async fn append_entries(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let req = self.open(request)?;
        reply(&self.store.raft().append_entries(req).await)
    }

    async fn vote(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let req = self.open(request)?;
        reply(&self.store.raft().vote(req).await)
    }

    async fn install_snapshot(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let req = self.open(request)?;
        reply(&self.store.raft().install_snapshot(req).await)
    }

    async fn forward(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let proposals: Vec<Proposal> = self.open(request)?;
        reply(&self.store.submit_local(proposals).await)
    }

    async fn read_index(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let () = self.open(request)?;
        reply(&self.store.read_index().await)
    }

    async fn admin(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let req: AdminRequest = self.open(request)?;
        reply(&self.store.admin_on_leader(req).await)
    }
}
