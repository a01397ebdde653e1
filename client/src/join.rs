//! Joining a cluster with a join token (`K10<CA hash>::<id>.<secret>`):
//! fetch the cluster's CA over a connection not yet trusted, check it
//! against the token's pin, and only then, over a connection verified
//! against that CA, trade the token and a signing request for a
//! certificate of this node's own key. The files land in a directory the
//! node keeps, and are reused (and renewed) on later starts.
//!
//! A master joins the same way with a join-master token, trading it for
//! certificates of its own serving and peer keys and the keys every
//! master shares ([`master_credentials`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use skiff_pki::token::JoinToken;
use skiff_pki::{ClientFiles, Connector};
use skiff_proto::bootstrap::bootstrap_client::BootstrapClient;
use skiff_proto::bootstrap::{ClusterCaRequest, MasterCredentialsRequest, NodeCredentialsRequest};
use tonic::transport::{Channel, Endpoint};

/// Renew a kept certificate when less than this share of a year is left.
const RENEW_WHEN_LEFT: Duration = Duration::from_secs(120 * 24 * 3600);

#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("{0}")]
    Pin(skiff_pki::PkiError),
    #[error("{endpoint}: {message}")]
    Server { endpoint: String, message: String },
    #[error("{0}")]
    Files(skiff_pki::PkiError),
    #[error("no apiserver could be reached: {0}")]
    Unreachable(String),
}

impl JoinError {
    /// Whether another endpoint may do better (the server could not be
    /// reached or could not serve); a refusal or a pin mismatch ends it.
    fn worth_another_endpoint(&self) -> bool {
        match self {
            JoinError::Server { .. } | JoinError::Unreachable(_) => true,
            JoinError::Pin(_) | JoinError::Files(_) => false,
        }
    }
}

/// `https://HOST:PORT` for an endpoint given as `HOST:PORT` or a URL.
fn url(endpoint: &str) -> String {
    match endpoint.split_once("://") {
        Some((_, rest)) => format!("https://{rest}"),
        None => format!("https://{endpoint}"),
    }
}

async fn channel(endpoint: &str, connector: Connector) -> Result<Channel, JoinError> {
    let unreachable = |e: &dyn std::fmt::Display| JoinError::Unreachable(format!("{endpoint}: {e}"));
    Endpoint::from_shared(url(endpoint))
        .map_err(|e| unreachable(&e))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(15))
        .connect_with_connector(connector)
        .await
        .map_err(|e| unreachable(&e))
}

fn refused(endpoint: &str, status: tonic::Status) -> JoinError {
    match status.code() {
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Unknown => {
            JoinError::Unreachable(format!("{endpoint}: {}", status.message()))
        }
        _ => JoinError::Server { endpoint: endpoint.to_string(), message: status.message().to_string() },
    }
}

/// The cluster's CA as `endpoint` serves it, if `token` pins it. Nothing
/// secret is sent: the connection is not trusted yet.
pub async fn pinned_ca(endpoint: &str, token: &JoinToken) -> Result<String, JoinError> {
    let config = skiff_pki::transport::discovery_config().map_err(JoinError::Files)?;
    let mut client = BootstrapClient::new(channel(endpoint, Connector::new(Arc::new(config))).await?);
    let ca_pem = client.cluster_ca(ClusterCaRequest {}).await.map_err(|s| refused(endpoint, s))?.into_inner().ca_pem;
    token.check_pin(&ca_pem).map_err(JoinError::Pin)?;
    Ok(ca_pem)
}

/// Where the pinned CA waits, in the directory being joined into, until
/// the join is done.
const PINNED_CA: &str = "ca.crt.pinned";

/// The CA `endpoint` serves, if `token` pins it, written to `dir` as what
/// the verified connection that sends the token trusts.
async fn pinned_trust(endpoint: &str, token: &JoinToken, dir: &Path) -> Result<(String, ClientFiles), JoinError> {
    let ca_pem = pinned_ca(endpoint, token).await?;
    std::fs::create_dir_all(dir)
        .map_err(|source| JoinError::Files(skiff_pki::PkiError::Io { path: dir.to_path_buf(), source }))?;
    let ca = dir.join(PINNED_CA);
    skiff_pki::write_public(&ca, &ca_pem).map_err(JoinError::Files)?;
    Ok((ca_pem, ClientFiles { ca, cert: None }))
}

/// `token` as a bearer token on `request`.
fn with_bearer<T>(request: &mut tonic::Request<T>, token: &JoinToken) {
    let bearer = format!("Bearer {}", token.bearer()).parse().expect("a token is ASCII");
    request.metadata_mut().insert("authorization", bearer);
}

/// A certificate for node `name` from `endpoint`, verified against
/// `files.ca` and authenticated with `token` (a bearer token) or with
/// `files.cert` (the node's own, to renew it). Returns the new key and
/// certificate, PEM.
async fn node_certificate(
    endpoint: &str,
    files: &ClientFiles,
    token: Option<&JoinToken>,
    name: &str,
) -> Result<(String, String), JoinError> {
    let config = skiff_pki::transport::client_config(files).map_err(JoinError::Files)?;
    let mut client = BootstrapClient::new(channel(endpoint, Connector::new(Arc::new(config))).await?);
    let (key_pem, csr_pem) = skiff_pki::signing_request(&format!("system:node:{name}")).map_err(JoinError::Files)?;
    let mut request = tonic::Request::new(NodeCredentialsRequest { node_name: name.to_string(), csr_pem });
    if let Some(token) = token {
        with_bearer(&mut request, token);
    }
    let issued = client.node_credentials(request).await.map_err(|s| refused(endpoint, s))?.into_inner();
    Ok((key_pem, issued.cert_pem))
}

/// Where a node keeps what it joined with: `ca.crt`, `node.crt`, `node.key`.
#[derive(Clone, Debug)]
pub struct NodeFiles {
    pub dir: PathBuf,
}

impl NodeFiles {
    pub fn new(dir: &Path) -> NodeFiles {
        NodeFiles { dir: dir.to_path_buf() }
    }

    /// The client files a node connects with.
    pub fn client_files(&self) -> ClientFiles {
        ClientFiles { ca: self.dir.join("ca.crt"), cert: Some((self.dir.join("node.crt"), self.dir.join("node.key"))) }
    }

    fn write(&self, ca_pem: &str, key_pem: &str, cert_pem: &str) -> Result<(), JoinError> {
        let issued = skiff_pki::Issued { cert_pem: cert_pem.to_string(), key_pem: key_pem.to_string() };
        issued.write(&self.dir, "node").map_err(JoinError::Files)?;
        skiff_pki::write_public(&self.dir.join("ca.crt"), ca_pem).map_err(JoinError::Files)
    }

    /// What the kept files say: the CA (PEM) and who the certificate
    /// names, until when; `None` when there are none yet.
    fn kept(&self) -> Result<Option<(String, skiff_pki::Identity, i64)>, JoinError> {
        let read = |name: &str| std::fs::read_to_string(self.dir.join(name));
        let (Ok(ca), Ok(cert)) = (read("ca.crt"), read("node.crt")) else { return Ok(None) };
        let (who, not_after) = skiff_pki::describe(&cert).map_err(JoinError::Files)?;
        Ok(Some((ca, who, not_after)))
    }
}

/// Runs `step` against each endpoint in turn until one answers.
async fn on_any<T, F, Fut>(endpoints: &[String], step: F) -> Result<T, JoinError>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<T, JoinError>>,
{
    let mut last = JoinError::Unreachable("no endpoint given".into());
    for endpoint in endpoints {
        match step(endpoint.clone()).await {
            Ok(done) => return Ok(done),
            Err(e) if e.worth_another_endpoint() => last = e,
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

/// The credentials node `name` connects with, from `files`: those it
/// kept if they are for this name (and this token's CA), renewed when
/// they near their end; else new ones for `token`. `Err` says why the
/// node cannot join.
pub async fn node_credentials(
    endpoints: &[String],
    token: Option<&JoinToken>,
    name: &str,
    files: &NodeFiles,
) -> Result<ClientFiles, JoinError> {
    let user = format!("system:node:{name}");
    let now = chrono::Utc::now().timestamp();
    if let Some((ca, who, not_after)) = files.kept()? {
        let pinned = token.is_none_or(|t| t.check_pin(&ca).is_ok());
        if who.user == user && pinned && not_after > now {
            if not_after - now < RENEW_WHEN_LEFT.as_secs() as i64 {
                let kept = files.client_files();
                let renewed = on_any(endpoints, |e| {
                    let kept = kept.clone();
                    async move { node_certificate(&e, &kept, None, name).await }
                })
                .await;
                match renewed {
                    Ok((key, cert)) => {
                        files.write(&ca, &key, &cert)?;
                        tracing::info!(node = name, "renewed the node's certificate");
                    }
                    Err(e) => tracing::warn!(error = %e, "renewing the node's certificate failed; the kept one serves"),
                }
            }
            return Ok(files.client_files());
        }
    }
    let Some(token) = token else {
        return Err(JoinError::Files(skiff_pki::PkiError::Invalid {
            what: files.dir.display().to_string(),
            message: format!("holds no valid certificate for {user}, and no --token was given to get one"),
        }));
    };
    let (ca_pem, key_pem, cert_pem) = on_any(endpoints, |endpoint| async move {
        let (ca_pem, trust) = pinned_trust(&endpoint, token, &files.dir).await?;
        let (key_pem, cert_pem) = node_certificate(&endpoint, &trust, Some(token), name).await?;
        Ok((ca_pem, key_pem, cert_pem))
    })
    .await?;
    files.write(&ca_pem, &key_pem, &cert_pem)?;
    let _ = std::fs::remove_file(files.dir.join(PINNED_CA));
    tracing::info!(node = name, token = %token.id, "joined the cluster: the node has its own certificate");
    Ok(files.client_files())
}

/// Where a master keeps what it joined with (`DATA_DIR/pki`): the
/// cluster's `ca.crt` and `ca.key`, its own `server.crt`/`server.key`
/// (client and HTTPS ports) and `peer.crt`/`peer.key`, and, when the
/// cluster has them, `sa.key` and `encryption-config.yaml`.
#[derive(Clone, Debug)]
pub struct MasterFiles {
    pub dir: PathBuf,
}

impl MasterFiles {
    pub fn new(dir: &Path) -> MasterFiles {
        MasterFiles { dir: dir.to_path_buf() }
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    pub fn ca_key(&self) -> PathBuf {
        self.dir.join("ca.key")
    }

    /// The serving certificate and key.
    pub fn server(&self) -> (PathBuf, PathBuf) {
        (self.dir.join("server.crt"), self.dir.join("server.key"))
    }

    /// The peer certificate and key.
    pub fn peer(&self) -> (PathBuf, PathBuf) {
        (self.dir.join("peer.crt"), self.dir.join("peer.key"))
    }

    /// The service account signing key, if the cluster has one.
    pub fn service_account_key(&self) -> Option<PathBuf> {
        Some(self.dir.join("sa.key")).filter(|p| p.exists())
    }

    /// The encryption at rest configuration, if the cluster has one.
    pub fn encryption_config(&self) -> Option<PathBuf> {
        Some(self.dir.join("encryption-config.yaml")).filter(|p| p.exists())
    }

    /// Whether a join left every file a master needs here. They are
    /// written with the peer certificate last, so a join cut short is
    /// done again rather than half used.
    pub fn complete(&self) -> bool {
        let (server, server_key) = self.server();
        let (peer, peer_key) = self.peer();
        [self.ca(), self.ca_key(), server, server_key, peer, peer_key].iter().all(|p| p.exists())
    }

    /// Writes what a join handed over, the peer certificate last.
    fn write(
        &self,
        issued: &skiff_proto::bootstrap::MasterCredentialsResponse,
        keys: &MasterKeys,
    ) -> Result<(), skiff_pki::PkiError> {
        for (name, text) in
            [("sa.key", &issued.service_account_key_pem), ("encryption-config.yaml", &issued.encryption_config)]
        {
            if !text.is_empty() {
                skiff_pki::write_private(&self.dir.join(name), text)?;
            }
        }
        let pair = |cert: &str, key: &str| skiff_pki::Issued { cert_pem: cert.to_string(), key_pem: key.to_string() };
        pair(&issued.ca_pem, &issued.ca_key_pem).write(&self.dir, "ca")?;
        pair(&issued.server_cert_pem, &keys.server).write(&self.dir, "server")?;
        pair(&issued.peer_cert_pem, &keys.peer).write(&self.dir, "peer")
    }
}

/// The private keys a joining master made, for the certificates it asks for.
struct MasterKeys {
    server: String,
    peer: String,
}

/// A master's credentials from `endpoint`, verified against `trust` and
/// authenticated with `token`.
async fn master_certificates(
    endpoint: &str,
    trust: &ClientFiles,
    token: &JoinToken,
    name: &str,
    names: &[String],
) -> Result<(skiff_proto::bootstrap::MasterCredentialsResponse, MasterKeys), JoinError> {
    let config = skiff_pki::transport::client_config(trust).map_err(JoinError::Files)?;
    let mut client = BootstrapClient::new(channel(endpoint, Connector::new(Arc::new(config))).await?);
    let (server_key, server_csr_pem) = skiff_pki::signing_request(name).map_err(JoinError::Files)?;
    let (peer_key, peer_csr_pem) = skiff_pki::signing_request(name).map_err(JoinError::Files)?;
    let mut request = tonic::Request::new(MasterCredentialsRequest {
        member_name: name.to_string(),
        names: names.to_vec(),
        server_csr_pem,
        peer_csr_pem,
    });
    with_bearer(&mut request, token);
    let issued = client.master_credentials(request).await.map_err(|s| refused(endpoint, s))?.into_inner();
    // What the verified connection handed on must be the CA it pinned.
    token.check_pin(&issued.ca_pem).map_err(JoinError::Pin)?;
    Ok((issued, MasterKeys { server: server_key, peer: peer_key }))
}

/// What master `name` serves with, in `files`: what an earlier join kept
/// there (if `token`, when given, pins its CA), else new credentials for
/// `token` from the first of `endpoints` that hands them out, with
/// certificates naming `names`. Returns whether they were kept ones.
pub async fn master_credentials(
    endpoints: &[String],
    token: Option<&JoinToken>,
    name: &str,
    names: &[String],
    files: &MasterFiles,
) -> Result<bool, JoinError> {
    if files.complete() {
        let ca = std::fs::read_to_string(files.ca())
            .map_err(|source| JoinError::Files(skiff_pki::PkiError::Io { path: files.ca(), source }))?;
        if let Some(token) = token {
            token.check_pin(&ca).map_err(JoinError::Pin)?;
        }
        return Ok(true);
    }
    let Some(token) = token else {
        return Err(JoinError::Files(skiff_pki::PkiError::Invalid {
            what: files.dir.display().to_string(),
            message: "holds no complete set of a master's credentials, and no --token was given to get one".into(),
        }));
    };
    let (issued, keys) = on_any(endpoints, |endpoint| async move {
        let (_, trust) = pinned_trust(&endpoint, token, &files.dir).await?;
        master_certificates(&endpoint, &trust, token, name, names).await
    })
    .await?;
    files.write(&issued, &keys).map_err(JoinError::Files)?;
    let _ = std::fs::remove_file(files.dir.join(PINNED_CA));
    tracing::info!(member = name, token = %token.id, "the cluster handed this master its credentials");
    Ok(false)
}
