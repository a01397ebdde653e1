//! The HTTP listener over TLS: each connection's handshake first (a
//! client certificate, if one is presented, must chain to the client CA),
//! then HTTP/1.1 with upgrades (kubectl's WebSockets) or HTTP/2 as the
//! client's ALPN chose, every request carrying the verified certificate's
//! identity as a [`ClientCertificate`] extension for authentication.
//!
//! Certificates rotate without a restart ([`crate::tls::follow`]): new
//! connections are served with the new ones, open connections keep theirs.

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use skiff_shutdown::Shutdown;
use tokio::net::TcpListener;
use tower::ServiceExt;

use crate::admission::ClientCertificate;

/// Serves `app` over TLS on `listener` until `shutdown`, then lets each
/// connection finish what it has in flight; new connections are served with
/// the `current` configuration.
pub async fn serve(listener: TcpListener, app: Router, current: crate::tls::Current, shutdown: Shutdown) {
    let connections = shutdown.child();
    while let Some((stream, remote)) = crate::tls::accept(&listener, &shutdown).await {
        let acceptor = tokio_rustls::TlsAcceptor::from(current.borrow().clone());
        let (app, stop) = (app.clone(), connections.clone());
        connections.spawn(async move {
            let (tls, peer) = match skiff_pki::transport::accept(&acceptor, stream).await {
                Ok(accepted) => accepted,
                // A plain-HTTP client, an unknown CA, an expired
                // certificate: the client hears a TLS alert.
                Err(e) => return tracing::debug!(error = %e, "TLS handshake failed"),
            };
            let peer = peer.map(ClientCertificate::from);
            let service = hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
                if let Some(peer) = &peer {
                    request.extensions_mut().insert(peer.clone());
                }
                // Where the request came from, for the audit log.
                request.extensions_mut().insert(remote);
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
