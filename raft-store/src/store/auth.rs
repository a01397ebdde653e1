//! The replicated auth store as the services use it: the view to check
//! requests against, this member's tokens, and changes through the log.

use std::sync::Arc;

use super::Store;
use crate::auth::token::Tokens;
use crate::auth::{AuthCommand, AuthView};
use crate::error::StoreError;
use crate::types::{Command, Output};

impl Store {
    /// The auth store as this member last applied it.
    pub fn auth(&self) -> Arc<AuthView> {
        self.inner.sm.auth()
    }

    /// The auth tokens this member accepts.
    pub fn tokens(&self) -> &Tokens {
        &self.inner.tokens
    }

    /// Replicates one change to the auth store; returns the auth revision
    /// after it. Passwords must already be hashed.
    ///
    /// Returns only once this member has applied the change too (a write
    /// taken by a follower is answered from the leader's apply): a client
    /// that enables auth or grants a permission through this member is
    /// checked against the change by its very next request here.
    pub async fn change_auth(&self, change: AuthCommand) -> Result<u64, StoreError> {
        let revision = match self.write(Command::Auth(change)).await? {
            Output::Auth { revision } => revision,
            other => return Err(StoreError::Internal(format!("unexpected answer to an auth change: {other:?}"))),
        };
        self.linearize().await?;
        Ok(revision)
    }
}
