//! The HTTP listener over TLS: each connection's handshake first (a
//! client certificate, if one is presented, must chain to the client CA),
//! then HTTP/1.1 with upgrades (kubectl's WebSockets) or HTTP/2 as the
//! client's ALPN chose, every request carrying the verified certificate's
//! identity as a [`ClientCertificate`] extension for authentication.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use skiff_shutdown::Shutdown;
use tokio::net::TcpListener;
use tower::ServiceExt;

use crate::admission::{ClientCertificate, UserInfo};

/// How long a client has to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `app` over TLS on `listener` until `shutdown`, then lets each
/// connection finish what it has in flight.
pub async fn serve(listener: TcpListener, app: Router, tls: Arc<rustls::ServerConfig>, shutdown: Shutdown) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let connections = shutdown.child();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::debug!(error = %e, "accepting an HTTPS connection");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let (acceptor, app, stop) = (acceptor.clone(), app.clone(), connections.clone());
        connections.spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                // A plain-HTTP client, an unknown CA, an expired
                // certificate: the client hears a TLS alert.
                Ok(Err(e)) => return tracing::debug!(error = %e, "TLS handshake failed"),
                Err(_) => return tracing::debug!("TLS handshake timed out"),
            };
            let peer = tls.get_ref().1.peer_certificates().and_then(|chain| chain.first()).and_then(|der| {
                skiff_pki::identity(der)
                    .map_err(|e| tracing::debug!(error = %e, "a verified client certificate names no one"))
                    .ok()
            });
            let peer = peer.map(|id| ClientCertificate(UserInfo { name: id.user, groups: id.groups }));
            let service = hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
                if let Some(peer) = &peer {
                    request.extensions_mut().insert(peer.clone());
                }
                app.clone().oneshot(request.map(axum::body::Body::new))
            });
            let builder = auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                served = conn.as_mut() => {
                    if let Err(e) = served {
                        tracing::debug!(error = %e, "HTTPS connection ended");
                    }
                    return;
                }
                () = stop.cancelled() => {}
            }
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        });
    }
    connections.wait().await
}
