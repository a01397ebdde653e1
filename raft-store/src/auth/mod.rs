//! etcd's authentication and authorization: users with bcrypt-hashed
//! passwords, roles granting key-range permissions, and the switch that
//! turns checking on.
//!
//! Data flow: a client's `etcdctl user|role|auth` call becomes an
//! [`AuthCommand`] (passwords hashed on the member that took the request,
//! so the Raft log carries hashes, never passwords), replicated like any
//! other command and applied by [`AuthState::apply`] inside the state
//! machine's write batch. The whole [`AuthState`] is kept as one record in
//! the state machine's meta column, so it is in every snapshot and backup,
//! and never visible to KV ranges or watches. After each apply the state
//! machine publishes a fresh [`AuthView`], which the etcd services consult
//! on every request (see `etcd::auth`).
//!
//! # Layout
//! - [`perm`]: merged key-range permissions of one user.
//! - [`token`]: this member's simple tokens, issued by `Authenticate`.

pub mod perm;
pub mod token;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use perm::RangeSet;

/// The user and the role etcd treats specially: `root` must exist, holding
/// the `root` role, before auth can be enabled; the `root` role grants
/// everything, including auth and cluster administration.
pub const ROOT: &str = "root";

/// What a permission allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Access {
    Read,
    Write,
    ReadWrite,
}

impl Access {
    /// Whether a grant of `self` allows `wanted` (`Read` or `Write`).
    fn allows(self, wanted: Access) -> bool {
        self == Access::ReadWrite || self == wanted
    }
}

/// A permission on one key (`range_end` empty), on `[key, range_end)`, or
/// on every key from `key` on (`range_end` `"\0"`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Permission {
    pub access: Access,
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub range_end: Vec<u8>,
}

/// A user as replicated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    /// The bcrypt hash of the password; `None` for a user added with
    /// `--no-password` (which cannot authenticate with a password).
    pub password_hash: Option<String>,
    pub roles: BTreeSet<String>,
    /// The auth revision at which the password was last set: tokens issued
    /// before it no longer hold.
    pub password_revision: u64,
}

/// A role's permissions, sorted by key then range end, as etcd lists them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Role {
    pub permissions: Vec<Permission>,
}

/// The replicated auth store: identical on every member at the same
/// applied index.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthState {
    pub enabled: bool,
    /// Bumped by every change, as etcd's auth revision.
    pub revision: u64,
    pub users: BTreeMap<String, User>,
    pub roles: BTreeMap<String, Role>,
}

/// One change to the auth store, as it travels through the Raft log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthCommand {
    Enable,
    Disable,
    UserAdd {
        name: String,
        password_hash: Option<String>,
    },
    UserDelete {
        name: String,
    },
    UserChangePassword {
        name: String,
        password_hash: String,
    },
    UserGrantRole {
        user: String,
        role: String,
    },
    UserRevokeRole {
        user: String,
        role: String,
    },
    RoleAdd {
        name: String,
    },
    RoleDelete {
        name: String,
    },
    RoleGrantPermission {
        role: String,
        permission: Permission,
    },
    RoleRevokePermission {
        role: String,
        key: Vec<u8>,
        range_end: Vec<u8>,
    },
    /// `user` proved its password (at `password_revision`) to the member
    /// that made `token` up: every member that applies this accepts the
    /// token. Changes nothing in the store.
    Authenticate {
        token: String,
        user: String,
        password_revision: u64,
    },
}

/// etcd's auth errors, with etcd's messages (clients match on them).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum AuthError {
    #[error("etcdserver: root user does not exist")]
    RootUserNotExist,
    #[error("etcdserver: root user does not have root role")]
    RootRoleNotExist,
    #[error("etcdserver: user name already exists")]
    UserAlreadyExist,
    #[error("etcdserver: user name is empty")]
    UserEmpty,
    #[error("etcdserver: user name not found")]
    UserNotFound,
    #[error("etcdserver: role name already exists")]
    RoleAlreadyExist,
    #[error("etcdserver: role name not found")]
    RoleNotFound,
    #[error("etcdserver: role name is empty")]
    RoleEmpty,
    #[error("etcdserver: authentication failed, invalid user ID or password")]
    AuthFailed,
    #[error("etcdserver: permission not given")]
    PermissionNotGiven,
    #[error("etcdserver: permission denied")]
    PermissionDenied,
    #[error("etcdserver: role is not granted to the user")]
    RoleNotGranted,
    #[error("etcdserver: permission is not granted to the role")]
    PermissionNotGranted,
    #[error("etcdserver: authentication is not enabled")]
    AuthNotEnabled,
    #[error("etcdserver: invalid auth token")]
    InvalidAuthToken,
    #[error("etcdserver: invalid auth management")]
    InvalidAuthMgmt,
}

impl AuthState {
    /// Applies `command`; a refused command changes nothing. Every change
    /// bumps the revision.
    pub fn apply(&mut self, command: &AuthCommand) -> Result<u64, AuthError> {
        match command {
            AuthCommand::Enable => {
                if self.enabled {
                    return Ok(self.revision);
                }
                let root = self.users.get(ROOT).ok_or(AuthError::RootUserNotExist)?;
                if !root.roles.contains(ROOT) {
                    return Err(AuthError::RootRoleNotExist);
                }
                self.enabled = true;
            }
            AuthCommand::Disable => {
                if !self.enabled {
                    return Ok(self.revision);
                }
                self.enabled = false;
            }
            AuthCommand::UserAdd { name, password_hash } => {
                if name.is_empty() {
                    return Err(AuthError::UserEmpty);
                }
                if self.users.contains_key(name) {
                    return Err(AuthError::UserAlreadyExist);
                }
                let user = User {
                    password_hash: password_hash.clone(),
                    roles: BTreeSet::new(),
                    password_revision: self.revision + 1,
                };
                self.users.insert(name.clone(), user);
            }
            AuthCommand::UserDelete { name } => {
                if self.enabled && name == ROOT {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                self.users.remove(name).ok_or(AuthError::UserNotFound)?;
            }
            AuthCommand::UserChangePassword { name, password_hash } => {
                let next = self.revision + 1;
                let user = self.users.get_mut(name).ok_or(AuthError::UserNotFound)?;
                user.password_hash = Some(password_hash.clone());
                user.password_revision = next;
            }
            AuthCommand::UserGrantRole { user, role } => {
                // etcd grants `root` even before a role of that name exists.
                if role != ROOT && !self.roles.contains_key(role) {
                    return Err(AuthError::RoleNotFound);
                }
                let user = self.users.get_mut(user).ok_or(AuthError::UserNotFound)?;
                if !user.roles.insert(role.clone()) {
                    return Ok(self.revision);
                }
            }
            AuthCommand::UserRevokeRole { user, role } => {
                if self.enabled && user == ROOT && role == ROOT {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                let user = self.users.get_mut(user).ok_or(AuthError::UserNotFound)?;
                if !user.roles.remove(role) {
                    return Err(AuthError::RoleNotGranted);
                }
            }
            AuthCommand::RoleAdd { name } => {
                if name.is_empty() {
                    return Err(AuthError::RoleEmpty);
                }
                if self.roles.contains_key(name) {
                    return Err(AuthError::RoleAlreadyExist);
                }
                self.roles.insert(name.clone(), Role::default());
            }
            AuthCommand::RoleDelete { name } => {
                if self.enabled && name == ROOT {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                self.roles.remove(name).ok_or(AuthError::RoleNotFound)?;
                for user in self.users.values_mut() {
                    user.roles.remove(name);
                }
            }
            AuthCommand::RoleGrantPermission { role, permission } => {
                let valid = match permission.range_end.as_slice() {
                    [] | [0] => true,
                    end => permission.key.as_slice() < end,
                };
                if !valid {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                let role = self.roles.get_mut(role).ok_or(AuthError::RoleNotFound)?;
                let place = role
                    .permissions
                    .binary_search_by(|p| (&p.key, &p.range_end).cmp(&(&permission.key, &permission.range_end)));
                match place {
                    Ok(at) => role.permissions[at].access = permission.access,
                    Err(at) => role.permissions.insert(at, permission.clone()),
                }
            }
            AuthCommand::Authenticate { user, .. } => {
                if !self.enabled {
                    return Err(AuthError::AuthNotEnabled);
                }
                if !self.users.contains_key(user) {
                    return Err(AuthError::AuthFailed);
                }
                return Ok(self.revision);
            }
            AuthCommand::RoleRevokePermission { role, key, range_end } => {
                let role = self.roles.get_mut(role).ok_or(AuthError::RoleNotFound)?;
                let at = role
                    .permissions
                    .iter()
                    .position(|p| p.key == *key && p.range_end == *range_end)
                    .ok_or(AuthError::PermissionNotGranted)?;
                role.permissions.remove(at);
            }
        }
        self.revision += 1;
        Ok(self.revision)
    }
}

/// What one user may do, merged from its roles.
#[derive(Clone, Debug, Default)]
struct UserPerms {
    /// Holds the `root` role: everything is allowed.
    admin: bool,
    read: RangeSet,
    write: RangeSet,
}

/// The auth store as one member last applied it, with every user's
/// permissions merged for checking: built once per change, shared by all
/// requests.
#[derive(Debug, Default)]
pub struct AuthView {
    state: AuthState,
    perms: HashMap<String, UserPerms>,
}

impl AuthView {
    pub fn new(state: AuthState) -> AuthView {
        let mut perms = HashMap::with_capacity(state.users.len());
        for (name, user) in &state.users {
            let mut p = UserPerms { admin: user.roles.contains(ROOT), ..UserPerms::default() };
            for role in user.roles.iter().filter_map(|r| state.roles.get(r)) {
                for grant in &role.permissions {
                    if grant.access.allows(Access::Read) {
                        p.read.add(&grant.key, &grant.range_end);
                    }
                    if grant.access.allows(Access::Write) {
                        p.write.add(&grant.key, &grant.range_end);
                    }
                }
            }
            perms.insert(name.clone(), p);
        }
        AuthView { state, perms }
    }

    pub fn state(&self) -> &AuthState {
        &self.state
    }

    pub fn enabled(&self) -> bool {
        self.state.enabled
    }

    /// Whether `user` may `access` (`Read` or `Write`) the key or range
    /// `(key, range_end)`; a user that no longer exists may do nothing.
    pub fn check_range(&self, user: &str, key: &[u8], range_end: &[u8], access: Access) -> Result<(), AuthError> {
        let perms = self.perms.get(user).ok_or(AuthError::PermissionDenied)?;
        let set = match access {
            Access::Read => &perms.read,
            Access::Write => &perms.write,
            Access::ReadWrite => {
                return self
                    .check_range(user, key, range_end, Access::Read)
                    .and_then(|()| self.check_range(user, key, range_end, Access::Write))
            }
        };
        if perms.admin || set.covers(key, range_end) {
            Ok(())
        } else {
            Err(AuthError::PermissionDenied)
        }
    }

    /// Whether `user` holds the `root` role (auth and cluster administration).
    pub fn check_admin(&self, user: &str) -> Result<(), AuthError> {
        match self.perms.get(user) {
            Some(p) if p.admin => Ok(()),
            _ => Err(AuthError::PermissionDenied),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply_all(state: &mut AuthState, commands: &[AuthCommand]) {
        for c in commands {
            state.apply(c).unwrap_or_else(|e| panic!("{c:?}: {e}"));
        }
    }

    fn user_add(name: &str) -> AuthCommand {
        AuthCommand::UserAdd { name: name.into(), password_hash: Some("hash".into()) }
    }

    fn grant(role: &str, access: Access, key: &str, range_end: &str) -> AuthCommand {
        AuthCommand::RoleGrantPermission {
            role: role.into(),
            permission: Permission { access, key: key.into(), range_end: range_end.into() },
        }
    }

    fn with_root() -> AuthState {
        let mut s = AuthState::default();
        apply_all(&mut s, &[user_add(ROOT), AuthCommand::UserGrantRole { user: ROOT.into(), role: ROOT.into() }]);
        s
    }

    #[test]
    fn enabling_needs_a_root_user_holding_the_root_role() {
        let mut s = AuthState::default();
        assert_eq!(s.apply(&AuthCommand::Enable), Err(AuthError::RootUserNotExist));
        s.apply(&user_add(ROOT)).unwrap();
        assert_eq!(s.apply(&AuthCommand::Enable), Err(AuthError::RootRoleNotExist));
        s.apply(&AuthCommand::UserGrantRole { user: ROOT.into(), role: ROOT.into() }).unwrap();
        s.apply(&AuthCommand::Enable).unwrap();
        assert!(s.enabled);
    }

    #[test]
    fn root_cannot_be_deleted_or_lose_its_role_while_auth_is_enabled() {
        let mut s = with_root();
        s.apply(&AuthCommand::Enable).unwrap();
        assert_eq!(s.apply(&AuthCommand::UserDelete { name: ROOT.into() }), Err(AuthError::InvalidAuthMgmt));
        assert_eq!(
            s.apply(&AuthCommand::UserRevokeRole { user: ROOT.into(), role: ROOT.into() }),
            Err(AuthError::InvalidAuthMgmt)
        );
        assert_eq!(s.apply(&AuthCommand::RoleDelete { name: ROOT.into() }), Err(AuthError::InvalidAuthMgmt));
    }

    #[test]
    fn duplicate_and_missing_names_are_refused_with_etcds_errors() {
        let mut s = AuthState::default();
        assert_eq!(s.apply(&user_add("")), Err(AuthError::UserEmpty));
        s.apply(&user_add("alice")).unwrap();
        assert_eq!(s.apply(&user_add("alice")), Err(AuthError::UserAlreadyExist));
        assert_eq!(
            s.apply(&AuthCommand::UserGrantRole { user: "alice".into(), role: "r".into() }),
            Err(AuthError::RoleNotFound)
        );
        assert_eq!(s.apply(&AuthCommand::RoleAdd { name: String::new() }), Err(AuthError::RoleEmpty));
        s.apply(&AuthCommand::RoleAdd { name: "r".into() }).unwrap();
        assert_eq!(s.apply(&AuthCommand::RoleAdd { name: "r".into() }), Err(AuthError::RoleAlreadyExist));
        assert_eq!(
            s.apply(&AuthCommand::UserRevokeRole { user: "alice".into(), role: "r".into() }),
            Err(AuthError::RoleNotGranted)
        );
        assert_eq!(
            s.apply(&AuthCommand::RoleRevokePermission { role: "r".into(), key: b"a".to_vec(), range_end: vec![] }),
            Err(AuthError::PermissionNotGranted)
        );
        assert_eq!(s.apply(&AuthCommand::UserDelete { name: "bob".into() }), Err(AuthError::UserNotFound));
    }

    #[test]
    fn refused_commands_leave_the_revision_alone_and_changes_bump_it() {
        let mut s = AuthState::default();
        let r0 = s.revision;
        assert!(s.apply(&AuthCommand::Enable).is_err());
        assert_eq!(s.revision, r0);
        s.apply(&user_add("alice")).unwrap();
        assert_eq!(s.revision, r0 + 1);
    }

    #[test]
    fn a_restricted_user_reads_and_writes_only_what_its_roles_grant() {
        let mut s = with_root();
        apply_all(
            &mut s,
            &[
                user_add("alice"),
                AuthCommand::RoleAdd { name: "a".into() },
                grant("a", Access::ReadWrite, "/alice/", "/alice0"),
                AuthCommand::RoleAdd { name: "ro".into() },
                grant("ro", Access::Read, "/shared/", "/shared0"),
                AuthCommand::UserGrantRole { user: "alice".into(), role: "a".into() },
                AuthCommand::UserGrantRole { user: "alice".into(), role: "ro".into() },
            ],
        );
        let view = AuthView::new(s);
        assert_eq!(view.check_range("alice", b"/alice/x", b"", Access::Write), Ok(()));
        assert_eq!(view.check_range("alice", b"/alice/", b"/alice0", Access::Read), Ok(()));
        assert_eq!(view.check_range("alice", b"/shared/x", b"", Access::Read), Ok(()));
        assert_eq!(view.check_range("alice", b"/shared/x", b"", Access::Write), Err(AuthError::PermissionDenied));
        assert_eq!(view.check_range("alice", b"/bob/x", b"", Access::Read), Err(AuthError::PermissionDenied));
        assert_eq!(view.check_admin("alice"), Err(AuthError::PermissionDenied));
        assert_eq!(view.check_range(ROOT, b"/bob/x", b"\0", Access::Write), Ok(()));
        assert_eq!(view.check_admin(ROOT), Ok(()));
        assert_eq!(view.check_range("nobody", b"/alice/x", b"", Access::Read), Err(AuthError::PermissionDenied));
    }

    #[test]
    fn deleting_a_role_takes_it_from_every_user() {
        let mut s = with_root();
        apply_all(
            &mut s,
            &[
                user_add("alice"),
                AuthCommand::RoleAdd { name: "a".into() },
                grant("a", Access::Read, "k", ""),
                AuthCommand::UserGrantRole { user: "alice".into(), role: "a".into() },
                AuthCommand::RoleDelete { name: "a".into() },
            ],
        );
        assert!(s.users["alice"].roles.is_empty());
        assert_eq!(AuthView::new(s).check_range("alice", b"k", b"", Access::Read), Err(AuthError::PermissionDenied));
    }

    #[test]
    fn granting_the_same_range_again_replaces_its_access() {
        let mut s = AuthState::default();
        apply_all(
            &mut s,
            &[
                AuthCommand::RoleAdd { name: "r".into() },
                grant("r", Access::Read, "k", ""),
                grant("r", Access::Write, "k", ""),
            ],
        );
        assert_eq!(s.roles["r"].permissions.len(), 1);
        assert_eq!(s.roles["r"].permissions[0].access, Access::Write);
        assert_eq!(s.apply(&grant("r", Access::Read, "z", "a")), Err(AuthError::InvalidAuthMgmt));
    }

    #[test]
    fn authenticating_changes_nothing_and_needs_auth_enabled_and_the_user() {
        let mut s = with_root();
        let login =
            |user: &str| AuthCommand::Authenticate { token: "t.1".into(), user: user.into(), password_revision: 1 };
        assert_eq!(s.apply(&login(ROOT)), Err(AuthError::AuthNotEnabled));
        s.apply(&AuthCommand::Enable).unwrap();
        let before = s.clone();
        assert_eq!(s.apply(&login(ROOT)), Ok(before.revision));
        assert_eq!(s.apply(&login("nobody")), Err(AuthError::AuthFailed));
        assert_eq!(s, before);
    }

    #[test]
    fn changing_a_password_moves_the_users_password_revision() {
        let mut s = AuthState::default();
        s.apply(&user_add("alice")).unwrap();
        let before = s.users["alice"].password_revision;
        s.apply(&AuthCommand::UserChangePassword { name: "alice".into(), password_hash: "h2".into() }).unwrap();
        assert!(s.users["alice"].password_revision > before);
    }
}
