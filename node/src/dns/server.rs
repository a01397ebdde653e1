//! The DNS server: UDP and TCP on one address, each query answered from
//! the latest [`Records`] or forwarded to the host's nameservers.
//!
//! Every query is a task of its own, through the shutdown, and at most
//! [`MAX_IN_FLIGHT`] run at once. When they are all taken, a UDP query is
//! dropped, as a full socket buffer would drop it (the client retries); a
//! TCP connection stops reading until one ends, so its client waits.
//!
//! What a query gets is decided by [`step`], a pure function of the table
//! and the query's bytes:
//! - a name the table holds or owns: an authoritative answer, NODATA or
//!   NXDOMAIN (with the zone's SOA so resolvers cache it);
//! - any other name: the query's bytes, unchanged, to each upstream in
//!   turn (UDP, or TCP if the query came over TCP), and the first reply's
//!   bytes, unchanged, back; SERVFAIL if none replies;
//! - bytes that do not parse but hold a header: FORMERR with their id;
//!   fewer bytes, or a response: nothing;
//! - another opcode: NOTIMP; not exactly one question: FORMERR.
//!
//! Over UDP an answer larger than the client's payload size (512 bytes,
//! or what its OPT record says) goes back empty with TC set, so the
//! client asks again over TCP.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Edns, Header, Message, MessageType, Metadata, OpCode, ResponseCode};
use hickory_proto::rr::DNSClass;
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};
use skiff_shutdown::Shutdown;
use socket2::{Domain, Socket, Type};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{watch, Mutex, Semaphore};

use super::records::{Lookup, Records};
use crate::metrics::metrics;

/// Queries handled at once (across UDP and TCP).
pub const MAX_IN_FLIGHT: usize = 1024;

/// TCP connections open at once; more are closed as they are accepted.
const MAX_TCP_CONNECTIONS: usize = 256;

/// How long a TCP connection may wait for its next query.
const TCP_IDLE: Duration = Duration::from_secs(10);

/// How long each upstream has to answer before the next is tried.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);

/// The UDP payload size this server advertises in its OPT records (the
/// DNS flag day 2020 value, which avoids IP fragmentation).
const EDNS_PAYLOAD: u16 = 1232;

/// A DNS header's length: less is not a message at all.
const HEADER_LEN: usize = 12;

/// What a query came over: it decides the size limit and how it is
/// forwarded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    Udp,
    Tcp,
}

/// How a query ended: the `result` label of `skiff_node_dns_queries_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Answered,
    NoData,
    NxDomain,
    Forwarded,
    ServFail,
    FormErr,
    NotImp,
    /// Not handled: every slot was taken (UDP only).
    Dropped,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Answered => "answered",
            Outcome::NoData => "nodata",
            Outcome::NxDomain => "nxdomain",
            Outcome::Forwarded => "forwarded",
            Outcome::ServFail => "servfail",
            Outcome::FormErr => "formerr",
            Outcome::NotImp => "notimp",
            Outcome::Dropped => "dropped",
        }
    }

    fn count(self) {
        metrics().dns_queries.with_label_values(&[self.label()]).inc();
    }
}

/// What to do with one query.
#[derive(Debug)]
enum Step {
    /// Send nothing back.
    Ignore,
    /// Send these bytes back.
    Reply(Vec<u8>, Outcome),
    /// Not ours: relay the query to the upstreams.
    Forward(Message),
}

/// Binds UDP and TCP on `addr` (TCP on UDP's port if `addr`'s is 0).
/// With IP_FREEBIND, so the address may be the pod bridge's gateway
/// before the CNI plugin has made the bridge; TCP with SO_REUSEADDR, so a
/// restarted agent binds while its old connections linger in TIME_WAIT.
/// Must run within a tokio runtime.
pub fn bind(addr: SocketAddr) -> io::Result<(UdpSocket, TcpListener)> {
    let udp = socket(addr, Type::DGRAM)?;
    udp.bind(&addr.into())?;
    let udp = UdpSocket::from_std(udp.into())?;
    let addr = SocketAddr::new(addr.ip(), udp.local_addr()?.port());
    let tcp = socket(addr, Type::STREAM)?;
    tcp.set_reuse_address(true)?;
    tcp.bind(&addr.into())?;
    tcp.listen(1024)?;
    Ok((udp, TcpListener::from_std(tcp.into())?))
}

/// A non-blocking socket of `addr`'s family that may bind a missing address.
fn socket(addr: SocketAddr, kind: Type) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), kind, None)?;
    match addr {
        SocketAddr::V4(_) => socket.set_freebind_v4(true)?,
        SocketAddr::V6(_) => socket.set_freebind_v6(true)?,
    }
    socket.set_nonblocking(true)?;
    Ok(socket)
}

/// Serves DNS on `udp` and `tcp` from the latest `records` until
/// `shutdown`, forwarding other names to `upstreams` in order (those that
/// are this server's own address are skipped: they would loop).
pub async fn serve(
    udp: UdpSocket,
    tcp: TcpListener,
    records: watch::Receiver<Arc<Records>>,
    upstreams: Vec<SocketAddr>,
    shutdown: Shutdown,
) {
    serve_with(udp, tcp, records, upstreams, shutdown, MAX_IN_FLIGHT).await
}

/// [`serve`] with at most `max_in_flight` queries at once (a test's 0
/// shows what a full server does).
async fn serve_with(
    udp: UdpSocket,
    tcp: TcpListener,
    records: watch::Receiver<Arc<Records>>,
    upstreams: Vec<SocketAddr>,
    shutdown: Shutdown,
    max_in_flight: usize,
) {
    let local = udp.local_addr().ok();
    let upstreams: Vec<SocketAddr> = upstreams
        .into_iter()
        .filter(|u| {
            let loops = local.is_some_and(|local| is_self(*u, local));
            if loops {
                tracing::warn!(upstream = %u, "DNS upstream is this server; skipped");
            }
            !loops
        })
        .collect();
    let server = Arc::new(Server { records, upstreams, in_flight: Arc::new(Semaphore::new(max_in_flight)), shutdown });
    tokio::join!(server.clone().serve_udp(Arc::new(udp)), server.serve_tcp(tcp));
}

/// Whether queries to `upstream` would reach the server bound at `local`.
/// (A server on a wildcard address cannot tell the host's other addresses
/// here: the agent binds the bridge's gateway.)
fn is_self(upstream: SocketAddr, local: SocketAddr) -> bool {
    upstream == local
        || (local.ip().is_unspecified()
            && upstream.port() == local.port()
            && (upstream.ip().is_loopback() || upstream.ip().is_unspecified()))
}

/// What every query task shares.
struct Server {
    records: watch::Receiver<Arc<Records>>,
    upstreams: Vec<SocketAddr>,
    /// One permit per query being handled.
    in_flight: Arc<Semaphore>,
    shutdown: Shutdown,
}

impl Server {
    async fn serve_udp(self: Arc<Self>, socket: Arc<UdpSocket>) {
        let mut buffer = vec![0u8; usize::from(u16::MAX)];
        loop {
            let received = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                received = socket.recv_from(&mut buffer) => received,
            };
            let (len, peer) = match received {
                Ok(received) => received,
                Err(e) => {
                    // A lasting error must not spin the loop.
                    tracing::debug!(error = %e, "DNS UDP receive");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
                Outcome::Dropped.count();
                continue;
            };
            let query = buffer[..len].to_vec();
            let (server, socket) = (self.clone(), socket.clone());
            self.spawn(async move {
                let _permit = permit;
                if let Some(reply) = server.handle(&query, Transport::Udp).await {
                    if let Err(e) = socket.send_to(&reply, peer).await {
                        tracing::debug!(%peer, error = %e, "DNS UDP reply");
                    }
                }
            });
        }
    }

    async fn serve_tcp(self: Arc<Self>, listener: TcpListener) {
        let connections = Arc::new(Semaphore::new(MAX_TCP_CONNECTIONS));
        loop {
            let accepted = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                accepted = listener.accept() => accepted,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, most likely: let some close.
                    tracing::debug!(error = %e, "DNS TCP accept");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            // Dropped, so closed, when too many are open.
            let Ok(slot) = connections.clone().try_acquire_owned() else { continue };
            let server = self.clone();
            self.spawn(async move {
                server.connection(stream).await;
                drop(slot);
            });
        }
    }

    /// Reads length-framed queries off `stream` until it closes, idles or
    /// fails; each is answered by a task of its own, possibly out of order
    /// (RFC 7766 allows it; clients match replies by id).
    async fn connection(self: Arc<Self>, stream: TcpStream) {
        let (mut reader, writer) = stream.into_split();
        // Shared by the query tasks; the connection closes when the last
        // one is done with it.
        let writer = Arc::new(Mutex::new(writer));
        loop {
            let Ok(Ok(Some(query))) = tokio::time::timeout(TCP_IDLE, read_frame(&mut reader)).await else { return };
            let permit = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                permit = self.in_flight.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return,
                },
            };
            let (server, writer) = (self.clone(), writer.clone());
            self.spawn(async move {
                let _permit = permit;
                if let Some(reply) = server.handle(&query, Transport::Tcp).await {
                    if let Err(e) = write_frame(&mut *writer.lock().await, &reply).await {
                        tracing::debug!(error = %e, "DNS TCP reply");
                    }
                }
            });
        }
    }

    /// Spawns `task` on the shutdown, cut short when it begins.
    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let shutdown = self.shutdown.clone();
        self.shutdown.spawn(async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = task => {}
            }
        });
    }

    /// The reply to `query`'s bytes, if any, counted.
    async fn handle(&self, query: &[u8], transport: Transport) -> Option<Vec<u8>> {
        let records = self.records.borrow().clone();
        let (reply, outcome) = match step(&records, query, transport) {
            Step::Ignore => return None,
            Step::Reply(reply, outcome) => (reply, outcome),
            Step::Forward(request) => match self.forward(query, transport).await {
                Some(reply) => (reply, Outcome::Forwarded),
                None => encode(response(&request, ResponseCode::ServFail), transport, &request),
            },
        };
        outcome.count();
        Some(reply)
    }

    /// The first upstream's reply to `query`, tried in order.
    async fn forward(&self, query: &[u8], transport: Transport) -> Option<Vec<u8>> {
        for upstream in &self.upstreams {
            let exchange = async {
                match transport {
                    Transport::Udp => exchange_udp(*upstream, query).await,
                    Transport::Tcp => exchange_tcp(*upstream, query).await,
                }
            };
            match tokio::time::timeout(UPSTREAM_TIMEOUT, exchange).await {
                Ok(Ok(reply)) => return Some(reply),
                Ok(Err(e)) => tracing::debug!(%upstream, error = %e, "DNS upstream failed"),
                Err(_) => tracing::debug!(%upstream, "DNS upstream timed out"),
            }
        }
        None
    }
}

/// What `query`'s bytes get from `records`.
fn step(records: &Records, query: &[u8], transport: Transport) -> Step {
    if query.len() < HEADER_LEN {
        return Step::Ignore;
    }
    let request = match Message::from_vec(query) {
        Ok(request) => request,
        Err(_) => {
            let Ok(header) = Header::read(&mut BinDecoder::new(&query[..HEADER_LEN])) else { return Step::Ignore };
            if header.metadata.message_type == MessageType::Response {
                return Step::Ignore;
            }
            let reply = Message::error_msg(header.metadata.id, header.metadata.op_code, ResponseCode::FormErr);
            return match reply.to_vec() {
                Ok(bytes) => Step::Reply(bytes, Outcome::FormErr),
                Err(_) => Step::Ignore,
            };
        }
    };
    // Answering answers lets a spoofed source make two servers loop.
    if request.metadata.message_type == MessageType::Response {
        return Step::Ignore;
    }
    if request.metadata.op_code != OpCode::Query {
        let (reply, outcome) = encode(response(&request, ResponseCode::NotImp), transport, &request);
        return Step::Reply(reply, outcome);
    }
    let [question] = request.queries.as_slice() else {
        let (reply, outcome) = encode(response(&request, ResponseCode::FormErr), transport, &request);
        return Step::Reply(reply, outcome);
    };
    if question.query_class() != DNSClass::IN {
        return Step::Forward(request);
    }
    let name = question.name();
    let mut reply = response(&request, ResponseCode::NoError);
    reply.metadata.authoritative = true;
    match records.lookup(name, question.query_type()) {
        Lookup::NotOurs => return Step::Forward(request),
        Lookup::Answer { answers, additionals } => {
            reply.answers = answers;
            reply.additionals = additionals;
        }
        Lookup::NoData => reply.authorities.extend(records.soa_for(name).cloned()),
        Lookup::NxDomain => {
            reply.metadata.response_code = ResponseCode::NXDomain;
            reply.authorities.extend(records.soa_for(name).cloned());
        }
    }
    let (reply, outcome) = encode(reply, transport, &request);
    Step::Reply(reply, outcome)
}

/// A response to `request` with `code`: its id, opcode, RD and CD, its
/// question, RA set, and an OPT record if it had one.
fn response(request: &Message, code: ResponseCode) -> Message {
    let mut response = Message::response(request.metadata.id, request.metadata.op_code);
    response.metadata = Metadata::response_from_request(&request.metadata);
    response.metadata.recursion_available = true;
    response.metadata.response_code = code;
    response.queries = request.queries.clone();
    if request.edns.is_some() {
        let mut edns = Edns::new();
        edns.set_max_payload(EDNS_PAYLOAD);
        response.set_edns(edns);
    }
    response
}

/// `response`'s bytes within `transport`'s limit for `request` (empty with
/// TC set if larger), and how the query ended.
fn encode(response: Message, transport: Transport, request: &Message) -> (Vec<u8>, Outcome) {
    let outcome = match response.metadata.response_code {
        ResponseCode::NoError if response.answers.is_empty() => Outcome::NoData,
        ResponseCode::NoError => Outcome::Answered,
        ResponseCode::NXDomain => Outcome::NxDomain,
        ResponseCode::FormErr => Outcome::FormErr,
        ResponseCode::NotImp => Outcome::NotImp,
        _ => Outcome::ServFail,
    };
    let limit = match transport {
        Transport::Udp => usize::from(request.max_payload()),
        Transport::Tcp => usize::from(u16::MAX),
    };
    let bytes = response.to_vec().ok().filter(|b| b.len() <= limit).or_else(|| response.truncate().to_vec().ok());
    match bytes {
        Some(bytes) => (bytes, outcome),
        // A name or record that cannot be written: our table's fault.
        None => {
            let failure = Message::error_msg(request.metadata.id, request.metadata.op_code, ResponseCode::ServFail);
            (failure.to_vec().unwrap_or_default(), Outcome::ServFail)
        }
    }
}

/// Whether `reply` answers `query`: a response with its id.
fn answers(reply: &[u8], query: &[u8]) -> bool {
    let header = |bytes: &[u8]| Header::read(&mut BinDecoder::new(bytes)).ok();
    match (header(reply), header(query)) {
        (Some(reply), Some(query)) => {
            reply.metadata.message_type == MessageType::Response && reply.metadata.id == query.metadata.id
        }
        _ => false,
    }
}

/// Sends `query` to `upstream` over UDP from a fresh port and waits for
/// its reply (datagrams that are not are skipped).
async fn exchange_udp(upstream: SocketAddr, query: &[u8]) -> io::Result<Vec<u8>> {
    let any: SocketAddr =
        if upstream.is_ipv4() { (Ipv4Addr::UNSPECIFIED, 0).into() } else { (Ipv6Addr::UNSPECIFIED, 0).into() };
    let socket = UdpSocket::bind(any).await?;
    socket.connect(upstream).await?;
    socket.send(query).await?;
    let mut buffer = vec![0u8; usize::from(u16::MAX)];
    loop {
        let len = socket.recv(&mut buffer).await?;
        if answers(&buffer[..len], query) {
            buffer.truncate(len);
            return Ok(buffer);
        }
    }
}

/// Sends `query` to `upstream` over a new TCP connection and reads its reply.
async fn exchange_tcp(upstream: SocketAddr, query: &[u8]) -> io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(upstream).await?;
    write_frame(&mut stream, query).await?;
    loop {
        let Some(reply) = read_frame(&mut stream).await? else {
            return Err(io::ErrorKind::UnexpectedEof.into());
        };
        if answers(&reply, query) {
            return Ok(reply);
        }
    }
}

/// The next message of a TCP stream (RFC 1035 4.2.2: a two-byte length,
/// then the message); `None` if the stream ends before one begins.
async fn read_frame(reader: &mut (impl AsyncRead + Unpin)) -> io::Result<Option<Vec<u8>>> {
    let len = match reader.read_u16().await {
        Ok(len) => len,
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut message = vec![0u8; usize::from(len)];
    reader.read_exact(&mut message).await?;
    Ok(Some(message))
}

/// Writes `message` with its length, in one write.
async fn write_frame(writer: &mut (impl AsyncWrite + Unpin), message: &[u8]) -> io::Result<()> {
    let len = u16::try_from(message.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut frame = Vec::with_capacity(message.len() + 2);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(message);
    writer.write_all(&frame).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;
    use hickory_proto::rr::rdata::A;
    use hickory_proto::rr::{Name, RData, Record, RecordType};
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use serde_json::json;
    use std::str::FromStr;
    use std::time::Instant;

    const WAIT: Duration = Duration::from_secs(5);

    /// web (ClusterIP 10.96.0.10) and big (headless, 100 ready endpoints).
    fn must_records() -> Records {
        let services: Vec<Arc<Service>> = [
            json!({"metadata": {"namespace": "default", "name": "web"}, "spec": {"clusterIP": "10.96.0.10"}}),
            json!({"metadata": {"namespace": "default", "name": "big"}, "spec": {"clusterIP": "None"}}),
        ]
        .into_iter()
        .map(|s| Arc::new(serde_json::from_value(s).unwrap()))
        .collect();
        let endpoints: Vec<_> = (0..100).map(|i| json!({"addresses": [format!("10.244.0.{i}")]})).collect();
        let slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"namespace": "default", "name": "big-1", "labels": {"kubernetes.io/service-name": "big"}},
            "addressType": "IPv4", "endpoints": endpoints,
        }))
        .unwrap();
        Records::build("cluster.local", &services, &[Arc::new(slice)])
    }

    fn must_query(id: u16, name: &str, rtype: RecordType) -> Vec<u8> {
        let mut query = Message::new(id, MessageType::Query, OpCode::Query);
        query.metadata.recursion_desired = true;
        query.add_query(Query::query(Name::from_str(name).unwrap(), rtype));
        query.to_vec().unwrap()
    }

    /// A server on 127.0.0.1 serving `records`: its address and shutdown.
    fn must_serve(records: Records, upstreams: Vec<SocketAddr>, max_in_flight: usize) -> (SocketAddr, Shutdown) {
        let (udp, tcp) = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = udp.local_addr().unwrap();
        assert_eq!(tcp.local_addr().unwrap(), addr);
        let shutdown = Shutdown::new();
        let (_, records) = watch::channel(Arc::new(records));
        shutdown.spawn(serve_with(udp, tcp, records, upstreams, shutdown.clone(), max_in_flight));
        (addr, shutdown)
    }

    async fn must_exchange_udp(server: SocketAddr, query: &[u8]) -> Message {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        socket.send_to(query, server).await.unwrap();
        let mut buffer = vec![0u8; 65535];
        let (len, _) = tokio::time::timeout(WAIT, socket.recv_from(&mut buffer)).await.unwrap().unwrap();
        Message::from_vec(&buffer[..len]).unwrap()
    }

    async fn must_exchange_tcp(stream: &mut TcpStream, query: &[u8]) -> Message {
        write_frame(stream, query).await.unwrap();
        let reply = tokio::time::timeout(WAIT, read_frame(stream)).await.unwrap().unwrap().unwrap();
        Message::from_vec(&reply).unwrap()
    }

    fn addresses(message: &Message) -> Vec<String> {
        message.answers.iter().map(|r| r.data.to_string()).collect()
    }

    /// An upstream on 127.0.0.1 (UDP and TCP) answering every A query with
    /// 192.0.2.1.
    fn must_fake_upstream(shutdown: &Shutdown) -> SocketAddr {
        let (udp, tcp) = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = udp.local_addr().unwrap();
        let answer = |query: &[u8]| -> Vec<u8> {
            let query = Message::from_vec(query).unwrap();
            let mut reply = Message::response(query.metadata.id, OpCode::Query);
            let name = query.queries[0].name().clone();
            reply.add_query(query.queries[0].clone());
            reply.add_answer(Record::from_rdata(name, 60, RData::A(A::new(192, 0, 2, 1))));
            reply.to_vec().unwrap()
        };
        let udp = async move {
            let mut buffer = vec![0u8; 65535];
            while let Ok((len, peer)) = udp.recv_from(&mut buffer).await {
                udp.send_to(&answer(&buffer[..len]), peer).await.unwrap();
            }
        };
        let tcp = async move {
            while let Ok((mut stream, _)) = tcp.accept().await {
                let query = read_frame(&mut stream).await.unwrap().unwrap();
                write_frame(&mut stream, &answer(&query)).await.unwrap();
            }
        };
        let stop = shutdown.clone();
        shutdown.spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = async { tokio::join!(udp, tcp) } => {}
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_udp_query_for_a_service_gets_its_cluster_ip_authoritatively() {
        let (server, shutdown) = must_serve(must_records(), vec![], MAX_IN_FLIGHT);
        let reply = must_exchange_udp(server, &must_query(7, "web.default.svc.cluster.local.", RecordType::A)).await;
        assert_eq!(reply.metadata.id, 7);
        assert_eq!(reply.metadata.response_code, ResponseCode::NoError);
        assert!(reply.metadata.authoritative && reply.metadata.recursion_available);
        assert!(reply.metadata.recursion_desired);
        assert_eq!(reply.queries.len(), 1);
        assert_eq!(addresses(&reply), ["10.96.0.10"]);
        let reply = must_exchange_udp(server, &must_query(8, "nope.default.svc.cluster.local.", RecordType::A)).await;
        assert_eq!(reply.metadata.response_code, ResponseCode::NXDomain);
        assert!(reply.metadata.authoritative);
        assert_eq!(reply.authorities.len(), 1, "the SOA, for negative caching");
        shutdown.stop().await;
    }

    #[tokio::test]
    async fn a_tcp_connection_carries_several_queries() {
        let (server, shutdown) = must_serve(must_records(), vec![], MAX_IN_FLIGHT);
        let mut stream = TcpStream::connect(server).await.unwrap();
        for id in [1, 2] {
            let reply =
                must_exchange_tcp(&mut stream, &must_query(id, "web.default.svc.cluster.local.", RecordType::A)).await;
            assert_eq!(reply.metadata.id, id);
            assert_eq!(addresses(&reply), ["10.96.0.10"]);
        }
        shutdown.stop().await;
    }

    #[tokio::test]
    async fn garbage_with_a_header_gets_formerr_and_the_server_keeps_serving() {
        let (server, shutdown) = must_serve(must_records(), vec![], MAX_IN_FLIGHT);
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        // Too short for a header: no reply (the next reply read is FORMERR's).
        socket.send_to(&[0xde, 0xad], server).await.unwrap();
        // A header announcing one question, then a label longer than the rest.
        let garbage = [0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0x3f, b'x'];
        socket.send_to(&garbage, server).await.unwrap();
        let mut buffer = vec![0u8; 65535];
        let (len, _) = tokio::time::timeout(WAIT, socket.recv_from(&mut buffer)).await.unwrap().unwrap();
        let reply = Message::from_vec(&buffer[..len]).unwrap();
        assert_eq!(reply.metadata.id, 0x1234);
        assert_eq!(reply.metadata.response_code, ResponseCode::FormErr);
        let reply = must_exchange_udp(server, &must_query(9, "web.default.svc.cluster.local.", RecordType::A)).await;
        assert_eq!(addresses(&reply), ["10.96.0.10"]);
        shutdown.stop().await;
    }

    #[tokio::test]
    async fn names_not_ours_are_relayed_from_the_upstream_over_the_query_transport() {
        let upstreams = Shutdown::new();
        let upstream = must_fake_upstream(&upstreams);
        // A dead upstream first: the next one is tried.
        let dead = UdpSocket::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let (server, shutdown) = must_serve(must_records(), vec![dead, upstream], MAX_IN_FLIGHT);
        let reply = must_exchange_udp(server, &must_query(11, "example.com.", RecordType::A)).await;
        assert_eq!(reply.metadata.id, 11);
        assert!(!reply.metadata.authoritative, "the upstream's reply, unchanged");
        assert_eq!(addresses(&reply), ["192.0.2.1"]);
        let mut stream = TcpStream::connect(server).await.unwrap();
        let reply = must_exchange_tcp(&mut stream, &must_query(12, "example.com.", RecordType::A)).await;
        assert_eq!((reply.metadata.id, addresses(&reply)), (12, vec!["192.0.2.1".to_string()]));
        shutdown.stop().await;
        upstreams.stop().await;
    }

    #[tokio::test]
    async fn without_an_upstream_names_not_ours_get_servfail() {
        let (server, shutdown) = must_serve(must_records(), vec![], MAX_IN_FLIGHT);
        let reply = must_exchange_udp(server, &must_query(13, "example.com.", RecordType::A)).await;
        assert_eq!(reply.metadata.response_code, ResponseCode::ServFail);
        assert_eq!(reply.metadata.id, 13);
        shutdown.stop().await;
    }

    #[tokio::test]
    async fn an_upstream_at_the_server_itself_is_skipped() {
        let (udp, tcp) = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let server = udp.local_addr().unwrap();
        let shutdown = Shutdown::new();
        let (_, records) = watch::channel(Arc::new(must_records()));
        shutdown.spawn(serve(udp, tcp, records, vec![server], shutdown.clone()));
        let started = Instant::now();
        let reply = must_exchange_udp(server, &must_query(14, "example.com.", RecordType::A)).await;
        assert_eq!(reply.metadata.response_code, ResponseCode::ServFail);
        assert!(started.elapsed() < UPSTREAM_TIMEOUT, "no wait for itself: {:?}", started.elapsed());
        shutdown.stop().await;
        assert!(is_self("127.0.0.1:53".parse().unwrap(), "0.0.0.0:53".parse().unwrap()));
        assert!(!is_self("127.0.0.53:53".parse().unwrap(), "10.244.1.1:53".parse().unwrap()));
    }

    #[tokio::test]
    async fn a_big_answer_is_truncated_over_udp_and_whole_over_tcp() {
        let (server, shutdown) = must_serve(must_records(), vec![], MAX_IN_FLIGHT);
        let query = must_query(15, "big.default.svc.cluster.local.", RecordType::A);
        let reply = must_exchange_udp(server, &query).await;
        assert!(reply.metadata.truncation);
        assert!(reply.answers.is_empty());
        let mut stream = TcpStream::connect(server).await.unwrap();
        let reply = must_exchange_tcp(&mut stream, &query).await;
        assert!(!reply.metadata.truncation);
        assert_eq!(reply.answers.len(), 100);
        // A client that takes 4096 bytes over UDP gets it all there too.
        let mut message = Message::from_vec(&query).unwrap();
        let mut edns = Edns::new();
        edns.set_max_payload(4096);
        message.set_edns(edns);
        let reply = must_exchange_udp(server, &message.to_vec().unwrap()).await;
        assert!(!reply.metadata.truncation);
        assert_eq!(reply.answers.len(), 100);
        assert!(reply.edns.is_some(), "an OPT answers an OPT");
        shutdown.stop().await;
    }

    #[tokio::test]
    async fn a_full_server_drops_udp_queries() {
        let (server, shutdown) = must_serve(must_records(), vec![], 0);
        let before = metrics().dns_queries.with_label_values(&["dropped"]).get();
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let query = must_query(16, "web.default.svc.cluster.local.", RecordType::A);
        socket.send_to(&query, server).await.unwrap();
        let mut buffer = vec![0u8; 65535];
        let reply = tokio::time::timeout(Duration::from_millis(300), socket.recv_from(&mut buffer)).await;
        assert!(reply.is_err(), "no reply while every slot is taken");
        assert!(metrics().dns_queries.with_label_values(&["dropped"]).get() > before);
        shutdown.stop().await;
    }

    #[test]
    fn other_opcodes_get_notimp_and_two_questions_formerr() {
        let records = must_records();
        let mut notify = Message::new(1, MessageType::Query, OpCode::Notify);
        notify.add_query(Query::query(Name::from_str("cluster.local.").unwrap(), RecordType::SOA));
        let Step::Reply(reply, Outcome::NotImp) = step(&records, &notify.to_vec().unwrap(), Transport::Udp) else {
            panic!("not NOTIMP")
        };
        assert_eq!(Message::from_vec(&reply).unwrap().metadata.response_code, ResponseCode::NotImp);
        let mut two = Message::new(2, MessageType::Query, OpCode::Query);
        for name in ["a.cluster.local.", "b.cluster.local."] {
            two.add_query(Query::query(Name::from_str(name).unwrap(), RecordType::A));
        }
        let Step::Reply(reply, Outcome::FormErr) = step(&records, &two.to_vec().unwrap(), Transport::Udp) else {
            panic!("not FORMERR")
        };
        assert_eq!(Message::from_vec(&reply).unwrap().metadata.id, 2);
        // A response is never answered.
        let response = Message::response(3, OpCode::Query).to_vec().unwrap();
        assert!(matches!(step(&records, &response, Transport::Udp), Step::Ignore));
    }
}
