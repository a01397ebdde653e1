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

    /// The auth tokens this member issued.
    pub fn tokens(&self) -> &Tokens {
        &self.inner.tokens
    }

    /// Replicates one change to the auth store; returns the auth revision
    /// after it. Passwords must already be hashed.
    pub async fn change_auth(&self, change: AuthCommand) -> Result<u64, StoreError> {
        match self.write(Command::Auth(change)).await? {
            Output::Auth { revision } => Ok(revision),
            other => Err(StoreError::Internal(format!("unexpected answer to an auth change: {other:?}"))),
        }
    }
}
