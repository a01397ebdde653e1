//! The `skiff apiserver` process: one master replica.
//!
//! # Layout
//! - [`config`]: the process configuration (what the flags fill in).
//! - [`grpc`]: the gRPC resource API, translating to the registry.
//! - [`admission`]: authentication, authorization and admission layers.
//! - [`registry`]: Kubernetes semantics (validation, defaulting,
//!   optimistic concurrency, finalizers, history) on the object store.
//! - [`priority`]: priority admission (a pod's priority from its
//!   PriorityClass), the registry's step that reads other objects;
//!   `limits` is LimitRanger, another such step.
//! - [`crds`]: the resources CustomResourceDefinitions add, as this
//!   member knows them.
//! - [`strategy`]: per-kind rules the registry asks at fixed points of a
//!   write (one file per kind with rules of its own).
//! - [`allocator`]: Service cluster IPs and node ports.
//! - [`watch`]: one decoded event stream per resource, fanned out to
//!   filtered watchers.
//! - [`storage`]: objects as JSON on the raft store, encrypted at rest as
//!   [`encryption`] says.
//! - [`rest`]: the Kubernetes REST API for kubectl, discovery and OpenAPI.
//! - [`http`]: the HTTP listener: health, readiness and Prometheus metrics,
//!   behind authentication; `https` serves it over TLS.
//! - [`metrics`]: request and watcher metrics.
//! - [`run`]: opens the store, serves the peer, client and HTTP listeners,
//!   bootstraps or rejoins the cluster, and stops cleanly when its
//!   [`Shutdown`] is cancelled, waiting for every task it started.

// tonic's `Status` is the framework's own error type; boxing it at every
// call would only add noise.
#![allow(clippy::result_large_err)]

pub mod admission;
pub mod allocator;
pub mod audit;
pub mod bootstrap;
pub mod config;
pub mod crds;
pub mod encryption;
pub mod fairness;
pub mod grpc;
pub mod http;
mod https;
mod limits;
pub mod metrics;
pub mod node_authorizer;
pub mod node_restriction;
mod pod_security;
pub mod priority;
mod quota;
pub mod rbac;
pub mod registry;
pub mod request_info;
pub mod rest;
mod serve;
pub mod service_account;
mod service_account_admission;
pub mod storage;
pub mod strategy;
mod tls;
pub mod watch;

use std::net::SocketAddr;
use std::sync::Arc;

use skiff_raft_store::etcd::{
    auth::AuthService, cluster::ClusterService, control::ControlService, election::ElectionService, kv::KvService,
    lease::LeaseService, lock::LockService,
};
use skiff_raft_store::etcd::{maintenance::MaintenanceService, watch::WatchService};
use skiff_raft_store::peer::PeerService;
use skiff_raft_store::Store;
use skiff_shutdown::Shutdown;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use config::ApiserverConfig;

/// Why the apiserver stopped with an error. One line each.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },
    #[error(transparent)]
    Start(#[from] skiff_raft_store::store::StartError),
    #[error("the {listener} listener's TLS: {source}")]
    Tls { listener: &'static str, source: skiff_pki::PkiError },
    #[error("authentication: {0}")]
    Authentication(String),
    #[error("--cluster-signing-cert-file, --cluster-signing-key-file: {0}")]
    Signing(skiff_pki::PkiError),
    #[error("the audit log: {0}")]
    Audit(String),
    #[error("--encryption-provider-config: {0}")]
    Encryption(String),
    #[error("the {listener} listener failed: {source}")]
    Serve {
        listener: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("the {listener} listener's task panicked or was cancelled: {source}")]
    Task {
        listener: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}

/// What a listener's server future returns, as a [`RunError::Serve`].
fn failed<E>(listener: &'static str) -> impl FnOnce(E) -> RunError
where
    E: std::error::Error + Send + Sync + 'static,
{
    move |e| RunError::Serve { listener, source: Box::new(e) }
}

/// Accepted connections with Nagle's algorithm off: gRPC's small
/// request/response frames otherwise wait out delayed ACKs (~40 ms).
fn incoming(listener: TcpListener) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(|stream| {
        let stream = stream?;
        stream.set_nodelay(true)?;
        Ok(stream)
    })
}

async fn bind(addr: &str) -> Result<TcpListener, RunError> {
    TcpListener::bind(addr).await.map_err(|source| RunError::Listen { addr: addr.to_string(), source })
}

/// The TLS configurations of a member's listeners, each following its
/// files, and what its peer and join connections dial with.
struct Tls {
    http: Option<tls::Current>,
    client: Option<serve::ClientTls>,
    peer: Option<tls::Current>,
    /// Presents this member's peer certificate and trusts the peers' CA.
    peer_client: Option<skiff_pki::Connector>,
}

impl Tls {
    fn load(config: &ApiserverConfig, shutdown: &Shutdown) -> Result<Tls, RunError> {
        let follow = |listener: &'static str, files: &Option<skiff_pki::ServerFiles>, load| {
            let current = files.clone().map(|files| tls::follow(files, load, shutdown)).transpose();
            current.map_err(|source| RunError::Tls { listener, source })
        };
        let client = follow("client", &config.client_tls, skiff_pki::server_config)?.map(|current| serve::ClientTls {
            current,
            client_certificates: config.client_tls.as_ref().is_some_and(|f| f.client_ca.is_some()),
        });
        // The member's own peer certificate, presented when it dials its
        // peers, follows its files as the listener's does (and fails here,
        // on the first load, without --peer-trusted-ca-file).
        let peer_client = match &config.peer_tls {
            Some(files) => {
                let configs = tls::follow(files.clone(), peer_client_config, shutdown)
                    .map_err(|source| RunError::Tls { listener: "peer", source })?;
                Some(skiff_pki::Connector::following(configs))
            }
            None => None,
        };
        Ok(Tls {
            http: follow("HTTP", &config.http_tls, skiff_pki::server_config)?,
            client,
            peer: follow("peer", &config.peer_tls, skiff_pki::transport::peer_server_config)?,
            peer_client,
        })
    }
}

/// What a member dials its peers with: its peer certificate, trusting the
/// peers' CA.
fn peer_client_config(files: &skiff_pki::ServerFiles) -> Result<rustls::ClientConfig, skiff_pki::PkiError> {
    let ca = files.client_ca.clone().ok_or_else(|| skiff_pki::PkiError::Invalid {
        what: "mutual TLS".into(),
        message: "needs --peer-trusted-ca-file".into(),
    })?;
    skiff_pki::transport::client_config(&skiff_pki::ClientFiles {
        ca,
        cert: Some((files.cert.clone(), files.key.clone())),
    })
}

/// Listeners bound before anything else starts, so bad addresses fail fast.
pub struct Listeners {
    pub peer: TcpListener,
    pub client: TcpListener,
    pub http: TcpListener,
}

impl Listeners {
    pub async fn bind(config: &ApiserverConfig) -> Result<Listeners, RunError> {
        Ok(Listeners {
            peer: bind(&config.peer_listen).await?,
            client: bind(&config.client_listen).await?,
            http: bind(&config.http_listen).await?,
        })
    }

    pub fn addrs(&self) -> (SocketAddr, SocketAddr, SocketAddr) {
        let a = |l: &TcpListener| l.local_addr().expect("bound listener has an address");
        (a(&self.peer), a(&self.client), a(&self.http))
    }
}

/// How long requests still in flight may delay a shutdown. Watches and lease
/// keep-alives do not wait for it: they end as soon as the member stops.
const GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// A running apiserver: its store and the tasks serving its listeners.
pub struct Running {
    pub store: Store,
    /// A child of the shutdown it was started under: cancelling that one
    /// stops this member too, and [`Running::stop`] stops it alone.
    shutdown: Shutdown,
    servers: Vec<(&'static str, JoinHandle<Result<(), RunError>>)>,
}

impl Running {
    /// Stops the listeners (giving open streams one short grace period,
    /// shared by all of them), then shuts Raft down and waits for every
    /// task the store started.
    pub async fn stop(self) -> Result<(), RunError> {
        self.store.begin_stop();
        self.shutdown.cancel();
        let mut result = Ok(());
        let deadline = tokio::time::Instant::now() + GRACE;
        for (listener, mut server) in self.servers {
            match tokio::time::timeout_at(deadline, &mut server).await {
                Ok(Ok(Err(e))) => result = Err(e),
                Ok(Err(source)) => result = Err(RunError::Task { listener, source }),
                Ok(Ok(Ok(()))) => {}
                // Streams still open after the grace period are cut.
                Err(_) => server.abort(),
            }
        }
        // Connections cut above end their tasks with them; what is left
        // (a namespace write in flight) ends within the same grace.
        if !self.shutdown.stop_within(GRACE).await {
            tracing::warn!("some apiserver tasks did not stop within {GRACE:?}");
        }
        self.store.shutdown().await;
        result
    }
}

/// Serves until `shutdown` is cancelled, then stops and waits for every
/// task it started.
pub async fn run(config: ApiserverConfig, shutdown: Shutdown) -> Result<(), RunError> {
    let security = admission::Security::for_config(&config.authentication).map_err(RunError::Authentication)?;
    let listeners = Listeners::bind(&config).await?;
    let running = start_under(config, listeners, security, &shutdown).await?;
    shutdown.cancelled().await;
    running.stop().await
}

/// Opens the store, starts serving on `listeners` and bootstraps, under a
/// shutdown of its own (in-process tests stop it with [`Running::stop`]).
pub async fn start(config: ApiserverConfig, listeners: Listeners) -> Result<Running, RunError> {
    start_with(config, listeners, admission::Security::default()).await
}

/// [`start`] with the given authentication, authorization and admission layers.
pub async fn start_with(
    config: ApiserverConfig,
    listeners: Listeners,
    security: admission::Security,
) -> Result<Running, RunError> {
    start_under(config, listeners, security, &Shutdown::new()).await
}

/// [`start_with`], stopped with `parent` as well as by [`Running::stop`].
pub async fn start_under(
    config: ApiserverConfig,
    listeners: Listeners,
    security: admission::Security,
    parent: &Shutdown,
) -> Result<Running, RunError> {
    let shutdown = parent.child();
    // Bad certificate files fail the start before the store opens.
    let tls = match Tls::load(&config, &shutdown) {
        Ok(tls) => tls,
        Err(e) => {
            shutdown.cancel();
            return Err(e);
        }
    };
    let mut store_config = config.store.clone();
    store_config.peer_tls = tls.peer_client.clone();
    store_config.join_tls = tls.peer_client.clone();
    let audit = match &config.audit {
        Some(audit) => Some(audit::AuditLog::open(audit, &shutdown).await.map_err(RunError::Audit)?),
        None => None,
    };
    let encryption = match &config.encryption_provider_config {
        Some(path) => encryption::Encryption::load(path).map_err(RunError::Encryption)?,
        None => encryption::Encryption::default(),
    };
    let signer = config
        .service_account
        .as_ref()
        .map(service_account::Signer::load)
        .transpose()
        .map_err(|e| RunError::Authentication(format!("--service-account-signing-key-file: {e}")))?;
    let cluster_signer = match &config.cluster_signing {
        Some(files) => Some(skiff_pki::Authority::from_files(&files.cert, &files.key).map_err(RunError::Signing)?),
        None => None,
    };
    let cluster_ca = match config.client_tls.as_ref().and_then(|t| t.client_ca.as_ref()) {
        Some(path) => Some(std::fs::read_to_string(path).map_err(|source| RunError::Tls {
            listener: "client",
            source: skiff_pki::PkiError::Io { path: path.clone(), source },
        })?),
        None => None,
    };
    let store = Store::open(store_config).await?;
    let objects = storage::ObjectStore::new(store.clone(), encryption);
    let fanout = watch::Fanout::new(objects.clone(), config.watch_bookmark_interval, shutdown.clone());
    let security = match config.authorization {
        config::Authorization::AlwaysAllow => security,
        // Node, then RBAC, as kube-apiserver's `--authorization-mode=Node,RBAC`.
        config::Authorization::Rbac => {
            let rbac = Arc::new(rbac::cache::Rbac::start(objects.clone(), &shutdown));
            let graph = node_authorizer::NodeGraph::start(objects.clone(), &shutdown);
            security.with_authorizer(Arc::new(node_authorizer::NodeAuthorizer::new(graph, rbac)))
        }
    };
    let security = match signer {
        Some(signer) => security.with_tokens(Arc::new(service_account::Tokens::new(signer, objects.clone()))),
        None => security,
    };
    let security = match &tls.client {
        Some(client) if client.client_certificates => security.with_secured_client_port(),
        _ => security,
    };
    let authenticated = config.authentication.client_certificates || config.authentication.token_auth_file.is_some();
    let security = if authenticated {
        security.with_bootstrap_tokens(Arc::new(bootstrap::BootstrapTokens::new(objects.clone())))
    } else {
        security
    };
    let registry = registry::Registry::new(objects, security, fanout);

    let peer = tonic::transport::Server::builder().add_service(PeerService::server(store.clone()));
    let peer: std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), tonic::transport::Error>> + Send>> =
        match tls.peer {
            Some(current) => Box::pin(peer.serve_with_incoming_shutdown(
                tls::peers(listeners.peer, current, shutdown.clone()),
                shutdown.cancelled_owned(),
            )),
            None => Box::pin(peer.serve_with_incoming_shutdown(incoming(listeners.peer), shutdown.cancelled_owned())),
        };
    let routes = tonic::service::Routes::new(KvService::server(store.clone()))
        .add_service(WatchService::server(store.clone(), config.watch_progress_interval))
        .add_service(LeaseService::server(store.clone()))
        .add_service(LockService::server(store.clone()))
        .add_service(ElectionService::server(store.clone()))
        .add_service(ClusterService::server(store.clone()))
        .add_service(MaintenanceService::server(store.clone()))
        .add_service(AuthService::server(store.clone()))
        .add_service(ControlService::server(store.clone()))
        .add_service(grpc::ResourceService::server(registry.clone(), audit.clone()))
        .add_service(bootstrap::BootstrapService::server(
            registry.security().clone(),
            cluster_ca,
            cluster_signer,
            bootstrap::SharedFiles {
                peer_ca: config.peer_tls.as_ref().and_then(|t| t.client_ca.clone()),
                signing_key: config.cluster_signing.as_ref().map(|s| s.key.clone()),
                service_account_key: config.service_account.as_ref().map(|s| s.signing_key_file.clone()),
                encryption_config: config.encryption_provider_config.clone(),
            },
        ));
    let client = serve::serve(listeners.client, routes, tls.client, audit.clone(), shutdown.clone());
    let address = listeners.http.local_addr().map(|a| a.to_string()).unwrap_or_default();
    let rest =
        axum::Router::new().fallback(rest::handle).with_state(rest::RestState { registry: registry.clone(), address });
    // Outermost first: authentication, the audit log, the fairness limits.
    let defaults = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut app = http::router(store.clone(), defaults.clone()).merge(rest);
    if let Some(limits) = config.fairness {
        let fairness = Arc::new(fairness::Fairness::new(limits));
        app = app.layer(axum::middleware::from_fn_with_state(fairness, fairness::limit));
    }
    if let Some(audit) = audit {
        app = app.layer(axum::middleware::from_fn_with_state(audit, audit::record));
    }
    let app = app.layer(axum::middleware::from_fn_with_state(registry.security().clone(), http::authenticate));
    let http: std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), RunError>> + Send>> = match tls.http {
        Some(current) => {
            let served = https::serve(listeners.http, app, current, shutdown.clone());
            Box::pin(async move {
                served.await;
                Ok(())
            })
        }
        None => {
            let app = app.into_make_service_with_connect_info::<SocketAddr>();
            let served = axum::serve(listeners.http, app).with_graceful_shutdown(shutdown.cancelled_owned());
            Box::pin(async move { served.await.map_err(failed("http")) })
        }
    };

    let servers = vec![
        ("peer", shutdown.spawn(async move { peer.await.map_err(failed("peer")) })),
        (
            "client",
            shutdown.spawn(async move {
                client.await;
                Ok(())
            }),
        ),
        ("http", shutdown.spawn(http)),
    ];
    let running = Running { store: store.clone(), shutdown: shutdown.clone(), servers };

    if let Err(e) = store.bootstrap().await {
        let _ = running.stop().await;
        if store.created_data_dir() {
            // Nothing of this refused member may pass for state later.
            let _ = std::fs::remove_dir_all(&config.store.data_dir);
        }
        return Err(e.into());
    }
    tracing::info!(id = store.id(), "member started");
    shutdown.spawn(ensure_defaults(registry, defaults, shutdown.clone()));
    Ok(running)
}

/// Creates the default namespaces, the system PriorityClasses and the
/// default roles and bindings once the
/// cluster can take writes; every master tries, the first write wins and
/// the others find them present. `done` is set then (`/readyz` waits
/// for it).
async fn ensure_defaults(registry: registry::Registry, done: Arc<std::sync::atomic::AtomicBool>, shutdown: Shutdown) {
    let mut delay = std::time::Duration::from_millis(200);
    loop {
        let attempt = tokio::select! {
            attempt = async {
                registry.ensure_default_namespaces().await?;
                registry.ensure_system_priority_classes().await?;
                registry.ensure_bootstrap_policy().await
            } => attempt,
            () = shutdown.cancelled() => return,
        };
        match attempt {
            Ok(()) => {
                done.store(true, std::sync::atomic::Ordering::Release);
                return;
            }
            Err(e) => tracing::debug!(error = %e, "default namespaces and priority classes not created yet"),
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            () = shutdown.cancelled() => return,
        }
        delay = (delay * 2).min(std::time::Duration::from_secs(5));
    }
}
