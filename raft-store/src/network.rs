//! The peer channel: openraft's RPCs and Skiff's internal forwarding, over
//! tonic, with openraft's types carried as bincode in `Payload.data`.
//!
//! One lazily connected HTTP/2 channel per peer address, shared by Raft
//! replication and forwarding. `new_client` never connects (openraft awaits
//! it inline). Failures are sorted by what the caller should do: a refused
//! or broken connection is `Unreachable` (back off), a deadline is
//! `Timeout`, an error raised by the remote Raft is `RemoteError`.
//!
//! Every outgoing call first passes this member's [`PeerFilter`], which lets
//! everything through unless a test has blocked some pairs of members: a
//! blocked call fails as `Unreachable` without being sent, so that tests can
//! partition members of one process without root or network namespaces.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
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
use skiff_proto::peer::{Frame, Payload};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tonic::transport::{Channel, Endpoint};
use tonic::Streaming;

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
#[derive(Clone, Debug, thiserror::Error)]
pub enum PeerError {
    #[error("peer {addr} unreachable: {reason}")]
    Unreachable { addr: String, reason: String },
    #[error("peer {addr} did not answer within {timeout:?}")]
    Timeout { addr: String, timeout: Duration },
    #[error("peer {addr} failed the call: {reason}")]
    Failed { addr: String, reason: String },
}

/// Which peer calls may be sent: every call, unless a test has blocked
/// some (from, to) pairs of members. One filter is shared by every member
/// of an in-process cluster; cheap to clone. A blocked call fails as
/// [`PeerError::Unreachable`] before it is sent, so openraft backs off as it
/// would from a real partition. Block both directions for a partition.
#[derive(Clone, Debug, Default)]
pub struct PeerFilter {
    blocked: Arc<RwLock<HashSet<(NodeId, NodeId)>>>,
}

impl PeerFilter {
    /// Blocks calls from member `from` to member `to` (one direction).
    pub fn block(&self, from: NodeId, to: NodeId) {
        self.blocked.write().unwrap_or_else(|poisoned| poisoned.into_inner()).insert((from, to));
    }

    /// Replaces the blocked pairs with `pairs`, in one step.
    pub fn set_blocked(&self, pairs: impl IntoIterator<Item = (NodeId, NodeId)>) {
        *self.blocked.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = pairs.into_iter().collect();
    }

    /// Lets every call through again.
    pub fn heal(&self) {
        self.set_blocked([]);
    }

    /// Whether member `from` may call member `to`.
    pub fn allows(&self, from: NodeId, to: NodeId) -> bool {
        !self.blocked.read().unwrap_or_else(|poisoned| poisoned.into_inner()).contains(&(from, to))
    }
}

/// Shared, lazily connected clients to peers, by address.
#[derive(Clone, Default)]
pub struct PeerClients {
    /// This member, the sender of every call (for the filter).
    me: NodeId,
    filter: PeerFilter,
    clients: Arc<Mutex<HashMap<String, PeerClient<Channel>>>>,
    /// The open AppendEntries stream to each peer, by address.
    streams: Arc<Mutex<HashMap<String, AppendStream>>>,
    /// Peers that do not serve `AppendStream` (an older Skiff): unary calls.
    unary_only: Arc<Mutex<HashSet<String>>>,
    /// Mutual TLS to peers; `None`: plaintext.
    tls: Option<skiff_pki::Connector>,
}

/// One AppendEntries stream to a peer: requests go out in order on one
/// HTTP/2 stream and replies are matched back by id. No task sits between
/// the caller and the connection: the caller itself reads the reply stream
/// (under a lock, so that concurrent callers take turns), and a reply read
/// for another caller is left for it. When the stream breaks every caller
/// on it fails as unreachable and the next call opens a new stream. A
/// request that times out closes the stream too, as a unary call would be
/// reset, so nothing queues behind a peer that stopped reading.
#[derive(Clone)]
struct AppendStream {
    outbound: mpsc::UnboundedSender<Frame>,
    replies: Arc<tokio::sync::Mutex<Replies>>,
    /// Set once the stream ended; nothing is sent on it after.
    closed: Arc<Mutex<Option<PeerError>>>,
    next_id: Arc<AtomicU64>,
}

type Opening = Pin<Box<dyn Future<Output = Result<tonic::Response<Streaming<Frame>>, tonic::Status>> + Send>>;

/// The receiving half of an [`AppendStream`].
struct Replies {
    /// The call that opens the stream, until the peer has answered it.
    opening: Option<Opening>,
    stream: Option<Streaming<Frame>>,
    /// Replies read by one caller for another, by request id.
    early: HashMap<u64, Result<Vec<u8>, PeerError>>,
}

impl AppendStream {
    /// Opens a stream on `client`. The first caller drives the opening
    /// call; requests sent before the peer answers wait in the channel.
    fn open(mut client: PeerClient<Channel>) -> AppendStream {
        let (outbound, requests) = mpsc::unbounded_channel();
        let requests = tokio_stream::wrappers::UnboundedReceiverStream::new(requests);
        let opening: Opening = Box::pin(async move { client.append_stream(requests).await });
        AppendStream {
            outbound,
            replies: Arc::new(tokio::sync::Mutex::new(Replies {
                opening: Some(opening),
                stream: None,
                early: HashMap::new(),
            })),
            closed: Arc::new(Mutex::new(None)),
            next_id: Arc::new(AtomicU64::new(1)),
        }
    }

    fn is_open(&self) -> bool {
        lock(&self.closed).is_none() && !self.outbound.is_closed()
    }

    /// Marks the stream closed, for every caller on it.
    fn close(&self, why: PeerError) {
        lock(&self.closed).get_or_insert(why);
    }

    /// Sends one request and waits for its reply, at most `timeout`.
    async fn call(&self, addr: &str, data: Vec<u8>, timeout: Duration) -> Result<Vec<u8>, PeerError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if let Some(ended) = lock(&self.closed).clone() {
            return Err(ended);
        }
        if self.outbound.send(Frame { id, data, error: String::new() }).is_err() {
            return Err(PeerError::Unreachable { addr: addr.to_string(), reason: "stream closed".into() });
        }
        match tokio::time::timeout(timeout, self.reply(addr, id)).await {
            Ok(reply) => reply,
            Err(_) => {
                let error = PeerError::Timeout { addr: addr.to_string(), timeout };
                self.close(error.clone());
                Err(error)
            }
        }
    }

    /// Reads the stream until the reply to request `id` comes.
    async fn reply(&self, addr: &str, id: u64) -> Result<Vec<u8>, PeerError> {
        let mut replies = self.replies.lock().await;
        let replies = &mut *replies;
        loop {
            if let Some(reply) = replies.early.remove(&id) {
                return reply;
            }
            if let Some(ended) = lock(&self.closed).clone() {
                return Err(ended);
            }
            let stream = match (&mut replies.stream, &mut replies.opening) {
                (Some(stream), _) => stream,
                (None, Some(opening)) => match opening.await {
                    Ok(response) => {
                        replies.opening = None;
                        replies.stream.insert(response.into_inner())
                    }
                    Err(status) => {
                        replies.opening = None;
                        self.close(stream_error(addr, &status));
                        continue;
                    }
                },
                (None, None) => {
                    self.close(PeerError::Unreachable { addr: addr.to_string(), reason: "stream ended".into() });
                    continue;
                }
            };
            match stream.next().await {
                None => self.close(PeerError::Unreachable { addr: addr.to_string(), reason: "stream ended".into() }),
                Some(Err(status)) => self.close(stream_error(addr, &status)),
                Some(Ok(frame)) => {
                    let reply = if frame.error.is_empty() {
                        Ok(frame.data)
                    } else {
                        Err(PeerError::Failed { addr: addr.to_string(), reason: frame.error })
                    };
                    if frame.id == id {
                        return reply;
                    }
                    replies.early.insert(frame.id, reply);
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Sorts a failed call's status by what the caller should do.
fn status_error(addr: &str, status: &tonic::Status, timeout: Duration) -> PeerError {
    let reason = status.message().to_string();
    match status.code() {
        tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
            PeerError::Timeout { addr: addr.to_string(), timeout }
        }
        tonic::Code::Unavailable | tonic::Code::Unknown => PeerError::Unreachable { addr: addr.to_string(), reason },
        _ => PeerError::Failed { addr: addr.to_string(), reason },
    }
}

/// Why an AppendEntries stream ended: the peer is treated as unreachable
/// (openraft backs off and retries), unless it does not serve streams.
fn stream_error(addr: &str, status: &tonic::Status) -> PeerError {
    if status.code() == tonic::Code::Unimplemented {
        return PeerError::Failed { addr: addr.to_string(), reason: UNIMPLEMENTED.into() };
    }
    PeerError::Unreachable { addr: addr.to_string(), reason: status.message().to_string() }
}

const UNIMPLEMENTED: &str = "peer does not serve AppendStream";

impl PeerClients {
    /// Clients for member `me`, whose calls pass `filter`.
    pub fn new(me: NodeId, filter: PeerFilter) -> PeerClients {
        PeerClients { me, filter, ..PeerClients::default() }
    }

    /// The same clients, over mutual TLS when `tls` is given: each peer
    /// must prove it holds a peer certificate of the cluster.
    pub fn with_tls(mut self, tls: Option<skiff_pki::Connector>) -> PeerClients {
        self.tls = tls.map(|c| c.requiring(skiff_pki::PEERS_GROUP));
        self
    }

    /// Fails a call to member `target` that the filter blocks.
    fn check_filter(&self, addr: &str, target: NodeId) -> Result<(), PeerError> {
        if self.filter.allows(self.me, target) {
            return Ok(());
        }
        let reason = format!("calls from member {} to member {target} are blocked by the peer filter", self.me);
        Err(PeerError::Unreachable { addr: addr.to_string(), reason })
    }

    fn client(&self, addr: &str) -> Result<PeerClient<Channel>, PeerError> {
        let mut clients = self.clients.lock().expect("peer client cache poisoned");
        if let Some(c) = clients.get(addr) {
            return Ok(c.clone());
        }
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| PeerError::Unreachable { addr: addr.to_string(), reason: e.to_string() })?
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(2))
            .keep_alive_while_idle(true);
        let channel = match &self.tls {
            Some(tls) => endpoint.connect_with_connector_lazy(tls.clone()),
            None => endpoint.connect_lazy(),
        };
        let client = PeerClient::new(channel)
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
        self.check_filter(addr, target)?;
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
            Ok(Err(status)) => return Err(status_error(addr, &status, timeout)),
            Ok(Ok(r)) => r.into_inner(),
        };
        decode_reply(addr, &response.data)
    }

    /// AppendEntries to the peer at `addr` (which should be member
    /// `target`), on the peer's stream.
    pub async fn append<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        addr: &str,
        target: NodeId,
        body: &Req,
        timeout: Duration,
    ) -> Result<Resp, PeerError> {
        self.check_filter(addr, target)?;
        if lock(&self.unary_only).contains(addr) {
            return self.call(addr, target, PeerMethod::AppendEntries, body, timeout).await;
        }
        let data = bincode::serialize(&Envelope { target, body })
            .map_err(|e| PeerError::Failed { addr: addr.to_string(), reason: e.to_string() })?;
        let stream = self.stream(addr)?;
        match stream.call(addr, data, timeout).await {
            Ok(reply) => decode_reply(addr, &reply),
            Err(PeerError::Failed { reason, .. }) if reason == UNIMPLEMENTED => {
                tracing::info!(peer = addr, "peer has no AppendEntries stream; using unary calls");
                lock(&self.unary_only).insert(addr.to_string());
                self.call(addr, target, PeerMethod::AppendEntries, body, timeout).await
            }
            Err(e) => Err(e),
        }
    }

    /// The open stream to `addr`, opening one if there is none.
    fn stream(&self, addr: &str) -> Result<AppendStream, PeerError> {
        let mut streams = lock(&self.streams);
        if let Some(stream) = streams.get(addr).filter(|s| s.is_open()) {
            return Ok(stream.clone());
        }
        let stream = AppendStream::open(self.client(addr)?);
        streams.insert(addr.to_string(), stream.clone());
        Ok(stream)
    }
}

fn decode_reply<Resp: DeserializeOwned>(addr: &str, data: &[u8]) -> Result<Resp, PeerError> {
    bincode::deserialize(data).map_err(|e| PeerError::Failed { addr: addr.to_string(), reason: e.to_string() })
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
        let timeout = option.hard_ttl();
        let result: Result<Resp, RaftError<NodeId, E>> = match method {
            PeerMethod::AppendEntries => self.clients.append(&self.addr, self.target, req, timeout).await,
            _ => self.clients.call(&self.addr, self.target, method, req, timeout).await,
        }
        .map_err(|e| match e {
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

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::sync::atomic::AtomicUsize;

    use futures::Stream;
    use skiff_proto::peer::peer_server::{Peer, PeerServer};
    use tonic::{Request, Response, Status, Streaming};

    use super::*;

    /// A peer that doubles the `u64` it is sent; `0` is answered only after
    /// a second. `streams: false` serves unary calls only, like a Skiff
    /// from before the stream.
    #[derive(Clone)]
    struct Doubler {
        streams: bool,
        opened: Arc<AtomicUsize>,
        unary: Arc<AtomicUsize>,
    }

    async fn double(data: &[u8]) -> Vec<u8> {
        let envelope: Envelope<u64> = bincode::deserialize(data).expect("an envelope");
        if envelope.body == 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        bincode::serialize(&(envelope.body * 2)).expect("encodable")
    }

    #[tonic::async_trait]
    impl Peer for Doubler {
        type AppendStreamStream = Pin<Box<dyn Stream<Item = Result<Frame, Status>> + Send>>;

        async fn append_stream(
            &self,
            request: Request<Streaming<Frame>>,
        ) -> Result<Response<Self::AppendStreamStream>, Status> {
            if !self.streams {
                return Err(Status::unimplemented("no streams here"));
            }
            self.opened.fetch_add(1, Ordering::SeqCst);
            let (tx, rx) = mpsc::channel(16);
            let mut requests = request.into_inner();
            tokio::spawn(async move {
                while let Some(Ok(frame)) = requests.next().await {
                    if bincode::deserialize::<Envelope<u64>>(&frame.data).expect("an envelope").body == BREAK {
                        let _ = tx.send(Err(Status::unavailable("going away"))).await;
                        return;
                    }
                    // Concurrently, so that replies can overtake each other.
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        let data = double(&frame.data).await;
                        let _ = tx.send(Ok(Frame { id: frame.id, data, error: String::new() })).await;
                    });
                }
            });
            Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
        }

        async fn append_entries(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
            self.unary.fetch_add(1, Ordering::SeqCst);
            Ok(Response::new(Payload { data: double(&request.into_inner().data).await }))
        }

        async fn vote(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
            Err(Status::unimplemented("vote"))
        }

        async fn install_snapshot(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
            Err(Status::unimplemented("install_snapshot"))
        }

        async fn forward(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
            Err(Status::unimplemented("forward"))
        }

        async fn read_index(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
            Err(Status::unimplemented("read_index"))
        }

        async fn admin(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
            Err(Status::unimplemented("admin"))
        }
    }

    async fn serve(streams: bool) -> (String, Doubler) {
        let peer = Doubler { streams, opened: Arc::default(), unary: Arc::default() };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let server = tonic::transport::Server::builder()
            .add_service(PeerServer::new(peer.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
        tokio::spawn(server);
        (addr, peer)
    }

    const SECOND: Duration = Duration::from_secs(1);

    /// A request that makes the doubler end its stream with an error.
    const BREAK: u64 = 1000;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_requests_on_one_stream_get_their_own_replies() {
        let (addr, peer) = serve(true).await;
        let clients = PeerClients::default();
        let calls = (1..=64u64).map(|n| {
            let (clients, addr) = (clients.clone(), addr.clone());
            tokio::spawn(async move { (n, clients.append::<u64, u64>(&addr, 7, &n, SECOND * 5).await) })
        });
        for call in futures::future::join_all(calls).await {
            let (n, reply) = call.expect("task");
            assert_eq!(reply.expect("reply"), n * 2);
        }
        assert_eq!(peer.opened.load(Ordering::SeqCst), 1, "every request shared one stream");
        assert_eq!(peer.unary.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peer_without_streams_gets_unary_calls() {
        let (addr, peer) = serve(false).await;
        let clients = PeerClients::default();
        assert_eq!(clients.append::<u64, u64>(&addr, 7, &21, SECOND * 5).await.expect("reply"), 42);
        assert_eq!(clients.append::<u64, u64>(&addr, 7, &5, SECOND * 5).await.expect("reply"), 10);
        assert_eq!(peer.unary.load(Ordering::SeqCst), 2);
        assert!(lock(&clients.unary_only).contains(&addr));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_timed_out_request_closes_its_stream_and_the_next_call_opens_another() {
        let (addr, peer) = serve(true).await;
        let clients = PeerClients::default();
        let slow = clients.append::<u64, u64>(&addr, 7, &0, Duration::from_millis(100)).await;
        assert!(matches!(slow, Err(PeerError::Timeout { .. })), "{slow:?}");
        assert_eq!(clients.append::<u64, u64>(&addr, 7, &4, SECOND * 5).await.expect("reply"), 8);
        assert_eq!(peer.opened.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_broken_stream_fails_its_callers_as_unreachable_and_the_next_call_opens_another() {
        let (addr, peer) = serve(true).await;
        let clients = PeerClients::default();
        assert_eq!(clients.append::<u64, u64>(&addr, 7, &3, SECOND * 5).await.expect("reply"), 6);
        // A slow request is waiting when the stream breaks under it.
        let waiting = tokio::spawn({
            let (clients, addr) = (clients.clone(), addr.clone());
            async move { clients.append::<u64, u64>(&addr, 7, &0, SECOND * 5).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let broken = clients.append::<u64, u64>(&addr, 7, &BREAK, SECOND * 5).await;
        assert!(matches!(broken, Err(PeerError::Unreachable { .. })), "{broken:?}");
        let waiting = waiting.await.expect("task");
        assert!(matches!(waiting, Err(PeerError::Unreachable { .. })), "{waiting:?}");
        assert_eq!(clients.append::<u64, u64>(&addr, 7, &4, SECOND * 5).await.expect("reply"), 8);
        assert_eq!(peer.opened.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_blocked_peer_is_unreachable_without_a_call_being_sent_until_healed() {
        let (addr, peer) = serve(true).await;
        let filter = PeerFilter::default();
        let clients = PeerClients::new(1, filter.clone());
        filter.block(1, 7);
        assert!(filter.allows(7, 1), "a block has one direction");
        let append = clients.append::<u64, u64>(&addr, 7, &1, SECOND * 5).await;
        assert!(matches!(append, Err(PeerError::Unreachable { .. })), "{append:?}");
        let vote = clients.call::<u64, u64>(&addr, 7, PeerMethod::Vote, &1, SECOND * 5).await;
        assert!(matches!(vote, Err(PeerError::Unreachable { .. })), "{vote:?}");
        assert_eq!((peer.opened.load(Ordering::SeqCst), peer.unary.load(Ordering::SeqCst)), (0, 0));
        filter.heal();
        assert_eq!(clients.append::<u64, u64>(&addr, 7, &2, SECOND * 5).await.expect("reply"), 4);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peer_that_is_not_listening_is_unreachable() {
        let addr = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            listener.local_addr().expect("addr").to_string()
        };
        let clients = PeerClients::default();
        let reply = clients.append::<u64, u64>(&addr, 7, &1, SECOND * 5).await;
        assert!(matches!(reply, Err(PeerError::Unreachable { .. })), "{reply:?}");
    }
}
