//! The client listener's gRPC server: tonic's services on hyper's HTTP/2
//! server, with every request of a connection run inside that connection's
//! own task instead of a task of its own.
//!
//! Why not `tonic::transport::Server`: it spawns one tokio task per request.
//! When a Raft batch commits, all its waiting requests wake at once, and
//! tokio's LIFO slot runs the connection's task right after each request
//! task that answers, so the answers leave one `writev` each. Here the
//! connection's task first runs every request that woke, then lets the
//! connection flush what they wrote: a batch answers in one `writev` per
//! connection, and no task is spawned per request. A lone request takes no
//! more hand-offs than before (the connection's task polls it as soon as
//! its frames arrive).
//!
//! The cost: the requests of one connection share one task, so one of them
//! doing slow synchronous work holds up the others on that connection
//! (never those of other connections).
//!
//! Over TLS ([`ClientTls`]), each connection's handshake runs first, in the
//! connection's task. When client certificates are checked, the etcd API
//! (and Skiff's key history) is for `system:masters` only, a join for
//! members (`system:skiff-peers`) too, and the resource API authenticates
//! and authorizes each request itself, the certificate's identity handed to
//! it as a [`ClientCertificate`] extension.
//!
//! With an audit log, the calls no service audits itself (the etcd API,
//! Skiff's key history and control calls) are logged here, as requests on
//! a non-resource path: the gRPC method is the path, the connection's
//! certificate the user (the unsecured client port's superuser where
//! certificates are not checked, as the resource API has it), and the outcome
//! the `grpc-status` the response starts with (a handler's error; 200 for
//! a response that starts well). Calls refused for want of a certificate
//! are not logged, as 401s are not. Without an audit log nothing here
//! changes: no allocation or task per call.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::Either;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::task::AtomicWaker;
use hyper_util::rt::{TokioIo, TokioTimer};
use skiff_shutdown::Shutdown;
use tokio::net::TcpListener;
use tonic::codegen::Service;
use tonic::service::Routes;

use crate::admission::{ClientCertificate, UserInfo};
use crate::audit::{AuditLog, Call};
use crate::rbac::bootstrap::MASTERS;
use crate::request_info::RequestInfo;

type Request = Pin<Box<dyn Future<Output = ()> + Send>>;

/// TLS on the client listener.
pub struct ClientTls {
    pub current: crate::tls::Current,
    /// Whether client certificates are checked (`--trusted-ca-file`):
    /// then who may call what is decided by [`admit`].
    pub client_certificates: bool,
}

/// Serves `routes` on `listener` (over `tls`, if given) until `shutdown` is
/// cancelled, then lets every connection finish the requests it has
/// (HTTP/2 GOAWAY) before returning. Each connection's task is a task of a
/// child of `shutdown`, so whoever stops `shutdown` also waits for the
/// connections. `audit` logs the calls the services do not log themselves.
pub async fn serve(
    listener: TcpListener,
    routes: Routes,
    tls: Option<ClientTls>,
    audit: Option<AuditLog>,
    shutdown: Shutdown,
) {
    let routes = routes.prepare();
    let connections = shutdown.child();
    while let Some((stream, remote)) = crate::tls::accept(&listener, &shutdown).await {
        let routes = routes.clone();
        let stop = connections.clone();
        let audit = audit.clone().map(|log| Audit { log, remote });
        let Some(tls) = &tls else {
            connections.spawn(connection(stream, routes, None, audit, stop));
            continue;
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.current.borrow().clone());
        let checked = tls.client_certificates;
        connections.spawn(async move {
            match skiff_pki::transport::accept(&acceptor, stream).await {
                Ok((stream, who)) => {
                    let who = checked.then(|| who.map(ClientCertificate::from));
                    connection(stream, routes, who, audit, stop).await
                }
                Err(e) => tracing::debug!(error = %e, "TLS handshake on the client listener failed"),
            }
        });
    }
    connections.wait().await
}

/// Serves one connection until it closes or `stop`. `who`: when client
/// certificates are checked, the identity the connection's proved (if any),
/// made once per connection and handed to each of its requests.
/// Built before it is awaited and boxed as `Send`: rustc cannot prove an
/// `async fn` holding hyper's connection `Send` (its service's error type
/// meets a higher-ranked lifetime), so the future is made outside one.
fn connection<I>(
    io: I,
    routes: Routes,
    who: Option<Option<ClientCertificate>>,
    audit: Option<Audit>,
    stop: Shutdown,
) -> Pin<Box<dyn Future<Output = ()> + Send>>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let service = hyper::service::service_fn(move |r: hyper::Request<hyper::body::Incoming>| {
        let call = audit.as_ref().and_then(|a| a.begin(&who, &r));
        let answer = answer(&routes, &who, r);
        match call {
            None => Either::Left(answer),
            Some(call) => Either::Right(Audited { answer, call: Some(call), finishing: None, answered: None }),
        }
    });
    let spawner = Spawner::default();
    let conn = hyper::server::conn::http2::Builder::new(spawner.clone())
        .timer(TokioTimer::new())
        // As tonic's server: no limit on concurrent streams (a client
        // may hold thousands of watches on one connection).
        .max_concurrent_streams(None)
        .serve_connection(TokioIo::new(io), service);
    let task = ConnectionTask { conn: Box::pin(conn), spawner, requests: FuturesUnordered::new(), closed: false };
    Box::pin(async move {
        let mut task = std::pin::pin!(task);
        tokio::select! {
            () = task.as_mut() => return,
            () = stop.cancelled() => {}
        }
        task.as_mut().conn.as_mut().graceful_shutdown();
        task.await;
    })
}

type RoutesFuture = <Routes as Service<hyper::Request<tonic::body::BoxBody>>>::Future;

/// The audit log and the connection's peer.
#[derive(Clone)]
struct Audit {
    log: AuditLog,
    remote: std::net::SocketAddr,
}

/// gRPC methods that stream for as long as the client wants, logged as
/// watches (once their response has started).
const LONG_RUNNING: [&str; 3] =
    ["/etcdserverpb.Watch/Watch", "/etcdserverpb.Lease/LeaseKeepAlive", "/v3electionpb.Election/Observe"];

impl Audit {
    /// The audit event of a call the services do not log themselves, if
    /// the policy logs it. `who` as in [`admit`].
    fn begin<B>(&self, who: &Option<Option<ClientCertificate>>, r: &hyper::Request<B>) -> Option<Call> {
        let path = r.uri().path();
        if path.starts_with("/skiff.resource.Resources/") || path.starts_with("/skiff.bootstrap.Bootstrap/") {
            return None;
        }
        let user = match who {
            // Refused for want of a certificate: a 401, not logged.
            Some(None) => return None,
            Some(Some(cert)) => cert.0.clone(),
            None => crate::admission::unsecured_client_port(),
        };
        let verb = if LONG_RUNNING.contains(&path) { "watch" } else { "post" };
        let info = RequestInfo { verb: verb.to_string(), path: path.to_string(), ..Default::default() };
        let agent = r.headers().get(hyper::header::USER_AGENT).and_then(|v| v.to_str().ok());
        self.log.begin(&user, info, Some(self.remote), agent, || None, &Default::default())
    }
}

pin_project_lite::pin_project! {
    /// An answer whose audit event is written (queued) before it is
    /// handed back, so a full audit queue slows calls rather than losing
    /// their events.
    struct Audited<F> {
        #[pin]
        answer: F,
        call: Option<Call>,
        finishing: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
        answered: Option<Answer>,
    }
}

impl<F: Future<Output = Answer>> Future for Audited<F> {
    type Output = Answer;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer> {
        let mut this = self.project();
        if this.answered.is_none() {
            let Poll::Ready(answered) = this.answer.as_mut().poll(cx) else { return Poll::Pending };
            if let Some(call) = this.call.take() {
                *this.finishing = Some(Box::pin(call.finish(outcome(&answered), None)));
            }
            *this.answered = Some(answered);
        }
        if let Some(finishing) = this.finishing.as_mut() {
            if finishing.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            *this.finishing = None;
        }
        Poll::Ready(this.answered.take().expect("answered above"))
    }
}

/// The HTTP status code an audit event records for a gRPC answer: the
/// `grpc-status` a response starts with, mapped as the resource API maps
/// its errors; 200 for one that starts without (its status follows in
/// the trailers).
fn outcome(answered: &Answer) -> u16 {
    let Ok(response) = answered else { return 500 };
    match response.headers().get("grpc-status").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<i32>().ok()) {
        None | Some(0) => 200,
        Some(code) => skiff_api::Reason::from_grpc_code(code).code(),
    }
}

/// One request's answer: refused by [`admit`], or routed to its service
/// (with the caller's certificate), in either case within its deadline.
fn answer(
    routes: &Routes,
    who: &Option<Option<ClientCertificate>>,
    mut r: hyper::Request<hyper::body::Incoming>,
) -> Deadline<RoutesFuture> {
    let expiry = grpc_timeout(r.headers()).map(tokio::time::sleep);
    let refused = match who {
        Some(who) => admit(r.uri().path(), who.as_ref().map(|c| &c.0)).err(),
        None => None,
    };
    if let Some(Some(cert)) = who {
        r.extensions_mut().insert(cert.clone());
    }
    let answer = match refused {
        Some(_) => None,
        None => Some(routes.clone().call(r.map(tonic::body::boxed))),
    };
    Deadline { answer, refused, expiry }
}

/// Who may call what on a client listener that checks client certificates:
/// the resource API decides for itself, request by request (certificate or
/// bearer token, then RBAC); a join takes a member's certificate (or an
/// administrator's); everything else, the etcd API and Skiff's key history
/// alike, reads and writes any key, so it is for `system:masters` only.
fn admit(path: &str, who: Option<&UserInfo>) -> Result<(), tonic::Status> {
    // The resource API and the join calls authenticate each call themselves.
    if path.starts_with("/skiff.resource.Resources/") || path.starts_with("/skiff.bootstrap.Bootstrap/") {
        return Ok(());
    }
    let Some(who) = who else {
        return Err(tonic::Status::unauthenticated(
            "this API takes a client certificate of the cluster (system:masters)",
        ));
    };
    let member = |g: &str| who.groups.iter().any(|have| have == g);
    let allowed = member(MASTERS) || (path == "/skiff.control.Control/Join" && member(skiff_pki::PEERS_GROUP));
    if allowed {
        Ok(())
    } else {
        Err(tonic::Status::permission_denied(format!(
            "user {:?} may not call {path}: the etcd API and the key history are for {MASTERS} only",
            who.name
        )))
    }
}

pin_project_lite::pin_project! {
    /// A call bounded by its caller's deadline, as in grpc-go's server: the
    /// `grpc-timeout` header bounds the call until its response headers (a
    /// stream's messages may follow later), and the caller hears why it
    /// ended. A call [`admit`] refused has no answer to wait for: its
    /// refusal is the answer.
    struct Deadline<F> {
        #[pin]
        answer: Option<F>,
        refused: Option<tonic::Status>,
        #[pin]
        expiry: Option<tokio::time::Sleep>,
    }
}

type Answer = Result<hyper::Response<tonic::body::BoxBody>, tonic::codegen::StdError>;

impl<F: Future<Output = Answer>> Future for Deadline<F> {
    type Output = Answer;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer> {
        let this = self.project();
        if let Some(refused) = this.refused.take() {
            return Poll::Ready(Ok(refused.into_http()));
        }
        if let Some(Poll::Ready(answer)) = this.answer.as_pin_mut().map(|answer| answer.poll(cx)) {
            return Poll::Ready(answer);
        }
        match this.expiry.as_pin_mut().map(|expiry| expiry.poll(cx)) {
            Some(Poll::Ready(())) => {
                Poll::Ready(Ok(tonic::Status::deadline_exceeded("context deadline exceeded").into_http()))
            }
            _ => Poll::Pending,
        }
    }
}

/// hyper's executor for a connection's request futures: it queues them for
/// the connection's task, which polls them (see [`ConnectionTask`]).
#[derive(Clone, Default)]
struct Spawner(Arc<Queue>);

#[derive(Default)]
struct Queue {
    new: Mutex<Vec<Request>>,
    /// Set while the connection's task is being polled: it looks at the
    /// queue before it returns, so a request queued then needs no wake-up.
    polling: AtomicBool,
    task: AtomicWaker,
}

impl<F: Future<Output = ()> + Send + 'static> hyper::rt::Executor<F> for Spawner {
    fn execute(&self, request: F) {
        self.0.new.lock().expect("request queue lock").push(Box::pin(request));
        if !self.0.polling.load(Ordering::Acquire) {
            self.0.task.wake();
        }
    }
}

impl Spawner {
    fn take(&self) -> Vec<Request> {
        std::mem::take(&mut *self.0.new.lock().expect("request queue lock"))
    }
}

/// One connection and the requests it carries, polled as one future.
struct ConnectionTask<C> {
    conn: Pin<Box<C>>,
    spawner: Spawner,
    requests: FuturesUnordered<Request>,
    closed: bool,
}

/// How many times one poll may go round requests and connection before it
/// yields to other tasks.
const ROUNDS: usize = 8;

impl<C, E> Future for ConnectionTask<C>
where
    C: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        this.spawner.0.task.register(cx.waker());
        this.spawner.0.polling.store(true, Ordering::Release);
        let mut rounds = 0;
        loop {
            // Requests first, so that every one of them that woke has
            // written its answer before the connection flushes.
            this.requests.extend(this.spawner.take());
            while let Poll::Ready(Some(())) = this.requests.poll_next_unpin(cx) {}
            if !this.closed {
                if let Poll::Ready(result) = this.conn.as_mut().poll(cx) {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "client connection ended");
                    }
                    this.closed = true;
                }
            }
            rounds += 1;
            let more = !this.spawner.0.new.lock().expect("request queue lock").is_empty();
            if !more {
                break;
            }
            if rounds == ROUNDS {
                cx.waker().wake_by_ref();
                break;
            }
        }
        this.spawner.0.polling.store(false, Ordering::Release);
        // A request queued after the last look (from outside this poll)
        // woke nobody while `polling` was set.
        if !this.spawner.0.new.lock().expect("request queue lock").is_empty() {
            cx.waker().wake_by_ref();
        }
        if this.closed && this.requests.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// The caller's deadline from the `grpc-timeout` header: at most 8 digits
/// and a unit (`H`, `M`, `S`, `m`, `u`, `n`). A malformed header is ignored,
/// as if absent.
fn grpc_timeout(headers: &hyper::HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    let unit = value.chars().last()?;
    let amount = &value[..value.len() - unit.len_utf8()];
    if amount.is_empty() || amount.len() > 8 || !amount.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = amount.parse().ok()?;
    Some(match unit {
        'H' => Duration::from_secs(amount * 3600),
        'M' => Duration::from_secs(amount * 60),
        'S' => Duration::from_secs(amount),
        'm' => Duration::from_millis(amount),
        'u' => Duration::from_micros(amount),
        'n' => Duration::from_nanos(amount),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_client_certificates_the_etcd_api_is_for_masters_and_joins_for_members_too() {
        let who = |user: &str, group: &str| UserInfo { name: user.into(), groups: vec![group.into()] };
        let admin = who("root", MASTERS);
        let peer = who("master-2", skiff_pki::PEERS_GROUP);
        let node = who("system:node:a", "system:nodes");
        let put = "/etcdserverpb.KV/Put";
        let join = "/skiff.control.Control/Join";
        assert!(admit(put, Some(&admin)).is_ok());
        assert!(admit(join, Some(&admin)).is_ok());
        assert!(admit(join, Some(&peer)).is_ok());
        assert_eq!(admit(put, Some(&peer)).unwrap_err().code(), tonic::Code::PermissionDenied);
        assert_eq!(
            admit("/skiff.control.Control/History", Some(&node)).unwrap_err().code(),
            tonic::Code::PermissionDenied
        );
        assert_eq!(admit("/v3lockpb.Lock/Lock", None).unwrap_err().code(), tonic::Code::Unauthenticated);
        // The resource API checks each request itself, certificate or not.
        assert!(admit("/skiff.resource.Resources/Get", None).is_ok());
        assert!(admit("/skiff.resource.Resources/Get", Some(&node)).is_ok());
    }

    fn timeout_of(value: &str) -> Option<Duration> {
        let mut headers = hyper::HeaderMap::new();
        headers.insert("grpc-timeout", value.parse().unwrap());
        grpc_timeout(&headers)
    }

    #[test]
    fn grpc_timeouts_parse_every_unit_and_refuse_the_malformed() {
        assert_eq!(timeout_of("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(timeout_of("3M"), Some(Duration::from_secs(180)));
        assert_eq!(timeout_of("5S"), Some(Duration::from_secs(5)));
        assert_eq!(timeout_of("4999m"), Some(Duration::from_millis(4999)));
        assert_eq!(timeout_of("10u"), Some(Duration::from_micros(10)));
        assert_eq!(timeout_of("99999999n"), Some(Duration::from_nanos(99_999_999)));
        for bad in ["", "S", "123456789S", "5s", "-5S", "+5S", "5", "1.5S", "5 S"] {
            assert_eq!(timeout_of(bad), None, "{bad:?}");
        }
        assert_eq!(grpc_timeout(&hyper::HeaderMap::new()), None);
    }

    #[test]
    fn an_audited_call_records_the_status_its_response_starts_with() {
        let ok: Answer = Ok(hyper::Response::new(tonic::body::empty_body()));
        assert_eq!(outcome(&ok), 200);
        let future = Ok(tonic::Status::out_of_range("required revision is a future revision").into_http());
        assert_eq!(outcome(&future), 410);
        assert_eq!(outcome(&Ok(tonic::Status::permission_denied("no").into_http())), 403);
        let failed: Answer = Err("broken".into());
        assert_eq!(outcome(&failed), 500);
    }

    #[test]
    fn calls_the_resource_api_audits_itself_and_refused_callers_are_not_logged_here() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let config = crate::audit::AuditConfig { path: dir.path().join("audit.log"), policy_file: None };
            let log = AuditLog::open(&config, &Shutdown::new()).await.unwrap();
            let audit = Audit { log, remote: "127.0.0.1:1".parse().unwrap() };
            let request = |path: &str| hyper::Request::builder().uri(path).body(()).unwrap();
            let admin = Some(Some(ClientCertificate(UserInfo { name: "root".into(), groups: vec![MASTERS.into()] })));
            assert!(audit.begin(&admin, &request("/etcdserverpb.KV/Put")).is_some());
            assert!(audit.begin(&None, &request("/etcdserverpb.Watch/Watch")).is_some());
            assert!(audit.begin(&admin, &request("/skiff.resource.Resources/Get")).is_none());
            assert!(audit.begin(&Some(None), &request("/etcdserverpb.KV/Put")).is_none());
        });
    }
}
