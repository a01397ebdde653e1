//! What the checkers conclude: [`Verdict`] per key, [`Violation`]s with the
//! evidence (a small history or the watcher and revision involved) and a
//! sentence of explanation.

use serde::{Deserialize, Serialize};

use crate::history::Op;

/// Which guarantee a violation breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ViolationKind {
    /// No linearization of the key's history exists (register model).
    Linearizability,
    /// Revisions contradict real time: an op that started after another
    /// finished carries a smaller revision, or two writes share one.
    RevisionOrder,
    /// A read returned something other than the latest write at or below its revision.
    StaleRead,
    /// Watch: revisions went backwards (or an event predates the watch's start).
    WatchOrdered,
    /// Watch: an event was delivered twice to one watcher.
    WatchUnique,
    /// Watch: only part of a revision's events were delivered.
    WatchAtomic,
    /// Watch: a write inside the watcher's range and window was never delivered.
    WatchReliable,
    /// Watch: after a resume the stream skipped or repeated revisions.
    WatchResumable,
    /// Watch: an event at or below a progress notification's revision came after it.
    WatchBookmarkable,
    /// Watch: an event matches no write (invented, corrupted, or outside the range).
    WatchValid,
    /// Resource watch: a resourceVersion went backwards.
    ResourceVersionOrder,
    /// Resource watch: an acknowledged object write has no event.
    ResourceMissing,
    /// Resource watch: an event was delivered twice.
    ResourceDuplicate,
    /// Resource watch: an event's type contradicts the write (deleted vs not).
    ResourceMismatch,
}

/// One broken guarantee, with what shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// Which guarantee.
    pub kind: ViolationKind,
    /// The key (or object name) involved.
    pub key: String,
    /// For watch checks: the watcher.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watcher: Option<u64>,
    /// For watch and revision checks: the revision involved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    /// For KV checks: a small history that by itself shows the violation,
    /// sorted by invocation time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Op>,
    /// What is wrong, in a sentence or two.
    pub explanation: String,
}

impl Violation {
    pub(crate) fn new(kind: ViolationKind, key: &str, explanation: String) -> Self {
        Violation { kind, key: key.to_string(), watcher: None, revision: None, history: Vec::new(), explanation }
    }

    pub(crate) fn with_watcher(mut self, watcher: u64) -> Self {
        self.watcher = Some(watcher);
        self
    }

    pub(crate) fn with_revision(mut self, revision: u64) -> Self {
        self.revision = Some(revision);
        self
    }

    pub(crate) fn with_history(mut self, mut history: Vec<Op>) -> Self {
        history.sort_by_key(|op| (op.invoke_ns, op.complete_ns.unwrap_or(u64::MAX)));
        self.history = history;
        self
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} on {:?}", self.kind, self.key)?;
        if let Some(w) = self.watcher {
            write!(f, " (watcher {w})")?;
        }
        if let Some(r) = self.revision {
            write!(f, " at revision {r}")?;
        }
        write!(f, ": {}", self.explanation)?;
        for op in &self.history {
            write!(f, "\n    {}", op.describe())?;
        }
        Ok(())
    }
}

/// A check that could not decide within its budget.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unknown {
    /// The key whose history was not decided.
    pub key: String,
    /// Why (which budget ran out).
    pub reason: String,
}

/// The conclusion for one key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// The history is linearizable and the revisions are consistent.
    Ok,
    /// A guarantee is broken.
    Violation(Violation),
    /// The search ran out of budget before deciding.
    Unknown { reason: String },
}

impl Verdict {
    /// Whether the key was shown correct.
    pub fn is_ok(&self) -> bool {
        matches!(self, Verdict::Ok)
    }

    /// The violation, if any.
    pub fn violation(&self) -> Option<&Violation> {
        match self {
            Verdict::Violation(v) => Some(v),
            _ => None,
        }
    }
}
