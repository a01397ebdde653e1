//! The history model: one [`Op`] per client request against the KV API, as the
//! chaos clients record it (invocation and completion times, what was asked,
//! what came back). Everything is serde-serializable so runs can be stored as
//! JSON and replayed through the checkers.
//!
//! A key's value is an `Option<String>`: `None` means the key is absent. Every
//! key is assumed absent before the history starts.

use serde::{Deserialize, Serialize};

use crate::error::CheckerError;

/// What a client asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OpKind {
    /// Read the key's value.
    Read,
    /// Put `value`.
    Write { value: String },
    /// Put `new` if the current value equals `expected` (`None`: the key must be absent).
    Cas { expected: Option<String>, new: String },
    /// Delete the key (deleting an absent key succeeds and changes nothing).
    Delete,
}

/// What came back.
///
/// Revision `0` means "not recorded": such an op is still checked for
/// linearizability but gives no revision evidence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Outcome {
    /// A read's answer: the value seen, the response header revision (the
    /// store revision the read was served at) and the value's
    /// `mod_revision` (the revision of the write that produced it; `0`: no
    /// value, or not recorded).
    Read {
        value: Option<String>,
        revision: u64,
        #[serde(default)]
        mod_revision: u64,
    },
    /// A write, successful CAS or delete took effect at `revision`. For a delete
    /// that removed nothing, etcd creates no revision and reports the current one.
    Ok { revision: u64 },
    /// Definitely not applied (rejected before taking effect).
    Failed,
    /// A CAS whose compare failed: nothing was written, and at some point
    /// between invocation and completion the value differed from `expected`.
    CasFailed,
    /// Timeout or connection loss: the op may or may not have taken effect,
    /// at any time after its invocation.
    Indeterminate,
}

/// One client request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    /// The client (process) that issued it.
    pub client: u64,
    /// The key it addressed.
    pub key: String,
    /// What was asked.
    pub kind: OpKind,
    /// When it was sent, in nanoseconds on the recorder's monotonic clock.
    pub invoke_ns: u64,
    /// When its response arrived; `None` when it timed out / outcome unknown.
    pub complete_ns: Option<u64>,
    /// What came back.
    pub result: Outcome,
}

impl Op {
    /// Whether this op may change the key (write, CAS or delete), whatever its outcome.
    pub fn is_mutation(&self) -> bool {
        !matches!(self.kind, OpKind::Read)
    }

    /// The value the key holds right after this op, if it is a mutation that
    /// takes effect (`Some(None)` for a delete).
    pub fn written_value(&self) -> Option<Option<&str>> {
        match &self.kind {
            OpKind::Read => None,
            OpKind::Write { value } => Some(Some(value)),
            OpKind::Cas { new, .. } => Some(Some(new)),
            OpKind::Delete => Some(None),
        }
    }

    /// The revision of a successful mutation or a read (`None` if unknown or not recorded).
    pub fn revision(&self) -> Option<u64> {
        match self.result {
            Outcome::Read { revision, .. } | Outcome::Ok { revision } if revision > 0 => Some(revision),
            _ => None,
        }
    }

    /// Whether the outcome is unknown (the op may have taken effect or not).
    pub fn is_indeterminate(&self) -> bool {
        matches!(self.result, Outcome::Indeterminate)
    }

    /// A short human description, used in explanations.
    pub fn describe(&self) -> String {
        let what = match &self.kind {
            OpKind::Read => "read".to_string(),
            OpKind::Write { value } => format!("write {value:?}"),
            OpKind::Cas { expected, new } => format!("cas {} -> {new:?}", show(expected.as_deref())),
            OpKind::Delete => "delete".to_string(),
        };
        let got = match &self.result {
            Outcome::Read { value, revision, mod_revision: 0 } => {
                format!("-> {} @rev {revision}", show(value.as_deref()))
            }
            Outcome::Read { value, revision, mod_revision } => {
                format!("-> {} (written @rev {mod_revision}) @rev {revision}", show(value.as_deref()))
            }
            Outcome::Ok { revision } => format!("ok @rev {revision}"),
            Outcome::Failed => "failed".to_string(),
            Outcome::CasFailed => "compare failed".to_string(),
            Outcome::Indeterminate => "indeterminate".to_string(),
        };
        let end = self.complete_ns.map_or_else(|| "?".to_string(), |c| c.to_string());
        format!("client {} {what} {got} [{}..{end}ns]", self.client, self.invoke_ns)
    }

    /// Checks that the record is self-consistent; `index` is only used in the error.
    pub fn validate(&self, index: usize) -> Result<(), CheckerError> {
        let bad = |reason: &str| {
            Err(CheckerError::MalformedOp {
                index,
                client: self.client,
                key: self.key.clone(),
                reason: reason.to_string(),
            })
        };
        if let Some(c) = self.complete_ns {
            if c < self.invoke_ns {
                return bad("completed before it was invoked");
            }
        } else if !self.is_indeterminate() {
            return bad("no completion time but a definite outcome");
        }
        match (&self.kind, &self.result) {
            (_, Outcome::Indeterminate | Outcome::Failed) => Ok(()),
            (OpKind::Read, Outcome::Read { value: None, mod_revision: 1.., .. }) => {
                bad("a read of an absent key with a mod_revision")
            }
            (OpKind::Read, Outcome::Read { revision: r @ 1.., mod_revision: m, .. }) if m > r => {
                bad("a read whose value was written after the revision it was served at")
            }
            (OpKind::Read, Outcome::Read { .. }) => Ok(()),
            (OpKind::Read, _) => bad("a read with a write outcome"),
            (_, Outcome::Read { .. }) => bad("a mutation with a read outcome"),
            (OpKind::Cas { .. }, Outcome::Ok { .. } | Outcome::CasFailed) => Ok(()),
            (_, Outcome::CasFailed) => bad("compare failed on an op that is not a CAS"),
            (_, Outcome::Ok { .. }) => Ok(()),
        }
    }
}

/// Shows an optional value as `"v"` or `<absent>`.
pub(crate) fn show(value: Option<&str>) -> String {
    value.map_or_else(|| "<absent>".to_string(), |v| format!("{v:?}"))
}

/// Validates every op of a history.
pub fn validate_history(history: &[Op]) -> Result<(), CheckerError> {
    history.iter().enumerate().try_for_each(|(i, op)| op.validate(i))
}
