//! The one mapping from Skiff's errors to gRPC statuses.
//!
//! Codes and messages are etcd's own (`api/v3rpc/rpctypes/error.go`):
//! etcd clients match on the message text to recognise an error (for
//! example `rpctypes.ErrCompacted`), so the strings must be exact.

use tonic::Status;

use crate::auth::AuthError;
use crate::error::StoreError;
use crate::etcd::convert::RequestError;
use crate::store::TransferError;
use crate::types::ApplyError;

const LEADER_CHANGED: &str = "etcdserver: leader changed";

impl From<ApplyError> for Status {
    fn from(e: ApplyError) -> Self {
        match e {
            ApplyError::Compacted { .. } | ApplyError::FutureRevision { .. } => Status::out_of_range(e.to_string()),
            ApplyError::KeyNotFound | ApplyError::DuplicateKey => Status::invalid_argument(e.to_string()),
            ApplyError::LeaseNotFound { .. } => Status::not_found(e.to_string()),
            ApplyError::LeaseExists { .. } => Status::failed_precondition(e.to_string()),
            ApplyError::NoSpace => Status::resource_exhausted(e.to_string()),
            ApplyError::Auth(e) => e.into(),
        }
    }
}

impl From<AuthError> for Status {
    fn from(e: AuthError) -> Self {
        let message = e.to_string();
        match e {
            AuthError::UserEmpty
            | AuthError::RoleEmpty
            | AuthError::AuthFailed
            | AuthError::PermissionNotGiven
            | AuthError::InvalidAuthMgmt => Status::invalid_argument(message),
            AuthError::PermissionDenied => Status::permission_denied(message),
            AuthError::InvalidAuthToken => Status::unauthenticated(message),
            AuthError::RootUserNotExist
            | AuthError::RootRoleNotExist
            | AuthError::UserAlreadyExist
            | AuthError::UserNotFound
            | AuthError::RoleAlreadyExist
            | AuthError::RoleNotFound
            | AuthError::RoleNotGranted
            | AuthError::PermissionNotGranted
            | AuthError::AuthNotEnabled => Status::failed_precondition(message),
        }
    }
}

impl From<StoreError> for Status {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Apply(e) => e.into(),
            StoreError::NotLeader { .. } => Status::unavailable(LEADER_CHANGED),
            StoreError::NoLeader | StoreError::Timeout => Status::unavailable(e.to_string()),
            StoreError::MemberNotFound { .. } => Status::not_found(e.to_string()),
            StoreError::MemberExists { reason, .. } => Status::failed_precondition(reason),
            StoreError::NoSpace => Status::resource_exhausted(e.to_string()),
            StoreError::InvalidArgument(m) => Status::invalid_argument(m),
            StoreError::FailedPrecondition(m) => Status::failed_precondition(m),
            StoreError::Stopped | StoreError::Peer(_) | StoreError::Raft { .. } => Status::unavailable(e.to_string()),
            StoreError::Unavailable(m) => Status::unavailable(m),
            StoreError::Engine(_) | StoreError::Task(_) => Status::internal(e.to_string()),
            StoreError::Internal(m) => Status::internal(m),
        }
    }
}

impl From<TransferError> for Status {
    fn from(e: TransferError) -> Self {
        match e {
            TransferError::NotLeader | TransferError::BadTransferee { .. } => {
                Status::failed_precondition(e.to_string())
            }
            TransferError::TimedOut { .. } => Status::unavailable(e.to_string()),
            TransferError::Store(e) => e.into(),
        }
    }
}

impl From<RequestError> for Status {
    /// Every malformed request is the client's fault: `InvalidArgument`.
    fn from(e: RequestError) -> Self {
        Status::invalid_argument(e.to_string())
    }
}

/// A request came back with an answer of the wrong kind (another command's
/// output, another admin response): a bug, not a client error.
pub fn unexpected(answer: impl std::fmt::Debug) -> Status {
    StoreError::Internal(format!("unexpected answer from the store: {answer:?}")).into()
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    #[test]
    fn store_errors_keep_etcd_codes_and_messages() {
        let cases = [
            (
                StoreError::Apply(ApplyError::Compacted { compacted: 5 }),
                Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted",
            ),
            (
                StoreError::Apply(ApplyError::FutureRevision { current: 5 }),
                Code::OutOfRange,
                "etcdserver: mvcc: required revision is a future revision",
            ),
            (
                StoreError::Apply(ApplyError::DuplicateKey),
                Code::InvalidArgument,
                "etcdserver: duplicate key given in txn request",
            ),
            (StoreError::NotLeader { leader: Some(2) }, Code::Unavailable, "etcdserver: leader changed"),
            (
                StoreError::Apply(ApplyError::Auth(AuthError::RootRoleNotExist)),
                Code::FailedPrecondition,
                "etcdserver: root user does not have root role",
            ),
            (
                StoreError::Apply(ApplyError::Auth(AuthError::PermissionDenied)),
                Code::PermissionDenied,
                "etcdserver: permission denied",
            ),
            (
                StoreError::Apply(ApplyError::Auth(AuthError::InvalidAuthToken)),
                Code::Unauthenticated,
                "etcdserver: invalid auth token",
            ),
            (
                StoreError::Apply(ApplyError::Auth(AuthError::AuthFailed)),
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password",
            ),
            (
                StoreError::Apply(ApplyError::Auth(AuthError::UserEmpty)),
                Code::InvalidArgument,
                "etcdserver: user name is empty",
            ),
            (StoreError::NoLeader, Code::Unavailable, "etcdserver: no leader"),
            (StoreError::Timeout, Code::Unavailable, "etcdserver: request timed out"),
            (StoreError::MemberNotFound { id: 9 }, Code::NotFound, "etcdserver: member not found"),
            (
                StoreError::MemberExists { id: 0, reason: "etcdserver: Peer URLs already exists".into() },
                Code::FailedPrecondition,
                "etcdserver: Peer URLs already exists",
            ),
        ];
        for (error, code, message) in cases {
            let status = Status::from(error);
            assert_eq!((status.code(), status.message()), (code, message));
        }
    }

    #[test]
    fn transfer_errors_keep_etcd_codes_and_messages() {
        let cases = [
            (TransferError::NotLeader, Code::FailedPrecondition, "etcdserver: not leader"),
            (TransferError::BadTransferee { target: 9 }, Code::FailedPrecondition, "etcdserver: bad leader transferee"),
            (
                TransferError::TimedOut { target: 2 },
                Code::Unavailable,
                "etcdserver: request timed out, leader transfer took too long",
            ),
        ];
        for (error, code, message) in cases {
            let status = Status::from(error);
            assert_eq!((status.code(), status.message()), (code, message));
        }
    }
}
