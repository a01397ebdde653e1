//! `skiff`: the server binary. Subcommands run one process role each;
//! `skiff server` runs a whole master host, `skiff up` a local cluster.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory, Parser, Subcommand};
use skiff::parse_duration;
use skiff_apiserver::ApiserverConfig;
use skiff_raft_store::StoreConfig;
use skiff_shutdown::Shutdown;

/// A write allocates and frees a few dozen small buffers on every member
/// (decoded entries, MVCC records, events, gRPC frames), from many threads;
/// glibc's malloc spent about a fifth of each member's CPU on them (perf,
/// 256 clients). mimalloc cut the members' CPU per write by about 8% there
/// (10 alternating runs, 9 in its favour). It holds on to more memory: after
/// 50,000 pod creates the leader's resident memory had grown 45% more than
/// with glibc's (`make bench-objects`, bench/README.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "skiff", version, about = "Skiff: a Kubernetes-style control plane whose apiservers are the database")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one master replica: Raft member, MVCC store and APIs.
    Apiserver(Box<ApiserverArgs>),
    /// Run the controllers (leader-elected) against the apiservers.
    ControllerManager(Box<skiff::controller_manager::ControllerManagerArgs>),
    /// Schedule pods onto nodes (leader-elected) through the apiservers.
    Scheduler(Box<skiff::scheduler::SchedulerArgs>),
    /// Run a whole master host in one process: the apiserver, a controller
    /// manager and a scheduler.
    Server(Box<ServerArgs>),
    /// Join this host as a worker node: register it and run the pods bound
    /// to it in containers (a private containerd by default).
    Node(Box<skiff::node::NodeArgs>),
    /// Run the service proxy alone (`skiff node` runs it already), or
    /// `--cleanup` its rules.
    Proxy(Box<skiff::node::ProxyArgs>),
    /// Run a local cluster of masters on loopback in the foreground (Ctrl-C stops it).
    Up(skiff::up::UpArgs),
}

/// `skiff server`: the apiserver's flags, which a YAML file may also set.
#[derive(Args)]
#[command(args_override_self = true)]
struct ServerArgs {
    /// YAML file of settings keyed by long flag name (`data-dir: /var/lib/skiff`);
    /// flags on the command line override it [default: /etc/skiff/config.yaml if it exists]
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(flatten)]
    apiserver: ApiserverArgs,
    /// Run no controller manager in this process.
    #[arg(long)]
    disable_controller_manager: bool,
    #[command(flatten)]
    controllers: skiff::controller_manager::ControllerFlags,
    /// Run no scheduler in this process.
    #[arg(long)]
    disable_scheduler: bool,
    #[command(flatten)]
    scheduler: skiff::scheduler::SchedulerFlags,
}

#[derive(Args)]
struct ApiserverArgs {
    /// This member's Raft id (a positive integer, unique in the cluster).
    #[arg(long)]
    id: u64,
    /// Human-readable member name (default: member-ID).
    #[arg(long)]
    name: Option<String>,
    /// Where the Raft log and the state machine live.
    #[arg(long)]
    data_dir: PathBuf,
    /// Raft and forwarding listener.
    #[arg(long, default_value = "127.0.0.1:2380")]
    peer_listen: String,
    /// Address other members reach this one at (default: --peer-listen).
    #[arg(long)]
    advertise_peer: Option<String>,
    /// etcd-compatible gRPC listener.
    #[arg(long, default_value = "127.0.0.1:2379")]
    client_listen: String,
    /// HTTP listener: the Kubernetes REST API (kubectl), /healthz, /readyz, /metrics.
    #[arg(long, default_value = "127.0.0.1:6443")]
    http_listen: String,
    /// Founding members of a new cluster: `1=HOST:PEERPORT,2=HOST:PEERPORT,...`.
    #[arg(long, value_parser = parse_initial_cluster, conflicts_with = "join")]
    initial_cluster: Option<BTreeMap<u64, String>>,
    /// Join a running cluster through this member's client address.
    #[arg(long)]
    join: Option<String>,
    /// Join with a join-master token (`skiffctl token create --usages
    /// join-master`: K10<CA hash>::<id>.<secret>): check the cluster's CA
    /// against its hash, then trade the token for this master's serving
    /// and peer certificates and the keys every master shares, kept under
    /// DATA_DIR/pki and used again on restart (with or without --token).
    /// Takes the place of the TLS, signing, service account and encryption
    /// flags.
    #[arg(long, requires = "join", value_parser = skiff::node::parse_token, conflicts_with_all = [
        "tls_cert_file", "client_ca_file", "cert_file", "trusted_ca_file", "peer_cert_file",
        "cluster_signing_cert_file", "service_account_signing_key_file", "encryption_provider_config",
    ])]
    token: Option<skiff_pki::token::JoinToken>,
    /// Another name (DNS name or IP address) for the certificates a join
    /// with --token gets, beside the listen addresses (k3s's --tls-san).
    #[arg(long = "tls-san", requires = "token", value_delimiter = ',')]
    tls_san: Vec<String>,
    /// How long --join waits to be caught up and promoted.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    join_timeout: Duration,
    /// Raft heartbeat interval (e.g. 100ms).
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    heartbeat_interval: Duration,
    /// Lower bound of the randomized election timeout.
    #[arg(long, default_value = "200ms", value_parser = parse_duration)]
    election_timeout_min: Duration,
    /// Upper bound of the randomized election timeout (at least 2x the lower bound).
    #[arg(long, default_value = "400ms", value_parser = parse_duration)]
    election_timeout_max: Duration,
    /// Take a snapshot and purge the log after this many entries, or after
    /// 64 MiB of entries (or the database's size, if larger), whichever comes
    /// first (member N waits (N mod 8)/16 longer, so that members do not all
    /// snapshot at once).
    #[arg(long, default_value_t = 100_000)]
    snapshot_count: u64,
    /// Interval of progress notifications to watchers that ask for them.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    watch_progress_interval: Duration,
    /// Interval of bookmarks to resource watchers that allow them.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    watch_bookmark_interval: Duration,
    /// Automatic compaction: keep this many revisions (`10000`), or this
    /// long (`24h`); `0` keeps everything until a client compacts.
    #[arg(long, default_value = "0")]
    history_retention: skiff_raft_store::store::Retention,
    /// Refuse writes that add data while the database is larger than this
    /// many bytes (etcd's NOSPACE alarm).
    #[arg(long, default_value_t = 8 * 1024 * 1024 * 1024)]
    quota_backend_bytes: u64,
    /// Found the new cluster on this backup (from `etcdctl snapshot save`):
    /// every founding member is started with the same file.
    #[arg(long, requires = "initial_cluster")]
    restore_from: Option<PathBuf>,
    /// How long a write may take, across leader changes, before it fails.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    request_timeout: Duration,
    /// Seconds an etcd auth token lives unused (etcd's `--auth-token-ttl`).
    #[arg(long, default_value_t = 300)]
    auth_token_ttl: u64,
    /// Serve the HTTP listener over TLS with this certificate (PEM; `skiffctl
    /// certs server` issues one).
    #[arg(long, requires = "tls_private_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// The private key of --tls-cert-file (PEM).
    #[arg(long, requires = "tls_cert_file")]
    tls_private_key_file: Option<PathBuf>,
    /// Accept client certificates this CA signed (PEM) on the HTTPS
    /// listener: the common name is the user, each organization a group.
    /// With it or --token-auth-file, requests with no credentials get 401
    /// (except /healthz, /livez, /readyz and /version).
    #[arg(long, requires = "tls_cert_file")]
    client_ca_file: Option<PathBuf>,
    /// Serve the gRPC client listener (the etcd API and the resource API the
    /// components use) over TLS with this certificate (PEM; etcd's
    /// --cert-file).
    #[arg(long, requires = "key_file")]
    cert_file: Option<PathBuf>,
    /// The private key of --cert-file (PEM).
    #[arg(long, requires = "cert_file")]
    key_file: Option<PathBuf>,
    /// Check client certificates of this CA on the client listener: then
    /// the etcd API is for system:masters only, a join for members too, and
    /// the resource API authenticates every call (certificate or bearer
    /// token) and authorizes it as the HTTP listener does.
    #[arg(long, requires = "cert_file")]
    trusted_ca_file: Option<PathBuf>,
    /// Mutual TLS between Raft peers: this member's peer certificate (PEM,
    /// `skiffctl certs peer`), served on the peer listener and presented to
    /// the other members and, when joining, to the cluster's client port.
    #[arg(long, requires_all = ["peer_key_file", "peer_trusted_ca_file"])]
    peer_cert_file: Option<PathBuf>,
    /// The private key of --peer-cert-file (PEM).
    #[arg(long, requires = "peer_cert_file")]
    peer_key_file: Option<PathBuf>,
    /// The CA peers' certificates must chain to; a connection without a
    /// peer certificate of it is refused before any Raft message is read.
    #[arg(long, requires = "peer_cert_file")]
    peer_trusted_ca_file: Option<PathBuf>,
    /// Sign joining nodes' certificates with this CA (PEM; the cluster CA,
    /// the one --trusted-ca-file names), so `skiff node --token` works
    /// against this member.
    #[arg(long, requires_all = ["cluster_signing_key_file", "trusted_ca_file"])]
    cluster_signing_cert_file: Option<PathBuf>,
    /// The private key of --cluster-signing-cert-file (PEM).
    #[arg(long, requires = "cluster_signing_cert_file")]
    cluster_signing_key_file: Option<PathBuf>,
    /// Bearer tokens, one `token,user,uid[,"group1,group2"]` line each
    /// (kube-apiserver's --token-auth-file).
    #[arg(long)]
    token_auth_file: Option<PathBuf>,
    /// Who decides what authenticated users may do: `RBAC` (roles and
    /// bindings; `system:masters` may do anything; nodes are judged by
    /// the Node authorizer first, so `Node,RBAC` means the same) or
    /// `AlwaysAllow`.
    /// Defaults to RBAC when --client-ca-file or --token-auth-file is
    /// given, else AlwaysAllow (everyone is anonymous then).
    #[arg(long, value_parser = parse_authorization_mode)]
    authorization_mode: Option<skiff_apiserver::config::Authorization>,
    /// Append an audit event (JSON, audit.k8s.io/v1) per request on the
    /// HTTP listener to this file.
    #[arg(long)]
    audit_log_path: Option<PathBuf>,
    /// What to log at which level (a Kubernetes audit Policy, YAML);
    /// without it, every request at Metadata.
    #[arg(long, requires = "audit_log_path")]
    audit_policy_file: Option<PathBuf>,
    /// Requests one user may have in flight on this member's HTTP listener
    /// before more wait, then get 429 (watches and streams, and
    /// system:masters, are exempt); 0: no limit. Applies only with
    /// authentication on (without it everyone is the same anonymous user).
    #[arg(long, default_value_t = 64)]
    max_requests_inflight_per_user: usize,
    /// Encrypt resources at rest (a Kubernetes EncryptionConfiguration,
    /// YAML, with aesgcm and identity providers). Every master of a
    /// cluster must be given the same keys.
    #[arg(long, value_name = "FILE")]
    encryption_provider_config: Option<PathBuf>,
    /// Issue service account tokens (`kubectl create token`) signed with
    /// this ECDSA P-256 key (PEM, PKCS#8), and accept them as bearer
    /// tokens. Every master must be given the same key.
    #[arg(long, value_name = "FILE")]
    service_account_signing_key_file: Option<PathBuf>,
    /// The `iss` of the tokens issued, and the audience they must name.
    #[arg(long, default_value = skiff_apiserver::service_account::DEFAULT_ISSUER)]
    service_account_issuer: String,
}

fn parse_authorization_mode(s: &str) -> Result<skiff_apiserver::config::Authorization, String> {
    use skiff_apiserver::config::Authorization;
    match s {
        "RBAC" | "Node,RBAC" => Ok(Authorization::Rbac),
        "AlwaysAllow" => Ok(Authorization::AlwaysAllow),
        other => Err(format!("unknown authorization mode {other:?}: expected RBAC or AlwaysAllow")),
    }
}

fn parse_initial_cluster(s: &str) -> Result<BTreeMap<u64, String>, String> {
    let mut out = BTreeMap::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (id, addr) = part.split_once('=').ok_or_else(|| format!("{part:?} is not ID=HOST:PORT"))?;
        let id: u64 = id.trim().parse().map_err(|_| format!("member id {id:?} is not a positive integer"))?;
        if id == 0 {
            return Err("member id 0 is reserved".into());
        }
        let addr = addr.trim().trim_start_matches("http://").to_string();
        if !addr.contains(':') {
            return Err(format!("peer address {addr:?} needs a port"));
        }
        if out.insert(id, addr).is_some() {
            return Err(format!("member id {id} appears twice"));
        }
    }
    if out.is_empty() {
        return Err("no members given".into());
    }
    Ok(out)
}

/// The host of `HOST:PORT` (`[::1]:PORT` too), unless it is every
/// address (which no certificate can name).
fn certificate_name(addr: &str) -> Option<String> {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) if ip.is_unspecified() => None,
        _ if host.is_empty() => None,
        _ => Some(host.to_string()),
    }
}

impl ApiserverArgs {
    /// With `--token`, or with a complete set of credentials an earlier
    /// join with a token kept under DATA_DIR/pki and no TLS flags: the
    /// credentials the cluster hands a joining master (fetched once, then
    /// kept), in place of the TLS, signing, service account and
    /// encryption flags. Otherwise nothing changes.
    async fn credentials_from_token(&mut self) -> Result<(), String> {
        let files =
            skiff_client::join::MasterFiles::new(&self.data_dir.join(skiff_raft_store::store::identity::PKI_DIR));
        let flags_given = self.cert_file.is_some() || self.tls_cert_file.is_some() || self.peer_cert_file.is_some();
        if self.token.is_none() && (flags_given || !files.complete()) {
            return Ok(());
        }
        let name = self.name.clone().unwrap_or_else(|| format!("member-{}", self.id));
        let mut names: Vec<String> = Vec::new();
        let listens =
            [self.advertise_peer.as_ref().unwrap_or(&self.peer_listen), &self.client_listen, &self.http_listen];
        for name in listens.into_iter().filter_map(|a| certificate_name(a)).chain(self.tls_san.iter().cloned()) {
            if !names.contains(&name) {
                names.push(name);
            }
        }
        let endpoints: Vec<String> = self.join.iter().cloned().collect();
        let kept = skiff_client::join::master_credentials(&endpoints, self.token.as_ref(), &name, &names, &files)
            .await
            .map_err(|e| format!("joining with the token: {e}"))?;
        if kept {
            tracing::info!(dir = %files.dir.display(), "using the credentials this master was handed when it joined");
        }
        let ca = files.ca();
        let (server, server_key) = files.server();
        let (peer, peer_key) = files.peer();
        self.tls_cert_file = Some(server.clone());
        self.tls_private_key_file = Some(server_key.clone());
        self.client_ca_file = Some(ca.clone());
        self.cert_file = Some(server);
        self.key_file = Some(server_key);
        self.trusted_ca_file = Some(ca.clone());
        self.peer_cert_file = Some(peer);
        self.peer_key_file = Some(peer_key);
        self.peer_trusted_ca_file = Some(ca.clone());
        self.cluster_signing_cert_file = Some(ca);
        self.cluster_signing_key_file = Some(files.ca_key());
        self.service_account_signing_key_file = files.service_account_key();
        self.encryption_provider_config = files.encryption_config();
        Ok(())
    }

    fn into_config(self) -> Result<ApiserverConfig, String> {
        if self.id == 0 {
            return Err("--id must be a positive integer".into());
        }
        let peer_addr = self.advertise_peer.unwrap_or_else(|| self.peer_listen.clone());
        let client_certificates = self.client_ca_file.is_some() || self.trusted_ca_file.is_some();
        let authenticated = client_certificates || self.token_auth_file.is_some();
        let mut store = StoreConfig::new(self.id, self.data_dir, peer_addr);
        store.name = self.name.unwrap_or_else(|| format!("member-{}", self.id));
        let scheme = if self.cert_file.is_some() { "https" } else { "http" };
        store.client_urls = vec![format!("{scheme}://{}", self.client_listen)];
        store.initial_cluster = self.initial_cluster.unwrap_or_default();
        store.join = self.join;
        store.join_timeout = self.join_timeout;
        store.heartbeat = self.heartbeat_interval;
        store.election_timeout_min = self.election_timeout_min;
        store.election_timeout_max = self.election_timeout_max;
        store.snapshot_logs = self.snapshot_count;
        store.request_timeout = self.request_timeout;
        store.history_retention = self.history_retention;
        store.quota_backend_bytes = self.quota_backend_bytes;
        store.restore_from = self.restore_from;
        store.auth_token_ttl = Duration::from_secs(self.auth_token_ttl);
        Ok(ApiserverConfig {
            store,
            peer_listen: self.peer_listen,
            client_listen: self.client_listen,
            http_listen: self.http_listen,
            http_tls: self.tls_cert_file.map(|cert| skiff_pki::ServerFiles {
                cert,
                key: self.tls_private_key_file.expect("clap requires the key with the certificate"),
                client_ca: self.client_ca_file.clone(),
            }),
            client_tls: self.cert_file.map(|cert| skiff_pki::ServerFiles {
                cert,
                key: self.key_file.expect("clap requires the key with the certificate"),
                client_ca: self.trusted_ca_file,
            }),
            peer_tls: self.peer_cert_file.map(|cert| skiff_pki::ServerFiles {
                cert,
                key: self.peer_key_file.expect("clap requires the key with the certificate"),
                client_ca: self.peer_trusted_ca_file,
            }),
            cluster_signing: self.cluster_signing_cert_file.map(|cert| skiff_apiserver::config::SigningFiles {
                cert,
                key: self.cluster_signing_key_file.expect("clap requires the key with the certificate"),
            }),
            encryption_provider_config: self.encryption_provider_config,
            service_account: self.service_account_signing_key_file.map(|signing_key_file| {
                skiff_apiserver::service_account::ServiceAccountConfig {
                    signing_key_file,
                    issuer: self.service_account_issuer,
                }
            }),
            audit: self
                .audit_log_path
                .map(|path| skiff_apiserver::audit::AuditConfig { path, policy_file: self.audit_policy_file }),
            fairness: (authenticated && self.max_requests_inflight_per_user > 0).then(|| {
                skiff_apiserver::fairness::Limits {
                    per_user: self.max_requests_inflight_per_user,
                    ..Default::default()
                }
            }),
            authorization: self.authorization_mode.unwrap_or(if authenticated {
                skiff_apiserver::config::Authorization::Rbac
            } else {
                skiff_apiserver::config::Authorization::AlwaysAllow
            }),
            authentication: skiff_apiserver::config::Authentication {
                client_certificates,
                token_auth_file: self.token_auth_file,
            },
            watch_progress_interval: self.watch_progress_interval,
            watch_bookmark_interval: self.watch_bookmark_interval,
        })
    }
}

/// The process's one shutdown, cancelled by SIGINT, SIGTERM or SIGHUP.
fn shutdown_on_signals() -> Result<Shutdown, String> {
    let shutdown = Shutdown::new();
    skiff_shutdown::signals::cancel_on_signals(&shutdown)
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let logged = shutdown.clone();
    tokio::spawn(async move {
        logged.cancelled().await;
        tracing::info!("shutting down");
    });
    Ok(shutdown)
}

/// Turns transparent huge pages off for this process (the control-plane
/// roles). mimalloc asks for them on its segments, and the kernel then
/// zeroes 2 MiB at each first touch, again after every purge hands memory
/// back, and with THP defrag "madvise" (the common default) may compact
/// memory first, in the faulting thread. Measured with `skiff-bench
/// objects` (30,000 pods, two alternating runs each): with them the first
/// linearizable LIST after the creates took 1,083-1,273 ms, creates ran at
/// 3,990-4,783 pods/s with a worst create of up to 440 ms, and the leader
/// kept 77-85 MiB per 10,000 pods; without them 376-389 ms, 4,430-4,645
/// pods/s, 45 ms and 57-59 MiB. In the scheduler, zeroing huge pages was
/// 19% of its CPU (perf). The flag is inherited, so `skiff node` (whose
/// containers keep the host's policy) and `skiff up` do not set it.
fn without_huge_pages() {
    if let Err(e) = rustix::thread::disable_transparent_huge_pages(true) {
        tracing::warn!("cannot turn transparent huge pages off: {e}");
    }
}

fn main() -> ExitCode {
    // First: a process started by `skiff up` ends with it, even with one
    // killed by SIGKILL (and does not start if it is already gone).
    if let Err(e) = skiff::up::end_with_parent() {
        eprintln!("skiff: {e}");
        return ExitCode::FAILURE;
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,openraft=warn,h2=warn,tower=warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let command = Cli::command();
    let server = command.find_subcommand("server").expect("`server` is a subcommand");
    let cli = match skiff::server::argv_with_config(std::env::args_os().collect(), server) {
        Ok(argv) => Cli::parse_from(argv),
        Err(e) => {
            eprintln!("skiff: {e}");
            return ExitCode::from(2);
        }
    };
    if !matches!(cli.command, Command::Node(_) | Command::Proxy(_) | Command::Up(_)) {
        without_huge_pages();
    }
    let runtime = tokio::runtime::Runtime::new().expect("cannot start the tokio runtime");
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Apiserver(args) => {
                let mut args = *args;
                args.credentials_from_token().await?;
                let config = args.into_config()?;
                skiff_apiserver::run(config, shutdown_on_signals()?).await.map_err(|e| e.to_string())
            }
            Command::ControllerManager(args) => {
                let config = (*args).into_config()?;
                skiff_controllers::run(config, shutdown_on_signals()?).await.map_err(|e| e.to_string())
            }
            Command::Scheduler(args) => {
                let config = (*args).into_config()?;
                skiff_scheduler::run(config, shutdown_on_signals()?).await.map_err(|e| e.to_string())
            }
            Command::Server(args) => {
                let mut args = *args;
                args.apiserver.credentials_from_token().await?;
                let mut apiserver = args.apiserver.into_config()?;
                // As k3s's server, it signs joining nodes' certificates with
                // the CA beside --trusted-ca-file when that CA's key is there.
                if apiserver.cluster_signing.is_none() {
                    apiserver.cluster_signing = skiff::server::signing_beside(apiserver.client_tls.as_ref());
                }
                // Its own apiserver; the process is one failure domain.
                // (Through loopback when it listens on every address.)
                let own = &apiserver.client_listen;
                let servers = vec![match own.strip_prefix("0.0.0.0:") {
                    Some(port) => format!("127.0.0.1:{port}"),
                    None => own.clone(),
                }];
                let components = !(args.disable_scheduler && args.disable_controller_manager);
                let tls = match &apiserver.client_tls {
                    Some(files) if components => Some(skiff::server::component_credentials(files, &apiserver.store)?),
                    _ => None,
                };
                let identity = format!("{}_{}", skiff::controller_manager::default_identity(), apiserver.store.name);
                // One set of --leader-elect* flags for both components.
                let election = args.controllers.leader_election(&identity);
                let scheduler = match args.disable_scheduler {
                    true => None,
                    false => {
                        let mut config = args.scheduler.into_config(servers.clone(), identity.clone(), election)?;
                        config.tls = tls.as_ref().map(|t| t.scheduler.clone());
                        Some(config)
                    }
                };
                let controllers = match args.disable_controller_manager {
                    true => None,
                    false => {
                        let mut config = args.controllers.into_config(servers, identity)?;
                        config.tls = tls.map(|t| t.controller_manager);
                        Some(config)
                    }
                };
                skiff::server::run(apiserver, controllers, scheduler, shutdown_on_signals()?)
                    .await
                    .map_err(|e| e.to_string())
            }
            Command::Node(args) => {
                let options = (*args).into_options()?;
                skiff_node::process::run(options, shutdown_on_signals()?).await.map_err(|e| e.to_string())
            }
            Command::Proxy(args) => (*args).run(shutdown_on_signals()?).await,
            Command::Up(args) => skiff::up::run(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("skiff: {e}");
            ExitCode::FAILURE
        }
    }
}
