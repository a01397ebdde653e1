//! Joining with a join token: bootstrap tokens as Kubernetes stores them,
//! and the `skiff.bootstrap.Bootstrap` service that turns one into a
//! node's own certificate, or into what a new master serves with.
//!
//! A token (`skiffctl token create`) is a Secret `kube-system/bootstrap-
//! token-<id>` of type `bootstrap.kubernetes.io/token`, with kubeadm's
//! keys: `token-id`, `token-secret`, `expiration` (RFC 3339),
//! `usage-bootstrap-authentication` and `auth-extra-groups`. Sent as a
//! bearer token (`<id>.<secret>`), it authenticates as
//! `system:bootstrap:<id>` in `system:bootstrappers` and its extra groups
//! until it expires or its Secret is deleted (revoked). What it may do is
//! up to those groups: a `join-node` token's group may ask for a node
//! certificate here, and RBAC grants it nothing else.
//!
//! A joining node first fetches the cluster's CA (`ClusterCa`, public) and
//! checks it against the hash its token pins (`skiff_pki::token`); only
//! then does it send the token, over a connection verified against that
//! CA, with a signing request for a key it keeps. The certificate it gets
//! (`system:node:<name>` in `system:nodes`) is what it uses from then on;
//! it renews it the same way, authenticated by the certificate itself.
//!
//! A joining master does the same with a `join-master` token, and gets
//! what k3s hands its servers: certificates for its own serving and peer
//! keys, and the keys every master must share (the cluster CA's, the
//! service account signing key, the encryption at rest configuration).
//! Such a token makes its holder a master, and is guarded as one.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use skiff_api::resources::{self, Kind};
use skiff_api::ApiError;
use skiff_pki::token::JoinToken;
use skiff_pki::{Authority, Profile};
use skiff_proto::bootstrap::bootstrap_server::{Bootstrap, BootstrapServer};
use skiff_proto::bootstrap::{
    ClusterCaRequest, ClusterCaResponse, MasterCredentialsRequest, MasterCredentialsResponse, NodeCredentialsRequest,
    NodeCredentialsResponse,
};
use tonic::{Request, Response, Status};

use crate::admission::{UserInfo, AUTHENTICATED};
use crate::storage::ObjectStore;

/// The group of every bootstrap token's user.
pub const BOOTSTRAPPERS: &str = "system:bootstrappers";
pub use skiff_pki::token::{JOIN_MASTER_GROUP, JOIN_NODE_GROUP, NAMESPACE, SECRET_PREFIX, SECRET_TYPE};
/// The group nodes' certificates name.
pub const NODES_GROUP: &str = "system:nodes";
/// How long an issued node certificate is valid (the kubelet's client
/// certificates: one year, renewed before).
const NODE_CERT_VALIDITY: std::time::Duration = skiff_pki::DEFAULT_VALIDITY;
/// How long a joining master's serving and peer certificates are valid.
const MASTER_CERT_VALIDITY: std::time::Duration = skiff_pki::DEFAULT_VALIDITY;
/// At most this many names in a master's certificates.
const MAX_MASTER_NAMES: usize = 32;

/// The text of `key` in a Secret's `data` (base64 there).
fn data(secret: &Value, key: &str) -> Option<String> {
    use base64::Engine;
    let encoded = secret["data"][key].as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(encoded).ok()?;
    String::from_utf8(bytes).ok()
}

/// Whether two secrets are equal, in time that does not depend on where
/// they differ.
fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Who `token` is, by its stored Secret, at `now` (seconds); `Err`: why it
/// does not authenticate (for the debug log; the client hears 401).
pub fn check(secret: &Value, token: &JoinToken, now: i64) -> Result<UserInfo, &'static str> {
    if secret["type"] != SECRET_TYPE {
        return Err("the Secret is not a bootstrap token");
    }
    if data(secret, "token-id").as_deref() != Some(token.id.as_str()) {
        return Err("the Secret's token-id is another");
    }
    match data(secret, "token-secret") {
        Some(stored) if same_secret(&stored, &token.secret) => {}
        _ => return Err("wrong secret"),
    }
    if let Some(expiration) = data(secret, "expiration") {
        let expires = chrono::DateTime::parse_from_rfc3339(&expiration).map_err(|_| "unreadable expiration")?;
        if expires.timestamp() <= now {
            return Err("expired");
        }
    }
    if data(secret, "usage-bootstrap-authentication").as_deref() != Some("true") {
        return Err("not for authentication");
    }
    let mut groups = vec![BOOTSTRAPPERS.to_string()];
    for extra in data(secret, "auth-extra-groups").unwrap_or_default().split(',').map(str::trim) {
        // Kubernetes lets a token add only bootstrappers' subgroups: a
        // token can never make its holder an administrator.
        if extra.starts_with("system:bootstrappers:") && !groups.iter().any(|g| g == extra) {
            groups.push(extra.to_string());
        }
    }
    groups.push(AUTHENTICATED.to_string());
    Ok(UserInfo { name: format!("system:bootstrap:{}", token.id), groups })
}

/// Bootstrap tokens, checked against their Secrets in the store.
pub struct BootstrapTokens {
    objects: ObjectStore,
}

impl BootstrapTokens {
    pub fn new(objects: ObjectStore) -> BootstrapTokens {
        BootstrapTokens { objects }
    }

    /// `Ok(None)`: not a bootstrap token of this cluster (another
    /// authenticator may know it); 401 if it is one but does not hold.
    pub async fn authenticate(&self, bearer: &str) -> Result<Option<UserInfo>, ApiError> {
        if !JoinToken::looks_like_bearer(bearer) {
            return Ok(None);
        }
        let token = JoinToken::parse(bearer).map_err(|_| ApiError::unauthorized("Unauthorized"))?;
        let key = resources::of(Kind::Secret).key(Some(NAMESPACE), &format!("{SECRET_PREFIX}{}", token.id));
        let Some(stored) = self.objects.get(&key, 0).await?.0 else { return Ok(None) };
        match check(&stored.decode()?, &token, chrono::Utc::now().timestamp()) {
            Ok(user) => Ok(Some(user)),
            Err(why) => {
                tracing::debug!(id = %token.id, why, "bootstrap token refused");
                Err(ApiError::unauthorized("Unauthorized"))
            }
        }
    }
}

/// A node name as a Node's name must be (a DNS subdomain).
fn valid_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// May `who` have a certificate for node `name`: a join-node token's
/// holder, for any name (as Kubernetes' bootstrap CSRs), or the node
/// itself renewing its own.
pub fn may_have_node_certificate(who: &UserInfo, name: &str) -> bool {
    let member = |g: &str| who.groups.iter().any(|have| have == g);
    member(JOIN_NODE_GROUP) || (member(NODES_GROUP) && who.name == format!("system:node:{name}"))
}

/// May `who` have a new master's credentials: only a join-master token's
/// holder (an administrator makes one with `skiffctl token create
/// --usages join-master`).
pub fn may_join_as_master(who: &UserInfo) -> bool {
    who.groups.iter().any(|g| g == JOIN_MASTER_GROUP)
}

/// A member name as a peer certificate carries it: printable, short.
fn valid_member_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 253 && name.bytes().all(|b| b.is_ascii_graphic())
}

/// A name a master's certificates may carry: an IP address or a DNS name.
fn valid_master_name(name: &str) -> bool {
    name.parse::<std::net::IpAddr>().is_ok() || valid_node_name(name)
}

/// The files every master of a cluster shares, which a joining master is
/// handed. Read when asked, so a rotated file is the one handed on.
#[derive(Clone, Debug, Default)]
pub struct SharedFiles {
    /// The CA peers' certificates chain to (`--peer-trusted-ca-file`);
    /// `None`: the peers use no TLS, and masters cannot join with tokens.
    pub peer_ca: Option<PathBuf>,
    /// The cluster CA's key (`--cluster-signing-key-file`).
    pub signing_key: Option<PathBuf>,
    /// `--service-account-signing-key-file`.
    pub service_account_key: Option<PathBuf>,
    /// `--encryption-provider-config`.
    pub encryption_config: Option<PathBuf>,
}

async fn read_shared(path: &Path) -> Result<String, Status> {
    tokio::fs::read_to_string(path).await.map_err(|e| {
        tracing::error!(path = %path.display(), error = %e, "cannot read a file joining masters are handed");
        Status::internal(format!("this member cannot read {}: {e}", path.display()))
    })
}

/// The `skiff.bootstrap.Bootstrap` service.
#[derive(Clone)]
pub struct BootstrapService {
    security: crate::admission::Security,
    ca_pem: Option<Arc<str>>,
    signer: Option<Arc<Authority>>,
    shared: Arc<SharedFiles>,
}

impl BootstrapService {
    /// Serves `ca_pem` (the client port's trusted CA) and signs with
    /// `signer` (`--cluster-signing-key-file`); without one, node and
    /// master certificates are refused with the reason. Joining masters
    /// are also handed `shared`.
    pub fn server(
        security: crate::admission::Security,
        ca_pem: Option<String>,
        signer: Option<Authority>,
        shared: SharedFiles,
    ) -> BootstrapServer<BootstrapService> {
        BootstrapServer::new(BootstrapService {
            security,
            ca_pem: ca_pem.map(Arc::from),
            signer: signer.map(Arc::new),
            shared: Arc::new(shared),
        })
    }

    /// The CA this member serves and signs with, or why it signs no
    /// `whose` certificates.
    fn signing(&self, whose: &str) -> Result<(&str, &Authority), Status> {
        match (&self.ca_pem, &self.signer) {
            (Some(ca_pem), Some(signer)) => Ok((ca_pem, signer)),
            _ => Err(Status::failed_precondition(format!(
                "this member cannot sign {whose} certificates: start it with --cluster-signing-cert-file and --cluster-signing-key-file"
            ))),
        }
    }

    /// The files a joining master is handed, once its request is allowed.
    async fn shared_with_master(&self, signer: &Authority) -> Result<(String, String, String), Status> {
        let Some(peer_ca) = &self.shared.peer_ca else {
            return Err(Status::failed_precondition(
                "this cluster's peers use no TLS (--peer-cert-file): a master joins with a token only where peers use mutual TLS",
            ));
        };
        let peer_ca = read_shared(peer_ca).await?;
        if !skiff_pki::token::bundle_holds(&peer_ca, signer.cert_pem()).map_err(|e| Status::internal(e.to_string()))? {
            return Err(Status::failed_precondition(
                "this member's peers trust another CA than the cluster CA it signs with (--peer-trusted-ca-file): \
                 issue the new master a peer certificate of the peers' CA and start it with --peer-cert-file instead",
            ));
        }
        let ca_key = match &self.shared.signing_key {
            Some(path) => read_shared(path).await?,
            None => return Err(Status::internal("this member signs with a CA whose key file it was not told")),
        };
        let optional = |path: &Option<PathBuf>| {
            let path = path.clone();
            async move {
                match path {
                    Some(path) => read_shared(&path).await,
                    None => Ok(String::new()),
                }
            }
        };
        let service_account_key = optional(&self.shared.service_account_key).await?;
        let encryption_config = optional(&self.shared.encryption_config).await?;
        Ok((ca_key, service_account_key, encryption_config))
    }
}

#[tonic::async_trait]
impl Bootstrap for BootstrapService {
    async fn cluster_ca(&self, _request: Request<ClusterCaRequest>) -> Result<Response<ClusterCaResponse>, Status> {
        let ca_pem = self.ca_pem.as_deref().ok_or_else(|| {
            Status::failed_precondition("this member's client port checks no client certificates (--trusted-ca-file)")
        })?;
        Ok(Response::new(ClusterCaResponse { ca_pem: ca_pem.to_string() }))
    }

    async fn node_credentials(
        &self,
        request: Request<NodeCredentialsRequest>,
    ) -> Result<Response<NodeCredentialsResponse>, Status> {
        let (ca_pem, signer) = self.signing("node")?;
        let credentials = crate::grpc::credentials(&request);
        tracing::info!(node = %request.get_ref().node_name, "a node certificate was asked for");
        if credentials.bearer_token.is_none() && credentials.client_certificate.is_none() {
            return Err(Status::unauthenticated("a node certificate takes a join token or the node's own certificate"));
        }
        let who = self.security.authenticate_request(&credentials).await.map_err(|e| crate::grpc::to_status(&e))?;
        let request = request.into_inner();
        if !valid_node_name(&request.node_name) {
            return Err(Status::invalid_argument(format!(
                "node name {:?} is not a DNS subdomain (lowercase letters, digits, '-' and '.')",
                request.node_name
            )));
        }
        if !may_have_node_certificate(&who, &request.node_name) {
            return Err(Status::permission_denied(format!(
                "user {:?} may not have a certificate for node {:?}: that takes a join-node token, or the node's own certificate",
                who.name, request.node_name
            )));
        }
        let profile =
            Profile::Client { user: format!("system:node:{}", request.node_name), groups: vec![NODES_GROUP.into()] };
        let cert_pem = signer
            .sign_request(&request.csr_pem, &profile, NODE_CERT_VALIDITY)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        tracing::info!(node = %request.node_name, by = %who.name, "issued a node certificate");
        Ok(Response::new(NodeCredentialsResponse { cert_pem, ca_pem: ca_pem.to_string() }))
    }

    async fn master_credentials(
        &self,
        request: Request<MasterCredentialsRequest>,
    ) -> Result<Response<MasterCredentialsResponse>, Status> {
        let (ca_pem, signer) = self.signing("master")?;
        let credentials = crate::grpc::credentials(&request);
        tracing::info!(member = %request.get_ref().member_name, "a master's credentials were asked for");
        if credentials.bearer_token.is_none() {
            return Err(Status::unauthenticated("a master's credentials take a join-master token"));
        }
        let who = self.security.authenticate_request(&credentials).await.map_err(|e| crate::grpc::to_status(&e))?;
        if !may_join_as_master(&who) {
            return Err(Status::permission_denied(format!(
                "user {:?} may not join as a master: that takes a join-master token (skiffctl token create --usages join-master)",
                who.name
            )));
        }
        let request = request.into_inner();
        if !valid_member_name(&request.member_name) {
            return Err(Status::invalid_argument(format!(
                "member name {:?} is empty, too long or not printable",
                request.member_name
            )));
        }
        if request.names.is_empty() || request.names.len() > MAX_MASTER_NAMES {
            return Err(Status::invalid_argument(format!(
                "a master's certificates name 1 to {MAX_MASTER_NAMES} addresses, not {}",
                request.names.len()
            )));
        }
        if let Some(bad) = request.names.iter().find(|n| !valid_master_name(n)) {
            return Err(Status::invalid_argument(format!("{bad:?} is neither an IP address nor a DNS name")));
        }
        let (ca_key_pem, service_account_key_pem, encryption_config) = self.shared_with_master(signer).await?;
        let sign = |csr: &str, profile: Profile| {
            signer
                .sign_request(csr, &profile, MASTER_CERT_VALIDITY)
                .map_err(|e| Status::invalid_argument(e.to_string()))
        };
        let server_cert_pem = sign(&request.server_csr_pem, Profile::Server { names: request.names.clone() })?;
        let peer_cert_pem =
            sign(&request.peer_csr_pem, Profile::Peer { user: request.member_name.clone(), names: request.names })?;
        tracing::warn!(member = %request.member_name, by = %who.name, "handed a joining master the cluster's credentials");
        Ok(Response::new(MasterCredentialsResponse {
            ca_pem: ca_pem.to_string(),
            server_cert_pem,
            peer_cert_pem,
            ca_key_pem,
            service_account_key_pem,
            encryption_config,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn b64(s: &str) -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn secret(id: &str, secret: &str, expiration: Option<&str>, groups: &str) -> Value {
        let mut data = json!({
            "token-id": b64(id),
            "token-secret": b64(secret),
            "usage-bootstrap-authentication": b64("true"),
            "auth-extra-groups": b64(groups),
        });
        if let Some(e) = expiration {
            data["expiration"] = json!(b64(e));
        }
        json!({"type": SECRET_TYPE, "data": data})
    }

    fn token(text: &str) -> JoinToken {
        JoinToken::parse(text).unwrap()
    }

    #[test]
    fn a_token_authenticates_while_its_secret_matches_and_it_has_not_expired() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-12-03T12:00:00Z").unwrap().timestamp();
        let stored = secret("abcdef", "0123456789abcdef", Some("2026-12-04T12:00:00Z"), JOIN_NODE_GROUP);
        let user = check(&stored, &token("abcdef.0123456789abcdef"), now).unwrap();
        assert_eq!(user.name, "system:bootstrap:abcdef");
        assert_eq!(user.groups, vec![BOOTSTRAPPERS, JOIN_NODE_GROUP, AUTHENTICATED]);
        assert_eq!(check(&stored, &token("abcdef.0123456789abcdee"), now), Err("wrong secret"));
        let day_later = now + 24 * 3600;
        assert_eq!(check(&stored, &token("abcdef.0123456789abcdef"), day_later), Err("expired"));
        let mut not_auth = stored.clone();
        not_auth["data"]["usage-bootstrap-authentication"] = json!(b64("false"));
        assert_eq!(check(&not_auth, &token("abcdef.0123456789abcdef"), now), Err("not for authentication"));
        let mut opaque = stored.clone();
        opaque["type"] = json!("Opaque");
        assert!(check(&opaque, &token("abcdef.0123456789abcdef"), now).is_err());
    }

    #[test]
    fn a_token_cannot_name_groups_outside_the_bootstrappers() {
        let stored = secret("abcdef", "0123456789abcdef", None, "system:masters, system:bootstrappers:x");
        let user = check(&stored, &token("abcdef.0123456789abcdef"), 0).unwrap();
        assert_eq!(user.groups, vec![BOOTSTRAPPERS, "system:bootstrappers:x", AUTHENTICATED]);
    }

    #[test]
    fn node_certificates_go_to_join_tokens_and_to_the_node_itself() {
        let joiner = UserInfo {
            name: "system:bootstrap:abcdef".into(),
            groups: vec![BOOTSTRAPPERS.into(), JOIN_NODE_GROUP.into()],
        };
        let master_token = UserInfo {
            name: "system:bootstrap:ghijkl".into(),
            groups: vec![BOOTSTRAPPERS.into(), JOIN_MASTER_GROUP.into()],
        };
        let node = UserInfo { name: "system:node:n1".into(), groups: vec![NODES_GROUP.into()] };
        assert!(may_have_node_certificate(&joiner, "n1"));
        assert!(!may_have_node_certificate(&master_token, "n1"));
        assert!(may_have_node_certificate(&node, "n1"));
        assert!(!may_have_node_certificate(&node, "n2"), "a node renews its own certificate, no other");
        assert!(valid_node_name("node-1.example"));
        for bad in ["", "Node", "-a", "a..b", "a_b"] {
            assert!(!valid_node_name(bad), "{bad}");
        }
    }

    #[test]
    fn only_join_master_tokens_get_a_masters_credentials() {
        let user = |groups: &[&str]| UserInfo {
            name: "system:bootstrap:abcdef".into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        };
        assert!(may_join_as_master(&user(&[BOOTSTRAPPERS, JOIN_MASTER_GROUP])));
        assert!(!may_join_as_master(&user(&[BOOTSTRAPPERS, JOIN_NODE_GROUP])));
        assert!(!may_join_as_master(&user(&[skiff_pki::MASTERS_GROUP])), "an administrator makes a token instead");
        assert!(!may_join_as_master(&user(&[NODES_GROUP])));
        for good in ["127.0.0.1", "::1", "m4.example", "localhost"] {
            assert!(valid_master_name(good), "{good}");
        }
        for bad in ["", "*.example", "a b", "1.2.3.4:80"] {
            assert!(!valid_master_name(bad), "{bad}");
        }
        assert!(valid_member_name("member-4") && !valid_member_name("") && !valid_member_name("a\nb"));
    }
}
