//! The one error type: input that cannot be checked (malformed records, bad JSON).
//!
//! A history that is well formed but wrong is not an error; it yields a
//! [`Violation`](crate::Violation).

use thiserror::Error;

/// Why a history, watch log or report could not be checked or (de)serialized.
#[derive(Debug, Error)]
pub enum CheckerError {
    /// An operation record is inconsistent with itself (e.g. a read with a
    /// write outcome, or a completion before its invocation).
    #[error("operation #{index} (client {client}, key {key:?}) is malformed: {reason}")]
    MalformedOp { index: usize, client: u64, key: String, reason: String },
    /// A store write handed to the watch checker is inconsistent.
    #[error("store write #{index} (key {key:?}) is malformed: {reason}")]
    MalformedWrite { index: usize, key: String, reason: String },
    /// JSON encoding or decoding failed.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}
