//! The apiserver's configuration.

use std::path::PathBuf;
use std::time::Duration;

use skiff_pki::ServerFiles;
use skiff_raft_store::StoreConfig;

/// Who the HTTP listener lets in.
#[derive(Clone, Debug, Default)]
pub struct Authentication {
    /// Clients may present a certificate of the listener's client CA.
    pub client_certificates: bool,
    /// Bearer tokens, kube-apiserver's `--token-auth-file` format.
    pub token_auth_file: Option<PathBuf>,
}

/// Who decides what an authenticated user may do (`--authorization-mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Authorization {
    /// Everyone may do anything: only for clusters without authentication.
    #[default]
    AlwaysAllow,
    /// Roles and bindings ([`crate::rbac`]), behind the Node authorizer
    /// ([`crate::node_authorizer`]); `system:masters` may do anything.
    Rbac,
}

/// A CA certificate and its key (PEM), which this member signs with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SigningFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Clone, Debug)]
pub struct ApiserverConfig {
    pub store: StoreConfig,
    pub peer_listen: String,
    pub client_listen: String,
    pub http_listen: String,
    /// HTTPS on the HTTP listener (`--tls-cert-file`,
    /// `--tls-private-key-file`, `--client-ca-file`); plain HTTP without.
    pub http_tls: Option<ServerFiles>,
    /// TLS on the gRPC client listener (`--cert-file`, `--key-file`,
    /// `--trusted-ca-file`, etcd's names). With a client CA, callers are
    /// authenticated by certificate (or, on the resource API, a bearer
    /// token) and nobody is trusted for being able to connect.
    pub client_tls: Option<ServerFiles>,
    /// Mutual TLS between Raft peers (`--peer-cert-file`, `--peer-key-file`,
    /// `--peer-trusted-ca-file`): the CA is required, and so is a peer
    /// certificate of it on both ends of every peer connection.
    pub peer_tls: Option<ServerFiles>,
    /// Who the HTTP listener lets in; with no way to authenticate
    /// configured, everyone is anonymous and may do anything.
    pub authentication: Authentication,
    pub authorization: Authorization,
    /// The audit log (`--audit-log-path`), if any.
    pub audit: Option<crate::audit::AuditConfig>,
    /// Per-user in-flight limits on the HTTP listener; `None`: no limits.
    pub fairness: Option<crate::fairness::Limits>,
    /// `--encryption-provider-config`: which resources are encrypted at
    /// rest, and with which keys; `None`: nothing is.
    pub encryption_provider_config: Option<PathBuf>,
    /// Service account tokens (`--service-account-signing-key-file`);
    /// `None`: TokenRequest is refused and no such token authenticates.
    pub service_account: Option<crate::service_account::ServiceAccountConfig>,
    /// The CA certificate and key node certificates are signed with
    /// (`--cluster-signing-cert-file`, `--cluster-signing-key-file`);
    /// `None`: joining nodes cannot get one from this member.
    pub cluster_signing: Option<SigningFiles>,
    /// How often watchers that asked for progress notifications get one.
    pub watch_progress_interval: Duration,
    /// How often resource watchers that allow bookmarks get one.
    pub watch_bookmark_interval: Duration,
}
