//! What the three TLS listeners share: a configuration that follows its
//! files (certificates rotate without a restart), and, for the peer
//! listener, connections let through only once their client certificate
//! proved a Raft peer.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use skiff_pki::{ServerFiles, PEERS_GROUP};
use skiff_shutdown::Shutdown;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

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

/// A listener's TLS configuration, kept at what its files hold.
pub type Current = watch::Receiver<Arc<rustls::ServerConfig>>;

/// `load(files)` now, then again whenever the files change, until
/// `shutdown`. A pair caught halfway through its rotation (a new
/// certificate, the old key) does not load; the old configuration serves
/// until it does. Fails if the files do not load now. `T` is a listener's
/// `ServerConfig`, or the `ClientConfig` a member dials its peers with.
pub fn follow<T: Send + Sync + 'static>(
    files: ServerFiles,
    load: fn(&ServerFiles) -> Result<T, skiff_pki::PkiError>,
    shutdown: &Shutdown,
) -> Result<watch::Receiver<Arc<T>>, skiff_pki::PkiError> {
    let (current, receiver) = watch::channel(Arc::new(load(&files)?));
    let stop = shutdown.clone();
    shutdown.spawn(async move {
        let mut seen = stamps(&files);
        loop {
            tokio::select! {
                _ = tokio::time::sleep(RELOAD_CHECK) => {}
                () = stop.cancelled() => return,
            }
            let now = stamps(&files);
            if now == seen {
                continue;
            }
            match load(&files) {
                Ok(config) => {
                    tracing::info!(cert = %files.cert.display(), "using the rotated certificate");
                    current.send_replace(Arc::new(config));
                    seen = now;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the changed certificate files do not load yet; serving with the old")
                }
            }
        }
    });
    Ok(receiver)
}

/// The next connection on `listener`, Nagle's algorithm off (small gRPC
/// and TLS frames would wait out delayed ACKs); `None` once `shutdown` is
/// cancelled. Failed accepts (out of file descriptors, a connection reset
/// before it was accepted) are logged and skipped.
pub async fn accept(listener: &TcpListener, shutdown: &Shutdown) -> Option<(TcpStream, std::net::SocketAddr)> {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, remote)) => {
                    let _ = stream.set_nodelay(true);
                    return Some((stream, remote));
                }
                Err(e) => {
                    tracing::debug!(error = %e, local = ?listener.local_addr().ok(), "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            () = shutdown.cancelled() => return None,
        }
    }
}

/// The connections of the peer listener that proved, by a certificate of
/// the peers' CA in [`PEERS_GROUP`], to come from a member, as tonic's
/// server takes them. Handshakes run in tasks of their own, so a client
/// that never finishes one holds up no one; one without a certificate, or
/// with someone else's, is closed before any Raft message is read.
pub fn peers(listener: TcpListener, tls: Current, shutdown: Shutdown) -> impl futures::Stream<Item = io::Result<Peer>> {
    let (sender, receiver) = mpsc::channel(64);
    let handshakes = shutdown.child();
    let stop = shutdown.clone();
    shutdown.spawn(async move {
        while let Some((stream, remote)) = accept(&listener, &stop).await {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.borrow().clone());
            let sender = sender.clone();
            handshakes.spawn(async move {
                match skiff_pki::transport::accept(&acceptor, stream).await {
                    Ok((stream, Some(who))) if who.groups.iter().any(|g| g == PEERS_GROUP) => {
                        let _ = sender.send(Ok(Peer(stream))).await;
                    }
                    Ok((_, who)) => {
                        let who = who.map_or_else(|| "no one".to_string(), |w| w.user);
                        tracing::warn!(%remote, %who, "refused a peer connection: not a peer certificate");
                    }
                    Err(e) => tracing::warn!(%remote, error = %e, "refused a peer connection"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(receiver)
}

/// A peer's connection, after its handshake.
pub struct Peer(tokio_rustls::server::TlsStream<TcpStream>);

impl tonic::transport::server::Connected for Peer {
    type ConnectInfo = ();

    fn connect_info(&self) {}
}

impl AsyncRead for Peer {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Peer {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
