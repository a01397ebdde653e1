//! etcd's Auth service, and the check every other service runs first.
//!
//! Changes to users and roles are replicated as `Command::Auth`; a password
//! is hashed with bcrypt on the member that took the request, before the
//! proposal, so the log and the snapshots only ever hold hashes.
//! `Authenticate` checks a password against this member's applied auth
//! store, then replicates the token it makes up, so that every member
//! accepts it (see [`Tokens`](crate::auth::token::Tokens)).
//!
//! [`caller`] turns a request's `token` metadata into a [`Caller`], against
//! which a service checks what the request reads and writes. While auth is
//! disabled every check passes, as in etcd. The apiserver reaches the store
//! through the [`Store`] façade, not these services, so it is never checked.

use std::sync::Arc;

use skiff_proto::authpb;
use skiff_proto::etcdserverpb::auth_server::{Auth, AuthServer};
use skiff_proto::etcdserverpb::request_op::Request as RequestOpKind;
use skiff_proto::etcdserverpb::*;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use crate::auth::{Access, AuthCommand, AuthError, AuthView, Permission, ROOT};
use crate::etcd::header;
use crate::store::Store;

/// bcrypt's cost factor, etcd's default (`--bcrypt-cost` 10): about 50 ms
/// per hash, paid once per `user add` and per `Authenticate`.
const BCRYPT_COST: u32 = 10;

/// The metadata keys a client's token travels in: etcd's clients use
/// `token`; etcd's gRPC gateway passes `authorization`.
const TOKEN_KEYS: [&str; 2] = ["token", "authorization"];

/// Who sent a request, with the auth store it is checked against.
pub struct Caller {
    view: Arc<AuthView>,
    /// `None` while auth is disabled: everything is allowed.
    user: Option<String>,
}

/// The caller of a request with `metadata`: while auth is enabled, the user
/// its token names (etcd's "user name is empty" without a token, "invalid
/// auth token" for an unknown or expired one).
pub fn caller(store: &Store, metadata: &MetadataMap) -> Result<Caller, Status> {
    let view = store.auth();
    if !view.enabled() {
        return Ok(Caller { view, user: None });
    }
    let token = TOKEN_KEYS.iter().find_map(|k| metadata.get(*k)).ok_or(AuthError::UserEmpty)?;
    let token = token.to_str().map_err(|_| AuthError::InvalidAuthToken)?;
    let user = store.tokens().user(token, &view)?;
    Ok(Caller { view, user: Some(user) })
}

impl Caller {
    /// The same caller checked against the auth store as it is now, for a
    /// long-lived stream whose permissions may have changed since it began.
    pub fn renewed(&self, store: &Store) -> Caller {
        let view = store.auth();
        let user = if view.enabled() { self.user.clone() } else { None };
        Caller { view, user }
    }

    /// The authenticated user, if auth is enabled.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    fn check(&self, key: &[u8], range_end: &[u8], access: Access) -> Result<(), Status> {
        match &self.user {
            None => Ok(()),
            Some(user) => Ok(self.view.check_range(user, key, range_end, access)?),
        }
    }

    /// Reading the key or range `(key, range_end)` is allowed.
    pub fn read(&self, key: &[u8], range_end: &[u8]) -> Result<(), Status> {
        self.check(key, range_end, Access::Read)
    }

    /// Writing the key or range `(key, range_end)` is allowed.
    pub fn write(&self, key: &[u8], range_end: &[u8]) -> Result<(), Status> {
        self.check(key, range_end, Access::Write)
    }

    /// The caller holds the `root` role (needed for auth and cluster
    /// administration, compaction, defragmentation, snapshots).
    pub fn admin(&self) -> Result<(), Status> {
        match &self.user {
            None => Ok(()),
            Some(user) => Ok(self.view.check_admin(user)?),
        }
    }

    /// A put: write on the key, and read too when it returns the previous value.
    pub fn put(&self, r: &PutRequest) -> Result<(), Status> {
        self.write(&r.key, &[])?;
        if r.prev_kv {
            self.read(&r.key, &[])?;
        }
        Ok(())
    }

    /// A delete: write on the range, and read too when it returns what it deleted.
    pub fn delete(&self, r: &DeleteRangeRequest) -> Result<(), Status> {
        self.write(&r.key, &r.range_end)?;
        if r.prev_kv {
            self.read(&r.key, &r.range_end)?;
        }
        Ok(())
    }

    /// A txn: read on every compared range, and each operation of both
    /// branches as if sent alone (etcd checks both, whichever runs).
    pub fn txn(&self, r: &TxnRequest) -> Result<(), Status> {
        if self.user.is_none() {
            return Ok(());
        }
        for c in &r.compare {
            self.read(&c.key, &c.range_end)?;
        }
        for op in r.success.iter().chain(&r.failure) {
            match &op.request {
                Some(RequestOpKind::RequestRange(r)) => self.read(&r.key, &r.range_end)?,
                Some(RequestOpKind::RequestPut(r)) => self.put(r)?,
                Some(RequestOpKind::RequestDeleteRange(r)) => self.delete(r)?,
                Some(RequestOpKind::RequestTxn(r)) => self.txn(r)?,
                None => {}
            }
        }
        Ok(())
    }
}

/// The Auth service of one member.
pub struct AuthService {
    store: Store,
}

impl AuthService {
    pub fn server(store: Store) -> AuthServer<AuthService> {
        AuthServer::new(AuthService { store })
    }

    fn header(&self) -> Option<ResponseHeader> {
        Some(header(self.store.header()))
    }

    /// Replicates `change` once the caller of `metadata` is allowed to
    /// administer auth.
    async fn change(&self, metadata: &MetadataMap, change: AuthCommand) -> Result<(), Status> {
        caller(&self.store, metadata)?.admin()?;
        self.replicate(change).await
    }

    async fn replicate(&self, change: AuthCommand) -> Result<(), Status> {
        self.store.change_auth(change).await?;
        Ok(())
    }
}

/// `password`'s bcrypt hash, computed on the blocking pool.
async fn hash(password: String) -> Result<String, Status> {
    tokio::task::spawn_blocking(move || bcrypt::hash(password, BCRYPT_COST))
        .await
        .map_err(|e| Status::internal(format!("hashing a password: {e}")))?
        .map_err(|e| Status::internal(format!("hashing a password: {e}")))
}

fn access_from_wire(t: i32) -> Access {
    match authpb::permission::Type::try_from(t) {
        Ok(authpb::permission::Type::Write) => Access::Write,
        Ok(authpb::permission::Type::Readwrite) => Access::ReadWrite,
        _ => Access::Read,
    }
}

fn access_to_wire(a: Access) -> i32 {
    match a {
        Access::Read => authpb::permission::Type::Read as i32,
        Access::Write => authpb::permission::Type::Write as i32,
        Access::ReadWrite => authpb::permission::Type::Readwrite as i32,
    }
}

#[tonic::async_trait]
impl Auth for AuthService {
    async fn auth_enable(&self, request: Request<AuthEnableRequest>) -> Result<Response<AuthEnableResponse>, Status> {
        self.change(request.metadata(), AuthCommand::Enable).await?;
        Ok(Response::new(AuthEnableResponse { header: self.header() }))
    }

    async fn auth_disable(
        &self,
        request: Request<AuthDisableRequest>,
    ) -> Result<Response<AuthDisableResponse>, Status> {
        self.change(request.metadata(), AuthCommand::Disable).await?;
        Ok(Response::new(AuthDisableResponse { header: self.header() }))
    }

    async fn auth_status(&self, request: Request<AuthStatusRequest>) -> Result<Response<AuthStatusResponse>, Status> {
        // As in etcd, an administrative call.
        caller(&self.store, request.metadata())?.admin()?;
        let view = self.store.auth();
        Ok(Response::new(AuthStatusResponse {
            header: self.header(),
            enabled: view.enabled(),
            auth_revision: view.state().revision,
        }))
    }

    async fn authenticate(
        &self,
        request: Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        let AuthenticateRequest { name, password } = request.into_inner();
        let view = self.store.auth();
        if !view.enabled() {
            return Err(AuthError::AuthNotEnabled.into());
        }
        let user = view.state().users.get(&name).ok_or(AuthError::AuthFailed)?;
        let password_hash = user.password_hash.clone().ok_or(AuthError::AuthFailed)?;
        let password_revision = user.password_revision;
        let matches = tokio::task::spawn_blocking(move || bcrypt::verify(password, &password_hash))
            .await
            .map_err(|e| Status::internal(format!("checking a password: {e}")))?;
        if !matches.unwrap_or(false) {
            return Err(AuthError::AuthFailed.into());
        }
        // Replicated, as etcd does, so that every member accepts the token.
        let token = self.store.tokens().fresh();
        let issued = AuthCommand::Authenticate { token: token.clone(), user: name, password_revision };
        self.replicate(issued).await?;
        Ok(Response::new(AuthenticateResponse { header: self.header(), token }))
    }

    async fn user_add(&self, request: Request<AuthUserAddRequest>) -> Result<Response<AuthUserAddResponse>, Status> {
        caller(&self.store, request.metadata())?.admin()?;
        let r = request.into_inner();
        if r.name.is_empty() {
            return Err(AuthError::UserEmpty.into());
        }
        let no_password = r.options.is_some_and(|o| o.no_password);
        let password_hash = match (no_password, r.hashed_password.is_empty()) {
            (true, _) => None,
            (false, false) => Some(r.hashed_password),
            (false, true) => Some(hash(r.password).await?),
        };
        self.replicate(AuthCommand::UserAdd { name: r.name, password_hash }).await?;
        Ok(Response::new(AuthUserAddResponse { header: self.header() }))
    }

    async fn user_get(&self, request: Request<AuthUserGetRequest>) -> Result<Response<AuthUserGetResponse>, Status> {
        let caller = caller(&self.store, request.metadata())?;
        let name = request.into_inner().name;
        // A user may look itself up; anyone else needs the root role.
        if caller.user() != Some(name.as_str()) {
            caller.admin()?;
        }
        let view = self.store.auth();
        let user = view.state().users.get(&name).ok_or(AuthError::UserNotFound)?;
        Ok(Response::new(AuthUserGetResponse { header: self.header(), roles: user.roles.iter().cloned().collect() }))
    }

    async fn user_list(&self, request: Request<AuthUserListRequest>) -> Result<Response<AuthUserListResponse>, Status> {
        caller(&self.store, request.metadata())?.admin()?;
        let users = self.store.auth().state().users.keys().cloned().collect();
        Ok(Response::new(AuthUserListResponse { header: self.header(), users }))
    }

    async fn user_delete(
        &self,
        request: Request<AuthUserDeleteRequest>,
    ) -> Result<Response<AuthUserDeleteResponse>, Status> {
        let name = request.get_ref().name.clone();
        self.change(request.metadata(), AuthCommand::UserDelete { name }).await?;
        Ok(Response::new(AuthUserDeleteResponse { header: self.header() }))
    }

    async fn user_change_password(
        &self,
        request: Request<AuthUserChangePasswordRequest>,
    ) -> Result<Response<AuthUserChangePasswordResponse>, Status> {
        caller(&self.store, request.metadata())?.admin()?;
        let r = request.into_inner();
        if !self.store.auth().state().users.contains_key(&r.name) {
            return Err(AuthError::UserNotFound.into());
        }
        let password_hash = if r.hashed_password.is_empty() { hash(r.password).await? } else { r.hashed_password };
        self.replicate(AuthCommand::UserChangePassword { name: r.name, password_hash }).await?;
        Ok(Response::new(AuthUserChangePasswordResponse { header: self.header() }))
    }

    async fn user_grant_role(
        &self,
        request: Request<AuthUserGrantRoleRequest>,
    ) -> Result<Response<AuthUserGrantRoleResponse>, Status> {
        let AuthUserGrantRoleRequest { user, role } = request.get_ref().clone();
        self.change(request.metadata(), AuthCommand::UserGrantRole { user, role }).await?;
        Ok(Response::new(AuthUserGrantRoleResponse { header: self.header() }))
    }

    async fn user_revoke_role(
        &self,
        request: Request<AuthUserRevokeRoleRequest>,
    ) -> Result<Response<AuthUserRevokeRoleResponse>, Status> {
        let AuthUserRevokeRoleRequest { name, role } = request.get_ref().clone();
        self.change(request.metadata(), AuthCommand::UserRevokeRole { user: name, role }).await?;
        Ok(Response::new(AuthUserRevokeRoleResponse { header: self.header() }))
    }

    async fn role_add(&self, request: Request<AuthRoleAddRequest>) -> Result<Response<AuthRoleAddResponse>, Status> {
        let name = request.get_ref().name.clone();
        self.change(request.metadata(), AuthCommand::RoleAdd { name }).await?;
        Ok(Response::new(AuthRoleAddResponse { header: self.header() }))
    }

    async fn role_get(&self, request: Request<AuthRoleGetRequest>) -> Result<Response<AuthRoleGetResponse>, Status> {
        let caller = caller(&self.store, request.metadata())?;
        let name = request.into_inner().role;
        let view = self.store.auth();
        // A user may look up the roles it holds; others need the root role.
        let holds = caller.user().and_then(|u| view.state().users.get(u)).is_some_and(|u| u.roles.contains(&name));
        if !holds {
            caller.admin()?;
        }
        let perm = if name == ROOT && !view.state().roles.contains_key(ROOT) {
            Vec::new()
        } else {
            let role = view.state().roles.get(&name).ok_or(AuthError::RoleNotFound)?;
            role.permissions
                .iter()
                .map(|p| authpb::Permission {
                    perm_type: access_to_wire(p.access),
                    key: p.key.clone(),
                    range_end: p.range_end.clone(),
                })
                .collect()
        };
        Ok(Response::new(AuthRoleGetResponse { header: self.header(), perm }))
    }

    async fn role_list(&self, request: Request<AuthRoleListRequest>) -> Result<Response<AuthRoleListResponse>, Status> {
        caller(&self.store, request.metadata())?.admin()?;
        let roles = self.store.auth().state().roles.keys().cloned().collect();
        Ok(Response::new(AuthRoleListResponse { header: self.header(), roles }))
    }

    async fn role_delete(
        &self,
        request: Request<AuthRoleDeleteRequest>,
    ) -> Result<Response<AuthRoleDeleteResponse>, Status> {
        let name = request.get_ref().role.clone();
        self.change(request.metadata(), AuthCommand::RoleDelete { name }).await?;
        Ok(Response::new(AuthRoleDeleteResponse { header: self.header() }))
    }

    async fn role_grant_permission(
        &self,
        request: Request<AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<AuthRoleGrantPermissionResponse>, Status> {
        let r = request.get_ref().clone();
        let perm = r.perm.ok_or(AuthError::PermissionNotGiven)?;
        let permission =
            Permission { access: access_from_wire(perm.perm_type), key: perm.key, range_end: perm.range_end };
        self.change(request.metadata(), AuthCommand::RoleGrantPermission { role: r.name, permission }).await?;
        Ok(Response::new(AuthRoleGrantPermissionResponse { header: self.header() }))
    }

    async fn role_revoke_permission(
        &self,
        request: Request<AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<AuthRoleRevokePermissionResponse>, Status> {
        let AuthRoleRevokePermissionRequest { role, key, range_end } = request.get_ref().clone();
        self.change(request.metadata(), AuthCommand::RoleRevokePermission { role, key, range_end }).await?;
        Ok(Response::new(AuthRoleRevokePermissionResponse { header: self.header() }))
    }
}
