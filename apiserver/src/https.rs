//! The HTTP listener over TLS: each connection's handshake first (a
//! client certificate, if one is presented, must chain to the client CA),
//! then HTTP/1.1 with upgrades (kubectl's WebSockets) or HTTP/2 as the
//! client's ALPN chose, every request carrying the verified certificate's
//! identity as a [`ClientCertificate`] extension for authentication.
//!
//! Certificates rotate without a restart: the files are checked every
//! [`RELOAD_CHECK`], and once they change (and load), new connections
//! are served with the new ones while open connections keep theirs.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use skiff_pki::ServerFiles;
use skiff_shutdown::Shutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower::ServiceExt;

use crate::admission::{ClientCertificate, UserInfo};

/// How long a client has to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the certificate files are checked for a rotation.
pub const RELOAD_CHECK: Duration = Duration::from_secs(2);

/// What identifies a version of a file: a rename (how certificates are
/// replaced safely) changes the inode, an edit in place the mtime.
type Stamp = Option<(u64, std::time::SystemTime, u64)>;

fn stamps(files: &ServerFiles) -> Vec<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let paths = [Some(&files.cert), Some(&files.key), files.client_ca.as_ref()];
    paths
        .into_iter()
        .flatten()
        .map(|p| std::fs::metadata(p).ok().and_then(|m| Some((m.ino(), m.modified().ok()?, m.len()))))
        .collect()
}

/// Keeps `current` at the configuration `files` hold, until `shutdown`.
/// A pair caught halfway through its rotation (a new certificate, the old
/// key) does not load; the old configuration serves until it does.
async fn reload(files: ServerFiles, current: watch::Sender<Arc<rustls::ServerConfig>>, shutdown: Shutdown) {
    let mut seen = stamps(&files);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(RELOAD_CHECK) => {}
            () = shutdown.cancelled() => return,
        }
        let now = stamps(&files);
        if now == seen {
            continue;
        }
        match skiff_pki::server_config(&files) {
            Ok(config) => {
                tracing::info!(cert = %files.cert.display(), "serving with the rotated certificate");
                current.send_replace(Arc::new(config));
                seen = now;
            }
            Err(e) => tracing::warn!(error = %e, "the changed certificate files do not load yet; serving with the old"),
        }
    }
}

/// Serves `app` over TLS on `listener` until `shutdown`, then lets each
/// connection finish what it has in flight; `tls` was loaded from `files`,
/// which are watched for a rotation.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    files: ServerFiles,
    tls: Arc<rustls::ServerConfig>,
    shutdown: Shutdown,
) {
    let (sender, current) = watch::channel(tls);
    shutdown.spawn(reload(files, sender, shutdown.clone()));
    let connections = shutdown.child();
    loop {
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::debug!(error = %e, "accepting an HTTPS connection");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let acceptor = tokio_rustls::TlsAcceptor::from(current.borrow().clone());
        let (app, stop) = (app.clone(), connections.clone());
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
