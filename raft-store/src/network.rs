//! The peer channel: openraft's RPCs and Skiff's internal forwarding, over
//! tonic, with openraft's types carried as bincode in `Payload.data`.
//!
//! One lazily connected HTTP/2 channel per peer address, shared by Raft
//! replication and forwarding. `new_client` never connects (openraft awaits
//! it inline). Failures are sorted by what the caller should do: a refused
//! or broken connection is `Unreachable` (back off), a deadline is
//! `Timeout`, an error raised by the remote Raft is `RemoteError`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use skiff_proto::peer::peer_client::PeerClient;
use skiff_proto::peer::Payload;
use tonic::transport::{Channel, Endpoint};

use crate::types::{Node, NodeId, TypeConfig};

/// Largest message on the peer channel; openraft's entry batches and
/// snapshot chunks are sized below it.
pub const MAX_PEER_MESSAGE: usize = 64 * 1024 * 1024;

/// Largest AppendEntries payload sent in one request; openraft is asked
/// to split larger batches.
pub const MAX_APPEND_BYTES: usize = 8 * 1024 * 1024;

/// Every peer request names its target, so that a member reached at a
/// stale or wrong address refuses instead of acting on another's behalf.
#[derive(Serialize, Deserialize)]
pub struct Envelope<T> {
    pub target: NodeId,
    pub body: T,
}

#[derive(Clone, Copy, Debug)]
pub enum PeerMethod {
    AppendEntries,
    Vote,
    InstallSnapshot,
    Forward,
    ReadIndex,
    Admin,
}

/// Why a peer call failed, sorted by what the caller should do.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("peer {addr} unreachable: {reason}")]
    Unreachable { addr: String, reason: String },
    #[error("peer {addr} did not answer within {timeout:?}")]
    Timeout { addr: String, timeout: Duration },
    #[error("peer {addr} failed the call: {reason}")]
    Failed { addr: String, reason: String },
}

/// Shared, lazily connected clients to peers, by address.
#[derive(Clone, Default)]
pub struct PeerClients {
    clients: Arc<Mutex<HashMap<String, PeerClient<Channel>>>>,
}

impl PeerClients {
    fn client(&self, addr: &str) -> Result<PeerClient<Channel>, PeerError> {
        let mut clients = self.clients.lock().expect("peer client cache poisoned");
        if let Some(c) = clients.get(addr) {
            return Ok(c.clone());
        }
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| PeerError::Unreachable { addr: addr.to_string(), reason: e.to_string() })?
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(2))
            .keep_alive_while_idle(true);
        let client = PeerClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(MAX_PEER_MESSAGE)
            .max_encoding_message_size(MAX_PEER_MESSAGE);
        clients.insert(addr.to_string(), client.clone());
        Ok(client)
    }

    /// Calls `method` on the peer at `addr` (which should be member `target`).
    pub async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        addr: &str,
        target: NodeId,
        method: PeerMethod,
        body: &Req,
        timeout: Duration,
    ) -> Result<Resp, PeerError> {
        let data = bincode::serialize(&Envelope { target, body })
            .map_err(|e| PeerError::Failed { addr: addr.to_string(), reason: e.to_string() })?;
        let mut client = self.client(addr)?;
        let mut request = tonic::Request::new(Payload { data });
        request.set_timeout(timeout);
        let call = async move {
            match method {
                PeerMethod::AppendEntries => client.append_entries(request).await,
                PeerMethod::Vote => client.vote(request).await,
                PeerMethod::InstallSnapshot => client.install_snapshot(request).await,
                PeerMethod::Forward => client.forward(request).await,
                PeerMethod::ReadIndex => client.read_index(request).await,
                PeerMethod::Admin => client.admin(request).await,
            }
        };
        let response = match tokio::time::timeout(timeout, call).await {
            Err(_) => return Err(PeerError::Timeout { addr: addr.to_string(), timeout }),
            Ok(Err(status)) => {
                let reason = status.message().to_string();
                return Err(match status.code() {
                    tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
                        PeerError::Timeout { addr: addr.to_string(), timeout }
                    }
                    tonic::Code::Unavailable | tonic::Code::Unknown => {
                        PeerError::Unreachable { addr: addr.to_string(), reason }
                    }
                    _ => PeerError::Failed { addr: addr.to_string(), reason },
                });
            }
            Ok(Ok(r)) => r.into_inner(),
        };
        bincode::deserialize(&response.data)
            .map_err(|e| PeerError::Failed { addr: addr.to_string(), reason: e.to_string() })
    }
}

impl RaftNetworkFactory<TypeConfig> for PeerClients {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> PeerConnection {
        PeerConnection { target, addr: node.addr.clone(), clients: self.clone() }
    }
}

/// openraft's view of one peer.
pub struct PeerConnection {
    target: NodeId,
    addr: String,
    clients: PeerClients,
}

impl PeerConnection {
    async fn raft_call<Req, Resp, E>(
        &self,
        method: PeerMethod,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, Node, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let result: Result<Resp, RaftError<NodeId, E>> =
            self.clients.call(&self.addr, self.target, method, req, option.hard_ttl()).await.map_err(|e| match e {
                PeerError::Unreachable { .. } => RPCError::Unreachable(Unreachable::new(&e)),
                PeerError::Timeout { .. } => RPCError::Network(NetworkError::new(&e)),
                PeerError::Failed { .. } => RPCError::Network(NetworkError::new(&e)),
            })?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        // openraft bounds a batch by entry count only; with large values that
        // can exceed what the peer accepts (and stall replication on a retry
        // loop). Ask openraft to send fewer entries instead.
        let size = bincode::serialized_size(&rpc).unwrap_or(0) as usize;
        if size > MAX_APPEND_BYTES && rpc.entries.len() > 1 {
            let hint = (rpc.entries.len() as u64 * MAX_APPEND_BYTES as u64 / size as u64).max(1);
            return Err(RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(hint)));
        }
        self.raft_call(PeerMethod::AppendEntries, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId, InstallSnapshotError>>> {
        self.raft_call(PeerMethod::InstallSnapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        self.raft_call(PeerMethod::Vote, &rpc, &option).await
    }
}
