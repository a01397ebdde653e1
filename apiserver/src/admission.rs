//! The layers every request passes before it touches the store:
//! authentication (who is asking), authorization (may they do this verb on
//! this resource) and admission (mutating, then validating plugins that see
//! the object). Today's layers allow everything, but they sit in the
//! request path of both APIs, so real ones plug in without rework.

use std::sync::Arc;

use serde_json::Value;
use skiff_api::{ApiError, ResourceInfo};

/// Who is asking.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub groups: Vec<String>,
}

impl UserInfo {
    pub fn anonymous() -> Self {
        UserInfo { name: "system:anonymous".into(), groups: vec!["system:unauthenticated".into()] }
    }
}

/// What a request carries that can identify its sender.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    /// `Authorization: Bearer <token>`.
    pub bearer_token: Option<String>,
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
    fn authorize(&self, attributes: &Attributes<'_>) -> Result<(), ApiError>;
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

/// Everything is allowed.
pub struct AlwaysAllow;

impl Authorizer for AlwaysAllow {
    fn authorize(&self, _attributes: &Attributes<'_>) -> Result<(), ApiError> {
        Ok(())
    }
}

/// The chain of layers, in order.
#[derive(Clone)]
pub struct Security {
    authenticators: Vec<Arc<dyn Authenticator>>,
    authorizer: Arc<dyn Authorizer>,
    admission: Vec<Arc<dyn AdmissionPlugin>>,
}

impl Default for Security {
    fn default() -> Self {
        Security { authenticators: vec![Arc::new(Anonymous)], authorizer: Arc::new(AlwaysAllow), admission: Vec::new() }
    }
}

impl Security {
    pub fn new(
        authenticators: Vec<Arc<dyn Authenticator>>,
        authorizer: Arc<dyn Authorizer>,
        admission: Vec<Arc<dyn AdmissionPlugin>>,
    ) -> Self {
        Security { authenticators, authorizer, admission }
    }

    /// The first authenticator that recognises the credentials decides.
    pub fn authenticate(&self, credentials: &Credentials) -> Result<UserInfo, ApiError> {
        for a in &self.authenticators {
            if let Some(user) = a.authenticate(credentials)? {
                return Ok(user);
            }
        }
        Err(ApiError::unauthorized("Unauthorized"))
    }

    pub fn authorize(&self, attributes: &Attributes<'_>) -> Result<(), ApiError> {
        self.authorizer.authorize(attributes)
    }

    /// Runs every mutating step, then every validating step.
    pub fn admit(&self, attributes: &Attributes<'_>, object: &mut Value, old: Option<&Value>) -> Result<(), ApiError> {
        for plugin in &self.admission {
            plugin.admit(attributes, object, old)?;
        }
        for plugin in &self.admission {
            plugin.validate(attributes, object, old)?;
        }
        Ok(())
    }
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
