//! TLS for Skiff's gRPC connections: the client side (a tonic connector
//! that verifies the server against the cluster CA and presents a client
//! certificate) and the server side (one handshake with a deadline, then
//! who the verified client certificate names).
//!
//! Raft peers use both ends with [`PEERS_GROUP`] required of the other
//! side: a member talks Raft only to a holder of a peer certificate, and
//! serves Raft only to one, whatever else the cluster CA has signed.

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;

use crate::{identity, invalid, provider, read_certs, read_key, Identity, PkiError, ServerFiles};

/// The group of the certificates Raft peers hold: a member accepts Raft
/// connections only from its holders, and opens them only to its holders.
pub const PEERS_GROUP: &str = "system:skiff-peers";

/// How long a TLS handshake may take, either side.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a TLS client trusts and presents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientFiles {
    /// The authority the servers' certificates must chain to.
    pub ca: PathBuf,
    /// The client certificate and its key, if the client has one.
    pub cert: Option<(PathBuf, PathBuf)>,
}

fn roots(ca: &std::path::Path) -> Result<RootCertStore, PkiError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(ca)? {
        roots.add(cert).map_err(|e| invalid(ca.display().to_string(), e))?;
    }
    Ok(roots)
}

/// A rustls client configuration speaking HTTP/2 (gRPC).
pub fn client_config(files: &ClientFiles) -> Result<ClientConfig, PkiError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots(&files.ca)?);
    let mut config = match &files.cert {
        Some((cert, key)) => builder.with_client_auth_cert(read_certs(cert)?, read_key(key)?)?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// A rustls client configuration that accepts any server certificate
/// (its handshake signatures still checked): only for fetching the
/// cluster's CA, which the caller then checks against a join token's pin
/// before trusting it or sending anything secret. Nothing else may use it
/// but [`probe_config`].
pub fn discovery_config() -> Result<ClientConfig, PkiError> {
    any_server_config(b"h2")
}

/// A rustls client configuration for the node agent's https probes and
/// hooks, speaking HTTP/1.1. Like the kubelet's (`InsecureSkipVerify`), it
/// accepts any server certificate: a probe asks a pod's own server whether
/// it is up, at the pod's IP, and sends nothing secret.
pub fn probe_config() -> Result<ClientConfig, PkiError> {
    any_server_config(b"http/1.1")
}

fn any_server_config(alpn: &[u8]) -> Result<ClientConfig, PkiError> {
    let provider = provider();
    let verifier = Arc::new(AnyServer { schemes: provider.signature_verification_algorithms });
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(config)
}

/// A verifier that takes any certificate: see [`discovery_config`] and
/// [`probe_config`].
#[derive(Debug)]
struct AnyServer {
    schemes: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls_pki_types::CertificateDer<'_>,
        _intermediates: &[rustls_pki_types::CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.schemes)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.schemes)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.schemes.supported_schemes()
    }
}

/// A rustls configuration for the peer listener: HTTP/2 only, and a
/// client certificate of `files.client_ca` required (the handshake fails
/// without one).
pub fn peer_server_config(files: &ServerFiles) -> Result<ServerConfig, PkiError> {
    let ca = files.client_ca.as_ref().ok_or_else(|| invalid("the peer listener", "needs a CA for its peers"))?;
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider())
        .build()
        .map_err(|e| invalid(ca.display().to_string(), e))?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(read_certs(&files.cert)?, read_key(&files.key)?)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// Who the other end of a handshake proved to be, from the first
/// certificate of its verified chain; `None` when it presented none (or
/// one whose subject names no one).
pub fn peer_identity(certificates: Option<&[rustls_pki_types::CertificateDer<'_>]>) -> Option<Identity> {
    let der = certificates?.first()?;
    identity(der).ok()
}

/// The server side of one connection: the handshake, bounded by
/// [`HANDSHAKE_TIMEOUT`], and the identity the client's certificate
/// proved (`None` without one).
pub async fn accept(
    acceptor: &tokio_rustls::TlsAcceptor,
    stream: TcpStream,
) -> io::Result<(tokio_rustls::server::TlsStream<TcpStream>, Option<Identity>)> {
    let tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
    let who = peer_identity(tls.get_ref().1.peer_certificates());
    Ok((tls, who))
}

/// A tonic connector (`Endpoint::connect_with_connector`) dialing TCP and
/// then TLS, the server verified against the client configuration's roots
/// under the host name of the URI, and, with [`Connector::requiring`], in
/// that group.
#[derive(Clone)]
pub struct Connector {
    tls: Tls,
    group: Option<&'static str>,
}

/// The configuration new connections are made with.
#[derive(Clone)]
enum Tls {
    Fixed(tokio_rustls::TlsConnector),
    /// Whatever the watch holds when a connection is dialed: a rotated
    /// client certificate is presented from the next connection on.
    Following(tokio::sync::watch::Receiver<Arc<ClientConfig>>),
}

impl Tls {
    fn connector(&self) -> tokio_rustls::TlsConnector {
        match self {
            Tls::Fixed(tls) => tls.clone(),
            Tls::Following(configs) => tokio_rustls::TlsConnector::from(configs.borrow().clone()),
        }
    }
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector").field("group", &self.group).finish_non_exhaustive()
    }
}

impl Connector {
    pub fn new(config: Arc<ClientConfig>) -> Connector {
        Connector { tls: Tls::Fixed(tokio_rustls::TlsConnector::from(config)), group: None }
    }

    /// A connector dialing with the configuration `configs` holds at each
    /// connection (one that follows its certificate files as they rotate).
    pub fn following(configs: tokio::sync::watch::Receiver<Arc<ClientConfig>>) -> Connector {
        Connector { tls: Tls::Following(configs), group: None }
    }

    /// The same connector, refusing servers whose certificate is not in
    /// `group`.
    pub fn requiring(mut self, group: &'static str) -> Connector {
        self.group = Some(group);
        self
    }

    async fn connect(self, uri: http::Uri) -> io::Result<TokioIo<tokio_rustls::client::TlsStream<TcpStream>>> {
        let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("{uri}: {why}"));
        let host = uri.host().ok_or_else(|| bad("no host"))?;
        let port = uri.port_u16().ok_or_else(|| bad("no port"))?;
        // `[::1]` in a URI is `::1` to the resolver and in a certificate.
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_string()).map_err(|_| bad("not a host name or address"))?;
        let stream = TcpStream::connect((host, port)).await?;
        stream.set_nodelay(true)?;
        let tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, self.tls.connector().connect(name, stream))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, format!("{uri}: TLS handshake timed out")))??;
        if let Some(group) = self.group {
            let who = peer_identity(tls.get_ref().1.peer_certificates());
            if !who.is_some_and(|who| who.groups.iter().any(|g| g == group)) {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("{uri}: the server's certificate is not in group {group}"),
                ));
            }
        }
        Ok(TokioIo::new(tls))
    }
}

type Connecting = Pin<Box<dyn Future<Output = io::Result<TokioIo<tokio_rustls::client::TlsStream<TcpStream>>>> + Send>>;

impl tower_service::Service<http::Uri> for Connector {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = io::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Connecting {
        Box::pin(self.clone().connect(uri))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Authority, Profile, DEFAULT_VALIDITY};

    struct Pki {
        dir: tempfile::TempDir,
    }

    impl Pki {
        fn new() -> Pki {
            let dir = tempfile::tempdir().unwrap();
            Authority::load_or_create(dir.path(), "test-ca").unwrap();
            Pki { dir }
        }

        fn issue(&self, stem: &str, profile: Profile) -> (PathBuf, PathBuf) {
            let ca = Authority::load(self.dir.path()).unwrap();
            ca.issue(&profile, DEFAULT_VALIDITY).unwrap().write(self.dir.path(), stem).unwrap();
            (self.dir.path().join(format!("{stem}.crt")), self.dir.path().join(format!("{stem}.key")))
        }

        fn ca(&self) -> PathBuf {
            self.dir.path().join("ca.crt")
        }

        fn peer(&self, stem: &str) -> (PathBuf, PathBuf) {
            self.issue(stem, Profile::Peer { user: stem.into(), names: vec!["127.0.0.1".into()] })
        }

        fn connector(&self, cert: Option<(PathBuf, PathBuf)>) -> Connector {
            Connector::new(Arc::new(client_config(&ClientFiles { ca: self.ca(), cert }).unwrap()))
        }
    }

    /// A listener serving `config`, answering each handshake with the
    /// identity the client proved (or the handshake's error) on `seen`.
    async fn listener(
        config: ServerConfig,
    ) -> (std::net::SocketAddr, tokio::sync::mpsc::UnboundedReceiver<io::Result<Option<Identity>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let seen = accept(&acceptor, stream).await.map(|(_, who)| who);
                let _ = tx.send(seen);
            }
        });
        (addr, rx)
    }

    fn uri(addr: std::net::SocketAddr) -> http::Uri {
        format!("https://{addr}").parse().unwrap()
    }

    #[tokio::test]
    async fn peers_prove_themselves_to_each_other_and_no_one_else_gets_in() {
        use tower_service::Service;
        let pki = Pki::new();
        let (cert, key) = pki.peer("member-1");
        let files = ServerFiles { cert, key, client_ca: Some(pki.ca()) };
        let (addr, mut seen) = listener(peer_server_config(&files).unwrap()).await;

        // A peer reaches a peer, and each sees the other in the group.
        let mut peer = pki.connector(Some(pki.peer("member-2"))).requiring(PEERS_GROUP);
        peer.call(uri(addr)).await.expect("a peer connects to a peer");
        let who = seen.recv().await.unwrap().unwrap().unwrap();
        assert_eq!((who.user.as_str(), who.groups), ("member-2", vec![PEERS_GROUP.to_string()]));

        // No certificate: the peer listener ends the handshake.
        let _ = pki.connector(None).call(uri(addr)).await;
        assert!(seen.recv().await.unwrap().is_err(), "a client without a certificate is refused");

        // Another authority's peer certificate: refused both ways.
        let stranger = Pki::new();
        let _ = stranger.connector(Some(stranger.peer("member-9"))).call(uri(addr)).await;
        assert!(seen.recv().await.unwrap().is_err(), "a stranger's certificate is refused");

        // A server of the cluster that is not a peer is not dialed as one.
        let (cert, key) = pki.issue("apiserver", Profile::Server { names: vec!["127.0.0.1".into()] });
        let files = ServerFiles { cert, key, client_ca: Some(pki.ca()) };
        let (plain, _seen) = listener(crate::server_config(&files).unwrap()).await;
        let e = peer.call(uri(plain)).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        // The same server is fine for an ordinary client.
        pki.connector(None).call(uri(plain)).await.expect("a client connects to a server");
    }

    #[tokio::test]
    async fn a_following_connector_presents_the_certificate_it_was_last_given() {
        use tower_service::Service;
        let pki = Pki::new();
        let (cert, key) = pki.peer("member-1");
        let (addr, mut seen) =
            listener(peer_server_config(&ServerFiles { cert, key, client_ca: Some(pki.ca()) }).unwrap()).await;
        let config =
            |stem: &str| Arc::new(client_config(&ClientFiles { ca: pki.ca(), cert: Some(pki.peer(stem)) }).unwrap());
        let (rotate, configs) = tokio::sync::watch::channel(config("member-2"));
        let mut peer = Connector::following(configs).requiring(PEERS_GROUP);
        peer.call(uri(addr)).await.unwrap();
        assert_eq!(seen.recv().await.unwrap().unwrap().unwrap().user, "member-2");

        rotate.send_replace(config("member-2-renewed"));
        peer.call(uri(addr)).await.unwrap();
        assert_eq!(seen.recv().await.unwrap().unwrap().unwrap().user, "member-2-renewed");
    }
}
