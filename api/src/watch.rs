//! The types of watch events, as Kubernetes names them on the wire
//! (`ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK`, `ERROR`): what the
//! apiserver sends and what clients read, one enum on both sides.

use std::fmt;
use std::str::FromStr;

/// What a watch event says happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
    /// No change: the stream has seen every change up to the object's
    /// resourceVersion.
    Bookmark,
    /// The watch failed; the object is a `Status`, and the stream ends.
    Error,
}

impl EventType {
    /// The wire name (`ADDED`).
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
            EventType::Bookmark => "BOOKMARK",
            EventType::Error => "ERROR",
        }
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A watch event type name that is none of Kubernetes' five.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown watch event type {0:?}")]
pub struct UnknownEventType(pub String);

impl FromStr for EventType {
    type Err = UnknownEventType;

    fn from_str(s: &str) -> Result<EventType, UnknownEventType> {
        match s {
            "ADDED" => Ok(EventType::Added),
            "MODIFIED" => Ok(EventType::Modified),
            "DELETED" => Ok(EventType::Deleted),
            "BOOKMARK" => Ok(EventType::Bookmark),
            "ERROR" => Ok(EventType::Error),
            other => Err(UnknownEventType(other.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_type_reads_back_from_its_wire_name() {
        for t in [EventType::Added, EventType::Modified, EventType::Deleted, EventType::Bookmark, EventType::Error] {
            assert_eq!(t.as_str().parse::<EventType>(), Ok(t));
        }
        assert_eq!("added".parse::<EventType>(), Err(UnknownEventType("added".into())));
    }
}
