//! The layers every request passes before it touches the store:
//! authentication (who is asking), authorization (may they do this verb on
//! this resource) and admission (mutating, then validating plugins that see
//! the object). Authentication knows client certificates (the HTTPS
//! listener's verified peer) and static bearer tokens; authorization is
//! RBAC ([`crate::rbac`]) or allows everything; `system:masters` may
//! always do anything, as in Kubernetes.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use serde_json::Value;
use skiff_api::{ApiError, ResourceInfo};

use crate::rbac::{bootstrap::MASTERS, Action, Rule};

/// Who is asking.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub groups: Vec<String>,
}

/// The user of requests without credentials.
pub const ANONYMOUS: &str = "system:anonymous";
/// The group every authenticated user is in.
pub const AUTHENTICATED: &str = "system:authenticated";

impl UserInfo {
    pub fn anonymous() -> Self {
        UserInfo { name: ANONYMOUS.into(), groups: vec!["system:unauthenticated".into()] }
    }
}

/// What a request carries that can identify its sender.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    /// `Authorization: Bearer <token>`.
    pub bearer_token: Option<String>,
    /// Who the client certificate the TLS handshake verified names.
    pub client_certificate: Option<UserInfo>,
}

/// A verified client certificate's identity, as the HTTPS and client
/// listeners put it into a request's extensions.
#[derive(Clone, Debug)]
pub struct ClientCertificate(pub UserInfo);

impl From<skiff_pki::Identity> for ClientCertificate {
    fn from(id: skiff_pki::Identity) -> Self {
        ClientCertificate(UserInfo { name: id.user, groups: id.groups })
    }
}

/// What is being asked, for authorization and admission.
#[derive(Clone, Debug)]
pub struct Attributes<'a> {
    pub user: &'a UserInfo,
    /// Kubernetes verbs: get, list, watch, create, update, patch, delete.
    pub verb: &'a str,
    pub resource: &'static ResourceInfo,
    pub subresource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}

pub trait Authenticator: Send + Sync {
    /// `Ok(None)`: these credentials are not this authenticator's to judge.
    fn authenticate(&self, credentials: &Credentials) -> Result<Option<UserInfo>, ApiError>;
}

pub trait Authorizer: Send + Sync {
    /// `Err`: why not, as the text after `... is forbidden: `.
    fn authorize(&self, user: &UserInfo, action: &Action<'_>) -> Result<(), String>;

    /// Every rule `user` holds in `namespace`, for `SelfSubjectRulesReview`;
    /// `None` if this authorizer has no rules to list.
    fn rules_for(&self, _user: &UserInfo, _namespace: &str) -> Option<Vec<Rule>> {
        None
    }

    /// Whether writing `obj` would give someone more than `user` holds.
    fn check_escalation(&self, _user: &UserInfo, _attrs: &Attributes<'_>, _obj: &Value) -> Result<(), String> {
        Ok(())
    }
}

/// An admission plugin: may change the object (`admit`), then may refuse it
/// (`validate`), on create, update and delete.
pub trait AdmissionPlugin: Send + Sync {
    fn name(&self) -> &'static str;

    fn admit(&self, _attributes: &Attributes<'_>, _object: &mut Value, _old: Option<&Value>) -> Result<(), ApiError> {
        Ok(())
    }

    fn validate(&self, _attributes: &Attributes<'_>, _object: &Value, _old: Option<&Value>) -> Result<(), ApiError> {
        Ok(())
    }
}

/// Everyone is anonymous.
pub struct Anonymous;

impl Authenticator for Anonymous {
    fn authenticate(&self, _credentials: &Credentials) -> Result<Option<UserInfo>, ApiError> {
        Ok(Some(UserInfo::anonymous()))
    }
}

/// Client certificates: the common name is the user, each organization a
/// group (the TLS handshake has already checked the chain and expiry).
pub struct X509;

impl Authenticator for X509 {
    fn authenticate(&self, credentials: &Credentials) -> Result<Option<UserInfo>, ApiError> {
        Ok(credentials.client_certificate.clone())
    }
}

/// Bearer tokens from a file, kube-apiserver's `--token-auth-file`: one
/// `token,user,uid[,"group1,group2,..."]` line each.
pub struct StaticTokens {
    tokens: HashMap<String, UserInfo>,
}

impl StaticTokens {
    pub fn parse(text: &str) -> Result<StaticTokens, String> {
        let mut tokens = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields = csv_fields(line).map_err(|e| format!("line {}: {e}", n + 1))?;
            let [token, user, _uid, rest @ ..] = fields.as_slice() else {
                return Err(format!("line {}: needs at least token,user,uid", n + 1));
            };
            if token.is_empty() || user.is_empty() {
                return Err(format!("line {}: the token and the user may not be empty", n + 1));
            }
            let groups = match rest {
                [] => Vec::new(),
                [groups] => groups.split(',').map(str::trim).filter(|g| !g.is_empty()).map(String::from).collect(),
                _ => return Err(format!("line {}: several groups go in one quoted field", n + 1)),
            };
            if tokens.insert(token.clone(), UserInfo { name: user.clone(), groups }).is_some() {
                return Err(format!("line {}: the token appears twice", n + 1));
            }
        }
        Ok(StaticTokens { tokens })
    }

    pub fn load(path: &Path) -> Result<StaticTokens, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        StaticTokens::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// One CSV line's fields; double quotes enclose a field with commas.
fn csv_fields(line: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(std::mem::take(&mut field).trim().to_string()),
            c => field.push(c),
        }
    }
    if quoted {
        return Err("a quote is not closed".into());
    }
    fields.push(field.trim().to_string());
    Ok(fields)
}

impl Authenticator for StaticTokens {
    fn authenticate(&self, credentials: &Credentials) -> Result<Option<UserInfo>, ApiError> {
        let Some(token) = &credentials.bearer_token else { return Ok(None) };
        // A token this file does not hold is not ours to judge: the chain
        // ends in 401 if no one else knows it either.
        Ok(self.tokens.get(token).cloned())
    }
}

/// Everything is allowed.
pub struct AlwaysAllow;

impl Authorizer for AlwaysAllow {
    fn authorize(&self, _user: &UserInfo, _action: &Action<'_>) -> Result<(), String> {
        Ok(())
    }
}

/// The chain of layers, in order.
#[derive(Clone)]
pub struct Security {
    authenticators: Vec<Arc<dyn Authenticator>>,
    authorizer: Arc<dyn Authorizer>,
    admission: Vec<Arc<dyn AdmissionPlugin>>,
    /// Service account tokens: issued by TokenRequest, accepted as bearer
    /// tokens (they read the store, so they are checked apart).
    tokens: Option<Arc<crate::service_account::Tokens>>,
    /// Bootstrap (join) tokens, checked against their Secrets.
    bootstrap_tokens: Option<Arc<crate::bootstrap::BootstrapTokens>>,
    /// Whether the gRPC client port checks client certificates: then its
    /// callers authenticate like the HTTP listener's, with no fallback.
    client_port_secured: bool,
}

impl Default for Security {
    fn default() -> Self {
        Security {
            authenticators: vec![Arc::new(Anonymous)],
            authorizer: Arc::new(AlwaysAllow),
            admission: Vec::new(),
            tokens: None,
            bootstrap_tokens: None,
            client_port_secured: false,
        }
    }
}

impl Security {
    /// The layers `config` asks for: client certificates when the HTTPS
    /// listener has a client CA, static tokens when a token file is given.
    /// With neither, everyone is anonymous, as before security existed.
    pub fn for_config(config: &crate::config::Authentication) -> Result<Security, String> {
        let mut authenticators: Vec<Arc<dyn Authenticator>> = Vec::new();
        if config.client_certificates {
            authenticators.push(Arc::new(X509));
        }
        if let Some(path) = &config.token_auth_file {
            authenticators.push(Arc::new(StaticTokens::load(path)?));
        }
        if authenticators.is_empty() {
            return Ok(Security::default());
        }
        Ok(Security {
            authenticators,
            authorizer: Arc::new(AlwaysAllow),
            // NodeRestriction judges only nodes' identities, which exist
            // only with authentication on.
            admission: vec![Arc::new(crate::node_restriction::NodeRestriction)],
            tokens: None,
            bootstrap_tokens: None,
            client_port_secured: false,
        })
    }

    pub fn new(
        authenticators: Vec<Arc<dyn Authenticator>>,
        authorizer: Arc<dyn Authorizer>,
        admission: Vec<Arc<dyn AdmissionPlugin>>,
    ) -> Self {
        Security {
            authenticators,
            authorizer,
            admission,
            tokens: None,
            bootstrap_tokens: None,
            client_port_secured: false,
        }
    }

    /// The first authenticator that recognises the credentials decides.
    pub fn authenticate(&self, credentials: &Credentials) -> Result<UserInfo, ApiError> {
        for a in &self.authenticators {
            if let Some(mut user) = a.authenticate(credentials)? {
                // Every authenticated user is in this group, as in Kubernetes.
                if user.name != ANONYMOUS && !user.groups.iter().any(|g| g == AUTHENTICATED) {
                    user.groups.push(AUTHENTICATED.to_string());
                }
                return Ok(user);
            }
        }
        Err(ApiError::unauthorized("Unauthorized"))
    }

    /// Who a call on the gRPC client port comes from. A port that checks
    /// client certificates authenticates as the HTTP listener does. One
    /// that does not (no `--trusted-ca-file`) trusts callers no
    /// authenticator recognises as [`unsecured_client_port`] instead of
    /// refusing them, as it did before authentication existed: the
    /// components then reach it without credentials, and deploy/README.md
    /// says to keep such a port off untrusted networks.
    pub async fn authenticate_client_port(&self, credentials: &Credentials) -> Result<UserInfo, ApiError> {
        if self.client_port_secured {
            return self.authenticate_request(credentials).await;
        }
        match self.authenticate(credentials) {
            Err(e) if e.code() == 401 => Ok(unsecured_client_port()),
            other => other,
        }
    }

    /// The same layers, for a client port that checks client certificates
    /// (built with [`crate::config::Authentication::client_certificates`],
    /// so that they are read).
    pub fn with_secured_client_port(mut self) -> Self {
        self.client_port_secured = true;
        self
    }

    /// Who a request's credentials name: a service account token or a
    /// bootstrap token of this cluster first (checked against the store),
    /// then the other authenticators.
    pub async fn authenticate_request(&self, credentials: &Credentials) -> Result<UserInfo, ApiError> {
        if let (Some(tokens), Some(token)) = (&self.tokens, &credentials.bearer_token) {
            if let Some(mut user) = tokens.authenticate(token).await? {
                user.groups.push(AUTHENTICATED.to_string());
                return Ok(user);
            }
        }
        if let (Some(tokens), Some(token)) = (&self.bootstrap_tokens, &credentials.bearer_token) {
            if let Some(user) = tokens.authenticate(token).await? {
                return Ok(user);
            }
        }
        self.authenticate(credentials)
    }

    /// The same layers, accepting bootstrap tokens.
    pub fn with_bootstrap_tokens(mut self, tokens: Arc<crate::bootstrap::BootstrapTokens>) -> Self {
        self.bootstrap_tokens = Some(tokens);
        self
    }

    /// The same layers, issuing and accepting service account tokens.
    pub fn with_tokens(mut self, tokens: Arc<crate::service_account::Tokens>) -> Self {
        self.tokens = Some(tokens);
        self
    }

    pub fn tokens(&self) -> Option<&Arc<crate::service_account::Tokens>> {
        self.tokens.as_ref()
    }

    /// The same layers with another authorizer (the member's RBAC, once
    /// its store is open).
    pub fn with_authorizer(mut self, authorizer: Arc<dyn Authorizer>) -> Self {
        self.authorizer = authorizer;
        self
    }

    pub fn authorize(&self, attributes: &Attributes<'_>) -> Result<(), ApiError> {
        let info = attributes.resource;
        // As in Kubernetes, a create is not told apart by name: its URL has none.
        let name = if attributes.verb == "create" && attributes.subresource.is_empty() { "" } else { attributes.name };
        let action = Action::Resource {
            verb: attributes.verb,
            group: info.group,
            resource: info.plural,
            subresource: attributes.subresource,
            namespace: if info.namespaced { attributes.namespace } else { "" },
            name,
        };
        self.authorize_action(attributes.user, &action)
            .map_err(|why| forbidden(&Attributes { name, ..attributes.clone() }, &why))
    }

    /// Whether `user` may do `action`; `Err` says why not.
    pub fn authorize_action(&self, user: &UserInfo, action: &Action<'_>) -> Result<(), String> {
        if user.groups.iter().any(|g| g == MASTERS) {
            return Ok(());
        }
        self.authorizer.authorize(user, action)
    }

    /// A request outside the resource API (`/metrics`, `/apis`): 403 with
    /// kube's message if `user` may not `verb` it.
    pub fn authorize_path(&self, user: &UserInfo, verb: &str, path: &str) -> Result<(), ApiError> {
        self.authorize_action(user, &Action::Path { verb, path })
            .map_err(|why| ApiError::forbidden(format!("forbidden: {why}")))
    }

    /// Every rule `user` holds in `namespace`; `None` when authorization
    /// does not work by rules (everything is allowed).
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> Option<Vec<Rule>> {
        self.authorizer.rules_for(user, namespace)
    }

    /// Runs every mutating step, then every validating step. Writes of
    /// roles and bindings are checked for escalation first.
    pub fn admit(&self, attributes: &Attributes<'_>, object: &mut Value, old: Option<&Value>) -> Result<(), ApiError> {
        if !attributes.user.groups.iter().any(|g| g == MASTERS) {
            self.authorizer
                .check_escalation(attributes.user, attributes, object)
                .map_err(|why| forbidden(attributes, &why))?;
        }
        for plugin in &self.admission {
            plugin.admit(attributes, object, old)?;
        }
        for plugin in &self.admission {
            plugin.validate(attributes, object, old)?;
        }
        Ok(())
    }
}

/// Who a caller of the gRPC client port without credentials acts as when
/// authentication is on: a superuser, as every caller was before.
pub fn unsecured_client_port() -> UserInfo {
    UserInfo { name: "system:unsecured-client-port".into(), groups: vec![MASTERS.into()] }
}

/// A forbidden message the way Kubernetes words it.
pub fn forbidden(attributes: &Attributes<'_>, why: &str) -> ApiError {
    let what = if attributes.name.is_empty() {
        attributes.resource.qualified()
    } else {
        format!("{} \"{}\"", attributes.resource.qualified(), attributes.name)
    };
    ApiError::forbidden(format!("{what} is forbidden: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo { name: name.into(), groups: groups.iter().map(|g| g.to_string()).collect() }
    }

    fn bearer(token: &str) -> Credentials {
        Credentials { bearer_token: Some(token.into()), client_certificate: None }
    }

    #[test]
    fn token_files_read_as_kube_apiserver_reads_them() {
        let tokens =
            StaticTokens::parse("# comment\n\nt1,alice,1\nt2, bob ,2,\"dev, ops\"\nt3,carol,3,viewers\n").unwrap();
        assert_eq!(tokens.authenticate(&bearer("t1")).unwrap(), Some(user("alice", &[])));
        assert_eq!(tokens.authenticate(&bearer("t2")).unwrap(), Some(user("bob", &["dev", "ops"])));
        assert_eq!(tokens.authenticate(&bearer("t3")).unwrap(), Some(user("carol", &["viewers"])));
        assert_eq!(tokens.authenticate(&bearer("t4")).unwrap(), None);
        assert_eq!(tokens.authenticate(&Credentials::default()).unwrap(), None);
    }

    #[test]
    fn bad_token_files_say_which_line() {
        for (text, why) in [
            ("t1,alice\n", "line 1: needs at least token,user,uid"),
            ("t1,alice,1\nt1,bob,2\n", "line 2: the token appears twice"),
            ("t1,alice,1,\"dev\n", "line 1: a quote is not closed"),
            (",alice,1\n", "line 1: the token and the user may not be empty"),
            ("t1,alice,1,dev,ops\n", "line 1: several groups go in one quoted field"),
        ] {
            assert_eq!(StaticTokens::parse(text).err().as_deref(), Some(why), "{text:?}");
        }
    }

    #[test]
    fn with_authentication_on_nobody_is_anonymous() {
        let config = crate::config::Authentication { client_certificates: true, token_auth_file: None };
        let security = Security::for_config(&config).unwrap();
        let e = security.authenticate(&Credentials::default()).unwrap_err();
        assert_eq!(e.code(), 401);
        assert_eq!(security.authenticate(&bearer("guess")).unwrap_err().code(), 401);
        // A client port that checks no certificates trusts them as before.
        let on_client_port = futures::executor::block_on(security.authenticate_client_port(&bearer("guess")));
        assert_eq!(on_client_port.unwrap(), unsecured_client_port());
        let secured = security.clone().with_secured_client_port();
        let refused = futures::executor::block_on(secured.authenticate_client_port(&bearer("guess")));
        assert_eq!(refused.unwrap_err().code(), 401, "a secured client port trusts no one for connecting");
        let cert = Credentials { bearer_token: None, client_certificate: Some(user("alice", &["dev"])) };
        assert_eq!(security.authenticate(&cert).unwrap(), user("alice", &["dev", AUTHENTICATED]));
        // Off, as in-process tests and `skiff apiserver` without TLS run.
        let open = Security::for_config(&Default::default()).unwrap();
        assert_eq!(open.authenticate(&Credentials::default()).unwrap(), UserInfo::anonymous());
    }
}
