//! Every failure a client can see, as a Kubernetes `Status`: a reason
//! (`NotFound`, `Conflict`, ...), the HTTP code kubectl expects, a message,
//! and details naming the object and the fields at fault. The gRPC API
//! carries the same `Status` JSON in the status details, so both encodings
//! report one error the same way.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::field::FieldError;
use crate::resources::ResourceInfo;

/// Kubernetes' `StatusReason` values Skiff returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reason {
    BadRequest,
    Unauthorized,
    Forbidden,
    NotFound,
    AlreadyExists,
    Conflict,
    Gone,
    Expired,
    Invalid,
    MethodNotAllowed,
    NotAcceptable,
    UnsupportedMediaType,
    RequestEntityTooLarge,
    TooManyRequests,
    Timeout,
    InternalError,
    ServiceUnavailable,
}

impl Reason {
    /// The HTTP status code Kubernetes pairs with the reason.
    pub fn code(self) -> u16 {
        match self {
            Reason::BadRequest => 400,
            Reason::Unauthorized => 401,
            Reason::Forbidden => 403,
            Reason::NotFound => 404,
            Reason::MethodNotAllowed => 405,
            Reason::NotAcceptable => 406,
            Reason::AlreadyExists | Reason::Conflict => 409,
            Reason::Gone | Reason::Expired => 410,
            Reason::RequestEntityTooLarge => 413,
            Reason::UnsupportedMediaType => 415,
            Reason::Invalid => 422,
            Reason::TooManyRequests => 429,
            Reason::InternalError => 500,
            Reason::ServiceUnavailable => 503,
            Reason::Timeout => 504,
        }
    }
}

/// The numbers of the gRPC status codes (`google.rpc.Code`) the mapping uses.
pub mod grpc_code {
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const DEADLINE_EXCEEDED: i32 = 4;
    pub const NOT_FOUND: i32 = 5;
    pub const ALREADY_EXISTS: i32 = 6;
    pub const PERMISSION_DENIED: i32 = 7;
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    pub const ABORTED: i32 = 10;
    pub const OUT_OF_RANGE: i32 = 11;
    pub const UNIMPLEMENTED: i32 = 12;
    pub const INTERNAL: i32 = 13;
    pub const UNAVAILABLE: i32 = 14;
    pub const UNAUTHENTICATED: i32 = 16;
}

impl Reason {
    /// The gRPC status code a gRPC client expects for the reason.
    pub fn grpc_code(self) -> i32 {
        use grpc_code::*;
        match self {
            Reason::BadRequest | Reason::Invalid => INVALID_ARGUMENT,
            Reason::Unauthorized => UNAUTHENTICATED,
            Reason::Forbidden => PERMISSION_DENIED,
            Reason::NotFound => NOT_FOUND,
            Reason::AlreadyExists => ALREADY_EXISTS,
            Reason::Conflict => ABORTED,
            Reason::Gone | Reason::Expired => OUT_OF_RANGE,
            Reason::MethodNotAllowed | Reason::NotAcceptable | Reason::UnsupportedMediaType => UNIMPLEMENTED,
            Reason::RequestEntityTooLarge | Reason::TooManyRequests => RESOURCE_EXHAUSTED,
            Reason::Timeout => DEADLINE_EXCEEDED,
            Reason::InternalError => INTERNAL,
            Reason::ServiceUnavailable => UNAVAILABLE,
        }
    }

    /// The reason a gRPC status without a `Status` in its details stands
    /// for: of the reasons sharing the code, the one clients act on
    /// (`BadRequest`, `Expired`, `TooManyRequests`); `InternalError` for
    /// any other code.
    pub fn from_grpc_code(code: i32) -> Reason {
        use grpc_code::*;
        match code {
            INVALID_ARGUMENT => Reason::BadRequest,
            NOT_FOUND => Reason::NotFound,
            ALREADY_EXISTS => Reason::AlreadyExists,
            ABORTED => Reason::Conflict,
            PERMISSION_DENIED => Reason::Forbidden,
            UNAUTHENTICATED => Reason::Unauthorized,
            OUT_OF_RANGE => Reason::Expired,
            DEADLINE_EXCEEDED => Reason::Timeout,
            RESOURCE_EXHAUSTED => Reason::TooManyRequests,
            UNAVAILABLE => Reason::ServiceUnavailable,
            _ => Reason::InternalError,
        }
    }
}

/// One cause in `details.causes`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cause {
    #[serde(rename = "reason", default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub field: String,
}

/// `details` of a Status: which object, and why.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Details {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<Cause>,
    #[serde(rename = "retryAfterSeconds", default, skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u32>,
}

/// A failed request, as the client will see it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub reason: Reason,
    pub message: String,
    /// Boxed: errors travel in `Result`s everywhere and should stay small.
    pub details: Option<Box<Details>>,
}

fn details_of(info: &ResourceInfo, name: &str) -> Details {
    Details {
        name: name.to_string(),
        group: info.group.to_string(),
        kind: info.plural.to_string(),
        ..Default::default()
    }
}

impl ApiError {
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        ApiError { reason, message: message.into(), details: None }
    }

    pub fn code(&self) -> u16 {
        self.reason.code()
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(Reason::BadRequest, message)
    }

    pub fn not_found(info: &ResourceInfo, name: &str) -> Self {
        ApiError {
            reason: Reason::NotFound,
            message: format!("{} \"{name}\" not found", info.qualified()),
            details: Some(Box::new(details_of(info, name))),
        }
    }

    pub fn already_exists(info: &ResourceInfo, name: &str) -> Self {
        ApiError {
            reason: Reason::AlreadyExists,
            message: format!("{} \"{name}\" already exists", info.qualified()),
            details: Some(Box::new(details_of(info, name))),
        }
    }

    /// A write lost an optimistic-concurrency race (`why` says how).
    pub fn conflict(info: &ResourceInfo, name: &str, why: &str) -> Self {
        ApiError {
            reason: Reason::Conflict,
            message: format!("Operation cannot be fulfilled on {} \"{name}\": {why}", info.qualified()),
            details: Some(Box::new(details_of(info, name))),
        }
    }

    /// The object is not valid; every field error becomes a cause.
    pub fn invalid(info: &ResourceInfo, name: &str, errors: &[FieldError]) -> Self {
        let list = if errors.len() == 1 {
            errors[0].to_string()
        } else {
            format!("[{}]", errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(", "))
        };
        let causes = errors
            .iter()
            .map(|e| Cause { kind: e.reason().to_string(), message: e.body(), field: e.field.clone() })
            .collect();
        let group_kind =
            if info.group.is_empty() { info.kind.to_string() } else { format!("{}.{}", info.kind, info.group) };
        ApiError {
            reason: Reason::Invalid,
            message: format!("{group_kind} \"{name}\" is invalid: {list}"),
            details: Some(Box::new(Details {
                name: name.to_string(),
                group: info.group.to_string(),
                kind: info.kind.to_string(),
                causes,
                ..Default::default()
            })),
        }
    }

    /// A watch or continue token names a revision that was compacted away.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(Reason::Expired, message)
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(Reason::Gone, message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(Reason::Forbidden, message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(Reason::Unauthorized, message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(Reason::MethodNotAllowed, message)
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(Reason::RequestEntityTooLarge, message)
    }

    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(Reason::Timeout, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Reason::InternalError, format!("Internal error occurred: {}", message.into()))
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(Reason::ServiceUnavailable, message)
    }

    pub fn too_many_requests(message: impl Into<String>) -> Self {
        Self::new(Reason::TooManyRequests, message)
    }

    /// The error as an exec's channel 3 carries it: a `Status` without
    /// its kind and apiVersion.
    pub fn exec_status(&self) -> Value {
        let mut s = self.to_status();
        if let Some(obj) = s.as_object_mut() {
            obj.remove("kind");
            obj.remove("apiVersion");
        }
        s
    }

    /// The `Status` object (`kind: Status`, `apiVersion: v1`).
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code(),
        });
        if let Some(d) = &self.details {
            status["details"] = serde_json::to_value(d).expect("details serialize");
        }
        status
    }

    /// Reads a `Status` back (a client decoding an error). Anything that is
    /// not a failure Status yields `None`.
    pub fn from_status(status: &Value) -> Option<ApiError> {
        if status.get("kind")?.as_str()? != "Status" {
            return None;
        }
        let reason: Reason = serde_json::from_value(status.get("reason")?.clone()).ok()?;
        let message = status.get("message").and_then(Value::as_str).unwrap_or_default().to_string();
        let details = status.get("details").and_then(|d| serde_json::from_value(d.clone()).ok()).map(Box::new);
        Some(ApiError { reason, message, details })
    }
}

/// The `Status` kubectl reads from an exec's channel 3 when the command
/// ended with `exit_code` (kubelet's wording; kubectl exits with the code).
pub fn exec_exit_status(exit_code: i64) -> Value {
    if exit_code == 0 {
        return json!({"metadata": {}, "status": "Success"});
    }
    json!({
        "metadata": {},
        "status": "Failure",
        "message": format!("command terminated with non-zero exit code: command terminated with exit code {exit_code}"),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": exit_code.to_string()}]},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{of, Kind};

    #[test]
    fn exec_exit_statuses_are_worded_as_kubectl_reads_them() {
        assert_eq!(exec_exit_status(0), json!({"metadata": {}, "status": "Success"}));
        let failed = exec_exit_status(3);
        assert_eq!(failed["reason"], "NonZeroExitCode");
        assert_eq!(failed["details"]["causes"][0], json!({"reason": "ExitCode", "message": "3"}));
    }

    #[test]
    fn not_found_names_the_resource_as_kubectl_prints_it() {
        let e = ApiError::not_found(of(Kind::Deployment), "web");
        assert_eq!(e.message, "deployments.apps \"web\" not found");
        let s = e.to_status();
        assert_eq!(s["code"], 404);
        assert_eq!(s["reason"], "NotFound");
        assert_eq!(s["details"]["kind"], "deployments");
        assert_eq!(ApiError::from_status(&s), Some(e));
    }

    const REASONS: [Reason; 17] = [
        Reason::BadRequest,
        Reason::Unauthorized,
        Reason::Forbidden,
        Reason::NotFound,
        Reason::AlreadyExists,
        Reason::Conflict,
        Reason::Gone,
        Reason::Expired,
        Reason::Invalid,
        Reason::MethodNotAllowed,
        Reason::NotAcceptable,
        Reason::UnsupportedMediaType,
        Reason::RequestEntityTooLarge,
        Reason::TooManyRequests,
        Reason::Timeout,
        Reason::InternalError,
        Reason::ServiceUnavailable,
    ];

    #[test]
    fn a_reason_read_back_from_its_grpc_code_has_that_code_again() {
        for reason in REASONS {
            let code = reason.grpc_code();
            let back = Reason::from_grpc_code(code);
            // Unimplemented is no reason a client acts on: it reads as an internal error.
            if code != grpc_code::UNIMPLEMENTED {
                assert_eq!(back.grpc_code(), code, "{reason:?}");
            }
        }
        for reason in [Reason::NotFound, Reason::AlreadyExists, Reason::Conflict, Reason::Expired, Reason::BadRequest] {
            assert_eq!(Reason::from_grpc_code(reason.grpc_code()), reason);
        }
        assert_eq!(Reason::from_grpc_code(2), Reason::InternalError);
    }

    #[test]
    fn invalid_lists_every_field_as_a_cause() {
        let errors =
            [FieldError::required("spec.containers", ""), FieldError::invalid("metadata.name", &json!("A"), "bad")];
        let e = ApiError::invalid(of(Kind::Pod), "A", &errors);
        assert_eq!(
            e.message,
            "Pod \"A\" is invalid: [spec.containers: Required value, metadata.name: Invalid value: \"A\": bad]"
        );
        let s = e.to_status();
        assert_eq!(s["code"], 422);
        assert_eq!(s["details"]["causes"][1]["field"], "metadata.name");
        assert_eq!(s["details"]["causes"][0]["reason"], "FieldValueRequired");
    }
}
