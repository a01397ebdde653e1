//! Simple tokens, as etcd issues them: a random string, a `.`, and a
//! counter, handed out by `Authenticate` and sent back by the client in the
//! `token` metadata of every later call.
//!
//! As in etcd, the member that checked the password makes the token up and
//! replicates it (`AuthCommand::Authenticate`); every member that applies
//! it keeps it in memory, so a client with several endpoints may use its
//! token with any of them. Tokens are not persisted: after a restart, or a
//! snapshot install past the entry, a member no longer knows them and the
//! client authenticates again (etcd clients do so on "invalid auth token").
//! A token expires once it has gone unused on a member for the TTL
//! (`--auth-token-ttl`); each use restarts that member's clock. A token
//! also stops holding once its user is deleted or its password changed
//! (checked against the replicated [`AuthView`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use rand::distributions::Alphanumeric;
use rand::Rng;
use tokio::time::Instant;

use super::{AuthError, AuthView};

/// Random characters before the `.`, as etcd's simple tokens.
const TOKEN_RANDOM_LEN: usize = 16;

/// What a token stands for.
#[derive(Clone, Debug)]
struct Issued {
    user: String,
    /// The user's password revision when the token was issued.
    password_revision: u64,
    expires: Instant,
}

/// The tokens this member issued.
#[derive(Debug)]
pub struct Tokens {
    ttl: Duration,
    inner: Mutex<TokensInner>,
}

#[derive(Debug, Default)]
struct TokensInner {
    next_index: u64,
    issued: HashMap<String, Issued>,
}

impl Tokens {
    pub fn new(ttl: Duration) -> Tokens {
        Tokens { ttl, inner: Mutex::new(TokensInner::default()) }
    }

    /// A new token string, not yet valid: replicate it, then [`Tokens::insert`].
    pub fn fresh(&self) -> String {
        let random: String =
            rand::thread_rng().sample_iter(&Alphanumeric).take(TOKEN_RANDOM_LEN).map(char::from).collect();
        let mut inner = self.inner.lock().expect("tokens lock poisoned");
        inner.next_index += 1;
        format!("{random}.{}", inner.next_index)
    }

    /// Makes `token` stand for `user`, whose password is at `password_revision`.
    pub fn insert(&self, token: &str, user: &str, password_revision: u64) {
        let now = Instant::now();
        let mut inner = self.inner.lock().expect("tokens lock poisoned");
        // Forget expired tokens here, so the map stays as small as the
        // number of live sessions without a sweeper task.
        inner.issued.retain(|_, t| t.expires > now);
        let issued = Issued { user: user.to_string(), password_revision, expires: now + self.ttl };
        inner.issued.insert(token.to_string(), issued);
    }

    #[cfg(test)]
    fn issue(&self, user: &str, password_revision: u64) -> String {
        let token = self.fresh();
        self.insert(&token, user, password_revision);
        token
    }

    /// The user `token` stands for, restarting its clock; an unknown,
    /// expired or outdated token is etcd's "invalid auth token".
    pub fn user(&self, token: &str, view: &AuthView) -> Result<String, AuthError> {
        let now = Instant::now();
        let mut inner = self.inner.lock().expect("tokens lock poisoned");
        let issued = inner.issued.get_mut(token).ok_or(AuthError::InvalidAuthToken)?;
        let current = view.state().users.get(&issued.user).map(|u| u.password_revision);
        if issued.expires <= now || current != Some(issued.password_revision) {
            inner.issued.remove(token);
            return Err(AuthError::InvalidAuthToken);
        }
        issued.expires = now + self.ttl;
        Ok(issued.user.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{AuthCommand, AuthState};

    fn view_with(users: &[&str]) -> AuthView {
        let mut s = AuthState::default();
        for u in users {
            s.apply(&AuthCommand::UserAdd { name: u.to_string(), password_hash: Some("h".into()) }).unwrap();
        }
        AuthView::new(s)
    }

    fn revision_of(view: &AuthView, user: &str) -> u64 {
        view.state().users[user].password_revision
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_names_its_user_until_it_goes_unused_for_the_ttl() {
        let tokens = Tokens::new(Duration::from_secs(10));
        let view = view_with(&["alice"]);
        let token = tokens.issue("alice", revision_of(&view, "alice"));
        assert!(token.contains('.'));
        tokio::time::advance(Duration::from_secs(8)).await;
        assert_eq!(tokens.user(&token, &view), Ok("alice".to_string()));
        // The use above restarted the clock.
        tokio::time::advance(Duration::from_secs(8)).await;
        assert_eq!(tokens.user(&token, &view), Ok("alice".to_string()));
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(tokens.user(&token, &view), Err(AuthError::InvalidAuthToken));
    }

    #[tokio::test(start_paused = true)]
    async fn unknown_tokens_and_tokens_of_changed_users_are_invalid() {
        let tokens = Tokens::new(Duration::from_secs(10));
        let view = view_with(&["alice"]);
        assert_eq!(tokens.user("nope.1", &view), Err(AuthError::InvalidAuthToken));
        let token = tokens.issue("alice", revision_of(&view, "alice"));
        let mut state = view.state().clone();
        state.apply(&AuthCommand::UserChangePassword { name: "alice".into(), password_hash: "h2".into() }).unwrap();
        assert_eq!(tokens.user(&token, &AuthView::new(state)), Err(AuthError::InvalidAuthToken));
        let token = tokens.issue("alice", revision_of(&view, "alice"));
        assert_eq!(tokens.user(&token, &view_with(&[])), Err(AuthError::InvalidAuthToken));
    }

    #[tokio::test(start_paused = true)]
    async fn every_token_is_distinct() {
        let tokens = Tokens::new(Duration::from_secs(10));
        let a = tokens.issue("alice", 1);
        let b = tokens.issue("alice", 1);
        assert_ne!(a, b);
    }
}
