//! How Go renders each struct field of the Kubernetes API types in JSON.
//!
//! Every field in the `generated.proto` files is a proto2 `optional`, and the
//! Go marshaller writes non-pointer scalars even when they are zero. Whether a
//! zero value belongs in the JSON (it does for pointers such as
//! `spec.replicas: 0`, and for fields without `omitempty`), whether a field is
//! inlined into its parent (`Probe.handler`, `Volume.volumeSource`), and the
//! JSON name, are facts of the Go structs; `go_fields.rs` records them.

use super::go_fields::{FIELDS, UNWRAP_ITEMS};

/// The Go field is a pointer: a zero value that is present is still written.
pub(super) const POINTER: u8 = 1;
/// The JSON tag has `omitempty`: a zero non-pointer scalar is left out.
pub(super) const OMITEMPTY: u8 = 2;
/// The JSON tag is `,inline`: the message's fields are merged into the parent.
pub(super) const INLINE: u8 = 4;

/// One Go struct field, identified by its message and protobuf field number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct GoField {
    /// Full protobuf name of the message (`k8s.io.api.core.v1.Container`).
    pub message: &'static str,
    /// Protobuf field number.
    pub number: u32,
    /// JSON name; empty for inlined fields.
    pub json: &'static str,
    /// [`POINTER`], [`OMITEMPTY`], [`INLINE`].
    pub flags: u8,
}

impl GoField {
    pub(super) fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

/// The Go field behind field `number` of `message`, if the message is a Go struct we know.
pub(super) fn field(message: &str, number: u32) -> Option<&'static GoField> {
    FIELDS.binary_search_by(|f| (f.message, f.number).cmp(&(message, number))).ok().and_then(|i| FIELDS.get(i))
}

/// Whether `message` wraps a Go named slice (`type ExtraValue []string`), whose JSON is the bare array.
pub(super) fn unwraps_items(message: &str) -> bool {
    UNWRAP_ITEMS.contains(&message)
}

#[cfg(test)]
pub(super) fn all_fields() -> &'static [GoField] {
    FIELDS
}
